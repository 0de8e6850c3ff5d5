/*
 * InfiniBand / RoCE verbs transport: ranks on different nodes with an RDMA NIC.
 *
 * Per peer: WEFT_IB_QPS_PER_PEER reliable-connected QPs (QP 0 carries every
 * control frame, so frames arrive in the order they were sent; all QPs carry
 * rendezvous data). Set-up exchanges QPN/PSN/LID/GID/MTU for every pair in
 * one MPI_Alltoall of fixed-size records.
 *
 * Frames (control messages) are SENDs from registered send buffers (inline
 * when they fit) into receive buffers posted ahead of time:
 *
 *     struct ib_frame_hdr   8 bytes  type (CTRL / CREDIT), QP count, payload length
 *     uint16_t cr[16]      32 bytes  receive credits returned, per QP
 *     struct weft_ctrl     56 bytes  CTRL only: the pipe's header
 *     payload                        CTRL only: EAGER data, or the CTS extension
 *
 * Credits. Every SEND and every RDMA_WRITE_WITH_IMM consumes one receive WR
 * at the peer, so the sender keeps, per QP, the number of receive WRs the
 * peer has posted and not yet seen consumed; it posts such a WR only with a
 * credit in hand. The receiver reposts each buffer once consumed and owes the
 * credit back: piggybacked on its next frame, or by an explicit CREDIT frame
 * once IB_CREDIT_THRESHOLD(D) are owed on a QP (and during drain, whatever is
 * owed for real traffic). Everything but a CREDIT frame leaves the last credit
 * of QP 0 unused, so a CREDIT frame can always go: credit return never
 * deadlocks. A CREDIT frame needs >= 2 received frames to trigger another, so
 * two idle ranks never ping-pong credit frames forever.
 *
 * Rendezvous (rndv_get is NULL: the receiver always answers CTS). The CTS
 * frame carries the receive buffer's address, length, rkey (registration
 * cache) and a slot id naming the request. The sender registers its buffer,
 * cuts it into writes (ib_chunk.h: none larger than min(max_msg_sz of both
 * ports, WEFT_IB_CHUNK of both ranks, 1 GiB), none below 32 bytes), stripes
 * them round-robin over the QPs, and makes the last write on each QP used an
 * RDMA_WRITE_WITH_IMM whose immediate is the slot id. RC orders writes on a
 * QP, so when the receiver holds the immediates of all QPs used (both sides
 * compute that count) every byte is in place.
 *
 * Send queues: each QP accepts at most sq_depth outstanding WRs (all are
 * signaled, so each completion frees exactly one slot). A frame is taken by
 * ctrl_send only when it can be posted at once (else WEFT_EAGAIN: it waits
 * in the pipe, whose request stays incomplete, so its waiter progresses);
 * writes that do not fit, or lack a credit, wait in the QP's FIFO and are
 * posted as room and credits come back. The CQs are sized for every WR that
 * can be outstanding, so they cannot overrun.
 *
 * Errors: a completion with any status but success fails the pipe of that
 * peer only (the error names peer, host, port, operation and the verbs
 * status); its QPs are moved to the error state so nothing more lands in
 * buffers the pipe gives back to the user, and the flush completions that
 * follow are absorbed quietly. Memory a posted WR points at is released only
 * at that WR's completion (or when the QPs are destroyed).
 *
 * Set-up and teardown are in p2p/ib_conn.c, the shared structures in
 * p2p/ib.h, port choice in p2p/ib_dev.c, the chunk layout in p2p/ib_chunk.h.
 *
 * Progress: hardware moves data on its own, but the emulated device of the
 * tests moves a process's work only while it polls its CQs, and completions
 * must be reaped anyway: progress always polls. There is no doorbell to
 * sleep on (sleep is NULL): waiters nap between polls (src/progress.c).
 */
#ifdef WEFT_HAVE_VERBS_HEADERS

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib.h"
#include "ib_chunk.h"
#include "log.h"
#include "transport.h"

void weft_ib_slot_release(struct ib_peer *pe, int i)
{
    struct ib_slot *s = &pe->slots[i];
    if (s->reg)
        weft_regcache_release(pe->st->c->regcache, s->reg);
    s->reg = NULL;
    s->req = NULL;
    s->next_free = pe->slot_free;
    pe->slot_free = i;
}

