/*
 * The pipe layer's entry points for the layers above (p2p.h): buffer
 * classification, the lock, the hand-over to the pipe, completion.
 */
#include "p2p.h"

#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "backoff.h"
#include "context.h"
#include "engine.h"
#include "cudawrap.h"
#include "devcopy.h"
#include "log.h"
#include "health.h"
#include "pipe.h"
#include "stage.h"

#include <stdio.h>
#include <stdlib.h>

struct weft_core *weft_p2p_core(struct weft_p2p *p)
{
    return p->core;
}

struct weft_p2p *weft_p2p_of(const struct weft_request *r)
{
    return r->p2p;
}

/* Starts a send (send = 1) or receive of a classified buffer on the pipe
 * to peer. Lock held. */
static int start(struct weft_p2p *p, int send, void *buf, size_t bytes, int peer, int tag, int kind, int dev,
                 struct weft_request **r)
{
    return send ? weft_pipe_isend(&p->pipes[peer], buf, bytes, tag, kind, dev, NULL, r)
                : weft_pipe_irecv(&p->pipes[peer], buf, bytes, tag, kind, dev, NULL, r);
}

static int aborted(const struct weft_p2p *p)
{
    return __atomic_load_n(&p->core->aborted, __ATOMIC_ACQUIRE);
}

static int aborted_error(struct weft_p2p *p, const char *fn)
{
    return weft_set_error(p->core, WEFT_ERR_ABORTED, "%s: the comm was aborted (weft_comm_abort)", fn);
}

static int revoked(const struct weft_p2p *p)
{
    return __atomic_load_n(&p->core->revoked, __ATOMIC_ACQUIRE);
}

/* The application's lanes of a revoked comm take nothing new (lock held:
 * revoke_why is written under it). */
static int revoked_error(struct weft_p2p *p, const char *fn)
{
    return weft_set_error(p->core, WEFT_ERR_REVOKED, "%s: %s", fn, p->revoke_why);
}

/* c is the newest call of its numbering this rank is in, unless a newer
 * one is (call numbers only grow, modulo 2^32). Lock held. */
static void note_head(struct weft_p2p *p, const struct weft_p2p_check *c)
{
    const int stream = weft_p2p_check_stream(c);
    struct weft_p2p_check *head = stream ? &p->scoll_head : &p->coll_head;
    int *set = stream ? &p->scoll_head_set : &p->coll_head_set;
    if (!*set || (int32_t)(weft_p2p_check_call(c) - weft_p2p_check_call(head)) >= 0) {
        *head = *c;
        *set = 1;
    }
}

/* Inlined into each caller: send, check and user are constants there, and
 * weft_isend/weft_irecv lose a call and its branches (a small message's
 * path is short enough for that to show). */
static inline __attribute__((always_inline)) int
start_locked(struct weft_p2p *p, int send, void *buf, size_t bytes, int peer, int tag,
             const struct weft_p2p_check *check, int user, struct weft_request **req, const char *fn)
{
    struct weft_request *r;
    int kind, dev;
    /* Classified outside the lock: CUDA may be asked. */
    int rc = weft_mem_classify(p->core, buf, bytes, peer, tag, fn, &kind, &dev);
    if (rc != WEFT_SUCCESS)
        return rc;
    weft_p2p_lock(p);
    if (aborted(p))
        rc = aborted_error(p, fn);
    else if (revoked(p) && weft_tag_revocable(tag))
        rc = revoked_error(p, fn);
    else
        rc = send ? weft_pipe_isend(&p->pipes[peer], buf, bytes, tag, kind, dev, check, &r)
                  : weft_pipe_irecv(&p->pipes[peer], buf, bytes, tag, kind, dev, check, &r);
    if (rc == WEFT_SUCCESS && user)
        r->user = 1;
    /* The newest collective call this rank is in (what COLL_ASK answers). */
    if (rc == WEFT_SUCCESS && check != NULL)
        note_head(p, check);
    weft_p2p_unlock(p);
    if (rc == WEFT_SUCCESS)
        *req = r;
    return rc;
}

void weft_p2p_coll_started(struct weft_p2p *p, const struct weft_p2p_check *c)
{
    weft_p2p_lock(p);
    note_head(p, c);
    weft_p2p_unlock(p);
}

void weft_p2p_set_check_describe(struct weft_p2p *p, weft_p2p_check_describe_fn fn)
{
    weft_p2p_lock(p);
    p->describe_check = fn;
    weft_p2p_unlock(p);
}

int weft_p2p_isend(struct weft_p2p *p, const void *buf, size_t bytes, int peer, int tag,
                   struct weft_request **req, const char *fn)
{
    return start_locked(p, 1, (void *)buf, bytes, peer, tag, NULL, 0, req, fn);
}

int weft_p2p_irecv(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag,
                   struct weft_request **req, const char *fn)
{
    return start_locked(p, 0, buf, bytes, peer, tag, NULL, 0, req, fn);
}

int weft_p2p_vectors(struct weft_p2p *p, int peer)
{
    if (peer < 0 || peer >= p->size)
        return 0;
    const struct weft_transport *tp = p->pipes[peer].carrier.tp;
    return tp != NULL && tp->rndv_vectors;
}

/* Both directions of a vectored message: the pieces checked (host memory
 * each, as the caller classified them), then the pipe's call. */
