/*
 * The cuda_ipc transport: a mover between ranks of one node (protocol and
 * conventions in cuda_ipc.h; the mapping cache in cuda_ipc_cache.c).
 *
 * Receiver: rndv_expect decides, then fills the key with the IPC handle of
 * the receive buffer's allocation (handles cached per (base, buffer id), so
 * a buffer used again costs no cudaIpcGetMemHandle) and the semaphore value
 * n of this message.
 *
 * Sender: rndv_push maps the receiver's allocation through the import
 * cache, queues on weft's internal stream of the source buffer's device
 *   cudaMemcpyAsync(peer_base + offset, sbuf, bytes, DeviceToDevice)
 *   cuStreamWriteValue32(peer semaphore word, n)
 *   cudaEventRecord(ev)
 * and progress() polls the events: a finished copy releases its mapping
 * reference and hands the send back (rndv_done with the copy's status); the
 * pipe then sends FIN and completes the send. A failure (open, copy) fails
 * the send with WEFT_ERR_TRANSPORT and the FIN carries the same code to the
 * receiver.
 */
#include "cuda_ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ipc_cache.h"
#include "cudawrap.h"
#include "list.h"
#include "log.h"
#include "transport.h"
#include "weft.h"   /* WEFT_SUCCESS, WEFT_ERR_* */

_Static_assert(sizeof(struct weft_cuda_ipc_payload) == 120, "key layout");
_Static_assert(sizeof(struct weft_cuda_ipc_payload) <= WEFT_TP_KEY_MAX, "key too large");

/* The blob, rounded up to 8 bytes in the card. */
#define CUDA_IPC_CARD_BYTES ((sizeof(struct cuda_ipc_card) + 7) / 8 * 8)
_Static_assert(sizeof(struct cuda_ipc_card) == 136, "card blob layout");
_Static_assert(sizeof(struct cuda_ipc_card) <= CUDA_IPC_CARD_BYTES, "card blob fits card_bytes");

/* One record of the semaphore exchange (alltoall, fixed size). */
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

/* A push in flight. Not in x->priv: abort_peer lets go of x while its copy
 * may still run on the stream, so the op (event, mapping reference) must
 * outlive x; it lives on the transport's own lists instead. */
struct ipc_op {
    struct weft_list              node;    /* on ops (copying) or done (to report) */
    struct weft_tp_xfer          *x;       /* NULL once the pipe broke (abort_peer) */
    int                           peer;
    int                           tag;
    size_t                        bytes;
    uint64_t                      buf_base;/* receiver's allocation base (messages) */
    struct weft_ipc_cache_entry  *entry;   /* mapping reference while copying */
    cudaEvent_t                   ev;
    int                           dev;
    int                           status;  /* WEFT_* of the copy */
};
#define OP_OF(n) weft_container_of(n, struct ipc_op, node)

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

#endif /* WEFT_HAVE_CUDA_HEADERS */

/* Per-comm state (ctx), from create to destroy. */
struct ipc_state {
    const struct weft_tp_env *env;
    struct weft_core         *core;
    int                       rank, size;
    int                       on;            /* connect set up the semaphores: IPC usable */
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda   *cu;            /* set at connect when this rank has CUDA */
    void                     *sem_array;     /* my semaphores: size words, device memory */
    int                       sem_device;
    struct ipc_peer          *peers;         /* [size] */
    struct weft_ipc_cache    *imports;       /* peers' allocations mapped here */
    struct weft_ipc_cache    *exports;       /* my allocations' handles (peer -1) */
    cudaStream_t              streams[IPC_MAX_DEVICES];
    cudaEvent_t              *ev_free;       /* recycled events */
    size_t                    ev_free_n, ev_free_cap;
    struct weft_list          ops;           /* pushes copying (struct ipc_op), in push order */
    struct weft_list          done;          /* pushes finished, rndv_done not yet called */
#endif
};

static const struct cuda_ipc_card *card_of(const struct weft_tp_env *env, int rank)
{
    return weft_tp_blob(&env->cards, rank);
}

#ifdef WEFT_HAVE_CUDA_HEADERS

/* DEVICE or MANAGED (what the RTS announced as device memory). */
static int is_device_kind(int mem_kind)
{
    return mem_kind == WEFT_MEM_DEVICE || mem_kind == WEFT_MEM_MANAGED;
}

