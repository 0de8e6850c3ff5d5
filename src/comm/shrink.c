/*
 * weft_comm_shrink: the live ranks of a comm agree on who failed and make a
 * comm of themselves, over the old comm's pipes (no MPI: MPI's own
 * collectives would wait for a dead rank for good).
 *
 * 1. Revoke the comm (if it is not yet): every pending call on it ends with
 *    WEFT_ERR_REVOKED on every rank, so the survivors all come here.
 * 2. Agree on the failed set, in rounds over the internal lane
 *    WEFT_TAG_SHRINK (p2p/tags.h). Each rank starts from the ranks whose
 *    pipe is down here (a rank declared failed: died, stopped, aborted,
 *    silent), those the caller excluded (weft_comm_shrink_excluding), and
 *    for the links known broken between live ranks, the ranks that cover
 *    them (leave_for_links; a rank that is one of them leaves after its
 *    first round). In a round it sends its set to every
 *    rank not in it and receives theirs; a rank that cannot be reached or
 *    does not answer within WEFT_TIMEOUT joins the set. The next set is the
 *    union of what came. A round in which every set that came equals the
 *    rank's own, and its own did not grow, ends the agreement:
 *
 *        rank   round 1 sends   receives            round 2 sends   receives
 *        0      {3}             1:{}  2:{3}         {3}             1:{3} 2:{3}   -> {3}
 *        1      {}              0:{3} 2:{3} 3:fails {3}             0:{3} 2:{3}   -> {3}
 *        2      {3}             0:{3} 1:{}          {3}             0:{3} 1:{3}   -> {3}
 *
 *    Two ranks that hear from each other end in the same round with the
 *    same set: each set a rank sends goes to all the others alike, so a
 *    difference one of them sees, the other sees too. Only a rank failing
 *    during the agreement itself can leave one rank ending while another
 *    goes on (its receive from the new failure failed); the one going on
 *    then waits for the one that ended, which is assembling the new comm
 *    with the failed rank in it: both fail within WEFT_TIMEOUT and the user
 *    calls weft_comm_shrink again. Every message names its attempt (the
 *    comm's count of shrinks) and round, so what an attempt that failed
 *    left on the lane is skipped.
 * 3. The others than the agreed set, in the old comm's rank order, make the
 *    new comm over the split bootstrap (bootstrap_split.h), with the old
 *    comm's configuration. Its id carries the set (and WEFT_SPLIT_ID_SHRINK):
 *    ranks that somehow agreed on different sets meet messages of another
 *    exchange and fail with WEFT_ERR_MISMATCH, never build a comm of
 *    mismatched members.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap_split.h"
#include "comm.h"
#include "core.h"
#include "log.h"
#include "p2p.h"
#include "tags.h"

/* "wshrink" in the high bytes. */
#define SHRINK_MAGIC 0x77736872696e6b00ull

struct shrink_hdr {
    uint64_t magic;
    uint32_t attempt, round;
    uint32_t size, pad;
};

struct agree {
    struct weft_comm     *c;
    int                   n, me;
    uint32_t              attempt, round;
    size_t                setb, msgb;   /* bitmap bytes; message bytes (header + bitmap) */
    unsigned char        *out;          /* this rank's message: header + its set */
    unsigned char        *in;           /* [n * msgb]: each rank's message of this round */
    unsigned char        *next;         /* [setb]: the union being built */
    int                  *said_by;      /* [n]: for a rank in the set, who put it there first (-1: this rank) */
    char                (*why)[160];    /* [n]: this rank's own reason for a rank it put in */
    struct weft_request **sreq, **rreq; /* [n] */
};

static int has(const unsigned char *set, int r) { return (set[r >> 3] >> (r & 7)) & 1; }
static void add(unsigned char *set, int r) { set[r >> 3] |= (unsigned char)(1u << (r & 7)); }
static unsigned char *own_set(struct agree *a) { return a->out + sizeof(struct shrink_hdr); }

/* This rank counts r failed from now on (reason: why). */
static void count_failed(struct agree *a, int r, int by, const char *why)
{
    if (has(a->next, r))
        return;
    add(a->next, r);
    a->said_by[r] = by;
    if (by < 0)
        snprintf(a->why[r], sizeof a->why[r], "%s", why);
}

