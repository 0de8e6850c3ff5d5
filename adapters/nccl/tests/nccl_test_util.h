/*
 * Shared helpers of the NCCL-ABI test programs (nccl_test_*.c): checks that
 * count and print their failures, the unique-id exchange (MPI_Bcast, or a
 * file rank 0 writes atomically), datatype encodings for host references,
 * and device buffers checked through cudaMemcpy (device memory of the
 * emulated runtime is PROT_NONE for the host).
 *
 * Written against NCCL's nccl.h and the CUDA runtime API only: the programs
 * link -lnccl (weft's libnccl.so.2) and run unchanged against real NCCL.
 * MPI is only the launcher: it hands out ranks and carries the unique id.
 */
#ifndef NCCL_TEST_UTIL_H
#define NCCL_TEST_UTIL_H

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int tu_rank = 0, tu_size = 1;
static long tu_checks = 0, tu_failed = 0;
static char tu_section[128] = "";

static inline double tu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void tu_set_section(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void tu_set_section(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tu_section, sizeof(tu_section), fmt, ap);
    va_end(ap);
}

/* One check: counts it; on failure prints "FAIL rank R [section] what: expected X, got Y". */
static inline int tu_check(int ok, const char *file, int line, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static inline int tu_check(int ok, const char *file, int line, const char *what, const char *fmt, ...)
{
    tu_checks++;
    if (ok)
        return 1;
    tu_failed++;
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    printf("FAIL rank %d [%s] %s:%d %s: %s\n", tu_rank, tu_section, file, line, what, detail);
    fflush(stdout);
    return 0;
}
#define CHECK(cond, what, ...) tu_check(!!(cond), __FILE__, __LINE__, what, __VA_ARGS__)

static inline const char *tu_res_name(ncclResult_t r)
{
    static const char *names[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                                  "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"};
    return (unsigned)r < 8 ? names[r] : "(unknown code)";
}

/* A call with an expected result code; on a mismatch the line carries ncclGetLastError. */
static inline ncclResult_t tu_ncheck(ncclResult_t r, ncclResult_t expect, const char *call, const char *file, int line)
{
    tu_check(r == expect, file, line, call, "expected %s, got %s (last error: \"%s\")", tu_res_name(expect),
             tu_res_name(r), r == expect ? "" : ncclGetLastError(NULL));
    return r;
}
#define NCHECK_RC(call, expect) tu_ncheck((call), (expect), #call, __FILE__, __LINE__)
static inline int tu_nok(ncclResult_t r, const char *call, const char *file, int line)
{
    return tu_ncheck(r, ncclSuccess, call, file, line) == ncclSuccess;
}
#define NCHECK(call) tu_nok((call), #call, __FILE__, __LINE__)

static inline int tu_cucheck(cudaError_t e, const char *call, const char *file, int line)
{
    return tu_check(e == cudaSuccess, file, line, call, "expected cudaSuccess, got %d (%s)", (int)e,
                    cudaGetErrorString(e));
}
#define CUCHECK(call) tu_cucheck((call), #call, __FILE__, __LINE__)

/* A fatal failure: nothing after it can run meaningfully. */
#define FATAL(...)                                                                                      \
    do {                                                                                                \
        printf("FATAL rank %d [%s] %s:%d: ", tu_rank, tu_section, __FILE__, __LINE__);                  \
        printf(__VA_ARGS__);                                                                            \
        printf("\n");                                                                                   \
        fflush(stdout);                                                                                 \
        MPI_Abort(MPI_COMM_WORLD, 2);                                                                   \
    } while (0)

static inline int tu_contains(const char *hay, const char *needle)
{
    return hay != NULL && strstr(hay, needle) != NULL;
}
static inline int tu_starts(const char *s, const char *prefix)
{
    return s != NULL && strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- the unique id: rank 0 -> everyone ---- */

enum { TU_ID_MPI = 0, TU_ID_FILE = 1 };
static int tu_id_mode = TU_ID_MPI;
static char tu_id_path[900] = "";
static int tu_id_seq = 0;

/* Reads the mode from argv: "--id-file PATH" (or NCCL_TEST_ID_FILE) means
 * the file mode; else MPI_Bcast. */
static inline void tu_id_setup(int argc, char **argv)
{
    const char *path = getenv("NCCL_TEST_ID_FILE");
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--id-file") == 0)
            path = argv[i + 1];
    if (path != NULL && *path) {
        tu_id_mode = TU_ID_FILE;
        /* mpirun is every rank's parent: its pid keeps two runs (or two
         * entries run side by side) from reading each other's files. */
        snprintf(tu_id_path, sizeof(tu_id_path), "%s.%d", path, (int)getppid());
    }
}

/* Every rank calls it with the same sequence of ids: rank 0's id reaches all. */
static inline void tu_share_id(ncclUniqueId *id)
{
    int seq = tu_id_seq++;
    if (tu_id_mode == TU_ID_MPI) {
        MPI_Bcast(id, (int)sizeof(*id), MPI_BYTE, 0, MPI_COMM_WORLD);
        return;
    }
    char path[1000], tmp[1100];
    snprintf(path, sizeof(path), "%s.%d", tu_id_path, seq);
    if (tu_rank == 0) {
        /* Written whole under another name, then renamed: a reader sees no file or all of it. */
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (f == NULL || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) != 0)
            FATAL("cannot write the unique id to %s: %s", tmp, strerror(errno));
        if (rename(tmp, path) != 0)
            FATAL("rename %s -> %s: %s", tmp, path, strerror(errno));
        return;
    }
    double t0 = tu_now();
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f != NULL) {
            size_t n = fread(id, sizeof(*id), 1, f);
            fclose(f);
            if (n == 1)
                return;
            FATAL("unique id file %s is short", path);
        }
        if (tu_now() - t0 > 60)
            FATAL("no unique id file %s after 60 s", path);
        usleep(2000);
    }
}

