/*
 * CUDA IPC path between ranks of one node (protocol and conventions in
 * cuda_ipc.h; the mapping cache in cuda_ipc_cache.c).
 *
 * Receiver: eligible() decides, export() fills the CTS payload with the IPC
 * handle of the receive buffer's allocation (handles cached per (base,
 * buffer id), so a buffer used again costs no cudaIpcGetMemHandle) and the
 * semaphore value n of this message.
 *
 * Sender: push() maps the receiver's allocation through the import cache,
 * queues on weft's internal stream of the source buffer's device
 *   cudaMemcpyAsync(peer_base + offset, sbuf, bytes, DeviceToDevice)
 *   cuStreamWriteValue32(peer semaphore word, n)
 *   cudaEventRecord(ev)
 * and progress() polls the events: a finished copy releases its mapping
 * reference, sends FIN (straight to the transport; when it has no room the
 * FIN waits here and is retried on the next progress) and completes the
 * send. A failure (open, copy) fails the send with WEFT_ERR_TRANSPORT and
 * the FIN carries the same code to the receiver.
 */
#include "cuda_ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "cuda_ipc_cache.h"
#include "cudawrap.h"
#include "log.h"
#include "pipe.h"
#include "transport.h"

_Static_assert(sizeof(struct weft_cuda_ipc_payload) == 120, "CTS payload layout");
_Static_assert(sizeof(struct weft_cuda_ipc_payload) <= WEFT_CUDA_IPC_PAYLOAD_MAX, "CTS payload too large");

/* One record of the semaphore exchange (MPI_Alltoall, fixed size). */
struct sem_rec {
    uint32_t valid;       /* 1: the sender of the record exported its semaphore array to me */
    int32_t  device;      /* device of the array */
    uint64_t offset;      /* byte offset of my word (the direction me -> record's sender) */
    uint64_t base;
    uint64_t buffer_id;
    uint8_t  handle[64];
};
_Static_assert(sizeof(struct sem_rec) == 96, "semaphore record layout");

#ifdef WEFT_HAVE_CUDA_HEADERS

#define IPC_MAX_DEVICES 8

enum op_state { OP_COPYING = 0, OP_FIN };

/* A push in flight. */
struct ipc_op {
    struct weft_pipe             *p;       /* NULL once the pipe broke */
    struct weft_request          *s;
    int                           peer;
    uint64_t                      rreq;    /* receiver's request id (FIN) */
    int                           tag;
    size_t                        bytes;
    uint64_t                      buf_base;/* receiver's allocation base (messages) */
    struct weft_ipc_cache_entry  *entry;   /* mapping reference while copying */
    cudaEvent_t                   ev;
    int                           dev;
    int                           state;   /* enum op_state */
    int                           status;  /* WEFT_* of the copy */
    struct ipc_op                *next;
};

struct ipc_peer {
    int       exported;     /* my word for this peer exists (it may push to me) */
    uint32_t  recv_seq;     /* last semaphore value exported for messages from this peer */
    int       sem_valid;    /* the peer exported its array to me */
    struct sem_rec sem;     /* its record */
    void     *sem_mapped;   /* its array, opened at my first push (NULL before) */
    int       sem_failed;   /* the open failed: pushes to this peer fail */
    char      sem_why[128];
    struct ipc_op *last_op; /* my last push to it still copying */
};

struct ipc_state {
    struct weft_comm       *c;
    const struct weft_cuda *cu;
    int                     size;
    void                   *sem_array;     /* my semaphores: size words, device memory */
    int                     sem_device;
    struct ipc_peer        *peers;         /* [size] */
    struct weft_ipc_cache  *imports;       /* peers' allocations mapped here */
    struct weft_ipc_cache  *exports;       /* my allocations' handles (peer -1) */
    cudaStream_t            streams[IPC_MAX_DEVICES];
    cudaEvent_t            *ev_free;       /* recycled events */
    size_t                  ev_free_n, ev_free_cap;
    struct ipc_op          *ops_head, *ops_tail;
    size_t                  ops_count;
};

/* Context handed to the import cache's open. */
struct import_arg {
    struct ipc_state                   *st;
    const struct weft_cuda_ipc_payload *pl;
    int                                 dev;      /* importing device */
    cudaError_t                         err;
};

static const char *cu_err(const struct weft_cuda *cu, cudaError_t e)
{
    const char *s = cu->GetErrorString(e);
    return s ? s : "unknown CUDA error";
}

static const char *drv_err(const struct weft_cuda *cu, CUresult r)
{
    const char *s = NULL;
    if (cu->cuGetErrorString == NULL || cu->cuGetErrorString(r, &s) != CUDA_SUCCESS || s == NULL)
        return "unknown CUDA driver error";
    return s;
}