/* ------------------------------------------------------------ errors */

static const char *wr_what(const struct ib_wr *wr)
{
    if (wr == NULL)
        return "receive";
    if (wr->kind == IB_WR_FRAME)
        return "SEND (control frame)";
    return wr->imm ? "RDMA WRITE WITH IMM" : "RDMA WRITE";
}

/* A completion failed: only this peer's pipe breaks (abort_pipe follows). */
static void peer_fail(struct ib_peer *pe, const struct ib_wr *wr, const struct ibv_wc *wc)
{
    struct weft_comm *c = pe->st->c;
    if (pe->dead)
        return;
    weft_set_error(c, WEFT_ERR_TRANSPORT,
                   "ib: peer %d (host %s, %s port %u): %s work request failed: %s (status %d, vendor error 0x%x)",
                   pe->rank, peer_host(pe), c->cards[pe->rank].ib_dev, c->cards[pe->rank].ib_port, wr_what(wr),
                   pe->st->ibv.wc_status_str(wc->status), (int)wc->status, wc->vendor_err);
    weft_pipe_break(pe->pipe, WEFT_ERR_TRANSPORT);
}

/* A local failure (post, protocol): break the pipe with a message. */
static void peer_fail_local(struct ib_peer *pe, int err, const char *what, int detail)
{
    struct weft_comm *c = pe->st->c;
    if (pe->dead)
        return;
    weft_set_error(c, err, "ib: peer %d (host %s): %s%s%s", pe->rank, peer_host(pe), what,
                   detail ? ": " : "", detail ? strerror(detail) : "");
    weft_pipe_break(pe->pipe, err);
}

/* ------------------------------------------------------------ posting */

static struct ib_sbuf *sbuf_get(struct ib_peer *pe)
{
    struct ib_sbuf *sb = pe->sfree;
    if (sb) {
        pe->sfree = sb->next_free;
        pe->nsfree--;
    }
    return sb;
}

static void sbuf_put(struct ib_peer *pe, struct ib_sbuf *sb)
{
    sb->next_free = pe->sfree;
    pe->sfree = sb;
    pe->nsfree++;
}

/* Writes the credits owed on every QP into a frame about to be posted.
 * Returns the values so they can be taken off `owed` once posted. */
static void fill_credits(struct ib_peer *pe, unsigned char *frame, uint16_t *cr)
{
    for (unsigned q = 0; q < IB_MAX_QPS; q++) {
        int o = q < pe->nqp ? pe->qps[q].owed : 0;
        cr[q] = (uint16_t)(o > 0xffff ? 0xffff : o);
    }
    memcpy(frame + IB_CR_OFF, cr, IB_MAX_QPS * sizeof(uint16_t));
    ((struct ib_frame_hdr *)(void *)frame)->ncr = (uint8_t)pe->nqp;
}

static void credits_sent(struct ib_peer *pe, const uint16_t *cr)
{
    for (unsigned q = 0; q < pe->nqp; q++) {
        struct ib_qp *qp = &pe->qps[q];
        qp->owed -= cr[q];
        if (qp->owed_traffic > qp->owed)
            qp->owed_traffic = qp->owed;
    }
}

/* Posts one WR now. 0, or the errno of ibv_post_send. */
static int post_one(struct ib_qp *qp, struct ib_wr *w)
{
    struct ib_peer *pe = qp->pe;
    struct ibv_send_wr wr, *bad = NULL;
    struct ibv_sge sge;
    uint16_t cr[IB_MAX_QPS];
    int consumes = 1, rc;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = (uint64_t)(uintptr_t)w;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (w->kind == IB_WR_FRAME) {
        fill_credits(pe, w->sb->mem, cr);
        sge.addr = (uintptr_t)w->sb->mem;
        sge.length = w->len;
        sge.lkey = pe->mr->lkey;
        wr.opcode = IBV_WR_SEND;
        if (w->len <= qp->max_inline)
            wr.send_flags |= IBV_SEND_INLINE;
    } else {
        sge.addr = w->laddr;
        sge.length = w->len;
        sge.lkey = w->push->reg->lkey;
        wr.opcode = w->imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
        wr.wr.rdma.remote_addr = w->raddr;
        wr.wr.rdma.rkey = w->push->rkey;
        if (w->imm)
            wr.imm_data = htonl(w->push->slot);
        consumes = w->imm;
    }
    rc = ibv_post_send(qp->qp, &wr, &bad);
    if (rc != 0)
        return rc;
    qp->sq_out++;
    if (consumes)
        qp->credits--;
    if (w->kind == IB_WR_FRAME)
        credits_sent(pe, cr);
    return 0;
}

