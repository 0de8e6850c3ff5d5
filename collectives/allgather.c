/*
 * Allgather algorithms, each as a schedule (coll_sched.h). Each gets
 * validated arguments (see coll_impl.h): bytes > 0, more than one rank,
 * sendbuf in place (== recvbuf + rank*bytes) or not overlapping recvbuf.
 * Block b of recvbuf is rank b's data: recvbuf + b*bytes. All offsets are
 * size_t, so totals above 4 GiB work.
 */
#include <stdlib.h>
#include <string.h>
#include "coll_impl.h"
#include "core.h"
#include "log.h"
#include "tags.h"
#include "weft.h"

/* What every builder gets. */
struct ag_args {
    const struct weft_coll *cc;
    int                     n, me;
    const void             *sendbuf;
    char                   *recvbuf;
    size_t                  bytes;
    size_t                  chunk;
    /* hier, leaders: the leaders' ring layout (NULL when there is no ring) */
    const int              *leaders;
    const int              *seg_first;
    const struct coll_seg  *segs;
};

/* Copies this rank's block into place unless the call is in place (host or
 * device memory, weft_devcopy). */
static void copy_own_block(struct weft_sched_build *b, const struct ag_args *a)
{
    char *dst = a->recvbuf + (size_t)a->me * a->bytes;
    if ((const char *)a->sendbuf != dst)
        weft_sched_copy(b, dst, a->sendbuf, a->bytes);
}

/* ---- the generic ring ---- */

static int ring_member(const struct coll_ring *r, int p)
{
    return r->members ? r->members[p] : (r->rot + p) % r->m;
}

static int ring_nsegs(const struct coll_ring *r, int p)
{
    return r->segs ? r->seg_first[p + 1] - r->seg_first[p] : 1;
}

static struct coll_seg ring_seg(const struct coll_ring *r, int p, int j)
{
    struct coll_seg s;
    if (r->segs)
        return r->segs[r->seg_first[p] + j];
    s.off = (size_t)p * r->block;
    if (s.off > r->total)
        s.off = r->total;
    s.len = r->total - s.off < r->block ? r->total - s.off : r->block;
    return s;
}

/*
 * Generic pipelined ring (see coll_impl.h). m members in a circle; at step s
 * (1..m-1) member p receives from its left neighbour the data that started
 * at member p-s and passes it on to the right, except the data of p+1, which
 * has then gone all the way round. Every contribution is cut into chunks, and
 * a chunk is forwarded as soon as it arrived, so sending chunk k while
 * receiving chunk k+1 keeps both links of a member busy:
 *
 *     member:     0        1        2        3
 *     step 1:   [0]---->  [1]---->  [2]---->  [3]----> (to 0)
 *     step 2:   [3]---->  [0]---->  [1]---->  [2]---->
 *     step 3:   [2]---->  [3]---->  [0]---->  [1]---->
 *               (block [x] = data of member x; chunk c of a block is
 *                forwarded while chunk c+1 of the same block arrives)
 *
 * Every receive is posted before the first send, straight into its final
 * place in buf, so the sender's rendezvous finds its receive waiting and no
 * data is copied twice.
 *
 * Schedule: every chunk's RECV, then the own chunks' SENDs (and the COPY of
 * the own block), then one forwarding SEND per chunk that depends on that
 * chunk's RECV.
 */
