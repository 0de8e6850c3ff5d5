/*
 * The progress engine of one comm (engine.h): its clients, the application's
 * waits, the comm's one progress thread.
 *
 * The application's wait (weft_p2p_progress_wait_until) polls every
 * transport in use, the rendezvous paths with work of their own (staged
 * chunks), and queued outbound frames (weft_p2p_progress, p2p/progress.c).
 * A waiter that sees nothing happen backs off by the policy of
 * src/core/backoff.h: it spins, then yields while running the WAITS clients
 * (non-blocking collectives whose next steps wait for someone to issue
 * them, the application's wait hook), then sleeps in a transport (futex on
 * the shm doorbell, poll on sockets) until a peer wakes it or a short
 * timeout. WEFT_TIMEOUT bounds, per request, the time its pipe shows no
 * activity; then p2p/health.c decides whom to blame and fails the request
 * (and, for a peer that died or stopped, its pipe), so nothing waits
 * forever and a busy neighbour does not keep a wait on a stopped peer alive.
 *
 * The progress thread runs the clients it may run while one of them (or,
 * with WEFT_PROGRESS_THREAD=1, a request of the comm) is in flight, one
 * pass of the pipes and the peers' health tick after them, and backs off by
 * the same policy; when nothing is in flight it blocks until a client kicks
 * it (WEFT_PROGRESS_THREAD=1: at most 10 ms, to see requests the
 * application started, which do not kick: that path stays as short as
 * without a thread). While an application thread waits on the comm, that
 * thread moves the pipes and the progress thread only runs its clients.
 */
#include "engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "context.h"
#include "cudawrap.h"
#include "deadline.h"
#include "health.h"
#include "log.h"
#include "rndv.h"

#define ENGINE_MAX_CLIENTS 8
/* The progress thread's longest sleep in a transport while busy: bounds
 * how late it sees a kick or a completion no peer knocks for. */
#define ENGINE_THREAD_SLEEP_MS 1
/* WEFT_PROGRESS_THREAD=1, nothing in flight: how often the thread looks
 * for requests the application started. */
#define ENGINE_IDLE_LOOK_MS 10
/* The longest single sleep of an application waiter (bounds how late a
 * wake-up from a source with no doorbell is seen). */
#define ENGINE_SLEEP_MAX_MS 100
/* ... while its waits can fail: short enough for the per-request clocks and
 * heartbeats. */
#define ENGINE_SLEEP_WATCHED_MS 50

struct engine_slot {
    const struct weft_engine_client *c;   /* NULL: free */
    void                            *arg;
    unsigned                         running;   /* threads inside its members */
    double                           last_run;  /* waits: its last run (min_gap_s) */
};

struct weft_engine {
    struct weft_p2p    *p2p;
    pthread_mutex_t     mu;          /* the slots, the thread's state */
    pthread_cond_t      cv;          /* kicks, stop, a slot's run ended */
    struct engine_slot  slots[ENGINE_MAX_CLIENTS];
    int                 nwaits;      /* WAITS clients registered (read without mu: a hint) */
    int                 sleep_cap_ms;
    int                 want_thread; /* WEFT_PROGRESS_THREAD=1 */
    int                 started;     /* weft_engine_start ran (WEFT_PROGRESS_THREAD=1) */
    int                 thread_on, stop, kicked;
    pthread_t           thread;
};

static _Thread_local int own_thread;

int weft_engine_own_thread(void)
{
    return own_thread;
}

/* ---- clients ---- */

static void recompute_locked(struct weft_engine *e)
{
    int waits = 0, cap = 0;
    for (int i = 0; i < ENGINE_MAX_CLIENTS; i++) {
        const struct weft_engine_client *c = e->slots[i].c;
        if (c == NULL || !(c->flags & WEFT_CLIENT_WAITS))
            continue;
        waits++;
        if (c->sleep_cap_ms > 0 && (cap == 0 || c->sleep_cap_ms < cap))
            cap = c->sleep_cap_ms;
    }
    __atomic_store_n(&e->nwaits, waits, __ATOMIC_RELAXED);
    __atomic_store_n(&e->sleep_cap_ms, cap, __ATOMIC_RELAXED);
}

