/*
 * The public collectives: argument checks (check.c), then the collectives
 * layer (collectives/coll.h) on the comm's context.
 */
#include "check.h"
#include "coll.h"
#include "comm.h"
#include "log.h"
#include "weft.h"

int weft_allgather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank)
{
    int rc = weft_check_allgather(c, sendbuf, recvbuf, bytes_per_rank, "weft_allgather");
    if (rc == WEFT_SUCCESS)
        rc = weft_check_live(c, "weft_allgather");
    if (rc != WEFT_SUCCESS)
        return rc;
    return weft_coll_allgather(&c->coll, sendbuf, recvbuf, bytes_per_rank);
}

int weft_barrier(weft_comm_t *c)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_barrier: comm is NULL");
    if (weft_check_live(c, "weft_barrier") != WEFT_SUCCESS)
        return WEFT_ERR_ABORTED;
    return weft_coll_barrier(&c->coll);
}

int weft_bcast(weft_comm_t *c, void *buf, size_t bytes, int root)
{
    int rc = weft_check_bcast(c, buf, bytes, root, "weft_bcast");
    if (rc == WEFT_SUCCESS)
        rc = weft_check_live(c, "weft_bcast");
    if (rc != WEFT_SUCCESS)
        return rc;
    return weft_coll_bcast(&c->coll, buf, bytes, root);
}
