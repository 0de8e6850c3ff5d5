/*
 * weft_allgather over whatever transports the ctest entry selects (shm, tcp,
 * virtual nodes): every algorithm that applies to the rank count, forced with
 * WEFT_ALLGATHER_ALGO on a comm of its own, and the selector; in place and
 * out of place; block
 * sizes from 0 to 16 MiB. Each rank's block carries a pattern of (rank,
 * size, call), so a block from the wrong rank, a stale block from an earlier
 * call or a shifted byte all show, and guard bytes around recvbuf catch a
 * write past either end. Every buffer weft reads or writes is a TestBuf
 * (weft_test_mem.h): host memory, or CUDA device memory under
 * WEFT_TEST_MEM=device (weft_mpi_coll_dev, mpi_tests/device.cmake).
 */
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"
#include "weft_test_mem.h"

using namespace weft_mpitest;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

/* A comm of its own for the scope, created with WEFT_ALLGATHER_ALGO=algo in
 * its configuration ("auto": the selector decides, whatever the environment
 * says). Collective: the same value on every rank. The comm is destroyed at
 * the end of the scope, unless the test failed (then it is leaked, as
 * WeftMpiTest does, since the ranks may no longer agree). */
class ForceAlgo {
public:
    explicit ForceAlgo(const std::string &algo)
    {
        rc_ = create_with(MPI_COMM_WORLD, {{"WEFT_ALLGATHER_ALGO", algo}}, &comm_);
        if (rc_ != WEFT_SUCCESS)
            comm_ = nullptr;
    }
    ~ForceAlgo()
    {
        if (comm_ && !::testing::Test::HasFailure()) {
            EXPECT_EQ(weft_comm_destroy(comm_), WEFT_SUCCESS);
        }
    }
    ForceAlgo(const ForceAlgo &) = delete;
    ForceAlgo &operator=(const ForceAlgo &) = delete;

    weft_comm_t *comm() const { return comm_; }
    /* weft_comm_create_config's code (fails the same way on every rank). */
    int rc() const { return rc_; }
    std::string last_error() const { return weft_comm_last_error(comm_); }

private:
    weft_comm_t *comm_ = nullptr;
    int rc_ = WEFT_ERR_INTERNAL;
};

bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

/* The algorithms that can run at this rank count, then the selector. */
std::vector<std::string> algos_for(int size)
{
    std::vector<std::string> a = {"ring", "bruck", "direct", "hier"};
    if (is_pow2(size))
        a.push_back("rd");
    a.push_back("auto");
    return a;
}

/* Block sizes: the full list where it is affordable; at 5 and more ranks
 * (oversubscribed, n times the memory per rank), and under
 * WEFT_TEST_SIZES=reduced, a shorter list that still has the zero, odd,
 * page-crossing and multi-chunk cases. */
std::vector<size_t> block_sizes(int size)
{
    if (size <= 4 && !reduced_sizes())
        return {0, 1, 3, 8, 1000, 4096, 65537, 1 * MiB, 16 * MiB};
    return {0, 1, 3, 8, 1000, 65537, 1 * MiB + 3};
}

uint64_t block_seed(int owner, size_t bytes, uint64_t call)
{
    return pattern_seed(owner, (int)(bytes & 0x7fffffff), call);
}

class Allgather : public WeftMpiTest {
protected:
    uint64_t calls = 0;

    /* One allgather of `bytes` per rank on c (created for algo); checks
     * the return code, every block and the guards. */
    void run_and_check(weft_comm_t *c, size_t bytes, bool in_place, const std::string &algo)
    {
        const uint64_t call = calls++;
        const size_t total = bytes * (size_t)size;
        TestBuf recv(total, TestBuf::kGuarded, call % 3); /* odd alignments too */
        ASSERT_TRUE(recv.ok()) << recv.error();
        TestBuf send;
        const void *sendbuf;
        unsigned char *mine = recv.data() + (size_t)rank * bytes;
        if (in_place) {
            recv.fill_pattern_at((size_t)rank * bytes, bytes, block_seed(rank, bytes, call));
            sendbuf = mine;
        } else {
            send = TestBuf(bytes + 1);
            ASSERT_TRUE(send.ok()) << send.error();
            send.fill_pattern_at(1, bytes, block_seed(rank, bytes, call));
            sendbuf = send.data() + 1;
        }
        int rc = weft_allgather(c, bytes ? sendbuf : nullptr, bytes ? recv.data() : nullptr, bytes);
        ASSERT_EQ(rc, WEFT_SUCCESS) << "algo " << algo << " bytes " << bytes
                                    << (in_place ? " in place" : " out of place") << ": "
                                    << weft_strerror(rc) << ": " << weft_comm_last_error(c);
        for (int r = 0; r < size; r++) {
            size_t bad = recv.pattern_mismatch_at((size_t)r * bytes, bytes, block_seed(r, bytes, call));
            ASSERT_EQ(bad, SIZE_MAX) << "algo " << algo << " bytes " << bytes
                                     << (in_place ? " in place" : " out of place") << ": block of rank " << r
                                     << " wrong from offset " << bad;
        }
        ASSERT_TRUE(recv.GuardsIntact()) << "algo " << algo << " bytes " << bytes;
        if (!in_place) {
            ASSERT_TRUE(send.pattern_mismatch_at(1, bytes, block_seed(rank, bytes, call)) == SIZE_MAX)
                << "sendbuf was modified";
        }
    }
};

