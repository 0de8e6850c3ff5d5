/*
 * node_large_ab: node-local calls above 64 KiB a rank through the large
 * segment (WEFT_NODE_COLL_LARGE_KB, the default) against the same calls as
 * messages (a second comm with WEFT_NODE_COLL_LARGE_KB=0), and Open
 * MPI's, in one job: every repetition runs the three one after the other,
 * so the machine's slow phases (which move separate jobs 2-4x on the
 * 2-core VM) hit all three alike, each repetition in another of the six
 * orders (a call right after another library's is slower; until
 * 2026-12-02 the order rotated, which put the first series after Open
 * MPI's in two repetitions of three and made it up to 2x slower than the
 * same calls on the second comm).
 *
 *   mpicc -O2 -Iinclude bench/probes/node_large_ab.c -Lbuild-test -lweft \
 *         -Wl,-rpath,$PWD/build-test -o node_large_ab
 *   mpirun -np 4 --oversubscribe --bind-to none ./node_large_ab [REPS [KINDS [MIN [MAX]]]]
 *
 * Each call is started by an MPI_Barrier and timed as the slowest rank's;
 * medians of REPS (default 18; a multiple of 6 keeps the orders even).
 * KINDS: a comma list of allreduce, reduce, reduce_scatter, allgather,
 * scatter, gather, alltoall (default the first four). Sizes MIN to MAX
 * bytes, doubling (default 128 KiB to 2 MiB): the vector of allreduce,
 * reduce (root 0) and reduce_scatter (a rank's block is size / ranks), a
 * rank's block of allgather, scatter and gather (root 0), an alltoall's
 * whole buffer a rank (a block is size / ranks); float32 sum.
 * NLAB_DIRTY=1 in the environment: every rank rewrites its input before
 * each call (as an application's is), so no library reads lines both
 * cores already hold.
 * docs/benchmarks.md, "Node-local reductions up to 1 MiB" and "Streaming
 * stores into the segment", has what it showed.
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

enum { AR, RED, RS, AG, SC, GA, A2A, KINDS };
static const char *kind_name[KINDS] = { "allreduce", "reduce", "reduce_scatter", "allgather",
                                        "scatter", "gather", "alltoall" };

static int weft_call(weft_comm_t *c, int kind, const float *in, float *out, size_t n, int size)
{
    switch (kind) {
    case AR: return weft_allreduce(c, in, out, n / 4, WEFT_FLOAT32, WEFT_SUM);
    case RED: return weft_reduce(c, in, out, n / 4, WEFT_FLOAT32, WEFT_SUM, 0);
    case RS: return weft_reduce_scatter(c, in, out, n / 4 / (size_t)size, WEFT_FLOAT32, WEFT_SUM);
    case AG: return weft_allgather(c, in, out, n);
    case SC: return weft_scatter(c, in, out, n, 0);
    case GA: return weft_gather(c, in, out, n, 0);
    default: return weft_alltoall(c, in, out, n / (size_t)size);
    }
}

static void mpi_call(int kind, const float *in, float *out, size_t n, int size)
{
    switch (kind) {
    case AR: MPI_Allreduce(in, out, (int)(n / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case RED: MPI_Reduce(in, out, (int)(n / 4), MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD); break;
    case RS: MPI_Reduce_scatter_block(in, out, (int)(n / 4 / (size_t)size), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case AG: MPI_Allgather(in, (int)n, MPI_BYTE, out, (int)n, MPI_BYTE, MPI_COMM_WORLD); break;
    case SC: MPI_Scatter(in, (int)n, MPI_BYTE, out, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD); break;
    case GA: MPI_Gather(in, (int)n, MPI_BYTE, out, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD); break;
    default:
        MPI_Alltoall(in, (int)(n / (size_t)size), MPI_BYTE, out, (int)(n / (size_t)size), MPI_BYTE, MPI_COMM_WORLD);
        break;
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int reps = argc > 1 ? atoi(argv[1]) : 18;
    const char *kinds = argc > 2 ? argv[2] : "allreduce,reduce,reduce_scatter,allgather";
    const size_t lo_n = argc > 3 ? strtoull(argv[3], NULL, 0) : (size_t)128 << 10;
    const size_t max_n = argc > 4 ? strtoull(argv[4], NULL, 0) : (size_t)2 << 20;
    const int dirty = getenv("NLAB_DIRTY") != NULL;
    if (reps < 1 || lo_n < 64 || max_n < lo_n || max_n > ((size_t)64 << 20))
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
    /* A scatter's root reads size blocks of n from in. */
    float *in = malloc(max_n * (size_t)size), *out = malloc(max_n * (size_t)size);
    double *t[3];
    for (int s = 0; s < 3; s++)
        t[s] = malloc(sizeof(double) * (size_t)reps);
    if (!in || !out || !t[0] || !t[1] || !t[2])
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t i = 0; i < max_n * (size_t)size / 4; i++)
        in[i] = (float)(i % 13);
    memset(out, 0, max_n * (size_t)size);
    if (rank == 0)
        printf("# np %d, float32 sum, medians of %d; us; large = through the large segment (default), "
               "msgs = WEFT_NODE_COLL_LARGE_KB=0\n# kind bytes large msgs mpi msgs/large mpi/large\n",
               size, reps);
    for (int kind = 0; kind < KINDS; kind++) {
        const char *k = strstr(kinds, kind_name[kind]);
        const size_t kl = strlen(kind_name[kind]);
        while (k && ((k != kinds && k[-1] != ',') || (k[kl] != '\0' && k[kl] != ',')))
            k = strstr(k + 1, kind_name[kind]);
        if (!k)
            continue;
        for (size_t n = lo_n; n <= max_n; n *= 2) {
            for (int r = -2; r < reps; r++) {
                double x[3];
                /* Every order of the three in turn: each series comes
                 * first, and after each of the others, equally often (a
                 * call right after another library's is slower; a
                 * rotation would put one series after Open MPI's in two
                 * repetitions of three). */
                static const int order[6][3] = { { 0, 1, 2 }, { 0, 2, 1 }, { 1, 0, 2 },
                                                 { 1, 2, 0 }, { 2, 0, 1 }, { 2, 1, 0 } };
                for (int i = 0; i < 3; i++) {
                    const int s = order[(r + 6) % 6][i];
                    if (dirty)   /* the input just written, as an application's usually is */
                        memset(in, r & 0x7f, kind == SC ? n * (size_t)size : n);
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
