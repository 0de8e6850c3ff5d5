/*
 * The pipe to one peer: ordering, matching, eager vs rendezvous, truncation.
 *
 * Send side. A message up to the transport's eager limit goes out as one
 * EAGER control message (header + data) and the send completes as soon as
 * the transport owns the bytes. A larger one goes out as RTS; the receiver
 * either pulls the data and answers FIN, or answers CTS and the sender's
 * transport pushes it. Sends leave in the order they were posted: when the
 * transport has no room, they wait in the pipe's outbound FIFO, and so does
 * every later control message, so sequence numbers arrive in order.
 *
 * Receive side. Messages are matched per (peer, tag) lane in arrival order:
 * a message finds the oldest posted receive of its lane, or waits in the
 * lane's unexpected list (EAGER data copied out of the transport's buffer)
 * until a receive is posted. A message larger than the receive buffer fails
 * the receive with WEFT_ERR_TRUNCATE without writing to the buffer; a large
 * one tells the sender with FIN so its send fails the same way, and the pipe
 * goes on with the next message.
 *
 * Device memory (docs/cuda.md). Requests carry the memory kind of their
 * buffer (classified once per call in p2p/api.c). Transports only ever see
 * host memory: an EAGER payload from a device buffer is copied to a host
 * bounce first (and copied to the device at the receiver); a rendezvous
 * message with a device side is decided by the receiver when it matches:
 * self pipe -> one cudaMemcpy between the two buffers; both device over shm
 * with CUDA IPC possible -> CTS with F_IPC (p2p/cuda_ipc.c); otherwise
 * STAGED through pinned host chunks on an internal lane (p2p/stage.c).
 * Host-to-host messages take exactly the paths they took before.
 */
#include "pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "cuda_ipc.h"
#include "cudawrap.h"
#include "ib_gdr.h"
#include "log.h"
#include "stage.h"

_Static_assert(WEFT_MEM_DEVICE == 2 && WEFT_MEM_MANAGED == 3 && WEFT_MEM_PINNED < 2,
               "weft_mem_is_device (pipe.h) assumes this order of enum weft_mem_kind");

/* ---------------------------------------------------------------- queues */

void weft_req_queue_push(struct weft_req_queue *q, struct weft_request *r)
{
    r->next = NULL;
    r->prev = q->tail;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->count++;
}

void weft_req_queue_remove(struct weft_req_queue *q, struct weft_request *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        q->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        q->tail = r->prev;
    r->next = r->prev = NULL;
    q->count--;
}

struct weft_request *weft_req_queue_pop(struct weft_req_queue *q)
{
    struct weft_request *r = q->head;
    if (r)
        weft_req_queue_remove(q, r);
    return r;
}

/* ----------------------------------------------------------------- lanes */

static size_t lane_hash(int tag, size_t buckets)
{
    return ((uint32_t)tag * 2654435761u) & (buckets - 1);
}

static int lanes_grow(struct weft_pipe *p)
{
    size_t nb = p->lane_buckets * 2;
    struct weft_lane **nl = calloc(nb, sizeof(*nl));
    if (nl == NULL)
        return -1;
    for (size_t i = 0; i < p->lane_buckets; i++) {
        struct weft_lane *l = p->lanes[i], *next;
        for (; l; l = next) {
            next = l->hash_next;
            size_t h = lane_hash(l->tag, nb);
            l->hash_next = nl[h];
            nl[h] = l;
        }
    }
    free(p->lanes);
    p->lanes = nl;
    p->lane_buckets = nb;
    return 0;
}

/* The lane of tag; created when create is set. NULL: absent or no memory. */
static struct weft_lane *lane_get(struct weft_pipe *p, int tag, int create)
{
    size_t h = lane_hash(tag, p->lane_buckets);
    struct weft_lane *l;

    for (l = p->lanes[h]; l; l = l->hash_next)
        if (l->tag == tag)
            return l;
    if (!create)
        return NULL;
    if (p->lane_count >= 2 * p->lane_buckets && lanes_grow(p) == 0)
        h = lane_hash(tag, p->lane_buckets);
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->tag = tag;
    l->hash_next = p->lanes[h];
    p->lanes[h] = l;
    p->lane_count++;
    return l;
}

