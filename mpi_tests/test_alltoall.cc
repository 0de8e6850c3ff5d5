/*
 * weft_alltoall over whatever transports the ctest entry selects (shm, tcp,
 * virtual nodes; mpi_tests/alltoall.cmake): every algorithm, forced with
 * WEFT_ALLTOALL_ALGO on a comm of its own, and the selector; in place and
 * out of place; blocks of 0 B to 1 MiB. The block rank s sends to rank d
 * carries a pattern of (s, d, call) over its bytes, so a block from the
 * wrong rank, meant for another rank, left over from an earlier call or
 * shifted by a byte shows, and guard bytes around recvbuf catch a write
 * past either end. Every buffer weft reads or writes is a TestBuf
 * (weft_test_mem.h): host memory, or CUDA device memory under
 * WEFT_TEST_MEM=device (weft_mpi_a2a_dev).
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
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

/* A comm of its own, created with WEFT_ALLTOALL_ALGO=algo in its
 * configuration ("auto": the selector, whatever the environment says).
 * Collective. Destroyed at the end of the scope unless the test failed
 * (then leaked: the ranks may no longer agree on what comes next). */
class A2aComm {
public:
    explicit A2aComm(const std::string &algo)
    {
        rc_ = create_with(MPI_COMM_WORLD, {{"WEFT_ALLTOALL_ALGO", algo}}, &comm_);
        if (rc_ != WEFT_SUCCESS)
            comm_ = nullptr;
    }
    ~A2aComm()
    {
        if (comm_ && !::testing::Test::HasFailure()) {
            EXPECT_EQ(weft_comm_destroy(comm_), WEFT_SUCCESS);
        }
    }
    A2aComm(const A2aComm &) = delete;
    A2aComm &operator=(const A2aComm &) = delete;

    weft_comm_t *comm() const { return comm_; }
    int rc() const { return rc_; }
    std::string last_error() const { return weft_comm_last_error(comm_); }

private:
    weft_comm_t *comm_ = nullptr;
    int rc_ = WEFT_ERR_INTERNAL;
};

const std::vector<std::string> kAlgos = {"pairwise", "bruck", "auto"};

/* Block sizes: zero, one, odd, a page +-1, and 1 MiB (rendezvous, and the
 * pairwise window at 5+ ranks). Under WEFT_TEST_SIZES=reduced (device
 * entries) and at 5+ ranks (oversubscribed) a shorter list that keeps one
 * of each kind. */
std::vector<size_t> block_sizes(int size)
{
    if (size <= 4 && !reduced_sizes())
        return {0, 1, 7, 4095, 4096, 4097, 32 * KiB + 1, 1 * MiB};
    return {0, 1, 7, 4097, 1 * MiB};
}

/* The block rank src sends to rank dst in call `call`. */
uint64_t block_seed(int src, int dst, uint64_t call)
{
    return pattern_seed(src, dst, 0x7a2a0000ull + call);
}

class Alltoall : public WeftMpiTest {
protected:
    uint64_t calls = 0;

    /* Fills block d of buf (at off + d*bytes) with what this rank sends to d. */
    void fill_send(TestBuf &buf, size_t off, size_t bytes, uint64_t call)
    {
        for (int d = 0; d < size; d++)
            buf.fill_pattern_at(off + (size_t)d * bytes, bytes, block_seed(rank, d, call));
    }

    /* Block s of recv holds what rank s sent to this rank. */
    ::testing::AssertionResult received(const TestBuf &recv, size_t bytes, uint64_t call) const
    {
        for (int s = 0; s < size; s++) {
            size_t bad = recv.pattern_mismatch_at((size_t)s * bytes, bytes, block_seed(s, rank, call));
            if (!recv.error().empty())
                return ::testing::AssertionFailure() << "reading recvbuf back: " << recv.error();
            if (bad != SIZE_MAX)
                return ::testing::AssertionFailure() << "block from rank " << s << " wrong from offset " << bad;
        }
        return ::testing::AssertionSuccess();
    }

