/*
 * GPUDirect RDMA over the ib transport: the NIC reads and writes CUDA
 * device memory itself, so a device buffer's rendezvous data needs no copy
 * through host memory.
 *
 * Registration (the registration cache's reg op, ib_reg_cb). Host memory:
 * ibv_reg_mr. Device memory (weft_cuda_mem_attr kind DEVICE):
 *   1. dma-buf: cuMemGetHandleForAddressRange(DMA_BUF_FD) of the page range,
 *      ibv_reg_dmabuf_mr(pd, offset 0, len, iova = the range's address, fd),
 *      then the fd is closed (the MR keeps what it needs);
 *   2. else, when a peer-memory module (nvidia-peermem) lets ibv_reg_mr pin
 *      GPU memory, plain ibv_reg_mr;
 *   3. else the registration fails, saying why for each way.
 * The cache is keyed by address: a device allocation freed and another one
 * made at the same address would hit the old MR (which still holds the old
 * memory). ib_reg_acquire therefore checks the CUDA buffer id recorded at
 * registration against the buffer's current one and registers anew when
 * they differ.
 *
 * Capability (ib_gdr_setup, at create once the PD exists). A rank can do
 * GPUDirect when WEFT_IB_GDR is not 0, CUDA is loaded, the probe of
 * src/core/gdr.c found ibv_reg_dmabuf_mr or a peer-memory module, and one
 * of the two ways really registers a test allocation (a small cudaMalloc:
 * exported, registered, deregistered, freed). The rank card blob says so
 * (ib_gdr); a pair uses GPUDirect only when both cards do (rndv_mem offers
 * WEFT_TP_MEM_DEVICE then: device buffers take the ordinary ib rendezvous,
 * RDMA WRITE WITH IMM from/to the device buffers, instead of host staging),
 * so sender and receiver always agree. WEFT_IB_GDR=1 makes a rank that
 * offers ib without the capability fail create.
 */
#ifdef WEFT_HAVE_VERBS_HEADERS

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudawrap.h"
#include "gdr.h"
#include "ib.h"
#include "log.h"
#include "weft.h"

#define IB_MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static const char *const reg_how_name[3] = { "host", "dma-buf", "peer memory" };

#ifdef WEFT_HAVE_CUDA_HEADERS
static const char *cu_err(const struct weft_cuda *cu, CUresult e)
{
    const char *s = NULL;
    if (cu->cuGetErrorString == NULL || cu->cuGetErrorString(e, &s) != CUDA_SUCCESS || s == NULL)
        return "unknown CUDA error";
    return s;
}

/* dma-buf registration of device memory [addr, addr+len) (page-aligned). */
static struct ibv_mr *reg_dmabuf(struct ib_state *st, uintptr_t addr, size_t len, char *why, size_t whylen)
{
    const struct weft_cuda *cu = weft_cuda_get();
    struct ibv_mr *mr;
    int fd = -1, e;
    CUresult r;

    if (cu == NULL || cu->cuMemGetHandleForAddressRange == NULL) {
        snprintf(why, whylen, "the CUDA driver has no cuMemGetHandleForAddressRange");
        return NULL;
    }
    if (st->ibv.reg_dmabuf_mr == NULL) {
        snprintf(why, whylen, "%.100s has no ibv_reg_dmabuf_mr", st->ibv.path);
        return NULL;
    }
    r = cu->cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)addr, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CUDA_SUCCESS || fd < 0) {
        snprintf(why, whylen, "cuMemGetHandleForAddressRange(DMA_BUF_FD) failed: %s", cu_err(cu, r));
        return NULL;
    }
    mr = st->ibv.reg_dmabuf_mr(st->pd, 0, len, (uint64_t)addr, fd, IB_MR_ACCESS);
    e = errno;
    close(fd);
    if (mr == NULL)
        snprintf(why, whylen, "ibv_reg_dmabuf_mr failed: %s", strerror(e));
    return mr;
}
#endif

/* Device memory [addr, addr+len): dma-buf, else peer memory. */
static struct ibv_mr *reg_device(struct ib_state *st, uintptr_t addr, size_t len, const struct weft_mem_attr *a,
                                 int *how, char *why, size_t whylen)
{
    char w1[160] = "not available here", w2[160] = "no peer-memory module";
    struct ibv_mr *mr = NULL;

    if (!st->gdr) {
        snprintf(why, whylen, "CUDA device memory (%zu bytes at %p) cannot be registered with %s: GPUDirect RDMA "
                 "is not available (%s)", len, (void *)addr, st->port.dev, st->gdr_why);
        return NULL;
    }
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (st->gdr_dmabuf) {
        mr = reg_dmabuf(st, addr, len, w1, sizeof(w1));
        if (mr) {
            *how = IB_REG_DMABUF;
            return mr;
        }
    }
#endif
    /* The test allocation showed ibv_reg_mr works on GPU memory, or the
     * probe saw a peer-memory module (dma-buf may fail for some buffers). */
    if (st->gdr_peermem || weft_gdr_info()->peermem) {
        /* Only the allocation's part of the page range: a peer-memory
         * module pins the allocation it finds at the address, and the
         * range's last page may run past the allocation's end (a buffer
         * of another allocation there has another buffer id, so
         * ib_reg_acquire never uses this MR for it). */
        uintptr_t lo = addr, hi = addr + len;
        if (a->size > 0) {
            if (lo < a->base)
                lo = a->base;
            if (hi > a->base + a->size)
                hi = a->base + a->size;
        }
        mr = hi > lo ? st->ibv.reg_mr(st->pd, (void *)lo, hi - lo, IB_MR_ACCESS) : NULL;
        if (mr) {
            *how = IB_REG_PEERMEM;
            return mr;
        }
        snprintf(w2, sizeof(w2), "ibv_reg_mr failed: %s", strerror(errno));
    }
    snprintf(why, whylen, "CUDA device memory (%zu bytes at %p) cannot be registered with %s: dma-buf: %s; "
             "peer memory: %s", len, (void *)addr, st->port.dev, w1, w2);
    return NULL;
}

