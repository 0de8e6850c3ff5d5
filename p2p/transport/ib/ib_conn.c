/*
 * ib transport: set-up and teardown (the data path is ib.c, whose top
 * comment describes the protocol).
 *
 * create loads libibverbs, picks the port (ib_dev.c) and writes it into
 * this transport's blob of the rank card (struct ib_card); connect creates,
 * per peer, the QPs (to INIT, receives posted), exchanges one fixed-size
 * record per pair with one alltoall of the comm's bootstrap (always made
 * when some pair of the comm uses ib, so no rank can hang another), then
 * takes the QPs to RTR and RTS. ib_release gives back everything but the
 * state itself, in reverse order, and is idempotent (connect uses it when
 * this rank has no ib peer); destroy releases and frees the state.
 */
#ifdef WEFT_HAVE_VERBS_HEADERS

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "ib.h"
#include "ib_chunk.h"
#include "log.h"
#include "transport.h"
#include "weft.h"

/* ------------------------------------------------------------ teardown */


static void peer_teardown(struct ib_state *st, struct ib_peer *pe)
{
    for (unsigned i = 0; i < pe->nqp_created; i++) {
        if (pe->qps[i].qp)
            st->ibv.destroy_qp(pe->qps[i].qp);
        pe->qps[i].qp = NULL;
        weft_queue_init(&pe->qps[i].wrq);
    }
    /* QPs are gone: nothing references the pushes' memory any more. */
    while (!weft_list_empty(&pe->pushes))
        weft_ib_push_free(weft_container_of(weft_list_first(&pe->pushes), struct ib_push, link));
    for (int i = 0; i < pe->nslots; i++)
        if (pe->slots[i].x || pe->slots[i].reg)
            weft_ib_slot_release(pe, i);
    free(pe->slots);
    pe->slots = NULL;
    pe->nslots = 0;
    if (pe->mr)
        st->ibv.dereg_mr(pe->mr);
    pe->mr = NULL;
    free(pe->mem);
    pe->mem = NULL;
    free(pe->rbufs);
    pe->rbufs = NULL;
    free(pe->sbufs);
    pe->sbufs = NULL;
    weft_list_init(&pe->sfree);
    pe->nsfree = 0;
    pe->connected = 0;
}

/* Releases everything but st itself (what create and connect made: the
 * device is given back). Idempotent. */
static void ib_release(struct ib_state *st)
{
    free(st->by_rank);
    st->by_rank = NULL;
    st->nlive = 0;
    for (int i = 0; i < st->npeers; i++)
        peer_teardown(st, &st->peers[i]);
    free(st->peers);
    st->peers = NULL;
    st->npeers = 0;
    if (st->scq)
        st->ibv.destroy_cq(st->scq);
    st->scq = NULL;
    if (st->rcq)
        st->ibv.destroy_cq(st->rcq);
    st->rcq = NULL;
    if (st->regcache) {
        weft_regcache_destroy(st->regcache);
        st->regcache = NULL;
    }
    if (st->pd)
        st->ibv.dealloc_pd(st->pd);
    st->pd = NULL;
    if (st->ctx)
        st->ibv.close_device(st->ctx);
    st->ctx = NULL;
    if (st->loaded)
        weft_ibv_unload(&st->ibv);
    st->loaded = 0;
}

void weft_ib_destroy(void *ctx)
{
    struct ib_state *st = ctx;
    if (st == NULL)
        return;
    ib_release(st);
    free(st);
}

/* --------------------------------------------------------------- card */

/* Loads verbs, opens the port and writes it into the blob; a rank where ib
 * cannot work leaves the blob zeroed ("not offered") after one info line,
 * whose reason also goes to no (weft_ib_probe). */