void weft_pipe_lane_release(struct weft_pipe *p, int tag)
{
    size_t h = lane_hash(tag, p->lane_buckets);
    struct weft_lane **pl = &p->lanes[h], *l;

    for (; (l = *pl) != NULL; pl = &l->hash_next) {
        if (l->tag != tag)
            continue;
        if (l->posted.head || l->unexp_head)
            return;
        *pl = l->hash_next;
        p->lane_count--;
        free(l);
        return;
    }
}

/* ----------------------------------------------------------- set-up/down */

int weft_pipe_init(struct weft_comm *c, struct weft_pipe *p, int peer)
{
    memset(p, 0, sizeof(*p));
    p->comm = c;
    p->peer = peer;
    p->lane_buckets = 16;
    p->lanes = calloc(p->lane_buckets, sizeof(*p->lanes));
    return p->lanes ? WEFT_SUCCESS : WEFT_ERR_NO_MEMORY;
}

void weft_pipe_fini(struct weft_pipe *p)
{
    if (p->lanes) {
        for (size_t i = 0; i < p->lane_buckets; i++) {
            struct weft_lane *l = p->lanes[i], *ln;
            for (; l; l = ln) {
                struct weft_unexpected *u = l->unexp_head, *un;
                for (; u; u = un) {
                    un = u->next;
                    free(u->payload);
                    free(u);
                }
                ln = l->hash_next;
                free(l);
            }
        }
        free(p->lanes);
        p->lanes = NULL;
    }
    while (p->out_head) {
        struct weft_outbound *o = p->out_head;
        p->out_head = o->next;
        free(o->payload);
        free(o);
    }
    p->out_tail = NULL;
}

/* ------------------------------------------------------------ completion */

static void req_complete(struct weft_request *r, int err)
{
    r->status.error = err;
    if (r->type == WEFT_REQ_RECV)
        r->status.bytes = r->msg_bytes;
    r->state = WEFT_REQ_DONE;
}

static const char *pipe_tp_name(const struct weft_pipe *p)
{
    return p->tp ? p->tp->name : "none";
}

/* --------------------------------------------------------------- sending */

static void outbound_append(struct weft_pipe *p, struct weft_outbound *o)
{
    o->next = NULL;
    if (p->out_tail)
        p->out_tail->next = o;
    else
        p->out_head = o;
    p->out_tail = o;
    p->comm->out_queued++;
}

/* An EAGER message from a device buffer: the data goes through a host
 * bounce (synchronous D2H). If the copy fails, the message still goes out
 * (its sequence number is taken) as a 0-byte EAGER whose status tells the
 * receiver, and the send fails with the copy's error. */
__attribute__((noinline)) static int send_eager_device(struct weft_pipe *p, struct weft_request *r,
                                                       struct weft_ctrl *h)
{
    struct weft_comm *c = p->comm;
    const void *data = NULL;
    int err = WEFT_SUCCESS, rc;

    h->flags |= WEFT_CTRL_F_DEVICE;
    if (r->bytes) {
        void *b = weft_stage_bounce(c, r->bytes);
        if (b == NULL)
            err = weft_set_error(c, WEFT_ERR_NO_MEMORY, "send to peer %d tag %d: no host memory to stage %zu bytes "
                                 "of device memory", p->peer, r->tag, r->bytes);
        else {
            char what[96];
            snprintf(what, sizeof(what), "send to peer %d tag %d: eager copy device to host", p->peer, r->tag);
            err = weft_stage_copy_sync(c, b, r->buf, r->bytes, what);
        }
        data = b;
    }
    if (err != WEFT_SUCCESS) {
        h->bytes = 0;
        h->status = err;
        data = NULL;
    }
    rc = p->tp->ctrl_send(p, h, data, err == WEFT_SUCCESS ? r->bytes : 0);
    if (rc == WEFT_SUCCESS)
        req_complete(r, err);
    return rc;
}

