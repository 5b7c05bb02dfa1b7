# Sourced by the benches/run-*.sh scripts: a run that ends well appends a dated entry to
# benches/results/NAME.md with the date, the commit, the machine, the command line and the
# summary lines the script printed. The results files are append-only history; the current
# numbers are summarised in benches/README.md.
#
#   . "$(dirname "$0")/record.sh"
#   record_start NAME "$@"     # from here on stdout is also kept (and printed as before)
#   ...
#   record_finish [REGEX]      # appends the kept lines from the first that matches REGEX on
#                              # (every kept line without one)
#
# UROM_BENCH_RECORD=0 runs a script without recording it.

record_start() {
    record_name=$1
    shift
    record_command="benches/$(basename "$0")${*:+ $*}"
    local var
    # The environment variables the scripts and benches read, when set.
    for var in ROUNDS OFFLOAD_MAX_CONCURRENT GPU_OFFLOAD_BIN GPU_OFFLOAD_BENCH_QUICK \
        GPU_OFFLOAD_BENCH_ORCH_CPUS UROM_RATE_PROFILE UCX_TLS UCX_NET_DEVICES UCX_DIR \
        NP SIZES COLLS IMPLS RANK_CPUS WORKER_CPUS WORKER_BUSY_POLL BIN_DIR \
        MPIRUN_ARGS BENCH_ARGS NICE VARIANTS; do
        if [ -n "${!var+x}" ]; then
            local value=${!var}
            [[ $value == *[[:space:]]* ]] && value="'$value'"
            record_command="$var=$value $record_command"
        fi
    done
    record_started=$(date -u '+%Y-%m-%d %H:%M UTC')
    record_log=""
    [ "${UROM_BENCH_RECORD:-1}" = 0 ] && return 0
    record_log=$(mktemp)
    exec 3>&1
    exec > >(tee "$record_log")
    record_tee=$!
}

record_finish() {
    [ -n "$record_log" ] || return 0
    local pattern=${1:-} root commit machine cpu
    # Give the output back to the terminal and let tee write what it holds.
    exec 1>&3 3>&-
    for _ in $(seq 100); do
        kill -0 "$record_tee" 2>/dev/null || break
        sleep 0.1
    done
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    if [ -n "${UROM_BENCH_COMMIT:-}" ]; then
        # A copy of the tree without git (a lent machine): the commit it was made from.
        commit=$UROM_BENCH_COMMIT
    else
        commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "unknown commit")
        if ! git -C "$root" diff --quiet HEAD -- . ':(exclude)benches/results' 2>/dev/null; then
            commit="$commit with uncommitted changes"
        fi
    fi
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
    machine="$(uname -n), $(nproc) CPUs${cpu:+, $cpu}"
    {
        printf '\n## %s, %s\n\n' "$record_started" "$commit"
        printf -- '- machine: %s\n' "$machine"
        printf -- '- command: `%s`\n\n' "$record_command"
        printf '```text\n'
        if [ -n "$pattern" ]; then
            awk -v p="$pattern" 'found || $0 ~ p { found = 1; print }' "$record_log"
        else
            cat "$record_log"
        fi
        printf '```\n'
    } >>"$root/benches/results/$record_name.md"
    rm -f "$record_log"
    echo "recorded in benches/results/$record_name.md"
}
