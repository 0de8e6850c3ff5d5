/*
 * weft_comm_create / weft_comm_destroy: the MPI bootstrap.
 *
 * create:  MPI_Comm_dup -> config (agreed by allreduce) -> node identity
 *          (MPI_Comm_split_type SHARED, then WEFT_VIRTUAL_NODES blocks) ->
 *          each transport writes its part of this rank's card -> one
 *          MPI_Allgather of the fixed-size cards -> a transport per peer ->
 *          each transport connects (collective) -> allreduce of the result.
 * destroy: progress until nothing queued is left for any peer -> barrier ->
 *          transports disconnect -> MPI_Comm_free.
 * MPI is called only here; everything between create and destroy travels on
 * weft's own pipes.
 */
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cuda_comm.h"
#include "cuda_ipc.h"
#include "stage.h"
#include "stream.h"
#include "ib_card.h"
#include "log.h"
#include "transport.h"

/* MPI failure -> weft error naming the call. */
static int mpi_check(struct weft_comm *c, int mrc, const char *call)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (mrc == MPI_SUCCESS)
        return WEFT_SUCCESS;
    MPI_Error_string(mrc, s, &len);
    return weft_set_error(c, WEFT_ERR_MPI, "%s failed: %s", call, s);
}

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

/* Every rank gets the worst code of all; a rank that failed keeps its own
 * message, the others say who failed. */
static int agree(struct weft_comm *c, int rc, const char *stage)
{
    /* One MAX-allreduce: the code in the high bits, so the worst code wins,
     * and among ranks with that code the lowest rank (inverted low bits). */
    const long long span = 1ll << 32;
    long long in = rc == WEFT_SUCCESS ? 0 : (long long)rc * span + (span - 1 - c->rank), out;

    if (MPI_Allreduce(&in, &out, 1, MPI_LONG_LONG, MPI_MAX, c->mpi) != MPI_SUCCESS)
        return weft_set_error(c, WEFT_ERR_MPI, "weft_comm_create: MPI_Allreduce failed during %s", stage);
    if (out != 0 && rc == WEFT_SUCCESS)
        weft_set_error(c, (int)(out / span), "weft_comm_create: %s failed on rank %lld", stage,
                       span - 1 - out % span);
    return (int)(out / span);
}

/* Node identity: the comm rank of the lowest rank sharing this node. */
static int find_node_key(struct weft_comm *c, uint64_t *key, int *node_size)
{
    MPI_Comm node;
    int leader = c->rank, rc;

    rc = mpi_check(c, MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                   "MPI_Comm_split_type(SHARED)");
    if (rc != WEFT_SUCCESS)
        return rc;
    rc = mpi_check(c, MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node), "MPI_Allreduce(node)");
    MPI_Comm_size(node, node_size);
    MPI_Comm_free(&node);
    if (rc == WEFT_SUCCESS)
        *key = (uint64_t)leader;
    return rc;
}

/* Effective node of every rank: one per distinct (real node, virtual block),
 * numbered in order of first appearance. */
static void number_nodes(struct weft_comm *c)
{
    int nodes = 0;
    for (int r = 0; r < c->size; r++) {
        int found = -1;
        for (int q = 0; q < r && found < 0; q++)
            if (c->cards[q].node_key == c->cards[r].node_key && c->cards[q].vblock == c->cards[r].vblock)
                found = c->cards[q].node;
        c->cards[r].node = found >= 0 ? found : nodes++;
    }
    c->num_nodes = nodes;

    int local = 0, same_host = 0;
    for (int r = 0; r < c->size; r++) {
        local += c->cards[r].node == c->cards[c->rank].node;
        same_host += c->cards[r].node_key == c->cards[c->rank].node_key;
    }
    c->local_ranks = local;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    c->oversubscribed = cpus > 0 && same_host > cpus;
}

/* Picks the transport of every pipe. Returns an error naming a peer no
 * transport reaches. */
