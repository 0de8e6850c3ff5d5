/*
 * Instructions per 8-byte isend + irecv + wait + wait to self, the small-
 * message path's cost (issue notes compare builds with it). Not built by
 * CMake; against an installed or built weft:
 *   mpicc -O2 -I include scripts/perf/self_pair.c -o self_pair -L build -lweft -Wl,-rpath,$PWD/build
 *   WEFT_TRANSPORTS=self valgrind --tool=callgrind ./self_pair 1000     (and 11000)
 * per pair = (Ir at 11000 - Ir at 1000) / 10000, which cancels start-up.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "weft.h"
int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 1000;
    MPI_Init(&argc, &argv);
    weft_comm_t *c;
    if (weft_comm_create(MPI_COMM_SELF, &c) != WEFT_SUCCESS) return 1;
    char s[8] = "abcdefg", r[8];
    for (int i = 0; i < iters; i++) {
        weft_request_t *rq, *sq;
        weft_irecv(c, r, 8, 0, 1, &rq);
        weft_isend(c, s, 8, 0, 1, &sq);
        weft_wait(sq, NULL);
        weft_wait(rq, NULL);
    }
    weft_comm_destroy(c);
    MPI_Finalize();
    return 0;
}
