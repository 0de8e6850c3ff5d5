// Tests of the emulated CUDA runtime (libweft_emu_cuda.so), written as a
// program against cuda_runtime_api.h / cuda.h and linked directly with the
// emulator. Knobs read from the environment are tested in child processes
// (this binary re-executed with --emu-child ROLE), and so is IPC.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include "weft_emu_cuda.h"

#define CK(x) ASSERT_EQ(cudaSuccess, (x)) << #x << ": " << cudaGetErrorName(x)
#define DK(x) ASSERT_EQ(CUDA_SUCCESS, (x)) << #x

namespace {

double now_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

bool write_all(int fd, const void *p, size_t n)
{
    const char *c = static_cast<const char *>(p);
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

bool read_all(int fd, void *p, size_t n)
{
    char *c = static_cast<char *>(p);
    while (n > 0) {
        ssize_t r = read(fd, c, n);
        if (r <= 0) return false;
        c += r;
        n -= (size_t)r;
    }
    return true;
}

// This binary, re-executed with --emu-child ROLE and extra environment; its
// stdin and stdout are pipes to the parent.
struct Child {
    pid_t pid = -1;
    int to = -1, from = -1;

    Child(const char *role, const std::vector<std::string> &env)
    {
        // Everything the child needs is built before fork: other threads
        // (stream workers) may hold locks at that moment.
        std::vector<std::string> envs;
        for (char **e = environ; *e; e++) envs.push_back(*e);
        for (const std::string &e : env) envs.push_back(e);
        std::vector<char *> envp;
        for (std::string &e : envs) envp.push_back(&e[0]);
        envp.push_back(nullptr);
        char arg0[] = "weft_emu_cuda_tests", arg1[] = "--emu-child";
        std::string r(role);
        char *argv[] = {arg0, arg1, &r[0], nullptr};
        int in[2], out[2];
        if (pipe(in) != 0 || pipe(out) != 0) abort();
        pid = fork();
        if (pid == 0) {
            dup2(in[0], 0);
            dup2(out[1], 1);
            close(in[0]); close(in[1]); close(out[0]); close(out[1]);
            execve("/proc/self/exe", argv, envp.data());
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        to = in[1];
        from = out[0];
    }
    ~Child() { wait(); }
    template <class T> bool send(const T &v) { return write_all(to, &v, sizeof(v)); }
    template <class T> bool recv(T *v) { return read_all(from, v, sizeof(*v)); }
    std::string read_rest()
    {
        std::string s;
        char buf[512];
        ssize_t r;
        while ((r = read(from, buf, sizeof(buf))) > 0) s.append(buf, (size_t)r);
        return s;
    }
    int wait()
    {
        if (pid < 0) return -1;
        if (to >= 0) close(to);
        to = -1;
        int st = 0;
        waitpid(pid, &st, 0);
        pid = -1;
        if (from >= 0) close(from);
        from = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
};

std::map<std::string, std::string> parse_kv(const std::string &s)
{
    std::map<std::string, std::string> m;
    size_t pos = 0;
    while (pos < s.size()) {
        size_t nl = s.find('\n', pos);
        if (nl == std::string::npos) nl = s.size();
        std::string line = s.substr(pos, nl - pos);
        size_t eq = line.find('=');
        if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
        pos = nl + 1;
    }
    return m;
}

std::map<std::string, std::string> child_info(const std::vector<std::string> &env)
{
    Child c("info", env);
    std::string out = c.read_rest();
    EXPECT_EQ(0, c.wait());
    return parse_kv(out);
}

// A region exported to children: two 32-bit semaphores, then data.
constexpr size_t kIpcBytes = 1 << 20;
constexpr size_t kData = 4096;  // offset of the parent's data
constexpr size_t kData2 = kData + 256 * 1024;  // offset of the child's answer
constexpr size_t kDataLen = 128 * 1024;

unsigned char pattern(size_t i, int salt) { return (unsigned char)((i * 131 + (size_t)salt) & 0xff); }

// Touches *p from the host in a forked child: 1 when that killed the child
// with SIGSEGV (device memory on a GPU), 0 when it worked, -1 otherwise.
int host_access_faults(const void *p, bool write)
{
    fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
        // The default action, not a sanitizer's report-and-exit handler.
        signal(SIGSEGV, SIG_DFL);
        volatile unsigned char *c = (volatile unsigned char *)p;
        if (write) *c = 1;
        else (void)*c;
        _exit(0);
    }
    if (pid < 0) return -1;
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return -1;
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV) return 1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

}  // namespace

// ---------------------------------------------------------------- versions, devices

TEST(EmuCuda, Versions)
{
    int rt = 0, drv = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    EXPECT_GE(rt, 13000);
    EXPECT_GE(drv, rt);
    EXPECT_LT(rt, 14000);
}

TEST(EmuCuda, DevicesDefault)
{
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    ASSERT_EQ(2, n);
    int d = -1;
    CK(cudaGetDevice(&d));
    EXPECT_EQ(0, d);
    CK(cudaSetDevice(1));
    CK(cudaGetDevice(&d));
    EXPECT_EQ(1, d);
    EXPECT_EQ(cudaErrorInvalidDevice, cudaSetDevice(2));
    CK(cudaSetDevice(0));

    cudaDeviceProp p0, p1;
    CK(cudaGetDeviceProperties(&p0, 0));
    CK(cudaGetDeviceProperties(&p1, 1));
    EXPECT_NE(0, memcmp(p0.uuid.bytes, p1.uuid.bytes, 16));
    EXPECT_NE(p0.pciBusID, p1.pciBusID);
    EXPECT_EQ(1, p0.unifiedAddressing);
    EXPECT_GT(p0.totalGlobalMem, (size_t)0);
    char b0[32], b1[32];
    CK(cudaDeviceGetPCIBusId(b0, sizeof(b0), 0));
    CK(cudaDeviceGetPCIBusId(b1, sizeof(b1), 1));
    EXPECT_STRNE(b0, b1);
    int bus = -1;
    CK(cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, 1));
    EXPECT_EQ(p1.pciBusID, bus);
    int dev = -1;
    CK(cudaDeviceGetByPCIBusId(&dev, b1));
    EXPECT_EQ(1, dev);
    int major = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    EXPECT_EQ(p0.major, major);
    EXPECT_EQ(cudaErrorInvalidDevice, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 5));
    cudaGetLastError();
}

TEST(EmuCuda, PeerAccessDefault)
{
    int can = -1;
    CK(cudaDeviceCanAccessPeer(&can, 0, 1));
    EXPECT_EQ(1, can);
    CK(cudaDeviceCanAccessPeer(&can, 0, 0));
    EXPECT_EQ(0, can);
    CK(cudaSetDevice(0));
    CK(cudaDeviceEnablePeerAccess(1, 0));
    EXPECT_EQ(cudaErrorPeerAccessAlreadyEnabled, cudaDeviceEnablePeerAccess(1, 0));
    EXPECT_EQ(cudaErrorInvalidDevice, cudaDeviceEnablePeerAccess(0, 0));
    CK(cudaDeviceDisablePeerAccess(1));
    EXPECT_EQ(cudaErrorPeerAccessNotEnabled, cudaDeviceDisablePeerAccess(1));
    cudaGetLastError();
}

TEST(EmuCuda, EnvKnobs)
{
    auto m = child_info({"WEFT_EMU_CUDA_DEVICES=4", "WEFT_EMU_CUDA_BUSIDS=0000:07:00.0,0000:0f:00.0",
                         "WEFT_EMU_CUDA_NO_PEER=0-1"});
    EXPECT_EQ("0", m["rc"]);
    EXPECT_EQ("4", m["count"]);
    EXPECT_EQ("0", m["node"]);
    EXPECT_EQ("0000:07:00.0", m["bus0"]);
    EXPECT_EQ("0000:0f:00.0", m["bus1"]);
    EXPECT_NE(m["bus2"], m["bus3"]);
    EXPECT_EQ("7", m["pcibus0"]);
    EXPECT_EQ("15", m["pcibus1"]);
    EXPECT_EQ("0", m["peer0_1"]);
    EXPECT_EQ("0", m["peer1_0"]);
    EXPECT_EQ("1", m["peer0_2"]);
    EXPECT_EQ("1", m["peer2_3"]);
    EXPECT_EQ(std::to_string((int)cudaErrorPeerAccessUnsupported), m["enable0_1"]);
    std::set<std::string> uuids;
    for (int d = 0; d < 4; d++) uuids.insert(m["uuid" + std::to_string(d)]);
    EXPECT_EQ(4u, uuids.size());

    // Same bus ids on the same node: same UUIDs in every process.
    auto again = child_info({"WEFT_EMU_CUDA_DEVICES=4", "WEFT_EMU_CUDA_BUSIDS=0000:07:00.0,0000:0f:00.0"});
    EXPECT_EQ(m["uuid0"], again["uuid0"]);
    EXPECT_EQ(m["uuid1"], again["uuid1"]);
    EXPECT_EQ("1", again["peer0_1"]);

    // Another node: other GPUs, other UUIDs.
    auto node3 = child_info({"WEFT_EMU_CUDA_DEVICES=4", "WEFT_EMU_CUDA_BUSIDS=0000:07:00.0,0000:0f:00.0",
                             "WEFT_EMU_CUDA_NODE=3"});
    EXPECT_EQ("3", node3["node"]);
    EXPECT_NE(m["uuid0"], node3["uuid0"]);
    EXPECT_EQ(m["bus0"], node3["bus0"]);

    EXPECT_EQ("0", m["big"]);
    EXPECT_EQ("0", m["gdr"]);
    // Device memory is counted in 2 MiB blocks: room for one.
    auto small = child_info({"WEFT_EMU_CUDA_MEM=2M", "WEFT_EMU_CUDA_GDR=1"});
    EXPECT_EQ("0", small["malloc"]);
    EXPECT_EQ(std::to_string((int)cudaErrorMemoryAllocation), small["big"]);
    EXPECT_EQ("1", small["gdr"]);

    auto none = child_info({"WEFT_EMU_CUDA_DEVICES=0"});
    EXPECT_EQ(std::to_string((int)cudaErrorNoDevice), none["rc"]);
    EXPECT_EQ("0", none["count"]);
    EXPECT_EQ(std::to_string((int)cudaErrorNoDevice), none["malloc"]);
}

// ---------------------------------------------------------------- memory

