/*
 * Communicators of the NCCL face: one weft comm each, made from NCCL's
 * unique id (weft_get_unique_id / weft_comm_init: both are 128 opaque
 * bytes carried by the application) or by weft_comm_split.
 *
 * Life of a comm:
 *   ncclCommInitRank ---------------------------> READY   (blocking)
 *   ncclCommInitRankConfig(blocking=0) -> INITING -(init thread)-> READY|FAILED
 *   ncclCommInitRank inside a group ----> INITING -(outermost ncclGroupEnd)-> READY|FAILED
 *   READY --ncclCommFinalize--> FINALIZED; any state --Destroy/Abort--> freed
 * An init that failed leaves a FAILED shell only for a non-blocking or
 * grouped init (the application holds its handle and learns the error
 * from ncclCommGetAsyncError); a blocking init that fails returns the
 * error and no comm.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "nccl_adapter.h"

struct nccl_reg {
    struct nccl_reg *next;
    void            *buf;
    size_t           size;
};

/* ---- cliques: the ranks of one comm that live in this process ----
 *
 * weft_comm_destroy is collective (a final barrier), while NCCL's
 * ncclCommDestroy is not: a process holding several ranks of one comm
 * (ncclCommInitAll, a group of inits) destroys them one after the other
 * from one thread, as nccl-tests does. So while other ranks of the same
 * comm are still alive in this process, a destroy runs in a thread of its
 * own and the call returns; the destroy of the last of them runs in the
 * caller, then joins the others and returns the first error of all. A
 * comm's ranks in this process are found by what made them: the unique id
 * (init), or the parent's clique, which split of it, and the color (split). */
struct nccl_clique {
    struct nccl_clique *next;
    unsigned char       key[sizeof(ncclUniqueId) + 32];
    size_t              keylen;
    int                 live;        /* members not destroyed yet */
    int                 nthreads, cap;
    pthread_t          *threads;     /* destroys running in the background */
    ncclResult_t        err;         /* first error of those */
    char                errtext[1024];
};

static pthread_mutex_t     g_cliques_mu = PTHREAD_MUTEX_INITIALIZER;
static struct nccl_clique *g_cliques;

static struct nccl_clique *clique_join(const void *key, size_t keylen)
{
    struct nccl_clique *q;
    pthread_mutex_lock(&g_cliques_mu);
    for (q = g_cliques; q; q = q->next)
        if (q->keylen == keylen && memcmp(q->key, key, keylen) == 0)
            break;
    if (q == NULL && (q = calloc(1, sizeof(*q))) != NULL) {
        memcpy(q->key, key, keylen);
        q->keylen = keylen;
        q->next = g_cliques;
        g_cliques = q;
    }
    if (q)
        q->live++;
    pthread_mutex_unlock(&g_cliques_mu);
    return q;   /* NULL (no memory): the comm is destroyed in the caller, as a lone rank */
}

static void comm_join_clique(struct ncclComm *c)
{
    unsigned char key[sizeof(((struct nccl_clique *)0)->key)];
    size_t len;
    if (c->init_kind == 0) {
        key[0] = 'I';
        memcpy(key + 1, c->init_id.internal, sizeof(c->init_id.internal));
        len = 1 + sizeof(c->init_id.internal);
    } else {
        const void *parent = c->split_parent->clique;
        key[0] = 'S';
        memcpy(key + 1, &parent, sizeof(parent));
        memcpy(key + 1 + sizeof(parent), &c->split_seq, sizeof(int));
        memcpy(key + 1 + sizeof(parent) + sizeof(int), &c->split_color, sizeof(int));
        len = 1 + sizeof(parent) + 2 * sizeof(int);
    }
    c->clique = clique_join(key, len);
}

static void *background_destroy(void *arg)
{
    struct ncclComm *c = arg;
    struct nccl_clique *q = c->clique;
    struct nccl_devguard g;
    int e;
    nccl_dev_enter(c, &g, "ncclCommDestroy");
    e = weft_comm_destroy(c->w);
    if (e != WEFT_SUCCESS) {
        const char *why = weft_last_error();
        pthread_mutex_lock(&g_cliques_mu);
        if (q->err == ncclSuccess) {
            q->err = nccl_code_of_weft(e);
            snprintf(q->errtext, sizeof(q->errtext), "rank %d of %d (destroyed in the background): %s (%s)",
                     c->rank, c->nranks, why && *why ? why : "weft_comm_destroy failed", weft_strerror(e));
        }
        pthread_mutex_unlock(&g_cliques_mu);
    }
    c->w = NULL;
    nccl_shell_free(c);
    return NULL;
}