/* Hands a send's first message (EAGER with data, or RTS) to the transport. */
static int send_req_now(struct weft_pipe *p, struct weft_request *r)
{
    struct weft_ctrl h;
    int rc;

    memset(&h, 0, sizeof(h));
    h.tag = r->tag;
    h.seq = r->seq;
    h.bytes = r->bytes;
    if (!r->rndv) {
        h.type = WEFT_CTRL_EAGER;
        if (weft_mem_is_device(r->mem_kind))
            return send_eager_device(p, r, &h);
        rc = p->tp->ctrl_send(p, &h, r->buf, r->bytes);
        if (rc == WEFT_SUCCESS)
            req_complete(r, WEFT_SUCCESS);
    } else {
        h.type = WEFT_CTRL_RTS;
        h.sreq = weft_req_id(r);
        h.addr = (uint64_t)(uintptr_t)r->buf;
        if (weft_mem_is_device(r->mem_kind)) {
            size_t chunk = weft_stage_chunk(p->comm);
            h.flags |= WEFT_CTRL_F_DEVICE;
            h.reserved = (uint16_t)(r->mem_device >= 0 ? r->mem_device : 0);   /* p2p/cuda_ipc.h */
            h.reserved2 = (uint32_t)(chunk > UINT32_MAX ? UINT32_MAX : chunk);
        }
        rc = p->tp->ctrl_send(p, &h, NULL, 0);
        if (rc == WEFT_SUCCESS) {
            r->state = WEFT_REQ_POSTED;
            weft_req_queue_push(&p->inflight, r);
        }
    }
    return rc;
}

/* Sends a control message now, or queues it behind earlier ones. */
void weft_pipe_send_ctrl(struct weft_pipe *p, const struct weft_ctrl *h, const void *payload, size_t len)
{
    struct weft_outbound *o;
    int rc;

    if (p->broken)
        return;
    if (p->out_head == NULL) {
        rc = p->tp->ctrl_send(p, h, payload, len);
        if (rc == WEFT_SUCCESS)
            return;
        if (rc != WEFT_EAGAIN) {
            weft_pipe_break(p, rc);
            return;
        }
    }
    o = calloc(1, sizeof(*o));
    if (o && len) {
        o->payload = malloc(len);
        if (o->payload)
            memcpy(o->payload, payload, len);
        o->len = len;
    }
    if (o == NULL || (len && o->payload == NULL)) {
        free(o);
        weft_set_error(p->comm, WEFT_ERR_NO_MEMORY, "peer %d: no memory to queue a control message", p->peer);
        weft_pipe_break(p, WEFT_ERR_NO_MEMORY);
        return;
    }
    o->hdr = *h;
    outbound_append(p, o);
}

static void pipe_send_ctrl(struct weft_pipe *p, const struct weft_ctrl *h)
{
    weft_pipe_send_ctrl(p, h, NULL, 0);
}

int weft_pipe_flush(struct weft_pipe *p)
{
    int n = 0;

    while (p->out_head && !p->broken) {
        struct weft_outbound *o = p->out_head;
        int rc = o->req ? send_req_now(p, o->req) : p->tp->ctrl_send(p, &o->hdr, o->payload, o->len);
        if (rc == WEFT_EAGAIN)
            break;
        p->out_head = o->next;
        if (p->out_head == NULL)
            p->out_tail = NULL;
        p->comm->out_queued--;
        if (rc != WEFT_SUCCESS) {
            if (o->req)
                req_complete(o->req, rc);
            free(o->payload);
            free(o);
            weft_pipe_break(p, rc);
            return n;
        }
        free(o->payload);
        free(o);
        n++;
    }
    return n;
}

static struct weft_request *req_new(struct weft_comm *c, struct weft_pipe *p, int type,
                                    void *buf, size_t bytes, int tag)
{
    struct weft_request *r = weft_request_alloc(c);
    if (r == NULL)
        return NULL;
    r->comm = c;
    r->pipe = p;
    r->type = type;
    r->tag = tag;
    r->buf = buf;
    r->bytes = bytes;
    r->status.peer = p->peer;
    r->status.tag = tag;
    r->status.bytes = bytes;
    return r;
}

int weft_pipe_isend(struct weft_comm *c, const void *buf, size_t bytes, int peer, int tag,
                    struct weft_request **out)
{
    return weft_pipe_isend_mem(c, buf, bytes, peer, tag, WEFT_MEM_HOST, -1, out);
}

