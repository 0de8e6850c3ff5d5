/*
 * mpi-coll-perf: times MPI_Allgather, MPI_Bcast, MPI_Allreduce,
 * MPI_Alltoall, MPI_Reduce, MPI_Gather, MPI_Scatter and MPI_Alltoallv over a
 * range of sizes and checks every result exactly; and MPI_Barrier.
 *
 * A plain MPI program on purpose: it includes only mpi.h and knows nothing
 * of weft, so the same binary measures the MPI library alone and the MPI
 * library with a PMPI layer preloaded (bench/mpi/run.sh runs both).
 *
 * Conventions are nccl-tests' so the rows read alike:
 *   size     bytes of the larger buffer of one rank: allgather the receive
 *            buffer (n blocks), alltoall the send buffer (n blocks), gather
 *            the root's receive and scatter the root's send buffer (n
 *            blocks; nccl-tests has neither, the n-block rule kept),
 *            alltoallv the alltoall's (the mean send buffer: see below), bcast
 *            allreduce and reduce the message / vector; barrier 0
 *   count    elements in that buffer
 *   time     microseconds per call: per repeat, the slowest rank's mean over
 *            the timed iterations; the row is the median over repeats
 *   algbw    size / time (GB/s, 1e9 bytes)
 *   busbw    algbw x (n-1)/n (allgather, alltoall, gather, scatter, alltoallv),
 *            x 2(n-1)/n (allreduce), x 1 (bcast)
 *   #wrong   elements, summed over ranks and checks, that differ from the
 *            expected value; must be 0 (the exit status says so too)
 * Extra columns min/max: the fastest and slowest repeat (the noise).
 *
 * Alltoallv: the alltoall's layout with uneven blocks, so that a library
 * which assumed equal blocks or mirrored its own layout onto its peers'
 * would misplace data. blk is the alltoall's elements per block at that
 * size (size / (n x ts), sizes rounded as the alltoall's); rank s sends
 * rank d c(s,d) = blk/2 + blk x ((s + 2d) % 3) / 2 elements (integer
 * arithmetic: about blk/2, blk or 3blk/2; 0 where blk is 1 and the remainder
 * 0 or 1). Send blocks lie without gaps in destination order, receive blocks
 * without gaps in source order (rank r receives c(s,r) from s). As d (or s)
 * steps by one, (s + 2d) % 3 changes, so from blk = 2 on neighbouring blocks
 * differ in size on the send and the receive side alike, and a rank's
 * receive layout is not its send layout; either total is at most 3/2 of the
 * alltoall's.
 *
 * Checks: each rank's data is a known pattern of small integers that depends
 * on the sender, the destination block, the element and the repeat, so a
 * block in the wrong place, a stale result from an earlier repeat or a
 * missing write all show. Per size and repeat the receive buffer is poisoned
 * and checked after the first call, and poisoned again before the timed loop
 * and checked after its last call (so the timed calls must write too).
 * Reductions are float or integer sums of small integers: exact in any order.
 */
#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll {
    C_ALLGATHER, C_BCAST, C_ALLREDUCE, C_ALLTOALL, C_REDUCE, C_GATHER, C_SCATTER, C_ALLTOALLV, C_BARRIER, C_N
};
static const char *const coll_names[C_N] = {"allgather", "bcast",   "allreduce", "alltoall", "reduce",
                                            "gather",    "scatter", "alltoallv", "barrier"};

/* The collectives whose size is n blocks of whole elements (alltoallv: the
 * alltoall's blocks, from which its uneven ones are sized). */
static int blocked(enum coll c)
{
    return c == C_ALLGATHER || c == C_ALLTOALL || c == C_GATHER || c == C_SCATTER || c == C_ALLTOALLV;
}

/* Elements rank src sends rank dst in alltoallv (the top): blk/2, blk or
 * about 3blk/2, a different one for the next dst and for the next src. */
static size_t vcount(int src, int dst, size_t blk)
{
    return blk / 2 + blk * (size_t)((src + 2 * dst) % 3) / 2;
}

