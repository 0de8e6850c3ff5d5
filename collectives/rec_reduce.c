/*
 * Recursive doubling and recursive halving (coll_reduce_algo.h), with the
 * fold that lets them run on any number of ranks: allreduce rd and
 * Rabenseifner, reduce_scatter halving, the leaders of hier.
 *
 * Folding (n not a power of two, p2 = the largest power of two below n,
 * rem = n - p2): among the first 2*rem ranks each even one hands its whole
 * vector to the odd one after it and sits the algorithm out; the p2 ranks
 * left (odd ones below 2*rem, every one from 2*rem up) keep their order:
 *
 *     n = 6, p2 = 4, rem = 2:   rank  0  1  2  3  4  5
 *                               fold  0->1  2->3
 *                               new      0     1  2  3     (power-of-two part)
 *                               back  0<-1  2<-3           (the result)
 *
 * The folding REDUCE is (even's data) op (odd's data): the lower rank is
 * the left operand, as everywhere below.
 */
#include "coll_reduce_algo.h"
#include "weft.h"

/* ---- the vector seen through its layout (struct coll_rvec) ---- */

static size_t rv_real(const struct coll_rvec *v, size_t e)
{
    return v->piece ? (e / v->unit) * v->stride + v->col0 + e % v->unit : e;
}

/* End of the chunk that starts at pos, within [pos, end). */
static size_t rv_chunk_end(const struct coll_rvec *v, size_t pos, size_t end)
{
    size_t lim = end;
    if (v->unit) {
        size_t ue = (pos / v->unit + 1) * v->unit;
        if (ue < lim)
            lim = ue;
    }
    if (lim - pos > v->chunk_el)
        lim = pos + v->chunk_el;
    return lim;
}

static const char *rv_src(const struct coll_rvec *v, size_t e)
{
    return v->src + rv_real(v, e) * v->esize;
}

/* acc is user memory (allreduce: recvbuf) or, when acc is NULL, the op's
 * scratch after the slots (reduce_scatter). NULL while counting. */
static char *rv_acc(struct weft_sched_build *b, const struct coll_rvec *v, size_t e)
{
    if (v->acc)
        return v->acc + (e - v->acc_lo) * v->esize;
    char *base = weft_sched_scratch(b, v->scratch_off + COLL_RVEC_WINDOW * v->slot_bytes);
    return base ? base + (e - v->acc_lo) * v->esize : NULL;
}

/* Where an element's final value goes: this rank's block of a
 * reduce_scatter lands in out, everything else stays in acc. */
static char *rv_final(struct weft_sched_build *b, const struct coll_rvec *v, size_t e)
{
    if (v->out && v->unit && e / v->unit == (size_t)v->out_block)
        return v->out + (v->col0 + e % v->unit) * v->esize;
    return rv_acc(b, v, e);
}

static char *rv_slot(struct weft_sched_build *b, const struct coll_rvec *v, int i)
{
    return weft_sched_scratch(b, v->scratch_off + (size_t)i * v->slot_bytes);
}

/* Sends [lo, hi) chunk by chunk from src (from_acc 0) or acc. */
static void rv_send(struct weft_sched_build *b, const struct coll_rvec *v, size_t lo, size_t hi, int from_acc,
                    int peer, int phase, int num)
{
    for (size_t e = lo, end; e < hi; e = end) {
        end = rv_chunk_end(v, e, hi);
        const void *p = from_acc ? (const void *)rv_acc(b, v, e) : (const void *)rv_src(v, e);
        weft_sched_send(b, num, p, (end - e) * v->esize, peer, phase, WEFT_SCHED_NODEP);
    }
}

/*
 * One exchange with a peer, chunked through COLL_RVEC_WINDOW receive slots:
 * the peer's part [r_lo, r_hi) is received and reduced with ours into
 * acc (or, last, where it finally goes); ours [s_lo, s_hi) is sent.
 *
 *   unpaired (halving, fold): every SEND at once (they read data no REDUCE
 *       of this exchange writes), then per chunk: REDUCE (dep: its RECV),
 *       the RECV of the chunk W later into the slot just freed.
 *   paired (doubling, same range both ways): SENDs go W ahead of the
 *       REDUCEs; with wait, a REDUCE also waits for the SEND of the same
 *       chunk, since it overwrites what that SEND reads.
 *
 *     slots:  [0][1][2][3]    chunk j -> slot j % W
 *     RECV 0..3 | SEND ... | REDUCE 0, RECV 4 | REDUCE 1, RECV 5 | ...
 */
