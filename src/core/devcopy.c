/*
 * Device-aware copies of user blocks (see devcopy.h).
 */
#include "devcopy.h"

#include <string.h>

#include "comm.h"
#include "cudawrap.h"
#include "log.h"
#include "pipe.h"
#include "stage.h"

int weft_devcopy(struct weft_comm *c, void *dst, const void *src, size_t n, const char *what)
{
    if (n == 0 || dst == src)
        return WEFT_SUCCESS;
    struct weft_mem_attr a, b;
    if (!c->cuda && !weft_cuda_present()) {
        memcpy(dst, src, n);   /* no CUDA in the process: host memory */
        return WEFT_SUCCESS;
    }
    weft_cuda_mem_attr(dst, &a);
    weft_cuda_mem_attr(src, &b);
    if (weft_mem_is_device(a.kind) || weft_mem_is_device(b.kind)) {
        if (!c->cuda) {
            const char *why = weft_cuda_why();
            return weft_set_error(c, WEFT_ERR_UNSUPPORTED,
                                  "%s: %zu bytes %p -> %p involve CUDA device memory, but weft cannot use CUDA in "
                                  "this process: %s", what, n, src, dst,
                                  why && *why ? why : "CUDA was not set up for this comm");
        }
        return weft_stage_copy_sync(c, dst, src, n, what);
    }
    memcpy(dst, src, n);
    return WEFT_SUCCESS;
}
