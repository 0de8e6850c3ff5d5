#!/bin/bash
# Two builds of weft against each other on the node-local paths, job by job
# interleaved (A B, B A, ... so that the machine's slow and fast phases fall
# on both): weft-perf sendrecv (latency and a window of 64), message pipes
# of 1 and 8 tensors (pipe-perf-weft), allreduce and allgather, np 2 over
# shared memory. Every job also runs Open MPI in the same process, so each
# row gives weft's median time under A and B and the median of weft/MPI in
# the same job (the ratio follows the phase less than the time does). The
# numbers of docs/benchmarks.md, "Shared pulls from 64 KiB", came from
#   git worktree add /tmp/old <commit before>; cmake -S /tmp/old -B /tmp/old/build
#   cmake --build /tmp/old/build --target weft-perf pipe-perf-weft
#   scripts/perf/builds_ab.sh --a /tmp/old/build --b build-test --rounds 8
#
# usage: scripts/perf/builds_ab.sh --a DIR --b DIR [--rounds R] [--out DIR]
#   (DIR: a build directory holding bench/weft-perf and bench/pipe-perf-weft)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
a= b= rounds=8 out=
while [ $# -gt 0 ]; do
    case $1 in
    --a) a=$2; shift 2 ;;
    --b) b=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 --a DIR --b DIR [--rounds R] [--out DIR]" >&2; exit 2 ;;
    esac
done
for d in "$a" "$b"; do
    for t in weft-perf pipe-perf-weft; do
        [ -x "$d/bench/$t" ] || { echo "$d/bench/$t: not built (need --a and --b build dirs)" >&2; exit 1; }
    done
done
# shellcheck source=../env.sh
source "$here/scripts/env.sh"
out=${out:-$(mktemp -d /tmp/weft-builds-ab.XXXXXX)}
mkdir -p "$out"
echo "# $(date -u '+%F %T UTC'), $(nproc) cores, $rounds rounds; A = $a, B = $b; raw output in $out"
run() {   # build label round
    local d=$1 v=$2 r=$3
    export WEFT_TRANSPORTS=shm
    mpirun -np 2 --bind-to none -x WEFT_TRANSPORTS "$d/bench/weft-perf" sendrecv -b 32K -e 1M > "$out/sr_${v}_$r.txt" 2>&1
    mpirun -np 2 --bind-to none -x WEFT_TRANSPORTS "$d/bench/pipe-perf-weft" -b 64K -e 4M -k 1,8 -s 0.5 \
        > "$out/pipe_${v}_$r.txt" 2>&1
    mpirun -np 2 --bind-to none -x WEFT_TRANSPORTS "$d/bench/weft-perf" allreduce -b 64K -e 4M > "$out/ar_${v}_$r.txt" 2>&1
    mpirun -np 2 --bind-to none -x WEFT_TRANSPORTS "$d/bench/weft-perf" allgather -b 64K -e 4M > "$out/ag_${v}_$r.txt" 2>&1
}
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then run "$a" A "$r"; run "$b" B "$r"; else run "$b" B "$r"; run "$a" A "$r"; fi
done
/usr/bin/python3 - "$out" <<'PY'
import collections, glob, re, statistics, sys
d = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + '/*.txt'):
    kind, v = re.match(r'.*/(\w+?)_([AB])_\d+\.txt$', f).groups()
    for line in open(f):
        x = line.split()
        if not x or line.startswith('#'):
            continue
        if kind == 'pipe' and x[0] == 'row':
            kv = dict(t.split('=', 1) for t in x[1:] if '=' in t)
            key = ('pipe lat', '%s x%s' % (kv['size'], kv['tensors']))
            d[key + (v, 't')].append(float(kv['lat_us']))
        elif kind == 'sr' and len(x) == 12:      # latency row: size reps iters (time GB/s) x3 w/MPI w/UCX wrong
            d[('p2p lat', x[0], v, 't')].append(float(x[3])); d[('p2p lat', x[0], v, 'r')].append(float(x[9]))
        elif kind == 'sr' and len(x) == 13:      # bandwidth row: size win reps iters ...
            d[('p2p bw', x[0], v, 't')].append(float(x[4])); d[('p2p bw', x[0], v, 'r')].append(float(x[10]))
        elif kind in ('ar', 'ag') and re.match(r'^\d', x[0]):
            name = 'allreduce' if kind == 'ar' else 'allgather'
            # ratio column: MPI/weft time; shown inverted, as weft/MPI
            ratio = float(x[-1] if kind == 'ar' else x[-2])
            d[(name, x[0], v, 't')].append(float(x[2]))
            if ratio > 0:
                d[(name, x[0], v, 'r')].append(1 / ratio)
med = lambda k: statistics.median(d[k]) if d.get(k) else float('nan')
def size_key(s):
    m = re.match(r'(\d+)([KM]?)(?: x(\d+))?', s)
    return int(m[1]) * {'': 1, 'K': 1 << 10, 'M': 1 << 20}[m[2]], int(m[3] or 0)
print('| test | size | A weft us | B weft us | B/A | A weft/MPI | B weft/MPI |')
print('|---|---:|---:|---:|---:|---:|---:|')
for t, s in sorted({k[:2] for k in d}, key=lambda k: (k[0], size_key(k[1]))):
    ta, tb = med((t, s, 'A', 't')), med((t, s, 'B', 't'))
    fmt = lambda v: '-' if v != v else '%.2f' % v    # no MPI column (message pipes): '-'
    print('| %s | %s | %.2f | %.2f | %.2f | %s | %s |' % (t, s, ta, tb, tb / ta, fmt(med((t, s, 'A', 'r'))),
                                                      fmt(med((t, s, 'B', 'r')))))
PY
