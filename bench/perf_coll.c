/*
 * weft-perf allgather / bcast / gather / scatter: weft's collective and
 * MPI's on the same data in the same run, nccl-tests style.
 *
 * Per size, repetitions alternate weft and MPI (so drifting machine load hits
 * both alike); each repetition times `iters` back-to-back calls between two
 * MPI barriers, takes the slowest rank's time per call, and the table shows
 * the median over repetitions. Columns:
 *
 *   size     bytes per rank (allgather, gather, scatter) / bytes (bcast)
 *   count    the same in 4-byte elements (nccl-tests' float count)
 *   time     µs per call
 *   algbw    GB/s of result per call: n*size (allgather; gather and scatter:
 *            the root's whole buffer, all that crosses the root) or size
 *            (bcast) / time
 *   busbw    what each link carried: allgather, gather and scatter
 *            algbw*(n-1)/n (own blocks do not travel), bcast algbw
 *   ratio    MPI time / weft time (> 1: weft faster)
 *   #wrong   bytes that differed from the expected pattern, weft + MPI, over
 *            all ranks (every size gets one checked call of each library
 *            with a fresh pattern; -c checks every timed call too). gather:
 *            the root's result only (no other rank receives anything);
 *            scatter: every rank's own block
 *
 * The rooted ones take their root from -R (as bcast and reduce do). Every
 * rank's block is filled with a pattern seeded by the rank it belongs to:
 * gather's by the rank that sends it, scatter's (all at the root) by the
 * rank it is for, so a block delivered to the wrong place shows.
 *
 * -d cuda: sbuf/rbuf are device memory (perf_mem.c). MPI gets them directly
 * when it is CUDA-aware; otherwise each MPI call is wrapped in host staging,
 * timed with it: what the rank sends is copied to host before the call and
 * what it received to the device after it (allgather: the block, then the
 * whole result; bcast: the root's data, the result on the other ranks;
 * gather: the block, the result at the root; scatter: the root's n blocks,
 * then each rank's block).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "perf.h"

#define COLL_REPS_DEFAULT  5
/* Bytes moved per timed batch: small blocks repeat often, large ones run
 * at least twice. */
#define COLL_BUDGET        (64u << 20)

enum { LIB_WEFT = 0, LIB_MPI = 1 };
enum coll_kind { CK_ALLGATHER, CK_BCAST, CK_GATHER, CK_SCATTER };

static const char *const kind_name[] = { "allgather", "bcast", "gather", "scatter" };

struct coll_bench {
    const struct perf_opts *o;
    weft_comm_t *c;
    enum coll_kind kind;
    size_t bytes;       /* per rank (allgather, gather, scatter) or the message (bcast) */
    int root;
    unsigned char *sbuf, *rbuf;     /* device memory with -d cuda; NULL where this rank has none */
    unsigned char *shost, *rhost;   /* MPI's: sbuf/rbuf, or host staging (!o->mpi_direct) */
};

/* Bytes of the call at block size `bytes` that cross the root (allgather:
 * what every rank ends with): the table's algbw is this over the time. */
static size_t moved_bytes(const struct coll_bench *b, size_t bytes)
{
    return b->kind == CK_BCAST ? bytes : bytes * (size_t)b->o->size;
}

/* What this rank's sbuf holds at block size `bytes` (bcast sends from
 * rbuf); 0: this rank has no sbuf. */
static size_t send_bytes(const struct coll_bench *b, size_t bytes)
{
    switch (b->kind) {
    case CK_ALLGATHER:
    case CK_GATHER:
        return bytes;
    case CK_SCATTER:
        return b->o->rank == b->root ? bytes * (size_t)b->o->size : 0;
    default:
        return 0;
    }
}

/* What this rank's rbuf holds at block size `bytes`; 0: no rbuf (gather
 * away from the root, whose result is the root's only). */
static size_t recv_bytes(const struct coll_bench *b, size_t bytes)
{
    switch (b->kind) {
    case CK_ALLGATHER:
        return bytes * (size_t)b->o->size;
    case CK_GATHER:
        return b->o->rank == b->root ? bytes * (size_t)b->o->size : 0;
    default:
        return bytes;
    }
}

