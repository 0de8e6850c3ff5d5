/*
 * Payload buffers the pipe layer holds on its own (p2p/pipe.c): an eager
 * message that arrived before its receive (unexpected), a control message
 * queued while its carrier was full. Each lives from its arrival until its
 * match, often microseconds, and a pipelined collective keeps a few of one
 * size coming and going all the time.
 *
 * Why a cache: from malloc, each one was fresh memory. glibc hands large
 * frees back to the kernel (heap trim, munmap) and the next malloc faults
 * every page in again, and on a VM a page fault costs microseconds: a
 * binomial reduce at 2 ranks in 32 KiB pieces (eager on the collective
 * lanes, most arriving before their receive) took 150-250 us for 256 KiB
 * instead of 45-60, nearly all of it in page faults under unexpected_add's
 * copy (perf -e page-faults; glibc told never to trim: 52-61 us). So
 * buffers of more than 2 KiB up to 1 MiB come from per-size-class free
 * lists (powers of two from 4 KiB; up to 32 buffers and 1 MiB kept per
 * class: about 7 MiB at most per comm, and only in the sizes it used);
 * others go to malloc as before.
 *
 * Not thread-safe: the caller holds the p2p lock (as all of pipe.c does).
 */
#ifndef WEFT_P2P_PAYLOAD_H
#define WEFT_P2P_PAYLOAD_H

#include <stddef.h>

#define WEFT_PAYLOAD_MIN_SHIFT 12   /* 4 KiB: smaller buffers are malloc's own business */
#define WEFT_PAYLOAD_CLASSES   9    /* 4 KiB .. 1 MiB */
#define WEFT_PAYLOAD_DEPTH     32   /* most buffers kept per class (fewer from 64 KiB up) */

#ifdef __cplusplus
extern "C" {
#endif

struct weft_payload_cache {
    void    *free[WEFT_PAYLOAD_CLASSES][WEFT_PAYLOAD_DEPTH];
    unsigned n[WEFT_PAYLOAD_CLASSES];
};

/* A buffer of at least len bytes (len > 0), or NULL when out of memory. */
void *weft_payload_get(struct weft_payload_cache *c, size_t len);

/* Gives back a buffer weft_payload_get returned for len (NULL: nothing). */
void weft_payload_put(struct weft_payload_cache *c, void *buf, size_t len);

/* Frees every kept buffer. */
void weft_payload_cache_fini(struct weft_payload_cache *c);

#ifdef __cplusplus
}
#endif

#endif
