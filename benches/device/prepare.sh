#!/bin/bash
# Prepares the collective benchmark for a machine that has neither cargo nor Open MPI (a lent
# 16-core machine, say), here, on a Debian 12 machine with cargo, Open MPI's development files
# and apt: everything the run needs goes into .device/ (ignored by git), which travels with the
# working tree and benches/device/coll-device.sh runs from.
#
#   .device/bin    release binaries: urom-coll-bench, urom-coll-report, urom-daemon, urom-worker,
#                  libworker_coll.so, liburom_mpi.so and liburom_coll.so (the MPI part,
#                  benches/run-mpi-bench.sh) (debug information stripped)
#   .device/root   Open MPI 4.1 (openmpi-bin, libopenmpi3, openmpi-common) and every shared
#                  library it and our binaries need beyond glibc, libgcc and libstdc++, each
#                  package fetched with `apt-get download` and unpacked with `dpkg -x`; docs,
#                  manuals, headers, static and Fortran libraries left out
#   .device/env.sh sourced by the device script: PATH, LD_LIBRARY_PATH, OPAL_PREFIX and the
#                  other relocation variables, all relative to where the tree lies
#
# Then it checks, here, that the bundle works relocated: in a private mount namespace where the
# system's Open MPI, PMIx, libevent, hwloc, UCX, libfabric... and ssh are hidden, mpirun from the
# bundle starts 2 ranks of urom-coll-bench (--impl openmpi, one small allreduce), and every ELF
# file of the bundle resolves all its libraries inside it (or from glibc / libgcc / libstdc++).
#
# usage: benches/device/prepare.sh [--check [COMMAND...]]
#   --check: only the check of an existing bundle, then COMMAND in the same namespace (e.g.
#   OUT=/tmp/x ROUNDS=1 NP=2 ... benches/device/coll-device.sh, as the device runs it)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
dev=$repo/.device
root=$dev/root
multiarch=x86_64-linux-gnu

