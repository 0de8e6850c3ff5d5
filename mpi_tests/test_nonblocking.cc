/*
 * Non-blocking collectives through the public API (weft_iallreduce,
 * weft_iallgather, weft_ibcast, weft_ibarrier, weft_ireduce_scatter,
 * weft_ireduce, weft_ialltoall), completed with weft_wait / weft_waitall /
 * weft_test like point-to-point requests (docs/api.md, "Non-blocking
 * collectives"):
 *
 *  - several of every kind outstanding on one comm, completed by one
 *    weft_waitall in an order that differs from the start order (and from
 *    rank to rank), or by weft_test loops;
 *  - mixed with point-to-point: isend/irecv in the same waitall, blocking
 *    send/recv between the starts and the wait;
 *  - more outstanding than the 64 internal call slots (100 iallreduces,
 *    then one waitall; 150 waited one by one in reverse);
 *  - blocking collectives while non-blocking ones are outstanding;
 *  - requests of two comms in one waitall;
 *  - handle rules: a completed request is refused (WEFT_ERR_INVALID_ARG) by
 *    wait, test and waitall, and waitall then frees nothing; NULL req refused;
 *  - status of a collective request: bytes 0, peer -1, tag -1, error.
 *
 * Every result is checked exactly: integer reductions of rank-dependent
 * values, float32 sums of small integers (exact in any order), byte
 * patterns of (owner, call) for allgather / bcast / alltoall blocks.
 * Every rank starts its collectives in the same order (the contract);
 * only the completion order differs.
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

/* One started collective and how to check it afterwards. */
struct Op {
    std::string what;
    weft_request_t *req = nullptr;
    std::vector<unsigned char> send, recv, expect; /* recv must equal expect (when not empty) */
    bool check_recv = true;
    bool coll = true; /* false: isend / irecv */
};

/* Values: element i of rank r (int32 / int64 / float32), deterministic. */
inline int32_t v32(int r, size_t i, int call)
{
    return (int32_t)(uint32_t)mix64((uint64_t)r * 977 + i * 131 + ((uint64_t)call << 40));
}
inline int64_t v64(int r, size_t i, int call)
{
    return (int64_t)mix64(((uint64_t)r << 32) ^ (i * 7919 + ((uint64_t)call << 44)));
}
inline float vf(int r, size_t i, int call)
{
    return (float)((int)((i * 5 + (size_t)r * 11 + (size_t)call) % 41) - 20);
}

template <typename T>
std::vector<unsigned char> bytes_of(const std::vector<T> &v)
{
    std::vector<unsigned char> b(v.size() * sizeof(T));
    if (!b.empty())
        std::memcpy(b.data(), v.data(), b.size());
    return b;
}

class Nonblocking : public WeftMpiTest {
protected:
    std::vector<std::unique_ptr<Op>> ops;

    Op &add(const std::string &what)
    {
        ops.emplace_back(new Op);
        ops.back()->what = what;
        return *ops.back();
    }

    /* ---- starts (each fills send/expect, starts, keeps the request) ---- */

    /* int32 SUM (wraps freely), out of place or in place. */
    void start_allreduce_i32(weft_comm_t *c, size_t count, bool in_place, int call)
    {
        Op &o = add("iallreduce int32 sum count " + std::to_string(count) + (in_place ? " in place" : "") +
                    " #" + std::to_string(call));
        std::vector<int32_t> mine(count), want(count, 0);
        for (size_t i = 0; i < count; i++) {
            mine[i] = v32(rank, i, call);
            for (int r = 0; r < size; r++)
                want[i] = (int32_t)((uint32_t)want[i] + (uint32_t)v32(r, i, call));
        }
        o.send = bytes_of(mine);
        o.expect = bytes_of(want);
        o.recv = in_place ? o.send : std::vector<unsigned char>(o.expect.size(), 0xEE);
        const void *sp = in_place ? (const void *)o.recv.data() : (const void *)o.send.data();
        int rc = weft_iallreduce(c, count ? sp : nullptr, count ? o.recv.data() : nullptr, count, WEFT_INT32,
                                 WEFT_SUM, &o.req);
        ASSERT_EQ(rc, WEFT_SUCCESS) << o.what << ": " << weft_comm_last_error(c);
    }

