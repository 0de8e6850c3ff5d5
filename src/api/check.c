/*
 * Argument checks of the public calls (see check.h). The texts are the
 * ones weft_isend, weft_allgather, weft_bcast and the stream-ordered calls
 * have always used; tests look for parts of them.
 */
#include "check.h"

#include <stdint.h>

#include "comm.h"
#include "log.h"
#include "weft.h"

int weft_check_p2p_fail(struct weft_comm *c, const void *buf, size_t bytes, int peer, int tag, const void *req_out,
                        const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    if (req_out == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: request pointer (req) is NULL", fn);
    if (buf == NULL && bytes != 0)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: buf is NULL but bytes is %zu (peer %d, tag %d)",
                              fn, bytes, peer, tag);
    if (peer < 0 || peer >= c->core.size)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: peer %d out of range [0, %d) (tag %d)", fn, peer,
                              c->core.size, tag);
    if (tag < 0)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: tag %d is negative (peer %d); tags are >= 0", fn,
                              tag, peer);
    return WEFT_SUCCESS;
}

int weft_check_allgather(struct weft_comm *c, const void *sendbuf, const void *recvbuf, size_t bytes_per_rank,
                         const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    int n = c->core.size, me = c->core.rank;
    if (bytes_per_rank > 0 && sendbuf == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: sendbuf is NULL with bytes_per_rank %zu", fn,
                              bytes_per_rank);
    if (bytes_per_rank > 0 && recvbuf == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: recvbuf is NULL with bytes_per_rank %zu", fn,
                              bytes_per_rank);
    if (bytes_per_rank > SIZE_MAX / (size_t)n)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: bytes_per_rank %zu x %d ranks overflows size_t",
                              fn, bytes_per_rank, n);
    if (bytes_per_rank > 0) {
        /* Compared as integers: the buffers may be unrelated objects. */
        size_t total = bytes_per_rank * (size_t)n;
        uintptr_t s0 = (uintptr_t)sendbuf, r0 = (uintptr_t)recvbuf;
        uintptr_t mine = r0 + (uintptr_t)me * bytes_per_rank;
        if (s0 != mine && s0 < r0 + total && r0 < s0 + bytes_per_rank)
            return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                                  "%s: sendbuf overlaps recvbuf but is not recvbuf + rank*bytes_per_rank "
                                  "(the in-place form)", fn);
    }
    return WEFT_SUCCESS;
}

int weft_check_bcast(struct weft_comm *c, const void *buf, size_t bytes, int root, const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    if (root < 0 || root >= c->core.size)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: root %d out of range (comm has %d ranks)", fn,
                              root, c->core.size);
    if (bytes > 0 && buf == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: buf is NULL with bytes %zu", fn, bytes);
    return WEFT_SUCCESS;
}

int weft_check_aborted_fail(struct weft_comm *c, const char *fn)
{
    return weft_set_error(&c->core, WEFT_ERR_ABORTED, "%s: rank %d aborted this comm (weft_comm_abort)", fn,
                          c->core.rank);
}
