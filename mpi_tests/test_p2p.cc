/*
 * Point-to-point over whatever transports the ctest entry selects (shm with
 * and without CMA, tcp, virtual nodes). Every message carries a pattern that
 * depends on sender, tag, message index and offset, and is checked byte for
 * byte on arrival. Every buffer weft reads or writes is a TestBuf
 * (weft_test_mem.h): host memory, or CUDA device memory under
 * WEFT_TEST_MEM=device (the weft_mpi_p2p_dev binary, mpi_tests/device.cmake).
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"
#include "weft_p2p_sizes.h"
#include "weft_test_mem.h"

using namespace weft_mpitest;

namespace {

class P2P : public WeftMpiTest {
protected:
    int right() const { return (rank + 1) % size; }
    int left() const { return (rank + size - 1) % size; }
    /* Iteration counts shrink on crowded runs (8 ranks on 2 cores); sizes never do. */
    int scaled(int n) const { return size >= 8 ? std::max(1, n / 4) : n; }
    /* Whether peer (not this rank) is on this host -- MPI's view of a
     * node, the host name, as weft's -- and the pair's rendezvous data
     * moves by shm's CMA pull: shm allowed, one virtual node, CMA not off,
     * host memory. *local_size: the ranks on this host. Collective over
     * the world comm. */
    bool shm_cma_pair(int peer, int *local_size) const
    {
        MPI_Comm local;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
        int peer_local = MPI_UNDEFINED;
        MPI_Comm_size(local, local_size);
        MPI_Group world_group, local_group;
        MPI_Comm_group(MPI_COMM_WORLD, &world_group);
        MPI_Comm_group(local, &local_group);
        MPI_Group_translate_ranks(world_group, 1, &peer, local_group, &peer_local);
        MPI_Group_free(&world_group);
        MPI_Group_free(&local_group);
        MPI_Comm_free(&local);
        const std::string tp = env_or("WEFT_TRANSPORTS", "");
        return (tp.empty() || tp.find("shm") != std::string::npos) &&
               std::atoi(env_or("WEFT_VIRTUAL_NODES", "0")) <= 1 &&
               std::string(env_or("WEFT_SHM_CMA", "1")) != "0" && peer_local != MPI_UNDEFINED &&
               test_mem_kind() == MemKind::Host && peer != rank;
    }
};

/* A buffer of n bytes filled with the pattern of (sender, tag, index). */
TestBuf patterned(size_t n, int sender, int tag, uint64_t index)
{
    return patterned_buf(n, sender, tag, index);
}

/* A receive buffer of n bytes plus one sentinel byte (kFreshByte) at [n].
 * The n bytes are left uninitialised: zeroing them would be one more pass
 * over up to 64 MiB per rank, and a byte weft failed to write cannot match
 * the pattern anyway. */
TestBuf recv_buffer(size_t n)
{
    return TestBuf(n, TestBuf::kSentinel);
}

/* protocol_sizes(max_bytes); under WEFT_TEST_SIZES=reduced nothing above
 * 4 MiB + 5 (the 64 MiB message goes; 4 MiB + 5 still spans several chunks
 * of every transport and staging path). */
std::vector<size_t> test_sizes(size_t max_bytes = 0)
{
    std::vector<size_t> s = protocol_sizes(max_bytes);
    if (!reduced_sizes())
        return s;
    const size_t cap = (4u << 20) + 5;
    s.erase(std::remove_if(s.begin(), s.end(), [&](size_t v) { return v > cap; }), s.end());
    if (max_bytes == 0 || max_bytes >= cap)
        s.push_back(cap);
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    return s;
}

void expect_recv_status(const weft_status_t &st, size_t bytes, int peer, int tag, int error = WEFT_SUCCESS)
{
    EXPECT_EQ(st.error, error) << weft_strerror(st.error);
    EXPECT_EQ(st.bytes, bytes);
    EXPECT_EQ(st.peer, peer);
    EXPECT_EQ(st.tag, tag);
}

/* Every size, around a ring: receive from the left, send to the right. */
TEST_F(P2P, RingAllSizes)
{
    const std::vector<size_t> sizes = test_sizes();
    for (size_t i = 0; i < sizes.size(); i++) {
        const size_t n = sizes[i];
        const int tag = (int)i;
        TestBuf out = patterned(n, rank, tag, i);
        TestBuf in = recv_buffer(n);
        ASSERT_TRUE(out.ok() && in.ok()) << out.error() << in.error();
        weft_request_t *reqs[2];
        weft_status_t st[2];
        /* Half of the ranks post the receive first, half the send. */
        if ((rank + (int)i) % 2 == 0) {
            ASSERT_EQ(weft_irecv(comm, in.data(), n, left(), tag, &reqs[0]), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_isend(comm, out.data(), n, right(), tag, &reqs[1]), WEFT_SUCCESS) << last_error();
        } else {
            ASSERT_EQ(weft_isend(comm, out.data(), n, right(), tag, &reqs[1]), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_irecv(comm, in.data(), n, left(), tag, &reqs[0]), WEFT_SUCCESS) << last_error();
        }
        ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << "size " << n << ": " << last_error();
        expect_recv_status(st[0], n, left(), tag);
        EXPECT_EQ(st[1].error, WEFT_SUCCESS);
        EXPECT_TRUE(in.HasPattern(n, left(), tag, i)) << "size " << n;
        EXPECT_TRUE(in.sentinel_intact()) << "byte past a " << n << "-byte message written";
    }
}

/* Blocking weft_send/weft_recv between pairs (0,1), (2,3), ...: the even
 * rank sends first, the odd one receives first, then the other way round. */
