/*
 * Reductions of device memory by CUDA kernels (reduce_kernel.h).
 *
 * The kernels (reduce_cuda.cu) are built by nvcc into a fatbin that the
 * build embeds as a byte array (cmake/weft_cuda_kernels.cmake); weft links
 * no CUDA library, so they are loaded and launched through driver entry
 * points resolved by src/core/cudawrap.c:
 *
 *     weft_reduce_device_available / weft_reduce_device(_div)
 *        |
 *        |  ctx = cuStreamGetCtx(weft's stream)      the stream's device,
 *        |  cuCtxPushCurrent(ctx)                    whatever thread calls
 *        v
 *     module of ctx?  -- no --> cuModuleLoadData(fatbin)   once per context,
 *        |                      cuModuleGetFunction x 50   under kmod_lock;
 *        |                      (a refusal is kept, with   a failure is kept
 *        |                       its why, and not retried)
 *        v
 *     cuLaunchKernel(weft_reduce_<type>_<op>) on weft's stream
 *     cudaStreamSynchronize(weft's stream)
 *     cuCtxPopCurrent
 *
 * Loading a module (and the first lookup of each function, with lazy
 * loading) synchronises the device. It is done on a thread that may wait
 * for the device: the caller of a collective, never one of weft's threads
 * while a stream waits on weft (its progress thread would wait for itself:
 * src/core/cudawrap.h, weft_cuda_may_sync). Stream-ordered collectives load
 * it when they are queued (weft_coll_prepare); if it is still not loaded
 * when one of weft's threads needs it, the call fails with a message rather
 * than hang.
 *
 * Operands not aligned to their element (a user's odd offset) are copied
 * into aligned device scratch (src/core/devcopy.c, weft_devcopy_align_get)
 * piece by piece, reduced there and copied back: every launch sees aligned
 * pointers, and the kernels have no byte-wise path.
 * Why the stream's context: a module belongs to one context (one device's
 * primary context for runtime users), a kernel runs on its module's device,
 * and it may only be queued on a stream of that context. weft's stream is
 * created on the device current at weft_comm_create (src/core/devcopy.c);
 * the calling thread may be the progress thread, whose current device is
 * whatever it is, so the context is taken from the stream and pushed, not
 * from the thread. Modules are cached by context (a device reset gives a new
 * context, which loads its own) and stay loaded until the process exits.
 *
 * The buffers must be device memory of that same device: a kernel touching
 * another device's memory without peer access, or pageable host memory,
 * faults and poisons the application's context, so every launch checks its
 * pointers first (cuPointerGetAttributes, about a microsecond) and refuses
 * with a message instead.
 *
 * Where no kernel can run -- no fatbin in this build, no CUDA in the comm,
 * a driver without the entry points, a GPU without an image in the fatbin
 * and no PTX it can compile, the emulated runtime (which refuses
 * cuModuleLoadData) -- weft_reduce_device_available says why and the
 * collectives stage through host memory (collectives/coll_reduce.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "cudawrap.h"
#include "devcopy.h"
#include "log.h"
#include "reduce_kernel.h"
#include "weft.h"

#if defined(WEFT_HAVE_CUDA_HEADERS) && defined(WEFT_HAVE_REDUCE_FATBIN)
#define WEFT_REDUCE_KERNELS 1
#endif

#ifdef WEFT_HAVE_CUDA_HEADERS
static const struct weft_cuda *cu(void) { return weft_cuda_get(); }
#endif

#ifdef WEFT_REDUCE_KERNELS

/* A driver error as "text (code)". */
static const char *drv_error(CUresult r, char *buf, size_t len)
{
    const char *s = NULL;
    if (cu() == NULL || cu()->cuGetErrorString == NULL || cu()->cuGetErrorString(r, &s) != CUDA_SUCCESS || !s)
        s = "unknown CUDA driver error";
    snprintf(buf, len, "%s (CUresult %d)", s, (int)r);
    return buf;
}

