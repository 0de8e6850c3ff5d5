/*
 * Non-blocking collectives: a started op (weft_coll_start) behind a public
 * request handle.
 *
 * The handle is a p2p request of type UPPER (p2p/p2p.h): weft_test,
 * weft_wait and weft_waitall validate it like any handle and call back
 * here (nb_test, nb_wait), so users complete collectives and messages
 * with the same calls, in any mix.
 *
 * Progress. An op moves only when someone issues its next steps (a ring
 * forwards chunk k once it arrived). The owner's test/wait does that; in
 * addition every idle wait of the comm runs nb_idle (a client of the comm's
 * engine, p2p/engine.h; the progress thread runs it too when there is one),
 * which advances every op in flight, so a rank blocked in weft_recv, or in
 * a later blocking collective, still serves the collectives it started
 * earlier -- its peers may be waiting for exactly that.
 *
 * Concurrency. One thread advances an op at a time: `busy` is taken by
 * whoever does (owner or idle hook); the other skips it (the hook) or
 * waits for it (the owner's blocking wait, the slot check). The list of
 * ops in flight is guarded by cc->nb_lock, never held while blocking.
 *
 * Lanes. A call takes lanes by its number modulo WEFT_TAG_COLL_SLOTS; a
 * call whose slot is still held by an op in flight first finishes that op
 * (coll_nb_slot_free), so more calls than slots may be outstanding.
 */
#include <stdlib.h>

#include "backoff.h"
#include "coll_impl.h"
#include "journal.h"
#include "core.h"
#include "engine.h"
#include "log.h"
#include "p2p.h"
#include "tags.h"
#include "weft.h"

struct weft_coll_nb {
    struct weft_coll_nb *next, *prev;   /* cc->nb_head, while op is in flight */
    struct weft_coll    *cc;
    struct weft_coll_op *op;            /* NULL once complete */
    uint32_t             seq;
    int                  linked;
    int                  done, err;
    int                  busy;          /* atomic: a thread advances op */
};

static int busy_try(struct weft_coll_nb *nb)
{
    return !__atomic_exchange_n(&nb->busy, 1, __ATOMIC_ACQUIRE);
}

static void busy_take(struct weft_coll_nb *nb)
{
    while (!busy_try(nb))
        weft_yield();   /* held by an idle hook for one test: short */
}

static void busy_drop(struct weft_coll_nb *nb)
{
    __atomic_store_n(&nb->busy, 0, __ATOMIC_RELEASE);
}

