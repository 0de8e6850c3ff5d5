/*
 * The schedule engine (see coll_sched.h): builds an op, issues its steps in
 * array order as their dependencies allow, completes them, and reports the
 * first failure the way every collective did before it had an engine.
 */
#include "coll_sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "devcopy.h"
#include "log.h"
#include "p2p.h"
#include "reduce_kernel.h"
#include "tags.h"
#include "coll_impl.h"
#include "weft.h"

enum { STEP_NEW = 0, STEP_ISSUED, STEP_DONE };

static void op_withdraw(struct weft_coll_op *op, int err);

/* How long a failed op waits for a live peer to answer an announcement
 * (weft_coll_op_wait): a peer in weft answers within a progress pass. */
#define LEAVE_S 0.5
/* How long a send the peer refused as a mismatch waits for that peer's
 * notice (op_fail): it is sent right after the refusal. */
#define NOTE_WAIT_S 0.5

size_t weft_sched_add(struct weft_sched_build *b, int kind, int num, void *buf, const void *src, size_t bytes,
                      int peer, int phase, int dep, unsigned flags)
{
    size_t i = b->n++;
    if (b->fence) {
        dep = WEFT_SCHED_FENCE;
        b->fence = 0;
    }
    if (b->steps) {
        struct weft_sched_step *s = &b->steps[i];
        s->buf = buf;
        s->src = src;
        s->bytes = bytes;
        s->peer = peer;
        s->dep = dep;
        s->num = num;
        s->kind = (unsigned char)kind;
        s->phase = (unsigned char)phase;
        s->flags = (unsigned char)flags;
        s->state = STEP_NEW;
        s->req = NULL;
    }
    return i;
}

/* The p2p layer already recorded why; keep that text after ours. Only the
 * first failure of an op is recorded: later ones come from the same cause
 * or from the op giving up. */
static void op_fail(struct weft_coll_op *op, int err, const struct weft_sched_step *s, const char *verb,
                    size_t bytes)
{
    char cause[512];
    if (op->err != WEFT_SUCCESS)
        return;
    /* A step that failed because a rank failed, or because the call failed
     * elsewhere (a peer refusing this call's messages): say that, not which
     * step noticed first. */
    int fc = weft_p2p_fault(op->p2p, op->key, cause, sizeof cause);
    /* A send the peer refused as a mismatch (its receive met this call's
     * message and found another operation there, or it refused the call
     * on its own arguments): the peer decided, and its notice -- naming
     * both calls -- is on its way, maybe behind the refusal. Wait for it
     * (bounded) rather than tell every rank a verdict without the peer's
     * words. */
    if (fc == WEFT_SUCCESS && err == WEFT_ERR_MISMATCH && s->kind == WEFT_SCHED_SEND)
        fc = weft_p2p_await_note(op->p2p, op->key, NOTE_WAIT_S, cause, sizeof cause);
    if (fc != WEFT_SUCCESS) {
        op->err = weft_set_error(op->core, fc, "%s: %s", op->what, cause);
        op_withdraw(op, fc);
        return;
    }
    if (err == WEFT_ERR_MISMATCH && s->kind == WEFT_SCHED_SEND) {
        /* No notice came: say what is known, and leave the telling to the
         * rank that decided. */
        op->err = weft_set_error(op->core, err, "%s step %d: rank %d refused this call's message of %zu B: its same "
                                 "call is another operation (its notice naming both did not come within %.1f s)",
                                 op->what, s->num, s->peer, bytes, NOTE_WAIT_S);
        op_withdraw(op, err);
        return;
    }
    struct weft_error last;
    weft_error_get(op->core, &last);
    weft_error_format(&last, 1, cause, sizeof cause);
    op->err = weft_set_error(op->core, err, "%s step %d: %s of %zu B with peer %d failed (%s): %s",
                             op->what, s->num, verb, bytes, s->peer, weft_err_str(err), cause);
    /* Decided here (a peer alive but not serving, a mismatch seen by the
     * sender): the other ranks' waits in this call end now too. A rank
     * failure was announced by p2p already. (A verdict of the census,
     * p2p/health.c, went out as this call's notice where it was made.) */
    if ((err == WEFT_ERR_TIMEOUT || err == WEFT_ERR_MISMATCH) && !weft_p2p_any_failed(op->p2p)) {
        char text[240], line[1024];
        weft_error_get(op->core, &last);
        weft_error_format(&last, 1, line, sizeof line);
        snprintf(text, sizeof text, "rank %d: %.200s", op->core->rank, line);
        weft_p2p_coll_failed(op->p2p, op->key, err, text);
    }
    op_withdraw(op, err);
}

