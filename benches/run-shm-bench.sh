#!/bin/bash
# Shared-memory transport benchmark, side by side with the hardware floor and UCX.
#
# Runs `cargo bench -p urom-benches --bench shm` (floor: one cache line ping-ponged between two
# pinned processes, one line per direction, and a bare 64-byte frame each way; our 64-byte round
# trip; our one-way 64-byte stream), then, when
# `ucx_perftest` is installed (Debian: ucx-utils), `ucp_am_lat` and `ucp_am_bw` over
# UCX_TLS=posix with 64-byte messages on the same two cores, and prints all medians together.
# Compare numbers of one run only: the host may steal time from busy-polling vCPUs.
#
# usage: benches/run-shm-bench.sh [extra criterion arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$(pwd)/target}
cargo bench -p urom-benches --bench shm -- "$@"

ucx_lat="" ucx_rate=""
if command -v ucx_perftest >/dev/null; then
    run_ucx() { # test iterations port
        UCX_TLS=posix UCX_WARN_UNUSED_ENV_VARS=n ucx_perftest -c 1 -p "$3" >/dev/null 2>&1 &
        local server=$!
        sleep 1
        UCX_TLS=posix UCX_WARN_UNUSED_ENV_VARS=n \
            ucx_perftest localhost -p "$3" -t "$1" -s 64 -n "$2" -c 0 2>&1 | awk '/^Final:/'
        wait "$server" || true
    }
    # Final: iterations, latency p50 / avg / overall (us, one way), bandwidth avg / overall,
    # message rate avg / overall.
    ucx_lat=$(run_ucx ucp_am_lat 1000000 13371 | awk '{print $3}')
    ucx_rate=$(run_ucx ucp_am_bw 10000000 13372 | awk '{print $9}')
else
    echo "ucx_perftest not installed (apt-get install ucx-utils): UCX columns skipped"
fi

python3 - "$target/criterion" "$ucx_lat" "$ucx_rate" <<'PY'
import json, sys
root, ucx_lat, ucx_rate = sys.argv[1], sys.argv[2], sys.argv[3]
def median(bench):
    with open(f"{root}/{bench}/new/estimates.json") as f:
        return json.load(f)["median"]["point_estimate"]
floor = median("floor/cache_line_round_trip")
floor2 = median("floor/two_lines_round_trip")
floor64 = median("floor/frame_64B_round_trip")
rt = median("shm/round_trip_64B")
per_frame = median("shm/stream_64B")
rate = 1e9 / per_frame
print()
print("shared-memory transport, 64-byte frames, two pinned processes (medians of one run)")
print(f"  (a) floor: cache-line round trip      {floor:8.1f} ns")
print(f"      one line per direction             {floor2:8.1f} ns   x{floor2 / floor:.2f} of (a)")
print(f"      bare 64-byte frame each way        {floor64:8.1f} ns   x{floor64 / floor:.2f} of (a)")
print(f"  (b) shm connection round trip          {rt:8.1f} ns   (b)/(a) = {rt / floor:.2f}"
      f"   (b)/bare frame = {rt / floor64:.2f}")
print(f"  (c) shm one-way stream                 {rate / 1e6:8.2f} M frames/s ({per_frame:.1f} ns/frame)")
if ucx_lat and ucx_rate:
    ucx_rt = 2 * float(ucx_lat) * 1000
    ucx_rate = float(ucx_rate)
    print(f"  ucx_perftest ucp_am_lat (posix)        {ucx_rt:8.1f} ns round trip (p50 one way x2)"
          f"   (b)/ucx = {rt / ucx_rt:.2f}")
    print(f"  ucx_perftest ucp_am_bw  (posix)        {ucx_rate / 1e6:8.2f} M msg/s"
          f"   (c)/ucx = {rate / ucx_rate:.2f}")
PY
