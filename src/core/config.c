/*
 * WEFT_* environment variables -> struct weft_config.
 *
 * Parsing is strict, and every variable goes through the same few helpers
 * below (strict_long, strict_size, strict_seconds, strict_name,
 * strict_string), so one kind of value follows one set of rules
 * (docs/configuration.md, "Values"):
 *  - the value is the number or name and nothing else: no leading or
 *    trailing space, no '+', no hexadecimal, no exponent;
 *  - a value out of range is refused, never clamped, and 0 is refused
 *    where it would mean nothing;
 *  - an empty value is refused except where it is documented to mean the
 *    default (WEFT_DEBUG, and the names and paths whose default is unset).
 * A value that does not pass is an error naming the variable, never a silent
 * default, so a typo in a job script shows at once:
 * "WEFT_X=value: why (expected ...)".
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "weft.h"

/* collectives/coll_impl.h: each enum weft_*_algo is in the order of its list. */
const char *const weft_allgather_algo_names[] = { "auto", "ring", "rd", "bruck", "direct", "hier", NULL };
const char *const weft_allreduce_algo_names[] = { "auto", "ring", "rd", "rabenseifner", "hier", NULL };
const char *const weft_reduce_scatter_algo_names[] = { "auto", "ring", "halving", NULL };
const char *const weft_reduce_algo_names[] = { "auto", "binomial", "ring", NULL };
const char *const weft_alltoall_algo_names[] = { "auto", "pairwise", "bruck", NULL };
const char *const weft_threads_names[] = { "multiple", "serialized", NULL };

/* WEFT_DEBUG names, indexed by enum weft_log_level. */
static const char *const log_level_names[] = { "none", "warn", "info", "trace", NULL };

/* ------------------------------------------------------------ helpers */

/* The problems every kind of value shares; NULL if none. */
static const char *blank_problem(const char *v)
{
    size_t n = strlen(v);
    if (n == 0)
        return "empty";
    if (isspace((unsigned char)v[0]) || isspace((unsigned char)v[n - 1]))
        return "leading or trailing space";
    return NULL;
}

/* "0x10" would read as 0 followed by junk; say what it is instead. */
static int looks_hex(const char *v)
{
    if (*v == '-')
        v++;
    return v[0] == '0' && (v[1] == 'x' || v[1] == 'X');
}

static int all_digits(const char *s)
{
    if (*s == '\0')
        return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return 0;
    return 1;
}

/* Decimal integer in [lo, hi]: digits, with one leading '-' only for a
 * negative value. NULL on success, else why not. */
static const char *strict_long(const char *v, long lo, long hi, long *out)
{
    const char *why = blank_problem(v);
    long n;
    if (why)
        return why;
    if (looks_hex(v))
        return "hexadecimal is not accepted";
    if (!all_digits(v + (*v == '-')))
        return "not an integer";
    errno = 0;
    n = strtol(v, NULL, 10);
    if (errno == ERANGE)
        return *v == '-' ? "below the minimum" : "above the maximum";
    if (n > hi)
        return "above the maximum";
    if (n < lo)
        return n == 0 ? "0 is not allowed here" : "below the minimum";
    *out = n;
    return NULL;
}

int weft_parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v, mult = 1;

    /* A digit first: strtoull alone would take " 5", "+5" and "-5". */
    if (s == NULL || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': mult = 1ull << 10; end++; break;
    case 'm': case 'M': mult = 1ull << 20; end++; break;
    case 'g': case 'G': mult = 1ull << 30; end++; break;
    default: return -1;
    }
    if (mult > 1 && (*end == 'b' || *end == 'B'))
        end++;
    if (*end != '\0')
        return -1;
    if (v > (unsigned long long)SIZE_MAX / mult)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

/* "64k" for a multiple of 1 KiB, else the plain number of bytes. */
static void format_size(size_t v, char *buf, size_t len)
{
    if (v != 0 && v % ((size_t)1 << 30) == 0)
        snprintf(buf, len, "%zug", v >> 30);
    else if (v != 0 && v % ((size_t)1 << 20) == 0)
        snprintf(buf, len, "%zum", v >> 20);
    else if (v != 0 && v % ((size_t)1 << 10) == 0)
        snprintf(buf, len, "%zuk", v >> 10);
    else
        snprintf(buf, len, "%zu", v);
}

/* A size: a plain number is in the variable's unit (bytes, KiB for *_KB, MiB
 * for *_MB), a k/m/g suffix is absolute. Within [lo, hi] bytes. */
static const char *strict_size(const char *v, size_t unit, size_t lo, size_t hi, size_t *out)
{
    const char *why = blank_problem(v);
    size_t s;
    if (why)
        return why;
    if (looks_hex(v))
        return "hexadecimal is not accepted";
    if (weft_parse_size(v, &s) != 0)
        return all_digits(v) ? "above the maximum" : "not a size";
    if (isdigit((unsigned char)v[strlen(v) - 1])) {
        if (s > SIZE_MAX / unit)
            return "above the maximum";
        s *= unit;
    }
    if (s > hi)
        return "above the maximum";
    if (s < lo)
        return s == 0 ? "0 is not allowed here" : "below the minimum";
    *out = s;
    return NULL;
}

