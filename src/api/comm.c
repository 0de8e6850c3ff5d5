/*
 * The public comm calls: create, init (unique id) and destroy (src/comm/),
 * rank, size, and the error strings.
 */
#include <string.h>

#include "bootstrap_uid.h"
#include "comm.h"
#include "log.h"
#include "p2p.h"

int weft_comm_create(weft_mpi_comm_t mpi_comm, weft_comm_t **out)
{
    if (out == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_create: comm output pointer is NULL");
    return weft_comm_create_mpi(mpi_comm, out);
}

int weft_get_unique_id(weft_unique_id_t *id)
{
    if (id == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_get_unique_id: id is NULL");
    return weft_uid_make(id);
}

int weft_comm_init(const weft_unique_id_t *id, int nranks, int rank, weft_comm_t **out)
{
    char why[160];

    if (id == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_init: rank %d: id is NULL", rank);
    if (out == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_init: rank %d: comm output pointer is NULL",
                              rank);
    if (nranks < 1)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_init: nranks is %d; at least 1", nranks);
    if (rank < 0 || rank >= nranks)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_init: rank %d is out of range for nranks %d",
                              rank, nranks);
    if (weft_uid_check(id, why, sizeof(why)) != WEFT_SUCCESS)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_init: rank %d: %s", rank, why);
    return weft_comm_init_uid(id, nranks, rank, out);
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

int weft_comm_set_wait_hook(weft_comm_t *c, weft_wait_hook_t hook, void *arg)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_set_wait_hook: comm is NULL");
    weft_p2p_set_wait_hook(c->p2p, hook, arg);
    return WEFT_SUCCESS;
}

int weft_comm_rank(const weft_comm_t *c) { return c ? c->core.rank : -1; }
int weft_comm_size(const weft_comm_t *c) { return c ? c->core.size : -1; }

const char *weft_strerror(int err)
{
    return weft_err_str(err);
}

/* The last error of this thread's calls that had no comm to keep it
 * (log.c); a later success does not clear it, like errno. */
const char *weft_last_error(void)
{
    return weft_error_thread();
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
