/*
 * The stream-ordered engine (src/stream/stream.c): operations ordered on
 * CUDA streams (weft_send_on_stream, weft_recv_on_stream,
 * weft_allgather_on_stream, groups), run by a progress thread per comm
 * through the pipe layer (p2p/p2p.h) and the collectives' schedules
 * (collectives/coll.h). src/api/stream.c checks the arguments and calls in.
 *
 * The comm creates the context at weft_comm_create (no thread, no CUDA work
 * yet); the thread starts with the first stream-ordered operation.
 */
#ifndef WEFT_STREAM_H
#define WEFT_STREAM_H

#include <stddef.h>

struct weft_core;
struct weft_p2p;
struct weft_coll;
struct weft_stream;
struct CUstream_st;

/* The engine of one comm. WEFT_SUCCESS, or WEFT_ERR_NO_MEMORY (last error
 * set) with *out = NULL. */
int  weft_stream_create(struct weft_core *core, struct weft_p2p *p2p, struct weft_coll *cc,
                        struct weft_stream **out);

/* Waits (bounded by WEFT_TIMEOUT without progress) until every queued
 * stream-ordered operation completed, then stops and joins the progress
 * thread. Operations still pending after the timeout are dropped and their
 * streams released. Must run while the pipes still work, i.e. at the start
 * of weft_comm_destroy, before its drain. Idempotent; no-op when no
 * stream-ordered call was ever made (or s is NULL). Returns WEFT_SUCCESS,
 * a pending asynchronous error, or WEFT_ERR_TIMEOUT (last error says what
 * was left). */
int  weft_stream_quiesce(struct weft_stream *s);

/* Frees the engine (counters, events). Calls quiesce first if the thread
 * still runs (safe only if nothing is queued: the pipes may be gone by
 * now). NULL: nothing. */
void weft_stream_destroy(struct weft_stream *s);

/* The error of a failed asynchronous operation not reported yet, or
 * WEFT_SUCCESS; taking it clears it, and re-records its text as the last
 * error. For other entry points that should report it too. */
int  weft_stream_take_error(struct weft_stream *s);
/* The same error without taking it (WEFT_SUCCESS when none, or s NULL). */
int  weft_stream_peek_error(struct weft_stream *s);

/* The operations, arguments already checked (src/api/check.c): CUDA
 * present, no pending error; then queued at once, or recorded in the
 * calling thread's open group. WEFT_ERR_UNSUPPORTED when the comm (or the
 * build) has no CUDA. */
int  weft_stream_send(struct weft_stream *s, const void *buf, size_t bytes, int peer, int tag,
                      struct CUstream_st *stream);
int  weft_stream_recv(struct weft_stream *s, void *buf, size_t bytes, int peer, int tag,
                      struct CUstream_st *stream);
/* Any collective (collectives/coll.h), queued like the others; count 0:
 * nothing moves on any rank, only the CUDA check. */
struct weft_coll_args;
int  weft_stream_coll(struct weft_stream *s, const struct weft_coll_args *a, struct CUstream_st *stream);
/* bytes_per_rank 0: nothing moves on any rank; only the CUDA check. */
int  weft_stream_allgather(struct weft_stream *s, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                           struct CUstream_st *stream);

/* Groups: nesting depth per host thread; the outermost end queues every
 * recorded call (weft_group_start / weft_group_end). */
int  weft_stream_group_start(void);
int  weft_stream_group_end(void);

#endif
