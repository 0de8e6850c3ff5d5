/* libweft_emu_cuda.so: an emulated CUDA runtime (and the few driver calls weft
 * reaches through cudaGetDriverEntryPoint) for machines without a GPU. A test
 * fixture: see tests/emu/cuda/README.md for what it models and how it differs
 * from real GPUs.
 *
 * Device memory: 2 MiB blocks, one memfd each, mapped MAP_SHARED with
 * PROT_NONE into a reserved address range of its own (so device pointers
 * never mix with the heap, and host code dereferencing one faults, as on a
 * GPU); allocations below 2 MiB are carved from shared blocks at 512-byte
 * units, larger ones get blocks of their own. Past the data, each memfd holds
 * the block's metadata (struct block_meta: which allocation starts at each
 * unit, how many importers), shared with importers. The emulator's own
 * operations (copies, memsets, stream memory operations, kernels) go through
 * a second, read-write mapping of the same memfd, the block's "alias":
 * host_view() translates a device address to it.
 * IPC: the 64-byte handle names the exporter (node, pid, a per-process token),
 * the block (memfd descriptor number, id, address) and the allocation
 * (offset, size, buffer id); the importer opens /proc/<pid>/fd/<n>, checks
 * the block's metadata that the allocation still lives, and maps the whole
 * block the same way (PROT_NONE at the import address, plus an alias).
 * The strict rules (README.md, "The rules that make it strict"): blocks and
 * AlreadyMapped, device-synchronising calls (refused on threads that wake
 * streams while a stream is parked), contexts, kernels by name, late
 * pageable H2D copies, event/stream devices, compute mode.
 * dma-buf (cuMemGetHandleForAddressRange): a fresh open file description of
 * the memfd whose file position encodes the range (see EMU_DMABUF_*).
 * Streams: one worker thread each, executing queued operations in order. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Everything the CUDA headers declare (and that this file defines) is
 * exported; the rest of the library stays hidden (-fvisibility=hidden). */
#pragma GCC visibility push(default)
#include <cuda.h>
#include <cuda_runtime_api.h>
#include "weft_emu_cuda.h"
#pragma GCC visibility pop
#include "emu_kernels.h"

#define EMU_MAX_DEV      16
#define EMU_PAGE         4096ULL
#define EMU_DEV_SPAN     (64ULL << 30)  /* address space per device */
#define EMU_IMPORT_SPAN  (256ULL << 30) /* address space for IPC imports */
#define EMU_DEV_HINT     0x500000000000ULL
#define EMU_IMPORT_HINT  0x540000000000ULL
#define EMU_VERSION      13000
#define EMU_IPC_MAGIC    0x57454d55u    /* "WEMU" */

/* An emulated dma-buf is an open file description of the allocation's memfd
 * whose file position says which range it stands for:
 *   tag (bits 62..56) | first page in the memfd (bits 55..28) | pages (27..0).
 * libweft_emu_verbs.so (ibv_reg_dmabuf_mr) decodes it with lseek(fd, 0,
 * SEEK_CUR); keep the two in step (tests/emu/verbs/emu_verbs.c). */
#define EMU_DMABUF_TAG   0x2DULL
#define EMU_DMABUF_FIELD 28

/* ------------------------------------------------------------------ state */

enum akind { A_DEVICE, A_HOST, A_REGISTERED, A_IMPORT };

/* Device memory comes in blocks, as real drivers hand it out: an allocation
 * below EMU_BLOCK bytes is carved, at EMU_UNIT granularity, out of a shared
 * 2 MiB block of its device; a larger one gets a block of its own (its size
 * rounded up to 2 MiB). A block is one memfd: its data, then its metadata
 * (struct block_meta), which importers map too. CUDA IPC maps blocks: a
 * handle names (block, offset), and an importer maps the whole block. */
#define EMU_BLOCK        (2ULL << 20)
#define EMU_UNIT         512ULL
#define EMU_UNITS        (EMU_BLOCK / EMU_UNIT)
#define EMU_META_LEN     (64ULL << 10)
#define EMU_META_MAGIC   0x41544d4255454d57ULL  /* "WMEUBMTA" */

/* Shared by the exporter and every importer of a block (after its data in
 * the memfd). Indexed by the unit an allocation starts at (a block of its
 * own: unit 0). */
struct block_meta {
    uint64_t magic;
    uint64_t block_id;
    uint64_t data_size;
    uint64_t pad[5];
    uint64_t bufid[EMU_UNITS];    /* buffer id of the live allocation starting there, 0: none */
    uint32_t imports[EMU_UNITS];  /* opens by other processes not yet closed */
};
_Static_assert(sizeof(struct block_meta) <= EMU_META_LEN, "block metadata fits");

struct block {
    struct block *next;       /* g_blocks[device] */
    uintptr_t  base;          /* device address, 2 MiB aligned */
    size_t     size;          /* data bytes */
    int        device;
    int        shared;        /* carved into units (allocations below EMU_BLOCK) */
    int        fd;
    void      *alias;         /* read-write mapping of data + metadata */
    struct block_meta *meta;
    uint64_t   id;            /* CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID */
    unsigned   nalloc;
    uint64_t   used[EMU_UNITS / 64]; /* shared blocks: units taken */
};

/* An allocation the importer opened inside an imported block. */
struct iopen {
    uintptr_t ptr;            /* what cudaIpcOpenMemHandle returned */
    size_t    off, size;      /* in the block */
    int       refs;
};

struct alloc {
    uintptr_t base;
    size_t    size;      /* bytes asked for (an import: the whole block) */
    size_t    map_size;  /* bytes it spans (device: whole units; host: pages) */
    int       kind;
    int       device;
    uint64_t  buffer_id;
    struct block *blk;   /* A_DEVICE: its block ... */
    size_t    off;       /* ... and offset in it */
    /* A_IMPORT: a mapped block of another process */
    int       fd;        /* its own descriptor of the exporter's memfd */
    void     *alias;     /* read-write mapping of data + metadata */
    struct block_meta *meta;
    uint64_t  imp_token, imp_block, imp_va; /* exporter's token, block id and block address */
    uint32_t  imp_pid;
    uint64_t  imp_id;    /* MEMORY_BLOCK_ID of the mapping in this process */
    struct iopen *opens;
    size_t    nopens, capopens;
};

struct vblock { uintptr_t addr; size_t len; };
struct vregion {
    uintptr_t base, end, bump;
    struct vblock *free; size_t nfree, capfree;
};

struct dev {
    char     busid[32];
    int      domain, bus, slot;
    unsigned char uuid[16];
    size_t   used;
    int      peer_enabled[EMU_MAX_DEV];
    struct CUstream_st *legacy, *perthread;
    unsigned flags;
};

struct CUctx_st { int device; };

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;      /* allocations, lists, refs */
static pthread_mutex_t g_done_mu = PTHREAD_MUTEX_INITIALIZER; /* completion state */
static pthread_cond_t g_done_cv = PTHREAD_COND_INITIALIZER;
static cudaError_t g_init_err;
static volatile int g_forked_child;
static int g_ndev;
static struct dev g_dev[EMU_MAX_DEV];
static struct CUctx_st g_ctx[EMU_MAX_DEV];
static int g_no_peer[EMU_MAX_DEV][EMU_MAX_DEV];
static unsigned g_node;
static uint64_t g_token;
static size_t g_mem_limit;
static int g_ipc_refcount;      /* WEFT_EMU_CUDA_IPC_REOPEN=refcount */
static int g_gdr;
static int g_exclusive;         /* WEFT_EMU_CUDA_COMPUTE_MODE=exclusive_process */
static unsigned g_late_min_us, g_late_max_us; /* WEFT_EMU_CUDA_H2D_LATE_US: pageable H2D lands late */
static int g_sync_ipc_open;     /* WEFT_EMU_CUDA_SYNC_IPC_OPEN: cudaIpcOpenMemHandle synchronises */
static int g_modules;           /* WEFT_EMU_CUDA_MODULES: 0 refuses every module (no image for this GPU) */
static struct vregion g_devva[EMU_MAX_DEV], g_impva;
static struct alloc **g_allocs; /* sorted by base */
static size_t g_nallocs, g_capallocs;
static uint64_t g_next_bufid;
static struct block *g_blocks[EMU_MAX_DEV];
static uint64_t g_next_blockid;
static struct CUstream_st *g_streams; /* live streams, default ones included */
static struct CUevent_st *g_events;

static _Thread_local int t_dev;
static _Thread_local cudaError_t t_err;
/* A context is current on this thread (rule: a host thread has none until
 * cudaSetDevice, cuCtxPushCurrent, or its first runtime call that needs
 * one, which binds the primary context of its current device). */
static _Thread_local int t_has_ctx;
/* The thread declared itself one that wakes streams (weft's progress
 * threads: weft_emu_cuda_thread_wakes_streams). */
static _Thread_local int t_wakes_streams;

enum { C_MALLOC, C_FREE, C_IPC_GET, C_IPC_OPEN, C_IPC_CLOSE, C_IPC_IMPORTS, C_MEMCPY,
       C_MEMSET, C_WAIT_VALUE, C_WRITE_VALUE, C_STREAMS, C_FREE_IMPORTED, C_SYNC_REFUSED,
       C_DEVICE_SYNCS, C_MODULE_LOADS, C_LAUNCHES, C_BLOCKS, C_LATE_H2D, C_WAIT_VALUE_DEVICE,
       C_EVENT_RECORD_REFUSED, C_NCOUNTERS };
static const char *const g_counter_names[C_NCOUNTERS] = {
    "malloc", "free", "ipc_get", "ipc_open", "ipc_close", "ipc_imports", "memcpy",
    "memset", "wait_value", "write_value", "streams", "free_imported", "sync_refused",
    "device_syncs", "module_loads", "launches", "blocks", "late_h2d", "wait_value_device",
    "event_record_refused" };
static unsigned long long g_counters[C_NCOUNTERS];
#define COUNT(c, d) __atomic_add_fetch(&g_counters[c], (unsigned long long)(d), __ATOMIC_RELAXED)

/* ------------------------------------------------------------------ helpers */

static cudaError_t rt_ret(cudaError_t e)
{
    if (e != cudaSuccess) t_err = e;
    return e;
}

static size_t round_page(size_t n) { return (n + EMU_PAGE - 1) & ~(size_t)(EMU_PAGE - 1); }

static unsigned long long env_ull(const char *name, unsigned long long def)
{
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end == 'k' || *end == 'K') v <<= 10;
    else if (*end == 'm' || *end == 'M') v <<= 20;
    else if (*end == 'g' || *end == 'G') v <<= 30;
    return v;
}

static uint64_t fnv1a(const void *p, size_t n, uint64_t h)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) { h ^= c[i]; h *= 1099511628211ULL; }
    return h;
}

#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_TSAN 1
#endif
#endif

static void *reserve(uintptr_t hint, size_t len)
{
#ifdef EMU_TSAN
    /* ThreadSanitizer only allows application memory in its own ranges (it
     * would turn the hint into address 0): let the kernel choose. */
    hint = 0;
#endif
    void *p = MAP_FAILED;
    if (hint)
        p = mmap((void *)hint, len, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED)
        p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Gives [addr, addr+len) back to the reservation: inaccessible again. */
static void unreserve_range(uintptr_t addr, size_t len)
{
    (void)mmap((void *)addr, len, PROT_NONE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

/* Index of the free range starting at addr, or -1. */
static long va_free_at(const struct vregion *r, uintptr_t addr)
{
    for (size_t i = 0; i < r->nfree; i++)
        if (r->free[i].addr == addr) return (long)i;
    return -1;
}

static void va_free_remove(struct vregion *r, size_t i)
{
    memmove(&r->free[i], &r->free[i + 1], (r->nfree - i - 1) * sizeof(*r->free));
    r->nfree--;
}

/* Address-space allocator: the most recently freed block of the same size
 * first (so a same-size cudaMalloc after cudaFree gets the same address, as
 * real GPUs often do), then freed blocks that lie next to each other and
 * together fit (two freed 2 MiB blocks give one 4 MiB block at the first's
 * address, as a driver's address space does: the case where an importer
 * still maps one of the old blocks), then fresh space, then any larger free
 * block. */
static uintptr_t va_get(struct vregion *r, size_t len)
{
    for (size_t i = r->nfree; i-- > 0;) {
        if (r->free[i].len == len) {
            uintptr_t a = r->free[i].addr;
            va_free_remove(r, i);
            return a;
        }
    }
    for (size_t i = r->nfree; i-- > 0;) {
        uintptr_t a = r->free[i].addr, end = a + r->free[i].len;
        long j;
        while (end - a < len && (j = va_free_at(r, end)) >= 0) end += r->free[j].len;
        if (end - a < len) continue;
        /* Take [a, a+len): whole ranges, and the head of the last one. */
        uintptr_t at = a;
        while (at < a + len) {
            long k = va_free_at(r, at);
            uintptr_t kend = at + r->free[k].len;
            if (kend <= a + len) {
                va_free_remove(r, (size_t)k);
            } else {
                r->free[k].addr = a + len;
                r->free[k].len = kend - (a + len);
            }
            at = kend;
        }
        return a;
    }
    if (r->end - r->bump >= len) {
        uintptr_t a = r->bump;
        r->bump += len;
        return a;
    }
    for (size_t i = 0; i < r->nfree; i++) {
        if (r->free[i].len > len) {
            uintptr_t a = r->free[i].addr;
            r->free[i].addr += len;
            r->free[i].len -= len;
            return a;
        }
    }
    return 0;
}

static void va_put(struct vregion *r, uintptr_t addr, size_t len)
{
    if (r->nfree == r->capfree) {
        size_t cap = r->capfree ? r->capfree * 2 : 64;
        struct vblock *n = realloc(r->free, cap * sizeof(*n));
        if (!n) return; /* the range is lost, nothing worse */
        r->free = n;
        r->capfree = cap;
    }
    r->free[r->nfree].addr = addr;
    r->free[r->nfree].len = len;
    r->nfree++;
}

/* g_mu held. Index of the allocation containing p, or -1. */
static long alloc_find_idx(uintptr_t p)
{
    size_t lo = 0, hi = g_nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_allocs[mid]->base <= p) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return -1;
    struct alloc *a = g_allocs[lo - 1];
    size_t span = a->size ? a->size : 1;
    return (p - a->base < span) ? (long)(lo - 1) : -1;
}

static struct alloc *alloc_find(uintptr_t p)
{
    long i = alloc_find_idx(p);
    return i < 0 ? NULL : g_allocs[i];
}

/* g_mu held. Where the emulator itself reads and writes p (inside a): the
 * alias of device memory and imports, p itself for host memory. */
static void *host_view(const struct alloc *a, uintptr_t p)
{
    if (a->kind == A_DEVICE) return (char *)a->blk->alias + a->off + (p - a->base);
    return a->alias ? (char *)a->alias + (p - a->base) : (void *)p;
}

/* g_mu held. First allocation overlapping [p, p+len), or NULL. */
static struct alloc *alloc_overlap(uintptr_t p, size_t len)
{
    for (size_t i = 0; i < g_nallocs; i++) {
        struct alloc *a = g_allocs[i];
        if (a->base < p + len && p < a->base + a->size) return a;
    }
    return NULL;
}

static int alloc_insert(struct alloc *a)
{
    if (g_nallocs == g_capallocs) {
        size_t cap = g_capallocs ? g_capallocs * 2 : 256;
        struct alloc **n = realloc(g_allocs, cap * sizeof(*n));
        if (!n) return -1;
        g_allocs = n;
        g_capallocs = cap;
    }
    size_t i = g_nallocs;
    while (i > 0 && g_allocs[i - 1]->base > a->base) {
        g_allocs[i] = g_allocs[i - 1];
        i--;
    }
    g_allocs[i] = a;
    g_nallocs++;
    return 0;
}

static void alloc_remove(struct alloc *a)
{
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i] == a) {
            memmove(&g_allocs[i], &g_allocs[i + 1], (g_nallocs - i - 1) * sizeof(*g_allocs));
            g_nallocs--;
            return;
        }
    }
}