    /* One alltoall of `bytes` per rank on c; checks the return code, every
     * block, the guards and (out of place) that sendbuf is unchanged. */
    void run_and_check(weft_comm_t *c, size_t bytes, bool in_place, const std::string &algo)
    {
        const uint64_t call = calls++;
        const size_t total = bytes * (size_t)size;
        const std::string what = "algo " + algo + ", " + std::to_string(bytes) + " B per rank, " +
                                 (in_place ? "in place" : "out of place");
        TestBuf recv(total, TestBuf::kGuarded, call % 3); /* odd alignments too */
        ASSERT_TRUE(recv.ok()) << recv.error();
        TestBuf send;
        const void *sendbuf;
        if (in_place) {
            fill_send(recv, 0, bytes, call);
            sendbuf = recv.data();
        } else {
            send = TestBuf(total + 1);
            ASSERT_TRUE(send.ok()) << send.error();
            fill_send(send, 1, bytes, call);
            sendbuf = send.data() + 1;
        }
        int rc = weft_alltoall(c, bytes ? sendbuf : nullptr, bytes ? recv.data() : nullptr, bytes);
        ASSERT_EQ(rc, WEFT_SUCCESS) << what << ": " << weft_strerror(rc) << ": " << weft_comm_last_error(c);
        ASSERT_TRUE(received(recv, bytes, call)) << what;
        ASSERT_TRUE(recv.GuardsIntact()) << what;
        if (!in_place) {
            for (int d = 0; d < size; d++)
                ASSERT_EQ(send.pattern_mismatch_at(1 + (size_t)d * bytes, bytes, block_seed(rank, d, call)),
                          SIZE_MAX)
                    << what << ": sendbuf block for rank " << d << " was modified";
        }
    }
};

/* Every algorithm x every block size x in place / out of place. */
TEST_F(Alltoall, EveryAlgorithmEverySize)
{
    for (const std::string &algo : kAlgos) {
        A2aComm c(algo);
        ASSERT_EQ(c.rc(), WEFT_SUCCESS) << "weft_comm_create with WEFT_ALLTOALL_ALGO=" << algo;
        for (size_t bytes : block_sizes(size)) {
            for (bool in_place : {false, true}) {
                run_and_check(c.comm(), bytes, in_place, algo);
                if (HasFailure())
                    return;
            }
        }
    }
}

/* Calls of different sizes and algorithms back to back with no barrier
 * between them, every result checked only at the end: a fast rank's next
 * call must never feed a slow rank's current one. The comms all exist
 * before the first call. */
TEST_F(Alltoall, BackToBackDifferentSizes)
{
    const std::vector<size_t> seq = {1, 65537, 3, 0, 8, 4096, 300 * KiB + 1, 1};
    std::vector<std::unique_ptr<A2aComm>> comms;
    for (const std::string &algo : kAlgos) {
        comms.emplace_back(new A2aComm(algo));
        ASSERT_EQ(comms.back()->rc(), WEFT_SUCCESS) << "weft_comm_create with WEFT_ALLTOALL_ALGO=" << algo;
    }
    std::vector<std::unique_ptr<TestBuf>> bufs;
    for (size_t i = 0; i < seq.size() * 2; i++) {
        const size_t bytes = seq[i % seq.size()];
        const A2aComm &c = *comms[i % comms.size()];
        bufs.emplace_back(new TestBuf(bytes * (size_t)size, TestBuf::kGuarded));
        ASSERT_TRUE(bufs.back()->ok()) << bufs.back()->error();
        fill_send(*bufs.back(), 0, bytes, 1000 + i);
        unsigned char *b = bufs.back()->data();
        int rc = weft_alltoall(c.comm(), bytes ? b : nullptr, bytes ? b : nullptr, bytes); /* in place */
        ASSERT_EQ(rc, WEFT_SUCCESS) << "call " << i << " bytes " << bytes << ": " << c.last_error();
    }
    for (size_t i = 0; i < bufs.size(); i++) {
        const size_t bytes = seq[i % seq.size()];
        ASSERT_TRUE(received(*bufs[i], bytes, 1000 + i)) << "call " << i << " (" << kAlgos[i % kAlgos.size()]
                                                         << ", " << bytes << " B)";
        ASSERT_TRUE(bufs[i]->GuardsIntact()) << "call " << i;
    }
}

