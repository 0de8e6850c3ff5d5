/*
 * Argument checks of the public calls, one set for every entry point of
 * src/api/ (p2p.c, coll.c, stream.c), so a call and its stream-ordered or
 * non-blocking twin refuse the same arguments with the same words. Each
 * records the failure as the comm's last error (NULL comm: logged only)
 * naming fn, and returns WEFT_ERR_INVALID_ARG; WEFT_SUCCESS otherwise.
 */
#ifndef WEFT_CHECK_H
#define WEFT_CHECK_H

#include <stddef.h>

#include "comm.h"

/* A weft_config_t's settings, checked and copied (*out NULL for none or a
 * NULL config); refused (logged, this thread's last error) naming fn, rank
 * and the entry. */
int weft_check_config(const char *fn, int rank, const weft_config_t *config, struct weft_settings **out);

static inline int weft_check_size(const struct weft_comm *c) { return c->core.size; }

/* Point-to-point: comm, request output, buffer, peer in range, tag >= 0
 * (negative tags are the library's own lanes). req_out is the caller's
 * request output (weft_isend's req), refused when NULL; a call that has
 * none (weft_send, weft_recv, the stream-ordered calls) passes
 * WEFT_CHECK_NO_REQ (or any other non-NULL pointer), which skips the check. */
#define WEFT_CHECK_NO_REQ ((const void *)"no request output")
int weft_check_p2p_fail(struct weft_comm *c, const void *buf, size_t bytes, int peer, int tag, const void *req_out,
                        const char *fn);
/* Inline: every small message passes through it. */
static inline int weft_check_p2p(struct weft_comm *c, const void *buf, size_t bytes, int peer, int tag,
                                 const void *req_out, const char *fn)
{
    if (c != NULL && req_out != NULL && (buf != NULL || bytes == 0) && peer >= 0 && peer < weft_check_size(c) &&
        tag >= 0)
        return 0;   /* WEFT_SUCCESS */
    return weft_check_p2p_fail(c, buf, bytes, peer, tag, req_out, fn);
}

/* After weft_comm_abort every call on the comm fails at once
 * (WEFT_ERR_ABORTED), and after weft_comm_revoke (here or on a peer) with
 * WEFT_ERR_REVOKED, naming the rank that revoked it. */
int weft_check_aborted_fail(struct weft_comm *c, const char *fn);
static inline int weft_check_live(struct weft_comm *c, const char *fn)
{
    if (c == NULL || (!__atomic_load_n(&c->core.aborted, __ATOMIC_ACQUIRE) &&
                      !__atomic_load_n(&c->core.revoked, __ATOMIC_ACQUIRE)))
        return 0;   /* WEFT_SUCCESS */
    return weft_check_aborted_fail(c, fn);
}

/* Allgather: comm, buffers non-NULL when bytes_per_rank > 0, size *
 * bytes_per_rank fits size_t, sendbuf in place (recvbuf +
 * rank*bytes_per_rank) or not overlapping recvbuf. */
int weft_check_allgather(struct weft_comm *c, const void *sendbuf, const void *recvbuf, size_t bytes_per_rank,
                         const char *fn);

/* Bcast: comm, root in range, buf non-NULL when bytes > 0. */
int weft_check_bcast(struct weft_comm *c, const void *buf, size_t bytes, int root, const char *fn);

/* Reductions (kind: WEFT_COLL_ALLREDUCE, _REDUCE_SCATTER, _REDUCE): comm,
 * dtype and op known, count * element size (reduce_scatter: * size)
 * fits size_t, buffers non-NULL when count > 0 (reduce: recvbuf at root
 * only), root in range (reduce), sendbuf either the in-place form or not
 * overlapping recvbuf. */
int weft_check_reduce(struct weft_comm *c, int kind, const void *sendbuf, const void *recvbuf, size_t count,
                      int dtype, int op, int root, const char *fn);

/* Alltoall: as allgather, with sendbuf of size * bytes_per_rank; in place
 * when sendbuf == recvbuf. */
int weft_check_alltoall(struct weft_comm *c, const void *sendbuf, const void *recvbuf, size_t bytes_per_rank,
                        const char *fn);

/* Gather and scatter (kind WEFT_COLL_GATHER / _SCATTER): comm, root in
 * range, size * bytes_per_rank fits size_t; with bytes_per_rank > 0 the
 * rank's own block non-NULL (gather: sendbuf, scatter: recvbuf), and at
 * the root the n blocks (gather: recvbuf, scatter: sendbuf) non-NULL and
 * either the in-place form (the own block == blocks + root*bytes_per_rank)
 * or not overlapping the own block. */
int weft_check_rooted(struct weft_comm *c, int kind, const void *sendbuf, const void *recvbuf,
                      size_t bytes_per_rank, int root, const char *fn);

/* Alltoallv: comm, the four arrays non-NULL, every displacement + size
 * fits size_t and the buffer's address range, a buffer non-NULL when one
 * of its sizes is > 0, send_bytes[rank] == recv_bytes[rank], and the span
 * of the send blocks (lowest to highest byte) not overlapping the span of
 * the receive blocks (no in-place form). *send_total: the bytes this rank
 * sends (saturating; for logs). */
int weft_check_alltoallv(struct weft_comm *c, const void *sendbuf, const size_t *send_bytes,
                         const size_t *send_displs, const void *recvbuf, const size_t *recv_bytes,
                         const size_t *recv_displs, size_t *send_total, const char *fn);

/* A request output of a non-blocking call. */
int weft_check_req_out(struct weft_comm *c, const void *req_out, const char *fn);

#endif
