/*
 * A piece of a vectored message: host memory, its address in the owner's
 * address space and its length. 16 bytes on every rank, so a peer may read
 * an array of them where it lies (a CMA pull reads the sender's). Here in
 * core because three layers pass them along: the message pipes build them,
 * p2p carries them, transports move the bytes (p2p/transport/tp_iov.h).
 */
#ifndef WEFT_IOV_H
#define WEFT_IOV_H

#include <stdint.h>

struct weft_iov {
    uint64_t base;
    uint64_t len;
};

/* Most pieces in one vectored message. */
#define WEFT_IOV_MAX 64

#endif
