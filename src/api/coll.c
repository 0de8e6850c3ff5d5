/*
 * The public collectives: argument checks (check.c), then the collectives
 * layer (collectives/coll.h) on the comm's context. Each blocking call is
 * start + wait of the same call its non-blocking twin starts.
 */
#include "check.h"
#include "coll.h"
#include "comm.h"
#include "log.h"
#include "weft.h"

/* This rank refused the call on its own arguments: on a comm that works,
 * the call still takes its number and the other ranks are told why, so
 * theirs fails naming this rank and every rank stays in step (issue 28,
 * item 1; collectives/coll.h, weft_coll_refused). rc is the refusal. */
static int refused(weft_comm_t *c, int rc, const char *fn)
{
    if (c != NULL && !__atomic_load_n(&c->core.aborted, __ATOMIC_ACQUIRE) &&
        !__atomic_load_n(&c->core.revoked, __ATOMIC_ACQUIRE))
        weft_coll_refused(&c->coll, fn);
    return rc;
}

/* Runs a (blocking), or starts it with a request handle (req_out != NULL). */
static int coll_call(weft_comm_t *c, const struct weft_coll_args *a, weft_request_t **req_out, int want_req,
                     const char *fn)
{
    int rc;
    if (want_req && (rc = weft_check_req_out(c, req_out, fn)) != WEFT_SUCCESS)
        return refused(c, rc, fn);
    if ((rc = weft_check_live(c, fn)) != WEFT_SUCCESS)
        return rc;
    if (want_req)
        return weft_coll_istart(&c->coll, a, req_out);
    return weft_coll_run(&c->coll, a);
}

static int allgather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                     weft_request_t **req, int want_req, const char *fn)
{
    int rc = weft_check_allgather(c, sendbuf, recvbuf, bytes_per_rank, fn);
    if (rc != WEFT_SUCCESS)
        return refused(c, rc, fn);
    struct weft_coll_args a = { WEFT_COLL_ALLGATHER, sendbuf, recvbuf, bytes_per_rank, -1, -1, -1, NULL, NULL };
    return coll_call(c, &a, req, want_req, fn);
}

static int barrier(weft_comm_t *c, weft_request_t **req, int want_req, const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    struct weft_coll_args a = { WEFT_COLL_BARRIER, NULL, NULL, 0, -1, -1, -1, NULL, NULL };
    return coll_call(c, &a, req, want_req, fn);
}

static int bcast(weft_comm_t *c, void *buf, size_t bytes, int root, weft_request_t **req, int want_req,
                 const char *fn)
{
    int rc = weft_check_bcast(c, buf, bytes, root, fn);
    if (rc != WEFT_SUCCESS)
        return refused(c, rc, fn);
    struct weft_coll_args a = { WEFT_COLL_BCAST, NULL, buf, bytes, -1, -1, root, NULL, NULL };
    return coll_call(c, &a, req, want_req, fn);
}

static int reduction(weft_comm_t *c, int kind, const void *sendbuf, void *recvbuf, size_t count, int dtype,
                     int op, int root, weft_request_t **req, int want_req, const char *fn)
{
    int rc = weft_check_reduce(c, kind, sendbuf, recvbuf, count, dtype, op, root, fn);
    if (rc != WEFT_SUCCESS)
        return refused(c, rc, fn);
    struct weft_coll_args a = { kind, sendbuf, recvbuf, count, dtype, op, kind == WEFT_COLL_REDUCE ? root : -1, NULL,
                                NULL };
    return coll_call(c, &a, req, want_req, fn);
}

static int alltoall(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                    weft_request_t **req, int want_req, const char *fn)
{
    int rc = weft_check_alltoall(c, sendbuf, recvbuf, bytes_per_rank, fn);
    if (rc != WEFT_SUCCESS)
        return refused(c, rc, fn);
    struct weft_coll_args a = { WEFT_COLL_ALLTOALL, sendbuf, recvbuf, bytes_per_rank, -1, -1, -1, NULL, NULL };
    return coll_call(c, &a, req, want_req, fn);
}

static int rooted(weft_comm_t *c, int kind, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root,
                  weft_request_t **req, int want_req, const char *fn)
{
    int rc = weft_check_rooted(c, kind, sendbuf, recvbuf, bytes_per_rank, root, fn);
    if (rc != WEFT_SUCCESS)
        return refused(c, rc, fn);
    struct weft_coll_args a = { kind, sendbuf, recvbuf, bytes_per_rank, -1, -1, root, NULL, NULL };
    return coll_call(c, &a, req, want_req, fn);
}

static int alltoallv(weft_comm_t *c, const void *sendbuf, const size_t *send_bytes, const size_t *send_displs,
                     void *recvbuf, const size_t *recv_bytes, const size_t *recv_displs, weft_request_t **req,
                     int want_req, const char *fn)
{
    size_t total = 0;
    int rc = weft_check_alltoallv(c, sendbuf, send_bytes, send_displs, recvbuf, recv_bytes, recv_displs, &total, fn);
    if (rc != WEFT_SUCCESS)
        return refused(c, rc, fn);
    /* The arrays are read only while the call starts (its schedule is
     * built from them), so the caller may reuse them once it returned. */
    struct weft_coll_vec v = { send_bytes, send_displs, recv_bytes, recv_displs };
    struct weft_coll_args a = { WEFT_COLL_ALLTOALLV, sendbuf, recvbuf, total, -1, -1, -1, NULL, &v };
    return coll_call(c, &a, req, want_req, fn);
}