TEST(EmuCuda, PointerAttributes)
{
    void *d0 = nullptr, *d1 = nullptr, *h = nullptr;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&d0, 1000));
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&d1, 5000));
    CK(cudaMallocHost(&h, 3000));
    CK(cudaSetDevice(0));
    std::vector<char> plain(4096);
    static char global_buf[64];

    cudaPointerAttributes a;
    CK(cudaPointerGetAttributes(&a, d0));
    EXPECT_EQ(cudaMemoryTypeDevice, a.type);
    EXPECT_EQ(0, a.device);
    EXPECT_EQ(d0, a.devicePointer);
    EXPECT_EQ(nullptr, a.hostPointer);
    CK(cudaPointerGetAttributes(&a, (char *)d1 + 4999));
    EXPECT_EQ(cudaMemoryTypeDevice, a.type);
    EXPECT_EQ(1, a.device);
    EXPECT_EQ((char *)d1 + 4999, a.devicePointer);
    CK(cudaPointerGetAttributes(&a, h));
    EXPECT_EQ(cudaMemoryTypeHost, a.type);
    EXPECT_EQ(1, a.device);  // current when allocated
    EXPECT_EQ(h, a.hostPointer);
    for (const void *p : {(const void *)plain.data(), (const void *)global_buf, (const void *)&a}) {
        CK(cudaPointerGetAttributes(&a, p));
        EXPECT_EQ(cudaMemoryTypeUnregistered, a.type);
        EXPECT_EQ(nullptr, a.devicePointer);
    }

    // Device memory lies in its own range, apart from host memory.
    uintptr_t lo = std::min((uintptr_t)d0, (uintptr_t)d1), hi = std::max((uintptr_t)d0, (uintptr_t)d1);
    for (uintptr_t p : {(uintptr_t)h, (uintptr_t)plain.data(), (uintptr_t)global_buf})
        EXPECT_TRUE(p < lo || p > hi + 5000) << std::hex << p;

    // Driver attributes: buffer ids, ranges.
    unsigned long long id0 = 0, id1 = 0, idh = 0;
    DK(cuPointerGetAttribute(&id0, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)d0));
    DK(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)d1 + 17));
    DK(cuPointerGetAttribute(&idh, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)h));
    EXPECT_NE(0ull, id0);
    EXPECT_NE(id0, id1);
    EXPECT_NE(id1, idh);
    unsigned int mt = 0;
    DK(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)d1));
    EXPECT_EQ((unsigned)CU_MEMORYTYPE_DEVICE, mt);
    int ord = -1;
    DK(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)d1));
    EXPECT_EQ(1, ord);
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
              cuPointerGetAttribute(&id0, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)plain.data()));

    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    unsigned long long bid = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    void *data[] = {&mt, &bid, &start, &size, &ord};
    DK(cuPointerGetAttributes(5, attrs, data, (CUdeviceptr)d1 + 100));
    EXPECT_EQ((unsigned)CU_MEMORYTYPE_DEVICE, mt);
    EXPECT_EQ(id1, bid);
    EXPECT_EQ((CUdeviceptr)d1, start);
    EXPECT_EQ(5000u, size);
    // Not a CUDA pointer: success, zero values.
    DK(cuPointerGetAttributes(5, attrs, data, (CUdeviceptr)plain.data()));
    EXPECT_EQ(0u, mt);
    EXPECT_EQ(0ull, bid);

    CUdeviceptr base = 0;
    size_t len = 0;
    DK(cuMemGetAddressRange(&base, &len, (CUdeviceptr)d0 + 999));
    EXPECT_EQ((CUdeviceptr)d0, base);
    EXPECT_EQ(1000u, len);
    EXPECT_EQ(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange(&base, &len, (CUdeviceptr)plain.data()));
    EXPECT_EQ(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange(&base, &len, (CUdeviceptr)d0 + 4096 * 4));

    // Freeing: only the base of the right kind.
    EXPECT_EQ(cudaErrorInvalidValue, cudaFree((char *)d0 + 8));
    EXPECT_EQ(cudaErrorInvalidValue, cudaFree(h));
    EXPECT_EQ(cudaErrorInvalidValue, cudaFreeHost(d0));
    cudaGetLastError();
    CK(cudaFree(d0));
    CK(cudaFree(d1));
    CK(cudaFreeHost(h));
    CK(cudaPointerGetAttributes(&a, d0));
    EXPECT_EQ(cudaMemoryTypeUnregistered, a.type);
    CK(cudaFree(nullptr));
}

TEST(EmuCuda, AddressReuseGetsNewBufferId)
{
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, 1 << 20));
    unsigned long long ida = 0, idb = 0;
    DK(cuPointerGetAttribute(&ida, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)a));
    cudaIpcMemHandle_t ha, hb;
    CK(cudaIpcGetMemHandle(&ha, a));
    CK(cudaFree(a));
    CK(cudaMalloc(&b, 1 << 20));
    ASSERT_EQ(a, b) << "a same-size allocation after cudaFree reuses the address";
    DK(cuPointerGetAttribute(&idb, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)b));
    EXPECT_NE(ida, idb);
    CK(cudaIpcGetMemHandle(&hb, b));
    EXPECT_NE(0, memcmp(&ha, &hb, sizeof(ha)));
    CK(cudaFree(b));
}

TEST(EmuCuda, MemcpyAllKinds)
{
    const size_t n = 64 * 1024;
    std::vector<unsigned char> src(n), dst(n, 0);
    for (size_t i = 0; i < n; i++) src[i] = pattern(i, 1);
    void *d0 = nullptr, *d1 = nullptr, *pin = nullptr;
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&d0, n));
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&d1, n));
    CK(cudaSetDevice(0));
    CK(cudaMallocHost(&pin, n));

    CK(cudaMemcpy(d0, src.data(), n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d1, d0, n, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(pin, d1, n, cudaMemcpyDeviceToHost));
    EXPECT_EQ(0, memcmp(pin, src.data(), n));
    CK(cudaMemcpy(dst.data(), pin, n, cudaMemcpyHostToHost));
    EXPECT_EQ(src, dst);

    // cudaMemcpyDefault infers the direction.
    CK(cudaMemset(d0, 0, n));
    CK(cudaMemcpy((char *)d0 + 100, src.data(), 1000, cudaMemcpyDefault));
    CK(cudaMemcpy(dst.data(), d0, n, cudaMemcpyDefault));
    EXPECT_EQ(0, dst[99]);
    EXPECT_EQ(0, memcmp(dst.data() + 100, src.data(), 1000));
    EXPECT_EQ(0, dst[1100]);

    // Async copies of every kind on a stream, then memsets.
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::fill(dst.begin(), dst.end(), 0);
    CK(cudaMemcpyAsync(d1, src.data(), n, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(d0, d1, n, cudaMemcpyDeviceToDevice, s));
    CK(cudaMemcpyAsync(pin, d0, n, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync(dst.data(), pin, n, cudaMemcpyHostToHost, s));
    CK(cudaMemsetAsync(d0, 0xab, 10, s));
    CK(cudaMemcpyAsync(pin, d0, 16, cudaMemcpyDefault, s));
    CK(cudaMemcpyPeerAsync(d1, 1, d0, 0, 16, s));
    CK(cudaStreamSynchronize(s));
    EXPECT_EQ(src, dst);
    EXPECT_EQ(0xab, ((unsigned char *)pin)[9]);
    EXPECT_EQ(src[10], ((unsigned char *)pin)[10]);
    unsigned char chk[16];
    CK(cudaMemcpy(chk, d1, 16, cudaMemcpyDeviceToHost));
    EXPECT_EQ(0xab, chk[0]);
    EXPECT_EQ(src[10], chk[10]);

    // Memset of pinned host memory works; of ordinary host memory it does not.
    CK(cudaMemset(pin, 7, 8));
    EXPECT_EQ(7, ((unsigned char *)pin)[7]);
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemset(dst.data(), 0, 8));
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemsetAsync(dst.data(), 0, 8, s));

    CK(cudaStreamDestroy(s));
    CK(cudaFree(d0));
    CK(cudaFree(d1));
    CK(cudaFreeHost(pin));
    cudaGetLastError();
}

TEST(EmuCuda, MemcpyRefusals)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, 4096));
    std::vector<char> h(8192);
    // A host pointer where a device pointer is needed.
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(h.data(), h.data() + 4096, 16, cudaMemcpyHostToDevice));
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(h.data(), h.data() + 4096, 16, cudaMemcpyDeviceToHost));
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(d, h.data(), 16, cudaMemcpyDeviceToDevice));
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(d, h.data(), 16, cudaMemcpyHostToHost));
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpyAsync(h.data(), h.data(), 16, cudaMemcpyDeviceToHost, 0));
    // Past the end of the allocation.
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(d, h.data(), 4097, cudaMemcpyHostToDevice));
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(h.data(), (char *)d + 4000, 100, cudaMemcpyDefault));
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemset((char *)d + 1, 0, 4096));
    EXPECT_EQ(cudaErrorInvalidMemcpyDirection, cudaMemcpy(d, h.data(), 16, (cudaMemcpyKind)9));
    EXPECT_EQ(cudaErrorInvalidResourceHandle,
              cudaMemcpyAsync(d, h.data(), 16, cudaMemcpyHostToDevice, (cudaStream_t)h.data()));
    // Device address space no allocation covers (beyond this allocation,
    // or freed): refused, never copied as if it were host memory.
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy((char *)d + (1 << 20), h.data(), 16, cudaMemcpyDefault));
    EXPECT_EQ(cudaErrorInvalidValue,
              cudaMemcpyAsync((char *)d + (1 << 20), h.data(), 16, cudaMemcpyDefault, 0));
    cudaGetLastError();
    CK(cudaFree(d));
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(h.data(), d, 16, cudaMemcpyDefault));
    cudaGetLastError();
}

TEST(EmuCuda, HostRegister)
{
    std::vector<unsigned int> buf(1024, 0);
    CK(cudaHostRegister(buf.data(), buf.size() * 4, cudaHostRegisterDefault));
    EXPECT_EQ(cudaErrorHostMemoryAlreadyRegistered, cudaHostRegister(buf.data() + 10, 64, 0));
    cudaPointerAttributes a;
    CK(cudaPointerGetAttributes(&a, buf.data() + 5));
    EXPECT_EQ(cudaMemoryTypeHost, a.type);
    EXPECT_EQ(buf.data() + 5, a.hostPointer);
    void *dp = nullptr;
    CK(cudaHostGetDevicePointer(&dp, buf.data(), 0));
    EXPECT_EQ((void *)buf.data(), dp);
    CK(cudaMemset(buf.data(), 1, 16));
    EXPECT_EQ(0x01010101u, buf[3]);
    EXPECT_EQ(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(buf.data() + 1));
    CK(cudaHostUnregister(buf.data()));
    EXPECT_EQ(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(buf.data()));
    CK(cudaPointerGetAttributes(&a, buf.data()));
    EXPECT_EQ(cudaMemoryTypeUnregistered, a.type);
    void *d = nullptr;
    CK(cudaMalloc(&d, 4096));
    EXPECT_EQ(cudaErrorInvalidValue, cudaHostRegister(d, 4096, 0));
    CK(cudaFree(d));
    cudaGetLastError();
}

TEST(EmuCuda, DeviceMemoryFaultsOnHost)
{
    // Host code dereferencing a device pointer faults, as on a GPU; the
    // runtime's own copies reach the memory.
    const size_t n = 3 * 4096 + 100;
    std::vector<unsigned char> src(n), dst(n, 0);
    for (size_t i = 0; i < n; i++) src[i] = pattern(i, 9);
    void *d = nullptr, *pin = nullptr;
    CK(cudaMalloc(&d, n));
    CK(cudaMemcpy(d, src.data(), n, cudaMemcpyHostToDevice));
    EXPECT_EQ(1, host_access_faults(d, false));
    EXPECT_EQ(1, host_access_faults((char *)d + n - 1, false));
    EXPECT_EQ(1, host_access_faults((char *)d + 5000, true));
    CK(cudaMemcpy(dst.data(), d, n, cudaMemcpyDeviceToHost));
    EXPECT_EQ(src, dst);
    // Memset, stream memory operations and device-to-device copies too.
    void *d2 = nullptr;
    CK(cudaMalloc(&d2, n));
    EXPECT_EQ(1, host_access_faults(d2, false));
    CK(cudaMemset(d2, 0x5c, n));
    DK(cuStreamWriteValue32(0, (CUdeviceptr)d2 + 8, 0x01020304u, 0));
    DK(cuStreamWaitValue32(0, (CUdeviceptr)d2 + 8, 0x01020304u, CU_STREAM_WAIT_VALUE_EQ));
    CK(cudaMemcpy((char *)d2 + 4096, (char *)d + 4096, 100, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(dst.data(), d2, n, cudaMemcpyDeviceToHost));
    EXPECT_EQ(0x5c, dst[0]);
    unsigned int word = 0;
    memcpy(&word, dst.data() + 8, 4);
    EXPECT_EQ(0x01020304u, word);
    EXPECT_EQ(0, memcmp(dst.data() + 4096, src.data() + 4096, 100));
    EXPECT_EQ(0x5c, dst[4196]);
    // Pinned host memory stays host memory.
    CK(cudaMallocHost(&pin, 4096));
    EXPECT_EQ(0, host_access_faults(pin, true));
    CK(cudaMemcpy(pin, d, 4096, cudaMemcpyDeviceToHost));
    EXPECT_EQ(0, memcmp(pin, src.data(), 4096));
    CK(cudaFreeHost(pin));
    CK(cudaFree(d2));
    CK(cudaFree(d));
    // Freed device memory faults too.
    EXPECT_EQ(1, host_access_faults(d, false));
}

TEST(EmuCuda, DmaBufNotSupported)
{
    // WEFT_EMU_CUDA_GDR unset: no GPUDirect RDMA, no dma-buf (see the
    // dmabuf child role for the supported case).
    int v = -1;
    DK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0));
    EXPECT_EQ(0, v);
    DK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0));
    EXPECT_EQ(0, v);
    CK(cudaDeviceGetAttribute(&v, (cudaDeviceAttr)CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0));
    EXPECT_EQ(0, v);
    void *d = nullptr;
    CK(cudaMalloc(&d, 1 << 16));
    int fd = -1;
    EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED,
              cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)d, 1 << 16, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    EXPECT_EQ(-1, fd);
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
              cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)d + 64, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    std::vector<char> h(64);
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE,
              cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)h.data(), 64, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    CK(cudaFree(d));
}

