/*
 * The drop-in's settings, and MPI's own messages moving while weft waits.
 *
 * Each routing suite runs only in the pmpi.cmake entry that sets its
 * environment, and fails at once elsewhere (its counts depend on it):
 *   PmpiDefaults   no WEFT_MPI* variable: the built-in thresholds, and the
 *                  node-local rule (small calls to weft on one node from
 *                  3 ranks; its entries on one node, two virtual nodes and
 *                  with WEFT_NODE_COLL_KB=0); the barrier MPI's; alltoallv
 *                  weft's on one node from 3 ranks, at any size
 *   PmpiWindow     WEFT_MPI_MIN_BYTES=1024 WEFT_MPI_MAX_BYTES=65536: a window
 *   PmpiOff        WEFT_MPI=0: nothing through weft
 *   PmpiOnlyBcast  WEFT_MPI_COLLS=bcast WEFT_MPI_MIN_BYTES=0: bcast only
 * The thresholds themselves (adapters/mpi/route.c) are not repeated here:
 * 8 bytes is below and 4 MiB above any of them, so the test holds when
 * they are retuned; only which collectives have a default ceiling below
 * 4 MiB (bcast, alltoall: kCeiled) is.
 *
 * PmpiProgress (WEFT_MPI_MIN_BYTES=0) runs with the main suites and in an
 * entry of its own over Open MPI's TCP (OMPI_MCA_btl=self,tcp), which moves
 * a message only inside an MPI call: a legal `MPI_Isend; MPI_Barrier;
 * MPI_Wait` against `MPI_Recv; MPI_Barrier` completes only if the drop-in
 * keeps MPI progressing while weft waits in the barrier (the wait hook,
 * comm_cache.c). WEFT_TIMEOUT=20 there: a regression fails, not hangs.
 */
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pmpi_test.h"

using namespace pmpitest;

