// sync_probe: which CUDA calls wait for the device while a stream is parked
// on cuStreamWaitValue32 of a mapped host word (docs/testing.md, "A GPU
// machine without a package manager"; review B1-B5, D1). weft's stream
// engine parks the application's stream on such a word that only weft's
// progress thread writes: any call on that thread that waits for the
// device then waits for itself. Per call X and per parked stream (a
// non-blocking stream, or the legacy default stream), in a process of its
// own: park the stream, call X from a second thread, give it 4 s, then write
// the word from the main thread and print
//   RESULT <X> <parked stream>: returned (<ms>, <result>)
//   RESULT <X> <parked stream>: blocked (> 4000 ms; returned <ms> after the word was written, <result>)
// Controls: devicesync must block, eventquery must not. ptrattr_fresh_thread
// calls cuPointerGetAttributes from a thread that never called the runtime
// (CUDA_ERROR_INVALID_CONTEXT there would make weft classify device memory
// as host: review D1).
//
//   sync_probe --all [--jobs N]        every X x both streams, each its own process (N at once, default 8)
//   sync_probe --park nonblocking|legacy --call X   one of them
//   sync_probe --list                  the calls
// Exit 0 when it ran (whatever CUDA answered), 2 when there is no usable device.
//
// Build (two lines: the tiny module that cuModuleLoadData loads, then the
// probe with that fatbin embedded by .incbin; driver calls through
// cudaGetDriverEntryPointByVersion, so no -lcuda):
//   nvcc -fatbin -arch=sm_90 -DSYNC_PROBE_MODULE -o /tmp/sync_module.fatbin scripts/gpu/sync_probe.cu
//   nvcc -arch=sm_90 -O2 -DSYNC_PROBE_FATBIN='"/tmp/sync_module.fatbin"' -o sync_probe scripts/gpu/sync_probe.cu -lpthread
#ifdef SYNC_PROBE_MODULE
// The module: one trivial kernel.
extern "C" __global__ void sync_probe_kernel(int *p)
{
    if (p) *p = 1;
}
#else
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#ifndef SYNC_PROBE_FATBIN
#error "build with -DSYNC_PROBE_FATBIN='\"<absolute path of the module fatbin>\"' (see the header)"
#endif
#ifndef __CUDA_ARCH__
// The module's fatbin, embedded at build time.
__asm__(".section .rodata\n.balign 16\n.globl sync_probe_fatbin\nsync_probe_fatbin:\n.incbin \"" SYNC_PROBE_FATBIN
        "\"\n.globl sync_probe_fatbin_end\nsync_probe_fatbin_end:\n.byte 0\n.previous\n");
#endif
extern "C" const unsigned char sync_probe_fatbin[], sync_probe_fatbin_end[];

static const char *calls[] = {
    "mod_load",             // cuModuleLoadData + the first cuModuleGetFunction
    "malloc_1m", "malloc_4m", "free", "mallochost_1m", "freehost", "hostregister",
    "streamcreate", "eventcreate", "ipc_open", "ipc_close",
    "memcpy_h2d_pageable", "memcpy_h2d_pinned", "memset",
    "devicesync",           // control: must block
    "eventquery",           // control: must not block
    "ptrattr_fresh_thread", // cuPointerGetAttributes from a thread that never called the runtime
};

typedef CUresult (*pfn_wait_t)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*pfn_load_t)(CUmodule *, const void *);
typedef CUresult (*pfn_getfn_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*pfn_attrs_t)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);

static void *entry(const char *name)
{
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
        printf("  entry point %s: %s (query %d)\n", name, cudaGetErrorName(e), (int)q);
        return nullptr;
    }
    return fn;
}