static int startv(struct weft_p2p *p, int send, const struct weft_iov *iov, size_t niov, int peer, int tag,
                  struct weft_request **req, const char *fn)
{
    struct weft_request *r = NULL;
    if (niov == 0 || niov > WEFT_IOV_MAX || iov == NULL)
        return weft_set_error(p->core, WEFT_ERR_INVALID_ARG, "%s: a vectored message to/from peer %d tag %d has "
                              "%zu pieces (1 .. %d)", fn, peer, tag, niov, WEFT_IOV_MAX);
    for (size_t i = 0; i < niov; i++)
        if (iov[i].len > 0 && iov[i].base == 0)
            return weft_set_error(p->core, WEFT_ERR_INVALID_ARG, "%s: piece %zu of a vectored message to/from peer "
                                  "%d tag %d is NULL with %llu bytes", fn, i, peer, tag,
                                  (unsigned long long)iov[i].len);
    weft_p2p_lock(p);
    int rc = aborted(p)                             ? aborted_error(p, fn)
             : revoked(p) && weft_tag_revocable(tag) ? revoked_error(p, fn)
             : send ? weft_pipe_isendv(&p->pipes[peer], iov, (uint32_t)niov, tag, &r)
                    : weft_pipe_irecvv(&p->pipes[peer], iov, (uint32_t)niov, tag, &r);
    weft_p2p_unlock(p);
    if (rc == WEFT_SUCCESS)
        *req = r;
    return rc;
}

int weft_p2p_isendv(struct weft_p2p *p, const struct weft_iov *iov, size_t niov, int peer, int tag,
                    struct weft_request **req, const char *fn)
{
    return startv(p, 1, iov, niov, peer, tag, req, fn);
}

int weft_p2p_irecvv(struct weft_p2p *p, const struct weft_iov *iov, size_t niov, int peer, int tag,
                    struct weft_request **req, const char *fn)
{
    return startv(p, 0, iov, niov, peer, tag, req, fn);
}

int weft_p2p_irecv_signal(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag, uint32_t slot,
                          uint32_t value, struct weft_request **req, const char *fn)
{
    struct weft_request *r;
    int kind, dev;
    if (value == 0)
        return weft_p2p_irecv(p, buf, bytes, peer, tag, req, fn);
    int rc = weft_mem_classify(p->core, buf, bytes, peer, tag, fn, &kind, &dev);
    if (rc != WEFT_SUCCESS)
        return rc;
    weft_p2p_lock(p);
    rc = aborted(p)                                    ? aborted_error(p, fn)
         : revoked(p) && weft_tag_revocable(tag)        ? revoked_error(p, fn)
                    : weft_pipe_irecv_signal(&p->pipes[peer], buf, bytes, tag, kind, dev, slot, value, &r);
    weft_p2p_unlock(p);
    if (rc == WEFT_SUCCESS)
        *req = r;
    return rc;
}

int weft_p2p_signal_peer(struct weft_p2p *p, int peer)
{
    const struct weft_peer_pipe *pp;
    if (peer < 0 || peer >= p->size || !p->core->cuda)
        return 0;
    pp = &p->pipes[peer];
    /* What the mover path asks (p2p/rndv.c, mover_applies). */
    return pp->mover.tp && pp->carrier.tp && pp->carrier.tp->scope == WEFT_TP_SCOPE_NODE && pp->mover.tp->rndv_mem &&
           (pp->mover.tp->rndv_mem(pp->mover.ctx, peer) & WEFT_TP_MEM_DEVICE) != 0;
}

void weft_p2p_prepare_device(struct weft_p2p *p)
{
    if (!p->core->cuda || __atomic_load_n(&p->device_prepared, __ATOMIC_ACQUIRE))
        return;
    size_t eager = 0;
    weft_p2p_lock(p);
    for (int i = 0; i < p->size; i++) {
        if (p->pipes[i].eager_limit > eager)
            eager = p->pipes[i].eager_limit;
        if (p->pipes[i].eager_limit_internal > eager)
            eager = p->pipes[i].eager_limit_internal;
    }
    weft_stage_prepare(p);
    weft_devcopy_prepare_bounce(p->core, eager);
    __atomic_store_n(&p->device_prepared, 1, __ATOMIC_RELEASE);
    weft_p2p_unlock(p);
}

int weft_p2p_idiscard(struct weft_p2p *p, int peer, int tag, struct weft_request **req, const char *fn)
{
    struct weft_request *r;
    int rc;
    weft_p2p_lock(p);
    rc = aborted(p)                             ? aborted_error(p, fn)
         : revoked(p) && weft_tag_revocable(tag) ? revoked_error(p, fn)
                                                 : weft_pipe_idiscard(&p->pipes[peer], tag, &r);
    weft_p2p_unlock(p);
    if (rc == WEFT_SUCCESS)
        *req = r;
    return rc;
}

int weft_p2p_isend_checked(struct weft_p2p *p, const void *buf, size_t bytes, int peer, int tag,
                           const struct weft_p2p_check *check, struct weft_request **req, const char *fn)
{
    return start_locked(p, 1, (void *)buf, bytes, peer, tag, check, 0, req, fn);
}

int weft_p2p_irecv_checked(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag,
                           const struct weft_p2p_check *check, struct weft_request **req, const char *fn)
{
    return start_locked(p, 0, buf, bytes, peer, tag, check, 0, req, fn);
}

