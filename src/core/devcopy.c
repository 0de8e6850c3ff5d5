/*
 * CUDA copy helpers (see devcopy.h).
 */
#include "devcopy.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "cudawrap.h"
#include "log.h"
#include "weft.h"

struct weft_devcopy {
    void   *stream;        /* cudaStream_t; NULL without CUDA */
    void   *bounce;
    size_t  bounce_size;
    int     bounce_pinned;
    void   *bounce_pageable; /* what a thread that may not pin uses when bounce is too small */
    size_t  bounce_pageable_size;
    pthread_mutex_t align_lock;
    void   *align;         /* device scratch (weft_devcopy_align_get) */
};

#ifdef WEFT_HAVE_CUDA_HEADERS
static const struct weft_cuda *cu(void) { return weft_cuda_get(); }
#endif

int weft_devcopy_init(struct weft_core *core)
{
    struct weft_devcopy *d = core->devcopy;
    if (d == NULL) {
        d = calloc(1, sizeof(*d));
        if (d == NULL)
            return weft_set_error(core, WEFT_ERR_NO_MEMORY, "cuda: no memory for the copy helpers");
        pthread_mutex_init(&d->align_lock, NULL);
        core->devcopy = d;
    }
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (core->cuda && d->stream == NULL) {
        cudaStream_t s = NULL;
        cudaError_t e = cu()->StreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            cu()->GetLastError();
            weft_set_error(core, WEFT_ERR_UNSUPPORTED, "cuda: cudaStreamCreateWithFlags failed: %s",
                           cu()->GetErrorString(e));
            struct weft_error err;
            char line[1024];
            weft_error_get(core, &err);
            weft_error_format(&err, 1, line, sizeof(line));
            WEFT_WARN(core->rank, "cuda: staging set-up failed, device buffers will be refused: %s", line);
            core->cuda = 0;
        } else {
            d->stream = s;
        }
    }
#endif
    return WEFT_SUCCESS;
}

void weft_devcopy_fini(struct weft_core *core)
{
    struct weft_devcopy *d = core->devcopy;
    if (d == NULL)
        return;
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (d->stream) {
        cu()->StreamSynchronize((cudaStream_t)d->stream);
        if (d->bounce && d->bounce_pinned)
            cu()->FreeHost(d->bounce);
        else
            free(d->bounce);
        if (d->align)
            cu()->Free(d->align);
        cu()->StreamDestroy((cudaStream_t)d->stream);
        cu()->GetLastError();
    } else
#endif
        free(d->bounce);
    free(d->bounce_pageable);
    pthread_mutex_destroy(&d->align_lock);
    free(d);
    core->devcopy = NULL;
}

void *weft_devcopy_host_alloc(struct weft_core *core, size_t n, int *pinned)
{
    *pinned = 0;
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (core->cuda && cu() != NULL) {
        void *p = NULL;
        if (cu()->MallocHost(&p, n) == cudaSuccess && p != NULL) {
            *pinned = 1;
            return p;
        }
        cu()->GetLastError();
    }
#else
    (void)core;
#endif
    return malloc(n ? n : 1);
}

void weft_devcopy_host_free(struct weft_core *core, void *p, int pinned)
{
    (void)core;
    if (p == NULL)
        return;
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (pinned && cu() != NULL) {
        cu()->FreeHost(p);
        return;
    }
#else
    (void)pinned;
#endif
    free(p);
}

void *weft_devcopy_stream(struct weft_core *core)
{
    return core->devcopy ? core->devcopy->stream : NULL;
}

int weft_devcopy_sync(struct weft_core *core, void *dst, const void *src, size_t n, const char *what)
{
    if (n == 0)
        return WEFT_SUCCESS;
#ifdef WEFT_HAVE_CUDA_HEADERS
    struct weft_devcopy *d = core->devcopy;
    if (d != NULL && d->stream != NULL) {
        cudaStream_t s = (cudaStream_t)d->stream;
        cudaError_t e = cu()->MemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
        if (e == cudaSuccess)
            e = cu()->StreamSynchronize(s);
        if (e != cudaSuccess) {
            /* Cleared so it does not surface in the application's next CUDA call. */
            cu()->GetLastError();
            return weft_set_error(core, WEFT_ERR_TRANSPORT, "%s: copy of %zu bytes %p -> %p failed: %s", what, n,
                                  src, dst, cu()->GetErrorString(e));
        }
        return WEFT_SUCCESS;
    }
#else
    (void)dst;
    (void)src;
#endif
    return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "%s: %zu bytes of device memory but CUDA is not available "
                          "in this comm", what, n);
}