static double ms_since(std::chrono::steady_clock::time_point t)
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// A process that exports a 1 MiB allocation: prints its handle in hex, then
// keeps it alive until its stdin closes.
static int ipc_helper()
{
    void *p = nullptr;
    cudaIpcMemHandle_t h;
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&p, 1 << 20) != cudaSuccess ||
        cudaIpcGetMemHandle(&h, p) != cudaSuccess) {
        printf("ERR\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof h; i++) printf("%02x", ((unsigned char *)&h)[i]);
    printf("\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}

struct Helper {
    pid_t pid = -1;
    int to = -1;
    cudaIpcMemHandle_t h{};
    bool ok = false;
};

static Helper start_helper()
{
    Helper hp;
    int in[2], out[2];
    if (pipe(in) || pipe(out)) return hp;
    fflush(stdout);
    hp.pid = fork();
    if (hp.pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execl("/proc/self/exe", "sync_probe", "--ipc-helper", (char *)nullptr);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    hp.to = in[1];
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
    close(out[0]);
    if (line.size() == 2 * sizeof hp.h) {
        for (size_t i = 0; i < sizeof hp.h; i++) {
            unsigned v;
            sscanf(line.c_str() + 2 * i, "%2x", &v);
            ((unsigned char *)&hp.h)[i] = (unsigned char)v;
        }
        hp.ok = true;
    }
    return hp;
}

// One call X with the stream of kind `park` parked.
static int one(const std::string &park, const std::string &x)
{
    alarm(20);   // a call that never returns, even after the word is written
    auto tag = x + " [parked: " + park + "]";
    if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
        printf("RESULT %s: not run (no context: %s)\n", tag.c_str(), cudaGetErrorName(cudaGetLastError()));
        return 0;
    }
    auto p_wait = (pfn_wait_t)entry("cuStreamWaitValue32");
    auto p_load = (pfn_load_t)entry("cuModuleLoadData");
    auto p_getfn = (pfn_getfn_t)entry("cuModuleGetFunction");
    auto p_attrs = (pfn_attrs_t)entry("cuPointerGetAttributes");
    if (!p_wait) {
        printf("RESULT %s: not run (no cuStreamWaitValue32)\n", tag.c_str());
        return 0;
    }

    // What X needs, made before the stream is parked.
    const size_t mib = 1 << 20;
    void *dev = nullptr, *pinned = nullptr, *opened = nullptr;
    void *pageable = aligned_alloc(4096, mib);
    memset(pageable, 1, mib);
    cudaMalloc(&dev, mib);
    cudaMallocHost(&pinned, mib);
    Helper hp;
    if (x == "ipc_open" || x == "ipc_close") {
        hp = start_helper();
        if (!hp.ok) {
            printf("RESULT %s: not run (the exporting helper process failed)\n", tag.c_str());
            return 0;
        }
        if (x == "ipc_close") {
            cudaError_t e = cudaIpcOpenMemHandle(&opened, hp.h, cudaIpcMemLazyEnablePeerAccess);
            if (e != cudaSuccess) {
                printf("RESULT %s: not run (cudaIpcOpenMemHandle before parking: %s)\n", tag.c_str(), cudaGetErrorName(e));
                return 0;
            }
        }
    }

    // The mapped host word and the parked stream.
    volatile unsigned *word = nullptr;
    void *dword = nullptr;
    cudaError_t e = cudaHostAlloc((void **)&word, 4096, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e == cudaSuccess) e = cudaHostGetDevicePointer(&dword, (void *)word, 0);
    if (e != cudaSuccess) {
        printf("RESULT %s: not run (mapped host word: %s)\n", tag.c_str(), cudaGetErrorName(e));
        return 0;
    }
    *word = 0;
    cudaStream_t s = cudaStreamLegacy;
    if (park == "nonblocking") cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    CUstream cs = park == "legacy" ? CU_STREAM_LEGACY : (CUstream)s;
    CUresult r = p_wait(cs, (CUdeviceptr)dword, 1, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
        printf("RESULT %s: not run (cuStreamWaitValue32 -> %d)\n", tag.c_str(), (int)r);
        return 0;
    }
    cudaEvent_t after;   // recorded behind the wait: not complete while parked
    cudaEventCreateWithFlags(&after, cudaEventDisableTiming);
    cudaEventRecord(after, s);
    cudaError_t q = cudaStreamQuery(s);
    printf("  parked: cuStreamWaitValue32 -> 0, cudaStreamQuery -> %s\n", cudaGetErrorName(q));

    std::atomic<bool> done{false};
    std::string result = "?";
    double x_ms = 0;
    std::chrono::steady_clock::time_point t_ret;
    std::thread t([&] {
        // A runtime thread, as weft's progress thread is (it binds the
        // primary context first); the fresh-thread case calls nothing first.
        if (x != "ptrattr_fresh_thread") cudaSetDevice(0);
        auto t0 = std::chrono::steady_clock::now();
        if (x == "mod_load") {
            CUmodule m = nullptr;
            CUfunction f = nullptr;
            CUresult a = p_load ? p_load(&m, sync_probe_fatbin) : CUDA_ERROR_NOT_FOUND;
            double load_ms = ms_since(t0);
            CUresult b = a == CUDA_SUCCESS && p_getfn ? p_getfn(&f, m, "sync_probe_kernel") : CUDA_ERROR_NOT_FOUND;
            char buf[160];
            snprintf(buf, sizeof buf, "cuModuleLoadData %d in %.2f ms, first cuModuleGetFunction %d in %.2f ms", (int)a,
                     load_ms, (int)b, ms_since(t0) - load_ms);
            result = buf;
        } else if (x == "malloc_1m" || x == "malloc_4m") {
            void *p = nullptr;
            result = cudaGetErrorName(cudaMalloc(&p, x == "malloc_1m" ? mib : 4 * mib));
        } else if (x == "free") {
            result = cudaGetErrorName(cudaFree(dev));
        } else if (x == "mallochost_1m") {
            void *p = nullptr;
            result = cudaGetErrorName(cudaMallocHost(&p, mib));
        } else if (x == "freehost") {
            result = cudaGetErrorName(cudaFreeHost(pinned));
        } else if (x == "hostregister") {
            result = cudaGetErrorName(cudaHostRegister(pageable, mib, cudaHostRegisterDefault));
        } else if (x == "streamcreate") {
            cudaStream_t n;
            result = cudaGetErrorName(cudaStreamCreateWithFlags(&n, cudaStreamNonBlocking));
        } else if (x == "eventcreate") {
            cudaEvent_t ev;
            result = cudaGetErrorName(cudaEventCreate(&ev));
        } else if (x == "ipc_open") {
            void *p = nullptr;
            result = cudaGetErrorName(cudaIpcOpenMemHandle(&p, hp.h, cudaIpcMemLazyEnablePeerAccess));
        } else if (x == "ipc_close") {
            result = cudaGetErrorName(cudaIpcCloseMemHandle(opened));
        } else if (x == "memcpy_h2d_pageable") {
            result = cudaGetErrorName(cudaMemcpy(dev, pageable, mib, cudaMemcpyHostToDevice));
        } else if (x == "memcpy_h2d_pinned") {
            result = cudaGetErrorName(cudaMemcpy(dev, pinned, mib, cudaMemcpyHostToDevice));
        } else if (x == "memset") {
            result = cudaGetErrorName(cudaMemset(dev, 0, mib));
        } else if (x == "devicesync") {
            result = cudaGetErrorName(cudaDeviceSynchronize());
        } else if (x == "eventquery") {
            result = cudaGetErrorName(cudaEventQuery(after));
        } else if (x == "ptrattr_fresh_thread") {
            unsigned type = 0;
            int ordinal = -2;
            CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
            void *val[] = {&type, &ordinal};
            CUresult a = p_attrs ? p_attrs(2, at, val, (CUdeviceptr)dev) : CUDA_ERROR_NOT_FOUND;
            result = "cuPointerGetAttributes -> " + std::to_string(a) +
                     (a == CUDA_ERROR_INVALID_CONTEXT ? " (CUDA_ERROR_INVALID_CONTEXT)" : "") +
                     ", memory type " + std::to_string(type) + " (2 = device), ordinal " + std::to_string(ordinal);
            cudaSetDevice(0);
            type = 0;
            CUresult b = p_attrs ? p_attrs(2, at, val, (CUdeviceptr)dev) : CUDA_ERROR_NOT_FOUND;
            result += "; after cudaSetDevice(0): " + std::to_string(b) + ", type " + std::to_string(type);
        } else {
            result = "unknown call";
        }
        x_ms = ms_since(t0);
        t_ret = std::chrono::steady_clock::now();
        done = true;
    });

    auto t0 = std::chrono::steady_clock::now();
    while (!done && ms_since(t0) < 4000) usleep(1000);
    bool blocked = !done;
    auto tw = std::chrono::steady_clock::now();
    __atomic_store_n(word, 1u, __ATOMIC_SEQ_CST);   // release the stream
    while (!done && ms_since(tw) < 5000) usleep(1000);
    std::string expect;
    if (x == "devicesync") expect = blocked ? " (control: must block: as expected)" : " (control: must block: UNEXPECTED)";
    if (x == "eventquery") expect = blocked ? " (control: must not block: UNEXPECTED)" : " (control: must not block: as expected)";
    if (!done) {
        printf("RESULT %s: blocked (> 4000 ms, and still 5000 ms after the word was written)%s\n", tag.c_str(),
               expect.c_str());
        fflush(stdout);
        _exit(0);
    }
    t.join();
    if (blocked)
        printf("RESULT %s: blocked (> 4000 ms; returned %.1f ms after the word was written, %s)%s\n", tag.c_str(),
               std::chrono::duration<double, std::milli>(t_ret - tw).count(), result.c_str(), expect.c_str());
    else
        printf("RESULT %s: returned (%.2f ms, %s)%s\n", tag.c_str(), x_ms, result.c_str(), expect.c_str());
    cudaError_t se = cudaStreamSynchronize(s);
    printf("  released: cudaStreamSynchronize -> %s\n", cudaGetErrorName(se));
    if (hp.to >= 0) {
        close(hp.to);
        waitpid(hp.pid, nullptr, 0);
    }
    return 0;
}

// Every call x both streams, `jobs` processes at a time, outputs in order.
static int all(int jobs)
{
    int n = -1;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        printf("sync_probe: no usable CUDA device: cudaGetDeviceCount -> %s (%s)\n", cudaGetErrorName(e),
               cudaGetErrorString(e));
        return 2;
    }
    printf("sync_probe: %zu calls x 2 parked streams, %d processes at a time, CUDA_MODULE_LOADING=%s\n",
           sizeof calls / sizeof calls[0], jobs, getenv("CUDA_MODULE_LOADING") ? getenv("CUDA_MODULE_LOADING") : "(unset)");
    struct Job { std::string park, call, file; pid_t pid; int status; };
    std::vector<Job> js;
    for (const char *p : {"nonblocking", "legacy"})
        for (const char *c : calls) js.push_back({p, c, "", -1, -1});
    size_t next = 0, running = 0, finished = 0;
    fflush(stdout);
    while (finished < js.size()) {
        while (running < (size_t)jobs && next < js.size()) {
            char tmpl[] = "/tmp/sync_probe.XXXXXX";
            int fd = mkstemp(tmpl);
            js[next].file = tmpl;
            pid_t pid = fork();
            if (pid == 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                execl("/proc/self/exe", "sync_probe", "--park", js[next].park.c_str(), "--call",
                      js[next].call.c_str(), (char *)nullptr);
                _exit(127);
            }
            close(fd);
            js[next].pid = pid;
            next++;
            running++;
        }
        int st = 0;
        pid_t w = wait(&st);
        if (w < 0) break;
        for (auto &j : js)
            if (j.pid == w) j.status = st;
        running--;
        finished++;
    }
    for (auto &j : js) {
        FILE *f = fopen(j.file.c_str(), "r");
        char line[1024];
        bool any = false;
        while (f && fgets(line, sizeof line, f)) {
            if (!strncmp(line, "RESULT ", 7)) any = true;
            fputs(line, stdout);
        }
        if (f) fclose(f);
        unlink(j.file.c_str());
        if (!any)
            printf("RESULT %s [parked: %s]: no result (process %s %d)\n", j.call.c_str(), j.park.c_str(),
                   WIFSIGNALED(j.status) ? "killed by signal" : "exit status",
                   WIFSIGNALED(j.status) ? WTERMSIG(j.status) : WEXITSTATUS(j.status));
    }
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    std::string park, call;
    int jobs = 8;
    bool run_all = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--ipc-helper") return ipc_helper();
        if (a == "--all") run_all = true;
        else if (a == "--jobs" && i + 1 < argc) jobs = atoi(argv[++i]);
        else if (a == "--park" && i + 1 < argc) park = argv[++i];
        else if (a == "--call" && i + 1 < argc) call = argv[++i];
        else if (a == "--list") {
            for (const char *c : calls) printf("%s\n", c);
            return 0;
        } else {
            fprintf(stderr, "usage: sync_probe --all [--jobs N] | --park nonblocking|legacy --call X | --list\n");
            return 2;
        }
    }
    if (run_all) return all(jobs > 0 ? jobs : 1);
    if ((park != "nonblocking" && park != "legacy") || call.empty()) {
        fprintf(stderr, "usage: sync_probe --all [--jobs N] | --park nonblocking|legacy --call X | --list\n");
        return 2;
    }
    return one(park, call);
}
#endif
