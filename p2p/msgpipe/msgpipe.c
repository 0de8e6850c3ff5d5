/*
 * Message pipes: descriptor first, then the reader allocates, then reads.
 *
 * A pipe (peer, id) owns two library lanes of the pipe to peer (p2p/tags.h):
 *
 *   control lane  one descriptor per message, then one close marker
 *   data lane     one pipe-layer message per buffer not carried inline
 *
 * Writer                                    Reader
 *   write(msg) ---- descriptor (ctrl) ----->  ctrl receive always posted
 *              ---- buffer 0 (data) ------>   (waits unmatched: rendezvous
 *              ---- buffer 2 (data) ------>    RTS or eager copy)
 *                                           read_descriptor -> callback(desc)
 *                                           read(alloc): a receive per buffer,
 *                                             in message order -> callback
 *
 * The descriptor is header | a record per buffer | the message's metadata |
 * each buffer's metadata | the inline buffers' bytes. Host buffers go inline
 * while they fit WEFT_PIPE_INLINE and the pair's eager limit, so a small
 * message is one transport message; every other buffer is one message on
 * the data lane, sent at write time (no extra round trip: a large one waits
 * as a rendezvous announcement until the reader posts its buffer), and
 * takes the rendezvous path the pipe layer picks for its (source, target)
 * memory kinds (CMA, bounce ring, TCP stripes, RDMA, CUDA IPC, staging),
 * each buffer on its own, several in flight at once -- except host buffers
 * above the pair's eager limit and up to VEC_PIECE_MAX, which go together
 * as vectored messages (at most WEFT_IOV_MAX pieces each, ahead of the
 * message's other buffers) where the pair's carrier moves those (shm,
 * self): one rendezvous and one copy call for all of them; the descriptor
 * marks them (rec.vec), so the reader posts the same receives. Both lanes
 * are FIFO, and reads are taken in message order, so the k-th receive on
 * the data lane always meets the k-th message sent: no sequence matching
 * is needed.
 * A descriptor larger than the posted control buffer (CTRL_BUF) comes in
 * two parts; the first says the total.
 *
 * Closing. Each side sends one close marker, when closed locally or on
 * seeing the peer's marker, and nothing after it. Everything before a
 * marker is consumed by its receiver: read if a read is posted, else
 * discarded (a discarding receive per buffer: the pipe layer drops the
 * data without moving it, and the writer is not told). A pipe is freed once it
 * was closed locally, both markers passed and no request of its is
 * outstanding; until then its id stays taken. A failed peer breaks the
 * pipe instead (the pipe layer fails every request with the error that
 * names it).
 *
 * Locking: one mutex per comm (m->lock) over every pipe of the comm, taken
 * before the pipe layer's own lock (the p2p calls take that one). Callbacks
 * run with no lock held, by one thread at a time per comm (the dispatcher),
 * in the order they became due: per pipe, writes in write order, reads and
 * descriptors in message order. Handles are generation-checked slots of a
 * process-wide table, so a closed pipe's handle is refused, not followed.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "core.h"
#include "devcopy.h"
#include "engine.h"
#include "iov.h"
#include "list.h"
#include "log.h"
#include "msgpipe.h"
#include "p2p.h"
#include "tags.h"
#ifdef WEFT_HAVE_CUDA_HEADERS
#include "cudawrap.h"
#include "deadline.h"
#endif

#define WIRE_MAGIC  0x31504d57u          /* "WMP1" */
#define KIND_MSG    1
#define KIND_CLOSE  2
/* The posted control receive. A descriptor larger than this comes in two
 * parts (the rest received into a buffer of the announced size). */
#define CTRL_BUF    (64u << 10)
/* Most buffers in one message (keeps a malformed count from allocating much). */
#define MAX_BUFFERS (1u << 20)
/* The reader's window: while this many messages, or WEFT_EAGER_WINDOW bytes
 * of descriptors, arrived that no descriptor request took, the control
 * receive is not posted again. The writer's further descriptors then wait
 * in the pipe layer, whose flow control holds them at the writer once the
 * pair's window of unexpected messages is full: a reader that does not
 * read holds at most about two windows of a writer's small messages, not
 * everything it was sent (500k x 1 KiB grew a reader by 670 MB; issue 28,
 * item 8). The writer's callbacks wait meanwhile, as for large buffers. */
#define ARRIVED_WINDOW_MSGS 4096u

struct wire_hdr {
    uint32_t magic;
    uint16_t kind;
    uint16_t pad;
    uint64_t seq;
    uint64_t total;         /* bytes of the whole descriptor, this header included */
    uint64_t meta_bytes;    /* the message's metadata */
    uint32_t npay, nten;
};
struct wire_rec {
    uint64_t bytes;
    uint64_t meta_bytes;
    int32_t  src_dev, tgt_dev;
    uint32_t inl;           /* 1: the bytes are in the descriptor */
    uint32_t vec;           /* 1: the bytes travel in one of the message's vectored data messages */
};

/* One message as its reader holds it. Shared by the descriptor callback and
 * the read (or discard) of that message: freed when the last lets go. */
struct mp_msg {
    struct weft_list          link;    /* pipe->arrived or pipe->delivered */
    int                       refs;
    uint64_t                  seq;
    unsigned char            *wire;
    size_t                    wire_bytes;   /* the descriptor's size (the reader's window) */
    size_t                    nbuf;    /* payloads, then tensors */
    size_t                    ngroup;  /* buffers with rec.vec set */
    const struct wire_rec    *rec;     /* [nbuf], in wire */
    const unsigned char     **inl;     /* [nbuf]: the inline bytes, or NULL */
    weft_pipe_descriptor_t    desc;
    weft_pipe_payload_desc_t *pd;
    weft_pipe_tensor_desc_t  *td;
};

enum { OP_WRITE = 1, OP_DESC, OP_READ, OP_DISCARD, OP_MARKER };

/* One operation of a pipe: a write, a descriptor request, a read, or
 * weft's own (the discard of a message, the close marker), which have no
 * callback. Requests are NULLed as they are reaped. */
struct mp_op {
    struct weft_list           link;     /* its pipe's queue, then m->ready */
    int                        kind;
    weft_pipe_t               *handle;   /* what the callback gets */
    weft_pipe_cb_t             cb;
    weft_pipe_descriptor_cb_t  dcb;
    void                      *arg;
    int                        err;
    int                        closed;   /* the pipe closed while it was pending */
    char                       why[512];
    struct mp_msg             *msg;      /* DESC, READ, DISCARD */
    uint64_t                   seq;
    size_t                     nreq;
    struct weft_request      **req;      /* [nreq] */
    /* WRITE: data-lane sends, started in order once the streams passed. */
    unsigned char             *wire;
    size_t                     nsend, started;
    const void               **sbuf;     /* [nsend - nvec]: the buffers that go one message each */
    size_t                    *sbytes;   /* [nsend - nvec] */
    /* WRITE and READ: the grouped buffers (rec.vec), in buffer order; they
     * go as nvec vectored messages of at most WEFT_IOV_MAX pieces, before
     * the message's other data-lane buffers (see write). */
    struct weft_iov        *viov;     /* [ngroup] */
    size_t                     ngroup, nvec;
    /* READ: grouped buffers the allocation put in device memory arrive in
     * host memory first (a vectored message is host memory on both sides) */
    struct mp_bounce {
        void  *dst, *tmp;
        size_t bytes;
    }                         *bounce;
    size_t                     nbounce;
    size_t                     nevents;
    void                     **events;   /* cudaEvent_t recorded on the tensors' streams */
};

struct mp_pipe {
    struct weft_list      link;          /* m->pipes */
    struct weft_msgpipes *m;
    int                   peer, id, ctag, dtag;
    weft_pipe_t          *handle;        /* NULL once closed locally */
    uint32_t              slot;
    uint64_t              wseq;          /* messages written */
    /* queues of operations, in order */
    struct weft_list      writes, descs, reads, own;   /* own: DISCARD and MARKER */
    /* The first write whose data-lane sends are not all started (sends
     * start in write order: every write before it has started all of its),
     * or NULL. start_sends begins here: a writer far ahead of its reader
     * holds thousands of pending writes, and scanning them from the head at
     * every write and every pass made each write O(pending) (50k x 1 KiB:
     * 13 s of start_sends). */
    struct mp_op         *send_next;
    struct weft_list      arrived;       /* messages no descriptor request took yet */
    size_t                narrived, arrived_bytes;   /* of arrived: the reader's window (ARRIVED_WINDOW_MSGS) */
    struct weft_list      delivered;     /* descriptors given out, not yet read */
    /* the control receive */
    struct weft_request  *ctrl;
    unsigned char        *ctrl_buf;
    unsigned char        *rest;          /* a two-part descriptor: the whole */
    size_t                rest_total;
    /* closing */
    int                   local_closed, sent_close, got_close;
    int                   broken;        /* the code that broke it (peer failed, abort) */
    char                  broken_why[512];
};

