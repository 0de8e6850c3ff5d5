/*
 * One progress pass of a comm's pipes: every transport in use, the
 * rendezvous paths with work of their own (staged chunks), and queued
 * outbound frames. Who runs it and how a waiter backs off between passes:
 * p2p/engine.c.
 */
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

int weft_p2p_poll_health(struct weft_p2p *p)
{
    weft_p2p_lock(p);
    int n = weft_p2p_progress(p);
    /* Heartbeats and the peers' health: what fails the requests of a
     * peer that died, with no waiter of ours to look at their clocks. */
    weft_health_tick(p, weft_now());
    weft_p2p_unlock(p);
    return n;
}
