/*
 * ncclGroupStart/End: weft's groups (weft_group_start/end: calls recorded
 * per host thread, queued together at the outermost end, so a ring of
 * send/recv on one stream cannot deadlock), plus what NCCL also defers to
 * the group's end:
 *   - communicator initialisations (ncclCommInitRank*, ncclCommSplit)
 *     called inside the group: they are collective, and one thread
 *     initialising several ranks (one per device) must run them side by
 *     side, so each runs in a thread of its own at the end, all joined
 *     before the group's operations are queued;
 *   - work that must follow the group's operations on their streams
 *     (freeing a pre-multiply's buffers once the sum that reads them ran).
 */
#include <stdlib.h>
#include <string.h>

#include "nccl_adapter.h"

struct after { void (*fn)(void *, int); void *arg; };

static __thread int               t_depth;
static __thread struct ncclComm **t_inits;
static __thread int               t_ninits, t_cap_inits;
static __thread struct after     *t_after;
static __thread int               t_nafter, t_cap_after;

int nccl_group_depth(void)
{
    return t_depth;
}

static int grow(void **arr, int *cap, int n, size_t elem)
{
    void *p;
    int ncap;
    if (n < *cap)
        return 1;
    ncap = *cap ? *cap * 2 : 8;
    if ((p = realloc(*arr, (size_t)ncap * elem)) == NULL)
        return 0;
    *arr = p;
    *cap = ncap;
    return 1;
}

ncclResult_t nccl_group_defer_init(struct ncclComm *c, const char *fn)
{
    if (!grow((void **)&t_inits, &t_cap_inits, t_ninits, sizeof(*t_inits)))
        return nccl_fail(NULL, ncclSystemError, fn, "out of memory for the group");
    t_inits[t_ninits++] = c;
    return ncclSuccess;
}

ncclResult_t nccl_group_after(void (*fn)(void *, int), void *arg, const char *caller)
{
    if (t_depth == 0) {
        fn(arg, 1);
        return ncclSuccess;
    }
    if (!grow((void **)&t_after, &t_cap_after, t_nafter, sizeof(*t_after)))
        return nccl_fail(NULL, ncclSystemError, caller, "out of memory for the group");
    t_after[t_nafter].fn = fn;
    t_after[t_nafter].arg = arg;
    t_nafter++;
    return ncclSuccess;
}

static void *init_main(void *arg)
{
    nccl_comm_run_init(arg);
    return NULL;
}

/* Runs the group's initialisations side by side; the first failure. */
static ncclResult_t run_inits(void)
{
    ncclResult_t rc = ncclSuccess;
    int n = t_ninits;
    struct ncclComm **inits = t_inits;

    t_inits = NULL;
    t_ninits = t_cap_inits = 0;
    if (n == 1) {
        nccl_comm_run_init(inits[0]);
    } else {
        for (int i = 0; i < n; i++)
            inits[i]->init_thread_live = pthread_create(&inits[i]->init_thread, NULL, init_main, inits[i]) == 0;
        for (int i = 0; i < n; i++) {
            if (inits[i]->init_thread_live) {
                pthread_join(inits[i]->init_thread, NULL);
                inits[i]->init_thread_live = 0;
            } else {
                nccl_comm_run_init(inits[i]);   /* no thread to be had: here, late (others may time out) */
            }
        }
    }
    for (int i = 0; i < n; i++) {
        struct ncclComm *c = inits[i];
        if (c->state == COMM_FAILED && rc == ncclSuccess)
            rc = nccl_fail(NULL, c->init_result, "ncclGroupEnd", "initialisation of comm %p (rank %d of %d): %s",
                           (void *)c, c->rank, c->nranks, c->init_error);
        if (c->free_after_init) {
            if (c->w) {
                weft_comm_destroy(c->w);
                c->w = NULL;
            }
            nccl_shell_free(c);
        }
    }
    free(inits);
    return rc;
}

NCCL_API(ncclResult_t, ncclGroupStart, void)
{
    int e = weft_group_start();
    if (e != WEFT_SUCCESS)
        return nccl_from_weft(NULL, e, "ncclGroupStart");
    t_depth++;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupEnd, void)
{
    ncclResult_t rc = ncclSuccess, rc2;
    struct after *after;
    int nafter, e;

    if (t_depth == 0)
        return nccl_fail(NULL, ncclInvalidUsage, "ncclGroupEnd", "no matching ncclGroupStart in this thread");
    t_depth--;
    if (t_depth > 0) {
        e = weft_group_end();   /* nested: weft only counts it */
        return e == WEFT_SUCCESS ? ncclSuccess : nccl_from_weft(NULL, e, "ncclGroupEnd");
    }
    if (t_ninits > 0)
        rc = run_inits();
    e = weft_group_end();
    if (e != WEFT_SUCCESS) {
        rc2 = nccl_from_weft(NULL, e, "ncclGroupEnd");
        if (rc == ncclSuccess)
            rc = rc2;
    }
    after = t_after;
    nafter = t_nafter;
    t_after = NULL;
    t_nafter = t_cap_after = 0;
    for (int i = 0; i < nafter; i++)
        after[i].fn(after[i].arg, e == WEFT_SUCCESS);
    free(after);
    return rc;
}
