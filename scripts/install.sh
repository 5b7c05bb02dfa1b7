#!/usr/bin/env bash
# Installs urom into a prefix, as a DOCA UROM installation is laid out for C programs:
#
#   bin/                     urom-daemon, urom-worker, urom-ctl
#   lib/                     libdoca_urom, libdoca_common, liburom_coll, liburom_mpi
#                            (lib<name>.so.<version>, lib<name>.so.<major> and lib<name>.so links),
#                            libdoca_argp.so (a linker script: DOCA's argument parser is part of
#                            libdoca_common here)
#   lib/urom/plugins/        worker_graph.so, worker_sandbox.so, worker_coll.so
#   lib/pkgconfig/           doca-urom.pc, doca-common.pc, doca-argp.pc, urom.pc, urom-plugin.pc
#   include/                 the DOCA-named host headers (doca_urom.h, doca_pe.h, ...,
#                            doca_version.h) and urom_coll.h
#   include/urom/plugin/     the headers for C plugins (doca_urom_plugin.h, the plugins' doca_log.h)
#   share/urom/install-manifest.txt   every file installed, for --uninstall
#
#   scripts/install.sh [--prefix DIR] [--libdir DIR] [--destdir DIR] [--features LIST]
#                      [--from DIR] [--uninstall]
#
# --prefix defaults to /usr/local; DESTDIR (or --destdir) stages the files under another root
# for packagers, paths inside the files still naming the prefix. The script builds the release
# profile with cargo first (CARGO_TARGET_DIR is honoured; --features is passed to cargo, e.g.
# ucx builds the daemon, the worker and the sandbox and coll plugins with UCX); --from DIR
# installs what is already built in the profile directory DIR instead, without building.
# --uninstall removes every file the manifest of that prefix lists, then the directories urom
# made that are left empty.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=/usr/local
LIBDIR=""
DESTDIR=${DESTDIR:-}
FEATURES=""
FROM=""
MODE=install

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    exit "${1:-0}"
}

while (($#)); do
    case "$1" in
        --prefix) PREFIX=$2; shift 2 ;;
        --prefix=*) PREFIX=${1#*=}; shift ;;
        --libdir) LIBDIR=$2; shift 2 ;;
        --libdir=*) LIBDIR=${1#*=}; shift ;;
        --destdir) DESTDIR=$2; shift 2 ;;
        --destdir=*) DESTDIR=${1#*=}; shift ;;
        --features) FEATURES=$2; shift 2 ;;
        --features=*) FEATURES=${1#*=}; shift ;;
        --from) FROM=$2; shift 2 ;;
        --from=*) FROM=${1#*=}; shift ;;
        --uninstall) MODE=uninstall; shift ;;
        -h | --help) usage 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

