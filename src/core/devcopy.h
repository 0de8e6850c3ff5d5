/*
 * Copies of user blocks inside the library (collectives: the own block into
 * recvbuf, scratch rotations) that work for host and CUDA device memory.
 */
#ifndef WEFT_DEVCOPY_H
#define WEFT_DEVCOPY_H

#include <stddef.h>

struct weft_comm;

/* Copies n bytes from src to dst (not overlapping). memcpy when neither side
 * is device memory; WEFT_ERR_UNSUPPORTED when one is but the comm has no
 * CUDA (never a host access to a device pointer); otherwise a cudaMemcpyAsync (cudaMemcpyDefault) on weft's stream, waited
 * for, so the data is in place on return. WEFT_SUCCESS, or the failure with
 * the comm's last error naming `what` and the CUDA error. */
int weft_devcopy(struct weft_comm *c, void *dst, const void *src, size_t n, const char *what);

#endif