static int card_fill_port(struct ib_state *st, struct ib_card *mine, char *no, size_t nolen)
{
    struct weft_core *core = st->core;
    char why[256] = "";
    int rc;

    if (weft_ibv_load(core->cfg.ibverbs_lib, &st->ibv, why, sizeof(why)) != 0) {
        snprintf(no, nolen, "cannot load the verbs library: %s", why);
        WEFT_INFO(core->rank, "ib: not offered: %s", no);
        return WEFT_SUCCESS;
    }
    st->loaded = 1;

    rc = ib_dev_open(&st->ibv, &core->cfg, core->rank, &st->ctx, &st->dattr, &st->port, why, sizeof(why));
    if (rc != WEFT_SUCCESS) {
        weft_ibv_unload(&st->ibv);
        st->loaded = 0;
        if (rc == WEFT_ERR_UNSUPPORTED) {
            snprintf(no, nolen, "%s", why);
            WEFT_INFO(core->rank, "ib: not offered: %s", no);
            return WEFT_SUCCESS;
        }
        return weft_set_error(core, rc, "ib: opening the RDMA device failed: %s", why);
    }
    st->pd = st->ibv.alloc_pd(st->ctx);
    if (st->pd == NULL) {
        snprintf(no, nolen, "%s port %u: ibv_alloc_pd failed: %s", st->port.dev, st->port.port, strerror(errno));
        WEFT_INFO(core->rank, "ib: not offered: %s", no);
        st->ibv.close_device(st->ctx);
        st->ctx = NULL;
        weft_ibv_unload(&st->ibv);
        st->loaded = 0;
        return WEFT_SUCCESS;
    }

    /* Where RDMA is really there: can GPU memory be registered too? */
    ib_gdr_setup(st);
    mine->ib_gdr = (uint8_t)(st->gdr != 0);

    snprintf(mine->ib_dev, sizeof(mine->ib_dev), "%s", st->port.dev);
    mine->ib_port = st->port.port;
    mine->ib_link_layer = st->port.link_layer;
    mine->ib_mtu = st->port.active_mtu;
    mine->ib_lid = st->port.lid;
    mine->ib_gid_index = (uint8_t)(st->port.gid_index < 0 ? 0 : st->port.gid_index);
    memcpy(mine->ib_gid, st->port.gid.raw, sizeof(mine->ib_gid));
    if (st->port.link_layer == IBV_LINK_LAYER_ETHERNET)
        WEFT_INFO(core->rank, "ib: offering %s port %u (RoCE, GID index %d: %s, MTU %d, max message %llu) from %s",
                  st->port.dev, st->port.port, st->port.gid_index, st->port.gid_how,
                  128 << st->port.active_mtu, (unsigned long long)st->port.max_msg_sz, st->ibv.path);
    else
        WEFT_INFO(core->rank, "ib: offering %s port %u (InfiniBand, LID %u, MTU %d, max message %llu) from %s",
                  st->port.dev, st->port.port, st->port.lid, 128 << st->port.active_mtu,
                  (unsigned long long)st->port.max_msg_sz, st->ibv.path);
    return WEFT_SUCCESS;
}

int weft_ib_create(const struct weft_tp_env *env, void *blob, void **ctx)
{
    struct weft_core *core = env->core;
    struct ib_card *mine = blob;
    struct ib_state *st;
    int rc;

    *ctx = NULL;
    st = calloc(1, sizeof(*st));
    if (st == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "ib: no memory for transport state");
    st->env = env;
    st->core = core;
    char no[256];
    rc = card_fill_port(st, mine, no, sizeof(no));

    /* WEFT_IB_GDR=1: GPUDirect is required wherever ib is offered. */
    if (rc == WEFT_SUCCESS && core->cfg.ib_gdr == 1 && !mine->ib_gdr)
        rc = weft_set_error(core, WEFT_ERR_UNSUPPORTED, "ib: WEFT_IB_GDR=1 but GPUDirect RDMA is not possible on "
                            "rank %d: %s", core->rank, st->loaded && st->gdr_why[0] ? st->gdr_why
                            : "ib is not offered here (WEFT_DEBUG=info says why)");
    if (rc != WEFT_SUCCESS) {
        weft_ib_destroy(st);
        return rc;
    }
    *ctx = st;
    return WEFT_SUCCESS;
}

