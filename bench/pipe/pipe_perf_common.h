/*
 * What pipe_perf_weft.c and pipe_perf_tp.cc share, so both harnesses measure
 * exactly the same thing: the sizes, how many iterations and windows each
 * size gets, the data pattern and its check, the clock, the median and the
 * result line that bench/pipe/run.sh parses. C and C++ alike (header only).
 *
 * The measurement (both libraries):
 *  - latency: rank/role 0 writes one message (1 tensor of N bytes, or 8
 *    tensors of N/8), role 1 reads it (read descriptor -> pick preallocated
 *    buffers sized from the descriptor -> read) and writes a message of the
 *    same shape back from its own buffers; role 0 reads that. Each next step
 *    is issued from the previous step's callback, as an RPC loop would, so
 *    neither library pays a thread hand-off per message; the main thread
 *    only waits for the end. Result: median over iterations of half the
 *    round trip.
 *  - bandwidth: role 0 writes a window of W messages back to back, role 1
 *    reads each into its own preallocated slot and, after the W-th, writes
 *    a 1-byte ack; the next window starts when the ack was read and every
 *    write was called back. Result: W * N / median window time.
 *  - data: the first (untimed, warm-up) message of every size and shape is
 *    checked byte by byte; every later one has the first and last byte of
 *    each tensor poisoned before the read and checked after it, so a pipe
 *    that delivers nothing cannot look fast.
 */
#ifndef PIPE_PERF_COMMON_H
#define PIPE_PERF_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PP_KIB ((size_t)1024)
#define PP_MIB (PP_KIB * 1024)
#define PP_MAX_TENSORS 8
/* The receiver's slots for one window never exceed this many bytes. */
#define PP_SLOT_BYTES (256 * PP_MIB)

static const size_t pp_sizes[] = {
    8, 64, PP_KIB, 4 * PP_KIB, 16 * PP_KIB, 64 * PP_KIB, 256 * PP_KIB,
    PP_MIB, 4 * PP_MIB, 16 * PP_MIB, 64 * PP_MIB,
};
#define PP_NSIZES (sizeof pp_sizes / sizeof pp_sizes[0])

static inline double pp_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Round trips timed per size: many for small messages (the median of a
 * noisy 2-core machine needs them), ~256 MiB each way for large ones, at
 * least 10. scale (-s) multiplies it (quick runs: 0.1). */
static inline int pp_lat_iters(size_t n, double scale)
{
    size_t it = n <= 4 * PP_KIB ? 1000 : (256 * PP_MIB) / n;
    if (it > 1000) it = 1000;
    if (it < 10) it = 10;
    it = (size_t)((double)it * scale);
    return it < 3 ? 3 : (int)it;
}
/* Outstanding writes per window: 16, fewer where 16 slots would pass
 * PP_SLOT_BYTES (64 MiB: 4). */
static inline int pp_window(size_t n)
{
    size_t w = PP_SLOT_BYTES / n;
    if (w > 16) w = 16;
    if (w < 2) w = 2;
    return (int)w;
}
/* Windows timed per size: ~1 GiB in all, at most 500, at least 5. */
static inline int pp_bw_windows(size_t n, double scale)
{
    size_t w = (size_t)pp_window(n);
    size_t it = (1024 * PP_MIB) / (w * n);
    if (it > 500) it = 500;
    if (it < 5) it = 5;
    it = (size_t)((double)it * scale);
    return it < 3 ? 3 : (int)it;
}
/* Untimed iterations before the timed ones (the first is the checked one). */
static inline int pp_warmup(int iters)
{
    int w = iters / 10;
    return w < 2 ? 2 : w;
}

/* The byte at offset i of tensor t of a message of `total` bytes written by
 * role `dir` (0 or 1): depends on all four, so a message from another size,
 * tensor or direction does not match. */
static inline unsigned char pp_byte(size_t total, int t, int dir, size_t i)
{
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)total * 31u + (uint64_t)t * 977u
                 + (uint64_t)dir * 0x5bd1e995u;
    return (unsigned char)(x >> 56) ^ (unsigned char)(i >> 12);
}
static inline void pp_fill(unsigned char *p, size_t bytes, size_t total, int t, int dir)
{
    for (size_t i = 0; i < bytes; i++) p[i] = pp_byte(total, t, dir, i);
}
/* 0 if good, else prints what differs and returns -1. */
static inline int pp_check(const unsigned char *p, size_t bytes, size_t total, int t, int dir, const char *who)
{
    for (size_t i = 0; i < bytes; i++) {
        if (p[i] != pp_byte(total, t, dir, i)) {
            fprintf(stderr, "%s: DATA CHECK FAILED: message of %zu bytes, tensor %d, byte %zu of %zu: got 0x%02x, "
                            "expected 0x%02x\n", who, total, t, i, bytes, p[i], pp_byte(total, t, dir, i));
            return -1;
        }
    }
    return 0;
}
/* The per-message spot check: first and last byte of a tensor. */
static inline void pp_poison(unsigned char *p, size_t bytes, size_t total, int t, int dir)
{
    if (bytes == 0) return;
    p[0] = (unsigned char)~pp_byte(total, t, dir, 0);
    p[bytes - 1] = (unsigned char)~pp_byte(total, t, dir, bytes - 1);
}
static inline int pp_spot(const unsigned char *p, size_t bytes, size_t total, int t, int dir, const char *who)
{
    if (bytes == 0) return 0;
    if (p[0] != pp_byte(total, t, dir, 0) || p[bytes - 1] != pp_byte(total, t, dir, bytes - 1)) {
        fprintf(stderr, "%s: DATA CHECK FAILED: message of %zu bytes, tensor %d: first/last byte not delivered\n",
                who, total, t);
        return -1;
    }
    return 0;
}

static inline int pp_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* Sorts v in place. */
static inline double pp_median(double *v, int n)
{
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, pp_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Parses 8, 64k, 4m, 1g. 0 on a bad value. */
static inline size_t pp_parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return 0;
    switch (*end) {
    case 'k': case 'K': v *= 1024ull; end++; break;
    case 'm': case 'M': v *= 1024ull * 1024; end++; break;
    case 'g': case 'G': v *= 1024ull * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'b' || *end == 'B') end++;
    return *end ? 0 : (size_t)v;
}

/* One result line per (size, tensors); run.sh reads the key=value pairs. */
static inline void pp_print_row(const char *lib, const char *conf, size_t size, int tensors, double lat_us,
                                int lat_iters, double bw_gbs, int window, int windows)
{
    printf("row lib=%s conf=%s size=%zu tensors=%d lat_us=%.3f bw_GBps=%.4f lat_iters=%d window=%d windows=%d\n",
           lib, conf, size, tensors, lat_us, bw_gbs, lat_iters, window, windows);
    fflush(stdout);
}

#endif