/* ------------------------------------------------------------------ init */

static void on_fork_child(void) { g_forked_child = 1; }

static int parse_busid(const char *s, int *dom, int *bus, int *slot)
{
    unsigned d, b, sl, fn;
    if (sscanf(s, "%x:%x:%x.%x", &d, &b, &sl, &fn) == 4) {
        *dom = (int)d; *bus = (int)b; *slot = (int)sl;
        return 0;
    }
    if (sscanf(s, "%x:%x.%x", &b, &sl, &fn) == 3) {
        *dom = 0; *bus = (int)b; *slot = (int)sl;
        return 0;
    }
    return -1;
}

static void emu_init(void)
{
    const char *s = getenv("WEFT_EMU_CUDA_DEVICES");
    long n = 2;
    if (s && *s) n = strtol(s, NULL, 10);
    if (n < 0) n = 0;
    if (n > EMU_MAX_DEV) n = EMU_MAX_DEV;
    g_ndev = (int)n;
    s = getenv("WEFT_EMU_CUDA_NODE");
    /* Unset under WEFT_VIRTUAL_NODES: the virtual nodes are the emulated machines. */
    if (!s && env_ull("WEFT_VIRTUAL_NODES", 0) > 0) s = "auto";
    if (s && strcmp(s, "auto") == 0) {
        /* The node weft's WEFT_VIRTUAL_NODES puts this rank on: contiguous
         * blocks, rank * k / size (k capped at size). */
        const char *r = getenv("OMPI_COMM_WORLD_RANK"), *z = getenv("OMPI_COMM_WORLD_SIZE");
        if (!r) r = getenv("PMIX_RANK");
        if (!r) r = getenv("PMI_RANK");
        if (!z) z = getenv("PMI_SIZE");
        long long rank = r ? atoll(r) : 0, size = z ? atoll(z) : 0;
        long long k = (long long)env_ull("WEFT_VIRTUAL_NODES", 0);
        if (k > size) k = size;
        g_node = (k > 0 && size > 0 && rank >= 0) ? (unsigned)(rank * k / size) : 0;
    } else {
        g_node = (unsigned)env_ull("WEFT_EMU_CUDA_NODE", 0);
    }
    g_mem_limit = (size_t)env_ull("WEFT_EMU_CUDA_MEM", 16ULL << 30);
    if (g_mem_limit > EMU_DEV_SPAN) g_mem_limit = EMU_DEV_SPAN;
    s = getenv("WEFT_EMU_CUDA_IPC_REOPEN");
    g_ipc_refcount = s && strcmp(s, "refcount") == 0;
    g_gdr = (int)env_ull("WEFT_EMU_CUDA_GDR", 0) != 0;
    s = getenv("WEFT_EMU_CUDA_COMPUTE_MODE");
    g_exclusive = s && strcmp(s, "exclusive_process") == 0;
    g_sync_ipc_open = (int)env_ull("WEFT_EMU_CUDA_SYNC_IPC_OPEN", 1) != 0;
    g_modules = (int)env_ull("WEFT_EMU_CUDA_MODULES", 1) != 0;
    /* "MIN-MAX" or "N" microseconds; 0 turns it off. */
    g_late_min_us = 1000;
    g_late_max_us = 5000;
    s = getenv("WEFT_EMU_CUDA_H2D_LATE_US");
    if (s && *s) {
        unsigned a = 0, b = 0;
        int k = sscanf(s, "%u-%u", &a, &b);
        g_late_min_us = k >= 1 ? a : 0;
        g_late_max_us = k == 2 && b >= a ? b : g_late_min_us;
    }

    /* Bus ids: WEFT_EMU_CUDA_BUSIDS, then defaults for the rest. */
    char list[1024] = "";
    s = getenv("WEFT_EMU_CUDA_BUSIDS");
    if (s) snprintf(list, sizeof(list), "%s", s);
    char *save = NULL, *tok = strtok_r(list, ", ", &save);
    for (int d = 0; d < g_ndev; d++) {
        struct dev *dv = &g_dev[d];
        if (tok && parse_busid(tok, &dv->domain, &dv->bus, &dv->slot) == 0) {
            tok = strtok_r(NULL, ", ", &save);
        } else {
            dv->domain = 0; dv->bus = 0x10 + 0x10 * d; dv->slot = 0;
        }
        snprintf(dv->busid, sizeof(dv->busid), "%04x:%02x:%02x.0",
                 (unsigned)dv->domain, (unsigned)dv->bus, (unsigned)dv->slot);
        /* Same GPU (node, bus id) -> same UUID in every process. */
        uint64_t h1 = fnv1a(dv->busid, strlen(dv->busid), 1469598103934665603ULL ^ g_node);
        uint64_t h2 = fnv1a(&h1, sizeof(h1), h1 ^ 0x9e3779b97f4a7c15ULL);
        memcpy(dv->uuid, &h1, 8);
        memcpy(dv->uuid + 8, &h2, 8);
        dv->uuid[6] = (unsigned char)((dv->uuid[6] & 0x0f) | 0x40);
        dv->uuid[8] = (unsigned char)((dv->uuid[8] & 0x3f) | 0x80);
        g_ctx[d].device = d;
    }

    /* WEFT_EMU_CUDA_NO_PEER="0-1,2-3": pairs that cannot reach each other. */
    s = getenv("WEFT_EMU_CUDA_NO_PEER");
    if (s) {
        snprintf(list, sizeof(list), "%s", s);
        for (tok = strtok_r(list, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
            int a, b;
            if (sscanf(tok, "%d-%d", &a, &b) == 2 && a >= 0 && b >= 0 && a < EMU_MAX_DEV &&
                b < EMU_MAX_DEV)
                g_no_peer[a][b] = g_no_peer[b][a] = 1;
        }
    }

    uint64_t t = 0;
    if (syscall(SYS_getrandom, &t, sizeof(t), 0) != (long)sizeof(t)) t = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    g_token = t ^ ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec;
    if (!g_token) g_token = 1;

    if (g_ndev > 0) {
        /* One block more than needed: blocks start on 2 MiB boundaries,
         * wherever the kernel put the range (ThreadSanitizer's builds). */
        uint8_t *base = reserve(EMU_DEV_HINT, (size_t)g_ndev * EMU_DEV_SPAN + EMU_BLOCK);
        uint8_t *imp = reserve(EMU_IMPORT_HINT, EMU_IMPORT_SPAN + EMU_BLOCK);
        if (!base || !imp) {
            g_init_err = cudaErrorInitializationError;
            return;
        }
        base = (uint8_t *)(((uintptr_t)base + EMU_BLOCK - 1) & ~(uintptr_t)(EMU_BLOCK - 1));
        imp = (uint8_t *)(((uintptr_t)imp + EMU_BLOCK - 1) & ~(uintptr_t)(EMU_BLOCK - 1));
        for (int d = 0; d < g_ndev; d++) {
            g_devva[d].base = g_devva[d].bump = (uintptr_t)base + (uintptr_t)d * EMU_DEV_SPAN;
            g_devva[d].end = g_devva[d].base + EMU_DEV_SPAN;
        }
        g_impva.base = g_impva.bump = (uintptr_t)imp;
        g_impva.end = g_impva.base + EMU_IMPORT_SPAN;
    }
    /* One descriptor per device allocation: lift the soft limit. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    pthread_atfork(NULL, NULL, on_fork_child);
}

/* For calls that need the runtime (and a device). */
static cudaError_t ensure(void)
{
    pthread_once(&g_once, emu_init);
    if (g_forked_child) return cudaErrorInitializationError;
    if (g_init_err) return g_init_err;
    if (g_ndev == 0) return cudaErrorNoDevice;
    if (t_dev >= g_ndev) t_dev = 0;
    return cudaSuccess;
}

#define ENSURE()                               \
    do {                                       \
        cudaError_t e_ = ensure();             \
        if (e_ != cudaSuccess) return rt_ret(e_); \
    } while (0)

static CUresult drv_err(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return CUDA_SUCCESS;
    case cudaErrorNoDevice: return CUDA_ERROR_NO_DEVICE;
    case cudaErrorInitializationError: return CUDA_ERROR_NOT_INITIALIZED;
    case cudaErrorInvalidValue: return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorInvalidResourceHandle: return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case cudaErrorNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    case cudaErrorNotPermitted: return CUDA_ERROR_NOT_PERMITTED;
    case cudaErrorAlreadyMapped: return CUDA_ERROR_ALREADY_MAPPED;
    default: return CUDA_ERROR_UNKNOWN;
    }
}

/* ------------------------------------------------------------------ streams */

enum opkind { OP_COPY, OP_SET, OP_HOSTFN, OP_CALLBACK, OP_DELAY, OP_WAIT_EVENT, OP_WAIT_STREAM,
              OP_RECORD, OP_WAIT32, OP_WAIT64, OP_WRITE32, OP_WRITE64, OP_KERNEL, OP_LATE };

struct op {
    struct op *next;
    int       kind;
    uint64_t  seq;
    void     *dst;
    const void *src;
    size_t    n;
    int       value;
    uint64_t  u64;
    unsigned  flags;
    void    (*fn)(void *);
    cudaStreamCallback_t cb;
    void     *arg;
    struct CUevent_st  *ev;
    struct CUstream_st *other;
    uint64_t  gen;
    void     *owned;      /* freed with the op (a late H2D copy's staged bytes) */
    const struct emu_kernel *kernel; /* OP_KERNEL: dst, src (a), arg (b), n, value (divisor) */
};

#define STREAM_LEGACY    1
#define STREAM_PERTHREAD 2

struct CUstream_st {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    struct op      *head, *tail;
    uint64_t        enq_seq;  /* under mu (atomic loads elsewhere) */
    uint64_t        done_seq; /* under g_done_mu */
    int             device;
    unsigned        flags;
    int             priority;
    int             special;  /* STREAM_LEGACY / STREAM_PERTHREAD / 0 */
    int             destroying;
    int             capturing; /* cudaStreamBeginCapture .. EndCapture (state only) */
    int             refs;     /* under g_mu: user handle, worker, ops */
    pthread_t       thread;
    struct CUstream_st *next_all;
    struct op      *cur;      /* under mu: the op the worker runs now */
};

struct CUevent_st {
    unsigned flags;
    int      device;
    uint64_t rec_gen;  /* under g_done_mu */
    uint64_t done_gen; /* under g_done_mu */
    int      legacy;   /* under g_done_mu: last recorded on a legacy stream */
    struct timespec t;
    int      refs;     /* under g_mu */
    struct CUevent_st *next_all;
};

static void stream_unref(struct CUstream_st *s)
{
    pthread_mutex_lock(&g_mu);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&g_mu);
    if (last) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
    }
}

static void event_unref(struct CUevent_st *e)
{
    pthread_mutex_lock(&g_mu);
    int last = --e->refs == 0;
    pthread_mutex_unlock(&g_mu);
    if (last) free(e);
}