int weft_ib_probe(struct weft_core *core, char *what, size_t len)
{
    struct ib_state *st = calloc(1, sizeof(*st));
    struct ib_card card;
    char no[256] = "";
    int usable;

    if (st == NULL) {
        snprintf(what, len, "no memory for transport state");
        return 0;
    }
    memset(&card, 0, sizeof(card));
    st->core = core;
    /* create's own steps: the library, the port, the protection domain,
     * the GPUDirect test; then everything is given back. */
    if (card_fill_port(st, &card, no, sizeof(no)) != WEFT_SUCCESS) {
        weft_error_last_reason(core, what, len);
        weft_ib_destroy(st);
        return 0;
    }
    usable = card.ib_dev[0] != '\0';
    if (!usable)
        snprintf(what, len, "%s", no);
    else if (st->port.link_layer == IBV_LINK_LAYER_ETHERNET)
        snprintf(what, len, "%s port %u (RoCE, GID index %d, MTU %d) from %s; GPUDirect RDMA: %s%s%s", st->port.dev,
                 st->port.port, st->port.gid_index, 128 << st->port.active_mtu, st->ibv.path,
                 st->gdr ? "yes" : "no", st->gdr ? "" : ": ", st->gdr ? "" : st->gdr_why);
    else
        snprintf(what, len, "%s port %u (InfiniBand, LID %u, MTU %d) from %s; GPUDirect RDMA: %s%s%s", st->port.dev,
                 st->port.port, st->port.lid, 128 << st->port.active_mtu, st->ibv.path,
                 st->gdr ? "yes" : "no", st->gdr ? "" : ": ", st->gdr ? "" : st->gdr_why);
    weft_ib_destroy(st);
    return usable;
}

/* ------------------------------------------------------------ connect */

int weft_ib_post_recv(struct ib_rbuf *rb)
{
    struct ib_peer *pe = rb->qp->pe;
    struct ibv_sge sge = { .addr = (uintptr_t)rb->mem, .length = rb->len, .lkey = pe->mr->lkey };
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = (uint64_t)(uintptr_t)rb;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return ibv_post_recv(rb->qp->qp, &wr, &bad);
}

