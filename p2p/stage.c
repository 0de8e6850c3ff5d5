/*
 * Staged transfers of device buffers through pinned host chunks: the
 * protocol, lanes, pipelining and failure rules are in stage.h.
 *
 * An op is one side (send or receive) of one staged message. Its chunks
 * in flight live in op->ch[] (at most WEFT_CUDA_STAGE_SLOTS of them), each
 * in one phase:
 *
 *   sender:   COPY_IN (D2H into a send slot; a host sender or a failed op
 *             skips it) -> NET (isend of the slot / of the user buffer / of
 *             0 bytes after a failure; issued strictly in chunk order)
 *   receiver: NET (irecv into a receive slot / the user buffer) ->
 *             COPY_OUT (H2D from the slot into place; device receiver)
 *
 * Copies run on weft's own non-blocking stream, each followed by an event
 * of its slot; progress polls the events (cudaEventQuery), never blocks.
 */
#include "stage.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "cudawrap.h"
#include "devcopy.h"
#include "log.h"
#include "pipe.h"
#include "rndv.h"
#include "tags.h"

#ifdef WEFT_HAVE_CUDA_HEADERS
typedef cudaStream_t stage_stream_t;
typedef cudaEvent_t  stage_event_t;
#else
typedef void *stage_stream_t;
typedef void *stage_event_t;
#endif

enum { CH_FREE = 0, CH_COPY_IN, CH_NET, CH_COPY_OUT };

/* The staged path's CTS key: which lane the chunks travel on, how long. */
struct stage_key {
    uint32_t lane;       /* k: chunks on tag weft_tag_stage(k) */
    uint32_t chunk;      /* bytes per chunk (the last one shorter) */
};

struct stage_chunk {
    int                  phase;
    int                  slot;     /* pool slot, -1 = none (host buffer, or 0-byte failure message) */
    int                  copying;  /* a copy + event is queued for this chunk */
    size_t               idx;
    size_t               len;
    struct weft_request *req;      /* NET: the chunk's message */
};

struct stage_op {
    struct weft_list     link;     /* stage_state.ops */
    struct weft_peer_pipe    *p;
    struct weft_request *user;     /* NULL once the pipe broke (the pipe failed it) */
    int                  send;     /* 1: sender side */
    int                  dev;      /* user buffer is device memory: chunks go through slots */
    int                  aborted;
    int                  err;      /* first failure, WEFT_SUCCESS while none */
    char                *buf;
    size_t               bytes, chunk, nchunks;
    int                  tag;
    int                  cts_pending;  /* receiver: CTS waits for the anchor slot */
    struct weft_wire_hdr rts;          /* receiver: what the CTS answers */
    struct stage_key     key;          /* receiver: what the CTS carries */
    size_t               next_start;   /* next chunk to begin */
    size_t               next_net;     /* sender: next chunk whose isend is due */
    size_t               finished;     /* chunks done */
    int                  held;         /* slots held (in chunks + spare) */
    int                  spare;        /* slot kept between chunks (the anchor), -1 = none */
    int                  cap;
    struct stage_chunk   ch[];
};

struct stage_pool {
    char           *mem;       /* n slots of `chunk` bytes, pinned */
    int             n, nfree;
    int            *freelist;
    stage_event_t  *ev;        /* one per slot */
    int             waiting;   /* ops waiting for their anchor (this pass) */
    int             failed;    /* allocation failed once: do not retry on every op */
};

struct stage_state {
    struct weft_p2p  *p2p;
    struct weft_core *core;
    int               cuda;    /* weft's stream exists (core/devcopy.c) */
    stage_stream_t    stream;
    size_t            chunk;
    int               nslots;
    struct stage_pool send, recv;
    struct weft_list  ops;
    size_t            nops;
    int               copies;  /* copies queued, not yet seen complete */
    int               in_progress;
};

/* ------------------------------------------------------------ CUDA calls */

#ifdef WEFT_HAVE_CUDA_HEADERS
static const struct weft_cuda *cu(void) { return weft_cuda_get(); }

