/*
 * weft_comm_create / weft_comm_init / weft_comm_split / weft_comm_destroy:
 * assembling a comm from its layers, whichever way its ranks met.
 *
 * create:  bootstrap (MPI: MPI_Comm_dup; unique id: the root's listener;
 *          split: the parent comm's pipes) -> config (agreed) -> this rank's
 *          card header (host identity = host name + boot id, token, pid,
 *          WEFT_VIRTUAL_NODES block, allowed transports) -> allgather of the
 *          headers -> node numbering -> CUDA -> the pipe layer offers its
 *          transports (blobs in this rank's card) -> allgather of the whole
 *          cards -> transports chosen and connected (p2p/setup.c) -> CUDA
 *          copy helpers, collectives, stream engine.
 * destroy: stream engine quiesced -> pipes drained -> barrier -> transports
 *          and everything else released -> bootstrap freed.
 * Every step that can fail on one rank is agreed by all, so a failure on one
 * rank fails create on every rank and never hangs one. The bootstrap is
 * used only here; everything between create and destroy travels on weft's
 * own pipes.
 */
#include "backoff.h"
#include "engine.h"
#include "comm.h"
#include "journal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "bootstrap_mpi.h"
#include "bootstrap_split.h"
#include "cudawrap.h"
#include "devcopy.h"
#include "log.h"
#include "p2p.h"
#include "msgpipe.h"
#include "registry.h"
#include "signals.h"
#include "stream.h"
#include "transport.h"
#include "deadline.h"

static uint64_t random_token(void)
{
    uint64_t t = 0;
    if (getrandom(&t, sizeof(t), 0) != (ssize_t)sizeof(t)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        t = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
    }
    return t ? t : 1;
}

/* The reason in core's last error, without its rank, its call when that is
 * what (the message it goes into names the call and the step) and its code
 * when that is code: the reason is what names the rank that was lost. */
static void last_reason(struct weft_core *core, const char *what, int code, char *out, size_t len)
{
    struct weft_error e;
    char reason[sizeof(e.op) + sizeof(e.text) + 4];
    const char *s = reason;
    size_t wl = strlen(what);

    weft_error_get(core, &e);
    if (e.op[0] != '\0' && strcmp(e.op, what) == 0)
        snprintf(reason, sizeof(reason), "%s", e.text);
    else
        weft_error_reason(&e, reason, sizeof(reason));
    /* Set before the call's name was a part of its own (weft_set_error_at):
     * the bootstraps' texts still start with it. */
    if (e.op[0] == '\0' && strncmp(s, what, wl) == 0 && s[wl] == ':' && s[wl + 1] == ' ')
        s += wl + 2;
    if (*s == '\0')
        snprintf(out, len, "%s", weft_err_str(code));
    else if (e.code == code)
        snprintf(out, len, "%.*s", (int)(len - 1), s);
    else if (snprintf(out, len, "%s (%s)", s, weft_err_str(e.code)) >= (int)len)
        WEFT_TRACE(core->rank, "%s: the reason was cut to %zu bytes", what, len);
}

/* One max-agreement value: the code in the high bits, so the worst code
 * wins, and among ranks with that code the lowest rank (inverted low bits). */
#define AGREE_SPAN (1ll << 32)

long long weft_agree_encode(int code, int rank)
{
    return code == WEFT_SUCCESS ? 0 : (long long)code * AGREE_SPAN + (AGREE_SPAN - 1 - rank);
}

int weft_agree_decode(long long v, int size, int *code, int *rank)
{
    if (v == 0) {
        *code = WEFT_SUCCESS;
        *rank = -1;
        return 0;
    }
    long long c = v / AGREE_SPAN, r = AGREE_SPAN - 1 - v % AGREE_SPAN;
    /* What came back is the max of every rank's contribution, carried by the
     * bootstrap: a corrupted one must not become an error code or a rank. */
    if (v < 0 || c <= WEFT_SUCCESS || c > WEFT_ERR_LAST || r < 0 || r >= size)
        return -1;
    *code = (int)c;
    *rank = (int)r;
    return 0;
}

/* Every rank gets the worst code of all; a rank that failed keeps its own
 * message, the others say who failed. */
