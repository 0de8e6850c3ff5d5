/*
 * Node-local collectives across nodes: barrier, allreduce and reduce up to
 * 32 KiB, bcast up to 1 KiB, allgather up to 16 KiB in all, reduce_scatter
 * up to 32 KiB in all, gather and scatter up to HIER_GS_MAX in all and
 * alltoall rows up to half a slot, in a comm that spans several nodes, some
 * with several ranks, as three phases -- the ranks of each node meet in their node's segment
 * (node_coll.c), one rank of each node (its head) runs the call among the
 * heads as messages, and the heads put the result in their segment for
 * the rest of their node:
 *
 *   allreduce, two nodes of 3 ranks (heads a0, b0):
 *     node A:  a1, a2: slot <- send, arrive ──┐
 *              a0: slot <- send, arrive; waits for a1, a2; r = a0 op a1 op a2
 *     heads:   a0 <── recursive doubling of r ──> b0      (messages, lanes of call s)
 *     node A:  a0: slot <- result, sliced = s ──> a1, a2 copy it out
 *     (node B the same, at the same time)
 *
 * Against the message path's schedules (every rank a peer of log2(n) or
 * n-1 messages, tcp between nodes for most of them) only the heads cross
 * nodes, once each way, and the others' part is one write and one read.
 *
 * The head is the node's lowest rank; in a rooted call (bcast, reduce,
 * gather, scatter), on the root's node, the root. The result every rank ends with is its head's, and the heads' is
 * the same bits on every head (recursive doubling computes each element
 * identically on every member, coll_reduce_algo.h): the local reduction in
 * rank order, then the heads' in node order -- the same on every run.
 * WEFT_AVG sums locally; the heads' last step divides by the comm size.
 *
 * Faults: a node's ranks wait on their head's flags, under WEFT_TIMEOUT,
 * and see a dead or stopped rank through p2p's health as node_coll.c's
 * waits do; a head whose message phase fails tells every rank (the
 * schedule's notice, or node_fail's), so the waits on its node end with
 * its verdict, not with a timeout.
 */
#include <stdlib.h>
#include <string.h>
#include "coll_reduce_algo.h"
#include "core.h"
#include "log.h"
#include "reduce_kernel.h"
#include "node_coll_impl.h"
#include "p2p.h"
#include "tags.h"
#include "weft.h"

/* The largest allreduce (bytes a rank) that goes this way, and the largest
 * bcast. Measured against the message path (WEFT_NODE_COLL_KB=0), np 4 and
 * 8 on two virtual nodes and np 8 on four, 3 alternated rounds each
 * (docs/benchmarks.md, "Node-local collectives across nodes"): allreduce
 * 8 B-32 KiB took 15-30 us against 24-37 (np 4), 18-50 against 70-300
 * (np 8), 60-230 against 120-370 (np 8, four nodes); a bcast is level with
 * the binomial tree of messages up to 1 KiB (4-15 us both ways) and from 2
 * KiB, where it has only the two big buffers to run ahead in, behind at np
 * 4 (9-12 us against 6-10). The heads' bcast is that same tree, so it
 * gains only the messages inside the nodes. */
#define HIER_MAX       (32u << 10)
#define HIER_BCAST_MAX NODE_SMALL
/* An allgather's whole result (bytes a rank x ranks) at most. Measured as
 * above: at np 8 (4 ranks a node) 19-31 us against 60-80 as messages up to
 * 32 KiB in all, at np 8 on four nodes 10-20% faster, but at np 4 (2 a
 * node) level up to 8 KiB in all, 7% behind at 16 KiB and 27% at 32 KiB. */
#define HIER_AG_MAX    (16u << 10)
/* A gather's or scatter's whole data (bytes a rank x ranks) at most: the
 * root's head buffer (the node's scratch, one slot) holds it. Measured as
 * above (3 alternated rounds, root 1 or 3): a scatter 8 B-2 KiB a rank
 * took 4-33 us against 11-39 as messages at np 4 and np 8; at 4 KiB a rank
 * (np 4) level. A gather gains only with several ranks a node to collect
 * from: at np 8 (4 a node) 3.5-19 us against 4.7-22, at np 6 (3 a node)
 * level up to 1 KiB a rank and 44% behind at 2 KiB, at np 4 (2 a node)
 * 1.2-2.4x behind -- there its messages go straight to the root, eager,
 * while the head waits for its node before it sends. Hence gather only
 * with HIER_GATHER_PER_NODE ranks a node on average. */
