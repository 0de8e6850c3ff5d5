/* Payload buffers of the pipe layer, kept for reuse (payload.h says why). */
#include "payload.h"

#include <stdlib.h>

/* The class of a len-byte buffer (its size rounded up to a power of two),
 * or -1 when it is not cached. */
static int payload_class(size_t len)
{
    if (len <= ((size_t)1 << (WEFT_PAYLOAD_MIN_SHIFT - 1)))
        return -1;   /* up to 2 KiB: malloc's small bins serve these well */
    int k = 0;
    while (((size_t)1 << (WEFT_PAYLOAD_MIN_SHIFT + k)) < len) {
        if (++k >= WEFT_PAYLOAD_CLASSES)
            return -1;
    }
    return k;
}

/* Buffers kept in class k: WEFT_PAYLOAD_DEPTH, but no more than 1 MiB of
 * them (16 of 64 KiB ... 1 of 1 MiB). */
static unsigned payload_depth(int k)
{
    size_t bytes = (size_t)1 << (WEFT_PAYLOAD_MIN_SHIFT + k);
    size_t fit = ((size_t)1 << 20) / bytes;
    return fit >= WEFT_PAYLOAD_DEPTH ? WEFT_PAYLOAD_DEPTH : fit > 0 ? (unsigned)fit : 1;
}

void *weft_payload_get(struct weft_payload_cache *c, size_t len)
{
    int k = payload_class(len);
    if (k < 0)
        return malloc(len);
    if (c->n[k] > 0)
        return c->free[k][--c->n[k]];
    return malloc((size_t)1 << (WEFT_PAYLOAD_MIN_SHIFT + k));
}

void weft_payload_put(struct weft_payload_cache *c, void *buf, size_t len)
{
    if (buf == NULL)
        return;
    int k = payload_class(len);
    if (k >= 0 && c->n[k] < payload_depth(k)) {
        c->free[k][c->n[k]++] = buf;
        return;
    }
    free(buf);
}

void weft_payload_cache_fini(struct weft_payload_cache *c)
{
    for (int k = 0; k < WEFT_PAYLOAD_CLASSES; k++) {
        while (c->n[k] > 0)
            free(c->free[k][--c->n[k]]);
    }
}
