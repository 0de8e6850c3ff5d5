/*
 * The pipe to one peer: ordering, matching, eager vs rendezvous, truncation.
 *
 * Send side. A message up to the carrier's eager limit goes out as one
 * EAGER frame (header + data) and the send completes as soon as the carrier
 * owns the bytes. A larger one goes out as RTS; the receiver picks a
 * rendezvous path (p2p/rndv.h) and either pulls the data and answers FIN,
 * or answers CTS naming the path and its key, and the sender starts the
 * same path. Sends leave in the order they were posted: when the carrier
 * has no room, they wait in the pipe's outbound FIFO, and so does every
 * later frame, so sequence numbers arrive in order.
 *
 * Receive side. Messages are matched per (peer, tag) lane in arrival order:
 * a message finds the oldest posted receive of its lane, or waits in the
 * lane's unexpected list (EAGER data copied out of the carrier's buffer)
 * until a receive is posted. A message larger than the receive buffer fails
 * the receive with WEFT_ERR_TRUNCATE without writing to the buffer; a large
 * one tells the sender with FIN so its send fails the same way, and the pipe
 * goes on with the next message.
 *
 * Device memory (docs/cuda.md). Requests carry the memory kind of their
 * buffer (classified once per call, p2p/p2p.c). Carriers see device memory
 * only through a rendezvous path that says they can move it: an EAGER
 * payload from a device buffer is copied to a host bounce first (and copied
 * to the device at the receiver); a rendezvous message is decided by the
 * receiver's path table when it matches.
 *
 * Ids. A CTS or FIN names a request by its pool id (p2p/request.h); an id
 * that names no live request of this pipe is a protocol error that breaks
 * the pipe, never a dereference.
 */
#include "pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "cudawrap.h"
#include "devcopy.h"
#include "log.h"
#include "health.h"
#include "rndv.h"
#include "tags.h"
#include "tp_iov.h"

_Static_assert(WEFT_MEM_DEVICE == 2 && WEFT_MEM_MANAGED == 3 && WEFT_MEM_PINNED < 2,
               "weft_mem_is_device (pipe.h) assumes this order of enum weft_mem_kind");

/* ----------------------------------------------------------------- lanes */

static size_t lane_hash(int tag, size_t buckets)
{
    return ((uint32_t)tag * 2654435761u) & (buckets - 1);
}

static int lanes_grow(struct weft_peer_pipe *p)
{
    size_t nb = p->nbuckets * 2;
    struct weft_list *nl = malloc(nb * sizeof(*nl));
    if (nl == NULL)
        return -1;
    for (size_t i = 0; i < nb; i++)
        weft_list_init(&nl[i]);
    for (size_t i = 0; i < p->nbuckets; i++) {
        weft_list_for_each(n, &p->buckets[i]) {
            struct weft_lane *l = weft_container_of(n, struct weft_lane, hash);
            weft_list_del(n);
            weft_list_add_head(&nl[lane_hash(l->tag, nb)], n);
        }
    }
    free(p->buckets);
    p->buckets = nl;
    p->nbuckets = nb;
    return 0;
}

/* The lane of tag; created when create is set. NULL: absent or no memory. */
static __attribute__((noinline)) struct weft_lane *lane_lookup(struct weft_peer_pipe *p, int tag, int create)
{
    struct weft_list *b = &p->buckets[lane_hash(tag, p->nbuckets)];
    weft_list_for_each(n, b) {
        struct weft_lane *l = weft_container_of(n, struct weft_lane, hash);
        if (l->tag == tag) {
            p->lane_last = l;
            return l;
        }
    }
    if (!create)
        return NULL;
    if (p->nlanes >= 2 * p->nbuckets && lanes_grow(p) == 0)
        b = &p->buckets[lane_hash(tag, p->nbuckets)];
    struct weft_lane *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->tag = tag;
    weft_list_init(&l->posted);
    weft_queue_init(&l->unexp);
    weft_list_add_head(b, &l->hash);
    p->nlanes++;
    p->lane_last = l;
    return l;
}

/* A stream of messages on one tag posts and matches on the same lane over
 * and over: the last lane found is looked at before the hash (inline, the
 * hash and the creation out of line). */
static inline struct weft_lane *lane_get(struct weft_peer_pipe *p, int tag, int create)
{
    struct weft_lane *last = p->lane_last;
    if (last != NULL && last->tag == tag)
        return last;
    return lane_lookup(p, tag, create);
}

void weft_pipe_lane_release(struct weft_peer_pipe *p, int tag)
{
    struct weft_lane *l = lane_get(p, tag, 0);
    if (l == NULL || !weft_list_empty(&l->posted) || !weft_queue_empty(&l->unexp))
        return;
    weft_list_del(&l->hash);
    p->nlanes--;
    if (p->lane_last == l)
        p->lane_last = NULL;
    free(l);
}

/* ----------------------------------------------------------- set-up/down */

int weft_pipe_init(struct weft_p2p *p2p, struct weft_peer_pipe *p, int peer)
{
    memset(p, 0, sizeof(*p));
    p->p2p = p2p;
    p->peer = peer;
    p->pidfd = -1;
    weft_queue_init(&p->out);
    weft_list_init(&p->inflight);
    p->nbuckets = 16;
    p->buckets = malloc(p->nbuckets * sizeof(*p->buckets));
    if (p->buckets == NULL)
        return WEFT_ERR_NO_MEMORY;
    for (size_t i = 0; i < p->nbuckets; i++)
        weft_list_init(&p->buckets[i]);
    return WEFT_SUCCESS;
}

static void unexpected_free(struct weft_peer_pipe *p, struct weft_unexpected *u)
{
    weft_payload_put(&p->p2p->payloads, u->payload, u->hdr.bytes);
    free(u);
}

static void outbound_free(struct weft_peer_pipe *p, struct weft_outbound *o)
{
    weft_payload_put(&p->p2p->payloads, o->payload, o->len);
    free(o);
}

void weft_pipe_fini(struct weft_peer_pipe *p)
{
    if (p->buckets) {
        for (size_t i = 0; i < p->nbuckets; i++) {
            weft_list_for_each(n, &p->buckets[i]) {
                struct weft_lane *l = weft_container_of(n, struct weft_lane, hash);
                struct weft_qnode *q;
                while ((q = weft_queue_pop(&l->unexp)) != NULL)
                    unexpected_free(p, weft_container_of(q, struct weft_unexpected, qn));
                free(l);
            }
        }
        free(p->buckets);
        p->buckets = NULL;
        p->lane_last = NULL;
    }
    struct weft_qnode *q;
    while ((q = weft_queue_pop(&p->out)) != NULL)
        outbound_free(p, weft_container_of(q, struct weft_outbound, qn));
}

/* ------------------------------------------------------------ completion */

