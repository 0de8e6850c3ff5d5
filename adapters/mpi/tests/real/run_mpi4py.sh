#!/usr/bin/env bash
# mpi4py (Debian python3-mpi4py) with numpy buffers under the weft PMPI
# drop-in: mpi4py_colls.py calls every intercepted collective (Allgather,
# Bcast, Barrier, Allreduce SUM/PROD/MIN/MAX on int32/int64/float32/float64
# and in place, Reduce, Reduce_scatter_block, Alltoall, Gather, Scatter) on
# COMM_WORLD and on a Split sub-communicator, and checks every result exactly.
#
# At np 2 and 4: once as installed, once with libweft_mpi.so preloaded. Both
# must exit 0 with "0 failed"; the preloaded run's stats must show weft
# serving all nine collectives on every rank.
#
# Usage: run_mpi4py.sh /path/to/libweft_mpi.so [mpirun]   (77: skipped)
set -uo pipefail
. "$(dirname "$0")/common.sh"
real_init mpi4py "$@"
need_package python3-mpi4py

PY=/usr/bin/python3
if ! "$PY" -c 'import numpy' 2>/dev/null; then
    echo "SKIP: mpi4py: numpy is not importable by $PY (Debian python3-numpy)"
    exit $SKIP
fi
# The drop-in is built against this machine's Open MPI; an mpi4py built
# for another MPI (Debian's default MPI differs on some architectures)
# would not be using the library it interposes.
lib=$("$PY" -c 'from mpi4py import MPI; print(MPI.Get_library_version().replace("\0", "").splitlines()[0])' 2>&1)
case $lib in
*"Open MPI"*) echo "mpi4py: MPI library: $lib" ;;
*)
    echo "SKIP: mpi4py: this mpi4py is not built on Open MPI ($lib)"
    exit $SKIP
    ;;
esac

cd "$REAL_WORK" || exit 1
for np in 2 4; do
    for mode in plain weft; do
        log=$REAL_WORK/np$np.$mode.log
        if ! run_mpi "$log" "$np" "$mode" "$PY" "$REAL_DIR/mpi4py_colls.py"; then
            show_log "$log"
            real_fail "np $np $mode: mpirun failed"
            continue
        fi
        verdict=$(grep '^mpi4py_colls: ' "$log" | grep -v MISMATCH)
        echo "  $verdict"
        if ! echo "$verdict" | grep -qE "^mpi4py_colls: $np ranks, [0-9]+ checks, 0 failed"; then
            show_log "$log"
            real_fail "np $np $mode: the script's summary is not '$np ranks, N checks, 0 failed'"
        fi
        if [ "$mode" = weft ]; then
            check_stats "$log" "$np" allgather bcast barrier allreduce reduce reduce_scatter_block alltoall \
                gather scatter
        fi
    done
done
real_finish
