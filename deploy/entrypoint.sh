#!/bin/sh
# The urom service container's entry point.
#
#   entrypoint.sh [EXTRA DAEMON OPTIONS...]   run the daemon (the default)
#   entrypoint.sh status                      exit 0 when the daemon answers (readiness probe)
#   entrypoint.sh install-plugins             copy the bundled plugins into empty plugin dirs
#
# The daemon runs with SERVICE_ARGS (split at blanks, as the service guide's pod sets them,
# e.g. "-l 60 -m 4096") and UROM_PLUGIN_PATH (directories separated by ';') from the
# environment, logs to $UROM_LOG_DIR (urom_daemon_dev.log, urom_worker_<pid>_dev.log) and to
# the container's output, and listens on $UROM_SOCKET. It replaces this shell, so SIGTERM
# reaches it directly: it stops every worker and exits 0.
#
# Settings (environment), with their defaults:
#   UROM_BIN_DIR           /opt/urom/bin            urom-daemon, urom-worker, urom-ctl
#   UROM_LOG_DIR           /var/log/doca/urom
#   UROM_SOCKET            /run/urom/urom.sock
#   UROM_BUNDLED_PLUGINS   /opt/urom/plugins        <name>/<name>.so for install-plugins
set -eu

bin_dir=${UROM_BIN_DIR:-/opt/urom/bin}
log_dir=${UROM_LOG_DIR:-/var/log/doca/urom}
socket=${UROM_SOCKET:-/run/urom/urom.sock}
bundled=${UROM_BUNDLED_PLUGINS:-/opt/urom/plugins}
service_args=${SERVICE_ARGS:-}

say() {
    printf 'urom-entrypoint: %s\n' "$*" >&2
}

# The value of -m / --max-msg-size in SERVICE_ARGS, or the default.
max_msg_size() {
    size=4096
    # Word splitting is wanted: SERVICE_ARGS is a command line.
    # shellcheck disable=SC2086
    set -f
    set -- $service_args
    set +f
    while [ $# -gt 0 ]; do
        case $1 in
            -m | --max-msg-size)
                [ $# -gt 1 ] && size=$2 && shift
                ;;
            --max-msg-size=*) size=${1#--max-msg-size=} ;;
            -m?*) size=${1#-m} ;;
        esac
        shift
    done
    printf '%s\n' "$size"
}

# Each directory of UROM_PLUGIN_PATH, one per line.
plugin_dirs() {
    printf '%s\n' "${UROM_PLUGIN_PATH:-}" | tr ';' '\n' | sed -e '/^$/d' -e 's:/*$::'
}

case ${1:-} in
    status)
        exec "$bin_dir/urom-ctl" --socket "$socket" -m "$(max_msg_size)" status
        ;;
    install-plugins)
        plugin_dirs | while IFS= read -r dir; do
            name=$(basename "$dir")
            if [ ! -d "$bundled/$name" ]; then
                say "$dir: no bundled plugin named $name; left as it is"
                continue
            fi
            mkdir -p "$dir"
            if ls "$dir"/*.so >/dev/null 2>&1; then
                say "$dir already holds plugins; left as it is"
                continue
            fi
            cp "$bundled/$name"/*.so "$dir"/
            say "$dir: installed $(cd "$bundled/$name" && echo *.so)"
        done
        exit 0
        ;;
esac

if [ -z "${UROM_PLUGIN_PATH:-}" ]; then
    say "UROM_PLUGIN_PATH is not set: the daemon will offer no plugins"
else
    plugin_dirs | while IFS= read -r dir; do
        if [ ! -d "$dir" ]; then
            say "plugin directory $dir does not exist (is its volume mounted?)"
        elif ! ls "$dir"/*.so >/dev/null 2>&1; then
            say "plugin directory $dir holds no .so file"
        fi
    done
fi
mkdir -p "$log_dir" "$(dirname "$socket")"
say "starting urom-daemon $service_args (plugins: ${UROM_PLUGIN_PATH:-none}; logs in $log_dir)"
# shellcheck disable=SC2086
set -f
exec "$bin_dir/urom-daemon" $service_args --log-dir "$log_dir" --log-stderr --listen "$socket" \
    --worker-bin "$bin_dir/urom-worker" "$@"