/* "allgather(8 B/rank)", "bcast(64 B, root 0)", "allreduce(1024 x float32, sum)", "barrier". */
void weft_coll_sig_describe(const struct weft_coll_sig *sig, char *out, size_t n)
{
    unsigned long long p = (unsigned long long)sig->param;
    switch (sig->kind) {
    case WEFT_COLL_ALLGATHER:
        snprintf(out, n, "allgather(%llu B/rank)", p);
        break;
    case WEFT_COLL_BCAST:
        snprintf(out, n, "bcast(%llu B, root %d)", p, sig->root);
        break;
    case WEFT_COLL_BARRIER:
        snprintf(out, n, "barrier");
        break;
    case WEFT_COLL_ALLREDUCE:
        snprintf(out, n, "allreduce(%llu x %s, %s)", p, weft_dtype_name(sig->dtype), weft_op_name(sig->op));
        break;
    case WEFT_COLL_REDUCE_SCATTER:
        snprintf(out, n, "reduce_scatter(%llu x %s per rank, %s)", p, weft_dtype_name(sig->dtype),
                 weft_op_name(sig->op));
        break;
    case WEFT_COLL_REDUCE:
        snprintf(out, n, "reduce(%llu x %s, %s, root %d)", p, weft_dtype_name(sig->dtype), weft_op_name(sig->op),
                 sig->root);
        break;
    case WEFT_COLL_ALLTOALL:
        snprintf(out, n, "alltoall(%llu B/rank)", p);
        break;
    case WEFT_COLL_GATHER:
        snprintf(out, n, "gather(%llu B/rank, root %d)", p, sig->root);
        break;
    case WEFT_COLL_SCATTER:
        snprintf(out, n, "scatter(%llu B/rank, root %d)", p, sig->root);
        break;
    case WEFT_COLL_ALLTOALLV:
        snprintf(out, n, "alltoallv");
        break;
    case WEFT_COLL_SPLIT_EXCHANGE:
        snprintf(out, n, "weft_comm_split (its exchange of colors)");
        break;
    case WEFT_COLL_NODE_SETUP: {
        /* The call it came before, packed: kind in param's top 16 bits. */
        struct weft_coll_sig user = { (int)(sig->param >> 48), sig->root, sig->param & ((1ull << 48) - 1),
                                      sig->dtype, sig->op };
        char u[96] = "";
        if (user.kind > 0 && user.kind < WEFT_COLL_NODE_SETUP)
            weft_coll_sig_describe(&user, u, sizeof u);
        snprintf(out, n, "%s (the node-local collectives' set-up, before it)", u[0] ? u : "a collective");
        break;
    }
    default:
        snprintf(out, n, "a collective of unknown kind %d", sig->kind);
        break;
    }
}

/* w[0] = seq | dtype+1 (8 bits) | op+1 (8 bits) | kind (16 bits). */
struct weft_p2p_check weft_sched_sig_check(const struct weft_coll_sig *sig, uint32_t seq)
{
    struct weft_p2p_check c;
    c.w[0] = ((uint64_t)seq << 32) | ((uint64_t)(uint8_t)(sig->dtype + 1) << 24) |
             ((uint64_t)(uint8_t)(sig->op + 1) << 16) | (uint16_t)sig->kind;
    c.w[1] = (uint64_t)(int64_t)sig->root;
    c.w[2] = sig->param;
    return c;
}