    /* int64 MAX. */
    void start_allreduce_i64_max(weft_comm_t *c, size_t count, int call)
    {
        Op &o = add("iallreduce int64 max count " + std::to_string(count) + " #" + std::to_string(call));
        std::vector<int64_t> mine(count), want(count);
        for (size_t i = 0; i < count; i++) {
            mine[i] = v64(rank, i, call);
            want[i] = v64(0, i, call);
            for (int r = 1; r < size; r++)
                want[i] = std::max(want[i], v64(r, i, call));
        }
        o.send = bytes_of(mine);
        o.expect = bytes_of(want);
        o.recv.assign(o.expect.size(), 0xEE);
        ASSERT_EQ(weft_iallreduce(c, o.send.data(), o.recv.data(), count, WEFT_INT64, WEFT_MAX, &o.req), WEFT_SUCCESS)
            << o.what << ": " << weft_comm_last_error(c);
    }

    void start_allgather(weft_comm_t *c, size_t bytes, int call)
    {
        Op &o = add("iallgather " + std::to_string(bytes) + " B #" + std::to_string(call));
        o.send.resize(bytes);
        fill_pattern(o.send.data(), bytes, pattern_seed(rank, 100, (uint64_t)call));
        o.expect.resize(bytes * (size_t)size);
        for (int r = 0; r < size; r++)
            fill_pattern(o.expect.data() + (size_t)r * bytes, bytes, pattern_seed(r, 100, (uint64_t)call));
        o.recv.assign(o.expect.size(), 0xEE);
        ASSERT_EQ(weft_iallgather(c, bytes ? o.send.data() : nullptr, bytes ? o.recv.data() : nullptr, bytes, &o.req),
                  WEFT_SUCCESS)
            << o.what << ": " << weft_comm_last_error(c);
    }

    void start_bcast(weft_comm_t *c, size_t bytes, int root, int call)
    {
        Op &o = add("ibcast " + std::to_string(bytes) + " B root " + std::to_string(root) + " #" +
                    std::to_string(call));
        o.expect.resize(bytes);
        fill_pattern(o.expect.data(), bytes, pattern_seed(root, 200, (uint64_t)call));
        o.recv = rank == root ? o.expect : std::vector<unsigned char>(bytes, 0xEE);
        ASSERT_EQ(weft_ibcast(c, bytes ? o.recv.data() : nullptr, bytes, root, &o.req), WEFT_SUCCESS)
            << o.what << ": " << weft_comm_last_error(c);
    }

    void start_barrier(weft_comm_t *c, int call)
    {
        Op &o = add("ibarrier #" + std::to_string(call));
        o.check_recv = false;
        ASSERT_EQ(weft_ibarrier(c, &o.req), WEFT_SUCCESS) << o.what << ": " << weft_comm_last_error(c);
    }

    /* uint8 SUM (wraps), recvcount per rank. */
    void start_reduce_scatter(weft_comm_t *c, size_t recvcount, int call)
    {
        Op &o = add("ireduce_scatter uint8 sum recvcount " + std::to_string(recvcount) + " #" + std::to_string(call));
        const size_t total = recvcount * (size_t)size;
        o.send.resize(total);
        for (size_t i = 0; i < total; i++)
            o.send[i] = (unsigned char)v32(rank, i, call);
        o.expect.assign(recvcount, 0);
        for (size_t k = 0; k < recvcount; k++)
            for (int r = 0; r < size; r++)
                o.expect[k] = (unsigned char)(o.expect[k] + (unsigned char)v32(r, (size_t)rank * recvcount + k, call));
        o.recv.assign(recvcount, 0xEE);
        ASSERT_EQ(weft_ireduce_scatter(c, total ? o.send.data() : nullptr, recvcount ? o.recv.data() : nullptr,
                                       recvcount, WEFT_UINT8, WEFT_SUM, &o.req),
                  WEFT_SUCCESS)
            << o.what << ": " << weft_comm_last_error(c);
    }

