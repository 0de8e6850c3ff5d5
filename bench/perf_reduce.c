/*
 * weft-perf allreduce / reduce / reduce_scatter / alltoall: weft's call and
 * MPI's (MPI_Allreduce, MPI_Reduce, MPI_Reduce_scatter_block, MPI_Alltoall)
 * on the same data in the same run, float32 sum, nccl-tests style.
 *
 * Sizes follow nccl-tests: `size` is the whole buffer of the collective on
 * one rank, the larger of send and receive:
 *
 *   allreduce       count = size/4 floats in, the same out
 *   reduce          count = size/4 floats in, the same out at the root (-R)
 *   reduce_scatter  size = the send buffer, n blocks of size/(4n) floats;
 *                   each rank receives one block (recvcount = size/(4n))
 *   alltoall        size = the send buffer, n blocks of size/(4n) floats,
 *                   one per destination (weft_alltoall's bytes_per_rank =
 *                   size/n); the receive buffer is as large
 *   alltoallv       the alltoall's layout with uneven blocks: rank s sends
 *                   rank d c(s,d) floats, c/2, c or 3c/2 by (s + 2d) mod 3
 *                   (c = size/(4n)), packed without gaps on both sides; size
 *                   stays n*c*4, the mean send buffer (each rank's own
 *                   totals differ from it by up to half)
 *
 * A size is rounded down to whole floats per block (the table shows the
 * size actually moved); sizes below one float per rank are left out.
 *
 * Per size, repetitions alternate weft and MPI (drifting load hits both
 * alike); each repetition times `iters` back-to-back calls between two MPI
 * barriers and takes the slowest rank's time per call; the table shows the
 * median over repetitions. Columns, per library:
 *
 *   time    µs per call
 *   algbw   size / time (GB/s)
 *   busbw   what each link carried, as nccl-tests defines it:
 *           allreduce algbw*2(n-1)/n, reduce algbw, reduce_scatter and
 *           alltoall algbw*(n-1)/n
 *   #wrong  result elements that differed from the exact expectation, over
 *           all ranks (reduce: the root's): one checked call per size and library with fresh
 *           data, and with -c every timed call too (data filled and checked
 *           outside the timed region, a barrier before each timed call)
 *
 * and ratio = MPI time / weft time (> 1: weft faster).
 *
 * Data: every float is a small integer (-128..127) that depends on the
 * call, the rank that contributes it and its index, so sums over any
 * number of ranks are exact in float32 whatever the order of additions, and
 * a result from the wrong rank, index or call shows.
 *
 * -d cuda: buffers are device memory (perf_mem.c); MPI gets them directly
 * when it is CUDA-aware, else each MPI call copies the send buffer to host
 * and the result back, timed with it (as the allgather mode does).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "perf.h"

#define RED_REPS_DEFAULT  5
/* Bytes per timed batch: small sizes repeat often, large ones run twice. */
#define RED_BUDGET        (64u << 20)

enum { LIB_WEFT = 0, LIB_MPI = 1 };
enum { RK_ALLREDUCE, RK_REDUCE_SCATTER, RK_ALLTOALL, RK_REDUCE, RK_ALLTOALLV };

static const char *const kind_name[] = { "allreduce", "reduce_scatter", "alltoall", "reduce", "alltoallv" };

struct red_bench {
    const struct perf_opts *o;
    weft_comm_t *c;
    int kind;
    size_t size;          /* nccl-tests' size: bytes actually moved, see above */
    size_t count;         /* allreduce: floats; reduce_scatter: floats per rank (recvcount);
                           * alltoall: floats per block */
    size_t scount, rcount;/* floats in the send / receive buffer */
    float *sbuf, *rbuf;   /* device memory with -d cuda */
    float *shost, *rhost; /* MPI's: sbuf/rbuf, or host staging (!o->mpi_direct) */
    float *hs;            /* host scratch: fills and checks */
    /* alltoallv: weft's byte counts and displacements, MPI's in floats */
    size_t *vsb, *vsd, *vrb, *vrd;
    int *msc, *msd, *mrc, *mrd;
};

/* alltoallv: floats rank s sends rank d when the alltoall's block is c. */
static size_t vblock(size_t c, int s, int d)
{
    return c / 2 + c * (size_t)((s + 2 * d) % 3) / 2;
}

