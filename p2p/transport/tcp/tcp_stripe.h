/*
 * Striping of one rendezvous message across the data sockets of a TCP peer.
 *
 * A message of n bytes is cut into chunks of `chunk` bytes (the last one may
 * be shorter); chunk i travels on data socket i % streams. Both ends compute
 * the same layout from (n, chunk, streams), so the sockets carry raw bytes:
 * socket s carries, message after message, the concatenation of its chunks.
 * A position inside that per-socket share ("share offset") maps back to a
 * position in the message with weft_stripe_locate().
 *
 * Pure arithmetic, no I/O: unit-tested in tests/test_tcp_stripe.cc.
 * All sizes are 64-bit so messages above 4 GiB stripe correctly.
 */
#ifndef WEFT_TCP_STRIPE_H
#define WEFT_TCP_STRIPE_H

#include <stddef.h>
#include <stdint.h>

/* Number of chunks of a message of n bytes (0 for an empty message). */
static inline uint64_t weft_stripe_chunks(uint64_t n, uint64_t chunk)
{
    return n == 0 ? 0 : (n - 1) / chunk + 1;
}

/* Bytes socket s (0 <= s < streams) carries for a message of n bytes. */
static inline uint64_t weft_stripe_share(uint64_t n, uint64_t chunk, unsigned streams, unsigned s)
{
    uint64_t nchunks = weft_stripe_chunks(n, chunk);
    if (s >= nchunks)
        return 0;
    uint64_t mine = (nchunks - 1 - s) / streams + 1;   /* chunks s, s+streams, ... */
    uint64_t bytes = mine * chunk;
    uint64_t last = nchunks - 1;
    uint64_t tail = n - last * chunk;                  /* size of the last chunk, 1..chunk */
    if (last % streams == s)
        bytes -= chunk - tail;                         /* my last chunk is the short one */
    return bytes;
}

/* Maps share offset `off` of socket s (off < weft_stripe_share(...)) to the
 * message offset it stands for, and the number of bytes from there that are
 * contiguous in both the share and the message (the rest of that chunk). */
static inline void weft_stripe_locate(uint64_t n, uint64_t chunk, unsigned streams, unsigned s,
                                      uint64_t off, uint64_t *msg_off, uint64_t *contig)
{
    uint64_t k = off / chunk;                          /* k-th chunk of this socket */
    uint64_t within = off % chunk;
    uint64_t start = ((uint64_t)s + k * streams) * chunk;
    uint64_t end = start + chunk < n ? start + chunk : n;
    *msg_off = start + within;
    *contig = end - start - within;
}

#endif