enum dtype { D_INT8, D_INT32, D_FLOAT, D_DOUBLE, D_N };
static const char *const dtype_names[D_N] = {"int8", "int32", "float", "double"};
static const size_t dtype_sizes[D_N] = {1, 4, 4, 8};

/* The poison a receive buffer holds before a call: no pattern value is
 * negative. */
#define POISON (-1L)

struct opts {
    int    colls[C_N];   /* 1: run it, in the order of enum coll */
    size_t min_bytes;
    size_t max_bytes;
    size_t factor;
    int    iters;        /* 0: from the size (auto_iters) */
    int    warmup;       /* 0: from the iterations (auto_warmup) */
    int    repeats;
    int    root;
    enum dtype dtype;
    int    sync;         /* -s: an MPI_Barrier between timed calls, each call timed alone */
};

static int rank, nranks;

static MPI_Datatype mpi_type(enum dtype d)
{
    switch (d) {
    case D_INT8: return MPI_INT8_T;
    case D_INT32: return MPI_INT32_T;
    case D_FLOAT: return MPI_FLOAT;
    default: return MPI_DOUBLE;
    }
}

static void store(enum dtype d, void *buf, size_t i, long v)
{
    switch (d) {
    case D_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case D_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case D_FLOAT: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = (double)v; break;
    }
}

/* Exact for every value the patterns produce (integers well below 2^24);
 * anything else (NaN, a fraction) reads as a value no pattern makes. */
static long load(enum dtype d, const void *buf, size_t i)
{
    double x;
    switch (d) {
    case D_INT8: return ((const int8_t *)buf)[i];
    case D_INT32: return ((const int32_t *)buf)[i];
    case D_FLOAT: x = ((const float *)buf)[i]; break;
    default: x = ((const double *)buf)[i]; break;
    }
    if (!(x >= -2.0 && x < 16777216.0) || x != (double)(long)x)
        return LONG_MIN;
    return (long)x;
}

/* Largest pattern value + 1 a data-movement element may take. */
static long move_range(enum dtype d)
{
    return d == D_INT8 ? 127 : 1L << 20;
}

/* Element i of the block that src sends to dst (bcast and allgather send
 * one block to all: dst = 0), in repeat rep. Mixing all four makes a block
 * at the wrong offset, from the wrong rank or from another repeat differ. */
static long move_val(enum dtype d, int src, int dst, size_t i, int rep)
{
    unsigned long h = (unsigned long)src * 2654435761UL + (unsigned long)dst * 40503UL +
                      (unsigned long)i * 7UL + (unsigned long)rep * 977UL;
    return (long)(h % (unsigned long)move_range(d));
}

/* Element i of rank src's allreduce input in repeat rep. Small enough that
 * the sum over nranks ranks is exact and fits the type (int8: <= 127). */
static long red_val(enum dtype d, int src, size_t i, int rep)
{
    long m = d == D_INT8 ? 127 / nranks : 1000; /* values 0..m */
    unsigned long h = (unsigned long)src * 13UL + (unsigned long)i * 3UL + (unsigned long)rep * 5UL;
    return (long)(h % (unsigned long)(m + 1));
}

static long red_sum(enum dtype d, size_t i, int rep)
{
    long s = 0;
    for (int r = 0; r < nranks; r++)
        s += red_val(d, r, i, rep);
    return s;
}

/* One collective at one size: buffers and the per-call counts. */
struct call {
    enum coll coll;
    enum dtype dtype;
    MPI_Datatype type;
    size_t ts;          /* bytes per element */
    size_t size;        /* nccl-tests' size (bytes), see the top */
    size_t count;       /* size / ts */
    size_t blk;         /* elements per block: allgather/alltoall/gather/scatter per peer;
                           alltoallv the alltoall's, its blocks sized from it (vcount) */
    size_t plen;        /* elements of rbuf that poison writes and check reads */
    void  *sbuf, *rbuf; /* bcast: rbuf only */
    int    root;
    /* alltoallv: the MPI call's arrays, n entries each, and the elements
     * this rank receives in all */
    int   *scounts, *sdispls, *rcounts, *rdispls;
    size_t vrecv;
};

