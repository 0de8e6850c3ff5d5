/*
 * pipe_perf_weft: weft's message pipes (weft.h, "Message pipes"), latency
 * and windowed bandwidth of one message carrying 1 tensor of N bytes or 8
 * tensors of N/8, measured exactly as pipe_perf_tp.cc measures TensorPipe
 * (pipe_perf_common.h says how). bench/pipe/run.sh runs both, interleaved.
 *
 *   mpirun -np 2 pipe_perf_weft [options]      (MPI only launches: weft_comm_create)
 *     -b SIZE -e SIZE   smallest / largest message (8 .. 64m of the fixed list)
 *     -k LIST           tensors per message, "1,8" (default)
 *     -m LIST           "lat,bw" (default), or one of them
 *     -p pipe|p2p       pipe (default): weft_pipe_*; p2p: weft_isend/irecv of
 *                       the same bytes (one buffer), the reference for the pipes
 *     -s SCALE          iterations x SCALE (0.1 for a quick look)
 *     -c NAME           configuration name in the output (default: from
 *                       WEFT_TRANSPORTS and WEFT_PROGRESS_THREAD)
 *     -w progress|cond  how the main thread waits for the end of a run:
 *                       spinning on weft_progress (default without a progress
 *                       thread; callbacks then run in it) or on a condition
 *                       variable (default, and only allowed, with
 *                       WEFT_PROGRESS_THREAD=1)
 * Host memory. Rank 0 writes, rank 1 reads (and echoes for the latency).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>
#include "weft.h"
#include "pipe_perf_common.h"

/* A run stuck this long has lost a message: fail instead of hanging. */
#define STALL_SECONDS 120.0

enum { LAT, BW };

