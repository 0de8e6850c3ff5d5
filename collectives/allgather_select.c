/*
 * weft_coll_allgather and its start forms: the algorithm selector,
 * WEFT_ALLGATHER_ALGO forcing (read at weft_comm_create, cc->ag_algo), and
 * the once-per-shape info log. Argument checks are src/api/'s (check.c).
 *
 * The thresholds below come from the measurements in docs/benchmarks.md
 * ("## Allgather"): keep the two in step when retuning.
 */
#include <stdint.h>
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

int weft_allgather_algo_parse(const char *s)
{
    if (!s || !*s)
        return WEFT_AG_AUTO;
    for (int a = 0; a < WEFT_AG_COUNT && weft_allgather_algo_names[a]; a++)
        if (strcmp(s, weft_allgather_algo_names[a]) == 0)
            return a;
    return -1;
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

/* Logs the choice for a new bytes-per-rank value once (WEFT_DEBUG=info). */
static void log_shape_once(struct weft_coll *cc, size_t bytes, int algo, int forced)
{
    int fresh = 0;
    if (weft_log_level() < WEFT_LOG_INFO)
        return;
    pthread_mutex_lock(&cc->shapes_lock);
    size_t i;
    for (i = 0; i < cc->nshapes; i++)
        if (cc->shapes[i].bytes == bytes && cc->shapes[i].algo == algo)
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
            cc->shapes[cc->nshapes].bytes = bytes;
            cc->shapes[cc->nshapes].algo = algo;
            cc->nshapes++;
            fresh = 1;
        }
    }
    pthread_mutex_unlock(&cc->shapes_lock);
    if (fresh)
        WEFT_INFO(cc->core->rank, "allgather %zu B per rank x %d ranks (%d nodes): %s (%s)",
                  bytes, cc->core->size, cc->nnodes, weft_allgather_algo_name(algo),
                  forced ? "forced by WEFT_ALLGATHER_ALGO" : "selector");
}

/* seq NULL: the call takes the next value of cc->seq (also when it moves
 * nothing, except on one rank). */
static int allgather_start(struct weft_coll *cc, weft_coll_tag_fn tag, const uint32_t *seq, const void *sendbuf,
                           void *recvbuf, size_t bytes_per_rank, struct weft_coll_op **op)
{
    int n = cc->core->size, me = cc->core->rank;
    *op = NULL;
    if (bytes_per_rank == 0) {
        /* Nothing moves, but the call still takes its number: a rank that
         * passed 0 where the others did not stays in step with them for the
         * calls that follow (their call fails, later ones match again). */
        if (seq == NULL && n > 1)
            (void)coll_seq_next(cc);
        return WEFT_SUCCESS;
    }

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
    log_shape_once(cc, bytes_per_rank, algo, forced);
    return coll_allgather_op(cc, algo, tag, seq ? *seq : coll_seq_next(cc), sendbuf, recvbuf, bytes_per_rank, op);
}

int weft_coll_allgather_start(struct weft_coll *cc, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                              struct weft_coll_op **op)
{
    return allgather_start(cc, weft_tag_coll, NULL, sendbuf, recvbuf, bytes_per_rank, op);
}

int weft_coll_allgather_start_tagged(struct weft_coll *cc, weft_coll_tag_fn tag, uint32_t seq,
                                     const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                                     struct weft_coll_op **op)
{
    return allgather_start(cc, tag, &seq, sendbuf, recvbuf, bytes_per_rank, op);
}

int weft_coll_allgather(struct weft_coll *cc, const void *sendbuf, void *recvbuf, size_t bytes_per_rank)
{
    struct weft_coll_op *op;
    int rc = weft_coll_allgather_start(cc, sendbuf, recvbuf, bytes_per_rank, &op);
    return rc != WEFT_SUCCESS ? rc : weft_coll_op_wait(op);
}