/* The size actually run for a requested one: allgather and alltoall move n
 * equal blocks of whole elements, so round down to a multiple of n x ts, and
 * up to one element per block where that gives 0 (alltoallv: the alltoall's,
 * so its rows line up with the alltoall's). */
static size_t effective_size(enum coll c, size_t want, size_t ts)
{
    size_t unit = ts;
    if (blocked(c))
        unit = ts * (size_t)nranks;
    size_t s = want / unit * unit;
    return s ? s : unit;
}

static void fill(struct call *k, int rep)
{
    size_t n = (size_t)nranks;
    switch (k->coll) {
    case C_ALLGATHER:
    case C_GATHER:
        for (size_t i = 0; i < k->blk; i++)
            store(k->dtype, k->sbuf, i, move_val(k->dtype, rank, 0, i, rep));
        break;
    case C_SCATTER:
        if (rank == k->root)
            for (size_t p = 0; p < n; p++)
                for (size_t i = 0; i < k->blk; i++)
                    store(k->dtype, k->sbuf, p * k->blk + i, move_val(k->dtype, rank, (int)p, i, rep));
        break;
    case C_BCAST:
        if (rank == k->root)
            for (size_t i = 0; i < k->count; i++)
                store(k->dtype, k->rbuf, i, move_val(k->dtype, k->root, 0, i, rep));
        break;
    case C_ALLREDUCE:
    case C_REDUCE:
        for (size_t i = 0; i < k->count; i++)
            store(k->dtype, k->sbuf, i, red_val(k->dtype, rank, i, rep));
        break;
    case C_ALLTOALL:
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < k->blk; i++)
                store(k->dtype, k->sbuf, p * k->blk + i, move_val(k->dtype, rank, (int)p, i, rep));
        break;
    case C_ALLTOALLV:
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < (size_t)k->scounts[p]; i++)
                store(k->dtype, k->sbuf, (size_t)k->sdispls[p] + i, move_val(k->dtype, rank, (int)p, i, rep));
        break;
    default:
        break;
    }
}

static void poison(struct call *k)
{
    if ((k->coll == C_BCAST && rank == k->root) || k->coll == C_BARRIER)
        return; /* the root's buffer is the source; a barrier has none */
    for (size_t i = 0; i < k->plen; i++)
        store(k->dtype, k->rbuf, i, POISON);
}

/* Elements of this rank's result that differ from the expected ones. */
static long long check(const struct call *k, int rep)
{
    long long wrong = 0;
    switch (k->coll) {
    case C_ALLGATHER:
        for (size_t b = 0; b < (size_t)nranks; b++)
            for (size_t i = 0; i < k->blk; i++)
                wrong += load(k->dtype, k->rbuf, b * k->blk + i) !=
                         move_val(k->dtype, (int)b, 0, i, rep);
        break;
    case C_BCAST:
        for (size_t i = 0; i < k->count; i++)
            wrong += load(k->dtype, k->rbuf, i) != move_val(k->dtype, k->root, 0, i, rep);
        break;
    case C_ALLREDUCE:
        for (size_t i = 0; i < k->count; i++)
            wrong += load(k->dtype, k->rbuf, i) != red_sum(k->dtype, i, rep);
        break;
    case C_REDUCE:
        /* The root's result; the other ranks' receive buffers stay as
         * poisoned (MPI does not write them). */
        for (size_t i = 0; i < k->count; i++)
            wrong += load(k->dtype, k->rbuf, i) != (rank == k->root ? red_sum(k->dtype, i, rep) : POISON);
        break;
    case C_ALLTOALL:
        for (size_t b = 0; b < (size_t)nranks; b++)
            for (size_t i = 0; i < k->blk; i++)
                wrong += load(k->dtype, k->rbuf, b * k->blk + i) !=
                         move_val(k->dtype, (int)b, rank, i, rep);
        break;
    case C_GATHER:
        /* The root's n blocks; the other ranks' receive buffers stay as
         * poisoned (not significant there: MPI does not write them). */
        for (size_t b = 0; b < (size_t)nranks; b++)
            for (size_t i = 0; i < k->blk; i++)
                wrong += load(k->dtype, k->rbuf, b * k->blk + i) !=
                         (rank == k->root ? move_val(k->dtype, (int)b, 0, i, rep) : POISON);
        break;
    case C_SCATTER:
        /* This rank's block from the root; the rest of the buffer
         * untouched. */
        for (size_t i = 0; i < k->count; i++)
            wrong += load(k->dtype, k->rbuf, i) !=
                     (i < k->blk ? move_val(k->dtype, k->root, rank, i, rep) : POISON);
        break;
    case C_ALLTOALLV:
        /* Each sender's block at its displacement; past the last one the
         * buffer untouched (a block written at the wrong offset or too long
         * shows there or in a neighbour). */
        for (size_t b = 0; b < (size_t)nranks; b++)
            for (size_t i = 0; i < (size_t)k->rcounts[b]; i++)
                wrong += load(k->dtype, k->rbuf, (size_t)k->rdispls[b] + i) !=
                         move_val(k->dtype, (int)b, rank, i, rep);
        for (size_t i = k->vrecv; i < k->plen; i++)
            wrong += load(k->dtype, k->rbuf, i) != POISON;
        break;
    default:
        break;
    }
    return wrong;
}

