/*
 * Node-local collectives in shared memory (collectives/node_coll.c): the
 * blocking collectives of a comm whose ranks share one node, at sizes
 * within WEFT_NODE_COLL_KB a rank, run as flags and copies in one segment.
 * The kinds' results at every dtype, op and size are the business of the
 * collectives' own suites (coll, reductions, gather, a2a), which go this way
 * on their shm entries; this file checks what is the path's own:
 *
 *   Chosen             on one node with shm it is taken (the shape's info
 *                      line says so), across two virtual nodes in its
 *                      hierarchical form (the heads' part named), with
 *                      WEFT_NODE_COLL_KB=0 or WEFT_TRANSPORTS=tcp it is not;
 *   LargeCallsFromThreeRanks  from 3 ranks on one node allreduce,
 *                      reduce, reduce_scatter, allgather, gather and
 *                      alltoall (blocks within WEFT_NODE_COLL_KB) up to
 *                      WEFT_NODE_COLL_LARGE_KB (1 MiB) a rank's slot
 *                      through the segment, a scatter not, one element
 *                      more as messages, none of it with the setting 0, at
 *                      2 ranks or across nodes; a
 *                      small WEFT_SHM_BUDGET_MB lowers the limit and keeps
 *                      the two segments within it, the large one made only
 *                      by a call that needs it; results exact;
 *   AlltoallsPulledAboveTheSlot  an alltoall's blocks over the slot, and
 *                      an alltoallv's from a rank whose blocks are not
 *                      packed, are read by each receiver from the sender's
 *                      buffer by CMA (both modes in one alltoallv); in
 *                      place or with WEFT_SHM_CMA=0 they go as messages,
 *                      said once; results exact; a pulled block's size
 *                      disagreement is MISMATCH naming both ranks;
 *   ScattersPulledAboveTheSlot  a scatter's blocks over the slot (and
 *                      over 32 KiB) read by each rank out of the root's
 *                      buffer by CMA; exact with root not 0, in place,
 *                      twice in a row; 32 KiB blocks not pulled; a size
 *                      disagreement MISMATCH on every rank; CMA off: none;
 *   AllgathersPulledAtTwoRanks  at 2 ranks an allgather's blocks over
 *                      32 KiB read by CMA out of the other's buffer,
 *                      exact (in place too); not from 3 ranks or CMA off;
 *   BytesQuery         weft_comm_node_coll_bytes: the comm's limit where
 *                      the path is taken, 0 where not, alike on every rank;
 *   TransportsWithoutShmKeepItOff  a comm's own WEFT_TRANSPORTS=tcp: the
 *                      query says 0 and an 8-byte allreduce goes as
 *                      messages; tcp,shm: the segment (decided once, at
 *                      the comm's creation);
 *   SegmentUnnamed     once set up, no /dev/shm name of it is left;
 *   MixedSequence      300 calls, the same seeded random sequence on every
 *                      rank, of every kind and root, at sizes on both sides
 *                      of each limit (one round / sliced allreduce / the
 *                      message path), in place and not: every result
 *                      exact -- the buffers' reuse from call to call, calls
 *                      of one parity back to back, roots that leave early;
 *   WriterAheadOfSlowReader  the roots of bcasts and scatters run ahead
 *                      of a rank that naps now and then (up to 64 small
 *                      calls, 2 big ones, then the buffers' reuse holds
 *                      them): every call's data exact on every rank;
 *   MismatchAcrossPaths  one rank's allreduce fits, the others' does not:
 *                      every rank fails with WEFT_ERR_MISMATCH, well before
 *                      WEFT_TIMEOUT;
 *   KindMismatch       one rank bcasts while the others allreduce: the
 *                      others fail with MISMATCH naming both calls, and the
 *                      comm goes on (the next allreduce is exact);
 *   ContributorsSeeTheMismatch  a reduce (and a gather) above 1 KiB where
 *                      a contributor's size differs: that rank fails too,
 *                      naming both calls, and every rank of its node; one
 *                      where a contributor is missing: every other rank
 *                      times out naming it;
 *   RefusedKeepsStep   a rank refuses a call on its own arguments (the
 *                      first one of the comm, before the segment exists,
 *                      and a later one): the others fail with MISMATCH
 *                      naming it, the next call is exact everywhere;
 *   AbsentRankTimesOut the last rank does not call a barrier: the others
 *                      fail within WEFT_TIMEOUT + 2 s naming it.
 * With two virtual nodes (vnodes2 entries) barrier, allreduce and bcast go
 * through each node's segment and among the nodes' heads (node_hier.c):
 * Chosen, MixedSequence and the mismatch and absence cases run there too.
 * Deaths and stopped ranks in a node-local barrier and bcast are the
 * faults suite's (faults_barrier_*_shm, faults_bcast_*_shm).
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

const size_t kSlot = 64 << 10;    /* WEFT_NODE_COLL_KB's default */
const size_t kLarge = 1 << 20;    /* WEFT_NODE_COLL_LARGE_KB's: from 3 ranks (node_fits) */

/* Whether this entry's comms are on one node with shm between the ranks. */
/* own_kb: the comm sets WEFT_NODE_COLL_KB itself (its settings win over
 * the entry's environment). */
bool node_path_expected(int size, bool own_kb = false)
{
    const char *kb = own_kb ? nullptr : std::getenv("WEFT_NODE_COLL_KB");
    const char *vn = std::getenv("WEFT_VIRTUAL_NODES");
    const char *tp = std::getenv("WEFT_TRANSPORTS");
    if (size < 2 || (kb && std::strcmp(kb, "0") == 0) || (vn && std::atoi(vn) > 1))
        return false;
    return !tp || !*tp || std::string(tp).find("shm") != std::string::npos;
}

/* Whether the comm spans several virtual nodes, one at least with several
 * ranks, with shm inside them: then small calls of every kind go through
 * each node's segment and among the nodes' heads as messages
 * (node_hier.c; a gather only with 4 ranks a node on average). */
bool hier_path_expected(int size, bool own_kb = false)
{
    const char *kb = own_kb ? nullptr : std::getenv("WEFT_NODE_COLL_KB");
    const char *vn = std::getenv("WEFT_VIRTUAL_NODES");
    const char *tp = std::getenv("WEFT_TRANSPORTS");
    if (size < 2 || (kb && std::strcmp(kb, "0") == 0) || !vn || std::atoi(vn) < 2 || size <= std::atoi(vn))
        return false;
    return !tp || !*tp || std::string(tp).find("shm") != std::string::npos;
}

class Comm {
public:
    explicit Comm(const Settings &s = {}) { rc_ = create_with(MPI_COMM_WORLD, s, &c_); }
    ~Comm()
    {
        if (c_)
            weft_comm_destroy(c_);
    }
    Comm(const Comm &) = delete;
    Comm &operator=(const Comm &) = delete;
    weft_comm_t *get() const { return c_; }
    int rc() const { return rc_; }
    std::string err() const { return c_ ? weft_comm_last_error(c_) : "(no comm)"; }

private:
    weft_comm_t *c_ = nullptr;
    int rc_ = WEFT_ERR_INTERNAL;
};

/* Runs fn with this rank's stderr in a file; returns what was written. */
template <typename Fn>
std::string capture_stderr(Fn fn)
{
    char path[] = "/tmp/weft_node_log_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return "(mkstemp failed)";
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    std::ifstream in(path);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    unlink(path);
    return all;
}

