/*
 * weft_coll_allgather and its start forms: the algorithm selector,
 * WEFT_ALLGATHER_ALGO forcing (read at weft_comm_create, cc->ag_algo), and
 * the once-per-shape info log. Argument checks are src/api/'s (check.c).
 *
 * The thresholds below come from the measurements in docs/benchmarks.md
 * ("## Allgather"): keep the two in step when retuning.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "coll_impl.h"
#include "config.h"
#include "core.h"
#include "devcopy.h"
#include "log.h"
#include "tags.h"
#include "weft.h"

/* Up to this many bytes in total (bytes_per_rank * size) latency dominates:
 * log-step algorithms (rd, Bruck) need log2(n) messages instead of n-1. */
#define WEFT_AG_TINY_TOTAL    (8u * 1024u)
/* Blocks below this go through the transports' eager path (shm rings,
 * 32 KiB limit): each message is copied twice, so sending fewer, larger
 * messages (rd) or keeping one message per link at a time (ring) beats
 * direct, whose n-1 concurrent eager sends crowd every ring at once. From
 * here up messages are rendezvous (receiver pulls, one copy) and direct lets
 * every receiver copy at once with no chain of dependencies. */
#define WEFT_AG_EAGER_BLOCK   (64u * 1024u)
/* The ring chunk is WEFT_ALLGATHER_CHUNK_KB (default 1 MiB, set in
 * src/core/config.c; tuning only). */

/* The names are WEFT_ALLGATHER_ALGO's list (src/core/config.c), in the
 * order of enum weft_allgather_algo. */
const char *weft_allgather_algo_name(int algo)
{
    return (algo >= 0 && algo < WEFT_AG_COUNT) ? weft_allgather_algo_names[algo] : "?";
}

static int is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

int weft_allgather_algo_applies(int algo, int size, const char **why)
{
    if (algo == WEFT_AG_RD && !is_pow2(size)) {
        *why = "recursive doubling needs a power-of-two number of ranks";
        return 0;
    }
    return 1;
}

int weft_allgather_select(int size, int nnodes, size_t bytes)
{
    /* Overflow-safe "bytes * size <= TINY". */
    if (bytes <= WEFT_AG_TINY_TOTAL / (size_t)size)
        return is_pow2(size) ? WEFT_AG_RD : WEFT_AG_BRUCK;
    if (nnodes > 1)
        return WEFT_AG_HIER;
    if (bytes < WEFT_AG_EAGER_BLOCK)
        return is_pow2(size) ? WEFT_AG_RD : WEFT_AG_RING;
    return WEFT_AG_DIRECT;
}

size_t coll_ring_chunk(const struct weft_coll *cc)
{
    size_t v = cc->core->cfg.allgather_chunk;
    return v > 0 ? v : 1024u * 1024u;
}

/* The call's start (see coll_impl.h). */
int coll_allgather_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                         struct weft_coll_op **op)
{
    int n = cc->core->size, me = cc->core->rank;
    size_t bytes_per_rank = a->count;
    const void *sendbuf = a->sendbuf;
    void *recvbuf = a->recvbuf;
    *op = NULL;
    if (bytes_per_rank == 0)
        return WEFT_SUCCESS;

    const char *sb = sendbuf, *mine = (const char *)recvbuf + (size_t)me * bytes_per_rank;
    int algo = cc->ag_algo;
    int forced = algo != WEFT_AG_AUTO;

    if (n == 1) {
        if (sb != mine)
            return weft_devcopy(cc->core, recvbuf, sendbuf, bytes_per_rank, "weft_allgather");
        return WEFT_SUCCESS;
    }

    if (forced) {
        const char *why = NULL;
        if (!weft_allgather_algo_applies(algo, n, &why))
            return weft_set_error(cc->core, WEFT_ERR_INVALID_ARG,
                                  "weft_allgather: WEFT_ALLGATHER_ALGO=%s cannot run on %d ranks: %s",
                                  cc->core->cfg.allgather_algo, n, why);
    } else {
        algo = weft_allgather_select(n, cc->nnodes, bytes_per_rank);
    }
    if (weft_log_level() >= WEFT_LOG_INFO) {
        char what[64];
        snprintf(what, sizeof what, "allgather %zu B per rank", bytes_per_rank);
        coll_log_shape_once(cc, WEFT_COLL_ALLGATHER, bytes_per_rank, algo, what, weft_allgather_algo_name(algo),
                            forced);
    }
    return coll_allgather_op(cc, a->kind, algo, tag, seq, sendbuf, recvbuf, bytes_per_rank, op);
}