static void run_once(const struct call *k)
{
    int blk = (int)k->blk, cnt = (int)k->count;
    switch (k->coll) {
    case C_ALLGATHER:
        MPI_Allgather(k->sbuf, blk, k->type, k->rbuf, blk, k->type, MPI_COMM_WORLD);
        break;
    case C_BCAST:
        MPI_Bcast(k->rbuf, cnt, k->type, k->root, MPI_COMM_WORLD);
        break;
    case C_ALLREDUCE:
        MPI_Allreduce(k->sbuf, k->rbuf, cnt, k->type, MPI_SUM, MPI_COMM_WORLD);
        break;
    case C_ALLTOALL:
        MPI_Alltoall(k->sbuf, blk, k->type, k->rbuf, blk, k->type, MPI_COMM_WORLD);
        break;
    case C_REDUCE:
        MPI_Reduce(k->sbuf, k->rbuf, cnt, k->type, MPI_SUM, k->root, MPI_COMM_WORLD);
        break;
    case C_GATHER:
        MPI_Gather(k->sbuf, blk, k->type, k->rbuf, blk, k->type, k->root, MPI_COMM_WORLD);
        break;
    case C_SCATTER:
        MPI_Scatter(k->sbuf, blk, k->type, k->rbuf, blk, k->type, k->root, MPI_COMM_WORLD);
        break;
    case C_ALLTOALLV:
        MPI_Alltoallv(k->sbuf, k->scounts, k->sdispls, k->type, k->rbuf, k->rcounts, k->rdispls, k->type,
                      MPI_COMM_WORLD);
        break;
    case C_BARRIER:
        MPI_Barrier(MPI_COMM_WORLD);
        break;
    default:
        break;
    }
}

/* Iterations from the size when -n is not given: about 64 MiB moved per
 * repeat, between 5 and 1000 calls (small sizes: enough calls to rise above
 * the clock; large ones: a bounded run time on a loaded machine). */
static int auto_iters(size_t size)
{
    size_t it = ((size_t)64 << 20) / (size ? size : 1);
    if (it < 5)
        it = 5;
    if (it > 1000)
        it = 1000;
    return (int)it;
}

/* Warmup calls when -w is not given: a fifth of the timed ones, 2 to 5 (the
 * first call of a size may set things up; 5 full calls at 16 MiB on an
 * oversubscribed machine would cost more than they settle). */
