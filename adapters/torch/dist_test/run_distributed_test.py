#!/usr/bin/python3
"""Run PyTorch's own torch.distributed test suite over one backend.

The suite is torch/testing/_internal/distributed/distributed_test.py as Debian
ships it (torch 1.13). It is run the way PyTorch's
test/distributed/test_distributed_spawn.py runs it: a test class made of
TestDistBackend + DistributedTest._DistTestBase whose setUp spawns WORLD_SIZE
ranks with the "spawn" start method; each rank joins the process group through
a file:// store (TestDistBackend.init_method, a fresh temporary file per test)
and runs that one test. The environment variables the suite reads at import
(BACKEND, WORLD_SIZE, TEMP_DIR, INIT_METHOD) are set here before it is imported,
as PyTorch's run_test.py does.

--start-method forkserver starts the ranks from one server process that
imported torch, the suite and weft_torch once (same tests, same results here,
about 3x faster on a 2-core machine); each rank still starts with no process
group and with the parent's environment of the moment.

BACKEND=weft imports weft_torch (which registers the backend) in the parent and,
through the re-import of this module that the spawn start method does, in every
rank. Nothing in torch is patched: tests that the suite gates on backend names
(BACKEND == "gloo", require_backend, DistTestCases sets) skip or run exactly as
the suite decides for a backend called "weft".

Output: one line per test in --results (status, name, seconds, reason), a log
of every failure's text in --results + ".log", every rank's stderr in
--results + ".ranks.log", and a final counts line naming the list that was run:

  distributed_test.py backend=weft world_size=3 list=ops-cpu(123 of 279),forkserver: 70 pass / 50 skip / 3 fail (3 error) in 68.8 s

Exit status: 0 when every selected test passed or skipped, 1 otherwise
(check.sh decides what must pass; this exit status is informational).
"""
import argparse
import contextlib
import logging
import multiprocessing
import multiprocessing.context
import os
import re
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STUBS = os.path.join(HERE, "stubs")

# Subset "ops": every test of an operation that weft implements (send, recv,
# isend, irecv, broadcast, all_gather (+ _base / into_tensor / coalesced),
# all_reduce (+ coalesced), reduce, reduce_scatter (+ _base / tensor),
# all_to_all (+ single), gather, scatter, barrier), with their dtype, async,
# group and new_group variants, the same operations under the autograd and
# torch profilers, Work.get_future, and the process-group plumbing those tests
# lean on (get_rank, backend name, new_group/subgroups, *_object collectives
# that ride on broadcast/all_gather/gather/scatter). Left out: DDP,
# SyncBatchNorm, monitored_barrier (a gloo-only call), model averaging and
# post-local-SGD (heavy, and about torch layers above the backend, not the
# backend's operations).
OPS_INCLUDE = [
    r"^test_(get_rank|get_backend|Backend_enum_class|destroy_group|destroy_full_group)$",
    r"^test_(get_rank_size_group|get_rank_size_full_group)$",
    r"^test_(new_subgroups|new_subgroups_.*|new_subgroups_by_enumeration.*)$",
    r"^test_.*send.*recv.*",
    r"^test_(send|recv|isend|irecv).*",
    r"^test_batch_isend_irecv.*",
    r"^test_broadcast.*",
    r"^test_(all_gather|allgather).*",
    r"^test_all_reduce.*",
    r"^test_reduce.*",
    r"^test_(all_to_all|alltoall).*",
    r"^test_gather.*",
    r"^test_scatter.*",
    r"^test_barrier.*",
    r"^test_.*_object.*",
    r"^test_irecv$",
    r"^test_isend.*",
    r"^test_nccl_backend_bool.*",
    r"^test_get_future$",
    r"^test_backend_(group|full_group)$",
    r"^test_sparse_all_reduce_sum.*",
]
# "ops-cpu" further drops the tests that need CUDA devices or NCCL by name:
# on a CPU-only torch (Debian's) every one of them skips, but only after its
# ranks were spawned (1-5 s each on a 2-core machine).
OPS_CPU_EXCLUDE = [r"cuda", r"multigpu", r"nccl", r"_gpu$"]
# Within the included names, these are the torch-layer tests the subset drops.
OPS_EXCLUDE = [
    r"ddp", r"DDP", r"DistributedDataParallel", r"sync_batch", r"SyncBatch",
    r"monitored_barrier", r"model_averag",
    r"post_localSGD", r"periodic_model", r"hierarchical",
]