/* Leaves c's clique. Returns 1 when c's destroy was started in the
 * background (other members live on); 0 when the caller destroys it. */
static int clique_defer_destroy(struct ncclComm *c)
{
    struct nccl_clique *q = c->clique;
    int deferred = 0;
    if (q == NULL)
        return 0;
    pthread_mutex_lock(&g_cliques_mu);
    if (q->live > 1 && (q->nthreads < q->cap || (q->cap = q->cap ? 2 * q->cap : 4,
                                                   q->threads = realloc(q->threads, (size_t)q->cap *
                                                                        sizeof(pthread_t))) != NULL)) {
        if (pthread_create(&q->threads[q->nthreads], NULL, background_destroy, c) == 0) {
            q->nthreads++;
            q->live--;
            deferred = 1;
        }
    }
    pthread_mutex_unlock(&g_cliques_mu);
    return deferred;
}

/* The caller destroyed a member itself: when it was the last, joins the
 * background destroys and frees the clique; their first error. */
static ncclResult_t clique_leave(struct nccl_clique *q, const char *fn)
{
    struct nccl_clique **pp;
    ncclResult_t rc = ncclSuccess;
    if (q == NULL)
        return ncclSuccess;
    pthread_mutex_lock(&g_cliques_mu);
    if (--q->live > 0) {
        pthread_mutex_unlock(&g_cliques_mu);
        return ncclSuccess;
    }
    for (pp = &g_cliques; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    pthread_mutex_unlock(&g_cliques_mu);
    /* Nobody else can reach q now: its threads only touch q->err under the lock. */
    for (int i = 0; i < q->nthreads; i++)
        pthread_join(q->threads[i], NULL);
    if (q->err != ncclSuccess)
        rc = nccl_fail(NULL, q->err, fn, "%s", q->errtext);
    free(q->threads);
    free(q);
    return rc;
}

NCCL_API(ncclResult_t, ncclGetVersion, int *version)
{
    if (version == NULL)
        return nccl_fail(NULL, ncclInvalidArgument, "ncclGetVersion", "version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId)
{
    weft_unique_id_t id;
    int rc;
    nccl_env_apply();
    if (uniqueId == NULL)
        return nccl_fail(NULL, ncclInvalidArgument, "ncclGetUniqueId", "uniqueId is NULL");
    weft_config_t cfg = WEFT_CONFIG_INITIALIZER;
    cfg.nsettings = nccl_env_settings(&cfg.settings);
    if ((rc = weft_get_unique_id_config(&id, &cfg)) != WEFT_SUCCESS)
        return nccl_from_weft(NULL, rc, "ncclGetUniqueId");
    _Static_assert(sizeof(id.internal) == sizeof(uniqueId->internal), "unique id sizes differ");
    memcpy(uniqueId->internal, id.internal, sizeof(id.internal));
    return ncclSuccess;
}

ncclResult_t nccl_comm_ready(const struct ncclComm *c, const char *fn)
{
    int state;
    if (c == NULL)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "comm is NULL");
    if (c->magic != NCCLW_COMM_MAGIC)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "comm %p is not a live communicator (destroyed?)",
                         (const void *)c);
    state = __atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
    switch (state) {
    case COMM_READY:
        return ncclSuccess;
    case COMM_INITING:
        return nccl_fail(NULL, ncclInvalidUsage, fn,
                         "comm %p is still being initialised (poll ncclCommGetAsyncError until ncclSuccess, or "
                         "end the group that initialises it first)", (const void *)c);
    case COMM_FAILED:
        return nccl_fail(NULL, ncclInvalidUsage, fn, "comm %p failed to initialise: %s", (const void *)c,
                         c->init_error);
    default:
        return nccl_fail(c, ncclInvalidUsage, fn, "comm was finalized (ncclCommFinalize); only "
                         "ncclCommDestroy may follow");
    }
}

static struct ncclComm *shell_new(int nranks, int rank, int device)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->magic = NCCLW_COMM_MAGIC;
    pthread_mutex_init(&c->mu, NULL);
    c->nranks = nranks;
    c->rank = rank;
    c->device = device;
    c->blocking = 1;
    c->state = COMM_INITING;
    const weft_setting_t *env;
    c->nsettings = nccl_env_settings(&env);
    memcpy(c->settings, env, c->nsettings * sizeof(*env));
    return c;
}

