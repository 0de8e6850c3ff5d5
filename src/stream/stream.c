/*
 * Stream-ordered operations: weft_send_on_stream, weft_recv_on_stream,
 * weft_allgather_on_stream, weft_group_start/weft_group_end.
 *
 * How an operation is ordered on a CUDA stream without blocking the host:
 *
 *   at the call (or at the outermost weft_group_end for grouped calls):
 *     cudaEventRecord(ev, stream)          "the work queued so far is done"
 *     cuStreamWaitValue32(stream, counter, seq, GEQ)
 *                                          later work waits for this op
 *   on the comm's progress thread:
 *     cudaEventQuery(ev) == done  ->  weft_isend / weft_irecv (allgather:
 *     all the sends and receives of a direct exchange on an internal lane)
 *     -> weft_test until complete -> counter = highest seq such that every
 *     op up to it on that stream is done (release store)
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
 * their lane. A batch waits for all of its events; since an event can only
 * follow work that was queued before it, the head of the FIFO never waits
 * for a later call, and issuing in call order cannot deadlock.
 *
 * Locks. S->mu guards the stream state (FIFO, stream table, counters,
 * event pool, pending error). The progress thread never holds it while it
 * calls into weft: weft_isend/irecv/test take c->lock as for any caller.
 * Callers hold S->mu across seq assignment and the two CUDA enqueues, so a
 * stream's waits appear in seq order.
 */
#include "stream.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_internal.h"
#include "comm.h"
#include "cudawrap.h"
#include "log.h"

/* ---- argument checks (as p2p/api.c and weft_allgather) ---- */

static int check_p2p(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    if (buf == NULL && bytes != 0)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: buf is NULL but bytes is %zu (peer %d, tag %d)", fn,
                              bytes, peer, tag);
    if (peer < 0 || peer >= c->size)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: peer %d out of range [0, %d) (tag %d)", fn, peer,
                              c->size, tag);
    if (tag < 0)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: tag %d is negative (peer %d); tags are >= 0", fn, tag,
                              peer);
    return WEFT_SUCCESS;
}

static int check_allgather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes)
{
    static const char fn[] = "weft_allgather_on_stream";
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    if (bytes > 0 && sendbuf == NULL)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: sendbuf is NULL with bytes_per_rank %zu", fn, bytes);
    if (bytes > 0 && recvbuf == NULL)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: recvbuf is NULL with bytes_per_rank %zu", fn, bytes);
    if (bytes > SIZE_MAX / (size_t)c->size)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: bytes_per_rank %zu x %d ranks overflows size_t", fn,
                              bytes, c->size);
    if (bytes > 0) {
        size_t total = bytes * (size_t)c->size;
        uintptr_t s0 = (uintptr_t)sendbuf, r0 = (uintptr_t)recvbuf;
        uintptr_t mine = r0 + (uintptr_t)c->rank * bytes;
        if (s0 != mine && s0 < r0 + total && r0 < s0 + bytes)
            return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                                  "%s: sendbuf overlaps recvbuf but is not recvbuf + rank*bytes_per_rank "
                                  "(the in-place form)", fn);
    }
    return WEFT_SUCCESS;
}

/* ---- groups: nesting depth per host thread ---- */

static _Thread_local int g_depth;

int weft_group_start(void)
{
    g_depth++;
    return WEFT_SUCCESS;
}

#ifdef WEFT_HAVE_CUDA_HEADERS

/* ---- recorded calls; the calls of an open group (per host thread) ---- */

enum sop_kind { SOP_SEND = 1, SOP_RECV, SOP_ALLGATHER };

/* A call recorded in a group, or the one call of an ungrouped submit. */
struct gop {
    struct weft_comm  *c;
    int                kind;
    const void        *sbuf;
    void              *rbuf;
    size_t             bytes;
    int                peer, tag;
    struct CUstream_st *stream;
    int                device;   /* current device at the call */
};

static _Thread_local struct gop *g_ops;
static _Thread_local size_t      g_n, g_cap;

static const char *kind_name(int kind)
{
    return kind == SOP_SEND ? "weft_send_on_stream" : kind == SOP_RECV ? "weft_recv_on_stream"
                                                                        : "weft_allgather_on_stream";
}


/* Internal lane of stream allgathers: below the collectives' lanes
 * (-(0x10000 .. 0x100ff), collectives/coll.h), never matched by user tags. */
#define STREAM_AG_TAG       (-0x5A000)
#define COUNTERS_PER_CHUNK  1024        /* 4 KiB of counters per pinned chunk */
#define IDLE_YIELDS         8           /* idle passes that only yield */
#define IDLE_SLEEP_MIN_US   20
#define IDLE_SLEEP_MAX_US   500

