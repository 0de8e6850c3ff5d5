/*
 * The contracts of issue 10 (include/weft.h), each checked where it can
 * break, with verified data around it:
 *
 *   Requests.*           handles with a generation: a second wait or test,
 *                        a stale copy after its slot was reused, the same
 *                        handle twice in one waitall: WEFT_ERR_INVALID_ARG,
 *                        and no other request is touched
 *   Mismatch.*           ranks calling different collectives get an error
 *                        (WEFT_ERR_MISMATCH naming both calls) within
 *                        WEFT_TIMEOUT + 1 s, and the comm goes on working
 *   TwoComms.*           one weft_waitall over requests of two comms
 *                        progresses both
 *   DestroyOutstanding.* destroy with a request outstanding returns
 *                        WEFT_ERR_INVALID_ARG and leaves the library sound
 *   SelfOverlap.*        a send to self whose buffer overlaps the receive:
 *                        memmove semantics or WEFT_ERR_INVALID_ARG
 *   RequestTimeout.*     WEFT_TIMEOUT is per request: traffic from another
 *                        peer does not keep a silent peer's receive alive
 *   FlowControl.*        a sender far ahead of its receiver is held to the
 *                        eager window (WEFT_EAGER_WINDOW): the receiver's
 *                        memory does not grow with the backlog
 *   Abort.*              weft_comm_abort from a watchdog thread ends the
 *                        blocked call, later calls, and the peer's wait
 *
 * ctest entries: mpi_tests/contracts.cmake (each suite with the environment
 * it needs; tests that need a setting skip without it). A call that hangs
 * ends the rank through a Watchdog (message, _exit), so a broken contract
 * costs seconds with a message rather than the ctest TIMEOUT.
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* Ends this rank if the scope is not left within `seconds`: prints what
 * hung and _exits, and mpirun then ends the job (non-zero), so the test
 * fails with a message instead of waiting for the ctest TIMEOUT. */
class Watchdog {
public:
    Watchdog(double seconds, std::string what) : what_(std::move(what)), rank_(world_rank())
    {
        thread_ = std::thread([this, seconds] {
            std::unique_lock<std::mutex> lk(mu_);
            if (!cv_.wait_for(lk, std::chrono::duration<double>(seconds), [this] { return done_; })) {
                std::fprintf(stderr, "[rank %d] FAILED: %s did not return within %.1f s\n", rank_,
                             what_.c_str(), seconds);
                std::fflush(stderr);
                _exit(3);
            }
        });
    }
    ~Watchdog()
    {
        {
            std::lock_guard<std::mutex> lk(mu_);
            done_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    Watchdog(const Watchdog &) = delete;
    Watchdog &operator=(const Watchdog &) = delete;

private:
    std::string what_;
    int rank_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;
};

/* WEFT_TIMEOUT as the ctest entry sets it (60 when unset, the suites' default). */
double weft_timeout_s()
{
    return std::atof(env_or("WEFT_TIMEOUT", "60"));
}

std::vector<unsigned char> patterned_vec(size_t n, int sender, int tag, uint64_t index)
{
    std::vector<unsigned char> v(n);
    fill_pattern(v.data(), n, pattern_seed(sender, tag, index));
    return v;
}

/* Every ordered pair exchanges a small and a rendezvous-size message: in
 * round k rank r sends to r+k and receives from r-k. */
void all_pairs_exchange(weft_comm_t *c, int tag, uint64_t index)
{
    const int r = weft_comm_rank(c), n = weft_comm_size(c);
    for (int k = 1; k < n; k++) {
        const int to = (r + k) % n, from = (r + n - k) % n;
        for (size_t bytes : {(size_t)100, 256 * KiB + 3}) {
            std::vector<unsigned char> out = patterned_vec(bytes, r, tag + k, index);
            std::vector<unsigned char> in(bytes);
            weft_request_t *reqs[2];
            weft_status_t st[2];
            ASSERT_EQ(weft_irecv(c, in.data(), bytes, from, tag + k, &reqs[0]), WEFT_SUCCESS)
                << weft_comm_last_error(c);
            ASSERT_EQ(weft_isend(c, out.data(), bytes, to, tag + k, &reqs[1]), WEFT_SUCCESS)
                << weft_comm_last_error(c);
            ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS)
                << "p2p with ranks " << from << " / " << to << ", " << bytes << " B: " << weft_comm_last_error(c);
            EXPECT_EQ(st[0].bytes, bytes);
            EXPECT_EQ(st[0].peer, from);
            EXPECT_TRUE(HasPattern(in.data(), bytes, from, tag + k, index)) << "from rank " << from;
        }
    }
}

/* A matching allgather of `bytes` per rank; every block checked, guards too. */
void matching_allgather(weft_comm_t *c, size_t bytes, uint64_t index)
{
    const int r = weft_comm_rank(c), n = weft_comm_size(c);
    std::vector<unsigned char> out = patterned_vec(bytes, r, 900, index);
    GuardedBuffer in(bytes * (size_t)n);
    ASSERT_TRUE(in.ok());
    ASSERT_EQ(weft_allgather(c, out.data(), in.data(), bytes), WEFT_SUCCESS)
        << "matching allgather of " << bytes << " B/rank: " << weft_comm_last_error(c);
    for (int p = 0; p < n; p++)
        EXPECT_TRUE(HasPattern(in.data() + (size_t)p * bytes, bytes, p, 900, index)) << "block of rank " << p;
    EXPECT_TRUE(in.GuardsIntact());
}

/* VmRSS of this process in bytes (/proc/self/status), 0 if unreadable. */
size_t vm_rss_bytes()
{
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0)
            return (size_t)std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    return 0;
}

/* Tests that make their own comms (one fixture name per ctest filter). */
class OwnComms : public WeftMpiTest {
protected:
    MPI_Comm base_comm() override { return MPI_COMM_NULL; }
};
class TwoComms : public OwnComms {};
class DestroyOutstanding : public OwnComms {};
class RequestTimeout : public OwnComms {};
class FlowControl : public OwnComms {};
class Abort : public OwnComms {};
class SelfOverlap : public WeftMpiTest {};

/* Bounds a whole test: a rank that returned early (a failed ASSERT) leaves
 * the others in an MPI call that never completes; this ends them. */
constexpr double kTestLimit = 100;

/* ---- A. request handles ---- */

class Requests : public WeftMpiTest {
protected:
    static constexpr int kIterations = 300;

    void SetUp() override
    {
        WeftMpiTest::SetUp();
        if (size % 2)
            GTEST_SKIP() << "needs an even number of ranks";
    }
    int peer() const { return rank ^ 1; }

    /* Mostly small messages; every 100th a rendezvous-size one. */
    static size_t bytes_for(int i) { return i % 100 == 99 ? MiB + 3 : (size_t)(i % 7) * 37 + 8; }

    /* Posts a receive from and a send to the peer (pattern of (rank, tag, i)). */
    void post_pair(std::vector<unsigned char> &out, std::vector<unsigned char> &in, int tag, int i,
                   weft_request_t **r, weft_request_t **s)
    {
        const size_t n = bytes_for(i);
        out = patterned_vec(n, rank, tag, (uint64_t)i);
        in.assign(n, 0);
        ASSERT_EQ(weft_irecv(comm, in.data(), n, peer(), tag, r), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_isend(comm, out.data(), n, peer(), tag, s), WEFT_SUCCESS) << last_error();
    }
};