/* Creates the QPs of one peer (to INIT), its buffers, and posts receives. */
static int peer_setup(struct ib_state *st, struct ib_peer *pe)
{
    struct weft_core *core = st->core;
    const int depth = st->recv_posted;
    unsigned nqp = (unsigned)core->cfg.ib_qps_per_peer;
    size_t rbytes = (size_t)depth * st->frame_max, sbytes;
    int i;

    if (nqp > IB_MAX_QPS)
        nqp = IB_MAX_QPS;
    /* Send buffers: a few more than the peer's receive credits, so frames
     * can wait for credits while one buffer stays free for a CREDIT frame. */
    pe->nsbufs = depth + 4;
    sbytes = (size_t)pe->nsbufs * st->frame_max;
    pe->mem_bytes = rbytes + sbytes + 64;
    pe->mem = aligned_alloc(64, (pe->mem_bytes + 63) & ~(size_t)63);
    pe->rbufs = calloc((size_t)depth * nqp, sizeof(*pe->rbufs));
    pe->sbufs = calloc((size_t)pe->nsbufs, sizeof(*pe->sbufs));
    if (pe->mem == NULL || pe->rbufs == NULL || pe->sbufs == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "ib: peer %d: no memory for %zu bytes of buffers", pe->rank,
                              pe->mem_bytes);
    memset(pe->mem, 0, pe->mem_bytes);
    pe->mr = st->ibv.reg_mr(st->pd, pe->mem, pe->mem_bytes, IBV_ACCESS_LOCAL_WRITE);
    if (pe->mr == NULL)
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "ib: peer %d (host %s): ibv_reg_mr of %zu buffer bytes failed: %s", pe->rank,
                              peer_host(pe), pe->mem_bytes, strerror(errno));
    for (i = 0; i < pe->nsbufs; i++) {
        struct ib_sbuf *sb = &pe->sbufs[i];
        sb->mem = pe->mem + rbytes + (size_t)i * st->frame_max;
        sb->wr.kind = IB_WR_FRAME;
        sb->wr.sb = sb;
        weft_list_add_head(&pe->sfree, &sb->free_link);
    }
    pe->nsfree = pe->nsbufs;
    pe->slot_free = -1;

    for (unsigned q = 0; q < nqp; q++) {
        struct ib_qp *qp = &pe->qps[q];
        struct ibv_qp_init_attr ia;
        /* Devices cap max_inline_data differently (and refuse more): ask
         * for less until one is granted. */
        static const uint32_t inline_try[] = { IB_INLINE_WANT, 192, 128, 64, 0 };

        qp->pe = pe;
        qp->idx = q;
        qp->sq_depth = st->sq_depth;
        weft_queue_init(&qp->wrq);
        for (size_t t = 0; t < sizeof(inline_try) / sizeof(inline_try[0]) && qp->qp == NULL; t++) {
            memset(&ia, 0, sizeof(ia));
            ia.send_cq = st->scq;
            ia.recv_cq = st->rcq;
            ia.qp_type = IBV_QPT_RC;
            ia.sq_sig_all = 0;
            ia.cap.max_send_wr = (uint32_t)st->sq_depth;
            ia.cap.max_recv_wr = (uint32_t)depth;
            ia.cap.max_send_sge = 1;
            ia.cap.max_recv_sge = 1;
            ia.cap.max_inline_data = inline_try[t];
            qp->qp = st->ibv.create_qp(st->pd, &ia);
        }
        if (qp->qp == NULL)
            return weft_set_error(core, WEFT_ERR_TRANSPORT,
                                  "ib: peer %d (host %s): ibv_create_qp (RC, %d send / %d receive WRs) failed: %s",
                                  pe->rank, peer_host(pe), st->sq_depth, depth, strerror(errno));
        pe->nqp_created = q + 1;
        qp->max_inline = ia.cap.max_inline_data;
        uint32_t psn = 0;
        if (getrandom(&psn, sizeof(psn), GRND_NONBLOCK) != (ssize_t)sizeof(psn))
            psn = (uint32_t)time(NULL) ^ (uint32_t)getpid() ^ (q << 8);
        qp->psn = psn & 0xffffff;

        struct ibv_qp_attr a;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = st->port.port;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        int mrc = st->ibv.modify_qp(qp->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        if (mrc != 0)
            return weft_set_error(core, WEFT_ERR_TRANSPORT, "ib: peer %d (host %s): QP %u to INIT failed: %s", pe->rank,
                                  peer_host(pe), q, strerror(mrc));

        /* QP 0 receives frames into its buffers; the others receive only
         * the immediates of RDMA writes (no bytes), into a shared sink. */
        qp->rbufs = &pe->rbufs[(size_t)q * depth];
        qp->nrbufs = depth;
        for (i = 0; i < depth; i++) {
            struct ib_rbuf *rb = &qp->rbufs[i];
            rb->qp = qp;
            rb->mem = q == 0 ? pe->mem + (size_t)i * st->frame_max : pe->mem + rbytes + sbytes;
            rb->len = q == 0 ? (uint32_t)st->frame_max : 64;
            int prc = weft_ib_post_recv(rb);
            if (prc != 0)
                return weft_set_error(core, WEFT_ERR_TRANSPORT,
                                      "ib: peer %d (host %s): ibv_post_recv on QP %u failed: %s", pe->rank,
                                      peer_host(pe), q, strerror(prc));
        }
    }
    return WEFT_SUCCESS;
}

