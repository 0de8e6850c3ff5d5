"""Tests of the "weft" torch.distributed backend (adapters/torch).

Run: PYTHONPATH=<build>/adapters/torch /usr/bin/python3 -m pytest -q adapters/torch/tests
(ctest -L torch does that). Each test spawns 2-4 processes with
torch.multiprocessing, meeting through a file:// store (one test uses env://
as torchrun sets it up). Results are checked against the same operation over
gloo in the same processes, or against values computed here; the error tests
check weft's text reaches the RuntimeError.
"""

import datetime
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The tests check that a group's timeout becomes WEFT_TIMEOUT, which happens
# only when the user did not set it; a value inherited from a CI job would
# also make the timeout test wait that long.
os.environ.pop("WEFT_TIMEOUT", None)
import weft_torch  # noqa: E402

# Gloo (the reference) on loopback, whatever the machine's host name says.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("OMP_NUM_THREADS", "1")


# ---------------------------------------------------------------- harness

def _worker(rank, size, path, fn, timeout_s, args):
    torch.set_num_threads(1)
    dist.init_process_group("weft", init_method="file://" + path, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        fn(rank, size, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn, size, *args, timeout_s=60):
    """Runs fn(rank, size, *args) on `size` processes of one weft group; a
    failure on any rank fails the test with that rank's traceback."""
    fd, path = tempfile.mkstemp(prefix="weft_torch_")
    os.close(fd)
    os.unlink(path)
    try:
        mp.spawn(_worker, args=(size, path, fn, timeout_s, args), nprocs=size, join=True)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def data(rank, n, dtype=torch.float32, salt=0):
    """Small integers (exact in every dtype, products of up to 4 ranks fit
    int8) that differ per rank and per element."""
    v = (torch.arange(n, dtype=torch.int64) * 3 + rank * 5 + salt) % 4 + 1
    if dtype == torch.bool:
        return v % 2 == 0
    if dtype.is_complex:
        return torch.complex(v.float(), -v.float()).to(dtype)
    return v.to(dtype)


def gloo_group(size):
    return dist.new_group(list(range(size)), backend="gloo")


def assert_same(a, b, what):
    assert a.dtype == b.dtype, what
    assert torch.equal(a, b), "%s:\n%s\n!=\n%s" % (what, a, b)


# ------------------------------------------------------------ collectives

def _collectives_vs_gloo(rank, size):
    gloo = gloo_group(size)
    n = 37
    assert dist.get_backend() == "weft"

    def both(op):
        """op(group) on weft and on gloo; returns both results."""
        return op(None), op(gloo)

    # broadcast from every root
    for root in range(size):
        def bc(g):
            t = data(rank, n, salt=root)
            dist.broadcast(t, root, group=g)
            return t
        w, g = both(bc)
        assert_same(w, g, "broadcast root %d" % root)
        assert_same(w, data(root, n, salt=root), "broadcast root %d value" % root)

    # allreduce, every op gloo has
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        for dtype in (torch.float32, torch.int64):
            def ar(g):
                t = data(rank, n, dtype)
                dist.all_reduce(t, op=op, group=g)
                return t
            w, g = both(ar)
            assert_same(w, g, "allreduce %s %s" % (op, dtype))

    # reduce at every root (only the root's tensor is defined after it)
    for root in range(size):
        def rd(g):
            t = data(rank, n)
            dist.reduce(t, root, op=dist.ReduceOp.SUM, group=g)
            return t
        w, g = both(rd)
        if rank == root:
            assert_same(w, g, "reduce root %d" % root)
        else:
            assert_same(w, data(rank, n), "reduce: a non-root tensor is left as it was")

    # all_gather (list) and all_gather_into_tensor (_allgather_base)
    def ag(g):
        out = [torch.zeros(n) for _ in range(size)]
        dist.all_gather(out, data(rank, n), group=g)
        return torch.stack(out)
    w, g = both(ag)
    assert_same(w, g, "all_gather")
    assert_same(w, torch.stack([data(r, n) for r in range(size)]), "all_gather value")

    out = torch.zeros(size * n)
    dist.all_gather_into_tensor(out, data(rank, n))
    assert_same(out, torch.cat([data(r, n) for r in range(size)]), "all_gather_into_tensor")

    # all_gather_coalesced: outputs[r][k] = rank r's input k
    def agc(g):
        ins = [data(rank, 5), data(rank, 3, salt=1)]
        outs = [[torch.zeros(5), torch.zeros(3)] for _ in range(size)]
        dist.all_gather_coalesced(outs, ins, group=g)
        return torch.cat([torch.cat(o) for o in outs])
    w, g = both(agc)
    assert_same(w, g, "all_gather_coalesced")

    # reduce_scatter (list) and reduce_scatter_tensor (_reduce_scatter_base):
    # gloo 1.13 has neither, so the reference is computed.
    ins = [data(rank, n, salt=j) for j in range(size)]
    out = torch.zeros(n)
    dist.reduce_scatter(out, ins, op=dist.ReduceOp.SUM)
    assert_same(out, sum(data(r, n, salt=rank) for r in range(size)), "reduce_scatter")
    flat = torch.cat(ins)
    out = torch.zeros(n)
    dist.reduce_scatter_tensor(out, flat, op=dist.ReduceOp.MAX)
    assert_same(out, torch.stack([data(r, n, salt=rank) for r in range(size)]).max(0).values,
                "reduce_scatter_tensor MAX")

    # all_to_all_single, equal blocks (weft_alltoall) and uneven splits
    def a2a(g):
        inp = torch.arange(size * 4, dtype=torch.float32) + 100 * rank
        out = torch.zeros(size * 4)
        dist.all_to_all_single(out, inp, group=g)
        return out
    w, g = both(a2a)
    assert_same(w, g, "all_to_all_single equal")
    # rank r sends (r + j + 1) rows of 2 to rank j
    in_splits = [rank + j + 1 for j in range(size)]
    out_splits = [j + rank + 1 for j in range(size)]
    def a2av(g):
        inp = torch.arange(sum(in_splits) * 2, dtype=torch.float32).view(-1, 2) + 1000 * rank
        out = torch.zeros(sum(out_splits), 2)
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=g)
        return out
    w, g = both(a2av)
    assert_same(w, g, "all_to_all_single uneven")

    # split sizes with empty blocks (weft_alltoallv moves them as empty
    # messages): rank r sends rank j nothing when r + j is odd; the value
    # is computed (every rank's input is known)
    def splits0(r):
        return [0 if (r + j) % 2 else r + j + 1 for j in range(size)]
    def inp0(r):
        return torch.arange(sum(splits0(r)) * 2, dtype=torch.float32).view(-1, 2) + 1000 * r
    out = torch.zeros(sum(splits0(rank)), 2)
    dist.all_to_all_single(out, inp0(rank), splits0(rank), splits0(rank))
    exp = torch.cat([inp0(j).narrow(0, sum(splits0(j)[:rank]), splits0(j)[rank]) for j in range(size)])
    assert_same(out, exp, "all_to_all_single with empty splits")
    # split sizes, one tensor for input and output (weft_alltoallv has no
    # in-place form: the backend sends from a copy)
    t = torch.arange(size * 3, dtype=torch.float32) + 100 * rank
    dist.all_to_all_single(t, t, [3] * size, [3] * size)
    assert_same(t, torch.cat([torch.arange(3 * rank, 3 * rank + 3, dtype=torch.float32) + 100 * j
                              for j in range(size)]), "all_to_all_single splits, input is output")

    # all_to_all (lists, uneven sizes); gloo 1.13 lacks it
    ins = [torch.full((rank + j + 1,), float(10 * rank + j)) for j in range(size)]
    outs = [torch.zeros(j + rank + 1) for j in range(size)]
    dist.all_to_all(outs, ins)
    for j in range(size):
        assert_same(outs[j], torch.full((j + rank + 1,), float(10 * j + rank)), "all_to_all from %d" % j)

    # gather and scatter at every root
    for root in range(size):
        def ga(g):
            lst = [torch.zeros(n) for _ in range(size)] if rank == root else None
            dist.gather(data(rank, n, salt=root), lst, dst=root, group=g)
            return torch.stack(lst) if rank == root else torch.zeros(0)
        w, g = both(ga)
        assert_same(w, g, "gather root %d" % root)

        def sc(g):
            lst = [data(j, n, salt=root) for j in range(size)] if rank == root else None
            out = torch.zeros(n)
            dist.scatter(out, lst, src=root, group=g)
            return out
        w, g = both(sc)
        assert_same(w, g, "scatter root %d" % root)
        assert_same(w, data(rank, n, salt=root), "scatter root %d value" % root)

    dist.barrier()


