#!/usr/bin/env bash
# Runs samples/mpi/overlap.c twice under the same mpirun: as it is, and with liburom_mpi.so
# preloaded; both print the same checksum and the time they spent. Needs Open MPI (mpicc,
# mpirun) and a urom daemon offering worker_coll (UROM_SERVICE_SOCKET, or the service file).
#   samples/mpi/run.sh [ranks]
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${1:-2}
cargo build --release -p urom-capi-coll -p urom-capi-mpi
mpicc -O2 -o target/release/overlap samples/mpi/overlap.c
mpirun=(mpirun --oversubscribe -np "$ranks" --mca pml ob1 --mca btl self,vader)
[ "$(id -u)" -ne 0 ] || mpirun+=(--allow-run-as-root)
[ -z "${UROM_SERVICE_SOCKET:-}" ] || mpirun+=(-x UROM_SERVICE_SOCKET)
echo "== Open MPI alone"
"${mpirun[@]}" target/release/overlap
echo "== with LD_PRELOAD=liburom_mpi.so"
"${mpirun[@]}" -x LD_PRELOAD="$PWD/target/release/liburom_mpi.so" -x UROM_MPI_VERBOSE=1 \
    target/release/overlap
