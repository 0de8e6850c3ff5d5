#!/bin/sh
# ctest entries info_* (tools/weft_info/tests.cmake): runs weft_info and
# asserts the lines it must print. Usage: test_weft_info.sh CASE BINARY [MPIEXEC NP]
# The environment (WEFT_*, emulators) comes from the ctest entry.
set -u
case_=$1
bin=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL ($case_): $*"; echo "---- output:"; cat "$out"; exit 1; }
# expect REGEX: some line of the output matches (extended regex)
expect() { grep -Eq -- "$1" "$out" || fail "no line matches: $1"; }
reject() { ! grep -Eq -- "$1" "$out" || fail "a line matches: $1"; }

case $case_ in
options|native|json|cma_off)
    # this machine as it is: no emulator, whatever the outer environment says
    unset WEFT_CUDA_LIB WEFT_IBVERBS_LIB WEFT_TOPO_XML ;;
esac
case $case_ in
options)
    "$bin" --help >"$out" 2>&1 || fail "--help exited $?"
    expect '^usage: weft_info'
    "$bin" --version >"$out" 2>&1 || fail "--version exited $?"
    expect '^weft [0-9]+\.[0-9]+\.[0-9]+$'
    "$bin" --bogus >"$out" 2>&1; rc=$?
    [ $rc -eq 2 ] || fail "--bogus exited $rc, expected 2"
    expect "unknown option '--bogus'"
    WEFT_TCP_STREAMS=0 "$bin" >"$out" 2>&1; rc=$?
    [ $rc -eq 1 ] || fail "a bad WEFT_TCP_STREAMS exited $rc, expected 1"
    expect '^weft_info: bad configuration: WEFT_TCP_STREAMS=0: 0 is not allowed here'
    ;;
native)
    # this machine: no GPU, no RDMA device; WEFT_TCP_IF=lo from the entry
    "$bin" >"$out" 2>&1 || fail "exited $?"
    expect '^weft [0-9]+\.[0-9]+\.[0-9]+$'
    expect '^build: .*, MPI (Open MPI|MPICH) [0-9]+\.[0-9]+(\.[0-9]+)?, CUDA headers '
    expect '^  self +carrier +usable'
    expect '^  shm +carrier +usable: segments in /dev/shm; single-copy CMA: (yes|no, .+)$'
    expect '^  tcp +carrier +usable: listening on lo \(127\.0\.0\.1:[0-9]+, WEFT_TCP_IF\)'
    expect '^  ib +carrier +not usable: (no RDMA device|cannot load the verbs library)'
    expect '^  cuda_ipc +mover +not usable: no CUDA device: '
    expect '^  staged +not usable: no CUDA: '
    expect '^cuda: not usable: .*(insufficient|cannot load|no usable device|without)'
    expect '^  WEFT_TCP_IF +lo +environment$'
    expect '^  WEFT_TIMEOUT +300 +default$'
    expect '^  WEFT_TCP_STREAMS +4 +default \*$'
    expect '^  WEFT_TYPO_VARIABLE=1: not a weft setting \(a typo\?\)$'
    reject 'WARN'
    ;;
cma_off)
    "$bin" >"$out" 2>&1 || fail "exited $?"
    expect '^  shm +carrier +usable: segments in /dev/shm; single-copy CMA: no, off \(WEFT_SHM_CMA=0\)$'
    expect '^  WEFT_SHM_CMA +0 +environment$'
    ;;
emu)
    # emulated ib and CUDA, the topology of tests/topo/2gpu-2nic.xml
    "$bin" >"$out" 2>&1 || fail "exited $?"
    expect '^  ib +carrier +usable: emu_0 port 1 \(InfiniBand, LID [0-9]+, MTU [0-9]+\) from .*libweft_emu_verbs\.so; GPUDirect RDMA: '
    expect '^  cuda_ipc +mover +usable: 2 CUDA device\(s\) from .*libweft_emu_cuda\.so'
    expect '^  mover +usable: device to device between ranks of one node by cuda_ipc$'
    expect '^  staged +usable: '
    expect '^cuda: usable: .*libweft_emu_cuda\.so, 2 device\(s\)$'
    expect '^  cuda0 0000:04:00\.0 -> NIC mlx5_0 \(same PCIe switch\)$'
    expect '^  cuda1 0000:08:00\.0 -> NIC mlx5_1 \(same PCIe switch\)$'
    expect '^topology: 2 GPU\(s\), 2 RDMA NIC\(s\) in WEFT_TOPO_XML='
    expect '^  WEFT_CUDA_LIB +.*libweft_emu_cuda\.so +environment$'
    expect '^  WEFT_EMU_CUDA_BUSIDS=0000:04:00\.0,0000:08:00\.0: read by the emulators'
    ;;