static void sleep_us(unsigned long us)
{
    struct timespec ts = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static int wait_pred32(uint32_t cur, uint32_t v, unsigned flags)
{
    switch (flags & 0x3) {
    case CU_STREAM_WAIT_VALUE_GEQ: return (int32_t)(cur - v) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return cur == v;
    case CU_STREAM_WAIT_VALUE_AND: return (cur & v) != 0;
    default: return ~(cur | v) != 0;
    }
}

static int wait_pred64(uint64_t cur, uint64_t v, unsigned flags)
{
    switch (flags & 0x3) {
    case CU_STREAM_WAIT_VALUE_GEQ: return (int64_t)(cur - v) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return cur == v;
    case CU_STREAM_WAIT_VALUE_AND: return (cur & v) != 0;
    default: return ~(cur | v) != 0;
    }
}

/* Polls a word in memory (written by another stream, the host, or another
 * process through an IPC mapping): spins briefly, then sleeps in growing
 * steps, so that waiting streams leave the CPU to the writers. */
static void poll_wait(const struct op *o)
{
    unsigned long spins = 0, us = 5;
    for (;;) {
        int ok;
        if (o->kind == OP_WAIT32)
            ok = wait_pred32(__atomic_load_n((uint32_t *)o->dst, __ATOMIC_ACQUIRE), (uint32_t)o->u64, o->flags);
        else
            ok = wait_pred64(__atomic_load_n((uint64_t *)o->dst, __ATOMIC_ACQUIRE), o->u64, o->flags);
        if (ok) return;
        if (++spins < 64) { sched_yield(); continue; }
        sleep_us(us);
        if (us < 200) us += us / 2 + 1;
    }
}

/* Late pageable H2D copies (OP_LATE) wait on the legacy stream until their
 * time is up -- or until someone waits for the legacy stream's work: then
 * the ordering is visible to CUDA (a sync, a blocking stream's later work,
 * an event recorded there) and a GPU would have the data in place for
 * that waiter. So a sync costs no artificial delay, and only readers
 * without one see the old bytes. g_done_mu held. */
static uint64_t g_late_flush; /* under g_done_mu */

static void late_flush_locked(void)
{
    g_late_flush++;
    pthread_cond_broadcast(&g_done_cv);
}

static void op_exec(struct CUstream_st *s, struct op *o)
{
    switch (o->kind) {
    case OP_COPY:
        /* Ordering with other streams and processes comes from the acquire
         * loads of stream waits and the seq_cst stores of stream writes. */
        memmove(o->dst, o->src, o->n);
        break;
    case OP_SET:
        memset(o->dst, o->value, o->n);
        break;
    case OP_HOSTFN: o->fn(o->arg); break;
    case OP_CALLBACK: o->cb(s, cudaSuccess, o->arg); break;
    case OP_DELAY: sleep_us(o->n); break;
    case OP_LATE: {
        /* o->u64: the deadline (CLOCK_REALTIME ns); o->gen: the flush count
         * when the copy was made. */
        struct timespec dl = { (time_t)(o->u64 / 1000000000ull), (long)(o->u64 % 1000000000ull) };
        pthread_mutex_lock(&g_done_mu);
        while (g_late_flush == o->gen) {
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            if ((uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec >= o->u64) break;
            pthread_cond_timedwait(&g_done_cv, &g_done_mu, &dl);
        }
        pthread_mutex_unlock(&g_done_mu);
        break;
    }
    case OP_WAIT_EVENT:
        pthread_mutex_lock(&g_done_mu);
        if (o->ev->legacy && o->ev->done_gen < o->gen) late_flush_locked();
        while (o->ev->done_gen < o->gen) pthread_cond_wait(&g_done_cv, &g_done_mu);
        pthread_mutex_unlock(&g_done_mu);
        event_unref(o->ev);
        break;
    case OP_WAIT_STREAM:
        pthread_mutex_lock(&g_done_mu);
        if (o->other->special == STREAM_LEGACY && o->other->done_seq < o->gen) late_flush_locked();
        while (o->other->done_seq < o->gen) pthread_cond_wait(&g_done_cv, &g_done_mu);
        pthread_mutex_unlock(&g_done_mu);
        stream_unref(o->other);
        break;
    case OP_RECORD: {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        pthread_mutex_lock(&g_done_mu);
        if (o->ev->done_gen < o->gen) {
            o->ev->done_gen = o->gen;
            o->ev->t = now;
        }
        pthread_cond_broadcast(&g_done_cv);
        pthread_mutex_unlock(&g_done_mu);
        event_unref(o->ev);
        break;
    }
    case OP_WAIT32:
    case OP_WAIT64:
        poll_wait(o);
        break;
    case OP_WRITE32:
        if (o->flags & CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
            __atomic_store_n((uint32_t *)o->dst, (uint32_t)o->u64, __ATOMIC_RELAXED);
        else
            __atomic_store_n((uint32_t *)o->dst, (uint32_t)o->u64, __ATOMIC_SEQ_CST);
        break;
    case OP_WRITE64:
        if (o->flags & CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
            __atomic_store_n((uint64_t *)o->dst, o->u64, __ATOMIC_RELAXED);
        else
            __atomic_store_n((uint64_t *)o->dst, o->u64, __ATOMIC_SEQ_CST);
        break;
    case OP_KERNEL:
        emu_kernel_run(o->kernel, o->dst, o->src, o->arg, o->u64, o->value);
        break;
    }
}

static void *stream_worker(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->destroying) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        struct op *o = s->head;
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->cur = o;   /* what stream_parked looks at, besides the queue */
        pthread_mutex_unlock(&s->mu);
        op_exec(s, o);
        pthread_mutex_lock(&g_done_mu);
        s->done_seq = o->seq;
        pthread_cond_broadcast(&g_done_cv);
        pthread_mutex_unlock(&g_done_mu);
        pthread_mutex_lock(&s->mu);
        s->cur = NULL;
        pthread_mutex_unlock(&s->mu);
        if (o->owned) free(o->owned);
        free(o);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    stream_unref(s);
    return NULL;
}

/* g_mu held. */
static struct CUstream_st *stream_new_locked(int device, unsigned flags, int priority, int special,
                                             cudaError_t *err)
{
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (!s) { *err = cudaErrorMemoryAllocation; return NULL; }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->device = device;
    s->flags = flags;
    s->priority = priority;
    s->special = special;
    s->refs = 2;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&s->thread, &at, stream_worker, s);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        *err = cudaErrorMemoryAllocation;
        return NULL;
    }
    s->next_all = g_streams;
    g_streams = s;
    COUNT(C_STREAMS, 1);
    return s;
}

/* The stream a handle names: 0 / cudaStreamLegacy -> the legacy default
 * stream of the current device, cudaStreamPerThread -> its per-thread stream
 * (one per device, shared by all threads), else a created, live stream. */
static cudaError_t stream_resolve(cudaStream_t h, struct CUstream_st **out)
{
    cudaError_t err = cudaSuccess;
    pthread_mutex_lock(&g_mu);
    if (h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread) {
        struct dev *d = &g_dev[t_dev];
        struct CUstream_st **slot = (h == cudaStreamPerThread) ? &d->perthread : &d->legacy;
        if (!*slot)
            *slot = stream_new_locked(t_dev, cudaStreamDefault, 0,
                                      h == cudaStreamPerThread ? STREAM_PERTHREAD : STREAM_LEGACY, &err);
        *out = *slot;
    } else {
        struct CUstream_st *s;
        for (s = g_streams; s && s != h; s = s->next_all) {}
        if (!s) err = cudaErrorInvalidResourceHandle;
        *out = s;
    }
    pthread_mutex_unlock(&g_mu);
    return err;
}

static struct op *op_new(int kind)
{
    struct op *o = calloc(1, sizeof(*o));
    if (o) o->kind = kind;
    return o;
}

static int stream_pending(struct CUstream_st *s, uint64_t *upto)
{
    uint64_t e = __atomic_load_n(&s->enq_seq, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&g_done_mu);
    int p = s->done_seq < e;
    pthread_mutex_unlock(&g_done_mu);
    *upto = e;
    return p;
}

/* Legacy default stream semantics (approximated): work on the legacy stream
 * waits for the work already queued on every blocking stream of its device,
 * and work on a blocking stream waits for the work already queued on the
 * legacy stream. Returns a chain of OP_WAIT_STREAM to put in front. */
static struct op *legacy_deps(struct CUstream_st *s)
{
    struct op *chain = NULL;
    if (s->flags & cudaStreamNonBlocking) return NULL;
    pthread_mutex_lock(&g_mu);
    for (struct CUstream_st *o = g_streams; o; o = o->next_all) {
        if (o == s || o->device != s->device || (o->flags & cudaStreamNonBlocking)) continue;
        if (s->special != STREAM_LEGACY && o->special != STREAM_LEGACY) continue;
        uint64_t upto;
        if (!stream_pending(o, &upto)) continue;
        struct op *w = op_new(OP_WAIT_STREAM);
        if (!w) continue;
        w->other = o;
        w->gen = upto;
        o->refs++;
        w->next = chain;
        chain = w;
    }
    pthread_mutex_unlock(&g_mu);
    return chain;
}

/* Queues o (after any legacy-stream dependencies); returns its sequence number. */
static uint64_t stream_push(struct CUstream_st *s, struct op *o)
{
    struct op *chain = legacy_deps(s);
    pthread_mutex_lock(&s->mu);
    while (chain) {
        struct op *w = chain;
        chain = w->next;
        w->next = NULL;
        w->seq = s->enq_seq + 1;
        if (s->tail) s->tail->next = w;
        else s->head = w;
        s->tail = w;
        __atomic_store_n(&s->enq_seq, w->seq, __ATOMIC_RELEASE);
    }
    o->next = NULL;
    o->seq = s->enq_seq + 1;
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    uint64_t seq = o->seq; /* o belongs to the worker once the lock is dropped */
    __atomic_store_n(&s->enq_seq, seq, __ATOMIC_RELEASE);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return seq;
}

static void stream_wait_seq(struct CUstream_st *s, uint64_t seq)
{
    pthread_mutex_lock(&g_done_mu);
    if (s->special == STREAM_LEGACY && s->done_seq < seq) late_flush_locked();
    while (s->done_seq < seq) pthread_cond_wait(&g_done_cv, &g_done_mu);
    pthread_mutex_unlock(&g_done_mu);
}

static void stream_sync(struct CUstream_st *s)
{
    stream_wait_seq(s, __atomic_load_n(&s->enq_seq, __ATOMIC_ACQUIRE));
}

/* Waits for all work queued so far on the streams of `device` (-1: all). */
static void sync_streams(int device)
{
    struct CUstream_st *list[256];
    uint64_t upto[256];
    size_t n = 0;
    pthread_mutex_lock(&g_mu);
    for (struct CUstream_st *s = g_streams; s && n < 256; s = s->next_all) {
        if (device >= 0 && s->device != device) continue;
        s->refs++;
        list[n] = s;
        upto[n] = __atomic_load_n(&s->enq_seq, __ATOMIC_ACQUIRE);
        n++;
    }
    pthread_mutex_unlock(&g_mu);
    for (size_t i = 0; i < n; i++) {
        stream_wait_seq(list[i], upto[i]);
        stream_unref(list[i]);
    }
}

/* ------------------------------------------------------------------ device-synchronising calls */

/* 1 when o is a stream memory wait whose word does not satisfy it now. */
static int wait_unsatisfied(const struct op *o)
{
    if (o->kind == OP_WAIT32)
        return !wait_pred32(__atomic_load_n((uint32_t *)o->dst, __ATOMIC_ACQUIRE), (uint32_t)o->u64, o->flags);
    if (o->kind == OP_WAIT64)
        return !wait_pred64(__atomic_load_n((uint64_t *)o->dst, __ATOMIC_ACQUIRE), o->u64, o->flags);
    return 0;
}

/* A stream of `device` (-1: any) parked on a stream memory wait that is
 * not satisfied now (running, or queued): described into buf; 0 if none.
 * Such a stream moves only when someone writes its word. */
static int stream_parked(int device, char *buf, size_t len)
{
    int found = 0;
    pthread_mutex_lock(&g_mu);
    for (struct CUstream_st *s = g_streams; s && !found; s = s->next_all) {
        if (device >= 0 && s->device != device) continue;
        pthread_mutex_lock(&s->mu);
        const struct op *w = NULL;
        if (s->cur && wait_unsatisfied(s->cur)) w = s->cur;
        for (const struct op *o = s->head; o && !w; o = o->next)
            if (wait_unsatisfied(o)) w = o;
        if (w) {
            found = 1;
            snprintf(buf, len, "stream %p (device %d%s) waits in cuStreamWaitValue%d for the word at %p to reach "
                     "%llu (it holds %llu)", (void *)s, s->device,
                     s->special == STREAM_LEGACY ? ", the legacy default stream" : "",
                     w->kind == OP_WAIT32 ? 32 : 64, w->dst, (unsigned long long)w->u64,
                     w->kind == OP_WAIT32 ? (unsigned long long)__atomic_load_n((uint32_t *)w->dst, __ATOMIC_ACQUIRE)
                                          : (unsigned long long)__atomic_load_n((uint64_t *)w->dst, __ATOMIC_ACQUIRE));
        }
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&g_mu);
    return found;
}

/* A call that synchronises the device (allocations, pinned allocations,
 * host registration, frees, IPC open and the last close, module loads and
 * a function's first lookup): waits for all work queued on `device`'s
 * streams (-1: every device), as a GPU does. From a thread that declared
 * itself a waker of streams (weft_emu_cuda_thread_wakes_streams) while a
 * stream is parked on a wait, it fails at once instead: on a GPU it would
 * wait for that stream, and the stream for the thread's write. */
static cudaError_t device_sync(const char *call, int device)
{
    COUNT(C_DEVICE_SYNCS, 1);
    if (t_wakes_streams) {
        char what[256];
        if (stream_parked(device, what, sizeof(what))) {
            COUNT(C_SYNC_REFUSED, 1);
            fprintf(stderr, "weft-emu-cuda: %s refused with cudaErrorNotPermitted: thread %ld declared that it "
                    "wakes streams (weft_emu_cuda_thread_wakes_streams) and %s. %s synchronises the device: on a "
                    "GPU it would wait for that stream, and the stream for this thread -- a deadlock.\n",
                    call, (long)syscall(SYS_gettid), what, call);
            return cudaErrorNotPermitted;
        }
    }
    sync_streams(device);
    return cudaSuccess;
}

void weft_emu_cuda_thread_wakes_streams(void) { t_wakes_streams = 1; }

/* ------------------------------------------------------------------ contexts */

/* Primary contexts of this process: made at a thread's first binding of a
 * device. Under WEFT_EMU_CUDA_COMPUTE_MODE=exclusive_process one process of
 * the emulated node may hold a device's context: a lock file per (node,
 * device) names the holder's pid; another process's context creation fails
 * with cudaErrorDevicesUnavailable (a holder that exited is replaced). */
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_ctx_state[EMU_MAX_DEV];   /* 0 not made, 1 made, -1 refused */
static char g_excl_path[EMU_MAX_DEV][96];

static void excl_release(void)
{
    for (int d = 0; d < EMU_MAX_DEV; d++)
        if (g_ctx_state[d] == 1 && g_excl_path[d][0]) unlink(g_excl_path[d]);
}

static int excl_take(int d)
{
    char *path = g_excl_path[d];
    snprintf(path, sizeof(g_excl_path[d]), "/dev/shm/weft-emu-cuda-excl-n%u-d%d", g_node, d);
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
        if (fd >= 0) {
            char pid[32];
            int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
            if (write(fd, pid, (size_t)n) != n) { close(fd); unlink(path); return -1; }
            close(fd);
            static int registered;
            if (!registered++) atexit(excl_release);
            return 0;
        }
        if (errno != EEXIST) return -1;
        char buf[32] = "";
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t r = read(fd, buf, sizeof(buf) - 1);
            buf[r > 0 ? r : 0] = '\0';
            close(fd);
        }
        long holder = atol(buf);
        if (holder > 0 && (kill((pid_t)holder, 0) == 0 || errno == EPERM)) return -1;
        unlink(path);   /* the holder exited: its claim goes */
    }
    return -1;
}

static cudaError_t ctx_make(int d)
{
    if (!g_exclusive) return cudaSuccess;
    pthread_mutex_lock(&g_ctx_mu);
    if (g_ctx_state[d] == 0) g_ctx_state[d] = excl_take(d) == 0 ? 1 : -1;
    int st = g_ctx_state[d];
    pthread_mutex_unlock(&g_ctx_mu);
    return st == 1 ? cudaSuccess : cudaErrorDevicesUnavailable;
}

/* For runtime calls that need a context: binds the primary context of the
 * thread's current device at the thread's first such call. */
