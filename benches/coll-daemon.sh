# What the collective benchmarks share (sourced by run-coll-bench.sh and run-mpi-bench.sh): a
# private daemon (its socket directory holds the collective plugin alone; stopped and removed on
# exit) and where each run's results go.
#
#   start_coll_daemon NAME BIN_DIR [DAEMON ARGS...]   sets daemon_dir and daemon_pid; runs the
#                                                     daemon under "${launcher[@]}" (may be empty)
#   coll_results NAME BIN_DIR                         sets stamp, out_dir and the run's empty
#                                                     tsv and its svg: RESULTS_DIR, else
#                                                     BIN_DIR/NAME-results with
#                                                     UROM_BENCH_RECORD=0, else benches/results

daemon_pid=""
daemon_dir=""
stop_daemon() {
    if [ -n "$daemon_pid" ]; then
        kill "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
        daemon_pid=""
    fi
    [ -n "$daemon_dir" ] && rm -rf "$daemon_dir"
    daemon_dir=""
}
trap stop_daemon EXIT

start_coll_daemon() {
    local name=$1 bin=$2
    shift 2
    daemon_dir=$(mktemp -d "${TMPDIR:-/tmp}/urom-$name.XXXXXX")
    mkdir "$daemon_dir/plugins"
    cp "$bin/libworker_coll.so" "$daemon_dir/plugins/worker_coll.so"
    UROM_PLUGIN_PATH=$daemon_dir/plugins "${launcher[@]}" "$bin/urom-daemon" \
        --listen "$daemon_dir/urom.sock" --log-dir "$daemon_dir" \
        --worker-bin "$bin/urom-worker" "$@" >/dev/null 2>&1 &
    daemon_pid=$!
    for _ in $(seq 300); do
        [ -S "$daemon_dir/urom.sock" ] && break
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ ! -S "$daemon_dir/urom.sock" ]; then
        echo "run-$name: the urom daemon did not come up:" >&2
        cat "$daemon_dir"/*.log >&2 2>/dev/null || true
        exit 1
    fi
}

coll_results() {
    local name=$1 bin=$2
    stamp=$(date -u '+%Y-%m-%d-%H%M')
    if [ -n "${RESULTS_DIR:-}" ]; then
        out_dir=$RESULTS_DIR
    elif [ "${UROM_BENCH_RECORD:-1}" = 0 ]; then
        out_dir=$bin/$name-results
    else
        out_dir=benches/results
    fi
    mkdir -p "$out_dir"
    tsv=$out_dir/$name-$stamp.tsv
    svg=$out_dir/$name-$stamp.svg
    : >"$tsv"
}
