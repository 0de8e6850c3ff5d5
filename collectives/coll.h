/*
 * Collectives: the interface of collectives/ to the layers above (comm,
 * api, stream). Included by src/comm/comm.h, so it stays light: no
 * transport or pipe header, only the context struct and the calls.
 *
 * Every collective is built on the pipe layer only (weft_p2p_isend /
 * weft_p2p_irecv and completion through p2p/p2p.h), never on a transport,
 * so it runs unchanged over self, shm, tcp and any later transport. A call
 * is a schedule of steps (collectives/coll_sched.h) run by a small engine:
 * the blocking calls are start + wait, and the stream engine (src/stream/)
 * starts the same schedules and tests them from its progress thread.
 *
 * Tags. Collective traffic uses negative tags (internal lanes, never matched
 * by a user receive, p2p/tags.h). A call takes the next value of cc->seq;
 * its tags are weft_tag_coll(seq, phase), so two consecutive collectives
 * never share a lane (a stray message of one cannot be taken by the next),
 * while the number of lanes a pipe ever creates stays bounded. Correctness
 * does not depend on the slot: collectives run in the same order on every
 * rank and each (peer, tag) lane is FIFO.
 */
#ifndef WEFT_COLL_H
#define WEFT_COLL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "weft.h"   /* weft_request_t */

struct weft_p2p;
struct weft_core;
struct weft_coll_op;
struct weft_coll_shape;
struct weft_coll_stage;
struct weft_coll_spare;
struct weft_coll_nb;
struct coll_node;

/* What a collective call is. The same on every rank that makes the call
 * (buffers aside); travels in every message of the call as its fingerprint. */
enum weft_coll_kind {
    WEFT_COLL_ALLGATHER = 1, WEFT_COLL_BCAST, WEFT_COLL_BARRIER,
    WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_REDUCE, WEFT_COLL_ALLTOALL,
    WEFT_COLL_GATHER, WEFT_COLL_SCATTER, WEFT_COLL_ALLTOALLV,
    /* The library's own operations on the comm, never a user's: an
     * allgather with a kind of its own in the fingerprint, so a user's
     * collective that meets it fails with WEFT_ERR_MISMATCH instead of
     * taking its data (weft_comm_split's exchange of colors and keys). */
    WEFT_COLL_SPLIT_EXCHANGE,
    /* The node-local collectives' setup (node_coll.c): its two exchanges. */
    WEFT_COLL_NODE_SETUP,
    WEFT_COLL_KIND_END
};

/* One call's arguments, for weft_coll_start (validated by src/api/check.c). */
struct weft_coll_prep;

/* alltoallv's per-rank layout (weft_alltoallv): size entries each, bytes
 * and byte offsets into sendbuf / recvbuf. Read only while the call
 * starts (its schedule is built from them); the stream engine starts
 * later, so it keeps a copy (weft_coll_prepare). */
struct weft_coll_vec {
    const size_t *send_bytes, *send_displs;
    const size_t *recv_bytes, *recv_displs;
};

struct weft_coll_args {
    int         kind;     /* enum weft_coll_kind */
    const void *sendbuf;  /* bcast: unused (buf is recvbuf); scatter: significant at root only */
    void       *recvbuf;  /* bcast: buf; reduce, gather: significant at root only */
    size_t      count;    /* reductions: elements (reduce_scatter: per rank); allgather, alltoall, gather,
                             scatter: bytes per rank; bcast: bytes; barrier: 0; alltoallv: the bytes this
                             rank sends (logs only: the layout is vec) */
    int         dtype;    /* reductions: weft_dtype_t */
    int         op;       /* reductions: weft_op_t */
    int         root;     /* bcast, reduce, gather, scatter; -1 otherwise */
    struct weft_coll_prep *prep; /* what weft_coll_prepare took for this call, or NULL */
    const struct weft_coll_vec *vec; /* alltoallv; NULL otherwise */
};

/* What a call will need from CUDA, taken on the caller's thread before the
 * call is queued (the stream engine), so that starting it on weft's
 * progress thread makes no call that synchronises the device while a
 * stream waits on weft (src/core/cudawrap.h, weft_cuda_may_sync): the
 * reduction kernels' module loaded, the host staging buffer or the device
 * scratch of its algorithm, the aligned scratch for misaligned operands.
 * weft_coll_start with a->prep set takes the buffers from it. */
