/*
 * How weft waits when nothing moves: the one wait policy.
 *
 * A waiter that saw no event backs off in three phases:
 *   spin   WEFT_SPIN_US of busy polling (a reply usually comes within
 *          microseconds);
 *   yield  2 ms of polls, each followed by sched_yield;
 *   sleep  then it sleeps: in a transport that a peer can knock on (futex on
 *          the shm doorbell, poll on sockets; p2p/engine.c), or, where no
 *          knock will come, in naps that grow from 20 us.
 * The oversubscription rule: when the node runs more ranks than it has
 * cores, there is no spin phase (spinning only steals the time slice of the
 * peer we wait for, queued behind us on this core), and every idle poll
 * yields at once.
 *
 * p2p/engine.c applies it to the application's waits and to the comm's
 * progress thread; the few bounded waits below the engine (a transport
 * waiting for a peer mid-copy, destroy's drains) use the same phases through
 * weft_backoff_idle. Nothing else in the library spins, yields or naps.
 */
#ifndef WEFT_BACKOFF_H
#define WEFT_BACKOFF_H

struct weft_core;

#define WEFT_BACKOFF_YIELD_S    0.002   /* the yield phase's length */
#define WEFT_BACKOFF_NAP_MIN_US 20      /* the first nap of the sleep phase */

enum weft_backoff_phase { WEFT_BACKOFF_SPIN, WEFT_BACKOFF_YIELD, WEFT_BACKOFF_SLEEP };

struct weft_backoff {
    double   spin_s;      /* 0 when oversubscribed */
    double   idle_since;  /* < 0: busy (the clock is read lazily, when idle) */
    unsigned naps;        /* naps so far in the sleep phase */
};

/* Starts a backoff for a waiter of this process (core: its spin time and
 * the oversubscription rule; NULL: no spin phase). */
void weft_backoff_init(struct weft_backoff *b, const struct weft_core *core);

/* Something moved: back to the spin phase. */
static inline void weft_backoff_busy(struct weft_backoff *b)
{
    b->idle_since = -1.0;
    b->naps = 0;
}

/* Nothing moved: the phase the waiter is in at `now`. */
enum weft_backoff_phase weft_backoff_phase(struct weft_backoff *b, double now);

/* Nothing moved: do what the phase says, napping at most max_us in the
 * sleep phase (naps grow from WEFT_BACKOFF_NAP_MIN_US to max_us). For waits
 * with no transport to sleep in. */
void weft_backoff_idle(struct weft_backoff *b, double now, long max_us);

/* One poll's pause in a spin: lets a sibling hardware thread run and
 * costs the spinner nothing it needs. */
static inline void weft_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* The primitives, for the engine's own use. */
void weft_yield(void);
void weft_nap_us(long us);

#endif
