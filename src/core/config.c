/*
 * WEFT_* environment variables -> struct weft_config.
 *
 * All parsing is strict: a value that does not parse is an error naming the
 * variable, never a silent default, so a typo in a job script shows at once.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "weft.h"

/* collectives/coll_impl.h enum weft_allgather_algo is in this order. */
const char *const weft_allgather_algo_names[] = { "auto", "ring", "rd", "bruck", "direct", "hier", NULL };


int weft_parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v, mult = 1;

    if (s == NULL || *s == '\0' || *s == '-')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    switch (tolower((unsigned char)*end)) {
    case '\0': break;
    case 'k': mult = 1ull << 10; end++; break;
    case 'm': mult = 1ull << 20; end++; break;
    case 'g': mult = 1ull << 30; end++; break;
    default: return -1;
    }
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0')
        return -1;
    if (v > (unsigned long long)SIZE_MAX / mult)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

int weft_parse_transports(const char *s)
{
    /* Names only: which exist is the transport registry's to say
     * (p2p/transport/registry.c), when the comm is created. */
    const char *p = s;
    if (s == NULL || *s == '\0')
        return -1;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n == 0)
            return -1;
        for (size_t i = 0; i < n; i++)
            if (!isalnum((unsigned char)p[i]) && p[i] != '_')
                return -1;
        p += n;
        if (*p == ',' && *++p == '\0')
            return -1;
    }
    return 0;
}

int weft_config_log_level_env(void)
{
    const char *v = getenv("WEFT_DEBUG");
    if (v == NULL)
        return WEFT_LOG_NONE;
    if (strcasecmp(v, "warn") == 0) return WEFT_LOG_WARN;
    if (strcasecmp(v, "info") == 0) return WEFT_LOG_INFO;
    if (strcasecmp(v, "trace") == 0) return WEFT_LOG_TRACE;
    return WEFT_LOG_NONE;
}

static const char *lookup_getenv(const char *name, void *ctx)
{
    (void)ctx;
    return getenv(name);
}

static int config_error(char *err, size_t errlen, const char *name, const char *value, const char *why)
{
    if (err && errlen)
        snprintf(err, errlen, "%s=%s: %s", name, value, why);
    return WEFT_ERR_INVALID_ARG;
}

