/*
 * weft_coll_barrier: dissemination barrier.
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
 *
 * Schedule: per round a zero-byte RECV and SEND, each round behind a fence.
 */
#include "coll_impl.h"
#include "core.h"
#include "tags.h"
#include "weft.h"

void coll_dissemination_build(struct weft_sched_build *b, const int *members, int m, int pos)
{
    int round = 0;
    for (int d = 1; d < m; d <<= 1, round++) {
        int to = (pos + d) % m, from = (pos - d + m) % m;
        /* One lane per round: a fast rank's signal for round k+1 never
         * satisfies round k's receive of a slower one. */
        if (round > 0)
            weft_sched_fence(b);
        weft_sched_recv(b, round, NULL, 0, members ? members[from] : from, round % WEFT_TAG_COLL_PHASES,
                        WEFT_SCHED_NODEP, 0);
        weft_sched_send(b, round, NULL, 0, members ? members[to] : to, round % WEFT_TAG_COLL_PHASES,
                        WEFT_SCHED_NODEP);
    }
}

static void build_barrier(struct weft_sched_build *b, const void *args)
{
    const struct weft_coll *cc = args;
    coll_dissemination_build(b, NULL, cc->core->size, cc->core->rank);
}

int coll_barrier_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                       struct weft_coll_op **op)
{
    (void)a;
    *op = NULL;
    if (cc->core->size == 1)
        return WEFT_SUCCESS;
    struct weft_sched_call call = {
        .what = "barrier dissemination", .sig = { WEFT_COLL_BARRIER, -1, 0, -1, -1 }, .tag = tag, .seq = seq,
        .nranks = cc->core->size,
    };
    return weft_sched_start(cc, &call, build_barrier, cc, op);
}
