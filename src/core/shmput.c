/* Copies into shared memory, streamed when plain copies run slow (shmput.h). */
#include "shmput.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <emmintrin.h>

/* A plain copy slower than this says the lines are coming from another
 * core's cache the slow way (on the reference VM a fast phase's plain
 * copies into a slot run at 9-28 GB/s, a slow phase's at 2.4-4.7). */
#define PUT_SLOW_BYTES_PER_S 6e9
/* Copies streamed after a slow plain one before a plain one looks again
 * (a slow phase lasts seconds to minutes; one slow look in this many
 * costs a few percent). */
#define PUT_STREAM_RUN 128

/* Streamed copies left before the next plain look. The phase is the
 * machine's, not a comm's: one count for the process; relaxed, as a lost
 * update only moves the next look by a copy. */
static atomic_int put_streams_left;

/* SSE2 is part of x86-64: no run-time check. Unaligned loads, aligned
 * streaming stores: the head up to dst's first 64-byte line and the tail
 * go through memcpy. */
static void put_streamed(char *dst, const char *src, size_t n)
{
    size_t head = (size_t)(-(uintptr_t)dst & 63);
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    /* Streaming stores are weakly ordered: fence them before the flag
     * that publishes them. */
    _mm_sfence();
    memcpy(dst + body, src + body, n - body);
}

void weft_shm_put_streamed(void *dst, const void *src, size_t n)
{
    put_streamed(dst, src, n);
}

static double put_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#else
void weft_shm_put_streamed(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}
#endif

void weft_shm_put(void *dst, const void *src, size_t n, size_t stream_min)
{
#if defined(__x86_64__)
    if (stream_min > 0 && n >= stream_min) {
        int left = atomic_load_explicit(&put_streams_left, memory_order_relaxed);
        if (left > 0) {
            atomic_store_explicit(&put_streams_left, left - 1, memory_order_relaxed);
            put_streamed(dst, src, n);
            return;
        }
        double t0 = put_now();
        memcpy(dst, src, n);
        if ((double)n < PUT_SLOW_BYTES_PER_S * (put_now() - t0))
            atomic_store_explicit(&put_streams_left, PUT_STREAM_RUN, memory_order_relaxed);
        return;
    }
#endif
    memcpy(dst, src, n);
}
