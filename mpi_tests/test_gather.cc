/*
 * weft_gather, weft_scatter and weft_alltoallv (collectives/gather.c,
 * collectives/alltoall.c) over whatever transports the ctest entry selects
 * (mpi_tests/gather.cmake): every root, in place and out of place, block
 * sizes from 0 B to past the eager limit; alltoallv with uneven sizes
 * (zero-byte entries included), gaps and a reversed layout; the
 * non-blocking forms outstanding together; argument checks; ranks that
 * disagree on an alltoallv block size. Each block carries a pattern of
 * (sender, receiver, call), so a block from the wrong rank, left over from
 * an earlier call or shifted by a byte shows, and guard bytes catch writes
 * outside the buffers. Every buffer weft touches is a TestBuf
 * (weft_test_mem.h): host memory, or device memory under
 * WEFT_TEST_MEM=device (weft_mpi_gather_dev).
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"
#include "weft_test_mem.h"

using namespace weft_mpitest;

namespace {

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;

/* Zero, one, odd, a page + 1, and past the eager limits (rendezvous).
 * Shorter under WEFT_TEST_SIZES=reduced (device entries) and at 5+ ranks. */
std::vector<size_t> block_sizes(int size)
{
    if (size <= 4 && !reduced_sizes())
        return {0, 1, 7, 4097, 300 * KiB + 3};
    return {0, 1, 4097, 300 * KiB + 3};
}

uint64_t seed_of(int src, int dst, uint64_t call)
{
    return pattern_seed(src, dst, 0x6a7e0000ull + call);
}

class Rooted : public WeftMpiTest {
protected:
    uint64_t calls = 0;

    /* One gather to root of `bytes` per rank; in_place: the root's block is
     * already at its place in recvbuf. Non-root ranks pass recvbuf NULL. */
    void gather_and_check(size_t bytes, int root, bool in_place, bool nonblocking)
    {
        const uint64_t call = calls++;
        const size_t total = bytes * (size_t)size;
        const std::string what = "gather of " + std::to_string(bytes) + " B to root " + std::to_string(root) +
                                 (in_place ? ", in place" : "") + (nonblocking ? ", weft_igather" : "");
        const bool is_root = rank == root;
        TestBuf recv(is_root ? total : 0, TestBuf::kGuarded, call % 3);
        TestBuf send(bytes + 1, TestBuf::kGuarded);
        ASSERT_TRUE(recv.ok() && send.ok()) << recv.error() << send.error();
        const void *sendbuf;
        if (is_root && in_place) {
            recv.fill_pattern_at((size_t)rank * bytes, bytes, seed_of(rank, root, call));
            sendbuf = recv.data() + (size_t)rank * bytes;
        } else {
            send.fill_pattern_at(1, bytes, seed_of(rank, root, call));
            sendbuf = send.data() + 1;
        }
        void *recvbuf = is_root ? recv.data() : nullptr;
        int rc;
        if (nonblocking) {
            weft_request_t *r = nullptr;
            rc = weft_igather(comm, sendbuf, recvbuf, bytes, root, &r);
            if (rc == WEFT_SUCCESS)
                rc = weft_wait(r, nullptr);
        } else {
            rc = weft_gather(comm, sendbuf, recvbuf, bytes, root);
        }
        ASSERT_EQ(rc, WEFT_SUCCESS) << what << ": " << weft_strerror(rc) << ": " << last_error();
        if (is_root) {
            for (int s = 0; s < size; s++)
                ASSERT_EQ(recv.pattern_mismatch_at((size_t)s * bytes, bytes, seed_of(s, root, call)), SIZE_MAX)
                    << what << ": block of rank " << s << " " << recv.error();
            ASSERT_TRUE(recv.GuardsIntact()) << what;
        }
        ASSERT_TRUE(send.GuardsIntact()) << what;
    }