static int auto_warmup(int iters)
{
    int w = iters / 5;
    return w < 2 ? 2 : w > 5 ? 5 : w;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double busbw_factor(enum coll c)
{
    double n = nranks;
    switch (c) {
    case C_ALLGATHER:
    case C_ALLTOALL:
    case C_GATHER:
    case C_SCATTER:
    case C_ALLTOALLV: return (n - 1) / n;
    case C_ALLREDUCE: return 2 * (n - 1) / n;
    default: return 1;
    }
}

/* Runs one size of one collective; returns its #wrong (the same on all ranks).
 * vec: 4 x n ints, alltoallv's counts and displacements. */
static long long run_size(const struct opts *o, enum coll c, size_t size, void *sbuf, void *rbuf,
                          int *vec, double *times)
{
    size_t n = (size_t)nranks;
    struct call k = {
        .coll = c, .dtype = o->dtype, .type = mpi_type(o->dtype), .ts = dtype_sizes[o->dtype],
        .size = size, .sbuf = sbuf, .rbuf = rbuf, .root = o->root,
        .scounts = vec, .sdispls = vec + n, .rcounts = vec + 2 * n, .rdispls = vec + 3 * n,
    };
    k.count = size / k.ts;
    k.blk = blocked(c) ? k.count / n : k.count;
    k.plen = k.count;
    if (c == C_ALLTOALLV) {
        size_t soff = 0, roff = 0;
        for (size_t p = 0; p < n; p++) {
            k.scounts[p] = (int)vcount(rank, (int)p, k.blk);
            k.sdispls[p] = (int)soff;
            soff += (size_t)k.scounts[p];
            k.rcounts[p] = (int)vcount((int)p, rank, k.blk);
            k.rdispls[p] = (int)roff;
            roff += (size_t)k.rcounts[p];
        }
        k.vrecv = roff;
        /* Poisoned and checked: the most any rank receives, so that a
         * write past this rank's last block shows. */
        k.plen = k.count + k.count / 2;
    }
    int iters = o->iters ? o->iters : auto_iters(size);
    int warmup = o->warmup ? o->warmup : auto_warmup(iters);
    long long wrong = 0;

    for (int rep = 0; rep < o->repeats; rep++) {
        fill(&k, rep);
        poison(&k);
        run_once(&k);
        wrong += check(&k, rep);
        for (int w = 1; w < warmup; w++)
            run_once(&k);
        poison(&k);

        MPI_Barrier(MPI_COMM_WORLD);
        double local = 0, slowest = 0;
        if (o->sync) {
            /* As OSU's latency tests: each call timed alone, the ranks
             * lined up by MPI_Barrier (not timed) before the next --
             * so what a barrier's exit leaves behind (ranks released at
             * different times, a sleeping thread) shows in the call. */
            for (int it = 0; it < iters; it++) {
                double t = MPI_Wtime();
                run_once(&k);
                local += MPI_Wtime() - t;
                MPI_Barrier(MPI_COMM_WORLD);
            }
        } else {
            double t0 = MPI_Wtime();
            for (int it = 0; it < iters; it++)
                run_once(&k);
            local = MPI_Wtime() - t0;
        }
        local /= iters;
        wrong += check(&k, rep);
        /* The harness's own bookkeeping, not a timed call: straight to MPI
         * (a preloaded drop-in leaves a float MAX to MPI anyway, and its
         * stats then count only the collectives under test). */
        PMPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        times[rep] = slowest;
    }
    long long all = 0;
    MPI_Allreduce(&wrong, &all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);

    if (rank == 0) {
        qsort(times, (size_t)o->repeats, sizeof *times, cmp_double);
        int r = o->repeats;
        double med = r % 2 ? times[r / 2] : (times[r / 2 - 1] + times[r / 2]) / 2;
        double algbw = med > 0 ? (double)size / med / 1e9 : 0;
        printf("%-9s %10zu %10zu %6s %5s %4d %11.2f %8.3f %8.3f %7lld %11.2f %11.2f %6d\n",
               coll_names[c], size, k.count, dtype_names[o->dtype],
               c == C_ALLREDUCE || c == C_REDUCE ? "sum" : "none", c == C_BCAST || c == C_REDUCE || c == C_GATHER || c == C_SCATTER ? o->root : -1, med * 1e6, algbw,
               algbw * busbw_factor(c), all, times[0] * 1e6, times[r - 1] * 1e6, iters);
        fflush(stdout);
    }
    return all;
}

/* "64", "64k", "1M", "16MiB": bytes. */
static int parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-')
        return -1;
    unsigned long long mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ULL << 10; end++; break;
    case 'm': case 'M': mul = 1ULL << 20; end++; break;
    case 'g': case 'G': mul = 1ULL << 30; end++; break;
    default: break;
    }
    if (mul > 1 && (*end == 'i' || *end == 'I') && (end[1] == 'b' || end[1] == 'B'))
        end += 2;
    else if (mul > 1 && (*end == 'b' || *end == 'B'))
        end++;
    if (*end || (v && mul > ULLONG_MAX / v))
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int parse_int(const char *s, int lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > INT_MAX)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_colls(const char *s, int *on)
{
    memset(on, 0, sizeof(int) * C_N);
    while (*s) {
        size_t len = strcspn(s, ",");
        int found = 0;
        if (len == 3 && strncmp(s, "all", 3) == 0) {
            for (int c = 0; c < C_N; c++)
                on[c] = 1;
            found = 1;
        }
        for (int c = 0; c < C_N && !found; c++)
            if (strlen(coll_names[c]) == len && strncmp(coll_names[c], s, len) == 0)
                on[c] = found = 1;
        if (!found)
            return -1;
        s += len;
        if (*s == ',')
            s++;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpi-coll-perf [-c COLLS] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
            "                     [-r REPEATS] [-d TYPE] [-R ROOT]\n"
            "  -c  collectives, comma separated: allgather,bcast,allreduce,alltoall,reduce,gather,\n"
            "      scatter,alltoallv,barrier, or all (default: the first four; barrier runs once,\n"
            "      as size 0)\n"
            "  -b  smallest size, bytes, k/M/G suffixes (8)     -e  largest size (16M)\n"
            "  -f  size factor (2)\n"
            "  -n  timed iterations per repeat (0: from the size, 64 MiB moved, 5..1000)\n"
            "  -w  warmup calls per repeat, the first one checked (0: iterations / 5, 2..5)\n"
            "  -r  repeats; the row is their median (5)\n"
            "  -d  element type: int8, int32, float, double (float)\n"
            "  -R  bcast, reduce, gather and scatter root (0)\n"
            "  -s 1  an MPI_Barrier (not timed) after every timed call, as OSU's tests\n"
            "Sizes as nccl-tests: allgather, alltoall, gather, scatter the n-block buffer, else the message.\n"
            "alltoallv: size, count and busbw as the alltoall's (size: the mean send buffer), blocks\n"
            "uneven: with blk = size / (n x element bytes), rank s sends rank d blk/2 + blk*((s+2d)%%3)/2\n"
            "elements; blocks packed without gaps, by destination (send) and by source (receive).\n"
            "Exit status 1 if any element was wrong.\n");
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){
        .colls = {1, 1, 1, 1, 0, 0, 0, 0, 0}, .min_bytes = 8, .max_bytes = (size_t)16 << 20, .factor = 2,
        .iters = 0, .warmup = 0, .repeats = 5, .root = 0, .dtype = D_FLOAT,
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            return 1;
        if (a[0] != '-' || !a[1] || a[2] || !v) {
            if (rank == 0)
                fprintf(stderr, "mpi-coll-perf: unknown or incomplete option '%s'\n", a);
            return -1;
        }
        switch (a[1]) {
        case 'c': bad = parse_colls(v, o->colls); break;
        case 'b': bad = parse_bytes(v, &o->min_bytes); break;
        case 'e': bad = parse_bytes(v, &o->max_bytes); break;
        case 'f': bad = parse_bytes(v, &o->factor) || o->factor < 2; break;
        case 'n': bad = parse_int(v, 0, &o->iters); break;
        case 'w': bad = parse_int(v, 0, &o->warmup); break;
        case 'r': bad = parse_int(v, 1, &o->repeats); break;
        case 'R': bad = parse_int(v, 0, &o->root) || o->root >= nranks; break;
        case 's': bad = parse_int(v, 0, &o->sync) || o->sync > 1; break;
        case 'd':
            bad = 1;
            for (int d = 0; d < D_N; d++)
                if (strcmp(v, dtype_names[d]) == 0)
                    o->dtype = (enum dtype)d, bad = 0;
            break;
        default:
            bad = 1;
        }
        if (bad) {
            if (rank == 0)
                fprintf(stderr, "mpi-coll-perf: bad value '%s' for %s\n", v, a);
            return -1;
        }
        i++;
    }
    if (o->min_bytes == 0 || o->max_bytes < o->min_bytes) {
        if (rank == 0)
            fprintf(stderr, "mpi-coll-perf: need 0 < -b <= -e\n");
        return -1;
    }
    /* Counts are ints in the MPI calls; alltoallv's displacements reach
     * its largest total, 3/2 of the count. */
    size_t most = o->max_bytes / dtype_sizes[o->dtype];
    if (o->colls[C_ALLTOALLV])
        most += most / 2;
    if (most > INT_MAX) {
        if (rank == 0)
            fprintf(stderr, "mpi-coll-perf: -e too large for int counts\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    struct opts o;
    int prc = parse_opts(argc, argv, &o);
    if (prc != 0) {
        if (rank == 0)
            usage(prc > 0 ? stdout : stderr);
        MPI_Finalize();
        return prc > 0 ? 0 : 2;
    }

    /* The largest buffer any run needs: allgather and alltoall's sizes may
     * round up to one element per block. Alltoallv's totals, send and
     * receive, are n blocks of at most blk/2 + blk elements: within the
     * alltoall's size E plus E/2 (both integers, so floor(3E/2) bounds
     * them), which is also what its poison covers. */
    size_t ts = dtype_sizes[o.dtype];
    size_t cap = effective_size(C_ALLGATHER, o.max_bytes, ts);
    if (cap < o.max_bytes)
        cap = o.max_bytes;
    if (o.colls[C_ALLTOALLV]) {
        size_t v = effective_size(C_ALLTOALLV, o.max_bytes, ts);
        if (cap < v + v / 2)
            cap = v + v / 2;
    }
    void *sbuf = malloc(cap), *rbuf = malloc(cap);
    double *times = malloc(sizeof(double) * (size_t)o.repeats);
    int *vec = malloc(sizeof(int) * 4 * (size_t)nranks);
    int ok = sbuf && rbuf && times && vec, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        fprintf(stderr, "mpi-coll-perf: rank %d: out of memory for 2 x %zu bytes\n", rank, cap);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(sbuf, 0, cap);
    memset(rbuf, 0, cap);

    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
        int len = 0;
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, "\n,")] = '\0';
        printf("# mpi-coll-perf: np %d, %s, type %s, repeats %d, iters %s, warmup %s\n", nranks, lib,
               dtype_names[o.dtype], o.repeats, o.iters ? "fixed" : "auto", o.warmup ? "fixed" : "auto");
        printf("# time: us per call, slowest rank, median over repeats; min/max: fastest/slowest repeat\n");
        printf("%-9s %10s %10s %6s %5s %4s %11s %8s %8s %7s %11s %11s %6s\n", "# coll", "size", "count",
               "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong", "min(us)", "max(us)",
               "iters");
        fflush(stdout);
    }

    long long wrong = 0;
    for (int c = 0; c < C_N; c++) {
        if (!o.colls[c])
            continue;
        size_t prev = 0;
        if (c == C_BARRIER) {
            wrong += run_size(&o, C_BARRIER, 0, sbuf, rbuf, vec, times);
            continue;
        }
        for (size_t want = o.min_bytes; want <= o.max_bytes;) {
            size_t size = effective_size((enum coll)c, want, ts);
            if (size != prev) /* small sizes may round to the same one */
                wrong += run_size(&o, (enum coll)c, size, sbuf, rbuf, vec, times);
            prev = size;
            if (want > SIZE_MAX / o.factor)
                break;
            want *= o.factor;
        }
    }
    if (rank == 0) {
        printf("# total #wrong: %lld%s\n", wrong, wrong ? "  (DATA CHECK FAILED)" : "");
        fflush(stdout);
    }

    free(vec);
    free(times);
    free(rbuf);
    free(sbuf);
    MPI_Finalize();
    return wrong ? 1 : 0;
}