/* The fatbin as cmake/bin2c.cmake writes it (hidden: not exported). */
#define HIDDEN __attribute__((visibility("hidden")))
HIDDEN extern const unsigned char weft_reduce_fatbin[];
HIDDEN extern const char weft_reduce_fatbin_desc[];

/* Kernel names by enum weft_dtype_t, as reduce_cuda.cu defines them. */
static const char *const type_tag[WEFT_DTYPE_COUNT] = { "i8", "u8", "i32", "u32", "i64", "u64",
                                                         "f16", "bf16", "f32", "f64" };
/* By weft_op_t up to MAX (AVG launches SUM). */
#define KOPS 4
static const char *const op_tag[KOPS] = { "sum", "prod", "min", "max" };

/* Block size of every launch; grids stride, so the grid is capped (a few
 * waves on the largest GPUs) rather than covering every element. */
#define KBLOCK    256u
#define KMAX_GRID 4096u

/* One context's module: ok = 1 loaded, -1 refused (why says so). Entries
 * are appended under kmod_lock and never change once filled. */
struct kmod {
    CUcontext  ctx;
    int        device;
    int        ok;
    CUmodule   mod;
    CUfunction reduce[WEFT_DTYPE_COUNT][KOPS];
    CUfunction div[WEFT_DTYPE_COUNT];
    char       why[320];
};

/* Contexts seen by this process: one per device, more only after device
 * resets. Past the table, kernels are refused (staged), never wrong. */
#define KMOD_MAX 64
static pthread_mutex_t kmod_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kmod     kmods[KMOD_MAX];
static int             nkmods;

/* Whether the driver gave weft what the kernels need. */
static const char *missing_entry(const struct weft_cuda *c)
{
    if (c->cuModuleLoadData == NULL)
        return "cuModuleLoadData";
    if (c->cuModuleGetFunction == NULL)
        return "cuModuleGetFunction";
    if (c->cuModuleUnload == NULL)
        return "cuModuleUnload";
    if (c->cuLaunchKernel == NULL)
        return "cuLaunchKernel";
    if (c->cuStreamGetCtx == NULL)
        return "cuStreamGetCtx";
    if (c->cuCtxPushCurrent == NULL)
        return "cuCtxPushCurrent";
    if (c->cuCtxPopCurrent == NULL)
        return "cuCtxPopCurrent";
    if (c->cuCtxGetDevice == NULL)
        return "cuCtxGetDevice";
    return NULL;
}

/* Loads the fatbin into k->ctx, which is current. kmod_lock held. */
static void kmod_load(struct kmod *k)
{
    const struct weft_cuda *c = cu();
    char e[160];
    CUdevice dev = -1;
    CUresult r;

    if (c->cuCtxGetDevice(&dev) == CUDA_SUCCESS)
        k->device = (int)dev;
    r = c->cuModuleLoadData(&k->mod, weft_reduce_fatbin);
    if (r != CUDA_SUCCESS) {
        /* The usual ones: no image for this architecture and no PTX the
         * driver can compile (CUDA_ERROR_NO_BINARY_FOR_GPU, a PTX newer
         * than the driver), or a runtime that cannot run kernels at all. */
        snprintf(k->why, sizeof k->why, "cuModuleLoadData refused the reduction kernels on device %d: %s "
                 "(the fatbin has %s)", k->device, drv_error(r, e, sizeof e), weft_reduce_fatbin_desc);
        k->ok = -1;
        return;
    }
    for (int t = 0; t < WEFT_DTYPE_COUNT; t++)
        for (int o = 0; o <= KOPS; o++) {
            /* o == KOPS: the type's division */
            char name[64];
            CUfunction *f = o < KOPS ? &k->reduce[t][o] : &k->div[t];
            if (o < KOPS)
                snprintf(name, sizeof name, "weft_reduce_%s_%s", type_tag[t], op_tag[o]);
            else
                snprintf(name, sizeof name, "weft_div_%s", type_tag[t]);
            if ((r = c->cuModuleGetFunction(f, k->mod, name)) != CUDA_SUCCESS) {
                snprintf(k->why, sizeof k->why, "reduction kernel %s not found in the loaded fatbin on device %d: "
                         "%s", name, k->device, drv_error(r, e, sizeof e));
                c->cuModuleUnload(k->mod);
                k->mod = NULL;
                k->ok = -1;
                return;
            }
        }
    k->ok = 1;
}

