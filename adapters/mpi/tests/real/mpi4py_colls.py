#!/usr/bin/python3
"""The collectives libweft_mpi.so intercepts, called from mpi4py with numpy
buffers, every result checked exactly against values computed locally.

mpi4py is a real program not written here: its compiled module calls
MPI_Allreduce & co. itself, so with LD_PRELOAD=libweft_mpi.so the calls go
through the drop-in exactly as any Python user's would (mpi4py maps int32,
int64, float32, float64 to MPI_INT, MPI_LONG, MPI_FLOAT, MPI_DOUBLE).

Every rank's input is a known function of (rank, index), so each rank can
compute what every collective must return. The values are small integers:
float32/float64 sums, products, minima and maxima of them are exact whatever
order the ranks' contributions are combined in, so results are compared
with ==, not a tolerance.

Run twice per communicator: COMM_WORLD, and a Split of it whose rank order
is reversed (key = -rank) and, from 4 ranks on, whose members are every
other world rank (color = rank % 2), so sub-communicator ranks differ from
world ranks and a layer that confused them would fail.

Exit status: 0 when every check passed on this rank, 1 otherwise (mpirun
then fails). Each mismatch is printed with the call, communicator, type,
count, op, root and the first differing element.

Usage: mpirun -np N /usr/bin/python3 mpi4py_colls.py
"""
import sys
import time

import numpy as np
from mpi4py import MPI

DTYPES = (np.int32, np.int64, np.float32, np.float64)
# 1 element; odd sizes (no alignment to chunk or rank boundaries); one larger
# than weft's default thresholds (16 KiB) so the pipelined paths run too.
COUNTS = (1, 7, 1000, 20011)
OPS = (("SUM", MPI.SUM, np.sum), ("PROD", MPI.PROD, np.prod), ("MIN", MPI.MIN, np.min), ("MAX", MPI.MAX, np.max))

failures = 0
checks = 0
MAX_SHOWN = 20  # mismatches printed per rank (all are counted)


def fail(what, got, want):
    global failures
    failures += 1
    if failures > MAX_SHOWN:
        return
    bad = np.flatnonzero(np.asarray(got) != np.asarray(want))
    i = int(bad[0]) if bad.size else -1
    detail = "element %d: got %r, expected %r (%d elements differ)" % (
        i, got.flat[i].item() if i >= 0 else None, want.flat[i].item() if i >= 0 else None, bad.size)
    print("mpi4py_colls: world rank %d: MISMATCH %s: %s" % (MPI.COMM_WORLD.Get_rank(), what, detail),
          file=sys.stderr, flush=True)


def check(what, got, want):
    global checks
    checks += 1
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        fail(what, got, want)


def data(rank, count, dtype, kind):
    """Rank rank's input: count elements, small integers (exact in float32).
    kind "sum": 1..13 scaled by rank+1 (sum over 4 ranks <= 130);
    kind "prod": 1..3 (product over 4 ranks <= 81);
    kind "minmax": -5..5, signed, a different pattern on every rank."""
    i = np.arange(count, dtype=np.int64)
    if kind == "sum":
        v = (i % 13 + 1) * (rank + 1)
    elif kind == "prod":
        v = (i + rank) % 3 + 1
    else:
        v = (i * 7 + rank * 3) % 11 - 5
    return v.astype(dtype)


def kind_of(opname):
    return {"SUM": "sum", "PROD": "prod"}.get(opname, "minmax")


def expect_reduced(size, count, dtype, opname, npfn):
    stack = np.stack([data(r, count, dtype, kind_of(opname)) for r in range(size)])
    return npfn(stack, axis=0).astype(dtype)


