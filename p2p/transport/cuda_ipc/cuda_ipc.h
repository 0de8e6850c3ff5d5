/*
 * CUDA IPC: the mover transport for device buffers of two ranks on one node.
 *
 * A mover (ctrl = 0, p2p/transport/transport.h), not a carrier: the pipe
 * between two ranks of a node has its own carrier (shm), whose control
 * frames carry this protocol for the pipe's rendezvous path "mover" when
 * both ends of a rendezvous message are device memory and the two GPUs can
 * reach each other (cudaDeviceCanAccessPeer):
 *
 *   sender                                  receiver
 *   RTS (device, device ordinal)       -->
 *                                           matched, buffer is device memory:
 *                                           rndv_expect exports it (allocation
 *                                           handle + offset + buffer id + the
 *                                           allocation's block), and the
 *                                           receive's signal slot if it has one
 *                                      <--  CTS (mover path, key = the export)
 *   rndv_push: the receiver's block
 *   mapped (import cache, one mapping
 *   per block), cudaMemcpyAsync into
 *   it, cuStreamWriteValue32(the
 *   receiver's signal slot, n) on
 *   weft's stream when the key has one;
 *   when that work is done (progress):
 *   rndv_done, and the sender's pipe
 *   sends FIN (SIGNALED if it wrote)   -->  request complete; a stream-ordered
 *   send complete                           receive's stream already went on when
 *                                           the slot was written
 *
 * Blocks. Drivers carve small cudaMalloc allocations out of shared 2 MiB
 * blocks, and cudaIpcOpenMemHandle maps the whole block ("CUDA IPC APIs
 * will share the entire underlying memory block", Programming Guide): a
 * second open of a handle in a block this process has mapped fails with
 * cudaErrorAlreadyMapped (what drivers return in practice; UCX and
 * libfabric work around it the same way). So the receiver's key names the
 * allocation's block (CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, MAPPING_SIZE,
 * MEMORY_BLOCK_ID: core/cudawrap.h, weft_cuda_mem_block), and the sender
 * caches one mapping per (peer, block base, block id): every allocation in
 * a mapped block is reached through it. A driver that does not give the
 * block leaves its fields 0, and the cache falls back to one mapping per
 * allocation (base, buffer id). An open that still meets
 * cudaErrorAlreadyMapped (a block freed and made again at the same
 * addresses while this process maps the old one) closes this peer's idle
 * mappings that overlap the block and retries, then every idle mapping and
 * retries (UCX's order).
 *
 * Who may open. Opening maps memory and may wait for the device (not
 * documented either way; WEFT_CUDA_IPC_OPEN_SYNCS, default 1, assumes it
 * does). One of weft's own threads (the stream engine's progress thread)
 * never does it while a stream waits on weft (core/cudawrap.h,
 * weft_cuda_may_sync_in_progress): rndv_push then answers WEFT_EAGAIN and the pipe has
 * the receiver stage the message (RTS flag REDO). Closing (the last close
 * waits for the device) is put off the same way (the cache's may_close).
 * An open that fails for any other reason marks the peer: its later
 * messages are staged too (one warning).
 *
 * Signal slots. The receiver's signal slots (core/signals.h) are one device
 * allocation of its own per rank; its IPC handle goes to every peer of the
 * same (effective) node that has a GPU in ONE alltoall of fixed-size
 * records at connect (env->coll), called by every rank as soon as any card
 * shows a GPU (also without CUDA: empty records), and every rank maps its
 * node peers' slots there, on the caller's thread. A rank that cannot map a
 * peer's slots moves its device messages to that peer without signalling:
 * the receiver's weft then writes the slot itself.
 *
 * Ranks of one process (ncclCommInitAll, grouped inits) share an address
 * space and a driver that refuses to open a handle of the process itself:
 * between them nothing is opened; the sender copies straight into the
 * receiver's buffer (cudaMemcpyPeerAsync) and writes its slots directly.
 *
 * Conventions (shared with the pipe's mover path, p2p/rndv.c):
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
 *   FIN    sender -> receiver, sent by the SENDER's pipe when rndv_push's
 *          transfer is done (rndv_done) or when rndv_push refused it,
 *          naming the RECEIVER's request, with status = WEFT_SUCCESS or the
 *          failure (WEFT_ERR_TRANSPORT: the copy failed; the receiver must
 *          not hang), and flag SIGNALED when the slot was written.
 *
 * Eligibility (rndv_expect, receiver): the peer is on this node, its slots
 * were exchanged with this rank, the receive buffer is device memory of
 * this rank, the sender's device is one of this rank's devices (bus id),
 * and that device can access both the receive buffer's device and the
 * device of this rank's slots (cudaDeviceCanAccessPeer; the same device
 * counts as reachable). Otherwise rndv_expect declines (WEFT_EAGAIN) and
 * the pipe stages through host memory.
 *
 * The key layout is fixed (144 bytes, little-endian as the node is): see
 * struct weft_cuda_ipc_payload. The card blob: struct cuda_ipc_card.
 *
 * All functions are called with the pipe layer's lock held.
 */
#ifndef WEFT_CUDA_IPC_H
#define WEFT_CUDA_IPC_H

#include <stddef.h>
#include <stdint.h>
#include "transport.h"

#define WEFT_CUDA_IPC_MAGIC 0x32495057u   /* "WPI2": the key with blocks and signal slots */

/* The rendezvous key (rndv_expect -> CTS -> rndv_push), receiver -> sender. */
struct weft_cuda_ipc_payload {
    uint32_t magic;        /* WEFT_CUDA_IPC_MAGIC */
    uint32_t signal_value; /* the receive's signal slot value to write after the copy; 0: none */
    uint64_t base;         /* allocation base in the receiver's address space */
    uint64_t buffer_id;    /* the receiver's buffer id of that allocation */
    uint64_t alloc_size;   /* allocation size */
    uint64_t offset;       /* receive buffer = base + offset */
    uint64_t bytes;        /* bytes the sender copies (the message size) */
    int32_t  device;       /* receiver's device ordinal of the allocation */
    uint32_t signal_slot;  /* the slot (core/signals.h) */
    uint64_t block_base;   /* the allocation's block in the receiver's address space (cache key); 0: unknown */
    uint64_t block_id;     /* its MEMORY_BLOCK_ID (cache key: a new block at the same address) */
    uint64_t block_size;
    uint8_t  handle[64];   /* cudaIpcMemHandle_t of base (cudaIpcGetMemHandle); zeros between ranks of one process */
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