static int agree(struct weft_comm *c, int rc, const char *stage)
{
    long long v = weft_agree_encode(rc, c->core.rank);
    int code, who;

    int brc = c->boot->ops->max(c->boot, &v);
    if (brc != WEFT_SUCCESS) {
        /* The bootstrap said why (the rank it lost, the root that went
         * away); keep that and say where. */
        char why[700];
        last_reason(&c->core, c->what, brc, why, sizeof(why));
        return weft_set_error_at(&c->core, brc, c->what, -1, "the %s bootstrap failed during %s: %s",
                              c->boot->ops->name, stage, why);
    }
    if (weft_agree_decode(v, c->core.size, &code, &who) != 0)
        /* Every rank got the same value: every rank stops here, alike. */
        return weft_set_error_at(&c->core, WEFT_ERR_INTERNAL, c->what, -1, "the agreement on %s came back damaged "
                                 "(0x%llx names no weft code and rank of this %d-rank comm): a rank's contribution "
                                 "or the %s bootstrap's answer was corrupted", stage, (unsigned long long)v,
                                 c->core.size, c->boot->ops->name);
    if (code != WEFT_SUCCESS && rc == WEFT_SUCCESS)
        weft_set_error_at(&c->core, code, c->what, -1, "%s failed on rank %d", stage, who);
    return code;
}

/* The collective services transports use in connect (transport.h). */
static int coll_alltoall(void *arg, const void *send, void *recv, size_t bytes)
{
    struct weft_comm *c = arg;
    return c->boot->ops->alltoall(c->boot, send, recv, bytes);
}

static int coll_agree(void *arg, int rc, const char *stage)
{
    return agree(arg, rc, stage);
}

/* Scratch of the set-up's gathers, allocated once before the first
 * agreement (so no gather can fail on one rank only for want of memory):
 * room for every rank's record of the largest gather, with its code in
 * front, plus this rank's own. */
struct gather_scratch {
    unsigned char *buf;
    size_t         rec;     /* bytes per record: 8 (code) + payload rounded up */
};

static size_t gather_rec(size_t bytes)
{
    return 8 + ((bytes + 7) & ~(size_t)7);
}

/* An allgather that is also an agreement: each rank's record carries its
 * code in front, so when every rank is fine it costs one collective, not
 * an agree and an allgather. When some rank failed, every rank sees that
 * in the gathered codes and all of them run agree() (so the collectives
 * stay matched), which leaves the usual messages: a failed rank keeps its
 * own, the others name it. all (may be NULL) gets the payloads only. */
static int allgather_agreed(struct weft_comm *c, struct gather_scratch *g, int rc, const char *stage,
                            const void *mine, void *all, size_t bytes)
{
    const int size = c->core.size;
    unsigned char *send = g->buf + (size_t)size * g->rec, *recv = g->buf;
    int32_t code = rc;
    memset(send, 0, g->rec);
    memcpy(send, &code, sizeof(code));
    memcpy(send + 8, mine, bytes);
    int brc = c->boot->ops->allgather(c->boot, send, recv, g->rec);
    if (brc != WEFT_SUCCESS)
        return agree(c, brc, stage);   /* a bootstrap failure: agree says which */
    int failed = 0;
    for (int r = 0; r < size; r++) {
        memcpy(&code, recv + (size_t)r * g->rec, sizeof(code));
        failed |= code != WEFT_SUCCESS;
        if (all)
            memcpy((unsigned char *)all + (size_t)r * bytes, recv + (size_t)r * g->rec + 8, bytes);
    }
    return failed ? agree(c, rc, stage) : WEFT_SUCCESS;
}

/* Settings that shape the wire or the protocol must be equal on every rank
 * (docs/configuration.md, "Settings that must agree"). Checked here, once,
 * because a difference otherwise shows late and on one rank only: a tcp
 * hello refused by one side while the other waits out WEFT_TIMEOUT. Every
 * rank gathers every rank's values (one int64 per setting: the allowed
 * transports, then src/core/config.c's list) and runs the same comparison,
 * so all fail at once with the same message: the first differing setting,
 * its value on rank 0 and on the lowest rank that differs from it. */
enum { SETTINGS_N = 1 + WEFT_CONFIG_AGREED_COUNT };

/* rank r's setting i, in the scratch the gather left it in */
static int64_t setting_of(const struct gather_scratch *g, int r, int i)
{
    int64_t v;
    memcpy(&v, g->buf + (size_t)r * g->rec + 8 + (size_t)i * sizeof(v), sizeof(v));
    return v;
}