static void rec_fill(const struct ib_state *st, const struct ib_peer *pe, struct ib_pair_rec *r)
{
    memset(r, 0, sizeof(*r));
    r->valid = IB_REC_MAGIC;
    r->nqp = pe->nqp_created;
    for (unsigned q = 0; q < pe->nqp_created; q++) {
        r->qpn[q] = pe->qps[q].qp->qp_num;
        r->psn[q] = pe->qps[q].psn;
    }
    r->recv_posted = (uint32_t)st->recv_posted;
    r->frame_max = (uint32_t)st->frame_max;
    r->max_msg_sz = st->port.max_msg_sz;
    r->chunk = st->core->cfg.ib_chunk;
    r->lid = st->port.lid;
    r->mtu = st->port.active_mtu;
    r->link_layer = st->port.link_layer;
    r->gid_index = (uint32_t)(st->port.gid_index < 0 ? 0 : st->port.gid_index);
    memcpy(r->gid, st->port.gid.raw, sizeof(r->gid));
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* INIT -> RTR -> RTS for the pair's QPs, with what the peer sent. */
static int peer_connect(struct ib_state *st, struct ib_peer *pe, const struct ib_pair_rec *r)
{
    struct weft_core *core = st->core;
    const struct ib_card *pk = peer_card(pe);
    const char *host = peer_host(pe);

    if (r->valid != IB_REC_MAGIC)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "ib: peer %d (host %s): the peer set up no QPs for this pair "
                              "(see its log)", pe->rank, host);
    if (r->nqp == 0 || r->nqp > IB_MAX_QPS || r->recv_posted < IB_MIN_DEPTH || r->link_layer != st->port.link_layer)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "ib: peer %d (host %s): bad connection record (%u QPs, %u "
                              "receives, link layer %u)", pe->rank, host, r->nqp, r->recv_posted, r->link_layer);
    if (r->frame_max < st->frame_max)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "ib: peer %d (host %s): its receive buffers (%u bytes) are "
                              "smaller than my frames (%zu): WEFT_IB_EAGER must be the same on every rank",
                              pe->rank, host, r->frame_max, st->frame_max);
    pe->nqp = r->nqp < pe->nqp_created ? r->nqp : pe->nqp_created;
    pe->peer_frame_max = r->frame_max;
    pe->chunk = min_u64(min_u64(st->port.max_msg_sz, r->max_msg_sz), min_u64(core->cfg.ib_chunk, r->chunk));
    pe->chunk = min_u64(pe->chunk, IB_ONE_GIB);
    if (pe->chunk < 2 * IB_CHUNK_MIN)
        pe->chunk = 2 * IB_CHUNK_MIN;
    enum ibv_mtu mtu = (enum ibv_mtu)(r->mtu < st->port.active_mtu ? r->mtu : st->port.active_mtu);

    for (unsigned q = 0; q < pe->nqp; q++) {
        struct ib_qp *qp = &pe->qps[q];
        struct ibv_qp_attr a;
        int mrc;

        qp->credits = (int)r->recv_posted;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = mtu;
        a.dest_qp_num = r->qpn[q];
        a.rq_psn = r->psn[q];
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.port_num = st->port.port;
        a.ah_attr.sl = 0;
        if (st->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
            a.ah_attr.is_global = 1;
            memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
            a.ah_attr.grh.sgid_index = (uint8_t)st->port.gid_index;
            a.ah_attr.grh.hop_limit = 64;
        } else {
            a.ah_attr.dlid = r->lid;
        }
        mrc = st->ibv.modify_qp(qp->qp, &a,
                                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        if (mrc != 0)
            return weft_set_error(core, WEFT_ERR_TRANSPORT, "ib: peer %d (host %s, %s port %u): QP %u to RTR (remote "
                                  "QPN %u, MTU %d) failed: %s", pe->rank, host, pk->ib_dev, pk->ib_port, q,
                                  r->qpn[q], 128 << mtu, strerror(mrc));
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_RTS;
        a.timeout = (uint8_t)core->cfg.ib_timeout;
        a.retry_cnt = (uint8_t)core->cfg.ib_retry_cnt;
        a.rnr_retry = 7;
        a.sq_psn = qp->psn;
        a.max_rd_atomic = 1;
        mrc = st->ibv.modify_qp(qp->qp, &a,
                                IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                    IBV_QP_MAX_QP_RD_ATOMIC);
        if (mrc != 0)
            return weft_set_error(core, WEFT_ERR_TRANSPORT, "ib: peer %d (host %s): QP %u to RTS failed: %s", pe->rank,
                                  host, q, strerror(mrc));
    }
    WEFT_INFO(core->rank, "ib: peer %d (host %s, %s port %u): %u RC QP(s), MTU %d, %d credits, writes of up to %llu "
              "bytes", pe->rank, host, pk->ib_dev, pk->ib_port, pe->nqp, 128 << mtu,
              (int)r->recv_posted, (unsigned long long)pe->chunk);
    return WEFT_SUCCESS;
}

