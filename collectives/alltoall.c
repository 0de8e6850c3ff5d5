/*
 * weft_alltoall: block j of sendbuf (bytes per rank) goes to rank j and
 * lands at recvbuf + rank*bytes there. Two algorithms, each a schedule
 * (coll_sched.h): pairwise exchange (any block size, n-1 messages per rank,
 * every byte moved once) and Bruck (small blocks, ceil(log2 n) messages per
 * rank, each byte moved up to log2(n) times). WEFT_ALLTOALL_ALGO forces one
 * (cc->a2a_algo); otherwise the selector below decides.
 *
 * weft_alltoallv: the same exchange with a size and an offset per block
 * (struct weft_coll_vec), always pairwise (Bruck packs equal blocks); see
 * coll_alltoallv_start at the end. On a comm of one node blocking calls
 * mostly do not come here: node_coll.c runs them through the node's
 * segment, or pulls their large blocks by CMA; here come the ones it
 * cannot (in place, device buffers, CMA off, a forced WEFT_ALLTOALL_ALGO),
 * the non-blocking ones, and those across nodes.
 *
 * Buffers may be host or device memory: data moves only through SEND/RECV
 * (the pipe layer stages device memory where it must) and COPY steps
 * (weft_devcopy), never through memcpy here. In place (sendbuf == recvbuf)
 * the blocks still to be sent are read from a copy in the op's scratch,
 * since receives land on them. All offsets are size_t.
 *
 * The thresholds below were measured with weft-perf alltoall and a
 * harness alternating the forced algorithms and MPI_Alltoall in one job
 * (2 cores, 8-16 ranks oversubscribed, other jobs running: single numbers
 * move by 2x, the comparisons held across runs); the numbers behind each
 * threshold are quoted beside it.
 */
#include <stdio.h>
#include <string.h>
#include "coll_impl.h"
#include "config.h"
#include "core.h"
#include "devcopy.h"
#include "log.h"
#include "weft.h"

/* Bruck while a block is at most this many bytes and there are more than
 * WEFT_A2A_BRUCK_MIN_RANKS - 1 ranks: there the cost is the number of
 * messages (each a trip through a shm ring or a TCP frame, and on an
 * oversubscribed node a wake-up of the peer), and Bruck sends log2(n)
 * instead of n-1, at the price of moving about log2(n)/2 times the data
 * plus packing copies. Measured (median µs, pairwise / Bruck): np 8, 8 B:
 * 128 / 115, 64 B: 100 / 110, 1 KiB: 147 / 182 -- a draw at best, so
 * pairwise; np 12, 8 B: 298 / 254, 1 KiB: 507 / 477, 2 KiB: 612 / 852;
 * np 16, 64 B: 1586 / 667, 1 KiB: 1616 / 1061, 4 KiB: 3246 / 3917. */
#define WEFT_A2A_BRUCK_MAX_BLOCK 1024u
#define WEFT_A2A_BRUCK_MIN_RANKS 9
/* Pairwise: steps in flight at once. Blocks up to WEFT_A2A_WIDE_BLOCK (the
 * shm eager limit of the collectives' messages, WEFT_SHM_COLL_EAGER) go
 * all at once: each is a short copy into a ring, posting them together
 * costs nothing and hides every latency. Larger ones keep a window of
 * WEFT_A2A_WINDOW steps, so each rank has a few rendezvous transfers going
 * (their pulls overlap) without every peer's data arriving at once and
 * crowding the transports' buffers. On 2 cores the window size made no
 * difference beyond the noise (np 4 and 8, 64 KiB .. 4 MiB blocks,
 * windows 1, 2, 4 and all: within 10-20 % of each other, in no consistent
 * order): the bound is for larger nodes and networks. */
#define WEFT_A2A_WIDE_BLOCK      (32u * 1024u)
#define WEFT_A2A_WINDOW          4

/* base + off; NULL while a schedule is being counted (no arithmetic on NULL). */
static char *at(char *base, size_t off)
{
    return base ? base + off : NULL;
}
static const char *at_c(const char *base, size_t off)
{
    return base ? base + off : NULL;
}

