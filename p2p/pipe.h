/*
 * Pipes: one per peer. The pipe owns ordering (FIFO per (peer, tag)),
 * matching of sends to posted receives, the choice of eager vs rendezvous,
 * truncation and completion. Its carrier transport only moves bytes
 * (p2p/transport/transport.h); how a rendezvous moves is a path of
 * p2p/rndv.h. Everything here runs with the p2p lock held.
 */
#ifndef WEFT_PIPE_H
#define WEFT_PIPE_H

#include <stddef.h>
#include <stdint.h>
#include "list.h"
#include "request.h"
#include "transport.h"
#include "wire.h"

struct weft_p2p;

/* A received message no receive was posted for yet. */
struct weft_unexpected {
    struct weft_qnode        qn;
    struct weft_wire_hdr     hdr;      /* EAGER or RTS header (flag CHECK: check is set) */
    struct weft_p2p_check    check;
    void                    *payload;  /* EAGER: copy of the data (malloc), else NULL */
};

/* Everything for one (peer, tag): posted receives and unexpected messages. */
struct weft_lane {
    int                      tag;
    int                      refuse;   /* weft_pipe_lane_refuse: drop what arrives until a receive is posted */
    struct weft_list         posted;   /* requests (link) */
    struct weft_queue        unexp;    /* struct weft_unexpected */
    struct weft_list         hash;     /* bucket chain */
};

/* A queued outbound frame (CTS/FIN), or a queued send request. */
struct weft_outbound {
    struct weft_qnode        qn;
    struct weft_request     *req;      /* non-NULL: a send (its EAGER payload / RTS is built when it goes) */
    struct weft_wire_hdr     hdr;
    void                    *payload;  /* a CTS key, malloc'ed copy */
    size_t                   len;
};

/* A transport bound to a pipe: the entry and its per-comm instance. */
struct weft_tp_bound {
    const struct weft_transport *tp;
    void                        *ctx;
};

struct weft_peer_pipe {
    struct weft_p2p         *p2p;
    int                      peer;
    struct weft_tp_bound     carrier;      /* carries frames and (native path) rendezvous data */
    struct weft_tp_bound     mover;        /* a mover reaching the peer (tp NULL: none) */
    uint64_t                 send_seq;
    uint64_t                 recv_seq;
    size_t                   eager_limit;
    size_t                   eager_limit_internal; /* for negative (library) tags */

    struct weft_list        *buckets;      /* lanes hashed by tag */
    size_t                   nbuckets, nlanes;
    struct weft_lane        *lane_last;    /* the lane found last (most traffic stays on one tag), or NULL */

    struct weft_queue        out;          /* waiting for ctrl_send room, FIFO */
    struct weft_list         inflight;     /* sends/recvs waiting on the peer (for abort) */
    size_t                   ninflight;
    size_t                   rndv_sends;   /* of them, sends announced by RTS: the peer moves their data */

    int                      broken;       /* WEFT_* code once the pipe failed, else 0 */

    /* Flow control (wire.h): cost of messages sent / the peer reported
     * consumed; cost of the peer's messages we consumed / reported. */
    uint64_t                 fc_sent, fc_granted;
    uint64_t                 fc_consumed, fc_reported;
    int                      credit_owed;  /* a CREDIT could not go out yet (counted in out_queued) */

    /* Liveness (p2p/health.c). activity: frames other than heartbeats and
     * notices, and rendezvous data moved: what per-request timeouts watch.
     * heard: every frame, heartbeats too: whether the peer is alive. */
    uint64_t                 activity, heard, heard_seen;
    double                   heard_at, hb_at;
    int                      pid, pidfd;   /* same-host peers: their process (pidfd -1: none) */
    int                      same_host;
    int                      failed;       /* the peer is known failed (died, stopped, silent, aborted) */
    int                      link_down;    /* broken while the peer's process ran: a link failure, not the peer's */
    char                     fail_why[WEFT_WIRE_NOTICE_TEXT_MAX + 64]; /* "rank N failed: why" once failed */
    uint32_t                 stage_lane_next; /* next staged-transfer lane index (receiver side) */
    /* The peer's newest collective, as it answered our last COLL_ASK
     * (p2p/health.c): head_state 0 no answer yet, 1 head holds it, 2 it
     * had started none; head_at when the answer came, asked_at when we
     * last asked. */
    struct weft_p2p_check    head;
    int                      head_state;
    double                   head_at, asked_at;
};

int  weft_pipe_init(struct weft_p2p *p2p, struct weft_peer_pipe *p, int peer);
void weft_pipe_fini(struct weft_peer_pipe *p);

/* Starts a send/recv on the pipe (negative tags: internal lanes). mem_kind
 * and device describe buf (classified by the caller). */