/* Local set-up before the exchange: CQs, regcache, every ib peer's QPs. */
static int local_setup(const struct weft_tp_env *env, struct ib_state *st, int npeers)
{
    struct weft_core *core = st->core;
    const struct ibv_device_attr *da = &st->dattr;
    int maxwr = da->max_qp_wr > 0 ? da->max_qp_wr : 1;
    unsigned nqp = (unsigned)core->cfg.ib_qps_per_peer;
    size_t payload_max;
    long long scqe, rcqe;
    int rc;

    if (nqp > IB_MAX_QPS)
        nqp = IB_MAX_QPS;
    st->sq_depth = core->cfg.ib_sq_depth < maxwr ? core->cfg.ib_sq_depth : maxwr;
    /* One receive more than WEFT_IB_RECV_DEPTH: the credit kept for CREDIT frames. */
    st->recv_posted = core->cfg.ib_recv_depth + 1 < maxwr ? core->cfg.ib_recv_depth + 1 : maxwr;
    if (st->recv_posted < IB_MIN_DEPTH || st->sq_depth < 1)
        return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "ib: %s: device max_qp_wr %d is below the %d receive WRs "
                              "the credit scheme needs", st->port.dev, da->max_qp_wr, IB_MIN_DEPTH);
    /* The largest frame of the pipe: its header, then an eager message or
     * another payload (a rendezvous key) of up to WEFT_TP_CTRL_PAYLOAD_MIN. */
    payload_max = core->cfg.ib_eager_limit > WEFT_TP_CTRL_PAYLOAD_MIN ? core->cfg.ib_eager_limit
                                                                      : WEFT_TP_CTRL_PAYLOAD_MIN;
    st->frame_max = IB_CTRL_OFF + WEFT_TP_CTRL_HDR_MAX + payload_max;
    st->frame_max = (st->frame_max + 63) & ~(size_t)63;

    /* Every WR is signaled: one CQE per outstanding WR at most. */
    scqe = (long long)npeers * nqp * st->sq_depth;
    rcqe = (long long)npeers * nqp * st->recv_posted;
    if (da->max_cqe > 0 && (scqe > da->max_cqe || rcqe > da->max_cqe))
        return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "ib: %s: %d peers x %u QPs need CQs of %lld/%lld entries, "
                              "the device allows %d (lower WEFT_IB_SQ_DEPTH, WEFT_IB_RECV_DEPTH or "
                              "WEFT_IB_QPS_PER_PEER)", st->port.dev, npeers, nqp, scqe, rcqe, da->max_cqe);
    st->scq = st->ibv.create_cq(st->ctx, (int)scqe, NULL, NULL, 0);
    st->rcq = st->scq ? st->ibv.create_cq(st->ctx, (int)rcqe, NULL, NULL, 0) : NULL;
    if (st->rcq == NULL)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "ib: %s: ibv_create_cq (%lld entries) failed: %s",
                              st->port.dev, st->scq ? rcqe : scqe, strerror(errno));

    st->reg_ops.ctx = st;
    st->reg_ops.reg = ib_reg_cb;
    st->reg_ops.dereg = ib_dereg_cb;
    rc = weft_regcache_create(&st->reg_ops, core->cfg.ib_reg_cache, &st->regcache);
    if (rc != WEFT_SUCCESS)
        return weft_set_error(core, rc, "ib: cannot create the registration cache");

    st->peers = calloc((size_t)npeers, sizeof(*st->peers));
    st->by_rank = calloc((size_t)core->size, sizeof(*st->by_rank));
    if (st->peers == NULL || st->by_rank == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "ib: no memory for %d peers", npeers);
    for (int r = 0; r < core->size; r++) {
        if (r == core->rank || !env->uses[r])
            continue;
        struct ib_peer *pe = &st->peers[st->npeers++];
        pe->st = st;
        pe->rank = r;
        weft_list_init(&pe->sfree);
        weft_list_init(&pe->pushes);
        rc = peer_setup(st, pe);
        if (rc != WEFT_SUCCESS)
            return rc;
    }
    return WEFT_SUCCESS;
}