TEST_F(P2P, BlockingPairsAllSizes)
{
    if (size % 2)
        GTEST_SKIP() << "needs an even number of ranks";
    const int partner = rank ^ 1;
    /* Above 2 MiB only pair (0, 1) when there are more pairs: the other pairs
     * repeat the same protocol path, and on 2 cores their copies would only
     * slow the run down (RingAllSizes moves every size on every pipe). */
    const std::vector<size_t> sizes = test_sizes(size >= 4 && rank > 1 ? (2u << 20) : 0);
    for (size_t i = 0; i < sizes.size(); i++) {
        const size_t n = sizes[i];
        TestBuf out = patterned(n, rank, 7, i);
        TestBuf in = recv_buffer(n);
        ASSERT_TRUE(out.ok() && in.ok()) << out.error() << in.error();
        weft_status_t st;
        if (rank % 2 == 0) {
            ASSERT_EQ(weft_send(comm, out.data(), n, partner, 7), WEFT_SUCCESS) << n << ": " << last_error();
            ASSERT_EQ(weft_recv(comm, in.data(), n, partner, 7, &st), WEFT_SUCCESS) << n << ": " << last_error();
        } else {
            ASSERT_EQ(weft_recv(comm, in.data(), n, partner, 7, &st), WEFT_SUCCESS) << n << ": " << last_error();
            ASSERT_EQ(weft_send(comm, out.data(), n, partner, 7), WEFT_SUCCESS) << n << ": " << last_error();
        }
        expect_recv_status(st, n, partner, 7);
        EXPECT_TRUE(in.HasPattern(n, partner, 7, i));
        EXPECT_TRUE(in.sentinel_intact()) << "byte past a " << n << "-byte message written";
    }
    /* status NULL is allowed. */
    TestBuf b(1), r(1);
    ASSERT_TRUE(b.ok() && r.ok());
    b.write(0, "x", 1);
    if (rank % 2 == 0) {
        ASSERT_EQ(weft_send(comm, b.data(), 1, partner, 8), WEFT_SUCCESS);
    } else {
        ASSERT_EQ(weft_recv(comm, r.data(), 1, partner, 8, nullptr), WEFT_SUCCESS);
        EXPECT_EQ(r.byte_at(0), 'x');
    }
}

/* Every rank sends to every rank (itself included) at a few sizes at once:
 * matching among many peers and tags with all pipes busy. */
TEST_F(P2P, AllToAllSizes)
{
    const size_t sizes[] = {0, 31, max_eager_limit() + 1, (1u << 20) + 3};
    std::vector<TestBuf> outs, ins;
    std::vector<weft_request_t *> reqs;
    std::vector<int> recv_peer, recv_tag;
    std::vector<size_t> recv_size;
    for (size_t s = 0; s < 4; s++) {
        for (int p = 0; p < size; p++) {
            const int tag = 100 + (int)s;
            ins.emplace_back(sizes[s]);
            ASSERT_TRUE(ins.back().ok()) << ins.back().error();
            weft_request_t *r;
            ASSERT_EQ(weft_irecv(comm, ins.back().data(), sizes[s], p, tag, &r), WEFT_SUCCESS) << last_error();
            reqs.push_back(r);
            recv_peer.push_back(p);
            recv_tag.push_back(tag);
            recv_size.push_back(sizes[s]);
        }
    }
    const size_t nrecv = reqs.size();
    for (size_t s = 0; s < 4; s++) {
        for (int k = 0; k < size; k++) {
            const int p = (rank + k) % size; /* stagger so not everyone hits rank 0 first */
            const int tag = 100 + (int)s;
            outs.push_back(patterned(sizes[s], rank, tag, (uint64_t)p));
            ASSERT_TRUE(outs.back().ok()) << outs.back().error();
            weft_request_t *r;
            ASSERT_EQ(weft_isend(comm, outs.back().data(), sizes[s], p, tag, &r), WEFT_SUCCESS) << last_error();
            reqs.push_back(r);
        }
    }
    std::vector<weft_status_t> st(reqs.size());
    ASSERT_EQ(weft_waitall(reqs.size(), reqs.data(), st.data()), WEFT_SUCCESS) << last_error();
    for (size_t i = 0; i < nrecv; i++) {
        expect_recv_status(st[i], recv_size[i], recv_peer[i], recv_tag[i]);
        EXPECT_TRUE(ins[i].HasPattern(recv_size[i], recv_peer[i], recv_tag[i], (uint64_t)rank));
    }
    for (size_t i = nrecv; i < reqs.size(); i++)
        EXPECT_EQ(st[i].error, WEFT_SUCCESS);
}

/* A receive buffer larger than the message: status.bytes is the message
 * size and nothing past the message is written. */
TEST_F(P2P, ReceiveBufferLargerThanMessage)
{
    const size_t sizes[] = {0, 1, 100, just_below_min_eager(), max_eager_limit() + 1, (1u << 20) + 3};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        const size_t n = sizes[i];
        const size_t cap = n + 4096 + 13;
        TestBuf in(cap, TestBuf::kGuarded);
        TestBuf out = patterned(n, rank, 3, i);
        ASSERT_TRUE(in.ok() && out.ok()) << in.error() << out.error();
        weft_request_t *reqs[2];
        weft_status_t st[2];
        ASSERT_EQ(weft_irecv(comm, in.data(), cap, left(), 3, &reqs[0]), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_isend(comm, out.data(), n, right(), 3, &reqs[1]), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << last_error();
        expect_recv_status(st[0], n, left(), 3);
        EXPECT_TRUE(in.HasPattern(n, left(), 3, i));
        const size_t b = in.first_not(n, cap - n, kFreshByte);
        if (b != SIZE_MAX)
            ADD_FAILURE() << "message of " << n << " bytes wrote byte " << n + b << " of a " << cap
                          << "-byte buffer";
        EXPECT_TRUE(in.GuardsIntact());
    }
}

