#!/bin/bash
# Collective benchmark: our collectives (urom, `--impl urom`) beside Open MPI's (`--impl
# openmpi`), the same ranks and sizes, each round running both under mpirun in alternating
# order (ROUNDS, default 3). Per collective and size: blocking latency (start + wait against
# MPI_Allreduce / MPI_Alltoall...), overlap as the OSU micro-benchmarks define it (post, compute
# for t_pure without calling the library, wait: max(0, 100 - 100 (t_total - t_compute) / t_pure),
# against MPI_Iallreduce / MPI_Ialltoall... + MPI_Wait) and CPU time per collective of the rank
# (getrusage) and of the workers (/proc). Prints the medians over the rounds and the medians of
# the per-round ratios urom / Open MPI, and draws overlap and latency against message size
# (benches/results/coll-DATE.svg, beside the rounds' raw lines in coll-DATE.tsv).
#
# While this build has no urom collectives, the Open MPI side runs alone and the script says why
# the urom side was skipped.
#
# Environment:
#   NP           ranks (default 2)
#   SIZES        message sizes in bytes (default the powers of 2 from 8 B to 16 MiB)
#   COLLS        collectives: allreduce alltoall allgather bcast (default allreduce alltoall)
#   IMPLS        implementations (default "openmpi urom")
#   RANK_CPUS    CPUs for the ranks (mpirun --cpu-set, one core each); default: from core 0
#   WORKER_CPUS  CPUs for the urom workers (passed to the ranks; the urom side pins its workers)
#   WORKER_BUSY_POLL  1: the urom worker never sleeps when idle (the daemon's
#                --worker-busy-poll), 0: it naps after a short spin; default 1 when WORKER_CPUS
#                gives it cores of its own, else 0
#   BIN_DIR      run the binaries found there (urom-coll-bench, urom-coll-report, urom-daemon,
#                urom-worker, libworker_coll.so) instead of building them (a machine without
#                cargo, see benches/device/)
#   RESULTS_DIR  where the dated TSV and SVG go (default benches/results, or beside the
#                binaries with UROM_BENCH_RECORD=0)
#   MPIRUN_ARGS  more mpirun arguments
#   BENCH_ARGS   more urom-coll-bench arguments (e.g. --budget-ms 100 --cpu-budget-ms 200
#                --min-iters 5 for a shorter run)
#   NICE         the nice value mpirun and all it starts run at (e.g. -10, as root, on a machine
#                shared with other work: busy-polling ranks lose less time to it); default: as is
# Default placement, for the 2-vCPU development VM: 2 ranks, each bound to its own core
# (--bind-to core:overload-allowed), oversubscription allowed, Open MPI kept off UCX (--mca pml
# ob1 --mca btl self,vader) and busy polling (--mca mpi_yield_when_idle 0); a urom worker then
# shares the ranks' two cores. On a 16-core machine, ranks and workers on their own cores, e.g.
#   NP=12 RANK_CPUS=0-11 WORKER_CPUS=12-15 benches/run-coll-bench.sh 5
# and Open MPI alone on every core for the other baselines:
#   IMPLS=openmpi NP=16 RANK_CPUS=0-15 benches/run-coll-bench.sh 5
#
# For the urom side the script starts a urom daemon of its own (a private socket directory, the
# collective plugin alone in UROM_PLUGIN_PATH, its log kept there) before the rounds, passes its
# socket to the ranks (UROM_SERVICE_SOCKET), and stops it at the end.
#
# Each run that ends well is appended to benches/results/coll.md (see benches/record.sh).
#
# usage: benches/run-coll-bench.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
# Before the defaults below, so that the recorded command names only what the caller set.
record_start coll "$@"

rounds=${1:-3}
NP=${NP:-2}
SIZES=${SIZES:-$(for ((b = 8; b <= 16 << 20; b *= 2)); do printf "%d " "$b"; done)}
COLLS=${COLLS:-allreduce alltoall}
IMPLS=${IMPLS:-openmpi urom}
if ! command -v mpirun >/dev/null; then
    echo "run-coll-bench: needs Open MPI and libclang: apt-get install openmpi-bin libopenmpi-dev libclang-dev" >&2
    exit 1
fi

if [ -n "${BIN_DIR:-}" ]; then
    bin_dir=$BIN_DIR
else
    cargo build --release -p urom-coll-bench --features mpi --bins >&2
    case " $IMPLS " in
    *" urom "*) cargo build --release -p urom-daemon -p urom-worker -p urom-plugin-coll >&2 ;;
    esac
    bin_dir=${CARGO_TARGET_DIR:-target}/release
fi
bench=$bin_dir/urom-coll-bench

