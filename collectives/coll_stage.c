/*
 * Host staging buffers of the reductions that run on host copies of
 * device buffers (coll_reduce.c): pinned when CUDA allows, so the copies
 * in and out run at DMA speed, and kept on a free list of the comm for the
 * next call (pinning costs milliseconds). Several calls may be in flight
 * (non-blocking, stream engine), so each takes a buffer of its own. The
 * device scratch of the reduction kernels is kept the same way.
 *
 * Nothing is freed before the comm is destroyed: cudaFreeHost and cudaFree
 * wait for all work queued on the device, and that work may include a
 * stream held by weft's stream engine (cuStreamWaitValue32 on a counter the
 * progress thread writes once the operation that is freeing its buffer
 * returns). A free there waits for itself: the stream never moves. So the
 * lists only grow to what was in flight at once (a call reuses any free
 * buffer at least as large), and coll_stage_fini frees them, after the
 * stream engine was quiesced.
 */
#include <stdlib.h>

#include "coll_impl.h"
#include "core.h"
#include "devcopy.h"
#include "reduce_kernel.h"

struct weft_coll_stage {
    struct weft_coll_stage *next;
    void                   *mem;
    size_t                  bytes;
    int                     pinned;
};

/* Takes the first buffer of *list at least bytes large (NULL: none). */
static struct weft_coll_stage *list_take(struct weft_coll *cc, struct weft_coll_stage **list, size_t bytes)
{
    struct weft_coll_stage **pp, *st = NULL;
    pthread_mutex_lock(&cc->stage_lock);
    for (pp = list; *pp; pp = &(*pp)->next)
        if ((*pp)->bytes >= bytes) {
            st = *pp;
            *pp = st->next;
            break;
        }
    pthread_mutex_unlock(&cc->stage_lock);
    return st;
}

static void list_push(struct weft_coll *cc, struct weft_coll_stage **list, struct weft_coll_stage *st)
{
    if (st == NULL)
        return;
    pthread_mutex_lock(&cc->stage_lock);
    st->next = *list;
    *list = st;
    pthread_mutex_unlock(&cc->stage_lock);
}

/* A reused buffer from *list, else a new one from alloc (device: the
 * reduction kernels' scratch, else pinned host memory). */
static struct weft_coll_stage *get(struct weft_coll *cc, struct weft_coll_stage **list, size_t bytes, int device)
{
    struct weft_coll_stage *st = list_take(cc, list, bytes);
    if (st)
        return st;
    st = calloc(1, sizeof *st);
    if (st == NULL)
        return NULL;
    st->bytes = bytes;
    st->mem = device ? weft_reduce_device_alloc(cc->core, bytes) : weft_devcopy_host_alloc(cc->core, bytes, &st->pinned);
    if (st->mem == NULL) {
        free(st);
        return NULL;
    }
    return st;
}

struct weft_coll_stage *coll_stage_get(struct weft_coll *cc, size_t bytes) { return get(cc, &cc->stages, bytes, 0); }

void *coll_stage_ptr(struct weft_coll_stage *st) { return st->mem; }

void coll_stage_put(struct weft_coll *cc, struct weft_coll_stage *st) { list_push(cc, &cc->stages, st); }

struct weft_coll_stage *coll_scratch_get(struct weft_coll *cc, size_t bytes)
{
    return get(cc, &cc->scratches, bytes, 1);
}

void coll_scratch_put(struct weft_coll *cc, struct weft_coll_stage *st) { list_push(cc, &cc->scratches, st); }

void coll_stage_fini(struct weft_coll *cc)
{
    while (cc->stages) {
        struct weft_coll_stage *s = cc->stages;
        cc->stages = s->next;
        weft_devcopy_host_free(cc->core, s->mem, s->pinned);
        free(s);
    }
    while (cc->scratches) {
        struct weft_coll_stage *s = cc->scratches;
        cc->scratches = s->next;
        weft_reduce_device_free(cc->core, s->mem);
        free(s);
    }
}