@pytest.mark.parametrize("size", [2, 3, 4])
def test_collectives_match_gloo(size):
    spawn(_collectives_vs_gloo, size)


# ------------------------------------------------------------ dtypes

REDUCED = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int32, torch.int64]
OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
       "MAX": dist.ReduceOp.MAX, "AVG": dist.ReduceOp.AVG}


def _expected(name, stack, size):
    # In float64, exact for these small integers (CPU torch lacks some
    # reductions for float16); then back to the tensors' dtype.
    d = stack.to(torch.float64)
    if name == "SUM":
        r = d.sum(0)
    elif name == "PRODUCT":
        r = d.prod(0)
    elif name == "MIN":
        r = d.min(0).values
    elif name == "MAX":
        r = d.max(0).values
    elif stack.dtype.is_floating_point:
        r = d.sum(0) / size  # AVG: a sum divided once by the number of ranks
    else:
        r = torch.div(d.sum(0), size, rounding_mode="trunc")  # integers truncated
    return r.to(stack.dtype)


def _allreduce_every_dtype(rank, size):
    n = 1000
    for dtype in REDUCED:
        for name, op in OPS.items():
            t = data(rank, n, dtype)
            dist.all_reduce(t, op=op)
            exp = _expected(name, torch.stack([data(r, n, dtype) for r in range(size)]), size)
            assert t.dtype == dtype
            if name == "AVG" and dtype in (torch.float16, torch.bfloat16):
                assert torch.allclose(t.float(), exp.float(), rtol=1e-2), "allreduce %s %s" % (name, dtype)
            else:
                assert_same(t, exp, "allreduce %s %s" % (name, dtype))
        # the other reducing operations take every dtype too
        t = data(rank, n, dtype)
        dist.reduce(t, 0, op=dist.ReduceOp.MAX)
        if rank == 0:
            assert_same(t, torch.stack([data(r, n, dtype) for r in range(size)]).max(0).values,
                        "reduce MAX %s" % dtype)
        out = torch.zeros(n, dtype=dtype)
        dist.reduce_scatter_tensor(out, torch.cat([data(rank, n, dtype, salt=j) for j in range(size)]))
        assert_same(out, _expected("SUM", torch.stack([data(r, n, dtype, salt=rank) for r in range(size)]), size),
                    "reduce_scatter_tensor %s" % dtype)