struct weft_msgpipes {
    struct weft_p2p  *p2p;
    struct weft_core *core;
    pthread_mutex_t   lock;
    struct weft_list  pipes;
    size_t            npipes;
    struct weft_list  ready;          /* operations whose callbacks are due */
    int               dispatching;
    int               destroying;     /* weft_comm_destroy: closing does not wait for the peer's marker */
    unsigned          passes;         /* progress passes: per-request clocks are looked at every 64th */
    /* WEFT_PROGRESS_THREAD=1: a client of the comm's engine, whose
     * progress thread moves the pipes and runs the callbacks */
    int               use_thread;
    int               registered;
};

/* ---- handles: a process-wide table of (pipe, generation) ---- */

static pthread_mutex_t tab_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { struct mp_pipe *pipe; uint32_t gen; } *tab;
static uint32_t tab_cap, tab_hint;

static weft_pipe_t *tab_add(struct mp_pipe *pp)
{
    weft_pipe_t *h = NULL;
    pthread_mutex_lock(&tab_lock);
    for (uint32_t i = 0; i < tab_cap; i++) {
        uint32_t k = (tab_hint + i) % tab_cap;
        if (tab[k].pipe == NULL) {
            pp->slot = k;
            goto found;
        }
    }
    {
        uint32_t cap = tab_cap ? 2 * tab_cap : 64;
        void *t = cap <= (1u << 30) ? realloc(tab, (size_t)cap * sizeof(*tab)) : NULL;
        if (t == NULL)
            goto out;
        tab = t;
        for (uint32_t i = tab_cap; i < cap; i++) {
            tab[i].pipe = NULL;
            tab[i].gen = 1;
        }
        pp->slot = tab_cap;
        tab_cap = cap;
    }
found:
    tab[pp->slot].pipe = pp;
    tab_hint = pp->slot + 1;
    h = (weft_pipe_t *)(uintptr_t)(((uint64_t)tab[pp->slot].gen << 32) | ((uint64_t)pp->slot + 1));
out:
    pthread_mutex_unlock(&tab_lock);
    return h;
}

/* Table lock held. */
static struct mp_pipe *tab_find(const weft_pipe_t *h)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    uint32_t slot = (uint32_t)(v & 0xffffffffu), gen = (uint32_t)(v >> 32);
    if (slot == 0 || slot > tab_cap || tab[slot - 1].gen != gen)
        return NULL;
    return tab[slot - 1].pipe;
}

/* The pipe of a live handle with its comm's lock held, or NULL. The comm
 * lock is taken before the table's everywhere (open adds, close releases
 * under it), so the handle is looked up, the table let go, the comm lock
 * taken, and the handle looked up again: a pipe is freed only under its
 * comm lock and after it left the table, so once it is found again with
 * the comm lock held it stays. */
static struct mp_pipe *lookup_lock(const weft_pipe_t *h)
{
    pthread_mutex_lock(&tab_lock);
    struct mp_pipe *pp = tab_find(h);
    struct weft_msgpipes *m = pp ? pp->m : NULL;
    pthread_mutex_unlock(&tab_lock);
    if (m == NULL)
        return NULL;
    pthread_mutex_lock(&m->lock);
    pthread_mutex_lock(&tab_lock);
    struct mp_pipe *again = tab_find(h);
    pthread_mutex_unlock(&tab_lock);
    if (again != pp) {
        pthread_mutex_unlock(&m->lock);
        return NULL;
    }
    return pp;
}

static void tab_release(struct mp_pipe *pp)
{
    pthread_mutex_lock(&tab_lock);
    tab[pp->slot].pipe = NULL;
    if (++tab[pp->slot].gen == 0)
        tab[pp->slot].gen = 1;
    pthread_mutex_unlock(&tab_lock);
    pp->handle = NULL;
}

static int bad_handle(const char *fn)
{
    return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: the pipe handle is unknown or was closed", fn);
}

/* ---- errors ---- */

/* The comm's last error without its rank, cut to n (the text's head names
 * the call and peer); "" when none. */
static void last_error(struct weft_core *core, char *out, size_t n)
{
    struct weft_error e;
    weft_error_get(core, &e);
    weft_error_format(&e, 0, out, n);
}

static const char *op_name(int kind)
{
    switch (kind) {
    case OP_WRITE: return "weft_pipe_write";
    case OP_DESC:  return "weft_pipe_read_descriptor";
    case OP_READ:  return "weft_pipe_read";
    default:       return "weft_pipe_close";
    }
}

