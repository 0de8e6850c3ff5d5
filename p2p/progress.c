/*
 * Progress and waiting.
 *
 * Progress runs inside test/wait: one pass polls every transport in use,
 * the rendezvous paths with work of their own (staged chunks), and retries
 * queued outbound frames. A waiter that sees nothing happen backs off in
 * three stages: it spins (WEFT_SPIN_US, skipped when the node has more
 * ranks than cores, where spinning only steals the peer's time slice), then
 * yields the CPU for a while, then sleeps in a transport (futex on the shm
 * doorbell, poll on sockets) until a peer wakes it or a short timeout.
 * WEFT_TIMEOUT bounds, per request, the time its pipe shows no activity
 * (frames from the peer other than heartbeats, rendezvous data); then
 * p2p/health.c decides whom to blame and fails the request (and, for a
 * peer that died or stopped, its pipe), so nothing waits forever and a
 * busy neighbour does not keep a wait on a stopped peer alive.
 *
 * Work that completes with no knock (completion queues, copies on a CUDA
 * stream: a transport's or path's wakeless()) makes a waiter nap briefly
 * and poll instead of sleeping in a transport.
 */
#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "context.h"
#include "health.h"
#include "log.h"
#include "pipe.h"
#include "rndv.h"
#include "deadline.h"

/* How long a waiter yields before it sleeps, and the longest single sleep
 * (bounds how late a wake-up from a source with no doorbell is seen). */
#define WEFT_YIELD_S      0.002
#define WEFT_SLEEP_MAX_MS 100
/* The longest sleep of a waiter while the comm has a wait hook. */
#define WEFT_WAIT_HOOK_MS 1
/* While yielding, the wait hook runs at most this often: it costs more
 * than a poll (an MPI progress pass), and the wait is idle only briefly. */
#define WEFT_WAIT_HOOK_GAP_S 20e-6

int weft_p2p_progress(struct weft_p2p *p)
{
    int n = 0;

    for (int i = 0; i < p->nused; i++) {
        const struct weft_p2p_tp *t = &p->tps[p->used[i]];
        int k = t->tp->progress(t->ctx);
        if (k > 0)
            n += k;
    }
    if (p->path_ops)
        for (int i = 0; i < weft_rndv_npaths; i++)
            if (weft_rndv_paths[i]->progress)
                n += weft_rndv_paths[i]->progress(p);
    if (p->out_queued) {
        for (int i = 0; i < p->size; i++)
            if (!weft_queue_empty(&p->pipes[i].out) || p->pipes[i].credit_owed)
                n += weft_pipe_flush(&p->pipes[i]);
    }
    p->events += (uint64_t)n;
    return n;
}

/* Sleeps in the transport that can wake us; lock released meanwhile. */
static void wait_sleep(struct weft_p2p *p, int timeout_ms)
{
    const struct weft_p2p_tp *sleeper = NULL;
    int sleepers = 0, wakeless = 0;

    for (int i = 0; i < p->ntps; i++) {
        const struct weft_p2p_tp *t = &p->tps[i];
        if (!t->used)
            continue;
        if (t->tp->wakeless && t->tp->wakeless(t->ctx))
            wakeless = 1;
        if (t->tp->sleep) {
            sleeper = t;   /* the last in priority order: the network one in a mixed comm */
            sleepers++;
        }
    }
    for (int i = 0; i < weft_rndv_npaths; i++)
        if (weft_rndv_paths[i]->wakeless && weft_rndv_paths[i]->wakeless(p))
            wakeless = 1;

    /* Another waiting thread of this process may complete our request
     * without any peer knocking: keep sleeps short then. One transport's
     * sleep cannot see another's doorbell either (a poll on sockets does
     * not see the shm futex), so mixed comms sleep briefly. */
    if (p->waiters > 1 || sleepers > 1)
        timeout_ms = 1;
    /* The application's wait hook must run often (MPI progress of its own
     * messages, which may be what the peer we wait for waits on). */
    if (p->wait_hook && timeout_ms > WEFT_WAIT_HOOK_MS && !weft_p2p_in_internal_thread())
        timeout_ms = WEFT_WAIT_HOOK_MS;

    pthread_mutex_unlock(&p->lock);
    if (wakeless) {
        /* Completions arrive without a knock: nap briefly and poll again. */
        struct timespec ts = { 0, 100 * 1000 };
        nanosleep(&ts, NULL);
    } else if (sleeper) {
        sleeper->tp->sleep(sleeper->ctx, timeout_ms);
    } else {
        struct timespec ts = { 0, 200 * 1000 };  /* self only: nothing can knock */
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&p->lock);
}

/* The per-request clocks (and the peers' health) of reqs[first..n): 0, or
 * the code of a request that just failed for making no progress. */