static void check_sig(const struct weft_p2p_check *c, struct weft_coll_sig *sig, uint32_t *seq)
{
    *seq = (uint32_t)(c->w[0] >> 32);
    sig->kind = (int)((uint16_t)c->w[0] & ~WEFT_P2P_CHECK_STREAM);
    sig->op = (int)(uint8_t)(c->w[0] >> 16) - 1;
    sig->dtype = (int)(uint8_t)(c->w[0] >> 24) - 1;
    sig->root = (int)(int64_t)c->w[1];
    sig->param = c->w[2];
}

void weft_sched_describe_check(const struct weft_p2p_check *c, char *out, size_t n)
{
    struct weft_coll_sig sig;
    uint32_t seq;
    check_sig(c, &sig, &seq);
    weft_coll_sig_describe(&sig, out, n);
}

static int sig_equal(const struct weft_coll_sig *a, const struct weft_coll_sig *b)
{
    return a->kind == b->kind && a->root == b->root && a->param == b->param && a->dtype == b->dtype &&
           a->op == b->op;
}

/* Withdraws what the op has in flight that nothing of a peer's is bound
 * to yet (posted receives, unanswered RTS): after a failure the op then
 * completes without waiting for messages that will never come. */
static void op_withdraw(struct weft_coll_op *op, int err)
{
    for (size_t i = op->lo; i < op->next; i++)
        if (op->steps[i].state == STEP_ISSUED && op->steps[i].req)
            (void)weft_p2p_cancel(op->steps[i].req, err);
    /* Messages of this call still on their way (a peer's sends, issued
     * before it learnt of the failure) are dropped on arrival, and an
     * announced large one is refused, so the peer's send completes. */
    for (size_t i = 0; i < op->nsteps; i++)
        if (op->steps[i].kind == WEFT_SCHED_RECV)
            weft_p2p_refuse_lane(op->p2p, op->steps[i].peer, op->tag(op->seq, op->steps[i].phase), err);
    /* One pass answers the announcements already here: the caller may
     * not call into weft again for a while after its call failed. */
    (void)weft_p2p_poll_health(op->p2p);
}

/* The op cannot go on because of something decided elsewhere (a rank
 * failed, another rank saw this call mismatch, abort). */
static const char *done_verb(const struct weft_sched_step *s);

/* waited: the step whose request the caller was waiting on, or NULL. When
 * this rank's own census decided the call (p2p/health.c), the verdict is
 * worded from that step, as any step failure is. */
static int op_check_fault_at(struct weft_coll_op *op, const struct weft_sched_step *waited)
{
    char why[512];
    uint64_t e = weft_p2p_fault_epoch(op->p2p);
    if (e == op->epoch && op->err == WEFT_SUCCESS)
        return 0;
    op->epoch = e;
    if (op->err != WEFT_SUCCESS)
        return 1;
    int code = weft_p2p_fault(op->p2p, op->key, why, sizeof why);
    if (code == WEFT_SUCCESS)
        return 0;
    if (waited != NULL && weft_p2p_coll_decided_here(op->p2p, op->key))
        op->err = weft_set_error(op->core, code, "%s step %d: %s of %zu B with peer %d stalled: %s", op->what,
                                 waited->num, done_verb(waited), waited->bytes, waited->peer, why);
    else
        op->err = weft_set_error(op->core, code, "%s: %s", op->what, why);
    op_withdraw(op, code);
    return 1;
}

static int op_check_fault(struct weft_coll_op *op)
{
    return op_check_fault_at(op, NULL);
}

/* A receive met a message of another call: a stale one (an earlier call
 * that failed, re-posted for) returns 1; else the op fails with
 * WEFT_ERR_MISMATCH naming both sides and tells every peer. */
