/*
 * CUDA loaded at run time: see cudawrap.h for why and what.
 */
#include "cudawrap.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "weft.h"

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int             load_done;        /* weft_cuda_load ran (result below is final) */
static int             load_ok;
static char            load_why[512];

#ifdef WEFT_HAVE_CUDA_HEADERS

/* CUDA 12.0 is the oldest runtime whose entry points weft asks for. */
#define WEFT_CUDA_ENTRY_VERSION 12000

static struct weft_cuda cuda;

/* Pointer classification when weft's own load failed but the application
 * has a CUDA runtime in the process (resolved once, may stay NULL). */
static cudaError_t (*app_pointer_attrs)(struct cudaPointerAttributes *, const void *);
static int app_probe_done;

const struct weft_cuda *weft_cuda_get(void)
{
    return __atomic_load_n(&load_ok, __ATOMIC_ACQUIRE) ? &cuda : NULL;
}

static int resolve(void *h, const char *name, void **fn, char *why, size_t whylen)
{
    *fn = dlsym(h, name);
    if (*fn == NULL) {
        snprintf(why, whylen, "symbol %s missing", name);
        return -1;
    }
    return 0;
}

static int entry(const char *name, void **fn, int optional, char *why, size_t whylen)
{
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cuda.GetDriverEntryPointByVersion(name, fn, WEFT_CUDA_ENTRY_VERSION, cudaEnableDefault, &st);
    if (e == cudaSuccess && st == cudaDriverEntryPointSuccess && *fn != NULL)
        return 0;
    *fn = NULL;
    if (optional)
        return 0;
    snprintf(why, whylen, "driver entry point %s not available (%s, status %d)", name,
             e == cudaSuccess ? "not found" : cuda.GetErrorString(e), (int)st);
    return -1;
}

static int load_locked(const char *path, char *why, size_t whylen)
{
    struct weft_cuda t;
    void *h;
    int n = 0;
    cudaError_t e;

    memset(&t, 0, sizeof(t));
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *d = dlerror();
        snprintf(why, whylen, "cannot load %s: %s", path, d ? d : "unknown error");
        return WEFT_ERR_UNSUPPORTED;
    }
#define R(field, name) \
    if (resolve(h, name, (void **)&t.field, why, whylen) != 0) goto fail
    R(GetDeviceCount, "cudaGetDeviceCount");
    R(GetDevice, "cudaGetDevice");
    R(SetDevice, "cudaSetDevice");
    R(DeviceGetPCIBusId, "cudaDeviceGetPCIBusId");
    R(DeviceCanAccessPeer, "cudaDeviceCanAccessPeer");
    R(PointerGetAttributes, "cudaPointerGetAttributes");
    R(Malloc, "cudaMalloc");
    R(Free, "cudaFree");
    R(MallocHost, "cudaMallocHost");
    R(FreeHost, "cudaFreeHost");
    R(Memcpy, "cudaMemcpy");
    R(MemcpyAsync, "cudaMemcpyAsync");
    R(MemcpyPeerAsync, "cudaMemcpyPeerAsync");
    R(MemsetAsync, "cudaMemsetAsync");
    R(StreamCreateWithFlags, "cudaStreamCreateWithFlags");
    R(StreamDestroy, "cudaStreamDestroy");
    R(StreamSynchronize, "cudaStreamSynchronize");
    R(StreamQuery, "cudaStreamQuery");
    R(StreamWaitEvent, "cudaStreamWaitEvent");
    R(EventCreateWithFlags, "cudaEventCreateWithFlags");
    R(EventRecord, "cudaEventRecord");
    R(EventQuery, "cudaEventQuery");
    R(EventSynchronize, "cudaEventSynchronize");
    R(EventDestroy, "cudaEventDestroy");
    R(IpcGetMemHandle, "cudaIpcGetMemHandle");
    R(IpcOpenMemHandle, "cudaIpcOpenMemHandle");
    R(IpcCloseMemHandle, "cudaIpcCloseMemHandle");
    R(LaunchHostFunc, "cudaLaunchHostFunc");
    R(GetErrorString, "cudaGetErrorString");
    R(GetLastError, "cudaGetLastError");
    R(GetDriverEntryPointByVersion, "cudaGetDriverEntryPointByVersion");
    R(HostAlloc, "cudaHostAlloc");
    R(HostGetDevicePointer, "cudaHostGetDevicePointer");
