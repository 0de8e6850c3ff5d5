/*
 * The public comm calls: create, init (unique id) and destroy (src/comm/),
 * rank, size, and the error strings.
 */
#include <stddef.h>
#include <string.h>

#include "bootstrap_uid.h"
#include "check.h"
#include "comm.h"
#include "journal.h"
#include "log.h"
#include "p2p.h"

/* config's settings, checked and copied (*out NULL for none); the error
 * names the call and the entry. */
int weft_check_config(const char *fn, int rank, const weft_config_t *config, struct weft_settings **out)
{
    enum { MAX_SETTINGS = 1024 };
    const char *names[MAX_SETTINGS], *values[MAX_SETTINGS];
    char why[300];
    int rc;

    *out = NULL;
    if (config == NULL)
        return WEFT_SUCCESS;
    if (config->magic != WEFT_CONFIG_MAGIC || config->size < offsetof(weft_config_t, nsettings) + sizeof(size_t))
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: rank %d: config (magic 0x%x, size %zu) was not set up "
                              "with WEFT_CONFIG_INITIALIZER", fn, rank, config->magic, config->size);
    if (config->version < 1 || config->version > WEFT_CONFIG_VERSION)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: rank %d: config version %u: this weft knows versions "
                              "1 to %d", fn, rank, config->version, WEFT_CONFIG_VERSION);
    if (config->nsettings > 0 && config->settings == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: rank %d: config has %zu settings but settings is NULL",
                              fn, rank, config->nsettings);
    if (config->nsettings > MAX_SETTINGS)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: rank %d: config has %zu settings; at most %d (one per "
                              "variable)", fn, rank, config->nsettings, (int)MAX_SETTINGS);
    for (size_t i = 0; i < config->nsettings; i++) {
        names[i] = config->settings[i].name;
        values[i] = config->settings[i].value;
    }
    rc = weft_settings_make(names, values, config->nsettings, out, why, sizeof(why));
    if (rc != WEFT_SUCCESS)
        return weft_set_error(NULL, rc, "%s: rank %d: config.%s", fn, rank, why);
    return WEFT_SUCCESS;
}

