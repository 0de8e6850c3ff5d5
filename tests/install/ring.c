/* The example of README.md, verbatim: built and run (mpirun -np 2) by the
 * install_consumer test so the README cannot drift from the real API. */
#include <mpi.h>
#include <weft.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    weft_comm_t *c;
    weft_comm_create(MPI_COMM_WORLD, &c);           /* collective */
    int me = weft_comm_rank(c), n = weft_comm_size(c);
    double mine = me, from_left, sum, all[256];     /* up to 256 ranks */
    weft_request_t *r[2];
    weft_irecv(c, &from_left, sizeof from_left, (me + n - 1) % n, 0, &r[0]);
    weft_isend(c, &mine, sizeof mine, (me + 1) % n, 0, &r[1]);
    weft_waitall(2, r, NULL);                       /* from_left == left neighbour's rank */
    weft_allgather(c, &mine, all, sizeof mine);     /* all[k] == k on every rank */
    weft_allreduce(c, &mine, &sum, 1, WEFT_FLOAT64, WEFT_SUM);  /* n(n-1)/2 everywhere */
    weft_comm_destroy(c);                           /* collective */
    MPI_Finalize();
    return 0;
}
