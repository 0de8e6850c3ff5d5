/*
 * The stream-ordered engine behind weft_send_on_stream, weft_recv_on_stream,
 * weft_allgather_on_stream, weft_group_start/weft_group_end (src/api/stream.c
 * checks the arguments and calls weft_stream_*).
 *
 * How an operation is ordered on a CUDA stream without blocking the host:
 *
 *   at the call (or at the outermost weft_group_end for grouped calls):
 *     cudaEventRecord(ev, stream)          "the work queued so far is done"
 *     cuStreamWaitValue32(stream, counter, seq, GEQ)
 *                                          later work waits for this op
 *   on the comm's progress thread:
 *     cudaEventQuery(ev) == done  ->  weft_p2p_isend / weft_p2p_irecv
 *     (allgather: the collectives' schedule, weft_coll_allgather_start_tagged,
 *     on the stream engine's own internal lanes)
 *     -> weft_p2p_test / weft_coll_op_test until complete -> counter =
 *     highest seq such that every op up to it on that stream is done
 *     (release store)
 *
 * Counters: one 32-bit word per (comm, stream) in mapped pinned host memory
 * (cudaHostAlloc Mapped|Portable + cudaHostGetDevicePointer), written only
 * by the progress thread, increasing forever (never reset), so a wait
 * queued at any time can never miss its value; GEQ compares with
 * wrap-around. The pinned chunks of a destroyed comm go to a process-wide
 * pool, not to cudaFreeHost (which would synchronise the device inside
 * weft_comm_destroy); a reused word continues from the value it holds. A failed operation still advances its counter (the stream
 * must not hang); its error is kept and returned by the next
 * stream-ordered call on the comm.
 *
 * Order. Operations of one comm are started in the order they were called
 * (batches in a FIFO; a group is one batch), so lanes match as they do for
 * weft_isend and stream allgathers of every rank meet in the same order on
 * their lanes. A batch waits for all of its events; since an event can only
 * follow work that was queued before it, the head of the FIFO never waits
 * for a later call, and issuing in call order cannot deadlock.
 *
 * Stream allgathers. Each takes the next number of the engine's own
 * counter at the call (call order, the same on every rank) and runs on the
 * lanes weft_tag_scoll(number, phase), never on the blocking collectives'
 * lanes: it starts whenever its events complete, so it must not take a
 * number between two blocking collectives of the caller. Its steps are
 * issued over time (a ring forwards chunk k once it is in), so two of them
 * on one slot's lanes could interleave differently on two ranks: the one
 * numbered k + WEFT_TAG_COLL_SLOTS starts only after the one numbered k
 * completed on this rank (later batches wait behind it, keeping call order).
 *
 * Locks. S->mu guards the stream state (FIFO, stream table, counters,
 * event pool, pending error). The progress thread never holds it while it
 * calls into weft: weft_p2p_isend/irecv/test and the collectives' ops take
 * the pipe layer's lock as for any caller. Callers hold S->mu across seq
 * assignment and the two CUDA enqueues, so a stream's waits appear in seq
 * order.
 */
#include "stream.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "coll_sched.h"
#include "journal.h"
#include "core.h"
#include "cudawrap.h"
#include "list.h"
#include "log.h"
#include "p2p.h"
#include "signals.h"
#include "tags.h"
#include "weft.h"
#include "deadline.h"
#include "engine.h"

/* ---- groups: nesting depth per host thread ---- */

static _Thread_local int g_depth;

int weft_stream_group_start(void)
{
    g_depth++;
    return WEFT_SUCCESS;
}

#ifdef WEFT_HAVE_CUDA_HEADERS

/* ---- recorded calls; the calls of an open group (per host thread) ---- */

/* SOP_COLL: any collective (struct weft_coll_args, collectives/coll.h). */
enum sop_kind { SOP_SEND = 1, SOP_RECV, SOP_COLL };

/* A call recorded in a group, or the one call of an ungrouped submit. */
struct gop {
    struct weft_stream *s;
    int                 kind;
    const void         *sbuf;
    void               *rbuf;
    size_t              bytes;
    int                 peer, tag;
    struct CUstream_st *stream;
    int                 device;   /* the stream's device */
    struct weft_coll_args coll;   /* SOP_COLL */
    struct weft_coll_prep prep;   /* SOP_COLL: weft_coll_prepare's, on the caller's thread */
};

static _Thread_local struct gop *g_ops;
static _Thread_local size_t      g_n, g_cap;

static const char *coll_fn(int ckind)
{
    switch (ckind) {
    case WEFT_COLL_ALLGATHER: return "weft_allgather_on_stream";
    case WEFT_COLL_ALLREDUCE: return "weft_allreduce_on_stream";
    case WEFT_COLL_REDUCE_SCATTER: return "weft_reduce_scatter_on_stream";
    case WEFT_COLL_BCAST: return "weft_bcast_on_stream";
    case WEFT_COLL_ALLTOALL: return "weft_alltoall_on_stream";
    case WEFT_COLL_GATHER: return "weft_gather_on_stream";
    case WEFT_COLL_SCATTER: return "weft_scatter_on_stream";
    case WEFT_COLL_ALLTOALLV: return "weft_alltoallv_on_stream";
    default: return "a stream-ordered collective";
    }
}

static const char *kind_name(int kind, int ckind)
{
    return kind == SOP_SEND ? "weft_send_on_stream" : kind == SOP_RECV ? "weft_recv_on_stream" : coll_fn(ckind);
}

#define COUNTERS_PER_CHUNK  1024        /* 4 KiB of counters per pinned chunk */

struct sstream;

/* One stream-ordered operation. Lives from submit until its stream's
 * counter passed it (then freed by the progress thread). */
struct sop {
    int                  kind;
    const void          *sbuf;
    void                *rbuf;
    size_t               bytes;
    int                  peer, tag;
    int                  device;
    struct sstream      *ss;
    uint32_t             seq;
    uint32_t             ag_seq;      /* collective: its number among the comm's stream collectives */
    struct weft_coll_args coll;       /* collective: the call */
    struct weft_coll_prep prep;       /* collective: what its start takes (weft_coll_prepare) */
    /* receive: a device signal slot its stream waits on instead of the
     * counter (src/core/signals.h): the sender's GPU writes it after a
     * CUDA IPC copy, weft's stream otherwise */
    int                  sig;
    uint32_t             sig_slot, sig_value;
    uintptr_t            sig_addr;
    /* issued (progress thread only) */
    struct weft_request *req;         /* send, receive: in flight */
    struct weft_coll_op *cop;         /* allgather: in flight (NULL: nothing to wait for) */
    double               t_issue;
    int                  done;
    int                  err;
    int                  reported;    /* err already recorded as the async error */
    struct weft_qnode    fifo;        /* the stream's FIFO (S->mu) */
    struct weft_list     act;         /* the thread's active / finished list */
};

