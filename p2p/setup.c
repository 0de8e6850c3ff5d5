/*
 * Setting up the pipes of a comm (the comm drives the steps, p2p.h):
 *
 *   offer    from every rank's card header: which transports this rank may
 *            need (a peer its scope reaches that no earlier "sure" carrier
 *            covers), create them, write their blobs into this rank's card
 *   connect  from every rank's whole card: each pair's carrier (the first
 *            registry carrier both allow whose reach() accepts the pair) and
 *            mover, then every transport's connect in registry order, each
 *            result agreed by all ranks
 *
 * Every rank holds every card, so every rank computes the same choice for
 * every pair: a transport knows without any message whether some pair of
 * the comm uses it (used_anywhere) and takes part in its collective set-up
 * exactly when the others do.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "context.h"
#include "engine.h"
#include "cudawrap.h"
#include "health.h"
#include "log.h"
#include "p2p.h"
#include "registry.h"
#include "rndv.h"
#include "stage.h"
#include "tags.h"
#include "deadline.h"

static size_t blob_off[WEFT_P2P_MAX_TRANSPORTS];
static size_t card_bytes;

size_t weft_p2p_card_bytes(void)
{
    /* The same layout in every process of the build: computed once. */
    if (card_bytes == 0)
        card_bytes = weft_registry_card_layout(blob_off);
    return card_bytes;
}

/* ---- upcalls from the transports ---- */

static void up_on_ctrl(void *arg, int peer, const void *frame, size_t len)
{
    struct weft_p2p *p = arg;
    weft_pipe_on_frame(&p->pipes[peer], frame, len);
}

static void up_rndv_done(void *arg, struct weft_tp_xfer *x, int err)
{
    struct weft_request *r = weft_container_of(x, struct weft_request, xfer);
    const struct weft_rndv_path *path = weft_rndv_path_of((unsigned)r->path);
    (void)arg;
    if (path != NULL && r->pipe != NULL)
        path->xfer_done(r->pipe, r, err);
}

/* The transport lost the peer (connection closed, completion error):
 * every rank should know, not only those whose own link noticed. */
static void up_peer_failed(void *arg, int peer, int err)
{
    weft_health_settle(arg, peer, err);
}

static void up_on_data(void *arg, int peer)
{
    struct weft_p2p *p = arg;
    p->pipes[peer].activity++;
}

int weft_p2p_create(struct weft_core *core, struct weft_p2p **out)
{
    struct weft_p2p *p = calloc(1, sizeof(*p));
    int rc = WEFT_SUCCESS;

    if (p == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for the pipe layer");
    p->core = core;
    p->rank = core->rank;
    p->size = core->size;
    pthread_mutex_init(&p->lock, NULL);
    /* With WEFT_PROGRESS_THREAD=1 a thread of weft's moves the pipes from
     * the start: the lock stays. */
    p->nolock = strcmp(core->cfg.threads, "serialized") == 0 && !core->cfg.progress_thread;
    weft_queue_init(&p->reqs.free);
    p->up.arg = p;
    p->up.on_ctrl = up_on_ctrl;
    p->up.rndv_done = up_rndv_done;
    p->up.peer_failed = up_peer_failed;
    p->up.on_data = up_on_data;
    p->fault_rank = -1;
    for (int i = 0; i < WEFT_TAG_COLL_SLOTS; i++)
        p->cnotes[i].from = -1;   /* no note */
    p->table_slot = -1;
    p->ntps = weft_registry_count();
    weft_p2p_card_bytes();
    p->pipes = calloc((size_t)p->size, sizeof(*p->pipes));
    if (p->pipes == NULL)
        rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for %d peers", p->size);
    for (int i = 0; i < p->size && rc == WEFT_SUCCESS; i++)
        if (weft_pipe_init(p, &p->pipes[i], i) != WEFT_SUCCESS)
            rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for %d peers", p->size);
    for (int i = 0; i < p->ntps && rc == WEFT_SUCCESS; i++) {
        struct weft_p2p_tp *t = &p->tps[i];
        t->tp = weft_registry_get(i);
        t->uses = calloc((size_t)p->size, 1);
        if (t->uses == NULL)
            rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for %d peers", p->size);
        t->env.core = core;
        t->env.index = i;
        t->env.up = &p->up;
        t->env.uses = t->uses;
        t->env.cards.stride = card_bytes;
        t->env.cards.blob_off = blob_off[i];
    }
    if (rc == WEFT_SUCCESS)
        rc = weft_engine_create(p, &p->engine);
    if (rc == WEFT_SUCCESS && weft_req_table_add(p) < 0)
        rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_comm_create: more than %u comms alive in this process",
                            1u << WEFT_REQ_TABLE_BITS);
    if (rc != WEFT_SUCCESS) {
        weft_p2p_destroy(p);
        return rc;
    }
    *out = p;
    return WEFT_SUCCESS;
}