static int op_mismatch(struct weft_coll_op *op, const struct weft_sched_step *s, const struct weft_p2p_check *peer)
{
    struct weft_coll_sig theirs;
    uint32_t their_seq;
    char mine_s[64], theirs_s[64], text[240];

    check_sig(peer, &theirs, &their_seq);
    if (theirs.kind != 0 && (int32_t)(their_seq - op->seq) < 0)
        return 1;
    if (op->err != WEFT_SUCCESS)
        return 0;
    weft_coll_sig_describe(&op->sig, mine_s, sizeof mine_s);
    if (theirs.kind == 0)
        snprintf(theirs_s, sizeof theirs_s, "something that is not a collective");
    else
        weft_coll_sig_describe(&theirs, theirs_s, sizeof theirs_s);
    if (theirs.kind != 0 && their_seq != op->seq && sig_equal(&theirs, &op->sig))
        snprintf(theirs_s + strlen(theirs_s), sizeof theirs_s - strlen(theirs_s), " as call %u (this is call %u)",
                 their_seq, op->seq);
    snprintf(text, sizeof text, "rank %d called %s, rank %d called %s", op->core->rank, mine_s, s->peer, theirs_s);
    op->err = weft_set_error(op->core, WEFT_ERR_MISMATCH, "%s: collective mismatch: %s", op->what, text);
    weft_p2p_coll_failed(op->p2p, op->key, WEFT_ERR_MISMATCH, text);
    op_withdraw(op, WEFT_ERR_MISMATCH);
    return 0;
}

static const char *done_verb(const struct weft_sched_step *s)
{
    return (s->flags & WEFT_SCHED_F_RECEIVE) ? "receive" : "wait";
}

/* A REDUCE step: on the host, or by kernels on the device (op->dev). */
static int step_reduce(struct weft_coll_op *op, const struct weft_sched_step *s)
{
    size_t es = weft_dtype_size(op->sig.dtype), count = es ? s->bytes / es : 0;
    int avg = (s->flags & WEFT_SCHED_F_AVG) && op->sig.op == WEFT_AVG;
    if (count == 0)
        return WEFT_SUCCESS;
    if (!op->dev) {
        weft_reduce_host(s->buf, s->src, s->src2, count, op->sig.dtype, op->sig.op);
        if (avg)
            weft_reduce_host_div(s->buf, s->buf, count, op->sig.dtype, op->nranks);
        return WEFT_SUCCESS;
    }
    int rc = weft_reduce_device(op->core, s->buf, s->src, s->src2, count, op->sig.dtype, op->sig.op, op->what);
    if (rc == WEFT_SUCCESS && avg)
        rc = weft_reduce_device_div(op->core, s->buf, s->buf, count, op->sig.dtype, op->nranks, op->what);
    return rc;
}

/* Issues step i (its dependency is met). A step that cannot start is
 * complete at once, with the op failed. */
static void step_issue(struct weft_coll_op *op, size_t i)
{
    struct weft_sched_step *s = &op->steps[i];
    int rc;

    switch (s->kind) {
    case WEFT_SCHED_SEND:
        rc = weft_p2p_isend_checked(op->p2p, s->src, s->bytes, s->peer, op->tag(op->seq, s->phase), &op->check,
                                    &s->req, "weft_isend");
        if (rc != WEFT_SUCCESS) {
            s->state = STEP_DONE;
            op_fail(op, rc, s, "isend", s->bytes);
            return;
        }
        s->state = STEP_ISSUED;
        return;
    case WEFT_SCHED_RECV:
        rc = weft_p2p_irecv_checked(op->p2p, s->buf, s->bytes, s->peer, op->tag(op->seq, s->phase), &op->check,
                                    &s->req, "weft_irecv");
        if (rc != WEFT_SUCCESS) {
            s->state = STEP_DONE;
            op_fail(op, rc, s, "irecv", s->bytes);
            return;
        }
        s->state = STEP_ISSUED;
        return;
    case WEFT_SCHED_REDUCE:
        rc = step_reduce(op, s);
        s->state = STEP_DONE;
        if (rc != WEFT_SUCCESS && op->err == WEFT_SUCCESS)
            op->err = rc;
        return;
    default:
        /* weft_devcopy records its own message (naming the op). */
        rc = weft_devcopy(op->core, s->buf, s->src, s->bytes, op->what);
        s->state = STEP_DONE;
        if (rc != WEFT_SUCCESS && op->err == WEFT_SUCCESS)
            op->err = rc;
        return;
    }
}

