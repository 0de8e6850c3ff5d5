/*
 * SPSC ring of variable-length records in shared memory; see shm_ring.h.
 */
#include "shm_ring_inline.h"

#include <string.h>

/* The layout and the per-record operations live in shm_ring_inline.h (the
 * hot path inlines them); the functions below are the out-of-line API. */
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
    atomic_init(shm_ring_header_at_(r, 0), 0);  /* nothing published yet */
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
    return (size_t)(max > SHM_RING_HDR_LEN_MASK ? SHM_RING_HDR_LEN_MASK : max);
}

size_t shm_ring_max_payload(const struct shm_ring *r)
{
    return shm_ring_max_payload_inl(r);
}

void *shm_ring_reserve(struct shm_ring *r, size_t len)
{
    return shm_ring_reserve_inl(r, len);
}

void shm_ring_commit(struct shm_ring *r, size_t len)
{
    shm_ring_commit_inl(r, len);
}

const void *shm_ring_peek(struct shm_ring *r, size_t *len)
{
    return shm_ring_peek_inl(r, len);
}

void shm_ring_release(struct shm_ring *r)
{
    shm_ring_release_inl(r);
}

int shm_ring_empty(struct shm_ring *r)
{
    return shm_ring_empty_inl(r);
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
    return shm_ring_room_for_(r, head, shm_ring_bytes_needed_(r, head, shm_ring_record_size_(len), &pad));
}

int shm_ring_would_fit(struct shm_ring *r, size_t len)
{
    if (len > r->max_payload)
        return 0;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    uint64_t pad;
    uint64_t total = shm_ring_bytes_needed_(r, head, shm_ring_record_size_(len), &pad);
    return r->capacity - (head - tail) >= total + SHM_RING_ALIGN;
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
    return shm_ring_take_waiter_inl(r);
}