int weft_pipe_isend_mem(struct weft_comm *c, const void *buf, size_t bytes, int peer, int tag,
                        int mem_kind, int device, struct weft_request **out)
{
    struct weft_pipe *p = &c->pipes[peer];
    struct weft_request *r;
    int rc = WEFT_EAGAIN;

    if (p->broken)
        return weft_set_error(c, p->broken, "send to peer %d tag %d: the pipe over %s failed earlier (%s)",
                              peer, tag, pipe_tp_name(p), weft_strerror(p->broken));
    r = req_new(c, p, WEFT_REQ_SEND, (void *)buf, bytes, tag);
    if (r == NULL)
        return weft_set_error(c, WEFT_ERR_NO_MEMORY, "send to peer %d tag %d: no memory for a request", peer, tag);
    r->mem_kind = mem_kind;
    r->mem_device = device;
    r->seq = p->send_seq++;
    r->rndv = bytes > (tag < 0 ? p->eager_limit_internal : p->eager_limit);

    if (p->out_head == NULL)
        rc = send_req_now(p, r);
    if (rc == WEFT_EAGAIN) {
        struct weft_outbound *o = calloc(1, sizeof(*o));
        if (o == NULL) {
            weft_request_free(r);
            p->send_seq--;
            return weft_set_error(c, WEFT_ERR_NO_MEMORY, "send to peer %d tag %d: no memory to queue", peer, tag);
        }
        o->req = r;
        r->state = WEFT_REQ_QUEUED;
        outbound_append(p, o);
    } else if (rc != WEFT_SUCCESS) {
        weft_request_free(r);
        weft_pipe_break(p, rc);
        return weft_set_error(c, rc, "send to peer %d tag %d bytes %zu over %s failed", peer, tag, bytes,
                              pipe_tp_name(p));
    }
    *out = r;
    return WEFT_SUCCESS;
}

/* ------------------------------------------------------------- receiving */

/* An EAGER payload into a device buffer: one synchronous copy. */
__attribute__((noinline)) static void deliver_eager_device(struct weft_pipe *p, struct weft_request *r,
                                                           const struct weft_ctrl *m, const void *payload)
{
    char what[96];
    snprintf(what, sizeof(what), "recv from peer %d tag %d: eager copy host to device", p->peer, r->tag);
    req_complete(r, weft_stage_copy_sync(p->comm, r->buf, payload, m->bytes, what));
}

/* EAGER message meets its receive: copy, or fail with TRUNCATE. */
static void deliver_eager(struct weft_pipe *p, struct weft_request *r, const struct weft_ctrl *m,
                          const void *payload)
{
    r->msg_bytes = m->bytes;
    if (m->status != WEFT_SUCCESS) {
        /* The sender could not read its device buffer (send_eager_device). */
        weft_set_error(p->comm, WEFT_ERR_TRANSPORT,
                       "recv from peer %d tag %d: the sender failed to copy its device buffer (%s there)", p->peer,
                       r->tag, weft_strerror(m->status));
        req_complete(r, WEFT_ERR_TRANSPORT);
        return;
    }
    if (m->bytes > r->bytes) {
        weft_set_error(p->comm, WEFT_ERR_TRUNCATE,
                       "recv from peer %d tag %d: message of %llu bytes does not fit the %zu-byte buffer",
                       p->peer, r->tag, (unsigned long long)m->bytes, r->bytes);
        req_complete(r, WEFT_ERR_TRUNCATE);
        return;
    }
    if (m->bytes && weft_mem_is_device(r->mem_kind)) {
        deliver_eager_device(p, r, m, payload);
        return;
    }
    if (m->bytes)
        memcpy(r->buf, payload, m->bytes);
    req_complete(r, WEFT_SUCCESS);
}

/* A rendezvous message with a device buffer on either side, matched (see
 * the top of this file). h: the answer prepared by match_rts. */
static void match_rts_device(struct weft_pipe *p, struct weft_request *r, const struct weft_ctrl *m,
                             struct weft_ctrl *h)
{
    struct weft_comm *c = p->comm;
    int sdev = (m->flags & WEFT_CTRL_F_DEVICE) != 0, rdev = weft_mem_is_device(r->mem_kind);
    int rc;