/* ---- choosing ---- */

static const struct weft_card_hdr *hdr_of(const unsigned char *cards, int rank)
{
    return (const struct weft_card_hdr *)(const void *)(cards + (size_t)rank * card_bytes);
}

/* Whether entry i may connect a and b at all: both allow it, its scope fits. */
static int allowed(const unsigned char *cards, int i, int a, int b)
{
    const struct weft_transport *t = weft_registry_get(i);
    const struct weft_card_hdr *ha = hdr_of(cards, a), *hb = hdr_of(cards, b);
    if (!(ha->transports_mask & hb->transports_mask & (1u << i)))
        return 0;
    switch (t->scope) {
    case WEFT_TP_SCOPE_SELF: return a == b;
    case WEFT_TP_SCOPE_NODE: return a != b && ha->node == hb->node;
    default:                 return a != b;
    }
}

/* Why entry i may not connect a and b (allowed() said no). */
static const char *not_allowed_why(const unsigned char *cards, int i, int a, int b)
{
    const struct weft_transport *t = weft_registry_get(i);
    const struct weft_card_hdr *ha = hdr_of(cards, a), *hb = hdr_of(cards, b);
    if (!(ha->transports_mask & (1u << i)))
        return "not in WEFT_TRANSPORTS here";
    if (!(hb->transports_mask & (1u << i)))
        return "not in WEFT_TRANSPORTS on the peer";
    switch (t->scope) {
    case WEFT_TP_SCOPE_SELF: return "only a rank to itself";
    case WEFT_TP_SCOPE_NODE: return a == b ? "not to this rank itself" : "other node";
    default:                 return "not to this rank itself";
    }
}

/* The carrier (ctrl) and mover entries for the pair (me, peer), -1 = none;
 * why collects the refusals of earlier carriers ("; not ib: ..."); all:
 * also those that were not allowed to try ("; not shm: other node"). */
static void choose_all(const unsigned char *cards, int me, int peer, int *carrier, int *mover, char *why,
                       size_t whylen, int all)
{
    int n = weft_registry_count();
    *carrier = *mover = -1;
    if (why && whylen)
        why[0] = '\0';
    for (int i = 0; i < n; i++) {
        const struct weft_transport *t = weft_registry_get(i);
        if ((t->ctrl ? *carrier : *mover) >= 0)
            continue;
        if (!allowed(cards, i, me, peer)) {
            if (all && t->ctrl && t->scope != WEFT_TP_SCOPE_SELF && why && whylen) {
                size_t l = strlen(why);
                snprintf(why + l, whylen - l, "; not %s: %s", t->name, not_allowed_why(cards, i, me, peer));
            }
            continue;
        }
        struct weft_tp_cards k = { cards, card_bytes, blob_off[i] };
        char w[160] = "";
        if (t->reach(&k, me, peer, w, sizeof(w))) {
            if (t->ctrl)
                *carrier = i;
            else
                *mover = i;
        } else if (t->ctrl && *carrier < 0 && why && whylen) {
            size_t l = strlen(why);
            snprintf(why + l, whylen - l, "; not %s: %s", t->name, w[0] ? w : "refused");
        }
    }
}

static void choose(const unsigned char *cards, int me, int peer, int *carrier, int *mover, char *why, size_t whylen)
{
    choose_all(cards, me, peer, carrier, mover, why, whylen, 0);
}

int weft_p2p_describe_pair(const struct weft_p2p *p, const unsigned char *cards, int peer,
                           struct weft_p2p_pair_info *out)
{
    int carrier, mover;
    char refusals[384];
    const struct weft_card_hdr *mh, *h;

