/* Streaming copies into shared memory (shmput.h). */
#include "shmput.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

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
#endif

void weft_shm_put(void *dst, const void *src, size_t n, size_t stream_min)
{
#if defined(__x86_64__)
    if (stream_min > 0 && n >= stream_min) {
        put_streamed(dst, src, n);
        return;
    }
#endif
    memcpy(dst, src, n);
}
