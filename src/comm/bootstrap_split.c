/*
 * The split bootstrap: the set-up exchanges of a comm made by
 * weft_comm_split, over the parent comm's pipes.
 *
 * Members are parent ranks (members[new rank]). Every exchange is all-pairs:
 * each member posts a receive from every other member, then sends to every
 * other member, then waits for all of them. All-pairs rather than gathering
 * at the first member and sending back: no rank handles n records twice,
 * and an exchange is one round trip whatever the size. The records are rank
 * cards (a few KiB) and a handful of agreements, so n - 1 messages each way
 * per member stay cheap next to the new comm's own connection set-up.
 *
 * Not mixing with other traffic on the parent:
 *  - one internal lane, WEFT_TAG_SPLIT (p2p/tags.h): user tags are >= 0 and
 *    the parent's collectives (blocking, non-blocking, stream-ordered) have
 *    lanes of their own, so none of their messages can match ours;
 *  - every message carries a fingerprint (split id, exchange number, kind,
 *    size) and every receive is checked against it, so a message of another
 *    split or another exchange fails the receive with WEFT_ERR_MISMATCH
 *    instead of being read as a card.
 *
 * Waiting: the p2p calls take the parent's lock themselves (p2p.h); each
 * wait is weft_p2p_wait_done, bounded by WEFT_TIMEOUT without progress on
 * the request's pipe, and while it waits it also progresses the parent's
 * other work (its pipes, its non-blocking collectives through the idle
 * hook), so a split never stalls the parent's outstanding operations.
 */
#include "bootstrap_split.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "core.h"
#include "log.h"
#include "p2p.h"
#include "tags.h"

/* Fingerprint word 0: "wsplit" in the high bytes, the exchange kind low. */
#define SPLIT_MAGIC 0x7773706c69740000ull

enum { OP_ALLGATHER = 1, OP_ALLTOALL, OP_MAX };
static const char *const op_name[] = { "?", "allgather", "alltoall", "max" };

struct boot_split {
    struct weft_bootstrap b;
    struct weft_p2p      *parent;   /* NULL once the new comm is created: it never uses the parent again */
    int                  *members;  /* [size]: the parent rank of each new rank */
    uint32_t              id;       /* this split on the parent (fingerprint) */
    const char           *what;     /* the public call, for errors: "weft_comm_split", "weft_comm_shrink" */
    int                   shrink;   /* made by weft_comm_shrink (split_id has WEFT_SPLIT_ID_SHRINK) */
    uint32_t              nops;     /* exchanges so far (fingerprint: which one) */
    struct weft_request **reqs;     /* [2 * (size - 1)]: one exchange's requests */
    int                  *req_peer; /* [2 * (size - 1)]: new rank of each request's peer, negated - 1 for sends */
};

/* The parent's last error, for a failure the parent's pipes recorded
 * (a timeout names the stuck peer and the transport there). */
static void parent_error(struct boot_split *s, char *out, size_t len)
{
    struct weft_core *pc = weft_p2p_core(s->parent);
    /* Cut to fit: the sentence it goes into has a bounded length too. */
    struct weft_error e;
    weft_error_get(pc, &e);
    weft_error_format(&e, 1, out, len);
}

static int request_failed(struct boot_split *s, int op, uint32_t nth, int entry, int code)
{
    int send = s->req_peer[entry] < 0;
    int peer = send ? -s->req_peer[entry] - 1 : s->req_peer[entry];
    const char *verb = send ? "sending to" : "receiving from";

    if (code == WEFT_ERR_MISMATCH)
        return weft_set_error(s->b.core, code,
                              "%s: set-up %s #%u (new rank %d = parent rank %d): the message from new "
                              "rank %d (parent rank %d) belongs to another exchange (ranks out of step, or a stray "
                              "of an earlier call that failed)", s->what, op_name[op], nth, s->b.rank,
                              s->members[s->b.rank], peer, s->members[peer]);
    char why[640];
    parent_error(s, why, sizeof(why));
    return weft_set_error(s->b.core, code,
                          "%s: set-up %s #%u (new rank %d = parent rank %d): %s new rank %d (parent rank "
                          "%d) over the parent's pipes failed; the parent comm says: %s", s->what, op_name[op], nth, s->b.rank,
                          s->members[s->b.rank], verb, peer, s->members[peer], why[0] ? why : "(nothing)");
}

/* The exchange failed on this rank (a member is gone, or silent past
 * WEFT_TIMEOUT): its receives that no message is bound to yet are
 * withdrawn, and their lanes refuse what those members still send, so
 * this rank waits neither for the member that is gone nor for live members
 * that already left the exchange over the same failure (they would cost a
 * WEFT_TIMEOUT each and be blamed for it). Sends stay: a send whose
 * announcement is out is answered by its receiver or fails with its pipe. */
