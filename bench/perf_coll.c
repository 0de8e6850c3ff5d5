/*
 * weft-perf allgather / bcast: weft's collective and MPI's on the same data in
 * the same run, nccl-tests style.
 *
 * Per size, repetitions alternate weft and MPI (so drifting machine load hits
 * both alike); each repetition times `iters` back-to-back calls between two
 * MPI barriers, takes the slowest rank's time per call, and the table shows
 * the median over repetitions. Columns:
 *
 *   size     bytes per rank (allgather) / bytes (bcast)
 *   count    the same in 4-byte elements (nccl-tests' float count)
 *   time     µs per call
 *   algbw    GB/s of result per call: n*size (allgather) or size (bcast) / time
 *   busbw    what each link carried: allgather algbw*(n-1)/n, bcast algbw
 *   ratio    MPI time / weft time (> 1: weft faster)
 *   #wrong   bytes that differed from the expected pattern, weft + MPI, over
 *            all ranks (every size gets one checked call of each library
 *            with a fresh pattern; -c checks every timed call too)
 *
 * -d cuda: sbuf/rbuf are device memory (perf_mem.c). MPI gets them directly
 * when it is CUDA-aware; otherwise each MPI call is wrapped in host staging,
 * timed with it: allgather copies the rank's block to host, gathers into a
 * host result and copies the whole result to the device; bcast copies the
 * root's data to host and the result to the device on the other ranks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "perf.h"

#define COLL_REPS_DEFAULT  5
/* Bytes moved per timed batch: small blocks repeat often, large ones run
 * at least twice. */
#define COLL_BUDGET        (64u << 20)

enum { LIB_WEFT = 0, LIB_MPI = 1 };

struct coll_bench {
    const struct perf_opts *o;
    weft_comm_t *c;
    int is_bcast;
    size_t bytes;       /* per rank (allgather) or the message (bcast) */
    int root;
    unsigned char *sbuf, *rbuf;     /* device memory with -d cuda */
    unsigned char *shost, *rhost;   /* MPI's: sbuf/rbuf, or host staging (!o->mpi_direct) */
};

static size_t result_bytes(const struct coll_bench *b)
{
    return b->is_bcast ? b->bytes : b->bytes * (size_t)b->o->size;
}

/* Fills what this rank contributes for call `iter` of library lib. */
static void coll_fill(struct coll_bench *b, uint64_t iter, int lib)
{
    if (b->is_bcast) {
        if (b->o->rank == b->root)
            perf_buf_fill(b->o, b->rbuf, b->bytes, perf_seed(iter, b->bytes, (uint64_t)b->root, (uint64_t)lib));
        else
            perf_buf_set(b->o, b->rbuf, 0, b->bytes);
    } else {
        perf_buf_fill(b->o, b->sbuf, b->bytes, perf_seed(iter, b->bytes, (uint64_t)b->o->rank, (uint64_t)lib));
    }
}

static size_t coll_verify(const struct coll_bench *b, uint64_t iter, int lib)
{
    if (b->is_bcast)
        return perf_buf_verify(b->o, b->rbuf, b->bytes, perf_seed(iter, b->bytes, (uint64_t)b->root, (uint64_t)lib));
    size_t wrong = 0;
    for (int r = 0; r < b->o->size; r++)
        wrong += perf_buf_verify(b->o, b->rbuf + (size_t)r * b->bytes, b->bytes,
                                 perf_seed(iter, b->bytes, (uint64_t)r, (uint64_t)lib));
    return wrong;
}

