/*
 * weft-perf sendrecv and init.
 *
 * sendrecv: ranks are paired (r, r + np/2) and every pair runs at once, so an
 * oversubscribed job measures how well waiting ranks give the CPU away (an
 * odd rank out waits), and across real or virtual nodes the pairs cross the
 * node boundary. -o keeps only ranks 0 and 1 busy. For each size and
 * repetition, weft and MPI are measured back to back, the order flipping on
 * every repetition so drifting machine noise hits both alike; both use the
 * same buffers. A barrier before each measurement makes every pair measure
 * the same library at the same moment. The table shows, per size, the
 * median over repetitions of the slowest pair.
 *
 *   latency:   ping-pong, blocking send/recv; time = round trip / 2.
 *   bandwidth: the low rank of a pair posts `win` non-blocking sends, the
 *              other `win` receives; after waiting for all of them the
 *              receiver answers a 4-byte ack. time = elapsed / messages.
 *
 * -d cuda: sbuf/rbuf are device memory (perf_mem.c). weft gets them as they
 * are; MPI gets them too when it is CUDA-aware, else the device data is
 * staged through host buffers of the same size (cudaMemcpy before MPI_Send,
 * after MPI_Recv), inside the timed region. The 4-byte ack stays in host
 * memory for both libraries.
 *
 * UCX column (built where CMake finds UCX, WEFT_PERF_HAVE_UCX; host memory
 * only): the same ping-pong and window through UCP tag send/recv
 * (perf_ucx.c), a third library in the rotation: repetition r runs the
 * libraries in the order r, r+1, r+2 (mod 3), so each goes first as often.
 * Same buffers, same seeds scheme (its own library number), same checks.
 *
 * init: weft_comm_create and weft_comm_destroy timed apart, next to
 * MPI_Comm_dup + MPI_Allgather of one rank card and MPI_Comm_free: the part
 * of creation MPI itself would have to do anyway.
 */
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "perf.h"
#include "weft_test_sizes.h"   /* the init comparison allgathers a rank card of this size */

/* LIB_UCX is measured only where UCX was built in and the buffers are in
 * host memory; NLIB sizes the arrays, run_sweep's nlib says how many run. */
enum { LIB_WEFT = 0, LIB_MPI = 1, LIB_UCX = 2, NLIB = 3 };
enum { TAG_DATA = 1, TAG_ACK = 2 };

static const char *lib_name[NLIB] = { "weft", "MPI", "ucx" };

struct perf_ucx;   /* perf_ucx.c; never dereferenced here */

/* One side of a pair, for one size. */
struct pair_run {
    const struct perf_opts *o;
    weft_comm_t *c;
    int          peer;     /* the other rank of the pair */
    int          low;      /* 1 on the rank that starts (pings, streams) */
    char        *sbuf;     /* window slots of `bytes` each (device memory with -d cuda) */
    char        *rbuf;
    char        *shost;    /* host staging of sbuf/rbuf for MPI (-d cuda, MPI not CUDA-aware), */
    char        *rhost;    /* else sbuf/rbuf themselves */
    size_t       bytes;
    int          win;      /* bandwidth: messages in flight */
    weft_request_t **wreqs;/* [win] */
    MPI_Request *mreqs;    /* [win] */
    weft_status_t *wst;    /* [win] */
    MPI_Status  *mst;      /* [win] */
    struct perf_ucx *u;    /* the UCX column's endpoint to peer, or NULL */
    void       **ureqs;    /* [win] UCX requests (NULL: done at once) */
    size_t      *ugot;     /* [win] UCX received lengths */
    size_t       wrong[NLIB]; /* bad bytes seen by this rank, per library */
};

/* The UCX calls of the column; in a build without UCX no library number
 * reaches them (run_sweep's nlib is 2), and they fail loudly should one ever do. */
#ifdef WEFT_PERF_HAVE_UCX
static int ucx_send(struct pair_run *p, const void *buf, size_t bytes, int tag)
{
    return perf_ucx_send(p->u, buf, bytes, tag);
}
static int ucx_recv(struct pair_run *p, void *buf, size_t bytes, int tag, size_t *got)
{
    return perf_ucx_recv(p->u, buf, bytes, tag, got);
}
static int ucx_isend(struct pair_run *p, const void *buf, size_t bytes, int tag, void **req)
{
    return perf_ucx_isend(p->u, buf, bytes, tag, req);
}
static int ucx_irecv(struct pair_run *p, void *buf, size_t bytes, int tag, void **req, size_t *got_now)
{
    return perf_ucx_irecv(p->u, buf, bytes, tag, req, got_now);
}
static int ucx_wait(struct pair_run *p, void *req, const char *what, size_t *got)
{
    return perf_ucx_wait(p->u, req, what, got);
}
#else
static int ucx_missing(const struct pair_run *p)
{
    fprintf(stderr, "weft-perf rank %d: the UCX column is not built in\n", p->o->rank);
    return 1;
}
static int ucx_send(struct pair_run *p, const void *buf, size_t bytes, int tag)
{
    (void)buf, (void)bytes, (void)tag;
    return ucx_missing(p);
}
static int ucx_recv(struct pair_run *p, void *buf, size_t bytes, int tag, size_t *got)
{
    (void)buf, (void)bytes, (void)tag, (void)got;
    return ucx_missing(p);
}
static int ucx_isend(struct pair_run *p, const void *buf, size_t bytes, int tag, void **req)
{
    (void)buf, (void)bytes, (void)tag, (void)req;
    return ucx_missing(p);
}
static int ucx_irecv(struct pair_run *p, void *buf, size_t bytes, int tag, void **req, size_t *got_now)
{
    (void)buf, (void)bytes, (void)tag, (void)req, (void)got_now;
    return ucx_missing(p);
}
static int ucx_wait(struct pair_run *p, void *req, const char *what, size_t *got)
{
    (void)req, (void)what, (void)got;
    return ucx_missing(p);
}
#endif