/* Makes dev current; returns the device to restore (or -1). */
static int dev_enter(const struct weft_cuda *cu, int dev)
{
    int cur = -1;
    if (cu->GetDevice(&cur) != cudaSuccess) {
        cu->GetLastError();
        cur = -1;
    }
    if (dev >= 0 && cur != dev && cu->SetDevice(dev) != cudaSuccess)
        cu->GetLastError();
    return cur;
}

static void dev_leave(const struct weft_cuda *cu, int saved, int dev)
{
    if (saved >= 0 && saved != dev && cu->SetDevice(saved) != cudaSuccess)
        cu->GetLastError();
}

/* "0000:07:00.0" (or "00000000:07:00.0", any case) -> comparable number. */
static int busid_parse(const char *s, uint64_t *out)
{
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    char tmp[17];
    memcpy(tmp, s, 16);
    tmp[16] = '\0';
    if (tmp[0] == '\0' || sscanf(tmp, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
        return -1;
    *out = ((uint64_t)dom << 32) | ((uint64_t)bus << 16) | ((uint64_t)dev << 8) | fn;
    return 0;
}

/* My ordinal of the peer's device ordinal pord, or -1. */
static int local_ordinal(const struct weft_comm *c, int peer, int pord)
{
    const struct weft_rank_card *pc = &c->cards[peer], *me = &c->cards[c->rank];
    uint64_t want, have;
    if (pord < 0 || pord >= pc->gpu_count || pord >= 8 || busid_parse(pc->gpu_busid[pord], &want) != 0)
        return -1;
    for (int d = 0; d < me->gpu_count && d < 8; d++)
        if (busid_parse(me->gpu_busid[d], &have) == 0 && have == want)
            return d;
    return -1;
}

static int can_access(const struct weft_cuda *cu, int from, int to)
{
    int can = 0;
    if (from == to)
        return 1;
    if (cu->DeviceCanAccessPeer(&can, from, to) != cudaSuccess) {
        cu->GetLastError();
        return 0;
    }
    return can != 0;
}

/* ---------------------------------------------------------------- caches */

static int import_open(void *ctx, struct weft_ipc_cache_entry *e, const void *arg)
{
    struct import_arg *a = (struct import_arg *)arg;
    const struct weft_cuda *cu = a->st->cu;
    cudaIpcMemHandle_t h;
    void *ptr = NULL;
    (void)ctx;

    memcpy(&h, a->pl->handle, sizeof(h));
    int saved = dev_enter(cu, a->dev);
    a->err = cu->IpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
    dev_leave(cu, saved, a->dev);
    if (a->err != cudaSuccess) {
        cu->GetLastError();
        return 1;
    }
    e->mapped = ptr;
    WEFT_TRACE(a->st->c->rank, "cuda_ipc: peer %d: opened IPC mapping of buffer %#llx id %llu (%llu bytes) at %p",
               e->peer, (unsigned long long)e->base, (unsigned long long)e->buffer_id,
               (unsigned long long)a->pl->alloc_size, ptr);
    return 0;
}

static void import_close(void *ctx, struct weft_ipc_cache_entry *e)
{
    struct ipc_state *st = ctx;
    if (e->mapped == NULL)
        return;
    cudaError_t err = st->cu->IpcCloseMemHandle(e->mapped);
    if (err != cudaSuccess) {
        st->cu->GetLastError();
        WEFT_WARN(st->c->rank, "cuda_ipc: peer %d: closing the mapping of buffer %#llx id %llu failed: %s",
                  e->peer, (unsigned long long)e->base, (unsigned long long)e->buffer_id, cu_err(st->cu, err));
    } else {
        WEFT_TRACE(st->c->rank, "cuda_ipc: peer %d: closed IPC mapping of buffer %#llx id %llu", e->peer,
                   (unsigned long long)e->base, (unsigned long long)e->buffer_id);
    }
    e->mapped = NULL;
}

static const struct weft_ipc_cache_ops import_ops = { import_open, import_close };

struct export_arg {
    const struct weft_cuda *cu;
    cudaError_t             err;
};

static int export_open(void *ctx, struct weft_ipc_cache_entry *e, const void *arg)
{
    struct export_arg *a = (struct export_arg *)arg;
    cudaIpcMemHandle_t h;
    (void)ctx;
    _Static_assert(sizeof(h) <= WEFT_IPC_CACHE_DATA, "IPC handle fits a cache entry");
    a->err = a->cu->IpcGetMemHandle(&h, (void *)(uintptr_t)e->base);
    if (a->err != cudaSuccess) {
        a->cu->GetLastError();
        return 1;
    }
    memcpy(e->data, &h, sizeof(h));
    return 0;
}

static const struct weft_ipc_cache_ops export_ops = { export_open, NULL };

/* ---------------------------------------------------------------- set-up */

static void state_free(struct ipc_state *st)
{
    const struct weft_cuda *cu = st->cu;

    /* Nothing of ours may still run on the streams. */
    for (int d = 0; d < IPC_MAX_DEVICES; d++)
        if (st->streams[d] && cu->StreamSynchronize(st->streams[d]) != cudaSuccess)
            cu->GetLastError();
    while (st->ops_head) {
        struct ipc_op *op = st->ops_head;
        st->ops_head = op->next;
        if (op->ev && cu->EventDestroy(op->ev) != cudaSuccess)
            cu->GetLastError();
        weft_ipc_cache_put(st->imports, op->entry);
        free(op);
    }
    weft_ipc_cache_destroy(st->imports);
    weft_ipc_cache_destroy(st->exports);
    if (st->peers) {
        for (int i = 0; i < st->size; i++)
            if (st->peers[i].sem_mapped && cu->IpcCloseMemHandle(st->peers[i].sem_mapped) != cudaSuccess)
                cu->GetLastError();
        free(st->peers);
    }
    if (st->sem_array && cu->Free(st->sem_array) != cudaSuccess)
        cu->GetLastError();
    for (size_t i = 0; i < st->ev_free_n; i++)
        if (cu->EventDestroy(st->ev_free[i]) != cudaSuccess)
            cu->GetLastError();
    free(st->ev_free);
    for (int d = 0; d < IPC_MAX_DEVICES; d++)
        if (st->streams[d] && cu->StreamDestroy(st->streams[d]) != cudaSuccess)
            cu->GetLastError();
    free(st);
}

/* Allocates and exports my semaphore array; fills the records I send. */
static void sem_setup(struct ipc_state *st, struct sem_rec *out, char *why, size_t whylen)
{
    const struct weft_cuda *cu = st->cu;
    struct weft_comm *c = st->c;
    size_t bytes = (size_t)st->size * sizeof(uint32_t);
    cudaIpcMemHandle_t h;
    cudaError_t e;
    int any = 0;

    for (int j = 0; j < st->size; j++)
        if (j != c->rank && c->pipes[j].tp && c->pipes[j].tp->id == WEFT_TP_SHM && c->cards[j].gpu_count > 0)
            any = 1;
    if (!any) {
        snprintf(why, whylen, "no peer on this node with CUDA over shm");
        return;
    }
    if ((e = cu->GetDevice(&st->sem_device)) != cudaSuccess ||
        (e = cu->Malloc(&st->sem_array, bytes)) != cudaSuccess) {
        cu->GetLastError();
        st->sem_array = NULL;
        snprintf(why, whylen, "cannot allocate %zu bytes of semaphores: %s", bytes, cu_err(cu, e));
        return;
    }
    {
        uint32_t *zero = calloc((size_t)st->size, sizeof(uint32_t));
        e = zero ? cu->Memcpy(st->sem_array, zero, bytes, cudaMemcpyHostToDevice) : cudaErrorMemoryAllocation;
        free(zero);
    }
    if (e == cudaSuccess)
        e = cu->IpcGetMemHandle(&h, st->sem_array);
    if (e != cudaSuccess) {
        cu->GetLastError();
        snprintf(why, whylen, "cannot export the semaphores: %s", cu_err(cu, e));
        cu->Free(st->sem_array);
        cu->GetLastError();
        st->sem_array = NULL;
        return;
    }
    struct weft_mem_attr attr;
    weft_cuda_mem_attr(st->sem_array, &attr);
    for (int j = 0; j < st->size; j++) {
        if (j == c->rank || c->pipes[j].tp == NULL || c->pipes[j].tp->id != WEFT_TP_SHM ||
            c->cards[j].gpu_count == 0)
            continue;
        out[j].valid = 1;
        out[j].device = st->sem_device;
        out[j].offset = (uint64_t)j * sizeof(uint32_t);
        out[j].base = (uint64_t)(uintptr_t)st->sem_array;
        out[j].buffer_id = attr.buffer_id;
        memcpy(out[j].handle, &h, sizeof(h));
        st->peers[j].exported = 1;
    }
}

int weft_cuda_ipc_init(struct weft_comm *c)
{
    struct sem_rec *sendr, *recvr;
    struct ipc_state *st = NULL;
    char why[256] = "";
    int rc = WEFT_SUCCESS, mrc;
    size_t n = (size_t)c->size;

    sendr = calloc(2 * n, sizeof(*sendr));
    if (sendr == NULL)
        return weft_set_error(c, WEFT_ERR_NO_MEMORY, "cuda_ipc: no memory for the semaphore exchange");
    recvr = sendr + n;

    const struct weft_cuda *cu = c->cuda ? weft_cuda_get() : NULL;
    if (cu && c->cfg.transports_mask & (1u << WEFT_TP_SHM)) {
        st = calloc(1, sizeof(*st));
        if (st)
            st->peers = calloc(n, sizeof(*st->peers));
        if (st && st->peers) {
            st->c = c;
            st->cu = cu;
            st->size = c->size;
            sem_setup(st, sendr, why, sizeof(why));
        } else {
            if (st)
                free(st);
            st = NULL;
            snprintf(why, sizeof(why), "no memory");
        }
    } else {
        snprintf(why, sizeof(why), "%s", cu ? "shm not allowed" : "no CUDA in this rank");
    }

    /* One batch, every rank, whatever happened above. */
    mrc = MPI_Alltoall(sendr, (int)sizeof(*sendr), MPI_BYTE, recvr, (int)sizeof(*recvr), MPI_BYTE, c->mpi);
    if (mrc != MPI_SUCCESS) {
        rc = weft_set_error(c, WEFT_ERR_MPI, "cuda_ipc: MPI_Alltoall of the semaphore handles failed (%d)", mrc);
        goto out;
    }
    if (st == NULL || st->sem_array == NULL) {
        if (why[0])
            WEFT_TRACE(c->rank, "cuda_ipc: off in this rank: %s", why);
        goto out;
    }
    for (size_t j = 0; j < n; j++)
        if (recvr[j].valid) {
            st->peers[j].sem_valid = 1;
            st->peers[j].sem = recvr[j];
        }
    size_t cap = c->cfg.cuda_ipc_cache > 0 ? (size_t)c->cfg.cuda_ipc_cache : 128;
    st->imports = weft_ipc_cache_create(cap, &import_ops, st);
    st->exports = weft_ipc_cache_create(cap, &export_ops, st);
    if (st->imports == NULL || st->exports == NULL) {
        rc = weft_set_error(c, WEFT_ERR_NO_MEMORY, "cuda_ipc: no memory for the mapping caches");
        goto out;
    }
    {
        int npeers = 0;
        for (size_t j = 0; j < n; j++)
            npeers += st->peers[j].exported;
        WEFT_INFO(c->rank, "cuda_ipc: on for %d peer(s) of this node (semaphores on device %d, mapping cache of %zu)",
                  npeers, st->sem_device, cap);
    }
    c->cuda_ipc_state = st;
    st = NULL;
out:
    if (st)
        state_free(st);
    free(sendr);
    return rc;
}

void weft_cuda_ipc_fini(struct weft_comm *c)
{
    struct ipc_state *st = c->cuda_ipc_state;
    if (st == NULL)
        return;
    c->cuda_ipc_state = NULL;
    state_free(st);
}

/* ---------------------------------------------------------------- receiver */

int weft_cuda_ipc_eligible(struct weft_pipe *p, const struct weft_ctrl *rts, const struct weft_request *r)
{
    struct weft_comm *c = p->comm;
    struct ipc_state *st = c->cuda_ipc_state;
    struct weft_mem_attr attr;
    const char *no = NULL;
    int sdev = -1;

    if (st == NULL)
        return 0;   /* no CUDA, no semaphores: nothing to log per message */
    if (!(rts->flags & WEFT_CTRL_F_DEVICE))
        return 0;
    if (p->tp == NULL || p->tp->id != WEFT_TP_SHM)
        no = "not over shm (other node)";
    else if (!st->peers[p->peer].exported)
        no = "no semaphore for this peer";
    else if (weft_cuda_mem_attr(r->buf, &attr) != WEFT_SUCCESS || attr.kind != WEFT_MEM_DEVICE || attr.base == 0)
        no = "receive buffer is not device memory";
    else if ((uintptr_t)r->buf < attr.base || (uintptr_t)r->buf - attr.base > attr.size ||
             rts->bytes > attr.size - ((uintptr_t)r->buf - attr.base))
        no = "message runs past the receive buffer's allocation";
    else if ((sdev = local_ordinal(c, p->peer, (int)rts->reserved)) < 0)
        no = "the sender's device is not visible here";
    else if (!can_access(st->cu, sdev, attr.device))
        no = "the sender's device cannot access the receive buffer's device";
    else if (!can_access(st->cu, sdev, st->sem_device))
        no = "the sender's device cannot access the semaphores' device";
    if (no) {
        WEFT_TRACE(c->rank, "cuda_ipc: recv from peer %d tag %d: not by IPC (sender device %u): %s", p->peer,
                   r->tag, (unsigned)rts->reserved, no);
        return 0;
    }
    return 1;
}

int weft_cuda_ipc_export(struct weft_pipe *p, struct weft_request *r, void *payload, size_t *len)
{
    struct weft_comm *c = p->comm;
    struct ipc_state *st = c->cuda_ipc_state;
    struct weft_cuda_ipc_payload pl;
    struct weft_ipc_cache_entry *e = NULL;
    struct weft_mem_attr attr;
    int rc;

    if (st == NULL)
        return weft_set_error(c, WEFT_ERR_UNSUPPORTED, "cuda_ipc: recv from peer %d: IPC is not set up", p->peer);
    weft_cuda_mem_attr(r->buf, &attr);
    if (attr.kind != WEFT_MEM_DEVICE || attr.base == 0)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                              "cuda_ipc: recv from peer %d tag %d: buffer %p is not device memory", p->peer,
                              r->tag, r->buf);
    struct export_arg ea = { st->cu, cudaSuccess };
    rc = weft_ipc_cache_get(st->exports, -1, attr.base, attr.buffer_id, &ea, &e, NULL);
    if (rc != 0)
        return weft_set_error(c, WEFT_ERR_TRANSPORT,
                              "cuda_ipc: recv from peer %d tag %d: cannot export buffer %p (allocation %#llx id %llu): %s",
                              p->peer, r->tag, r->buf, (unsigned long long)attr.base,
                              (unsigned long long)attr.buffer_id,
                              rc < 0 ? "no memory" : cu_err(st->cu, ea.err));
    memset(&pl, 0, sizeof(pl));
    pl.magic = WEFT_CUDA_IPC_MAGIC;
    pl.sem_value = ++st->peers[p->peer].recv_seq;
    pl.base = attr.base;
    pl.buffer_id = attr.buffer_id;
    pl.alloc_size = attr.size;
    pl.offset = (uintptr_t)r->buf - attr.base;
    pl.bytes = r->msg_bytes;
    pl.device = attr.device;
    memcpy(pl.handle, e->data, sizeof(pl.handle));
    weft_ipc_cache_put(st->exports, e);
    memcpy(payload, &pl, sizeof(pl));
    *len = sizeof(pl);
    WEFT_TRACE(c->rank, "cuda_ipc: recv from peer %d tag %d: exported buffer %#llx+%llu id %llu, %llu bytes, sem %u",
               p->peer, r->tag, (unsigned long long)pl.base, (unsigned long long)pl.offset,
               (unsigned long long)pl.buffer_id, (unsigned long long)pl.bytes, pl.sem_value);
    return WEFT_SUCCESS;
}

void *weft_cuda_ipc_inbound_sem(struct weft_comm *c, int peer)
{
    struct ipc_state *st = c->cuda_ipc_state;
    if (st == NULL || peer < 0 || peer >= st->size || !st->peers[peer].exported)
        return NULL;
    return (char *)st->sem_array + (size_t)peer * sizeof(uint32_t);
}

/* ---------------------------------------------------------------- sender */

/* FIN to the receiver: WEFT_SUCCESS, WEFT_EAGAIN (retry later) or a
 * transport failure. */
static int fin_send(struct weft_pipe *p, uint64_t rreq, int tag, size_t bytes, int status)
{
    struct weft_ctrl h;
    memset(&h, 0, sizeof(h));
    h.type = WEFT_CTRL_FIN;
    h.flags = WEFT_CTRL_F_IPC;
    h.status = status;
    h.tag = tag;
    h.bytes = bytes;
    h.sreq = rreq;
    h.rreq = rreq;
    return p->tp->ctrl_send(p, &h, NULL, 0);
}

static void op_append(struct ipc_state *st, struct ipc_op *op)
{
    op->next = NULL;
    if (st->ops_tail)
        st->ops_tail->next = op;
    else
        st->ops_head = op;
    st->ops_tail = op;
    st->ops_count++;
}

static cudaEvent_t event_get(struct ipc_state *st, cudaError_t *err)
{
    cudaEvent_t ev = NULL;
    if (st->ev_free_n)
        return st->ev_free[--st->ev_free_n];
    *err = st->cu->EventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (*err != cudaSuccess) {
        st->cu->GetLastError();
        return NULL;
    }
    return ev;
}

static void event_put(struct ipc_state *st, cudaEvent_t ev)
{
    if (ev == NULL)
        return;
    if (st->ev_free_n == st->ev_free_cap) {
        size_t ncap = st->ev_free_cap ? 2 * st->ev_free_cap : 16;
        cudaEvent_t *nf = realloc(st->ev_free, ncap * sizeof(*nf));
        if (nf == NULL) {
            if (st->cu->EventDestroy(ev) != cudaSuccess)
                st->cu->GetLastError();
            return;
        }
        st->ev_free = nf;
        st->ev_free_cap = ncap;
    }
    st->ev_free[st->ev_free_n++] = ev;
}

static cudaStream_t stream_get(struct ipc_state *st, int dev, cudaError_t *err)
{
    if (dev < 0 || dev >= IPC_MAX_DEVICES) {
        *err = cudaErrorInvalidDevice;
        return NULL;
    }
    if (st->streams[dev] == NULL) {
        int saved = dev_enter(st->cu, dev);
        *err = st->cu->StreamCreateWithFlags(&st->streams[dev], cudaStreamNonBlocking);
        dev_leave(st->cu, saved, dev);
        if (*err != cudaSuccess) {
            st->cu->GetLastError();
            st->streams[dev] = NULL;
        }
    }
    return st->streams[dev];
}

/* The send cannot go: fail it, tell the receiver (FIN with the code). */
static int push_fail(struct weft_pipe *p, struct weft_request *s, uint64_t rreq, int err)
{
    int rc = fin_send(p, rreq, s->tag, s->bytes, err);
    if (rc == WEFT_EAGAIN) {
        /* Retry the FIN from progress like a finished copy's. */
        struct ipc_state *st = p->comm->cuda_ipc_state;
        struct ipc_op *op = st ? calloc(1, sizeof(*op)) : NULL;
        if (op) {
            op->p = p;
            op->s = s;
            op->peer = p->peer;
            op->rreq = rreq;
            op->tag = s->tag;
            op->bytes = s->bytes;
            op->state = OP_FIN;
            op->status = err;
            op->dev = -1;
            op_append(st, op);
            return WEFT_SUCCESS;
        }
        rc = WEFT_ERR_NO_MEMORY;
    }
    weft_pipe_send_done(p, s, err);
    if (rc != WEFT_SUCCESS)
        weft_pipe_break(p, rc);
    return WEFT_SUCCESS;
}

int weft_cuda_ipc_push(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts,
                       const void *payload, size_t len)
{
    struct weft_comm *c = p->comm;
    struct ipc_state *st = c->cuda_ipc_state;
    struct weft_cuda_ipc_payload pl;
    struct weft_mem_attr attr;
    struct ipc_peer *pp;
    struct weft_ipc_cache_entry *e = NULL;
    const struct weft_cuda *cu;
    uint64_t rreq = cts->rreq;
    cudaError_t err = cudaSuccess;
    CUresult cr;
    int hit = 0, rc;

    if (st == NULL) {
        weft_set_error(c, WEFT_ERR_TRANSPORT, "cuda_ipc: send to peer %d tag %d: CTS asks for IPC, which is not set up here",
                       p->peer, s->tag);
        return push_fail(p, s, rreq, WEFT_ERR_TRANSPORT);
    }
    cu = st->cu;
    pp = &st->peers[p->peer];
    if (len != sizeof(pl) || payload == NULL) {
        weft_set_error(c, WEFT_ERR_TRANSPORT, "cuda_ipc: send to peer %d tag %d: IPC payload of %zu bytes, expected %zu",
                       p->peer, s->tag, len, sizeof(pl));
        return push_fail(p, s, rreq, WEFT_ERR_TRANSPORT);
    }
    memcpy(&pl, payload, sizeof(pl));
    if (pl.magic != WEFT_CUDA_IPC_MAGIC || pl.bytes != s->bytes || pl.offset > pl.alloc_size ||
        pl.bytes > pl.alloc_size - pl.offset) {
        weft_set_error(c, WEFT_ERR_TRANSPORT,
                       "cuda_ipc: send to peer %d tag %d: bad IPC payload (magic %#x, %llu bytes at offset %llu of "
                       "a %llu-byte allocation, message %zu bytes)", p->peer, s->tag, pl.magic,
                       (unsigned long long)pl.bytes, (unsigned long long)pl.offset,
                       (unsigned long long)pl.alloc_size, s->bytes);
        return push_fail(p, s, rreq, WEFT_ERR_TRANSPORT);
    }
    weft_cuda_mem_attr(s->buf, &attr);
    if (attr.kind != WEFT_MEM_DEVICE || attr.device < 0) {
        weft_set_error(c, WEFT_ERR_TRANSPORT, "cuda_ipc: send to peer %d tag %d: send buffer %p is not device memory",
                       p->peer, s->tag, s->buf);
        return push_fail(p, s, rreq, WEFT_ERR_TRANSPORT);
    }

    /* The peer's semaphores, opened once. */
    if (pp->sem_mapped == NULL && !pp->sem_failed) {
        if (!pp->sem_valid) {
            pp->sem_failed = 1;
            snprintf(pp->sem_why, sizeof(pp->sem_why), "the peer exported no semaphores to this rank");
        } else {
            cudaIpcMemHandle_t h;
            memcpy(&h, pp->sem.handle, sizeof(h));
            int saved = dev_enter(cu, attr.device);
            err = cu->IpcOpenMemHandle(&pp->sem_mapped, h, cudaIpcMemLazyEnablePeerAccess);
            dev_leave(cu, saved, attr.device);
            if (err != cudaSuccess) {
                cu->GetLastError();
                pp->sem_mapped = NULL;
                pp->sem_failed = 1;
                snprintf(pp->sem_why, sizeof(pp->sem_why), "opening its semaphores failed: %s", cu_err(cu, err));
            } else {
                WEFT_TRACE(c->rank, "cuda_ipc: peer %d: opened its semaphores (device %d) at %p", p->peer,
                           pp->sem.device, pp->sem_mapped);
            }
        }
    }
    if (pp->sem_failed) {
        weft_set_error(c, WEFT_ERR_TRANSPORT, "cuda_ipc: send to peer %d tag %d into buffer %#llx: %s", p->peer,
                       s->tag, (unsigned long long)pl.base, pp->sem_why);
        return push_fail(p, s, rreq, WEFT_ERR_TRANSPORT);
    }

    /* The receive buffer's allocation, through the cache. */
    struct import_arg ia = { st, &pl, attr.device, cudaSuccess };
    rc = weft_ipc_cache_get(st->imports, p->peer, pl.base, pl.buffer_id, &ia, &e, &hit);
    if (rc != 0) {
        weft_set_error(c, WEFT_ERR_TRANSPORT,
                       "cuda_ipc: send to peer %d tag %d: cannot open the IPC handle of its buffer %#llx id %llu: %s",
                       p->peer, s->tag, (unsigned long long)pl.base, (unsigned long long)pl.buffer_id,
                       rc < 0 ? "no memory" : cu_err(cu, ia.err));
        return push_fail(p, s, rreq, WEFT_ERR_TRANSPORT);
    }

    struct ipc_op *op = calloc(1, sizeof(*op));
    cudaStream_t stream = stream_get(st, attr.device, &err);
    cudaEvent_t ev = stream ? event_get(st, &err) : NULL;
    if (op == NULL || stream == NULL || ev == NULL) {
        weft_ipc_cache_put(st->imports, e);
        event_put(st, ev);
        free(op);
        weft_set_error(c, WEFT_ERR_TRANSPORT, "cuda_ipc: send to peer %d tag %d: no %s for the copy: %s", p->peer,
                       s->tag, op == NULL ? "memory" : stream == NULL ? "stream" : "event",
                       op == NULL ? "out of memory" : cu_err(cu, err));
        return push_fail(p, s, rreq, WEFT_ERR_TRANSPORT);
    }
    op->p = p;
    op->s = s;
    op->peer = p->peer;
    op->rreq = rreq;
    op->tag = s->tag;
    op->bytes = s->bytes;
    op->buf_base = pl.base;
    op->entry = e;
    op->ev = ev;
    op->dev = attr.device;
    op->state = OP_COPYING;
    op->status = WEFT_SUCCESS;

    int saved = dev_enter(cu, attr.device);
    /* The semaphore must only grow: after a push on another device's stream. */
    if (pp->last_op && pp->last_op->dev != attr.device && pp->last_op->ev)
        err = cu->StreamWaitEvent(stream, pp->last_op->ev, 0);
    const char *what = "cudaStreamWaitEvent";
    if (err == cudaSuccess && s->bytes) {
        what = "cudaMemcpyAsync";
        err = cu->MemcpyAsync((char *)e->mapped + pl.offset, s->buf, s->bytes, cudaMemcpyDeviceToDevice, stream);
    }
    if (err == cudaSuccess) {
        CUdeviceptr sem = (CUdeviceptr)((uintptr_t)pp->sem_mapped + pp->sem.offset);
        cr = cu->cuStreamWriteValue32((CUstream)stream, sem, pl.sem_value, 0);
        if (cr != CUDA_SUCCESS) {
            op->status = weft_set_error(c, WEFT_ERR_TRANSPORT,
                                        "cuda_ipc: send to peer %d tag %d into buffer %#llx id %llu: "
                                        "cuStreamWriteValue32 of semaphore %u failed: %s", p->peer, s->tag,
                                        (unsigned long long)pl.base, (unsigned long long)pl.buffer_id,
                                        pl.sem_value, drv_err(cu, cr));
        }
    } else {
        cu->GetLastError();
        op->status = weft_set_error(c, WEFT_ERR_TRANSPORT,
                                    "cuda_ipc: send to peer %d tag %d: %s of %zu bytes into its buffer %#llx id %llu "
                                    "failed: %s", p->peer, s->tag, what, s->bytes, (unsigned long long)pl.base,
                                    (unsigned long long)pl.buffer_id, cu_err(cu, err));
    }
    err = cu->EventRecord(ev, stream);
    if (err != cudaSuccess) {
        /* Cannot watch the copy: wait for it here. */
        cu->GetLastError();
        if (cu->StreamSynchronize(stream) != cudaSuccess) {
            cu->GetLastError();
            op->status = WEFT_ERR_TRANSPORT;
        }
        event_put(st, ev);
        op->ev = NULL;
        weft_ipc_cache_put(st->imports, e);
        op->entry = NULL;
        op->state = OP_FIN;
    } else {
        pp->last_op = op;
    }
    dev_leave(cu, saved, attr.device);
    op_append(st, op);
    WEFT_TRACE(c->rank, "cuda_ipc: send to peer %d tag %d: %zu bytes from device %d into its buffer %#llx+%llu "
               "id %llu by CUDA IPC (mapping %s, sem %u)", p->peer, s->tag, s->bytes, attr.device,
               (unsigned long long)pl.base, (unsigned long long)pl.offset, (unsigned long long)pl.buffer_id,
               hit ? "cached" : "opened", pl.sem_value);
    return WEFT_SUCCESS;
}

int weft_cuda_ipc_progress(struct weft_comm *c)
{
    struct ipc_state *st = c->cuda_ipc_state;
    struct ipc_op *op, *prev = NULL, *next;
    int n = 0;

    if (st == NULL || st->ops_head == NULL)
        return 0;
    for (op = st->ops_head; op; op = next) {
        next = op->next;
        if (op->state == OP_COPYING) {
            cudaError_t e = st->cu->EventQuery(op->ev);
            if (e == cudaErrorNotReady) {
                prev = op;
                continue;
            }
            if (e != cudaSuccess) {
                st->cu->GetLastError();
                if (op->status == WEFT_SUCCESS)
                    op->status = weft_set_error(c, WEFT_ERR_TRANSPORT,
                                                "cuda_ipc: send to peer %d tag %d: the copy of %zu bytes into its "
                                                "buffer %#llx failed: %s", op->peer, op->tag, op->bytes,
                                                (unsigned long long)op->buf_base, cu_err(st->cu, e));
            }
            if (st->peers[op->peer].last_op == op)
                st->peers[op->peer].last_op = NULL;
            event_put(st, op->ev);
            op->ev = NULL;
            weft_ipc_cache_put(st->imports, op->entry);
            op->entry = NULL;
            op->state = OP_FIN;
        }
        if (op->p != NULL) {
            struct weft_pipe *p = op->p;
            int rc = fin_send(p, op->rreq, op->tag, op->bytes, op->status);
            if (rc == WEFT_EAGAIN) {
                prev = op;
                continue;
            }
            /* Unlink before anything that may re-enter (abort_pipe). */
            if (prev)
                prev->next = next;
            else
                st->ops_head = next;
            if (st->ops_tail == op)
                st->ops_tail = prev;
            st->ops_count--;
            weft_pipe_send_done(p, op->s, op->status);
            if (rc != WEFT_SUCCESS)
                weft_pipe_break(p, rc);
            free(op);
            n++;
            continue;
        }
        /* The pipe broke meanwhile: nothing to tell anyone. */
        if (prev)
            prev->next = next;
        else
            st->ops_head = next;
        if (st->ops_tail == op)
            st->ops_tail = prev;
        st->ops_count--;
        free(op);
    }
    return n;
}

void weft_cuda_ipc_abort_pipe(struct weft_pipe *p)
{
    struct ipc_state *st = p->comm->cuda_ipc_state;
    if (st == NULL)
        return;
    for (struct ipc_op *op = st->ops_head; op; op = op->next)
        if (op->p == p) {
            op->p = NULL;
            op->s = NULL;
        }
}

int weft_cuda_ipc_busy(const struct weft_comm *c)
{
    const struct ipc_state *st = c->cuda_ipc_state;
    return st != NULL && st->ops_head != NULL;
}

#else /* !WEFT_HAVE_CUDA_HEADERS: no device memory, but the exchange still happens (collective) */

int weft_cuda_ipc_init(struct weft_comm *c)
{
    size_t n = (size_t)c->size;
    struct sem_rec *r = calloc(2 * n, sizeof(*r));
    if (r == NULL)
        return weft_set_error(c, WEFT_ERR_NO_MEMORY, "cuda_ipc: no memory for the semaphore exchange");
    int mrc = MPI_Alltoall(r, (int)sizeof(*r), MPI_BYTE, r + n, (int)sizeof(*r), MPI_BYTE, c->mpi);
    free(r);
    if (mrc != MPI_SUCCESS)
        return weft_set_error(c, WEFT_ERR_MPI, "cuda_ipc: MPI_Alltoall of the semaphore handles failed (%d)", mrc);
    return WEFT_SUCCESS;
}
void weft_cuda_ipc_fini(struct weft_comm *c) { (void)c; }
int weft_cuda_ipc_eligible(struct weft_pipe *p, const struct weft_ctrl *rts, const struct weft_request *r)
{
    (void)p; (void)rts; (void)r;
    return 0;
}
int weft_cuda_ipc_export(struct weft_pipe *p, struct weft_request *r, void *payload, size_t *len)
{
    (void)p; (void)r; (void)payload; (void)len;
    return WEFT_ERR_UNSUPPORTED;
}
int weft_cuda_ipc_push(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts,
                       const void *payload, size_t len)
{
    (void)p; (void)s; (void)cts; (void)payload; (void)len;
    return WEFT_ERR_UNSUPPORTED;
}
int weft_cuda_ipc_progress(struct weft_comm *c) { (void)c; return 0; }
void weft_cuda_ipc_abort_pipe(struct weft_pipe *p) { (void)p; }
int weft_cuda_ipc_busy(const struct weft_comm *c) { (void)c; return 0; }
void *weft_cuda_ipc_inbound_sem(struct weft_comm *c, int peer) { (void)c; (void)peer; return NULL; }

#endif
