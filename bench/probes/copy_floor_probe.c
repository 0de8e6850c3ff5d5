/*
 * copy_floor_probe: the least time an allreduce or an allgather of one node
 * can take on this machine, beside Open MPI's and weft's in the same job --
 * the question behind issue 29's "allreduce and allgather from 64 KiB:
 * >= 1.3x Open MPI's busbw".
 *
 * Whatever the algorithm, every rank must write its whole result once and
 * every byte of it must be read from somewhere once:
 *
 *   allreduce of n bytes:  each rank writes n, reads >= n   (p ranks: 2pn)
 *   allgather of n a rank: each rank writes pn, reads >= pn (p ranks: 2p^2n)
 *
 * so p processes each doing one memcpy of that many bytes, all at once,
 * their buffers as warm as the collective's, is a floor no algorithm goes
 * under ("local": it leaves out moving lines between cores and the
 * arithmetic, both of which only add). A tighter one counts what must come
 * from other cores: a rank's n bytes of allreduce result depend on every
 * other rank's n bytes, so at least n bytes that another core wrote reach
 * each rank (whether it reads them or they are written to it), and (p-1)n
 * for an allgather ("cross": each rank copies that many bytes, written by
 * its neighbours just before, out of one shared window, all ranks at once).
 * A collective 1.3x faster than MPI's needs MPI time / floor >= 1.3; where
 * that ratio is lower the target is below the machine's copy speed.
 *
 * And beside the floors, the plainest schedule through a shared segment,
 * with nothing of a library around it ("seg"), to show what such an
 * algorithm could reach here: each rank copies its input into its slot,
 * a flag barrier, each rank reduces its 1/p slice of all slots into the
 * segment (allreduce), a flag barrier, each rank copies the whole result
 * (allreduce) or all slots (allgather) out, a flag barrier before the
 * slots are reused.
 *
 * Each repetition runs the five in turn (two floors, seg, MPI, weft), each started
 * by an MPI_Barrier and timed as the slowest rank's; medians of REPS.
 * Standalone (not built by CMake), from the repository root after a build:
 *
 *   mpicc -O3 -Iinclude bench/probes/copy_floor_probe.c -Lbuild-test -lweft \
 *         -Wl,-rpath,$PWD/build-test -o copy_floor_probe
 *   mpirun -np 2 --bind-to none ./copy_floor_probe allreduce [REPS]
 *   mpirun -np 4 --oversubscribe --bind-to none ./copy_floor_probe allgather [REPS]
 *
 * Sizes 64 KiB to 16 MiB (the vector for allreduce, a rank's block for
 * allgather), float32 sum. docs/benchmarks.md, "The copy floor of
 * allreduce and allgather", has what it showed.
 */
#include <mpi.h>
#include <sched.h>
#include <stdatomic.h>
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

/* A counting barrier on one shared line: the n-th call returns when every
 * rank made it. Spins, then yields (ranks may outnumber cores). */
static _Atomic unsigned long *flag_count;
static unsigned long flag_epoch;

static void flag_barrier(int size)
{
    const unsigned long target = ++flag_epoch * (unsigned long)size;
    atomic_fetch_add_explicit(flag_count, 1, memory_order_acq_rel);
    for (int spins = 0; atomic_load_explicit(flag_count, memory_order_acquire) < target; spins++)
        if (spins > 200)
            sched_yield();
}

