#!/bin/bash
# GPU offload rates by requests in flight, for each processor given (default: cpu; add cuda on a
# machine with a GPU), one after the other in one run: `gpu-offload-client` with 64-byte
# payloads and one thread at 1, 8, 32, 128 and 512 requests in flight, four threads at 128, and
# one thread at 128 with 256-byte payloads, against `gpu-offload-server --cpu 0 --cpu 1` and
# `gpu-offload-orchestrator -t 2 --cpu 1 --cpu 0 --processor P`, both with
# `--max-concurrent-messages 512`. Every response is checked by the client. Prints MIOP/s, a
# row per processor; with one request in flight the rate is the inverse of the round trip.
#
# Builds with `--features cuda` when cuda is asked for; set GPU_OFFLOAD_BIN to a folder with
# the three programs to use those instead (built elsewhere, on a machine without Rust).
#
# Each run that ends well is appended to benches/results/offload-sweep.md (see benches/record.sh).
#
# usage: benches/run-offload-sweep.sh [processor ...]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
record_start offload-sweep "$@"
processors=("${@:-cpu}")
if [ -n "${GPU_OFFLOAD_BIN:-}" ]; then
    bin=$GPU_OFFLOAD_BIN
else
    features=()
    for p in "${processors[@]}"; do [ "$p" = cuda ] && features=(--features cuda); done
    cargo build --release -p gpu-offload --bins "${features[@]}"
    bin=target/release
fi
short=abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl
long=$(printf '%s' "$short$short$short$short" | tr 'a-z' 'A-Z')
dir=$(mktemp -d)
server=""
orchestrator=""
stop_stack() {
    [ -n "$server" ] && kill -INT "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
    [ -n "$orchestrator" ] && wait "$orchestrator" 2>/dev/null || true
    server=""
    orchestrator=""
}
trap 'stop_stack; rm -rf "$dir"' EXIT

# rate THREADS IN_FLIGHT REQUESTS MESSAGE: the client's MIOP/s, or "failed".
rate() {
    local expected
    expected=$(printf '%s' "$4" | rev)
    if timeout 120 "$bin/gpu-offload-client" -s 127.0.0.1 -p "$port" -t "$1" -i "$3" -m "$4" \
        -e "$expected" --max-concurrent-messages "$2" --response-timeout 10 -l 30 \
        >"$dir/client" 2>&1; then
        awk '/IO rate:/ { printf "%.3f\n", $(NF - 1) }' "$dir/client"
    else
        echo failed
        sed 's/^/    /' "$dir/client" >&2
    fi
}

printf '%-10s %9s %9s %9s %9s %9s %11s %13s\n' processor 1 8 32 128 512 "4 x 128" "128, 256 B"
for processor in "${processors[@]}"; do
    rm -f "$dir/channel.sock"
    "$bin/gpu-offload-server" -c "$dir/channel.sock" -p 0 -a 127.0.0.1 --cpu 0 --cpu 1 \
        --max-concurrent-messages 512 -l 30 >"$dir/server.out" 2>"$dir/server.log" &
    server=$!
    "$bin/gpu-offload-orchestrator" -c "$dir/channel.sock" -t 2 --cpu 1 --cpu 0 \
        --max-concurrent-messages 512 --processor "$processor" -l 30 \
        >/dev/null 2>"$dir/orchestrator.log" &
    orchestrator=$!
    port=""
    for _ in $(seq 100); do
        port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$dir/server.out")
        [ -n "$port" ] && break
        sleep 0.1
    done
    if [ -z "$port" ]; then
        echo "$processor: the server did not listen:" >&2
        cat "$dir/orchestrator.log" >&2
        stop_stack
        continue
    fi
    row=()
    for in_flight in 1 8 32 128 512; do
        requests=$((in_flight * 200 > 20000 ? in_flight * 200 : 20000))
        row+=("$(rate 1 "$in_flight" "$requests" "$short")")
    done
    row+=("$(rate 4 128 100000 "$short")")
    row+=("$(rate 1 128 50000 "$long")")
    printf '%-10s %9s %9s %9s %9s %9s %11s %13s\n' "$processor" "${row[@]}"
    stop_stack
done
record_finish
