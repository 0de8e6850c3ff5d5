/*
 * Registration cache: pinned memory regions for RDMA, keyed by page range.
 *
 * Registering memory with the NIC costs tens of microseconds and more per
 * page, so a transport never registers per message: it asks the cache for a
 * region covering [addr, addr+len), uses the region's keys, and releases it
 * when the work requests that use it have completed. A repeated transfer
 * from the same buffer is a lookup: O(log n) in the number of entries, no
 * allocation, no syscall (an interval tree; see regcache.c).
 *
 *  - Entries cover whole pages. A request whose page range lies inside an
 *    existing live entry is a hit.
 *  - An entry is refcounted while in flight; only entries with refcount 0
 *    are evicted, least recently released first, when pinning a new region
 *    would exceed the cap on pinned bytes. When everything is in flight the
 *    new region is registered anyway (the cap is exceeded until releases
 *    bring it back: each release evicts idle entries while over the cap) --
 *    refusing would deadlock a transfer larger than the cap. All registered
 *    bytes count toward the cap: user-pinned ones and dead ones still in
 *    flight too.
 *  - Overlap policy. A request that overlaps entries but lies inside none is
 *    registered as its own page range, never merged with its neighbours:
 *    merging would make a first pass over a buffer in page-unaligned chunks
 *    register ever-growing unions (quadratic pinning). Entries may therefore
 *    overlap. Entries the new region fully contains are redundant: idle ones
 *    (not user-pinned) are deregistered before it is registered (counted as
 *    evictions), in-flight ones are retired (dead: deregistered at their last
 *    release) once it is. Partly overlapping entries stay until evicted.
 *  - cap 0 disables caching: an acquire that no user-pinned entry covers
 *    registers a region of its own (dead from birth: no other acquire sees
 *    it) and its final release deregisters it. User-pinned entries are still
 *    used by acquires -- the user promised to deregister them in time.
 *  - weft_regcache_pin (weft_mem_register) makes a range user-pinned: the
 *    live entry containing it if there is one (which may be larger), else a
 *    new entry for it. User-pinned entries are never evicted, only dropped by
 *    weft_regcache_invalidate. Pins do not nest: one invalidate undoes any
 *    number of pins of the range.
 *  - weft_regcache_invalidate (weft_mem_deregister, or "this memory is
 *    gone") drops every live entry sharing a page with the range, user-pinned
 *    or not: at once when idle, at its last release when in flight (marked
 *    dead); no later acquire returns it, so an acquire after an invalidate
 *    registers anew.
 *
 * The cache pins through callbacks, so it knows nothing of verbs (the
 * transport passes ibv_reg_mr/ibv_dereg_mr; unit tests pass fakes). It logs
 * nothing: callers report the reason it returns.
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
    int       dead;      /* in no index, never returned by acquire again, deregistered at its
                          * last release: invalidated or retired while in flight, or uncached
                          * (cap 0) */
};

/* hits/misses: acquires and pins that found / did not find a live entry
 * containing the range. evictions: idle entries the cache dropped on its
 * own (LRU at the cap, or contained in a new entry). invalidations: entries
 * dropped or marked dead by weft_regcache_invalidate. pinned_bytes, entries:
 * what is registered now (dead entries still in flight included). */
struct weft_regcache_stats {
    uint64_t hits, misses, evictions, invalidations;
    size_t   pinned_bytes, entries;
};

/* cap_bytes: the cap on pinned bytes (0: no caching). ops is copied; ops->reg
 * must not be NULL. Returns WEFT_SUCCESS, WEFT_ERR_INVALID_ARG (NULL ops,
 * ops->reg or out) or WEFT_ERR_NO_MEMORY; *out set only on success. */
int  weft_regcache_create(const struct weft_reg_ops *ops, size_t cap_bytes, struct weft_regcache **out);
/* Deregisters everything, in flight or not: regions still held by callers
 * are invalid afterwards. rc may be NULL. */
void weft_regcache_destroy(struct weft_regcache *rc);

/* A region covering [addr, addr+len), refcount taken. len may be 0 (one
 * byte is pinned). Returns WEFT_SUCCESS or, with why filled (when why is
 * not NULL and whylen > 0), WEFT_ERR_TRANSPORT (ops->reg failed; why is its
 * reason), WEFT_ERR_NO_MEMORY, or WEFT_ERR_INVALID_ARG (NULL rc or out, or a
 * range that wraps around the address space). *out is set only on success;
 * a failure leaves the cache as it was but for idle entries evicted to make
 * room. Every successful acquire is matched by one release. */
int  weft_regcache_acquire(struct weft_regcache *rc, const void *addr, size_t len, struct weft_reg **out,
                           char *why, size_t whylen);
/* Drops the refcount; at zero the region becomes idle (evictable, unless
 * user-pinned), or is deregistered if dead. r NULL: nothing. */
void weft_regcache_release(struct weft_regcache *rc, struct weft_reg *r);

/* Makes [addr, addr+len) user-pinned (see above); takes no refcount. Errors
 * as for acquire. */
int  weft_regcache_pin(struct weft_regcache *rc, const void *addr, size_t len, char *why, size_t whylen);
/* Drops every live entry sharing a page with [addr, addr+len) (len 0: one
 * byte). Returns the number of entries dropped or marked dead. */
int  weft_regcache_invalidate(struct weft_regcache *rc, const void *addr, size_t len);

void weft_regcache_get_stats(const struct weft_regcache *rc, struct weft_regcache_stats *st);

#endif
