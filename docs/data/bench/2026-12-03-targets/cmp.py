"""Per collective, np and size from LO to HI bytes: the median over the three
rounds of weft/MPI (same job), before -> after.  Run from this directory:
    python3 cmp.py 32768 2097152 > mid-sizes.txt
Each CSV is read by scripts/bench-targets' own read_ratios.
"""
import importlib.machinery
import importlib.util
import os
import statistics
import sys

here = os.path.dirname(os.path.abspath(__file__))
path = os.path.join(here, "../../../../scripts/bench-targets")
loader = importlib.machinery.SourceFileLoader("bench_targets", path)
spec = importlib.util.spec_from_loader("bench_targets", loader)
bt = importlib.util.module_from_spec(spec)
loader.exec_module(bt)

lo, hi = int(sys.argv[1]), int(sys.argv[2])
for kind in ["allreduce", "reduce", "reduce_scatter", "allgather", "gather", "alltoall", "bcast", "scatter"]:
    for np in (2, 4, 8):
        res = {}
        for side in ("before", "after"):
            for i in (1, 2, 3):
                ratios = bt.read_ratios(os.path.join(here, side, "round%d" % i, "%s-np%d.csv" % (kind, np)))
                for b, r in ratios.items():
                    if lo <= b <= hi:
                        res.setdefault((side, b), []).append(r)
        cells = " ".join("%dK %.2f>%.2f" % (b >> 10, statistics.median(res[("before", b)]),
                                           statistics.median(res[("after", b)]))
                         for b in sorted({b for (_, b) in res}))
        print("%-14s np%d" % (kind, np), cells)