/* weft_wait on a request that weft_wait already completed. */
TEST_F(Requests, SecondWaitIsInvalid)
{
    Watchdog whole(kTestLimit, "Requests.SecondWaitIsInvalid");
    for (int i = 0; i < kIterations; i++) {
        std::vector<unsigned char> out, in;
        weft_request_t *r = nullptr, *s = nullptr;
        post_pair(out, in, 11, i, &r, &s);
        ASSERT_FALSE(HasFatalFailure());
        weft_status_t st;
        /* Half of the iterations complete the send first. */
        if (i % 2) {
            ASSERT_EQ(weft_wait(s, &st), WEFT_SUCCESS) << "iteration " << i << ": " << last_error();
            ASSERT_EQ(weft_wait(r, &st), WEFT_SUCCESS) << "iteration " << i << ": " << last_error();
        } else {
            ASSERT_EQ(weft_wait(r, &st), WEFT_SUCCESS) << "iteration " << i << ": " << last_error();
            EXPECT_EQ(st.bytes, in.size());
            ASSERT_EQ(weft_wait(s, nullptr), WEFT_SUCCESS) << "iteration " << i << ": " << last_error();
        }
        ASSERT_TRUE(HasPattern(in.data(), in.size(), peer(), 11, (uint64_t)i)) << "iteration " << i;
        ASSERT_EQ(weft_wait(r, &st), WEFT_ERR_INVALID_ARG) << "second wait on a completed receive, iteration " << i;
        ASSERT_EQ(weft_wait(s, nullptr), WEFT_ERR_INVALID_ARG) << "second wait on a completed send, iteration " << i;
    }
}

/* weft_test on a request that weft_test (or weft_wait) already completed. */
TEST_F(Requests, TestAfterCompletionIsInvalid)
{
    Watchdog whole(kTestLimit, "Requests.TestAfterCompletionIsInvalid");
    for (int i = 0; i < kIterations; i++) {
        std::vector<unsigned char> out, in;
        weft_request_t *r = nullptr, *s = nullptr;
        post_pair(out, in, 12, i, &r, &s);
        ASSERT_FALSE(HasFatalFailure());
        weft_status_t st;
        int done = 0;
        while (!done)
            ASSERT_EQ(weft_test(r, &done, &st), WEFT_SUCCESS) << "iteration " << i << ": " << last_error();
        EXPECT_EQ(st.error, WEFT_SUCCESS);
        EXPECT_EQ(st.bytes, in.size());
        EXPECT_EQ(st.peer, peer());
        ASSERT_EQ(weft_wait(s, nullptr), WEFT_SUCCESS) << "iteration " << i << ": " << last_error();
        ASSERT_TRUE(HasPattern(in.data(), in.size(), peer(), 12, (uint64_t)i)) << "iteration " << i;
        done = 0;
        ASSERT_EQ(weft_test(r, &done, &st), WEFT_ERR_INVALID_ARG) << "test on a receive weft_test completed, iteration " << i;
        ASSERT_EQ(weft_test(s, &done, &st), WEFT_ERR_INVALID_ARG) << "test on a send weft_wait completed, iteration " << i;
    }
}

/* A copy of a handle kept after its request completed, used once a newer
 * request (likely in the same pool slot) is in flight: refused, and the
 * newer request completes with its own data. */
TEST_F(Requests, StaleCopyAfterSlotReuseIsInvalid)
{
    Watchdog whole(kTestLimit, "Requests.StaleCopyAfterSlotReuseIsInvalid");
    for (int i = 0; i < kIterations; i++) {
        std::vector<unsigned char> out1, in1, out2, in2;
        weft_request_t *r1 = nullptr, *s1 = nullptr, *r2 = nullptr, *s2 = nullptr;
        post_pair(out1, in1, 13, 2 * i, &r1, &s1);
        ASSERT_FALSE(HasFatalFailure());
        weft_request_t *both1[2] = {r1, s1};
        ASSERT_EQ(weft_waitall(2, both1, nullptr), WEFT_SUCCESS) << "iteration " << i << ": " << last_error();
        ASSERT_TRUE(HasPattern(in1.data(), in1.size(), peer(), 13, (uint64_t)(2 * i)));
        weft_request_t *stale_r = r1, *stale_s = s1;

        post_pair(out2, in2, 13, 2 * i + 1, &r2, &s2);
        ASSERT_FALSE(HasFatalFailure());
        int done = 0;
        weft_status_t st;
        switch (i % 3) {
        case 0:
            ASSERT_EQ(weft_wait(stale_r, &st), WEFT_ERR_INVALID_ARG) << "wait on a stale receive, iteration " << i;
            ASSERT_EQ(weft_wait(stale_s, &st), WEFT_ERR_INVALID_ARG) << "wait on a stale send, iteration " << i;
            break;
        case 1:
            ASSERT_EQ(weft_test(stale_r, &done, &st), WEFT_ERR_INVALID_ARG) << "test on a stale receive, iteration " << i;
            ASSERT_EQ(weft_test(stale_s, &done, &st), WEFT_ERR_INVALID_ARG) << "test on a stale send, iteration " << i;
            break;
        default:
            ASSERT_EQ(weft_waitall(1, &stale_r, nullptr), WEFT_ERR_INVALID_ARG) << "waitall on a stale receive, iteration " << i;
            ASSERT_EQ(weft_waitall(1, &stale_s, nullptr), WEFT_ERR_INVALID_ARG) << "waitall on a stale send, iteration " << i;
            break;
        }
        /* The newer requests were not completed, freed or changed by that. */
        weft_status_t st2[2];
        weft_request_t *both2[2] = {r2, s2};
        ASSERT_EQ(weft_waitall(2, both2, st2), WEFT_SUCCESS)
            << "the newer requests after a stale handle was used, iteration " << i << ": " << last_error();
        EXPECT_EQ(st2[0].bytes, in2.size());
        EXPECT_EQ(st2[0].peer, peer());
        EXPECT_EQ(st2[1].error, WEFT_SUCCESS);
        ASSERT_TRUE(HasPattern(in2.data(), in2.size(), peer(), 13, (uint64_t)(2 * i + 1))) << "iteration " << i;
    }
}

/* The same handle twice in one waitall (or next to a completed one): refused
 * before anything is waited for or freed; a waitall with it once succeeds.
 * The send is posted only after the refused waitall, so one that waited for
 * the receive would have to wait for the peer's send posted after the
 * peer's own refused waitall: it would not return INVALID_ARG at once. */