TEST(NodeColl, Chosen)
{
    int rank = world_rank(), size = world_size();
    /* WEFT_DEBUG=info on this comm only: its shape lines. */
    Comm c(Settings{{"WEFT_DEBUG", "info"}});
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    std::vector<int32_t> in(8, rank + 1), out(8, 0);
    std::vector<int32_t> all((size_t)size * 2, -1), bc(3, rank == 1 % size ? 77 : 0);
    /* reduce_scatter: element i of every rank's vector is i + rank; gather
     * and scatter rooted at the last rank (not a node's lowest). */
    std::vector<int32_t> rs_in((size_t)size * 2), rs_out(2, -1), g_out((size_t)size, -1), sc_in((size_t)size);
    for (size_t i = 0; i < rs_in.size(); i++)
        rs_in[i] = (int32_t)i + rank;
    for (int r = 0; r < size; r++)
        sc_in[(size_t)r] = rank == size - 1 ? 1000 + r : -7;
    int32_t g_in = 500 + rank, sc_out = -1;
    std::vector<int32_t> a2a_in((size_t)size), a2a_out((size_t)size, -1);
    for (int r = 0; r < size; r++)
        a2a_in[(size_t)r] = rank * 100 + r;
    int rc[8];
    std::string log = capture_stderr([&] {
        rc[0] = weft_allreduce(c.get(), in.data(), out.data(), 8, WEFT_INT32, WEFT_SUM);
        rc[1] = weft_barrier(c.get());
        rc[2] = weft_allgather(c.get(), in.data(), all.data(), 8);
        rc[3] = weft_bcast(c.get(), bc.data(), 12, 1 % size);
        rc[4] = weft_reduce_scatter(c.get(), rs_in.data(), rs_out.data(), 2, WEFT_INT32, WEFT_SUM);
        rc[5] = weft_gather(c.get(), &g_in, g_out.data(), 4, size - 1);
        rc[6] = weft_scatter(c.get(), sc_in.data(), &sc_out, 4, size - 1);
        rc[7] = weft_alltoall(c.get(), a2a_in.data(), a2a_out.data(), 4);
    });
    for (int i = 0; i < 8; i++)
        ASSERT_EQ(rc[i], WEFT_SUCCESS) << "call " << i << ": " << c.err();
    for (int v : out)
        ASSERT_EQ(v, size * (size + 1) / 2);
    for (int r = 0; r < size; r++)
        ASSERT_EQ(all[(size_t)r * 2 + 1], r + 1) << "allgather block " << r;
    for (int v : bc)
        ASSERT_EQ(v, 77);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(rs_out[(size_t)i], size * (2 * rank + i) + size * (size - 1) / 2) << "reduce_scatter element " << i;
    for (int r = 0; rank == size - 1 && r < size; r++)
        ASSERT_EQ(g_out[(size_t)r], 500 + r) << "gather block " << r;
    ASSERT_EQ(sc_out, 1000 + rank) << "scatter";
    for (int r = 0; r < size; r++)
        ASSERT_EQ(a2a_out[(size_t)r], r * 100 + rank) << "alltoall block from rank " << r;
    bool said = log.find("allreduce 8 elements of int32, sum") != std::string::npos &&
                log.find("node-local shared memory") != std::string::npos;
    EXPECT_EQ(said, node_path_expected(size) || hier_path_expected(size)) << "rank " << rank << "'s log:\n" << log;
    /* Across nodes: the heads' part named, for every call. */
    bool heads = log.find("heads' recursive doubling") != std::string::npos &&
                 log.find("heads' dissemination") != std::string::npos &&
                 log.find("heads' ring") != std::string::npos && log.find("heads' binomial tree") != std::string::npos &&
                 log.find("heads' recursive doubling, a block each") != std::string::npos &&
                 log.find("heads' linear scatter") != std::string::npos &&
                 log.find("heads' pairwise exchange") != std::string::npos;
    EXPECT_EQ(heads, hier_path_expected(size)) << "rank " << rank << "'s log:\n" << log;
    /* A gather only with 4 ranks a node on average (HIER_GATHER_PER_NODE). */
    const char *vn = std::getenv("WEFT_VIRTUAL_NODES");
    bool gather_hier = hier_path_expected(size) && vn && size >= 4 * std::atoi(vn);
    EXPECT_EQ(log.find("heads' linear gather") != std::string::npos, gather_hier) << "rank " << rank << "'s log:\n"
                                                                                 << log;
}

/* Two ranks: a bcast, an allgather, an allreduce or a reduce above 32 KiB
 * goes as messages (one single-copy message each way beats the segment's
 * two copies: node_fits, NODE_PAIR_MAX), 32 KiB still through the
 * segment; from three ranks both sizes go through the segment (the
 * comm's own WEFT_NODE_COLL_KB=64: every call here fits). The shape lines
 * say which path each call took; the results are checked too. */
TEST(NodeColl, TwoRanksSendMessagesAbove32KiB)
{
    int rank = world_rank(), size = world_size();
    Comm c(Settings{{"WEFT_DEBUG", "info"}, {"WEFT_NODE_COLL_KB", "64"}});
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    for (size_t bytes : {size_t(32) << 10, size_t(64) << 10}) {
        const size_t n = bytes / 4;
        std::vector<int32_t> in(n, rank + 1), out(n, 0), all(n * (size_t)size, 0), b(n, rank == 0 ? 7 : 0);
        int rc[4] = {WEFT_SUCCESS, WEFT_SUCCESS, WEFT_SUCCESS, WEFT_SUCCESS};
        std::string log = capture_stderr([&] {
            rc[0] = weft_bcast(c.get(), b.data(), bytes, 0);
            rc[1] = weft_allgather(c.get(), in.data(), all.data(), bytes);
            rc[2] = weft_allreduce(c.get(), in.data(), out.data(), n, WEFT_INT32, WEFT_SUM);
            rc[3] = weft_reduce(c.get(), in.data(), out.data(), n, WEFT_INT32, WEFT_SUM, 0);
        });
        for (int i = 0; i < 4; i++)
            ASSERT_EQ(rc[i], WEFT_SUCCESS) << "call " << i << ", " << bytes << " B: " << c.err();
        EXPECT_EQ(b[n - 1], 7);
        for (int r = 0; r < size; r++)
            EXPECT_EQ(all[(size_t)r * n + n - 1], r + 1) << "allgather block " << r;
        if (rank == 0) {
            EXPECT_EQ(out[n - 1], size * (size + 1) / 2);
        }
        /* Across nodes the allreduce and the reduce (calls 2 and 3) go
         * through the segments up to 32 KiB (a bcast only up to 1 KiB,
         * an allgather up to 16 KiB in all). */
        const bool segment = node_path_expected(size, true) && (size != 2 || bytes <= (size_t(32) << 10));
        const bool hier = hier_path_expected(size, true) && bytes <= (size_t(32) << 10);
        const std::string heads[] = {"bcast " + std::to_string(bytes) + " B x",
                                     "allgather " + std::to_string(bytes) + " B per rank x",
                                     "allreduce " + std::to_string(n) + " elements of int32, sum x",
                                     ": reduce " + std::to_string(n) + " elements of int32, sum"};
        for (int i = 0; i < 4; i++) {
            const std::string &h = heads[i];
            size_t at = log.find(h);
            ASSERT_NE(at, std::string::npos) << "no shape line \"" << h << "\" on rank " << rank << ":\n" << log;
            std::string line = log.substr(at, log.find('\n', at) - at);
            EXPECT_EQ(line.find("node-local shared memory") != std::string::npos,
                      segment || (hier && i >= 2))
                << "np " << size << ", " << bytes << " B: " << line;
        }
    }
}

/* From three ranks on one node an allreduce's, a reduce's and a
 * reduce_scatter's vector, an allgather's and a gather's block and an
 * alltoall's whole buffer (while a block is within WEFT_NODE_COLL_KB) go
 * through the segment above WEFT_NODE_COLL_KB, up to
 * WEFT_NODE_COLL_LARGE_KB in a rank's slot (node_coll.c, node_fits and
 * node_large_limit); a scatter stays within WEFT_NODE_COLL_KB. The shape
 * lines say which path each call took, the results are checked. */
