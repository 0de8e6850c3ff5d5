#!/bin/sh
# mpi-coll-perf with and without the PMPI drop-in (libweft_mpi.so), one job
# after the other, and markdown tables of the ratio (docs/benchmarks.md,
# "PMPI drop-in (MPI programs, preloaded)").
#
#   bench/mpi/run.sh [options] [-- mpi-coll-perf options]
#     --build DIR    build dir holding bench/mpi-coll-perf and
#                    adapters/mpi/libweft_mpi.so ($WEFT_BUILD, else <repo>/build)
#     --np "2 4 8"   process counts (mpirun --oversubscribe --bind-to none)
#     --colls "allgather bcast allreduce alltoall" (also: reduce, gather,
#                    scatter, alltoallv, barrier;
#                    barrier is one row, size 0)
#     --runs N       mpirun jobs per mode, collective and np (3); the table
#                    shows the median over them of each job's median
#     --no-min0      skip the WEFT_MPI_MIN_BYTES=0 mode
#     --out DIR      keep every job's output there (default: a new /tmp dir);
#                    runs already there are kept and count in the tables
#     --report DIR   only print the tables of an earlier --out DIR
# Defaults passed to mpi-coll-perf: -b 8 -e 16M -r 3 (its own repeats).
#
# Modes, interleaved job by job so that they share the machine's noise
# (the order rotates from run to run):
#   mpi    the program alone (no LD_PRELOAD)
#   weft   LD_PRELOAD=libweft_mpi.so, default per-collective thresholds
#   min0   the same with WEFT_MPI_MIN_BYTES=0: weft serves every size, for
#          the crossover (the smallest size from which weft is faster at
#          every larger size), which is what the default thresholds come from
# The first preloaded job of each mode runs with WEFT_MPI_STATS=1; if its
# ranks report no weft call, the preload was not active, and the report says so.
# Exit status: 1 if any job failed or any element was wrong.
set -e
here=$(cd "$(dirname "$0")" && pwd)
build=${WEFT_BUILD:-$here/../../build}
nps="2 4 8"
colls="allgather bcast allreduce alltoall"
runs=3
modes="mpi weft min0"
out=
report=
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    --colls) colls=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --no-min0) modes="mpi weft"; shift ;;
    --out) out=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

