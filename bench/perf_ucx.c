/*
 * weft-perf's UCX column (sendrecv): UCP tag send/recv between the two
 * ranks of a pair, beside weft and MPI in the same run (perf_p2p.c).
 * Compiled into weft-perf only where CMake finds UCX (WEFT_PERF_HAVE_UCX;
 * Debian: libucx-dev).
 *
 * One UCP context and worker per rank, tag feature only, single-threaded.
 * The configuration is UCX's own (ucp_config_read): UCX_TLS and every other
 * UCX_* variable of the environment apply, so a run chooses the UCX
 * transports as a UCX user would (UCX_TLS=posix,cma,self or sm,self for
 * shared memory, UCX_TLS=tcp,self for TCP). Worker addresses are exchanged
 * with MPI_Allgather(v); each rank connects one endpoint, to its pair peer.
 *
 * Tags carry the sender's rank in the upper 32 bits and the benchmark's tag
 * in the lower, and receives match all 64 bits, so a message is only ever
 * taken by the receive meant for it.
 *
 * Every wait progresses the worker and gives up after WEFT_TIMEOUT seconds
 * (the benchmark's own bound for the weft column; 60 when unset or 0), so a
 * UCX transport that never delivers fails the run instead of hanging it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include "perf.h"

struct perf_ucx {
    const struct perf_opts *o;
    ucp_context_h ctx;
    ucp_worker_h  worker;
    ucp_ep_h      ep;       /* to peer; NULL when this rank sits out */
    int           peer;
    double        timeout_s;
};

static double wait_limit(void)
{
    const char *s = getenv("WEFT_TIMEOUT");
    double v = s && *s ? strtod(s, NULL) : 0.0;
    return v > 0.0 ? v : 60.0;
}

static uint64_t tag_of(int src, int tag)
{
    return ((uint64_t)(uint32_t)src << 32) | (uint32_t)tag;
}

const char *perf_ucx_tls(void)
{
    const char *t = getenv("UCX_TLS");
    return t && *t ? t : "default";
}

/* Progresses the worker until req (a send or receive request; NULL = done
 * at once) completes; frees it. *got: the received length (receives only).
 * Returns 0, or 1 after printing what failed. */
static int wait_req(struct perf_ucx *u, void *req, const char *what, size_t *got)
{
    if (req == NULL)
        return 0;
    if (UCS_PTR_IS_ERR(req)) {
        fprintf(stderr, "weft-perf rank %d: %s (peer %d) failed: %s\n", u->o->rank, what, u->peer,
                ucs_status_string(UCS_PTR_STATUS(req)));
        return 1;
    }
    double deadline = perf_now() + u->timeout_s;
    ucs_status_t st;
    ucp_tag_recv_info_t info;
    for (unsigned spin = 0;; spin++) {
        st = got ? ucp_tag_recv_request_test(req, &info) : ucp_request_check_status(req);
        if (st != UCS_INPROGRESS)
            break;
        ucp_worker_progress(u->worker);
        /* The clock only now and then: the ping-pong's latency is measured. */
        if ((spin & 1023) == 1023 && perf_now() > deadline) {
            fprintf(stderr, "weft-perf rank %d: %s (peer %d): nothing completed in %.0f s (WEFT_TIMEOUT)\n",
                    u->o->rank, what, u->peer, u->timeout_s);
            /* Cancelled, then freed: UCX releases it once the cancel lands. */
            ucp_request_cancel(u->worker, req);
            ucp_request_free(req);
            return 1;
        }
    }
    ucp_request_free(req);
    if (st != UCS_OK) {
        fprintf(stderr, "weft-perf rank %d: %s (peer %d) failed: %s\n", u->o->rank, what, u->peer,
                ucs_status_string(st));
        return 1;
    }
    if (got)
        *got = info.length;
    return 0;
}

int perf_ucx_isend(struct perf_ucx *u, const void *buf, size_t bytes, int tag, void **req)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    prm.datatype = ucp_dt_make_contig(1);
    void *r = ucp_tag_send_nbx(u->ep, buf, bytes, tag_of(u->o->rank, tag), &prm);
    if (UCS_PTR_IS_ERR(r)) {
        fprintf(stderr, "weft-perf rank %d: ucp_tag_send_nbx to %d (%zu bytes) failed: %s\n", u->o->rank, u->peer,
                bytes, ucs_status_string(UCS_PTR_STATUS(r)));
        return 1;
    }
    *req = r;
    return 0;
}

int perf_ucx_irecv(struct perf_ucx *u, void *buf, size_t bytes, int tag, void **req, size_t *got_now)
{
    ucp_tag_recv_info_t info;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_RECV_INFO;
    prm.datatype = ucp_dt_make_contig(1);
    prm.recv_info.tag_info = &info;
    void *r = ucp_tag_recv_nbx(u->worker, buf, bytes, tag_of(u->peer, tag), UINT64_MAX, &prm);
    if (UCS_PTR_IS_ERR(r)) {
        fprintf(stderr, "weft-perf rank %d: ucp_tag_recv_nbx from %d (%zu bytes) failed: %s\n", u->o->rank,
                u->peer, bytes, ucs_status_string(UCS_PTR_STATUS(r)));
        return 1;
    }
    /* NULL: the message had already arrived and is in buf; its length is
     * in info now (a request's comes from ucp_tag_recv_request_test). */
    if (r == NULL)
        *got_now = info.length;
    *req = r;
    return 0;
}

int perf_ucx_wait(struct perf_ucx *u, void *req, const char *what, size_t *got)
{
    return wait_req(u, req, what, got);
}