#define HIER_GS_MAX    (16u << 10)
#define HIER_GATHER_PER_NODE 4
/* An alltoall's row (bytes a block x ranks) at most, and a slot must hold
 * two (the rank's row, and the blocks other nodes sent it): 32 KiB with
 * the default WEFT_NODE_COLL_KB. Measured as above, 3 alternated rounds:
 * np 8, 64 B-32 KiB rows 28-64 us against 230-330 as messages (each rank
 * 4 tcp messages to the other node against one a head); np 4 20-36
 * against 55-70. With WEFT_NODE_COLL_KB=256, np 8, two rounds: 64-128 KiB
 * rows 108-170 us against 268-481. The bound keeps a head's packing
 * buffer (2 x its node's ranks x a row) within reason at any slot size. */
#define HIER_A2A_MAX   (128u << 10)

size_t node_hier_fits(const struct weft_coll *cc, const struct weft_coll_args *a)
{
    size_t S = node_limit(cc), slot = S, es;
    /* Several nodes, one of them at least with several ranks (else there
     * is nothing to meet in a segment). */
    if (S == 0 || cc->nnodes < 2 || cc->nnodes >= cc->core->size)
        return 0;
    if (S > HIER_MAX)
        S = HIER_MAX;
    switch (a->kind) {
    case WEFT_COLL_BARRIER:
        return 1;
    case WEFT_COLL_BCAST:
        return a->count > 0 && a->count <= S && a->count <= HIER_BCAST_MAX ? a->count : 0;
    case WEFT_COLL_ALLGATHER: {
        /* The result goes back down through the P slots of the call's
         * buffer: on the smallest node (the same answer on every rank) a
         * slot holds the block or its share of the result, whichever is
         * more -- which also picks a big buffer where the small ones are
         * too small for the result. */
        if (cc->ag_algo != 0 || a->count == 0 || a->count > HIER_AG_MAX)   /* (no overflow below) */
            return 0;
        size_t pmin = (size_t)cc->core->size, total = a->count * (size_t)cc->core->size;
        for (int q = 0; q < cc->nnodes; q++)
            if ((size_t)(cc->node_first[q + 1] - cc->node_first[q]) < pmin)
                pmin = (size_t)(cc->node_first[q + 1] - cc->node_first[q]);
        size_t share = (total + pmin - 1) / pmin, need = share > a->count ? share : a->count;
        return total <= HIER_AG_MAX && need <= S ? need : 0;
    }
    case WEFT_COLL_ALLREDUCE:
    case WEFT_COLL_REDUCE:
        if ((a->kind == WEFT_COLL_ALLREDUCE ? cc->ar_algo : cc->red_algo) != 0)
            return 0;
        es = weft_dtype_size(a->dtype);
        return es && a->count > 0 && a->count <= S / es ? a->count * es : 0;
    case WEFT_COLL_REDUCE_SCATTER:
        /* The whole vector (every rank's block) is reduced, as an
         * allreduce of it, and each rank takes its block of the result. */
        es = weft_dtype_size(a->dtype);
        if (cc->rs_algo != 0 || es == 0 || a->count == 0 || a->count > S / es / (size_t)cc->core->size)
            return 0;
        return a->count * es * (size_t)cc->core->size;
    case WEFT_COLL_ALLTOALL: {
        if (cc->a2a_algo != 0 || a->count == 0 || a->count > HIER_A2A_MAX / (size_t)cc->core->size)
            return 0;
        size_t two_rows = 2 * a->count * (size_t)cc->core->size;
        /* Big buffers always: a head writes into the others' slots (their
         * second half), which only a big buffer's bcast-like rule allows
         * (every rank done with the buffer's last call, node_slot_free),
         * and no rank runs ahead in an alltoall anyway. */
        return two_rows > slot ? 0 : two_rows > NODE_SMALL ? two_rows : NODE_SMALL + 1;
    }
    case WEFT_COLL_GATHER:
    case WEFT_COLL_SCATTER: {
        /* A gather's rank writes its block in its slot; a scatter's head
         * writes its node's blocks in its own. The whole data fits the
         * root's scratch (a slot). */
        if (a->count == 0 || a->count > HIER_GS_MAX / (size_t)cc->core->size ||
            a->count * (size_t)cc->core->size > S)
            return 0;
        if (a->kind == WEFT_COLL_GATHER)
            return cc->core->size >= HIER_GATHER_PER_NODE * cc->nnodes ? a->count : 0;
        int pmax = 1;
        for (int q = 0; q < cc->nnodes; q++)
            if (cc->node_first[q + 1] - cc->node_first[q] > pmax)
                pmax = cc->node_first[q + 1] - cc->node_first[q];
        return a->count * (size_t)pmax;
    }
    default:
        return 0;
    }
}

