/*
 * ib transport internals, shared by p2p/ib.c (frames, credits, rendezvous,
 * completions, errors: the data path and the vtable) and p2p/ib_conn.c
 * (card, device set-up, QP connection, teardown). The protocol is
 * described at the top of p2p/ib.c.
 */
#ifndef WEFT_IB_H
#define WEFT_IB_H

#ifdef WEFT_HAVE_VERBS_HEADERS
#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "ib_dev.h"
#include "ibvwrap.h"
#include "pipe.h"
#include "regcache.h"

#define IB_MAX_QPS        16
#define IB_CQ_BATCH       32
#define IB_CQ_PASSES      8        /* batches per CQ per progress call: bounds one call's work */
#define IB_ONE_GIB        ((uint64_t)1 << 30)
#define IB_INLINE_WANT    256      /* inline bytes asked for per QP (fits a CREDIT frame and small CTRL ones) */
#define IB_REC_MAGIC      0x31424977u  /* "wIB1" */
#define IB_MIN_DEPTH      3        /* receive WRs per QP the credit scheme needs (ib.c header) */

enum { IB_FRAME_CTRL = 1, IB_FRAME_CREDIT = 2 };

/* Frame flags. */
#define IB_FRAME_F_CTS_EXT 0x1   /* the payload is this transport's struct ib_cts_ext */

struct ib_frame_hdr {
    uint8_t  type;
    uint8_t  ncr;        /* entries of cr[] that are meaningful (the pair's QP count) */
    uint16_t flags;      /* IB_FRAME_F_* */
    uint32_t len;        /* CTRL: payload bytes after the weft_ctrl */
};

#define IB_CR_OFF     sizeof(struct ib_frame_hdr)
#define IB_CTRL_OFF   (IB_CR_OFF + IB_MAX_QPS * sizeof(uint16_t))
#define IB_PAYLOAD_OFF (IB_CTRL_OFF + sizeof(struct weft_ctrl))
#define IB_CREDIT_FRAME_BYTES IB_CTRL_OFF

/* What a CTS frame carries beyond the pipe's header. */
struct ib_cts_ext {
    uint64_t addr;       /* receive buffer */
    uint64_t len;        /* bytes expected */
    uint32_t rkey;
    uint32_t slot;       /* immediate the last write on each QP carries */
};

/* Per-pair set-up record (MPI_Alltoall): what I tell the peer about my side
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
    struct ib_wr    *next;       /* QP FIFO link */
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
    struct ib_wr     wr;
    unsigned char   *mem;
    struct ib_sbuf  *next_free;
};

/* One receive WR; its address is the WR's wr_id. */
struct ib_rbuf {
    struct ib_qp    *qp;
    unsigned char   *mem;
    uint32_t         len;
};

struct ib_qp {
    struct ibv_qp   *qp;
    struct ib_peer  *pe;
    unsigned         idx;
    uint32_t         psn;
    int              sq_depth;
    int              sq_out;        /* posted, completion not yet polled */
    int              credits;       /* receive WRs the peer has posted for us, unconsumed */
    int              owed;          /* my reposted receive WRs not yet announced */
    int              owed_traffic;  /* of those, consumed by real traffic (not CREDIT frames) */
    uint32_t         max_inline;
    struct ib_wr    *head, *tail;   /* waiting for room or a credit */
    struct ib_rbuf  *rbufs;
    int              nrbufs;
};

/* A receive expecting a push: found by the immediate of the writes. */
struct ib_slot {
    struct weft_request *req;       /* NULL: free */
    struct weft_reg     *reg;
    unsigned             imm_expected, imm_got;
    int                  next_free;
};

/* One rndv_push: the writes of one message. */
struct ib_push {
    struct ib_push      *prev, *next;
    struct ib_peer      *pe;
    struct weft_request *req;       /* NULL once the pipe forgot it (abort) */
    struct weft_reg     *reg;
    uint32_t             rkey;
    uint32_t             slot;        /* the receiver's: immediate of the last write on each QP */
    uint64_t             nwr, outstanding, unposted;
    int                  failed;
    struct ib_wr         wrs[];
};

struct ib_state;