struct sevent {
    cudaEvent_t ev;
    int         device;
};

/* Operations started together: one call, or one group (for one comm). */
struct sbatch {
    struct weft_qnode qn;       /* S->queue, then the thread's ready queue */
    struct sop      **ops;
    size_t            nops;
    size_t            nstarted; /* ops[0..nstarted) issued (the thread) */
    struct sevent    *evs;      /* one per distinct stream */
    size_t            nevs;
};

struct sstream {
    struct weft_qnode   qn;         /* S->streams */
    struct CUstream_st *stream;
    uint32_t           *host;       /* counter, mapped pinned memory */
    CUdeviceptr         dev;        /* its device address */
    uint32_t            next_seq;   /* last seq handed out */
    struct weft_queue   fifo;       /* ops not yet published, seq order */
};

struct schunk {
    struct weft_list node;      /* S->chunks (current first), or the pool */
    uint32_t        *host;
    CUdeviceptr      dev;
    unsigned         used;
};

/* Chunks of destroyed comms, reused by later ones instead of being freed:
 * cudaFreeHost would synchronise the device inside weft_comm_destroy, and a
 * counter word keeps its value, so a reused slot continues from it (never
 * goes back, whatever stream wait may still look at it). */
static pthread_mutex_t  chunk_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct weft_list chunk_pool = { &chunk_pool, &chunk_pool };

struct weft_stream {
    struct weft_core   *core;
    struct weft_p2p    *p2p;
    struct weft_coll   *cc;
    pthread_mutex_t     mu;
    pthread_cond_t      idle_cv;     /* quiesce: an op completed */
    int                 registered;  /* a client of the comm's engine (the first submission) */
    int                 abandon;     /* quiesce timed out: drop everything */
    double              last_event;  /* the pass's last event (the WEFT_WAIT_STREAM clock) */
    /* The pass's own (stream_poll, one thread: the comm's progress thread) */
    struct weft_list    active;      /* ops started, not complete (sop.act) */
    struct weft_queue   ready;       /* batches whose events completed, not all started */
    struct sop         *ag_slot[WEFT_TAG_COLL_SLOTS];   /* stream allgather in flight per lane slot */
    int                 cur_dev;
    struct weft_queue   queue;       /* batches not yet started, call order */
    size_t              outstanding; /* submitted, counter not yet past them */
    uint64_t            completed;   /* published so far */
    uint32_t            ag_seq;      /* stream allgathers submitted (their lanes) */
    struct weft_queue   streams;
    struct weft_list    chunks;
    struct sevent      *evpool;
    size_t              nevpool, evpool_cap;
    int                 async_err;   /* first unreported asynchronous failure */
    char                async_msg[700];
};

static int cuda_to_weft(cudaError_t e)
{
    switch (e) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevice:
        return WEFT_ERR_INVALID_ARG;
    case cudaErrorMemoryAllocation:
        return WEFT_ERR_NO_MEMORY;
    default:
        return WEFT_ERR_TRANSPORT;
    }
}

static int chunk_new(struct weft_stream *S, struct schunk **out);

int weft_stream_create(struct weft_core *core, struct weft_p2p *p2p, struct weft_coll *cc,
                       struct weft_stream **out)
{
    struct weft_stream *S = calloc(1, sizeof(*S));
    pthread_condattr_t ca;

    *out = NULL;
    if (S == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for the stream state");
    S->core = core;
    S->p2p = p2p;
    S->cc = cc;
    pthread_mutex_init(&S->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&S->idle_cv, &ca);
    pthread_condattr_destroy(&ca);
    weft_list_init(&S->active);
    weft_queue_init(&S->ready);
    S->cur_dev = -1;
    weft_queue_init(&S->queue);
    weft_queue_init(&S->streams);
    weft_list_init(&S->chunks);
    /* The first chunk of counters now, on the creating thread: allocating
     * pinned memory waits for the device, which a first stream-ordered call
     * must not (its stream may be busy: the call would block the host). */
    if (core->cuda && weft_cuda_get() != NULL) {
        struct schunk *ch;
        int rc = chunk_new(S, &ch);
        if (rc == WEFT_SUCCESS)
            weft_list_add_head(&S->chunks, &ch->node);
        if (rc != WEFT_SUCCESS) {
            pthread_cond_destroy(&S->idle_cv);
            pthread_mutex_destroy(&S->mu);
            free(S);
            return rc;
        }
    }
    *out = S;
    return WEFT_SUCCESS;
}

static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, long usec)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (usec % 1000000) * 1000;
    ts.tv_sec += usec / 1000000 + ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* The comm's last error (what a failed p2p call or collective recorded),
 * without its rank: the message it goes into names the rank. */
static void last_error_copy(struct weft_core *core, char *buf, size_t len)
{
    struct weft_error e;
    weft_error_get(core, &e);
    weft_error_format(&e, 0, buf, len);
}

/* Records the first unreported asynchronous failure (S->mu held). */
static void record_async_error(struct weft_stream *S, const struct sop *op, int err, const char *why)
{
    char msg[sizeof(S->async_msg)];
    const char *w = why;
    if (op->kind == SOP_COLL)
        snprintf(msg, sizeof(msg), "%s (count %zu, stream %p, op #%u) failed asynchronously: %s",
                 kind_name(op->kind, op->coll.kind), op->coll.count, (void *)op->ss->stream, op->seq, w);
    else
        snprintf(msg, sizeof(msg), "%s (%s peer %d, tag %d, %zu bytes, stream %p, op #%u) failed asynchronously: %s",
                 kind_name(op->kind, 0), op->kind == SOP_SEND ? "to" : "from", op->peer, op->tag, op->bytes,
                 (void *)op->ss->stream, op->seq, w);
    weft_set_error(S->core, err, "%s", msg);
    if (S->async_err == WEFT_SUCCESS) {
        S->async_err = err;
        snprintf(S->async_msg, sizeof(S->async_msg), "%s", msg);
    }
}

/* Takes the pending asynchronous error (S->mu held). */
static int take_error_locked(struct weft_stream *S, const char *fn)
{
    int err = S->async_err;
    if (err == WEFT_SUCCESS)
        return WEFT_SUCCESS;
    S->async_err = WEFT_SUCCESS;
    return weft_set_error(S->core, err, "%s: an earlier stream-ordered operation failed, nothing started: %s", fn,
                          S->async_msg);
}

int weft_stream_take_error(struct weft_stream *S)
{
    int err;
    if (S == NULL)
        return WEFT_SUCCESS;
    pthread_mutex_lock(&S->mu);
    err = take_error_locked(S, "weft");
    pthread_mutex_unlock(&S->mu);
    return err;
}

