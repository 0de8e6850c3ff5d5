/*
 * Copies into shared memory that another core reads next (a node-local
 * collective's slot): plain, or with streaming (non-temporal) stores when
 * plain ones run slow.
 *
 * Why: a plain store to a line the reader holds first pulls that line
 * over from the reader's cache (the read for ownership), and the reader
 * then pulls it back. On the 2-core reference VM (an AMD EPYC guest) that
 * runs at 9-28 GB/s in some phases and at 2.4-4.7 in others (the two
 * vCPUs on one core complex or on two, it seems; the phases come and go
 * with time). Streamed, the lines go to memory and the reader reads them
 * from there: 10-19 GB/s in either phase, but up to 2x slower than plain
 * in the fast phases. So the writer times its plain copies, and after one
 * slower than 6 GB/s streams the next 128 before looking again
 * (docs/benchmarks.md, "Streaming stores into the segment").
 */
#ifndef WEFT_SHMPUT_H
#define WEFT_SHMPUT_H

#include <stddef.h>

/* memcpy(dst, src, n) of host memory that another process reads next.
 * From stream_min bytes on (stream_min > 0; x86-64 only) the copy may be
 * streamed, as above. The stores are ordered before a later release
 * store (the flag that publishes them), like memcpy's: a streamed copy
 * ends with a store fence. */
void weft_shm_put(void *dst, const void *src, size_t n, size_t stream_min);

/* The streamed copy itself (x86-64; elsewhere memcpy): for weft_shm_put
 * and its tests. */
void weft_shm_put_streamed(void *dst, const void *src, size_t n);

#endif