void coll_ring_build(struct weft_sched_build *b, const struct coll_ring *r)
{
    int m = r->m, me = r->my_pos;
    int left = ring_member(r, (me + m - 1) % m);
    int right = ring_member(r, (me + 1) % m);
    int last_pos = (me + 1) % m;   /* its data is received last and not forwarded */
    int i_am_full = (me == r->full_pos);
    int right_is_full = (last_pos == r->full_pos);
    size_t first_recv = b->n, k;

    /* The chunks that reach us, in the order the left neighbour sends them;
     * every receive is posted now. */
    for (int step = 1; step < m && !i_am_full; step++) {
        int p = (me - step + m) % m;
        for (int j = 0; j < ring_nsegs(r, p); j++) {
            struct coll_seg s = ring_seg(r, p, j);
            for (size_t off = 0, len; off < s.len; off += len) {
                len = s.len - off < r->chunk ? s.len - off : r->chunk;
                weft_sched_recv(b, step, r->buf + s.off + off, len, left, r->phase, WEFT_SCHED_NODEP,
                                WEFT_SCHED_F_RECEIVE);
            }
        }
    }

    /* Our own contribution goes out first (from own_src when not in place). */
    for (int j = 0; j < ring_nsegs(r, me) && !right_is_full; j++) {
        struct coll_seg s = ring_seg(r, me, j);
        const char *src = r->own_src ? (const char *)r->own_src : r->buf + s.off;
        for (size_t off = 0, len; off < s.len; off += len) {
            len = s.len - off < r->chunk ? s.len - off : r->chunk;
            weft_sched_send(b, 0, src + off, len, right, r->phase, WEFT_SCHED_NODEP);
        }
    }
    if (r->own_src) {
        struct coll_seg own = ring_seg(r, me, 0);
        if ((const char *)r->own_src != r->buf + own.off)
            weft_sched_copy(b, r->buf + own.off, r->own_src, own.len);
    }

    /* Forward each chunk as soon as it is in (a full member has it already). */
    k = 0;
    for (int step = 1; step < m; step++) {
        int p = (me - step + m) % m;
        int fwd = (p != last_pos) && !right_is_full;
        for (int j = 0; j < ring_nsegs(r, p); j++) {
            struct coll_seg s = ring_seg(r, p, j);
            for (size_t off = 0, len; off < s.len; off += len, k++) {
                len = s.len - off < r->chunk ? s.len - off : r->chunk;
                if (fwd)
                    weft_sched_send(b, step, r->buf + s.off + off, len, right, r->phase,
                                    i_am_full ? WEFT_SCHED_NODEP : (int)(first_recv + k));
            }
        }
    }
}

/*
 * Ring allgather: n-1 steps, each rank sends and receives (n-1)/n of the
 * total, the bandwidth optimum; pipelined in chunks (coll_ring_build above).
 *
 *     rank:    0     1     2     3        after step 3 every rank has
 *     step 1:  0->   1->   2->   3->      [0 1 2 3]
 *     step 2:  3->   0->   1->   2->
 *     step 3:  2->   3->   0->   1->
 *
 * Schedule: the generic ring over every rank, one segment per rank.
 */
static void build_ring(struct weft_sched_build *b, const void *args)
{
    const struct ag_args *a = args;
    struct coll_ring r = {
        .members = NULL, .rot = 0, .m = a->n, .my_pos = a->me, .segs = NULL, .seg_first = NULL,
        .block = a->bytes, .total = (size_t)a->n * a->bytes, .buf = a->recvbuf, .own_src = a->sendbuf,
        .full_pos = -1, .chunk = a->chunk, .phase = 0,
    };
    coll_ring_build(b, &r);
}

/*
 * Recursive doubling (power-of-two sizes): log2(n) steps; at step k a rank
 * swaps everything it holds (2^k blocks, contiguous) with rank ^ 2^k.
 *
 *     rank:     0      1      2      3
 *     step 0:   0<---->1      2<---->3        hold [01] [01] [23] [23]
 *     step 1:  01<-----------> 23             hold [0123] everywhere
 *               1<------------------>3
 *
 * Schedule: per step a RECV and a SEND (step 0 also the own block's COPY);
 * each step behind a fence.
 */
static void build_rd(struct weft_sched_build *b, const void *args)
{
    const struct ag_args *a = args;
    int n = a->n, me = a->me, step = 0;
    size_t bytes = a->bytes;
    char *rb = a->recvbuf;

    for (int mask = 1; mask < n; mask <<= 1, step++) {
        int partner = me ^ mask;
        size_t my_base = (size_t)(me & ~(mask - 1)) * bytes;
        size_t their_base = (size_t)(partner & ~(mask - 1)) * bytes;
        size_t len = (size_t)mask * bytes;
        if (step > 0)
            weft_sched_fence(b);
        weft_sched_recv(b, step, rb + their_base, len, partner, 0, WEFT_SCHED_NODEP, 0);
        /* Step 0 sends straight from sendbuf while the own block is copied. */
        const char *src = (step == 0) ? (const char *)a->sendbuf : rb + my_base;
        weft_sched_send(b, step, src, len, partner, 0, WEFT_SCHED_NODEP);
        if (step == 0)
            copy_own_block(b, a);
    }
}

