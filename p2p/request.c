/*
 * The request pool (see request.h). Called with the p2p lock held.
 */
#include "request.h"

#include <stddef.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#include "context.h"

_Static_assert(sizeof(void *) == 8, "request handles pack 64 bits into a pointer");

static int pool_grow(struct weft_req_pool *pl)
{
    if ((uint64_t)(pl->nchunks + 1) * WEFT_REQ_CHUNK > (UINT64_C(1) << WEFT_REQ_INDEX_BITS))
        return -1;   /* a handle cannot name more slots */
    if (pl->nchunks == pl->cap) {
        uint32_t cap = pl->cap ? 2 * pl->cap : 4;
        struct weft_request **c = realloc(pl->chunks, cap * sizeof(*c));
        if (c == NULL)
            return -1;
        pl->chunks = c;
        pl->cap = cap;
    }
    struct weft_request *chunk = calloc(WEFT_REQ_CHUNK, sizeof(*chunk));
    if (chunk == NULL)
        return -1;
    uint32_t base = pl->nchunks * WEFT_REQ_CHUNK;
    pl->chunks[pl->nchunks++] = chunk;
    for (uint32_t i = 0; i < WEFT_REQ_CHUNK; i++) {
        chunk[i].index = base + i;
        chunk[i].gen = 1;
        weft_queue_push(&pl->free, &chunk[i].free_link);
    }
    return 0;
}

struct weft_request *weft_req_alloc(struct weft_p2p *p)
{
    struct weft_req_pool *pl = &p->reqs;
    if (weft_queue_empty(&pl->free) && pool_grow(pl) != 0)
        return NULL;
    struct weft_request *r = weft_container_of(weft_queue_pop(&pl->free), struct weft_request, free_link);
    /* Everything after the slot's identity up to the transport's private
     * area, which its owner initialises (a memset of it cost ~15% of a
     * small message). It starts at free_link, meaningless while the slot
     * is in use: from there the range is 16-byte aligned and is cleared
     * with 16-byte stores. A memset of it compiles to rep stos, whose
     * start-up costs more than the stores themselves at this size. */
    typedef uint64_t clear16 __attribute__((vector_size(16), may_alias));
    enum { CLEAR_FROM = offsetof(struct weft_request, free_link),
           CLEAR_N = (offsetof(struct weft_request, xfer.priv) - CLEAR_FROM) / 16 };
    _Static_assert(CLEAR_FROM + sizeof(r->free_link) == offsetof(struct weft_request, pipe) && CLEAR_FROM % 16 == 0 &&
                       (offsetof(struct weft_request, xfer.priv) - CLEAR_FROM) % 16 == 0,
                   "free_link sits right before pipe, the cleared range is whole 16-byte words");
    clear16 *z = (clear16 *)(void *)((char *)r + CLEAR_FROM);
#pragma GCC unroll 16
    for (int i = 0; i < CLEAR_N; i++)
        z[i] = (clear16){ 0, 0 };
    r->p2p = p;
    r->state = WEFT_REQ_QUEUED;
    weft_list_init(&r->link);
    return r;
}

void weft_req_free(struct weft_request *r)
{
    struct weft_p2p *p = r->p2p;
    r->state = WEFT_REQ_FREE;
    r->pipe = NULL;
    /* A new generation: ids of this use no longer resolve. 0 is skipped so
     * that a zero id never names a request. */
    if (++r->gen == 0)
        r->gen = 1;
    /* LIFO: the next request reuses the one still in cache. */
    weft_queue_push_head(&p->reqs.free, &r->free_link);
}

struct weft_request *weft_req_lookup(struct weft_p2p *p, const struct weft_peer_pipe *pipe, uint64_t id, int type)
{
    uint32_t index = (uint32_t)id, gen = (uint32_t)(id >> 32);
    const struct weft_req_pool *pl = &p->reqs;
    if (gen == 0 || index / WEFT_REQ_CHUNK >= pl->nchunks)
        return NULL;
    struct weft_request *r = &pl->chunks[index / WEFT_REQ_CHUNK][index % WEFT_REQ_CHUNK];
    if (r->gen != gen || r->state == WEFT_REQ_FREE || r->state == WEFT_REQ_DONE || r->pipe != pipe ||
        r->type != type)
        return NULL;
    return r;
}

/* ---- handles ----
 * The table maps a handle's comm entry to its p2p context. Entries are
 * taken round-robin, so a destroyed comm's entry is not reused by the very
 * next comm and its stale handles keep resolving to nothing for a while. */
#define TABLE_SIZE (1u << WEFT_REQ_TABLE_BITS)
static struct weft_p2p *table[TABLE_SIZE];
static unsigned table_next;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

int weft_req_table_add(struct weft_p2p *p)
{
    int slot = -1;
    pthread_mutex_lock(&table_lock);
    for (unsigned i = 0; i < TABLE_SIZE; i++) {
        unsigned k = (table_next + i) % TABLE_SIZE;
        if (__atomic_load_n(&table[k], __ATOMIC_RELAXED) == NULL) {
            __atomic_store_n(&table[k], p, __ATOMIC_RELEASE);
            table_next = k + 1;
            slot = (int)k;
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    p->table_slot = slot;
    return slot;
}

void weft_req_table_remove(struct weft_p2p *p)
{
    if (p->table_slot < 0)
        return;
    pthread_mutex_lock(&table_lock);
    __atomic_store_n(&table[p->table_slot], NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&table_lock);
    p->table_slot = -1;
}

uint64_t weft_req_handle(const struct weft_request *r)
{
    return ((uint64_t)r->gen << 32) | ((uint64_t)r->p2p->table_slot << WEFT_REQ_INDEX_BITS) | r->index;
}

struct weft_p2p *weft_req_handle_p2p(uint64_t h)
{
    if ((uint32_t)(h >> 32) == 0)
        return NULL;
    unsigned slot = (unsigned)((h >> WEFT_REQ_INDEX_BITS) & (TABLE_SIZE - 1));
    return __atomic_load_n(&table[slot], __ATOMIC_ACQUIRE);
}

struct weft_request *weft_req_handle_lookup(struct weft_p2p *p, uint64_t h)
{
    uint32_t gen = (uint32_t)(h >> 32);
    uint32_t index = (uint32_t)h & ((1u << WEFT_REQ_INDEX_BITS) - 1);
    const struct weft_req_pool *pl = &p->reqs;
    if (gen == 0 || index / WEFT_REQ_CHUNK >= pl->nchunks)
        return NULL;
    struct weft_request *r = &pl->chunks[index / WEFT_REQ_CHUNK][index % WEFT_REQ_CHUNK];
    if (r->gen != gen || r->state == WEFT_REQ_FREE || !r->user)
        return NULL;
    return r;
}

void weft_req_pool_fini(struct weft_p2p *p)
{
    for (uint32_t i = 0; i < p->reqs.nchunks; i++)
        free(p->reqs.chunks[i]);
    free(p->reqs.chunks);
    memset(&p->reqs, 0, sizeof(p->reqs));
    weft_queue_init(&p->reqs.free);
}