struct rv_xchg {
    int      peer, phase, num;
    size_t   s_lo, s_hi, r_lo, r_hi;
    int      cur_acc;     /* our data is in acc (else src) */
    int      recv_left;   /* the received partial is the left operand (the peer is lower) */
    int      last;        /* final values: rv_final, and F_AVG */
    int      paired, wait;
};

static void rv_xchg(struct weft_sched_build *b, const struct coll_rvec *v, const struct rv_xchg *x)
{
    enum { W = COLL_RVEC_WINDOW };
    int rq[W], sq[W];
    size_t rpost = x->r_lo, spost = x->s_lo;
    int k;

    for (k = 0; k < W && rpost < x->r_hi; k++) {
        size_t end = rv_chunk_end(v, rpost, x->r_hi);
        rq[k] = (int)weft_sched_recv(b, x->num, rv_slot(b, v, k), (end - rpost) * v->esize, x->peer, x->phase,
                                     WEFT_SCHED_NODEP, WEFT_SCHED_F_RECEIVE);
        rpost = end;
    }
    for (k = 0; spost < x->s_hi && (!x->paired || k < W); k++) {
        size_t end = rv_chunk_end(v, spost, x->s_hi);
        const void *p = x->cur_acc ? (const void *)rv_acc(b, v, spost) : (const void *)rv_src(v, spost);
        sq[k % W] = (int)weft_sched_send(b, x->num, p, (end - spost) * v->esize, x->peer, x->phase,
                                         WEFT_SCHED_NODEP);
        spost = end;
    }
    k = 0;
    for (size_t e = x->r_lo, end; e < x->r_hi; e = end, k++) {
        end = rv_chunk_end(v, e, x->r_hi);
        int i = k % W;
        if (x->paired && x->wait)
            coll_sched_wait(b, x->num, sq[i]);
        char *in = rv_slot(b, v, i);
        const char *own = x->cur_acc ? (const char *)rv_acc(b, v, e) : rv_src(v, e);
        char *dst = x->last ? rv_final(b, v, e) : rv_acc(b, v, e);
        weft_sched_reduce(b, x->num, dst, x->recv_left ? in : own, x->recv_left ? own : in, (end - e) * v->esize,
                          rq[i], x->last ? WEFT_SCHED_F_AVG : 0);
        if (rpost < x->r_hi) {
            size_t rend = rv_chunk_end(v, rpost, x->r_hi);
            rq[i] = (int)weft_sched_recv(b, x->num, in, (rend - rpost) * v->esize, x->peer, x->phase,
                                         WEFT_SCHED_NODEP, WEFT_SCHED_F_RECEIVE);
            rpost = rend;
        }
        if (x->paired && spost < x->s_hi) {
            size_t send = rv_chunk_end(v, spost, x->s_hi);
            const void *p = x->cur_acc ? (const void *)rv_acc(b, v, spost) : (const void *)rv_src(v, spost);
            sq[i] = (int)weft_sched_send(b, x->num, p, (send - spost) * v->esize, x->peer, x->phase,
                                         WEFT_SCHED_NODEP);
            spost = send;
        }
    }
}

static size_t rv_slots_bytes(const struct coll_rvec *v)
{
    return (size_t)COLL_RVEC_WINDOW * v->slot_bytes;
}

/* ---- recursive doubling ---- */

static int rd_rank(const struct coll_rd *r, int p)
{
    return r->members ? r->members[p] : p;
}

size_t coll_rd_scratch(const struct coll_rd *r)
{
    int p2 = coll_pow2_floor(r->m), rem = r->m - p2;
    if (r->my_pos < 2 * rem && r->my_pos % 2 == 0)
        return 0;   /* folded: sends and receives only */
    return rv_slots_bytes(&r->v);
}

/*
 * Recursive doubling (small vectors): log2(p2) steps; at step k a rank and
 * its partner (new rank ^ 2^k) swap their whole partial vectors and both
 * compute lower op upper, so after step k the 2^(k+1) ranks of a group hold
 * the same bits, and after the last step everybody does.
 *
 *     new rank:  0        1        2        3
 *     step 0:    0<------>1        2<------>3      [01] [01] [23] [23]
 *     step 1:    0<--------------->2                [0123] everywhere,
 *                         1<--------------->3       each = [01] op [23]
 *
 * Around it the fold (see the top of this file): an even rank below 2*rem
 * sends its vector to the next rank, waits, and receives the result.
 * WEFT_AVG: every participant's last step divides (identical values).
 *
 * Schedule: [fold: windowed RECV+REDUCE from the even rank], then per step
 * a paired exchange (RECVs into slots, SENDs W chunks ahead, REDUCE chunk
 * j after the SEND of chunk j, since it overwrites it), then [the whole
 * result back to the even rank]. An even rank: its SENDs, a fence, one
 * RECV.
 */
