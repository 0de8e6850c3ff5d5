/*
 * CUDA IPC mapping cache (see cuda_ipc_cache.h): a chained hash table on
 * (peer, base) -- an address holds one live allocation at a time, so the
 * buffer id is compared, not hashed -- plus an LRU list of the live entries
 * and a list of dead entries (replaced or destroyed while a copy still used
 * them) that are closed when their last reference goes.
 */
#include "cuda_ipc_cache.h"

#include <stdlib.h>
#include <string.h>

struct weft_ipc_cache {
    size_t                            cap;
    const struct weft_ipc_cache_ops  *ops;
    void                             *ctx;
    struct weft_list                 *buckets;     /* [nbuckets] chains of live entries (hash nodes) */
    size_t                            nbuckets;    /* power of two */
    size_t                            count;       /* live entries (in the table and the LRU) */
    struct weft_list                  lru;         /* live entries, most recently used first (lru nodes) */
    struct weft_list                  dead;        /* dead entries still referenced (lru nodes) */
    struct weft_list                  closing;     /* unreferenced entries whose close was put off (lru nodes) */
    struct weft_ipc_cache_stats       st;
};

#define ENTRY_OF_LRU(n)  weft_container_of(n, struct weft_ipc_cache_entry, lru)
#define ENTRY_OF_HASH(n) weft_container_of(n, struct weft_ipc_cache_entry, hash)

static size_t key_hash(int peer, uint64_t base, size_t nb)
{
    uint64_t h = base ^ ((uint64_t)(uint32_t)peer * 0x9e3779b97f4a7c15ull);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h & (nb - 1);
}

static struct weft_list *buckets_new(size_t nb)
{
    struct weft_list *b = malloc(nb * sizeof(*b));
    if (b)
        for (size_t i = 0; i < nb; i++)
            weft_list_init(&b[i]);
    return b;
}

struct weft_ipc_cache *weft_ipc_cache_create(size_t cap, const struct weft_ipc_cache_ops *ops, void *ctx)
{
    struct weft_ipc_cache *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->cap = cap ? cap : 1;
    c->ops = ops;
    c->ctx = ctx;
    weft_list_init(&c->lru);
    weft_list_init(&c->dead);
    weft_list_init(&c->closing);
    c->nbuckets = 64;
    c->buckets = buckets_new(c->nbuckets);
    if (c->buckets == NULL) {
        free(c);
        return NULL;
    }
    return c;
}

/* ---- hash table ---- */

static void table_grow(struct weft_ipc_cache *c)
{
    size_t nb = c->nbuckets * 2;
    struct weft_list *nt = buckets_new(nb);
    if (nt == NULL)
        return;   /* longer chains, still correct */
    for (size_t i = 0; i < c->nbuckets; i++) {
        struct weft_list *n;
        while ((n = weft_list_pop(&c->buckets[i])) != NULL) {
            struct weft_ipc_cache_entry *e = ENTRY_OF_HASH(n);
            weft_list_add_head(&nt[key_hash(e->peer, e->base, nb)], n);
        }
    }
    free(c->buckets);
    c->buckets = nt;
    c->nbuckets = nb;
}

struct weft_ipc_cache_entry *weft_ipc_cache_peek(const struct weft_ipc_cache *c, int peer, uint64_t base)
{
    if (c == NULL)
        return NULL;
    weft_list_for_each(n, &c->buckets[key_hash(peer, base, c->nbuckets)]) {
        struct weft_ipc_cache_entry *e = ENTRY_OF_HASH(n);
        if (e->peer == peer && e->base == base)
            return e;
    }
    return NULL;
}

/* ---- closing ---- */

static void entry_close_now(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    if (c->ops && c->ops->close)
        c->ops->close(c->ctx, e);
    c->st.closes++;
    free(e);
}

static int may_close(const struct weft_ipc_cache *c)
{
    return c->ops == NULL || c->ops->may_close == NULL || c->ops->may_close(c->ctx);
}

/* e is out of the table and the LRU, unreferenced: closed now, or parked. */
static void entry_close(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    if (!may_close(c)) {
        c->st.deferred++;
        weft_list_add_head(&c->closing, &e->lru);
        return;
    }
    entry_close_now(c, e);
}

/* Closes the parked entries once closing is allowed again. */
static void drain_closing(struct weft_ipc_cache *c)
{
    struct weft_list *n;
    if (weft_list_empty(&c->closing) || !may_close(c))
        return;
    while ((n = weft_list_pop(&c->closing)) != NULL)
        entry_close_now(c, ENTRY_OF_LRU(n));
}