int weft_stream_peek_error(struct weft_stream *S)
{
    int err;
    if (S == NULL)
        return WEFT_SUCCESS;
    pthread_mutex_lock(&S->mu);
    err = S->async_err;
    pthread_mutex_unlock(&S->mu);
    return err;
}

/* ---- counters, streams, events (S->mu held) ---- */

/* A new chunk of counters (not yet on S->chunks): from the pool of
 * destroyed comms, else cudaHostAlloc -- which synchronises the device, so
 * it is never called with S->mu held nor on weft's thread: the first chunk
 * is made at weft_comm_create, later ones by the caller of a
 * stream-ordered call before it takes the lock (counters_ensure). */
static int chunk_new(struct weft_stream *S, struct schunk **out)
{
    const struct weft_cuda *cu = weft_cuda_get();
    struct weft_list *n;
    struct schunk *ch;
    pthread_mutex_lock(&chunk_pool_lock);
    n = weft_list_pop(&chunk_pool);
    pthread_mutex_unlock(&chunk_pool_lock);
    if (n) {
        ch = weft_container_of(n, struct schunk, node);
        ch->used = 0;
        *out = ch;
        return WEFT_SUCCESS;
    }
    void *h = NULL, *d = NULL;
    cudaError_t e;
    ch = calloc(1, sizeof(*ch));
    if (ch == NULL)
        return weft_set_error(S->core, WEFT_ERR_NO_MEMORY, "stream-ordered call: no memory for counters");
    e = cu->HostAlloc(&h, COUNTERS_PER_CHUNK * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable);
    if (e == cudaSuccess) {
        memset(h, 0, COUNTERS_PER_CHUNK * sizeof(uint32_t));
        e = cu->HostGetDevicePointer(&d, h, 0);
        if (e != cudaSuccess)
            cu->FreeHost(h);
    }
    if (e != cudaSuccess) {
        cu->GetLastError();
        free(ch);
        return weft_set_error(S->core, cuda_to_weft(e), "stream-ordered call: mapped pinned memory for stream counters: %s",
                              cu->GetErrorString(e));
    }
    ch->host = h;
    ch->dev = (CUdeviceptr)(uintptr_t)d;
    *out = ch;
    return WEFT_SUCCESS;
}

/* Counters left in the current chunk (S->mu held). */
static unsigned counters_free(struct weft_stream *S)
{
    struct weft_list *first = weft_list_first(&S->chunks);
    struct schunk *ch = first ? weft_container_of(first, struct schunk, node) : NULL;
    return ch ? COUNTERS_PER_CHUNK - ch->used : 0;
}

static int stream_known(struct weft_stream *S, struct CUstream_st *stream)
{
    weft_queue_for_each(n, &S->streams)
        if (weft_container_of(n, struct sstream, qn)->stream == stream)
            return 1;
    return 0;
}

/* Before submit takes S->mu: room for a counter per stream of ops that is
 * new to S (chunk_new says why not under the lock). */
static int counters_ensure(struct weft_stream *S, const struct gop *ops, size_t n)
{
    for (;;) {
        unsigned need = 0;
        pthread_mutex_lock(&S->mu);
        for (size_t i = 0; i < n; i++) {
            int dup = 0;
            if (ops[i].s != S || stream_known(S, ops[i].stream))
                continue;
            for (size_t j = 0; j < i && !dup; j++)
                dup = ops[j].s == S && ops[j].stream == ops[i].stream;
            need += !dup;
        }
        int enough = need <= counters_free(S);
        pthread_mutex_unlock(&S->mu);
        if (enough)
            return WEFT_SUCCESS;
        struct schunk *ch;
        int rc = chunk_new(S, &ch);
        if (rc != WEFT_SUCCESS)
            return rc;
        pthread_mutex_lock(&S->mu);
        weft_list_add_head(&S->chunks, &ch->node);   /* the old one's rest goes unused */
        pthread_mutex_unlock(&S->mu);
    }
}

/* A counter for a new stream (S->mu held; counters_ensure made room). */
static int counter_alloc(struct weft_stream *S, uint32_t **host, CUdeviceptr *dev, uint32_t *value)
{
    struct weft_list *first = weft_list_first(&S->chunks);
    struct schunk *ch = first ? weft_container_of(first, struct schunk, node) : NULL;
    if (ch == NULL || ch->used == COUNTERS_PER_CHUNK)
        return weft_set_error(S->core, WEFT_ERR_NO_MEMORY, "stream-ordered call: no stream counter left (another "
                              "thread took the last ones); call again");
    *host = ch->host + ch->used;
    *dev = ch->dev + ch->used * sizeof(uint32_t);
    *value = __atomic_load_n(*host, __ATOMIC_ACQUIRE);
    ch->used++;
    return WEFT_SUCCESS;
}

static int stream_get(struct weft_stream *S, struct CUstream_st *stream, struct sstream **out)
{
    struct sstream *ss;
    int rc;
    weft_queue_for_each(n, &S->streams) {
        ss = weft_container_of(n, struct sstream, qn);
        if (ss->stream == stream) {
            *out = ss;
            return WEFT_SUCCESS;
        }
    }
    ss = calloc(1, sizeof(*ss));
    if (ss == NULL)
        return weft_set_error(S->core, WEFT_ERR_NO_MEMORY, "stream-ordered call: no memory for a stream entry");
    rc = counter_alloc(S, &ss->host, &ss->dev, &ss->next_seq);
    if (rc != WEFT_SUCCESS) {
        free(ss);
        return rc;
    }
    ss->stream = stream;
    weft_queue_init(&ss->fifo);
    weft_queue_push(&S->streams, &ss->qn);
    *out = ss;
    return WEFT_SUCCESS;
}

static int event_get(struct weft_stream *S, int device, struct sevent *out)
{
    const struct weft_cuda *cu = weft_cuda_get();
    int cur = -1;
    cudaError_t e;

    for (size_t i = S->nevpool; i-- > 0;)
        if (S->evpool[i].device == device) {
            *out = S->evpool[i];
            S->evpool[i] = S->evpool[--S->nevpool];
            return WEFT_SUCCESS;
        }
    cu->GetDevice(&cur);
    if (cur != device)
        cu->SetDevice(device);
    e = cu->EventCreateWithFlags(&out->ev, cudaEventDisableTiming);
    if (cur != device && cur >= 0)
        cu->SetDevice(cur);
    if (e != cudaSuccess)
        return weft_set_error(S->core, cuda_to_weft(e), "stream-ordered call: cudaEventCreateWithFlags: %s",
                              cu->GetErrorString(e));
    out->device = device;
    return WEFT_SUCCESS;
}