/* 1 when step i is complete (collecting its result if it just completed).
 * drive: test it even if it does not look complete yet, which runs a
 * progress pass of the pipes; otherwise only a completed request is
 * touched. */
static int step_complete(struct weft_coll_op *op, size_t i, int drive)
{
    struct weft_sched_step *s = &op->steps[i];
    weft_status_t st;
    int done = 0, rc;

    if (s->state == STEP_DONE)
        return 1;
    if (s->state != STEP_ISSUED)
        return 0;
    if (!drive && !weft_p2p_done(s->req))
        return 0;
    memset(&st, 0, sizeof st);
    struct weft_p2p_check peer;
    rc = weft_p2p_test_check(s->req, &done, &st, &peer);
    if (!done)
        return 0;
    s->req = NULL;
    s->state = STEP_DONE;
    if (rc == WEFT_ERR_MISMATCH && s->kind == WEFT_SCHED_RECV) {
        if (op_mismatch(op, s, &peer) && op->err == WEFT_SUCCESS) {
            step_issue(op, i);   /* a stale message of an earlier failed call: dropped, receive again */
            return s->state == STEP_DONE;
        }
        return 1;
    }
    if (rc != WEFT_SUCCESS) {
        op_fail(op, rc, s, done_verb(s), st.bytes);
    } else if ((s->flags & WEFT_SCHED_F_EXACT) && s->kind == WEFT_SCHED_RECV && st.bytes != s->bytes) {
        weft_set_error(op->core, WEFT_ERR_MISMATCH,
                       "recv from peer %d: a message of %zu B where this rank expects %zu B (the two ranks "
                       "disagree on the size of this block)", s->peer, st.bytes, s->bytes);
        op_fail(op, WEFT_ERR_MISMATCH, s, "receive", st.bytes);
    }
    return 1;
}

/* Completes what completed, issues what may go. 1 when the op is over:
 * every step complete, or it failed and nothing it issued is in flight. */
static int op_advance(struct weft_coll_op *op)
{
    if (op->lo < op->next)
        step_complete(op, op->lo, 1);
    for (;;) {
        while (op->lo < op->next && step_complete(op, op->lo, 0))
            op->lo++;
        if (op->err != WEFT_SUCCESS || op->next == op->nsteps)
            return op->lo == op->next;
        const struct weft_sched_step *s = &op->steps[op->next];
        if (s->dep == WEFT_SCHED_FENCE) {
            if (op->lo < op->next)
                return 0;
        } else if (s->dep >= 0) {
            if (!step_complete(op, (size_t)s->dep, 0))
                return 0;
            if (op->err != WEFT_SUCCESS)
                continue;   /* its dependency failed: issue nothing more */
        }
        step_issue(op, op->next++);
    }
}

/*
 * Spare op allocations. An op's memory of at least SPARE_MIN bytes goes on
 * its comm's list when the op is freed; the next op takes the smallest
 * spare it fits in. At most SPARES_MAX spares and SPARE_BYTES_MAX bytes in
 * all a comm (the smallest go first to make room; an allocation larger
 * than that is freed): a comm whose calls stay small keeps little, and the
 * list holds what was in flight at once (non-blocking calls) at most.
 * Kept ops (weft_p2p_keep) are not spares: p2p frees them, their requests
 * may still use them.
 */
#define SPARE_MIN ((size_t)4 << 10)
#define SPARE_BYTES_MAX ((size_t)16 << 20)
#define SPARES_MAX 8

struct weft_coll_spare {
    struct weft_coll_spare *next;
    size_t                  bytes;
};

/* An allocation of at least bytes: a spare of cc's, else malloc's. *got:
 * its size. */