void weft_pipe_complete(struct weft_request *r, int err)
{
    r->status.error = err;
    if (r->type == WEFT_REQ_RECV)
        r->status.bytes = r->msg_bytes;
    /* weft_p2p_done reads it without the lock (the message pipes and the
     * stream engine poll many requests): an atomic store. */
    __atomic_store_n(&r->state, WEFT_REQ_DONE, __ATOMIC_RELEASE);
}

void weft_pipe_activate(struct weft_peer_pipe *p, struct weft_request *r)
{
    r->state = WEFT_REQ_ACTIVE;
    weft_list_add_tail(&p->inflight, &r->link);
    p->ninflight++;
}

static void inflight_remove(struct weft_peer_pipe *p, struct weft_request *r)
{
    if (weft_list_linked(&r->link)) {
        weft_list_del(&r->link);
        p->ninflight--;
        if (r->type == WEFT_REQ_SEND && r->rndv)
            p->rndv_sends--;
    }
}

void weft_pipe_finish_inflight(struct weft_peer_pipe *p, struct weft_request *r, int err)
{
    inflight_remove(p, r);
    weft_pipe_complete(r, err);
}

/* A protocol error: what the peer sent makes no sense here. */
static void protocol_error(struct weft_peer_pipe *p, const char *fmt, unsigned long long a, unsigned long long b)
{
    char what[200];
    snprintf(what, sizeof(what), fmt, a, b);
    weft_set_error(p->p2p->core, WEFT_ERR_INTERNAL, "peer %d over %s: %s (protocol error)", p->peer,
                   weft_pipe_tp_name(p), what);
    weft_pipe_break(p, WEFT_ERR_INTERNAL);
}

/* --------------------------------------------------------------- sending */

static void outbound_append(struct weft_peer_pipe *p, struct weft_outbound *o)
{
    weft_queue_push(&p->out, &o->qn);
    p->p2p->out_queued++;
}

static int carrier_send(struct weft_peer_pipe *p, const void *hdr, size_t hdr_len, const void *payload, size_t len)
{
    return p->carrier.tp->ctrl_send(p->carrier.ctx, p->peer, hdr, hdr_len, payload, len);
}

static int send_full(struct weft_peer_pipe *p, const struct weft_wire_hdr *h, const void *payload, size_t len)
{
    return carrier_send(p, h, sizeof(*h), payload, len);
}

int weft_pipe_send_oob(struct weft_peer_pipe *p, const struct weft_wire_hdr *h, const void *payload, size_t len)
{
    if (p->carrier.tp == NULL)
        return WEFT_ERR_TRANSPORT;
    return send_full(p, h, payload, len);
}

/* A message's first frame: the header, the request's fingerprint when it
 * carries one (flag CHECK), the payload. */
static int send_msg(struct weft_peer_pipe *p, const struct weft_request *r, struct weft_wire_hdr *h, const void *payload,
                    size_t len)
{
    unsigned char hb[sizeof(*h) + WEFT_WIRE_CHECK_BYTES];
    if (!r->checked)
        return send_full(p, h, payload, len);
    h->flags |= WEFT_WIRE_F_CHECK;
    memcpy(hb, h, sizeof(*h));
    memcpy(hb + sizeof(*h), &r->check, WEFT_WIRE_CHECK_BYTES);
    return carrier_send(p, hb, sizeof(hb), payload, len);
}

/* ---- flow control (wire.h) ---- */

static int fc_on(const struct weft_peer_pipe *p)
{
    return p->peer != p->p2p->rank;   /* self: the process's own memory either way */
}

/* Whether a message of this cost may go now: within the window, or alone
 * on the wire (one larger than the window still goes, by itself). */
static int fc_may_send(const struct weft_peer_pipe *p, uint64_t cost)
{
    uint64_t out = p->fc_sent - p->fc_granted;
    return !fc_on(p) || out == 0 || out + cost <= p->p2p->core->cfg.eager_window;
}

static uint64_t fc_cost_of(const struct weft_request *r)
{
    return (r->rndv ? 0 : r->bytes) + WEFT_WIRE_MSG_COST;
}

static int credit_send(struct weft_peer_pipe *p)
{
    struct weft_wire_hdr h;
    memset(&h, 0, sizeof(h));
    h.type = WEFT_WIRE_CREDIT;
    h.bytes = p->fc_consumed;
    int rc = send_full(p, &h, NULL, 0);
    if (rc == WEFT_SUCCESS)
        p->fc_reported = p->fc_consumed;
    return rc;
}

static void fc_report(struct weft_peer_pipe *p);

/* A message of ours... of the peer's was consumed: report every quarter
 * window (inline: every delivery passes here; the report is out of line). */
static inline void fc_consume(struct weft_peer_pipe *p, uint64_t cost)
{
    if (!fc_on(p))
        return;
    p->fc_consumed += cost;
    if (p->credit_owed || p->fc_consumed - p->fc_reported < p->p2p->core->cfg.eager_window / 4)
        return;
    fc_report(p);
}

static __attribute__((noinline)) void fc_report(struct weft_peer_pipe *p)
{
    int rc = credit_send(p);
    if (rc == WEFT_EAGAIN) {
        p->credit_owed = 1;          /* flush retries it before anything queued */
        p->p2p->out_queued++;
    } else if (rc != WEFT_SUCCESS) {
        weft_pipe_break(p, rc);
    }
}

/* An EAGER message from a device buffer: the data goes through a host
 * bounce (synchronous D2H). If the copy fails, the message still goes out
 * (its sequence number is taken) as a 0-byte EAGER whose status tells the
 * receiver, and the send fails with the copy's error. */
__attribute__((noinline)) static int send_eager_device(struct weft_peer_pipe *p, struct weft_request *r,
                                                       struct weft_wire_hdr *h)
{
    struct weft_core *core = p->p2p->core;
    const void *data = NULL;
    int err = WEFT_SUCCESS, rc;

    h->flags |= WEFT_WIRE_F_DEVICE;
    if (r->bytes) {
        void *b = weft_devcopy_bounce(core, r->bytes);
        if (b == NULL)
            err = weft_set_error(core, WEFT_ERR_NO_MEMORY, "send to peer %d tag %d: no host memory to stage %zu "
                                 "bytes of device memory", p->peer, r->tag, r->bytes);
        else {
            char what[96];
            snprintf(what, sizeof(what), "send to peer %d tag %d: eager copy device to host", p->peer, r->tag);
            err = weft_devcopy_sync(core, b, r->xfer.buf, r->bytes, what);
        }
        data = b;
    }
    if (err != WEFT_SUCCESS) {
        h->bytes = 0;
        h->status = err;
        data = NULL;
    }
    rc = send_msg(p, r, h, data, err == WEFT_SUCCESS ? r->bytes : 0);
    if (rc == WEFT_SUCCESS)
        weft_pipe_complete(r, err);
    return rc;
}