/* Every applicable algorithm x every block size x in place / out of place. */
TEST_F(Allgather, EveryAlgorithmEverySize)
{
    const std::vector<std::string> algos = algos_for(size);
    for (size_t a = 0; a < algos.size(); a++) {
        const std::string &algo = algos[a];
        ForceAlgo force(algo);
        ASSERT_EQ(force.rc(), WEFT_SUCCESS) << "weft_comm_create with WEFT_ALLGATHER_ALGO=" << algo;
        for (size_t bytes : block_sizes(size)) {
            for (bool in_place : {false, true}) {
                /* 16 MiB blocks cost most of the suite's time: each
                 * algorithm runs them in one mode, alternating, so both
                 * modes still see them. */
                if (bytes >= 16 * MiB && in_place != (a % 2 == 1))
                    continue;
                run_and_check(force.comm(), bytes, in_place, algo);
                if (HasFailure())
                    return;
            }
        }
    }
}

/* Allgathers of different sizes and algorithms back to back, no barrier
 * between them, all outstanding data checked only at the end: a fast rank's
 * next call must never feed a slow rank's current one. The comms (one per
 * algorithm, the algorithm is fixed at create) all exist before the first
 * call, so nothing synchronises the calls; on the selector's comm the
 * algorithm changes with the size from call to call. */
TEST_F(Allgather, BackToBackDifferentSizes)
{
    const std::vector<size_t> seq = {1, 65537, 3, 300 * KiB + 1, 0, 8, 4096, 1000, 2 * MiB + 5, 1};
    const std::vector<std::string> algos = algos_for(size);
    std::vector<std::unique_ptr<ForceAlgo>> forced;
    for (const std::string &algo : algos) {
        forced.emplace_back(new ForceAlgo(algo));
        ASSERT_EQ(forced.back()->rc(), WEFT_SUCCESS) << "weft_comm_create with WEFT_ALLGATHER_ALGO=" << algo;
    }
    std::vector<std::unique_ptr<TestBuf>> bufs;
    for (size_t i = 0; i < seq.size() * 2; i++) {
        size_t bytes = seq[i % seq.size()];
        const ForceAlgo &force = *forced[i % algos.size()];
        bufs.emplace_back(new TestBuf(bytes * (size_t)size, TestBuf::kGuarded));
        ASSERT_TRUE(bufs.back()->ok()) << bufs.back()->error();
        unsigned char *rb = bufs.back()->data();
        bufs.back()->fill_pattern_at((size_t)rank * bytes, bytes, block_seed(rank, bytes, 1000 + i));
        int rc = weft_allgather(force.comm(), rb + (size_t)rank * bytes, rb, bytes);
        ASSERT_EQ(rc, WEFT_SUCCESS) << "call " << i << " bytes " << bytes << ": " << force.last_error();
    }
    for (size_t i = 0; i < bufs.size(); i++) {
        size_t bytes = seq[i % seq.size()];
        for (int r = 0; r < size; r++)
            ASSERT_TRUE(bufs[i]->HasPatternAt((size_t)r * bytes, bytes, r, (int)(bytes & 0x7fffffff), 1000 + i))
                << "call " << i << " (" << algos[i % algos.size()] << ") block of rank " << r;
        ASSERT_TRUE(bufs[i]->GuardsIntact()) << "call " << i;
    }
}

/* rd cannot run on a rank count that is not a power of two: refused on every
 * rank with INVALID_ARG and a message, never replaced by another algorithm. */
