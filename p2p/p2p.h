/*
 * The pipe layer as the layers above see it (comm, stream, collectives,
 * api): a p2p context per comm, requests, and calls that take its lock
 * themselves. Everything else in p2p/ is private to p2p/.
 *
 * Tags: user tags are >= 0; negative tags are the library's own lanes,
 * allocated in one table (p2p/tags.h), so internal traffic never matches a
 * user receive. These calls accept both; src/api/ refuses negative user tags.
 */
#ifndef WEFT_P2P_H
#define WEFT_P2P_H

#include <stddef.h>
#include "weft.h"   /* weft_status_t, weft_request_t */
#include "iov.h"    /* struct weft_iov: vectored messages */

#include <stdint.h>

struct weft_core;
struct weft_p2p;
struct weft_request;

/* A collective's fingerprint: opaque to p2p, compared for equality. A
 * checked send carries it; a checked receive that meets a message whose
 * fingerprint differs completes with WEFT_ERR_MISMATCH (the message is
 * consumed) and weft_p2p_peer_check gives the sender's. */
struct weft_p2p_check { uint64_t w[3]; };
/* The call number a fingerprint belongs to: the upper 32 bits of w[0] (the
 * collectives number their calls alike on every rank; p2p compares these
 * to tell "the same call, another operation" from "another call"). */
static inline uint32_t weft_p2p_check_call(const struct weft_p2p_check *c)
{
    return (uint32_t)(c->w[0] >> 32);
}

/* Collectives are numbered in two spaces, each in call order: the blocking
 * and non-blocking calls, and the stream-ordered ones (src/stream). A
 * fingerprint of the second has WEFT_P2P_CHECK_STREAM in its kind field (the
 * low 16 bits of w[0]). A call key -- what failure notes, the census and
 * COLL_ASK go by -- is the call number with its space above it, so a
 * stream call's verdict never lands on the other space's call of the same
 * number. */
#define WEFT_P2P_CHECK_STREAM 0x8000u
static inline int weft_p2p_check_stream(const struct weft_p2p_check *c)
{
    return (c->w[0] & WEFT_P2P_CHECK_STREAM) != 0;
}
static inline uint64_t weft_p2p_call_key(uint32_t call, int stream)
{
    return (uint64_t)(stream != 0) << 32 | call;
}
static inline uint64_t weft_p2p_check_key(const struct weft_p2p_check *c)
{
    return weft_p2p_call_key(weft_p2p_check_call(c), weft_p2p_check_stream(c));
}

/* Starts a send/receive on the pipe to peer. The buffer's memory kind (host
 * or CUDA device) is looked up here; device memory on a comm without CUDA
 * is refused with WEFT_ERR_UNSUPPORTED. fn names the public call in errors. */
int  weft_p2p_isend(struct weft_p2p *p, const void *buf, size_t bytes, int peer, int tag,
                    struct weft_request **req, const char *fn);
int  weft_p2p_irecv(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag,
                    struct weft_request **req, const char *fn);
/* A receive whose CUDA stream waits on the device for signal slot (slot,
 * value) of src/core/signals.h (the stream engine): when its data comes by
 * CUDA IPC the sender's GPU writes the slot right after its copy.
 * value 0: an ordinary receive. */
/* Vectored messages of host memory: niov pieces (1 .. WEFT_IOV_MAX)
 * end to end, one rendezvous for all of them. Only where the pair's
 * carrier moves them (weft_p2p_vectors; else WEFT_ERR_UNSUPPORTED, nothing
 * started). iov and the pieces must live until the request completes. A
 * vectored receive takes a plain message too (and a plain receive a
 * vectored one), by total size. */
int  weft_p2p_vectors(struct weft_p2p *p, int peer);
int  weft_p2p_isendv(struct weft_p2p *p, const struct weft_iov *iov, size_t niov, int peer, int tag,
                     struct weft_request **req, const char *fn);
int  weft_p2p_irecvv(struct weft_p2p *p, const struct weft_iov *iov, size_t niov, int peer, int tag,
                     struct weft_request **req, const char *fn);
int  weft_p2p_irecv_signal(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag, uint32_t slot,
                           uint32_t value, struct weft_request **req, const char *fn);
