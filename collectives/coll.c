/*
 * Collectives: tags, p2p steps with error messages, request lists, and the
 * per-comm state (node layout, shapes already logged).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "coll.h"
#include "comm.h"
#include "log.h"
#include "api_internal.h"
#include "coll_state.h"

void coll_op_begin(struct coll_op *op, struct weft_comm *c, const char *what)
{
    op->c = c;
    op->what = what;
    /* Atomic only so that a (misused) concurrent call cannot tear the counter;
     * the order of collectives is the caller's contract. */
    op->seq = __atomic_fetch_add(&c->coll_seq, 1u, __ATOMIC_RELAXED);
}

int coll_tag(const struct coll_op *op, int phase)
{
    int slot = (int)(op->seq % WEFT_COLL_TAG_SLOTS);
    return -(WEFT_COLL_TAG_BASE + slot * WEFT_COLL_PHASES + phase);
}

/* The p2p layer already recorded why; keep that text after ours. */
static int coll_fail(const struct coll_op *op, int err, int step, const char *verb,
                     size_t bytes, int peer)
{
    char cause[512];
    const char *prev = weft_comm_last_error(op->c);
    snprintf(cause, sizeof cause, "%s", prev ? prev : "");
    return weft_set_error(op->c, err, "%s step %d: %s of %zu B with peer %d failed (%s): %s",
                          op->what, step, verb, bytes, peer, weft_strerror(err), cause);
}

int coll_isend(const struct coll_op *op, int step, const void *buf, size_t bytes,
               int peer, int phase, weft_request_t **req)
{
    int rc = weft_isend_internal(op->c, buf, bytes, peer, coll_tag(op, phase), req);
    if (rc != WEFT_SUCCESS)
        return coll_fail(op, rc, step, "isend", bytes, peer);
    return WEFT_SUCCESS;
}

int coll_irecv(const struct coll_op *op, int step, void *buf, size_t bytes,
               int peer, int phase, weft_request_t **req)
{
    int rc = weft_irecv_internal(op->c, buf, bytes, peer, coll_tag(op, phase), req);
    if (rc != WEFT_SUCCESS)
        return coll_fail(op, rc, step, "irecv", bytes, peer);
    return WEFT_SUCCESS;
}

int coll_wait(const struct coll_op *op, int step, weft_request_t *req, int peer, const char *verb)
{
    weft_status_t st;
    memset(&st, 0, sizeof st);
    int rc = weft_wait(req, &st);
    if (rc != WEFT_SUCCESS)
        return coll_fail(op, rc, step, verb, st.bytes, peer);
    return WEFT_SUCCESS;
}

int coll_reqs_init(const struct coll_op *op, struct coll_reqs *q, size_t cap)
{
    q->n = 0;
    q->cap = cap;
    q->r = NULL;
    q->peer = NULL;
    if (cap <= COLL_REQS_INLINE) {
        q->r = q->inl_r;
        q->peer = q->inl_peer;
        return WEFT_SUCCESS;
    }
    q->r = malloc(cap * sizeof *q->r);
    q->peer = malloc(cap * sizeof *q->peer);
    if (!q->r || !q->peer) {
        free(q->r);
        free(q->peer);
        q->r = NULL;
        q->peer = NULL;
        return weft_set_error(op->c, WEFT_ERR_NO_MEMORY, "%s: no memory for %zu request slots",
                              op->what, cap);
    }
    return WEFT_SUCCESS;
}

void coll_reqs_add(struct coll_reqs *q, weft_request_t *r, int peer)
{
    q->r[q->n] = r;
    q->peer[q->n] = peer;
    q->n++;
}

int coll_reqs_waitall(const struct coll_op *op, int step, struct coll_reqs *q)
{
    if (q->n == 0)
        return WEFT_SUCCESS;
    weft_status_t stack_st[16];
    weft_status_t *st = q->n <= 16 ? stack_st : calloc(q->n, sizeof *st);
    size_t n = q->n;
    q->n = 0;
    int rc = weft_waitall(n, q->r, st);
    if (rc != WEFT_SUCCESS) {
        int peer = -1;
        size_t bytes = 0;
        if (st) {
            for (size_t i = 0; i < n; i++) {
                if (st[i].error != WEFT_SUCCESS) {
                    peer = q->peer[i];
                    bytes = st[i].bytes;
                    break;
                }
            }
        }
        rc = coll_fail(op, rc, step, "wait", bytes, peer);
    }
    if (st != stack_st)
        free(st);
    return rc;
}

void coll_reqs_drain(struct coll_reqs *q)
{
    if (q->n > 0)
        (void)weft_waitall(q->n, q->r, NULL);
    q->n = 0;
}

void coll_reqs_fini(struct coll_reqs *q)
{
    if (q->r != q->inl_r) {
        free(q->r);
        free(q->peer);
    }
    q->r = NULL;
    q->peer = NULL;
    q->n = q->cap = 0;
}

/* ---- per-comm state ---- */

static void coll_state_release(void *p)
{
    struct coll_state *s = p;
    if (!s)
        return;
    free(s->topo.node_of);
    free(s->topo.node_first);
    free(s->topo.node_ranks);
    free(s->shapes);
    free(s);
}

struct coll_state *coll_state_get(struct weft_comm *c)
{
    if (c->coll_state)
        return c->coll_state;
    struct coll_state *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    c->coll_state_free = coll_state_release;
    c->coll_state = s;
    return s;
}

static int coll_topo_build(struct weft_comm *c, struct coll_topo *t)
{
    int n = c->size;
    int *node_of = malloc((size_t)n * sizeof *node_of);
    int *first = calloc((size_t)n + 1, sizeof *first);
    int *ranks = malloc((size_t)n * sizeof *ranks);
    int *key = malloc((size_t)n * sizeof *key);   /* card node value of node index i */
    if (!node_of || !first || !ranks || !key)
        goto fail;

    /* Node indices in order of each node's lowest rank, so node 0 holds rank 0
     * and every rank computes the same numbering from the same cards. */
    int nn = 0;
    for (int r = 0; r < n; r++) {
        int v = c->cards[r].node, i;
        for (i = 0; i < nn; i++)
            if (key[i] == v)
                break;
        if (i == nn)
            key[nn++] = v;
        node_of[r] = i;
        first[i + 1]++;
    }
    for (int i = 0; i < nn; i++)
        first[i + 1] += first[i];
    int *fill = key;   /* reuse: next free slot per node */
    for (int i = 0; i < nn; i++)
        fill[i] = first[i];
    for (int r = 0; r < n; r++)
        ranks[fill[node_of[r]]++] = r;
    free(key);
    t->nnodes = nn;
    t->node_of = node_of;
    t->node_first = first;
    t->node_ranks = ranks;
    return 0;
fail:
    free(key);
    free(ranks);
    free(first);
    free(node_of);
    return -1;
}

const struct coll_topo *coll_topo_get(struct weft_comm *c)
{
    struct coll_state *s = coll_state_get(c);
    if (!s) {
        weft_set_error(c, WEFT_ERR_NO_MEMORY, "collectives: no memory for the per-comm state");
        return NULL;
    }
    if (!s->topo_ready) {
        if (coll_topo_build(c, &s->topo) != 0) {
            weft_set_error(c, WEFT_ERR_NO_MEMORY, "collectives: no memory for the node layout of %d ranks",
                           c->size);
            return NULL;
        }
        s->topo_ready = 1;
    }
    return &s->topo;
}
