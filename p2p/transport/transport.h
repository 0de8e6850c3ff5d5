/*
 * The transport contract.
 *
 * A transport moves bytes between this process and the peers the comm
 * assigned to it; the pipe (p2p/pipe.c) owns everything else: matching,
 * ordering, eager vs rendezvous, truncation, completion. One file per
 * transport implements this table: self.c, shm.c, tcp.c, ib.c.
 *
 * Threading: every function below but sleep is called with the comm lock
 * held, so a transport needs no locking of its own for its per-comm state.
 * None of them may block: anything that cannot be done now returns
 * WEFT_EAGAIN and the caller retries on a later progress call.
 *
 * Re-entrancy: weft_pipe_on_ctrl (called from progress) may call back into
 * the same transport (ctrl_send to answer CTS/FIN, rndv_get, rndv_expect,
 * rndv_push), so progress must be in a consistent state around each call
 * (e.g. release the ring record first, or copy what it still needs).
 *
 * The pipe protocol a transport must carry (struct weft_ctrl, p2p/pipe.h):
 *   EAGER  header + payload            sender -> receiver
 *   RTS    header (+ sender address)   sender -> receiver   large message announced
 *   CTS    header                      receiver -> sender   "push the data now"
 *   FIN    header                      receiver -> sender   receiver pulled it (or refused)
 * Control messages to one peer arrive in the order they were sent.
 * For a large message the receiver either pulls the data itself
 * (rndv_get: self memcpy, shm CMA) and answers FIN, or answers CTS and the
 * sender pushes it (rndv_push: shm bounce buffers, tcp data sockets) into
 * the buffer the receiver registered with rndv_expect. Pushes to one peer
 * are carried in the order the CTS messages were sent.
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"

struct weft_comm;
struct weft_pipe;
struct weft_request;
struct weft_ctrl;
struct weft_rank_card;

/* Internal return code: "no room now, retry later". Never returned to users. */
#define WEFT_EAGAIN (-11)

struct weft_transport {
    const char *name;
    int id;                           /* enum weft_transport_id */

    /* ---- set-up (the only place a transport may call MPI) ---- */

    /* Before the rank cards are exchanged: write what peers need to reach
     * this rank (segment name, listening address) into *mine. May allocate
     * per-comm state in c->tp_state[id]. Called on every rank whose
     * transports_mask allows this transport, even if no peer will use it;
     * the card's fields must be valid ("not offered") in that case. */
    int  (*card_fill)(struct weft_comm *c, struct weft_rank_card *mine);

    /* After the exchange, with pipe->tp set for every peer that uses this
     * transport: connect to those peers and set pipe->tp_peer. Called on
     * EVERY rank for EVERY transport of the build (shm, then tcp), also
     * where card_fill was not called (c->tp_state[id] == NULL: the rank
     * offers nothing and just takes part), so MPI_Barrier may be used --
     * but the number of barriers must not depend on success or failure, or
     * a failing rank would hang the others. The comm allreduces the result
     * afterwards. Errors name the peer. */
    int  (*connect)(struct weft_comm *c);

    /* weft_comm_destroy, after a barrier: release everything. Idempotent;
     * also called to unwind a failed connect. */
    void (*disconnect)(struct weft_comm *c);

    /* ---- data path ---- */

    /* Largest message the pipe sends as EAGER through ctrl_send. */
    size_t (*eager_limit)(const struct weft_comm *c);

    /* Sends one control message (header + optional payload of len bytes) to
     * the pipe's peer. All or nothing: returns WEFT_SUCCESS once the message
     * is owned by the transport (payload copied or sent, caller may reuse
     * it), WEFT_EAGAIN if there is no room now, another code if the peer is
     * unreachable (the pipe then breaks). */
    int  (*ctrl_send)(struct weft_pipe *p, const struct weft_ctrl *m,
                      const void *payload, size_t len);

    /* Moves what can be moved without blocking: receives control messages
     * and hands each to weft_pipe_on_ctrl(), advances pushes and expected
     * data. Returns the number of events (>= 0); 0 means nothing happened. */
    int  (*progress)(struct weft_comm *c);

    /* Receiver side, optional (NULL = always push). Pulls a matched large
     * message described by rts (m->addr, m->bytes) into r->buf. Returns
     * WEFT_SUCCESS when all bytes are in place (synchronous), WEFT_EAGAIN
     * to decline (the pipe answers CTS and the sender pushes), or an error
     * (the request fails and FIN carries the code). */
    int  (*rndv_get)(struct weft_pipe *p, struct weft_request *r, const struct weft_ctrl *rts);

    /* Receiver side: r (matched, r->msg_bytes set) will be filled by a push;
     * called when its CTS is queued, in CTS order. When the last byte is in
     * place the transport calls weft_pipe_recv_done(). */
    int  (*rndv_expect)(struct weft_pipe *p, struct weft_request *r);

    /* Sender side: the receiver answered CTS for s (cts->rreq names its
     * request); push s->sbuf[0..s->bytes). When the last byte has left the
     * user buffer the transport calls weft_pipe_send_done(). */
    int  (*rndv_push)(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts);

    /* The pipe broke (timeout, peer error): forget every request of this
     * pipe the transport still references; the pipe fails them. */
    void (*abort_pipe)(struct weft_pipe *p);

    /* Optional. Nonzero while the transport holds outbound bytes it has
     * accepted (ctrl_send returned SUCCESS) but not yet handed to the peer
     * or the kernel. weft_comm_destroy progresses until no transport is busy
     * before its final barrier, so nothing a peer waits for is dropped. */
    int  (*busy)(const struct weft_comm *c);

    /* ---- waiting ---- */

    /* Optional. Sleeps until this transport may have work or timeout_ms
     * passes, without losing a wake-up that races with going to sleep
     * (shm: futex on a doorbell in the segment; tcp: poll on sockets).
     * Returns at once if work is already pending. Called WITHOUT the comm
     * lock (another thread may progress meanwhile): touch only what is
     * stable after connect (fds, the mapped segment) and atomics. */
    void (*sleep)(struct weft_comm *c, int timeout_ms);
};

extern const struct weft_transport weft_transport_self;
extern const struct weft_transport weft_transport_shm;
extern const struct weft_transport weft_transport_tcp;
#ifdef WEFT_HAVE_VERBS_HEADERS
extern const struct weft_transport weft_transport_ib;   /* p2p/ib.c: only with the verbs headers */
#endif

/* By id; NULL for an id with no transport in this build. */
const struct weft_transport *weft_transport_get(int id);

#endif
