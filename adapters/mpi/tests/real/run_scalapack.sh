#!/usr/bin/env bash
# ScaLAPACK's own testers (Debian scalapack-mpi-test, Open MPI build) under
# the weft PMPI drop-in: LU, Cholesky, QR, least squares, inverse and the
# reductions to Hessenberg and tridiagonal form, in the four precisions
# where it matters, each on the package's input files (several matrix
# sizes, block sizes and process grids up to 2x2, 1x4 and 4x1; grids larger
# than 4 processes are skipped by the testers). The testers factor, solve,
# estimate condition numbers and refine iteratively, with BLACS broadcasts
# and combines on the grid's row, column and all scopes (MPI_Bcast,
# MPI_Allreduce, MPI_Reduce on sub-communicators), and check every residual
# themselves.
#
# At np 4, each tester three times: as installed (plain), preloaded with
# the default thresholds (weftdef: the drop-in as a user runs it) and
# preloaded with every call of size > 0 served by weft (weft:
# WEFT_MPI_MIN_BYTES=0). Each run must exit 0 with no failed residual
# check, the same summary (tests passed, failed, skipped) as the plain
# run, and, in the weft run, weft serving bcast and allreduce on every rank.
#
# Every run, plain included, preloads scalapack/lacon_est.c: the upstream
# fix of ScaLAPACK 2.2.1's P?LACON reading an uninitialised value (that
# file says what and why). Without it the condition estimates branch on
# stack garbage: xsllt and xdllt hang under plain Open MPI, and xslu fails
# under the drop-in, whose stack differs.
#
# SCALAPACK_TESTERS="xslu xdllt ..." runs others (REAL_KEEP=1 keeps their
# output); SCALAPACK_TESTERS=all runs every tester of the package except
#   x?syevr, x?heevr  the long eigensolver ones (10 s each alone),
#   x?hseqr, x?svd    they print no "N tests completed ..." lines (their
#                     verdicts are per-line PASSED/FAILED tables),
#   xdsep             it fails one of its own residual checks (1 of 108)
#                     under plain Open MPI, without any preload.
# (All of the others passed with the same summaries in all three modes,
# docs/mpi.md.)
#
# Usage: run_scalapack.sh /path/to/libweft_mpi.so [mpirun]   (77: skipped)
set -uo pipefail
. "$(dirname "$0")/common.sh"
real_init scalapack "$@"
need_package scalapack-mpi-test
XSLU=$(package_file scalapack-mpi-test '/openmpi-tests/xslu') || exit $?
BIN=$(dirname "$XSLU")
# The input files: the package's (beside the testers, or in
# /usr/share/scalapack, where scalapack-test-common puts them).
DAT=$BIN
[ -f "$DAT/LU.dat" ] || DAT=/usr/share/scalapack
if [ ! -f "$DAT/LU.dat" ]; then
    echo "SKIP: scalapack: the testers' input files (LU.dat, ...) are not installed (scalapack-test-common)"
    exit $SKIP
fi

# The fix of P?LACON, built for this run (not a weft library: the plain run
# preloads it too, and it must not carry a sanitizer runtime).
CC=${CC:-cc}
if ! "$CC" -shared -fPIC -O1 -Wall -Wextra -Werror -o "$REAL_WORK/lacon_est.so" \
        "$REAL_DIR/scalapack/lacon_est.c" -ldl; then
    real_fail "cannot build scalapack/lacon_est.c with $CC"
    real_finish
fi
export REAL_PROGRAM_PRELOAD=$REAL_WORK/lacon_est.so

testers=${SCALAPACK_TESTERS:-"xslu xdlu xclu xzlu xdllt xzllt xsqr xzqr xdls xcinv xdhrd xstrd"}
if [ "$testers" = all ]; then
    testers=$(cd "$BIN" && ls x* | grep -vE '^x[CF]btest$|^x.(syevr|heevr|hseqr|svd)$|^xdsep$' | tr '\n' ' ')
fi

# summary LOG: the tester's verdict lines, e.g.
# "  240 tests completed and passed residual checks."
# "    0 tests completed and failed residual checks."
# "   12 tests skipped because of illegal input values."
# (the eigensolvers say "... completed and failed." and "... lack of memory.").
summary() {
    grep -E '^ *[0-9]+ tests (completed|skipped)' "$1" | tr -s ' ' | sed 's/^ //'
}

np=4
for t in $testers; do
    if [ ! -x "$BIN/$t" ]; then
        real_fail "$t: no such tester in $BIN"
        continue
    fi
    for mode in plain weftdef weft; do
        dir=$REAL_WORK/$t.$mode
        mkdir -p "$dir"
        # Each tester reads every .dat it knows from its current directory.
        cp -L "$DAT"/*.dat "$dir"/
        log=$dir/log
        (cd "$dir" && run_mpi "$log" "$np" "$mode" "$BIN/$t")
        rc=$?
        if [ $rc -ne 0 ]; then
            show_log "$log"
            real_fail "$t np $np $mode: mpirun failed (exit $rc)"
            continue
        fi
        summary "$log" >"$dir/summary"
        if ! grep -qE 'completed and passed' "$dir/summary"; then
            show_log "$log"
            real_fail "$t np $np $mode: no verdict line (\"N tests completed and passed residual checks\")"
            continue
        fi
        if grep -qE '^[1-9][0-9]* tests completed and failed' "$dir/summary" || grep -q 'had an illegal value' "$log"; then
            grep -E 'failed|illegal value' "$dir/summary" "$log" | head -n 10 >&2
            show_log "$log"
            real_fail "$t np $np $mode: the tester reports failures"
            continue
        fi
        echo "  $(tr '\n' ';' <"$dir/summary")"
        if [ "$mode" != plain ]; then
            if ! diff "$REAL_WORK/$t.plain/summary" "$dir/summary" >"$dir/diff" 2>&1; then
                cat "$dir/diff" >&2
                real_fail "$t np $np $mode: the tester's summary differs from the plain run's"
            fi
        fi
        if [ "$mode" = weft ]; then
            check_stats "$log" "$np" bcast allreduce
        fi
    done
done
real_finish