TEST(EmuCuda, DmaBufExport)
{
    Child c("dmabuf", {"WEFT_EMU_CUDA_GDR=1"});
    std::string out = c.read_rest();
    EXPECT_EQ(0, c.wait()) << out;
}

TEST(EmuCuda, PeermemHook)
{
    // weft_emu_cuda_peermem_fd: what libweft_emu_verbs.so uses for
    // WEFT_EMU_VERBS_PEERMEM (tested end to end in emu_verbs).
    void *d = nullptr;
    CK(cudaMalloc(&d, 3 * 4096));
    CK(cudaMemset(d, 0x3e, 3 * 4096));
    CK(cudaDeviceSynchronize());
    int fd = weft_emu_cuda_peermem_fd((char *)d + 100, 5000);
    ASSERT_GE(fd, 0);
    // The memfd behind the allocation's block (offset 0: the block's base).
    CUdeviceptr blk = 0;
    DK(cuPointerGetAttribute(&blk, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, (CUdeviceptr)d));
    size_t off = (size_t)((CUdeviceptr)d - blk);
    void *m = mmap(nullptr, off + 3 * 4096, PROT_READ, MAP_SHARED, fd, 0);
    ASSERT_NE(MAP_FAILED, m);
    EXPECT_EQ(0x3e, ((unsigned char *)m)[off + 5100]);
    munmap(m, off + 3 * 4096);
    close(fd);
    // Pages past the block's end (2 MiB) are refused.
    EXPECT_EQ(-1, weft_emu_cuda_peermem_fd((char *)d + 100, (2u << 20) - off));
    std::vector<char> h(64);
    EXPECT_EQ(-1, weft_emu_cuda_peermem_fd(h.data(), 64));
    CK(cudaFree(d));
    EXPECT_EQ(-1, weft_emu_cuda_peermem_fd(d, 64));
}

// ---------------------------------------------------------------- streams and events

TEST(EmuCuda, StreamOrderingAfterDelayHostNotBlocked)
{
    const size_t n = 1 << 16;
    void *d = nullptr;
    CK(cudaMalloc(&d, n));
    CK(cudaMemset(d, 0x11, n));
    CK(cudaDeviceSynchronize());
    std::vector<unsigned char> h(n, 0);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    double t0 = now_ms();
    CK(weft_emu_cuda_stream_delay(s, 500 * 1000));
    CK(cudaMemsetAsync(d, 0x22, n, s));
    CK(cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, s));
    double enq = now_ms() - t0;
    EXPECT_LT(enq, 200.0) << "enqueueing must not wait for the stream";
    EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(s));
    sleep_ms(50);
    EXPECT_EQ(0, h[0]) << "the copy ran before the delay step ended";
    CK(cudaStreamSynchronize(s));
    EXPECT_GE(now_ms() - t0, 490.0);
    EXPECT_EQ(cudaSuccess, cudaStreamQuery(s));
    EXPECT_EQ(0x22, h[0]);
    EXPECT_EQ(0x22, h[n - 1]);
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d));
}

namespace {
struct Log {
    std::vector<int> v;
};
void log_push(void *p)
{
    auto *l = static_cast<std::pair<Log *, int> *>(p);
    l->first->v.push_back(l->second);
}
}  // namespace

TEST(EmuCuda, HostFuncsRunInOrder)
{
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    Log log;
    std::vector<std::pair<Log *, int>> args;
    for (int i = 0; i < 20; i++) args.push_back({&log, i});
    for (int i = 0; i < 20; i++) {
        if (i == 3) {
            CK(weft_emu_cuda_stream_delay(s, 20 * 1000));
        }
        CK(cudaLaunchHostFunc(s, log_push, &args[i]));
    }
    CK(cudaStreamSynchronize(s));
    ASSERT_EQ(20u, log.v.size());
    for (int i = 0; i < 20; i++) EXPECT_EQ(i, log.v[i]);
    CK(cudaStreamDestroy(s));
    // A destroyed stream is an invalid handle.
    EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaStreamQuery(s));
    cudaGetLastError();
}

TEST(EmuCuda, DestroyWithPendingWorkCompletes)
{
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    int flag = 0;
    CK(weft_emu_cuda_stream_delay(s, 200 * 1000));
    CK(cudaLaunchHostFunc(s, [](void *p) { __atomic_store_n(static_cast<int *>(p), 1, __ATOMIC_SEQ_CST); }, &flag));
    CK(cudaStreamDestroy(s));
    EXPECT_EQ(0, __atomic_load_n(&flag, __ATOMIC_SEQ_CST)) << "cudaStreamDestroy waited for the work";
    for (int i = 0; i < 200 && !__atomic_load_n(&flag, __ATOMIC_SEQ_CST); i++) sleep_ms(5);
    EXPECT_EQ(1, flag);
}

TEST(EmuCuda, Events)
{
    cudaStream_t s;
    cudaEvent_t start, stop, never, notime;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&stop));
    CK(cudaEventCreate(&never));
    CK(cudaEventCreateWithFlags(&notime, cudaEventDisableTiming));
    EXPECT_EQ(cudaSuccess, cudaEventQuery(never));  // never recorded: complete

    CK(cudaEventRecord(start, s));
    CK(weft_emu_cuda_stream_delay(s, 150 * 1000));
    CK(cudaEventRecord(stop, s));
    CK(cudaEventRecord(notime, s));
    EXPECT_EQ(cudaErrorNotReady, cudaEventQuery(stop));
    float ms = 0;
    EXPECT_EQ(cudaErrorNotReady, cudaEventElapsedTime(&ms, start, stop));
    CK(cudaEventSynchronize(stop));
    EXPECT_EQ(cudaSuccess, cudaEventQuery(stop));
    CK(cudaEventElapsedTime(&ms, start, stop));
    EXPECT_GE(ms, 140.0f);
    EXPECT_LT(ms, 2000.0f);
    CK(cudaEventSynchronize(notime));
    EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, start, notime));
    EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, start, never));

    // Re-recording makes the event pending again.
    CK(weft_emu_cuda_stream_delay(s, 200 * 1000));
    CK(cudaEventRecord(stop, s));
    EXPECT_EQ(cudaErrorNotReady, cudaEventQuery(stop));
    // Destroying an event with a record still queued is allowed.
    CK(cudaEventDestroy(stop));
    EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventQuery(stop));
    CK(cudaStreamSynchronize(s));
    for (cudaEvent_t e : {start, never, notime}) CK(cudaEventDestroy(e));
    CK(cudaStreamDestroy(s));
    cudaGetLastError();
}

TEST(EmuCuda, StreamWaitEventOfAnotherStream)
{
    const size_t n = 4096;
    void *d = nullptr;
    CK(cudaMalloc(&d, n));
    CK(cudaMemset(d, 0, n));
    cudaStream_t a, b;
    cudaEvent_t ev;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    std::vector<unsigned char> h(n, 0), h2(n, 0);

    double t0 = now_ms();
    CK(weft_emu_cuda_stream_delay(a, 200 * 1000));
    CK(cudaMemsetAsync(d, 5, n, a));
    CK(cudaEventRecord(ev, a));
    CK(cudaStreamWaitEvent(b, ev, 0));
    CK(cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, b));
    // Recording again later does not change what b waits for.
    CK(weft_emu_cuda_stream_delay(a, 600 * 1000));
    CK(cudaEventRecord(ev, a));
    EXPECT_LT(now_ms() - t0, 150.0);
    CK(cudaStreamSynchronize(b));
    double t = now_ms() - t0;
    EXPECT_GE(t, 190.0);
    EXPECT_LT(t, 700.0) << "b waited for a later record of the event";
    EXPECT_EQ(5, h[0]);
    EXPECT_EQ(5, h[n - 1]);

    // Without the wait, b does not wait for a.
    CK(cudaStreamSynchronize(a));
    CK(weft_emu_cuda_stream_delay(a, 500 * 1000));
    CK(cudaMemsetAsync(d, 9, n, a));
    CK(cudaMemcpyAsync(h2.data(), d, n, cudaMemcpyDeviceToHost, b));
    CK(cudaStreamSynchronize(b));
    EXPECT_EQ(5, h2[0]);
    CK(cudaDeviceSynchronize());
    CK(cudaEventDestroy(ev));
    CK(cudaStreamDestroy(a));
    CK(cudaStreamDestroy(b));
    CK(cudaFree(d));
}

TEST(EmuCuda, LegacyDefaultStream)
{
    const size_t n = 4096;
    void *d = nullptr;
    CK(cudaMalloc(&d, n));
    CK(cudaMemset(d, 1, n));
    CK(cudaDeviceSynchronize());
    std::vector<unsigned char> h(n, 0);
    cudaStream_t blocking, nonblocking;
    CK(cudaStreamCreate(&blocking));
    CK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));

    // Legacy stream work waits for earlier work of a blocking stream.
    CK(weft_emu_cuda_stream_delay(blocking, 150 * 1000));
    CK(cudaMemsetAsync(d, 2, n, blocking));
    CK(cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, 0));
    CK(cudaStreamSynchronize(0));
    EXPECT_EQ(2, h[0]);

    // ... but not for a non-blocking stream.
    double t0 = now_ms();
    CK(weft_emu_cuda_stream_delay(nonblocking, 600 * 1000));
    CK(cudaMemsetAsync(d, 3, n, nonblocking));
    CK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
    EXPECT_LT(now_ms() - t0, 400.0);
    EXPECT_EQ(2, h[0]);

    // Blocking stream work waits for earlier legacy stream work.
    CK(weft_emu_cuda_stream_delay(0, 150 * 1000));
    CK(cudaMemsetAsync(d, 4, n, 0));
    CK(cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, blocking));
    CK(cudaStreamSynchronize(blocking));
    EXPECT_EQ(4, h[0]);
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(cudaSuccess, cudaStreamQuery(nonblocking));
    CK(cudaStreamDestroy(blocking));
    CK(cudaStreamDestroy(nonblocking));
    CK(cudaFree(d));
}

// ---------------------------------------------------------------- stream memory operations