    /* float32 SUM of small integers (exact), at root. */
    void start_reduce(weft_comm_t *c, size_t count, int root, int call)
    {
        Op &o = add("ireduce float32 sum count " + std::to_string(count) + " root " + std::to_string(root) + " #" +
                    std::to_string(call));
        std::vector<float> mine(count), want(count, 0.0f);
        for (size_t i = 0; i < count; i++) {
            mine[i] = vf(rank, i, call);
            for (int r = 0; r < size; r++)
                want[i] += vf(r, i, call);
        }
        o.send = bytes_of(mine);
        if (rank == root) {
            o.expect = bytes_of(want);
            o.recv.assign(o.expect.size(), 0xEE);
        } else {
            o.check_recv = false; /* NULL recvbuf off the root */
        }
        ASSERT_EQ(weft_ireduce(c, o.send.data(), rank == root ? o.recv.data() : nullptr, count, WEFT_FLOAT32, WEFT_SUM,
                               root, &o.req),
                  WEFT_SUCCESS)
            << o.what << ": " << weft_comm_last_error(c);
    }

    void start_alltoall(weft_comm_t *c, size_t bytes, int call)
    {
        Op &o = add("ialltoall " + std::to_string(bytes) + " B per rank #" + std::to_string(call));
        const size_t total = bytes * (size_t)size;
        o.send.resize(total);
        o.expect.resize(total);
        for (int j = 0; j < size; j++) {
            fill_pattern(o.send.data() + (size_t)j * bytes, bytes, pattern_seed(rank, 300 + j, (uint64_t)call));
            fill_pattern(o.expect.data() + (size_t)j * bytes, bytes, pattern_seed(j, 300 + rank, (uint64_t)call));
        }
        o.recv.assign(total, 0xEE);
        ASSERT_EQ(weft_ialltoall(c, total ? o.send.data() : nullptr, total ? o.recv.data() : nullptr, bytes, &o.req),
                  WEFT_SUCCESS)
            << o.what << ": " << weft_comm_last_error(c);
    }

    /* A p2p exchange with the ring neighbours: irecv from the left, isend to the right. */
    void start_p2p(weft_comm_t *c, size_t bytes, int tag, int call)
    {
        const int right = (rank + 1) % size, left = (rank + size - 1) % size;
        Op &r = add("irecv " + std::to_string(bytes) + " B from " + std::to_string(left) + " tag " +
                    std::to_string(tag));
        r.expect.resize(bytes);
        fill_pattern(r.expect.data(), bytes, pattern_seed(left, tag, (uint64_t)call));
        r.recv.assign(bytes, 0xEE);
        r.coll = false;
        ASSERT_EQ(weft_irecv(c, r.recv.data(), bytes, left, tag, &r.req), WEFT_SUCCESS) << weft_comm_last_error(c);
        Op &s = add("isend " + std::to_string(bytes) + " B to " + std::to_string(right) + " tag " +
                    std::to_string(tag));
        s.send.resize(bytes);
        fill_pattern(s.send.data(), bytes, pattern_seed(rank, tag, (uint64_t)call));
        s.check_recv = false;
        s.coll = false;
        ASSERT_EQ(weft_isend(c, s.send.data(), bytes, right, tag, &s.req), WEFT_SUCCESS) << weft_comm_last_error(c);
    }

