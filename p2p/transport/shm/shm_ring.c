/*
 * SPSC ring of variable-length records in shared memory; see shm_ring.h.
 */
#include "shm_ring.h"

#include <stdatomic.h>
#include <string.h>

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
#define HDR_VALID ((uint64_t)1 << 31)
#define HDR_SKIP ((uint64_t)1 << 30)
#define HDR_LEN_MASK (((uint64_t)1 << 30) - 1)

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

static inline unsigned char *ring_data(struct shm_ring *r)
{
    return (unsigned char *)r + sizeof(struct shm_ring);
}

static inline _Atomic uint64_t *header_at(struct shm_ring *r, uint64_t pos)
{
    return (_Atomic uint64_t *)(ring_data(r) + (pos & (r->capacity - 1)));
}

static inline uint64_t header_word(uint64_t pos, uint64_t flags, uint64_t len)
{
    return ((pos / SHM_RING_ALIGN) << 32) | HDR_VALID | flags | len;
}

static inline uint64_t record_size(uint64_t payload)
{
    return (payload + SHM_RING_REC_HDR + SHM_RING_ALIGN - 1) & ~(uint64_t)(SHM_RING_ALIGN - 1);
}

size_t shm_ring_capacity_for(size_t capacity)
{
    size_t cap = SHM_RING_MIN_CAPACITY;
    while (cap < capacity && cap < ((size_t)1 << 40))
        cap <<= 1;
    return cap;
}

size_t shm_ring_footprint(size_t capacity)
{
    return sizeof(struct shm_ring) + shm_ring_capacity_for(capacity);
}

struct shm_ring *shm_ring_init(void *mem, size_t capacity)
{
    if (mem == NULL || ((uintptr_t)mem % SHM_RING_ALIGN) != 0)
        return NULL;
    struct shm_ring *r = mem;
    memset(r, 0, sizeof(*r));
    r->capacity = shm_ring_capacity_for(capacity);
    r->max_payload = shm_ring_max_payload_for(capacity);
    atomic_init(header_at(r, 0), 0);  /* nothing published yet */
    atomic_init(&r->head, 0);
    atomic_init(&r->tail, 0);
    atomic_init(&r->producer_waiting, 0);
    r->magic = SHM_RING_MAGIC;
    return r;
}

struct shm_ring *shm_ring_attach(void *mem, size_t avail)
{
    if (mem == NULL || ((uintptr_t)mem % SHM_RING_ALIGN) != 0 || avail < sizeof(struct shm_ring))
        return NULL;
    struct shm_ring *r = mem;
    uint64_t cap = r->capacity;
    if (r->magic != SHM_RING_MAGIC || cap < SHM_RING_MIN_CAPACITY || (cap & (cap - 1)) != 0 ||
        cap > avail - sizeof(struct shm_ring) || r->max_payload > cap / 2)
        return NULL;
    return r;
}

size_t shm_ring_max_payload_for(size_t capacity)
{
    /* Half the ring, so a record always fits once the consumer caught up,
     * wherever head stands (one line always stays free); capped so the
     * 30-bit length field holds it. */
    uint64_t max = shm_ring_capacity_for(capacity) / 2 - SHM_RING_REC_HDR;
    return (size_t)(max > HDR_LEN_MASK ? HDR_LEN_MASK : max);
}

size_t shm_ring_max_payload(const struct shm_ring *r)
{
    return (size_t)r->max_payload;
}

/* Bytes the producer needs for a record of `need` bytes at head: the record
 * itself plus, if it would cross the end of the data area, the skip. */
static inline uint64_t bytes_needed(const struct shm_ring *r, uint64_t head, uint64_t need, uint64_t *pad)
{
    uint64_t to_end = r->capacity - (head & (r->capacity - 1));
    *pad = need <= to_end ? 0 : to_end;
    return need + *pad;
}

/* total + one line: the line after the newest record must stay writable
 * for the invalid header (see the header comment). */
static int room_for(struct shm_ring *r, uint64_t head, uint64_t total)
{
    if (r->capacity - (head - r->cached_tail) >= total + SHM_RING_ALIGN)
        return 1;
    r->cached_tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    return r->capacity - (head - r->cached_tail) >= total + SHM_RING_ALIGN;
}