void nccl_shell_free(struct ncclComm *c)
{
    struct nccl_reg *r, *next;
    nccl_premul_reap(c, 1);
    for (r = c->regs; r; r = next) {
        next = r->next;
        free(r);
    }
    free(c->ops);
    free(c->shrink_exclude);
    pthread_mutex_destroy(&c->mu);
    c->magic = 0;
    free(c);
}

/* The config fields weft reads, and the ones it ignores (named once). */
static ncclResult_t read_config(struct ncclComm *c, const ncclConfig_t *config, const char *fn)
{
    if (config == NULL)
        return ncclSuccess;
    if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
        return nccl_fail(NULL, ncclInvalidArgument, fn,
                         "config was not made with NCCL_CONFIG_INITIALIZER (magic 0x%x, size %zu)", config->magic,
                         config->size);
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
        if (config->blocking != 0 && config->blocking != 1)
            return nccl_fail(NULL, ncclInvalidArgument, fn, "config blocking=%d: expected 0 or 1", config->blocking);
        c->blocking = config->blocking;
    }
    if (config->size >= offsetof(ncclConfig_t, commName) + sizeof(const char *) && config->commName != NULL)
        snprintf(c->name, sizeof(c->name), "%s", config->commName);
#define IGNORED_INT(field)                                                                                   \
    if (config->size >= offsetof(ncclConfig_t, field) + sizeof(int) && config->field != NCCL_CONFIG_UNDEF_INT) \
        nccl_log(NCCLW_LOG_INFO, c->device, "%s: config " #field "=%d ignored (no weft equivalent)", fn, config->field);
    IGNORED_INT(cgaClusterSize)
    IGNORED_INT(minCTAs)
    IGNORED_INT(maxCTAs)
    IGNORED_INT(splitShare)
    IGNORED_INT(trafficClass)
    IGNORED_INT(collnetEnable)
    IGNORED_INT(CTAPolicy)
    IGNORED_INT(shrinkShare)
    IGNORED_INT(nvlsCTAs)
    IGNORED_INT(nChannelsPerNetPeer)
    IGNORED_INT(nvlinkCentricSched)
#undef IGNORED_INT
    if (config->netName != NULL && strcasecmp(config->netName, "Socket") == 0 && getenv("WEFT_TRANSPORTS") == NULL) {
        /* Sockets only: this comm's WEFT_TRANSPORTS without ib. */
        const char *from = "self,shm,tcp,ib";
        size_t at = c->nsettings;
        for (size_t i = 0; i < c->nsettings; i++)
            if (strcmp(c->settings[i].name, "WEFT_TRANSPORTS") == 0) {
                from = c->settings[i].value;
                at = i;
            }
        char list[64], *save = NULL, *tok;
        snprintf(list, sizeof(list), "%s", from);
        c->transports[0] = '\0';
        for (tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save))
            if (strcasecmp(tok, "ib") != 0)
                snprintf(c->transports + strlen(c->transports), sizeof(c->transports) - strlen(c->transports),
                         "%s%s", c->transports[0] ? "," : "", tok);
        c->settings[at].name = "WEFT_TRANSPORTS";
        c->settings[at].value = c->transports;
        if (at == c->nsettings)
            c->nsettings++;
        nccl_log(NCCLW_LOG_INFO, c->device, "%s: config netName=%s -> WEFT_TRANSPORTS=%s for this comm", fn,
                 config->netName, c->transports);
    } else if (config->netName != NULL) {
        nccl_log(NCCLW_LOG_INFO, c->device, "%s: config netName=%s ignored (%s)", fn, config->netName,
                 getenv("WEFT_TRANSPORTS") ? "WEFT_TRANSPORTS is set and wins" : "WEFT_TRANSPORTS picks transports");
    }
    return ncclSuccess;
}

static void log_ready(const struct ncclComm *c, const char *how)
{
    nccl_log(NCCLW_LOG_INFO, c->device, "comm %p%s%s rank %d nranks %d cudaDev %d (%s, %s) - Init COMPLETE",
             (const void *)c, c->name[0] ? " " : "", c->name, c->rank, c->nranks, c->device, nccl_version_text(), how);
}