static const char *cu_str(int e)
{
    const struct weft_cuda *t = cu();
    return t ? t->GetErrorString((cudaError_t)e) : "CUDA not loaded";
}

/* Clears the calling thread's last CUDA error after a failure we report,
 * so it does not surface in the application's next CUDA call. */
static void cu_clear(void)
{
    const struct weft_cuda *t = cu();
    if (t)
        t->GetLastError();
}

static int cu_copy(struct stage_state *st, void *dst, const void *src, size_t n)
{
    return (int)cu()->MemcpyAsync(dst, src, n, cudaMemcpyDefault, st->stream);
}

static int cu_record(struct stage_state *st, stage_event_t ev)
{
    return (int)cu()->EventRecord(ev, st->stream);
}

/* 0: complete, 1: not yet, else the CUDA error. */
static int cu_query(stage_event_t ev)
{
    cudaError_t e = cu()->EventQuery(ev);
    return e == cudaSuccess ? 0 : e == cudaErrorNotReady ? 1 : (int)e;
}

static int cu_sync(struct stage_state *st)
{
    return (int)cu()->StreamSynchronize(st->stream);
}
#else
static const char *cu_str(int e) { (void)e; return "weft built without CUDA"; }
static void cu_clear(void) {}
static int cu_copy(struct stage_state *st, void *dst, const void *src, size_t n)
{
    (void)st; (void)dst; (void)src; (void)n;
    return -1;
}
static int cu_record(struct stage_state *st, stage_event_t ev) { (void)st; (void)ev; return -1; }
static int cu_query(stage_event_t ev) { (void)ev; return -1; }
static int cu_sync(struct stage_state *st) { (void)st; return -1; }
#endif

/* --------------------------------------------------------------- state */

/* The state, created on first use (also in a comm without CUDA: a host
 * buffer talking to a peer's device buffer needs no CUDA here). */
static struct stage_state *state_get(struct weft_p2p *p2p)
{
    struct stage_state *st = p2p->stage;
    if (st != NULL)
        return st;
    st = calloc(1, sizeof(*st));
    if (st == NULL)
        return NULL;
    st->p2p = p2p;
    st->core = p2p->core;
    st->chunk = p2p->core->cfg.cuda_stage_chunk;
    st->nslots = p2p->core->cfg.cuda_stage_slots;
    weft_list_init(&st->ops);
#ifdef WEFT_HAVE_CUDA_HEADERS
    st->stream = (stage_stream_t)weft_devcopy_stream(p2p->core);
    st->cuda = st->stream != NULL;
#endif
    p2p->stage = st;
    return st;
}

__attribute__((unused)) static void pool_free(struct stage_state *st, struct stage_pool *pl)
{
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (pl->ev) {
        for (int i = 0; i < pl->n; i++)
            if (pl->ev[i])
                cu()->EventDestroy(pl->ev[i]);
    }
    if (pl->mem)
        cu()->FreeHost(pl->mem);
#endif
    (void)st;
    free(pl->ev);
    free(pl->freelist);
    memset(pl, 0, sizeof(*pl));
}

static void op_free_requests(struct stage_op *op)
{
    for (int i = 0; i < op->cap; i++)
        if (op->ch[i].phase != CH_FREE && op->ch[i].req) {
            weft_req_free(op->ch[i].req);
            op->ch[i].req = NULL;
        }
}

void weft_stage_fini(struct weft_p2p *p2p)
{
    struct stage_state *st = p2p->stage;
    if (st == NULL)
        return;
    if (st->cuda)
        cu_sync(st);   /* nothing may still write into the pools */
    struct weft_list *n;
    while ((n = weft_list_pop(&st->ops)) != NULL) {
        struct stage_op *op = weft_container_of(n, struct stage_op, link);
        op_free_requests(op);
        free(op);
    }
    pool_free(st, &st->send);
    pool_free(st, &st->recv);
    cu_clear();
    free(st);
    p2p->stage = NULL;
}

static int stage_busy(struct weft_p2p *p2p)
{
    const struct stage_state *st = p2p->stage;
    return st && !weft_list_empty(&st->ops);
}

