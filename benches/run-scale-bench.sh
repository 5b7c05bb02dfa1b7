#!/bin/bash
# Scale benchmark: many workers on one daemon, spawned from one host (benches/examples/scale.rs).
# For each count (default 64 256 1024, as many as the machine's memory allows: a count whose
# workers would need more than half the available memory at 8 MiB each is left out, and said so):
#   - spawn to running, one worker after another, each beside a bare fork+exec of urom-worker
#     (--version, until it exits) just before it, and the median of spawn minus that fork+exec
#     over all rounds and over the last tenth spawned (the most workers running);
#   - each worker's private memory (Private_Dirty of /proc/PID/smaps_rollup) and RSS;
#   - the CPU all workers use while idle (schedstat of every thread over IDLE_SECS, default 3)
#     and their wake-ups per second;
#   - the daemon's threads and RSS, and the host's RSS (of it shared memory, the rings);
# then 256 workers (at most the largest count) requested at once, and the graph loopback rate
# through 1, 16 and 256 workers at once from one host.
#
# Each run that ends well is appended to benches/results/scale.md (see benches/record.sh).
#
# usage: benches/run-scale-bench.sh [COUNT...]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/record.sh
record_start scale "$@"
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(64 256 1024)
idle=${IDLE_SECS:-3}
cargo build --release -q -p urom-daemon -p urom-worker -p urom-plugin-graph
cargo build --release -q -p urom-benches --example scale
target=${CARGO_TARGET_DIR:-$(pwd)/target}
scale=$target/release/examples/scale
export UROM_TESTKIT_PREBUILT=1

# The daemon's directory (its socket, each worker's directory, socket and log) on tmpfs, as
# /run/urom is in a deployment: on this VM's ext4 /tmp, allocating those inodes took 1-3 ms of
# every spawn, more the more files the disk had seen come and go, which is the disk's cost, not
# the service's. Set TMPDIR to measure another place.
if [ -z "${TMPDIR:-}" ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ]; then
    export TMPDIR=/dev/shm
fi
daemon_fs="$(stat -f -c %T "${TMPDIR:-/tmp}") (${TMPDIR:-/tmp})"

# The host holds about 7 descriptors per worker, the daemon 3.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
available_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
fits=()
skipped=""
for n in "${counts[@]}"; do
    if [ $((n * 8 * 1024)) -gt $((available_kib / 2)) ]; then
        skipped+="left out: $n workers (would need more than half of the $((available_kib / 1024)) MiB available)"$'\n'
    elif [ $((n * 8 + 64)) -gt "$(ulimit -n)" ]; then
        skipped+="left out: $n workers (open-file limit $(ulimit -n))"$'\n'
    else
        fits+=("$n")
    fi
done
[ ${#fits[@]} -gt 0 ] || { echo "no count fits this machine" >&2; exit 1; }

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for n in "${fits[@]}"; do
    echo "== $n workers, one after another"
    "$scale" "$n" --idle-secs "$idle" | tee -a "$out"
done
largest=${fits[${#fits[@]} - 1]}
at_once=$((largest < 256 ? largest : 256))
echo "== $at_once workers requested at once, and loopback rates"
"$scale" "$at_once" --at-once --idle-secs 1 --rate | tee -a "$out"

printf '%s' "$skipped"
SKIPPED=$skipped DAEMON_FS=$daemon_fs python3 - "$out" <<'PY'
import os, re, sys
runs, run = [], None
for line in open(sys.argv[1]):
    key, _, value = line.strip().partition(": ")
    if key == "workers":
        run = {"workers": int(value)}
        runs.append(run)
    elif run is not None and value:
        run[key] = value
def nums(text):
    return [float(x) for x in re.findall(r"[-\d.]+", text.split(" over ")[0])]
print()
print("scale: workers on one daemon, spawned from one host (graph plugin, default sizes, max_inflight 64)")
print(f"  the daemon's directory on {os.environ['DAEMON_FS']}; over: spawn minus the fork+exec "
      "beside it, median of all rounds / of the last tenth spawned")
print(f"  {'workers':>8} {'fork+exec':>10} {'spawn med/p90':>15} {'over med/last':>14} {'idle CPU':>9} {'wakes/s':>8} "
      f"{'priv KiB':>9} {'RSS KiB':>8} {'d.threads':>9} {'d.RSS MiB':>9} {'host RSS MiB':>12}")
for line in os.environ.get("SKIPPED", "").splitlines():
    print(f"  {line}")
for r in runs:
    if "spawn to running (ms, median / p90 / last)" not in r:
        continue
    bare = nums(r["bare fork+exec (ms, median / p90)"])
    spawn = nums(r["spawn to running (ms, median / p90 / last)"])
    over = nums(r["spawn over its round's fork+exec (ms, median / p90 / median of the last tenth)"])
    cpu = nums(r["idle CPU of all workers (% of a core)"])[0]
    wakes = nums(r["idle wake-ups per worker per second"])[0]
    priv = nums(r["worker Private_Dirty (KiB, median / all)"])[0]
    rss = nums(r["worker RSS (KiB, median)"])[0]
    threads = nums(r["daemon threads (before / with workers)"])[1]
    drss = nums(r["daemon RSS (KiB)"])[0] / 1024
    host = nums(r["host RSS (KiB, before / with workers, of it shared memory)"])[1] / 1024
    print(f"  {r['workers']:>8} {bare[0]:>8.2f}ms {spawn[0]:>6.1f}/{spawn[1]:>5.1f}ms "
          f"{over[0]:>+5.1f}/{over[2]:>+5.1f}ms "
          f"{cpu:>8.3f}% {wakes:>8.1f} {priv:>9.0f} {rss:>8.0f} {threads:>9.0f} {drss:>9.1f} {host:>12.1f}")
for r in runs:
    key = "spawn to running, all at once (ms, median / p90 / last)"
    if key in r:
        spawn = nums(r[key])
        bare = nums(r["bare fork+exec (ms, median / p90)"])
        print(f"  {r['workers']} requested at once: running after median {spawn[0]:.0f} ms, "
              f"p90 {spawn[1]:.0f} ms, last {spawn[2]:.0f} ms (bare fork+exec {bare[0]:.2f} ms)")
        for width in (1, 16, 256):
            rate = r.get(f"loopback rate through {width} workers (k/s)")
            if rate:
                print(f"  loopback rate through {width} workers at once: {rate} k/s")
PY
record_finish '^scale: workers on one daemon'
