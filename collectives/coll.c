/*
 * Collectives: the per-comm context (node layout, the configured
 * algorithm, shapes already logged) and the sequence numbers of calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "coll_impl.h"
#include "config.h"
#include "core.h"
#include "log.h"
#include "weft.h"

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
    pthread_mutex_init(&cc->shapes_lock, NULL);
    cc->ag_algo = weft_allgather_algo_parse(core->cfg.allgather_algo);
    if (cc->ag_algo < 0)   /* src/core/config.c accepts only the same names */
        return weft_set_error(core, WEFT_ERR_INVALID_ARG,
                              "weft_allgather: WEFT_ALLGATHER_ALGO=%s is not one of ring|rd|bruck|direct|hier",
                              core->cfg.allgather_algo);
    if (coll_topo_build(cc, node) != 0)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "collectives: no memory for the node layout of %d ranks",
                              core->size);
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
    pthread_mutex_destroy(&cc->shapes_lock);
    memset(cc, 0, sizeof *cc);
}