void weft_p2p_peer_check(const struct weft_request *r, struct weft_p2p_check *out)
{
    *out = r->check;
}

/* ---- the user's requests: handles (request.h) ---- */

static weft_request_t *handle_of(struct weft_request *r)
{
    return (weft_request_t *)(uintptr_t)weft_req_handle(r);
}

int weft_p2p_user_isend(struct weft_p2p *p, const void *buf, size_t bytes, int peer, int tag, weft_request_t **h,
                        const char *fn)
{
    struct weft_request *r;
    int rc = start_locked(p, 1, (void *)buf, bytes, peer, tag, NULL, 1, &r, fn);
    if (rc == WEFT_SUCCESS)
        *h = handle_of(r);
    return rc;
}

int weft_p2p_user_irecv(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag, weft_request_t **h,
                        const char *fn)
{
    struct weft_request *r;
    int rc = start_locked(p, 0, buf, bytes, peer, tag, NULL, 1, &r, fn);
    if (rc == WEFT_SUCCESS)
        *h = handle_of(r);
    return rc;
}

int weft_p2p_user_upper(struct weft_p2p *p, const struct weft_p2p_upper_ops *ops, void *arg, weft_request_t **h)
{
    weft_p2p_lock(p);
    struct weft_request *r = weft_req_alloc(p);
    if (r == NULL) {
        weft_p2p_unlock(p);
        return weft_set_error(p->core, WEFT_ERR_NO_MEMORY, "non-blocking collective: no memory for a request");
    }
    r->type = WEFT_REQ_UPPER;
    r->state = WEFT_REQ_POSTED;
    r->user = 1;
    r->upper = ops;
    r->upper_arg = arg;
    r->status.peer = -1;
    r->status.tag = -1;
    *h = handle_of(r);
    weft_p2p_unlock(p);
    return WEFT_SUCCESS;
}

/* The application's wait hook as a client of the engine: MPI progress for
 * the PMPI drop-in, which only the application's threads may enter. It
 * must run (its messages may be what the peer we wait for waits on), so
 * waiters sleep at most 1 ms while it is set; but it costs far more than a
 * poll, so it runs at most once a millisecond. At 20 us it took a third of
 * an alltoallv's time through the drop-in at 8 ranks on 2 cores (np 8,
 * 32 B-8 KiB: 100-113 us a call, 61-76 without the hook, 71-82 at 1 ms;
 * Open MPI alone 63-91; docs/benchmarks.md, "The PMPI drop-in:
 * alltoallv"): Open MPI's MPI_Iprobe runs its progress, which on an
 * oversubscribed node yields the core. A wait that MPI's messages hold up
 * is long, and 1 ms is short beside it. */
static int wait_hook_poll(void *arg)
{
    struct weft_p2p *p = arg;
    void (*fn)(void *) = __atomic_load_n(&p->wait_fn, __ATOMIC_ACQUIRE);
    if (fn)
        fn(__atomic_load_n(&p->wait_fn_arg, __ATOMIC_ACQUIRE));
    return 0;
}

static const struct weft_engine_client wait_hook_client = {
    .name = "the application's wait hook",
    .poll = wait_hook_poll,
    .min_gap_s = 1e-3,
    .sleep_cap_ms = 1,
    .flags = WEFT_CLIENT_WAITS | WEFT_CLIENT_APP_ONLY,
};

int weft_p2p_set_wait_hook(struct weft_p2p *p, void (*fn)(void *arg), void *arg)
{
    weft_engine_unregister(p->engine, &wait_hook_client, p);
    __atomic_store_n(&p->wait_fn_arg, arg, __ATOMIC_RELEASE);
    __atomic_store_n(&p->wait_fn, fn, __ATOMIC_RELEASE);
    if (fn == NULL)
        return WEFT_SUCCESS;
    return weft_engine_register(p->engine, &wait_hook_client, p);
}

struct weft_engine *weft_p2p_engine(struct weft_p2p *p)
{
    return p->engine;
}

void weft_p2p_watch(struct weft_request *r, const char *what)
{
    struct weft_p2p *p = r->p2p;
    weft_p2p_lock(p);
    if (r->state != WEFT_REQ_DONE)
        weft_p2p_watch_one(p, r, what);
    weft_p2p_unlock(p);
}

/* An UPPER request's callback returned its code: complete. Lock held. */
static void upper_done(struct weft_request *r, int err)
{
    r->status.bytes = 0;
    r->status.peer = -1;
    r->status.tag = -1;
    r->status.error = err;
    r->state = WEFT_REQ_DONE;
}

/* Tests an UPPER request the caller has claimed (lock not held). */
static int upper_test(struct weft_p2p *p, struct weft_request *r)
{
    int err = WEFT_SUCCESS;
    if (r->state == WEFT_REQ_DONE)
        return 1;
    if (!r->upper->test(r->upper_arg, &err))
        return 0;
    weft_p2p_lock(p);
    upper_done(r, err);
    weft_p2p_unlock(p);
    return 1;
}

static int bad_handle(struct weft_p2p *p, const char *fn, const char *which, const void *h)
{
    return weft_set_error(p ? p->core : NULL, WEFT_ERR_INVALID_ARG,
                          "%s: %s %p names no outstanding request (it already completed and was freed by an "
                          "earlier test/wait, or it was never returned by weft_isend/weft_irecv)", fn, which, h);
}

