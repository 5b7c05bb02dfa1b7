#!/bin/bash
# Worker benchmark: loopback commands through a real urom-worker process beside the bare
# shared-memory round trip, all in one run, and the medians and ratios side by side.
#
# Each run that ends well is appended to benches/results/worker.md (see benches/record.sh).
#
# usage: benches/run-worker-bench.sh [extra criterion arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
record_start worker "$@"
target=${CARGO_TARGET_DIR:-$(pwd)/target}
cargo bench -p urom-benches --bench worker -- "$@"

python3 - "$target/criterion" <<'PY'
import json, sys
root = sys.argv[1]
def median(bench):
    with open(f"{root}/{bench}/new/estimates.json") as f:
        return json.load(f)["median"]["point_estimate"]
bare = median("worker/transport_round_trip_64B")
native = median("worker/native_round_trip_64B")
doca = median("worker/doca_round_trip_64B")
per_command = median("worker_rate/native_pipelined_64")
print()
print("loopback commands through urom-worker, 64-byte frames, two pinned cores (medians of one run)")
print(f"  bare shm round trip (echo process)       {bare:8.1f} ns")
print(f"  graph plugin, native path                {native:8.1f} ns   x{native / bare:.2f} of bare")
print(f"  C loopback plugin, DOCA path             {doca:8.1f} ns   x{doca / bare:.2f} of bare")
print(f"  graph plugin, 64 in flight               {1e3 / per_command:8.2f} M commands/s ({per_command:.1f} ns/command)")
PY
record_finish '^loopback commands through urom-worker'