/* The memory at [addr, addr+len) as CUDA sees it: the user's buffer when
 * the registration is for one (a page's start may lie in another, smaller
 * allocation: drivers carve those from shared blocks), else its first
 * page, else its last. */
static void classify(const struct ib_state *st, uintptr_t addr, size_t len, struct weft_mem_attr *a)
{
    if (st->reg_buf != NULL && (uintptr_t)st->reg_buf >= addr && (uintptr_t)st->reg_buf - addr < len) {
        weft_cuda_mem_attr(st->reg_buf, a);
        if (a->kind == WEFT_MEM_DEVICE)
            return;
    }
    weft_cuda_mem_attr((const void *)addr, a);
    if (a->kind != WEFT_MEM_DEVICE && len > 1) {
        struct weft_mem_attr b;
        weft_cuda_mem_attr((const void *)(addr + len - 1), &b);
        if (b.kind == WEFT_MEM_DEVICE)
            *a = b;
    }
}

int ib_reg_cb(void *ctx, uintptr_t addr, size_t len, void **handle, uint32_t *lkey, uint32_t *rkey, char *why,
              size_t whylen)
{
    struct ib_state *st = ctx;
    struct weft_mem_attr a;
    struct ibv_mr *mr = NULL;
    struct ib_mr *m;
    int how = IB_REG_HOST;

    memset(&a, 0, sizeof(a));
    a.kind = WEFT_MEM_HOST;
    if (weft_cuda_available())
        classify(st, addr, len, &a);
    if (a.kind == WEFT_MEM_DEVICE) {
        mr = reg_device(st, addr, len, &a, &how, why, whylen);
        if (mr == NULL)
            return -1;
    } else {
        mr = st->ibv.reg_mr(st->pd, (void *)addr, len, IB_MR_ACCESS);
        if (mr == NULL) {
            int e = errno;
            /* A send buffer may be read-only memory (a constant table), which
             * cannot be pinned for writing; reading is all a send needs. */
            mr = st->ibv.reg_mr(st->pd, (void *)addr, len, IBV_ACCESS_REMOTE_READ);
            if (mr == NULL) {
                snprintf(why, whylen, "ibv_reg_mr of %zu bytes at %p failed: %s", len, (void *)addr, strerror(e));
                return -1;
            }
        }
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        st->ibv.dereg_mr(mr);
        snprintf(why, whylen, "no memory");
        return -1;
    }
    m->mr = mr;
    m->how = how;
    m->buffer_id = how == IB_REG_HOST ? 0 : a.buffer_id;
    if (how != IB_REG_HOST) {
        if (st->gdr_regs[IB_REG_DMABUF] + st->gdr_regs[IB_REG_PEERMEM] == 0)
            WEFT_INFO(st->core->rank, "ib: GPUDirect RDMA: first device buffer registered through %s (%zu bytes at "
                      "%p, cuda%d)", reg_how_name[how], len, (void *)addr, a.device);
        else
            WEFT_TRACE(st->core->rank, "ib: GPUDirect RDMA: device memory registered through %s (%zu bytes at %p)",
                       reg_how_name[how], len, (void *)addr);
    }
    st->gdr_regs[how]++;
    *handle = m;
    *lkey = mr->lkey;
    *rkey = mr->rkey;
    return 0;
}

void ib_dereg_cb(void *ctx, void *handle)
{
    struct ib_state *st = ctx;
    struct ib_mr *m = handle;
    if (m == NULL)
        return;
    if (m->mr)
        st->ibv.dereg_mr(m->mr);
    free(m);
}