static void event_put(struct weft_stream *S, const struct sevent *ev)
{
    if (S->nevpool == S->evpool_cap) {
        size_t cap = S->evpool_cap ? 2 * S->evpool_cap : 16;
        struct sevent *p = realloc(S->evpool, cap * sizeof(*p));
        if (p == NULL) {
            weft_cuda_get()->EventDestroy(ev->ev);
            return;
        }
        S->evpool = p;
        S->evpool_cap = cap;
    }
    S->evpool[S->nevpool++] = *ev;
}

/* ---- the progress thread ---- */

/* abandon: quiesce gave up and the pipes still exist, so an allgather
 * still in flight is handed to weft_coll_op_abandon (it keeps what a
 * transfer may still write into); otherwise the pipes may be gone and it
 * is left alone. A send or receive in flight stays with its pipe either
 * way (destroy reports it). */
static void op_free(struct weft_stream *S, struct sop *op, int abandon)
{
    if (op->cop && abandon)
        weft_coll_op_abandon(op->cop);
    weft_coll_prep_release(S->cc, &op->prep);   /* never started: what it took goes back */
    if (op->sig) {
        /* Never completed: the word is written so its stream does not
         * hang, and the slot is not handed out again (a late write of a
         * transfer still in flight could land after a reuse). */
        weft_signals_abandon(S->core, op->sig_slot, op->sig_value);
        op->sig = 0;
    }
    free(op);
}

/* Starts op through the p2p layer or the collectives (no lock held). */
static void op_issue(struct weft_stream *S, struct sop *op)
{
    int rc;

    op->t_issue = weft_now();
    switch (op->kind) {
    case SOP_SEND:
        rc = weft_p2p_isend(S->p2p, op->sbuf, op->bytes, op->peer, op->tag, &op->req, "weft_isend");
        break;
    case SOP_RECV:
        rc = weft_p2p_irecv_signal(S->p2p, op->rbuf, op->bytes, op->peer, op->tag, op->sig ? op->sig_slot : 0,
                                   op->sig ? op->sig_value : 0, &op->req, "weft_irecv");
        break;
    default:
        /* The collectives' schedules (selectors, WEFT_*_ALGO) on the
         * engine's own lanes, numbered in call order (see the top), with
         * what weft_coll_prepare took on the caller's thread. */
        op->coll.prep = &op->prep;
        rc = weft_coll_start(S->cc, &op->coll, weft_tag_scoll, op->ag_seq, &op->cop);
        break;
    }
    if (rc != WEFT_SUCCESS) {
        op->req = NULL;
        op->cop = NULL;
    }
    op->err = rc;
}

/* Advances op; 1 when it is complete. block: it has been stuck past
 * WEFT_TIMEOUT, wait for it (the pipe layer breaks the pipes of what still
 * does not move and completes it with an error). No lock held. */
static int op_progress(struct weft_stream *S, struct sop *op, int block)
{
    int rc = WEFT_SUCCESS, done = 1, signaled = 0;

    if (op->req) {
        weft_status_t st;
        if (block)
            (void)weft_p2p_wait_done(op->req, kind_name(op->kind, 0));
        rc = weft_p2p_test_signal(op->req, &done, &st, &signaled);
        if (done)
            op->req = NULL;
        else   /* polling is waiting too: the request's own clock (WEFT_TIMEOUT, the health checks) */
            weft_p2p_watch(op->req, kind_name(op->kind, op->coll.kind));
    } else if (op->cop) {
        if (block) {
            rc = weft_coll_op_wait(op->cop);
        } else {
            rc = weft_coll_op_test(op->cop, &done);
            struct weft_request *oldest = done ? NULL : weft_sched_oldest(op->cop);
            if (oldest)   /* as for weft_test of a non-blocking collective (coll_nb.c) */
                weft_p2p_watch(oldest, kind_name(op->kind, op->coll.kind));
        }
        if (done)
            op->cop = NULL;
    }
    if (!done)
        return 0;
    if (rc != WEFT_SUCCESS && op->err == WEFT_SUCCESS)
        op->err = rc;
    if (op->kind == SOP_COLL && S->cc->sjournal) {
        weft_journal_end(S->cc->sjournal, op->ag_seq, op->err);
        if (op->err != WEFT_SUCCESS && !op->reported && S->core->cfg.trace_dir[0])
            (void)weft_journal_write(S->cc, "error", 0);   /* the failing rank writes first */
    }
    /* The error is on record before the stream may go on (the slot below,
     * or the counter in publish): whoever synchronises the stream and then
     * asks (weft_comm_async_error) sees it. */
    if (op->err != WEFT_SUCCESS && !op->reported) {
        char why[1024];
        last_error_copy(S->core, why, sizeof(why));
        op->reported = 1;
        pthread_mutex_lock(&S->mu);
        record_async_error(S, op, op->err, why);
        pthread_mutex_unlock(&S->mu);
    }
    if (op->sig) {
        /* Its stream waits on the slot: the sender's GPU wrote it (CUDA
         * IPC, the data is in), or weft's stream writes it now. */
        int src = weft_signals_complete(S->core, op->sig_slot, op->sig_value, signaled && op->err == WEFT_SUCCESS);
        op->sig = 0;
        if (src != WEFT_SUCCESS && !op->reported) {
            char why[1024];
            last_error_copy(S->core, why, sizeof(why));
            op->reported = 1;
            op->err = src;
            pthread_mutex_lock(&S->mu);
            record_async_error(S, op, op->err, why);
            pthread_mutex_unlock(&S->mu);
        }
    }
    return 1;
}

/* Advances ss's counter past its leading completed ops (S->mu held). */
static int publish(struct weft_stream *S, struct sstream *ss)
{
    uint32_t seq = 0;
    int n = 0;
    for (;;) {
        struct weft_qnode *h = weft_queue_head(&ss->fifo);
        struct sop *op = h ? weft_container_of(h, struct sop, fifo) : NULL;
        if (op == NULL || !op->done)
            break;
        weft_queue_pop(&ss->fifo);
        seq = op->seq;
        op_free(S, op, 0);
        n++;
    }
    if (n) {
        __atomic_store_n(ss->host, seq, __ATOMIC_RELEASE);
        S->outstanding -= (size_t)n;
        S->completed += (uint64_t)n;
        weft_cuda_stream_waits_add(-(long)n);
    }
    return n;
}

/* 1: every event of b has completed; -1: one failed (S->mu held). */
static int batch_ready(const struct sbatch *b, cudaError_t *err)
{
    const struct weft_cuda *cu = weft_cuda_get();
    for (size_t i = 0; i < b->nevs; i++) {
        cudaError_t e = cu->EventQuery(b->evs[i].ev);
        if (e == cudaErrorNotReady)
            return 0;
        if (e != cudaSuccess) {
            *err = e;
            return -1;
        }
    }
    return 1;
}

