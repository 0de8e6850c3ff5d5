/*
 * Collectives: the per-comm context (node layout, the configured
 * algorithm, shapes already logged) and the sequence numbers of calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "coll_impl.h"
#include "journal.h"
#include "config.h"
#include "core.h"
#include "log.h"
#include "reduce_kernel.h"
#include "tags.h"
#include "weft.h"

int coll_algo_parse(const char *s, const char *const *names)
{
    if (!s || !*s)
        return 0;
    for (int a = 0; names[a]; a++)
        if (strcmp(s, names[a]) == 0)
            return a;
    return -1;
}

void coll_log_shape_once(struct weft_coll *cc, int kind, size_t count, int algo, const char *what,
                         const char *algo_name, int forced)
{
    int fresh = 0;
    if (weft_log_level() < WEFT_LOG_INFO)
        return;
    pthread_mutex_lock(&cc->shapes_lock);
    size_t i;
    for (i = 0; i < cc->nshapes; i++)
        if (cc->shapes[i].kind == kind && cc->shapes[i].bytes == count && cc->shapes[i].algo == algo)
            break;
    if (i == cc->nshapes) {
        if (cc->nshapes == cc->cap_shapes) {
            size_t cap = cc->cap_shapes ? 2 * cc->cap_shapes : 16;
            struct weft_coll_shape *p = realloc(cc->shapes, cap * sizeof *p);
            if (p) {   /* else only the log line is lost */
                cc->shapes = p;
                cc->cap_shapes = cap;
            }
        }
        if (cc->nshapes < cc->cap_shapes) {
            cc->shapes[cc->nshapes].kind = kind;
            cc->shapes[cc->nshapes].bytes = count;
            cc->shapes[cc->nshapes].algo = algo;
            cc->nshapes++;
            fresh = 1;
        }
    }
    pthread_mutex_unlock(&cc->shapes_lock);
    if (fresh)
        WEFT_INFO(cc->core->rank, "%s x %d ranks (%d nodes): %s (%s)", what, cc->core->size, cc->nnodes, algo_name,
                  forced ? "forced by its WEFT_*_ALGO" : "selector");
}

uint32_t coll_seq_next(struct weft_coll *cc)
{
    /* Atomic only so that a (misused) concurrent call cannot tear the counter;
     * the order of collectives is the caller's contract. */
    return __atomic_fetch_add(&cc->seq, 1u, __ATOMIC_RELAXED);
}

