/*
 * self: a rank sending to itself.
 *
 * Control frames go through an in-process FIFO (a copy of header and
 * payload); a large message is pulled with one copy straight from the send
 * buffer once its receive is posted (rndv_get), so a send to self of any
 * size costs one copy. With CUDA in the comm that copy also moves device
 * buffers (one cudaMemcpy on weft's stream, core/devcopy.c), so self's
 * rendezvous reads and writes both kinds of memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devcopy.h"
#include "list.h"
#include "log.h"
#include "transport.h"
#include "tp_iov.h"
#include "weft.h"

struct self_msg {
    struct weft_qnode qn;
    size_t            len;
    unsigned char     frame[];
};

struct self_state {
    const struct weft_tp_env *env;
    struct weft_queue         q;
};

static int self_create(const struct weft_tp_env *env, void *blob, void **ctx)
{
    struct self_state *s = calloc(1, sizeof(*s));
    (void)blob;
    if (s == NULL)
        return weft_set_error(env->core, WEFT_ERR_NO_MEMORY, "self: no memory for transport state");
    s->env = env;
    weft_queue_init(&s->q);
    *ctx = s;
    return WEFT_SUCCESS;
}

static int self_reach(const struct weft_tp_cards *k, int me, int peer, char *why, size_t whylen)
{
    (void)k;
    (void)why;
    (void)whylen;
    return me == peer;
}

static int self_connect(const struct weft_tp_env *env, void *ctx)
{
    (void)env;
    (void)ctx;
    return WEFT_SUCCESS;
}

static void self_drop_all(struct self_state *s)
{
    struct weft_qnode *n;
    while ((n = weft_queue_pop(&s->q)) != NULL)
        free(weft_container_of(n, struct self_msg, qn));
}

static void self_destroy(void *ctx)
{
    struct self_state *s = ctx;
    if (s == NULL)
        return;
    self_drop_all(s);
    free(s);
}

static size_t self_eager_limit(void *ctx, int peer, int internal)
{
    struct self_state *s = ctx;
    (void)peer;
    (void)internal;
    return s->env->core->cfg.self_eager_limit;
}

static int self_ctrl_send(void *ctx, int peer, const void *hdr, size_t hdr_len, const void *payload, size_t len)
{
    struct self_state *s = ctx;
    struct self_msg *m = malloc(sizeof(*m) + hdr_len + len);

    (void)peer;
    if (m == NULL)
        return weft_set_error(s->env->core, WEFT_ERR_NO_MEMORY, "send to self: no memory for %zu bytes", len);
    m->len = hdr_len + len;
    memcpy(m->frame, hdr, hdr_len);
    if (len)
        memcpy(m->frame + hdr_len, payload, len);
    weft_queue_push(&s->q, &m->qn);
    return WEFT_SUCCESS;
}

static int self_progress(void *ctx)
{
    struct self_state *s = ctx;
    struct weft_qnode *n;
    int count = 0;

    /* Pop before delivering: the pipe may answer (FIN) into this queue. */
    while (s && (n = weft_queue_pop(&s->q)) != NULL) {
        struct self_msg *m = weft_container_of(n, struct self_msg, qn);
        s->env->up->on_ctrl(s->env->up->arg, s->env->core->rank, m->frame, m->len);
        free(m);
        count++;
    }
    return count;
}

static unsigned self_rndv_mem(void *ctx, int peer)
{
    struct self_state *s = ctx;
    (void)peer;
    return WEFT_TP_MEM_HOST | (s->env->core->cuda ? WEFT_TP_MEM_DEVICE : 0);
}

static int self_rndv_get(void *ctx, int peer, struct weft_tp_xfer *x, const struct weft_tp_src *src)
{
    struct self_state *s = ctx;
    const void *from = (const void *)(uintptr_t)src->addr;
    (void)peer;
    if (x->mem_kind >= 2 || src->mem_kind >= 2) {
        /* One process: one copy between the two buffers, like the host pull. */
        char what[64];
        snprintf(what, sizeof(what), "send to self tag %d", x->tag);
        return weft_devcopy_sync(s->env->core, x->buf, from, x->bytes, what);
    }
    if (src->niov || x->niov) {
        /* A vectored message (either side): the source's pieces in order
         * into the receive's. Pieces that overlap the receive's are not
         * supported (unlike the plain copy below). */
        const struct weft_iov one = { src->addr, x->bytes };
        const struct weft_iov *in = src->niov ? (const struct weft_iov *)(uintptr_t)src->addr : &one;
        size_t n = src->niov ? src->niov : 1, off = 0;
        for (size_t i = 0; i < n && off < x->bytes; i++) {
            size_t len = (size_t)in[i].len < x->bytes - off ? (size_t)in[i].len : x->bytes - off;
            weft_tp_copy_in(x, off, (const void *)(uintptr_t)in[i].base, len);
            off += len;
        }
        return WEFT_SUCCESS;
    }
    /* memmove: a send to self may overlap the receive buffer (the
     * receive then holds exactly the bytes the send had). */
    if (x->bytes)
        memmove(x->buf, from, x->bytes);
    return WEFT_SUCCESS;
}

static int self_rndv_expect(void *ctx, int peer, struct weft_tp_xfer *x, const struct weft_tp_src *src, void *key,
                            size_t *keylen)
{
    struct self_state *s = ctx;
    (void)peer;
    (void)src;
    (void)key;
    (void)keylen;
    /* Unreachable: self_rndv_get never declines. */
    return weft_set_error(s->env->core, WEFT_ERR_INTERNAL, "self: push requested for tag %d", x->tag);
}

static int self_rndv_push(void *ctx, int peer, struct weft_tp_xfer *x, const void *key, size_t keylen)
{
    (void)key;
    (void)keylen;
    return self_rndv_expect(ctx, peer, x, NULL, NULL, NULL);
}

static int self_busy(void *ctx)
{
    const struct self_state *s = ctx;
    return s && !weft_queue_empty(&s->q);
}

static void self_abort_peer(void *ctx, int peer)
{
    (void)peer;
    if (ctx)
        self_drop_all(ctx);
}

const struct weft_transport weft_transport_self = {
    .name        = "self",
    .rndv_vectors = 1,
    .ctrl        = 1,
    .scope       = WEFT_TP_SCOPE_SELF,
    .sure        = 1,
    .card_bytes  = 0,
    .create      = self_create,
    .reach       = self_reach,
    .connect     = self_connect,
    .destroy     = self_destroy,
    .eager_limit = self_eager_limit,
    .ctrl_send   = self_ctrl_send,
    .progress    = self_progress,
    .rndv_mem    = self_rndv_mem,
    .rndv_get    = self_rndv_get,
    .rndv_expect = self_rndv_expect,
    .rndv_push   = self_rndv_push,
    .abort_peer  = self_abort_peer,
    .busy        = self_busy,
};
