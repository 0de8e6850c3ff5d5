/*
 * Stream-ordered operations (weft_send_on_stream, weft_recv_on_stream,
 * weft_allgather_on_stream, weft_group_start/end): see src/stream.c.
 *
 * State per comm in c->stream_state, created at the first stream-ordered
 * call; a progress thread per comm, started then, runs the operations
 * through weft_isend/weft_irecv.
 */
#ifndef WEFT_STREAM_H
#define WEFT_STREAM_H

struct weft_comm;

/* Waits (bounded by WEFT_TIMEOUT without progress) until every queued
 * stream-ordered operation of c completed, then stops and joins the
 * progress thread. Operations still pending after the timeout are dropped
 * and their streams released. Must run while the pipes still work, i.e. at
 * the start of weft_comm_destroy, before its drain. Idempotent; no-op when
 * no stream-ordered call was ever made. Returns WEFT_SUCCESS, or
 * WEFT_ERR_TIMEOUT (last error says what was left). */
int  weft_stream_comm_quiesce(struct weft_comm *c);

/* Frees the stream state (counters, events). Calls quiesce first if the
 * thread still runs (safe only if nothing is queued: the pipes may be gone
 * by now). Called from weft_cuda_comm_fini. Idempotent. */
void weft_stream_comm_fini(struct weft_comm *c);

/* The error of a failed asynchronous operation not reported yet, or
 * WEFT_SUCCESS; taking it clears it, and re-records its text as the last
 * error. For other entry points that should report it too. */
int  weft_stream_take_error(struct weft_comm *c);

#endif