static void withdraw(struct boot_split *s, size_t nreq, int code)
{
    for (size_t k = 0; k < nreq; k++)
        if (s->reqs[k] != NULL && s->req_peer[k] >= 0 && !weft_p2p_done(s->reqs[k]) &&
            weft_p2p_cancel(s->reqs[k], code))
            weft_p2p_refuse_lane(s->parent, s->members[s->req_peer[k]], WEFT_TAG_SPLIT, code);
}

/* Waits request k out (bounded) and frees it; the exchange's first failure
 * is the one reported. Returns rc, or the new failure when rc was success. */
static int finish_request(struct boot_split *s, int op, uint32_t nth, size_t k, size_t bytes, int rc)
{
    weft_status_t st;
    int code = weft_p2p_wait(s->reqs[k], &st);   /* done: frees it, returns its code */
    s->reqs[k] = NULL;
    if (code == WEFT_SUCCESS && s->req_peer[k] >= 0 && st.bytes != bytes)
        code = WEFT_ERR_INTERNAL;   /* a fingerprint names the size: cannot happen */
    if (code != WEFT_SUCCESS && rc == WEFT_SUCCESS)
        rc = request_failed(s, op, nth, (int)k, code);
    return rc;
}

/* One all-pairs exchange: record j of recv is member j's; member j gets
 * send + j * sstride (sstride 0: the same record for everyone). */
static int exchange(struct boot_split *s, int op, const void *send, size_t sstride, void *recv, size_t bytes)
{
    const int me = s->b.rank, n = s->b.size;
    const uint32_t nth = s->nops++;
    const struct weft_p2p_check chk = { { SPLIT_MAGIC | (uint64_t)op, ((uint64_t)s->id << 32) | nth,
                                          (uint64_t)bytes } };
    unsigned char *rbuf = recv;
    const unsigned char *sbuf = send;
    size_t nreq = 0;
    int rc = WEFT_SUCCESS, failed_peer = -1, failed_send = 0;
    char why[640] = "";

    if (s->parent == NULL)   /* comm.c calls no exchange after created(); say so if that ever changes */
        return weft_set_error(s->b.core, WEFT_ERR_INTERNAL, "%s: set-up %s after the new comm was "
                              "created (the split bootstrap no longer holds the parent)", s->what, op_name[op]);
    memmove(rbuf + (size_t)me * bytes, sbuf + (size_t)me * sstride, bytes);
    /* Receives first, so every peer's message finds its buffer posted;
     * peers in the order me+1, me+2, ...: the members do not all start
     * with the same peer. A request that cannot be started (its pipe
     * already broke: that member died) does not stop the others: every
     * live member must still get this member's record, or it would wait
     * out WEFT_TIMEOUT for it and blame this member instead of the dead one. */
    for (int k = 0; k < 2 * (n - 1); k++) {
        const int is_send = k >= n - 1, j = (me + 1 + k % (n - 1)) % n;
        int r = is_send ? weft_p2p_isend_checked(s->parent, sbuf + (size_t)j * sstride, bytes, s->members[j],
                                                 WEFT_TAG_SPLIT, &chk, &s->reqs[nreq], s->what)
                        : weft_p2p_irecv_checked(s->parent, rbuf + (size_t)j * bytes, bytes, s->members[j],
                                                 WEFT_TAG_SPLIT, &chk, &s->reqs[nreq], s->what);
        if (r == WEFT_SUCCESS) {
            s->req_peer[nreq++] = is_send ? -j - 1 : j;
        } else if (rc == WEFT_SUCCESS) {
            /* The p2p call said why (on the parent): keep it before the
             * waits below can say something else. */
            rc = r;
            failed_peer = j;
            failed_send = is_send;
            parent_error(s, why, sizeof(why));
        }
    }
    if (rc != WEFT_SUCCESS)
        rc = weft_set_error(s->b.core, rc, "%s: set-up %s #%u (new rank %d = parent rank %d): could not "
                            "start %s new rank %d (parent rank %d) over the parent's pipes: %s", s->what, op_name[op],
                            nth, me,
                            s->members[me], failed_send ? "sending to" : "receiving from", failed_peer,
                            s->members[failed_peer], why[0] ? why : "(nothing)");
    /* Every request is waited for and freed, failed or not: none may
     * outlive the buffers (the caller's). Each wait is bounded by
     * WEFT_TIMEOUT without progress, and the requests' clocks run
     * together, so a stuck peer costs one WEFT_TIMEOUT, not one per
     * request. A rank failure declared on the parent (its fault epoch
     * moves) wakes the wait on whichever request it is on, so that a
     * failure on another request ends the exchange at once instead of
     * after the one waited on timed out; once failed, the exchange
     * withdraws what is still waiting (withdraw). */
    const char *what = s->shrink ? "weft_comm_shrink (set-up exchange over the revoked comm's pipes)"
                                 : "weft_comm_split (set-up exchange over the parent's pipes)";
    uint64_t epoch = weft_p2p_fault_epoch(s->parent);
    int withdrawn = rc != WEFT_SUCCESS;
    if (withdrawn)
        withdraw(s, nreq, rc);
    for (size_t k = 0; k < nreq; k++) {
        while (s->reqs[k] != NULL) {
            if (weft_p2p_wait_done_until(s->reqs[k], what, &epoch) == WEFT_P2P_FAULT) {
                epoch = weft_p2p_fault_epoch(s->parent);
                for (size_t q = 0; q < nreq; q++)
                    if (s->reqs[q] != NULL && weft_p2p_done(s->reqs[q]))
                        rc = finish_request(s, op, nth, q, bytes, rc);
            } else {
                rc = finish_request(s, op, nth, k, bytes, rc);
            }
            if (rc != WEFT_SUCCESS && !withdrawn) {
                withdraw(s, nreq, rc);
                withdrawn = 1;
            }
        }
    }
    return rc;
}

