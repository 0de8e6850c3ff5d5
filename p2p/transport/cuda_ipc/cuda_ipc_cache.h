/*
 * CUDA IPC mapping cache (used by the cuda_ipc transport, cuda_ipc.c).
 *
 * Opening a peer's IPC handle is costly, and a second open of the same
 * handle in one process fails on real drivers (cudaErrorAlreadyMapped), so
 * the importer keeps every mapping it opened, keyed by
 * (peer, exporter's allocation base, exporter's buffer id):
 *
 *   - hit: same peer, base and buffer id -> the mapping already open;
 *   - stale: same peer and base, another buffer id -> the exporter freed the
 *     allocation and got the same address again: the old mapping is closed
 *     (once no copy uses it any more) and the new one opened;
 *   - LRU eviction: beyond `cap` entries the least recently used entries
 *     with no copy in flight are closed; entries in use are never closed, so
 *     the cache may exceed its cap while that many copies are in flight.
 *
 * Entries are reference counted by the copies in flight (get = +1,
 * put = -1). Opening and closing go through ops, so the cache needs no CUDA
 * (unit tests use fake ops). The same structure serves as the exporter's
 * cache of handles (peer -1, open = cudaIpcGetMemHandle, no close).
 *
 * Not thread safe: the caller holds the pipe layer's lock.
 */
#ifndef WEFT_CUDA_IPC_CACHE_H
#define WEFT_CUDA_IPC_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include "list.h"

#define WEFT_IPC_CACHE_DATA 96   /* bytes of owner data per entry (an IPC handle and its block) */

struct weft_ipc_cache_entry {
    int       peer;
    uint64_t  base;        /* exporter's allocation base (key) */
    uint64_t  buffer_id;   /* exporter's buffer id (key) */
    void     *mapped;      /* set by ops->open: the local mapping of base */
    uint64_t  size;        /* set by ops->open: bytes mapped from base (0: unknown) */
    uint8_t   data[WEFT_IPC_CACHE_DATA]; /* set by ops->open: owner data (the handle) */
    int       refs;        /* copies in flight */
    int       dead;        /* out of the table (stale or cache destroyed): closed at refs 0 */
    struct weft_list lru;  /* on the LRU list (head = most recently used), or on the dead list */
    struct weft_list hash; /* on its hash bucket's chain (live entries only) */
};

struct weft_ipc_cache_ops {
    /* Opens the mapping of e (peer, base, buffer_id set; arg as given to
     * get): fills e->mapped and/or e->data. Returns 0, or a nonzero code
     * that get() hands back (nothing is cached then). */
    int  (*open)(void *ctx, struct weft_ipc_cache_entry *e, const void *arg);
    /* Closes what open made (NULL: nothing to close). */
    void (*close)(void *ctx, struct weft_ipc_cache_entry *e);
    /* Whether close may run now (NULL: always). When not, an entry to
     * close waits on a list of its own (out of the table, not counted
     * against the cap) and is closed by a later get/put that may, or by
     * destroy. cuda_ipc: not while a stream waits on weft's stream engine,
     * since closing a mapping waits for the device (cudawrap.h). */
    int  (*may_close)(void *ctx);
};

struct weft_ipc_cache_stats {
    uint64_t hits;        /* gets answered from the cache */
    uint64_t opens;       /* successful opens */
    uint64_t open_fails;
    uint64_t closes;      /* closes (stale + evicted + destroy) */
    uint64_t stale;       /* entries replaced because the buffer id changed */
    uint64_t evictions;   /* entries closed by the LRU cap */
    uint64_t deferred;    /* closes put off because may_close said no */
    size_t   entries;     /* entries in the table now */
};

struct weft_ipc_cache;

/* cap >= 1 entries. NULL: no memory. */
struct weft_ipc_cache *weft_ipc_cache_create(size_t cap, const struct weft_ipc_cache_ops *ops, void *ctx);
/* Closes every entry (also those still referenced: the caller made sure no
 * copy is in flight) and frees the cache. NULL is fine. */
void weft_ipc_cache_destroy(struct weft_ipc_cache *c);

/* The entry for (peer, base, buffer_id), opened if needed (a stale entry at
 * (peer, base) is replaced), with one more reference. Returns 0 and *out,
 * or the open's nonzero code (or -1: no memory) and *out = NULL. *hit (may
 * be NULL) tells whether nothing had to be opened. */
int  weft_ipc_cache_get(struct weft_ipc_cache *c, int peer, uint64_t base, uint64_t buffer_id,
                        const void *arg, struct weft_ipc_cache_entry **out, int *hit);
/* Drops one reference (the copy is done); may close the entry (stale, or
 * over the cap). */
void weft_ipc_cache_put(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e);

/* Closes the entries of peer (-1: every peer) with no copy in flight whose
 * mapping [base, base + size) overlaps [lo, hi) (hi 0: every entry), those
 * parked for closing included. Returns how many were closed, or -1 when
 * may_close says no now (nothing closed). What a caller does when an open
 * fails because a mapping of the same memory is still open
 * (cudaErrorAlreadyMapped): close the overlapping ones and retry. */
int  weft_ipc_cache_purge(struct weft_ipc_cache *c, int peer, uint64_t lo, uint64_t hi);

/* The live entry for (peer, base), or NULL; no reference, no LRU update. */
struct weft_ipc_cache_entry *weft_ipc_cache_peek(const struct weft_ipc_cache *c, int peer, uint64_t base);

void weft_ipc_cache_get_stats(const struct weft_ipc_cache *c, struct weft_ipc_cache_stats *out);

#endif
