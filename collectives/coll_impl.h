/*
 * Collectives: shared internals of the files in collectives/ (the
 * algorithms, the generic ring, the allgather selector).
 */
#ifndef WEFT_COLL_IMPL_H
#define WEFT_COLL_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include "coll.h"
#include "coll_sched.h"

enum weft_allgather_algo {
    WEFT_AG_AUTO = 0,  /* selector decides */
    WEFT_AG_RING,
    WEFT_AG_RD,        /* recursive doubling */
    WEFT_AG_BRUCK,
    WEFT_AG_DIRECT,
    WEFT_AG_HIER,
    WEFT_AG_COUNT
};

/* An allgather shape already logged (coll.h: struct weft_coll). */
struct weft_coll_shape { size_t bytes; int algo; };

/* The next sequence number of cc (the lanes of a blocking or started call). */
uint32_t coll_seq_next(struct weft_coll *cc);

/* ---- allgather algorithms (allgather.c). Arguments are already validated:
 * bytes > 0, size > 1, sendbuf either in place (== recvbuf + rank*bytes) or
 * not overlapping recvbuf, algo applies at this size. Builds the op of algo
 * and starts it (weft_sched_start). */
int coll_allgather_op(struct weft_coll *cc, int algo, weft_coll_tag_fn tag, uint32_t seq, const void *sendbuf,
                      void *recvbuf, size_t bytes, struct weft_coll_op **op);

/* Generic pipelined ring over m members, added to a schedule (allgather.c).
 * Member p is rank members[p], or (rot + p) % m when members is NULL, and
 * contributes the byte ranges segs[seg_first[p] .. seg_first[p+1]) of buf;
 * with segs NULL, one range per member: [p*block, (p+1)*block) clipped to
 * [0, total). own_src, when non-NULL, holds this member's data (it has
 * exactly one segment), which is sent from there and copied into buf
 * meanwhile. full_pos (-1: none) is a member that already holds everything
 * (bcast's root): it receives nothing and its left neighbour sends it
 * nothing. Used by the flat ring, by the leaders' ring of hier and by large
 * bcast. */
struct coll_seg { size_t off, len; };
struct coll_ring {
    const int             *members;   /* NULL: (rot + p) % m */
    int                    rot;
    int                    m, my_pos;
    const struct coll_seg *segs;      /* NULL: uniform blocks */
    const int             *seg_first;
    size_t                 block, total;
    char                  *buf;
    const void            *own_src;
    int                    full_pos;
    size_t                 chunk;
    int                    phase;
};
void coll_ring_build(struct weft_sched_build *b, const struct coll_ring *r);

/* ---- selector (allgather_select.c) ---- */
const char *weft_allgather_algo_name(int algo);
/* Parses "ring|rd|bruck|direct|hier" (or "auto"/""); -1 when unknown. */
int  weft_allgather_algo_parse(const char *s);
/* The selector's choice for this shape, with no forcing. */
int  weft_allgather_select(int size, int nnodes, size_t bytes);
/* Whether algo can run at this shape; if not, *why says so. */
int  weft_allgather_algo_applies(int algo, int size, const char **why);
/* Ring chunk (bytes per pipelined message): WEFT_ALLGATHER_CHUNK_KB. */
size_t coll_ring_chunk(const struct weft_coll *cc);

#endif