    memset(out, 0, sizeof(*out));
    if (p == NULL || cards == NULL || peer < 0 || peer >= p->size)
        return WEFT_ERR_INVALID_ARG;
    mh = hdr_of(cards, p->rank);
    h = hdr_of(cards, peer);
    /* What the pipe really uses (connect set it), and the reasons the
     * same choice gives, with every earlier carrier's refusal. */
    choose_all(cards, p->rank, peer, &carrier, &mover, refusals, sizeof(refusals), 1);
    const struct weft_peer_pipe *pp = &p->pipes[peer];
    snprintf(out->carrier, sizeof(out->carrier), "%s", pp->carrier.tp ? pp->carrier.tp->name : "none");
    snprintf(out->mover, sizeof(out->mover), "%s", pp->mover.tp ? pp->mover.tp->name : "");
    out->same_node = h->node == mh->node;
    snprintf(out->host, sizeof(out->host), "%s", h->hostname);
    snprintf(out->why, sizeof(out->why), "%s%s; %s is the first carrier that reaches it%s",
             peer == p->rank ? "this rank" : out->same_node ? "same node" : "other node",
             mh->node_key != h->node_key ? " (other host)" : p->core->cfg.virtual_nodes && !out->same_node
             ? " (WEFT_VIRTUAL_NODES)" : "", out->carrier, refusals);
    return WEFT_SUCCESS;
}