/* Links broken between live ranks (every rank learns of each, p2p/health.c):
 * the new comm is made over the old pipes, so no broken one may stay
 * between two of its ranks. Of the links among ranks not yet out, the
 * rank on the most leaves (a tie: the higher rank), until none is left --
 * one rank for one link, the rank that lost its network for several. A
 * function of the known links alone, so the ranks that know the same
 * links decide the same; the rounds join what differs. */
static void leave_for_links(struct agree *a)
{
    int pairs[WEFT_P2P_LINKS_MAX][2];
    const int nl = weft_p2p_known_links(a->c->p2p, pairs, WEFT_P2P_LINKS_MAX);
    unsigned char *mine = own_set(a);
    int *deg = calloc((size_t)a->n, sizeof *deg);
    if (deg == NULL || nl == 0) {
        free(deg);
        return;
    }
    for (;;) {
        int best = -1;
        memset(deg, 0, (size_t)a->n * sizeof *deg);
        for (int i = 0; i < nl; i++) {
            const int x = pairs[i][0], y = pairs[i][1];
            if (x < 0 || y < 0 || x >= a->n || y >= a->n || has(mine, x) || has(mine, y))
                continue;
            deg[x]++;
            deg[y]++;
        }
        for (int r = 0; r < a->n; r++)
            if (deg[r] > 0 && (best < 0 || deg[r] >= deg[best]))
                best = r;
        if (best < 0)
            break;
        add(mine, best);
        a->said_by[best] = -1;
        snprintf(a->why[best], sizeof a->why[best], "%d of the links known broken between live ranks end at it "
                 "(the rank on the most leaves; a tie: the higher rank)", deg[best]);
    }
    free(deg);
}

/* One round: send the own set to every rank outside it, take theirs.
 * *changed: some set that came differs from the own, or the own grew. */
static int run_round(struct agree *a, int *changed)
{
    struct weft_p2p *p = a->c->p2p;
    unsigned char *mine = own_set(a);
    struct shrink_hdr h = { SHRINK_MAGIC, a->attempt, a->round, (uint32_t)a->n, 0 };
    char why[160];
    int pending = 0;

    memcpy(a->out, &h, sizeof h);
    memcpy(a->next, mine, a->setb);
    *changed = 0;
    for (int j = 0; j < a->n; j++) {
        a->sreq[j] = a->rreq[j] = NULL;
        if (j == a->me || has(mine, j))
            continue;
        if (weft_p2p_irecv(p, a->in + (size_t)j * a->msgb, a->msgb, j, WEFT_TAG_SHRINK, &a->rreq[j],
                           "weft_comm_shrink") != WEFT_SUCCESS) {
            count_failed(a, j, -1, "its pipe is down");
            continue;
        }
        pending++;
        if (weft_p2p_isend(p, a->out, a->msgb, j, WEFT_TAG_SHRINK, &a->sreq[j], "weft_comm_shrink") != WEFT_SUCCESS)
            count_failed(a, j, -1, "its pipe is down");
    }
    /* Receives: what an earlier attempt left on the lane is skipped (the
     * receive is posted again); everything else is this round's answer. */
    while (pending > 0) {
        weft_status_t st[1];
        pending = 0;
        for (int j = 0; j < a->n; j++) {
            if (a->rreq[j] == NULL)
                continue;
            int rc = weft_p2p_wait(a->rreq[j], st);   /* bounded by WEFT_TIMEOUT; frees it */
            a->rreq[j] = NULL;
            const struct shrink_hdr *t = (const struct shrink_hdr *)(a->in + (size_t)j * a->msgb);
            if (rc != WEFT_SUCCESS) {
                snprintf(why, sizeof why, "it did not answer (%s)", weft_err_str(rc));
                count_failed(a, j, -1, why);
            } else if (st[0].bytes != a->msgb || t->magic != SHRINK_MAGIC || t->size != (uint32_t)a->n) {
                count_failed(a, j, -1, "it sent something that is not weft_comm_shrink's");
            } else if ((int32_t)(t->attempt - a->attempt) < 0) {
                /* A stray of an attempt that failed: take the next one. */
                if (weft_p2p_irecv(p, a->in + (size_t)j * a->msgb, a->msgb, j, WEFT_TAG_SHRINK, &a->rreq[j],
                                   "weft_comm_shrink") != WEFT_SUCCESS)
                    count_failed(a, j, -1, "its pipe is down");
                else
                    pending++;
            } else {
                const unsigned char *theirs = (const unsigned char *)(t + 1);
                if (t->attempt != a->attempt || t->round != a->round || memcmp(theirs, mine, a->setb) != 0)
                    *changed = 1;
                for (int r = 0; r < a->n; r++)
                    if (has(theirs, r))
                        count_failed(a, r, j, NULL);
            }
        }
    }
    for (int j = 0; j < a->n; j++)
        if (a->sreq[j] != NULL) {
            int rc = weft_p2p_wait(a->sreq[j], NULL);
            a->sreq[j] = NULL;
            if (rc != WEFT_SUCCESS) {
                snprintf(why, sizeof why, "a send to it failed (%s)", weft_err_str(rc));
                count_failed(a, j, -1, why);
            }
        }
    if (memcmp(a->next, mine, a->setb) != 0)
        *changed = 1;
    memcpy(mine, a->next, a->setb);
    return WEFT_SUCCESS;
}

