#!/bin/bash
# Node-local collectives (collectives/node_coll.c) against the message path
# and MPI on this machine: weft-perf runs each collective at each rank
# count twice per round -- the default WEFT_NODE_COLL_KB (node-local) and
# WEFT_NODE_COLL_KB=0 (every call as messages) -- rounds interleaved, and
# prints per collective and rank count the medians over rounds as a
# markdown table: node-local, messages, MPI (every run's MPI column
# pooled), and the ratios. The numbers of docs/benchmarks.md, "Node-local
# collectives", came from
#   scripts/perf/node_coll.sh --rounds 3
# --off VAR=VALUE: the other series' setting instead of WEFT_NODE_COLL_KB=0
# (e.g. WEFT_NODE_COLL_LARGE_KB=0: "Node-local reductions up to 1 MiB").
#
# usage: scripts/perf/node_coll.sh [--build DIR] [--rounds N] [--nps "2 4 8"]
#            [--colls "barrier bcast allgather allreduce reduce_scatter alltoall"] [--off VAR=VALUE]
#            [-- weft-perf options]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$here/build-test
rounds=3
nps="2 4 8"
colls="barrier bcast allgather allreduce reduce_scatter alltoall"
extra=(-b 8 -e 64K -f 4)
off=WEFT_NODE_COLL_KB=0
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --nps) nps=$2; shift 2 ;;
    --colls) colls=$2; shift 2 ;;
    --off) off=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--build DIR] [--rounds N] [--nps LIST] [--colls LIST] [--off VAR=VALUE] [-- weft-perf options]" >&2; exit 2 ;;
    esac
done
perf=$build/bench/weft-perf
[ -x "$perf" ] || { echo "$perf: not built (make weft-perf in $build)" >&2; exit 1; }
# shellcheck source=../env.sh
source "$here/scripts/env.sh"
out=$(mktemp -d /tmp/weft-node-coll.XXXXXX)
echo "# $(date -u '+%F %T UTC'), $(nproc) cores, loadavg $(cut -d' ' -f1-3 /proc/loadavg), weft $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# weft-perf ${extra[*]}; $rounds rounds; \"messages\": $off; raw CSV in $out"
for r in $(seq 1 "$rounds"); do
    for np in $nps; do
        for c in $colls; do
            for kb in default 0; do
                args=()
                [ "$c" = barrier ] || args=("${extra[@]}")
                env_kb=()
                [ "$kb" = default ] || env_kb=(-x "$off")
                mpirun -np "$np" --oversubscribe --bind-to none "${env_kb[@]}" \
                    "$perf" "$c" --csv "${args[@]}" 2>/dev/null | grep -v '^#' | sed "s/^/$kb,$r,/" \
                    >> "$out/all.csv" || echo "# $c np $np kb $kb round $r failed" >&2
            done
        done
    done
done
/usr/bin/python3 - "$out/all.csv" <<'PY'
import csv, statistics, sys
from collections import defaultdict
t = defaultdict(list)   # (coll, np, bytes, series) -> times
for row in csv.reader(open(sys.argv[1])):
    if len(row) < 8 or row[3] == 'np':
        continue
    kb, rnd, coll, np_, tp, nbytes, lib, us = row[:8]
    series = 'MPI' if lib == 'MPI' else ('node' if kb == 'default' else 'msgs')
    t[(coll, int(np_), int(nbytes), series)].append(float(us))
def med(k):
    v = t.get(k)
    return statistics.median(v) if v else float('nan')
keys = sorted({(c, n) for (c, n, b, s) in t})
for c, n in keys:
    print(f"\n{c}, np {n}\n")
    print("| size | node-local (us) | messages (us) | MPI (us) | messages / node-local | MPI / node-local |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b in sorted({b for (cc, nn, b, s) in t if cc == c and nn == n}):
        nd, ms, mp = med((c, n, b, 'node')), med((c, n, b, 'msgs')), med((c, n, b, 'MPI'))
        print(f"| {b} | {nd:.2f} | {ms:.2f} | {mp:.2f} | {ms / nd:.2f} | {mp / nd:.2f} |")
PY