static int send_req_first(struct weft_peer_pipe *p, struct weft_request *r);

/* Hands a send's first frame (EAGER with data, or RTS) to the carrier,
 * within the flow-control window. */
static int send_req_now(struct weft_peer_pipe *p, struct weft_request *r)
{
    uint64_t cost = fc_cost_of(r);
    int rc;

    if (!fc_may_send(p, cost))
        return WEFT_EAGAIN;   /* queued until the peer reports credit */
    p->fc_sent += cost;   /* taken back below if the carrier has no room */
    rc = send_req_first(p, r);
    if (rc != WEFT_SUCCESS)
        p->fc_sent -= cost;
    return rc;
}

static int send_req_first(struct weft_peer_pipe *p, struct weft_request *r)
{
    struct weft_wire_hdr h;
    int rc;

    if (!r->rndv && !r->checked && !weft_mem_is_device(r->xfer.mem_kind)) {
        /* The common small message: the 16-byte header. */
        struct weft_wire_small s = { WEFT_WIRE_EAGER_SMALL, 0, 0, r->tag, r->seq };
        rc = carrier_send(p, &s, sizeof(s), r->xfer.buf, r->bytes);
        if (rc == WEFT_SUCCESS)
            weft_pipe_complete(r, WEFT_SUCCESS);
        return rc;
    }
    memset(&h, 0, sizeof(h));
    h.tag = r->tag;
    h.seq = r->seq;
    h.bytes = r->bytes;
    if (!r->rndv) {
        h.type = WEFT_WIRE_EAGER;
        if (!weft_mem_is_device(r->xfer.mem_kind)) {
            rc = send_msg(p, r, &h, r->xfer.buf, r->bytes);
            if (rc == WEFT_SUCCESS)
                weft_pipe_complete(r, WEFT_SUCCESS);
            return rc;
        }
        return send_eager_device(p, r, &h);
    }
    h.type = WEFT_WIRE_RTS;
    h.sreq = weft_req_id(r);
    h.addr = (uint64_t)(uintptr_t)r->xfer.buf;
    if (r->xfer.niov) {
        /* a vectored message: the receiver reads the pieces' list here */
        h.flags |= WEFT_WIRE_F_IOV;
        h.addr = (uint64_t)(uintptr_t)r->xfer.iov;
        h.aux = r->xfer.niov;
    }
    if (weft_mem_is_device(r->xfer.mem_kind)) {
        h.flags |= WEFT_WIRE_F_DEVICE;
        h.device = (uint16_t)(r->xfer.device >= 0 ? r->xfer.device : 0);
    }
    weft_rndv_rts_fill(p, r, &h);
    rc = send_msg(p, r, &h, NULL, 0);
    if (rc == WEFT_SUCCESS) {
        r->state = WEFT_REQ_POSTED;
        weft_list_add_tail(&p->inflight, &r->link);
        p->ninflight++;
        p->rndv_sends++;
    }
    return rc;
}

void weft_pipe_send_ctrl(struct weft_peer_pipe *p, const struct weft_wire_hdr *h, const void *payload, size_t len)
{
    struct weft_outbound *o;
    int rc;

    if (p->broken)
        return;
    if (weft_queue_empty(&p->out)) {
        rc = send_full(p, h, payload, len);
        if (rc == WEFT_SUCCESS)
            return;
        if (rc != WEFT_EAGAIN) {
            weft_pipe_break(p, rc);
            return;
        }
    }
    o = calloc(1, sizeof(*o));
    if (o && len) {
        o->payload = weft_payload_get(&p->p2p->payloads, len);
        if (o->payload)
            memcpy(o->payload, payload, len);
        o->len = len;
    }
    if (o == NULL || (len && o->payload == NULL)) {
        free(o);
        weft_set_error(p->p2p->core, WEFT_ERR_NO_MEMORY, "peer %d: no memory to queue a control message", p->peer);
        weft_pipe_break(p, WEFT_ERR_NO_MEMORY);
        return;
    }
    o->hdr = *h;
    outbound_append(p, o);
}

int weft_pipe_flush(struct weft_peer_pipe *p)
{
    int n = 0;

    if (p->credit_owed && !p->broken) {
        /* Credit first: the peer's queue may wait for it (never behind
         * our own sends, which may wait for the peer's credit). */
        int rc = credit_send(p);
        if (rc == WEFT_EAGAIN)
            return 0;
        p->credit_owed = 0;
        p->p2p->out_queued--;
        if (rc != WEFT_SUCCESS) {
            weft_pipe_break(p, rc);
            return 0;
        }
        n++;
    }
    while (!weft_queue_empty(&p->out) && !p->broken) {
        struct weft_outbound *o = weft_container_of(weft_queue_head(&p->out), struct weft_outbound, qn);
        int rc = o->req ? send_req_now(p, o->req) : send_full(p, &o->hdr, o->payload, o->len);
        if (rc == WEFT_EAGAIN)
            break;
        weft_queue_pop(&p->out);
        p->p2p->out_queued--;
        if (rc != WEFT_SUCCESS) {
            if (o->req)
                weft_pipe_complete(o->req, rc);
            outbound_free(p, o);
            weft_pipe_break(p, rc);
            return n;
        }
        outbound_free(p, o);
        n++;
    }
    return n;
}

/* Inlined: its two callers (isend, irecv) are each on a small message's path. */
static inline __attribute__((always_inline)) struct weft_request *
req_new(struct weft_peer_pipe *p, int type, void *buf, size_t bytes, int tag, int mem_kind, int device,
        const struct weft_p2p_check *check)
{
    struct weft_request *r = weft_req_alloc(p->p2p);
    if (r == NULL)
        return NULL;
    if (check) {
        r->checked = 1;
        r->check = *check;
    }
    r->pipe = p;
    r->type = type;
    r->tag = tag;
    r->bytes = bytes;
    r->status.peer = p->peer;
    r->status.tag = tag;
    r->status.bytes = bytes;
    r->xfer.buf = buf;
    r->xfer.bytes = bytes;
    r->xfer.mem_kind = mem_kind;
    r->xfer.device = device;
    r->xfer.peer = p->peer;
    r->xfer.tag = tag;
    return r;
}

/* A new send r whose first frame went (rc WEFT_SUCCESS), waits for room
 * (WEFT_EAGAIN: queued behind the pipe's earlier frames, in sequence), or
 * failed (the pipe breaks; r is freed). */
