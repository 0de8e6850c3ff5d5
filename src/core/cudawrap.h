/*
 * CUDA, loaded at run time.
 *
 * weft never links CUDA: one build runs on machines with and without GPUs.
 * weft_cuda_load() dlopens the runtime named by WEFT_CUDA_LIB (default
 * "libcudart.so"; tests point it at the emulated runtime tests/emu/cuda/,
 * the same file the test program links, so both see one instance and one
 * state) and resolves the runtime calls weft makes into one table. Driver
 * calls (stream memory operations, pointer attributes, address ranges, and
 * the module and launch calls of the reduction kernels) come through
 * cudaGetDriverEntryPointByVersion, so weft needs no libcuda symbol either.
 *
 * Memory kinds. weft_cuda_mem_attr() tells host, pinned host and device
 * memory apart with the driver's pointer attributes (no CUDA context is
 * created for it). When WEFT_CUDA_LIB does not load but the application has
 * a CUDA runtime of its own in the process, that runtime is used only to
 * recognise device pointers, so they are refused with WEFT_ERR_UNSUPPORTED
 * and a message instead of being read as host memory.
 *
 * Compiled only with the CUDA headers (WEFT_HAVE_CUDA_HEADERS); without them
 * every buffer is host memory.
 */
#ifndef WEFT_CUDAWRAP_H
#define WEFT_CUDAWRAP_H

#include <stddef.h>
#include <stdint.h>

enum weft_mem_kind {
    WEFT_MEM_HOST = 0,    /* pageable host memory (or unknown to CUDA) */
    WEFT_MEM_PINNED,      /* page-locked host memory (cudaMallocHost / cudaHostRegister) */
    WEFT_MEM_DEVICE,      /* device memory of one GPU */
    WEFT_MEM_MANAGED      /* unified (managed) memory */
};

struct weft_mem_attr {
    int       kind;       /* enum weft_mem_kind */
    int       device;     /* device ordinal (DEVICE, MANAGED), else -1 */
    uint64_t  buffer_id;  /* unique per allocation, changes when an address is reused; 0 for host */
    uintptr_t base;       /* allocation base (device memory), else 0 */
    size_t    size;       /* allocation size (device memory), else 0 */
};

/* The physical block a device allocation lives in. Drivers carve small
 * cudaMalloc allocations out of shared blocks (2 MiB), and CUDA IPC maps a
 * whole block (Programming Guide, "Interprocess Communication"): an
 * importer that maps a block once reaches every allocation in it. From
 * CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR / MAPPING_SIZE / MEMORY_BLOCK_ID;
 * id 0 when the driver does not say. */
struct weft_mem_block {
    uintptr_t base;
    size_t    size;
    uint64_t  id;
};

/* Loads the runtime once per process (later calls with any path return the
 * first result). WEFT_SUCCESS, or WEFT_ERR_UNSUPPORTED with why filled:
 * library missing, a symbol missing, no device (cudaGetDeviceCount). */
int  weft_cuda_load(const char *path, char *why, size_t whylen);
/* Nonzero once weft_cuda_load succeeded. */
int  weft_cuda_available(void);
/* Why CUDA is not available ("" when it is, or before any load). */
const char *weft_cuda_why(void);

/* Kind of the memory at ptr. Host memory when CUDA is not in the process at
 * all. Returns WEFT_SUCCESS; *out is always filled. */
int  weft_cuda_mem_attr(const void *ptr, struct weft_mem_attr *out);
/* The block of the device allocation at ptr (see struct weft_mem_block):
 * WEFT_SUCCESS with *out filled, or WEFT_ERR_UNSUPPORTED (id 0) when the
 * driver does not tell. */
int  weft_cuda_mem_block(const void *ptr, struct weft_mem_block *out);
/* Nonzero when a pointer can be device memory at all: weft's CUDA is loaded,
 * or the application has a CUDA runtime of its own in the process (looked
 * for once, like weft_cuda_mem_attr does). Callers on a hot path test this
 * once and skip classifying buffers in host-only processes. */
int  weft_cuda_present(void);
/* Stream-ordered operations of this process whose streams wait (on the
 * device) for a counter weft's stream engine has not written yet; the
 * engine counts them (src/stream/stream.c). While any exists, a CUDA call
 * that waits for the device (cudaFree, cudaFreeHost, closing an IPC
 * mapping) made by weft can wait for itself: the counter is written by
 * weft. Such calls are put off until this is 0 (cuda_ipc's stale mappings)
 * or until destroy (the collectives' buffers). */
void weft_cuda_stream_waits_add(long delta);
long weft_cuda_stream_waits(void);

/* weft's own threads (the stream engine's progress thread, message-pipe
 * threads) mark themselves: they write the counters streams wait on, so a
 * CUDA call of theirs that synchronises the device -- allocations, pinned
 * allocations, host registration, frees, IPC opens and closes, module
 * loads -- while any stream waits on weft waits for itself. The emulated
 * runtime is told too (weft_emu_cuda_thread_wakes_streams, looked up with
 * dlsym; absent from real CUDA), and then refuses such a call at once
 * instead of hanging. */
void weft_cuda_mark_weft_thread(void);
/* Nonzero when the calling thread may make such a call now: no stream
 * waits on weft, or it is an application thread outside weft's progress
 * (a collective's start, a stream-ordered call being queued): it then
 * waits for weft's progress thread, which lets the streams go. */
int  weft_cuda_may_sync(void);
/* The same for code that runs inside weft's progress -- the p2p lock held,
 * or moving data a stream-ordered operation waits for (transports, the
 * pipe's copies) -- on whatever thread: only when no stream waits on weft.
 * (An application thread that drives progress for the very operation a
 * stream waits on would otherwise wait for itself, and holds the lock
 * weft's progress thread needs.) */
