#!/bin/bash
# MPI benchmark: the same MPI program, the same mpirun, with and without
# LD_PRELOAD=liburom_mpi.so, in alternating rounds (ROUNDS, default 3). The program is the
# collective benchmark's Open MPI side (`urom-coll-bench --impl openmpi`: MPI_Iallreduce /
# MPI_Ialltoall + MPI_Wait, and the blocking forms, on MPI_COMM_WORLD); preloaded, its calls go
# through liburom_mpi.so to the node's urom worker, and its results are named
# "openmpi+urom_mpi". Per collective and size: overlap as the OSU micro-benchmarks define it
# (post, compute for t_pure without calling MPI, wait: max(0, 100 - 100 (t_total - t_compute) /
# t_pure)), the rank's CPU time per collective (the process's CPU clock, all its threads),
# blocking latency and t_pure. Prints the medians over the rounds and the medians of the
# per-round ratios against Open MPI alone, and draws overlap and latency against message size
# (benches/results/mpi-DATE.svg, beside the rounds' raw lines in mpi-DATE.tsv).
#
# Environment (as benches/run-coll-bench.sh, where the names are the same):
#   NP           ranks (default 2)
#   SIZES        message sizes in bytes (default the powers of 2 from 8 B to 16 MiB)
#   COLLS        collectives: allreduce alltoall allgather bcast (default allreduce alltoall)
#   VARIANTS     what runs: openmpi (Open MPI alone), openmpi+urom_mpi (preloaded),
#                openmpi+urom_mpi-setup (preloaded with UROM_MPI_CACHE_DEPTH=0: every call
#                sets its collective up on the worker again, as before set-up collectives were
#                kept); default "openmpi openmpi+urom_mpi"
#   RANK_CPUS    CPUs for the ranks (mpirun --cpu-set, one core each); default: from core 0
#   WORKER_CPUS  CPUs for the urom worker (the daemon's --cpuset); default: any
#   WORKER_BUSY_POLL  1: the urom worker never sleeps when idle; default 1 when WORKER_CPUS
#                gives it cores of its own, else 0
#   BIN_DIR      run the binaries found there (urom-coll-bench, urom-coll-report, urom-daemon,
#                urom-worker, libworker_coll.so, liburom_mpi.so, liburom_coll.so) instead of
#                building them (a machine without cargo, see benches/device/)
#   RESULTS_DIR  where the dated TSV and SVG go (default benches/results, or beside the
#                binaries with UROM_BENCH_RECORD=0)
#   MPIRUN_ARGS  more mpirun arguments
#   BENCH_ARGS   more urom-coll-bench arguments (e.g. --budget-ms 100 --cpu-budget-ms 200
#                --min-iters 5 for a shorter run)
#   NICE         the nice value mpirun and all it starts run at; default: as is
# Default placement, for the 2-vCPU development VM: 2 ranks, each bound to its own core, Open
# MPI on shared memory (--mca pml ob1 --mca btl self,vader) busy polling; the urom worker then
# shares the ranks' two cores. On a 16-core machine, ranks and worker on their own cores, e.g.
#   NP=12 RANK_CPUS=0-11 WORKER_CPUS=12-15 benches/run-mpi-bench.sh 5
#
# The script starts a urom daemon of its own (a private socket directory, the collective
# plugin alone in UROM_PLUGIN_PATH) before the rounds, passes its socket to the ranks
# (UROM_SERVICE_SOCKET) and stops it at the end. The preloaded rounds run with
# UROM_MPI_VERBOSE=1; the script prints what rank 0 says was offloaded (a run where nothing was
# fails).
#
# Each run that ends well is appended to benches/results/mpi.md (see benches/record.sh).
#
# usage: benches/run-mpi-bench.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
record_start mpi "$@"