static int watch(struct weft_p2p *p, struct weft_request **reqs, size_t first, size_t n, double now,
                 const char *what)
{
    double timeout = weft_wait_bound(&p->core->cfg, WEFT_WAIT_REQUEST);
    int rc = WEFT_SUCCESS;

    weft_health_tick(p, now);
    if (timeout <= 0)
        return rc;   /* WEFT_TIMEOUT=0: never */
    for (size_t i = first; i < n; i++) {
        struct weft_request *r = reqs[i];
        if (r == NULL || r->state == WEFT_REQ_DONE || r->type == WEFT_REQ_UPPER)
            continue;
        if (r->idle_since == 0 || r->activity != r->pipe->activity) {
            r->activity = r->pipe->activity;
            r->idle_since = now;
            continue;
        }
        if (now - r->idle_since >= timeout && weft_health_stuck(p, r, now, now - r->idle_since, what)) {
            if (r->state != WEFT_REQ_DONE)
                r->idle_since = now;   /* held by a path that lets go later: look again after a timeout */
            else if (rc == WEFT_SUCCESS)
                rc = r->status.error != WEFT_SUCCESS ? r->status.error : WEFT_ERR_TIMEOUT;
        }
    }
    return rc;
}

/* watch() at most every 50 ms of the wait; its first failure kept in *rc.
 * 1 when it ran. */
static int watch_due(struct weft_p2p *p, struct weft_request **reqs, size_t first, size_t n, double now,
                     const char *what, double *watched, int *rc)
{
    if (now - *watched < 0.05)
        return 0;
    *watched = now;
    int wrc = watch(p, reqs, first, n, now, what);
    if (wrc != WEFT_SUCCESS && *rc == WEFT_SUCCESS)
        *rc = wrc;
    return 1;
}

void weft_p2p_watch_one(struct weft_p2p *p, struct weft_request *r, const char *what)
{
    (void)watch(p, &r, 0, 1, weft_now(), what);
}

int weft_p2p_progress_wait(struct weft_p2p *p, struct weft_request **reqs, size_t n, const char *what)
{
    return weft_p2p_progress_wait_until(p, reqs, n, what, NULL);
}

int weft_p2p_progress_wait_until(struct weft_p2p *p, struct weft_request **reqs, size_t n, const char *what,
                                 const uint64_t *stop_epoch)
{
    const struct weft_core *core = p->core;
    /* The idle clock starts at the first idle look (last < 0: not read
     * yet): a wait that completes at once never reads the clock. */
    double last = -1.0, watched = 0, hooked = 0;
    double spin_s = core->oversubscribed ? 0.0 : 1e-6 * core->cfg.spin_us;
    size_t first = 0;   /* reqs before this index are done */
    int rc = WEFT_SUCCESS;

    p->waiters++;
    for (unsigned polls = 0, busy = 0;; polls++) {
        while (first < n && (reqs[first] == NULL || reqs[first]->state == WEFT_REQ_DONE))
            first++;
        if (first == n)
            break;

        if (weft_p2p_progress(p) > 0) {
            polls = 0;
            last = -1.0;   /* read the clock lazily: only when idle */
            /* Traffic of other requests must not hide one that makes no
             * progress: its clock is looked at while busy too. */
            if (++busy % 64 == 0) {
                watch_due(p, reqs, first, n, weft_now(), what, &watched, &rc);
                if (stop_epoch && p->fault_epoch != *stop_epoch) {
                    rc = WEFT_P2P_FAULT;
                    break;
                }
            }
            continue;
        }
        if (reqs[first]->state == WEFT_REQ_DONE)
            continue;
        /* Idle polls are cheap; the clock and the lock hand-off are not,
         * so the busy-poll phase looks at them once every 32 polls. With
         * more ranks than cores every idle poll yields at once instead:
         * the peer we wait for may be queued behind us on this core. */
        if (!core->oversubscribed && polls % 32 != 31)
            continue;

        double now = weft_now();
        if (last < 0)
            last = now;
        double idle = now - last;
        if (stop_epoch && p->fault_epoch != *stop_epoch) {
            rc = WEFT_P2P_FAULT;
            break;
        }
        if (watch_due(p, reqs, first, n, now, what, &watched, &rc)) {
            if (stop_epoch && p->fault_epoch != *stop_epoch) {
                rc = WEFT_P2P_FAULT;
                break;
            }
            continue;
        }
        if (idle < spin_s) {
            /* Spin, but let other threads of this process at the lock. */
            pthread_mutex_unlock(&p->lock);
            pthread_mutex_lock(&p->lock);
        } else if (idle < spin_s + WEFT_YIELD_S) {
            /* Idle: the layer above's work (non-blocking collectives
             * whose next steps wait for someone to issue them). */
            weft_p2p_run_idle_hook(p);
            if (now - hooked >= WEFT_WAIT_HOOK_GAP_S) {
                hooked = now;
                weft_p2p_run_wait_hook(p);
            }
            pthread_mutex_unlock(&p->lock);
            sched_yield();
            pthread_mutex_lock(&p->lock);
        } else {
            weft_p2p_run_idle_hook(p);
            hooked = now;
            weft_p2p_run_wait_hook(p);
            /* Short enough for the per-request clocks and heartbeats. */
            wait_sleep(p, weft_waits_never_fail(&core->cfg) ? WEFT_SLEEP_MAX_MS : 50);
        }
    }
    p->waiters--;
    return rc;
}

int weft_p2p_poll_nap(struct weft_p2p *p, int nap_ms)
{
    pthread_mutex_lock(&p->lock);
    int n = weft_p2p_progress(p);
    /* Heartbeats and the peers' health: what fails the requests of a
     * peer that died, with no waiter of ours to look at their clocks. */
    weft_health_tick(p, weft_now());
    if (n == 0 && nap_ms > 0)
        wait_sleep(p, nap_ms);
    pthread_mutex_unlock(&p->lock);
    return n;
}