/* Runs the pending initialisation of c in this thread: READY or FAILED. */
void nccl_comm_run_init(struct ncclComm *c)
{
    const char *why = NULL;
    const struct nccl_cuda *cu = nccl_cuda(&why);
    weft_comm_t *w = NULL;
    int rc;

    if (cu != NULL && c->device >= 0)
        cu->SetDevice(c->device);   /* the device is per host thread: this one may be new */
    if (c->init_kind == 0) {
        weft_unique_id_t id;
        weft_config_t cfg = WEFT_CONFIG_INITIALIZER;
        cfg.settings = c->settings;
        cfg.nsettings = c->nsettings;
        memcpy(id.internal, c->init_id.internal, sizeof(id.internal));
        rc = weft_comm_init_config(&id, c->nranks, c->rank, &cfg, &w);
    } else if (c->init_kind == 1) {
        rc = weft_comm_split(c->split_parent->w, c->split_color, c->split_key, &w);
    } else {
        rc = weft_comm_shrink_excluding(c->split_parent->w, c->shrink_exclude, c->nshrink_exclude, &w);
    }
    if (rc != WEFT_SUCCESS) {
        const char *t = c->init_kind == 0 ? weft_last_error() : weft_comm_last_error(c->split_parent->w);
        snprintf(c->init_error, sizeof(c->init_error), "%s (%s)", t && *t ? t : "failed", weft_strerror(rc));
        c->init_result = nccl_code_of_weft(rc);
        __atomic_store_n(&c->state, COMM_FAILED, __ATOMIC_RELEASE);
    } else {
        c->w = w;
        if (w != NULL) {
            c->rank = weft_comm_rank(w);
            c->nranks = weft_comm_size(w);
        }
        c->init_result = ncclSuccess;
        if (w != NULL)
            comm_join_clique(c);
        log_ready(c, c->init_kind == 0 ? "weft_comm_init" : c->init_kind == 1 ? "weft_comm_split" : "weft_comm_shrink");
        __atomic_store_n(&c->state, COMM_READY, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&c->init_done, 1, __ATOMIC_RELEASE);
}

static void *init_thread(void *arg)
{
    nccl_comm_run_init(arg);
    return NULL;
}

/* A FAILED/READY result of a pending init, reported for fn. */
static ncclResult_t init_result(struct ncclComm *c, const char *fn)
{
    if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) == COMM_FAILED)
        return nccl_fail(NULL, c->init_result, fn, "%s", c->init_error);
    return ncclSuccess;
}

static int current_device(void)
{
    const struct nccl_cuda *cu = nccl_cuda(NULL);
    int dev = -1;
    if (cu == NULL || cu->GetDevice(&dev) != cudaSuccess)
        return -1;
    return dev;
}

/* Init by id, blocking, non-blocking or deferred to the group's end. */
static ncclResult_t init_rank(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                              const ncclConfig_t *config, const char *fn)
{
    const char *why = NULL;
    struct ncclComm *c;
    ncclResult_t rc;

    nccl_env_apply();
    if (out == NULL)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "comm is NULL");
    if (nranks < 1)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "nranks %d: must be at least 1", nranks);
    if (rank < 0 || rank >= nranks)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "rank %d: must be in [0, %d)", rank, nranks);
    if (nccl_cuda(&why) == NULL)
        return nccl_fail(NULL, ncclUnhandledCudaError, fn, "rank %d of %d: no CUDA: %s", rank, nranks, why);
    if ((c = shell_new(nranks, rank, current_device())) == NULL)
        return nccl_fail(NULL, ncclSystemError, fn, "rank %d of %d: out of memory", rank, nranks);
    if ((rc = read_config(c, config, fn)) != ncclSuccess) {
        nccl_shell_free(c);
        return rc;
    }
    c->init_kind = 0;
    c->init_id = *id;

    if (nccl_group_depth() > 0) {
        if ((rc = nccl_group_defer_init(c, fn)) != ncclSuccess) {
            nccl_shell_free(c);
            return rc;
        }
        *out = c;
        return ncclSuccess;
    }
    if (!c->blocking) {
        int e = pthread_create(&c->init_thread, NULL, init_thread, c);
        if (e != 0) {
            nccl_shell_free(c);
            return nccl_fail(NULL, ncclSystemError, fn, "rank %d of %d: cannot start the init thread: %s", rank,
                             nranks, strerror(e));
        }
        c->init_thread_live = 1;
        *out = c;
        return ncclInProgress;
    }
    nccl_comm_run_init(c);
    if ((rc = init_result(c, fn)) != ncclSuccess) {
        nccl_shell_free(c);
        return rc;
    }
    *out = c;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return init_rank(comm, nranks, &commId, rank, NULL, "ncclCommInitRank");
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
         ncclConfig_t *config)
{
    return init_rank(comm, nranks, &commId, rank, config, "ncclCommInitRankConfig");
}

NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank, int nId,
         ncclUniqueId *commIds, ncclConfig_t *config)
{
    const char *fn = "ncclCommInitRankScalable";
    if (nId != 1)
        return nccl_refuse(fn, "several unique ids (nId != 1); weft's unique id serves any number of ranks, "
                               "pass one");
    if (commIds == NULL)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "commIds is NULL");
    return init_rank(newcomm, nranks, &commIds[0], myrank, config, fn);
}

/* One rank per device of this process, each initialised in a thread of
 * its own (weft_comm_init is collective over the ranks). */
NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comms, int ndev, const int *devlist)
{
    const char *fn = "ncclCommInitAll", *why = NULL;
    const struct nccl_cuda *cu;
    struct ncclComm **cs;
    weft_unique_id_t wid;
    ncclResult_t rc = ncclSuccess;
    int ndevices = 0, e;

    nccl_env_apply();
    if (comms == NULL)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "comms is NULL");
    if (ndev < 1)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "ndev %d: must be at least 1", ndev);
    if ((cu = nccl_cuda(&why)) == NULL)
        return nccl_fail(NULL, ncclUnhandledCudaError, fn, "no CUDA: %s", why);
    if (cu->GetDeviceCount(&ndevices) != cudaSuccess)
        ndevices = 0;
    for (int i = 0; i < ndev; i++) {
        int d = devlist ? devlist[i] : i;
        if (d < 0 || d >= ndevices)
            return nccl_fail(NULL, ncclInvalidArgument, fn, "device %d (entry %d): this process sees %d device(s)", d,
                             i, ndevices);
        for (int j = 0; j < i; j++)
            if ((devlist ? devlist[j] : j) == d)
                return nccl_fail(NULL, ncclInvalidArgument, fn, "device %d is listed twice (entries %d and %d)", d,
                                 j, i);
    }
    weft_config_t cfg = WEFT_CONFIG_INITIALIZER;
    cfg.nsettings = nccl_env_settings(&cfg.settings);
    if ((e = weft_get_unique_id_config(&wid, &cfg)) != WEFT_SUCCESS)
        return nccl_from_weft(NULL, e, fn);
    if ((cs = calloc((size_t)ndev, sizeof(*cs))) == NULL)
        return nccl_fail(NULL, ncclSystemError, fn, "out of memory");
    for (int i = 0; i < ndev && rc == ncclSuccess; i++) {
        if ((cs[i] = shell_new(ndev, i, devlist ? devlist[i] : i)) == NULL) {
            rc = nccl_fail(NULL, ncclSystemError, fn, "out of memory");
            break;
        }
        memcpy(cs[i]->init_id.internal, wid.internal, sizeof(wid.internal));
    }
    for (int i = 0; i < ndev && rc == ncclSuccess; i++) {
        if ((e = pthread_create(&cs[i]->init_thread, NULL, init_thread, cs[i])) != 0) {
            /* The ranks started cannot be met: they fail after WEFT_TIMEOUT. */
            rc = nccl_fail(NULL, ncclSystemError, fn, "cannot start the init thread of rank %d: %s", i, strerror(e));
            break;
        }
        cs[i]->init_thread_live = 1;
    }
    for (int i = 0; i < ndev; i++)
        if (cs[i] && cs[i]->init_thread_live) {
            pthread_join(cs[i]->init_thread, NULL);
            cs[i]->init_thread_live = 0;
        }
    for (int i = 0; i < ndev && rc == ncclSuccess; i++)
        rc = init_result(cs[i], fn);
    if (rc != ncclSuccess) {
        /* The ranks that did come up are torn down locally: the others are gone. */
        for (int i = 0; i < ndev; i++) {
            if (cs[i] && cs[i]->w) {
                weft_comm_abort(cs[i]->w);
                weft_comm_destroy(cs[i]->w);
            }
            if (cs[i])
                nccl_shell_free(cs[i]);
        }
        free(cs);
        return rc;
    }
    for (int i = 0; i < ndev; i++)
        comms[i] = cs[i];
    free(cs);
    return ncclSuccess;
}

static ncclResult_t derived_init(struct ncclComm *comm, struct ncclComm *c, ncclComm_t *newcomm, const char *fn);

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config)
{
    const char *fn = "ncclCommSplit";
    struct ncclComm *c;
    ncclResult_t rc;

    if ((rc = nccl_comm_ready(comm, fn)) != ncclSuccess)
        return rc;
    if (newcomm == NULL)
        return nccl_fail(comm, ncclInvalidArgument, fn, "newcomm is NULL");
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return nccl_fail(comm, ncclInvalidArgument, fn, "color %d: must be >= 0 or NCCL_SPLIT_NOCOLOR", color);
    if ((c = shell_new(0, -1, comm->device)) == NULL)
        return nccl_fail(comm, ncclSystemError, fn, "out of memory");
    if ((rc = read_config(c, config, fn)) != ncclSuccess) {
        nccl_shell_free(c);
        return rc;
    }
    c->init_kind = 1;
    c->split_color = color < 0 ? WEFT_SPLIT_NONE : color;
    c->split_key = key;
    /* A rank that joins no comm still takes part; inside a group it gets
     * NULL now and the group's end frees what it ran on. */
    c->free_after_init = color < 0;
    return derived_init(comm, c, newcomm, fn);
}

