/*
 * A single-producer single-consumer ring of variable-length records that
 * lives in shared memory (the caller places it; nothing in it is a pointer,
 * so every process may map it at a different address).
 *
 * head (bytes ever committed) and tail (bytes ever released) are 64-bit
 * counters that never wrap in practice; each sits on its own cache line so
 * the producer and the consumer do not bounce one line between cores.
 * Every record starts on a 64-byte boundary with an 8-byte header word
 * (length, flags and a lap stamp) that the producer writes last; the
 * consumer polls that word at its tail, so a small record costs one cache
 * line transfer. A record's payload is 8 bytes past a cache-line start, so
 * a payload that itself begins with a 56-byte header puts its data 64-byte
 * aligned. A record never wraps: when it does not fit before the end of
 * the data area, the producer fills the rest with a skip record and starts
 * at 0. One line of the ring always stays free (see shm_ring.c).
 *
 * Use: producer shm_ring_reserve -> write -> shm_ring_commit;
 *      consumer shm_ring_peek -> read -> shm_ring_release.
 * Only one thread may produce and one consume at a time (callers lock).
 */
#ifndef WEFT_SHM_RING_H
#define WEFT_SHM_RING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHM_RING_ALIGN 64u     /* record alignment: one cache line */
#define SHM_RING_REC_HDR 8u    /* bytes of record header before each payload */

/* The ring's layout is in shm_ring_inline.h (C11 atomics, which C++ code
 * including this header cannot see); only C files on the hot path (shm.c)
 * include it, everyone else goes through the functions below. */
struct shm_ring;

/* Capacity actually used for a request of `capacity` bytes (rounded up to a
 * power of two, at least 4 KiB). */
size_t shm_ring_capacity_for(size_t capacity);

/* Bytes of shared memory a ring with that capacity occupies (header + data);
 * a multiple of 64. */
size_t shm_ring_footprint(size_t capacity);

/* Builds an empty ring in mem (64-byte aligned, shm_ring_footprint bytes).
 * Returns mem as a ring, or NULL if mem is misaligned. */
struct shm_ring *shm_ring_init(void *mem, size_t capacity);

/* Checks that mem holds a ring built by shm_ring_init whose footprint fits in
 * `avail` bytes (a peer's segment is not trusted blindly). NULL if not. */
struct shm_ring *shm_ring_attach(void *mem, size_t avail);

/* Largest payload one record may carry (about capacity / 2, at most 1 GiB). */
size_t shm_ring_max_payload(const struct shm_ring *r);

/* The same, for a ring of that requested capacity, before it exists. */
size_t shm_ring_max_payload_for(size_t capacity);

/* Producer: room for a record with a payload of len bytes. Returns where to
 * write the payload (8-byte aligned, 8 bytes past a 64-byte boundary), or
 * NULL when the ring has no room now or len > max payload. A second reserve
 * without commit replaces the first. */
void *shm_ring_reserve(struct shm_ring *r, size_t len);

/* Producer: publishes the reserved record with len <= the reserved length. */
void shm_ring_commit(struct shm_ring *r, size_t len);

/* Consumer: the oldest record's payload and its length, or NULL if the ring
 * is empty. The same record is returned until shm_ring_release. */
const void *shm_ring_peek(struct shm_ring *r, size_t *len);

/* Consumer: frees the record returned by the last peek. */
void shm_ring_release(struct shm_ring *r);

/* Either side: nothing committed that the consumer has not released. */
int shm_ring_empty(struct shm_ring *r);

/* Producer: bytes committed minus bytes released (for tests and sleep checks). */
size_t shm_ring_used(struct shm_ring *r);

/* Producer: whether a reserve of len bytes would succeed now. */
int shm_ring_has_room(struct shm_ring *r, size_t len);

/* Either side, without touching the producer's private fields (safe from a
 * thread that does not own the producer side): whether a record of len
 * bytes would fit now. */
int shm_ring_would_fit(struct shm_ring *r, size_t len);

/* Producer, after a failed reserve: asks the consumer for a wake-up when it
 * frees space. Returns whether room for len appeared meanwhile (then retry
 * at once). Uses a full fence so a consumer releasing concurrently either
 * sees the flag or this call sees the freed space. */
int shm_ring_want_room(struct shm_ring *r, size_t len);

/* Consumer, after releasing records (and a seq_cst fence): whether the
 * producer asked for a wake-up; clears the request. */
int shm_ring_take_waiter(struct shm_ring *r);

#ifdef __cplusplus
}
#endif

#endif