/* A peer the semaphores are exchanged with: another rank of this
 * (effective) node whose card shows a GPU. */
static int node_gpu_peer(const struct ipc_state *st, int j)
{
    const struct weft_tp_cards *k = &st->env->cards;
    return j != st->rank && weft_tp_card(k, j)->node == weft_tp_card(k, st->rank)->node &&
           card_of(st->env, j)->gpu_count > 0;
}

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
static int local_ordinal(const struct ipc_state *st, int peer, int pord)
{
    const struct cuda_ipc_card *pc = card_of(st->env, peer), *me = card_of(st->env, st->rank);
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

/* Context handed to the import cache's open. */
struct import_arg {
    struct ipc_state                   *st;
    const struct weft_cuda_ipc_payload *pl;
    int                                 dev;      /* importing device */
    cudaError_t                         err;
};

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
    WEFT_TRACE(a->st->rank, "cuda_ipc: peer %d: opened IPC mapping of buffer %#llx id %llu (%llu bytes) at %p",
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
        WEFT_WARN(st->rank, "cuda_ipc: peer %d: closing the mapping of buffer %#llx id %llu failed: %s",
                  e->peer, (unsigned long long)e->base, (unsigned long long)e->buffer_id, cu_err(st->cu, err));
    } else {
        WEFT_TRACE(st->rank, "cuda_ipc: peer %d: closed IPC mapping of buffer %#llx id %llu", e->peer,
                   (unsigned long long)e->base, (unsigned long long)e->buffer_id);
    }
    e->mapped = NULL;
}

/* Closing a mapping waits for the device: not while a stream waits on
 * weft's stream engine, whose progress thread may be the one closing
 * (cudawrap.h, weft_cuda_stream_waits). */
static int import_may_close(void *ctx)
{
    (void)ctx;
    return weft_cuda_stream_waits() == 0;
}

static const struct weft_ipc_cache_ops import_ops = { import_open, import_close, import_may_close };

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

static const struct weft_ipc_cache_ops export_ops = { export_open, NULL, NULL };

/* ---------------------------------------------------------------- set-up */

