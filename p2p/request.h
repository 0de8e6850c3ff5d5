/*
 * Requests: one per send or receive, from a per-comm pool.
 *
 * The pool hands out requests from chunks that are never moved or freed
 * before the comm is destroyed, so a request's address is stable. Each slot
 * has an index and a generation that changes every time the slot is freed;
 * the id a request carries on the wire is (generation << 32 | index), and an
 * id that comes back from a peer is looked up (weft_req_lookup), never cast
 * to a pointer: an unknown or stale id is a protocol error of that pipe.
 */
#ifndef WEFT_REQUEST_H
#define WEFT_REQUEST_H

#include <stddef.h>
#include <stdint.h>
#include "list.h"
#include "p2p.h"
#include "transport.h"
#include "weft.h"

struct weft_p2p;
struct weft_peer_pipe;

/* UPPER: a request of the layer above (a non-blocking collective), with
 * a handle like the others; its completion is the upper layer's (upper). */
enum weft_req_type { WEFT_REQ_SEND = 1, WEFT_REQ_RECV = 2, WEFT_REQ_UPPER = 3 };
enum weft_req_state {
    WEFT_REQ_FREE = 0,     /* in the pool */
    WEFT_REQ_QUEUED,       /* send waiting in the pipe's outbound queue */
    WEFT_REQ_POSTED,       /* recv posted / send's RTS out, waiting for the peer */
    WEFT_REQ_ACTIVE,       /* rendezvous data moving */
    WEFT_REQ_DONE
};

struct weft_request {
    /* The slot's identity: kept across uses (weft_req_alloc clears from pipe on). */
    struct weft_p2p     *p2p;
    uint32_t             index;    /* pool slot */
    uint32_t             gen;      /* slot generation (never 0 while in use) */
    struct weft_qnode    free_link;/* the pool's free list */
    /* One use. */
    struct weft_peer_pipe    *pipe;
    int                  type;     /* enum weft_req_type */
    int                  state;    /* enum weft_req_state */
    int                  tag;
    int                  rndv;     /* send: went out as RTS */
    size_t               bytes;    /* send: message size; recv: buffer size */
    size_t               msg_bytes;/* recv: size of the matched message */
    uint64_t             seq;
    uint64_t             peer_req; /* rendezvous: the peer's request id */
    weft_status_t        status;
    unsigned char        user;     /* handed to the user as a handle (weft_isend/weft_irecv) */
    unsigned char        claimed;  /* inside a weft_waitall (a second copy there is refused) */
    unsigned char        checked;  /* carries a collective fingerprint (check below) */
    unsigned char        discard;  /* a receive that drops its message whatever its size (the
                                      message pipes' discards): never a truncation, no data moved */
    uint64_t             activity; /* the pipe's activity count when last seen (per-request timeout) */
    double               idle_since; /* when that count last changed; 0 = not watched yet */
    double               grace_until; /* stuck with a live peer: fails after this (p2p/health.c) */
    double               fault_grace_until; /* an announced send to a live peer while another rank failed:
                                              its pipe breaks only after this (p2p/health.c) */
    double               asked_at; /* a stalled collective receive: when its peer was last asked
                                      what it is doing (COLL_ASK), 0 = never */
    struct weft_p2p_check check;   /* collective fingerprint: sent, or expected; a mismatched
                                      receive: the sender's */
    const struct weft_p2p_upper_ops *upper; /* UPPER: its callbacks and their argument */
    void                *upper_arg;
    int                  path;     /* rendezvous path taken (p2p/rndv.h), 0 = none yet */
    void                *path_state; /* that path's per-request state (p2p/stage.c) */
    struct weft_list     link;     /* a lane's posted queue, or the pipe's inflight list */
    /* What a transport or mover sees: buffer, bytes to move, memory kind,
     * its private per-transfer area. buf and mem_kind are set at the start. */
    struct weft_tp_xfer  xfer;
};

static inline uint64_t weft_req_id(const struct weft_request *r)
{
    return ((uint64_t)r->gen << 32) | r->index;
}

/* A zeroed request from the pool (state QUEUED), or NULL: no memory. */
struct weft_request *weft_req_alloc(struct weft_p2p *p);
/* Back to the pool; its id stops being valid. */
void weft_req_free(struct weft_request *r);
/* The live request of pipe with that wire id and type, or NULL. */
struct weft_request *weft_req_lookup(struct weft_p2p *p, const struct weft_peer_pipe *pipe, uint64_t id, int type);
/* Public handles. A handle (what weft_isend gives the user as a
 * weft_request_t *) is not an address: it packs the slot's generation, the
 * comm's entry in a process-wide table and the slot index, so a handle
 * that outlived its request (completed, slot reused, comm destroyed) is
 * recognised and refused instead of dereferenced. 64-bit only. */
#define WEFT_REQ_INDEX_BITS 22   /* slots per comm: 4 Mi */
#define WEFT_REQ_TABLE_BITS 10   /* live comms per process: 1024 */
uint64_t weft_req_handle(const struct weft_request *r);
/* The p2p context a handle names, or NULL (no live comm has that entry). */
struct weft_p2p *weft_req_handle_p2p(uint64_t h);
/* The live user request of p with handle h, or NULL. Lock of p held. */
struct weft_request *weft_req_handle_lookup(struct weft_p2p *p, uint64_t h);
/* The process-wide table: entry at create, left at destroy. -1: full. */
int  weft_req_table_add(struct weft_p2p *p);
void weft_req_table_remove(struct weft_p2p *p);

/* Frees every chunk (destroy). */
void weft_req_pool_fini(struct weft_p2p *p);

/* The pool itself, inside struct weft_p2p. */
struct weft_req_pool {
    struct weft_request **chunks;   /* each WEFT_REQ_CHUNK requests */
    uint32_t              nchunks, cap;
    struct weft_queue     free;
};
#define WEFT_REQ_CHUNK 256

#endif
