/*
 * ib transport internals, shared by ib.c (frames, credits, rendezvous,
 * completions, errors: the data path and the vtable), ib_conn.c (create,
 * device set-up, QP connection, teardown), ib_dev.c (port choice) and
 * ib_gdr.c (registration, GPUDirect RDMA). The protocol is described at
 * the top of ib.c.
 *
 * The rank card blob (struct ib_card) has no verbs types: it exists in
 * builds without the verbs headers too, where the transport only says
 * "not offered".
 */
#ifndef WEFT_IB_H
#define WEFT_IB_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

/* This transport's blob in every rank card: the port the rank uses (QP
 * numbers are exchanged per pair in connect). Zero (ib_dev "") = ib not
 * offered by that rank. */
struct ib_card {
    char     ib_dev[32];      /* device name; "" = ib not offered */
    uint8_t  ib_port;
    uint8_t  ib_link_layer;   /* IBV_LINK_LAYER_INFINIBAND (1) / ETHERNET (2) */
    uint8_t  ib_mtu;          /* enum ibv_mtu of the port (active_mtu) */
    uint8_t  ib_gid_index;
    uint16_t ib_lid;
    uint8_t  ib_gid[16];
    /* 1 = this rank registers CUDA device memory with its NIC (GPUDirect
     * RDMA, ib_gdr.c); a pair moves device data by RDMA only when both say
     * so (rndv_mem) */
    uint8_t  ib_gdr;
    uint8_t  ib_pad;
};

/* The card is exchanged as raw bytes between builds of one version: its
 * size is part of the bootstrap protocol. */
_Static_assert(sizeof(struct ib_card) == 56, "ib rank card blob size changed");
#define IB_CARD_BYTES ((sizeof(struct ib_card) + 7) & ~(size_t)7)
_Static_assert(sizeof(struct ib_card) <= IB_CARD_BYTES, "struct ib_card must fit card_bytes");

extern const struct weft_transport weft_transport_ib;

#ifdef WEFT_HAVE_VERBS_HEADERS

#include "ib_dev.h"
#include "ibvwrap.h"
#include "list.h"
#include "regcache.h"

#define IB_MAX_QPS        16
#define IB_CQ_BATCH       32
#define IB_CQ_PASSES      8        /* batches per CQ per progress call: bounds one call's work */
#define IB_ONE_GIB        ((uint64_t)1 << 30)
#define IB_INLINE_WANT    256      /* inline bytes asked for per QP (fits a CREDIT frame and small CTRL ones) */
#define IB_REC_MAGIC      0x31424977u  /* "wIB1" */
#define IB_MIN_DEPTH      3        /* receive WRs per QP the credit scheme needs (ib.c header) */

enum { IB_FRAME_CTRL = 1, IB_FRAME_CREDIT = 2 };

struct ib_frame_hdr {
    uint8_t  type;
    uint8_t  ncr;        /* entries of cr[] that are meaningful (the pair's QP count) */
    uint16_t flags;      /* none defined: 0 */
    uint32_t len;        /* CTRL: bytes of the pipe's frame after the credits */
};

#define IB_CR_OFF     sizeof(struct ib_frame_hdr)
#define IB_CTRL_OFF   (IB_CR_OFF + IB_MAX_QPS * sizeof(uint16_t))   /* the pipe's frame starts here */
#define IB_CREDIT_FRAME_BYTES IB_CTRL_OFF

/* The rendezvous key: what rndv_expect writes and the CTS frame carries to
 * the sender's rndv_push (the old CTS extension of this transport). */
struct ib_rndv_key {
    uint64_t addr;       /* receive buffer */
    uint64_t len;        /* bytes expected */
    uint32_t rkey;
    uint32_t slot;       /* immediate the last write on each QP carries */
};
_Static_assert(sizeof(struct ib_rndv_key) == 24 && sizeof(struct ib_rndv_key) <= WEFT_TP_KEY_MAX,
               "ib rendezvous key layout changed");

/* Per-transfer state in weft_tp_xfer.priv (receive: the slot it holds). */
struct ib_xfer {
    uint64_t slot;       /* slot index + 1 while the receive holds a slot; 0: none */
};
WEFT_TP_PRIV_FITS(struct ib_xfer);

/* Per-pair set-up record (one alltoall): what I tell the peer about my side
 * of the pair. valid != IB_REC_MAGIC: this rank has no QPs for that pair. */
