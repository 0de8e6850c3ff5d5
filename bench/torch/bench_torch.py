#!/usr/bin/python3
"""torch.distributed over "weft" and "gloo", timed in the same run.

Each rank (torch.multiprocessing spawn, file:// store) makes two process groups
over all ranks: gloo (the default group) and weft (dist.new_group(backend=
"weft"), registered by `import weft_torch`). For every operation and size the
two backends are timed alternately, repetition by repetition, so that a change
of machine load hits both columns alike.

Operations (float32, `size` = the whole buffer of the call on one rank, as
nccl-tests and bench/weft-perf count it):
  all_reduce              sum over `size` bytes
  all_gather_into_tensor  output `size` bytes (each rank gives size/np)
  reduce_scatter_tensor   input `size` bytes (each rank gets size/np), sum
  broadcast               `size` bytes from rank 0
  send_recv               ping-pong of `size` bytes between ranks 0 and 1
                          (others wait); the time is half the round trip

One repetition: a gloo barrier over all ranks, then `iters` back-to-back calls
on the timed group; a rank's time is the elapsed wall time / iters, and the
repetition's time is the largest over the ranks. The table gives the median of
the repetitions per backend, their ratio weft/gloo (below 1: weft faster) and
the speedup gloo/weft.

  bench/torch/run.sh                      # np 2 and 4, markdown tables
  bench_torch.py --np 4 --ops all_reduce --sizes 64K,1M,64M --repeats 11
"""
import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
       "broadcast", "send_recv"]
DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"


def _parse_size(text):
    text = text.strip().upper().rstrip("B").rstrip("I")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            mult, text = m, text[:-1]
            break
    return int(text) * mult


