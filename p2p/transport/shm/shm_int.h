/*
 * What shm.c (segments, lanes, waking) and shm_cma.c (the CMA path) share:
 * the rank card's blob, the home segment's header, the help slot of CMA
 * transfers, the per-peer and per-comm state, and the functions one file
 * calls in the other. Private to p2p/transport/shm/; every function here
 * has hidden visibility, as the whole library does.
 */
#ifndef WEFT_SHM_INT_H
#define WEFT_SHM_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "core.h"
#include "list.h"
#include "shm_ring.h"
#include "transport.h"

/* Generations a lane may grow through (x4 each, from the smallest ring
 * that carries an eager frame up to WEFT_SHM_RING_KB). */
#define SHM_LANE_GENS 8

/* This rank's blob in the rank card. */
struct shm_card {
    char     name[64];       /* this rank's home segment (doorbell, knocks); "" = none */
    uint64_t token;          /* shm's own random token: the segment header repeats it */
    uint64_t probe_addr;     /* address of that token in the owner's process: CMA probe */
};
#define SHM_CARD_BYTES ((sizeof(struct shm_card) + 7) & ~(size_t)7)
_Static_assert(sizeof(struct shm_card) <= SHM_CARD_BYTES, "shm blob fits its card bytes");

/* Home segment: one per rank and comm, made at create (before the cards
 * are exchanged, so whoever reads the card finds it). It holds what peers
 * need before any ring exists between them: the doorbell its owner sleeps
 * on and the knock map where a peer that made a lane toward the owner sets
 * its bit; also the helps counter a receiver bumps when it opens a help
 * slot toward the owner, so the owner's progress polls one word, not every
 * slot. It grows with the comm by one bit per rank; the rings live in
 * lanes (below), made only between ranks that talk. */
struct shm_home_hdr {
    uint64_t magic;
    uint64_t token;          /* the owner's shm token (its blob): a peer checks it */
    uint64_t bytes;          /* segment size */
    int32_t  pid;
    int32_t  nranks;         /* bits in the knock map */
    _Alignas(64) _Atomic uint32_t doorbell;  /* futex word, bumped by wakers */
    _Atomic uint32_t sleepers;               /* threads of the owner in sleep() */
    _Atomic uint32_t knocks;                 /* bumped after a bit of the knock map is set */
    _Atomic uint32_t helps;                  /* bumped after a peer opened a help slot toward the owner */
    char     pad[48];
};
_Static_assert(sizeof(struct shm_home_hdr) % 64 == 0, "knock map starts aligned");

/* Shared work list of one large CMA transfer from the peer to the owner of
 * the segment. The receiver opens it in rndv_get; then both processes claim
 * pieces from `claim` and copy them with one copy each: the receiver with
 * process_vm_readv, the sender (from its progress loop, while it waits for
 * FIN anyway) with process_vm_writev. Two cores copy at once, and a side
 * that is descheduled is simply outrun by the other. The receiver returns
 * from rndv_get only when `copied` covers the message, so the sender never
 * touches either buffer after the send completes.
 *
 * claim = generation << 40 | index of the next piece; SHM_HELP_CLOSED as
 * the index means "no transfer open". The receiver closes the slot before
 * it rewrites the fields and reopens it after, and a claim is a CAS on the
 * whole word, so a sender that read fields of another generation fails its
 * claim instead of copying with stale addresses. */
#define SHM_HELP_IDX_BITS 40
#define SHM_HELP_IDX_MASK ((UINT64_C(1) << SHM_HELP_IDX_BITS) - 1)
#define SHM_HELP_CLOSED SHM_HELP_IDX_MASK
struct shm_help_slot {
    _Alignas(64) _Atomic uint64_t claim;
    _Atomic uint64_t src;        /* sender's buffer, in the sender's address space */
    _Atomic uint64_t dst;        /* receiver's buffer, in the receiver's address space */
    _Atomic uint64_t bytes;
    _Atomic uint64_t piece;
    /* a vectored message: src and dst are arrays of struct weft_iov, of
     * (niov & 0xffffffff) and (niov >> 32) pieces; 0 on a side: a buffer */
    _Atomic uint64_t niov;
    _Alignas(64) _Atomic uint64_t copied;  /* bytes in place, by either side */
    _Atomic uint64_t redo_off;   /* a piece the sender claimed but could not write */
    _Atomic uint64_t redo_len;   /* (the receiver reads it itself); 0 = none */
    char pad[40];
};
_Static_assert(sizeof(struct shm_help_slot) == 128, "help slot is two cache lines");