/* What strict_size accepts, in words, for the message. */
static void size_expected(size_t unit, size_t lo, size_t hi, char *buf, size_t len)
{
    char l[32], h[32];
    const char *u = unit == 1 ? "bytes" : unit == 1024 ? "KiB" : "MiB";
    format_size(lo, l, sizeof(l));
    format_size(hi, h, sizeof(h));
    if (hi == SIZE_MAX && lo == 0)
        snprintf(buf, len, "a size: a number of %s, or one with suffix k, m or g", u);
    else if (hi == SIZE_MAX)
        snprintf(buf, len, "a size of at least %s: a number of %s, or one with suffix k, m or g", l, u);
    else
        snprintf(buf, len, "a size from %s to %s: a number of %s, or one with suffix k, m or g", l, h, u);
}

/* Seconds: digits with an optional decimal fraction ("2", "0.5"), at most
 * hi. Parsed here rather than by strtod, which also takes hex, exponents,
 * "inf", leading space, and depends on the locale's decimal point. */
static const char *strict_seconds(const char *v, double hi, double *out)
{
    const char *why = blank_problem(v);
    const char *p = v;
    double t = 0.0, scale = 0.1;
    if (why)
        return why;
    if (looks_hex(v))
        return "hexadecimal is not accepted";
    if (!isdigit((unsigned char)*p))
        return "not a number of seconds";
    for (; isdigit((unsigned char)*p); p++)
        t = t * 10.0 + (*p - '0');
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return "not a number of seconds";
        for (; isdigit((unsigned char)*p); p++, scale /= 10.0)
            t += (*p - '0') * scale;
    }
    if (*p != '\0')
        return "not a number of seconds";
    if (t > hi)
        return "above the maximum";
    *out = t;
    return NULL;
}

/* One of names (case-insensitive); *index is its position. */
static const char *strict_name(const char *v, const char *const *names, int *index)
{
    const char *why = blank_problem(v);
    if (why)
        return why;
    for (int i = 0; names[i]; i++)
        if (strcasecmp(v, names[i]) == 0) {
            *index = i;
            return NULL;
        }
    return "unknown name";
}