/* The peer of this rank, or -1 when it sits this test out. */
static int pair_peer(const struct perf_opts *o, int *low)
{
    if (o->one_pair) {
        *low = o->rank == 0;
        return o->rank == 0 ? 1 : o->rank == 1 ? 0 : -1;
    }
    int half = o->size / 2;
    if (o->rank < half) {
        *low = 1;
        return o->rank + half;
    }
    *low = 0;
    return o->rank < 2 * half ? o->rank - half : -1;
}

/* A received message of the wrong size counts as entirely wrong. */
static void check_recv(struct pair_run *p, int lib, const void *buf, size_t got_bytes, uint64_t seed)
{
    if (got_bytes != p->bytes) {
        p->wrong[lib] += p->bytes > got_bytes ? p->bytes : got_bytes;
        return;
    }
    p->wrong[lib] += perf_buf_verify(p->o, buf, p->bytes, seed);
}

static int mpi_count(const MPI_Status *st, size_t *bytes)
{
    int n = 0;
    int rc = MPI_Get_count(st, MPI_BYTE, &n);
    *bytes = (size_t)n;
    return rc;
}

/* ---- latency: one ping-pong per iteration ---- */

/* Runs iterations [first, first + n) of the ping-pong through lib. Returns
 * 0, or 1 after a failed call was reported. */
static int pingpong(struct pair_run *p, int lib, int first, int n)
{
    const struct perf_opts *o = p->o;
    const int check = o->check;
    /* Direction 0: low -> high; 1: high -> low. */
    const int dir_out = p->low ? 0 : 1, dir_in = 1 - dir_out;
    for (int i = first; i < first + n; i++) {
        for (int step = 0; step < 2; step++) {
            int sending = (step == 0) == (p->low != 0);
            if (sending) {
                if (check)
                    perf_buf_fill(o, p->sbuf, p->bytes, perf_seed((uint64_t)i, p->bytes, (uint64_t)dir_out, (uint64_t)lib));
                if (lib == LIB_WEFT) {
                    int err = weft_send(p->c, p->sbuf, p->bytes, p->peer, TAG_DATA);
                    if (err)
                        return perf_weft_fail(o, p->c, "weft_send", err);
                } else if (lib == LIB_UCX) {
                    if (ucx_send(p, p->sbuf, p->bytes, TAG_DATA))
                        return 1;
                } else {
                    if (!o->mpi_direct)
                        perf_buf_to_host(o, p->shost, p->sbuf, p->bytes);
                    if (MPI_Send(p->shost, (int)p->bytes, MPI_BYTE, p->peer, TAG_DATA, o->mpi) != MPI_SUCCESS) {
                        fprintf(stderr, "weft-perf rank %d: MPI_Send to %d failed\n", o->rank, p->peer);
                        return 1;
                    }
                }
            } else {
                size_t got = 0;
                if (lib == LIB_WEFT) {
                    weft_status_t st;
                    int err = weft_recv(p->c, p->rbuf, p->bytes, p->peer, TAG_DATA, &st);
                    if (err)
                        return perf_weft_fail(o, p->c, "weft_recv", err);
                    got = st.bytes;
                } else if (lib == LIB_UCX) {
                    if (ucx_recv(p, p->rbuf, p->bytes, TAG_DATA, &got))
                        return 1;
                } else {
                    MPI_Status st;
                    if (MPI_Recv(p->rhost, (int)p->bytes, MPI_BYTE, p->peer, TAG_DATA, o->mpi, &st) != MPI_SUCCESS ||
                        mpi_count(&st, &got) != MPI_SUCCESS) {
                        fprintf(stderr, "weft-perf rank %d: MPI_Recv from %d failed\n", o->rank, p->peer);
                        return 1;
                    }
                    if (!o->mpi_direct)
                        perf_buf_from_host(o, p->rbuf, p->rhost, got < p->bytes ? got : p->bytes);
                }
                if (check)
                    check_recv(p, lib, p->rbuf, got, perf_seed((uint64_t)i, p->bytes, (uint64_t)dir_in, (uint64_t)lib));
            }
        }
    }
    return 0;
}

