/*
 * weft-perf exchange: many messages between random pairs of ranks, the
 * pattern of an irregular application (a graph or particle code), and the
 * issue's oversubscription test (np 16 on 2 cores), weft against MPI.
 *
 * The pattern: every rank sends -n messages (default 10000); message i of
 * rank r goes to a random rank other than r and has a random size between
 * -b and -e (default 8 B .. 64 KiB; log-uniform: every power-of-two range is
 * equally likely, so small and large messages both matter). One PRNG,
 * seeded with -s, draws the whole pattern in the same order on every rank:
 * each rank knows, without asking, what it sends and what it receives from
 * whom, in which order and of which size, so it posts every receive with
 * the exact source and size, and a message that arrives from the wrong
 * sender, of the wrong size or with the wrong bytes is counted.
 *
 * The window: messages go in rounds of -w (default 64) per rank. In round k
 * a rank posts the receives of every message that any rank sends in its
 * round k (known from the pattern), then fills and posts its own -w sends,
 * then waits for all of them (weft_waitall / MPI_Waitall). Sends in flight
 * are bounded by -w, receives by the pattern (about -w on average), and
 * since every send's receive is posted in the same round no rank can wait
 * for a peer that waits for it in turn, at any message size (a sliding
 * window where each rank waits for its own oldest requests could deadlock
 * on rendezvous-sized messages).
 *
 * The payload of message i from rank s is the perf_fill pattern of a seed
 * of (i, size, s, run): every run of every library has its own data, so a
 * buffer left over from an earlier run never passes. Filling and verifying
 * is inside the timed region, the same work for both libraries.
 *
 * Time: whole runs, the slowest rank's (all start after a barrier), weft
 * and MPI alternating which goes first; the table shows the median of -r
 * runs (default 5) and weft/MPI (below 1.0 weft is faster).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "perf.h"

enum { LIB_WEFT = 0, LIB_MPI = 1 };

#define EXCHANGE_MSGS_DEFAULT  10000
#define EXCHANGE_REPS_DEFAULT  5
#define EXCHANGE_MIN_DEFAULT   8
#define EXCHANGE_MAX_DEFAULT   ((size_t)64 << 10)
#define EXCHANGE_TAG           7

/* One message as this rank sees it. */
struct xmsg {
    int    peer;    /* destination (a send) or source (a receive) */
    int    index;   /* the sender's message number, 0 .. nmsg-1 */
    size_t bytes;
    size_t off;     /* offset in the round's send or receive buffer */
};

struct xplan {
    int          nmsg, win, rounds;
    struct xmsg *sends;          /* [nmsg]: round k = sends[k*win .. k*win+win) */
    struct xmsg *recvs;          /* [nrecv], grouped by round */
    int          nrecv, cap;
    int         *recv_first;     /* [rounds + 1]: round k = recvs[recv_first[k] .. recv_first[k+1]) */
    size_t       sbuf_bytes;     /* the largest round's sends, packed */
    size_t       rbuf_bytes;     /* the largest round's receives, packed */
    int          max_recvs;      /* most receives in one round */
    unsigned long long total_bytes;  /* payload of all ranks in one run */
};

/* splitmix64: small, fast, and the same sequence everywhere for a seed. */
static uint64_t xrand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int floor_log2(size_t v)
{
    int b = 0;
    while (v > 1) {
        v >>= 1;
        b++;
    }
    return b;
}

/* A size in [lo, hi]: a power-of-two range first, uniformly, then a size in
 * it, uniformly. Integer arithmetic only, so every rank draws the same. */
static size_t draw_size(uint64_t *state, size_t lo, size_t hi)
{
    if (lo >= hi)
        return lo;
    int lo_b = floor_log2(lo ? lo : 1), hi_b = floor_log2(hi - 1);
    int b = lo_b + (int)(xrand(state) % (uint64_t)(hi_b - lo_b + 1));
    size_t from = (size_t)1 << b, to = b == hi_b ? hi : ((size_t)2 << b) - 1;
    if (from < lo)
        from = lo;
    if (to > hi)
        to = hi;
    return from + (size_t)(xrand(state) % (uint64_t)(to - from + 1));
}

static void plan_free(struct xplan *p)
{
    free(p->sends);
    free(p->recvs);
    free(p->recv_first);
    memset(p, 0, sizeof *p);
}