/* "a, b or c" */
static void names_expected(const char *const *names, char *buf, size_t len)
{
    size_t n = 0, used = 0;
    while (names[n])
        n++;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i == 0 ? "" : i + 1 == n ? " or " : ", ", names[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

/* A name or path copied into a field of cap bytes. empty_ok: "" means the
 * default (the field stays ""). inner_space_ok: paths may hold spaces,
 * interface and device names cannot. */
static const char *strict_string(const char *v, size_t cap, int empty_ok, int inner_space_ok)
{
    const char *why;
    if (*v == '\0')
        return empty_ok ? NULL : "empty";
    if ((why = blank_problem(v)) != NULL)
        return why;
    for (const char *p = v; *p; p++) {
        if (iscntrl((unsigned char)*p))
            return "contains a control character";
        if (!inner_space_ok && isspace((unsigned char)*p))
            return "contains a space";
    }
    if (strlen(v) >= cap)
        return "too long";
    return NULL;
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

/* WEFT_IB_HCA: "device[:port],..."; device names as the kernel gives them
 * (letters, digits, '_', '-', '.'), ports 1 .. 255. */
static int parse_hca_list(const char *s)
{
    const char *p = s;
    while (*p) {
        size_t n = strcspn(p, ","), name = strcspn(p, ",:");
        if (name == 0)
            return -1;
        for (size_t i = 0; i < name; i++)
            if (!isalnum((unsigned char)p[i]) && p[i] != '_' && p[i] != '-' && p[i] != '.')
                return -1;
        if (name < n) {
            char port[8];
            long v;
            size_t pl = n - name - 1;
            if (pl == 0 || pl >= sizeof(port))
                return -1;
            memcpy(port, p + name + 1, pl);
            port[pl] = '\0';
            if (strict_long(port, 1, 255, &v) != NULL)
                return -1;
        }
        p += n;
        if (*p == ',' && *++p == '\0')
            return -1;
    }
    return 0;
}

/* WEFT_DEBUG: a level name, "0" or "" (none). -1 if neither. */
static int parse_log_level(const char *v)
{
    int level;
    if (*v == '\0' || strcmp(v, "0") == 0)
        return WEFT_LOG_NONE;
    return strict_name(v, log_level_names, &level) == NULL ? level : -1;
}

int weft_config_log_level(const struct weft_settings *settings)
{
    const char *v = weft_settings_lookup("WEFT_DEBUG", (void *)settings);
    int level = v ? parse_log_level(v) : WEFT_LOG_WARN;
    /* A value create will refuse still logs that refusal: at warn. */
    return level >= 0 ? level : WEFT_LOG_WARN;
}

int weft_config_log_level_env(void)
{
    return weft_config_log_level(NULL);
}

static const char *lookup_getenv(const char *name, void *ctx)
{
    (void)ctx;
    return getenv(name);
}

/* "WEFT_X=value: why (expected ...)"; the value quoted when it is empty or
 * has spaces, which would not show otherwise. */
static int refuse(char *err, size_t errlen, const char *name, const char *value, const char *why,
                  const char *expected)
{
    if (err && errlen) {
        int quote = *value == '\0' || strpbrk(value, " \t\r\n\v\f") != NULL;
        snprintf(err, errlen, "%s=%s%s%s: %s (expected %s)", name, quote ? "\"" : "", value,
                 quote ? "\"" : "", why, expected);
    }
    return WEFT_ERR_INVALID_ARG;
}

/* ------------------------------------------------------------ the variables */

/* The tables weft_config_load reads with and weft_config_format writes
 * with (one list: a value is shown as it was read). */
#define F(field) offsetof(struct weft_config, field)

/* Integers: name, field, bounds, what is expected when the bounds alone
 * do not say it (NULL: "an integer in [lo, hi]"). */
static const struct { const char *name; size_t off; long lo, hi; const char *expected; } ints[] = {
    { "WEFT_VIRTUAL_NODES",   F(virtual_nodes),    0, 1 << 20,  "an integer in [0, 1048576], 0 = off" },
    { "WEFT_SHM_CMA",         F(shm_cma),          0, 1,        "0 or 1" },
    { "WEFT_SHM_STREAM",      F(shm_stream),       0, 1,        "0 or 1" },
    { "WEFT_TCP_STREAMS",     F(tcp_streams),      1, 64,       NULL },
    { "WEFT_SPIN_US",         F(spin_us),          0, 10000000, "microseconds in [0, 10000000]" },
    { "WEFT_PROGRESS_THREAD", F(progress_thread),  0, 1,        "0 or 1" },
    { "WEFT_IB_GID_INDEX",    F(ib_gid_index),    -1, 255,      "-1 (auto) or a GID index in [0, 255]" },
    { "WEFT_IB_QPS_PER_PEER", F(ib_qps_per_peer),  1, 16,       NULL },
    { "WEFT_IB_TIMEOUT",      F(ib_timeout),       1, 31,       "an exponent in [1, 31]" },
    { "WEFT_IB_RETRY_CNT",    F(ib_retry_cnt),     0, 7,        NULL },
    { "WEFT_IB_RECV_DEPTH",   F(ib_recv_depth),    2, 4096,     NULL },
    { "WEFT_IB_SQ_DEPTH",     F(ib_sq_depth),      2, 16384,    NULL },
    { "WEFT_CUDA_STAGE_SLOTS",F(cuda_stage_slots), 1, 64,       NULL },
    { "WEFT_CUDA_IPC_CACHE",  F(cuda_ipc_cache),   1, 1 << 20,  "a number of mappings in [1, 1048576]" },
    { "WEFT_CUDA_IPC_OPEN_SYNCS", F(cuda_ipc_open_syncs), 0, 1, "0 or 1" },
};

/* Sizes: name, field, bounds in bytes, unit of a plain number. */
static const struct { const char *name; size_t off; size_t lo, hi, unit; } sizes[] = {
    { "WEFT_SHM_EAGER",          F(shm_eager_limit),  0,         1u << 20,        1 },
    { "WEFT_SHM_COLL_EAGER",     F(shm_coll_eager),   0,         1u << 20,        1 },
    { "WEFT_SHM_RING_KB",        F(shm_ring_bytes),   64 << 10,  (size_t)1 << 30, 1024 },
    { "WEFT_SHM_BUDGET_MB",      F(shm_budget),       0,         (size_t)1 << 44, (size_t)1 << 20 },
    { "WEFT_SHM_CHUNK_KB",       F(shm_chunk),        4 << 10,   64u << 20,       1024 },
    { "WEFT_SHM_CMA_MIN_KB",     F(shm_cma_min),      0,         SIZE_MAX,        1024 },
    { "WEFT_NODE_COLL_KB",       F(node_coll_bytes),  0,         16u << 20,       1024 },
    { "WEFT_NODE_COLL_LARGE_KB", F(node_coll_large),  0,         16u << 20,       1024 },
    { "WEFT_NODE_COLL_STREAM_KB", F(node_coll_stream), 0,        SIZE_MAX,        1024 },
    { "WEFT_TCP_EAGER",          F(tcp_eager_limit),  0,         4u << 20,        1 },
    { "WEFT_TCP_CHUNK_KB",       F(tcp_chunk),        4 << 10,   (size_t)1 << 30, 1024 },
    { "WEFT_SELF_EAGER",         F(self_eager_limit), 0,         64u << 20,       1 },
    { "WEFT_PIPE_INLINE",        F(pipe_inline),      0,         1u << 20,        1 },
    { "WEFT_EAGER_WINDOW",       F(eager_window),     64 << 10,  (size_t)1 << 30, 1 },
    { "WEFT_IB_CHUNK",           F(ib_chunk),         4 << 10,   (size_t)1 << 30, 1 },
    { "WEFT_IB_EAGER",           F(ib_eager_limit),   64,        1u << 20,        1 },
    { "WEFT_IB_REG_CACHE_MB",    F(ib_reg_cache),     0,         SIZE_MAX,        1u << 20 },
    { "WEFT_CUDA_STAGE_CHUNK",   F(cuda_stage_chunk), 4 << 10,   (size_t)1 << 30, 1 },
    { "WEFT_ALLGATHER_CHUNK_KB", F(allgather_chunk),  1 << 10,   (size_t)1 << 30, 1024 },
    { "WEFT_REDUCE_CHUNK_KB",    F(reduce_chunk),     4 << 10,   (size_t)1 << 30, 1024 },
};

/* Names and paths: name, field, "" allowed (= the default), spaces inside allowed, what is expected. */
static const struct { const char *name; size_t off; size_t size; int empty_ok, spaces_ok; const char *expected; } strs[] = {
    { "WEFT_TCP_IF",      F(tcp_if), sizeof(((struct weft_config *)0)->tcp_if),      1, 0,
      "an interface name or IPv4 address, at most 63 characters" },
    { "WEFT_IB_HCA",      F(ib_hca), sizeof(((struct weft_config *)0)->ib_hca),      1, 0,
      "a comma-separated list of device[:port], e.g. mlx5_0:1,mlx5_1" },
    { "WEFT_IBVERBS_LIB", F(ibverbs_lib), sizeof(((struct weft_config *)0)->ibverbs_lib), 0, 1,
      "a library name or path, at most 255 characters" },
    { "WEFT_TOPO_XML",    F(topo_xml), sizeof(((struct weft_config *)0)->topo_xml),    1, 1,
      "the path of an hwloc XML file, at most 255 characters" },
    { "WEFT_CUDA_LIB",    F(cuda_lib), sizeof(((struct weft_config *)0)->cuda_lib),    0, 1,
      "a library name or path, at most 255 characters" },
    { "WEFT_TRACE",       F(trace_dir), sizeof(((struct weft_config *)0)->trace_dir),  1, 1,
      "the path of a directory, at most 255 characters" },
};

/* Named values (the algorithms, WEFT_THREADS): variable, its list, field. */
static const struct { const char *name; const char *const *names; size_t off; } algos[] = {
    { "WEFT_ALLGATHER_ALGO",      weft_allgather_algo_names,      F(allgather_algo) },
    { "WEFT_ALLREDUCE_ALGO",      weft_allreduce_algo_names,      F(allreduce_algo) },
    { "WEFT_REDUCE_SCATTER_ALGO", weft_reduce_scatter_algo_names, F(reduce_scatter_algo) },
    { "WEFT_REDUCE_ALGO",         weft_reduce_algo_names,         F(reduce_algo) },
    { "WEFT_ALLTOALL_ALGO",       weft_alltoall_algo_names,       F(alltoall_algo) },
    { "WEFT_THREADS",             weft_threads_names,             F(threads) },
};

/* ------------------------------------------------------------ load */

int weft_config_load(struct weft_config *cfg, weft_env_lookup_fn lookup, void *ctx,
                     char *err, size_t errlen)
{
    const char *v, *why;
    char expected[160];
    long n;
    int idx;

    if (lookup == NULL)
        lookup = lookup_getenv;

    memset(cfg, 0, sizeof(*cfg));
    cfg->timeout_s        = 300.0;
    /* Warnings are errors where they start: shown unless asked not to
     * (a failed weft_comm_create has no comm to read the message from). */
    cfg->log_level        = WEFT_LOG_WARN;
    cfg->virtual_nodes    = 0;
    cfg->shm_cma          = 1;
    /* 4 KiB: above it a lone message is faster by single-copy CMA than by
     * two copies through the ring (docs/benchmarks.md). Collectives send
     * to many peers at once, where the handshake costs more than the copy,
     * so their lanes stay eager up to 32 KiB. */
    cfg->shm_eager_limit  = 4 << 10;
    cfg->shm_coll_eager   = 32 << 10;
    cfg->shm_ring_bytes   = 1 << 20;
    cfg->shm_budget       = (size_t)64 << 20;
    cfg->shm_chunk        = 64 << 10;
    cfg->shm_cma_min      = 0;
    cfg->shm_stream       = 1;
    /* 64 KiB a rank: up to there one shared-memory round beat the
     * schedules of messages at 2, 4 and 8 ranks on the 2-core machine
     * (docs/benchmarks.md, "Node-local collectives"; at 2 ranks single-copy
     * messages win from 128 KiB), for a segment of about 1.7 MiB per comm
     * at 8 ranks. */
    cfg->node_coll_bytes  = 64 << 10;
    /* From three ranks on one node, allreduces, reduces, reduce_scatters
     * and allgathers of up to 1 MiB: over 27 jobs at 3, 4 and 8 ranks,
     * 128 KiB-1 MiB, the segment's one round took 1.04-1.78x less time
     * than the same calls as messages and 1.47-2.32x less than Open MPI
     * (geometric means; docs/benchmarks.md, "All four through the large
     * segment"), though in the machine's slow phases it lost to the
     * messages (allgather down to 0.31x). The other kinds stay within
     * WEFT_NODE_COLL_KB. A second segment, about 18 MiB at 8 ranks, made
     * at the first such call. */
    cfg->node_coll_large  = 1 << 20;
    cfg->node_coll_stream = 32 << 10;
    cfg->tcp_streams      = 4;
    cfg->tcp_eager_limit  = 64 << 10;
    cfg->tcp_chunk        = 512 << 10;
    cfg->self_eager_limit = 64 << 10;
    /* 4 MiB per peer pair: above every default eager limit (a sender always
     * gets at least one eager message out) and a few dozen of the common
     * small ones, while a receiver that falls behind holds at most 4 MiB of
     * unmatched messages per sender. */
    cfg->eager_window     = 4 << 20;
    cfg->spin_us          = 50;
    /* Message pipes: up to 4 KiB inline keeps a small message to one
     * transport message; larger buffers go by rendezvous (one copy, into
     * the read's buffer), which streams faster than inline's copy into the
     * descriptor and out of it (bench/pipe: 4-16 KiB windows 3-7x slower
     * inlined). */
    cfg->progress_thread  = 0;
    cfg->pipe_inline      = 4 << 10;
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
    /* Whether opening a CUDA IPC handle waits for the device is not
     * documented; until a GPU shows it does not (scripts/gpu/sync_probe.cu),
     * weft assumes it does and never opens one on its own threads while a
     * stream waits on weft (those transfers are staged instead). */
    cfg->cuda_ipc_open_syncs = 1;
    strcpy(cfg->allgather_algo, "auto");
    strcpy(cfg->threads, "multiple");
    /* 1 MiB ring chunks: docs/benchmarks.md ("## Allgather"). */
    cfg->allgather_chunk  = 1 << 20;
    strcpy(cfg->allreduce_algo, "auto");
    strcpy(cfg->reduce_scatter_algo, "auto");
    strcpy(cfg->reduce_algo, "auto");
    strcpy(cfg->alltoall_algo, "auto");
    /* Reduction pipelines: docs/benchmarks.md ("## Allreduce"). */
    cfg->reduce_chunk     = 256 << 10;

    /* Seconds. */
    if ((v = lookup("WEFT_TIMEOUT", ctx)) != NULL) {
        if ((why = strict_seconds(v, 1e9, &cfg->timeout_s)) != NULL)
            return refuse(err, errlen, "WEFT_TIMEOUT", v, why,
                          "seconds from 0 to 1000000000, fractions allowed, 0 = never");
    }

    /* Names. */
    if ((v = lookup("WEFT_DEBUG", ctx)) != NULL) {
        if ((cfg->log_level = parse_log_level(v)) < 0) {
            why = blank_problem(v);
            return refuse(err, errlen, "WEFT_DEBUG", v, why ? why : "unknown level",
                          "none (or 0, or empty), warn, info or trace");
        }
    }
    /* Algorithm names: "" is the default (auto), as when unset. */
    {
        for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++) {
            if ((v = lookup(algos[i].name, ctx)) == NULL || *v == '\0')
                continue;
            if ((why = strict_name(v, algos[i].names, &idx)) != NULL) {
                names_expected(algos[i].names, expected, sizeof(expected));
                return refuse(err, errlen, algos[i].name, v, why, expected);
            }
            /* The canonical spelling: the collectives compare it exactly. */
            strcpy((char *)cfg + algos[i].off, algos[i].names[idx]);
        }
    }
    if ((v = lookup("WEFT_IB_GDR", ctx)) != NULL) {
        if (strcasecmp(v, "auto") == 0)
            cfg->ib_gdr = -1;
        else if ((why = strict_long(v, 0, 1, &n)) == NULL)
            cfg->ib_gdr = (int)n;
        else
            return refuse(err, errlen, "WEFT_IB_GDR", v, why, "auto, 0 or 1");
    }
    if ((v = lookup("WEFT_TRANSPORTS", ctx)) != NULL) {
        why = blank_problem(v);
        if (why == NULL && weft_parse_transports(v) != 0)
            why = "not a comma-separated list of names";
        if (why == NULL && strlen(v) >= sizeof(cfg->transports))
            why = "too long";
        if (why)
            return refuse(err, errlen, "WEFT_TRANSPORTS", v, why, "a comma-separated list of self, shm, tcp, ib");
        strcpy(cfg->transports, v);
    }

    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        if ((v = lookup(ints[i].name, ctx)) == NULL)
            continue;
        if ((why = strict_long(v, ints[i].lo, ints[i].hi, &n)) != NULL) {
            if (ints[i].expected)
                snprintf(expected, sizeof(expected), "%s", ints[i].expected);
            else
                snprintf(expected, sizeof(expected), "an integer in [%ld, %ld]", ints[i].lo, ints[i].hi);
            return refuse(err, errlen, ints[i].name, v, why, expected);
        }
        *(int *)(void *)((char *)cfg + ints[i].off) = (int)n;
    }

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        if ((v = lookup(sizes[i].name, ctx)) == NULL)
            continue;
        if ((why = strict_size(v, sizes[i].unit, sizes[i].lo, sizes[i].hi,
                               (size_t *)(void *)((char *)cfg + sizes[i].off))) != NULL) {
            size_expected(sizes[i].unit, sizes[i].lo, sizes[i].hi, expected, sizeof(expected));
            return refuse(err, errlen, sizes[i].name, v, why, expected);
        }
    }
    /* An eager message must fit a ring record with room to spare. */
    {
        char ring[32];
        format_size(cfg->shm_ring_bytes, ring, sizeof(ring));
        snprintf(expected, sizeof(expected), "at most %zu bytes: a quarter of the ring (WEFT_SHM_RING_KB, %s) "
                 "less 256", cfg->shm_ring_bytes / 4 - 256, ring);
    }
    if (cfg->shm_eager_limit + 256 > cfg->shm_ring_bytes / 4) {
        v = lookup("WEFT_SHM_EAGER", ctx);
        return refuse(err, errlen, "WEFT_SHM_EAGER", v ? v : "default", "does not fit the ring", expected);
    }
    if (cfg->shm_coll_eager + 256 > cfg->shm_ring_bytes / 4) {
        /* A value the user set must fit; the default shrinks with the ring. */
        if ((v = lookup("WEFT_SHM_COLL_EAGER", ctx)) != NULL)
            return refuse(err, errlen, "WEFT_SHM_COLL_EAGER", v, "does not fit the ring", expected);
        cfg->shm_coll_eager = cfg->shm_ring_bytes / 4 - 256;
    }
    if (cfg->shm_chunk + 256 > cfg->shm_ring_bytes / 2)
        cfg->shm_chunk = cfg->shm_ring_bytes / 4;

    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
        if ((v = lookup(strs[i].name, ctx)) == NULL)
            continue;
        why = strict_string(v, strs[i].size, strs[i].empty_ok, strs[i].spaces_ok);
        if (why == NULL && strs[i].off == F(ib_hca) && *v != '\0' && parse_hca_list(v) != 0)
            why = "not a list of device[:port]";
        if (why)
            return refuse(err, errlen, strs[i].name, v, why, strs[i].expected);
        strcpy((char *)cfg + strs[i].off, v);
    }
    return WEFT_SUCCESS;
}