/* A copy on weft's stream ends without a knock: waiters must poll. */
static int stage_wakeless(struct weft_p2p *p2p)
{
    const struct stage_state *st = p2p->stage;
    return st && st->copies > 0;
}

/* ----------------------------------------------------------- slot pools */

/* allowed: cudaMallocHost may wait for the device here (the caller's
 * thread, weft_stage_prepare), else only when no stream waits on weft. */
static int pool_ensure(struct stage_state *st, struct stage_pool *pl, const char *side, int allowed)
{
    if (pl->mem)
        return WEFT_SUCCESS;
    if (pl->failed || !st->cuda)
        return WEFT_ERR_NO_MEMORY;
#ifdef WEFT_HAVE_CUDA_HEADERS
    size_t bytes = (size_t)st->nslots * st->chunk;
    if (!allowed && !weft_cuda_may_sync_in_progress())
        return weft_set_error(st->core, WEFT_ERR_NO_MEMORY, "cuda: the %s staging slots are needed while a stream "
                              "waits on weft, where cudaMallocHost (which waits for the device) would wait for "
                              "itself; they are allocated at weft_comm_create (weft_p2p_prepare_device)", side);
    void *mem = NULL;
    int entered = weft_devcopy_enter(st->core);   /* the events on weft's stream's device */
    cudaError_t e = cu()->MallocHost(&mem, bytes);
    if (e != cudaSuccess) {
        weft_devcopy_leave(st->core, entered);
        cu_clear();
        pl->failed = 1;
        return weft_set_error(st->core, WEFT_ERR_NO_MEMORY, "cuda: cudaMallocHost of %zu bytes for the %s staging "
                              "slots (WEFT_CUDA_STAGE_SLOTS x WEFT_CUDA_STAGE_CHUNK) failed: %s", bytes, side,
                              cu_str(e));
    }
    pl->freelist = calloc((size_t)st->nslots, sizeof(*pl->freelist));
    pl->ev = calloc((size_t)st->nslots, sizeof(*pl->ev));
    if (pl->freelist == NULL || pl->ev == NULL) {
        weft_devcopy_leave(st->core, entered);
        cu()->FreeHost(mem);
        free(pl->freelist);
        free(pl->ev);
        pl->freelist = NULL;
        pl->ev = NULL;
        return weft_set_error(st->core, WEFT_ERR_NO_MEMORY, "cuda: no memory for the %s staging slots", side);
    }
    pl->n = st->nslots;
    /* Recorded on weft's stream: made in its context ("event and stream
     * must be on the same device"), whatever device this thread is on. */
    for (int i = 0; i < pl->n; i++) {
        e = cu()->EventCreateWithFlags(&pl->ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            weft_devcopy_leave(st->core, entered);
            cu_clear();
            pl->mem = mem;
            pool_free(st, pl);
            pl->failed = 1;
            return weft_set_error(st->core, WEFT_ERR_UNSUPPORTED, "cuda: cudaEventCreateWithFlags failed: %s",
                                  cu_str(e));
        }
    }
    weft_devcopy_leave(st->core, entered);
    for (int i = 0; i < pl->n; i++)
        pl->freelist[i] = pl->n - 1 - i;
    pl->nfree = pl->n;
    pl->mem = mem;
    return WEFT_SUCCESS;
#else
    (void)side;
    return WEFT_ERR_UNSUPPORTED;
#endif
}

void weft_stage_prepare(struct weft_p2p *p2p)
{
    struct stage_state *st = state_get(p2p);
    if (st == NULL || !st->cuda)
        return;
    (void)pool_ensure(st, &st->send, "send", weft_cuda_may_sync());
    (void)pool_ensure(st, &st->recv, "receive", weft_cuda_may_sync());
}

static struct stage_pool *pool_of(struct stage_state *st, const struct stage_op *op)
{
    return op->send ? &st->send : &st->recv;
}

static char *slot_mem(struct stage_state *st, const struct stage_op *op, int slot)
{
    return pool_of(st, op)->mem + (size_t)slot * st->chunk;
}