/* One call of lib; returns 0 or a failure already reported. */
static int coll_call(struct coll_bench *b, int lib)
{
    const struct perf_opts *o = b->o;
    if (lib == LIB_WEFT) {
        int err = b->is_bcast ? weft_bcast(b->c, b->rbuf, b->bytes, b->root)
                              : weft_allgather(b->c, b->sbuf, b->rbuf, b->bytes);
        if (err)
            return perf_weft_fail(o, b->c, b->is_bcast ? "weft_bcast" : "weft_allgather", err);
        return 0;
    }
    int err;
    const int staged = !o->mpi_direct;
    if (staged) {
        if (!b->is_bcast)
            perf_buf_to_host(o, b->shost, b->sbuf, b->bytes);
        else if (o->rank == b->root)
            perf_buf_to_host(o, b->rhost, b->rbuf, b->bytes);
    }
    if (b->is_bcast) {
        /* MPI counts are int: large messages go as 1-MiB elements plus a tail. */
        size_t big = b->bytes >> 20, tail = b->bytes & ((1u << 20) - 1);
        err = MPI_SUCCESS;
        if (big) {
            MPI_Datatype mib;
            MPI_Type_contiguous(1 << 20, MPI_BYTE, &mib);
            MPI_Type_commit(&mib);
            err = MPI_Bcast(b->rhost, (int)big, mib, b->root, o->mpi);
            MPI_Type_free(&mib);
        }
        if (err == MPI_SUCCESS && tail)
            err = MPI_Bcast(b->rhost + (big << 20), (int)tail, MPI_BYTE, b->root, o->mpi);
    } else {
        MPI_Datatype blk;
        MPI_Type_contiguous((int)b->bytes, MPI_BYTE, &blk);
        MPI_Type_commit(&blk);
        err = MPI_Allgather(b->shost, 1, blk, b->rhost, 1, blk, o->mpi);
        MPI_Type_free(&blk);
    }
    if (err != MPI_SUCCESS) {
        fprintf(stderr, "weft-perf rank %d: MPI_%s failed (%d)\n", o->rank,
                b->is_bcast ? "Bcast" : "Allgather", err);
        return 1;
    }
    if (staged && (!b->is_bcast || o->rank != b->root))
        perf_buf_from_host(o, b->rbuf, b->rhost, result_bytes(b));
    return 0;
}

/* A checked call with a fresh pattern; returns wrong bytes (>= 0) or -1. */
static long long coll_checked_call(struct coll_bench *b, uint64_t iter, int lib)
{
    coll_fill(b, iter, lib);
    if (!b->is_bcast)
        perf_buf_set(b->o, b->rbuf, 0, result_bytes(b));
    if (coll_call(b, lib))
        return -1;
    return (long long)coll_verify(b, iter, lib);
}

/* Seconds per call for one batch, the slowest rank's; -1 on failure. */
static double coll_batch(struct coll_bench *b, int lib, int iters, uint64_t iter0, size_t *wrong)
{
    const struct perf_opts *o = b->o;
    double t = 0.0;
    int failed = 0;
    MPI_Barrier(o->mpi);
    if (o->check) {
        for (int i = 0; i < iters && !failed; i++) {
            coll_fill(b, iter0 + (uint64_t)i, lib);
            double t0 = perf_now();
            failed = coll_call(b, lib);
            t += perf_now() - t0;
            if (!failed)
                *wrong += coll_verify(b, iter0 + (uint64_t)i, lib);
        }
    } else {
        double t0 = perf_now();
        for (int i = 0; i < iters && !failed; i++)
            failed = coll_call(b, lib);
        t = perf_now() - t0;
    }
    double per = failed ? -1.0 : t / iters, worst = 0.0;
    /* A failure on any rank shows as a negative minimum. */
    double both[2] = { per, -per }, red[2];
    MPI_Allreduce(both, red, 2, MPI_DOUBLE, MPI_MAX, o->mpi);
    worst = red[0];
    if (-red[1] < 0.0)
        return -1.0;
    return worst;
}