/* ------------------------------------------------------------ agreement */

/* The settings that must be equal on every rank, with how each is read
 * from the config; docs/configuration.md ("Settings that must agree") says
 * why these and not the others. */
enum agreed_kind { AGREED_INT, AGREED_SIZE, AGREED_ALGO };
static const struct {
    const char *name; enum agreed_kind kind; size_t off;
    const char *const *names;   /* AGREED_ALGO: its list */
} agreed[WEFT_CONFIG_AGREED_COUNT] = {
    { "WEFT_VIRTUAL_NODES",      AGREED_INT,  offsetof(struct weft_config, virtual_nodes), NULL },
    { "WEFT_SHM_RING_KB",        AGREED_SIZE, offsetof(struct weft_config, shm_ring_bytes), NULL },
    { "WEFT_SHM_EAGER",          AGREED_SIZE, offsetof(struct weft_config, shm_eager_limit), NULL },
    { "WEFT_SHM_COLL_EAGER",     AGREED_SIZE, offsetof(struct weft_config, shm_coll_eager), NULL },
    { "WEFT_SHM_CHUNK_KB",       AGREED_SIZE, offsetof(struct weft_config, shm_chunk), NULL },
    { "WEFT_TCP_STREAMS",        AGREED_INT,  offsetof(struct weft_config, tcp_streams), NULL },
    { "WEFT_TCP_EAGER",          AGREED_SIZE, offsetof(struct weft_config, tcp_eager_limit), NULL },
    { "WEFT_TCP_CHUNK_KB",       AGREED_SIZE, offsetof(struct weft_config, tcp_chunk), NULL },
    { "WEFT_IB_EAGER",           AGREED_SIZE, offsetof(struct weft_config, ib_eager_limit), NULL },
    { "WEFT_EAGER_WINDOW",       AGREED_SIZE, offsetof(struct weft_config, eager_window), NULL },
    { "WEFT_ALLGATHER_ALGO",     AGREED_ALGO, offsetof(struct weft_config, allgather_algo), weft_allgather_algo_names },
    { "WEFT_ALLGATHER_CHUNK_KB", AGREED_SIZE, offsetof(struct weft_config, allgather_chunk), NULL },
    { "WEFT_ALLREDUCE_ALGO",     AGREED_ALGO, offsetof(struct weft_config, allreduce_algo), weft_allreduce_algo_names },
    { "WEFT_REDUCE_SCATTER_ALGO", AGREED_ALGO, offsetof(struct weft_config, reduce_scatter_algo),
      weft_reduce_scatter_algo_names },
    { "WEFT_REDUCE_ALGO",        AGREED_ALGO, offsetof(struct weft_config, reduce_algo), weft_reduce_algo_names },
    { "WEFT_ALLTOALL_ALGO",      AGREED_ALGO, offsetof(struct weft_config, alltoall_algo), weft_alltoall_algo_names },
    { "WEFT_REDUCE_CHUNK_KB",    AGREED_SIZE, offsetof(struct weft_config, reduce_chunk), NULL },
    { "WEFT_NODE_COLL_KB",       AGREED_SIZE, offsetof(struct weft_config, node_coll_bytes), NULL },
    { "WEFT_NODE_COLL_LARGE_KB", AGREED_SIZE, offsetof(struct weft_config, node_coll_large), NULL },
};

