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
#include "p2p.h"
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
    char why[400];
    if (!__atomic_load_n(&c->core.aborted, __ATOMIC_ACQUIRE) && weft_p2p_revoked(c->p2p, why, sizeof why))
        return weft_set_error(&c->core, WEFT_ERR_REVOKED, "%s: %s; only weft_comm_shrink and weft_comm_destroy "
                              "work on it now", fn, why);
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

int weft_check_rooted(struct weft_comm *c, int kind, const void *sendbuf, const void *recvbuf,
                      size_t bytes_per_rank, int root, const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    int n = c->core.size, me = c->core.rank, gather = kind == WEFT_COLL_GATHER;
    if (root < 0 || root >= n)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: root %d out of range (comm has %d ranks)", fn,
                              root, n);
    if (bytes_per_rank > SIZE_MAX / (size_t)n)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: bytes_per_rank %zu x %d ranks overflows size_t",
                              fn, bytes_per_rank, n);
    if (bytes_per_rank == 0)
        return WEFT_SUCCESS;
    /* own: this rank's block; all: the root's size * bytes_per_rank. */
    const void *own = gather ? sendbuf : recvbuf, *all = gather ? recvbuf : sendbuf;
    const char *own_name = gather ? "sendbuf" : "recvbuf", *all_name = gather ? "recvbuf" : "sendbuf";
    if (own == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: %s is NULL with bytes_per_rank %zu (root %d)",
                              fn, own_name, bytes_per_rank, root);
    if (me != root)
        return WEFT_SUCCESS;   /* the other buffer is the root's only */
    if (all == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                              "%s: %s is NULL with bytes_per_rank %zu at the root (rank %d)", fn, all_name,
                              bytes_per_rank, root);
    size_t total = bytes_per_rank * (size_t)n;
    if ((uintptr_t)all > UINTPTR_MAX - total || (uintptr_t)own > UINTPTR_MAX - bytes_per_rank)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: a buffer runs past the end of the address space",
                              fn);
    if ((uintptr_t)own != (uintptr_t)all + (size_t)root * bytes_per_rank && overlaps(own, bytes_per_rank, all, total))
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                              "%s: %s overlaps %s but is not the in-place form (%s == %s + root * bytes_per_rank)",
                              fn, own_name, all_name, own_name, all_name);
    return WEFT_SUCCESS;
}

/* One side of alltoallv: every block's end fits, buf is there when a
 * block is not empty; [*lo, *hi): the span of the non-empty blocks
 * (offsets into buf; *lo > *hi when there are none). */
static int check_blocks(struct weft_comm *c, const char *fn, const char *side, const void *buf,
                        const size_t *bytes, const size_t *displs, size_t *lo, size_t *hi, size_t *total)
{
    int n = c->core.size;
    *lo = SIZE_MAX;
    *hi = 0;
    *total = 0;
    for (int j = 0; j < n; j++) {
        size_t len = bytes[j], off = displs[j];
        if (off > SIZE_MAX - len)
            return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                                  "%s: %s_displs[%d] + %s_bytes[%d] (%zu + %zu) overflows size_t", fn, side, j, side,
                                  j, off, len);
        if (len == 0)
            continue;
        if (buf == NULL)
            return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: %sbuf is NULL but %s_bytes[%d] is %zu", fn,
                                  side, side, j, len);
        if ((uintptr_t)buf > UINTPTR_MAX - (off + len))
            return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                                  "%s: %sbuf + %s_displs[%d] + %s_bytes[%d] (%zu + %zu) runs past the end of the "
                                  "address space", fn, side, side, j, side, j, off, len);
        if (off < *lo)
            *lo = off;
        if (off + len > *hi)
            *hi = off + len;
        *total = len > SIZE_MAX - *total ? SIZE_MAX : *total + len;
    }
    return WEFT_SUCCESS;
}

int weft_check_alltoallv(struct weft_comm *c, const void *sendbuf, const size_t *send_bytes,
                         const size_t *send_displs, const void *recvbuf, const size_t *recv_bytes,
                         const size_t *recv_displs, size_t *send_total, const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    int n = c->core.size, me = c->core.rank, rc;
    const char *missing = send_bytes == NULL    ? "send_bytes"
                          : send_displs == NULL ? "send_displs"
                          : recv_bytes == NULL  ? "recv_bytes"
                          : recv_displs == NULL ? "recv_displs"
                                                : NULL;
    if (missing)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: %s is NULL (an array of %d entries, one per rank)",
                              fn, missing, n);
    size_t slo, shi, rlo, rhi, rtotal;
    if ((rc = check_blocks(c, fn, "send", sendbuf, send_bytes, send_displs, &slo, &shi, send_total)) != WEFT_SUCCESS ||
        (rc = check_blocks(c, fn, "recv", recvbuf, recv_bytes, recv_displs, &rlo, &rhi, &rtotal)) != WEFT_SUCCESS)
        return rc;
    if (send_bytes[me] != recv_bytes[me])
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                              "%s: send_bytes[%d] is %zu but recv_bytes[%d] is %zu (the block a rank sends itself "
                              "is copied: both sizes must match)", fn, me, send_bytes[me], me, recv_bytes[me]);
    if (slo < shi && rlo < rhi &&
        overlaps((const char *)sendbuf + slo, shi - slo, (const char *)recvbuf + rlo, rhi - rlo))
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                              "%s: the send blocks (sendbuf + [%zu, %zu)) overlap the receive blocks (recvbuf + "
                              "[%zu, %zu)); alltoallv has no in-place form", fn, slo, shi, rlo, rhi);
    return WEFT_SUCCESS;
}

int weft_check_req_out(struct weft_comm *c, const void *req_out, const char *fn)
{
    if (req_out != NULL)
        return WEFT_SUCCESS;
    return weft_set_error(c ? &c->core : NULL, WEFT_ERR_INVALID_ARG, "%s: request pointer (req) is NULL", fn);
}
