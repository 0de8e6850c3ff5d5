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
 * Conventions (shared with the pipe, p2p/pipe.c):
 *
 *   RTS    flags WEFT_CTRL_F_DEVICE; weft_ctrl.reserved = the sender's CUDA
 *          device ordinal of its buffer, in the SENDER's numbering. The
 *          receiver maps it to a PCI bus id through the sender's rank card
 *          (gpu_busid[ordinal]) and finds its own ordinal with that bus id
 *          (ordinals differ between processes under CUDA_VISIBLE_DEVICES).
 *   CTS    flags WEFT_CTRL_F_IPC, payload = struct weft_cuda_ipc_payload
 *          (below). The receiver must not call the transport's rndv_expect
 *          for it: no data arrives through the transport.
 *   FIN    sender -> receiver (the reverse of the pull protocol's FIN),
 *          flags WEFT_CTRL_F_IPC, sreq = rreq = the RECEIVER's request id,
 *          status = WEFT_SUCCESS or the failure (WEFT_ERR_TRANSPORT: open or
 *          copy failed, the receiver must not hang). With sreq naming the
 *          receive, the pipe's generic FIN handling (remove from inflight,
 *          complete with status) completes the receive.
 *
 * Eligibility (weft_cuda_ipc_eligible, receiver): the pipe's transport is
 * shm (same node), the RTS says DEVICE, r->buf is device memory of this
 * rank, the sender's device is one of this rank's devices (bus id), and that
 * device can access both the receive buffer's device and the device holding
 * this rank's semaphores (cudaDeviceCanAccessPeer; the same device counts as
 * reachable). Otherwise the pipe stages through host memory.
 *
 * Semaphores: every rank with CUDA allocates at init one device array of
 * `size` 32-bit words on its current device; word j is the semaphore of the
 * direction j -> this rank (what a stream-ordered receive waits on). The
 * array's IPC handle goes to every shm peer in ONE MPI_Alltoall of fixed-size
 * records, called by every rank (also without CUDA: empty records), once per
 * comm; a sender opens a peer's array lazily at its first push to that peer.
 * The receiver numbers the IPC messages of each peer 1, 2, 3, ... (32-bit,
 * wrapping: waiters use GEQ, which the driver compares with wrap-around),
 * puts n in the CTS payload, and the sender writes n into word[sender] of
 * the receiver's array after the copy, on the same stream. Copies of one
 * sender to one peer are ordered on the stream (and across streams of
 * different devices by an event wait), so the word only ever increases.
 *
 * The payload layout is fixed (120 bytes, little-endian as the node is):
 * see struct weft_cuda_ipc_payload.
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

#define WEFT_CUDA_IPC_MAGIC 0x43495057u   /* "WPIC" */

/* CTS payload of the IPC protocol (receiver -> sender). */
struct weft_cuda_ipc_payload {
    uint32_t magic;       /* WEFT_CUDA_IPC_MAGIC */
    uint32_t sem_value;   /* n: the sender writes it into word[sender] of the receiver's semaphores */
    uint64_t base;        /* allocation base in the receiver's address space (cache key) */
    uint64_t buffer_id;   /* the receiver's buffer id of that allocation (cache key: reuse of base) */
    uint64_t alloc_size;  /* allocation size */
    uint64_t offset;      /* receive buffer = base + offset */
    uint64_t bytes;       /* bytes the sender copies (the message size) */
    int32_t  device;      /* receiver's device ordinal of the allocation (informational) */
    uint32_t reserved;
    uint8_t  handle[64];  /* cudaIpcMemHandle_t of base (cudaIpcGetMemHandle) */
};

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

/* The pipe broke: forget s/r of this pipe still referenced (a copy already
 * queued still runs; its mapping is released when it is done). */
void weft_cuda_ipc_abort_pipe(struct weft_pipe *p);

/* Nonzero while copies are in flight or FINs wait for room: a waiter should
 * poll (no doorbell rings when a copy completes) instead of sleeping long. */
int  weft_cuda_ipc_busy(const struct weft_comm *c);

/* Receiver, for stream-ordered receives: the device address of the
 * semaphore word of the direction peer -> this rank (wait for >= the
 * payload's sem_value), or NULL when IPC is not set up with that peer. */
void *weft_cuda_ipc_inbound_sem(struct weft_comm *c, int peer);

#endif