/* "2, 5 and 7" (at most n - 1 ranks; cut to fit). */
static void list_ranks(const unsigned char *set, int n, char *out, size_t len)
{
    size_t used = 0;
    int count = 0, total = 0;
    out[0] = '\0';
    for (int r = 0; r < n; r++)
        total += has(set, r);
    for (int r = 0; r < n && used + 16 < len; r++)
        if (has(set, r)) {
            count++;
            used += (size_t)snprintf(out + used, len - used, "%s%d",
                                     count == 1 ? "" : count == total ? " and " : ", ", r);
        }
}

struct shrink_make {
    struct weft_p2p *parent;
    int             *members, size, rank;
    uint32_t         id;
};

static int make_shrink_boot(void *arg, struct weft_core *core, struct weft_bootstrap **out)
{
    struct shrink_make *m = arg;
    return weft_bootstrap_subset_create(m->parent, m->members, m->size, m->rank, m->id, "weft_comm_shrink", core,
                                        out);
}

int weft_comm_shrink_all(struct weft_comm *c, const int *exclude, int nexclude, struct weft_comm **out)
{
    const int n = c->core.size, me = c->core.rank;
    struct agree a;
    struct shrink_make mk = { c->p2p, NULL, 0, -1, 0 };
    int rc = WEFT_SUCCESS, changed = 1;
    char list[256], why[400];

    memset(&a, 0, sizeof a);
    a.c = c;
    a.n = n;
    a.me = me;
    a.attempt = ++c->shrinks;
    a.setb = ((size_t)n + 7) / 8;
    /* Rounded up: each rank's message sits at in + j * msgb, read as a header. */
    a.msgb = (sizeof(struct shrink_hdr) + a.setb + 7) & ~(size_t)7;
    a.out = calloc(1, a.msgb);
    a.in = calloc((size_t)n, a.msgb);
    a.next = calloc(1, a.setb);
    a.said_by = calloc((size_t)n, sizeof *a.said_by);
    a.why = calloc((size_t)n, sizeof *a.why);
    a.sreq = calloc((size_t)n, sizeof *a.sreq);
    a.rreq = calloc((size_t)n, sizeof *a.rreq);
    mk.members = calloc((size_t)n, sizeof *mk.members);
    if (!a.out || !a.in || !a.next || !a.said_by || !a.why || !a.sreq || !a.rreq || !mk.members) {
        rc = weft_set_error(&c->core, WEFT_ERR_NO_MEMORY, "weft_comm_shrink: no memory for an agreement of %d ranks",
                            n);
        goto out;
    }

    /* 1. Every rank's pending calls end; those that learn it come here. */
    weft_p2p_revoke(c->p2p);

    /* 2. The agreement. Each round that changes something brings at least
     * one rank's set closer to the union of all, so n + 1 rounds suffice
     * unless ranks keep failing during it. */
    unsigned char *mine = own_set(&a);
    for (int i = 0; i < nexclude; i++) {
        add(mine, exclude[i]);
        a.said_by[exclude[i]] = -1;
        snprintf(a.why[exclude[i]], sizeof a.why[exclude[i]], "excluded by the caller");
    }
    for (int r = 0; r < n; r++)
        if (r != me && !has(mine, r) && !weft_p2p_link_down(c->p2p, r) &&
            weft_p2p_peer_down(c->p2p, r, a.why[r], sizeof a.why[r])) {
            add(mine, r);
            a.said_by[r] = -1;
        }
    leave_for_links(&a);
    if (has(mine, me)) {
        /* This rank leaves (its link to a live rank broke, and it is the
         * higher of the two): what it sees of the others after that is no
         * one's failure but its own (pipes taken down with the failed
         * call), so it accuses no one. */
        memset(mine, 0, a.setb);
        add(mine, me);
    }
    /* A rank that finds itself in the set leaves after the round it
     * learned it in: its last message reached every rank it could reach,
     * and whoever told it told every rank outside its own set too, so no
     * rank waits for it in the next round. */
    for (a.round = 0; changed && a.round <= (uint32_t)n + 1 && (a.round == 0 || !has(mine, me));
         a.round++)
        run_round(&a, &changed);
    list_ranks(mine, n, list, sizeof list);
    if (changed && !has(mine, me)) {
        rc = weft_set_error(&c->core, WEFT_ERR_TIMEOUT, "weft_comm_shrink: the surviving ranks did not agree on "
                            "the failed ones within %u rounds (this rank counts %s failed); ranks kept failing "
                            "during the agreement: call weft_comm_shrink again", a.round, list[0] ? list : "none");
        goto out;
    }
    if (has(mine, me)) {
        int by = a.said_by[me];
        if (by < 0)
            rc = weft_set_error(&c->core, WEFT_ERR_REVOKED, "weft_comm_shrink: this rank (rank %d) leaves: %s; it is "
                                "not in the new comm", me, a.why[me]);
        else
            rc = weft_set_error(&c->core, WEFT_ERR_REVOKED, "weft_comm_shrink: the other ranks count this rank (rank "
                                "%d) failed (rank %d put it in the failed set: it did not hear from this rank in "
                                "time, or a link to it is down); it is not in the new comm", me, by);
        goto out;
    }
    for (int r = 0; r < n; r++)
        if (!has(mine, r)) {
            if (r == me)
                mk.rank = mk.size;
            mk.members[mk.size++] = r;
        }
    /* The set and the attempt name the new comm's set-up exchanges. */
    uint32_t hash = 2166136261u ^ a.attempt;
    for (size_t i = 0; i < a.setb; i++)
        hash = (hash ^ mine[i]) * 16777619u;
    mk.id = WEFT_SPLIT_ID_SHRINK | (hash & ~WEFT_SPLIT_ID_SHRINK);
    if (list[0]) {
        /* The first failed rank's reason as this rank knows it. */
        int first = -1;
        for (int r = 0; r < n && first < 0; r++)
            if (has(mine, r))
                first = r;
        if (a.said_by[first] < 0)
            snprintf(why, sizeof why, "rank %d: %s", first, a.why[first]);
        else
            snprintf(why, sizeof why, "rank %d: counted failed by rank %d", first, a.said_by[first]);
        WEFT_INFO(me, "weft_comm_shrink: ranks %s left out (%s); this rank is rank %d of %d in the new comm", list,
                  why, mk.rank, mk.size);
    } else {
        WEFT_INFO(me, "weft_comm_shrink: no rank failed; this rank is rank %d of %d in the new comm", mk.rank,
                  mk.size);
    }

    /* 3. The new comm. */
    rc = weft_comm_assemble("weft_comm_shrink", make_shrink_boot, &mk, c->core.settings, out);
    if (rc == WEFT_SUCCESS && *out != NULL)
        weft_core_set_parent(&(*out)->core, mk.members, mk.size);   /* texts name the old comm's numbers too */
    if (rc != WEFT_SUCCESS) {
        struct weft_error inner, e = { .code = rc, .rank = me, .peer = -1, .op = "weft_comm_shrink" };
        char reason[640];
        weft_error_thread_get(&inner);
        weft_error_reason(&inner, reason, sizeof(reason));
        if (inner.code != WEFT_SUCCESS)
            e.code = rc = inner.code;
        snprintf(e.text, sizeof(e.text), "the new comm of %d ranks (failed: %s) could not be set up: %s; call "
                 "weft_comm_shrink again", mk.size, list[0] ? list : "none", reason);
        weft_error_put(&c->core, &e);
        goto done;
    }
out:
    if (rc != WEFT_SUCCESS)
        weft_error_keep(&c->core, "weft_comm_shrink", rc);
done:
    free(mk.members);
    free(a.rreq);
    free(a.sreq);
    free(a.why);
    free(a.said_by);
    free(a.next);
    free(a.in);
    free(a.out);
    return rc;
}
