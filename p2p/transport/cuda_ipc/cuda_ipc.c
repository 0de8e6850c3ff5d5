/*
 * The cuda_ipc transport: a mover between ranks of one node (protocol and
 * conventions in cuda_ipc.h; the mapping cache in cuda_ipc_cache.c).
 *
 * Receiver: rndv_expect decides, then fills the key with the IPC handle of
 * the receive buffer's allocation and its block (cached per (base, buffer
 * id), so a buffer used again costs no cudaIpcGetMemHandle and no pointer
 * query) and the receive's signal slot.
 *
 * Sender: rndv_push maps the receiver's block through the import cache,
 * queues on weft's internal stream of the source buffer's device
 *   cudaMemcpyAsync(mapping + offset, sbuf, bytes, DeviceToDevice)
 *   cuStreamWriteValue32(receiver's signal slot, n)     (when the key has one)
 *   cudaEventRecord(ev)
 * and progress() polls the events: a finished copy releases its mapping
 * reference and hands the send back (rndv_done with the copy's status); the
 * pipe then sends FIN and completes the send. A copy that fails fails the
 * send with WEFT_ERR_TRANSPORT and the FIN carries the same code to the
 * receiver; a mapping that cannot be opened (now, or at all) sends the
 * message back to the receiver for another path (WEFT_EAGAIN: staged).
 */
#include "cuda_ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ipc_cache.h"
#include "cudawrap.h"
#include "list.h"
#include "log.h"
#include "signals.h"
#include "transport.h"
#include "weft.h"   /* WEFT_SUCCESS, WEFT_ERR_* */

_Static_assert(sizeof(struct weft_cuda_ipc_payload) == 144, "key layout");
_Static_assert(sizeof(struct weft_cuda_ipc_payload) <= WEFT_TP_KEY_MAX, "key too large");

/* The blob, rounded up to 8 bytes in the card. */
#define CUDA_IPC_CARD_BYTES ((sizeof(struct cuda_ipc_card) + 7) / 8 * 8)
_Static_assert(sizeof(struct cuda_ipc_card) == 136, "card blob layout");
_Static_assert(sizeof(struct cuda_ipc_card) <= CUDA_IPC_CARD_BYTES, "card blob fits card_bytes");

/* One record of the signal-slot exchange (alltoall, fixed size). */
struct sig_rec {
    uint32_t valid;       /* 1: the sender of the record exported its slots to me */
    int32_t  device;      /* device of its slots */
    uint64_t base;        /* its slots in its address space */
    uint8_t  handle[64];
};
_Static_assert(sizeof(struct sig_rec) == 80, "signal record layout");

#ifdef WEFT_HAVE_CUDA_HEADERS

#define IPC_MAX_DEVICES 8

/* import_open's answer when it may not open now (cuda_ipc.h, "Who may
 * open"): the cache hands it back, rndv_push turns it into WEFT_EAGAIN. */
#define IMPORT_NOT_NOW 2

/* What an export cache entry's data holds: the handle, and the block. */
struct export_data {
    uint8_t  handle[64];
    uint64_t block_base, block_id, block_size;
};
_Static_assert(sizeof(struct export_data) <= WEFT_IPC_CACHE_DATA, "export data fits a cache entry");

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
    struct weft_ipc_cache_entry  *entry;   /* mapping reference while copying (NULL: same process) */
    cudaEvent_t                   ev;
    int                           dev;
    int                           status;  /* WEFT_* of the copy */
};
#define OP_OF(n) weft_container_of(n, struct ipc_op, node)

struct ipc_peer {
    int       area_valid;   /* the peer exported its signal slots to me, and I reach them */
    struct sig_rec area;    /* its record */
    void     *area_mapped;  /* its slots here */
    int       area_opened;  /* area_mapped came from cudaIpcOpenMemHandle (closed at detach) */
    int       same_process; /* a rank of this process: nothing is opened between us */
    int       ipc_broken;   /* opening its buffer failed: its messages are staged */
    unsigned  warned;       /* open failures said (the first at warn level) */
    struct ipc_op *last_op; /* my last push to it still copying */
};

#endif /* WEFT_HAVE_CUDA_HEADERS */