/* How a registration cache entry was pinned (p2p/ib_gdr.c). */
enum { IB_REG_HOST = 0, IB_REG_DMABUF, IB_REG_PEERMEM };

/* What the registration cache's reg op returns as the entry's handle. */
struct ib_mr {
    struct ibv_mr *mr;
    int            how;        /* IB_REG_* */
    uint64_t       buffer_id;  /* device memory: CUDA buffer id of the allocation registered; else 0 */
};

struct ib_peer {
    struct ib_state     *st;
    struct weft_pipe    *pipe;
    int                  rank;
    int                  dead;        /* pipe broken: QPs in error, completions absorbed */
    int                  connected;   /* tp_peer set */
    struct ib_qp         qps[IB_MAX_QPS];
    unsigned             nqp_created;
    unsigned             nqp;         /* used by the pair: min of both sides */
    unsigned char       *mem;         /* receive buffers of QP 0, send buffers, sink */
    size_t               mem_bytes;
    struct ibv_mr       *mr;
    struct ib_rbuf      *rbufs;       /* [nqp_created * recv_posted] */
    struct ib_sbuf      *sbufs;
    int                  nsbufs, nsfree;
    struct ib_sbuf      *sfree;
    uint64_t             chunk;       /* bytes per write for this pair */
    uint32_t             peer_frame_max;
    struct ib_slot      *slots;
    int                  nslots, slot_free;
    struct ib_push      *push_head, *push_tail;
    unsigned             push_rr;
    const struct weft_ctrl *cts_m;    /* the CTS being delivered, and what it carried */
    struct ib_cts_ext    cts_ext;
};

struct ib_state {
    struct weft_comm       *c;
    struct weft_ibv         ibv;
    int                     loaded;
    struct ibv_context     *ctx;
    struct ibv_device_attr  dattr;
    struct ib_port_choice   port;
    struct ibv_pd          *pd;
    struct ibv_cq          *scq, *rcq;
    struct weft_reg_ops     reg_ops;
    struct ib_peer         *peers;    /* [npeers] */
    int                     npeers;
    size_t                  frame_max;
    int                     sq_depth, recv_posted;
    int                     drain;    /* weft_comm_destroy is draining: return every owed credit */
    /* GPUDirect RDMA (p2p/ib_gdr.c): which ways of registering device
     * memory worked on the test allocation at create; gdr = either did and
     * WEFT_IB_GDR is not 0 (what the rank card says) */
    int                     gdr, gdr_dmabuf, gdr_peermem;
    char                    gdr_why[256];   /* why not, when gdr == 0 */
    uint64_t                gdr_regs[3];    /* registrations so far, by IB_REG_* */
};

static inline struct ib_state *ib_state(const struct weft_comm *c)
{
    return (struct ib_state *)c->tp_state[WEFT_TP_IB];
}

/* Explicit credit return from this many owed on one QP (>= 2, see header). */
static inline int ib_credit_threshold(int depth)
{
    int t = depth / 2;
    return t < 2 ? 2 : t;
}

static inline const char *peer_host(const struct ib_peer *pe)
{
    return pe->st->c->cards ? pe->st->c->cards[pe->rank].hostname : "?";
}

/* ---- p2p/ib_conn.c ---- */

int  weft_ib_card_fill(struct weft_comm *c, struct weft_rank_card *mine);
int  weft_ib_connect(struct weft_comm *c);
void weft_ib_disconnect(struct weft_comm *c);
/* Posts one receive buffer (again). 0, or the errno of ibv_post_recv. */
int  weft_ib_post_recv(struct ib_rbuf *rb);

/* ---- p2p/ib_gdr.c ---- */

/* card_fill, once the PD exists: decides st->gdr (WEFT_IB_GDR, the probe of
 * src/gdr.c, a test allocation registered and deregistered) and logs it. */
void ib_gdr_setup(struct weft_comm *c, struct ib_state *st);
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

/* ---- p2p/ib.c ---- */

/* Frees a push and releases its registration (no request is touched). */
void weft_ib_push_free(struct ib_push *ps);
/* Frees receive slot i and releases its registration. */
void weft_ib_slot_release(struct ib_peer *pe, int i);

#endif /* WEFT_HAVE_VERBS_HEADERS */
#endif
