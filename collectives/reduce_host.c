/* STUB: replaced by the host kernels (issue 11, in progress). */
#include "reduce_kernel.h"
#include "weft.h"

size_t weft_dtype_size(int dtype)
{
    static const size_t sz[WEFT_DTYPE_COUNT] = { 1, 1, 4, 4, 8, 8, 2, 2, 4, 8 };
    return dtype >= 0 && dtype < WEFT_DTYPE_COUNT ? sz[dtype] : 0;
}
const char *weft_dtype_name(int dtype)
{
    static const char *n[WEFT_DTYPE_COUNT] = { "int8", "uint8", "int32", "uint32", "int64", "uint64",
                                               "float16", "bfloat16", "float32", "float64" };
    return dtype >= 0 && dtype < WEFT_DTYPE_COUNT ? n[dtype] : "?";
}
const char *weft_op_name(int op)
{
    static const char *n[WEFT_OP_COUNT] = { "sum", "prod", "min", "max", "avg" };
    return op >= 0 && op < WEFT_OP_COUNT ? n[op] : "?";
}
void weft_reduce_host(void *dst, const void *a, const void *b, size_t count, int dtype, int op)
{
    (void)dst; (void)a; (void)b; (void)count; (void)dtype; (void)op;
}
void weft_reduce_host_div(void *dst, const void *src, size_t count, int dtype, int n)
{
    (void)dst; (void)src; (void)count; (void)dtype; (void)n;
}