/* A message larger than the receive buffer: the receive fails with
 * WEFT_ERR_TRUNCATE and status.bytes = the size sent, the send completes or
 * fails with the same code, nothing is written outside the buffer, and the
 * next messages on the same (peer, tag) still arrive intact. Eager and
 * rendezvous sizes, truncated to eager and rendezvous buffers. */
TEST_F(P2P, Truncation)
{
    struct Case { size_t msg, buf; };
    const size_t e = min_eager_limit(), E = max_eager_limit();
    const Case cases[] = {
        {2, 1}, {100, 50}, {4097, 4096}, {e ? e - 1 : 8, 7}, {E + 1, E}, {E + 1, 1000},
        {(1u << 20) + 3, 4096}, {(1u << 20) + 3, (1u << 20)}, {(4u << 20) + 1, (1u << 20) + 3},
    };
    const int tag = 21;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const Case c = cases[i];
        TestBuf out = patterned(c.msg, rank, tag, 2 * i);
        TestBuf next_out = patterned(c.msg, rank, tag, 2 * i + 1);
        TestBuf small(c.buf, TestBuf::kGuarded, i % 8);
        TestBuf next_in(c.msg);
        ASSERT_TRUE(out.ok() && next_out.ok() && small.ok() && next_in.ok())
            << out.error() << next_out.error() << small.error() << next_in.error();
        weft_request_t *r_small, *r_next, *s1, *s2;
        weft_status_t st_small, st_next, st_s1, st_s2;
        ASSERT_EQ(weft_irecv(comm, small.data(), c.buf, left(), tag, &r_small), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_isend(comm, out.data(), c.msg, right(), tag, &s1), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_isend(comm, next_out.data(), c.msg, right(), tag, &s2), WEFT_SUCCESS) << last_error();

        int rc = weft_wait(r_small, &st_small);
        EXPECT_EQ(rc, WEFT_ERR_TRUNCATE) << "msg " << c.msg << " into " << c.buf << ": " << weft_strerror(rc);
        EXPECT_EQ(st_small.error, WEFT_ERR_TRUNCATE);
        EXPECT_EQ(st_small.bytes, c.msg) << "status.bytes of a truncated receive is the size sent";
        EXPECT_EQ(st_small.peer, left());
        EXPECT_EQ(st_small.tag, tag);
        EXPECT_TRUE(small.GuardsIntact()) << "msg " << c.msg << " into " << c.buf;

        /* The pipe goes on: the next message on the same lane arrives whole. */
        ASSERT_EQ(weft_irecv(comm, next_in.data(), c.msg, left(), tag, &r_next), WEFT_SUCCESS) << last_error();
        EXPECT_EQ(weft_wait(r_next, &st_next), WEFT_SUCCESS) << last_error();
        expect_recv_status(st_next, c.msg, left(), tag);
        EXPECT_TRUE(next_in.HasPattern(c.msg, left(), tag, 2 * i + 1)) << "message after a truncation";

        rc = weft_wait(s1, &st_s1);
        EXPECT_TRUE(rc == WEFT_SUCCESS || rc == WEFT_ERR_TRUNCATE) << weft_strerror(rc);
        EXPECT_EQ(st_s1.error, rc);
        EXPECT_EQ(weft_wait(s2, &st_s2), WEFT_SUCCESS) << last_error();
    }
}

/* FIFO per (peer, tag) with many messages in flight on several tags, sizes
 * mixing eager and rendezvous in one lane. The receives are posted before
 * the sends (posted queue) or after them (unexpected queue), in an order
 * across tags that differs from the sending order. */
void fifo_many_tags(weft_comm_t *comm, int rank, int left, int right, int per_tag, bool recv_first)
{
    const int tags[] = {0, 5, 77, 1000000};
    const int ntags = 4;
    const size_t big = max_eager_limit() + 1;
    auto size_of = [&](int i, int tag) -> size_t {
        if (i % 17 == 3)
            return big + (size_t)tag % 7;
        return (size_t)((i * 37 + tag) % 300);
    };
    std::vector<TestBuf> outs, ins(ntags * per_tag);
    std::vector<weft_request_t *> recvs(ntags * per_tag), sends;

    auto post_recvs = [&]() {
        /* Tags in reverse order, each lane in its own order. */
        for (int i = 0; i < per_tag; i++)
            for (int k = ntags - 1; k >= 0; k--) {
                const int idx = k * per_tag + i;
                ins[idx] = TestBuf(size_of(i, tags[k]));
                ASSERT_TRUE(ins[idx].ok()) << ins[idx].error();
                ASSERT_EQ(weft_irecv(comm, ins[idx].data(), ins[idx].size(), left, tags[k], &recvs[idx]),
                          WEFT_SUCCESS);
            }
    };
    if (recv_first)
        post_recvs();
    MPI_Barrier(MPI_COMM_WORLD);
    if (::testing::Test::HasFatalFailure())
        return;
    for (int i = 0; i < per_tag; i++)
        for (int k = 0; k < ntags; k++) {
            outs.push_back(patterned(size_of(i, tags[k]), rank, tags[k], (uint64_t)i));
            ASSERT_TRUE(outs.back().ok()) << outs.back().error();
            weft_request_t *r;
            ASSERT_EQ(weft_isend(comm, outs.back().data(), outs.back().size(), right, tags[k], &r), WEFT_SUCCESS);
            sends.push_back(r);
        }
    if (!recv_first) {
        MPI_Barrier(MPI_COMM_WORLD); /* every send is out before any receive is posted */
        post_recvs();
        if (::testing::Test::HasFatalFailure())
            return;
    }
    std::vector<weft_status_t> rst(recvs.size()), sst(sends.size());
    ASSERT_EQ(weft_waitall(recvs.size(), recvs.data(), rst.data()), WEFT_SUCCESS);
    ASSERT_EQ(weft_waitall(sends.size(), sends.data(), sst.data()), WEFT_SUCCESS);
    int reported = 0;
    for (int k = 0; k < ntags; k++)
        for (int i = 0; i < per_tag; i++) {
            const int idx = k * per_tag + i;
            const size_t n = size_of(i, tags[k]);
            if (rst[idx].bytes != n || rst[idx].tag != tags[k] || rst[idx].peer != left ||
                !ins[idx].HasPattern(n, left, tags[k], (uint64_t)i)) {
                if (reported++ < 5)
                    ADD_FAILURE() << "tag " << tags[k] << " message " << i << ": got " << rst[idx].bytes
                                  << " bytes, tag " << rst[idx].tag << ", peer " << rst[idx].peer << "; "
                                  << ins[idx].HasPattern(n, left, tags[k], (uint64_t)i).message();
            }
        }
    EXPECT_EQ(reported, 0) << "messages out of order or corrupted";
}

