#!/usr/bin/env bash
# NetPIPE (Debian netpipe-openmpi, NPopenmpi) under the weft PMPI drop-in.
# NetPIPE ping-pongs messages of growing size between two ranks with
# MPI_Send/MPI_Recv, which the drop-in does not intercept: they must pass
# through untouched. Its one intercepted call is the MPI_Barrier that
# synchronises the ranks before each size, which weft serves.
#
# Two NetPIPE modes, each once as installed and once with libweft_mpi.so
# preloaded:
#   -i  integrity: the receiver checks every byte of every message; every
#       size must report "Integrity check passed";
#   perf: the usual throughput run, up to 1 MiB with a fixed repeat count
#       (-n 20): ~1 s on an idle machine instead of ~50 s for the default
#       (repeats timed per size, up to 8 MiB), and lines that compare.
# Both runs must complete and list the same message sizes and repeat counts
# (NetPIPE's own output lines "N: SIZE bytes REPS times"); throughput may
# differ. The preloaded runs' stats must show weft serving barrier.
#
# NetPIPE is a two-rank program: Debian's 3.7.2 pairs rank 0 with rank
# nprocs-1 and leaves the others idle, and at np 4 it hangs in its first
# size with or without the drop-in (tried). So np 2 only.
#
# Usage: run_netpipe.sh /path/to/libweft_mpi.so [mpirun]   (77: skipped)
set -uo pipefail
. "$(dirname "$0")/common.sh"
real_init netpipe "$@"
need_package netpipe-openmpi
NP=$(dpkg -L netpipe-openmpi | grep -m1 '/bin/NPopenmpi$')
if [ -z "$NP" ] || [ ! -x "$NP" ]; then
    echo "SKIP: netpipe: netpipe-openmpi is installed but has no NPopenmpi"
    exit $SKIP
fi

cd "$REAL_WORK" || exit 1
# NetPIPE's own size sequence from 1 byte (perf: each size also +-3 bytes).
PERF_ARGS=(-n 20 -u 1048576)
INTEGRITY_ARGS=(-i -n 20 -u 4194304)

# sizes LOG: NetPIPE's "  12:      16 bytes   50 times -->" lines (it writes
# them to stderr), reduced to "12 16 50" (index, bytes, repeats): the part
# that must not change.
sizes() {
    cat "$1" "$1.err" | sed -nE 's/^ *([0-9]+): +([0-9]+) bytes +([0-9]+) times -->.*/\1 \2 \3/p'
}

for what in perf integrity; do
    for mode in plain weft; do
        log=$REAL_WORK/$what.$mode.log
        if [ "$what" = perf ]; then args=("${PERF_ARGS[@]}"); else args=("${INTEGRITY_ARGS[@]}"); fi
        if ! run_mpi "$log" 2 "$mode" "$NP" "${args[@]}" -o "$REAL_WORK/$what.$mode.out"; then
            show_log "$log"
            real_fail "$what $mode: mpirun failed"
            continue
        fi
        n=$(sizes "$log" | wc -l)
        last=$(sizes "$log" | tail -n 1)
        echo "  $n sizes, last: index bytes repeats = $last"
        if [ "$n" -lt 10 ]; then
            show_log "$log"
            real_fail "$what $mode: only $n message sizes in NetPIPE's output"
        fi
        if [ "$what" = integrity ]; then
            # Counted, not matched per line: rank 1's stats line (stderr, at
            # its MPI_Finalize) can land between rank 0's "-->" and its
            # verdict for the last size.
            passed=$(cat "$log" "$log.err" | grep -o 'Integrity check passed' | wc -l)
            if [ "$passed" -ne "$n" ] || cat "$log" "$log.err" | grep -qi 'integrity check failed'; then
                show_log "$log"
                real_fail "$what $mode: $passed of $n sizes passed the integrity check"
            else
                echo "  integrity check passed at all $n sizes"
            fi
        else
            # The peak throughput line, for the record (not compared).
            peak=$(sort -k2 -g "$REAL_WORK/$what.$mode.out" | tail -n 1 | awk '{printf "%s bytes: %s Mbps", $1, $2}')
            echo "  peak: $peak"
        fi
        if [ "$mode" = weft ]; then
            if ! diff <(sizes "$REAL_WORK/$what.plain.log") <(sizes "$log") >"$REAL_WORK/diff"; then
                head -n 20 "$REAL_WORK/diff" >&2
                real_fail "$what: the message sizes differ between the plain and the preloaded run"
            else
                echo "  same $n sizes and repeat counts as the plain run"
            fi
            check_stats "$log" 2 barrier
        fi
    done
done
real_finish
