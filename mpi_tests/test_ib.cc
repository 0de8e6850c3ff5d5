/*
 * The ib transport over the emulated verbs device (tests/emu/verbs): what
 * WEFT_DEBUG=info says about it, what happens when it is absent, and how a
 * failed work request is reported and contained. The ctest entries
 * (mpi_tests/CMakeLists.txt) set the environment each test needs:
 *
 *   IbInfo.*     WEFT_DEBUG=info, two virtual nodes, shm,ib
 *   IbAbsent.*   WEFT_DEBUG=info, WEFT_IB_HCA=nosuchdev, shm,tcp,ib
 *   IbFault.*    three virtual nodes (every pair on ib), the emulator's
 *                fault knobs on rank 0 (WEFT_EMU_VERBS_FAULT_RANK=0 and
 *                FAIL_WR=n or DROP_AFTER=n), short retry and WEFT_TIMEOUT
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

/* The effective node of rank r under WEFT_VIRTUAL_NODES=k (all ranks on one
 * host): the same contiguous blocks weft uses. */
int vnode_of(int r, int size)
{
    int k = std::atoi(env_or("WEFT_VIRTUAL_NODES", "1"));
    if (k < 1)
        k = 1;
    if (k > size)
        k = size;
    return (int)(((long long)r * k) / size);
}

std::vector<unsigned char> patterned(size_t n, int sender, int tag)
{
    std::vector<unsigned char> v(n);
    fill_pattern(v.data(), n, pattern_seed(sender, tag, 0));
    return v;
}

/* One exchange both ways with peer (eager and rendezvous sizes). */
void exchange_ok(weft_comm_t *comm, int rank, int peer, int tag)
{
    const size_t sizes[] = { 100, 200 << 10 };
    for (size_t n : sizes) {
        std::vector<unsigned char> out = patterned(n, rank, tag), in(n);
        weft_request_t *reqs[2];
        weft_status_t st[2];
        ASSERT_EQ(weft_irecv(comm, in.data(), n, peer, tag, &reqs[0]), WEFT_SUCCESS) << weft_comm_last_error(comm);
        ASSERT_EQ(weft_isend(comm, out.data(), n, peer, tag, &reqs[1]), WEFT_SUCCESS) << weft_comm_last_error(comm);
        ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS)
            << "rank " << rank << " <-> " << peer << ", " << n << " bytes: " << weft_comm_last_error(comm);
        EXPECT_TRUE(HasPattern(in.data(), n, peer, tag, 0)) << "from peer " << peer << ", " << n << " bytes";
    }
}

/* Polls req (weft_test) until it completes or every rank reached the
 * barrier req_barrier; a rank that must not block on its own request uses
 * this so a peer can finish its part first. Returns the request's error,
 * or -1 if it was still pending (then it is left to the comm). */
int test_until_barrier(weft_request_t *req, MPI_Request *barrier)
{
    int done = 0, bdone = 0;
    weft_status_t st;
    for (;;) {
        if (!done) {
            EXPECT_EQ(weft_test(req, &done, &st), WEFT_SUCCESS);
            if (done)
                return st.error;
        }
        MPI_Test(barrier, &bdone, MPI_STATUS_IGNORE);
        if (bdone)
            return -1;
        usleep(100);
    }
}

/* ---------------------------------------------------------------- info */

/* WEFT_DEBUG=info at create names ib for every peer on the other node. */
TEST(IbInfo, CreateLogsIbForPeersOnOtherNodes)
{
    const int rank = world_rank(), size = world_size();
    weft_comm_t *comm = nullptr;
    int rc = WEFT_ERR_INTERNAL;
    std::string log = capture_stderr([&] { rc = weft_comm_create(MPI_COMM_WORLD, &comm); });
    ASSERT_EQ(rc, WEFT_SUCCESS) << log;
    for (int peer = 0; peer < size; peer++) {
        if (peer == rank || vnode_of(peer, size) == vnode_of(rank, size))
            continue;
        std::string want = "peer " + std::to_string(peer) + ": transport ib (other node, ib";
        EXPECT_NE(log.find(want), std::string::npos) << "no '" << want << "' in:\n" << log;
    }
    EXPECT_NE(log.find("ib: offering"), std::string::npos) << log;
    EXPECT_EQ(weft_comm_destroy(comm), WEFT_SUCCESS);
    EXPECT_FALSE(any_rank(::testing::Test::HasFailure()));
}

/* ---------------------------------------------------------------- absent */

/* WEFT_IB_HCA names no port: ib is not offered, one info line says why,
 * and the pairs across nodes use tcp. */
TEST(IbAbsent, NoMatchingHcaFallsBackToTcp)
{
    const int rank = world_rank(), size = world_size();
    weft_comm_t *comm = nullptr;
    int rc = WEFT_ERR_INTERNAL;
    std::string log = capture_stderr([&] { rc = weft_comm_create(MPI_COMM_WORLD, &comm); });
    ASSERT_EQ(rc, WEFT_SUCCESS) << log;
    const std::string why = "ib: not offered: WEFT_IB_HCA=" + std::string(env_or("WEFT_IB_HCA", "")) +
                            " matches no ACTIVE port";
    size_t at = log.find(why);
    EXPECT_NE(at, std::string::npos) << "no '" << why << "' in:\n" << log;
    if (at != std::string::npos) {
        EXPECT_EQ(log.find("ib: not offered", at + 1), std::string::npos) << "more than one line:\n" << log;
    }
    for (int peer = 0; peer < size; peer++) {
        if (peer == rank || vnode_of(peer, size) == vnode_of(rank, size))
            continue;
        std::string want = "peer " + std::to_string(peer) + ": transport tcp";
        EXPECT_NE(log.find(want), std::string::npos) << "no '" << want << "' in:\n" << log;
        exchange_ok(comm, rank, peer, 5);
    }
    EXPECT_EQ(weft_comm_destroy(comm), WEFT_SUCCESS);
    EXPECT_FALSE(any_rank(::testing::Test::HasFailure()));
}