/* Called after posting from an entry point (ctrl_send, rndv_push, the end
 * of progress): a poll for zero completions. Hardware starts posted work at
 * the doorbell, on its own; the emulated device of the tests
 * (tests/emu/verbs) executes a process's work only inside ibv_poll_cq, so
 * without this the last frames a rank posts before it stops calling weft
 * (say, to enter an MPI barrier) would never leave. Polling for zero
 * entries reaps nothing, so it cannot re-enter the pipe; on hardware it is
 * a cheap no-op. */
static void doorbell(struct ib_state *st)
{
    struct ibv_wc none;
    if (st->scq)
        (void)ibv_poll_cq(st->scq, 0, &none);
}

/* Credits a WR must find before it may be posted: none for a plain write;
 * one for a CREDIT frame; on QP 0 everything else leaves the last credit
 * for CREDIT frames. */
static int credits_needed(const struct ib_qp *qp, const struct ib_wr *w)
{
    if (w->kind == IB_WR_WRITE && !w->imm)
        return 0;
    if (w->kind == IB_WR_FRAME && w->credit)
        return 1;
    return qp->idx == 0 ? 2 : 1;
}

static void push_maybe_finish(struct ib_push *ps);

/* Posts what waits in qp's FIFO while room and credits last. Returns the
 * number posted. */
static int qp_kick(struct ib_qp *qp)
{
    struct ib_peer *pe = qp->pe;
    int n = 0;

    while (qp->head && !pe->dead && qp->sq_out < qp->sq_depth) {
        struct ib_wr *w = qp->head;
        if (qp->credits < credits_needed(qp, w))
            break;
        int rc = post_one(qp, w);
        if (rc == ENOMEM)
            break;   /* the device's queue is fuller than we count: wait for completions */
        if (rc != 0) {
            peer_fail_local(pe, WEFT_ERR_TRANSPORT, "ibv_post_send failed", rc);
            break;
        }
        qp->head = w->next;
        if (qp->head == NULL)
            qp->tail = NULL;
        w->next = NULL;
        if (w->kind == IB_WR_WRITE) {
            w->push->unposted--;
            w->push->outstanding++;
        }
        n++;
    }
    return n;
}

static void qp_append(struct ib_qp *qp, struct ib_wr *w)
{
    w->qp = qp;
    w->next = NULL;
    if (qp->tail)
        qp->tail->next = w;
    else
        qp->head = w;
    qp->tail = w;
}

/* Sends a CREDIT frame now if one can go (bypassing the FIFO: credits are
 * increments, their order against other frames does not matter). */
static int send_credit_frame(struct ib_peer *pe)
{
    struct ib_qp *qp = &pe->qps[0];
    struct ib_sbuf *sb;
    int rc;

    if (qp->sq_out >= qp->sq_depth || qp->credits < 1 || pe->sfree == NULL)
        return 0;
    sb = sbuf_get(pe);
    memset(sb->mem, 0, IB_CREDIT_FRAME_BYTES);
    ((struct ib_frame_hdr *)(void *)sb->mem)->type = IB_FRAME_CREDIT;
    sb->wr.qp = qp;
    sb->wr.next = NULL;
    sb->wr.credit = 1;
    sb->wr.len = IB_CREDIT_FRAME_BYTES;
    rc = post_one(qp, &sb->wr);
    if (rc != 0) {
        sbuf_put(pe, sb);
        if (rc != ENOMEM)
            peer_fail_local(pe, WEFT_ERR_TRANSPORT, "ibv_post_send of a credit frame failed", rc);
        return 0;
    }
    return 1;
}

