/*
 * weft-perf buffers in host or CUDA device memory (-d host | -d cuda).
 *
 * The benchmark is a C program built without CUDA: with -d cuda it loads the
 * CUDA runtime at run time, from WEFT_CUDA_LIB when that is set (the file
 * weft itself loads, so both share one runtime -- e.g. the emulated one of
 * tests/emu/cuda), else libcudart.so (then .so.13/.so.12/.so.11.0). Device
 * buffers come from cudaMalloc; the benchmark never touches them from the
 * host: fills and checks go through a host scratch buffer and cudaMemcpy.
 *
 * The MPI column: Open MPI on the machines this was written on is not
 * CUDA-aware, so by default MPI gets host buffers and the device data is
 * staged (cudaMemcpy D2H before a send, H2D after a receive) inside the timed
 * region -- what an application without a CUDA-aware MPI has to do. When the
 * MPI library says it is CUDA-aware (MPIX_Query_cuda_support() from Open
 * MPI's mpi-ext.h), it gets the device buffers directly. The header says
 * which.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "perf.h"

#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

enum { H2D = 1, D2H = 2 };   /* cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost */

typedef int (*cuda_malloc_fn)(void **, size_t);
typedef int (*cuda_free_fn)(void *);
typedef int (*cuda_memcpy_fn)(void *, const void *, size_t, int);
typedef int (*cuda_memset_fn)(void *, int, size_t);
typedef int (*cuda_int_ptr_fn)(int *);
typedef int (*cuda_int_fn)(int);
typedef int (*cuda_void_fn)(void);
typedef const char *(*cuda_errstr_fn)(int);
typedef int (*cuda_busid_fn)(char *, int, int);

static struct {
    void           *lib;
    char            path[512];
    int             emulated;       /* the runtime exports weft_emu_cuda_counter */
    int             device, count;
    char            busid[32];
    cuda_malloc_fn  malloc_;
    cuda_free_fn    free_;
    cuda_memcpy_fn  memcpy_;
    cuda_memset_fn  memset_;
    cuda_int_ptr_fn get_count;
    cuda_int_fn     set_device;
    cuda_void_fn    sync;
    cuda_errstr_fn  errstr;
    cuda_busid_fn   busid_of;
    unsigned char  *scratch;        /* host side of fills and checks */
    size_t          scratch_bytes;
} cu;

static const char *cu_err(int e)
{
    const char *s = cu.errstr ? cu.errstr(e) : NULL;
    return s ? s : "unknown CUDA error";
}

static void cu_fail(const struct perf_opts *o, const char *call, int e)
{
    fprintf(stderr, "weft-perf rank %d: %s failed: %s (%d)\n", o->rank, call, cu_err(e), e);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int perf_mem_parse(const char *arg, int *device)
{
    if (strcmp(arg, "host") == 0)
        *device = 0;
    else if (strcmp(arg, "cuda") == 0)
        *device = 1;
    else
        return -1;
    return 0;
}

static int mpi_cuda_aware(void)
{
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support() == 1;
#else
    return 0;
#endif
}

int perf_mem_init(struct perf_opts *o)
{
    o->mpi_direct = 1;
    if (!o->device)
        return 0;
    const char *env = getenv("WEFT_CUDA_LIB");
    const char *names[] = { env && *env ? env : "libcudart.so", "libcudart.so.13", "libcudart.so.12",
                            "libcudart.so.11.0" };
    char why[600] = "";
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !cu.lib; i++) {
        if (i > 0 && env && *env)
            break;                  /* WEFT_CUDA_LIB names the one file to use */
        cu.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (cu.lib)
            snprintf(cu.path, sizeof cu.path, "%s", names[i]);
        else if (!why[0])
            snprintf(why, sizeof why, "%s", dlerror());
    }
    int ok = cu.lib != NULL;
    if (ok) {
        cu.malloc_ = (cuda_malloc_fn)dlsym(cu.lib, "cudaMalloc");
        cu.free_ = (cuda_free_fn)dlsym(cu.lib, "cudaFree");
        cu.memcpy_ = (cuda_memcpy_fn)dlsym(cu.lib, "cudaMemcpy");
        cu.memset_ = (cuda_memset_fn)dlsym(cu.lib, "cudaMemset");
        cu.get_count = (cuda_int_ptr_fn)dlsym(cu.lib, "cudaGetDeviceCount");
        cu.set_device = (cuda_int_fn)dlsym(cu.lib, "cudaSetDevice");
        cu.sync = (cuda_void_fn)dlsym(cu.lib, "cudaDeviceSynchronize");
        cu.errstr = (cuda_errstr_fn)dlsym(cu.lib, "cudaGetErrorString");
        cu.busid_of = (cuda_busid_fn)dlsym(cu.lib, "cudaDeviceGetPCIBusId");
        cu.emulated = dlsym(cu.lib, "weft_emu_cuda_counter") != NULL;
        ok = cu.malloc_ && cu.free_ && cu.memcpy_ && cu.memset_ && cu.get_count && cu.set_device && cu.sync;
        if (!ok)
            snprintf(why, sizeof why, "%.300s lacks a CUDA runtime call the benchmark needs", cu.path);
    }
    int e = 0;
    if (ok && ((e = cu.get_count(&cu.count)) != 0 || cu.count < 1)) {
        snprintf(why, sizeof why, "cudaGetDeviceCount: %s", e ? cu_err(e) : "no device");
        ok = 0;
    }
    /* Every rank must agree before any of them goes on. */
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok)
        fprintf(stderr, "weft-perf rank %d: -d cuda: no CUDA runtime/device (%s%s): %s\n", o->rank,
                env && *env ? "WEFT_CUDA_LIB=" : "tried ", env && *env ? env : "libcudart.so[.13|.12|.11.0]", why);
    if (!all_ok)
        return 1;
    /* One device per node-local rank, round robin. */
    MPI_Comm local;
    int local_rank = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_free(&local);
    cu.device = local_rank % cu.count;
    if ((e = cu.set_device(cu.device)) != 0)
        cu_fail(o, "cudaSetDevice", e);
    snprintf(cu.busid, sizeof cu.busid, "?");
    if (cu.busid_of)
        cu.busid_of(cu.busid, (int)sizeof cu.busid, cu.device);
    o->mpi_direct = mpi_cuda_aware();
    return 0;
}