/* The module of ctx (current), loaded on first use. NULL when no slot is
 * left, or (*not_now) when loading is not allowed on this thread now;
 * otherwise check ->ok. */
static const struct kmod *kmod_get(CUcontext ctx, int *not_now)
{
    struct kmod *k = NULL;
    *not_now = 0;
    pthread_mutex_lock(&kmod_lock);
    for (int i = 0; i < nkmods; i++)
        if (kmods[i].ctx == ctx) {
            k = &kmods[i];
            break;
        }
    if (k == NULL && !weft_cuda_may_sync_in_progress()) {
        *not_now = 1;   /* not a refusal: a caller's thread loads it */
    } else if (k == NULL && nkmods < KMOD_MAX) {
        k = &kmods[nkmods++];
        memset(k, 0, sizeof *k);
        k->ctx = ctx;
        k->device = -1;
        kmod_load(k);
    }
    pthread_mutex_unlock(&kmod_lock);
    return k;
}

/* Makes the context of weft's stream current and finds its module.
 * WEFT_SUCCESS with *k loaded (call leave() after), or an error code with
 * why filled and nothing to leave. */
static int enter(struct weft_core *core, const struct kmod **k, char *why, size_t whylen)
{
    const struct weft_cuda *c = cu();
    const char *miss;
    CUcontext ctx = NULL;
    CUresult r;
    char e[160];

    *k = NULL;
    if (!core->cuda || c == NULL) {
        snprintf(why, whylen, "CUDA is not available in this comm%s%s", weft_cuda_why()[0] ? ": " : "",
                 weft_cuda_why());
        return WEFT_ERR_UNSUPPORTED;
    }
    if ((miss = missing_entry(c)) != NULL) {
        snprintf(why, whylen, "the CUDA driver has no entry point %s (needed to load the reduction kernels)",
                 miss);
        return WEFT_ERR_UNSUPPORTED;
    }
    CUstream s = (CUstream)weft_devcopy_stream(core);
    if (s == NULL) {
        snprintf(why, whylen, "weft's CUDA stream is missing");
        return WEFT_ERR_UNSUPPORTED;
    }
    if ((r = c->cuStreamGetCtx(s, &ctx)) != CUDA_SUCCESS || ctx == NULL) {
        snprintf(why, whylen, "cuStreamGetCtx of weft's CUDA stream failed: %s", drv_error(r, e, sizeof e));
        return WEFT_ERR_TRANSPORT;
    }
    if ((r = c->cuCtxPushCurrent(ctx)) != CUDA_SUCCESS) {
        snprintf(why, whylen, "cuCtxPushCurrent of weft's CUDA stream's context failed: %s",
                 drv_error(r, e, sizeof e));
        return WEFT_ERR_TRANSPORT;
    }
    int not_now = 0;
    const struct kmod *m = kmod_get(ctx, &not_now);
    if (m == NULL || m->ok != 1) {
        if (not_now)
            snprintf(why, whylen, "the reduction kernels are not loaded yet, and loading them (cuModuleLoadData) "
                     "would synchronise the device from one of weft's threads while a stream waits on weft "
                     "(they are loaded where a collective is called)");
        else if (m == NULL)
            snprintf(why, whylen, "more than %d CUDA contexts in this process: no reduction kernels for more",
                     KMOD_MAX);
        else
            snprintf(why, whylen, "%s", m->why);
        CUcontext popped;
        c->cuCtxPopCurrent(&popped);
        return WEFT_ERR_UNSUPPORTED;
    }
    *k = m;
    return WEFT_SUCCESS;
}

static void leave(void)
{
    CUcontext popped;
    cu()->cuCtxPopCurrent(&popped);
}

/* Each distinct pointer must be device (or managed) memory of the kernel's
 * device. WEFT_SUCCESS, or WEFT_ERR_UNSUPPORTED with the comm's last error
 * naming what and the buffer. */