/* A comm made from comm (split, shrink): collective over the parent, so
 * inside a group several of them by one thread (a rank per device) run
 * side by side at the group's end; else now. c is the shell, filled but
 * for its place among the parent's derived comms; freed on failure. */
static ncclResult_t derived_init(struct ncclComm *comm, struct ncclComm *c, ncclComm_t *newcomm, const char *fn)
{
    ncclResult_t rc;
    c->split_parent = comm;
    pthread_mutex_lock(&comm->mu);
    c->split_seq = comm->nsplits++;   /* names the new comm's clique */
    pthread_mutex_unlock(&comm->mu);
    if (nccl_group_depth() > 0) {
        if ((rc = nccl_group_defer_init(c, fn)) != ncclSuccess) {
            nccl_shell_free(c);
            return rc;
        }
        *newcomm = c->free_after_init ? NULL : c;
        return ncclSuccess;
    }
    nccl_comm_run_init(c);
    if ((rc = init_result(c, fn)) != ncclSuccess) {
        nccl_shell_free(c);
        return rc;
    }
    if (c->w == NULL) {   /* NCCL_SPLIT_NOCOLOR: joins no comm */
        nccl_shell_free(c);
        *newcomm = NULL;
        return ncclSuccess;
    }
    *newcomm = c;
    return ncclSuccess;
}

/* weft_comm_revoke: every pending and later operation of every rank on
 * the comm fails (ncclRemoteError, the text naming the rank that revoked);
 * ncclCommShrink and ncclCommDestroy still work. */
NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags)
{
    const char *fn = "ncclCommRevoke";
    ncclResult_t rc;
    if ((rc = nccl_comm_ready(comm, fn)) != ncclSuccess)
        return rc;
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
        return nccl_fail(comm, ncclInvalidArgument, fn, "revokeFlags %d: must be NCCL_REVOKE_DEFAULT (0)",
                         revokeFlags);
    int e = weft_comm_revoke(comm->w);
    return e == WEFT_SUCCESS ? ncclSuccess : nccl_from_weft(comm, e, fn);
}

/* weft_comm_shrink_excluding over the parent's pipes: the excluded ranks
 * do not call; the others agree (weft adds any rank it knows failed) and
 * get a comm of the rest in the parent's order. weft revokes the parent
 * first whatever the flag: NCCL_SHRINK_DEFAULT asks a quiescent parent,
 * where that changes nothing, and NCCL_SHRINK_ABORT asks for it. */
NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
         ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    const char *fn = "ncclCommShrink";
    struct ncclComm *c;
    ncclResult_t rc;

    if ((rc = nccl_comm_ready(comm, fn)) != ncclSuccess)
        return rc;
    if (newcomm == NULL)
        return nccl_fail(comm, ncclInvalidArgument, fn, "newcomm is NULL");
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
        return nccl_fail(comm, ncclInvalidArgument, fn, "shrinkFlags %d: NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT",
                         shrinkFlags);
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == NULL))
        return nccl_fail(comm, ncclInvalidArgument, fn, "excludeRanksCount %d with %s list", excludeRanksCount,
                         excludeRanksList == NULL ? "a NULL" : "a");
    for (int i = 0; i < excludeRanksCount; i++)
        if (excludeRanksList[i] < 0 || excludeRanksList[i] >= comm->nranks || excludeRanksList[i] == comm->rank)
            return nccl_fail(comm, ncclInvalidArgument, fn, "excludeRanksList[%d] = %d is %s", i,
                             excludeRanksList[i], excludeRanksList[i] == comm->rank
                                                      ? "this rank (an excluded rank does not call ncclCommShrink)"
                                                      : "not a rank of the comm");
    if ((c = shell_new(0, -1, comm->device)) == NULL)
        return nccl_fail(comm, ncclSystemError, fn, "out of memory");
    if ((rc = read_config(c, config, fn)) != ncclSuccess) {
        nccl_shell_free(c);
        return rc;
    }
    if (excludeRanksCount > 0) {
        c->shrink_exclude = malloc((size_t)excludeRanksCount * sizeof(int));
        if (c->shrink_exclude == NULL) {
            nccl_shell_free(c);
            return nccl_fail(comm, ncclSystemError, fn, "out of memory");
        }
        memcpy(c->shrink_exclude, excludeRanksList, (size_t)excludeRanksCount * sizeof(int));
    }
    c->nshrink_exclude = excludeRanksCount;
    c->init_kind = 2;
    c->split_color = 0;
    c->split_key = 0;
    return derived_init(comm, c, newcomm, fn);
}