static void state_free_cuda(struct ipc_state *st)
{
    const struct weft_cuda *cu = st->cu;
    struct weft_list *n;

    if (cu == NULL) {
        /* Never connected with CUDA: no stream, op, mapping or semaphore. */
        free(st->peers);
        return;
    }
    /* Nothing of ours may still run on the streams. */
    for (int d = 0; d < IPC_MAX_DEVICES; d++)
        if (st->streams[d] && cu->StreamSynchronize(st->streams[d]) != cudaSuccess)
            cu->GetLastError();
    while ((n = weft_list_pop(&st->ops)) != NULL || (n = weft_list_pop(&st->done)) != NULL) {
        struct ipc_op *op = OP_OF(n);
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
}

/* Allocates and exports my semaphore array; fills the records I send. */
static void sem_setup(struct ipc_state *st, struct sem_rec *out, char *why, size_t whylen)
{
    const struct weft_cuda *cu = st->cu;
    size_t bytes = (size_t)st->size * sizeof(uint32_t);
    cudaIpcMemHandle_t h;
    cudaError_t e;
    int any = 0;

    for (int j = 0; j < st->size; j++)
        if (node_gpu_peer(st, j))
            any = 1;
    if (!any) {
        snprintf(why, whylen, "no peer on this node with CUDA");
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
        if (!node_gpu_peer(st, j))
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

/* After the exchange: takes the peers' records and turns IPC on. */
static int sem_accept(struct ipc_state *st, const struct sem_rec *recvr)
{
    size_t n = (size_t)st->size;
    for (size_t j = 0; j < n; j++)
        if (recvr[j].valid) {
            st->peers[j].sem_valid = 1;
            st->peers[j].sem = recvr[j];
        }
    size_t cap = st->core->cfg.cuda_ipc_cache > 0 ? (size_t)st->core->cfg.cuda_ipc_cache : 128;
    st->imports = weft_ipc_cache_create(cap, &import_ops, st);
    st->exports = weft_ipc_cache_create(cap, &export_ops, st);
    if (st->imports == NULL || st->exports == NULL)
        return weft_set_error(st->core, WEFT_ERR_NO_MEMORY, "cuda_ipc: no memory for the mapping caches");
    {
        int npeers = 0;
        for (size_t j = 0; j < n; j++)
            npeers += st->peers[j].exported;
        WEFT_INFO(st->rank, "cuda_ipc: on for %d peer(s) of this node (semaphores on device %d, mapping cache of %zu)",
                  npeers, st->sem_device, cap);
    }
    st->on = 1;
    return WEFT_SUCCESS;
}

/* ---------------------------------------------------------------- receiver */

/* Fills the key for the receive x (eligible). */
static int export_key(struct ipc_state *st, int peer, const struct weft_tp_xfer *x, const struct weft_mem_attr *attr,
                      void *key, size_t *keylen)
{
    struct weft_cuda_ipc_payload pl;
    struct weft_ipc_cache_entry *e = NULL;
    struct export_arg ea = { st->cu, cudaSuccess };
    int rc;

    rc = weft_ipc_cache_get(st->exports, -1, attr->base, attr->buffer_id, &ea, &e, NULL);
    if (rc != 0)
        return weft_set_error(st->core, WEFT_ERR_TRANSPORT,
                              "cuda_ipc: recv from peer %d tag %d: cannot export buffer %p (allocation %#llx id %llu): %s",
                              peer, x->tag, x->buf, (unsigned long long)attr->base,
                              (unsigned long long)attr->buffer_id,
                              rc < 0 ? "no memory" : cu_err(st->cu, ea.err));
    memset(&pl, 0, sizeof(pl));
    pl.magic = WEFT_CUDA_IPC_MAGIC;
    pl.sem_value = ++st->peers[peer].recv_seq;
    pl.base = attr->base;
    pl.buffer_id = attr->buffer_id;
    pl.alloc_size = attr->size;
    pl.offset = (uintptr_t)x->buf - attr->base;
    pl.bytes = x->bytes;
    pl.device = attr->device;
    memcpy(pl.handle, e->data, sizeof(pl.handle));
    weft_ipc_cache_put(st->exports, e);
    memcpy(key, &pl, sizeof(pl));
    *keylen = sizeof(pl);
    WEFT_TRACE(st->rank, "cuda_ipc: recv from peer %d tag %d: exported buffer %#llx+%llu id %llu, %llu bytes, sem %u",
               peer, x->tag, (unsigned long long)pl.base, (unsigned long long)pl.offset,
               (unsigned long long)pl.buffer_id, (unsigned long long)pl.bytes, pl.sem_value);
    return WEFT_SUCCESS;
}

/* Receiver: can the message src announces go by IPC into x (both device,
 * same node, peer access)? Then export x and write the key. Takes nothing:
 * the sender's pipe completes the receive with its FIN. */
static int ipc_rndv_expect(void *ctx, int peer, struct weft_tp_xfer *x, const struct weft_tp_src *src,
                           void *key, size_t *keylen)
{
    struct ipc_state *st = ctx;
    const struct weft_tp_cards *k;
    struct weft_mem_attr attr;
    const char *no = NULL;
    int sdev = -1, rc;

    if (st == NULL || !st->on)
        return WEFT_EAGAIN;   /* no CUDA, no semaphores: nothing to log per message */
    if (!is_device_kind(src->mem_kind) || !is_device_kind(x->mem_kind))
        return WEFT_EAGAIN;
    k = &st->env->cards;
    if (peer < 0 || peer >= st->size || weft_tp_card(k, peer)->node != weft_tp_card(k, st->rank)->node)
        no = "not over shm (other node)";
    else if (!st->peers[peer].exported)
        no = "no semaphore for this peer";
    else if (weft_cuda_mem_attr(x->buf, &attr) != WEFT_SUCCESS || attr.kind != WEFT_MEM_DEVICE || attr.base == 0)
        no = "receive buffer is not device memory";
    else if ((uintptr_t)x->buf < attr.base || (uintptr_t)x->buf - attr.base > attr.size ||
             x->bytes > attr.size - ((uintptr_t)x->buf - attr.base))
        no = "message runs past the receive buffer's allocation";
    else if ((sdev = local_ordinal(st, peer, src->device)) < 0)
        no = "the sender's device is not visible here";
    else if (!can_access(st->cu, sdev, attr.device))
        no = "the sender's device cannot access the receive buffer's device";
    else if (!can_access(st->cu, sdev, st->sem_device))
        no = "the sender's device cannot access the semaphores' device";
    if (no) {
        WEFT_TRACE(st->rank, "cuda_ipc: recv from peer %d tag %d: not by IPC (sender device %d): %s", peer,
                   x->tag, src->device, no);
        return WEFT_EAGAIN;
    }
    rc = export_key(st, peer, x, &attr, key, keylen);
    if (rc != WEFT_SUCCESS) {
        WEFT_TRACE(st->rank, "recv from peer %d tag %d: CUDA IPC export failed (%s), staging instead", peer,
                   x->tag, weft_err_str(rc));
        return WEFT_EAGAIN;
    }
    return WEFT_SUCCESS;
}

/* ---------------------------------------------------------------- sender */

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

/* Sender: the receiver's key for x arrived: map, copy, signal. A refusal
 * (nothing queued) records why and returns WEFT_ERR_TRANSPORT; the pipe
 * then tells the receiver (FIN with that code) and fails the send. */
static int ipc_rndv_push(void *ctx, int peer, struct weft_tp_xfer *x, const void *key, size_t keylen)
{
    struct ipc_state *st = ctx;
    struct weft_cuda_ipc_payload pl;
    struct weft_mem_attr attr;
    struct ipc_peer *pp;
    struct weft_ipc_cache_entry *e = NULL;
    const struct weft_cuda *cu;
    struct weft_core *core;
    cudaError_t err = cudaSuccess;
    CUresult cr;
    int hit = 0, rc;

    if (st == NULL || !st->on)
        return weft_set_error(st ? st->core : NULL, WEFT_ERR_TRANSPORT,
                              "cuda_ipc: send to peer %d tag %d: CTS asks for IPC, which is not set up here", peer,
                              x->tag);
    core = st->core;
    cu = st->cu;
    pp = &st->peers[peer];
    if (keylen != sizeof(pl) || key == NULL)
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "cuda_ipc: send to peer %d tag %d: IPC payload of %zu bytes, expected %zu", peer, x->tag,
                              keylen, sizeof(pl));
    memcpy(&pl, key, sizeof(pl));
    if (pl.magic != WEFT_CUDA_IPC_MAGIC || pl.bytes != x->bytes || pl.offset > pl.alloc_size ||
        pl.bytes > pl.alloc_size - pl.offset)
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "cuda_ipc: send to peer %d tag %d: bad IPC payload (magic %#x, %llu bytes at offset %llu "
                              "of a %llu-byte allocation, message %zu bytes)", peer, x->tag, pl.magic,
                              (unsigned long long)pl.bytes, (unsigned long long)pl.offset,
                              (unsigned long long)pl.alloc_size, x->bytes);
    weft_cuda_mem_attr(x->buf, &attr);
    if (attr.kind != WEFT_MEM_DEVICE || attr.device < 0)
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "cuda_ipc: send to peer %d tag %d: send buffer %p is not device memory", peer, x->tag,
                              x->buf);

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
                WEFT_TRACE(st->rank, "cuda_ipc: peer %d: opened its semaphores (device %d) at %p", peer,
                           pp->sem.device, pp->sem_mapped);
            }
        }
    }
    if (pp->sem_failed)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "cuda_ipc: send to peer %d tag %d into buffer %#llx: %s", peer,
                              x->tag, (unsigned long long)pl.base, pp->sem_why);

    /* The receive buffer's allocation, through the cache. */
    struct import_arg ia = { st, &pl, attr.device, cudaSuccess };
    rc = weft_ipc_cache_get(st->imports, peer, pl.base, pl.buffer_id, &ia, &e, &hit);
    if (rc != 0)
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "cuda_ipc: send to peer %d tag %d: cannot open the IPC handle of its buffer %#llx id %llu: %s",
                              peer, x->tag, (unsigned long long)pl.base, (unsigned long long)pl.buffer_id,
                              rc < 0 ? "no memory" : cu_err(cu, ia.err));

    struct ipc_op *op = calloc(1, sizeof(*op));
    cudaStream_t stream = stream_get(st, attr.device, &err);
    cudaEvent_t ev = stream ? event_get(st, &err) : NULL;
    if (op == NULL || stream == NULL || ev == NULL) {
        weft_ipc_cache_put(st->imports, e);
        event_put(st, ev);
        free(op);
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "cuda_ipc: send to peer %d tag %d: no %s for the copy: %s",
                              peer, x->tag, op == NULL ? "memory" : stream == NULL ? "stream" : "event",
                              op == NULL ? "out of memory" : cu_err(cu, err));
    }
    op->x = x;
    op->peer = peer;
    op->tag = x->tag;
    op->bytes = x->bytes;
    op->buf_base = pl.base;
    op->entry = e;
    op->ev = ev;
    op->dev = attr.device;
    op->status = WEFT_SUCCESS;

    int saved = dev_enter(cu, attr.device);
    /* The semaphore must only grow: after a push on another device's stream. */
    if (pp->last_op && pp->last_op->dev != attr.device && pp->last_op->ev)
        err = cu->StreamWaitEvent(stream, pp->last_op->ev, 0);
    const char *what = "cudaStreamWaitEvent";
    if (err == cudaSuccess && x->bytes) {
        what = "cudaMemcpyAsync";
        err = cu->MemcpyAsync((char *)e->mapped + pl.offset, x->buf, x->bytes, cudaMemcpyDeviceToDevice, stream);
    }
    if (err == cudaSuccess) {
        CUdeviceptr sem = (CUdeviceptr)((uintptr_t)pp->sem_mapped + pp->sem.offset);
        cr = cu->cuStreamWriteValue32((CUstream)stream, sem, pl.sem_value, 0);
        if (cr != CUDA_SUCCESS) {
            op->status = weft_set_error(core, WEFT_ERR_TRANSPORT,
                                        "cuda_ipc: send to peer %d tag %d into buffer %#llx id %llu: "
                                        "cuStreamWriteValue32 of semaphore %u failed: %s", peer, x->tag,
                                        (unsigned long long)pl.base, (unsigned long long)pl.buffer_id,
                                        pl.sem_value, drv_err(cu, cr));
        }
    } else {
        cu->GetLastError();
        op->status = weft_set_error(core, WEFT_ERR_TRANSPORT,
                                    "cuda_ipc: send to peer %d tag %d: %s of %zu bytes into its buffer %#llx id %llu "
                                    "failed: %s", peer, x->tag, what, x->bytes, (unsigned long long)pl.base,
                                    (unsigned long long)pl.buffer_id, cu_err(cu, err));
    }
    err = cu->EventRecord(ev, stream);
    if (err != cudaSuccess) {
        /* Cannot watch the copy: wait for it here (reported at the next
         * progress, like a finished copy). */
        cu->GetLastError();
        if (cu->StreamSynchronize(stream) != cudaSuccess) {
            cu->GetLastError();
            op->status = WEFT_ERR_TRANSPORT;
        }
        event_put(st, ev);
        op->ev = NULL;
        weft_ipc_cache_put(st->imports, e);
        op->entry = NULL;
        weft_list_add_tail(&st->done, &op->node);
    } else {
        pp->last_op = op;
        weft_list_add_tail(&st->ops, &op->node);
    }
    dev_leave(cu, saved, attr.device);
    WEFT_TRACE(st->rank, "cuda_ipc: send to peer %d tag %d: %zu bytes from device %d into its buffer %#llx+%llu "
               "id %llu by CUDA IPC (mapping %s, sem %u)", peer, x->tag, x->bytes, attr.device,
               (unsigned long long)pl.base, (unsigned long long)pl.offset, (unsigned long long)pl.buffer_id,
               hit ? "cached" : "opened", pl.sem_value);
    return WEFT_SUCCESS;
}

