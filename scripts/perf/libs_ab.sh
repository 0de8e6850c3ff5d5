#!/bin/bash
# Two builds of libweft against each other with the same benchmark binary:
# job by job alternated (A B, A B, ...), each job's ranks loading A's or B's
# libweft.so.0 through LD_LIBRARY_PATH (ahead of the binary's RUNPATH).
# Two kinds of job:
#   weft-perf KIND [args]   weft and Open MPI alternated inside each job;
#                           per size: weft's and MPI's median time over the
#                           rounds, and the median (and range) of the
#                           rounds' weft/MPI -- the ratio follows the
#                           machine's phase less than the time does;
#   loop                    bench/probes/weft_round_loop.c: weft's barrier
#                           and 8-byte allreduce alone in a loop; per call
#                           the median and range over the rounds.
# The numbers of docs/benchmarks.md, "Two ranks: fewer cache lines and
# copies per node-local call", came from e.g.
#   cp build-old/libweft.so.0 /tmp/libA/; cp build-test/libweft.so.0 /tmp/libB/
#   scripts/perf/libs_ab.sh --a /tmp/libA --b /tmp/libB --rounds 10 --np 2 loop
#   scripts/perf/libs_ab.sh --a /tmp/libA --b /tmp/libB --rounds 5 --np 2 gather -b 8 -e 32K -f 4 -r 5
#
# usage: scripts/perf/libs_ab.sh --a LIBDIR --b LIBDIR [--build DIR] [--rounds R] [--np N] (loop | KIND [weft-perf args])
#   (LIBDIR: a directory holding libweft.so.0)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$here/build-test
a= b= rounds=5 np=2
usage() { echo "usage: $0 --a LIBDIR --b LIBDIR [--build DIR] [--rounds R] [--np N] (loop | KIND [weft-perf args])" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --a) a=$2; shift 2 ;;
    --b) b=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    -*) usage ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] && [ -n "$a" ] && [ -n "$b" ] || usage
for d in "$a" "$b"; do
    [ -e "$d/libweft.so.0" ] || { echo "$d/libweft.so.0: missing" >&2; exit 1; }
done
# shellcheck source=../env.sh
source "$here/scripts/env.sh"
export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
export OMPI_MCA_oob_tcp_if_include=${OMPI_MCA_oob_tcp_if_include:-lo}
work=$(mktemp -d /tmp/weft-libs-ab.XXXXXX)
if [ "$1" = loop ]; then
    mpicc -O2 -I"$here/include" "$here/bench/probes/weft_round_loop.c" -o "$work/weft_round_loop" \
        -L"$build" -lweft -Wl,-rpath,"$build"
    cmd=("$work/weft_round_loop")
else
    [ -x "$build/bench/weft-perf" ] || { echo "$build/bench/weft-perf: not built" >&2; exit 1; }
    cmd=("$build/bench/weft-perf" "$@" --csv)
fi
echo "# $(date -u '+%F %T UTC'), $(nproc) cores, np $np, $rounds rounds; A = $a, B = $b; ${cmd[*]}; raw rows in $work/rows"
for r in $(seq 1 "$rounds"); do
    for v in A B; do
        lib=$a
        [ $v = B ] && lib=$b
        LD_LIBRARY_PATH=$lib mpirun -np "$np" --oversubscribe --bind-to none -x LD_LIBRARY_PATH "${cmd[@]}" \
            2>/dev/null | awk -v v=$v -v r="$r" -F, '
                NF == 1 && $1 ~ / us$/ { split($1, w, " "); print r "," v "," w[1] ",alone," w[2]; next }
                NR > 1 && NF > 5 { print r "," v "," $4 "," $5 "," $6 }' >> "$work/rows" ||
            echo "# round $r $v failed" >&2
    done
done
/usr/bin/python3 - "$work/rows" <<'PY'
import csv, statistics, sys
from collections import defaultdict
t = defaultdict(dict)   # (size, build, library) -> {round: us}
for r, v, size, lib, us in csv.reader(open(sys.argv[1])):
    t[(size, v, lib)][int(r)] = float(us)
med = statistics.median
sizes = sorted({k[0] for k in t}, key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else s))
for s in sizes:
    cells = []
    for v in 'AB':
        w = t.get((s, v, 'weft')) or t.get((s, v, 'alone')) or {}
        m = t.get((s, v, 'MPI'), {})
        cell = f"{v}: weft {med(w.values()):.3f} [{min(w.values()):.3f}-{max(w.values()):.3f}]" if w else f"{v}: -"
        if m:
            ratios = [w[r] / m[r] for r in w if r in m]
            cell += f" MPI {med(m.values()):.3f} weft/MPI {med(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
        cells.append(cell)
    print(f"{s:>8} | " + " | ".join(cells))
PY