static int coll_topo_build(struct weft_coll *cc, const int *node_key)
{
    int n = cc->core->size;
    int *node_of = malloc((size_t)n * sizeof *node_of);
    int *first = calloc((size_t)n + 1, sizeof *first);
    int *ranks = malloc((size_t)n * sizeof *ranks);
    int *key = malloc((size_t)n * sizeof *key);   /* node value of node index i */
    if (!node_of || !first || !ranks || !key)
        goto fail;

    /* Node indices in order of each node's lowest rank, so node 0 holds rank 0
     * and every rank computes the same numbering from the same cards. */
    int nn = 0;
    for (int r = 0; r < n; r++) {
        int v = node_key[r], i;
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
    cc->nnodes = nn;
    cc->node_of = node_of;
    cc->node_first = first;
    cc->node_ranks = ranks;
    return 0;
fail:
    free(key);
    free(ranks);
    free(first);
    free(node_of);
    return -1;
}

int weft_coll_init(struct weft_coll *cc, struct weft_p2p *p2p, struct weft_core *core, const int *node)
{
    memset(cc, 0, sizeof *cc);
    cc->p2p = p2p;
    cc->core = core;
    weft_p2p_set_check_describe(p2p, weft_sched_describe_check);
    pthread_mutex_init(&cc->shapes_lock, NULL);
    pthread_mutex_init(&cc->stage_lock, NULL);
    pthread_mutex_init(&cc->nb_lock, NULL);
    /* src/core/config.c accepts only the names of these lists. */
    cc->ag_algo = coll_algo_parse(core->cfg.allgather_algo, weft_allgather_algo_names);
    cc->ar_algo = coll_algo_parse(core->cfg.allreduce_algo, weft_allreduce_algo_names);
    cc->rs_algo = coll_algo_parse(core->cfg.reduce_scatter_algo, weft_reduce_scatter_algo_names);
    cc->red_algo = coll_algo_parse(core->cfg.reduce_algo, weft_reduce_algo_names);
    cc->a2a_algo = coll_algo_parse(core->cfg.alltoall_algo, weft_alltoall_algo_names);
    if (cc->ag_algo < 0 || cc->ar_algo < 0 || cc->rs_algo < 0 || cc->red_algo < 0 || cc->a2a_algo < 0)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "collectives: an unknown algorithm name in the config");
    if (core->size > 1) {
        cc->journal = calloc(1, sizeof *cc->journal);
        cc->sjournal = calloc(1, sizeof *cc->sjournal);
        if (cc->journal == NULL || cc->sjournal == NULL)
            return weft_set_error(core, WEFT_ERR_NO_MEMORY, "collectives: no memory for the operation journal");
        weft_journal_init(cc->journal);
        weft_journal_init_beside(cc->sjournal, cc->journal);
    }
    if (coll_topo_build(cc, node) != 0)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "collectives: no memory for the node layout of %d ranks",
                              core->size);
    coll_node_init(cc);   /* (after the layout: the node count is part of what it decides) */
    /* The reduction kernels' module, loaded now (once per process and
     * device): loading waits for the device, which a first stream-ordered
     * reduction must not make its caller do behind a busy stream, and
     * weft's threads must never do. A refusal is kept, with its why, and
     * said by the first call that needs kernels. */
    if (core->cuda) {
        char why[320];
        (void)weft_reduce_device_available(core, -1, why, sizeof why);
    }
    return WEFT_SUCCESS;
}

void weft_coll_fini(struct weft_coll *cc)
{
    if (cc->core == NULL)
        return;   /* zeroed, or already done */
    free(cc->node_of);
    free(cc->node_first);
    free(cc->node_ranks);
    free(cc->shapes);
    free(cc->journal);
    free(cc->sjournal);
    coll_node_fini(cc);
    coll_stage_fini(cc);
    coll_nb_fini(cc);
    weft_sched_spares_fini(cc);   /* last: no op of the comm is freed after this */
    pthread_mutex_destroy(&cc->shapes_lock);
    pthread_mutex_destroy(&cc->stage_lock);
    pthread_mutex_destroy(&cc->nb_lock);
    memset(cc, 0, sizeof *cc);
}

/* ---- calls ---- */

typedef int (*coll_start_fn)(struct weft_coll *, const struct weft_coll_args *, weft_coll_tag_fn, uint32_t,
                             struct weft_coll_op **);
static const coll_start_fn starts[WEFT_COLL_KIND_END] = {
    [WEFT_COLL_ALLGATHER] = coll_allgather_start,
    [WEFT_COLL_BCAST] = coll_bcast_start,
    [WEFT_COLL_BARRIER] = coll_barrier_start,
    [WEFT_COLL_ALLREDUCE] = coll_allreduce_start,
    [WEFT_COLL_REDUCE_SCATTER] = coll_reduce_scatter_start,
    [WEFT_COLL_REDUCE] = coll_reduce_start,
    [WEFT_COLL_ALLTOALL] = coll_alltoall_start,
    [WEFT_COLL_GATHER] = coll_gather_start,
    [WEFT_COLL_SCATTER] = coll_scatter_start,
    [WEFT_COLL_ALLTOALLV] = coll_alltoallv_start,
    [WEFT_COLL_SPLIT_EXCHANGE] = coll_allgather_start,   /* its kind in the fingerprint */
};

