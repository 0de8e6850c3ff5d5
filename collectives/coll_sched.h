/*
 * The schedule engine of the collectives (private to collectives/).
 *
 * (Not "sched.h": every file built with -Icollectives would then get it for
 * the system's <sched.h>, which <pthread.h> includes.)
 *
 * A collective call is an op: an ordered array of steps, built once at the
 * start by the algorithm, then run by the engine (coll_sched.c):
 *
 *   SEND  bytes from src to peer        (weft_p2p_isend on the call's lane `phase`)
 *   RECV  bytes from peer into buf      (weft_p2p_irecv, same lane)
 *   COPY  bytes from src to buf         (weft_devcopy, run when issued: host or device)
 *   REDUCE buf = src op src2, bytes/size-of-dtype elements of the call's
 *         type and operation (run when issued, complete at once: on the
 *         host, or by a CUDA kernel when the op reduces device memory);
 *         F_AVG: then divided by the number of ranks (avg's one division)
 *
 * Steps are issued strictly in array order, so every lane sees its messages
 * in the same order on both sides whatever the timing (the lanes are FIFO:
 * that order is what pairs a send with its receive). A step may wait for
 * one earlier step (WEFT_SCHED dep = its index: forward chunk k once
 * receive k is in) or for a fence (every earlier step complete: the rounds
 * of recursive doubling, Bruck, the barrier); while it waits, no later step
 * is issued either. Messages name `num`, the algorithm's step number.
 *
 * Errors: the first step that fails records "<what> step <num>: <verb> of
 * <bytes> B with peer <p> failed (<why>): <the p2p layer's last error>"
 * (a COPY: weft_devcopy's own message), and the op stops issuing, waits
 * for what it already issued (ignoring their results), then completes with
 * that code.
 *
 * Memory: one allocation per op holds the op, its steps and its scratch
 * (Bruck's rotated blocks, a ring's partial sums). When the op completes,
 * the allocation goes to its comm's list of spares, not back to malloc: a
 * freed block of hundreds of KiB is often handed back to the kernel, and
 * the next call of the same shape then faults every page of its scratch
 * in again (184 faults a call and rank for a 4 MiB reduce_scatter at np
 * 4). The list is bounded (coll_sched.c). Latency of small allgathers and
 * barriers is benchmarked: nothing is allocated per step.
 */
#ifndef WEFT_COLL_SCHED_H
#define WEFT_COLL_SCHED_H

#include <stddef.h>
#include <stdint.h>
#include "coll.h"
#include "p2p.h"

struct weft_p2p;
struct weft_core;
struct weft_request;

enum weft_sched_kind { WEFT_SCHED_SEND = 1, WEFT_SCHED_RECV, WEFT_SCHED_COPY, WEFT_SCHED_REDUCE };

/* How long a rank whose collective failed (or that refused one) keeps
 * progressing, at most, to get the failure notices out before it returns
 * (weft_p2p_flush): a rank that then waits outside weft (MPI_Barrier)
 * would otherwise hold them until its next call. */
#define FAILURE_FLUSH_S 0.1

#define WEFT_SCHED_NODEP (-1)   /* issued as soon as its turn comes */
#define WEFT_SCHED_FENCE (-2)   /* issued once every earlier step completed */

/* Flags. RECEIVE: a failed completion says "receive" (a receive something
 * waits on by itself: ring chunks, the tree's parent) instead of "wait". */
#define WEFT_SCHED_F_RECEIVE 1u
/* REDUCE: the last reduction of an element under WEFT_AVG: divide by the
 * comm size after it (ignored for other operations). */
#define WEFT_SCHED_F_AVG     2u
/* RECV: the message must have exactly the step's bytes. A shorter one
 * fails the call with WEFT_ERR_MISMATCH (alltoallv: the two ranks disagree
 * on the size of the block; a longer one is the pipe's WEFT_ERR_TRUNCATE). */
#define WEFT_SCHED_F_EXACT   4u

