/*
 * Memory registration for RDMA: the public weft_mem_register /
 * weft_mem_deregister. Both go to every transport of the comm that pins
 * memory (ib's registration cache, p2p/transport/ib/); a comm without one
 * only checks the arguments.
 */
#include <stdint.h>

#include "comm.h"
#include "log.h"
#include "p2p.h"

static int check_mem(weft_comm_t *c, const void *buf, size_t bytes, const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    if (buf == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: buf is NULL (bytes %zu)", fn, bytes);
    if (bytes == 0)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "%s: bytes is 0 (buf %p); the range must not be empty",
                              fn, buf);
    if (bytes - 1 > UINTPTR_MAX - (uintptr_t)buf)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                              "%s: range [%p, +%zu bytes) wraps around the address space", fn, buf, bytes);
    return WEFT_SUCCESS;
}

int weft_mem_register(weft_comm_t *c, const void *buf, size_t bytes)
{
    int rc = check_mem(c, buf, bytes, "weft_mem_register");
    return rc != WEFT_SUCCESS ? rc : weft_p2p_mem_pin(c->p2p, buf, bytes);
}

int weft_mem_deregister(weft_comm_t *c, const void *buf, size_t bytes)
{
    int rc = check_mem(c, buf, bytes, "weft_mem_deregister");
    return rc != WEFT_SUCCESS ? rc : weft_p2p_mem_unpin(c->p2p, buf, bytes);
}
