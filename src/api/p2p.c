/*
 * The public point-to-point calls: argument checks (check.c), then the pipe
 * layer (p2p/p2p.h), which classifies the buffer, takes the lock and starts
 * or completes the request. User tags are >= 0; the negative ones are the
 * library's own lanes (p2p/tags.h).
 */
#include "check.h"
#include "comm.h"
#include "log.h"
#include "p2p.h"

int weft_isend(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, weft_request_t **req)
{
    int rc = weft_check_p2p(c, buf, bytes, peer, tag, req, "weft_isend");
    if (rc != WEFT_SUCCESS)
        return rc;
    return weft_p2p_user_isend(c->p2p, buf, bytes, peer, tag, req, "weft_isend");
}

int weft_irecv(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, weft_request_t **req)
{
    int rc = weft_check_p2p(c, buf, bytes, peer, tag, req, "weft_irecv");
    if (rc != WEFT_SUCCESS)
        return rc;
    return weft_p2p_user_irecv(c->p2p, buf, bytes, peer, tag, req, "weft_irecv");
}

int weft_send(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag)
{
    int rc = 0;   /* no request output: &rc stands in for it */
    rc = weft_check_p2p(c, buf, bytes, peer, tag, &rc, "weft_send");
    if (rc != WEFT_SUCCESS)
        return rc;
    return weft_p2p_send(c->p2p, buf, bytes, peer, tag, "weft_send");
}

int weft_recv(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, weft_status_t *status)
{
    int rc = 0;   /* no request output: &rc stands in for it */
    rc = weft_check_p2p(c, buf, bytes, peer, tag, &rc, "weft_recv");
    if (rc != WEFT_SUCCESS)
        return rc;
    return weft_p2p_recv(c->p2p, buf, bytes, peer, tag, status, "weft_recv");
}

int weft_test(weft_request_t *req, int *done, weft_status_t *status)
{
    if (req == NULL || done == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_test: %s is NULL", req ? "done" : "req");
    return weft_p2p_user_test(req, done, status);
}

int weft_wait(weft_request_t *req, weft_status_t *status)
{
    if (req == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_wait: req is NULL");
    return weft_p2p_user_wait(req, status);
}

int weft_waitall(size_t n, weft_request_t **reqs, weft_status_t *statuses)
{
    if (n == 0)
        return WEFT_SUCCESS;
    if (reqs == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_waitall: reqs is NULL with n = %zu", n);
    return weft_p2p_user_waitall(n, reqs, statuses);
}