    if (p->tp->id == WEFT_TP_SELF) {
        /* One process: one copy between the two buffers, like the host pull. */
        char what[64];
        snprintf(what, sizeof(what), "send to self tag %d", r->tag);
        rc = weft_stage_copy_sync(c, r->buf, (const void *)(uintptr_t)m->addr, m->bytes, what);
        h->type = WEFT_CTRL_FIN;
        h->status = rc;
        pipe_send_ctrl(p, h);
        req_complete(r, rc);
        return;
    }
    if (sdev && rdev && c->cuda && p->tp->id == WEFT_TP_SHM && weft_cuda_ipc_eligible(p, m, r)) {
        unsigned char payload[WEFT_CUDA_IPC_PAYLOAD_MAX];
        size_t len = sizeof(payload);
        rc = weft_cuda_ipc_export(p, r, payload, &len);
        if (rc == WEFT_SUCCESS && len <= sizeof(payload)) {
            r->dev_path = WEFT_DEV_PATH_IPC;
            r->state = WEFT_REQ_ACTIVE;
            r->tp_done = 0;
            weft_req_queue_push(&p->inflight, r);
            h->type = WEFT_CTRL_CTS;
            h->flags = WEFT_CTRL_F_IPC;
            h->rreq = weft_req_id(r);
            h->status = WEFT_SUCCESS;
            weft_pipe_send_ctrl(p, h, payload, len);
            return;
        }
        WEFT_TRACE(c->rank, "recv from peer %d tag %d: CUDA IPC export failed (%s), staging instead", p->peer,
                   r->tag, weft_strerror(rc));
    }
    r->dev_path = WEFT_DEV_PATH_STAGED;
    r->state = WEFT_REQ_ACTIVE;
    r->tp_done = 0;
    weft_req_queue_push(&p->inflight, r);
    rc = weft_stage_recv_start(p, r, m);
    if (rc != WEFT_SUCCESS && !p->broken && r->state != WEFT_REQ_DONE) {
        /* Nothing was announced to the sender: refuse the message. */
        weft_req_queue_remove(&p->inflight, r);
        h->type = WEFT_CTRL_FIN;
        h->status = rc;
        pipe_send_ctrl(p, h);
        req_complete(r, rc);
    }
}

/* RTS meets its receive: pull it, or ask the sender to push, or refuse it. */
static void match_rts(struct weft_pipe *p, struct weft_request *r, const struct weft_ctrl *m)
{
    struct weft_ctrl h;
    int rc = WEFT_EAGAIN;

    memset(&h, 0, sizeof(h));
    h.sreq = m->sreq;
    h.tag = m->tag;
    h.seq = m->seq;
    h.bytes = m->bytes;
    r->msg_bytes = m->bytes;
    r->peer_req = m->sreq;

    if (m->bytes > r->bytes) {
        weft_set_error(p->comm, WEFT_ERR_TRUNCATE,
                       "recv from peer %d tag %d: message of %llu bytes does not fit the %zu-byte buffer",
                       p->peer, r->tag, (unsigned long long)m->bytes, r->bytes);
        h.type = WEFT_CTRL_FIN;
        h.status = WEFT_ERR_TRUNCATE;
        pipe_send_ctrl(p, &h);
        req_complete(r, WEFT_ERR_TRUNCATE);
        return;
    }
    /* GPUDirect RDMA (p2p/ib_gdr.c): on an ib pipe where both ranks register
     * device memory, a device message takes the ordinary rendezvous below. */
    if (((m->flags & WEFT_CTRL_F_DEVICE) || weft_mem_is_device(r->mem_kind)) && !weft_ib_gdr_usable(p)) {
        match_rts_device(p, r, m, &h);
        return;
    }
    if (p->tp->rndv_get)
        rc = p->tp->rndv_get(p, r, m);
    if (rc != WEFT_EAGAIN) {
        h.type = WEFT_CTRL_FIN;
        h.status = rc;
        pipe_send_ctrl(p, &h);
        req_complete(r, rc);
        return;
    }
    r->state = WEFT_REQ_ACTIVE;
    r->tp_done = 0;
    weft_req_queue_push(&p->inflight, r);
    h.type = WEFT_CTRL_CTS;
    h.rreq = weft_req_id(r);
    h.status = WEFT_SUCCESS;
    pipe_send_ctrl(p, &h);
    if (p->broken)
        return;
    rc = p->tp->rndv_expect(p, r);
    if (rc != WEFT_SUCCESS) {
        weft_set_error(p->comm, rc, "recv from peer %d tag %d: %s could not expect %llu bytes", p->peer,
                       r->tag, pipe_tp_name(p), (unsigned long long)m->bytes);
        weft_pipe_break(p, rc);
    }
}

