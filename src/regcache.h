/*
 * Registration cache: pinned memory regions for RDMA, keyed by page range.
 *
 * Registering memory with the NIC costs tens of microseconds and more per
 * page, so a transport never registers per message: it asks the cache for a
 * region covering [addr, addr+len), uses the region's keys, and releases it
 * when the work requests that use it have completed. A repeated transfer
 * from the same buffer is a lookup.
 *
 *  - Entries cover whole pages. A request inside an existing entry is a hit.
 *  - An entry is refcounted while in flight; only entries with refcount 0
 *    are evicted, least recently used first, when pinning a new region would
 *    exceed the cap on pinned bytes. When everything is in flight the new
 *    region is registered anyway (the cap is exceeded until releases bring
 *    it back) -- refusing would deadlock a transfer larger than the cap.
 *  - cap 0 disables caching: every acquire registers, every final release
 *    deregisters.
 *  - weft_regcache_pin (weft_mem_register) registers a range and marks it
 *    user-pinned: never evicted until weft_regcache_invalidate.
 *  - weft_regcache_invalidate (weft_mem_deregister, or "this memory is
 *    gone") drops every entry overlapping the range: at once when idle, at
 *    its last release when in flight; no later acquire returns it.
 *
 * The cache pins through callbacks, so it knows nothing of verbs (the
 * transport passes ibv_reg_mr/ibv_dereg_mr; unit tests pass fakes).
 * Not thread-safe: callers hold the comm lock.
 */
#ifndef WEFT_REGCACHE_H
#define WEFT_REGCACHE_H

#include <stddef.h>
#include <stdint.h>

struct weft_regcache;

struct weft_reg_ops {
    void *ctx;
    /* Pins [addr, addr+len) (page-aligned). On success sets *handle, *lkey,
     * *rkey and returns 0; else returns nonzero and writes why. */
    int  (*reg)(void *ctx, uintptr_t addr, size_t len, void **handle, uint32_t *lkey, uint32_t *rkey,
                char *why, size_t whylen);
    void (*dereg)(void *ctx, void *handle);
};

/* One registered region; fields are read-only for users of the cache. */
struct weft_reg {
    uintptr_t addr;      /* page-aligned start */
    size_t    len;       /* page-aligned length */
    uint32_t  lkey, rkey;
    void     *handle;    /* what ops->reg returned (struct ibv_mr *) */
    /* cache bookkeeping */
    int       refs;      /* acquires not yet released */
    int       user_pinned;
    int       dead;      /* invalidated while in flight: dereg at last release */
    struct weft_reg *lru_prev, *lru_next;
    struct weft_reg *next;   /* list of all entries */
};

struct weft_regcache_stats {
    uint64_t hits, misses, evictions, invalidations;
    size_t   pinned_bytes, entries;
};

int  weft_regcache_create(const struct weft_reg_ops *ops, size_t cap_bytes, struct weft_regcache **out);
/* Deregisters everything, in flight or not. */
void weft_regcache_destroy(struct weft_regcache *rc);

/* A region covering [addr, addr+len), refcount taken. len may be 0 (one
 * byte is pinned). Returns WEFT_SUCCESS or WEFT_ERR_TRANSPORT /
 * WEFT_ERR_NO_MEMORY with why filled; *out set only on success. */
int  weft_regcache_acquire(struct weft_regcache *rc, const void *addr, size_t len, struct weft_reg **out,
                           char *why, size_t whylen);
void weft_regcache_release(struct weft_regcache *rc, struct weft_reg *r);

int  weft_regcache_pin(struct weft_regcache *rc, const void *addr, size_t len, char *why, size_t whylen);
/* Returns the number of entries dropped or marked dead. */
int  weft_regcache_invalidate(struct weft_regcache *rc, const void *addr, size_t len);

void weft_regcache_get_stats(const struct weft_regcache *rc, struct weft_regcache_stats *st);

#endif