case "$PREFIX" in
    /*) ;;
    *) echo "install.sh: --prefix must be an absolute path, not $PREFIX" >&2; exit 2 ;;
esac
PREFIX=${PREFIX%/}
[ -n "$PREFIX" ] || PREFIX=/
LIBDIR=${LIBDIR:-$PREFIX/lib}
BINDIR=$PREFIX/bin
INCLUDEDIR=$PREFIX/include
PLUGINDIR=$LIBDIR/urom/plugins
PKGCONFIGDIR=$LIBDIR/pkgconfig
DATADIR=$PREFIX/share/urom
MANIFEST=$DATADIR/install-manifest.txt

if [ "$MODE" = uninstall ]; then
    if [ ! -f "$DESTDIR$MANIFEST" ]; then
        echo "install.sh: no urom installation in $DESTDIR$PREFIX ($MANIFEST is missing)" >&2
        exit 1
    fi
    while IFS= read -r path; do
        [ -n "$path" ] && rm -f -- "$DESTDIR$path"
    done <"$DESTDIR$MANIFEST"
    rm -f -- "$DESTDIR$MANIFEST"
    # Only the directories that are urom's own.
    for dir in "$INCLUDEDIR/urom/plugin" "$INCLUDEDIR/urom" "$PLUGINDIR" "$LIBDIR/urom" "$DATADIR"; do
        rmdir -- "$DESTDIR$dir" 2>/dev/null || true
    done
    echo "urom removed from $DESTDIR$PREFIX"
    exit 0
fi

# The workspace's version: the libraries' file names, urom.pc.
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")
MAJOR=${VERSION%%.*}
# The DOCA release whose API urom implements (doca_version.h): the doca-*.pc files' version.
DOCA_VERSION=$(sed -n 's/^#define DOCA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' \
    "$ROOT/urom-capi/include/doca_version.h" | paste -sd.)

LIBRARIES=(doca_common doca_urom urom_coll urom_mpi)
PROGRAMS=(urom-daemon urom-worker urom-ctl)
PLUGINS=(worker_graph worker_sandbox worker_coll)
PACKAGES=(urom-capi-common urom-capi-urom urom-capi-coll urom-capi-mpi urom-daemon urom-worker
    urom-ctl urom-plugin-graph urom-plugin-sandbox urom-plugin-coll)

if [ -z "$FROM" ]; then
    args=(build --release --locked)
    for package in "${PACKAGES[@]}"; do
        args+=(-p "$package")
    done
    [ -z "$FEATURES" ] || args+=(--features "$FEATURES")
    (cd "$ROOT" && "${CARGO:-cargo}" "${args[@]}")
    target=${CARGO_TARGET_DIR:-$ROOT/target}
    FROM=$target/release
fi
for artifact in "${LIBRARIES[@]/#/lib}" "${PLUGINS[@]/#/lib}"; do
    [ -f "$FROM/$artifact.so" ] || { echo "install.sh: $FROM/$artifact.so is not built" >&2; exit 1; }
done
for program in "${PROGRAMS[@]}"; do
    [ -f "$FROM/$program" ] || { echo "install.sh: $FROM/$program is not built" >&2; exit 1; }
done

# A fresh manifest, then every file as it goes in (paths without DESTDIR).
mkdir -p "$DESTDIR$DATADIR"
: >"$DESTDIR$MANIFEST.partial"
record() { printf '%s\n' "$1" >>"$DESTDIR$MANIFEST.partial"; }
put() { # put MODE SOURCE DEST
    install -D -m "$1" "$2" "$DESTDIR$3"
    record "$3"
}
link() { # link TARGET NAME (in the directory of NAME)
    mkdir -p "$(dirname "$DESTDIR$2")"
    ln -sfn "$1" "$DESTDIR$2"
    record "$2"
}
write() { # write DEST (text on stdin)
    mkdir -p "$(dirname "$DESTDIR$1")"
    cat >"$DESTDIR$1"
    chmod 644 "$DESTDIR$1"
    record "$1"
}

for program in "${PROGRAMS[@]}"; do
    put 755 "$FROM/$program" "$BINDIR/$program"
done
for library in "${LIBRARIES[@]}"; do
    put 755 "$FROM/lib$library.so" "$LIBDIR/lib$library.so.$VERSION"
    link "lib$library.so.$VERSION" "$LIBDIR/lib$library.so.$MAJOR"
    link "lib$library.so.$MAJOR" "$LIBDIR/lib$library.so"
done
write "$LIBDIR/libdoca_argp.so" <<EOF
/* GNU ld script: DOCA's argument parser (doca_argp_*) is part of libdoca_common in urom, so
   programs that link -ldoca_argp link libdoca_common. */
INPUT($LIBDIR/libdoca_common.so.$MAJOR)
EOF
for plugin in "${PLUGINS[@]}"; do
    put 755 "$FROM/lib$plugin.so" "$PLUGINDIR/$plugin.so"
done