/* Records op's first failure; the text names rank, peer, pipe, operation. */
static void op_fail(struct mp_pipe *pp, struct mp_op *op, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void op_fail(struct mp_pipe *pp, struct mp_op *op, int code, const char *fmt, ...)
{
    char detail[400];
    va_list ap;

    if (op->err != WEFT_SUCCESS)
        return;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    op->err = code;
    snprintf(op->why, sizeof(op->why), "rank %d: %s on pipe %d to rank %d (message %llu): %s (%s)",
             pp->m->core->rank, op_name(op->kind), pp->id, pp->peer, (unsigned long long)op->seq, detail,
             weft_err_str(code));
}

/* op failed with code for a reason already said in full (text ends with
 * its code's words): the operation's own words, then text. */
static void op_fail_text(struct mp_pipe *pp, struct mp_op *op, int code, const char *text)
{
    if (op->err != WEFT_SUCCESS)
        return;
    op->err = code;
    /* the head names rank, call, pipe, peer, message: at most ~110 bytes */
    snprintf(op->why, sizeof(op->why), "rank %d: %s on pipe %d to rank %d (message %llu): %.390s",
             pp->m->core->rank, op_name(op->kind), pp->id, pp->peer, (unsigned long long)op->seq, text);
}

/* The comm's last error without its "rank R: " head (the pipe layer's
 * words for a failure it just decided: they name the peer and why). */
static void reason(struct mp_pipe *pp, int code, char *out, size_t n)
{
    char le[512];
    const char *t = le;
    last_error(pp->m->core, le, sizeof(le));
    if (*t == '\0')
        snprintf(out, n, "the transfer failed (%s)", weft_err_str(code));
    else
        snprintf(out, n, "%.*s", (int)(n - 1), t);
}

/* A request of op's failed with code. */
static void op_fail_req(struct mp_pipe *pp, struct mp_op *op, int code)
{
    char why[400];
    if (op->err != WEFT_SUCCESS)
        return;
    reason(pp, code, why, sizeof(why));
    op_fail_text(pp, op, code, why);
}

/* The pipe breaks with code; why: the pipe layer's last error. */
static void break_with(struct mp_pipe *pp, int code)
{
    pp->broken = code;
    reason(pp, code, pp->broken_why, sizeof(pp->broken_why));
}

/* The pipe breaks with code for a reason of this file's. */
static void break_because(struct mp_pipe *pp, int code, const char *what)
{
    pp->broken = code;
    snprintf(pp->broken_why, sizeof(pp->broken_why), "%s (%s)", what, weft_err_str(code));
}

/* ---- messages ---- */

static void msg_put(struct mp_msg *g)
{
    if (g && --g->refs == 0) {
        free(g->wire);
        free(g->inl);
        free(g->pd);
        free(g->td);
        free(g);
    }
}

/* Parses a descriptor (wire: total bytes, owned by the message on
 * success). NULL with *why set: malformed. */
static struct mp_msg *msg_parse(unsigned char *wire, size_t total, char *why, size_t whylen)
{
    const struct wire_hdr *h = (const void *)wire;
    struct mp_msg *g = NULL;
    size_t nbuf, off, meta_off, inl_off;

    if (total < sizeof(*h) || h->total != total) {
        snprintf(why, whylen, "a descriptor of %zu bytes says %llu", total,
                 total >= sizeof(*h) ? (unsigned long long)h->total : 0ULL);
        return NULL;
    }
    nbuf = (size_t)h->npay + h->nten;
    if (h->npay > MAX_BUFFERS || h->nten > MAX_BUFFERS || nbuf > MAX_BUFFERS ||
        sizeof(*h) + nbuf * sizeof(struct wire_rec) > total) {
        snprintf(why, whylen, "a descriptor announces %u payloads and %u tensors in %zu bytes", h->npay, h->nten,
                 total);
        return NULL;
    }
    g = calloc(1, sizeof(*g));
    if (g == NULL)
        goto nomem;
    g->inl = calloc(nbuf ? nbuf : 1, sizeof(*g->inl));
    g->pd = calloc(h->npay ? h->npay : 1, sizeof(*g->pd));
    g->td = calloc(h->nten ? h->nten : 1, sizeof(*g->td));
    if (g->inl == NULL || g->pd == NULL || g->td == NULL)
        goto nomem;
    g->rec = (const void *)(wire + sizeof(*h));
    g->nbuf = nbuf;
    g->seq = h->seq;
    /* Walk the variable part with overflow checks: a peer's bytes. */
    meta_off = sizeof(*h) + nbuf * sizeof(struct wire_rec);
    off = meta_off;
    if (h->meta_bytes > total - off)
        goto bad;
    g->desc.metadata = h->meta_bytes ? wire + off : NULL;
    g->desc.metadata_bytes = (size_t)h->meta_bytes;
    off += (size_t)h->meta_bytes;
    for (size_t i = 0; i < nbuf; i++) {
        if (g->rec[i].meta_bytes > total - off)
            goto bad;
        const void *md = g->rec[i].meta_bytes ? wire + off : NULL;
        if (i < h->npay) {
            g->pd[i].bytes = (size_t)g->rec[i].bytes;
            g->pd[i].metadata = md;
            g->pd[i].metadata_bytes = (size_t)g->rec[i].meta_bytes;
        } else {
            weft_pipe_tensor_desc_t *t = &g->td[i - h->npay];
            t->bytes = (size_t)g->rec[i].bytes;
            t->source_device = g->rec[i].src_dev;
            t->target_device = g->rec[i].tgt_dev;
            t->metadata = md;
            t->metadata_bytes = (size_t)g->rec[i].meta_bytes;
        }
        off += (size_t)g->rec[i].meta_bytes;
    }
    inl_off = off;
    for (size_t i = 0; i < nbuf; i++) {
        /* grouped: on the data lane (not inline), with bytes */
        if (g->rec[i].vec > 1 || (g->rec[i].vec && (g->rec[i].inl || g->rec[i].bytes == 0)))
            goto bad;
        g->ngroup += g->rec[i].vec;
        if (!g->rec[i].inl)
            continue;
        if (g->rec[i].bytes > total - inl_off)
            goto bad;
        g->inl[i] = wire + inl_off;
        inl_off += (size_t)g->rec[i].bytes;
    }
    if (inl_off != total)
        goto bad;
    g->desc.num_payloads = h->npay;
    g->desc.payloads = g->pd;
    g->desc.num_tensors = h->nten;
    g->desc.tensors = g->td;
    g->wire = wire;
    g->refs = 1;
    return g;
bad:
    snprintf(why, whylen, "a descriptor of %zu bytes whose sizes do not add up", total);
    goto out;
nomem:
    snprintf(why, whylen, "no memory for a descriptor of %zu bytes", total);
out:
    if (g) {
        free(g->inl);
        free(g->pd);
        free(g->td);
        free(g);
    }
    return NULL;
}

/* ---- operations ---- */

static struct mp_op *op_new(struct mp_pipe *pp, int kind, size_t nreq)
{
    struct mp_op *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return NULL;
    op->req = nreq ? calloc(nreq, sizeof(*op->req)) : NULL;
    if (nreq && op->req == NULL) {
        free(op);
        return NULL;
    }
    op->kind = kind;
    op->handle = pp->handle;
    return op;
}

static void op_free(struct mp_op *op)
{
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *cu = weft_cuda_get();
    for (size_t i = 0; i < op->nevents; i++)
        if (op->events[i] && cu)
            cu->EventDestroy((cudaEvent_t)op->events[i]);
#endif
    free(op->events);
    for (size_t i = 0; i < op->nbounce; i++)
        free(op->bounce[i].tmp);
    free(op->bounce);
    free(op->viov);
    free(op->sbuf);
    free(op->sbytes);
    free(op->wire);
    free(op->req);
    msg_put(op->msg);
    free(op);
}

/* Reaps op's finished requests (the pipe layer frees them); 1 when none
 * is outstanding. */
static int op_reap(struct mp_pipe *pp, struct mp_op *op)
{
    int all = 1;
    for (size_t i = 0; i < op->nreq; i++) {
        struct weft_request *r = op->req[i];
        weft_status_t st;
        int done = 0;
        if (r == NULL)
            continue;
        if (!weft_p2p_done(r)) {
            all = 0;
            continue;
        }
        int rc = weft_p2p_test(r, &done, &st);
        op->req[i] = NULL;
        if (rc != WEFT_SUCCESS)
            op_fail_req(pp, op, rc);
    }
    return all;
}

/* op is due: its callback joins the ready queue (weft's own ops are freed). */
static void op_due(struct weft_msgpipes *m, struct mp_pipe *pp, struct mp_op *op)
{
    if (op == pp->send_next)   /* not expected (a due write started all its sends): kept right regardless */
        pp->send_next = op->link.next == &pp->writes ? NULL : weft_container_of(op->link.next, struct mp_op, link);
    weft_list_del(&op->link);
    if (op->err == WEFT_SUCCESS && op->closed && op->kind != OP_DISCARD && op->kind != OP_MARKER)
        op_fail(pp, op, WEFT_ERR_CLOSED, "the pipe was closed %s before it completed",
                pp->local_closed ? "by this rank" : "by the peer");
    if (op->kind == OP_DISCARD || op->kind == OP_MARKER || (op->cb == NULL && op->dcb == NULL)) {
        op_free(op);
        return;
    }
    weft_list_add_tail(&m->ready, &op->link);
}

/* ---- the lanes ---- */

/* Whether the reader's window is full (ARRIVED_WINDOW_MSGS). A pipe
 * closed locally drains regardless: what arrives is discarded at once. */
static int window_full(const struct mp_pipe *pp)
{
    return !pp->local_closed &&
           (pp->narrived >= ARRIVED_WINDOW_MSGS || pp->arrived_bytes >= pp->m->core->cfg.eager_window);
}

/* Posts the control receive (the next descriptor or the close marker),
 * unless the reader's window is full: deliver() posts it again. */
static void ctrl_post(struct mp_pipe *pp)
{
    if (pp->ctrl || pp->got_close || pp->broken || pp->m->destroying || window_full(pp))
        return;
    if (pp->ctrl_buf == NULL && (pp->ctrl_buf = malloc(CTRL_BUF)) == NULL) {
        break_because(pp, WEFT_ERR_NO_MEMORY, "no memory for the descriptor buffer");
        return;
    }
    int rc = weft_p2p_irecv(pp->m->p2p, pp->ctrl_buf, CTRL_BUF, pp->peer, pp->ctag, &pp->ctrl, "weft_pipe_open");
    if (rc != WEFT_SUCCESS) {
        pp->ctrl = NULL;
        break_with(pp, rc);
    }
}

/* The largest buffer a write groups into a vectored message: 1 MiB keeps
 * a reader's host bounce for a grouped buffer it puts in device memory
 * bounded, and covers what was measured (docs/benchmarks.md, "Message
 * pipes: one rendezvous for a message's buffers"): 8 tensors of 8 KiB-
 * 512 KiB grouped took 0.6-0.85x the time of a message each. */
#define VEC_PIECE_MAX ((size_t)1 << 20)

/* The vectored data messages that carry n grouped buffers. */
static size_t vec_msgs(size_t n)
{
    return (n + WEFT_IOV_MAX - 1) / WEFT_IOV_MAX;
}

/* Posts a discarding receive for every buffer of g that is on the data
 * lane: the pipe layer consumes each and moves none of its data. */
static void discard(struct mp_pipe *pp, struct mp_msg *g)
{
    size_t n = vec_msgs(g->ngroup);
    for (size_t i = 0; i < g->nbuf; i++)
        n += !g->rec[i].inl && !g->rec[i].vec && g->rec[i].bytes > 0;
    if (n == 0 || pp->broken) {
        msg_put(g);
        return;
    }
    struct mp_op *op = op_new(pp, OP_DISCARD, n);
    if (op == NULL) {
        /* The lane cannot be kept in step: break the pipe rather than hand
         * a later read the wrong bytes. */
        break_because(pp, WEFT_ERR_NO_MEMORY, "no memory to discard a message");
        msg_put(g);
        return;
    }
    op->msg = g;
    op->seq = g->seq;
    /* one discarding receive per data-lane message: each vectored one, then each other buffer */
    for (size_t k = 0; k < n; k++)
        if (weft_p2p_idiscard(pp->m->p2p, pp->peer, pp->dtag, &op->req[k], "weft_pipe_read") != WEFT_SUCCESS)
            op->req[k] = NULL;
    op->nreq = n;
    weft_list_add_tail(&pp->own, &op->link);
}

static void send_marker(struct mp_pipe *pp)
{
    struct wire_hdr h;
    if (pp->sent_close)
        return;
    pp->sent_close = 1;
    if (pp->broken)
        return;
    struct mp_op *op = op_new(pp, OP_MARKER, 1);
    if (op == NULL)
        return;   /* the peer then learns from its timeout; nothing of ours waits on it */
    op->wire = calloc(1, sizeof(h));
    if (op->wire == NULL) {
        op_free(op);
        return;
    }
    memset(&h, 0, sizeof(h));
    h.magic = WIRE_MAGIC;
    h.kind = KIND_CLOSE;
    h.seq = pp->wseq;
    h.total = sizeof(h);
    memcpy(op->wire, &h, sizeof(h));
    if (weft_p2p_isend(pp->m->p2p, op->wire, sizeof(h), pp->peer, pp->ctag, &op->req[0], "weft_pipe_close") !=
        WEFT_SUCCESS)
        op->req[0] = NULL;
    op->nreq = 1;
    weft_list_add_tail(&pp->own, &op->link);
}

/* Every operation pending on pp will complete with WEFT_ERR_CLOSED; what
 * arrived and nobody reads is dropped. Closed locally or by the peer. */
static void close_pending(struct weft_msgpipes *m, struct mp_pipe *pp)
{
    struct weft_list *n;
    weft_list_for_each(x, &pp->writes)
        weft_container_of(x, struct mp_op, link)->closed = 1;
    weft_list_for_each(x, &pp->reads)
        weft_container_of(x, struct mp_op, link)->closed = 1;
    while ((n = weft_list_pop(&pp->descs)) != NULL) {
        struct mp_op *op = weft_container_of(n, struct mp_op, link);
        weft_list_add_tail(&pp->descs, &op->link);   /* op_due unlinks it */
        op->closed = 1;
        op_due(m, pp, op);
    }
    while ((n = weft_list_pop(&pp->arrived)) != NULL)
        discard(pp, weft_container_of(n, struct mp_msg, link));
    pp->narrived = pp->arrived_bytes = 0;
    while ((n = weft_list_pop(&pp->delivered)) != NULL)
        discard(pp, weft_container_of(n, struct mp_msg, link));
    /* Closed locally with the window full: drain what is still coming
     * (discarded on arrival) up to the peer's marker. */
    ctrl_post(pp);
}

/* The pipe broke (its peer failed, the comm was aborted): operations
 * complete as their requests fail; descriptor requests fail now. */
static void pipe_break(struct weft_msgpipes *m, struct mp_pipe *pp)
{
    struct weft_list *n;
    while ((n = weft_list_pop(&pp->descs)) != NULL) {
        struct mp_op *op = weft_container_of(n, struct mp_op, link);
        weft_list_add_tail(&pp->descs, &op->link);
        op_fail_text(pp, op, pp->broken, pp->broken_why);
        op_due(m, pp, op);
    }
    while ((n = weft_list_pop(&pp->arrived)) != NULL)
        msg_put(weft_container_of(n, struct mp_msg, link));
    pp->narrived = pp->arrived_bytes = 0;
    while ((n = weft_list_pop(&pp->delivered)) != NULL)
        msg_put(weft_container_of(n, struct mp_msg, link));
}

/* Descriptor requests take arrived messages, in order. */
static void deliver(struct weft_msgpipes *m, struct mp_pipe *pp)
{
    while (!weft_list_empty(&pp->descs) && !weft_list_empty(&pp->arrived)) {
        struct mp_op *op = weft_container_of(weft_list_first(&pp->descs), struct mp_op, link);
        struct mp_msg *g = weft_container_of(weft_list_pop(&pp->arrived), struct mp_msg, link);
        pp->narrived--;
        pp->arrived_bytes -= g->wire_bytes;
        g->refs++;                 /* the descriptor callback's */
        op->msg = g;
        op->seq = g->seq;
        weft_list_add_tail(&pp->delivered, &g->link);
        op_due(m, pp, op);
    }
    ctrl_post(pp);   /* the window may have room again */
}

/* A whole descriptor (or marker) arrived: wire holds total bytes (owned). */
static void arrive(struct weft_msgpipes *m, struct mp_pipe *pp, unsigned char *wire, size_t total)
{
    const struct wire_hdr *h = (const void *)wire;
    char why[200];

    if (total >= sizeof(*h) && h->magic == WIRE_MAGIC && h->kind == KIND_CLOSE) {
        free(wire);
        pp->got_close = 1;
        send_marker(pp);
        close_pending(m, pp);
        return;
    }
    struct mp_msg *g = (total >= sizeof(*h) && h->magic == WIRE_MAGIC && h->kind == KIND_MSG)
                           ? msg_parse(wire, total, why, sizeof(why)) : NULL;
    if (g == NULL) {
        if (total < sizeof(*h) || h->magic != WIRE_MAGIC || h->kind != KIND_MSG)
            snprintf(why, sizeof(why), "%zu bytes that are not a descriptor", total);
        free(wire);
        /* The lanes cannot be trusted past a malformed descriptor. */
        char what[300];
        snprintf(what, sizeof(what), "rank %d sent %s on pipe %d", pp->peer, why, pp->id);
        break_because(pp, WEFT_ERR_INTERNAL, what);
        WEFT_WARN(m->core->rank, "message pipe %d to rank %d: %s", pp->id, pp->peer, pp->broken_why);
        pipe_break(m, pp);
        return;
    }
    if (pp->local_closed) {
        discard(pp, g);
        return;
    }
    g->wire_bytes = total;
    weft_list_add_tail(&pp->arrived, &g->link);
    pp->narrived++;
    pp->arrived_bytes += total;
    deliver(m, pp);
}

/* The control receive completed (or failed). */
static int ctrl_poll(struct weft_msgpipes *m, struct mp_pipe *pp)
{
    int n = 0;
    while (pp->ctrl && weft_p2p_done(pp->ctrl)) {
        weft_status_t st;
        int done = 0;
        int rc = weft_p2p_test(pp->ctrl, &done, &st);
        pp->ctrl = NULL;
        n++;
        if (rc != WEFT_SUCCESS) {
            break_with(pp, rc);
            pipe_break(m, pp);
            return n;
        }
        if (pp->rest) {   /* the second part of a large descriptor */
            unsigned char *w = pp->rest;
            pp->rest = NULL;
            arrive(m, pp, w, pp->rest_total);
        } else {
            const struct wire_hdr *h = (const void *)pp->ctrl_buf;
            if (st.bytes >= sizeof(*h) && h->magic == WIRE_MAGIC && h->total > CTRL_BUF && st.bytes == CTRL_BUF &&
                h->total <= ((uint64_t)1 << 40)) {
                pp->rest = malloc((size_t)h->total);
                if (pp->rest == NULL) {
                    char what[80];
                    snprintf(what, sizeof(what), "no memory for a descriptor of %llu bytes",
                             (unsigned long long)h->total);
                    break_because(pp, WEFT_ERR_NO_MEMORY, what);
                    pipe_break(m, pp);
                    return n;
                }
                pp->rest_total = (size_t)h->total;
                memcpy(pp->rest, pp->ctrl_buf, CTRL_BUF);
                rc = weft_p2p_irecv(m->p2p, pp->rest + CTRL_BUF, pp->rest_total - CTRL_BUF, pp->peer, pp->ctag,
                                    &pp->ctrl, "weft_pipe_read_descriptor");
                if (rc != WEFT_SUCCESS) {
                    pp->ctrl = NULL;
                    break_with(pp, rc);
                    pipe_break(m, pp);
                }
                continue;
            }
            /* Up to half the buffer: copy it out and keep the buffer (a
             * fresh 64 KiB allocation per message cost more than the
             * copy, measured); larger: hand the buffer over. */
            unsigned char *w;
            if (st.bytes <= CTRL_BUF / 2 && (w = malloc(st.bytes ? st.bytes : 1)) != NULL) {
                memcpy(w, pp->ctrl_buf, st.bytes);
            } else {
                w = pp->ctrl_buf;
                pp->ctrl_buf = NULL;
            }
            arrive(m, pp, w, st.bytes);
        }
        ctrl_post(pp);
    }
    return n;
}

/* Whether every event of op's streams passed. */
static int gate_open(struct mp_op *op)
{
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *cu = weft_cuda_get();
    for (size_t i = 0; i < op->nevents; i++) {
        if (op->events[i] == NULL || cu == NULL)
            continue;
        cudaError_t e = cu->EventQuery((cudaEvent_t)op->events[i]);
        if (e == cudaErrorNotReady)
            return 0;
        /* Any other answer: the stream's work finished or failed; the
         * data goes either way (a failed kernel is the stream's news). */
        cu->EventDestroy((cudaEvent_t)op->events[i]);
        op->events[i] = NULL;
    }
#else
    (void)op;
#endif
    return 1;
}

/* Data-lane sends start in write order, each write's once its streams
 * passed; from pp->send_next on. */
static int start_sends(struct mp_pipe *pp)
{
    int n = 0;
    struct mp_op *op = pp->send_next;
    for (; op != NULL;
         op = op->link.next == &pp->writes ? NULL : weft_container_of(op->link.next, struct mp_op, link)) {
        if (op->started == op->nsend)
            continue;
        if (!gate_open(op))
            break;
        for (; op->started < op->nsend; op->started++, n++) {
            struct weft_request **r = &op->req[op->nreq - op->nsend + op->started];
            size_t j = op->started, first = j * WEFT_IOV_MAX;
            int rc = j < op->nvec
                         ? weft_p2p_isendv(pp->m->p2p, op->viov + first,
                                           op->ngroup - first < WEFT_IOV_MAX ? op->ngroup - first : WEFT_IOV_MAX,
                                           pp->peer, pp->dtag, r, "weft_pipe_write")
                         : weft_p2p_isend(pp->m->p2p, op->sbuf[j - op->nvec], op->sbytes[j - op->nvec], pp->peer,
                                          pp->dtag, r, "weft_pipe_write");
            if (rc != WEFT_SUCCESS) {
                *r = NULL;
                op_fail_req(pp, op, rc);
            }
        }
    }
    pp->send_next = op;
    return n;
}

static void pipe_free(struct weft_msgpipes *m, struct mp_pipe *pp)
{
    weft_list_del(&pp->link);
    m->npipes--;
    free(pp->ctrl_buf);
    free(pp->rest);
    free(pp);
}

/* Whether a closed pipe finished: both markers passed (or it broke) and
 * no request of its is outstanding. */
static int pipe_finished(const struct mp_pipe *pp)
{
    return pp->local_closed && pp->sent_close && (pp->got_close || pp->broken || pp->m->destroying) &&
           pp->ctrl == NULL &&
           weft_list_empty(&pp->writes) && weft_list_empty(&pp->reads) && weft_list_empty(&pp->own) &&
           weft_list_empty(&pp->descs);
}

/* A read's grouped buffers that the allocation put in device memory:
 * from the host memory they arrived in to where they belong. */
static void unbounce(struct mp_pipe *pp, struct mp_op *op)
{
    for (size_t i = 0; i < op->nbounce; i++) {
        struct mp_bounce *b = &op->bounce[i];
        if (op->err == WEFT_SUCCESS) {
            int e = weft_devcopy(pp->m->core, b->dst, b->tmp, b->bytes, "weft_pipe_read");
            if (e != WEFT_SUCCESS)
                op_fail_req(pp, op, e);
        }
        free(b->tmp);
        b->tmp = NULL;
    }
    op->nbounce = 0;
}

/* One pass over pp; m->lock held. Returns the number of events. */
static int pipe_progress(struct weft_msgpipes *m, struct mp_pipe *pp)
{
    int n = start_sends(pp);
    n += ctrl_poll(m, pp);
    /* writes and reads complete in order; their requests are reaped as
     * they finish (the pipe layer's resources go back at once) */
    struct weft_list *qs[2] = { &pp->writes, &pp->reads };
    for (int q = 0; q < 2; q++) {
        int head = 1;
        unsigned behind = 0;
        weft_list_for_each(x, qs[q]) {
            struct mp_op *op = weft_container_of(x, struct mp_op, link);
            /* Past the first unfinished operation only its next 64 are
             * looked at: nothing behind it is due before it, and a writer
             * far ahead of its reader may hold thousands (their requests
             * are reaped when they come near the head). */
            if (!head && ++behind > 64)
                break;
            int all = op_reap(pp, op) && op->started == op->nsend;
            if (head && all) {
                if (op->nbounce)
                    unbounce(pp, op);
                op_due(m, pp, op);
                n++;
            } else {
                head = 0;
                /* A stuck transfer of a live peer times out (WEFT_TIMEOUT).
                 * The clock costs more than a poll: every 64th pass. */
                if (m->passes % 64 == 0)
                    for (size_t i = 0; i < op->nreq; i++)
                        if (op->req[i])
                            weft_p2p_watch(op->req[i], op_name(op->kind));
            }
        }
    }
    weft_list_for_each(x, &pp->own) {
        struct mp_op *op = weft_container_of(x, struct mp_op, link);
        if (op_reap(pp, op)) {
            op_due(m, pp, op);
            n++;
        }
    }
    if (pp->local_closed && pipe_finished(pp)) {
        pipe_free(m, pp);
        n++;
    }
    return n;
}

static int progress_locked(struct weft_msgpipes *m)
{
    int n = 0;
    m->passes++;
    weft_list_for_each(x, &m->pipes)
        n += pipe_progress(m, weft_container_of(x, struct mp_pipe, link));
    return n;
}

/* Runs the callbacks due, in order, unless another thread is at it.
 * Called without m->lock. */
static int dispatch(struct weft_msgpipes *m)
{
    int n = 0;
    pthread_mutex_lock(&m->lock);
    if (m->dispatching || weft_list_empty(&m->ready)) {
        pthread_mutex_unlock(&m->lock);
        return 0;
    }
    m->dispatching = 1;
    struct weft_list *x;
    while ((x = weft_list_pop(&m->ready)) != NULL) {
        struct mp_op *op = weft_container_of(x, struct mp_op, link);
        pthread_mutex_unlock(&m->lock);
        const char *why = op->err == WEFT_SUCCESS ? "" : op->why;
        if (op->kind == OP_DESC)
            op->dcb(op->handle, op->err, why, op->err == WEFT_SUCCESS ? &op->msg->desc : NULL, op->arg);
        else
            op->cb(op->handle, op->err, why, op->arg);
        n++;
        pthread_mutex_lock(&m->lock);
        op_free(op);   /* drops the descriptor callback's hold on its message */
    }
    m->dispatching = 0;
    pthread_mutex_unlock(&m->lock);
    return n;
}

/* ---- as a client of the comm's engine (WEFT_PROGRESS_THREAD=1) ---- */

static int mp_poll(void *arg)
{
    struct weft_msgpipes *m = arg;
    pthread_mutex_lock(&m->lock);
    int n = progress_locked(m);
    pthread_mutex_unlock(&m->lock);
    return n + dispatch(m);
}

static int mp_busy(void *arg)
{
    struct weft_msgpipes *m = arg;
    pthread_mutex_lock(&m->lock);
    int busy = m->npipes > 0;
    pthread_mutex_unlock(&m->lock);
    return busy;
}

static const struct weft_engine_client mp_client = {
    .name = "message pipes",
    .poll = mp_poll,
    .busy = mp_busy,
    /* A write or read posted by another thread of this process starts
     * without a knock: seen within a millisecond. */
    .wakeless_us = 1000,
    .flags = WEFT_CLIENT_THREAD,
};

/* ---- public calls ---- */

int weft_msgpipes_create(struct weft_p2p *p, struct weft_msgpipes **out)
{
    struct weft_msgpipes *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return weft_set_error(weft_p2p_core(p), WEFT_ERR_NO_MEMORY, "message pipes: no memory");
    m->p2p = p;
    m->core = weft_p2p_core(p);
    m->use_thread = m->core->cfg.progress_thread;
    pthread_mutex_init(&m->lock, NULL);
    weft_list_init(&m->pipes);
    weft_list_init(&m->ready);
    *out = m;
    return WEFT_SUCCESS;
}

int weft_msgpipe_open(struct weft_msgpipes *m, int peer, int id, weft_pipe_t **out)
{
    struct mp_pipe *pp;
    int rc = WEFT_SUCCESS;

    pthread_mutex_lock(&m->lock);
    weft_list_for_each(x, &m->pipes) {
        struct mp_pipe *q = weft_container_of(x, struct mp_pipe, link);
        if (q->peer == peer && q->id == id) {
            rc = weft_set_error(m->core, WEFT_ERR_INVALID_ARG, "weft_pipe_open: pipe %d to rank %d is %s", id, peer,
                                q->local_closed ? "still closing (both sides must finish closing it first)"
                                                : "already open on this rank");
            goto out;
        }
    }
    if (m->use_thread && !m->registered) {
        rc = weft_engine_register(weft_p2p_engine(m->p2p), &mp_client, m);
        if (rc != WEFT_SUCCESS)
            goto out;
        m->registered = 1;
    }
    pp = calloc(1, sizeof(*pp));
    if (pp == NULL) {
        rc = weft_set_error(m->core, WEFT_ERR_NO_MEMORY, "weft_pipe_open: no memory for pipe %d to rank %d", id, peer);
        goto out;
    }
    pp->m = m;
    pp->peer = peer;
    pp->id = id;
    pp->ctag = weft_tag_msgpipe_ctrl(id);
    pp->dtag = weft_tag_msgpipe_data(id);
    weft_list_init(&pp->writes);
    weft_list_init(&pp->descs);
    weft_list_init(&pp->reads);
    weft_list_init(&pp->own);
    weft_list_init(&pp->arrived);
    weft_list_init(&pp->delivered);
    pp->handle = tab_add(pp);
    if (pp->handle == NULL) {
        free(pp);
        rc = weft_set_error(m->core, WEFT_ERR_NO_MEMORY, "weft_pipe_open: no memory for a pipe handle");
        goto out;
    }
    ctrl_post(pp);
    if (pp->broken) {
        rc = pp->broken;
        tab_release(pp);
        free(pp->ctrl_buf);
        free(pp);
        goto out;
    }
    weft_list_add_tail(&m->pipes, &pp->link);
    m->npipes++;
    if (m->registered)
        weft_engine_kick(weft_p2p_engine(m->p2p));
    *out = pp->handle;
out:
    pthread_mutex_unlock(&m->lock);
    return rc;
}

/* Calls on a pipe the peer closed, or that broke, say so. */
static int pipe_unusable(struct mp_pipe *pp, const char *fn)
{
    if (pp->broken)
        return weft_set_error(pp->m->core, pp->broken, "%s: pipe %d to rank %d is broken: %s", fn, pp->id, pp->peer,
                              pp->broken_why);
    if (pp->got_close)
        return weft_set_error(pp->m->core, WEFT_ERR_CLOSED, "%s: pipe %d to rank %d was closed by the peer", fn,
                              pp->id, pp->peer);
    return WEFT_SUCCESS;
}

static int host_kind(struct weft_core *core, const void *buf, size_t bytes, int peer, int tag, int *host)
{
    int kind, dev;
    int rc = weft_mem_classify(core, buf, bytes, peer, tag, "weft_pipe_write", &kind, &dev);
    if (rc == WEFT_SUCCESS)
        *host = kind == 0;   /* WEFT_MEM_HOST */
    return rc;
}

/* Buffer i of msg: payloads first, then tensors. */
struct buf_view { const void *data; size_t bytes; const void *meta; size_t meta_bytes; };
static struct buf_view buf_of(const weft_pipe_message_t *msg, size_t i)
{
    if (i < msg->num_payloads) {
        const weft_pipe_payload_t *b = &msg->payloads[i];
        return (struct buf_view){ b->data, b->bytes, b->metadata, b->metadata_bytes };
    }
    const weft_pipe_tensor_t *t = &msg->tensors[i - msg->num_payloads];
    return (struct buf_view){ t->data, t->bytes, t->metadata, t->metadata_bytes };
}

int weft_msgpipe_write(weft_pipe_t *h, const weft_pipe_message_t *msg, weft_pipe_cb_t cb, void *arg)
{
    struct mp_pipe *pp = lookup_lock(h);
    if (pp == NULL)
        return bad_handle("weft_pipe_write");
    struct weft_msgpipes *m = pp->m;
    struct weft_core *core = m->core;
    size_t nbuf = msg->num_payloads + msg->num_tensors, nsend = 0, total, inl_total = 0, budget;
    struct mp_op *op = NULL;
    unsigned char *w;
    int rc = pipe_unusable(pp, "weft_pipe_write");
    int *inl = NULL;

    if (rc != WEFT_SUCCESS)
        goto out;
    if (nbuf > MAX_BUFFERS) {
        rc = weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_write: %zu buffers in one message (at most %u)",
                            nbuf, MAX_BUFFERS);
        goto out;
    }
    inl = calloc(nbuf ? nbuf : 1, sizeof(*inl));
    if (inl == NULL)
        goto nomem;
    /* What goes inline: host buffers, greedily in order, within the
     * budget (WEFT_PIPE_INLINE, and the pair's eager limit so the
     * descriptor stays one eager message). */
    total = sizeof(struct wire_hdr) + nbuf * sizeof(struct wire_rec) + msg->metadata_bytes;
    for (size_t i = 0; i < nbuf; i++)
        total += buf_of(msg, i).meta_bytes;
    budget = core->cfg.pipe_inline;
    size_t eager = weft_p2p_internal_eager(m->p2p, pp->peer);
    /* Host buffers not inline, above the pair's eager limit (below it a
     * buffer is one copy through the ring, no handshake) and up to
     * VEC_PIECE_MAX each, go together as vectored messages where the pair's
     * carrier moves them (shm, self): one rendezvous and one copy call for
     * all of them instead of one each. */
    int vec_ok = weft_p2p_vectors(m->p2p, pp->peer);
    size_t ngroup = 0, vec_min = weft_p2p_eager(m->p2p, pp->peer);
    if (eager < total + budget)
        budget = eager > total ? eager - total : 0;
    for (size_t i = 0; i < nbuf; i++) {
        struct buf_view b = buf_of(msg, i);
        int host = 1;
        if (b.bytes == 0)
            continue;
        if ((rc = host_kind(core, b.data, b.bytes, pp->peer, pp->dtag, &host)) != WEFT_SUCCESS)
            goto out;
        if (host && b.bytes <= budget - inl_total) {
            inl[i] = 1;
            inl_total += b.bytes;
        } else if (host && vec_ok && b.bytes > vec_min && b.bytes <= VEC_PIECE_MAX) {
            inl[i] = 2;   /* grouped: one vectored message for several */
            ngroup++;
        } else {
            nsend++;
        }
    }
    if (ngroup == 1) {
        /* one piece is just a message */
        for (size_t i = 0; i < nbuf; i++)
            if (inl[i] == 2)
                inl[i] = 0;
        ngroup = 0;
        nsend++;
    }
    size_t nvec = vec_msgs(ngroup), nsingle = nsend;
    nsend += nvec;
    total += inl_total;
    op = op_new(pp, OP_WRITE, (total > CTRL_BUF ? 2 : 1) + nsend);
    if (op == NULL || (op->wire = malloc(total)) == NULL)
        goto nomem;
    if (nsingle && ((op->sbuf = calloc(nsingle, sizeof(*op->sbuf))) == NULL ||
                    (op->sbytes = calloc(nsingle, sizeof(*op->sbytes))) == NULL))
        goto nomem;
    if (ngroup && (op->viov = calloc(ngroup, sizeof(*op->viov))) == NULL)
        goto nomem;
    op->ngroup = ngroup;
    op->nvec = nvec;

    /* The descriptor. */
    struct wire_hdr hd;
    memset(&hd, 0, sizeof(hd));
    hd.magic = WIRE_MAGIC;
    hd.kind = KIND_MSG;
    hd.seq = pp->wseq;
    hd.total = total;
    hd.meta_bytes = msg->metadata_bytes;
    hd.npay = (uint32_t)msg->num_payloads;
    hd.nten = (uint32_t)msg->num_tensors;
    memcpy(op->wire, &hd, sizeof(hd));
    w = op->wire + sizeof(hd);
    for (size_t i = 0; i < nbuf; i++) {
        struct wire_rec r;
        memset(&r, 0, sizeof(r));
        if (i < msg->num_payloads) {
            r.bytes = msg->payloads[i].bytes;
            r.meta_bytes = msg->payloads[i].metadata_bytes;
            r.src_dev = WEFT_PIPE_HOST;
            r.tgt_dev = WEFT_PIPE_HOST;
        } else {
            const weft_pipe_tensor_t *t = &msg->tensors[i - msg->num_payloads];
            r.bytes = t->bytes;
            r.meta_bytes = t->metadata_bytes;
            r.src_dev = t->device;
            r.tgt_dev = t->target_device;
        }
        r.inl = inl[i] == 1;
        r.vec = inl[i] == 2;
        memcpy(w, &r, sizeof(r));
        w += sizeof(r);
    }
    if (msg->metadata_bytes) {
        memcpy(w, msg->metadata, msg->metadata_bytes);
        w += msg->metadata_bytes;
    }
    for (size_t i = 0; i < nbuf; i++) {
        struct buf_view b = buf_of(msg, i);
        if (b.meta_bytes) {
            memcpy(w, b.meta, b.meta_bytes);
            w += b.meta_bytes;
        }
    }
    for (size_t i = 0, k = 0, v = 0; i < nbuf; i++) {
        struct buf_view b = buf_of(msg, i);
        if (b.bytes == 0)
            continue;
        if (inl[i] == 1) {
            memcpy(w, b.data, b.bytes);
            w += b.bytes;
        } else if (inl[i] == 2) {
            op->viov[v].base = (uint64_t)(uintptr_t)b.data;
            op->viov[v].len = b.bytes;
            v++;
        } else {
            op->sbuf[k] = b.data;
            op->sbytes[k] = b.bytes;
            k++;
        }
    }
    op->nsend = nsend;

    /* Device data on a stream goes once the work queued there passed. */
#ifdef WEFT_HAVE_CUDA_HEADERS
    for (size_t i = 0; i < msg->num_tensors; i++) {
        const weft_pipe_tensor_t *t = &msg->tensors[i];
        const struct weft_cuda *cu = weft_cuda_get();
        if (t->stream == NULL || t->bytes == 0 || inl[msg->num_payloads + i])
            continue;
        if (cu == NULL || !core->cuda) {
            rc = weft_set_error(core, WEFT_ERR_UNSUPPORTED, "weft_pipe_write: tensor %zu names a CUDA stream but the "
                                "comm has no CUDA", i);
            goto out;
        }
        if (op->events == NULL && (op->events = calloc(msg->num_tensors, sizeof(*op->events))) == NULL)
            goto nomem;
        cudaEvent_t ev;
        cudaError_t e = cu->EventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e == cudaSuccess && (e = cu->EventRecord(ev, (cudaStream_t)t->stream)) != cudaSuccess)
            cu->EventDestroy(ev);
        if (e != cudaSuccess) {
            rc = weft_set_error(core, WEFT_ERR_TRANSPORT, "weft_pipe_write: cannot record an event on tensor %zu's "
                                "stream: %s", i, cu->GetErrorString(e));
            goto out;
        }
        op->events[op->nevents++] = (void *)ev;
    }