/* Per-comm state (ctx), from create to destroy. */
struct ipc_state {
    const struct weft_tp_env *env;
    struct weft_core         *core;
    int                       rank, size;
    int                       on;            /* connect exchanged the signal slots: IPC usable */
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda   *cu;            /* set at connect when this rank has CUDA */
    int                       area_device;   /* the device of my signal slots */
    struct ipc_peer          *peers;         /* [size] */
    struct weft_ipc_cache    *imports;       /* peers' blocks mapped here */
    struct weft_ipc_cache    *exports;       /* my allocations' handles (peer -1) */
    cudaStream_t              streams[IPC_MAX_DEVICES];
    cudaEvent_t              *ev_free[IPC_MAX_DEVICES];  /* recycled events, per device */
    size_t                    ev_free_n[IPC_MAX_DEVICES], ev_free_cap[IPC_MAX_DEVICES];
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

/* A peer the signal slots are exchanged with: another rank of this
 * (effective) node whose card shows a GPU. */
static int node_gpu_peer(const struct ipc_state *st, int j)
{
    const struct weft_tp_cards *k = &st->env->cards;
    return j != st->rank && weft_tp_card(k, j)->node == weft_tp_card(k, st->rank)->node &&
           card_of(st->env, j)->gpu_count > 0;
}

/* A rank of this very process (same host, same pid). */
static int same_process(const struct ipc_state *st, int j)
{
    const struct weft_tp_cards *k = &st->env->cards;
    const struct weft_card_hdr *a = weft_tp_card(k, j), *b = weft_tp_card(k, st->rank);
    return a->node_key == b->node_key && a->pid == b->pid;
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

/* Whether this thread may call cudaIpcOpenMemHandle now (cuda_ipc.h). */
static int may_open(const struct ipc_state *st)
{
    return !st->core->cfg.cuda_ipc_open_syncs || weft_cuda_may_sync_in_progress();
}

/* ---------------------------------------------------------------- caches */

/* Context handed to the import cache's open. */
struct import_arg {
    struct ipc_state                   *st;
    const struct weft_cuda_ipc_payload *pl;
    uint64_t                            kbase, ksize;   /* what the entry maps: the block, else the allocation */
    int                                 dev;            /* importing device */
    cudaError_t                         err;
};

static cudaError_t open_handle(const struct weft_cuda *cu, const uint8_t *handle, int dev, void **ptr)
{
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof(h));
    int saved = dev_enter(cu, dev);
    cudaError_t e = cu->IpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
    dev_leave(cu, saved, dev);
    if (e != cudaSuccess) {
        cu->GetLastError();
        *ptr = NULL;
    }
    return e;
}

static int import_open(void *ctx, struct weft_ipc_cache_entry *e, const void *arg)
{
    struct import_arg *a = (struct import_arg *)arg;
    struct ipc_state *st = a->st;
    const struct weft_cuda *cu = st->cu;
    void *ptr = NULL;
    (void)ctx;

    if (!may_open(st))
        return IMPORT_NOT_NOW;
    a->err = open_handle(cu, a->pl->handle, a->dev, &ptr);
    if (a->err == cudaErrorAlreadyMapped) {
        /* A mapping of the same memory is still open (a block freed and
         * made again at the same addresses, or a driver that maps more than
         * the block it said): close this peer's idle mappings that overlap,
         * retry; then every idle mapping, retry. Closing waits for the
         * device: when it may not, the message is staged instead. */
        int closed = weft_ipc_cache_purge(st->imports, e->peer, a->kbase, a->kbase + a->ksize);
        if (closed < 0)
            return IMPORT_NOT_NOW;
        if (closed > 0)
            a->err = open_handle(cu, a->pl->handle, a->dev, &ptr);
        if (a->err == cudaErrorAlreadyMapped && weft_ipc_cache_purge(st->imports, -1, 0, 0) > 0)
            a->err = open_handle(cu, a->pl->handle, a->dev, &ptr);
        WEFT_TRACE(st->rank, "cuda_ipc: peer %d: block %#llx was mapped already: %s after closing idle mappings",
                   e->peer, (unsigned long long)a->kbase, a->err == cudaSuccess ? "opened" : "still refused");
    }
    if (a->err != cudaSuccess)
        return 1;
    /* The driver returns the exported allocation's address inside the
     * mapped block: the entry keeps the address of what it is keyed by,
     * and (for the close) what the open returned. */
    _Static_assert(sizeof(ptr) <= WEFT_IPC_CACHE_DATA, "a pointer fits a cache entry's data");
    memcpy(e->data, &ptr, sizeof(ptr));
    e->mapped = (char *)ptr - (a->pl->base - a->kbase);
    e->size = a->ksize;
    WEFT_TRACE(st->rank, "cuda_ipc: peer %d: opened IPC mapping of %s %#llx id %llu (%llu bytes) at %p", e->peer,
               a->pl->block_id ? "block" : "allocation", (unsigned long long)e->base, (unsigned long long)e->buffer_id,
               (unsigned long long)a->ksize, e->mapped);
    return 0;
}

/* cudaIpcCloseMemHandle takes what the open returned: the allocation the
 * entry was opened for, inside the mapping. The entry keeps that too. */
static void import_close(void *ctx, struct weft_ipc_cache_entry *e)
{
    struct ipc_state *st = ctx;
    void *opened;
    if (e->mapped == NULL)
        return;
    memcpy(&opened, e->data, sizeof(opened));
    cudaError_t err = st->cu->IpcCloseMemHandle(opened);
    if (err != cudaSuccess) {
        st->cu->GetLastError();
        WEFT_WARN(st->rank, "cuda_ipc: peer %d: closing the mapping of %#llx id %llu failed: %s", e->peer,
                  (unsigned long long)e->base, (unsigned long long)e->buffer_id, cu_err(st->cu, err));
    } else {
        WEFT_TRACE(st->rank, "cuda_ipc: peer %d: closed IPC mapping of %#llx id %llu", e->peer,
                   (unsigned long long)e->base, (unsigned long long)e->buffer_id);
    }
    e->mapped = NULL;
}

/* Closing a mapping waits for the device: not while a stream waits on
 * weft (core/cudawrap.h, weft_cuda_may_sync_in_progress: the lock is held,
 * and the thread may be the one that would let that stream go). */
static int import_may_close(void *ctx)
{
    (void)ctx;
    return weft_cuda_may_sync_in_progress();
}

static const struct weft_ipc_cache_ops import_ops = { import_open, import_close, import_may_close };

struct export_arg {
    const struct weft_cuda *cu;
    cudaError_t             err;
};

static int export_open(void *ctx, struct weft_ipc_cache_entry *e, const void *arg)
{
    struct export_arg *a = (struct export_arg *)arg;
    struct export_data d;
    struct weft_mem_block blk;
    cudaIpcMemHandle_t h;
    (void)ctx;
    a->err = a->cu->IpcGetMemHandle(&h, (void *)(uintptr_t)e->base);
    if (a->err != cudaSuccess) {
        a->cu->GetLastError();
        return 1;
    }
    memset(&d, 0, sizeof(d));
    memcpy(d.handle, &h, sizeof(h));
    /* The block, asked once per allocation (0: the driver does not say). */
    if (weft_cuda_mem_block((void *)(uintptr_t)e->base, &blk) == WEFT_SUCCESS && blk.base <= e->base) {
        d.block_base = blk.base;
        d.block_id = blk.id;
        d.block_size = blk.size;
    }
    memcpy(e->data, &d, sizeof(d));
    return 0;
}

static const struct weft_ipc_cache_ops export_ops = { export_open, NULL, NULL };

/* ---------------------------------------------------------------- set-up */

/* Closes what this rank mapped of its peers (imports and their signal
 * slots); the streams are synchronised first. */
static void detach_cuda(struct ipc_state *st)
{
    const struct weft_cuda *cu = st->cu;
    for (int d = 0; d < IPC_MAX_DEVICES; d++)
        if (st->streams[d] && cu->StreamSynchronize(st->streams[d]) != cudaSuccess)
            cu->GetLastError();
    /* Copies that finished but were not reported yet hold references:
     * the cache closes those entries too (nothing runs any more). */
    weft_ipc_cache_destroy(st->imports);
    st->imports = NULL;
    for (int i = 0; st->peers && i < st->size; i++) {
        struct ipc_peer *pp = &st->peers[i];
        if (pp->area_opened && pp->area_mapped && cu->IpcCloseMemHandle(pp->area_mapped) != cudaSuccess)
            cu->GetLastError();
        pp->area_opened = 0;
        pp->area_mapped = NULL;
        pp->area_valid = 0;
    }
    st->on = 0;
}

static void state_free_cuda(struct ipc_state *st)
{
    const struct weft_cuda *cu = st->cu;
    struct weft_list *n;

    if (cu == NULL) {
        /* Never connected with CUDA: no stream, op, mapping or slot. */
        free(st->peers);
        return;
    }
    for (int d = 0; d < IPC_MAX_DEVICES; d++)
        if (st->streams[d] && cu->StreamSynchronize(st->streams[d]) != cudaSuccess)
            cu->GetLastError();
    while ((n = weft_list_pop(&st->ops)) != NULL || (n = weft_list_pop(&st->done)) != NULL) {
        struct ipc_op *op = OP_OF(n);
        if (op->ev && cu->EventDestroy(op->ev) != cudaSuccess)
            cu->GetLastError();
        if (st->imports)
            weft_ipc_cache_put(st->imports, op->entry);
        free(op);
    }
    detach_cuda(st);   /* a no-op after weft_p2p_detach */
    weft_ipc_cache_destroy(st->exports);
    free(st->peers);
    for (int d = 0; d < IPC_MAX_DEVICES; d++) {
        for (size_t i = 0; i < st->ev_free_n[d]; i++)
            if (cu->EventDestroy(st->ev_free[d][i]) != cudaSuccess)
                cu->GetLastError();
        free(st->ev_free[d]);
    }
    for (int d = 0; d < IPC_MAX_DEVICES; d++)
        if (st->streams[d] && cu->StreamDestroy(st->streams[d]) != cudaSuccess)
            cu->GetLastError();
}

/* My signal slots (core/signals.c), and the records I send. */
static void area_setup(struct ipc_state *st, struct sig_rec *out, char *why, size_t whylen)
{
    struct sig_rec r;
    uintptr_t base;
    int any = 0;

    for (int j = 0; j < st->size; j++)
        if (node_gpu_peer(st, j))
            any = 1;
    if (!any) {
        snprintf(why, whylen, "no peer on this node with CUDA");
        return;
    }
    if (weft_signals_init(st->core, why, whylen) != WEFT_SUCCESS)
        return;
    memset(&r, 0, sizeof(r));
    if (weft_signals_export(st->core, &base, &st->area_device, r.handle) != WEFT_SUCCESS) {
        snprintf(why, whylen, "the signal slots could not be exported");
        return;
    }
    r.valid = 1;
    r.device = st->area_device;
    r.base = (uint64_t)base;
    for (int j = 0; j < st->size; j++)
        if (node_gpu_peer(st, j))
            out[j] = r;
}

/* After the exchange: the peers' slots mapped here (on the caller's thread:
 * opening may wait for the device), the caches, IPC on. */
static int area_accept(struct ipc_state *st, const struct sig_rec *recvr)
{
    const struct weft_cuda *cu = st->cu;
    int npeers = 0;
    for (int j = 0; j < st->size; j++) {
        struct ipc_peer *pp = &st->peers[j];
        if (!recvr[j].valid || !node_gpu_peer(st, j))
            continue;
        pp->area = recvr[j];
        pp->same_process = same_process(st, j);
        if (pp->same_process) {
            pp->area_mapped = (void *)(uintptr_t)recvr[j].base;   /* one address space */
        } else {
            cudaError_t e = open_handle(cu, recvr[j].handle, st->area_device, &pp->area_mapped);
            if (e != cudaSuccess) {
                WEFT_INFO(st->rank, "cuda_ipc: peer %d: its signal slots cannot be mapped here (%s): device "
                          "messages between us are staged", j, cu_err(cu, e));
                continue;
            }
            pp->area_opened = 1;
        }
        pp->area_valid = 1;
        npeers++;
    }
    size_t cap = st->core->cfg.cuda_ipc_cache > 0 ? (size_t)st->core->cfg.cuda_ipc_cache : 128;
    st->imports = weft_ipc_cache_create(cap, &import_ops, st);
    st->exports = weft_ipc_cache_create(cap, &export_ops, st);
    if (st->imports == NULL || st->exports == NULL)
        return weft_set_error(st->core, WEFT_ERR_NO_MEMORY, "cuda_ipc: no memory for the mapping caches");
    WEFT_INFO(st->rank, "cuda_ipc: on for %d peer(s) of this node (signal slots on device %d, mapping cache of %zu)",
              npeers, st->area_device, cap);
    st->on = 1;
    return WEFT_SUCCESS;
}

/* ---------------------------------------------------------------- receiver */

/* Fills the key for the receive x (eligible). */
static int export_key(struct ipc_state *st, int peer, struct weft_tp_xfer *x, const struct weft_mem_attr *attr,
                      void *key, size_t *keylen)
{
    struct weft_cuda_ipc_payload pl;
    struct weft_ipc_cache_entry *e = NULL;
    struct export_arg ea = { st->cu, cudaSuccess };
    struct export_data d;
    int rc;

    memset(&pl, 0, sizeof(pl));
    if (!st->peers[peer].same_process) {
        rc = weft_ipc_cache_get(st->exports, -1, attr->base, attr->buffer_id, &ea, &e, NULL);
        if (rc != 0)
            return weft_set_error(st->core, WEFT_ERR_TRANSPORT,
                                  "cuda_ipc: recv from peer %d tag %d: cannot export buffer %p (allocation %#llx id "
                                  "%llu): %s", peer, x->tag, x->buf, (unsigned long long)attr->base,
                                  (unsigned long long)attr->buffer_id, rc < 0 ? "no memory" : cu_err(st->cu, ea.err));
        memcpy(&d, e->data, sizeof(d));
        weft_ipc_cache_put(st->exports, e);
        memcpy(pl.handle, d.handle, sizeof(pl.handle));
        pl.block_base = d.block_base;
        pl.block_id = d.block_id;
        pl.block_size = d.block_size;
    }
    pl.magic = WEFT_CUDA_IPC_MAGIC;
    pl.base = attr->base;
    pl.buffer_id = attr->buffer_id;
    pl.alloc_size = attr->size;
    pl.offset = (uintptr_t)x->buf - attr->base;
    pl.bytes = x->bytes;
    pl.device = attr->device;
    if (x->signal_value != 0) {
        /* The sender's GPU writes the receive's slot right after its copy. */
        pl.signal_slot = x->signal_slot;
        pl.signal_value = x->signal_value;
        x->signal_sent = 1;
    }
    memcpy(key, &pl, sizeof(pl));
    *keylen = sizeof(pl);
    WEFT_TRACE(st->rank, "cuda_ipc: recv from peer %d tag %d: exported buffer %#llx+%llu id %llu (block %#llx id %llu), "
               "%llu bytes, signal slot %u value %u", peer, x->tag, (unsigned long long)pl.base,
               (unsigned long long)pl.offset, (unsigned long long)pl.buffer_id, (unsigned long long)pl.block_base,
               (unsigned long long)pl.block_id, (unsigned long long)pl.bytes, pl.signal_slot, pl.signal_value);
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
        return WEFT_EAGAIN;   /* no CUDA, no slots: nothing to log per message */
    if (!is_device_kind(src->mem_kind) || !is_device_kind(x->mem_kind))
        return WEFT_EAGAIN;
    k = &st->env->cards;
    if (peer < 0 || peer >= st->size || weft_tp_card(k, peer)->node != weft_tp_card(k, st->rank)->node)
        no = "not over shm (other node)";
    else if (!st->peers[peer].area_valid)
        no = "no signal slots exchanged with this peer";
    else if (weft_cuda_mem_attr(x->buf, &attr) != WEFT_SUCCESS || attr.kind != WEFT_MEM_DEVICE || attr.base == 0)
        no = "receive buffer is not device memory";
    else if ((uintptr_t)x->buf < attr.base || (uintptr_t)x->buf - attr.base > attr.size ||
             x->bytes > attr.size - ((uintptr_t)x->buf - attr.base))
        no = "message runs past the receive buffer's allocation";
    else if ((sdev = local_ordinal(st, peer, src->device)) < 0)
        no = "the sender's device is not visible here";
    else if (!can_access(st->cu, sdev, attr.device))
        no = "the sender's device cannot access the receive buffer's device";
    else if (!can_access(st->cu, sdev, st->area_device))
        no = "the sender's device cannot access the signal slots' device";
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

/* An event of device dev (the caller made dev current): recorded on that
 * device's stream ("event and stream must be on the same device"). */
static cudaEvent_t event_get(struct ipc_state *st, int dev, cudaError_t *err)
{
    cudaEvent_t ev = NULL;
    if (st->ev_free_n[dev])
        return st->ev_free[dev][--st->ev_free_n[dev]];
    *err = st->cu->EventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (*err != cudaSuccess) {
        st->cu->GetLastError();
        return NULL;
    }
    return ev;
}

static void event_put(struct ipc_state *st, int dev, cudaEvent_t ev)
{
    if (ev == NULL)
        return;
    if (st->ev_free_n[dev] == st->ev_free_cap[dev]) {
        size_t ncap = st->ev_free_cap[dev] ? 2 * st->ev_free_cap[dev] : 16;
        cudaEvent_t *nf = realloc(st->ev_free[dev], ncap * sizeof(*nf));
        if (nf == NULL) {
            if (st->cu->EventDestroy(ev) != cudaSuccess)
                st->cu->GetLastError();
            return;
        }
        st->ev_free[dev] = nf;
        st->ev_free_cap[dev] = ncap;
    }
    st->ev_free[dev][st->ev_free_n[dev]++] = ev;
}

/* weft's stream of device dev (the caller made dev current). */
static cudaStream_t stream_get(struct ipc_state *st, int dev, cudaError_t *err)
{
    if (st->streams[dev] == NULL) {
        *err = st->cu->StreamCreateWithFlags(&st->streams[dev], cudaStreamNonBlocking);
        if (*err != cudaSuccess) {
            st->cu->GetLastError();
            st->streams[dev] = NULL;
        }
    }
    return st->streams[dev];
}

/* The peer's buffer the key names, as an address here: its block mapped
 * through the cache (*entry holds a reference), or the buffer itself for a
 * rank of this process. WEFT_SUCCESS; WEFT_EAGAIN: not now or not at all
 * (the message goes another path); another code: recorded. */
static int map_peer_buffer(struct ipc_state *st, int peer, const struct weft_tp_xfer *x,
                           const struct weft_cuda_ipc_payload *pl, int dev, void **dst,
                           struct weft_ipc_cache_entry **entry, int *hit)
{
    struct ipc_peer *pp = &st->peers[peer];
    *entry = NULL;
    *hit = 1;
    if (pp->same_process) {
        *dst = (void *)(uintptr_t)(pl->base + pl->offset);
        return WEFT_SUCCESS;
    }
    if (pp->ipc_broken)
        return WEFT_EAGAIN;
    /* Keyed by the block when the receiver's driver said which; else by the
     * allocation (one mapping per allocation, and AlreadyMapped handled). */
    int by_block = pl->block_id != 0 && pl->block_base <= pl->base && pl->block_size > 0 &&
                   pl->base - pl->block_base < pl->block_size;
    struct import_arg ia = { st, pl, by_block ? pl->block_base : pl->base,
                             by_block ? pl->block_size : pl->alloc_size, dev, cudaSuccess };
    int rc = weft_ipc_cache_get(st->imports, peer, ia.kbase, by_block ? pl->block_id : pl->buffer_id, &ia, entry, hit);
    if (rc == IMPORT_NOT_NOW) {
        WEFT_TRACE(st->rank, "cuda_ipc: send to peer %d tag %d: its buffer %#llx is not mapped here, and opening it "
                   "now would wait for the device on a thread a stream waits for: staged", peer, x->tag,
                   (unsigned long long)pl->base);
        return WEFT_EAGAIN;
    }
    if (rc != 0) {
        /* Staged instead, never a failed message. A mapping of the same
         * memory held elsewhere in this process (the application's own
         * cudaIpcOpenMemHandle) concerns that buffer only; anything else
         * (IPC refused here) every later message to that peer too. */
        int this_buffer = rc > 0 && ia.err == cudaErrorAlreadyMapped;
        if (!this_buffer)
            pp->ipc_broken = 1;
        int level = pp->warned++ ? WEFT_LOG_TRACE : WEFT_LOG_WARN;
        WEFT_LOG(level, st->rank,
                 "cuda_ipc: send to peer %d tag %d: cannot open the IPC handle of its buffer %#llx id %llu: %s; %s "
                 "staged", peer, x->tag, (unsigned long long)pl->base, (unsigned long long)pl->buffer_id,
                 rc < 0 ? "no memory" : cu_err(st->cu, ia.err),
                 this_buffer ? "this message is" : "device messages to that peer are");
        return WEFT_EAGAIN;
    }
    *dst = (char *)(*entry)->mapped + (pl->base - ia.kbase) + pl->offset;
    return WEFT_SUCCESS;
}

/* Sender: the receiver's key for x arrived: map, copy, signal. A refusal
 * (nothing queued) records why and returns WEFT_ERR_TRANSPORT; the pipe
 * then tells the receiver (FIN with that code) and fails the send.
 * WEFT_EAGAIN: not by IPC after all (cuda_ipc.h, "Who may open"). */
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
    void *dst = NULL;
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
        pl.bytes > pl.alloc_size - pl.offset || (pl.signal_value && pl.signal_slot >= WEFT_SIGNAL_SLOTS))
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "cuda_ipc: send to peer %d tag %d: bad IPC payload (magic %#x, %llu bytes at offset %llu "
                              "of a %llu-byte allocation, message %zu bytes, slot %u)", peer, x->tag, pl.magic,
                              (unsigned long long)pl.bytes, (unsigned long long)pl.offset,
                              (unsigned long long)pl.alloc_size, x->bytes, pl.signal_slot);
    weft_cuda_mem_attr(x->buf, &attr);
    if (attr.kind != WEFT_MEM_DEVICE || attr.device < 0 || attr.device >= IPC_MAX_DEVICES)
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "cuda_ipc: send to peer %d tag %d: send buffer %p is not device memory of device 0..%d",
                              peer, x->tag, x->buf, IPC_MAX_DEVICES - 1);

    rc = map_peer_buffer(st, peer, x, &pl, attr.device, &dst, &e, &hit);
    if (rc != WEFT_SUCCESS)
        return rc;

    struct ipc_op *op = calloc(1, sizeof(*op));
    int saved = dev_enter(cu, attr.device);
    cudaStream_t stream = op ? stream_get(st, attr.device, &err) : NULL;
    cudaEvent_t ev = stream ? event_get(st, attr.device, &err) : NULL;
    if (op == NULL || stream == NULL || ev == NULL) {
        dev_leave(cu, saved, attr.device);
        if (e)
            weft_ipc_cache_put(st->imports, e);
        event_put(st, attr.device, ev);
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

    /* The copies of one sender to one peer stay in order: after a push on
     * another device's stream. */
    if (pp->last_op && pp->last_op->dev != attr.device && pp->last_op->ev)
        err = cu->StreamWaitEvent(stream, pp->last_op->ev, 0);
    const char *what = "cudaStreamWaitEvent";
    if (err == cudaSuccess && x->bytes) {
        if (pp->same_process) {
            what = "cudaMemcpyPeerAsync";
            err = cu->MemcpyPeerAsync(dst, pl.device, x->buf, attr.device, x->bytes, stream);
        } else {
            what = "cudaMemcpyAsync";
            err = cu->MemcpyAsync(dst, x->buf, x->bytes, cudaMemcpyDeviceToDevice, stream);
        }
    }
    if (err == cudaSuccess && pl.signal_value && pp->area_valid && pp->area_mapped) {
        /* The receive's stream waits for this word: right after the copy,
         * on the same stream (the default write orders the copy's bytes
         * before it). */
        CUdeviceptr word = (CUdeviceptr)((uintptr_t)pp->area_mapped + (uintptr_t)pl.signal_slot * sizeof(uint32_t));
        CUresult cr = cu->cuStreamWriteValue32((CUstream)stream, word, pl.signal_value, 0);
        if (cr == CUDA_SUCCESS)
            x->signal_done = 1;
        else
            WEFT_TRACE(st->rank, "cuda_ipc: send to peer %d tag %d: cuStreamWriteValue32 of its signal slot %u "
                       "failed (%s): its weft writes it", peer, x->tag, pl.signal_slot, drv_err(cu, cr));
    }
    if (err != cudaSuccess) {
        cu->GetLastError();
        op->status = weft_set_error(core, WEFT_ERR_TRANSPORT,
                                    "cuda_ipc: send to peer %d tag %d: %s of %zu bytes into its buffer %#llx id %llu "
                                    "failed: %s", peer, x->tag, what, x->bytes, (unsigned long long)pl.base,
                                    (unsigned long long)pl.buffer_id, cu_err(cu, err));
        x->signal_done = 0;
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
        event_put(st, attr.device, ev);
        op->ev = NULL;
        if (e)
            weft_ipc_cache_put(st->imports, e);
        op->entry = NULL;
        weft_list_add_tail(&st->done, &op->node);
    } else {
        pp->last_op = op;
        weft_list_add_tail(&st->ops, &op->node);
    }
    dev_leave(cu, saved, attr.device);
    WEFT_TRACE(st->rank, "cuda_ipc: send to peer %d tag %d: %zu bytes from device %d into its buffer %#llx+%llu "
               "id %llu by %s (mapping %s, signal %s)", peer, x->tag, x->bytes, attr.device,
               (unsigned long long)pl.base, (unsigned long long)pl.offset, (unsigned long long)pl.buffer_id,
               pp->same_process ? "a copy within the process" : "CUDA IPC",
               pp->same_process ? "not needed" : hit ? "cached" : "opened", x->signal_done ? "written" : "none");
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
        event_put(st, op->dev, op->ev);
        op->ev = NULL;
        if (op->entry && st->imports)
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
        if (status != WEFT_SUCCESS)
            x->signal_done = 0;
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
    return st->peers[peer].area_valid ? WEFT_TP_MEM_DEVICE : 0;
}