struct weft_sched_step {
    void                *buf;    /* RECV, COPY: destination */
    const void          *src;    /* SEND, COPY: source; REDUCE: left operand */
    const void          *src2;   /* REDUCE: right operand */
    size_t               bytes;
    int                  peer;   /* SEND, RECV */
    int                  dep;    /* index of an earlier step, WEFT_SCHED_NODEP or WEFT_SCHED_FENCE */
    int                  num;    /* the algorithm's step number (messages) */
    unsigned char        kind;   /* enum weft_sched_kind */
    unsigned char        phase;  /* lane within the call: tag(seq, phase) */
    unsigned char        flags;
    unsigned char        state;  /* engine: not issued, in flight, complete */
    struct weft_request *req;    /* engine: in flight */
};

/* What a call is, the same on every rank that calls it: carried by every
 * message of the call as its fingerprint (struct weft_p2p_check), so ranks
 * that called different collectives (kind, size, type, operation, root,
 * order) fail with WEFT_ERR_MISMATCH naming both sides instead of pairing
 * wrong messages. */
struct weft_coll_sig {
    int      kind;    /* enum weft_coll_kind (coll.h) */
    int      root;    /* bcast, reduce; -1 otherwise */
    uint64_t param;   /* weft_coll_args.count */
    int      dtype;   /* reductions; -1 otherwise */
    int      op;      /* reductions; -1 otherwise */
};

/* "allgather(8 B/rank)", "bcast(64 B, root 0)", "allreduce(1024 x float32, sum)", "barrier". */
void weft_coll_sig_describe(const struct weft_coll_sig *sig, char *out, size_t n);
/* "allreduce", "bcast", ... (node_coll.c). */
const char *weft_coll_kind_name(int kind);

struct weft_coll_op {
    struct weft_p2p        *p2p;
    struct weft_core       *core;
    const char             *what;    /* "allgather ring", "bcast binomial", ... */
    weft_coll_tag_fn        tag;
    uint32_t                seq;     /* the call's sequence number (its lanes) */
    uint64_t                key;     /* seq with its numbering (stream-ordered or not): what failure
                                        notes go by (weft_p2p_call_key) */
    int                     err;     /* first failure; WEFT_SUCCESS so far */
    struct weft_coll_sig    sig;
    struct weft_p2p_check   check;   /* sig + seq as it travels */
    int                     nranks;  /* REDUCE F_AVG's divisor */
    int                     dev;     /* REDUCE runs CUDA kernels (device buffers, kernels loaded) */
    void                   *scratch_dev; /* device scratch of a dev op */
    struct weft_coll_stage *scratch_st;  /* ... when it came from the comm's list (returned there) */
    struct weft_coll       *stage_cc;/* host staging taken from stage_cc (returned with the op) */
    struct weft_coll_stage *stage;
    struct weft_coll       *cc;      /* the comm whose spares take the op's memory back */
    size_t                  alloc_bytes; /* the op's allocation, scratch included */
    uint64_t                epoch;   /* the p2p fault epoch last looked at */
    size_t                  nsteps;
    size_t                  next;    /* next step to issue */
    size_t                  lo;      /* every step before lo is complete */
    void                   *scratch; /* scratch_bytes, in the op's allocation */
    int                     left;    /* requests left to their pipes after a failure: the op is
                                        kept until the comm goes (they may still send from its scratch) */
    double                  leave_until; /* after a failure: when unanswered announcements are left */
    struct weft_sched_step  steps[];
};

/* ---- building a schedule ----
 * A builder runs twice: once counting (steps == NULL, scratch == NULL),
 * once filling; it must add the same steps both times and may not
 * allocate. */
struct weft_sched_build {
    struct weft_sched_step *steps;   /* NULL: counting pass */
    size_t                  n;       /* steps added so far */
    int                     fence;   /* the next step added waits for a fence */
    char                   *scratch; /* the op's scratch (NULL while counting) */
};

typedef void (*weft_sched_build_fn)(struct weft_sched_build *b, const void *args);

/* Adds a step; returns its index (for a later step's dep). A pending fence
 * (weft_sched_fence) replaces dep on the next step added. */