TEST(NodeColl, LargeCallsFromThreeRanks)
{
    const int rank = world_rank(), size = world_size();
    const size_t P = (size_t)size;
    const bool large = node_path_expected(size, true) && size >= 3;
    struct Case {
        const char *large_kb, *budget_mb;
        size_t bytes;   /* a rank's part: the vector, the block */
        bool segment;   /* where `large` holds */
    };
    const Case cases[] = {
        {"1024", "64", size_t(1) << 20, true},             /* the default limit, at it */
        {"1024", "64", (size_t(1) << 20) + 4 * P, false},  /* one element a rank past it */
        {"0", "64", size_t(128) << 10, false},             /* off: WEFT_NODE_COLL_KB's 64 KiB */
        /* 4 MiB of budget, less the small segment: the 8-rank large
         * segment's slots fit 134 KiB, the 3-rank one's 423 KiB
         * (node_large_limit), so 80 KiB fits at every size here and 1 MiB
         * at none. */
        {"1024", "4", size_t(80) << 10, true},
        {"1024", "4", size_t(1) << 20, false},
    };
    for (const Case &k : cases) {
        SCOPED_TRACE(std::string("WEFT_NODE_COLL_LARGE_KB=") + k.large_kb + " WEFT_SHM_BUDGET_MB=" + k.budget_mb +
                     ", " + std::to_string(k.bytes) + " B a rank");
        Comm c(Settings{{"WEFT_DEBUG", "info"},
                        {"WEFT_NODE_COLL_KB", "64"},
                        {"WEFT_NODE_COLL_LARGE_KB", k.large_kb},
                        {"WEFT_SHM_BUDGET_MB", k.budget_mb}});
        ASSERT_EQ(c.rc(), WEFT_SUCCESS) << c.err();
        const size_t n = k.bytes / 4, nb = n / P;   /* elements: the vector, a reduce_scatter block */
        std::vector<int32_t> in(n), out(n, -1), red(n, -1), blk(nb, -1), all(n * P, -1), gat(n * P, -1);
        std::vector<int32_t> sca(nb, -1), a2a(nb * P, -1);
        for (size_t i = 0; i < n; i++)
            in[i] = rank + 1 + (int32_t)(i % 7);
        const int root = size - 1;   /* the rooted calls': not rank 0, whose slot comes first */
        const size_t bb = nb * 4;    /* a scatter's and an alltoall's block: the buffer is k.bytes */
        int rc[8];
        std::fill(rc, rc + 8, WEFT_ERR_INTERNAL);
        std::string log = capture_stderr([&] {
            rc[0] = weft_allreduce(c.get(), in.data(), out.data(), n, WEFT_INT32, WEFT_SUM);
            rc[1] = weft_reduce(c.get(), in.data(), red.data(), n, WEFT_INT32, WEFT_SUM, root);
            rc[2] = weft_reduce_scatter(c.get(), in.data(), blk.data(), nb, WEFT_INT32, WEFT_SUM);
            rc[3] = weft_allgather(c.get(), in.data(), all.data(), k.bytes);
            rc[4] = weft_gather(c.get(), in.data(), gat.data(), k.bytes, root);
            rc[5] = weft_scatter(c.get(), in.data(), sca.data(), bb, root);
            rc[6] = weft_alltoall(c.get(), in.data(), a2a.data(), bb);
        });
        for (int i = 0; i < 7; i++)
            ASSERT_EQ(rc[i], WEFT_SUCCESS) << "call " << i << ": " << c.err();
        const int32_t base = size * (size + 1) / 2;
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) {
            const int32_t want = base + size * (int32_t)(i % 7);
            wrong += out[i] != want;
            wrong += rank == root && red[i] != want;
            for (size_t r = 0; r < P; r++) {
                wrong += all[r * n + i] != (int32_t)r + 1 + (int32_t)(i % 7);
                wrong += rank == root && gat[r * n + i] != (int32_t)r + 1 + (int32_t)(i % 7);
            }
        }
        for (size_t i = 0; i < nb; i++) {
            const size_t at = nb * (size_t)rank + i;   /* where block `rank` lies in a rank's k.bytes */
            wrong += blk[i] != base + size * (int32_t)(at % 7);
            wrong += sca[i] != root + 1 + (int32_t)(at % 7);
            for (size_t r = 0; r < P; r++)   /* rank r's block `rank` */
                wrong += a2a[r * nb + i] != (int32_t)r + 1 + (int32_t)(at % 7);
        }
        EXPECT_EQ(wrong, 0u);
        const bool segment = large && k.segment;
        const std::string heads[] = {"allreduce " + std::to_string(n) + " elements of int32, sum x",
                                     ": reduce " + std::to_string(n) + " elements of int32, sum",
                                     "reduce_scatter " + std::to_string(nb),
                                     "allgather " + std::to_string(k.bytes) + " B per rank x",
                                     ": gather " + std::to_string(k.bytes) + " B per rank x",
                                     ": scatter " + std::to_string(bb) + " B per rank x",
                                     ": alltoall " + std::to_string(bb) + " B per rank x"};
        for (int i = 0; i < 7; i++) {
            const std::string &h = heads[i];
            size_t at = log.find(h);
            /* The scatter's buffer is above the small slot in every case;
             * an alltoall's block must be within it too. */
            const bool want = segment && i != 5 && (i != 6 || bb <= kSlot);
            if (i >= 4 && !want && at == std::string::npos)
                continue;   /* gather, scatter, alltoall: the message path logs no shape line of theirs */
            ASSERT_NE(at, std::string::npos) << "no shape line \"" << h << "\" on rank " << rank << ":\n" << log;
            std::string line = log.substr(at, log.find('\n', at) - at);
            EXPECT_EQ(line.find("node-local shared memory") != std::string::npos, want)
                << "np " << size << ": " << line;
        }
        /* The two segments made for these calls (the small one at the
         * first call, the large one at the first call above its slot) stay
         * within the budget together; without a large call, no large one. */
        const std::string small_on = "node-local collectives on: ", large_on = "on for large calls: ";
        size_t at = log.find(small_on), lat = log.find(large_on);
        if (!segment) {
            EXPECT_EQ(lat, std::string::npos) << "a large segment without a call through it:\n" << log;
        } else {
            ASSERT_NE(at, std::string::npos) << log;
            ASSERT_NE(lat, std::string::npos) << log;
            unsigned long long seg = std::strtoull(log.c_str() + at + small_on.size(), nullptr, 10) +
                                     std::strtoull(log.c_str() + lat + large_on.size(), nullptr, 10);
            EXPECT_LE(seg, std::strtoull(k.budget_mb, nullptr, 10) << 20) << log;
        }
    }
}

/* Byte i of the block rank s sends rank d in call c. */
unsigned char a2a_byte(int s, int d, int c, size_t i)
{
    return (unsigned char)(s * 31 + d * 7 + c * 13 + i * 3 + (i >> 9));
}

/* One alltoallv of blocks sizes(s, d) (s -> d), packed in rank order in
 * both buffers, from a send buffer filled for call c; in_place: the call
 * gets one buffer as both (its receive blocks after its send blocks).
 * Returns the code; *bad counts wrong received bytes. */
