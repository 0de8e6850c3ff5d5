/*
 * weft-reduce-bench: the host reduction kernel (collectives/reduce_host.c)
 * alone, one thread, against memcpy on the same machine.
 *
 *   part 1, float32 sum by array size:
 *       kernel      dst = a + b                (3 arrays of `bytes`)
 *       in place    a = a + b                  (what the collectives do)
 *       memcpy      dst = a                    (the reference)
 *   part 2, every dtype x op at one size (-s, default 64 MiB): kernel only.
 *
 * Bytes counted: a kernel call moves 3 x bytes (a and b read, dst written),
 * a memcpy 2 x bytes (read, written), the convention of STREAM. Caches do
 * not count: a write-allocate CPU also reads dst's lines before writing
 * them, which counts for nothing here, and glibc's memcpy switches to
 * non-temporal stores (no such read) for copies larger than the cache.
 * Every figure is the median over -r repetitions; a repetition repeats the
 * call until it moved at least 256 MiB, so small (in-cache) sizes are not
 * timer noise.
 *
 *   weft-reduce-bench [-b min_bytes] [-e max_bytes] [-s dtype_table_bytes] [-r reps] [-p]
 *
 * -p: float16 through the portable conversions even where the CPU has F16C.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "reduce_kernel.h"
#include "weft.h"

/* reduce_host.c's test hook (not in the header): float16 without F16C. */
int weft_reduce_host_portable_f16(int on);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static size_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return 0;
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    return *end ? 0 : (size_t)v;
}