void weft_config_agreed_values(const struct weft_config *cfg, int64_t *values)
{
    const char *base = (const char *)cfg;
    for (int i = 0; i < WEFT_CONFIG_AGREED_COUNT; i++) {
        const void *field = base + agreed[i].off;
        switch (agreed[i].kind) {
        case AGREED_INT:
            values[i] = *(const int *)field;
            break;
        case AGREED_SIZE:
            values[i] = (int64_t)*(const size_t *)field;
            break;
        case AGREED_ALGO: {
            int k = 0;
            while (agreed[i].names[k] && strcmp((const char *)field, agreed[i].names[k]) != 0)
                k++;
            values[i] = k;
            break;
        }
        }
    }
}

const char *weft_config_agreed_name(int i)
{
    return i >= 0 && i < WEFT_CONFIG_AGREED_COUNT ? agreed[i].name : "?";
}

void weft_config_agreed_format(int i, int64_t value, char *buf, size_t len)
{
    if (i < 0 || i >= WEFT_CONFIG_AGREED_COUNT) {
        snprintf(buf, len, "%lld", (long long)value);
        return;
    }
    switch (agreed[i].kind) {
    case AGREED_SIZE:
        format_size((size_t)value, buf, len);
        break;
    case AGREED_ALGO: {
        int n = 0;
        while (agreed[i].names[n])
            n++;
        snprintf(buf, len, "%s", value >= 0 && value < n ? agreed[i].names[value] : "?");
        break;
    }
    default:
        snprintf(buf, len, "%lld", (long long)value);
        break;
    }
}