/* Integer in [lo, hi]. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int weft_config_load(struct weft_config *cfg, weft_env_lookup_fn lookup, void *ctx,
                     char *err, size_t errlen)
{
    const char *v;
    long n;

    if (lookup == NULL)
        lookup = lookup_getenv;

    memset(cfg, 0, sizeof(*cfg));
    cfg->timeout_s        = 300.0;
    cfg->log_level        = WEFT_LOG_NONE;
    cfg->virtual_nodes    = 0;
    cfg->shm_cma          = 1;
    /* 4 KiB: above it a lone message is faster by single-copy CMA than by
     * two copies through the ring (docs/benchmarks.md). Collectives send
     * to many peers at once, where the handshake costs more than the copy,
     * so their lanes stay eager up to 32 KiB. */
    cfg->shm_eager_limit  = 4 << 10;
    cfg->shm_coll_eager   = 32 << 10;
    cfg->shm_ring_bytes   = 1 << 20;
    cfg->shm_chunk        = 64 << 10;
    cfg->shm_cma_min      = 0;
    cfg->tcp_streams      = 4;
    cfg->tcp_eager_limit  = 64 << 10;
    cfg->tcp_chunk        = 512 << 10;
    cfg->self_eager_limit = 64 << 10;
    cfg->spin_us          = 50;
    strcpy(cfg->ibverbs_lib, "libibverbs.so.1");
    cfg->ib_gid_index     = -1;
    cfg->ib_qps_per_peer  = 1;
    cfg->ib_timeout       = 20;
    cfg->ib_retry_cnt     = 7;
    cfg->ib_chunk         = 1 << 20;
    cfg->ib_eager_limit   = 8 << 10;
    cfg->ib_recv_depth    = 64;
    cfg->ib_sq_depth      = 128;
    cfg->ib_reg_cache     = (size_t)1 << 30;
    cfg->ib_gdr           = -1;
    strcpy(cfg->cuda_lib, "libcudart.so");
    /* Staged device transfers (p2p/stage.c): 1 MiB chunks, 4 in flight per
     * side. Per-chunk costs (a pipe message, a copy launch, an event) are a
     * few us, under 5% of a 1 MiB chunk at PCIe speed; larger chunks only
     * lengthen the pipeline's fill and drain (one chunk's D2H before the
     * network starts, one H2D after it ends) and pin more memory
     * (2 x slots x chunk per comm once used). docs/cuda.md has the numbers. */
    cfg->cuda_stage_chunk = 1 << 20;
    cfg->cuda_stage_slots = 4;
    cfg->cuda_ipc_cache   = 128;
    strcpy(cfg->allgather_algo, "auto");
    /* 1 MiB ring chunks: docs/benchmarks.md ("## Allgather"). */
    cfg->allgather_chunk  = 1 << 20;

    if ((v = lookup("WEFT_TIMEOUT", ctx)) != NULL) {
        char *end;
        double t;
        errno = 0;
        t = strtod(v, &end);
        if (errno != 0 || end == v || *end != '\0' || !(t >= 0.0) || t > 1e9)
            return config_error(err, errlen, "WEFT_TIMEOUT", v, "expected seconds >= 0 (0 = never)");
        cfg->timeout_s = t;
    }
    if ((v = lookup("WEFT_DEBUG", ctx)) != NULL) {
        if (*v == '\0' || strcasecmp(v, "none") == 0 || strcmp(v, "0") == 0)
            cfg->log_level = WEFT_LOG_NONE;
        else if (strcasecmp(v, "warn") == 0)
            cfg->log_level = WEFT_LOG_WARN;
        else if (strcasecmp(v, "info") == 0)
            cfg->log_level = WEFT_LOG_INFO;
        else if (strcasecmp(v, "trace") == 0)
            cfg->log_level = WEFT_LOG_TRACE;
        else
            return config_error(err, errlen, "WEFT_DEBUG", v, "expected none, warn, info or trace");
    }
    if ((v = lookup("WEFT_TRANSPORTS", ctx)) != NULL) {
        if (weft_parse_transports(v) != 0 || strlen(v) >= sizeof(cfg->transports))
            return config_error(err, errlen, "WEFT_TRANSPORTS", v,
                                "expected a comma-separated list of self, shm, tcp, ib");
        strcpy(cfg->transports, v);
    }
    if ((v = lookup("WEFT_VIRTUAL_NODES", ctx)) != NULL) {
        if (parse_int(v, 0, 1 << 20, &n) != 0)
            return config_error(err, errlen, "WEFT_VIRTUAL_NODES", v, "expected an integer >= 0");
        cfg->virtual_nodes = (int)n;
    }
    if ((v = lookup("WEFT_SHM_CMA", ctx)) != NULL) {
        if (parse_int(v, 0, 1, &n) != 0)
            return config_error(err, errlen, "WEFT_SHM_CMA", v, "expected 0 or 1");
        cfg->shm_cma = (int)n;
    }

    /* Sizes: name, field, lower bound, upper bound, unit multiplier of a plain number. */
    struct { const char *name; size_t *field; size_t lo, hi, unit; } sizes[] = {
        { "WEFT_SHM_EAGER",      &cfg->shm_eager_limit,  0,         1u << 20,      1 },
        { "WEFT_SHM_COLL_EAGER", &cfg->shm_coll_eager,   0,         1u << 20,      1 },
        { "WEFT_SHM_RING_KB",    &cfg->shm_ring_bytes,   64 << 10,  (size_t)1 << 30, 1024 },
        { "WEFT_SHM_CHUNK_KB",   &cfg->shm_chunk,        4 << 10,   64u << 20,     1024 },
        { "WEFT_SHM_CMA_MIN_KB", &cfg->shm_cma_min,      0,         SIZE_MAX,      1024 },
        { "WEFT_TCP_EAGER",      &cfg->tcp_eager_limit,  0,         4u << 20,      1 },
        { "WEFT_TCP_CHUNK_KB",   &cfg->tcp_chunk,        4 << 10,   (size_t)1 << 30, 1024 },
        { "WEFT_SELF_EAGER",     &cfg->self_eager_limit, 0,         64u << 20,     1 },
        { "WEFT_IB_CHUNK",       &cfg->ib_chunk,         4 << 10,   (size_t)1 << 30, 1 },
        { "WEFT_IB_EAGER",       &cfg->ib_eager_limit,   64,         1u << 20,      1 },
        { "WEFT_IB_REG_CACHE_MB",&cfg->ib_reg_cache,     0,         SIZE_MAX,      1u << 20 },
        { "WEFT_CUDA_STAGE_CHUNK",&cfg->cuda_stage_chunk, 4 << 10,  (size_t)1 << 30, 1 },
        { "WEFT_ALLGATHER_CHUNK_KB",&cfg->allgather_chunk, 1 << 10, SIZE_MAX,     1024 },
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t s;
        if ((v = lookup(sizes[i].name, ctx)) == NULL)
            continue;
        if (weft_parse_size(v, &s) != 0)
            return config_error(err, errlen, sizes[i].name, v, "expected a size (suffix k, m or g allowed)");
        /* A plain number is in the variable's unit (KB for *_KB); a suffix is absolute. */
        if (isdigit((unsigned char)v[strlen(v) - 1])) {
            if (s > SIZE_MAX / sizes[i].unit)
                return config_error(err, errlen, sizes[i].name, v, "too large");
            s *= sizes[i].unit;
        }
        if (s < sizes[i].lo || s > sizes[i].hi) {
            char why[128];
            snprintf(why, sizeof(why), "out of range [%zu, %zu] bytes", sizes[i].lo, sizes[i].hi);
            return config_error(err, errlen, sizes[i].name, v, why);
        }
        *sizes[i].field = s;
    }
    /* An eager message must fit a ring record with room to spare. */
    if (cfg->shm_eager_limit + 256 > cfg->shm_ring_bytes / 4)
        return config_error(err, errlen, "WEFT_SHM_EAGER", lookup("WEFT_SHM_EAGER", ctx) ? lookup("WEFT_SHM_EAGER", ctx) : "default",
                            "must be below a quarter of the ring (WEFT_SHM_RING_KB)");
    if (cfg->shm_coll_eager + 256 > cfg->shm_ring_bytes / 4) {
        /* A value the user set must fit; the default shrinks with the ring. */
        if ((v = lookup("WEFT_SHM_COLL_EAGER", ctx)) != NULL)
            return config_error(err, errlen, "WEFT_SHM_COLL_EAGER", v,
                                "must be below a quarter of the ring (WEFT_SHM_RING_KB)");
        cfg->shm_coll_eager = cfg->shm_ring_bytes / 4 - 256;
    }
    if (cfg->shm_chunk + 256 > cfg->shm_ring_bytes / 2)
        cfg->shm_chunk = cfg->shm_ring_bytes / 4;

    if ((v = lookup("WEFT_IB_GDR", ctx)) != NULL) {
        if (strcasecmp(v, "auto") == 0)
            cfg->ib_gdr = -1;
        else if (parse_int(v, 0, 1, &n) == 0)
            cfg->ib_gdr = (int)n;
        else
            return config_error(err, errlen, "WEFT_IB_GDR", v, "expected auto, 0 or 1");
    }
    if ((v = lookup("WEFT_TCP_STREAMS", ctx)) != NULL) {
        if (parse_int(v, 1, 64, &n) != 0)
            return config_error(err, errlen, "WEFT_TCP_STREAMS", v, "expected an integer in [1, 64]");
        cfg->tcp_streams = (int)n;
    }
    if ((v = lookup("WEFT_TCP_IF", ctx)) != NULL) {
        if (strlen(v) >= sizeof(cfg->tcp_if))
            return config_error(err, errlen, "WEFT_TCP_IF", v, "name too long");
        strcpy(cfg->tcp_if, v);
    }
    /* Strings. */
    struct { const char *name; char *field; size_t size; } strs[] = {
        { "WEFT_IBVERBS_LIB", cfg->ibverbs_lib, sizeof(cfg->ibverbs_lib) },
        { "WEFT_IB_HCA",      cfg->ib_hca,      sizeof(cfg->ib_hca) },
        { "WEFT_TOPO_XML",    cfg->topo_xml,    sizeof(cfg->topo_xml) },
        { "WEFT_CUDA_LIB",    cfg->cuda_lib,    sizeof(cfg->cuda_lib) },
    };
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
        if ((v = lookup(strs[i].name, ctx)) == NULL)
            continue;
        if (strlen(v) >= strs[i].size)
            return config_error(err, errlen, strs[i].name, v, "too long");
        strcpy(strs[i].field, v);
    }
    /* Integers: name, field, bounds. */
    struct { const char *name; int *field; long lo, hi; const char *why; } ints[] = {
        { "WEFT_IB_GID_INDEX",    &cfg->ib_gid_index,    -1, 255,   "expected -1 (auto) or a GID index in [0, 255]" },
        { "WEFT_IB_QPS_PER_PEER", &cfg->ib_qps_per_peer,  1, 16,    "expected an integer in [1, 16]" },
        { "WEFT_IB_TIMEOUT",      &cfg->ib_timeout,       1, 31,    "expected an exponent in [1, 31]" },
        { "WEFT_IB_RETRY_CNT",    &cfg->ib_retry_cnt,     0, 7,     "expected an integer in [0, 7]" },
        { "WEFT_IB_RECV_DEPTH",   &cfg->ib_recv_depth,    2, 4096,  "expected an integer in [2, 4096]" },
        { "WEFT_IB_SQ_DEPTH",     &cfg->ib_sq_depth,      2, 16384, "expected an integer in [2, 16384]" },
        { "WEFT_CUDA_STAGE_SLOTS",&cfg->cuda_stage_slots, 1, 64,    "expected an integer in [1, 64]" },
        { "WEFT_CUDA_IPC_CACHE",  &cfg->cuda_ipc_cache,   1, 1 << 20, "expected a number of mappings in [1, 1048576]" },
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        if ((v = lookup(ints[i].name, ctx)) == NULL)
            continue;
        if (parse_int(v, ints[i].lo, ints[i].hi, &n) != 0)
            return config_error(err, errlen, ints[i].name, v, ints[i].why);
        *ints[i].field = (int)n;
    }
    if ((v = lookup("WEFT_ALLGATHER_ALGO", ctx)) != NULL) {
        /* Exact names, as the collectives compare them; "" means auto. */
        size_t i;
        for (i = 0; weft_allgather_algo_names[i] && strcmp(v, weft_allgather_algo_names[i]) != 0; i++) {}
        if (*v != '\0' && weft_allgather_algo_names[i] == NULL)
            return config_error(err, errlen, "WEFT_ALLGATHER_ALGO", v,
                                "expected auto, ring, rd, bruck, direct or hier");
        strcpy(cfg->allgather_algo, *v ? v : "auto");
    }
    if ((v = lookup("WEFT_SPIN_US", ctx)) != NULL) {
        if (parse_int(v, 0, 10000000, &n) != 0)
            return config_error(err, errlen, "WEFT_SPIN_US", v, "expected microseconds >= 0");
        cfg->spin_us = (int)n;
    }
    return WEFT_SUCCESS;
}