static void batch_free(struct weft_stream *S, struct sbatch *b, int return_events)
{
    if (return_events)
        for (size_t i = 0; i < b->nevs; i++)
            event_put(S, &b->evs[i]);
    free(b->evs);
    free(b->ops);
    free(b);
}

/* quiesce gave up (abandon: the pipes still work), or destroy frees what
 * is left: release every stream, drop every op (S->mu held). The requests
 * already started stay with their pipes (destroy reports them). */
static void abandon_all(struct weft_stream *S, int abandon)
{
    struct weft_qnode *n;
    while ((n = weft_queue_pop(&S->queue)) != NULL)
        batch_free(S, weft_container_of(n, struct sbatch, qn), 1);
    weft_queue_for_each(sn, &S->streams) {
        struct sstream *ss = weft_container_of(sn, struct sstream, qn);
        while ((n = weft_queue_pop(&ss->fifo)) != NULL)
            op_free(S, weft_container_of(n, struct sop, fifo), abandon);
        __atomic_store_n(ss->host, ss->next_seq, __ATOMIC_RELEASE);
    }
    weft_cuda_stream_waits_add(-(long)S->outstanding);
    S->outstanding = 0;
}

/* One pass of the engine, as a client of the comm's progress engine
 * (p2p/engine.h; WEFT_CLIENT_NEEDS_THREAD: no application thread waits for
 * these operations, so the comm's progress thread runs it, started at the
 * first stream-ordered call). The pipes' own progress and the peers'
 * health are the engine's pass after this one. */
static int stream_poll(void *arg)
{
    struct weft_stream *S = arg;
    const struct weft_cuda *cu = weft_cuda_get();
    int events = 0;

    pthread_mutex_lock(&S->mu);
    if (S->abandon) {
        pthread_mutex_unlock(&S->mu);
        return 0;
    }
    /* Batches whose events completed, in call order. */
    for (;;) {
        cudaError_t qerr = cudaSuccess;
        struct weft_qnode *h = weft_queue_head(&S->queue);
        struct sbatch *b = h ? weft_container_of(h, struct sbatch, qn) : NULL;
        int r = b ? batch_ready(b, &qerr) : 0;
        if (r == 0)
            break;
        weft_queue_pop(&S->queue);
        if (r < 0) {
            /* The stream failed before the op: release it anyway. */
            char why[256];
            snprintf(why, sizeof(why), "cudaEventQuery on the stream's event failed: %s", cu->GetErrorString(qerr));
            for (size_t i = 0; i < b->nops; i++) {
                b->ops[i]->err = WEFT_ERR_TRANSPORT;
                b->ops[i]->reported = 1;
                record_async_error(S, b->ops[i], WEFT_ERR_TRANSPORT, why);
            }
        }
        for (size_t i = 0; i < b->nevs; i++)
            event_put(S, &b->evs[i]);
        b->nevs = 0;
        weft_queue_push(&S->ready, &b->qn);
    }
    double last_event = S->last_event;
    pthread_mutex_unlock(&S->mu);

    /* Start them, in call order; a stream allgather whose lane slot is
     * still busy holds up everything after it. */
    for (struct weft_qnode *h; (h = weft_queue_head(&S->ready)) != NULL;) {
        struct sbatch *b = weft_container_of(h, struct sbatch, qn);
        for (; b->nstarted < b->nops; b->nstarted++) {
            struct sop *op = b->ops[b->nstarted];
            unsigned slot = op->ag_seq % WEFT_TAG_COLL_SLOTS;
            if (op->err == WEFT_SUCCESS) {
                if (op->kind == SOP_COLL && S->ag_slot[slot] != NULL)
                    break;
                if (op->device != S->cur_dev && op->device >= 0 && cu->SetDevice(op->device) == cudaSuccess)
                    S->cur_dev = op->device;
                op_issue(S, op);
                if (op->cop)
                    S->ag_slot[slot] = op;
            }
            weft_list_add_tail(&S->active, &op->act);   /* failed ops too: reported below */
        }
        if (b->nstarted < b->nops)
            break;
        weft_queue_pop(&S->ready);
        free(b->evs);
        free(b->ops);
        free(b);
        events++;
    }

    /* Look at the ops started. */
    double now = weft_now();
    int stuck = weft_wait_expired(&S->core->cfg, WEFT_WAIT_STREAM, last_event, now);
    struct weft_list finished;
    weft_list_init(&finished);
    weft_list_for_each(n, &S->active) {
        struct sop *op = weft_container_of(n, struct sop, act);
        int block = stuck && weft_wait_expired(&S->core->cfg, WEFT_WAIT_STREAM, op->t_issue, now);
        if (op_progress(S, op, block)) {
            weft_list_del(&op->act);
            weft_list_add_tail(&finished, &op->act);
            if (op->kind == SOP_COLL && S->ag_slot[op->ag_seq % WEFT_TAG_COLL_SLOTS] == op)
                S->ag_slot[op->ag_seq % WEFT_TAG_COLL_SLOTS] = NULL;
            events++;
            stuck = 0;   /* one blocking wait per pass */
        }
    }

    pthread_mutex_lock(&S->mu);
    int any = !weft_list_empty(&finished);
    struct weft_list *f;
    while ((f = weft_list_pop(&finished)) != NULL)
        weft_container_of(f, struct sop, act)->done = 1;
    /* publish() frees ops (finished ones included): walk the streams. */
    if (any)
        weft_queue_for_each(sn, &S->streams)
            publish(S, weft_container_of(sn, struct sstream, qn));
    if (events) {
        S->last_event = weft_now();
        pthread_cond_broadcast(&S->idle_cv);
    }
    pthread_mutex_unlock(&S->mu);
    return events;
}

/* Whether operations are queued or in flight. */
static int stream_busy(void *arg)
{
    struct weft_stream *S = arg;
    pthread_mutex_lock(&S->mu);
    int busy = !S->abandon && S->outstanding > 0;
    pthread_mutex_unlock(&S->mu);
    return busy;
}

static const struct weft_engine_client stream_client = {
    .name = "stream-ordered operations",
    .poll = stream_poll,
    .busy = stream_busy,
    /* A CUDA event completes without a knock: polled at least this often
     * (naps grow to it from 20 us). */
    .wakeless_us = 500,
    .flags = WEFT_CLIENT_NEEDS_THREAD,
};

/* ---- submission ---- */

/* Whether a stream-ordered receive waits on a device signal slot instead
 * of the host counter: its data may come by CUDA IPC (the pipe to peer has
 * a mover that moves device memory), its buffer is device memory, and its
 * stream is on the device of the comm's signal slots. S->mu held. */
