/*
 * The p2p context of one comm (private to p2p/): pipes, the transports in
 * use, requests, progress counters. The comm creates it (p2p/setup.c) and
 * the layers above reach it through p2p/p2p.h.
 */
#ifndef WEFT_P2P_CONTEXT_H
#define WEFT_P2P_CONTEXT_H

#include <pthread.h>
#include <stdint.h>
#include "core.h"
#include "payload.h"
#include "pipe.h"
#include "request.h"
#include "tags.h"
#include "transport.h"
#include "wire.h"

#define WEFT_P2P_MAX_TRANSPORTS 16

/* One registry entry as this comm uses it. */
struct weft_p2p_tp {
    const struct weft_transport *tp;
    void                        *ctx;    /* NULL: not offered here */
    struct weft_tp_env           env;
    unsigned char               *uses;   /* [size] */
    int                          used;   /* some pipe of this rank uses it (carrier or mover) */
};

struct stage_state;

struct weft_p2p {
    struct weft_core        *core;
    int                      table_slot; /* entry in the handle table (request.c), -1: none */
    pthread_mutex_t          lock;       /* guards everything here and in the transports: taken
                                            through weft_p2p_lock, below, never directly */
    /* WEFT_THREADS=serialized and no thread of weft's drives this comm: the
     * program's threads call in one at a time, ordered by the program, so
     * `lock` is not taken (weft_p2p_lock). Set at create; cleared, once
     * and for good, by the application's thread that starts the comm's
     * progress thread, before it starts it (thread_start_locked, engine.c). */
    int                      nolock;
    int                      rank, size;
    struct weft_peer_pipe        *pipes;      /* [size]; pipes[rank] is the self pipe */
    struct weft_p2p_tp       tps[WEFT_P2P_MAX_TRANSPORTS];   /* registry order */
    int                      ntps;
    int                      used[WEFT_P2P_MAX_TRANSPORTS];   /* indices into tps of those some pipe uses */
    int                      nused;
    struct weft_tp_upcalls   up;
    struct weft_req_pool     reqs;
    struct weft_payload_cache payloads;  /* unexpected and queued payloads (p2p/payload.h) */
    struct stage_state      *stage;      /* staged device transfers (p2p/stage.c) */
    size_t                   path_ops;   /* transfers the rendezvous paths drive themselves: their
                                            progress hooks run only while this is nonzero */
    uint64_t                 events;     /* progress events so far */
    size_t                   out_queued; /* outbound frames queued on all pipes */
    int                      waiters;    /* threads inside wait */
    int                      device_prepared; /* weft_p2p_prepare_device ran (atomic) */

    /* Failures (p2p/health.c): ranks known failed, bumped epoch on each. */
    int                      nfailed;
    uint64_t                 fault_epoch;
    int                      fault_rank;        /* the first rank known failed, -1: none */
    int                      fault_code;
    char                     fault_why[384];    /* "rank 2 failed: ..." */
    /* Every link known broken between live ranks (this rank's own, and
     * those the other ranks announced), a < b: what weft_comm_shrink
     * decides from (weft_p2p_known_links). */
    int                      nlinks;
    int                      links[WEFT_P2P_LINKS_MAX][2];
    double                   health_at;         /* last health pass */
    char                     revoke_why[320];   /* "the comm was revoked by rank N...", once core->revoked */
    /* Collectives that failed elsewhere (NOTICE COLL_FAILED), one slot per
     * collective number modulo the lanes' slots (a call seq + SLOTS starts
     * only once call seq is over here), the first word of each kept: many
     * ranks reporting the same call (each refused it) cannot push out the
     * note of a call still waiting. from < 0: empty. */
    struct weft_coll_note { uint64_t seq; /* the call key */ int code; int from; char text[WEFT_WIRE_NOTICE_TEXT_MAX]; }
                             cnotes[WEFT_TAG_COLL_SLOTS];
    size_t                   user_reqs;         /* requests handed out as handles, not yet freed */
    /* The newest collective this rank started: the fingerprint of its
     * newest checked send or receive (p2p.c), what a peer asking about a
     * stalled collective receive is told (NOTICE COLL_ASK/HEAD). */
    struct weft_p2p_check    coll_head;
    int                      coll_head_set;
    struct weft_p2p_check    scoll_head;        /* the same for the stream-ordered collectives' numbering */
    int                      scoll_head_set;
    /* The census of a stalled collective (p2p/health.c, agreed verdicts):
     * the call asked about and when (census_at 0: none yet). */
    uint64_t                 census_call;       /* a call key (p2p.h) */
    double                   census_at;
    /* Memory requests left to their pipes may still read (a failed
     * collective's op: weft_p2p_keep), freed after the transports. */
    struct weft_p2p_kept { struct weft_p2p_kept *next; void *mem; } *kept;
    weft_p2p_check_describe_fn describe_check;

    struct weft_engine      *engine;     /* who drives progress (p2p/engine.c) */
    /* The application's wait hook (weft_comm_set_wait_hook), a client of
     * the engine. */
    void                   (*wait_fn)(void *arg);
    void                    *wait_fn_arg;
};

/* A fault came (p2p/health.c). Lock held; the store is atomic because
 * weft_p2p_fault_epoch reads the epoch without the lock. */
static inline void weft_p2p_fault_epoch_bump(struct weft_p2p *p)
{
    __atomic_store_n(&p->fault_epoch, p->fault_epoch + 1, __ATOMIC_RELEASE);
}

/* The lock of everything in p (and its transports). Uncontended, a
 * mutex costs two atomic read-modify-writes and ~60 instructions a pair,
 * taken several times per message -- 15% of the small-message path's
 * instructions (scripts/perf/self_pair.c); with nolock they are gone. */
static inline void weft_p2p_lock(struct weft_p2p *p)
{
    if (!p->nolock)
        pthread_mutex_lock(&p->lock);
}

static inline void weft_p2p_unlock(struct weft_p2p *p)
{
    if (!p->nolock)
        pthread_mutex_unlock(&p->lock);
}

/* One progress pass: every transport in use, the rendezvous paths, queued
 * outbound frames. Lock held. Returns the number of events. */
int  weft_p2p_progress(struct weft_p2p *p);
/* The application's waits (p2p/engine.c). Waits, bounded by WEFT_TIMEOUT, until every request in reqs[0..n) is
 * DONE (NULL entries count as done). Lock held; released while sleeping.
 * A request whose pipe shows no activity for WEFT_TIMEOUT fails (see
 * p2p/health.h: whom it blames, what breaks); the first such code is
 * returned, else WEFT_SUCCESS. */
int  weft_p2p_progress_wait(struct weft_p2p *p, struct weft_request **reqs, size_t n, const char *what);
/* The same, returning WEFT_P2P_FAULT as soon as p->fault_epoch differs
 * from *stop_epoch (a rank failed, a collective failed elsewhere). */
/* Looks at r's clock once (a test loop, a waitall over several comms). */
void weft_p2p_watch_one(struct weft_p2p *p, struct weft_request *r, const char *what);
int  weft_p2p_progress_wait_until(struct weft_p2p *p, struct weft_request **reqs, size_t n, const char *what,
                                  const uint64_t *stop_epoch);

#endif