void *shm_ring_reserve(struct shm_ring *r, size_t len)
{
    if (len > r->max_payload)
        return NULL;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t pad;
    uint64_t total = bytes_needed(r, head, record_size(len), &pad);
    if (!room_for(r, head, total))
        return NULL;
    r->pending_pad = pad;
    r->pending_len = len;
    uint64_t pos = (head + pad) & (r->capacity - 1);
    return ring_data(r) + pos + SHM_RING_REC_HDR;
}

void shm_ring_commit(struct shm_ring *r, size_t len)
{
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    if (len > r->pending_len)
        len = (size_t)r->pending_len;   /* never publish more than was reserved */
    uint64_t pos = head + r->pending_pad;
    uint64_t next = pos + record_size(len);
    /* the header after this record reads invalid before this one is valid */
    atomic_store_explicit(header_at(r, next), 0, memory_order_relaxed);
    /* release: payload and the invalid header above are visible first */
    atomic_store_explicit(header_at(r, pos), header_word(pos, 0, len), memory_order_release);
    if (r->pending_pad)
        atomic_store_explicit(header_at(r, head),
                              header_word(head, HDR_SKIP, r->pending_pad - SHM_RING_REC_HDR),
                              memory_order_release);
    /* head: for the producer's own accounting and shm_ring_empty */
    atomic_store_explicit(&r->head, next, memory_order_release);
    r->pending_pad = 0;
    r->pending_len = 0;
}

const void *shm_ring_peek(struct shm_ring *r, size_t *len)
{
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    for (;;) {
        uint64_t w = atomic_load_explicit(header_at(r, tail), memory_order_acquire);
        if (!(w & HDR_VALID) || (uint32_t)(w >> 32) != (uint32_t)(tail / SHM_RING_ALIGN))
            return NULL;
        uint64_t pos = tail & (r->capacity - 1);
        if (w & HDR_SKIP) {
            /* give the skipped tail end back at once, then look at offset 0 */
            tail += r->capacity - pos;
            atomic_store_explicit(&r->tail, tail, memory_order_release);
            continue;
        }
        r->peeked_size = record_size(w & HDR_LEN_MASK);
        *len = (size_t)(w & HDR_LEN_MASK);
        return ring_data(r) + pos + SHM_RING_REC_HDR;
    }
}

void shm_ring_release(struct shm_ring *r)
{
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    /* release: our reads of the record finish before the producer reuses it */
    atomic_store_explicit(&r->tail, tail + r->peeked_size, memory_order_release);
    r->peeked_size = 0;
}

int shm_ring_empty(struct shm_ring *r)
{
    return atomic_load_explicit(&r->head, memory_order_acquire) ==
           atomic_load_explicit(&r->tail, memory_order_acquire);
}

size_t shm_ring_used(struct shm_ring *r)
{
    return (size_t)(atomic_load_explicit(&r->head, memory_order_acquire) -
                    atomic_load_explicit(&r->tail, memory_order_acquire));
}

int shm_ring_has_room(struct shm_ring *r, size_t len)
{
    if (len > r->max_payload)
        return 0;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t pad;
    return room_for(r, head, bytes_needed(r, head, record_size(len), &pad));
}

int shm_ring_would_fit(struct shm_ring *r, size_t len)
{
    if (len > r->max_payload)
        return 0;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    uint64_t pad;
    return r->capacity - (head - tail) >= bytes_needed(r, head, record_size(len), &pad) + SHM_RING_ALIGN;
}

int shm_ring_want_room(struct shm_ring *r, size_t len)
{
    atomic_store_explicit(&r->producer_waiting, 1, memory_order_relaxed);
    /* Dekker with the consumer's release + fence + shm_ring_take_waiter:
     * one of us sees the other's store. */
    atomic_thread_fence(memory_order_seq_cst);
    return shm_ring_has_room(r, len);
}

int shm_ring_take_waiter(struct shm_ring *r)
{
    if (atomic_load_explicit(&r->producer_waiting, memory_order_relaxed) == 0)
        return 0;
    return atomic_exchange_explicit(&r->producer_waiting, 0, memory_order_acq_rel) != 0;
}