/* ---- the stream choice's costs (shm_cma.c decides, shm.c times pushes) ---- */

/* Pieces at least this big are timed for push_cost / pull_cost: smaller
 * ones are mostly per-call cost, not copying. */
#define SHM_RATE_MIN ((size_t)8 << 10)

/* Costs are kept per message size, by powers of two from SHM_RATE_MIN:
 * a pull's fixed cost weighs less on a bigger message, and a size a
 * program switches to starts from what that size did, not another's. */
#define SHM_RATE_CLASSES 6
static inline unsigned shm_rate_class(size_t bytes)
{
    unsigned c = 0;
    for (size_t b = bytes / SHM_RATE_MIN; b > 1 && c + 1 < SHM_RATE_CLASSES; b >>= 1)
        c++;
    return c;
}

/* Pushed pieces further apart than this (s) did not come back to back:
 * the gap says nothing of the push's speed. */
#define SHM_RATE_GAP 1e-3

/* Folds `bytes` that took `dt` seconds into *cost, an average of seconds
 * per byte (time per byte, not bytes per time: a burst of pieces copied
 * out back to back must not outweigh the wait before it). */
static inline void shm_cost_note(double *cost, size_t bytes, double dt)
{
    if (dt <= 0 || bytes == 0)
        return;
    double c = dt / (double)bytes;
    *cost = *cost > 0 ? *cost + (c - *cost) / 8 : c;
}

struct shm_peer {
    int                   rank;
    pid_t                 pid;
    int                   cma_ok;       /* pulls from this peer work */
    int                   cma_used;     /* a pull has succeeded */
    int                   stream_told;  /* the info line on this peer's stream was written */
    /* The stream choice (shm_cma.c, stream_push): what a byte of a message
     * from this peer costs (s/byte, averaged; 0: not timed yet) pushed
     * through the ring (arrival gaps, shm.c) and pulled by CMA. */
    double                push_cost[SHM_RATE_CLASSES];   /* per message size class (shm_rate_class) */
    double                pull_cost[SHM_RATE_CLASSES];
    double                piece_t;      /* when the last pushed piece arrived (0: a pull came since) */
    int                   expect_timed; /* the next rndv_expect's pieces are timed (stream_push says) */
    unsigned              probe_left;   /* messages left in a run the other way */
    unsigned              stream_n;     /* stream messages decided (probe runs start every SHM_STREAM_PROBE-th) */
    int                   aborted;      /* abort_peer: the pipe broke; help no more, drop its data */
    int                   listed;       /* on the state's live list */
    struct shm_ring      *in;           /* peer -> me: the peer's lane (NULL until it knocked) */
    struct shm_ring      *out;          /* me -> peer: our lane (NULL until our first message) */
    struct shm_help_slot *help_in;      /* transfers peer -> me, in the peer's lane */
    struct shm_help_slot *help_out;     /* transfers me -> peer, in our lane */
    int                   help_broken;  /* a process_vm_writev into the peer failed: stop helping */
    struct shm_home_hdr  *peer_hdr;     /* the peer's home segment (doorbell, knocks), mapped at first contact */
    size_t                peer_home_bytes;
    void                 *lane_maps[2][SHM_LANE_GENS]; /* [0 out, 1 in][generation]: every mapping, kept */
    size_t                lane_bytes[2][SHM_LANE_GENS];
    unsigned              out_gen, in_gen;
    unsigned              out_stalls;   /* times the out ring had no room since it was made */
    size_t                out_cap;      /* capacity of the out ring now */
    int                   grow_denied;  /* the budget or /dev/shm refused a bigger ring: stop trying */
    struct weft_queue     pushes_q;     /* sends to push, FIFO (struct shm_xfer) */
    struct weft_queue     expects_q;    /* receives a push will fill, in CTS order (struct shm_xfer) */
    uint64_t              expect_seq;   /* last key handed out by rndv_expect */
    _Atomic size_t        out_need;     /* payload size a blocked producer waits room for; 0 = none */
    _Atomic int           pushes;       /* entries on the push FIFO (read by sleep) */
};

