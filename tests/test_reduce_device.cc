/*
 * collectives/reduce_device.c: the CUDA reduction kernels' loader, and the
 * kernels themselves on a real GPU.
 *
 *   ReduceDevice.NoCudaInComm            why, errors and no scratch without CUDA
 *   ReduceDevice.FatbinIsEmbedded        the embedded array is a fatbin: magic,
 *                                        sizes, SASS images and one PTX
 *   ReduceDevice.EmulatorRunsKernels     the emulated runtime loads weft's fatbin
 *                                        and runs its kernels by name: available,
 *                                        results right, scratch on the stream's
 *                                        device, context push/pop restore, the
 *                                        module loaded once
 *   ReduceDevice.NoImageForThisGpu       (WEFT_EMU_CUDA_MODULES=0: a GPU whose
 *                                        architecture has no image) not
 *                                        available, the why names the refusal,
 *                                        kept; launches fail cleanly
 *   ReduceDevice.KernelsOnEmulator       the GPU test below on the emulated
 *                                        runtime (fewer sizes): misaligned
 *                                        operands go through aligned scratch
 *                                        (the emulator refuses a misaligned
 *                                        launch, as a GPU faults), and the test
 *                                        waits for its pageable copies (which the
 *                                        emulator lands late)
 *   ReduceDeviceGpu.KernelsMatchReference  (WEFT_TEST_REDUCE_GPU=1, real GPU:
 *                                        scripts/validate-gpu) every type x op and
 *                                        the divisions against a reference and
 *                                        the host kernels, aligned, unaligned,
 *                                        in place, several sizes
 *
 * weft_cuda_load runs once per process, so the CUDA cases run in a fresh
 * process each (as tests/test_cudawrap.cc): the parent test re-executes this
 * binary with a filter for one ReduceDeviceChild.* case and
 * WEFT_REDUCE_DEVICE_CHILD=1 set, and checks its exit status.
 */
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "weft.h"
#ifdef WEFT_HAVE_CUDA_HEADERS
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif
extern "C" {
#include "core.h"
#include "log.h"
#include "cudawrap.h"
#include "devcopy.h"
#include "reduce_kernel.h"
}

#ifdef WEFT_HAVE_REDUCE_FATBIN
/* Written by cmake/bin2c.cmake into weft_collectives (hidden in libweft.so,
 * reachable here through the static library). */
extern "C" {
__attribute__((visibility("hidden"))) extern const unsigned char weft_reduce_fatbin[];
__attribute__((visibility("hidden"))) extern const size_t weft_reduce_fatbin_size;
__attribute__((visibility("hidden"))) extern const char weft_reduce_fatbin_desc[];
}
#endif

extern char **environ;

namespace {

int run_child(const char *name, const char *extra_env = nullptr, const char *extra_env2 = nullptr)
{
    std::string filter = std::string("--gtest_filter=ReduceDeviceChild.") + name;
    char exe[] = "/proc/self/exe";
    std::vector<char *> argv = { exe, const_cast<char *>(filter.c_str()), nullptr };
    std::vector<std::string> envs;
    for (char **e = environ; *e; e++)
        if (std::strncmp(*e, "WEFT_REDUCE_DEVICE_CHILD=", 25) != 0 && std::strncmp(*e, "GTEST_", 6) != 0)
            envs.emplace_back(*e);
    envs.emplace_back("WEFT_REDUCE_DEVICE_CHILD=1");
    if (extra_env)
        envs.emplace_back(extra_env);
    if (extra_env2)
        envs.emplace_back(extra_env2);
    std::vector<char *> envp;
    for (auto &s : envs)
        envp.push_back(const_cast<char *>(s.c_str()));
    envp.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, exe, nullptr, nullptr, argv.data(), envp.data()) != 0)
        return -1;
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

bool in_child() { return std::getenv("WEFT_REDUCE_DEVICE_CHILD") != nullptr; }

bool has(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

/* A core as a comm would have it, without a comm. */
struct TestCore {
    weft_core core;
    TestCore()
    {
        std::memset(&core, 0, sizeof core);
        weft_core_init(&core, 0, 1);
    }
    ~TestCore()
    {
        weft_devcopy_fini(&core);
        weft_core_fini(&core);
    }
};

#ifdef WEFT_HAVE_REDUCE_FATBIN
uint32_t le32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
uint64_t le64(const unsigned char *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }
#endif

} // namespace

