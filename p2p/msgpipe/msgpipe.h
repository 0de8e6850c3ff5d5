/*
 * Message pipes (TensorPipe style) of one comm: an ordered stream of
 * messages between two ranks, each message a descriptor (metadata, the
 * size and device of every buffer) the reader sees before it allocates,
 * then the buffers, then callbacks. Built on the pipe layer's own lanes
 * (p2p/tags.h): a control lane per pipe carries descriptors (with small
 * host buffers inline) and the close markers; a data lane per pipe carries
 * every other buffer as one message each, so each takes the rendezvous
 * path the pipe layer picks for its (source, target) memory pair.
 * The contract is weft.h's; src/api/pipe.c checks arguments and forwards.
 */
#ifndef WEFT_MSGPIPE_H
#define WEFT_MSGPIPE_H

#include "weft.h"

struct weft_p2p;
struct weft_core;
struct weft_msgpipes;

/* The comm's message-pipe state (no pipe, no thread yet: both come with
 * the first weft_pipe_open). Sets *out only on success. */
int  weft_msgpipes_create(struct weft_p2p *p, struct weft_msgpipes **out);
/* weft_comm_destroy, before the pipes drain: stops the progress thread,
 * closes every pipe still open without waiting for the peers' markers
 * (both lanes refuse what still comes), progresses and runs the callbacks
 * due in this thread until the started transfers finished or nothing
 * moved for 2 s (WEFT_TIMEOUT if shorter), fails what is left with
 * WEFT_ERR_CLOSED, and frees everything. WEFT_SUCCESS. NULL: nothing. */
int  weft_msgpipes_destroy(struct weft_msgpipes *m);

/* The public calls, arguments checked by src/api/pipe.c (handles are
 * checked here: a closed or unknown one is refused). */
int  weft_msgpipe_open(struct weft_msgpipes *m, int peer, int id, weft_pipe_t **out);
int  weft_msgpipe_write(weft_pipe_t *h, const weft_pipe_message_t *msg, weft_pipe_cb_t cb, void *arg);
int  weft_msgpipe_read_descriptor(weft_pipe_t *h, weft_pipe_descriptor_cb_t cb, void *arg);
int  weft_msgpipe_read(weft_pipe_t *h, const weft_pipe_allocation_t *alloc, weft_pipe_cb_t cb, void *arg);
int  weft_msgpipe_close(weft_pipe_t *h);
/* peer and id of a live handle: 0, or -1 (unknown handle). */
int  weft_msgpipe_info(const weft_pipe_t *h, int *peer, int *id);
/* The core (rank, errors) of a live handle's comm, or NULL. */
struct weft_core *weft_msgpipe_core(const weft_pipe_t *h);
/* One pass; runs the callbacks due when the comm has no progress thread. */
int  weft_msgpipes_progress(struct weft_msgpipes *m);

#endif