TEST(EmuCuda, WaitWriteValueAcrossStreams)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, 4096));
    CK(cudaMemset(d, 0, 4096));
    CK(cudaDeviceSynchronize());
    CUdeviceptr flag = (CUdeviceptr)d, data = (CUdeviceptr)d + 64;
    cudaStream_t waiter, writer;
    CK(cudaStreamCreateWithFlags(&waiter, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking));
    unsigned int got = 0;

    double t0 = now_ms();
    DK(cuStreamWaitValue32(waiter, flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cudaMemcpyAsync(&got, (void *)data, 4, cudaMemcpyDeviceToHost, waiter));
    EXPECT_LT(now_ms() - t0, 200.0) << "the wait blocked the host";
    sleep_ms(100);
    EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(waiter));
    EXPECT_EQ(0u, got);

    unsigned int v = 0xfeedu;
    CK(cudaMemcpyAsync((void *)data, &v, 4, cudaMemcpyHostToDevice, writer));
    DK(cuStreamWriteValue32(writer, flag, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
    CK(cudaStreamSynchronize(waiter));
    EXPECT_EQ(0xfeedu, got);
    CK(cudaStreamDestroy(waiter));
    CK(cudaStreamDestroy(writer));
    CK(cudaFree(d));
}

TEST(EmuCuda, WaitValuePredicates)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, 4096));
    CUdeviceptr w = (CUdeviceptr)d;
    cudaStream_t s, setter;  // the host cannot store into device memory: a second stream does
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&setter, cudaStreamNonBlocking));
    struct Case {
        unsigned flags, value, before, after;
    } cases[] = {
        {CU_STREAM_WAIT_VALUE_GEQ, 10, 9, 10},
        {CU_STREAM_WAIT_VALUE_GEQ, 0x00000002u, 0xfffffff0u, 0x00000003u},  // wraps around
        {CU_STREAM_WAIT_VALUE_EQ, 7, 8, 7},
        {CU_STREAM_WAIT_VALUE_AND, 0x4, 0x3, 0x6},
        {CU_STREAM_WAIT_VALUE_NOR, 0xfffffff0u, 0x0000000fu, 0x00000007u},
    };
    for (const Case &c : cases) {
        DK(cuStreamWriteValue32(setter, w, c.before, 0));
        CK(cudaStreamSynchronize(setter));
        DK(cuStreamWaitValue32(s, w, c.value, c.flags));
        sleep_ms(30);
        EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(s)) << "flags " << c.flags << " value " << c.value;
        DK(cuStreamWriteValue32(setter, w, c.after, 0));
        CK(cudaStreamSynchronize(s));
    }
    // 64-bit forms.
    CUdeviceptr w64 = (CUdeviceptr)d + 8;
    DK(cuStreamWriteValue64(setter, w64, 0, 0));
    CK(cudaStreamSynchronize(setter));
    DK(cuStreamWaitValue64(s, w64, 1ull << 40, CU_STREAM_WAIT_VALUE_GEQ));
    DK(cuStreamWriteValue64(s, w64 + 8, 99, 0));
    sleep_ms(30);
    EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(s));
    DK(cuStreamWriteValue64(setter, w64, 1ull << 41, 0));
    CK(cudaStreamSynchronize(s));
    uint64_t got = 0;
    CK(cudaMemcpy(&got, (void *)(w64 + 8), 8, cudaMemcpyDeviceToHost));
    EXPECT_EQ(99u, got);
    CK(cudaStreamDestroy(setter));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d));
}

TEST(EmuCuda, WaitValueOnRegisteredHostMemory)
{
    alignas(8) static unsigned int words[1024];
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // Unregistered host memory is refused; registered host memory works.
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(s, (CUdeviceptr)words, 1, 0));
    CK(cudaHostRegister(words, sizeof(words), cudaHostRegisterDefault));
    words[0] = 0;
    DK(cuStreamWaitValue32(s, (CUdeviceptr)words, 1, CU_STREAM_WAIT_VALUE_EQ));
    DK(cuStreamWriteValue32(s, (CUdeviceptr)&words[1], 42, 0));
    sleep_ms(30);
    EXPECT_EQ(0u, __atomic_load_n(&words[1], __ATOMIC_SEQ_CST));
    __atomic_store_n(&words[0], 1, __ATOMIC_SEQ_CST);
    CK(cudaStreamSynchronize(s));
    EXPECT_EQ(42u, words[1]);
    // Misaligned, unknown flags, bad stream.
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(s, (CUdeviceptr)words + 2, 1, 0));
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuStreamWaitValue32(s, (CUdeviceptr)words, 1, 0x10));
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cuStreamWriteValue32(s, (CUdeviceptr)words, 1, 0x2));
    EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuStreamWriteValue32((CUstream)words, (CUdeviceptr)words, 1, 0));
    CK(cudaHostUnregister(words));
    CK(cudaStreamDestroy(s));
}

// ---------------------------------------------------------------- entry points, errors, instance

typedef CUresult (*wait32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*getattr_fn)(void *, CUpointer_attribute, CUdeviceptr);
typedef CUresult (*errstr_fn)(CUresult, const char **);

TEST(EmuCuda, DriverEntryPoints)
{
    const char *names[] = {"cuStreamWaitValue32", "cuStreamWriteValue32", "cuPointerGetAttribute",
                           "cuPointerGetAttributes", "cuMemGetAddressRange", "cuMemGetHandleForAddressRange",
                           "cuGetErrorString"};
    for (const char *n : names) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
        CK(cudaGetDriverEntryPointByVersion(n, &fn, 12000, cudaEnableDefault, &st));
        EXPECT_NE(nullptr, fn) << n;
        EXPECT_EQ(cudaDriverEntryPointSuccess, st) << n;
    }
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult st;
    CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 13000, 0, &st));
    EXPECT_EQ((void *)&cuStreamWaitValue32, fn);
    CK(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 13000, 0, &st));
    EXPECT_EQ((void *)&cuMemGetAddressRange, fn);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    CK(cudaGetDriverEntryPoint("cuPointerGetAttribute", &fn, cudaEnableDefault, &st));
#pragma GCC diagnostic pop
    EXPECT_EQ((void *)&cuPointerGetAttribute, fn);
    CK(cudaGetDriverEntryPointByVersion("cuNoSuchCall", &fn, 13000, 0, &st));
    EXPECT_EQ(nullptr, fn);
    EXPECT_EQ(cudaDriverEntryPointSymbolNotFound, st);
    CK(cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 11000, 0, &st));
    EXPECT_EQ(nullptr, fn);
    EXPECT_EQ(cudaDriverEntryPointVersionNotSufficent, st);
    EXPECT_EQ(cudaErrorInvalidValue, cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 99000, 0, &st));

    // The pointers work.
    CK(cudaGetDriverEntryPointByVersion("cuGetErrorString", &fn, 13000, 0, &st));
    const char *str = nullptr;
    EXPECT_EQ(CUDA_SUCCESS, reinterpret_cast<errstr_fn>(fn)(CUDA_ERROR_INVALID_VALUE, &str));
    EXPECT_STREQ("invalid argument", str);
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, reinterpret_cast<errstr_fn>(fn)((CUresult)12345, &str));
    void *d = nullptr;
    CK(cudaMalloc(&d, 100));
    CK(cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 13000, 0, &st));
    unsigned long long id = 0;
    EXPECT_EQ(CUDA_SUCCESS, reinterpret_cast<getattr_fn>(fn)(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)d));
    EXPECT_NE(0ull, id);
    CK(cudaFree(d));
    cudaGetLastError();
}

TEST(EmuCuda, LastErrorAndStrings)
{
    cudaGetLastError();
    EXPECT_EQ(cudaSuccess, cudaPeekAtLastError());
    EXPECT_EQ(cudaErrorInvalidDevice, cudaSetDevice(99));
    EXPECT_EQ(cudaErrorInvalidDevice, cudaPeekAtLastError());
    EXPECT_EQ(cudaErrorInvalidDevice, cudaPeekAtLastError());
    EXPECT_EQ(cudaErrorInvalidDevice, cudaGetLastError());
    EXPECT_EQ(cudaSuccess, cudaGetLastError());
    EXPECT_STREQ("cudaErrorInvalidDevice", cudaGetErrorName(cudaErrorInvalidDevice));
    EXPECT_STREQ("invalid device ordinal", cudaGetErrorString(cudaErrorInvalidDevice));
    EXPECT_STREQ("cudaErrorAlreadyMapped", cudaGetErrorName(cudaErrorAlreadyMapped));
    EXPECT_STREQ("no error", cudaGetErrorString(cudaSuccess));
    const char *s = nullptr;
    DK(cuGetErrorName(CUDA_ERROR_NOT_SUPPORTED, &s));
    EXPECT_STREQ("CUDA_ERROR_NOT_SUPPORTED", s);
    // The last error is per thread.
    EXPECT_EQ(cudaErrorInvalidDevice, cudaSetDevice(99));
    cudaError_t other = cudaErrorUnknown;
    std::thread([&] { other = cudaPeekAtLastError(); }).join();
    EXPECT_EQ(cudaSuccess, other);
    cudaGetLastError();
}

TEST(EmuCuda, SameInstanceThroughDlopen)
{
    // What weft does with WEFT_CUDA_LIB pointing at this file.
    void *h = dlopen(WEFT_EMU_CUDA_LIB_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(nullptr, h) << dlerror();
    EXPECT_EQ((void *)&cudaMalloc, dlsym(h, "cudaMalloc"));
    EXPECT_EQ((void *)&weft_emu_cuda_counter, dlsym(h, "weft_emu_cuda_counter"));
    typedef unsigned long long (*counter_fn)(const char *);
    auto counter = reinterpret_cast<counter_fn>(dlsym(h, "weft_emu_cuda_counter"));
    ASSERT_NE(nullptr, counter);
    unsigned long long before = counter("malloc");
    void *d = nullptr;
    CK(cudaMalloc(&d, 64));
    EXPECT_EQ(before + 1, counter("malloc"));
    CK(cudaFree(d));
    dlclose(h);
}

TEST(EmuCuda, ForkedChildWithoutExecIsRefused)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, 64));
    pid_t pid = fork();
    if (pid == 0) {
        void *p = nullptr;
        _exit(cudaMalloc(&p, 64) == cudaErrorInitializationError ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CK(cudaFree(d));
}

// ---------------------------------------------------------------- rules that make CI as strict as a GPU
// (shared/gpu-review.md section 2; README.md "What is modelled"). Each test
// names its rule.

namespace {

// A word of mapped pinned memory a stream can be parked on.
struct ParkWord {
    unsigned int *w = nullptr;
    ParkWord()
    {
        void *p = nullptr;
        if (cudaHostAlloc(&p, 4096, cudaHostAllocMapped) == cudaSuccess) w = static_cast<unsigned int *>(p);
        if (w) *w = 0;
    }
    ~ParkWord()
    {
        if (w) cudaFreeHost(w);
    }
    void release() { __atomic_store_n(w, 1u, __ATOMIC_SEQ_CST); }
};

// A minimal fatbin: the header (magic, version 1, header size 16, body
// size) and one empty entry's worth of body. The emulator checks the
// header and serves weft's kernels by name.
struct FakeFatbin {
    alignas(16) unsigned char b[48];
    FakeFatbin()
    {
        memset(b, 0, sizeof(b));
        uint32_t magic = 0xBA55ED50u;
        uint16_t version = 1, hsize = 16;
        uint64_t body = 32;
        memcpy(b, &magic, 4);
        memcpy(b + 4, &version, 2);
        memcpy(b + 6, &hsize, 2);
        memcpy(b + 8, &body, 8);
    }
};

}  // namespace

// Rule 1: allocations below 2 MiB are carved from shared 2 MiB blocks at
// 512-byte granularity; larger ones get a block of their own.
TEST(EmuCudaRules, SmallAllocationsShareBlocks)
{
    void *a = nullptr, *b = nullptr, *c = nullptr, *big = nullptr;
    CK(cudaMalloc(&a, 8));
    CK(cudaMalloc(&b, 4097));
    CK(cudaMalloc(&c, 4098));
    CK(cudaMalloc(&big, 3 << 20));
    CUdeviceptr ba = 0, bb = 0, bc = 0, bbig = 0;
    size_t sa = 0, sbig = 0;
    unsigned long long ia = 0, ib = 0, ibig = 0;
    DK(cuPointerGetAttribute(&ba, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, (CUdeviceptr)a));
    DK(cuPointerGetAttribute(&bb, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, (CUdeviceptr)b));
    DK(cuPointerGetAttribute(&bc, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, (CUdeviceptr)c));
    DK(cuPointerGetAttribute(&bbig, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, (CUdeviceptr)big));
    DK(cuPointerGetAttribute(&sa, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, (CUdeviceptr)a));
    DK(cuPointerGetAttribute(&sbig, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, (CUdeviceptr)big));
    DK(cuPointerGetAttribute(&ia, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, (CUdeviceptr)a));
    DK(cuPointerGetAttribute(&ib, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, (CUdeviceptr)b));
    DK(cuPointerGetAttribute(&ibig, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, (CUdeviceptr)big));
    EXPECT_EQ(ba, bb);
    EXPECT_EQ(ba, bc);
    EXPECT_EQ(ia, ib);
    EXPECT_EQ(sa, (size_t)2 << 20);
    EXPECT_EQ(0u, ba % (2u << 20));
    for (void *p : {a, b, c}) EXPECT_EQ(0u, (uintptr_t)p % 512) << p;
    EXPECT_NE(a, b);
    EXPECT_NE(b, c);
    EXPECT_EQ((CUdeviceptr)big, bbig) << "a large allocation starts its own block";
    EXPECT_EQ(sbig, (size_t)4 << 20);
    EXPECT_NE(ia, ibig);
    // The allocation's own range, whatever the block.
    CUdeviceptr base = 0;
    size_t len = 0;
    DK(cuMemGetAddressRange(&base, &len, (CUdeviceptr)b + 4000));
    EXPECT_EQ((CUdeviceptr)b, base);
    EXPECT_EQ(4097u, len);
    // Between allocations of a block: no allocation, refused for a copy.
    std::vector<char> h(16);
    EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(h.data(), (char *)b + 4097 + 64, 8, cudaMemcpyDeviceToHost));
    cudaGetLastError();
    unsigned long long blocks = weft_emu_cuda_counter("blocks");
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    EXPECT_EQ(blocks - 1, weft_emu_cuda_counter("blocks")) << "the shared block goes with its last allocation";
    CK(cudaFree(big));
}