int perf_ucx_send(struct perf_ucx *u, const void *buf, size_t bytes, int tag)
{
    void *req = NULL;
    if (perf_ucx_isend(u, buf, bytes, tag, &req))
        return 1;
    return wait_req(u, req, "ucp_tag_send_nbx", NULL);
}

int perf_ucx_recv(struct perf_ucx *u, void *buf, size_t bytes, int tag, size_t *got)
{
    void *req = NULL;
    size_t now = 0;
    if (perf_ucx_irecv(u, buf, bytes, tag, &req, &now))
        return 1;
    if (req == NULL) {
        *got = now;
        return 0;
    }
    return wait_req(u, req, "ucp_tag_recv_nbx", got);
}

static void close_ucx(struct perf_ucx *u, int force);

/* Progresses the worker until every rank has reached this point (an
 * MPI_Ibarrier), so a peer's endpoint close or last message is served. */
static void barrier_progressing(struct perf_ucx *u)
{
    MPI_Request r;
    int done = 0;
    MPI_Ibarrier(u->o->mpi, &r);
    while (!done) {
        ucp_worker_progress(u->worker);
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    }
}

int perf_ucx_open(const struct perf_opts *o, int peer, struct perf_ucx **out)
{
    int rc = 1;
    ucp_config_t *cfg = NULL;
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
    int *lens = NULL, *displs = NULL;
    char *all = NULL;
    struct perf_ucx *u = calloc(1, sizeof *u);
    if (!u)
        MPI_Abort(o->mpi, 1);   /* a few bytes: the job cannot go on either way */
    u->o = o;
    u->peer = peer;
    u->timeout_s = wait_limit();

    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        fprintf(stderr, "weft-perf rank %d: ucp_config_read: %s\n", o->rank, ucs_status_string(st));
        goto agree;
    }
    ucp_params_t params;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG;
    params.mt_workers_shared = 0;
    st = ucp_init(&params, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        fprintf(stderr, "weft-perf rank %d: ucp_init (UCX_TLS=%s): %s\n", o->rank, perf_ucx_tls(),
                ucs_status_string(st));
        goto agree;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(u->ctx, &wp, &u->worker);
    if (st != UCS_OK) {
        fprintf(stderr, "weft-perf rank %d: ucp_worker_create: %s\n", o->rank, ucs_status_string(st));
        goto agree;
    }
    st = ucp_worker_get_address(u->worker, &addr, &addr_len);
    if (st != UCS_OK || addr_len > (size_t)1 << 30) {
        fprintf(stderr, "weft-perf rank %d: ucp_worker_get_address: %s\n", o->rank, ucs_status_string(st));
        goto agree;
    }
    rc = 0;
agree:;
    /* Every rank learns whether all got this far before the exchange, so
     * one rank's failure does not leave the others in MPI_Allgather. */
    int any_bad = 0;
    MPI_Allreduce(&rc, &any_bad, 1, MPI_INT, MPI_MAX, o->mpi);
    if (any_bad) {
        rc = 1;
        goto fail;
    }
    rc = 1;
    lens = calloc((size_t)o->size, sizeof *lens);
    displs = calloc((size_t)o->size, sizeof *displs);
    int my_len = (int)addr_len, total = 0;
    if (!lens || !displs)
        MPI_Abort(o->mpi, 1);   /* a few ints: the job cannot go on either way */
    MPI_Allgather(&my_len, 1, MPI_INT, lens, 1, MPI_INT, o->mpi);
    for (int r = 0; r < o->size; r++) {
        displs[r] = total;
        total += lens[r];
    }
    all = malloc(total > 0 ? (size_t)total : 1);
    if (!all)
        MPI_Abort(o->mpi, 1);
    MPI_Allgatherv(addr, my_len, MPI_BYTE, all, lens, displs, MPI_BYTE, o->mpi);
    ucp_worker_release_address(u->worker, addr);
    addr = NULL;

    int ok = 1;
    if (peer >= 0) {
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof ep);
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        ep.address = (const ucp_address_t *)(all + displs[peer]);
        st = ucp_ep_create(u->worker, &ep, &u->ep);
        if (st != UCS_OK) {
            fprintf(stderr, "weft-perf rank %d: ucp_ep_create to %d (UCX_TLS=%s): %s\n", o->rank, peer,
                    perf_ucx_tls(), ucs_status_string(st));
            u->ep = NULL;
            ok = 0;
        }
    }
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, o->mpi);
    if (!all_ok)
        goto fail;
    rc = 0;
    *out = u;
    u = NULL;
fail:
    free(all);
    free(displs);
    free(lens);
    if (addr)
        ucp_worker_release_address(u->worker, addr);
    if (u)
        close_ucx(u, 1);   /* collective, as on success: every rank of a failed open gets here */
    return rc;
}

void perf_ucx_close(struct perf_ucx *u)
{
    close_ucx(u, 0);
}

/* force: a failed open, where the peer may have no endpoint to answer a
 * flush; otherwise flush mode, so what was sent is delivered first. */
static void close_ucx(struct perf_ucx *u, int force)
{
    if (!u)
        return;
    if (u->ep) {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof prm);
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        void *req = ucp_ep_close_nbx(u->ep, &prm);
        if (wait_req(u, req, "ucp_ep_close_nbx", NULL))
            fprintf(stderr, "weft-perf rank %d: UCX endpoint to %d not closed cleanly\n", u->o->rank, u->peer);
        u->ep = NULL;
    }
    if (u->worker) {
        barrier_progressing(u);
        ucp_worker_destroy(u->worker);
    } else {
        MPI_Barrier(u->o->mpi);   /* the other ranks' close is collective */
    }
    if (u->ctx)
        ucp_cleanup(u->ctx);
    free(u);
}