static int check_buffers(struct weft_core *core, const struct kmod *k, const void *const *p, int n, size_t bytes,
                         const char *what)
{
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= p[j] == p[i];
        if (seen)
            continue;
        CUpointer_attribute attrs[3] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                         CU_POINTER_ATTRIBUTE_IS_MANAGED };
        unsigned int memtype = 0, managed = 0;
        int ordinal = -1;
        void *data[3] = { &memtype, &ordinal, &managed };
        if (weft_cuda_ptr_attrs(3, attrs, data, p[i]) != CUDA_SUCCESS)
            memtype = 0;
        if (managed)
            continue;   /* reachable from any device */
        if (memtype != CU_MEMORYTYPE_DEVICE)
            return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "%s: device reduction of %zu bytes: buffer %p is "
                                  "not device memory", what, bytes, p[i]);
        if (ordinal != k->device)
            return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "%s: device reduction of %zu bytes: buffer %p is "
                                  "on device %d, but weft's CUDA stream (created at weft_comm_create) is on "
                                  "device %d", what, bytes, p[i], ordinal, k->device);
    }
    return WEFT_SUCCESS;
}

/* Queues f over count elements of es bytes on weft's stream. */
static int launch_async(struct weft_core *core, CUfunction f, void **params, size_t count, size_t es, const char *what,
                        const char *kname)
{
    const struct weft_cuda *c = cu();
    CUstream s = (CUstream)weft_devcopy_stream(core);
    /* A thread handles 16 bytes at a time in the aligned case. */
    size_t per_thread = 16 / es;
    size_t units = (count + per_thread - 1) / per_thread;
    size_t blocks = (units + KBLOCK - 1) / KBLOCK;
    char e[160];

    if (blocks > KMAX_GRID)
        blocks = KMAX_GRID;
    if (blocks == 0)
        blocks = 1;
    CUresult r = c->cuLaunchKernel(f, (unsigned)blocks, 1, 1, KBLOCK, 1, 1, 0, s, params, NULL);
    if (r != CUDA_SUCCESS)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "%s: launch of %s over %zu elements failed: %s", what, kname,
                              count, drv_error(r, e, sizeof e));
    return WEFT_SUCCESS;
}

/* Waits for weft's stream: the kernels (and copies) queued are done. */
static int stream_wait(struct weft_core *core, const char *what, const char *kname, size_t count)
{
    const struct weft_cuda *c = cu();
    cudaError_t ce = c->StreamSynchronize((cudaStream_t)weft_devcopy_stream(core));
    if (ce != cudaSuccess) {
        c->GetLastError();   /* not left for the application's next call */
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "%s: %s over %zu elements failed: %s", what, kname, count,
                              c->GetErrorString(ce));
    }
    return WEFT_SUCCESS;
}

/* Launches f over count elements of es bytes on weft's stream and waits. */
static int launch(struct weft_core *core, CUfunction f, void **params, size_t count, size_t es, const char *what,
                  const char *kname)
{
    int rc = launch_async(core, f, params, count, es, what, kname);
    return rc != WEFT_SUCCESS ? rc : stream_wait(core, what, kname, count);
}

/* A device-to-device copy on weft's stream (any alignment). */
static int copy_async(struct weft_core *core, void *dst, const void *src, size_t n, const char *what)
{
    const struct weft_cuda *c = cu();
    cudaError_t e = c->MemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, (cudaStream_t)weft_devcopy_stream(core));
    if (e != cudaSuccess) {
        c->GetLastError();
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "%s: copying %zu bytes of misaligned operands into aligned "
                              "scratch failed: %s", what, n, c->GetErrorString(e));
    }
    return WEFT_SUCCESS;
}

/* dst = a op b (b NULL: dst = a / n) over count elements whose pointers are
 * not all element-aligned: piece by piece through the aligned scratch --
 * a and b copied in, the kernel, the result copied out, all in order on
 * weft's stream (dst may be exactly a or b: each piece is read before it is
 * written). */
