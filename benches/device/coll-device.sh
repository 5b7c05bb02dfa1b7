#!/bin/bash
# The collective benchmark on a 16-core machine without cargo or Open MPI, from the bundle
# benches/device/prepare.sh made (.device/: our release binaries and a relocatable Open MPI 4.1),
# in about 5-6 minutes (an estimate):
#
#   1. urom, 12 ranks on cores 0-11 and the worker alone on cores 12-15 (busy-polling),
#      beside Open MPI with the same 12 ranks (alternating, ROUNDS rounds);
#   2. Open MPI alone with 16 ranks on cores 0-15 (every core the machine has);
#   3. with MPI_PRELOAD=1: the MPI benchmark (benches/run-mpi-bench.sh), the same Open MPI
#      program with and without LD_PRELOAD=liburom_mpi.so, 12 ranks on cores 0-11 and the
#      worker alone on cores 12-15 (busy-polling), alternating (ROUNDS rounds; about as long
#      as part 1, an estimate).
#
# Allreduce and alltoall, 8 B to 16 MiB (SIZES), shorter loops than the default
# (BENCH_ARGS: 100 ms per timed loop, 200 ms of CPU loop, at least 5 iterations: a 16 MiB
# alltoall of 12 ranks moves 2.3 GiB). Everything lands in OUT (default .device/out): the
# console output (coll-device.txt), each part's TSV and SVG (urom-12/, openmpi-16/, mpi-12/), the
# results files with the entries the runs appended (coll.md, mpi.md), the machine's description
# (machine.txt).
#
# usage: OUT=DIR benches/device/coll-device.sh
#   env: ROUNDS (3), SIZES, COLLS, NP (12), RANK_CPUS (0-11), WORKER_CPUS (12-15), ALL_CPUS
#        (0-15), BENCH_ARGS, SKIP_OMPI_ALL=1 (leave part 2 out), MPI_PRELOAD=1 (part 3),
#        SKIP_UROM=1 (leave part 1 out)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
export DEVICE_DIR=${DEVICE_DIR:-$repo/.device}
if [ ! -f "$DEVICE_DIR/env.sh" ]; then
    echo "coll-device: no bundle in $DEVICE_DIR (run benches/device/prepare.sh where cargo is)" >&2
    exit 1
fi
# shellcheck source=/dev/null
. "$DEVICE_DIR/env.sh"
# The commit the bundle was built from, for the results entries (no git there).
[ -f "$DEVICE_DIR/commit" ] && export UROM_BENCH_COMMIT="$(cat "$DEVICE_DIR/commit")"
OUT=${OUT:-$DEVICE_DIR/out}
mkdir -p "$OUT"

ROUNDS=${ROUNDS:-3}
export SIZES=${SIZES:-8 64 512 4096 32768 65536 262144 1048576 4194304 16777216}
export COLLS=${COLLS:-allreduce alltoall}
export BENCH_ARGS=${BENCH_ARGS:---budget-ms 100 --cpu-budget-ms 200 --min-iters 5}
export BIN_DIR=$DEVICE_DIR/bin
NP=${NP:-12}
RANK_CPUS=${RANK_CPUS:-0-11}
WORKER_CPUS=${WORKER_CPUS:-12-15}
ALL_CPUS=${ALL_CPUS:-0-15}

exec > >(tee "$OUT/coll-device.txt") 2>&1
started=$SECONDS
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "kernel: $(uname -r)"
    echo "cpus: $(nproc), $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
    echo "memory: $(awk '/MemTotal/ {print $2 / 1048576 " GiB"}' /proc/meminfo)"
    command -v lscpu >/dev/null && lscpu | grep -E '^(NUMA|Thread|Core|Socket|L3)' || true
    df -h /dev/shm | tail -n 1
    echo "mpirun: $(command -v mpirun), $(mpirun --version 2>&1 | head -n 1)"
} | tee "$OUT/machine.txt"

