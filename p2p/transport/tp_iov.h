/*
 * Copies into and out of a transfer's data, one buffer (x->buf) or a
 * vector (x->iov, x->niov: the pieces end to end), at a byte offset of the
 * message. For the transports whose rendezvous moves vectored messages
 * (struct weft_transport.rndv_vectors): the push through a ring or a
 * socket gathers the sender's pieces and scatters into the receiver's, a
 * CMA pull hands both lists to the kernel (weft_tp_iov_range).
 */
#ifndef WEFT_TP_IOV_H
#define WEFT_TP_IOV_H

#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "transport.h"

/* Total bytes of n pieces. */
static inline size_t weft_tp_iov_bytes(const struct weft_iov *iov, size_t n)
{
    size_t t = 0;
    for (size_t i = 0; i < n; i++)
        t += (size_t)iov[i].len;
    return t;
}

/* The struct iovec list of bytes [off, off + len) of the pieces (at most
 * max entries). Returns the entries written; the bytes they cover may fall
 * short of len only when max ran out (never for max >= n). */
static inline int weft_tp_iov_range(const struct weft_iov *iov, size_t n, size_t off, size_t len,
                                    struct iovec *out, int max)
{
    int k = 0;
    for (size_t i = 0; i < n && len > 0 && k < max; i++) {
        size_t l = (size_t)iov[i].len;
        if (off >= l) {
            off -= l;
            continue;
        }
        size_t take = l - off < len ? l - off : len;
        out[k].iov_base = (char *)(uintptr_t)iov[i].base + off;
        out[k].iov_len = take;
        k++;
        len -= take;
        off = 0;
    }
    return k;
}

/* Bytes [off, off + len) of x's data from p (in != 0) or into p. */
static inline void weft_tp_copy(const struct weft_tp_xfer *x, size_t off, void *p, size_t len, int in)
{
    struct weft_iov one = { (uint64_t)(uintptr_t)x->buf, x->bytes };
    const struct weft_iov *iov = x->niov ? x->iov : &one;
    char *q = (char *)p;
    for (uint32_t i = 0; i < (x->niov ? x->niov : 1) && len > 0; i++) {
        size_t l = (size_t)iov[i].len;
        if (off >= l) {
            off -= l;
            continue;
        }
        size_t take = l - off < len ? l - off : len;
        char *at = (char *)(uintptr_t)iov[i].base + off;
        if (in)
            memcpy(at, q, take);
        else
            memcpy(q, at, take);
        q += take;
        len -= take;
        off = 0;
    }
}

static inline void weft_tp_copy_in(const struct weft_tp_xfer *x, size_t off, const void *src, size_t len)
{
    weft_tp_copy(x, off, (void *)(uintptr_t)src, len, 1);
}

static inline void weft_tp_copy_out(const struct weft_tp_xfer *x, size_t off, void *dst, size_t len)
{
    weft_tp_copy(x, off, dst, len, 0);
}

#endif
