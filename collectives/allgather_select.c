/*
 * weft_allgather: argument checks, the algorithm selector, WEFT_ALLGATHER_ALGO
 * forcing, and the once-per-shape info log.
 *
 * The thresholds below come from the measurements in docs/benchmarks.md
 * ("## Allgather"): keep the two in step when retuning.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "coll.h"
#include "coll_state.h"
#include "comm.h"
#include "devcopy.h"
#include "log.h"

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
/* Default ring chunk; WEFT_ALLGATHER_CHUNK_KB overrides it (tuning only). */
#define WEFT_AG_RING_CHUNK    (1024u * 1024u)

static const char *const algo_names[WEFT_AG_COUNT] = {
    [WEFT_AG_AUTO] = "auto", [WEFT_AG_RING] = "ring", [WEFT_AG_RD] = "rd",
    [WEFT_AG_BRUCK] = "bruck", [WEFT_AG_DIRECT] = "direct", [WEFT_AG_HIER] = "hier",
};

const char *weft_allgather_algo_name(int algo)
{
    return (algo >= 0 && algo < WEFT_AG_COUNT) ? algo_names[algo] : "?";
}

int weft_allgather_algo_parse(const char *s)
{
    if (!s || !*s)
        return WEFT_AG_AUTO;
    for (int a = 0; a < WEFT_AG_COUNT; a++)
        if (strcmp(s, algo_names[a]) == 0)
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

size_t coll_ring_chunk(void)
{
    /* Read once; a racing first read computes the same value. */
    static size_t chunk;
    size_t v = __atomic_load_n(&chunk, __ATOMIC_RELAXED);
    if (v == 0) {
        const char *e = getenv("WEFT_ALLGATHER_CHUNK_KB");
        long kb = e ? strtol(e, NULL, 10) : 0;
        v = kb > 0 ? (size_t)kb * 1024u : WEFT_AG_RING_CHUNK;
        __atomic_store_n(&chunk, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* Logs the choice for a new bytes-per-rank value once (WEFT_DEBUG=info). */
static void log_shape_once(struct weft_comm *c, size_t bytes, int algo, int forced)
{
    if (weft_log_level() < WEFT_LOG_INFO)
        return;
    struct coll_state *s = coll_state_get(c);
    if (!s)
        return;
    for (size_t i = 0; i < s->nshapes; i++)
        if (s->shapes[i].bytes == bytes && s->shapes[i].algo == algo)
            return;
    if (s->nshapes == s->cap_shapes) {
        size_t cap = s->cap_shapes ? 2 * s->cap_shapes : 16;
        struct coll_shape *p = realloc(s->shapes, cap * sizeof *p);
        if (!p)
            return;   /* only the log line is lost */
        s->shapes = p;
        s->cap_shapes = cap;
    }
    s->shapes[s->nshapes].bytes = bytes;
    s->shapes[s->nshapes].algo = algo;
    s->nshapes++;
    WEFT_INFO(c->rank, "allgather %zu B per rank x %d ranks (%d nodes): %s (%s)",
              bytes, c->size, coll_topo_get(c) ? coll_topo_get(c)->nnodes : c->num_nodes,
              weft_allgather_algo_name(algo), forced ? "forced by WEFT_ALLGATHER_ALGO" : "selector");
}

int weft_allgather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank)
{
    if (!c)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_allgather: comm is NULL");
    int n = c->size, me = c->rank;
    if (bytes_per_rank > 0 && !sendbuf)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                              "weft_allgather: sendbuf is NULL with bytes_per_rank %zu", bytes_per_rank);
    if (bytes_per_rank > 0 && !recvbuf)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                              "weft_allgather: recvbuf is NULL with bytes_per_rank %zu", bytes_per_rank);
    if (bytes_per_rank > SIZE_MAX / (size_t)n)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                              "weft_allgather: bytes_per_rank %zu x %d ranks overflows size_t",
                              bytes_per_rank, n);
    if (bytes_per_rank == 0)
        return WEFT_SUCCESS;   /* nothing moves; every rank passes the same 0 */

    size_t total = bytes_per_rank * (size_t)n;
    const char *sb = sendbuf, *rb = recvbuf, *mine = rb + (size_t)me * bytes_per_rank;
    /* Compared as integers: the buffers may be unrelated objects. */
    uintptr_t s0 = (uintptr_t)sb, r0 = (uintptr_t)rb;
    if (sb != mine && s0 < r0 + total && r0 < s0 + bytes_per_rank)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                              "weft_allgather: sendbuf overlaps recvbuf but is not recvbuf + rank*bytes_per_rank "
                              "(the in-place form)");

    const char *env = getenv("WEFT_ALLGATHER_ALGO");
    int algo = weft_allgather_algo_parse(env);
    if (algo < 0)
        return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                              "weft_allgather: WEFT_ALLGATHER_ALGO=%s is not one of ring|rd|bruck|direct|hier", env);
    int forced = algo != WEFT_AG_AUTO;

    if (n == 1) {
        if (sb != mine)
            return weft_devcopy(c, recvbuf, sendbuf, bytes_per_rank, "weft_allgather");
        return WEFT_SUCCESS;
    }

    if (forced) {
        const char *why = NULL;
        if (!weft_allgather_algo_applies(algo, n, &why))
            return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                                  "weft_allgather: WEFT_ALLGATHER_ALGO=%s cannot run on %d ranks: %s",
                                  env, n, why);
    } else {
        const struct coll_topo *t = coll_topo_get(c);
        if (!t)
            return WEFT_ERR_NO_MEMORY;
        algo = weft_allgather_select(n, t->nnodes, bytes_per_rank);
    }
    log_shape_once(c, bytes_per_rank, algo, forced);

    switch (algo) {
    case WEFT_AG_RING:   return weft_allgather_ring(c, sendbuf, recvbuf, bytes_per_rank);
    case WEFT_AG_RD:     return weft_allgather_rd(c, sendbuf, recvbuf, bytes_per_rank);
    case WEFT_AG_BRUCK:  return weft_allgather_bruck(c, sendbuf, recvbuf, bytes_per_rank);
    case WEFT_AG_DIRECT: return weft_allgather_direct(c, sendbuf, recvbuf, bytes_per_rank);
    case WEFT_AG_HIER:   return weft_allgather_hier(c, sendbuf, recvbuf, bytes_per_rank);
    default:
        return weft_set_error(c, WEFT_ERR_INTERNAL, "weft_allgather: selector returned algorithm %d", algo);
    }
}