/* Where rank s's block for rank d starts in s's send buffer (floats). */
static size_t vsend_at(size_t c, int n, int s, int d)
{
    size_t at = 0;
    for (int j = 0; j < d && j < n; j++)
        at += vblock(c, s, j);
    return at;
}

/* The value rank r contributes at index i of its send buffer in call
 * `iter` of library lib: an integer in [-128, 127]. */
static inline float val(uint64_t iter, int lib, int r, size_t i)
{
    uint32_t x = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32) * 0x7FEB352Du;
    x ^= (uint32_t)r * 0x85EBCA77u + (uint32_t)iter * 0xC2B2AE3Du + (uint32_t)lib * 0x27D4EB2Fu;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    x *= 0x297A2D39u;
    x ^= x >> 15;
    return (float)((int)(x & 255u) - 128);
}

/* Sizes for the sweep value `bytes`; 0 when nothing whole fits. */
static int red_shape(struct red_bench *b, size_t bytes)
{
    size_t n = (size_t)b->o->size;
    switch (b->kind) {
    case RK_ALLREDUCE:
    case RK_REDUCE:
        b->count = bytes / 4;
        b->scount = b->rcount = b->count;
        break;
    case RK_REDUCE_SCATTER:
        b->count = bytes / 4 / n;
        b->scount = b->count * n;
        b->rcount = b->count;
        break;
    case RK_ALLTOALLV: {
        const int me = b->o->rank;
        b->count = bytes / 4 / n;
        b->scount = b->rcount = 0;
        for (int r = 0; r < (int)n; r++) {
            size_t out = vblock(b->count, me, r), in = vblock(b->count, r, me);
            b->vsb[r] = out * 4;
            b->vsd[r] = b->scount * 4;
            b->vrb[r] = in * 4;
            b->vrd[r] = b->rcount * 4;
            /* Ints: the sweep's largest size was checked against INT_MAX floats. */
            b->msc[r] = (int)out;
            b->msd[r] = (int)b->scount;
            b->mrc[r] = (int)in;
            b->mrd[r] = (int)b->rcount;
            b->scount += out;
            b->rcount += in;
        }
        b->size = n * b->count * 4;
        return b->count > 0;
    }
    default:
        b->count = bytes / 4 / n;
        b->scount = b->rcount = b->count * n;
        break;
    }
    b->size = (b->scount > b->rcount ? b->scount : b->rcount) * 4;
    return b->count > 0;
}

static void red_fill(struct red_bench *b, uint64_t iter, int lib)
{
    const int me = b->o->rank;
    for (size_t i = 0; i < b->scount; i++)
        b->hs[i] = val(iter, lib, me, i);
    perf_buf_from_host(b->o, b->sbuf, b->hs, b->scount * 4);
}

/* Result elements that differ from the exact expectation. */
static size_t red_verify(struct red_bench *b, uint64_t iter, int lib)
{
    const int n = b->o->size, me = b->o->rank;
    size_t wrong = 0;
    if (b->kind == RK_REDUCE && me != b->o->root)
        return 0;   /* the result is the root's only */
    perf_buf_to_host(b->o, b->hs, b->rbuf, b->rcount * 4);
    switch (b->kind) {
    case RK_ALLREDUCE:
    case RK_REDUCE:
    case RK_REDUCE_SCATTER: {
        size_t base = b->kind == RK_REDUCE_SCATTER ? (size_t)me * b->count : 0;
        for (size_t i = 0; i < b->rcount; i++) {
            float want = 0.0f;
            for (int r = 0; r < n; r++)
                want += val(iter, lib, r, base + i);
            wrong += b->hs[i] != want;
        }
        break;
    }
    case RK_ALLTOALLV:
        /* Block s came from rank s: its block for me, where s packed it. */
        for (int s = 0; s < n; s++) {
            size_t at = vsend_at(b->count, n, s, me), len = vblock(b->count, s, me);
            for (size_t j = 0; j < len; j++)
                wrong += b->hs[b->vrd[s] / 4 + j] != val(iter, lib, s, at + j);
        }
        break;
    default:
        /* Block s came from rank s: its elements me*count .. of s's send buffer. */
        for (int s = 0; s < n; s++)
            for (size_t j = 0; j < b->count; j++)
                wrong += b->hs[(size_t)s * b->count + j] != val(iter, lib, s, (size_t)me * b->count + j);
        break;
    }
    return wrong;
}