namespace {

const size_t kSmall = 8;        /* below every threshold */
const size_t kLarge = 4u << 20; /* above every threshold */
const size_t kNode = 256;       /* below every threshold, within the node-local rule's sizes */

/* Which of the sized collectives weft served at `bytes` (the measure each
 * threshold compares with, route.c): each called once on comm and checked
 * against PMPI. Returns the counts' change. */
Counts probe(MPI_Comm comm, size_t bytes)
{
    const int n = comm_size(comm), r = comm_rank(comm);
    const int ints = (int)(bytes / sizeof(int));
    Counts before = counts_now();
    {
        std::vector<unsigned char> send(bytes), a(bytes * n), b(bytes * n);
        fill_bytes(send.data(), bytes, 10 + r);
        MPI_Allgather(send.data(), (int)bytes, MPI_BYTE, a.data(), (int)bytes, MPI_BYTE, comm);
        PMPI_Allgather(send.data(), (int)bytes, MPI_BYTE, b.data(), (int)bytes, MPI_BYTE, comm);
        EXPECT_TRUE(SameBytes(a.data(), b.data(), a.size())) << "MPI_Allgather of " << bytes << " B";
    }
    {
        std::vector<unsigned char> a(bytes), b(bytes);
        fill_bytes(a.data(), bytes, 20 + r);
        b = a;
        MPI_Bcast(a.data(), (int)bytes, MPI_BYTE, n - 1, comm);
        PMPI_Bcast(b.data(), (int)bytes, MPI_BYTE, n - 1, comm);
        EXPECT_TRUE(SameBytes(a.data(), b.data(), a.size())) << "MPI_Bcast of " << bytes << " B";
    }
    {
        std::vector<int> send(ints), a(ints), b(ints);
        for (int i = 0; i < ints; i++)
            send[i] = (i * 3 + r) % 1000;
        MPI_Allreduce(send.data(), a.data(), ints, MPI_INT, MPI_SUM, comm);
        PMPI_Allreduce(send.data(), b.data(), ints, MPI_INT, MPI_SUM, comm);
        EXPECT_EQ(a, b) << "MPI_Allreduce of " << bytes << " B";
        std::vector<int> c(ints, -1), d(ints, -1);
        MPI_Reduce(send.data(), c.data(), ints, MPI_INT, MPI_MAX, 0, comm);
        PMPI_Reduce(send.data(), d.data(), ints, MPI_INT, MPI_MAX, 0, comm);
        EXPECT_EQ(c, d) << "MPI_Reduce of " << bytes << " B";
    }
    {
        std::vector<int> send((size_t)ints * n), a(ints), b(ints);
        for (size_t i = 0; i < send.size(); i++)
            send[i] = (int)((i * 5 + (size_t)r) % 1000);
        MPI_Reduce_scatter_block(send.data(), a.data(), ints, MPI_INT, MPI_SUM, comm);
        PMPI_Reduce_scatter_block(send.data(), b.data(), ints, MPI_INT, MPI_SUM, comm);
        EXPECT_EQ(a, b) << "MPI_Reduce_scatter_block of " << bytes << " B a block";
    }
    {
        std::vector<unsigned char> send(bytes * n), a(bytes * n), b(bytes * n);
        fill_bytes(send.data(), send.size(), 30 + r);
        MPI_Alltoall(send.data(), (int)bytes, MPI_BYTE, a.data(), (int)bytes, MPI_BYTE, comm);
        PMPI_Alltoall(send.data(), (int)bytes, MPI_BYTE, b.data(), (int)bytes, MPI_BYTE, comm);
        EXPECT_TRUE(SameBytes(a.data(), b.data(), a.size())) << "MPI_Alltoall of " << bytes << " B a peer";
    }
    {
        std::vector<unsigned char> send(bytes), a(bytes * n), b(bytes * n);
        fill_bytes(send.data(), bytes, 40 + r);
        MPI_Gather(send.data(), (int)bytes, MPI_BYTE, a.data(), (int)bytes, MPI_BYTE, n / 2, comm);
        PMPI_Gather(send.data(), (int)bytes, MPI_BYTE, b.data(), (int)bytes, MPI_BYTE, n / 2, comm);
        EXPECT_TRUE(SameBytes(a.data(), b.data(), a.size())) << "MPI_Gather of " << bytes << " B a rank";
    }
    {
        std::vector<unsigned char> send(bytes * n), a(bytes), b(bytes);
        fill_bytes(send.data(), send.size(), 50 + r);
        MPI_Scatter(send.data(), (int)bytes, MPI_BYTE, a.data(), (int)bytes, MPI_BYTE, n - 1, comm);
        PMPI_Scatter(send.data(), (int)bytes, MPI_BYTE, b.data(), (int)bytes, MPI_BYTE, n - 1, comm);
        EXPECT_TRUE(SameBytes(a.data(), b.data(), a.size())) << "MPI_Scatter of " << bytes << " B a rank";
    }
    {
        /* Rank r sends q bytes + (r + q) % 2 bytes: uneven, and no size
         * the ranks agree on (route.c routes alltoallv by rank count). */
        std::vector<int> sc(n), sd(n), rc(n), rd(n);
        int so = 0, ro = 0;
        for (int q = 0; q < n; q++) {
            sc[q] = (int)bytes + (r + q) % 2;
            sd[q] = so;
            so += sc[q];
            rc[q] = (int)bytes + (q + r) % 2;
            rd[q] = ro;
            ro += rc[q];
        }
        std::vector<unsigned char> send(so), a(ro), b(ro);
        fill_bytes(send.data(), send.size(), 60 + r);
        MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, a.data(), rc.data(), rd.data(), MPI_BYTE, comm);
        PMPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, b.data(), rc.data(), rd.data(), MPI_BYTE, comm);
        EXPECT_TRUE(SameBytes(a.data(), b.data(), a.size())) << "MPI_Alltoallv of about " << bytes << " B a peer";
    }
    return counts_now() - before;
}

/* (Alltoallv has no size to compare: by default weft's from 3 ranks on
 * one node, any set threshold decides it as the barrier's, route.c.) */
