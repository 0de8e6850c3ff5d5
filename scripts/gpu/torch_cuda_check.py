#!/usr/bin/env python3
"""torch_cuda_check: CUDA tensors through the "weft" torch.distributed backend,
two ranks on GPU 0 (scripts/validate-gpu --bundle; docs/torch.md, "CUDA
tensors"). The ranks meet through a file:// store, without MPI.

    PYTHONPATH=<build>/adapters/torch python3 scripts/gpu/torch_cuda_check.py [--op-timeout 15]

Each operation runs in a fresh pair of processes (a hang in one does not hide
the others): broadcast, all_gather, send/recv, all_reduce float32 (the first
device reduction: the reduction module loads then), all_reduce float16; each
is followed by torch.cuda.synchronize() (where the 2026-11-24 hang showed)
and its values are checked on the host. A rank whose operation has not
finished within --op-timeout seconds prints its Python stacks and "HANG";
after two operations in a row hang, the rest are skipped. One line per
operation, then
    TORCH-CUDA: <n> ok, <n> failed, <n> hung, <n> skipped
Exit 0 all ok, 1 a failure or a hang, 2 cannot run (no CUDA, no weft_torch,
or weft_torch built without CUDA tensors).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

OPS = ["broadcast", "all_gather", "send_recv", "all_reduce_f32", "all_reduce_f16"]


def rank_main(op, rank, size, path, op_timeout):
    import datetime
    import faulthandler
    import threading

    import torch
    import torch.distributed as dist

    def hang():
        print(f"rank {rank}: {op}: HANG (not finished within {op_timeout} s); Python stacks:", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        sys.stdout.flush()
        os._exit(3)

    timer = threading.Timer(op_timeout, hang)
    timer.daemon = True
    timer.start()
    import weft_torch

    if not getattr(weft_torch._C, "CUDA", False):
        print(f"rank {rank}: weft_torch was built without CUDA tensors (weft_torch._C.CUDA false)", flush=True)
        os._exit(2)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("weft", init_method="file://" + path, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))
    t0 = time.monotonic()
    bad = ""
    if op == "broadcast":
        t = torch.arange(1000, dtype=torch.float32, device=dev) + 7 if rank == 0 else \
            torch.zeros(1000, dtype=torch.float32, device=dev)
        dist.broadcast(t, src=0)
        torch.cuda.synchronize()
        want = torch.arange(1000, dtype=torch.float32) + 7
        if not torch.equal(t.cpu(), want):
            bad = f"got {t.cpu()[:4].tolist()}..., want {want[:4].tolist()}..."
    elif op == "all_gather":
        mine = torch.full((257,), float(rank + 1), device=dev)
        out = [torch.zeros(257, device=dev) for _ in range(size)]
        dist.all_gather(out, mine)
        torch.cuda.synchronize()
        for r in range(size):
            if not torch.equal(out[r].cpu(), torch.full((257,), float(r + 1))):
                bad = f"block {r}: got {out[r].cpu()[:4].tolist()}..., want {float(r + 1)}"
    elif op == "send_recv":
        n = 4096 + 3
        if rank == 0:
            dist.send(torch.arange(n, dtype=torch.float32, device=dev), dst=1)
            back = torch.zeros(n, dtype=torch.float32, device=dev)
            dist.recv(back, src=1)
            torch.cuda.synchronize()
            if not torch.equal(back.cpu(), torch.arange(n, dtype=torch.float32) + 1):
                bad = f"reply: got {back.cpu()[:4].tolist()}..."
        else:
            t = torch.zeros(n, dtype=torch.float32, device=dev)
            dist.recv(t, src=0)
            torch.cuda.synchronize()
            if not torch.equal(t.cpu(), torch.arange(n, dtype=torch.float32)):
                bad = f"got {t.cpu()[:4].tolist()}..."
            dist.send(t + 1, dst=0)
            torch.cuda.synchronize()
    elif op in ("all_reduce_f32", "all_reduce_f16"):
        dt = torch.float32 if op == "all_reduce_f32" else torch.float16
        n = 1 << 20 if dt == torch.float32 else 1025
        t = torch.full((n,), float(rank + 1), dtype=dt, device=dev)
        dist.all_reduce(t)
        v = t.sum().item()   # the first synchronisation after the call
        torch.cuda.synchronize()
        want = float(n * sum(range(1, size + 1)))
        if v != want:
            bad = f"sum of the result {v}, want {want}"
    ms = (time.monotonic() - t0) * 1000
    dist.destroy_process_group()
    timer.cancel()
    print(f"rank {rank}: {op}: " + (f"FAIL: {bad}" if bad else f"ok ({ms:.0f} ms)"), flush=True)
    os._exit(1 if bad else 0)


def run_op(op, op_timeout):
    """Runs one operation on two fresh ranks; returns (verdict, lines)."""
    fd, path = tempfile.mkstemp(prefix="weft_torch_cuda_")
    os.close(fd)
    os.unlink(path)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--op", op,
                               "--store", path, "--op-timeout", str(op_timeout)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs, codes = [], []
    deadline = time.monotonic() + op_timeout + 30   # imports, CUDA context, the store
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            codes.append(p.returncode)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += f"\n(killed: still running {op_timeout + 30} s after the start)"
            codes.append(-9)
        outs.append(out)
    if os.path.exists(path):
        os.unlink(path)
    lines = [f"  [rank {r}] {line}" for r, o in enumerate(outs) for line in o.splitlines() if line.strip()]
    text = "\n".join(outs)
    if 2 in codes and "without CUDA" in text:
        return "cannot", lines
    if "HANG" in text or -9 in codes:
        return "hung", lines
    if all(c == 0 for c in codes) and text.count(": ok (") == 2:
        return "ok", lines
    return "failed", lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op-timeout", type=float, default=15)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--op")
    ap.add_argument("--store")
    a = ap.parse_args()
    if a.rank is not None:
        rank_main(a.op, a.rank, 2, a.store, a.op_timeout)
        return 0
    try:
        import torch
        import weft_torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any import failure means: cannot run)
        print(f"torch_cuda_check: cannot import torch / weft_torch: {e}")
        print("TORCH-CUDA: 0 ok, 0 failed, 0 hung, %d skipped (cannot run)" % len(OPS))
        return 2
    if not torch.cuda.is_available():
        print(f"torch_cuda_check: torch {torch.__version__} sees no CUDA device")
        print("TORCH-CUDA: 0 ok, 0 failed, 0 hung, %d skipped (no CUDA)" % len(OPS))
        return 2
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}; "
          f"WEFT_TIMEOUT={os.environ.get('WEFT_TIMEOUT', '(unset)')}", flush=True)
    count = {"ok": 0, "failed": 0, "hung": 0, "skipped": 0}
    hung_in_row = 0
    for op in OPS:
        if hung_in_row >= 2:
            print(f"{op}: skipped (the last two operations hung)", flush=True)
            count["skipped"] += 1
            continue
        t0 = time.monotonic()
        verdict, lines = run_op(op, a.op_timeout)
        if verdict == "cannot":
            print("\n".join(lines))
            print("TORCH-CUDA: 0 ok, 0 failed, 0 hung, %d skipped (weft_torch without CUDA)" % len(OPS))
            return 2
        count[verdict] += 1
        hung_in_row = hung_in_row + 1 if verdict == "hung" else 0
        print(f"{op}: {verdict.upper() if verdict != 'ok' else 'ok'} ({time.monotonic() - t0:.1f} s)", flush=True)
        if verdict != "ok" or os.environ.get("TORCH_CHECK_VERBOSE"):
            print("\n".join(lines), flush=True)
    print("TORCH-CUDA: %d ok, %d failed, %d hung, %d skipped" %
          (count["ok"], count["failed"], count["hung"], count["skipped"]), flush=True)
    return 0 if count["ok"] == len(OPS) else 1


if __name__ == "__main__":
    sys.exit(main())
