/*
 * Logging (WEFT_DEBUG=warn|info|trace) and error recording.
 *
 * Log lines go to stderr, prefixed "weft[rank R] LEVEL:". An error is logged
 * where it starts (weft_set_error), and the same text becomes the comm's
 * last-error string, which always names the rank.
 */
#ifndef WEFT_LOG_H
#define WEFT_LOG_H

#include "config.h"

struct weft_core;

/* Process-wide level, taken from WEFT_DEBUG the first time it is needed. */
int  weft_log_level(void);
void weft_log_set_level(int level);
void weft_log(int level, int rank, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define WEFT_LOG(lvl, rank, ...) \
    do { if (weft_log_level() >= (lvl)) weft_log((lvl), (rank), __VA_ARGS__); } while (0)
#define WEFT_WARN(rank, ...)  WEFT_LOG(WEFT_LOG_WARN, rank, __VA_ARGS__)
#define WEFT_INFO(rank, ...)  WEFT_LOG(WEFT_LOG_INFO, rank, __VA_ARGS__)
#define WEFT_TRACE(rank, ...) WEFT_LOG(WEFT_LOG_TRACE, rank, __VA_ARGS__)

/* Records "rank R: <message> (<why of err>)" as the comm's last error
 * (core may be NULL: then it becomes this thread's weft_last_error(),
 * "<message> (<why of err>)", with no rank), logs it at warn level, and returns err so
 * callers can `return weft_set_error(...)`. Call it once, where a failure
 * is decided. */
int weft_set_error(struct weft_core *core, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A creation that failed is about to free its comm: its last error (or,
 * if it recorded none, "<what> failed (<why of err>)") becomes this
 * thread's, for weft_last_error(). */
void weft_error_keep(struct weft_core *core, const char *what, int err);
/* This thread's last error recorded with no comm (weft_set_error(NULL, ...))
 * or kept by weft_error_keep; "" if none. Nothing clears it (errno style). */
const char *weft_error_thread(void);

/* The text of a WEFT_* code (weft_strerror forwards here). */
const char *weft_err_str(int err);

#endif