static int send_started(struct weft_peer_pipe *p, struct weft_request *r, int rc, struct weft_request **out)
{
    struct weft_core *core = p->p2p->core;
    if (rc == WEFT_EAGAIN) {
        struct weft_outbound *o = calloc(1, sizeof(*o));
        if (o == NULL) {
            int tag = r->tag;
            weft_req_free(r);
            p->send_seq--;
            return weft_set_error(core, WEFT_ERR_NO_MEMORY, "send to peer %d tag %d: no memory to queue", p->peer,
                                  tag);
        }
        o->req = r;
        r->state = WEFT_REQ_QUEUED;
        outbound_append(p, o);
    } else if (rc != WEFT_SUCCESS) {
        int tag = r->tag;
        size_t bytes = r->bytes;
        uint32_t niov = r->xfer.niov;
        weft_req_free(r);
        weft_pipe_break(p, rc);
        return weft_set_error(core, rc, "send to peer %d tag %d bytes %zu%s over %s failed", p->peer, tag, bytes,
                              niov ? " (vectored)" : "", weft_pipe_tp_name(p));
    }
    *out = r;
    return WEFT_SUCCESS;
}

int weft_pipe_isend(struct weft_peer_pipe *p, const void *buf, size_t bytes, int tag, int mem_kind, int device,
                    const struct weft_p2p_check *check, struct weft_request **out)
{
    struct weft_core *core = p->p2p->core;
    struct weft_request *r;
    int rc = WEFT_EAGAIN;

    if (p->broken)
        return weft_set_error(core, p->broken, "send to peer %d tag %d: the pipe over %s failed earlier (%s)",
                              p->peer, tag, weft_pipe_tp_name(p), p->failed || p->link_down ? p->fail_why : weft_err_str(p->broken));
    r = req_new(p, WEFT_REQ_SEND, (void *)buf, bytes, tag, mem_kind, device, check);
    if (r == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "send to peer %d tag %d: no memory for a request", p->peer,
                              tag);
    r->seq = p->send_seq++;
    /* The library's lanes go eagerly further (collectives' blocks are
     * mostly received at once); a message pipe's buffers are the
     * application's and wait for the reader's read: above the user limit,
     * an eager copy would wait unmatched and fill the flow-control window,
     * while a rendezvous moves it once, straight into the read's buffer.
     * So do a reduce's partial sums on their way to a root that may be
     * calls behind (p2p/tags.h, WEFT_TAG_COLL_PHASE_TO_ROOT). */
    r->rndv = bytes > (tag < 0 && !weft_tag_is_msgpipe_data(tag) && !weft_tag_is_coll_to_root(tag)
                           ? p->eager_limit_internal
                           : p->eager_limit);

    if (!weft_queue_empty(&p->out)) {
        /* behind earlier frames: queued below */
    } else if (!r->rndv && check == NULL && !weft_mem_is_device(mem_kind)) {
        /* The common small message, what send_req_now and send_req_first
         * do for it, without their generality: the 16-byte header, within
         * the window, complete as soon as the carrier owns the bytes. */
        uint64_t cost = bytes + WEFT_WIRE_MSG_COST;
        if (fc_may_send(p, cost)) {
            struct weft_wire_small s = { WEFT_WIRE_EAGER_SMALL, 0, 0, tag, r->seq };
            rc = carrier_send(p, &s, sizeof(s), buf, bytes);
            if (rc == WEFT_SUCCESS) {
                p->fc_sent += cost;
                weft_pipe_complete(r, WEFT_SUCCESS);
                *out = r;
                return WEFT_SUCCESS;
            }
        }
    } else {
        rc = send_req_now(p, r);
    }
    return send_started(p, r, rc, out);
}

int weft_pipe_isendv(struct weft_peer_pipe *p, const struct weft_iov *iov, uint32_t niov, int tag,
                     struct weft_request **out)
{
    struct weft_core *core = p->p2p->core;
    size_t bytes = weft_tp_iov_bytes(iov, niov);

    if (p->broken)
        return weft_set_error(core, p->broken, "send to peer %d tag %d: the pipe over %s failed earlier (%s)",
                              p->peer, tag, weft_pipe_tp_name(p), p->failed || p->link_down ? p->fail_why : weft_err_str(p->broken));
    if (!p->carrier.tp->rndv_vectors)
        return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "send to peer %d tag %d: %s does not move vectored "
                              "messages", p->peer, tag, weft_pipe_tp_name(p));
    struct weft_request *r = req_new(p, WEFT_REQ_SEND, NULL, bytes, tag, 0 /* WEFT_MEM_HOST */, -1, NULL);
    if (r == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "send to peer %d tag %d: no memory for a request", p->peer,
                              tag);
    r->xfer.iov = iov;
    r->xfer.niov = niov;
    r->seq = p->send_seq++;
    /* Always a rendezvous, whatever the size: the pieces move once, from
     * where they are to where the receive puts them (an eager message
     * would first gather them into a frame). */
    r->rndv = 1;
    return send_started(p, r, weft_queue_empty(&p->out) ? send_req_now(p, r) : WEFT_EAGAIN, out);
}

/* ------------------------------------------------------------- receiving */

/* An EAGER payload into a device buffer: one synchronous copy. */
__attribute__((noinline)) static void deliver_eager_device(struct weft_peer_pipe *p, struct weft_request *r,
                                                           const struct weft_wire_hdr *m, const void *payload)
{
    char what[96];
    snprintf(what, sizeof(what), "recv from peer %d tag %d: eager copy host to device", p->peer, r->tag);
    weft_pipe_complete(r, weft_devcopy_sync(p->p2p->core, r->xfer.buf, payload, m->bytes, what));
}

/* Whether a message (fingerprint mcheck when its flag CHECK is set) may
 * meet receive r. On a mismatch r completes with WEFT_ERR_MISMATCH holding
 * the sender's fingerprint (zero for an unchecked message); the caller
 * consumes the message. */
static int check_ok(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *m,
                    const struct weft_p2p_check *mcheck)
{
    int mchecked = (m->flags & WEFT_WIRE_F_CHECK) != 0;
    if (!r->checked && !mchecked)
        return 1;
    if (r->checked && mchecked && memcmp(&r->check, mcheck, sizeof(*mcheck)) == 0)
        return 1;
    r->msg_bytes = m->bytes;
    if (mchecked)
        r->check = *mcheck;
    else
        memset(&r->check, 0, sizeof(r->check));
    weft_set_error(p->p2p->core, WEFT_ERR_MISMATCH,
                   "recv from peer %d tag %d: the message (%llu B) belongs to a different %s", p->peer, r->tag,
                   (unsigned long long)m->bytes, mchecked ? "collective call" : "kind of call (point-to-point)");
    weft_pipe_complete(r, WEFT_ERR_MISMATCH);
    return 0;
}

/* A code a peer's frame carries: one no weft call returns (a damaged or
 * hostile frame) becomes WEFT_ERR_INTERNAL, never a request's status. */