struct shm_state {
    const struct weft_tp_env *env;
    uint64_t              token;        /* in the home header and the blob; its address is the CMA probe */
    char                  name[64];     /* home segment; lanes are named after it */
    int                   linked;       /* own home name still in /dev/shm */
    struct shm_home_hdr  *seg;          /* own home segment */
    size_t                seg_bytes;
    uint32_t              knocks_seen;  /* home knocks counter at the last look */
    uint32_t              helps_seen;   /* home helps counter at the last look */
    int                   pushing;      /* entries on all push FIFOs (under the lock): progress skips
                                         * advance_pushes while 0 */
    struct shm_peer      *peers;
    int                   npeers;
    struct shm_peer     **by_rank;      /* [size]: the peer of that rank, NULL = not shm */
    int                   nranks;       /* entries of by_rank (0 while it is NULL) */
    struct shm_peer     **live;         /* peers with a lane either way, read by sleep without the lock */
    _Atomic int           nlive;
    size_t                ring_min;     /* a new lane's ring: fits the largest eager frame */
    size_t                lane_budget;  /* WEFT_SHM_BUDGET_MB: bytes of rings this rank's lanes may hold */
    size_t                lane_held;    /* bytes of rings in this rank's current lanes */
    int                   budget_told;  /* the budget stopped a growth (logged once) */
};

static inline struct weft_core *shm_core(const struct shm_state *st)
{
    return st->env->core;
}

/* The peer of that rank, NULL when it does not use shm (or set-up failed). */
static inline struct shm_peer *peer_of(const struct shm_state *st, int rank)
{
    /* nranks is 0 while by_rank is NULL; the unsigned compare rejects a
     * negative rank too */
    if (st == NULL || (unsigned)rank >= (unsigned)st->nranks)
        return NULL;
    return st->by_rank[rank];
}

/* Bumps the doorbell of h and wakes its owner's sleepers: the slow half
 * of wake_sleepers (shm.c, which says when a waker may call it). */
void weft_shm_ring_doorbell(struct shm_home_hdr *h);

static inline void wake_sleepers(struct shm_home_hdr *h)
{
    /* the usual answer (nobody sleeps) costs one load, inlined into every send */
    if (__builtin_expect(atomic_load_explicit(&h->sleepers, memory_order_relaxed) != 0, 0))
        weft_shm_ring_doorbell(h);
}

/* Whether the peer's inbound ring holds records behind the one being
 * handled (drain_inbound's peek; the whole ring when none is): the peer
 * has already sent more -- a stream, not a lone message (shm.c). */
int weft_shm_more_queued(struct shm_peer *peer);

/* A peer's blob, copied out (the card area promises no alignment). */
static inline struct shm_card read_card(const struct shm_state *st, int rank)
{
    struct shm_card card;
    memcpy(&card, weft_tp_blob(&st->env->cards, rank), sizeof(card));
    card.name[sizeof(card.name) - 1] = '\0';
    return card;
}

/* ---- shm_cma.c ---- */

/* Names any process a tracer (Yama), so peers may pull from this one by
 * CMA; only when WEFT_SHM_CMA is on. Called by create. */
void weft_shm_cma_allow_peers(const struct weft_core *core);

/* Whether this rank may read peer's memory (peer->pid must be known). */
int weft_shm_probe_cma(struct shm_state *st, struct shm_peer *peer);
/* weft_info: whether a peer process could read this one by CMA, tried by
 * weft_shm_probe_cma from a child against rank 0's card in st->env->cards
 * (this process's own card); 0 with why ("refused by ptrace scope
 * (kernel.yama.ptrace_scope=2: ...)", "WEFT_SHM_CMA=0"), 1 when it works. */
int weft_shm_cma_check(struct shm_state *st, char *why, size_t whylen);

/* Sender side, from progress: copies the pieces of a transfer the peer
 * opened in our lane's help slot. Returns the pieces copied. */
int weft_shm_help_peer(struct shm_state *st, struct shm_peer *peer);

/* The transport's rndv_get: the single-copy pull, or WEFT_EAGAIN to let
 * the sender push through the ring. */
int weft_shm_rndv_get(void *ctx, int rank, struct weft_tp_xfer *x, const struct weft_tp_src *src);

#endif