// Rule 1: a second open of a mapped block is refused
// (cudaErrorAlreadyMapped), also for another allocation in it; with
// WEFT_EMU_CUDA_IPC_REOPEN=refcount the existing mapping is shared. A block
// freed and made again at the same addresses cannot be opened while the old
// one is still mapped.
TEST(EmuCudaRules, IpcMapsWholeBlocks)
{
    void *x = nullptr, *y = nullptr;
    CK(cudaMalloc(&x, 8));
    CK(cudaMalloc(&y, 4097));
    CK(cudaMemset(y, 0x5c, 4097));
    CK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t hx, hy;
    CK(cudaIpcGetMemHandle(&hx, x));
    CK(cudaIpcGetMemHandle(&hy, y));
    for (int refcount = 0; refcount < 2; refcount++) {
        Child c("ipc_block", refcount ? std::vector<std::string>{"WEFT_EMU_CUDA_IPC_REOPEN=refcount"}
                                      : std::vector<std::string>{});
        ASSERT_TRUE(c.send(hx));
        ASSERT_TRUE(c.send(hy));
        long long dist = (char *)y - (char *)x;
        ASSERT_TRUE(c.send(dist));
        int r1 = -1, r2 = -1, seen = -1;
        ASSERT_TRUE(c.recv(&r1));
        ASSERT_TRUE(c.recv(&r2));
        ASSERT_TRUE(c.recv(&seen));
        EXPECT_EQ(0, r1);
        EXPECT_EQ(refcount ? 0 : (int)cudaErrorAlreadyMapped, r2) << "refcount " << refcount;
        EXPECT_EQ(0x5c, seen) << "y reached through x's mapping of the block";
        EXPECT_EQ(0, c.wait());
    }
    CK(cudaFree(x));
    CK(cudaFree(y));

    // A block of its own, mapped by a child, freed, made again at the same
    // address: the child's open of the new handle is refused while it maps
    // the old block, and works once it closed it.
    void *big = nullptr;
    CK(cudaMalloc(&big, 2 << 20));
    cudaIpcMemHandle_t h1, h2;
    CK(cudaIpcGetMemHandle(&h1, big));
    Child c("ipc_realloc", {});
    ASSERT_TRUE(c.send(h1));
    int r = -1;
    ASSERT_TRUE(c.recv(&r));
    ASSERT_EQ(0, r);
    void *old = big;
    CK(cudaFree(big));
    CK(cudaMalloc(&big, 2 << 20));
    EXPECT_EQ(old, big);
    CK(cudaIpcGetMemHandle(&h2, big));
    ASSERT_TRUE(c.send(h2));
    int r_while = -1, r_after = -1;
    ASSERT_TRUE(c.recv(&r_while));
    ASSERT_TRUE(c.recv(&r_after));
    EXPECT_EQ((int)cudaErrorAlreadyMapped, r_while);
    EXPECT_EQ(0, r_after);
    EXPECT_EQ(0, c.wait());
    CK(cudaFree(big));
}

// Rule 2: freeing memory another process still has open is counted.
TEST(EmuCudaRules, FreeWhileImportedIsCounted)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, 1 << 16));
    cudaIpcMemHandle_t handle;
    CK(cudaIpcGetMemHandle(&handle, d));
    unsigned long long f0 = weft_emu_cuda_counter("free_imported");
    {
        Child c("ipc_hold", {});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        ASSERT_EQ(0, r);
        CK(cudaFree(d));   // the child still maps it
        EXPECT_EQ(f0 + 1, weft_emu_cuda_counter("free_imported"));
        int go = 1;
        ASSERT_TRUE(c.send(go));
        unsigned char seen = 0;
        ASSERT_TRUE(c.recv(&seen));
        EXPECT_EQ(0, c.wait());
    }
    // Closed first, then freed: not counted.
    CK(cudaMalloc(&d, 1 << 16));
    CK(cudaIpcGetMemHandle(&handle, d));
    {
        Child c("ipc_open", {});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        EXPECT_EQ(0, r);
        EXPECT_EQ(0, c.wait());   // it closed and exited
    }
    CK(cudaFree(d));
    EXPECT_EQ(f0 + 1, weft_emu_cuda_counter("free_imported"));
}

// Rule 3: calls that synchronise the device wait for every stream of the
// device, a stream parked on a wait included; from a thread that declared
// it wakes streams, they fail at once instead (cudaErrorNotPermitted /
// CUDA_ERROR_NOT_PERMITTED, counter sync_refused) while the wait is not
// satisfied, and work again once it is.
TEST(EmuCudaRules, DeviceSynchronisingCalls)
{
    ParkWord pw;
    ASSERT_NE(pw.w, nullptr);
    void *held = nullptr;   // made before the stream parks: cudaMalloc would wait for it
    CK(cudaMalloc(&held, 4096));
    void *reg = std::malloc(8192);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DK(cuStreamWaitValue32(s, (CUdeviceptr)pw.w, 1, CU_STREAM_WAIT_VALUE_GEQ));

    // A waker thread: every listed call refused at once.
    unsigned long long refused0 = weft_emu_cuda_counter("sync_refused");
    std::vector<int> got;
    std::thread waker([&] {
        weft_emu_cuda_thread_wakes_streams();
        void *p = nullptr;
        FakeFatbin fb;
        CUmodule m = nullptr;
        got.push_back((int)cudaMalloc(&p, 1 << 20));
        got.push_back((int)cudaMallocHost(&p, 1 << 20));
        got.push_back((int)cudaHostAlloc(&p, 1 << 20, cudaHostAllocMapped));
        got.push_back((int)cudaHostRegister(reg, 8192, 0));
        got.push_back((int)cudaFree(held));
        got.push_back((int)cuModuleLoadData(&m, fb.b) == (int)CUDA_ERROR_NOT_PERMITTED ? (int)cudaErrorNotPermitted
                                                                                         : -1);
    });
    waker.join();
    EXPECT_EQ(6u, got.size());
    for (size_t i = 0; i < got.size(); i++)
        EXPECT_EQ((int)cudaErrorNotPermitted, got[i]) << "call " << i;
    EXPECT_EQ(refused0 + 6, weft_emu_cuda_counter("sync_refused"));

    // An application thread waits instead, until the word is written.
    double t0 = now_ms();
    std::thread releaser([&] {
        sleep_ms(150);
        pw.release();
    });
    void *p = nullptr;
    CK(cudaMalloc(&p, 1 << 20));
    double waited = now_ms() - t0;
    EXPECT_GE(waited, 100.0) << "cudaMalloc returned while a stream of the device was parked";
    releaser.join();
    // Satisfied now: the waker's calls work.
    std::thread waker2([&] {
        weft_emu_cuda_thread_wakes_streams();
        got.push_back((int)cudaFree(held));
    });
    waker2.join();
    EXPECT_EQ((int)cudaSuccess, got.back());
    CK(cudaFree(p));
    CK(cudaStreamDestroy(s));
    std::free(reg);
}

// Rule 4: weft's fatbin loads, its kernels run by name with the host's
// arithmetic; the rest is refused as a GPU would.
TEST(EmuCudaRules, ModulesAndKernels)
{
    FakeFatbin fb;
    CUmodule m = nullptr;
    CK(cudaSetDevice(0));   // a module loads into the current context
    EXPECT_EQ(CUDA_ERROR_NOT_SUPPORTED, cuModuleLoadData(&m, "not a fatbin"));
    DK(cuModuleLoadData(&m, fb.b));
    CUfunction f = nullptr, h = nullptr, nope = nullptr;
    DK(cuModuleGetFunction(&f, m, "weft_reduce_f32_sum"));
    DK(cuModuleGetFunction(&h, m, "weft_reduce_f16_max"));
    EXPECT_EQ(CUDA_ERROR_NOT_FOUND, cuModuleGetFunction(&nope, m, "some_other_kernel"));
    const unsigned long long n = 1000;
    void *a = nullptr, *b = nullptr, *d = nullptr;
    CK(cudaMalloc(&a, n * 4));
    CK(cudaMalloc(&b, n * 4));
    CK(cudaMalloc(&d, n * 4));
    std::vector<float> x(n), y(n), out(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)i * 0.5f;
        y[i] = 3.0f - (float)i;
    }
    CK(cudaMemcpy(a, x.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, y.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *params[] = {&d, &a, &b, (void *)&n};
    unsigned long long l0 = weft_emu_cuda_counter("launches");
    DK(cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, (CUstream)s, params, nullptr));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(out.data(), d, n * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) ASSERT_EQ(x[i] + y[i], out[i]) << i;
    EXPECT_EQ(l0 + 1, weft_emu_cuda_counter("launches"));
    // A 2-byte kernel given an odd address: a GPU faults (misaligned).
    void *odd = (char *)a + 1;
    void *oparams[] = {&d, &odd, &b, (void *)&n};
    EXPECT_EQ(CUDA_ERROR_MISALIGNED_ADDRESS, cuLaunchKernel(h, 4, 1, 1, 256, 1, 1, 0, (CUstream)s, oparams, nullptr));
    // Host memory is not reachable by a kernel here.
    void *host = x.data();
    void *hparams[] = {&d, &host, &b, (void *)&n};
    EXPECT_EQ(CUDA_ERROR_ILLEGAL_ADDRESS, cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, (CUstream)s, hparams, nullptr));
    // A stream of another device than the function's context.
    CK(cudaSetDevice(1));
    cudaStream_t s1;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaSetDevice(0));
    EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, (CUstream)s1, params, nullptr));
    // No current context on a fresh thread.
    CUresult fresh = CUDA_SUCCESS;
    std::thread t([&] { fresh = cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, (CUstream)s, params, nullptr); });
    t.join();
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, fresh);
    DK(cuModuleUnload(m));
    EXPECT_EQ(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload(m));
    CK(cudaStreamDestroy(s));
    CK(cudaStreamDestroy(s1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(d));
    // WEFT_EMU_CUDA_MODULES=0: no image for this GPU.
    Child c("modules_off", {"WEFT_EMU_CUDA_MODULES=0"});
    int r = -1;
    ASSERT_TRUE(c.recv(&r));
    EXPECT_EQ((int)CUDA_ERROR_NO_BINARY_FOR_GPU, r);
    EXPECT_EQ(0, c.wait());
}

