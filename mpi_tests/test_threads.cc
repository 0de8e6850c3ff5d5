/*
 * Two threads doing point-to-point on one comm at the same time. Only the
 * main thread calls MPI (the fixture's set-up and teardown); the threads call
 * weft only, which is the thread-safety weft promises whatever thread level
 * MPI was initialised with.
 */
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"
#include "weft_p2p_sizes.h"

using namespace weft_mpitest;

namespace {

class Threads : public WeftMpiTest {
protected:
    int right() const { return (rank + 1) % size; }
    int left() const { return (rank + size - 1) % size; }
};

/* What a worker thread found wrong; asserted on the main thread. */
struct WorkerResult {
    std::string first_error;
    int errors = 0;
    void fail(const std::string &what)
    {
        if (errors++ == 0)
            first_error = what;
    }
};

size_t thread_msg_size(int i)
{
    /* Small, above the largest eager limit, and a multi-chunk rendezvous. */
    switch (i % 5) {
    case 0: return (size_t)i % 97;
    case 1: return 4097;
    case 2: return max_eager_limit() + 1 + (size_t)i % 13;
    case 3: return 1000;
    default: return (i % 10 == 4) ? (1u << 20) + 3 : 31;
    }
}

/* One round of a ring exchange on one tag: receive from the left, send to
 * the right, message i of the pattern. false (and res told) on a failure. */
bool ring_round(weft_comm_t *comm, int rank, int left, int right, int tag, int i, WorkerResult *res)
{
    const size_t n = thread_msg_size(i);
    std::vector<unsigned char> out(n), in(n);
    fill_pattern(out.data(), n, pattern_seed(rank, tag, (uint64_t)i));
    weft_request_t *reqs[2];
    weft_status_t st[2];
    int rc = weft_irecv(comm, in.data(), n, left, tag, &reqs[0]);
    if (rc != WEFT_SUCCESS) {
        res->fail("irecv: " + std::string(weft_comm_last_error(comm)));
        return false;
    }
    rc = weft_isend(comm, out.data(), n, right, tag, &reqs[1]);
    if (rc != WEFT_SUCCESS) {
        res->fail("isend: " + std::string(weft_comm_last_error(comm)));
        weft_wait(reqs[0], nullptr);
        return false;
    }
    rc = weft_waitall(2, reqs, st);
    if (rc != WEFT_SUCCESS) {
        res->fail("waitall: " + std::string(weft_strerror(rc)) + ": " + weft_comm_last_error(comm));
        return false;
    }
    if (st[0].bytes != n || st[0].tag != tag || st[0].peer != left)
        res->fail("tag " + std::to_string(tag) + " iteration " + std::to_string(i) + ": status says " +
                  std::to_string(st[0].bytes) + " bytes, tag " + std::to_string(st[0].tag));
    ::testing::AssertionResult ok = HasPattern(in.data(), n, left, tag, (uint64_t)i);
    if (!ok)
        res->fail(ok.message());
    return res->errors == 0;
}

void ring_worker(weft_comm_t *comm, int rank, int left, int right, int tag, int iterations, WorkerResult *res)
{
    for (int i = 0; i < iterations && ring_round(comm, rank, left, right, tag, i, res); i++) {}
}

TEST_F(Threads, TwoThreadsRingOnDifferentTags)
{
    const int iterations = size >= 8 ? 40 : 150;
    WorkerResult a, b;
    std::thread ta(ring_worker, comm, rank, left(), right(), 1, iterations, &a);
    std::thread tb(ring_worker, comm, rank, left(), right(), 2, iterations, &b);
    ta.join();
    tb.join();
    EXPECT_EQ(a.errors, 0) << "thread on tag 1: " << a.first_error;
    EXPECT_EQ(b.errors, 0) << "thread on tag 2: " << b.first_error;
}

/* One thread only sends, the other only receives, on the same tag: the
 * pipe's matching and the transport see both sides from two threads. */
TEST_F(Threads, SenderThreadAndReceiverThreadOnOneTag)
{
    const int count = size >= 8 ? 100 : 400;
    const int tag = 3;
    WorkerResult sres, rres;
    const int me = rank, to = right(), from = left();
    std::thread sender([&]() {
        std::vector<std::vector<unsigned char>> outs(count);
        std::vector<weft_request_t *> reqs(count);
        for (int i = 0; i < count; i++) {
            outs[i].resize(thread_msg_size(i));
            fill_pattern(outs[i].data(), outs[i].size(), pattern_seed(me, tag, (uint64_t)i));
            if (weft_isend(comm, outs[i].data(), outs[i].size(), to, tag, &reqs[i]) != WEFT_SUCCESS) {
                sres.fail("isend " + std::to_string(i) + ": " + weft_comm_last_error(comm));
                /* Completes what was posted so the comm can be destroyed. */
                weft_waitall((size_t)i, reqs.data(), nullptr);
                return;
            }
        }
        if (weft_waitall(count, reqs.data(), nullptr) != WEFT_SUCCESS)
            sres.fail(std::string("send waitall: ") + weft_comm_last_error(comm));
    });
    std::thread receiver([&]() {
        for (int i = 0; i < count; i++) {
            const size_t n = thread_msg_size(i);
            std::vector<unsigned char> in(n);
            weft_status_t st;
            if (weft_recv(comm, in.data(), n, from, tag, &st) != WEFT_SUCCESS) {
                rres.fail("recv " + std::to_string(i) + ": " + weft_comm_last_error(comm));
                return;
            }
            ::testing::AssertionResult ok = HasPattern(in.data(), n, from, tag, (uint64_t)i);
            if (!ok || st.bytes != n) {
                rres.fail("message " + std::to_string(i) + ": " + ok.message());
                return;
            }
        }
    });
    sender.join();
    receiver.join();
    EXPECT_EQ(sres.errors, 0) << sres.first_error;
    EXPECT_EQ(rres.errors, 0) << rres.first_error;
}

/* WEFT_THREADS=serialized, as the comm's own setting: the program's
 * threads call into the comm one at a time, in an order of the program's
 * (here a turn handed over under a mutex), and the comm takes no lock.
 * Two threads take turns through messages of every protocol, a blocking
 * and a non-blocking collective. Under ThreadSanitizer (scripts/test)
 * this shows that no thread of weft's reaches such a comm behind the
 * program's back: the program's own ordering is all the comm needs. */
TEST_F(Threads, SerializedCommHandedBetweenThreads)
{
    weft_comm_t *sc = nullptr;
    ASSERT_EQ(WEFT_SUCCESS, create_comm_with("WEFT_THREADS", "serialized", &sc)) << weft_last_error();

    const int rounds = size >= 8 ? 24 : 90, tag = 4, me = rank, n = size, l = left(), r = right();
    std::mutex mu;
    std::condition_variable cv;
    int turn = 0;
    WorkerResult res[2];
    auto one_round = [&](int i, WorkerResult *wr) {
        if (!ring_round(sc, me, l, r, tag, i, wr))
            return;
        int32_t in[5], out[5];
        for (int k = 0; k < 5; k++)
            in[k] = me * 10 + i + k;
        int32_t want = 10 * (n * (n - 1) / 2);
        weft_request_t *req = nullptr;
        int rc = i % 3 == 1 ? weft_iallreduce(sc, in, out, 5, WEFT_INT32, WEFT_SUM, &req)
                            : weft_allreduce(sc, in, out, 5, WEFT_INT32, WEFT_SUM);
        if (rc == WEFT_SUCCESS && req != nullptr)
            rc = weft_wait(req, nullptr);
        if (rc != WEFT_SUCCESS) {
            wr->fail("allreduce in round " + std::to_string(i) + ": " + weft_comm_last_error(sc));
            return;
        }
        for (int k = 0; k < 5; k++)
            if (out[k] != want + n * (i + k))
                wr->fail("allreduce in round " + std::to_string(i) + ": element " + std::to_string(k) + " is " +
                         std::to_string(out[k]) + ", expected " + std::to_string(want + n * (i + k)));
    };
    auto worker = [&](int t) {
        for (int i = t; i < rounds; i += 2) {
            {
                std::unique_lock<std::mutex> g(mu);
                cv.wait(g, [&] { return turn == i; });
            }
            if (res[0].errors == 0 && res[1].errors == 0)   /* after a failure the turns only run out */
                one_round(i, &res[t]);
            {
                std::lock_guard<std::mutex> g(mu);
                turn = i + 1;
            }
            cv.notify_all();
        }
    };
    std::thread t0(worker, 0), t1(worker, 1);
    t0.join();
    t1.join();
    EXPECT_EQ(res[0].errors, 0) << "thread 0: " << res[0].first_error;
    EXPECT_EQ(res[1].errors, 0) << "thread 1: " << res[1].first_error;
    EXPECT_EQ(WEFT_SUCCESS, weft_comm_destroy(sc)) << weft_last_error();
}

} // namespace