static void ipc_detach(void *ctx)
{
    struct ipc_state *st = ctx;
    if (st != NULL && st->cu != NULL)
        detach_cuda(st);
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
static void ipc_detach(void *ctx) { (void)ctx; }

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

/* transport.h, probe: what create puts in the card (the devices of a
 * loaded runtime, as the comm loaded it into core->cuda). */
static int ipc_probe(struct weft_core *core, char *what, size_t len)
{
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *cu = core->cuda ? weft_cuda_get() : NULL;
    if (cu == NULL || cu->device_count <= 0) {
        snprintf(what, len, "no CUDA device: %s", weft_cuda_why()[0] ? weft_cuda_why() : "CUDA not loaded");
        return 0;
    }
    snprintf(what, len, "%d CUDA device(s) from %s; device data between ranks of one node", cu->device_count,
             cu->path);
    return 1;
#else
    (void)core;
    snprintf(what, len, "weft was built without CUDA");
    return 0;
#endif
}

/* The signal-slot exchange. Collective: every rank takes part as soon as
 * any card shows a GPU (a rank without CUDA, or that does not offer
 * cuda_ipc, sends empty records), and none does in a job without GPUs; the
 * cards are the same everywhere, so every rank decides alike. */
static int ipc_connect(const struct weft_tp_env *env, void *ctx)
{
    struct ipc_state *st = ctx;
    struct weft_core *core = env->core;
    size_t n = (size_t)core->size;
    struct sig_rec *sendr, *recvr;
    char why[256] = "";
    int any_gpu = 0, rc = WEFT_SUCCESS;

    for (int r = 0; r < core->size && !any_gpu; r++)
        any_gpu = card_of(env, r)->gpu_count > 0;
    if (!any_gpu)
        return WEFT_SUCCESS;

    sendr = calloc(2 * n, sizeof(*sendr));
    if (sendr == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "cuda_ipc: no memory for the signal-slot exchange");
    recvr = sendr + n;

#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *cu = core->cuda ? weft_cuda_get() : NULL;
    if (st && cu) {
        st->cu = cu;
        area_setup(st, sendr, why, sizeof(why));
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
        rc = weft_set_error(core, rc, "cuda_ipc: the alltoall of the signal slots' handles failed");
        goto out;
    }
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (st && st->cu && core->signals) {
        rc = area_accept(st, recvr);
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
    .probe       = ipc_probe,
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
    .detach      = ipc_detach,
    .wakeless    = ipc_wakeless,
    .sleep       = NULL,
    .mem_pin     = NULL,
    .mem_unpin   = NULL,
};
