/*
 * The pipelined ring reduce-scatter (coll_reduce_algo.h): the
 * bandwidth-optimal first half of allreduce ring, all of reduce_scatter
 * ring and of reduce ring (followed by a gather there), and the leaders'
 * ring of hierarchical allreduce.
 */
#include <stdio.h>
#include "coll_reduce_algo.h"
#include "core.h"
#include "log.h"
#include "reduce_kernel.h"
#include "weft.h"

/*
 * m members in a circle, m-1 steps. At step s member p receives from its
 * left neighbour the partial sum of block (p-s-2) mod m, adds its own
 * contribution and sends the result on to the right; at step 0 it sends
 * its own contribution to block p-1. After step m-2 it holds block p
 * complete. Every block's sum starts at the member after it and goes once
 * round, always in the same order, so each element is computed once, by
 * one member, in a fixed order.
 *
 *     member:      0          1          2          3        (block x: [x])
 *     step 0:   [3]--->    [0]--->    [1]--->    [2]--->     own data
 *     step 1:   [2]+--->   [3]+--->   [0]+--->   [1]+--->    received + own
 *     step 2:   [1]+       [2]+       [3]+       [0]+        complete: member p has [p]
 *
 *     operand order: received partial (members p+1 .. q-1 of block p) op
 *     own data of member q: ((x[p+1] op x[p+2]) op x[p+3]) op x[p]
 *
 * Pipelining. Blocks are cut into chunks (columns); columns go in groups
 * of G (COLL_RING_RS_GROUP), and a group runs its m-1 steps before the next
 * group starts, each step sending G chunks:
 *
 *     global step t = group*(m-1) + s:   t=0      t=1      ...  t=m-2   t=m-1 ...
 *                                        g0 s0    g0 s1         g0 last g1 s0
 *     per step on each link:             cols 0..G-1 of one block
 *
 * A chunk is forwarded as soon as it is reduced; the chunk it needs was sent
 * by the left neighbour G chunks earlier, so each link stays busy while the
 * neighbour reduces. Receives of step t are posted two steps ahead (after
 * step t-2), into slot planes used round robin, so the scratch is a few
 * groups of chunks whatever the message size:
 *
 *     slots:   plane 0 [c0 c1 c2 c3]   plane 1 [c0 c1 c2 c3]  (plane 2 ...)
 *
 * A slot is reused by the receive two (or three) steps later: once its
 * REDUCE ran when the partial lives in acc (in place allreduce: 2 planes),
 * once the SEND forwarding it completed when the partial lives in the slot
 * (reduce_scatter, reduce: 3 planes, so that wait is a step behind). Out of
 * place allreduce receives straight into recvbuf: no slots at all.
 *
 * Deadlock freedom: at step t a REDUCE waits for a receive posted at step
 * t-2 whose matching send the left neighbour issues at its step t-1 (or
 * at once: own data); a receive reusing a slot waits for a send of step
 * t-1 whose matching receive the right neighbour posted at its step t-2.
 * Everything waited for belongs to an earlier step, so every rank gets
 * through every step.
 *
 * Schedule: [root of a gather: its RECVs of every other block]; the RECVs
 * of steps 0 and 1; then per step: (s == 0) the own chunks' SENDs; per
 * chunk a REDUCE (dep: its RECV) and the SEND forwarding it (or, at the
 * last step with no out, the SEND of the final chunk to the root); then
 * the RECVs of step t+2 (dep: the slot's last reader when that is a SEND).
 */

struct rs_geom {
    size_t chunk;     /* bytes per chunk (at most a block) */
    size_t ncols;     /* chunks of a full block */
    size_t G;         /* columns per group */
    size_t ngroups;
    int    planes;    /* slot planes; 0: received straight into acc */
};