int weft_ib_connect(const struct weft_tp_env *env, void *ctx)
{
    struct ib_state *st = ctx;
    struct weft_core *core = env->core;
    struct ib_pair_rec *out = NULL, *in = NULL;
    int npeers = 0, rc = WEFT_SUCCESS, arc;

    /* No pair of the comm uses ib: no exchange (every rank sees the same
     * cards, so every rank skips it), and the device is given back. */
    if (!env->used_anywhere) {
        if (st)
            ib_release(st);
        return WEFT_SUCCESS;
    }

    for (int r = 0; r < core->size; r++)
        if (r != core->rank && env->uses[r])
            npeers++;
    if (npeers > 0 && (st == NULL || st->ctx == NULL))
        rc = weft_set_error(core, WEFT_ERR_INTERNAL, "ib: %d peers chose ib but this rank has no device open",
                            npeers);
    if (rc == WEFT_SUCCESS && npeers > 0)
        rc = local_setup(env, st, npeers);

    size_t nranks = core->size > 0 ? (size_t)core->size : 1;
    out = calloc(nranks, sizeof(*out));
    in = calloc(nranks, sizeof(*in));
    if (out == NULL || in == NULL) {
        /* Without buffers this rank cannot take part in the exchange; MPI
         * then fails the Alltoall on every rank instead of hanging it. */
        free(out);
        free(in);
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "ib: no memory for the connection records of %d ranks",
                              core->size);
    }
    if (rc == WEFT_SUCCESS)
        for (int i = 0; i < (st ? st->npeers : 0); i++)
            rec_fill(st, &st->peers[i], &out[st->peers[i].rank]);

    /* The one exchange: made whatever happened above, so that every rank
     * makes the same collective calls; failures are agreed by the caller. */
    arc = env->coll->alltoall(env->coll->arg, out, in, sizeof(*out));
    if (arc != WEFT_SUCCESS && rc == WEFT_SUCCESS)
        rc = weft_set_error(core, arc, "ib: the alltoall of the QP numbers (bootstrap) failed");

    for (int i = 0; rc == WEFT_SUCCESS && st && i < st->npeers; i++)
        rc = peer_connect(st, &st->peers[i], &in[st->peers[i].rank]);
    free(out);
    free(in);
    if (rc != WEFT_SUCCESS)
        return rc;   /* the caller unwinds with destroy */
    if (st && st->npeers == 0) {
        /* Other pairs use ib, none of this rank's: give the device back. */
        ib_release(st);
        return WEFT_SUCCESS;
    }
    for (int i = 0; st && i < st->npeers; i++) {
        st->by_rank[st->peers[i].rank] = &st->peers[i];
        st->peers[i].connected = 1;
        st->nlive++;
    }
    return WEFT_SUCCESS;
}

#else
typedef int weft_ib_conn_unused;
#endif /* WEFT_HAVE_VERBS_HEADERS */