// Rule 5: a host thread has no current context until cudaSetDevice,
// cuCtxPushCurrent or its first runtime call that needs one; the driver's
// pointer calls refuse without one.
TEST(EmuCudaRules, NoContextUntilBound)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, 4096));
    CUresult before = CUDA_SUCCESS, after = CUDA_ERROR_UNKNOWN, range = CUDA_SUCCESS, dev = CUDA_SUCCESS;
    std::thread t1([&] {
        unsigned int mt = 0;
        CUpointer_attribute at = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
        void *data[] = {&mt};
        int n = 0;
        cudaGetDeviceCount(&n);   // needs no context
        before = cuPointerGetAttributes(1, &at, data, (CUdeviceptr)d);
        CUdeviceptr b = 0;
        size_t s = 0;
        range = cuMemGetAddressRange(&b, &s, (CUdeviceptr)d);
        CUdevice cd;
        dev = cuCtxGetDevice(&cd);
        cudaPointerAttributes pa;
        cudaPointerGetAttributes(&pa, d);   // a runtime call that binds one
        after = cuPointerGetAttributes(1, &at, data, (CUdeviceptr)d);
    });
    t1.join();
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, before);
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, range);
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, dev);
    EXPECT_EQ(CUDA_SUCCESS, after);
    CUresult set = CUDA_ERROR_UNKNOWN, pushed = CUDA_ERROR_UNKNOWN, popped = CUDA_SUCCESS;
    CUresult legacy = CUDA_SUCCESS;
    std::thread t2([&] {
        unsigned int mt = 0;
        CUpointer_attribute at = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
        void *data[] = {&mt};
        CUcontext ctx = nullptr, out = nullptr;
        legacy = cuStreamGetCtx((CUstream)nullptr, &ctx);   // the legacy stream's context: none yet
        cudaSetDevice(0);
        set = cuPointerGetAttributes(1, &at, data, (CUdeviceptr)d);
        cuStreamGetCtx((CUstream)nullptr, &ctx);
        cuCtxPopCurrent(&out);   // nothing pushed: refused, the binding stays
        pushed = cuCtxPushCurrent(ctx);
        cuCtxPopCurrent(&out);
        popped = cuPointerGetAttributes(1, &at, data, (CUdeviceptr)d);
    });
    t2.join();
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, legacy);
    EXPECT_EQ(CUDA_SUCCESS, set);
    EXPECT_EQ(CUDA_SUCCESS, pushed);
    EXPECT_EQ(CUDA_SUCCESS, popped) << "pop restores the binding cudaSetDevice made";
    CUresult push_only = CUDA_ERROR_UNKNOWN, after_pop = CUDA_SUCCESS;
    CUcontext ctx0 = nullptr;
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    DK(cuStreamGetCtx((CUstream)s, &ctx0));
    std::thread t3([&] {
        unsigned int mt = 0;
        CUpointer_attribute at = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
        void *data[] = {&mt};
        CUcontext out = nullptr;
        cuCtxPushCurrent(ctx0);
        push_only = cuPointerGetAttributes(1, &at, data, (CUdeviceptr)d);
        cuCtxPopCurrent(&out);
        after_pop = cuPointerGetAttributes(1, &at, data, (CUdeviceptr)d);
    });
    t3.join();
    EXPECT_EQ(CUDA_SUCCESS, push_only);
    EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, after_pop) << "pop leaves the thread without a context again";
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d));
}

// Rule 6: an event is recorded only on a stream of its own device; waits
// and queries across devices are fine.
TEST(EmuCudaRules, EventAndStreamOnOneDevice)
{
    cudaEvent_t e1;
    cudaStream_t s0, s1;
    CK(cudaSetDevice(1));
    CK(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    unsigned long long r0 = weft_emu_cuda_counter("event_record_refused");
    EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventRecord(e1, s0));
    EXPECT_EQ(r0 + 1, weft_emu_cuda_counter("event_record_refused"));
    cudaGetLastError();
    CK(cudaEventRecord(e1, s1));
    CK(cudaStreamWaitEvent(s0, e1, 0));
    CK(cudaStreamSynchronize(s0));
    CK(cudaEventQuery(e1));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(s0));
    CK(cudaStreamDestroy(s1));
}

// Rule 7: cudaMemcpy from pageable memory to the device returns once the
// bytes are staged and lands later on the legacy stream; work on a
// non-blocking stream that reads it without a sync sees the old bytes.
TEST(EmuCudaRules, PageableHostToDeviceLandsLate)
{
    Child late("late_h2d", {"WEFT_EMU_CUDA_H2D_LATE_US=200000"});
    int stale = -1, synced = -1;
    ASSERT_TRUE(late.recv(&stale));
    ASSERT_TRUE(late.recv(&synced));
    EXPECT_EQ(1, stale) << "a non-blocking stream saw the copy before it could have landed";
    EXPECT_EQ(1, synced) << "after cudaDeviceSynchronize the copy is there";
    EXPECT_EQ(0, late.wait());
    Child off("late_h2d", {"WEFT_EMU_CUDA_H2D_LATE_US=0"});
    ASSERT_TRUE(off.recv(&stale));
    ASSERT_TRUE(off.recv(&synced));
    EXPECT_EQ(0, stale) << "WEFT_EMU_CUDA_H2D_LATE_US=0: lands at once";
    EXPECT_EQ(1, synced);
    EXPECT_EQ(0, off.wait());
}

// Rule 8: the legacy stream parked on a wait holds the blocking streams'
// later work and synchronous copies of any thread; non-blocking streams go on.
TEST(EmuCudaRules, ParkedLegacyStreamHoldsSynchronousCopies)
{
    ParkWord pw;
    ASSERT_NE(pw.w, nullptr);
    const size_t n = 4096;
    void *d = nullptr, *d2 = nullptr;
    CK(cudaMalloc(&d, n));
    CK(cudaMalloc(&d2, n));
    CK(cudaMemset(d, 7, n));
    CK(cudaMemset(d2, 7, n));
    CK(cudaDeviceSynchronize());
    cudaStream_t blocking, nonblocking;
    CK(cudaStreamCreate(&blocking));
    CK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
    DK(cuStreamWaitValue32((CUstream)nullptr, (CUdeviceptr)pw.w, 1, CU_STREAM_WAIT_VALUE_GEQ));
    std::vector<unsigned char> h(n, 0), h2(n, 0);
    double t0 = now_ms(), copy_ms = 0, nonblocking_ms = 0;
    std::thread other([&] {
        cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost);   // synchronous: on the legacy stream
        copy_ms = now_ms() - t0;
    });
    CK(cudaMemcpyAsync(h2.data(), d, n, cudaMemcpyDeviceToHost, nonblocking));
    CK(cudaStreamSynchronize(nonblocking));
    nonblocking_ms = now_ms() - t0;
    // A buffer of its own: the other thread's copy may be issued after this
    // memset (a thread start is slow under ASan), and then, as on a GPU, the
    // legacy-stream copy is ordered after the blocking stream's memset.
    CK(cudaMemsetAsync(d2, 9, n, blocking));   // behind the parked legacy stream
    sleep_ms(150);
    EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(blocking));
    pw.release();
    other.join();
    CK(cudaStreamSynchronize(blocking));
    EXPECT_LT(nonblocking_ms, 100.0);
    EXPECT_GE(copy_ms, 140.0) << "a synchronous copy of another thread went past the parked legacy stream";
    EXPECT_EQ(7, h[0]);
    EXPECT_EQ(7, h2[0]);
    unsigned char b = 0;
    CK(cudaMemcpy(&b, d2, 1, cudaMemcpyDeviceToHost));
    EXPECT_EQ(9, b) << "the blocking stream's memset ran once the legacy stream went on";
    CK(cudaStreamDestroy(blocking));
    CK(cudaStreamDestroy(nonblocking));
    CK(cudaFree(d));
    CK(cudaFree(d2));
}

// Rule 10: WEFT_EMU_CUDA_COMPUTE_MODE=exclusive_process: one process of the
// node per device; another's first context on it fails with
// cudaErrorDevicesUnavailable, on another device it works, and once the
// holder exited the device is free.
TEST(EmuCudaRules, ExclusiveProcessComputeMode)
{
    const std::vector<std::string> env = {"WEFT_EMU_CUDA_COMPUTE_MODE=exclusive_process", "WEFT_EMU_CUDA_NODE=57"};
    Child holder("excl", env);
    int dev = 0, r = -1;
    ASSERT_TRUE(holder.send(dev));
    ASSERT_TRUE(holder.recv(&r));
    ASSERT_EQ(0, r);
    {
        Child other("excl", env);
        ASSERT_TRUE(other.send(dev));
        ASSERT_TRUE(other.recv(&r));
        EXPECT_EQ((int)cudaErrorDevicesUnavailable, r);
        EXPECT_EQ(0, other.wait());
    }
    {
        Child other("excl", env);
        int dev1 = 1;
        ASSERT_TRUE(other.send(dev1));
        ASSERT_TRUE(other.recv(&r));
        EXPECT_EQ(0, r);
        EXPECT_EQ(0, other.wait());
    }
    EXPECT_EQ(0, holder.wait());
    {
        Child again("excl", env);
        ASSERT_TRUE(again.send(dev));
        ASSERT_TRUE(again.recv(&r));
        EXPECT_EQ(0, r) << "the holder exited: the device is free";
        EXPECT_EQ(0, again.wait());
    }
}

// Handles of this very process are refused, whichever thread asks.
TEST(EmuCudaRules, OwnHandleRefusedOnAnyThread)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, 4096));
    cudaIpcMemHandle_t h;
    CK(cudaIpcGetMemHandle(&h, d));
    cudaError_t e = cudaSuccess;
    std::thread t([&] {
        void *p = nullptr;
        cudaSetDevice(1);
        e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    });
    t.join();
    EXPECT_EQ(cudaErrorDeviceUninitialized, e);
    CK(cudaFree(d));
}

// ---------------------------------------------------------------- IPC

TEST(EmuCudaIpc, DataBothWays)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, kIpcBytes));
    std::vector<unsigned char> h(kDataLen);
    for (size_t i = 0; i < kDataLen; i++) h[i] = pattern(i, 3);
    CK(cudaMemset(d, 0, kIpcBytes));
    CK(cudaMemcpy((char *)d + kData, h.data(), kDataLen, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());  // a pageable H2D copy lands late
    cudaIpcMemHandle_t handle;
    CK(cudaIpcGetMemHandle(&handle, d));

    Child c("ipc_data", {});
    ASSERT_TRUE(c.send(handle));
    int rc = -1;
    ASSERT_TRUE(c.recv(&rc));
    ASSERT_EQ(0, rc) << cudaGetErrorName((cudaError_t)rc);
    int seen_ok = 0, import_faults = -2;
    ASSERT_TRUE(c.recv(&seen_ok));
    EXPECT_EQ(1, seen_ok) << "the child did not see the parent's data";
    ASSERT_TRUE(c.recv(&import_faults));
    EXPECT_EQ(1, import_faults) << "a host read of the imported device pointer did not fault";
    EXPECT_EQ(0, c.wait());
    // The child wrote its answer into the same memory.
    CK(cudaMemcpy(h.data(), (char *)d + kData2, kDataLen, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < kDataLen; i++) bad += h[i] != pattern(i, 4);
    EXPECT_EQ(0u, bad);
    CK(cudaFree(d));
}

TEST(EmuCudaIpc, StreamSemaphoresAcrossProcesses)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, kIpcBytes));
    CK(cudaMemset(d, 0, kIpcBytes));
    CK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t handle;
    CK(cudaIpcGetMemHandle(&handle, d));
    Child c("ipc_sem", {});
    ASSERT_TRUE(c.send(handle));
    int rc = -1;
    ASSERT_TRUE(c.recv(&rc));  // the child opened it and queued its wait
    ASSERT_EQ(0, rc) << cudaGetErrorName((cudaError_t)rc);
    sleep_ms(100);
    unsigned int answer = 7;
    CK(cudaMemcpy(&answer, (char *)d + 4, 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(0u, answer) << "the child's stream did not wait";

    std::vector<unsigned char> h(kDataLen);
    for (size_t i = 0; i < kDataLen; i++) h[i] = pattern(i, 5);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMemcpyAsync((char *)d + kData, h.data(), kDataLen, cudaMemcpyHostToDevice, s));
    DK(cuStreamWriteValue32(s, (CUdeviceptr)d, 1, 0));  // post to the child
    DK(cuStreamWaitValue32(s, (CUdeviceptr)d + 4, 1, CU_STREAM_WAIT_VALUE_EQ));  // its answer
    std::vector<unsigned char> back(kDataLen, 0);
    CK(cudaMemcpyAsync(back.data(), (char *)d + kData2, kDataLen, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    size_t bad = 0;
    for (size_t i = 0; i < kDataLen; i++) bad += back[i] != pattern(i, 6);
    EXPECT_EQ(0u, bad);
    int child_ok = 0;
    ASSERT_TRUE(c.recv(&child_ok));
    EXPECT_EQ(1, child_ok) << "the child read data before the semaphore";
    EXPECT_EQ(0, c.wait());
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d));
}

