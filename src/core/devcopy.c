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
            WEFT_WARN(core->rank, "cuda: staging set-up failed, device buffers will be refused: %s",
                      core->last_error);
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
        cu()->StreamDestroy((cudaStream_t)d->stream);
        cu()->GetLastError();
    } else
#endif
        free(d->bounce);
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

void *weft_devcopy_bounce(struct weft_core *core, size_t n)
{
    struct weft_devcopy *d = core->devcopy;
    if (d == NULL)
        return NULL;
    if (d->bounce_size >= n)
        return d->bounce;
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
