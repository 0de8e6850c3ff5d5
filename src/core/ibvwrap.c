/*
 * libibverbs, loaded at run time (see ibvwrap.h).
 *
 * One load per process and library path: every comm that uses ib takes a
 * reference, the last weft_ibv_unload closes the handle. Loading once matters
 * beyond speed: libibverbs keeps process-wide state (device list, provider
 * plugins) that a dlclose/dlopen cycle per comm would rebuild every time, and
 * two comms alive at once share one copy of it.
 */
#ifdef WEFT_HAVE_VERBS_HEADERS

#include "ibvwrap.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t ibv_lock = PTHREAD_MUTEX_INITIALIZER;
static struct weft_ibv ibv_loaded;   /* the process-wide table */
static int ibv_refs;                 /* comms holding it */

/* Resolves name into *slot; a required one missing fails the load. */
static int resolve(void *h, const char *name, void **slot, int required, char *why, size_t whylen)
{
    dlerror();
    *slot = dlsym(h, name);
    if (*slot == NULL && required) {
        const char *e = dlerror();
        snprintf(why, whylen, "symbol %s not found%s%s", name, e ? ": " : "", e ? e : "");
        return -1;
    }
    return 0;
}

/* Fills t from handle h; on failure t is partially written (caller's copy). */
static int resolve_all(void *h, struct weft_ibv *t, char *why, size_t whylen)
{
    /* Casting void * to a function pointer is what dlsym's contract (POSIX)
     * allows; going through the slot's address keeps -Wpedantic quiet. */
#define REQ(field, sym) if (resolve(h, sym, (void **)&t->field, 1, why, whylen)) return -1
#define OPT(field, sym) resolve(h, sym, (void **)&t->field, 0, why, whylen)
    REQ(get_device_list, "ibv_get_device_list");
    REQ(free_device_list, "ibv_free_device_list");
    REQ(get_device_name, "ibv_get_device_name");
    REQ(open_device, "ibv_open_device");
    REQ(close_device, "ibv_close_device");
    REQ(query_device, "ibv_query_device");
    REQ(query_port, "ibv_query_port");
    REQ(query_gid, "ibv_query_gid");
    /* verbs.h's ibv_query_gid_ex is an inline wrapper around this one. */
    OPT(query_gid_ex, "_ibv_query_gid_ex");
    REQ(alloc_pd, "ibv_alloc_pd");
    REQ(dealloc_pd, "ibv_dealloc_pd");
    REQ(reg_mr, "ibv_reg_mr");
    OPT(reg_dmabuf_mr, "ibv_reg_dmabuf_mr");
    REQ(dereg_mr, "ibv_dereg_mr");
    REQ(create_cq, "ibv_create_cq");
    REQ(destroy_cq, "ibv_destroy_cq");
    REQ(create_qp, "ibv_create_qp");
    REQ(modify_qp, "ibv_modify_qp");
    REQ(destroy_qp, "ibv_destroy_qp");
    REQ(wc_status_str, "ibv_wc_status_str");
#undef REQ
#undef OPT
    return 0;
}

int weft_ibv_load(const char *path, struct weft_ibv *ibv, char *why, size_t whylen)
{
    struct weft_ibv t;
    int rc = -1;

    if (path == NULL || path[0] == '\0') {
        snprintf(why, whylen, "no library named (WEFT_IBVERBS_LIB is empty)");
        return -1;
    }
    pthread_mutex_lock(&ibv_lock);
    if (ibv_refs > 0) {
        if (strcmp(ibv_loaded.path, path) == 0) {
            ibv_refs++;
            *ibv = ibv_loaded;
            rc = 0;
        } else {
            /* One verbs library per process: two would each own devices
             * and contexts the other cannot use. */
            snprintf(why, whylen, "%s requested but %s is already in use by another comm", path,
                     ibv_loaded.path);
        }
        goto out;
    }

    memset(&t, 0, sizeof(t));
    dlerror();
    t.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (t.handle == NULL) {
        const char *e = dlerror();
        snprintf(why, whylen, "dlopen(%s) failed: %s", path, e ? e : "unknown error");
        goto out;
    }
    if (resolve_all(t.handle, &t, why, whylen) != 0) {
        dlclose(t.handle);
        goto out;
    }
    snprintf(t.path, sizeof(t.path), "%s", path);
    ibv_loaded = t;
    ibv_refs = 1;
    *ibv = t;
    rc = 0;
out:
    pthread_mutex_unlock(&ibv_lock);
    return rc;
}

void weft_ibv_unload(struct weft_ibv *ibv)
{
    if (ibv == NULL || ibv->handle == NULL)
        return;
    pthread_mutex_lock(&ibv_lock);
    if (ibv_refs > 0 && ibv->handle == ibv_loaded.handle && --ibv_refs == 0) {
        dlclose(ibv_loaded.handle);
        memset(&ibv_loaded, 0, sizeof(ibv_loaded));
    }
    pthread_mutex_unlock(&ibv_lock);
    memset(ibv, 0, sizeof(*ibv));
}

#else
/* ISO C forbids an empty translation unit. */
typedef int weft_ibvwrap_unused;
#endif /* WEFT_HAVE_VERBS_HEADERS */
