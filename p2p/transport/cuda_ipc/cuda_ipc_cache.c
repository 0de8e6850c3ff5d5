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
    struct weft_ipc_cache_entry     **buckets;
    size_t                            nbuckets;    /* power of two */
    size_t                            count;       /* live entries (in the table and the LRU) */
    struct weft_ipc_cache_entry      *lru_head, *lru_tail;
    struct weft_ipc_cache_entry      *dead;        /* dead entries still referenced (lru_next links) */
    struct weft_ipc_cache_stats       st;
};

static size_t key_hash(int peer, uint64_t base, size_t nb)
{
    uint64_t h = base ^ ((uint64_t)(uint32_t)peer * 0x9e3779b97f4a7c15ull);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h & (nb - 1);
}

struct weft_ipc_cache *weft_ipc_cache_create(size_t cap, const struct weft_ipc_cache_ops *ops, void *ctx)
{
    struct weft_ipc_cache *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->cap = cap ? cap : 1;
    c->ops = ops;
    c->ctx = ctx;
    c->nbuckets = 64;
    c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
    if (c->buckets == NULL) {
        free(c);
        return NULL;
    }
    return c;
}

/* ---- LRU list ---- */

static void lru_unlink(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    if (e->lru_prev)
        e->lru_prev->lru_next = e->lru_next;
    else
        c->lru_head = e->lru_next;
    if (e->lru_next)
        e->lru_next->lru_prev = e->lru_prev;
    else
        c->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
}

static void lru_push_head(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    e->lru_prev = NULL;
    e->lru_next = c->lru_head;
    if (c->lru_head)
        c->lru_head->lru_prev = e;
    else
        c->lru_tail = e;
    c->lru_head = e;
}

/* ---- hash table ---- */

static void table_unlink(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    struct weft_ipc_cache_entry **pp = &c->buckets[key_hash(e->peer, e->base, c->nbuckets)];
    for (; *pp; pp = &(*pp)->hash_next)
        if (*pp == e) {
            *pp = e->hash_next;
            break;
        }
    e->hash_next = NULL;
}

static void table_grow(struct weft_ipc_cache *c)
{
    size_t nb = c->nbuckets * 2;
    struct weft_ipc_cache_entry **nt = calloc(nb, sizeof(*nt));
    if (nt == NULL)
        return;   /* longer chains, still correct */
    for (size_t i = 0; i < c->nbuckets; i++) {
        struct weft_ipc_cache_entry *e = c->buckets[i], *next;
        for (; e; e = next) {
            next = e->hash_next;
            size_t h = key_hash(e->peer, e->base, nb);
            e->hash_next = nt[h];
            nt[h] = e;
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
    for (struct weft_ipc_cache_entry *e = c->buckets[key_hash(peer, base, c->nbuckets)]; e; e = e->hash_next)
        if (e->peer == peer && e->base == base)
            return e;
    return NULL;
}

/* ---- closing ---- */

static void entry_close(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    if (c->ops && c->ops->close)
        c->ops->close(c->ctx, e);
    c->st.closes++;
    free(e);
}

/* Takes a live entry out of the table and the LRU: closed now when unused,
 * else parked on the dead list until its last put. */
static void entry_retire(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    table_unlink(c, e);
    lru_unlink(c, e);
    c->count--;
    e->dead = 1;
    if (e->refs == 0) {
        entry_close(c, e);
        return;
    }
    e->lru_next = c->dead;
    e->lru_prev = NULL;
    if (c->dead)
        c->dead->lru_prev = e;
    c->dead = e;
}

static void dead_unlink(struct weft_ipc_cache *c, struct weft_ipc_cache_entry *e)
{
    if (e->lru_prev)
        e->lru_prev->lru_next = e->lru_next;
    else
        c->dead = e->lru_next;
    if (e->lru_next)
        e->lru_next->lru_prev = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
}

/* Closes least recently used entries with no copy in flight until the
 * table is within its cap (or only entries in use remain). */
static void evict(struct weft_ipc_cache *c)
{
    struct weft_ipc_cache_entry *e = c->lru_tail, *prev;
    for (; e && c->count > c->cap; e = prev) {
        prev = e->lru_prev;
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
    if (e && e->buffer_id == buffer_id) {
        lru_unlink(c, e);
        lru_push_head(c, e);
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
    size_t h = key_hash(peer, base, c->nbuckets);
    e->hash_next = c->buckets[h];
    c->buckets[h] = e;
    lru_push_head(c, e);
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
        dead_unlink(c, e);
        entry_close(c, e);
        return;
    }
    evict(c);
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
    while (c->lru_head) {
        struct weft_ipc_cache_entry *e = c->lru_head;
        lru_unlink(c, e);
        entry_close(c, e);
    }
    while (c->dead) {
        struct weft_ipc_cache_entry *e = c->dead;
        dead_unlink(c, e);
        entry_close(c, e);
    }
    free(c->buckets);
    free(c);
}