int  weft_pipe_isend(struct weft_peer_pipe *p, const void *buf, size_t bytes, int tag, int mem_kind, int device,
                     const struct weft_p2p_check *check, struct weft_request **out);
/* A receive that consumes the next message of the lane whatever its size
 * and moves none of it (completes WEFT_SUCCESS; a rendezvous sender is
 * released with success). */
int  weft_pipe_idiscard(struct weft_peer_pipe *p, int tag, struct weft_request **out);
int  weft_pipe_irecv(struct weft_peer_pipe *p, void *buf, size_t bytes, int tag, int mem_kind, int device,
                     const struct weft_p2p_check *check, struct weft_request **out);
/* A vectored message of host memory (the carrier must have rndv_vectors,
 * else WEFT_ERR_UNSUPPORTED): niov pieces (1 .. WEFT_IOV_MAX, checked by
 * the caller) end to end; the array and the pieces stay the caller's and
 * must live until the request completes. A send always goes as a
 * rendezvous; a receive takes a vectored or a plain message alike. */
int  weft_pipe_isendv(struct weft_peer_pipe *p, const struct weft_iov *iov, uint32_t niov, int tag,
                      struct weft_request **out);
int  weft_pipe_irecvv(struct weft_peer_pipe *p, const struct weft_iov *iov, uint32_t niov, int tag,
                      struct weft_request **out);
/* A receive whose stream waits on device signal slot (slot, value): see
 * struct weft_tp_xfer's signal fields. */
int  weft_pipe_irecv_signal(struct weft_peer_pipe *p, void *buf, size_t bytes, int tag, int mem_kind, int device,
                            uint32_t slot, uint32_t value, struct weft_request **out);

/* Completes r with err without breaking the pipe when that is safe: a
 * receive not matched yet, or a send still in the outbound queue (it
 * leaves a placeholder that keeps the sequence). 1: done; 0: r is bound to
 * the peer (a send announced or moving, a receive moving data) and cannot
 * be withdrawn. */
int  weft_pipe_cancel(struct weft_request *r, int err);

/* A failed collective gives up its lanes: what waits unexpected on lane
 * tag, and what arrives there until a receive is posted on it again, is
 * dropped; an RTS is answered with a FIN carrying err, so the sender's
 * request completes instead of waiting for a receive that never comes. */
void weft_pipe_lane_refuse(struct weft_peer_pipe *p, int tag, int err);

/* The comm is revoked: every receive posted on one of the application's
 * lanes (weft_tag_revocable) and not matched yet completes with
 * WEFT_ERR_REVOKED, and those lanes refuse what arrives (an RTS's sender
 * gets a FIN with WEFT_ERR_REVOKED), as do lanes first used later
 * (on_message). Transfers already moving go on; the pipe stays up. */
void weft_pipe_revoke(struct weft_peer_pipe *p);

/* Sends a frame that takes no part in ordering or flow control (CREDIT,
 * HEARTBEAT, NOTICE) now; 0 or WEFT_EAGAIN / an error (nothing queued). */
int  weft_pipe_send_oob(struct weft_peer_pipe *p, const struct weft_wire_hdr *h, const void *payload, size_t len);

/* Retries queued outbound frames; returns the number sent. */
int  weft_pipe_flush(struct weft_peer_pipe *p);

/* Breaks the pipe: every request of this pipe completes with err. */
void weft_pipe_break(struct weft_peer_pipe *p, int err);

/* Sends a control frame now, or queues it behind earlier ones (payload
 * copied); a failure breaks the pipe. For the rendezvous paths. */
void weft_pipe_send_ctrl(struct weft_peer_pipe *p, const struct weft_wire_hdr *h, const void *payload, size_t len);

/* Completes r with err (status filled). */
void weft_pipe_complete(struct weft_request *r, int err);
/* r leaves the inflight list and completes. */
void weft_pipe_finish_inflight(struct weft_peer_pipe *p, struct weft_request *r, int err);
/* r joins the inflight list as ACTIVE. */
void weft_pipe_activate(struct weft_peer_pipe *p, struct weft_request *r);

/* Frees the lane of tag when nothing is posted or waiting on it (the
 * per-message lanes of staged transfers). */
void weft_pipe_lane_release(struct weft_peer_pipe *p, int tag);

/* A frame arrived from the pipe's peer (the carrier's on_ctrl upcall). */
void weft_pipe_on_frame(struct weft_peer_pipe *p, const void *frame, size_t len);

/* Nonzero when a buffer of this kind is CUDA device (or managed) memory:
 * nothing but CUDA touches such a buffer. */
static inline int weft_mem_is_device(int mem_kind) { return mem_kind >= 2; /* WEFT_MEM_DEVICE, WEFT_MEM_MANAGED */ }

static inline const char *weft_pipe_tp_name(const struct weft_peer_pipe *p)
{
    return p->carrier.tp ? p->carrier.tp->name : "none";
}

#endif