# Host headers: urom-capi/include, with the real headers the plugins share in place of the
# forwarding ones there; urom_coll.h. Plugin headers: plugins/include, on their own.
shared=(doca_error.h doca_compat.h doca_urom_plugin.h)
for header in "$ROOT"/urom-capi/include/*.h; do
    name=$(basename "$header")
    case " ${shared[*]} " in
        *" $name "*) put 644 "$ROOT/plugins/include/$name" "$INCLUDEDIR/$name" ;;
        *) put 644 "$header" "$INCLUDEDIR/$name" ;;
    esac
done
put 644 "$ROOT/urom-capi/coll/include/urom_coll.h" "$INCLUDEDIR/urom_coll.h"
for header in "$ROOT"/plugins/include/*.h; do
    put 644 "$header" "$INCLUDEDIR/urom/plugin/$(basename "$header")"
done

# pkg-config files. The doca-* ones carry the DOCA version urom implements, urom's its own.
pc_head() {
    cat <<EOF
prefix=$PREFIX
exec_prefix=\${prefix}
libdir=$LIBDIR
includedir=\${prefix}/include
plugindir=$PLUGINDIR

EOF
}
{
    pc_head
    cat <<EOF
Name: doca-common
Description: urom's libdoca_common: DOCA progress engines, contexts, tasks, buffers, devices, logging, argument parsing
URL: https://github.com/urom-rs/urom
Version: $DOCA_VERSION
Libs: -L\${libdir} -ldoca_common
Cflags: -I\${includedir}
EOF
} | write "$PKGCONFIGDIR/doca-common.pc"
{
    pc_head
    cat <<EOF
Name: doca-urom
Description: urom's libdoca_urom: the DOCA UROM host API (services, workers, tasks, domains)
URL: https://github.com/urom-rs/urom
Version: $DOCA_VERSION
Requires: doca-common
Libs: -L\${libdir} -ldoca_urom
Cflags: -I\${includedir}
EOF
} | write "$PKGCONFIGDIR/doca-urom.pc"
{
    pc_head
    cat <<EOF
Name: doca-argp
Description: DOCA's argument parser (doca_argp_*), part of urom's libdoca_common
URL: https://github.com/urom-rs/urom
Version: $DOCA_VERSION
Requires: doca-common
Libs: -L\${libdir} -ldoca_argp
Cflags: -I\${includedir}
EOF
} | write "$PKGCONFIGDIR/doca-argp.pc"
{
    pc_head
    cat <<EOF
Name: urom
Description: urom's collective offload from C (urom_coll.h, liburom_coll)
URL: https://github.com/urom-rs/urom
Version: $VERSION
Libs: -L\${libdir} -lurom_coll
Cflags: -I\${includedir}
EOF
} | write "$PKGCONFIGDIR/urom.pc"
{
    pc_head
    cat <<EOF
Name: urom-plugin
Description: headers for urom worker plugins in C (doca_urom_plugin.h, doca_log.h); no library
URL: https://github.com/urom-rs/urom
Version: $VERSION
Cflags: -I\${includedir}/urom/plugin
EOF
} | write "$PKGCONFIGDIR/urom-plugin.pc"

record "$MANIFEST"
mv -f "$DESTDIR$MANIFEST.partial" "$DESTDIR$MANIFEST"

cat <<EOF
urom $VERSION installed in $DESTDIR$PREFIX
  build:   cc my_host.c \$(pkg-config --cflags --libs doca-urom)
  plugins: $PLUGINDIR (urom-daemon looks there when UROM_PLUGIN_PATH is unset)
  remove:  $0 --uninstall --prefix $PREFIX${DESTDIR:+ --destdir $DESTDIR}
EOF
case ":${PKG_CONFIG_PATH:-}:" in
    *":$PKGCONFIGDIR:"*) ;;
    *) pkg-config --variable pc_path pkg-config 2>/dev/null | tr ':' '\n' | grep -qx "$PKGCONFIGDIR" ||
        echo "  (pkg-config does not search $PKGCONFIGDIR: export PKG_CONFIG_PATH=$PKGCONFIGDIR)" ;;
esac