static int signal_eligible(struct weft_stream *S, const struct sop *op)
{
    struct weft_mem_attr a;
    if (op->bytes == 0 || weft_signals_device(S->core) != op->device || !weft_p2p_signal_peer(S->p2p, op->peer))
        return 0;
    weft_cuda_mem_attr(op->rbuf, &a);
    return a.kind == WEFT_MEM_DEVICE;
}

/* Per (comm, stream) of a submission. */
struct subst {
    struct sstream *ss;
    int             device;
    struct sevent   ev;
    int             have_ev;
    int             counter;    /* some op of the batch on this stream is covered by the counter */
    uint32_t        last_seq;   /* ... the last of them */
};

/* Per comm of a submission. */
struct subcomm {
    struct weft_stream *S;
    struct subst       *st;
    size_t              nst;
    struct sbatch      *b;
};

static int cmp_subcomm(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct subcomm *)a)->S, y = (uintptr_t)((const struct subcomm *)b)->S;
    return x < y ? -1 : x > y;
}

/* Queues ops[0..n) (one call, or a whole group), all or nothing per phase:
 * events first on every stream, then seqs, waits and the batches. */
static int submit(struct gop *ops, size_t n, const char *fn)
{
    const struct weft_cuda *cu = weft_cuda_get();
    struct subcomm *sc = NULL;
    size_t nsc = 0;
    int rc = WEFT_SUCCESS;

    if (n == 0)
        return WEFT_SUCCESS;
    sc = calloc(n, sizeof(*sc));
    if (sc == NULL) {
        rc = weft_set_error(ops[0].s->core, WEFT_ERR_NO_MEMORY, "%s: no memory", fn);
        goto release_preps;
    }
    for (size_t i = 0; i < n; i++) {
        size_t k;
        for (k = 0; k < nsc && sc[k].S != ops[i].s; k++) {}
        if (k == nsc)
            sc[nsc++].S = ops[i].s;
    }
    qsort(sc, nsc, sizeof(*sc), cmp_subcomm);
    /* Counters for streams new to a comm, before any lock: pinned memory
     * waits for the device, and the progress thread needs S->mu to let a
     * waiting stream go. */
    for (size_t k = 0; k < nsc && rc == WEFT_SUCCESS; k++)
        rc = counters_ensure(sc[k].S, ops, n);
    if (rc != WEFT_SUCCESS) {
        free(sc);
        goto release_preps;
    }
    for (size_t k = 0; k < nsc; k++)
        pthread_mutex_lock(&sc[k].S->mu);

    /* Per comm: its batch, its streams, an event per stream, the thread. */
    for (size_t k = 0; k < nsc && rc == WEFT_SUCCESS; k++) {
        struct subcomm *s = &sc[k];
        struct weft_stream *S = s->S;
        size_t nops = 0;
        for (size_t i = 0; i < n; i++)
            nops += ops[i].s == S;
        s->st = calloc(nops, sizeof(*s->st));
        s->b = calloc(1, sizeof(*s->b));
        if (s->b) {
            s->b->ops = calloc(nops, sizeof(*s->b->ops));
            s->b->evs = calloc(nops, sizeof(*s->b->evs));
        }
        if (s->st == NULL || s->b == NULL || s->b->ops == NULL || s->b->evs == NULL) {
            rc = weft_set_error(S->core, WEFT_ERR_NO_MEMORY, "%s: no memory", fn);
            break;
        }
        for (size_t i = 0; i < n && rc == WEFT_SUCCESS; i++) {
            struct gop *g = &ops[i];
            struct sstream *ss = NULL;
            struct sop *op;
            size_t j;
            if (g->s != S)
                continue;
            rc = stream_get(S, g->stream, &ss);
            if (rc != WEFT_SUCCESS)
                break;
            for (j = 0; j < s->nst && s->st[j].ss != ss; j++) {}
            if (j == s->nst) {
                s->st[j].ss = ss;
                s->st[j].device = g->device;
                s->nst++;
                rc = event_get(S, g->device, &s->st[j].ev);
                if (rc != WEFT_SUCCESS)
                    break;
                s->st[j].have_ev = 1;
            }
            op = calloc(1, sizeof(*op));
            if (op == NULL) {
                rc = weft_set_error(S->core, WEFT_ERR_NO_MEMORY, "%s: no memory", fn);
                break;
            }
            op->kind = g->kind;
            op->sbuf = g->sbuf;
            op->rbuf = g->rbuf;
            op->bytes = g->bytes;
            op->peer = g->peer;
            op->tag = g->tag;
            op->device = g->device;
            op->coll = g->coll;
            op->prep = g->prep;   /* the op owns it now */
            memset(&g->prep, 0, sizeof(g->prep));
            op->ss = ss;
            weft_list_init(&op->act);
            s->b->ops[s->b->nops++] = op;
        }
        if (rc == WEFT_SUCCESS && !S->registered) {
            /* The comm's progress thread drives what follows. */
            rc = weft_engine_register(weft_p2p_engine(S->p2p), &stream_client, S);
            if (rc == WEFT_SUCCESS)
                S->registered = 1;
        }
    }

    /* Phase 1: an event on every stream, before any wait of this submission. */
    for (size_t k = 0; k < nsc && rc == WEFT_SUCCESS; k++)
        for (size_t j = 0; j < sc[k].nst && rc == WEFT_SUCCESS; j++) {
            cudaError_t e = cu->EventRecord(sc[k].st[j].ev.ev, sc[k].st[j].ss->stream);
            if (e != cudaSuccess) {
                cu->GetLastError();
                rc = weft_set_error(sc[k].S->core, cuda_to_weft(e), "%s: cudaEventRecord on stream %p (device %d) "
                                    "failed: %s", fn, (void *)sc[k].st[j].ss->stream, sc[k].st[j].device,
                                    cu->GetErrorString(e));
            }
        }

    if (rc != WEFT_SUCCESS) {
        /* Nothing queued: give back what was taken. */
        for (size_t k = 0; k < nsc; k++) {
            for (size_t j = 0; j < sc[k].nst; j++)
                if (sc[k].st[j].have_ev)
                    event_put(sc[k].S, &sc[k].st[j].ev);
            if (sc[k].b) {
                for (size_t i = 0; i < sc[k].b->nops; i++)
                    op_free(sc[k].S, sc[k].b->ops[i], 0);
                free(sc[k].b->ops);
                free(sc[k].b->evs);
                free(sc[k].b);
            }
            free(sc[k].st);
        }
        for (size_t k = nsc; k-- > 0;)
            pthread_mutex_unlock(&sc[k].S->mu);
        free(sc);
        goto release_preps;
    }

    /* Phase 2: seqs in call order, the waits, the batches. A receive that
     * a peer's GPU may complete (CUDA IPC) gets a device signal slot and
     * its stream waits on that (the sender writes it right after its
     * copy); everything else is covered by one wait per stream on the
     * host counter for the last of its ops. */
    for (size_t k = 0; k < nsc; k++) {
        struct subcomm *s = &sc[k];
        struct weft_stream *S = s->S;
        struct sbatch *b = s->b;
        for (size_t i = 0; i < b->nops; i++) {
            struct sop *op = b->ops[i];
            struct sstream *ss = op->ss;
            op->seq = ++ss->next_seq;
            if (op->kind == SOP_COLL) {
                op->ag_seq = S->ag_seq++;
                if (S->cc->sjournal)   /* the flight recorder: queued now, ends when its stream may go on */
                    weft_journal_start(S->cc->sjournal, op->ag_seq, op->coll.kind, op->coll.root, op->coll.dtype,
                                       op->coll.op, (uint64_t)op->coll.count, 1);
            }
            if (op->kind == SOP_RECV && signal_eligible(S, op) &&
                weft_signals_take(S->core, &op->sig_slot, &op->sig_value, &op->sig_addr) == 0)
                op->sig = 1;
            weft_queue_push(&ss->fifo, &op->fifo);
        }
        for (size_t i = 0; i < b->nops; i++) {
            struct sop *op = b->ops[i];
            if (op->sig) {
                CUresult r = cu->cuStreamWaitValue32((CUstream)op->ss->stream, (CUdeviceptr)op->sig_addr,
                                                     op->sig_value, CU_STREAM_WAIT_VALUE_GEQ);
                if (r != CUDA_SUCCESS) {
                    /* The counter covers it instead. */
                    weft_signals_drop(S->core, op->sig_slot);
                    op->sig = 0;
                }
            }
            for (size_t j = 0; j < s->nst; j++)
                if (s->st[j].ss == op->ss && !op->sig) {
                    s->st[j].last_seq = op->seq;
                    s->st[j].counter = 1;
                }
        }
        for (size_t j = 0; j < s->nst; j++) {
            CUresult r = !s->st[j].counter ? CUDA_SUCCESS
                         : cu->cuStreamWaitValue32((CUstream)s->st[j].ss->stream, s->st[j].ss->dev,
                                                   s->st[j].last_seq, CU_STREAM_WAIT_VALUE_GEQ);
            if (r != CUDA_SUCCESS && rc == WEFT_SUCCESS) {
                const char *es = NULL;
                cu->cuGetErrorString(r, &es);
                rc = weft_set_error(S->core, WEFT_ERR_TRANSPORT,
                                    "%s: cuStreamWaitValue32 on stream %p failed (%s): the operation runs, "
                                    "but later work on the stream does not wait for it", fn,
                                    (void *)s->st[j].ss->stream, es ? es : "unknown error");
            }
            b->evs[j] = s->st[j].ev;
        }
        b->nevs = s->nst;
        if (S->outstanding == 0)
            S->last_event = weft_now();   /* the stream's clock starts with its first op in flight */
        weft_queue_push(&S->queue, &b->qn);
        S->outstanding += b->nops;
        weft_cuda_stream_waits_add((long)b->nops);
        weft_engine_kick(weft_p2p_engine(S->p2p));
        free(s->st);
    }
    for (size_t k = nsc; k-- > 0;)
        pthread_mutex_unlock(&sc[k].S->mu);
    free(sc);
    return rc;

release_preps:
    for (size_t i = 0; i < n; i++)
        weft_coll_prep_release(ops[i].s->cc, &ops[i].prep);
    return rc;
}

