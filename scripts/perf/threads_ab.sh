#!/bin/bash
# The small-message path with and without the comm's lock: weft-perf
# sendrecv (np 2, shared memory; weft, Open MPI and UCX in the same job) with
# WEFT_THREADS=multiple (the default) and =serialized, one job each,
# alternated round by round so that the machine's slow and fast phases fall
# on both. Prints per test and size the median over rounds of weft's time
# and of weft's time / MPI's time in the same job. The numbers of
# docs/benchmarks.md, "A comm used by one thread at a time", came from
#   scripts/perf/threads_ab.sh --rounds 12
#
# usage: scripts/perf/threads_ab.sh [--build DIR] [--rounds R] [-b SIZE] [-e SIZE]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$here/build-test
rounds=8 lo=8 hi=1K
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -b) lo=$2; shift 2 ;;
    -e) hi=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--rounds R] [-b SIZE] [-e SIZE]" >&2; exit 2 ;;
    esac
done
perf=$build/bench/weft-perf
[ -x "$perf" ] || { echo "$perf: not built" >&2; exit 1; }
# shellcheck source=../env.sh
source "$here/scripts/env.sh"
out=$(mktemp /tmp/weft-threads-ab.XXXXXX.csv)
echo "# $(date -u '+%F %T UTC'), $(nproc) cores, $rounds rounds, weft $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'); raw rows in $out"
for r in $(seq 1 "$rounds"); do
    for v in multiple serialized; do
        WEFT_THREADS=$v WEFT_TRANSPORTS=shm mpirun -np 2 --bind-to core -x WEFT_THREADS -x WEFT_TRANSPORTS \
            "$perf" sendrecv -b "$lo" -e "$hi" -f 4 -r 11 --csv 2>/dev/null |
            awk -F, -v v="$v" -v r="$r" 'NR > 1 && NF >= 6 { print r "," v "," $1 "," $4 "," $5 "," $6 }' >> "$out"
    done
done
python3 - "$out" <<'PY'
import sys, statistics as st
from collections import defaultdict
t = {}
for line in open(sys.argv[1]):
    r, v, test, size, lib, us = line.strip().split(",")
    t[(r, v, test, int(size), lib)] = float(us)
weft = defaultdict(list); ratio = defaultdict(list)
for (r, v, test, size, lib), us in t.items():
    if lib != "weft" or (r, v, test, size, "MPI") not in t:
        continue
    weft[(test, size, v)].append(us)
    ratio[(test, size, v)].append(us / t[(r, v, test, size, "MPI")])
print("| test | size | weft us, multiple | weft us, serialized | weft/MPI, multiple | weft/MPI, serialized |")
print("|---|---:|---:|---:|---:|---:|")
for test, size in sorted({(k[0], k[1]) for k in weft}):
    m, s = (test, size, "multiple"), (test, size, "serialized")
    print(f"| {test} | {size} | {st.median(weft[m]):.3f} | {st.median(weft[s]):.3f} "
          f"| {st.median(ratio[m]):.2f} | {st.median(ratio[s]):.2f} |")
PY