const char *node_hier_algo(const struct weft_coll *cc, const struct weft_coll_args *a)
{
    (void)cc;
    switch (a->kind) {
    case WEFT_COLL_ALLREDUCE: return "node-local shared memory + heads' recursive doubling";
    case WEFT_COLL_BCAST: return "node-local shared memory + heads' binomial tree";
    case WEFT_COLL_ALLGATHER: return "node-local shared memory + heads' ring";
    case WEFT_COLL_REDUCE: return "node-local shared memory + heads' binomial reduce";
    case WEFT_COLL_REDUCE_SCATTER: return "node-local shared memory + heads' recursive doubling, a block each";
    case WEFT_COLL_GATHER: return "node-local shared memory + heads' linear gather";
    case WEFT_COLL_SCATTER: return "node-local shared memory + heads' linear scatter";
    case WEFT_COLL_ALLTOALL: return "node-local shared memory + heads' pairwise exchange";
    default: return "node-local shared memory + heads' dissemination";
    }
}

/* ---------------------------------------------------------------- the heads' phase */

struct heads {
    const int *rank;    /* [m] the head of each node, node order */
    int        m, pos;  /* nodes, this rank's node */
    int        root;    /* bcast, reduce, gather, scatter: the root's node */
    void      *buf;
    size_t     bytes;
    struct coll_rd rd;  /* allreduce, reduce_scatter */
    const int *first;   /* gather, scatter: cc->node_first (node q: blocks first[q] .. first[q+1]-1 of the
                           root's buffer, in cc->node_ranks order) */
    size_t     blk;     /* ... bytes a rank */
};

static void build_heads_barrier(struct weft_sched_build *b, const void *args)
{
    const struct heads *h = args;
    coll_dissemination_build(b, h->rank, h->m, h->pos);
}

static void build_heads_bcast(struct weft_sched_build *b, const void *args)
{
    const struct heads *h = args;
    coll_binomial_bcast_build(b, h->rank, h->m, h->pos, h->root, h->buf, h->bytes);
}

/* Binomial reduce over the heads to the root's node: a head takes its
 * children's partials (v + 1, v + 2, v + 4, ... below its lowest set bit),
 * all received before the first is reduced, and reduces them into buf in
 * that order (the same on every run), then sends buf to its parent. The
 * root's last reduction divides a WEFT_AVG by the comm size. */
static int heads_children(const struct heads *h, int v)
{
    int c = 0;
    for (int mask = 1; mask < h->m && !(v & mask); mask <<= 1)
        if (v + mask < h->m)
            c++;
    return c;
}

static void build_heads_reduce(struct weft_sched_build *b, const void *args)
{
    const struct heads *h = args;
    int m = h->m, v = (h->pos - h->root + m) % m, mask = 1, c = 0, nc = heads_children(h, v);
    for (; mask < m && !(v & mask); mask <<= 1)
        if (v + mask < m)
            weft_sched_recv(b, 0, weft_sched_scratch(b, (size_t)c++ * h->bytes), h->bytes,
                            h->rank[(v + mask + h->root) % m], 0, WEFT_SCHED_NODEP, WEFT_SCHED_F_RECEIVE);
    int dep = WEFT_SCHED_NODEP;
    for (int i = 0; i < nc; i++) {
        if (i == 0)
            weft_sched_fence(b);
        dep = (int)weft_sched_reduce(b, 1, h->buf, h->buf, weft_sched_scratch(b, (size_t)i * h->bytes), h->bytes,
                                     dep, v == 0 && i == nc - 1 ? WEFT_SCHED_F_AVG : 0);
    }
    if (v != 0)
        weft_sched_send(b, 2, h->buf, h->bytes, h->rank[(v - mask + h->root) % m], 0, dep);
}

/*
 * Gather among the heads: every head but the root sends its node's blocks
 * (packed in its ranks' order) to the root in one message; the root posts
 * a receive per node into its buffer, node q's at block first[q], and
 * puts the blocks in place afterwards. Scatter: the mirror image, the
 * root's buffer packed the same way.
 *
 *     3 nodes, root on node 1     head 0            root (node 1)                  head 2
 *                                 SEND -> root      RECV node 2 -> blocks first[2]  SEND -> root
 *                                                   RECV node 0 -> blocks first[0]
 */
static void build_heads_gather(struct weft_sched_build *b, const void *args)
{
    const struct heads *h = args;
    if (h->pos != h->root) {
        weft_sched_send(b, h->pos, h->buf, (size_t)(h->first[h->pos + 1] - h->first[h->pos]) * h->blk,
                        h->rank[h->root], 0, WEFT_SCHED_NODEP);
        return;
    }
    for (int i = 1; i < h->m; i++) {
        int q = (h->root + i) % h->m;
        weft_sched_recv(b, q, (char *)h->buf + (size_t)h->first[q] * h->blk,
                        (size_t)(h->first[q + 1] - h->first[q]) * h->blk, h->rank[q], 0, WEFT_SCHED_NODEP,
                        WEFT_SCHED_F_RECEIVE | WEFT_SCHED_F_EXACT);
    }
}

