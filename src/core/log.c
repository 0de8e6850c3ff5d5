/*
 * Rank-prefixed logging on stderr and the comm's last-error string.
 */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core.h"
#include "weft.h"

static atomic_int log_level = -1;

/* weft_last_error(): per thread, so two threads that fail creations at once
 * each read their own failure, and no lock is needed. */
static _Thread_local char thread_error[1024];

int weft_log_level(void)
{
    int l = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (l < 0) {
        l = weft_config_log_level_env();
        atomic_store(&log_level, l);
    }
    return l;
}

void weft_log_set_level(int level)
{
    atomic_store(&log_level, level);
}

static const char *level_name(int level)
{
    switch (level) {
    case WEFT_LOG_WARN: return "WARN";
    case WEFT_LOG_INFO: return "INFO";
    case WEFT_LOG_TRACE: return "TRACE";
    default: return "";
    }
}

static void vlog(int level, int rank, const char *fmt, va_list ap)
{
    char line[1200];
    int n = snprintf(line, sizeof(line), "weft[rank %d] %s: ", rank, level_name(level));
    if (n < 0)
        return;
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    /* One fprintf per line so lines of different threads do not interleave. */
    fprintf(stderr, "%s\n", line);
}

void weft_log(int level, int rank, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, rank, fmt, ap);
    va_end(ap);
}

const char *weft_err_str(int err)
{
    switch (err) {
    case WEFT_SUCCESS:          return "success";
    case WEFT_ERR_INVALID_ARG:  return "invalid argument";
    case WEFT_ERR_TRUNCATE:     return "message truncated: larger than the receive buffer";
    case WEFT_ERR_NO_MEMORY:    return "out of memory";
    case WEFT_ERR_UNSUPPORTED:  return "unsupported";
    case WEFT_ERR_TRANSPORT:    return "transport failure";
    case WEFT_ERR_TIMEOUT:      return "timed out (no progress within WEFT_TIMEOUT)";
    case WEFT_ERR_MPI:          return "MPI call failed";
    case WEFT_ERR_INTERNAL:     return "internal error";
    case WEFT_ERR_MISMATCH:     return "collective mismatch: ranks called different collectives";
    case WEFT_ERR_ABORTED:      return "comm aborted (weft_comm_abort)";
    case WEFT_ERR_CLOSED:       return "message pipe closed";
    default:                    return "unknown weft error code";
    }
}

void weft_core_init(struct weft_core *core, int rank, int size)
{
    core->rank = rank;
    core->size = size;
    core->last_error[0] = '\0';
    core->settings = NULL;
    pthread_mutex_init(&core->err_lock, NULL);
}

void weft_core_fini(struct weft_core *core)
{
    weft_settings_free(core->settings);
    core->settings = NULL;
    pthread_mutex_destroy(&core->err_lock);
}

int weft_set_error(struct weft_core *c, int err, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    int rank = c ? c->rank : -1;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c) {
        pthread_mutex_lock(&c->err_lock);
        snprintf(c->last_error, sizeof(c->last_error), "rank %d: %s (%s)", rank, msg, weft_err_str(err));
        pthread_mutex_unlock(&c->err_lock);
    } else {
        /* No comm to hold it: the caller reads it with weft_last_error(). */
        snprintf(thread_error, sizeof(thread_error), "%s (%s)", msg, weft_err_str(err));
    }
    WEFT_WARN(rank, "%s (%s)", msg, weft_err_str(err));
    return err;
}

void weft_error_keep(struct weft_core *c, const char *what, int err)
{
    pthread_mutex_lock(&c->err_lock);
    if (c->last_error[0] != '\0')
        snprintf(thread_error, sizeof(thread_error), "%s", c->last_error);
    else
        snprintf(thread_error, sizeof(thread_error), "%s failed (%s)", what, weft_err_str(err));
    pthread_mutex_unlock(&c->err_lock);
}

const char *weft_error_thread(void)
{
    return thread_error;
}
