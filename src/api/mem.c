/*
 * Memory registration for RDMA: the public weft_mem_register /
 * weft_mem_deregister. Both go to the comm's registration cache
 * (src/regcache.c), which the ib transport creates at connect; a comm
 * without an RDMA transport has none, and the calls only check arguments.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>

#include "weft.h"
#include "comm.h"
#include "log.h"
#include "regcache.h"

static int check_mem(weft_comm_t *c, const void *buf, size_t bytes, const char *fn)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "%s: comm is NULL", fn);
    if (buf == NULL)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: buf is NULL (bytes %zu)", fn, bytes);
    if (bytes == 0)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG, "%s: bytes is 0 (buf %p); the range must not be empty",
                              fn, buf);
    if (bytes - 1 > UINTPTR_MAX - (uintptr_t)buf)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                              "%s: range [%p, +%zu bytes) wraps around the address space", fn, buf, bytes);
    return WEFT_SUCCESS;
}

int weft_mem_register(weft_comm_t *c, const void *buf, size_t bytes)
{
    char why[256];
    int rc = check_mem(c, buf, bytes, "weft_mem_register");

    if (rc != WEFT_SUCCESS)
        return rc;
    pthread_mutex_lock(&c->lock);
    if (c->regcache != NULL) {
        why[0] = '\0';
        rc = weft_regcache_pin(c->regcache, buf, bytes, why, sizeof(why));
        if (rc != WEFT_SUCCESS)
            rc = weft_set_error(c, rc,
                                "weft_mem_register: registering [0x%" PRIxPTR ", 0x%" PRIxPTR ") (%zu bytes) failed: %s",
                                (uintptr_t)buf, (uintptr_t)buf + bytes, bytes,
                                why[0] != '\0' ? why : weft_strerror(rc));
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int weft_mem_deregister(weft_comm_t *c, const void *buf, size_t bytes)
{
    int rc = check_mem(c, buf, bytes, "weft_mem_deregister");

    if (rc != WEFT_SUCCESS)
        return rc;
    pthread_mutex_lock(&c->lock);
    if (c->regcache != NULL)
        (void)weft_regcache_invalidate(c->regcache, buf, bytes);
    pthread_mutex_unlock(&c->lock);
    return WEFT_SUCCESS;
}