/* Waits for a pending init thread (bounded by weft's own WEFT_TIMEOUT). */
static void join_init(struct ncclComm *c)
{
    if (c->init_thread_live) {
        pthread_join(c->init_thread, NULL);
        c->init_thread_live = 0;
    }
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm)
{
    ncclResult_t rc = nccl_comm_ready(comm, "ncclCommFinalize");
    if (rc != ncclSuccess)
        return rc;
    __atomic_store_n(&comm->state, COMM_FINALIZED, __ATOMIC_RELEASE);
    return ncclSuccess;
}

static ncclResult_t destroy(ncclComm_t comm, int abort, const char *fn)
{
    struct nccl_clique *q;
    ncclResult_t rc = ncclSuccess, rc2;
    int e;
    if (comm == NULL)
        return abort ? ncclSuccess : nccl_fail(NULL, ncclInvalidArgument, fn, "comm is NULL");
    if (comm->magic != NCCLW_COMM_MAGIC)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "comm %p is not a live communicator (destroyed twice?)",
                         (const void *)comm);
    /* One destroy or abort per comm: two at once (a watchdog's abort while
     * the main thread destroys) would free it twice. NCCL leaves that
     * undefined; the second is refused, and the first goes on. */
    const char *first = NULL;
    if (!__atomic_compare_exchange_n(&comm->closing, &first, fn, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return nccl_fail(NULL, ncclInvalidUsage, fn, "comm %p is already being torn down by %s in another thread; "
                         "one destroy or abort per communicator", (const void *)comm, first);
    join_init(comm);
    if (!abort && comm->w != NULL && clique_defer_destroy(comm))
        return ncclSuccess;   /* the last rank of this comm in the process reports its error */
    q = comm->clique;
    if (comm->w != NULL) {
        struct nccl_devguard g;
        nccl_dev_enter(comm, &g, fn);
        if (abort)
            weft_comm_abort(comm->w);
        e = weft_comm_destroy(comm->w);
        /* After an abort, destroy says WEFT_ERR_ABORTED by design: the abort worked. */
        if (e != WEFT_SUCCESS && !(abort && e == WEFT_ERR_ABORTED))
            rc = nccl_from_weft(comm, e, fn);
        comm->w = NULL;
        nccl_dev_leave(&g);
    }
    nccl_shell_free(comm);
    rc2 = clique_leave(q, fn);
    return rc != ncclSuccess ? rc : rc2;
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm)
{
    return destroy(comm, 0, "ncclCommDestroy");
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm)
{
    return destroy(comm, 1, "ncclCommAbort");
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError)
{
    const char *fn = "ncclCommGetAsyncError";
    int state, e;
    if (comm == NULL || asyncError == NULL)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "%s is NULL", comm == NULL ? "comm" : "asyncError");
    if (comm->magic != NCCLW_COMM_MAGIC)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "comm %p is not a live communicator", (const void *)comm);
    state = __atomic_load_n(&comm->state, __ATOMIC_ACQUIRE);
    if (state == COMM_INITING) {
        *asyncError = ncclInProgress;
        return ncclSuccess;
    }
    if (__atomic_load_n(&comm->init_done, __ATOMIC_ACQUIRE))
        join_init(comm);
    if (state == COMM_FAILED) {
        nccl_fail(NULL, comm->init_result, fn, "comm %p failed to initialise: %s", (const void *)comm,
                  comm->init_error);
        *asyncError = comm->init_result;
        return ncclSuccess;
    }
    e = comm->w ? weft_comm_async_error(comm->w) : WEFT_SUCCESS;
    *asyncError = e == WEFT_SUCCESS ? ncclSuccess : nccl_from_weft(comm, e, fn);
    return ncclSuccess;
}

/* The queries answer for READY and FINALIZED comms (NCCL answers after
 * finalize too). */