TEST_F(P2P, FifoManyTagsReceivesPostedFirst)
{
    fifo_many_tags(comm, rank, left(), right(), scaled(200), true);
}

TEST_F(P2P, FifoManyTagsUnexpectedFirst)
{
    fifo_many_tags(comm, rank, left(), right(), scaled(200), false);
}

/* Sends to self: small and large, send posted before and after the receive,
 * several in flight on one lane (FIFO), blocking send of an eager size. */
TEST_F(P2P, SelfSend)
{
    /* The self path is the same on every rank: with more than 2 ranks only
     * rank 0 goes through the sizes above 64 KiB + 1 (all sizes still run in
     * every configuration, on rank 0). */
    const std::vector<size_t> sizes = test_sizes(size > 2 && rank != 0 ? 65537 : 0);
    for (size_t i = 0; i < sizes.size(); i++) {
        const size_t n = sizes[i];
        for (int send_first = 0; send_first < 2; send_first++) {
            const int tag = 40 + send_first;
            TestBuf out = patterned(n, rank, tag, i);
            TestBuf in = recv_buffer(n);
            ASSERT_TRUE(out.ok() && in.ok()) << out.error() << in.error();
            weft_request_t *rs, *rr;
            weft_status_t sst, rst;
            if (send_first) {
                ASSERT_EQ(weft_isend(comm, out.data(), n, rank, tag, &rs), WEFT_SUCCESS) << last_error();
                ASSERT_EQ(weft_irecv(comm, in.data(), n, rank, tag, &rr), WEFT_SUCCESS) << last_error();
            } else {
                ASSERT_EQ(weft_irecv(comm, in.data(), n, rank, tag, &rr), WEFT_SUCCESS) << last_error();
                ASSERT_EQ(weft_isend(comm, out.data(), n, rank, tag, &rs), WEFT_SUCCESS) << last_error();
            }
            ASSERT_EQ(weft_wait(rr, &rst), WEFT_SUCCESS) << n << ": " << last_error();
            ASSERT_EQ(weft_wait(rs, &sst), WEFT_SUCCESS) << n << ": " << last_error();
            expect_recv_status(rst, n, rank, tag);
            EXPECT_TRUE(in.HasPattern(n, rank, tag, i)) << "self, size " << n;
            EXPECT_TRUE(in.sentinel_intact()) << "byte past a " << n << "-byte self message written";
        }
    }
    /* FIFO on the self lane, sizes mixing eager and rendezvous. */
    const int count = 20;
    std::vector<TestBuf> outs, ins(count);
    std::vector<weft_request_t *> reqs;
    for (int i = 0; i < count; i++) {
        size_t n = (i % 3 == 0) ? max_eager_limit() + 1 + i : (size_t)i * 11;
        outs.push_back(patterned(n, rank, 45, (uint64_t)i));
        ASSERT_TRUE(outs.back().ok()) << outs.back().error();
        weft_request_t *r;
        ASSERT_EQ(weft_isend(comm, outs.back().data(), n, rank, 45, &r), WEFT_SUCCESS);
        reqs.push_back(r);
    }
    for (int i = 0; i < count; i++) {
        ins[i] = TestBuf(outs[i].size());
        ASSERT_TRUE(ins[i].ok()) << ins[i].error();
        weft_request_t *r;
        ASSERT_EQ(weft_irecv(comm, ins[i].data(), ins[i].size(), rank, 45, &r), WEFT_SUCCESS);
        reqs.push_back(r);
    }
    ASSERT_EQ(weft_waitall(reqs.size(), reqs.data(), nullptr), WEFT_SUCCESS) << last_error();
    for (int i = 0; i < count; i++)
        EXPECT_TRUE(ins[i].HasPattern(ins[i].size(), rank, 45, (uint64_t)i)) << "self message " << i;
    /* A blocking send to self of an eager size completes before its receive is posted. */
    char msg[13] = "self-blocked", got[13] = {0};
    TestBuf msg_buf(sizeof(msg)), got_buf(sizeof(got));
    ASSERT_TRUE(msg_buf.ok() && got_buf.ok());
    msg_buf.write(0, msg, sizeof(msg));
    ASSERT_EQ(weft_send(comm, msg_buf.data(), sizeof(msg), rank, 46), WEFT_SUCCESS) << last_error();
    weft_status_t st;
    ASSERT_EQ(weft_recv(comm, got_buf.data(), sizeof(got), rank, 46, &st), WEFT_SUCCESS) << last_error();
    got_buf.read(0, got, sizeof(got));
    EXPECT_STREQ(got, msg);
    expect_recv_status(st, sizeof(msg), rank, 46);
}