/* Draws the whole pattern (every rank's messages, in the order message 0 of
 * ranks 0..np-1, message 1 of ranks 0..np-1, ...) and keeps this rank's
 * sends and receives. Receives come out ordered by message number, so per
 * sender in the order it sends them (which is how MPI and weft match
 * messages of one source and tag), and grouped by round. Returns 0, or 1 when
 * memory ran out (message printed). */
static int plan_build(const struct perf_opts *o, int nmsg, int win, size_t lo, size_t hi, struct xplan *p)
{
    const int me = o->rank, np = o->size;
    memset(p, 0, sizeof *p);
    p->nmsg = nmsg;
    p->win = win;
    p->rounds = (nmsg + win - 1) / win;
    p->sends = calloc((size_t)nmsg, sizeof *p->sends);
    p->recv_first = calloc((size_t)p->rounds + 1, sizeof *p->recv_first);
    p->cap = nmsg + 16;
    p->recvs = malloc((size_t)p->cap * sizeof *p->recvs);
    if (!p->sends || !p->recv_first || !p->recvs)
        goto oom;

    uint64_t state = o->seed;
    size_t soff = 0, roff = 0;
    int round_recvs = 0;
    for (int i = 0; i < nmsg; i++) {
        if (i % win == 0) {
            /* A new round: its buffers start at offset 0 again. */
            int k = i / win;
            p->recv_first[k] = p->nrecv;
            soff = roff = 0;
            round_recvs = 0;
        }
        for (int r = 0; r < np; r++) {
            int dest = (int)(xrand(&state) % (uint64_t)(np - 1));
            if (dest >= r)
                dest++;          /* anyone but r itself */
            size_t bytes = draw_size(&state, lo, hi);
            p->total_bytes += bytes;
            if (r == me) {
                p->sends[i] = (struct xmsg){ dest, i, bytes, soff };
                soff += bytes;
                if (soff > p->sbuf_bytes)
                    p->sbuf_bytes = soff;
            }
            if (dest == me) {
                if (p->nrecv == p->cap) {
                    int cap = p->cap * 2;
                    struct xmsg *grown = realloc(p->recvs, (size_t)cap * sizeof *grown);
                    if (!grown)
                        goto oom;
                    p->recvs = grown;
                    p->cap = cap;
                }
                p->recvs[p->nrecv++] = (struct xmsg){ r, i, bytes, roff };
                roff += bytes;
                if (roff > p->rbuf_bytes)
                    p->rbuf_bytes = roff;
                if (++round_recvs > p->max_recvs)
                    p->max_recvs = round_recvs;
            }
        }
    }
    p->recv_first[p->rounds] = p->nrecv;
    return 0;
oom:
    fprintf(stderr, "weft-perf rank %d: out of memory for the exchange pattern (%d messages)\n", me, nmsg);
    plan_free(p);
    return 1;
}

struct xrun {
    const struct perf_opts *o;
    weft_comm_t     *c;
    const struct xplan *p;
    unsigned char   *sbuf, *rbuf;
    weft_request_t **wreqs;     /* [win + max_recvs] */
    weft_status_t   *wst;
    MPI_Request     *mreqs;
    MPI_Status      *mst;
};

/* The data of message `index` from rank `src` in run `run`. */
static uint64_t msg_seed(int src, int index, size_t bytes, uint64_t run)
{
    return perf_seed((uint64_t)index, bytes, (uint64_t)src, run);
}

/* Rounds [first, first + n) through lib; bad bytes are added to *wrong.
 * Returns 0, or 1 after a failed call was reported. */
