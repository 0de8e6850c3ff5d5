# bundle-env.sh: sourced (bash) by scripts/gpu-bundle and scripts/validate-gpu
# --bundle. Unpacks the bundle's Debian 12 .debs into a prefix and points the
# environment at it, so one definition serves the check made when the
# bundle is built and the run on the GPU machine.
#
#   bundle_unpack DEBDIR PREFIX   every DEBDIR/*.deb into PREFIX (dpkg-deb -x,
#                                 else ar + tar), then the links the packages'
#                                 maintainer scripts would have made
#   bundle_libpath PREFIX         prints the prefix's library folders, ':'-joined
#   bundle_env PREFIX             exports PATH, LD_LIBRARY_PATH, OPAL_PREFIX,
#                                 PMIX_*, PKG_CONFIG_*, GTest_DIR, CPATH, OMPI_* and sets
#                                 bundle_mpicc, bundle_mpicxx, bundle_mpirun,
#                                 bundle_mpi_home, bundle_pkg_config
# Never unpack into /: the image's own files would be overwritten.

bundle_unpack() {
    local debdir=$1 prefix=$2 d n=0
    case "$prefix" in ""|/) echo "bundle_unpack: refusing prefix '$prefix'" >&2; return 2 ;; esac
    mkdir -p "$prefix" || return 1
    for d in "$debdir"/*.deb; do
        [ -f "$d" ] || continue
        if command -v dpkg-deb >/dev/null 2>&1; then
            dpkg-deb -x "$d" "$prefix" || { echo "bundle_unpack: dpkg-deb -x $d failed" >&2; return 1; }
        else
            # No dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}.
            local member
            member=$(ar t "$d" | grep '^data\.tar') || { echo "bundle_unpack: $d: no data.tar" >&2; return 1; }
            local z=-J
            case "$member" in *.gz) z=-z ;; *.zst) z=--zstd ;; *.tar) z="" ;; esac
            ar p "$d" "$member" | tar -x ${z:+"$z"} -C "$prefix" -f - ||
                { echo "bundle_unpack: cannot unpack $d" >&2; return 1; }
        fi
        n=$((n + 1))
    done
    [ "$n" -gt 0 ] || { echo "bundle_unpack: no .deb in $debdir" >&2; return 1; }
    # update-alternatives links the postinst scripts make (dpkg -x runs none):
    # libfabric and Open MPI's psm components need libpsm_infinipath.so.1.
    local psm
    psm=$(find "$prefix/usr/lib/libpsm1" -name 'libpsm_infinipath.so.1.*' 2>/dev/null | head -n 1)
    if [ -n "$psm" ]; then
        ln -sf "../libpsm1/$(basename "$psm")" "$prefix/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"
    fi
    return 0
}

bundle_libpath() {
    find "$1" \( -name '*.so' -o -name '*.so.*' \) -printf '%h\n' 2>/dev/null | sort -u | paste -sd:
}

# shellcheck disable=SC2034  # bundle_* are read by the scripts that source this file
bundle_env() {
    local p=$1 lp
    lp=$(bundle_libpath "$p")
    export PATH="$p/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$lp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # Open MPI finds its components, help files and wrapper data under
    # OPAL_PREFIX instead of the /usr it was built for.
    export OPAL_PREFIX="$p/usr"
    # Debian's PMIx (used by Open MPI) lives in its own prefix: its components
    # (else "help-pcompress.txt: No such file" from every mpirun) and help files.
    export PMIX_INSTALL_PREFIX="$p/usr/lib/x86_64-linux-gnu/pmix2"
    export PMIX_MCA_mca_base_component_path="$p/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix"
    # pkgconf: only the prefix's .pc files, their paths rewritten into it.
    export PKG_CONFIG_SYSROOT_DIR="$p"
    export PKG_CONFIG_LIBDIR="$p/usr/lib/x86_64-linux-gnu/pkgconfig:$p/usr/share/pkgconfig"
    unset PKG_CONFIG_PATH
    export GTest_DIR="$p/usr/lib/x86_64-linux-gnu/cmake/GTest"
    # Debian puts arch-specific headers (hwloc/autogen/config.h) in the
    # multiarch folder the system compiler searches by itself; the prefix's
    # copy of it is searched through CPATH (gcc, and nvcc's host compiler).
    export CPATH="$p/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    bundle_mpicc="$p/usr/bin/mpicc.openmpi"
    bundle_mpicxx="$p/usr/bin/mpicxx.openmpi"
    bundle_mpirun="$p/usr/bin/mpirun.openmpi"
    bundle_mpi_home="$p/usr/lib/x86_64-linux-gnu/openmpi"
    bundle_pkg_config="$p/usr/bin/pkgconf"
}