static int coll_run(const struct perf_opts *o, weft_comm_t *c, int is_bcast)
{
    const int n = o->size;
    const int reps = o->reps > 0 ? o->reps : COLL_REPS_DEFAULT;
    size_t min_b, max_b;
    perf_sizes(o, 8, 16u << 20, &min_b, &max_b);
    struct coll_bench b = { .o = o, .c = c, .is_bcast = is_bcast, .root = o->root };

    size_t max_result = is_bcast ? max_b : max_b * (size_t)n;
    b.rbuf = perf_buf_alloc(o, max_result ? max_result : 1);
    b.sbuf = is_bcast ? NULL : perf_buf_alloc(o, max_b ? max_b : 1);
    b.rhost = o->mpi_direct ? b.rbuf : perf_alloc(max_result ? max_result : 1);
    b.shost = o->mpi_direct ? b.sbuf : is_bcast ? NULL : perf_alloc(max_b ? max_b : 1);

    char title[1024];
    int len;
    const char *algo = o->algo ? o->algo : getenv("WEFT_ALLGATHER_ALGO");
    if (is_bcast)
        len = snprintf(title, sizeof title, "# bcast, root %d: weft_bcast vs MPI_Bcast, median of %d reps, "
                       "busbw = algbw\n", o->root, reps);
    else
        len = snprintf(title, sizeof title, "# allgather: weft_allgather (%s) vs MPI_Allgather, median of %d reps, "
                       "algbw = n*size/time, busbw = algbw*(n-1)/n\n",
                       algo && *algo ? algo : "selector", reps);
    /* The column lines belong to the header: --csv prints neither. */
    if (len > 0 && (size_t)len < sizeof title)
        len += snprintf(title + len, sizeof title - (size_t)len, "# %10s %10s %11s %8s %8s %11s %8s %7s %7s\n",
                        is_bcast ? "size(B)" : "size(B/rank)", "count(f32)", "weft(us)", "algbw", "busbw",
                        "MPI(us)", "busbw", "ratio", "#wrong");
    if (len > 0 && (size_t)len < sizeof title)
        snprintf(title + len, sizeof title - (size_t)len, "# %10s %10s %11s %8s %8s %11s %8s %7s %7s", "", "", "",
                 "(GB/s)", "(GB/s)", "", "(GB/s)", "MPI/weft", "");
    perf_print_header(o, title);

    double *times[2];
    times[0] = malloc((size_t)reps * sizeof(double));
    times[1] = malloc((size_t)reps * sizeof(double));
    int rc = 0;
    if (!times[0] || !times[1]) {
        fprintf(stderr, "weft-perf rank %d: out of memory\n", o->rank);
        rc = 1;
        goto out;
    }

    uint64_t iter = 1;
    for (size_t bytes = min_b; bytes && bytes <= max_b; bytes = perf_next_size(o, bytes)) {
        b.bytes = bytes;
        size_t moved = result_bytes(&b);
        int iters = perf_scale_iters(o, moved, COLL_BUDGET, 2, 1000);
        size_t wrong_local[2] = { 0, 0 };   /* per library */

        /* One checked call each with a fresh pattern, then warm-up. */
        for (int lib = 0; lib < 2; lib++) {
            long long w = coll_checked_call(&b, iter++, lib);
            if (w < 0) {
                rc = 1;
                goto out;
            }
            wrong_local[lib] += (size_t)w;
            if (!o->check)
                coll_fill(&b, iter, lib); /* timed calls move real data */
            for (int i = 0; i < o->warmup; i++)
                if (coll_call(&b, lib)) {
                    rc = 1;
                    goto out;
                }
        }
        for (int rep = 0; rep < reps; rep++) {
            /* Alternate which library goes first. */
            for (int k = 0; k < 2; k++) {
                int lib = (rep + k) % 2;
                double t = coll_batch(&b, lib, iters, iter, &wrong_local[lib]);
                iter += (uint64_t)iters;
                if (t < 0) {
                    rc = 1;
                    goto out;
                }
                times[lib][rep] = t;
            }
        }
        unsigned long long wrong[2] = { 0, 0 }, wl[2] = { wrong_local[0], wrong_local[1] };
        MPI_Reduce(wl, wrong, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, o->mpi);
        if (o->rank == 0) {
            double tw = perf_median(times[LIB_WEFT], reps), tm = perf_median(times[LIB_MPI], reps);
            double bus = is_bcast ? 1.0 : (double)(n - 1) / (double)n;
            double algw = tw > 0 ? (double)moved / tw * 1e-9 : 0, algm = tm > 0 ? (double)moved / tm * 1e-9 : 0;
            char sz[32], line[256];
            /* The table keeps one #wrong column (weft + MPI); CSV has it per library. */
            snprintf(line, sizeof line, "%12s %10zu %11.2f %8.3f %8.3f %11.2f %8.3f %7.2f %7llu",
                     perf_size_str(bytes, sz, sizeof sz), bytes / 4, tw * 1e6, algw, algw * bus, tm * 1e6,
                     algm * bus, tw > 0 ? tm / tw : 0.0, wrong[0] + wrong[1]);
            const struct perf_result res[2] = {
                { "weft", tw, algw, algw * bus, (long long)wrong[0] },
                { "MPI", tm, algm, algm * bus, (long long)wrong[1] },
            };
            perf_report(o, is_bcast ? "bcast" : "allgather", bytes, res, 2, line);
        }
    }
out:
    free(times[0]);
    free(times[1]);
    if (!o->mpi_direct) {
        perf_free(b.rhost);
        perf_free(b.shost);
    }
    perf_buf_free(o, b.rbuf);
    if (b.sbuf)
        perf_buf_free(o, b.sbuf);
    return rc;
}