static void *op_alloc(struct weft_coll *cc, size_t bytes, size_t *got)
{
    struct weft_coll_spare **best = NULL, *sp = NULL;
    if (bytes >= SPARE_MIN) {
        pthread_mutex_lock(&cc->stage_lock);
        for (struct weft_coll_spare **pp = &cc->op_spares; *pp; pp = &(*pp)->next)
            if ((*pp)->bytes >= bytes && (best == NULL || (*pp)->bytes < (*best)->bytes))
                best = pp;
        if (best) {
            sp = *best;
            *best = sp->next;
            cc->op_nspares--;
            cc->op_spare_bytes -= sp->bytes;
        }
        pthread_mutex_unlock(&cc->stage_lock);
    }
    if (sp) {
        *got = sp->bytes;
        return sp;
    }
    *got = bytes;
    return malloc(bytes);
}

/* Gives mem (bytes long, from op_alloc) to cc's spares, or back to malloc. */
static void op_release(struct weft_coll *cc, void *mem, size_t bytes)
{
    struct weft_coll_spare *evicted = NULL;
    if (bytes < SPARE_MIN || bytes > SPARE_BYTES_MAX) {
        free(mem);
        return;
    }
    pthread_mutex_lock(&cc->stage_lock);
    while (cc->op_spares && (cc->op_nspares >= SPARES_MAX || cc->op_spare_bytes + bytes > SPARE_BYTES_MAX)) {
        struct weft_coll_spare **small = &cc->op_spares;
        for (struct weft_coll_spare **pp = &cc->op_spares; *pp; pp = &(*pp)->next)
            if ((*pp)->bytes < (*small)->bytes)
                small = pp;
        struct weft_coll_spare *s = *small;
        *small = s->next;
        cc->op_nspares--;
        cc->op_spare_bytes -= s->bytes;
        s->next = evicted;
        evicted = s;
    }
    struct weft_coll_spare *sp = mem;
    sp->bytes = bytes;
    sp->next = cc->op_spares;
    cc->op_spares = sp;
    cc->op_nspares++;
    cc->op_spare_bytes += bytes;
    pthread_mutex_unlock(&cc->stage_lock);
    while (evicted) {   /* freed outside the lock */
        struct weft_coll_spare *n = evicted->next;
        free(evicted);
        evicted = n;
    }
}

void weft_sched_spares_fini(struct weft_coll *cc)
{
    while (cc->op_spares) {
        struct weft_coll_spare *n = cc->op_spares->next;
        free(cc->op_spares);
        cc->op_spares = n;
    }
    cc->op_nspares = 0;
    cc->op_spare_bytes = 0;
}

/* Frees the op and what it holds (device scratch, staging). */
static void op_free(struct weft_coll_op *op)
{
    if (op->scratch_st)
        coll_scratch_put(op->stage_cc, op->scratch_st);   /* never cudaFree here: coll_stage.c says why */
    else if (op->scratch_dev)
        weft_reduce_device_free(op->core, op->scratch_dev);
    if (op->stage)
        coll_stage_put(op->stage_cc, op->stage);
    op_release(op->cc, op, op->alloc_bytes);
}