/* ---- bandwidth: win messages in flight, then an ack ---- */

static int stream_window(struct pair_run *p, int lib, int iter)
{
    const struct perf_opts *o = p->o;
    const int check = o->check;
    uint32_t ack = 0;
    if (p->low) {
        for (int w = 0; w < p->win; w++) {
            char *slot = p->sbuf + (size_t)w * p->bytes;
            if (check)
                perf_buf_fill(o, slot, p->bytes, perf_seed((uint64_t)iter, p->bytes, (uint64_t)w, (uint64_t)lib));
            if (lib == LIB_WEFT) {
                int err = weft_isend(p->c, slot, p->bytes, p->peer, TAG_DATA, &p->wreqs[w]);
                if (err)
                    return perf_weft_fail(o, p->c, "weft_isend", err);
            } else if (lib == LIB_UCX) {
                if (ucx_isend(p, slot, p->bytes, TAG_DATA, &p->ureqs[w]))
                    return 1;
            } else {
                char *hslot = p->shost + (size_t)w * p->bytes;
                if (!o->mpi_direct)
                    perf_buf_to_host(o, hslot, slot, p->bytes);
                if (MPI_Isend(hslot, (int)p->bytes, MPI_BYTE, p->peer, TAG_DATA, o->mpi, &p->mreqs[w]) != MPI_SUCCESS) {
                    fprintf(stderr, "weft-perf rank %d: MPI_Isend to %d failed\n", o->rank, p->peer);
                    return 1;
                }
            }
        }
        if (lib == LIB_WEFT) {
            int err = weft_waitall((size_t)p->win, p->wreqs, NULL);
            if (err)
                return perf_weft_fail(o, p->c, "weft_waitall (sends)", err);
            err = weft_recv(p->c, &ack, sizeof ack, p->peer, TAG_ACK, NULL);
            if (err)
                return perf_weft_fail(o, p->c, "weft_recv (ack)", err);
        } else if (lib == LIB_UCX) {
            size_t got = 0;
            for (int w = 0; w < p->win; w++)
                if (ucx_wait(p, p->ureqs[w], "ucp_tag_send_nbx (window)", NULL))
                    return 1;
            if (ucx_recv(p, &ack, sizeof ack, TAG_ACK, &got))
                return 1;
        } else if (/* p->mst, not MPI_STATUSES_IGNORE: MPICH defines that as
                      * (MPI_Status *)1 and GCC 12 then warns of a write to
                      * "a region of size 0" (stringop-overflow) */
                   MPI_Waitall(p->win, p->mreqs, p->mst) != MPI_SUCCESS ||
                   MPI_Recv(&ack, sizeof ack, MPI_BYTE, p->peer, TAG_ACK, o->mpi, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            fprintf(stderr, "weft-perf rank %d: MPI_Waitall/ack from %d failed\n", o->rank, p->peer);
            return 1;
        }
        return 0;
    }

    for (int w = 0; w < p->win; w++) {
        char *slot = p->rbuf + (size_t)w * p->bytes;
        if (lib == LIB_WEFT) {
            int err = weft_irecv(p->c, slot, p->bytes, p->peer, TAG_DATA, &p->wreqs[w]);
            if (err)
                return perf_weft_fail(o, p->c, "weft_irecv", err);
        } else if (lib == LIB_UCX) {
            p->ugot[w] = 0;
            if (ucx_irecv(p, slot, p->bytes, TAG_DATA, &p->ureqs[w], &p->ugot[w]))
                return 1;
        } else if (MPI_Irecv(p->rhost + (size_t)w * p->bytes, (int)p->bytes, MPI_BYTE, p->peer, TAG_DATA, o->mpi,
                             &p->mreqs[w]) != MPI_SUCCESS) {
            fprintf(stderr, "weft-perf rank %d: MPI_Irecv from %d failed\n", o->rank, p->peer);
            return 1;
        }
    }
    if (lib == LIB_WEFT) {
        int err = weft_waitall((size_t)p->win, p->wreqs, p->wst);
        if (err)
            return perf_weft_fail(o, p->c, "weft_waitall (receives)", err);
    } else if (lib == LIB_UCX) {
        for (int w = 0; w < p->win; w++)
            if (ucx_wait(p, p->ureqs[w], "ucp_tag_recv_nbx (window)", &p->ugot[w]))
                return 1;
    } else {
        if (MPI_Waitall(p->win, p->mreqs, p->mst) != MPI_SUCCESS) {
            fprintf(stderr, "weft-perf rank %d: MPI_Waitall (receives from %d) failed\n", o->rank, p->peer);
            return 1;
        }
        if (!o->mpi_direct)   /* the window's slots are contiguous: one copy */
            perf_buf_from_host(o, p->rbuf, p->rhost, (size_t)p->win * p->bytes);
    }
    if (check) {
        for (int w = 0; w < p->win; w++) {
            size_t got = p->bytes;
            if (lib == LIB_WEFT)
                got = p->wst[w].bytes;
            else if (lib == LIB_UCX)
                got = p->ugot[w];
            else
                mpi_count(&p->mst[w], &got);
            check_recv(p, lib, p->rbuf + (size_t)w * p->bytes, got,
                       perf_seed((uint64_t)iter, p->bytes, (uint64_t)w, (uint64_t)lib));
        }
    }
    if (lib == LIB_WEFT) {
        int err = weft_send(p->c, &ack, sizeof ack, p->peer, TAG_ACK);
        if (err)
            return perf_weft_fail(o, p->c, "weft_send (ack)", err);
    } else if (lib == LIB_UCX) {
        if (ucx_send(p, &ack, sizeof ack, TAG_ACK))
            return 1;
    } else if (MPI_Send(&ack, sizeof ack, MPI_BYTE, p->peer, TAG_ACK, o->mpi) != MPI_SUCCESS) {
        fprintf(stderr, "weft-perf rank %d: MPI_Send (ack to %d) failed\n", o->rank, p->peer);
        return 1;
    }
    return 0;
}

static int stream(struct pair_run *p, int lib, int first, int n)
{
    for (int i = first; i < first + n; i++)
        if (stream_window(p, lib, i))
            return 1;
    return 0;
}

/* ---- one sweep (latency or bandwidth) ---- */

enum test_kind { TEST_LATENCY, TEST_BANDWIDTH };

/* Run length. Samples are kept short (milliseconds) and many
 * (up to SENDRECV_REPS per library): this machine is shared, and a burst of
 * someone else's work then spoils a few samples, which the median drops,
 * instead of one of the two libraries' only measurement.
 *
 * Per size, a short calibration of each library (the slower one counts)
 * sets the iterations per sample so a sample lasts about SAMPLE_S, never
 * more than the byte budget allows (small messages would otherwise run for
 * tens of thousands of iterations). Where single iterations are long (large
 * messages on a slow path), repetitions drop to no fewer than MIN_REPS so
 * one size costs about SIZE_BUDGET_S. A full np=2 shm run takes about half
 * a minute on this machine when it is quiet, 2-3 minutes at load 20. */
#define LAT_BUDGET     ((size_t)16 << 20)
#define BW_BUDGET      ((size_t)64 << 20)
#define LAT_MAX_ITERS  2000
#define BW_MAX_ITERS   250
#define SAMPLE_S       0.005
#define SIZE_BUDGET_S  1.2
#define SENDRECV_REPS  15
#define MIN_REPS       5

typedef int (*pair_op)(struct pair_run *, int lib, int first, int n);

/* Runs n iterations of op through lib after o->warmup untimed ones, which
 * also line the two ranks up; *dt = seconds of the n timed iterations. */
static int timed_run(struct pair_run *p, pair_op op, int lib, int *next_iter, int n, double *dt)
{
    const struct perf_opts *o = p->o;
    if (o->warmup > 0 && op(p, lib, *next_iter, o->warmup))
        return 1;
    double t0 = perf_now();
    if (op(p, lib, *next_iter + o->warmup, n))
        return 1;
    *dt = perf_now() - t0;
    *next_iter += o->warmup + n;   /* new seeds for every message (-c) */
    return 0;
}

static int run_sweep(const struct perf_opts *o, weft_comm_t *c, enum test_kind kind, struct perf_ucx *u,
                     int peer, int low, char *sbuf, char *rbuf, char *shost, char *rhost, size_t cap)
{
    size_t min_b, max_b;
    perf_sizes(o, 8, (size_t)64 << 20, &min_b, &max_b);
    const int max_reps = perf_reps(o, SENDRECV_REPS);
    /* perf_sendrecv opens UCX on every rank (those that sit out too) or on
     * none, so all ranks agree on the libraries and take part in the
     * barriers of every measurement. */
    const int nlib = u ? 3 : 2;
    int rc = 1;
    double *t[NLIB] = { NULL, NULL, NULL };
    struct pair_run p;
    memset(&p, 0, sizeof p);
    for (int lib = 0; lib < nlib; lib++)
        t[lib] = calloc((size_t)max_reps, sizeof(double));
    p.wreqs = calloc((size_t)o->window, sizeof *p.wreqs);
    p.mreqs = calloc((size_t)o->window, sizeof *p.mreqs);
    p.wst = calloc((size_t)o->window, sizeof *p.wst);
    p.mst = calloc((size_t)o->window, sizeof *p.mst);
    p.ureqs = calloc((size_t)o->window, sizeof *p.ureqs);
    p.ugot = calloc((size_t)o->window, sizeof *p.ugot);
    if (!t[0] || !t[1] || (nlib > 2 && !t[2]) || !p.wreqs || !p.mreqs || !p.wst || !p.mst || !p.ureqs || !p.ugot) {
        fprintf(stderr, "weft-perf rank %d: out of memory for %d repetitions / window %d\n", o->rank, max_reps, o->window);
        goto out;
    }

    /* Column heads: one block of time and GB/s per library, then the ratios. */
    const char *ucx_head = nlib > 2 ? "    ------ UCX -------" : "";
    const char *ucx_cols = nlib > 2 ? "    time(us)     GB/s" : "";
    const char *ucx_ratio = nlib > 2 ? "   weft/UCX" : "";
    char title[1024];
    if (kind == TEST_LATENCY)
        snprintf(title, sizeof title,
                 "# sendrecv latency: ping-pong (weft_send/recv vs MPI_Send/Recv%s), time = half round trip,\n"
                 "# median of <reps> samples of <iters> iterations, slowest of %d pair(s)%s\n"
                 "#\n"
                 "#                            ------ weft ------    ------ MPI -------%s\n"
                 "#       size  reps  iters    time(us)     GB/s    time(us)     GB/s%s   weft/MPI%s    #wrong",
                 nlib > 2 ? " vs UCP tag send/recv" : "", o->one_pair ? 1 : o->size / 2,
                 o->check ? "; -c: times include fill+verify" : "", ucx_head, ucx_cols, ucx_ratio);
    else
        snprintf(title, sizeof title,
                 "# sendrecv bandwidth: window of isends/irecvs + ack (weft vs MPI_Isend/Irecv/Waitall%s),\n"
                 "# time per message, median of <reps> samples of <iters> windows, slowest of %d pair(s)%s\n"
                 "#\n"
                 "#                                  ------ weft ------    ------ MPI -------%s\n"
                 "#       size  win  reps  iters    time(us)     GB/s    time(us)     GB/s%s   weft/MPI%s    #wrong",
                 nlib > 2 ? " vs ucp_tag_send/recv_nbx" : "", o->one_pair ? 1 : o->size / 2,
                 o->check ? "; -c: times include fill+verify" : "", ucx_head, ucx_cols, ucx_ratio);
    perf_print_header(o, title);

    p.o = o;
    p.c = c;
    p.peer = peer;
    p.low = low;
    p.sbuf = sbuf;
    p.rbuf = rbuf;
    p.shost = shost;
    p.rhost = rhost;
    p.u = u;

    for (size_t bytes = min_b; bytes && bytes <= max_b; bytes = perf_next_size(o, bytes)) {
        p.bytes = bytes;
        p.win = 1;
        int iters;
        if (kind == TEST_LATENCY) {
            iters = perf_scale_iters(o, bytes, LAT_BUDGET, 1, LAT_MAX_ITERS);
        } else {
            size_t fit = bytes ? cap / bytes : (size_t)o->window;
            p.win = fit < (size_t)o->window ? (int)(fit ? fit : 1) : o->window;
            iters = perf_scale_iters(o, bytes * (size_t)p.win, BW_BUDGET, 1, BW_MAX_ITERS);
        }
        memset(p.wrong, 0, sizeof p.wrong);
        int next_iter = 0;
        pair_op op = kind == TEST_LATENCY ? pingpong : stream;

        /* Calibration: runs of 1, 4, 16, ... iterations of each library.
         * Time per iteration = the fastest run's, since preemption by other
         * processes only ever adds time; runs stop growing once that
         * estimate says a run of this length lasts SAMPLE_S / 4 (or the
         * byte budget's count is reached). Every pair takes the slowest
         * pair's figure, so all run the same counts. */
        double t_iter[NLIB] = { 1e30, 1e30, 1e30 }, t_max = 0;
        for (int n = 1;; n = n * 4 < iters ? n * 4 : iters) {
            for (int lib = 0; lib < nlib; lib++) {
                double dt = 0;
                MPI_Barrier(o->mpi);
                if (peer >= 0 && timed_run(&p, op, lib, &next_iter, n, &dt))
                    goto out;
                if (dt / n < t_iter[lib])
                    t_iter[lib] = dt / n;
            }
            double t_one = 0;
            for (int lib = 0; peer >= 0 && lib < nlib; lib++)
                if (t_iter[lib] > t_one)
                    t_one = t_iter[lib];
            MPI_Allreduce(&t_one, &t_max, 1, MPI_DOUBLE, MPI_MAX, o->mpi);
            /* Not before 16 iterations: a single short run that happened to
             * be preempted must not decide the count on its own. */
            if (o->iters > 0 || n >= iters || (n >= 16 && t_max * n >= SAMPLE_S / 4))
                break;
        }
        if (o->iters == 0) {
            double want = t_max > 0 ? SAMPLE_S / t_max : (double)iters;
            iters = want < 1 ? 1 : want < iters ? (int)want : iters;
        }
        int reps = max_reps;
        if (o->reps == 0) {
            double per_rep = (double)nlib * iters * t_max;    /* every library */
            int fit = per_rep > 0 ? (int)(SIZE_BUDGET_S / per_rep) : max_reps;
            reps = fit < MIN_REPS ? MIN_REPS : fit < max_reps ? fit : max_reps;
        }

        for (int rep = 0; rep < reps; rep++) {
            for (int k = 0; k < nlib; k++) {
                /* Each library goes first as often: with two, weft first on
                 * even repetitions and MPI on odd ones. */
                int lib = (k + rep) % nlib;
                MPI_Barrier(o->mpi);
                if (peer < 0)
                    continue;
                double dt = 0;
                if (timed_run(&p, op, lib, &next_iter, iters, &dt))
                    goto out;
                t[lib][rep] = kind == TEST_LATENCY ? dt / (2.0 * iters) : dt / ((double)iters * p.win);
            }
        }

        /* Only the low rank of a pair times; the table shows the slowest pair. */
        double med[NLIB] = { 0, 0, 0 }, slowest[NLIB];
        for (int lib = 0; peer >= 0 && low && lib < nlib; lib++)
            med[lib] = perf_median(t[lib], reps);
        unsigned long long wrong[NLIB] = { p.wrong[0], p.wrong[1], p.wrong[2] }, wrong_all[NLIB];
        MPI_Reduce(med, slowest, NLIB, MPI_DOUBLE, MPI_MAX, 0, o->mpi);
        MPI_Reduce(wrong, wrong_all, NLIB, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, o->mpi);
        if (o->rank == 0) {
            char sz[32], wr[32], line[320], ucx_part[64] = "";
            double us[NLIB], gb[NLIB];
            for (int lib = 0; lib < NLIB; lib++) {
                us[lib] = slowest[lib] * 1e6;
                gb[lib] = slowest[lib] > 0 ? (double)bytes / slowest[lib] * 1e-9 : 0;
            }
            if (o->check)
                snprintf(wr, sizeof wr, "%llu", wrong_all[0]);
            else
                snprintf(wr, sizeof wr, "-");
            perf_size_str(bytes, sz, sizeof sz);
            double r_mpi = us[LIB_MPI] > 0 ? us[LIB_WEFT] / us[LIB_MPI] : 0.0;
            char r_ucx[16] = "";
            if (nlib > 2) {
                snprintf(ucx_part, sizeof ucx_part, " %11.2f %8.3f", us[LIB_UCX], gb[LIB_UCX]);
                snprintf(r_ucx, sizeof r_ucx, " %10.2f", us[LIB_UCX] > 0 ? us[LIB_WEFT] / us[LIB_UCX] : 0.0);
            }
            if (kind == TEST_LATENCY)
                snprintf(line, sizeof line, "  %10s %5d %6d %11.2f %8.3f %11.2f %8.3f%s %10.2f%s %9s",
                         sz, reps, iters, us[LIB_WEFT], gb[LIB_WEFT], us[LIB_MPI], gb[LIB_MPI], ucx_part, r_mpi,
                         r_ucx, wr);
            else
                snprintf(line, sizeof line, "  %10s %4d %5d %6d %11.2f %8.3f %11.2f %8.3f%s %10.2f%s %9s",
                         sz, p.win, reps, iters, us[LIB_WEFT], gb[LIB_WEFT], us[LIB_MPI], gb[LIB_MPI], ucx_part,
                         r_mpi, r_ucx, wr);
            /* Point to point: what one link carried is the message, busbw = algbw. */
            struct perf_result res[NLIB];
            for (int lib = 0; lib < nlib; lib++) {
                res[lib].library = lib_name[lib];
                res[lib].time_s = slowest[lib];
                res[lib].algbw = res[lib].busbw = gb[lib];
                res[lib].wrong = o->check ? (long long)wrong_all[lib] : -1;
            }
            perf_report(o, kind == TEST_LATENCY ? "sendrecv-lat" : "sendrecv-bw", bytes, res, nlib, line);
            for (int lib = 1; lib < nlib; lib++) {
                if (!o->check || !wrong_all[lib])
                    continue;
                /* Not a table line: under --csv it would break the CSV. */
                fprintf(o->csv ? stderr : stdout, "# WARNING: the %s path delivered %llu wrong bytes at size %s\n",
                        lib_name[lib], wrong_all[lib], sz);
                fflush(o->csv ? stderr : stdout);
            }
        }
    }
    rc = 0;
out:
    for (int lib = 0; lib < NLIB; lib++)
        free(t[lib]);
    free(p.wreqs);
    free(p.mreqs);
    free(p.wst);
    free(p.mst);
    free(p.ureqs);
    free(p.ugot);
    return rc;
}

int perf_sendrecv(const struct perf_opts *o, weft_comm_t *c)
{
    if (o->size < 2) {
        if (o->rank == 0)
            fprintf(o->csv ? stderr : stdout, "# weft-perf sendrecv needs at least 2 ranks (np %d): nothing to measure\n",
                    o->size);
        return 0;
    }
    int low = 0, peer = pair_peer(o, &low);
    size_t min_b, max_b;
    perf_sizes(o, 8, (size_t)64 << 20, &min_b, &max_b);
    if (max_b > (size_t)INT_MAX) {
        /* MPI counts are int: the MPI side could not send it in one message. */
        if (o->rank == 0)
            fprintf(stderr, "weft-perf: sendrecv: -e %zu is above MPI's int count limit (%d)\n", max_b, INT_MAX);
        return 1;
    }
    /* Window slots live side by side in one buffer per direction; it holds at
     * least one message of the largest size. */
    size_t cap = o->window_cap > max_b ? o->window_cap : max_b;
    if (cap > (size_t)o->window * max_b)
        cap = (size_t)o->window * max_b;
    char *sbuf = NULL, *rbuf = NULL, *shost = NULL, *rhost = NULL;
    if (peer >= 0) {
        sbuf = perf_buf_alloc(o, cap);
        rbuf = perf_buf_alloc(o, cap);
        /* MPI's buffers: the same ones, or host staging for device data. */
        shost = o->mpi_direct ? sbuf : perf_alloc(cap);
        rhost = o->mpi_direct ? rbuf : perf_alloc(cap);
    }
    int rc = 0;
    struct perf_ucx *u = NULL;
#ifdef WEFT_PERF_HAVE_UCX
    /* The UCX column: host memory only (this UCX is not asked to handle
     * device pointers). A UCX that cannot start fails the run: a build that
     * has the column must not quietly drop it. */
    if (!o->device && perf_ucx_open(o, peer, &u) != 0) {
        if (o->rank == 0)
            fprintf(stderr, "weft-perf: sendrecv: the UCX column could not start (UCX_TLS=%s)\n", perf_ucx_tls());
        rc = 1;
    }
    if (o->device && o->rank == 0 && !o->csv)
        printf("# UCX column left out: -d cuda (UCP is given host memory only here)\n");
#endif
    if (rc == 0 && (!o->tests || strcmp(o->tests, "lat") == 0))
        rc = run_sweep(o, c, TEST_LATENCY, u, peer, low, sbuf, rbuf, shost, rhost, cap);
    if (rc == 0 && (!o->tests || strcmp(o->tests, "bw") == 0))
        rc = run_sweep(o, c, TEST_BANDWIDTH, u, peer, low, sbuf, rbuf, shost, rhost, cap);
#ifdef WEFT_PERF_HAVE_UCX
    /* Collective, like the open. A rank whose sweep failed skips it: main
     * aborts the whole job on its return code, which also ends the ranks
     * that wait in the close's barrier. */
    if (u && rc == 0)
        perf_ucx_close(u);
#endif
    if (!o->mpi_direct) {
        perf_free(shost);
        perf_free(rhost);
    }
    perf_buf_free(o, sbuf);
    perf_buf_free(o, rbuf);
    return rc;
}

/* ---------------------------------------------------------------- init */

/* Seconds the slowest rank spent in one collective step (all ranks start
 * together after a barrier). */
static double slowest_rank(const struct perf_opts *o, double local_s)
{
    double max_s = 0;
    MPI_Allreduce(&local_s, &max_s, 1, MPI_DOUBLE, MPI_MAX, o->mpi);
    return max_s;
}

/* Heap bytes this process holds (glibc's count: arena + mmapped chunks). */
static size_t heap_bytes(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

/* Bytes of weft shared-memory segments mapped in this process. */
static size_t weft_shm_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    size_t sum = 0;
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (strstr(line, "/dev/shm/weft-") && sscanf(line, "%lx-%lx", &lo, &hi) == 2)
            sum += hi - lo;
    }
    fclose(f);
    return sum;
}