static int red_call(struct red_bench *b, int lib)
{
    const struct perf_opts *o = b->o;
    int err;
    if (lib == LIB_WEFT) {
        switch (b->kind) {
        case RK_ALLREDUCE:
            err = weft_allreduce(b->c, b->sbuf, b->rbuf, b->count, WEFT_FLOAT32, WEFT_SUM);
            break;
        case RK_REDUCE_SCATTER:
            err = weft_reduce_scatter(b->c, b->sbuf, b->rbuf, b->count, WEFT_FLOAT32, WEFT_SUM);
            break;
        case RK_REDUCE:
            err = weft_reduce(b->c, b->sbuf, b->rbuf, b->count, WEFT_FLOAT32, WEFT_SUM, o->root);
            break;
        case RK_ALLTOALLV:
            err = weft_alltoallv(b->c, b->sbuf, b->vsb, b->vsd, b->rbuf, b->vrb, b->vrd);
            break;
        default:
            err = weft_alltoall(b->c, b->sbuf, b->rbuf, b->count * 4);
            break;
        }
        if (err) {
            char call[32];
            snprintf(call, sizeof call, "weft_%s", kind_name[b->kind]);
            return perf_weft_fail(o, b->c, call, err);
        }
        return 0;
    }
    const int staged = !o->mpi_direct;
    if (staged)
        perf_buf_to_host(o, b->shost, b->sbuf, b->scount * 4);
    /* Counts fit an int: checked before the sweep (red_run). */
    switch (b->kind) {
    case RK_ALLREDUCE:
        err = MPI_Allreduce(b->shost, b->rhost, (int)b->count, MPI_FLOAT, MPI_SUM, o->mpi);
        break;
    case RK_REDUCE_SCATTER:
        err = MPI_Reduce_scatter_block(b->shost, b->rhost, (int)b->count, MPI_FLOAT, MPI_SUM, o->mpi);
        break;
    case RK_REDUCE:
        err = MPI_Reduce(b->shost, b->rhost, (int)b->count, MPI_FLOAT, MPI_SUM, o->root, o->mpi);
        break;
    case RK_ALLTOALLV:
        err = MPI_Alltoallv(b->shost, b->msc, b->msd, MPI_FLOAT, b->rhost, b->mrc, b->mrd, MPI_FLOAT, o->mpi);
        break;
    default:
        err = MPI_Alltoall(b->shost, (int)b->count, MPI_FLOAT, b->rhost, (int)b->count, MPI_FLOAT, o->mpi);
        break;
    }
    if (err != MPI_SUCCESS) {
        fprintf(stderr, "weft-perf rank %d: MPI call of the %s mode failed (%d)\n", o->rank, kind_name[b->kind],
                err);
        return 1;
    }
    if (staged)
        perf_buf_from_host(o, b->rbuf, b->rhost, b->rcount * 4);
    return 0;
}

/* A checked call with fresh data; the result buffer is poisoned first
 * (0xFF bytes: NaN, never equal to anything), so a call that writes
 * nothing cannot pass. Returns wrong elements (>= 0) or -1. */
static long long red_checked_call(struct red_bench *b, uint64_t iter, int lib)
{
    red_fill(b, iter, lib);
    perf_buf_set(b->o, b->rbuf, 0xFF, b->rcount * 4);
    if (red_call(b, lib))
        return -1;
    return (long long)red_verify(b, iter, lib);
}

/* Seconds per call for one batch, the slowest rank's; -1 on failure. */
static double red_batch(struct red_bench *b, int lib, int iters, uint64_t iter0, size_t *wrong)
{
    const struct perf_opts *o = b->o;
    double t = 0.0;
    int failed = 0;
    MPI_Barrier(o->mpi);
    if (o->check) {
        for (int i = 0; i < iters && !failed; i++) {
            red_fill(b, iter0 + (uint64_t)i, lib);
            perf_buf_set(o, b->rbuf, 0xFF, b->rcount * 4);
            /* Ranks finish checking at different times: line them up, so
             * the timed call does not include waiting for the slowest. */
            MPI_Barrier(o->mpi);
            double t0 = perf_now();
            failed = red_call(b, lib);
            t += perf_now() - t0;
            if (!failed)
                *wrong += red_verify(b, iter0 + (uint64_t)i, lib);
        }
    } else {
        double t0 = perf_now();
        for (int i = 0; i < iters && !failed; i++)
            failed = red_call(b, lib);
        t = perf_now() - t0;
    }
    double per = failed ? -1.0 : t / iters;
    double both[2] = { per, -per }, red[2];
    MPI_Allreduce(both, red, 2, MPI_DOUBLE, MPI_MAX, o->mpi);
    if (-red[1] < 0.0)
        return -1.0;
    return red[0];
}