    /* One scatter from root; in_place: the root's block stays in sendbuf
     * (recvbuf == sendbuf + root*bytes). Non-root ranks pass sendbuf NULL. */
    void scatter_and_check(size_t bytes, int root, bool in_place, bool nonblocking)
    {
        const uint64_t call = calls++;
        const size_t total = bytes * (size_t)size;
        const std::string what = "scatter of " + std::to_string(bytes) + " B from root " + std::to_string(root) +
                                 (in_place ? ", in place" : "") + (nonblocking ? ", weft_iscatter" : "");
        const bool is_root = rank == root;
        TestBuf send(is_root ? total : 0, TestBuf::kGuarded, call % 3);
        TestBuf recv(bytes, TestBuf::kGuarded, 1);
        ASSERT_TRUE(recv.ok() && send.ok()) << recv.error() << send.error();
        if (is_root)
            for (int d = 0; d < size; d++)
                send.fill_pattern_at((size_t)d * bytes, bytes, seed_of(root, d, call));
        void *recvbuf = is_root && in_place ? send.data() + (size_t)rank * bytes : recv.data();
        const void *sendbuf = is_root ? send.data() : nullptr;
        int rc;
        if (nonblocking) {
            weft_request_t *r = nullptr;
            rc = weft_iscatter(comm, sendbuf, recvbuf, bytes, root, &r);
            if (rc == WEFT_SUCCESS)
                rc = weft_wait(r, nullptr);
        } else {
            rc = weft_scatter(comm, sendbuf, recvbuf, bytes, root);
        }
        ASSERT_EQ(rc, WEFT_SUCCESS) << what << ": " << weft_strerror(rc) << ": " << last_error();
        if (is_root && in_place) {
            ASSERT_TRUE(recv.Untouched()) << what;
        } else {
            ASSERT_EQ(recv.pattern_mismatch_at(0, bytes, seed_of(root, rank, call)), SIZE_MAX)
                << what << " " << recv.error();
        }
        if (is_root) {
            /* sendbuf is only read (in place: the own block is where it was). */
            for (int d = 0; d < size; d++)
                ASSERT_EQ(send.pattern_mismatch_at((size_t)d * bytes, bytes, seed_of(root, d, call)), SIZE_MAX)
                    << what << ": sendbuf block " << d << " changed";
            ASSERT_TRUE(send.GuardsIntact()) << what;
        }
        ASSERT_TRUE(recv.GuardsIntact()) << what;
    }
};

TEST_F(Rooted, GatherEveryRootEverySize)
{
    for (size_t bytes : block_sizes(size))
        for (int root = 0; root < size; root++)
            for (bool in_place : {false, true}) {
                gather_and_check(bytes, root, in_place, false);
                if (HasFailure())
                    return;
            }
}

TEST_F(Rooted, ScatterEveryRootEverySize)
{
    for (size_t bytes : block_sizes(size))
        for (int root = 0; root < size; root++)
            for (bool in_place : {false, true}) {
                scatter_and_check(bytes, root, in_place, false);
                if (HasFailure())
                    return;
            }
}

TEST_F(Rooted, NonBlockingFormsEveryRoot)
{
    for (int root = 0; root < size; root++) {
        gather_and_check(4097, root, root % 2 == 1, true);
        scatter_and_check(4097, root, root % 2 == 0, true);
        if (HasFailure())
            return;
    }
}