    /* One of each kind (and a second allreduce in place, a large bcast). */
    void start_one_of_each(weft_comm_t *c, int call)
    {
        start_allreduce_i32(c, 1000, false, call);
        start_allgather(c, 777, call + 1);
        start_bcast(c, 5000, 1 % size, call + 2);
        start_barrier(c, call + 3);
        start_reduce_scatter(c, 333, call + 4);
        start_reduce(c, 4097, size - 1, call + 5);
        start_alltoall(c, 129, call + 6);
        start_allreduce_i32(c, 70001, true, call + 7);
        start_bcast(c, 300 * 1024 + 3, 0, call + 8);
        start_allreduce_i64_max(c, 513, call + 9);
    }

    /* Every op's data as expected; a collective's status as documented. */
    void check_all(const std::vector<weft_status_t> *st = nullptr)
    {
        for (size_t k = 0; k < ops.size(); k++) {
            const Op &o = *ops[k];
            if (o.check_recv) {
                ASSERT_EQ(o.recv.size(), o.expect.size()) << o.what;
                size_t bad = SIZE_MAX;
                for (size_t i = 0; i < o.recv.size() && bad == SIZE_MAX; i++)
                    if (o.recv[i] != o.expect[i])
                        bad = i;
                EXPECT_EQ(bad, SIZE_MAX) << o.what << ": first wrong byte at " << bad;
            }
            if (st) {
                EXPECT_EQ((*st)[k].error, WEFT_SUCCESS) << o.what;
                if (o.coll) {
                    EXPECT_EQ((*st)[k].bytes, 0u) << o.what;
                    EXPECT_EQ((*st)[k].peer, -1) << o.what;
                    EXPECT_EQ((*st)[k].tag, -1) << o.what;
                }
            }
        }
    }

    /* A permutation of 0..n-1 that differs from rank to rank. */
    std::vector<size_t> shuffled(size_t n, unsigned salt) const
    {
        std::vector<size_t> p(n);
        for (size_t i = 0; i < n; i++)
            p[i] = i;
        std::mt19937 g(1234u + 7919u * (unsigned)rank + salt);
        std::shuffle(p.begin(), p.end(), g);
        return p;
    }

    /* weft_waitall over every op, in the order perm; statuses back in op order. */
    void waitall_in(const std::vector<size_t> &perm)
    {
        std::vector<weft_request_t *> reqs;
        for (size_t k : perm)
            reqs.push_back(ops[k]->req);
        std::vector<weft_status_t> st(reqs.size());
        int rc = weft_waitall(reqs.size(), reqs.data(), st.data());
        ASSERT_EQ(rc, WEFT_SUCCESS) << last_error();
        std::vector<weft_status_t> by_op(ops.size());
        for (size_t j = 0; j < perm.size(); j++)
            by_op[perm[j]] = st[j];
        for (auto &o : ops)
            o->req = nullptr;
        check_all(&by_op);
    }
};

/* Ten collectives of every kind outstanding at once, completed by one
 * weft_waitall in a shuffled order (a different one on every rank). */
TEST_F(Nonblocking, EveryKindOutstandingWaitallShuffled)
{
    start_one_of_each(comm, 0);
    ASSERT_FALSE(HasFailure());
    waitall_in(shuffled(ops.size(), 1));
}

/* The same, twice over, completed by weft_test loops that poll the
 * requests in a rank-dependent order until all are done. */
TEST_F(Nonblocking, CompletedByTestLoops)
{
    start_one_of_each(comm, 10);
    start_one_of_each(comm, 20);
    ASSERT_FALSE(HasFailure());
    std::vector<size_t> order = shuffled(ops.size(), 2);
    std::vector<weft_status_t> st(ops.size());
    size_t left = ops.size();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (left > 0) {
        for (size_t k : order) {
            if (ops[k]->req == nullptr)
                continue;
            int done = 0;
            int rc = weft_test(ops[k]->req, &done, &st[k]);
            if (done) {
                EXPECT_EQ(rc, WEFT_SUCCESS) << ops[k]->what << ": " << last_error();
                ops[k]->req = nullptr;
                left--;
            } else {
                ASSERT_EQ(rc, WEFT_SUCCESS) << ops[k]->what << ": weft_test: " << last_error();
            }
        }
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << left << " requests still not done after 60 s";
    }
    check_all(&st);
}

