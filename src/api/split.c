/*
 * weft_comm_split and weft_comm_split_config: argument checks, then
 * src/comm/ (weft_comm_split_all).
 */
#include "check.h"
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
    /* Refused on this rank only: the others enter the split and fail
     * there within WEFT_TIMEOUT, as for any collective one rank skips. */
    if (newcomm == NULL)
        rc = weft_set_error(&comm->core, WEFT_ERR_INVALID_ARG, "%s: the newcomm output pointer is NULL", fn);
    else
        rc = weft_check_live(comm, fn);
    if (rc == WEFT_SUCCESS && weft_check_config(fn, comm->core.rank, config, &settings) != WEFT_SUCCESS) {
        struct weft_error e;
        weft_error_thread_get(&e);
        weft_error_put(&comm->core, &e);
        rc = e.code;
    }
    if (rc != WEFT_SUCCESS) {
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