template <typename Sizes>
int a2av_call(weft_comm_t *comm, int c, Sizes sizes, size_t *bad)
{
    const int rank = world_rank(), size = world_size();
    std::vector<size_t> sb(size), sd(size), rb(size), rd(size);
    size_t st = 0, rt = 0;
    for (int j = 0; j < size; j++) {
        sb[j] = sizes(rank, j);
        rb[j] = sizes(j, rank);
        sd[j] = st;
        rd[j] = rt;
        st += sb[j];
        rt += rb[j];
    }
    std::vector<unsigned char> send(st + 1), recv(rt + 1, 0xee);
    for (int j = 0; j < size; j++)
        for (size_t i = 0; i < sb[j]; i++)
            send[sd[j] + i] = a2a_byte(rank, j, c, i);
    int rc = weft_alltoallv(comm, send.data(), sb.data(), sd.data(), recv.data(), rb.data(), rd.data());
    *bad = recv[rt] != 0xee;
    for (int j = 0; j < size && rc == WEFT_SUCCESS; j++)
        for (size_t i = 0; i < rb[j]; i++)
            *bad += recv[rd[j] + i] != a2a_byte(j, rank, c, i);
    return rc;
}

/* Above what the segment takes (a block over WEFT_NODE_COLL_KB) an
 * alltoall's blocks are pulled: each rank reads its block out of every
 * sender's buffer by CMA (node_coll.c, node_a2a_pull), one round of flags;
 * an alltoallv's blocks likewise from a rank whose blocks are not packed
 * in its slot, while the others' come through their slots (the modes
 * mixed in one call). In place, or with WEFT_SHM_CMA=0, they cannot be:
 * the rank says so once in an info line and the calls go as messages.
 * Results exact in every case; a block size the sender and the receiver
 * disagree on, when pulled, fails the receiver with MISMATCH naming both,
 * and the comm goes on. */
TEST(NodeColl, AlltoallsPulledAboveTheSlot)
{
    const int rank = world_rank(), size = world_size();
    if (!node_path_expected(size, true))
        GTEST_SKIP() << "the node path is not taken here";
    const size_t P = (size_t)size, bb = kSlot + 4100;   /* a block over the slot */
    for (const char *cma : {"1", "0"}) {
        SCOPED_TRACE(std::string("WEFT_SHM_CMA=") + cma);
        Comm c(Settings{{"WEFT_DEBUG", "info"}, {"WEFT_NODE_COLL_KB", "64"}, {"WEFT_SHM_CMA", cma}});
        ASSERT_EQ(c.rc(), WEFT_SUCCESS) << c.err();
        std::vector<unsigned char> in(bb * P), out(bb * P + 1, 0xee), inplace(bb * P);
        for (size_t d = 0; d < P; d++)
            for (size_t i = 0; i < bb; i++)
                in[d * bb + i] = inplace[d * bb + i] = a2a_byte(rank, (int)d, 1, i);
        int rc[5];
        size_t bad[5] = {0, 0, 0, 0, 0};
        std::string log = capture_stderr([&] {
            rc[0] = weft_alltoall(c.get(), in.data(), out.data(), bb);
            rc[1] = weft_alltoall(c.get(), inplace.data(), inplace.data(), bb);
            /* Rank 0's blocks over the slot (pulled), the others' small
             * (packed): both modes in one call. */
            rc[2] = a2av_call(c.get(), 2, [](int s, int d) { return s == 0 ? 70 * 1024 + (size_t)d : 9 + (size_t)d; },
                              &bad[2]);
            /* Every block pulled, odd sizes; from 3 ranks an empty one. */
            rc[3] = a2av_call(c.get(), 3,
                              [size](int s, int d) {
                                  return size >= 3 && s == 0 && d == size - 1 ? 0 : 100 * 1024 + 3 + (size_t)(s * 5 + d);
                              },
                              &bad[3]);
            /* All packed again. */
            rc[4] = a2av_call(c.get(), 4, [](int s, int d) { return (size_t)(s + d + 1); }, &bad[4]);
        });
        for (int i = 0; i < 5; i++)
            ASSERT_EQ(rc[i], WEFT_SUCCESS) << "call " << i << ": " << c.err();
        for (size_t s = 0; s < P; s++)
            for (size_t i = 0; i < bb; i++) {
                bad[0] += out[s * bb + i] != a2a_byte((int)s, rank, 1, i);
                bad[1] += inplace[s * bb + i] != a2a_byte((int)s, rank, 1, i);
            }
        bad[0] += out[bb * P] != 0xee;
        for (int i = 0; i < 5; i++)
            EXPECT_EQ(bad[i], 0u) << "call " << i;
        const bool refused = log.find("cannot read rank") != std::string::npos;
        const bool pulls = std::strcmp(cma, "1") == 0 && !refused;
        if (std::strcmp(cma, "1") == 0 && refused)
            ADD_FAILURE() << "CMA between the ranks was refused here (the probe's line):\n" << log;
        const std::string head = ": alltoall " + std::to_string(bb) + " B per rank x";
        size_t at = log.find(head);
        if (pulls) {
            ASSERT_NE(at, std::string::npos) << "no shape line \"" << head << "\" on rank " << rank << ":\n" << log;
            std::string line = log.substr(at, log.find('\n', at) - at);
            EXPECT_NE(line.find("each block pulled from its sender by CMA"), std::string::npos) << line;
        }
        /* The in-place alltoall cannot be pulled on any rank; with CMA off
         * rank 0's alltoallv cannot either: the line says which. */
        const std::string in_place = "in place, its blocks cannot be read where they are received";
        const std::string off = "cannot be pulled (CMA between the node's ranks is off";
        if (pulls) {
            EXPECT_NE(log.find(in_place), std::string::npos) << log;
            EXPECT_EQ(log.find(off), std::string::npos) << log;
        } else {
            /* Without pulls the alltoalls go as messages from the start
             * (no round to spill from); rank 0's first alltoallv spills,
             * every rank's second. */
            EXPECT_EQ(log.find("each block pulled"), std::string::npos) << log;
            EXPECT_NE(log.find(off), std::string::npos) << log;
        }
        /* A pulled block whose size the sender and the receiver disagree
         * on: rank 1 expects one byte more from rank 0 than it sends. */
        if (pulls && size >= 2) {
            size_t ignored = 0;
            int mrc = a2av_call(c.get(), 5,
                                [rank](int s, int d) {
                                    return (size_t)90 * 1024 + (s == 0 && d == 1 && rank == 1 ? 1 : 0);
                                },
                                &ignored);
            std::string err = c.err();
            if (rank == 1) {
                EXPECT_EQ(mrc, WEFT_ERR_MISMATCH) << err;
                EXPECT_NE(err.find("rank 0 sends 92160 bytes to rank 1, which expects 92161 from it"),
                          std::string::npos) << err;
            } else {
                /* Every rank holds its send buffer until all readers are
                 * through (no read of a buffer its rank has left), then
                 * gives rank 1's verdict if its notice came by then. */
                EXPECT_TRUE(mrc == WEFT_SUCCESS || mrc == WEFT_ERR_MISMATCH) << weft_strerror(mrc) << ": " << err;
                if (mrc == WEFT_ERR_MISMATCH) {
                    EXPECT_NE(err.find("rank 1"), std::string::npos) << err;
                }
            }
            MPI_Barrier(MPI_COMM_WORLD);
            size_t after = 0;
            EXPECT_EQ(weft_alltoall(c.get(), in.data(), out.data(), bb), WEFT_SUCCESS) << c.err();
            for (size_t s = 0; s < P; s++)
                for (size_t i = 0; i < bb; i++)
                    after += out[s * bb + i] != a2a_byte((int)s, rank, 1, i);
            EXPECT_EQ(after, 0u);
        }
    }
}

/* weft_comm_node_coll_bytes says what Chosen sees: the limit where the
 * node path is taken (WEFT_NODE_COLL_KB of the comm), 0 where it is not;
 * the same on every rank. */
/* A scatter's blocks above the slot (and above 32 KiB) are read by each
 * rank out of the root's send buffer by CMA after one round of flags
 * (node_scatter_pull): the shape line says so; results exact with the
 * root not 0, in place at the root, twice in a row (the root holds its
 * buffer until every rank is through); a 32 KiB block is not pulled
 * (eager messages, or the segment at 2 ranks); a rank that disagrees on the block size fails with MISMATCH
 * on every rank and the comm goes on; with WEFT_SHM_CMA=0 no pulls. */
