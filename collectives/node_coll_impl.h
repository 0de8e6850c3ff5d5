/*
 * The node-local collectives' internals, shared by node_coll.c (the
 * segment, its flags and waits, the calls of a comm on one node) and
 * node_hier.c (the same calls composed across nodes: a segment per node,
 * messages among one rank of each). Private to collectives/.
 *
 * Indices. A segment belongs to the ranks of one (effective) node: P of
 * them, local index 0..P-1 in ascending comm rank (ranks[i] is local
 * index i's comm rank; on a comm of one node, the identity). Slots, flags
 * and waits go by local index; errors name comm ranks (node_crank).
 */
#ifndef WEFT_NODE_COLL_IMPL_H
#define WEFT_NODE_COLL_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "coll_impl.h"

#define NODE_CACHE 64
/* Calls of at most NODE_SMALL bytes a rank use a ring of NODE_NSMALL small
 * buffers, the others two of WEFT_NODE_COLL_KB: a root that only writes
 * (bcast, scatter) or a rank that only contributes (reduce, gather) may
 * then run up to NODE_NSMALL small calls ahead of the slowest reader, as
 * eager messages let it -- with two buffers a bcast loop at 4 ranks on 2
 * cores switched cores at every call and ran 6x slower than as messages. */
#define NODE_SMALL  1024
#define NODE_NSMALL 64
#define NODE_NBUF   (NODE_NSMALL + 2)
#define NODE_CTRL_USED  (3 * NODE_CACHE + NODE_NBUF * 3 * 8)
#define NODE_CTRL_BYTES ((NODE_CTRL_USED + NODE_CACHE - 1) / NODE_CACHE * NODE_CACHE)

/* One rank's flags: written by that rank only. Values are collective
 * numbers + 1 (0: nothing yet), compared modulo 2^32. */
struct node_ctrl {
    _Atomic uint32_t arrive;      /* newest call whose data and fingerprint are out */
    _Atomic uint32_t sliced;      /* newest call whose result this rank put out: its slice in res (allreduce
                                     on one node), or the whole result in its slot (node_hier.c) */
    _Atomic uint32_t marked;      /* newest call this rank refused, or failed before its part was out */
    int32_t          mark_code;   /* ... WEFT_SUCCESS: refused; else the failure */
    int32_t          pid;
    /* head in a line of its own: written at every call's start, read by
     * the others only when something is wrong, it does not take away the
     * line they poll for arrive and done. */
    _Alignas(NODE_CACHE) _Atomic uint32_t head_ver; /* seqlock of head: odd while written */
    _Atomic uint64_t head[3];     /* newest collective this rank started, on any path */
    /* done too, written at every call's end: the others read it only
     * before rewriting a buffer whose last use they have not seen done
     * (node_slot_free), about once in NODE_NSMALL calls. */
    _Alignas(NODE_CACHE) _Atomic uint32_t done; /* newest call this rank no longer reads anything of */
    _Alignas(NODE_CACHE)
    uint64_t         fp[NODE_NBUF][3]; /* fingerprint of the call that used buffer b */
    char             pad[NODE_CTRL_BYTES - NODE_CTRL_USED];
};
_Static_assert(sizeof(struct node_ctrl) == NODE_CTRL_BYTES, "ctrl is whole cache lines");

struct coll_node {
    char             *base;
    size_t            bytes;
    /* The large calls' segment (node_large_setup): big buffers of
     * WEFT_NODE_COLL_LARGE_KB a rank, made at the first call that needs
     * them; data, res and slot then point into it. */
    char             *lbase;
    size_t            lbytes;
    int               large_state; /* 0 not tried, 1 on, -1 off for good (as node_state) */
    struct node_ctrl *ctrl;
    char             *small;      /* small buffer b < NODE_NSMALL, rank r: small + (b * P + r) * NODE_SMALL */
    char             *data;       /* big buffer NODE_NSMALL + i: data + (i * P + r) * slot (in base, or in
                                     lbase once the large segment is on) */
    char             *res;        /* its sliced result: res + i * slot */
    size_t            slot;
    int               pulls;      /* every rank can read every other by CMA (node_setup): alltoalls above
                                     the slots pull their blocks (node_pull) */
    int               spill_told; /* the info line on an alltoall(v) that could not be pulled was written */
    int               P, me;      /* ranks of this node, this rank's local index */
    int              *ranks;      /* [P] comm rank of each local index */
    uint32_t          last[NODE_NBUF]; /* the last call (+1) this rank ran on buffer b; 0: none */
    uint32_t         *seen_done;  /* [P] the newest done this rank saw of each local rank (flag_ok) */
    void             *scratch;    /* host result of a reduction into a device buffer */
    char             *heads_buf;  /* node_hier.c: a head's alltoall packing, heads_bytes long */
    size_t            heads_bytes;
};