/* Common front of the three calls: CUDA present, no pending error; what
 * the call will need from CUDA taken here, on the caller's thread (weft's
 * progress thread must make no call that waits for the device while a
 * stream waits on weft: src/core/cudawrap.h); then queued at once or
 * recorded in the open group. */
static int enqueue(struct gop *g)
{
    const char *fn = kind_name(g->kind, g->coll.kind);
    struct weft_stream *S = g->s;
    int err;

    memset(&g->prep, 0, sizeof(g->prep));
    if (!S->core->cuda || weft_cuda_get() == NULL)
        return weft_set_error(S->core, WEFT_ERR_UNSUPPORTED, "%s: CUDA is not available in this comm (%s)", fn,
                              weft_cuda_why()[0] ? weft_cuda_why() : "no device");
    pthread_mutex_lock(&S->mu);
    err = take_error_locked(S, fn);
    pthread_mutex_unlock(&S->mu);
    if (err != WEFT_SUCCESS)
        return err;
    /* Events and waits belong to the stream's device, whatever device the
     * calling thread is on (cudaEventRecord: "event and stream must be on
     * the same device"). */
    err = weft_cuda_stream_device((cudaStream_t)g->stream, &g->device);
    if (err != WEFT_SUCCESS)
        return weft_set_error(S->core, err, "%s: the device of stream %p cannot be found (not a live CUDA stream "
                              "of this process?)", fn, (void *)g->stream);
    weft_p2p_prepare_device(S->p2p);
    if (g->kind == SOP_COLL && (err = weft_coll_prepare(S->cc, &g->coll, &g->prep)) != WEFT_SUCCESS)
        return err;
    if (g->prep.vec)
        g->coll.vec = g->prep.vec;   /* alltoallv: the copy of the caller's arrays, freed with the prep */
    if (g_depth > 0) {
        if (g_n == g_cap) {
            size_t cap = g_cap ? 2 * g_cap : 16;
            struct gop *p = realloc(g_ops, cap * sizeof(*p));
            if (p == NULL) {
                weft_coll_prep_release(S->cc, &g->prep);
                return weft_set_error(S->core, WEFT_ERR_NO_MEMORY, "%s: no memory for the group", fn);
            }
            g_ops = p;
            g_cap = cap;
        }
        g_ops[g_n++] = *g;
        return WEFT_SUCCESS;
    }
    return submit(g, 1, fn);
}

int weft_stream_send(struct weft_stream *s, const void *buf, size_t bytes, int peer, int tag,
                     struct CUstream_st *stream)
{
    struct gop g = { s, SOP_SEND, buf, NULL, bytes, peer, tag, stream, 0,
                     { 0, NULL, NULL, 0, -1, -1, -1, NULL, NULL }, { 0, NULL, NULL, NULL } };
    return enqueue(&g);
}

int weft_stream_recv(struct weft_stream *s, void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream)
{
    struct gop g = { s, SOP_RECV, NULL, buf, bytes, peer, tag, stream, 0,
                     { 0, NULL, NULL, 0, -1, -1, -1, NULL, NULL }, { 0, NULL, NULL, NULL } };
    return enqueue(&g);
}