static void build_heads_scatter(struct weft_sched_build *b, const void *args)
{
    const struct heads *h = args;
    if (h->pos != h->root) {
        weft_sched_recv(b, h->pos, h->buf, (size_t)(h->first[h->pos + 1] - h->first[h->pos]) * h->blk,
                        h->rank[h->root], 0, WEFT_SCHED_NODEP, WEFT_SCHED_F_RECEIVE | WEFT_SCHED_F_EXACT);
        return;
    }
    for (int i = 1; i < h->m; i++) {
        int q = (h->root + i) % h->m;
        weft_sched_send(b, q, (const char *)h->buf + (size_t)h->first[q] * h->blk,
                        (size_t)(h->first[q + 1] - h->first[q]) * h->blk, h->rank[q], 0, WEFT_SCHED_NODEP);
    }
}

/*
 * Alltoall among the heads: to every other node one message with every
 * block this node's ranks send that node's ranks, and one from it. buf
 * holds what goes out, then (from P x size blocks on) what comes in, both
 * laid out by node: node q's part at block P x first[q], P x P_q blocks
 * long, P this node's ranks (out: by source rank, then destination;
 * in: the same, as the sending node laid it out).
 *
 *     3 nodes          head 0                 head 1                 head 2
 *                      RECV from 1, from 2    RECV from 2, from 0    RECV from 0, from 1
 *                      SEND to 1, to 2        SEND to 2, to 0        SEND to 0, to 1
 */
static void build_heads_alltoall(struct weft_sched_build *b, const void *args)
{
    const struct heads *h = args;
    const size_t mine = (size_t)(h->first[h->pos + 1] - h->first[h->pos]) * h->blk;
    for (int i = 1; i < h->m; i++) {
        int q = (h->pos + i) % h->m;
        weft_sched_recv(b, q, (char *)h->buf + mine * (size_t)h->first[h->m] + mine * (size_t)h->first[q],
                        mine * (size_t)(h->first[q + 1] - h->first[q]), h->rank[q], 0, WEFT_SCHED_NODEP,
                        WEFT_SCHED_F_RECEIVE | WEFT_SCHED_F_EXACT);
    }
    for (int i = 1; i < h->m; i++) {
        int q = (h->pos + i) % h->m;
        weft_sched_send(b, h->pos, (const char *)h->buf + mine * (size_t)h->first[q],
                        mine * (size_t)(h->first[q + 1] - h->first[q]), h->rank[q], 0, WEFT_SCHED_NODEP);
    }
}

static void build_heads_rd(struct weft_sched_build *b, const void *args)
{
    const struct heads *h = args;
    coll_rd_build(b, &h->rd);
}

/* This rank, a head, runs call k among the heads: buf (host memory for an
 * allreduce, in place) is what it brings and ends with. On a failure
 * every rank is told (by the schedule, or here). */
