#!/bin/sh
# weft's message pipes against TensorPipe, job by job interleaved, and
# markdown tables (docs/benchmarks.md, "Message pipes vs TensorPipe").
#
#   bench/pipe/run.sh [options] [-- options for both harnesses, e.g. -e 1m]
#     --build DIR    build dir holding bench/pipe-perf-weft and bench/pipe-perf-tp
#                    ($WEFT_BUILD, else <repo>/build)
#     --rounds N     rounds (3); every table shows the median over rounds of
#                    each job's median
#     --scale S      iterations x S (1; 0.1 for a quick look)
#     --out DIR      keep every job's output there (default: a new /tmp dir);
#                    jobs already there are kept and count in the tables
#     --report DIR   only print the tables of an earlier --out DIR
#
# A round runs these jobs, weft and TensorPipe alternating, so that both
# share the machine's noise (the order rotates from round to round):
#   weft shm           WEFT_TRANSPORTS=shm, callbacks run by weft_progress
#                      spun in the benchmark thread
#   TP shm+cma         TensorPipe, transport shm, channel cma
#   weft tcp           WEFT_TRANSPORTS=tcp
#   TP uv+basic        transport uv (TCP on 127.0.0.1), channel basic
#   weft shm+thread    WEFT_PROGRESS_THREAD=1 (callbacks on weft's thread,
#                      main thread on a condition variable): latency, 1 tensor
#   TP shm+basic       transport shm, channel basic
#   weft p2p-shm       weft_isend/weft_irecv of the same bytes (reference)
#   TP uv+mpt4         transport uv, channel mpt over 4 uv lanes (as weft's
#                      WEFT_TCP_STREAMS=4)
#   weft p2p-tcp       the reference over TCP
# weft runs under mpirun -np 2 --bind-to none (TensorPipe's two processes are
# not bound either). A job that fails (non-zero exit, "DATA CHECK FAILED") is
# run once more; the report lists every failure.
# Exit status: 1 if a job failed twice.
set -e
here=$(cd "$(dirname "$0")" && pwd)
build=${WEFT_BUILD:-$here/../../build}
rounds=3
scale=1
out=
report=
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