static cudaError_t ensure_ctx(void)
{
    cudaError_t e = ensure();
    if (e != cudaSuccess) return e;
    if (!t_has_ctx) {
        e = ctx_make(t_dev);
        if (e != cudaSuccess) return e;
        t_has_ctx = 1;
    }
    return cudaSuccess;
}

#define ENSURE_CTX()                                  \
    do {                                              \
        cudaError_t e_ = ensure_ctx();                \
        if (e_ != cudaSuccess) return rt_ret(e_);     \
    } while (0)

/* For driver calls that work in the current context: none -> error. */
static CUresult need_ctx(void)
{
    cudaError_t e = ensure();
    if (e != cudaSuccess) return drv_err(e);
    return t_has_ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* ------------------------------------------------------------------ errors */

#define RT_ERRORS(X)                                                                   \
    X(cudaSuccess, "no error")                                                         \
    X(cudaErrorInvalidValue, "invalid argument")                                       \
    X(cudaErrorMemoryAllocation, "out of memory")                                      \
    X(cudaErrorInitializationError, "initialization error")                            \
    X(cudaErrorCudartUnloading, "driver shutting down")                                \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                         \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")            \
    X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version") \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                         \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                \
    X(cudaErrorDeviceUninitialized, "invalid device context")                          \
    X(cudaErrorMapBufferObjectFailed, "mapping of buffer object failed")               \
    X(cudaErrorAlreadyMapped, "resource already mapped")                               \
    X(cudaErrorPeerAccessUnsupported, "peer access is not supported between these two devices") \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                       \
    X(cudaErrorSymbolNotFound, "named symbol not found")                               \
    X(cudaErrorNotReady, "device not ready")                                           \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")             \
    X(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled")             \
    X(cudaErrorPeerAccessNotEnabled, "peer access has not been enabled")               \
    X(cudaErrorSetOnActiveProcess, "cannot set while device is active in this process") \
    X(cudaErrorHostMemoryAlreadyRegistered, "part or all of the requested memory range is already mapped") \
    X(cudaErrorHostMemoryNotRegistered, "pointer does not correspond to a registered memory region") \
    X(cudaErrorNotSupported, "operation not supported")                                \
    X(cudaErrorNotPermitted, "operation not permitted")                                \
    X(cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable")  \
    X(cudaErrorMisalignedAddress, "misaligned address")                                \
    X(cudaErrorInvalidKernelImage, "device kernel image is invalid")                   \
    X(cudaErrorUnknown, "unknown error")

#define DRV_ERRORS(X)                                                                  \
    X(CUDA_SUCCESS, "no error")                                                        \
    X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                    \
    X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                       \
    X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                              \
    X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                \
    X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                      \
    X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                             \
    X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                            \
    X(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                        \
    X(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                            \
    X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                            \
    X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                  \
    X(CUDA_ERROR_NOT_READY, "device not ready")                                        \
    X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices") \
    X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                             \
    X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                             \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")          \
    X(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address")                             \
    X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                      \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device") \
    X(CUDA_ERROR_UNKNOWN, "unknown error")

const char *cudaGetErrorName(cudaError_t error)
{
#define X(c, s) case c: return #c;
    switch (error) { RT_ERRORS(X) default: break; }
#undef X
    return "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t error)
{
#define X(c, s) case c: return s;
    switch (error) { RT_ERRORS(X) default: break; }
#undef X
    return "unrecognized error code";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_err;
    t_err = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_err; }

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
#define X(c, s) case c: *pStr = s; return CUDA_SUCCESS;
    switch (error) { DRV_ERRORS(X) default: break; }
#undef X
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
#define X(c, s) case c: *pStr = #c; return CUDA_SUCCESS;
    switch (error) { DRV_ERRORS(X) default: break; }
#undef X
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------ versions, devices */

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v) return rt_ret(cudaErrorInvalidValue);
    *v = EMU_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v) return rt_ret(cudaErrorInvalidValue);
    *v = EMU_VERSION;
    return cudaSuccess;
}

CUresult cuDriverGetVersion(int *v)
{
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = EMU_VERSION;
    return CUDA_SUCCESS;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return rt_ret(cudaErrorInvalidValue);
    cudaError_t e = ensure();
    *count = e == cudaSuccess ? g_ndev : 0;
    return rt_ret(e);
}

/* Since CUDA 12 cudaSetDevice initialises the device's primary context and
 * makes it current on the thread. */
cudaError_t cudaSetDevice(int device)
{
    ENSURE();
    if (device < 0 || device >= g_ndev) return rt_ret(cudaErrorInvalidDevice);
    cudaError_t e = ctx_make(device);
    if (e != cudaSuccess) return rt_ret(e);
    t_dev = device;
    t_has_ctx = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device) return rt_ret(cudaErrorInvalidValue);
    ENSURE();
    *device = t_dev;
    return cudaSuccess;
}

cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
    (void)deviceFlags; (void)flags;
    ENSURE();
    if (device < 0 || device >= g_ndev) return rt_ret(cudaErrorInvalidDevice);
    return cudaSuccess;
}

cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    ENSURE();
    g_dev[t_dev].flags = flags;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
    if (!flags) return rt_ret(cudaErrorInvalidValue);
    ENSURE();
    *flags = g_dev[t_dev].flags;
    return cudaSuccess;
}

static int dev_attr(enum cudaDeviceAttr a, int d, int *v)
{
    const struct dev *dv = &g_dev[d];
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *v = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *v = 64; break;
    case cudaDevAttrMaxGridDimX: *v = 2147483647; break;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *v = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 << 10; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: *v = 65536; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrPciBusId: *v = dv->bus; break;
    case cudaDevAttrPciDeviceId: *v = dv->slot; break;
    case cudaDevAttrPciDomainId: *v = dv->domain; break;
    case cudaDevAttrUnifiedAddressing: case cudaDevAttrCanMapHostMemory:
    case cudaDevAttrConcurrentKernels: case cudaDevAttrCanUseHostPointerForRegisteredMem:
    case cudaDevAttrHostRegisterSupported: case cudaDevAttrIpcEventSupport:
    case cudaDevAttrStreamPrioritiesSupported:
        *v = 1; break;
    case cudaDevAttrAsyncEngineCount: *v = 2; break;
    case cudaDevAttrGlobalMemoryBusWidth: *v = 5120; break;
    case cudaDevAttrL2CacheSize: *v = 50 << 20; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; break;
    case cudaDevAttrGPUDirectRDMASupported: *v = g_gdr; break;
    /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (124; the runtime enum calls it
     * cudaDevAttrReserved124, cudaDeviceGetAttribute passes it through). */
    case cudaDevAttrReserved124: *v = g_gdr; break;
    default:
        if ((int)a <= 0 || (int)a >= (int)cudaDevAttrMax) return -1;
        *v = 0;
        break;
    }
    return 0;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value) return rt_ret(cudaErrorInvalidValue);
    ENSURE();
    if (device < 0 || device >= g_ndev) return rt_ret(cudaErrorInvalidDevice);
    if (dev_attr(attr, device, value) != 0) return rt_ret(cudaErrorInvalidValue);
    return cudaSuccess;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    cudaError_t e = ensure();
    if (e) return drv_err(e);
    if (dev < 0 || dev >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS:
        *pi = 1;
        return CUDA_SUCCESS;
    default:
        /* The driver and runtime attribute numbers agree. */
        return dev_attr((enum cudaDeviceAttr)attrib, dev, pi) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    }
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (!p) return rt_ret(cudaErrorInvalidValue);
    ENSURE();
    if (device < 0 || device >= g_ndev) return rt_ret(cudaErrorInvalidDevice);
    const struct dev *dv = &g_dev[device];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "Weft Emulated GPU %d", device);
    memcpy(p->uuid.bytes, dv->uuid, 16);
    p->totalGlobalMem = g_mem_limit;
    p->sharedMemPerBlock = 48 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->totalConstMem = 64 << 10;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->pciBusID = dv->bus;
    p->pciDeviceID = dv->slot;
    p->pciDomainID = dv->domain;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->streamPrioritiesSupported = 1;
    p->canUseHostPointerForRegisteredMem = 1;
    p->hostRegisterSupported = 1;
    p->gpuDirectRDMASupported = g_gdr;
    p->ipcEventSupported = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    if (!pciBusId || len <= 0) return rt_ret(cudaErrorInvalidValue);
    ENSURE();
    if (device < 0 || device >= g_ndev) return rt_ret(cudaErrorInvalidDevice);
    snprintf(pciBusId, (size_t)len, "%s", g_dev[device].busid);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *pciBusId)
{
    if (!device || !pciBusId) return rt_ret(cudaErrorInvalidValue);
    ENSURE();
    int dom, bus, slot;
    if (parse_busid(pciBusId, &dom, &bus, &slot) != 0) return rt_ret(cudaErrorInvalidValue);
    for (int d = 0; d < g_ndev; d++) {
        if (g_dev[d].domain == dom && g_dev[d].bus == bus && g_dev[d].slot == slot) {
            *device = d;
            return cudaSuccess;
        }
    }
    return rt_ret(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    if (!canAccessPeer) return rt_ret(cudaErrorInvalidValue);
    ENSURE();
    if (device < 0 || device >= g_ndev || peerDevice < 0 || peerDevice >= g_ndev)
        return rt_ret(cudaErrorInvalidDevice);
    *canAccessPeer = device != peerDevice && !g_no_peer[device][peerDevice];
    return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    ENSURE_CTX();
    if (flags != 0) return rt_ret(cudaErrorInvalidValue);
    if (peerDevice < 0 || peerDevice >= g_ndev || peerDevice == t_dev) return rt_ret(cudaErrorInvalidDevice);
    if (g_no_peer[t_dev][peerDevice]) return rt_ret(cudaErrorPeerAccessUnsupported);
    pthread_mutex_lock(&g_mu);
    int was = g_dev[t_dev].peer_enabled[peerDevice];
    g_dev[t_dev].peer_enabled[peerDevice] = 1;
    pthread_mutex_unlock(&g_mu);
    return was ? rt_ret(cudaErrorPeerAccessAlreadyEnabled) : cudaSuccess;
}

cudaError_t cudaDeviceDisablePeerAccess(int peerDevice)
{
    ENSURE_CTX();
    if (peerDevice < 0 || peerDevice >= g_ndev || peerDevice == t_dev) return rt_ret(cudaErrorInvalidDevice);
    pthread_mutex_lock(&g_mu);
    int was = g_dev[t_dev].peer_enabled[peerDevice];
    g_dev[t_dev].peer_enabled[peerDevice] = 0;
    pthread_mutex_unlock(&g_mu);
    return was ? cudaSuccess : rt_ret(cudaErrorPeerAccessNotEnabled);
}

cudaError_t cudaDeviceSynchronize(void)
{
    ENSURE_CTX();
    sync_streams(t_dev);
    return cudaSuccess;
}

cudaError_t cudaDeviceReset(void)
{
    ENSURE_CTX();
    sync_streams(t_dev);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    ENSURE();
    if (leastPriority) *leastPriority = 0;
    if (greatestPriority) *greatestPriority = -5;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    ENSURE_CTX();
    pthread_mutex_lock(&g_mu);
    size_t used = g_dev[t_dev].used;
    pthread_mutex_unlock(&g_mu);
    if (free_b) *free_b = g_mem_limit - used;
    if (total) *total = g_mem_limit;
    return cudaSuccess;
}

/* ------------------------------------------------------------------ memory */

/* g_mu held. A new block of `size` data bytes on device d (0 on failure:
 * out of device memory or of descriptors). */
static struct block *block_new(int d, size_t size, int shared)
{
    if (g_dev[d].used + size > g_mem_limit) return NULL;
    struct block *b = calloc(1, sizeof(*b));
    if (!b) return NULL;
    b->id = ++g_next_blockid;
    char name[64];
    snprintf(name, sizeof(name), "weft-emu-cuda-dev%d-block%" PRIu64, d, b->id);
    b->fd = memfd_create(name, MFD_CLOEXEC);
    if (b->fd < 0 || ftruncate(b->fd, (off_t)(size + EMU_META_LEN)) != 0) goto fail;
    b->base = va_get(&g_devva[d], size);
    if (!b->base) goto fail;
    /* The device address: the data, inaccessible to the host (a GPU faults
     * too). The emulator works through the alias, metadata included. */
    b->alias = mmap(NULL, size + EMU_META_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
    if (b->alias == MAP_FAILED) {
        b->alias = NULL;
        va_put(&g_devva[d], b->base, size);
        goto fail;
    }
    if (mmap((void *)b->base, size, PROT_NONE, MAP_SHARED | MAP_FIXED, b->fd, 0) == MAP_FAILED) {
        munmap(b->alias, size + EMU_META_LEN);
        va_put(&g_devva[d], b->base, size);
        goto fail;
    }
    b->size = size;
    b->device = d;
    b->shared = shared;
    b->meta = (struct block_meta *)((char *)b->alias + size);
    b->meta->magic = EMU_META_MAGIC;
    b->meta->block_id = b->id;
    b->meta->data_size = size;
    b->next = g_blocks[d];
    g_blocks[d] = b;
    g_dev[d].used += size;
    COUNT(C_BLOCKS, 1);
    return b;
fail:
    if (b->fd >= 0) close(b->fd);
    free(b);
    return NULL;
}

/* g_mu held. A block whose last allocation was freed goes back (its
 * address range may come back as another block): importers' mappings keep
 * its memory, as on a GPU. */
static void block_release(struct block *b)
{
    struct block **pp = &g_blocks[b->device];
    while (*pp && *pp != b) pp = &(*pp)->next;
    if (*pp) *pp = b->next;
    unreserve_range(b->base, b->size);
    va_put(&g_devva[b->device], b->base, b->size);
    g_dev[b->device].used -= b->size;
    munmap(b->alias, b->size + EMU_META_LEN);
    close(b->fd);
    free(b);
    COUNT(C_BLOCKS, -1);
}

static int unit_used(const struct block *b, size_t u) { return (int)((b->used[u / 64] >> (u % 64)) & 1); }

static void units_mark(struct block *b, size_t first, size_t n, int on)
{
    for (size_t u = first; u < first + n; u++) {
        if (on) b->used[u / 64] |= 1ULL << (u % 64);
        else b->used[u / 64] &= ~(1ULL << (u % 64));
    }
}

/* g_mu held. First run of n free units in a shared block, or -1. */
static long block_fit(const struct block *b, size_t n)
{
    size_t run = 0;
    for (size_t u = 0; u < EMU_UNITS; u++) {
        run = unit_used(b, u) ? 0 : run + 1;
        if (run == n) return (long)(u + 1 - n);
    }
    return -1;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    if (size == 0) { *devPtr = NULL; return cudaSuccess; }
    if (size > g_mem_limit) return rt_ret(cudaErrorMemoryAllocation);
    int d = t_dev;
    cudaError_t e = device_sync("cudaMalloc", d);
    if (e != cudaSuccess) return rt_ret(e);
    struct alloc *a = calloc(1, sizeof(*a));
    if (!a) return rt_ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_mu);
    struct block *b = NULL;
    long unit = 0;
    size_t units = (size + EMU_UNIT - 1) / EMU_UNIT;
    if (size < EMU_BLOCK) {
        /* Carved from a shared block: the first that has room, else a new one. */
        for (b = g_blocks[d]; b; b = b->next)
            if (b->shared && (unit = block_fit(b, units)) >= 0) break;
        if (!b) {
            b = block_new(d, EMU_BLOCK, 1);
            unit = 0;
        }
        if (b) units_mark(b, (size_t)unit, units, 1);
    } else {
        b = block_new(d, (size + EMU_BLOCK - 1) & ~(size_t)(EMU_BLOCK - 1), 0);
    }
    if (!b) {
        pthread_mutex_unlock(&g_mu);
        free(a);
        return rt_ret(cudaErrorMemoryAllocation);
    }
    a->blk = b;
    a->off = (size_t)unit * EMU_UNIT;
    a->base = b->base + a->off;
    a->size = size;
    a->map_size = b->shared ? units * EMU_UNIT : b->size;
    a->kind = A_DEVICE;
    a->device = d;
    a->fd = -1;
    a->buffer_id = ++g_next_bufid;
    if (alloc_insert(a) != 0) {
        if (b->shared) units_mark(b, (size_t)unit, units, 0);
        if (b->nalloc == 0) block_release(b);
        pthread_mutex_unlock(&g_mu);
        free(a);
        return rt_ret(cudaErrorMemoryAllocation);
    }
    b->nalloc++;
    b->meta->bufid[unit] = a->buffer_id;
    __atomic_store_n(&b->meta->imports[unit], 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_mu);
    COUNT(C_MALLOC, 1);
    *devPtr = (void *)a->base;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
    ENSURE_CTX();
    if (!devPtr) return cudaSuccess;
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)devPtr);
    int ok = a && a->kind == A_DEVICE && a->base == (uintptr_t)devPtr;
    int dev = ok ? a->device : -1;
    pthread_mutex_unlock(&g_mu);
    if (!ok) return rt_ret(cudaErrorInvalidValue);
    /* cudaFree synchronizes: queued work may still use the memory. */
    cudaError_t e = device_sync("cudaFree", dev);
    if (e != cudaSuccess) return rt_ret(e);
    pthread_mutex_lock(&g_mu);
    a = alloc_find((uintptr_t)devPtr);
    if (!a || a->kind != A_DEVICE || a->base != (uintptr_t)devPtr) {
        pthread_mutex_unlock(&g_mu);
        return rt_ret(cudaErrorInvalidValue);
    }
    struct block *b = a->blk;
    size_t unit = a->off / EMU_UNIT;
    /* Undefined on a GPU while another process has it open
     * (cudaIpcOpenMemHandle: "Calling cudaFree on an exported memory region
     * before calling cudaIpcCloseMemHandle in the importing context will
     * result in undefined behavior"): counted, said once. */
    uint32_t imp = __atomic_load_n(&b->meta->imports[unit], __ATOMIC_ACQUIRE);
    if (imp > 0) {
        static int said;
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "weft-emu-cuda: cudaFree(%p) of %zu bytes while %u import(s) by other processes are "
                    "open (undefined behaviour on a GPU; counter free_imported)\n", devPtr, a->size, imp);
        COUNT(C_FREE_IMPORTED, 1);
    }
    b->meta->bufid[unit] = 0;
    alloc_remove(a);
    if (b->shared) units_mark(b, unit, a->map_size / EMU_UNIT, 0);
    if (--b->nalloc == 0) block_release(b);
    pthread_mutex_unlock(&g_mu);
    free(a);
    COUNT(C_FREE, 1);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    if (!pHost) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return rt_ret(cudaErrorInvalidValue);
    if (size == 0) { *pHost = NULL; return cudaSuccess; }
    cudaError_t e = device_sync("cudaHostAlloc/cudaMallocHost", t_dev);
    if (e != cudaSuccess) return rt_ret(e);
    size_t len = round_page(size);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return rt_ret(cudaErrorMemoryAllocation);
    struct alloc *a = calloc(1, sizeof(*a));
    if (!a) { munmap(p, len); return rt_ret(cudaErrorMemoryAllocation); }
    a->base = (uintptr_t)p;
    a->size = size;
    a->map_size = len;
    a->kind = A_HOST;
    a->device = t_dev;
    a->fd = -1;
    pthread_mutex_lock(&g_mu);
    a->buffer_id = ++g_next_bufid;
    int rc = alloc_insert(a);
    pthread_mutex_unlock(&g_mu);
    if (rc != 0) { munmap(p, len); free(a); return rt_ret(cudaErrorMemoryAllocation); }
    *pHost = p;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void *ptr)
{
    ENSURE_CTX();
    if (!ptr) return cudaSuccess;
    cudaError_t e = device_sync("cudaFreeHost", -1);
    if (e != cudaSuccess) return rt_ret(e);
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)ptr);
    if (!a || a->kind != A_HOST || a->base != (uintptr_t)ptr) {
        pthread_mutex_unlock(&g_mu);
        return rt_ret(cudaErrorInvalidValue);
    }
    alloc_remove(a);
    pthread_mutex_unlock(&g_mu);
    munmap((void *)a->base, a->map_size);
    free(a);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    ENSURE_CTX();
    if (!ptr || size == 0 ||
        (flags & ~(unsigned)(cudaHostRegisterPortable | cudaHostRegisterMapped |
                             cudaHostRegisterIoMemory | cudaHostRegisterReadOnly)))
        return rt_ret(cudaErrorInvalidValue);
    cudaError_t e = device_sync("cudaHostRegister", t_dev);
    if (e != cudaSuccess) return rt_ret(e);
    struct alloc *a = calloc(1, sizeof(*a));
    if (!a) return rt_ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_mu);
    struct alloc *o = alloc_overlap((uintptr_t)ptr, size);
    if (o) {
        pthread_mutex_unlock(&g_mu);
        free(a);
        return rt_ret(o->kind == A_DEVICE || o->kind == A_IMPORT ? cudaErrorInvalidValue
                                                                 : cudaErrorHostMemoryAlreadyRegistered);
    }
    a->base = (uintptr_t)ptr;
    a->size = size;
    a->map_size = size;
    a->kind = A_REGISTERED;
    a->device = t_dev;
    a->fd = -1;
    a->buffer_id = ++g_next_bufid;
    int rc = alloc_insert(a);
    pthread_mutex_unlock(&g_mu);
    if (rc != 0) { free(a); return rt_ret(cudaErrorMemoryAllocation); }
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
    ENSURE_CTX();
    cudaError_t e = device_sync("cudaHostUnregister", -1);
    if (e != cudaSuccess) return rt_ret(e);
    pthread_mutex_lock(&g_mu);
    struct alloc *a = ptr ? alloc_find((uintptr_t)ptr) : NULL;
    if (!a || a->kind != A_REGISTERED || a->base != (uintptr_t)ptr) {
        pthread_mutex_unlock(&g_mu);
        return rt_ret(cudaErrorHostMemoryNotRegistered);
    }
    alloc_remove(a);
    pthread_mutex_unlock(&g_mu);
    free(a);
    return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    if (!pDevice || flags != 0) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)pHost);
    int ok = a && (a->kind == A_HOST || a->kind == A_REGISTERED);
    pthread_mutex_unlock(&g_mu);
    if (!ok) return rt_ret(cudaErrorInvalidValue);
    *pDevice = pHost;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    if (!attr) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    memset(attr, 0, sizeof(*attr));
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)ptr);
    if (!a) {
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = cudaInvalidDeviceId;
    } else if (a->kind == A_DEVICE || a->kind == A_IMPORT) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = a->device;
        attr->devicePointer = (void *)ptr;
    } else {
        attr->type = cudaMemoryTypeHost;
        attr->device = a->device;
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = (void *)ptr;
    }
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