/* Whether pe should get an explicit CREDIT frame now. */
static int credit_frame_due(const struct ib_peer *pe)
{
    const int t = ib_credit_threshold(pe->st->recv_posted);
    for (unsigned q = 0; q < pe->nqp; q++) {
        if (pe->qps[q].owed >= t)
            return 1;
        if (pe->st->drain && pe->qps[q].owed_traffic > 0)
            return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ slots */

static int slot_of(const struct ib_peer *pe, const struct weft_request *r)
{
    uint64_t v = r->tp_aux[0];
    if (v == 0 || v > (uint64_t)pe->nslots)
        return -1;
    return pe->slots[v - 1].req == r ? (int)(v - 1) : -1;
}

/* The receive r gets a slot and a registration (once; later calls find it). */
static int slot_prepare(struct ib_peer *pe, struct weft_request *r)
{
    struct weft_comm *c = pe->st->c;
    struct weft_reg *reg = NULL;
    char why[256] = "";
    int i, rc;

    if (slot_of(pe, r) >= 0)
        return WEFT_SUCCESS;
    if (pe->slot_free < 0) {
        int n = pe->nslots ? pe->nslots * 2 : 16;
        struct ib_slot *ns = realloc(pe->slots, (size_t)n * sizeof(*ns));
        if (ns == NULL)
            return weft_set_error(c, WEFT_ERR_NO_MEMORY, "ib: peer %d: no memory for receive slots", pe->rank);
        for (i = n - 1; i >= pe->nslots; i--) {
            memset(&ns[i], 0, sizeof(ns[i]));
            ns[i].next_free = pe->slot_free;
            pe->slot_free = i;
        }
        pe->slots = ns;
        pe->nslots = n;
    }
    rc = ib_reg_acquire(pe->st, r->buf, r->msg_bytes, r->mem_kind, &reg, why, sizeof(why));
    if (rc != WEFT_SUCCESS)
        return weft_set_error(c, rc, "ib: recv from peer %d tag %d: registering the %zu-byte buffer failed: %s",
                              pe->rank, r->tag, r->msg_bytes, why);
    i = pe->slot_free;
    pe->slot_free = pe->slots[i].next_free;
    pe->slots[i].req = r;
    pe->slots[i].reg = reg;
    pe->slots[i].imm_got = 0;
    pe->slots[i].imm_expected = ib_chunk_qps_used(r->msg_bytes, pe->chunk, pe->nqp);
    r->tp_aux[0] = (uint64_t)i + 1;
    return WEFT_SUCCESS;
}

/* ------------------------------------------------------------ data path */

static size_t ib_eager_limit(const struct weft_comm *c)
{
    return c->cfg.ib_eager_limit;
}

static int ib_ctrl_send(struct weft_pipe *p, const struct weft_ctrl *m, const void *payload, size_t len)
{
    struct ib_peer *pe = p->tp_peer;
    struct ib_cts_ext ext;
    struct ib_frame_hdr *h;
    struct ib_sbuf *sb;
    struct ib_qp *qp0;
    size_t extra = len;
    int rc;
    /* A CTS this transport answers with RDMA writes; the device paths'
     * CTS (staged chunks, CUDA IPC) carry their own payload through. */
    int is_cts = m->type == WEFT_CTRL_CTS && m->status == WEFT_SUCCESS &&
                 !(m->flags & (WEFT_CTRL_F_STAGED | WEFT_CTRL_F_IPC));

    if (pe == NULL)
        return weft_set_error(p->comm, WEFT_ERR_TRANSPORT, "ib: peer %d: not connected", p->peer);
    if (pe->dead)
        return WEFT_ERR_TRANSPORT;
    qp0 = &pe->qps[0];
    if (is_cts)
        extra = sizeof(ext);
    if (IB_PAYLOAD_OFF + extra > pe->st->frame_max || IB_PAYLOAD_OFF + extra > pe->peer_frame_max)
        return weft_set_error(p->comm, WEFT_ERR_INTERNAL, "ib: peer %d: a %zu-byte control payload exceeds the "
                              "frame size", p->peer, extra);
    /* A frame is accepted only when it can be posted now: a frame kept
     * here waiting for a credit would complete the user's eager send while
     * nothing moves it until the next weft call. Declined, it waits in the
     * pipe, its send request stays incomplete, and the waiter progresses.
     * One send buffer and the last credit stay free for CREDIT frames. */
    if (pe->nsfree < 2 || qp0->sq_out >= qp0->sq_depth || qp0->credits < 2)
        return WEFT_EAGAIN;
    if (is_cts) {
        struct weft_request *r = weft_req_from_id(m->rreq);
        rc = slot_prepare(pe, r);
        if (rc != WEFT_SUCCESS)
            return rc;
        int i = slot_of(pe, r);
        ext.addr = (uint64_t)(uintptr_t)r->buf;
        ext.len = r->msg_bytes;
        ext.rkey = pe->slots[i].reg->rkey;
        ext.slot = (uint32_t)i;
        payload = &ext;
    }
    sb = sbuf_get(pe);
    h = (struct ib_frame_hdr *)(void *)sb->mem;
    memset(h, 0, sizeof(*h));
    h->type = IB_FRAME_CTRL;
    h->flags = is_cts ? IB_FRAME_F_CTS_EXT : 0;
    h->len = (uint32_t)extra;
    memcpy(sb->mem + IB_CTRL_OFF, m, sizeof(*m));
    if (extra)
        memcpy(sb->mem + IB_PAYLOAD_OFF, payload, extra);
    sb->wr.qp = qp0;
    sb->wr.next = NULL;
    sb->wr.credit = 0;
    sb->wr.len = (uint32_t)(IB_PAYLOAD_OFF + extra);
    rc = post_one(qp0, &sb->wr);
    if (rc != 0) {
        sbuf_put(pe, sb);
        if (rc == ENOMEM)
            return WEFT_EAGAIN;   /* the device's queue is fuller than we count */
        return weft_set_error(p->comm, WEFT_ERR_TRANSPORT, "ib: peer %d (host %s): ibv_post_send failed: %s",
                              p->peer, peer_host(pe), strerror(rc));
    }
    doorbell(pe->st);
    return WEFT_SUCCESS;
}

static int ib_rndv_expect(struct weft_pipe *p, struct weft_request *r)
{
    struct ib_peer *pe = p->tp_peer;
    if (pe == NULL || pe->dead)
        return weft_set_error(p->comm, WEFT_ERR_TRANSPORT, "ib: peer %d: not connected", p->peer);
    /* Usually done already: the CTS that carries the rkey went out first. */
    return slot_prepare(pe, r);
}

static void push_unlink(struct ib_push *ps)
{
    struct ib_peer *pe = ps->pe;
    if (ps->prev)
        ps->prev->next = ps->next;
    else
        pe->push_head = ps->next;
    if (ps->next)
        ps->next->prev = ps->prev;
    else
        pe->push_tail = ps->prev;
    ps->prev = ps->next = NULL;
}

void weft_ib_push_free(struct ib_push *ps)
{
    push_unlink(ps);
    if (ps->reg)
        weft_regcache_release(ps->pe->st->c->regcache, ps->reg);
    free(ps);
}

/* Every WR of the push has completed (or was never posted): done. */
static void push_maybe_finish(struct ib_push *ps)
{
    struct ib_peer *pe = ps->pe;
    struct weft_request *s = ps->req;

    if (ps->outstanding || ps->unposted)
        return;
    ps->req = NULL;
    weft_ib_push_free(ps);
    if (s && !pe->dead)
        weft_pipe_send_done(pe->pipe, s, WEFT_SUCCESS);
}

static int ib_rndv_push(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts)
{
    struct ib_peer *pe = p->tp_peer;
    struct weft_comm *c = p->comm;
    struct weft_reg *reg = NULL;
    struct ib_push *ps;
    char why[256] = "";
    uint64_t n;
    unsigned start;
    int rc;

    if (pe == NULL || pe->dead)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "ib: peer %d: not connected", p->peer);
    if (pe->cts_m != cts)
        return weft_set_error(c, WEFT_ERR_INTERNAL, "ib: peer %d: push without the CTS that describes its target",
                              p->peer);
    if (pe->cts_ext.len != s->bytes)
        return weft_set_error(c, WEFT_ERR_INTERNAL, "ib: peer %d: CTS expects %llu bytes, the send has %zu",
                              p->peer, (unsigned long long)pe->cts_ext.len, s->bytes);
    n = ib_chunk_count(s->bytes, pe->chunk);
    ps = calloc(1, sizeof(*ps) + (size_t)n * sizeof(ps->wrs[0]));
    if (ps == NULL)
        return weft_set_error(c, WEFT_ERR_NO_MEMORY, "ib: send to peer %d: no memory for %llu write requests",
                              p->peer, (unsigned long long)n);
    rc = ib_reg_acquire(pe->st, s->buf, s->bytes, s->mem_kind, &reg, why, sizeof(why));
    if (rc != WEFT_SUCCESS) {
        free(ps);
        return weft_set_error(c, rc, "ib: send to peer %d tag %d: registering the %zu-byte buffer failed: %s",
                              p->peer, s->tag, s->bytes, why);
    }
    ps->pe = pe;
    ps->req = s;
    ps->reg = reg;
    ps->rkey = pe->cts_ext.rkey;
    ps->slot = pe->cts_ext.slot;
    ps->nwr = n;
    ps->unposted = n;
    ps->prev = pe->push_tail;
    if (pe->push_tail)
        pe->push_tail->next = ps;
    else
        pe->push_head = ps;
    pe->push_tail = ps;

    /* Round-robin over the QPs, starting one further per message so that
     * small multi-chunk messages spread too. */
    start = pe->push_rr++ % pe->nqp;
    for (uint64_t k = 0; k < n; k++) {
        struct ib_wr *w = &ps->wrs[k];
        uint64_t off, len;
        ib_chunk_at(s->bytes, pe->chunk, k, &off, &len);
        w->kind = IB_WR_WRITE;
        w->push = ps;
        w->laddr = (uint64_t)(uintptr_t)s->buf + off;
        w->raddr = pe->cts_ext.addr + off;
        w->len = (uint32_t)len;
        w->imm = k + pe->nqp >= n;
        qp_append(&pe->qps[(start + k) % pe->nqp], w);
    }
    for (unsigned q = 0; q < pe->nqp && !pe->dead; q++)
        qp_kick(&pe->qps[q]);
    doorbell(pe->st);
    return WEFT_SUCCESS;
}

/* ------------------------------------------------------------ completions */

static void on_send_wc(struct ib_state *st, const struct ibv_wc *wc)
{
    struct ib_wr *w = (struct ib_wr *)(uintptr_t)wc->wr_id;
    struct ib_qp *qp = w->qp;
    struct ib_peer *pe = qp->pe;

    (void)st;
    qp->sq_out--;
    if (wc->status != IBV_WC_SUCCESS)
        peer_fail(pe, w, wc);
    if (w->kind == IB_WR_FRAME) {
        sbuf_put(pe, w->sb);
    } else {
        struct ib_push *ps = w->push;
        ps->outstanding--;
        if (wc->status != IBV_WC_SUCCESS)
            ps->failed = 1;
        push_maybe_finish(ps);
    }
}

static int poll_send_cq(struct ib_state *st)
{
    struct ibv_wc wc[IB_CQ_BATCH];
    int total = 0;

    for (int pass = 0; pass < IB_CQ_PASSES; pass++) {
        int n = ibv_poll_cq(st->scq, IB_CQ_BATCH, wc);
        if (n < 0) {
            /* A broken CQ cannot be recovered: every peer on it fails. */
            for (int i = 0; i < st->npeers; i++)
                if (!st->peers[i].dead)
                    peer_fail_local(&st->peers[i], WEFT_ERR_TRANSPORT, "ibv_poll_cq on the send CQ failed", 0);
            return total;
        }
        for (int i = 0; i < n; i++)
            on_send_wc(st, &wc[i]);
        total += n;
        if (n < IB_CQ_BATCH)
            break;
    }
    return total;
}

/* A frame arrived on QP 0. Returns 1 for a CREDIT frame. */
static int on_frame(struct ib_peer *pe, struct ib_rbuf *rb, uint32_t bytes)
{
    struct ib_frame_hdr h;
    uint16_t cr[IB_MAX_QPS];
    struct weft_ctrl m;
    const unsigned char *payload;

    if (bytes < IB_CREDIT_FRAME_BYTES) {
        peer_fail_local(pe, WEFT_ERR_INTERNAL, "runt frame (protocol error)", 0);
        return 0;
    }
    memcpy(&h, rb->mem, sizeof(h));
    memcpy(cr, rb->mem + IB_CR_OFF, sizeof(cr));
    for (unsigned q = 0; q < pe->nqp && q < h.ncr; q++)
        pe->qps[q].credits += cr[q];
    if (h.type == IB_FRAME_CREDIT)
        return 1;
    if (h.type != IB_FRAME_CTRL || bytes < IB_PAYLOAD_OFF || bytes - IB_PAYLOAD_OFF != h.len) {
        peer_fail_local(pe, WEFT_ERR_INTERNAL, "malformed frame (protocol error)", 0);
        return 0;
    }
    memcpy(&m, rb->mem + IB_CTRL_OFF, sizeof(m));
    payload = rb->mem + IB_PAYLOAD_OFF;
    if (h.flags & IB_FRAME_F_CTS_EXT) {
        if (m.type != WEFT_CTRL_CTS || h.len != sizeof(pe->cts_ext)) {
            peer_fail_local(pe, WEFT_ERR_INTERNAL, "CTS frame without its buffer description (protocol error)", 0);
            return 0;
        }
        memcpy(&pe->cts_ext, payload, sizeof(pe->cts_ext));
        pe->cts_m = &m;
        weft_pipe_on_ctrl(pe->pipe, &m, NULL, 0);
        pe->cts_m = NULL;
        return 0;
    }
    /* EAGER data, or the payload of another control message (device paths). */
    weft_pipe_on_ctrl(pe->pipe, &m, h.len ? payload : NULL, h.len);
    return 0;
}

/* The immediate of the last write on one QP arrived. */
static void on_imm(struct ib_peer *pe, uint32_t slot)
{
    struct ib_slot *s;
    struct weft_request *r;

    if (slot >= (uint32_t)pe->nslots || pe->slots[slot].req == NULL) {
        peer_fail_local(pe, WEFT_ERR_INTERNAL, "RDMA write names an unknown receive (protocol error)", 0);
        return;
    }
    s = &pe->slots[slot];
    if (++s->imm_got < s->imm_expected)
        return;
    r = s->req;
    r->tp_aux[0] = 0;
    weft_ib_slot_release(pe, (int)slot);
    weft_pipe_recv_done(pe->pipe, r, WEFT_SUCCESS);
}

static void on_recv_wc(struct ib_state *st, const struct ibv_wc *wc)
{
    struct ib_rbuf *rb = (struct ib_rbuf *)(uintptr_t)wc->wr_id;
    struct ib_qp *qp = rb->qp;
    struct ib_peer *pe = qp->pe;
    int credit_frame = 0, rc;

    if (wc->status != IBV_WC_SUCCESS) {
        if (pe->dead)
            return;   /* flushed after the pipe broke: expected */
        /* A flush is the echo of the real error, which the send CQ may
         * still hold: report that one if it is there. */
        if (wc->status == IBV_WC_WR_FLUSH_ERR)
            while (poll_send_cq(st) > 0 && !pe->dead)
                ;
        peer_fail(pe, NULL, wc);
        return;
    }
    if (pe->dead)
        return;
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM)
        on_imm(pe, ntohl(wc->imm_data));
    else if (qp->idx == 0)
        credit_frame = on_frame(pe, rb, wc->byte_len);
    else
        peer_fail_local(pe, WEFT_ERR_INTERNAL, "a frame arrived on a data-only QP (protocol error)", 0);
    if (pe->dead)
        return;   /* the pipe broke meanwhile: the QP is in error, nothing to repost */
    rc = weft_ib_post_recv(rb);
    if (rc != 0) {
        peer_fail_local(pe, WEFT_ERR_TRANSPORT, "ibv_post_recv failed", rc);
        return;
    }
    qp->owed++;
    if (!credit_frame)
        qp->owed_traffic++;
}

