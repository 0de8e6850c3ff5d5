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

/* The other collectives' algorithms; each enum is in the order of its
 * WEFT_*_ALGO name list (src/core/config.c), 0 = the selector decides. */
enum weft_allreduce_algo { WEFT_AR_AUTO = 0, WEFT_AR_RING, WEFT_AR_RD, WEFT_AR_RABENSEIFNER, WEFT_AR_HIER,
                           WEFT_AR_COUNT };
enum weft_reduce_scatter_algo { WEFT_RS_AUTO = 0, WEFT_RS_RING, WEFT_RS_HALVING, WEFT_RS_COUNT };
enum weft_reduce_algo { WEFT_RED_AUTO = 0, WEFT_RED_BINOMIAL, WEFT_RED_RING, WEFT_RED_COUNT };
enum weft_alltoall_algo { WEFT_A2A_AUTO = 0, WEFT_A2A_PAIRWISE, WEFT_A2A_BRUCK, WEFT_A2A_COUNT };

/* A shape already logged (coll.h: struct weft_coll). */
struct weft_coll_shape { int kind; size_t bytes; int algo; };

/* The next sequence number of cc (the lanes of a blocking or started call). */
uint32_t coll_seq_next(struct weft_coll *cc);

/* Index of s in a NULL-terminated name list ("" or NULL: 0 = auto); -1 unknown. */
int  coll_algo_parse(const char *s, const char *const *names);
/* Logs at WEFT_DEBUG=info, once per (kind, count, algorithm): "allreduce
 * 4096 elements of float32 x 4 ranks (1 node): ring (selector)". what is
 * the line's start ("allreduce 4096 elements of float32"). */
void coll_log_shape_once(struct weft_coll *cc, int kind, size_t count, int algo, const char *what,
                         const char *algo_name, int forced);

/* ---- each kind's start (one file each). a is validated; the call has
 * its lanes (tag, seq) already; size > 1 or not is the kind's business
 * (one rank: copies only, *op = NULL). Same contract as weft_coll_start. */
int coll_allgather_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                         struct weft_coll_op **op);   /* allgather_select.c */
int coll_bcast_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                     struct weft_coll_op **op);       /* bcast.c */
int coll_barrier_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                       struct weft_coll_op **op);     /* barrier.c */
int coll_allreduce_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                         struct weft_coll_op **op);   /* allreduce.c */
int coll_reduce_scatter_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag,
                              uint32_t seq, struct weft_coll_op **op);   /* reduce_scatter.c */
int coll_reduce_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                      struct weft_coll_op **op);      /* reduce.c */
int coll_alltoall_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                        struct weft_coll_op **op);    /* alltoall.c */
int coll_alltoallv_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                         struct weft_coll_op **op);   /* alltoall.c */
int coll_gather_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                      struct weft_coll_op **op);      /* gather.c */
int coll_scatter_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                       struct weft_coll_op **op);     /* gather.c */

/* ---- reductions over any memory (coll_reduce.c) ----
 * A reducing call's algorithm builds its schedule over host or device
 * buffers alike; coll_reduce_begin decides where the REDUCE steps run:
 *   host buffers:                 on the host (reduce_host.c kernels);
 *   device buffers, kernels load: on the device (reduce_device.c), scratch
 *                                 in device memory (call->scratch_dev);
 *   device buffers, no kernel:    staged: the call runs on host copies
 *                                 (pinned staging of the comm), with a
 *                                 COPY in before and a COPY out after
 *                                 (logged once at info).
 * It fills *call (sig, nranks, scratch placement, stage) and, staged,
 * replaces *sendbuf / *recvbuf by their host copies. in_bytes: bytes of
 * sendbuf the call reads; out_bytes: bytes of recvbuf it writes (0: none
 * on this rank, e.g. reduce off the root). */
struct coll_reduce_plan {
    const void *user_send;     /* the caller's buffers */
    void       *user_recv;
    size_t      in_bytes, out_bytes;
    int         staged;        /* 1: wrap the schedule with coll_reduce_build_staged */
};
int  coll_reduce_begin(struct weft_coll *cc, const struct weft_coll_args *a, size_t in_bytes, size_t out_bytes,
                       const void **sendbuf, void **recvbuf, struct weft_sched_call *call,
                       struct coll_reduce_plan *plan);
/* Starts the op: weft_sched_start with build/args, wrapped by the stage
 * copies when plan->staged. Returns the stage on failure. */
int  coll_reduce_launch(struct weft_coll *cc, struct weft_sched_call *call, const struct coll_reduce_plan *plan,
                        const void *staged_send, void *staged_recv, weft_sched_build_fn build, const void *args,
                        struct weft_coll_op **op);
/* Staging buffers (coll_stage.c): at least bytes of host memory (pinned
 * when CUDA is in the comm), reused across calls; NULL: no memory. */