#else
    for (size_t i = 0; i < msg->num_tensors; i++)
        if (msg->tensors[i].stream != NULL && msg->tensors[i].bytes > 0) {
            rc = weft_set_error(core, WEFT_ERR_UNSUPPORTED, "weft_pipe_write: tensor %zu names a CUDA stream but "
                                "weft was built without CUDA", i);
            goto out;
        }
#endif

    /* The descriptor goes now, in one part or two. */
    op->seq = pp->wseq;
    op->cb = cb;
    op->arg = arg;
    size_t first = total > CTRL_BUF ? CTRL_BUF : total;
    rc = weft_p2p_isend(m->p2p, op->wire, first, pp->peer, pp->ctag, &op->req[0], "weft_pipe_write");
    if (rc == WEFT_SUCCESS && total > CTRL_BUF) {
        rc = weft_p2p_isend(m->p2p, op->wire + CTRL_BUF, total - CTRL_BUF, pp->peer, pp->ctag, &op->req[1],
                            "weft_pipe_write");
        if (rc != WEFT_SUCCESS) {
            /* The first part is out: the peer would wait for the rest
             * forever. The pipe is no longer in step. */
            op->req[1] = NULL;
            op->nreq = 2 + nsend;
            break_with(pp, rc);
            op_fail_req(pp, op, rc);
            op->started = op->nsend;
            pp->wseq++;
            weft_list_add_tail(&pp->writes, &op->link);
            op = NULL;
            goto out;
        }
    }
    if (rc != WEFT_SUCCESS) {
        op->req[0] = NULL;
        goto out;
    }
    op->nreq = (total > CTRL_BUF ? 2 : 1) + nsend;
    pp->wseq++;
    weft_list_add_tail(&pp->writes, &op->link);
    if (pp->send_next == NULL && op->started < op->nsend)
        pp->send_next = op;
    op = NULL;
    (void)start_sends(pp);
    rc = WEFT_SUCCESS;
    goto out;
