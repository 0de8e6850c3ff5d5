/*
 * The ring's layout and its per-record operations as static inline
 * functions, for the C files on the hot path (shm.c, shm_ring.c): a call
 * into shm_ring.c per reserve, commit, peek and release cost more than the
 * work itself on a small message. C only (C11 atomics); C++ code (the
 * tests) keeps using the out-of-line functions of shm_ring.h, which wrap
 * these, so both see one implementation.
 */
#ifndef WEFT_SHM_RING_INLINE_H
#define WEFT_SHM_RING_INLINE_H

#ifdef __cplusplus
#error "shm_ring_inline.h is C only: C++ code uses shm_ring.h"
#endif

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "shm_ring.h"

#define SHM_RING_MAGIC 0x31474e4952544657ull /* "WFTRING1" */
#define SHM_RING_MIN_CAPACITY 4096u

/* Every record starts with one 64-bit header word, written last (release):
 *   bits 63..32  lap stamp: (position / 64) truncated, so a header left from
 *                an earlier lap never reads as current
 *   bit  31      valid
 *   bit  30      skip: the rest of the data area is padding
 *   bits 29..0   payload length
 * The consumer polls the header at its tail instead of the producer's head
 * counter: one cache line crosses cores per small record, not two. The
 * producer keeps the header after its newest record invalid (it zeroes it
 * before publishing), so the consumer never mistakes stale payload bytes
 * for a header; that is why one line of the ring always stays free. */
#define SHM_RING_HDR_VALID ((uint64_t)1 << 31)
#define SHM_RING_HDR_SKIP ((uint64_t)1 << 30)
#define SHM_RING_HDR_LEN_MASK (((uint64_t)1 << 30) - 1)

struct shm_ring {
    /* written by the producer, read by the consumer */
    _Alignas(64) _Atomic uint64_t head;
    /* written by the consumer, read by the producer */
    _Alignas(64) _Atomic uint64_t tail;
    /* set by a producer that found no room and wants a wake-up */
    _Alignas(64) _Atomic uint32_t producer_waiting;
    /* constant after init */
    _Alignas(64) uint64_t capacity;   /* bytes of data area, power of two */
    uint64_t max_payload;
    uint64_t magic;
    /* producer private (in shared memory so no local companion is needed) */
    _Alignas(64) uint64_t cached_tail;
    uint64_t pending_pad;             /* skip bytes before the reserved record */
    uint64_t pending_len;             /* payload bytes reserved */
    /* consumer private */
    _Alignas(64) uint64_t peeked_size;             /* bytes of the record handed out by peek */
};

_Static_assert(sizeof(struct shm_ring) % SHM_RING_ALIGN == 0, "data area must start aligned");
_Static_assert(sizeof(uint64_t) == SHM_RING_REC_HDR, "record header size");

static inline unsigned char *shm_ring_data_(struct shm_ring *r)
{
    return (unsigned char *)r + sizeof(struct shm_ring);
}

static inline _Atomic uint64_t *shm_ring_header_at_(struct shm_ring *r, uint64_t pos)
{
    return (_Atomic uint64_t *)(void *)(shm_ring_data_(r) + (pos & (r->capacity - 1)));
}

static inline uint64_t shm_ring_header_word_(uint64_t pos, uint64_t flags, uint64_t len)
{
    return ((pos / SHM_RING_ALIGN) << 32) | SHM_RING_HDR_VALID | flags | len;
}

static inline uint64_t shm_ring_record_size_(uint64_t payload)
{
    return (payload + SHM_RING_REC_HDR + SHM_RING_ALIGN - 1) & ~(uint64_t)(SHM_RING_ALIGN - 1);
}

/* Bytes the producer needs for a record of `need` bytes at head: the record
 * itself plus, if it would cross the end of the data area, the skip. */
static inline uint64_t shm_ring_bytes_needed_(const struct shm_ring *r, uint64_t head, uint64_t need,
                                              uint64_t *pad)
{
    uint64_t to_end = r->capacity - (head & (r->capacity - 1));
    *pad = need <= to_end ? 0 : to_end;
    return need + *pad;
}

/* total + one line: the line after the newest record must stay writable
 * for the invalid header (see above). The cached tail answers most calls
 * without touching the consumer's line. */
static inline int shm_ring_room_for_(struct shm_ring *r, uint64_t head, uint64_t total)
{
    if (__builtin_expect(r->capacity - (head - r->cached_tail) >= total + SHM_RING_ALIGN, 1))
        return 1;
    r->cached_tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    return r->capacity - (head - r->cached_tail) >= total + SHM_RING_ALIGN;
}

static inline size_t shm_ring_max_payload_inl(const struct shm_ring *r)
{
    return (size_t)r->max_payload;
}