def test_allreduce(comm, name):
    rank, size = comm.Get_rank(), comm.Get_size()
    for dtype in DTYPES:
        for count in COUNTS:
            for opname, op, npfn in OPS:
                want = expect_reduced(size, count, dtype, opname, npfn)
                tag = "Allreduce %s %s count=%d %s" % (name, np.dtype(dtype).name, count, opname)
                send = data(rank, count, dtype, kind_of(opname))
                recv = np.full(count, -7, dtype=dtype)
                comm.Allreduce(send, recv, op=op)
                check(tag, recv, want)
                check(tag + " (send buffer unchanged)", send, data(rank, count, dtype, kind_of(opname)))
                buf = data(rank, count, dtype, kind_of(opname))
                comm.Allreduce(MPI.IN_PLACE, buf, op=op)
                check(tag + " in place", buf, want)


def test_reduce(comm, name):
    rank, size = comm.Get_rank(), comm.Get_size()
    for root in sorted({0, size - 1}):
        for dtype in DTYPES:
            for count in COUNTS:
                for opname, op, npfn in OPS:
                    want = expect_reduced(size, count, dtype, opname, npfn)
                    tag = "Reduce %s root=%d %s count=%d %s" % (name, root, np.dtype(dtype).name, count, opname)
                    send = data(rank, count, dtype, kind_of(opname))
                    recv = np.full(count, -7, dtype=dtype)
                    comm.Reduce(send, recv, op=op, root=root)
                    if rank == root:
                        check(tag, recv, want)
                    else:
                        # Not significant off the root: MPI must leave it alone.
                        check(tag + " (non-root recv untouched)", recv, np.full(count, -7, dtype=dtype))
                    # In place at the root (MPI.IN_PLACE is only valid there).
                    buf = data(rank, count, dtype, kind_of(opname))
                    if rank == root:
                        comm.Reduce(MPI.IN_PLACE, buf, op=op, root=root)
                        check(tag + " in place", buf, want)
                    else:
                        comm.Reduce(buf, None, op=op, root=root)


def test_reduce_scatter_block(comm, name):
    rank, size = comm.Get_rank(), comm.Get_size()
    for dtype in DTYPES:
        for count in COUNTS:
            for opname, op, npfn in OPS:
                full = expect_reduced(size, count * size, dtype, opname, npfn)
                want = full[rank * count:(rank + 1) * count]
                tag = "Reduce_scatter_block %s %s count=%d %s" % (name, np.dtype(dtype).name, count, opname)
                send = data(rank, count * size, dtype, kind_of(opname))
                recv = np.full(count, -7, dtype=dtype)
                comm.Reduce_scatter_block(send, recv, op=op)
                check(tag, recv, want)


def test_allgather(comm, name):
    rank, size = comm.Get_rank(), comm.Get_size()
    for dtype in DTYPES:
        for count in COUNTS:
            tag = "Allgather %s %s count=%d" % (name, np.dtype(dtype).name, count)
            send = data(rank, count, dtype, "sum")
            recv = np.full(count * size, -7, dtype=dtype)
            comm.Allgather(send, recv)
            want = np.concatenate([data(r, count, dtype, "sum") for r in range(size)])
            check(tag, recv, want)


def test_bcast(comm, name):
    rank, size = comm.Get_rank(), comm.Get_size()
    for root in range(size):
        for dtype in DTYPES:
            for count in COUNTS:
                tag = "Bcast %s root=%d %s count=%d" % (name, root, np.dtype(dtype).name, count)
                want = data(root, count, dtype, "minmax")
                buf = want.copy() if rank == root else np.full(count, -7, dtype=dtype)
                comm.Bcast(buf, root=root)
                check(tag, buf, want)


def a2a_block(src, dst, count, dtype):
    # What src sends to dst: a pattern unique to the (src, dst) pair.
    i = np.arange(count, dtype=np.int64)
    return ((i * 5 + src * 31 + dst * 7) % 97).astype(dtype)


def test_alltoall(comm, name):
    rank, size = comm.Get_rank(), comm.Get_size()
    for dtype in DTYPES:
        for count in COUNTS:
            tag = "Alltoall %s %s count=%d" % (name, np.dtype(dtype).name, count)
            send = np.concatenate([a2a_block(rank, d, count, dtype) for d in range(size)])
            recv = np.full(count * size, -7, dtype=dtype)
            comm.Alltoall(send, recv)
            want = np.concatenate([a2a_block(s, rank, count, dtype) for s in range(size)])
            check(tag, recv, want)


