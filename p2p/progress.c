/*
 * Progress and waiting.
 *
 * Progress runs inside test/wait: one pass polls every transport in use and
 * retries queued outbound messages. A waiter that sees nothing happen backs
 * off in three stages: it spins (WEFT_SPIN_US, skipped when the node has
 * more ranks than cores, where spinning only steals the peer's time slice),
 * then yields the CPU for a while, then sleeps in a transport (futex on the
 * shm doorbell, poll on sockets) until a peer wakes it or a short timeout.
 * WEFT_TIMEOUT bounds the time without any progress; then the pipes of the
 * requests still waiting are broken so nothing waits forever.
 *
 * Device work (staged chunks, p2p/stage.c; CUDA IPC copies, p2p/cuda_ipc.c)
 * advances in the same pass when the comm has CUDA or staged work; no peer
 * knocks when a copy on weft's stream ends, so while one runs a waiter naps
 * briefly and polls instead of sleeping in a transport.
 */
#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "cuda_ipc.h"
#include "log.h"
#include "pipe.h"
#include "stage.h"
#include "transport.h"

/* How long a waiter yields before it sleeps, and the longest single sleep
 * (bounds how late a wake-up from a source with no doorbell is seen). */
#define WEFT_YIELD_S      0.002
#define WEFT_SLEEP_MAX_MS 100

double weft_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int weft_progress(struct weft_comm *c)
{
    int n = 0;

    for (int id = 0; id < WEFT_TP_COUNT; id++) {
        if (c->tp_used & (1u << id)) {
            int k = weft_transport_get(id)->progress(c);
            if (k > 0)
                n += k;
        }
    }
    if (c->stage_state)
        n += weft_stage_progress(c);
    if (c->cuda)
        n += weft_cuda_ipc_progress(c);
    if (c->out_queued) {
        for (int i = 0; i < c->size; i++)
            if (c->pipes[i].out_head)
                n += weft_pipe_flush(&c->pipes[i]);
    }
    c->events += (uint64_t)n;
    return n;
}

/* Sleeps in the transport that can wake us; lock released meanwhile. */
static void wait_sleep(struct weft_comm *c, int timeout_ms)
{
    const struct weft_transport *tcp = weft_transport_get(WEFT_TP_TCP);
    const struct weft_transport *shm = weft_transport_get(WEFT_TP_SHM);
    int use_tcp = (c->tp_used & (1u << WEFT_TP_TCP)) && tcp && tcp->sleep;
    int use_shm = (c->tp_used & (1u << WEFT_TP_SHM)) && shm && shm->sleep;
    int unsleepable = 0;   /* a transport in use that nothing can wake us for (ib: completions are polled) */

    for (int id = WEFT_TP_SELF + 1; id < WEFT_TP_COUNT; id++) {
        const struct weft_transport *tp = weft_transport_get(id);
        if ((c->tp_used & (1u << id)) && tp && tp->sleep == NULL)
            unsleepable = 1;
    }
    /* A copy on a CUDA stream ends without a knock: poll for it. */
    if ((c->stage_state && weft_stage_copies_pending(c)) || (c->cuda && weft_cuda_ipc_busy(c)))
        unsleepable = 1;

    /* Another waiting thread of this process may complete our request
     * without any peer knocking: keep sleeps short then. A poll on sockets
     * cannot see a shm doorbell either, so mixed comms sleep briefly. */
    if (c->waiters > 1 || (use_tcp && use_shm))
        timeout_ms = 1;

    pthread_mutex_unlock(&c->lock);
    if (unsleepable) {
        /* Completions arrive without a knock: nap briefly and poll again. */
        struct timespec ts = { 0, 100 * 1000 };
        nanosleep(&ts, NULL);
    } else if (use_tcp)
        tcp->sleep(c, timeout_ms);
    else if (use_shm)
        shm->sleep(c, timeout_ms);
    else {
        struct timespec ts = { 0, 200 * 1000 };  /* self only: nothing can knock */
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&c->lock);
}

static const char *req_what(const struct weft_request *r)
{
    return r->type == WEFT_REQ_SEND ? "send to" : "recv from";
}

int weft_progress_wait(struct weft_comm *c, struct weft_request **reqs, size_t n, const char *what)
{
    double last = weft_now();
    double spin_s = c->oversubscribed ? 0.0 : 1e-6 * c->cfg.spin_us;
    size_t first = 0;   /* reqs before this index are done */
    int rc = WEFT_SUCCESS;

    c->waiters++;
    for (unsigned polls = 0;; polls++) {
        while (first < n && (reqs[first] == NULL || reqs[first]->state == WEFT_REQ_DONE))
            first++;
        if (first == n)
            break;

        if (weft_progress(c) > 0) {
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
        if (!c->oversubscribed && polls % 32 != 31)
            continue;

        double now = weft_now();
        if (last < 0)
            last = now;
        double idle = now - last;
        if (c->cfg.timeout_s > 0 && idle >= c->cfg.timeout_s) {
            struct weft_request *r = reqs[first];
            weft_set_error(c, WEFT_ERR_TIMEOUT,
                           "%s timed out after %.0f s with no progress: %s peer %d tag %d bytes %zu over %s", what,
                           c->cfg.timeout_s, req_what(r), r->pipe->peer, r->tag, r->bytes,
                           r->pipe->tp ? r->pipe->tp->name : "none");
            for (size_t i = first; i < n; i++)
                if (reqs[i] && reqs[i]->state != WEFT_REQ_DONE)
                    weft_pipe_break(reqs[i]->pipe, WEFT_ERR_TIMEOUT);
            rc = WEFT_ERR_TIMEOUT;
            break;
        }
        if (idle < spin_s) {
            /* Spin, but let other threads of this process at the lock. */
            pthread_mutex_unlock(&c->lock);
            pthread_mutex_lock(&c->lock);
        } else if (idle < spin_s + WEFT_YIELD_S) {
            pthread_mutex_unlock(&c->lock);
            sched_yield();
            pthread_mutex_lock(&c->lock);
        } else {
            int ms = WEFT_SLEEP_MAX_MS;
            if (c->cfg.timeout_s > 0) {
                double left_ms = (c->cfg.timeout_s - idle) * 1e3;
                if (left_ms < ms)
                    ms = left_ms < 1 ? 1 : (int)left_ms;
            }
            wait_sleep(c, ms);
        }
    }
    c->waiters--;
    return rc;
}

/* Requests are recycled per comm: a malloc/free pair per message cost
 * about as much as the rest of a small send. */
#define WEFT_REQ_POOL_MAX 1024

struct weft_request *weft_request_alloc(struct weft_comm *c)
{
    struct weft_request *r = c->req_free;
    if (r == NULL)
        return calloc(1, sizeof(*r));
    c->req_free = r->next;
    c->req_free_count--;
    memset(r, 0, sizeof(*r));
    return r;
}

void weft_request_free(struct weft_request *r)
{
    struct weft_comm *c = r->comm;
    if (c->req_free_count >= WEFT_REQ_POOL_MAX) {
        free(r);
        return;
    }
    r->next = c->req_free;
    c->req_free = r;
    c->req_free_count++;
}

void weft_request_pool_fini(struct weft_comm *c)
{
    while (c->req_free) {
        struct weft_request *r = c->req_free;
        c->req_free = r->next;
        free(r);
    }
    c->req_free_count = 0;
}
