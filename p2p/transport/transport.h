/*
 * The transport contract.
 *
 * A transport moves bytes between this process and peers; the pipe layer
 * above it (p2p/) owns everything else: matching, ordering, eager vs
 * rendezvous, truncation, completion. A transport is one folder under
 * p2p/transport/ that exports one `const struct weft_transport` and is
 * listed once in registry.c. It includes this header and src/core/ only:
 * it never names the pipe layer. What it needs from above comes in its
 * weft_tp_env (core context, rank cards, collective set-up services), and
 * it reports back only through the upcall table in that env (on_ctrl,
 * rndv_done, peer_failed), the way UCX's uct reports to ucp.
 *
 * Kinds of transports (capabilities as fields, below):
 *  - carriers (ctrl = 1: self, shm, tcp, ib) carry a pipe's control frames
 *    and usually its rendezvous data; each pipe has exactly one, the first
 *    of the registry whose reach() accepts the pair;
 *  - movers (ctrl = 0: cuda_ipc) only move rendezvous data for the pipe's
 *    rendezvous paths (p2p/rndv.h); the pipe's carrier signals for them.
 *
 * Threading: every function but sleep is called with the pipe layer's lock
 * held, so a transport needs no locking of its own for its per-comm state.
 * None may block (connect excepted, bounded by WEFT_TIMEOUT): what cannot be
 * done now returns WEFT_EAGAIN and is retried on a later progress call.
 *
 * Re-entrancy: an upcall (on_ctrl, rndv_done, peer_failed) may call back
 * into the same transport (ctrl_send, rndv_get, rndv_expect, rndv_push,
 * abort_peer), so the transport must be consistent around each upcall
 * (release a ring record first, unlink a finished transfer first).
 *
 * Errors: a transport records what failed with weft_set_error(env->core,
 * ...) where it decides the failure (naming peer, host and why), once.
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include "core.h"
#include "iov.h"

/* Internal return code: "no room now, retry later". Never returned to users. */
#define WEFT_EAGAIN (-11)

/* Control frames are opaque bytes to a transport: the pipe's header, then
 * a payload. A transport delivers each one whole, in order, to on_ctrl of
 * the peer's pipe. Two facts a transport may rely on:
 *  - the first byte of every frame is below WEFT_TP_FRAME_TYPE_LIMIT, so a
 *    transport may multiplex records of its own on the same channel by
 *    giving them first bytes >= the limit (shm's DATA records);
 *  - the header part is at most WEFT_TP_CTRL_HDR_MAX bytes.
 * ctrl_send accepts payloads of up to max(eager_limit, WEFT_TP_CTRL_PAYLOAD_MIN)
 * bytes (rendezvous keys travel as CTS payloads). */
#define WEFT_TP_FRAME_TYPE_LIMIT 16
#define WEFT_TP_CTRL_HDR_MAX     96
#define WEFT_TP_CTRL_PAYLOAD_MIN 256
/* A rendezvous key (rndv_expect -> the CTS -> rndv_push) is at most this long. */
#define WEFT_TP_KEY_MAX          192

/* Memory a transport's rendezvous can read and write (rndv_mem). */
#define WEFT_TP_MEM_HOST   0x1u
#define WEFT_TP_MEM_DEVICE 0x2u

/* Where a transport may reach peers (scope), before any card is read. */
enum weft_tp_scope {
    WEFT_TP_SCOPE_SELF = 1,  /* only the rank itself */
    WEFT_TP_SCOPE_NODE,      /* ranks of the same (effective) node */
    WEFT_TP_SCOPE_ANY        /* any rank but itself */
};

/* ------------------------------------------------------------ rank cards */

/* The common part of every rank card, written by the comm: any transport
 * may read it (reach decisions, messages naming the peer's host). */
struct weft_card_hdr {
    uint64_t node_key;        /* host identity: equal for ranks on one real node (host name + boot id) */
    uint64_t token;           /* random per rank: a peer proves it read this card (tcp hello, shm segment) */
    int32_t  node;            /* effective node: real node x WEFT_VIRTUAL_NODES block (set after exchange) */
    int32_t  pid;
    int32_t  vblock;          /* WEFT_VIRTUAL_NODES block of the rank (0 when off) */
    uint32_t transports_mask; /* bit i: registry entry i is allowed by this rank (WEFT_TRANSPORTS) */
    char     hostname[64];
};

/* The cards of every rank: each is the header, then every transport's
 * blob at that transport's offset. A blob is opaque to everyone but its
 * transport (card_bytes of it, zeroed before create writes it). */
