/*
 * Argument checks of the public calls that need no MPI: a NULL comm or
 * request is refused with WEFT_ERR_INVALID_ARG and leaves every output
 * argument as it was. (Checks that need a live comm, such as a peer out of
 * range, are in mpi_tests/test_p2p.cc, ArgumentChecks.) MPI is never
 * initialised in this process.
 */
#include <gtest/gtest.h>

#include <cstdint>
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
    size_t node_bytes = 7;
    EXPECT_EQ(weft_comm_node_coll_bytes(nullptr, &node_bytes), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(node_bytes, 7u);   /* outputs are set only on success */
    EXPECT_NE(std::string(weft_last_error()).find("weft_comm_node_coll_bytes: comm is NULL"), std::string::npos)
        << weft_last_error();
    const char *e = weft_comm_last_error(nullptr);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(weft_comm_destroy(nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_comm_async_error(nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(weft_last_error()).find("weft_comm_async_error"), std::string::npos) << weft_last_error();
    EXPECT_EQ(weft_comm_revoke(nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(weft_last_error()).find("weft_comm_revoke: comm is NULL"), std::string::npos)
        << weft_last_error();
    weft_comm_t *sentinel = reinterpret_cast<weft_comm_t *>(0x1234), *nc = sentinel;
    EXPECT_EQ(weft_comm_shrink(nullptr, &nc), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(nc, sentinel) << "output set by a failing call";
    int excl = 0;
    EXPECT_EQ(weft_comm_shrink_excluding(nullptr, &excl, 1, &nc), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(nc, sentinel) << "output set by a failing call";
    EXPECT_NE(std::string(weft_last_error()).find("weft_comm_shrink_excluding: comm is NULL"), std::string::npos)
        << weft_last_error();
}

TEST(ApiArgs, NullCommCollectives)
{
    int a = 0, b[4];
    EXPECT_EQ(weft_allgather(nullptr, &a, b, sizeof(int)), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_barrier(nullptr), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_bcast(nullptr, &a, sizeof(int), 0), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_reduce_on_stream(nullptr, &a, b, 1, WEFT_INT32, WEFT_SUM, 0, nullptr), WEFT_ERR_INVALID_ARG);
}

/* Message pipes: a NULL comm, a NULL or made-up handle is refused, never
 * followed (handles are generation-checked slots, not addresses). */
TEST(ApiArgs, MessagePipesWithoutAComm)
{
    weft_pipe_t *sentinel = reinterpret_cast<weft_pipe_t *>(0x1234);
    weft_pipe_t *pipe = sentinel;
    EXPECT_EQ(weft_pipe_open(nullptr, 0, 0, &pipe), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(pipe, sentinel) << "output set by a failing call";
    EXPECT_NE(std::string(weft_last_error()).find("weft_pipe_open"), std::string::npos) << weft_last_error();
    EXPECT_EQ(weft_progress(nullptr), WEFT_ERR_INVALID_ARG);

    char b[8] = {0};
    weft_pipe_payload_t pl = {b, sizeof(b), nullptr, 0};
    weft_pipe_message_t msg = {nullptr, 0, 1, &pl, 0, nullptr};
    weft_pipe_buffer_t buf = {b, sizeof(b)};
    weft_pipe_allocation_t alloc = {1, &buf, 0, nullptr};
    auto cb = [](weft_pipe_t *, int, const char *, void *) { ADD_FAILURE() << "callback of a refused call"; };
    auto dcb = [](weft_pipe_t *, int, const char *, const weft_pipe_descriptor_t *, void *) {
        ADD_FAILURE() << "callback of a refused call";
    };
    for (weft_pipe_t *h : {static_cast<weft_pipe_t *>(nullptr), sentinel,
                           reinterpret_cast<weft_pipe_t *>(~static_cast<uintptr_t>(0))}) {
        EXPECT_EQ(weft_pipe_write(h, &msg, cb, nullptr), WEFT_ERR_INVALID_ARG);
        EXPECT_EQ(weft_pipe_read_descriptor(h, dcb, nullptr), WEFT_ERR_INVALID_ARG);
        EXPECT_EQ(weft_pipe_read(h, &alloc, cb, nullptr), WEFT_ERR_INVALID_ARG);
        EXPECT_EQ(weft_pipe_close(h), WEFT_ERR_INVALID_ARG);
        EXPECT_EQ(weft_pipe_peer(h), -1);
        EXPECT_EQ(weft_pipe_id(h), -1);
    }
    EXPECT_NE(std::string(weft_last_error()).find("weft_pipe_close"), std::string::npos) << weft_last_error();
    EXPECT_NE(std::string(weft_strerror(WEFT_ERR_CLOSED)).find("closed"), std::string::npos);
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
