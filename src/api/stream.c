/*
 * The public stream-ordered calls: argument checks (check.c), then the
 * stream engine of the comm (src/stream/stream.h). Groups are per host
 * thread and belong to no comm.
 */
#include "check.h"
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

int weft_group_start(void)
{
    return weft_stream_group_start();
}

int weft_group_end(void)
{
    return weft_stream_group_end();
}