/* A slot for op's next chunk, or -1. The anchor (an op's first slot) goes
 * to waiting ops first; more only while no op waits for its anchor. */
static int slot_take(struct stage_state *st, struct stage_op *op)
{
    struct stage_pool *pl = pool_of(st, op);
    int s;

    if (op->spare >= 0) {
        s = op->spare;
        op->spare = -1;
        return s;
    }
    if (pl->nfree == 0 || (op->held > 0 && pl->waiting > 0))
        return -1;
    if (op->held == 0 && pl->waiting > 0)
        pl->waiting--;
    s = pl->freelist[--pl->nfree];
    op->held++;
    return s;
}

static int op_needs_slots(const struct stage_op *op)
{
    if (!op->dev || op->aborted)
        return 0;
    if (op->send)
        return op->err == WEFT_SUCCESS && op->next_start < op->nchunks;
    return op->cts_pending || op->next_start < op->nchunks;
}

/* Gives a chunk's slot back; the op keeps its last one while it still has
 * chunks to start, so it never has to wait for an anchor again. */
static void slot_put(struct stage_state *st, struct stage_op *op, int slot)
{
    struct stage_pool *pl = pool_of(st, op);
    if (slot < 0)
        return;
    if (op->spare < 0 && op->held == 1 && op_needs_slots(op)) {
        op->spare = slot;
        return;
    }
    pl->freelist[pl->nfree++] = slot;
    op->held--;
}

/* ------------------------------------------------------------------- ops */

static const char *side_name(const struct stage_op *op)
{
    return op->send ? "send to" : "recv from";
}

