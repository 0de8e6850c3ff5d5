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

struct weft_p2p;
struct weft_core;
struct weft_coll_op;
struct weft_coll_shape;

/* The collectives' context of one comm (embedded in struct weft_comm). */
struct weft_coll {
    struct weft_p2p        *p2p;
    struct weft_core       *core;      /* rank, size, cfg, errors */
    uint32_t                seq;       /* collectives started (tags of internal lanes) */
    int                     ag_algo;   /* WEFT_ALLGATHER_ALGO mapped to the algorithm (0: selector) */

    /* Node layout of the comm, computed once at init (ranks grouped by the
     * effective node of each rank). */
    int                     nnodes;    /* distinct node values */
    int                    *node_of;   /* [size] node index 0..nnodes-1 (ordered by lowest rank) */
    int                    *node_first;/* [nnodes+1] offsets into node_ranks */
    int                    *node_ranks;/* [size] ranks of each node, ascending */

    /* Allgather shapes (bytes per rank -> algorithm) already logged at
     * WEFT_DEBUG=info, so each is logged once. Kept only at info level.
     * The lock: blocking calls and the stream engine's thread both log. */
    pthread_mutex_t         shapes_lock;
    struct weft_coll_shape *shapes;
    size_t                  nshapes, cap_shapes;
};

/* node[size]: the effective node of each rank (the rank card header's
 * `node`, WEFT_VIRTUAL_NODES included). Computes the node layout and maps
 * the configured algorithm. WEFT_SUCCESS or WEFT_ERR_NO_MEMORY /
 * WEFT_ERR_INVALID_ARG with the last error set. fini is idempotent (also
 * after a failed init, on a zeroed struct). */
int  weft_coll_init(struct weft_coll *cc, struct weft_p2p *p2p, struct weft_core *core, const int *node);
void weft_coll_fini(struct weft_coll *cc);

/* Blocking collectives (start + wait). Arguments are validated by src/api/
 * (check.c): buffers non-NULL where bytes > 0, root in range, the allgather
 * total fits size_t and sendbuf is in place or does not overlap recvbuf.
 * A forced algorithm that cannot run on this rank count is still refused
 * here with WEFT_ERR_INVALID_ARG. */
int  weft_coll_allgather(struct weft_coll *cc, const void *sendbuf, void *recvbuf, size_t bytes_per_rank);
int  weft_coll_bcast(struct weft_coll *cc, void *buf, size_t bytes, int root);
int  weft_coll_barrier(struct weft_coll *cc);

/* Non-blocking forms: on WEFT_SUCCESS *op is the call in progress, or NULL
 * when it completed at the start (one rank, zero bytes: nothing to wait
 * for). On an error nothing was started and *op is NULL. The buffers must
 * stay valid until the op completed. */
int  weft_coll_allgather_start(struct weft_coll *cc, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                               struct weft_coll_op **op);
int  weft_coll_bcast_start(struct weft_coll *cc, void *buf, size_t bytes, int root, struct weft_coll_op **op);
int  weft_coll_barrier_start(struct weft_coll *cc, struct weft_coll_op **op);

/* The tags of a call: tag(seq, phase), phase in [0, WEFT_TAG_COLL_PHASES).
 * The calls above take cc->seq and weft_tag_coll (p2p/tags.h). The stream
 * engine runs its allgathers on lanes of its own (weft_tag_scoll) numbered
 * by its own counter, in the order they were called: they start later, on
 * its thread, and must never take a sequence number between two blocking
 * collectives of the caller. A caller of this form must not start call
 * seq + WEFT_TAG_COLL_SLOTS before call seq completed (the slot's lanes are
 * then reused; ops of one slot would interleave on them). */
typedef int (*weft_coll_tag_fn)(unsigned seq, int phase);
int  weft_coll_allgather_start_tagged(struct weft_coll *cc, weft_coll_tag_fn tag, uint32_t seq,
                                      const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                                      struct weft_coll_op **op);

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