json)
    "$bin" --json >"$out" 2>&1 || fail "exited $?"
    python3 - "$out" <<'PY' || fail "the JSON does not parse or lacks what it must say"
import json, sys
d = json.load(open(sys.argv[1]))
tps = {t["name"]: t for t in d["transports"]}
assert tps["self"]["usable"] is True and tps["tcp"]["usable"] is True, tps
assert tps["ib"]["usable"] is False and tps["ib"]["detail"], tps["ib"]
assert [p["name"] for p in d["paths"]] == ["mover", "native", "staged"], d["paths"]
s = {x["name"]: x for x in d["settings"]}
assert s["WEFT_TCP_IF"] == {"name": "WEFT_TCP_IF", "value": "lo", "origin": "environment", "must_agree": False}, s["WEFT_TCP_IF"]
assert s["WEFT_EAGER_WINDOW"]["origin"] == "default" and s["WEFT_EAGER_WINDOW"]["must_agree"] is True
assert d["version"].count(".") == 2 and d["cuda"]["usable"] is False
PY
    ;;
pairs_shm|pairs_vnodes2|pairs_tcp)
    mpiexec=$3
    np=$4
    "$mpiexec" --oversubscribe -np "$np" "$bin" --pairs >"$out" 2>&1 || fail "exited $?"
    expect "^comm of $np ranks"
    expect '^  rank 0: host [^,]+, node 0, pid [0-9]+, usable self,shm,tcp'
    expect '^  rank_a rank_b transport why$'
    reject 'OTHER END'
    [ "$(grep -Ec '^  [0-9]+ +[0-9]+ +[a-z_]+ ' "$out")" -eq $((np * (np - 1) / 2)) ] || fail "not one line per pair"
    case $case_ in
    pairs_shm)
        expect '^  0 +1 +shm +same node; shm is the first carrier that reaches it$'
        expect '^  1 +2 +shm +same node'
        reject '^  [0-9]+ +[0-9]+ +tcp' ;;
    pairs_vnodes2)
        # 3 ranks, 2 virtual nodes: {0,1} and {2}
        expect '^  0 +1 +shm +same node'
        expect '^  0 +2 +tcp +other node \(WEFT_VIRTUAL_NODES\); tcp is the first carrier that reaches it; not shm: other node; not ib: no usable RDMA port here$'
        expect '^  1 +2 +tcp +other node'
        expect '^  WEFT_VIRTUAL_NODES +2 +agreed \(environment\) \*$' ;;
    pairs_tcp)
        expect '^  0 +1 +tcp +same node; tcp is the first carrier that reaches it; not shm: not in WEFT_TRANSPORTS here; not ib: not in WEFT_TRANSPORTS here$'
        expect '^  WEFT_TRANSPORTS +tcp +agreed \(environment\) \*$' ;;
    esac
    "$mpiexec" --oversubscribe -np "$np" "$bin" --pairs --json >"$out" 2>&1 || fail "--json exited $?"
    python3 - "$out" "$np" <<'PY' || fail "the --pairs JSON does not parse or is incomplete"
import json, sys
d = json.load(open(sys.argv[1])); n = int(sys.argv[2])
assert len(d["ranks"]) == n and len(d["pairs"]) == n * (n - 1) // 2, d
assert all(p["both_ends_agree"] and p["transport"] in ("shm", "tcp") and p["why"] for p in d["pairs"]), d["pairs"]
PY
    ;;
*)
    echo "unknown case $case_"; exit 2 ;;
esac
echo "PASS ($case_)"