def _fmt_size(n):
    for suffix, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return "%d %s" % (n // m, suffix)
    return "%d B" % n


def _fmt_time(s):
    if s is None:
        return ""
    if s < 1e-3:
        return "%.1f us" % (s * 1e6)
    if s < 1.0:
        return "%.2f ms" % (s * 1e3)
    return "%.3f s" % s


def _iters_for(size):
    # Enough calls per repetition that a small message's timing is not the
    # clock's resolution and the barrier's noise; one call for the big ones.
    if size <= 64 << 10:
        return 20
    if size <= 1 << 20:
        return 5
    return 1


def _repeats_for(size, repeats):
    # The 16 and 64 MiB rows are slow on gloo (and on a 2-core machine at
    # np 4); fewer repetitions keep one run within a few minutes.
    if size >= 16 << 20:
        return max(5, repeats // 2)
    return repeats


def _native(dist, torch, op, group, nranks):
    """Whether `group` has the single-tensor call of `op` (gloo in torch 1.13
    has neither _allgather_base nor any reduce_scatter). The probe fails the
    same way on every rank before anything is sent, or succeeds everywhere."""
    try:
        if op == "all_gather_into_tensor":
            dist.all_gather_into_tensor(torch.empty(4 * nranks),
                                        torch.zeros(4), group=group)
        elif op == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(torch.empty(4),
                                       torch.zeros(4 * nranks), group=group)
        return True
    except RuntimeError as e:
        if "support" in str(e):
            return False
        raise


def _make_call(dist, torch, op, size, group, rank, nranks, native=True):
    n = size // 4
    if op == "all_reduce":
        t = torch.ones(n, dtype=torch.float32)
        return lambda: dist.all_reduce(t, group=group)
    if op == "all_gather_into_tensor":
        out = torch.empty(n, dtype=torch.float32)
        inp = torch.full((n // nranks,), float(rank), dtype=torch.float32)
        if native:
            return lambda: dist.all_gather_into_tensor(out, inp, group=group)
        # What a gloo user writes instead: all_gather into the n blocks of
        # the output (contiguous views, no copy afterwards).
        views = list(out.chunk(nranks))
        return lambda: dist.all_gather(views, inp, group=group)
    if op == "reduce_scatter_tensor":
        inp = torch.ones(n, dtype=torch.float32)
        out = torch.empty(n // nranks, dtype=torch.float32)
        if native:
            return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
        # gloo has no reduce_scatter: all_reduce a copy of the input and keep
        # this rank's block (the input must stay intact, as reduce_scatter
        # leaves it).
        work = torch.empty_like(inp)
        blk = n // nranks

        def rs():
            work.copy_(inp)
            dist.all_reduce(work, group=group)
            out.copy_(work[rank * blk:(rank + 1) * blk])
        return rs
    if op == "broadcast":
        t = torch.full((n,), float(rank), dtype=torch.float32)
        return lambda: dist.broadcast(t, src=0, group=group)
    if op == "send_recv":
        t = torch.zeros(n, dtype=torch.float32)
        if rank == 0:
            def ping():
                dist.send(t, dst=1, group=group)
                dist.recv(t, src=1, group=group)
            return ping
        if rank == 1:
            def pong():
                dist.recv(t, src=0, group=group)
                dist.send(t, dst=0, group=group)
            return pong
        return lambda: None
    raise ValueError(op)


def _check(dist, torch, op, size, group, rank, nranks, native=True):
    """One call with known data: a backend that computes garbage is flagged."""
    n = size // 4
    blk = n // nranks
    if op == "all_reduce":
        t = torch.full((n,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(t, group=group)
        return bool((t == nranks * (nranks + 1) / 2).all())
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        if op == "all_gather_into_tensor":
            out = torch.empty(n, dtype=torch.float32)
            inp = torch.full((blk,), float(rank), dtype=torch.float32)
            if native:
                dist.all_gather_into_tensor(out, inp, group=group)
            else:
                dist.all_gather(list(out.chunk(nranks)), inp, group=group)
            want = torch.arange(nranks, dtype=torch.float32).repeat_interleave(blk)
            return bool(torch.equal(out, want))
        inp = torch.arange(nranks, dtype=torch.float32).repeat_interleave(blk)
        out = torch.empty(blk, dtype=torch.float32)
        if native:
            dist.reduce_scatter_tensor(out, inp, group=group)
        else:
            work = inp.clone()
            dist.all_reduce(work, group=group)
            out.copy_(work[rank * blk:(rank + 1) * blk])
        return bool((out == float(rank * nranks)).all())
    if op == "broadcast":
        t = torch.full((n,), float(rank + 7), dtype=torch.float32)
        dist.broadcast(t, src=0, group=group)
        return bool((t == 7.0).all())
    t = torch.full((n,), float(rank + 3), dtype=torch.float32)
    if rank == 0:
        dist.send(t, dst=1, group=group)
        dist.recv(t, src=1, group=group)
        return bool((t == 4.0).all())
    if rank == 1:
        r = torch.empty_like(t)
        dist.recv(r, src=0, group=group)
        dist.send(t, dst=0, group=group)
        return bool((r == 3.0).all())
    return True


def _rank_main(rank, nranks, init_file, cfg, out_path):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    weft_error = None
    if "weft" in cfg["backends"]:
        try:
            import weft_torch  # noqa: F401  (registers the "weft" backend)
        except Exception as e:  # the column stays empty, the reason is printed
            weft_error = "import weft_torch: %s" % e
    dist.init_process_group("gloo", init_method="file://" + init_file,
                            rank=rank, world_size=nranks,
                            timeout=datetime.timedelta(seconds=cfg["timeout"]))
    groups = {"gloo": dist.group.WORLD}
    if "weft" in cfg["backends"] and weft_error is None:
        try:
            groups["weft"] = dist.new_group(list(range(nranks)), backend="weft")
        except Exception as e:
            weft_error = "new_group(backend='weft'): %s" % e
    # Every rank must agree on whether weft takes part, or the ranks would
    # call different collectives.
    flag = torch.tensor([0 if weft_error is None else 1])
    dist.all_reduce(flag, group=dist.group.WORLD)
    if flag.item() and "weft" in groups:
        del groups["weft"]
        weft_error = weft_error or "weft unavailable on another rank"
    order = [b for b in cfg["backends"] if b in groups]

    rows = []
    emulated = {}
    for op in cfg["ops"]:
        if op == "send_recv" and nranks < 2:
            continue
        native = {b: _native(dist, torch, op, groups[b], nranks) for b in order}
        for b in order:
            if not native[b]:
                emulated.setdefault(b, []).append(op)
        for size in cfg["sizes"]:
            if size % (4 * nranks):
                continue
            calls, valid = {}, {}
            for b in order:
                ok = _check(dist, torch, op, size, groups[b], rank, nranks,
                            native[b])
                flag = torch.tensor([0 if ok else 1])
                dist.all_reduce(flag, group=dist.group.WORLD)
                valid[b] = flag.item() == 0
                calls[b] = _make_call(dist, torch, op, size, groups[b], rank,
                                      nranks, native[b])
                for _ in range(cfg["warmup"]):
                    calls[b]()
            iters = _iters_for(size)
            samples = {b: [] for b in order}
            for rep in range(_repeats_for(size, cfg["repeats"])):
                # Alternate which backend goes first, so neither always runs
                # on a machine just woken (or just loaded) by the other.
                seq = order if rep % 2 == 0 else list(reversed(order))
                for b in seq:
                    dist.barrier(group=dist.group.WORLD)
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        calls[b]()
                    dt = (time.perf_counter() - t0) / iters
                    if op == "send_recv":
                        dt /= 2.0
                    worst = torch.tensor([dt], dtype=torch.float64)
                    dist.all_reduce(worst, op=dist.ReduceOp.MAX,
                                    group=dist.group.WORLD)
                    samples[b].append(worst.item())
            med = {b: statistics.median(samples[b]) for b in order}
            rows.append((op, size, med, valid, iters, len(samples[order[0]])))
            if rank == 0 and cfg["verbose"]:
                print("np %d %-24s %9s %s" % (
                    nranks, op, _fmt_size(size),
                    "  ".join("%s %s%s" % (b, _fmt_time(med[b]),
                                           "" if valid[b] else " WRONG")
                              for b in order)), flush=True)
            del calls
    if "weft" in groups:
        dist.destroy_process_group(groups["weft"])
    dist.destroy_process_group()
    if rank == 0:
        import json
        with open(out_path, "w") as f:
            json.dump({"np": nranks, "weft_error": weft_error,
                       "emulated": emulated, "torch": torch.__version__,
                       "rows": [[op, size, med, valid, iters, reps]
                                for op, size, med, valid, iters, reps in rows]},
                      f)


def _table(result, backends):
    np_ = result["np"]
    lines = []
    lines.append("np %d (median time per call; ratio = weft/gloo, below 1: "
                 "weft faster; speedup = gloo/weft)" % np_)
    lines.append("")
    lines.append("| op | size | weft | gloo | ratio weft/gloo | speedup |")
    lines.append("|---|---|---|---|---|---|")
    emu = result.get("emulated", {})
    for op, size, med, valid, iters, reps in result["rows"]:
        w, g = med.get("weft"), med.get("gloo")
        wt = _fmt_time(w) + ("" if valid.get("weft", True) else " (WRONG DATA)")
        gt = _fmt_time(g) + ("" if valid.get("gloo", True) else " (WRONG DATA)")
        ratio = "%.2f" % (w / g) if w and g else ""
        speed = "%.2fx" % (g / w) if w and g else ""
        if g is not None and op in emu.get("gloo", []):
            gt += " *"
        if w is not None and op in emu.get("weft", []):
            wt += " *"
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            op, _fmt_size(size), wt, gt, ratio, speed))
    # The target: weft faster than gloo at every size from 64 KiB,
    # and never slower by more than 10% below it.
    misses = []
    for op, size, med, valid, iters, reps in result["rows"]:
        w, g = med.get("weft"), med.get("gloo")
        if not (w and g):
            continue
        limit = 1.0 if size >= 64 << 10 else 1.10
        if w / g >= limit or not valid.get("weft", True):
            misses.append("%s %s (%.2f)" % (op, _fmt_size(size), w / g))
    if any(r[2].get("weft") and r[2].get("gloo") for r in result["rows"]):
        lines.append("")
        lines.append("Target (weft faster from 64 KiB, at most 10%% slower "
                     "below): %s" % ("met at every row" if not misses else
                                     "missed at " + ", ".join(misses)))
    for b, ops in sorted(emu.items()):
        for op in ops:
            lines.append("")
            lines.append("\\* %s has no %s here (torch %s): timed as %s." % (
                b, op, result.get("torch", "?"),
                "all_gather into the output's n blocks"
                if op == "all_gather_into_tensor" else
                "copy + all_reduce of the whole input + copy of this rank's block"))
    if result.get("weft_error") and "weft" in backends:
        lines.append("")
        lines.append("weft column empty: %s" % result["weft_error"])
    return "\n".join(lines)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--np", default="2,4",
                   help="comma-separated rank counts (default 2,4)")
    p.add_argument("--ops", default=",".join(OPS),
                   help="comma-separated subset of " + ",".join(OPS))
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="comma-separated sizes, K/M suffixes (default %s)"
                   % DEFAULT_SIZES)
    p.add_argument("--backends", default="weft,gloo",
                   help="comma-separated: weft,gloo (default both)")
    p.add_argument("--repeats", type=int, default=11,
                   help="repetitions per size (16 MiB and up: half, at least 5)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=int, default=300,
                   help="process-group timeout, seconds")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each row as it is measured")
    args = p.parse_args(argv)

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            sys.exit("bench_torch.py: unknown op %r (have %s)" % (o, ", ".join(OPS)))
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in ("weft", "gloo"):
            sys.exit("bench_torch.py: unknown backend %r" % b)
    # gloo is always created: the default group carries the barriers and the
    # MAX reductions of the timings; "--backends weft" only leaves it untimed.
    cfg = {"ops": ops, "sizes": [_parse_size(s) for s in args.sizes.split(",")],
           "backends": backends, "repeats": args.repeats,
           "warmup": args.warmup, "timeout": args.timeout,
           "verbose": args.verbose}

    import torch.multiprocessing as mp
    load = os.getloadavg()
    print("# torch.distributed: weft vs gloo (bench/torch/bench_torch.py), "
          "%s, %d CPUs, load average %.2f %.2f %.2f at start"
          % (time.strftime("%Y-%m-%d %H:%M"), os.cpu_count(), *load))
    print()
    for np_ in [int(x) for x in args.np.split(",")]:
        with tempfile.TemporaryDirectory(prefix="weft-bench-torch-") as tmp:
            init_file = os.path.join(tmp, "store")
            out_path = os.path.join(tmp, "result.json")
            t0 = time.monotonic()
            # spawn: each rank a fresh interpreter, as torchrun would give.
            mp.spawn(_rank_main, args=(np_, init_file, cfg, out_path),
                     nprocs=np_, join=True)
            import json
            with open(out_path) as f:
                result = json.load(f)
            print(_table(result, backends))
            print()
            print("(np %d: %.0f s, load average %.2f at the end)"
                  % (np_, time.monotonic() - t0, os.getloadavg()[0]))
            print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
