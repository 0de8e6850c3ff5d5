/*
 * weft_bcast(comm, buf, bytes, root): binomial tree for small messages,
 * scatter + ring allgather for large ones.
 *
 * The threshold comes from the measurements in docs/benchmarks.md ("## Bcast").
 */
#include <stdlib.h>
#include "coll.h"
#include "comm.h"
#include "log.h"

/* From this size up (and more than two ranks) scatter + ring beats the tree:
 * every rank then sends about `bytes` once instead of the root's log2(n)
 * full copies. */
#define WEFT_BCAST_LARGE (256u * 1024u)

/*
 * Binomial tree over ranks relative to the root (v = rank - root mod n):
 * v receives from v minus its lowest set bit, then sends to v + 2^k for
 * every 2^k below that bit, largest first.
 *
 *     v:   0 ----------------> 4          step 0 (2^2)
 *          0 ------> 2         4 ------> 6     step 1 (2^1)
 *          0 -> 1    2 -> 3    4 -> 5    6 -> 7   step 2 (2^0)
 */
static int bcast_binomial(struct weft_comm *c, void *buf, size_t bytes, int root)
{
    struct coll_op op;
    coll_op_begin(&op, c, "bcast binomial");
    int n = c->size, v = (c->rank - root + n) % n, rc;
    int mask = 1;
    while (mask < n && !(v & mask))
        mask <<= 1;
    if (v != 0) {
        int parent = ((v - mask) + root) % n;
        weft_request_t *r;
        if ((rc = coll_irecv(&op, 0, buf, bytes, parent, 0, &r)) != WEFT_SUCCESS)
            return rc;
        if ((rc = coll_wait(&op, 0, r, parent, "receive")) != WEFT_SUCCESS)
            return rc;
    }
    /* Children: v + m for m < mask (the root: every power of two below n). */
    struct coll_reqs q;
    if ((rc = coll_reqs_init(&op, &q, 32)) != WEFT_SUCCESS)
        return rc;
    for (int m = mask >> 1; m > 0; m >>= 1) {
        if (v + m >= n)
            continue;
        int child = (v + m + root) % n;
        weft_request_t *r;
        if ((rc = coll_isend(&op, 1, buf, bytes, child, 0, &r)) != WEFT_SUCCESS) {
            coll_reqs_drain(&q);
            goto out;
        }
        coll_reqs_add(&q, r, child);
    }
    rc = coll_reqs_waitall(&op, 1, &q);
out:
    coll_reqs_fini(&q);
    return rc;
}

/*
 * Scatter + ring allgather (large messages): the root cuts buf into n pieces
 * and sends piece p to the rank p places after it; then a pipelined ring
 * (coll_ring) circulates the pieces. The root already has all of them, so it
 * receives nothing and only sends.
 *
 *     pieces:  [P0|P1|P2|P3]  at root (v=0)
 *     scatter:  root --P1--> v1, --P2--> v2, --P3--> v3
 *     ring:     v0 -> v1 -> v2 -> v3 (-> v0 skipped), n-1 steps,
 *               e.g. v1 gets P0 from root, then P3, then P2
 */
static int bcast_scatter_ring(struct weft_comm *c, void *buf, size_t bytes, int root)
{
    struct coll_op op;
    coll_op_begin(&op, c, "bcast scatter+ring");
    int n = c->size, v = (c->rank - root + n) % n, rc;
    size_t piece = (bytes + (size_t)n - 1) / (size_t)n;
    int *members = malloc((size_t)n * sizeof *members);
    int *first = malloc(((size_t)n + 1) * sizeof *first);
    struct coll_seg *segs = malloc((size_t)n * sizeof *segs);
    struct coll_reqs q = { 0 };
    if (!members || !first || !segs) {
        rc = weft_set_error(c, WEFT_ERR_NO_MEMORY, "%s: no memory for the ring layout of %d ranks", op.what, n);
        goto out;
    }
    for (int p = 0; p < n; p++) {
        size_t off = (size_t)p * piece;
        members[p] = (root + p) % n;
        first[p] = p;
        segs[p].off = off < bytes ? off : bytes;
        segs[p].len = off < bytes ? (bytes - off < piece ? bytes - off : piece) : 0;
    }
    first[n] = n;

    char *b = buf;
    if ((rc = coll_reqs_init(&op, &q, (size_t)n)) != WEFT_SUCCESS)
        goto out;
    if (v == 0) {
        for (int p = 1; p < n; p++) {
            if (segs[p].len == 0)
                continue;
            weft_request_t *r;
            if ((rc = coll_isend(&op, 0, b + segs[p].off, segs[p].len, members[p], 0, &r)) != WEFT_SUCCESS) {
                coll_reqs_drain(&q);
                goto out;
            }
            coll_reqs_add(&q, r, members[p]);
        }
    } else if (segs[v].len > 0) {
        weft_request_t *r;
        if ((rc = coll_irecv(&op, 0, b + segs[v].off, segs[v].len, root, 0, &r)) != WEFT_SUCCESS)
            goto out;
        coll_reqs_add(&q, r, root);
    }
    /* Our piece must be here before the ring sends it on. The root's
     * scatter sends only read buf, so they may overlap the ring. */
    if (v != 0 && (rc = coll_reqs_waitall(&op, 0, &q)) != WEFT_SUCCESS)
        goto out;
    rc = coll_ring(&op, 1, members, n, v, segs, first, b, NULL, 0, coll_ring_chunk());
    if (v == 0) {
        int rc2 = coll_reqs_waitall(&op, 0, &q);
        if (rc == WEFT_SUCCESS)
            rc = rc2;
    }
out:
    coll_reqs_fini(&q);
    free(segs);
    free(first);
    free(members);
    return rc;
}

int weft_bcast(weft_comm_t *c, void *buf, size_t bytes, int root)
{
    if (!c)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_bcast: comm is NULL");
    if (root < 0 || root >= c->size)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "weft_bcast: root %d out of range (comm has %d ranks)",
                              root, c->size);
    if (bytes > 0 && !buf)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "weft_bcast: buf is NULL with bytes %zu", bytes);
    if (bytes == 0 || c->size == 1)
        return WEFT_SUCCESS;
    if (bytes >= WEFT_BCAST_LARGE && c->size > 2)
        return bcast_scatter_ring(c, buf, bytes, root);
    return bcast_binomial(c, buf, bytes, root);
}