struct bench {
    weft_comm_t *comm;
    weft_pipe_t *pipe;
    int rank;
    char who[64];
    /* the test */
    int kind;                      /* LAT or BW */
    size_t size;                   /* bytes per message */
    int k;                         /* tensors per message */
    size_t tb;                     /* bytes per tensor */
    int window;                    /* BW: messages per window (the receiver's slots) */
    int warm, timed;               /* iterations (LAT) or windows (BW) */
    /* buffers: this rank's message (constant pattern) and the receive slots */
    unsigned char *send[PP_MAX_TENSORS];
    unsigned char **slot;          /* slot[s * k + t] */
    weft_pipe_tensor_t out_t[PP_MAX_TENSORS];
    weft_pipe_message_t out;
    weft_pipe_message_t ack;
    /* progress of the run (callbacks are serialized per comm by weft) */
    int iter;                      /* LAT: round trips done; BW role 0: windows done */
    long posted, described;        /* role 1: descriptors asked for, and delivered */
    long reads, writes_cb;         /* reads done, writes called back */
    long total_msgs;
    int pending;                   /* BW role 0: callbacks the current window still waits for */
    double t0;
    double *times;
    /* the end */
    atomic_int finished;
    int failed;
    int use_cond;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void finish(struct bench *b, int failed)
{
    if (failed) b->failed = 1;
    if (b->use_cond) {
        pthread_mutex_lock(&b->mu);
        atomic_store(&b->finished, 1);
        pthread_cond_signal(&b->cv);
        pthread_mutex_unlock(&b->mu);
    } else {
        atomic_store(&b->finished, 1);
    }
}

static int bad(struct bench *b, const char *what, int err, const char *why)
{
    fprintf(stderr, "%s: %s failed: %d (%s) %s\n", b->who, what, err, why ? why : "",
            weft_comm_last_error(b->comm));
    finish(b, 1);
    return -1;
}

/* The descriptor must be what role `dir` wrote: k tensors of tb bytes, host. */
static int check_desc(struct bench *b, const weft_pipe_descriptor_t *d)
{
    if (d->num_tensors != (size_t)b->k || d->num_payloads != 0) {
        fprintf(stderr, "%s: DATA CHECK FAILED: descriptor has %zu tensors, %zu payloads (expected %d, 0)\n",
                b->who, d->num_tensors, d->num_payloads, b->k);
        return -1;
    }
    for (int t = 0; t < b->k; t++) {
        if (d->tensors[t].bytes != b->tb || d->tensors[t].source_device != WEFT_PIPE_HOST) {
            fprintf(stderr, "%s: DATA CHECK FAILED: descriptor tensor %d: %zu bytes on device %d (expected %zu, host)\n",
                    b->who, t, d->tensors[t].bytes, d->tensors[t].source_device, b->tb);
            return -1;
        }
    }
    return 0;
}

/* Picks slot s for the message just described, poisons its spot bytes and reads into it. */
static int read_into(struct bench *b, int s, weft_pipe_cb_t cb, void *arg)
{
    weft_pipe_buffer_t bufs[PP_MAX_TENSORS];
    int dir = 1 - b->rank;
    for (int t = 0; t < b->k; t++) {
        bufs[t].data = b->slot[s * b->k + t];
        bufs[t].bytes = b->tb;
        pp_poison(b->slot[s * b->k + t], b->tb, b->size, t, dir);
    }
    weft_pipe_allocation_t a = { 0, NULL, (size_t)b->k, bufs };
    int rc = weft_pipe_read(b->pipe, &a, cb, arg);
    return rc ? bad(b, "weft_pipe_read", rc, NULL) : 0;
}

/* After a read into slot s: full check on the first message, spot check after. */
static int check_slot(struct bench *b, int s, int full)
{
    int dir = 1 - b->rank;
    for (int t = 0; t < b->k; t++) {
        const unsigned char *p = b->slot[s * b->k + t];
        if ((full ? pp_check(p, b->tb, b->size, t, dir, b->who) : pp_spot(p, b->tb, b->size, t, dir, b->who)) != 0)
            return -1;
    }
    return 0;
}

static void write_cb(weft_pipe_t *p, int err, const char *why, void *arg);

/* ---- latency, role 0: write, read the echo, next round trip from the read callback ---- */
static void lat0_start(struct bench *b);
/* The end: every round trip done and every write called back (the buffers are freed next). */
static void lat0_maybe_done(struct bench *b)
{
    if (b->iter == b->warm + b->timed && b->writes_cb == b->total_msgs) finish(b, 0);
}
static void lat0_read_cb(weft_pipe_t *p, int err, const char *why, void *arg)
{
    struct bench *b = arg;
    (void)p;
    if (err) { bad(b, "read (echo)", err, why); return; }
    double t = pp_now_us();
    if (check_slot(b, 0, b->iter == 0) != 0) { finish(b, 1); return; }
    if (b->iter >= b->warm) b->times[b->iter - b->warm] = (t - b->t0) / 2;
    if (++b->iter == b->warm + b->timed) { lat0_maybe_done(b); return; }
    lat0_start(b);
}
static void lat0_desc_cb(weft_pipe_t *p, int err, const char *why, const weft_pipe_descriptor_t *d, void *arg)
{
    struct bench *b = arg;
    (void)p;
    if (err) { bad(b, "read_descriptor (echo)", err, why); return; }
    if (check_desc(b, d) != 0) { finish(b, 1); return; }
    read_into(b, 0, lat0_read_cb, b);
}
static void lat0_start(struct bench *b)
{
    b->t0 = pp_now_us();
    int rc = weft_pipe_read_descriptor(b->pipe, lat0_desc_cb, b);
    if (rc) { bad(b, "weft_pipe_read_descriptor", rc, NULL); return; }
    rc = weft_pipe_write(b->pipe, &b->out, write_cb, b);
    if (rc) bad(b, "weft_pipe_write", rc, NULL);
}

/* ---- role 1 (both kinds): read every message; LAT: echo each; BW: ack each window ---- */
static void r1_desc_cb(weft_pipe_t *p, int err, const char *why, const weft_pipe_descriptor_t *d, void *arg);
static void r1_maybe_done(struct bench *b)
{
    long writes = b->kind == LAT ? b->total_msgs : b->total_msgs / b->window;
    if (b->reads == b->total_msgs && b->writes_cb == writes) finish(b, 0);
}
static void write_cb(weft_pipe_t *p, int err, const char *why, void *arg)
{
    struct bench *b = arg;
    (void)p;
    if (err) { bad(b, "write", err, why); return; }
    b->writes_cb++;
    if (b->rank == 1) r1_maybe_done(b);
    else lat0_maybe_done(b);
}
static void r1_read_cb(weft_pipe_t *p, int err, const char *why, void *arg)
{
    struct bench *b = arg;
    long idx = b->reads;   /* reads complete in message order */
    (void)p;
    if (err) { bad(b, "read", err, why); return; }
    int s = b->kind == LAT ? 0 : (int)(idx % b->window);
    if (check_slot(b, s, idx < (b->kind == LAT ? 1 : b->window)) != 0) { finish(b, 1); return; }
    b->reads++;
    int rc = 0;
    if (b->kind == LAT) rc = weft_pipe_write(b->pipe, &b->out, write_cb, b);
    else if (b->reads % b->window == 0) rc = weft_pipe_write(b->pipe, &b->ack, write_cb, b);
    if (rc) { bad(b, "weft_pipe_write", rc, NULL); return; }
    if (b->kind == LAT && b->posted < b->total_msgs) {
        b->posted++;
        rc = weft_pipe_read_descriptor(b->pipe, r1_desc_cb, b);
        if (rc) { bad(b, "weft_pipe_read_descriptor", rc, NULL); return; }
    }
    r1_maybe_done(b);
}
static void r1_desc_cb(weft_pipe_t *p, int err, const char *why, const weft_pipe_descriptor_t *d, void *arg)
{
    struct bench *b = arg;
    (void)p;
    if (err) { bad(b, "read_descriptor", err, why); return; }
    if (check_desc(b, d) != 0) { finish(b, 1); return; }
    /* BW: descriptors run ahead of reads on purpose; slot = message index mod
     * window, free again because the writer waits for the window's ack. */
    long idx = b->described++;
    int s = b->kind == LAT ? 0 : (int)(idx % b->window);
    if (read_into(b, s, r1_read_cb, b) != 0) return;
    if (b->kind == BW && b->posted < b->total_msgs) {
        b->posted++;
        int rc = weft_pipe_read_descriptor(b->pipe, r1_desc_cb, b);
        if (rc) bad(b, "weft_pipe_read_descriptor", rc, NULL);
    }
}

/* ---- bandwidth, role 0: a window of writes, then the ack; next window from the last callback ---- */
static void bw0_start(struct bench *b);
static void bw0_step(struct bench *b)
{
    if (--b->pending > 0) return;
    double t = pp_now_us();
    if (b->iter >= b->warm) b->times[b->iter - b->warm] = t - b->t0;
    if (++b->iter == b->warm + b->timed) { finish(b, 0); return; }
    bw0_start(b);
}
static void bw0_write_cb(weft_pipe_t *p, int err, const char *why, void *arg)
{
    struct bench *b = arg;
    (void)p;
    if (err) { bad(b, "write", err, why); return; }
    bw0_step(b);
}
static void bw0_ack_read_cb(weft_pipe_t *p, int err, const char *why, void *arg)
{
    struct bench *b = arg;
    (void)p;
    if (err) { bad(b, "read (ack)", err, why); return; }
    bw0_step(b);
}
static void bw0_ack_desc_cb(weft_pipe_t *p, int err, const char *why, const weft_pipe_descriptor_t *d, void *arg)
{
    struct bench *b = arg;
    (void)p;
    if (err) { bad(b, "read_descriptor (ack)", err, why); return; }
    if (d->num_tensors != 0 || d->metadata_bytes != 1) {
        fprintf(stderr, "%s: DATA CHECK FAILED: ack descriptor: %zu tensors, %zu metadata bytes\n", b->who,
                d->num_tensors, d->metadata_bytes);
        finish(b, 1);
        return;
    }
    weft_pipe_allocation_t a = { 0, NULL, 0, NULL };
    int rc = weft_pipe_read(b->pipe, &a, bw0_ack_read_cb, b);
    if (rc) bad(b, "weft_pipe_read (ack)", rc, NULL);
}
static void bw0_start(struct bench *b)
{
    b->pending = b->window + 1;
    b->t0 = pp_now_us();
    int rc = weft_pipe_read_descriptor(b->pipe, bw0_ack_desc_cb, b);
    if (rc) { bad(b, "weft_pipe_read_descriptor", rc, NULL); return; }
    for (int j = 0; j < b->window; j++) {
        rc = weft_pipe_write(b->pipe, &b->out, bw0_write_cb, b);
        if (rc) { bad(b, "weft_pipe_write", rc, NULL); return; }
    }
}

/* Waits for finish(): spinning on weft_progress, or on the condition variable. */
static int wait_end(struct bench *b)
{
    double start = pp_now_us();
    if (b->use_cond) {
        pthread_mutex_lock(&b->mu);
        while (!atomic_load(&b->finished)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&b->cv, &b->mu, &ts);
            if (!atomic_load(&b->finished) && pp_now_us() - start > STALL_SECONDS * 1e6) break;
        }
        pthread_mutex_unlock(&b->mu);
    } else {
        unsigned long n = 0;
        while (!atomic_load(&b->finished)) {
            int rc = weft_progress(b->comm);
            if (rc) { bad(b, "weft_progress", rc, NULL); break; }
            if ((++n & 0xfffff) == 0 && pp_now_us() - start > STALL_SECONDS * 1e6) break;
        }
    }
    if (!atomic_load(&b->finished)) {
        fprintf(stderr, "%s: stalled: no end after %.0f s (size %zu, %d tensors, %s)\n", b->who, STALL_SECONDS,
                b->size, b->k, b->kind == LAT ? "lat" : "bw");
        return -1;
    }
    return b->failed ? -1 : 0;
}