static void *xalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1)) {
        fprintf(stderr, "weft-reduce-bench: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    /* Touch every page so page faults are not timed. */
    memset(p, 0, bytes);
    return p;
}

/* What one measurement does: a kernel call or a memcpy. */
enum what { W_KERNEL, W_INPLACE, W_MEMCPY };

struct bufs {
    char  *a, *b, *dst;
    size_t bytes;
};

static void run_once(enum what w, const struct bufs *m, int dtype, int op)
{
    size_t count = m->bytes / weft_dtype_size(dtype);
    switch (w) {
    case W_KERNEL: weft_reduce_host(m->dst, m->a, m->b, count, dtype, op); break;
    case W_INPLACE: weft_reduce_host(m->a, m->a, m->b, count, dtype, op); break;
    case W_MEMCPY: memcpy(m->dst, m->a, m->bytes); break;
    }
}

/* GB/s (1e9 bytes per second) of each of nw measurements, medians of reps.
 * The measurements take turns within a repetition, so that a machine
 * shared with other work slows them alike and their ratio stays fair. */
static void measure(const enum what *ws, int nw, const struct bufs *m, int dtype, int op, int reps, double *gbs)
{
    double t[4][101];
    size_t iters[4], moved[4];
    if (reps > 101)
        reps = 101;
    for (int w = 0; w < nw && w < 4; w++) {
        moved[w] = (ws[w] == W_MEMCPY ? 2 : 3) * m->bytes;
        iters[w] = (256u << 20) / moved[w];
        if (iters[w] < 1)
            iters[w] = 1;
        run_once(ws[w], m, dtype, op); /* warm the caches (small sizes) and the ifunc */
    }
    for (int r = 0; r < reps; r++)
        for (int w = 0; w < nw && w < 4; w++) {
            double t0 = now();
            for (size_t i = 0; i < iters[w]; i++)
                run_once(ws[w], m, dtype, op);
            t[w][r] = now() - t0;
        }
    for (int w = 0; w < nw && w < 4; w++)
        gbs[w] = (double)(moved[w] * iters[w]) / median(t[w], reps) / 1e9;
}

/* Fills a buffer with values that keep every op finite and cheap (no
 * subnormals, no overflow to inf): small integers, or floats near 1. */
static void fill(char *p, size_t bytes, int dtype)
{
    size_t n = bytes / weft_dtype_size(dtype);
    for (size_t i = 0; i < n; i++) {
        float f = 1.0f + (float)(i % 7) / 64.0f;
        switch (dtype) {
        case WEFT_INT8: case WEFT_UINT8: ((uint8_t *)p)[i] = (uint8_t)(1 + i % 3); break;
        case WEFT_INT32: case WEFT_UINT32: ((uint32_t *)p)[i] = (uint32_t)(1 + i % 3); break;
        case WEFT_INT64: case WEFT_UINT64: ((uint64_t *)p)[i] = 1 + i % 3; break;
        case WEFT_FLOAT16: ((uint16_t *)p)[i] = weft_float_to_half(f); break;
        case WEFT_BFLOAT16: ((uint16_t *)p)[i] = weft_float_to_bf16(f); break;
        case WEFT_FLOAT32: ((float *)p)[i] = f; break;
        case WEFT_FLOAT64: ((double *)p)[i] = f; break;
        }
    }
}

/* The copy that weft_reduce_host's ifunc resolvers pick on this CPU (the
 * same order as GCC's: the highest level supported). */
static const char *clone_name(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return "avx512f";
    if (__builtin_cpu_supports("avx2"))
        return "avx2";
    return "default (sse2)";
#else
    return "default";
#endif
}

static void fmt_bytes(char *out, size_t len, size_t b)
{
    if (b >= (1u << 30) && b % (1u << 30) == 0)
        snprintf(out, len, "%zu GiB", b >> 30);
    else if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(out, len, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(out, len, "%zu KiB", b >> 10);
    else
        snprintf(out, len, "%zu B", b);
}

int main(int argc, char **argv)
{
    size_t min_b = 64u << 10, max_b = 256u << 20, table_b = 64u << 20;
    int reps = 11, portable = 0, opt;
    while ((opt = getopt(argc, argv, "b:e:s:r:ph")) != -1) {
        switch (opt) {
        case 'b': min_b = parse_size(optarg); break;
        case 'e': max_b = parse_size(optarg); break;
        case 's': table_b = parse_size(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'p': portable = 1; break;
        default:
            fprintf(stderr, "usage: %s [-b min_bytes] [-e max_bytes] [-s dtype_table_bytes] [-r reps] [-p]\n"
                            "  sizes per array, suffixes K M G; -s 0 skips the dtype table;\n"
                            "  -p: float16 without F16C\n", argv[0]);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (min_b < 64 || max_b < min_b || reps < 1) {
        fprintf(stderr, "weft-reduce-bench: bad -b/-e/-r\n");
        return 2;
    }
    weft_reduce_host_portable_f16(portable);
    size_t alloc_b = max_b > table_b ? max_b : table_b;
    struct bufs m = { xalloc(alloc_b), xalloc(alloc_b), xalloc(alloc_b), 0 };

    printf("# weft-reduce-bench: host reduction kernel, 1 thread, kernel copy %s%s, median of %d\n", clone_name(),
           portable ? ", float16 portable (-p)" : "", reps);
    printf("# kernel: dst = a + b (float32), GB/s of 3 x bytes; in place: a = a + b, 3 x bytes;\n"
           "# memcpy: dst = a, GB/s of 2 x bytes; ratio = kernel / memcpy\n");
    printf("%12s %12s %12s %12s %8s %8s\n", "bytes/array", "kernel", "in place", "memcpy", "ratio", "in pl.");
    fill(m.a, alloc_b, WEFT_FLOAT32);
    fill(m.b, alloc_b, WEFT_FLOAT32);
    for (size_t b = min_b; b <= max_b; b *= 2) {
        char s[32];
        m.bytes = b;
        static const enum what ws[3] = { W_KERNEL, W_INPLACE, W_MEMCPY };
        double g[3];
        measure(ws, 3, &m, WEFT_FLOAT32, WEFT_SUM, reps, g);
        /* In place grows a's values; refill so later sizes see the same data. */
        fill(m.a, b, WEFT_FLOAT32);
        double k = g[0], ip = g[1], mc = g[2];
        fmt_bytes(s, sizeof s, b);
        printf("%12s %12.2f %12.2f %12.2f %8.2f %8.2f\n", s, k, ip, mc, k / mc, ip / mc);
        fflush(stdout);
        if (b > max_b / 2)
            break;
    }

    if (table_b) {
        char s[32];
        fmt_bytes(s, sizeof s, table_b);
        m.bytes = table_b;
        static const enum what wmc = W_MEMCPY, wk = W_KERNEL;
        double mc;
        measure(&wmc, 1, &m, WEFT_FLOAT32, WEFT_SUM, reps, &mc);
        printf("\n# every dtype, %s per array, dst = a op b, GB/s of 3 x bytes (memcpy: %.2f GB/s)\n", s, mc);
        printf("%10s", "dtype");
        for (int op = 0; op < WEFT_AVG; op++)
            printf(" %10s", weft_op_name(op));
        printf("\n");
        for (int d = 0; d < WEFT_DTYPE_COUNT; d++) {
            fill(m.a, table_b, d);
            fill(m.b, table_b, d);
            printf("%10s", weft_dtype_name(d));
            for (int op = 0; op < WEFT_AVG; op++) {
                double k;
                measure(&wk, 1, &m, d, op, reps, &k);
                printf(" %10.2f", k);
            }
            printf("\n");
            fflush(stdout);
        }
    }
    free(m.a);
    free(m.b);
    free(m.dst);
    return 0;
}