int ib_reg_acquire(struct ib_state *st, const void *buf, size_t len, int mem_kind, struct weft_reg **out,
                   char *why, size_t whylen)
{
    struct weft_regcache *rc = st->regcache;
    struct weft_mem_attr a;
    const struct ib_mr *m;
    st->reg_buf = buf;   /* what ib_reg_cb classifies (under the p2p lock) */
    int err = weft_regcache_acquire(rc, buf, len, out, why, whylen);
    st->reg_buf = NULL;

    if (err != WEFT_SUCCESS || mem_kind != WEFT_MEM_DEVICE)
        return err;
    m = (*out)->handle;
    weft_cuda_mem_attr(buf, &a);
    if (m != NULL && m->how != IB_REG_HOST && m->buffer_id == a.buffer_id)
        return WEFT_SUCCESS;
    /* Registered for another allocation that lived at this address (or as
     * host memory): drop it (at its last release if in flight), register. */
    WEFT_TRACE(st->core->rank, "ib: cached registration at %p is of an older device allocation: registering anew",
               buf);
    weft_regcache_release(rc, *out);
    *out = NULL;
    weft_regcache_invalidate(rc, buf, len);
    st->reg_buf = buf;
    err = weft_regcache_acquire(rc, buf, len, out, why, whylen);
    st->reg_buf = NULL;
    return err;
}

/* ------------------------------------------------------------ capability */

#ifdef WEFT_HAVE_CUDA_HEADERS
/* Registers, then deregisters, one page of a fresh device allocation each
 * way the probe allows. Fills st->gdr_dmabuf / gdr_peermem, or why. */
static void test_allocation(struct ib_state *st, const struct weft_gdr_info *g, char *why, size_t whylen)
{
    const struct weft_cuda *cu = weft_cuda_get();
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    char w1[160] = "", w2[160] = "";
    void *p = NULL;
    int dev = -1;
    cudaError_t e;

    (void)cu->GetDevice(&dev);
    e = cu->Malloc(&p, 4 * page);
    if (e != cudaSuccess || p == NULL) {
        snprintf(why, whylen, "cudaMalloc of a %zu-byte test buffer failed: %s", 4 * page, cu->GetErrorString(e));
        cu->GetLastError();
        return;
    }
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1);
    if (g->dmabuf) {
        struct ibv_mr *mr = reg_dmabuf(st, a, page, w1, sizeof(w1));
        if (mr) {
            st->ibv.dereg_mr(mr);
            st->gdr_dmabuf = 1;
        }
    } else {
        snprintf(w1, sizeof(w1), "%.100s has no ibv_reg_dmabuf_mr", st->ibv.path);
    }
    if (!st->gdr_dmabuf) {
        /* Whatever the module traces say: ibv_reg_mr of GPU memory either
         * works (a peer-memory module, under any name) or fails with EFAULT. */
        struct ibv_mr *mr = st->ibv.reg_mr(st->pd, (void *)a, page, IB_MR_ACCESS);
        if (mr) {
            st->ibv.dereg_mr(mr);
            st->gdr_peermem = 1;
        } else {
            snprintf(w2, sizeof(w2), "ibv_reg_mr of device memory failed: %s%s%s", strerror(errno),
                     g->peermem ? " although " : "", g->peermem ? g->peermem_how : "");
        }
    }
    if (cu->Free(p) != cudaSuccess)
        cu->GetLastError();
    if (!st->gdr_dmabuf && !st->gdr_peermem)
        snprintf(why, whylen, "cuda%d test buffer: dma-buf: %s; peer memory: %s", dev, w1, w2);
}
#endif

void ib_gdr_setup(struct ib_state *st)
{
    const struct weft_core *c = st->core;
    const struct weft_gdr_info *g;

    st->gdr = st->gdr_dmabuf = st->gdr_peermem = 0;
    st->gdr_why[0] = '\0';
    /* Once per process: what the kernel and the verbs library offer. */
    g = weft_gdr_probe(st->ibv.reg_dmabuf_mr != NULL, c->rank);
    if (c->cfg.ib_gdr == 0) {
        snprintf(st->gdr_why, sizeof(st->gdr_why), "WEFT_IB_GDR=0");
    } else if (!c->cuda) {
        snprintf(st->gdr_why, sizeof(st->gdr_why), "CUDA is not loaded (%.200s)",
                 weft_cuda_why()[0] ? weft_cuda_why() : "no device");
    } else if (!g->dmabuf && !g->peermem) {
        snprintf(st->gdr_why, sizeof(st->gdr_why), "neither ibv_reg_dmabuf_mr in %.100s nor a peer-memory module",
                 st->ibv.path);
    } else {
#ifdef WEFT_HAVE_CUDA_HEADERS
        test_allocation(st, g, st->gdr_why, sizeof(st->gdr_why));
#else
        snprintf(st->gdr_why, sizeof(st->gdr_why), "weft was built without the CUDA headers");
#endif
    }
    st->gdr = st->gdr_dmabuf || st->gdr_peermem;
    if (st->gdr)
        WEFT_INFO(c->rank, "ib: GPUDirect RDMA: yes, %s registers CUDA device memory through %s", st->port.dev,
                  st->gdr_dmabuf ? "dma-buf (cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr)"
                                 : "a peer-memory module (ibv_reg_mr)");
    else
        WEFT_INFO(c->rank, "ib: GPUDirect RDMA: no (%s): device buffers are staged through host memory",
                  st->gdr_why);
}

#else
typedef int weft_ib_gdr_unused;
#endif /* WEFT_HAVE_VERBS_HEADERS */