static int alloc_test(struct bench *b, size_t size, int k, int kind, double scale)
{
    b->size = size;
    b->k = k;
    b->tb = size / (size_t)k;
    b->kind = kind;
    b->window = kind == LAT ? 1 : pp_window(size);
    int iters = kind == LAT ? pp_lat_iters(size, scale) : pp_bw_windows(size, scale);
    b->warm = pp_warmup(iters);
    b->timed = iters;
    int nslots = b->window;
    b->slot = calloc((size_t)nslots * (size_t)k, sizeof *b->slot);
    b->times = calloc((size_t)iters, sizeof *b->times);
    if (!b->slot || !b->times) return -1;
    for (int i = 0; i < nslots * k; i++)
        if (!(b->slot[i] = malloc(b->tb ? b->tb : 1))) return -1;
    for (int t = 0; t < k; t++) {
        if (!(b->send[t] = malloc(b->tb ? b->tb : 1))) return -1;
        pp_fill(b->send[t], b->tb, size, t, b->rank);
        memset(&b->out_t[t], 0, sizeof b->out_t[t]);
        b->out_t[t].data = b->send[t];
        b->out_t[t].bytes = b->tb;
        b->out_t[t].device = WEFT_PIPE_HOST;
        b->out_t[t].target_device = WEFT_PIPE_HOST;
    }
    memset(&b->out, 0, sizeof b->out);
    b->out.num_tensors = (size_t)k;
    b->out.tensors = b->out_t;
    memset(&b->ack, 0, sizeof b->ack);
    b->ack.metadata = "a";
    b->ack.metadata_bytes = 1;
    b->iter = 0;
    b->posted = b->described = b->reads = b->writes_cb = 0;
    b->total_msgs = kind == LAT ? (long)(b->warm + b->timed) : (long)(b->warm + b->timed) * b->window;
    atomic_store(&b->finished, 0);
    b->failed = 0;
    return 0;
}