/* Takes a live entry out of the table and the LRU: closed now when unused,
 * else parked on the dead list until its last put. */
static void entry_retire(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    weft_list_del(&e->hash);
    weft_list_del(&e->lru);
    c->count--;
    e->dead = 1;
    if (e->refs == 0) {
        entry_close(c, e);
        return;
    }
    weft_list_add_head(&c->dead, &e->lru);
}

/* Closes least recently used entries with no copy in flight until the
 * table is within its cap (or only entries in use remain). */
static void evict(struct weft_ipc_cache *c)
{
    /* From the LRU end towards the most recent (the list walks forward
     * only, so by hand over prev). */
    struct weft_list *n = c->lru.prev, *prev;
    for (; n != &c->lru && c->count > c->cap; n = prev) {
        struct weft_ipc_cache_entry *e = ENTRY_OF_LRU(n);
        prev = n->prev;
        if (e->refs > 0)
            continue;
        c->st.evictions++;
        entry_retire(c, e);
    }
}

/* ---- get / put ---- */

int weft_ipc_cache_get(struct weft_ipc_cache *c, int peer, uint64_t base, uint64_t buffer_id,
                       const void *arg, struct weft_ipc_cache_entry **out, int *hit)
{
    struct weft_ipc_cache_entry *e = weft_ipc_cache_peek(c, peer, base);
    int rc;

    *out = NULL;
    if (hit)
        *hit = 0;
    drain_closing(c);
    if (e && e->buffer_id == buffer_id) {
        weft_list_del(&e->lru);
        weft_list_add_head(&c->lru, &e->lru);
        e->refs++;
        c->st.hits++;
        if (hit)
            *hit = 1;
        *out = e;
        return 0;
    }
    if (e) {
        /* The exporter freed that allocation and the address came back. */
        c->st.stale++;
        entry_retire(c, e);
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return -1;
    e->peer = peer;
    e->base = base;
    e->buffer_id = buffer_id;
    rc = c->ops && c->ops->open ? c->ops->open(c->ctx, e, arg) : 0;
    if (rc != 0) {
        c->st.open_fails++;
        free(e);
        return rc;
    }
    c->st.opens++;
    if (c->count >= 2 * c->nbuckets)
        table_grow(c);
    weft_list_add_head(&c->buckets[key_hash(peer, base, c->nbuckets)], &e->hash);
    weft_list_add_head(&c->lru, &e->lru);
    c->count++;
    e->refs = 1;
    evict(c);
    *out = e;
    return 0;
}

void weft_ipc_cache_put(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    if (e == NULL)
        return;
    if (e->refs > 0)
        e->refs--;
    if (e->refs > 0)
        return;
    if (e->dead) {
        weft_list_del(&e->lru);
        entry_close(c, e);
        return;
    }
    evict(c);
}

static int overlaps(const struct weft_ipc_cache_entry *e, int peer, uint64_t lo, uint64_t hi)
{
    if (peer >= 0 && e->peer != peer)
        return 0;
    if (hi == 0)
        return 1;
    uint64_t end = e->base + (e->size ? e->size : 1);
    return e->base < hi && lo < end;
}

int weft_ipc_cache_purge(struct weft_ipc_cache *c, int peer, uint64_t lo, uint64_t hi)
{
    struct weft_list *n, *next;
    int closed = 0;
    if (c == NULL)
        return 0;
    if (!may_close(c))
        return -1;
    drain_closing(c);
    for (n = c->lru.next; n != &c->lru; n = next) {
        struct weft_ipc_cache_entry *e = ENTRY_OF_LRU(n);
        next = n->next;
        if (e->refs > 0 || !overlaps(e, peer, lo, hi))
            continue;
        entry_retire(c, e);   /* unreferenced: closed now (closing is allowed) */
        closed++;
    }
    return closed;
}

void weft_ipc_cache_get_stats(const struct weft_ipc_cache *c, struct weft_ipc_cache_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (c == NULL)
        return;
    *out = c->st;
    out->entries = c->count;
}

void weft_ipc_cache_destroy(struct weft_ipc_cache *c)
{
    if (c == NULL)
        return;
    struct weft_list *n;
    while ((n = weft_list_pop(&c->lru)) != NULL)
        entry_close(c, ENTRY_OF_LRU(n));
    while ((n = weft_list_pop(&c->dead)) != NULL)
        entry_close(c, ENTRY_OF_LRU(n));
    /* Destroy runs after the stream engine was quiesced: nothing waits. */
    while ((n = weft_list_pop(&c->closing)) != NULL)
        entry_close_now(c, ENTRY_OF_LRU(n));
    free(c->buckets);
    free(c);
}