static const char *algo_env(int kind)
{
    switch (kind) {
    case RK_ALLREDUCE: return "WEFT_ALLREDUCE_ALGO";
    case RK_REDUCE_SCATTER: return "WEFT_REDUCE_SCATTER_ALGO";
    case RK_REDUCE: return "WEFT_REDUCE_ALGO";
    case RK_ALLTOALLV: return NULL;   /* one algorithm: pairwise */
    default: return "WEFT_ALLTOALL_ALGO";
    }
}

static int red_run(const struct perf_opts *o, weft_comm_t *c, int kind)
{
    const int n = o->size;
    const int reps = perf_reps(o, RED_REPS_DEFAULT);
    size_t min_b, max_b;
    perf_sizes(o, 8, 64u << 20, &min_b, &max_b);
    struct red_bench b = { .o = o, .c = c, .kind = kind };

    /* The largest buffers of the sweep: every kind's buffers are at most
     * the sweep's size (rounded down); alltoallv's up to half again. */
    size_t max_floats = max_b / 4 ? max_b / 4 : 1;
    if (kind == RK_ALLTOALLV)
        max_floats += max_floats / 2 + (size_t)n;
    if (max_floats > (size_t)INT_MAX) {
        if (o->rank == 0)
            fprintf(stderr, "weft-perf: -e %zu: MPI counts are int; at most %d floats\n", max_b, INT_MAX);
        return 1;
    }
    if (kind == RK_ALLTOALLV) {
        b.vsb = calloc(4 * (size_t)n, sizeof(size_t));
        b.msc = calloc(4 * (size_t)n, sizeof(int));
        if (b.vsb == NULL || b.msc == NULL) {
            fprintf(stderr, "weft-perf rank %d: out of memory\n", o->rank);
            free(b.vsb);
            free(b.msc);
            return 1;
        }
        b.vsd = b.vsb + n;
        b.vrb = b.vsb + 2 * n;
        b.vrd = b.vsb + 3 * n;
        b.msd = b.msc + n;
        b.mrc = b.msc + 2 * n;
        b.mrd = b.msc + 3 * n;
    }
    b.sbuf = perf_buf_alloc(o, max_floats * 4);
    b.rbuf = perf_buf_alloc(o, max_floats * 4);
    b.shost = o->mpi_direct ? b.sbuf : perf_alloc(max_floats * 4);
    b.rhost = o->mpi_direct ? b.rbuf : perf_alloc(max_floats * 4);
    b.hs = perf_alloc(max_floats * 4);

    const char *algo_var = algo_env(kind), *algo = algo_var ? getenv(algo_var) : NULL;
    const char *bus = kind == RK_ALLREDUCE ? "2(n-1)/n" : kind == RK_REDUCE ? "1" : "(n-1)/n";
    static const char *const mpi_name[] = { "MPI_Allreduce", "MPI_Reduce_scatter_block", "MPI_Alltoall",
                                            "MPI_Reduce", "MPI_Alltoallv" };
    static const char *const size_is[] = {
        "size = count*4 (in and out)",
        "size = send buffer (n blocks), count = size/4, each rank receives size/n",
        "size = send buffer (n blocks, one per rank), count = size/4",
        "size = count*4 (in; out at the root, -R)",
        "size = n*c*4, blocks of c/2, c or 3c/2 floats (see weft-perf -h), count = size/4",
    };
    char title[1024];
    int len = snprintf(title, sizeof title,
             "# %s: weft_%s (%s) vs %s, float32%s, median of %d reps;\n"
             "# %s; algbw = size/time, busbw = algbw*%s; ratio = MPI time / weft time\n",
             kind_name[kind], kind_name[kind], algo && *algo ? algo : "selector", mpi_name[kind],
             kind == RK_ALLTOALL || kind == RK_ALLTOALLV ? "" : " sum", reps,
             size_is[kind], bus);
    /* The column lines belong to the header: --csv prints neither. */
    if (len > 0 && (size_t)len < sizeof title)
        len += snprintf(title + len, sizeof title - (size_t)len,
                        "# %10s %10s %11s %8s %8s %7s %11s %8s %8s %7s %7s\n", "size(B)", "count(f32)", "weft(us)",
                        "algbw", "busbw", "#wrong", "MPI(us)", "algbw", "busbw", "#wrong", "ratio");
    if (len > 0 && (size_t)len < sizeof title)
        snprintf(title + len, sizeof title - (size_t)len, "# %10s %10s %11s %8s %8s %7s %11s %8s %8s %7s %7s", "",
                 "", "", "(GB/s)", "(GB/s)", "", "", "(GB/s)", "(GB/s)", "", "MPI/weft");
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
        if (!red_shape(&b, bytes))
            continue;   /* less than one float per rank */
        int iters = perf_scale_iters(o, b.size, RED_BUDGET, 2, 1000);
        size_t wrong_local[2] = { 0, 0 };

        /* One checked call each with fresh data, then warm-up. */
        for (int lib = 0; lib < 2; lib++) {
            long long w = red_checked_call(&b, iter++, lib);
            if (w < 0) {
                rc = 1;
                goto out;
            }
            wrong_local[lib] += (size_t)w;
            for (int i = 0; i < o->warmup; i++)
                if (red_call(&b, lib)) {
                    rc = 1;
                    goto out;
                }
        }
        for (int rep = 0; rep < reps; rep++) {
            for (int k = 0; k < 2; k++) {
                int lib = (rep + k) % 2;   /* alternate which library goes first */
                double t = red_batch(&b, lib, iters, iter, &wrong_local[lib]);
                iter += (uint64_t)iters;
                if (t < 0) {
                    rc = 1;
                    goto out;
                }
                times[lib][rep] = t;
            }
        }
        unsigned long long wl[2] = { wrong_local[0], wrong_local[1] }, wrong[2] = { 0, 0 };
        MPI_Reduce(wl, wrong, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, o->mpi);
        if (o->rank == 0) {
            double tw = perf_median(times[LIB_WEFT], reps), tm = perf_median(times[LIB_MPI], reps);
            double f = kind == RK_ALLREDUCE ? 2.0 * (n - 1) / n : kind == RK_REDUCE ? 1.0 : (double)(n - 1) / n;
            double algw = tw > 0 ? (double)b.size / tw * 1e-9 : 0, algm = tm > 0 ? (double)b.size / tm * 1e-9 : 0;
            char sz[32], line[256];
            snprintf(line, sizeof line, "%12s %10zu %11.2f %8.3f %8.3f %7llu %11.2f %8.3f %8.3f %7llu %7.2f",
                     perf_size_str(b.size, sz, sizeof sz), b.size / 4, tw * 1e6, algw, algw * f, wrong[0], tm * 1e6,
                     algm, algm * f, wrong[1], tw > 0 ? tm / tw : 0.0);
            const struct perf_result res[2] = {
                { "weft", tw, algw, algw * f, (long long)wrong[0] },
                { "MPI", tm, algm, algm * f, (long long)wrong[1] },
            };
            perf_report(o, kind_name[kind], b.size, res, 2, line);
        }
    }
out:
    free(times[0]);
    free(times[1]);
    if (!o->mpi_direct) {
        perf_free(b.shost);
        perf_free(b.rhost);
    }
    perf_free(b.hs);
    perf_buf_free(o, b.sbuf);
    perf_buf_free(o, b.rbuf);
    free(b.vsb);
    free(b.msc);
    return rc;
}

int perf_allreduce(const struct perf_opts *o, weft_comm_t *c)
{
    return red_run(o, c, RK_ALLREDUCE);
}

int perf_reduce(const struct perf_opts *o, weft_comm_t *c)
{
    return red_run(o, c, RK_REDUCE);
}

int perf_reduce_scatter(const struct perf_opts *o, weft_comm_t *c)
{
    return red_run(o, c, RK_REDUCE_SCATTER);
}

int perf_alltoall(const struct perf_opts *o, weft_comm_t *c)
{
    return red_run(o, c, RK_ALLTOALL);
}

int perf_alltoallv(const struct perf_opts *o, weft_comm_t *c)
{
    return red_run(o, c, RK_ALLTOALLV);
}
