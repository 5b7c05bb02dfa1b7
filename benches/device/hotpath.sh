#!/bin/bash
# Two builds of the hot-path benchmarks side by side on one machine, alternating: the shared-
# memory transport (`shm`: the cache-line floor, the 64-byte round trip and stream) and the
# message rate through the whole path (`rate`). For a machine without cargo: each build's
# programs are laid out as cargo would (`DIR/<build>/release/{urom-daemon,urom-worker,
# libworker_graph.so,deps/shm,deps/rate}`) and run with UROM_TESTKIT_PREBUILT=1.
#
# usage: benches/device/hotpath.sh DIR OUT [ROUNDS] [BUILD...]   (default builds: before after)
set -uo pipefail
dir=$(cd "$1" && pwd) out=$(cd "$2" && pwd) rounds=${3:-2}
shift $(($# < 3 ? $# : 3))
builds=("$@")
[ ${#builds[@]} -gt 0 ] || builds=(before after)
export UROM_TESTKIT_PREBUILT=1
nproc; lscpu | grep -E '^Model name' || true
for round in $(seq 1 "$rounds"); do
    order=("${builds[@]}")
    # Alternate which build goes first.
    [ $((round % 2)) -eq 0 ] && order=($(printf '%s\n' "${builds[@]}" | tac))
    for build in "${order[@]}"; do
        bin=$dir/$build/release/deps
        echo "== round $round $build"
        (cd "$out" && "$bin/shm" --bench --warm-up-time 0.5 --measurement-time 1 --noplot) \
            >"$out/shm.txt" 2>&1
        "$bin/rate" --bench 2 >"$out/rate.txt" 2>&1
        # One file per build and benchmark, each round's output after the last.
        { echo "== round $round"; cat "$out/shm.txt"; } >>"$out/shm-$build.txt"
        { echo "== round $round"; cat "$out/rate.txt"; } >>"$out/rate-$build.txt"
        grep -E 'time:' "$out/shm.txt" | head -8
        grep -E '^\s+\((a|b|e)\)|floor|round trip|lone' "$out/rate.txt"
    done
done
rm -f "$out/shm.txt" "$out/rate.txt"