render() {
    /usr/bin/python3 - "$1" <<'EOF'
import glob, os, re, statistics, sys

d = sys.argv[1]
KiB, MiB = 1024, 1024 * 1024
vals = {}      # (lib, conf, size, tensors) -> [(lat, bw)] one per job
loads, failed, heads = [], [], {}
for path in sorted(glob.glob(os.path.join(d, "*.log"))):
    name = os.path.basename(path)
    rc = None
    rows = []
    for line in open(path, errors="replace"):
        if line.startswith("# exit "):
            rc = int(line.split()[2])
        elif line.startswith("# pipe_perf_"):
            m = re.search(r"load=([0-9.]+)", line)
            if m:
                loads.append(float(m[1]))
            c = re.search(r"conf=(\S+)", line)
            if c:
                heads.setdefault(c[1], line.strip()[2:])
        elif line.startswith("row "):
            kv = dict(f.split("=", 1) for f in line.split()[1:])
            rows.append(kv)
    if rc != 0:
        failed.append(f"{name} (exit {rc})")
        continue
    for kv in rows:
        key = (kv["lib"], kv["conf"], int(kv["size"]), int(kv["tensors"]))
        vals.setdefault(key, []).append((float(kv["lat_us"]), float(kv["bw_GBps"])))

def med(key, i):
    v = [x[i] for x in vals.get(key, []) if x[i] > 0]
    return statistics.median(v) if v else None

def hsize(n):
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB" if n >= KiB else f"{n} B"

def f(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"

def lat(x):
    return "–" if x is None else f"{x:.1f}" if x >= 100 else f"{x:.2f}"

def ratio(a, b):
    return a / b if a is not None and b else None

confs = sorted({(k[0], k[1]) for k in vals}, key=lambda c: (c[0] != "weft", c[1]))
sizes = sorted({k[2] for k in vals})
tens = sorted({k[3] for k in vals})
nrounds = max((len(v) for v in vals.values()), default=0)
print(f"Rounds: up to {nrounds} per configuration; values are medians over rounds of each job's median.")
if loads:
    print(f"1-minute load at the jobs' start: {min(loads):.2f} .. {max(loads):.2f}")
print()
for lib, conf in confs:
    print(f"### {'weft' if lib == 'weft' else 'TensorPipe'} {conf}")
    print()
    if conf in heads:
        print(f"`{heads[conf]}`")
        print()
    print("| size | tensors | latency us | bandwidth GB/s |")
    print("|---:|---:|---:|---:|")
    for s in sizes:
        for t in tens:
            key = (lib, conf, s, t)
            if key in vals:
                print(f"| {hsize(s)} | {t} | {lat(med(key, 0))} | {f(med(key, 1))} |")
    print()

def best(confs_, s, t, i):
    """Best TensorPipe value among confs_: lowest latency (i=0), highest bandwidth (i=1)."""
    c = [(med(("tensorpipe", x, s, t), i), x) for x in confs_]
    c = [y for y in c if y[0] is not None]
    if not c:
        return None, None
    return min(c) if i == 0 else max(c)

def lat_target(s):
    return 0.2 if s <= 4 * KiB else 0.8 if s >= 64 * KiB else None

summary = []
for title, wconf, tps in (("shm", "shm", ["shm+cma", "shm+basic"]),
                          ("TCP", "tcp", ["uv+basic", "uv+mpt4"])):
    if not any(k[0] == "weft" and k[1] == wconf for k in vals):
        continue
    print(f"### Ratios, {title}: weft {wconf} / TensorPipe ({', '.join(tps)}; best = TensorPipe's best of them)")
    print()
    print("Latency ratio = weft / TP (target ≤ 0.2 up to 4 KiB, ≤ 0.8 from 64 KiB); "
          "bandwidth ratio = weft / TP (target ≥ 1.0 from 64 KiB).")
    print()
    hdr = "| size | tensors | weft lat us | best TP lat us | " + " | ".join(f"lat ÷ {x}" for x in tps) + \
          " | lat ÷ best | weft GB/s | best TP GB/s | " + " | ".join(f"bw ÷ {x}" for x in tps) + " | bw ÷ best |"
    print(hdr)
    print("|" + "---:|" * (hdr.count("|") - 1))
    met = missed = 0
    misses = []
    for s in sizes:
        for t in tens:
            wl, wb = med(("weft", wconf, s, t), 0), med(("weft", wconf, s, t), 1)
            if wl is None:
                continue
            bl, bln = best(tps, s, t, 0)
            bb, bbn = best(tps, s, t, 1)
            lr, br = ratio(wl, bl), ratio(wb, bb)
            lt = lat_target(s)
            lmark = bmark = ""
            if lt is not None and lr is not None:
                ok = lr <= lt
                lmark = " ✓" if ok else " ✗"
                met, missed = met + ok, missed + (not ok)
                if not ok:
                    misses.append(f"latency {hsize(s)}×{t}: {lr:.2f} (target ≤ {lt})")
            if s >= 64 * KiB and br is not None:
                ok = br >= 1.0
                bmark = " ✓" if ok else " ✗"
                met, missed = met + ok, missed + (not ok)
                if not ok:
                    misses.append(f"bandwidth {hsize(s)}×{t}: {br:.2f} (target ≥ 1.0)")
            lcols = " | ".join(f(ratio(wl, med(("tensorpipe", x, s, t), 0)), 3) for x in tps)
            bcols = " | ".join(f(ratio(wb, med(("tensorpipe", x, s, t), 1)), 2) for x in tps)
            print(f"| {hsize(s)} | {t} | {lat(wl)} | {lat(bl)} ({bln}) | {lcols} | **{f(lr, 3)}**{lmark} | "
                  f"{f(wb)} | {f(bb)} ({bbn}) | {bcols} | **{f(br)}**{bmark} |")
    print()
    print(f"Targets over {title}: {met} met, {missed} missed" + (": " + "; ".join(misses) if misses else "") + ".")
    print()
    summary.append((title, met, missed))

# weft's pipes against weft's own point to point (same bytes, one buffer)
for wconf, pconf in (("shm", "p2p-shm"), ("tcp", "p2p-tcp")):
    if not any(k[1] == pconf for k in vals):
        continue
    print(f"### weft pipe ({wconf}) against weft_isend/weft_irecv ({pconf}), same bytes")
    print()
    print("Pipe ÷ p2p: latency ratio = pipe / p2p, bandwidth ratio = p2p / pipe (above 2: the pipe is slow).")
    print()
    print("| size | tensors | pipe lat us | p2p lat us | lat pipe ÷ p2p | pipe GB/s | p2p GB/s | bw p2p ÷ pipe |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        for t in tens:
            pl, pb = med(("weft", wconf, s, t), 0), med(("weft", wconf, s, t), 1)
            rl, rb = med(("weft", pconf, s, 1), 0), med(("weft", pconf, s, 1), 1)
            if pl is None or rl is None:
                continue
            a, b = ratio(pl, rl), ratio(rb, pb)
            fa = f(a) + (" ⚠" if a is not None and a > 2 else "")
            fb = f(b) + (" ⚠" if b is not None and b > 2 else "")
            print(f"| {hsize(s)} | {t} | {lat(pl)} | {lat(rl)} | {fa} | {f(pb)} | {f(rb)} | {fb} |")
    print()

if any(k[1] == "shm+thread" for k in vals):
    print("### shm latency with weft's progress thread (WEFT_PROGRESS_THREAD=1), 1 tensor")
    print()
    print("| size | weft spin us | weft thread us | best TP shm us | thread ÷ best TP |")
    print("|---:|---:|---:|---:|---:|")
    for s in sizes:
        th = med(("weft", "shm+thread", s, 1), 0)
        if th is None:
            continue
        sp = med(("weft", "shm", s, 1), 0)
        bl, bln = best(["shm+cma", "shm+basic"], s, 1, 0)
        print(f"| {hsize(s)} | {lat(sp)} | {lat(th)} | {lat(bl)} ({bln}) | {f(ratio(th, bl), 3)} |")
    print()

if failed:
    print("Failed jobs (not in the tables): " + ", ".join(failed))
else:
    print("Failed jobs: none.")
EOF
}

if [ -n "$report" ]; then
    render "$report"
    exit 0
fi

weft=$build/bench/pipe-perf-weft
tp=$build/bench/pipe-perf-tp
[ -x "$weft" ] || { echo "run.sh: $weft not built (cmake --build $build --target pipe-perf-weft)" >&2; exit 2; }
if [ ! -x "$tp" ]; then
    echo "run.sh: $tp not built (TensorPipe not found: apt-get install libtensorpipe-dev, re-run cmake); weft only" >&2
    tp=
fi
[ -n "$out" ] || out=$(mktemp -d /tmp/pipebench.XXXXXX)
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "commit: $(git -C "$here" rev-parse --short HEAD 2>/dev/null)$(git -C "$here" diff --quiet HEAD -- 2>/dev/null || echo ' (+ uncommitted changes)')"
    echo "rounds: $rounds scale: $scale extra: $*"
} >> "$out/meta.txt"

# job NAME: runs one configuration into $out/NAME.<round>.log
job() {
    name=$1
    shift
    log=$out/$name.$r.log
    [ -s "$log" ] && return 0
    for try in 1 2; do
        rc=0
        case $name in
        weft-shm) WEFT_TRANSPORTS=shm mpirun -np 2 --bind-to none -x WEFT_TRANSPORTS "$weft" -s "$scale" "$@" ;;
        weft-tcp) WEFT_TRANSPORTS=tcp mpirun -np 2 --bind-to none -x WEFT_TRANSPORTS "$weft" -s "$scale" "$@" ;;
        weft-shm-thread) WEFT_TRANSPORTS=shm WEFT_PROGRESS_THREAD=1 mpirun -np 2 --bind-to none \
                         -x WEFT_TRANSPORTS -x WEFT_PROGRESS_THREAD "$weft" -s "$scale" -m lat -k 1 "$@" ;;
        weft-p2p-shm) WEFT_TRANSPORTS=shm mpirun -np 2 --bind-to none -x WEFT_TRANSPORTS "$weft" -p p2p -s "$scale" "$@" ;;
        weft-p2p-tcp) WEFT_TRANSPORTS=tcp mpirun -np 2 --bind-to none -x WEFT_TRANSPORTS "$weft" -p p2p -s "$scale" "$@" ;;
        tp-shm-cma) "$tp" -t shm -c cma -s "$scale" "$@" ;;
        tp-shm-basic) "$tp" -t shm -c basic -s "$scale" "$@" ;;
        tp-uv-basic) "$tp" -t uv -c basic -s "$scale" "$@" ;;
        tp-uv-mpt) "$tp" -t uv -c mpt -L 4 -s "$scale" "$@" ;;
        esac > "$log.tmp" 2>&1 || rc=$?
        if grep -q "DATA CHECK FAILED" "$log.tmp"; then [ "$rc" -ne 0 ] || rc=1; fi
        echo "# exit $rc" >> "$log.tmp"
        if [ "$rc" -eq 0 ]; then
            mv "$log.tmp" "$log"
            return 0
        fi
        mv "$log.tmp" "$out/$name.$r.try$try.failed"
        echo "run.sh: $name round $r try $try failed (exit $rc): $out/$name.$r.try$try.failed" >&2
    done
    # Both tries failed: keep the failure in the report.
    cp "$out/$name.$r.try2.failed" "$log"
    status=1
}

weft_jobs="weft-shm weft-tcp weft-shm-thread weft-p2p-shm weft-p2p-tcp"
tp_jobs="tp-shm-cma tp-uv-basic tp-shm-basic tp-uv-mpt"
[ -n "$tp" ] || tp_jobs=
extra="$*"   # options for both harnesses (no spaces inside one)
status=0
r=1
while [ "$r" -le "$rounds" ]; do
    # weft, TP, weft, TP ...; both lists rotate by one each round.
    order=$(/usr/bin/python3 -c 'import sys
r, a, b = int(sys.argv[1]) - 1, sys.argv[2].split(), sys.argv[3].split()
a = a[r % len(a):] + a[:r % len(a)] if a else a
b = b[r % len(b):] + b[:r % len(b)] if b else b
out = []
for i in range(max(len(a), len(b))):
    out += a[i:i+1] + b[i:i+1]
print(" ".join(out))' "$r" "$weft_jobs" "$tp_jobs")
    for name in $order; do
        echo "run.sh: round $r/$rounds: $name" >&2
        # shellcheck disable=SC2086
        job "$name" $extra
    done
    r=$((r + 1))
done
echo "run.sh: logs in $out" >&2
render "$out"
exit $status
