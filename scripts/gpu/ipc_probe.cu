// ipc_probe: what CUDA IPC does with small cudaMalloc allocations on this
// machine (docs/testing.md, "A GPU machine without a package manager";
// review A1/A2/A8). weft maps a peer's buffer per allocation (the base that
// cuMemGetAddressRange gives); CUDA may map the whole block a small
// allocation was carved from. This probe asks, with two processes on one GPU:
//   - do 8 B, 4097 B, 4098 B (and 3 MiB) allocations share 2 MiB blocks?
//     (bases, cuMemGetAddressRange, the pointer attributes MAPPING_BASE_ADDR,
//     MAPPING_SIZE, MEMORY_BLOCK_ID, BUFFER_ID)
//   - process B opens their handles in order: does the second open of a
//     block fail (cudaErrorAlreadyMapped), return an aliased pointer, or work?
//     B copies a pattern into each mapping and A checks every buffer;
//   - A frees the 4097 B buffer and allocates 8192 B (likely the same block)
//     while B still has the old mapping: can B open the new handle?
//   - B closes one mapping and opens it again; B opens one handle twice;
//   - A opens its own handle (expected: refused; the error is printed).
// Every CUDA call's result is printed (cudaGetErrorName). Exit 0 when it ran,
// whatever CUDA answered; 2 when there is no usable device at all.
//
// Build (one line; driver calls through cudaGetDriverEntryPointByVersion, so
// no -lcuda and a clean error where there is no driver):
//   nvcc -arch=sm_90 -O2 -o ipc_probe scripts/gpu/ipc_probe.cu
#include <cuda.h>
#include <cuda_runtime.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

static const char *who = "A";

#define SAY(...) (printf("%s: ", who), printf(__VA_ARGS__), printf("\n"), fflush(stdout))
// Print a runtime call and its result; evaluates to the cudaError_t.
#define RT(call) rt_log(#call, (call))
static cudaError_t rt_log(const char *what, cudaError_t e)
{
    SAY("%s -> %s", what, cudaGetErrorName(e));
    return e;
}

// Driver entry points (no -lcuda: the binary starts where there is no driver).
typedef CUresult (*pfn_range_t)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*pfn_attr_t)(void *, CUpointer_attribute, CUdeviceptr);
static pfn_range_t p_range;
static pfn_attr_t p_attr;

static void *entry(const char *name)
{
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
    SAY("cudaGetDriverEntryPointByVersion(%s, 12000) -> %s (query %d)", name, cudaGetErrorName(e), (int)q);
    return e == cudaSuccess && q == cudaDriverEntryPointSuccess ? fn : nullptr;
}

static std::string hex(const void *p, size_t n)
{
    static const char d[] = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; i++) {
        s += d[((const unsigned char *)p)[i] >> 4];
        s += d[((const unsigned char *)p)[i] & 15];
    }
    return s;
}

static bool unhex(const char *s, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return false;
        ((unsigned char *)p)[i] = (unsigned char)v;
    }
    return true;
}

static void write_line(int fd, const std::string &s)
{
    std::string l = s + "\n";
    if (write(fd, l.data(), l.size()) != (ssize_t)l.size()) {
        SAY("pipe write failed: %s", strerror(errno));
        exit(0);
    }
}

static std::string read_line(int fd)
{
    std::string s;
    char c;
    for (;;) {
        ssize_t r = read(fd, &c, 1);
        if (r <= 0) return s.empty() ? std::string("EOF") : s;
        if (c == '\n') return s;
        s += c;
    }
}

static unsigned char pattern(int idx) { return (unsigned char)(0xa0 + idx); }

