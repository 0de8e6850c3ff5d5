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
struct weft_error;

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

/* The same with the operation and the peer as parts of their own: text
 * then says what failed and why, without naming op; the formatted error
 * reads "op: text". */
int weft_set_error_at(struct weft_core *core, int err, const char *op, int peer, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* A copy of the comm's last error (code WEFT_SUCCESS: none). */
void weft_error_get(struct weft_core *core, struct weft_error *out);
/* Records e as the comm's last error as it is (rank included), without
 * logging: an error decided and logged elsewhere, passed on. */
void weft_error_put(struct weft_core *core, const struct weft_error *e);
/* "rank R: [op: ]text (why of code)"; "" when e holds none. The one place
 * an error becomes a line. with_rank 0 leaves out "rank R: ". */
void weft_error_format(const struct weft_error *e, int with_rank, char *buf, size_t len);
/* The comm's last error formatted with its rank, in a buffer of this
 * thread's that the next call overwrites (for log lines and tests). */
const char *weft_error_line(struct weft_core *core);
/* "[op: ]text": the error without rank and code, to be said again inside
 * another sentence. */
void weft_error_reason(const struct weft_error *e, char *buf, size_t len);
/* The same of the comm's last error. */
void weft_error_last_reason(struct weft_core *core, char *buf, size_t len);

/* A creation that failed is about to free its comm: its last error (or,
 * if it recorded none, "<what> failed (<why of err>)") becomes this
 * thread's, for weft_last_error(). */
void weft_error_keep(struct weft_core *core, const char *what, int err);
/* This thread's last error recorded with no comm (weft_set_error(NULL, ...))
 * or kept by weft_error_keep; "" if none. Nothing clears it (errno style). */
const char *weft_error_thread(void);
/* The same in parts; rank -1 when none was known (a call with no comm). */
void weft_error_thread_get(struct weft_error *out);

/* The text of a WEFT_* code (weft_strerror forwards here). */
const char *weft_err_str(int err);

#endif