struct sstream;

/* One stream-ordered operation. Lives from submit until its stream's
 * counter passed it (then freed by the progress thread). */
struct sop {
    int              kind;
    const void      *sbuf;
    void            *rbuf;
    size_t           bytes;
    int              peer, tag;
    int              device;
    struct sstream  *ss;
    uint32_t         seq;
    /* issued (progress thread only) */
    weft_request_t **reqs;
    weft_request_t  *inl[2];
    size_t           nreq, next_req;  /* reqs before next_req are complete */
    double           t_issue;
    int              done;
    int              err;
    int              reported;        /* err already recorded as the async error */
    struct sop      *fifo_next;       /* the stream's FIFO (S->mu) */
    struct sop      *act_next;        /* the thread's active list */
};

struct sevent {
    cudaEvent_t ev;
    int         device;
};

/* Operations started together: one call, or one group (for one comm). */
struct sbatch {
    struct sbatch  *next;
    struct sop    **ops;
    size_t          nops;
    struct sevent  *evs;      /* one per distinct stream */
    size_t          nevs;
};

struct sstream {
    struct sstream     *next;
    struct CUstream_st *stream;
    uint32_t           *host;       /* counter, mapped pinned memory */
    CUdeviceptr         dev;        /* its device address */
    uint32_t            next_seq;   /* last seq handed out */
    struct sop         *fifo_head, *fifo_tail;  /* not yet published, seq order */
};

struct schunk {
    struct schunk *next;
    uint32_t      *host;
    CUdeviceptr    dev;
    unsigned       used;
};

/* Chunks of destroyed comms, reused by later ones instead of being freed:
 * cudaFreeHost would synchronise the device inside weft_comm_destroy, and a
 * counter word keeps its value, so a reused slot continues from it (never
 * goes back, whatever stream wait may still look at it). */
static pthread_mutex_t chunk_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct schunk  *chunk_pool;