nomem:
    rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_pipe_write: no memory for a message of %zu buffers on pipe %d "
                        "to rank %d", nbuf, pp->id, pp->peer);
out:
    if (op)
        op_free(op);
    free(inl);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int weft_msgpipe_read_descriptor(weft_pipe_t *h, weft_pipe_descriptor_cb_t cb, void *arg)
{
    struct mp_pipe *pp = lookup_lock(h);
    if (pp == NULL)
        return bad_handle("weft_pipe_read_descriptor");
    struct weft_msgpipes *m = pp->m;
    int rc = pipe_unusable(pp, "weft_pipe_read_descriptor");
    if (rc == WEFT_SUCCESS) {
        struct mp_op *op = op_new(pp, OP_DESC, 0);
        if (op == NULL) {
            rc = weft_set_error(m->core, WEFT_ERR_NO_MEMORY, "weft_pipe_read_descriptor: no memory");
        } else {
            op->dcb = cb;
            op->arg = arg;
            weft_list_add_tail(&pp->descs, &op->link);
            deliver(m, pp);
        }
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int weft_msgpipe_read(weft_pipe_t *h, const weft_pipe_allocation_t *a, weft_pipe_cb_t cb, void *arg)
{
    struct mp_pipe *pp = lookup_lock(h);
    if (pp == NULL)
        return bad_handle("weft_pipe_read");
    struct weft_msgpipes *m = pp->m;
    struct weft_core *core = m->core;
    struct mp_op *op = NULL;
    struct mp_msg *g;
    size_t nrecv = 0;
    int rc = pipe_unusable(pp, "weft_pipe_read");

    if (rc != WEFT_SUCCESS)
        goto out;
    if (weft_list_empty(&pp->delivered)) {
        rc = weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_read: pipe %d to rank %d has no message whose "
                            "descriptor was delivered and that was not read yet", pp->id, pp->peer);
        goto out;
    }
    g = weft_container_of(weft_list_pop(&pp->delivered), struct mp_msg, link);
    /* The allocation must fit the descriptor; else the message goes. */
    if ((a->payloads == NULL && a->num_payloads > 0) || (a->tensors == NULL && a->num_tensors > 0)) {
        rc = weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_read: the allocation's %s array is NULL with a "
                            "count of %zu; message %llu on pipe %d from rank %d was discarded",
                            a->payloads == NULL && a->num_payloads > 0 ? "payloads" : "tensors",
                            a->payloads == NULL && a->num_payloads > 0 ? a->num_payloads : a->num_tensors,
                            (unsigned long long)g->seq, pp->id, pp->peer);
        discard(pp, g);
        goto out;
    }
    if (a->num_payloads != g->desc.num_payloads || a->num_tensors != g->desc.num_tensors) {
        rc = weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_read: message %llu on pipe %d from rank %d has %zu "
                            "payloads and %zu tensors, the allocation %zu and %zu; the message was discarded",
                            (unsigned long long)g->seq, pp->id, pp->peer, g->desc.num_payloads, g->desc.num_tensors,
                            a->num_payloads, a->num_tensors);
        discard(pp, g);
        goto out;
    }
    for (size_t i = 0; i < g->nbuf; i++) {
        int pay = i < g->desc.num_payloads;
        size_t k = pay ? i : i - g->desc.num_payloads;
        const weft_pipe_buffer_t *b = pay ? &a->payloads[k] : &a->tensors[k];
        size_t need = (size_t)g->rec[i].bytes;
        if (b->bytes < need || (need > 0 && b->data == NULL)) {
            rc = weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_read: message %llu on pipe %d from rank %d: "
                                "%s %zu needs %zu bytes, the allocation gives %zu%s; the message was discarded",
                                (unsigned long long)g->seq, pp->id, pp->peer, pay ? "payload" : "tensor", k, need,
                                b->bytes, b->data == NULL ? " at NULL" : "");
            discard(pp, g);
            goto out;
        }
        nrecv += !g->rec[i].inl && !g->rec[i].vec && need > 0;
    }
    nrecv += vec_msgs(g->ngroup);
    op = op_new(pp, OP_READ, nrecv);
    if (op == NULL) {
        rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_pipe_read: no memory; the message was discarded");
        discard(pp, g);
        goto out;
    }
    op->msg = g;
    op->seq = g->seq;
    op->cb = cb;
    op->arg = arg;
    size_t k = 0;
    if (g->ngroup) {
        /* The grouped buffers first, as the writer sent them: their
         * vectored messages come before the message's other buffers. */
        op->viov = calloc(g->ngroup, sizeof(*op->viov));
        op->bounce = calloc(g->ngroup, sizeof(*op->bounce));
        if (op->viov == NULL || op->bounce == NULL)
            op_fail(pp, op, WEFT_ERR_NO_MEMORY, "no memory for the pieces of message %llu", (unsigned long long)g->seq);
        for (size_t i = 0, v = 0; i < g->nbuf && op->err == WEFT_SUCCESS; i++) {
            int pay = i < g->desc.num_payloads, host = 1;
            const weft_pipe_buffer_t *b = pay ? &a->payloads[i] : &a->tensors[i - g->desc.num_payloads];
            size_t need = (size_t)g->rec[i].bytes;
            void *dst = b->data;
            if (!g->rec[i].vec)
                continue;
            int e = host_kind(core, b->data, need, pp->peer, pp->dtag, &host);
            if (e == WEFT_SUCCESS && !host) {
                /* device memory: the piece lands in host memory, copied up when the read completes */
                struct mp_bounce *bb = &op->bounce[op->nbounce];
                if ((bb->tmp = malloc(need)) == NULL) {
                    op_fail(pp, op, WEFT_ERR_NO_MEMORY, "no memory to stage %zu bytes of message %llu", need,
                            (unsigned long long)g->seq);
                    break;
                }
                bb->dst = b->data;
                bb->bytes = need;
                op->nbounce++;
                dst = bb->tmp;
            } else if (e != WEFT_SUCCESS) {
                op_fail_req(pp, op, e);
                break;
            }
            op->viov[v].base = (uint64_t)(uintptr_t)dst;
            op->viov[v].len = need;
            v++;
        }
        op->ngroup = g->ngroup;
        op->nvec = vec_msgs(g->ngroup);
        for (size_t j = 0; j < op->nvec; j++, k++) {
            size_t first = j * WEFT_IOV_MAX, n = g->ngroup - first;
            int e = op->err != WEFT_SUCCESS ? op->err
                    : weft_p2p_irecvv(m->p2p, op->viov + first, n < WEFT_IOV_MAX ? n : WEFT_IOV_MAX, pp->peer,
                                      pp->dtag, &op->req[k], "weft_pipe_read");
            if (e != WEFT_SUCCESS) {
                if (op->err == WEFT_SUCCESS)
                    op_fail_req(pp, op, e);
                /* still consumed, so the lane stays in step */
                if (weft_p2p_idiscard(m->p2p, pp->peer, pp->dtag, &op->req[k], "weft_pipe_read") != WEFT_SUCCESS)
                    op->req[k] = NULL;
            }
        }
    }
    for (size_t i = 0; i < g->nbuf; i++) {
        int pay = i < g->desc.num_payloads;
        const weft_pipe_buffer_t *b = pay ? &a->payloads[i] : &a->tensors[i - g->desc.num_payloads];
        size_t need = (size_t)g->rec[i].bytes;
        if (need == 0 || g->rec[i].vec)
            continue;
        if (g->rec[i].inl) {
            int e = weft_devcopy(core, b->data, g->inl[i], need, "weft_pipe_read");
            if (e != WEFT_SUCCESS)
                op_fail_req(pp, op, e);
            continue;
        }
        /* Posted in message order: the k-th receive of the lane meets the
         * k-th buffer sent. A refused one (device memory without CUDA)
         * still consumes its buffer, so the lane stays in step. */
        int e = weft_p2p_irecv(m->p2p, b->data, need, pp->peer, pp->dtag, &op->req[k], "weft_pipe_read");
        if (e != WEFT_SUCCESS) {
            op_fail_req(pp, op, e);
            if (weft_p2p_idiscard(m->p2p, pp->peer, pp->dtag, &op->req[k], "weft_pipe_read") != WEFT_SUCCESS)
                op->req[k] = NULL;
        }
        k++;
    }
    op->nreq = nrecv;
    weft_list_add_tail(&pp->reads, &op->link);
    op = NULL;