/* 10,000 isends to one peer outstanding before the peer posts a receive. */
TEST_F(P2P, TenThousandOutstandingIsends)
{
    const int count = 10000;
    std::vector<uint64_t> out(count), in(count, ~0ull);
    std::vector<weft_request_t *> sends(count), recvs(count);
    /* One buffer of `count` 8-byte slots per direction (host: as the vectors
     * always were; device: one cudaMalloc each, slots at offsets). */
    TestBuf out_buf(count * sizeof(uint64_t)), in_buf(count * sizeof(uint64_t));
    ASSERT_TRUE(out_buf.ok() && in_buf.ok()) << out_buf.error() << in_buf.error();
    for (int i = 0; i < count; i++)
        out[i] = pattern_word(pattern_seed(rank, i % 3, (uint64_t)i), 0);
    out_buf.write(0, out.data(), count * sizeof(uint64_t));
    in_buf.write(0, in.data(), count * sizeof(uint64_t));
    for (int i = 0; i < count; i++) {
        const int tag = i % 3;
        ASSERT_EQ(weft_isend(comm, out_buf.data() + i * sizeof(uint64_t), sizeof(uint64_t), right(), tag, &sends[i]),
                  WEFT_SUCCESS)
            << "isend " << i << ": " << last_error();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < count; i++)
        ASSERT_EQ(weft_irecv(comm, in_buf.data() + i * sizeof(uint64_t), sizeof(uint64_t), left(), i % 3, &recvs[i]),
                  WEFT_SUCCESS)
            << "irecv " << i << ": " << last_error();
    ASSERT_EQ(weft_waitall(count, recvs.data(), nullptr), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(weft_waitall(count, sends.data(), nullptr), WEFT_SUCCESS) << last_error();
    in_buf.read(0, in.data(), count * sizeof(uint64_t));
    int bad = 0;
    for (int i = 0; i < count; i++)
        if (in[i] != pattern_word(pattern_seed(left(), i % 3, (uint64_t)i), 0) && bad++ < 5)
            ADD_FAILURE() << "message " << i << " (tag " << i % 3 << ") wrong or out of order";
    EXPECT_EQ(bad, 0);
}

/* A stream of rendezvous messages from one peer (a window of isends, not
 * a ping-pong): below 256 KiB the shm receiver times pulling them by CMA
 * against the sender pushing them through the ring and takes the faster
 * (p2p/transport/shm/shm_cma.c, WEFT_SHM_STREAM). Whatever it picks, a
 * size class's first stream messages are one pull and then a run of
 * pushes, so with the receives posted first and every announcement in
 * the ring before the receiver looks, both ways run, mixed, here: every
 * message must arrive exact and in order. The info line says the choice
 * was made -- where it must be (shm with CMA between the pair, one host
 * with a core per rank, host memory) and nowhere else. */
TEST_F(P2P, StreamOfRendezvousMessages)
{
    weft_comm_t *c = nullptr;
    ASSERT_EQ(create_with(MPI_COMM_WORLD, {{"WEFT_DEBUG", "info"}}, &c), WEFT_SUCCESS) << last_error();
    /* two size classes, odd sizes, each far more than one pull and one run */
    const size_t sizes[] = {9000 + 3, (64u << 10) + 5};
    const int per_size = scaled(40);
    std::vector<TestBuf> outs, ins;
    std::vector<weft_request_t *> recvs, sends;
    for (size_t k = 0; k < 2; k++)
        for (int i = 0; i < per_size; i++) {
            outs.push_back(patterned(sizes[k], rank, (int)k, (uint64_t)i));
            ins.push_back(recv_buffer(sizes[k]));
            ASSERT_TRUE(outs.back().ok() && ins.back().ok()) << outs.back().error() << ins.back().error();
        }
    recvs.resize(outs.size());
    sends.resize(outs.size());
    for (size_t j = 0; j < ins.size(); j++)
        ASSERT_EQ(weft_irecv(c, ins[j].data(), ins[j].size(), left(), (int)(j / per_size), &recvs[j]),
                  WEFT_SUCCESS)
            << weft_comm_last_error(c);
    MPI_Barrier(MPI_COMM_WORLD);
    for (size_t j = 0; j < outs.size(); j++)
        ASSERT_EQ(weft_isend(c, outs[j].data(), outs[j].size(), right(), (int)(j / per_size), &sends[j]),
                  WEFT_SUCCESS)
            << weft_comm_last_error(c);
    /* every announcement is out before any receiver looks at its ring */
    MPI_Barrier(MPI_COMM_WORLD);
    int rc_r = WEFT_ERR_INTERNAL, rc_s = WEFT_ERR_INTERNAL;
    std::string log = capture_stderr([&] {
        rc_r = weft_waitall(recvs.size(), recvs.data(), nullptr);
        rc_s = weft_waitall(sends.size(), sends.data(), nullptr);
    });
    ASSERT_EQ(rc_r, WEFT_SUCCESS) << weft_comm_last_error(c);
    ASSERT_EQ(rc_s, WEFT_SUCCESS) << weft_comm_last_error(c);
    for (size_t j = 0; j < ins.size(); j++) {
        EXPECT_TRUE(ins[j].HasPattern(ins[j].size(), left(), (int)(j / per_size), j % per_size)) << "message " << j;
        EXPECT_TRUE(ins[j].sentinel_intact()) << "message " << j;
    }
    int local_size = 0;
    const bool pair = shm_cma_pair(left(), &local_size);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const bool expected = pair && std::string(env_or("WEFT_SHM_STREAM", "1")) != "0" && cpus > 0 &&
                          local_size <= cpus;
    const std::string said = "peer " + std::to_string(left()) + " sends a stream of rendezvous messages";
    EXPECT_EQ(log.find(said) != std::string::npos, expected) << "rank " << rank << "'s log:\n" << log;
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

/* A lone rendezvous message whose sender makes no weft call until the
 * receive is complete (it waits in MPI for the receiver's word): the
 * receive must finish on its own. Over shm from 64 KiB the receiver shares
 * the copy with the sender when the sender is in weft to take pieces
 * (p2p/transport/shm/shm_cma.c, SHM_SPLIT_MIN); a sender that is not must
 * cost it time, never the message. Sizes: the switch-over, an odd one
 * whose halves are not whole pages, and one of many pieces. Even ranks
 * send to the next odd one. */
TEST_F(P2P, RendezvousWhileSenderOutsideWeft)
{
    const int partner = rank % 2 == 0 ? rank + 1 : rank - 1;
    int local_size = 0;
    /* Elsewhere the sender moves the data (TCP, a push through the ring,
     * staging, RDMA): a sender outside weft then holds it, by design. */
    const bool pull = shm_cma_pair(partner < size ? partner : rank, &local_size);
    int all = 0, mine = pull || partner >= size;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (!all)
        GTEST_SKIP() << "the receiver pulls only between ranks of one host over shm with CMA, in host memory";
    const size_t sizes[] = {64u << 10, (100u << 10) + 3, (1u << 20) + 3};
    int index = 0;
    for (size_t n : sizes) {
        if (partner >= size)
            break;   /* the last rank of an odd size has no partner */
        int token = 0;
        if (rank % 2 == 0) {
            TestBuf out = patterned(n, rank, 5, (uint64_t)index);
            ASSERT_TRUE(out.ok()) << out.error();
            weft_request_t *req = nullptr;
            ASSERT_EQ(weft_isend(comm, out.data(), n, partner, 5, &req), WEFT_SUCCESS) << last_error();
            /* no weft call (no progress, no help) until the receiver has it all */
            MPI_Recv(&token, 1, MPI_INT, partner, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            EXPECT_EQ(token, 1) << "rank " << partner << " did not get " << n << " bytes exact";
            ASSERT_EQ(weft_wait(req, nullptr), WEFT_SUCCESS) << last_error();
        } else {
            TestBuf in = recv_buffer(n);
            ASSERT_TRUE(in.ok()) << in.error();
            weft_status_t st;
            int rc = weft_recv(comm, in.data(), n, partner, 5, &st);
            EXPECT_EQ(rc, WEFT_SUCCESS) << last_error();
            token = rc == WEFT_SUCCESS && in.HasPattern(n, partner, 5, (uint64_t)index) && in.sentinel_intact();
            EXPECT_TRUE(token) << "size " << n << " from rank " << partner;
            MPI_Send(&token, 1, MPI_INT, partner, 77, MPI_COMM_WORLD);
        }
        index++;
    }
}

/* Buffers at every misalignment, sender and receiver misaligned differently. */
TEST_F(P2P, UnalignedBuffers)
{
    const size_t sizes[] = {1, 31, 4097, min_eager_limit() + 1, max_eager_limit() + 1, (1u << 20) + 3};
    int index = 0;
    for (size_t n : sizes)
        for (size_t mis = 1; mis < 8; mis += 2) {
            TestBuf out(n, TestBuf::kGuarded, mis), in(n, TestBuf::kGuarded, (mis * 3) % 8);
            ASSERT_TRUE(out.ok() && in.ok()) << out.error() << in.error();
            out.fill_pattern(pattern_seed(rank, 9, (uint64_t)index));
            weft_request_t *reqs[2];
            weft_status_t st[2];
            ASSERT_EQ(weft_irecv(comm, in.data(), n, left(), 9, &reqs[0]), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_isend(comm, out.data(), n, right(), 9, &reqs[1]), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << last_error();
            expect_recv_status(st[0], n, left(), 9);
            EXPECT_TRUE(in.HasPattern(n, left(), 9, (uint64_t)index))
                << "size " << n << ", sender offset " << mis << ", receiver offset " << (mis * 3) % 8;
            EXPECT_TRUE(in.GuardsIntact());
            index++;
        }
}

/* Completion by polling weft_test: done stays 0 and the request stays valid
 * until completion; the return value and status of the completing call
 * are the request's. */
TEST_F(P2P, TestPollingLoop)
{
    const size_t sizes[] = {0, 64, max_eager_limit() + 1, (1u << 20) + 3};
    for (size_t i = 0; i < 4; i++) {
        const size_t n = sizes[i];
        TestBuf out = patterned(n, rank, 11, i), in(n);
        ASSERT_TRUE(out.ok() && in.ok()) << out.error() << in.error();
        weft_request_t *rr, *rs;
        ASSERT_EQ(weft_irecv(comm, in.data(), n, left(), 11, &rr), WEFT_SUCCESS);
        ASSERT_EQ(weft_isend(comm, out.data(), n, right(), 11, &rs), WEFT_SUCCESS);
        int rdone = 0, sdone = 0;
        weft_status_t rst;
        std::memset(&rst, 0xff, sizeof(rst));
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (!(rdone && sdone) && std::chrono::steady_clock::now() < deadline) {
            if (!rdone) {
                int rc = weft_test(rr, &rdone, &rst);
                if (rdone)
                    EXPECT_EQ(rc, WEFT_SUCCESS) << last_error();
                else
                    ASSERT_EQ(rc, WEFT_SUCCESS) << "weft_test on a pending request: " << last_error();
            }
            if (!sdone) {
                int rc = weft_test(rs, &sdone, nullptr); /* status may be NULL */
                if (sdone)
                    EXPECT_EQ(rc, WEFT_SUCCESS) << last_error();
                else
                    ASSERT_EQ(rc, WEFT_SUCCESS);
            }
        }
        ASSERT_TRUE(rdone && sdone) << "weft_test never reported completion of size " << n;
        expect_recv_status(rst, n, left(), 11);
        EXPECT_TRUE(in.HasPattern(n, left(), 11, i));
    }
}

/* weft_waitall reports each request's own status, in request order. */
TEST_F(P2P, WaitallStatusesInOrder)
{
    const int n = 6;
    std::vector<TestBuf> outs, ins(n);
    std::vector<weft_request_t *> reqs;
    for (int i = 0; i < n; i++) {
        ins[i] = TestBuf(10 * i + 1);
        ASSERT_TRUE(ins[i].ok()) << ins[i].error();
        weft_request_t *r;
        ASSERT_EQ(weft_irecv(comm, ins[i].data(), ins[i].size(), left(), 60 + i, &r), WEFT_SUCCESS);
        reqs.push_back(r);
    }
    for (int i = n - 1; i >= 0; i--) {
        outs.push_back(patterned(10 * i + 1, rank, 60 + i, 0));
        ASSERT_TRUE(outs.back().ok()) << outs.back().error();
        weft_request_t *r;
        ASSERT_EQ(weft_isend(comm, outs.back().data(), outs.back().size(), right(), 60 + i, &r), WEFT_SUCCESS);
        reqs.push_back(r);
    }
    std::vector<weft_status_t> st(reqs.size());
    ASSERT_EQ(weft_waitall(reqs.size(), reqs.data(), st.data()), WEFT_SUCCESS) << last_error();
    for (int i = 0; i < n; i++) {
        expect_recv_status(st[i], 10 * i + 1, left(), 60 + i);
        EXPECT_TRUE(ins[i].HasPattern(ins[i].size(), left(), 60 + i, 0));
    }
    EXPECT_EQ(weft_waitall(0, nullptr, nullptr), WEFT_SUCCESS);
}

/* Zero-byte messages with NULL buffers, and a zero-byte message into a real
 * buffer writes nothing. */
TEST_F(P2P, ZeroBytesNullBuffers)
{
    weft_request_t *reqs[4];
    weft_status_t st[4];
    TestBuf in(16, TestBuf::kGuarded);
    ASSERT_TRUE(in.ok()) << in.error();
    ASSERT_EQ(weft_irecv(comm, nullptr, 0, left(), 12, &reqs[0]), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(weft_irecv(comm, in.data(), 16, left(), 12, &reqs[1]), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(weft_isend(comm, nullptr, 0, right(), 12, &reqs[2]), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(weft_isend(comm, nullptr, 0, right(), 12, &reqs[3]), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(weft_waitall(4, reqs, st), WEFT_SUCCESS) << last_error();
    expect_recv_status(st[0], 0, left(), 12);
    expect_recv_status(st[1], 0, left(), 12);
    EXPECT_TRUE(in.Untouched());
    EXPECT_TRUE(in.GuardsIntact());
}

/* Argument checks that need a comm; each names the bad argument in the last
 * error, and the comm keeps working afterwards. */
TEST_F(P2P, ArgumentChecks)
{
    TestBuf buf_mem(8);
    ASSERT_TRUE(buf_mem.ok()) << buf_mem.error();
    unsigned char *const buf = buf_mem.data();
    weft_request_t *req = nullptr;
    struct BadCall { const char *what; int rc; const char *names; };
    std::vector<BadCall> calls;
    auto check = [&](const char *what, int rc, const char *names) {
        EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG) << what;
        std::string err = last_error();
        EXPECT_NE(err.find(names), std::string::npos) << what << ": last error \"" << err << "\" does not name "
                                                      << names;
        EXPECT_NE(err.find("rank " + std::to_string(rank)), std::string::npos) << what << ": " << err;
    };
    check("isend peer -1", weft_isend(comm, buf, 8, -1, 0, &req), "peer");
    check("isend peer size", weft_isend(comm, buf, 8, size, 0, &req), "peer");
    check("irecv peer -1", weft_irecv(comm, buf, 8, -1, 0, &req), "peer");
    check("irecv peer size", weft_irecv(comm, buf, 8, size, 0, &req), "peer");
    check("send peer size", weft_send(comm, buf, 8, size, 0), "peer");
    check("recv peer size", weft_recv(comm, buf, 8, size, 0, nullptr), "peer");
    check("isend tag -1", weft_isend(comm, buf, 8, right(), -1, &req), "tag");
    check("irecv tag -1", weft_irecv(comm, buf, 8, left(), -1, &req), "tag");
    check("send tag -1", weft_send(comm, buf, 8, right(), -1), "tag");
    check("recv tag -1", weft_recv(comm, buf, 8, left(), -1, nullptr), "tag");
    check("isend NULL buf", weft_isend(comm, nullptr, 8, right(), 0, &req), "buf");
    check("irecv NULL buf", weft_irecv(comm, nullptr, 8, left(), 0, &req), "buf");
    check("send NULL buf", weft_send(comm, nullptr, 8, right(), 0), "buf");
    check("recv NULL buf", weft_recv(comm, nullptr, 8, left(), 0, nullptr), "buf");
    check("isend NULL req", weft_isend(comm, buf, 8, right(), 0, nullptr), "req");
    check("irecv NULL req", weft_irecv(comm, buf, 8, left(), 0, nullptr), "req");
    EXPECT_EQ(req, nullptr) << "an output argument was set by a failing call";

    int done = 0;
    EXPECT_EQ(weft_test(nullptr, &done, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_wait(nullptr, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_waitall(1, nullptr, nullptr), WEFT_ERR_INVALID_ARG);

    /* weft_test with done == NULL is refused and leaves the request alive. */
    weft_request_t *r, *s;
    ASSERT_EQ(weft_irecv(comm, buf, 8, left(), 13, &r), WEFT_SUCCESS);
    EXPECT_EQ(weft_test(r, nullptr, nullptr), WEFT_ERR_INVALID_ARG);
    TestBuf out = patterned(8, rank, 13, 0);
    ASSERT_TRUE(out.ok()) << out.error();
    ASSERT_EQ(weft_isend(comm, out.data(), 8, right(), 13, &s), WEFT_SUCCESS) << last_error();
    EXPECT_EQ(weft_wait(s, nullptr), WEFT_SUCCESS) << last_error();
    EXPECT_EQ(weft_wait(r, nullptr), WEFT_SUCCESS) << "comm unusable after argument errors: " << last_error();
    EXPECT_TRUE(buf_mem.HasPattern(8, left(), 13, 0));
}

/* ---- more than 4 GiB in one message (ctest: p2p_huge_*, label huge) ---- */

const size_t kHugeBytes = (4ull << 30) + 17;

/* Anonymous memory, mapped directly so it is returned at once. (Asking for
 * transparent huge pages was measured slower here: with THP defrag=madvise
 * the faults stall in compaction; writing the pattern took 42 s instead of ~5.) */
class HugeBuffer {
public:
    explicit HugeBuffer(size_t bytes) : len_(bytes)
    {
        void *p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return;
        /* Transparent huge pages where the kernel offers them on request
         * (Debian: "madvise"): 2 MiB pages instead of a million 4 KiB page
         * faults per buffer, which took most of these tests' time (~0.4 GB/s
         * on the 2-core machine). The sizes under test do not change. */
        (void)madvise(p, len_, MADV_HUGEPAGE);
        p_ = static_cast<unsigned char *>(p);
    }
    ~HugeBuffer()
    {
        if (p_)
            munmap(p_, len_);
    }
    HugeBuffer(const HugeBuffer &) = delete;
    HugeBuffer &operator=(const HugeBuffer &) = delete;
    unsigned char *get() const { return p_; }
    explicit operator bool() const { return p_ != nullptr; }

private:
    size_t len_;
    unsigned char *p_ = nullptr;
};

double seconds_since(std::chrono::steady_clock::time_point t0)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

size_t mem_available_bytes()
{
    std::ifstream f("/proc/meminfo");
    std::string key;
    size_t kb = 0;
    std::string unit;
    while (f >> key >> kb >> unit)
        if (key == "MemAvailable:")
            return kb * 1024;
    return 0;
}

/* Same decision on every rank: skip (loudly) when the node cannot hold the
 * buffers; a swapless machine would otherwise kill the job. */
bool node_can_hold(size_t bytes)
{
    const bool enough = weft_mpitest::world_rank() != 0 || mem_available_bytes() > bytes + (1ull << 30);
    return !any_rank(!enough);
}

TEST_F(P2P, HugeSelf)
{
    WEFT_SKIP_IF_DEVICE_MEM("> 4 GiB messages are tested with host mmap buffers (label huge)");
    if (!node_can_hold(2 * kHugeBytes))
        GTEST_SKIP() << "not enough memory for 2 x " << kHugeBytes << " bytes";
    if (rank == 0) {
        HugeBuffer out(kHugeBytes), in(kHugeBytes + 1);
        ASSERT_TRUE(out && in);
        auto tf = std::chrono::steady_clock::now();
        fill_pattern(out.get(), kHugeBytes, pattern_seed(0, 1, 4));
        std::printf("self: pattern written in %.2f s\n", seconds_since(tf));
        in.get()[kHugeBytes] = kFreshByte;
        weft_request_t *rs, *rr;
        weft_status_t st;
        auto t0 = std::chrono::steady_clock::now();
        ASSERT_EQ(weft_isend(comm, out.get(), kHugeBytes, 0, 1, &rs), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_irecv(comm, in.get(), kHugeBytes, 0, 1, &rr), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_wait(rr, &st), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_wait(rs, nullptr), WEFT_SUCCESS) << last_error();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("self: %zu bytes in %.2f s\n", kHugeBytes, s);
        expect_recv_status(st, kHugeBytes, 0, 1);
        EXPECT_TRUE(HasPattern(in.get(), kHugeBytes, 0, 1, 4));
        EXPECT_EQ(in.get()[kHugeBytes], kFreshByte);
    }
}

/* Rank 0 -> rank 1 (one direction only, to need ~8.6 GiB on the node). */
TEST_F(P2P, HugePeer)
{
    WEFT_SKIP_IF_DEVICE_MEM("> 4 GiB messages are tested with host mmap buffers (label huge)");
    if (!node_can_hold(2 * kHugeBytes))
        GTEST_SKIP() << "not enough memory for 2 x " << kHugeBytes << " bytes";
    if (rank > 1)
        return;
    HugeBuffer buf(kHugeBytes + 1);
    ASSERT_TRUE(buf);
    weft_status_t st;
    if (rank == 0) {
        fill_pattern(buf.get(), kHugeBytes, pattern_seed(0, 2, 5));
        auto t0 = std::chrono::steady_clock::now();
        ASSERT_EQ(weft_send(comm, buf.get(), kHugeBytes, 1, 2), WEFT_SUCCESS) << last_error();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("rank 0 -> 1: %zu bytes sent in %.2f s\n", kHugeBytes, s);
    } else {
        buf.get()[kHugeBytes] = kFreshByte;
        ASSERT_EQ(weft_recv(comm, buf.get(), kHugeBytes, 0, 2, &st), WEFT_SUCCESS) << last_error();
        expect_recv_status(st, kHugeBytes, 0, 2);
        EXPECT_TRUE(HasPattern(buf.get(), kHugeBytes, 0, 2, 5));
        EXPECT_EQ(buf.get()[kHugeBytes], kFreshByte);
    }
}

} // namespace