TEST_F(Rooted, ArgumentChecks)
{
    TestBuf all(16 * (size_t)size), one(16);
    ASSERT_TRUE(all.ok() && one.ok()) << all.error() << one.error();
    const std::string me = "rank " + std::to_string(rank);
    EXPECT_EQ(weft_gather(nullptr, one.data(), all.data(), 16, 0), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(weft_last_error()).find("weft_gather: comm is NULL"), std::string::npos)
        << weft_last_error();
    EXPECT_EQ(weft_scatter(comm, all.data(), one.data(), 16, size), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("weft_scatter: root " + std::to_string(size) + " out of range"), std::string::npos)
        << last_error();
    EXPECT_NE(last_error().find(me), std::string::npos) << last_error();
    EXPECT_EQ(weft_igather(comm, one.data(), all.data(), 16, -1, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("weft_igather"), std::string::npos) << last_error();
    weft_request_t *r = nullptr;
    EXPECT_EQ(weft_igather(comm, one.data(), all.data(), 16, -1, &r), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("root -1 out of range"), std::string::npos) << last_error();
    /* Every rank's own block. */
    EXPECT_EQ(weft_gather(comm, nullptr, all.data(), 16, 0), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("weft_gather: sendbuf is NULL"), std::string::npos) << last_error();
    EXPECT_EQ(weft_scatter(comm, all.data(), nullptr, 16, 0), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("weft_scatter: recvbuf is NULL"), std::string::npos) << last_error();
    /* The root's n blocks: refused at the root only (elsewhere unused).
     * The other ranks make the same call validly: a refused call is still
     * a call (it takes its number among the comm's collectives and the
     * others are told), so theirs fails naming rank 0 -- or, for a gather,
     * where a non-root only sends, may end before the word comes. */
    const auto others_see_refusal = [&](int rc, bool may_succeed, const char *what) {
        if (rc == WEFT_SUCCESS && may_succeed)
            return;
        EXPECT_EQ(rc, WEFT_ERR_MISMATCH) << what << ": " << last_error();
        EXPECT_NE(last_error().find("rank 0 refused its"), std::string::npos) << what << ": " << last_error();
    };
    if (rank == 0) {
        EXPECT_EQ(weft_gather(comm, one.data(), nullptr, 16, 0), WEFT_ERR_INVALID_ARG);
        EXPECT_NE(last_error().find("recvbuf is NULL with bytes_per_rank 16 at the root"), std::string::npos)
            << last_error();
    } else {
        others_see_refusal(weft_gather(comm, one.data(), nullptr, 16, 0), true, "gather, root refused");
    }
    if (rank == 0) {
        EXPECT_EQ(weft_scatter_on_stream(comm, nullptr, one.data(), 16, 0, nullptr), WEFT_ERR_INVALID_ARG);
        EXPECT_NE(last_error().find("weft_scatter_on_stream: sendbuf is NULL"), std::string::npos) << last_error();
        /* Overlapping other than in place. */
        EXPECT_EQ(weft_gather(comm, all.data() + 1, all.data(), 8, 0), WEFT_ERR_INVALID_ARG);
        EXPECT_NE(last_error().find("overlaps"), std::string::npos) << last_error();
    } else {
        others_see_refusal(weft_gather(comm, one.data(), nullptr, 8, 0), true, "gather, root's buffers overlap");
    }
    if (rank == 0) {
        EXPECT_EQ(weft_iscatter(comm, all.data(), all.data() + 3, 8, 0, &r), WEFT_ERR_INVALID_ARG);
        EXPECT_NE(last_error().find("weft_iscatter: recvbuf overlaps sendbuf"), std::string::npos) << last_error();
    } else {
        weft_request_t *q = nullptr;
        ASSERT_EQ(weft_iscatter(comm, nullptr, one.data(), 8, 0, &q), WEFT_SUCCESS) << last_error();
        others_see_refusal(weft_wait(q, nullptr), false, "scatter, root's buffers overlap");
    }
    /* Overflow. */
    if (size > 1) {
        EXPECT_EQ(weft_gather(comm, one.data(), all.data(), SIZE_MAX / 2 + 1, 0), WEFT_ERR_INVALID_ARG);
        EXPECT_NE(last_error().find("overflows"), std::string::npos) << last_error();
    }
    /* Zero bytes: NULL buffers are fine, on every rank. */
    EXPECT_EQ(weft_gather(comm, nullptr, nullptr, 0, size - 1), WEFT_SUCCESS) << last_error();
    EXPECT_EQ(weft_scatter(comm, nullptr, nullptr, 0, 0), WEFT_SUCCESS) << last_error();
    /* After refused calls the next collective works on every rank. */
    EXPECT_EQ(weft_barrier(comm), WEFT_SUCCESS) << last_error();
}

/* ---- alltoallv ---- */

/* Bytes rank s sends rank d in layout `shape`: uneven, some zero (the
 * pair's sum mod 3 == 0 gives 0, so every rank has empty and full blocks
 * at 3+ ranks), some past the eager limits. */
size_t v_bytes(int s, int d, int shape)
{
    static const size_t sizes[] = {0, 1, 13, 4097, 70 * KiB + 5, 300 * KiB + 1};
    if ((s + d + shape) % 3 == 0)
        return 0;
    size_t k = (size_t)(s * 7 + d * 3 + shape) % (reduced_sizes() ? 4 : 6);
    return sizes[k];
}

class Alltoallv : public WeftMpiTest {
protected:
    uint64_t calls = 0;

    /* The layout of one call: sizes per peer, displacements with a gap of
     * `gap` bytes before every block, blocks in reverse rank order when
     * `reversed`. */
    struct Layout {
        std::vector<size_t> sb, sd, rb, rd;
        size_t send_total = 0, recv_total = 0;
    };
    Layout layout(int shape, size_t gap, bool reversed) const
    {
        Layout l;
        l.sb.resize(size);
        l.sd.resize(size);
        l.rb.resize(size);
        l.rd.resize(size);
        for (int i = 0; i < size; i++) {
            int j = reversed ? size - 1 - i : i;
            l.sb[j] = v_bytes(rank, j, shape);
            l.rb[j] = v_bytes(j, rank, shape);
            l.send_total += gap;
            l.sd[j] = l.send_total;
            l.send_total += l.sb[j];
            l.recv_total += gap;
            l.rd[j] = l.recv_total;
            l.recv_total += l.rb[j];
        }
        return l;
    }

    /* Starts (nonblocking: *req) or runs one alltoallv of layout l into a
     * fresh recv, from a fresh send filled for call. */
    int run(const Layout &l, TestBuf &send, TestBuf &recv, uint64_t call, weft_request_t **req)
    {
        send = TestBuf(l.send_total, TestBuf::kGuarded, call % 3);
        recv = TestBuf(l.recv_total, TestBuf::kGuarded, (call + 1) % 3);
        if (!send.ok() || !recv.ok()) {
            ADD_FAILURE() << send.error() << recv.error();
            return WEFT_ERR_NO_MEMORY;
        }
        for (int d = 0; d < size; d++)
            send.fill_pattern_at(l.sd[d], l.sb[d], seed_of(rank, d, call));
        /* Empty totals: NULL buffers, as a caller with nothing to move may pass. */
        const void *sendbuf = l.send_total ? send.data() : nullptr;
        void *recvbuf = l.recv_total ? recv.data() : nullptr;
        if (req)
            return weft_ialltoallv(comm, sendbuf, l.sb.data(), l.sd.data(), recvbuf, l.rb.data(), l.rd.data(), req);
        return weft_alltoallv(comm, sendbuf, l.sb.data(), l.sd.data(), recvbuf, l.rb.data(), l.rd.data());
    }

    ::testing::AssertionResult received(const Layout &l, const TestBuf &recv, size_t gap, uint64_t call) const
    {
        for (int s = 0; s < size; s++) {
            size_t bad = recv.pattern_mismatch_at(l.rd[s], l.rb[s], seed_of(s, rank, call));
            if (!recv.error().empty())
                return ::testing::AssertionFailure() << "reading recvbuf back: " << recv.error();
            if (bad != SIZE_MAX)
                return ::testing::AssertionFailure()
                       << "block from rank " << s << " (" << l.rb[s] << " B) wrong from offset " << bad;
            /* The gap before it was not written. */
            if (gap && recv.first_not(l.rd[s] - gap, gap, kFreshByte) != SIZE_MAX)
                return ::testing::AssertionFailure() << "the gap before the block of rank " << s << " was written";
        }
        if (!recv.GuardsIntact())
            return ::testing::AssertionFailure() << "recvbuf guards";
        return ::testing::AssertionSuccess();
    }
};

TEST_F(Alltoallv, UnevenSizesAndLayouts)
{
    for (int shape = 0; shape < 3; shape++)
        for (size_t gap : {(size_t)0, (size_t)5})
            for (bool reversed : {false, true}) {
                const uint64_t call = calls++;
                const std::string what = "shape " + std::to_string(shape) + ", gap " + std::to_string(gap) +
                                         (reversed ? ", reversed" : "");
                Layout l = layout(shape, gap, reversed);
                TestBuf send, recv;
                int rc = run(l, send, recv, call, nullptr);
                ASSERT_EQ(rc, WEFT_SUCCESS) << what << ": " << weft_strerror(rc) << ": " << last_error();
                ASSERT_TRUE(received(l, recv, gap, call)) << what;
                ASSERT_TRUE(send.GuardsIntact()) << what;
                for (int d = 0; d < size; d++)
                    ASSERT_EQ(send.pattern_mismatch_at(l.sd[d], l.sb[d], seed_of(rank, d, call)), SIZE_MAX)
                        << what << ": sendbuf block for rank " << d << " changed";
            }
}

/* Some ranks move nothing at all (every size 0, NULL buffers) while the
 * others exchange; then everything is 0 everywhere. */
TEST_F(Alltoallv, EmptyRanksAndEmptyCalls)
{
    std::vector<size_t> sb(size), sd(size, 0), rb(size), rd(size, 0);
    /* Odd ranks send and receive nothing; even ranks 8 B to each even rank. */
    size_t off = 0, roff = 0;
    for (int j = 0; j < size; j++) {
        sb[j] = rank % 2 == 0 && j % 2 == 0 ? 8 : 0;
        rb[j] = sb[j];
        sd[j] = off;
        rd[j] = roff;
        off += sb[j];
        roff += rb[j];
    }
    TestBuf send(off), recv(roff);
    ASSERT_TRUE(send.ok() && recv.ok());
    for (int j = 0; j < size; j++)
        send.fill_pattern_at(sd[j], sb[j], seed_of(rank, j, 900));
    int rc = weft_alltoallv(comm, off ? send.data() : nullptr, sb.data(), sd.data(), roff ? recv.data() : nullptr,
                            rb.data(), rd.data());
    ASSERT_EQ(rc, WEFT_SUCCESS) << last_error();
    for (int s = 0; s < size; s++)
        ASSERT_EQ(recv.pattern_mismatch_at(rd[s], rb[s], seed_of(s, rank, 900)), SIZE_MAX) << "from rank " << s;
    std::vector<size_t> zero(size, 0);
    ASSERT_EQ(weft_alltoallv(comm, nullptr, zero.data(), zero.data(), nullptr, zero.data(), zero.data()),
              WEFT_SUCCESS)
        << last_error();
}

/* Non-blocking: several alltoallvs, gathers and scatters outstanding on one
 * comm, the arrays overwritten as soon as each call returned (they are read
 * at the call only), completed together. */
TEST_F(Alltoallv, NonBlockingOutstandingWithGatherScatter)
{
    const int kCalls = 3;
    std::vector<Layout> layouts;
    std::vector<std::unique_ptr<TestBuf>> send, recv;
    std::vector<weft_request_t *> reqs;
    for (int i = 0; i < kCalls; i++) {
        layouts.push_back(layout(i, i == 1 ? 3 : 0, i == 2));
        Layout scribbled = layouts.back();
        send.emplace_back(new TestBuf);
        recv.emplace_back(new TestBuf);
        weft_request_t *r = nullptr;
        int rc = run(scribbled, *send.back(), *recv.back(), 3000 + i, &r);
        ASSERT_EQ(rc, WEFT_SUCCESS) << "ialltoallv " << i << ": " << last_error();
        reqs.push_back(r);
        for (auto *v : {&scribbled.sb, &scribbled.sd, &scribbled.rb, &scribbled.rd})
            std::fill(v->begin(), v->end(), (size_t)0xdeadbeef);
    }
    /* A gather and a scatter in between, both non-blocking. */
    const size_t gb = 100;
    TestBuf gsend(gb), grecv(gb * (size_t)size), ssend(gb * (size_t)size), srecv(gb);
    ASSERT_TRUE(gsend.ok() && grecv.ok() && ssend.ok() && srecv.ok());
    gsend.fill_pattern_at(0, gb, seed_of(rank, 0, 4000));
    for (int d = 0; d < size; d++)
        ssend.fill_pattern_at((size_t)d * gb, gb, seed_of(size - 1, d, 4001));
    weft_request_t *g = nullptr, *s = nullptr;
    ASSERT_EQ(weft_igather(comm, gsend.data(), rank == 0 ? grecv.data() : nullptr, gb, 0, &g), WEFT_SUCCESS)
        << last_error();
    ASSERT_EQ(weft_iscatter(comm, rank == size - 1 ? ssend.data() : nullptr, srecv.data(), gb, size - 1, &s),
              WEFT_SUCCESS)
        << last_error();
    reqs.push_back(g);
    reqs.push_back(s);
    ASSERT_EQ(weft_waitall(reqs.size(), reqs.data(), nullptr), WEFT_SUCCESS) << last_error();
    for (int i = 0; i < kCalls; i++)
        ASSERT_TRUE(received(layouts[i], *recv[i], i == 1 ? 3 : 0, 3000 + i)) << "ialltoallv " << i;
    if (rank == 0) {
        for (int r = 0; r < size; r++)
            ASSERT_EQ(grecv.pattern_mismatch_at((size_t)r * gb, gb, seed_of(r, 0, 4000)), SIZE_MAX) << "igather " << r;
    }
    ASSERT_EQ(srecv.pattern_mismatch_at(0, gb, seed_of(size - 1, rank, 4001)), SIZE_MAX) << "iscatter";
}

/* Through the node's segment each rank's blocks are packed in its slot
 * while they fit; no rank knows the others' sizes, so the round itself
 * tells. One rank whose blocks do not fit (here the last rank's 2 MiB + 5 B
 * for rank 0, above even the large slot) has them pulled from its send
 * buffer by the others (CMA) while theirs stay packed -- or, where pulls
 * cannot be made (device buffers in the _dev entries, WEFT_SHM_CMA=0),
 * sends every rank of the call to messages. Alternating such calls with
 * small ones (which fit) checks that the segment's flags and the
 * collective numbers stay in step across the switch, twice in a row too;
 * every block is checked. test_node_coll.cc (AlltoallsPulledAboveTheSlot)
 * checks which of the two happened. */
TEST_F(Alltoallv, BlocksThatDoNotFitTheSlot)
{
    if (size < 2)
        GTEST_SKIP() << "one rank: a local copy";
    const size_t big = 2 * MiB + 5;
    const bool reduced = reduced_sizes();
    for (int round = 0; round < 5; round++) {
        const bool spill = !reduced && (round == 1 || round == 2 || round == 4);
        Layout l;
        l.sb.resize(size);
        l.sd.resize(size);
        l.rb.resize(size);
        l.rd.resize(size);
        for (int j = 0; j < size; j++) {
            l.sb[j] = spill && rank == size - 1 && j == 0 ? big : (size_t)(8 * (rank + j) + round);
            l.rb[j] = spill && j == size - 1 && rank == 0 ? big : (size_t)(8 * (j + rank) + round);
            l.sd[j] = l.send_total;
            l.send_total += l.sb[j];
            l.rd[j] = l.recv_total;
            l.recv_total += l.rb[j];
        }
        const uint64_t call = 5000 + (uint64_t)round;
        TestBuf send, recv;
        int rc = run(l, send, recv, call, nullptr);
        ASSERT_EQ(rc, WEFT_SUCCESS) << "round " << round << (spill ? " (spills)" : "") << ": " << last_error();
        ASSERT_TRUE(received(l, recv, 0, call)) << "round " << round << (spill ? " (spills)" : "");
    }
    EXPECT_EQ(weft_barrier(comm), WEFT_SUCCESS) << last_error();
}

TEST_F(Alltoallv, ArgumentChecks)
{
    const size_t n = (size_t)size;
    std::vector<size_t> sb(n, 4), sd(n), rb(n, 4), rd(n);
    for (size_t j = 0; j < n; j++)
        sd[j] = rd[j] = 4 * j;
    TestBuf send(4 * n), recv(4 * n);
    ASSERT_TRUE(send.ok() && recv.ok());
    unsigned char *S = send.data(), *R = recv.data();
    const std::string me = "rank " + std::to_string(rank);
    auto refused = [&](int rc, const std::string &words) {
        EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG) << words;
        EXPECT_NE(last_error().find(words), std::string::npos) << last_error();
        EXPECT_NE(last_error().find(me), std::string::npos) << last_error();
    };
    EXPECT_EQ(weft_alltoallv(nullptr, S, sb.data(), sd.data(), R, rb.data(), rd.data()), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(weft_last_error()).find("weft_alltoallv: comm is NULL"), std::string::npos);
    refused(weft_alltoallv(comm, S, nullptr, sd.data(), R, rb.data(), rd.data()), "weft_alltoallv: send_bytes is NULL");
    refused(weft_alltoallv(comm, S, sb.data(), nullptr, R, rb.data(), rd.data()), "send_displs is NULL");
    refused(weft_alltoallv(comm, S, sb.data(), sd.data(), R, nullptr, rd.data()), "recv_bytes is NULL");
    weft_request_t *req = nullptr;
    refused(weft_ialltoallv(comm, S, sb.data(), sd.data(), R, rb.data(), nullptr, &req),
            "weft_ialltoallv: recv_displs is NULL");
    refused(weft_ialltoallv(comm, S, sb.data(), sd.data(), R, rb.data(), rd.data(), nullptr),
            "weft_ialltoallv: request pointer (req) is NULL");
    refused(weft_alltoallv(comm, nullptr, sb.data(), sd.data(), R, rb.data(), rd.data()),
            "sendbuf is NULL but send_bytes[0] is 4");
    refused(weft_alltoallv_on_stream(comm, S, sb.data(), sd.data(), nullptr, rb.data(), rd.data(), nullptr),
            "weft_alltoallv_on_stream: recvbuf is NULL but recv_bytes[0] is 4");
    /* Displacement + size overflows. */
    std::vector<size_t> big = sd;
    big[n - 1] = SIZE_MAX - 1;
    refused(weft_alltoallv(comm, S, sb.data(), big.data(), R, rb.data(), rd.data()),
            "send_displs[" + std::to_string(n - 1) + "] + send_bytes[" + std::to_string(n - 1) + "]");
    EXPECT_NE(last_error().find("overflows size_t"), std::string::npos) << last_error();
    /* The own block's two sizes differ. */
    std::vector<size_t> rb2 = rb;
    rb2[rank] = 3;
    refused(weft_alltoallv(comm, S, sb.data(), sd.data(), R, rb2.data(), rd.data()),
            "send_bytes[" + std::to_string(rank) + "] is 4 but recv_bytes[" + std::to_string(rank) + "] is 3");
    /* No in-place form. */
    refused(weft_alltoallv(comm, S, sb.data(), sd.data(), S, rb.data(), rd.data()), "no in-place form");
    /* Empty blocks at overlapping places are fine (nothing moves there):
     * all zero, one buffer for both. */
    std::vector<size_t> zero(n, 0);
    EXPECT_EQ(weft_alltoallv(comm, S, zero.data(), sd.data(), S, zero.data(), rd.data()), WEFT_SUCCESS)
        << last_error();
    EXPECT_EQ(weft_barrier(comm), WEFT_SUCCESS) << last_error();
}

