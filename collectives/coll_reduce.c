/*
 * Where a reducing call's arithmetic runs (see coll_impl.h, "reductions
 * over any memory"): host buffers on the host, device buffers by CUDA
 * kernels when they load, else on host copies of the device buffers.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "coll_impl.h"
#include "core.h"
#include "cudawrap.h"
#include "devcopy.h"
#include "log.h"
#include "reduce_kernel.h"
#include "weft.h"

size_t coll_reduce_chunk(const struct weft_coll *cc, size_t esize)
{
    size_t v = cc->core->cfg.reduce_chunk ? cc->core->cfg.reduce_chunk : (size_t)256 << 10;
    if (esize == 0)
        return v;
    v -= v % esize;
    return v ? v : esize;
}

static const char *kind_fn(int kind)
{
    switch (kind) {
    case WEFT_COLL_ALLREDUCE: return "weft_allreduce";
    case WEFT_COLL_REDUCE_SCATTER: return "weft_reduce_scatter";
    case WEFT_COLL_REDUCE: return "weft_reduce";
    default: return "a reduction";
    }
}

/* Logged once per process and reason: the first staged call says why
 * (kernels refused, or host and device buffers mixed). */
static int staged_logged_refused, staged_logged_mixed;

int coll_reduce_begin(struct weft_coll *cc, const struct weft_coll_args *a, size_t in_bytes, size_t out_bytes,
                      const void **sendbuf, void **recvbuf, struct weft_sched_call *call,
                      struct coll_reduce_plan *plan)
{
    struct weft_core *core = cc->core;
    const char *fn = kind_fn(a->kind);
    int skind = WEFT_MEM_HOST, rkind = WEFT_MEM_HOST, sdevno = -1, rdevno = -1, rc;

    memset(plan, 0, sizeof *plan);
    plan->user_send = a->sendbuf;
    plan->user_recv = a->recvbuf;
    plan->in_bytes = in_bytes;
    plan->out_bytes = out_bytes;
    *sendbuf = a->sendbuf;
    *recvbuf = a->recvbuf;
    call->sig.kind = a->kind;
    call->sig.root = a->kind == WEFT_COLL_REDUCE ? a->root : -1;
    call->sig.param = a->count;
    call->sig.dtype = a->dtype;
    call->sig.op = a->op;
    call->nranks = core->size;
    call->scratch_dev = 0;
    call->stage = NULL;
    call->stage_cc = NULL;
    call->prep = a->prep;

    if ((rc = weft_mem_classify(core, a->sendbuf, in_bytes, -1, -1, fn, &skind, &sdevno)) != WEFT_SUCCESS)
        return rc;
    if ((rc = weft_mem_classify(core, a->recvbuf, out_bytes, -1, -1, fn, &rkind, &rdevno)) != WEFT_SUCCESS)
        return rc;
    /* Managed memory is host-accessible: reduced where it is read. */
    int sdev = in_bytes > 0 && skind == WEFT_MEM_DEVICE;
    int rdev = out_bytes > 0 && rkind == WEFT_MEM_DEVICE;
    if (!sdev && !rdev)
        return WEFT_SUCCESS;

    char why[256] = "";
    int devno = sdev ? sdevno : rdevno;
    /* weft_reduce_device_available loads the kernels' module on first use:
     * here, on the caller's thread (or in weft_coll_prepare's dry start). */
    if ((sdev || in_bytes == 0) && (rdev || out_bytes == 0) && (!sdev || !rdev || sdevno == rdevno) &&
        weft_reduce_device_available(core, devno, why, sizeof why)) {
        call->scratch_dev = 1;
        call->stage_cc = cc;   /* its device scratch comes from (and goes back to) cc's list */
        /* Operands off their element alignment go through aligned scratch
         * (reduce_device.c), made here where a cudaMalloc may wait. */
        size_t es = weft_dtype_size(a->dtype);
        if (es > 1 && (((uintptr_t)a->sendbuf | (uintptr_t)a->recvbuf) % es) != 0 &&
            (rc = weft_devcopy_prepare_align(core)) != WEFT_SUCCESS && weft_cuda_may_sync())
            return rc;
        return WEFT_SUCCESS;
    }
    if (!__atomic_exchange_n(why[0] ? &staged_logged_refused : &staged_logged_mixed, 1, __ATOMIC_RELAXED))
        WEFT_INFO(core->rank, "%s: device buffers are reduced on host copies (%s)", fn,
                  why[0] ? why : "host and device buffers mixed");

    /* One staging area: [send copy | recv copy], each 64-byte aligned. A
     * recvbuf inside sendbuf (in place) is staged with it. */
    const char *s0 = a->sendbuf, *r0 = a->recvbuf;
    int recv_inside = sdev && rdev && r0 >= s0 && r0 + out_bytes <= s0 + in_bytes;
    size_t send_part = sdev ? (in_bytes + 63) & ~(size_t)63 : 0;
    size_t recv_part = rdev && !recv_inside ? out_bytes : 0;
    struct weft_coll_stage *st;
    if (a->prep && !a->prep->dry && a->prep->stage) {
        st = a->prep->stage;   /* taken by weft_coll_prepare on the caller's thread */
        a->prep->stage = NULL;
    } else {
        st = coll_stage_get(cc, send_part + recv_part);
    }
    if (st == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "%s: no host memory to stage %zu bytes of device buffers",
                              fn, send_part + recv_part);
    char *base = coll_stage_ptr(st);
    if (a->prep && a->prep->dry) {
        a->prep->stage = st;   /* weft_coll_prepare keeps it; the real start takes it */
        st = NULL;
    }
    if (sdev)
        *sendbuf = base;
    if (rdev)
        *recvbuf = recv_inside ? base + (r0 - s0) : base + send_part;
    plan->staged = 1;
    call->stage = st;
    call->stage_cc = cc;
    plan->in_bytes = sdev ? in_bytes : 0;     /* what the COPY in moves */
    plan->out_bytes = rdev ? out_bytes : 0;   /* what the COPY out moves */
    return WEFT_SUCCESS;
}

struct staged_args {
    weft_sched_build_fn inner;
    const void         *inner_args;
    const struct coll_reduce_plan *plan;
    const void         *hsend;
    void               *hrecv;
};

/* COPY in, the algorithm on the host copies, COPY out. */
static void build_staged(struct weft_sched_build *b, const void *args)
{
    const struct staged_args *s = args;
    if (s->plan->in_bytes > 0) {
        weft_sched_copy(b, (void *)s->hsend, s->plan->user_send, s->plan->in_bytes);
        weft_sched_fence(b);
    }
    s->inner(b, s->inner_args);
    if (s->plan->out_bytes > 0) {
        weft_sched_fence(b);
        weft_sched_copy(b, s->plan->user_recv, s->hrecv, s->plan->out_bytes);
    }
}

int coll_reduce_launch(struct weft_coll *cc, struct weft_sched_call *call, const struct coll_reduce_plan *plan,
                       const void *staged_send, void *staged_recv, weft_sched_build_fn build, const void *args,
                       struct weft_coll_op **op)
{
    if (!plan->staged)
        return weft_sched_start(cc, call, build, args, op);
    struct staged_args s = { build, args, plan, staged_send, staged_recv };
    return weft_sched_start(cc, call, build_staged, &s, op);
}