/* Grows the pinned bounce to at least n bytes (freeing the old one):
 * allocations that synchronise the device, on a thread that may. */
static void *bounce_grow(struct weft_devcopy *d, size_t n)
{
    size_t want = n < (64u << 10) ? (64u << 10) : n;
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (d->bounce && d->bounce_pinned)
        cu()->FreeHost(d->bounce);
    else
        free(d->bounce);
    d->bounce = NULL;
    d->bounce_size = 0;
    if (d->stream) {
        void *b = NULL;
        if (cu()->MallocHost(&b, want) == cudaSuccess) {
            d->bounce = b;
            d->bounce_size = want;
            d->bounce_pinned = 1;
            return b;
        }
        cu()->GetLastError();
    }
#else
    free(d->bounce);
#endif
    d->bounce = malloc(want);
    d->bounce_pinned = 0;
    d->bounce_size = d->bounce ? want : 0;
    return d->bounce;
}

void *weft_devcopy_bounce(struct weft_core *core, size_t n)
{
    struct weft_devcopy *d = core->devcopy;
    if (d == NULL)
        return NULL;
    if (d->bounce_size >= n)
        return d->bounce;
    if (weft_cuda_may_sync_in_progress())
        return bounce_grow(d, n);
    /* A stream waits on weft (and this runs inside weft's progress): no
     * cudaMallocHost or cudaFreeHost now (each would wait for that stream,
     * which waits for weft's progress). Pageable memory for this message;
     * the copies are synchronous either way. */
    if (d->bounce_pageable_size < n) {
        void *p = realloc(d->bounce_pageable, n);
        if (p == NULL)
            return NULL;
        d->bounce_pageable = p;
        d->bounce_pageable_size = n;
    }
    return d->bounce_pageable;
}

void weft_devcopy_prepare_bounce(struct weft_core *core, size_t n)
{
    struct weft_devcopy *d = core->devcopy;
    if (d != NULL && d->bounce_size < n && weft_cuda_may_sync())
        (void)bounce_grow(d, n);
}

int weft_devcopy_enter(struct weft_core *core)
{
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *c = cu();
    CUcontext ctx = NULL;
    CUstream s = (CUstream)weft_devcopy_stream(core);
    if (s && c && c->cuStreamGetCtx && c->cuCtxPushCurrent && c->cuCtxPopCurrent &&
        c->cuStreamGetCtx(s, &ctx) == CUDA_SUCCESS && ctx && c->cuCtxPushCurrent(ctx) == CUDA_SUCCESS)
        return 1;
#else
    (void)core;
#endif
    return 0;
}

void weft_devcopy_leave(struct weft_core *core, int entered)
{
    (void)core;
#ifdef WEFT_HAVE_CUDA_HEADERS
    CUcontext popped;
    if (entered)
        cu()->cuCtxPopCurrent(&popped);
#else
    (void)entered;
#endif
}

/* d->align_lock held. */
static int align_make(struct weft_core *core, struct weft_devcopy *d)
{
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (d->align != NULL)
        return WEFT_SUCCESS;
    if (!core->cuda || d->stream == NULL)
        return WEFT_ERR_UNSUPPORTED;
    int entered = weft_devcopy_enter(core);
    cudaError_t e = cu()->Malloc(&d->align, (size_t)WEFT_DEVCOPY_ALIGN_PIECES * WEFT_DEVCOPY_ALIGN_PIECE);
    weft_devcopy_leave(core, entered);
    if (e != cudaSuccess) {
        cu()->GetLastError();
        d->align = NULL;
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "cuda: cudaMalloc of %u bytes of alignment scratch "
                              "failed: %s", WEFT_DEVCOPY_ALIGN_PIECES * WEFT_DEVCOPY_ALIGN_PIECE,
                              cu()->GetErrorString(e));
    }
    return WEFT_SUCCESS;
#else
    (void)core;
    (void)d;
    return WEFT_ERR_UNSUPPORTED;
#endif
}