int weft_coll_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                    struct weft_coll_op **op)
{
    *op = NULL;
    if (a->kind <= 0 || a->kind >= WEFT_COLL_KIND_END || starts[a->kind] == NULL)
        return weft_set_error(cc->core, WEFT_ERR_INTERNAL, "collectives: unknown kind %d", a->kind);
    if (tag == NULL) {
        tag = weft_tag_coll;
        if (cc->core->size == 1)
            seq = 0;   /* nothing travels */
        else {
            seq = coll_seq_next(cc);
            /* A non-blocking call that still holds this slot's lanes
             * finishes first (coll_nb.c). */
            int rc = coll_nb_slot_free(cc, seq);
            if (rc != WEFT_SUCCESS)
                return rc;
            coll_node_started(cc, a, seq);
        }
    }
    return starts[a->kind](cc, a, tag, seq, op);
}

/* alltoallv's arrays, copied into one allocation (prep->vec). */
static int coll_vec_copy(struct weft_coll *cc, const struct weft_coll_vec *v, struct weft_coll_prep *prep)
{
    size_t n = (size_t)cc->core->size, each = n * sizeof(size_t);
    struct weft_coll_vec *c = malloc(sizeof *c + 4 * each);
    if (c == NULL)
        return weft_set_error(cc->core, WEFT_ERR_NO_MEMORY,
                              "weft_alltoallv: no memory for a copy of the %zu-rank byte counts and displacements", n);
    size_t *p = (size_t *)(c + 1);
    memcpy(p, v->send_bytes, each);
    memcpy(p + n, v->send_displs, each);
    memcpy(p + 2 * n, v->recv_bytes, each);
    memcpy(p + 3 * n, v->recv_displs, each);
    c->send_bytes = p;
    c->send_displs = p + n;
    c->recv_bytes = p + 2 * n;
    c->recv_displs = p + 3 * n;
    prep->vec = c;
    return WEFT_SUCCESS;
}

/* Only the reductions take CUDA resources at their start (coll_reduce.c:
 * the kernels' module, staging, scratch); alltoallv needs a copy of its
 * arrays (the caller may reuse them once the call returned); the other
 * kinds need nothing. */
int weft_coll_prepare(struct weft_coll *cc, const struct weft_coll_args *a, struct weft_coll_prep *prep)
{
    struct weft_coll_args d;
    struct weft_coll_op *op = NULL;
    int rc;

    memset(prep, 0, sizeof *prep);
    if (a->kind == WEFT_COLL_ALLTOALLV)
        return a->vec ? coll_vec_copy(cc, a->vec, prep) : WEFT_SUCCESS;
    if (a->kind != WEFT_COLL_ALLREDUCE && a->kind != WEFT_COLL_REDUCE_SCATTER && a->kind != WEFT_COLL_REDUCE)
        return WEFT_SUCCESS;
    if (!cc->core->cuda)
        return WEFT_SUCCESS;
    d = *a;
    d.prep = prep;
    prep->dry = 1;
    /* A dry start never issues anything nor takes a lane number: tag and
     * seq are not looked at. */
    rc = starts[a->kind](cc, &d, weft_tag_coll, 0, &op);
    prep->dry = 0;
    if (op != NULL)   /* cannot happen: a dry start makes no op */
        rc = weft_set_error(cc->core, WEFT_ERR_INTERNAL, "collectives: a dry start made an op");
    if (rc != WEFT_SUCCESS)
        weft_coll_prep_release(cc, prep);
    return rc;
}

void weft_coll_prep_release(struct weft_coll *cc, struct weft_coll_prep *prep)
{
    if (prep == NULL)
        return;
    if (prep->stage)
        coll_stage_put(cc, prep->stage);
    if (prep->scratch)
        coll_scratch_put(cc, prep->scratch);
    free(prep->vec);
    prep->stage = NULL;
    prep->scratch = NULL;
    prep->vec = NULL;
}