/* ---------------------------------------------------------------- faults */

class IbFault : public WeftMpiTest {};

/* WEFT_EMU_VERBS_FAIL_WR=n on rank 0: rank 0's first sends go to rank 1,
 * so its n-th send work request (1: the RTS frame, 2: the RDMA write) fails.
 * The rendezvous send fails with WEFT_ERR_TRANSPORT naming peer 1 and the
 * verbs status; rank 1 learns of it (its own traffic to rank 0 fails, or
 * its wait times out); every other pair keeps working. */
TEST_F(IbFault, FailedWorkRequestBreaksOnlyThatPeer)
{
    if (size < 3)
        GTEST_SKIP() << "needs 3 ranks";
    const size_t big = 256 << 10;   /* rendezvous at any WEFT_IB_EAGER */
    MPI_Request barrier;

    /* Phase 1: 0 -> 1 fails on rank 0. */
    if (rank == 0) {
        std::vector<unsigned char> out = patterned(big, 0, 1);
        ASSERT_EQ(weft_send(comm, out.data(), big, 1, 1), WEFT_ERR_TRANSPORT) << last_error();
        std::string err = last_error();
        EXPECT_NE(err.find("ib: peer 1 "), std::string::npos) << err;
        EXPECT_NE(err.find("transport retry counter exceeded"), std::string::npos) << err;
        EXPECT_NE(err.find("work request failed"), std::string::npos) << err;
        MPI_Ibarrier(MPI_COMM_WORLD, &barrier);
        MPI_Wait(&barrier, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
        std::vector<unsigned char> in(big);
        weft_request_t *r;
        ASSERT_EQ(weft_irecv(comm, in.data(), big, 0, 1, &r), WEFT_SUCCESS);
        MPI_Ibarrier(MPI_COMM_WORLD, &barrier);
        int err = test_until_barrier(r, &barrier);
        /* Phase 2: rank 1 talks to rank 0, whose QP is in error: its send
         * fails at the transport, which breaks the pipe and fails the
         * receive too (or WEFT_TIMEOUT ends it). */
        if (err == -1) {
            char b = 1;
            weft_request_t *s = nullptr;
            int src = weft_isend(comm, &b, 1, 0, 2, &s);
            if (src == WEFT_SUCCESS) {
                weft_status_t st;
                int wrc = weft_wait(r, &st);
                EXPECT_TRUE(wrc == WEFT_ERR_TRANSPORT || wrc == WEFT_ERR_TIMEOUT) << weft_strerror(wrc);
                weft_wait(s, nullptr);
            } else {
                EXPECT_EQ(src, WEFT_ERR_TRANSPORT);
                weft_wait(r, nullptr);
            }
        } else {
            EXPECT_TRUE(err == WEFT_ERR_TRANSPORT || err == WEFT_ERR_TIMEOUT) << weft_strerror(err);
        }
        std::string e = last_error();
        EXPECT_NE(e.find("peer 0"), std::string::npos) << e;
    } else {
        MPI_Ibarrier(MPI_COMM_WORLD, &barrier);
        MPI_Wait(&barrier, MPI_STATUS_IGNORE);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (HasFatalFailure())
        return;

    /* Phase 3: every pair but (0, 1) still works. */
    for (int peer = 0; peer < size; peer++) {
        if (peer == rank || (rank <= 1 && peer <= 1))
            continue;
        exchange_ok(comm, rank, peer, 10);
    }
    /* The broken pipe refuses new work at once. */
    if (rank <= 1) {
        char b = 0;
        weft_request_t *r = nullptr;
        EXPECT_NE(weft_isend(comm, &b, 1, 1 - rank, 3, &r), WEFT_SUCCESS);
    }
}

/* WEFT_EMU_VERBS_DROP_AFTER=1 on rank 0: rank 0 sends one small message
 * to every peer; after the first, its HCA leaves the fabric. The peers'
 * traffic to rank 0 then fails with a transport error naming peer 0
 * (transport retries exhausted), and ranks 1.. keep talking to each other. */
TEST_F(IbFault, DroppedHcaFailsOnlyItsPeers)
{
    if (size < 3)
        GTEST_SKIP() << "needs 3 ranks";
    const size_t big = 256 << 10;
    if (rank == 0) {
        char b = 7;
        for (int peer = 1; peer < size; peer++) {
            weft_request_t *r = nullptr;
            /* Eager: complete once posted, whatever becomes of it. */
            if (weft_isend(comm, &b, 1, peer, 4, &r) == WEFT_SUCCESS)
                weft_wait(r, nullptr);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank != 0) {
        std::vector<unsigned char> out = patterned(big, rank, 4);
        int rc = weft_send(comm, out.data(), big, 0, 5);
        EXPECT_EQ(rc, WEFT_ERR_TRANSPORT) << weft_strerror(rc) << ": " << last_error();
        std::string e = last_error();
        EXPECT_NE(e.find("ib: peer 0 "), std::string::npos) << e;
        EXPECT_NE(e.find("transport retry counter exceeded"), std::string::npos) << e;
        for (int peer = 1; peer < size; peer++)
            if (peer != rank)
                exchange_ok(comm, rank, peer, 11);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