static int reduce_misaligned(struct weft_core *core, CUfunction f, void *dst, const void *a, const void *b,
                             size_t count, size_t es, int n, const char *what, const char *kname)
{
    char *sc = weft_devcopy_align_get(core);
    if (sc == NULL)
        return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "%s: device reduction of %zu elements whose buffers are "
                              "not aligned to the %zu-byte element: no aligned scratch was prepared, and one cannot "
                              "be allocated on this thread now", what, count, es);
    char *sa = sc, *sb = sc + WEFT_DEVCOPY_ALIGN_PIECE, *sd = sc + 2 * (size_t)WEFT_DEVCOPY_ALIGN_PIECE;
    size_t piece = WEFT_DEVCOPY_ALIGN_PIECE / es;
    int rc = WEFT_SUCCESS;
    for (size_t off = 0; off < count && rc == WEFT_SUCCESS; off += piece) {
        size_t m = count - off < piece ? count - off : piece;
        unsigned long long mm = m;
        rc = copy_async(core, sa, (const char *)a + off * es, m * es, what);
        if (rc == WEFT_SUCCESS && b)
            rc = copy_async(core, sb, (const char *)b + off * es, m * es, what);
        if (rc == WEFT_SUCCESS) {
            void *d = sd;
            const void *pa = sa, *pb = sb;
            void *rparams[4] = { &d, &pa, &pb, &mm };
            void *dparams[4] = { &d, &pa, &mm, &n };
            rc = launch_async(core, f, b ? rparams : dparams, m, es, what, kname);
        }
        if (rc == WEFT_SUCCESS)
            rc = copy_async(core, (char *)dst + off * es, sd, m * es, what);
    }
    int wrc = stream_wait(core, what, kname, count);   /* the scratch is free again once this returns */
    weft_devcopy_align_put(core);
    return rc != WEFT_SUCCESS ? rc : wrc;
}

int weft_reduce_device_available(struct weft_core *core, int device, char *why, size_t whylen)
{
    const struct kmod *k;
    if (enter(core, &k, why, whylen) != WEFT_SUCCESS)
        return 0;
    int kdev = k->device;
    leave();
    if (device >= 0 && device != kdev) {
        snprintf(why, whylen, "the buffers are on device %d, weft's CUDA stream (created at weft_comm_create) on "
                 "device %d", device, kdev);
        return 0;
    }
    if (whylen)
        why[0] = '\0';
    return 1;
}

int weft_reduce_device(struct weft_core *core, void *dst, const void *a, const void *b, size_t count, int dtype,
                       int op, const char *what)
{
    size_t es = weft_dtype_size(dtype);
    const struct kmod *k;
    char why[320];
    int rc;

    if (es == 0 || op < 0 || op >= WEFT_OP_COUNT)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "%s: device reduction of type %d, op %d", what, dtype, op);
    if (count == 0)
        return WEFT_SUCCESS;
    if ((rc = enter(core, &k, why, sizeof why)) != WEFT_SUCCESS)
        return weft_set_error(core, rc, "%s: no reduction kernels: %s", what, why);
    const void *ptrs[3] = { dst, a, b };
    if ((rc = check_buffers(core, k, ptrs, 3, count * es, what)) == WEFT_SUCCESS) {
        int o = op == WEFT_AVG ? WEFT_SUM : op;
        unsigned long long n = count;
        void *params[4] = { &dst, &a, &b, &n };
        char kname[64];
        snprintf(kname, sizeof kname, "weft_reduce_%s_%s", type_tag[dtype], op_tag[o]);
        if ((((uintptr_t)dst | (uintptr_t)a | (uintptr_t)b) % es) != 0)
            rc = reduce_misaligned(core, k->reduce[dtype][o], dst, a, b, count, es, 0, what, kname);
        else
            rc = launch(core, k->reduce[dtype][o], params, count, es, what, kname);
    }
    leave();
    return rc;
}

