/*
 * The request pool (see request.h). Called with the p2p lock held.
 */
#include "request.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"

static int pool_grow(struct weft_req_pool *pl)
{
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
     * small message). */
    memset((char *)r + offsetof(struct weft_request, pipe), 0,
           offsetof(struct weft_request, xfer.priv) - offsetof(struct weft_request, pipe));
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

struct weft_request *weft_req_lookup(struct weft_p2p *p, const struct weft_pipe *pipe, uint64_t id, int type)
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

void weft_req_pool_fini(struct weft_p2p *p)
{
    for (uint32_t i = 0; i < p->reqs.nchunks; i++)
        free(p->reqs.chunks[i]);
    free(p->reqs.chunks);
    memset(&p->reqs, 0, sizeof(p->reqs));
    weft_queue_init(&p->reqs.free);
}
