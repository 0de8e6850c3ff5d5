/*
 * weft_comm_split: argument checks, then src/comm/ (weft_comm_split_all).
 */
#include "check.h"
#include "comm.h"
#include "log.h"
#include "weft.h"

int weft_comm_split(weft_comm_t *comm, int color, int key, weft_comm_t **newcomm)
{
    static const char fn[] = "weft_comm_split";
    int rc;

    if (comm == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    /* Refused on this rank only: the others enter the split and fail
     * there within WEFT_TIMEOUT, as for any collective one rank skips. */
    if (newcomm == NULL)
        rc = weft_set_error(&comm->core, WEFT_ERR_INVALID_ARG, "%s: the newcomm output pointer is NULL", fn);
    else
        rc = weft_check_live(comm, fn);
    if (rc != WEFT_SUCCESS) {
        /* As every failed split: the parent's last error and this thread's. */
        weft_error_keep(&comm->core, fn, rc);
        return rc;
    }
    return weft_comm_split_all(comm, color, key, newcomm);
}
