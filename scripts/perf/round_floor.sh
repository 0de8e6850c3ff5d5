#!/bin/bash
# How close are weft's and Open MPI's one-node barrier and small allreduce to
# the machine's floor of one shared-memory round? For each np, round by
# round: bench/probes/round_probe.c (N processes, counters in one shared
# page, no library), bench/probes/weft_round_loop.c (weft's barrier and
# 8-byte allreduce alone in a loop, as the probe runs), then `weft-perf
# barrier` and `weft-perf allreduce -b 8 -e 1K` (weft and Open MPI
# alternated inside each job). Prints per np the medians over the rounds:
# floor, weft alone, weft and MPI in weft-perf, weft/MPI, floor/MPI -- a
# target weft/MPI below floor/MPI is out of reach for any library that
# synchronises the ranks in shared memory on this machine. The numbers of
# docs/benchmarks.md, "The floor of one round", came from
#   scripts/perf/round_floor.sh --rounds 7
#
# usage: scripts/perf/round_floor.sh [--build DIR] [--np "2 4 8"] [--rounds N]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$here/build-test
nps="2 4 8"
rounds=3
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--np \"2 4 8\"] [--rounds N]" >&2; exit 2 ;;
    esac
done
perf=$build/bench/weft-perf
[ -x "$perf" ] || { echo "$perf: not built (make weft-perf in $build)" >&2; exit 1; }
# shellcheck source=../env.sh
source "$here/scripts/env.sh"
export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
export OMPI_MCA_oob_tcp_if_include=${OMPI_MCA_oob_tcp_if_include:-lo}
work=$(mktemp -d /tmp/weft-round-floor.XXXXXX)
gcc -O2 -std=c11 -D_GNU_SOURCE "$here/bench/probes/round_probe.c" -o "$work/round_probe"
mpicc -O2 -I"$here/include" "$here/bench/probes/weft_round_loop.c" -o "$work/weft_round_loop" \
    -L"$build" -lweft -Wl,-rpath,"$build"
out=$work/rows.csv
echo "# $(date -u '+%F %T UTC'), $(nproc) cores, loadavg $(cut -d' ' -f1-3 /proc/loadavg), weft $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# np: $nps; $rounds rounds; raw rows in $out"
for r in $(seq 1 "$rounds"); do
    for np in $nps; do
        # One line: "round_probe: N processes ... one round X us ..."
        floor=$("$work/round_probe" "$np" | sed -n 's/.*one round \([0-9.]*\) us.*/\1/p')
        echo "$r,floor,$np,0,floor,$floor" >> "$out"
        # Two lines: "barrier X us", "allreduce8 Y us".
        mpirun -np "$np" --oversubscribe --bind-to none "$work/weft_round_loop" 2>/dev/null |
            awk -v r="$r" -v np="$np" '$1 == "barrier" { print r ",barrier," np ",0,alone," $2 }
                                       $1 == "allreduce8" { print r ",allreduce," np ",8,alone," $2 }' >> "$out" ||
            echo "# round $r np $np weft_round_loop failed" >&2
        for kind in barrier allreduce; do
            args=(-r 5)
            [ "$kind" = allreduce ] && args+=(-b 8 -e 1K -f 8)
            mpirun -np "$np" --oversubscribe --bind-to none "$perf" "$kind" --csv "${args[@]}" 2>/dev/null |
                awk -F, -v r="$r" 'NR > 1 { print r "," $1 "," $2 "," $4 "," $5 "," $6 }' >> "$out" ||
                echo "# round $r np $np $kind failed" >&2
        done
    done
done
/usr/bin/python3 - "$out" <<'PY'
import csv, statistics, sys
from collections import defaultdict
t = defaultdict(list)   # (kind, np, bytes, library) -> [us per round]
for r, kind, np, size, lib, us in csv.reader(open(sys.argv[1])):
    t[(kind, int(np), int(size), lib)].append(float(us))
med = lambda v: statistics.median(v) if v else float('nan')
rng = lambda v: f'{min(v):.2f}-{max(v):.2f}' if v else '-'
print('medians over the rounds (in brackets: the rounds\' range)')
print()
print('| np | call | floor of one round (us) | weft alone (us) | weft (us) | Open MPI (us) | weft/MPI | floor/MPI |')
print('|---:|---|---:|---:|---:|---:|---:|---:|')
for np in sorted({k[1] for k in t}):
    fl = t[('floor', np, 0, 'floor')]
    floor = med(fl)
    for kind, size in sorted({(k[0], k[2]) for k in t if k[1] == np and k[0] != 'floor'}):
        w, m, al = t[(kind, np, size, 'weft')], t[(kind, np, size, 'MPI')], t[(kind, np, size, 'alone')]
        name = 'barrier' if kind == 'barrier' else f'{kind} {size} B'
        alone = f'{med(al):.2f} ({rng(al)})' if al else '-'
        print(f'| {np} | {name} | {floor:.2f} ({rng(fl)}) | {alone} | {med(w):.2f} ({rng(w)}) | {med(m):.2f} ({rng(m)}) '
              f'| {med(w) / med(m):.2f} | {floor / med(m):.2f} |')
PY
