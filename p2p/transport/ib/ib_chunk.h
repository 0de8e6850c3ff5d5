/*
 * How a rendezvous message is cut into RDMA writes, and over how many QPs
 * they go. Sender and receiver both evaluate this (the receiver to know how
 * many WRITE_WITH_IMM completions end the message), so it depends only on
 * values both sides hold: the message size, the pair's chunk size and the
 * pair's QP count.
 *
 * Chunks are `max` bytes, except the tail. No write is ever below
 * IB_CHUNK_MIN bytes (tiny RDMA writes have failed on some hardware): a
 * short tail is merged with the chunk before it and the two are split
 * evenly. That needs max >= 2 * IB_CHUNK_MIN, and every message cut here is
 * >= 65 bytes (WEFT_IB_EAGER >= 64), so a single chunk is never short.
 */
#ifndef WEFT_IB_CHUNK_H
#define WEFT_IB_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#define IB_CHUNK_MIN 32u

/* Number of writes for bytes (>= 1 for bytes >= 1). */
static inline uint64_t ib_chunk_count(uint64_t bytes, uint64_t max)
{
    return bytes == 0 ? 1 : (bytes + max - 1) / max;
}

/* Offset and length of write k of ib_chunk_count(bytes, max). */
static inline void ib_chunk_at(uint64_t bytes, uint64_t max, uint64_t k, uint64_t *off, uint64_t *len)
{
    uint64_t n = ib_chunk_count(bytes, max);
    uint64_t tail = bytes - (n - 1) * max;

    if (n >= 2 && tail < IB_CHUNK_MIN && k >= n - 2) {
        uint64_t both = max + tail, first = both / 2;
        *off = (n - 2) * max + (k == n - 2 ? 0 : first);
        *len = k == n - 2 ? first : both - first;
        return;
    }
    *off = k * max;
    *len = k == n - 1 ? tail : max;
}

/* QPs that carry a part of the message (each ends with WRITE_WITH_IMM). */
static inline unsigned ib_chunk_qps_used(uint64_t bytes, uint64_t max, unsigned nqp)
{
    uint64_t n = ib_chunk_count(bytes, max);
    return n < nqp ? (unsigned)n : nqp;
}

#endif