out:
    pthread_mutex_unlock(&m->lock);
    return rc;
}

/* This side closes pp: its handle goes, the peer is told, what is
 * pending ends with WEFT_ERR_CLOSED (or the error that broke the pipe). */
static void close_local(struct weft_msgpipes *m, struct mp_pipe *pp)
{
    tab_release(pp);
    pp->local_closed = 1;
    send_marker(pp);
    if (pp->broken)
        pipe_break(m, pp);
    else
        close_pending(m, pp);
}

int weft_msgpipe_close(weft_pipe_t *h)
{
    struct mp_pipe *pp = lookup_lock(h);
    if (pp == NULL)
        return bad_handle("weft_pipe_close");
    struct weft_msgpipes *m = pp->m;
    close_local(m, pp);
    (void)pipe_progress(m, pp);   /* may free pp */
    pthread_mutex_unlock(&m->lock);
    return WEFT_SUCCESS;
}

int weft_msgpipe_info(const weft_pipe_t *h, int *peer, int *id)
{
    struct mp_pipe *pp = lookup_lock(h);
    if (pp == NULL)
        return -1;
    *peer = pp->peer;
    *id = pp->id;
    pthread_mutex_unlock(&pp->m->lock);
    return 0;
}

struct weft_core *weft_msgpipe_core(const weft_pipe_t *h)
{
    struct mp_pipe *pp = lookup_lock(h);
    if (pp == NULL)
        return NULL;
    struct weft_core *core = pp->m->core;
    pthread_mutex_unlock(&pp->m->lock);
    return core;
}

