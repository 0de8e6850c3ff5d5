/*
 * weft_allreduce: ring, recursive doubling, Rabenseifner, hierarchical;
 * the selector and WEFT_ALLREDUCE_ALGO forcing (cc->ar_algo).
 *
 * Every algorithm runs on any number of ranks (rd and Rabenseifner fold a
 * non-power-of-two count, hier falls back to ring on one node), so a
 * forced algorithm is never refused. Every element of the result is
 * computed by one REDUCE in a fixed operand order and then copied, or
 * computed identically on every rank (rd), so all ranks end with the same
 * bits (coll_reduce_algo.h).
 *
 * Selector thresholds (first guesses from the usual cost model, to be
 * replaced by measurements in docs/benchmarks.md, "## Allreduce"): with a
 * message latency a (a few us over shm, more over tcp) and per-byte costs
 * b (transfer) and g (reduce), for n ranks and S bytes
 *     rd:            log2(n) (a + S b + S g)
 *     Rabenseifner:  2 log2(n) a + 2 (n-1)/n S b + (n-1)/n S g
 *     ring:          2 (n-1) a + 2 (n-1)/n S b + (n-1)/n S g, pipelined
 * rd wins while S (b + 2g) stays below ~log2(n) a: about 32 KiB at a = 3 us,
 * b = g = 0.1 ns/B, n = 4..8. The ring pays 2(n-1) latencies against
 * Rabenseifner's 2 log2(n) but overlaps reduction with transfer, which
 * outweighs those latencies from a few hundred KiB: 256 KiB. Rabenseifner
 * only for powers of two: on other counts its fold moves the whole vector
 * twice more. hier when the comm spans several nodes, some with several
 * ranks, from the rd threshold up (below it rd's log2(n) messages win).
 * Two ranks have a rule of their own, measured (ar_select).
 */
#include <stdlib.h>
#include <string.h>
#include "coll_reduce_algo.h"
#include "config.h"
#include "core.h"
#include "devcopy.h"
#include "log.h"
#include "reduce_kernel.h"
#include "weft.h"

#define WEFT_AR_RD_MAX  (32u * 1024u)    /* bytes: recursive doubling up to here */
#define WEFT_AR_RAB_MAX (256u * 1024u)   /* bytes: Rabenseifner (powers of two) below */

struct ar_args {
    const struct weft_coll *cc;
    int                     n, me;
    const char             *send;
    char                   *recv;
    size_t                  count, esize, chunk;
    /* hier */
    const int              *leaders;
    int                     leader_algo;   /* WEFT_AR_RING or WEFT_AR_RD */
};

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* The vector of an allreduce, identity layout, partials in recvbuf. */
static struct coll_rvec ar_rvec(const struct ar_args *a, const char *src)
{
    struct coll_rvec v;
    memset(&v, 0, sizeof v);
    v.esize = a->esize;
    v.chunk_el = a->chunk / a->esize;
    v.V = a->count;
    v.src = src;
    v.acc = a->recv;
    v.slot_bytes = min_sz(a->chunk, a->count * a->esize);
    v.out_block = -1;
    return v;
}

/* Ring over m members (members NULL: every rank), contribution src. */
static struct coll_ring_rs ar_ring_rs(const struct ar_args *a, const int *members, int m, int pos, const char *src,
                                      int phase)
{
    size_t block = (a->count + (size_t)m - 1) / (size_t)m, lo = min_sz((size_t)pos * block, a->count);
    struct coll_ring_rs r = {
        .members = members, .m = m, .my_pos = pos, .esize = a->esize, .block = block, .total = a->count,
        .src = src, .acc = a->recv, .out = a->recv + lo * a->esize, .gather_root = -1, .gather_buf = NULL,
        .chunk = a->chunk, .scratch_off = 0, .phase = phase,
    };
    return r;
}

/* The ring: reduce-scatter, a fence (the allgather's receives land where
 * the reduce-scatter's sends read), the allgather ring over the same
 * blocks. */
static void ar_ring_phases(struct weft_sched_build *b, const struct ar_args *a, const int *members, int m, int pos,
                           const char *src, int phase)
{
    struct coll_ring_rs rs = ar_ring_rs(a, members, m, pos, src, phase);
    coll_ring_rs_build(b, &rs);
    weft_sched_fence(b);
    struct coll_ring ag = {
        .members = members, .rot = 0, .m = m, .my_pos = pos, .segs = NULL, .seg_first = NULL,
        .block = rs.block * a->esize, .total = a->count * a->esize, .buf = a->recv, .own_src = NULL,
        .full_pos = -1, .chunk = a->chunk, .phase = phase + 2,
    };
    coll_ring_build(b, &ag);
}

