/*
 * The one wait policy (backoff.h): spin, yield, sleep.
 */
#include "backoff.h"

#include <sched.h>
#include <time.h>

#include "core.h"

void weft_backoff_init(struct weft_backoff *b, const struct weft_core *core)
{
    b->spin_s = core == NULL || core->oversubscribed ? 0.0 : 1e-6 * core->cfg.spin_us;
    weft_backoff_busy(b);
}

enum weft_backoff_phase weft_backoff_phase(struct weft_backoff *b, double now)
{
    if (b->idle_since < 0)
        b->idle_since = now;
    double idle = now - b->idle_since;
    if (idle < b->spin_s)
        return WEFT_BACKOFF_SPIN;
    if (idle < b->spin_s + WEFT_BACKOFF_YIELD_S)
        return WEFT_BACKOFF_YIELD;
    return WEFT_BACKOFF_SLEEP;
}

void weft_backoff_idle(struct weft_backoff *b, double now, long max_us)
{
    switch (weft_backoff_phase(b, now)) {
    case WEFT_BACKOFF_SPIN:
        break;
    case WEFT_BACKOFF_YIELD:
        weft_yield();
        break;
    case WEFT_BACKOFF_SLEEP: {
        unsigned shift = b->naps < 10 ? b->naps : 10;
        long us = (long)WEFT_BACKOFF_NAP_MIN_US << shift;
        b->naps++;
        weft_nap_us(us < max_us ? us : max_us);
        break;
    }
    }
}

void weft_yield(void)
{
    sched_yield();
}

void weft_nap_us(long us)
{
    if (us <= 0) {
        sched_yield();
        return;
    }
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}