def test_gather_scatter(comm, name):
    """Gather and Scatter at two roots: the root's n blocks hold each rank's
    block at its place; the other ranks' receive buffers stay as they were."""
    rank, size = comm.Get_rank(), comm.Get_size()
    for root in sorted({0, size - 1}):
        for dtype in DTYPES:
            for count in COUNTS:
                what = "%s root=%d %s count=%d" % (name, root, np.dtype(dtype).name, count)
                recv = np.full(count * size, -7, dtype=dtype)
                comm.Gather(a2a_block(rank, root, count, dtype), recv, root=root)
                want = np.concatenate([a2a_block(s, root, count, dtype) for s in range(size)]) \
                    if rank == root else np.full(count * size, -7, dtype=dtype)
                check("Gather " + what, recv, want)
                send = np.concatenate([a2a_block(root, d, count, dtype) for d in range(size)]) \
                    if rank == root else None
                got = np.full(count, -7, dtype=dtype)
                comm.Scatter(send, got, root=root)
                check("Scatter " + what, got, a2a_block(root, rank, count, dtype))


def test_barrier(comm, name):
    """No rank may leave a barrier before every rank has entered it. Each
    rank in turn arrives late (sleeps first); every rank notes when it
    entered and left (CLOCK_MONOTONIC: one clock for every process of this
    single-host run), and the latest entry must precede the earliest exit."""
    global checks, failures
    rank, size = comm.Get_rank(), comm.Get_size()
    for late in range(size):
        if rank == late:
            time.sleep(0.2)
        entered = time.monotonic()
        comm.Barrier()
        left = time.monotonic()
        times = np.zeros(2 * size, dtype=np.float64)
        comm.Allgather(np.array([entered, left]), times)
        checks += 1
        last_in, first_out = times[0::2].max(), times[1::2].min()
        if last_in > first_out:
            failures += 1
            print("mpi4py_colls: world rank %d: MISMATCH Barrier %s late rank %d: a rank left at %.6f before "
                  "the last entered at %.6f" % (MPI.COMM_WORLD.Get_rank(), name, late, first_out, last_in),
                  file=sys.stderr, flush=True)


def run_all(comm, name):
    test_barrier(comm, name)
    test_allgather(comm, name)
    test_bcast(comm, name)
    test_allreduce(comm, name)
    test_reduce(comm, name)
    test_reduce_scatter_block(comm, name)
    test_alltoall(comm, name)
    test_gather_scatter(comm, name)
    comm.Barrier()


def main():
    global checks, failures
    world = MPI.COMM_WORLD
    wrank, wsize = world.Get_rank(), world.Get_size()
    start = time.monotonic()
    run_all(world, "COMM_WORLD")

    color = wrank % 2 if wsize >= 4 else 0
    sub = world.Split(color, -wrank)
    # The split must reverse the order within each color.
    members = [r for r in range(wsize) if (r % 2 if wsize >= 4 else 0) == color]
    checks += 1
    if sub.Get_size() != len(members) or sub.Get_rank() != len(members) - 1 - members.index(wrank):
        failures += 1
        print("mpi4py_colls: world rank %d: MISMATCH Split: size %d rank %d" % (wrank, sub.Get_size(),
              sub.Get_rank()), file=sys.stderr, flush=True)
    run_all(sub, "split(color=%d,size=%d)" % (color, sub.Get_size()))
    sub.Free()

    # Every rank's verdict, so rank 0's summary line speaks for the job.
    totals = np.zeros(2, dtype=np.int64)
    world.Allreduce(np.array([checks, failures], dtype=np.int64), totals, op=MPI.SUM)
    if wrank == 0:
        print("mpi4py_colls: %d ranks, %d checks, %d failed (%.1f s)" % (
            wsize, totals[0], totals[1], time.monotonic() - start), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