/* g_mu held. The range cuMemGetAddressRange and the RANGE_* attributes
 * give for p in a: the allocation's own; in an import, the allocation
 * opened there that contains p (else the whole mapped block). */
static void alloc_range(const struct alloc *a, uintptr_t p, uintptr_t *base, size_t *size)
{
    *base = a->base;
    *size = a->size;
    if (a->kind != A_IMPORT) return;
    for (size_t i = 0; i < a->nopens; i++) {
        const struct iopen *o = &a->opens[i];
        if (p >= o->ptr && p - o->ptr < (o->size ? o->size : 1)) {
            *base = o->ptr;
            *size = o->size;
            return;
        }
    }
}

/* Driver pointer attributes. g_mu held; a may be NULL (not a CUDA pointer).
 * Returns -1 for an attribute this emulator does not know. */
static int ptr_attr(struct alloc *a, CUpointer_attribute at, void *data, uintptr_t p)
{
    int dev = a && (a->kind == A_DEVICE || a->kind == A_IMPORT);
    uintptr_t rbase = 0;
    size_t rsize = 0;
    if (a) alloc_range(a, p, &rbase, &rsize);
    /* The mapping p belongs to: a device allocation's block, an import's
     * whole mapped block, host memory's own range. */
    uintptr_t mbase = !a ? 0 : a->kind == A_DEVICE ? a->blk->base : a->base;
    size_t msize = !a ? 0 : a->kind == A_DEVICE ? a->blk->size : a->kind == A_IMPORT ? a->size : a->map_size;
    unsigned long long mid = !a ? 0 : a->kind == A_DEVICE ? a->blk->id : a->kind == A_IMPORT ? a->imp_id : a->buffer_id;
    switch (at) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = a ? &g_ctx[a->device] : NULL; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = !a ? 0 : dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = a ? (CUdeviceptr)p : 0; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void **)data = a && !dev ? (void *)p : NULL; break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(unsigned int *)data = a ? 1 : 0; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = a ? a->buffer_id : 0; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = a ? a->device : -2; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(unsigned int *)data = a && a->kind == A_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)rbase; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = rsize; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned int *)data = a ? 1 : 0; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *(unsigned int *)data = dev && g_gdr; break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned int *)data = a ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE : 0;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(void **)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t *)data = msize; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void **)data = (void *)mbase; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long *)data = mid; break;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: *(unsigned int *)data = 0; break;
    default: return -1;
    }
    return 0;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = need_ctx();
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)ptr);
    int rc = a ? ptr_attr(a, attribute, data, (uintptr_t)ptr) : -1;
    pthread_mutex_unlock(&g_mu);
    return rc ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                CUdeviceptr ptr)
{
    if (!attributes || !data) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = need_ctx();
    if (r != CUDA_SUCCESS) return r;
    int rc = 0;
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)ptr);
    for (unsigned i = 0; i < numAttributes && rc == 0; i++)
        if (data[i]) rc = ptr_attr(a, attributes[i], data[i], (uintptr_t)ptr);
    pthread_mutex_unlock(&g_mu);
    return rc ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CUresult r = need_ctx();
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)dptr);
    int ok = a && a->kind != A_REGISTERED;
    if (ok) {
        uintptr_t b;
        size_t n;
        alloc_range(a, (uintptr_t)dptr, &b, &n);
        if (pbase) *pbase = (CUdeviceptr)b;
        if (psize) *psize = n;
    }
    pthread_mutex_unlock(&g_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* g_mu held. A new emulated dma-buf descriptor for [off, off+len) of the
 * memfd fd (both page multiples): a fresh open file description (its own
 * file position, unlike dup), positioned at the EMU_DMABUF_* encoding. -1
 * on error. */
static int dmabuf_fd_locked(int memfd, size_t off, size_t len)
{
    uint64_t first = off / EMU_PAGE, pages = len / EMU_PAGE, lim = 1ULL << EMU_DMABUF_FIELD;
    if (memfd < 0 || pages == 0 || first >= lim || pages >= lim) return -1;
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return -1;
    off_t pos = (off_t)((EMU_DMABUF_TAG << 56) | (first << EMU_DMABUF_FIELD) | pages);
    if (lseek(fd, pos, SEEK_SET) != pos) {
        close(fd);
        return -1;
    }
    return fd;
}

/* dma-buf export (the real contract): dptr and size aligned to the host page
 * size, flags 0 or CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE; the range
 * lies inside one block of cudaMalloc memory (drivers export the pages of
 * the physical allocation, which a small allocation shares with its
 * neighbours). The fd stands for the range
 * starting at dptr: offset 0 of the dma-buf is dptr, so
 * ibv_reg_dmabuf_mr(pd, 0, size, (uint64_t)dptr, fd, access) registers
 * exactly [dptr, dptr+size). (An mmap of the fd, which real NVIDIA dma-bufs
 * do not offer, maps the block's memfd: its offset 0 is the block's base.)
 * WEFT_EMU_CUDA_GDR=0: CUDA_ERROR_NOT_SUPPORTED for a valid range. */
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                       CUmemRangeHandleType handleType, unsigned long long flags)
{
    if (!handle || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || size == 0 ||
        (flags & ~(unsigned long long)CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) ||
        (dptr & (EMU_PAGE - 1)) || (size & (EMU_PAGE - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    cudaError_t e = ensure();
    if (e) return drv_err(e);
    pthread_mutex_lock(&g_mu);
    /* A page of a small allocation may start in a neighbour or in free
     * space of the block: the block is what is exported. */
    struct block *b = NULL;
    for (int d = 0; d < g_ndev && !b; d++)
        for (struct block *x = g_blocks[d]; x && !b; x = x->next)
            if ((uintptr_t)dptr >= x->base && (uintptr_t)dptr - x->base < x->size) b = x;
    size_t off = b ? (uintptr_t)dptr - b->base : 0;
    int ok = b && size <= b->size && off <= b->size - size;
    int fd = -1;
    if (ok && g_gdr) fd = dmabuf_fd_locked(b->fd, off, size);
    pthread_mutex_unlock(&g_mu);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    if (!g_gdr) return CUDA_ERROR_NOT_SUPPORTED; /* no dma-buf support on this "platform" */
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

/* For libweft_emu_verbs.so's WEFT_EMU_VERBS_PEERMEM (nvidia-peermem: plain
 * ibv_reg_mr of device memory): an emulated dma-buf descriptor for the pages
 * covering [ptr, ptr+size), which must start in a device allocation or IPC
 * import of this process and stay inside its block (the pages of a small
 * allocation are shared with its neighbours); -1 otherwise. Not gated by
 * WEFT_EMU_CUDA_GDR. */
int weft_emu_cuda_peermem_fd(const void *ptr, size_t size)
{
    if (!ptr || size == 0 || ensure() != cudaSuccess) return -1;
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)ptr);
    int fd = -1;
    if (a && (a->kind == A_DEVICE || a->kind == A_IMPORT)) {
        /* Offsets in the memfd: a device allocation sits at its offset in
         * its block; an import maps the block from offset 0. */
        size_t off = (a->kind == A_DEVICE ? a->off : 0) + ((uintptr_t)ptr - a->base);
        size_t span = a->kind == A_DEVICE ? a->blk->size : a->size;
        if (size <= span - off) {
            size_t first = off & ~(size_t)(EMU_PAGE - 1);
            fd = dmabuf_fd_locked(a->kind == A_DEVICE ? a->blk->fd : a->fd, first, round_page(off + size) - first);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return fd;
}

/* ------------------------------------------------------------------ copies */

enum pkind { P_PAGEABLE, P_PINNED, P_DEVICE, P_BAD };

/* g_mu held. p lies in the address space reserved for device memory or
 * IPC imports. */
static int in_device_window(uintptr_t p)
{
    for (int d = 0; d < g_ndev; d++)
        if (p >= g_devva[d].base && p < g_devva[d].end)
            return 1;
    return g_ndev > 0 && p >= g_impva.base && p < g_impva.end;
}

/* What [p, p+n) is: device memory (own or imported), pinned/registered host
 * memory, or ordinary host memory; P_BAD when it starts in an allocation
 * but runs past its end. *view (if given): where the emulator accesses p
 * (host_view); valid until the allocation is freed, which synchronizes the
 * streams first, so queued operations may keep it. */
static int classify(const void *p, size_t n, int *device, void **view)
{
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)p);
    int k = P_PAGEABLE;
    if (view) *view = (void *)p;
    if (a) {
        if ((uintptr_t)p - a->base + n > a->size) k = P_BAD;
        else k = (a->kind == A_DEVICE || a->kind == A_IMPORT) ? P_DEVICE : P_PINNED;
        if (device) *device = a->device;
        if (view) *view = host_view(a, (uintptr_t)p);
    } else if (in_device_window((uintptr_t)p)) {
        /* Device address space that no live allocation covers (freed, or
         * past an allocation's end): a GPU would fault, never treat it as
         * host memory. */
        k = P_BAD;
    }
    pthread_mutex_unlock(&g_mu);
    return k;
}

/* Checks a copy; *sync: the blocking call must wait for it (cudaMemcpy);
 * *vdst, *vsrc: where the copy reads and writes (classify's view). */
static cudaError_t check_copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, int *sync,
                              void **vdst, void **vsrc, int *pageable_h2d)
{
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    int kd = classify(dst, count, NULL, vdst), ks = classify(src, count, NULL, vsrc);
    if (pageable_h2d) *pageable_h2d = kd == P_DEVICE && ks == P_PAGEABLE;
    if (kd == P_BAD || ks == P_BAD) return cudaErrorInvalidValue;
    switch (kind) {
    case cudaMemcpyHostToHost:
        if (kd == P_DEVICE || ks == P_DEVICE) return cudaErrorInvalidValue;
        break;
    case cudaMemcpyHostToDevice:
        if (kd != P_DEVICE || ks == P_DEVICE) return cudaErrorInvalidValue;
        break;
    case cudaMemcpyDeviceToHost:
        if (ks != P_DEVICE || kd == P_DEVICE) return cudaErrorInvalidValue;
        break;
    case cudaMemcpyDeviceToDevice:
        if (kd != P_DEVICE || ks != P_DEVICE) return cudaErrorInvalidValue;
        break;
    case cudaMemcpyDefault: break;
    default: return cudaErrorInvalidMemcpyDirection;
    }
    /* *sync: 1 = cudaMemcpy waits (real cudaMemcpy returns before a
     * device-to-device copy completes); 2 = even cudaMemcpyAsync waits (a
     * host-to-host copy is fully synchronous on real CUDA). */
    if (sync) *sync = (kd != P_DEVICE && ks != P_DEVICE) ? 2 : !(kd == P_DEVICE && ks == P_DEVICE);
    return cudaSuccess;
}

static unsigned late_us(void)
{
    static unsigned long long x = 0x9e3779b97f4a7c15ULL;
    unsigned long long r = __atomic_add_fetch(&x, 0x9e3779b97f4a7c15ULL, __ATOMIC_RELAXED);
    r ^= r >> 31;
    r *= 0xbf58476d1ce4e5b9ULL;
    r ^= r >> 27;
    unsigned span = g_late_max_us - g_late_min_us;
    return g_late_min_us + (span ? (unsigned)(r % (span + 1)) : 0);
}

static cudaError_t enqueue_copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                cudaStream_t stream, int blocking)
{
    ENSURE_CTX();
    int sync = 1, pageable_h2d = 0;
    void *vdst = dst, *vsrc = (void *)src;
    cudaError_t e = check_copy(dst, src, count, kind, &sync, &vdst, &vsrc, &pageable_h2d);
    if (e) return rt_ret(e);
    struct CUstream_st *s;
    e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    if (count == 0) return cudaSuccess;
    struct op *o = op_new(OP_COPY);
    if (!o) return rt_ret(cudaErrorMemoryAllocation);
    o->dst = vdst;
    o->src = vsrc;
    o->n = count;
    if (blocking && pageable_h2d && g_late_max_us > 0) {
        /* cudaMemcpy from pageable memory to the device "will return once
         * the pageable buffer has been copied to the staging memory for DMA
         * transfer to device memory, but the DMA to final destination may
         * not have completed" (API synchronization behavior): staged now,
         * written on the legacy stream a few milliseconds later, or as soon
         * as anyone waits for the legacy stream (OP_LATE). Work on a
         * non-blocking stream that reads it without a sync sees old bytes. */
        void *staged = malloc(count);
        struct op *d = staged ? op_new(OP_LATE) : NULL;
        if (!d) {
            free(staged);
            free(o);
            return rt_ret(cudaErrorMemoryAllocation);
        }
        memcpy(staged, src, count);
        o->src = staged;
        o->owned = staged;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        d->u64 = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec + (uint64_t)late_us() * 1000ull;
        pthread_mutex_lock(&g_done_mu);
        d->gen = g_late_flush;
        pthread_mutex_unlock(&g_done_mu);
        stream_push(s, d);
        stream_push(s, o);
        COUNT(C_MEMCPY, 1);
        COUNT(C_LATE_H2D, 1);
        return cudaSuccess;
    }
    uint64_t seq = stream_push(s, o);
    COUNT(C_MEMCPY, 1);
    if ((blocking && sync) || sync == 2) stream_wait_seq(s, seq);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return enqueue_copy(dst, src, count, kind, NULL, 1);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return enqueue_copy(dst, src, count, kind, stream, 0);
}

cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
    ENSURE_CTX();
    if (dstDevice < 0 || dstDevice >= g_ndev || srcDevice < 0 || srcDevice >= g_ndev)
        return rt_ret(cudaErrorInvalidDevice);
    return enqueue_copy(dst, src, count, cudaMemcpyDeviceToDevice, NULL, 1);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                cudaStream_t stream)
{
    ENSURE_CTX();
    if (dstDevice < 0 || dstDevice >= g_ndev || srcDevice < 0 || srcDevice >= g_ndev)
        return rt_ret(cudaErrorInvalidDevice);
    return enqueue_copy(dst, src, count, cudaMemcpyDeviceToDevice, stream, 0);
}

static cudaError_t enqueue_set(void *devPtr, int value, size_t count, cudaStream_t stream, int blocking)
{
    ENSURE_CTX();
    if (count == 0) return cudaSuccess;
    void *view = devPtr;
    int k = devPtr ? classify(devPtr, count, NULL, &view) : P_PAGEABLE;
    if (k == P_PAGEABLE || k == P_BAD) return rt_ret(cudaErrorInvalidValue);
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    struct op *o = op_new(OP_SET);
    if (!o) return rt_ret(cudaErrorMemoryAllocation);
    o->dst = view;
    o->value = value;
    o->n = count;
    uint64_t seq = stream_push(s, o);
    COUNT(C_MEMSET, 1);
    /* cudaMemset is asynchronous for device memory, synchronous for pinned host memory. */
    if (blocking && k == P_PINNED) stream_wait_seq(s, seq);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) { return enqueue_set(devPtr, value, count, NULL, 1); }

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    return enqueue_set(devPtr, value, count, stream, 0);
}

/* ------------------------------------------------------------------ stream API */

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority)
{
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking)) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&g_mu);
    struct CUstream_st *s = stream_new_locked(t_dev, flags, priority, 0, &e);
    pthread_mutex_unlock(&g_mu);
    if (!s) return rt_ret(e);
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) { return cudaStreamCreateWithPriority(pStream, cudaStreamDefault, 0); }

/* Returns at once; queued work still runs, then the stream is released. */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    ENSURE_CTX();
    if (stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
        return rt_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_mu);
    struct CUstream_st **pp = &g_streams;
    while (*pp && *pp != stream) pp = &(*pp)->next_all;
    struct CUstream_st *s = *pp;
    if (s) *pp = s->next_all;
    pthread_mutex_unlock(&g_mu);
    if (!s) return rt_ret(cudaErrorInvalidResourceHandle);
    COUNT(C_STREAMS, -1);
    pthread_mutex_lock(&s->mu);
    s->destroying = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    stream_unref(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    stream_sync(s);
    return cudaSuccess;
}

/* Stream capture: the state only, so a library can be shown to refuse a
 * capturing stream. Work queued while capturing still runs at once and no
 * graph is made (EndCapture gives NULL). */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    (void)mode;
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    if (s->special) return rt_ret(cudaErrorStreamCaptureUnsupported);
    if (__atomic_exchange_n(&s->capturing, 1, __ATOMIC_ACQ_REL)) return rt_ret(cudaErrorIllegalState);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    if (!graph) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    if (!__atomic_exchange_n(&s->capturing, 0, __ATOMIC_ACQ_REL)) return rt_ret(cudaErrorIllegalState);
    *graph = NULL;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    if (!status) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    *status = __atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE) ? cudaStreamCaptureStatusActive
                                                               : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    uint64_t upto;
    return stream_pending(s, &upto) ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags)
{
    if (!flags) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(hStream, &s);
    if (e) return rt_ret(e);
    *flags = s->flags;
    return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int *priority)
{
    if (!priority) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(hStream, &s);
    if (e) return rt_ret(e);
    *priority = s->priority;
    return cudaSuccess;
}

cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device)
{
    if (!device) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(hStream, &s);
    if (e) return rt_ret(e);
    *device = s->device;
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    if (!fn) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    struct op *o = op_new(OP_HOSTFN);
    if (!o) return rt_ret(cudaErrorMemoryAllocation);
    o->fn = fn;
    o->arg = userData;
    stream_push(s, o);
    return cudaSuccess;
}

cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void *userData,
                                  unsigned int flags)
{
    if (!callback || flags != 0) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    struct op *o = op_new(OP_CALLBACK);
    if (!o) return rt_ret(cudaErrorMemoryAllocation);
    o->cb = callback;
    o->arg = userData;
    stream_push(s, o);
    return cudaSuccess;
}

cudaError_t weft_emu_cuda_stream_delay(cudaStream_t stream, unsigned int usec)
{
    ENSURE_CTX();
    struct CUstream_st *s;
    cudaError_t e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    struct op *o = op_new(OP_DELAY);
    if (!o) return rt_ret(cudaErrorMemoryAllocation);
    o->n = usec;
    stream_push(s, o);
    return cudaSuccess;
}

unsigned long long weft_emu_cuda_counter(const char *name)
{
    if (name && strcmp(name, "node") == 0) {
        pthread_once(&g_once, emu_init);
        return g_node;
    }
    for (int i = 0; name && i < C_NCOUNTERS; i++)
        if (strcmp(name, g_counter_names[i]) == 0) return __atomic_load_n(&g_counters[i], __ATOMIC_RELAXED);
    return ~0ULL;
}

/* ------------------------------------------------------------------ events */

static cudaError_t event_resolve(cudaEvent_t h, struct CUevent_st **out)
{
    pthread_mutex_lock(&g_mu);
    struct CUevent_st *e;
    for (e = g_events; e && e != h; e = e->next_all) {}
    pthread_mutex_unlock(&g_mu);
    *out = e;
    return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (!event || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)))
        return rt_ret(cudaErrorInvalidValue);
    if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUevent_st *e = calloc(1, sizeof(*e));
    if (!e) return rt_ret(cudaErrorMemoryAllocation);
    e->flags = flags;
    e->device = t_dev;
    e->refs = 1;
    pthread_mutex_lock(&g_mu);
    e->next_all = g_events;
    g_events = e;
    pthread_mutex_unlock(&g_mu);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    ENSURE_CTX();
    pthread_mutex_lock(&g_mu);
    struct CUevent_st **pp = &g_events;
    while (*pp && *pp != event) pp = &(*pp)->next_all;
    struct CUevent_st *e = *pp;
    if (e) *pp = e->next_all;
    pthread_mutex_unlock(&g_mu);
    if (!e) return rt_ret(cudaErrorInvalidResourceHandle);
    event_unref(e); /* queued records and waits hold their own references */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    ENSURE_CTX();
    struct CUevent_st *ev;
    struct CUstream_st *s;
    cudaError_t e = event_resolve(event, &ev);
    if (!e) e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    /* "event and stream must be on the same device" (cudaEventRecord). */
    if (ev->device != s->device) {
        static int said;
        COUNT(C_EVENT_RECORD_REFUSED, 1);
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "weft-emu-cuda: cudaEventRecord of an event of device %d on a stream of device %d: "
                    "invalid resource handle (event and stream must be on the same device)\n", ev->device,
                    s->device);
        return rt_ret(cudaErrorInvalidResourceHandle);
    }
    struct op *o = op_new(OP_RECORD);
    if (!o) return rt_ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_mu);
    ev->refs++;
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_lock(&g_done_mu);
    o->gen = ++ev->rec_gen;
    ev->legacy = s->special == STREAM_LEGACY;
    pthread_mutex_unlock(&g_done_mu);
    o->ev = ev;
    stream_push(s, o);
    return cudaSuccess;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
    if (flags & ~(unsigned)cudaEventRecordExternal) return rt_ret(cudaErrorInvalidValue);
    return cudaEventRecord(event, stream);
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    ENSURE_CTX();
    struct CUevent_st *ev;
    cudaError_t e = event_resolve(event, &ev);
    if (e) return rt_ret(e);
    pthread_mutex_lock(&g_done_mu);
    int done = ev->done_gen >= ev->rec_gen;
    pthread_mutex_unlock(&g_done_mu);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    ENSURE_CTX();
    struct CUevent_st *ev;
    cudaError_t e = event_resolve(event, &ev);
    if (e) return rt_ret(e);
    pthread_mutex_lock(&g_done_mu);
    uint64_t gen = ev->rec_gen;
    if (ev->legacy && ev->done_gen < gen) late_flush_locked();
    while (ev->done_gen < gen) pthread_cond_wait(&g_done_cv, &g_done_mu);
    pthread_mutex_unlock(&g_done_mu);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUevent_st *a, *b;
    cudaError_t e = event_resolve(start, &a);
    if (!e) e = event_resolve(end, &b);
    if (e) return rt_ret(e);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return rt_ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_done_mu);
    if (a->rec_gen == 0 || b->rec_gen == 0) e = cudaErrorInvalidResourceHandle;
    else if (a->done_gen < a->rec_gen || b->done_gen < b->rec_gen) e = cudaErrorNotReady;
    else *ms = (float)((double)(b->t.tv_sec - a->t.tv_sec) * 1e3 + (double)(b->t.tv_nsec - a->t.tv_nsec) / 1e6);
    pthread_mutex_unlock(&g_done_mu);
    return rt_ret(e);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    if (flags & ~(unsigned)cudaEventWaitExternal) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct CUevent_st *ev;
    struct CUstream_st *s;
    cudaError_t e = event_resolve(event, &ev);
    if (!e) e = stream_resolve(stream, &s);
    if (e) return rt_ret(e);
    pthread_mutex_lock(&g_done_mu);
    uint64_t gen = ev->rec_gen;
    int done = ev->done_gen >= gen;
    pthread_mutex_unlock(&g_done_mu);
    if (done) return cudaSuccess; /* nothing to wait for (or never recorded) */
    struct op *o = op_new(OP_WAIT_EVENT);
    if (!o) return rt_ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_mu);
    ev->refs++;
    pthread_mutex_unlock(&g_mu);
    o->ev = ev;
    o->gen = gen;
    stream_push(s, o);
    return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    (void)handle; (void)event;
    return rt_ret(cudaErrorNotSupported);
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    (void)event; (void)handle;
    return rt_ret(cudaErrorNotSupported);
}