struct weft_coll_stage *coll_stage_get(struct weft_coll *cc, size_t bytes);
void *coll_stage_ptr(struct weft_coll_stage *st);
void  coll_stage_put(struct weft_coll *cc, struct weft_coll_stage *st);
/* Device scratch of the reduction kernels (on the comm's device), reused
 * across calls like the staging buffers; NULL: no memory. */
struct weft_coll_stage *coll_scratch_get(struct weft_coll *cc, size_t bytes);
void  coll_scratch_put(struct weft_coll *cc, struct weft_coll_stage *st);
/* Frees both lists: only at destroy, once no stream waits on the comm. */
void  coll_stage_fini(struct weft_coll *cc);
/* Before call seq takes its lanes: a non-blocking call of the same slot
 * still in flight is driven to completion (its result kept for its
 * handle). WEFT_SUCCESS (coll_nb.c). */
int  coll_nb_slot_free(struct weft_coll *cc, uint32_t seq);
/* Frees the records given up at destroy (weft_coll_fini). */
void coll_nb_fini(struct weft_coll *cc);
/* Reduction chunk in bytes (WEFT_REDUCE_CHUNK_KB), a multiple of esize. */
size_t coll_reduce_chunk(const struct weft_coll *cc, size_t esize);

/* ---- node-local collectives in shared memory (node_coll.c) ----
 * A blocking call that fits (every rank of the comm on one node, its data
 * within WEFT_NODE_COLL_KB a rank, no algorithm forced) runs here:
 * *handled = 1 and its result returned; otherwise *handled = 0 and the call
 * goes as messages. Decided from the arguments and agreed settings alone. */
int  coll_node_run(struct weft_coll *cc, const struct weft_coll_args *a, int *handled);
/* A call started as messages (seq): its fingerprint published where ranks
 * waiting in a node-local call look (a mismatch found at once). */
void coll_node_started(struct weft_coll *cc, const struct weft_coll_args *a, uint32_t seq);
/* Call seq refused by this rank on its own arguments (weft_coll_refused). */
void coll_node_refused(struct weft_coll *cc, uint32_t seq);
/* At the comm's creation: the segment off for good where WEFT_TRANSPORTS
 * leaves out shm (agreed, fixed for the comm's life). */
void coll_node_init(struct weft_coll *cc);
void coll_node_fini(struct weft_coll *cc);

/* ---- allgather algorithms (allgather.c). Arguments are already validated:
 * bytes > 0, size > 1, sendbuf either in place (== recvbuf + rank*bytes) or
 * not overlapping recvbuf, algo applies at this size. Builds the op of algo
 * and starts it (weft_sched_start); kind goes into its fingerprint
 * (WEFT_COLL_ALLGATHER, or WEFT_COLL_SPLIT_EXCHANGE: the library's own). */
int coll_allgather_op(struct weft_coll *cc, int kind, int algo, weft_coll_tag_fn tag, uint32_t seq,
                      const void *sendbuf, void *recvbuf, size_t bytes, struct weft_coll_op **op);
/* The same with the fingerprint given whole (the node-local set-up's,
 * which names the call it came before). */
int coll_allgather_op_sig(struct weft_coll *cc, const struct weft_coll_sig *sig, int algo, weft_coll_tag_fn tag,
                          uint32_t seq, const void *sendbuf, void *recvbuf, size_t bytes, struct weft_coll_op **op);

/* Schedules over m members, member p being rank members[p] (members NULL:
 * rank p), this rank member pos: the dissemination barrier (barrier.c) and
 * the binomial bcast tree from member root (bcast.c); the comm's own calls
 * and the heads of node_hier.c build theirs with these. */
void coll_dissemination_build(struct weft_sched_build *b, const int *members, int m, int pos);
void coll_binomial_bcast_build(struct weft_sched_build *b, const int *members, int m, int pos, int root, void *buf,
                               size_t bytes);

/* Only the heads' part of hierarchical allgather (node_hier.c): this rank,
 * the lowest of its node, holds its node's blocks in place in recvbuf
 * (bytes a rank, rank order) and exchanges them with the other nodes'
 * lowest ranks by the leaders' ring; lanes of call seq. */
int coll_allgather_heads_op(struct weft_coll *cc, const struct weft_coll_sig *sig, uint32_t seq, void *recvbuf,
                            size_t bytes, struct weft_coll_op **op);

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

/* ---- allgather selector (allgather_select.c) ---- */
const char *weft_allgather_algo_name(int algo);
/* The selector's choice for this shape, with no forcing. */
int  weft_allgather_select(int size, int nnodes, size_t bytes);
/* Whether algo can run at this shape; if not, *why says so. */
int  weft_allgather_algo_applies(int algo, int size, const char **why);
/* Ring chunk (bytes per pipelined message): WEFT_ALLGATHER_CHUNK_KB. */
size_t coll_ring_chunk(const struct weft_coll *cc);

#endif