static int thread_start_locked(struct weft_engine *e);

int weft_engine_register(struct weft_engine *e, const struct weft_engine_client *c, void *arg)
{
    struct weft_core *core = e->p2p->core;
    int rc = WEFT_SUCCESS, free_slot = -1;

    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < ENGINE_MAX_CLIENTS; i++) {
        if (e->slots[i].c == c && e->slots[i].arg == arg)
            goto out;   /* already */
        if (e->slots[i].c == NULL && e->slots[i].running == 0 && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0) {
        rc = weft_set_error(core, WEFT_ERR_INTERNAL, "progress engine: no room for client '%s' (%d clients)", c->name,
                            ENGINE_MAX_CLIENTS);
        goto out;
    }
    e->slots[free_slot].c = c;
    e->slots[free_slot].arg = arg;
    e->slots[free_slot].last_run = 0;
    recompute_locked(e);
    if ((c->flags & WEFT_CLIENT_NEEDS_THREAD) && !e->thread_on)
        rc = thread_start_locked(e);
    e->kicked = 1;
    pthread_cond_broadcast(&e->cv);
out:
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void weft_engine_unregister(struct weft_engine *e, const struct weft_engine_client *c, void *arg)
{
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < ENGINE_MAX_CLIENTS; i++) {
        struct engine_slot *s = &e->slots[i];
        if (s->c != c || s->arg != arg)
            continue;
        s->c = NULL;
        s->arg = NULL;
        recompute_locked(e);
        while (s->running > 0)
            pthread_cond_wait(&e->cv, &e->mu);
        break;
    }
    pthread_mutex_unlock(&e->mu);
}

void weft_engine_kick(struct weft_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->kicked = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Takes the clients that pass `want` (one running reference each) into
 * run[]; mu held. */
static int take_locked(struct weft_engine *e, int (*want)(const struct weft_engine *, const struct engine_slot *, double),
                       double now, struct engine_slot *run[ENGINE_MAX_CLIENTS])
{
    int k = 0;
    for (int i = 0; i < ENGINE_MAX_CLIENTS; i++) {
        struct engine_slot *s = &e->slots[i];
        if (s->c != NULL && want(e, s, now)) {
            s->running++;
            run[k++] = s;
        }
    }
    return k;
}

static void release_locked(struct weft_engine *e, struct engine_slot *run[], int k)
{
    int wake = 0;
    for (int i = 0; i < k; i++)
        if (--run[i]->running == 0 && run[i]->c == NULL)
            wake = 1;
    if (wake)
        pthread_cond_broadcast(&e->cv);
}

/* weft_engine_run_waits' with_app_only, for want_in_waits (set under e->mu). */
static _Thread_local int app_only_too;

static int want_in_waits(const struct weft_engine *e, const struct engine_slot *s, double now)
{
    (void)e;
    if (!(s->c->flags & WEFT_CLIENT_WAITS))
        return 0;
    if ((s->c->flags & WEFT_CLIENT_APP_ONLY) && (own_thread || !app_only_too))
        return 0;
    return s->c->min_gap_s <= 0 || now - s->last_run >= s->c->min_gap_s;
}

void weft_engine_run_waits(struct weft_engine *e, double now, int with_app_only)
{
    struct engine_slot *run[ENGINE_MAX_CLIENTS];
    void *args[ENGINE_MAX_CLIENTS];
    const struct weft_engine_client *cs[ENGINE_MAX_CLIENTS];

    if (__atomic_load_n(&e->nwaits, __ATOMIC_RELAXED) == 0)
        return;
    pthread_mutex_lock(&e->mu);
    app_only_too = with_app_only;
    int k = take_locked(e, want_in_waits, now, run);
    for (int i = 0; i < k; i++) {
        run[i]->last_run = now;
        cs[i] = run[i]->c;
        args[i] = run[i]->arg;
    }
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < k; i++)
        (void)cs[i]->poll(args[i]);
    pthread_mutex_lock(&e->mu);
    release_locked(e, run, k);
    pthread_mutex_unlock(&e->mu);
}