/* Rank 0 removes the id files once everyone read them (at the end). */
static inline void tu_id_cleanup(void)
{
    if (tu_id_mode != TU_ID_FILE || tu_rank != 0)
        return;
    char path[1000];
    for (int s = 0; s < tu_id_seq; s++) {
        snprintf(path, sizeof(path), "%s.%d", tu_id_path, s);
        unlink(path);
    }
}

/* ---- datatypes ---- */

static const ncclDataType_t tu_all_types[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,
                                              ncclInt64,   ncclUint64,  ncclFloat16, ncclFloat32,
                                              ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
#define TU_NTYPES ((int)(sizeof(tu_all_types) / sizeof(tu_all_types[0])))
/* The types reductions accept (every one but fp8). */
static const ncclDataType_t tu_red_types[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,  ncclInt64,
                                              ncclUint64,  ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
#define TU_NREDTYPES ((int)(sizeof(tu_red_types) / sizeof(tu_red_types[0])))

static inline size_t tu_type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}
static inline const char *tu_type_name(ncclDataType_t t)
{
    static const char *n[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                              "half", "float", "double", "bf16", "fp8e4m3", "fp8e5m2"};
    return (unsigned)t < 12 ? n[t] : "?";
}
static inline int tu_type_unsigned(ncclDataType_t t)
{
    return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}
static inline int tu_type_float(ncclDataType_t t)
{
    return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}

static inline uint32_t tu_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float tu_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* float -> IEEE half, round to nearest even (normal numbers and zero: the tests' values). */
static inline uint16_t tu_float_to_half(float f)
{
    uint32_t u = tu_f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0)
        return sign;                       /* zero (and float subnormals, never used) */
    if (exp <= 0 || exp >= 31)
        return (uint16_t)(sign | 0x7c00);  /* out of the tests' range: inf marks it */
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}
static inline float tu_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31)
        return tu_u2f(sign | 0x7f800000 | (mant << 13));
    return tu_u2f(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}
static inline uint16_t tu_float_to_bf16(float f)
{
    uint32_t u = tu_f2u(f);
    uint32_t rest = u & 0xffff, h = u >> 16;
    if (rest > 0x8000 || (rest == 0x8000 && (h & 1)))
        h++;
    return (uint16_t)h;
}
static inline float tu_bf16_to_float(uint16_t h) { return tu_u2f((uint32_t)h << 16); }

/* Stores v (an exact small value) as one element of type t. */
static inline void tu_encode(ncclDataType_t t, double v, void *p)
{
    switch (t) {
    case ncclInt8: { int8_t x = (int8_t)v; memcpy(p, &x, 1); break; }
    case ncclUint8: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case ncclInt32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case ncclUint32: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    case ncclInt64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case ncclUint64: { uint64_t x = (uint64_t)v; memcpy(p, &x, 8); break; }
    case ncclFloat16: { uint16_t x = tu_float_to_half((float)v); memcpy(p, &x, 2); break; }
    case ncclFloat32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case ncclFloat64: memcpy(p, &v, 8); break;
    case ncclBfloat16: { uint16_t x = tu_float_to_bf16((float)v); memcpy(p, &x, 2); break; }
    default: { uint8_t x = (uint8_t)(int)v; memcpy(p, &x, 1); break; }
    }
}
static inline double tu_decode(ncclDataType_t t, const void *p)
{
    switch (t) {
    case ncclInt8: { int8_t x; memcpy(&x, p, 1); return x; }
    case ncclUint8: { uint8_t x; memcpy(&x, p, 1); return x; }
    case ncclInt32: { int32_t x; memcpy(&x, p, 4); return x; }
    case ncclUint32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case ncclInt64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    case ncclUint64: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
    case ncclFloat16: { uint16_t x; memcpy(&x, p, 2); return tu_half_to_float(x); }
    case ncclFloat32: { float x; memcpy(&x, p, 4); return x; }
    case ncclFloat64: { double x; memcpy(&x, p, 8); return x; }
    case ncclBfloat16: { uint16_t x; memcpy(&x, p, 2); return tu_bf16_to_float(x); }
    default: { uint8_t x; memcpy(&x, p, 1); return x; }
    }
}

