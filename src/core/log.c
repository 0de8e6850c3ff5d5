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
/* The same error in parts (weft_error_thread_get). */
static _Thread_local struct weft_error thread_err;

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
    case WEFT_ERR_REVOKED:      return "comm revoked (weft_comm_revoke)";
    default:                    return "unknown weft error code";
    }
}

void weft_core_init(struct weft_core *core, int rank, int size)
{
    core->rank = rank;
    core->size = size;
    memset(&core->err, 0, sizeof(core->err));
    core->err.rank = rank;
    core->err.peer = -1;
    core->settings = NULL;
    core->parent_of = NULL;
    pthread_mutex_init(&core->err_lock, NULL);
}

void weft_core_set_parent(struct weft_core *core, const int *members, int n)
{
    int *copy = n == core->size ? malloc((size_t)n * sizeof(*copy)) : NULL;
    if (copy == NULL)
        return;
    memcpy(copy, members, (size_t)n * sizeof(*copy));
    int *old = __atomic_exchange_n(&core->parent_of, copy, __ATOMIC_ACQ_REL);
    free(old);   /* set once in practice; a second set replaces the first */
}

const char *weft_parent_words(const struct weft_core *core, int r, char *buf, size_t n)
{
    const int *of = core ? __atomic_load_n(&core->parent_of, __ATOMIC_ACQUIRE) : NULL;
    if (of != NULL && r >= 0 && r < core->size)
        snprintf(buf, n, " (parent rank %d)", of[r]);
    else if (n > 0)
        buf[0] = '\0';
    return buf;
}

void weft_core_fini(struct weft_core *core)
{
    free(__atomic_exchange_n(&core->parent_of, NULL, __ATOMIC_ACQ_REL));
    weft_settings_free(core->settings);
    core->settings = NULL;
    pthread_mutex_destroy(&core->err_lock);
}

static int record(struct weft_core *c, int err, const char *op, int peer, const char *fmt, va_list ap)
{
    struct weft_error e;
    char line[sizeof(thread_error)];

    e.code = err;
    e.rank = c ? c->rank : -1;
    e.peer = peer;
    snprintf(e.op, sizeof(e.op), "%s", op ? op : "");
    vsnprintf(e.text, sizeof(e.text), fmt, ap);
    if (c) {
        pthread_mutex_lock(&c->err_lock);
        c->err = e;
        pthread_mutex_unlock(&c->err_lock);
    } else {
        /* No comm to hold it: the caller reads it with weft_last_error(). */
        thread_err = e;
        weft_error_format(&e, 0, thread_error, sizeof(thread_error));
    }
    if (weft_log_level() >= WEFT_LOG_WARN) {
        weft_error_format(&e, 0, line, sizeof(line));
        weft_log(WEFT_LOG_WARN, e.rank, "%s", line);
    }
    return err;
}

int weft_set_error(struct weft_core *c, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(c, err, NULL, -1, fmt, ap);
    va_end(ap);
    return err;
}

int weft_set_error_at(struct weft_core *c, int err, const char *op, int peer, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(c, err, op, peer, fmt, ap);
    va_end(ap);
    return err;
}

void weft_error_get(struct weft_core *c, struct weft_error *out)
{
    pthread_mutex_lock(&c->err_lock);
    *out = c->err;
    pthread_mutex_unlock(&c->err_lock);
}

void weft_error_put(struct weft_core *c, const struct weft_error *e)
{
    pthread_mutex_lock(&c->err_lock);
    c->err = *e;
    pthread_mutex_unlock(&c->err_lock);
}

const char *weft_error_line(struct weft_core *c)
{
    static _Thread_local char line[1024];
    struct weft_error e;
    weft_error_get(c, &e);
    weft_error_format(&e, 1, line, sizeof(line));
    return line;
}

void weft_error_reason(const struct weft_error *e, char *buf, size_t len)
{
    if (e->code == WEFT_SUCCESS && e->text[0] == '\0')
        snprintf(buf, len, "%s", "");
    else if (e->op[0])
        snprintf(buf, len, "%s: %s", e->op, e->text);
    else
        snprintf(buf, len, "%s", e->text);
}

void weft_error_last_reason(struct weft_core *core, char *buf, size_t len)
{
    struct weft_error e;
    weft_error_get(core, &e);
    weft_error_reason(&e, buf, len);
}

void weft_error_format(const struct weft_error *e, int with_rank, char *buf, size_t len)
{
    char reason[sizeof(e->op) + sizeof(e->text) + 4];
    if (e->code == WEFT_SUCCESS && e->text[0] == '\0') {
        snprintf(buf, len, "%s", "");
        return;
    }
    weft_error_reason(e, reason, sizeof(reason));
    if (with_rank)
        snprintf(buf, len, "rank %d: %s (%s)", e->rank, reason, weft_err_str(e->code));
    else
        snprintf(buf, len, "%s (%s)", reason, weft_err_str(e->code));
}

void weft_error_keep(struct weft_core *c, const char *what, int err)
{
    pthread_mutex_lock(&c->err_lock);
    if (c->err.code != WEFT_SUCCESS || c->err.text[0] != '\0') {
        thread_err = c->err;
        weft_error_format(&c->err, 1, thread_error, sizeof(thread_error));
    } else {
        memset(&thread_err, 0, sizeof(thread_err));
        thread_err.code = err;
        thread_err.rank = -1;
        thread_err.peer = -1;
        snprintf(thread_err.text, sizeof(thread_err.text), "%s failed", what);
        weft_error_format(&thread_err, 0, thread_error, sizeof(thread_error));
    }
    pthread_mutex_unlock(&c->err_lock);
}

void weft_error_thread_get(struct weft_error *out)
{
    *out = thread_err;
}

const char *weft_error_thread(void)
{
    return thread_error;
}