TEST_F(Requests, SameHandleTwiceInWaitallIsInvalid)
{
    Watchdog whole(kTestLimit, "Requests.SameHandleTwiceInWaitallIsInvalid");
    weft_request_t *completed = nullptr;   /* last iteration's send, completed */
    for (int i = 0; i < kIterations; i++) {
        const size_t n = bytes_for(i);
        std::vector<unsigned char> out = patterned_vec(n, rank, 14, (uint64_t)i), in(n, 0);
        weft_request_t *r = nullptr, *s = nullptr;
        ASSERT_EQ(weft_irecv(comm, in.data(), n, peer(), 14, &r), WEFT_SUCCESS) << last_error();
        weft_status_t st[3];
        const int variant = completed ? i % 3 : 0;
        if (variant == 0) {
            weft_request_t *twice[2] = {r, r};
            ASSERT_EQ(weft_waitall(2, twice, st), WEFT_ERR_INVALID_ARG) << "{r, r}, iteration " << i;
        } else if (variant == 1) {
            weft_request_t *twice[3] = {r, nullptr, r};
            ASSERT_EQ(weft_waitall(3, twice, st), WEFT_ERR_INVALID_ARG) << "{r, NULL, r}, iteration " << i;
        } else {
            weft_request_t *with_done[2] = {r, completed};
            ASSERT_EQ(weft_waitall(2, with_done, st), WEFT_ERR_INVALID_ARG)
                << "{r, a completed request}, iteration " << i;
        }
        ASSERT_EQ(weft_isend(comm, out.data(), n, peer(), 14, &s), WEFT_SUCCESS) << last_error();
        weft_request_t *once[2] = {r, s};
        ASSERT_EQ(weft_waitall(2, once, st), WEFT_SUCCESS)
            << "the same requests once, after the refused waitall, iteration " << i << ": " << last_error();
        EXPECT_EQ(st[0].bytes, n);
        EXPECT_EQ(st[0].peer, peer());
        EXPECT_EQ(st[1].error, WEFT_SUCCESS);
        ASSERT_TRUE(HasPattern(in.data(), n, peer(), 14, (uint64_t)i)) << "iteration " << i;
        completed = s;
    }
}

/* ---- B. collective mismatch ---- */

class Mismatch : public WeftMpiTest {
protected:
    std::vector<int> everyone() const
    {
        std::vector<int> all(size);
        for (int p = 0; p < size; p++)
            all[p] = p;
        return all;
    }

    void SetUp() override
    {
        WeftMpiTest::SetUp();
        if (size < 2)
            GTEST_SKIP() << "needs 2 ranks";
    }

    /* Runs `call` on every rank (each rank's own collective), then checks
     * what issue 10 promises, then that the comm still works: every pair
     * exchanges p2p data, and a matching allgather succeeds. `must_name`:
     * what a WEFT_ERR_MISMATCH rank's last error must contain. The guarded
     * receive buffers are those the call used: nothing written past them. */
    /* may_succeed: ranks whose own part of the call ends without receiving
     * anything (the rank that believes it is the bcast root only sends), so
     * nothing of the mismatch reaches them before they return: they may
     * return WEFT_SUCCESS (docs/api.md, Collectives). require_mismatch:
     * rank 0 or 1 must see the mismatch itself. */
    void expect_mismatch(const char *what, const std::function<int()> &call,
                         const std::vector<std::string> &must_name, std::vector<GuardedBuffer *> guarded,
                         const std::vector<int> &may_succeed = {}, bool require_mismatch = true)
    {
        const bool may = std::find(may_succeed.begin(), may_succeed.end(), rank) != may_succeed.end();
        Watchdog whole(kTestLimit, what);
        const double timeout = weft_timeout_s();
        MPI_Barrier(MPI_COMM_WORLD);
        int rc;
        double took;
        {
            Watchdog wd(timeout + 10, what);
            const double t0 = now_s();
            rc = call();
            took = now_s() - t0;
        }
        const std::string err = last_error();
        if (!may) {
            EXPECT_NE(rc, WEFT_SUCCESS) << what << ": succeeded on rank " << rank;
        } else {
            EXPECT_TRUE(rc == WEFT_SUCCESS || rc == WEFT_ERR_MISMATCH) << what << ": " << weft_strerror(rc);
        }
        EXPECT_LE(took, timeout + 1) << what << ": took " << took << " s (WEFT_TIMEOUT " << timeout
                                     << "), " << weft_strerror(rc) << ": " << err;
        if (rc == WEFT_ERR_MISMATCH) {
            for (const std::string &s : must_name)
                EXPECT_NE(err.find(s), std::string::npos) << what << ": \"" << err << "\" does not name " << s;
        }
        for (GuardedBuffer *g : guarded)
            EXPECT_TRUE(g->GuardsIntact()) << what;
        std::vector<int> rcs(size);
        MPI_Allgather(&rc, 1, MPI_INT, rcs.data(), 1, MPI_INT, MPI_COMM_WORLD);
        if (rank == 0) {
            std::string codes;
            for (int p = 0; p < size; p++)
                codes += " " + std::to_string(p) + ":" + weft_strerror(rcs[p]);
            std::printf("%s: codes%s; rank 0: %s\n", what, codes.c_str(), err.c_str());
            if (require_mismatch) {
                EXPECT_TRUE(rcs[0] == WEFT_ERR_MISMATCH || rcs[1] == WEFT_ERR_MISMATCH)
                    << what << ": neither rank 0 nor rank 1 returned WEFT_ERR_MISMATCH:" << codes;
            }
        } else if (rc != WEFT_ERR_MISMATCH) {
            std::fprintf(stderr, "[rank %d] %s: %s: %s\n", rank, what, weft_strerror(rc), err.c_str());
        }
        /* The comm goes on: p2p between every pair, then a matching allgather
         * (after a barrier: every rank is out of the failed call by then). */
        {
            Watchdog wd(timeout + 20, std::string(what) + ": p2p after the mismatch");
            all_pairs_exchange(comm, 500, 1);
        }
        if (HasFatalFailure())
            return;
        MPI_Barrier(MPI_COMM_WORLD);
        {
            Watchdog wd(timeout + 20, std::string(what) + ": matching allgather after the mismatch");
            matching_allgather(comm, 8, 1);
            if (!HasFatalFailure())
                matching_allgather(comm, 64 * KiB + 8, 2);
        }
    }
};

/* Rank 0: allgather 8 B per rank; the others: 16 B per rank. */
TEST_F(Mismatch, AllgatherBlockSizes)
{
    const size_t bytes = rank == 0 ? 8 : 16;
    std::vector<unsigned char> out = patterned_vec(bytes, rank, 1, 0);
    GuardedBuffer in(bytes * (size_t)size);
    ASSERT_TRUE(in.ok());
    expect_mismatch(
        "allgather 8 vs 16 B/rank",
        [&] { return weft_allgather(comm, out.data(), in.data(), bytes); },
        {"allgather(8 B/rank)", "allgather(16 B/rank)"}, {&in});
}

/* Rank 0: allreduce float32 sum; the others: int32 sum (same bytes). */
TEST_F(Mismatch, AllreduceTypes)
{
    const size_t count = 1000;
    std::vector<int32_t> out(count, rank);
    GuardedBuffer in(count * sizeof(int32_t));
    ASSERT_TRUE(in.ok());
    const weft_dtype_t t = rank == 0 ? WEFT_FLOAT32 : WEFT_INT32;
    expect_mismatch(
        "allreduce float32 vs int32",
        [&] { return weft_allreduce(comm, out.data(), in.data(), count, t, WEFT_SUM); },
        {"allreduce(1000 x float32, sum)", "allreduce(1000 x int32, sum)"}, {&in});
}

/* Rank 0: allreduce sum; the others: max. Messages under the eager limit:
 * a mismatched call of rendezvous-size messages can leave a sender waiting
 * for the refusal of its announcement until the peer is inside weft again
 * (this harness goes into MPI calls at once); docs/api.md, Collectives. */
TEST_F(Mismatch, AllreduceOps)
{
    const size_t count = 1003;
    std::vector<float> out(count, 1.0f);
    GuardedBuffer in(count * sizeof(float));
    ASSERT_TRUE(in.ok());
    const weft_op_t op = rank == 0 ? WEFT_SUM : WEFT_MAX;
    expect_mismatch(
        "allreduce sum vs max",
        [&] { return weft_allreduce(comm, out.data(), in.data(), count, WEFT_FLOAT32, op); },
        {"sum", "max"}, {&in});
}