int weft_engine_sleep_cap_ms(struct weft_engine *e)
{
    return __atomic_load_n(&e->sleep_cap_ms, __ATOMIC_RELAXED);
}

/* ---- sleeping in the transports ---- */

/* Sleeps in the transport that can wake us; p->lock held on entry and on
 * return, released meanwhile. */
static void sleep_in_transport(struct weft_p2p *p, int timeout_ms)
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

    weft_p2p_unlock(p);
    if (wakeless)
        weft_nap_us(100);   /* completions arrive without a knock: nap briefly and poll again */
    else if (sleeper)
        sleeper->tp->sleep(sleeper->ctx, timeout_ms);
    else
        weft_nap_us(200);   /* self only: nothing can knock */
    weft_p2p_lock(p);
}

void weft_engine_idle_step(struct weft_p2p *p, struct weft_backoff *b, int max_ms)
{
    if (weft_backoff_phase(b, weft_now()) != WEFT_BACKOFF_SLEEP) {
        weft_backoff_idle(b, weft_now(), 0);
        return;
    }
    weft_p2p_lock(p);
    sleep_in_transport(p, max_ms);
    weft_p2p_unlock(p);
}

/* ---- the application's waits ---- */

#define COLL_SUSPECT_S 1.0

/* The per-request clocks (and the peers' health) of reqs[first..n): 0, or
 * the code of a request that just failed for making no progress. */