TEST(EmuCudaIpc, Refusals)
{
    void *d = nullptr;
    CK(cudaMalloc(&d, 1 << 16));
    cudaIpcMemHandle_t handle;
    CK(cudaIpcGetMemHandle(&handle, d));
    void *p = nullptr;
    // In the exporting process itself.
    EXPECT_EQ(cudaErrorDeviceUninitialized, cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
    // Not a device allocation base.
    std::vector<char> host(64);
    cudaIpcMemHandle_t other;
    EXPECT_EQ(cudaErrorInvalidValue, cudaIpcGetMemHandle(&other, host.data()));
    EXPECT_EQ(cudaErrorInvalidValue, cudaIpcGetMemHandle(&other, (char *)d + 64));
    void *pin = nullptr;
    CK(cudaMallocHost(&pin, 4096));
    EXPECT_EQ(cudaErrorInvalidValue, cudaIpcGetMemHandle(&other, pin));
    CK(cudaFreeHost(pin));
    EXPECT_EQ(cudaErrorInvalidValue, cudaIpcCloseMemHandle(d));
    // A garbage handle.
    memset(&other, 0x5a, sizeof(other));
    EXPECT_EQ(cudaErrorInvalidValue, cudaIpcOpenMemHandle(&p, other, cudaIpcMemLazyEnablePeerAccess));

    // Opened twice in one process: refused (cudaErrorAlreadyMapped) ...
    {
        Child c("ipc_twice", {});
        ASSERT_TRUE(c.send(handle));
        int r1 = -1, r2 = -1, same = -1, rclose = -1;
        ASSERT_TRUE(c.recv(&r1));
        ASSERT_TRUE(c.recv(&r2));
        ASSERT_TRUE(c.recv(&same));
        ASSERT_TRUE(c.recv(&rclose));
        EXPECT_EQ(0, r1);
        EXPECT_EQ((int)cudaErrorAlreadyMapped, r2);
        EXPECT_EQ(0, rclose);
        EXPECT_EQ(0, c.wait());
    }
    // ... or, with WEFT_EMU_CUDA_IPC_REOPEN=refcount, the same pointer again.
    {
        Child c("ipc_twice", {"WEFT_EMU_CUDA_IPC_REOPEN=refcount"});
        ASSERT_TRUE(c.send(handle));
        int r1 = -1, r2 = -1, same = -1, rclose = -1;
        ASSERT_TRUE(c.recv(&r1));
        ASSERT_TRUE(c.recv(&r2));
        ASSERT_TRUE(c.recv(&same));
        ASSERT_TRUE(c.recv(&rclose));
        EXPECT_EQ(0, r1);
        EXPECT_EQ(0, r2);
        EXPECT_EQ(1, same);
        EXPECT_EQ(0, rclose);
        EXPECT_EQ(0, c.wait());
    }
    // From another emulated node.
    {
        Child c("ipc_open", {"WEFT_EMU_CUDA_NODE=1"});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        EXPECT_EQ((int)cudaErrorInvalidResourceHandle, r);
        EXPECT_EQ(0, c.wait());
    }
    // Same node, explicitly: works.
    {
        Child c("ipc_open", {"WEFT_EMU_CUDA_NODE=0"});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        EXPECT_EQ(0, r);
        EXPECT_EQ(0, c.wait());
    }
    // WEFT_EMU_CUDA_NODE=auto: the node WEFT_VIRTUAL_NODES gives the rank.
    {
        Child c("ipc_open", {"WEFT_EMU_CUDA_NODE=auto", "WEFT_VIRTUAL_NODES=2", "OMPI_COMM_WORLD_RANK=3",
                             "OMPI_COMM_WORLD_SIZE=4"});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        EXPECT_EQ((int)cudaErrorInvalidResourceHandle, r);
        EXPECT_EQ(0, c.wait());
    }
    {
        Child c("ipc_open", {"WEFT_EMU_CUDA_NODE=auto", "WEFT_VIRTUAL_NODES=2", "OMPI_COMM_WORLD_RANK=1",
                             "OMPI_COMM_WORLD_SIZE=4"});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        EXPECT_EQ(0, r);
        EXPECT_EQ(0, c.wait());
    }
    {  // WEFT_VIRTUAL_NODES alone implies auto
        Child c("ipc_open", {"WEFT_VIRTUAL_NODES=4", "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4"});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        EXPECT_EQ((int)cudaErrorInvalidResourceHandle, r);
        EXPECT_EQ(0, c.wait());
    }
    // Into device 1 when devices 0 and 1 cannot reach each other.
    {
        Child c("ipc_open_dev1", {"WEFT_EMU_CUDA_NO_PEER=0-1"});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        EXPECT_EQ((int)cudaErrorPeerAccessUnsupported, r);
        EXPECT_EQ(0, c.wait());
    }
    {
        Child c("ipc_open_dev1", {});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        EXPECT_EQ(0, r);
        EXPECT_EQ(0, c.wait());
    }
    // After the exporter freed the memory (even when the address is reused).
    CK(cudaFree(d));
    void *again = nullptr;
    CK(cudaMalloc(&again, 1 << 16));
    EXPECT_EQ(d, again);
    {
        Child c("ipc_open", {});
        ASSERT_TRUE(c.send(handle));
        int r = -1;
        ASSERT_TRUE(c.recv(&r));
        EXPECT_EQ((int)cudaErrorInvalidResourceHandle, r);
        EXPECT_EQ(0, c.wait());
    }
    CK(cudaFree(again));
    cudaGetLastError();
}

TEST(EmuCudaIpc, ImportOutlivesExporterFree)
{
    // Real GPUs keep imported memory alive until the importer closes it.
    void *d = nullptr;
    CK(cudaMalloc(&d, 1 << 16));
    CK(cudaMemset(d, 0x77, 1 << 16));
    cudaIpcMemHandle_t handle;
    CK(cudaIpcGetMemHandle(&handle, d));
    Child c("ipc_hold", {});
    ASSERT_TRUE(c.send(handle));
    int r = -1;
    ASSERT_TRUE(c.recv(&r));
    ASSERT_EQ(0, r);
    CK(cudaFree(d));
    void *reuse = nullptr;
    CK(cudaMalloc(&reuse, 1 << 16));
    CK(cudaMemset(reuse, 0x11, 1 << 16));
    CK(cudaDeviceSynchronize());
    int go = 1;
    ASSERT_TRUE(c.send(go));
    unsigned char seen = 0;
    ASSERT_TRUE(c.recv(&seen));
    EXPECT_EQ(0x77, seen);
    EXPECT_EQ(0, c.wait());
    CK(cudaFree(reuse));
}

// ---------------------------------------------------------------- child roles

namespace {

int child_info_role()
{
    int n = -1;
    cudaError_t rc = cudaGetDeviceCount(&n);
    printf("rc=%d\ncount=%d\nnode=%llu\n", (int)rc, n, weft_emu_cuda_counter("node"));
    void *p = nullptr;
    printf("malloc=%d\n", (int)cudaMalloc(&p, 64));
    if (p) cudaFree(p);
    p = nullptr;
    printf("big=%d\n", (int)cudaMalloc(&p, 4 << 20));
    if (p) cudaFree(p);
    int gdr = -1;
    cudaDeviceGetAttribute(&gdr, cudaDevAttrGPUDirectRDMASupported, 0);
    printf("gdr=%d\n", gdr);
    for (int d = 0; d < n; d++) {
        char bus[32] = "";
        cudaDeviceGetPCIBusId(bus, sizeof(bus), d);
        cudaDeviceProp prop;
        cudaGetDeviceProperties(&prop, d);
        printf("bus%d=%s\npcibus%d=%d\nuuid%d=", d, bus, d, prop.pciBusID, d);
        for (int i = 0; i < 16; i++) printf("%02x", (unsigned char)prop.uuid.bytes[i]);
        printf("\n");
        for (int e = 0; e < n; e++) {
            int can = -1;
            cudaDeviceCanAccessPeer(&can, d, e);
            printf("peer%d_%d=%d\n", d, e, can);
        }
    }
    if (n >= 2) {
        cudaSetDevice(0);
        printf("enable0_1=%d\n", (int)cudaDeviceEnablePeerAccess(1, 0));
    }
    fflush(stdout);
    return 0;
}

// WEFT_EMU_CUDA_GDR=1: dma-buf export. Returns 0, or 1 after printing the
// failed check to stdout.
int child_dmabuf_role()
{
#define DB_CHECK(c)                                                      \
    do {                                                                 \
        if (!(c)) {                                                      \
            printf("check failed: %s (line %d)\n", #c, __LINE__);        \
            return 1;                                                    \
        }                                                                \
    } while (0)
    auto run = [&]() -> int {
        int v = -1;
        DB_CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 1) == CUDA_SUCCESS && v == 1);
        DB_CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0) == CUDA_SUCCESS && v == 1);
        DB_CHECK(cudaDeviceGetAttribute(&v, (cudaDeviceAttr)CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0) == cudaSuccess &&
                 v == 1);
        DB_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrGPUDirectRDMASupported, 0) == cudaSuccess && v == 1);
        const size_t n = (1 << 20) + 100, mapped = (1 << 20) + 4096;
        std::vector<unsigned char> src(n), back(n);
        for (size_t i = 0; i < n; i++) src[i] = pattern(i, 11);
        void *d = nullptr;
        DB_CHECK(cudaMalloc(&d, n) == cudaSuccess);
        DB_CHECK(cudaMemcpy(d, src.data(), n, cudaMemcpyHostToDevice) == cudaSuccess);
        // From pageable memory the copy lands later: wait for it.
        DB_CHECK(cudaDeviceSynchronize() == cudaSuccess);
        CUdeviceptr dp = (CUdeviceptr)d;
        const CUmemRangeHandleType dmabuf = CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
        // The whole allocation, up to its page-rounded end: a mappable fd
        // with the data, sharing the memory both ways.
        int fd = -1;
        DB_CHECK(cuMemGetHandleForAddressRange(&fd, dp, mapped, dmabuf, 0) == CUDA_SUCCESS && fd >= 0);
        unsigned char *m = (unsigned char *)mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        DB_CHECK(m != MAP_FAILED);
        DB_CHECK(memcmp(m, src.data(), n) == 0);
        memset(m + 200, 0xd7, 50);
        DB_CHECK(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost) == cudaSuccess);
        DB_CHECK(back[199] == src[199] && back[200] == 0xd7 && back[249] == 0xd7 && back[250] == src[250]);
        munmap(m, mapped);
        // An interior, page-aligned range; another descriptor each time;
        // the PCIe mapping flag is accepted.
        int fd2 = -1, fd3 = -1;
        DB_CHECK(cuMemGetHandleForAddressRange(&fd2, dp + 65536, 131072, dmabuf, 0) == CUDA_SUCCESS && fd2 >= 0 &&
                 fd2 != fd);
        DB_CHECK(cuMemGetHandleForAddressRange(&fd3, dp + 4096, 4096, dmabuf,
                                               CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) == CUDA_SUCCESS);
        close(fd);
        close(fd2);
        close(fd3);
        // Refusals: unaligned start or size, past the end, not device
        // memory, unknown flags or handle type.
        int bad = -1;
        DB_CHECK(cuMemGetHandleForAddressRange(&bad, dp + 100, 4096, dmabuf, 0) == CUDA_ERROR_INVALID_VALUE);
        DB_CHECK(cuMemGetHandleForAddressRange(&bad, dp, 4000, dmabuf, 0) == CUDA_ERROR_INVALID_VALUE);
        // The allocation shares a 2 MiB block (the first of this process:
        // it starts the block); a range may cover the block, not more.
        const size_t block = 2 << 20;
        CUdeviceptr blk = 0;
        DB_CHECK(cuPointerGetAttribute(&blk, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, dp) == CUDA_SUCCESS && blk == dp);
        DB_CHECK(cuMemGetHandleForAddressRange(&fd3, dp, block, dmabuf, 0) == CUDA_SUCCESS);
        close(fd3);
        DB_CHECK(cuMemGetHandleForAddressRange(&bad, dp, block + 4096, dmabuf, 0) == CUDA_ERROR_INVALID_VALUE);
        DB_CHECK(cuMemGetHandleForAddressRange(&bad, dp + 4096, block, dmabuf, 0) == CUDA_ERROR_INVALID_VALUE);
        DB_CHECK(cuMemGetHandleForAddressRange(&bad, dp, 4096, dmabuf, 2) == CUDA_ERROR_INVALID_VALUE);
        DB_CHECK(cuMemGetHandleForAddressRange(&bad, dp, 4096, (CUmemRangeHandleType)2, 0) ==
                 CUDA_ERROR_INVALID_VALUE);
        DB_CHECK(cuMemGetHandleForAddressRange(nullptr, dp, 4096, dmabuf, 0) == CUDA_ERROR_INVALID_VALUE);
        void *pin = nullptr;
        DB_CHECK(cudaMallocHost(&pin, 8192) == cudaSuccess);
        DB_CHECK(cuMemGetHandleForAddressRange(&bad, (CUdeviceptr)pin, 4096, dmabuf, 0) == CUDA_ERROR_INVALID_VALUE);
        cudaFreeHost(pin);
        DB_CHECK(bad == -1);
        DB_CHECK(cudaFree(d) == cudaSuccess);
        DB_CHECK(cuMemGetHandleForAddressRange(&bad, dp, 4096, dmabuf, 0) == CUDA_ERROR_INVALID_VALUE);
        return 0;
    };