size_t weft_sched_add(struct weft_sched_build *b, int kind, int num, void *buf, const void *src, size_t bytes,
                      int peer, int phase, int dep, unsigned flags);

/* The next step added waits until every earlier one completed (no-op if
 * no step follows). */
static inline void weft_sched_fence(struct weft_sched_build *b) { b->fence = 1; }

static inline size_t weft_sched_send(struct weft_sched_build *b, int num, const void *src, size_t bytes, int peer,
                                     int phase, int dep)
{
    return weft_sched_add(b, WEFT_SCHED_SEND, num, NULL, src, bytes, peer, phase, dep, 0);
}
static inline size_t weft_sched_recv(struct weft_sched_build *b, int num, void *buf, size_t bytes, int peer,
                                     int phase, int dep, unsigned flags)
{
    return weft_sched_add(b, WEFT_SCHED_RECV, num, buf, NULL, bytes, peer, phase, dep, flags);
}
static inline size_t weft_sched_copy(struct weft_sched_build *b, void *dst, const void *src, size_t bytes)
{
    return weft_sched_add(b, WEFT_SCHED_COPY, 0, dst, src, bytes, -1, 0, WEFT_SCHED_NODEP, 0);
}
/* scratch + off, NULL while counting (no arithmetic on NULL). */
static inline char *weft_sched_scratch(const struct weft_sched_build *b, size_t off)
{
    return b->scratch ? b->scratch + off : NULL;
}

static inline size_t weft_sched_reduce(struct weft_sched_build *b, int num, void *dst, const void *a,
                                       const void *bb, size_t bytes, int dep, unsigned flags)
{
    size_t i = weft_sched_add(b, WEFT_SCHED_REDUCE, num, dst, a, bytes, -1, 0, dep, flags);
    if (b->steps)
        b->steps[i].src2 = bb;
    return i;
}

/* What weft_sched_start makes. */
struct weft_sched_call {
    const char          *what;          /* "allreduce ring", ... (a string literal) */
    struct weft_coll_sig sig;
    weft_coll_tag_fn     tag;
    uint32_t             seq;
    size_t               scratch_bytes;
    int                  scratch_dev;   /* scratch in device memory (the kernel path), REDUCE on device */
    int                  nranks;        /* the comm size (F_AVG) */
    struct weft_coll    *stage_cc;      /* with stage: staging to return when the op is freed */
    struct weft_coll_stage *stage;
    struct weft_coll_prep *prep;        /* the call's weft_coll_prepare (dry: take scratch, start nothing) */
};

/* Builds the op (counting pass, one allocation of the op, its steps and
 * scratch_bytes of scratch -- or a device allocation with scratch_dev --,
 * filling pass) and issues what can go at once. *out is the op in
 * progress. WEFT_ERR_NO_MEMORY (last error set) with *out = NULL when it
 * cannot be allocated (the stage is then returned too); issue failures are
 * the op's result (test / wait). */
int  weft_sched_start(struct weft_coll *cc, const struct weft_sched_call *call, weft_sched_build_fn build,
                      const void *args, struct weft_coll_op **out);
/* Frees the comm's spare op allocations (weft_coll_fini, after every op). */
void weft_sched_spares_fini(struct weft_coll *cc);

/* The op's steps issued so far that are in flight: the oldest (for a
 * per-request clock), or NULL. */
struct weft_request *weft_sched_oldest(const struct weft_coll_op *op);
/* A fingerprint in words ("reduce(4 x int32, sum, root 1)"): what p2p
 * says of a peer's call when it asked about a stalled receive
 * (weft_p2p_set_check_describe). */
void weft_sched_describe_check(const struct weft_p2p_check *c, char *out, size_t n);
/* The fingerprint of call seq with signature sig, as its messages carry it. */
struct weft_p2p_check weft_sched_sig_check(const struct weft_coll_sig *sig, uint32_t seq);

/* weft_coll_op_test / weft_coll_op_wait / weft_coll_op_abandon (coll.h)
 * are the engine's other entry points. */

#endif