/*
 * Bruck: ceil(log2 n) steps for any n. Blocks are kept rotated in a scratch
 * buffer (slot i = block of rank me+i); at step k with d = 2^k a rank sends
 * its first min(d, n-d) slots to me-d and appends the same count received
 * from me+d. A final rotation puts slot i at block me+i.
 *
 *     n = 5, rank 0's slots:   step 0 (d=1)   step 1 (d=2)   step 2 (d=4)
 *                              [0]            [0 1]          [0 1 2 3]
 *                              +[1] from 1    +[2 3] from 2  +[4] from 4
 *                              -> [0 1]       -> [0 1 2 3]   -> [0 1 2 3 4]
 *
 * Schedule: per step a RECV and a SEND (step 0 also the COPY of the own
 * block into the op's scratch), each step behind a fence; then, behind a
 * last fence, the two COPYs of the rotation.
 */
static void build_bruck(struct weft_sched_build *b, const void *args)
{
    const struct ag_args *a = args;
    int n = a->n, me = a->me, step = 0;
    size_t bytes = a->bytes;
    char *tmp = weft_sched_scratch(b, 0);

    for (int d = 1; d < n; d <<= 1, step++) {
        int cnt = d < n - d ? d : n - d;
        int to = (me - d + n) % n, from = (me + d) % n;
        if (step > 0)
            weft_sched_fence(b);
        weft_sched_recv(b, step, weft_sched_scratch(b, (size_t)d * bytes), (size_t)cnt * bytes, from, 0,
                        WEFT_SCHED_NODEP, 0);
        const char *src = (step == 0) ? (const char *)a->sendbuf : tmp;
        weft_sched_send(b, step, src, (size_t)cnt * bytes, to, 0, WEFT_SCHED_NODEP);
        if (step == 0)
            weft_sched_copy(b, tmp, a->sendbuf, bytes);
    }
    /* Slot i holds rank (me+i)%n: slots [0, n-me) -> blocks [me, n), the rest -> [0, me). */
    weft_sched_fence(b);
    weft_sched_copy(b, a->recvbuf + (size_t)me * bytes, tmp, (size_t)(n - me) * bytes);
    if (me > 0)
        weft_sched_copy(b, a->recvbuf, weft_sched_scratch(b, (size_t)(n - me) * bytes), (size_t)me * bytes);
}

/*
 * Direct: one step; every rank posts a receive from and a send to every
 * other rank at once (staggered: the i-th pair is me-i / me+i so no rank is
 * everybody's first target). Inside a node the copies of all pairs then run
 * in parallel and no rank waits on a chain of others.
 *
 *     rank 0:  --0--> 1, 2, 3      <--1,2,3-- from 1, 2, 3
 *     rank 1:  --1--> 2, 3, 0      ...
 *
 * Schedule: n-1 RECVs, n-1 SENDs, the own block's COPY; no dependencies.
 */
static void build_direct(struct weft_sched_build *b, const void *args)
{
    const struct ag_args *a = args;
    int n = a->n, me = a->me;
    for (int i = 1; i < n; i++) {
        int from = (me - i + n) % n;
        weft_sched_recv(b, 0, a->recvbuf + (size_t)from * a->bytes, a->bytes, from, 0, WEFT_SCHED_NODEP, 0);
    }
    for (int i = 1; i < n; i++) {
        int to = (me + i) % n;
        weft_sched_send(b, 0, a->sendbuf, a->bytes, to, 0, WEFT_SCHED_NODEP);
    }
    copy_own_block(b, a);
}

/*
 * Hierarchical: node-aware, for comms over several nodes (real, or
 * WEFT_VIRTUAL_NODES). The lowest rank of each node is its leader.
 *
 *     node A: a0* a1 a2        node B: b0* b1          (* = leader)
 *
 *     1. gather in node:   a1,a2 --> a0             b1 --> b0
 *     2. leaders' ring:    a0 [a0 a1 a2] ----> b0,  b0 [b0 b1] ----> a0
 *                          (pipelined ring over leaders, coll_ring_build;
 *                           each node boundary carries every byte once)
 *     3. share in node:    a0 --> a1, a2 (all but their own block)
 *                          b0 --> b1
 *
 * Only leaders cross nodes, so the slow links carry (nodes-1)/nodes of the
 * data once, and inside a node the receivers pull from the leader in parallel.
 *
 * Schedule: a non-leader's RECVs of everything but its block, its SEND up
 * and its own COPY, no dependencies. A leader's gather RECVs and own COPY;
 * behind a fence the leaders' ring (generic ring, phase 1); behind another
 * fence the SENDs of phase 3.
 */
