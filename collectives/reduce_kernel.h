/*
 * Reduction kernels: the arithmetic of the reducing collectives, on the
 * host (reduce_host.c) and on CUDA devices (reduce_device.c, kernels in
 * reduce_cuda.cu built by nvcc into a fatbin embedded in libweft).
 *
 * Semantics, the same on both sides (docs/api.md, "Reductions"):
 *   - dst[i] = a[i] op b[i], a the left operand: callers keep a fixed
 *     operand order so every rank computes bit-identical results;
 *   - integers wrap on overflow (computed in the unsigned type of the
 *     same width, no undefined behaviour);
 *   - FLOAT16 (IEEE binary16) and BFLOAT16 are widened to float32, reduced,
 *     and rounded back to nearest-even (NaN stays NaN, overflow gives inf);
 *   - MIN/MAX of floats: if either operand is NaN the result is NaN
 *     (a NaN is never silently dropped);
 *   - WEFT_AVG reduces as WEFT_SUM; the division by the rank count is a
 *     separate final pass (div), integers truncating toward zero.
 */
#ifndef WEFT_REDUCE_KERNEL_H
#define WEFT_REDUCE_KERNEL_H

#include <stddef.h>
#include <stdint.h>

struct weft_core;

/* Bytes of one element; 0 when dtype is not a weft_dtype_t. */
size_t weft_dtype_size(int dtype);
/* "float32", "bfloat16", ...; "?" when unknown. */
const char *weft_dtype_name(int dtype);
/* "sum", "prod", "min", "max", "avg"; "?" when unknown. */
const char *weft_op_name(int op);

/* ---- host (reduce_host.c) ---- */

/* dst[i] = a[i] op b[i], i < count. dst may be exactly a or b, never a
 * partial overlap. dtype and op are valid (checked by the caller). */
void weft_reduce_host(void *dst, const void *a, const void *b, size_t count, int dtype, int op);
/* dst[i] = src[i] / n (avg's final division). dst may be exactly src. */
void weft_reduce_host_div(void *dst, const void *src, size_t count, int dtype, int n);

/* Conversions (exposed for tests and the device fallback). */
float    weft_half_to_float(uint16_t h);
uint16_t weft_float_to_half(float f);
float    weft_bf16_to_float(uint16_t h);
uint16_t weft_float_to_bf16(float f);

/* ---- device (reduce_device.c) ---- */

/* Whether reductions of device memory can run as kernels in this process:
 * the embedded fatbin loaded into the current device's context
 * (cuModuleLoadData) on first use. When not (no fatbin built, the emulated
 * runtime, no image for this GPU's architecture), why says so, logged once
 * at info by the caller; the collectives then stage through host memory. */
/* device: the ordinal of the call's device buffers (-1: any); kernels run
 * only on weft's stream's device, so buffers elsewhere are staged. */
int  weft_reduce_device_available(struct weft_core *core, int device, char *why, size_t whylen);
/* The device forms of the two calls above: launched on weft's CUDA stream
 * (weft_devcopy_stream) and waited for. WEFT_SUCCESS, or an error with the
 * last error naming what and the CUDA error. */
int  weft_reduce_device(struct weft_core *core, void *dst, const void *a, const void *b, size_t count, int dtype,
                        int op, const char *what);
int  weft_reduce_device_div(struct weft_core *core, void *dst, const void *src, size_t count, int dtype, int n,
                            const char *what);
/* Device memory for a device op's scratch (cudaMalloc), freed with _free;
 * NULL: none. */
void *weft_reduce_device_alloc(struct weft_core *core, size_t bytes);
void  weft_reduce_device_free(struct weft_core *core, void *p);

#endif