TEST(NodeColl, ScattersPulledAboveTheSlot)
{
    const int rank = world_rank(), size = world_size();
    if (!node_path_expected(size, true))
        GTEST_SKIP() << "the node path is not taken here";
    const size_t P = (size_t)size, bb = kSlot + 4100;
    const int root = size - 1;
    for (const char *cma : {"1", "0"}) {
        SCOPED_TRACE(std::string("WEFT_SHM_CMA=") + cma);
        Comm c(Settings{{"WEFT_DEBUG", "info"}, {"WEFT_NODE_COLL_KB", "64"}, {"WEFT_SHM_CMA", cma}});
        ASSERT_EQ(c.rc(), WEFT_SUCCESS) << c.err();
        auto byte = [](int r, size_t i, int call) { return (unsigned char)(r * 31 + i * 7 + (size_t)call * 13 + i / 251); };
        std::vector<unsigned char> send(bb * P), out(bb + 1), small(32768 * P), sout(32768);
        size_t bad = 0;
        int rc[4];
        std::string log = capture_stderr([&] {
            for (int call = 0; call < 2; call++) {   /* pulled, twice */
                for (size_t i = 0; i < send.size(); i++)
                    send[i] = rank == root ? byte((int)(i / bb), i % bb, call) : 0;
                std::fill(out.begin(), out.end(), 0xee);
                rc[call] = weft_scatter(c.get(), rank == root ? send.data() : nullptr, out.data(), bb, root);
                for (size_t i = 0; i < bb; i++)
                    bad += out[i] != byte(rank, i, call);
                bad += out[bb] != 0xee;
            }
            /* In place at the root: its block stays where it is. */
            for (size_t i = 0; i < send.size(); i++)
                send[i] = byte((int)(i / bb), i % bb, 2);
            unsigned char *mine = rank == root ? send.data() + (size_t)root * bb : out.data();
            rc[2] = weft_scatter(c.get(), rank == root ? send.data() : nullptr, mine, bb, root);
            for (size_t i = 0; i < bb; i++)
                bad += mine[i] != byte(rank, i, 2);
            /* 32 KiB blocks: messages. */
            for (size_t i = 0; i < small.size(); i++)
                small[i] = byte((int)(i / 32768), i % 32768, 3);
            rc[3] = weft_scatter(c.get(), rank == root ? small.data() : nullptr, sout.data(), 32768, root);
            for (size_t i = 0; i < sout.size(); i++)
                bad += sout[i] != byte(rank, i, 3);
        });
        for (int i = 0; i < 4; i++)
            ASSERT_EQ(rc[i], WEFT_SUCCESS) << "call " << i << ": " << c.err();
        EXPECT_EQ(bad, 0u);
        const bool pulls = std::strcmp(cma, "1") == 0;
        const std::string head = ": scatter " + std::to_string(bb) + " B per rank x";
        size_t at = log.find(head);
        std::string line;
        if (pulls) {
            ASSERT_NE(at, std::string::npos) << "no shape line \"" << head << "\" on rank " << rank << ":\n" << log;
            line = log.substr(at, log.find('\n', at) - at);
            EXPECT_NE(line.find("each block pulled from its sender by CMA"), std::string::npos) << line;
        } else {
            EXPECT_EQ(log.find("each block pulled"), std::string::npos) << log;
        }
        /* (At 2 ranks 32 KiB blocks fit the segment; from 3 they are messages.) */
        at = log.find(": scatter 32768 B per rank x");
        if (at != std::string::npos) {
            line = log.substr(at, log.find('\n', at) - at);
            EXPECT_EQ(line.find("pulled"), std::string::npos) << line;
        }
        if (pulls && size >= 2) {
            /* Rank 0 (not the root) scatters one byte less. */
            int mrc = weft_scatter(c.get(), rank == root ? send.data() : nullptr, out.data(), rank == 0 && root != 0 ? bb - 1 : bb,
                                   root);
            EXPECT_EQ(mrc, WEFT_ERR_MISMATCH) << "rank " << rank << ": " << c.err();
            if (rank == 0 || rank == root) {
                EXPECT_NE(c.err().find("scatter(" + std::to_string(bb - 1)), std::string::npos) << c.err();
            }
            std::fill(out.begin(), out.end(), 0xee);
            for (size_t i = 0; i < send.size(); i++)
                send[i] = byte((int)(i / bb), i % bb, 4);
            ASSERT_EQ(weft_scatter(c.get(), rank == root ? send.data() : nullptr, out.data(), bb, root), WEFT_SUCCESS)
                << c.err();
            for (size_t i = 0; i < bb; i++)
                ASSERT_EQ(out[i], byte(rank, i, 4)) << "after the mismatch, byte " << i;
        }
    }
}

/* At 2 ranks an allgather's blocks above 32 KiB are read by each rank out
 * of the other's buffer by CMA (node_ag_pull): the shape line says so;
 * exact, in place and not, twice in a row; with WEFT_SHM_CMA=0, and from
 * 3 ranks (the ring of messages above the large slot), not pulled. */
TEST(NodeColl, AllgathersPulledAtTwoRanks)
{
    const int rank = world_rank(), size = world_size();
    if (!node_path_expected(size, true))
        GTEST_SKIP() << "the node path is not taken here";
    const size_t P = (size_t)size, bb = (48 << 10) + 3;
    for (const char *cma : {"1", "0"}) {
        SCOPED_TRACE(std::string("WEFT_SHM_CMA=") + cma);
        Comm c(Settings{{"WEFT_DEBUG", "info"}, {"WEFT_SHM_CMA", cma}});
        ASSERT_EQ(c.rc(), WEFT_SUCCESS) << c.err();
        auto byte = [](int r, size_t i, int call) { return (unsigned char)(r * 29 + i * 5 + (size_t)call * 17 + i / 253); };
        std::vector<unsigned char> mine(bb), all(bb * P + 1);
        size_t bad = 0;
        int rc[3];
        std::string log = capture_stderr([&] {
            for (int call = 0; call < 3; call++) {   /* two apart, the third in place */
                std::fill(all.begin(), all.end(), 0xee);
                unsigned char *src = call == 2 ? all.data() + (size_t)rank * bb : mine.data();
                for (size_t i = 0; i < bb; i++)
                    src[i] = byte(rank, i, call);
                rc[call] = weft_allgather(c.get(), src, all.data(), bb);
                for (size_t r = 0; r < P; r++)
                    for (size_t i = 0; i < bb; i++)
                        bad += all[r * bb + i] != byte((int)r, i, call);
                bad += all[bb * P] != 0xee;
            }
        });
        for (int i = 0; i < 3; i++)
            ASSERT_EQ(rc[i], WEFT_SUCCESS) << "call " << i << ": " << c.err();
        EXPECT_EQ(bad, 0u);
        const bool pulls = size == 2 && std::strcmp(cma, "1") == 0;
        if (pulls) {
            const std::string head = ": allgather " + std::to_string(bb) + " B per rank x";
            size_t at = log.find(head);
            ASSERT_NE(at, std::string::npos) << "no shape line \"" << head << "\" on rank " << rank << ":\n" << log;
            std::string line = log.substr(at, log.find('\n', at) - at);
            EXPECT_NE(line.find("each block pulled from its sender by CMA"), std::string::npos) << line;
        } else {
            EXPECT_EQ(log.find("each block pulled"), std::string::npos) << log;
        }
    }
}

