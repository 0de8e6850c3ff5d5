/*
 * weft_reduce_scatter: ring and recursive halving; the selector and
 * WEFT_REDUCE_SCATTER_ALGO forcing (cc->rs_algo). Block r of the reduction
 * (elements [r*recvcount, (r+1)*recvcount) of every sendbuf) lands in
 * rank r's recvbuf. Both algorithms run on any number of ranks.
 *
 * Selector thresholds (first guesses from the cost model in allreduce.c,
 * to be replaced by measurements in docs/benchmarks.md): halving needs
 * log2(n) messages against the ring's n-1 and moves the same (n-1)/n of
 * the vector, but does not overlap reduction with transfer, so it wins for
 * small vectors (up to 32 KiB in total on any count) and, on powers of two
 * (no fold moving the vector twice more), up to 256 KiB.
 */
#include <string.h>
#include "coll_reduce_algo.h"
#include "config.h"
#include "core.h"
#include "devcopy.h"
#include "log.h"
#include "reduce_kernel.h"
#include "weft.h"

#define WEFT_RS_SMALL_TOTAL (32u * 1024u)    /* bytes (all blocks): halving on any count */
#define WEFT_RS_POW2_TOTAL  (256u * 1024u)   /* bytes: halving below, powers of two */
/* Halving keeps partial sums of up to the whole vector (a folding rank);
 * it works on column slices of the blocks so that stays below this. */
#define WEFT_RS_HALVING_PIECE (1024u * 1024u)

struct rs_args {
    int         n, me;
    const char *send;
    char       *recv;
    size_t      rc, esize, chunk;
    size_t      cw;        /* halving: columns of each block per piece */
};

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/*
 * Ring: the pipelined ring reduce-scatter of ring_reduce.c with blocks of
 * recvcount elements, the partial sums in scratch slots (recvbuf only has
 * room for the rank's own block), the last step's REDUCE straight into
 * recvbuf.
 *
 *     rank:       0      1      2      3
 *     step 0:     [3]->  [0]->  [1]->  [2]->     own data
 *     step 1:     [2]+-> [3]+-> [0]+-> [1]+->    received op own, forwarded
 *     step 2:     [1]+   [2]+   [3]+   [0]+      rank r: block r in recvbuf (F_AVG)
 */
static struct coll_ring_rs rs_ring(const struct rs_args *a)
{
    struct coll_ring_rs r = {
        .members = NULL, .m = a->n, .my_pos = a->me, .esize = a->esize, .block = a->rc,
        .total = (size_t)a->n * a->rc, .src = a->send, .acc = NULL, .out = a->recv, .gather_root = -1,
        .gather_buf = NULL, .chunk = a->chunk, .scratch_off = 0, .phase = 0,
    };
    return r;
}

static void build_ring(struct weft_sched_build *b, const void *args)
{
    struct coll_ring_rs r = rs_ring(args);
    coll_ring_rs_build(b, &r);
}

/* Piece q: columns [q*cw, q*cw + w) of every block. */
static struct coll_halving rs_piece(const struct rs_args *a, size_t q)
{
    size_t c0 = q * a->cw, w = min_sz(a->cw, a->rc - c0);
    struct coll_halving h;
    memset(&h, 0, sizeof h);
    h.n = a->n;
    h.me = a->me;
    h.rs = 1;
    h.v.esize = a->esize;
    h.v.chunk_el = a->chunk / a->esize;
    h.v.V = (size_t)a->n * w;
    h.v.unit = w;
    h.v.piece = 1;
    h.v.stride = a->rc;
    h.v.col0 = c0;
    h.v.src = a->send;
    h.v.acc = NULL;   /* partial sums in scratch */
    h.v.out = a->recv;
    h.v.out_block = a->me;
    h.v.scratch_off = 0;
    /* The slots of the widest piece (the first), for every piece. */
    h.v.slot_bytes = min_sz(a->chunk, (size_t)a->n * min_sz(a->cw, a->rc) * a->esize);
    h.ph = 0;
    h.v.acc_lo = coll_halving_acc_lo(&h);
    return h;
}