# Open MPI kept off UCX; ranks bound one per core; busy polling without sched_yield even where
# --oversubscribe would turn it on (on a machine shared with other work, a yielding rank waits a
# whole time slice, 4 ms, for its turn: measured here as 4-12 ms collectives).
mpirun_args=(-np "$NP" --oversubscribe --mca pml ob1 --mca btl self,vader --mca mpi_yield_when_idle 0)
if [ -n "${RANK_CPUS:-}" ]; then
    mpirun_args+=(--cpu-set "$RANK_CPUS" --bind-to core:overload-allowed)
    placement="ranks bound one per core within CPUs $RANK_CPUS"
else
    mpirun_args+=(--bind-to core:overload-allowed)
    placement="ranks bound one per core from core 0"
fi
if [ -n "${WORKER_CPUS:-}" ]; then
    placement="$placement; urom workers on CPUs $WORKER_CPUS"
else
    placement="$placement; urom workers wherever the scheduler puts them"
fi
launcher=()
if [ -n "${NICE:-}" ]; then
    launcher=(nice -n "$NICE")
    placement="$placement; everything at nice $NICE"
fi
export WORKER_CPUS=${WORKER_CPUS:-}
mpirun_args+=(-x WORKER_CPUS)
[ "$(id -u)" -eq 0 ] && mpirun_args+=(--allow-run-as-root)
# shellcheck disable=SC2206 # MPIRUN_ARGS is split on purpose
[ -n "${MPIRUN_ARGS:-}" ] && mpirun_args+=($MPIRUN_ARGS)
# shellcheck disable=SC2206 # BENCH_ARGS is split on purpose
bench_args=(${BENCH_ARGS:-})

# The implementations this build has; the others are skipped with their reason.
impls=()
skipped=()
for impl in $IMPLS; do
    if why=$("$bench" --impl-available "$impl"); then
        impls+=("$impl")
    else
        skipped+=("$why")
    fi
done
if ((${#impls[@]} == 0)); then
    printf 'run-coll-bench: nothing to run: %s\n' "${skipped[@]}" >&2
    exit 1
fi

# The urom side's daemon: private socket directory, the collective plugin alone.
. benches/coll-daemon.sh
case " ${impls[*]} " in
*" urom "*)
    busy_poll=${WORKER_BUSY_POLL:-}
    [ -n "$busy_poll" ] || { [ -n "$WORKER_CPUS" ] && busy_poll=1 || busy_poll=0; }
    daemon_args=()
    if [ "$busy_poll" = 1 ]; then
        daemon_args+=(--worker-busy-poll)
        placement="$placement; the urom worker busy-polls"
    else
        placement="$placement; the urom worker naps when idle"
    fi
    start_coll_daemon coll-bench "$bin_dir" "${daemon_args[@]}"
    export UROM_SERVICE_SOCKET=$daemon_dir/urom.sock
    mpirun_args+=(-x UROM_SERVICE_SOCKET)
    ;;
esac

coll_results coll "$bin_dir"

colls=${COLLS// /,}
sizes=${SIZES// /,}
for round in $(seq "$rounds"); do
    # Alternate which implementation goes first.
    order=("${impls[@]}")
    if ((round % 2 == 0)); then
        order=()
        for ((i = ${#impls[@]} - 1; i >= 0; i--)); do order+=("${impls[i]}"); done
    fi
    for impl in "${order[@]}"; do
        started=$SECONDS
        header=()
        [ -s "$tsv" ] || header=(--header)
        if ! "${launcher[@]}" mpirun "${mpirun_args[@]}" "$bench" --impl "$impl" --colls "$colls" \
            --sizes "$sizes" --round "$round" "${header[@]}" "${bench_args[@]}" >>"$tsv"; then
            echo "run-coll-bench: round $round of $impl failed" >&2
            if [ "$impl" = urom ] && [ -n "$daemon_dir" ]; then
                echo "urom daemon and worker logs:" >&2
                tail -n 20 "$daemon_dir"/*.log >&2 2>/dev/null || true
            fi
            exit 1
        fi
        echo "round $round: $impl done in $((SECONDS - started)) s"
    done
done

echo "collective benchmark: $NP ranks, $rounds rounds, medians over the rounds (times in us)"
echo "placement: $placement; mpirun ${mpirun_args[*]}"
grep -ah '^# impl=' "$tsv" | sort -u -t' ' -k2,2 | sed 's/ round=[0-9]*//'
for why in "${skipped[@]}"; do
    echo "skipped: $why"
done
"$bin_dir/urom-coll-report" "$tsv" --svg "$svg" --title "$NP ranks, $(nproc) CPUs"
echo "raw results: $tsv"
stop_daemon
record_finish '^collective benchmark:'
