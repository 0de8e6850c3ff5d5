/*
 * Pipes: one per peer. The pipe owns ordering (FIFO per (peer, tag)),
 * matching of sends to posted receives, the choice of eager vs rendezvous,
 * truncation and completion. Transports (transport.h) only move bytes.
 */
#ifndef WEFT_PIPE_H
#define WEFT_PIPE_H

#include <stddef.h>
#include <stdint.h>
#include "weft.h"
#include "transport.h"

/* Wire header of every control message, identical on all transports. */
enum weft_ctrl_type {
    WEFT_CTRL_EAGER = 1,  /* tag, seq, bytes; payload follows */
    WEFT_CTRL_RTS   = 2,  /* tag, seq, bytes, sreq, addr (sender buffer, for a pull) */
    WEFT_CTRL_CTS   = 3,  /* sreq, rreq, status: push into rreq (or fail with status) */
    WEFT_CTRL_FIN   = 4,  /* sreq, status: receiver pulled the data (or refused it) */
    WEFT_CTRL_TRANSPORT_BASE = 16 /* types >= this are a transport's own (e.g. shm DATA) */
};

/* weft_ctrl.flags */
#define WEFT_CTRL_F_DEVICE  0x01  /* EAGER/RTS: the sender's buffer is CUDA device memory */
#define WEFT_CTRL_F_STAGED  0x02  /* CTS: data follows as staged chunks on an internal lane (p2p/stage.c) */
#define WEFT_CTRL_F_IPC     0x04  /* CTS: payload is a CUDA IPC export of the receive buffer (p2p/cuda_ipc.c) */
/* Device fields (p2p/stage.c, p2p/cuda_ipc.h, docs/cuda.md):
 *   RTS with F_DEVICE:  reserved = the sender's device ordinal of its buffer,
 *                       reserved2 = the sender's staging chunk (bytes), 0 = any.
 *   CTS with F_STAGED:  addr = lane index k (chunks travel on tag
 *                       weft_stage_tag(k), p2p/stage.h), reserved2 = chunk bytes.
 *   FIN with F_IPC:     sent by the SENDER after an IPC copy (p2p/cuda_ipc.c);
 *                       rreq (and sreq) name the receiver's request, status
 *                       its result. */

struct weft_ctrl {
    uint8_t  type;
    uint8_t  flags;
    uint16_t reserved;
    int32_t  status;      /* WEFT_* code carried by CTS/FIN */
    int32_t  tag;
    uint32_t reserved2;
    uint64_t seq;         /* per-pipe send sequence of the message */
    uint64_t bytes;       /* message size */
    uint64_t sreq;        /* sender's request id */
    uint64_t rreq;        /* receiver's request id */
    uint64_t addr;        /* RTS: sender's buffer address (pull protocols) */
};

enum weft_req_type { WEFT_REQ_SEND = 1, WEFT_REQ_RECV = 2 };
enum weft_dev_path {
    WEFT_DEV_PATH_NONE = 0,  /* host path (or not decided yet) */
    WEFT_DEV_PATH_STAGED,    /* chunks through pinned host slots (p2p/stage.c) */
    WEFT_DEV_PATH_IPC        /* CUDA IPC copy (p2p/cuda_ipc.c) */
};
enum weft_req_state {
    WEFT_REQ_QUEUED = 0,   /* send waiting for room on the transport */
    WEFT_REQ_POSTED,       /* recv posted / send's RTS out, waiting for the peer */
    WEFT_REQ_ACTIVE,       /* rendezvous data moving */
    WEFT_REQ_DONE
};

struct weft_request {
    struct weft_comm    *comm;
    struct weft_pipe    *pipe;
    int                  type;     /* enum weft_req_type */
    int                  state;    /* enum weft_req_state */
    int                  tag;
    int                  rndv;     /* send: went out as RTS */
    void                *buf;      /* recv: user buffer (send: the same pointer, const) */
    size_t               bytes;    /* send: message size; recv: buffer size */
    size_t               msg_bytes;/* recv: size of the matched message */
    uint64_t             seq;
    uint64_t             peer_req; /* rendezvous: the peer's request id */
    weft_status_t        status;
    int                  mem_kind; /* enum weft_mem_kind (src/cudawrap.h) of buf */
    int                  mem_device; /* CUDA device ordinal of buf, -1 for host memory */
    void                *dev_state;  /* device paths (stage.c, cuda_ipc.c): per-request state */
    int                  dev_path;   /* enum weft_dev_path: how a rendezvous with a device side moves */
    struct weft_request *next, *prev;  /* pipe queue links (lane or outbound) */

    /* Transport scratch, owned by the pipe's transport while ACTIVE. */
    size_t               tp_done;  /* bytes moved so far */
    size_t               tp_aux[4];
    struct weft_request *tp_next;
};

/* A FIFO of requests (intrusive). */
struct weft_req_queue { struct weft_request *head, *tail; size_t count; };

/* A received message no receive was posted for yet. */
struct weft_unexpected {
    struct weft_ctrl         hdr;      /* EAGER or RTS header */
    void                    *payload;  /* EAGER: copy of the data (malloc), else NULL */
    struct weft_unexpected  *next;
};