/* weft_p2p_test that also says whether the peer's GPU wrote the receive's
 * signal slot (*signaled; 0 for any other path: the caller writes it). */
int  weft_p2p_test_signal(struct weft_request *r, int *done, weft_status_t *status, int *signaled);
/* Whether a device receive from peer may complete by the peer's GPU
 * writing (a mover moves device memory on that pipe). Lock-free: fixed
 * once the comm is connected. */
int  weft_p2p_signal_peer(struct weft_p2p *p, int peer);
/* On the caller's thread, before a stream-ordered call is queued: what the
 * pipes may need from CUDA for device buffers -- the staging slots, the
 * eager bounce buffer -- allocated now (each allocation waits for the
 * device: weft's progress thread must not make it while a stream waits on
 * weft). Cheap once done. */
void weft_p2p_prepare_device(struct weft_p2p *p);

/* Consumes the next message on (peer, tag) without moving its data,
 * whatever its size: completes WEFT_SUCCESS, and a rendezvous sender
 * completes with success too (message pipes drop unread messages so). */
int  weft_p2p_idiscard(struct weft_p2p *p, int peer, int tag, struct weft_request **req, const char *fn);
/* Start + wait + free under one lock hold. */
int  weft_p2p_send(struct weft_p2p *p, const void *buf, size_t bytes, int peer, int tag, const char *fn);
int  weft_p2p_recv(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag, weft_status_t *status,
                   const char *fn);

/* Completion. test: *done = 1 once complete, then the request is freed and
 * its code returned; wait: bounded by WEFT_TIMEOUT, frees; waitall: every
 * request (NULL entries count as done), frees them, sets reqs[i] = NULL,
 * returns the first error. statuses may be NULL. */
int  weft_p2p_test(struct weft_request *r, int *done, weft_status_t *status);
int  weft_p2p_wait(struct weft_request *r, weft_status_t *status);
int  weft_p2p_waitall(size_t n, struct weft_request **reqs, weft_status_t *statuses);

/* The user's requests (src/api/): the same, through handles (request.h):
 * a handle that names no outstanding request of a live comm, or one
 * repeated in a waitall, is refused with WEFT_ERR_INVALID_ARG before
 * anything is touched. waitall progresses every comm involved. */
int  weft_p2p_user_isend(struct weft_p2p *p, const void *buf, size_t bytes, int peer, int tag, weft_request_t **h,
                         const char *fn);
int  weft_p2p_user_irecv(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag, weft_request_t **h,
                         const char *fn);
int  weft_p2p_user_test(weft_request_t *h, int *done, weft_status_t *status);
int  weft_p2p_user_wait(weft_request_t *h, weft_status_t *status);
int  weft_p2p_user_waitall(size_t n, weft_request_t **hs, weft_status_t *statuses);

/* Requests of the layer above (non-blocking collectives): a handle like
 * weft_isend's (generation-checked, refused once completed), completed by
 * the upper layer's callbacks, which are called without the p2p lock and
 * by one thread at a time per request (the handle is claimed meanwhile). */
struct weft_p2p_upper_ops {
    /* Advances arg without blocking: 1 when complete (*err = its code; arg
     * is then the upper layer's to free), 0 when not yet. */
    int (*test)(void *arg, int *err);
    /* Blocks until complete (bounded by WEFT_TIMEOUT without progress);
     * returns its code; arg is then the upper layer's to free. */
    int (*wait)(void *arg);
};
int  weft_p2p_user_upper(struct weft_p2p *p, const struct weft_p2p_upper_ops *ops, void *arg, weft_request_t **h);
/* The application's wait hook (weft_comm_set_wait_hook): a client of the
 * comm's engine (p2p/engine.h) that runs fn(arg) in application threads
 * waiting on this comm while their wait is idle, lock released, at least
 * every millisecond. fn NULL: none. Any time. */
int  weft_p2p_set_wait_hook(struct weft_p2p *p, void (*fn)(void *arg), void *arg);
/* The comm's progress engine: the layers above register their clients. */
struct weft_engine *weft_p2p_engine(struct weft_p2p *p);
/* weft_comm_destroy, after the upper layer gave up its outstanding work:
 * UPPER requests never completed are failed (and counted by drain). */