int weft_reduce_device_div(struct weft_core *core, void *dst, const void *src, size_t count, int dtype, int n,
                           const char *what)
{
    size_t es = weft_dtype_size(dtype);
    const struct kmod *k;
    char why[320];
    int rc;

    if (es == 0)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "%s: device division of type %d", what, dtype);
    if (count == 0)
        return WEFT_SUCCESS;
    /* Dividing by 1 changes nothing (n < 1 cannot come from a caller): the
     * values pass through, as on the host. */
    if (n <= 1)
        return dst == src ? WEFT_SUCCESS : weft_devcopy_sync(core, dst, src, count * es, what);
    if ((rc = enter(core, &k, why, sizeof why)) != WEFT_SUCCESS)
        return weft_set_error(core, rc, "%s: no reduction kernels: %s", what, why);
    const void *ptrs[2] = { dst, src };
    if ((rc = check_buffers(core, k, ptrs, 2, count * es, what)) == WEFT_SUCCESS) {
        unsigned long long cnt = count;
        void *params[4] = { &dst, &src, &cnt, &n };
        char kname[64];
        snprintf(kname, sizeof kname, "weft_div_%s", type_tag[dtype]);
        if ((((uintptr_t)dst | (uintptr_t)src) % es) != 0)
            rc = reduce_misaligned(core, k->div[dtype], dst, src, NULL, count, es, n, what, kname);
        else
            rc = launch(core, k->div[dtype], params, count, es, what, kname);
    }
    leave();
    return rc;
}

#else /* !WEFT_REDUCE_KERNELS */

int weft_reduce_device_available(struct weft_core *core, int device, char *why, size_t whylen)
{
    (void)core;
    (void)device;
#ifdef WEFT_HAVE_CUDA_HEADERS
    snprintf(why, whylen, "no reduction kernels in this build (nvcc not found, or WEFT_CUDA_KERNELS=OFF)");
#else
    snprintf(why, whylen, "no reduction kernels in this build (built without the CUDA headers)");
#endif
    return 0;
}

int weft_reduce_device(struct weft_core *core, void *dst, const void *a, const void *b, size_t count, int dtype,
                       int op, const char *what)
{
    (void)dst; (void)a; (void)b; (void)count; (void)dtype; (void)op;
    return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "%s: no reduction kernels in this build", what);
}

int weft_reduce_device_div(struct weft_core *core, void *dst, const void *src, size_t count, int dtype, int n,
                           const char *what)
{
    size_t es = weft_dtype_size(dtype);
    /* As with kernels: dividing by 1 is a copy. */
    if (n <= 1 && es != 0)
        return dst == src || count == 0 ? WEFT_SUCCESS : weft_devcopy_sync(core, dst, src, count * es, what);
    return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "%s: no reduction kernels in this build", what);
}

#endif /* WEFT_REDUCE_KERNELS */

/* Scratch of device ops: on the device of weft's stream (the kernels'),
 * whatever the calling thread's current device is. */
void *weft_reduce_device_alloc(struct weft_core *core, size_t bytes)
{
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *c = cu();
    void *p = NULL;

    if (!core->cuda || c == NULL)
        return NULL;
    if (!weft_cuda_may_sync()) {
        /* cudaMalloc would wait for a stream that waits for this thread. */
        WEFT_WARN(core->rank, "cuda: %zu bytes of reduction scratch needed on one of weft's threads while a stream "
                  "waits on weft: not allocated here (it is prepared where a collective is called)", bytes);
        return NULL;
    }
    int entered = weft_devcopy_enter(core);
    cudaError_t e = c->Malloc(&p, bytes ? bytes : 1);
    weft_devcopy_leave(core, entered);
    if (e != cudaSuccess) {
        c->GetLastError();
        WEFT_WARN(core->rank, "cuda: cudaMalloc of %zu bytes of reduction scratch failed: %s", bytes,
                  c->GetErrorString(e));
        return NULL;
    }
    return p;
#else
    (void)core;
    (void)bytes;
    return NULL;
#endif
}

void weft_reduce_device_free(struct weft_core *core, void *p)
{
    (void)core;
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (p != NULL && cu() != NULL && cu()->Free(p) != cudaSuccess)
        cu()->GetLastError();
#else
    (void)p;
#endif
}