static void free_test(struct bench *b)
{
    if (b->slot)
        for (int i = 0; i < b->window * b->k; i++) free(b->slot[i]);
    free(b->slot);
    b->slot = NULL;
    for (int t = 0; t < PP_MAX_TENSORS; t++) { free(b->send[t]); b->send[t] = NULL; }
    free(b->times);
    b->times = NULL;
}

/* One pipe test; returns the median (LAT: half round trip, us; BW: window time, us) on rank 0. */
static int run_pipe(struct bench *b, double *median)
{
    if (b->rank == 0) {
        if (b->kind == LAT) lat0_start(b);
        else bw0_start(b);
    } else {
        b->posted = 1;
        int rc = weft_pipe_read_descriptor(b->pipe, r1_desc_cb, b);
        if (rc) return bad(b, "weft_pipe_read_descriptor", rc, NULL);
    }
    if (wait_end(b) != 0) return -1;
    *median = b->rank == 0 ? pp_median(b->times, b->timed) : 0.0;
    return 0;
}

/* The same bytes through weft_isend/weft_irecv (one buffer): the reference. */
static int run_p2p(struct bench *b, double *median)
{
    const int TAG = 1, ACK = 2;
    int peer = 1 - b->rank, dir = peer, rc = 0;
    unsigned char ack = 0;
    weft_request_t *reqs[16];   /* pp_window() <= 16 */
    int n = b->warm + b->timed;
    for (int i = 0; i < n && rc == 0; i++) {
        double t0 = pp_now_us();
        int full = i == 0;
        if (b->kind == LAT) {
            pp_poison(b->slot[0], b->tb, b->size, 0, dir);
            /* blocking calls, as weft-perf sendrecv times them */
            if (b->rank == 0) {
                if ((rc = weft_send(b->comm, b->send[0], b->size, peer, TAG)) == 0)
                    rc = weft_recv(b->comm, b->slot[0], b->size, peer, TAG, NULL);
            } else {
                if ((rc = weft_recv(b->comm, b->slot[0], b->size, peer, TAG, NULL)) == 0)
                    rc = weft_send(b->comm, b->send[0], b->size, peer, TAG);
            }
            if (rc == 0 && (full ? pp_check(b->slot[0], b->tb, b->size, 0, dir, b->who)
                                 : pp_spot(b->slot[0], b->tb, b->size, 0, dir, b->who)) != 0)
                return -1;
            if (b->rank == 0 && i >= b->warm) b->times[i - b->warm] = (pp_now_us() - t0) / 2;
        } else if (b->rank == 0) {
            for (int j = 0; j < b->window && rc == 0; j++)
                rc = weft_isend(b->comm, b->send[0], b->size, peer, TAG, &reqs[j]);
            if (rc == 0) rc = weft_waitall((size_t)b->window, reqs, NULL);
            if (rc == 0) rc = weft_recv(b->comm, &ack, 1, peer, ACK, NULL);
            if (i >= b->warm) b->times[i - b->warm] = pp_now_us() - t0;
        } else {
            for (int j = 0; j < b->window && rc == 0; j++) {
                pp_poison(b->slot[j], b->tb, b->size, 0, dir);
                rc = weft_irecv(b->comm, b->slot[j], b->size, peer, TAG, &reqs[j]);
            }
            if (rc == 0) rc = weft_waitall((size_t)b->window, reqs, NULL);
            for (int j = 0; j < b->window && rc == 0; j++)
                if ((full ? pp_check(b->slot[j], b->tb, b->size, 0, dir, b->who)
                          : pp_spot(b->slot[j], b->tb, b->size, 0, dir, b->who)) != 0)
                    return -1;
            if (rc == 0) rc = weft_send(b->comm, &ack, 1, peer, ACK);
        }
    }
    if (rc) return bad(b, "weft p2p", rc, NULL);
    *median = b->rank == 0 ? pp_median(b->times, b->timed) : 0.0;
    return 0;
}