/*
 * Ring: the pipelined ring reduce-scatter (ring_reduce.c), after which rank
 * r holds block r = elements [r*ceil(count/n), ...) complete, then the
 * pipelined ring allgather of the blocks (allgather.c's generic ring).
 * Partial sums live in recvbuf; out of place the partials are received
 * straight into it, in place through a few scratch slots.
 *
 *     rank:        0      1      2      3
 *     RS step 0:   [3]->  [0]->  [1]->  [2]->     own data, chunk by chunk
 *     RS step 1:   [2]+-> [3]+-> [0]+-> [1]+->    reduced chunk forwarded at once
 *     RS step 2:   [1]+   [2]+   [3]+   [0]+      rank r has block r (F_AVG here)
 *     --- fence ---
 *     AG steps 1-3: block r goes round the ring   everyone has [0 1 2 3]
 *
 * Each rank sends and receives 2 (n-1)/n of the vector, the optimum.
 */
static void build_ring(struct weft_sched_build *b, const void *args)
{
    const struct ar_args *a = args;
    ar_ring_phases(b, a, NULL, a->n, a->me, a->send, 0);
}

static size_t scratch_ring(const struct ar_args *a)
{
    struct coll_ring_rs rs = ar_ring_rs(a, NULL, a->n, a->me, a->send, 0);
    return coll_ring_rs_scratch(&rs);
}

/* Recursive doubling over every rank (rec_reduce.c has the diagram). */
static void build_rd(struct weft_sched_build *b, const void *args)
{
    const struct ar_args *a = args;
    struct coll_rd r = { NULL, a->n, a->me, ar_rvec(a, a->send), 0 };
    coll_rd_build(b, &r);
}

static size_t scratch_rd(const struct ar_args *a)
{
    struct coll_rd r = { NULL, a->n, a->me, ar_rvec(a, a->send), 0 };
    return coll_rd_scratch(&r);
}

/*
 * Rabenseifner: reduce-scatter by recursive halving, then allgather by
 * recursive doubling (rec_reduce.c, coll_halving_build), with the fold on
 * counts that are not powers of two.
 *
 *     new rank:   0        1        2        3       segments [s0 s1 s2 s3]
 *     halve 1:    0<------------->2                  keep [s0 s1] / [s2 s3]
 *                          1<------------->3
 *     halve 2:    0<----->1        2<----->3         keep s0 / s1 / s2 / s3 (F_AVG)
 *     --- fence ---
 *     double 1:   0<----->1        2<----->3         hold [s0 s1] / [s2 s3]
 *     double 2:   0<------------->2,  1<------------->3   hold everything
 *
 * log2(n) latencies twice, and each rank moves 2 (n-1)/n of the vector.
 */
static void build_rab(struct weft_sched_build *b, const void *args)
{
    const struct ar_args *a = args;
    struct coll_halving h = { a->n, a->me, 0, ar_rvec(a, a->send), 0 };
    coll_halving_build(b, &h);
}

static size_t scratch_rab(const struct ar_args *a)
{
    struct coll_halving h = { a->n, a->me, 0, ar_rvec(a, a->send), 0 };
    return coll_halving_scratch(&h);
}

/*
 * Hierarchical (several nodes, real or WEFT_VIRTUAL_NODES); the lowest
 * rank of each node is its leader (*).
 *
 *     node A: a0* a1 a2               node B: b0* b1
 *     1. chain reduce in the node:    a2 -> a1 -> a0      b1 -> b0
 *        (pipelined chunks; a1 computes x1 op x2, a0 x0 op (x1 op x2))
 *     --- fence ---
 *     2. allreduce among leaders:     a0 <--ring or rd--> b0   (F_AVG here)
 *     --- fence ---
 *     3. chain bcast in the node:     a0 -> a1 -> a2      b0 -> b1
 *
 * Only leaders cross nodes, each with the whole vector once each way of
 * the leaders' algorithm; inside a node every link carries the vector once
 * per direction. Everybody ends with the leaders' bits.
 *
 * Schedule: the chain (windowed RECV + REDUCE from the next local rank,
 * the reduced chunk forwarded at once, lane 0); the leaders' ring (lanes 1
 * and 3) or rd (lanes 4..6); the bcast chain (every RECV, then each chunk
 * forwarded once in, lane 7).
 */
static void hier_local(const struct ar_args *a, const int **local, int *nlocal, int *idx)
{
    const struct weft_coll *cc = a->cc;
    int node = cc->node_of[a->me];
    *local = cc->node_ranks + cc->node_first[node];
    *nlocal = cc->node_first[node + 1] - cc->node_first[node];
    *idx = 0;
    while ((*local)[*idx] != a->me)
        (*idx)++;
}