/* ---- blocking ---- */

int weft_allgather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank)
{
    return allgather(c, sendbuf, recvbuf, bytes_per_rank, NULL, 0, "weft_allgather");
}

int weft_barrier(weft_comm_t *c)
{
    return barrier(c, NULL, 0, "weft_barrier");
}

int weft_bcast(weft_comm_t *c, void *buf, size_t bytes, int root)
{
    return bcast(c, buf, bytes, root, NULL, 0, "weft_bcast");
}

int weft_allreduce(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype, weft_op_t op)
{
    return reduction(c, WEFT_COLL_ALLREDUCE, sendbuf, recvbuf, count, (int)dtype, (int)op, -1, NULL, 0,
                     "weft_allreduce");
}

int weft_reduce_scatter(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t recvcount, weft_dtype_t dtype,
                        weft_op_t op)
{
    return reduction(c, WEFT_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, (int)dtype, (int)op, -1, NULL, 0,
                     "weft_reduce_scatter");
}

int weft_reduce(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype, weft_op_t op,
                int root)
{
    return reduction(c, WEFT_COLL_REDUCE, sendbuf, recvbuf, count, (int)dtype, (int)op, root, NULL, 0,
                     "weft_reduce");
}

int weft_alltoall(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank)
{
    return alltoall(c, sendbuf, recvbuf, bytes_per_rank, NULL, 0, "weft_alltoall");
}

int weft_gather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root)
{
    return rooted(c, WEFT_COLL_GATHER, sendbuf, recvbuf, bytes_per_rank, root, NULL, 0, "weft_gather");
}

int weft_scatter(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root)
{
    return rooted(c, WEFT_COLL_SCATTER, sendbuf, recvbuf, bytes_per_rank, root, NULL, 0, "weft_scatter");
}

int weft_alltoallv(weft_comm_t *c, const void *sendbuf, const size_t *send_bytes, const size_t *send_displs,
                   void *recvbuf, const size_t *recv_bytes, const size_t *recv_displs)
{
    return alltoallv(c, sendbuf, send_bytes, send_displs, recvbuf, recv_bytes, recv_displs, NULL, 0,
                     "weft_alltoallv");
}

/* ---- non-blocking ---- */

int weft_iallgather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, weft_request_t **req)
{
    return allgather(c, sendbuf, recvbuf, bytes_per_rank, req, 1, "weft_iallgather");
}

int weft_ibarrier(weft_comm_t *c, weft_request_t **req)
{
    return barrier(c, req, 1, "weft_ibarrier");
}

int weft_ibcast(weft_comm_t *c, void *buf, size_t bytes, int root, weft_request_t **req)
{
    return bcast(c, buf, bytes, root, req, 1, "weft_ibcast");
}

int weft_iallreduce(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                    weft_op_t op, weft_request_t **req)
{
    return reduction(c, WEFT_COLL_ALLREDUCE, sendbuf, recvbuf, count, (int)dtype, (int)op, -1, req, 1,
                     "weft_iallreduce");
}

int weft_ireduce_scatter(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t recvcount, weft_dtype_t dtype,
                         weft_op_t op, weft_request_t **req)
{
    return reduction(c, WEFT_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, (int)dtype, (int)op, -1, req, 1,
                     "weft_ireduce_scatter");
}

int weft_ireduce(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype, weft_op_t op,
                 int root, weft_request_t **req)
{
    return reduction(c, WEFT_COLL_REDUCE, sendbuf, recvbuf, count, (int)dtype, (int)op, root, req, 1,
                     "weft_ireduce");
}

int weft_ialltoall(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, weft_request_t **req)
{
    return alltoall(c, sendbuf, recvbuf, bytes_per_rank, req, 1, "weft_ialltoall");
}

int weft_igather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root,
                 weft_request_t **req)
{
    return rooted(c, WEFT_COLL_GATHER, sendbuf, recvbuf, bytes_per_rank, root, req, 1, "weft_igather");
}

int weft_iscatter(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root,
                  weft_request_t **req)
{
    return rooted(c, WEFT_COLL_SCATTER, sendbuf, recvbuf, bytes_per_rank, root, req, 1, "weft_iscatter");
}

int weft_ialltoallv(weft_comm_t *c, const void *sendbuf, const size_t *send_bytes, const size_t *send_displs,
                    void *recvbuf, const size_t *recv_bytes, const size_t *recv_displs, weft_request_t **req)
{
    return alltoallv(c, sendbuf, send_bytes, send_displs, recvbuf, recv_bytes, recv_displs, req, 1,
                     "weft_ialltoallv");
}