/* Rank 0: reduce_scatter; the others: alltoall. */
TEST_F(Mismatch, ReduceScatterVsAlltoall)
{
    const size_t count = 256;
    std::vector<int32_t> out(count * (size_t)size, rank);
    GuardedBuffer in(count * sizeof(int32_t) * (size_t)size);
    ASSERT_TRUE(in.ok());
    expect_mismatch(
        "reduce_scatter vs alltoall",
        [&] {
            return rank == 0 ? weft_reduce_scatter(comm, out.data(), in.data(), count, WEFT_INT32, WEFT_SUM)
                             : weft_alltoall(comm, out.data(), in.data(), count * sizeof(int32_t));
        },
        {"reduce_scatter(", "alltoall("}, {&in});
}

/* Rank 0: bcast from root 0; the others: allgather. */
TEST_F(Mismatch, BcastVsAllgather)
{
    std::vector<unsigned char> out = patterned_vec(16, rank, 2, 0);
    GuardedBuffer bc(64), ag(16 * (size_t)size);
    ASSERT_TRUE(bc.ok() && ag.ok());
    fill_pattern(bc.data(), 64, pattern_seed(0, 2, 1));
    expect_mismatch(
        "bcast vs allgather",
        [&] {
            return rank == 0 ? weft_bcast(comm, bc.data(), 64, 0) : weft_allgather(comm, out.data(), ag.data(), 16);
        },
        {"bcast(", "allgather("}, {&bc, &ag}, {0});
}

/* Rank 0: bcast from root 0; the others: barrier. */
TEST_F(Mismatch, BcastVsBarrier)
{
    GuardedBuffer bc(64);
    ASSERT_TRUE(bc.ok());
    fill_pattern(bc.data(), 64, pattern_seed(0, 3, 1));
    expect_mismatch(
        "bcast vs barrier", [&] { return rank == 0 ? weft_bcast(comm, bc.data(), 64, 0) : weft_barrier(comm); },
        {"bcast(", "barrier"}, {&bc}, {0});
}

/* Rank 0: bcast of 0 bytes from root 0 (nothing to send: it returns at
 * once); the others: 64 bytes from root 0, which never come: they fail
 * within WEFT_TIMEOUT (+ grace). Every rank counted the call, so the calls
 * that follow match again (the matching allgathers of expect_mismatch). */
TEST_F(Mismatch, BcastZeroBytesOnOneRank)
{
    GuardedBuffer bc(64);
    ASSERT_TRUE(bc.ok());
    fill_pattern(bc.data(), 64, pattern_seed(0, 5, 1));
    expect_mismatch(
        "bcast of 0 vs 64 bytes", [&] { return weft_bcast(comm, bc.data(), rank == 0 ? 0 : 64, 0); },
        {"bcast("}, {&bc}, {0}, false);
}

/* Rank 0: bcast from root 0; the others: bcast from root 1 (same size).
 * Rank 0 believes it is the root and only sends; rank 1 believes the same;
 * no message of one belief meets a receive of the other, so no rank can see
 * the mismatch (a known limit, docs/api.md). What must hold: no rank holds
 * bytes that are not its believed root's, nothing is written past the
 * buffer, and the comm goes on (rank 0's unreceived messages are stale
 * later and must not disturb the next calls). */
TEST_F(Mismatch, BcastRootsThatNeverMeet)
{
    const int root = rank == 0 ? 0 : 1;
    GuardedBuffer bc(64);
    ASSERT_TRUE(bc.ok());
    fill_pattern(bc.data(), 64, pattern_seed(rank, 4, 1));
    std::vector<int> everyone(size);
    for (int p = 0; p < size; p++)
        everyone[p] = p;
    int rc = WEFT_SUCCESS;
    expect_mismatch(
        "bcast with different roots", [&] { return rc = weft_bcast(comm, bc.data(), 64, root); },
        {"bcast(", "root"}, {&bc}, everyone, false);
    if (rc == WEFT_SUCCESS) {
        std::vector<unsigned char> want(64);
        fill_pattern(want.data(), 64, pattern_seed(root, 4, 1));
        EXPECT_EQ(memcmp(bc.data(), want.data(), 64), 0) << "rank " << rank << " holds bytes of no root";
    }
}

/* The first half of the ranks reduce to root 0, the others to the last
 * rank (same count, type and op). Each root waits for its children's
 * parts and the children of one belief are not those of the other: ranks
 * wait on receives no message of the other belief meets, where they used
 * to time out (WEFT_TIMEOUT, then at np 4 the next collective failed on
 * every rank: issue 28, item 4). A collective receive idle for a second
 * asks its peer which call it is in; the same call with another root is a
 * mismatch, said at once naming both calls, and every rank returns within
 * seconds; the comm goes on (expect_mismatch's p2p and allgathers). */
TEST_F(Mismatch, ReduceDifferentRoots)
{
    const size_t count = 256;
    const int root = rank < (size + 1) / 2 ? 0 : size - 1;
    std::vector<int32_t> out(count, rank + 1);
    GuardedBuffer in(count * sizeof(int32_t));
    ASSERT_TRUE(in.ok());
    int rc = WEFT_SUCCESS;
    double took = 0;
    expect_mismatch(
        "reduce with different roots",
        [&] {
            const double t0 = now_s();
            rc = weft_reduce(comm, out.data(), in.data(), count, WEFT_INT32, WEFT_SUM, root);
            took = now_s() - t0;
            return rc;
        },
        {"reduce(256 x int32, sum, root 0)", std::string("reduce(256 x int32, sum, root ") + std::to_string(size - 1)},
        {&in}, everyone());
    /* A rank whose part is only to send (a leaf of its belief's tree) may
     * be done before anything of the other belief reaches it; a root never:
     * it would hold a result summed from the wrong ranks. */
    if (rank == root || size == 2) {
        EXPECT_EQ(rc, WEFT_ERR_MISMATCH) << "rank " << rank << ": " << weft_strerror(rc) << ": " << last_error();
    }
    /* A second of idleness, an answer, the notice to the others: well
     * under WEFT_TIMEOUT on a loaded machine too. */
    EXPECT_LT(took, 6.0) << "rank " << rank << " took " << took << " s to report the mismatch";
}

/* Rank 1 passes arguments its own check refuses (sendbuf overlapping
 * recvbuf, not in place) where the others call the same allgather validly.
 * Rank 1 gets WEFT_ERR_INVALID_ARG; the call still takes its number among
 * the comm's collectives and the others are told, so each of them fails
 * naming rank 1 and why, and the next collectives match again with the
 * right data (issue 28, item 1: the ranks were one call apart before, and
 * every later collective returned the previous call's data). */
TEST_F(Mismatch, ACallOneRankRefusesLocally)
{
    const size_t bytes = 64;
    GuardedBuffer in(bytes * (size_t)size);
    ASSERT_TRUE(in.ok());
    std::vector<unsigned char> out = patterned_vec(bytes, rank, 5, 0);
    /* rank 1: the first bytes of its own receive buffer as sendbuf (not
     * its in-place block): refused before anything moves */
    const void *send = rank == 1 ? static_cast<const void *>(in.data()) : out.data();
    int rc = WEFT_SUCCESS;
    expect_mismatch(
        "allgather refused by rank 1's own check", [&] { return rc = weft_allgather(comm, send, in.data(), bytes); },
        {"rank 1 refused its weft_allgather", "overlap"}, {&in}, {}, true);
    if (rank == 1) {
        EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG) << last_error();
    }
}