/* Fills what this rank contributes for call `iter` of library lib. */
static void coll_fill(struct coll_bench *b, uint64_t iter, int lib)
{
    const struct perf_opts *o = b->o;
    switch (b->kind) {
    case CK_BCAST:
        if (o->rank == b->root)
            perf_buf_fill(o, b->rbuf, b->bytes, perf_seed(iter, b->bytes, (uint64_t)b->root, (uint64_t)lib));
        else
            perf_buf_set(o, b->rbuf, 0, b->bytes);
        break;
    case CK_SCATTER:
        if (o->rank == b->root)
            for (int r = 0; r < o->size; r++)
                perf_buf_fill(o, b->sbuf + (size_t)r * b->bytes, b->bytes,
                              perf_seed(iter, b->bytes, (uint64_t)r, (uint64_t)lib));
        break;
    default:
        perf_buf_fill(o, b->sbuf, b->bytes, perf_seed(iter, b->bytes, (uint64_t)o->rank, (uint64_t)lib));
        break;
    }
}

static size_t coll_verify(const struct coll_bench *b, uint64_t iter, int lib)
{
    const struct perf_opts *o = b->o;
    switch (b->kind) {
    case CK_BCAST:
        return perf_buf_verify(o, b->rbuf, b->bytes, perf_seed(iter, b->bytes, (uint64_t)b->root, (uint64_t)lib));
    case CK_SCATTER:
        return perf_buf_verify(o, b->rbuf, b->bytes, perf_seed(iter, b->bytes, (uint64_t)o->rank, (uint64_t)lib));
    default: {
        /* gather's result (laid out as allgather's) is the root's only. */
        if (b->kind == CK_GATHER && o->rank != b->root)
            return 0;
        size_t wrong = 0;
        for (int r = 0; r < o->size; r++)
            wrong += perf_buf_verify(o, b->rbuf + (size_t)r * b->bytes, b->bytes,
                                     perf_seed(iter, b->bytes, (uint64_t)r, (uint64_t)lib));
        return wrong;
    }
    }
}

