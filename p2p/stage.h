/*
 * Staged transfers: a rendezvous message with a CUDA device buffer on at
 * least one side, moved through pinned host memory over the pipe's
 * ordinary host paths (self, shm, tcp, ib all carry it unchanged).
 *
 * Protocol (the staged rendezvous path of p2p/rndv.h; the receiver decides):
 *
 *   sender                                   receiver
 *   RTS (F_DEVICE if device, aux =
 *        sender's chunk)               -->   matched; no earlier path took
 *                                            it, a device side: STAGED. Takes the
 *                                            pipe's next lane index k and,
 *                                            for a device buffer, one pinned
 *                                            receive slot (the op's anchor)
 *                                       <--  CTS (path staged, key =
 *                                                 {lane k, chunk})
 *   chunks 0..n-1 of `chunk` bytes (the last one shorter) as internal
 *   messages on tag weft_tag_stage(k) (p2p/tags.h), in order:
 *     device sender: D2H (cudaMemcpyAsync on weft's stream + event) into a
 *     pinned send slot, then isend of the slot; host sender: isend straight
 *     from the user buffer at the chunk's offset.
 *     device receiver: irecv into a pinned receive slot, then H2D
 *     (cudaMemcpyAsync + event) into place; host receiver: irecv straight
 *     into the user buffer at the chunk's offset.
 *   send complete when every chunk's isend completed; receive complete when
 *   every chunk is in place (its H2D event passed).
 *
 * Lanes. Chunk tags are weft_tag_stage(k) (p2p/tags.h) with k taken from a
 * per-pipe counter on the receiving side modulo WEFT_TAG_STAGE_COUNT (2^20), so
 * two staged messages in flight on one pipe never share a lane (FIFO per
 * tag matches chunk i to chunk i), and the range is the staging range of
 * the internal tag table. A lane is freed
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
 * Everything runs with the p2p lock held.
 */
#ifndef WEFT_STAGE_H
#define WEFT_STAGE_H

struct weft_p2p;

/* The path itself is weft_rndv_staged (p2p/rndv.h). Destroy: frees the
 * staging state after waiting for copies still in flight. */
void weft_stage_fini(struct weft_p2p *p2p);
/* Both sides' pinned slots allocated now (cudaMallocHost waits for the
 * device): on the caller's thread before a stream-ordered call is queued
 * (weft_p2p_prepare_device). p2p lock held. A pool still missing when one
 * of weft's threads needs it while a stream waits on weft is not allocated
 * there: that transfer fails with a message instead of hanging. */
void weft_stage_prepare(struct weft_p2p *p2p);

#endif