static void build_hier(struct weft_sched_build *b, const void *args)
{
    const struct ag_args *a = args;
    const struct weft_coll *cc = a->cc;
    int me = a->me;
    int node = cc->node_of[me];
    const int *local = cc->node_ranks + cc->node_first[node];
    int nlocal = cc->node_first[node + 1] - cc->node_first[node];
    int leader = local[0];
    char *rb = a->recvbuf;
    size_t bytes = a->bytes, total = (size_t)a->n * bytes;

    if (me != leader) {
        /* 1 + 3: receives of everything but our block first, then our block up. */
        size_t mine = (size_t)me * bytes;
        if (mine > 0)
            weft_sched_recv(b, 3, rb, mine, leader, 2, WEFT_SCHED_NODEP, 0);
        if (mine + bytes < total)
            weft_sched_recv(b, 3, rb + mine + bytes, total - mine - bytes, leader, 2, WEFT_SCHED_NODEP, 0);
        weft_sched_send(b, 1, a->sendbuf, bytes, leader, 0, WEFT_SCHED_NODEP);
        copy_own_block(b, a);
        return;
    }

    /* 1. gather the node's blocks. */
    for (int i = 1; i < nlocal; i++)
        weft_sched_recv(b, 1, rb + (size_t)local[i] * bytes, bytes, local[i], 0, WEFT_SCHED_NODEP, 0);
    copy_own_block(b, a);

    /* 2. ring over the leaders; node p's data = its runs of consecutive ranks. */
    if (cc->nnodes > 1) {
        struct coll_ring r = {
            .members = a->leaders, .rot = 0, .m = cc->nnodes, .my_pos = node, .segs = a->segs,
            .seg_first = a->seg_first, .block = 0, .total = total, .buf = rb, .own_src = NULL,
            .full_pos = -1, .chunk = a->chunk, .phase = 1,
        };
        weft_sched_fence(b);
        coll_ring_build(b, &r);
    }

    /* 3. every local rank gets everything but its own block. */
    weft_sched_fence(b);
    for (int i = 1; i < nlocal; i++) {
        size_t mine = (size_t)local[i] * bytes;
        if (mine > 0)
            weft_sched_send(b, 3, rb, mine, local[i], 2, WEFT_SCHED_NODEP);
        if (mine + bytes < total)
            weft_sched_send(b, 3, rb + mine + bytes, total - mine - bytes, local[i], 2, WEFT_SCHED_NODEP);
    }
}

/* The leaders' ring layout of hier: leaders[nn], seg_first[nn+1], segs[n]
 * in one allocation (only a leader of a multi-node comm needs it). */
static int hier_layout(const struct weft_coll *cc, size_t bytes, const char *what, void **mem,
                       struct ag_args *a)
{
    int n = cc->core->size, nn = cc->nnodes;
    size_t al = sizeof(struct coll_seg);
    size_t segs_off = ((size_t)(2 * nn + 1) * sizeof(int) + al - 1) / al * al;
    size_t sz = segs_off + (size_t)n * sizeof(struct coll_seg);
    char *p = malloc(sz);
    if (p == NULL)
        return weft_set_error(cc->core, WEFT_ERR_NO_MEMORY, "%s: no memory for %zu bytes of scratch", what, sz);
    int *leaders = (int *)(void *)p;
    int *seg_first = leaders + nn;
    struct coll_seg *segs = (struct coll_seg *)(void *)(p + segs_off);
    int ns = 0;
    for (int q = 0; q < nn; q++) {
        const int *rk = cc->node_ranks + cc->node_first[q];
        int cnt = cc->node_first[q + 1] - cc->node_first[q];
        leaders[q] = rk[0];
        seg_first[q] = ns;
        for (int j = 0; j < cnt; j++) {
            if (j > 0 && rk[j] == rk[j - 1] + 1) {
                segs[ns - 1].len += bytes;
            } else {
                segs[ns].off = (size_t)rk[j] * bytes;
                segs[ns].len = bytes;
                ns++;
            }
        }
    }
    seg_first[nn] = ns;
    a->leaders = leaders;
    a->seg_first = seg_first;
    a->segs = segs;
    *mem = p;
    return WEFT_SUCCESS;
}

