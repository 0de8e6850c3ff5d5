/*
 * weft_comm_split and weft_comm_split_config: argument checks, then
 * src/comm/ (weft_comm_split_all).
 */
#include "check.h"
#include "coll.h"
#include "comm.h"
#include "log.h"
#include "weft.h"

static int comm_split(const char *fn, weft_comm_t *comm, int color, int key, const weft_config_t *config,
                      weft_comm_t **newcomm)
{
    struct weft_settings *settings = NULL;
    int rc;

    if (comm == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    /* Refused on this rank's own arguments (no newcomm, a bad config) on a
     * comm that works: the split's exchange is a collective of the parent,
     * so the refusal takes its number there and the others are told
     * (weft_coll_refused): theirs fails at once naming this rank, and the
     * parent's collectives stay in step. */
    int own_args = 0;
    if (newcomm == NULL) {
        rc = weft_set_error(&comm->core, WEFT_ERR_INVALID_ARG, "%s: the newcomm output pointer is NULL", fn);
        own_args = 1;
    } else {
        rc = weft_check_live(comm, fn);
    }
    if (rc == WEFT_SUCCESS && weft_check_config(fn, comm->core.rank, config, &settings) != WEFT_SUCCESS) {
        struct weft_error e;
        weft_error_thread_get(&e);
        weft_error_put(&comm->core, &e);
        rc = e.code;
        own_args = 1;
    }
    if (rc != WEFT_SUCCESS) {
        if (own_args && !__atomic_load_n(&comm->core.aborted, __ATOMIC_ACQUIRE) &&
            !__atomic_load_n(&comm->core.revoked, __ATOMIC_ACQUIRE))
            weft_coll_refused(&comm->coll, fn);
        /* As every failed split: the parent's last error and this thread's. */
        weft_error_keep(&comm->core, fn, rc);
        return rc;
    }
    rc = weft_comm_split_all(comm, color, key, settings, newcomm);
    weft_settings_free(settings);
    return rc;
}

int weft_comm_split(weft_comm_t *comm, int color, int key, weft_comm_t **newcomm)
{
    return comm_split("weft_comm_split", comm, color, key, NULL, newcomm);
}

int weft_comm_split_config(weft_comm_t *comm, int color, int key, const weft_config_t *config, weft_comm_t **newcomm)
{
    return comm_split("weft_comm_split_config", comm, color, key, config, newcomm);
}