TEST(NodeColl, BytesQuery)
{
    int size = world_size();
    Comm c(Settings{{"WEFT_NODE_COLL_KB", "16"}});
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    size_t bytes = 1;
    ASSERT_EQ(weft_comm_node_coll_bytes(c.get(), &bytes), WEFT_SUCCESS);
    EXPECT_EQ(bytes, node_path_expected(size, true) ? size_t(16) << 10 : 0u);
    unsigned long long mine = bytes, lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi);
    /* ... and a node-local call leaves it as it was (the segment is up). */
    ASSERT_EQ(weft_barrier(c.get()), WEFT_SUCCESS) << c.err();
    size_t after = 1;
    ASSERT_EQ(weft_comm_node_coll_bytes(c.get(), &after), WEFT_SUCCESS);
    EXPECT_EQ(after, bytes);
    EXPECT_EQ(weft_comm_node_coll_bytes(c.get(), nullptr), WEFT_ERR_INVALID_ARG);
}

/* The comm's own WEFT_TRANSPORTS decides, once at its creation
 * (coll_node_init): without shm the segment is off for good -- the query
 * says 0 and small calls go as messages --, with shm among others it is
 * on (on one node). */
TEST(NodeColl, TransportsWithoutShmKeepItOff)
{
    int size = world_size();
    const char *vn = std::getenv("WEFT_VIRTUAL_NODES");
    const bool one_node = size >= 2 && !(vn && std::atoi(vn) > 1);
    for (const char *tp : {"tcp", "tcp,shm"}) {
        SCOPED_TRACE(std::string("WEFT_TRANSPORTS=") + tp);
        Comm c(Settings{{"WEFT_TRANSPORTS", tp}, {"WEFT_NODE_COLL_KB", "16"}, {"WEFT_DEBUG", "info"}});
        ASSERT_EQ(c.rc(), WEFT_SUCCESS) << c.err();
        const bool on = one_node && std::strcmp(tp, "tcp") != 0;
        size_t bytes = 1;
        ASSERT_EQ(weft_comm_node_coll_bytes(c.get(), &bytes), WEFT_SUCCESS);
        EXPECT_EQ(bytes, on ? size_t(16) << 10 : 0u);
        int32_t in = world_rank() + 1, out = 0;
        int rc = WEFT_ERR_INTERNAL;
        std::string log = capture_stderr([&] { rc = weft_allreduce(c.get(), &in, &out, 1, WEFT_INT32, WEFT_SUM); });
        ASSERT_EQ(rc, WEFT_SUCCESS) << c.err();
        EXPECT_EQ(out, size * (size + 1) / 2);
        if (size >= 2 && vn == nullptr) {
            size_t at = log.find("allreduce 1 elements of int32, sum x");
            ASSERT_NE(at, std::string::npos) << "no shape line on rank " << world_rank() << ":\n" << log;
            std::string line = log.substr(at, log.find('\n', at) - at);
            EXPECT_EQ(line.find("node-local shared memory") != std::string::npos, on) << line;
        }
    }
}

TEST(NodeColl, SegmentUnnamed)
{
    int size = world_size();
    Comm c;
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    ASSERT_EQ(weft_barrier(c.get()), WEFT_SUCCESS) << c.err();
    int pid = (int)getpid();
    std::vector<int> pids(size);
    MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, MPI_COMM_WORLD);
    DIR *d = opendir("/dev/shm");
    ASSERT_NE(d, nullptr);
    std::vector<std::string> left;
    while (struct dirent *e = readdir(d))
        for (int p : pids)
            if (std::string(e->d_name).rfind("weft-" + std::to_string(p) + "-node", 0) == 0)
                left.push_back(e->d_name);
    closedir(d);
    EXPECT_TRUE(left.empty()) << left.size() << " segment name(s) left, e.g. /dev/shm/" << left[0];
}

/* Element i of rank r in call n. */
int32_t val(int r, size_t i, int n) { return (int32_t)((r + 1) * 1000003u + i * 7u + (uint32_t)n * 131u) % 100000; }

TEST(NodeColl, MixedSequence)
{
    int rank = world_rank(), size = world_size();
    Comm c;
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    const size_t P = (size_t)size;
    /* Element counts (int32) of each side of every limit: small buffers up
     * to 1 KiB a rank, one round up to 2 KiB, sliced up to the slot,
     * messages above -- but a bcast from 3 ranks fills up to every slot of
     * a big buffer (P slots), so it has its own limit further up, and
     * above it goes in pieces of P slots (two and a part here); from 3
     * ranks the reductions' vector, an allgather's and a gather's block and
     * an alltoall's P blocks (each within kSlot: kSlot / 4 and one more
     * are its sides) go through the segment up to kLarge in a rank's
     * slot, as messages above. */
    const std::vector<size_t> counts = {1, 3, 255, 256, 257, 511, 512, 513, 1000, 256 * P, 256 * P + 1,
                                        kSlot / 4 / P, kSlot / 4 - 1, kSlot / 4, kSlot / 4 + 1, 20000,
                                        kSlot / 4 * 2 + 3, kSlot / 4 * P, kSlot / 4 * P + 1,
                                        kSlot / 4 * P * 2 + 5, kLarge / 4, kLarge / 4 + P};
    std::mt19937 gen(12345);   /* the same sequence on every rank */
    std::vector<int32_t> send, recv, want;
    int bad = 0;
    for (int n = 0; n < 300 && !bad; n++) {
        int kind = (int)(gen() % 9);
        size_t cnt = counts[gen() % counts.size()];
        int root = (int)(gen() % P);
        bool inplace = gen() % 2;
        int rc = WEFT_SUCCESS;
        std::string what;
        switch (kind) {
        case 0: {   /* allreduce */
            send.resize(cnt);
            for (size_t i = 0; i < cnt; i++)
                send[i] = val(rank, i, n);
            recv = inplace ? send : std::vector<int32_t>(cnt, -1);
            rc = weft_allreduce(c.get(), send.data(), inplace ? send.data() : recv.data(), cnt, WEFT_INT32, WEFT_SUM);
            if (inplace)
                recv = send;
            want.assign(cnt, 0);
            for (size_t i = 0; i < cnt; i++)
                for (int r = 0; r < size; r++)
                    want[i] = (int32_t)((uint32_t)want[i] + (uint32_t)val(r, i, n));
            what = "allreduce";
            break;
        }
        case 1: {   /* reduce */
            send.resize(cnt);
            for (size_t i = 0; i < cnt; i++)
                send[i] = val(rank, i, n);
            recv.assign(cnt, -1);
            rc = weft_reduce(c.get(), send.data(), recv.data(), cnt, WEFT_INT32, WEFT_MAX, root);
            want.assign(cnt, 0);
            for (size_t i = 0; i < cnt; i++) {
                want[i] = val(0, i, n);
                for (int r = 1; r < size; r++)
                    want[i] = std::max(want[i], val(r, i, n));
            }
            if (rank != root)
                want = recv;   /* not looked at */
            what = "reduce";
            break;
        }
        case 2: {   /* bcast */
            recv.resize(cnt);
            for (size_t i = 0; i < cnt; i++)
                recv[i] = rank == root ? val(root, i, n) : -1;
            rc = weft_bcast(c.get(), recv.data(), cnt * 4, root);
            want.resize(cnt);
            for (size_t i = 0; i < cnt; i++)
                want[i] = val(root, i, n);
            what = "bcast";
            break;
        }
        case 3: {   /* allgather, cnt/P elements a rank (at least 1) */
            size_t e = std::max<size_t>(1, cnt / P);
            recv.assign(e * P, -1);
            send.resize(e);
            for (size_t i = 0; i < e; i++)
                send[i] = val(rank, i, n);
            if (inplace)
                std::memcpy(&recv[e * (size_t)rank], send.data(), e * 4);
            rc = weft_allgather(c.get(), inplace ? &recv[e * (size_t)rank] : send.data(), recv.data(), e * 4);
            want.resize(e * P);
            for (size_t r = 0; r < P; r++)
                for (size_t i = 0; i < e; i++)
                    want[r * e + i] = val((int)r, i, n);
            what = "allgather";
            break;
        }
        case 4: {   /* alltoall */
            size_t e = std::max<size_t>(1, cnt / P);
            send.resize(e * P);
            for (size_t j = 0; j < P; j++)
                for (size_t i = 0; i < e; i++)
                    send[j * e + i] = val(rank, j * e + i, n);
            recv.assign(e * P, -1);
            if (inplace)
                recv = send;
            rc = weft_alltoall(c.get(), inplace ? recv.data() : send.data(), recv.data(), e * 4);
            want.resize(e * P);
            for (size_t r = 0; r < P; r++)
                for (size_t i = 0; i < e; i++)
                    want[r * e + i] = val((int)r, (size_t)rank * e + i, n);
            what = "alltoall";
            break;
        }
        case 5: {   /* reduce_scatter, cnt/P a rank */
            size_t e = std::max<size_t>(1, cnt / P);
            send.resize(e * P);
            for (size_t i = 0; i < e * P; i++)
                send[i] = val(rank, i, n);
            recv.assign(e, -1);
            rc = weft_reduce_scatter(c.get(), send.data(), inplace ? &send[e * (size_t)rank] : recv.data(), e,
                                     WEFT_INT32, WEFT_SUM);
            if (inplace)
                recv.assign(send.begin() + (long)(e * (size_t)rank), send.begin() + (long)(e * (size_t)rank + e));
            want.assign(e, 0);
            for (size_t i = 0; i < e; i++)
                for (int r = 0; r < size; r++)
                    want[i] = (int32_t)((uint32_t)want[i] + (uint32_t)val(r, (size_t)rank * e + i, n));
            what = "reduce_scatter";
            break;
        }
        case 6: {   /* gather */
            size_t e = std::max<size_t>(1, cnt / P);
            send.resize(e);
            for (size_t i = 0; i < e; i++)
                send[i] = val(rank, i, n);
            recv.assign(e * P, -1);
            rc = weft_gather(c.get(), send.data(), recv.data(), e * 4, root);
            want.resize(e * P);
            for (size_t r = 0; r < P; r++)
                for (size_t i = 0; i < e; i++)
                    want[r * e + i] = val((int)r, i, n);
            if (rank != root)
                want = recv;
            what = "gather";
            break;
        }
        case 7: {   /* scatter */
            size_t e = std::max<size_t>(1, cnt / P);
            send.resize(e * P);
            for (size_t i = 0; i < e * P; i++)
                send[i] = val(root, i, n);
            recv.assign(e, -1);
            rc = weft_scatter(c.get(), send.data(), recv.data(), e * 4, root);
            want.resize(e);
            for (size_t i = 0; i < e; i++)
                want[i] = val(root, (size_t)rank * e + i, n);
            what = "scatter";
            break;
        }
        default:
            rc = weft_barrier(c.get());
            recv.clear();
            want.clear();
            what = "barrier";
            break;
        }
        if (rc != WEFT_SUCCESS || recv != want) {
            ADD_FAILURE() << "call " << n << ": " << what << " of " << cnt << " (root " << root << ", "
                          << (inplace ? "in place" : "out of place") << "): rc " << rc << " " << c.err()
                          << (rc == WEFT_SUCCESS ? ": wrong data" : "");
            bad = 1;
        }
        /* Every 50 calls the ranks agree to stop together at a failure. */
        if (n % 50 == 49)
            bad = any_rank(bad);
    }
    ASSERT_FALSE(any_rank(bad));
}

