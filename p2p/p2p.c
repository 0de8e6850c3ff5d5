/*
 * The pipe layer's entry points for the layers above (p2p.h): buffer
 * classification, the lock, the hand-over to the pipe, completion.
 */
#include "p2p.h"

#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "context.h"
#include "devcopy.h"
#include "log.h"
#include "pipe.h"

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
    return send ? weft_pipe_isend(&p->pipes[peer], buf, bytes, tag, kind, dev, r)
                : weft_pipe_irecv(&p->pipes[peer], buf, bytes, tag, kind, dev, r);
}

static int start_locked(struct weft_p2p *p, int send, void *buf, size_t bytes, int peer, int tag,
                        struct weft_request **req, const char *fn)
{
    struct weft_request *r;
    int kind, dev;
    /* Classified outside the lock: CUDA may be asked. */
    int rc = weft_mem_classify(p->core, buf, bytes, peer, tag, fn, &kind, &dev);
    if (rc != WEFT_SUCCESS)
        return rc;
    pthread_mutex_lock(&p->lock);
    rc = start(p, send, buf, bytes, peer, tag, kind, dev, &r);
    pthread_mutex_unlock(&p->lock);
    if (rc == WEFT_SUCCESS)
        *req = r;
    return rc;
}

int weft_p2p_isend(struct weft_p2p *p, const void *buf, size_t bytes, int peer, int tag,
                   struct weft_request **req, const char *fn)
{
    return start_locked(p, 1, (void *)buf, bytes, peer, tag, req, fn);
}

int weft_p2p_irecv(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag,
                   struct weft_request **req, const char *fn)
{
    return start_locked(p, 0, buf, bytes, peer, tag, req, fn);
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

int weft_p2p_poll(struct weft_p2p *p)
{
    pthread_mutex_lock(&p->lock);
    int n = weft_p2p_progress(p);
    pthread_mutex_unlock(&p->lock);
    return n;
}

int weft_p2p_done(const struct weft_request *r)
{
    return __atomic_load_n(&r->state, __ATOMIC_RELAXED) == WEFT_REQ_DONE;
}

int weft_p2p_test(struct weft_request *r, int *done, weft_status_t *status)
{
    struct weft_p2p *p = r->p2p;
    int rc = WEFT_SUCCESS;

    pthread_mutex_lock(&p->lock);
    if (r->state != WEFT_REQ_DONE)
        weft_p2p_progress(p);
    *done = r->state == WEFT_REQ_DONE;
    if (*done)
        rc = finish(r, status);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int weft_p2p_wait(struct weft_request *r, weft_status_t *status)
{
    struct weft_p2p *p = r->p2p;
    int rc;

    pthread_mutex_lock(&p->lock);
    if (r->state != WEFT_REQ_DONE)
        weft_p2p_progress_wait(p, &r, 1, "weft_wait");
    rc = finish(r, status);
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int weft_p2p_wait_done(struct weft_request *r, const char *what)
{
    struct weft_p2p *p = r->p2p;
    int rc = WEFT_SUCCESS;

    pthread_mutex_lock(&p->lock);
    if (r->state != WEFT_REQ_DONE)
        rc = weft_p2p_progress_wait(p, &r, 1, what);
    pthread_mutex_unlock(&p->lock);
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
            pthread_mutex_lock(&p->lock);
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
            pthread_mutex_unlock(&p->lock);
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
    pthread_mutex_lock(&p->lock);
    rc = start(p, send, buf, bytes, peer, tag, kind, dev, &r);
    if (rc == WEFT_SUCCESS) {
        if (r->state != WEFT_REQ_DONE)
            weft_p2p_progress_wait(p, &r, 1, fn);
        rc = finish(r, status);
    }
    pthread_mutex_unlock(&p->lock);
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

    pthread_mutex_lock(&p->lock);
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
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int weft_p2p_mem_unpin(struct weft_p2p *p, const void *buf, size_t bytes)
{
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < p->ntps; i++)
        if (p->tps[i].ctx && p->tps[i].tp->mem_unpin)
            p->tps[i].tp->mem_unpin(p->tps[i].ctx, buf, bytes);
    pthread_mutex_unlock(&p->lock);
    return WEFT_SUCCESS;
}