static int heads_run(struct node_call *k, const struct weft_coll_args *a, void *buf, size_t bytes)
{
    struct weft_coll *cc = k->cc;
    struct weft_core *core = cc->core;
    int m = cc->nnodes, rc;
    int stack[64], *rank = m <= 64 ? stack : malloc((size_t)m * sizeof *rank);
    if (rank == NULL) {
        weft_set_error(core, WEFT_ERR_NO_MEMORY, "%s (node-local, collective #%u): no memory for %d heads", k->what,
                       k->seq, m);
        return node_fail(k, WEFT_ERR_NO_MEMORY, 1);
    }
    struct heads h;
    memset(&h, 0, sizeof h);
    for (int q = 0; q < m; q++)
        rank[q] = cc->node_ranks[cc->node_first[q]];
    h.rank = rank;
    h.m = m;
    h.pos = cc->node_of[core->rank];
    h.buf = buf;
    h.bytes = bytes;
    struct weft_sched_call call = {
        .what = "barrier hierarchical (heads' dissemination)", .sig = node_sig_of(a), .tag = weft_tag_coll,
        .seq = k->seq, .nranks = core->size,
    };
    weft_sched_build_fn build = build_heads_barrier;
    if (a->kind == WEFT_COLL_BCAST || a->kind == WEFT_COLL_REDUCE || a->kind == WEFT_COLL_GATHER ||
        a->kind == WEFT_COLL_SCATTER) {
        h.root = cc->node_of[a->root];
        rank[h.root] = a->root;
        call.what = "bcast hierarchical (heads' binomial tree)";
        build = build_heads_bcast;
        if (a->kind == WEFT_COLL_REDUCE) {
            call.what = "reduce hierarchical (heads' binomial reduce)";
            call.scratch_bytes = (size_t)heads_children(&h, (h.pos - h.root + m) % m) * bytes;
            build = build_heads_reduce;
        } else if (a->kind != WEFT_COLL_BCAST) {
            h.first = cc->node_first;
            h.blk = a->count;
            call.what = a->kind == WEFT_COLL_GATHER ? "gather hierarchical (heads' linear gather)"
                                                    : "scatter hierarchical (heads' linear scatter)";
            build = a->kind == WEFT_COLL_GATHER ? build_heads_gather : build_heads_scatter;
        }
    } else if (a->kind == WEFT_COLL_ALLREDUCE || a->kind == WEFT_COLL_REDUCE_SCATTER) {
        size_t es = weft_dtype_size(a->dtype), chunk = coll_reduce_chunk(cc, es);
        struct coll_rvec v;
        memset(&v, 0, sizeof v);
        v.esize = es;
        v.chunk_el = chunk / es;
        v.V = bytes / es;
        v.src = buf;
        v.acc = buf;
        v.slot_bytes = chunk < bytes ? chunk : bytes;
        v.out_block = -1;
        struct coll_rd r = { rank, m, h.pos, v, 0 };
        h.rd = r;
        call.what = a->kind == WEFT_COLL_ALLREDUCE ? "allreduce hierarchical (heads' recursive doubling)"
                                                   : "reduce_scatter hierarchical (heads' recursive doubling)";
        call.scratch_bytes = coll_rd_scratch(&h.rd);
        build = build_heads_rd;
    } else if (a->kind == WEFT_COLL_ALLTOALL) {
        h.first = cc->node_first;
        h.blk = a->count;
        call.what = "alltoall hierarchical (heads' pairwise exchange)";
        build = build_heads_alltoall;
    }
    struct weft_coll_op *op = NULL;
    if (a->kind == WEFT_COLL_ALLGATHER)
        rc = coll_allgather_heads_op(cc, &call.sig, k->seq, buf, a->count, &op);
    else
        rc = weft_sched_start(cc, &call, build, &h, &op);
    if (rc == WEFT_SUCCESS)
        rc = weft_coll_op_wait(op);
    if (rank != stack)
        free(rank);
    if (rc != WEFT_SUCCESS) {
        /* Told already when the news came from elsewhere or the schedule
         * told it; else this rank's is the only word of it. */
        char why[64];
        node_fail(k, rc, weft_p2p_fault(cc->p2p, k->seq, why, sizeof why) == WEFT_SUCCESS);
    }
    return rc;
}

/* ---------------------------------------------------------------- a call */

/* Waits for the head's result of call k (its `sliced`), after its arrival
 * (which says whether it is in this very call). */
static int wait_head(struct node_call *k, int head)
{
    int rc = node_wait(k, head, FLAG_ARRIVE, k->tag);
    return rc != WEFT_SUCCESS ? rc : node_wait(k, head, FLAG_SLICED, k->tag);
}

static void put_out(struct node_call *k)
{
    atomic_store_explicit(&k->n->ctrl[k->n->me].sliced, k->tag, memory_order_release);
}

/* A head's host buffer of one slot (node_hier_fits keeps what it holds
 * within one), made at the first call that needs it. */
static int head_scratch(struct node_call *k)
{
    struct coll_node *n = k->n;
    if (n->scratch == NULL && (n->scratch = malloc(n->slot)) == NULL) {
        weft_set_error(k->cc->core, WEFT_ERR_NO_MEMORY,
                       "%s (node-local, collective #%u): no memory for %zu B of scratch", k->what, k->seq, n->slot);
        return node_fail(k, WEFT_ERR_NO_MEMORY, 1);
    }
    return WEFT_SUCCESS;
}

/*
 * Alltoall: each rank's row (its size blocks, by destination) in the
 * first half of its slot. The head packs, for every other node, the
 * blocks its node's ranks send there (heads_buf, by node), exchanges one
 * message each way with that node's head, and writes what came in into
 * the second half of each destination's slot, at the source's block;
 * once it is out (its `sliced`), every rank takes its blocks: a source on
 * its node from that source's row, the others from its own second half.
 * The head writes into the others' slots: a big buffer, every rank done
 * with its last call before (node_slot_free), as a bcast's root does.
 *
 *     node A (a0 head, a1), node B (b0, b1); a1's slot: [row: ->a0 ->a1 ->b0 ->b1][in: from b0, b1]
 *     a0: pack a0->b0 a0->b1 a1->b0 a1->b1 ──> b0;  b0's pack for A ──> a0: into a0's and a1's "in"
 */