struct weft_coll_prep {
    int                     dry;      /* inside weft_coll_prepare: size and take, start nothing */
    struct weft_coll_stage *stage;    /* host staging (device buffers reduced on the host) */
    struct weft_coll_stage *scratch;  /* device scratch of the kernel path */
    struct weft_coll_vec   *vec;      /* alltoallv: a copy of the caller's arrays (one allocation), for a
                                         call that starts after its caller returned; the caller points
                                         its args' vec at it */
};

/* The collectives' context of one comm (embedded in struct weft_comm). */
struct weft_journal;

struct weft_coll {
    struct weft_p2p        *p2p;
    struct weft_journal    *journal;   /* the last calls (journal.h); NULL for one rank */
    struct weft_journal    *sjournal;  /* the last stream-ordered collectives (their own numbers), beside it */
    struct weft_core       *core;      /* rank, size, cfg, errors */
    uint32_t                seq;       /* collectives started (tags of internal lanes) */
    int                     ag_algo;   /* WEFT_ALLGATHER_ALGO mapped to the algorithm (0: selector) */
    int                     ar_algo;   /* WEFT_ALLREDUCE_ALGO */
    int                     rs_algo;   /* WEFT_REDUCE_SCATTER_ALGO */
    int                     red_algo;  /* WEFT_REDUCE_ALGO */
    int                     a2a_algo;  /* WEFT_ALLTOALL_ALGO */

    /* Node layout of the comm, computed once at init (ranks grouped by the
     * effective node of each rank). */
    int                     nnodes;    /* distinct node values */
    int                    *node_of;   /* [size] node index 0..nnodes-1 (ordered by lowest rank) */
    int                    *node_first;/* [nnodes+1] offsets into node_ranks */
    int                    *node_ranks;/* [size] ranks of each node, ascending */

    /* Shapes (kind, size -> algorithm) already logged at WEFT_DEBUG=info,
     * so each is logged once. Kept only at info level. The lock: blocking
     * calls and the stream engine's thread both log. */
    pthread_mutex_t         shapes_lock;
    struct weft_coll_shape *shapes;
    size_t                  nshapes, cap_shapes;

    /* Host staging buffers of reductions on device memory that no kernel
     * can reduce (pinned when CUDA allows), kept for reuse (coll_stage.c). */
    pthread_mutex_t         stage_lock;
    struct weft_coll_stage *stages;
    struct weft_coll_stage *scratches;   /* device scratch of the reduction kernels, reused (stage_lock) */
    /* Freed schedule ops' memory (op, steps, host scratch), reused by the
     * next op it fits (coll_sched.c, stage_lock). */
    struct weft_coll_spare *op_spares;
    size_t                  op_spare_bytes;
    int                     op_nspares;

    /* Non-blocking collectives in flight (coll_nb.c): advanced by any
     * wait of the comm (the p2p progress hook), and call seq waits for
     * call seq - WEFT_TAG_COLL_SLOTS before it starts (their lanes). */
    pthread_mutex_t         nb_lock;
    struct weft_coll_nb    *nb_head;
    int                     nb_count;  /* atomic: ops on nb_head */
    int                     nb_hooked; /* atomic: registered with the comm's engine */
    struct weft_coll_nb    *nb_dead;   /* given up at destroy, freed by fini */

    /* Node-local collectives in shared memory (node_coll.c): the mapped
     * segment once set up, and whether it was tried (0), is on (1) or off
     * for good (-1). node_large: the most an allreduce's, a reduce's or a
     * reduce_scatter's vector or an allgather's block may be there
     * (WEFT_NODE_COLL_LARGE_KB, within the
     * shm budget; 0: WEFT_NODE_COLL_KB's limit holds for them too), set
     * once at init from agreed settings and the comm's shape. */
    struct coll_node       *node;
    int                     node_state;
    size_t                  node_large;
};

/* node[size]: the effective node of each rank (the rank card header's
 * `node`, WEFT_VIRTUAL_NODES included). Computes the node layout and maps
 * the configured algorithm. WEFT_SUCCESS or WEFT_ERR_NO_MEMORY /
 * WEFT_ERR_INVALID_ARG with the last error set. fini is idempotent (also
 * after a failed init, on a zeroed struct). */
int  weft_coll_init(struct weft_coll *cc, struct weft_p2p *p2p, struct weft_core *core, const int *node);
void weft_coll_fini(struct weft_coll *cc);