#define CHILD_ONLY()                                                         \
    do {                                                                     \
        if (!in_child())                                                     \
            GTEST_SKIP() << "runs in a child process (ReduceDevice*.*)";     \
    } while (0)

TEST(ReduceDevice, NoCudaInComm)
{
    TestCore t;
    t.core.cuda = 0;
    char why[512] = "x";
    EXPECT_EQ(weft_reduce_device_available(&t.core, -1, why, sizeof why), 0);
#ifdef WEFT_HAVE_REDUCE_FATBIN
    EXPECT_TRUE(has(why, "CUDA is not available in this comm")) << why;
#else
    EXPECT_TRUE(has(why, "no reduction kernels in this build")) << why;
#endif
    int x[4] = { 1, 2, 3, 4 };
    EXPECT_EQ(weft_reduce_device(&t.core, x, x, x, 4, WEFT_INT32, WEFT_SUM, "reduce-test"), WEFT_ERR_UNSUPPORTED);
    EXPECT_TRUE(has(weft_error_line(&t.core), "reduce-test")) << weft_error_line(&t.core);
    EXPECT_EQ(weft_reduce_device_div(&t.core, x, x, 4, WEFT_INT32, 3, "div-test"), WEFT_ERR_UNSUPPORTED);
    EXPECT_TRUE(has(weft_error_line(&t.core), "div-test")) << weft_error_line(&t.core);
    EXPECT_EQ(x[0], 1) << "host memory must not be touched";
    EXPECT_EQ(weft_reduce_device_alloc(&t.core, 4096), nullptr);
    weft_reduce_device_free(&t.core, nullptr);
}

TEST(ReduceDevice, FatbinIsEmbedded)
{
#ifdef WEFT_HAVE_REDUCE_FATBIN
    const unsigned char *f = weft_reduce_fatbin;
    const size_t size = weft_reduce_fatbin_size;
    ASSERT_GT(size, 16u);
    EXPECT_EQ((uintptr_t)f % 16, 0u) << "the driver reads the header's 64-bit fields in place";
    /* Header: magic, version 1, header size 16, size of what follows. */
    EXPECT_EQ(le32(f), 0xBA55ED50u);
    EXPECT_EQ(f[4] | f[5] << 8, 1);
    const size_t hsize = f[6] | f[7] << 8;
    ASSERT_EQ(hsize, 16u);
    ASSERT_EQ(hsize + le64(f + 8), size);
    /* Entries: kind (1 PTX, 2 SASS), header size, payload size, arch. */
    int sass = 0, ptx = 0;
    unsigned newest_sass = 0, ptx_arch = 0;
    for (size_t off = hsize; off < size;) {
        ASSERT_LE(off + 32, size);
        unsigned kind = f[off] | f[off + 1] << 8;
        uint64_t ehsize = le32(f + off + 4), psize = le64(f + off + 8);
        unsigned arch = le32(f + off + 28);
        EXPECT_TRUE(kind == 1 || kind == 2) << "entry kind " << kind << " at " << off;
        EXPECT_GE(arch, 75u) << "CUDA 13 builds sm_75 and newer";
        if (kind == 2) {
            sass++;
            newest_sass = std::max(newest_sass, arch);
        } else {
            ptx++;
            ptx_arch = arch;
        }
        off += ehsize + psize;
        ASSERT_LE(off, size);
    }
    EXPECT_GE(sass, 1);
    EXPECT_EQ(ptx, 1) << "PTX of the newest architecture, for GPUs newer than the list";
    EXPECT_EQ(ptx_arch, newest_sass);
    std::string desc = weft_reduce_fatbin_desc;
    EXPECT_TRUE(has(desc, "sm_") && has(desc, "PTX")) << desc;
#else
    GTEST_SKIP() << "no reduction kernels in this build (nvcc not found, or WEFT_CUDA_KERNELS=OFF)";
#endif
}

TEST(ReduceDevice, EmulatorRunsKernels) { EXPECT_EQ(run_child("EmulatorRunsKernels"), 0); }
TEST(ReduceDevice, NoImageForThisGpu) { EXPECT_EQ(run_child("NoImageForThisGpu", "WEFT_EMU_CUDA_MODULES=0"), 0); }