/* The request of handle h, locked (p->lock held on success). */
static struct weft_request *handle_lock(weft_request_t *h, struct weft_p2p **pp, const char *fn)
{
    struct weft_p2p *p = weft_req_handle_p2p((uint64_t)(uintptr_t)h);
    struct weft_request *r;
    if (p == NULL) {
        bad_handle(NULL, fn, "request", h);
        return NULL;
    }
    weft_p2p_lock(p);
    r = weft_req_handle_lookup(p, (uint64_t)(uintptr_t)h);
    if (r == NULL || r->claimed) {
        weft_p2p_unlock(p);
        bad_handle(p, fn, "request", h);
        return NULL;
    }
    *pp = p;
    return r;
}

/* Copies out the status of a completed request, recycles it, returns its
 * code. Lock held (the pool is per comm). */
static int finish(struct weft_request *r, weft_status_t *status)
{
    int err = r->status.error;
    if (status)
        *status = r->status;
    weft_req_free(r);
    return err;
}

int weft_p2p_user_test(weft_request_t *h, int *done, weft_status_t *status)
{
    struct weft_p2p *p;
    struct weft_request *r = handle_lock(h, &p, "weft_test");
    int rc = WEFT_SUCCESS;
    if (r == NULL)
        return WEFT_ERR_INVALID_ARG;
    if (r->type == WEFT_REQ_UPPER) {
        /* Claimed while its callback runs without the lock. */
        r->claimed = 1;
        weft_p2p_unlock(p);
        *done = upper_test(p, r);
        weft_p2p_lock(p);
        r->claimed = 0;
        if (*done)
            rc = finish(r, status);
        weft_p2p_unlock(p);
        return rc;
    }
    if (r->state != WEFT_REQ_DONE) {
        weft_p2p_progress(p);
        if (r->state != WEFT_REQ_DONE)
            weft_p2p_watch_one(p, r, "weft_test");   /* a test loop is a wait too: the same clock */
    }
    *done = r->state == WEFT_REQ_DONE;
    if (*done)
        rc = finish(r, status);
    weft_p2p_unlock(p);
    if (!*done)   /* a test loop progresses non-blocking collectives too */
        weft_engine_run_waits(p->engine, weft_now(), 0);
    return rc;
}

int weft_p2p_user_wait(weft_request_t *h, weft_status_t *status)
{
    struct weft_p2p *p;
    struct weft_request *r = handle_lock(h, &p, "weft_wait");
    int rc;
    if (r == NULL)
        return WEFT_ERR_INVALID_ARG;
    if (r->type == WEFT_REQ_UPPER) {
        r->claimed = 1;
        weft_p2p_unlock(p);
        if (r->state != WEFT_REQ_DONE) {
            int err = r->upper->wait(r->upper_arg);
            weft_p2p_lock(p);
            upper_done(r, err);
        } else {
            weft_p2p_lock(p);
        }
        r->claimed = 0;
        rc = finish(r, status);
        weft_p2p_unlock(p);
        return rc;
    }
    if (r->state != WEFT_REQ_DONE)
        weft_p2p_progress_wait(p, &r, 1, "weft_wait");
    rc = finish(r, status);
    weft_p2p_unlock(p);
    return rc;
}

/* ---- waitall over handles of one or several comms ---- */

struct wa_comm {
    struct weft_p2p *p;
};

/* Claims every handle (refusing unknown, completed and repeated ones)
 * before anything is waited for; on a bad one, releases the claims. */
static int waitall_claim(size_t n, weft_request_t **hs, struct weft_request **rs, struct weft_p2p **ps)
{
    for (size_t i = 0; i < n; i++) {
        rs[i] = NULL;
        ps[i] = NULL;
        if (hs[i] == NULL)
            continue;
        struct weft_p2p *p;
        struct weft_request *r = handle_lock(hs[i], &p, "weft_waitall");
        if (r == NULL) {
            char which[48];
            int dup = 0;
            for (size_t j = 0; j < i; j++) {
                if (hs[j] == hs[i])
                    dup = 1;
                if (rs[j] == NULL)
                    continue;
                weft_p2p_lock(ps[j]);
                rs[j]->claimed = 0;
                weft_p2p_unlock(ps[j]);
            }
            if (dup)
                return weft_set_error(weft_req_handle_p2p((uint64_t)(uintptr_t)hs[i])->core, WEFT_ERR_INVALID_ARG,
                                      "weft_waitall: reqs[%zu] repeats an earlier entry (the same request twice); "
                                      "nothing was waited for or freed", i);
            snprintf(which, sizeof(which), "reqs[%zu]", i);
            return bad_handle(weft_req_handle_p2p((uint64_t)(uintptr_t)hs[i]), "weft_waitall", which, hs[i]);
        }
        r->claimed = 1;
        rs[i] = r;
        ps[i] = p;
        weft_p2p_unlock(p);
    }
    return WEFT_SUCCESS;
}

/* The usual waitall: every handle names a p2p request of one comm. Then
 * the claims, the wait and the completions share one hold of its lock
 * (otherwise two lock round trips per request, a claim and a completion:
 * about 160 of the 870 instructions a streamed 64-byte message cost its
 * sender, callgrind). 1: done, its code in *rc; 0: not that case (a
 * handle of another comm, an unknown, completed or repeated handle, a
 * non-blocking collective), nothing changed: the general path takes it
 * and says what is wrong in the usual words. */