TEST_F(Allgather, RecursiveDoublingRefusedOnNonPowerOfTwo)
{
    if (is_pow2(size))
        GTEST_SKIP() << size << " ranks is a power of two";
    ForceAlgo force("rd");   /* the name is valid: the comm is created */
    ASSERT_EQ(force.rc(), WEFT_SUCCESS);
    TestBuf recv(8 * (size_t)size, TestBuf::kGuarded), send(8);
    ASSERT_TRUE(recv.ok() && send.ok()) << recv.error() << send.error();
    send.write(0, "\1\1\1\1\1\1\1\1", 8);
    int rc = weft_allgather(force.comm(), send.data(), recv.data(), 8);
    EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG);
    EXPECT_NE(force.last_error().find("power-of-two"), std::string::npos) << force.last_error();
    EXPECT_NE(force.last_error().find("rd"), std::string::npos) << force.last_error();
    ASSERT_TRUE(recv.Untouched()) << "a refused allgather wrote into recvbuf";
    ASSERT_TRUE(recv.GuardsIntact());
    /* The comm is still usable afterwards. */
    EXPECT_EQ(weft_barrier(force.comm()), WEFT_SUCCESS) << force.last_error();
}

/* An unknown name is a configuration error, found at weft_comm_create
 * like any other WEFT_* setting: the create fails with INVALID_ARG on every
 * rank, and the message (a warning: there is no comm to hold it) names the
 * variable and the value. Warnings print from WEFT_DEBUG=warn up; the level
 * is the one of the last comm created, so a quiet run creates one at warn
 * first (and the refused one has WEFT_DEBUG=warn too) and one at its own
 * level (the environment's) after. */
TEST_F(Allgather, UnknownAlgorithmRefused)
{
    const char *dbg_env = std::getenv("WEFT_DEBUG");
    const std::string dbg = dbg_env ? dbg_env : "";
    const bool quiet = dbg.empty() || dbg == "none" || dbg == "0";
    auto set_level = [](const Settings &settings) {
        weft_comm_t *tmp = nullptr;
        ASSERT_EQ(create_with(MPI_COMM_WORLD, settings, &tmp), WEFT_SUCCESS);
        ASSERT_EQ(weft_comm_destroy(tmp), WEFT_SUCCESS);
    };
    Settings refused = {{"WEFT_ALLGATHER_ALGO", "ringg"}};
    if (quiet) {
        set_level({{"WEFT_DEBUG", "warn"}});
        refused.push_back({"WEFT_DEBUG", "warn"});
    }
    weft_comm_t *bad = nullptr;
    int rc = WEFT_SUCCESS;
    std::string log = capture_stderr([&] { rc = create_with(MPI_COMM_WORLD, refused, &bad); });
    if (quiet)
        set_level({});   /* the environment's level */
    EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG);
    if (rc == WEFT_SUCCESS)
        weft_comm_destroy(bad);
    EXPECT_NE(log.find("WEFT_ALLGATHER_ALGO=ringg"), std::string::npos) << log;
    /* The fixture's comm is not affected. */
    EXPECT_EQ(weft_barrier(comm), WEFT_SUCCESS) << last_error();
}

TEST_F(Allgather, ArgumentChecks)
{
    TestBuf recv(16 * (size_t)size), send(16);
    ASSERT_TRUE(recv.ok() && send.ok()) << recv.error() << send.error();
    EXPECT_EQ(weft_allgather(nullptr, send.data(), recv.data(), 16), WEFT_ERR_INVALID_ARG);

    EXPECT_EQ(weft_allgather(comm, nullptr, recv.data(), 16), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("sendbuf"), std::string::npos) << last_error();
    EXPECT_NE(last_error().find("rank " + std::to_string(rank)), std::string::npos) << last_error();

    EXPECT_EQ(weft_allgather(comm, send.data(), nullptr, 16), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("recvbuf"), std::string::npos) << last_error();

    /* Overlapping recvbuf without being the in-place slot. */
    if (size > 1) {
        unsigned char *wrong = recv.data() + (size_t)((rank + 1) % size) * 16 + 1;
        EXPECT_EQ(weft_allgather(comm, wrong, recv.data(), 16), WEFT_ERR_INVALID_ARG);
        EXPECT_NE(last_error().find("overlaps"), std::string::npos) << last_error();
    }

    /* Zero bytes: NULL buffers are fine. */
    EXPECT_EQ(weft_allgather(comm, nullptr, nullptr, 0), WEFT_SUCCESS) << last_error();
    /* After refused calls the next collective works on every rank. */
    EXPECT_EQ(weft_barrier(comm), WEFT_SUCCESS) << last_error();
}

/* Totals above 4 GiB: 2 GiB + 3 bytes per rank, in place (no second copy of
 * the data), so offsets and lengths must be size_t end to end. Label: Huge. */