@pytest.mark.parametrize("size", [2, 3])
def test_allreduce_every_dtype(size):
    spawn(_allreduce_every_dtype, size)


MOVED = [torch.bool, torch.int16, torch.complex64, torch.complex128, torch.float16, torch.bfloat16,
         torch.uint8, torch.float64]


def _data_movement_every_dtype(rank, size):
    n = 19
    for dtype in MOVED:
        t = data(rank, n, dtype)
        dist.broadcast(t, 1)
        assert_same(t, data(1, n, dtype), "broadcast %s" % dtype)
        outs = [torch.zeros(n, dtype=dtype) for _ in range(size)]
        dist.all_gather(outs, data(rank, n, dtype))
        for r in range(size):
            assert_same(outs[r], data(r, n, dtype), "all_gather %s from %d" % (dtype, r))
        out = torch.zeros(size * n, dtype=dtype)
        dist.all_to_all_single(out, torch.cat([data(rank, n, dtype, salt=j) for j in range(size)]))
        assert_same(out, torch.cat([data(r, n, dtype, salt=rank) for r in range(size)]), "all_to_all_single %s" % dtype)
        lst = [torch.zeros(n, dtype=dtype) for _ in range(size)] if rank == 0 else None
        dist.gather(data(rank, n, dtype), lst, dst=0)
        if rank == 0:
            for r in range(size):
                assert_same(lst[r], data(r, n, dtype), "gather %s from %d" % (dtype, r))
        if rank == 0:
            dist.send(data(7, n, dtype), 1)
        elif rank == 1:
            r = torch.zeros(n, dtype=dtype)
            dist.recv(r, 0)
            assert_same(r, data(7, n, dtype), "send/recv %s" % dtype)


