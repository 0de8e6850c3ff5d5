/*
 * Device signal slots of a comm: what a stream-ordered receive waits on.
 *
 * One device allocation per comm of its own -- 2 MiB, so no other
 * allocation shares its block and CUDA IPC maps only it -- made at connect
 * on the device current at weft_comm_create, zeroed, and exported by CUDA
 * IPC to the node's peers (p2p/transport/cuda_ipc/). It holds
 * WEFT_SIGNAL_SLOTS 32-bit words. A stream-ordered receive takes one slot
 * and the slot's next value n when it is queued, and the application's
 * stream waits on the device for word >= n (cuStreamWaitValue32, GEQ with
 * wrap-around), so later work on that stream starts when the data is in:
 *
 *   the data came by CUDA IPC:  the SENDER's GPU writes n into the word
 *                               right after its copy, on the same stream
 *                               (the receiver's host is not in the way);
 *   any other path (staged,     weft writes n on its own stream
 *   tcp, a failure):            (cuStreamWriteValue32) once the receive
 *                               completed on the host.
 *
 * Each slot's value only grows (a late waiter never misses its signal).
 * A slot written by weft's stream is taken again only after that write has
 * executed (an event per write, checked in order: writes on one stream
 * finish in order), so an old value can never land after a peer wrote a
 * newer one. When no slot is free the caller waits on the host counter
 * instead (src/stream/stream.c), which is always correct.
 *
 * Thread-safe (a lock of its own). Everything is a no-op without CUDA.
 */
#ifndef WEFT_SIGNALS_H
#define WEFT_SIGNALS_H

#include <stddef.h>
#include <stdint.h>
#include "core.h"

#define WEFT_SIGNAL_SLOTS      65536u
#define WEFT_SIGNAL_AREA_BYTES (2u << 20)   /* a block of its own */

/* Allocates and zeroes the area on the current device (connect, on the
 * caller's thread). WEFT_SUCCESS, or a code with why filled; without CUDA
 * WEFT_ERR_UNSUPPORTED. */
int  weft_signals_init(struct weft_core *core, char *why, size_t whylen);
/* After the final barrier: peers have let go of their mappings. */
void weft_signals_fini(struct weft_core *core);

/* The area for its exporter (cuda_ipc): device address, device ordinal,
 * IPC handle (64 bytes, cudaIpcGetMemHandle). WEFT_SUCCESS or an error. */
int  weft_signals_export(struct weft_core *core, uintptr_t *base, int *device, void *handle);
/* The device of the area, -1 when there is none. */
int  weft_signals_device(struct weft_core *core);

/* A slot for a stream-ordered receive: its index, the value to wait for
 * and the word's device address. 0, or -1 when none is free now (or there
 * is no area): then use the host counter. */
int  weft_signals_take(struct weft_core *core, uint32_t *slot, uint32_t *value, uintptr_t *addr);
/* The receive of a taken slot completed (or failed). peer_wrote: the
 * sender's GPU wrote the value already (CUDA IPC); otherwise weft's stream
 * writes it now. The slot is free again once that write has executed. */
int  weft_signals_complete(struct weft_core *core, uint32_t slot, uint32_t value, int peer_wrote);
/* A slot taken but never waited on (the submission failed): free now. */
void weft_signals_drop(struct weft_core *core, uint32_t slot);
/* A receive given up on (destroy, a stream-ordered call that timed out):
 * the value is written on weft's stream so its stream moves on, and the
 * slot is never handed out again -- the transfer may still be in flight,
 * and its late write must not land on a reused slot. */
void weft_signals_abandon(struct weft_core *core, uint32_t slot, uint32_t value);

#endif