static void rs_geom(const struct coll_ring_rs *r, struct rs_geom *g)
{
    size_t bbytes = r->block * r->esize;
    g->chunk = r->chunk < bbytes ? r->chunk : bbytes;
    g->ncols = g->chunk ? (bbytes + g->chunk - 1) / g->chunk : 0;
    g->G = g->ncols < COLL_RING_RS_GROUP ? g->ncols : COLL_RING_RS_GROUP;
    g->ngroups = g->G ? (g->ncols + g->G - 1) / g->G : 0;
    if (r->acc != NULL)
        g->planes = (r->acc != r->src) ? 0 : 2;
    else
        g->planes = 3;
}

size_t coll_ring_rs_scratch(const struct coll_ring_rs *r)
{
    struct rs_geom g;
    if (r->m < 2 || r->total == 0)
        return 0;
    rs_geom(r, &g);
    return (size_t)g.planes * g.G * g.chunk;
}

static int rs_rank(const struct coll_ring_rs *r, int p)
{
    return r->members ? r->members[p] : p;
}

/* Bytes [*off, *off + return) of chunk c of block p (0: none). */
static size_t rs_chunk(const struct coll_ring_rs *r, const struct rs_geom *g, int p, size_t c, size_t *off)
{
    size_t lo = (size_t)p * r->block, hi = lo + r->block;
    if (lo > r->total)
        lo = r->total;
    if (hi > r->total)
        hi = r->total;
    size_t len = (hi - lo) * r->esize, at = c * g->chunk;
    if (at >= len)
        return 0;
    *off = lo * r->esize + at;
    return len - at < g->chunk ? len - at : g->chunk;
}

/* Builder state: the receive step of each (plane, column) and the step that
 * last reads each slot (a SEND a reused slot must wait for, or NODEP). */
struct rs_state {
    int recv[3][COLL_RING_RS_GROUP];
    int last[3][COLL_RING_RS_GROUP];
};

static int rs_plane(const struct rs_geom *g, size_t t)
{
    return (int)(t % (size_t)(g->planes ? g->planes : 2));
}

static char *rs_slot(struct weft_sched_build *b, const struct coll_ring_rs *r, const struct rs_geom *g, int plane,
                     size_t ci)
{
    return weft_sched_scratch(b, r->scratch_off + ((size_t)plane * g->G + ci) * g->chunk);
}

/* Posts the receives of global step t (if it exists). */
static void rs_post(struct weft_sched_build *b, const struct coll_ring_rs *r, const struct rs_geom *g,
                    struct rs_state *st, size_t t)
{
    int m = r->m, me = r->my_pos;
    if (t >= g->ngroups * (size_t)(m - 1))
        return;
    size_t grp = t / (size_t)(m - 1);
    int s = (int)(t % (size_t)(m - 1));
    int p_in = ((me - s - 2) % m + m) % m;
    int pl = rs_plane(g, t), left = rs_rank(r, (me + m - 1) % m);
    for (size_t ci = 0; ci < g->G; ci++) {
        size_t off, len = rs_chunk(r, g, p_in, grp * g->G + ci, &off);
        if (len == 0)
            continue;
        void *dst = g->planes ? rs_slot(b, r, g, pl, ci) : r->acc + off;
        st->recv[pl][ci] = (int)weft_sched_recv(b, s, dst, len, left, r->phase,
                                                g->planes ? st->last[pl][ci] : WEFT_SCHED_NODEP,
                                                WEFT_SCHED_F_RECEIVE);
        st->last[pl][ci] = WEFT_SCHED_NODEP;
    }
}

