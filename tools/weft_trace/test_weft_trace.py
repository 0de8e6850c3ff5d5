#!/usr/bin/env python3
"""weft-trace's verdicts on hand-made journals (the format of
collectives/journal.c): each case writes a directory, runs the tool and
asserts the lines it must and must not print. Usage: test_weft_trace.py TOOL"""
import json
import os
import subprocess
import sys
import tempfile

TOOL = sys.argv[1]
failures = 0


def journal(d, rank, size, calls, reason="error", comm=0):
    head = {"weft_trace": 1, "comm": comm, "rank": rank, "size": size, "host": "h", "pid": 100 + rank,
            "reason": reason, "wall_ms": 0, "wall0_ms": 0, "now_us": 9000000, "next_call": len(calls),
            "last_error": ""}
    with open(os.path.join(d, f"weft-trace.{comm}.r{rank}.jsonl"), "w") as f:
        f.write(json.dumps(head) + "\n")
        for c in calls:
            f.write(json.dumps(c) + "\n")


def call(n, what, state="done", stream=False):
    c = {"call": n, "what": what, "nb": 0, "state": state, "start_us": n * 1000}
    if stream:   # a stream-ordered collective: numbered apart (journal.c)
        c.update(stream=1, nb=1)
    if state == "done":   # weft writes no end time for a call that succeeded
        c.update(rc=0, error="success")
    elif state != "started":
        c.update(end_us=n * 1000 + 10, rc=6, error="timed out")
    return c


def case(name, write, must, must_not=(), rc=0):
    global failures
    with tempfile.TemporaryDirectory() as d:
        write(d)
        p = subprocess.run([sys.executable, TOOL, d], capture_output=True, text=True)
    out = p.stdout + p.stderr
    bad = [m for m in must if m not in out] + [m for m in must_not if m in out]
    if p.returncode != rc or bad:
        failures += 1
        print(f"FAIL {name}: exit {p.returncode} (want {rc}); missing or unwanted: {bad}\n{out}")
    else:
        print(f"ok   {name}")


AR = "allreduce(8 x int32, sum)"
BC = "bcast(64 B, root 0)"

case("behind",
     lambda d: [journal(d, r, 3, [call(0, AR), call(1, AR, "started" if r != 1 else "done")][: 2 if r != 1 else 1])
                for r in range(3)],
     ["rank 1 is behind: it never called #1 allreduce(8 x int32, sum), which ranks 0 and 2 called (still in it)"],
     ["different collectives", "wrote no journal"])
case("mismatch",
     lambda d: [journal(d, r, 2, [call(0, AR), call(1, AR if r == 0 else BC, "failed")]) for r in range(2)],
     ["call #1: ranks called different collectives: rank 0 called allreduce(8 x int32, sum); rank 1 called "
      "bcast(64 B, root 0)"], ["is behind"])
case("missing rank",
     lambda d: [journal(d, r, 4, [call(0, AR, "failed")]) for r in (0, 1, 3)],
     ["rank 2 wrote no journal", "journals from ranks 0, 1 and 3"])
case("stalled link",
     lambda d: [journal(d, r, 2, [call(0, AR), call(1, AR, "started")]) for r in range(2)],
     ["every rank reached call #1; ranks 0 and 1 still in it"], ["is behind"])
case("all well",
     lambda d: [journal(d, r, 2, [call(0, AR), call(1, BC)], reason="weft_comm_destroy") for r in range(2)],
     ["verdict: nothing wrong in the journals"], ["is behind", "different"])
# Stream-ordered collectives have numbers of their own: equal heads in both
# numberings are fine; a rank one stream call behind is named as such.
case("stream calls beside the others",
     lambda d: [journal(d, r, 2, [call(0, AR), call(1, BC), call(0, AR, stream=True)], reason="weft_comm_destroy")
                for r in range(2)],
     ["verdict: nothing wrong in the journals"], ["is behind", "different"])
case("stream behind",
     lambda d: [journal(d, r, 3, [call(0, AR), call(0, AR, stream=True)] +
                       ([call(1, AR, "started", stream=True)] if r != 1 else [])) for r in range(3)],
     ["rank 1 is behind: it never called stream call #1 allreduce(8 x int32, sum), which ranks 0 and 2 called "
      "(still in it); its newest stream call is #0", "newest stream call #1"],
     ["never called #1", "different collectives"])
case("empty directory", lambda d: None, ["no weft-trace.*.r*.jsonl"], rc=2)
sys.exit(1 if failures else 0)