/* ---- C. one waitall over two comms ---- */

/* Comm A receives from the left and sends right, comm B the other way,
 * same tag on both; all four requests in one weft_waitall, which must
 * progress both comms (a waitall that drove only the first request's comm
 * would sit until WEFT_TIMEOUT). */
TEST_F(TwoComms, OneWaitallProgressesBoth)
{
    Watchdog whole(kTestLimit, "TwoComms.OneWaitallProgressesBoth");
    weft_comm_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &a), WEFT_SUCCESS);
    ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &b), WEFT_SUCCESS);
    const int left = (rank + size - 1) % size, right = (rank + 1) % size;
    const int tag = 7;
    for (int it = 0; it < 8; it++) {
        const size_t na = it % 2 ? MiB : 64 * KiB, nb = it % 2 ? 64 * KiB : MiB;
        std::vector<unsigned char> out_a = patterned_vec(na, rank, 1000 + tag, (uint64_t)it);
        std::vector<unsigned char> out_b = patterned_vec(nb, rank, 2000 + tag, (uint64_t)it);
        std::vector<unsigned char> in_a(na), in_b(nb);
        weft_request_t *ra, *rb, *sa, *sb;
        ASSERT_EQ(weft_irecv(a, in_a.data(), na, left, tag, &ra), WEFT_SUCCESS) << weft_comm_last_error(a);
        ASSERT_EQ(weft_irecv(b, in_b.data(), nb, right, tag, &rb), WEFT_SUCCESS) << weft_comm_last_error(b);
        ASSERT_EQ(weft_isend(a, out_a.data(), na, right, tag, &sa), WEFT_SUCCESS) << weft_comm_last_error(a);
        ASSERT_EQ(weft_isend(b, out_b.data(), nb, left, tag, &sb), WEFT_SUCCESS) << weft_comm_last_error(b);
        /* Neighbours list the comms in opposite orders (and each rank
         * alternates): a waitall that finishes one comm's requests before
         * driving the other's would wait on a neighbour doing the reverse. */
        weft_request_t *reqs[4];
        const bool a_first = (rank + it) % 2 == 0;
        reqs[0] = a_first ? ra : rb;
        reqs[1] = a_first ? sa : sb;
        reqs[2] = a_first ? rb : ra;
        reqs[3] = a_first ? sb : sa;
        weft_status_t st[4];
        int rc;
        double took;
        {
            Watchdog wd(weft_timeout_s() + 15, "waitall over two comms");
            const double t0 = now_s();
            rc = weft_waitall(4, reqs, st);
            took = now_s() - t0;
        }
        ASSERT_EQ(rc, WEFT_SUCCESS) << "iteration " << it << ": A: " << weft_comm_last_error(a)
                                    << " / B: " << weft_comm_last_error(b);
        EXPECT_LT(took, 5.0) << "iteration " << it << ": a waitall over two comms took " << took << " s";
        for (int k = 0; k < 4; k++)
            EXPECT_EQ(st[k].error, WEFT_SUCCESS) << "request " << k;
        EXPECT_TRUE(HasPattern(in_a.data(), na, left, 1000 + tag, (uint64_t)it)) << "comm A, iteration " << it;
        EXPECT_TRUE(HasPattern(in_b.data(), nb, right, 2000 + tag, (uint64_t)it)) << "comm B, iteration " << it;
    }
    EXPECT_EQ(weft_comm_destroy(a), WEFT_SUCCESS);
    EXPECT_EQ(weft_comm_destroy(b), WEFT_SUCCESS);
}

/* ---- D. destroy with a request outstanding ---- */

/* Every rank leaves a receive nothing matches: destroy fails it, frees the
 * comm and returns WEFT_ERR_INVALID_ARG (the handle is dead afterwards and
 * is not touched). Then a fresh comm still carries verified traffic. */
TEST_F(DestroyOutstanding, ReceiveOutstanding)
{
    Watchdog whole(kTestLimit, "DestroyOutstanding.ReceiveOutstanding");
    const int left = (rank + size - 1) % size, right = (rank + 1) % size;
    for (int it = 0; it < 4; it++) {
        weft_comm_t *c = nullptr;
        ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &c), WEFT_SUCCESS);
        if (it % 2) {   /* some comms carried traffic before */
            std::vector<unsigned char> out = patterned_vec(4096, rank, 3, (uint64_t)it), in(4096);
            weft_request_t *reqs[2];
            ASSERT_EQ(weft_irecv(c, in.data(), 4096, left, 3, &reqs[0]), WEFT_SUCCESS);
            ASSERT_EQ(weft_isend(c, out.data(), 4096, right, 3, &reqs[1]), WEFT_SUCCESS);
            ASSERT_EQ(weft_waitall(2, reqs, nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
            EXPECT_TRUE(HasPattern(in.data(), 4096, left, 3, (uint64_t)it));
        }
        const size_t bytes = it < 2 ? 64 : MiB + 3;
        std::vector<unsigned char> never(bytes);
        weft_request_t *r = nullptr;
        ASSERT_EQ(weft_irecv(c, never.data(), bytes, right, 77, &r), WEFT_SUCCESS) << weft_comm_last_error(c);
        int rc;
        {
            Watchdog wd(weft_timeout_s() + 10, "weft_comm_destroy with a receive outstanding");
            rc = weft_comm_destroy(c);
        }
        EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG) << "destroy with one receive of " << bytes << " B outstanding: "
                                            << weft_strerror(rc);
    }
    weft_comm_t *c = nullptr;
    ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &c), WEFT_SUCCESS);
    {
        Watchdog wd(weft_timeout_s() + 10, "p2p on a fresh comm after destroys with outstanding requests");
        all_pairs_exchange(c, 40, 9);
    }
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS) << weft_comm_last_error(c);
}

/* ---- E. send to self from a buffer overlapping the receive ---- */

/* 100 bytes sent to self from src, received into dst, dst = src +- 50
 * inside one 150-byte buffer; posted receive-first and send-first. Either
 * the receive gets the 100 bytes src held before the calls (memmove
 * semantics) and nothing else in the buffer changed, or the second call
 * returns WEFT_ERR_INVALID_ARG (then the first request is completed with a
 * separate buffer). Anything else fails. The same with a rendezvous-size
 * message (1 MiB + 3, shifted by 300 KiB + 5): a copy done in chunks
 * front to back would overwrite source bytes it has not read yet. */