enum node_flag { FLAG_ARRIVE, FLAG_SLICED, FLAG_DONE };

/* One call through the segment. */
struct node_call {
    struct weft_coll     *cc;
    struct coll_node     *n;
    uint32_t              seq;     /* the call's number */
    uint32_t              tag;     /* seq + 1: what the flags hold */
    int                   b;       /* buffer */
    struct weft_p2p_check check;   /* this call's fingerprint */
    const char           *what;    /* "allreduce", ... */
    int                   failed;  /* the code, once failed */
    uint64_t              epoch;   /* p2p fault epoch last looked at */
    int                   arrived; /* this rank's arrive says this call (node_arrive) */
    int                   holding; /* waiting for readers of its send buffer (node_coll.c, pull_hold) */
};

static inline int after_eq(uint32_t a, uint32_t b) { return (int32_t)(a - b) >= 0; }

static inline char *slot_of(struct coll_node *n, int b, int r)
{
    if (b < NODE_NSMALL)
        return n->small + ((size_t)b * (size_t)n->P + (size_t)r) * NODE_SMALL;
    return n->data + ((size_t)(b - NODE_NSMALL) * (size_t)n->P + (size_t)r) * n->slot;
}

static inline int node_crank(const struct coll_node *n, int r) { return n->ranks[r]; }

/* node_coll.c: the pieces a call is made of. */
/* Publishes this rank's part of call k (its data already in its slot). */
void  node_arrive(struct node_call *k);
/* Before writing this rank's slot of buffer b: every rank is done with the
 * last call this rank ran on it. */
int   node_slot_free(struct node_call *k);
/* Waits until local rank `only`'s flag (or every other local rank's, only
 * < 0) reached want. WEFT_SUCCESS or the failure (set, peers told). */
int   node_wait(struct node_call *k, int only, enum node_flag f, uint32_t want);
/* memcpy, or a device copy when CUDA is in the comm. */
int   node_copy(struct weft_core *core, void *dst, const void *src, size_t bytes, const char *what);
/* node_copy into the segment, for the other ranks to read (shmput.h). */
int   node_put(struct weft_core *core, void *dst, const void *src, size_t bytes, const char *what);
/* The call failed here (code, text already the last error): tell the
 * peers unless the news came from them (tell 0). Returns code. */
int   node_fail(struct node_call *k, int code, int tell);
/* dst[0..count) = op over local ranks 0..P-1 of their slots' elements
 * [off, off+count), in local order; WEFT_AVG divides by P. P >= 2. own:
 * this rank's operand where it is (its slot when NULL). */
void  node_reduce_range(struct node_call *k, void *dst, const void *own, size_t off, size_t count, int dtype,
                        int op);
/* Where a reduction's result is made: user, or host scratch with CUDA. */
void *node_result_buf(struct node_call *k, void *user);
/* WEFT_NODE_COLL_KB where the segment may be used at all (shm allowed,
 * two ranks or more, not turned off at set-up), whatever the nodes; else 0. */
size_t node_limit(const struct weft_coll *cc);
/* The signature a call's messages carry (coll_sched.h). */
struct weft_coll_sig node_sig_of(const struct weft_coll_args *a);

/* node_hier.c: a comm across nodes. Bytes the call puts in a slot when it
 * goes hierarchically through the nodes' segments, 0 when it does not
 * (only the arguments and agreed settings decide). */
size_t node_hier_fits(const struct weft_coll *cc, const struct weft_coll_args *a);
/* Runs call k (its number taken, fingerprint published). */
int    node_hier_run(struct node_call *k, const struct weft_coll_args *a, size_t need);
/* The shape line's words for it ("node-local shared memory + leaders' ..."). */
const char *node_hier_algo(const struct weft_coll *cc, const struct weft_coll_args *a);

#endif