/* The calling thread's run of idle weft_progress calls (per thread: each
 * spinning thread backs off on its own). */
static _Thread_local unsigned            idle_calls;
static _Thread_local struct weft_backoff idle_bo;
static _Thread_local int                 idle_yield;

int weft_msgpipes_progress(struct weft_msgpipes *m)
{
    int n = weft_p2p_poll_health(m->p2p);
    pthread_mutex_lock(&m->lock);
    n += progress_locked(m);
    pthread_mutex_unlock(&m->lock);
    if (!m->use_thread)
        n += dispatch(m);
    /* An application that spins on weft_progress would take the CPU from
     * the peer it waits for (the other rank on a shared core, the kernel's
     * TCP work): past the policy's spin phase (src/core/backoff.h; none
     * when the node has more ranks than cores), each idle call yields, as
     * weft's own waits do. It never sleeps: the loop is the application's.
     * The clock is read every 32nd idle call. */
    if (n > 0) {
        idle_calls = 0;
        idle_yield = 0;
        return WEFT_SUCCESS;
    }
    if (idle_calls++ == 0)
        weft_backoff_init(&idle_bo, m->core);
    if (!idle_yield && (idle_calls % 32 == 1 || m->core->oversubscribed))
        idle_yield = weft_backoff_phase(&idle_bo, weft_now()) != WEFT_BACKOFF_SPIN;
    if (idle_yield)
        weft_yield();
    return WEFT_SUCCESS;
}