/* Collective and point-to-point requests in one waitall; blocking
 * send/recv while the collectives are outstanding. */
TEST_F(Nonblocking, InterleavedWithPointToPoint)
{
    start_allreduce_i32(comm, 4096, false, 30);
    start_p2p(comm, 100, 5, 31);
    start_allgather(comm, 65537, 32);
    start_p2p(comm, 300 * 1024 + 1, 6, 33);
    start_bcast(comm, 10000, size - 1, 34);
    start_reduce_scatter(comm, 1000, 35);
    start_p2p(comm, 0, 7, 36);
    start_reduce(comm, 777, 0, 37);
    start_alltoall(comm, 1000, 38);
    ASSERT_FALSE(HasFailure());

    /* Blocking p2p with the neighbours between the starts and the wait:
     * even ranks send first, odd ranks receive first (no cycle of senders). */
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (size_t bytes : { (size_t)64, (size_t)200000 }) {
        std::vector<unsigned char> out(bytes), in(bytes, 0xEE);
        fill_pattern(out.data(), bytes, pattern_seed(rank, 9, bytes));
        if (size == 1) {
            weft_request_t *r;
            ASSERT_EQ(weft_isend(comm, out.data(), bytes, rank, 9, &r), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_recv(comm, in.data(), bytes, rank, 9, nullptr), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_wait(r, nullptr), WEFT_SUCCESS) << last_error();
        } else if (rank % 2 == 0) {
            ASSERT_EQ(weft_send(comm, out.data(), bytes, right, 9), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_recv(comm, in.data(), bytes, left, 9, nullptr), WEFT_SUCCESS) << last_error();
        } else {
            ASSERT_EQ(weft_recv(comm, in.data(), bytes, left, 9, nullptr), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_send(comm, out.data(), bytes, right, 9), WEFT_SUCCESS) << last_error();
        }
        EXPECT_TRUE(HasPattern(in.data(), bytes, left, 9, bytes)) << "blocking recv of " << bytes << " B";
    }
    waitall_in(shuffled(ops.size(), 3));
}

/* More outstanding than the 64 call slots: 100 iallreduces then one
 * waitall; then 150 of mixed kinds completed one by one, newest first. */
TEST_F(Nonblocking, MoreOutstandingThanCallSlots)
{
    for (int k = 0; k < 100; k++)
        start_allreduce_i32(comm, 1 + (size_t)(k * 37) % 300 + (k % 10 == 0 ? 5000 : 0), k % 3 == 0, 100 + k);
    ASSERT_FALSE(HasFailure());
    waitall_in(shuffled(ops.size(), 4));
    if (HasFailure())
        return;
    ops.clear();
    for (int k = 0; k < 150; k++) {
        switch (k % 5) {
        case 0: start_allreduce_i64_max(comm, 1 + (size_t)k, 300 + k); break;
        case 1: start_bcast(comm, 100 + (size_t)k, k % size, 300 + k); break;
        case 2: start_allgather(comm, 1 + (size_t)k, 300 + k); break;
        case 3: start_reduce_scatter(comm, 3 + (size_t)k, 300 + k); break;
        default: start_barrier(comm, 300 + k); break;
        }
    }
    ASSERT_FALSE(HasFailure());
    for (size_t k = ops.size(); k-- > 0;) {
        weft_status_t st;
        ASSERT_EQ(weft_wait(ops[k]->req, &st), WEFT_SUCCESS) << ops[k]->what << ": " << last_error();
        ops[k]->req = nullptr;
        EXPECT_EQ(st.peer, -1);
        EXPECT_EQ(st.tag, -1);
    }
    check_all();
}

/* Blocking collectives while non-blocking ones are outstanding: each
 * completes, and so do the earlier non-blocking ones afterwards. */