void weft_coll_refused(struct weft_coll *cc, const char *fn)
{
    struct weft_error e;
    char text[1024];   /* a notice carries its first WEFT_WIRE_NOTICE_TEXT_MAX bytes */

    if (cc->core == NULL || cc->core->size == 1)
        return;   /* nothing travels, nothing to keep in step */
    uint32_t seq = coll_seq_next(cc);
    weft_error_get(cc->core, &e);
    snprintf(text, sizeof text, "rank %d refused its %s (collective #%u) on its own arguments: %s", cc->core->rank,
             fn, seq, e.text);
    if (cc->journal)
        weft_journal_refused(cc->journal, seq, fn);
    coll_node_refused(cc, seq);
    weft_p2p_coll_failed(cc->p2p, seq, WEFT_ERR_MISMATCH, text);
    /* A peer that made this call may have announced a large send to this
     * rank, which no receive here will ever take: the call's lanes refuse
     * it (the sender's request completes with the refusal), and one pass
     * answers what arrived already -- the caller may not call into weft
     * again for a while. What arrives later is answered at the next pass. */
    weft_p2p_refuse_call(cc->p2p, weft_tag_coll, seq, WEFT_TAG_COLL_PHASES, WEFT_ERR_MISMATCH);
    (void)weft_p2p_poll_health(cc->p2p);
    (void)weft_p2p_flush(cc->p2p, FAILURE_FLUSH_S);
}

static int coll_run(struct weft_coll *cc, const struct weft_coll_args *a)
{
    struct weft_coll_op *op;
    int handled;
    int rc = coll_node_run(cc, a, &handled);
    if (handled)
        return rc;
    rc = weft_coll_start(cc, a, NULL, 0, &op);
    return rc != WEFT_SUCCESS ? rc : weft_coll_op_wait(op);
}

int weft_coll_run(struct weft_coll *cc, const struct weft_coll_args *a)
{
    if (cc->journal == NULL)
        return coll_run(cc, a);
    /* The number this call takes (collectives on a comm are called one
     * at a time: no other call takes one meanwhile). */
    uint32_t seq = __atomic_load_n(&cc->seq, __ATOMIC_RELAXED);
    weft_journal_start(cc->journal, seq, a->kind, a->root, a->dtype, a->op, (uint64_t)a->count, 0);
    int rc = coll_run(cc, a);
    weft_journal_end(cc->journal, seq, rc);
    if (rc != WEFT_SUCCESS && cc->core->cfg.trace_dir[0])
        (void)weft_journal_write(cc, "error", 0);   /* the failing rank writes first */
    return rc;
}

int weft_coll_allgather(struct weft_coll *cc, const void *sendbuf, void *recvbuf, size_t bytes_per_rank)
{
    struct weft_coll_args a = { WEFT_COLL_ALLGATHER, sendbuf, recvbuf, bytes_per_rank, -1, -1, -1, NULL, NULL };
    return weft_coll_run(cc, &a);
}

int weft_coll_bcast(struct weft_coll *cc, void *buf, size_t bytes, int root)
{
    struct weft_coll_args a = { WEFT_COLL_BCAST, NULL, buf, bytes, -1, -1, root, NULL, NULL };
    return weft_coll_run(cc, &a);
}

int weft_coll_barrier(struct weft_coll *cc)
{
    struct weft_coll_args a = { WEFT_COLL_BARRIER, NULL, NULL, 0, -1, -1, -1, NULL, NULL };
    return weft_coll_run(cc, &a);
}

int weft_coll_allgather_start_tagged(struct weft_coll *cc, weft_coll_tag_fn tag, uint32_t seq,
                                     const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                                     struct weft_coll_op **op)
{
    struct weft_coll_args a = { WEFT_COLL_ALLGATHER, sendbuf, recvbuf, bytes_per_rank, -1, -1, -1, NULL, NULL };
    return weft_coll_start(cc, &a, tag, seq, op);
}
