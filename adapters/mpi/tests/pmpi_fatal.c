/*
 * A weft failure on a communicator whose handler is MPI_ERRORS_ARE_FATAL
 * (MPI_COMM_WORLD's, untouched) must abort the job with weft's text.
 *
 * Every rank passes its own count to MPI_Allgather (64 + 8 x rank bytes,
 * served by weft under WEFT_MPI_MIN_BYTES=0): the ranks' messages meet with
 * the wrong sizes and weft reports WEFT_ERR_MISMATCH (test_pmpi_errors.cc
 * says why this and not a bcast with different roots). The ctest entry
 * passes only if the output has the drop-in's text ("weft: MPI_Allgather
 * on rank ... failed: ... mismatch"), which this program never prints
 * itself; a call that returned, or a job that finished, prints "returned"
 * and exits 0 without it, and a hang runs into the entry's TIMEOUT.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank = 0, size = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        fprintf(stderr, "pmpi_fatal: needs at least 2 ranks\n");
        MPI_Finalize();
        return 1;
    }
    const int bytes = 64 + 8 * rank;
    char *send = calloc((size_t)bytes, 1), *recv = calloc((size_t)bytes * (size_t)size, 1);
    if (send == NULL || recv == NULL)
        MPI_Abort(MPI_COMM_WORLD, 2);
    int rc = MPI_Allgather(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, MPI_COMM_WORLD);
    printf("pmpi_fatal: rank %d: MPI_Allgather returned %d (the job should have been aborted)\n", rank, rc);
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