int weft_pipe_irecv(struct weft_comm *c, void *buf, size_t bytes, int peer, int tag,
                    struct weft_request **out)
{
    return weft_pipe_irecv_mem(c, buf, bytes, peer, tag, WEFT_MEM_HOST, -1, out);
}

int weft_pipe_irecv_mem(struct weft_comm *c, void *buf, size_t bytes, int peer, int tag,
                        int mem_kind, int device, struct weft_request **out)
{
    struct weft_pipe *p = &c->pipes[peer];
    struct weft_request *r;
    struct weft_lane *l;

    if (p->broken)
        return weft_set_error(c, p->broken, "recv from peer %d tag %d: the pipe over %s failed earlier (%s)",
                              peer, tag, pipe_tp_name(p), weft_strerror(p->broken));
    r = req_new(c, p, WEFT_REQ_RECV, buf, bytes, tag);
    l = r ? lane_get(p, tag, 1) : NULL;
    if (l == NULL) {
        if (r)
            weft_request_free(r);
        return weft_set_error(c, WEFT_ERR_NO_MEMORY, "recv from peer %d tag %d: no memory", peer, tag);
    }
    r->mem_kind = mem_kind;
    r->mem_device = device;
    r->state = WEFT_REQ_POSTED;
    if (l->unexp_head) {
        struct weft_unexpected *u = l->unexp_head;
        l->unexp_head = u->next;
        if (l->unexp_head == NULL)
            l->unexp_tail = NULL;
        if (u->hdr.type == WEFT_CTRL_EAGER)
            deliver_eager(p, r, &u->hdr, u->payload);
        else
            match_rts(p, r, &u->hdr);
        free(u->payload);
        free(u);
    } else {
        weft_req_queue_push(&l->posted, r);
    }
    *out = r;
    return WEFT_SUCCESS;
}

static void unexpected_add(struct weft_pipe *p, struct weft_lane *l, const struct weft_ctrl *m,
                           const void *payload, size_t len)
{
    struct weft_unexpected *u = calloc(1, sizeof(*u));
    if (u && len) {
        u->payload = malloc(len);
        if (u->payload)
            memcpy(u->payload, payload, len);
    }
    if (u == NULL || (len && u->payload == NULL)) {
        free(u);
        weft_set_error(p->comm, WEFT_ERR_NO_MEMORY,
                       "peer %d tag %d: no memory to hold an unexpected %zu-byte message", p->peer, m->tag, len);
        weft_pipe_break(p, WEFT_ERR_NO_MEMORY);
        return;
    }
    u->hdr = *m;
    if (l->unexp_tail)
        l->unexp_tail->next = u;
    else
        l->unexp_head = u;
    l->unexp_tail = u;
}