static ncclResult_t query_ok(const struct ncclComm *c, const void *out, const char *fn)
{
    ncclResult_t rc = nccl_comm_ready(c, fn);
    if (rc != ncclSuccess && !(c && c->magic == NCCLW_COMM_MAGIC && c->state == COMM_FINALIZED))
        return rc;
    if (out == NULL)
        return nccl_fail(c, ncclInvalidArgument, fn, "output pointer is NULL");
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count)
{
    ncclResult_t rc = query_ok(comm, count, "ncclCommCount");
    if (rc == ncclSuccess)
        *count = comm->nranks;
    return rc;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device)
{
    ncclResult_t rc = query_ok(comm, device, "ncclCommCuDevice");
    if (rc == ncclSuccess)
        *device = comm->device;
    return rc;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank)
{
    ncclResult_t rc = query_ok(comm, rank, "ncclCommUserRank");
    if (rc == ncclSuccess)
        *rank = comm->rank;
    return rc;
}

/* ---- memory ---- */

NCCL_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size)
{
    const char *fn = "ncclMemAlloc", *why = NULL;
    const struct nccl_cuda *cu;
    void *p = NULL;
    cudaError_t e;
    if (ptr == NULL)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "ptr is NULL");
    if ((cu = nccl_cuda(&why)) == NULL)
        return nccl_fail(NULL, ncclUnhandledCudaError, fn, "no CUDA: %s", why);
    if (size == 0) {
        *ptr = NULL;
        return ncclSuccess;
    }
    /* Rounded up to 2 MiB, the granularity NCCL's cuMem allocations have:
     * a smaller cudaMalloc shares a block with the application's other
     * allocations, and CUDA IPC maps whole blocks (a peer that opened one
     * neighbour cannot open this one again: cudaErrorAlreadyMapped). A
     * block of its own keeps the buffer importable on its own. */
    const size_t gran = (size_t)2 << 20;
    if (size > SIZE_MAX - gran)
        return nccl_fail(NULL, ncclInvalidArgument, fn, "size %zu is too large", size);
    if ((e = cu->Malloc(&p, (size + gran - 1) / gran * gran)) != cudaSuccess)
        return nccl_cuda_fail(NULL, fn, "cudaMalloc", e);
    *ptr = p;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclMemFree, void *ptr)
{
    const char *fn = "ncclMemFree", *why = NULL;
    const struct nccl_cuda *cu;
    cudaError_t e;
    if (ptr == NULL)
        return ncclSuccess;
    if ((cu = nccl_cuda(&why)) == NULL)
        return nccl_fail(NULL, ncclUnhandledCudaError, fn, "no CUDA: %s", why);
    if ((e = cu->Free(ptr)) != cudaSuccess)
        return nccl_cuda_fail(NULL, fn, "cudaFree", e);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    const char *fn = "ncclCommRegister";
    struct nccl_reg *r;
    ncclResult_t rc;
    int e;
    if ((rc = nccl_comm_ready(comm, fn)) != ncclSuccess)
        return rc;
    if (buff == NULL || handle == NULL || size == 0)
        return nccl_fail(comm, ncclInvalidArgument, fn, "%s", buff == NULL ? "buff is NULL"
                                                         : handle == NULL ? "handle is NULL" : "size is 0");
    if ((r = calloc(1, sizeof(*r))) == NULL)
        return nccl_fail(comm, ncclSystemError, fn, "out of memory");
    if ((e = weft_mem_register(comm->w, buff, size)) != WEFT_SUCCESS) {
        free(r);
        return nccl_from_weft(comm, e, fn);
    }
    r->buf = buff;
    r->size = size;
    pthread_mutex_lock(&comm->mu);
    r->next = comm->regs;
    comm->regs = r;
    pthread_mutex_unlock(&comm->mu);
    *handle = r;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle)
{
    const char *fn = "ncclCommDeregister";
    struct nccl_reg **pp, *r = NULL;
    ncclResult_t rc;
    int e;
    if ((rc = nccl_comm_ready(comm, fn)) != ncclSuccess)
        return rc;
    pthread_mutex_lock(&comm->mu);
    for (pp = &comm->regs; *pp; pp = &(*pp)->next)
        if (*pp == handle) {
            r = *pp;
            *pp = r->next;
            break;
        }
    pthread_mutex_unlock(&comm->mu);
    if (r == NULL)
        return nccl_fail(comm, ncclInvalidArgument, fn,
                         "handle %p is not a registration of this comm (deregistered already?)", handle);
    e = weft_mem_deregister(comm->w, r->buf, r->size);
    free(r);
    return e == WEFT_SUCCESS ? ncclSuccess : nccl_from_weft(comm, e, fn);
}