def _parse_args(argv):
    p = argparse.ArgumentParser(
        description="Run torch's distributed_test.py over one backend "
        "(spawn harness, file store).")
    p.add_argument("--backend", required=True,
                   help="backend name: weft or gloo (any registered name works)")
    p.add_argument("--world-size", type=int, default=2,
                   help="ranks per test (WORLD_SIZE); default 2")
    p.add_argument("--list", dest="list_name", default="full",
                   choices=["full", "ops", "ops-cpu"],
                   help="which list of tests: full (every test of the suite), "
                   "ops (the tests of the operations weft implements; "
                   "see OPS_INCLUDE) or ops-cpu (ops without the CUDA/NCCL "
                   "ones); default full")
    p.add_argument("--tests-from", metavar="FILE",
                   help="run exactly the test names in FILE (one a line, "
                   "'#' comments); overrides --list")
    p.add_argument("-k", dest="patterns", action="append", default=[],
                   help="keep only tests whose name matches this regex "
                   "(repeatable, any match keeps)")
    p.add_argument("--results", metavar="FILE",
                   help="write the per-test result list here "
                   "(default: results-<backend>-np<N>.txt in the cwd)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds one test may run before its ranks are killed "
                   "(distributed_test.py's DEFAULT_TIMEOUT, 300 s by default)")
    p.add_argument("--start-method", default="spawn",
                   choices=["spawn", "forkserver"],
                   help="how the ranks of a test start: spawn (a fresh "
                   "interpreter per rank that imports torch, as "
                   "test_distributed_spawn.py does; default) or forkserver "
                   "(forked from one server process that imported torch and "
                   "the suite once: the same tests, without the 1-2 s import "
                   "per rank)")
    p.add_argument("--list-tests", action="store_true",
                   help="print the selected test names and exit")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each test's result as it finishes")
    return p.parse_args(argv)


def _prepare_environment(backend, world_size):
    """Set what distributed_test.py reads at import time, as run_test.py does."""
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world_size)
    tmp_dir = tempfile.mkdtemp(prefix="weft-dist-test-")
    os.environ["TEMP_DIR"] = tmp_dir
    os.mkdir(os.path.join(tmp_dir, "barrier"))
    os.mkdir(os.path.join(tmp_dir, "test_dir"))
    # test_distributed_spawn.py is given a file:// directory; the tests take
    # their store file from MultiProcessTestCase (self.file_name) anyway.
    os.environ["INIT_METHOD"] = "file://" + tmp_dir + "/"
    return tmp_dir


def _import_path():
    # Debian lacks the PyPI module expecttest that common_utils imports; use
    # the local stub only in that case.
    try:
        import expecttest  # noqa: F401
    except ImportError:
        sys.path.insert(0, STUBS)


