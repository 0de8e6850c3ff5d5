/*
 * Copies into shared memory that another core reads next (a node-local
 * collective's slot): from a given size on with streaming (non-temporal)
 * stores, which write the lines to memory without first fetching them
 * from the core that last read them.
 *
 * Why: on the 2-core reference VM a line written on one core and read on
 * the other moves between the caches at 11-27 GB/s in some launches and
 * at 2-4 GB/s in others (the machine's slow phases, which come and go
 * with time). A plain store to a line the reader holds first pulls that
 * line over (the read for ownership) and the reader then pulls it back:
 * two slow transfers a line. Streamed, the reader reads memory instead:
 * 10-19 GB/s in either phase (bench/probes/xcore_probe.c's ring, plain
 * and streamed; docs/benchmarks.md, "Streaming stores into the
 * segment"). In the fast phases a plain copy is up to 1.5x faster:
 * WEFT_NODE_COLL_STREAM_KB sets the size from which copies stream.
 */
#ifndef WEFT_SHMPUT_H
#define WEFT_SHMPUT_H

#include <stddef.h>

/* memcpy(dst, src, n) of host memory that another process reads next;
 * with streaming stores when stream_min > 0 and n >= stream_min (x86-64;
 * elsewhere always memcpy). Like memcpy's, the stores are ordered before
 * a later release store (the flag that publishes them): the streamed
 * part ends with a store fence. */
void weft_shm_put(void *dst, const void *src, size_t n, size_t stream_min);

#endif
