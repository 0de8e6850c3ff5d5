/*
 * node_large_ab: node-local reductions and allgathers above 64 KiB a rank
 * through the large segment (WEFT_NODE_COLL_LARGE_KB, the default) against
 * the same calls as messages (a second comm with WEFT_NODE_COLL_LARGE_KB=0),
 * and Open MPI's, in one job: every repetition runs the three one after
 * the other, so the machine's slow phases (which move separate jobs 2-4x
 * on the 2-core VM) hit all three alike, in an order that rotates from
 * one repetition to the next (the first call after another library's
 * took up to 2.8x longer than the same call second, in slow phases).
 *
 *   mpicc -O2 -Iinclude bench/probes/node_large_ab.c -Lbuild-test -lweft \
 *         -Wl,-rpath,$PWD/build-test -o node_large_ab
 *   mpirun -np 4 --oversubscribe --bind-to none ./node_large_ab [REPS]
 *
 * Each call is started by an MPI_Barrier and timed as the slowest rank's;
 * medians of REPS (default 15). Sizes 128 KiB to 2 MiB: the vector of
 * allreduce, reduce (root 0) and reduce_scatter (a rank's block is
 * size / ranks), a rank's block of allgather; float32 sum.
 * docs/benchmarks.md, "Node-local reductions up to 1 MiB", has what it
 * showed.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "weft.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

enum { AR, RED, RS, AG, KINDS };
static const char *kind_name[KINDS] = { "allreduce", "reduce", "reduce_scatter", "allgather" };

static int weft_call(weft_comm_t *c, int kind, const float *in, float *out, size_t n, int size)
{
    switch (kind) {
    case AR: return weft_allreduce(c, in, out, n / 4, WEFT_FLOAT32, WEFT_SUM);
    case RED: return weft_reduce(c, in, out, n / 4, WEFT_FLOAT32, WEFT_SUM, 0);
    case RS: return weft_reduce_scatter(c, in, out, n / 4 / (size_t)size, WEFT_FLOAT32, WEFT_SUM);
    default: return weft_allgather(c, in, out, n);
    }
}

static void mpi_call(int kind, const float *in, float *out, size_t n, int size)
{
    switch (kind) {
    case AR: MPI_Allreduce(in, out, (int)(n / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case RED: MPI_Reduce(in, out, (int)(n / 4), MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD); break;
    case RS: MPI_Reduce_scatter_block(in, out, (int)(n / 4 / (size_t)size), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    default: MPI_Allgather(in, (int)n, MPI_BYTE, out, (int)n, MPI_BYTE, MPI_COMM_WORLD); break;
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    if (reps < 1)
        MPI_Abort(MPI_COMM_WORLD, 2);
    weft_setting_t off_s[] = { { "WEFT_NODE_COLL_LARGE_KB", "0" } };
    weft_config_t off_cfg = WEFT_CONFIG_INITIALIZER;
    off_cfg.settings = off_s;
    off_cfg.nsettings = 1;
    weft_comm_t *on = NULL, *off = NULL;
    if (weft_comm_create(MPI_COMM_WORLD, &on) != WEFT_SUCCESS ||
        weft_comm_create_config(MPI_COMM_WORLD, &off_cfg, &off) != WEFT_SUCCESS) {
        fprintf(stderr, "rank %d: weft_comm_create: %s\n", rank, weft_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const size_t max_n = (size_t)2 << 20;
    float *in = malloc(max_n), *out = malloc(max_n * (size_t)size);
    double *t[3];
    for (int s = 0; s < 3; s++)
        t[s] = malloc(sizeof(double) * (size_t)reps);
    if (!in || !out || !t[0] || !t[1] || !t[2])
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t i = 0; i < max_n / 4; i++)
        in[i] = (float)(i % 13);
    memset(out, 0, max_n * (size_t)size);
    if (rank == 0)
        printf("# np %d, float32 sum, medians of %d; us; large = through the large segment (default), "
               "msgs = WEFT_NODE_COLL_LARGE_KB=0\n# kind bytes large msgs mpi msgs/large mpi/large\n",
               size, reps);
    for (int kind = 0; kind < KINDS; kind++)
        for (size_t n = (size_t)128 << 10; n <= max_n; n *= 2) {
            for (int r = -2; r < reps; r++) {
                double x[3];
                for (int i = 0; i < 3; i++) {
                    const int s = (i + r + 3) % 3;   /* rotated: no series always first */
                    MPI_Barrier(MPI_COMM_WORLD);
                    double t0 = now_us();
                    if (s == 2)
                        mpi_call(kind, in, out, n, size);
                    else if (weft_call(s == 0 ? on : off, kind, in, out, n, size) != WEFT_SUCCESS) {
                        fprintf(stderr, "rank %d: %s: %s\n", rank, kind_name[kind],
                                weft_comm_last_error(s == 0 ? on : off));
                        MPI_Abort(MPI_COMM_WORLD, 1);
                    }
                    double d = now_us() - t0;
                    MPI_Allreduce(&d, &x[s], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                }
                if (r >= 0)
                    for (int s = 0; s < 3; s++)
                        t[s][r] = x[s];
            }
            double l = median(t[0], reps), m = median(t[1], reps), p = median(t[2], reps);
            if (rank == 0)
                printf("%s %zu %.1f %.1f %.1f %.2f %.2f\n", kind_name[kind], n, l, m, p, m / l, p / l);
            fflush(stdout);
        }
    weft_comm_destroy(on);
    weft_comm_destroy(off);
    free(in);
    free(out);
    for (int s = 0; s < 3; s++)
        free(t[s]);
    MPI_Finalize();
    return 0;
}