static int waitall_one_comm(size_t n, weft_request_t **hs, struct weft_request **rs, weft_status_t *statuses,
                            int *rc)
{
    struct weft_p2p *p = NULL;
    size_t i;
    int first_err = WEFT_SUCCESS;

    for (i = 0; i < n; i++) {
        if (hs[i] == NULL)
            continue;
        struct weft_p2p *q = weft_req_handle_p2p((uint64_t)(uintptr_t)hs[i]);
        if (q == NULL || (p != NULL && q != p))
            return 0;
        p = q;
    }
    if (p == NULL)
        return 0;
    weft_p2p_lock(p);
    for (i = 0; i < n; i++) {
        rs[i] = NULL;
        if (hs[i] == NULL)
            continue;
        struct weft_request *r = weft_req_handle_lookup(p, (uint64_t)(uintptr_t)hs[i]);
        /* claimed: another waiter's, or this call's own (a repeated entry) */
        if (r == NULL || r->claimed || r->type == WEFT_REQ_UPPER)
            break;
        r->claimed = 1;   /* the wait below releases the lock at times */
        rs[i] = r;
    }
    if (i < n) {
        for (size_t j = 0; j < i; j++)
            if (rs[j])
                rs[j]->claimed = 0;
        weft_p2p_unlock(p);
        return 0;
    }
    weft_p2p_progress_wait(p, rs, n, "weft_waitall");
    for (i = 0; i < n; i++) {
        weft_status_t st = { 0, -1, -1, WEFT_SUCCESS };
        int err = WEFT_SUCCESS;
        if (rs[i]) {
            err = finish(rs[i], &st);
            hs[i] = NULL;
        }
        if (statuses)
            statuses[i] = st;
        if (err != WEFT_SUCCESS && first_err == WEFT_SUCCESS)
            first_err = err;
    }
    weft_p2p_unlock(p);
    *rc = first_err;
    return 1;
}

/* The core of the first comm among ps[0..n) (the backoff's spin time). */
static const struct weft_core *ps_core(struct weft_p2p *const *ps, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ps[i])
            return ps[i]->core;
    return NULL;
}

int weft_p2p_user_waitall(size_t n, weft_request_t **hs, weft_status_t *statuses)
{
    /* A window of 64 (a common streaming depth) needs no allocation. */
    struct weft_request *rs_small[64], **rs = rs_small;
    struct weft_p2p *ps_small[64], **ps = ps_small;
    int first_err = WEFT_SUCCESS, rc;

    if (n > 64) {
        rs = malloc(n * sizeof(*rs));
        ps = malloc(n * sizeof(*ps));
        if (rs == NULL || ps == NULL) {
            free(rs);
            free(ps);
            return weft_set_error(NULL, WEFT_ERR_NO_MEMORY, "weft_waitall: no memory for %zu requests", n);
        }
    }
    if (waitall_one_comm(n, hs, rs, statuses, &rc))
        goto out;
    rc = waitall_claim(n, hs, rs, ps);
    if (rc != WEFT_SUCCESS)
        goto out;

    /* One comm (the usual case): one wait under its lock. Several: take
     * turns, one progress pass of each in turn, so a request of one comm
     * that needs a peer to progress another comm cannot deadlock. */
    struct weft_p2p *only = NULL;
    int several = 0, uppers = 0;
    for (size_t i = 0; i < n; i++) {
        if (ps[i] == NULL)
            continue;
        if (rs[i]->type == WEFT_REQ_UPPER)
            uppers = 1;
        if (only == NULL)
            only = ps[i];
        else if (ps[i] != only)
            several = 1;
    }
    /* Non-blocking collectives among them: every entry takes turns (a
     * collective's progress is its own test), as with several comms. */
    if (uppers)
        several = 1;
    if (only != NULL && !several) {
        weft_p2p_lock(only);
        weft_p2p_progress_wait(only, rs, n, "weft_waitall");
        weft_p2p_unlock(only);
    } else if (several) {
        struct weft_backoff bo;
        weft_backoff_init(&bo, ps_core(ps, n));
        for (;;) {
            size_t pending = 0;
            int events = 0;
            for (size_t i = 0; i < n; i++) {
                if (ps[i] == NULL)
                    continue;
                if (rs[i]->type == WEFT_REQ_UPPER) {
                    if (rs[i]->state != WEFT_REQ_DONE) {
                        if (upper_test(ps[i], rs[i]))
                            events++;
                        else
                            pending++;
                    }
                    continue;
                }
                /* Each comm once per round: at its first pending p2p entry. */
                int seen = 0;
                for (size_t j = 0; j < i && !seen; j++)
                    seen = ps[j] == ps[i] && rs[j]->type != WEFT_REQ_UPPER && rs[j]->state != WEFT_REQ_DONE;
                if (seen)
                    continue;
                struct weft_p2p *p = ps[i];
                weft_p2p_lock(p);
                events += weft_p2p_progress(p);
                for (size_t j = i; j < n; j++)
                    if (ps[j] == p && rs[j]->type != WEFT_REQ_UPPER && rs[j]->state != WEFT_REQ_DONE) {
                        weft_p2p_watch_one(p, rs[j], "weft_waitall");
                        if (rs[j]->state != WEFT_REQ_DONE)
                            pending++;
                    }
                weft_p2p_unlock(p);
            }
            if (pending == 0)
                break;
            if (events > 0) {
                weft_backoff_busy(&bo);
                continue;
            }
            /* Idle: the engine's clients of these comms run, once per
             * comm (other non-blocking collectives, the application's
             * wait hooks), then the policy's step. */
            double now = weft_now();
            for (size_t i = 0; i < n; i++) {
                int first = ps[i] != NULL;
                for (size_t j = 0; j < i && first; j++)
                    first = ps[j] != ps[i];
                if (first)
                    weft_engine_run_waits(ps[i]->engine, now, 1);
            }
            weft_backoff_idle(&bo, now, 20);
        }
    }
    for (size_t i = 0; i < n; i++) {
        weft_status_t st = { 0, -1, -1, WEFT_SUCCESS };
        int err = WEFT_SUCCESS;
        if (rs[i]) {
            weft_p2p_lock(ps[i]);
            err = finish(rs[i], &st);
            weft_p2p_unlock(ps[i]);
            hs[i] = NULL;
        }
        if (statuses)
            statuses[i] = st;
        if (err != WEFT_SUCCESS && first_err == WEFT_SUCCESS)
            first_err = err;
    }
    rc = first_err;
out:
    if (rs != rs_small) {
        free(rs);
        free(ps);
    }
    return rc;
}