struct stream_state {
    struct weft_comm *c;
    pthread_mutex_t   mu;
    pthread_cond_t    cv;          /* progress thread: new work, stop */
    pthread_cond_t    idle_cv;     /* quiesce: an op completed */
    pthread_t         thread;
    int               thread_started;
    int               stop;        /* quiesce: exit once nothing is left */
    int               abandon;     /* quiesce timed out: drop everything */
    struct sbatch    *q_head, *q_tail;   /* not yet started, call order */
    size_t            outstanding; /* submitted, counter not yet past them */
    uint64_t          completed;   /* published so far */
    struct sstream   *streams;
    struct schunk    *chunks;
    struct sevent    *evpool;
    size_t            nevpool, evpool_cap;
    int               async_err;   /* first unreported asynchronous failure */
    char              async_msg[700];
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

static struct stream_state *state_of(struct weft_comm *c)
{
    return __atomic_load_n((struct stream_state **)&c->stream_state, __ATOMIC_ACQUIRE);
}

/* The comm's state, created at the first stream-ordered call. */
static struct stream_state *state_get(struct weft_comm *c)
{
    struct stream_state *S = state_of(c);
    if (S)
        return S;
    pthread_mutex_lock(&c->lock);
    S = c->stream_state;
    if (S == NULL) {
        S = calloc(1, sizeof(*S));
        if (S) {
            pthread_condattr_t ca;
            S->c = c;
            pthread_mutex_init(&S->mu, NULL);
            pthread_condattr_init(&ca);
            pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
            pthread_cond_init(&S->cv, &ca);
            pthread_cond_init(&S->idle_cv, &ca);
            pthread_condattr_destroy(&ca);
            __atomic_store_n((struct stream_state **)&c->stream_state, S, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return S;
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

/* Records the first unreported asynchronous failure (S->mu held). */
static void record_async_error(struct stream_state *S, const struct sop *op, int err, const char *why)
{
    struct weft_comm *c = S->c;
    char msg[sizeof(S->async_msg)];
    const char *w = why;
    /* The pipe's text already names the rank: drop its "rank R: " prefix. */
    if (strncmp(w, "rank ", 5) == 0 && strstr(w, ": "))
        w = strstr(w, ": ") + 2;
    if (op->kind == SOP_ALLGATHER)
        snprintf(msg, sizeof(msg), "%s (%zu bytes per rank, stream %p, op #%u) failed asynchronously: %s",
                 kind_name(op->kind), op->bytes, (void *)op->ss->stream, op->seq, w);
    else
        snprintf(msg, sizeof(msg), "%s (%s peer %d, tag %d, %zu bytes, stream %p, op #%u) failed asynchronously: %s",
                 kind_name(op->kind), op->kind == SOP_SEND ? "to" : "from", op->peer, op->tag, op->bytes,
                 (void *)op->ss->stream, op->seq, w);
    weft_set_error(c, err, "%s", msg);
    if (S->async_err == WEFT_SUCCESS) {
        S->async_err = err;
        snprintf(S->async_msg, sizeof(S->async_msg), "%s", msg);
    }
}

/* Takes the pending asynchronous error (S->mu held). */
static int take_error_locked(struct stream_state *S, const char *fn)
{
    int err = S->async_err;
    if (err == WEFT_SUCCESS)
        return WEFT_SUCCESS;
    S->async_err = WEFT_SUCCESS;
    return weft_set_error(S->c, err, "%s: an earlier stream-ordered operation failed, nothing started: %s", fn,
                          S->async_msg);
}

int weft_stream_take_error(struct weft_comm *c)
{
    struct stream_state *S = c ? state_of(c) : NULL;
    int err;
    if (S == NULL)
        return WEFT_SUCCESS;
    pthread_mutex_lock(&S->mu);
    err = take_error_locked(S, "weft");
    pthread_mutex_unlock(&S->mu);
    return err;
}

/* ---- counters, streams, events (S->mu held) ---- */

static int counter_alloc(struct stream_state *S, uint32_t **host, CUdeviceptr *dev, uint32_t *value)
{
    const struct weft_cuda *cu = weft_cuda_get();
    struct schunk *ch = S->chunks;
    if (ch == NULL || ch->used == COUNTERS_PER_CHUNK) {
        pthread_mutex_lock(&chunk_pool_lock);
        ch = chunk_pool;
        if (ch)
            chunk_pool = ch->next;
        pthread_mutex_unlock(&chunk_pool_lock);
        if (ch) {
            ch->used = 0;
            ch->next = S->chunks;
            S->chunks = ch;
        }
    }
    if (ch == NULL || ch->used == COUNTERS_PER_CHUNK) {
        void *h = NULL, *d = NULL;
        cudaError_t e;
        ch = calloc(1, sizeof(*ch));
        if (ch == NULL)
            return weft_set_error(S->c, WEFT_ERR_NO_MEMORY, "stream-ordered call: no memory for counters");
        e = cu->HostAlloc(&h, COUNTERS_PER_CHUNK * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable);
        if (e == cudaSuccess) {
            memset(h, 0, COUNTERS_PER_CHUNK * sizeof(uint32_t));
            e = cu->HostGetDevicePointer(&d, h, 0);
            if (e != cudaSuccess)
                cu->FreeHost(h);
        }
        if (e != cudaSuccess) {
            free(ch);
            return weft_set_error(S->c, cuda_to_weft(e),
                                  "stream-ordered call: mapped pinned memory for stream counters: %s",
                                  cu->GetErrorString(e));
        }
        ch->host = h;
        ch->dev = (CUdeviceptr)(uintptr_t)d;
        ch->next = S->chunks;
        S->chunks = ch;
    }
    *host = ch->host + ch->used;
    *dev = ch->dev + ch->used * sizeof(uint32_t);
    *value = __atomic_load_n(*host, __ATOMIC_ACQUIRE);
    ch->used++;
    return WEFT_SUCCESS;
}

static int stream_get(struct stream_state *S, struct CUstream_st *stream, struct sstream **out)
{
    struct sstream *ss;
    int rc;
    for (ss = S->streams; ss; ss = ss->next)
        if (ss->stream == stream) {
            *out = ss;
            return WEFT_SUCCESS;
        }
    ss = calloc(1, sizeof(*ss));
    if (ss == NULL)
        return weft_set_error(S->c, WEFT_ERR_NO_MEMORY, "stream-ordered call: no memory for a stream entry");
    rc = counter_alloc(S, &ss->host, &ss->dev, &ss->next_seq);
    if (rc != WEFT_SUCCESS) {
        free(ss);
        return rc;
    }
    ss->stream = stream;
    ss->next = S->streams;
    S->streams = ss;
    *out = ss;
    return WEFT_SUCCESS;
}

static int event_get(struct stream_state *S, int device, struct sevent *out)
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
        return weft_set_error(S->c, cuda_to_weft(e), "stream-ordered call: cudaEventCreateWithFlags: %s",
                              cu->GetErrorString(e));
    out->device = device;
    return WEFT_SUCCESS;
}

static void event_put(struct stream_state *S, const struct sevent *ev)
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

static void op_free(struct sop *op)
{
    if (op->reqs && op->reqs != op->inl)
        free(op->reqs);
    free(op);
}

/* Starts op through the p2p layer (no lock held). */
static void op_issue(struct weft_comm *c, struct sop *op)
{
    int rc = WEFT_SUCCESS;

    op->reqs = op->inl;
    op->t_issue = weft_now();
    switch (op->kind) {
    case SOP_SEND:
        rc = weft_isend(c, op->sbuf, op->bytes, op->peer, op->tag, &op->inl[0]);
        op->nreq = rc == WEFT_SUCCESS;
        break;
    case SOP_RECV:
        rc = weft_irecv(c, op->rbuf, op->bytes, op->peer, op->tag, &op->inl[0]);
        op->nreq = rc == WEFT_SUCCESS;
        break;
    default: {
        /* Direct exchange: every receive posted, then every send, all on one
         * internal lane (allgathers start in call order on every rank, and
         * the lane is FIFO per peer, so consecutive ones cannot mix). */
        int n = c->size, me = c->rank;
        char *rb = op->rbuf;
        int in_place = (const char *)op->sbuf == rb + (size_t)me * op->bytes;
        op->reqs = calloc(2 * (size_t)n, sizeof(*op->reqs));
        if (op->reqs == NULL) {
            op->reqs = op->inl;
            rc = weft_set_error(c, WEFT_ERR_NO_MEMORY, "weft_allgather_on_stream: no memory for %d requests", 2 * n);
            break;
        }
        for (int i = 0; i < n && rc == WEFT_SUCCESS; i++) {
            int p = (me - i + n) % n;
            if (p == me && in_place)
                continue;
            rc = weft_irecv_internal(c, rb + (size_t)p * op->bytes, op->bytes, p, STREAM_AG_TAG,
                                     &op->reqs[op->nreq]);
            if (rc == WEFT_SUCCESS)
                op->nreq++;
        }
        for (int i = 0; i < n && rc == WEFT_SUCCESS; i++) {
            int p = (me + i) % n;
            if (p == me && in_place)
                continue;
            rc = weft_isend_internal(c, op->sbuf, op->bytes, p, STREAM_AG_TAG, &op->reqs[op->nreq]);
            if (rc == WEFT_SUCCESS)
                op->nreq++;
        }
        break;
    }
    }
    op->err = rc;
}

/* Tests op's requests in order; 1 when all are complete. No lock held. */
static int op_progress(struct stream_state *S, struct sop *op, int block)
{
    struct weft_comm *c = S->c;
    while (op->next_req < op->nreq) {
        weft_status_t st;
        int done = 0, rc;
        if (block) {
            /* Stuck past WEFT_TIMEOUT: weft_waitall breaks the pipes of
             * what still does not move and completes them with an error. */
            rc = weft_waitall(op->nreq - op->next_req, op->reqs + op->next_req, NULL);
            op->next_req = op->nreq;
            if (rc != WEFT_SUCCESS && op->err == WEFT_SUCCESS)
                op->err = rc;
            break;
        }
        rc = weft_test(op->reqs[op->next_req], &done, &st);
        if (!done)
            return 0;
        op->reqs[op->next_req++] = NULL;
        if (rc != WEFT_SUCCESS && op->err == WEFT_SUCCESS)
            op->err = rc;
    }
    if (op->err != WEFT_SUCCESS && !op->reported) {
        const char *why = weft_comm_last_error(c);
        op->reported = 1;
        pthread_mutex_lock(&S->mu);
        record_async_error(S, op, op->err, why);
        pthread_mutex_unlock(&S->mu);
    }
    return 1;
}

/* Advances ss's counter past its leading completed ops (S->mu held). */
static int publish(struct stream_state *S, struct sstream *ss)
{
    uint32_t seq = 0;
    int n = 0;
    while (ss->fifo_head && ss->fifo_head->done) {
        struct sop *op = ss->fifo_head;
        ss->fifo_head = op->fifo_next;
        seq = op->seq;
        op_free(op);
        n++;
    }
    if (ss->fifo_head == NULL)
        ss->fifo_tail = NULL;
    if (n) {
        __atomic_store_n(ss->host, seq, __ATOMIC_RELEASE);
        S->outstanding -= (size_t)n;
        S->completed += (uint64_t)n;
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

static void batch_free(struct stream_state *S, struct sbatch *b, int return_events)
{
    if (return_events)
        for (size_t i = 0; i < b->nevs; i++)
            event_put(S, &b->evs[i]);
    free(b->evs);
    free(b->ops);
    free(b);
}

/* quiesce gave up: release every stream, drop every op (S->mu held). The
 * requests already started stay with their pipes (destroy reports them). */
static void abandon_all(struct stream_state *S)
{
    while (S->q_head) {
        struct sbatch *b = S->q_head;
        S->q_head = b->next;
        batch_free(S, b, 1);
    }
    S->q_tail = NULL;
    for (struct sstream *ss = S->streams; ss; ss = ss->next) {
        while (ss->fifo_head) {
            struct sop *op = ss->fifo_head;
            ss->fifo_head = op->fifo_next;
            op_free(op);
        }
        ss->fifo_tail = NULL;
        __atomic_store_n(ss->host, ss->next_seq, __ATOMIC_RELEASE);
    }
    S->outstanding = 0;
}

static void *progress_main(void *arg)
{
    struct stream_state *S = arg;
    struct weft_comm *c = S->c;
    const struct weft_cuda *cu = weft_cuda_get();
    struct sop *active = NULL;
    int cur_dev = -1;
    unsigned idle = 0;
    double last_event = weft_now();

    pthread_mutex_lock(&S->mu);
    for (;;) {
        if (S->abandon)
            break;
        if (S->q_head == NULL && active == NULL) {
            if (S->stop)
                break;
            pthread_cond_wait(&S->cv, &S->mu);
            idle = 0;
            last_event = weft_now();
            continue;
        }

        /* Batches whose events completed, in call order. */
        struct sbatch *ready = NULL, **rtail = &ready;
        int events = 0;
        for (;;) {
            cudaError_t qerr = cudaSuccess;
            struct sbatch *b = S->q_head;
            int r = b ? batch_ready(b, &qerr) : 0;
            if (r == 0)
                break;
            S->q_head = b->next;
            if (S->q_head == NULL)
                S->q_tail = NULL;
            b->next = NULL;
            if (r < 0) {
                /* The stream failed before the op: release it anyway. */
                char why[256];
                snprintf(why, sizeof(why), "cudaEventQuery on the stream's event failed: %s",
                         cu->GetErrorString(qerr));
                for (size_t i = 0; i < b->nops; i++) {
                    b->ops[i]->err = WEFT_ERR_TRANSPORT;
                    b->ops[i]->reported = 1;
                    record_async_error(S, b->ops[i], WEFT_ERR_TRANSPORT, why);
                }
            }
            for (size_t i = 0; i < b->nevs; i++)
                event_put(S, &b->evs[i]);
            b->nevs = 0;
            *rtail = b;
            rtail = &b->next;
        }
        pthread_mutex_unlock(&S->mu);

        /* Start them. */
        while (ready) {
            struct sbatch *b = ready;
            ready = b->next;
            for (size_t i = 0; i < b->nops; i++) {
                struct sop *op = b->ops[i];
                if (op->err == WEFT_SUCCESS) {
                    if (op->device != cur_dev && op->device >= 0 && cu->SetDevice(op->device) == cudaSuccess)
                        cur_dev = op->device;
                    op_issue(c, op);
                }
                op->act_next = active;   /* failed ops too: reported below */
                active = op;
            }
            free(b->evs);
            free(b->ops);
            free(b);
            events++;
        }

        /* Progress on every pipe, then look at the ops started. */
        pthread_mutex_lock(&c->lock);
        events += weft_progress(c) > 0;
        pthread_mutex_unlock(&c->lock);

        double now = weft_now();
        int stuck = c->cfg.timeout_s > 0 && now - last_event > c->cfg.timeout_s;
        struct sop *finished = NULL, **pp = &active;
        while (*pp) {
            struct sop *op = *pp;
            int block = stuck && now - op->t_issue > c->cfg.timeout_s;
            if (op_progress(S, op, block)) {
                *pp = op->act_next;
                op->act_next = finished;
                finished = op;
                events++;
                stuck = 0;   /* one blocking wait per pass */
            } else
                pp = &op->act_next;
        }

        pthread_mutex_lock(&S->mu);
        for (struct sop *op = finished; op;) {
            struct sop *next = op->act_next;
            op->done = 1;
            op = next;
        }
        /* publish() frees ops (finished ones included): walk the streams. */
        if (finished)
            for (struct sstream *ss = S->streams; ss; ss = ss->next)
                publish(S, ss);
        if (events) {
            idle = 0;
            last_event = weft_now();
            pthread_cond_broadcast(&S->idle_cv);
            continue;
        }
        /* Nothing happened: yield, then sleep in growing steps; a new
         * submission wakes the thread at once. */
        if (++idle <= IDLE_YIELDS) {
            pthread_mutex_unlock(&S->mu);
            sched_yield();
            pthread_mutex_lock(&S->mu);
        } else {
            long us = IDLE_SLEEP_MIN_US << (idle - IDLE_YIELDS < 5 ? idle - IDLE_YIELDS : 5);
            timed_wait(&S->cv, &S->mu, us < IDLE_SLEEP_MAX_US ? us : IDLE_SLEEP_MAX_US);
        }
    }
    if (S->abandon)
        abandon_all(S);
    pthread_cond_broadcast(&S->idle_cv);
    pthread_mutex_unlock(&S->mu);
    return NULL;
}

/* ---- submission ---- */

/* Per (comm, stream) of a submission. */
struct subst {
    struct sstream *ss;
    int             device;
    struct sevent   ev;
    int             have_ev;
    uint32_t        last_seq;
};

/* Per comm of a submission. */
struct subcomm {
    struct weft_comm    *c;
    struct stream_state *S;
    struct subst        *st;
    size_t               nst;
    struct sbatch       *b;
};

static int cmp_subcomm(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct subcomm *)a)->c, y = (uintptr_t)((const struct subcomm *)b)->c;
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
    if (sc == NULL)
        return weft_set_error(ops[0].c, WEFT_ERR_NO_MEMORY, "%s: no memory", fn);
    for (size_t i = 0; i < n; i++) {
        size_t k;
        for (k = 0; k < nsc && sc[k].c != ops[i].c; k++) {}
        if (k == nsc) {
            sc[nsc].c = ops[i].c;
            sc[nsc].S = state_get(ops[i].c);
            if (sc[nsc].S == NULL) {
                rc = weft_set_error(ops[i].c, WEFT_ERR_NO_MEMORY, "%s: no memory for the stream state", fn);
                free(sc);
                return rc;
            }
            nsc++;
        }
    }
    qsort(sc, nsc, sizeof(*sc), cmp_subcomm);
    for (size_t k = 0; k < nsc; k++)
        pthread_mutex_lock(&sc[k].S->mu);

    /* Per comm: its batch, its streams, an event per stream, the thread. */
    for (size_t k = 0; k < nsc && rc == WEFT_SUCCESS; k++) {
        struct subcomm *s = &sc[k];
        struct stream_state *S = s->S;
        size_t nops = 0;
        for (size_t i = 0; i < n; i++)
            nops += ops[i].c == s->c;
        s->st = calloc(nops, sizeof(*s->st));
        s->b = calloc(1, sizeof(*s->b));
        if (s->b) {
            s->b->ops = calloc(nops, sizeof(*s->b->ops));
            s->b->evs = calloc(nops, sizeof(*s->b->evs));
        }
        if (s->st == NULL || s->b == NULL || s->b->ops == NULL || s->b->evs == NULL) {
            rc = weft_set_error(s->c, WEFT_ERR_NO_MEMORY, "%s: no memory", fn);
            break;
        }
        for (size_t i = 0; i < n && rc == WEFT_SUCCESS; i++) {
            const struct gop *g = &ops[i];
            struct sstream *ss = NULL;
            struct sop *op;
            size_t j;
            if (g->c != s->c)
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
                rc = weft_set_error(s->c, WEFT_ERR_NO_MEMORY, "%s: no memory", fn);
                break;
            }
            op->kind = g->kind;
            op->sbuf = g->sbuf;
            op->rbuf = g->rbuf;
            op->bytes = g->bytes;
            op->peer = g->peer;
            op->tag = g->tag;
            op->device = g->device;
            op->ss = ss;
            s->b->ops[s->b->nops++] = op;
        }
        if (rc == WEFT_SUCCESS && !S->thread_started) {
            if (pthread_create(&S->thread, NULL, progress_main, S) != 0)
                rc = weft_set_error(s->c, WEFT_ERR_NO_MEMORY, "%s: cannot start the progress thread", fn);
            else
                S->thread_started = 1;
        }
    }

    /* Phase 1: an event on every stream, before any wait of this submission. */
    for (size_t k = 0; k < nsc && rc == WEFT_SUCCESS; k++)
        for (size_t j = 0; j < sc[k].nst && rc == WEFT_SUCCESS; j++) {
            cudaError_t e = cu->EventRecord(sc[k].st[j].ev.ev, sc[k].st[j].ss->stream);
            if (e != cudaSuccess)
                rc = weft_set_error(sc[k].c, cuda_to_weft(e), "%s: cudaEventRecord on stream %p failed: %s", fn,
                                    (void *)sc[k].st[j].ss->stream, cu->GetErrorString(e));
        }

    if (rc != WEFT_SUCCESS) {
        /* Nothing queued: give back what was taken. */
        for (size_t k = 0; k < nsc; k++) {
            for (size_t j = 0; j < sc[k].nst; j++)
                if (sc[k].st[j].have_ev)
                    event_put(sc[k].S, &sc[k].st[j].ev);
            if (sc[k].b) {
                for (size_t i = 0; i < sc[k].b->nops; i++)
                    free(sc[k].b->ops[i]);
                free(sc[k].b->ops);
                free(sc[k].b->evs);
                free(sc[k].b);
            }
            free(sc[k].st);
        }
        for (size_t k = nsc; k-- > 0;)
            pthread_mutex_unlock(&sc[k].S->mu);
        free(sc);
        return rc;
    }

    /* Phase 2: seqs in call order, one wait per stream, the batches. */
    for (size_t k = 0; k < nsc; k++) {
        struct subcomm *s = &sc[k];
        struct stream_state *S = s->S;
        struct sbatch *b = s->b;
        for (size_t i = 0; i < b->nops; i++) {
            struct sop *op = b->ops[i];
            struct sstream *ss = op->ss;
            op->seq = ++ss->next_seq;
            if (ss->fifo_tail)
                ss->fifo_tail->fifo_next = op;
            else
                ss->fifo_head = op;
            ss->fifo_tail = op;
            for (size_t j = 0; j < s->nst; j++)
                if (s->st[j].ss == ss)
                    s->st[j].last_seq = op->seq;
        }
        for (size_t j = 0; j < s->nst; j++) {
            CUresult r = cu->cuStreamWaitValue32((CUstream)s->st[j].ss->stream, s->st[j].ss->dev,
                                                 s->st[j].last_seq, CU_STREAM_WAIT_VALUE_GEQ);
            if (r != CUDA_SUCCESS && rc == WEFT_SUCCESS) {
                const char *es = NULL;
                cu->cuGetErrorString(r, &es);
                rc = weft_set_error(s->c, WEFT_ERR_TRANSPORT,
                                    "%s: cuStreamWaitValue32 on stream %p failed (%s): the operation runs, "
                                    "but later work on the stream does not wait for it", fn,
                                    (void *)s->st[j].ss->stream, es ? es : "unknown error");
            }
            b->evs[j] = s->st[j].ev;
        }
        b->nevs = s->nst;
        if (S->q_tail)
            S->q_tail->next = b;
        else
            S->q_head = b;
        S->q_tail = b;
        S->outstanding += b->nops;
        pthread_cond_signal(&S->cv);
        free(s->st);
    }
    for (size_t k = nsc; k-- > 0;)
        pthread_mutex_unlock(&sc[k].S->mu);
    free(sc);
    return rc;
}

/* Common front of the three calls: CUDA present, no pending error; then
 * queued at once or recorded in the open group. */
static int enqueue(struct gop *g)
{
    const char *fn = kind_name(g->kind);
    struct stream_state *S;
    const struct weft_cuda *cu;

    if (!g->c->cuda || (cu = weft_cuda_get()) == NULL)
        return weft_set_error(g->c, WEFT_ERR_UNSUPPORTED, "%s: CUDA is not available in this comm (%s)", fn,
                              weft_cuda_why()[0] ? weft_cuda_why() : "no device");
    S = state_of(g->c);
    if (S) {
        int err;
        pthread_mutex_lock(&S->mu);
        err = take_error_locked(S, fn);
        pthread_mutex_unlock(&S->mu);
        if (err != WEFT_SUCCESS)
            return err;
    }
    g->device = 0;
    cu->GetDevice(&g->device);
    if (g_depth > 0) {
        if (g_n == g_cap) {
            size_t cap = g_cap ? 2 * g_cap : 16;
            struct gop *p = realloc(g_ops, cap * sizeof(*p));
            if (p == NULL)
                return weft_set_error(g->c, WEFT_ERR_NO_MEMORY, "%s: no memory for the group", fn);
            g_ops = p;
            g_cap = cap;
        }
        g_ops[g_n++] = *g;
        return WEFT_SUCCESS;
    }
    return submit(g, 1, fn);
}

int weft_send_on_stream(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream)
{
    struct gop g = { c, SOP_SEND, buf, NULL, bytes, peer, tag, stream, 0 };
    int rc = check_p2p(c, buf, bytes, peer, tag, "weft_send_on_stream");
    return rc != WEFT_SUCCESS ? rc : enqueue(&g);
}

int weft_recv_on_stream(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream)
{
    struct gop g = { c, SOP_RECV, NULL, buf, bytes, peer, tag, stream, 0 };
    int rc = check_p2p(c, buf, bytes, peer, tag, "weft_recv_on_stream");
    return rc != WEFT_SUCCESS ? rc : enqueue(&g);
}

int weft_allgather_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                             struct CUstream_st *stream)
{
    struct gop g = { c, SOP_ALLGATHER, sendbuf, recvbuf, bytes_per_rank, -1, -1, stream, 0 };
    int rc = check_allgather(c, sendbuf, recvbuf, bytes_per_rank);
    if (rc != WEFT_SUCCESS)
        return rc;
    if (bytes_per_rank == 0) {
        /* Nothing moves on any rank (all pass 0): only the CUDA check. */
        if (!c->cuda)
            return weft_set_error(c, WEFT_ERR_UNSUPPORTED,
                                  "weft_allgather_on_stream: CUDA is not available in this comm");
        return WEFT_SUCCESS;
    }
    return enqueue(&g);
}

int weft_group_end(void)
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

int weft_stream_comm_quiesce(struct weft_comm *c)
{
    struct stream_state *S = c ? state_of(c) : NULL;
    int rc = WEFT_SUCCESS;
    pthread_t thread;

    if (S == NULL)
        return WEFT_SUCCESS;
    pthread_mutex_lock(&S->mu);
    if (!S->thread_started) {
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
        if (c->cfg.timeout_s > 0 && now - t0 > c->cfg.timeout_s) {
            rc = weft_set_error(c, WEFT_ERR_TIMEOUT,
                                "weft_comm_destroy: %zu stream-ordered operation(s) still not complete after %.0f s "
                                "without progress; dropped, their streams released",
                                S->outstanding, c->cfg.timeout_s);
            S->abandon = 1;
            break;
        }
        timed_wait(&S->idle_cv, &S->mu, 100000);
    }
    if (rc == WEFT_SUCCESS)
        rc = take_error_locked(S, "weft_comm_destroy");
    S->stop = 1;
    pthread_cond_signal(&S->cv);
    thread = S->thread;
    S->thread_started = 0;
    pthread_mutex_unlock(&S->mu);
    pthread_join(thread, NULL);
    return rc;
}

void weft_stream_comm_fini(struct weft_comm *c)
{
    struct stream_state *S = c ? state_of(c) : NULL;
    const struct weft_cuda *cu = weft_cuda_get();
    int running;

    if (S == NULL)
        return;
    pthread_mutex_lock(&S->mu);
    running = S->thread_started;
    pthread_mutex_unlock(&S->mu);
    if (running)
        weft_stream_comm_quiesce(c);
    pthread_mutex_lock(&S->mu);
    abandon_all(S);   /* nothing left normally; frees stragglers otherwise */
    pthread_mutex_unlock(&S->mu);
    for (size_t i = 0; i < S->nevpool; i++)
        cu->EventDestroy(S->evpool[i].ev);
    free(S->evpool);
    while (S->streams) {
        struct sstream *ss = S->streams;
        S->streams = ss->next;
        free(ss);
    }
    while (S->chunks) {
        struct schunk *ch = S->chunks;
        S->chunks = ch->next;
        pthread_mutex_lock(&chunk_pool_lock);
        ch->next = chunk_pool;
        chunk_pool = ch;
        pthread_mutex_unlock(&chunk_pool_lock);
    }
    pthread_cond_destroy(&S->cv);
    pthread_cond_destroy(&S->idle_cv);
    pthread_mutex_destroy(&S->mu);
    free(S);
    __atomic_store_n((struct stream_state **)&c->stream_state, NULL, __ATOMIC_RELEASE);
}

#else /* !WEFT_HAVE_CUDA_HEADERS: no CUDA at all, every call is unsupported */

static int no_cuda(weft_comm_t *c, const char *fn)
{
    return weft_set_error(c, WEFT_ERR_UNSUPPORTED, "%s: weft was built without CUDA", fn);
}

int weft_send_on_stream(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream)
{
    int rc = check_p2p(c, buf, bytes, peer, tag, "weft_send_on_stream");
    (void)stream;
    return rc != WEFT_SUCCESS ? rc : no_cuda(c, "weft_send_on_stream");
}

int weft_recv_on_stream(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream)
{
    int rc = check_p2p(c, buf, bytes, peer, tag, "weft_recv_on_stream");
    (void)stream;
    return rc != WEFT_SUCCESS ? rc : no_cuda(c, "weft_recv_on_stream");
}

int weft_allgather_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                             struct CUstream_st *stream)
{
    int rc = check_allgather(c, sendbuf, recvbuf, bytes_per_rank);
    (void)stream;
    return rc != WEFT_SUCCESS ? rc : no_cuda(c, "weft_allgather_on_stream");
}

int weft_group_end(void)
{
    if (g_depth <= 0)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_group_end: no matching weft_group_start");
    g_depth--;
    return WEFT_SUCCESS;
}

int  weft_stream_comm_quiesce(struct weft_comm *c) { (void)c; return WEFT_SUCCESS; }
void weft_stream_comm_fini(struct weft_comm *c) { (void)c; }
int  weft_stream_take_error(struct weft_comm *c) { (void)c; return WEFT_SUCCESS; }

#endif /* WEFT_HAVE_CUDA_HEADERS */