/* One call of lib; returns 0 or a failure already reported. */
static int coll_call(struct coll_bench *b, int lib)
{
    const struct perf_opts *o = b->o;
    int err;
    if (lib == LIB_WEFT) {
        switch (b->kind) {
        case CK_BCAST:
            err = weft_bcast(b->c, b->rbuf, b->bytes, b->root);
            break;
        case CK_GATHER:
            err = weft_gather(b->c, b->sbuf, b->rbuf, b->bytes, b->root);
            break;
        case CK_SCATTER:
            err = weft_scatter(b->c, b->sbuf, b->rbuf, b->bytes, b->root);
            break;
        default:
            err = weft_allgather(b->c, b->sbuf, b->rbuf, b->bytes);
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
    const size_t sent = send_bytes(b, b->bytes), got = recv_bytes(b, b->bytes);
    if (staged) {
        if (b->kind == CK_BCAST) {
            if (o->rank == b->root)
                perf_buf_to_host(o, b->rhost, b->rbuf, b->bytes);
        } else if (sent) {
            perf_buf_to_host(o, b->shost, b->sbuf, sent);
        }
    }
    switch (b->kind) {
    case CK_BCAST: {
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
        break;
    }
    /* gather, scatter: plain MPI_BYTE counts (a block fits an int: checked
     * before the sweep), so MPI's time holds no datatype made per call. */
    case CK_GATHER:
        err = MPI_Gather(b->shost, (int)b->bytes, MPI_BYTE, b->rhost, (int)b->bytes, MPI_BYTE, b->root, o->mpi);
        break;
    case CK_SCATTER:
        err = MPI_Scatter(b->shost, (int)b->bytes, MPI_BYTE, b->rhost, (int)b->bytes, MPI_BYTE, b->root, o->mpi);
        break;
    default: {
        MPI_Datatype blk;
        MPI_Type_contiguous((int)b->bytes, MPI_BYTE, &blk);
        MPI_Type_commit(&blk);
        err = MPI_Allgather(b->shost, 1, blk, b->rhost, 1, blk, o->mpi);
        MPI_Type_free(&blk);
        break;
    }
    }
    if (err != MPI_SUCCESS) {
        static const char *const mpi_name[] = { "Allgather", "Bcast", "Gather", "Scatter" };
        fprintf(stderr, "weft-perf rank %d: MPI_%s failed (%d)\n", o->rank, mpi_name[b->kind], err);
        return 1;
    }
    /* bcast's root received nothing: its data is already in rbuf. */
    if (staged && got && (b->kind != CK_BCAST || o->rank != b->root))
        perf_buf_from_host(o, b->rbuf, b->rhost, got);
    return 0;
}

/* A checked call with a fresh pattern; returns wrong bytes (>= 0) or -1. */
static long long coll_checked_call(struct coll_bench *b, uint64_t iter, int lib)
{
    coll_fill(b, iter, lib);
    /* bcast's fill already cleared the receivers' rbuf. */
    size_t got = recv_bytes(b, b->bytes);
    if (b->kind != CK_BCAST && got)
        perf_buf_set(b->o, b->rbuf, 0, got);
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

static int coll_run(const struct perf_opts *o, weft_comm_t *c, enum coll_kind kind)
{
    const int n = o->size;
    const int reps = o->reps > 0 ? o->reps : COLL_REPS_DEFAULT;
    size_t min_b, max_b;
    perf_sizes(o, 8, 16u << 20, &min_b, &max_b);
    struct coll_bench b = { .o = o, .c = c, .kind = kind, .root = o->root };

    if ((kind == CK_GATHER || kind == CK_SCATTER) && max_b > (size_t)INT_MAX) {
        if (o->rank == 0)
            fprintf(stderr, "weft-perf: -e %zu: MPI counts are int; at most %d bytes per rank\n", max_b, INT_MAX);
        return 1;
    }
    /* Only the buffers this rank uses: gather's result and scatter's n
     * blocks live at the root alone. */
    size_t max_send = send_bytes(&b, max_b), max_recv = recv_bytes(&b, max_b);
    b.sbuf = max_send ? perf_buf_alloc(o, max_send) : NULL;
    b.rbuf = max_recv ? perf_buf_alloc(o, max_recv) : NULL;
    b.shost = o->mpi_direct ? b.sbuf : max_send ? perf_alloc(max_send) : NULL;
    b.rhost = o->mpi_direct ? b.rbuf : max_recv ? perf_alloc(max_recv) : NULL;

    char title[1024];
    int len;
    const char *algo = o->algo ? o->algo : getenv("WEFT_ALLGATHER_ALGO");
    switch (kind) {
    case CK_BCAST:
        len = snprintf(title, sizeof title, "# bcast, root %d: weft_bcast vs MPI_Bcast, median of %d reps, "
                       "busbw = algbw\n", o->root, reps);
        break;
    case CK_GATHER:
    case CK_SCATTER:
        len = snprintf(title, sizeof title, "# %s, root %d: weft_%s vs MPI_%s, median of %d reps, "
                       "algbw = n*size/time, busbw = algbw*(n-1)/n\n", kind_name[kind], o->root,
                       kind_name[kind], kind == CK_GATHER ? "Gather" : "Scatter", reps);
        break;
    default:
        len = snprintf(title, sizeof title, "# allgather: weft_allgather (%s) vs MPI_Allgather, median of %d reps, "
                       "algbw = n*size/time, busbw = algbw*(n-1)/n\n",
                       algo && *algo ? algo : "selector", reps);
        break;
    }
    /* The column lines belong to the header: --csv prints neither. */
    if (len > 0 && (size_t)len < sizeof title)
        len += snprintf(title + len, sizeof title - (size_t)len, "# %10s %10s %11s %8s %8s %11s %8s %7s %7s\n",
                        kind == CK_BCAST ? "size(B)" : "size(B/rank)", "count(f32)", "weft(us)", "algbw", "busbw",
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
        size_t moved = moved_bytes(&b, bytes);
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
            double bus = kind == CK_BCAST ? 1.0 : (double)(n - 1) / (double)n;
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
            perf_report(o, kind_name[kind], bytes, res, 2, line);
        }
    }
out:
    free(times[0]);
    free(times[1]);
    if (!o->mpi_direct) {
        perf_free(b.rhost);
        perf_free(b.shost);
    }
    if (b.rbuf)
        perf_buf_free(o, b.rbuf);
    if (b.sbuf)
        perf_buf_free(o, b.sbuf);
    return rc;
}

int perf_allgather(const struct perf_opts *o, weft_comm_t *c)
{
    return coll_run(o, c, CK_ALLGATHER);
}

int perf_bcast(const struct perf_opts *o, weft_comm_t *c)
{
    return coll_run(o, c, CK_BCAST);
}

int perf_gather(const struct perf_opts *o, weft_comm_t *c)
{
    return coll_run(o, c, CK_GATHER);
}

int perf_scatter(const struct perf_opts *o, weft_comm_t *c)
{
    return coll_run(o, c, CK_SCATTER);
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
