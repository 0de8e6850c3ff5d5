/*
 * weft_barrier and weft_bcast over whatever transports the ctest entry
 * selects. The barrier's ordering is checked through a side channel that is
 * not weft: every rank takes CLOCK_MONOTONIC (one clock for all processes of
 * a node) when it enters and when it leaves, and MPI gathers the stamps: no
 * rank may leave before the last one entered. Every buffer weft reads or
 * writes is a TestBuf (weft_test_mem.h): host or, under WEFT_TEST_MEM=device,
 * CUDA device memory.
 */
#include <gtest/gtest.h>
#include <mpi.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"
#include "weft_test_mem.h"

using namespace weft_mpitest;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

double mono_now()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

class Barrier : public WeftMpiTest {};
class Bcast : public WeftMpiTest {};

/* The late rank changes every round (and is never always the highest), and
 * ranks arrive staggered; every rank must leave after the last arrival. */
TEST_F(Barrier, NoRankLeavesBeforeAllArrive)
{
    const int rounds = size >= 8 ? 4 : 6;
    for (int round = 0; round < rounds; round++) {
        int late = (round * 3 + 1) % size;
        /* Everyone is a little staggered; the late rank sleeps clearly longest. */
        int delay_ms = rank == late ? 60 : 3 * ((rank + round) % size);
        usleep((useconds_t)delay_ms * 1000);
        double t_in = mono_now();
        int rc = weft_barrier(comm);
        double t_out = mono_now();
        ASSERT_EQ(rc, WEFT_SUCCESS) << last_error();
        std::vector<double> ins((size_t)size), outs((size_t)size);
        MPI_Allgather(&t_in, 1, MPI_DOUBLE, ins.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
        MPI_Allgather(&t_out, 1, MPI_DOUBLE, outs.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
        double last_in = *std::max_element(ins.begin(), ins.end());
        for (int r = 0; r < size; r++)
            ASSERT_GE(outs[(size_t)r], last_in)
                << "round " << round << ": rank " << r << " left the barrier "
                << (last_in - outs[(size_t)r]) * 1e3 << " ms before rank " << late << " entered it";
    }
}

/* Many barriers back to back: no lost or crossed signals between rounds. */
TEST_F(Barrier, ManyInARow)
{
    const int n = size >= 8 ? 200 : 1000;
    for (int i = 0; i < n; i++)
        ASSERT_EQ(weft_barrier(comm), WEFT_SUCCESS) << "barrier " << i << ": " << last_error();
}

TEST_F(Barrier, NullComm)
{
    EXPECT_EQ(weft_barrier(nullptr), WEFT_ERR_INVALID_ARG);
}

std::vector<size_t> bcast_sizes(int size)
{
    /* Around the tree/scatter-ring switch (256 KiB), odd sizes that do not
     * split evenly into n pieces, and sizes smaller than n. */
    std::vector<size_t> s = {0, 1, 3, 8, 1000, 4096, 65537, 256 * KiB - 1, 256 * KiB, 1 * MiB + 3};
    if (size <= 4 && !reduced_sizes())
        s.push_back(16 * MiB + 1);
    return s;
}

/* Every root, every size; every byte of the result checked on every rank. */
TEST_F(Bcast, FromEveryRoot)
{
    uint64_t call = 0;
    for (size_t bytes : bcast_sizes(size)) {
        for (int root = 0; root < size; root++, call++) {
            TestBuf buf(bytes, TestBuf::kGuarded, call % 4);
            ASSERT_TRUE(buf.ok()) << buf.error();
            if (rank == root)
                buf.fill_pattern(pattern_seed(root, 7, call));
            int rc = weft_bcast(comm, bytes ? buf.data() : nullptr, bytes, root);
            ASSERT_EQ(rc, WEFT_SUCCESS) << "bytes " << bytes << " root " << root << ": " << last_error();
            ASSERT_TRUE(buf.HasPattern(bytes, root, 7, call)) << "bytes " << bytes << " root " << root;
            ASSERT_TRUE(buf.GuardsIntact()) << "bytes " << bytes << " root " << root;
        }
    }
}

/* Broadcasts from different roots with different sizes, interleaved with
 * allgathers, with no barrier in between; checked at the end. */
TEST_F(Bcast, BackToBackMixedWithAllgather)
{
    const std::vector<size_t> seq = {5, 300 * KiB + 7, 1, 4096, 1 * MiB + 1, 0, 77};
    std::vector<std::unique_ptr<TestBuf>> bufs, gathers;
    for (size_t i = 0; i < seq.size(); i++) {
        size_t bytes = seq[i];
        int root = (int)((i * 5 + 2) % (size_t)size);
        bufs.emplace_back(new TestBuf(bytes, TestBuf::kGuarded));
        ASSERT_TRUE(bufs.back()->ok()) << bufs.back()->error();
        if (rank == root)
            bufs.back()->fill_pattern(pattern_seed(root, 9, i));
        ASSERT_EQ(weft_bcast(comm, bufs.back()->data(), bytes, root), WEFT_SUCCESS) << last_error();
        /* An allgather of a small block right behind it. */
        gathers.emplace_back(new TestBuf(16 * (size_t)size, TestBuf::kGuarded));
        ASSERT_TRUE(gathers.back()->ok()) << gathers.back()->error();
        unsigned char *g = gathers.back()->data();
        gathers.back()->fill_pattern_at((size_t)rank * 16, 16, pattern_seed(rank, 11, i));
        ASSERT_EQ(weft_allgather(comm, g + (size_t)rank * 16, g, 16), WEFT_SUCCESS) << last_error();
    }
    for (size_t i = 0; i < seq.size(); i++) {
        int root = (int)((i * 5 + 2) % (size_t)size);
        ASSERT_TRUE(bufs[i]->HasPattern(seq[i], root, 9, i)) << "bcast " << i << " root " << root;
        for (int r = 0; r < size; r++)
            ASSERT_TRUE(gathers[i]->HasPatternAt((size_t)r * 16, 16, r, 11, i)) << "allgather " << i;
    }
}

TEST_F(Bcast, ArgumentChecks)
{
    TestBuf buf(64);
    ASSERT_TRUE(buf.ok()) << buf.error();
    EXPECT_EQ(weft_bcast(nullptr, buf.data(), 64, 0), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_bcast(comm, buf.data(), 64, -1), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("root -1"), std::string::npos) << last_error();
    EXPECT_EQ(weft_bcast(comm, buf.data(), 64, size), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("root " + std::to_string(size)), std::string::npos) << last_error();
    EXPECT_NE(last_error().find("rank " + std::to_string(rank)), std::string::npos) << last_error();
    EXPECT_EQ(weft_bcast(comm, nullptr, 64, 0), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("buf is NULL"), std::string::npos) << last_error();
    EXPECT_EQ(weft_bcast(comm, nullptr, 0, 0), WEFT_SUCCESS) << last_error();
    EXPECT_EQ(weft_barrier(comm), WEFT_SUCCESS) << last_error();
}

} // namespace