#undef R

    /* No device: nothing weft could do with CUDA (this is also what a
     * machine with the toolkit but no driver reports). */
    e = t.GetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        snprintf(why, whylen, "%s loaded but no usable device: %s", path,
                 e != cudaSuccess ? t.GetErrorString(e) : "cudaGetDeviceCount returned 0");
        t.GetLastError();   /* do not leave the sticky error to the application */
        goto fail;
    }
    t.device_count = n;
    cuda = t;   /* entry() reads the runtime calls from here */
#define E(field, name, optional) \
    if (entry(name, (void **)&cuda.field, optional, why, whylen) != 0) goto fail
    E(cuStreamWaitValue32, "cuStreamWaitValue32", 0);
    E(cuStreamWriteValue32, "cuStreamWriteValue32", 0);
    E(cuPointerGetAttributes, "cuPointerGetAttributes", 0);
    E(cuMemGetAddressRange, "cuMemGetAddressRange", 0);
    E(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", 1);
    E(cuGetErrorString, "cuGetErrorString", 0);
    /* Without these only the reduction kernels are missing: device
     * reductions then stage through host memory. */
    E(cuModuleLoadData, "cuModuleLoadData", 1);
    E(cuModuleGetFunction, "cuModuleGetFunction", 1);
    E(cuModuleUnload, "cuModuleUnload", 1);
    E(cuLaunchKernel, "cuLaunchKernel", 1);
    E(cuStreamGetCtx, "cuStreamGetCtx", 1);
    E(cuCtxPushCurrent, "cuCtxPushCurrent", 1);
    E(cuCtxPopCurrent, "cuCtxPopCurrent", 1);
    E(cuCtxGetDevice, "cuCtxGetDevice", 1);
#undef E
    /* Not a CUDA symbol: only the emulated runtime has it. */
    cuda.emu_thread_wakes_streams = (void (*)(void))dlsym(h, "weft_emu_cuda_thread_wakes_streams");
    cuda.handle = h;
    snprintf(cuda.path, sizeof(cuda.path), "%s", path);
    return WEFT_SUCCESS;

fail:
    memset(&cuda, 0, sizeof(cuda));
    dlclose(h);
    return WEFT_ERR_UNSUPPORTED;
}

/* A shared CUDA runtime the process already loaded (a framework's own, e.g.
 * PyTorch's libcudart.so.13 from its wheel, or the one a program linked):
 * weft must use that same instance. A second copy of the runtime, loaded
 * from another file, keeps its own table of streams and events, and then
 * refuses the application's streams ("invalid resource handle" from
 * cudaEventRecord on a real GPU). A program linked with the static runtime
 * (nvcc's default) has no loaded libcudart.so to share: weft then loads
 * its own, and its streams are not the program's (docs/troubleshooting.md). */
struct loaded_cudart { char path[4096]; };

static int find_loaded_cudart(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct loaded_cudart *out = arg;
    const char *name = info->dlpi_name, *base;
    (void)size;
    if (name == NULL || name[0] == '\0')
        return 0;
    base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libcudart.so", 12) != 0)
        return 0;
    snprintf(out->path, sizeof(out->path), "%s", name);
    return 1;
}

/* Which runtime to load when WEFT_CUDA_LIB names none: the one already in
 * the process, else the unversioned name (the toolkit's), else the
 * versioned names a runtime-only install has (CUDA 13, then 12). */
static int load_default_locked(char *why, size_t whylen)
{
    static const char *const names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12"};
    struct loaded_cudart found;
    char first[512] = "";
    int rc = WEFT_ERR_UNSUPPORTED;

    found.path[0] = '\0';
    dl_iterate_phdr(find_loaded_cudart, &found);
    if (found.path[0] != '\0' && load_locked(found.path, why, whylen) == WEFT_SUCCESS)
        return WEFT_SUCCESS;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && rc != WEFT_SUCCESS; i++) {
        rc = load_locked(names[i], why, whylen);
        if (i == 0 && rc != WEFT_SUCCESS)
            snprintf(first, sizeof(first), "%s", why);   /* the toolkit name's reason is the telling one */
    }
    /* A runtime that loaded but found no device says why itself; only a
     * missing library gets the list of names that were tried. */
    if (rc != WEFT_SUCCESS && first[0] != '\0')
        snprintf(why, whylen, "%s%s", first,
                 strncmp(first, "cannot load", 11) == 0 ? " (nor libcudart.so.13 / .so.12)" : "");
    return rc;
}

