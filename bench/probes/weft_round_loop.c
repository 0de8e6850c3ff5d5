/*
 * weft_round_loop: weft's barrier and 8-byte allreduce alone in a loop --
 * no MPI call between them, as round_probe.c runs its rounds -- so that
 * weft's time per call can be set beside the machine's floor of one round
 * (weft-perf alternates weft and MPI in batches, and the machine's phase
 * moves between batches). MPI only starts the ranks and makes the comm.
 * Prints from rank 0: "barrier X us" and "allreduce8 Y us" (median of 9
 * batches). Standalone (scripts/perf/round_floor.sh builds it):
 *
 *   mpicc -O2 -Iinclude bench/probes/weft_round_loop.c -o weft_round_loop \
 *       -Lbuild-test -lweft -Wl,-rpath,$PWD/build-test
 *   mpirun -np 4 --oversubscribe --bind-to none ./weft_round_loop
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "weft.h"

#define BATCHES 9

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median time of one call over BATCHES batches of n; -1 on a failure. */
static double measure(weft_comm_t *c, int allreduce, int n)
{
    double t[BATCHES];
    float in[2] = { 1.0f, 2.0f }, out[2];
    for (int b = -1; b < BATCHES; b++) {   /* b = -1: warm-up */
        double t0 = now_us();
        for (int i = 0; i < n; i++) {
            int rc = allreduce ? weft_allreduce(c, in, out, 2, WEFT_FLOAT32, WEFT_SUM) : weft_barrier(c);
            if (rc != WEFT_SUCCESS) {
                fprintf(stderr, "weft_round_loop: %s\n", weft_comm_last_error(c));
                return -1.0;
            }
        }
        if (b >= 0)
            t[b] = (now_us() - t0) / n;
    }
    qsort(t, BATCHES, sizeof t[0], cmp);
    return t[BATCHES / 2];
}

int main(int argc, char **argv)
{
    int rank, size;
    weft_comm_t *c;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (weft_comm_create(MPI_COMM_WORLD, &c) != WEFT_SUCCESS) {
        fprintf(stderr, "weft_round_loop: weft_comm_create failed\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* A batch of about 20 ms at the floor of the rank count. */
    int n = argc > 1 ? atoi(argv[1]) : (size <= 2 ? 50000 : 20000 / size);
    double bar = measure(c, 0, n), red = measure(c, 1, n);
    if (rank == 0)
        printf("barrier %.3f us\nallreduce8 %.3f us\n", bar, red);
    weft_comm_destroy(c);
    MPI_Finalize();
    return bar < 0 || red < 0;
}