/* Looks at r's per-request clock once (a test loop over r). */
void weft_p2p_watch(struct weft_request *r, const char *what);

/* Collectives' messages carry a fingerprint (struct weft_p2p_check). */
int  weft_p2p_isend_checked(struct weft_p2p *p, const void *buf, size_t bytes, int peer, int tag,
                            const struct weft_p2p_check *check, struct weft_request **req, const char *fn);
int  weft_p2p_irecv_checked(struct weft_p2p *p, void *buf, size_t bytes, int peer, int tag,
                            const struct weft_p2p_check *check, struct weft_request **req, const char *fn);
/* How the collectives put a fingerprint in words ("reduce(4 x int32, sum,
 * root 1)"), for the verdicts p2p writes about a stalled collective
 * receive (p2p/health.c). NULL: p2p writes the call number only. */
typedef void (*weft_p2p_check_describe_fn)(const struct weft_p2p_check *c, char *out, size_t n);
void weft_p2p_set_check_describe(struct weft_p2p *p, weft_p2p_check_describe_fn fn);
/* A receive that completed with WEFT_ERR_MISMATCH: the sender's fingerprint
 * (all zero: an unchecked message). */
void weft_p2p_peer_check(const struct weft_request *r, struct weft_p2p_check *out);
/* weft_p2p_test that also gives the sender's fingerprint of a receive that
 * completed with WEFT_ERR_MISMATCH (peer may be NULL). */
int  weft_p2p_test_check(struct weft_request *r, int *done, weft_status_t *status, struct weft_p2p_check *peer);
/* Withdraws r with err when nothing of the peer's is bound to it yet (see
 * weft_pipe_cancel): 1 done (r stays to be freed by test/wait), 0 not. */
int  weft_p2p_cancel(struct weft_request *r, int err);
/* A failed collective gives up lane (peer, tag): messages on it are dropped
 * (an RTS answered with a FIN carrying err) until a receive is posted there. */
void weft_p2p_refuse_lane(struct weft_p2p *p, int peer, int tag, int err);
/* weft_p2p_refuse_lane for every lane of collective call seq (tag(seq,
 * phase), every phase) from every peer: a call that failed without
 * messages of its own (node_coll.c) while a peer may have called it as
 * messages, whose sends then complete instead of waiting for an answer. */
void weft_p2p_refuse_call(struct weft_p2p *p, int (*tag)(unsigned seq, int phase), uint32_t seq, int phases, int err);
/* wait_done that returns WEFT_P2P_FAULT (-12) as soon as the fault epoch
 * moves past *stop_epoch (a rank failed, a collective failed elsewhere). */
#define WEFT_P2P_FAULT (-12)
int  weft_p2p_wait_done_until(struct weft_request *r, const char *what, const uint64_t *stop_epoch);
uint64_t weft_p2p_fault_epoch(struct weft_p2p *p);
/* Why the comm cannot run collective coll_seq: a notice about that call
 * from another rank, a failed rank, or abort; WEFT_SUCCESS: none. */
int  weft_p2p_fault(struct weft_p2p *p, uint64_t call, char *why, size_t whylen);
/* A collective that sends no checked message (the node-local ones,
 * collectives/node_coll.c) is this rank's newest call: what a peer asking
 * about a stalled collective receive is told (NOTICE COLL_ASK). */
void weft_p2p_coll_started(struct weft_p2p *p, const struct weft_p2p_check *c);
/* A wait with no request of its own (node_coll.c) saw nothing from peer
 * for WEFT_TIMEOUT: the peer's health as a stuck request would ask it. A
 * peer whose process ended or is stopped is declared failed (its pipe
 * broken, every peer told) and the code returned; a live one: WEFT_SUCCESS.
 * why says which (the probe's words). */
int  weft_p2p_peer_stuck(struct weft_p2p *p, int peer, char *why, size_t n);
/* Collective call (a call key, weft_p2p_call_key; a plain call number is
 * one) failed here (code, text): tell every live peer. */
