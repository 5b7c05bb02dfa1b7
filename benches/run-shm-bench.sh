#!/bin/bash
# Shared-memory transport benchmark, side by side with the hardware floor and UCX.
#
# Runs `cargo bench -p urom-benches --bench shm` (floor: one cache line ping-ponged between two
# pinned processes, one line per direction, and a bare 64-byte frame each way; our 64-byte round
# trip; our one-way 64-byte stream), then, when `ucx_perftest` is installed (Debian:
# ucx-utils), alternating rounds of ours and of `ucp_am_lat` / `ucp_am_bw` over UCX_TLS=posix
# with 64-byte messages on the same two cores, and prints the medians of the per-round ratios.
# Compare numbers of one run only: the host may steal time from busy-polling vCPUs.
#
# Each run that ends well is appended to benches/results/shm.md (see benches/record.sh).
#
# usage: [ROUNDS=10] benches/run-shm-bench.sh [extra criterion arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
record_start shm "$@"
target=${CARGO_TARGET_DIR:-$(pwd)/target}
cargo bench -p urom-benches --bench shm -- "$@"

# Then alternating short rounds of ours and of ucx_perftest (these machines change speed within
# seconds, so each ratio compares neighbours): ROUNDS (default 10) of our round trip and stream,
# then ucp_am_lat and ucp_am_bw over UCX_TLS=posix on the same two cores.
rounds=${ROUNDS:-10}
ratios=$(mktemp)
trap 'rm -f "$ratios"' EXIT
if command -v ucx_perftest >/dev/null; then
    run_ucx() { # test iterations port
        UCX_TLS=posix UCX_WARN_UNUSED_ENV_VARS=n ucx_perftest -c 1 -p "$3" >/dev/null 2>&1 &
        local server=$!
        sleep 0.5
        UCX_TLS=posix UCX_WARN_UNUSED_ENV_VARS=n \
            ucx_perftest localhost -p "$3" -t "$1" -s 64 -n "$2" -c 0 2>&1 | awk '/^Final:/'
        wait "$server" || true
    }
    for round in $(seq 1 "$rounds"); do
        cargo bench -p urom-benches --bench shm -- --warm-up-time 0.5 --measurement-time 1 \
            'shm/(round_trip|stream)_64B' >/dev/null 2>&1
        # Final: iterations, latency p50 / avg / overall (us, one way), bandwidth avg / overall,
        # message rate avg / overall.
        lat=$(run_ucx ucp_am_lat 200000 $((13371 + 2 * round)) | awk '{print $3}')
        rate=$(run_ucx ucp_am_bw 2000000 $((13372 + 2 * round)) | awk '{print $9}')
        python3 - "$target/criterion" "$lat" "$rate" >>"$ratios" <<'PY'
import json, sys
root, lat, rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def median(bench):
    with open(f"{root}/{bench}/new/estimates.json") as f:
        return json.load(f)["median"]["point_estimate"]
rt, per_frame = median("shm/round_trip_64B"), median("shm/stream_64B")
print(rt / (2 * lat * 1000), (1e9 / per_frame) / rate)
PY
    done
else
    echo "ucx_perftest not installed (apt-get install ucx-utils): UCX columns skipped"
fi

python3 - "$target/criterion" "$ratios" "$rounds" <<'PY'
import json, statistics, sys
root, ratios, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
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
print("shared-memory transport, 64-byte frames, two pinned processes (medians)")
print(f"  (a) floor: cache-line round trip      {floor:8.1f} ns")
print(f"      one line per direction             {floor2:8.1f} ns   x{floor2 / floor:.2f} of (a)")
print(f"      bare 64-byte frame each way        {floor64:8.1f} ns   x{floor64 / floor:.2f} of (a)")
print(f"  (b) shm connection round trip          {rt:8.1f} ns   (b)/(a) = {rt / floor:.2f}"
      f"   (b)/bare frame = {rt / floor64:.2f}")
print(f"  (c) shm one-way stream                 {rate / 1e6:8.2f} M frames/s ({per_frame:.1f} ns/frame)")
rows = [tuple(map(float, line.split())) for line in open(ratios) if line.strip()]
if rows:
    print(f"  against ucx_perftest over UCX_TLS=posix, median of {len(rows)} alternating rounds:")
    print(f"      (b) / ucp_am_lat round trip (p50 one way x2)   {statistics.median(r[0] for r in rows):.2f}")
    print(f"      (c) / ucp_am_bw message rate                    {statistics.median(r[1] for r in rows):.2f}")
PY
record_finish '^shared-memory transport, 64-byte frames'