int weft_sched_start(struct weft_coll *cc, const struct weft_sched_call *call, weft_sched_build_fn build,
                     const void *args, struct weft_coll_op **out)
{
    struct weft_p2p *p2p = cc->p2p;
    struct weft_core *core = cc->core;
    struct weft_sched_build b = { NULL, 0, 0, NULL };
    struct weft_coll_op *op;
    size_t head, n, host_scratch = call->scratch_dev ? 0 : call->scratch_bytes;
    const char *what = call->what;

    *out = NULL;
    if (call->prep && call->prep->dry) {
        /* weft_coll_prepare: take the device scratch now, on the caller's
         * thread (cudaMalloc synchronises the device); build nothing. */
        if (call->scratch_dev && call->scratch_bytes > 0 && call->stage_cc != NULL) {
            call->prep->scratch = coll_scratch_get(call->stage_cc, call->scratch_bytes);
            if (call->prep->scratch == NULL)
                return weft_set_error(core, WEFT_ERR_NO_MEMORY, "%s: no device memory for %zu bytes of scratch",
                                      what, call->scratch_bytes);
        }
        return WEFT_SUCCESS;
    }
    build(&b, args);
    n = b.n;
    /* op + steps, rounded up so the scratch is aligned for any copy. */
    if (n > (SIZE_MAX - sizeof *op - 64) / sizeof op->steps[0])
        goto nomem;
    head = (sizeof *op + n * sizeof op->steps[0] + 63) & ~(size_t)63;
    if (host_scratch > SIZE_MAX - head)
        goto nomem;
    size_t got;
    op = op_alloc(cc, head + host_scratch, &got);
    if (op == NULL)
        goto nomem;
    op->cc = cc;
    op->alloc_bytes = got;
    op->p2p = p2p;
    op->core = core;
    op->what = what;
    op->tag = call->tag;
    op->seq = call->seq;
    op->err = WEFT_SUCCESS;
    op->sig = call->sig;
    op->check = weft_sched_sig_check(&call->sig, call->seq);
    /* The stream engine's collectives are numbered apart (their own lanes,
     * weft_tag_scoll): their fingerprints and verdicts say so (p2p.h). */
    const int stream = weft_tag_is_scoll(call->tag(call->seq, 0));
    if (stream)
        op->check.w[0] |= WEFT_P2P_CHECK_STREAM;
    op->key = weft_p2p_call_key(call->seq, stream);
    op->nranks = call->nranks > 0 ? call->nranks : 1;
    op->dev = call->scratch_dev;
    op->scratch_dev = NULL;
    op->scratch_st = NULL;
    op->stage_cc = call->stage_cc;
    op->stage = call->stage;
    op->epoch = (uint64_t)-1;   /* looked at before anything is issued */
    op->nsteps = n;
    op->next = 0;
    op->lo = 0;
    op->left = 0;
    op->leave_until = 0;
    op->scratch = host_scratch ? (char *)op + head : NULL;
    if (call->scratch_dev && call->scratch_bytes > 0) {
        if (call->prep && call->prep->scratch) {
            op->scratch_st = call->prep->scratch;   /* taken by weft_coll_prepare */
            call->prep->scratch = NULL;
            op->scratch_dev = coll_stage_ptr(op->scratch_st);
        } else if (call->stage_cc != NULL) {
            op->scratch_st = coll_scratch_get(call->stage_cc, call->scratch_bytes);
            op->scratch_dev = op->scratch_st ? coll_stage_ptr(op->scratch_st) : NULL;
        } else {
            op->scratch_dev = weft_reduce_device_alloc(core, call->scratch_bytes);
        }
        if (op->scratch_dev == NULL) {
            op->stage = NULL;
            op_release(cc, op, got);
            goto nomem;
        }
        op->scratch = op->scratch_dev;
    }

    b.steps = op->steps;
    b.n = 0;
    b.fence = 0;
    b.scratch = op->scratch;
    build(&b, args);
    if (b.n != n) {
        op_free(op);
        return weft_set_error(core, WEFT_ERR_INTERNAL, "%s: schedule has %zu steps, counted %zu", what, b.n, n);
    }
    /* A rank that failed earlier, or this very call already failed on a
     * rank that got further: nothing is issued. */
    if (!op_check_fault(op))
        (void)op_advance(op);
    *out = op;
    return WEFT_SUCCESS;

nomem:
    if (call->stage)
        coll_stage_put(call->stage_cc, call->stage);
    return weft_set_error(core, WEFT_ERR_NO_MEMORY, "%s: no memory for %zu schedule steps and %zu bytes of %s scratch",
                          what, n, call->scratch_bytes, call->scratch_dev ? "device" : "host");
}

struct weft_request *weft_sched_oldest(const struct weft_coll_op *op)
{
    for (size_t i = op->lo; i < op->next; i++)
        if (op->steps[i].state == STEP_ISSUED && op->steps[i].req)
            return op->steps[i].req;
    return NULL;
}

