/*
 * weft_gather and weft_scatter: the rooted exchanges, each a schedule
 * (coll_sched.h) of one message between the root and every other rank.
 *
 * Linear on purpose: the root sends or receives every block once, and no
 * other rank forwards anything, so every byte moves exactly once and each
 * rank's buffers are the only memory touched (no scratch). A tree would
 * take log2(n) rounds instead of n-1 messages at the root, at the price of
 * intermediate ranks holding (and re-sending) their subtree's blocks:
 * worth it for many ranks with small blocks, not done (yet).
 *
 * Buffers may be host or device memory: data moves only through SEND/RECV
 * (the pipe layer stages device memory where it must) and one COPY step
 * for the root's own block (weft_devcopy), never through memcpy here.
 * Every rank passes the same bytes_per_rank and root: both travel in the
 * call's fingerprint, so ranks that disagree fail with WEFT_ERR_MISMATCH.
 */
#include <string.h>
#include "coll_impl.h"
#include "core.h"
#include "devcopy.h"
#include "log.h"
#include "weft.h"

struct rooted_args {
    int         n, me, root;
    const char *sendbuf;   /* gather: every rank's block; scatter: the root's n blocks */
    char       *recvbuf;   /* gather: the root's n blocks; scatter: every rank's block */
    size_t      bytes;     /* per rank */
    int         in_place;  /* at the root: its own block is already where it belongs */
};

/*
 * Gather: every rank but the root sends its block to the root; the root
 * posts one receive per rank, straight into that rank's place in recvbuf,
 * all at once (the pipes' flow control bounds what eager senders may push
 * ahead; rendezvous senders wait for their receive), then copies its own
 * block unless it is there already (in place).
 *
 *     n = 4, root 1      rank 0      rank 1 (root)              rank 2      rank 3
 *                        SEND -> 1   RECV from 2 -> block 2     SEND -> 1   SEND -> 1
 *                                    RECV from 3 -> block 3
 *                                    RECV from 0 -> block 0
 *                                    COPY sendbuf -> block 1
 *
 * The root receives in the order root+1, root+2, ... (each from its own
 * peer: the order only decides which transfer is posted first). Step
 * number = the peer's rank.
 */
static void build_gather(struct weft_sched_build *b, const void *args)
{
    const struct rooted_args *a = args;
    int n = a->n, me = a->me, root = a->root;
    size_t bytes = a->bytes;

    if (me != root) {
        weft_sched_send(b, me, a->sendbuf, bytes, root, 0, WEFT_SCHED_NODEP);
        return;
    }
    for (int i = 1; i < n; i++) {
        int from = (root + i) % n;
        weft_sched_recv(b, from, a->recvbuf + (size_t)from * bytes, bytes, from, 0, WEFT_SCHED_NODEP,
                        WEFT_SCHED_F_RECEIVE);
    }
    if (!a->in_place)
        weft_sched_copy(b, a->recvbuf + (size_t)root * bytes, a->sendbuf, bytes);
}

/*
 * Scatter: the mirror image. The root sends block r of sendbuf to rank r,
 * every send posted at once, and copies its own block into recvbuf unless
 * it is there already (in place); every other rank receives its block.
 *
 *     n = 4, root 1      rank 0         rank 1 (root)               rank 2         rank 3
 *                        RECV from 1    SEND block 2 -> 2           RECV from 1    RECV from 1
 *                                       SEND block 3 -> 3
 *                                       SEND block 0 -> 0
 *                                       COPY block 1 -> recvbuf
 *
 * Step number = the rank the block is for.
 */
static void build_scatter(struct weft_sched_build *b, const void *args)
{
    const struct rooted_args *a = args;
    int n = a->n, me = a->me, root = a->root;
    size_t bytes = a->bytes;

    if (me != root) {
        weft_sched_recv(b, me, a->recvbuf, bytes, root, 0, WEFT_SCHED_NODEP, WEFT_SCHED_F_RECEIVE);
        return;
    }
    for (int i = 1; i < n; i++) {
        int to = (root + i) % n;
        weft_sched_send(b, to, a->sendbuf + (size_t)to * bytes, bytes, to, 0, WEFT_SCHED_NODEP);
    }
    if (!a->in_place)
        weft_sched_copy(b, a->recvbuf, a->sendbuf + (size_t)root * bytes, bytes);
}

/* Both starts (see coll_impl.h); gather: 1, scatter: 0. */
static int rooted_start(struct weft_coll *cc, const struct weft_coll_args *ca, weft_coll_tag_fn tag, uint32_t seq,
                        struct weft_coll_op **op, int gather)
{
    int n = cc->core->size, me = cc->core->rank, root = ca->root;
    size_t bytes = ca->count;
    const char *fn = gather ? "weft_gather" : "weft_scatter";
    struct rooted_args a;

    *op = NULL;
    if (bytes == 0)
        return WEFT_SUCCESS;
    memset(&a, 0, sizeof a);
    a.n = n;
    a.me = me;
    a.root = root;
    a.sendbuf = ca->sendbuf;
    a.recvbuf = ca->recvbuf;
    a.bytes = bytes;
    /* Only the root's buffers are compared (elsewhere one of them is not
     * significant and may be NULL). The offsets cannot overflow: size *
     * bytes_per_rank was checked by the API (src/api/check.c). */
    if (me == root)
        a.in_place = gather ? a.sendbuf == a.recvbuf + (size_t)root * bytes
                            : a.recvbuf == a.sendbuf + (size_t)root * bytes;
    if (n == 1) {
        if (a.in_place)
            return WEFT_SUCCESS;
        return weft_devcopy(cc->core, a.recvbuf, a.sendbuf, bytes, fn);
    }
    struct weft_sched_call call = {
        .what = gather ? "gather linear" : "scatter linear",
        .sig = { gather ? WEFT_COLL_GATHER : WEFT_COLL_SCATTER, root, bytes, -1, -1 },
        .tag = tag, .seq = seq, .nranks = n,
    };
    return weft_sched_start(cc, &call, gather ? build_gather : build_scatter, &a, op);
}

int coll_gather_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                      struct weft_coll_op **op)
{
    return rooted_start(cc, a, tag, seq, op, 1);
}

int coll_scatter_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                       struct weft_coll_op **op)
{
    return rooted_start(cc, a, tag, seq, op, 0);
}
