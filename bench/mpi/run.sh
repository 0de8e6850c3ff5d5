#!/bin/sh
# mpi-coll-perf with and without the PMPI drop-in (libweft_mpi.so), one job
# after the other, and markdown tables of the ratio (docs/benchmarks.md,
# "PMPI drop-in (MPI programs, preloaded)").
#
#   bench/mpi/run.sh [options] [-- mpi-coll-perf options]
#     --build DIR    build dir holding bench/mpi-coll-perf and
#                    adapters/mpi/libweft_mpi.so ($WEFT_BUILD, else <repo>/build)
#     --np "2 4 8"   process counts (mpirun --oversubscribe --bind-to none)
#     --colls "allgather bcast allreduce alltoall"
#     --runs N       mpirun jobs per mode, collective and np (3); the table
#                    shows the median over them of each job's median
#     --no-min0      skip the WEFT_MPI_MIN_BYTES=0 mode
#     --out DIR      keep every job's output there (default: a new /tmp dir)
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
# Preloaded jobs run with WEFT_MPI_STATS=1; a job whose ranks did not report
# weft calls means the preload was not active, and the report says so.
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
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

render() {
    /usr/bin/python3 - "$1" <<'EOF'
import glob, os, re, statistics, sys

d = sys.argv[1]
jobs = {}      # (np, coll, mode) -> list of {size: (time, wrong)} per run
failed = []    # job logs with a non-zero exit
stats = {}     # (np, coll, mode) -> [weft calls, pmpi calls] of that collective
meta = open(os.path.join(d, "meta.txt")).read() if os.path.exists(os.path.join(d, "meta.txt")) else ""
name_re = re.compile(r"np(\d+)\.(\w+)\.(mpi|weft|min0)\.(\d+)\.log$")
for path in sorted(glob.glob(os.path.join(d, "*.log"))):
    m = name_re.search(path)
    if not m:
        continue
    np_, coll, mode, run = int(m[1]), m[2], m[3], int(m[4])
    rows, rc = {}, None
    st = stats.setdefault((np_, coll, mode), [0, 0])
    for line in open(path, errors="replace"):
        f = line.split()
        if line.startswith("# exit "):
            rc = int(f[2])
        elif len(f) >= 13 and f[0] == coll and not line.startswith("#"):
            rows[int(f[1])] = (float(f[6]), int(f[9]))
        elif line.startswith("weft_mpi: rank"):
            mm = re.search(r"\b%s weft=(\d+) pmpi=(\d+)" % coll, line)
            if mm:
                st[0] += int(mm[1]); st[1] += int(mm[2])
    if rc != 0:
        failed.append("%s (exit %s)" % (os.path.basename(path), rc))
    jobs.setdefault((np_, coll, mode), []).append(rows)

def human(b):
    for unit, sh in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << sh and b % (1 << sh) == 0:
            return "%d %s" % (b >> sh, unit)
    return "%d B" % b

def fmt_t(t):
    return "%.1f" % t if t < 1000 else "%.0f" % t

def summary(np_, coll, mode):
    """size -> (median time, per-run times, wrong total)"""
    res = {}
    for rows in jobs.get((np_, coll, mode), []):
        for s, (t, w) in rows.items():
            e = res.setdefault(s, [[], 0])
            e[0].append(t); e[1] += w
    return {s: (statistics.median(v[0]), v[0], v[1]) for s, v in res.items()}

def paired_range(a, b):
    """min-max over runs of run i's time a / time b (the jobs of one run ran back to back)."""
    r = [x / y for x, y in zip(a, b) if y > 0]
    return "%.2f-%.2f" % (min(r), max(r)) if len(r) > 1 else ""

nps = sorted({k[0] for k in jobs})
colls = [c for c in ("allgather", "bcast", "allreduce", "alltoall") if any(k[1] == c for k in jobs)]
have_min0 = any(k[2] == "min0" for k in jobs)
bad = bool(failed)
if meta:
    print(meta.rstrip() + "\n")
print("Time: us per call, slowest rank, median over the jobs of each job's median over its repeats.")
print("Ratio: MPI time / preloaded time (above 1: faster with weft); range: the same ratio per run")
print("(each run's jobs ran back to back).\n")
ratios = {}    # (np, coll, mode) -> {size: ratio}
for np_ in nps:
    for coll in colls:
        base = summary(np_, coll, "mpi")
        wd = summary(np_, coll, "weft")
        w0 = summary(np_, coll, "min0") if have_min0 else {}
        if not base:
            continue
        print("### np %d, %s\n" % (np_, coll))
        hdr = "| size | MPI us | weft us | ratio | range |"
        sep = "|---|---|---|---|---|"
        if have_min0:
            hdr += " weft, MIN_BYTES=0, us | ratio | range |"
            sep += "---|---|---|"
        print(hdr + " #wrong |")
        print(sep + "---|")
        for s in sorted(base):
            t, tl, wrong = base[s]
            cells = ["%s" % human(s), fmt_t(t)]
            for mode, dd in (("weft", wd), ("min0", w0)):
                if mode == "min0" and not have_min0:
                    continue
                if s in dd:
                    r = t / dd[s][0] if dd[s][0] > 0 else float("inf")
                    ratios.setdefault((np_, coll, mode), {})[s] = r
                    cells += [fmt_t(dd[s][0]), "%.2f" % r, paired_range(tl, dd[s][1])]
                    wrong += dd[s][2]
                else:
                    cells += ["-", "-", ""]
            if wrong:
                bad = True
            print("| " + " | ".join(cells) + " | %d |" % wrong)
        for mode in ("weft", "min0"):
            st = stats.get((np_, coll, mode))
            if st is None or not jobs.get((np_, coll, mode)):
                continue
            print("\n%s: %s calls, summed over ranks and jobs: weft=%d pmpi=%d%s" % (
                "default thresholds" if mode == "weft" else "WEFT_MPI_MIN_BYTES=0",
                coll, st[0], st[1],
                "  ** NO weft call: the preload was not active **" if st[0] == 0 else ""))
            if st[0] == 0:
                bad = True
        print()

if have_min0:
    print("### Crossover with WEFT_MPI_MIN_BYTES=0\n")
    print("The smallest size from which the preloaded job is faster (ratio > 1) at that size and every")
    print("larger one, per np; in brackets the same in the unit WEFT_MPI_MIN_BYTES compares (allgather,")
    print("alltoall: bytes per peer = size / np; bcast, allreduce: the message). 'none': slower at 16 MiB")
    print("or some large size.\n")
    print("| collective | " + " | ".join("np %d" % n for n in nps) + " |")
    print("|---|" + "---|" * len(nps))
    for coll in colls:
        cells = []
        for np_ in nps:
            r = ratios.get((np_, coll, "min0"), {})
            cross = None
            for s in sorted(r, reverse=True):
                if r[s] > 1.0:
                    cross = s
                else:
                    break
            if cross is None:
                cells.append("none")
            else:
                unit = cross // np_ if coll in ("allgather", "alltoall") else cross
                cells.append("%s (%s)" % (human(cross), human(unit)))
        print("| %s | %s |" % (coll, " | ".join(cells)))
    print()

print("### Against the targets (default thresholds)\n")
print("Never slower than MPI alone by more than 5% (ratio >= 0.95 at every size); at least 1.3x from")
print("64 KiB at np 4 and 8.\n")
print("| collective | np | lowest ratio (size) | sizes below 0.95 | lowest ratio from 64 KiB | >= 1.3x from 64 KiB |")
print("|---|---|---|---|---|---|")
for coll in colls:
    for np_ in nps:
        r = ratios.get((np_, coll, "weft"), {})
        if not r:
            continue
        lo = min(r, key=r.get)
        below = [human(s) for s in sorted(r) if r[s] < 0.95]
        big = {s: v for s, v in r.items() if s >= 65536}
        if big:
            lob = min(big, key=big.get)
            lob_s = "%.2f (%s)" % (big[lob], human(lob))
            met = "yes" if big[lob] >= 1.3 else "no (%d of %d sizes)" % (
                sum(v < 1.3 for v in big.values()), len(big))
            if np_ not in (4, 8):
                met += " (not a target at np %d)" % np_
        else:
            lob_s, met = "-", "-"
        print("| %s | %d | %.2f (%s) | %s | %s | %s |" % (
            coll, np_, r[lo], human(lo), ", ".join(below) if below else "none", lob_s, met))
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
    echo "Commands: bench/mpi/run.sh --np \"$nps\" --colls \"$colls\" --runs $runs -- $*"
    echo "($(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'), $(basename "$build"))."
    echo "Load at the start: $(uptime | sed 's/.*load average/load average/')."
} > "$out/meta.txt"
echo "run.sh: logs in $out" >&2

