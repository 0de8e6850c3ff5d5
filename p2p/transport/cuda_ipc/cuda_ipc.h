/*
 * CUDA IPC: the mover transport for device buffers of two ranks on one node.
 *
 * A mover (ctrl = 0, p2p/transport/transport.h), not a carrier: the pipe
 * between two ranks of a node has its own carrier (shm), whose control
 * frames carry this protocol for the pipe's rendezvous path "ipc" when both
 * ends of a rendezvous message are device memory and the two GPUs can reach
 * each other (cudaDeviceCanAccessPeer):
 *
 *   sender                                  receiver
 *   RTS (device, device ordinal)       -->
 *                                           matched, buffer is device memory:
 *                                           rndv_expect exports it (allocation
 *                                           base handle + offset + buffer id)
 *                                           and the pipe's semaphore, expect
 *                                           value n
 *                                      <--  CTS (ipc path, key = the export)
 *   rndv_push: open the mapping (cached
 *   by (peer, base, buffer id)),
 *   cudaMemcpyAsync into it,
 *   cuStreamWriteValue32(sem, n) on
 *   weft's stream; when that work is
 *   done (progress): rndv_done, and the
 *   sender's pipe sends  FIN           -->  request complete (a stream-ordered
 *   send complete                           receive waits on sem >= n instead)
 *
 * Semaphores hold monotonically increasing sequence values (wait for >= n),
 * never set/reset flags, so a late waiter can never miss a signal and no
 * barrier is needed. Imported mappings are cached: a repeated transfer into
 * the same buffer opens nothing; a new buffer id at a known base (the
 * exporter freed and reallocated) replaces the stale mapping.
 *
 * Conventions (shared with the pipe's ipc path, p2p/):
 *
 *   RTS    says the sender's buffer is device memory (weft_tp_src.mem_kind)
 *          and gives the sender's CUDA device ordinal of it (weft_tp_src.
 *          device), in the SENDER's numbering. The receiver maps it to a PCI
 *          bus id through the sender's card blob (gpu_busid[ordinal]) and
 *          finds its own ordinal with that bus id (ordinals differ between
 *          processes under CUDA_VISIBLE_DEVICES).
 *   CTS    the key of rndv_expect = struct weft_cuda_ipc_payload (below).
 *          No data arrives through this transport at the receiver: it does
 *          not take the receive (a mover's rndv_expect only makes the key).
 *   FIN    sender -> receiver (the reverse of the pull protocol's FIN), sent
 *          by the SENDER's pipe (ipc path) when rndv_push's transfer is done
 *          (rndv_done) or when rndv_push refused it, naming the RECEIVER's
 *          request, with status = WEFT_SUCCESS or the failure
 *          (WEFT_ERR_TRANSPORT: open or copy failed, the receiver must not
 *          hang). The FIN completes the receive.
 *
 * Eligibility (rndv_expect, receiver): the peer is on this node, the RTS
 * says device, the receive buffer is device memory of this rank, the
 * sender's device is one of this rank's devices (bus id), and that device
 * can access both the receive buffer's device and the device holding this
 * rank's semaphores (cudaDeviceCanAccessPeer; the same device counts as
 * reachable). Otherwise rndv_expect declines (WEFT_EAGAIN) and the pipe
 * stages through host memory.
 *
 * Semaphores: every rank with CUDA allocates at connect one device array of
 * `size` 32-bit words on its current device; word j is the semaphore of the
 * direction j -> this rank (what a stream-ordered receive waits on). The
 * array's IPC handle goes to every peer of the same (effective) node that
 * has a GPU in ONE alltoall of fixed-size records (env->coll), called by
 * every rank as soon as any card shows a GPU (also without CUDA: empty
 * records), once per comm; a sender opens a peer's array lazily at its
 * first push to that peer. The receiver numbers the IPC messages of each
 * peer 1, 2, 3, ... (32-bit, wrapping: waiters use GEQ, which the driver
 * compares with wrap-around), puts n in the key, and the sender writes n
 * into word[sender] of the receiver's array after the copy, on the same
 * stream. Copies of one sender to one peer are ordered on the stream (and
 * across streams of different devices by an event wait), so the word only
 * ever increases.
 *
 * The key layout is fixed (120 bytes, little-endian as the node is): see
 * struct weft_cuda_ipc_payload. The card blob: struct cuda_ipc_card.
 *
 * All functions are called with the pipe layer's lock held.
 */
#ifndef WEFT_CUDA_IPC_H
#define WEFT_CUDA_IPC_H

#include <stddef.h>
#include <stdint.h>
#include "transport.h"

#define WEFT_CUDA_IPC_MAGIC 0x43495057u   /* "WPIC" */

/* The rendezvous key (rndv_expect -> CTS -> rndv_push), receiver -> sender. */
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

/* This transport's blob in the rank card: the devices the rank sees, by PCI
 * bus id (for IPC reachability). */
struct cuda_ipc_card {
    uint8_t gpu_count;        /* 0 = no CUDA in this rank */
    uint8_t pad[7];
    char    gpu_busid[8][16]; /* "0000:07:00.0", device ordinal = index */
};

extern const struct weft_transport weft_transport_cuda_ipc;

#endif