int weft_cuda_load(const char *path, char *why, size_t whylen)
{
    int rc;

    pthread_mutex_lock(&load_lock);
    if (!load_done) {
        /* "libcudart.so" is WEFT_CUDA_LIB's default: the generic request. */
        rc = path && *path && strcmp(path, "libcudart.so") != 0 ? load_locked(path, load_why, sizeof(load_why))
                                                                 : load_default_locked(load_why, sizeof(load_why));
        load_done = 1;
        if (rc == WEFT_SUCCESS) {
            load_why[0] = '\0';
            __atomic_store_n(&load_ok, 1, __ATOMIC_RELEASE);
        }
    }
    rc = load_ok ? WEFT_SUCCESS : WEFT_ERR_UNSUPPORTED;
    if (why && whylen)
        snprintf(why, whylen, "%s", load_why);
    pthread_mutex_unlock(&load_lock);
    return rc;
}

static void host_attr(struct weft_mem_attr *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = WEFT_MEM_HOST;
    out->device = -1;
}

/* Looks once for an application CUDA runtime in the process. */
static void app_probe(void)
{
    if (!__atomic_load_n(&app_probe_done, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&load_lock);
        if (!app_probe_done) {
            app_pointer_attrs = (cudaError_t (*)(struct cudaPointerAttributes *, const void *))dlsym(
                RTLD_DEFAULT, "cudaPointerGetAttributes");
            __atomic_store_n(&app_probe_done, 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&load_lock);
    }
}

int weft_cuda_present(void)
{
    if (weft_cuda_get() != NULL)
        return 1;
    app_probe();
    return app_pointer_attrs != NULL;
}

int weft_cuda_mem_attr(const void *ptr, struct weft_mem_attr *out)
{
    host_attr(out);
    if (ptr == NULL)
        return WEFT_SUCCESS;

    if (weft_cuda_get() != NULL) {
        CUpointer_attribute attrs[4] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                         CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_IS_MANAGED };
        unsigned int memtype = 0;
        int ordinal = -1;
        unsigned long long buffer_id = 0;
        unsigned int managed = 0;
        void *data[4] = { &memtype, &ordinal, &buffer_id, &managed };

        /* Unregistered host memory: an error or memory type 0 (in a
         * context: weft_cuda_ptr_attrs binds one first if need be). */
        if (weft_cuda_ptr_attrs(4, attrs, data, ptr) != CUDA_SUCCESS || memtype == 0)
            return WEFT_SUCCESS;
        if (memtype == CU_MEMORYTYPE_HOST && !managed) {
            out->kind = WEFT_MEM_PINNED;
            return WEFT_SUCCESS;
        }
        out->kind = managed ? WEFT_MEM_MANAGED : WEFT_MEM_DEVICE;
        out->device = ordinal;
        out->buffer_id = buffer_id;
        CUdeviceptr base = 0;
        size_t size = 0;
        if (cuda.cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)ptr) == CUDA_SUCCESS) {
            out->base = (uintptr_t)base;
            out->size = size;
        }
        return WEFT_SUCCESS;
    }

    /* weft has no CUDA, but the application may: recognise its device
     * pointers so the caller can refuse them instead of reading them. */
    app_probe();
    if (app_pointer_attrs) {
        struct cudaPointerAttributes a;
        memset(&a, 0, sizeof(a));
        if (app_pointer_attrs(&a, ptr) == cudaSuccess &&
            (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged)) {
            out->kind = a.type == cudaMemoryTypeManaged ? WEFT_MEM_MANAGED : WEFT_MEM_DEVICE;
            out->device = a.device;
        }
        /* A host pointer is cudaMemoryTypeUnregistered with cudaSuccess
         * (CUDA >= 11): no error state of the application is touched. */
    }
    return WEFT_SUCCESS;
}

/* Makes the primary context of the thread's current device current
 * (cudaSetDevice does since CUDA 12). */
static void bind_context(void)
{
    int dev = 0;
    if (cuda.GetDevice(&dev) != cudaSuccess)
        dev = 0;
    if (cuda.SetDevice(dev) != cudaSuccess)
        cuda.GetLastError();
}