static int choose_transports(struct weft_comm *c)
{
    const struct weft_rank_card *me = &c->cards[c->rank];

    for (int peer = 0; peer < c->size; peer++) {
        struct weft_pipe *p = &c->pipes[peer];
        const struct weft_rank_card *pc = &c->cards[peer];
        unsigned both = me->transports_mask & pc->transports_mask;
        int id;

        if (peer == c->rank)
            id = WEFT_TP_SELF;
        else if (pc->node == me->node && (both & (1u << WEFT_TP_SHM)))
            id = WEFT_TP_SHM;
        else if (weft_transport_get(WEFT_TP_IB) && weft_ib_pair_chosen(me, pc))
            id = WEFT_TP_IB;   /* RDMA whenever both ends have a port on the same link layer */
        else if (both & (1u << WEFT_TP_TCP))
            id = WEFT_TP_TCP;
        else
            return weft_set_error(c, WEFT_ERR_UNSUPPORTED,
                                  "no transport reaches peer %d (host %s, %s node): WEFT_TRANSPORTS allows "
                                  "0x%x here and 0x%x there",
                                  peer, pc->hostname, pc->node == me->node ? "same" : "other",
                                  me->transports_mask, pc->transports_mask);
        p->tp = weft_transport_get(id);
        p->eager_limit = p->tp->eager_limit(c);
        p->eager_limit_internal = p->eager_limit;
        if (id == WEFT_TP_SHM && c->cfg.shm_coll_eager > p->eager_limit)
            p->eager_limit_internal = c->cfg.shm_coll_eager;
        c->tp_used |= 1u << id;
    }
    return WEFT_SUCCESS;
}

static void log_choices(const struct weft_comm *c)
{
    if (weft_log_level() < WEFT_LOG_INFO)
        return;
    WEFT_INFO(c->rank, "comm of %d ranks on %d node(s)%s; this rank on host %s, node %d", c->size, c->num_nodes,
              c->cfg.virtual_nodes ? " (WEFT_VIRTUAL_NODES)" : "", c->cards[c->rank].hostname,
              c->cards[c->rank].node);
    for (int peer = 0; peer < c->size; peer++) {
        const struct weft_pipe *p = &c->pipes[peer];
        const int same = c->cards[peer].node == c->cards[c->rank].node;
        const char *why = peer == c->rank ? "this rank"
                          : p->tp->id == WEFT_TP_SHM ? "same node"
                          : same ? "same node, shm not allowed"
                                 : "other node";
        /* Why a pair that could have used RDMA did not. */
        const char *not_ib = "";
        if (peer != c->rank && p->tp->id == WEFT_TP_TCP)
            not_ib = weft_transport_get(WEFT_TP_IB) == NULL
                         ? "built without verbs headers"
                         : weft_ib_pair_why_not(&c->cards[c->rank], &c->cards[peer]);
        WEFT_INFO(c->rank, "peer %d: transport %s (%s%s%s%s, host %s), eager limit %zu", peer, p->tp->name, why,
                  p->tp->id == WEFT_TP_IB ? ", ib" : "", not_ib && not_ib[0] ? ", not ib: " : "",
                  not_ib ? not_ib : "", c->cards[peer].hostname, p->eager_limit);
    }
}

static void disconnect_all(struct weft_comm *c)
{
    for (int id = WEFT_TP_COUNT - 1; id >= 0; id--) {
        const struct weft_transport *tp = weft_transport_get(id);
        if (tp && tp->disconnect)
            tp->disconnect(c);
    }
}