void weft_pipe_on_ctrl(struct weft_pipe *p, const struct weft_ctrl *m, const void *payload, size_t len)
{
    struct weft_request *r;
    struct weft_lane *l;

    if (p->broken)
        return;   /* a broken pipe ignores what still trickles in */

    switch (m->type) {
    case WEFT_CTRL_EAGER:
    case WEFT_CTRL_RTS:
        if (m->seq != p->recv_seq) {
            weft_set_error(p->comm, WEFT_ERR_INTERNAL,
                           "peer %d over %s: message %llu arrived where %llu was due (protocol error)", p->peer,
                           pipe_tp_name(p), (unsigned long long)m->seq, (unsigned long long)p->recv_seq);
            weft_pipe_break(p, WEFT_ERR_INTERNAL);
            return;
        }
        p->recv_seq++;
        if (m->type == WEFT_CTRL_EAGER && len != m->bytes) {
            weft_set_error(p->comm, WEFT_ERR_INTERNAL, "peer %d over %s: eager message says %llu bytes, carries %zu",
                           p->peer, pipe_tp_name(p), (unsigned long long)m->bytes, len);
            weft_pipe_break(p, WEFT_ERR_INTERNAL);
            return;
        }
        l = lane_get(p, m->tag, 1);
        if (l == NULL) {
            weft_set_error(p->comm, WEFT_ERR_NO_MEMORY, "peer %d tag %d: no memory for a lane", p->peer, m->tag);
            weft_pipe_break(p, WEFT_ERR_NO_MEMORY);
            return;
        }
        r = l->unexp_head ? NULL : weft_req_queue_pop(&l->posted);
        if (r == NULL)
            unexpected_add(p, l, m, payload, m->type == WEFT_CTRL_EAGER ? len : 0);
        else if (m->type == WEFT_CTRL_EAGER)
            deliver_eager(p, r, m, payload);
        else
            match_rts(p, r, m);
        break;

    case WEFT_CTRL_CTS:
        r = weft_req_from_id(m->sreq);
        if (m->status != WEFT_SUCCESS) {
            weft_req_queue_remove(&p->inflight, r);
            req_complete(r, m->status);
            break;
        }
        r->state = WEFT_REQ_ACTIVE;
        r->peer_req = m->rreq;
        r->tp_done = 0;
        {
            int rc;
            if (m->flags & WEFT_CTRL_F_STAGED) {
                r->dev_path = WEFT_DEV_PATH_STAGED;
                rc = weft_stage_send_start(p, r, m);
            } else if (m->flags & WEFT_CTRL_F_IPC) {
                r->dev_path = WEFT_DEV_PATH_IPC;
                rc = weft_cuda_ipc_push(p, r, m, payload, len);
            } else {
                rc = p->tp->rndv_push(p, r, m);
            }
            if (rc != WEFT_SUCCESS) {
                weft_set_error(p->comm, rc, "send to peer %d tag %d: %s could not push %zu bytes", p->peer,
                               r->tag, pipe_tp_name(p), r->bytes);
                weft_pipe_break(p, rc);
            }
        }
        break;

    case WEFT_CTRL_FIN:
        /* FIN with F_IPC comes from the sender and names our receive. */
        r = weft_req_from_id((m->flags & WEFT_CTRL_F_IPC) ? m->rreq : m->sreq);
        weft_req_queue_remove(&p->inflight, r);
        if (m->status == WEFT_ERR_TRUNCATE)
            weft_set_error(p->comm, WEFT_ERR_TRUNCATE,
                           "send to peer %d tag %d: the %zu-byte message was larger than the receive buffer",
                           p->peer, r->tag, r->bytes);
        req_complete(r, m->status);
        break;

    default:
        weft_set_error(p->comm, WEFT_ERR_INTERNAL, "peer %d over %s: unknown control message type %d", p->peer,
                       pipe_tp_name(p), m->type);
        weft_pipe_break(p, WEFT_ERR_INTERNAL);
        break;
    }
}

void weft_pipe_recv_done(struct weft_pipe *p, struct weft_request *r, int err)
{
    weft_req_queue_remove(&p->inflight, r);
    req_complete(r, err);
}

void weft_pipe_send_done(struct weft_pipe *p, struct weft_request *s, int err)
{
    weft_req_queue_remove(&p->inflight, s);
    req_complete(s, err);
}

/* ---------------------------------------------------------------- breaking */

void weft_pipe_break(struct weft_pipe *p, int err)
{
    struct weft_request *r;

    if (p->broken)
        return;
    p->broken = err ? err : WEFT_ERR_TRANSPORT;
    WEFT_WARN(p->comm->rank, "pipe to peer %d over %s closed: %s", p->peer, pipe_tp_name(p),
              weft_strerror(p->broken));
    if (p->tp && p->tp->abort_pipe)
        p->tp->abort_pipe(p);
    /* Device paths let go of this pipe's requests before they fail. */
    if (p->comm->stage_state)
        weft_stage_abort_pipe(p);
    if (p->comm->cuda)
        weft_cuda_ipc_abort_pipe(p);

    while ((r = weft_req_queue_pop(&p->inflight)) != NULL)
        req_complete(r, p->broken);
    while (p->out_head) {
        struct weft_outbound *o = p->out_head;
        p->out_head = o->next;
        p->comm->out_queued--;
        if (o->req)
            req_complete(o->req, p->broken);
        free(o->payload);
        free(o);
    }
    p->out_tail = NULL;
    for (size_t i = 0; i < p->lane_buckets; i++)
        for (struct weft_lane *l = p->lanes[i]; l; l = l->hash_next)
            while ((r = weft_req_queue_pop(&l->posted)) != NULL)
                req_complete(r, p->broken);
}
