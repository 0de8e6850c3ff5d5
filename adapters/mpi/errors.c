/*
 * Weft's failures, told the MPI way.
 *
 * A program reads MPI errors through its communicator's error handler:
 * MPI_ERRORS_ARE_FATAL (the default) prints the error string and aborts
 * the job; MPI_ERRORS_RETURN hands the code back, and MPI_Error_class /
 * MPI_Error_string say what it was. So weft gets an MPI error class of its
 * own and one error code per WEFT_* code under it; at a failure the code's
 * string is set to weft's text (what failed, on which rank and peer, why)
 * and the communicator's handler is called with the code.
 *
 * The string belongs to the code, not to the call: two threads failing
 * with the same WEFT_* code at once leave the later text on it (both calls
 * still get the right class and code).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "weft_mpi.h"

#define WMPI_NCODES (WEFT_ERR_REVOKED + 1)

static int err_class = MPI_ERR_OTHER;
static int codes[WMPI_NCODES];
static pthread_mutex_t text_lock = PTHREAD_MUTEX_INITIALIZER;

int wmpi_errors_init(void)
{
    char s[128];
    int rc = PMPI_Add_error_class(&err_class);

    if (rc != MPI_SUCCESS)
        return rc;
    PMPI_Add_error_string(err_class, "weft: a collective served by weft (libweft_mpi.so) failed");
    for (int i = 1; i < WMPI_NCODES; i++) {
        if ((rc = PMPI_Add_error_code(err_class, &codes[i])) != MPI_SUCCESS)
            return rc;
        snprintf(s, sizeof(s), "weft: %s", weft_strerror(i));
        PMPI_Add_error_string(codes[i], s);
    }
    return MPI_SUCCESS;
}

int wmpi_error_class(void)
{
    return err_class;
}

int wmpi_raise(MPI_Comm comm, const char *fn, int wrc, weft_comm_t *wc, const char *text)
{
    /* The whole line for stderr; MPI keeps its first MPI_MAX_ERROR_STRING
     * - 1 bytes (Open MPI: 255). */
    char line[2048], s[MPI_MAX_ERROR_STRING];
    int rank = -1, size = -1;
    int code = wrc > 0 && wrc < WMPI_NCODES ? codes[wrc] : codes[WEFT_ERR_INTERNAL];

    PMPI_Comm_rank(comm, &rank);
    PMPI_Comm_size(comm, &size);
    if (text == NULL)
        text = wc ? weft_comm_last_error(wc) : weft_last_error();
    /* The kind of failure comes before weft's detail, which can be long (a
     * peer's state, the other side's call): MPI's copy may end inside the
     * detail, never before the kind. A timeout says why it is most often
     * the drop-in's own doing: a peer whose size fell on the other side of
     * a threshold (its count or type differs from this rank's, which MPI
     * forbids but some MPIs let pass) called MPI instead of weft. */
    snprintf(line, sizeof(line), "weft: %s on rank %d of a communicator of %d ranks failed: %s: %s%s", fn, rank,
             size, weft_strerror(wrc), text && *text ? text : "no detail",
             wrc == WEFT_ERR_TIMEOUT
                 ? "; if the peer is alive, its call may have gone to MPI instead of weft: the drop-in routes each "
                   "call by its size, so every rank must pass the same count and type signature (MPI's rule)"
                 : "");
    size_t n = strlen(line);
    if (n >= sizeof(s))
        n = sizeof(s) - 1;
    memcpy(s, line, n);
    s[n] = '\0';
    pthread_mutex_lock(&text_lock);
    PMPI_Add_error_string(code, s);
    pthread_mutex_unlock(&text_lock);
    /* Open MPI prints the fatal handler's banner (with this text) through
     * mpirun, which now and then loses it as the job is torn down (seen
     * under load, for plain MPI errors too): say it here first, once. */
    MPI_Errhandler eh = MPI_ERRHANDLER_NULL;
    if (PMPI_Comm_get_errhandler(comm, &eh) == MPI_SUCCESS && eh != MPI_ERRHANDLER_NULL) {
        if (eh == MPI_ERRORS_ARE_FATAL)
            fprintf(stderr, "%s\n", line);
        PMPI_Errhandler_free(&eh);
    }
    PMPI_Comm_call_errhandler(comm, code);
    return code;
}
