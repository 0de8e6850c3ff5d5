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