/* Non-blocking: several alltoalls outstanding on one comm (both
 * algorithms through the selector's sizes and a forced comm), with a
 * blocking allgather and a p2p exchange in between, completed together. */
TEST_F(Alltoall, SeveralOutstanding)
{
    A2aComm bruck("bruck");
    ASSERT_EQ(bruck.rc(), WEFT_SUCCESS);
    const std::vector<size_t> sizes = {8, 65537, 1, 4096};
    std::vector<std::unique_ptr<TestBuf>> send, recv;
    std::vector<weft_request_t *> reqs;
    for (size_t i = 0; i < sizes.size(); i++) {
        const size_t bytes = sizes[i];
        send.emplace_back(new TestBuf(bytes * (size_t)size));
        recv.emplace_back(new TestBuf(bytes * (size_t)size, TestBuf::kGuarded));
        ASSERT_TRUE(send.back()->ok() && recv.back()->ok()) << send.back()->error() << recv.back()->error();
        fill_send(*send.back(), 0, bytes, 2000 + i);
        weft_comm_t *c = i % 2 ? bruck.comm() : comm;
        weft_request_t *r = nullptr;
        int rc = weft_ialltoall(c, send.back()->data(), recv.back()->data(), bytes, &r);
        ASSERT_EQ(rc, WEFT_SUCCESS) << "ialltoall " << i << ": " << weft_comm_last_error(c);
        reqs.push_back(r);
        if (i == 1) {
            /* A blocking collective and p2p while two are in flight. */
            TestBuf ag(8 * (size_t)size);
            ASSERT_TRUE(ag.ok()) << ag.error();
            ag.fill_pattern_at((size_t)rank * 8, 8, pattern_seed(rank, 77, 0));
            ASSERT_EQ(weft_allgather(comm, ag.data() + (size_t)rank * 8, ag.data(), 8), WEFT_SUCCESS)
                << last_error();
            for (int r2 = 0; r2 < size; r2++)
                ASSERT_TRUE(ag.HasPatternAt((size_t)r2 * 8, 8, r2, 77, 0)) << "allgather block " << r2;
            if (size > 1) {
                TestBuf out = patterned_buf(100, rank, 5, 0), in(100);
                ASSERT_TRUE(out.ok() && in.ok());
                weft_request_t *pr[2] = {nullptr, nullptr};
                int to = (rank + 1) % size, from = (rank + size - 1) % size;
                ASSERT_EQ(weft_irecv(comm, in.data(), 100, from, 5, &pr[0]), WEFT_SUCCESS) << last_error();
                ASSERT_EQ(weft_isend(comm, out.data(), 100, to, 5, &pr[1]), WEFT_SUCCESS) << last_error();
                ASSERT_EQ(weft_waitall(2, pr, nullptr), WEFT_SUCCESS) << last_error();
                ASSERT_TRUE(in.HasPatternAt(0, 100, from, 5, 0));
            }
        }
    }
    ASSERT_EQ(weft_waitall(reqs.size(), reqs.data(), nullptr), WEFT_SUCCESS) << last_error();
    for (size_t i = 0; i < sizes.size(); i++) {
        ASSERT_TRUE(received(*recv[i], sizes[i], 2000 + i)) << "ialltoall " << i << " (" << sizes[i] << " B)";
        ASSERT_TRUE(recv[i]->GuardsIntact()) << "ialltoall " << i;
    }
}

TEST_F(Alltoall, ArgumentChecks)
{
    TestBuf recv(16 * (size_t)size), send(16 * (size_t)size);
    ASSERT_TRUE(recv.ok() && send.ok()) << recv.error() << send.error();
    EXPECT_EQ(weft_alltoall(nullptr, send.data(), recv.data(), 16), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_alltoall(comm, nullptr, recv.data(), 16), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("sendbuf"), std::string::npos) << last_error();
    EXPECT_EQ(weft_alltoall(comm, send.data(), nullptr, 16), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("recvbuf"), std::string::npos) << last_error();
    /* Overlapping without being the in-place form. */
    EXPECT_EQ(weft_alltoall(comm, recv.data() + 1, recv.data(), 8), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("overlaps"), std::string::npos) << last_error();
    /* Zero bytes: NULL buffers are fine. */
    EXPECT_EQ(weft_alltoall(comm, nullptr, nullptr, 0), WEFT_SUCCESS) << last_error();
    /* After refused calls the next collective works on every rank. */
    EXPECT_EQ(weft_barrier(comm), WEFT_SUCCESS) << last_error();
}

