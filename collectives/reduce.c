/*
 * weft_reduce: binomial tree (small vectors) and ring (reduce-scatter, then
 * the blocks gathered at the root) for large ones; the selector and
 * WEFT_REDUCE_ALGO forcing (cc->red_algo). recvbuf is used at the root
 * only (NULL elsewhere is fine) and no rank's sendbuf is ever written.
 *
 * Selector (measured, docs/benchmarks.md "Reduce: tree or ring"): the
 * root of the tree receives and reduces log2(n) whole vectors, the ring's
 * root about (n-1)/n of one plus the gathered blocks, after 2(n-1)
 * latencies: with latency a and reduce cost g per byte the ring wins once
 * S g (log2(n) - 1) exceeds ~2(n-1) a -- some hundreds of KiB at 4..8
 * ranks with a core each, not the 32 KiB first guessed. Measured on 2
 * cores (ranks interleaved with Open MPI's in the same rounds): the tree
 * took 0.65-0.9 of the ring's time from 128 KiB to 512 KiB at np 3, 4 and
 * 8, and at np 2 up to 4 MiB (where the "ring" is a reduce-scatter of two
 * halves and a gather: two more latencies, no less work at the root);
 * at 1 MiB np 8 the ring was 10% ahead. So: the tree up to 512 KiB, and
 * at every size on two ranks.
 */
#include <string.h>
#include "coll_reduce_algo.h"
#include "config.h"
#include "core.h"
#include "devcopy.h"
#include "log.h"
#include "reduce_kernel.h"
#include "tags.h"
#include "weft.h"

#define WEFT_RED_TREE_MAX (512u * 1024u)  /* bytes: binomial tree up to here (two ranks: always) */

/* Children a rank can have in a binomial tree over an int rank count. */
#define RED_MAX_CHILDREN 32

struct red_args {
    int         n, me, root;
    const char *send;
    char       *recv;     /* root only */
    size_t      count, esize, chunk;
};

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* The tree around this rank: its parent (-1 at the root) and children, in
 * the order their subtrees follow it (ranks relative to the root). */
static int red_tree(const struct red_args *a, int *parent, int *children)
{
    int n = a->n, v = (a->me - a->root + n) % n, nc = 0;
    *parent = -1;
    for (int mask = 1; mask < n; mask <<= 1) {
        if (v & mask) {
            *parent = (v - mask + a->root) % n;
            break;
        }
        if (v + mask < n)
            children[nc++] = (v + mask + a->root) % n;
    }
    return nc;
}

/* Scratch of the tree: [acc x 2 | slots x 2 x children], pieces of `piece` bytes. */
static size_t tree_piece(const struct red_args *a)
{
    return min_sz(a->chunk, a->count * a->esize);
}

static size_t tree_scratch(const struct red_args *a)
{
    int parent, children[RED_MAX_CHILDREN];
    int nc = red_tree(a, &parent, children);
    if (nc == 0)
        return 0;
    return (size_t)(2 * nc + (parent >= 0 ? 2 : 0)) * tree_piece(a);
}

/*
 * Binomial tree towards the root, over ranks relative to it (v = rank -
 * root mod n): v receives from v + 2^k for every 2^k below its lowest set
 * bit, smallest first, and sends the sum to v - (its lowest set bit).
 *
 *     v:   0 <- 1    2 <- 3    4 <- 5    6 <- 7     2^0
 *          0 <------ 2         4 <------ 6          2^1
 *          0 <---------------- 4                    2^2
 *
 *     operand order: what v holds (ranks v .. v+2^k-1) op what v+2^k
 *     sends (the ranks after them): x0 op x1, then (x0 op x1) op (x2 op x3) ...
 *
 * The vector goes in pieces of a chunk, so the tree pipelines and the
 * scratch stays small: each piece has its partial sum (two, alternating, so
 * piece q+1 is reduced while piece q is still being sent) and a receive
 * slot per child (two sets). A partial sum's buffer is reused two pieces
 * later, once its SEND completed.
 *
 * Schedule: the RECVs of piece 0; per piece q: the RECVs of piece q+1, the
 * wait for the SEND of piece q-2, the REDUCE per child (dep: its RECV; the
 * last at the root with F_AVG), the SEND up. A leaf only sends its pieces.
 * Everything up goes on the lane WEFT_TAG_COLL_PHASE_TO_ROOT: above the
 * user eager limit by rendezvous, so a leaf does not run calls ahead of
 * its parent (p2p/tags.h).
 */
