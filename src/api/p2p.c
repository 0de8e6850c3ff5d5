/*
 * The public point-to-point calls: argument checks, the memory kind of the
 * buffer, the comm lock, and the hand-over to the pipe (p2p/pipe.c). Also
 * error strings.
 *
 * Memory kind. Every call classifies its buffer once (weft_cuda_mem_attr,
 * outside the lock) and the request carries the result. In a process without
 * CUDA that call returns at once. Device (or managed) memory on a comm
 * without CUDA is refused with WEFT_ERR_UNSUPPORTED, never read as host
 * memory; pinned host memory is host memory for every transport.
 */
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "comm.h"
#include "cudawrap.h"
#include "log.h"
#include "pipe.h"

const char *weft_strerror(int err)
{
    switch (err) {
    case WEFT_SUCCESS:          return "success";
    case WEFT_ERR_INVALID_ARG:  return "invalid argument";
    case WEFT_ERR_TRUNCATE:     return "message truncated: larger than the receive buffer";
    case WEFT_ERR_NO_MEMORY:    return "out of memory";
    case WEFT_ERR_UNSUPPORTED:  return "unsupported";
    case WEFT_ERR_TRANSPORT:    return "transport failure";
    case WEFT_ERR_TIMEOUT:      return "timed out (no progress within WEFT_TIMEOUT)";
    case WEFT_ERR_MPI:          return "MPI call failed";
    case WEFT_ERR_INTERNAL:     return "internal error";
    default:                    return "unknown weft error code";
    }
}

const char *weft_comm_last_error(const weft_comm_t *c)
{
    static _Thread_local char copy[sizeof(((struct weft_comm *)0)->last_error)];
    struct weft_comm *cm = (struct weft_comm *)c;

    if (c == NULL)
        return "weft_comm_last_error: comm is NULL";
    pthread_mutex_lock(&cm->err_lock);
    memcpy(copy, cm->last_error, sizeof(copy));
    pthread_mutex_unlock(&cm->err_lock);
    return copy;
}

int weft_comm_rank(const weft_comm_t *c) { return c ? c->rank : -1; }
int weft_comm_size(const weft_comm_t *c) { return c ? c->size : -1; }

/* Checks shared by send and receive. internal: negative tags allowed. */
static int check_p2p(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, void *req,
                     const char *fn, int internal)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    if (req == NULL)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: request pointer (req) is NULL", fn);
    if (buf == NULL && bytes != 0)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: buf is NULL but bytes is %zu (peer %d, tag %d)", fn,
                              bytes, peer, tag);
    if (peer < 0 || peer >= c->size)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: peer %d out of range [0, %d) (tag %d)", fn, peer,
                              c->size, tag);
    if (tag < 0 && !internal)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: tag %d is negative (peer %d); tags are >= 0", fn,
                              tag, peer);
    return WEFT_SUCCESS;
}

static const char *mem_kind_name(int kind)
{
    switch (kind) {
    case WEFT_MEM_PINNED:  return "pinned host";
    case WEFT_MEM_DEVICE:  return "device";
    case WEFT_MEM_MANAGED: return "managed";
    default:               return "host";
    }
}

/* Is there any CUDA in this process (weft's or the application's)? Looked
 * up once: a host-only process then pays one load per call. A comm with
 * CUDA knows it already (c->cuda). */
static int cuda_in_process(void)
{
    static int state = -1;   /* -1: not looked up yet */
    int s = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (s < 0) {
        s = weft_cuda_present() ? 1 : 0;
        __atomic_store_n(&state, s, __ATOMIC_RELAXED);
    }
    return s;
}

/* The buffer may be device memory: ask CUDA. */
__attribute__((noinline)) static int classify_cuda(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
                                                   const char *fn, int *kind, int *device)
{
    struct weft_mem_attr a;

    weft_cuda_mem_attr(buf, &a);
    if (weft_mem_is_device(a.kind) && !c->cuda) {
        const char *why = weft_cuda_why();
        return weft_set_error(c, WEFT_ERR_UNSUPPORTED,
                              "%s: buf %p (%zu bytes, peer %d, tag %d) is CUDA %s memory of device %d, but weft "
                              "cannot use CUDA in this process: %s",
                              fn, buf, bytes, peer, tag, mem_kind_name(a.kind), a.device,
                              why && *why ? why : "CUDA was not set up for this comm (WEFT_CUDA_LIB, WEFT_DEBUG=info)");
    }
    *kind = a.kind;
    *device = a.device;
    return WEFT_SUCCESS;
}

/* Memory kind of buf (once per call). A zero-byte message moves no data:
 * its buffer is not looked at. */
static inline int classify(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, const char *fn,
                           int *kind, int *device)
{
    *kind = WEFT_MEM_HOST;
    *device = -1;
    if (bytes == 0 || (!c->cuda && !cuda_in_process()))
        return WEFT_SUCCESS;
    return classify_cuda(c, buf, bytes, peer, tag, fn, kind, device);
}

static inline __attribute__((always_inline)) int do_isend(weft_comm_t *c, const void *buf, size_t bytes, int peer,
                                                          int tag, weft_request_t **req, int internal)
{
    struct weft_request *r;
    int kind, dev;
    int rc = check_p2p(c, buf, bytes, peer, tag, req, "weft_isend", internal);
    if (rc == WEFT_SUCCESS)
        rc = classify(c, buf, bytes, peer, tag, "weft_isend", &kind, &dev);
    if (rc != WEFT_SUCCESS)
        return rc;
    pthread_mutex_lock(&c->lock);
    rc = weft_pipe_isend_mem(c, buf, bytes, peer, tag, kind, dev, &r);
    pthread_mutex_unlock(&c->lock);
    if (rc == WEFT_SUCCESS)
        *req = r;
    return rc;
}