static int has(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: mpirun -np 2 pipe_perf_weft [-b SIZE] [-e SIZE] [-k 1,8] [-m lat,bw] [-p pipe|p2p] "
                    "[-s SCALE] [-c NAME] [-w progress|cond]\n");
}

int main(int argc, char **argv)
{
    size_t lo = 8, hi = 64 * PP_MIB;
    const char *klist = "1,8", *mlist = "lat,bw", *proto = "pipe", *conf = NULL, *wait = NULL;
    double scale = 1.0;
    MPI_Init(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v || a[0] != '-' || a[2]) { usage(); MPI_Abort(MPI_COMM_WORLD, 2); }
        switch (a[1]) {
        case 'b': lo = pp_parse_size(v); break;
        case 'e': hi = pp_parse_size(v); break;
        case 'k': klist = v; break;
        case 'm': mlist = v; break;
        case 'p': proto = v; break;
        case 's': scale = atof(v); break;
        case 'c': conf = v; break;
        case 'w': wait = v; break;
        default: usage(); MPI_Abort(MPI_COMM_WORLD, 2);
        }
        i++;
    }
    int p2p = strcmp(proto, "p2p") == 0;
    if ((!p2p && strcmp(proto, "pipe") != 0) || lo == 0 || hi < lo || scale <= 0) {
        usage();
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int nranks;
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2) {
        fprintf(stderr, "pipe_perf_weft: needs exactly 2 ranks (mpirun -np 2), got %d\n", nranks);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    static struct bench B;
    struct bench *b = &B;
    int rc = weft_comm_create(MPI_COMM_WORLD, &b->comm);
    if (rc) {
        fprintf(stderr, "weft_comm_create: %d: %s\n", rc, weft_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    b->rank = weft_comm_rank(b->comm);
    snprintf(b->who, sizeof b->who, "pipe_perf_weft rank %d", b->rank);
    const char *tp = getenv("WEFT_TRANSPORTS");
    const char *pt = getenv("WEFT_PROGRESS_THREAD");
    int thread = pt && strcmp(pt, "1") == 0;
    char confbuf[96];
    if (!conf) {
        snprintf(confbuf, sizeof confbuf, "%s%s%s", p2p ? "p2p-" : "", tp && *tp ? tp : "default",
                 thread ? "+thread" : "");
        for (char *c = confbuf; *c; c++) if (*c == ',') *c = '-';
        conf = confbuf;
    }
    b->use_cond = wait ? strcmp(wait, "cond") == 0 : thread;
    if (b->use_cond && !thread) {   /* nobody would run the callbacks */
        fprintf(stderr, "pipe_perf_weft: -w cond needs WEFT_PROGRESS_THREAD=1 (else callbacks run only in weft_progress)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    if (!p2p && (rc = weft_pipe_open(b->comm, 1 - b->rank, 0, &b->pipe)) != 0) {
        fprintf(stderr, "%s: weft_pipe_open: %d: %s\n", b->who, rc, weft_comm_last_error(b->comm));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (b->rank == 0) {
        double load = 0;
        FILE *f = fopen("/proc/loadavg", "r");
        if (f) { if (fscanf(f, "%lf", &load) != 1) load = 0; fclose(f); }
        printf("# pipe_perf_weft conf=%s api=%s WEFT_TRANSPORTS=%s WEFT_PROGRESS_THREAD=%s wait=%s load=%.2f\n", conf,
               p2p ? "weft_isend/irecv" : "weft_pipe", tp ? tp : "(unset)", pt ? pt : "(unset)",
               b->use_cond ? "cond" : "progress", load);
        fflush(stdout);
    }
    int status = 0;
    for (size_t si = 0; si < PP_NSIZES && status == 0; si++) {
        size_t size = pp_sizes[si];
        if (size < lo || size > hi) continue;
        for (int k = 1; k <= PP_MAX_TENSORS && status == 0; k++) {
            char kw[8];
            snprintf(kw, sizeof kw, "%d", k);
            if (!has(klist, kw) || (p2p && k != 1)) continue;
            double med[2] = { 0, 0 };
            int iters[2] = { 0, 0 }, window = 0;
            for (int kind = LAT; kind <= BW && status == 0; kind++) {
                if (!has(mlist, kind == LAT ? "lat" : "bw")) continue;
                if (alloc_test(b, size, k, kind, scale) != 0) {
                    fprintf(stderr, "%s: out of memory for %zu bytes\n", b->who, size);
                    status = 1;
                } else {
                    status = (p2p ? run_p2p(b, &med[kind]) : run_pipe(b, &med[kind])) ? 1 : 0;
                    iters[kind] = b->timed;
                    if (kind == BW) window = b->window;
                }
                free_test(b);
            }
            if (status == 0 && b->rank == 0)
                pp_print_row("weft", conf, size, k, med[LAT], iters[LAT],
                             med[BW] > 0 ? (double)size * window / (med[BW] * 1e3) : 0.0, window, iters[BW]);
        }
    }
    if (status != 0) {
        fprintf(stderr, "%s: FAILED\n", b->who);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Neither side closes before both are done: a close discards what the
     * peer has not read yet (the last window's ack). */
    if ((rc = weft_barrier(b->comm)) != 0)
        fprintf(stderr, "%s: weft_barrier: %d: %s\n", b->who, rc, weft_comm_last_error(b->comm));
    if (b->pipe && (rc = weft_pipe_close(b->pipe)) != 0)
        fprintf(stderr, "%s: weft_pipe_close: %d: %s\n", b->who, rc, weft_comm_last_error(b->comm));
    rc = weft_comm_destroy(b->comm);
    if (rc) fprintf(stderr, "%s: weft_comm_destroy: %d (%s)\n", b->who, rc, weft_strerror(rc));  /* the comm is gone */
    MPI_Finalize();
    return rc ? 1 : 0;
}
