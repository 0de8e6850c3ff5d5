#!/usr/bin/env bash
# The BLACS tester xCbtest (Debian scalapack-mpi-test, Open MPI build) under
# the weft PMPI drop-in. The tester runs BLACS point-to-point (SDRV),
# broadcast (BSBR) and combine (COMB: sum, max, min) tests for integer,
# real, double, complex and double complex matrices of several shapes, on
# process grids whose row and column scopes are MPI sub-communicators, and
# checks every result itself. BLACS broadcasts with MPI_Bcast of derived
# datatypes (vector/indexed: the trapezoids and strided submatrices), and
# combines with MPI_Allreduce/MPI_Reduce, mostly with its own MPI_Op_create
# ops (which the drop-in leaves to MPI) and some with MPI_SUM/MAX/MIN on
# predefined types (which weft serves).
#
# At np 2 and 4: once as installed, once with libweft_mpi.so preloaded.
# Each run must exit 0, print "THERE WERE NO FAILURES IN THIS TEST RUN",
# with 0 FAILED on every summary line, and the same summary lines (tests,
# passed, skipped) in both runs. The preloaded runs' stats must show weft
# serving bcast, allreduce and reduce on every rank.
#
# Inputs (the tester reads them from its current directory):
#   blacs/bt.dat       which tests: SDRV, BSBR, COMB; AUX off, because the
#                      auxiliary tests end by calling BLACS_ABORT (exit code
#                      non-zero, MPI_Finalize never reached, so no verdict
#                      and no stats); 5 precisions, verbosity 0.
#   np 4: the package's own sdrv.dat, bsbr.dat, comb.dat (grids up to 8
#         processes; those larger than 4 are skipped by the tester).
#   np 2: blacs/np2/*.dat, the same tests on 2x1 and 1x2 grids (the
#         package's first grid is 2x2, which the tester cannot skip at np 2).
#
# Usage: run_blacs.sh /path/to/libweft_mpi.so [mpirun]   (77: skipped)
set -uo pipefail
. "$(dirname "$0")/common.sh"
real_init blacs "$@"
need_package scalapack-mpi-test
BT=$(package_file scalapack-mpi-test '/openmpi-tests/xCbtest') || exit $?
PKG_DAT=$(dirname "$BT")/BLACS

# summary LOG: the tester's per-type lines, e.g.
# "DOUBLE PRECISION BSBR TESTS: 3600 TESTS; 2400 PASSED, 1200 SKIPPED,    0 FAILED."
summary() {
    grep -E '^[A-Z ]+ TESTS: +[0-9]+ TESTS;' "$1" | tr -s ' '
}

for np in 2 4; do
    for mode in plain weft; do
        dir=$REAL_WORK/np$np.$mode
        mkdir -p "$dir"
        if [ "$np" -eq 2 ]; then
            cp "$REAL_DIR"/blacs/np2/sdrv.dat "$REAL_DIR"/blacs/np2/bsbr.dat "$REAL_DIR"/blacs/np2/comb.dat "$dir"/
        else
            cp -L "$PKG_DAT"/sdrv.dat "$PKG_DAT"/bsbr.dat "$PKG_DAT"/comb.dat "$dir"/
        fi
        cp "$REAL_DIR"/blacs/bt.dat "$dir"/
        log=$dir/log
        (cd "$dir" && run_mpi "$log" "$np" "$mode" "$BT")
        rc=$?
        if [ $rc -ne 0 ]; then
            show_log "$log"
            real_fail "np $np $mode: mpirun failed"
            continue
        fi
        summary "$log" >"$dir/summary"
        lines=$(wc -l <"$dir/summary")
        awk '{for (i = 1; i <= NF; i++) if ($i ~ /^TESTS;$/) t += $(i-1); else if ($i ~ /^PASSED,$/) p += $(i-1);
                else if ($i ~ /^SKIPPED,$/) s += $(i-1); else if ($i ~ /^FAILED\.$/) f += $(i-1)}
             END {printf "  %d summary lines: %d tests, %d passed, %d skipped, %d failed\n", NR, t, p, s, f}' "$dir/summary"
        if [ "$lines" -lt 15 ]; then
            show_log "$log"
            real_fail "np $np $mode: $lines summary lines (expected SDRV, BSBR, SUM, AMX, AMN for 5 types)"
        fi
        if grep -vqE ' 0 FAILED\.$' "$dir/summary" || ! grep -q 'THERE WERE NO FAILURES IN THIS TEST RUN' "$log"; then
            grep -vE ' 0 FAILED\.$' "$dir/summary" | head -n 10 >&2
            show_log "$log"
            real_fail "np $np $mode: the BLACS tester reports failures"
        else
            echo "  THERE WERE NO FAILURES IN THIS TEST RUN"
        fi
        if [ "$mode" = weft ]; then
            if ! diff "$REAL_WORK/np$np.plain/summary" "$dir/summary" >"$dir/diff" 2>&1; then
                head -n 20 "$dir/diff" >&2
                real_fail "np $np: the tester's summary differs between the plain and the preloaded run"
            else
                echo "  same summary lines as the plain run"
            fi
            check_stats "$log" "$np" bcast allreduce reduce
        fi
    done
done
real_finish