struct a2a_args {
    int         n, me;
    const char *sendbuf;
    char       *recvbuf;
    size_t      bytes;
    const struct weft_coll_vec *vec;   /* alltoallv: the blocks' sizes and offsets (pairwise only) */
    int         in_place;
    int         window;     /* pairwise: steps in flight */
    int         stage_out;  /* bruck: recvbuf is device memory: assemble in scratch, one copy out */
    size_t      maxcnt;     /* bruck: most blocks sent in one round */
};

/* Where the block for rank `to` is in sendbuf, where the one from rank
 * `from` goes in recvbuf, and their sizes: uniform blocks, or alltoallv's. */
static size_t send_off(const struct a2a_args *a, int to)
{
    return a->vec ? a->vec->send_displs[to] : (size_t)to * a->bytes;
}
static size_t send_len(const struct a2a_args *a, int to)
{
    return a->vec ? a->vec->send_bytes[to] : a->bytes;
}
static size_t recv_off(const struct a2a_args *a, int from)
{
    return a->vec ? a->vec->recv_displs[from] : (size_t)from * a->bytes;
}
static size_t recv_len(const struct a2a_args *a, int from)
{
    return a->vec ? a->vec->recv_bytes[from] : a->bytes;
}

/*
 * Pairwise exchange: n-1 steps; at step s rank me sends its block for
 * me+s to me+s and receives the block of me-s from me-s. Every rank sends
 * and receives exactly one message per step, so no link carries more than
 * one message of the call, and every byte is moved once.
 *
 *     n = 4     step 1        step 2        step 3
 *     rank 0:   0 -> 1        0 -> 2        0 -> 3
 *               0 <- 3        0 <- 2        0 <- 1
 *     rank 1:   1 -> 2        1 -> 3        1 -> 0
 *               1 <- 0        1 <- 3        1 <- 2
 *               (a -> b: a's block for b; every rank's own block is a local copy)
 *
 * Steps overlap in a window of w: steps 1..w start at once, step s+w
 * starts when step s completed (its receive and its send). Step s
 * completes once rank me-s has sent its step s and rank me+s has posted
 * its receive of step s, which both did by induction on s, so the window
 * cannot deadlock. w = n-1 posts everything at once.
 *
 * Schedule: [in place: COPY of sendbuf into scratch], RECVs 1..w, SENDs
 * 1..w, [out of place: COPY of the own block], then per step s > w a RECV
 * depending on RECV s-w and a SEND depending on SEND s-w.
 *
 * alltoallv runs the same schedule with its own sizes and offsets (never in
 * place). A block of 0 bytes is still a message: a rank cannot tell that
 * its peer also passes 0, and an empty message costs a header while a
 * skipped one that the peer waits for is a hang; each receive must get
 * exactly its size (WEFT_SCHED_F_EXACT), so ranks that disagree on a
 * block's size fail with WEFT_ERR_MISMATCH (a larger one: the pipe's
 * WEFT_ERR_TRUNCATE) instead of returning short data. The window may
 * differ between ranks (each picks it from its own block sizes): the
 * induction above holds for any windows.
 */
static void build_pairwise(struct weft_sched_build *b, const void *args)
{
    const struct a2a_args *a = args;
    int n = a->n, me = a->me, w = a->window;
    size_t total = (size_t)n * a->bytes;
    const char *src = a->sendbuf;
    size_t first_recv = 0, first_send = 0;
    unsigned rflags = WEFT_SCHED_F_RECEIVE | (a->vec ? WEFT_SCHED_F_EXACT : 0u);

    if (a->in_place) {
        /* Before any receive is posted: an eager message already here is
         * delivered at the post, straight over a block not yet sent. */
        weft_sched_copy(b, weft_sched_scratch(b, 0), a->sendbuf, total);
        src = weft_sched_scratch(b, 0);
    }
    for (int s = 1; s <= w; s++) {
        int from = (me - s + n) % n;
        size_t i = weft_sched_recv(b, s, at(a->recvbuf, recv_off(a, from)), recv_len(a, from), from, 0,
                                   WEFT_SCHED_NODEP, rflags);
        if (s == 1)
            first_recv = i;
    }
    for (int s = 1; s <= w; s++) {
        int to = (me + s) % n;
        size_t i = weft_sched_send(b, s, at_c(src, send_off(a, to)), send_len(a, to), to, 0, WEFT_SCHED_NODEP);
        if (s == 1)
            first_send = i;
    }
    if (!a->in_place && send_len(a, me) > 0)
        weft_sched_copy(b, at(a->recvbuf, recv_off(a, me)), at_c(a->sendbuf, send_off(a, me)), send_len(a, me));
    /* Steps w+1 .. n-1, two schedule entries each: RECV s, SEND s. Step s-w's
     * receive is first_recv + (s-w-1) while s-w <= w, and its send
     * first_send + ...; later ones are in the sliding part (2 per step). */
    size_t slide = b->n;
    for (int s = w + 1; s < n; s++) {
        int from = (me - s + n) % n, to = (me + s) % n, prev = s - w;
        size_t rdep, sdep;
        if (prev <= w) {
            rdep = first_recv + (size_t)(prev - 1);
            sdep = first_send + (size_t)(prev - 1);
        } else {
            rdep = slide + 2 * (size_t)(prev - w - 1);
            sdep = rdep + 1;
        }
        weft_sched_recv(b, s, at(a->recvbuf, recv_off(a, from)), recv_len(a, from), from, 0, (int)rdep, rflags);
        weft_sched_send(b, s, at_c(src, send_off(a, to)), send_len(a, to), to, 0, (int)sdep);
    }
}

