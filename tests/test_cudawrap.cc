/*
 * src/core/cudawrap.c against the emulated CUDA runtime (tests/emu/cuda): the
 * load (good path, bad path and why), memory kinds (host, pinned, device),
 * allocation base/size and buffer ids (a new id when an address is reused),
 * and device pointers of an application runtime when weft's own load
 * failed.
 *
 * weft_cuda_load runs once per process, so every case runs in a fresh
 * process: the parent test re-executes this binary (/proc/self/exe) with a
 * filter for one CudaWrapChild.* case and WEFT_CUDAWRAP_CHILD=1 set (the
 * child cases skip themselves otherwise), and checks its exit status.
 */
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"
#ifdef WEFT_HAVE_CUDA_HEADERS
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif
extern "C" {
#include "cudawrap.h"
}

extern char **environ;

namespace {

/* Runs one CudaWrapChild case in a new process; its exit status. */
int run_child(const char *name)
{
    std::string filter = std::string("--gtest_filter=CudaWrapChild.") + name;
    char exe[] = "/proc/self/exe";
    std::vector<char *> argv = { exe, const_cast<char *>(filter.c_str()), nullptr };
    std::vector<std::string> envs;
    for (char **e = environ; *e; e++)
        if (std::strncmp(*e, "WEFT_CUDAWRAP_CHILD=", 20) != 0 && std::strncmp(*e, "GTEST_", 6) != 0)
            envs.emplace_back(*e);
    envs.emplace_back("WEFT_CUDAWRAP_CHILD=1");
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

bool in_child() { return std::getenv("WEFT_CUDAWRAP_CHILD") != nullptr; }

} // namespace

#define CHILD_ONLY()                                                   \
    do {                                                               \
        if (!in_child())                                               \
            GTEST_SKIP() << "runs in a child process (CudaWrap.*)";    \
    } while (0)

TEST(CudaWrap, KindsAndBufferIds) { EXPECT_EQ(run_child("KindsAndBufferIds"), 0); }
TEST(CudaWrap, BadPathIsUnsupportedWithWhy) { EXPECT_EQ(run_child("BadPathIsUnsupportedWithWhy"), 0); }
TEST(CudaWrap, ApplicationRuntimeAfterFailedLoad) { EXPECT_EQ(run_child("ApplicationRuntimeAfterFailedLoad"), 0); }
TEST(CudaWrap, FreshThreadClassifiesDevicePointer)
{
    EXPECT_EQ(run_child("FreshThreadClassifiesDevicePointer"), 0);
}
TEST(CudaWrap, SmallAllocationsReportTheirBlock) { EXPECT_EQ(run_child("SmallAllocationsReportTheirBlock"), 0); }

TEST(CudaWrapChild, BadPathIsUnsupportedWithWhy)
{
    CHILD_ONLY();
    char why[512] = "";
    EXPECT_EQ(weft_cuda_available(), 0);
    EXPECT_EQ(weft_cuda_load("/nonexistent/libcudart.so", why, sizeof why), WEFT_ERR_UNSUPPORTED);
    EXPECT_EQ(weft_cuda_available(), 0);
#ifdef WEFT_HAVE_CUDA_HEADERS
    EXPECT_NE(std::string(why).find("/nonexistent/libcudart.so"), std::string::npos) << why;
    EXPECT_NE(std::string(why).find("cannot load"), std::string::npos) << why;
#else
    EXPECT_NE(std::string(why).find("without"), std::string::npos) << why;
#endif
    EXPECT_STREQ(weft_cuda_why(), why);
    /* Loaded once per process: a later call with a good path changes nothing. */
#ifdef WEFT_EMU_CUDA_LIB_PATH
    EXPECT_EQ(weft_cuda_load(WEFT_EMU_CUDA_LIB_PATH, why, sizeof why), WEFT_ERR_UNSUPPORTED);
#endif
    /* Without CUDA (and no application runtime) everything is host memory. */
    int x = 0;
    weft_mem_attr a;
    EXPECT_EQ(weft_cuda_mem_attr(&x, &a), WEFT_SUCCESS);
    EXPECT_EQ(a.kind, WEFT_MEM_HOST);
    EXPECT_EQ(a.device, -1);
}

#if defined(WEFT_HAVE_CUDA_HEADERS) && defined(WEFT_EMU_CUDA_LIB_PATH)

TEST(CudaWrapChild, KindsAndBufferIds)
{
    CHILD_ONLY();
    char why[512] = "";
    ASSERT_EQ(weft_cuda_load(WEFT_EMU_CUDA_LIB_PATH, why, sizeof why), WEFT_SUCCESS) << why;
    EXPECT_EQ(weft_cuda_available(), 1);
    EXPECT_STREQ(weft_cuda_why(), "");
    const weft_cuda *cu = weft_cuda_get();
    ASSERT_NE(cu, nullptr);
    ASSERT_GE(cu->device_count, 2) << "the emulator has 2 devices by default";

    weft_mem_attr a;
    /* Host: heap, stack, NULL. */
    std::vector<char> heap(100);
    int stack = 0;
    for (const void *p : { (const void *)heap.data(), (const void *)&stack, (const void *)nullptr }) {
        ASSERT_EQ(weft_cuda_mem_attr(p, &a), WEFT_SUCCESS);
        EXPECT_EQ(a.kind, WEFT_MEM_HOST) << p;
        EXPECT_EQ(a.device, -1);
        EXPECT_EQ(a.buffer_id, 0u);
    }
    /* Pinned host memory. */
    void *pinned = nullptr;
    ASSERT_EQ(cu->MallocHost(&pinned, 4096), cudaSuccess);
    ASSERT_EQ(weft_cuda_mem_attr(pinned, &a), WEFT_SUCCESS);
    EXPECT_EQ(a.kind, WEFT_MEM_PINNED);
    EXPECT_EQ(a.device, -1);
    EXPECT_EQ(cu->FreeHost(pinned), cudaSuccess);

    /* Device memory on device 1: ordinal, base and size (also for an
     * interior pointer), a buffer id. */
    const size_t n = 3 * 4096 + 100;
    ASSERT_EQ(cu->SetDevice(1), cudaSuccess);
    void *d = nullptr;
    ASSERT_EQ(cu->Malloc(&d, n), cudaSuccess);
    ASSERT_EQ(weft_cuda_mem_attr(static_cast<char *>(d) + 777, &a), WEFT_SUCCESS);
    EXPECT_EQ(a.kind, WEFT_MEM_DEVICE);
    EXPECT_EQ(a.device, 1);
    EXPECT_EQ(a.base, (uintptr_t)d);
    EXPECT_EQ(a.size, n);
    EXPECT_NE(a.buffer_id, 0u);
    const uint64_t id1 = a.buffer_id;

    /* Freed and allocated again at the same size: the emulator (like real
     * GPUs, often) hands out the same address, with a new buffer id. */
    ASSERT_EQ(cu->Free(d), cudaSuccess);
    void *d2 = nullptr;
    ASSERT_EQ(cu->Malloc(&d2, n), cudaSuccess);
    EXPECT_EQ(d2, d) << "the emulator reuses the most recently freed address";
    ASSERT_EQ(weft_cuda_mem_attr(d2, &a), WEFT_SUCCESS);
    EXPECT_EQ(a.kind, WEFT_MEM_DEVICE);
    EXPECT_NE(a.buffer_id, id1) << "a reused address must get a new buffer id";
    EXPECT_NE(a.buffer_id, 0u);
    EXPECT_EQ(cu->Free(d2), cudaSuccess);

    /* Device 0. */
    ASSERT_EQ(cu->SetDevice(0), cudaSuccess);
    ASSERT_EQ(cu->Malloc(&d, 64), cudaSuccess);
    ASSERT_EQ(weft_cuda_mem_attr(d, &a), WEFT_SUCCESS);
    EXPECT_EQ(a.kind, WEFT_MEM_DEVICE);
    EXPECT_EQ(a.device, 0);
    EXPECT_EQ(cu->Free(d), cudaSuccess);
}

/* A thread that never made a CUDA call has no current context, and the
 * driver's pointer queries fail there (CUDA_ERROR_INVALID_CONTEXT); weft
 * must still see device memory as device memory, not as host memory it
 * would memcpy (review D1: SIGSEGV on a GPU). */
TEST(CudaWrapChild, FreshThreadClassifiesDevicePointer)
{
    CHILD_ONLY();
    char why[512] = "";
    ASSERT_EQ(weft_cuda_load(WEFT_EMU_CUDA_LIB_PATH, why, sizeof why), WEFT_SUCCESS) << why;
    const weft_cuda *cu = weft_cuda_get();
    ASSERT_EQ(cu->SetDevice(1), cudaSuccess);
    void *d = nullptr;
    ASSERT_EQ(cu->Malloc(&d, 5000), cudaSuccess);
    weft_mem_attr a;
    weft_mem_block b;
    int rc_attr = -1, rc_block = -1;
    CUresult raw = CUDA_SUCCESS;
    std::thread t([&] {
        /* What the driver says to this thread before weft asks. */
        unsigned int mt = 0;
        CUpointer_attribute at = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
        void *data[] = { &mt };
        CUresult (*get)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr) = nullptr;
        void *h = dlopen(WEFT_EMU_CUDA_LIB_PATH, RTLD_NOW | RTLD_NOLOAD);
        if (h) get = reinterpret_cast<decltype(get)>(dlsym(h, "cuPointerGetAttributes"));
        if (get) raw = get(1, &at, data, (CUdeviceptr)d);
        rc_attr = weft_cuda_mem_attr(static_cast<char *>(d) + 100, &a);
        rc_block = weft_cuda_mem_block(d, &b);
    });
    t.join();
    EXPECT_EQ(raw, CUDA_ERROR_INVALID_CONTEXT) << "the emulator no longer models a thread without a context";
    ASSERT_EQ(rc_attr, WEFT_SUCCESS);
    EXPECT_EQ(a.kind, WEFT_MEM_DEVICE);
    EXPECT_EQ(a.device, 1);
    EXPECT_EQ(a.base, (uintptr_t)d);
    EXPECT_EQ(a.size, 5000u);
    EXPECT_EQ(rc_block, WEFT_SUCCESS);
    EXPECT_NE(b.id, 0u);
    EXPECT_EQ(cu->Free(d), cudaSuccess);
}