static int split_allgather(struct weft_bootstrap *b, const void *mine, void *all, size_t bytes)
{
    return exchange((struct boot_split *)b, OP_ALLGATHER, mine, 0, all, bytes);
}

static int split_alltoall(struct weft_bootstrap *b, const void *send, void *recv, size_t bytes)
{
    return exchange((struct boot_split *)b, OP_ALLTOALL, send, bytes, recv, bytes);
}

static int split_max(struct weft_bootstrap *b, long long *value)
{
    long long *all = calloc((size_t)b->size, sizeof(*all));
    if (all == NULL)
        return weft_set_error(b->core, WEFT_ERR_NO_MEMORY, "%s: no memory for an agreement of %d ranks",
                              ((struct boot_split *)b)->what, b->size);
    int rc = exchange((struct boot_split *)b, OP_MAX, value, 0, all, sizeof(*all));
    if (rc == WEFT_SUCCESS) {
        long long m = all[0];
        for (int i = 1; i < b->size; i++)
            m = all[i] > m ? all[i] : m;
        *value = m;
    }
    free(all);
    return rc;
}

/* The new comm exists: from here on it must not depend on the parent. */
static void split_created(struct weft_bootstrap *b)
{
    struct boot_split *s = (struct boot_split *)b;
    s->parent = NULL;
    free(s->reqs);
    free(s->req_peer);
    s->reqs = NULL;
    s->req_peer = NULL;
}

static void split_destroy(struct weft_bootstrap *b)
{
    struct boot_split *s = (struct boot_split *)b;
    free(s->req_peer);
    free(s->reqs);
    free(s->members);
    free(s);
}

static const struct weft_bootstrap_ops split_ops = {
    .name = "split",
    .allgather = split_allgather,
    .alltoall = split_alltoall,
    .barrier = NULL,   /* destroy's barrier goes over the new comm's own pipes */
    .max = split_max,
    .created = split_created,
    .destroy = split_destroy,
};

int weft_bootstrap_split_create(struct weft_p2p *parent, const int *members, int size, int rank, uint32_t split_id,
                                struct weft_core *core, struct weft_bootstrap **out)
{
    return weft_bootstrap_subset_create(parent, members, size, rank, split_id, "weft_comm_split", core, out);
}

int weft_bootstrap_subset_create(struct weft_p2p *parent, const int *members, int size, int rank, uint32_t split_id,
                                 const char *what, struct weft_core *core, struct weft_bootstrap **out)
{
    struct boot_split *s;
    size_t slots = size > 1 ? 2 * (size_t)(size - 1) : 1;

    if (parent == NULL || members == NULL || size < 1 || rank < 0 || rank >= size)
        return weft_set_error(core, WEFT_ERR_INTERNAL, "%s: bad split bootstrap arguments (rank %d of %d)",
                              what, rank, size);
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "%s: no memory for the bootstrap", what);
    s->members = malloc((size_t)size * sizeof(*s->members));
    s->reqs = calloc(slots, sizeof(*s->reqs));
    s->req_peer = calloc(slots, sizeof(*s->req_peer));
    if (s->members == NULL || s->reqs == NULL || s->req_peer == NULL) {
        split_destroy(&s->b);
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "%s: no memory for the bootstrap of %d ranks",
                              what, size);
    }
    memcpy(s->members, members, (size_t)size * sizeof(*members));
    s->b.ops = &split_ops;
    s->b.core = core;
    s->b.rank = rank;
    s->b.size = size;
    s->parent = parent;
    s->id = split_id;
    s->what = what;
    s->shrink = (split_id & WEFT_SPLIT_ID_SHRINK) != 0;
    *out = &s->b;
    return WEFT_SUCCESS;
}