static int peer_code(int32_t status)
{
    return status >= WEFT_SUCCESS && status <= WEFT_ERR_LAST ? (int)status : WEFT_ERR_INTERNAL;
}

/* EAGER message meets its receive: copy, or fail with TRUNCATE. */
static void deliver_eager(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *m,
                          const void *payload)
{
    struct weft_core *core = p->p2p->core;
    r->msg_bytes = m->bytes;
    if (m->status != WEFT_SUCCESS) {
        /* The sender could not read its device buffer (send_eager_device). */
        weft_set_error(core, WEFT_ERR_TRANSPORT,
                       "recv from peer %d tag %d: the sender failed to copy its device buffer (%s there)", p->peer,
                       r->tag, weft_err_str(peer_code(m->status)));
        weft_pipe_complete(r, WEFT_ERR_TRANSPORT);
        return;
    }
    if (r->discard) {   /* dropped on purpose: no copy, no error */
        weft_pipe_complete(r, WEFT_SUCCESS);
        return;
    }
    if (m->bytes > r->bytes) {
        weft_set_error(core, WEFT_ERR_TRUNCATE,
                       "recv from peer %d tag %d: message of %llu bytes does not fit the %zu-byte buffer",
                       p->peer, r->tag, (unsigned long long)m->bytes, r->bytes);
        weft_pipe_complete(r, WEFT_ERR_TRUNCATE);
        return;
    }
    if (m->bytes && weft_mem_is_device(r->xfer.mem_kind)) {
        deliver_eager_device(p, r, m, payload);
        return;
    }
    /* memmove: a send to self may overlap its own receive buffer. */
    if (m->bytes && r->xfer.niov)
        weft_tp_copy_in(&r->xfer, 0, payload, m->bytes);
    else if (m->bytes)
        memmove(r->xfer.buf, payload, m->bytes);
    weft_pipe_complete(r, WEFT_SUCCESS);
}

static void start_paths(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *m, int first);

/* RTS meets its receive: the first rendezvous path that applies moves it,
 * or the message is refused (truncation, no path, failure to start). */
static void match_rts(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *m)
{

    r->msg_bytes = m->bytes;
    r->peer_req = m->sreq;
    r->xfer.bytes = m->bytes;
    if (r->discard) {
        /* Dropped on purpose: the sender is released as if delivered. */
        weft_rndv_send_fin(p, m, WEFT_SUCCESS);
        weft_pipe_complete(r, WEFT_SUCCESS);
        return;
    }
    if (m->bytes > r->bytes) {
        weft_set_error(p->p2p->core, WEFT_ERR_TRUNCATE,
                       "recv from peer %d tag %d: message of %llu bytes does not fit the %zu-byte buffer",
                       p->peer, r->tag, (unsigned long long)m->bytes, r->bytes);
        weft_rndv_send_fin(p, m, WEFT_ERR_TRUNCATE);
        weft_pipe_complete(r, WEFT_ERR_TRUNCATE);
        return;
    }
    start_paths(p, r, m, 0);
}

/* The paths of the table from index first on, in order: the first that
 * applies and takes r moves it; none: the message is refused. */
static void start_paths(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *m, int first)
{
    int rc = WEFT_ERR_UNSUPPORTED;

    for (int i = first; i < weft_rndv_npaths; i++) {
        const struct weft_rndv_path *path = weft_rndv_paths[i];
        if (!path->applies(p, r, m))
            continue;
        r->path = i + 1;
        rc = path->recv_start(p, r, m);
        if (rc == WEFT_SUCCESS || p->broken)
            return;
        r->path = 0;
        if (rc != WEFT_EAGAIN)
            break;
        rc = WEFT_ERR_UNSUPPORTED;
    }
    if (rc == WEFT_ERR_UNSUPPORTED)
        weft_set_error(p->p2p->core, rc, "recv from peer %d tag %d: no rendezvous path moves %llu bytes of %s "
                       "memory into %s memory over %s", p->peer, r->tag, (unsigned long long)m->bytes,
                       (m->flags & WEFT_WIRE_F_DEVICE) ? "device" : "host",
                       weft_mem_is_device(r->xfer.mem_kind) ? "device" : "host", weft_pipe_tp_name(p));
    /* Nothing was announced to the sender: refuse the message. */
    inflight_remove(p, r);
    weft_rndv_send_fin(p, m, rc);
    weft_pipe_complete(r, rc);
}

/* A message on a refusing lane: dropped; an RTS's sender is told. */
static void refuse_msg(struct weft_peer_pipe *p, struct weft_lane *l, const struct weft_wire_hdr *m)
{
    fc_consume(p, (m->type == WEFT_WIRE_EAGER ? m->bytes : 0) + WEFT_WIRE_MSG_COST);
    WEFT_TRACE(p->p2p->rank, "peer %d tag %d: refusing a %s of %llu B (lane given up)", p->peer, m->tag,
               m->type == WEFT_WIRE_RTS ? "large message" : "message", (unsigned long long)m->bytes);
    if (m->type == WEFT_WIRE_RTS)
        weft_rndv_send_fin(p, m, l->refuse);
}

/* A message meets receive r: fingerprint, then delivery. */
static void match_msg(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *m,
                      const struct weft_p2p_check *mcheck, const void *payload)
{
    fc_consume(p, (m->type == WEFT_WIRE_EAGER ? m->bytes : 0) + WEFT_WIRE_MSG_COST);
    if (!check_ok(p, r, m, mcheck)) {
        if (m->type == WEFT_WIRE_RTS)
            weft_rndv_send_fin(p, m, WEFT_ERR_MISMATCH);   /* its sender fails too */
        return;
    }
    if (m->type == WEFT_WIRE_EAGER)
        deliver_eager(p, r, m, payload);
    else
        match_rts(p, r, m);
}

static int irecv_(struct weft_peer_pipe *p, void *buf, size_t bytes, int tag, int mem_kind, int device,
                  const struct weft_p2p_check *check, int discard, uint32_t sig_slot, uint32_t sig_value,
                  const struct weft_iov *iov, uint32_t niov, struct weft_request **out);

int weft_pipe_irecv(struct weft_peer_pipe *p, void *buf, size_t bytes, int tag, int mem_kind, int device,
                    const struct weft_p2p_check *check, struct weft_request **out)
{
    return irecv_(p, buf, bytes, tag, mem_kind, device, check, 0, 0, 0, NULL, 0, out);
}

int weft_pipe_irecv_signal(struct weft_peer_pipe *p, void *buf, size_t bytes, int tag, int mem_kind, int device,
                           uint32_t slot, uint32_t value, struct weft_request **out)
{
    return irecv_(p, buf, bytes, tag, mem_kind, device, NULL, 0, slot, value, NULL, 0, out);
}