/* Small allocations share a block (the unit CUDA IPC maps); weft's IPC
 * cache keys imports by it. */
TEST(CudaWrapChild, SmallAllocationsReportTheirBlock)
{
    CHILD_ONLY();
    char why[512] = "";
    ASSERT_EQ(weft_cuda_load(WEFT_EMU_CUDA_LIB_PATH, why, sizeof why), WEFT_SUCCESS) << why;
    const weft_cuda *cu = weft_cuda_get();
    void *x = nullptr, *y = nullptr, *big = nullptr;
    ASSERT_EQ(cu->Malloc(&x, 64), cudaSuccess);
    ASSERT_EQ(cu->Malloc(&y, 64), cudaSuccess);
    ASSERT_EQ(cu->Malloc(&big, 5 << 20), cudaSuccess);
    weft_mem_block bx, by, bbig;
    ASSERT_EQ(weft_cuda_mem_block(x, &bx), WEFT_SUCCESS);
    ASSERT_EQ(weft_cuda_mem_block(static_cast<char *>(y) + 10, &by), WEFT_SUCCESS);
    ASSERT_EQ(weft_cuda_mem_block(big, &bbig), WEFT_SUCCESS);
    EXPECT_EQ(bx.id, by.id);
    EXPECT_EQ(bx.base, by.base);
    EXPECT_LE(bx.base, (uintptr_t)x);
    EXPECT_LE((uintptr_t)y + 64, bx.base + bx.size);
    EXPECT_NE(bbig.id, bx.id);
    EXPECT_EQ(bbig.base, (uintptr_t)big);
    EXPECT_GE(bbig.size, (size_t)5 << 20);
    int host = 0;
    EXPECT_NE(weft_cuda_mem_block(&host, &bx), WEFT_SUCCESS);
    for (void *p : { x, y, big }) EXPECT_EQ(cu->Free(p), cudaSuccess);
}