/* ------------------------------------------------------------ a comm's own settings */

struct reads_probe {
    const char *want;
    int         seen;
};

static const char *lookup_probe(const char *name, void *ctx)
{
    struct reads_probe *pr = ctx;
    if (strcmp(name, pr->want) == 0)
        pr->seen = 1;
    return NULL;
}

/* Asks weft_config_load itself, so the list of names is never a second
 * copy that can drift from what the loader reads. */
int weft_config_reads(const char *name)
{
    struct weft_config cfg;
    struct reads_probe pr = { name, 0 };
    (void)weft_config_load(&cfg, lookup_probe, &pr, NULL, 0);
    return pr.seen;
}

void weft_settings_free(struct weft_settings *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->names ? s->names[i] : NULL);
        free(s->values ? s->values[i] : NULL);
    }
    free(s->names);
    free(s->values);
    free(s);
}

static struct weft_settings *settings_alloc(size_t n)
{
    struct weft_settings *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->names = calloc(n, sizeof(char *));
    s->values = calloc(n, sizeof(char *));
    if (s->names == NULL || s->values == NULL) {
        weft_settings_free(s);
        return NULL;
    }
    s->n = n;
    return s;
}

int weft_settings_make(const char *const *names, const char *const *values, size_t n,
                       struct weft_settings **out, char *err, size_t errlen)
{
    struct weft_settings *s;