int weft_pipe_irecvv(struct weft_peer_pipe *p, const struct weft_iov *iov, uint32_t niov, int tag,
                     struct weft_request **out)
{
    if (!p->broken && !p->carrier.tp->rndv_vectors)
        return weft_set_error(p->p2p->core, WEFT_ERR_UNSUPPORTED, "recv from peer %d tag %d: %s does not move "
                              "vectored messages", p->peer, tag, weft_pipe_tp_name(p));
    /* The pieces are set before the receive can meet anything (an eager
     * message is scattered in deliver_eager). */
    return irecv_(p, NULL, weft_tp_iov_bytes(iov, niov), tag, 0 /* WEFT_MEM_HOST */, -1, NULL, 0, 0, 0, iov, niov,
                  out);
}

int weft_pipe_idiscard(struct weft_peer_pipe *p, int tag, struct weft_request **out)
{
    return irecv_(p, NULL, 0, tag, 0 /* WEFT_MEM_HOST */, -1, NULL, 1, 0, 0, NULL, 0, out);
}

static int irecv_(struct weft_peer_pipe *p, void *buf, size_t bytes, int tag, int mem_kind, int device,
                  const struct weft_p2p_check *check, int discard, uint32_t sig_slot, uint32_t sig_value,
                  const struct weft_iov *iov, uint32_t niov, struct weft_request **out)
{
    struct weft_core *core = p->p2p->core;
    struct weft_request *r;
    struct weft_lane *l;

    if (p->broken)
        return weft_set_error(core, p->broken, "recv from peer %d tag %d: the pipe over %s failed earlier (%s)",
                              p->peer, tag, weft_pipe_tp_name(p), p->failed || p->link_down ? p->fail_why : weft_err_str(p->broken));
    r = req_new(p, WEFT_REQ_RECV, buf, bytes, tag, mem_kind, device, check);
    l = r ? lane_get(p, tag, 1) : NULL;
    if (l == NULL) {
        if (r)
            weft_req_free(r);
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "recv from peer %d tag %d: no memory", p->peer, tag);
    }
    r->state = WEFT_REQ_POSTED;
    r->discard = (unsigned char)discard;
    r->xfer.signal_slot = sig_slot;
    r->xfer.signal_value = sig_value;
    r->xfer.iov = iov;
    r->xfer.niov = niov;
    *out = r;
    l->refuse = 0;
    if (!weft_queue_empty(&l->unexp)) {
        struct weft_unexpected *u = weft_container_of(weft_queue_pop(&l->unexp), struct weft_unexpected, qn);
        match_msg(p, r, &u->hdr, &u->check, u->payload);
        unexpected_free(p, u);
    } else {
        weft_list_add_tail(&l->posted, &r->link);
    }
    return WEFT_SUCCESS;
}

static void unexpected_add(struct weft_peer_pipe *p, struct weft_lane *l, const struct weft_wire_hdr *m,
                           const struct weft_p2p_check *mcheck, const void *payload, size_t len)
{
    struct weft_unexpected *u = calloc(1, sizeof(*u));
    if (u && len) {
        u->payload = weft_payload_get(&p->p2p->payloads, len);
        if (u->payload)
            memcpy(u->payload, payload, len);
    }
    if (u == NULL || (len && u->payload == NULL)) {
        free(u);
        weft_set_error(p->p2p->core, WEFT_ERR_NO_MEMORY,
                       "peer %d tag %d: no memory to hold an unexpected %zu-byte message", p->peer, m->tag, len);
        weft_pipe_break(p, WEFT_ERR_NO_MEMORY);
        return;
    }
    u->hdr = *m;
    if (m->flags & WEFT_WIRE_F_CHECK)
        u->check = *mcheck;
    weft_queue_push(&l->unexp, &u->qn);
}

/* EAGER or RTS: in sequence, then matched on its lane. */
static void on_message(struct weft_peer_pipe *p, const struct weft_wire_hdr *m, const struct weft_p2p_check *mcheck,
                       const void *payload, size_t len)
{
    struct weft_request *r = NULL;
    struct weft_lane *l;

    if (m->seq != p->recv_seq) {
        protocol_error(p, "message %llu arrived where %llu was due", (unsigned long long)m->seq,
                       (unsigned long long)p->recv_seq);
        return;
    }
    p->recv_seq++;
    if (m->flags & WEFT_WIRE_F_WITHDRAWN)
        return;   /* a send withdrawn before it went (weft_pipe_cancel): its place in the sequence only */
    if (m->type == WEFT_WIRE_EAGER && len != m->bytes) {
        protocol_error(p, "eager message says %llu bytes, carries %llu", (unsigned long long)m->bytes,
                       (unsigned long long)len);
        return;
    }
    l = lane_get(p, m->tag, 1);
    if (l == NULL) {
        weft_set_error(p->p2p->core, WEFT_ERR_NO_MEMORY, "peer %d tag %d: no memory for a lane", p->peer, m->tag);
        weft_pipe_break(p, WEFT_ERR_NO_MEMORY);
        return;
    }
    if (weft_queue_empty(&l->unexp)) {
        struct weft_list *n = weft_list_pop(&l->posted);
        if (n)
            r = weft_container_of(n, struct weft_request, link);
    }
    if (r == NULL && !l->refuse && weft_tag_revocable(m->tag) &&
        __atomic_load_n(&p->p2p->core->revoked, __ATOMIC_ACQUIRE))
        l->refuse = WEFT_ERR_REVOKED;   /* a lane first used after the revoke (weft_pipe_revoke) */
    if (r == NULL && l->refuse)
        refuse_msg(p, l, m);
    else if (r == NULL)
        unexpected_add(p, l, m, mcheck, payload, m->type == WEFT_WIRE_EAGER ? len : 0);
    else
        match_msg(p, r, m, mcheck, payload);
}

void weft_pipe_lane_refuse(struct weft_peer_pipe *p, int tag, int err)
{
    struct weft_lane *l = lane_get(p, tag, 1);
    struct weft_qnode *q;
    if (l == NULL || p->broken)
        return;
    WEFT_TRACE(p->p2p->rank, "peer %d tag %d: lane given up (%zu posted)", p->peer, tag, (size_t)!weft_list_empty(&l->posted));
    l->refuse = err ? err : WEFT_ERR_TRANSPORT;
    if (!weft_list_empty(&l->posted))
        return;   /* a receive of the lane's next user is posted already */
    while ((q = weft_queue_pop(&l->unexp)) != NULL) {
        struct weft_unexpected *u = weft_container_of(q, struct weft_unexpected, qn);
        refuse_msg(p, l, &u->hdr);
        unexpected_free(p, u);
    }
}