/* Polls copies in flight (events); returns the number reported done. */
static int ipc_progress(void *ctx)
{
    struct ipc_state *st = ctx;
    struct weft_list *node;
    int n = 0;

    if (st == NULL || st->cu == NULL || (weft_list_empty(&st->ops) && weft_list_empty(&st->done)))
        return 0;
    /* Finished copies let go of their event and mapping and move to done... */
    weft_list_for_each(it, &st->ops) {
        struct ipc_op *op = OP_OF(it);
        cudaError_t e = st->cu->EventQuery(op->ev);
        if (e == cudaErrorNotReady)
            continue;
        if (e != cudaSuccess) {
            st->cu->GetLastError();
            if (op->status == WEFT_SUCCESS)
                op->status = weft_set_error(st->core, WEFT_ERR_TRANSPORT,
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
        weft_list_del(it);
        weft_list_add_tail(&st->done, it);
    }
    /* ... and are reported one by one, each unlinked before the upcall,
     * which may re-enter (rndv_push, abort_peer, progress). */
    while ((node = weft_list_pop(&st->done)) != NULL) {
        struct ipc_op *op = OP_OF(node);
        struct weft_tp_xfer *x = op->x;
        int status = op->status;
        free(op);
        if (x == NULL)
            continue;   /* the pipe broke meanwhile: nothing to tell anyone */
        st->env->up->rndv_done(st->env->up->arg, x, status);
        n++;
    }
    return n;
}

/* The pipe broke: forget x of that peer's pushes (a copy already queued
 * still runs; its mapping is released when it is done). */
static void ipc_abort_peer(void *ctx, int peer)
{
    struct ipc_state *st = ctx;
    if (st == NULL || st->cu == NULL)
        return;
    weft_list_for_each(it, &st->ops)
        if (OP_OF(it)->peer == peer)
            OP_OF(it)->x = NULL;
    weft_list_for_each(it, &st->done)
        if (OP_OF(it)->peer == peer)
            OP_OF(it)->x = NULL;
}

/* Nonzero while copies are in flight (or wait to be reported): a waiter
 * should poll (no doorbell rings when a copy completes) instead of
 * sleeping long. */
static int ipc_wakeless(void *ctx)
{
    const struct ipc_state *st = ctx;
    return st != NULL && st->cu != NULL && (!weft_list_empty(&st->ops) || !weft_list_empty(&st->done));
}

static unsigned ipc_rndv_mem(void *ctx, int peer)
{
    const struct ipc_state *st = ctx;
    if (st == NULL || !st->on || peer < 0 || peer >= st->size)
        return 0;
    return st->peers[peer].exported || st->peers[peer].sem_valid ? WEFT_TP_MEM_DEVICE : 0;
}

#else /* !WEFT_HAVE_CUDA_HEADERS: no device memory, but the exchange still happens (collective) */

static int ipc_rndv_expect(void *ctx, int peer, struct weft_tp_xfer *x, const struct weft_tp_src *src,
                           void *key, size_t *keylen)
{
    (void)ctx; (void)peer; (void)x; (void)src; (void)key; (void)keylen;
    return WEFT_EAGAIN;
}

static int ipc_rndv_push(void *ctx, int peer, struct weft_tp_xfer *x, const void *key, size_t keylen)
{
    struct ipc_state *st = ctx;
    (void)key; (void)keylen;
    return weft_set_error(st ? st->core : NULL, WEFT_ERR_TRANSPORT,
                          "cuda_ipc: send to peer %d tag %d: CTS asks for IPC, which is not set up here", peer, x->tag);
}

static int ipc_progress(void *ctx) { (void)ctx; return 0; }
static void ipc_abort_peer(void *ctx, int peer) { (void)ctx; (void)peer; }
static int ipc_wakeless(void *ctx) { (void)ctx; return 0; }
static unsigned ipc_rndv_mem(void *ctx, int peer) { (void)ctx; (void)peer; return 0; }

#endif /* WEFT_HAVE_CUDA_HEADERS */

/* ------------------------------------------------------------ the vtable */

/* Before the card exchange: per-comm state, and the devices this rank sees
 * (by PCI bus id) in the blob; gpu_count 0 without CUDA. */
static int ipc_create(const struct weft_tp_env *env, void *blob, void **ctx)
{
    struct cuda_ipc_card *card = blob;
    struct ipc_state *st = calloc(1, sizeof(*st));

    *ctx = NULL;
    if (st == NULL)
        return weft_set_error(env->core, WEFT_ERR_NO_MEMORY, "cuda_ipc: no memory for its state");
    st->env = env;
    st->core = env->core;
    st->rank = env->core->rank;
    st->size = env->core->size;
#ifdef WEFT_HAVE_CUDA_HEADERS
    weft_list_init(&st->ops);
    weft_list_init(&st->done);
    st->peers = calloc((size_t)st->size, sizeof(*st->peers));
    if (st->peers == NULL) {
        free(st);
        return weft_set_error(env->core, WEFT_ERR_NO_MEMORY, "cuda_ipc: no memory for its state");
    }
    const struct weft_cuda *cu = env->core->cuda ? weft_cuda_get() : NULL;
    if (cu) {
        int n = cu->device_count < 8 ? cu->device_count : 8;
        for (int d = 0; d < n; d++)
            if (cu->DeviceGetPCIBusId(card->gpu_busid[d], (int)sizeof(card->gpu_busid[d]), d) != cudaSuccess)
                card->gpu_busid[d][0] = '\0';
        card->gpu_count = (uint8_t)n;
    }
#else
    card->gpu_count = 0;
#endif
    *ctx = st;
    return WEFT_SUCCESS;
}

static int ipc_reach(const struct weft_tp_cards *k, int me, int peer, char *why, size_t whylen)
{
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct cuda_ipc_card *a = weft_tp_blob(k, me), *b = weft_tp_blob(k, peer);
    if (a->gpu_count == 0 || b->gpu_count == 0) {
        snprintf(why, whylen, "no CUDA device in rank %d", a->gpu_count == 0 ? me : peer);
        return 0;
    }
    return 1;
#else
    (void)k; (void)me; (void)peer;
    snprintf(why, whylen, "weft was built without CUDA");
    return 0;
#endif
}

/* The semaphore exchange. Collective: every rank takes part as soon as any
 * card shows a GPU (a rank without CUDA, or that does not offer cuda_ipc,
 * sends empty records), and none does in a job without GPUs; the cards are
 * the same everywhere, so every rank decides alike. */
static int ipc_connect(const struct weft_tp_env *env, void *ctx)
{
    struct ipc_state *st = ctx;
    struct weft_core *core = env->core;
    size_t n = (size_t)core->size;
    struct sem_rec *sendr, *recvr;
    char why[256] = "";
    int any_gpu = 0, rc = WEFT_SUCCESS;

    for (int r = 0; r < core->size && !any_gpu; r++)
        any_gpu = card_of(env, r)->gpu_count > 0;
    if (!any_gpu)
        return WEFT_SUCCESS;

    sendr = calloc(2 * n, sizeof(*sendr));
    if (sendr == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "cuda_ipc: no memory for the semaphore exchange");
    recvr = sendr + n;

#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *cu = core->cuda ? weft_cuda_get() : NULL;
    if (st && cu) {
        st->cu = cu;
        sem_setup(st, sendr, why, sizeof(why));
    } else {
        snprintf(why, sizeof(why), "%s", cu ? "cuda_ipc not offered by this rank" : "no CUDA in this rank");
    }
#else
    (void)st;
    snprintf(why, sizeof(why), "weft was built without CUDA");
#endif

    /* One batch, every rank, whatever happened above. */
    rc = env->coll->alltoall(env->coll->arg, sendr, recvr, sizeof(*sendr));
    if (rc != WEFT_SUCCESS) {
        rc = weft_set_error(core, rc, "cuda_ipc: the alltoall of the semaphore handles failed");
        goto out;
    }
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (st && st->sem_array) {
        rc = sem_accept(st, recvr);
        goto out;
    }
#endif
    if (why[0])
        WEFT_TRACE(core->rank, "cuda_ipc: off in this rank: %s", why);
out:
    free(sendr);
    return rc;
}

static void ipc_destroy(void *ctx)
{
    struct ipc_state *st = ctx;
    if (st == NULL)
        return;
#ifdef WEFT_HAVE_CUDA_HEADERS
    state_free_cuda(st);
#endif
    free(st);
}

const struct weft_transport weft_transport_cuda_ipc = {
    .name        = "cuda_ipc",
    .ctrl        = 0,
    .scope       = WEFT_TP_SCOPE_NODE,
    .sure        = 0,
    .card_bytes  = CUDA_IPC_CARD_BYTES,
    .create      = ipc_create,
    .reach       = ipc_reach,
    .connect     = ipc_connect,
    .destroy     = ipc_destroy,
    .eager_limit = NULL,
    .ctrl_send   = NULL,
    .progress    = ipc_progress,
    .rndv_mem    = ipc_rndv_mem,
    .rndv_get    = NULL,
    .rndv_expect = ipc_rndv_expect,
    .rndv_push   = ipc_rndv_push,
    .abort_peer  = ipc_abort_peer,
    .busy        = ipc_wakeless,   /* copies in flight: destroy drains them */
    .wakeless    = ipc_wakeless,
    .sleep       = NULL,
    .mem_pin     = NULL,
    .mem_unpin   = NULL,
};