static int hier_alltoall(struct node_call *k, const struct weft_coll_args *a, int head)
{
    struct weft_coll *cc = k->cc;
    struct weft_core *core = cc->core;
    struct coll_node *n = k->n;
    const size_t blk = a->count, row = blk * (size_t)core->size, P = (size_t)n->P;
    const int mynode = cc->node_of[core->rank];
    char *mine = slot_of(n, k->b, n->me);
    int rc;

    if ((rc = node_put(core, mine, a->sendbuf, row, k->what)) != WEFT_SUCCESS)
        return rc;
    node_arrive(k);
    if (n->me == head) {
        size_t want = 2 * P * row;
        if (n->heads_bytes < want) {
            char *nb = realloc(n->heads_buf, want);
            if (nb == NULL) {
                weft_set_error(core, WEFT_ERR_NO_MEMORY, "%s (node-local, collective #%u): no memory for %zu B",
                               k->what, k->seq, want);
                return node_fail(k, WEFT_ERR_NO_MEMORY, 1);
            }
            n->heads_buf = nb;
            n->heads_bytes = want;
        }
        if ((rc = node_wait(k, -1, FLAG_ARRIVE, k->tag)) != WEFT_SUCCESS)
            return rc;
        /* Out: node q's part at block P x first[q], source-major. */
        char *out = n->heads_buf, *in = n->heads_buf + P * row;
        for (int q = 0; q < cc->nnodes; q++) {
            if (q == mynode)
                continue;
            size_t Pq = (size_t)(cc->node_first[q + 1] - cc->node_first[q]);
            char *dst = out + P * (size_t)cc->node_first[q] * blk;
            for (size_t i = 0; i < P; i++)
                memcpy(dst + i * Pq * blk, slot_of(n, k->b, (int)i) + (size_t)cc->node_first[q] * blk, Pq * blk);
        }
        if ((rc = heads_run(k, a, n->heads_buf, 0)) != WEFT_SUCCESS)
            return rc;
        /* In: from node q, source j's blocks for this node's ranks i at
         * block P x first[q] + j x P + i. */
        for (int q = 0; q < cc->nnodes; q++) {
            if (q == mynode)
                continue;
            for (int j = cc->node_first[q]; j < cc->node_first[q + 1]; j++) {
                const char *src = in + (P * (size_t)cc->node_first[q] + (size_t)(j - cc->node_first[q]) * P) * blk;
                for (size_t i = 0; i < P; i++)
                    memcpy(slot_of(n, k->b, (int)i) + row + (size_t)cc->node_ranks[j] * blk, src + i * blk, blk);
            }
        }
        put_out(k);
    } else if ((rc = wait_head(k, head)) != WEFT_SUCCESS) {
        return rc;
    }
    /* Every rank of this node arrived before its head put out. */
    for (int j = 0; j < n->P && rc == WEFT_SUCCESS; j++)
        rc = node_copy(core, (char *)a->recvbuf + (size_t)n->ranks[j] * blk,
                       slot_of(n, k->b, j) + (size_t)core->rank * blk, blk, k->what);
    for (int r = 0; r < core->size && rc == WEFT_SUCCESS; r++)
        if (cc->node_of[r] != mynode)
            rc = node_copy(core, (char *)a->recvbuf + (size_t)r * blk, mine + row + (size_t)r * blk, blk, k->what);
    return rc;
}