static void build_hier(struct weft_sched_build *b, const void *args)
{
    enum { W = COLL_RVEC_WINDOW };
    const struct ar_args *a = args;
    const struct weft_coll *cc = a->cc;
    const int *local;
    int L, i, rq[W];
    size_t es = a->esize, total = a->count * es;
    size_t slot = min_sz(a->chunk, total);

    hier_local(a, &local, &L, &i);

    /* 1. chain reduce towards the leader: each chunk = own op (the rest). */
    if (L > 1) {
        if (i == L - 1) {
            for (size_t off = 0; off < total; off += a->chunk)
                weft_sched_send(b, 1, a->send + off, min_sz(a->chunk, total - off), local[i - 1], 0,
                                WEFT_SCHED_NODEP);
        } else {
            size_t post = 0;
            int k = 0;
            for (; k < W && post < total; k++, post += a->chunk)
                rq[k] = (int)weft_sched_recv(b, 1, weft_sched_scratch(b, (size_t)k * slot),
                                             min_sz(a->chunk, total - post), local[i + 1], 0, WEFT_SCHED_NODEP,
                                             WEFT_SCHED_F_RECEIVE);
            k = 0;
            for (size_t off = 0; off < total; off += a->chunk, k++) {
                size_t len = min_sz(a->chunk, total - off);
                char *in = weft_sched_scratch(b, (size_t)(k % W) * slot);
                weft_sched_reduce(b, 1, a->recv + off, a->send + off, in, len, rq[k % W], 0);
                if (post < total) {
                    rq[k % W] = (int)weft_sched_recv(b, 1, in, min_sz(a->chunk, total - post), local[i + 1], 0,
                                                     WEFT_SCHED_NODEP, WEFT_SCHED_F_RECEIVE);
                    post += a->chunk;
                }
                if (i > 0)
                    weft_sched_send(b, 1, a->recv + off, len, local[i - 1], 0, WEFT_SCHED_NODEP);
            }
        }
        weft_sched_fence(b);
    }

    /* 2. the leaders. */
    if (i == 0) {
        const char *src = L > 1 ? a->recv : a->send;
        int nn = cc->nnodes, pos = cc->node_of[a->me];
        if (a->leader_algo == WEFT_AR_RD) {
            struct coll_rd r = { a->leaders, nn, pos, ar_rvec(a, src), 4 };
            coll_rd_build(b, &r);
        } else {
            ar_ring_phases(b, a, a->leaders, nn, pos, src, 1);
        }
        weft_sched_fence(b);
    }

    /* 3. chain bcast from the leader. */
    if (L > 1) {
        size_t first = b->n;
        if (i > 0)
            for (size_t off = 0; off < total; off += a->chunk)
                weft_sched_recv(b, 3, a->recv + off, min_sz(a->chunk, total - off), local[i - 1], 7,
                                WEFT_SCHED_NODEP, WEFT_SCHED_F_RECEIVE);
        if (i < L - 1) {
            size_t k = 0;
            for (size_t off = 0; off < total; off += a->chunk, k++)
                weft_sched_send(b, 3, a->recv + off, min_sz(a->chunk, total - off), local[i + 1], 7,
                                i > 0 ? (int)(first + k) : WEFT_SCHED_NODEP);
        }
    }
}

static size_t scratch_hier(const struct ar_args *a)
{
    const int *local;
    int L, i;
    size_t s = 0, t;
    hier_local(a, &local, &L, &i);
    if (L > 1 && i < L - 1)
        s = (size_t)COLL_RVEC_WINDOW * min_sz(a->chunk, a->count * a->esize);
    if (i == 0) {
        const char *src = L > 1 ? a->recv : a->send;
        int nn = a->cc->nnodes, pos = a->cc->node_of[a->me];
        if (a->leader_algo == WEFT_AR_RD) {
            struct coll_rd r = { a->leaders, nn, pos, ar_rvec(a, src), 4 };
            t = coll_rd_scratch(&r);
        } else {
            struct coll_ring_rs rs = ar_ring_rs(a, a->leaders, nn, pos, src, 1);
            t = coll_ring_rs_scratch(&rs);
        }
        if (t > s)
            s = t;
    }
    return s;
}

/* ---- selector ---- */

static int is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

/* hier has something to do: several nodes, not all of one rank. */
static int hier_applies(const struct weft_coll *cc)
{
    return cc->nnodes > 1 && cc->nnodes < cc->core->size;
}