def test_data_movement_every_dtype():
    spawn(_data_movement_every_dtype, 3)


# ------------------------------------------------------------ layouts

def _noncontiguous(rank, size):
    def strided(r, salt=0):
        base = data(r, 6 * 8, salt=salt).view(6, 8)
        return base.t()  # 8 x 6, not contiguous

    t = strided(rank)
    assert not t.is_contiguous()
    dist.all_reduce(t)
    assert_same(t, sum(strided(r) for r in range(size)), "allreduce, transposed")

    t = torch.zeros(6, 8).t() if rank != 0 else strided(0, 3)
    dist.broadcast(t, 0)
    assert_same(t, strided(0, 3), "broadcast, transposed")

    every_other = torch.zeros(40)[::2]
    assert not every_other.is_contiguous()
    if rank == 0:
        dist.send(data(9, 20), 1)
    elif rank == 1:
        dist.recv(every_other, 0)
        assert_same(every_other, data(9, 20), "recv into a strided tensor")

    outs = [torch.zeros(6, 8).t() for _ in range(size)]
    dist.all_gather(outs, strided(rank))
    for r in range(size):
        assert_same(outs[r], strided(r), "all_gather into transposed outputs")

    out = torch.zeros(8, 6 * size).t()  # (6*size) x 8, not contiguous
    dist.all_gather_into_tensor(out, data(rank, 6 * 8).view(6, 8))
    assert_same(out, torch.cat([data(r, 6 * 8).view(6, 8) for r in range(size)]), "all_gather_into_tensor strided")

    out = torch.zeros(6, 8).t()
    dist.reduce_scatter(out, [strided(rank, j) for j in range(size)])
    assert_same(out, sum(strided(r, rank) for r in range(size)), "reduce_scatter strided")

    inp = torch.arange(size * 2 * 3, dtype=torch.float32).view(3, size * 2).t() + 100 * rank  # (2*size) x 3
    out = torch.zeros(3, size * 2).t()
    dist.all_to_all_single(out, inp)
    exp = torch.cat([(torch.arange(size * 2 * 3, dtype=torch.float32).view(3, size * 2).t() + 100 * r)
                     [2 * rank:2 * rank + 2] for r in range(size)])
    assert_same(out, exp, "all_to_all_single strided")


def test_noncontiguous_tensors():
    spawn(_noncontiguous, 2)


# ------------------------------------------------------------ p2p and async