// ---------------------------------------------------------------- process B
static int child(int rfd, int wfd)
{
    who = "B";
    RT(cudaSetDevice(0));
    std::vector<void *> mapped(16, nullptr);
    for (;;) {
        std::string cmd = read_line(rfd);
        char op[16] = {0}, hx[2 * sizeof(cudaIpcMemHandle_t) + 1] = {0};
        int idx = -1, pat = 0;
        unsigned long size = 0;
        if (cmd == "EOF" || cmd == "QUIT") break;
        // OPEN <slot> <size> <handle in hex> <pattern index> | CLOSE <slot>
        if (sscanf(cmd.c_str(), "%15s %d %lu %128s %d", op, &idx, &size, hx, &pat) < 2 || idx < 0 || idx >= 16) {
            SAY("bad command '%s'", cmd.c_str());
            break;
        }
        std::string reply = "ERR";
        if (!strcmp(op, "OPEN")) {
            cudaIpcMemHandle_t h;
            unhex(hx, &h, sizeof h);
            void *p = nullptr;
            cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
            SAY("cudaIpcOpenMemHandle(#%d, %lu B) -> %s, pointer %p", idx, size, cudaGetErrorName(e), p);
            std::string alias;
            for (int j = 0; j < 16 && e == cudaSuccess; j++)
                if (j != idx && mapped[j] == p) alias += " #" + std::to_string(j);
            if (!alias.empty()) SAY("  #%d: the same pointer as the mapping of%s (aliased)", idx, alias.c_str());
            if (e == cudaSuccess) {
                mapped[idx] = p;
                std::vector<unsigned char> buf(size, pattern(pat));
                cudaError_t c1 = RT(cudaMemcpy(p, buf.data(), size, cudaMemcpyHostToDevice));
                cudaError_t c2 = RT(cudaDeviceSynchronize());
                reply = std::string(c1 == cudaSuccess && c2 == cudaSuccess ? "COPIED " : "COPYFAIL ") +
                        cudaGetErrorName(e) + (alias.empty() ? "" : " aliased");
            } else {
                reply = std::string("OPENFAIL ") + cudaGetErrorName(e);
            }
        } else if (!strcmp(op, "CLOSE") && !mapped[idx]) {
            reply = "NOTOPEN";
        } else if (!strcmp(op, "CLOSE")) {
            cudaError_t e = cudaIpcCloseMemHandle(mapped[idx]);
            SAY("cudaIpcCloseMemHandle(#%d at %p) -> %s", idx, mapped[idx], cudaGetErrorName(e));
            if (e == cudaSuccess) mapped[idx] = nullptr;
            reply = std::string("CLOSED ") + cudaGetErrorName(e);
        }
        write_line(wfd, reply);
    }
    return 0;
}

// ---------------------------------------------------------------- process A
struct Buf {
    size_t size;
    void *p;
    cudaIpcMemHandle_t h;
    bool live, written;
};

static void describe(int idx, const Buf &b)
{
    CUdeviceptr base = 0;
    size_t range = 0;
    if (p_range) {
        CUresult r = p_range(&base, &range, (CUdeviceptr)b.p);
        SAY("#%d %zu B at %p: cuMemGetAddressRange -> %d, base 0x%llx size %zu; 2 MiB block 0x%llx", idx, b.size, b.p,
            (int)r, (unsigned long long)base, range, (unsigned long long)((uintptr_t)b.p >> 21));
    }
    if (!p_attr) return;
    struct { CUpointer_attribute a; const char *name; } at[] = {
        {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, "MAPPING_BASE_ADDR"},
        {CU_POINTER_ATTRIBUTE_MAPPING_SIZE, "MAPPING_SIZE"},
        {CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, "MEMORY_BLOCK_ID"},
        {CU_POINTER_ATTRIBUTE_BUFFER_ID, "BUFFER_ID"},
    };
    for (auto &x : at) {
        unsigned long long v = 0;   // every one of these fits in 8 bytes
        CUresult r = p_attr(&v, x.a, (CUdeviceptr)b.p);
        SAY("  #%d %s -> %d, 0x%llx (%llu)", idx, x.name, (int)r, v, v);
    }
}

