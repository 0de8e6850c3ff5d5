/*
 * InfiniBand / RoCE verbs transport: ranks on different nodes with an RDMA NIC.
 *
 * Per peer: WEFT_IB_QPS_PER_PEER reliable-connected QPs (QP 0 carries every
 * control frame, so frames arrive in the order they were sent; all QPs carry
 * rendezvous data). Set-up exchanges QPN/PSN/LID/GID/MTU for every pair in
 * one alltoall of fixed-size records through the comm's bootstrap.
 *
 * Frames (control messages) are SENDs from registered send buffers (inline
 * when they fit) into receive buffers posted ahead of time:
 *
 *     struct ib_frame_hdr   8 bytes  type (CTRL / CREDIT), QP count, length of the pipe's frame
 *     uint16_t cr[16]      32 bytes  receive credits returned, per QP
 *     the pipe's frame               CTRL only: its header, then its payload (EAGER data,
 *                                    a CTS's rendezvous key, ...), opaque to this transport
 *
 * The pipe's frame is at most WEFT_TP_CTRL_HDR_MAX bytes of header plus
 * max(WEFT_IB_EAGER, WEFT_TP_CTRL_PAYLOAD_MIN) of payload; the receive
 * buffers are sized for that. This transport never looks inside it: it
 * hands the bytes to the pipe (on_ctrl) as they came.
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
 * Rendezvous (rndv_get is NULL: the receiver always answers CTS). The
 * receiver's rndv_expect registers the receive buffer (registration cache),
 * gives it a slot, and makes the rendezvous key: the buffer's address,
 * length, rkey and the slot id (struct ib_rndv_key); the pipe carries the
 * key in its CTS frame to the sender's rndv_push. The sender registers its
 * buffer, cuts it into writes (ib_chunk.h: none larger than min(max_msg_sz
 * of both ports, WEFT_IB_CHUNK of both ranks, 1 GiB), none below 32 bytes),
 * stripes them round-robin over the QPs, and makes the last write on each QP
 * used an RDMA_WRITE_WITH_IMM whose immediate is the slot id. RC orders
 * writes on a QP, so when the receiver holds the immediates of all QPs used
 * (both sides compute that count) every byte is in place. Device buffers
 * take the same path when both rank cards say GPUDirect RDMA (rndv_mem).
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
 * status; peer_failed upcall); its QPs are moved to the error state so
 * nothing more lands in buffers the pipe gives back to the user, and the
 * flush completions that follow are absorbed quietly. Memory a posted WR
 * points at is released only at that WR's completion (or when the QPs are
 * destroyed).
 *
 * Set-up and teardown are in ib_conn.c, the shared structures in ib.h, port
 * choice in ib_dev.c, registration and GPUDirect RDMA in ib_gdr.c, the chunk
 * layout in ib_chunk.h.
 *
 * Progress: hardware moves data on its own, but the emulated device of the
 * tests moves a process's work only while it polls its CQs, and completions
 * must be reaped anyway: progress always polls. There is no doorbell to
 * sleep on (sleep is NULL, wakeless is 1 while peers are connected):
 * waiters nap between polls.
 */
#include <stdio.h>
#include <string.h>

#include "ib.h"
#include "log.h"
#include "transport.h"
#include "weft.h"

#ifdef WEFT_HAVE_VERBS_HEADERS

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>

#include "ib_chunk.h"

static struct ib_push *push_of(struct weft_list *n)
{
    return weft_container_of(n, struct ib_push, link);
}

static struct ib_wr *wr_of(struct weft_qnode *n)
{
    return weft_container_of(n, struct ib_wr, link);
}

/* The connected peer of rank peer; NULL when this rank has none. */
static struct ib_peer *peer_of(const struct ib_state *st, int peer)
{
    if (st == NULL || st->by_rank == NULL || peer < 0 || peer >= st->core->size)
        return NULL;
    return st->by_rank[peer];
}

