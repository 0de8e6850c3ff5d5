/*
 * Host staging buffers of the reductions that run on host copies of
 * device buffers (coll_reduce.c): pinned when CUDA allows, so the copies
 * in and out run at DMA speed, and kept on a free list of the comm for the
 * next call (pinning costs milliseconds). Several calls may be in flight
 * (non-blocking, stream engine), so each takes a buffer of its own.
 */
#include <stdlib.h>

#include "coll_impl.h"
#include "core.h"
#include "devcopy.h"

struct weft_coll_stage {
    struct weft_coll_stage *next;
    void                   *mem;
    size_t                  bytes;
    int                     pinned;
};

/* Buffers kept on the free list at most (the largest are kept). */
#define STAGE_KEEP 4

struct weft_coll_stage *coll_stage_get(struct weft_coll *cc, size_t bytes)
{
    struct weft_coll_stage **pp, *st = NULL;
    pthread_mutex_lock(&cc->stage_lock);
    for (pp = &cc->stages; *pp; pp = &(*pp)->next)
        if ((*pp)->bytes >= bytes) {
            st = *pp;
            *pp = st->next;
            break;
        }
    pthread_mutex_unlock(&cc->stage_lock);
    if (st)
        return st;
    st = calloc(1, sizeof *st);
    if (st == NULL)
        return NULL;
    st->bytes = bytes;
    st->mem = weft_devcopy_host_alloc(cc->core, bytes, &st->pinned);
    if (st->mem == NULL) {
        free(st);
        return NULL;
    }
    return st;
}

void *coll_stage_ptr(struct weft_coll_stage *st) { return st->mem; }

void coll_stage_put(struct weft_coll *cc, struct weft_coll_stage *st)
{
    struct weft_coll_stage *drop = NULL;
    int n = 0;
    if (st == NULL)
        return;
    pthread_mutex_lock(&cc->stage_lock);
    st->next = cc->stages;
    cc->stages = st;
    /* Keep the list short: drop the smallest beyond STAGE_KEEP. */
    for (struct weft_coll_stage *s = cc->stages; s; s = s->next)
        n++;
    if (n > STAGE_KEEP) {
        struct weft_coll_stage **pp, **small = &cc->stages;
        for (pp = &cc->stages; *pp; pp = &(*pp)->next)
            if ((*pp)->bytes < (*small)->bytes)
                small = pp;
        drop = *small;
        *small = drop->next;
    }
    pthread_mutex_unlock(&cc->stage_lock);
    if (drop) {
        weft_devcopy_host_free(cc->core, drop->mem, drop->pinned);
        free(drop);
    }
}

void coll_stage_fini(struct weft_coll *cc)
{
    while (cc->stages) {
        struct weft_coll_stage *s = cc->stages;
        cc->stages = s->next;
        weft_devcopy_host_free(cc->core, s->mem, s->pinned);
        free(s);
    }
}