/* A root only writes: nothing holds it but the reuse of the buffers, which
 * must wait for the slowest reader of their last use -- a rank that knew
 * the others' progress from an earlier look may skip the look only while
 * that covers the buffer (node_slot_free). The last rank naps 20 ms in
 * some calls, so the root gets as far ahead as it may; a buffer rewritten
 * too early shows as a wrong value or a mismatch in the napping rank. */
TEST(NodeColl, WriterAheadOfSlowReader)
{
    int rank = world_rank(), size = world_size();
    Comm c;
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    for (size_t bytes : {size_t(64), size_t(4) << 10}) {   /* small buffers; the two big ones */
        const size_t n = bytes / 4;
        std::vector<int32_t> b(n), send(n * (size_t)size), got(n);
        for (int call = 0; call < 200; call++) {
            if (rank == size - 1 && call % 50 == 3)
                usleep(20000);
            for (size_t i = 0; i < n; i++)
                b[i] = rank == 0 ? val(0, i, call) : -1;
            ASSERT_EQ(weft_bcast(c.get(), b.data(), bytes, 0), WEFT_SUCCESS) << bytes << " B, call " << call << ": "
                                                                              << c.err();
            for (size_t i = 0; i < n; i++)
                ASSERT_EQ(b[i], val(0, i, call)) << "bcast " << bytes << " B, call " << call << ", element " << i;
            for (size_t i = 0; i < send.size(); i++)
                send[i] = val((int)(i / n), i % n, call);
            std::fill(got.begin(), got.end(), -1);
            ASSERT_EQ(weft_scatter(c.get(), rank == 0 ? send.data() : nullptr, got.data(), bytes, 0), WEFT_SUCCESS)
                << bytes << " B, call " << call << ": " << c.err();
            for (size_t i = 0; i < n; i++)
                ASSERT_EQ(got[i], val(rank, i, call)) << "scatter " << bytes << " B, call " << call << ", element " << i;
        }
    }
}