/* Ranks 0 and 1 disagree on the size of rank 0's block for rank 1. As
 * messages: fewer bytes than rank 1 expects fail there with
 * WEFT_ERR_MISMATCH, more with WEFT_ERR_TRUNCATE. Through the node's
 * segment (a comm on one node with shm: every alltoallv whose blocks fit
 * the slots, these do), rank 1 reads rank 0's table: WEFT_ERR_MISMATCH
 * either way, naming both ranks. Either way rank 1's error names the
 * sizes. On a comm of its own (the failed call's state stays with it). */
TEST_F(Alltoallv, RanksDisagreeOnABlockSize)
{
    if (size < 2)
        GTEST_SKIP() << "needs 2 ranks";
    for (size_t sent : {(size_t)8, (size_t)24}) {
        weft_comm_t *c2 = nullptr;
        ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &c2), WEFT_SUCCESS);
        const size_t n = (size_t)size;
        std::vector<size_t> sb(n, 16), sd(n), rb(n, 16), rd(n);
        for (size_t j = 0; j < n; j++)
            sd[j] = rd[j] = 32 * j;
        if (rank == 0)
            sb[1] = sent;
        TestBuf send(32 * n), recv(32 * n);
        ASSERT_TRUE(send.ok() && recv.ok());
        size_t node_bytes = 0;
        ASSERT_EQ(weft_comm_node_coll_bytes(c2, &node_bytes), WEFT_SUCCESS);
        int rc = weft_alltoallv(c2, send.data(), sb.data(), sd.data(), recv.data(), rb.data(), rd.data());
        std::string err = weft_comm_last_error(c2);
        if (rank == 1 && node_bytes > 0) {
            EXPECT_EQ(rc, WEFT_ERR_MISMATCH) << err;
            EXPECT_NE(err.find("alltoallv (node-local, collective #"), std::string::npos) << err;
            EXPECT_NE(err.find("rank 0 sends " + std::to_string(sent) + " bytes to rank 1, which expects 16 from it"),
                      std::string::npos)
                << err;
        } else if (rank == 1) {
            if (sent < 16) {
                EXPECT_EQ(rc, WEFT_ERR_MISMATCH) << err;
                EXPECT_NE(err.find("a message of 8 B where this rank expects 16 B"), std::string::npos) << err;
            } else {
                EXPECT_EQ(rc, WEFT_ERR_TRUNCATE) << err;
                EXPECT_NE(err.find("message of 24 bytes does not fit the 16-byte buffer"), std::string::npos) << err;
            }
            EXPECT_NE(err.find("alltoallv pairwise step"), std::string::npos) << err;
            EXPECT_NE(err.find("peer 0"), std::string::npos) << err;
        } else {
            /* The others' part may complete before they hear of it. */
            EXPECT_TRUE(rc == WEFT_SUCCESS || rc == WEFT_ERR_MISMATCH) << weft_strerror(rc) << ": " << err;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        /* The comm still works. */
        EXPECT_EQ(weft_barrier(c2), WEFT_SUCCESS) << weft_comm_last_error(c2);
        EXPECT_EQ(weft_comm_destroy(c2), WEFT_SUCCESS);
    }
}

} // namespace