static int poll_recv_cq(struct ib_state *st)
{
    struct ibv_wc wc[IB_CQ_BATCH];
    int total = 0;

    for (int pass = 0; pass < IB_CQ_PASSES; pass++) {
        int n = ibv_poll_cq(st->rcq, IB_CQ_BATCH, wc);
        if (n < 0) {
            for (int i = 0; i < st->npeers; i++)
                if (!st->peers[i].dead)
                    peer_fail_local(&st->peers[i], WEFT_ERR_TRANSPORT, "ibv_poll_cq on the receive CQ failed", 0);
            return total;
        }
        for (int i = 0; i < n; i++)
            on_recv_wc(st, &wc[i]);
        total += n;
        if (n < IB_CQ_BATCH)
            break;
    }
    return total;
}

static int ib_progress(struct weft_comm *c)
{
    struct ib_state *st = ib_state(c);
    int events = 0;

    if (st == NULL || st->npeers == 0)
        return 0;
    /* Send completions first: they free room, and an error there is the
     * cause of the flushes the receive CQ may then show. */
    events += poll_send_cq(st);
    events += poll_recv_cq(st);
    for (int i = 0; i < st->npeers; i++) {
        struct ib_peer *pe = &st->peers[i];
        if (pe->dead || !pe->connected)
            continue;
        for (unsigned q = 0; q < pe->nqp && !pe->dead; q++)
            if (pe->qps[q].head)
                events += qp_kick(&pe->qps[q]);
        if (!pe->dead && credit_frame_due(pe))
            events += send_credit_frame(pe);
    }
    if (events)
        doorbell(st);
    return events;
}