int weft_p2p_cancel(struct weft_request *r, int err)
{
    struct weft_p2p *p = r->p2p;
    weft_p2p_lock(p);
    int done = weft_pipe_cancel(r, err);
    weft_p2p_unlock(p);
    return done;
}

void weft_p2p_refuse_lane(struct weft_p2p *p, int peer, int tag, int err)
{
    weft_p2p_lock(p);
    weft_pipe_lane_refuse(&p->pipes[peer], tag, err);
    weft_p2p_unlock(p);
}

void weft_p2p_refuse_call(struct weft_p2p *p, int (*tag)(unsigned seq, int phase), uint32_t seq, int phases, int err)
{
    weft_p2p_lock(p);
    for (int peer = 0; peer < p->size; peer++)
        if (peer != p->rank)
            for (int ph = 0; ph < phases; ph++)
                weft_pipe_lane_refuse(&p->pipes[peer], tag(seq, ph), err);
    weft_p2p_unlock(p);
}

int weft_p2p_wait_done_until(struct weft_request *r, const char *what, const uint64_t *stop_epoch)
{
    struct weft_p2p *p = r->p2p;
    int rc = WEFT_SUCCESS;

    weft_p2p_lock(p);
    if (r->state != WEFT_REQ_DONE)
        rc = weft_p2p_progress_wait_until(p, &r, 1, what, stop_epoch);
    weft_p2p_unlock(p);
    return rc;
}

/* Written under p->lock, always with an atomic store (health.c), so it
 * can be read without the lock: the node-local collectives read it twice
 * a call. */
uint64_t weft_p2p_fault_epoch(struct weft_p2p *p)
{
    return __atomic_load_n(&p->fault_epoch, __ATOMIC_ACQUIRE);
}

int weft_p2p_fault(struct weft_p2p *p, uint64_t call, char *why, size_t whylen)
{
    int code = WEFT_SUCCESS;
    /* Every fault this reports (a peer's notice, a declared rank) bumped
     * the epoch first; none yet and not aborted: nothing to report, and
     * no lock taken (the common case, on every collective's start). */
    if (weft_p2p_fault_epoch(p) == 0 && !aborted(p))
        return WEFT_SUCCESS;
    weft_p2p_lock(p);
    const struct weft_coll_note *c = weft_health_coll_note(p, call);
    if (revoked(p)) {
        /* What every pending call returns; what was failing before, too. */
        code = WEFT_ERR_REVOKED;
        if (c != NULL)
            snprintf(why, whylen, "%s; this call had failed already: %s (reported by rank %d)", p->revoke_why,
                     c->text, c->from);
        else
            snprintf(why, whylen, "%s", p->revoke_why);
    } else if (c != NULL) {
        code = c->code;
        if (c->from == p->rank)   /* this rank's own census decided it */
            snprintf(why, whylen, "%s", c->text);
        else
            snprintf(why, whylen, "%s (reported by rank %d)", c->text, c->from);
    } else if (p->fault_rank >= 0) {
        code = p->fault_code;
        snprintf(why, whylen, "%s", p->fault_why);
    } else if (aborted(p)) {
        code = WEFT_ERR_ABORTED;
        snprintf(why, whylen, "the comm was aborted (weft_comm_abort)");
    }
    weft_p2p_unlock(p);
    return code;
}

int weft_p2p_await_note(struct weft_p2p *p, uint64_t call, double bound_s, char *why, size_t whylen)
{
    weft_p2p_lock(p);
    const double until = weft_now() + bound_s;
    while (weft_health_coll_note(p, call) == NULL && p->fault_rank < 0 && !revoked(p)) {
        if (weft_p2p_progress(p) > 0)
            continue;
        double now = weft_now();
        if (now >= until)
            break;
        weft_health_tick(p, now);
        weft_p2p_unlock(p);
        weft_nap_us(200);
        weft_p2p_lock(p);
    }
    weft_p2p_unlock(p);
    return weft_p2p_fault(p, call, why, whylen);
}

