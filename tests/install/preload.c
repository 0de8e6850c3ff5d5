/* A plain MPI program, no weft in it: the install check runs it with the
 * installed PMPI drop-in preloaded, as docs/mpi.md says
 * (mpirun -x LD_PRELOAD=<prefix>/lib/libweft_mpi.so ./app), with no
 * LD_LIBRARY_PATH: the drop-in must find libweft.so.0 by itself. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size, one = 1, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (sum != size) {
        fprintf(stderr, "rank %d: MPI_Allreduce gave %d, expected %d\n", rank, sum, size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        printf("preload probe: MPI_Allreduce over %d ranks right\n", size);
    MPI_Finalize();
    return 0;
}