/*
 * Bruck (small blocks): ceil(log2 n) rounds of one message each way. Slot
 * i of a scratch array first holds the block for rank me+i (a rotation of
 * sendbuf). In round k (d = 2^k) every slot whose index has bit k set is
 * packed into one message to me+d, and the message from me-d fills the
 * same slots. A block in slot i thus travels i ranks forward in total, one
 * set bit at a time, so at the end slot i of rank me holds the block rank
 * me-i has for me. Slot i's last move is in the round of its highest set
 * bit, so it is copied to recvbuf + (me-i)*bytes right there.
 *
 *     n = 5, rank 0, slot i = [block for rank 0+i]:
 *       start       [0>0 0>1 0>2 0>3 0>4]    (a>b: a's block for b)
 *       round 0     slots 1,3 -> rank 1, from rank 4:  [0>0 4>0 0>2 4>2 0>4]
 *       (d=1)       slot 1 is final (4>0)
 *       round 1     slots 2,3 -> rank 2, from rank 3:  [0>0 4>0 3>0 2>0 0>4]
 *       (d=2)       slots 2,3 final (3>0, 2>0)
 *       round 2     slot 4 -> rank 4, from rank 1:     [0>0 4>0 3>0 2>0 1>0]
 *       (d=4)       slot 4 final (1>0); recvbuf[j] = slot (0-j) mod 5
 *
 * The slots of a round form runs of d consecutive indices, so packing is
 * one COPY per run (about n/2 copies over all rounds).
 *
 * Scratch: slots [n*bytes] | packed send [maxcnt*bytes] | packed receive
 * [maxcnt*bytes] | (stage_out: the result [n*bytes], copied to the device
 * recvbuf in one COPY instead of one per block).
 *
 * Schedule: the rotation (two COPYs, or one), the own block's COPY; per
 * round a RECV, the pack COPYs and the SEND, a fence, the unpack COPYs
 * (runs that are not final go back to their slots, final blocks to their
 * place in the result); at the end, with stage_out, the result's COPY.
 */