int weft_p2p_coll_decided_here(struct weft_p2p *p, uint64_t call)
{
    weft_p2p_lock(p);
    const struct weft_coll_note *c = weft_health_coll_note(p, call);
    int here = c != NULL && c->from == p->rank;
    weft_p2p_unlock(p);
    return here;
}

void weft_p2p_coll_failed(struct weft_p2p *p, uint64_t call, int code, const char *text)
{
    weft_p2p_lock(p);
    weft_health_coll_failed(p, call, code, text);
    weft_p2p_unlock(p);
}

void weft_p2p_revoke(struct weft_p2p *p)
{
    weft_p2p_lock(p);
    /* The reason the comm was failing, if it was: every rank is told it. */
    weft_health_revoke(p, p->rank, p->fault_rank >= 0 ? p->fault_why : "");
    weft_p2p_unlock(p);
}

int weft_p2p_revoked(struct weft_p2p *p, char *why, size_t whylen)
{
    if (!revoked(p))
        return 0;
    weft_p2p_lock(p);
    snprintf(why, whylen, "%s", p->revoke_why);
    weft_p2p_unlock(p);
    return 1;
}

int weft_p2p_peer_down(struct weft_p2p *p, int peer, char *why, size_t whylen)
{
    weft_p2p_lock(p);
    const struct weft_peer_pipe *pp = &p->pipes[peer];
    int down = pp->broken != 0;
    if (down)
        snprintf(why, whylen, "%s", pp->failed || pp->link_down ? pp->fail_why : "the link to it is down");
    weft_p2p_unlock(p);
    return down;
}

int weft_p2p_link_down(struct weft_p2p *p, int peer)
{
    weft_p2p_lock(p);
    const struct weft_peer_pipe *pp = &p->pipes[peer];
    int down = pp->link_down && !pp->failed;
    weft_p2p_unlock(p);
    return down;
}

int weft_p2p_known_links(struct weft_p2p *p, int (*pairs)[2], int max)
{
    weft_p2p_lock(p);
    int n = p->nlinks < max ? p->nlinks : max;
    for (int i = 0; i < n; i++) {
        pairs[i][0] = p->links[i][0];
        pairs[i][1] = p->links[i][1];
    }
    weft_p2p_unlock(p);
    return n;
}

void weft_p2p_abort(struct weft_p2p *p)
{
    __atomic_store_n(&p->core->aborted, 1, __ATOMIC_RELEASE);
    weft_p2p_lock(p);
    weft_health_abort(p);
    weft_p2p_unlock(p);
}

int weft_p2p_done(const struct weft_request *r)
{
    /* Under the lock: the pipe layer moves a request through its states
     * with plain stores (TSan: an unlocked read races with them). */
    struct weft_p2p *p = r->p2p;
    weft_p2p_lock(p);
    int done = r->state == WEFT_REQ_DONE;
    weft_p2p_unlock(p);
    return done;
}

/* One progress pass unless r is done; when it is, what the caller asked
 * for (the peer's check, whether the sender's GPU signalled) and finish. */
static int test_finish(struct weft_request *r, int *done, weft_status_t *status, struct weft_p2p_check *peer,
                       int *signaled)
{
    struct weft_p2p *p = r->p2p;
    int rc = WEFT_SUCCESS;

    weft_p2p_lock(p);
    if (r->state != WEFT_REQ_DONE)
        weft_p2p_progress(p);
    *done = r->state == WEFT_REQ_DONE;
    if (signaled)
        *signaled = 0;
    if (*done) {
        if (peer)
            *peer = r->check;
        if (signaled)
            *signaled = r->type == WEFT_REQ_RECV && r->xfer.signal_done;
        rc = finish(r, status);
    }
    weft_p2p_unlock(p);
    return rc;
}

int weft_p2p_test_check(struct weft_request *r, int *done, weft_status_t *status, struct weft_p2p_check *peer)
{
    return test_finish(r, done, status, peer, NULL);
}

int weft_p2p_test_signal(struct weft_request *r, int *done, weft_status_t *status, int *signaled)
{
    return test_finish(r, done, status, NULL, signaled);
}

int weft_p2p_test(struct weft_request *r, int *done, weft_status_t *status)
{
    struct weft_p2p *p = r->p2p;
    int rc = WEFT_SUCCESS;

    weft_p2p_lock(p);
    if (r->state != WEFT_REQ_DONE)
        weft_p2p_progress(p);
    *done = r->state == WEFT_REQ_DONE;
    if (*done)
        rc = finish(r, status);
    weft_p2p_unlock(p);
    return rc;
}

int weft_p2p_wait(struct weft_request *r, weft_status_t *status)
{
    struct weft_p2p *p = r->p2p;
    int rc;

    weft_p2p_lock(p);
    if (r->state != WEFT_REQ_DONE)
        weft_p2p_progress_wait(p, &r, 1, "weft_wait");
    rc = finish(r, status);
    weft_p2p_unlock(p);
    return rc;
}

