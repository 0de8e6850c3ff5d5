/* STUB: replaced by the CUDA kernel loader (issue 11, in progress). */
#include <stdio.h>
#include "reduce_kernel.h"
#include "core.h"
#include "log.h"
#include "weft.h"

int weft_reduce_device_available(struct weft_core *core, char *why, size_t whylen)
{
    (void)core;
    snprintf(why, whylen, "no reduction kernels in this build");
    return 0;
}
int weft_reduce_device(struct weft_core *core, void *dst, const void *a, const void *b, size_t count, int dtype,
                       int op, const char *what)
{
    (void)dst; (void)a; (void)b; (void)count; (void)dtype; (void)op;
    return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "%s: no reduction kernels", what);
}
int weft_reduce_device_div(struct weft_core *core, void *dst, const void *src, size_t count, int dtype, int n,
                           const char *what)
{
    (void)dst; (void)src; (void)count; (void)dtype; (void)n;
    return weft_set_error(core, WEFT_ERR_UNSUPPORTED, "%s: no reduction kernels", what);
}
void *weft_reduce_device_alloc(struct weft_core *core, size_t bytes) { (void)core; (void)bytes; return NULL; }
void weft_reduce_device_free(struct weft_core *core, void *p) { (void)core; (void)p; }