static void build_bruck(struct weft_sched_build *b, const void *args)
{
    const struct a2a_args *a = args;
    int n = a->n, me = a->me, round = 0;
    size_t bytes = a->bytes, total = (size_t)n * bytes;
    size_t pack_off = total, unpack_off = total + a->maxcnt * bytes, out_off = unpack_off + a->maxcnt * bytes;
    char *slots = weft_sched_scratch(b, 0);
    char *out = a->stage_out ? weft_sched_scratch(b, out_off) : a->recvbuf;

    /* Slot i = block for me+i: blocks me..n-1, then 0..me-1. */
    weft_sched_copy(b, slots, a->sendbuf + (size_t)me * bytes, (size_t)(n - me) * bytes);
    if (me > 0)
        weft_sched_copy(b, weft_sched_scratch(b, (size_t)(n - me) * bytes), a->sendbuf, (size_t)me * bytes);
    /* The own block never moves (slot 0); in place it is there already. */
    if (a->stage_out || !a->in_place)
        weft_sched_copy(b, at(out, (size_t)me * bytes), slots, bytes);

    for (int d = 1; d < n; d <<= 1, round++) {
        int to = (me + d) % n, from = (me - d + n) % n;
        size_t cnt = 0, off;
        for (int j = d; j < n; j += 2 * d)
            cnt += (size_t)(j + d <= n ? d : n - j);
        weft_sched_recv(b, round, weft_sched_scratch(b, unpack_off), cnt * bytes, from, 0, WEFT_SCHED_NODEP, 0);
        off = 0;
        for (int j = d; j < n; j += 2 * d) {
            size_t len = (size_t)(j + d <= n ? d : n - j) * bytes;
            weft_sched_copy(b, weft_sched_scratch(b, pack_off + off), weft_sched_scratch(b, (size_t)j * bytes), len);
            off += len;
        }
        weft_sched_send(b, round, weft_sched_scratch(b, pack_off), cnt * bytes, to, 0, WEFT_SCHED_NODEP);
        /* Unpack once this round's message is in (and the packed send is
         * free for the next round). */
        weft_sched_fence(b);
        off = 0;
        for (int j = d; j < n; j += 2 * d) {
            int len = j + d <= n ? d : n - j;
            if (j == d) {
                /* Slots d .. 2d-1 have no higher bit: final. Slot i holds
                 * the block of rank me-i. */
                for (int i = j; i < j + len; i++) {
                    int src_rank = (me - i + n) % n;
                    weft_sched_copy(b, at(out, (size_t)src_rank * bytes),
                                    weft_sched_scratch(b, unpack_off + off + (size_t)(i - j) * bytes), bytes);
                }
            } else {
                weft_sched_copy(b, weft_sched_scratch(b, (size_t)j * bytes), weft_sched_scratch(b, unpack_off + off),
                                (size_t)len * bytes);
            }
            off += (size_t)len * bytes;
        }
    }
    if (a->stage_out)
        weft_sched_copy(b, a->recvbuf, out, total);
}

/* The most slots any round of Bruck packs. */
static size_t bruck_maxcnt(int n)
{
    size_t best = 0;
    for (int d = 1; d < n; d <<= 1) {
        size_t cnt = 0;
        for (int j = d; j < n; j += 2 * d)
            cnt += (size_t)(j + d <= n ? d : n - j);
        if (cnt > best)
            best = cnt;
    }
    return best;
}

static const char *a2a_algo_name(int algo)
{
    return (algo > 0 && algo < WEFT_A2A_COUNT) ? weft_alltoall_algo_names[algo] : "?";
}

static int a2a_select(int n, size_t bytes)
{
    if (bytes <= WEFT_A2A_BRUCK_MAX_BLOCK && n >= WEFT_A2A_BRUCK_MIN_RANKS)
        return WEFT_A2A_BRUCK;
    return WEFT_A2A_PAIRWISE;
}

/* The call's start (see coll_impl.h). */
int coll_alltoall_start(struct weft_coll *cc, const struct weft_coll_args *ca, weft_coll_tag_fn tag, uint32_t seq,
                        struct weft_coll_op **op)
{
    int n = cc->core->size, me = cc->core->rank, rc;
    size_t bytes = ca->count;
    struct a2a_args a;

    *op = NULL;
    if (bytes == 0)
        return WEFT_SUCCESS;
    if (n == 1) {
        if (ca->sendbuf != ca->recvbuf)
            return weft_devcopy(cc->core, ca->recvbuf, ca->sendbuf, bytes, "weft_alltoall");
        return WEFT_SUCCESS;
    }

    int algo = cc->a2a_algo, forced = algo != WEFT_A2A_AUTO;
    if (!forced)
        algo = a2a_select(n, bytes);
    if (weft_log_level() >= WEFT_LOG_INFO) {
        char what[64];
        snprintf(what, sizeof what, "alltoall %zu B per rank", bytes);
        coll_log_shape_once(cc, WEFT_COLL_ALLTOALL, bytes, algo, what, a2a_algo_name(algo), forced);
    }

    memset(&a, 0, sizeof a);
    a.n = n;
    a.me = me;
    a.sendbuf = ca->sendbuf;
    a.recvbuf = ca->recvbuf;
    a.bytes = bytes;
    a.in_place = ca->sendbuf == ca->recvbuf;
    struct weft_sched_call call = {
        .what = "alltoall pairwise", .sig = { WEFT_COLL_ALLTOALL, -1, bytes, -1, -1 }, .tag = tag, .seq = seq,
        .nranks = n,
    };
    weft_sched_build_fn build;
    size_t total = (size_t)n * bytes;   /* no overflow: checked by the API (src/api/check.c) */

