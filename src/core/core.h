/*
 * The core context: what every layer of one comm may read, transports
 * included (they get it through their weft_tp_env, p2p/transport/transport.h).
 * The comm (src/comm/) owns it and fills it at create; nothing in it refers
 * to a layer above core.
 */
#ifndef WEFT_CORE_H
#define WEFT_CORE_H

#include <pthread.h>
#include <time.h>
#include "config.h"

struct weft_devcopy;
struct weft_signals;

struct weft_core {
    int                  rank, size;
    struct weft_config   cfg;
    struct weft_settings *settings;      /* the comm's own settings over the environment (weft_config_t);
                                          * NULL = the environment alone; freed by weft_core_fini */
    int                  num_nodes;      /* effective nodes of the comm (WEFT_VIRTUAL_NODES included) */
    int                  local_ranks;    /* ranks on this rank's effective node, itself included */
    int                  oversubscribed; /* more ranks on this host than online CPUs */
    int                  cuda;           /* CUDA loaded and a device present: device buffers allowed */
    struct weft_devcopy *devcopy;        /* weft's CUDA stream and bounce (core/devcopy.c); NULL without CUDA */
    struct weft_signals *signals;        /* device signal slots (core/signals.c); NULL without CUDA IPC */

    int                  aborted;        /* weft_comm_abort was called (atomic access) */
    int                  leaving;        /* destroy's last exchange is under way: a peer's orderly
                                          * close is its goodbye, not a failure (atomic access) */

    pthread_mutex_t      err_lock;       /* guards last_error only */
    char                 last_error[1024];
};

/* Initialises the lock and an empty last error; fini destroys the lock. */
void weft_core_init(struct weft_core *core, int rank, int size);
void weft_core_fini(struct weft_core *core);

/* Monotonic seconds. */
static inline double weft_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