/* Two ranks (measured, docs/benchmarks.md "Allreduce at two ranks"): rd
 * -- one exchange of the whole vector, both reducing it at once -- took
 * 20-31 us at 128 KiB against Rabenseifner's 33-80 (its halving and
 * doubling are two exchanges of halves, whose latency the second core
 * does not hide) and the ring's 24-30; from 256 KiB the ring is level
 * with rd, from 1 MiB ahead. So rd up to 128 KiB, the ring above. */
#define WEFT_AR_RD_MAX_2 (128u * 1024u)

static int ar_select(const struct weft_coll *cc, size_t bytes)
{
    int n = cc->core->size;
    if (n == 2)
        return bytes <= WEFT_AR_RD_MAX_2 ? WEFT_AR_RD : WEFT_AR_RING;
    if (bytes <= WEFT_AR_RD_MAX)
        return WEFT_AR_RD;
    if (hier_applies(cc))
        return WEFT_AR_HIER;
    if (is_pow2(n) && bytes < WEFT_AR_RAB_MAX)
        return WEFT_AR_RABENSEIFNER;
    return WEFT_AR_RING;
}

int coll_allreduce_start(struct weft_coll *cc, const struct weft_coll_args *ca, weft_coll_tag_fn tag, uint32_t seq,
                         struct weft_coll_op **op)
{
    struct weft_core *core = cc->core;
    size_t es = weft_dtype_size(ca->dtype), count = ca->count;
    int n = core->size, algo = cc->ar_algo, forced = algo != WEFT_AR_AUTO, rc;
    int *leaders = NULL;

    *op = NULL;
    if (count == 0)
        return WEFT_SUCCESS;
    if (es == 0 || count > SIZE_MAX / es)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_allreduce: %zu elements of type %d do not fit in memory",
                              count, ca->dtype);
    size_t bytes = count * es;
    if (n == 1) {
        /* The sum of one contribution (avg: divided by 1) is itself. */
        if (ca->sendbuf != ca->recvbuf && !(ca->prep && ca->prep->dry))
            return weft_devcopy(core, ca->recvbuf, ca->sendbuf, bytes, "weft_allreduce");
        return WEFT_SUCCESS;
    }
    if (!forced)
        algo = ar_select(cc, bytes);
    if (algo == WEFT_AR_HIER && !hier_applies(cc))
        algo = WEFT_AR_RING;   /* one node, or one rank per node: the ring is the same thing */
    coll_reduce_log_shape(cc, WEFT_COLL_ALLREDUCE, count, ca->dtype, ca->op, algo, weft_allreduce_algo_names[algo],
                          forced);

    struct weft_sched_call call;
    struct coll_reduce_plan plan;
    const void *sb;
    void *rb;
    memset(&call, 0, sizeof call);
    if ((rc = coll_reduce_begin(cc, ca, bytes, bytes, &sb, &rb, &call, &plan)) != WEFT_SUCCESS)
        return rc;

    struct ar_args a;
    memset(&a, 0, sizeof a);
    a.cc = cc;
    a.n = n;
    a.me = core->rank;
    a.send = sb;
    a.recv = rb;
    a.count = count;
    a.esize = es;
    a.chunk = coll_reduce_chunk(cc, es);

    weft_sched_build_fn build;
    switch (algo) {
    case WEFT_AR_RD:
        build = build_rd;
        call.what = "allreduce recursive doubling";
        call.scratch_bytes = scratch_rd(&a);
        break;
    case WEFT_AR_RABENSEIFNER:
        build = build_rab;
        call.what = "allreduce rabenseifner";
        call.scratch_bytes = scratch_rab(&a);
        break;
    case WEFT_AR_HIER:
        build = build_hier;
        call.what = "allreduce hierarchical";
        leaders = malloc((size_t)cc->nnodes * sizeof *leaders);
        if (leaders == NULL) {
            if (call.stage)
                coll_stage_put(cc, call.stage);
            return weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_allreduce: no memory for %d node leaders",
                                  cc->nnodes);
        }
        for (int q = 0; q < cc->nnodes; q++)
            leaders[q] = cc->node_ranks[cc->node_first[q]];
        a.leaders = leaders;
        a.leader_algo = bytes <= WEFT_AR_RD_MAX ? WEFT_AR_RD : WEFT_AR_RING;
        call.scratch_bytes = scratch_hier(&a);
        break;
    default:
        build = build_ring;
        call.what = "allreduce ring";
        call.scratch_bytes = scratch_ring(&a);
        break;
    }
    call.tag = tag;
    call.seq = seq;
    rc = coll_reduce_launch(cc, &call, &plan, sb, rb, build, &a, op);
    free(leaders);
    return rc;
}