void weft_ib_slot_release(struct ib_peer *pe, int i)
{
    struct ib_slot *s = &pe->slots[i];
    if (s->reg)
        weft_regcache_release(pe->st->regcache, s->reg);
    s->reg = NULL;
    s->x = NULL;
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

/* A completion failed: only this peer's pipe breaks (abort_peer follows). */
static void peer_fail(struct ib_peer *pe, const struct ib_wr *wr, const struct ibv_wc *wc)
{
    struct ib_state *st = pe->st;
    const struct ib_card *pk;
    if (pe->dead)
        return;
    pk = peer_card(pe);
    weft_set_error(st->core, WEFT_ERR_TRANSPORT,
                   "ib: peer %d (host %s, %s port %u): %s work request failed: %s (status %d, vendor error 0x%x)",
                   pe->rank, peer_host(pe), pk->ib_dev, pk->ib_port, wr_what(wr),
                   st->ibv.wc_status_str(wc->status), (int)wc->status, wc->vendor_err);
    st->env->up->peer_failed(st->env->up->arg, pe->rank, WEFT_ERR_TRANSPORT);
}

/* A local failure (post, protocol): break the pipe with a message. */
static void peer_fail_local(struct ib_peer *pe, int err, const char *what, int detail)
{
    struct ib_state *st = pe->st;
    if (pe->dead)
        return;
    weft_set_error(st->core, err, "ib: peer %d (host %s): %s%s%s", pe->rank, peer_host(pe), what,
                   detail ? ": " : "", detail ? strerror(detail) : "");
    st->env->up->peer_failed(st->env->up->arg, pe->rank, err);
}

/* ------------------------------------------------------------ posting */

static struct ib_sbuf *sbuf_get(struct ib_peer *pe)
{
    struct weft_list *n = weft_list_pop(&pe->sfree);
    if (n == NULL)
        return NULL;
    pe->nsfree--;
    return weft_container_of(n, struct ib_sbuf, free_link);
}

static void sbuf_put(struct ib_peer *pe, struct ib_sbuf *sb)
{
    weft_list_add_head(&pe->sfree, &sb->free_link);
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

/* Posts what waits in qp's FIFO while room and credits last. Returns the
 * number posted. */
static int qp_kick(struct ib_qp *qp)
{
    struct ib_peer *pe = qp->pe;
    int n = 0;

    while (!weft_queue_empty(&qp->wrq) && !pe->dead && qp->sq_out < qp->sq_depth) {
        struct ib_wr *w = wr_of(weft_queue_head(&qp->wrq));
        if (qp->credits < credits_needed(qp, w))
            break;
        int rc = post_one(qp, w);
        if (rc == ENOMEM)
            break;   /* the device's queue is fuller than we count: wait for completions */
        if (rc != 0) {
            peer_fail_local(pe, WEFT_ERR_TRANSPORT, "ibv_post_send failed", rc);
            break;
        }
        (void)weft_queue_pop(&qp->wrq);
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
    weft_queue_push(&qp->wrq, &w->link);
}

/* Sends a CREDIT frame now if one can go (bypassing the FIFO: credits are
 * increments, their order against other frames does not matter). */
static int send_credit_frame(struct ib_peer *pe)
{
    struct ib_qp *qp = &pe->qps[0];
    struct ib_sbuf *sb;
    int rc;

    if (qp->sq_out >= qp->sq_depth || qp->credits < 1 || weft_list_empty(&pe->sfree))
        return 0;
    sb = sbuf_get(pe);
    memset(sb->mem, 0, IB_CREDIT_FRAME_BYTES);
    ((struct ib_frame_hdr *)(void *)sb->mem)->type = IB_FRAME_CREDIT;
    sb->wr.qp = qp;
    sb->wr.link.next = NULL;
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

static int slot_of(const struct ib_peer *pe, const struct weft_tp_xfer *x)
{
    uint64_t v = WEFT_TP_PRIV(x, const struct ib_xfer)->slot;
    if (v == 0 || v > (uint64_t)pe->nslots)
        return -1;
    return pe->slots[v - 1].x == x ? (int)(v - 1) : -1;
}

/* The receive x gets a slot and a registration (once; later calls find it). */
static int slot_prepare(struct ib_peer *pe, struct weft_tp_xfer *x)
{
    struct weft_core *core = pe->st->core;
    struct weft_reg *reg = NULL;
    char why[256] = "";
    int i, rc;

    if (slot_of(pe, x) >= 0)
        return WEFT_SUCCESS;
    if (pe->slot_free < 0) {
        int n = pe->nslots ? pe->nslots * 2 : 16;
        struct ib_slot *ns = realloc(pe->slots, (size_t)n * sizeof(*ns));
        if (ns == NULL)
            return weft_set_error(core, WEFT_ERR_NO_MEMORY, "ib: peer %d: no memory for receive slots", pe->rank);
        for (i = n - 1; i >= pe->nslots; i--) {
            memset(&ns[i], 0, sizeof(ns[i]));
            ns[i].next_free = pe->slot_free;
            pe->slot_free = i;
        }
        pe->slots = ns;
        pe->nslots = n;
    }
    rc = ib_reg_acquire(pe->st, x->buf, x->bytes, x->mem_kind, &reg, why, sizeof(why));
    if (rc != WEFT_SUCCESS)
        return weft_set_error(core, rc, "ib: recv from peer %d tag %d: registering the %zu-byte buffer failed: %s",
                              pe->rank, x->tag, x->bytes, why);
    i = pe->slot_free;
    pe->slot_free = pe->slots[i].next_free;
    pe->slots[i].x = x;
    pe->slots[i].reg = reg;
    pe->slots[i].imm_got = 0;
    pe->slots[i].imm_expected = ib_chunk_qps_used(x->bytes, pe->chunk, pe->nqp);
    WEFT_TP_PRIV(x, struct ib_xfer)->slot = (uint64_t)i + 1;
    return WEFT_SUCCESS;
}

/* ------------------------------------------------------------ data path */

static size_t ib_eager_limit(void *ctx, int peer, int internal)
{
    const struct ib_state *st = ctx;
    (void)peer;
    (void)internal;
    return st ? st->core->cfg.ib_eager_limit : 0;
}

static int ib_ctrl_send(void *ctx, int peer, const void *hdr, size_t hdr_len, const void *payload, size_t len)
{
    struct ib_state *st = ctx;
    struct ib_peer *pe = peer_of(st, peer);
    struct ib_frame_hdr *h;
    struct ib_sbuf *sb;
    struct ib_qp *qp0;
    size_t bytes = hdr_len + len;
    int rc;

    if (pe == NULL)
        return weft_set_error(st ? st->core : NULL, WEFT_ERR_TRANSPORT, "ib: peer %d: not connected", peer);
    if (pe->dead)
        return WEFT_ERR_TRANSPORT;
    qp0 = &pe->qps[0];
    if (IB_CTRL_OFF + bytes > st->frame_max || IB_CTRL_OFF + bytes > pe->peer_frame_max)
        return weft_set_error(st->core, WEFT_ERR_INTERNAL, "ib: peer %d: a %zu-byte control payload exceeds the "
                              "frame size", peer, len);
    /* A frame is accepted only when it can be posted now: a frame kept
     * here waiting for a credit would complete the user's eager send while
     * nothing moves it until the next weft call. Declined, it waits in the
     * pipe, its send request stays incomplete, and the waiter progresses.
     * One send buffer and the last credit stay free for CREDIT frames. */
    if (pe->nsfree < 2 || qp0->sq_out >= qp0->sq_depth || qp0->credits < 2)
        return WEFT_EAGAIN;
    sb = sbuf_get(pe);
    h = (struct ib_frame_hdr *)(void *)sb->mem;
    memset(h, 0, sizeof(*h));
    h->type = IB_FRAME_CTRL;
    h->len = (uint32_t)bytes;
    if (hdr_len)
        memcpy(sb->mem + IB_CTRL_OFF, hdr, hdr_len);
    if (len)
        memcpy(sb->mem + IB_CTRL_OFF + hdr_len, payload, len);
    sb->wr.qp = qp0;
    sb->wr.link.next = NULL;
    sb->wr.credit = 0;
    sb->wr.len = (uint32_t)(IB_CTRL_OFF + bytes);
    rc = post_one(qp0, &sb->wr);
    if (rc != 0) {
        sbuf_put(pe, sb);
        if (rc == ENOMEM)
            return WEFT_EAGAIN;   /* the device's queue is fuller than we count */
        return weft_set_error(st->core, WEFT_ERR_TRANSPORT, "ib: peer %d (host %s): ibv_post_send failed: %s",
                              peer, peer_host(pe), strerror(rc));
    }
    doorbell(st);
    return WEFT_SUCCESS;
}

static unsigned ib_rndv_mem(void *ctx, int peer)
{
    const struct ib_state *st = ctx;
    const struct weft_tp_cards *k;
    unsigned mem = WEFT_TP_MEM_HOST;

    if (st == NULL || peer < 0 || peer >= st->core->size)
        return mem;
    k = &st->env->cards;
    /* GPUDirect RDMA only when both ranks register device memory with
     * their NICs (both cards say so), so sender and receiver agree. */
    if (k->base && ((const struct ib_card *)weft_tp_blob(k, st->core->rank))->ib_gdr &&
        ((const struct ib_card *)weft_tp_blob(k, peer))->ib_gdr)
        mem |= WEFT_TP_MEM_DEVICE;
    return mem;
}

static int ib_rndv_expect(void *ctx, int peer, struct weft_tp_xfer *x, const struct weft_tp_src *src, void *key,
                          size_t *keylen)
{
    struct ib_state *st = ctx;
    struct ib_peer *pe = peer_of(st, peer);
    struct ib_rndv_key k;
    int i, rc;

    (void)src;
    if (pe == NULL || pe->dead)
        return weft_set_error(st ? st->core : NULL, WEFT_ERR_TRANSPORT, "ib: peer %d: not connected", peer);
    rc = slot_prepare(pe, x);
    if (rc != WEFT_SUCCESS)
        return rc;
    i = slot_of(pe, x);
    memset(&k, 0, sizeof(k));
    k.addr = (uint64_t)(uintptr_t)x->buf;
    k.len = x->bytes;
    k.rkey = pe->slots[i].reg->rkey;
    k.slot = (uint32_t)i;
    memcpy(key, &k, sizeof(k));
    *keylen = sizeof(k);
    return WEFT_SUCCESS;
}

void weft_ib_push_free(struct ib_push *ps)
{
    if (weft_list_linked(&ps->link))
        weft_list_del(&ps->link);
    if (ps->reg)
        weft_regcache_release(ps->pe->st->regcache, ps->reg);
    free(ps);
}

/* Every WR of the push has completed (or was never posted): done. */
static void push_maybe_finish(struct ib_push *ps)
{
    struct ib_peer *pe = ps->pe;
    struct weft_tp_xfer *x = ps->x;

    if (ps->outstanding || ps->unposted)
        return;
    ps->x = NULL;
    weft_ib_push_free(ps);
    if (x && !pe->dead)
        pe->st->env->up->rndv_done(pe->st->env->up->arg, x, WEFT_SUCCESS);
}

static int ib_rndv_push(void *ctx, int peer, struct weft_tp_xfer *x, const void *key, size_t keylen)
{
    struct ib_state *st = ctx;
    struct ib_peer *pe = peer_of(st, peer);
    struct weft_reg *reg = NULL;
    struct ib_rndv_key k;
    struct ib_push *ps;
    char why[256] = "";
    uint64_t n;
    unsigned start;
    int rc;

    if (pe == NULL || pe->dead)
        return weft_set_error(st ? st->core : NULL, WEFT_ERR_TRANSPORT, "ib: peer %d: not connected", peer);
    if (key == NULL || keylen != sizeof(k))
        return weft_set_error(st->core, WEFT_ERR_INTERNAL, "ib: peer %d: push without the CTS that describes its "
                              "target", peer);
    memcpy(&k, key, sizeof(k));
    if (k.len != x->bytes)
        return weft_set_error(st->core, WEFT_ERR_INTERNAL, "ib: peer %d: CTS expects %llu bytes, the send has %zu",
                              peer, (unsigned long long)k.len, x->bytes);
    n = ib_chunk_count(x->bytes, pe->chunk);
    ps = calloc(1, sizeof(*ps) + (size_t)n * sizeof(ps->wrs[0]));
    if (ps == NULL)
        return weft_set_error(st->core, WEFT_ERR_NO_MEMORY, "ib: send to peer %d: no memory for %llu write requests",
                              peer, (unsigned long long)n);
    rc = ib_reg_acquire(st, x->buf, x->bytes, x->mem_kind, &reg, why, sizeof(why));
    if (rc != WEFT_SUCCESS) {
        free(ps);
        return weft_set_error(st->core, rc, "ib: send to peer %d tag %d: registering the %zu-byte buffer failed: %s",
                              peer, x->tag, x->bytes, why);
    }
    ps->pe = pe;
    ps->x = x;
    ps->reg = reg;
    ps->rkey = k.rkey;
    ps->slot = k.slot;
    ps->nwr = n;
    ps->unposted = n;
    weft_list_add_tail(&pe->pushes, &ps->link);

    /* Round-robin over the QPs, starting one further per message so that
     * small multi-chunk messages spread too. */
    start = pe->push_rr++ % pe->nqp;
    for (uint64_t j = 0; j < n; j++) {
        struct ib_wr *w = &ps->wrs[j];
        uint64_t off, len;
        ib_chunk_at(x->bytes, pe->chunk, j, &off, &len);
        w->kind = IB_WR_WRITE;
        w->push = ps;
        w->laddr = (uint64_t)(uintptr_t)x->buf + off;
        w->raddr = k.addr + off;
        w->len = (uint32_t)len;
        w->imm = j + pe->nqp >= n;
        qp_append(&pe->qps[(start + j) % pe->nqp], w);
    }
    for (unsigned q = 0; q < pe->nqp && !pe->dead; q++)
        qp_kick(&pe->qps[q]);
    doorbell(st);
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
        else if (pe->st->env->up->on_data)
            pe->st->env->up->on_data(pe->st->env->up->arg, pe->rank);
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
    const struct weft_tp_upcalls *up = pe->st->env->up;
    struct ib_frame_hdr h;
    uint16_t cr[IB_MAX_QPS];

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
    if (h.type != IB_FRAME_CTRL || bytes <= IB_CTRL_OFF || bytes - IB_CTRL_OFF != h.len) {
        peer_fail_local(pe, WEFT_ERR_INTERNAL, "malformed frame (protocol error)", 0);
        return 0;
    }
    /* The pipe's frame, whole: the receive buffer is reposted only after
     * the call, so the bytes stay valid during it. */
    up->on_ctrl(up->arg, pe->rank, rb->mem + IB_CTRL_OFF, h.len);
    return 0;
}

/* The immediate of the last write on one QP arrived. */
static void on_imm(struct ib_peer *pe, uint32_t slot)
{
    const struct weft_tp_upcalls *up = pe->st->env->up;
    struct ib_slot *s;
    struct weft_tp_xfer *x;

    if (slot >= (uint32_t)pe->nslots || pe->slots[slot].x == NULL) {
        peer_fail_local(pe, WEFT_ERR_INTERNAL, "RDMA write names an unknown receive (protocol error)", 0);
        return;
    }
    s = &pe->slots[slot];
    if (up->on_data)
        up->on_data(up->arg, pe->rank);   /* a chunk landed: the request is progressing */
    if (++s->imm_got < s->imm_expected)
        return;
    x = s->x;
    WEFT_TP_PRIV(x, struct ib_xfer)->slot = 0;
    weft_ib_slot_release(pe, (int)slot);
    up->rndv_done(up->arg, x, WEFT_SUCCESS);
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

static int ib_progress(void *ctx)
{
    struct ib_state *st = ctx;
    int events = 0;

    if (st == NULL || st->npeers == 0 || st->scq == NULL)
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
            if (!weft_queue_empty(&pe->qps[q].wrq))
                events += qp_kick(&pe->qps[q]);
        if (!pe->dead && credit_frame_due(pe))
            events += send_credit_frame(pe);
    }
    if (events)
        doorbell(st);
    return events;
}

/* The pipe broke: stop this peer's QPs, drop its queued work, forget its
 * transfers. Posted WRs keep their memory until their (flush) completion. */
static void ib_abort_peer(void *ctx, int peer)
{
    struct ib_state *st = ctx;
    struct ib_peer *pe = peer_of(st, peer);

    if (pe == NULL || pe->dead)
        return;
    pe->dead = 1;
    st->nlive--;
    for (unsigned q = 0; q < pe->nqp_created; q++) {
        struct ib_qp *qp = &pe->qps[q];
        struct weft_qnode *n;
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_ERR;
        /* In error, the QP takes no more remote writes into buffers the
         * pipe is about to hand back to the user. */
        if (qp->qp && st->ibv.modify_qp(qp->qp, &a, IBV_QP_STATE) != 0)
            WEFT_WARN(st->core->rank, "ib: peer %d: moving QP %u to the error state failed", pe->rank, q);
        while ((n = weft_queue_pop(&qp->wrq)) != NULL) {
            struct ib_wr *w = wr_of(n);
            if (w->kind == IB_WR_FRAME)
                sbuf_put(pe, w->sb);
            else
                w->push->unposted--;
        }
    }
    weft_list_for_each(n, &pe->pushes) {
        struct ib_push *ps = push_of(n);
        ps->x = NULL;
        push_maybe_finish(ps);
    }
    for (int i = 0; i < pe->nslots; i++)
        if (pe->slots[i].x) {
            WEFT_TP_PRIV(pe->slots[i].x, struct ib_xfer)->slot = 0;
            weft_ib_slot_release(pe, i);
        }
}

/* Frames or writes queued or in flight, or credits owed for real traffic
 * (a peer may be waiting for them to send its last messages). Also tells
 * progress that weft_comm_destroy is draining, so owed credits go back now. */
static int ib_busy(void *ctx)
{
    struct ib_state *st = ctx;
    if (st == NULL)
        return 0;
    st->drain = 1;
    for (int i = 0; i < st->npeers; i++) {
        const struct ib_peer *pe = &st->peers[i];
        if (pe->dead || !pe->connected)
            continue;
        if (!weft_list_empty(&pe->pushes))
            return 1;
        for (unsigned q = 0; q < pe->nqp; q++)
            if (!weft_queue_empty(&pe->qps[q].wrq) || pe->qps[q].sq_out || pe->qps[q].owed_traffic)
                return 1;
    }
    return 0;
}

/* Completions arrive on CQs nobody can sleep on: while a peer is connected,
 * waiters nap and poll. */
static int ib_wakeless(void *ctx)
{
    const struct ib_state *st = ctx;
    return st != NULL && st->nlive > 0;
}

/* weft_mem_register: the range stays registered until mem_unpin. A rank
 * without ib peers has no registration cache: nothing to do. */
static int ib_mem_pin(void *ctx, const void *buf, size_t bytes, char *why, size_t whylen)
{
    struct ib_state *st = ctx;
    if (st == NULL || st->regcache == NULL)
        return WEFT_SUCCESS;
    return weft_regcache_pin(st->regcache, buf, bytes, why, whylen);
}

static void ib_mem_unpin(void *ctx, const void *buf, size_t bytes)
{
    struct ib_state *st = ctx;
    if (st != NULL && st->regcache != NULL)
        (void)weft_regcache_invalidate(st->regcache, buf, bytes);
}

/* Which pairs can use ib, from the two cards alone (every rank holds every
 * card, so every rank computes the same answer for every pair). The comm
 * has checked WEFT_TRANSPORTS of both ranks and the scope already, and
 * shm, which comes first, takes the pairs of one node it serves. */
static int ib_reach(const struct weft_tp_cards *k, int me, int peer, char *why, size_t whylen)
{
    const struct ib_card *a = weft_tp_blob(k, me), *b = weft_tp_blob(k, peer);
    const char *no = NULL;

    if (a->ib_dev[0] == '\0')
        no = "no usable RDMA port here";
    else if (b->ib_dev[0] == '\0')
        no = "no usable RDMA port on the peer";
    else if (a->ib_link_layer != b->ib_link_layer)
        no = "InfiniBand and RoCE ports cannot talk";
    if (no == NULL)
        return 1;
    if (why && whylen)
        snprintf(why, whylen, "%s", no);
    return 0;
}

const struct weft_transport weft_transport_ib = {
    .name = "ib",
    .ctrl = 1,
    .scope = WEFT_TP_SCOPE_ANY,
    .sure = 0,
    .card_bytes = IB_CARD_BYTES,
    .create = weft_ib_create,
    .reach = ib_reach,
    .probe = weft_ib_probe,
    .connect = weft_ib_connect,
    .destroy = weft_ib_destroy,
    .eager_limit = ib_eager_limit,
    .ctrl_send = ib_ctrl_send,
    .progress = ib_progress,
    .rndv_mem = ib_rndv_mem,
    .rndv_get = NULL,
    .rndv_expect = ib_rndv_expect,
    .rndv_push = ib_rndv_push,
    .abort_peer = ib_abort_peer,
    .busy = ib_busy,
    .wakeless = ib_wakeless,
    .sleep = NULL,
    .mem_pin = ib_mem_pin,
    .mem_unpin = ib_mem_unpin,
};

#else /* !WEFT_HAVE_VERBS_HEADERS */

/* Built without the verbs headers: the transport is listed (its card blob
 * is part of every card) but never offered. */
static int ib_create_none(const struct weft_tp_env *env, void *blob, void **ctx)
{
    memset(blob, 0, IB_CARD_BYTES);   /* ib_dev "": not offered */
    *ctx = NULL;
    WEFT_INFO(env->core->rank, "ib: not offered: weft was built without the verbs headers");
    return WEFT_SUCCESS;
}

static int ib_reach_none(const struct weft_tp_cards *k, int me, int peer, char *why, size_t whylen)
{
    (void)k;
    (void)me;
    (void)peer;
    if (why && whylen)
        snprintf(why, whylen, "built without verbs headers");
    return 0;
}

/* No pair can use it (reach refuses every one): nothing to connect. */
static int ib_connect_none(const struct weft_tp_env *env, void *ctx)
{
    (void)env;
    (void)ctx;
    return WEFT_SUCCESS;
}

static void ib_destroy_none(void *ctx)
{
    (void)ctx;
}

static int ib_probe_none(struct weft_core *core, char *what, size_t len)
{
    (void)core;
    snprintf(what, len, "weft was built without the verbs headers");
    return 0;
}

const struct weft_transport weft_transport_ib = {
    .name = "ib",
    .ctrl = 1,
    .scope = WEFT_TP_SCOPE_ANY,
    .sure = 0,
    .card_bytes = IB_CARD_BYTES,
    .create = ib_create_none,
    .reach = ib_reach_none,
    .probe = ib_probe_none,
    .connect = ib_connect_none,
    .destroy = ib_destroy_none,
};

#endif /* WEFT_HAVE_VERBS_HEADERS */