TEST(ReduceDevice, KernelsOnEmulator)
{
#if defined(WEFT_EMU_CUDA_LIB_PATH)
    if (in_child())
        GTEST_SKIP() << "the parent runs it";
    /* Pageable copies land 0.1-0.3 ms late: the test must wait for them,
     * and thousands of copies stay quick. */
    std::string lib = std::string("WEFT_CUDA_LIB=") + WEFT_EMU_CUDA_LIB_PATH;
    EXPECT_EQ(run_child("GpuKernels", lib.c_str(), "WEFT_EMU_CUDA_H2D_LATE_US=100-300"), 0);
#else
    GTEST_SKIP() << "no emulated CUDA runtime in this build";
#endif
}

TEST(ReduceDeviceGpu, KernelsMatchReference)
{
    if (std::getenv("WEFT_TEST_REDUCE_GPU") == nullptr || in_child())
        GTEST_SKIP() << "needs a real GPU: WEFT_TEST_REDUCE_GPU=1 (scripts/validate-gpu sets it)";
    EXPECT_EQ(run_child("GpuKernels"), 0);
}

#if defined(WEFT_HAVE_CUDA_HEADERS) && defined(WEFT_EMU_CUDA_LIB_PATH)

TEST(ReduceDeviceChild, EmulatorRunsKernels)
{
    CHILD_ONLY();
    char why[512] = "";
    ASSERT_EQ(weft_cuda_load(WEFT_EMU_CUDA_LIB_PATH, why, sizeof why), WEFT_SUCCESS) << why;
    const weft_cuda *cu = weft_cuda_get();
    ASSERT_NE(cu, nullptr);
    ASSERT_GE(cu->device_count, 2);
    EXPECT_NE(cu->cuModuleLoadData, nullptr);
    EXPECT_NE(cu->cuLaunchKernel, nullptr);

    /* weft's stream on device 0; the test thread then works on device 1. */
    ASSERT_EQ(cu->SetDevice(0), cudaSuccess);
    TestCore t;
    t.core.cuda = 1;
    ASSERT_EQ(weft_devcopy_init(&t.core), WEFT_SUCCESS);
    ASSERT_NE(weft_devcopy_stream(&t.core), nullptr);
    ASSERT_EQ(cu->SetDevice(1), cudaSuccess);

#ifdef WEFT_HAVE_REDUCE_FATBIN
    unsigned long long (*counter)(const char *);
    *(void **)&counter = dlsym(cu->handle, "weft_emu_cuda_counter");
    ASSERT_NE(counter, nullptr);
    unsigned long long loads0 = counter("module_loads"), launches0 = counter("launches");
    char why1[512] = "";
    ASSERT_EQ(weft_reduce_device_available(&t.core, -1, why1, sizeof why1), 1) << why1;
    EXPECT_EQ(weft_reduce_device_available(&t.core, 0, why1, sizeof why1), 1) << why1;
    EXPECT_EQ(weft_reduce_device_available(&t.core, 1, why1, sizeof why1), 0) << "buffers of another device";
    EXPECT_TRUE(has(why1, "device 1")) << why1;
    EXPECT_EQ(counter("module_loads") - loads0, 1u) << "loaded once per context";
    int dev = -1;
    ASSERT_EQ(cu->GetDevice(&dev), cudaSuccess);
    EXPECT_EQ(dev, 1) << "the thread's current device is restored";

    /* Scratch: on the stream's device, whatever the thread's is. */
    void *p = weft_reduce_device_alloc(&t.core, 4000);
    void *q = weft_reduce_device_alloc(&t.core, 4000);
    ASSERT_TRUE(p && q);
    weft_mem_attr a;
    ASSERT_EQ(weft_cuda_mem_attr(p, &a), WEFT_SUCCESS);
    EXPECT_EQ(a.kind, WEFT_MEM_DEVICE);
    EXPECT_EQ(a.device, 0);

    /* A sum and an average, checked. */
    std::vector<int32_t> x(1000), y(1000), out(1000);
    for (int i = 0; i < 1000; i++) {
        x[i] = i * 7 - 100;
        y[i] = 3 * i;
    }
    ASSERT_EQ(cu->Memcpy(p, x.data(), 4000, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cu->Memcpy(q, y.data(), 4000, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cu->StreamSynchronize(nullptr), cudaSuccess);   /* pageable copies land late */
    EXPECT_EQ(weft_reduce_device(&t.core, p, p, q, 1000, WEFT_INT32, WEFT_SUM, "reduce-test"), WEFT_SUCCESS)
        << weft_error_line(&t.core);
    EXPECT_EQ(weft_reduce_device_div(&t.core, p, p, 1000, WEFT_INT32, 2, "div-test"), WEFT_SUCCESS)
        << weft_error_line(&t.core);
    ASSERT_EQ(cu->Memcpy(out.data(), p, 4000, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 1000; i++)
        ASSERT_EQ(out[i], (x[i] + y[i]) / 2) << i;
    EXPECT_EQ(counter("launches") - launches0, 2u);
    /* Host memory is refused before any launch. */
    EXPECT_EQ(weft_reduce_device(&t.core, p, x.data(), q, 1000, WEFT_INT32, WEFT_SUM, "reduce-test"),
              WEFT_ERR_UNSUPPORTED);
    EXPECT_TRUE(has(weft_error_line(&t.core), "not device memory")) << weft_error_line(&t.core);
    EXPECT_EQ(counter("launches") - launches0, 2u);
    weft_reduce_device_free(&t.core, p);
    weft_reduce_device_free(&t.core, q);
#else
    char why1[512] = "";
    EXPECT_EQ(weft_reduce_device_available(&t.core, -1, why1, sizeof why1), 0);
    EXPECT_TRUE(has(why1, "no reduction kernels in this build")) << why1;
#endif

    /* The emulated driver's contexts: push makes the stream's device
     * current, pop restores; an unbalanced pop is refused. */
    CUcontext ctx = nullptr, popped = nullptr;
    ASSERT_EQ(cu->cuStreamGetCtx((CUstream)weft_devcopy_stream(&t.core), &ctx), CUDA_SUCCESS);
    ASSERT_EQ(cu->cuCtxPushCurrent(ctx), CUDA_SUCCESS);
    CUdevice cd = -1;
    EXPECT_EQ(cu->cuCtxGetDevice(&cd), CUDA_SUCCESS);
    EXPECT_EQ(cd, 0);
    EXPECT_EQ(cu->cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    EXPECT_EQ(popped, ctx);
    EXPECT_EQ(cu->cuCtxGetDevice(&cd), CUDA_SUCCESS);
    EXPECT_EQ(cd, 1);
    EXPECT_EQ(cu->cuCtxPopCurrent(&popped), CUDA_ERROR_INVALID_CONTEXT);
    CUmodule m = nullptr;
    EXPECT_EQ(cu->cuModuleLoadData(&m, "not a fatbin at all"), CUDA_ERROR_NOT_SUPPORTED) << "only fatbins load";
    EXPECT_EQ(m, nullptr);
}

TEST(ReduceDeviceChild, NoImageForThisGpu)
{
    CHILD_ONLY();
    char why[512] = "";
    ASSERT_EQ(weft_cuda_load(WEFT_EMU_CUDA_LIB_PATH, why, sizeof why), WEFT_SUCCESS) << why;
    const weft_cuda *cu = weft_cuda_get();
    ASSERT_EQ(cu->SetDevice(0), cudaSuccess);
    TestCore t;
    t.core.cuda = 1;
    ASSERT_EQ(weft_devcopy_init(&t.core), WEFT_SUCCESS);
    char why1[512] = "", why2[512] = "";
    EXPECT_EQ(weft_reduce_device_available(&t.core, -1, why1, sizeof why1), 0);
    EXPECT_EQ(weft_reduce_device_available(&t.core, -1, why2, sizeof why2), 0);
    EXPECT_STREQ(why1, why2) << "the refusal is kept, not retried";
#ifdef WEFT_HAVE_REDUCE_FATBIN
    EXPECT_TRUE(has(why1, "cuModuleLoadData refused the reduction kernels on device 0")) << why1;
    EXPECT_TRUE(has(why1, "no kernel image is available")) << why1;
#else
    EXPECT_TRUE(has(why1, "no reduction kernels in this build")) << why1;
#endif
    void *p = weft_reduce_device_alloc(&t.core, 1000);
    ASSERT_NE(p, nullptr);
    /* Launches fail cleanly, naming the call. */
    EXPECT_EQ(weft_reduce_device(&t.core, p, p, p, 250, WEFT_FLOAT32, WEFT_SUM, "reduce-test"), WEFT_ERR_UNSUPPORTED);
    EXPECT_TRUE(has(weft_error_line(&t.core), "reduce-test")) << weft_error_line(&t.core);
    EXPECT_EQ(weft_reduce_device_div(&t.core, p, p, 250, WEFT_FLOAT32, 3, "div-test"), WEFT_ERR_UNSUPPORTED);
    EXPECT_TRUE(has(weft_error_line(&t.core), "div-test")) << weft_error_line(&t.core);
    /* Division by 1 is a copy (no kernel needed), as on the host. */
    EXPECT_EQ(weft_reduce_device_div(&t.core, p, p, 250, WEFT_INT32, 1, "div-test"), WEFT_SUCCESS)
        << weft_error_line(&t.core);
    weft_reduce_device_free(&t.core, p);
}

#else

TEST(ReduceDeviceChild, EmulatorRunsKernels)
{
    CHILD_ONLY();
    GTEST_SKIP() << "no emulated CUDA runtime in this build";
}

TEST(ReduceDeviceChild, NoImageForThisGpu)
{
    CHILD_ONLY();
    GTEST_SKIP() << "no emulated CUDA runtime in this build";
}

#endif

/* ---- the kernels on a real GPU ---- */

namespace {

/* Reference arithmetic, written from the contract in reduce_kernel.h. */
const int kTypes[] = { WEFT_INT8, WEFT_UINT8, WEFT_INT32, WEFT_UINT32, WEFT_INT64, WEFT_UINT64,
                       WEFT_FLOAT16, WEFT_BFLOAT16, WEFT_FLOAT32, WEFT_FLOAT64 };

template <typename T, typename U> T ref_int(int op, T a, T b)
{
    switch (op) {
    case WEFT_SUM: case WEFT_AVG: return (T)(U)((U)a + (U)b);
    case WEFT_PROD: return (T)(U)((U)a * (U)b);
    case WEFT_MIN: return a < b ? a : b;
    default: return a > b ? a : b;
    }
}

template <typename F> F ref_float(int op, F a, F b)
{
    switch (op) {
    case WEFT_SUM: case WEFT_AVG: return a + b;
    case WEFT_PROD: return a * b;
    case WEFT_MIN: return (a < b || a != a) ? a : b;
    default: return (a > b || a != a) ? a : b;
    }
}

float bf16_widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t bf16_narrow(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    uint32_t hi = u >> 16, lo = u & 0xffff;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1)))
        hi++;
    return (uint16_t)hi;
}

#ifdef __FLT16_MAX__
float f16_widen(uint16_t h)
{
    _Float16 x;
    std::memcpy(&x, &h, 2);
    return (float)x;
}

uint16_t f16_narrow(float f)
{
    _Float16 x = (_Float16)f;
    uint16_t h;
    std::memcpy(&h, &x, 2);
    return h;
}
#endif

bool nan16(int dtype, uint16_t h)
{
    return dtype == WEFT_FLOAT16 ? (h & 0x7fff) > 0x7c00 : (h & 0x7fff) > 0x7f80;
}

/* One element of dst = a op b (op < 0: a / n). */
void ref_elem(int dtype, int op, int n, const unsigned char *a, const unsigned char *b, unsigned char *d)
{
#define INT_CASE(W, T, U)                                                                        \
    case W: {                                                                                    \
        T x, y, r;                                                                               \
        std::memcpy(&x, a, sizeof x);                                                            \
        std::memcpy(&y, b, sizeof y);                                                            \
        r = op < 0 ? (T)(x / (T)n) : ref_int<T, U>(op, x, y);                                    \
        std::memcpy(d, &r, sizeof r);                                                            \
        return;                                                                                  \
    }
    switch (dtype) {
    INT_CASE(WEFT_INT8, int8_t, uint8_t)
    INT_CASE(WEFT_UINT8, uint8_t, uint8_t)
    INT_CASE(WEFT_INT32, int32_t, uint32_t)
    INT_CASE(WEFT_UINT32, uint32_t, uint32_t)
    INT_CASE(WEFT_INT64, int64_t, uint64_t)
    INT_CASE(WEFT_UINT64, uint64_t, uint64_t)
    case WEFT_FLOAT32: {
        float x, y, r;
        std::memcpy(&x, a, 4);
        std::memcpy(&y, b, 4);
        r = op < 0 ? x / (float)n : ref_float(op, x, y);
        std::memcpy(d, &r, 4);
        return;
    }
    case WEFT_FLOAT64: {
        double x, y, r;
        std::memcpy(&x, a, 8);
        std::memcpy(&y, b, 8);
        r = op < 0 ? x / (double)n : ref_float(op, x, y);
        std::memcpy(d, &r, 8);
        return;
    }
    default: {
        uint16_t x, y, r;
        std::memcpy(&x, a, 2);
        std::memcpy(&y, b, 2);
        bool half = dtype == WEFT_FLOAT16;
#ifdef __FLT16_MAX__
        auto widen = half ? f16_widen : bf16_widen;
        auto narrow = half ? f16_narrow : bf16_narrow;
#else
        auto widen = bf16_widen;
        auto narrow = bf16_narrow;
#endif
        if (op == WEFT_MIN || op == WEFT_MAX) {
            /* The chosen operand, a NaN quieted (what narrowing gives). */
            float fx = widen(x), fy = widen(y);
            bool keep_a = op == WEFT_MIN ? (fx < fy || fx != fx) : (fx > fy || fx != fx);
            r = keep_a ? x : y;
            if (nan16(dtype, r))
                r |= half ? 0x0200 : 0x0040;
        } else {
            r = narrow(op < 0 ? widen(x) / (float)n : ref_float(op, widen(x), widen(y)));
        }
        std::memcpy(d, &r, 2);
        return;
    }
    }
#undef INT_CASE
}

bool is_nan_elem(int dtype, const unsigned char *p)
{
    if (dtype == WEFT_FLOAT32) {
        float f;
        std::memcpy(&f, p, 4);
        return std::isnan(f);
    }
    if (dtype == WEFT_FLOAT64) {
        double f;
        std::memcpy(&f, p, 8);
        return std::isnan(f);
    }
    if (dtype == WEFT_FLOAT16 || dtype == WEFT_BFLOAT16) {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return nan16(dtype, h);
    }
    return false;
}

/* Element i of got matches want: bit for bit, except that a NaN of sum,
 * prod or div only has to be a NaN (GPU arithmetic returns the canonical
 * NaN, x86 an operand's payload). */
std::string mismatch(int dtype, int op, const std::vector<unsigned char> &got, const std::vector<unsigned char> &want,
                     size_t count)
{
    size_t es = weft_dtype_size(dtype);
    bool bits_only = op == WEFT_MIN || op == WEFT_MAX;
    for (size_t i = 0; i < count; i++) {
        const unsigned char *g = &got[i * es], *w = &want[i * es];
        if (std::memcmp(g, w, es) == 0)
            continue;
        if (!bits_only && is_nan_elem(dtype, w) && is_nan_elem(dtype, g))
            continue;
        char buf[200];
        uint64_t gv = 0, wv = 0;
        std::memcpy(&gv, g, es);
        std::memcpy(&wv, w, es);
        snprintf(buf, sizeof buf, "element %zu of %zu: got 0x%llx, want 0x%llx", i, count, (unsigned long long)gv,
                 (unsigned long long)wv);
        return buf;
    }
    return "";
}

/* Random bits with special values mixed in (floats: zeros of both signs,
 * infinities, NaNs quiet and signaling, subnormals, largest finite). */
void fill(int dtype, std::vector<unsigned char> &v, std::mt19937_64 &rng)
{
    for (auto &c : v)
        c = (unsigned char)rng();
    size_t es = weft_dtype_size(dtype), n = v.size() / es;
    std::vector<uint64_t> specials;
    switch (dtype) {
    case WEFT_FLOAT16: specials = { 0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe01, 0x0001, 0x83ff,
                                    0x7bff, 0xfbff, 0x3c00, 0x3c01 }; break;
    case WEFT_BFLOAT16: specials = { 0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffc1, 0x0001, 0x807f,
                                     0x7f7f, 0xff7f, 0x3f80, 0x3f81 }; break;
    case WEFT_FLOAT32: specials = { 0x0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001,
                                    0x00000001, 0x807fffff, 0x7f7fffff, 0x3f800000 }; break;
    case WEFT_FLOAT64: specials = { 0x0, 0x8000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
                                    0x7ff8000000000000ull, 0x7ff0000000000001ull, 0x1ull,
                                    0x7fefffffffffffffull, 0x3ff0000000000000ull }; break;
    default: specials = { 0, 1, ~0ull, 1ull << (es * 8 - 1), (1ull << (es * 8 - 1)) - 1 }; break;
    }
    for (size_t i = 0; i < n; i++)
        if (rng() % 8 == 0) {
            uint64_t s = specials[rng() % specials.size()];
            std::memcpy(&v[i * es], &s, es);
        }
}

} // namespace

/* The reference the GPU test trusts agrees with the host kernels (checked
 * here, where no GPU is needed, so a wrong reference does not first show
 * on a GPU). */
TEST(ReduceDevice, ReferenceAgreesWithHost)
{
    std::mt19937_64 rng(7);
#ifndef __FLT16_MAX__
    GTEST_SKIP() << "no _Float16 in this compiler";
#endif
    for (int dtype : kTypes) {
        size_t es = weft_dtype_size(dtype), count = 5000, bytes = count * es;
        std::vector<unsigned char> a(bytes), b(bytes), want(bytes), host(bytes);
        fill(dtype, a, rng);
        fill(dtype, b, rng);
        for (int op = WEFT_SUM; op <= WEFT_AVG; op++) {
            for (size_t i = 0; i < count; i++)
                ref_elem(dtype, op, 0, &a[i * es], &b[i * es], &want[i * es]);
            weft_reduce_host(host.data(), a.data(), b.data(), count, dtype, op);
            EXPECT_EQ(mismatch(dtype, op, host, want, count), "") << weft_dtype_name(dtype) << " " << weft_op_name(op);
        }
        for (int n : { 2, 3, 7 }) {
            for (size_t i = 0; i < count; i++)
                ref_elem(dtype, -1, n, &a[i * es], &a[i * es], &want[i * es]);
            weft_reduce_host_div(host.data(), a.data(), count, dtype, n);
            EXPECT_EQ(mismatch(dtype, WEFT_SUM, host, want, count), "") << weft_dtype_name(dtype) << " / " << n;
        }
    }
}

#if defined(WEFT_HAVE_CUDA_HEADERS)

TEST(ReduceDeviceChild, GpuKernels)
{
    CHILD_ONLY();
    const char *lib = std::getenv("WEFT_CUDA_LIB");
    char why[512] = "";
    ASSERT_EQ(weft_cuda_load(lib && *lib ? lib : "libcudart.so", why, sizeof why), WEFT_SUCCESS) << why;
    const weft_cuda *cu = weft_cuda_get();
    TestCore t;
    t.core.cuda = 1;
    ASSERT_EQ(weft_devcopy_init(&t.core), WEFT_SUCCESS);
    ASSERT_EQ(weft_reduce_device_available(&t.core, -1, why, sizeof why), 1) << why;
    /* The emulated runtime computes with the host's code: the large count
     * (grid striding on a GPU) adds only time there. */
    const bool emulated = lib && std::strstr(lib, "weft_emu_cuda") != nullptr;

    const size_t counts[] = { 1, 7, 33, 4099, emulated ? 70001u : (1u << 20) + 3 };
    const size_t max_bytes = ((1u << 20) + 3) * 8 + 64;
    unsigned char *dA = (unsigned char *)weft_reduce_device_alloc(&t.core, max_bytes);
    unsigned char *dB = (unsigned char *)weft_reduce_device_alloc(&t.core, max_bytes);
    unsigned char *dD = (unsigned char *)weft_reduce_device_alloc(&t.core, max_bytes);
    ASSERT_TRUE(dA && dB && dD);
    std::mt19937_64 rng(11);
    /* Placements, as byte offsets of (dst, a, b) from 256-byte aligned
     * allocations; es: one element. 1: one byte (the byte-wise path). */
    enum { ALIGNED, ELEM, MIXED, BYTE, INPLACE_A, INPLACE_B, NPLACE };
    const char *place_name[NPLACE] = { "aligned", "element offset", "mixed", "byte offset", "dst == a", "dst == b" };

#ifndef __FLT16_MAX__
    std::cerr << "no _Float16 in this compiler: float16 checked against the host kernels only\n";
#endif
    for (int dtype : kTypes) {
        size_t es = weft_dtype_size(dtype);
        for (size_t count : counts) {
            size_t bytes = count * es;
            std::vector<unsigned char> a(bytes), b(bytes), want(bytes), got(bytes), host(bytes);
            fill(dtype, a, rng);
            fill(dtype, b, rng);
            for (int op = WEFT_SUM; op <= WEFT_AVG; op++)
                for (int pl = 0; pl < NPLACE; pl++) {
                    if (pl == BYTE && es == 1)
                        continue;
                    size_t oa = 0, ob = 0, od = 0;
                    if (pl == ELEM)
                        oa = ob = od = es;
                    if (pl == MIXED)
                        ob = es;
                    if (pl == BYTE)
                        oa = ob = od = 1;
                    unsigned char *pa = dA + oa, *pb = dB + ob;
                    unsigned char *pd = pl == INPLACE_A ? pa : pl == INPLACE_B ? pb : dD + od;
                    ASSERT_EQ(cu->Memcpy(pa, a.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
                    ASSERT_EQ(cu->Memcpy(pb, b.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
                    /* From pageable memory a copy may land after cudaMemcpy
                     * returned, and the kernels run on weft's non-blocking
                     * stream, which does not wait for it: wait here. */
                    ASSERT_EQ(cu->StreamSynchronize(nullptr), cudaSuccess);
                    ASSERT_EQ(weft_reduce_device(&t.core, pd, pa, pb, count, dtype, op, "gpu-test"), WEFT_SUCCESS)
                        << weft_error_line(&t.core);
                    ASSERT_EQ(cu->Memcpy(got.data(), pd, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
                    std::string where = std::string(weft_dtype_name(dtype)) + " " + weft_op_name(op) + " x" +
                                        std::to_string(count) + " " + place_name[pl] + ": ";
#ifndef __FLT16_MAX__
                    if (dtype != WEFT_FLOAT16)
#endif
                    {
                        for (size_t i = 0; i < count; i++)
                            ref_elem(dtype, op, 0, &a[i * es], &b[i * es], &want[i * es]);
                        std::string m = mismatch(dtype, op, got, want, count);
                        ASSERT_EQ(m, "") << where << "device vs reference";
                    }
                    /* The host kernels give the same bits (the contract of
                     * reduce_kernel.h). */
                    weft_reduce_host(host.data(), a.data(), b.data(), count, dtype, op);
                    std::string m = mismatch(dtype, op, got, host, count);
                    ASSERT_EQ(m, "") << where << "device vs host kernels";
                }
            /* avg's division. */
            for (int n : { 2, 3, 7 })
                for (int pl : { (int)ALIGNED, (int)ELEM, (int)BYTE, (int)INPLACE_A }) {
                    if (pl == BYTE && es == 1)
                        continue;
                    size_t o = pl == ELEM ? es : pl == BYTE ? 1 : 0;
                    unsigned char *pa = dA + o, *pd = pl == INPLACE_A ? pa : dD + o;
                    ASSERT_EQ(cu->Memcpy(pa, a.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
                    ASSERT_EQ(cu->StreamSynchronize(nullptr), cudaSuccess);   /* the copy has landed */
                    ASSERT_EQ(weft_reduce_device_div(&t.core, pd, pa, count, dtype, n, "gpu-test"), WEFT_SUCCESS)
                        << weft_error_line(&t.core);
                    ASSERT_EQ(cu->Memcpy(got.data(), pd, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
                    std::string where = std::string(weft_dtype_name(dtype)) + " / " + std::to_string(n) + " x" +
                                        std::to_string(count) + " " + place_name[pl] + ": ";
#ifndef __FLT16_MAX__
                    if (dtype != WEFT_FLOAT16)
#endif
                    {
                        for (size_t i = 0; i < count; i++)
                            ref_elem(dtype, -1, n, &a[i * es], &a[i * es], &want[i * es]);
                        ASSERT_EQ(mismatch(dtype, WEFT_SUM, got, want, count), "") << where << "device vs reference";
                    }
                    weft_reduce_host_div(host.data(), a.data(), count, dtype, n);
                    ASSERT_EQ(mismatch(dtype, WEFT_SUM, got, host, count), "") << where << "device vs host kernels";
                }
        }
    }

    /* Buffers the kernels must not touch are refused before any launch:
     * host memory, and the context stays usable. */
    std::vector<float> h(64, 1.0f);
    EXPECT_EQ(weft_reduce_device(&t.core, dD, h.data(), dB, 64, WEFT_FLOAT32, WEFT_SUM, "gpu-test"),
              WEFT_ERR_UNSUPPORTED);
    EXPECT_TRUE(has(weft_error_line(&t.core), "not device memory")) << weft_error_line(&t.core);
    EXPECT_EQ(weft_reduce_device(&t.core, dD, dA, dB, 64, WEFT_FLOAT32, WEFT_SUM, "gpu-test"), WEFT_SUCCESS)
        << weft_error_line(&t.core);
    weft_reduce_device_free(&t.core, dA);
    weft_reduce_device_free(&t.core, dB);
    weft_reduce_device_free(&t.core, dD);
}

#else

TEST(ReduceDeviceChild, GpuKernels)
{
    CHILD_ONLY();
    GTEST_SKIP() << "built without the CUDA headers";
}

#endif