/* One untimed create: what it costs each rank in heap and shared memory,
 * and the shared memory once every rank has talked to its two ring
 * neighbours (both directions, eager and rendezvous sizes, repeatedly so
 * busy lanes grow). Maxima over the ranks, printed as comment lines. */
static int init_memory(const struct perf_opts *o)
{
    weft_comm_t *c = NULL;
    unsigned long long v[3], mx[3];
    MPI_Barrier(o->mpi);
    size_t h0 = heap_bytes();
    int err = weft_comm_create_config(MPI_COMM_WORLD, o->config, &c);
    if (err) {
        perf_weft_fail(o, NULL, "weft_comm_create_config", err);
        return 1;
    }
    v[0] = heap_bytes() > h0 ? heap_bytes() - h0 : 0;
    v[1] = weft_shm_mapped();
    if (o->size > 1) {
        const int right = (o->rank + 1) % o->size, left = (o->rank + o->size - 1) % o->size;
        const size_t big = 256u << 10;
        char *out = calloc(1, big), *in = calloc(4, big);
        for (int i = 0; out && in && i < 20; i++) {
            for (int k = 0; k < 2; k++) {
                size_t n = k ? big : 1024;
                weft_request_t *rq[4];
                if (weft_irecv(c, in, n, left, 5, &rq[0]) || weft_irecv(c, in + big, n, right, 6, &rq[1]) ||
                    weft_isend(c, out, n, right, 5, &rq[2]) || weft_isend(c, out, n, left, 6, &rq[3]) ||
                    weft_waitall(4, rq, NULL)) {
                    fprintf(stderr, "weft-perf rank %d: init memory exchange failed: %s\n", o->rank,
                            weft_comm_last_error(c));
                    free(out);
                    free(in);
                    return 1;
                }
            }
        }
        free(out);
        free(in);
    }
    MPI_Barrier(o->mpi);
    v[2] = weft_shm_mapped();
    err = weft_comm_destroy(c);
    MPI_Reduce(v, mx, 3, MPI_UNSIGNED_LONG_LONG, MPI_MAX, 0, o->mpi);
    if (o->rank == 0)
        printf("# per rank (max over ranks): heap held by a comm %.1f KiB; shared memory mapped after create "
               "%.1f KiB, after talking to 2 neighbours %.1f KiB\n",
               mx[0] / 1024.0, mx[1] / 1024.0, mx[2] / 1024.0);
    return err ? 1 : 0;
}