/* Everything for one (peer, tag): posted receives and unexpected messages. */
struct weft_lane {
    int                      tag;
    struct weft_req_queue    posted;
    struct weft_unexpected  *unexp_head, *unexp_tail;
    struct weft_lane        *hash_next;
};

/* A queued outbound control message (CTS/FIN) or a queued send request. */
struct weft_outbound {
    struct weft_ctrl         hdr;
    struct weft_request     *req;      /* non-NULL: a send (EAGER payload / RTS) */
    void                    *payload;  /* control payload (e.g. CTS with F_IPC), malloc'ed copy */
    size_t                   len;
    struct weft_outbound    *next;
};

struct weft_pipe {
    struct weft_comm                *comm;
    int                              peer;
    const struct weft_transport     *tp;
    void                            *tp_peer;      /* transport's per-peer state */
    uint64_t                         send_seq;
    uint64_t                         recv_seq;
    size_t                           eager_limit;
    size_t                           eager_limit_internal; /* for negative (library) tags */

    struct weft_lane               **lanes;        /* hash by tag */
    size_t                           lane_buckets;
    size_t                           lane_count;

    struct weft_outbound            *out_head, *out_tail;  /* waiting for ctrl_send room, FIFO */
    struct weft_req_queue            inflight;     /* sends/recvs waiting on the peer (for abort) */

    int                              broken;       /* WEFT_* code once the pipe failed, else 0 */
    uint32_t                         stage_lane_next; /* next staged-transfer lane index (receiver side) */
};

/* ---- used by the public API (p2p/api.c) and collectives ---- */

/* Starts a send/recv on the pipe to peer. tag may be negative here (internal
 * lanes of collectives); the public API rejects negative tags first.
 * Caller holds the comm lock. On success *out is the new request. */
int  weft_pipe_isend(struct weft_comm *c, const void *buf, size_t bytes, int peer, int tag,
                     struct weft_request **out);
int  weft_pipe_irecv(struct weft_comm *c, void *buf, size_t bytes, int peer, int tag,
                     struct weft_request **out);
/* The same for a buffer of a known memory kind (enum weft_mem_kind,
 * src/cudawrap.h) on CUDA device `device` (-1: host): the public calls
 * classify the buffer once and pass the result here. */
int  weft_pipe_isend_mem(struct weft_comm *c, const void *buf, size_t bytes, int peer, int tag,
                         int mem_kind, int device, struct weft_request **out);
int  weft_pipe_irecv_mem(struct weft_comm *c, void *buf, size_t bytes, int peer, int tag,
                         int mem_kind, int device, struct weft_request **out);

int  weft_pipe_init(struct weft_comm *c, struct weft_pipe *p, int peer);
void weft_pipe_fini(struct weft_pipe *p);

/* Retries queued outbound messages; returns the number sent. */
int  weft_pipe_flush(struct weft_pipe *p);

/* Breaks the pipe: every request of this pipe completes with err. */
void weft_pipe_break(struct weft_pipe *p, int err);

/* Sends a control message (CTS/FIN, with an optional payload of len bytes,
 * copied) now, or queues it behind earlier ones; a failure breaks the pipe.
 * For the device paths (p2p/stage.c, p2p/cuda_ipc.c). */
void weft_pipe_send_ctrl(struct weft_pipe *p, const struct weft_ctrl *h, const void *payload, size_t len);

/* Nonzero when a buffer of this kind is CUDA device (or managed) memory:
 * the transports never touch such a buffer with host code. */
static inline int weft_mem_is_device(int mem_kind) { return mem_kind >= 2; /* WEFT_MEM_DEVICE, WEFT_MEM_MANAGED */ }

/* Frees the lane of tag when nothing is posted or waiting on it (the
 * per-message lanes of staged transfers, p2p/stage.c). */
void weft_pipe_lane_release(struct weft_pipe *p, int tag);

/* ---- called by transports ---- */

/* A control message arrived from the pipe's peer (payload: EAGER data). */
void weft_pipe_on_ctrl(struct weft_pipe *p, const struct weft_ctrl *m, const void *payload, size_t len);
/* The push into r finished (err = WEFT_SUCCESS or a failure). */
void weft_pipe_recv_done(struct weft_pipe *p, struct weft_request *r, int err);
/* The push of s finished. */
void weft_pipe_send_done(struct weft_pipe *p, struct weft_request *s, int err);
/* Request id on the wire <-> request. */
static inline uint64_t weft_req_id(const struct weft_request *r) { return (uint64_t)(uintptr_t)r; }
static inline struct weft_request *weft_req_from_id(uint64_t id) { return (struct weft_request *)(uintptr_t)id; }

/* Queue helpers. */
void weft_req_queue_push(struct weft_req_queue *q, struct weft_request *r);
struct weft_request *weft_req_queue_pop(struct weft_req_queue *q);
void weft_req_queue_remove(struct weft_req_queue *q, struct weft_request *r);

#endif