int perf_allgather(const struct perf_opts *o, weft_comm_t *c)
{
    return coll_run(o, c, 0);
}

int perf_bcast(const struct perf_opts *o, weft_comm_t *c)
{
    return coll_run(o, c, 1);
}

/* weft_barrier vs MPI_Barrier: one row, the slowest rank's seconds per
 * call, medians of alternating batches (barriers move no data: size 0). */
static double barrier_batch(const struct perf_opts *o, weft_comm_t *c, int lib, int iters)
{
    int failed = 0;
    MPI_Barrier(o->mpi);
    double t0 = perf_now();
    for (int i = 0; i < iters && !failed; i++)
        failed = lib == LIB_WEFT ? weft_barrier(c) != WEFT_SUCCESS : MPI_Barrier(o->mpi) != MPI_SUCCESS;
    double per = failed ? -1.0 : (perf_now() - t0) / iters;
    double both[2] = { per, -per }, red[2];
    MPI_Allreduce(both, red, 2, MPI_DOUBLE, MPI_MAX, o->mpi);
    if (-red[1] < 0.0) {
        if (failed && lib == LIB_WEFT)
            fprintf(stderr, "weft-perf rank %d: weft_barrier failed: %s\n", o->rank, weft_comm_last_error(c));
        return -1.0;
    }
    return red[0];
}

int perf_barrier(const struct perf_opts *o, weft_comm_t *c)
{
    const int reps = o->reps > 0 ? o->reps : COLL_REPS_DEFAULT;
    const int iters = o->iters > 0 ? o->iters : 1000;
    double *times[2] = { malloc((size_t)reps * sizeof(double)), malloc((size_t)reps * sizeof(double)) };
    char title[512];
    int rc = 0;
    snprintf(title, sizeof title,
             "# barrier: weft_barrier vs MPI_Barrier, %d calls a batch, median of %d batches (the slowest rank's)\n"
             "# %10s %11s %11s %7s\n# %10s %11s %11s %7s", iters, reps, "size(B)", "weft(us)", "MPI(us)", "ratio", "",
             "", "", "MPI/weft");
    perf_print_header(o, title);
    if (!times[0] || !times[1]) {
        fprintf(stderr, "weft-perf rank %d: out of memory\n", o->rank);
        rc = 1;
        goto out;
    }
    for (int lib = 0; lib < 2; lib++)
        for (int i = 0; i < o->warmup; i++)
            if (barrier_batch(o, c, lib, 10) < 0) {
                rc = 1;
                goto out;
            }
    for (int rep = 0; rep < reps; rep++)
        for (int k = 0; k < 2; k++) {
            int lib = (rep + k) % 2;
            double t = barrier_batch(o, c, lib, iters);
            if (t < 0) {
                rc = 1;
                goto out;
            }
            times[lib][rep] = t;
        }
    if (o->rank == 0) {
        double tw = perf_median(times[LIB_WEFT], reps), tm = perf_median(times[LIB_MPI], reps);
        char line[160];
        snprintf(line, sizeof line, "%12s %11.2f %11.2f %7.2f", "0", tw * 1e6, tm * 1e6, tw > 0 ? tm / tw : 0.0);
        const struct perf_result res[2] = { { "weft", tw, 0, 0, 0 }, { "MPI", tm, 0, 0, 0 } };
        perf_report(o, "barrier", 0, res, 2, line);
    }
out:
    free(times[0]);
    free(times[1]);
    return rc;
}
