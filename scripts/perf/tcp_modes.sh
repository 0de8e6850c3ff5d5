#!/bin/bash
# Is a TCP latency's spread from job to job weft's, or the machine's?
# Runs `weft-perf sendrecv` at one size over loopback TCP as N separate jobs
# (weft over tcp, Open MPI's tcp btl and UCX's tcp in every job, alternated
# rep by rep inside it), then prints per job the three half round trips and
# weft/MPI, and per library min, median, max and max/min, and how many jobs
# were slow (above 2x that library's fastest job) -- and in how many of
# those jobs the other two libraries were slow as well. The numbers of
# docs/benchmarks.md, "TCP: the bimodal 1 MiB", came from
#   scripts/perf/tcp_modes.sh --jobs 30
#
# usage: scripts/perf/tcp_modes.sh [--build DIR] [--jobs N] [--size 1M] [-- weft-perf options]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$here/build-test
jobs=20
size=1M
extra=()
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--build DIR] [--jobs N] [--size SIZE] [-- weft-perf options]" >&2; exit 2 ;;
    esac
done
perf=$build/bench/weft-perf
[ -x "$perf" ] || { echo "$perf: not built (make weft-perf in $build)" >&2; exit 1; }
# shellcheck source=../env.sh
source "$here/scripts/env.sh"
export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
export OMPI_MCA_oob_tcp_if_include=${OMPI_MCA_oob_tcp_if_include:-lo}
out=$(mktemp /tmp/weft-tcp-modes.XXXXXX.csv)
echo "# $(date -u '+%F %T UTC'), $(nproc) cores, loadavg $(cut -d' ' -f1-3 /proc/loadavg), weft $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# weft-perf sendrecv -b $size -e $size ${extra[*]}; $jobs jobs; weft tcp, MPI --mca btl tcp,self, UCX_TLS=tcp,self; raw CSV in $out"
for j in $(seq 1 "$jobs"); do
    WEFT_TRANSPORTS=tcp UCX_TLS=tcp,self mpirun -np 2 --bind-to none --mca btl tcp,self \
        -x WEFT_TRANSPORTS -x UCX_TLS "$perf" sendrecv --csv -b "$size" -e "$size" "${extra[@]}" 2>/dev/null |
        grep '^sendrecv-lat,' | sed "s/^/$j,/" >> "$out" || echo "# job $j failed" >&2
done
/usr/bin/python3 - "$out" <<'PY'
import csv, statistics, sys
from collections import defaultdict
jobs = defaultdict(dict)   # job -> library -> us
for row in csv.reader(open(sys.argv[1])):
    j, _sub, _np, _tp, _bytes, lib, us = row[:7]
    jobs[int(j)][lib] = float(us)
libs = ['weft', 'MPI', 'ucx']
print('| job | weft (us) | MPI tcp (us) | UCX tcp (us) | weft/MPI |')
print('|---:|---:|---:|---:|---:|')
for j in sorted(jobs):
    t = jobs[j]
    if not all(l in t for l in libs):
        continue
    print(f"| {j} | {t['weft']:.1f} | {t['MPI']:.1f} | {t['ucx']:.1f} | {t['weft'] / t['MPI']:.2f} |")
full = [jobs[j] for j in sorted(jobs) if all(l in jobs[j] for l in libs)]
print()
print('| library | min | median | max | max/min | slow jobs (> 2 x min) | of them, slow for all three |')
print('|---|---:|---:|---:|---:|---:|---:|')
slow = {l: {i for i, t in enumerate(full) if t[l] > 2 * min(x[l] for x in full)} for l in libs}
for l in libs:
    v = [t[l] for t in full]
    both = sum(1 for i in slow[l] if all(i in slow[m] for m in libs))
    print(f'| {l} | {min(v):.1f} | {statistics.median(v):.1f} | {max(v):.1f} | {max(v) / min(v):.2f} | {len(slow[l])} | {both} |')
fast = [t for i, t in enumerate(full) if i not in slow['weft'] | slow['MPI']]
if fast:
    r = [t['weft'] / t['MPI'] for t in fast]
    print(f'\nweft/MPI over the {len(fast)} jobs where neither was slow: median {statistics.median(r):.2f}, '
          f'min {min(r):.2f}, max {max(r):.2f}; max/min of weft there: '
          f"{max(t['weft'] for t in fast) / min(t['weft'] for t in fast):.2f}")
PY
