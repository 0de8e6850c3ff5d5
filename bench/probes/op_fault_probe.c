/*
 * op_fault_probe: minor page faults a call costs, per rank, for six
 * collectives at 64 KiB-4 MiB on two weft comms of one job and in Open
 * MPI. A call that allocates a large scratch and hands it back to the
 * kernel when it ends faults every page of it in again at the next call;
 * whether glibc hands a freed block back depends on where it lay in the
 * heap, so two comms of one job can differ (docs/benchmarks.md, "A
 * schedule's memory kept by its comm"). Counts, not times: the machine's
 * noise does not move them.
 *
 *   mpicc -O2 -Iinclude bench/probes/op_fault_probe.c -Lbuild-test -lweft \
 *         -Wl,-rpath,$PWD/build-test -o op_fault_probe
 *   WEFT_NODE_COLL_LARGE_KB=0 mpirun -np 4 --oversubscribe --bind-to none \
 *         -x WEFT_NODE_COLL_LARGE_KB ./op_fault_probe [REPS [MAX_MIB]]
 *
 * Each call is preceded by an MPI_Barrier; the first of REPS + 1 (default
 * 6) is not counted (first touch of the comm's rings and segments). Sizes
 * 64 KiB x 4^k up to MAX_MIB (default 4) MiB.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "weft.h"

static long minor_faults(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

enum { AR, RED, RS, AG, BC, A2A, KINDS };
static const char *kind_name[KINDS] = { "allreduce", "reduce", "reduce_scatter", "allgather", "bcast", "alltoall" };

static int weft_call(weft_comm_t *w, int kind, const float *in, float *out, size_t n, int size)
{
    const size_t cnt = n / 4;
    switch (kind) {
    case AR: return weft_allreduce(w, in, out, cnt, WEFT_FLOAT32, WEFT_SUM);
    case RED: return weft_reduce(w, in, out, cnt, WEFT_FLOAT32, WEFT_SUM, 0);
    case RS: return weft_reduce_scatter(w, in, out, cnt / (size_t)size, WEFT_FLOAT32, WEFT_SUM);
    case AG: return weft_allgather(w, in, out, n / (size_t)size);
    case BC: return weft_bcast(w, out, n, 0);
    default: return weft_alltoall(w, in, out, n / (size_t)size);
    }
}

static void mpi_call(int kind, const float *in, float *out, size_t n, int size)
{
    const int cnt = (int)(n / 4), blk = (int)(n / (size_t)size);
    switch (kind) {
    case AR: MPI_Allreduce(in, out, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case RED: MPI_Reduce(in, out, cnt, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD); break;
    case RS: MPI_Reduce_scatter_block(in, out, cnt / size, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case AG: MPI_Allgather(in, blk, MPI_BYTE, out, blk, MPI_BYTE, MPI_COMM_WORLD); break;
    case BC: MPI_Bcast(out, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD); break;
    default: MPI_Alltoall(in, blk, MPI_BYTE, out, blk, MPI_BYTE, MPI_COMM_WORLD); break;
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int reps = argc > 1 ? atoi(argv[1]) : 6;
    if (reps < 1)
        MPI_Abort(MPI_COMM_WORLD, 2);
    weft_comm_t *c[2];
    for (int i = 0; i < 2; i++)
        if (weft_comm_create(MPI_COMM_WORLD, &c[i]) != WEFT_SUCCESS) {
            fprintf(stderr, "rank %d: weft_comm_create: %s\n", rank, weft_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    const size_t max_n = (size_t)(argc > 2 ? atoi(argv[2]) : 4) << 20;
    if (max_n == 0)
        MPI_Abort(MPI_COMM_WORLD, 2);
    float *in = malloc(max_n), *out = malloc(max_n * (size_t)size);
    if (!in || !out)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t i = 0; i < max_n / 4; i++)
        in[i] = 1.0f;
    memset(out, 0, max_n * (size_t)size);
    if (rank == 0)
        printf("# np %d, minor faults a call and rank (mean of %d calls); comm1 and comm2: two weft comms\n"
               "# kind bytes comm1 comm2 mpi\n", size, reps);
    for (int kind = 0; kind < KINDS; kind++)
        for (size_t n = (size_t)64 << 10; n <= max_n; n *= 4) {
            long f[3] = { 0, 0, 0 }, tot[3];
            for (int r = 0; r <= reps; r++)
                for (int s = 0; s < 3; s++) {
                    MPI_Barrier(MPI_COMM_WORLD);
                    long before = minor_faults();
                    if (s == 2)
                        mpi_call(kind, in, out, n, size);
                    else if (weft_call(c[s], kind, in, out, n, size) != WEFT_SUCCESS) {
                        fprintf(stderr, "rank %d: %s: %s\n", rank, kind_name[kind], weft_comm_last_error(c[s]));
                        MPI_Abort(MPI_COMM_WORLD, 1);
                    }
                    if (r > 0)
                        f[s] += minor_faults() - before;
                }
            MPI_Reduce(f, tot, 3, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
            if (rank == 0)
                printf("%s %zu %.1f %.1f %.1f\n", kind_name[kind], n, tot[0] / (double)reps / size,
                       tot[1] / (double)reps / size, tot[2] / (double)reps / size);
        }
    weft_comm_destroy(c[0]);
    weft_comm_destroy(c[1]);
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