/* WEFT_DEBUG=info (set by the ctest entry): each shape's choice is logged
 * once, naming the algorithm and whether it was forced. */
TEST_F(Alltoall, InfoLogsEachShapeOnce)
{
    const char *dbg = std::getenv("WEFT_DEBUG");
    if (!dbg || std::string(dbg) != "info")
        GTEST_SKIP() << "needs WEFT_DEBUG=info";
    if (size == 1)
        GTEST_SKIP() << "one rank: nothing is selected";
    A2aComm forced("bruck");
    ASSERT_EQ(forced.rc(), WEFT_SUCCESS);
    TestBuf buf(4096 * (size_t)size);
    ASSERT_TRUE(buf.ok()) << buf.error();
    int rc[4] = {-1, -1, -1, -1};
    std::string log = capture_stderr([&] {
        rc[0] = weft_alltoall(comm, buf.data(), buf.data(), 8);
        rc[1] = weft_alltoall(comm, buf.data(), buf.data(), 8);
        rc[2] = weft_alltoall(comm, buf.data(), buf.data(), 4096);
        rc[3] = weft_alltoall(forced.comm(), buf.data(), buf.data(), 8);
    });
    for (int i = 0; i < 4; i++)
        EXPECT_EQ(rc[i], WEFT_SUCCESS) << "call " << i;
    int lines_8 = 0, lines_4096 = 0, forced_bruck = 0;
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);) {
        if (line.find("alltoall 8 B per rank") != std::string::npos && line.find("(selector)") != std::string::npos)
            lines_8++;
        if (line.find("alltoall 4096 B per rank") != std::string::npos &&
            line.find("pairwise (selector)") != std::string::npos)
            lines_4096++;
        if (line.find("alltoall 8 B per rank") != std::string::npos &&
            line.find("bruck (forced") != std::string::npos)
            forced_bruck++;
    }
    EXPECT_EQ(lines_8, 1) << "the 8-byte shape must be logged exactly once:\n" << log;
    EXPECT_EQ(lines_4096, 1) << "4 KiB blocks go pairwise:\n" << log;
    EXPECT_EQ(forced_bruck, 1) << log;
}

/* A p2p step that fails (rank 1 never joins: rank 0's steps time out after
 * WEFT_TIMEOUT=2 s) returns the p2p code, and the last error names the
 * algorithm and the step. On a comm of its own (both settings in its
 * configuration); its pipe to the peer is broken afterwards and not used
 * again. */
TEST_F(Alltoall, StepFailureNamesAlgorithmAndStep)
{
    if (size != 2)
        GTEST_SKIP() << "np 2 only";
    for (const std::string algo : {"pairwise", "bruck"}) {
        weft_comm_t *c2 = nullptr;
        int rc = create_with(MPI_COMM_WORLD, {{"WEFT_TIMEOUT", "2"}, {"WEFT_ALLTOALL_ALGO", algo}}, &c2);
        ASSERT_EQ(rc, WEFT_SUCCESS);
        if (rank == 0) {
            TestBuf recv(2 * 64), send(2 * 64);
            ASSERT_TRUE(recv.ok() && send.ok()) << recv.error() << send.error();
            rc = weft_alltoall(c2, send.data(), recv.data(), 64);
            EXPECT_EQ(rc, WEFT_ERR_TIMEOUT) << weft_comm_last_error(c2);
            std::string err = weft_comm_last_error(c2);
            EXPECT_NE(err.find("alltoall " + algo + " step"), std::string::npos) << err;
            EXPECT_NE(err.find("peer 1"), std::string::npos) << err;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        EXPECT_EQ(weft_comm_destroy(c2), WEFT_SUCCESS);
    }
}

} // namespace
