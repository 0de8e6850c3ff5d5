/*
 * Staged transfers: a rendezvous message with a CUDA device buffer on at
 * least one side, moved through pinned host memory over the pipe's
 * ordinary host paths (self, shm, tcp, ib all carry it unchanged).
 *
 * Protocol (the receiver decides, p2p/pipe.c match_rts):
 *
 *   sender                                   receiver
 *   RTS (F_DEVICE if device, reserved2 =
 *        sender's chunk)               -->   matched; not self, not IPC, a
 *                                            device side: STAGED. Takes the
 *                                            pipe's next lane index k and,
 *                                            for a device buffer, one pinned
 *                                            receive slot (the op's anchor)
 *                                       <--  CTS (F_STAGED, addr = k,
 *                                                 reserved2 = chunk)
 *   chunks 0..n-1 of `chunk` bytes (the last one shorter) as internal
 *   messages on tag weft_stage_tag(k), in order:
 *     device sender: D2H (cudaMemcpyAsync on weft's stream + event) into a
 *     pinned send slot, then isend of the slot; host sender: isend straight
 *     from the user buffer at the chunk's offset.
 *     device receiver: irecv into a pinned receive slot, then H2D
 *     (cudaMemcpyAsync + event) into place; host receiver: irecv straight
 *     into the user buffer at the chunk's offset.
 *   send complete when every chunk's isend completed; receive complete when
 *   every chunk is in place (its H2D event passed).
 *
 * Lanes. Chunk tags are -(WEFT_STAGE_TAG_BASE + k) with k taken from a
 * per-pipe counter on the receiving side modulo WEFT_STAGE_LANES (2^20), so
 * two staged messages in flight on one pipe never share a lane (FIFO per
 * tag matches chunk i to chunk i), and the range lies far below the
 * collectives' lanes (-(0x10000 .. 0x10000 + 16 * 16)). A lane is freed
 * when its message completes, so a long job does not accumulate lanes.
 *
 * Pipelining. Each side has WEFT_CUDA_STAGE_SLOTS pinned slots of
 * WEFT_CUDA_STAGE_CHUNK bytes (one cudaMallocHost per side, made at the
 * first use), shared by all ops of the comm: chunk i+1's D2H runs while
 * chunk i is on the network and chunk i-1's H2D runs at the receiver.
 *
 * No deadlock between ops: an op that needs slots starts only with one slot
 * it keeps until it completes (its anchor; the receiver sends CTS only once
 * it has it), so every started op can progress alone; more slots are taken
 * only while no op waits for its anchor.
 *
 * Failure. A CUDA error fails the op's request with WEFT_ERR_TRANSPORT and
 * a message naming the peer and the CUDA error. A sender that fails sends
 * every remaining chunk as a 0-byte message, so the receiver's chunk
 * receives all complete: a chunk shorter than announced fails the receive
 * with WEFT_ERR_TRANSPORT ("the sender failed to stage"). A broken pipe
 * fails the requests as usual; copies in flight are waited for first.
 *
 * All functions are called with the comm lock held.
 */
#ifndef WEFT_STAGE_H
#define WEFT_STAGE_H

#include <stddef.h>
#include <stdint.h>

struct weft_comm;
struct weft_pipe;
struct weft_request;
struct weft_ctrl;

#define WEFT_STAGE_TAG_BASE 0x200000
#define WEFT_STAGE_LANES    0x100000

static inline int weft_stage_tag(uint32_t k)
{
    return -(int)(WEFT_STAGE_TAG_BASE + (k % WEFT_STAGE_LANES));
}

/* Comm create (weft_cuda_comm_connect) with CUDA: weft's stream and the
 * (still empty) slot pools in c->stage_state. Destroy: frees everything,
 * after waiting for copies still in flight. */
int  weft_stage_init(struct weft_comm *c);
void weft_stage_fini(struct weft_comm *c);

/* Receiver: rts (matched to r) goes staged. Sends the CTS now or once the
 * op has its anchor slot. r is ACTIVE and on the pipe's inflight list. */
int  weft_stage_recv_start(struct weft_pipe *p, struct weft_request *r, const struct weft_ctrl *rts);
/* Sender: the receiver's CTS with F_STAGED for s arrived. */
int  weft_stage_send_start(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts);

/* Advances copies and chunk messages; returns the number of events. */
int  weft_stage_progress(struct weft_comm *c);
/* Nonzero while any staged op exists (destroy drains them). */
int  weft_stage_busy(const struct weft_comm *c);
/* Nonzero while a copy is running on weft's stream (a waiter must poll,
 * no peer will knock for it). */
int  weft_stage_copies_pending(const struct weft_comm *c);
/* The pipe broke: every op of the pipe lets go of its request (the pipe
 * fails them); copies in flight are waited for. */
void weft_stage_abort_pipe(struct weft_pipe *p);

/* Synchronous copy on weft's stream between any two buffers (host, pinned,
 * device), cudaMemcpyDefault; data in place on return. WEFT_SUCCESS, or
 * WEFT_ERR_TRANSPORT with the comm's last error naming `what` and the CUDA
 * error. Needs c->cuda. */
int  weft_stage_copy_sync(struct weft_comm *c, void *dst, const void *src, size_t n, const char *what);

/* A host bounce buffer of at least n bytes for eager device sends (pinned
 * when possible); valid until the next call. NULL: no memory. */
void *weft_stage_bounce(struct weft_comm *c, size_t n);

/* The chunk size this rank stages with (for RTS reserved2). */
size_t weft_stage_chunk(const struct weft_comm *c);

#endif
