/*
 * Lazy connections (issue 15): a pair's pipe is made at its first message,
 * from either side, not at create. One suite over every transport
 * configuration (mpi_tests/CMakeLists.txt: shm, shm_nocma, tcp, vnodes2).
 *
 * Every test makes its own comms (base_comm() is MPI_COMM_NULL) because
 * what it looks at is the first message of a fresh comm. Correctness
 * checks hold for every transport; what shm leaves in this process's
 * address space (its lanes: /dev/shm/weft-<producer pid>-...-to<rank>-<gen>,
 * p2p/transport/shm/shm.c) is checked where the pipes are shm.
 *
 * The first message of a pair that fails to connect is in
 * mpi_tests/test_faults.cc (case "first": the peer died before any
 * traffic, or is stopped).
 */
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

class Lazy : public WeftMpiTest {
protected:
    MPI_Comm base_comm() override { return MPI_COMM_NULL; }

    /* Whether the pipes of this run are shm between ranks of this host. */
    static bool shm_everywhere()
    {
        const char *tp = getenv("WEFT_TRANSPORTS");
        return (tp == nullptr || std::strstr(tp, "shm") != nullptr) && getenv("WEFT_VIRTUAL_NODES") == nullptr;
    }

    weft_comm_t *fresh(const Settings &settings = {})
    {
        weft_comm_t *c = nullptr;
        std::string what;
        int rc = make_test_comm(MPI_COMM_WORLD, &c, &what, settings);
        EXPECT_EQ(rc, WEFT_SUCCESS) << what;
        return rc == WEFT_SUCCESS ? c : nullptr;
    }
};

/* One mapping of a shm lane in this process. */
struct LaneMap {
    bool ours;         /* this process produces into it (its name carries our pid) */
    int to;            /* the consumer's rank */
    int gen;
    size_t bytes;
};

std::vector<LaneMap> lane_maps()
{
    static const std::regex lane(R"(([0-9a-f]+)-([0-9a-f]+) .*/dev/shm/weft-(\d+)-[0-9a-f]+-\d+-to(\d+)-(\d+))");
    std::vector<LaneMap> v;
    std::ifstream f("/proc/self/maps");
    std::string line;
    std::smatch m;
    while (std::getline(f, line))
        if (std::regex_search(line, m, lane)) {
            LaneMap l;
            l.bytes = (size_t)(std::stoull(m[2].str(), nullptr, 16) - std::stoull(m[1].str(), nullptr, 16));
            l.ours = std::atoi(m[3].str().c_str()) == (int)getpid();
            l.to = std::atoi(m[4].str().c_str());
            l.gen = std::atoi(m[5].str().c_str());
            v.push_back(l);
        }
    return v;
}

std::string describe(const std::vector<LaneMap> &v)
{
    std::string s;
    for (const LaneMap &l : v)
        s += (s.empty() ? "" : ", ") + std::string(l.ours ? "out" : "in") + " to " + std::to_string(l.to) + " gen " +
             std::to_string(l.gen) + " (" + std::to_string(l.bytes >> 10) + " KiB)";
    return s.empty() ? "none" : s;
}