int node_hier_run(struct node_call *k, const struct weft_coll_args *a, size_t need)
{
    struct weft_core *core = k->cc->core;
    struct coll_node *n = k->n;
    int me = n->me, head = 0, rc;
    char *mine = slot_of(n, k->b, me);

    if (a->kind == WEFT_COLL_BCAST || a->kind == WEFT_COLL_REDUCE || a->kind == WEFT_COLL_GATHER ||
        a->kind == WEFT_COLL_SCATTER)
        for (int i = 0; i < n->P; i++)
            if (n->ranks[i] == a->root)
                head = i;
    if ((rc = node_slot_free(k)) != WEFT_SUCCESS)
        return rc;

    switch (a->kind) {
    case WEFT_COLL_BARRIER:
        node_arrive(k);
        if (me != head)
            return wait_head(k, head);
        if ((rc = node_wait(k, -1, FLAG_ARRIVE, k->tag)) != WEFT_SUCCESS ||
            (rc = heads_run(k, a, NULL, 0)) != WEFT_SUCCESS)
            return rc;
        put_out(k);
        return WEFT_SUCCESS;

    case WEFT_COLL_BCAST:
        if (me != head) {
            node_arrive(k);
            if ((rc = wait_head(k, head)) != WEFT_SUCCESS)
                return rc;
            return node_copy(core, a->recvbuf, slot_of(n, k->b, head), need, k->what);
        }
        if (core->rank == a->root) {
            /* The node has it at once; the other heads meanwhile. */
            if ((rc = node_put(core, mine, a->recvbuf, need, k->what)) != WEFT_SUCCESS)
                return rc;
            node_arrive(k);
            put_out(k);
            return heads_run(k, a, a->recvbuf, need);
        }
        node_arrive(k);
        if ((rc = heads_run(k, a, a->recvbuf, need)) != WEFT_SUCCESS ||
            (rc = node_put(core, mine, a->recvbuf, need, k->what)) != WEFT_SUCCESS)
            return rc;
        put_out(k);
        return WEFT_SUCCESS;

    case WEFT_COLL_ALLREDUCE:
    case WEFT_COLL_REDUCE_SCATTER: {
        /* The head reduces its node's slots (WEFT_AVG as a sum) and runs
         * the heads' recursive doubling on the result, which it puts in
         * its slot. An allreduce's ranks copy it all out; a
         * reduce_scatter is an allreduce of the whole vector, each rank
         * copying out its own block (in place, recvbuf inside sendbuf,
         * is safe: sendbuf is in the slot before recvbuf is written). */
        const int rs = a->kind == WEFT_COLL_REDUCE_SCATTER;
        const size_t es = weft_dtype_size(a->dtype), blk = rs ? a->count * es : need;
        const size_t off = rs ? (size_t)core->rank * blk : 0;
        if ((rc = node_put(core, mine, a->sendbuf, need, k->what)) != WEFT_SUCCESS)
            return rc;
        node_arrive(k);
        if (me != head) {
            if ((rc = wait_head(k, head)) != WEFT_SUCCESS)
                return rc;
            return node_copy(core, a->recvbuf, slot_of(n, k->b, head) + off, blk, k->what);
        }
        if (rs && (rc = head_scratch(k)) != WEFT_SUCCESS)
            return rc;
        if ((rc = node_wait(k, -1, FLAG_ARRIVE, k->tag)) != WEFT_SUCCESS)
            return rc;
        char *dst = rs ? n->scratch : node_result_buf(k, a->recvbuf);
        if (n->P == 1)
            memcpy(dst, mine, need);
        else
            node_reduce_range(k, dst, NULL, 0, need / es, a->dtype, a->op == WEFT_AVG ? WEFT_SUM : a->op);
        if ((rc = heads_run(k, a, dst, need)) != WEFT_SUCCESS)
            return rc;
        memcpy(mine, dst, need);
        put_out(k);
        return node_copy(core, a->recvbuf, dst + off, blk, k->what);
    }
    case WEFT_COLL_REDUCE: {
        /* The node's partial is reduced by its head (the root on its
         * node) into host memory of its own -- its slot is an operand --
         * and goes up the heads' tree; the others leave once their part
         * is out -- in a big buffer once every rank of the node arrived
         * -- as on one node (run_call). */
        if ((rc = node_put(core, mine, a->sendbuf, need, k->what)) != WEFT_SUCCESS)
            return rc;
        node_arrive(k);
        if (me != head)
            return k->b < NODE_NSMALL ? WEFT_SUCCESS : node_wait(k, -1, FLAG_ARRIVE, k->tag);
        if ((rc = head_scratch(k)) != WEFT_SUCCESS)
            return rc;
        if ((rc = node_wait(k, -1, FLAG_ARRIVE, k->tag)) != WEFT_SUCCESS)
            return rc;
        if (n->P == 1)
            memcpy(n->scratch, mine, need);
        else
            node_reduce_range(k, n->scratch, NULL, 0, a->count, a->dtype, a->op == WEFT_AVG ? WEFT_SUM : a->op);
        if ((rc = heads_run(k, a, n->scratch, need)) != WEFT_SUCCESS)
            return rc;
        return core->rank == a->root ? node_copy(core, a->recvbuf, n->scratch, need, k->what) : WEFT_SUCCESS;
    }
    case WEFT_COLL_ALLGATHER: {
        /* Each rank's block up through its slot; the head puts the
         * nodes' blocks together in its recvbuf with the other heads, and
         * the whole result back down through all P slots of the buffer
         * (theirs are read by then; nobody writes them again before every
         * rank is done with this call, node_slot_free). */
        size_t total = a->count * (size_t)core->size;
        char *own = (char *)a->recvbuf + (size_t)core->rank * a->count, *area = slot_of(n, k->b, 0);
        if (me != head) {
            if ((rc = node_put(core, mine, a->sendbuf, a->count, k->what)) != WEFT_SUCCESS)
                return rc;
            node_arrive(k);
            if ((rc = wait_head(k, head)) != WEFT_SUCCESS)
                return rc;
            return node_copy(core, a->recvbuf, area, total, k->what);
        }
        node_arrive(k);
        if ((rc = node_wait(k, -1, FLAG_ARRIVE, k->tag)) != WEFT_SUCCESS)
            return rc;
        for (int i = 0; i < n->P && rc == WEFT_SUCCESS; i++)
            if (i != me)
                rc = node_copy(core, (char *)a->recvbuf + (size_t)n->ranks[i] * a->count, slot_of(n, k->b, i),
                               a->count, k->what);
        if (rc == WEFT_SUCCESS && (const char *)a->sendbuf != own)
            rc = node_copy(core, own, a->sendbuf, a->count, k->what);
        if (rc != WEFT_SUCCESS)
            return node_fail(k, rc, 1);
        if ((rc = heads_run(k, a, a->recvbuf, total)) != WEFT_SUCCESS)
            return rc;
        if (n->P > 1 && (rc = node_copy(core, area, a->recvbuf, total, k->what)) != WEFT_SUCCESS)
            return node_fail(k, rc, 1);
        put_out(k);
        return WEFT_SUCCESS;
    }
    case WEFT_COLL_GATHER: {
        /* Each rank's block in its slot, as on one node; the head (the
         * root on its node) takes them: the root straight into recvbuf,
         * another head packed in its ranks' order into scratch, one
         * message to the root, which unpacks each node's (cc->node_ranks
         * order). The others leave once their block is out. */
        size_t blk = a->count;
        const char *own = core->rank == a->root ? (char *)a->recvbuf + (size_t)core->rank * blk : NULL;
        if (me != head) {
            if ((rc = node_put(core, mine, a->sendbuf, blk, k->what)) != WEFT_SUCCESS)
                return rc;
            node_arrive(k);
            return WEFT_SUCCESS;
        }
        node_arrive(k);
        if ((rc = head_scratch(k)) != WEFT_SUCCESS || (rc = node_wait(k, -1, FLAG_ARRIVE, k->tag)) != WEFT_SUCCESS)
            return rc;
        char *scr = n->scratch;
        for (int i = 0; i < n->P && rc == WEFT_SUCCESS; i++) {
            const void *from = i == me ? a->sendbuf : slot_of(n, k->b, i);
            if (core->rank != a->root)
                rc = node_copy(core, scr + (size_t)i * blk, from, blk, k->what);
            else if (i != me || (const char *)a->sendbuf != own)
                rc = node_copy(core, (char *)a->recvbuf + (size_t)n->ranks[i] * blk, from, blk, k->what);
        }
        if (rc != WEFT_SUCCESS)
            return node_fail(k, rc, 1);
        if ((rc = heads_run(k, a, scr, (size_t)n->P * blk)) != WEFT_SUCCESS || core->rank != a->root)
            return rc;
        for (int j = 0; j < core->size && rc == WEFT_SUCCESS; j++)
            if (k->cc->node_of[k->cc->node_ranks[j]] != k->cc->node_of[a->root])
                rc = node_copy(core, (char *)a->recvbuf + (size_t)k->cc->node_ranks[j] * blk, scr + (size_t)j * blk,
                               blk, k->what);
        return rc;
    }
    case WEFT_COLL_SCATTER: {
        /* The root writes its node's blocks in its slot (its ranks'
         * order) for the node, and every other node's packed into scratch
         * (cc->node_ranks order) for one message to that node's head,
         * which receives it straight into its slot; each rank copies out
         * its block. */
        size_t blk = a->count;
        if (me != head) {
            node_arrive(k);
            if ((rc = wait_head(k, head)) != WEFT_SUCCESS)
                return rc;
            return node_copy(core, a->recvbuf, slot_of(n, k->b, head) + (size_t)me * blk, blk, k->what);
        }
        if (core->rank != a->root) {
            node_arrive(k);
            if ((rc = heads_run(k, a, mine, (size_t)n->P * blk)) != WEFT_SUCCESS)
                return rc;
            put_out(k);
            return node_copy(core, a->recvbuf, mine + (size_t)me * blk, blk, k->what);
        }
        const char *send = a->sendbuf;
        for (int i = 0; i < n->P && rc == WEFT_SUCCESS; i++)
            if (i != me)
                rc = node_put(core, mine + (size_t)i * blk, send + (size_t)n->ranks[i] * blk, blk, k->what);
        if (rc != WEFT_SUCCESS)
            return rc;
        node_arrive(k);
        put_out(k);
        if ((rc = head_scratch(k)) != WEFT_SUCCESS)
            return rc;
        char *scr = n->scratch;
        for (int j = 0; j < core->size && rc == WEFT_SUCCESS; j++)
            if (k->cc->node_of[k->cc->node_ranks[j]] != k->cc->node_of[a->root])
                rc = node_copy(core, scr + (size_t)j * blk, send + (size_t)k->cc->node_ranks[j] * blk, blk, k->what);
        if (rc != WEFT_SUCCESS)
            return node_fail(k, rc, 1);
        if ((rc = heads_run(k, a, scr, 0)) != WEFT_SUCCESS)
            return rc;
        if ((char *)a->recvbuf != send + (size_t)core->rank * blk)
            rc = node_copy(core, a->recvbuf, send + (size_t)core->rank * blk, blk, k->what);
        return rc;
    }
    case WEFT_COLL_ALLTOALL:
        return hier_alltoall(k, a, head);
    default:
        return weft_set_error(core, WEFT_ERR_INTERNAL, "node-local collectives across nodes: kind %d", a->kind);
    }
}
