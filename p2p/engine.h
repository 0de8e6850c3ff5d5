/*
 * The progress engine of one comm: who drives progress, and how it waits.
 *
 * Everything that needs progress is a client of the comm's engine:
 *   - the pipes and transports themselves (built in: one pass of
 *     weft_p2p_progress and the peers' health tick);
 *   - registered clients: the stream-ordered engine's batches
 *     (src/stream), the message pipes' transfers and callbacks
 *     (p2p/msgpipe), the non-blocking collectives' schedules
 *     (collectives/coll_nb.c), the application's wait hook (the PMPI
 *     drop-in's MPI progress, weft_comm_set_wait_hook).
 * Two kinds of thread drive them:
 *   - the application's threads, inside a wait of this comm
 *     (weft_p2p_progress_wait*): they poll the pipes, and run the clients
 *     registered with WEFT_CLIENT_WAITS when the wait has nothing to do;
 *   - the comm's one progress thread, when it has one: with
 *     WEFT_PROGRESS_THREAD=1 from the end of weft_comm_create, running every
 *     client registered with WEFT_CLIENT_THREAD and the pipes while a client
 *     or a request is in flight; with 0, started by the first client that
 *     has no other driver (WEFT_CLIENT_NEEDS_THREAD: stream-ordered
 *     operations, which no application thread waits for) and running only
 *     those.
 * Both wait by the one policy of src/core/backoff.h.
 *
 * "Weft's own thread" is decided here (weft_engine_own_thread): the
 * progress thread never runs a client marked WEFT_CLIENT_APP_ONLY (it may
 * enter a library only the application's threads may: MPI), and it is the
 * thread src/core/cudawrap.c refuses device-synchronising CUDA calls on
 * while a stream waits on weft.
 */
#ifndef WEFT_ENGINE_H
#define WEFT_ENGINE_H

#include <stddef.h>

struct weft_p2p;
struct weft_engine;
struct weft_backoff;

enum weft_client_flags {
    WEFT_CLIENT_WAITS        = 1u << 0,  /* run by the application's idle waits of this comm */
    WEFT_CLIENT_APP_ONLY     = 1u << 1,  /* never on weft's own thread */
    WEFT_CLIENT_THREAD       = 1u << 2,  /* run by the progress thread when WEFT_PROGRESS_THREAD=1 */
    WEFT_CLIENT_NEEDS_THREAD = 1u << 3,  /* has no other driver: the progress thread runs it, and
                                            starts for it, whatever WEFT_PROGRESS_THREAD says */
};

/* A client. Every member is called with no lock of weft's held, by any
 * thread the flags allow, possibly by two at once (clients guard their own
 * state). */
struct weft_engine_client {
    const char *name;
    /* One pass of the client's work; returns the events it saw (> 0: keep
     * polling without backing off). */
    int  (*poll)(void *arg);
    /* Whether it has work in flight: the progress thread keeps polling
     * (and backs off) while some client is busy, and blocks otherwise.
     * NULL: never (a client of waits only). */
    int  (*busy)(void *arg);
    /* While busy, the longest the thread may go without polling it when no
     * peer knocks (work that completes without a wake-up: CUDA events, a
     * write posted by another thread), in microseconds; 0: a knock always
     * comes. */
    long wakeless_us;
    /* In waits: run at most this often (its pass costs more than a poll). */
    double min_gap_s;
    /* In waits: sleeps of a waiter are bounded by this while the client is
     * registered (it must run often), in ms; 0: no bound. */
    int  sleep_cap_ms;
    unsigned flags;
};

/* Made with the p2p context (p2p/setup.c); thread not started. */
int  weft_engine_create(struct weft_p2p *p, struct weft_engine **out);
/* Stops the thread (weft_engine_stop) and frees. */
void weft_engine_destroy(struct weft_engine *e);

/* WEFT_PROGRESS_THREAD=1: starts the progress thread (the end of
 * weft_comm_create: the pipes are connected). Otherwise nothing. */
int  weft_engine_start(struct weft_engine *e);
/* Joins the progress thread, if any (comm destroy, after the stream and
 * message-pipe clients have gone): the thread is gone when it returns. */
void weft_engine_stop(struct weft_engine *e);

/* Registers (c, arg): the same pair twice is one registration. A client
 * with WEFT_CLIENT_NEEDS_THREAD starts the thread. A WEFT code. */
int  weft_engine_register(struct weft_engine *e, const struct weft_engine_client *c, void *arg);
/* Unregisters (c, arg); returns once no thread runs it any longer. Never
 * called from inside the client's own members. */
void weft_engine_unregister(struct weft_engine *e, const struct weft_engine_client *c, void *arg);
/* New work for the thread's clients: wakes a blocked progress thread. */
void weft_engine_kick(struct weft_engine *e);

/* An application wait of this comm has nothing to do: runs the clients
 * registered with WEFT_CLIENT_WAITS, each at most every min_gap_s; the
 * APP_ONLY ones only when with_app_only (a wait; a test loop does not
 * enter the application's hook) and never on weft's own thread. Lock not
 * held. */
void weft_engine_run_waits(struct weft_engine *e, double now, int with_app_only);
/* The bound a waiter's sleep gets from the clients (sleep_cap_ms), 0: none. */
int  weft_engine_sleep_cap_ms(struct weft_engine *e);

/* A loop that polls by itself (destroy's linger) and saw nothing move: one
 * step of the policy, sleeping in the comm's transports at most max_ms. */
void weft_engine_idle_step(struct weft_p2p *p, struct weft_backoff *b, int max_ms);

/* 1 on weft's own threads (a comm's progress thread). */
int  weft_engine_own_thread(void);

#endif
