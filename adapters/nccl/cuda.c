/*
 * The CUDA runtime calls the NCCL face makes itself: the current device,
 * ncclMemAlloc/Free, the copies and host functions of a pre-multiply.
 * Loaded at run time the way weft loads it (src/core/cudawrap.c): the
 * runtime named by WEFT_CUDA_LIB, else the one already in the process (a
 * framework's), else libcudart.so / .so.13 / .so.12. The same file gives
 * the same instance, so the adapter, weft and the application share one
 * runtime and its streams. No runtime: the calls that need it fail with
 * ncclUnhandledCudaError saying why; the library still loads.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_adapter.h"

static struct nccl_cuda g_cuda;
static int g_ok;
static char g_why[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int find_loaded(struct dl_phdr_info *info, size_t size, void *arg)
{
    char *out = arg;
    const char *name = info->dlpi_name, *base;
    (void)size;
    if (name == NULL || name[0] == '\0')
        return 0;
    base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libcudart.so", 12) != 0)
        return 0;
    snprintf(out, 4096, "%s", name);
    return 1;
}

static int load(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    const char *missing = NULL;
    int count = 0;
    if (h == NULL) {
        snprintf(g_why, sizeof(g_why), "cannot load the CUDA runtime %s: %s", path, dlerror());
        return 0;
    }
#define SYM(field, name)                                                    \
    do {                                                                    \
        *(void **)(&g_cuda.field) = dlsym(h, name);                         \
        if (g_cuda.field == NULL && missing == NULL)                        \
            missing = name;                                                 \
    } while (0)
    SYM(GetDevice, "cudaGetDevice");
    SYM(SetDevice, "cudaSetDevice");
    SYM(GetDeviceCount, "cudaGetDeviceCount");
    SYM(Malloc, "cudaMalloc");
    SYM(Free, "cudaFree");
    SYM(MallocHost, "cudaMallocHost");
    SYM(FreeHost, "cudaFreeHost");
    SYM(MemcpyAsync, "cudaMemcpyAsync");
    SYM(LaunchHostFunc, "cudaLaunchHostFunc");
    SYM(StreamSynchronize, "cudaStreamSynchronize");
    SYM(GetErrorString, "cudaGetErrorString");
#undef SYM
    *(void **)(&g_cuda.StreamIsCapturing) = dlsym(h, "cudaStreamIsCapturing");
    if (missing != NULL) {
        snprintf(g_why, sizeof(g_why), "the CUDA runtime %s has no %s", path, missing);
        memset(&g_cuda, 0, sizeof(g_cuda));
        dlclose(h);
        return 0;
    }
    if (g_cuda.GetDeviceCount(&count) != cudaSuccess || count < 1) {
        snprintf(g_why, sizeof(g_why), "the CUDA runtime %s finds no device", path);
        memset(&g_cuda, 0, sizeof(g_cuda));
        dlclose(h);
        return 0;
    }
    return 1;   /* the handle stays open for the life of the process */
}

static void load_once(void)
{
    static const char *const names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12"};
    const char *path = getenv("WEFT_CUDA_LIB");
    static char found[4096];
    if (path != NULL && *path != '\0' && strcmp(path, "libcudart.so") != 0) {
        g_ok = load(path);
        return;
    }
    found[0] = '\0';
    dl_iterate_phdr(find_loaded, found);
    if (found[0] != '\0' && (g_ok = load(found)))
        return;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !g_ok; i++)
        g_ok = load(names[i]);
}

const struct nccl_cuda *nccl_cuda(const char **why)
{
    pthread_once(&g_once, load_once);
    if (!g_ok) {
        if (why)
            *why = g_why;
        return NULL;
    }
    return &g_cuda;
}

ncclResult_t nccl_cuda_fail(const struct ncclComm *c, const char *fn, const char *call, cudaError_t e)
{
    return nccl_fail(c, ncclUnhandledCudaError, fn, "%s failed: %s (cudaError %d)", call,
                     g_cuda.GetErrorString ? g_cuda.GetErrorString(e) : "?", (int)e);
}

ncclResult_t nccl_dev_enter(const struct ncclComm *c, struct nccl_devguard *g, const char *fn)
{
    const char *why = NULL;
    const struct nccl_cuda *cu = nccl_cuda(&why);
    cudaError_t e;
    g->switched = 0;
    g->prev = -1;
    if (cu == NULL || c->device < 0)
        return ncclSuccess;   /* weft's own call then says what is missing */
    if ((e = cu->GetDevice(&g->prev)) != cudaSuccess)
        return nccl_cuda_fail(c, fn, "cudaGetDevice", e);
    if (g->prev != c->device) {
        if ((e = cu->SetDevice(c->device)) != cudaSuccess)
            return nccl_cuda_fail(c, fn, "cudaSetDevice", e);
        g->switched = 1;
    }
    return ncclSuccess;
}

void nccl_dev_leave(const struct nccl_devguard *g)
{
    if (g->switched)
        g_cuda.SetDevice(g->prev);
}