int weft_p2p_offer(struct weft_p2p *p, unsigned char *cards)
{
    int me = p->rank, rc = WEFT_SUCCESS;
    unsigned char *covered = calloc((size_t)p->size, 1);
    unsigned char *mine = cards + (size_t)me * card_bytes;

    if (covered == NULL)
        return weft_set_error(p->core, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for %d peers", p->size);
    for (int i = 0; i < p->ntps && rc == WEFT_SUCCESS; i++) {
        struct weft_p2p_tp *t = &p->tps[i];
        int needed = 0;
        for (int q = 0; q < p->size; q++) {
            if (!allowed(cards, i, me, q))
                continue;
            if (!t->tp->ctrl || !covered[q])
                needed = 1;
            if (t->tp->ctrl && t->tp->sure)
                covered[q] = 1;
        }
        if (!needed)
            continue;
        t->env.cards.base = cards;
        rc = t->tp->create(&t->env, mine + blob_off[i], &t->ctx);
    }
    free(covered);
    return rc;
}

int weft_p2p_connect(struct weft_p2p *p, const unsigned char *cards, const struct weft_tp_collective *coll,
                     void *scratch)
{
    struct weft_core *core = p->core;
    int me = p->rank, rc = WEFT_SUCCESS;
    int used_anywhere[WEFT_P2P_MAX_TRANSPORTS] = { 0 };
    char why[512];

    for (int i = 0; i < p->ntps; i++) {
        p->tps[i].env.cards.base = cards;
        p->tps[i].env.coll = coll;
    }
    /* This rank's pairs only (O(n) reach() calls, not O(n^2)); which
     * transports they use goes to every rank in the alltoall below, whose
     * OR over all ranks says which transports some pair uses. */
    uint32_t used_here = 0;
    for (int peer = 0; peer < p->size && rc == WEFT_SUCCESS; peer++) {
        struct weft_peer_pipe *pp = &p->pipes[peer];
        int carrier, mover;
        choose(cards, me, peer, &carrier, &mover, why, sizeof(why));
        if (carrier < 0) {
            const struct weft_card_hdr *h = hdr_of(cards, peer);
            rc = weft_set_error(core, WEFT_ERR_UNSUPPORTED,
                                "no transport reaches peer %d (host %s, %s node): WEFT_TRANSPORTS allows 0x%x here "
                                "and 0x%x there%s", peer, h->hostname,
                                h->node == hdr_of(cards, me)->node ? "same" : "other",
                                hdr_of(cards, me)->transports_mask, h->transports_mask, why);
            break;
        }
        pp->carrier.tp = p->tps[carrier].tp;
        pp->carrier.ctx = p->tps[carrier].ctx;
        p->tps[carrier].uses[peer] = 1;
        p->tps[carrier].used = 1;
        used_here |= 1u << carrier;
        if (mover >= 0) {
            used_here |= 1u << mover;
            pp->mover.tp = p->tps[mover].tp;
            pp->mover.ctx = p->tps[mover].ctx;
            p->tps[mover].uses[peer] = 1;
            p->tps[mover].used = 1;
        }
    }
    /* The exchange is also the agreement on the choice: a rank that found
     * no carrier sends the failure bit, every rank sees it, and all of them
     * then agree (so the messages name the rank that failed). */
    const uint32_t failed_bit = 1u << 31;
    uint32_t *masks = scratch;
    for (int i = 0; i < p->size; i++)
        masks[i] = used_here | (rc != WEFT_SUCCESS ? failed_bit : 0);
    int xrc = coll->alltoall(coll->arg, masks, masks + p->size, sizeof(uint32_t));
    int any_failed = xrc != WEFT_SUCCESS;
    for (int i = 0; xrc == WEFT_SUCCESS && i < p->size; i++) {
        any_failed |= (masks[p->size + i] & failed_bit) != 0;
        for (int t = 0; t < p->ntps; t++)
            if (masks[p->size + i] & (1u << t))
                used_anywhere[t] = 1;
    }
    if (any_failed)
        return coll->agree(coll->arg, rc != WEFT_SUCCESS ? rc : xrc, "choosing transports");

    /* Every rank connects every transport, in one order (each may run its
     * own collectives, whatever happened to the others here). */
    for (int i = 0; i < p->ntps; i++) {
        struct weft_p2p_tp *t = &p->tps[i];
        t->env.used_anywhere = used_anywhere[i];
        int trc = t->tp->connect(&t->env, t->ctx);
        if (rc == WEFT_SUCCESS)
            rc = trc;
    }
    if (rc != WEFT_SUCCESS)
        return rc;
    weft_health_connect(p, cards, card_bytes);
    p->nused = 0;
    for (int i = 0; i < p->ntps; i++)
        if (p->tps[i].used && p->tps[i].tp->progress)
            p->used[p->nused++] = i;
    for (int peer = 0; peer < p->size; peer++) {
        struct weft_peer_pipe *pp = &p->pipes[peer];
        pp->eager_limit = pp->carrier.tp->eager_limit(pp->carrier.ctx, peer, 0);
        pp->eager_limit_internal = pp->carrier.tp->eager_limit(pp->carrier.ctx, peer, 1);
    }

    if (weft_log_level() >= WEFT_LOG_INFO) {
        const struct weft_card_hdr *mh = hdr_of(cards, me);
        WEFT_INFO(me, "comm of %d ranks on %d node(s)%s; this rank on host %s, node %d", p->size, core->num_nodes,
                  core->cfg.virtual_nodes ? " (WEFT_VIRTUAL_NODES)" : "", mh->hostname, mh->node);
        if (strcmp(core->cfg.threads, "serialized") == 0)
            WEFT_INFO(me, "%s", p->nolock ? "WEFT_THREADS=serialized: the comm's calls take no lock (the program "
                                            "calls into it from one thread at a time)"
                                          : "WEFT_THREADS=serialized has no effect: WEFT_PROGRESS_THREAD=1 moves the "
                                            "comm's pipes from a thread of weft's, so its calls take the lock");
        for (int peer = 0; peer < p->size; peer++) {
            const struct weft_peer_pipe *pp = &p->pipes[peer];
            const struct weft_card_hdr *h = hdr_of(cards, peer);
            int carrier, mover;
            choose(cards, me, peer, &carrier, &mover, why, sizeof(why));
            WEFT_INFO(me, "peer %d: transport %s (%s, %s%s%s%s, host %s), eager limit %zu", peer,
                      pp->carrier.tp->name, peer == me ? "this rank" : h->node == mh->node ? "same node" : "other node",
                      pp->carrier.tp->name, pp->mover.tp ? ", device data also by " : "",
                      pp->mover.tp ? pp->mover.tp->name : "", why, h->hostname, pp->eager_limit);
        }
    }
    return WEFT_SUCCESS;
}

/* ---- teardown ---- */

static int anything_busy(struct weft_p2p *p)
{
    if (p->out_queued != 0)
        return 1;
    for (int i = 0; i < weft_rndv_npaths; i++)
        if (weft_rndv_paths[i]->busy && weft_rndv_paths[i]->busy(p))
            return 1;
    for (int i = 0; i < p->ntps; i++)
        if (p->tps[i].used && p->tps[i].tp->busy && p->tps[i].tp->busy(p->tps[i].ctx))
            return 1;
    return 0;
}

int weft_p2p_flush(struct weft_p2p *p, double bound_s)
{
    weft_p2p_lock(p);
    const double until = weft_now() + bound_s;
    int busy;
    while ((busy = anything_busy(p)) != 0) {
        if (weft_p2p_progress(p) > 0)
            continue;
        if (weft_now() >= until)
            break;
        weft_p2p_unlock(p);
        weft_nap_us(200);
        weft_p2p_lock(p);
    }
    weft_p2p_unlock(p);
    return !busy;
}

void weft_p2p_detach(struct weft_p2p *p)
{
    weft_p2p_lock(p);
    for (int i = p->ntps; i-- > 0;)
        if (p->tps[i].ctx && p->tps[i].tp->detach)
            p->tps[i].tp->detach(p->tps[i].ctx);
    weft_p2p_unlock(p);
}

int weft_p2p_drain(struct weft_p2p *p)
{
    const struct weft_core *core = p->core;
    double start = weft_now();
    struct weft_backoff bo;
    int rc = WEFT_SUCCESS;

    weft_backoff_init(&bo, core);
    weft_p2p_lock(p);
    while (anything_busy(p)) {
        if (weft_p2p_progress(p) > 0) {
            weft_backoff_busy(&bo);
        } else {
            if (weft_wait_expired(&core->cfg, WEFT_WAIT_DESTROY, start, weft_now())) {
                rc = weft_set_error(p->core, WEFT_ERR_TIMEOUT,
                                    "weft_comm_destroy: outbound messages still queued after %.0f s",
                                    weft_wait_bound(&core->cfg, WEFT_WAIT_DESTROY));
                break;
            }
            weft_p2p_unlock(p);
            weft_backoff_idle(&bo, weft_now(), 50);
            weft_p2p_lock(p);
        }
    }
    /* The user's requests still outstanding: failed and freed (their
     * handles stop resolving with the comm's table entry). */
    size_t left = 0;
    for (uint32_t c = 0; c < p->reqs.nchunks; c++)
        for (uint32_t i = 0; i < WEFT_REQ_CHUNK; i++) {
            struct weft_request *r = &p->reqs.chunks[c][i];
            if (r->state == WEFT_REQ_FREE || !r->user)
                continue;
            left++;
            if (r->type == WEFT_REQ_UPPER) {
                /* The layer above gave its work up before the drain. */
                r->state = WEFT_REQ_DONE;
                continue;
            }
            if (r->state != WEFT_REQ_DONE && !weft_pipe_cancel(r, WEFT_ERR_INVALID_ARG))
                weft_pipe_break(r->pipe, WEFT_ERR_INVALID_ARG);
        }
    for (uint32_t c = 0; c < p->reqs.nchunks; c++)
        for (uint32_t i = 0; i < WEFT_REQ_CHUNK; i++) {
            struct weft_request *r = &p->reqs.chunks[c][i];
            if (r->state == WEFT_REQ_DONE && r->user)
                weft_req_free(r);
        }
    if (left)
        rc = weft_set_error(p->core, WEFT_ERR_INVALID_ARG,
                            "weft_comm_destroy: %zu request(s) were still outstanding (never completed by "
                            "weft_test/weft_wait/weft_waitall); they were failed and freed", left);
    for (int i = 0; i < p->size; i++)
        if (p->pipes[i].ninflight)
            WEFT_WARN(p->rank, "weft_comm_destroy: %zu request(s) with peer %d still in flight",
                      p->pipes[i].ninflight, i);
    weft_p2p_unlock(p);
    return rc;
}

int weft_p2p_survivor_barrier(struct weft_p2p *p)
{
    struct weft_request **rs = calloc(2 * (size_t)p->size, sizeof(*rs));
    size_t n = 0;
    int rc = WEFT_SUCCESS;

    if (rs == NULL)
        return weft_set_error(p->core, WEFT_ERR_NO_MEMORY, "weft_comm_destroy: no memory for the final barrier");
    weft_p2p_lock(p);
    /* Every live peer: a 0-byte message each way, twice. A peer that failed
     * meanwhile fails its pair of requests (bounded by WEFT_TIMEOUT). Two
     * rounds because a message may be a pair's first (lazy connections):
     * a peer's round-2 message says it has taken our round-1 message, so
     * the lane toward it is open on its side before we leave and tear
     * ours down (an shm lane whose name goes with its unopened sender
     * would lose the message). Same tag: a lane is FIFO per peer. */
    for (int round = 0; round < 2 && rc == WEFT_SUCCESS; round++) {
        /* No peer closes before we sent our round-2 message (it needs it
         * to finish); from then on a peer's close is its goodbye. */
        __atomic_store_n(&p->core->leaving, round == 1, __ATOMIC_RELEASE);
        n = 0;
        for (int i = 0; i < p->size; i++) {
            struct weft_peer_pipe *pp = &p->pipes[i];
            if (i == p->rank || pp->broken)
                continue;
            if (weft_pipe_irecv(pp, NULL, 0, WEFT_TAG_DESTROY, WEFT_MEM_HOST, -1, NULL, &rs[n]) == WEFT_SUCCESS)
                n++;
            if (weft_pipe_isend(pp, NULL, 0, WEFT_TAG_DESTROY, WEFT_MEM_HOST, -1, NULL, &rs[n]) == WEFT_SUCCESS)
                n++;
        }
        rc = weft_p2p_progress_wait(p, rs, n, "weft_comm_destroy (final barrier of the surviving ranks)");
        for (size_t i = 0; i < n; i++)
            weft_req_free(rs[i]);
    }
    weft_p2p_unlock(p);
    free(rs);
    return rc;
}

int weft_p2p_any_failed(struct weft_p2p *p)
{
    weft_p2p_lock(p);
    int n = p->nfailed || __atomic_load_n(&p->core->aborted, __ATOMIC_ACQUIRE);
    weft_p2p_unlock(p);
    return n;
}

int weft_p2p_watch_processes(struct weft_p2p *p)
{
    weft_p2p_lock(p);
    weft_health_watch_processes(p);
    int n = p->nfailed || __atomic_load_n(&p->core->aborted, __ATOMIC_ACQUIRE);
    weft_p2p_unlock(p);
    return n;
}

int weft_p2p_broken_links(struct weft_p2p *p, char *why, size_t n)
{
    int count = 0, first = -1;
    weft_p2p_lock(p);
    for (int i = 0; i < p->size; i++)
        if (i != p->rank && p->pipes[i].broken && !p->pipes[i].failed && count++ == 0)
            first = i;
    if (count > 0 && why != NULL && n > 0)
        snprintf(why, n, "the link to peer %d is down (%s)%s", first, weft_err_str(p->pipes[first].broken),
                 count > 1 ? ", and others" : "");
    weft_p2p_unlock(p);
    return count;
}

void weft_p2p_destroy(struct weft_p2p *p)
{
    if (p == NULL)
        return;
    weft_engine_destroy(p->engine);   /* its thread first: it polls what goes below */
    p->engine = NULL;
    weft_req_table_remove(p);
    weft_health_fini(p);
    /* Transports last to first (movers before the carriers they ride on). */
    for (int i = p->ntps - 1; i >= 0; i--) {
        if (p->tps[i].ctx)
            p->tps[i].tp->destroy(p->tps[i].ctx);
        p->tps[i].ctx = NULL;
        free(p->tps[i].uses);
    }
    weft_stage_fini(p);
    if (p->pipes) {
        for (int i = 0; i < p->size; i++)
            weft_pipe_fini(&p->pipes[i]);
        free(p->pipes);
    }
    weft_req_pool_fini(p);
    weft_payload_cache_fini(&p->payloads);
    while (p->kept) {   /* nothing can read it now: the transports are gone */
        struct weft_p2p_kept *k = p->kept;
        p->kept = k->next;
        free(k->mem);
        free(k);
    }
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void weft_p2p_keep(struct weft_p2p *p, void *mem)
{
    struct weft_p2p_kept *k = malloc(sizeof *k);
    if (k == NULL)
        return;   /* no memory for the record: mem stays allocated (a leak, never a use after free) */
    k->mem = mem;
    weft_p2p_lock(p);
    k->next = p->kept;
    p->kept = k;
    weft_p2p_unlock(p);
}
