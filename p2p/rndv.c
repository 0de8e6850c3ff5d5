/*
 * The rendezvous path table (rndv.h) and its first two paths: mover and
 * native. The staged path is p2p/stage.c.
 */
#include "rndv.h"

#include <string.h>

#include "context.h"
#include "log.h"

const struct weft_rndv_path *const weft_rndv_paths[] = {
    &weft_rndv_mover,
    &weft_rndv_native,
    &weft_rndv_staged,
};
const int weft_rndv_npaths = (int)(sizeof(weft_rndv_paths) / sizeof(weft_rndv_paths[0]));

unsigned weft_rndv_id(const struct weft_rndv_path *path)
{
    for (int i = 0; i < weft_rndv_npaths; i++)
        if (weft_rndv_paths[i] == path)
            return (unsigned)i + 1;
    return 0;
}

void weft_rndv_rts_fill(const struct weft_peer_pipe *p, const struct weft_request *s, struct weft_wire_hdr *rts)
{
    for (int i = 0; i < weft_rndv_npaths; i++)
        if (weft_rndv_paths[i]->rts_fill)
            weft_rndv_paths[i]->rts_fill(p, s, rts);
}

void weft_rndv_src(const struct weft_wire_hdr *rts, struct weft_tp_src *src)
{
    src->addr = rts->addr;
    src->mem_kind = (rts->flags & WEFT_WIRE_F_DEVICE) ? 2 /* WEFT_MEM_DEVICE */ : 0 /* WEFT_MEM_HOST */;
    src->device = (rts->flags & WEFT_WIRE_F_DEVICE) ? (int)rts->device : -1;
    src->niov = (rts->flags & WEFT_WIRE_F_IOV) ? rts->aux : 0;
}

void weft_rndv_send_cts(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *rts,
                        const struct weft_rndv_path *path, const void *key, size_t keylen)
{
    struct weft_wire_hdr h;
    memset(&h, 0, sizeof(h));
    h.type = WEFT_WIRE_CTS;
    h.tag = rts->tag;
    h.seq = rts->seq;
    h.bytes = rts->bytes;
    h.sreq = rts->sreq;
    h.rreq = weft_req_id(r);
    h.aux = weft_rndv_id(path);
    weft_pipe_send_ctrl(p, &h, key, keylen);
}

void weft_rndv_send_fin(struct weft_peer_pipe *p, const struct weft_wire_hdr *rts, int status)
{
    struct weft_wire_hdr h;
    memset(&h, 0, sizeof(h));
    h.type = WEFT_WIRE_FIN;
    h.tag = rts->tag;
    h.seq = rts->seq;
    h.bytes = rts->bytes;
    h.sreq = rts->sreq;
    h.status = status;
    weft_pipe_send_ctrl(p, &h, NULL, 0);
}

static unsigned mem_bit(int mem_kind)
{
    return weft_mem_is_device(mem_kind) ? WEFT_TP_MEM_DEVICE : WEFT_TP_MEM_HOST;
}

/* ------------------------------------------------------------- native */

/* The carrier moves the data itself when its rendezvous reads the sender's
 * kind of memory and writes the receiver's. */
static int native_applies(const struct weft_peer_pipe *p, const struct weft_request *r, const struct weft_wire_hdr *rts)
{
    const struct weft_transport *tp = p->carrier.tp;
    unsigned need = mem_bit(r->xfer.mem_kind) | ((rts->flags & WEFT_WIRE_F_DEVICE) ? WEFT_TP_MEM_DEVICE : WEFT_TP_MEM_HOST);
    unsigned have = tp->rndv_mem ? tp->rndv_mem(p->carrier.ctx, p->peer) : 0;
    if (((rts->flags & WEFT_WIRE_F_IOV) || r->xfer.niov) && !tp->rndv_vectors)
        return 0;   /* a vectored message on a carrier that moves one buffer only */
    return (need & ~have) == 0;
}

