#!/usr/bin/python3
"""CI entry: PyTorch's distributed_test.py over weft and gloo, side by side.

Runs run_distributed_test.py twice on the same list of tests and world size,
first BACKEND=weft then BACKEND=gloo (one after the other: the ranks of one
run have the machine), prints

  distributed_test.py: weft P pass / S skip / F fail, gloo P / S / F (list=..., world_size=N)

and exits 1 if any test named in must_pass_weft.txt did not pass with weft
(each such test is printed with its status and reason; the full failure text
is in the results .log file). gloo's results are informational: a gloo failure
is printed but does not fail the check.

weft_torch must be importable: --build DIR puts DIR/adapters/torch on
PYTHONPATH (default: $WEFT_BUILD, else <repo>/build); an explicit PYTHONPATH
is kept in front of it.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
RUNNER = os.path.join(HERE, "run_distributed_test.py")
MUST_PASS = os.path.join(HERE, "must_pass_weft.txt")


def _read_names(path):
    names = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                names.append(line)
    return names


def _read_results(path):
    res = {}
    header = ""
    with open(path) as f:
        for line in f:
            if line.startswith("# distributed_test.py"):
                header = line[2:].strip()
            if line.startswith("#") or not line.strip():
                continue
            status, name, secs, reason = (line.rstrip("\n").split("\t") + [""])[:4]
            res[name] = (status, reason)
    return res, header


def _counts(res):
    c = {"pass": 0, "skip": 0, "fail": 0}
    for status, _ in res.values():
        c["fail" if status in ("fail", "error") else status] += 1
    return c


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.environ.get("WEFT_BUILD",
                                                     os.path.join(REPO, "build")),
                   help="weft build directory holding adapters/torch/weft_torch")
    p.add_argument("--world-size", type=int, default=3,
                   help="ranks per test (default 3, as PyTorch runs gloo on "
                   "CPU; the group tests need 3)")
    p.add_argument("--list", dest="list_name", default="ops-cpu",
                   choices=["full", "ops", "ops-cpu"],
                   help="list of tests run for both backends (default ops-cpu)")
    p.add_argument("--start-method", default="forkserver",
                   choices=["spawn", "forkserver"],
                   help="how each test's ranks start (default forkserver: the "
                   "same tests and results as spawn, about 3x faster here; "
                   "spawn is test_distributed_spawn.py's way)")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds one test may run before its ranks are killed "
                   "(default 120)")
    p.add_argument("--out", default=None,
                   help="directory for the results files (default: a new "
                   "directory under $TMPDIR)")
    p.add_argument("--must-pass", default=MUST_PASS,
                   help="the list of tests that must pass with weft "
                   "(default must_pass_weft.txt beside this script)")
    p.add_argument("--backends", default="weft,gloo",
                   help="comma-separated; default weft,gloo")
    args = p.parse_args(argv)

    out = args.out or __import__("tempfile").mkdtemp(prefix="weft-dist-check-")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    torch_py = os.path.join(os.path.abspath(args.build), "adapters", "torch")
    env["PYTHONPATH"] = os.pathsep.join(
        x for x in (env.get("PYTHONPATH", ""), torch_py) if x)

    must = _read_names(args.must_pass) if os.path.exists(args.must_pass) else []
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results, headers, walls = {}, {}, {}
    for backend in backends:
        path = os.path.join(out, "results-%s-np%d.txt" % (backend, args.world_size))
        cmd = [sys.executable, RUNNER, "--backend", backend,
               "--world-size", str(args.world_size), "--list", args.list_name,
               "--timeout", str(args.timeout), "--results", path,
               "--start-method", args.start_method]
        if os.path.exists(path):
            os.remove(path)  # never read a previous run's results
        t0 = time.monotonic()
        rc = subprocess.call(cmd, env=env)
        walls[backend] = time.monotonic() - t0
        if not os.path.exists(path):
            print("check: the %s run wrote no results (exit %d)" % (backend, rc))
            results[backend], headers[backend] = {}, ""
            continue
        results[backend], headers[backend] = _read_results(path)

    parts = []
    for i, backend in enumerate(backends):
        c = _counts(results[backend])
        if i == 0:
            parts.append("%s %d pass / %d skip / %d fail"
                         % (backend, c["pass"], c["skip"], c["fail"]))
        else:
            parts.append("%s %d / %d / %d" % (backend, c["pass"], c["skip"], c["fail"]))
    print("distributed_test.py: %s (list=%s, world_size=%d, %s, %s; "
          "results in %s)"
          % (", ".join(parts), args.list_name, args.world_size,
             args.start_method,
             ", ".join("%s %.0f s" % (b, walls[b]) for b in backends), out))

    bad = []
    if "weft" in backends:
        if not must:
            print("check: %s is empty or missing: nothing is asserted"
                  % args.must_pass)
            bad.append("(no must-pass list)")
        if not results["weft"]:
            # The run died before its results (weft_torch missing, a crash):
            # one line says so instead of every must-pass test "not run".
            print("check: the weft run gave no results: none of the %d "
                  "must-pass tests ran (%s on PYTHONPATH: %s)"
                  % (len(must), "weft_torch", torch_py))
            bad.extend(must)
        for name in must if results["weft"] else []:
            status, reason = results["weft"].get(name, ("not run", "not in the "
                                                       "list that was run"))
            if status != "pass":
                bad.append(name)
                print("check: must pass with weft: %s: %s %s" % (name, status, reason))
        print("check: %d of %d must-pass tests passed with weft"
              % (len(must) - len([b for b in bad if b in must]), len(must)))
    if "gloo" in backends:
        for name in must:
            status, reason = results["gloo"].get(name, ("not run", ""))
            if status != "pass":
                print("check: note: must-pass test %s did not pass with gloo "
                      "either: %s %s" % (name, status, reason))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