    switch (algo) {
    case WEFT_A2A_PAIRWISE:
        build = build_pairwise;
        a.window = bytes <= WEFT_A2A_WIDE_BLOCK || n - 1 < WEFT_A2A_WINDOW ? n - 1 : WEFT_A2A_WINDOW;
        call.scratch_bytes = a.in_place ? total : 0;
        break;
    case WEFT_A2A_BRUCK: {
        int kind = 0, dev = -1;
        if ((rc = weft_mem_classify(cc->core, ca->recvbuf, total, -1, -1, "weft_alltoall", &kind, &dev)) !=
            WEFT_SUCCESS)
            return rc;
        build = build_bruck;
        call.what = "alltoall bruck";
        a.stage_out = kind != 0;   /* not WEFT_MEM_HOST */
        a.maxcnt = bruck_maxcnt(n);
        /* slots + two packed messages (+ the staged result); maxcnt < n. */
        if (a.maxcnt * bytes > (SIZE_MAX - 2 * total) / 2)
            return weft_set_error(cc->core, WEFT_ERR_NO_MEMORY,
                                  "weft_alltoall: bruck scratch for %zu B x %d ranks overflows size_t", bytes, n);
        call.scratch_bytes = total + 2 * a.maxcnt * bytes + (a.stage_out ? total : 0);
        break;
    }
    default:
        return weft_set_error(cc->core, WEFT_ERR_INTERNAL, "weft_alltoall: selector returned algorithm %d", algo);
    }
    return weft_sched_start(cc, &call, build, &a, op);
}

/*
 * weft_alltoallv: the pairwise schedule above over the caller's layout
 * (ca->vec, validated by src/api/check.c: offsets + sizes fit, the own
 * block's two sizes agree, send and receive blocks apart). Every pair
 * exchanges one message each way per call, empty or not (see
 * build_pairwise), so all ranks take part in every call whatever their
 * sizes. The window is picked from this rank's largest block, as for
 * uniform blocks. The fingerprint carries no size (each rank's layout is
 * its own): the sizes are checked pairwise by the receives instead.
 */
int coll_alltoallv_start(struct weft_coll *cc, const struct weft_coll_args *ca, weft_coll_tag_fn tag, uint32_t seq,
                         struct weft_coll_op **op)
{
    int n = cc->core->size, me = cc->core->rank;
    const struct weft_coll_vec *v = ca->vec;
    struct a2a_args a;

    *op = NULL;
    if (v == NULL)
        return weft_set_error(cc->core, WEFT_ERR_INTERNAL, "weft_alltoallv: no block layout");
    if (n == 1) {
        size_t len = v->send_bytes[0];
        char *dst = len ? (char *)ca->recvbuf + v->recv_displs[0] : NULL;
        const char *src = len ? (const char *)ca->sendbuf + v->send_displs[0] : NULL;
        if (len == 0 || dst == src)
            return WEFT_SUCCESS;
        return weft_devcopy(cc->core, dst, src, len, "weft_alltoallv");
    }

    memset(&a, 0, sizeof a);
    a.n = n;
    a.me = me;
    a.sendbuf = ca->sendbuf;
    a.recvbuf = ca->recvbuf;
    a.vec = v;
    size_t biggest = 0;
    for (int j = 0; j < n; j++) {
        if (j == me)
            continue;
        if (v->send_bytes[j] > biggest)
            biggest = v->send_bytes[j];
        if (v->recv_bytes[j] > biggest)
            biggest = v->recv_bytes[j];
    }
    a.window = biggest <= WEFT_A2A_WIDE_BLOCK || n - 1 < WEFT_A2A_WINDOW ? n - 1 : WEFT_A2A_WINDOW;
    struct weft_sched_call call = {
        .what = "alltoallv pairwise", .sig = { WEFT_COLL_ALLTOALLV, -1, 0, -1, -1 }, .tag = tag, .seq = seq,
        .nranks = n,
    };
    return weft_sched_start(cc, &call, build_pairwise, &a, op);
}