CUresult weft_cuda_ptr_attrs(unsigned int n, CUpointer_attribute *attrs, void **data, const void *ptr)
{
    if (weft_cuda_get() == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = cuda.cuPointerGetAttributes(n, attrs, data, (CUdeviceptr)(uintptr_t)ptr);
    if (r == CUDA_ERROR_INVALID_CONTEXT) {
        bind_context();
        r = cuda.cuPointerGetAttributes(n, attrs, data, (CUdeviceptr)(uintptr_t)ptr);
    }
    return r;
}

int weft_cuda_mem_block(const void *ptr, struct weft_mem_block *out)
{
    CUpointer_attribute attrs[3] = { CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
                                     CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID };
    void *base = NULL;
    size_t size = 0;
    unsigned long long id = 0;
    void *data[3] = { &base, &size, &id };
    memset(out, 0, sizeof(*out));
    /* Asked apart from the other attributes: a driver that does not know
     * these fails the whole call. */
    if (weft_cuda_ptr_attrs(3, attrs, data, ptr) != CUDA_SUCCESS || base == NULL || size == 0 || id == 0 ||
        (uintptr_t)ptr < (uintptr_t)base || (uintptr_t)ptr - (uintptr_t)base >= size)
        return WEFT_ERR_UNSUPPORTED;
    out->base = (uintptr_t)base;
    out->size = size;
    out->id = id;
    return WEFT_SUCCESS;
}

int weft_cuda_stream_device(cudaStream_t s, int *device)
{
    const struct weft_cuda *c = weft_cuda_get();
    CUcontext ctx = NULL, popped;
    CUdevice d = -1;
    if (c == NULL)
        return WEFT_ERR_UNSUPPORTED;
    /* The special streams are the current context's. */
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread || c->cuStreamGetCtx == NULL ||
        c->cuCtxPushCurrent == NULL || c->cuCtxPopCurrent == NULL || c->cuCtxGetDevice == NULL)
        return c->GetDevice(device) == cudaSuccess ? WEFT_SUCCESS : WEFT_ERR_TRANSPORT;
    if (c->cuStreamGetCtx((CUstream)s, &ctx) != CUDA_SUCCESS || ctx == NULL)
        return WEFT_ERR_INVALID_ARG;
    if (c->cuCtxPushCurrent(ctx) != CUDA_SUCCESS)
        return WEFT_ERR_TRANSPORT;
    CUresult r = c->cuCtxGetDevice(&d);
    c->cuCtxPopCurrent(&popped);
    if (r != CUDA_SUCCESS)
        return WEFT_ERR_TRANSPORT;
    *device = (int)d;
    return WEFT_SUCCESS;
}

#else /* !WEFT_HAVE_CUDA_HEADERS */

int weft_cuda_load(const char *path, char *why, size_t whylen)
{
    (void)path;
    pthread_mutex_lock(&load_lock);
    load_done = 1;
    snprintf(load_why, sizeof(load_why), "weft was built without the CUDA headers (WEFT_WITH_CUDA)");
    if (why && whylen)
        snprintf(why, whylen, "%s", load_why);
    pthread_mutex_unlock(&load_lock);
    return WEFT_ERR_UNSUPPORTED;
}

int weft_cuda_present(void)
{
    return 0;
}

int weft_cuda_mem_attr(const void *ptr, struct weft_mem_attr *out)
{
    (void)ptr;
    memset(out, 0, sizeof(*out));
    out->kind = WEFT_MEM_HOST;
    out->device = -1;
    return WEFT_SUCCESS;
}

#endif /* WEFT_HAVE_CUDA_HEADERS */

int weft_cuda_available(void)
{
    return __atomic_load_n(&load_ok, __ATOMIC_ACQUIRE);
}

const char *weft_cuda_why(void)
{
    return load_why;
}

static long g_stream_waits;
static _Thread_local int t_weft_thread;

void weft_cuda_mark_weft_thread(void)
{
    t_weft_thread = 1;
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *c = weft_cuda_get();
    if (c && c->emu_thread_wakes_streams)
        c->emu_thread_wakes_streams();
#endif
}

int weft_cuda_may_sync(void)
{
    return !t_weft_thread || weft_cuda_stream_waits() == 0;
}

int weft_cuda_may_sync_in_progress(void)
{
    return weft_cuda_stream_waits() == 0;
}

void weft_cuda_stream_waits_add(long delta)
{
    __atomic_add_fetch(&g_stream_waits, delta, __ATOMIC_ACQ_REL);
}

long weft_cuda_stream_waits(void)
{
    return __atomic_load_n(&g_stream_waits, __ATOMIC_ACQUIRE);
}