def _p2p_and_async(rank, size):
    peer = 1 - rank
    # isend/irecv on several tags, posted in opposite orders on the two sides
    if rank == 0:
        works = [dist.isend(data(0, 10, salt=tag), 1, tag=tag) for tag in (3, 1, 2)]
    else:
        bufs = {tag: torch.zeros(10) for tag in (2, 1, 3)}
        works = [dist.irecv(bufs[tag], 0, tag=tag) for tag in (2, 1, 3)]
    for w in reversed(works):
        w.wait()
    if rank == 1:
        for tag, b in bufs.items():
            assert_same(b, data(0, 10, salt=tag), "irecv tag %d" % tag)

    # FIFO on one tag
    if rank == 0:
        for i in range(5):
            dist.send(torch.full((4,), float(i)), 1, tag=7)
    else:
        for i in range(5):
            b = torch.zeros(4)
            dist.recv(b, 0, tag=7)
            assert_same(b, torch.full((4,), float(i)), "message %d on tag 7" % i)

    # a recv really is asynchronous: not complete before the peer sends
    if rank == 1:
        b = torch.zeros(1000)
        w = dist.irecv(b, 0, tag=11)
        assert not w.is_completed()
        dist.send(torch.ones(1), 0, tag=12)  # tells rank 0 to send now
        w.wait()
        assert w.is_completed() and w.is_success()
        assert_same(b, data(0, 1000), "irecv after is_completed() was False")
    else:
        dist.recv(torch.zeros(1), 1, tag=12)
        dist.send(data(0, 1000), 1, tag=11)

    # several async collectives outstanding, waited in reverse order, polled
    ts = [data(rank, 500, salt=i) for i in range(6)]
    ws = [dist.all_reduce(t, async_op=True) for t in ts]
    bc = torch.zeros(50) if rank else data(0, 50)
    ws.append(dist.broadcast(bc, 0, async_op=True))
    deadline = time.time() + 30
    while not ws[0].is_completed():
        assert time.time() < deadline
    for w in reversed(ws):
        w.wait()
    for i, t in enumerate(ts):
        assert_same(t, data(0, 500, salt=i) + data(1, 500, salt=i), "async allreduce %d" % i)
    assert_same(bc, data(0, 50), "async broadcast")

    # get_future (DDP's comm hooks use it): completed, value = the outputs
    t = data(rank, 20)
    fut = dist.all_reduce(t, async_op=True).get_future()
    res = fut.wait()
    assert_same(res[0], data(0, 20) + data(1, 20), "future's value")

    # Work.wait(timeout) on a recv nobody serves yet: our timeout, then it
    # completes once the message comes
    if rank == 1:
        b = torch.zeros(3)
        w = dist.irecv(b, 0, tag=21)
        with pytest.raises(RuntimeError, match="Work.wait timed out after 200 ms"):
            w.wait(datetime.timedelta(milliseconds=200))
        dist.send(torch.ones(1), 0, tag=22)
        w.wait()
        assert_same(b, torch.full((3,), 5.0), "recv after a Work.wait timeout")
    else:
        dist.recv(torch.zeros(1), 1, tag=22)
        dist.send(torch.full((3,), 5.0), 1, tag=21)

    # empty and 0-dim tensors
    e = torch.zeros(0)
    dist.all_reduce(e)
    dist.broadcast(e, 0)
    if rank == 0:
        dist.send(torch.zeros(0), 1, tag=30)
    else:
        dist.recv(torch.zeros(0), 0, tag=30)
    s = torch.tensor(float(rank + 2))
    dist.all_reduce(s, op=dist.ReduceOp.PRODUCT)
    assert_same(s, torch.tensor(6.0), "0-dim allreduce")

    # batch_isend_irecv: a ring
    send = data(rank, 8)
    recv = torch.zeros(8)
    ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert_same(recv, data(peer, 8), "batch_isend_irecv")


def test_p2p_and_async():
    spawn(_p2p_and_async, 2)


def _ddp(rank, size):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    x = data(rank, 8 * 16).view(8, 16)
    ddp(x).sum().backward()
    g = model.weight.grad.clone()
    # every rank ends with the average of the ranks' gradients
    ref = torch.nn.Linear(16, 4)
    ref.load_state_dict(model.state_dict())
    grads = []
    for r in range(size):
        ref.zero_grad()
        ref(data(r, 8 * 16).view(8, 16)).sum().backward()
        grads.append(ref.weight.grad.clone())
    assert torch.allclose(g, sum(grads) / size, atol=1e-5)


def test_ddp_gradients():
    spawn(_ddp, 2)


# ------------------------------------------------------------ groups

def _groups(rank, size):
    # a subgroup over weft, made while the world group is in use
    sub = dist.new_group([0, 2])
    t = data(rank, 10)
    if rank in (0, 2):
        dist.all_reduce(t, group=sub)
        assert_same(t, data(0, 10) + data(2, 10), "allreduce in [0, 2]")
        assert dist.get_backend(sub) == "weft"
    # the world group still works afterwards, with a second subgroup
    other = dist.new_group([1, 3])
    t = data(rank, 10)
    dist.all_reduce(t)
    assert_same(t, sum(data(r, 10) for r in range(size)), "world allreduce")
    if rank in (1, 3):
        t = data(rank, 10)
        dist.broadcast(t, 3, group=other)
        assert_same(t, data(3, 10), "broadcast in [1, 3] from 3")
    # the group's timeout became WEFT_TIMEOUT (the user did not set it)
    assert weft_torch._weft_group(None).weft_timeout == "60.000"