const Counted kSized[] = {W_ALLGATHER,      W_BCAST,    W_ALLREDUCE, W_REDUCE,
                          W_REDUCE_SCATTER, W_ALLTOALL, W_GATHER,    W_SCATTER, W_ALLTOALLV};

/* The collectives route.c gives a default ceiling (largest size weft
 * serves) below kLarge: Open MPI's own algorithm measured ahead there. */
bool ceiled(Counted c)
{
    return c == W_BCAST || c == W_ALLTOALL;
}

/* want(c): how many weft calls of c `probe` should have made. */
template <typename Want>
void expect_probe(const Counts &got, size_t bytes, Want want)
{
    for (Counted c : kSized)
        EXPECT_EQ(got[c], want(c)) << counted_name(c) << " at " << bytes << " B (all weft calls: " << got.str()
                                   << ")";
}

} // namespace

/* ---- the thread level ---- */

/* Below MPI_THREAD_MULTIPLE the program calls MPI, and so the drop-in and
 * weft, from one thread at a time: the drop-in makes its weft comms with
 * WEFT_THREADS=serialized (no lock; docs/mpi.md), unless the user set
 * WEFT_THREADS. At MPI_THREAD_MULTIPLE it passes no setting. Runs with the
 * main suites (MPI at MPI_THREAD_MULTIPLE) and in pmpi_serialized_* (at
 * MPI_THREAD_SINGLE, WEFT_TEST_MPI_THREAD=single: mpi_main.cc). */
class PmpiThreadLevel : public PmpiTest {};

TEST_F(PmpiThreadLevel, SerializedCommsBelowThreadMultiple)
{
    if (size < 2)
        GTEST_SKIP() << "one rank: the drop-in makes no weft comm";
    ASSERT_STREQ(std::getenv("WEFT_MPI_MIN_BYTES"), "0") << "this suite needs every size through weft";
    int provided = MPI_THREAD_MULTIPLE;
    ASSERT_EQ(PMPI_Query_thread(&provided), MPI_SUCCESS);
    MPI_Comm c;
    ASSERT_EQ(PMPI_Comm_dup(MPI_COMM_WORLD, &c), MPI_SUCCESS);
    Counts before = counts_now();
    int one = 1, sum = 0;
    EXPECT_EQ(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, c), MPI_SUCCESS);
    EXPECT_EQ(sum, size);
    EXPECT_TRUE(CountsAre(before, {{W_ALLREDUCE, 1}, {W_COMM_CREATE, 1}}));
    const char *user = std::getenv("WEFT_THREADS");
    const std::string want = user == nullptr && provided < MPI_THREAD_MULTIPLE ? "serialized" : "";
    EXPECT_EQ(last_create_threads(), want) << "MPI thread level " << provided
                                           << (user ? ", WEFT_THREADS set by the user" : "");
    EXPECT_EQ(MPI_Comm_free(&c), MPI_SUCCESS);
}

/* ---- the built-in thresholds ---- */

class PmpiDefaults : public PmpiTest {
protected:
    void SetUp() override
    {
        PmpiTest::SetUp();
        for (const char *v : {"WEFT_MPI", "WEFT_MPI_COLLS", "WEFT_MPI_MIN_BYTES", "WEFT_MPI_MAX_BYTES"})
            ASSERT_EQ(std::getenv(v), nullptr) << v << " is set; this suite checks the built-in thresholds";
    }
};

/* Whether the entry's ranks share one node with weft's node-local
 * collectives on (WEFT_NODE_COLL_KB not 0, shm among the transports, one
 * node): weft_comm_node_coll_bytes > 0 on the drop-in's comms. */
bool node_local_entry()
{
    const char *kb = std::getenv("WEFT_NODE_COLL_KB");
    const char *vn = std::getenv("WEFT_VIRTUAL_NODES");
    const char *tp = std::getenv("WEFT_TRANSPORTS");
    if ((kb && std::string(kb) == "0") || (vn && std::atoi(vn) > 1))
        return false;
    return !tp || !*tp || std::string(tp).find("shm") != std::string::npos;
}

