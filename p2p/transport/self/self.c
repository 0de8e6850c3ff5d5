/*
 * self: a rank sending to itself.
 *
 * Control messages go through an in-process FIFO (a copy of header and
 * eager payload); a large message is pulled with one memcpy straight from
 * the send buffer once its receive is posted (rndv_get), so a send to self
 * of any size costs one copy.
 *
 * Device buffers never reach this file: the pipe copies them with one
 * cudaMemcpy (p2p/pipe.c, match_rts_device) or through a host bounce
 * (EAGER).
 */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "log.h"
#include "pipe.h"
#include "transport.h"

struct self_msg {
    struct self_msg  *next;
    struct weft_ctrl  hdr;
    size_t            len;
    unsigned char     payload[];
};

struct self_state {
    struct self_msg *head, *tail;
};

static int self_card_fill(struct weft_comm *c, struct weft_rank_card *mine)
{
    (void)mine;
    c->tp_state[WEFT_TP_SELF] = calloc(1, sizeof(struct self_state));
    return c->tp_state[WEFT_TP_SELF] ? WEFT_SUCCESS : WEFT_ERR_NO_MEMORY;
}

static int self_connect(struct weft_comm *c)
{
    c->pipes[c->rank].tp_peer = c->tp_state[WEFT_TP_SELF];
    return WEFT_SUCCESS;
}

static void self_drop_all(struct self_state *s)
{
    while (s->head) {
        struct self_msg *m = s->head;
        s->head = m->next;
        free(m);
    }
    s->tail = NULL;
}

static void self_disconnect(struct weft_comm *c)
{
    struct self_state *s = c->tp_state[WEFT_TP_SELF];
    if (s == NULL)
        return;
    self_drop_all(s);
    free(s);
    c->tp_state[WEFT_TP_SELF] = NULL;
}

static size_t self_eager_limit(const struct weft_comm *c)
{
    return c->cfg.self_eager_limit;
}

static int self_ctrl_send(struct weft_pipe *p, const struct weft_ctrl *m, const void *payload, size_t len)
{
    struct self_state *s = p->tp_peer;
    struct self_msg *msg = malloc(sizeof(*msg) + len);

    if (msg == NULL)
        return weft_set_error(p->comm, WEFT_ERR_NO_MEMORY, "send to self: no memory for %zu bytes", len);
    msg->next = NULL;
    msg->hdr = *m;
    msg->len = len;
    if (len)
        memcpy(msg->payload, payload, len);
    if (s->tail)
        s->tail->next = msg;
    else
        s->head = msg;
    s->tail = msg;
    return WEFT_SUCCESS;
}

static int self_progress(struct weft_comm *c)
{
    struct self_state *s = c->tp_state[WEFT_TP_SELF];
    int n = 0;

    /* Pop before delivering: the pipe may answer (FIN) into this queue. */
    while (s && s->head) {
        struct self_msg *m = s->head;
        s->head = m->next;
        if (s->head == NULL)
            s->tail = NULL;
        weft_pipe_on_ctrl(&c->pipes[c->rank], &m->hdr, m->payload, m->len);
        free(m);
        n++;
    }
    return n;
}

static int self_rndv_get(struct weft_pipe *p, struct weft_request *r, const struct weft_ctrl *rts)
{
    (void)p;
    memcpy(r->buf, (const void *)(uintptr_t)rts->addr, rts->bytes);
    r->tp_done = rts->bytes;
    return WEFT_SUCCESS;
}

static int self_rndv_unused(struct weft_pipe *p, struct weft_request *r)
{
    /* Unreachable: self_rndv_get never declines. */
    return weft_set_error(p->comm, WEFT_ERR_INTERNAL, "self: push requested for tag %d", r->tag);
}

static int self_rndv_push(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts)
{
    (void)cts;
    return self_rndv_unused(p, s);
}

static int self_busy(const struct weft_comm *c)
{
    const struct self_state *s = c->tp_state[WEFT_TP_SELF];
    return s && s->head;
}

static void self_abort_pipe(struct weft_pipe *p)
{
    if (p->tp_peer)
        self_drop_all(p->tp_peer);
}

const struct weft_transport weft_transport_self = {
    .name        = "self",
    .id          = WEFT_TP_SELF,
    .card_fill   = self_card_fill,
    .connect     = self_connect,
    .disconnect  = self_disconnect,
    .eager_limit = self_eager_limit,
    .ctrl_send   = self_ctrl_send,
    .progress    = self_progress,
    .rndv_get    = self_rndv_get,
    .rndv_expect = self_rndv_unused,
    .rndv_push   = self_rndv_push,
    .abort_pipe  = self_abort_pipe,
    .busy        = self_busy,
    .sleep       = NULL,
};
