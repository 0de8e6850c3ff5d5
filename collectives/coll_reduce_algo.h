/*
 * Building blocks of the reduction algorithms (allreduce.c,
 * reduce_scatter.c, reduce.c), private to collectives/:
 *
 *   - the pipelined ring reduce-scatter (ring_reduce.c), used by the ring
 *     of allreduce, of reduce_scatter and of reduce, and by the leaders'
 *     ring of hierarchical allreduce;
 *   - recursive doubling and recursive halving with the folding of a
 *     non-power-of-two rank count (rec_reduce.c), used by allreduce rd,
 *     Rabenseifner, reduce_scatter halving and hier's leaders.
 *
 * Counts and offsets are elements (size_t) unless a name says bytes. Every
 * REDUCE keeps a fixed operand order (coll_sched.h: dst = a op b): the
 * partial of the lower ranks is the left operand, so a given algorithm at a
 * given rank count computes each element in one fixed order, once, and
 * every rank ends with the same bits.
 */
#ifndef WEFT_COLL_REDUCE_ALGO_H
#define WEFT_COLL_REDUCE_ALGO_H

#include <stddef.h>
#include <stdint.h>
#include "coll_impl.h"

/* Columns per group of the ring (see ring_reduce.c): how many chunks of a
 * block travel one ring step after another before the next step starts,
 * i.e. how many chunk-times a forwarded chunk has to arrive in. */
#define COLL_RING_RS_GROUP 4
/* Receive slots of the windowed receive-and-reduce of rd, halving, the fold
 * and hier's chain (rec_reduce.c): chunks in flight towards one rank. */
#define COLL_RVEC_WINDOW 4

/* A step that only waits for step dep (0 bytes of REDUCE: nothing runs):
 * the engine gives a step one dependency, a reduction into memory a send
 * still reads needs two (that send and the receive it reduces). */
static inline size_t coll_sched_wait(struct weft_sched_build *b, int num, int dep)
{
    return weft_sched_reduce(b, num, NULL, NULL, NULL, 0, dep, 0);
}

/* Largest power of two <= n (n >= 1). */
static inline int coll_pow2_floor(int n)
{
    int p = 1;
    while (p <= n / 2)
        p <<= 1;
    return p;
}

/* ---- pipelined ring reduce-scatter (ring_reduce.c) ----
 *
 * m members in a ring; member p is rank members[p] (members NULL: rank p).
 * The vector of `total` elements is cut into m blocks of `block` elements
 * (block p = [p*block, (p+1)*block) clipped to total; tail blocks may be
 * short or empty); member p ends with the reduction of block p.
 *
 * Where the partial sums live:
 *   acc != NULL   in acc (the vector's layout, every element written once;
 *                 allreduce: recvbuf). Out of place (acc != src) chunks are
 *                 received straight into acc; in place they are received
 *                 into scratch slots freed by their REDUCE.
 *   acc == NULL   in the scratch slots themselves (reduce_scatter, reduce):
 *                 a slot stays busy until the SEND that forwards it is done.
 * The final block: out != NULL: at out + (element - start of this member's
 * block); out == NULL: sent chunk by chunk to member gather_root on lane
 * phase+1 (reduce), where gather_buf (that member's recvbuf, the vector's
 * layout) receives every other member's block. scratch_off: where the slots
 * start in the op's scratch (coll_ring_rs_scratch bytes). */
struct coll_ring_rs {
    const int  *members;
    int         m, my_pos;
    size_t      esize;
    size_t      block, total;      /* elements */
    const char *src;               /* this member's contribution (vector layout) */
    char       *acc;
    char       *out;
    int         gather_root;       /* member position, -1: none */
    char       *gather_buf;        /* at gather_root only */
    size_t      chunk;             /* bytes, a multiple of esize */
    size_t      scratch_off;
    int         phase;             /* lane; phase+1: the gather */
};
size_t coll_ring_rs_scratch(const struct coll_ring_rs *r);
void   coll_ring_rs_build(struct weft_sched_build *b, const struct coll_ring_rs *r);

/* ---- recursive algorithms (rec_reduce.c) ----
 *
 * A vector of V elements seen through a layout, so reduce_scatter's halving
 * can work on column slices of its blocks (a piece): virtual element v is
 * real element
 *     piece:  (v / unit) * stride + col0 + v % unit   (unit columns of each block)
 *     else:   v
 * Chunks never cross a multiple of `unit` (so each is contiguous in real
 * memory) and hold at most chunk_el elements; both sides of a message cut a
 * range the same way.
 *
 *   src   this rank's contribution (real layout), never written (unless it
 *         is acc: in place)
 *   acc   the partial sums: acc + (v - acc_lo) * esize (virtual layout)
 *   out   reduce_scatter: where this rank's own block goes (out + (col0 +
 *         v % unit) * esize for v in block out_block); NULL: final values
 *         stay in acc
 */
struct coll_rvec {
    size_t      esize, chunk_el, V, unit;
    int         piece;
    size_t      stride, col0;
    const char *src;
    char       *acc;
    size_t      acc_lo;
    char       *out;
    int         out_block;
    size_t      scratch_off;      /* the receive slots in the op's scratch */
    size_t      slot_bytes;       /* min(chunk, V) elements' bytes */
};

/* Recursive doubling allreduce over m members (members NULL: rank p), with
 * the fold of a non-power-of-two count: the result in acc (acc_lo 0,
 * identity layout) on every member. Lanes: ph (the doubling), ph+1 (fold),
 * ph+2 (the result back to the folded ranks). */
struct coll_rd {
    const int       *members;
    int              m, my_pos;
    struct coll_rvec v;
    int              ph;
};
size_t coll_rd_scratch(const struct coll_rd *r);
void   coll_rd_build(struct weft_sched_build *b, const struct coll_rd *r);

/* Recursive halving reduce-scatter over every rank of the comm, with the
 * fold. allreduce (Rabenseifner): the vector in segments of
 * ceil(V/p2) per participant, followed by the allgather by recursive
 * doubling (in acc = recvbuf) and the result back to the folded ranks.
 * reduce_scatter: rank r's block (unit elements of the piece) lands in out;
 * a folded rank's block comes back from its partner. Lanes: ph (halving),
 * ph+1 (fold), ph+2 (back to folded ranks), ph+3 (doubling). */
struct coll_halving {
    int              n, me;
    int              rs;           /* 1: reduce_scatter layout, 0: allreduce */
    struct coll_rvec v;
    int              ph;
};
/* Scratch for one piece: receive slots + (reduce_scatter) the partials. */
size_t coll_halving_scratch(const struct coll_halving *h);
/* acc_lo of this rank for reduce_scatter (its first kept range); 0 for
 * allreduce. Set v.acc_lo to it before building. */
size_t coll_halving_acc_lo(const struct coll_halving *h);
void   coll_halving_build(struct weft_sched_build *b, const struct coll_halving *h);

/* ---- shared by the start functions (allreduce.c, reduce_scatter.c, reduce.c) ---- */
/* "allreduce 4096 elements of float32, sum" */
void coll_reduce_log_shape(struct weft_coll *cc, int kind, size_t count, int dtype, int op, int algo,
                           const char *algo_name, int forced);

#endif
