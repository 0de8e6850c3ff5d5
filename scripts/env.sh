# Sourced by scripts/bench and scripts/test: the environment every mpirun of
# this repository needs on a single machine.

# Open MPI refuses to start as root unless told twice; CI machines run as root.
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# One host: keep Open MPI's own TCP (daemon wire-up, and the btl tcp used for
# the MPI side of TCP comparisons) on loopback, so it never waits on a
# firewalled or down interface. The multi-host test overrides both.
export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
export OMPI_MCA_oob_tcp_if_include=${OMPI_MCA_oob_tcp_if_include:-lo}
# The ob1 PML, named: it is the one Open MPI picks here anyway (Debian's
# openmpi-mca-params.conf leaves out ucx; cm finds no MTL), but left to
# choose, every rank first opens cm and its MTLs, and the psm MTL's library
# takes ~0.2 s looking for its hardware: mpirun -np 2 of MPI_Init +
# MPI_Barrier took 0.33 s, 0.13 s with ob1 named (np 4: 0.40 -> 0.20, np 8:
# 0.51 -> 0.28; 2026-12-02). The test suites start ~1200 mpiruns.
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export GTEST_COLOR=no

# quiet CMD...: runs CMD with its output kept in a log that is shown only if
# CMD fails, so a build error is never hidden.
quiet() {
    local log rc=0
    log=$(mktemp /tmp/weft-quiet.XXXXXX)
    "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        cat "$log" >&2
        echo "failed ($rc): $*" >&2
    fi
    rm -f "$log"
    return "$rc"
}