    if (n == 0) {
        *out = NULL;
        return WEFT_SUCCESS;
    }
    for (size_t i = 0; i < n; i++) {
        if (names[i] == NULL || values[i] == NULL) {
            snprintf(err, errlen, "settings[%zu]: its %s is NULL", i, names[i] == NULL ? "name" : "value");
            return WEFT_ERR_INVALID_ARG;
        }
        if (!weft_config_reads(names[i])) {
            snprintf(err, errlen, "settings[%zu]: %.80s is not a setting a comm takes (docs/configuration.md "
                     "lists them; names are upper case, WEFT_...)", i, names[i]);
            return WEFT_ERR_INVALID_ARG;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(names[j], names[i]) == 0) {
                snprintf(err, errlen, "settings[%zu]: %.80s is given twice (also settings[%zu])", i, names[i], j);
                return WEFT_ERR_INVALID_ARG;
            }
    }
    if ((s = settings_alloc(n)) == NULL) {
        snprintf(err, errlen, "no memory for %zu settings", n);
        return WEFT_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        s->names[i] = strdup(names[i]);
        s->values[i] = strdup(values[i]);
        if (s->names[i] == NULL || s->values[i] == NULL) {
            weft_settings_free(s);
            snprintf(err, errlen, "no memory for %zu settings", n);
            return WEFT_ERR_NO_MEMORY;
        }
    }
    *out = s;
    return WEFT_SUCCESS;
}