/* How long destroy waits with nothing moving before it gives up on a
 * pipe's closing (its peer did not open the pipe, or is not in destroy):
 * WEFT_KEEP_MSGPIPE_LINGER, 2 s or WEFT_TIMEOUT if shorter. */

int weft_msgpipes_destroy(struct weft_msgpipes *m)
{
    int rc = WEFT_SUCCESS;
    if (m == NULL)
        return rc;
    if (m->registered)   /* no engine pass runs after this returns */
        weft_engine_unregister(weft_p2p_engine(m->p2p), &mp_client, m);
    m->registered = 0;
    m->use_thread = 0;   /* callbacks due from now on run here */

    /* Close what is open. The peer's marker is not waited for (the peer
     * may never have opened its side): the control receive is withdrawn
     * and both lanes refuse what still comes (a rendezvous writer there is
     * released with WEFT_ERR_CLOSED), so the peer's destroy does not wait
     * for us either. Posted receives (reads, discards) keep their places. */
    pthread_mutex_lock(&m->lock);
    m->destroying = 1;
    weft_list_for_each(x, &m->pipes) {
        struct mp_pipe *pp = weft_container_of(x, struct mp_pipe, link);
        if (!pp->local_closed)
            close_local(m, pp);
        if (pp->ctrl && !pp->rest && weft_p2p_cancel(pp->ctrl, WEFT_ERR_CLOSED)) {
            weft_status_t st;
            int done;
            (void)weft_p2p_test(pp->ctrl, &done, &st);
            pp->ctrl = NULL;
        }
        if (!pp->broken) {
            weft_p2p_refuse_lane(m->p2p, pp->peer, pp->ctag, WEFT_ERR_CLOSED);
            weft_p2p_refuse_lane(m->p2p, pp->peer, pp->dtag, WEFT_ERR_CLOSED);
        }
    }
    pthread_mutex_unlock(&m->lock);

    /* What is still moving finishes here (transfers both sides started),
     * and the callbacks run, until nothing moved for WEFT_KEEP_MSGPIPE_LINGER
     * (WEFT_TIMEOUT if shorter). */
    double idle_max = weft_housekeeping_bound(&m->core->cfg, WEFT_KEEP_MSGPIPE_LINGER);
    double last = weft_now();
    struct weft_backoff bo;
    weft_backoff_init(&bo, m->core);
    for (;;) {
        int n = weft_p2p_poll_health(m->p2p);
        pthread_mutex_lock(&m->lock);
        n += progress_locked(m);
        size_t left = m->npipes;
        pthread_mutex_unlock(&m->lock);
        n += dispatch(m);
        if (left == 0)
            break;
        double now = weft_now();
        if (n > 0)
            last = now;
        if (now - last > idle_max) {
            WEFT_INFO(m->core->rank, "weft_comm_destroy: %zu message pipe(s) still had transfers after %.1f s without "
                      "progress; their operations fail with WEFT_ERR_CLOSED", left, idle_max);
            break;
        }
        if (n > 0)
            weft_backoff_busy(&bo);
        else
            weft_engine_idle_step(m->p2p, &bo, 1);
    }
    /* What is left: its callbacks run with WEFT_ERR_CLOSED; its requests
     * are the pipe layer's to fail at its drain (never touched again). */
    pthread_mutex_lock(&m->lock);
    struct weft_list *x;
    while ((x = weft_list_pop(&m->pipes)) != NULL) {
        struct mp_pipe *pp = weft_container_of(x, struct mp_pipe, link);
        struct weft_list *qs[4] = { &pp->writes, &pp->reads, &pp->descs, &pp->own };
        for (int q = 0; q < 4; q++) {
            struct weft_list *y;
            while ((y = weft_list_pop(qs[q])) != NULL) {
                struct mp_op *op = weft_container_of(y, struct mp_op, link);
                memset(op->req, 0, op->nreq * sizeof(*op->req));
                weft_list_add_tail(qs[q], &op->link);
                op_fail(pp, op, WEFT_ERR_CLOSED, "weft_comm_destroy closed the pipe before the peer took part");
                op_due(m, pp, op);
            }
        }
        pipe_break(m, pp);
        /* A control receive the peer is writing into keeps its buffer. */
        if (pp->ctrl == NULL)
            free(pp->ctrl_buf);
        if (pp->ctrl == NULL || pp->rest == NULL)
            free(pp->rest);
        free(pp);
    }
    pthread_mutex_unlock(&m->lock);
    (void)dispatch(m);
    pthread_mutex_destroy(&m->lock);
    free(m);
    return rc;
}