static void op_fail(struct stage_op *op, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void op_fail(struct stage_op *op, int err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    if (op->err != WEFT_SUCCESS)
        return;
    op->err = err;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    weft_set_error(op->p->p2p->core, err, "%s peer %d tag %d: staged transfer of %zu bytes: %s", side_name(op),
                   op->p->peer, op->user ? op->user->tag : 0, op->bytes, msg);
}

static struct stage_op *op_new(struct stage_state *st, struct weft_peer_pipe *p, struct weft_request *user, int send,
                               size_t chunk, int tag)
{
    int cap = st->nslots > 0 ? st->nslots : 1;
    struct stage_op *op = calloc(1, sizeof(*op) + (size_t)cap * sizeof(op->ch[0]));
    if (op == NULL)
        return NULL;
    op->p = p;
    op->user = user;
    op->send = send;
    op->dev = weft_mem_is_device(user->xfer.mem_kind);
    op->buf = user->xfer.buf;
    op->bytes = send ? user->bytes : user->msg_bytes;
    op->chunk = chunk;
    op->nchunks = (op->bytes + chunk - 1) / chunk;
    op->tag = tag;
    op->spare = -1;
    op->cap = cap;
    user->path_state = op;
    weft_list_add_tail(&st->ops, &op->link);
    st->nops++;
    st->p2p->path_ops++;
    return op;
}

static void op_unlink_free(struct stage_state *st, struct stage_op *op)
{
    struct stage_pool *pl = pool_of(st, op);
    if (op->spare >= 0) {
        pl->freelist[pl->nfree++] = op->spare;
        op->held--;
        op->spare = -1;
    }
    weft_list_del(&op->link);
    st->nops--;
    st->p2p->path_ops--;
    if (op->user)
        op->user->path_state = NULL;
    free(op);
}

static struct stage_chunk *chunk_free_entry(struct stage_op *op)
{
    for (int i = 0; i < op->cap; i++)
        if (op->ch[i].phase == CH_FREE)
            return &op->ch[i];
    return NULL;
}

static size_t chunk_len(const struct stage_op *op, size_t idx)
{
    size_t off = idx * op->chunk;
    return op->bytes - off < op->chunk ? op->bytes - off : op->chunk;
}

/* A chunk is done: its slot goes back, the op counts it. */
static void chunk_retire(struct stage_state *st, struct stage_op *op, struct stage_chunk *e)
{
    int slot = e->slot;
    e->phase = CH_FREE;
    e->slot = -1;
    e->req = NULL;
    op->finished++;
    slot_put(st, op, slot);
}

/* Starts the chunk's message; a failure to start breaks the pipe (the
 * lane's chunk order could not be kept). Returns 0, or -1 when broken. */
static int chunk_net(struct stage_op *op, struct stage_chunk *e, void *buf, size_t len)
{
    struct weft_peer_pipe *p = op->p;
    int rc = op->send ? weft_pipe_isend(p, buf, len, op->tag, WEFT_MEM_HOST, -1, NULL, &e->req)
                      : weft_pipe_irecv(p, buf, len, op->tag, WEFT_MEM_HOST, -1, NULL, &e->req);
    if (rc != WEFT_SUCCESS) {
        e->req = NULL;
        weft_pipe_break(p, rc);
        return -1;
    }
    e->phase = CH_NET;
    return 0;
}

/* Aborted op: waits for what is still out, then goes away (its user request
 * was failed by the pipe). */
static int op_reap(struct stage_state *st, struct stage_op *op)
{
    int busy = 0;
    for (int i = 0; i < op->cap; i++) {
        struct stage_chunk *e = &op->ch[i];
        if (e->phase == CH_FREE)
            continue;
        if (e->copying) {
            if (cu_query(pool_of(st, op)->ev[e->slot]) == 1) {
                busy = 1;
                continue;
            }
            e->copying = 0;
            st->copies--;
        }
        if (e->req) {
            if (e->req->state != WEFT_REQ_DONE) {
                busy = 1;
                continue;
            }
            weft_req_free(e->req);
            e->req = NULL;
        }
        chunk_retire(st, op, e);
    }
    if (busy)
        return 0;
    op_unlink_free(st, op);
    return 1;
}

/* The op is complete: the user request too, the lane goes. */
static int op_finish(struct stage_state *st, struct stage_op *op)
{
    struct weft_peer_pipe *p = op->p;
    struct weft_request *u = op->user;
    int err = op->err, tag = op->tag, send = op->send;

    op_unlink_free(st, op);
    if (!send && !p->broken)
        weft_pipe_lane_release(p, tag);
    if (u) {
        u->path_state = NULL;
        weft_pipe_finish_inflight(p, u, err);
    }
    return 1;
}

static int send_step(struct stage_state *st, struct stage_op *op)
{
    struct stage_pool *pl = pool_of(st, op);
    int n = 0;

    /* Completed isends. */
    for (int i = 0; i < op->cap; i++) {
        struct stage_chunk *e = &op->ch[i];
        if (e->phase != CH_NET || e->req->state != WEFT_REQ_DONE)
            continue;
        int err = e->req->status.error;
        weft_req_free(e->req);
        e->req = NULL;
        if (err != WEFT_SUCCESS)
            op_fail(op, err, "chunk %zu of %zu did not go out: %s", e->idx, e->len, weft_err_str(err));
        chunk_retire(st, op, e);
        n++;
    }
    /* New chunks: D2H into a slot (device, no failure yet), else nothing to copy. */
    while (op->next_start < op->nchunks) {
        struct stage_chunk *e = chunk_free_entry(op);
        int slot = -1;
        if (e == NULL)
            break;
        if (op->dev && op->err == WEFT_SUCCESS) {
            slot = slot_take(st, op);
            if (slot < 0)
                break;
        }
        e->phase = CH_COPY_IN;
        e->slot = slot;
        e->idx = op->next_start++;
        e->len = op->err == WEFT_SUCCESS ? chunk_len(op, e->idx) : 0;
        e->copying = 0;
        if (slot >= 0) {
            int ce = cu_copy(st, slot_mem(st, op, slot), op->buf + e->idx * op->chunk, e->len);
            if (ce == 0)
                ce = cu_record(st, pl->ev[slot]);
            if (ce != 0) {
                cu_clear();
                op_fail(op, WEFT_ERR_TRANSPORT, "device-to-host copy of chunk %zu (%zu bytes at offset %zu) "
                        "failed: %s", e->idx, e->len, e->idx * op->chunk, cu_str(ce));
            } else {
                e->copying = 1;
                st->copies++;
            }
        }
        n++;
    }
    /* Isends in chunk order, each once its copy is done. */
    for (;;) {
        struct stage_chunk *e = NULL;
        for (int i = 0; i < op->cap && e == NULL; i++)
            if (op->ch[i].phase == CH_COPY_IN && op->ch[i].idx == op->next_net)
                e = &op->ch[i];
        if (e == NULL)
            break;
        if (e->copying) {
            int q = cu_query(pl->ev[e->slot]);
            if (q == 1)
                break;
            e->copying = 0;
            st->copies--;
            if (q != 0) {
                cu_clear();
                op_fail(op, WEFT_ERR_TRANSPORT, "device-to-host copy of chunk %zu (%zu bytes at offset %zu) "
                        "failed: %s", e->idx, e->len, e->idx * op->chunk, cu_str(q));
            }
        }
        void *src;
        size_t len = e->len;
        if (op->err != WEFT_SUCCESS) {
            /* Tell the receiver: every chunk from here on is empty. */
            int slot = e->slot;
            e->slot = -1;
            slot_put(st, op, slot);
            src = NULL;
            len = 0;
        } else {
            src = e->slot >= 0 ? slot_mem(st, op, e->slot) : op->buf + e->idx * op->chunk;
        }
        e->len = len;
        op->next_net++;
        n++;
        if (chunk_net(op, e, src, len) != 0)
            return n;
    }
    return n;
}

static int recv_step(struct stage_state *st, struct stage_op *op)
{
    struct stage_pool *pl = pool_of(st, op);
    int n = 0;

    for (int i = 0; i < op->cap; i++) {
        struct stage_chunk *e = &op->ch[i];
        if (e->phase == CH_NET) {
            if (e->req->state != WEFT_REQ_DONE)
                continue;
            weft_status_t s = e->req->status;
            weft_req_free(e->req);
            e->req = NULL;
            n++;
            if (s.error != WEFT_SUCCESS) {
                op_fail(op, s.error, "chunk %zu did not arrive: %s", e->idx, weft_err_str(s.error));
            } else if (s.bytes != e->len) {
                op_fail(op, WEFT_ERR_TRANSPORT,
                        "the sender failed to stage its data (chunk %zu came with %zu of %zu bytes)", e->idx,
                        s.bytes, e->len);
            } else if (e->slot >= 0 && op->err == WEFT_SUCCESS) {
                int ce = cu_copy(st, op->buf + e->idx * op->chunk, slot_mem(st, op, e->slot), e->len);
                if (ce == 0)
                    ce = cu_record(st, pl->ev[e->slot]);
                if (ce == 0) {
                    e->copying = 1;
                    st->copies++;
                    e->phase = CH_COPY_OUT;
                    continue;
                }
                cu_clear();
                op_fail(op, WEFT_ERR_TRANSPORT, "host-to-device copy of chunk %zu (%zu bytes at offset %zu) "
                        "failed: %s", e->idx, e->len, e->idx * op->chunk, cu_str(ce));
            }
            chunk_retire(st, op, e);
        } else if (e->phase == CH_COPY_OUT) {
            int q = cu_query(pl->ev[e->slot]);
            if (q == 1)
                continue;
            e->copying = 0;
            st->copies--;
            if (q != 0) {
                cu_clear();
                op_fail(op, WEFT_ERR_TRANSPORT, "host-to-device copy of chunk %zu (%zu bytes at offset %zu) "
                        "failed: %s", e->idx, e->len, e->idx * op->chunk, cu_str(q));
            }
            chunk_retire(st, op, e);
            n++;
        }
    }
    /* Receives in chunk order: into a slot (device) or straight into place. */
    while (op->next_start < op->nchunks) {
        struct stage_chunk *e = chunk_free_entry(op);
        int slot = -1;
        if (e == NULL)
            break;
        if (op->dev) {
            slot = slot_take(st, op);
            if (slot < 0)
                break;
        }
        e->slot = slot;
        e->idx = op->next_start++;
        e->len = chunk_len(op, e->idx);
        e->copying = 0;
        n++;
        if (chunk_net(op, e, slot >= 0 ? slot_mem(st, op, slot) : op->buf + e->idx * op->chunk, e->len) != 0) {
            e->phase = CH_FREE;
            slot_put(st, op, slot);
            return n;
        }
    }
    return n;
}

static int op_step(struct stage_state *st, struct stage_op *op)
{
    int n = 0;

    if (op->aborted)
        return op_reap(st, op);
    if (op->cts_pending) {
        if (op->dev) {
            int slot = slot_take(st, op);
            if (slot < 0)
                return 0;
            op->spare = slot;   /* the anchor */
        }
        op->cts_pending = 0;
        weft_rndv_send_cts(op->p, op->user, &op->rts, &weft_rndv_staged, &op->key, sizeof(op->key));
        n++;
        if (op->aborted)
            return n;
    }
    n += op->send ? send_step(st, op) : recv_step(st, op);
    if (op->aborted)
        return n;
    if (op->finished == op->nchunks)
        n += op_finish(st, op);
    return n;
}

/* Counts, per pool, the ops that wait for their anchor. */
static void count_waiting(struct stage_state *st)
{
    st->send.waiting = st->recv.waiting = 0;
    weft_list_for_each(ln, &st->ops) {
        struct stage_op *op = weft_container_of(ln, struct stage_op, link);
        if (op->held == 0 && op_needs_slots(op))
            pool_of(st, op)->waiting++;
    }
}

static int stage_progress(struct weft_p2p *p2p)
{
    struct stage_state *st = p2p->stage;
    int n = 0;

    if (st == NULL || weft_list_empty(&st->ops) || st->in_progress)
        return 0;
    st->in_progress = 1;
    count_waiting(st);
    weft_list_for_each(ln, &st->ops)
        n += op_step(st, weft_container_of(ln, struct stage_op, link));
    st->in_progress = 0;
    return n;
}

/* ----------------------------------------------------------- start/abort */

/* A device sender tells the receiver its slot size (the receiver stages in
 * chunks no larger than what the sender's slots hold). */
static void staged_rts_fill(const struct weft_peer_pipe *p, const struct weft_request *s, struct weft_wire_hdr *rts)
{
    size_t chunk = p->p2p->core->cfg.cuda_stage_chunk;
    if (weft_mem_is_device(s->xfer.mem_kind))
        rts->aux = (uint32_t)(chunk > UINT32_MAX ? UINT32_MAX : chunk);
}

static int staged_applies(const struct weft_peer_pipe *p, const struct weft_request *r, const struct weft_wire_hdr *rts)
{
    (void)p;
    if ((rts->flags & WEFT_WIRE_F_IOV) || r->xfer.niov)
        return 0;   /* vectored messages are host memory, moved by the carrier */
    return (rts->flags & WEFT_WIRE_F_DEVICE) || weft_mem_is_device(r->xfer.mem_kind);
}

/* Receiver: the message goes staged. The CTS goes now or once the op has
 * its anchor slot. */
static int staged_recv_start(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *rts)
{
    struct weft_core *core = p->p2p->core;
    struct stage_state *st = state_get(p->p2p);
    struct stage_op *op;
    size_t chunk = core->cfg.cuda_stage_chunk;
    uint32_t k;
    int dev = weft_mem_is_device(r->xfer.mem_kind);

    if (st == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "recv from peer %d tag %d: no memory for the staging state",
                              p->peer, r->tag);
    if (rts->aux != 0 && rts->aux < chunk)
        chunk = rts->aux;   /* the sender's slots are smaller */
    if (dev) {
        int rc = pool_ensure(st, &st->recv, "receive", 0);
        if (rc != WEFT_SUCCESS)
            return rc;
    }
    k = p->stage_lane_next++;
    op = op_new(st, p, r, 0, chunk, weft_tag_stage(k));
    if (op == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "recv from peer %d tag %d: no memory for a staged transfer",
                              p->peer, r->tag);
    weft_pipe_activate(p, r);
    op->rts = *rts;
    op->key.lane = k % WEFT_TAG_STAGE_COUNT;
    op->key.chunk = (uint32_t)chunk;
    op->cts_pending = 1;
    WEFT_TRACE(core->rank, "recv from peer %d tag %d: %llu bytes staged (%s buffer, sender %s) on lane %d, %zu chunks "
               "of %zu", p->peer, r->tag, (unsigned long long)rts->bytes, dev ? "device" : "host",
               (rts->flags & WEFT_WIRE_F_DEVICE) ? "device" : "host", op->tag, op->nchunks, chunk);
    if (!st->in_progress)
        op_step(st, op);
    return WEFT_SUCCESS;
}

/* Sender: the receiver's CTS naming the staged path arrived for s. */
static void staged_send_start(struct weft_peer_pipe *p, struct weft_request *s, const struct weft_wire_hdr *cts,
                              const void *key, size_t keylen)
{
    struct weft_core *core = p->p2p->core;
    struct stage_state *st = state_get(p->p2p);
    struct stage_op *op;
    struct stage_key k = { 0, 0 };
    int dev = weft_mem_is_device(s->xfer.mem_kind), rc = WEFT_SUCCESS;

    if (keylen == sizeof(k))
        memcpy(&k, key, sizeof(k));
    if (st == NULL)
        rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "send to peer %d tag %d: no memory for the staging state",
                            p->peer, s->tag);
    else if (keylen != sizeof(k) || k.chunk == 0 || cts->bytes != s->bytes || (dev && k.chunk > st->chunk))
        rc = weft_set_error(core, WEFT_ERR_INTERNAL, "send to peer %d tag %d: staged CTS for %llu bytes in chunks "
                            "of %u does not fit this %zu-byte send (protocol error)", p->peer, s->tag,
                            (unsigned long long)cts->bytes, k.chunk, s->bytes);
    if (rc == WEFT_SUCCESS) {
        op = op_new(st, p, s, 1, k.chunk, weft_tag_stage(k.lane));
        if (op == NULL) {
            rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "send to peer %d tag %d: no memory for a staged transfer",
                                p->peer, s->tag);
        } else {
            if (dev && pool_ensure(st, &st->send, "send", 0) != WEFT_SUCCESS)
                op_fail(op, WEFT_ERR_NO_MEMORY, "no pinned staging memory");   /* the receiver gets empty chunks */
            if (!st->in_progress)
                op_step(st, op);
        }
    }
    if (rc != WEFT_SUCCESS)
        weft_pipe_break(p, rc);
}

