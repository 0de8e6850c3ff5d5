#!/bin/bash
# Which reduce algorithm at which size: Open MPI's MPI_Reduce and weft's
# binomial tree and ring (forced with WEFT_REDUCE_ALGO, through the PMPI
# drop-in with WEFT_MPI_MIN_BYTES=0), one job each, alternated round by
# round so that the machine's slow and fast phases fall on all three. Prints
# per size each variant's median time and the median over rounds of its
# time / MPI's time in the same round. The numbers of docs/benchmarks.md,
# "Reduce: tree or ring", came from
#   scripts/perf/reduce_algos.sh --np 2 --rounds 8
#   scripts/perf/reduce_algos.sh --np 4 --rounds 5   (and --np 3 / 8, -e 1M)
# WEFT_VIRTUAL_NODES in the environment is passed to weft's jobs (two
# virtual nodes: TCP between them; Open MPI's column stays on shm).
#
# usage: scripts/perf/reduce_algos.sh [--build DIR] [--np N] [--rounds R]
#                                     [-b SIZE] [-e SIZE] [--variants "mpi binomial ring"]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$here/build-test
np=2 rounds=5 lo=128K hi=4M variants="mpi binomial ring"
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -b) lo=$2; shift 2 ;;
    -e) hi=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--np N] [--rounds R] [-b SIZE] [-e SIZE] [--variants LIST]" >&2; exit 2 ;;
    esac
done
perf=$build/bench/mpi-coll-perf
drop=$build/adapters/mpi/libweft_mpi.so
[ -x "$perf" ] && [ -f "$drop" ] || { echo "$perf or $drop: not built" >&2; exit 1; }
# shellcheck source=../env.sh
source "$here/scripts/env.sh"
out=$(mktemp /tmp/weft-reduce-algos.XXXXXX.txt)
echo "# $(date -u '+%F %T UTC'), $(nproc) cores, np $np, $rounds rounds, weft $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'); raw rows in $out"
for r in $(seq 1 "$rounds"); do
    for v in $variants; do
        env=()
        [ "$v" = mpi ] || env=(-x LD_PRELOAD="$drop" -x WEFT_MPI_MIN_BYTES=0 -x WEFT_REDUCE_ALGO="$v" -x WEFT_VIRTUAL_NODES)
        mpirun -np "$np" --oversubscribe --bind-to none "${env[@]}" "$perf" -c reduce -b "$lo" -e "$hi" -r 5 2>/dev/null |
            grep '^reduce ' | sed "s/^/$r $v /" >> "$out" || echo "# round $r, $v failed" >&2
    done
done
/usr/bin/python3 - "$out" $variants <<'PY'
import statistics as st, sys
from collections import defaultdict
t = defaultdict(dict)   # (size, variant) -> round -> us
for line in open(sys.argv[1]):
    f = line.split()
    t[(int(f[3]), f[1])][f[0]] = float(f[8])
vs = sys.argv[2:]
print('| size | ' + ' | '.join(f'{v} us (/ MPI)' for v in vs) + ' |')
print('|---:|' + '---:|' * len(vs))
for s in sorted({k[0] for k in t}):
    cells = []
    for v in vs:
        rounds = t[(s, v)]
        ratio = [rounds[r] / t[(s, 'mpi')][r] for r in rounds if r in t[(s, 'mpi')]]
        cells.append(f'{st.median(rounds.values()):.1f} ({st.median(ratio):.2f})' if rounds and ratio else '-')
    print(f'| {s} | ' + ' | '.join(cells) + ' |')
PY