/* ------------------------------------------------------------------ stream memory operations */

static CUresult mem_op(CUstream stream, CUdeviceptr addr, uint64_t value, unsigned flags, int kind)
{
    cudaError_t e = ensure();
    if (e) return drv_err(e);
    int wait = kind == OP_WAIT32 || kind == OP_WAIT64;
    size_t width = (kind == OP_WAIT32 || kind == OP_WRITE32) ? 4 : 8;
    unsigned allowed = wait ? (0x3u | CU_STREAM_WAIT_VALUE_FLUSH) : CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER;
    if (!addr || (addr & (width - 1)) || (flags & ~allowed)) return CUDA_ERROR_INVALID_VALUE;
    void *view = NULL;
    int k = classify((const void *)(uintptr_t)addr, width, NULL, &view);
    /* Device memory (own or imported) or registered/pinned host memory. */
    if (k != P_DEVICE && k != P_PINNED) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    if (stream_resolve(stream, &s) != cudaSuccess) return CUDA_ERROR_INVALID_HANDLE;
    struct op *o = op_new(kind);
    if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
    o->dst = view;
    o->u64 = value;
    o->flags = flags;
    stream_push(s, o);
    COUNT(wait ? C_WAIT_VALUE : C_WRITE_VALUE, 1);
    if (wait && k == P_DEVICE) COUNT(C_WAIT_VALUE_DEVICE, 1);
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    return mem_op(stream, addr, value, flags, OP_WAIT32);
}

CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    return mem_op(stream, addr, value, flags, OP_WRITE32);
}

CUresult cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)
{
    return mem_op(stream, addr, value, flags, OP_WAIT64);
}

CUresult cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)
{
    return mem_op(stream, addr, value, flags, OP_WRITE64);
}

/* ------------------------------------------------------------------ IPC */

/* The 64-byte handle: the exporter (node, pid, token), its block (memfd
 * descriptor number, block id, block address) and the allocation in it
 * (offset, size, buffer id). */
struct ipc_handle {
    uint32_t magic;
    uint32_t pid;
    int32_t  fd;
    uint16_t device;
    uint16_t node;
    uint64_t token;
    uint64_t block_id;
    uint64_t block_va;
    uint64_t buffer_id;
    uint64_t size;
    uint32_t off;
    uint32_t check;
};
_Static_assert(sizeof(struct ipc_handle) == CUDA_IPC_HANDLE_SIZE, "IPC handle size");

static uint32_t ipc_check(const struct ipc_handle *h)
{
    return (uint32_t)fnv1a(h, offsetof(struct ipc_handle, check), 1469598103934665603ULL);
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    if (!handle || !devPtr) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct ipc_handle h;
    memset(&h, 0, sizeof(h));
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)devPtr);
    /* Only the base of a cudaMalloc allocation (real CUDA would hand out the
     * containing allocation for an interior pointer: strict here on purpose). */
    int ok = a && a->kind == A_DEVICE && a->base == (uintptr_t)devPtr;
    if (ok) {
        h.magic = EMU_IPC_MAGIC;
        h.node = (uint16_t)g_node;
        h.pid = (uint32_t)getpid();
        h.fd = a->blk->fd;
        h.token = g_token;
        h.block_id = a->blk->id;
        h.block_va = a->blk->base;
        h.size = a->size;
        h.off = (uint32_t)a->off;
        h.buffer_id = a->buffer_id;
        h.device = (uint16_t)a->device;
    }
    pthread_mutex_unlock(&g_mu);
    if (!ok) return rt_ret(cudaErrorInvalidValue);
    h.check = ipc_check(&h);
    memcpy(handle->reserved, &h, sizeof(h));
    COUNT(C_IPC_GET, 1);
    return cudaSuccess;
}

/* g_mu held. The import of this process that conflicts with h: the same
 * exporter's block (*same = 1), or another of its blocks over an
 * overlapping address range (it freed the old one and got the addresses
 * back: drivers refuse that open as well). NULL: none. */
static struct alloc *import_conflict(const struct ipc_handle *h, size_t block_size, int *same)
{
    for (size_t i = 0; i < g_nallocs; i++) {
        struct alloc *a = g_allocs[i];
        if (a->kind != A_IMPORT || a->imp_token != h->token) continue;
        if (a->imp_block == h->block_id) {
            *same = 1;
            return a;
        }
        if (a->imp_va < h->block_va + block_size && h->block_va < a->imp_va + a->size) {
            *same = 0;
            return a;
        }
    }
    return NULL;
}