struct tree_args_state {
    int rq[2][RED_MAX_CHILDREN];
};

static void tree_post(struct weft_sched_build *b, const struct red_args *a, const int *children, int nc,
                      size_t q, size_t nq, size_t acc_bytes, struct tree_args_state *st)
{
    size_t pe = tree_piece(a), off = q * pe, total = a->count * a->esize;
    if (q >= nq)
        return;
    for (int ci = 0; ci < nc; ci++)
        st->rq[q & 1][ci] = (int)weft_sched_recv(
            b, ci + 1, weft_sched_scratch(b, acc_bytes + ((q & 1) * (size_t)nc + (size_t)ci) * pe),
            min_sz(pe, total - off), children[ci], WEFT_TAG_COLL_PHASE_TO_ROOT, WEFT_SCHED_NODEP,
            WEFT_SCHED_F_RECEIVE);
}

static void build_binomial(struct weft_sched_build *b, const void *args)
{
    const struct red_args *a = args;
    int parent, children[RED_MAX_CHILDREN], sq[2] = { WEFT_SCHED_NODEP, WEFT_SCHED_NODEP };
    int nc = red_tree(a, &parent, children);
    size_t pe = tree_piece(a), total = a->count * a->esize, nq = (total + pe - 1) / pe;
    size_t acc_bytes = parent >= 0 ? 2 * pe : 0;
    struct tree_args_state st;

    if (nc == 0) {
        for (size_t off = 0; off < total; off += pe)
            weft_sched_send(b, 0, a->send + off, min_sz(pe, total - off), parent, WEFT_TAG_COLL_PHASE_TO_ROOT,
                            WEFT_SCHED_NODEP);
        return;
    }
    tree_post(b, a, children, nc, 0, nq, acc_bytes, &st);
    for (size_t q = 0; q < nq; q++) {
        size_t off = q * pe, len = min_sz(pe, total - off);
        tree_post(b, a, children, nc, q + 1, nq, acc_bytes, &st);
        char *dst;
        if (parent >= 0) {
            if (q >= 2)
                coll_sched_wait(b, 0, sq[q & 1]);
            dst = weft_sched_scratch(b, (q & 1) * pe);
        } else {
            dst = a->recv + off;
        }
        for (int ci = 0; ci < nc; ci++) {
            const char *left = ci == 0 ? a->send + off : dst;
            const char *in = weft_sched_scratch(b, acc_bytes + ((q & 1) * (size_t)nc + (size_t)ci) * pe);
            weft_sched_reduce(b, ci + 1, dst, left, in, len, st.rq[q & 1][ci],
                              (parent < 0 && ci == nc - 1) ? WEFT_SCHED_F_AVG : 0);
        }
        if (parent >= 0)
            sq[q & 1] = (int)weft_sched_send(b, 0, dst, len, parent, WEFT_TAG_COLL_PHASE_TO_ROOT, WEFT_SCHED_NODEP);
    }
}