rounds=${1:-3}
NP=${NP:-2}
SIZES=${SIZES:-$(for ((b = 8; b <= 16 << 20; b *= 2)); do printf "%d " "$b"; done)}
COLLS=${COLLS:-allreduce alltoall}
VARIANTS=${VARIANTS:-openmpi openmpi+urom_mpi}
if ! command -v mpirun >/dev/null; then
    echo "run-mpi-bench: needs Open MPI and libclang: apt-get install openmpi-bin libopenmpi-dev libclang-dev" >&2
    exit 1
fi
for v in $VARIANTS; do
    case $v in
    openmpi | openmpi+urom_mpi | openmpi+urom_mpi-setup) ;;
    *)
        echo "run-mpi-bench: unknown variant $v (openmpi, openmpi+urom_mpi, openmpi+urom_mpi-setup)" >&2
        exit 1
        ;;
    esac
done

if [ -n "${BIN_DIR:-}" ]; then
    bin_dir=$BIN_DIR
else
    # One build for all (the same features each time: nothing rebuilt twice).
    cargo build --release -p urom-coll-bench --features urom-coll-bench/mpi -p urom-daemon \
        -p urom-worker -p urom-plugin-coll -p urom-capi-coll -p urom-capi-mpi >&2
    bin_dir=${CARGO_TARGET_DIR:-target}/release
fi
bench=$bin_dir/urom-coll-bench
library=$(cd "$bin_dir" && pwd)/liburom_mpi.so
for f in "$bench" "$bin_dir/urom-coll-report" "$bin_dir/urom-daemon" "$bin_dir/urom-worker" \
    "$bin_dir/libworker_coll.so" "$library" "$bin_dir/liburom_coll.so"; do
    if [ ! -e "$f" ]; then
        echo "run-mpi-bench: $f is missing" >&2
        exit 1
    fi
done
symbols=$(nm -D "$library" 2>/dev/null || true)
if ! grep -q ' T MPI_Iallreduce$' <<<"$symbols"; then
    echo "run-mpi-bench: $library has no MPI functions (built without mpicc?)" >&2
    exit 1
fi

mpirun_args=(-np "$NP" --oversubscribe --mca pml ob1 --mca btl self,vader --mca mpi_yield_when_idle 0)
if [ -n "${RANK_CPUS:-}" ]; then
    mpirun_args+=(--cpu-set "$RANK_CPUS" --bind-to core:overload-allowed)
    placement="ranks bound one per core within CPUs $RANK_CPUS"
else
    mpirun_args+=(--bind-to core:overload-allowed)
    placement="ranks bound one per core from core 0"
fi
launcher=()
if [ -n "${NICE:-}" ]; then
    launcher=(nice -n "$NICE")
fi
[ "$(id -u)" -eq 0 ] && mpirun_args+=(--allow-run-as-root)
# shellcheck disable=SC2206 # MPIRUN_ARGS is split on purpose
[ -n "${MPIRUN_ARGS:-}" ] && mpirun_args+=($MPIRUN_ARGS)
# shellcheck disable=SC2206 # BENCH_ARGS is split on purpose
bench_args=(${BENCH_ARGS:-})

# The daemon: private socket directory, the collective plugin alone.
. benches/coll-daemon.sh
busy_poll=${WORKER_BUSY_POLL:-}
[ -n "$busy_poll" ] || { [ -n "${WORKER_CPUS:-}" ] && busy_poll=1 || busy_poll=0; }
daemon_args=()
if [ -n "${WORKER_CPUS:-}" ]; then
    daemon_args+=(--cpuset "$WORKER_CPUS")
    placement="$placement; the urom worker on CPUs $WORKER_CPUS"
else
    placement="$placement; the urom worker wherever the scheduler puts it (sharing the ranks' cores where there are no others)"
fi
if [ "$busy_poll" = 1 ]; then
    daemon_args+=(--worker-busy-poll)
    placement="$placement, busy-polling"
else
    placement="$placement, napping when idle"