static void comm_free(struct weft_comm *c)
{
    if (c->pipes) {
        for (int i = 0; i < c->size; i++)
            weft_pipe_fini(&c->pipes[i]);
        free(c->pipes);
    }
    weft_cuda_comm_fini(c);
    weft_request_pool_fini(c);
    if (c->coll_state && c->coll_state_free)
        c->coll_state_free(c->coll_state);
    free(c->cards);
    pthread_mutex_destroy(&c->err_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* The card is exchanged as raw bytes between builds of one version: its
 * size is part of the bootstrap protocol. */
_Static_assert(sizeof(struct weft_rank_card) == 568, "rank card size changed");

int weft_comm_create(MPI_Comm mpi_comm, weft_comm_t **out)
{
    struct weft_comm *c;
    struct weft_rank_card mine;
    char cfg_err[256] = "";
    int initialized = 0, finalized = 0, node_size = 0, rc, id;
    unsigned offer;

    if (out == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_create: comm output pointer is NULL");
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return weft_set_error(NULL, WEFT_ERR_MPI, "weft_comm_create: MPI is %s",
                              finalized ? "already finalized" : "not initialized");
    if (mpi_comm == MPI_COMM_NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_create: mpi_comm is MPI_COMM_NULL");

    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for the comm");
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->err_lock, NULL);
    c->mpi = MPI_COMM_NULL;

    rc = mpi_check(c, MPI_Comm_dup(mpi_comm, &c->mpi), "MPI_Comm_dup");
    if (rc != WEFT_SUCCESS)
        goto fail_free;
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);

    rc = weft_config_load(&c->cfg, NULL, NULL, cfg_err, sizeof(cfg_err));
    if (rc != WEFT_SUCCESS)
        weft_set_error(c, rc, "weft_comm_create: bad configuration: %s", cfg_err);
    else
        weft_log_set_level(c->cfg.log_level);
    rc = agree(c, rc, "reading the WEFT_* configuration");
    if (rc != WEFT_SUCCESS)
        goto fail_dup;

    /* This rank's card. */
    memset(&mine, 0, sizeof(mine));
    rc = find_node_key(c, &mine.node_key, &node_size);
    if (rc != WEFT_SUCCESS)
        goto fail_dup;
    c->my_token = random_token();
    mine.token = c->my_token;
    mine.cma_probe_addr = (uint64_t)(uintptr_t)&c->my_token;
    mine.pid = (int32_t)getpid();
    mine.transports_mask = c->cfg.transports_mask;
    if (c->cfg.virtual_nodes > 0) {
        int k = c->cfg.virtual_nodes < c->size ? c->cfg.virtual_nodes : c->size;
        mine.vblock = (int32_t)(((long long)c->rank * k) / c->size);
    }
    gethostname(mine.hostname, sizeof(mine.hostname) - 1);

    /* Whole comm on one node, shm allowed and no virtual nodes: no peer can
     * need TCP or ib (WEFT_TRANSPORTS is the same on every rank), so no
     * listener, and no RDMA device opened. */
    offer = c->cfg.transports_mask;
    if (node_size == c->size && c->cfg.virtual_nodes <= 1 && (offer & (1u << WEFT_TP_SHM)))
        offer &= ~((1u << WEFT_TP_TCP) | (1u << WEFT_TP_IB));
    mine.transports_mask = offer;

    rc = weft_cuda_comm_card(c, &mine);
    for (id = 0; id < WEFT_TP_COUNT && rc == WEFT_SUCCESS; id++) {
        const struct weft_transport *tp = weft_transport_get(id);
        if (tp && (offer & (1u << id)))
            rc = tp->card_fill(c, &mine);
    }
    rc = agree(c, rc, "preparing transports");
    if (rc != WEFT_SUCCESS)
        goto fail_transports;

    c->cards = calloc((size_t)c->size, sizeof(*c->cards));
    c->pipes = calloc((size_t)c->size, sizeof(*c->pipes));
    rc = (c->cards && c->pipes) ? WEFT_SUCCESS
                                : weft_set_error(c, WEFT_ERR_NO_MEMORY, "weft_comm_create: no memory for %d peers",
                                                 c->size);
    for (int i = 0; i < c->size && rc == WEFT_SUCCESS; i++)
        rc = weft_pipe_init(c, &c->pipes[i], i);
    rc = agree(c, rc, "allocating peers");
    if (rc != WEFT_SUCCESS)
        goto fail_transports;

    rc = mpi_check(c, MPI_Allgather(&mine, (int)sizeof(mine), MPI_BYTE, c->cards, (int)sizeof(mine), MPI_BYTE,
                                    c->mpi), "MPI_Allgather(rank cards)");
    if (rc != WEFT_SUCCESS)
        goto fail_transports;
    number_nodes(c);

    rc = agree(c, choose_transports(c), "choosing transports");
    if (rc != WEFT_SUCCESS)
        goto fail_transports;

    /* Every rank connects every transport, in one order (collective). */
    for (id = 0; id < WEFT_TP_COUNT; id++) {
        const struct weft_transport *tp = weft_transport_get(id);
        int trc = tp ? tp->connect(c) : WEFT_SUCCESS;
        rc = agree(c, trc, tp ? tp->name : "connect");
        if (rc != WEFT_SUCCESS)
            goto fail_transports;
    }
    rc = agree(c, weft_cuda_comm_connect(c), "cuda");
    if (rc != WEFT_SUCCESS)
        goto fail_transports;
    log_choices(c);
    *out = c;
    return WEFT_SUCCESS;

fail_transports:
    disconnect_all(c);
fail_dup:
    MPI_Comm_free(&c->mpi);
fail_free:
    /* Keep the message visible: the comm is gone, so log it once more. */
    WEFT_WARN(c->rank, "weft_comm_create failed: %s", c->last_error);
    comm_free(c);
    return rc;
}

/* Progress until no transport or pipe holds anything a peer may wait for. */
static int drain(struct weft_comm *c)
{
    double start = weft_now();
    for (;;) {
        /* Device paths (staged chunks, IPC copies) hold work no transport sees. */
        int busy = c->out_queued != 0 || weft_stage_busy(c) || (c->cuda && weft_cuda_ipc_busy(c));
        for (int id = 0; id < WEFT_TP_COUNT && !busy; id++) {
            const struct weft_transport *tp = weft_transport_get(id);
            busy = (c->tp_used & (1u << id)) && tp->busy && tp->busy(c);
        }
        if (!busy)
            return WEFT_SUCCESS;
        if (weft_progress(c) == 0) {
            if (c->cfg.timeout_s > 0 && weft_now() - start > c->cfg.timeout_s)
                return weft_set_error(c, WEFT_ERR_TIMEOUT,
                                      "weft_comm_destroy: outbound messages still queued after %.0f s",
                                      c->cfg.timeout_s);
            struct timespec ts = { 0, 50 * 1000 };
            pthread_mutex_unlock(&c->lock);
            nanosleep(&ts, NULL);
            pthread_mutex_lock(&c->lock);
        }
    }
}

int weft_comm_destroy(weft_comm_t *c)
{
    int rc, mrc;

    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_destroy: comm is NULL");
    /* Stream-ordered operations still queued finish (or time out) first:
     * the progress thread must be gone before pipes are torn down. */
    int qrc = weft_stream_comm_quiesce(c);
    pthread_mutex_lock(&c->lock);
    rc = drain(c);
    if (rc == WEFT_SUCCESS)
        rc = qrc;
    for (int i = 0; i < c->size; i++) {
        const struct weft_pipe *p = &c->pipes[i];
        if (p->inflight.count)
            WEFT_WARN(c->rank, "weft_comm_destroy: %zu request(s) with peer %d still in flight", p->inflight.count,
                      i);
    }
    pthread_mutex_unlock(&c->lock);

    mrc = mpi_check(c, MPI_Barrier(c->mpi), "MPI_Barrier(destroy)");
    if (rc == WEFT_SUCCESS)
        rc = mrc;
    disconnect_all(c);
    MPI_Comm_free(&c->mpi);
    comm_free(c);
    return rc;
}
