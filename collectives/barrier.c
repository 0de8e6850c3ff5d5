/*
 * weft_barrier: dissemination barrier.
 *
 * ceil(log2 n) rounds; in round k with d = 2^k rank r signals r+d and waits
 * for the signal of r-d (zero-byte messages). After round k a rank has heard,
 * directly or through a chain, from the 2^(k+1)-1 ranks before it, so after
 * the last round it knows every rank has arrived.
 *
 *     rank:    0   1   2   3   4
 *     d=1:     0->1  1->2  2->3  3->4  4->0
 *     d=2:     0->2  1->3  2->4  3->0  4->1
 *     d=4:     0->4  1->0  2->1  3->2  4->3
 */
#include "coll.h"
#include "comm.h"
#include "log.h"

int weft_barrier(weft_comm_t *c)
{
    if (!c)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_barrier: comm is NULL");
    int n = c->size, me = c->rank, rc = WEFT_SUCCESS;
    if (n == 1)
        return WEFT_SUCCESS;

    struct coll_op op;
    coll_op_begin(&op, c, "barrier dissemination");
    struct coll_reqs q;
    if ((rc = coll_reqs_init(&op, &q, 2)) != WEFT_SUCCESS)
        return rc;
    int round = 0;
    for (int d = 1; d < n; d <<= 1, round++) {
        int to = (me + d) % n, from = (me - d + n) % n;
        weft_request_t *r;
        /* One lane per round: a fast rank's signal for round k+1 never
         * satisfies round k's receive of a slower one. */
        if ((rc = coll_irecv(&op, round, NULL, 0, from, round % WEFT_COLL_PHASES, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, from);
        if ((rc = coll_isend(&op, round, NULL, 0, to, round % WEFT_COLL_PHASES, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, to);
        if ((rc = coll_reqs_waitall(&op, round, &q)) != WEFT_SUCCESS)
            goto out;
    }
    goto out;
fail:
    coll_reqs_drain(&q);
out:
    coll_reqs_fini(&q);
    return rc;
}