#undef DB_CHECK
    int rc = run();
    fflush(stdout);
    return rc;
}

// ipc_block: open x's handle, then y's (same block), read y through x's
// mapping at the distance the parent sent.
int child_ipc_block()
{
    cudaIpcMemHandle_t hx, hy;
    long long dist = 0;
    if (!read_all(0, &hx, sizeof(hx)) || !read_all(0, &hy, sizeof(hy)) || !read_all(0, &dist, sizeof(dist)))
        return 2;
    void *px = nullptr, *py = nullptr;
    int r1 = (int)cudaIpcOpenMemHandle(&px, hx, cudaIpcMemLazyEnablePeerAccess);
    int r2 = (int)cudaIpcOpenMemHandle(&py, hy, cudaIpcMemLazyEnablePeerAccess);
    int seen = -1;
    if (r1 == 0) {
        unsigned char b = 0;
        if (cudaMemcpy(&b, (char *)px + dist, 1, cudaMemcpyDeviceToHost) == cudaSuccess) seen = b;
    }
    write_all(1, &r1, sizeof(r1));
    write_all(1, &r2, sizeof(r2));
    write_all(1, &seen, sizeof(seen));
    if (r2 == 0 && cudaIpcCloseMemHandle(py) != cudaSuccess) return 3;
    if (r1 == 0 && cudaIpcCloseMemHandle(px) != cudaSuccess) return 4;
    return 0;
}

// ipc_realloc: open h1; then h2 (a new block at h1's addresses) while h1
// is open, and again after closing h1.
int child_ipc_realloc()
{
    cudaIpcMemHandle_t h1, h2;
    if (!read_all(0, &h1, sizeof(h1))) return 2;
    void *p1 = nullptr, *p2 = nullptr;
    int r = (int)cudaIpcOpenMemHandle(&p1, h1, cudaIpcMemLazyEnablePeerAccess);
    write_all(1, &r, sizeof(r));
    if (r != 0) return 0;
    if (!read_all(0, &h2, sizeof(h2))) return 3;
    int r_while = (int)cudaIpcOpenMemHandle(&p2, h2, cudaIpcMemLazyEnablePeerAccess);
    if (r_while == 0) cudaIpcCloseMemHandle(p2);
    if (cudaIpcCloseMemHandle(p1) != cudaSuccess) return 4;
    int r_after = (int)cudaIpcOpenMemHandle(&p2, h2, cudaIpcMemLazyEnablePeerAccess);
    write_all(1, &r_while, sizeof(r_while));
    write_all(1, &r_after, sizeof(r_after));
    if (r_after == 0 && cudaIpcCloseMemHandle(p2) != cudaSuccess) return 5;
    return 0;
}

// modules_off: what loading weft's fatbin returns.
int child_modules_off()
{
    FakeFatbin fb;
    CUmodule m = nullptr;
    if (cudaSetDevice(0) != cudaSuccess) return 2;
    int r = (int)cuModuleLoadData(&m, fb.b);
    write_all(1, &r, sizeof(r));
    return 0;
}

// late_h2d: a pageable H2D cudaMemcpy, then a read on a non-blocking stream
// without a sync (stale: 1 when it still saw the old bytes), then after
// cudaDeviceSynchronize (synced: 1 when the new bytes are there).
int child_late_h2d()
{
    const size_t n = 4096;
    void *d = nullptr;
    if (cudaMalloc(&d, n) != cudaSuccess) return 2;
    if (cudaMemset(d, 1, n) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 3;
    std::vector<unsigned char> src(n, 2), back(n, 0);
    if (cudaMemcpy(d, src.data(), n, cudaMemcpyHostToDevice) != cudaSuccess) return 4;
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 5;
    if (cudaMemcpyAsync(back.data(), d, n, cudaMemcpyDeviceToHost, s) != cudaSuccess) return 6;
    if (cudaStreamSynchronize(s) != cudaSuccess) return 7;
    int stale = back[0] == 1 ? 1 : 0;
    if (cudaDeviceSynchronize() != cudaSuccess) return 8;
    if (cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost) != cudaSuccess) return 9;
    int synced = back[0] == 2 && back[n - 1] == 2 ? 1 : 0;
    write_all(1, &stale, sizeof(stale));
    write_all(1, &synced, sizeof(synced));
    cudaStreamDestroy(s);
    cudaFree(d);
    return 0;
}

// excl: cudaSetDevice(dev) and its result; holds the device until the
// parent closes stdin.
int child_excl()
{
    int dev = -1;
    if (!read_all(0, &dev, sizeof(dev))) return 2;
    int r = (int)cudaSetDevice(dev);
    if (r == 0) {
        void *p = nullptr;   // a call that needs the context
        r = (int)cudaMalloc(&p, 64);
        if (p) cudaFree(p);
    }
    write_all(1, &r, sizeof(r));
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}

int child_ipc(const char *role)
{
    cudaIpcMemHandle_t handle;
    if (!read_all(0, &handle, sizeof(handle))) return 2;
    void *p = nullptr;
    if (strcmp(role, "ipc_open_dev1") == 0) {
        if (cudaSetDevice(1) != cudaSuccess) return 18;
        role = "ipc_open";
    }
    int rc = (int)cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
    if (strcmp(role, "ipc_open") == 0) {
        write_all(1, &rc, sizeof(rc));
        if (rc == 0 && cudaIpcCloseMemHandle(p) != cudaSuccess) return 3;
        return 0;
    }
    if (strcmp(role, "ipc_twice") == 0) {
        void *q = nullptr;
        int rc2 = (int)cudaIpcOpenMemHandle(&q, handle, cudaIpcMemLazyEnablePeerAccess);
        int same = rc2 == 0 && q == p;
        int rclose = (int)cudaIpcCloseMemHandle(p);
        if (rc2 == 0 && rclose == 0) rclose = (int)cudaIpcCloseMemHandle(q);
        // All closed now.
        if (rclose == 0 && cudaIpcCloseMemHandle(p) != cudaErrorInvalidValue) rclose = -1;
        write_all(1, &rc, sizeof(rc));
        write_all(1, &rc2, sizeof(rc2));
        write_all(1, &same, sizeof(same));
        write_all(1, &rclose, sizeof(rclose));
        return 0;
    }
    write_all(1, &rc, sizeof(rc));
    if (rc != 0) return 0;
    char *base = static_cast<char *>(p);
    if (strcmp(role, "ipc_hold") == 0) {
        int go = 0;
        if (!read_all(0, &go, sizeof(go))) return 4;
        unsigned char seen = 0;
        if (cudaMemcpy(&seen, base + 100, 1, cudaMemcpyDeviceToHost) != cudaSuccess) return 5;
        write_all(1, &seen, 1);
        return cudaIpcCloseMemHandle(p) == cudaSuccess ? 0 : 6;
    }
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, base + 10) != cudaSuccess || a.type != cudaMemoryTypeDevice) return 7;
    CUdeviceptr rb = 0;
    size_t rs = 0;
    if (cuMemGetAddressRange(&rb, &rs, (CUdeviceptr)base + 10) != CUDA_SUCCESS || rb != (CUdeviceptr)base ||
        rs != kIpcBytes)
        return 8;
    std::vector<unsigned char> h(kDataLen), mine(kDataLen);
    for (size_t i = 0; i < kDataLen; i++) mine[i] = pattern(i, strcmp(role, "ipc_sem") == 0 ? 6 : 4);
    int ok = 1;
    if (strcmp(role, "ipc_data") == 0) {
        if (cudaMemcpy(h.data(), base + kData, kDataLen, cudaMemcpyDeviceToHost) != cudaSuccess) return 9;
        for (size_t i = 0; i < kDataLen; i++) ok &= h[i] == pattern(i, 3);
        write_all(1, &ok, sizeof(ok));
        int faults = host_access_faults(base + kData, false);
        write_all(1, &faults, sizeof(faults));
        if (cudaMemcpy(base + kData2, mine.data(), kDataLen, cudaMemcpyHostToDevice) != cudaSuccess) return 10;
    } else {  // ipc_sem: wait for the parent's post, read, answer, post back
        cudaStream_t s;
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 11;
        if (cuStreamWaitValue32(s, (CUdeviceptr)base, 1, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) return 12;
        if (cudaMemcpyAsync(h.data(), base + kData, kDataLen, cudaMemcpyDeviceToHost, s) != cudaSuccess) return 13;
        if (cudaMemcpyAsync(base + kData2, mine.data(), kDataLen, cudaMemcpyHostToDevice, s) != cudaSuccess)
            return 14;
        if (cuStreamWriteValue32(s, (CUdeviceptr)base + 4, 1, 0) != CUDA_SUCCESS) return 15;
        if (cudaStreamSynchronize(s) != cudaSuccess) return 16;
        for (size_t i = 0; i < kDataLen; i++) ok &= h[i] == pattern(i, 5);
        write_all(1, &ok, sizeof(ok));
        cudaStreamDestroy(s);
    }
    return cudaIpcCloseMemHandle(p) == cudaSuccess ? 0 : 17;
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--emu-child") == 0) {
        if (strcmp(argv[2], "info") == 0) return child_info_role();
        if (strcmp(argv[2], "dmabuf") == 0) return child_dmabuf_role();
        if (strcmp(argv[2], "ipc_block") == 0) return child_ipc_block();
        if (strcmp(argv[2], "ipc_realloc") == 0) return child_ipc_realloc();
        if (strcmp(argv[2], "modules_off") == 0) return child_modules_off();
        if (strcmp(argv[2], "late_h2d") == 0) return child_late_h2d();
        if (strcmp(argv[2], "excl") == 0) return child_excl();
        return child_ipc(argv[2]);
    }
    // The in-process tests expect the defaults; children get their own knobs.
    for (const char *v : {"WEFT_EMU_CUDA_DEVICES", "WEFT_EMU_CUDA_BUSIDS", "WEFT_EMU_CUDA_NO_PEER",
                          "WEFT_EMU_CUDA_NODE", "WEFT_EMU_CUDA_MEM", "WEFT_EMU_CUDA_IPC_REOPEN", "WEFT_EMU_CUDA_GDR",
                          "WEFT_VIRTUAL_NODES"})
        unsetenv(v);
    signal(SIGPIPE, SIG_IGN);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
