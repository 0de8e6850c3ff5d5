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

/* The highest WEFT_* code (weft.h): a code read from a peer's frame above
 * it is not passed on. */
#define WEFT_ERR_LAST WEFT_ERR_REVOKED

/* An error as the layer that decided it recorded it: kept in parts, and
 * formatted once, at the API edge ("rank R: [op: ]text (why of code)",
 * weft_error_format), so no layer reads a message back to take it apart. */
struct weft_error {
    int  code;        /* WEFT_* code; WEFT_SUCCESS: none recorded */
    int  rank;        /* the rank that recorded it; -1 before the rank is known */
    int  peer;        /* the peer it is about; -1: none or named in text */
    char op[64];      /* the call or step ("weft_comm_split"); "": named in text, if at all */
    char text[900];   /* what failed and why */
};

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
    int                  revoked;        /* 0, or 1 + the rank whose weft_comm_revoke (or shrink)
                                          * revoked the comm (atomic access; p2p/health.c sets it) */
    int                  leaving;        /* destroy's last exchange is under way: a peer's orderly
                                          * close is its goodbye, not a failure (atomic access) */

    int                 *parent_of;      /* [size]: each rank's number in the comm this one was split or
                                          * shrunk from, for error texts; NULL: none (atomic access: set
                                          * once, right after creation) */

    pthread_mutex_t      err_lock;       /* guards err only */
    struct weft_error    err;            /* the comm's last error (weft_comm_last_error formats it) */
};

/* Initialises the lock and an empty last error; fini destroys the lock. */
void weft_core_init(struct weft_core *core, int rank, int size);
void weft_core_fini(struct weft_core *core);
/* The new comm's ranks as its parent numbers them (members[new rank]:
 * weft_comm_split, weft_comm_shrink): error texts then name both. A copy is
 * kept; no memory: texts name the comm's numbers alone. */
void weft_core_set_parent(struct weft_core *core, const int *members, int n);
/* " (parent rank 5)" for rank r of a comm made from another by split or
 * shrink, else "": written into buf (n bytes), which is returned. */
const char *weft_parent_words(const struct weft_core *core, int r, char *buf, size_t n);

/* Monotonic seconds. */
static inline double weft_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