TEST_F(SelfOverlap, SendAndReceiveBuffersOverlap)
{
    Watchdog whole(kTestLimit, "SelfOverlap.SendAndReceiveBuffersOverlap");
    int refused = 0, moved = 0;
    /* (message, shift) 10 times small, twice large. */
    struct Shape { size_t msg, shift; };
    std::vector<Shape> shapes(10, Shape{100, 50});
    shapes.insert(shapes.end(), 2, Shape{MiB + 3, 300 * KiB + 5});
    for (int rep = 0; rep < (int)shapes.size(); rep++) {
        for (int send_first = 0; send_first < 2; send_first++) {
            for (int dst_after_src = 0; dst_after_src < 2; dst_after_src++) {
                const size_t kMsg = shapes[rep].msg, kShift = shapes[rep].shift, kTotal = kMsg + kShift;
                SCOPED_TRACE(std::string(send_first ? "send first" : "receive first") + ", " +
                             std::to_string(kMsg) + " B" + (dst_after_src ? ", dst = src + " : ", dst = src - ") +
                             std::to_string(kShift) + ", rep " + std::to_string(rep));
                const int tag = 60 + 4 * rep + 2 * send_first + dst_after_src;
                GuardedBuffer g(kTotal);
                ASSERT_TRUE(g.ok());
                fill_pattern(g.data(), kTotal, pattern_seed(rank, tag, 0));
                std::vector<unsigned char> orig(g.data(), g.data() + kTotal);
                const size_t src_off = dst_after_src ? 0 : kShift, dst_off = dst_after_src ? kShift : 0;
                unsigned char *src = g.data() + src_off, *dst = g.data() + dst_off;
                weft_request_t *s = nullptr, *r = nullptr;
                int rc_first, rc_second;
                if (send_first) {
                    rc_first = weft_isend(comm, src, kMsg, rank, tag, &s);
                    rc_second = weft_irecv(comm, dst, kMsg, rank, tag, &r);
                } else {
                    rc_first = weft_irecv(comm, dst, kMsg, rank, tag, &r);
                    rc_second = weft_isend(comm, src, kMsg, rank, tag, &s);
                }
                ASSERT_EQ(rc_first, WEFT_SUCCESS) << last_error();
                if (rc_second == WEFT_ERR_INVALID_ARG) {
                    refused++;
                    /* The first request is still pending: complete it with a
                     * buffer of its own. */
                    std::vector<unsigned char> other(kMsg);
                    if (send_first) {
                        ASSERT_EQ(weft_irecv(comm, other.data(), kMsg, rank, tag, &r), WEFT_SUCCESS) << last_error();
                    } else {
                        fill_pattern(other.data(), kMsg, pattern_seed(rank, tag, 1));
                        ASSERT_EQ(weft_isend(comm, other.data(), kMsg, rank, tag, &s), WEFT_SUCCESS) << last_error();
                    }
                    weft_request_t *reqs[2] = {r, s};
                    ASSERT_EQ(weft_waitall(2, reqs, nullptr), WEFT_SUCCESS) << last_error();
                    if (send_first) {
                        EXPECT_EQ(std::memcmp(other.data(), orig.data() + src_off, kMsg), 0)
                            << "the send posted first did not carry its buffer's bytes";
                    } else {
                        EXPECT_TRUE(HasPattern(dst, kMsg, rank, tag, 1)) << "the receive posted first";
                    }
                    EXPECT_TRUE(g.GuardsIntact());
                    continue;
                }
                ASSERT_EQ(rc_second, WEFT_SUCCESS)
                    << "overlapping send/receive to self: " << weft_strerror(rc_second) << ": " << last_error();
                moved++;
                weft_request_t *reqs[2] = {r, s};
                weft_status_t st[2];
                ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << last_error();
                EXPECT_EQ(st[0].bytes, kMsg);
                EXPECT_EQ(st[0].peer, rank);
                EXPECT_EQ(std::memcmp(dst, orig.data() + src_off, kMsg), 0)
                    << "the receive did not get the " << kMsg << " bytes the send buffer held before the calls";
                /* Outside dst: [0, dst_off) and [dst_off + kMsg, kTotal). */
                EXPECT_EQ(std::memcmp(g.data(), orig.data(), dst_off), 0) << "bytes before the receive buffer changed";
                EXPECT_EQ(std::memcmp(g.data() + dst_off + kMsg, orig.data() + dst_off + kMsg, kTotal - dst_off - kMsg), 0)
                    << "bytes after the receive buffer changed";
                EXPECT_TRUE(g.GuardsIntact());
            }
        }
    }
    if (rank == 0)
        std::printf("overlapping self transfers: %d moved (memmove), %d refused (INVALID_ARG)\n", moved, refused);
}

/* ---- F. WEFT_TIMEOUT is per request ---- */

/* Rank 0 waits for a message rank 2 never sends (rank 2 sits in
 * MPI_Barrier) while rank 1 keeps sending it messages on another tag for
 * 8 s. The receive from rank 2 must time out after WEFT_TIMEOUT = 3 s all
 * the same, naming rank 2; then rank 0 receives rank 1's messages intact. */
