#!/usr/bin/env bash
# The chaos suite's long form: every scenario of chaos/ in a release build, scaled up
# (UROM_CHAOS_SCALE, default 20: more tasks, rounds and time), the foreign-user and
# connection-flood scenarios included, then the worker's long slow-host tests. Each scenario
# prints one `chaos <scenario>: ...` line; they are repeated together at the end.
#
#   chaos/run.sh                          # scale 20
#   UROM_CHAOS_SCALE=5 chaos/run.sh       # shorter
#   UROM_CHAOS_SEED=0x1234 chaos/run.sh   # replay the seed a failing scenario printed
#
# Every part runs even when one fails; the script exits 1 if any did, naming them.
set -uo pipefail
cd "$(dirname "$0")/.."

export UROM_CHAOS_SCALE=${UROM_CHAOS_SCALE:-20}
export UROM_LONG_TESTS=1

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()

part() {
    local name=$1
    shift
    printf '\n==> %s\n' "$*"
    if ! "$@" 2>&1 | tee -a "$log"; then
        failed+=("$name")
    fi
}

part chaos cargo test --release -p urom-chaos --test chaos -- --nocapture --test-threads=1
part users_and_floods cargo test --release -p urom-chaos --test users_and_floods -- \
    --nocapture --test-threads=1
part slow_host cargo test --release -p urom-worker --test slow_host -- --nocapture \
    --test-threads=1

printf '\n==> scale %s\n' "$UROM_CHAOS_SCALE"
grep -oE 'chaos [a-z_]+(: | \(seed ).*|slow host paused .*|^  [A-Za-z].*' "$log" || true
if ((${#failed[@]})); then
    printf 'failed: %s\n' "${failed[*]}"
    exit 1
fi
echo "every chaos scenario passed"