void coll_ring_rs_build(struct weft_sched_build *b, const struct coll_ring_rs *r)
{
    struct rs_geom g;
    struct rs_state st;
    int m = r->m, me = r->my_pos;

    if (m < 2 || r->total == 0)
        return;
    rs_geom(r, &g);
    for (int pl = 0; pl < 3; pl++)
        for (size_t ci = 0; ci < COLL_RING_RS_GROUP; ci++) {
            st.recv[pl][ci] = WEFT_SCHED_NODEP;
            st.last[pl][ci] = WEFT_SCHED_NODEP;
        }
    int right = rs_rank(r, (me + 1) % m);
    int root_rank = r->gather_root >= 0 ? rs_rank(r, r->gather_root) : -1;
    size_t my_lo = (size_t)me * r->block;
    if (my_lo > r->total)
        my_lo = r->total;

    /* The root of a gather receives every other block where it belongs. */
    if (r->out == NULL && r->gather_root < 0)
        return;   /* nowhere to put the result: a caller's bug, caught by its test */
    if (r->gather_root == me) {
        for (int p = 0; p < m; p++) {
            if (p == me)
                continue;
            for (size_t c = 0; c < g.ncols; c++) {
                size_t off, len = rs_chunk(r, &g, p, c, &off);
                if (len == 0)
                    break;
                weft_sched_recv(b, m - 1, r->gather_buf + off, len, rs_rank(r, p), r->phase + 1,
                                WEFT_SCHED_NODEP, 0);
            }
        }
    }

    rs_post(b, r, &g, &st, 0);
    rs_post(b, r, &g, &st, 1);
    for (size_t grp = 0; grp < g.ngroups; grp++) {
        for (int s = 0; s < m - 1; s++) {
            size_t t = grp * (size_t)(m - 1) + (size_t)s;
            int pl = rs_plane(&g, t), last_step = (s == m - 2);
            int p_in = ((me - s - 2) % m + m) % m;
            if (s == 0) {
                int p_own = (me + m - 1) % m;
                for (size_t ci = 0; ci < g.G; ci++) {
                    size_t off, len = rs_chunk(r, &g, p_own, grp * g.G + ci, &off);
                    if (len > 0)
                        weft_sched_send(b, 0, r->src + off, len, right, r->phase, WEFT_SCHED_NODEP);
                }
            }
            for (size_t ci = 0; ci < g.G; ci++) {
                size_t off, len = rs_chunk(r, &g, p_in, grp * g.G + ci, &off);
                if (len == 0)
                    continue;
                char *in = g.planes ? rs_slot(b, r, &g, pl, ci) : r->acc + off;
                char *dst;
                if (last_step && r->out)
                    dst = r->out + (off - my_lo * r->esize);
                else
                    dst = r->acc ? r->acc + off : in;
                weft_sched_reduce(b, s, dst, in, r->src + off, len, st.recv[pl][ci],
                                  last_step ? WEFT_SCHED_F_AVG : 0);
                int reader = WEFT_SCHED_NODEP;
                if (!last_step)
                    reader = (int)weft_sched_send(b, s + 1, dst, len, right, r->phase, WEFT_SCHED_NODEP);
                else if (!r->out)
                    reader = (int)weft_sched_send(b, m - 1, dst, len, root_rank, r->phase + 1, WEFT_SCHED_NODEP);
                /* Partials in acc: the slot is free once reduced. */
                st.last[pl][ci] = r->acc ? WEFT_SCHED_NODEP : reader;
            }
            rs_post(b, r, &g, &st, t + 2);
        }
    }
}

void coll_reduce_log_shape(struct weft_coll *cc, int kind, size_t count, int dtype, int op, int algo,
                           const char *algo_name, int forced)
{
    char what[96];
    const char *name = kind == WEFT_COLL_ALLREDUCE        ? "allreduce"
                       : kind == WEFT_COLL_REDUCE_SCATTER ? "reduce_scatter"
                                                          : "reduce";
    if (weft_log_level() < WEFT_LOG_INFO)
        return;
    snprintf(what, sizeof what, "%s %zu elements%s of %s, %s", name, count,
             kind == WEFT_COLL_REDUCE_SCATTER ? " per rank" : "", weft_dtype_name(dtype), weft_op_name(op));
    coll_log_shape_once(cc, kind, count, algo, what, algo_name, forced);
}