fi
[ -n "${NICE:-}" ] && placement="$placement; everything at nice $NICE"
start_coll_daemon mpi-bench "$bin_dir" "${daemon_args[@]}"

coll_results mpi "$bin_dir"
verbose=$daemon_dir/urom_mpi.log
: >"$verbose"

# One round of one variant: the benchmark's lines, its implementation renamed for a preloaded
# variant.
run_variant() {
    local variant=$1 round=$2 header=() env=()
    [ -s "$tsv" ] || header=(--header)
    if [ "$variant" != openmpi ]; then
        env=(-x "LD_PRELOAD=$library" -x "UROM_SERVICE_SOCKET=$daemon_dir/urom.sock" -x UROM_MPI_VERBOSE=1)
        [ "$variant" = openmpi+urom_mpi-setup ] && env+=(-x UROM_MPI_CACHE_DEPTH=0)
    fi
    "${launcher[@]}" mpirun "${mpirun_args[@]}" "${env[@]}" "$bench" --impl openmpi \
        --colls "${COLLS// /,}" --sizes "${SIZES// /,}" --round "$round" "${header[@]}" \
        "${bench_args[@]}" 2>>"$verbose" |
        awk -F'\t' -v OFS='\t' -v v="$variant" '
            /^# impl=openmpi/ {
                if (v != "openmpi") {
                    sub(/^# impl=openmpi/, "# impl=" v)
                    sub(/no worker \(progress only inside MPI calls\)/, "liburom_mpi.so preloaded: the node'"'"'s urom worker runs what it offloads")
                }
                print
                next
            }
            /^#/ { print; next }
            { if (v != "openmpi") $2 = v; print }' >>"$tsv"
    return "${PIPESTATUS[0]}"
}

read -r -a variants <<<"$VARIANTS"
for round in $(seq "$rounds"); do
    # Alternate which variant goes first.
    order=("${variants[@]}")
    if ((round % 2 == 0)); then
        order=()
        for ((i = ${#variants[@]} - 1; i >= 0; i--)); do order+=("${variants[i]}"); done
    fi
    for variant in "${order[@]}"; do
        started=$SECONDS
        if ! run_variant "$variant" "$round"; then
            echo "run-mpi-bench: round $round of $variant failed" >&2
            tail -n 20 "$verbose" "$daemon_dir"/*.log >&2 2>/dev/null || true
            exit 1
        fi
        echo "round $round: $variant done in $((SECONDS - started)) s"
    done
done

echo "MPI benchmark: $NP ranks, $rounds rounds, medians over the rounds (times in us)"
echo "placement: $placement; mpirun ${mpirun_args[*]}"
echo "program: urom-coll-bench --impl openmpi, as it is (openmpi) and with LD_PRELOAD=liburom_mpi.so (openmpi+urom_mpi)"
grep -ah '^# impl=' "$tsv" | sort -u -t' ' -k2,2 | sed 's/ round=[0-9]*//'
if [ "$VARIANTS" != openmpi ]; then
    if ! grep -q 'offloaded to urom' "$verbose"; then
        echo "run-mpi-bench: the preloaded rounds offloaded nothing:" >&2
        sort -u "$verbose" >&2
        exit 1
    fi
    echo "liburom_mpi, rank 0 (UROM_MPI_VERBOSE=1):"
    grep -a '^urom_mpi: rank 0:' "$verbose" | sort -u | sed 's/^/  /'
fi
for variant in "${variants[@]}"; do
    [ "$variant" = openmpi ] && continue
    echo "== openmpi against $variant"
    extra=()
    [ "$variant" = openmpi+urom_mpi ] && extra=(--svg "$svg" --title "MPI, $NP ranks, $(nproc) CPUs")
    "$bin_dir/urom-coll-report" "$tsv" --ours "$variant" "${extra[@]}"
done
echo "raw results: $tsv"
stop_daemon
record_finish '^MPI benchmark:'