struct ib_pair_rec {
    uint32_t valid;
    uint32_t nqp;
    uint32_t qpn[IB_MAX_QPS];
    uint32_t psn[IB_MAX_QPS];
    uint32_t recv_posted;   /* receive WRs posted per QP: the peer's initial credits */
    uint32_t frame_max;     /* bytes of each receive buffer of QP 0 */
    uint64_t max_msg_sz;
    uint64_t chunk;         /* WEFT_IB_CHUNK of this rank */
    uint16_t lid;
    uint8_t  mtu;
    uint8_t  link_layer;
    uint32_t gid_index;
    uint8_t  gid[16];
};

struct ib_qp;
struct ib_push;
struct ib_peer;

enum { IB_WR_FRAME = 1, IB_WR_WRITE = 2 };

/* One send-queue work request; its address is the WR's wr_id. */
struct ib_wr {
    struct weft_qnode link;      /* the QP's FIFO (ib_qp.wrq) */
    struct ib_qp    *qp;
    uint8_t          kind;
    uint8_t          imm;        /* write: last of the message on its QP */
    uint8_t          credit;     /* frame: a CREDIT frame (not counted for the credit trigger) */
    uint32_t         len;
    uint64_t         laddr, raddr;
    struct ib_push  *push;       /* write */
    struct ib_sbuf  *sb;         /* frame */
};

struct ib_sbuf {
    struct ib_wr      wr;
    unsigned char    *mem;
    struct weft_list  free_link; /* ib_peer.sfree while free */
};

/* One receive WR; its address is the WR's wr_id. */
struct ib_rbuf {
    struct ib_qp    *qp;
    unsigned char   *mem;
    uint32_t         len;
};

struct ib_qp {
    struct ibv_qp    *qp;
    struct ib_peer   *pe;
    unsigned          idx;
    uint32_t          psn;
    int               sq_depth;
    int               sq_out;        /* posted, completion not yet polled */
    int               credits;       /* receive WRs the peer has posted for us, unconsumed */
    int               owed;          /* my reposted receive WRs not yet announced */
    int               owed_traffic;  /* of those, consumed by real traffic (not CREDIT frames) */
    uint32_t          max_inline;
    struct weft_queue wrq;           /* struct ib_wr waiting for room or a credit */
    struct ib_rbuf   *rbufs;
    int               nrbufs;
};

/* A receive expecting a push: found by the immediate of the writes. The
 * free slots are chained by index (next_free), not by pointer: the array
 * is realloc'ed as it grows. */
struct ib_slot {
    struct weft_tp_xfer *x;         /* NULL: free */
    struct weft_reg     *reg;
    unsigned             imm_expected, imm_got;
    int                  next_free;
};

/* One rndv_push: the writes of one message. */
struct ib_push {
    struct weft_list     link;      /* ib_peer.pushes */
    struct ib_peer      *pe;
    struct weft_tp_xfer *x;         /* NULL once the pipe forgot it (abort) */
    struct weft_reg     *reg;
    uint32_t             rkey;
    uint32_t             slot;        /* the receiver's: immediate of the last write on each QP */
    uint64_t             nwr, outstanding, unposted;
    int                  failed;
    struct ib_wr         wrs[];
};

struct ib_state;

/* How a registration cache entry was pinned (ib_gdr.c). */
enum { IB_REG_HOST = 0, IB_REG_DMABUF, IB_REG_PEERMEM };

/* What the registration cache's reg op returns as the entry's handle. */
struct ib_mr {
    struct ibv_mr *mr;
    int            how;        /* IB_REG_* */
    uint64_t       buffer_id;  /* device memory: CUDA buffer id of the allocation registered; else 0 */
};

struct ib_peer {
    struct ib_state     *st;
    int                  rank;
    int                  dead;        /* pipe broken: QPs in error, completions absorbed */
    int                  connected;   /* reachable through st->by_rank */
    struct ib_qp         qps[IB_MAX_QPS];
    unsigned             nqp_created;
    unsigned             nqp;         /* used by the pair: min of both sides */
    unsigned char       *mem;         /* receive buffers of QP 0, send buffers, sink */
    size_t               mem_bytes;
    struct ibv_mr       *mr;
    struct ib_rbuf      *rbufs;       /* [nqp_created * recv_posted] */
    struct ib_sbuf      *sbufs;
    int                  nsbufs, nsfree;
    struct weft_list     sfree;       /* free send buffers (struct ib_sbuf), last freed first */
    uint64_t             chunk;       /* bytes per write for this pair */
    uint32_t             peer_frame_max;
    struct ib_slot      *slots;
    int                  nslots, slot_free;
    struct weft_list     pushes;      /* struct ib_push, oldest first */
    unsigned             push_rr;
};