int weft_p2p_wait_announced(struct weft_request *r, double bound_s, const char *what)
{
    struct weft_p2p *p = r->p2p;
    int left = 0;

    weft_p2p_lock(p);
    const double until = weft_now() + bound_s;
    while (r->state != WEFT_REQ_DONE) {
        if (r->type != WEFT_REQ_SEND || r->state != WEFT_REQ_POSTED || r->pipe->broken) {
            /* Data moving, or not yet out: the usual wait (bounded by
             * WEFT_TIMEOUT, which breaks its pipe). */
            (void)weft_p2p_progress_wait(p, &r, 1, what);
            break;
        }
        if (weft_p2p_progress(p) > 0)
            continue;
        double now = weft_now();
        weft_health_tick(p, now);   /* a peer that dies meanwhile breaks its pipe: r completes */
        if (r->state == WEFT_REQ_DONE || r->pipe->broken)
            continue;
        if (now >= until) {
            left = 1;
            break;
        }
        weft_p2p_unlock(p);
        weft_nap_us(500);
        weft_p2p_lock(p);
    }
    weft_p2p_unlock(p);
    return !left;
}

int weft_p2p_wait_done(struct weft_request *r, const char *what)
{
    struct weft_p2p *p = r->p2p;
    int rc = WEFT_SUCCESS;

    weft_p2p_lock(p);
    if (r->state != WEFT_REQ_DONE)
        rc = weft_p2p_progress_wait(p, &r, 1, what);
    weft_p2p_unlock(p);
    return rc;
}

int weft_p2p_waitall(size_t n, struct weft_request **reqs, weft_status_t *statuses)
{
    int first_err = WEFT_SUCCESS;
    size_t start = 0;

    /* Runs of requests of one comm (usually all of them) are waited for
     * together; NULL entries count as done with an empty status. */
    while (start < n) {
        struct weft_p2p *p = NULL;
        size_t end;
        for (end = start; end < n; end++) {
            if (reqs[end] == NULL)
                continue;
            if (p == NULL)
                p = reqs[end]->p2p;
            else if (reqs[end]->p2p != p)
                break;
        }
        if (p) {
            weft_p2p_lock(p);
            weft_p2p_progress_wait(p, reqs + start, end - start, "weft_waitall");
        }
        for (size_t i = start; i < end; i++) {
            weft_status_t st = { 0, -1, -1, WEFT_SUCCESS };
            int err = WEFT_SUCCESS;
            if (reqs[i]) {
                err = finish(reqs[i], &st);
                reqs[i] = NULL;
            }
            if (statuses)
                statuses[i] = st;
            if (err != WEFT_SUCCESS && first_err == WEFT_SUCCESS)
                first_err = err;
        }
        if (p)
            weft_p2p_unlock(p);
        start = end;
    }
    return first_err;
}

/* Blocking send/recv: one lock hold for start, wait and completion. */
static int blocking(struct weft_p2p *p, int send, void *buf, size_t bytes, int peer, int tag,
                    weft_status_t *status, const char *fn)
{
    struct weft_request *r;
    int kind, dev;
    int rc = weft_mem_classify(p->core, buf, bytes, peer, tag, fn, &kind, &dev);
    if (rc != WEFT_SUCCESS)
        return rc;
    weft_p2p_lock(p);
    rc = aborted(p)                             ? aborted_error(p, fn)
         : revoked(p) && weft_tag_revocable(tag) ? revoked_error(p, fn)
                                                 : start(p, send, buf, bytes, peer, tag, kind, dev, &r);
    if (rc == WEFT_SUCCESS) {
        if (r->state != WEFT_REQ_DONE)
            weft_p2p_progress_wait(p, &r, 1, fn);
        rc = finish(r, status);
    }
    weft_p2p_unlock(p);
    return rc;
}

int weft_p2p_send(struct weft_p2p *p, const void *buf, size_t bytes, int peer, int tag, const char *fn)
{
    return blocking(p, 1, (void *)buf, bytes, peer, tag, NULL, fn);
}

int weft_p2p_recv(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag, weft_status_t *status,
                  const char *fn)
{
    return blocking(p, 0, buf, bytes, peer, tag, status, fn);
}

int weft_p2p_mem_pin(struct weft_p2p *p, const void *buf, size_t bytes)
{
    char why[256];
    int rc = WEFT_SUCCESS;

    weft_p2p_lock(p);
    for (int i = 0; i < p->ntps && rc == WEFT_SUCCESS; i++) {
        const struct weft_p2p_tp *t = &p->tps[i];
        if (t->ctx == NULL || t->tp->mem_pin == NULL)
            continue;
        why[0] = '\0';
        rc = t->tp->mem_pin(t->ctx, buf, bytes, why, sizeof(why));
        if (rc != WEFT_SUCCESS)
            rc = weft_set_error(p->core, rc,
                                "weft_mem_register: registering [0x%" PRIxPTR ", 0x%" PRIxPTR ") (%zu bytes) failed: %s",
                                (uintptr_t)buf, (uintptr_t)buf + bytes, bytes,
                                why[0] != '\0' ? why : weft_err_str(rc));
    }
    weft_p2p_unlock(p);
    return rc;
}

int weft_p2p_mem_unpin(struct weft_p2p *p, const void *buf, size_t bytes)
{
    weft_p2p_lock(p);
    for (int i = 0; i < p->ntps; i++)
        if (p->tps[i].ctx && p->tps[i].tp->mem_unpin)
            p->tps[i].tp->mem_unpin(p->tps[i].ctx, buf, bytes);
    weft_p2p_unlock(p);
    return WEFT_SUCCESS;
}

size_t weft_p2p_eager(struct weft_p2p *p, int peer)
{
    return p->pipes[peer].eager_limit;
}

size_t weft_p2p_internal_eager(struct weft_p2p *p, int peer)
{
    return p->pipes[peer].eager_limit_internal;
}