void weft_p2p_coll_failed(struct weft_p2p *p, uint64_t call, int code, const char *text);
/* Whether collective seq's failure note is this rank's own verdict (its
 * census decided it, p2p/health.c) rather than a peer's notice. */
int  weft_p2p_coll_decided_here(struct weft_p2p *p, uint64_t call);
/* Progress until collective seq has a failure note (a peer's notice) or
 * another fault shows, at most bound_s; then weft_p2p_fault(seq). */
int  weft_p2p_await_note(struct weft_p2p *p, uint64_t call, double bound_s, char *why, size_t whylen);
/* weft_comm_revoke on this rank: any thread, idempotent (p2p/health.h,
 * weft_health_revoke). */
void weft_p2p_revoke(struct weft_p2p *p);
/* 1 and why ("the comm was revoked by rank N ...") once the comm is
 * revoked (here or by a peer's notice); 0 otherwise. */
int  weft_p2p_revoked(struct weft_p2p *p, char *why, size_t whylen);
/* Whether the pipe to peer is down (peer failed, or the link broke), and
 * why ("rank N failed: ..."); 0 while it works. */
int  weft_p2p_peer_down(struct weft_p2p *p, int peer, char *why, size_t whylen);
/* Whether this rank's link to peer broke while the peer's process ran
 * (p2p/health.c): a link failure, not a failed peer. */
int  weft_p2p_link_down(struct weft_p2p *p, int peer);
/* The links known broken between live ranks (this rank's, and those other
 * ranks announced): up to max pairs (a < b) into pairs; returns how many.
 * A comm keeps at most WEFT_P2P_LINKS_MAX. */
#define WEFT_P2P_LINKS_MAX 64
int  weft_p2p_known_links(struct weft_p2p *p, int (*pairs)[2], int max);
/* weft_comm_abort: any thread. */
void weft_p2p_abort(struct weft_p2p *p);

/* For a caller with no request of its own to wait on (weft_progress, the
 * message pipes' destroy): one progress pass and a look at the peers'
 * health (heartbeats; a dead peer's requests fail). Takes the lock.
 * Returns the number of events. */
int  weft_p2p_poll_health(struct weft_p2p *p);
/* Progress until nothing outbound is queued here (the pipes' queues, the
 * transports' buffers: frames waiting for room, a connection still being
 * made), at most bound_s. For a rank about to leave weft after a failure:
 * the notices it sent or passed on reach the others now, not at its next
 * call (over tcp a frame can wait for room or a connection). 1: flushed. */
int  weft_p2p_flush(struct weft_p2p *p, double bound_s);

/* The largest message on peer's pipe that goes eagerly on a library lane
 * (negative tag); fixed once the comm is connected. */
size_t weft_p2p_internal_eager(struct weft_p2p *p, int peer);
/* The pair's eager limit for the application's messages (and the message
 * pipes' data lane): above it a message is a rendezvous. */
size_t weft_p2p_eager(struct weft_p2p *p, int peer);

/* Nonzero once r completed (r stays valid until test/wait frees it). */
int  weft_p2p_done(const struct weft_request *r);
/* Waits until r completed, bounded by WEFT_TIMEOUT (the pipe of a stuck r
 * breaks: r completes with WEFT_ERR_TIMEOUT); does not free r. WEFT_SUCCESS
 * or WEFT_ERR_TIMEOUT. what names the caller in the timeout message. */
int  weft_p2p_wait_done(struct weft_request *r, const char *what);
/* A request of a collective that failed already, still bound to its peer:
 * waits for it, an announced send (RTS out, unanswered) to a live peer at
 * most bound_s. 1: r completed. 0: still unanswered -- the peer is outside
 * weft on this comm (behind, or it skipped the call); the caller leaves r
 * to its pipe, never frees it nor the memory it sends from (the peer
 * answers when it next calls weft on the comm: a refusing FIN, as its same
 * call fails on the failure notice; or a revoke's refusal). */
int  weft_p2p_wait_announced(struct weft_request *r, double bound_s, const char *what);
/* mem (malloc'd) is freed with the comm, after its transports: a request
 * left to its pipe (weft_p2p_wait_announced) may still send from it. */
void weft_p2p_keep(struct weft_p2p *p, void *mem);