/* The pipe broke: stop this peer's QPs, drop its queued work, forget its
 * requests. Posted WRs keep their memory until their (flush) completion. */
static void ib_abort_pipe(struct weft_pipe *p)
{
    struct ib_peer *pe = p->tp_peer;
    struct ib_state *st;

    if (pe == NULL || pe->dead)
        return;
    st = pe->st;
    pe->dead = 1;
    for (unsigned q = 0; q < pe->nqp_created; q++) {
        struct ib_qp *qp = &pe->qps[q];
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_ERR;
        /* In error, the QP takes no more remote writes into buffers the
         * pipe is about to hand back to the user. */
        if (qp->qp && st->ibv.modify_qp(qp->qp, &a, IBV_QP_STATE) != 0)
            WEFT_WARN(st->c->rank, "ib: peer %d: moving QP %u to the error state failed", pe->rank, q);
        while (qp->head) {
            struct ib_wr *w = qp->head;
            qp->head = w->next;
            w->next = NULL;
            if (w->kind == IB_WR_FRAME)
                sbuf_put(pe, w->sb);
            else
                w->push->unposted--;
        }
        qp->tail = NULL;
    }
    for (struct ib_push *ps = pe->push_head, *next; ps; ps = next) {
        next = ps->next;
        ps->req = NULL;
        push_maybe_finish(ps);
    }
    for (int i = 0; i < pe->nslots; i++)
        if (pe->slots[i].req) {
            pe->slots[i].req->tp_aux[0] = 0;
            weft_ib_slot_release(pe, i);
        }
    pe->cts_m = NULL;
}