static int comm_create(const char *fn, weft_mpi_comm_t mpi_comm, const weft_config_t *config, weft_comm_t **out)
{
    struct weft_settings *settings;
    int rc;

    if (out == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm output pointer is NULL", fn);
    if ((rc = weft_check_config(fn, -1, config, &settings)) != WEFT_SUCCESS)
        return rc;
    rc = weft_comm_create_mpi(mpi_comm, settings, out);
    weft_settings_free(settings);
    return rc;
}

int weft_comm_create(weft_mpi_comm_t mpi_comm, weft_comm_t **out)
{
    return comm_create("weft_comm_create", mpi_comm, NULL, out);
}

int weft_comm_create_config(weft_mpi_comm_t mpi_comm, const weft_config_t *config, weft_comm_t **out)
{
    return comm_create("weft_comm_create_config", mpi_comm, config, out);
}

static int get_unique_id(const char *fn, weft_unique_id_t *id, const weft_config_t *config)
{
    struct weft_settings *settings;
    int rc;

    if (id == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: id is NULL", fn);
    if ((rc = weft_check_config(fn, -1, config, &settings)) != WEFT_SUCCESS)
        return rc;
    rc = weft_uid_make(id, settings);
    weft_settings_free(settings);
    return rc;
}

int weft_get_unique_id(weft_unique_id_t *id)
{
    return get_unique_id("weft_get_unique_id", id, NULL);
}

int weft_get_unique_id_config(weft_unique_id_t *id, const weft_config_t *config)
{
    return get_unique_id("weft_get_unique_id_config", id, config);
}

static int comm_init(const char *fn, const weft_unique_id_t *id, int nranks, int rank, const weft_config_t *config,
                     weft_comm_t **out)
{
    struct weft_settings *settings;
    char why[160];
    int rc;

    if (id == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: rank %d: id is NULL", fn, rank);
    if (out == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: rank %d: comm output pointer is NULL", fn, rank);
    if (nranks < 1)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: nranks is %d; at least 1", fn, nranks);
    if (rank < 0 || rank >= nranks)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: rank %d is out of range for nranks %d", fn, rank,
                              nranks);
    if (weft_uid_check(id, why, sizeof(why)) != WEFT_SUCCESS)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: rank %d: %s", fn, rank, why);
    if ((rc = weft_check_config(fn, rank, config, &settings)) != WEFT_SUCCESS)
        return rc;
    rc = weft_comm_init_uid(id, nranks, rank, settings, out);
    weft_settings_free(settings);
    return rc;
}

int weft_comm_init(const weft_unique_id_t *id, int nranks, int rank, weft_comm_t **out)
{
    return comm_init("weft_comm_init", id, nranks, rank, NULL, out);
}

int weft_comm_init_config(const weft_unique_id_t *id, int nranks, int rank, const weft_config_t *config,
                          weft_comm_t **out)
{
    return comm_init("weft_comm_init_config", id, nranks, rank, config, out);
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

int weft_comm_revoke(weft_comm_t *c)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_revoke: comm is NULL");
    if (__atomic_load_n(&c->core.aborted, __ATOMIC_ACQUIRE))
        return weft_check_aborted_fail(c, "weft_comm_revoke");
    weft_p2p_revoke(c->p2p);
    return WEFT_SUCCESS;
}

static int comm_shrink(const char *fn, weft_comm_t *c, const int *exclude, int nexclude, weft_comm_t **newcomm)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    /* Refused on this rank alone: the others leave it out as they would a
     * rank that never calls (within WEFT_TIMEOUT). */
    if (newcomm == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: the newcomm output pointer is NULL", fn);
    if (nexclude < 0 || (nexclude > 0 && exclude == NULL))
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: %d excluded ranks in %s", fn, nexclude,
                              exclude == NULL ? "a NULL list" : "a list");
    for (int i = 0; i < nexclude; i++)
        if (exclude[i] < 0 || exclude[i] >= c->core.size || exclude[i] == c->core.rank)
            return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: exclude[%d] = %d is %s", fn, i, exclude[i],
                                  exclude[i] == c->core.rank ? "this rank itself (a rank leaves by not calling)"
                                                             : "not a rank of the comm");
    if (__atomic_load_n(&c->core.aborted, __ATOMIC_ACQUIRE))
        return weft_check_aborted_fail(c, fn);
    return weft_comm_shrink_all(c, exclude, nexclude, newcomm);
}

int weft_comm_shrink(weft_comm_t *c, weft_comm_t **newcomm)
{
    return comm_shrink("weft_comm_shrink", c, NULL, 0, newcomm);
}

int weft_comm_shrink_excluding(weft_comm_t *c, const int *exclude, int nexclude, weft_comm_t **newcomm)
{
    return comm_shrink("weft_comm_shrink_excluding", c, exclude, nexclude, newcomm);
}

int weft_comm_dump(weft_comm_t *c)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_dump: comm is NULL");
    return weft_journal_write(&c->coll, "weft_comm_dump", 1);
}

int weft_comm_set_wait_hook(weft_comm_t *c, weft_wait_hook_t hook, void *arg)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_set_wait_hook: comm is NULL");
    return weft_p2p_set_wait_hook(c->p2p, hook, arg);
}

int weft_comm_rank(const weft_comm_t *c) { return c ? c->core.rank : -1; }
int weft_comm_size(const weft_comm_t *c) { return c ? c->core.size : -1; }

int weft_comm_node_coll_bytes(const weft_comm_t *c, size_t *bytes)
{
    if (c == NULL || bytes == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_node_coll_bytes: %s is NULL",
                              c == NULL ? "comm" : "bytes");
    *bytes = weft_coll_node_bytes(&c->coll);
    return WEFT_SUCCESS;
}

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
    static _Thread_local char copy[1024];
    struct weft_error e;

    if (c == NULL)
        return "weft_comm_last_error: comm is NULL";
    /* The one place a comm's error becomes its line. */
    weft_error_get((struct weft_core *)&c->core, &e);
    weft_error_format(&e, 1, copy, sizeof(copy));
    return copy;
}