/* The most data per rank with which a call may go through the node-local
 * segment (node_coll.c; WEFT_NODE_COLL_KB): 0 when no call on this comm
 * does (ranks on more than one node, WEFT_NODE_COLL_KB=0, WEFT_TRANSPORTS
 * without shm, one rank, or the segment could not be set up). Agreed:
 * the same on every rank until the segment's set-up, and after it. */
size_t weft_coll_node_bytes(const struct weft_coll *cc);

/* A collective call this rank refused on its own arguments (src/api,
 * the comm alive): it still takes its number among the comm's collectives,
 * and every peer is told (a COLL_FAILED notice with WEFT_ERR_MISMATCH and
 * this rank's reason, the comm's last error), so their call of that number
 * fails naming this rank instead of the ranks drifting one call apart. */
void weft_coll_refused(struct weft_coll *cc, const char *fn);

/* Starts a call. tag NULL: the caller's own lanes (weft_tag_coll) and the
 * next value of cc->seq, which every call takes (also one that moves
 * nothing, so a rank passing 0 where others do not stays in step). With
 * tag (the stream engine: weft_tag_scoll), seq is the call's number on
 * those lanes; a caller of that form must not start call seq +
 * WEFT_TAG_COLL_SLOTS before call seq completed (the slot's lanes are
 * then reused). On WEFT_SUCCESS *op is the call in progress, or NULL when
 * it completed at the start (one rank, zero bytes). On an error nothing
 * was started and *op is NULL. The buffers must stay valid until the op
 * completed. A forced algorithm that cannot run on this shape is refused
 * here with WEFT_ERR_INVALID_ARG. */
typedef int (*weft_coll_tag_fn)(unsigned seq, int phase);
int  weft_coll_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                     struct weft_coll_op **op);
/* start + wait. */
int  weft_coll_run(struct weft_coll *cc, const struct weft_coll_args *a);
/* On the caller's thread: fills *prep for a (see struct weft_coll_prep)
 * by running its start without starting anything, and copies alltoallv's
 * arrays. WEFT_SUCCESS (also when a needs nothing), or the error its start
 * would give. Release what a call took with weft_coll_prep_release (a call
 * that never starts, and one that started: the copy of the arrays). */
int  weft_coll_prepare(struct weft_coll *cc, const struct weft_coll_args *a, struct weft_coll_prep *prep);
void weft_coll_prep_release(struct weft_coll *cc, struct weft_coll_prep *prep);

/* The former entry points, kept as thin forms of the two above. */
int  weft_coll_allgather(struct weft_coll *cc, const void *sendbuf, void *recvbuf, size_t bytes_per_rank);
int  weft_coll_bcast(struct weft_coll *cc, void *buf, size_t bytes, int root);
int  weft_coll_barrier(struct weft_coll *cc);
int  weft_coll_allgather_start_tagged(struct weft_coll *cc, weft_coll_tag_fn tag, uint32_t seq,
                                      const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                                      struct weft_coll_op **op);

/* Non-blocking collectives with a public request handle (coll_nb.c):
 * starts a (tag NULL form) and hands the op to the p2p layer's handles
 * (weft_p2p_user_upper), so weft_test/weft_wait/weft_waitall complete it. */
int  weft_coll_istart(struct weft_coll *cc, const struct weft_coll_args *a, weft_request_t **req);
/* weft_comm_destroy, before the pipes drain: non-blocking calls still in
 * flight are given up (weft_coll_op_abandon); their handles are failed by
 * the drain. */
void weft_coll_nb_abandon_all(struct weft_coll *cc);

/* Advances op without blocking. *done = 1 once it completed: op is freed
 * and its code returned. op NULL: done, WEFT_SUCCESS. */
int  weft_coll_op_test(struct weft_coll_op *op, int *done);
/* Blocks until op completed (each wait bounded by WEFT_TIMEOUT without
 * progress), frees it, returns its code. op NULL: WEFT_SUCCESS. */
int  weft_coll_op_wait(struct weft_coll_op *op);
/* Gives op up without waiting (the stream engine's destroy after a
 * timeout): freed at once when nothing it issued is in flight; otherwise
 * left to its pipes (their destroy reports the requests), so no transfer
 * can write into freed scratch memory. */
void weft_coll_op_abandon(struct weft_coll_op *op);

#endif
