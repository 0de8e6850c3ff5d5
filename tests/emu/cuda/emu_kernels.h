/* weft's reduction kernels as the emulated CUDA runtime runs them
 * (tests/emu/cuda/README.md, "Modules and kernels"): recognised by the names
 * collectives/reduce_cuda.cu gives them, computed on the stream's worker
 * thread with weft's host reduction code as the reference arithmetic. */
#ifndef WEFT_EMU_KERNELS_H
#define WEFT_EMU_KERNELS_H

#include <stddef.h>

struct emu_kernel {
    const char *name;     /* weft_reduce_<type>_<op> or weft_div_<type> */
    int         div;      /* 1: (dst, src, u64 n, int divisor); 0: (dst, a, b, u64 n) */
    int         dtype;    /* weft_dtype_t */
    int         op;       /* weft_op_t (sum, prod, min, max) */
    size_t      esize;    /* bytes per element */
};

/* The kernel of that name, or NULL. */
const struct emu_kernel *emu_kernel_find(const char *name);
/* Index of k in the table (0 .. emu_kernel_count() - 1). */
int emu_kernel_index(const struct emu_kernel *k);
int emu_kernel_count(void);
/* Runs k over n elements: dst = a op b, or dst = a / divisor (b unused).
 * The pointers are the emulator's host views of device memory. */
void emu_kernel_run(const struct emu_kernel *k, void *dst, const void *a, const void *b, unsigned long long n,
                    int divisor);

#endif