TEST_F(RequestTimeout, OtherTrafficDoesNotExtendIt)
{
    Watchdog whole(kTestLimit, "RequestTimeout.OtherTrafficDoesNotExtendIt");
    const char *t = std::getenv("WEFT_TIMEOUT");
    if (t == nullptr || std::string(t) != "3")
        GTEST_SKIP() << "runs with WEFT_TIMEOUT=3 only (ctest contracts_request_timeout_*)";
    if (size != 3)
        GTEST_SKIP() << "np 3 only";
    weft_comm_t *c = nullptr;
    ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &c), WEFT_SUCCESS);
    constexpr size_t kMsg = 64, kMaxMsgs = 4000;
    constexpr int kChatterTag = 9, kSilentTag = 1;
    constexpr double kChatterSeconds = 8.0;
    int sent = 0;
    if (rank == 0) {
        std::vector<unsigned char> buf(kMsg);
        weft_status_t st;
        int rc;
        double took;
        {
            Watchdog wd(30, "rank 0's receive from the silent rank 2");
            const double t0 = now_s();
            rc = weft_recv(c, buf.data(), kMsg, 2, kSilentTag, &st);
            took = now_s() - t0;
        }
        const std::string err = weft_comm_last_error(c);
        EXPECT_TRUE(rc == WEFT_ERR_TIMEOUT || rc == WEFT_ERR_TRANSPORT) << weft_strerror(rc) << ": " << err;
        EXPECT_LE(took, 3 + 1.5) << "the receive from silent rank 2 took " << took
                                 << " s with WEFT_TIMEOUT=3 while rank 1 kept sending: " << err;
        EXPECT_GE(took, 2.0) << "the receive from rank 2 (alive, silent) failed after only " << took << " s: " << err;
        EXPECT_TRUE(err.find("peer 2") != std::string::npos || err.find("rank 2") != std::string::npos)
            << "\"" << err << "\" does not name rank 2";
    } else if (rank == 1) {
        std::vector<unsigned char> out(kMaxMsgs * kMsg);
        std::vector<weft_request_t *> reqs;
        size_t first_pending = 0;
        const double t0 = now_s();
        Watchdog wd(30, "rank 1's 8 s of messages to rank 0");
        while (now_s() - t0 < kChatterSeconds && (size_t)sent < kMaxMsgs) {
            unsigned char *p = out.data() + (size_t)sent * kMsg;
            fill_pattern(p, kMsg, pattern_seed(1, kChatterTag, (uint64_t)sent));
            weft_request_t *r = nullptr;
            ASSERT_EQ(weft_isend(c, p, kMsg, 0, kChatterTag, &r), WEFT_SUCCESS) << weft_comm_last_error(c);
            reqs.push_back(r);
            sent++;
            /* Drive progress: complete what is done, oldest first. */
            while (first_pending < reqs.size()) {
                int done = 0;
                weft_status_t st;
                ASSERT_EQ(weft_test(reqs[first_pending], &done, &st), WEFT_SUCCESS) << weft_comm_last_error(c);
                if (!done)
                    break;
                reqs[first_pending++] = nullptr;
            }
            usleep(5000);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Bcast(&sent, 1, MPI_INT, 1, MPI_COMM_WORLD);
        /* Rank 0 receives them now. */
        ASSERT_EQ(weft_waitall(reqs.size(), reqs.data(), nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
    }
    if (rank != 1) {
        /* Rank 2 sits here from the start, doing nothing in weft. */
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Bcast(&sent, 1, MPI_INT, 1, MPI_COMM_WORLD);
    }
    if (rank == 0) {
        EXPECT_GT(sent, 100) << "rank 1 sent too few messages for the test to mean anything";
        Watchdog wd(60, "rank 0 receiving rank 1's messages");
        std::vector<unsigned char> buf(kMsg);
        for (int i = 0; i < sent; i++) {
            weft_status_t st;
            ASSERT_EQ(weft_recv(c, buf.data(), kMsg, 1, kChatterTag, &st), WEFT_SUCCESS)
                << "message " << i << " of " << sent << " from rank 1: " << weft_comm_last_error(c);
            ASSERT_EQ(st.bytes, kMsg);
            ASSERT_TRUE(HasPattern(buf.data(), kMsg, 1, kChatterTag, (uint64_t)i)) << "message " << i;
        }
    }
    /* Destroy is collective: every rank destroys, or none (leaked, as the fixture does). */
    if (any_rank(HasFailure()))
        return;
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

/* ---- G. the eager window holds a sender back ---- */

/* Rank 1 starts 20000 sends of 4 KiB (80 MiB) that rank 0 has not posted
 * receives for. While both drive progress for 2 s, rank 0's resident memory
 * may grow by the window (WEFT_EAGER_WINDOW=1m) plus slack, not by the 80 MiB
 * backlog. Then rank 0 receives and checks every message. */
TEST_F(FlowControl, EagerWindowBoundsReceiverMemory)
{
    if (std::getenv("WEFT_EAGER_WINDOW") == nullptr)
        GTEST_SKIP() << "runs with WEFT_EAGER_WINDOW set (ctest contracts_flow_control_*)";
    if (size != 2)
        GTEST_SKIP() << "np 2 only";
    constexpr size_t kMsgs = 20000, kMsg = 4 * KiB, kBatch = 1000;
    constexpr int kTag = 5, kNeverTag = 6;
    constexpr size_t kMaxGrowth = 24 * MiB;
    weft_comm_t *c = nullptr;
    ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &c), WEFT_SUCCESS);
    Watchdog whole(kTestLimit, "FlowControl.EagerWindowBoundsReceiverMemory");
    if (rank == 1) {
        std::vector<unsigned char> out(kMsgs * kMsg);
        for (size_t i = 0; i < kMsgs; i++)
            fill_pattern(out.data() + i * kMsg, kMsg, pattern_seed(1, kTag, i));
        std::vector<weft_request_t *> reqs(kMsgs, nullptr);
        MPI_Barrier(MPI_COMM_WORLD);   /* rank 0 took its first measure */
        for (size_t i = 0; i < kMsgs; i++)
            ASSERT_EQ(weft_isend(c, out.data() + i * kMsg, kMsg, 0, kTag, &reqs[i]), WEFT_SUCCESS)
                << "send " << i << ": " << weft_comm_last_error(c);
        MPI_Barrier(MPI_COMM_WORLD);
        /* Push as hard as the library lets us while rank 0 measures. */
        size_t first = 0;
        const double t0 = now_s();
        while (now_s() - t0 < 2.5 && first < kMsgs) {
            int done = 0;
            weft_status_t st;
            ASSERT_EQ(weft_test(reqs[first], &done, &st), WEFT_SUCCESS) << weft_comm_last_error(c);
            if (done)
                reqs[first++] = nullptr;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        ASSERT_EQ(weft_waitall(kMsgs, reqs.data(), nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
        const uint64_t last = 0x5eed;
        ASSERT_EQ(weft_send(c, &last, sizeof last, 0, kNeverTag), WEFT_SUCCESS) << weft_comm_last_error(c);
    } else if (rank == 0) {
        uint64_t last = 0;
        weft_request_t *r6 = nullptr;
        ASSERT_EQ(weft_irecv(c, &last, sizeof last, 1, kNeverTag, &r6), WEFT_SUCCESS) << weft_comm_last_error(c);
        const size_t rss_before = vm_rss_bytes();
        ASSERT_GT(rss_before, 0u) << "no VmRSS in /proc/self/status";
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);   /* rank 1 has started all its sends */
        const double t0 = now_s();
        bool r6_done = false;
        while (now_s() - t0 < 2.0) {
            int done = 0;
            weft_status_t st;
            ASSERT_EQ(weft_test(r6, &done, &st), WEFT_SUCCESS) << weft_comm_last_error(c);
            if (done) {
                r6_done = true;
                ADD_FAILURE() << "the tag-6 receive completed, but rank 1 had not sent on tag 6";
                break;
            }
        }
        const size_t rss_after = vm_rss_bytes();
        const double grew_mib = ((double)rss_after - (double)rss_before) / (double)MiB;
        std::printf("rank 0 VmRSS: %.1f MiB before, %.1f MiB after 2 s with 80 MiB of sends pending (+%.1f MiB)\n",
                    (double)rss_before / MiB, (double)rss_after / MiB, grew_mib);
        EXPECT_LT(rss_after, rss_before + kMaxGrowth)
            << "resident memory grew by " << grew_mib << " MiB with WEFT_EAGER_WINDOW=" << env_or("WEFT_EAGER_WINDOW", "")
            << ": unreceived eager messages are buffered beyond the window";
        MPI_Barrier(MPI_COMM_WORLD);
        std::vector<unsigned char> in(kBatch * kMsg);
        std::vector<weft_request_t *> reqs(kBatch);
        std::vector<weft_status_t> st(kBatch);
        for (size_t base = 0; base < kMsgs; base += kBatch) {
            for (size_t k = 0; k < kBatch; k++)
                ASSERT_EQ(weft_irecv(c, in.data() + k * kMsg, kMsg, 1, kTag, &reqs[k]), WEFT_SUCCESS)
                    << weft_comm_last_error(c);
            ASSERT_EQ(weft_waitall(kBatch, reqs.data(), st.data()), WEFT_SUCCESS)
                << "messages " << base << ".." << base + kBatch - 1 << ": " << weft_comm_last_error(c);
            for (size_t k = 0; k < kBatch; k++) {
                ASSERT_EQ(st[k].bytes, kMsg);
                ASSERT_TRUE(HasPattern(in.data() + k * kMsg, kMsg, 1, kTag, base + k)) << "message " << base + k;
            }
        }
        if (!r6_done) {
            ASSERT_EQ(weft_wait(r6, nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
            EXPECT_EQ(last, 0x5eedu);
        }
    }
    if (any_rank(HasFailure()))
        return;   /* every rank destroys, or none (leaked, as the fixture does) */
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

/* ---- H. weft_comm_abort ---- */

/* Rank 0's main thread blocks in a receive rank 1 never answers; a second
 * thread aborts the comm after 0.5 s. Rank 1 blocks in a receive from
 * rank 0. Rank 0's receive returns WEFT_ERR_ABORTED within 2 s, rank 1's
 * fails within 3 s naming rank 0 (WEFT_TIMEOUT is 60: the abort told it),
 * every later call on rank 0's comm returns WEFT_ERR_ABORTED, and destroy
 * returns on both (ABORTED on rank 0). */
TEST_F(Abort, EndsBlockedCallsHereAndAtThePeer)
{
    Watchdog whole(kTestLimit, "Abort.EndsBlockedCallsHereAndAtThePeer");
    if (size != 2)
        GTEST_SKIP() << "np 2 only";
    weft_comm_t *c = nullptr;
    ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &c), WEFT_SUCCESS);
    {
        Watchdog wd(30, "p2p before the abort");
        all_pairs_exchange(c, 20, 0);   /* the pipe is up and used */
    }
    ASSERT_FALSE(HasFatalFailure());
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<unsigned char> buf(64);
    if (rank == 0) {
        int abort_rc = -1;
        std::thread aborter([&] {
            usleep(500000);
            abort_rc = weft_comm_abort(c);
        });
        int rc;
        double took;
        {
            Watchdog wd(20, "rank 0's receive while another thread aborts the comm");
            const double t0 = now_s();
            rc = weft_recv(c, buf.data(), buf.size(), 1, 3, nullptr);
            took = now_s() - t0;
        }
        aborter.join();
        EXPECT_EQ(abort_rc, WEFT_SUCCESS) << "weft_comm_abort";
        EXPECT_EQ(rc, WEFT_ERR_ABORTED) << weft_strerror(rc) << ": " << weft_comm_last_error(c);
        EXPECT_LT(took, 2.0) << "the blocked receive took " << took << " s to see the abort (0.5 s in)";
        EXPECT_GE(took, 0.4) << "the receive ended before the abort: " << weft_comm_last_error(c);
        /* Every later call on the comm. */
        Watchdog wd(20, "calls on an aborted comm");
        uint64_t x = 1;
        std::vector<unsigned char> ag(2 * 8);
        weft_request_t *r = nullptr;
        EXPECT_EQ(weft_send(c, &x, sizeof x, 1, 5), WEFT_ERR_ABORTED) << "weft_send";
        EXPECT_EQ(weft_allgather(c, &x, ag.data(), 8), WEFT_ERR_ABORTED) << "weft_allgather";
        EXPECT_EQ(weft_isend(c, &x, sizeof x, 1, 5, &r), WEFT_ERR_ABORTED) << "weft_isend";
        EXPECT_EQ(weft_irecv(c, &x, sizeof x, 1, 5, &r), WEFT_ERR_ABORTED) << "weft_irecv";
        EXPECT_EQ(weft_recv(c, &x, sizeof x, 1, 5, nullptr), WEFT_ERR_ABORTED) << "weft_recv";
        EXPECT_EQ(weft_barrier(c), WEFT_ERR_ABORTED) << "weft_barrier";
        EXPECT_EQ(weft_bcast(c, &x, sizeof x, 0), WEFT_ERR_ABORTED) << "weft_bcast";
    } else {
        int rc;
        double took;
        {
            Watchdog wd(20, "rank 1's receive from rank 0, which aborts its comm");
            const double t0 = now_s();
            rc = weft_recv(c, buf.data(), buf.size(), 0, 4, nullptr);
            took = now_s() - t0;
        }
        const std::string err = weft_comm_last_error(c);
        EXPECT_NE(rc, WEFT_SUCCESS) << "a receive from a rank that aborted succeeded";
        EXPECT_LT(took, 3.0) << "rank 1 took " << took << " s to see rank 0's abort (WEFT_TIMEOUT "
                             << weft_timeout_s() << "): " << err;
        EXPECT_NE(err.find("rank 0"), std::string::npos) << "\"" << err << "\" does not name rank 0";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    int rc;
    double took;
    {
        Watchdog wd(20, "weft_comm_destroy after an abort");
        const double t0 = now_s();
        rc = weft_comm_destroy(c);
        took = now_s() - t0;
    }
    if (rank == 0) {
        EXPECT_EQ(rc, WEFT_ERR_ABORTED) << "destroy of the aborted comm: " << weft_strerror(rc);
    }
    EXPECT_LT(took, 10.0) << "destroy after the abort took " << took << " s";
}

} // namespace

/* The reductions' and non-blocking calls' arguments: each refused with
 * WEFT_ERR_INVALID_ARG and a last error naming the call and the argument;
 * nothing is started (the comm then runs a matching call normally). */
TEST_F(Requests, ReductionArgumentsRefused)
{
    std::vector<float> a(64 * (size_t)size, 1.0f), b(64 * (size_t)size, 0.0f);
    weft_request_t *req = nullptr;
    struct Case { const char *what; std::function<int()> call; const char *names; };
    const std::vector<Case> cases = {
        { "dtype", [&] { return weft_allreduce(comm, a.data(), b.data(), 4, (weft_dtype_t)10, WEFT_SUM); },
          "dtype 10" },
        { "negative dtype", [&] { return weft_allreduce(comm, a.data(), b.data(), 4, (weft_dtype_t)-1, WEFT_SUM); },
          "dtype -1" },
        { "op", [&] { return weft_reduce_scatter(comm, a.data(), b.data(), 4, WEFT_FLOAT32, (weft_op_t)5); },
          "op 5" },
        { "NULL sendbuf", [&] { return weft_allreduce(comm, nullptr, b.data(), 4, WEFT_FLOAT32, WEFT_SUM); },
          "sendbuf is NULL" },
        { "NULL recvbuf", [&] { return weft_allreduce(comm, a.data(), nullptr, 4, WEFT_FLOAT32, WEFT_SUM); },
          "recvbuf is NULL" },
        { "overflow", [&] { return weft_allreduce(comm, a.data(), b.data(), SIZE_MAX / 2, WEFT_FLOAT32, WEFT_SUM); },
          "overflows" },
        { "overlap", [&] { return weft_allreduce(comm, a.data(), a.data() + 1, 4, WEFT_FLOAT32, WEFT_SUM); },
          "overlaps" },
        { "reduce_scatter overlap not in place",
          [&] { return weft_reduce_scatter(comm, a.data(), a.data() + 1, 4, WEFT_FLOAT32, WEFT_SUM); }, "in-place" },
        { "reduce root", [&] { return weft_reduce(comm, a.data(), b.data(), 4, WEFT_FLOAT32, WEFT_SUM, size); },
          "root" },
        { "alltoall overlap", [&] { return weft_alltoall(comm, a.data(), a.data() + 1, 8); }, "overlaps" },
        { "NULL req", [&] { return weft_iallreduce(comm, a.data(), b.data(), 4, WEFT_FLOAT32, WEFT_SUM, nullptr); },
          "req" },
        { "NULL req barrier", [&] { return weft_ibarrier(comm, nullptr); }, "req" },
        { "NULL comm", [&] { return weft_ialltoall(nullptr, a.data(), b.data(), 8, &req); }, nullptr },
    };
    for (const Case &c : cases) {
        EXPECT_EQ(c.call(), WEFT_ERR_INVALID_ARG) << c.what;
        if (c.names) {
            EXPECT_NE(last_error().find(c.names), std::string::npos) << c.what << ": " << last_error();
        }
    }
    /* Off the root, recvbuf of weft_reduce is not used: NULL is fine. */
    EXPECT_EQ(weft_reduce(comm, a.data(), rank == 0 ? b.data() : nullptr, 64, WEFT_FLOAT32, WEFT_SUM, 0),
              WEFT_SUCCESS) << last_error();
    if (rank == 0) {
        EXPECT_EQ(b[0], (float)size);
        EXPECT_EQ(b[63], (float)size);
    }
}
