#!/bin/bash
# CPU time, context switches and system calls per request of the GPU offload server and CPU
# orchestrator, beside the bare TCP server of `cargo bench -p gpu-offload --bench offload`,
# under the same client load (64-byte payloads, 128 in flight per client thread).
#
# Each round runs ours, then the bare server, for a few seconds each under `perf stat`
# (needs `perf` and permission to count the processes' events: root, or a
# kernel.perf_event_paranoid of 1 or less) and prints per-request figures.
#
# usage: benches/run-offload-cpu.sh [client threads (4)] [rounds (3)] [seconds (3)]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-4} rounds=${2:-3} seconds=${3:-3}
command -v perf >/dev/null || { echo "perf is not installed" >&2; exit 1; }

cargo build --release -p gpu-offload --bins
bench=$(cargo bench -p gpu-offload --bench offload --no-run 2>&1 |
    sed -n 's/.*Executable.*(\(.*\))/\1/p')
bin=target/release
message=abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl
expected=$(echo -n "$message" | rev)
dir=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

# measure NAME PORT PID...: drives the server at PORT and counts the PIDs' events.
measure() {
    local name=$1 port=$2
    shift 2
    local targets
    targets=$(IFS=,; echo "$*")
    # The client stops (Ctrl-C) a little after the counting ends.
    timeout -s INT -k 10 "$((seconds + 1))" "$bin/gpu-offload-client" -s 127.0.0.1 -p "$port" \
        -t "$threads" -i 1000000000 -m "$message" -e "$expected" \
        --max-concurrent-messages 128 -l 30 >"$dir/client" 2>/dev/null &
    local client=$!
    sleep 0.5
    perf stat -x, -e task-clock,context-switches,raw_syscalls:sys_enter -p "$targets" \
        -- sleep "$seconds" 2>"$dir/stat"
    wait "$client" || true
    awk -F, -v name="$name" -v seconds="$seconds" '
        /IO rate/ { rate = $0; sub(/.*: */, "", rate); sub(/ .*/, "", rate) }
        FNR != NR && /task-clock/ { cpu = $1 }
        FNR != NR && /context-switches/ { switches = $1 }
        FNR != NR && /sys_enter/ { calls = $1 }
        END {
            ops = rate * 1e6 * seconds
            printf "  %-28s %6.2f MIOP/s  %5.0f ns CPU/request  %.2f switches and %.2f system calls per 128 requests\n",
                name, rate, cpu * 1e6 / ops, switches / ops * 128, calls / ops * 128
        }' "$dir/client" "$dir/stat"
}

"$bin/gpu-offload-server" -c "$dir/channel.sock" -p 18600 -a 127.0.0.1 -l 30 --cpu 0 --cpu 1 \
    >/dev/null 2>&1 &
server=$!
pids+=("$server")
sleep 0.3
"$bin/gpu-offload-orchestrator" -c "$dir/channel.sock" -t 2 --cpu 0 --cpu 1 -l 30 \
    >/dev/null 2>&1 &
orchestrator=$!
pids+=("$orchestrator")
GPU_OFFLOAD_BENCH_BARE=1 "$bench" >"$dir/bare" &
bare=$!
pids+=("$bare")
sleep 1
bare_port=$(sed 's/.*://' "$dir/bare")

echo "$threads client thread(s), 64-byte payloads, 128 in flight per thread"
for round in $(seq "$rounds"); do
    echo "round $round"
    measure "server + CPU orchestrator" 18600 "$server" "$orchestrator"
    measure "bare TCP server" "$bare_port" "$bare"
done