void coll_rd_build(struct weft_sched_build *b, const struct coll_rd *r)
{
    const struct coll_rvec *v = &r->v;
    int m = r->m, pos = r->my_pos, p2 = coll_pow2_floor(m), rem = m - p2;
    int newpos, cur_acc = 0, num = 0;
    size_t bytes = v->V * v->esize;

    if (m < 2 || v->V == 0)
        return;
    if (pos < 2 * rem && pos % 2 == 0) {
        rv_send(b, v, 0, v->V, 0, rd_rank(r, pos + 1), r->ph + 1, 0);
        weft_sched_fence(b);   /* in place: the result lands on what was sent */
        weft_sched_recv(b, 99, v->acc, bytes, rd_rank(r, pos + 1), r->ph + 2, WEFT_SCHED_NODEP,
                        WEFT_SCHED_F_RECEIVE);
        return;
    }
    if (pos < 2 * rem) {
        struct rv_xchg x = { rd_rank(r, pos - 1), r->ph + 1, 0, 0, 0, 0, v->V, 0, 1, 0, 0, 0 };
        rv_xchg(b, v, &x);
        cur_acc = 1;
        newpos = pos / 2;
    } else {
        newpos = pos - rem;
    }
    for (int mask = 1; mask < p2; mask <<= 1) {
        int pn = newpos ^ mask;
        int peer = rd_rank(r, pn < rem ? 2 * pn + 1 : pn + rem);
        struct rv_xchg x = {
            .peer = peer, .phase = r->ph, .num = ++num, .s_lo = 0, .s_hi = v->V, .r_lo = 0, .r_hi = v->V,
            .cur_acc = cur_acc, .recv_left = pn < newpos, .last = (mask << 1) >= p2, .paired = 1,
            .wait = cur_acc || (const char *)v->acc == v->src,
        };
        rv_xchg(b, v, &x);
        cur_acc = 1;
    }
    if (pos < 2 * rem)
        weft_sched_send(b, 99, v->acc, bytes, rd_rank(r, pos - 1), r->ph + 2, WEFT_SCHED_NODEP);
}

/* ---- recursive halving ---- */

/* Start of new rank i's segment (i = 0..p2). reduce_scatter: whole blocks,
 * two for a rank that took a folded rank's work. */
static size_t hv_off(const struct coll_halving *h, int p2, int i)
{
    int rem = h->n - p2;
    if (h->rs) {
        size_t blk = (size_t)(i < rem ? 2 * i : i + rem);
        return blk * h->v.unit;
    }
    size_t seg = (h->v.V + (size_t)p2 - 1) / (size_t)p2, o = (size_t)i * seg;
    return o < h->v.V ? o : h->v.V;
}

static int hv_rank(int np, int rem)
{
    return np < rem ? 2 * np + 1 : np + rem;
}

/* This rank's new rank, or -1 when it is folded away. */
static int hv_newpos(const struct coll_halving *h, int p2)
{
    int rem = h->n - p2;
    if (h->me < 2 * rem)
        return h->me % 2 ? h->me / 2 : -1;
    return h->me - rem;
}

size_t coll_halving_acc_lo(const struct coll_halving *h)
{
    int p2 = coll_pow2_floor(h->n), np = hv_newpos(h, p2), half = p2 / 2;
    if (!h->rs || np < 0 || h->me < 2 * (h->n - p2))
        return 0;   /* a folding partner accumulates the whole vector */
    return (np & half) ? hv_off(h, p2, half) : 0;
}

size_t coll_halving_scratch(const struct coll_halving *h)
{
    int p2 = coll_pow2_floor(h->n), np = hv_newpos(h, p2), half = p2 / 2;
    if (np < 0)
        return 0;
    size_t s = rv_slots_bytes(&h->v);
    if (h->rs) {
        size_t lo = 0, hi = h->v.V;
        if (h->me >= 2 * (h->n - p2)) {
            lo = (np & half) ? hv_off(h, p2, half) : 0;
            hi = (np & half) ? h->v.V : hv_off(h, p2, half);
        }
        s += (hi - lo) * h->v.esize;
    }
    return s;
}

