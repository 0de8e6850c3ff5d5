/*
 * CUDA IPC path for device buffers of two ranks on one node.
 *
 * Not a transport of its own: the pipe between two ranks of a node is shm,
 * and its control messages (p2p/pipe.c) carry this protocol when both ends
 * of a rendezvous message are device memory and the two GPUs can reach each
 * other (cudaDeviceCanAccessPeer):
 *
 *   sender                                  receiver
 *   RTS (flags DEVICE, device ordinal) -->
 *                                           matched, buffer is device memory:
 *                                           export it (allocation base handle +
 *                                           offset + buffer id) and the pipe's
 *                                           semaphore, expect value n
 *                                      <--  CTS (flags IPC, payload = export)
 *   open the mapping (cached by (peer,
 *   base, buffer id)), cudaMemcpyAsync
 *   into it, cuStreamWriteValue32(sem, n)
 *   on weft's stream; when that work is
 *   done:                     FIN      -->  request complete (a stream-ordered
 *   send complete                           receive waits on sem >= n instead)
 *
 * Semaphores hold monotonically increasing sequence values (wait for >= n),
 * never set/reset flags, so a late waiter can never miss a signal and no
 * barrier is needed. Imported mappings are cached: a repeated transfer into
 * the same buffer opens nothing; a new buffer id at a known base (the
 * exporter freed and reallocated) replaces the stale mapping.
 *
 * All functions are called with the comm lock held.
 */
#ifndef WEFT_CUDA_IPC_H
#define WEFT_CUDA_IPC_H

#include <stddef.h>
#include <stdint.h>

struct weft_comm;
struct weft_pipe;
struct weft_request;
struct weft_ctrl;

/* Largest CTS payload the protocol sends (fits every transport's ctrl_send). */
#define WEFT_CUDA_IPC_PAYLOAD_MAX 192

/* At comm create (after the rank cards are exchanged, CUDA loaded): per-comm
 * state in c->cuda_ipc_state. May use MPI (collective, fixed call count) to
 * exchange semaphore handles in one batch. */
int  weft_cuda_ipc_init(struct weft_comm *c);
void weft_cuda_ipc_fini(struct weft_comm *c);

/* Receiver: can the message announced by rts go by IPC into r (both device,
 * same node, peer access)? Nonzero = yes. */
int  weft_cuda_ipc_eligible(struct weft_pipe *p, const struct weft_ctrl *rts, const struct weft_request *r);

/* Receiver: exports r->buf and fills the CTS payload (at most
 * WEFT_CUDA_IPC_PAYLOAD_MAX bytes); r waits for the FIN. */
int  weft_cuda_ipc_export(struct weft_pipe *p, struct weft_request *r, void *payload, size_t *len);

/* Sender: the receiver's CTS (flags IPC) for s arrived: map, copy, signal.
 * When the copy is done the path sends FIN and calls weft_pipe_send_done. */
int  weft_cuda_ipc_push(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts,
                        const void *payload, size_t len);

/* Polls copies in flight (events); returns the number completed. */
int  weft_cuda_ipc_progress(struct weft_comm *c);

/* The pipe broke: forget s/r of this pipe still referenced. */
void weft_cuda_ipc_abort_pipe(struct weft_pipe *p);

#endif