static int watch(struct weft_p2p *p, struct weft_request **reqs, size_t first, size_t n, double now,
                 const char *what)
{
    double timeout = weft_wait_bound(&p->core->cfg, WEFT_WAIT_REQUEST);
    /* A collective receive idle this long asks its peer what it is doing
     * (health.c, weft_health_coll_suspect): long enough that ranks merely
     * arriving at different times rarely ask, short against WEFT_TIMEOUT. */
    double suspect = timeout <= 0 || timeout >= 2 * COLL_SUSPECT_S ? COLL_SUSPECT_S : timeout / 2;
    int rc = WEFT_SUCCESS;

    weft_health_tick(p, now);
    for (size_t i = first; i < n; i++) {
        struct weft_request *r = reqs[i];
        if (r == NULL || r->state == WEFT_REQ_DONE || r->type == WEFT_REQ_UPPER)
            continue;
        if (r->idle_since == 0 || r->activity != r->pipe->activity) {
            r->activity = r->pipe->activity;
            r->idle_since = now;
            continue;
        }
        if (r->checked && now - r->idle_since >= suspect && weft_health_coll_suspect(p, r, now)) {
            if (rc == WEFT_SUCCESS)
                rc = WEFT_ERR_MISMATCH;
            continue;
        }
        if (timeout <= 0)
            continue;   /* WEFT_TIMEOUT=0: never */
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

/* The waiter's sleep: in a transport, bounded so that the clocks are looked
 * at, and by the clients that must run often. Lock held. */
static void wait_sleep(struct weft_p2p *p)
{
    int ms = weft_waits_never_fail(&p->core->cfg) ? ENGINE_SLEEP_MAX_MS : ENGINE_SLEEP_WATCHED_MS;
    int cap = own_thread ? 0 : weft_engine_sleep_cap_ms(p->engine);
    if (cap > 0 && cap < ms)
        ms = cap;
    sleep_in_transport(p, ms);
}

int weft_p2p_progress_wait_until(struct weft_p2p *p, struct weft_request **reqs, size_t n, const char *what,
                                 const uint64_t *stop_epoch)
{
    const struct weft_core *core = p->core;
    struct weft_backoff bo;   /* set at the first idle look */
    /* The idle clock starts at the first idle look (last < 0: not read
     * yet): a wait that completes at once never reads the clock. */
    double last = -1.0, watched = 0;
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
         * more ranks than cores every idle poll yields at once instead
         * (the oversubscription rule, backoff.h). */
        if (!core->oversubscribed && polls % 32 != 31)
            continue;

        double now = weft_now();
        if (last < 0) {
            last = now;
            weft_backoff_init(&bo, core);
        }
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
        switch (weft_backoff_phase(&bo, now)) {
        case WEFT_BACKOFF_SPIN:
            /* Spin, but let other threads of this process at the lock. */
            weft_p2p_unlock(p);
            weft_p2p_lock(p);
            break;
        case WEFT_BACKOFF_YIELD:
            /* Idle: the clients' work (non-blocking collectives, the
             * application's wait hook, at its own pace). */
            weft_p2p_unlock(p);
            weft_engine_run_waits(p->engine, now, 1);
            weft_yield();
            weft_p2p_lock(p);
            break;
        case WEFT_BACKOFF_SLEEP:
            weft_p2p_unlock(p);
            weft_engine_run_waits(p->engine, now, 1);
            weft_p2p_lock(p);
            wait_sleep(p);
            break;
        }
    }
    p->waiters--;
    return rc;
}

/* ---- the progress thread ---- */

static int want_in_thread(const struct weft_engine *e, const struct engine_slot *s, double now)
{
    (void)now;
    if (s->c->flags & WEFT_CLIENT_APP_ONLY)
        return 0;
    if (s->c->flags & WEFT_CLIENT_NEEDS_THREAD)
        return 1;
    return e->started && (s->c->flags & WEFT_CLIENT_THREAD);
}

/* The thread's pass of the pipes: progress and the peers' health (what
 * fails the requests of a peer that died, with no waiter of the
 * application's to look at their clocks), unless an application thread
 * waits on the comm and moves them. *busy: a request of the comm is in
 * flight. */
static int pipes_pass(struct weft_p2p *p, int *busy)
{
    int n = 0;
    weft_p2p_lock(p);
    if (p->waiters == 0) {
        n = weft_p2p_progress(p);
        weft_health_tick(p, weft_now());
    }
    *busy = p->user_reqs > 0 || p->out_queued > 0 || p->path_ops > 0;
    weft_p2p_unlock(p);
    return n;
}

static void timed_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

static void *engine_main(void *arg)
{
    struct weft_engine *e = arg;
    struct weft_p2p *p = e->p2p;
    struct weft_backoff bo;
    struct engine_slot *run[ENGINE_MAX_CLIENTS];
    void *args[ENGINE_MAX_CLIENTS];
    const struct weft_engine_client *cs[ENGINE_MAX_CLIENTS];

    own_thread = 1;
    weft_cuda_mark_weft_thread();
    weft_backoff_init(&bo, p->core);
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        e->kicked = 0;
        int k = take_locked(e, want_in_thread, 0, run);
        int started = e->started;
        for (int i = 0; i < k; i++) {
            cs[i] = run[i]->c;
            args[i] = run[i]->arg;
        }
        pthread_mutex_unlock(&e->mu);

        int n = 0, busy = 0, reqs_busy = 0;
        long wakeless_us = 0;
        for (int i = 0; i < k; i++)
            n += cs[i]->poll(args[i]);
        for (int i = 0; i < k; i++)
            if (cs[i]->busy && cs[i]->busy(args[i])) {
                busy = 1;
                if (cs[i]->wakeless_us > 0 && (wakeless_us == 0 || cs[i]->wakeless_us < wakeless_us))
                    wakeless_us = cs[i]->wakeless_us;
            }
        /* The pipes: for the clients in flight (their requests), and with
         * WEFT_PROGRESS_THREAD=1 for the application's requests too. */
        if (busy || started) {
            n += pipes_pass(p, &reqs_busy);
            if (started)
                busy |= reqs_busy;
        }

        pthread_mutex_lock(&e->mu);
        release_locked(e, run, k);
        if (e->stop)
            break;
        if (n > 0) {
            weft_backoff_busy(&bo);
            continue;
        }
        if (!busy) {
            /* Nothing in flight: block until a client kicks. */
            weft_backoff_busy(&bo);
            if (!e->kicked)
                timed_wait_ms(&e->cv, &e->mu, started ? ENGINE_IDLE_LOOK_MS : ENGINE_SLEEP_MAX_MS);
            continue;
        }
        if (e->kicked)
            continue;
        pthread_mutex_unlock(&e->mu);
        double now = weft_now();
        if (weft_backoff_phase(&bo, now) != WEFT_BACKOFF_SLEEP || (wakeless_us > 0 && wakeless_us < 1000)) {
            /* Spin, yield, or nap up to what the clients allow. */
            weft_backoff_idle(&bo, now, wakeless_us > 0 ? wakeless_us : 1000);
        } else {
            weft_p2p_lock(p);
            sleep_in_transport(p, ENGINE_THREAD_SLEEP_MS);
            weft_p2p_unlock(p);
        }
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* mu held. Called by an application thread inside a weft call that
 * does not hold p->lock (the stream-ordered calls' first submission;
 * create with WEFT_PROGRESS_THREAD=1, where nolock was never set): from
 * here on two threads reach p, so a WEFT_THREADS=serialized comm takes
 * its lock again -- for good, and before the thread exists. */
static int thread_start_locked(struct weft_engine *e)
{
    struct weft_p2p *p = e->p2p;
    if (p->nolock) {
        p->nolock = 0;
        WEFT_INFO(p->rank, "WEFT_THREADS=serialized: the comm's stream-ordered calls start its progress thread; "
                           "its calls take the lock from now on");
    }
    e->stop = 0;
    int err = pthread_create(&e->thread, NULL, engine_main, e);
    if (err != 0)
        return weft_set_error(e->p2p->core, WEFT_ERR_INTERNAL, "progress engine: cannot start the comm's progress "
                              "thread: %s", strerror(err));
    e->thread_on = 1;
    return WEFT_SUCCESS;
}

int weft_engine_start(struct weft_engine *e)
{
    int rc = WEFT_SUCCESS;
    if (!e->want_thread)
        return rc;
    pthread_mutex_lock(&e->mu);
    e->started = 1;
    if (!e->thread_on)
        rc = thread_start_locked(e);
    e->kicked = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void weft_engine_stop(struct weft_engine *e)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->mu);
    if (!e->thread_on) {
        e->started = 0;
        pthread_mutex_unlock(&e->mu);
        return;
    }
    e->stop = 1;
    e->started = 0;
    pthread_cond_broadcast(&e->cv);
    pthread_t t = e->thread;
    pthread_mutex_unlock(&e->mu);
    pthread_join(t, NULL);
    pthread_mutex_lock(&e->mu);
    e->thread_on = 0;
    pthread_mutex_unlock(&e->mu);
}

int weft_engine_create(struct weft_p2p *p, struct weft_engine **out)
{
    struct weft_engine *e = calloc(1, sizeof(*e));
    pthread_condattr_t ca;

    if (e == NULL)
        return weft_set_error(p->core, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for the progress engine");
    e->p2p = p;
    e->want_thread = p->core->cfg.progress_thread;
    pthread_mutex_init(&e->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = e;
    return WEFT_SUCCESS;
}

void weft_engine_destroy(struct weft_engine *e)
{
    if (e == NULL)
        return;
    weft_engine_stop(e);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}