/* The core context the p2p context was made with; the p2p context of a request. */
struct weft_core *weft_p2p_core(struct weft_p2p *p);
struct weft_p2p  *weft_p2p_of(const struct weft_request *r);

/* RDMA memory registration through every transport of the comm that pins
 * memory (weft_mem_register / weft_mem_deregister); others succeed doing nothing. */
int  weft_p2p_mem_pin(struct weft_p2p *p, const void *buf, size_t bytes);
int  weft_p2p_mem_unpin(struct weft_p2p *p, const void *buf, size_t bytes);



/* ---- set-up, driven by the comm (src/comm/comm.c) ---- */

struct weft_tp_collective;

/* The pipes, the request pool, the upcalls. */
int    weft_p2p_create(struct weft_core *core, struct weft_p2p **out);
/* Bytes of one rank card (header + every transport's blob). */
size_t weft_p2p_card_bytes(void);
/* Before the card exchange: cards holds every rank's header (card i at
 * cards + i * card_bytes, node already numbered). Creates the transports
 * this rank offers (allowed, and some peer may need them) and writes their
 * blobs into this rank's card. */
int    weft_p2p_offer(struct weft_p2p *p, unsigned char *cards);
/* After the exchange: picks each pair's carrier and mover (registry order,
 * reach()), tells every rank which transports some pair uses (one
 * alltoall, which also agrees on the choice), connects every transport
 * (each may run collectives of its own through coll), logs the choices at
 * info level. Collective: every rank calls it. Returns this rank's result
 * of the connects, NOT agreed: the caller agrees (once, with what it sets
 * up next). scratch: 8 * size bytes the caller owns, so no allocation can
 * fail on one rank only. cards stays valid until weft_p2p_destroy. */
int    weft_p2p_connect(struct weft_p2p *p, const unsigned char *cards, const struct weft_tp_collective *coll,
                        void *scratch);
/* Which transport carries the pipe to peer and why (weft_info --pairs):
 * the choice connect made, with the same reasons WEFT_DEBUG=info gives
 * and every earlier carrier's refusal, including those not allowed to try
 * ("; not shm: other node"). After weft_p2p_connect; cards as given to it. */
struct weft_p2p_pair_info {
    char carrier[16];   /* "shm"; "none" before connect */
    char mover[16];     /* "cuda_ipc", "" when device data has no mover */
    int  same_node;     /* same effective node (WEFT_VIRTUAL_NODES included) */
    char host[64];      /* the peer's host name */
    char why[512];      /* "other node; tcp is the first carrier that reaches it; not shm: other node; not ib: ..." */
};
int    weft_p2p_describe_pair(const struct weft_p2p *p, const unsigned char *cards, int peer,
                              struct weft_p2p_pair_info *out);
/* weft_comm_destroy: progress until no transport or path holds anything a
 * peer may wait for (bounded by WEFT_TIMEOUT); warns about requests still
 * in flight. */
int    weft_p2p_drain(struct weft_p2p *p);
/* weft_comm_destroy, after the drain, before the final barrier: every
 * transport lets go of what it mapped of peers' memory (transport.h,
 * detach). */
void   weft_p2p_detach(struct weft_p2p *p);
/* Whether some rank failed or this comm was aborted: destroy is then local
 * (no final barrier a failed rank would never join). */
int    weft_p2p_any_failed(struct weft_p2p *p);
/* Looks at the processes of same-host peers only (no pipe is read or
 * written: destroy's final barrier, where a peer that finished it closes
 * its sockets); then as weft_p2p_any_failed. */
int    weft_p2p_watch_processes(struct weft_p2p *p);
/* Pipes broken with their peer not known failed (a link down): how many;
 * why (if not NULL) names the first. */
int    weft_p2p_broken_links(struct weft_p2p *p, char *why, size_t n);
/* The final barrier of destroy over the pipes to the ranks not known failed
 * (collective among the survivors, bounded by WEFT_TIMEOUT). */
int    weft_p2p_survivor_barrier(struct weft_p2p *p);
/* After the final barrier (or to unwind a failed create): everything. */
void   weft_p2p_destroy(struct weft_p2p *p);
#endif