render() {
    /usr/bin/python3 - "$1" <<'EOF'
import glob, os, re, statistics, sys

d = sys.argv[1]
BLOCKED = ("allgather", "alltoall", "gather", "scatter", "alltoallv")   # sizes of n blocks: the threshold's unit is one
# (alltoallv: shown per peer as the alltoall, but the PMPI layer routes alltoallv by rank count only, no size)
jobs = {}      # (np, coll, mode) -> one {size: (median us, min us, wrong)} per job
failed = []    # jobs with a non-zero exit
stats = {}     # (np, coll, mode) -> [weft calls, pmpi calls, jobs] of that collective
loads = []     # the 1-minute load average after each job
mp = os.path.join(d, "meta.txt")
meta = open(mp).read() if os.path.exists(mp) else ""
name_re = re.compile(r"np(\d+)\.(\w+)\.(mpi|weft|min0)\.(\d+)\.log$")
for path in sorted(glob.glob(os.path.join(d, "*.log"))):
    m = name_re.search(path)
    if not m:
        continue
    key = (int(m[1]), m[2], m[3])
    coll = m[2]
    rows, rc, st = {}, None, None
    for line in open(path, errors="replace"):
        f = line.split()
        if line.startswith("# exit "):
            rc = int(f[2])
        elif line.startswith("# load "):
            loads.append(float(f[2]))
        elif len(f) >= 13 and f[0] == coll:
            rows[int(f[1])] = (float(f[6]), float(f[10]), int(f[9]))
        elif line.startswith("weft_mpi: rank"):
            mm = re.search(r"\b%s weft=(\d+) pmpi=(\d+)" % coll, line)
            if mm:
                st = st or stats.setdefault(key, [0, 0, 0])
                st[0] += int(mm[1]); st[1] += int(mm[2])
    if st:
        st[2] += 1
    if rc != 0:
        failed.append("%s (exit %s)" % (os.path.basename(path), rc))
    jobs.setdefault(key, []).append(rows)

def human(b):
    for unit, sh in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << sh and b % (1 << sh) == 0:
            return "%d %s" % (b >> sh, unit)
    return "%d B" % b

def fmt_t(t):
    return "%.1f" % t if t < 1000 else "%.0f" % t

def summary(key):
    """size -> (median of the jobs' medians, the jobs' medians, best repeat of all, wrong total)"""
    res = {}
    for rows in jobs.get(key, []):
        for s, (t, tmin, w) in rows.items():
            e = res.setdefault(s, [[], [], 0])
            e[0].append(t); e[1].append(tmin); e[2] += w
    return {s: (statistics.median(v[0]), v[0], min(v[1]), v[2]) for s, v in res.items()}

def paired_range(a, b):
    """min-max over runs of run i's MPI time / preloaded time (its jobs ran back to back)."""
    r = [x / y for x, y in zip(a, b) if y > 0]
    return "%.2f-%.2f" % (min(r), max(r)) if len(r) > 1 else ""

def crossover(r):
    """The smallest size from which r[size] > 1 at that size and every larger one."""
    cross = None
    for s in sorted(r, reverse=True):
        if r[s] <= 1.0:
            break
        cross = s
    return cross

nps = sorted({k[0] for k in jobs})
colls = [c for c in ("allgather", "bcast", "allreduce", "alltoall", "reduce", "gather", "scatter", "alltoallv",
                     "barrier")
         if any(k[1] == c for k in jobs)]
modes = [m for m in ("weft", "min0") if any(k[2] == m for k in jobs)]
label = {"weft": "weft (default thresholds)", "min0": "weft, WEFT_MPI_MIN_BYTES=0"}
bad = bool(failed)
if meta:
    print(meta.rstrip() + "\n")
if loads:
    print("Load (1-minute average) after each job: median %.1f, min %.1f, max %.1f (%d jobs).\n" % (
        statistics.median(loads), min(loads), max(loads), len(loads)))
print("us: per call, slowest rank; the median over the jobs of each job's median over its repeats.")
print("ratio: MPI us / preloaded us (above 1: faster with weft). range: that ratio run by run (a run's")
print("jobs ran back to back). best: the fastest repeat of all jobs, MPI / preloaded (the least")
print("disturbed calls: on a loaded machine the closest to what each can do).\n")
ratios, bests = {}, {}   # (np, coll, mode) -> {size: ratio}
for np_ in nps:
    for coll in colls:
        base = summary((np_, coll, "mpi"))
        if not base:
            continue
        other = {m: summary((np_, coll, m)) for m in modes}
        print("### np %d, %s\n" % (np_, coll))
        hdr, sep = "| size | MPI us |", "|---|---|"
        for m in modes:
            hdr += " %s us | ratio | range | best |" % label[m]
            sep += "---|---|---|---|"
        print(hdr + " #wrong |")
        print(sep + "---|")
        for s in sorted(base):
            t, tl, tbest, wrong = base[s]
            cells = [human(s), fmt_t(t)]
            for m in modes:
                if s not in other[m]:
                    cells += ["-", "-", "", ""]
                    continue
                u, ul, ubest, uw = other[m][s]
                r = t / u if u > 0 else float("inf")
                rb = tbest / ubest if ubest > 0 else float("inf")
                ratios.setdefault((np_, coll, m), {})[s] = r
                bests.setdefault((np_, coll, m), {})[s] = rb
                cells += [fmt_t(u), "%.2f" % r, paired_range(tl, ul), "%.2f" % rb]
                wrong += uw
            bad = bad or wrong != 0
            print("| " + " | ".join(cells) + " | %d |" % wrong)
        print()
        for m in modes:
            st = stats.get((np_, coll, m))
            if st is None:
                print("%s: no WEFT_MPI_STATS line: the preload was not active, or no job ran with it  " % label[m])
                bad = True
                continue
            print("%s: %s calls over all ranks of %d job(s) with WEFT_MPI_STATS=1: weft=%d pmpi=%d%s  " % (
                label[m], coll, st[2], st[0], st[1],
                "  ** WEFT_MPI_MIN_BYTES=0 yet no weft call **" if m == "min0" and st[0] == 0 else ""))
            bad = bad or (m == "min0" and st[0] == 0)
        print()

if "min0" in modes:
    print("### Crossover with WEFT_MPI_MIN_BYTES=0\n")
    print("The smallest size from which the preloaded job is faster (ratio > 1) at that size and every")
    print("larger one: by the median ratio / by the best ratio. In brackets the same in the unit")
    print("WEFT_MPI_MIN_BYTES compares (allgather, alltoall, gather, scatter: bytes per peer = size / np; bcast,")
    print("allreduce: the message; alltoallv: size / np too, though no threshold applies to it). 'none': not")
    print("faster at the largest size.\n")
    print("| collective | " + " | ".join("np %d" % n for n in nps) + " |")
    print("|---|" + "---|" * len(nps))
    for coll in colls:
        cells = []
        for np_ in nps:
            parts = []
            for tab in (ratios, bests):
                c = crossover(tab.get((np_, coll, "min0"), {}))
                if c is None:
                    parts.append("none")
                else:
                    unit = c // np_ if coll in BLOCKED else c
                    parts.append("%s (%s)" % (human(c), human(unit)))
            cells.append(" / ".join(parts))
        print("| %s | %s |" % (coll, " | ".join(cells)))
    print()
    print("Where weft wins with WEFT_MPI_MIN_BYTES=0: the runs of consecutive sizes whose median and")
    print("best ratios are both above 1 (bytes per peer in brackets for allgather, alltoall, gather, scatter,")
    print("alltoallv).\n")
    print("| collective | " + " | ".join("np %d" % n for n in nps) + " |")
    print("|---|" + "---|" * len(nps))
    for coll in colls:
        cells = []
        for np_ in nps:
            r, rb = ratios.get((np_, coll, "min0"), {}), bests.get((np_, coll, "min0"), {})
            runs_, cur = [], []
            for sz in sorted(r):
                if r[sz] > 1.0 and rb.get(sz, 0) > 1.0:
                    cur.append(sz)
                elif cur:
                    runs_.append(cur); cur = []
            if cur:
                runs_.append(cur)
            def span(a, b):
                t = human(a) if a == b else "%s-%s" % (human(a), human(b))
                if coll in BLOCKED:
                    u = human(a // np_) if a == b else "%s-%s" % (human(a // np_), human(b // np_))
                    t += " (%s)" % u
                return t
            cells.append(", ".join(span(x[0], x[-1]) for x in runs_) or "none")
        print("| %s | %s |" % (coll, " | ".join(cells)))
    print()

if "weft" in modes:
    print("### Against the targets (default thresholds)\n")
    print("Never slower than MPI alone by more than 5% (ratio >= 0.95 at every size); at least 1.3x from")
    print("64 KiB at np 4 and 8. By the median ratio; the best ratio in the last column.\n")
    print("| collective | np | lowest ratio (size) | sizes below 0.95 | lowest ratio from 64 KiB | "
          ">= 1.3x from 64 KiB | lowest best ratio (size) |")
    print("|---|---|---|---|---|---|---|")
    for coll in colls:
        for np_ in nps:
            r = ratios.get((np_, coll, "weft"), {})
            rb = bests.get((np_, coll, "weft"), {})
            if not r:
                continue
            lo, lob = min(r, key=r.get), min(rb, key=rb.get)
            below = [human(s) for s in sorted(r) if r[s] < 0.95]
            big = {s: v for s, v in r.items() if s >= 65536}
            if big:
                lbig = min(big, key=big.get)
                lbig_s = "%.2f (%s)" % (big[lbig], human(lbig))
                n_miss = sum(v < 1.3 for v in big.values())
                met = "yes" if not n_miss else "no (%d of %d sizes)" % (n_miss, len(big))
                if np_ not in (4, 8):
                    met += ", not a target at np %d" % np_
            else:
                lbig_s, met = "-", "-"
            print("| %s | %d | %.2f (%s) | %s | %s | %s | %.2f (%s) |" % (
                coll, np_, r[lo], human(lo), ", ".join(below) if below else "none", lbig_s, met,
                rb[lob], human(lob)))
    print()
if failed:
    print("Failed jobs: " + ", ".join(failed))
sys.exit(1 if bad else 0)
EOF
}

if [ -n "$report" ]; then
    render "$report"
    exit $?
fi

bin=$build/bench/mpi-coll-perf
lib=$build/adapters/mpi/libweft_mpi.so
[ -x "$bin" ] || { echo "run.sh: no $bin (cmake --build $build --target mpi-coll-perf)" >&2; exit 2; }
[ -f "$lib" ] || { echo "run.sh: no $lib (cmake --build $build --target weft_mpi)" >&2; exit 2; }
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
[ -n "$out" ] || out=$(mktemp -d /tmp/mpi-coll-perf.XXXXXX)
mkdir -p "$out"
[ $# -gt 0 ] || set -- -b 8 -e 16M -r 3

export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
# No weft setting from the caller's environment leaks into a mode.
unset LD_PRELOAD WEFT_MPI WEFT_MPI_COLLS WEFT_MPI_MIN_BYTES WEFT_MPI_STATS

{
    [ -f "$out/meta.txt" ] && cat "$out/meta.txt"
    echo "Commands: bench/mpi/run.sh --np \"$nps\" --colls \"$colls\" --runs $runs -- $*"
    echo "($(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'), $(basename "$build"))."
    echo "Load at the start: $(uptime | sed 's/.*load average/load average/')."
} > "$out/meta.txt.new"
mv "$out/meta.txt.new" "$out/meta.txt"
echo "run.sh: logs in $out" >&2

rotate() { # the first word moved to the end
    set -- $1
    first=$1; shift
    echo "$* $first"
}

order=$modes
for np in $nps; do
    for coll in $colls; do
        # Runs already in $out (an earlier invocation) are kept: these follow them.
        i=$(($(ls "$out" | grep -c "^np$np\.$coll\.mpi\." || true) + 1))
        first=$i last=$((i + runs - 1))
        while [ "$i" -le "$last" ]; do
            for mode in $order; do
                log=$out/np$np.$coll.$mode.$i.log
                # WEFT_MPI_STATS in this invocation's first run only: its
                # counter is one more atomic per call, which the others do not pay.
                stats=
                [ "$i" -gt "$first" ] || stats="-x WEFT_MPI_STATS=1"
                case $mode in
                mpi) env= ;;
                weft) env="-x LD_PRELOAD=$lib $stats" ;;
                min0) env="-x LD_PRELOAD=$lib $stats -x WEFT_MPI_MIN_BYTES=0" ;;
                esac
                echo "run.sh: np $np $coll $mode run $i" >&2
                rc=0
                # shellcheck disable=SC2086
                mpirun -np "$np" --oversubscribe --bind-to none $env "$bin" -c "$coll" "$@" \
                    > "$log" 2>&1 || rc=$?
                echo "# exit $rc" >> "$log"
                echo "# load $(cut -d' ' -f1 /proc/loadavg)" >> "$log"
                [ "$rc" -eq 0 ] || echo "run.sh: np $np $coll $mode run $i: exit $rc (see $log)" >&2
            done
            order=$(rotate "$order")
            i=$((i + 1))
        done
    done
done
echo "Load at the end: $(uptime | sed 's/.*load average/load average/')." >> "$out/meta.txt"
render "$out"
