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
 * WEFT_TIMEOUT bounds the time without any progress; then the pipes of the
 * requests still waiting are broken so nothing waits forever.
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
#include "log.h"
#include "pipe.h"
#include "rndv.h"

/* How long a waiter yields before it sleeps, and the longest single sleep
 * (bounds how late a wake-up from a source with no doorbell is seen). */
#define WEFT_YIELD_S      0.002
#define WEFT_SLEEP_MAX_MS 100

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
            if (!weft_queue_empty(&p->pipes[i].out))
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

static const char *req_what(const struct weft_request *r)
{
    return r->type == WEFT_REQ_SEND ? "send to" : "recv from";
}

int weft_p2p_progress_wait(struct weft_p2p *p, struct weft_request **reqs, size_t n, const char *what)
{
    const struct weft_core *core = p->core;
    double last = weft_now();
    double spin_s = core->oversubscribed ? 0.0 : 1e-6 * core->cfg.spin_us;
    size_t first = 0;   /* reqs before this index are done */
    int rc = WEFT_SUCCESS;

    p->waiters++;
    for (unsigned polls = 0;; polls++) {
        while (first < n && (reqs[first] == NULL || reqs[first]->state == WEFT_REQ_DONE))
            first++;
        if (first == n)
            break;

        if (weft_p2p_progress(p) > 0) {
            polls = 0;
            last = -1.0;   /* read the clock lazily: only when idle */
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
        if (core->cfg.timeout_s > 0 && idle >= core->cfg.timeout_s) {
            struct weft_request *r = reqs[first];
            weft_set_error(p->core, WEFT_ERR_TIMEOUT,
                           "%s timed out after %.0f s with no progress: %s peer %d tag %d bytes %zu over %s", what,
                           core->cfg.timeout_s, req_what(r), r->pipe->peer, r->tag, r->bytes,
                           weft_pipe_tp_name(r->pipe));
            for (size_t i = first; i < n; i++)
                if (reqs[i] && reqs[i]->state != WEFT_REQ_DONE)
                    weft_pipe_break(reqs[i]->pipe, WEFT_ERR_TIMEOUT);
            rc = WEFT_ERR_TIMEOUT;
            break;
        }
        if (idle < spin_s) {
            /* Spin, but let other threads of this process at the lock. */
            pthread_mutex_unlock(&p->lock);
            pthread_mutex_lock(&p->lock);
        } else if (idle < spin_s + WEFT_YIELD_S) {
            pthread_mutex_unlock(&p->lock);
            sched_yield();
            pthread_mutex_lock(&p->lock);
        } else {
            int ms = WEFT_SLEEP_MAX_MS;
            if (core->cfg.timeout_s > 0) {
                double left_ms = (core->cfg.timeout_s - idle) * 1e3;
                if (left_ms < ms)
                    ms = left_ms < 1 ? 1 : (int)left_ms;
            }
            wait_sleep(p, ms);
        }
    }
    p->waiters--;
    return rc;
}