/* Pull when the carrier can (FIN), else expect its push (CTS with its key). */
static int native_recv_start(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *rts)
{
    const struct weft_transport *tp = p->carrier.tp;
    struct weft_tp_src src;
    unsigned char key[WEFT_TP_KEY_MAX];
    size_t keylen = 0;
    int rc = WEFT_EAGAIN;

    weft_rndv_src(rts, &src);
    r->xfer.crossing = p->rndv_sends > 0;
    if (tp->rndv_get)
        rc = tp->rndv_get(p->carrier.ctx, p->peer, &r->xfer, &src);
    if (rc != WEFT_EAGAIN) {
        weft_rndv_send_fin(p, rts, rc);
        weft_pipe_complete(r, rc);
        return WEFT_SUCCESS;
    }
    weft_pipe_activate(p, r);
    rc = tp->rndv_expect(p->carrier.ctx, p->peer, &r->xfer, &src, key, &keylen);
    if (rc != WEFT_SUCCESS || keylen > sizeof(key)) {
        weft_set_error(p->p2p->core, rc != WEFT_SUCCESS ? rc : WEFT_ERR_INTERNAL,
                       "recv from peer %d tag %d: %s could not expect %llu bytes", p->peer, r->tag,
                       weft_pipe_tp_name(p), (unsigned long long)rts->bytes);
        weft_pipe_break(p, rc != WEFT_SUCCESS ? rc : WEFT_ERR_INTERNAL);
        return WEFT_SUCCESS;
    }
    weft_rndv_send_cts(p, r, rts, &weft_rndv_native, key, keylen);
    return WEFT_SUCCESS;
}

static void native_send_start(struct weft_peer_pipe *p, struct weft_request *s, const struct weft_wire_hdr *cts,
                              const void *key, size_t keylen)
{
    (void)cts;
    int rc = p->carrier.tp->rndv_push(p->carrier.ctx, p->peer, &s->xfer, key, keylen);
    if (rc != WEFT_SUCCESS) {
        weft_set_error(p->p2p->core, rc, "send to peer %d tag %d: %s could not push %zu bytes", p->peer, s->tag,
                       weft_pipe_tp_name(p), s->bytes);
        weft_pipe_break(p, rc);
    }
}

static void native_xfer_done(struct weft_peer_pipe *p, struct weft_request *r, int err)
{
    weft_pipe_finish_inflight(p, r, err);
}

const struct weft_rndv_path weft_rndv_native = {
    .name = "native",
    .applies = native_applies,
    .recv_start = native_recv_start,
    .send_start = native_send_start,
    .xfer_done = native_xfer_done,
};

/* -------------------------------------------------------------- mover */

/* Device to device between ranks of one node whose carrier is node-local
 * (shm): a mover (cuda_ipc) that reaches the peer copies GPU to GPU. */
static int mover_applies(const struct weft_peer_pipe *p, const struct weft_request *r, const struct weft_wire_hdr *rts)
{
    const struct weft_transport *mv = p->mover.tp;
    if (mv == NULL || !p->p2p->core->cuda || p->carrier.tp->scope != WEFT_TP_SCOPE_NODE)
        return 0;
    if (!(rts->flags & WEFT_WIRE_F_DEVICE) || !weft_mem_is_device(r->xfer.mem_kind) ||
        (rts->flags & WEFT_WIRE_F_IOV) || r->xfer.niov)
        return 0;
    return mv->rndv_mem && (mv->rndv_mem(p->mover.ctx, p->peer) & WEFT_TP_MEM_DEVICE);
}

static int mover_recv_start(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *rts)
{
    struct weft_tp_src src;
    unsigned char key[WEFT_TP_KEY_MAX];
    size_t keylen = 0;

    weft_rndv_src(rts, &src);
    int rc = p->mover.tp->rndv_expect(p->mover.ctx, p->peer, &r->xfer, &src, key, &keylen);
    if (rc != WEFT_SUCCESS || keylen > sizeof(key)) {
        WEFT_TRACE(p->p2p->rank, "recv from peer %d tag %d: %s declined the transfer (%s), trying the next path",
                   p->peer, r->tag, p->mover.tp->name, weft_err_str(rc));
        return WEFT_EAGAIN;
    }
    /* The sender's pipe sends FIN (TO_RECV) once the mover is done. */
    weft_pipe_activate(p, r);
    weft_rndv_send_cts(p, r, rts, &weft_rndv_mover, key, keylen);
    return WEFT_SUCCESS;
}