/* Frames or writes queued or in flight, or credits owed for real traffic
 * (a peer may be waiting for them to send its last messages). Also tells
 * progress that weft_comm_destroy is draining, so owed credits go back now. */
static int ib_busy(const struct weft_comm *c)
{
    struct ib_state *st = ib_state(c);
    if (st == NULL)
        return 0;
    st->drain = 1;
    for (int i = 0; i < st->npeers; i++) {
        const struct ib_peer *pe = &st->peers[i];
        if (pe->dead || !pe->connected)
            continue;
        if (pe->push_head)
            return 1;
        for (unsigned q = 0; q < pe->nqp; q++)
            if (pe->qps[q].head || pe->qps[q].sq_out || pe->qps[q].owed_traffic)
                return 1;
    }
    return 0;
}

const struct weft_transport weft_transport_ib = {
    .name = "ib",
    .id = WEFT_TP_IB,
    .card_fill = weft_ib_card_fill,
    .connect = weft_ib_connect,
    .disconnect = weft_ib_disconnect,
    .eager_limit = ib_eager_limit,
    .ctrl_send = ib_ctrl_send,
    .progress = ib_progress,
    .rndv_get = NULL,
    .rndv_expect = ib_rndv_expect,
    .rndv_push = ib_rndv_push,
    .abort_pipe = ib_abort_pipe,
    .busy = ib_busy,
    .sleep = NULL,
};

#else
typedef int weft_ib_unused;
#endif /* WEFT_HAVE_VERBS_HEADERS */