# The check alone (benches/device/prepare.sh --check): in a private mount namespace (root), the
# system's Open MPI and the libraries the bundle carries are hidden, and so are ssh and rsh.
check() {
    [ -f "$dev/env.sh" ] || { echo "prepare: no bundle in $dev: run benches/device/prepare.sh" >&2; exit 1; }
    unshare -m --propagation private env DEV="$dev" ROOT="$root" MA="$multiarch" bash -euo pipefail -c '
        for d in /usr/lib/$MA/openmpi /usr/lib/$MA/pmix2 /usr/share/openmpi /etc/openmpi \
            /usr/lib/$MA/libfabric /usr/lib/$MA/ucx /usr/lib/$MA/hwloc; do
            [ -d "$d" ] && mount -t tmpfs none "$d"
        done
        hidden=0
        while read -r name; do
            for d in /usr/lib/$MA /lib/$MA; do
                if [ -e "$d/$name" ]; then
                    mount --bind /dev/null "$d/$name" && hidden=$((hidden + 1))
                fi
            done
        done < <(find "$ROOT" -name "*.so*" \( -type f -o -type l \) -printf "%f\n" | sort -u)
        for b in mpirun mpiexec orterun orted ssh rsh; do
            p=$(command -v "$b" || true)
            [ -n "$p" ] && [ -f "$p" ] && mount --bind /dev/null "$p"
        done
        echo "hidden: the system Open MPI, PMIx, UCX, libfabric, hwloc plugins, ssh, and $hidden libraries"
        DEVICE_DIR=$DEV
        . "$DEV/env.sh"
        bad=0
        while IFS= read -r -d "" elf; do
            file -b "$elf" | grep -q "^ELF" || continue
            if out=$(ldd "$elf" 2>&1 | grep -E "not found|=> /dev/null"); then
                echo "unresolved in $elf: $out" >&2
                bad=1
            fi
        done < <(find "$ROOT" "$DEV/bin" -type f \( -name "*.so*" -o -perm -u+x \) -print0)
        [ "$bad" = 0 ] || exit 1
        echo "every ELF file of the bundle resolves its libraries"
        echo "mpirun: $(command -v mpirun)"
        log=$(mktemp)
        mpirun -np 2 --oversubscribe --allow-run-as-root --mca pml ob1 --mca btl self,vader \
            urom-coll-bench --impl openmpi --colls allreduce --sizes 8 --iters 5 \
            --budget-ms 10 --cpu-budget-ms 10 >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
        if grep -qiE "unable to open|cannot open shared|not found|warning" "$log"; then
            cat "$log" >&2
            echo "prepare: the relocated run warned" >&2
            exit 1
        fi
        grep "^# impl=openmpi" "$log" | cut -c1-100
        awk -F "\t" "\$3 == \"allreduce\"" "$log" | grep -q . || { cat "$log" >&2; exit 1; }
        rm -f "$log"
        echo "relocated mpirun and urom-coll-bench: ok"
        if [ $# -gt 0 ]; then
            echo "== in the same namespace: $*"
            "$@"
        fi
    ' check "$@"
}
if [ "${1:-}" = --check ]; then
    shift
    check "$@"
    exit 0
fi

# The bundle must never be committed: .git/info/exclude of the repository (shared by
# worktrees) names it.
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >>"$exclude"

echo "== release binaries"
cargo build --release -p urom-coll-bench --features mpi --bins
cargo build --release -p urom-daemon -p urom-worker -p urom-plugin-coll -p urom-capi-coll \
    -p urom-capi-mpi
target=${CARGO_TARGET_DIR:-target}/release
rm -rf "$dev"
mkdir -p "$dev/bin" "$dev/debs" "$root"
for f in urom-coll-bench urom-coll-report urom-daemon urom-worker libworker_coll.so \
    liburom_mpi.so liburom_coll.so; do
    cp "$target/$f" "$dev/bin/"
    strip --strip-debug "$dev/bin/$f"
done

# Packages whose libraries a bare machine with python3, cmake and gcc has anyway: glibc, libgcc,
# libstdc++ (taking them from here could even clash with the machine's newer ones).
base_pkgs=" libc6 libgcc-s1 libstdc++6 "

fetch() {
    local pkg=$1
    (cd "$dev/debs" && apt-get download "$pkg" >/dev/null 2>&1) ||
        { echo "prepare: apt-get download $pkg failed" >&2; exit 1; }
    dpkg -x "$dev/debs/${pkg}"_*.deb "$root"
    echo "  $pkg"
}

# Trims what the run never reads, so that neither the size nor the library scan counts it.
trim() {
    rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian" \
        "$root/usr/include" "$root/usr/lib/$multiarch/pkgconfig" \
        "$root/usr/lib/$multiarch/openmpi/include" "$root/usr/lib/$multiarch/openmpi/lib/pkgconfig"
    find "$root" \( -name '*.a' -o -name '*.la' -o -name '*.mod' \) -delete
    # Fortran and Java bindings: the benchmark is C (and would pull libgfortran).
    find "$root" \( -name 'libmpi_mpifh*' -o -name 'libmpi_usempi*' -o -name 'libmpi_java*' \
        -o -name 'libompitrace*' -o -name 'libompi_dbg_msgq*' -o -name 'mpif*' -o -name 'mpijava*' \) \
        -exec rm -rf {} +
    # Compiler wrappers: nothing is compiled there.
    find "$root/usr/bin" \( -name 'mpicc*' -o -name 'mpic++*' -o -name 'mpiCC*' -o -name 'mpicxx*' \
        -o -name 'mpif*' -o -name 'opal_wrapper' -o -name 'ortecc' -o -name 'oshcc' -o -name 'oshfort' \
        -o -name 'shmemcc' -o -name 'shmemfort' -o -name 'oshCC' -o -name 'oshc++' -o -name 'shmemCC' \
        -o -name 'shmemc++' -o -name 'mpijavac*' -o -name 'opalc*' -o -name 'oshcxx' \
        -o -name 'shmemcxx' \) -delete 2>/dev/null || true
}

# Library directories of the bundle, for ldd and for env.sh.
lib_dirs() {
    printf '%s:' "$root/usr/lib/$multiarch/openmpi/lib" "$root/usr/lib/$multiarch" \
        "$root/lib/$multiarch" "$root/usr/lib/$multiarch/pmix2/lib" "$root/usr/lib/$multiarch/ucx"
}

echo "== Open MPI and the libraries it needs"
declare -A have=() owner=() links=()
# The package owning library path $1 (usrmerge: /lib/... may be packaged as /usr/lib/... and
# vice versa; an alternatives link, /etc/alternatives/..., is owned through its target, and
# the link is made again in the bundle, as the package's postinst would).
owner_of() {
    local lib=$1 alt real pkg
    if [ -n "${owner[$lib]:-}" ]; then
        echo "${owner[$lib]}"
        return
    fi
    alt=${lib#/usr}
    [ "$alt" = "$lib" ] && alt=/usr$lib
    pkg=$(dpkg -S "$lib" "$alt" 2>/dev/null | head -n 1 | cut -d: -f1 || true)
    if [ -z "$pkg" ]; then
        real=$(readlink -f "$lib")
        pkg=$(dpkg -S "$real" 2>/dev/null | head -n 1 | cut -d: -f1 || true)
        [ -n "$pkg" ] && links[$lib]=$real
    fi
    owner[$lib]=$pkg
    echo "$pkg"
}
todo=(openmpi-bin libopenmpi3 openmpi-common)
while ((${#todo[@]})); do
    for pkg in "${todo[@]}"; do
        fetch "$pkg"
        have[$pkg]=1
    done
    trim
    todo=()
    # Every library an ELF file of the bundle resolves outside it: its package, unless a base
    # one or already here.
    declare -A want=()
    while IFS= read -r -d '' elf; do
        file -b "$elf" | grep -q '^ELF' || continue
        while read -r lib; do
            [ -n "$lib" ] || continue
            owner_of "$lib" >/dev/null
            pkg=${owner[$lib]}
            [ -n "$pkg" ] || { echo "prepare: no package owns $lib (needed by $elf)" >&2; exit 1; }
            [[ $base_pkgs == *" $pkg "* ]] && continue
            [ -n "${have[$pkg]:-}" ] && continue
            want[$pkg]=1
        done < <(LD_LIBRARY_PATH=$(lib_dirs) ldd "$elf" 2>/dev/null |
            awk '$2 == "=>" && $3 ~ /^\// {print $3}' | grep -v "^$root/" || true)
    done < <(find "$root" "$dev/bin" -type f \( -name '*.so*' -o -perm -u+x \) -print0)
    todo=("${!want[@]}")
    unset want
    # Alternatives links: the library's name, next to the others, pointing at the bundle's copy
    # (relative, so that the bundle can move).
    for lib in "${!links[@]}"; do
        real=${links[$lib]}
        if [ -e "$root$real" ] && [ ! -e "$root/usr/lib/$multiarch/${lib##*/}" ]; then
            mkdir -p "$root/usr/lib/$multiarch"
            ln -sr "$root$real" "$root/usr/lib/$multiarch/${lib##*/}"
        fi
    done
done

# mpirun and mpiexec are alternatives links too (openmpi-bin's postinst makes them).
ln -sf orterun "$root/usr/bin/mpirun"
ln -sf orterun "$root/usr/bin/mpiexec"

commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- . ':(exclude)benches/results' || commit="$commit with uncommitted changes"
echo "$commit" >"$dev/commit"

cat >"$dev/env.sh" <<'EOF'
# Sourced by benches/device/coll-device.sh: the bundle's Open MPI, relocated to wherever the
# tree lies. Needs DEVICE_DIR (the .device folder).
root=$DEVICE_DIR/root
ma=x86_64-linux-gnu
export PATH=$DEVICE_DIR/bin:$root/usr/bin:$PATH
export LD_LIBRARY_PATH=$root/usr/lib/$ma/openmpi/lib:$root/usr/lib/$ma:$root/lib/$ma:$root/usr/lib/$ma/pmix2/lib:$root/usr/lib/$ma/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPAL_PREFIX=$root/usr
export OPAL_SYSCONFDIR=$root/etc/openmpi
export OPAL_PKGDATADIR=$root/usr/share/openmpi
export PMIX_INSTALL_PREFIX=$root/usr/lib/$ma/pmix2
export PMIX_MCA_mca_base_component_path=$root/usr/lib/$ma/pmix2/lib/pmix
# One node, no ssh: mpirun starts the ranks itself.
export OMPI_MCA_plm=isolated
export OMPI_MCA_plm_rsh_agent=
unset root ma
EOF

echo "== size"
du -sh "$dev/bin" "$root"
rm -rf "$dev/debs"
du -sh "$dev"

echo "== check: relocated, with the system's copies hidden"
check
