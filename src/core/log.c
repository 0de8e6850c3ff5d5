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

#include "comm.h"

static atomic_int log_level = -1;

static int level_from_env(void)
{
    const char *v = getenv("WEFT_DEBUG");
    if (v == NULL)
        return WEFT_LOG_NONE;
    if (strcasecmp(v, "warn") == 0) return WEFT_LOG_WARN;
    if (strcasecmp(v, "info") == 0) return WEFT_LOG_INFO;
    if (strcasecmp(v, "trace") == 0) return WEFT_LOG_TRACE;
    return WEFT_LOG_NONE;
}

int weft_log_level(void)
{
    int l = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (l < 0) {
        l = level_from_env();
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

int weft_set_error(struct weft_comm *c, int err, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    int rank = c ? c->rank : -1;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c) {
        pthread_mutex_lock(&c->err_lock);
        snprintf(c->last_error, sizeof(c->last_error), "rank %d: %s (%s)", rank, msg, weft_strerror(err));
        pthread_mutex_unlock(&c->err_lock);
    }
    WEFT_WARN(rank, "%s (%s)", msg, weft_strerror(err));
    return err;
}