def test_subgroups_and_timeout_env():
    spawn(_groups, 4)


# ------------------------------------------------------------ errors

def _unsupported(rank, size):
    t = torch.ones(4)
    for op, name in ((dist.ReduceOp.BAND, "BAND"), (dist.ReduceOp.BOR, "BOR"), (dist.ReduceOp.BXOR, "BXOR")):
        with pytest.raises(RuntimeError, match=r"weft backend: allreduce: ReduceOp %s is not supported" % name):
            dist.all_reduce(t, op=op)
    with pytest.raises(RuntimeError, match=r"weft backend: allreduce: dtype Bool is not supported for reductions"):
        dist.all_reduce(torch.ones(4, dtype=torch.bool))
    with pytest.raises(RuntimeError, match=r"weft backend: reduce: dtype Short"):
        dist.reduce(torch.ones(4, dtype=torch.int16), 0)
    with pytest.raises(RuntimeError, match=r"weft backend: reduce_scatter: dtype ComplexFloat"):
        dist.reduce_scatter(torch.zeros(2, dtype=torch.complex64),
                            [torch.zeros(2, dtype=torch.complex64)] * size)
    with pytest.raises(RuntimeError, match=r"weft backend: recv from any source is not supported"):
        dist.recv(torch.zeros(2))
    with pytest.raises(RuntimeError, match=r"tag -1 is out of range"):
        dist.send(torch.zeros(2), 1 - rank, tag=-1)
    # the largest tag is the user's (the backend reserves no lane of its own)
    if rank == 0:
        dist.send(torch.full((2,), 7.0), 1, tag=2 ** 31 - 1)
    elif rank == 1:
        b = torch.zeros(2)
        dist.recv(b, 0, tag=2 ** 31 - 1)
        assert_same(b, torch.full((2,), 7.0), "recv on tag INT_MAX")
    # the group still works after the refusals (nothing was started)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert_same(t, torch.full((4,), float(size)), "allreduce after refusals")


def test_unsupported_ops_raise():
    spawn(_unsupported, 2)


def _timeout(rank, size):
    store = dist.distributed_c10d._get_default_store()
    # A group with a short timeout (the world group keeps 60 s, so the
    # processes' start-up is not raced): it becomes that comm's WEFT_TIMEOUT.
    short = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2))
    assert weft_torch._weft_group(short).weft_timeout == "2.000"
    if rank == 1:
        b = torch.zeros(4)
        t0 = time.time()
        w = dist.irecv(b, 0, group=short, tag=5)
        with pytest.raises(RuntimeError) as e:
            w.wait()
        took = time.time() - t0
        msg = str(e.value)
        assert "weft backend: recv from rank 0 (tag 5) failed on rank 1" in msg, msg
        assert "peer 0" in msg and "no progress" in msg, msg
        assert took < 2.0 + 8, "the wait took %.1f s with WEFT_TIMEOUT=2" % took
        store.set("timeout_seen", "1")
    else:
        # stays alive and never sends, until rank 1 saw its timeout
        store.wait(["timeout_seen"], datetime.timedelta(seconds=30))
    # the comms still serve other requests
    for g in (short, None):
        t = torch.ones(2)
        dist.all_reduce(t, group=g)
        assert_same(t, torch.full((2,), 2.0), "allreduce after a timed-out recv")


def test_timeout_names_the_peer():
    spawn(_timeout, 2)