void perf_mem_describe(const struct perf_opts *o)
{
    if (!o->device) {
        printf("# memory: host (-d host)\n");
        return;
    }
    printf("# memory: CUDA device (-d cuda): cudaMalloc, rank 0 on device %d of %d (bus %s), runtime %s\n",
           cu.device, cu.count, cu.busid, cu.path);
    if (o->mpi_direct)
        printf("# MPI column: device buffers passed to MPI directly (the MPI library reports CUDA-aware support)\n");
    else
        printf("# MPI column: device data staged through host buffers (cudaMemcpy D2H + MPI + cudaMemcpy H2D,\n"
               "#   timed): this MPI library is not CUDA-aware\n");
    if (cu.emulated)
        printf("# NOTE: the CUDA runtime is the EMULATED one (libweft_emu_cuda.so, tests/emu/cuda): device memory\n"
               "#   is host memory behind an emulated API and copies are memmove on a worker thread, so these\n"
               "#   numbers measure weft's device code paths on the CPU and say NOTHING about GPUs.\n");
}

static unsigned char *scratch(const struct perf_opts *o, size_t bytes)
{
    if (bytes > cu.scratch_bytes) {
        free(cu.scratch);
        cu.scratch = malloc(bytes ? bytes : 1);
        cu.scratch_bytes = cu.scratch ? bytes : 0;
        if (!cu.scratch) {
            fprintf(stderr, "weft-perf rank %d: no memory for a %zu-byte host scratch buffer\n", o->rank, bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    return cu.scratch;
}

void *perf_buf_alloc(const struct perf_opts *o, size_t bytes)
{
    if (!o->device)
        return perf_alloc(bytes);
    void *p = NULL;
    int e = cu.malloc_(&p, bytes ? bytes : 1);
    if (e != 0) {
        fprintf(stderr, "weft-perf rank %d: cudaMalloc(%zu): %s\n", o->rank, bytes, cu_err(e));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    perf_buf_set(o, p, 0xA5, bytes ? bytes : 1);
    return p;
}

void perf_buf_free(const struct perf_opts *o, void *p)
{
    if (!o->device) {
        perf_free(p);
        return;
    }
    if (p) {
        int e = cu.free_(p);
        if (e != 0)
            cu_fail(o, "cudaFree", e);
    }
}

void perf_buf_set(const struct perf_opts *o, void *buf, int byte, size_t bytes)
{
    if (!o->device) {
        memset(buf, byte, bytes);
        return;
    }
    int e = cu.memset_(buf, byte, bytes);
    if (e == 0)
        e = cu.sync();   /* cudaMemset may return before it is done */
    if (e != 0)
        cu_fail(o, "cudaMemset", e);
}

void perf_buf_to_host(const struct perf_opts *o, void *host, const void *buf, size_t bytes)
{
    if (!o->device) {
        memcpy(host, buf, bytes);
        return;
    }
    int e = bytes ? cu.memcpy_(host, buf, bytes, D2H) : 0;
    if (e != 0)
        cu_fail(o, "cudaMemcpy (device to host)", e);
}

void perf_buf_from_host(const struct perf_opts *o, void *buf, const void *host, size_t bytes)
{
    if (!o->device) {
        memcpy(buf, host, bytes);
        return;
    }
    int e = bytes ? cu.memcpy_(buf, host, bytes, H2D) : 0;
    /* From pageable memory the copy may return before its DMA is done, and
     * weft's streams need not be ordered after the legacy default stream. */
    if (e == 0 && bytes)
        e = cu.sync();
    if (e != 0)
        cu_fail(o, "cudaMemcpy (host to device)", e);
}

void perf_buf_fill(const struct perf_opts *o, void *buf, size_t bytes, uint64_t seed)
{
    if (!o->device) {
        perf_fill(buf, bytes, seed);
        return;
    }
    unsigned char *s = scratch(o, bytes);
    perf_fill(s, bytes, seed);
    perf_buf_from_host(o, buf, s, bytes);
}

size_t perf_buf_verify(const struct perf_opts *o, const void *buf, size_t bytes, uint64_t seed)
{
    if (!o->device)
        return perf_verify(buf, bytes, seed);
    unsigned char *s = scratch(o, bytes);
    perf_buf_to_host(o, s, buf, bytes);
    return perf_verify(s, bytes, seed);
}

void perf_mem_fini(const struct perf_opts *o)
{
    (void)o;
    free(cu.scratch);
    cu.scratch = NULL;
    cu.scratch_bytes = 0;
    /* The runtime stays loaded: weft may still hold its own handle to it. */
}