struct weft_tp_cards {
    const unsigned char *base;     /* rank r's card at base + r * stride */
    size_t               stride;
    size_t               blob_off; /* this transport's blob inside a card */
};

static inline const struct weft_card_hdr *weft_tp_card(const struct weft_tp_cards *k, int rank)
{
    return (const struct weft_card_hdr *)(const void *)(k->base + (size_t)rank * k->stride);
}

static inline const void *weft_tp_blob(const struct weft_tp_cards *k, int rank)
{
    return k->base + (size_t)rank * k->stride + k->blob_off;
}

/* ------------------------------------------------------------- transfers */

/* One rendezvous transfer as a transport sees it. It lives inside the pipe's
 * request; the transport owns priv[] while the transfer is in its hands
 * (from rndv_get/rndv_expect/rndv_push until it calls rndv_done, or until
 * abort_peer). Each transport declares its per-transfer struct and checks
 * it fits with WEFT_TP_PRIV_FITS. */
#define WEFT_TP_PRIV_BYTES 64
#ifdef __cplusplus
#define WEFT_TP_ALIGN16 alignas(16)   /* tests in C++ include this header */
#else
#define WEFT_TP_ALIGN16 _Alignas(16)
#endif
struct weft_tp_xfer {
    void   *buf;        /* send: source; receive: destination (NULL when iov is set) */
    size_t  bytes;      /* bytes to move (a receive: the message size, never above its buffer) */
    /* A vectored message (host memory only, transports with rndv_vectors):
     * the data is iov[0] .. iov[niov - 1] end to end instead of buf. The
     * array is the request's, alive until rndv_done. p2p/transport/tp_iov.h
     * copies into and out of either form. */
    const struct weft_iov *iov;
    uint32_t niov;
    int     mem_kind;   /* enum weft_mem_kind of buf (core/cudawrap.h) */
    int     device;     /* CUDA device of buf, -1 for host memory */
    int     peer;
    int     tag;        /* the message's tag: for error messages only */
    /* A receive whose stream waits on the device (core/signals.h): slot and
     * value to write once the data is in (value 0: none). A mover that can
     * have the sender's GPU write it puts both in its key and sets
     * signal_sent; the sender's mover sets signal_done on its side when it
     * queued the write, and the pipe carries that to the receive's
     * signal_done (FIN flag SIGNALED). */
    uint32_t      signal_slot, signal_value;
    unsigned char signal_sent, signal_done;
    /* A receive whose rank has rendezvous sends of its own to the peer
     * outstanding (an exchange, messages crossing): the peer is likely
     * busy moving those, not idle waiting for this one. A hint for
     * rndv_get (shm shares a pull only with an idle sender). */
    unsigned char crossing;
    WEFT_TP_ALIGN16 unsigned char priv[WEFT_TP_PRIV_BYTES];
};
#define WEFT_TP_PRIV(x, type) ((type *)(void *)(x)->priv)
#define WEFT_TP_PRIV_FITS(type) \
    _Static_assert(sizeof(type) <= WEFT_TP_PRIV_BYTES && _Alignof(type) <= 16, #type " must fit weft_tp_xfer.priv")

/* The sender's buffer, as the RTS describes it: what a pull reads. */
struct weft_tp_src {
    uint64_t addr;      /* in the sender's address space; with niov, its array of niov struct weft_iov */
    uint32_t niov;      /* 0: one buffer at addr; else the sender's message is vectored */
    int      mem_kind;  /* enum weft_mem_kind */
    int      device;    /* sender's device ordinal, -1 for host memory */
};

/* ---------------------------------------------------------- environment */

/* How a transport reports to the layer above (the pipe registers these). */
struct weft_tp_upcalls {
    void *arg;
    /* A control frame arrived from peer; frame is valid during the call only. */
    void (*on_ctrl)(void *arg, int peer, const void *frame, size_t len);
    /* A transfer handed over by rndv_get (never: get completes synchronously),
     * rndv_expect or rndv_push finished: err = WEFT_SUCCESS or why not. The
     * transport has let go of x before the call. */
    void (*rndv_done)(void *arg, struct weft_tp_xfer *x, int err);
    /* The connection to peer failed (the transport recorded why): the pipe
     * breaks, which calls abort_peer. */
    void (*peer_failed)(void *arg, int peer, int err);
    /* Bytes of a rendezvous transfer with peer moved (a chunk landed or
     * left): the pipe's requests are making progress, so their WEFT_TIMEOUT
     * clocks restart. Cheap; call it per chunk, not per byte. */
    void (*on_data)(void *arg, int peer);
};

/* Collective services for connect only, forwarded to the comm's bootstrap
 * (src/comm/bootstrap.h). Each is a collective over every rank of the comm:
 * call them the same number of times on every rank whatever happened
 * locally, or a rank that failed would hang the others. */
struct weft_tp_collective {
    void *arg;
    /* Record i of send goes to rank i; recv gets rank i's record for me. */
    int (*alltoall)(void *arg, const void *send, void *recv, size_t bytes_per_rank);
    /* Every rank gets the worst (largest) code of all; a rank whose own rc
     * is fine learns which rank failed in its last error. */
    int (*agree)(void *arg, int rc, const char *stage);
};

/* Given to every transport of a comm at create; valid until destroy. The
 * comm fills cards after the exchange and uses/used_anywhere/coll before
 * connect. */
struct weft_tp_env {
    struct weft_core                *core;    /* rank, size, cfg, cuda, errors */
    int                              index;   /* position in the registry = bit in transports_mask */
    struct weft_tp_cards             cards;
    const struct weft_tp_upcalls    *up;
    const struct weft_tp_collective *coll;    /* connect only */
    const unsigned char             *uses;    /* [size]: 1 = the pipe to that rank uses this transport */
    int                              used_anywhere; /* some pair of the comm uses it (same on every rank) */
};

/* --------------------------------------------------------------- vtable */

struct weft_transport {
    const char *name;            /* as in WEFT_TRANSPORTS and in log lines */
    int         ctrl;            /* 1: carrier (carries control frames); 0: mover (rendezvous data only) */
    int         scope;           /* enum weft_tp_scope */
    int         sure;            /* 1: reach() accepts every pair its scope and both masks allow,
                                    so lower-priority transports need not be offered for them */
    size_t      card_bytes;      /* its blob in the rank card (0: none) */
    int         rndv_vectors;    /* 1: its rendezvous (get, expect, push) moves vectored host messages
                                    (x->iov on either side, src->niov), whichever way it takes */

    /* ---- set-up ---- */

    /* Before the cards are exchanged, on a rank that offers the transport
     * (allowed, and some peer may need it): allocate per-comm state (*ctx)
     * and write what peers need into blob (card_bytes, zeroed). A transport
     * that cannot work here (no library, no device) returns WEFT_SUCCESS
     * with a blob that makes reach() refuse, after one info line saying
     * why; an error fails create on every rank. */
    int  (*create)(const struct weft_tp_env *env, void *blob, void **ctx);

    /* From the two cards alone: can rank me and rank peer connect with it?
     * Deterministic (every rank computes the same answer for every pair).
     * No: 0, and why says so for the log ("no usable RDMA port on the
     * peer"). Called only for pairs its scope and both masks allow. */
    int  (*reach)(const struct weft_tp_cards *k, int me, int peer, char *why, size_t whylen);

    /* Optional (NULL: always usable), for weft_info: could this process
     * offer the transport, found as create finds it (the same library,
     * device, interface and configuration)? Outside any comm: core has
     * rank 0, size 1, the configuration, and cuda set as a comm sets it;
     * errors it records there are the reason. Leaves nothing open.
     * 1: what says what it would use ("mlx5_0 port 1 (InfiniBand, ...)");
     * 0: what says exactly why not. */
    int  (*probe)(struct weft_core *core, char *what, size_t len);

    /* After the exchange, with env->uses set: connect to the peers that use
     * it, or only prepare to (a lazy transport, tcp: each pair connects at
     * its first ctrl_send, which answers WEFT_EAGAIN until the pair is up,
     * and reports a connection that fails or never comes up through
     * peer_failed).
     * Called on EVERY rank for EVERY transport, also where create was
     * not called (ctx NULL: the rank offers nothing and only takes part in
     * env->coll exchanges). The comm agrees on the result afterwards.
     * Errors name the peer. */
    int  (*connect)(const struct weft_tp_env *env, void *ctx);

    /* weft_comm_destroy (after the final barrier), or unwinding a failed
     * create: release everything. ctx may be NULL. */
    void (*destroy)(void *ctx);

    /* ---- data path (ctrl = 1) ---- */

    /* Largest message the pipe sends to peer as an eager frame; internal:
     * for the library's own lanes (collectives may be eager for longer). */
    size_t (*eager_limit)(void *ctx, int peer, int internal);

    /* Sends one control frame (hdr then payload) to peer. All or nothing:
     * WEFT_SUCCESS once the transport owns the bytes (copied or sent: the
     * caller may reuse both), WEFT_EAGAIN if there is no room now, another
     * code if the peer is unreachable (the pipe then breaks). */
    int  (*ctrl_send)(void *ctx, int peer, const void *hdr, size_t hdr_len, const void *payload, size_t len);

    /* Moves what can be moved without blocking: frames in (on_ctrl), pushes
     * out, expected data in, completions (rndv_done). Returns the number of
     * events (>= 0); 0 means nothing happened. */
    int  (*progress)(void *ctx);

    /* ---- rendezvous ---- */

    /* Memory kinds its rendezvous moves with peer (WEFT_TP_MEM_*): host for
     * every carrier, device where it reads and writes GPU memory itself
     * (ib with GPUDirect RDMA on both sides, self with CUDA, cuda_ipc). */
    unsigned (*rndv_mem)(void *ctx, int peer);

    /* Receiver, optional (NULL = never pulls). Pulls the message src
     * describes into x (x->bytes bytes). WEFT_SUCCESS: all in place, now;
     * WEFT_EAGAIN: declined (the sender will push); else the transfer fails
     * with that code. Never calls rndv_done. */
    int  (*rndv_get)(void *ctx, int peer, struct weft_tp_xfer *x, const struct weft_tp_src *src);

    /* Receiver: x will be filled by the peer's push of the message src
     * describes. Writes the key the sender's rndv_push needs (at most
     * WEFT_TP_KEY_MAX bytes, *keylen; 0 is fine) and takes x; rndv_done(x)
     * when the last byte is in place. Called in the order the pipe sends the
     * CTS frames that carry the keys. WEFT_EAGAIN: declined for this
     * transfer (nothing taken; the pipe tries its next rendezvous path).
     * A mover (ctrl = 0) only makes the key and does not take x: the
     * sender's pipe tells the receiver's when the data is in place (FIN). */
    int  (*rndv_expect)(void *ctx, int peer, struct weft_tp_xfer *x, const struct weft_tp_src *src,
                        void *key, size_t *keylen);

    /* Sender: push x to the receive the key names. WEFT_SUCCESS: taken,
     * rndv_done(x) once the last byte has left x->buf; else nothing was
     * taken and the caller decides. A mover may answer WEFT_EAGAIN: it
     * cannot take this transfer now without a call that would wait for
     * the device where that may not wait (core/cudawrap.h,
     * weft_cuda_may_sync_in_progress); the pipe then has the receiver pick another path
     * (RTS flag REDO). Pushes to one peer are started in the order of the
     * CTS frames that carried their keys. */
    int  (*rndv_push)(void *ctx, int peer, struct weft_tp_xfer *x, const void *key, size_t keylen);

    /* The pipe to peer broke: forget every transfer of that peer the
     * transport still holds (no rndv_done for them; the pipe fails them).
     * Memory a device may still write is released only when it is done. */
    void (*abort_peer)(void *ctx, int peer);

    /* ---- draining and waiting ---- */

    /* Optional. Nonzero while it holds accepted bytes not yet handed to the
     * peer or the kernel: weft_comm_destroy progresses until no transport
     * is busy before its final barrier. */
    int  (*busy)(void *ctx);

    /* Optional. weft_comm_destroy, after the drain and before the final
     * barrier: let go of what this rank mapped of its peers' memory (CUDA
     * IPC imports). Right after the barrier a peer frees what it exported,
     * and freeing memory another process still has open is undefined. */
    void (*detach)(void *ctx);

    /* Optional. Nonzero while work is in flight that completes with no
     * wake-up anyone can sleep on (completion queues, copies on a CUDA
     * stream): waiters then nap briefly and poll instead of sleeping. */
    int  (*wakeless)(void *ctx);

    /* Optional. Sleeps until this transport may have work or timeout_ms
     * passes, without losing a wake-up that races with going to sleep.
     * Returns at once if work is pending. Called WITHOUT the lock: touch
     * only what is stable after connect and atomics. */
    void (*sleep)(void *ctx, int timeout_ms);

    /* ---- memory registration (weft_mem_register), optional ---- */

    /* Pins [buf, buf+bytes) until unpin (RDMA registration cache). */
    int  (*mem_pin)(void *ctx, const void *buf, size_t bytes, char *why, size_t whylen);
    /* Drops registrations covering the range (released when in flight). */
    void (*mem_unpin)(void *ctx, const void *buf, size_t bytes);
};

#endif