def _truncation(rank, size):
    if rank == 0:
        w = dist.isend(torch.ones(8), 1, tag=2)
        try:
            w.wait()  # completes, or fails with the same code (weft's contract)
        except RuntimeError as e:
            assert "truncated" in str(e), str(e)
    else:
        small = torch.zeros(4)
        with pytest.raises(RuntimeError) as e:
            dist.recv(small, 0, tag=2)
        msg = str(e.value)
        assert "weft backend: recv from rank 0 (tag 2) failed on rank 1" in msg, msg
        assert "truncated" in msg, msg
        assert_same(small, torch.zeros(4), "nothing written past (or into) the small buffer")
    # the pipe goes on with the next message
    t = torch.ones(2)
    dist.all_reduce(t)
    assert_same(t, torch.full((2,), 2.0), "allreduce after a truncated recv")


def test_truncation_error():
    spawn(_truncation, 2)


def _abort(rank, size):
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        b = torch.zeros(4)
        w = dist.irecv(b, 0, tag=1)
        store.set("posted", "1")
        t0 = time.time()
        with pytest.raises(RuntimeError) as e:
            w.wait()
        # rank 0 aborted: the pipe breaks at once, no WEFT_TIMEOUT (60 s) wait
        assert time.time() - t0 < 20, "took %.1f s" % (time.time() - t0)
        assert "failed on rank 1" in str(e.value), str(e.value)
        # and this rank's own abort fails its pending operations at once
        # (a receive from itself: the pipe to rank 0 is broken already)
        w = dist.irecv(torch.zeros(1), 1, tag=9)
        weft_torch.abort()
        with pytest.raises(RuntimeError, match="abort"):
            w.wait()
    else:
        store.wait(["posted"], datetime.timedelta(seconds=30))
        weft_torch.abort()
        assert "abort" in weft_torch.last_error()
        with pytest.raises(RuntimeError, match="abort"):
            dist.all_reduce(torch.ones(2))


def test_abort():
    spawn(_abort, 2)


# ------------------------------------------------------------ env:// (torchrun)

ENV_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    import weft_torch
    dist.init_process_group("weft")  # env:// from MASTER_ADDR/PORT, RANK, WORLD_SIZE
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t)
    print("RESULT", r, n, dist.get_backend(), t.tolist(), flush=True)
    dist.destroy_process_group()
""")


def _run_env_script(size, script, extra_env=None):
    port = _free_port()
    procs = []
    for r in range(size):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   LOCAL_RANK=str(r), WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(size), **(extra_env or {}))
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        outs.append(out)
        assert p.returncode == 0, out
    return outs


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_env_init_like_torchrun():
    size = 3
    outs = _run_env_script(size, ENV_SCRIPT)
    for r, out in enumerate(outs):
        line = [l for l in out.splitlines() if l.startswith("RESULT")]
        assert line == ["RESULT %d %d weft [6.0, 6.0, 6.0]" % (r, size)], out


def test_user_weft_timeout_is_kept():
    script = textwrap.dedent("""
        import datetime, os, torch.distributed as dist
        import weft_torch
        dist.init_process_group("weft", timeout=datetime.timedelta(seconds=5))
        print("TIMEOUT", weft_torch._weft_group(None).weft_timeout, flush=True)
        # a group made later without the user's value follows its own timeout
        del os.environ["WEFT_TIMEOUT"]
        g = dist.new_group([0], timeout=datetime.timedelta(seconds=4))
        print("TIMEOUT", weft_torch._weft_group(g).weft_timeout, flush=True)
        # ... and the user's value set after the import counts as the user's
        os.environ["WEFT_TIMEOUT"] = "9"
        g = dist.new_group([0], timeout=datetime.timedelta(seconds=3))
        print("TIMEOUT", weft_torch._weft_group(g).weft_timeout, flush=True)
        g = dist.new_group([0], timeout=datetime.timedelta(seconds=3))
        print("TIMEOUT", weft_torch._weft_group(g).weft_timeout, flush=True)
        dist.destroy_process_group()
    """)
    out = _run_env_script(1, script, {"WEFT_TIMEOUT": "7.5"})[0]
    lines = [l for l in out.splitlines() if l.startswith("TIMEOUT")]
    assert lines == ["TIMEOUT 7.5", "TIMEOUT 4.000", "TIMEOUT 9", "TIMEOUT 9"], out