/* Also the agreement on reading the configuration: rc is this rank's. */
static int check_settings_agree(struct weft_comm *c, struct gather_scratch *g, int rc, unsigned mask)
{
    enum { N = SETTINGS_N };
    int64_t mine[N];
    int size = c->core.size;

    mine[0] = (int64_t)mask;
    weft_config_agreed_values(&c->core.cfg, mine + 1);
    rc = allgather_agreed(c, g, rc, "reading the WEFT_* configuration", mine, NULL, sizeof(mine));
    for (int i = 0; rc == WEFT_SUCCESS && i < N; i++) {
        int r = 1;
        while (r < size && setting_of(g, r, i) == setting_of(g, 0, i))
            r++;
        if (r == size)
            continue;
        char v0[160] = "", vr[160] = "";
        const char *name = i == 0 ? "WEFT_TRANSPORTS" : weft_config_agreed_name(i - 1);
        for (int k = 0; k < 2; k++) {
            int64_t v = setting_of(g, k ? r : 0, i);
            char *buf = k ? vr : v0;
            if (i > 0) {
                weft_config_agreed_format(i - 1, v, buf, sizeof(v0));
                continue;
            }
            /* The carriers allowed, by name (movers are always allowed). */
            for (int t = 0; t < weft_registry_count(); t++) {
                const struct weft_transport *tp = weft_registry_get(t);
                if (tp && tp->ctrl && ((v >> t) & 1))
                    snprintf(buf + strlen(buf), sizeof(v0) - strlen(buf), "%s%s", buf[0] ? "," : "", tp->name);
            }
        }
        rc = weft_set_error(&c->core, WEFT_ERR_INVALID_ARG,
                            "%s: %s differs between ranks: %s on rank 0, %s on rank %d "
                            "(settings that shape the protocol must be equal on every rank)", c->what, name, v0, vr, r);
    }
    return rc;
}

/* Host identity: host name and boot id (two containers of one kernel that
 * report the same host name share /dev/shm and can reach each other by CMA). */