static void nb_unlink(struct weft_coll_nb *nb)
{
    struct weft_coll *cc = nb->cc;
    pthread_mutex_lock(&cc->nb_lock);
    if (nb->linked) {
        if (nb->prev)
            nb->prev->next = nb->next;
        else
            cc->nb_head = nb->next;
        if (nb->next)
            nb->next->prev = nb->prev;
        nb->linked = 0;
        __atomic_sub_fetch(&cc->nb_count, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&cc->nb_lock);
}

/* op completed with rc (busy held). */
static void nb_complete(struct weft_coll_nb *nb, int rc)
{
    struct weft_coll *cc = nb->cc;
    if (cc->journal) {
        weft_journal_end(cc->journal, nb->seq, rc);
        if (rc != WEFT_SUCCESS && cc->core->cfg.trace_dir[0])
            (void)weft_journal_write(cc, "error", 0);
    }
    nb->op = NULL;
    nb->err = rc;
    nb->done = 1;
    nb_unlink(nb);
}

/* Advances nb once (busy held): 1 when complete. */
static int nb_step(struct weft_coll_nb *nb)
{
    int done = 0, rc;
    if (nb->done)
        return 1;
    rc = weft_coll_op_test(nb->op, &done);
    if (done) {
        nb_complete(nb, rc);
        return 1;
    }
    /* A test loop is a wait too: the same per-request clock. */
    struct weft_request *oldest = weft_sched_oldest(nb->op);
    if (oldest)
        weft_p2p_watch(oldest, nb->op->what);
    return 0;
}

static int nb_test(void *arg, int *err)
{
    struct weft_coll_nb *nb = arg;
    if (!busy_try(nb))
        return 0;   /* an idle hook is advancing it right now */
    int done = nb_step(nb);
    busy_drop(nb);
    if (!done)
        return 0;
    *err = nb->err;
    free(nb);
    return 1;
}

static int nb_wait(void *arg)
{
    struct weft_coll_nb *nb = arg;
    busy_take(nb);
    if (!nb->done)
        nb_complete(nb, weft_coll_op_wait(nb->op));
    busy_drop(nb);
    int err = nb->err;
    free(nb);
    return err;
}

static const struct weft_p2p_upper_ops nb_ops = { nb_test, nb_wait };

/* A client of the comm's engine (p2p/engine.h): one pass over the ops in
 * flight, skipping those another thread is advancing. Never blocks. Run by
 * the application's idle waits, and by the comm's progress thread with
 * WEFT_PROGRESS_THREAD=1. */
static int nb_idle(void *arg)
{
    struct weft_coll *cc = arg;
    if (__atomic_load_n(&cc->nb_count, __ATOMIC_RELAXED) == 0)
        return 0;
    if (pthread_mutex_trylock(&cc->nb_lock) != 0)
        return 0;   /* another thread is at it */
    /* Collected first: completing an op unlinks it (takes nb_lock). */
    struct weft_coll_nb *todo[16];
    int k = 0;
    for (struct weft_coll_nb *nb = cc->nb_head; nb && k < 16; nb = nb->next)
        if (busy_try(nb))
            todo[k++] = nb;
    pthread_mutex_unlock(&cc->nb_lock);
    int n = 0;
    for (int i = 0; i < k; i++) {
        n += nb_step(todo[i]);
        busy_drop(todo[i]);
    }
    return n;
}

static int nb_busy(void *arg)
{
    struct weft_coll *cc = arg;
    return __atomic_load_n(&cc->nb_count, __ATOMIC_RELAXED) > 0;
}

static const struct weft_engine_client nb_client = {
    .name = "non-blocking collectives",
    .poll = nb_idle,
    .busy = nb_busy,
    .flags = WEFT_CLIENT_WAITS | WEFT_CLIENT_THREAD,
};

int coll_nb_slot_free(struct weft_coll *cc, uint32_t seq)
{
    if (__atomic_load_n(&cc->nb_count, __ATOMIC_RELAXED) == 0)
        return WEFT_SUCCESS;
    for (;;) {
        struct weft_coll_nb *hold = NULL;
        pthread_mutex_lock(&cc->nb_lock);
        for (struct weft_coll_nb *nb = cc->nb_head; nb; nb = nb->next)
            if (nb->seq != seq && nb->seq % WEFT_TAG_COLL_SLOTS == seq % WEFT_TAG_COLL_SLOTS) {
                hold = nb;
                break;
            }
        if (hold == NULL) {
            pthread_mutex_unlock(&cc->nb_lock);
            return WEFT_SUCCESS;
        }
        /* Taken under the list lock, so it cannot be freed meanwhile (a
         * completed op leaves the list before its owner may free it). */
        if (!busy_try(hold)) {
            pthread_mutex_unlock(&cc->nb_lock);
            weft_yield();
            continue;
        }
        pthread_mutex_unlock(&cc->nb_lock);
        /* Finished here; its result waits for its handle. */
        if (!hold->done)
            nb_complete(hold, weft_coll_op_wait(hold->op));
        busy_drop(hold);
    }
}

int weft_coll_istart(struct weft_coll *cc, const struct weft_coll_args *a, weft_request_t **req)
{
    struct weft_coll_nb *nb = calloc(1, sizeof *nb);
    struct weft_coll_op *op = NULL;
    int rc;

    if (nb == NULL)
        return weft_set_error(cc->core, WEFT_ERR_NO_MEMORY, "non-blocking collective: no memory");
    nb->cc = cc;
    if (__atomic_load_n(&cc->nb_hooked, __ATOMIC_ACQUIRE) == 0) {
        rc = weft_engine_register(weft_p2p_engine(cc->p2p), &nb_client, cc);   /* the same pair twice: once */
        if (rc != WEFT_SUCCESS) {
            free(nb);
            return rc;
        }
        __atomic_store_n(&cc->nb_hooked, 1, __ATOMIC_RELEASE);
    }
    rc = weft_coll_start(cc, a, NULL, 0, &op);
    if (rc != WEFT_SUCCESS) {
        free(nb);
        return rc;
    }
    if (op == NULL) {
        nb->done = 1;   /* complete at the start (one rank, nothing to move) */
    } else {
        nb->op = op;
        nb->seq = op->seq;
        if (cc->journal)
            weft_journal_start(cc->journal, op->seq, a->kind, a->root, a->dtype, a->op, (uint64_t)a->count, 1);
        pthread_mutex_lock(&cc->nb_lock);
        nb->next = cc->nb_head;
        if (cc->nb_head)
            cc->nb_head->prev = nb;
        cc->nb_head = nb;
        nb->linked = 1;
        __atomic_add_fetch(&cc->nb_count, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&cc->nb_lock);
    }
    rc = weft_p2p_user_upper(cc->p2p, &nb_ops, nb, req);
    if (rc != WEFT_SUCCESS) {
        /* No handle to hand out: finish the call here, report no memory. */
        busy_take(nb);
        if (!nb->done)
            nb_complete(nb, weft_coll_op_wait(nb->op));
        free(nb);
        return rc;
    }
    return WEFT_SUCCESS;
}

void weft_coll_nb_abandon_all(struct weft_coll *cc)
{
    for (;;) {
        pthread_mutex_lock(&cc->nb_lock);
        struct weft_coll_nb *nb = cc->nb_head;
        if (nb == NULL) {
            pthread_mutex_unlock(&cc->nb_lock);
            return;
        }
        pthread_mutex_unlock(&cc->nb_lock);
        busy_take(nb);
        struct weft_coll_op *op = nb->op;
        nb_complete(nb, WEFT_ERR_INVALID_ARG);
        weft_coll_op_abandon(op);
        busy_drop(nb);
        /* nb itself stays with its handle, which destroy fails and frees
         * (p2p drain); the records are freed with the comm's list. */
        pthread_mutex_lock(&cc->nb_lock);
        nb->next = cc->nb_dead;
        cc->nb_dead = nb;
        pthread_mutex_unlock(&cc->nb_lock);
    }
}

void coll_nb_fini(struct weft_coll *cc)
{
    if (__atomic_load_n(&cc->nb_hooked, __ATOMIC_ACQUIRE))
        weft_engine_unregister(weft_p2p_engine(cc->p2p), &nb_client, cc);
    cc->nb_hooked = 0;
    while (cc->nb_dead) {
        struct weft_coll_nb *nb = cc->nb_dead;
        cc->nb_dead = nb->next;
        free(nb);
    }
}