/* The slowest rank's time of one call. */
static double slowest(double t)
{
    double m;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int gather = argc > 1 && strcmp(argv[1], "allgather") == 0;
    const int reps = argc > 2 ? atoi(argv[2]) : 30;
    if (reps < 1) {
        if (rank == 0)
            fprintf(stderr, "usage: copy_floor_probe allreduce|allgather [REPS >= 1]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    weft_comm_t *c = NULL;
    if (weft_comm_create(MPI_COMM_WORLD, &c) != WEFT_SUCCESS) {
        fprintf(stderr, "rank %d: weft_comm_create: %s\n", rank, weft_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const size_t max_n = (size_t)16 << 20;
    const size_t out_max = gather ? max_n * (size_t)size : max_n;
    char *in = malloc(max_n), *out = malloc(out_max), *copy_in = malloc(out_max);
    double *tf = malloc(sizeof(double) * (size_t)reps), *tm = malloc(sizeof(double) * (size_t)reps),
           *tw = malloc(sizeof(double) * (size_t)reps), *tx = malloc(sizeof(double) * (size_t)reps);
    if (!in || !out || !copy_in || !tf || !tm || !tw || !tx)
        MPI_Abort(MPI_COMM_WORLD, 1);
    /* The shared window of the cross floor: max_n bytes a rank. */
    MPI_Comm node;
    MPI_Win win;
    char *mine;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    /* A rank's part: its slot (max_n), its slice of the reduced result
     * (max_n, used from offset rank x n/p), and on rank 0 the barrier's
     * line. */
    MPI_Win_allocate_shared((MPI_Aint)(2 * max_n + 64), 64, MPI_INFO_NULL, node, &mine, &win);
    char **theirs = malloc(sizeof(char *) * (size_t)size);
    for (int i = 0; i < size; i++) {
        MPI_Aint sz;
        int disp;
        MPI_Win_shared_query(win, i, &sz, &disp, &theirs[i]);
    }
    flag_count = (_Atomic unsigned long *)(void *)(theirs[0] + 2 * max_n);
    if (rank == 0)
        atomic_store(flag_count, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    double *ts = malloc(sizeof(double) * (size_t)reps);
    if (!ts)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t i = 0; i < max_n / sizeof(float); i++)
        ((float *)in)[i] = (float)(i % 97);
    memset(out, 0, out_max);
    memset(copy_in, 1, out_max);

    if (rank == 0)
        printf("# %s, np %d, float32 sum; times in us, medians of %d (slowest rank of each call)\n"
               "# bytes  local  cross  seg  mpi  weft  mpi/local  mpi/cross  weft/cross  mpi/weft  mpi/seg\n",
               gather ? "allgather (bytes: one rank's block)" : "allreduce", size, reps);
    for (size_t n = (size_t)64 << 10; n <= max_n; n *= 2) {
        const size_t copy_bytes = gather ? n * (size_t)size : n;
        for (int r = -2; r < reps; r++) {   /* two warm-up repetitions */
            double t0, f, x, sg, m, w;
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now_us();
            memcpy(out, copy_in, copy_bytes);
            f = slowest(now_us() - t0);
            /* Neighbours write their part, then each rank copies the
             * others' (its neighbour's first n bytes for allreduce). */
            memset(mine, r & 0x7f, n);
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now_us();
            for (int k = 1; k < (gather ? size : (size > 1 ? 2 : 1)); k++)
                memcpy(out + (size_t)k * (gather ? n : 0), theirs[(rank + k) % size], n);
            x = slowest(now_us() - t0);
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now_us();
            memcpy(mine, in, n);
            flag_barrier(size);
            if (gather) {
                for (int k = 0; k < size; k++)
                    memcpy(out + (size_t)k * n, theirs[k], n);
            } else {
                /* This rank's slice, in pieces of 16 KiB that stay in cache. */
                const size_t nf = n / sizeof(float), per = (nf + (size_t)size - 1) / (size_t)size;
                const size_t lo = per * (size_t)rank < nf ? per * (size_t)rank : nf;
                const size_t hi = lo + per < nf ? lo + per : nf;
                float *res = (float *)(void *)(theirs[rank] + max_n);
                for (size_t b = lo; b < hi; b += 4096) {
                    const size_t e = b + 4096 < hi ? b + 4096 : hi;
                    const float *s0 = (const float *)(const void *)theirs[0];
                    for (size_t i = b; i < e; i++)
                        res[i] = s0[i];
                    for (int k = 1; k < size; k++) {
                        const float *sk = (const float *)(const void *)theirs[k];
                        for (size_t i = b; i < e; i++)
                            res[i] += sk[i];
                    }
                }
                flag_barrier(size);
                for (int k = 0; k < size; k++) {
                    const size_t klo = per * (size_t)k < nf ? per * (size_t)k : nf;
                    const size_t khi = klo + per < nf ? klo + per : nf;
                    memcpy(out + klo * sizeof(float), theirs[k] + max_n + klo * sizeof(float),
                           (khi - klo) * sizeof(float));
                }
            }
            flag_barrier(size);
            sg = slowest(now_us() - t0);
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now_us();
            if (gather)
                MPI_Allgather(in, (int)n, MPI_BYTE, out, (int)n, MPI_BYTE, MPI_COMM_WORLD);
            else
                MPI_Allreduce(in, out, (int)(n / sizeof(float)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            m = slowest(now_us() - t0);
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now_us();
            int rc = gather ? weft_allgather(c, in, out, n)
                            : weft_allreduce(c, in, out, n / sizeof(float), WEFT_FLOAT32, WEFT_SUM);
            if (rc != WEFT_SUCCESS) {
                fprintf(stderr, "rank %d: weft: %s\n", rank, weft_comm_last_error(c));
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            w = slowest(now_us() - t0);
            if (r >= 0) {
                tf[r] = f;
                tx[r] = x;
                ts[r] = sg;
                tm[r] = m;
                tw[r] = w;
            }
        }
        double f = median(tf, reps), x = median(tx, reps), sg = median(ts, reps), m = median(tm, reps),
               w = median(tw, reps);
        if (rank == 0)
            printf("%zu %.1f %.1f %.1f %.1f %.1f %.2f %.2f %.2f %.2f %.2f\n", n, f, x, sg, m, w, m / f, m / x,
                   w / x, m / w, m / sg);
        fflush(stdout);
    }
    weft_comm_destroy(c);
    MPI_Win_free(&win);
    MPI_Comm_free(&node);
    free(theirs);
    free(tx);
    free(ts);
    free(in);
    free(out);
    free(copy_in);
    free(tf);
    free(tm);
    free(tw);
    MPI_Finalize();
    return 0;
}