void weft_pipe_revoke(struct weft_peer_pipe *p)
{
    struct weft_list *n;
    if (p->broken)
        return;
    for (size_t i = 0; i < p->nbuckets; i++)
        weft_list_for_each(ln, &p->buckets[i]) {
            struct weft_lane *l = weft_container_of(ln, struct weft_lane, hash);
            if (!weft_tag_revocable(l->tag))
                continue;
            /* Posted and unmatched: nothing of the peer's is bound to them. */
            while ((n = weft_list_pop(&l->posted)) != NULL)
                weft_pipe_complete(weft_container_of(n, struct weft_request, link), WEFT_ERR_REVOKED);
            weft_pipe_lane_refuse(p, l->tag, WEFT_ERR_REVOKED);
        }
}

static void on_cts(struct weft_peer_pipe *p, const struct weft_wire_hdr *m, const void *key, size_t keylen)
{
    struct weft_request *s = weft_req_lookup(p->p2p, p, m->sreq, WEFT_REQ_SEND);
    const struct weft_rndv_path *path;

    if (s == NULL || s->state != WEFT_REQ_POSTED) {
        protocol_error(p, "CTS names send request %#llx, which is not waiting for one (state %llu)",
                       (unsigned long long)m->sreq, s ? (unsigned long long)s->state : 0ull);
        return;
    }
    if (m->status != WEFT_SUCCESS) {
        weft_pipe_finish_inflight(p, s, peer_code(m->status));
        return;
    }
    path = weft_rndv_path_of(m->aux);
    if (path == NULL) {
        protocol_error(p, "CTS names rendezvous path %llu of %llu", m->aux, (unsigned long long)weft_rndv_npaths);
        return;
    }
    s->state = WEFT_REQ_ACTIVE;
    s->peer_req = m->rreq;
    s->path = (int)m->aux;
    path->send_start(p, s, m, key, keylen);
}

/* RTS with REDO: the sender's mover could not take the message the
 * receive rreq met (it may not open the buffer now, p2p/rndv.c): the
 * receive starts over with the paths after the one it took. */
static void on_redo(struct weft_peer_pipe *p, const struct weft_wire_hdr *m)
{
    struct weft_request *r = weft_req_lookup(p->p2p, p, m->rreq, WEFT_REQ_RECV);
    if (r == NULL || !weft_list_linked(&r->link) || r->state != WEFT_REQ_ACTIVE || r->path <= 0 ||
        r->path >= weft_rndv_npaths || r->peer_req != m->sreq) {
        protocol_error(p, "RTS again (REDO) names receive request %#llx, which is not waiting for a mover (%llu)",
                       (unsigned long long)m->rreq, r ? (unsigned long long)r->path : 0ull);
        return;
    }
    WEFT_TRACE(p->p2p->rank, "recv from peer %d tag %d: the sender's %s could not take %llu bytes now; another path",
               p->peer, r->tag, weft_rndv_paths[r->path - 1]->name, (unsigned long long)m->bytes);
    inflight_remove(p, r);
    r->state = WEFT_REQ_POSTED;
    r->xfer.signal_sent = 0;
    int first = r->path;   /* the index after the path it took */
    r->path = 0;
    start_paths(p, r, m, first);
}

static void on_fin(struct weft_peer_pipe *p, const struct weft_wire_hdr *m)
{
    /* FIN from the receiver names our send; with TO_RECV the sender's names our receive. */
    int to_recv = (m->flags & WEFT_WIRE_F_TO_RECV) != 0;
    WEFT_TRACE(p->p2p->rank, "peer %d tag %d: FIN for %s %#llx status %d", p->peer, m->tag, to_recv ? "recv" : "send",
               (unsigned long long)(to_recv ? m->rreq : m->sreq), m->status);
    struct weft_request *r = weft_req_lookup(p->p2p, p, to_recv ? m->rreq : m->sreq,
                                             to_recv ? WEFT_REQ_RECV : WEFT_REQ_SEND);
    if (r == NULL || !weft_list_linked(&r->link)) {
        protocol_error(p, to_recv ? "FIN names receive request %#llx, which is not in flight (%llu)"
                                  : "FIN names send request %#llx, which is not in flight (%llu)",
                       (unsigned long long)(to_recv ? m->rreq : m->sreq), (unsigned long long)m->status);
        return;
    }
    if (to_recv && (m->flags & WEFT_WIRE_F_SIGNALED) && m->status == WEFT_SUCCESS)
        r->xfer.signal_done = 1;   /* the sender's GPU wrote the slot after its copy */
    if (m->status == WEFT_ERR_TRUNCATE && !to_recv)
        weft_set_error(p->p2p->core, WEFT_ERR_TRUNCATE,
                       "send to peer %d tag %d: the %zu-byte message was larger than the receive buffer",
                       p->peer, r->tag, r->bytes);
    weft_pipe_finish_inflight(p, r, peer_code(m->status));
}

/* The common case of a small eager message: in sequence, a host receive
 * posted and nothing unexpected before it on its lane: straight into the
 * buffer. 0: not that case, nothing done (the general path takes it). */
static int deliver_small(struct weft_peer_pipe *p, const struct weft_wire_small *s, const void *payload, size_t len)
{
    struct weft_lane *l;
    struct weft_request *r;

    if (s->seq != p->recv_seq || s->flags != 0 || (l = lane_get(p, s->tag, 0)) == NULL ||
        !weft_queue_empty(&l->unexp) || weft_list_empty(&l->posted))
        return 0;
    r = weft_container_of(weft_list_first(&l->posted), struct weft_request, link);
    if (len > r->bytes || r->checked || weft_mem_is_device(r->xfer.mem_kind) || r->xfer.niov)
        return 0;
    p->recv_seq++;
    fc_consume(p, len + WEFT_WIRE_MSG_COST);
    weft_list_del(&r->link);
    r->msg_bytes = len;
    if (len)
        memcpy(r->xfer.buf, payload, len);
    weft_pipe_complete(r, WEFT_SUCCESS);
    return 1;
}