/* g_mu held. One more open of the allocation h names in import a. */
static cudaError_t import_add_open(struct alloc *a, const struct ipc_handle *h, void **devPtr)
{
    if (__atomic_load_n(&a->meta->bufid[h->off / EMU_UNIT], __ATOMIC_ACQUIRE) != h->buffer_id)
        return cudaErrorInvalidResourceHandle;   /* freed since */
    uintptr_t ptr = a->base + h->off;
    struct iopen *o = NULL;
    for (size_t i = 0; i < a->nopens && !o; i++)
        if (a->opens[i].ptr == ptr) o = &a->opens[i];
    if (!o) {
        if (a->nopens == a->capopens) {
            size_t cap = a->capopens ? 2 * a->capopens : 4;
            struct iopen *n = realloc(a->opens, cap * sizeof(*n));
            if (!n) return cudaErrorMemoryAllocation;
            a->opens = n;
            a->capopens = cap;
        }
        o = &a->opens[a->nopens++];
        o->ptr = ptr;
        o->off = h->off;
        o->size = h->size;
        o->refs = 0;
    }
    o->refs++;
    __atomic_add_fetch(&a->meta->imports[h->off / EMU_UNIT], 1, __ATOMIC_ACQ_REL);
    *devPtr = (void *)ptr;
    COUNT(C_IPC_OPEN, 1);
    return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    if (!devPtr || (flags & ~(unsigned)cudaIpcMemLazyEnablePeerAccess)) return rt_ret(cudaErrorInvalidValue);
    ENSURE_CTX();
    struct ipc_handle h;
    memcpy(&h, handle.reserved, sizeof(h));
    if (h.magic != EMU_IPC_MAGIC || h.check != ipc_check(&h) || h.device >= g_ndev ||
        h.off % EMU_UNIT != 0 || h.off >= EMU_BLOCK)
        return rt_ret(cudaErrorInvalidValue);
    /* Another node: the handle means nothing here. */
    if (h.node != (uint16_t)g_node) return rt_ret(cudaErrorInvalidResourceHandle);
    /* The exporting process itself: CUDA_ERROR_INVALID_CONTEXT in the
     * driver, whichever thread (or rank of the process) asks. */
    if (h.pid == (uint32_t)getpid() && h.token == g_token) return rt_ret(cudaErrorDeviceUninitialized);
    if (h.device != t_dev && g_no_peer[t_dev][h.device]) return rt_ret(cudaErrorPeerAccessUnsupported);
    if (g_sync_ipc_open) {
        cudaError_t se = device_sync("cudaIpcOpenMemHandle", t_dev);
        if (se != cudaSuccess) return rt_ret(se);
    }

    /* The exporter's memfd through /proc: gone (the block was released, or
     * the process exited) when the descriptor is closed or now names
     * another file. */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%u/fd/%d", h.pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return rt_ret(cudaErrorInvalidResourceHandle);
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size <= EMU_META_LEN) {
        close(fd);
        return rt_ret(cudaErrorInvalidResourceHandle);
    }
    size_t data = (size_t)st.st_size - EMU_META_LEN;
    void *alias = mmap(NULL, data + EMU_META_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (alias == MAP_FAILED) {
        close(fd);
        return rt_ret(cudaErrorMapBufferObjectFailed);
    }
    struct block_meta *meta = (struct block_meta *)((char *)alias + data);
    if (meta->magic != EMU_META_MAGIC || meta->block_id != h.block_id || meta->data_size != data ||
        h.off + h.size > data) {
        munmap(alias, data + EMU_META_LEN);
        close(fd);
        return rt_ret(cudaErrorInvalidResourceHandle);
    }

    pthread_mutex_lock(&g_mu);
    int same = 0;
    struct alloc *a = import_conflict(&h, data, &same);
    cudaError_t e = cudaSuccess;
    if (a) {
        /* The block (or addresses of it) is mapped already: refused, as
         * drivers do in practice ("resource already mapped"), or with
         * WEFT_EMU_CUDA_IPC_REOPEN=refcount one more reference (the CUDA 13
         * header's wording) when it is the same block. */
        e = same && g_ipc_refcount ? import_add_open(a, &h, devPtr) : cudaErrorAlreadyMapped;
        pthread_mutex_unlock(&g_mu);
        munmap(alias, data + EMU_META_LEN);
        close(fd);
        return rt_ret(e);
    }
    a = calloc(1, sizeof(*a));
    uintptr_t addr = a ? va_get(&g_impva, data) : 0;
    if (!addr || mmap((void *)addr, data, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        if (addr) va_put(&g_impva, addr, data);
        pthread_mutex_unlock(&g_mu);
        free(a);
        munmap(alias, data + EMU_META_LEN);
        close(fd);
        return rt_ret(a ? cudaErrorMapBufferObjectFailed : cudaErrorMemoryAllocation);
    }
    a->alias = alias;
    a->meta = meta;
    a->base = addr;
    a->size = data;
    a->map_size = data;
    a->kind = A_IMPORT;
    a->device = h.device;
    a->buffer_id = ++g_next_bufid;
    a->imp_id = ++g_next_blockid;
    a->fd = fd; /* kept for weft_emu_cuda_peermem_fd */
    a->imp_token = h.token;
    a->imp_block = h.block_id;
    a->imp_va = h.block_va;
    a->imp_pid = h.pid;
    e = import_add_open(a, &h, devPtr);
    if (e == cudaSuccess && alloc_insert(a) != 0) {
        __atomic_sub_fetch(&meta->imports[h.off / EMU_UNIT], 1, __ATOMIC_ACQ_REL);
        e = cudaErrorMemoryAllocation;
    }
    if (e != cudaSuccess) {
        unreserve_range(addr, data);
        va_put(&g_impva, addr, data);
        pthread_mutex_unlock(&g_mu);
        free(a->opens);
        free(a);
        munmap(alias, data + EMU_META_LEN);
        close(fd);
        return rt_ret(e);
    }
    pthread_mutex_unlock(&g_mu);
    COUNT(C_IPC_IMPORTS, 1);
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    ENSURE_CTX();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = devPtr ? alloc_find((uintptr_t)devPtr) : NULL;
    struct iopen *o = NULL;
    for (size_t i = 0; a && a->kind == A_IMPORT && i < a->nopens && !o; i++)
        if (a->opens[i].ptr == (uintptr_t)devPtr) o = &a->opens[i];
    if (!o) {
        pthread_mutex_unlock(&g_mu);
        return rt_ret(cudaErrorInvalidValue);
    }
    int last = a->nopens == 1 && o->refs == 1;
    pthread_mutex_unlock(&g_mu);
    if (last) {
        /* The last close unmaps: queued work may still use the mapping. */
        cudaError_t e = device_sync("cudaIpcCloseMemHandle", -1);
        if (e != cudaSuccess) return rt_ret(e);
    }
    pthread_mutex_lock(&g_mu);
    a = alloc_find((uintptr_t)devPtr);
    o = NULL;
    for (size_t i = 0; a && a->kind == A_IMPORT && i < a->nopens && !o; i++)
        if (a->opens[i].ptr == (uintptr_t)devPtr) o = &a->opens[i];
    if (!o) {
        pthread_mutex_unlock(&g_mu);
        return rt_ret(cudaErrorInvalidValue);
    }
    __atomic_sub_fetch(&a->meta->imports[o->off / EMU_UNIT], 1, __ATOMIC_ACQ_REL);
    if (--o->refs == 0) *o = a->opens[--a->nopens];
    COUNT(C_IPC_CLOSE, 1);
    if (a->nopens > 0) {
        pthread_mutex_unlock(&g_mu);
        return cudaSuccess;
    }
    alloc_remove(a);
    unreserve_range(a->base, a->size);
    va_put(&g_impva, a->base, a->size);
    pthread_mutex_unlock(&g_mu);
    munmap(a->alias, a->size + EMU_META_LEN);
    close(a->fd);
    free(a->opens);
    free(a);
    COUNT(C_IPC_IMPORTS, -1);
    return cudaSuccess;
}

/* ------------------------------------------------------------------ contexts, modules, kernels */

/* Contexts: one per device (the primary context, g_ctx). cuCtxPushCurrent
 * makes it current on the thread -- its device becomes the thread's current
 * device, as the runtime does with a context made current through the
 * driver -- until the matching cuCtxPopCurrent restores what was current
 * before (possibly no context at all). */
#define EMU_CTX_DEPTH 16
static _Thread_local int t_ctx_saved[EMU_CTX_DEPTH];
static _Thread_local int t_ctx_saved_has[EMU_CTX_DEPTH];
static _Thread_local int t_ctx_depth;

static int ctx_device(CUcontext ctx)
{
    for (int d = 0; d < g_ndev; d++)
        if (ctx == &g_ctx[d]) return d;
    return -1;
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    cudaError_t e = ensure();
    if (e) return drv_err(e);
    /* The legacy and per-thread streams are those of the current context. */
    if ((hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD) && !t_has_ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *s;
    if (stream_resolve(hStream, &s) != cudaSuccess) return CUDA_ERROR_INVALID_HANDLE;
    *pctx = &g_ctx[s->device];
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx)
{
    cudaError_t e = ensure();
    if (e) return drv_err(e);
    int d = ctx_device(ctx);
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_ctx_depth == EMU_CTX_DEPTH) return CUDA_ERROR_OUT_OF_MEMORY;
    t_ctx_saved[t_ctx_depth] = t_dev;
    t_ctx_saved_has[t_ctx_depth++] = t_has_ctx;
    t_dev = d;
    t_has_ctx = 1;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    cudaError_t e = ensure();
    if (e) return drv_err(e);
    if (t_ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx) *pctx = &g_ctx[t_dev];
    t_ctx_depth--;
    t_dev = t_ctx_saved[t_ctx_depth];
    t_has_ctx = t_ctx_saved_has[t_ctx_depth];
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = need_ctx();
    if (r != CUDA_SUCCESS) return r;
    *device = t_dev;
    return CUDA_SUCCESS;
}

/* Modules: a well-formed fatbin (magic 0xBA55ED50, version 1, its header's
 * size within the image) loads into the current context -- a call that
 * synchronises the device, as lazy loading makes it on a GPU -- and its
 * functions are weft's reduction kernels, looked up by name (the first
 * lookup of each synchronises too: that is when lazy loading loads it).
 * They run on the stream's worker with weft's host arithmetic
 * (emu_kernels.c). Any other image (a cubin, PTX text) is refused with
 * CUDA_ERROR_NOT_SUPPORTED: no other kernel can run here. */
#define EMU_FATBIN_MAGIC 0xBA55ED50u

struct CUfunc_st {
    struct CUmod_st         *mod;
    const struct emu_kernel *k;
    int                      looked_up;
};

struct CUmod_st {
    uint32_t          magic;     /* EMU_MOD_MAGIC while loaded, 0 once unloaded */
    int               device;
    struct CUfunc_st *fns;       /* one per kernel of the table */
    struct CUmod_st  *next;      /* every module ever made (g_mods, under g_mu) */
};
#define EMU_MOD_MAGIC 0x4d4f4455u

/* Modules are never freed: an unloaded one stays on the list, dead, and is
 * reused by a later load, so a stale handle (or a function of it) reads
 * "not loaded" instead of freed memory. */
static struct CUmod_st *g_mods;

static int module_live(const struct CUmod_st *m)
{
    int live = 0;
    pthread_mutex_lock(&g_mu);
    for (const struct CUmod_st *x = g_mods; x && !live; x = x->next) live = x == m && m->magic == EMU_MOD_MAGIC;
    pthread_mutex_unlock(&g_mu);
    return live;
}

static int fatbin_ok(const void *image)
{
    const unsigned char *p = image;
    uint32_t magic;
    uint16_t version, hsize;
    uint64_t body;
    /* The magic first: an image that is not a fatbin may be shorter than
     * the header (a driver reads no further than it needs either). */
    memcpy(&magic, p, 4);
    if (magic != EMU_FATBIN_MAGIC) return 0;
    memcpy(&version, p + 4, 2);
    memcpy(&hsize, p + 6, 2);
    memcpy(&body, p + 8, 8);
    return magic == EMU_FATBIN_MAGIC && version == 1 && hsize >= 16 && body > 0 && body < (1ULL << 32);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    *module = NULL;
    CUresult r = need_ctx();
    if (r != CUDA_SUCCESS) return r;
    if (!fatbin_ok(image)) return CUDA_ERROR_NOT_SUPPORTED;
    /* WEFT_EMU_CUDA_MODULES=0: as a GPU whose architecture the fatbin has no
     * image (and no PTX) for. */
    if (!g_modules) return CUDA_ERROR_NO_BINARY_FOR_GPU;
    cudaError_t e = device_sync("cuModuleLoadData", t_dev);
    if (e != cudaSuccess) return drv_err(e);
    struct CUmod_st *m = NULL;
    pthread_mutex_lock(&g_mu);
    for (m = g_mods; m && m->magic == EMU_MOD_MAGIC; m = m->next) {}
    if (m) {
        memset(m->fns, 0, (size_t)emu_kernel_count() * sizeof(*m->fns));
        m->magic = EMU_MOD_MAGIC;
        m->device = t_dev;
    }
    pthread_mutex_unlock(&g_mu);
    if (!m) {
        m = calloc(1, sizeof(*m));
        struct CUfunc_st *f = m ? calloc((size_t)emu_kernel_count(), sizeof(*f)) : NULL;
        if (!f) {
            free(m);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        m->magic = EMU_MOD_MAGIC;
        m->device = t_dev;
        m->fns = f;
        pthread_mutex_lock(&g_mu);
        m->next = g_mods;
        g_mods = m;
        pthread_mutex_unlock(&g_mu);
    }
    COUNT(C_MODULE_LOADS, 1);
    *module = m;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
    *hfunc = NULL;
    if (!module_live(hmod)) return CUDA_ERROR_INVALID_HANDLE;
    const struct emu_kernel *k = emu_kernel_find(name);
    if (!k) return CUDA_ERROR_NOT_FOUND;
    struct CUfunc_st *f = &hmod->fns[emu_kernel_index(k)];
    if (!__atomic_load_n(&f->looked_up, __ATOMIC_ACQUIRE)) {
        cudaError_t e = device_sync("cuModuleGetFunction (first lookup)", hmod->device);
        if (e != cudaSuccess) return drv_err(e);
        f->mod = hmod;
        f->k = k;
        __atomic_store_n(&f->looked_up, 1, __ATOMIC_RELEASE);
    }
    *hfunc = f;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod)
{
    if (!module_live(hmod)) return CUDA_ERROR_INVALID_HANDLE;
    /* Queued launches may still use it: they keep their kernel (a table
     * entry), not the module. Kept on g_mods, dead (see there). */
    pthread_mutex_lock(&g_mu);
    hmod->magic = 0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* A kernel operand: n elements of es bytes at p, device memory the kernel
 * can reach (its device's allocations, IPC imports), aligned to the element
 * (a misaligned access faults on a GPU). *view: where the worker reads it. */
static CUresult kernel_operand(const void *p, unsigned long long n, size_t es, int device, void **view)
{
    if ((uintptr_t)p % es) return CUDA_ERROR_MISALIGNED_ADDRESS;
    int d = -1;
    size_t bytes = (size_t)n * es;
    int k = classify(p, bytes ? bytes : 1, &d, view);
    if (k != P_DEVICE) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (d != device && g_no_peer[device][d]) return CUDA_ERROR_ILLEGAL_ADDRESS;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    (void)sharedMemBytes;
    CUresult r = need_ctx();
    if (r != CUDA_SUCCESS) return r;
    if (!f || !f->looked_up || !module_live(f->mod)) return CUDA_ERROR_INVALID_HANDLE;
    if (!kernelParams || extra) return CUDA_ERROR_INVALID_VALUE;
    if (gridDimX == 0 || gridDimY == 0 || gridDimZ == 0 || blockDimX == 0 || blockDimY == 0 || blockDimZ == 0 ||
        (unsigned long long)blockDimX * blockDimY * blockDimZ > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    /* The function's context must be current, and the stream one of it. */
    if (f->mod->device != t_dev) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *s;
    if (stream_resolve(hStream, &s) != cudaSuccess) return CUDA_ERROR_INVALID_HANDLE;
    if (s->device != f->mod->device) return CUDA_ERROR_INVALID_HANDLE;
    const struct emu_kernel *k = f->k;
    void *dst = *(void **)kernelParams[0];
    const void *a = *(const void **)kernelParams[1];
    const void *b = k->div ? NULL : *(const void **)kernelParams[2];
    unsigned long long n = *(unsigned long long *)kernelParams[k->div ? 2 : 3];
    int divisor = k->div ? *(int *)kernelParams[3] : 0;
    if (k->div && divisor < 1) return CUDA_ERROR_INVALID_VALUE;
    struct op *o = op_new(OP_KERNEL);
    if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
    void *vd = NULL, *va = NULL, *vb = NULL;
    if (n > 0) {
        r = kernel_operand(dst, n, k->esize, s->device, &vd);
        if (r == CUDA_SUCCESS) r = kernel_operand(a, n, k->esize, s->device, &va);
        if (r == CUDA_SUCCESS && !k->div) r = kernel_operand(b, n, k->esize, s->device, &vb);
        if (r != CUDA_SUCCESS) {
            free(o);
            fprintf(stderr, "weft-emu-cuda: cuLaunchKernel(%s) over %llu elements (dst %p, a %p%s%p): %s\n",
                    k->name, n, dst, a, k->div ? "" : ", b ", k->div ? (const void *)"" : b,
                    r == CUDA_ERROR_MISALIGNED_ADDRESS ? "misaligned address" : "an operand is not device memory "
                    "of the stream's device (illegal address)");
            return r;
        }
    }
    o->kernel = k;
    o->dst = vd;
    o->src = va;
    o->arg = vb;
    o->u64 = n;
    o->value = divisor;
    stream_push(s, o);
    COUNT(C_LAUNCHES, 1);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ driver entry points */

struct entry { const char *name; void *fn; int since; };

static const struct entry g_entries[] = {
    { "cuStreamWaitValue32", (void *)cuStreamWaitValue32, 8000 },
    { "cuStreamWriteValue32", (void *)cuStreamWriteValue32, 8000 },
    { "cuStreamWaitValue64", (void *)cuStreamWaitValue64, 9000 },
    { "cuStreamWriteValue64", (void *)cuStreamWriteValue64, 9000 },
    { "cuPointerGetAttribute", (void *)cuPointerGetAttribute, 4000 },
    { "cuPointerGetAttributes", (void *)cuPointerGetAttributes, 7000 },
    { "cuMemGetAddressRange", (void *)cuMemGetAddressRange, 3020 },
    { "cuMemGetHandleForAddressRange", (void *)cuMemGetHandleForAddressRange, 11070 },
    { "cuGetErrorString", (void *)cuGetErrorString, 6000 },
    { "cuGetErrorName", (void *)cuGetErrorName, 6000 },
    { "cuDeviceGetAttribute", (void *)cuDeviceGetAttribute, 2000 },
    { "cuDriverGetVersion", (void *)cuDriverGetVersion, 2020 },
    { "cuStreamGetCtx", (void *)cuStreamGetCtx, 9020 },
    { "cuCtxPushCurrent", (void *)cuCtxPushCurrent, 4000 },
    { "cuCtxPopCurrent", (void *)cuCtxPopCurrent, 4000 },
    { "cuCtxGetDevice", (void *)cuCtxGetDevice, 2000 },
    { "cuModuleLoadData", (void *)cuModuleLoadData, 2000 },
    { "cuModuleGetFunction", (void *)cuModuleGetFunction, 2000 },
    { "cuModuleUnload", (void *)cuModuleUnload, 2000 },
    { "cuLaunchKernel", (void *)cuLaunchKernel, 4000 },
};

static int lookup_entry(const char *symbol, int version, void **fn)
{
    *fn = NULL;
    for (size_t i = 0; i < sizeof(g_entries) / sizeof(g_entries[0]); i++) {
        if (strcmp(g_entries[i].name, symbol) != 0) continue;
        if (version < g_entries[i].since) return 2;
        *fn = g_entries[i].fn;
        return 0;
    }
    return 1;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus)
{
    if (!symbol || !funcPtr) return rt_ret(cudaErrorInvalidValue);
    if (flags & ~(unsigned long long)(cudaEnableLegacyStream | cudaEnablePerThreadDefaultStream))
        return rt_ret(cudaErrorInvalidValue);
    ENSURE();
    if (cudaVersion > EMU_VERSION) return rt_ret(cudaErrorInvalidValue);
    int r = lookup_entry(symbol, (int)cudaVersion, funcPtr);
    if (driverStatus)
        *driverStatus = r == 0 ? cudaDriverEntryPointSuccess
                      : r == 1 ? cudaDriverEntryPointSymbolNotFound : cudaDriverEntryPointVersionNotSufficent;
    return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return cudaGetDriverEntryPointByVersion(symbol, funcPtr, EMU_VERSION, flags, driverStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *symbolStatus)
{
    if (!symbol || !pfn || cudaVersion > EMU_VERSION) return CUDA_ERROR_INVALID_VALUE;
    (void)flags;
    int r = lookup_entry(symbol, cudaVersion, pfn);
    if (symbolStatus)
        *symbolStatus = r == 0 ? CU_GET_PROC_ADDRESS_SUCCESS
                      : r == 1 ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND : CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return r == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* The unversioned names of the stream memory operations, as libcuda exports
 * them too (same behaviour here). */
#undef cuStreamWaitValue32
#undef cuStreamWriteValue32
#undef cuStreamWaitValue64
#undef cuStreamWriteValue64
#define EMU_ALIAS(name, target) __attribute__((alias(#target), visibility("default")))
CUresult cuStreamWaitValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) EMU_ALIAS(cuStreamWaitValue32, cuStreamWaitValue32_v2);
CUresult cuStreamWriteValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) EMU_ALIAS(cuStreamWriteValue32, cuStreamWriteValue32_v2);
CUresult cuStreamWaitValue64(CUstream, CUdeviceptr, cuuint64_t, unsigned int) EMU_ALIAS(cuStreamWaitValue64, cuStreamWaitValue64_v2);
CUresult cuStreamWriteValue64(CUstream, CUdeviceptr, cuuint64_t, unsigned int) EMU_ALIAS(cuStreamWriteValue64, cuStreamWriteValue64_v2);