class _EnvForkServerProcess(multiprocessing.context.ForkServerProcess):
    """A forkserver rank that runs in the environment its parent has now.

    A spawned rank inherits the parent's environment of the moment; a rank
    forked by the forkserver would get the server's (that of the first test),
    but TestDistBackend.setUp makes a new TEMP_DIR for every test.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parent_env = dict(os.environ)

    def run(self):
        os.environ.clear()
        os.environ.update(self._parent_env)
        # The one module-level value of the suite that follows a per-test
        # environment variable (read at import, which happened once, in the
        # server): test_barrier_timeout_global re-joins through it.
        dt = sys.modules.get(
            "torch.testing._internal.distributed.distributed_test")
        if dt is not None:
            dt.INIT_METHOD = os.getenv("INIT_METHOD", "env://")
        super().run()


def _build_test_class():
    """The test class of test_distributed_spawn.py, built once BACKEND is set.

    The spawn start method pickles TestDistBackendWithSpawn._run by the class's
    qualified name, so the class must be reachable as a global of this module
    in the ranks too; the module-level code at the bottom does that.
    """
    _import_path()
    if os.environ["BACKEND"] == "weft":
        # Registers the "weft" backend with torch.distributed (in each rank,
        # since every rank re-imports this module).
        import weft_torch  # noqa: F401
    import torch
    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest, TestDistBackend)

    torch.backends.cuda.matmul.allow_tf32 = False

    start_method = os.environ.get("WEFT_DIST_TEST_START", "spawn")

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if start_method == "spawn":
                # What test_distributed_spawn.py does.
                self._spawn_processes()
            else:
                # forkserver: each rank is still a fresh process that has
                # initialized nothing, forked from a server that imported
                # torch and this module once (see --start-method).
                self._start_processes(_EnvForkServerProcess)
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    TestDistBackendWithSpawn.__module__ = __name__
    return TestDistBackendWithSpawn


def _all_test_names(cls):
    return sorted(n for n in dir(cls) if n.startswith("test_")
                  and callable(getattr(cls, n)))


def _select(names, args):
    if args.tests_from:
        wanted = []
        with open(args.tests_from) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    wanted.append(line)
        unknown = [n for n in wanted if n not in names]
        if unknown:
            sys.exit("run_distributed_test.py: tests not in distributed_test.py: "
                     + ", ".join(unknown))
        selected = wanted
        list_label = "file:" + os.path.basename(args.tests_from)
    elif args.list_name in ("ops", "ops-cpu"):
        inc = [re.compile(r) for r in OPS_INCLUDE]
        exc = [re.compile(r) for r in OPS_EXCLUDE]
        if args.list_name == "ops-cpu":
            exc += [re.compile(r) for r in OPS_CPU_EXCLUDE]
        selected = [n for n in names if any(r.search(n) for r in inc)
                    and not any(r.search(n) for r in exc)]
        list_label = args.list_name
    else:
        selected = list(names)
        list_label = "full"
    if args.patterns:
        pats = [re.compile(p) for p in args.patterns]
        selected = [n for n in selected if any(p.search(n) for p in pats)]
        list_label += "+k(" + "|".join(args.patterns) + ")"
    return selected, "%s(%d of %d)" % (list_label, len(selected), len(names))


class _RecordingResult(unittest.TextTestResult):
    """Keeps one (status, seconds, reason, text) per test, in run order."""

    def __init__(self, stream, descriptions, verbosity, on_done=None):
        super().__init__(stream, descriptions, verbosity)
        self.records = []
        self._t0 = None
        self._on_done = on_done

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def _record(self, test, status, reason="", text=""):
        name = test.id().split(".")[-1]
        secs = time.monotonic() - self._t0 if self._t0 else 0.0
        # A skipped or failed test can report twice (e.g. error in tearDown);
        # the worst report wins.
        rank = {"pass": 0, "skip": 1, "fail": 2, "error": 3}
        if self.records and self.records[-1][1] == name:
            if rank[status] <= rank[self.records[-1][0]]:
                return
            self.records.pop()
        self.records.append((status, name, secs, reason, text))
        if self._on_done:
            self._on_done(status, name, secs, reason)

    @staticmethod
    def _reason_of(text):
        # The last non-empty line of a traceback is the exception; child-rank
        # tracebacks are embedded in the RuntimeError text, so take the last
        # line that looks like an exception.
        lines = [l.strip() for l in text.splitlines() if l.strip()]
        for l in reversed(lines):
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", l):
                return l[:300]
        return lines[-1][:300] if lines else ""

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", str(reason)[:300])

    def addFailure(self, test, err):
        super().addFailure(test, err)
        text = self._exc_info_to_string(err, test)
        self._record(test, "fail", self._reason_of(text), text)

    def addError(self, test, err):
        super().addError(test, err)
        text = self._exc_info_to_string(err, test)
        self._record(test, "error", self._reason_of(text), text)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "fail", "unexpected success")


def main(argv):
    args = _parse_args(argv)
    # common_utils parses sys.argv when imported (and the ranks inherit
    # sys.argv through spawn): give it nothing of ours to misread.
    sys.argv = [sys.argv[0]]
    tmp_dir = _prepare_environment(args.backend, args.world_size)
    os.environ["WEFT_DIST_TEST_START"] = args.start_method

    cls = _build_test_class()
    globals()["TestDistBackendWithSpawn"] = cls

    import torch.testing._internal.distributed.distributed_test as dt
    # common_distributed configures INFO logging (a few lines per rank per
    # test); keep the parent's output to the counts and our own lines.
    logging.getLogger().setLevel(logging.WARNING)
    if args.timeout is not None:
        # The per-test limit the harness's parent applies before it kills the
        # ranks; a knob of the harness, not of any test's behaviour.
        dt.DEFAULT_TIMEOUT = args.timeout
        dt.CUSTOMIZED_TIMEOUT.clear()

    names = _all_test_names(cls)
    selected, label = _select(names, args)
    if args.list_tests:
        print("\n".join(selected))
        print("# list=%s" % label, file=sys.stderr)
        return 0

    results_path = args.results or "results-%s-np%d.txt" % (
        args.backend, args.world_size)
    log_path = results_path + ".log"
    # Every rank's stderr (logging, torch warnings, its side of a failure)
    # goes to one file instead of the console; the failure text the parent
    # sees is in log_path too.
    rank_log = results_path + ".ranks.log"
    open(rank_log, "w").close()
    os.environ["WEFT_DIST_TEST_RANK_LOG"] = os.path.abspath(rank_log)

    console = sys.stdout

    def on_done(status, name, secs, reason):
        if args.verbose:
            print("%-5s %-60s %6.1fs %s" % (status, name, secs, reason),
                  file=console, flush=True)

    if args.start_method == "forkserver":
        # The server imports these once; each rank forked from it then only
        # re-runs this module's own code (the class). Named modules, not
        # "__main__": Python 3.11's forkserver silently skips that one.
        preload = ["torch", "torch.distributed",
                   "torch.testing._internal.distributed.distributed_test",
                   "torch.nn.parallel._replicated_tensor_ddp_utils"]
        if args.backend == "weft":
            preload.append("weft_torch")
        multiprocessing.set_forkserver_preload(preload)
        label += ",forkserver"

    suite = unittest.TestSuite(cls(n) for n in selected)
    devnull = open(os.devnull, "w")
    runner = unittest.TextTestRunner(
        stream=devnull, verbosity=0,
        resultclass=lambda s, d, v: _RecordingResult(s, d, v, on_done))
    print("distributed_test.py: backend=%s world_size=%d list=%s, results in %s"
          % (args.backend, args.world_size, label, results_path), flush=True)
    t0 = time.monotonic()
    # The harness's parent prints a line for each rank that failed ("Process 1
    # terminated with exit code 10 ..."); the results files hold that story.
    with contextlib.redirect_stdout(devnull):
        result = runner.run(suite)
    wall = time.monotonic() - t0
    devnull.close()

    counts = {"pass": 0, "skip": 0, "fail": 0, "error": 0}
    with open(results_path, "w") as out, open(log_path, "w") as log:
        out.write("# distributed_test.py backend=%s world_size=%d list=%s "
                  "torch=%s\n" % (args.backend, args.world_size, label,
                                  __import__("torch").__version__))
        out.write("# status\ttest\tseconds\treason\n")
        for status, name, secs, reason, text in result.records:
            counts[status] += 1
            out.write("%s\t%s\t%.1f\t%s\n" % (status, name, secs,
                                               reason.replace("\t", " ")
                                               .replace("\n", " ")))
            if text:
                log.write("==== %s %s\n%s\n" % (status, name, text))
    try:
        os.rmdir(os.path.join(tmp_dir, "barrier"))
        os.rmdir(os.path.join(tmp_dir, "test_dir"))
        os.rmdir(tmp_dir)
    except OSError:
        pass

    print("distributed_test.py backend=%s world_size=%d list=%s: "
          "%d pass / %d skip / %d fail (%d error) in %.1f s"
          % (args.backend, args.world_size, label, counts["pass"],
             counts["skip"], counts["fail"] + counts["error"], counts["error"],
             wall), flush=True)
    return 0 if counts["fail"] + counts["error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
elif os.environ.get("BACKEND") and __name__ == "__mp_main__":
    # A rank started by the spawn start method: rebuild the class the parent
    # pickled by name (sys.path, sys.argv and the environment come from the
    # parent).
    _log = os.environ.get("WEFT_DIST_TEST_RANK_LOG")
    if _log:
        _fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(_fd, 2)
        os.close(_fd)
    TestDistBackendWithSpawn = _build_test_class()