/* Sender: tells the receiver how its mover transfer ended, and completes. */
static void mover_fin(struct weft_peer_pipe *p, struct weft_request *s, int status)
{
    struct weft_wire_hdr h;
    memset(&h, 0, sizeof(h));
    h.type = WEFT_WIRE_FIN;
    h.flags = WEFT_WIRE_F_TO_RECV;
    if (status == WEFT_SUCCESS && s->xfer.signal_done)
        h.flags |= WEFT_WIRE_F_SIGNALED;   /* its GPU wrote the receive's signal slot after the copy */
    h.status = status;
    h.tag = s->tag;
    h.bytes = s->bytes;
    h.sreq = weft_req_id(s);
    h.rreq = s->peer_req;
    weft_pipe_send_ctrl(p, &h, NULL, 0);
    weft_pipe_finish_inflight(p, s, status);
}

/* Sender: the mover cannot take s now (its rndv_push said WEFT_EAGAIN:
 * cuda_ipc would have to open the receiver's buffer, a call that may wait
 * for the device, on one of weft's threads while a stream waits on weft).
 * The message is announced again (RTS with REDO, naming the receive) and
 * the receiver picks the paths after the mover: the data is staged. s
 * waits for that CTS as after its first RTS. */
static void mover_redo(struct weft_peer_pipe *p, struct weft_request *s)
{
    struct weft_wire_hdr h;
    memset(&h, 0, sizeof(h));
    h.type = WEFT_WIRE_RTS;
    h.flags = WEFT_WIRE_F_REDO;
    h.tag = s->tag;
    h.seq = s->seq;
    h.bytes = s->bytes;
    h.sreq = weft_req_id(s);
    h.rreq = s->peer_req;
    h.addr = (uint64_t)(uintptr_t)s->xfer.buf;
    if (weft_mem_is_device(s->xfer.mem_kind)) {
        h.flags |= WEFT_WIRE_F_DEVICE;
        h.device = (uint16_t)(s->xfer.device >= 0 ? s->xfer.device : 0);
    }
    weft_rndv_rts_fill(p, s, &h);
    s->state = WEFT_REQ_POSTED;
    s->path = 0;
    s->xfer.signal_done = 0;
    WEFT_TRACE(p->p2p->rank, "send to peer %d tag %d: %s cannot take %zu bytes now: announced again for another "
               "path", p->peer, s->tag, p->mover.tp->name, s->bytes);
    weft_pipe_send_ctrl(p, &h, NULL, 0);
}

static void mover_send_start(struct weft_peer_pipe *p, struct weft_request *s, const struct weft_wire_hdr *cts,
                             const void *key, size_t keylen)
{
    (void)cts;
    if (p->mover.tp == NULL) {
        weft_set_error(p->p2p->core, WEFT_ERR_TRANSPORT, "send to peer %d tag %d: CTS asks for a mover, which is "
                       "not set up here", p->peer, s->tag);
        mover_fin(p, s, WEFT_ERR_TRANSPORT);
        return;
    }
    int rc = p->mover.tp->rndv_push(p->mover.ctx, p->peer, &s->xfer, key, keylen);
    if (rc == WEFT_EAGAIN)
        mover_redo(p, s);
    else if (rc != WEFT_SUCCESS)
        mover_fin(p, s, rc);   /* the mover recorded why; the receiver must not hang */
}

static void mover_xfer_done(struct weft_peer_pipe *p, struct weft_request *r, int err)
{
    mover_fin(p, r, err);
}

const struct weft_rndv_path weft_rndv_mover = {
    .name = "mover",
    .applies = mover_applies,
    .recv_start = mover_recv_start,
    .send_start = mover_send_start,
    .xfer_done = mover_xfer_done,
};
