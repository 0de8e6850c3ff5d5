/*
 * Argument checks of the public calls that need no MPI: a NULL comm or
 * request is refused with WEFT_ERR_INVALID_ARG and leaves every output
 * argument as it was. (Checks that need a live comm, such as a peer out of
 * range, are in mpi_tests/test_p2p.cc, ArgumentChecks.) MPI is never
 * initialised in this process.
 */
#include <gtest/gtest.h>

#include <string>

#include "weft.h"

namespace {

TEST(ApiArgs, NullCommPointToPoint)
{
    char buf[4] = {0};
    weft_request_t *sentinel = reinterpret_cast<weft_request_t *>(0x1234);
    weft_request_t *req = sentinel;
    EXPECT_EQ(weft_isend(nullptr, buf, 4, 0, 0, &req), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(req, sentinel) << "output set by a failing call";
    EXPECT_EQ(weft_irecv(nullptr, buf, 4, 0, 0, &req), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(req, sentinel) << "output set by a failing call";
    EXPECT_EQ(weft_send(nullptr, buf, 4, 0, 0), WEFT_ERR_INVALID_ARG);
    weft_status_t st = {77, 7, 7, 7};
    EXPECT_EQ(weft_recv(nullptr, buf, 4, 0, 0, &st), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(st.bytes, 77u) << "status written by a failing call";
    /* Zero bytes with a NULL buffer is fine; the NULL comm is still not. */
    EXPECT_EQ(weft_isend(nullptr, nullptr, 0, 0, 0, &req), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_irecv(nullptr, nullptr, 0, 0, 0, &req), WEFT_ERR_INVALID_ARG);
    /* Everything wrong at once: still a clean refusal. */
    EXPECT_EQ(weft_isend(nullptr, nullptr, 4, -1, -1, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_irecv(nullptr, nullptr, 4, -1, -1, nullptr), WEFT_ERR_INVALID_ARG);
}

TEST(ApiArgs, NullRequests)
{
    int done = 42;
    weft_status_t st = {77, 7, 7, 7};
    EXPECT_EQ(weft_test(nullptr, &done, &st), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(done, 42) << "done written by a failing call";
    EXPECT_EQ(st.bytes, 77u);
    EXPECT_EQ(weft_test(nullptr, nullptr, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_wait(nullptr, &st), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(st.bytes, 77u);
    EXPECT_EQ(weft_wait(nullptr, nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_waitall(3, nullptr, nullptr), WEFT_ERR_INVALID_ARG);
    /* Nothing to wait for is not an error. */
    EXPECT_EQ(weft_waitall(0, nullptr, nullptr), WEFT_SUCCESS);
}

TEST(ApiArgs, NullCommQueries)
{
    EXPECT_EQ(weft_comm_rank(nullptr), -1);
    EXPECT_EQ(weft_comm_size(nullptr), -1);
    const char *e = weft_comm_last_error(nullptr);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(weft_comm_destroy(nullptr), WEFT_ERR_INVALID_ARG);
}

TEST(ApiArgs, NullCommCollectives)
{
    int a = 0, b[4];
    EXPECT_EQ(weft_allgather(nullptr, &a, b, sizeof(int)), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_barrier(nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_bcast(nullptr, &a, sizeof(int), 0), WEFT_ERR_INVALID_ARG);
}

TEST(ApiArgs, CommCreate)
{
    /* No output pointer: refused before MPI is looked at. */
    EXPECT_EQ(weft_comm_create(MPI_COMM_WORLD, nullptr), WEFT_ERR_INVALID_ARG);
    /* MPI not initialised in this process: an MPI error, and no comm. */
    weft_comm_t *sentinel = reinterpret_cast<weft_comm_t *>(0x1234);
    weft_comm_t *c = sentinel;
    EXPECT_EQ(weft_comm_create(MPI_COMM_WORLD, &c), WEFT_ERR_MPI);
    EXPECT_EQ(c, sentinel) << "output set by a failing call";
}

} // namespace
