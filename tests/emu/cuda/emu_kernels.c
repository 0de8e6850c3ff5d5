/* weft's reduction kernels in the emulated CUDA runtime (emu_kernels.h).
 *
 * The table holds every entry point collectives/reduce_cuda.cu defines; the
 * arithmetic is weft's host reduction code (collectives/reduce_host.c,
 * compiled into this library with hidden visibility), which is what the
 * CUDA kernels are specified to match bit for bit (reduce_kernel.h). So a
 * device reduction takes the same path in CI as on a GPU -- module loaded,
 * functions looked up, launches queued on weft's stream and waited for --
 * and only the SASS itself stays GPU-only. */
#include "emu_kernels.h"

#include <string.h>

#include "reduce_kernel.h"
#include "weft.h"

#define TYPES(X) X("i8", WEFT_INT8, 1) X("u8", WEFT_UINT8, 1) X("i32", WEFT_INT32, 4) X("u32", WEFT_UINT32, 4) \
    X("i64", WEFT_INT64, 8) X("u64", WEFT_UINT64, 8) X("f16", WEFT_FLOAT16, 2) X("bf16", WEFT_BFLOAT16, 2)          \
    X("f32", WEFT_FLOAT32, 4) X("f64", WEFT_FLOAT64, 8)
#define ENTRIES(t, d, es)                                                                          \
    { "weft_reduce_" t "_sum", 0, d, WEFT_SUM, es }, { "weft_reduce_" t "_prod", 0, d, WEFT_PROD, es }, \
    { "weft_reduce_" t "_min", 0, d, WEFT_MIN, es }, { "weft_reduce_" t "_max", 0, d, WEFT_MAX, es },   \
    { "weft_div_" t, 1, d, WEFT_SUM, es },

static const struct emu_kernel g_kernels[] = { TYPES(ENTRIES) };
#define NKERNELS ((int)(sizeof(g_kernels) / sizeof(g_kernels[0])))

const struct emu_kernel *emu_kernel_find(const char *name)
{
    for (int i = 0; name && i < NKERNELS; i++)
        if (strcmp(g_kernels[i].name, name) == 0) return &g_kernels[i];
    return NULL;
}

int emu_kernel_index(const struct emu_kernel *k) { return (int)(k - g_kernels); }

int emu_kernel_count(void) { return NKERNELS; }

void emu_kernel_run(const struct emu_kernel *k, void *dst, const void *a, const void *b, unsigned long long n,
                    int divisor)
{
    if (n == 0) return;
    if (k->div)
        weft_reduce_host_div(dst, a, (size_t)n, k->dtype, divisor);
    else
        weft_reduce_host(dst, a, b, (size_t)n, k->dtype, k->op);
}
