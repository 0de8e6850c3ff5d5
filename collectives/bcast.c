/*
 * weft_coll_bcast(cc, buf, bytes, root): binomial tree for small messages,
 * scatter + ring allgather for large ones.
 *
 * The threshold comes from the measurements in docs/benchmarks.md ("## Bcast").
 */
#include <stdio.h>
#include <stdlib.h>
#include "coll_impl.h"
#include "core.h"
#include "log.h"
#include "tags.h"
#include "weft.h"

/* From this size up (and more than two ranks) scatter + ring beats the tree:
 * every rank then sends about `bytes` once instead of the root's log2(n)
 * full copies. */
#define WEFT_BCAST_LARGE (256u * 1024u)

struct bcast_args {
    const struct weft_coll *cc;
    char                   *buf;
    size_t                  bytes;
    int                     root;
};

/*
 * Binomial tree over ranks relative to the root (v = rank - root mod n):
 * v receives from v minus its lowest set bit, then sends to v + 2^k for
 * every 2^k below that bit, largest first.
 *
 *     v:   0 ----------------> 4          step 0 (2^2)
 *          0 ------> 2         4 ------> 6     step 1 (2^1)
 *          0 -> 1    2 -> 3    4 -> 5    6 -> 7   step 2 (2^0)
 *
 * Schedule: the RECV from the parent (not at the root), then behind a fence
 * one SEND per child.
 */
void coll_binomial_bcast_build(struct weft_sched_build *b, const int *members, int n, int pos, int root, void *buf,
                               size_t bytes)
{
    int v = (pos - root + n) % n;
    int mask = 1;
    while (mask < n && !(v & mask))
        mask <<= 1;
    if (v != 0) {
        int parent = ((v - mask) + root) % n;
        weft_sched_recv(b, 0, buf, bytes, members ? members[parent] : parent, 0, WEFT_SCHED_NODEP,
                        WEFT_SCHED_F_RECEIVE);
        weft_sched_fence(b);
    }
    /* Children: v + m for m < mask (the root: every power of two below n). */
    for (int m = mask >> 1; m > 0; m >>= 1) {
        if (v + m >= n)
            continue;
        int child = (v + m + root) % n;
        weft_sched_send(b, 1, buf, bytes, members ? members[child] : child, 0, WEFT_SCHED_NODEP);
    }
}

static void build_binomial(struct weft_sched_build *b, const void *args)
{
    const struct bcast_args *a = args;
    coll_binomial_bcast_build(b, NULL, a->cc->core->size, a->cc->core->rank, a->root, a->buf, a->bytes);
}

/*
 * Scatter + ring allgather (large messages): the root cuts buf into n pieces
 * and sends piece p to the rank p places after it; then a pipelined ring
 * (coll_ring_build) circulates the pieces. The root already has all of them,
 * so it receives nothing and only sends.
 *
 *     pieces:  [P0|P1|P2|P3]  at root (v=0)
 *     scatter:  root --P1--> v1, --P2--> v2, --P3--> v3
 *     ring:     v0 -> v1 -> v2 -> v3 (-> v0 skipped), n-1 steps,
 *               e.g. v1 gets P0 from root, then P3, then P2
 *
 * Schedule: the root's scatter SENDs, or a rank's RECV of its piece and a
 * fence (its piece must be here before the ring sends it on; the root's
 * scatter sends only read buf, so they may overlap the ring); then the
 * generic ring on lane 1 with the root as the full member.
 */
static void build_scatter_ring(struct weft_sched_build *b, const void *args)
{
    const struct bcast_args *a = args;
    int n = a->cc->core->size, v = (a->cc->core->rank - a->root + n) % n;
    size_t piece = (a->bytes + (size_t)n - 1) / (size_t)n;
    struct coll_ring r = {
        .members = NULL, .rot = a->root, .m = n, .my_pos = v, .segs = NULL, .seg_first = NULL,
        .block = piece, .total = a->bytes, .buf = a->buf, .own_src = NULL, .full_pos = 0,
        .chunk = coll_ring_chunk(a->cc), .phase = 1,
    };
    /* Piece p: [p*piece, (p+1)*piece) clipped to the message (the last ones may be empty). */
    if (v == 0) {
        for (int p = 1; p < n; p++) {
            size_t off = (size_t)p * piece;
            if (off >= a->bytes)
                continue;
            size_t len = a->bytes - off < piece ? a->bytes - off : piece;
            weft_sched_send(b, 0, a->buf + off, len, (a->root + p) % n, 0, WEFT_SCHED_NODEP);
        }
    } else {
        size_t off = (size_t)v * piece;
        if (off < a->bytes)
            weft_sched_recv(b, 0, a->buf + off, a->bytes - off < piece ? a->bytes - off : piece, a->root, 0,
                            WEFT_SCHED_NODEP, 0);
        weft_sched_fence(b);
    }
    coll_ring_build(b, &r);
}

int coll_bcast_start(struct weft_coll *cc, const struct weft_coll_args *ca, weft_coll_tag_fn tag, uint32_t seq,
                     struct weft_coll_op **op)
{
    struct bcast_args a = { cc, ca->recvbuf, ca->count, ca->root };
    *op = NULL;
    if (a.bytes == 0 || cc->core->size == 1)
        return WEFT_SUCCESS;
    struct weft_sched_call call = {
        .what = "bcast binomial", .sig = { WEFT_COLL_BCAST, a.root, a.bytes, -1, -1 }, .tag = tag, .seq = seq,
        .nranks = cc->core->size,
    };
    int large = a.bytes >= WEFT_BCAST_LARGE && cc->core->size > 2;
    if (weft_log_level() >= WEFT_LOG_INFO) {
        char what[64];
        snprintf(what, sizeof what, "bcast %zu B", a.bytes);
        coll_log_shape_once(cc, WEFT_COLL_BCAST, a.bytes, large, what, large ? "scatter+ring" : "binomial", 0);
    }
    if (large) {
        call.what = "bcast scatter+ring";
        return weft_sched_start(cc, &call, build_scatter_ring, &a, op);
    }
    return weft_sched_start(cc, &call, build_binomial, &a, op);
}