// Copy every live, written buffer back and check its pattern.
static int check_all(std::vector<Buf> &bufs)
{
    int bad_total = 0;
    for (size_t i = 0; i < bufs.size(); i++) {
        if (!bufs[i].live || !bufs[i].written) continue;
        std::vector<unsigned char> h(bufs[i].size);
        cudaError_t e = cudaMemcpy(h.data(), bufs[i].p, h.size(), cudaMemcpyDeviceToHost);
        size_t bad = 0, first = 0;
        for (size_t k = 0; k < h.size(); k++)
            if (h[k] != pattern((int)i) && bad++ == 0) first = k;
        if (e != cudaSuccess || bad) {
            SAY("check #%zu (%zu B): cudaMemcpy D2H -> %s; %zu bytes not 0x%02x%s", i, bufs[i].size,
                cudaGetErrorName(e), bad, pattern((int)i),
                bad ? (std::string("; first at ") + std::to_string(first) + " holds 0x" + hex(&h[first], 1) +
                       (h[first] >= 0xa0 && h[first] < 0xb0 ? " (the pattern of #" + std::to_string(h[first] - 0xa0) + ")" : ""))
                          .c_str()
                    : "");
            bad_total++;
        } else {
            SAY("check #%zu (%zu B): all %zu bytes hold B's pattern 0x%02x", i, bufs[i].size, h.size(), pattern((int)i));
        }
    }
    return bad_total;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc == 4 && !strcmp(argv[1], "--child")) return child(atoi(argv[2]), atoi(argv[3]));
    alarm(30);   // never wait forever (a pipe read, a hung driver call)

    int n = -1;
    cudaError_t e = RT(cudaGetDeviceCount(&n));
    if (e != cudaSuccess || n < 1) {
        SAY("no usable CUDA device (%s, count %d): nothing to probe", cudaGetErrorString(e), n);
        printf("SUMMARY ipc_probe: not run (%s)\n", cudaGetErrorName(e));
        return 2;
    }
    RT(cudaSetDevice(0));
    int drv = 0, rtv = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rtv);
    SAY("driver %d, runtime %d, %d device(s)", drv, rtv, n);
    p_range = (pfn_range_t)entry("cuMemGetAddressRange");
    p_attr = (pfn_attr_t)entry("cuPointerGetAttribute");

    std::vector<Buf> bufs;
    for (size_t s : {(size_t)8, (size_t)4097, (size_t)4098, (size_t)3 << 20}) {
        Buf b{s, nullptr, {}, false, false};
        if (RT(cudaMalloc(&b.p, s)) == cudaSuccess) {
            b.live = true;
            RT(cudaMemset(b.p, 0, s));
            RT(cudaIpcGetMemHandle(&b.h, b.p));
        }
        bufs.push_back(b);
    }
    RT(cudaDeviceSynchronize());
    for (size_t i = 0; i < bufs.size(); i++) describe((int)i, bufs[i]);
    bool share = bufs[0].live && bufs[1].live && bufs[2].live &&
                 ((uintptr_t)bufs[0].p >> 21) == ((uintptr_t)bufs[1].p >> 21) &&
                 ((uintptr_t)bufs[1].p >> 21) == ((uintptr_t)bufs[2].p >> 21);

    // Process B: this program again, commands over one pipe, replies over another.
    int down[2], up[2];
    if (pipe(down) || pipe(up)) { SAY("pipe: %s", strerror(errno)); return 0; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        std::string r = std::to_string(down[0]), w = std::to_string(up[1]);
        execl("/proc/self/exe", argv[0], "--child", r.c_str(), w.c_str(), (char *)nullptr);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    auto ask = [&](const std::string &cmd) {
        write_line(down[1], cmd);
        std::string r = read_line(up[0]);
        SAY("B answered '%s' to '%s'", r.c_str(), cmd.substr(0, cmd.find(' ', cmd.find(' ') + 1)).c_str());
        return r;
    };
    auto open_in_b = [&](int i) {
        std::string r = ask("OPEN " + std::to_string(i) + " " + std::to_string(bufs[i].size) + " " +
                            hex(&bufs[i].h, sizeof bufs[i].h) + " " + std::to_string(i));
        if (r.rfind("COPIED", 0) == 0) bufs[i].written = true;
        return r;
    };

    std::vector<std::string> first(4);
    for (int i = 0; i < 4; i++)
        if (bufs[i].live) {
            first[i] = open_in_b(i);
            check_all(bufs);
        }
    // Free the 4097 B buffer (B keeps its mapping) and allocate 8192 B.
    std::string after_free = "not run";
    RT(cudaFree(bufs[1].p));
    bufs[1].live = false;
    Buf nb{8192, nullptr, {}, false, false};
    if (RT(cudaMalloc(&nb.p, nb.size)) == cudaSuccess) {
        nb.live = true;
        RT(cudaMemset(nb.p, 0, nb.size));
        RT(cudaIpcGetMemHandle(&nb.h, nb.p));
        RT(cudaDeviceSynchronize());
        SAY("#4 8192 B at %p (the freed #1 was at %p, %s 2 MiB block)", nb.p, bufs[1].p,
            ((uintptr_t)nb.p >> 21) == ((uintptr_t)bufs[1].p >> 21) ? "the same" : "another");
        bufs.push_back(nb);
        describe(4, nb);
        after_free = open_in_b(4);
        check_all(bufs);
    }
    // B opens #0's handle a second time without closing it (slot 5, #0's
    // pattern: wherever it lands, #0's bytes stay what A expects).
    std::string twice = "not run", reopen = "not run", retry = "not run";
    if (bufs[0].written)
        twice = ask("OPEN 5 " + std::to_string(bufs[0].size) + " " + hex(&bufs[0].h, sizeof bufs[0].h) + " 0");
    // B closes one mapping (#2, else #0, else #3) and opens it again.
    int r = bufs[2].written ? 2 : bufs[0].written ? 0 : bufs[3].written ? 3 : -1;
    if (r >= 0) {
        ask("CLOSE " + std::to_string(r));
        bufs[r].written = false;
        reopen = "#" + std::to_string(r) + ": " + open_in_b(r);
        check_all(bufs);
    }
    // If #2 could not be opened beside #0: does closing #0 (and its second
    // open) let B open #2? (the close-and-retry of UCX's IPC cache)
    if (!bufs[2].written && bufs[0].written) {
        ask("CLOSE 5");
        ask("CLOSE 0");
        bufs[0].written = false;
        retry = open_in_b(2);
        check_all(bufs);
    }
    write_line(down[1], "QUIT");
    int st = 0;
    waitpid(pid, &st, 0);
    SAY("B exited with status %d", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));

    // A opens its own handle.
    void *own = nullptr;
    cudaError_t oe = cudaIpcOpenMemHandle(&own, bufs[0].h, cudaIpcMemLazyEnablePeerAccess);
    SAY("cudaIpcOpenMemHandle(own handle of #0) -> %s (%s), pointer %p", cudaGetErrorName(oe), cudaGetErrorString(oe), own);
    int bad = check_all(bufs);

    printf("SUMMARY ipc allowed (B's first open, 8 B): %s\n", first[0].c_str());
    printf("SUMMARY 8 B, 4097 B, 4098 B in one 2 MiB block: %s (cuMemGetAddressRange sizes above)\n", share ? "yes" : "no");
    printf("SUMMARY second/third open in that block (4097 B, 4098 B): %s | %s\n", first[1].c_str(), first[2].c_str());
    printf("SUMMARY 3 MiB open: %s\n", first[3].c_str());
    printf("SUMMARY open of a new 8192 B buffer after free of 4097 B (B still maps it): %s\n", after_free.c_str());
    printf("SUMMARY same handle (8 B) opened twice in B: %s\n", twice.c_str());
    printf("SUMMARY close + reopen of one mapping: %s\n", reopen.c_str());
    printf("SUMMARY open of 4098 B after B closed the block's other mapping(s) (8 B): %s\n", retry.c_str());
    printf("SUMMARY A opens its own handle: %s\n", cudaGetErrorName(oe));
    printf("SUMMARY A's checks of B's patterns: %s\n", bad ? "MISMATCH (lines above)" : "all buffers hold what B wrote");
    return 0;
}
