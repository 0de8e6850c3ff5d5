/*
 * Collectives: shared internals of the files in collectives/.
 *
 * Every collective is built on the pipe layer only (weft_isend_internal /
 * weft_irecv_internal + weft_wait / weft_waitall), never on a transport, so
 * it runs unchanged over self, shm, tcp and any later transport.
 *
 * Tags. Collective traffic uses negative tags (internal lanes, never matched
 * by a user receive). A call takes the next value of c->coll_seq; its tags are
 *     -(WEFT_COLL_TAG_BASE + (seq % WEFT_COLL_TAG_SLOTS) * WEFT_COLL_PHASES + phase)
 * so two consecutive collectives never share a lane (a stray message of one
 * cannot be taken by the next), while the number of lanes a pipe ever creates
 * stays bounded. Correctness does not depend on the slot: collectives run in
 * the same order on every rank and each (peer, tag) lane is FIFO.
 */
#ifndef WEFT_COLL_H
#define WEFT_COLL_H

#include <stddef.h>
#include <stdint.h>
#include "weft.h"

struct weft_comm;

#define WEFT_COLL_TAG_BASE  0x10000
#define WEFT_COLL_TAG_SLOTS 16
#define WEFT_COLL_PHASES    16

enum weft_allgather_algo {
    WEFT_AG_AUTO = 0,  /* selector decides */
    WEFT_AG_RING,
    WEFT_AG_RD,        /* recursive doubling */
    WEFT_AG_BRUCK,
    WEFT_AG_DIRECT,
    WEFT_AG_HIER,
    WEFT_AG_COUNT
};

/* One collective call in progress: who we are, what we run, our tags. */
struct coll_op {
    struct weft_comm *c;
    const char       *what;    /* "allgather ring", "bcast binomial", ... */
    uint32_t          seq;     /* value of c->coll_seq taken by this call */
};

/* Starts a call: takes the next sequence number. */
void coll_op_begin(struct coll_op *op, struct weft_comm *c, const char *what);

/* Tag of `phase` (0 .. WEFT_COLL_PHASES-1) within this call. */
int  coll_tag(const struct coll_op *op, int phase);

/* p2p steps. On failure each records "<what> step <step>: <verb> <bytes> B
 * peer <peer> failed: <p2p error>" as the comm's last error and returns the
 * p2p code. */
int  coll_isend(const struct coll_op *op, int step, const void *buf, size_t bytes,
                int peer, int phase, weft_request_t **req);
int  coll_irecv(const struct coll_op *op, int step, void *buf, size_t bytes,
                int peer, int phase, weft_request_t **req);
/* Waits for one request (freed); peer/step only for the message. */
int  coll_wait(const struct coll_op *op, int step, weft_request_t *req, int peer, const char *verb);

/* A growing list of requests waited for together. */
#define COLL_REQS_INLINE 8
struct coll_reqs {
    weft_request_t **r;
    int             *peer;     /* per request, for error messages */
    size_t           n, cap;
    /* Small lists (barrier, rd, Bruck, bcast tree) need no malloc. */
    weft_request_t  *inl_r[COLL_REQS_INLINE];
    int              inl_peer[COLL_REQS_INLINE];
};
int  coll_reqs_init(const struct coll_op *op, struct coll_reqs *q, size_t cap);
/* Adds a request (capacity must suffice: callers size it exactly). */
void coll_reqs_add(struct coll_reqs *q, weft_request_t *r, int peer);
/* Waits for every request in q and empties it; the first failure becomes the
 * last error ("<what> step <step>: ... peer P ...") and is returned. */
int  coll_reqs_waitall(const struct coll_op *op, int step, struct coll_reqs *q);
/* Error path: waits for whatever is still in q, ignoring results, so no
 * request outlives the call. */
void coll_reqs_drain(struct coll_reqs *q);
void coll_reqs_fini(struct coll_reqs *q);

/* Per-comm memory of the collectives (c->coll_state). */
struct coll_state;
struct coll_state *coll_state_get(struct weft_comm *c);

/* Node layout of the comm, computed once (ranks grouped by cards[r].node). */
struct coll_topo {
    int  nnodes;        /* distinct node values */
    int *node_of;       /* [size] node index 0..nnodes-1 (ordered by lowest rank) */
    int *node_first;    /* [nnodes+1] offsets into node_ranks */
    int *node_ranks;    /* [size] ranks of each node, ascending */
};
const struct coll_topo *coll_topo_get(struct weft_comm *c);

/* ---- allgather algorithms (allgather.c). Arguments are already validated:
 * bytes > 0, size > 1, sendbuf either in place (== recvbuf + rank*bytes) or
 * not overlapping recvbuf. */
int weft_allgather_ring(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes);
int weft_allgather_rd(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes);
int weft_allgather_bruck(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes);
int weft_allgather_direct(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes);
int weft_allgather_hier(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes);

/* Generic pipelined ring over m members (ranks members[0..m)) where member p
 * contributes the byte ranges segs[seg_first[p] .. seg_first[p+1]) of buf.
 * own_src, when non-NULL, holds this member's data (it has exactly one
 * segment), which is sent from there and copied into buf meanwhile.
 * full_pos (-1: none) is a member that already holds everything (bcast's
 * root): it receives nothing and its left neighbour sends it nothing.
 * Used by the flat ring, by the leaders' ring of hier and by large bcast. */
struct coll_seg { size_t off, len; };
int coll_ring(const struct coll_op *op, int phase, const int *members, int m, int my_pos,
              const struct coll_seg *segs, const int *seg_first, char *buf,
              const void *own_src, int full_pos, size_t chunk);

/* ---- selector (allgather_select.c) ---- */
const char *weft_allgather_algo_name(int algo);
/* Parses "ring|rd|bruck|direct|hier" (or "auto"/""); -1 when unknown. */
int  weft_allgather_algo_parse(const char *s);
/* The selector's choice for this shape, with no forcing. */
int  weft_allgather_select(int size, int nnodes, size_t bytes);
/* Whether algo can run at this shape; if not, *why says so. */
int  weft_allgather_algo_applies(int algo, int size, const char **why);
/* Ring chunk (bytes per pipelined message). */
size_t coll_ring_chunk(void);

#endif
