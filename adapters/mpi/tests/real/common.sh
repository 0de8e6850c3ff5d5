# shellcheck shell=bash
# Sourced by run_netpipe.sh, run_blacs.sh, run_mpi4py.sh: each runs a real
# MPI program (a Debian package, not built here, unmodified) twice per rank
# count -- as installed, then with libweft_mpi.so preloaded -- and checks the
# program's own verdict in both runs and, from the WEFT_MPI_STATS lines, that
# the preloaded run's collectives really went through weft.
#
# Usage of every script: run_X.sh /path/to/libweft_mpi.so [mpirun]
# Exit status: 0 passed, 1 failed, 77 skipped (package not installed).
# REAL_KEEP=1 keeps the programs' output; REAL_MPIRUN_TIMEOUT (s, default
# 90) bounds each mpirun.

REAL_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$REAL_DIR/../../../.." && pwd)
SKIP=77

# real_init NAME "$@": the arguments, the environment, a scratch directory.
real_init() {
    REAL_NAME=$1
    shift
    if [ $# -lt 1 ] || [ $# -gt 2 ]; then
        echo "usage: $0 /path/to/libweft_mpi.so [mpirun]" >&2
        exit 2
    fi
    WEFT_MPI_LIB=$1
    MPIRUN=${2:-mpirun}
    # A relative path would not be found by ranks started in another directory.
    case $WEFT_MPI_LIB in /*) ;; *) WEFT_MPI_LIB=$PWD/$WEFT_MPI_LIB ;; esac
    if [ ! -f "$WEFT_MPI_LIB" ]; then
        echo "$REAL_NAME: $WEFT_MPI_LIB: no such file (build the weft_mpi target first)" >&2
        exit 1
    fi
    if ! command -v "$MPIRUN" >/dev/null 2>&1; then
        echo "$REAL_NAME: $MPIRUN: not found" >&2
        exit 1
    fi
    # Root in CI, loopback only: what every mpirun of this repository needs.
    # shellcheck source=/dev/null
    . "$REPO_DIR/scripts/env.sh"
    # 4 ranks on 2 cores: a rank waiting in MPI gives its core to the others.
    export OMPI_MCA_mpi_yield_when_idle=1
    # Nothing from the caller's environment may change how weft serves the
    # preloaded run, or make the plain run differ between machines.
    unset WEFT_MPI WEFT_MPI_COLLS WEFT_MPI_MIN_BYTES WEFT_MPI_STATS LD_PRELOAD
    # A sanitizer build (WEFT_SANITIZE) of the library needs its runtime
    # loaded first in a program that was not built with it (ASan's first).
    REAL_SANITIZER=$(ldd "$WEFT_MPI_LIB" 2>/dev/null |
        awk '$3 ~ /\/libasan\.so/ {a = a ":" $3} $3 ~ /\/lib(ubsan|tsan)\.so/ {o = o ":" $3}
             END {s = a o; print substr(s, 2)}')
    REAL_PRELOAD=${REAL_SANITIZER:+$REAL_SANITIZER:}$WEFT_MPI_LIB
    REAL_WORK=$(mktemp -d "/tmp/weft-real-$REAL_NAME.XXXXXX")
    # REAL_KEEP=1 keeps the programs' output (the directory is printed).
    if [ "${REAL_KEEP:-0}" = 1 ]; then
        echo "$REAL_NAME: output kept in $REAL_WORK"
    else
        trap 'rm -rf "$REAL_WORK"' EXIT
    fi
    REAL_FAILED=0
}

# need_package PKG: skip (77) unless the Debian package is installed.
need_package() {
    local st
    st=$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)
    if [ "$st" != "installed" ]; then
        echo "SKIP: $REAL_NAME: Debian package $1 is not installed (scripts/deps installs it)"
        exit $SKIP
    fi
    echo "$REAL_NAME: $1 $(dpkg-query -W -f='${Version}' "$1")"
}

# package_file PKG PATTERN: the installed file of Debian package PKG whose
# path ends as PATTERN (an extended regex, e.g. '/openmpi-tests/xslu'), an
# executable; skip (77) when PKG has none.
package_file() {
    local f
    f=$(dpkg -L "$1" 2>/dev/null | grep -m1 -E "$2\$" || true)
    if [ -z "$f" ] || [ ! -x "$f" ]; then
        echo "SKIP: $REAL_NAME: $1 is installed but has no file matching $2" >&2
        exit $SKIP
    fi
    echo "$f"
}

# real_fail TEXT: records a failure (the script goes on, to report them all).
real_fail() {
    echo "FAIL: $REAL_NAME: $*" >&2
    REAL_FAILED=1
}

# run_mpi LOG NP MODE CMD...: runs CMD on NP ranks in the current directory,
# its standard output in LOG and its standard error in LOG.err (apart: a
# rank's stderr line, like the stats, could otherwise land inside another
# rank's half-written stdout line and break both). MODE plain: as installed; MODE weft: with
# libweft_mpi.so preloaded, every call of size > 0 served by weft
# (WEFT_MPI_MIN_BYTES=0; the default thresholds would leave the programs'
# small calls to MPI) and the per-rank counts printed at MPI_Finalize;
# MODE weftdef: preloaded with the default thresholds (the drop-in as a
# user runs it), counts printed too.
# REAL_PROGRAM_PRELOAD, when set, is preloaded in every mode (after a
# sanitizer's runtime, before libweft_mpi.so): a fix of the program's own.
# Returns mpirun's status (124: it ran past REAL_MPIRUN_TIMEOUT seconds).
run_mpi() {
    local log=$1 np=$2 mode=$3 rc=0 t0 t1
    shift 3
    local args=(-np "$np" --oversubscribe --bind-to none)
    local program_preload=${REAL_PROGRAM_PRELOAD:-}
    if [ "$mode" = plain ] && [ -n "$program_preload" ]; then
        args+=(-x "LD_PRELOAD=$program_preload")
    fi
    if [ "$mode" = weft ] || [ "$mode" = weftdef ]; then
        local preload=$REAL_PRELOAD
        if [ -n "$program_preload" ]; then
            preload=${REAL_SANITIZER:+$REAL_SANITIZER:}$program_preload:$WEFT_MPI_LIB
        fi
        # WEFT_TIMEOUT: a weft wait that cannot finish fails in 30 s with
        # weft's reason instead of hanging until the timeout below.
        args+=(-x "LD_PRELOAD=$preload" -x WEFT_MPI_STATS=1 -x WEFT_TIMEOUT=30)
        [ "$mode" = weft ] && args+=(-x WEFT_MPI_MIN_BYTES=0)
        if [ -n "$REAL_SANITIZER" ]; then
            # The programs are not ours: their own and Python's/Open MPI's
            # leaks are not the drop-in's. Memory errors still abort.
            args+=(-x "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
        fi
    fi
    t0=$(date +%s%N)
    timeout -k 5 "${REAL_MPIRUN_TIMEOUT:-90}" "$MPIRUN" "${args[@]}" "$@" >"$log" 2>"$log.err" || rc=$?
    t1=$(date +%s%N)
    REAL_MS=$(((t1 - t0) / 1000000))
    printf '%s: np %d %-7s exit %d, %d.%d s: %s %s\n' "$REAL_NAME" "$np" "$mode" "$rc" \
        $((REAL_MS / 1000)) $((REAL_MS % 1000 / 100)) "$MPIRUN ${args[*]}" "$*"
    return $rc
}

# show_log LOG: the end of a run's output, when it failed.
show_log() {
    echo "---- last 30 lines of the standard output ($1) ----" >&2
    tail -n 30 "$1" >&2
    echo "---- last 30 lines of the standard error ----" >&2
    tail -n 30 "$1.err" >&2
    echo "----" >&2
}

# check_stats LOG NP COLL...: in the preloaded run's LOG.err, all NP ranks
# printed their counts, weft served each COLL at least once on every rank,
# and the drop-in printed no WARN (a WARN means a communicator fell back to
# MPI).
check_stats() {
    local err=$1.err np=$2
    shift 2
    if grep -q 'weft_mpi\[rank [0-9]*\] WARN' "$err"; then
        grep 'weft_mpi\[rank [0-9]*\] WARN' "$err" | head -5 >&2
        real_fail "np $np: the drop-in warned (above)"
    fi
    /usr/bin/python3 "$REAL_DIR/check_stats.py" "$err" "$np" "$@" || real_fail "np $np: WEFT_MPI_STATS check (above)"
}

real_finish() {
    if [ "$REAL_FAILED" -ne 0 ]; then
        echo "$REAL_NAME: FAILED"
        exit 1
    fi
    echo "$REAL_NAME: PASSED"
    exit 0
}