static inline __attribute__((always_inline)) int do_irecv(weft_comm_t *c, void *buf, size_t bytes, int peer,
                                                          int tag, weft_request_t **req, int internal)
{
    struct weft_request *r;
    int kind, dev;
    int rc = check_p2p(c, buf, bytes, peer, tag, req, "weft_irecv", internal);
    if (rc == WEFT_SUCCESS)
        rc = classify(c, buf, bytes, peer, tag, "weft_irecv", &kind, &dev);
    if (rc != WEFT_SUCCESS)
        return rc;
    pthread_mutex_lock(&c->lock);
    rc = weft_pipe_irecv_mem(c, buf, bytes, peer, tag, kind, dev, &r);
    pthread_mutex_unlock(&c->lock);
    if (rc == WEFT_SUCCESS)
        *req = r;
    return rc;
}

int weft_isend(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, weft_request_t **req)
{
    return do_isend(c, buf, bytes, peer, tag, req, 0);
}

int weft_irecv(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, weft_request_t **req)
{
    return do_irecv(c, buf, bytes, peer, tag, req, 0);
}

int weft_isend_internal(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, weft_request_t **req)
{
    return do_isend(c, buf, bytes, peer, tag, req, 1);
}

int weft_irecv_internal(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, weft_request_t **req)
{
    return do_irecv(c, buf, bytes, peer, tag, req, 1);
}

/* Copies out the status of a completed request, recycles it, returns its
 * code. Caller holds the comm lock (the request pool is per comm). */
static int finish(struct weft_request *r, weft_status_t *status)
{
    int err = r->status.error;
    if (status)
        *status = r->status;
    weft_request_free(r);
    return err;
}

int weft_test(weft_request_t *req, int *done, weft_status_t *status)
{
    struct weft_comm *c;
    int rc = WEFT_SUCCESS;

    if (req == NULL || done == NULL)
        return weft_set_error(req ? req->comm : NULL, WEFT_ERR_INVALID_ARG, "weft_test: %s is NULL",
                              req ? "done" : "req");
    c = req->comm;
    pthread_mutex_lock(&c->lock);
    if (req->state != WEFT_REQ_DONE)
        weft_progress(c);
    *done = req->state == WEFT_REQ_DONE;
    if (*done)
        rc = finish(req, status);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int weft_wait(weft_request_t *req, weft_status_t *status)
{
    struct weft_comm *c;
    int rc;

    if (req == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_wait: req is NULL");
    c = req->comm;
    pthread_mutex_lock(&c->lock);
    if (req->state != WEFT_REQ_DONE)
        weft_progress_wait(c, &req, 1, "weft_wait");
    rc = finish(req, status);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int weft_waitall(size_t n, weft_request_t **reqs, weft_status_t *statuses)
{
    int first_err = WEFT_SUCCESS;
    size_t start = 0;

    if (n == 0)
        return WEFT_SUCCESS;
    if (reqs == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_waitall: reqs is NULL with n = %zu", n);

    /* Runs of requests of one comm (usually all of them) are waited for
     * together; NULL entries count as done with an empty status. */
    while (start < n) {
        struct weft_comm *c = NULL;
        size_t end;
        for (end = start; end < n; end++) {
            if (reqs[end] == NULL)
                continue;
            if (c == NULL)
                c = reqs[end]->comm;
            else if (reqs[end]->comm != c)
                break;
        }
        if (c) {
            pthread_mutex_lock(&c->lock);
            weft_progress_wait(c, reqs + start, end - start, "weft_waitall");
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
        if (c)
            pthread_mutex_unlock(&c->lock);
        start = end;
    }
    return first_err;
}

/* Blocking send/recv: one lock hold for start, wait and completion. */
int weft_send(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag)
{
    struct weft_request *r;
    int kind, dev;
    int rc = check_p2p(c, buf, bytes, peer, tag, &r, "weft_send", 0);
    if (rc == WEFT_SUCCESS)
        rc = classify(c, buf, bytes, peer, tag, "weft_send", &kind, &dev);
    if (rc != WEFT_SUCCESS)
        return rc;
    pthread_mutex_lock(&c->lock);
    rc = weft_pipe_isend_mem(c, buf, bytes, peer, tag, kind, dev, &r);
    if (rc == WEFT_SUCCESS) {
        if (r->state != WEFT_REQ_DONE)
            weft_progress_wait(c, &r, 1, "weft_send");
        rc = finish(r, NULL);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int weft_recv(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, weft_status_t *status)
{
    struct weft_request *r;
    int kind, dev;
    int rc = check_p2p(c, buf, bytes, peer, tag, &r, "weft_recv", 0);
    if (rc == WEFT_SUCCESS)
        rc = classify(c, buf, bytes, peer, tag, "weft_recv", &kind, &dev);
    if (rc != WEFT_SUCCESS)
        return rc;
    pthread_mutex_lock(&c->lock);
    rc = weft_pipe_irecv_mem(c, buf, bytes, peer, tag, kind, dev, &r);
    if (rc == WEFT_SUCCESS) {
        if (r->state != WEFT_REQ_DONE)
            weft_progress_wait(c, &r, 1, "weft_recv");
        rc = finish(r, status);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}
