/*
 * The public comm calls: create and destroy (src/comm/), rank, size, and
 * the error strings.
 */
#include <string.h>

#include "comm.h"
#include "log.h"

int weft_comm_create(weft_mpi_comm_t mpi_comm, weft_comm_t **out)
{
    if (out == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_create: comm output pointer is NULL");
    return weft_comm_create_mpi(mpi_comm, out);
}

int weft_comm_destroy(weft_comm_t *c)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_destroy: comm is NULL");
    return weft_comm_destroy_all(c);
}

int weft_comm_abort(weft_comm_t *c)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_abort: comm is NULL");
    return weft_comm_abort_all(c);
}

int weft_comm_rank(const weft_comm_t *c) { return c ? c->core.rank : -1; }
int weft_comm_size(const weft_comm_t *c) { return c ? c->core.size : -1; }

const char *weft_strerror(int err)
{
    return weft_err_str(err);
}

const char *weft_comm_last_error(const weft_comm_t *c)
{
    static _Thread_local char copy[sizeof(((struct weft_core *)0)->last_error)];
    struct weft_core *core;

    if (c == NULL)
        return "weft_comm_last_error: comm is NULL";
    core = (struct weft_core *)&c->core;
    pthread_mutex_lock(&core->err_lock);
    memcpy(copy, core->last_error, sizeof(copy));
    pthread_mutex_unlock(&core->err_lock);
    return copy;
}