/*
 * Recursive halving reduce-scatter: log2(p2) steps; at each a rank's
 * group of new ranks splits in two halves, it keeps the half of the
 * segment range that belongs to its half, sends the other half to its
 * partner in the other half and reduces what the partner sends for the
 * kept half (lower half's partial = left operand). At the end new rank i
 * holds segment i complete.
 *
 *     new rank:   0          1          2          3     segments [0 1 2 3]
 *     step 0:     keeps [0 1]<-------->keeps [2 3]         (0<->2, 1<->3)
 *                            keeps [0 1]<-------->keeps [2 3]
 *     step 1:     [0]<-->[1]            [2]<-->[3]         (0<->1, 2<->3)
 *
 * Rabenseifner's allreduce then gathers the segments by recursive
 * doubling (the steps in reverse, each swapping what a rank holds), behind
 * a fence since those receives land on what the halving sent. Segments: a
 * ceil(V/p2) slice per new rank (allreduce); the blocks of the new rank's
 * ranks (reduce_scatter: two for a rank that folded). Every element's sum
 * is completed by one REDUCE (F_AVG), on the one rank that owns it.
 *
 * Schedule: [fold], per halving step an unpaired exchange (SENDs of the
 * half given away, windowed RECV+REDUCE of the half kept); then
 * reduce_scatter: [the folded rank's block back]; allreduce: fence, per
 * doubling step behind a fence a RECV and a SEND, [fence, the result back].
 */
void coll_halving_build(struct weft_sched_build *b, const struct coll_halving *h)
{
    const struct coll_rvec *v = &h->v;
    int n = h->n, me = h->me, p2 = coll_pow2_floor(n), rem = n - p2;
    int np = hv_newpos(h, p2), cur_acc = 0, num = 0;

    if (n < 2 || v->V == 0)
        return;
    if (np < 0) {
        /* Folded: everything to the next rank, then this rank's result. */
        rv_send(b, v, 0, v->V, 0, me + 1, h->ph + 1, 0);
        weft_sched_fence(b);
        if (h->rs)
            weft_sched_recv(b, 99, v->out + v->col0 * v->esize, v->unit * v->esize, me + 1, h->ph + 2,
                            WEFT_SCHED_NODEP, WEFT_SCHED_F_RECEIVE);
        else
            weft_sched_recv(b, 99, v->acc, v->V * v->esize, me + 1, h->ph + 2, WEFT_SCHED_NODEP,
                            WEFT_SCHED_F_RECEIVE);
        return;
    }
    if (me < 2 * rem) {
        struct rv_xchg x = { me - 1, h->ph + 1, 0, 0, 0, 0, v->V, 0, 1, 0, 0, 0 };
        rv_xchg(b, v, &x);
        cur_acc = 1;
    }
    for (int mask = p2 / 2; mask >= 1; mask >>= 1) {
        int base = np & ~(2 * mask - 1), upper = (np & mask) != 0;
        size_t lo0 = hv_off(h, p2, base), mid = hv_off(h, p2, base + mask), hi0 = hv_off(h, p2, base + 2 * mask);
        struct rv_xchg x = {
            .peer = hv_rank(np ^ mask, rem), .phase = h->ph, .num = ++num,
            .s_lo = upper ? lo0 : mid, .s_hi = upper ? mid : hi0,
            .r_lo = upper ? mid : lo0, .r_hi = upper ? hi0 : mid,
            .cur_acc = cur_acc, .recv_left = upper, .last = mask == 1, .paired = 0, .wait = 0,
        };
        rv_xchg(b, v, &x);
        cur_acc = 1;
    }
    if (h->rs) {
        if (me < 2 * rem) {
            size_t lo = (size_t)(me - 1) * v->unit;
            weft_sched_send(b, 99, rv_acc(b, v, lo), v->unit * v->esize, me - 1, h->ph + 2, WEFT_SCHED_NODEP);
        }
        return;
    }
    /* Allgather of the segments by recursive doubling, in acc (recvbuf). */
    for (int mask = 1; mask < p2; mask <<= 1) {
        int mine = np & ~(mask - 1), theirs = mine ^ mask;
        size_t mlo = hv_off(h, p2, mine), mhi = hv_off(h, p2, mine + mask);
        size_t tlo = hv_off(h, p2, theirs), thi = hv_off(h, p2, theirs + mask);
        int peer = hv_rank(np ^ mask, rem);
        weft_sched_fence(b);
        num++;
        if (thi > tlo)
            weft_sched_recv(b, num, v->acc + tlo * v->esize, (thi - tlo) * v->esize, peer, h->ph + 3,
                            WEFT_SCHED_NODEP, 0);
        if (mhi > mlo)
            weft_sched_send(b, num, v->acc + mlo * v->esize, (mhi - mlo) * v->esize, peer, h->ph + 3,
                            WEFT_SCHED_NODEP);
    }
    if (me < 2 * rem) {
        weft_sched_fence(b);
        weft_sched_send(b, 99, v->acc, v->V * v->esize, me - 1, h->ph + 2, WEFT_SCHED_NODEP);
    }
}