int perf_init(const struct perf_opts *o, weft_comm_t *unused)
{
    (void)unused;
    const int reps = perf_reps(o, 10);
    const size_t card = WEFT_TEST_RANK_CARD_BYTES;
    int rc = 1;
    double *wc = calloc((size_t)reps, sizeof(double)), *wd = calloc((size_t)reps, sizeof(double));
    double *mc = calloc((size_t)reps, sizeof(double)), *md = calloc((size_t)reps, sizeof(double));
    char *mine = calloc(1, card), *all = calloc((size_t)o->size, card);
    if (!wc || !wd || !mc || !md || !mine || !all) {
        fprintf(stderr, "weft-perf rank %d: out of memory (init, %d repetitions)\n", o->rank, reps);
        goto out;
    }

    char title[512];
    snprintf(title, sizeof title,
             "# init: weft_comm_create / weft_comm_destroy vs MPI_Comm_dup + MPI_Allgather of one\n"
             "# rank card (%zu bytes, WEFT_TEST_RANK_CARD_BYTES) / MPI_Comm_free;\n"
             "# time of the slowest rank, median of %d repetitions, alternating weft and MPI first\n"
             "#\n"
             "#   np  card(B)   weft create(us)  weft destroy(us)   MPI dup+allgather(us)  MPI free(us)  create/MPI",
             card, reps);
    perf_print_header(o, title);

    for (int rep = 0; rep < reps; rep++) {
        for (int k = 0; k < 2; k++) {
            int lib = k ^ (rep & 1);
            MPI_Barrier(o->mpi);
            if (lib == LIB_WEFT) {
                weft_comm_t *c = NULL;
                double t0 = perf_now();
                int err = weft_comm_create_config(MPI_COMM_WORLD, o->config, &c);
                double t1 = perf_now();
                if (err) {
                    perf_weft_fail(o, NULL, "weft_comm_create_config", err);
                    goto out;
                }
                wc[rep] = slowest_rank(o, t1 - t0);
                MPI_Barrier(o->mpi);
                t0 = perf_now();
                err = weft_comm_destroy(c);
                t1 = perf_now();
                if (err) {
                    perf_weft_fail(o, NULL, "weft_comm_destroy", err);
                    goto out;
                }
                wd[rep] = slowest_rank(o, t1 - t0);
            } else {
                MPI_Comm dup;
                memset(mine, o->rank & 0xff, card);
                double t0 = perf_now();
                if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS ||
                    MPI_Allgather(mine, (int)card, MPI_BYTE, all, (int)card, MPI_BYTE, dup) != MPI_SUCCESS) {
                    fprintf(stderr, "weft-perf rank %d: MPI_Comm_dup/MPI_Allgather failed\n", o->rank);
                    goto out;
                }
                double t1 = perf_now();
                mc[rep] = slowest_rank(o, t1 - t0);
                MPI_Barrier(o->mpi);
                t0 = perf_now();
                MPI_Comm_free(&dup);
                t1 = perf_now();
                md[rep] = slowest_rank(o, t1 - t0);
            }
        }
    }
    if (o->rank == 0) {
        double c_w = perf_median(wc, reps) * 1e6, d_w = perf_median(wd, reps) * 1e6;
        double c_m = perf_median(mc, reps) * 1e6, d_m = perf_median(md, reps) * 1e6;
        char line[256];
        snprintf(line, sizeof line, "  %5d %8zu %17.1f %17.1f %23.1f %13.1f %11.1f", o->size, card, c_w, d_w, c_m,
                 d_m, c_m > 0 ? c_w / c_m : 0.0);
        /* Four times, no bandwidth: each is its own "library" column. */
        const struct perf_result res[4] = {
            { "weft_create", c_w * 1e-6, -1, -1, -1 },
            { "weft_destroy", d_w * 1e-6, -1, -1, -1 },
            { "MPI_dup_allgather", c_m * 1e-6, -1, -1, -1 },
            { "MPI_free", d_m * 1e-6, -1, -1, -1 },
        };
        perf_report(o, "init", card, res, 4, line);
    }
    rc = init_memory(o);
out:
    free(wc);
    free(wd);
    free(mc);
    free(md);
    free(mine);
    free(all);
    return rc;
}