# The urom buffers live in /dev/shm: a 16 MiB alltoall of 12 ranks takes 4.5 GiB there.
shm_kib=$(df -k --output=avail /dev/shm | tail -n 1 | tr -d ' ')
if [ "$shm_kib" -lt $((8 << 20)) ]; then
    echo "coll-device: /dev/shm has $((shm_kib >> 10)) MiB free; trying to grow it to 16 GiB"
    mount -o remount,size=16G /dev/shm || echo "coll-device: could not grow /dev/shm; large sizes may fail"
fi

# What still does not fit (a container's small /dev/shm that cannot grow) is left out of part 1:
# an alltoall of S bytes over n ranks holds 2 S n^2 bytes of shared buffers.
shm_kib=$(df -k --output=avail /dev/shm | tail -n 1 | tr -d ' ')
part1_sizes=""
for s in $SIZES; do
    if (((2 * s * NP * NP >> 10) < shm_kib * 8 / 10)); then
        part1_sizes="$part1_sizes $s"
    else
        echo "coll-device: $s B left out of part 1: /dev/shm has $((shm_kib >> 10)) MiB free"
    fi
done

# A private copy of the results history: the runs append to it, it goes to OUT.
cp benches/results/coll.md "$OUT/coll.md.before" 2>/dev/null || true

cp benches/results/mpi.md "$OUT/mpi.md.before" 2>/dev/null || true

if [ "${SKIP_UROM:-0}" != 1 ]; then
    echo "== part 1: urom ($NP ranks on $RANK_CPUS, worker on $WORKER_CPUS) and Open MPI ($NP ranks)"
    mkdir -p "$OUT/urom-$NP"
    RESULTS_DIR=$OUT/urom-$NP NP=$NP RANK_CPUS=$RANK_CPUS WORKER_CPUS=$WORKER_CPUS WORKER_BUSY_POLL=1 \
        IMPLS="openmpi urom" SIZES="${part1_sizes# }" benches/run-coll-bench.sh "$ROUNDS" ||
        echo "coll-device: part 1 failed (its raw lines so far are in $OUT/urom-$NP)"
    echo "part 1 took $((SECONDS - started)) s"
fi

if [ "${SKIP_OMPI_ALL:-0}" != 1 ]; then
    echo "== part 2: Open MPI alone, every core ($ALL_CPUS)"
    all_np=$(($(echo "$ALL_CPUS" | tr ',' '\n' | awk -F- '{n += (NF == 2 ? $2 - $1 + 1 : 1)} END {print n}')))
    mkdir -p "$OUT/openmpi-$all_np"
    RESULTS_DIR=$OUT/openmpi-$all_np NP=$all_np RANK_CPUS=$ALL_CPUS WORKER_CPUS= IMPLS=openmpi \
        benches/run-coll-bench.sh "$ROUNDS" || echo "coll-device: part 2 failed"
fi

if [ "${MPI_PRELOAD:-0}" = 1 ]; then
    # liburom_mpi.so registers the program's own buffers (cross-memory attach), not /dev/shm:
    # every size fits.
    echo "== part 3: MPI programs, Open MPI with and without LD_PRELOAD=liburom_mpi.so ($NP ranks on $RANK_CPUS, worker on $WORKER_CPUS)"
    mkdir -p "$OUT/mpi-$NP"
    part3=$SECONDS
    RESULTS_DIR=$OUT/mpi-$NP NP=$NP RANK_CPUS=$RANK_CPUS WORKER_CPUS=$WORKER_CPUS WORKER_BUSY_POLL=1 \
        benches/run-mpi-bench.sh "$ROUNDS" ||
        echo "coll-device: part 3 failed (its raw lines so far are in $OUT/mpi-$NP)"
    echo "part 3 took $((SECONDS - part3)) s"
    cp benches/results/mpi.md "$OUT/mpi.md" 2>/dev/null || true
fi

cp benches/results/coll.md "$OUT/coll.md"
echo "coll-device: done in $((SECONDS - started)) s; results in $OUT"