rotate() { # the first word moved to the end
    set -- $1
    first=$1; shift
    echo "$* $first"
}

order=$modes
for np in $nps; do
    for coll in $colls; do
        i=1
        while [ "$i" -le "$runs" ]; do
            for mode in $order; do
                log=$out/np$np.$coll.$mode.$i.log
                case $mode in
                mpi) env= ;;
                weft) env="-x LD_PRELOAD=$lib -x WEFT_MPI_STATS=1" ;;
                min0) env="-x LD_PRELOAD=$lib -x WEFT_MPI_STATS=1 -x WEFT_MPI_MIN_BYTES=0" ;;
                esac
                echo "run.sh: np $np $coll $mode run $i" >&2
                rc=0
                # shellcheck disable=SC2086
                mpirun -np "$np" --oversubscribe --bind-to none $env "$bin" -c "$coll" "$@" \
                    > "$log" 2>&1 || rc=$?
                echo "# exit $rc" >> "$log"
                [ "$rc" -eq 0 ] || echo "run.sh: np $np $coll $mode run $i: exit $rc (see $log)" >&2
            done
            order=$(rotate "$order")
            i=$((i + 1))
        done
    done
done
echo "Load at the end: $(uptime | sed 's/.*load average/load average/')." >> "$out/meta.txt"
render "$out"