int weft_stream_coll(struct weft_stream *s, const struct weft_coll_args *a, struct CUstream_st *stream)
{
    struct gop g = { s, SOP_COLL, NULL, NULL, 0, -1, -1, stream, 0, *a, { 0, NULL, NULL, NULL } };
    if (a->count == 0 && a->kind != WEFT_COLL_BARRIER && a->kind != WEFT_COLL_ALLTOALLV) {
        /* Nothing moves on any rank (all pass 0): only the CUDA check.
         * Not alltoallv: a rank sending nothing may still receive. */
        if (!s->core->cuda)
            return weft_set_error(s->core, WEFT_ERR_UNSUPPORTED, "%s: CUDA is not available in this comm",
                                  coll_fn(a->kind));
        return WEFT_SUCCESS;
    }
    return enqueue(&g);
}

int weft_stream_allgather(struct weft_stream *s, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                          struct CUstream_st *stream)
{
    struct weft_coll_args a = { WEFT_COLL_ALLGATHER, sendbuf, recvbuf, bytes_per_rank, -1, -1, -1, NULL, NULL };
    return weft_stream_coll(s, &a, stream);
}

int weft_stream_group_end(void)
{
    int rc;
    if (g_depth <= 0)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_group_end: no matching weft_group_start");
    if (--g_depth > 0)
        return WEFT_SUCCESS;
    rc = submit(g_ops, g_n, "weft_group_end");
    free(g_ops);
    g_ops = NULL;
    g_n = g_cap = 0;
    return rc;
}

/* ---- destroy ---- */

int weft_stream_quiesce(struct weft_stream *S)
{
    int rc = WEFT_SUCCESS;

    if (S == NULL)
        return WEFT_SUCCESS;
    pthread_mutex_lock(&S->mu);
    if (!S->registered) {
        pthread_mutex_unlock(&S->mu);
        return WEFT_SUCCESS;
    }
    double t0 = weft_now();
    uint64_t seen = S->completed;
    while (S->outstanding > 0) {
        double now = weft_now();
        if (S->completed != seen) {
            seen = S->completed;
            t0 = now;
        }
        if (weft_wait_expired(&S->core->cfg, WEFT_WAIT_DESTROY, t0, now)) {
            rc = weft_set_error(S->core, WEFT_ERR_TIMEOUT,
                                "weft_comm_destroy: %zu stream-ordered operation(s) still not complete after %.0f s "
                                "without progress; dropped, their streams released",
                                S->outstanding, weft_wait_bound(&S->core->cfg, WEFT_WAIT_DESTROY));
            S->abandon = 1;
            break;
        }
        timed_wait(&S->idle_cv, &S->mu, 100000);
    }
    if (rc == WEFT_SUCCESS)
        rc = take_error_locked(S, "weft_comm_destroy");
    S->registered = 0;
    pthread_mutex_unlock(&S->mu);
    /* No pass runs after this returns. */
    weft_engine_unregister(weft_p2p_engine(S->p2p), &stream_client, S);
    pthread_mutex_lock(&S->mu);
    if (S->abandon) {
        struct weft_qnode *n;
        abandon_all(S, 1);   /* frees the ops of the ready batches too (they are on the FIFOs) */
        while ((n = weft_queue_pop(&S->ready)) != NULL)
            batch_free(S, weft_container_of(n, struct sbatch, qn), 0);
        weft_list_init(&S->active);   /* its ops went with their FIFOs */
        memset(S->ag_slot, 0, sizeof(S->ag_slot));
    }
    pthread_mutex_unlock(&S->mu);
    return rc;
}

void weft_stream_destroy(struct weft_stream *S)
{
    const struct weft_cuda *cu = weft_cuda_get();
    struct weft_qnode *n;
    struct weft_list *l;
    int running;

    if (S == NULL)
        return;
    pthread_mutex_lock(&S->mu);
    running = S->registered;
    pthread_mutex_unlock(&S->mu);
    if (running)
        weft_stream_quiesce(S);
    pthread_mutex_lock(&S->mu);
    abandon_all(S, 0);   /* nothing left normally; frees stragglers otherwise */
    pthread_mutex_unlock(&S->mu);
    for (size_t i = 0; i < S->nevpool; i++)
        cu->EventDestroy(S->evpool[i].ev);
    free(S->evpool);
    while ((n = weft_queue_pop(&S->streams)) != NULL)
        free(weft_container_of(n, struct sstream, qn));
    while ((l = weft_list_pop(&S->chunks)) != NULL) {
        pthread_mutex_lock(&chunk_pool_lock);
        weft_list_add_head(&chunk_pool, l);
        pthread_mutex_unlock(&chunk_pool_lock);
    }
    pthread_cond_destroy(&S->idle_cv);
    pthread_mutex_destroy(&S->mu);
    free(S);
}

#else /* !WEFT_HAVE_CUDA_HEADERS: no CUDA at all, every call is unsupported */

struct weft_stream {
    struct weft_core *core;
};

int weft_stream_create(struct weft_core *core, struct weft_p2p *p2p, struct weft_coll *cc,
                       struct weft_stream **out)
{
    struct weft_stream *S = calloc(1, sizeof(*S));
    (void)p2p;
    (void)cc;
    *out = S;
    if (S == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for the stream state");
    S->core = core;
    return WEFT_SUCCESS;
}

static int no_cuda(struct weft_stream *s, const char *fn)
{
    return weft_set_error(s->core, WEFT_ERR_UNSUPPORTED, "%s: weft was built without CUDA", fn);
}

int weft_stream_send(struct weft_stream *s, const void *buf, size_t bytes, int peer, int tag,
                     struct CUstream_st *stream)
{
    (void)buf, (void)bytes, (void)peer, (void)tag, (void)stream;
    return no_cuda(s, "weft_send_on_stream");
}

int weft_stream_recv(struct weft_stream *s, void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream)
{
    (void)buf, (void)bytes, (void)peer, (void)tag, (void)stream;
    return no_cuda(s, "weft_recv_on_stream");
}

int weft_stream_allgather(struct weft_stream *s, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                          struct CUstream_st *stream)
{
    (void)sendbuf, (void)recvbuf, (void)bytes_per_rank, (void)stream;
    return no_cuda(s, "weft_allgather_on_stream");
}

int weft_stream_group_end(void)
{
    if (g_depth <= 0)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_group_end: no matching weft_group_start");
    g_depth--;
    return WEFT_SUCCESS;
}

int  weft_stream_quiesce(struct weft_stream *s) { (void)s; return WEFT_SUCCESS; }
void weft_stream_destroy(struct weft_stream *s) { free(s); }
int  weft_stream_take_error(struct weft_stream *s) { (void)s; return WEFT_SUCCESS; }
int  weft_stream_peek_error(struct weft_stream *s) { (void)s; return WEFT_SUCCESS; }

#endif /* WEFT_HAVE_CUDA_HEADERS */