int weft_settings_dup(const struct weft_settings *s, struct weft_settings **out)
{
    char err[64];
    if (s == NULL) {
        *out = NULL;
        return WEFT_SUCCESS;
    }
    return weft_settings_make((const char *const *)s->names, (const char *const *)s->values, s->n, out, err,
                              sizeof(err));
}

const char *weft_settings_lookup_own(const struct weft_settings *s, const char *name)
{
    for (size_t i = 0; s != NULL && i < s->n; i++)
        if (strcmp(s->names[i], name) == 0)
            return s->values[i];
    return NULL;
}

const char *weft_settings_lookup(const char *name, void *ctx)
{
    const char *v = weft_settings_lookup_own(ctx, name);
    return v != NULL ? v : getenv(name);
}

int weft_settings_merge(const struct weft_settings *base, const struct weft_settings *over,
                        struct weft_settings **out)
{
    size_t nb = base ? base->n : 0, no = over ? over->n : 0, n = 0;
    const char **names, **values;
    char err[64];
    int rc;

    if (nb + no == 0) {
        *out = NULL;
        return WEFT_SUCCESS;
    }
    names = calloc(nb + no, sizeof(*names));
    values = calloc(nb + no, sizeof(*values));
    if (names == NULL || values == NULL) {
        free(names);
        free(values);
        return WEFT_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < nb; i++) {
        if (weft_settings_lookup_own(over, base->names[i]) != NULL)
            continue;   /* over's wins */
        names[n] = base->names[i];
        values[n++] = base->values[i];
    }
    for (size_t i = 0; i < no; i++) {
        names[n] = over->names[i];
        values[n++] = over->values[i];
    }
    rc = weft_settings_make(names, values, n, out, err, sizeof(err));
    free(names);
    free(values);
    return rc;
}

/* ------------------------------------------------------------ what is set, and where from */

struct names_probe {
    const char **names;
    int          max, n;
};

static const char *lookup_record(const char *name, void *ctx)
{
    struct names_probe *pr = ctx;
    for (int i = 0; i < pr->n && i < pr->max; i++)
        if (strcmp(pr->names[i], name) == 0)
            return NULL;
    if (pr->n < pr->max)
        pr->names[pr->n] = name;
    pr->n++;
    return NULL;
}

int weft_config_names(const char **names, int max)
{
    struct weft_config cfg;
    struct names_probe pr = { names, max, 0 };
    /* The loader's own list, in its order (as weft_config_reads). */
    (void)weft_config_load(&cfg, lookup_record, &pr, NULL, 0);
    return pr.n;
}

int weft_config_format(const struct weft_config *cfg, const char *name, char *buf, size_t len)
{
    const char *base = (const char *)cfg;
    if (strcmp(name, "WEFT_TIMEOUT") == 0) {
        snprintf(buf, len, "%g", cfg->timeout_s);
        return 0;
    }
    if (strcmp(name, "WEFT_DEBUG") == 0) {
        int l = cfg->log_level;
        snprintf(buf, len, "%s", l >= WEFT_LOG_NONE && l <= WEFT_LOG_TRACE ? log_level_names[l] : "?");
        return 0;
    }
    if (strcmp(name, "WEFT_IB_GDR") == 0) {
        snprintf(buf, len, "%s", cfg->ib_gdr < 0 ? "auto" : cfg->ib_gdr ? "1" : "0");
        return 0;
    }
    if (strcmp(name, "WEFT_TRANSPORTS") == 0) {
        snprintf(buf, len, "%s", cfg->transports[0] ? cfg->transports : "");
        return 0;
    }
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        if (strcmp(name, ints[i].name) == 0) {
            snprintf(buf, len, "%d", *(const int *)(const void *)(base + ints[i].off));
            return 0;
        }
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (strcmp(name, sizes[i].name) == 0) {
            format_size(*(const size_t *)(const void *)(base + sizes[i].off), buf, len);
            return 0;
        }
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
        if (strcmp(name, strs[i].name) == 0) {
            snprintf(buf, len, "%s", base + strs[i].off);
            return 0;
        }
    for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++)
        if (strcmp(name, algos[i].name) == 0) {
            snprintf(buf, len, "%s", base + algos[i].off);
            return 0;
        }
    if (len)
        buf[0] = '\0';
    return -1;
}

const char *weft_config_origin(const char *name, const struct weft_settings *settings)
{
    if (weft_settings_lookup_own(settings, name) != NULL)
        return "comm setting";
    return getenv(name) != NULL ? "environment" : "default";
}

int weft_config_agreed_index(const char *name)
{
    for (int i = 0; i < WEFT_CONFIG_AGREED_COUNT; i++)
        if (strcmp(agreed[i].name, name) == 0)
            return i;
    return strcmp(name, "WEFT_TRANSPORTS") == 0 ? WEFT_CONFIG_AGREED_COUNT : -1;
}