/* ---- device buffers ---- */

/* Device buffers come from one cudaMalloc'ed arena, carved in order and
 * given back by mark/release around each call: applications (and
 * frameworks' caching allocators) reuse their buffers, and the test
 * exercises the library, not a fresh allocation per call. The one section
 * that frees and allocates between calls (test "churn") uses cudaMalloc. */
static unsigned char *tu_arena;
static size_t tu_arena_size, tu_arena_off;
static int tu_fresh_alloc;   /* set: tu_dmalloc is cudaMalloc, tu_dfree cudaFree (churn) */

static inline void tu_arena_init(size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
        FATAL("cudaMalloc(%zu) for the arena: %s", bytes, cudaGetErrorString(e));
    tu_arena = p;
    tu_arena_size = bytes;
    tu_arena_off = 0;
}
static inline size_t tu_arena_mark(void) { return tu_arena_off; }
static inline void tu_arena_release(size_t mark) { tu_arena_off = mark; }

/* At least one byte (count-0 calls still get a real buffer), 256-aligned. */
static inline void *tu_dmalloc(size_t bytes)
{
    size_t need = ((bytes ? bytes : 1) + 255) & ~(size_t)255;
    if (tu_fresh_alloc) {
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, need);
        if (e != cudaSuccess)
            FATAL("cudaMalloc(%zu): %s", need, cudaGetErrorString(e));
        return p;
    }
    if (tu_arena == NULL || tu_arena_off + need > tu_arena_size)
        FATAL("device arena exhausted (%zu + %zu > %zu)", tu_arena_off, need, tu_arena_size);
    void *p = tu_arena + tu_arena_off;
    tu_arena_off += need;
    return p;
}
/* Arena buffers go back with tu_arena_release; anything else is cudaFree'd. */
static inline void tu_dfree(void *p)
{
    unsigned char *q = p;
    if (q >= tu_arena && q < tu_arena + tu_arena_size)
        return;
    cudaFree(p);
}
static inline void tu_h2d(void *d, const void *h, size_t bytes)
{
    if (bytes && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        FATAL("cudaMemcpy H2D %zu bytes failed", bytes);
    /* From pageable memory the copy may land after cudaMemcpy returned; the
     * collectives run on other streams, which do not wait for it. */
    if (bytes && cudaDeviceSynchronize() != cudaSuccess)
        FATAL("cudaDeviceSynchronize after an H2D copy failed");
}
static inline void tu_d2h(void *h, const void *d, size_t bytes)
{
    if (bytes && cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        FATAL("cudaMemcpy D2H %zu bytes failed", bytes);
}
static inline void *tu_xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL)
        FATAL("malloc(%zu) failed", bytes);
    return p;
}

/* Waits for a stream, with a bound: WEFT_TIMEOUT + 10 s (weft fails any
 * stalled operation within WEFT_TIMEOUT, so a stream still busy after that
 * is a hang). A hang is reported as a failed check naming the section, and
 * the job is ended (MPI_Abort) instead of waiting for ctest's timeout.
 * Reports a stream that errs too. */
static inline int tu_sync(cudaStream_t s)
{
    const char *t = getenv("WEFT_TIMEOUT");
    double bound = (t ? atof(t) : 60) + 10, t0 = tu_now();
    unsigned nap = 1;
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e != cudaErrorNotReady)
            return CUCHECK(e);
        if (tu_now() - t0 > bound) {
            CHECK(0, "stream wait", "the stream's work done within %.0f s (WEFT_TIMEOUT + 10), still busy: a hang",
                  bound);
            FATAL("stream still busy after %.0f s in section \"%s\"", bound, tu_section);
        }
        usleep(nap);
        if (nap < 1000)
            nap *= 2;
    }
}

/* Rank 0 prints "N checks, M failed" over all ranks; returns the exit code. */
static inline int tu_summary(const char *prog)
{
    long mine[2] = {tu_checks, tu_failed}, all[2] = {0, 0};
    MPI_Reduce(mine, all, 2, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (tu_rank == 0) {
        printf("%s: %ld checks, %ld failed\n", prog, all[0], all[1]);
        fflush(stdout);
    }
    int bad = tu_failed != 0, anybad = 0;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return anybad ? 1 : 0;
}

#endif