static int run_rounds(struct xrun *x, int lib, uint64_t run, int first, int n, size_t *wrong)
{
    const struct perf_opts *o = x->o;
    const struct xplan *p = x->p;
    for (int k = first; k < first + n && k < p->rounds; k++) {
        const int s0 = k * p->win, s1 = s0 + p->win < p->nmsg ? s0 + p->win : p->nmsg;
        const int r0 = p->recv_first[k], r1 = p->recv_first[k + 1];
        int nreq = 0;
        /* Receives first: a message that arrives early then lands in its
         * buffer rather than in the library's unexpected queue. */
        for (int j = r0; j < r1; j++) {
            const struct xmsg *m = &p->recvs[j];
            unsigned char *buf = x->rbuf + m->off;
            if (lib == LIB_WEFT) {
                int err = weft_irecv(x->c, buf, m->bytes, m->peer, EXCHANGE_TAG, &x->wreqs[nreq]);
                if (err)
                    return perf_weft_fail(o, x->c, "weft_irecv", err);
            } else if (MPI_Irecv(buf, (int)m->bytes, MPI_BYTE, m->peer, EXCHANGE_TAG, o->mpi, &x->mreqs[nreq]) !=
                       MPI_SUCCESS) {
                fprintf(stderr, "weft-perf rank %d: MPI_Irecv from %d failed\n", o->rank, m->peer);
                return 1;
            }
            nreq++;
        }
        for (int i = s0; i < s1; i++) {
            const struct xmsg *m = &p->sends[i];
            unsigned char *buf = x->sbuf + m->off;
            perf_fill(buf, m->bytes, msg_seed(o->rank, m->index, m->bytes, run));
            if (lib == LIB_WEFT) {
                int err = weft_isend(x->c, buf, m->bytes, m->peer, EXCHANGE_TAG, &x->wreqs[nreq]);
                if (err)
                    return perf_weft_fail(o, x->c, "weft_isend", err);
            } else if (MPI_Isend(buf, (int)m->bytes, MPI_BYTE, m->peer, EXCHANGE_TAG, o->mpi, &x->mreqs[nreq]) !=
                       MPI_SUCCESS) {
                fprintf(stderr, "weft-perf rank %d: MPI_Isend to %d failed\n", o->rank, m->peer);
                return 1;
            }
            nreq++;
        }
        if (lib == LIB_WEFT) {
            int err = weft_waitall((size_t)nreq, x->wreqs, x->wst);
            if (err)
                return perf_weft_fail(o, x->c, "weft_waitall", err);
        } else if (MPI_Waitall(nreq, x->mreqs, x->mst) != MPI_SUCCESS) {
            fprintf(stderr, "weft-perf rank %d: MPI_Waitall (round %d) failed\n", o->rank, k);
            return 1;
        }
        /* The receives are requests 0 .. r1-r0 of the round. */
        for (int j = r0; j < r1; j++) {
            const struct xmsg *m = &p->recvs[j];
            size_t got = 0;
            int src = -1;
            if (lib == LIB_WEFT) {
                got = x->wst[j - r0].bytes;
                src = x->wst[j - r0].peer;
            } else {
                int cnt = 0;
                MPI_Get_count(&x->mst[j - r0], MPI_BYTE, &cnt);
                got = (size_t)cnt;
                src = x->mst[j - r0].MPI_SOURCE;
            }
            if (got != m->bytes || src != m->peer)
                *wrong += m->bytes > got ? m->bytes : got;   /* a wrong message counts whole */
            else
                *wrong += perf_verify(x->rbuf + m->off, m->bytes, msg_seed(m->peer, m->index, m->bytes, run));
        }
    }
    return 0;
}