/* weft's load failed, but the application has a CUDA runtime in the
 * process: its device pointers are still recognised (so weft can refuse
 * them instead of reading them as host memory). */
TEST(CudaWrapChild, ApplicationRuntimeAfterFailedLoad)
{
    CHILD_ONLY();
    char why[512] = "";
    ASSERT_EQ(weft_cuda_load("/nonexistent/libcudart.so", why, sizeof why), WEFT_ERR_UNSUPPORTED);
    void *h = dlopen(WEFT_EMU_CUDA_LIB_PATH, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(h, nullptr) << dlerror();
    auto app_malloc = reinterpret_cast<cudaError_t (*)(void **, size_t)>(dlsym(h, "cudaMalloc"));
    auto app_free = reinterpret_cast<cudaError_t (*)(void *)>(dlsym(h, "cudaFree"));
    ASSERT_NE(app_malloc, nullptr);
    ASSERT_NE(app_free, nullptr);
    void *d = nullptr;
    ASSERT_EQ(app_malloc(&d, 1000), cudaSuccess);
    weft_mem_attr a;
    ASSERT_EQ(weft_cuda_mem_attr(d, &a), WEFT_SUCCESS);
    EXPECT_EQ(a.kind, WEFT_MEM_DEVICE);
    EXPECT_EQ(a.device, 0);
    int x = 0;
    ASSERT_EQ(weft_cuda_mem_attr(&x, &a), WEFT_SUCCESS);
    EXPECT_EQ(a.kind, WEFT_MEM_HOST);
    EXPECT_EQ(app_free(d), cudaSuccess);
    EXPECT_EQ(weft_cuda_available(), 0);
}

#else

TEST(CudaWrapChild, KindsAndBufferIds) { CHILD_ONLY(); GTEST_SKIP() << "no emulated CUDA runtime in this build"; }
TEST(CudaWrapChild, FreshThreadClassifiesDevicePointer)
{
    CHILD_ONLY();
    GTEST_SKIP() << "no emulated CUDA runtime in this build";
}
TEST(CudaWrapChild, SmallAllocationsReportTheirBlock)
{
    CHILD_ONLY();
    GTEST_SKIP() << "no emulated CUDA runtime in this build";
}
TEST(CudaWrapChild, ApplicationRuntimeAfterFailedLoad)
{
    CHILD_ONLY();
    GTEST_SKIP() << "no emulated CUDA runtime in this build";
}

#endif
