/*
 * The public stream-ordered calls: argument checks (check.c), then the
 * stream engine of the comm (src/stream/stream.h). Groups are per host
 * thread and belong to no comm.
 */
#include "check.h"
#include "coll.h"
#include "log.h"
#include "comm.h"
#include "stream.h"
#include "weft.h"

int weft_send_on_stream(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream)
{
    int rc = weft_check_p2p(c, buf, bytes, peer, tag, WEFT_CHECK_NO_REQ, "weft_send_on_stream");
    if (rc == WEFT_SUCCESS)
        rc = weft_check_live(c, "weft_send_on_stream");
    return rc != WEFT_SUCCESS ? rc : weft_stream_send(c->stream, buf, bytes, peer, tag, stream);
}

int weft_recv_on_stream(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream)
{
    int rc = weft_check_p2p(c, buf, bytes, peer, tag, WEFT_CHECK_NO_REQ, "weft_recv_on_stream");
    if (rc == WEFT_SUCCESS)
        rc = weft_check_live(c, "weft_recv_on_stream");
    return rc != WEFT_SUCCESS ? rc : weft_stream_recv(c->stream, buf, bytes, peer, tag, stream);
}

int weft_allgather_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                             struct CUstream_st *stream)
{
    int rc = weft_check_allgather(c, sendbuf, recvbuf, bytes_per_rank, "weft_allgather_on_stream");
    if (rc == WEFT_SUCCESS)
        rc = weft_check_live(c, "weft_allgather_on_stream");
    return rc != WEFT_SUCCESS ? rc : weft_stream_allgather(c->stream, sendbuf, recvbuf, bytes_per_rank, stream);
}

static int stream_coll(weft_comm_t *c, const struct weft_coll_args *a, struct CUstream_st *stream, const char *fn)
{
    int rc = weft_check_live(c, fn);
    return rc != WEFT_SUCCESS ? rc : weft_stream_coll(c->stream, a, stream);
}

int weft_allreduce_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                             weft_op_t op, struct CUstream_st *stream)
{
    const char *fn = "weft_allreduce_on_stream";
    int rc = weft_check_reduce(c, WEFT_COLL_ALLREDUCE, sendbuf, recvbuf, count, (int)dtype, (int)op, -1, fn);
    struct weft_coll_args a = { WEFT_COLL_ALLREDUCE, sendbuf, recvbuf, count, (int)dtype, (int)op, -1, NULL, NULL };
    return rc != WEFT_SUCCESS ? rc : stream_coll(c, &a, stream, fn);
}

int weft_reduce_scatter_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                  weft_dtype_t dtype, weft_op_t op, struct CUstream_st *stream)
{
    const char *fn = "weft_reduce_scatter_on_stream";
    int rc = weft_check_reduce(c, WEFT_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, (int)dtype, (int)op, -1, fn);
    struct weft_coll_args a = { WEFT_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, (int)dtype, (int)op, -1, NULL,
                                NULL };
    return rc != WEFT_SUCCESS ? rc : stream_coll(c, &a, stream, fn);
}

int weft_bcast_on_stream(weft_comm_t *c, void *buf, size_t bytes, int root, struct CUstream_st *stream)
{
    const char *fn = "weft_bcast_on_stream";
    int rc = weft_check_bcast(c, buf, bytes, root, fn);
    struct weft_coll_args a = { WEFT_COLL_BCAST, NULL, buf, bytes, -1, -1, root, NULL, NULL };
    return rc != WEFT_SUCCESS ? rc : stream_coll(c, &a, stream, fn);
}

int weft_alltoall_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                            struct CUstream_st *stream)
{
    const char *fn = "weft_alltoall_on_stream";
    int rc = weft_check_alltoall(c, sendbuf, recvbuf, bytes_per_rank, fn);
    struct weft_coll_args a = { WEFT_COLL_ALLTOALL, sendbuf, recvbuf, bytes_per_rank, -1, -1, -1, NULL, NULL };
    return rc != WEFT_SUCCESS ? rc : stream_coll(c, &a, stream, fn);
}

int weft_reduce_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                          weft_op_t op, int root, struct CUstream_st *stream)
{
    const char *fn = "weft_reduce_on_stream";
    int rc = weft_check_reduce(c, WEFT_COLL_REDUCE, sendbuf, recvbuf, count, (int)dtype, (int)op, root, fn);
    struct weft_coll_args a = { WEFT_COLL_REDUCE, sendbuf, recvbuf, count, (int)dtype, (int)op, root, NULL, NULL };
    return rc != WEFT_SUCCESS ? rc : stream_coll(c, &a, stream, fn);
}

int weft_gather_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root,
                          struct CUstream_st *stream)
{
    const char *fn = "weft_gather_on_stream";
    int rc = weft_check_rooted(c, WEFT_COLL_GATHER, sendbuf, recvbuf, bytes_per_rank, root, fn);
    struct weft_coll_args a = { WEFT_COLL_GATHER, sendbuf, recvbuf, bytes_per_rank, -1, -1, root, NULL, NULL };
    return rc != WEFT_SUCCESS ? rc : stream_coll(c, &a, stream, fn);
}

int weft_scatter_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root,
                           struct CUstream_st *stream)
{
    const char *fn = "weft_scatter_on_stream";
    int rc = weft_check_rooted(c, WEFT_COLL_SCATTER, sendbuf, recvbuf, bytes_per_rank, root, fn);
    struct weft_coll_args a = { WEFT_COLL_SCATTER, sendbuf, recvbuf, bytes_per_rank, -1, -1, root, NULL, NULL };
    return rc != WEFT_SUCCESS ? rc : stream_coll(c, &a, stream, fn);
}

/* The engine copies the arrays at the call (weft_coll_prepare): the op
 * starts later, on its thread, when the caller may have reused them. */
int weft_alltoallv_on_stream(weft_comm_t *c, const void *sendbuf, const size_t *send_bytes,
                             const size_t *send_displs, void *recvbuf, const size_t *recv_bytes,
                             const size_t *recv_displs, struct CUstream_st *stream)
{
    const char *fn = "weft_alltoallv_on_stream";
    size_t total = 0;
    int rc = weft_check_alltoallv(c, sendbuf, send_bytes, send_displs, recvbuf, recv_bytes, recv_displs, &total, fn);
    struct weft_coll_vec v = { send_bytes, send_displs, recv_bytes, recv_displs };
    struct weft_coll_args a = { WEFT_COLL_ALLTOALLV, sendbuf, recvbuf, total, -1, -1, -1, NULL, &v };
    return rc != WEFT_SUCCESS ? rc : stream_coll(c, &a, stream, fn);
}

int weft_comm_async_error(weft_comm_t *c)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_async_error: comm is NULL");
    if (__atomic_load_n(&c->core.aborted, __ATOMIC_ACQUIRE))
        return WEFT_ERR_ABORTED;
    if (__atomic_load_n(&c->core.revoked, __ATOMIC_ACQUIRE))
        return WEFT_ERR_REVOKED;   /* the comm's last error says by whom */
    return weft_stream_peek_error(c->stream);
}

int weft_group_start(void)
{
    return weft_stream_group_start();
}

int weft_group_end(void)
{
    return weft_stream_group_end();
}