int weft_coll_op_test(struct weft_coll_op *op, int *done)
{
    int rc;
    if (op == NULL) {
        *done = 1;
        return WEFT_SUCCESS;
    }
    op_check_fault(op);
    if (!op_advance(op)) {
        *done = 0;
        return WEFT_SUCCESS;
    }
    rc = op->err;
    op_free(op);
    *done = 1;
    return rc;
}

int weft_coll_op_wait(struct weft_coll_op *op)
{
    int rc;
    if (op == NULL)
        return WEFT_SUCCESS;
    while (!op_advance(op)) {
        /* Not over, so some issued step is in flight (lo < next). Wait for
         * what holds up the next step, else for the oldest in flight. */
        size_t t = op->lo;
        if (op->err == WEFT_SUCCESS && op->next < op->nsteps) {
            int d = op->steps[op->next].dep;
            if (d >= 0 && op->steps[d].state == STEP_ISSUED)
                t = (size_t)d;
        }
        struct weft_sched_step *s = &op->steps[t];
        struct weft_request *r = s->req;
        if (op->err != WEFT_SUCCESS) {
            /* An op that failed already (a peer refused this call, say)
             * waits only for what is bound to a peer; its verdict stays the
             * last error, whatever those requests' own timeouts say. An
             * announced send its peer has not answered within LEAVE_S of the
             * failure is left: the peer is not in weft on this comm (it is
             * behind, or skipped this call) and cannot answer before it
             * calls again -- which it may do only after this rank returns
             * (an MPI_Barrier, say). The request stays with its pipe, and
             * the op's memory with it (op->left). */
            struct weft_error verdict;
            weft_error_get(op->core, &verdict);
            if (op->leave_until == 0)
                op->leave_until = weft_now() + LEAVE_S;   /* one grace per op, not per request */
            double bound = op->leave_until - weft_now();
            if (!weft_p2p_done(r) && !weft_p2p_wait_announced(r, bound > 0 ? bound : 0, op->what)) {
                s->req = NULL;
                s->state = STEP_DONE;
                op->left++;
            }
            weft_error_put(op->core, &verdict);
            continue;
        }
        int wrc = weft_p2p_wait_done_until(r, op->what, &op->epoch);
        if (wrc == WEFT_P2P_FAULT) {
            op_check_fault_at(op, s);
            continue;
        }
        if (wrc != WEFT_SUCCESS && !weft_p2p_done(r)) {
            /* Not completed by the timeout: wait the request out (bounded,
             * it breaks its pipe) and free it. */
            weft_status_t st;
            memset(&st, 0, sizeof st);
            int rc2 = weft_p2p_wait(r, &st);
            s->req = NULL;
            s->state = STEP_DONE;
            op_fail(op, rc2 != WEFT_SUCCESS ? rc2 : wrc, s, done_verb(s), st.bytes);
        }
    }
    rc = op->err;
    if (rc != WEFT_SUCCESS)
        (void)weft_p2p_flush(op->p2p, FAILURE_FLUSH_S);   /* the notices out before the caller leaves weft */
    if (op->left == 0)
        op_free(op);
    else   /* a request left to its pipe may still send from its scratch: freed with the comm (device
            * scratch and staging, a GPU op's, are not returned: the comm's caches may be gone by then) */
        weft_p2p_keep(op->p2p, op);
    return rc;
}

void weft_coll_op_abandon(struct weft_coll_op *op)
{
    int in_flight = 0;
    if (op == NULL)
        return;
    op->err = WEFT_ERR_TIMEOUT;   /* given up: later failures are not news */
    for (size_t i = op->lo; i < op->next; i++) {
        if (op->steps[i].state != STEP_ISSUED)
            continue;
        if (!step_complete(op, i, 0))
            in_flight = 1;
    }
    /* A request still in flight may yet write into the op's scratch or read
     * its steps: left to the pipes on purpose. */
    if (!in_flight)
        op_free(op);
}