/*
 * Ring: the pipelined ring reduce-scatter of ring_reduce.c over blocks of
 * ceil(count/n) (partial sums in scratch slots), each rank sending the
 * chunks of its finished block to the root as they complete (lane 1),
 * where they land in recvbuf; the root's own block is reduced in place.
 *
 *     rank:       0      1      2      3        (root 0)
 *     step 0:     [3]->  [0]->  [1]->  [2]->
 *     step 1:     [2]+-> [3]+-> [0]+-> [1]+->
 *     step 2:     [1]+   [2]+   [3]+   [0]+     F_AVG; rank r has block r
 *     gather:            [1]-->0 [2]-->0 [3]-->0   chunk by chunk, as reduced
 *
 * In place at the root its receives of the gathered blocks are posted at
 * the start, on top of its own contribution to them: safe, since a block's
 * final chunk is only sent once every rank's contribution to it has been
 * read, the root's included.
 */
static struct coll_ring_rs red_ring(const struct red_args *a)
{
    size_t block = (a->count + (size_t)a->n - 1) / (size_t)a->n;
    size_t lo = min_sz((size_t)a->me * block, a->count);
    int at_root = a->me == a->root;
    struct coll_ring_rs r = {
        .members = NULL, .m = a->n, .my_pos = a->me, .esize = a->esize, .block = block, .total = a->count,
        .src = a->send, .acc = NULL, .out = at_root ? a->recv + lo * a->esize : NULL, .gather_root = a->root,
        .gather_buf = at_root ? a->recv : NULL, .chunk = a->chunk, .scratch_off = 0, .phase = 0,
    };
    return r;
}

static void build_ring(struct weft_sched_build *b, const void *args)
{
    struct coll_ring_rs r = red_ring(args);
    coll_ring_rs_build(b, &r);
}

int coll_reduce_start(struct weft_coll *cc, const struct weft_coll_args *ca, weft_coll_tag_fn tag, uint32_t seq,
                      struct weft_coll_op **op)
{
    struct weft_core *core = cc->core;
    size_t es = weft_dtype_size(ca->dtype), count = ca->count;
    int n = core->size, me = core->rank, algo = cc->red_algo, forced = algo != WEFT_RED_AUTO, rc;

    *op = NULL;
    if (count == 0)
        return WEFT_SUCCESS;
    if (es == 0 || count > SIZE_MAX / es)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_reduce: %zu elements of type %d do not fit in memory",
                              count, ca->dtype);
    size_t bytes = count * es;
    if (n == 1) {
        if (ca->sendbuf != ca->recvbuf && !(ca->prep && ca->prep->dry))
            return weft_devcopy(core, ca->recvbuf, ca->sendbuf, bytes, "weft_reduce");
        return WEFT_SUCCESS;
    }
    if (!forced)
        algo = n == 2 || bytes <= WEFT_RED_TREE_MAX ? WEFT_RED_BINOMIAL : WEFT_RED_RING;
    coll_reduce_log_shape(cc, WEFT_COLL_REDUCE, count, ca->dtype, ca->op, algo, weft_reduce_algo_names[algo], forced);

    struct weft_sched_call call;
    struct coll_reduce_plan plan;
    const void *sb;
    void *rb;
    memset(&call, 0, sizeof call);
    if ((rc = coll_reduce_begin(cc, ca, bytes, me == ca->root ? bytes : 0, &sb, &rb, &call, &plan)) != WEFT_SUCCESS)
        return rc;

    struct red_args a;
    memset(&a, 0, sizeof a);
    a.n = n;
    a.me = me;
    a.root = ca->root;
    a.send = sb;
    a.recv = me == ca->root ? rb : NULL;
    a.count = count;
    a.esize = es;
    a.chunk = coll_reduce_chunk(cc, es);

    weft_sched_build_fn build;
    if (algo == WEFT_RED_RING) {
        struct coll_ring_rs r = red_ring(&a);
        build = build_ring;
        call.what = "reduce ring";
        call.scratch_bytes = coll_ring_rs_scratch(&r);
    } else {
        build = build_binomial;
        call.what = "reduce binomial";
        call.scratch_bytes = tree_scratch(&a);
    }
    call.tag = tag;
    call.seq = seq;
    return coll_reduce_launch(cc, &call, &plan, sb, rb, build, &a, op);
}
