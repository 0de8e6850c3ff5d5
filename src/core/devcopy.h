/*
 * CUDA copy helpers of a comm: weft's own CUDA stream, synchronous copies
 * between any two buffers (host, pinned, device), a host bounce buffer for
 * eager device messages, and the memory kind of a user buffer. Every layer
 * may use them (the pipe's eager device path, the staged path's copies,
 * collectives' own-block copies, self's device rendezvous).
 */
#ifndef WEFT_DEVCOPY_H
#define WEFT_DEVCOPY_H

#include <stddef.h>
#include "core.h"

/* At comm create, after CUDA was loaded (core->cuda): weft's non-blocking
 * stream. Allocates the helper state in any case (core->devcopy). A CUDA
 * failure clears core->cuda (device buffers refused, one warning) instead
 * of failing create. fini waits for the stream, frees everything;
 * idempotent. */
int  weft_devcopy_init(struct weft_core *core);
void weft_devcopy_fini(struct weft_core *core);

/* Copies n bytes from src to dst (not overlapping). memcpy when neither side
 * is device memory; WEFT_ERR_UNSUPPORTED when one is but the comm has no
 * CUDA (never a host access to a device pointer); otherwise weft_devcopy_sync.
 * WEFT_SUCCESS, or the failure with the last error naming `what`. */
int  weft_devcopy(struct weft_core *core, void *dst, const void *src, size_t n, const char *what);

/* cudaMemcpyAsync (cudaMemcpyDefault) on weft's stream, waited for: the data
 * is in place on return. WEFT_ERR_TRANSPORT with the last error naming
 * `what` and the CUDA error; WEFT_ERR_UNSUPPORTED without CUDA. */
int  weft_devcopy_sync(struct weft_core *core, void *dst, const void *src, size_t n, const char *what);

/* A host bounce buffer of at least n bytes for eager device messages
 * (pinned when possible); valid until the next call. NULL: no memory.
 * Pinned memory is allocated (and an old one freed) only when no stream
 * waits on weft (weft_cuda_may_sync_in_progress: this runs inside weft's
 * progress); otherwise a buffer too small is replaced by pageable memory
 * for the call. */
void *weft_devcopy_bounce(struct weft_core *core, size_t n);
/* At weft_comm_create (weft_p2p_prepare_device): a pinned bounce of at
 * least n bytes, so progress never has to allocate one. */
void  weft_devcopy_prepare_bounce(struct weft_core *core, size_t n);

/* Device scratch for operands a kernel must see element-aligned (the
 * reduction kernels, collectives/reduce_device.c): WEFT_DEVCOPY_ALIGN_PIECES
 * pieces of WEFT_DEVCOPY_ALIGN_PIECE bytes on weft's stream's device, one
 * user at a time. prepare makes it (a cudaMalloc: on a thread that may
 * synchronise the device); get locks it and returns it, making it first
 * when that is allowed here, NULL when it is not there (put is then not
 * called); put unlocks. */
#define WEFT_DEVCOPY_ALIGN_PIECE  (256u << 10)
#define WEFT_DEVCOPY_ALIGN_PIECES 3
int   weft_devcopy_prepare_align(struct weft_core *core);
void *weft_devcopy_align_get(struct weft_core *core);
void  weft_devcopy_align_put(struct weft_core *core);

/* Makes the context of weft's stream current on this thread, so the
 * events and memory made until leave belong to the stream's device, whatever
 * device the thread works on. leave(core, what enter returned). */
int   weft_devcopy_enter(struct weft_core *core);
void  weft_devcopy_leave(struct weft_core *core, int entered);

/* Host memory of n bytes, pinned (cudaMallocHost) when the comm has CUDA
 * and it allows, else malloc; *pinned says which (for _free). NULL: none. */
void *weft_devcopy_host_alloc(struct weft_core *core, size_t n, int *pinned);
void  weft_devcopy_host_free(struct weft_core *core, void *p, int pinned);

/* weft's CUDA stream (a cudaStream_t), NULL without CUDA. */
void *weft_devcopy_stream(struct weft_core *core);

/* The memory kind (enum weft_mem_kind) and device of a user buffer, looked
 * up once per call. A zero-byte message moves no data: not looked at. In a
 * process without CUDA this returns at once. Device (or managed) memory on
 * a comm without CUDA is refused with WEFT_ERR_UNSUPPORTED naming fn, the
 * buffer, peer and tag, never read as host memory. */
int  weft_mem_classify_cuda(struct weft_core *core, const void *buf, size_t bytes, int peer, int tag,
                            const char *fn, int *kind, int *device);
/* Whether CUDA is in this process (weft's or the application's): -1 not
 * looked up yet, 0 no, 1 yes. Set once by weft_mem_classify_cuda. */
extern int weft_cuda_in_process_state;

/* Inline so that a host-only process pays two loads per call. */
static inline int weft_mem_classify(struct weft_core *core, const void *buf, size_t bytes, int peer, int tag,
                                    const char *fn, int *kind, int *device)
{
    *kind = 0;      /* WEFT_MEM_HOST */
    *device = -1;
    if (bytes == 0 || (!core->cuda && __atomic_load_n(&weft_cuda_in_process_state, __ATOMIC_RELAXED) == 0))
        return 0;   /* WEFT_SUCCESS */
    return weft_mem_classify_cuda(core, buf, bytes, peer, tag, fn, kind, device);
}

#endif
