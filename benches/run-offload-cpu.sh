#!/bin/bash
# CPU time, context switches and system calls per request of the GPU offload server and CPU
# orchestrator, beside the bare TCP server of `cargo bench -p gpu-offload --bench offload`,
# under the same client load (64-byte payloads, 128 in flight per client thread). Processor
# threads share their server thread's CPU (`--cpu 0 --cpu 1` on both sides), the most frugal
# placement on a machine with two CPUs, and poll 20 us after a burst (`--poll-us 20`). Each
# data-path thread may hold every request the clients keep in flight
# (`--max-concurrent-messages` 128 per client thread, as the bare server holds them all), so
# that clients on one thread share hand-offs to the processor; `OFFLOAD_MAX_CONCURRENT` sets
# another value (128 is the programs' default).
#
# Each round drives ours, then the bare server, for a few seconds each and reads their threads'
# CPU time and context switches from /proc (`schedstat`, `status`, read by python3), which costs
# them nothing; then a second pass under `perf stat` counts their system calls over a whole
# client run (tracing every system call slows both servers down, so that pass gives no rate or
# CPU time). Without `perf` (or
# permission to count the processes' events: root, or a kernel.perf_event_paranoid of 1 or
# less) the system calls are left out. The last lines are the medians over the rounds of the
# per-round ratios.
#
# Each run that ends well is appended to benches/results/offload-cpu.md (see benches/record.sh).
#
# usage: benches/run-offload-cpu.sh [client threads (4)] [rounds (3)] [seconds (3)]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
record_start offload-cpu "$@"
threads=${1:-4} rounds=${2:-3} seconds=${3:-3}
max_concurrent=${OFFLOAD_MAX_CONCURRENT:-$((threads * 128))}
have_perf=1
command -v perf >/dev/null || { echo "perf is not installed: system calls are not counted" >&2; have_perf=0; }

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

# cpu_of SECONDS PID...: "cpu-ns switches" of the processes' threads over the next SECONDS.
cpu_of() {
    python3 - "$@" <<'PY'
import os, sys, time
seconds, pids = float(sys.argv[1]), sys.argv[2:]
def threads():
    found = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            sys.exit(f"process {pid} is gone")
        for tid in tids:
            try:
                ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
                status = open(f"/proc/{pid}/task/{tid}/status").read().splitlines()
                switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
                found[tid] = (ns, switches)
            except (OSError, ValueError, IndexError):
                pass
    return found
before = threads()
time.sleep(seconds)
after = threads()
print(sum(ns - before.get(tid, (0, 0))[0] for tid, (ns, _) in after.items()),
      sum(sw - before.get(tid, (0, 0))[1] for tid, (_, sw) in after.items()))
PY
}

# client PORT SECONDS: runs the client against PORT in the background, output in $dir/client;
# it runs two seconds longer than the readings of the servers' threads, which must end before
# the bare server's threads (one per client connection) do.
client() {
    timeout -s INT -k 10 "$(($2 + 2))" "$bin/gpu-offload-client" -s 127.0.0.1 -p "$1" \
        -t "$threads" -i 1000000000 -m "$message" -e "$expected" \
        --max-concurrent-messages 128 -l 30 >"$dir/client" 2>"$dir/client.err" &
    client_pid=$!
}

rate() {
    local r
    r=$(sed -n 's/.*IO rate: *\([0-9.]*\).*/\1/p' "$dir/client")
    [ -n "$r" ] || { echo "the client failed:" >&2; cat "$dir/client.err" >&2; r=0; }
    echo "$r"
}

# measure NAME PORT PID...: rate, CPU time and switches per request, then system calls.
measure() {
    local name=$1 port=$2
    shift 2
    local r cpu switches calls=""
    client "$port" "$seconds"
    sleep 0.5
    read -r cpu switches < <(cpu_of "$seconds" "$@")
    wait "$client_pid" || true
    r=$(rate)
    if [ "$have_perf" = 1 ]; then
        local targets
        targets=$(IFS=,; echo "$*")
        # Counting attached to running threads now and then counts nothing: try again then.
        for _ in 1 2 3; do
            perf stat -x, -e raw_syscalls:sys_enter -p "$targets" -- sleep "$((seconds + 2))" \
                2>"$dir/stat" &
            local perf_pid=$!
            sleep 0.5
            client "$port" "$seconds"
            wait "$client_pid" || true
            wait "$perf_pid" || true
            calls=$(awk -F, '/sys_enter/ { print $1 + 0 }' "$dir/stat")
            [ "${calls:-0}" -gt 0 ] && break
        done
        local ops
        ops=$(sed -n 's/.*Operation count: *\([0-9]*\).*/\1/p' "$dir/client")
        calls=$(awk -v c="${calls:-0}" -v ops="${ops:-0}" 'BEGIN { if (c > 0 && ops > 0) printf "%.2f", c / ops * 128 }')
    fi
    awk -v name="$name" -v r="$r" -v s="$seconds" -v cpu="$cpu" -v sw="$switches" -v calls="$calls" '
        BEGIN {
            ops = r * 1e6 * s
            printf "  %-28s %6.2f MIOP/s  %5.0f ns CPU/request  %.2f switches", name, r, cpu / ops, sw / ops * 128
            if (calls != "") printf " and %s system calls", calls
            printf " per 128 requests\n"
            printf "%s %s %s\n", name, r, cpu / ops >> "'"$dir/results"'"
        }'
}

"$bin/gpu-offload-server" -c "$dir/channel.sock" -p 18600 -a 127.0.0.1 -l 30 --cpu 0 --cpu 1 \
    --max-concurrent-messages "$max_concurrent" >/dev/null 2>&1 &
server=$!
pids+=("$server")
sleep 0.3
"$bin/gpu-offload-orchestrator" -c "$dir/channel.sock" -t 2 --cpu 0 --cpu 1 --poll-us 20 -l 30 \
    --max-concurrent-messages "$max_concurrent" >/dev/null 2>&1 &
orchestrator=$!
pids+=("$orchestrator")
GPU_OFFLOAD_BENCH_BARE=1 "$bench" >"$dir/bare" &
bare=$!
pids+=("$bare")
sleep 1
bare_port=$(sed 's/.*://' "$dir/bare")

echo "$threads client thread(s), 64-byte payloads, 128 in flight per thread; server and orchestrator: --max-concurrent-messages $max_concurrent"
for round in $(seq "$rounds"); do
    echo "round $round"
    measure "server + CPU orchestrator" 18600 "$server" "$orchestrator"
    measure "bare TCP server" "$bare_port" "$bare"
done
# A round where a reading failed (a process's threads could not be read) is left out.
awk 'NR % 2 == 1 { r = $(NF - 1); c = $NF; next }
    r > 0 && c > 0 && $(NF - 1) > 0 && $NF > 0 { rate[++n] = r / $(NF - 1); cpu[n] = c / $NF }
    function median(a, n,    i, j, t) {
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END { printf "median of %d rounds: rate %.2fx the bare server, CPU per request %.2fx\n", n, median(rate, n), median(cpu, n) }' \
    "$dir/results"
record_finish
