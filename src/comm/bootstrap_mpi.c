/*
 * The MPI bootstrap: the only code of the library that calls MPI. The
 * user's communicator is duplicated, so weft's set-up traffic never mixes
 * with the application's own messages, and the duplicate is freed at destroy.
 * Every call goes to the profiling name (PMPI_*): a PMPI layer that serves
 * MPI collectives with weft (adapters/mpi/) must not see -- or recurse
 * into -- weft's own MPI calls. The duplicate returns its errors (weft turns
 * them into its own, naming the call) instead of aborting the job.
 */
#include <stdlib.h>

#include "bootstrap.h"
#include "bootstrap_mpi.h"
#include "core.h"
#include "log.h"

struct boot_mpi {
    struct weft_bootstrap b;
    MPI_Comm              comm;
};

/* MPI failure -> weft error naming the call. */
static int mpi_check(struct weft_core *core, int mrc, const char *call)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (mrc == MPI_SUCCESS)
        return WEFT_SUCCESS;
    PMPI_Error_string(mrc, s, &len);
    return weft_set_error(core, WEFT_ERR_MPI, "%s failed: %s", call, s);
}

static int mpi_allgather(struct weft_bootstrap *b, const void *mine, void *all, size_t bytes)
{
    struct boot_mpi *m = (struct boot_mpi *)b;
    return mpi_check(b->core, PMPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, m->comm),
                     "MPI_Allgather(rank cards)");
}

static int mpi_alltoall(struct weft_bootstrap *b, const void *send, void *recv, size_t bytes)
{
    struct boot_mpi *m = (struct boot_mpi *)b;
    return mpi_check(b->core, PMPI_Alltoall(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, m->comm),
                     "MPI_Alltoall");
}

/* Non-blocking, so that a rank which dies meanwhile (seen by weft's health
 * checks, which give_up runs) does not hold destroy forever: MPI's own
 * barrier would wait for it. A request given up on is left to MPI: a
 * non-blocking collective's request may be neither freed nor cancelled, and
 * this rank's part of it is done. */
static int mpi_barrier(struct weft_bootstrap *b, int (*give_up)(void *arg), void *arg)
{
    struct boot_mpi *m = (struct boot_mpi *)b;
    MPI_Request req;
    int done = 0, rc = mpi_check(b->core, PMPI_Ibarrier(m->comm, &req), "MPI_Ibarrier(destroy)");

    while (rc == WEFT_SUCCESS) {
        rc = mpi_check(b->core, PMPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test(destroy's barrier)");
        if (rc != WEFT_SUCCESS || done)
            break;
        rc = give_up ? give_up(arg) : WEFT_SUCCESS;
    }
    return rc;
}

static int mpi_max(struct weft_bootstrap *b, long long *value)
{
    struct boot_mpi *m = (struct boot_mpi *)b;
    long long out = 0;
    if (PMPI_Allreduce(value, &out, 1, MPI_LONG_LONG, MPI_MAX, m->comm) != MPI_SUCCESS)
        return WEFT_ERR_MPI;
    *value = out;
    return WEFT_SUCCESS;
}

static void mpi_destroy(struct weft_bootstrap *b)
{
    struct boot_mpi *m = (struct boot_mpi *)b;
    if (m->comm != MPI_COMM_NULL)
        PMPI_Comm_free(&m->comm);
    free(m);
}

static const struct weft_bootstrap_ops mpi_ops = {
    .name = "mpi",
    .allgather = mpi_allgather,
    .alltoall = mpi_alltoall,
    .barrier = mpi_barrier,
    .max = mpi_max,
    .destroy = mpi_destroy,
};

int weft_bootstrap_mpi_check(weft_mpi_comm_t mpi_comm)
{
    int initialized = 0, finalized = 0;
    PMPI_Initialized(&initialized);
    PMPI_Finalized(&finalized);
    if (!initialized || finalized)
        return weft_set_error(NULL, WEFT_ERR_MPI, "weft_comm_create: MPI is %s",
                              finalized ? "already finalized" : "not initialized");
    if (mpi_comm == MPI_COMM_NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_create: mpi_comm is MPI_COMM_NULL");
    return WEFT_SUCCESS;
}

int weft_bootstrap_mpi_create(weft_mpi_comm_t mpi_comm, struct weft_core *core, struct weft_bootstrap **out)
{
    struct boot_mpi *m = calloc(1, sizeof(*m));
    int rc;

    if (m == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for the bootstrap");
    m->b.ops = &mpi_ops;
    m->b.core = core;
    m->comm = MPI_COMM_NULL;
    rc = mpi_check(core, PMPI_Comm_dup(mpi_comm, &m->comm), "MPI_Comm_dup");
    if (rc != WEFT_SUCCESS) {
        free(m);
        return rc;
    }
    PMPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    PMPI_Comm_rank(m->comm, &m->b.rank);
    PMPI_Comm_size(m->comm, &m->b.size);
    *out = &m->b;
    return WEFT_SUCCESS;
}