static uint64_t host_key(const char *hostname)
{
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (const char *s = hostname; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    h = (h ^ '/') * 1099511628211ull;
    for (const char *s = boot; *s && *s != '\n'; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static struct weft_card_hdr *card_hdr(struct weft_comm *c, int rank)
{
    return (struct weft_card_hdr *)(void *)(c->cards + (size_t)rank * c->card_bytes);
}

/* Effective node of every rank: one per distinct (host, virtual block),
 * numbered in order of first appearance. */
static void number_nodes(struct weft_comm *c)
{
    int nodes = 0, size = c->core.size, me = c->core.rank;
    /* (host, virtual block) -> node through an open-addressing table, so
     * this is O(ranks), not O(ranks^2) (10,000 ranks: 10^4, not 10^8). */
    size_t cap = 16;
    while (cap < 2 * (size_t)size)
        cap <<= 1;
    int *slot = malloc(cap * sizeof(*slot));   /* rank whose key fills the slot, -1 = empty */
    for (size_t i = 0; slot && i < cap; i++)
        slot[i] = -1;
    for (int r = 0; r < size; r++) {
        struct weft_card_hdr *h = card_hdr(c, r);
        int found = -1;
        if (slot) {
            uint64_t key = h->node_key ^ ((uint64_t)(uint32_t)h->vblock * 0x9e3779b97f4a7c15ull);
            size_t i = (size_t)(key ^ (key >> 29)) & (cap - 1);
            for (; slot[i] >= 0; i = (i + 1) & (cap - 1)) {
                const struct weft_card_hdr *o = card_hdr(c, slot[i]);
                if (o->node_key == h->node_key && o->vblock == h->vblock) {
                    found = o->node;
                    break;
                }
            }
            if (found < 0)
                slot[i] = r;
        } else {
            /* no memory for the table: the quadratic search */
            for (int q = 0; q < r && found < 0; q++)
                if (card_hdr(c, q)->node_key == h->node_key && card_hdr(c, q)->vblock == h->vblock)
                    found = card_hdr(c, q)->node;
        }
        h->node = found >= 0 ? found : nodes++;
    }
    free(slot);
    c->core.num_nodes = nodes;

    int local = 0, same_host = 0;
    for (int r = 0; r < size; r++) {
        local += card_hdr(c, r)->node == card_hdr(c, me)->node;
        same_host += card_hdr(c, r)->node_key == card_hdr(c, me)->node_key;
    }
    c->core.local_ranks = local;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    c->core.oversubscribed = cpus > 0 && same_host > cpus;
}

/* CUDA, once per process (WEFT_CUDA_LIB); not having it is not an error:
 * device buffers are then refused, one info line says why. */
static void load_cuda(struct weft_comm *c)
{
    char why[512] = "";
    c->core.cuda = weft_cuda_load(c->core.cfg.cuda_lib, why, sizeof(why)) == WEFT_SUCCESS;
    if (!c->core.cuda) {
        if (c->core.rank == 0)
            WEFT_INFO(c->core.rank, "cuda: not available, device buffers will be refused: %s", why);
        return;
    }
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *cu = weft_cuda_get();
    WEFT_INFO(c->core.rank, "cuda: %s loaded, %d device(s)", cu->path, cu->device_count);
#endif
}

static void comm_free(struct weft_comm *c)
{
    if (c->pipes)   /* a create that failed after making them: no pipe is open */
        (void)weft_msgpipes_destroy(c->pipes);
    c->pipes = NULL;
    if (c->stream)
        weft_stream_destroy(c->stream);
    weft_coll_fini(&c->coll);
    weft_p2p_destroy(c->p2p);
    weft_signals_fini(&c->core);   /* after the final barrier: peers let go of it before */
    weft_devcopy_fini(&c->core);
    if (c->boot)
        c->boot->ops->destroy(c->boot);
    free(c->cards);
    weft_core_fini(&c->core);
    free(c);
}

int weft_comm_assemble(const char *what, weft_bootstrap_make_fn make, void *make_arg,
                       const struct weft_settings *settings, struct weft_comm **out)
{
    struct weft_comm *c;
    struct weft_card_hdr mine;
    struct weft_tp_collective coll;
    char cfg_err[256] = "";
    struct gather_scratch g = { NULL, 0 };
    unsigned mask = 0;
    int rc, *node = NULL;

    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_NO_MEMORY, "%s: no memory for the comm", what);
    c->what = what;
    weft_core_init(&c->core, -1, 0);
    /* The comm keeps its own copy: a split inherits it, and the caller's
     * array may be gone once the call returns. */
    rc = weft_settings_dup(settings, &c->core.settings);
    if (rc != WEFT_SUCCESS) {
        weft_core_fini(&c->core);
        free(c);
        return weft_set_error(NULL, rc, "%s: no memory for the comm's settings", what);
    }
    rc = make(make_arg, &c->core, &c->boot);
    if (rc != WEFT_SUCCESS)
        goto fail;
    c->core.rank = c->boot->rank;
    c->core.size = c->boot->size;

    rc = weft_config_load(&c->core.cfg, weft_settings_lookup, c->core.settings, cfg_err, sizeof(cfg_err));
    if (rc == WEFT_SUCCESS && c->core.cfg.transports[0] != '\0' &&
        weft_registry_mask(c->core.cfg.transports, &mask, cfg_err, sizeof(cfg_err)) != 0) {
        char why[256];
        snprintf(why, sizeof(why), "WEFT_TRANSPORTS=%.80s: %.140s", c->core.cfg.transports, cfg_err);
        snprintf(cfg_err, sizeof(cfg_err), "%s", why);
        rc = WEFT_ERR_INVALID_ARG;
    }
    /* Refused: the level is WEFT_DEBUG's (the comm's settings', else the
     * environment's) if that one is valid, else warn (weft_config_log_level),
     * so the refusal is printed even when WEFT_DEBUG itself is what was
     * refused. */
    weft_log_set_level(rc != WEFT_SUCCESS ? weft_config_log_level(c->core.settings) : c->core.cfg.log_level);
    if (rc != WEFT_SUCCESS)
        weft_set_error_at(&c->core, rc, what, -1, "bad configuration: %s", cfg_err);
    if (c->core.cfg.transports[0] == '\0')
        mask = weft_registry_mask_all();

    /* Every buffer the set-up's gathers need, before the first of them:
     * from here on only a rank's own step can fail, and each gather carries
     * that as its agreement (allgather_agreed), so the common path costs
     * six collectives after the bootstrap's own set-up: settings, an
     * agreement, card headers, whole cards, the transports' choice, and the
     * final agreement on connecting them and setting up the collectives. */
    c->card_bytes = weft_p2p_card_bytes();
    g.rec = gather_rec(c->card_bytes);
    if (gather_rec(SETTINGS_N * sizeof(int64_t)) > g.rec)
        g.rec = gather_rec(SETTINGS_N * sizeof(int64_t));
    if (gather_rec(sizeof(mine)) > g.rec)
        g.rec = gather_rec(sizeof(mine));
    c->cards = calloc((size_t)c->core.size, c->card_bytes);
    g.buf = malloc(((size_t)c->core.size + 1) * g.rec);
    if (rc == WEFT_SUCCESS && (c->cards == NULL || g.buf == NULL))
        rc = weft_set_error_at(&c->core, WEFT_ERR_NO_MEMORY, what, -1, "no memory for %d peers", c->core.size);
    if (g.buf == NULL) {
        /* Too little memory for the scratch: agree on that alone (a gather
         * needs the scratch), so no rank waits in a gather the others skip. */
        rc = agree(c, rc, "allocating peers");
        if (rc == WEFT_SUCCESS)
            rc = WEFT_ERR_INTERNAL;
        goto fail;
    }
    rc = check_settings_agree(c, &g, rc, mask);
    if (rc != WEFT_SUCCESS)
        goto fail_scratch;

    /* This rank's card header, then everyone's. */
    memset(&mine, 0, sizeof(mine));
    gethostname(mine.hostname, sizeof(mine.hostname) - 1);
    mine.node_key = host_key(mine.hostname);
    mine.token = random_token();
    mine.pid = (int32_t)getpid();
    mine.transports_mask = mask;
    if (c->core.cfg.virtual_nodes > 0) {
        int k = c->core.cfg.virtual_nodes < c->core.size ? c->core.cfg.virtual_nodes : c->core.size;
        mine.vblock = (int32_t)(((long long)c->core.rank * k) / c->core.size);
    }
    /* An agreement of its own first: a rank lost here (the point where
     * mpi_tests/test_create_faults.cc stops or kills one) is then named and
     * bounded by WEFT_TIMEOUT the way every bootstrap's agreement does it
     * (their allgathers report a lost member less precisely). */
    rc = agree(c, WEFT_SUCCESS, "exchanging rank cards");
    if (rc == WEFT_SUCCESS)
        rc = allgather_agreed(c, &g, WEFT_SUCCESS, "exchanging rank cards", &mine, NULL, sizeof(mine));
    for (int r = 0; rc == WEFT_SUCCESS && r < c->core.size; r++)
        memcpy(card_hdr(c, r), g.buf + (size_t)r * g.rec + 8, sizeof(mine));
    if (rc != WEFT_SUCCESS)
        goto fail_scratch;
    number_nodes(c);
    load_cuda(c);

    /* The pipe layer offers its transports: their blobs in this rank's
     * card; whether that worked travels with the card. */
    rc = weft_p2p_create(&c->core, &c->p2p);
    if (rc == WEFT_SUCCESS)
        rc = weft_p2p_offer(c->p2p, c->cards);
    memcpy(&mine, card_hdr(c, c->core.rank), sizeof(mine));
    rc = allgather_agreed(c, &g, rc, "preparing transports", c->cards + (size_t)c->core.rank * c->card_bytes,
                          c->cards, c->card_bytes);
    if (rc != WEFT_SUCCESS)
        goto fail_scratch;
    number_nodes(c);

    /* Transports chosen and connected, then the layers above the pipes:
     * all local after the choice's exchange, agreed once at the end. */
    coll.arg = c;
    coll.alltoall = coll_alltoall;
    coll.agree = coll_agree;
    /* collective: every rank calls it; the scratch holds 2 words per rank */
    rc = weft_p2p_connect(c->p2p, c->cards, &coll, g.buf);
    free(g.buf);
    g.buf = NULL;
    if (rc == WEFT_SUCCESS)
        rc = weft_devcopy_init(&c->core);
    node = rc == WEFT_SUCCESS ? calloc((size_t)c->core.size, sizeof(*node)) : NULL;
    if (rc == WEFT_SUCCESS && node == NULL)
        rc = weft_set_error_at(&c->core, WEFT_ERR_NO_MEMORY, what, -1, "no memory for %d peers", c->core.size);
    for (int r = 0; node && r < c->core.size; r++)
        node[r] = card_hdr(c, r)->node;
    if (rc == WEFT_SUCCESS)
        rc = weft_coll_init(&c->coll, c->p2p, &c->core, node);
    /* What device buffers need from CUDA -- the staging slots, the eager
     * bounce buffer -- allocated now: pinned allocations wait for the
     * device, which a stream-ordered call must not make its caller do
     * behind a busy stream, and weft's threads must never do. */
    if (rc == WEFT_SUCCESS && c->core.cuda)
        weft_p2p_prepare_device(c->p2p);
    if (rc == WEFT_SUCCESS)
        rc = weft_stream_create(&c->core, c->p2p, &c->coll, &c->stream);
    if (rc == WEFT_SUCCESS)
        rc = weft_msgpipes_create(c->p2p, &c->pipes);
    /* WEFT_PROGRESS_THREAD=1: the comm's progress thread, now that the
     * pipes are connected (p2p/engine.h). */
    if (rc == WEFT_SUCCESS)
        rc = weft_engine_start(weft_p2p_engine(c->p2p));
    free(node);
    rc = agree(c, rc, "connecting transports and setting up collectives");
    if (rc != WEFT_SUCCESS)
        goto fail;
    /* What only create needed (a unique id's meeting point) goes now. */
    if (c->boot->ops->created)
        c->boot->ops->created(c->boot);
    *out = c;
    return WEFT_SUCCESS;

fail_scratch:
    free(g.buf);
fail:
    /* The step that failed logged its message at warn (weft_set_error), on
     * every rank (agree); logging it again would print each failure twice.
     * Only a path that recorded nothing is said here. */
    if (c->core.err.code == WEFT_SUCCESS && c->core.err.text[0] == '\0')
        WEFT_WARN(c->core.rank, "%s failed: %s", what, weft_err_str(rc));
    {
        int rc2 = rc;
        /* The comm is gone after this: its text lives on in weft_last_error(). */
        weft_error_keep(&c->core, what, rc2);
        comm_free(c);
        return rc2;
    }
}

static int make_mpi_boot(void *arg, struct weft_core *core, struct weft_bootstrap **out)
{
    return weft_bootstrap_mpi_create(*(weft_mpi_comm_t *)arg, core, out);
}

int weft_comm_create_mpi(weft_mpi_comm_t mpi_comm, const struct weft_settings *settings, struct weft_comm **out)
{
    int rc = weft_bootstrap_mpi_check(mpi_comm);
    if (rc != WEFT_SUCCESS)
        return rc;
    return weft_comm_assemble("weft_comm_create", make_mpi_boot, &mpi_comm, settings, out);
}

/* destroy's final barrier over the bootstrap (MPI's), watched by weft: a
 * rank found failed meanwhile (a same-host peer's process seen dead) ends
 * the wait, and so does WEFT_TIMEOUT once some link of this rank is down
 * (its peer may be gone where no check of ours can see it). A healthy but
 * slow peer is waited for, as MPI would. The pipes are not progressed
 * here: a peer that completed the barrier closes its sockets, and that EOF
 * must not read as a link failure. */
#define FINAL_BARRIER_PEER_FAILED (-1)   /* not a weft error code (those are >= 0) */
struct final_watch {
    struct weft_comm   *c;
    double              start;
    struct weft_backoff bo;
};

static int final_barrier_give_up(void *arg)
{
    struct final_watch *w = arg;
    struct weft_p2p *p = w->c->p2p;
    char who[200];

    /* The policy's phases (src/core/backoff.h): with every rank in
     * destroy the barrier ends in microseconds; then naps up to 1.28 ms. */
    weft_backoff_idle(&w->bo, weft_now(), 1280);
    if (weft_p2p_watch_processes(p))
        return FINAL_BARRIER_PEER_FAILED;
    if (weft_wait_expired(&w->c->core.cfg, WEFT_WAIT_DESTROY, w->start, weft_now()) &&
        weft_p2p_broken_links(p, who, sizeof(who)) > 0)
        return weft_set_error(&w->c->core, WEFT_ERR_TIMEOUT, "weft_comm_destroy: the final barrier did not "
                              "complete within WEFT_TIMEOUT=%g s while %s; destroy ends without it",
                              weft_wait_bound(&w->c->core.cfg, WEFT_WAIT_DESTROY), who);
    return WEFT_SUCCESS;
}

int weft_comm_destroy_all(struct weft_comm *c)
{
    int rc, qrc, brc = WEFT_SUCCESS;
    int was_aborted = __atomic_load_n(&c->core.aborted, __ATOMIC_ACQUIRE);
    int prc;

    /* The journal as the comm ends (WEFT_TRACE): what each rank last did. */
    if (c->core.cfg.trace_dir[0])
        (void)weft_journal_write(&c->coll, "weft_comm_destroy", 0);
    /* Message pipes still open close first (their peers answer, being in
     * destroy too), and their callbacks run here. */
    prc = weft_msgpipes_destroy(c->pipes);
    c->pipes = NULL;
    /* Stream-ordered operations still queued finish (or time out) first:
     * the progress thread must be gone before pipes are torn down. */
    qrc = c->stream ? weft_stream_quiesce(c->stream) : WEFT_SUCCESS;
    /* Their clients gone, the comm's progress thread goes too: what
     * follows is driven by this thread alone (the final barrier must not
     * see the pipes progressed: a peer's EOF there is no failure). */
    weft_engine_stop(weft_p2p_engine(c->p2p));
    /* Non-blocking collectives never completed: given up, their handles
     * failed by the drain (which says how many). */
    weft_coll_nb_abandon_all(&c->coll);
    rc = weft_p2p_drain(c->p2p);
    /* What this rank mapped of its peers' memory goes before the barrier:
     * a peer frees what it exported right after it. */
    weft_p2p_detach(c->p2p);
    if (rc == WEFT_SUCCESS)
        rc = qrc;
    if (rc == WEFT_SUCCESS && !was_aborted)
        rc = prc;
    /* The final barrier keeps a rank from tearing down what a peer still
     * reads; a failed rank would never join it, and after an abort peers
     * are not waited for: then destroy is local. */
    if (was_aborted)
        WEFT_INFO(c->core.rank, "weft_comm_destroy: the comm was aborted: local, no final barrier");
    else if (weft_p2p_any_failed(c->p2p))
        (void)weft_p2p_survivor_barrier(c->p2p);   /* over the pipes: MPI's would wait for the failed rank */
    else if (__atomic_load_n(&c->core.revoked, __ATOMIC_ACQUIRE))
        /* Revoked: a rank may have failed without this one knowing, and
         * MPI's barrier would wait for it for good; the pipes' is bounded. */
        brc = weft_p2p_survivor_barrier(c->p2p);
    else if (c->boot->ops->barrier) {
        struct final_watch w = { .c = c, .start = weft_now() };
        weft_backoff_init(&w.bo, &c->core);
        brc = c->boot->ops->barrier(c->boot, final_barrier_give_up, &w);
        if (brc == FINAL_BARRIER_PEER_FAILED) {
            /* Some rank failed while this one waited: the others that know
             * it are in the survivors' barrier (or get there the same way). */
            WEFT_INFO(c->core.rank, "weft_comm_destroy: a rank failed during the final barrier: the survivors' "
                      "barrier instead");
            (void)weft_p2p_survivor_barrier(c->p2p);
            brc = WEFT_SUCCESS;
        }
    } else   /* a bootstrap that lives only through create: the pipes carry it */
        brc = weft_p2p_survivor_barrier(c->p2p);
    if (rc == WEFT_SUCCESS)
        rc = brc;
    if (was_aborted)
        rc = WEFT_ERR_ABORTED;
    if (rc != WEFT_SUCCESS)
        weft_error_keep(&c->core, "weft_comm_destroy", rc);   /* the comm and its last error go */
    comm_free(c);
    return rc;
}

int weft_comm_abort_all(struct weft_comm *c)
{
    /* The stream engine's thread sees the pipes break like any waiter. */
    weft_p2p_abort(c->p2p);
    weft_set_error(&c->core, WEFT_ERR_ABORTED, "weft_comm_abort: rank %d aborted the comm; every call on it now "
                   "returns WEFT_ERR_ABORTED", c->core.rank);
    return WEFT_SUCCESS;
}

/* ---- weft_comm_split ---- */

/* What every rank of the parent contributes: the magic and the split id
 * tell a split's allgather from a user's allgather of the same size that
 * another rank called instead (the collective fingerprint compares only
 * kind and size). */
#define SPLIT_REC_MAGIC 0x7765667473706c74ull   /* "weftsplt" */
struct split_rec {
    uint64_t magic;
    int32_t  color;   /* < 0: joins none */
    int32_t  key;
    uint32_t id;      /* the parent's collective count before the split */
    uint32_t pad;
};

struct split_make {
    struct weft_p2p *parent;
    int             *members;   /* parent ranks, in new-rank order */
    int              size, rank;
    uint32_t         id;
};

static int make_split_boot(void *arg, struct weft_core *core, struct weft_bootstrap **out)
{
    struct split_make *m = arg;
    return weft_bootstrap_split_create(m->parent, m->members, m->size, m->rank, m->id, core, out);
}

/* New-rank order: key, then parent rank. */
static int split_order(const void *a, const void *b)
{
    const int *x = a, *y = b;   /* {key, parent rank} */
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

int weft_comm_split_all(struct weft_comm *parent, int color, int key, const struct weft_settings *settings,
                        struct weft_comm **out)
{
    const int psize = parent->core.size, prank = parent->core.rank;
    struct split_rec mine, *all;
    struct split_make m = { parent->p2p, NULL, 0, -1, 0 };
    int rc, (*order)[2] = NULL;

    /* The parent's collectives run in the same order everywhere, so their
     * count names this split identically on every rank. */
    m.id = __atomic_load_n(&parent->coll.seq, __ATOMIC_RELAXED);
    memset(&mine, 0, sizeof(mine));
    mine.magic = SPLIT_REC_MAGIC;
    mine.color = color < 0 ? -1 : color;
    mine.key = key;
    mine.id = m.id;
    all = calloc((size_t)psize, sizeof(*all));
    if (all == NULL)
        return weft_set_error(&parent->core, WEFT_ERR_NO_MEMORY, "weft_comm_split: no memory for %d ranks", psize);
    /* One collective on the parent: ordered, fingerprint-checked and
     * failure-agreed like any other, of a kind no user call has: a rank
     * that called weft_allgather of the same size here fails with
     * WEFT_ERR_MISMATCH, instead of taking these records for its data. */
    struct weft_coll_args a = { WEFT_COLL_SPLIT_EXCHANGE, &mine, all, sizeof(mine), -1, -1, -1, NULL, NULL };
    rc = weft_coll_run(&parent->coll, &a);
    if (rc != WEFT_SUCCESS) {
        /* The collective's text names the rank that failed, not the call
         * the user made: say it (in place: the collective logged it). */
        char why[700];
        struct weft_error e = { .code = rc, .rank = prank, .peer = -1, .op = "weft_comm_split" };
        last_reason(&parent->core, "weft_comm_split", rc, why, sizeof(why));
        snprintf(e.text, sizeof(e.text), "the parent's allgather of the members' colors failed: %s", why);
        weft_error_put(&parent->core, &e);
    }
    for (int r = 0; rc == WEFT_SUCCESS && r < psize; r++)
        if (all[r].magic != SPLIT_REC_MAGIC)
            rc = weft_set_error(&parent->core, WEFT_ERR_MISMATCH,
                                "weft_comm_split: rank %d called another collective (an allgather of %zu B/rank) "
                                "where this rank called weft_comm_split", r, sizeof(mine));
        else if (all[r].id != m.id)
            rc = weft_set_error(&parent->core, WEFT_ERR_MISMATCH,
                                "weft_comm_split: rank %d is at collective #%u of the comm, this rank at #%u "
                                "(ranks out of step)", r, all[r].id, m.id);
    if (rc != WEFT_SUCCESS || color < 0)
        goto out;   /* WEFT_SPLIT_NONE: this rank joins no new comm */

    order = malloc((size_t)psize * sizeof(*order));
    m.members = malloc((size_t)psize * sizeof(*m.members));
    if (order == NULL || m.members == NULL) {
        /* The other members wait for this rank in the new comm's set-up
         * and fail there, within WEFT_TIMEOUT, naming it. */
        rc = weft_set_error(&parent->core, WEFT_ERR_NO_MEMORY, "weft_comm_split: no memory for %d ranks", psize);
        goto out;
    }
    for (int r = 0; r < psize; r++)
        if (all[r].color == color) {
            order[m.size][0] = all[r].key;
            order[m.size][1] = r;
            m.size++;
        }
    qsort(order, (size_t)m.size, sizeof(*order), split_order);
    for (int i = 0; i < m.size; i++) {
        m.members[i] = order[i][1];
        if (order[i][1] == prank)
            m.rank = i;
    }
    WEFT_INFO(prank, "weft_comm_split: color %d key %d: rank %d of %d in the new comm", color, key, m.rank, m.size);
    /* The new comm takes its parent's configuration, settings given to
     * the split on top. */
    struct weft_settings *merged = NULL;
    rc = weft_settings_merge(parent->core.settings, settings, &merged);
    if (rc != WEFT_SUCCESS)
        rc = weft_set_error(&parent->core, rc, "weft_comm_split: no memory for the new comm's settings");
    else
        rc = weft_comm_assemble("weft_comm_split", make_split_boot, &m, merged, out);
    weft_settings_free(merged);
    if (rc == WEFT_SUCCESS && *out != NULL)
        weft_core_set_parent(&(*out)->core, m.members, m.size);   /* texts name the parent's numbers too */
    if (rc != WEFT_SUCCESS) {
        /* The new comm is gone and its text is this thread's
         * (weft_last_error); the parent's last error says it too, since
         * the call was made on the parent. */
        struct weft_error inner, e = { .code = rc, .rank = prank, .peer = -1, .op = "weft_comm_split" };
        char reason[700];   /* room for the sentence around it in e.text */
        weft_error_thread_get(&inner);
        weft_error_reason(&inner, reason, sizeof(reason));
        if (inner.code != WEFT_SUCCESS)
            e.code = inner.code;
        if (inner.rank >= 0)
            snprintf(e.text, sizeof(e.text), "the new comm's set-up failed (this rank is rank %d of %d there): "
                     "rank %d: %s", m.rank, m.size, inner.rank, reason);
        else
            snprintf(e.text, sizeof(e.text), "the new comm's set-up failed (this rank is rank %d of %d there): %s",
                         m.rank, m.size, reason);
        weft_error_put(&parent->core, &e);
        goto done;
    }

out:
    /* A failure of the parent's step is the parent's last error; it is
     * also this thread's, as for every failed creation. */
    if (rc != WEFT_SUCCESS)
        weft_error_keep(&parent->core, "weft_comm_split", rc);
done:
    free(m.members);
    free(order);
    free(all);
    if (rc == WEFT_SUCCESS && color < 0)
        *out = NULL;
    return rc;
}