/* The pipe broke: every op of the pipe lets go of its request (the pipe
 * fails them); copies in flight are waited for. */
static void staged_abort_pipe(struct weft_peer_pipe *p)
{
    struct stage_state *st = p->p2p->stage;
    int copying = 0;

    if (st == NULL)
        return;
    weft_list_for_each(ln, &st->ops) {
        struct stage_op *op = weft_container_of(ln, struct stage_op, link);
        if (op->p != p || op->aborted)
            continue;
        op->aborted = 1;
        if (op->user) {
            op->user->path_state = NULL;
            op->user = NULL;
        }
        for (int i = 0; i < op->cap; i++)
            copying |= op->ch[i].copying;
    }
    /* Copies into or out of the user's buffer end before its request fails. */
    if (copying && st->cuda && cu_sync(st) != 0)
        cu_clear();
}

/* Chunks move as ordinary messages of the pipe: no transport completes
 * this path's transfers. */
static void staged_xfer_done(struct weft_peer_pipe *p, struct weft_request *r, int err)
{
    weft_pipe_finish_inflight(p, r, err);
}

const struct weft_rndv_path weft_rndv_staged = {
    .name = "staged",
    .rts_fill = staged_rts_fill,
    .applies = staged_applies,
    .recv_start = staged_recv_start,
    .send_start = staged_send_start,
    .xfer_done = staged_xfer_done,
    .progress = stage_progress,
    .busy = stage_busy,
    .wakeless = stage_wakeless,
    .abort_pipe = staged_abort_pipe,
};
