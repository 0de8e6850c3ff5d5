/*
 * Argument checks of the public calls (see check.h). The texts are the
 * ones weft_isend, weft_allgather, weft_bcast and the stream-ordered calls
 * have always used; tests look for parts of them.
 */
#include "check.h"

#include <stdint.h>

#include "comm.h"
#include "coll.h"
#include "log.h"
#include "reduce_kernel.h"
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

/* [a, a+an) and [b, b+bn) share a byte (integers: unrelated objects). */
static int overlaps(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

int weft_check_reduce(struct weft_comm *c, int kind, const void *sendbuf, const void *recvbuf, size_t count,
                      int dtype, int op, int root, const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    int n = c->core.size, me = c->core.rank;
    size_t es = weft_dtype_size(dtype);
    if (es == 0)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                              "%s: dtype %d is not a weft_dtype_t (WEFT_INT8 .. WEFT_FLOAT64, 0 .. %d)", fn, dtype,
                              WEFT_DTYPE_COUNT - 1);
    if (op < 0 || op >= WEFT_OP_COUNT)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                              "%s: op %d is not a weft_op_t (WEFT_SUM .. WEFT_AVG, 0 .. %d)", fn, op,
                              WEFT_OP_COUNT - 1);
    if (kind == WEFT_COLL_REDUCE && (root < 0 || root >= n))
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: root %d out of range (comm has %d ranks)", fn,
                              root, n);
    size_t per = kind == WEFT_COLL_REDUCE_SCATTER ? (size_t)n : 1;
    if (count > SIZE_MAX / es / per)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: count %zu x %zu-byte %s%s overflows size_t", fn,
                              count, es, weft_dtype_name(dtype), per > 1 ? " x ranks" : "");
    if (count == 0)
        return WEFT_SUCCESS;
    size_t out = count * es, in = out * per;
    int has_recv = kind != WEFT_COLL_REDUCE || me == root;
    if (sendbuf == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: sendbuf is NULL with count %zu", fn, count);
    if (has_recv && recvbuf == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: recvbuf is NULL with count %zu%s", fn, count,
                              kind == WEFT_COLL_REDUCE ? " at the root" : "");
    if (!has_recv)
        return WEFT_SUCCESS;
    const char *in_place = kind == WEFT_COLL_REDUCE_SCATTER ? (const char *)sendbuf + (size_t)me * out
                                                            : (const char *)sendbuf;
    if ((const char *)recvbuf != in_place && overlaps(sendbuf, in, recvbuf, out))
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                              "%s: sendbuf overlaps recvbuf but is not the in-place form (%s)", fn,
                              kind == WEFT_COLL_REDUCE_SCATTER ? "recvbuf == sendbuf + rank * recvcount elements"
                                                               : "sendbuf == recvbuf");
    return WEFT_SUCCESS;
}

int weft_check_alltoall(struct weft_comm *c, const void *sendbuf, const void *recvbuf, size_t bytes_per_rank,
                        const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    int n = c->core.size;
    if (bytes_per_rank > SIZE_MAX / (size_t)n)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: bytes_per_rank %zu x %d ranks overflows size_t",
                              fn, bytes_per_rank, n);
    if (bytes_per_rank == 0)
        return WEFT_SUCCESS;
    if (sendbuf == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: sendbuf is NULL with bytes_per_rank %zu", fn,
                              bytes_per_rank);
    if (recvbuf == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: recvbuf is NULL with bytes_per_rank %zu", fn,
                              bytes_per_rank);
    size_t total = bytes_per_rank * (size_t)n;
    if (sendbuf != recvbuf && overlaps(sendbuf, total, recvbuf, total))
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                              "%s: sendbuf overlaps recvbuf but is not the in-place form (sendbuf == recvbuf)", fn);
    return WEFT_SUCCESS;
}

int weft_check_req_out(struct weft_comm *c, const void *req_out, const char *fn)
{
    if (req_out != NULL)
        return WEFT_SUCCESS;
    return weft_set_error(c ? &c->core : NULL, WEFT_ERR_INVALID_ARG, "%s: request pointer (req) is NULL", fn);
}