TEST_F(PmpiDefaults, SmallCallsToMpiLargeToWeft)
{
    const bool weft = size > 1;
    /* On a comm of 3 or more ranks on one node the node-local rule
     * (route.c, node_takes) gives weft the allreduce of any size, and at
     * 256 B allgather, bcast, reduce, gather and scatter (not alltoall,
     * from 512 B a peer, or reduce_scatter_block); elsewhere (2 ranks, several nodes, the node
     * path off) the thresholds, all above 256 B. The barrier is MPI's
     * everywhere. Alltoallv: weft's at every size there, MPI's elsewhere
     * (route.c, alltoallv_takes). */
    const bool node = size >= 3 && node_local_entry();
    Counts small = probe(MPI_COMM_WORLD, kSmall);
    expect_probe(small, kSmall,
                 [&](Counted c) { return node && (c == W_ALLREDUCE || c == W_ALLTOALLV) ? 1L : 0L; });
    expect_probe(probe(MPI_COMM_WORLD, kNode), kNode, [&](Counted c) {
        return node && c != W_ALLTOALL && c != W_REDUCE_SCATTER ? 1L : 0L;
    });
    /* A 16 KiB bcast: above the bcast ceiling (MPI's by the thresholds);
     * the node-local rule takes it from 4 ranks, not at 3 (capped at 4 KiB
     * there, route.c). */
    {
        std::vector<unsigned char> a(16384), b(16384);
        fill_bytes(a.data(), a.size(), 40 + rank);
        b = a;
        const long before_bcast = counts_now()[W_BCAST];
        MPI_Bcast(a.data(), (int)a.size(), MPI_BYTE, 0, MPI_COMM_WORLD);
        PMPI_Bcast(b.data(), (int)b.size(), MPI_BYTE, 0, MPI_COMM_WORLD);
        EXPECT_TRUE(SameBytes(a.data(), b.data(), a.size())) << "MPI_Bcast of 16 KiB";
        EXPECT_EQ(counts_now()[W_BCAST] - before_bcast, node && size >= 4 ? 1L : 0L) << "a 16 KiB bcast";
    }
    /* An alltoall of 48 KiB a peer: above the thresholds' ceiling (32 KiB
     * a peer), within a rank's slot: the node-local rule takes it from 3
     * ranks (route.c, node_min), MPI's elsewhere. */
    {
        const size_t bytes = 48 << 10, n = bytes * (size_t)size;
        std::vector<unsigned char> send(n), a(n), b(n);
        fill_bytes(send.data(), n, 60 + rank);
        const long before_a2a = counts_now()[W_ALLTOALL];
        MPI_Alltoall(send.data(), (int)bytes, MPI_BYTE, a.data(), (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
        PMPI_Alltoall(send.data(), (int)bytes, MPI_BYTE, b.data(), (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
        EXPECT_TRUE(SameBytes(a.data(), b.data(), n)) << "MPI_Alltoall of 48 KiB a peer";
        EXPECT_EQ(counts_now()[W_ALLTOALL] - before_a2a, node ? 1L : 0L) << "an alltoall of 48 KiB a peer";
    }
    /* A 128 KiB bcast: above a rank's slot, within the whole big buffer
     * from 4 ranks (ranks x WEFT_NODE_COLL_KB, node_coll.c): weft's. And
     * 1 MiB + 3 B: above the whole big buffer, in pieces of it: weft's
     * too. */
    for (size_t bytes : {(size_t)128 << 10, ((size_t)1 << 20) + 3}) {
        std::vector<unsigned char> a(bytes), b(bytes);
        fill_bytes(a.data(), a.size(), 50 + rank);
        b = a;
        const long before_bcast = counts_now()[W_BCAST];
        MPI_Bcast(a.data(), (int)a.size(), MPI_BYTE, size - 1, MPI_COMM_WORLD);
        PMPI_Bcast(b.data(), (int)b.size(), MPI_BYTE, size - 1, MPI_COMM_WORLD);
        EXPECT_TRUE(SameBytes(a.data(), b.data(), a.size())) << "MPI_Bcast of " << bytes << " B";
        EXPECT_EQ(counts_now()[W_BCAST] - before_bcast, node && size >= 4 ? 1L : 0L) << "a bcast of " << bytes << " B";
    }
    const long barrier_before = counts_now()[W_BARRIER];
    EXPECT_EQ(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
    EXPECT_EQ(counts_now()[W_BARRIER] - barrier_before, 0L) << "the barrier is MPI's by default";
    /* The weft comm is made at the first served call whatever its size,
     * so that making it (collective) never depends on one rank's size
     * (colls.c, route; issue 28, item 5). Once. */
    EXPECT_EQ(small[W_COMM_CREATE], weft ? 1 : 0) << "the weft comm is made at the communicator's first call";
    /* Large: weft's but for the ceiled ones -- except a bcast on one node
     * from 4 ranks, which the node-local rule takes at any size (in pieces
     * of the big buffer, node_coll.c). */
    Counts large = probe(MPI_COMM_WORLD, kLarge);
    expect_probe(large, kLarge, [&](Counted c) {
        if (c == W_ALLTOALLV)
            return node ? 1L : 0L;
        return weft && (!ceiled(c) || (c == W_BCAST && node && size >= 4)) ? 1L : 0L;
    });
    EXPECT_EQ(large[W_COMM_CREATE], 0) << "made twice";
    /* And small again, now that the communicator has a weft comm. */
    expect_probe(probe(MPI_COMM_WORLD, kSmall), kSmall,
                 [&](Counted c) { return node && (c == W_ALLREDUCE || c == W_ALLTOALLV) ? 1L : 0L; });
}

/* Gather and scatter (route.c): the thresholds from 512 B a block; on
 * one node from 4 ranks the node-local rule from 16 B, at 3 ranks from
 * 256 B, and a scatter from 8 ranks with blocks above 32 KiB up
 * to 512 KiB left to MPI. Each call checked against PMPI; its own entry at
 * 8 ranks (pmpi.cmake). */
TEST_F(PmpiDefaults, GatherScatterRules)
{
    const bool node = size >= 3 && node_local_entry();
    struct Case {
        Counted coll;
        size_t bytes;
        bool weft;
    };
    const bool many = node && size >= 8;
    const Case cases[] = {
        {W_GATHER, 8, false},
        {W_GATHER, 16, node && size > 3},
        {W_GATHER, 128, node && size > 3},
        {W_GATHER, 256, node},
        {W_GATHER, 512, true},
        {W_SCATTER, 16, node && size > 3},
        {W_SCATTER, 128, node && size > 3},
        {W_SCATTER, 256, node},
        {W_SCATTER, 512, true},
        {W_SCATTER, (size_t)32 << 10, true},
        {W_SCATTER, ((size_t)32 << 10) + 4, !many},
        {W_SCATTER, (size_t)512 << 10, !many},
        {W_SCATTER, ((size_t)512 << 10) + 4, true},
    };
    for (const Case &c : cases) {
        const int root = (int)(c.bytes % (size_t)size);
        std::vector<unsigned char> one(c.bytes), all(c.bytes * (size_t)size), ref;
        const long before = counts_now()[c.coll];
        if (c.coll == W_GATHER) {
            fill_bytes(one.data(), one.size(), 60 + rank);
            ref = all;
            MPI_Gather(one.data(), (int)c.bytes, MPI_BYTE, all.data(), (int)c.bytes, MPI_BYTE, root, MPI_COMM_WORLD);
            PMPI_Gather(one.data(), (int)c.bytes, MPI_BYTE, ref.data(), (int)c.bytes, MPI_BYTE, root, MPI_COMM_WORLD);
            EXPECT_TRUE(SameBytes(all.data(), ref.data(), all.size())) << "MPI_Gather of " << c.bytes << " B a rank";
        } else {
            fill_bytes(all.data(), all.size(), 70 + rank);
            ref = one;
            MPI_Scatter(all.data(), (int)c.bytes, MPI_BYTE, one.data(), (int)c.bytes, MPI_BYTE, root, MPI_COMM_WORLD);
            PMPI_Scatter(all.data(), (int)c.bytes, MPI_BYTE, ref.data(), (int)c.bytes, MPI_BYTE, root, MPI_COMM_WORLD);
            EXPECT_TRUE(SameBytes(one.data(), ref.data(), one.size())) << "MPI_Scatter of " << c.bytes << " B a rank";
        }
        EXPECT_EQ(counts_now()[c.coll] - before, c.weft && size > 1 ? 1L : 0L)
            << counted_name(c.coll) << " of " << c.bytes << " B a rank, " << size << " ranks"
            << (node ? ", one node" : "");
    }
}

/* ---- WEFT_MPI_MIN_BYTES / WEFT_MPI_MAX_BYTES: weft inside [1 KiB, 64 KiB] ---- */

class PmpiWindow : public PmpiTest {
protected:
    void SetUp() override
    {
        PmpiTest::SetUp();
        ASSERT_STREQ(env_or("WEFT_MPI_MIN_BYTES", "(unset)"), "1024");
        ASSERT_STREQ(env_or("WEFT_MPI_MAX_BYTES", "(unset)"), "65536");
    }
};

TEST_F(PmpiWindow, OnlySizesInsideTheWindowThroughWeft)
{
    const long weft = size > 1 ? 1 : 0;
    /* Alltoallv's stand-in size is 1 B (route.c): below the window. */
    expect_probe(probe(MPI_COMM_WORLD, 512), 512, [](Counted) { return 0L; });
    expect_probe(probe(MPI_COMM_WORLD, 1024), 1024, [&](Counted c) { return c == W_ALLTOALLV ? 0L : weft; });
    expect_probe(probe(MPI_COMM_WORLD, 65536), 65536, [&](Counted c) { return c == W_ALLTOALLV ? 0L : weft; });
    expect_probe(probe(MPI_COMM_WORLD, 65536 + 4), 65536 + 4, [](Counted) { return 0L; });
    expect_probe(probe(MPI_COMM_WORLD, kLarge), kLarge, [](Counted) { return 0L; });
}

/* ---- WEFT_MPI=0 ---- */

class PmpiOff : public PmpiTest {
protected:
    void SetUp() override
    {
        PmpiTest::SetUp();
        ASSERT_STREQ(env_or("WEFT_MPI", "(unset)"), "0") << "this suite checks WEFT_MPI=0";
    }
};

TEST_F(PmpiOff, NothingThroughWeft)
{
    MPI_Comm d;
    PMPI_Comm_dup(MPI_COMM_WORLD, &d);
    Counts before = counts_now();
    for (MPI_Comm c : {MPI_COMM_WORLD, d}) {
        expect_probe(probe(c, kSmall), kSmall, [](Counted) { return 0L; });
        expect_probe(probe(c, kLarge), kLarge, [](Counted) { return 0L; });
        EXPECT_EQ(MPI_Barrier(c), MPI_SUCCESS);
    }
    PMPI_Comm_free(&d);
    EXPECT_TRUE(CountsAre(before, {})) << "WEFT_MPI=0 must leave everything to MPI";
}

/* ---- WEFT_MPI_COLLS=bcast ---- */

class PmpiOnlyBcast : public PmpiTest {
protected:
    void SetUp() override
    {
        PmpiTest::SetUp();
        ASSERT_STREQ(env_or("WEFT_MPI_COLLS", "(unset)"), "bcast");
        ASSERT_STREQ(env_or("WEFT_MPI_MIN_BYTES", "(unset)"), "0");
    }
};

TEST_F(PmpiOnlyBcast, OnlyBcastThroughWeft)
{
    const long weft = size > 1 ? 1 : 0;
    Counts before = counts_now();
    for (size_t bytes : {kSmall, kLarge})
        expect_probe(probe(MPI_COMM_WORLD, bytes), bytes, [&](Counted c) { return c == W_BCAST ? weft : 0L; });
    EXPECT_EQ(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
    EXPECT_TRUE(CountsAre(before, {{W_BCAST, 2 * weft}, {W_COMM_CREATE, weft}}));
}

/* ---- MPI progress while weft waits ---- */

class PmpiProgress : public PmpiTest {
protected:
    void SetUp() override
    {
        PmpiTest::SetUp();
        ASSERT_STREQ(env_or("WEFT_MPI_MIN_BYTES", "(unset)"), "0");
        ASSERT_STREQ(env_or("WEFT_MPI", "1"), "1");
        ASSERT_STREQ(env_or("WEFT_MPI_COLLS", "all"), "all");
    }
};

/* Even rank r: MPI_Isend of 4 MiB (past MPI's eager limit: rendezvous) to
 * r + 1, then a collective weft serves, then MPI_Wait. Odd rank r: MPI_Recv
 * from r - 1, then the collective. The receiver sits in MPI_Recv until the
 * sender's MPI moves the data, while the sender sits in weft's collective
 * until the receiver arrives. The collectives: MPI_Barrier, and an
 * MPI_Bcast of 1 MiB. The world's handler returns errors for the test, so
 * a timeout fails it here (with weft's text) instead of aborting. */
TEST_F(PmpiProgress, IsendCollectiveWaitAgainstRecvCollective)
{
    if (size < 2)
        GTEST_SKIP() << "needs a sender and a receiver";
    if (rank == 0)
        std::printf("OMPI_MCA_btl=%s OMPI_MCA_pml=%s WEFT_TIMEOUT=%s\n", env_or("OMPI_MCA_btl", "(unset)"),
                    env_or("OMPI_MCA_pml", "(unset)"), env_or("WEFT_TIMEOUT", "(unset)"));
    PMPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Barrier(MPI_COMM_WORLD); /* the world's weft comm exists */
    const size_t bytes = 4u << 20;
    const bool sender = rank % 2 == 0 && rank + 1 < size, receiver = rank % 2 == 1;
    for (int round = 0; round < 2; round++) {
        SCOPED_TRACE(round == 0 ? "MPI_Barrier" : "MPI_Bcast of 1 MiB");
        std::vector<unsigned char> msg(bytes);
        std::vector<unsigned char> coll(1u << 20, (unsigned char)round);
        if (sender)
            fill_bytes(msg.data(), bytes, 1000 + rank + round);
        MPI_Request req = MPI_REQUEST_NULL;
        if (sender) {
            EXPECT_EQ(MPI_Isend(msg.data(), (int)bytes, MPI_BYTE, rank + 1, 5 + round, MPI_COMM_WORLD, &req),
                      MPI_SUCCESS);
        }
        if (receiver) {
            EXPECT_EQ(MPI_Recv(msg.data(), (int)bytes, MPI_BYTE, rank - 1, 5 + round, MPI_COMM_WORLD,
                               MPI_STATUS_IGNORE),
                      MPI_SUCCESS);
        }
        Counts before = counts_now();
        const double t0 = PMPI_Wtime();
        if (rank == 0)
            coll[0] = 0x77;
        const int rc = round == 0 ? MPI_Barrier(MPI_COMM_WORLD)
                                  : MPI_Bcast(coll.data(), (int)coll.size(), MPI_BYTE, 0, MPI_COMM_WORLD);
        const double waited = PMPI_Wtime() - t0;
        char text[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        if (rc != MPI_SUCCESS)
            PMPI_Error_string(rc, text, &len);
        EXPECT_EQ(rc, MPI_SUCCESS) << "after " << waited << " s: " << text;
        EXPECT_TRUE(CountsAre(before, {{round == 0 ? W_BARRIER : W_BCAST, 1}}));
        if (sender) {
            EXPECT_EQ(MPI_Wait(&req, MPI_STATUS_IGNORE), MPI_SUCCESS);
        }
        if (receiver) {
            std::vector<unsigned char> want(bytes);
            fill_bytes(want.data(), bytes, 1000 + (rank - 1) + round);
            EXPECT_TRUE(SameBytes(msg.data(), want.data(), bytes)) << "the message MPI moved";
        }
        if (round == 1) {
            EXPECT_EQ(coll[0], 0x77) << "the bcast's data";
        }
    }
    PMPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}