TEST_F(Nonblocking, BlockingCollectivesWhileOutstanding)
{
    start_allreduce_i32(comm, 20000, false, 400);
    start_bcast(comm, 70000, 0, 401);
    start_reduce_scatter(comm, 5000, 402);
    ASSERT_FALSE(HasFailure());

    /* Blocking allreduce (float32 sum of small integers), barrier,
     * allgather, bcast, reduce; all checked at once. */
    const size_t n = 3000;
    std::vector<float> a(n), want(n, 0.0f), got(n, -1.0f);
    for (size_t i = 0; i < n; i++) {
        a[i] = vf(rank, i, 403);
        for (int r = 0; r < size; r++)
            want[i] += vf(r, i, 403);
    }
    ASSERT_EQ(weft_allreduce(comm, a.data(), got.data(), n, WEFT_FLOAT32, WEFT_SUM), WEFT_SUCCESS) << last_error();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0) << "blocking allreduce";
    ASSERT_EQ(weft_barrier(comm), WEFT_SUCCESS) << last_error();
    std::vector<unsigned char> blk(100), all(100 * (size_t)size);
    fill_pattern(blk.data(), 100, pattern_seed(rank, 404, 0));
    ASSERT_EQ(weft_allgather(comm, blk.data(), all.data(), 100), WEFT_SUCCESS) << last_error();
    for (int r = 0; r < size; r++)
        EXPECT_TRUE(HasPattern(all.data() + (size_t)r * 100, 100, r, 404, 0)) << "blocking allgather block " << r;
    std::vector<unsigned char> bc(1000);
    if (rank == size - 1)
        fill_pattern(bc.data(), 1000, pattern_seed(size - 1, 405, 0));
    ASSERT_EQ(weft_bcast(comm, bc.data(), 1000, size - 1), WEFT_SUCCESS) << last_error();
    EXPECT_TRUE(HasPattern(bc.data(), 1000, size - 1, 405, 0)) << "blocking bcast";
    std::vector<float> red(n, -1.0f);
    ASSERT_EQ(weft_reduce(comm, a.data(), red.data(), n, WEFT_FLOAT32, WEFT_SUM, 0), WEFT_SUCCESS) << last_error();
    if (rank == 0) {
        EXPECT_EQ(std::memcmp(red.data(), want.data(), n * 4), 0) << "blocking reduce";
    }

    /* One more non-blocking call after the blocking ones, then wait all. */
    start_allgather(comm, 4096, 406);
    ASSERT_FALSE(HasFailure());
    waitall_in(shuffled(ops.size(), 5));
}

/* Requests of two comms in one waitall. */
TEST_F(Nonblocking, TwoCommsOneWaitall)
{
    weft_comm_t *c2 = nullptr;
    ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &c2), WEFT_SUCCESS);
    start_allreduce_i32(comm, 5000, false, 500);
    start_allreduce_i32(c2, 5000, false, 501);
    start_allgather(c2, 1000, 502);
    start_bcast(comm, 1000, 0, 503);
    start_barrier(c2, 504);
    ASSERT_FALSE(HasFailure());
    waitall_in(shuffled(ops.size(), 6));
    EXPECT_EQ(weft_comm_destroy(c2), WEFT_SUCCESS);
}

/* Handle rules: a completed request is refused by wait, test and waitall
 * (INVALID_ARG); a waitall holding one then frees nothing, so its other
 * requests are still there to be waited for. A NULL req pointer is refused
 * by every start form, and nothing is started. */