int perf_exchange(const struct perf_opts *o, weft_comm_t *c)
{
    if (o->size < 2) {
        if (o->rank == 0)
            fprintf(o->csv ? stderr : stdout, "# weft-perf exchange needs at least 2 ranks (np %d): nothing to measure\n",
                    o->size);
        return 0;
    }
    if (o->device) {
        /* Filling and checking thousands of small device buffers would time
         * the CUDA runtime's calls, not the exchange. */
        if (o->rank == 0)
            fprintf(stderr, "weft-perf: exchange runs on host memory only (not -d cuda)\n");
        return 1;
    }
    const int nmsg = o->iters > 0 ? o->iters : EXCHANGE_MSGS_DEFAULT;
    const int win = o->window;
    const int reps = perf_reps(o, EXCHANGE_REPS_DEFAULT);
    size_t lo, hi;
    perf_sizes(o, EXCHANGE_MIN_DEFAULT, EXCHANGE_MAX_DEFAULT, &lo, &hi);
    if (hi > (size_t)INT_MAX) {
        if (o->rank == 0)
            fprintf(stderr, "weft-perf: exchange: -e %zu is above MPI's int count limit (%d)\n", hi, INT_MAX);
        return 1;
    }

    struct xplan plan;
    if (plan_build(o, nmsg, win, lo, hi, &plan))
        return 1;
    int rc = 1;
    struct xrun x = { .o = o, .c = c, .p = &plan };
    const size_t nreqs = (size_t)win + (size_t)plan.max_recvs;
    double *t[2] = { calloc((size_t)reps, sizeof(double)), calloc((size_t)reps, sizeof(double)) };
    x.wreqs = calloc(nreqs, sizeof *x.wreqs);
    x.wst = calloc(nreqs, sizeof *x.wst);
    x.mreqs = calloc(nreqs, sizeof *x.mreqs);
    x.mst = calloc(nreqs, sizeof *x.mst);
    if (!t[0] || !t[1] || !x.wreqs || !x.wst || !x.mreqs || !x.mst) {
        fprintf(stderr, "weft-perf rank %d: out of memory (exchange, %zu requests)\n", o->rank, nreqs);
        goto out;
    }
    x.sbuf = perf_alloc(plan.sbuf_bytes);
    x.rbuf = perf_alloc(plan.rbuf_bytes);

    char title[1024], lo_s[32], hi_s[32];
    snprintf(title, sizeof title,
             "# exchange: every rank sends %d messages to random peers (seed %llu, the same pattern for both\n"
             "# libraries), sizes %s .. %s log-uniform; rounds of %d sends per rank plus the receives they\n"
             "# meet, then weft_waitall / MPI_Waitall; every message filled and verified (timed).\n"
             "# time = the slowest rank's whole run, median of %d runs alternating weft and MPI first\n"
             "#\n"
             "#   np  msgs/rank  window  MiB/rank  reps    weft(ms)     MPI(ms)  weft/MPI  weft(msg/s)   MPI(msg/s)"
             "  #wrong(weft,MPI)",
             nmsg, (unsigned long long)o->seed, perf_size_str(lo, lo_s, sizeof lo_s),
             perf_size_str(hi, hi_s, sizeof hi_s), win, reps);
    perf_print_header(o, title);

    /* Each run has its own payload: run ids 0, 1, ... over warm-up and timed runs. */
    uint64_t run = 0;
    size_t wrong_local[2] = { 0, 0 };
    for (int lib = 0; lib < 2; lib++) {
        /* Warm-up: the first round, -W times, untimed (buffers, connections). */
        for (int w = 0; w < o->warmup; w++) {
            MPI_Barrier(o->mpi);
            if (run_rounds(&x, lib, run++, 0, 1, &wrong_local[lib]))
                goto out;
        }
    }
    for (int rep = 0; rep < reps; rep++) {
        for (int k = 0; k < 2; k++) {
            int lib = k ^ (rep & 1);     /* weft first on even runs, MPI first on odd */
            MPI_Barrier(o->mpi);
            double t0 = perf_now();
            if (run_rounds(&x, lib, run++, 0, plan.rounds, &wrong_local[lib]))
                goto out;
            double dt = perf_now() - t0, slowest = 0;
            MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, o->mpi);
            t[lib][rep] = slowest;
        }
    }

    unsigned long long wl[2] = { wrong_local[0], wrong_local[1] }, wrong[2] = { 0, 0 };
    MPI_Reduce(wl, wrong, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, o->mpi);
    if (o->rank == 0) {
        double tw = perf_median(t[LIB_WEFT], reps), tm = perf_median(t[LIB_MPI], reps);
        double msgs = (double)nmsg * o->size;
        double gw = tw > 0 ? (double)plan.total_bytes / tw * 1e-9 : 0;
        double gm = tm > 0 ? (double)plan.total_bytes / tm * 1e-9 : 0;
        char line[256], wr[64];
        snprintf(wr, sizeof wr, "%llu,%llu", wrong[0], wrong[1]);
        snprintf(line, sizeof line, "  %4d %10d %7d %9.1f %5d %11.2f %11.2f %9.2f %12.0f %12.0f  %16s", o->size, nmsg,
                 win, (double)plan.total_bytes / o->size / (1 << 20), reps, tw * 1e3, tm * 1e3, tm > 0 ? tw / tm : 0.0,
                 tw > 0 ? msgs / tw : 0.0, tm > 0 ? msgs / tm : 0.0, wr);
        /* CSV: bytes = the payload of all ranks in one run, algbw = that over
         * the run's time; no bus bandwidth for a random pattern. */
        const struct perf_result res[2] = {
            { "weft", tw, gw, -1, (long long)wrong[0] },
            { "MPI", tm, gm, -1, (long long)wrong[1] },
        };
        perf_report(o, "exchange", (size_t)plan.total_bytes, res, 2, line);
    }
    rc = 0;
out:
    perf_free(x.sbuf);
    perf_free(x.rbuf);
    free(t[0]);
    free(t[1]);
    free(x.wreqs);
    free(x.wst);
    free(x.mreqs);
    free(x.mst);
    plan_free(&plan);
    return rc;
}