static inline void *shm_ring_reserve_inl(struct shm_ring *r, size_t len)
{
    if (__builtin_expect(len > r->max_payload, 0))
        return NULL;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t pad;
    uint64_t total = shm_ring_bytes_needed_(r, head, shm_ring_record_size_(len), &pad);
    if (!shm_ring_room_for_(r, head, total))
        return NULL;
    r->pending_pad = pad;
    r->pending_len = len;
    uint64_t pos = (head + pad) & (r->capacity - 1);
    return shm_ring_data_(r) + pos + SHM_RING_REC_HDR;
}

static inline void shm_ring_commit_inl(struct shm_ring *r, size_t len)
{
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    if (__builtin_expect(len > r->pending_len, 0))
        len = (size_t)r->pending_len;   /* never publish more than was reserved */
    uint64_t pad = r->pending_pad;
    uint64_t pos = head + pad;
    uint64_t next = pos + shm_ring_record_size_(len);
    /* the header after this record reads invalid before this one is valid */
    atomic_store_explicit(shm_ring_header_at_(r, next), 0, memory_order_relaxed);
    /* release: payload and the invalid header above are visible first */
    atomic_store_explicit(shm_ring_header_at_(r, pos), shm_ring_header_word_(pos, 0, len), memory_order_release);
    if (__builtin_expect(pad != 0, 0)) {
        atomic_store_explicit(shm_ring_header_at_(r, head),
                              shm_ring_header_word_(head, SHM_RING_HDR_SKIP, pad - SHM_RING_REC_HDR),
                              memory_order_release);
    }
    /* head: for the producer's own accounting and shm_ring_empty */
    atomic_store_explicit(&r->head, next, memory_order_release);
    r->pending_pad = 0;
    r->pending_len = 0;
}

static inline const void *shm_ring_peek_inl(struct shm_ring *r, size_t *len)
{
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    for (;;) {
        uint64_t w = atomic_load_explicit(shm_ring_header_at_(r, tail), memory_order_acquire);
        if (!(w & SHM_RING_HDR_VALID) || (uint32_t)(w >> 32) != (uint32_t)(tail / SHM_RING_ALIGN))
            return NULL;
        uint64_t pos = tail & (r->capacity - 1);
        if (__builtin_expect((w & SHM_RING_HDR_SKIP) != 0, 0)) {
            /* give the skipped tail end back at once, then look at offset 0 */
            tail += r->capacity - pos;
            atomic_store_explicit(&r->tail, tail, memory_order_release);
            continue;
        }
        r->peeked_size = shm_ring_record_size_(w & SHM_RING_HDR_LEN_MASK);
        *len = (size_t)(w & SHM_RING_HDR_LEN_MASK);
        return shm_ring_data_(r) + pos + SHM_RING_REC_HDR;
    }
}

static inline void shm_ring_release_inl(struct shm_ring *r)
{
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    /* release: our reads of the record finish before the producer reuses it */
    atomic_store_explicit(&r->tail, tail + r->peeked_size, memory_order_release);
    r->peeked_size = 0;
}

/* Consumer: whether peek would return a record (or a skip to step over):
 * the header word at the tail is valid and of this lap. One load of the
 * line the producer writes; an idle poll costs no more. */
static inline int shm_ring_ready_inl(struct shm_ring *r)
{
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t w = atomic_load_explicit(shm_ring_header_at_(r, tail), memory_order_relaxed);
    return (w & SHM_RING_HDR_VALID) && (uint32_t)(w >> 32) == (uint32_t)(tail / SHM_RING_ALIGN);
}

/* Consumer: whether records were committed behind the one peeked last
 * (behind the tail when none is peeked). */
static inline int shm_ring_more_inl(struct shm_ring *r)
{
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    return atomic_load_explicit(&r->head, memory_order_acquire) > tail + r->peeked_size;
}

/* Either side: nothing committed that the consumer has not released. */
static inline int shm_ring_empty_inl(struct shm_ring *r)
{
    return atomic_load_explicit(&r->head, memory_order_acquire) ==
           atomic_load_explicit(&r->tail, memory_order_acquire);
}

/* Consumer, after releasing records (and a seq_cst fence): whether the
 * producer asked for a wake-up; clears the request. The plain load first
 * keeps the usual answer (no) from taking the line exclusive. */
static inline int shm_ring_take_waiter_inl(struct shm_ring *r)
{
    if (atomic_load_explicit(&r->producer_waiting, memory_order_relaxed) == 0)
        return 0;
    return atomic_exchange_explicit(&r->producer_waiting, 0, memory_order_acq_rel) != 0;
}

#endif