/*
 * Recursive halving (rec_reduce.c, coll_halving_build), segments = blocks:
 * after log2(p2) halvings new rank i holds the blocks of its ranks, the
 * last REDUCE writing its own block into recvbuf; with a fold, the partner
 * of a folded rank sends it its block at the end.
 *
 *     rank:     0            1            2            3      blocks [0 1 2 3]
 *     halve 1:  keep [0 1] <-----------> keep [2 3]             (0<->2, 1<->3)
 *     halve 2:  [0] <-> [1]              [2] <-> [3]            (F_AVG)
 *
 * Large vectors go in pieces (column slices of every block, one after the
 * other behind a fence), so the partial sums stay below
 * WEFT_RS_HALVING_PIECE bytes.
 */
static void build_halving(struct weft_sched_build *b, const void *args)
{
    const struct rs_args *a = args;
    for (size_t q = 0; q * a->cw < a->rc; q++) {
        struct coll_halving h = rs_piece(a, q);
        if (q > 0)
            weft_sched_fence(b);
        coll_halving_build(b, &h);
    }
}

static int is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

static int rs_select(int n, size_t total)
{
    if (total <= WEFT_RS_SMALL_TOTAL || (is_pow2(n) && total < WEFT_RS_POW2_TOTAL))
        return WEFT_RS_HALVING;
    return WEFT_RS_RING;
}

int coll_reduce_scatter_start(struct weft_coll *cc, const struct weft_coll_args *ca, weft_coll_tag_fn tag,
                              uint32_t seq, struct weft_coll_op **op)
{
    struct weft_core *core = cc->core;
    size_t es = weft_dtype_size(ca->dtype), rc = ca->count;
    int n = core->size, me = core->rank, algo = cc->rs_algo, forced = algo != WEFT_RS_AUTO, ret;

    *op = NULL;
    if (rc == 0)
        return WEFT_SUCCESS;
    if (es == 0 || rc > SIZE_MAX / es / (size_t)n)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG,
                              "weft_reduce_scatter: %d x %zu elements of type %d do not fit in memory", n, rc,
                              ca->dtype);
    size_t bytes = rc * es, total = bytes * (size_t)n;
    if (n == 1) {
        if (ca->sendbuf != ca->recvbuf && !(ca->prep && ca->prep->dry))
            return weft_devcopy(core, ca->recvbuf, ca->sendbuf, bytes, "weft_reduce_scatter");
        return WEFT_SUCCESS;
    }
    if (!forced)
        algo = rs_select(n, total);
    coll_reduce_log_shape(cc, WEFT_COLL_REDUCE_SCATTER, rc, ca->dtype, ca->op, algo,
                          weft_reduce_scatter_algo_names[algo], forced);

    struct weft_sched_call call;
    struct coll_reduce_plan plan;
    const void *sb;
    void *rb;
    memset(&call, 0, sizeof call);
    if ((ret = coll_reduce_begin(cc, ca, total, bytes, &sb, &rb, &call, &plan)) != WEFT_SUCCESS)
        return ret;

    struct rs_args a;
    memset(&a, 0, sizeof a);
    a.n = n;
    a.me = me;
    a.send = sb;
    a.recv = rb;
    a.rc = rc;
    a.esize = es;
    a.chunk = coll_reduce_chunk(cc, es);

    weft_sched_build_fn build;
    if (algo == WEFT_RS_HALVING) {
        size_t cw = WEFT_RS_HALVING_PIECE / es / (size_t)n;
        a.cw = cw == 0 ? 1 : min_sz(cw, rc);
        struct coll_halving h = rs_piece(&a, 0);
        build = build_halving;
        call.what = "reduce_scatter recursive halving";
        call.scratch_bytes = coll_halving_scratch(&h);
    } else {
        struct coll_ring_rs r = rs_ring(&a);
        build = build_ring;
        call.what = "reduce_scatter ring";
        call.scratch_bytes = coll_ring_rs_scratch(&r);
    }
    call.tag = tag;
    call.seq = seq;
    return coll_reduce_launch(cc, &call, &plan, sb, rb, build, &a, op);
}