/* Sends bytes to `to` and receives as many from `from`, verified. */
void exchange(weft_comm_t *c, int to, int from, size_t bytes, int tag)
{
    const int me = weft_comm_rank(c);
    std::vector<unsigned char> out(bytes), in(bytes);
    fill_pattern(out.data(), bytes, pattern_seed(me, tag, bytes));
    weft_request_t *rq[2];
    ASSERT_EQ(weft_irecv(c, in.data(), bytes, from, tag, &rq[0]), WEFT_SUCCESS) << weft_comm_last_error(c);
    ASSERT_EQ(weft_isend(c, out.data(), bytes, to, tag, &rq[1]), WEFT_SUCCESS) << weft_comm_last_error(c);
    ASSERT_EQ(weft_waitall(2, rq, nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
    EXPECT_TRUE(HasPattern(in.data(), bytes, from, tag, bytes)) << "from rank " << from;
}

/* Create and destroy with no traffic: no lane anywhere. */
TEST_F(Lazy, CreateAndDestroyWithNoTrafficMakesNoLane)
{
    for (int i = 0; i < 3; i++) {
        weft_comm_t *c = fresh();
        ASSERT_NE(c, nullptr);
        MPI_Barrier(MPI_COMM_WORLD);
        EXPECT_TRUE(lane_maps().empty()) << "lanes after create: " << describe(lane_maps());
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
    EXPECT_TRUE(lane_maps().empty()) << "lanes after destroy: " << describe(lane_maps());
}

/* Every pair's first message in both directions at once: each rank sends
 * to every peer before receiving from any, on a fresh comm, with an eager
 * first message and (on another fresh comm) a rendezvous one. */
TEST_F(Lazy, FirstMessageInBothDirectionsAtOnce)
{
    for (size_t bytes : {(size_t)100, (size_t)(1u << 20) + 3}) {
        weft_comm_t *c = fresh();
        ASSERT_NE(c, nullptr);
        const int tag = 11;
        std::vector<std::vector<unsigned char>> out((size_t)size), in((size_t)size);
        std::vector<weft_request_t *> rq;
        for (int p = 0; p < size; p++) {
            if (p == rank)
                continue;
            out[(size_t)p].resize(bytes);
            fill_pattern(out[(size_t)p].data(), bytes, pattern_seed(rank, tag, (uint64_t)p));
            weft_request_t *r = nullptr;
            ASSERT_EQ(weft_isend(c, out[(size_t)p].data(), bytes, p, tag, &r), WEFT_SUCCESS)
                << weft_comm_last_error(c);
            rq.push_back(r);
        }
        for (int p = 0; p < size; p++) {
            if (p == rank)
                continue;
            in[(size_t)p].resize(bytes);
            weft_request_t *r = nullptr;
            ASSERT_EQ(weft_irecv(c, in[(size_t)p].data(), bytes, p, tag, &r), WEFT_SUCCESS)
                << weft_comm_last_error(c);
            rq.push_back(r);
        }
        ASSERT_EQ(weft_waitall((int)rq.size(), rq.data(), nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
        for (int p = 0; p < size; p++) {
            if (p != rank) {
                EXPECT_TRUE(HasPattern(in[(size_t)p].data(), bytes, p, tag, (uint64_t)rank))
                    << bytes << " B from rank " << p;
            }
        }
        if (shm_everywhere()) {
            /* a lane out and a lane in per peer (of one or more generations:
             * without CMA the large messages go through the rings and grow them) */
            std::set<int> outs, ins;
            for (const LaneMap &l : lane_maps())
                (l.ours ? outs : ins).insert(l.to);
            EXPECT_EQ((int)outs.size(), size - 1) << describe(lane_maps());
            EXPECT_EQ((int)ins.size(), 1) << describe(lane_maps());
            EXPECT_EQ(ins.count(rank), 1u) << describe(lane_maps());
        }
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
}

/* A collective as the very first operation of a comm: its messages make
 * the pipes, on ranks that are all inside the collective. */
TEST_F(Lazy, FirstMessageInsideACollective)
{
    {
        weft_comm_t *c = fresh();
        ASSERT_NE(c, nullptr);
        const size_t block = 3000;
        std::vector<unsigned char> out(block), in(block * (size_t)size);
        fill_pattern(out.data(), block, pattern_seed(rank, 21, 0));
        ASSERT_EQ(weft_allgather(c, out.data(), in.data(), block), WEFT_SUCCESS) << weft_comm_last_error(c);
        for (int p = 0; p < size; p++)
            EXPECT_TRUE(HasPattern(in.data() + (size_t)p * block, block, p, 21, 0)) << "block of rank " << p;
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
    {
        weft_comm_t *c = fresh();
        ASSERT_NE(c, nullptr);
        const size_t count = 100000;   /* 400 KB: the large-message algorithms */
        std::vector<int32_t> out(count), in(count);
        for (size_t i = 0; i < count; i++)
            out[i] = (int32_t)(i % 1000) + rank;
        ASSERT_EQ(weft_allreduce(c, out.data(), in.data(), count, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS)
            << weft_comm_last_error(c);
        const int32_t ranks_sum = size * (size - 1) / 2;
        size_t wrong = 0;
        for (size_t i = 0; i < count; i++)
            wrong += in[i] != (int32_t)(i % 1000) * size + ranks_sum;
        EXPECT_EQ(wrong, 0u);
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
    {
        weft_comm_t *c = fresh();
        ASSERT_NE(c, nullptr);
        const int root = size - 1;
        std::vector<unsigned char> buf(70000);
        if (rank == root)
            fill_pattern(buf.data(), buf.size(), pattern_seed(root, 23, 0));
        ASSERT_EQ(weft_bcast(c, buf.data(), buf.size(), root), WEFT_SUCCESS) << weft_comm_last_error(c);
        EXPECT_TRUE(HasPattern(buf.data(), buf.size(), root, 23, 0));
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
}

/* The last rank takes part in nothing but create and destroy; the others
 * talk in a ring among themselves. Nobody makes a lane toward it, and it
 * makes none. */
TEST_F(Lazy, APeerThatNeverSends)
{
    if (size < 3)
        GTEST_SKIP() << "needs 3 ranks";
    weft_comm_t *c = fresh();
    ASSERT_NE(c, nullptr);
    const int idle = size - 1, n = size - 1;
    if (rank != idle) {
        for (size_t bytes : {(size_t)64, (size_t)(300u << 10)})
            exchange(c, (rank + 1) % n, (rank + n - 1) % n, bytes, 31);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (shm_everywhere()) {
        for (const LaneMap &l : lane_maps()) {
            EXPECT_NE(l.to, idle) << "a lane toward the idle rank: " << describe(lane_maps());
            if (rank == idle)
                ADD_FAILURE() << "the idle rank maps a lane: " << describe(lane_maps());
        }
    }
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

/* Shared memory of a rank that talks to its two ring neighbours: at most
 * 4 MiB of lanes it produces into (issue 15's target at np 16), also
 * after streaming enough to grow them to WEFT_SHM_RING_KB. */
TEST_F(Lazy, TwoNeighboursCostAtMostFourMiBOfLanes)
{
    if (!shm_everywhere() || size < 3)
        GTEST_SKIP() << "shm lanes between 3 or more ranks only";
    weft_comm_t *c = fresh();
    ASSERT_NE(c, nullptr);
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int i = 0; i < 40; i++) {
        exchange(c, right, left, 32u << 10, 41);
        exchange(c, left, right, 32u << 10, 42);
    }
    size_t ours = 0;
    for (const LaneMap &l : lane_maps())
        if (l.ours)
            ours += l.bytes;
    EXPECT_LE(ours, (size_t)4 << 20) << describe(lane_maps());
    EXPECT_GT(ours, 0u);
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

/* A lane whose producer keeps finding it full grows (a new generation of
 * a bigger ring), and every message still arrives in order and intact;
 * with WEFT_SHM_BUDGET_MB=0 it never grows and the same traffic passes. */
TEST_F(Lazy, BusyLaneGrowsWithinTheBudget)
{
    if (!shm_everywhere() || size < 2)
        GTEST_SKIP() << "shm lanes only";
    for (const char *budget : {"64", "0"}) {
        weft_comm_t *c = fresh({{"WEFT_SHM_BUDGET_MB", budget}});
        ASSERT_NE(c, nullptr);
        /* rank 0 floods rank 1 with eager messages it receives late */
        const int n = 400;
        const size_t bytes = 2000;
        if (rank == 0) {
            std::vector<std::vector<unsigned char>> out(n, std::vector<unsigned char>(bytes));
            std::vector<weft_request_t *> rq(n);
            for (int i = 0; i < n; i++) {
                fill_pattern(out[(size_t)i].data(), bytes, pattern_seed(0, 51, (uint64_t)i));
                ASSERT_EQ(weft_isend(c, out[(size_t)i].data(), bytes, 1, 51, &rq[(size_t)i]), WEFT_SUCCESS)
                    << weft_comm_last_error(c);
            }
            ASSERT_EQ(weft_waitall(n, rq.data(), nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
        } else if (rank == 1) {
            usleep(200000);   /* the sender fills the first ring meanwhile */
            std::vector<unsigned char> in(bytes);
            for (int i = 0; i < n; i++) {
                ASSERT_EQ(weft_recv(c, in.data(), bytes, 0, 51, nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
                ASSERT_TRUE(HasPattern(in.data(), bytes, 0, 51, (uint64_t)i)) << "message " << i;
            }
        }
        MPI_Barrier(MPI_COMM_WORLD);
        int max_gen = -1;
        for (const LaneMap &l : lane_maps())
            if (l.ours && l.to == 1)
                max_gen = std::max(max_gen, l.gen);
        if (rank == 0) {
            if (std::strcmp(budget, "0") == 0)
                EXPECT_EQ(max_gen, 0) << "grew with WEFT_SHM_BUDGET_MB=0: " << describe(lane_maps());
            else
                EXPECT_GE(max_gen, 1) << "the busy lane did not grow: " << describe(lane_maps());
        }
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
}

} // namespace