TEST_F(Nonblocking, RequestHandleRules)
{
    start_allreduce_i32(comm, 100, false, 600);
    ASSERT_FALSE(HasFailure());
    weft_request_t *stale = ops[0]->req;
    ASSERT_EQ(weft_wait(stale, nullptr), WEFT_SUCCESS) << last_error();
    check_all();
    EXPECT_EQ(weft_wait(stale, nullptr), WEFT_ERR_INVALID_ARG) << "second wait of a completed request";
    int done = 0;
    EXPECT_EQ(weft_test(stale, &done, nullptr), WEFT_ERR_INVALID_ARG) << "test of a completed request";

    /* ibarrier completed by a test loop, then refused. */
    weft_request_t *b = nullptr;
    ASSERT_EQ(weft_ibarrier(comm, &b), WEFT_SUCCESS) << last_error();
    done = 0;
    for (int spins = 0; !done; spins++) {
        ASSERT_EQ(weft_test(b, &done, nullptr), WEFT_SUCCESS) << last_error();
        ASSERT_LT(spins, 100000000) << "ibarrier never completed";
    }
    EXPECT_EQ(weft_test(b, &done, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_wait(b, nullptr), WEFT_ERR_INVALID_ARG);

    /* A fresh request beside a stale one: waitall refuses, frees nothing. */
    ops.clear();
    start_allreduce_i32(comm, 64, false, 601);
    ASSERT_FALSE(HasFailure());
    weft_request_t *pair[2] = { ops[0]->req, stale };
    EXPECT_EQ(weft_waitall(2, pair, nullptr), WEFT_ERR_INVALID_ARG);
    /* The same request twice is refused too. */
    weft_request_t *twice[2] = { ops[0]->req, ops[0]->req };
    EXPECT_EQ(weft_waitall(2, twice, nullptr), WEFT_ERR_INVALID_ARG);
    weft_status_t st;
    ASSERT_EQ(weft_wait(ops[0]->req, &st), WEFT_SUCCESS) << "the fresh request must still be there: " << last_error();
    ops[0]->req = nullptr;
    check_all();

    /* NULL req pointer: refused, nothing started (the next call still matches). */
    std::vector<int32_t> x(8, 1), y(8, 0);
    std::vector<unsigned char> g(8 * (size_t)size);
    EXPECT_EQ(weft_iallreduce(comm, x.data(), y.data(), 8, WEFT_INT32, WEFT_SUM, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_ireduce_scatter(comm, g.data(), y.data(), 1, WEFT_INT32, WEFT_SUM, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_ireduce(comm, x.data(), y.data(), 8, WEFT_INT32, WEFT_SUM, 0, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_iallgather(comm, x.data(), g.data(), 8, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_ibcast(comm, x.data(), 8, 0, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_ibarrier(comm, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_ialltoall(comm, g.data(), g.data(), 8, nullptr), WEFT_ERR_INVALID_ARG);
    /* Bad arguments of a non-blocking form: refused at the start. */
    weft_request_t *r = nullptr;
    EXPECT_EQ(weft_iallreduce(comm, x.data(), y.data(), 8, (weft_dtype_t)WEFT_DTYPE_COUNT, WEFT_SUM, &r),
              WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_ireduce(comm, x.data(), y.data(), 8, WEFT_INT32, WEFT_SUM, size, &r), WEFT_ERR_INVALID_ARG);
    ops.clear();
    start_allreduce_i32(comm, 8, false, 602);
    ASSERT_FALSE(HasFailure());
    waitall_in({ 0 });
}

/* Zero-size calls and a waitall with NULL entries. */
TEST_F(Nonblocking, ZeroSizeAndNullEntries)
{
    start_allreduce_i32(comm, 0, false, 700);
    start_allgather(comm, 0, 701);
    start_bcast(comm, 0, 0, 702);
    start_reduce_scatter(comm, 0, 703);
    start_alltoall(comm, 0, 704);
    start_allreduce_i32(comm, 3, false, 705);
    ASSERT_FALSE(HasFailure());
    std::vector<weft_request_t *> reqs;
    for (auto &o : ops) {
        reqs.push_back(nullptr);
        reqs.push_back(o->req);
    }
    ASSERT_EQ(weft_waitall(reqs.size(), reqs.data(), nullptr), WEFT_SUCCESS) << last_error();
    for (auto &o : ops)
        o->req = nullptr;
    check_all();
}

} // namespace