struct ib_state {
    const struct weft_tp_env *env;    /* cards, upcalls (valid until destroy) */
    const void             *reg_buf;  /* during ib_reg_acquire: the buffer whose page range is registered */
    struct weft_core       *core;     /* rank, size, cfg, cuda, errors */
    struct weft_ibv         ibv;
    int                     loaded;
    struct ibv_context     *ctx;
    struct ibv_device_attr  dattr;
    struct ib_port_choice   port;
    struct ibv_pd          *pd;
    struct ibv_cq          *scq, *rcq;
    struct weft_reg_ops     reg_ops;
    /* RDMA registrations (transfers and mem_pin), made by connect when this
     * rank has ib peers; NULL otherwise (mem_pin then does nothing) */
    struct weft_regcache   *regcache;
    struct ib_peer         *peers;    /* [npeers] */
    int                     npeers;
    struct ib_peer        **by_rank;  /* [size]: the connected peer of each rank, NULL: none */
    int                     nlive;    /* connected peers not aborted (wakeless) */
    size_t                  frame_max;
    int                     sq_depth, recv_posted;
    int                     drain;    /* weft_comm_destroy is draining: return every owed credit */
    /* GPUDirect RDMA (ib_gdr.c): which ways of registering device memory
     * worked on the test allocation at create; gdr = either did and
     * WEFT_IB_GDR is not 0 (what the rank card says) */
    int                     gdr, gdr_dmabuf, gdr_peermem;
    char                    gdr_why[256];   /* why not, when gdr == 0 */
    uint64_t                gdr_regs[3];    /* registrations so far, by IB_REG_* */
};

/* Explicit credit return from this many owed on one QP (>= 2, see header). */
static inline int ib_credit_threshold(int depth)
{
    int t = depth / 2;
    return t < 2 ? 2 : t;
}

static inline const char *peer_host(const struct ib_peer *pe)
{
    const struct weft_tp_cards *k = &pe->st->env->cards;
    return k->base ? weft_tp_card(k, pe->rank)->hostname : "?";
}

/* The peer's blob (after the card exchange). */
static inline const struct ib_card *peer_card(const struct ib_peer *pe)
{
    return (const struct ib_card *)weft_tp_blob(&pe->st->env->cards, pe->rank);
}

/* ---- ib_conn.c ---- */

int  weft_ib_create(const struct weft_tp_env *env, void *blob, void **ctx);
/* transport.h, probe: create's own steps outside a comm, then released. */
int  weft_ib_probe(struct weft_core *core, char *what, size_t len);
int  weft_ib_connect(const struct weft_tp_env *env, void *ctx);
void weft_ib_destroy(void *ctx);
/* Posts one receive buffer (again). 0, or the errno of ibv_post_recv. */
int  weft_ib_post_recv(struct ib_rbuf *rb);

/* ---- ib_gdr.c ---- */

/* create, once the PD exists: decides st->gdr (WEFT_IB_GDR, the probe of
 * src/core/gdr.c, a test allocation registered and deregistered) and logs it. */
void ib_gdr_setup(struct ib_state *st);
/* The registration cache's reg op: host memory with ibv_reg_mr, CUDA device
 * memory through dma-buf (else a peer-memory module). */
int  ib_reg_cb(void *ctx, uintptr_t addr, size_t len, void **handle, uint32_t *lkey, uint32_t *rkey, char *why,
               size_t whylen);
void ib_dereg_cb(void *ctx, void *handle);
/* weft_regcache_acquire for a transfer from/to buf (memory kind mem_kind):
 * a cached registration of device memory that was freed meanwhile (same
 * address, other CUDA buffer id) is dropped and the range registered anew. */
int  ib_reg_acquire(struct ib_state *st, const void *buf, size_t len, int mem_kind, struct weft_reg **out,
                    char *why, size_t whylen);

/* ---- ib.c ---- */

/* Frees a push and releases its registration (no transfer is touched). */
void weft_ib_push_free(struct ib_push *ps);
/* Frees receive slot i and releases its registration (its transfer is not
 * touched: it may be gone at teardown). */
void weft_ib_slot_release(struct ib_peer *pe, int i);

#endif /* WEFT_HAVE_VERBS_HEADERS */
#endif