int  weft_cuda_may_sync_in_progress(void);

#ifdef WEFT_HAVE_CUDA_HEADERS
#include <cuda.h>
#include <cuda_runtime_api.h>

struct weft_cuda {
    void *handle;
    char  path[256];
    /* runtime */
    cudaError_t (*GetDeviceCount)(int *count);
    cudaError_t (*GetDevice)(int *device);
    cudaError_t (*SetDevice)(int device);
    cudaError_t (*DeviceGetPCIBusId)(char *busid, int len, int device);
    cudaError_t (*DeviceCanAccessPeer)(int *can, int device, int peer);
    cudaError_t (*PointerGetAttributes)(struct cudaPointerAttributes *attr, const void *ptr);
    cudaError_t (*Malloc)(void **ptr, size_t size);
    cudaError_t (*Free)(void *ptr);
    cudaError_t (*MallocHost)(void **ptr, size_t size);
    cudaError_t (*FreeHost)(void *ptr);
    cudaError_t (*Memcpy)(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
    cudaError_t (*MemcpyAsync)(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s);
    cudaError_t (*MemcpyPeerAsync)(void *dst, int dst_device, const void *src, int src_device, size_t n,
                                   cudaStream_t s);
    cudaError_t (*MemsetAsync)(void *ptr, int value, size_t n, cudaStream_t s);
    cudaError_t (*StreamCreateWithFlags)(cudaStream_t *s, unsigned int flags);
    cudaError_t (*StreamDestroy)(cudaStream_t s);
    cudaError_t (*StreamSynchronize)(cudaStream_t s);
    cudaError_t (*StreamQuery)(cudaStream_t s);
    cudaError_t (*StreamWaitEvent)(cudaStream_t s, cudaEvent_t e, unsigned int flags);
    cudaError_t (*EventCreateWithFlags)(cudaEvent_t *e, unsigned int flags);
    cudaError_t (*EventRecord)(cudaEvent_t e, cudaStream_t s);
    cudaError_t (*EventQuery)(cudaEvent_t e);
    cudaError_t (*EventSynchronize)(cudaEvent_t e);
    cudaError_t (*EventDestroy)(cudaEvent_t e);
    cudaError_t (*IpcGetMemHandle)(cudaIpcMemHandle_t *h, void *ptr);
    cudaError_t (*IpcOpenMemHandle)(void **ptr, cudaIpcMemHandle_t h, unsigned int flags);
    cudaError_t (*IpcCloseMemHandle)(void *ptr);
    cudaError_t (*LaunchHostFunc)(cudaStream_t s, cudaHostFn_t fn, void *arg);
    const char *(*GetErrorString)(cudaError_t err);
    cudaError_t (*GetLastError)(void);
    cudaError_t (*GetDriverEntryPointByVersion)(const char *symbol, void **fn, unsigned int version,
                                                unsigned long long flags,
                                                enum cudaDriverEntryPointQueryResult *status);
    /* stream-ordered calls (src/stream/stream.c): completion counters in mapped pinned memory */
    cudaError_t (*HostAlloc)(void **ptr, size_t size, unsigned int flags);
    cudaError_t (*HostGetDevicePointer)(void **dptr, void *hptr, unsigned int flags);
    /* driver, through the entry-point query */
    CUresult (*cuStreamWaitValue32)(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
    CUresult (*cuStreamWriteValue32)(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
    CUresult (*cuPointerGetAttributes)(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr ptr);
    CUresult (*cuMemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
    /* optional (NULL when absent): dma-buf export for GPUDirect RDMA */
    CUresult (*cuMemGetHandleForAddressRange)(void *handle, CUdeviceptr ptr, size_t size,
                                              CUmemRangeHandleType type, unsigned long long flags);
    CUresult (*cuGetErrorString)(CUresult err, const char **str);
    /* optional (NULL when absent): the reduction kernels (collectives/
     * reduce_device.c): a module per context, launched on weft's stream in
     * the stream's context */
    CUresult (*cuModuleLoadData)(CUmodule *module, const void *image);
    CUresult (*cuModuleGetFunction)(CUfunction *fn, CUmodule module, const char *name);
    CUresult (*cuModuleUnload)(CUmodule module);
    CUresult (*cuLaunchKernel)(CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int shared_bytes, CUstream s,
                               void **params, void **extra);
    CUresult (*cuStreamGetCtx)(CUstream s, CUcontext *ctx);
    CUresult (*cuCtxPushCurrent)(CUcontext ctx);
    CUresult (*cuCtxPopCurrent)(CUcontext *ctx);
    CUresult (*cuCtxGetDevice)(CUdevice *device);
    /* the emulated runtime only (NULL with real CUDA): see weft_cuda_mark_weft_thread */
    void (*emu_thread_wakes_streams)(void);
    int   device_count;
};

/* The loaded table, or NULL. */
const struct weft_cuda *weft_cuda_get(void);

/* cuPointerGetAttributes in a context: a thread that has none (it never
 * made a runtime call, or only context-free ones) makes the primary context
 * of its current device current first (cudaSetDevice), because without one
 * the driver answers CUDA_ERROR_INVALID_CONTEXT and a device pointer would
 * be taken for host memory. Every pointer query of weft goes through it. */
CUresult weft_cuda_ptr_attrs(unsigned int n, CUpointer_attribute *attrs, void **data, const void *ptr);
/* The device of a stream (its context's device; the legacy and per-thread
 * streams: the current device's). WEFT_SUCCESS, or an error code. */
int  weft_cuda_stream_device(cudaStream_t s, int *device);
#endif /* WEFT_HAVE_CUDA_HEADERS */

#endif