int weft_devcopy_prepare_align(struct weft_core *core)
{
    struct weft_devcopy *d = core->devcopy;
    int rc;
    if (d == NULL)
        return WEFT_ERR_UNSUPPORTED;
    pthread_mutex_lock(&d->align_lock);
    rc = d->align != NULL ? WEFT_SUCCESS : weft_cuda_may_sync() ? align_make(core, d) : WEFT_ERR_UNSUPPORTED;
    pthread_mutex_unlock(&d->align_lock);
    return rc;
}

void *weft_devcopy_align_get(struct weft_core *core)
{
    struct weft_devcopy *d = core->devcopy;
    if (d == NULL)
        return NULL;
    pthread_mutex_lock(&d->align_lock);
    if (d->align == NULL && weft_cuda_may_sync_in_progress())
        (void)align_make(core, d);
    if (d->align == NULL) {
        pthread_mutex_unlock(&d->align_lock);
        return NULL;
    }
    return d->align;
}

void weft_devcopy_align_put(struct weft_core *core)
{
    pthread_mutex_unlock(&core->devcopy->align_lock);
}

int weft_devcopy(struct weft_core *core, void *dst, const void *src, size_t n, const char *what)
{
    if (n == 0 || dst == src)
        return WEFT_SUCCESS;
    struct weft_mem_attr a, b;
    if (!core->cuda && !weft_cuda_present()) {
        memcpy(dst, src, n);   /* no CUDA in the process: host memory */
        return WEFT_SUCCESS;
    }
    weft_cuda_mem_attr(dst, &a);
    weft_cuda_mem_attr(src, &b);
    if (a.kind >= WEFT_MEM_DEVICE || b.kind >= WEFT_MEM_DEVICE) {
        if (!core->cuda) {
            const char *why = weft_cuda_why();
            return weft_set_error(core, WEFT_ERR_UNSUPPORTED,
                                  "%s: %zu bytes %p -> %p involve CUDA device memory, but weft cannot use CUDA in "
                                  "this process: %s", what, n, src, dst,
                                  why && *why ? why : "CUDA was not set up for this comm");
        }
        return weft_devcopy_sync(core, dst, src, n, what);
    }
    memcpy(dst, src, n);
    return WEFT_SUCCESS;
}

/* ------------------------------------------------------------ mem kinds */

static const char *mem_kind_name(int kind)
{
    switch (kind) {
    case WEFT_MEM_PINNED:  return "pinned host";
    case WEFT_MEM_DEVICE:  return "device";
    case WEFT_MEM_MANAGED: return "managed";
    default:               return "host";
    }
}

int weft_cuda_in_process_state = -1;

/* Is there any CUDA in this process (weft's or the application's)? Looked
 * up once: a host-only process then pays one load per call. A comm with
 * CUDA knows it already (core->cuda). */
static int cuda_in_process(void)
{
    int s = __atomic_load_n(&weft_cuda_in_process_state, __ATOMIC_RELAXED);
    if (s < 0) {
        s = weft_cuda_present() ? 1 : 0;
        __atomic_store_n(&weft_cuda_in_process_state, s, __ATOMIC_RELAXED);
    }
    return s;
}

/* The buffer may be device memory: ask CUDA. */
__attribute__((noinline)) static int classify_cuda(struct weft_core *core, const void *buf, size_t bytes, int peer,
                                                   int tag, const char *fn, int *kind, int *device)
{
    struct weft_mem_attr a;

    weft_cuda_mem_attr(buf, &a);
    if (a.kind >= WEFT_MEM_DEVICE && !core->cuda) {
        const char *why = weft_cuda_why();
        return weft_set_error(core, WEFT_ERR_UNSUPPORTED,
                              "%s: buf %p (%zu bytes, peer %d, tag %d) is CUDA %s memory of device %d, but weft "
                              "cannot use CUDA in this process: %s",
                              fn, buf, bytes, peer, tag, mem_kind_name(a.kind), a.device,
                              why && *why ? why : "CUDA was not set up for this comm (WEFT_CUDA_LIB, WEFT_DEBUG=info)");
    }
    *kind = a.kind;
    *device = a.device;
    return WEFT_SUCCESS;
}

int weft_mem_classify_cuda(struct weft_core *core, const void *buf, size_t bytes, int peer, int tag,
                           const char *fn, int *kind, int *device)
{
    *kind = WEFT_MEM_HOST;
    *device = -1;
    if (bytes == 0 || (!core->cuda && !cuda_in_process()))
        return WEFT_SUCCESS;
    return classify_cuda(core, buf, bytes, peer, tag, fn, kind, device);
}