/* Step 2 of hier alone (node_hier.c has done steps 1 and 3 in the nodes'
 * segments). */
static void build_heads_ring(struct weft_sched_build *b, const void *args)
{
    const struct ag_args *a = args;
    const struct weft_coll *cc = a->cc;
    struct coll_ring r = {
        .members = a->leaders, .rot = 0, .m = cc->nnodes, .my_pos = cc->node_of[a->me], .segs = a->segs,
        .seg_first = a->seg_first, .block = 0, .total = (size_t)a->n * a->bytes, .buf = a->recvbuf,
        .own_src = NULL, .full_pos = -1, .chunk = a->chunk, .phase = 1,
    };
    coll_ring_build(b, &r);
}

int coll_allgather_heads_op(struct weft_coll *cc, const struct weft_coll_sig *sig, uint32_t seq, void *recvbuf,
                            size_t bytes, struct weft_coll_op **op)
{
    const char *what = "allgather hierarchical (heads' ring)";
    struct ag_args a;
    void *layout = NULL;
    memset(&a, 0, sizeof a);
    a.cc = cc;
    a.n = cc->core->size;
    a.me = cc->core->rank;
    a.recvbuf = recvbuf;
    a.sendbuf = (char *)recvbuf + (size_t)a.me * bytes;
    a.bytes = bytes;
    a.chunk = coll_ring_chunk(cc);
    int rc = hier_layout(cc, bytes, what, &layout, &a);
    if (rc != WEFT_SUCCESS)
        return rc;
    struct weft_sched_call call = { .what = what, .sig = *sig, .tag = weft_tag_coll, .seq = seq, .nranks = a.n };
    rc = weft_sched_start(cc, &call, build_heads_ring, &a, op);
    free(layout);
    return rc;
}

int coll_allgather_op(struct weft_coll *cc, int kind, int algo, weft_coll_tag_fn tag, uint32_t seq,
                      const void *sendbuf, void *recvbuf, size_t bytes, struct weft_coll_op **op)
{
    struct weft_coll_sig sig = { kind, -1, bytes, -1, -1 };
    return coll_allgather_op_sig(cc, &sig, algo, tag, seq, sendbuf, recvbuf, bytes, op);
}

int coll_allgather_op_sig(struct weft_coll *cc, const struct weft_coll_sig *sig, int algo, weft_coll_tag_fn tag,
                          uint32_t seq, const void *sendbuf, void *recvbuf, size_t bytes, struct weft_coll_op **op)
{
    struct ag_args a;
    weft_sched_build_fn build;
    const char *what;
    size_t scratch = 0;
    void *layout = NULL;
    int rc;

    memset(&a, 0, sizeof a);
    a.cc = cc;
    a.n = cc->core->size;
    a.me = cc->core->rank;
    a.sendbuf = sendbuf;
    a.recvbuf = recvbuf;
    a.bytes = bytes;
    a.chunk = coll_ring_chunk(cc);
    switch (algo) {
    case WEFT_AG_RING:
        build = build_ring;
        what = "allgather ring";
        break;
    case WEFT_AG_RD:
        build = build_rd;
        what = "allgather recursive doubling";
        break;
    case WEFT_AG_BRUCK:
        build = build_bruck;
        what = "allgather bruck";
        scratch = (size_t)a.n * bytes;
        break;
    case WEFT_AG_DIRECT:
        build = build_direct;
        what = "allgather direct";
        break;
    case WEFT_AG_HIER:
        build = build_hier;
        what = "allgather hierarchical";
        if (cc->nnodes > 1 && cc->node_ranks[cc->node_first[cc->node_of[a.me]]] == a.me &&
            (rc = hier_layout(cc, bytes, what, &layout, &a)) != WEFT_SUCCESS)
            return rc;
        break;
    default:
        return weft_set_error(cc->core, WEFT_ERR_INTERNAL, "weft_allgather: selector returned algorithm %d", algo);
    }
    struct weft_sched_call call = {
        .what = what, .sig = *sig, .tag = tag, .seq = seq,
        .scratch_bytes = scratch, .nranks = a.n,
    };
    rc = weft_sched_start(cc, &call, build, &a, op);
    free(layout);
    return rc;
}