TEST_F(Allgather, HugeTotalAbove4GiB)
{
    const size_t bytes = 2048 * MiB + 3;
    WEFT_SKIP_IF_DEVICE_MEM("> 4 GiB totals are tested with host buffers (label huge)");
    if (size != 2)
        GTEST_SKIP() << "run at np 2 only (memory)";
    for (const std::string algo : {"ring"}) { /* the chunked offsets; one pass: CI time */
        ForceAlgo force(algo);
        ASSERT_EQ(force.rc(), WEFT_SUCCESS);
        const size_t total = bytes * (size_t)size;
        std::unique_ptr<unsigned char[]> rb(new (std::nothrow) unsigned char[total]);
        ASSERT_TRUE(rb) << "no memory for " << total << " bytes";
        {   /* transparent huge pages where offered on request: far fewer page faults (CI time) */
            const uintptr_t page = 4096, lo = ((uintptr_t)rb.get() + page - 1) & ~(page - 1);
            (void)madvise((void *)lo, ((uintptr_t)rb.get() + total - lo) & ~(page - 1), MADV_HUGEPAGE);
        }
        fill_pattern(rb.get() + (size_t)rank * bytes, bytes, block_seed(rank, bytes, 77));
        int rc = weft_allgather(force.comm(), rb.get() + (size_t)rank * bytes, rb.get(), bytes);
        ASSERT_EQ(rc, WEFT_SUCCESS) << algo << ": " << force.last_error();
        for (int r = 0; r < size; r++)
            ASSERT_EQ(pattern_mismatch(rb.get() + (size_t)r * bytes, bytes, block_seed(r, bytes, 77)), SIZE_MAX)
                << algo << ": block of rank " << r;
    }
}

/* A p2p step that fails (here: rank 1 never joins, so rank 0's receive times
 * out after WEFT_TIMEOUT=2 s) returns the p2p code, and the last error names
 * the algorithm and the step. Runs on its own comm, created with the short
 * timeout and the ring in its configuration. Label: StepFailure. */
TEST_F(Allgather, StepFailureNamesAlgorithmAndStep)
{
    if (size != 2)
        GTEST_SKIP() << "np 2 only";
    weft_comm_t *c2 = nullptr;
    int rc = create_with(MPI_COMM_WORLD, {{"WEFT_TIMEOUT", "2"}, {"WEFT_ALLGATHER_ALGO", "ring"}}, &c2);
    ASSERT_EQ(rc, WEFT_SUCCESS);
    if (rank == 0) {
        TestBuf recv(2 * 64), send(64);
        ASSERT_TRUE(recv.ok() && send.ok()) << recv.error() << send.error();
        rc = weft_allgather(c2, send.data(), recv.data(), 64);
        EXPECT_EQ(rc, WEFT_ERR_TIMEOUT) << weft_comm_last_error(c2);
        std::string err = weft_comm_last_error(c2);
        EXPECT_NE(err.find("allgather ring step"), std::string::npos) << err;
        EXPECT_NE(err.find("peer 1"), std::string::npos) << err;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* The call failed; the comm is not used again. */
    EXPECT_EQ(weft_comm_destroy(c2), WEFT_SUCCESS);
}

/* WEFT_DEBUG=info (set by the ctest entry): the choice for a shape is logged
 * once, a new shape logs again. stderr is captured into a file per rank. */
TEST_F(Allgather, InfoLogsEachShapeOnce)
{
    const char *dbg = std::getenv("WEFT_DEBUG");
    if (!dbg || std::string(dbg) != "info")
        GTEST_SKIP() << "needs WEFT_DEBUG=info";
    if (size == 1)
        GTEST_SKIP() << "one rank: nothing is selected";
    char path[] = "/tmp/weft_coll_log_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    TestBuf recv(4096 * (size_t)size);
    int rc1 = weft_allgather(comm, recv.data() + (size_t)rank * 8, recv.data(), 8);
    int rc2 = weft_allgather(comm, recv.data() + (size_t)rank * 8, recv.data(), 8);
    int rc3 = weft_allgather(comm, recv.data() + (size_t)rank * 4096, recv.data(), 4096);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    EXPECT_EQ(rc1, WEFT_SUCCESS);
    EXPECT_EQ(rc2, WEFT_SUCCESS);
    EXPECT_EQ(rc3, WEFT_SUCCESS);
    std::ifstream in(path);
    std::string line;
    int lines_8 = 0, lines_4096 = 0;
    while (std::getline(in, line)) {
        if (line.find("allgather 8 B per rank") != std::string::npos)
            lines_8++;
        if (line.find("allgather 4096 B per rank") != std::string::npos)
            lines_4096++;
    }
    unlink(path);
    EXPECT_EQ(lines_8, 1) << "the 8-byte shape must be logged exactly once";
    EXPECT_EQ(lines_4096, 1);
}

} // namespace