TEST(NodeColl, MismatchAcrossPaths)
{
    int rank = world_rank(), size = world_size();
    /* Both calls as messages (two virtual nodes) is the message path's
     * own case: there an allreduce of 4 against 8193 elements still
     * waits out WEFT_TIMEOUT on one rank (issue 28). */
    if (!node_path_expected(size) && !hier_path_expected(size))
        GTEST_SKIP() << "the node path is not taken here";
    /* A 16 KiB slot, so the message path's allreduce of one element more
     * sends eager messages only: a large one announced to a rank that has
     * already failed the call is answered only when that rank's pipes next
     * move (here it waits in MPI_Barrier), and cannot be withdrawn by its
     * sender (issue 28, open). */
    Comm c(Settings{{"WEFT_TIMEOUT", "30"}, {"WEFT_NODE_COLL_KB", "16"}});
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    ASSERT_EQ(weft_barrier(c.get()), WEFT_SUCCESS) << c.err();
    size_t cnt = rank == 0 ? 4 : (16 << 10) / 4 + 1;   /* 16 B against one element past the slot */
    std::vector<float> buf(cnt, 1.0f);
    auto t0 = std::chrono::steady_clock::now();
    int rc = weft_allreduce(c.get(), buf.data(), buf.data(), cnt, WEFT_FLOAT32, WEFT_SUM);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, WEFT_ERR_MISMATCH) << c.err();
    EXPECT_LT(s, 15.0) << "a mismatch must not wait for WEFT_TIMEOUT (30 s)";
    EXPECT_NE(c.err().find("allreduce(4 x float32"), std::string::npos) << c.err();
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST(NodeColl, KindMismatch)
{
    int rank = world_rank(), size = world_size();
    if (!node_path_expected(size) && !hier_path_expected(size))
        GTEST_SKIP() << "the node path is not taken here";
    Comm c(Settings{{"WEFT_TIMEOUT", "30"}});
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    ASSERT_EQ(weft_barrier(c.get()), WEFT_SUCCESS) << c.err();
    std::vector<int32_t> v(2, rank);
    int rc = rank == 0 ? weft_bcast(c.get(), v.data(), 8, 0)
                       : weft_allreduce(c.get(), v.data(), v.data(), 2, WEFT_INT32, WEFT_SUM);
    if (rank != 0) {
        EXPECT_EQ(rc, WEFT_ERR_MISMATCH) << c.err();
        EXPECT_NE(c.err().find("bcast(8 B, root 0)"), std::string::npos) << c.err();
        EXPECT_NE(c.err().find("allreduce(2 x int32, sum)"), std::string::npos) << c.err();
    }
    /* The comm goes on in step. */
    std::vector<int32_t> in(5, rank + 1), out(5, 0);
    EXPECT_EQ(weft_allreduce(c.get(), in.data(), out.data(), 5, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS) << c.err();
    for (int x : out)
        EXPECT_EQ(x, size * (size + 1) / 2);
}

/* A reduce's or gather's contributor above 1 KiB waits for every rank of
 * its node to arrive before it returns (run_call): so the rank whose call
 * is the mismatched one fails too, naming both calls -- not only the root
 * -- and a rank that is missing fails the contributors' call as well as
 * the root's, naming it. (Within 1 KiB a contributor still leaves once its
 * part is out, as with eager messages.) Across nodes a contributor sees
 * its own node only, and a head sends its node's part up the heads' tree
 * as messages (eager at this size): there only the root is asserted. */
TEST(NodeColl, ContributorsSeeTheMismatch)
{
    int rank = world_rank(), size = world_size();
    if (!node_path_expected(size) && !hier_path_expected(size))
        GTEST_SKIP() << "the node path is not taken here";
    const bool one_node = node_path_expected(size);
    const int odd = size - 1;   /* a contributor: the root is rank 0 */
    {
        Comm c(Settings{{"WEFT_TIMEOUT", "30"}});
        ASSERT_EQ(c.rc(), WEFT_SUCCESS);
        ASSERT_EQ(weft_barrier(c.get()), WEFT_SUCCESS) << c.err();
        const size_t n = 1024;   /* 4 KiB of int32: a big buffer */
        std::vector<int32_t> in(n, rank + 1), out(n, 0);
        auto t0 = std::chrono::steady_clock::now();
        int rc = weft_reduce(c.get(), in.data(), out.data(), rank == odd ? n / 2 : n, WEFT_INT32, WEFT_SUM, 0);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (one_node || rank == 0) {
            EXPECT_EQ(rc, WEFT_ERR_MISMATCH) << "reduce, rank " << rank << ": " << c.err();
            EXPECT_LT(s, 15.0) << "a mismatch must not wait for WEFT_TIMEOUT (30 s)";
        }
        if (one_node && rank == odd) {
            EXPECT_NE(c.err().find("reduce(512 x int32, sum, root 0)"), std::string::npos) << c.err();
            EXPECT_NE(c.err().find("reduce(1024 x int32, sum, root 0)"), std::string::npos) << c.err();
        }
        if (one_node) {
            /* A gather of 4 KiB blocks, the odd rank's 2 KiB (both above
             * 1 KiB: a contributor of 1 KiB would leave at once). */
            std::vector<char> blk(4096, (char)rank), all(4096 * (size_t)size);
            rc = weft_gather(c.get(), blk.data(), rank == 0 ? all.data() : nullptr, rank == odd ? 2048 : 4096, 0);
            EXPECT_EQ(rc, WEFT_ERR_MISMATCH) << "gather, rank " << rank << ": " << c.err();
            if (rank == odd) {
                EXPECT_NE(c.err().find("gather(2048 B/rank, root 0)"), std::string::npos) << c.err();
            }
        }
        /* The comm goes on in step. */
        std::vector<int32_t> a(5, rank + 1), r(5, 0);
        EXPECT_EQ(weft_allreduce(c.get(), a.data(), r.data(), 5, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS) << c.err();
        for (int x : r)
            EXPECT_EQ(x, size * (size + 1) / 2);
    }
    if (one_node) {
        /* The odd rank makes no reduce: every other rank's fails naming it. */
        Comm c(Settings{{"WEFT_TIMEOUT", "1"}});
        ASSERT_EQ(c.rc(), WEFT_SUCCESS);
        ASSERT_EQ(weft_barrier(c.get()), WEFT_SUCCESS) << c.err();
        if (rank != odd) {
            std::vector<int32_t> in(1024, rank), out(1024);
            auto t0 = std::chrono::steady_clock::now();
            int rc = weft_reduce(c.get(), in.data(), out.data(), in.size(), WEFT_INT32, WEFT_SUM, 0);
            double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            EXPECT_EQ(rc, WEFT_ERR_TIMEOUT) << "rank " << rank << ": " << c.err();
            EXPECT_NE(c.err().find("rank " + std::to_string(odd) + " (alive"), std::string::npos) << c.err();
            EXPECT_LT(s, 3.0);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

void refusal_then_exact(bool first)
{
    int rank = world_rank(), size = world_size();
    Comm c(Settings{{"WEFT_TIMEOUT", "30"}});
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    if (!first) {
        ASSERT_EQ(weft_barrier(c.get()), WEFT_SUCCESS) << c.err();
    }
    std::vector<int32_t> in(6, rank + 1), out(6, 0);
    auto t0 = std::chrono::steady_clock::now();
    /* Rank 1 passes root -1: refused on its own arguments. */
    int rc = weft_reduce(c.get(), in.data(), out.data(), 6, WEFT_INT32, WEFT_SUM, rank == 1 ? -1 : 0);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 1) {
        EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG) << c.err();
    } else if (rank == 0) {
        /* The root waits for rank 1: told it refused. (Others may be done:
         * a reduce's non-root leaves once its part is out.) */
        EXPECT_EQ(rc, WEFT_ERR_MISMATCH) << c.err();
        EXPECT_NE(c.err().find("rank 1"), std::string::npos) << c.err();
        EXPECT_LT(s, 15.0);
    }
    std::fill(out.begin(), out.end(), 0);
    EXPECT_EQ(weft_allreduce(c.get(), in.data(), out.data(), 6, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS) << c.err();
    for (int x : out)
        EXPECT_EQ(x, size * (size + 1) / 2);
    EXPECT_EQ(weft_barrier(c.get()), WEFT_SUCCESS) << c.err();
}

TEST(NodeColl, RefusedFirstKeepsStep)
{
    if (world_size() < 2)
        GTEST_SKIP() << "one rank";
    refusal_then_exact(true);
}

TEST(NodeColl, RefusedLaterKeepsStep)
{
    if (world_size() < 2)
        GTEST_SKIP() << "one rank";
    refusal_then_exact(false);
}

TEST(NodeColl, AbsentRankTimesOut)
{
    int rank = world_rank(), size = world_size();
    if (!node_path_expected(size) && !hier_path_expected(size))
        GTEST_SKIP() << "the node path is not taken here";
    Comm c(Settings{{"WEFT_TIMEOUT", "1"}});
    ASSERT_EQ(c.rc(), WEFT_SUCCESS);
    ASSERT_EQ(weft_barrier(c.get()), WEFT_SUCCESS) << c.err();
    int absent = size - 1;
    if (rank != absent) {
        auto t0 = std::chrono::steady_clock::now();
        int rc = weft_barrier(c.get());
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_EQ(rc, WEFT_ERR_TIMEOUT) << c.err();
        EXPECT_LT(s, 3.0);
        if (node_path_expected(size)) {
            EXPECT_NE(c.err().find("rank " + std::to_string(absent) + " (alive"), std::string::npos) << c.err();
            EXPECT_NE(c.err().find("did not arrive"), std::string::npos) << c.err();
        } else {
            /* Across nodes the absent rank is missed by its node's head
             * (it is not the head: "did not arrive") or, a head, by the
             * heads' messages ("is not in it"); every rank has the verdict. */
            const std::string r = "rank " + std::to_string(absent);
            EXPECT_TRUE(c.err().find(r + " is not in it") != std::string::npos ||
                        c.err().find(r + " (alive") != std::string::npos)
                << c.err();
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

} // namespace
