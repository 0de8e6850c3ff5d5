#!/usr/bin/python3
"""Checks the WEFT_MPI_STATS=1 lines of a preloaded run.

libweft_mpi.so prints, at MPI_Finalize on each rank, how many calls of each
intercepted collective went to weft and how many to PMPI:
    weft_mpi: rank R: allgather weft=N pmpi=M bcast weft=N pmpi=M ...
(the pairs may also come one per line; both are read).

Usage: check_stats.py LOG NP COLL...
Passes when all NP ranks printed their counts and every COLL was served by
weft at least once on every rank: proof that the program's calls went
through the drop-in and weft, not straight to MPI. Prints the totals.
"""
import re
import sys

LINE = re.compile(r"weft_mpi: rank (\d+):(.*)$")
PAIR = re.compile(r"([a-z_]+) weft=(\d+) pmpi=(\d+)")


def main():
    if len(sys.argv) < 4:
        print("usage: check_stats.py LOG NP COLL...", file=sys.stderr)
        return 2
    log, np_, want = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    counts = {}  # rank -> coll -> (weft, pmpi)
    with open(log, errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if not m:
                continue
            rank = int(m.group(1))
            for coll, w, p in PAIR.findall(m.group(2)):
                counts.setdefault(rank, {})[coll] = (int(w), int(p))
    ok = True
    missing = sorted(set(range(np_)) - set(counts))
    if missing:
        print("check_stats: no WEFT_MPI_STATS line from rank(s) %s of %d (was the library preloaded, did "
              "MPI_Finalize run?)" % (missing, np_), file=sys.stderr)
        ok = False
    colls = sorted({c for per in counts.values() for c in per})
    for coll in colls:
        w = sum(per.get(coll, (0, 0))[0] for per in counts.values())
        p = sum(per.get(coll, (0, 0))[1] for per in counts.values())
        print("  stats np %d: %-20s weft=%-7d pmpi=%d (all ranks)" % (np_, coll, w, p))
    for coll in want:
        for rank in range(np_):
            if rank not in counts:
                continue
            w = counts[rank].get(coll, (0, 0))[0]
            if w == 0:
                print("check_stats: rank %d: no %s call was served by weft (weft=0)" % (rank, coll),
                      file=sys.stderr)
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