void weft_pipe_on_frame(struct weft_peer_pipe *p, const void *frame, size_t len)
{
    struct weft_wire_hdr m;
    const unsigned char *b = frame;

    if (p->broken)
        return;   /* a broken pipe ignores what still trickles in */
    p->heard++;
    if (len >= sizeof(struct weft_wire_small) && b[0] == WEFT_WIRE_EAGER_SMALL) {
        p->activity++;
        struct weft_wire_small s;
        memcpy(&s, b, sizeof(s));
        if (deliver_small(p, &s, b + sizeof(s), len - sizeof(s)))
            return;
        memset(&m, 0, sizeof(m));
        m.type = WEFT_WIRE_EAGER;
        m.flags = s.flags;
        m.tag = s.tag;
        m.seq = s.seq;
        m.bytes = len - sizeof(s);
        on_message(p, &m, NULL, b + sizeof(s), len - sizeof(s));
        return;
    }
    if (len < sizeof(m)) {
        protocol_error(p, "frame of %llu bytes (type %llu) is too short", (unsigned long long)len,
                       len ? (unsigned long long)b[0] : 0ull);
        return;
    }
    memcpy(&m, b, sizeof(m));
    if (m.type != WEFT_WIRE_HEARTBEAT && m.type != WEFT_WIRE_NOTICE)
        p->activity++;
    switch (m.type) {
    case WEFT_WIRE_EAGER:
    case WEFT_WIRE_RTS: {
        struct weft_p2p_check ck;
        if (m.flags & WEFT_WIRE_F_REDO) {
            if (m.type == WEFT_WIRE_RTS)
                on_redo(p, &m);
            else
                protocol_error(p, "an eager message (%llu bytes) with flag REDO (%llu)", (unsigned long long)m.bytes,
                               0ull);
            break;
        }
        size_t off = sizeof(m);
        if (m.flags & WEFT_WIRE_F_CHECK) {
            if (len < off + WEFT_WIRE_CHECK_BYTES) {
                protocol_error(p, "checked message of %llu bytes is too short (%llu)", (unsigned long long)len,
                               (unsigned long long)off);
                return;
            }
            memcpy(&ck, b + off, sizeof(ck));
            off += WEFT_WIRE_CHECK_BYTES;
        }
        on_message(p, &m, &ck, b + off, len - off);
        break;
    }
    case WEFT_WIRE_CREDIT:
        if (m.bytes > p->fc_granted)
            p->fc_granted = m.bytes;
        break;
    case WEFT_WIRE_HEARTBEAT:
        break;   /* heard: counted above */
    case WEFT_WIRE_NOTICE:
        weft_health_on_notice(p, &m, (const char *)b + sizeof(m), len - sizeof(m));
        break;
    case WEFT_WIRE_CTS:
        on_cts(p, &m, b + sizeof(m), len - sizeof(m));
        break;
    case WEFT_WIRE_FIN:
        on_fin(p, &m);
        break;
    default:
        protocol_error(p, "unknown control message type %llu (%llu bytes)", (unsigned long long)m.type,
                       (unsigned long long)len);
        break;
    }
}

/* ---------------------------------------------------------------- withdrawing */

int weft_pipe_cancel(struct weft_request *r, int err)
{
    if (r->state == WEFT_REQ_DONE)
        return 1;
    if (r->type == WEFT_REQ_RECV && r->state == WEFT_REQ_POSTED && weft_list_linked(&r->link)) {
        /* Still in its lane's posted list: nothing of the peer's is bound to it. */
        weft_list_del(&r->link);
        weft_pipe_complete(r, err);
        return 1;
    }
    if (r->type == WEFT_REQ_SEND && r->state == WEFT_REQ_QUEUED && r->pipe != NULL) {
        /* Still in the outbound queue (no room, or no credit from the
         * peer): nothing of it went out. It becomes an empty placeholder
         * that keeps the pipe's sequence, which the receiver drops
         * unmatched (WEFT_WIRE_F_WITHDRAWN), and the request completes now:
         * a send stuck behind a live peer's flow control no longer breaks
         * the pipe between two live ranks when its call gives up. */
        struct weft_peer_pipe *p = r->pipe;
        weft_queue_for_each(q, &p->out) {
            struct weft_outbound *o = weft_container_of(q, struct weft_outbound, qn);
            if (o->req != r)
                continue;
            o->req = NULL;
            memset(&o->hdr, 0, sizeof(o->hdr));
            o->hdr.type = WEFT_WIRE_EAGER;
            o->hdr.flags = WEFT_WIRE_F_WITHDRAWN;
            o->hdr.tag = r->tag;
            o->hdr.seq = r->seq;
            weft_pipe_complete(r, err);
            return 1;
        }
    }
    /* A send whose RTS is out stays: the receiver answers it (CTS, or a
     * refusing FIN from a lane that refuses: weft_pipe_lane_refuse), or
     * its pipe breaks. Withdrawing it would leave the receiver's transfer
     * state (an expected push) dangling. */
    return 0;
}

/* ---------------------------------------------------------------- breaking */

void weft_pipe_break(struct weft_peer_pipe *p, int err)
{
    struct weft_list *n;
    struct weft_qnode *q;

    if (p->broken)
        return;
    if (err == WEFT_ERR_TRANSPORT && !p->failed && !p->link_down && p->peer != p->p2p->rank &&
        !__atomic_load_n(&p->p2p->core->leaving, __ATOMIC_ACQUIRE)) {
        /* A transport error this side met first (a send that failed):
         * decide now whether the peer failed or only the link did
         * (p2p/health.c; it breaks the pipe itself), so the requests
         * failed below say which. */
        weft_health_settle(p->p2p, p->peer, err);
        if (p->broken)
            return;
    }
    p->broken = err ? err : WEFT_ERR_TRANSPORT;
    if (__atomic_load_n(&p->p2p->core->leaving, __ATOMIC_ACQUIRE))   /* destroy's goodbyes */
        WEFT_INFO(p->p2p->rank, "pipe to peer %d over %s closed (the comm is being destroyed)", p->peer,
                  weft_pipe_tp_name(p));
    else
        WEFT_WARN(p->p2p->rank, "pipe to peer %d over %s closed: %s", p->peer, weft_pipe_tp_name(p),
                  weft_err_str(p->broken));
    if (p->carrier.tp && p->carrier.tp->abort_peer)
        p->carrier.tp->abort_peer(p->carrier.ctx, p->peer);
    if (p->mover.tp && p->mover.tp->abort_peer)
        p->mover.tp->abort_peer(p->mover.ctx, p->peer);
    /* Paths let go of this pipe's requests before they fail. */
    for (int i = 0; i < weft_rndv_npaths; i++)
        if (weft_rndv_paths[i]->abort_pipe)
            weft_rndv_paths[i]->abort_pipe(p);

    while ((n = weft_list_pop(&p->inflight)) != NULL)
        weft_pipe_complete(weft_container_of(n, struct weft_request, link), p->broken);
    p->ninflight = 0;
    p->rndv_sends = 0;
    while ((q = weft_queue_pop(&p->out)) != NULL) {
        struct weft_outbound *o = weft_container_of(q, struct weft_outbound, qn);
        p->p2p->out_queued--;
        if (o->req)
            weft_pipe_complete(o->req, p->broken);
        outbound_free(p, o);
    }
    for (size_t i = 0; i < p->nbuckets; i++)
        weft_list_for_each(ln, &p->buckets[i]) {
            struct weft_lane *l = weft_container_of(ln, struct weft_lane, hash);
            while ((n = weft_list_pop(&l->posted)) != NULL)
                weft_pipe_complete(weft_container_of(n, struct weft_request, link), p->broken);
        }
}
