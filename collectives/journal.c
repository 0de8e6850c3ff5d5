/*
 * The operation journal (journal.h): recording, and writing it as JSON lines.
 *
 * File: one header line, then one line per call still in the ring, oldest
 * first:
 *   {"weft_trace":1,"comm":0,"rank":2,"size":4,"host":"vm","pid":4242,
 *    "reason":"error","wall_ms":...,"now_us":5123000,"next_call":18,
 *    "last_error":"rank 2: ..."}
 *   {"call":17,"what":"allreduce(262144 x int32, sum)","nb":0,
 *    "state":"done","start_us":5100000,"rc":0,"error":"success"}
 * Times are microseconds of a coarse clock (a few ms steps) from the
 * comm's creation; a failed or refused call also has end_us (one that
 * succeeded reads no clock at its end); next_call is the number the next
 * collective will take. Then the stream-ordered collectives' lines, their
 * own numbers, oldest first, each with "stream":1 (state "started": queued
 * or running, not yet complete on its stream).
 */
#include "journal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "coll_sched.h"
#include "core.h"
#include "log.h"
#include "p2p.h"

static unsigned g_ordinal;   /* comms with a journal made by this process (atomic) */

int64_t weft_journal_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void weft_journal_init(struct weft_journal *j)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    j->t0_us = weft_journal_now_us();
    j->wall0_ms = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
    j->ordinal = __atomic_fetch_add(&g_ordinal, 1u, __ATOMIC_RELAXED);
}

void weft_journal_init_beside(struct weft_journal *j, const struct weft_journal *main)
{
    j->t0_us = main->t0_us;
    j->wall0_ms = main->wall0_ms;
    j->ordinal = main->ordinal;
}

void weft_journal_failed(struct weft_journal *j, uint32_t seq, int rc)
{
    struct weft_journal_entry *e = &j->e[seq % WEFT_JOURNAL_LEN];
    if (__atomic_load_n(&e->tag, __ATOMIC_RELAXED) != ((uint64_t)seq << 8 | JOURNAL_STARTED))
        return;
    __atomic_store_n(&e->rc, rc, __ATOMIC_RELAXED);
    __atomic_store_n(&e->t_end_us, weft_journal_now_us() - j->t0_us, __ATOMIC_RELAXED);
    __atomic_store_n(&e->tag, (uint64_t)seq << 8 | JOURNAL_FAILED, __ATOMIC_RELEASE);
}

void weft_journal_refused(struct weft_journal *j, uint32_t seq, const char *fn)
{
    struct weft_journal_entry *e = &j->e[seq % WEFT_JOURNAL_LEN];
    int64_t t = weft_journal_now_us() - j->t0_us;
    __atomic_store_n(&e->tag, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&e->shape, (uint64_t)0xffff00u | (uint64_t)UINT32_MAX << 32, __ATOMIC_RELAXED);
    __atomic_store_n(&e->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->fn, fn, __ATOMIC_RELAXED);
    __atomic_store_n(&e->rc, WEFT_ERR_INVALID_ARG, __ATOMIC_RELAXED);
    __atomic_store_n(&e->t_start_us, t, __ATOMIC_RELAXED);
    __atomic_store_n(&e->t_end_us, t, __ATOMIC_RELAXED);
    __atomic_store_n(&e->tag, (uint64_t)seq << 8 | JOURNAL_REFUSED, __ATOMIC_RELEASE);
}

/* s as a JSON string body (quotes, backslashes, control characters escaped). */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* An entry as read by a dump. */
struct seen {
    uint32_t    seq;
    int         state, kind, dtype, op, nb, root, rc;
    uint64_t    count;
    int64_t     t_start_us, t_end_us;
    const char *fn;
};

static int by_seq(const void *x, const void *y)
{
    const struct seen *a = x, *b = y;
    int32_t d = (int32_t)(a->seq - b->seq);
    return (d > 0) - (d < 0);
}

static const char *const state_name[] = { "empty", "started", "done", "failed", "refused" };

/* Reads entry s into d: 1, or 0 when it is empty or changed meanwhile
 * (a call on another thread wrote it: it is newer than this dump). */
static int read_entry(const struct weft_journal_entry *s, struct seen *d)
{
    uint64_t tag = __atomic_load_n(&s->tag, __ATOMIC_ACQUIRE);
    if ((tag & 0xff) == JOURNAL_EMPTY)
        return 0;
    uint64_t shape = __atomic_load_n(&s->shape, __ATOMIC_RELAXED);
    d->count = __atomic_load_n(&s->count, __ATOMIC_RELAXED);
    d->t_start_us = __atomic_load_n(&s->t_start_us, __ATOMIC_RELAXED);
    d->t_end_us = __atomic_load_n(&s->t_end_us, __ATOMIC_RELAXED);
    d->rc = __atomic_load_n(&s->rc, __ATOMIC_RELAXED);
    d->fn = __atomic_load_n(&s->fn, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&s->tag, __ATOMIC_RELAXED) != tag)
        return 0;
    d->seq = (uint32_t)(tag >> 8);
    d->state = (int)(tag & 0xff);
    d->kind = (int)(shape & 0xff);
    d->dtype = (shape >> 8 & 0xff) == 0xff ? -1 : (int)(shape >> 8 & 0xff);
    d->op = (shape >> 16 & 0xff) == 0xff ? -1 : (int)(shape >> 16 & 0xff);
    d->nb = (int)(shape >> 24 & 1);
    d->root = (int)(int32_t)(uint32_t)(shape >> 32);
    return d->state <= JOURNAL_REFUSED;
}

static void write_calls(FILE *f, const struct weft_journal *j, struct seen *copy, int stream);

static void write_all(FILE *f, struct weft_coll *cc, const char *reason)
{
    struct weft_journal *j = cc->journal;
    struct seen *copy = malloc(WEFT_JOURNAL_LEN * sizeof *copy);
    struct weft_error e;
    struct timeval tv;
    char host[256] = "?", last[1100];

    gettimeofday(&tv, NULL);
    gethostname(host, sizeof host - 1);
    weft_error_get(cc->core, &e);
    if (e.code != 0)
        weft_error_format(&e, 1, last, sizeof last);
    else
        last[0] = '\0';
    fprintf(f, "{\"weft_trace\":1,\"comm\":%u,\"rank\":%d,\"size\":%d,\"host\":", j->ordinal, cc->core->rank,
            cc->core->size);
    json_str(f, host);
    fprintf(f, ",\"pid\":%d,\"reason\":", (int)getpid());
    json_str(f, reason);
    fprintf(f, ",\"wall_ms\":%lld,\"wall0_ms\":%lld,\"now_us\":%lld,\"next_call\":%u,\"last_error\":",
            (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000, (long long)j->wall0_ms,
            (long long)(weft_journal_now_us() - j->t0_us), __atomic_load_n(&cc->seq, __ATOMIC_RELAXED));
    json_str(f, last);
    fputs("}\n", f);
    if (copy == NULL)
        return;
    write_calls(f, j, copy, 0);
    if (cc->sjournal)
        write_calls(f, cc->sjournal, copy, 1);
    free(copy);
}

/* One line per entry of ring j still there, oldest first (copy: room for
 * the ring); stream: the stream-ordered ring (its lines say so). */
static void write_calls(FILE *f, const struct weft_journal *j, struct seen *copy, int stream)
{
    size_t n = 0;
    for (size_t i = 0; i < WEFT_JOURNAL_LEN; i++)
        n += (size_t)read_entry(&j->e[i], &copy[n]);
    qsort(copy, n, sizeof *copy, by_seq);
    for (size_t i = 0; i < n; i++) {
        const struct seen *d = &copy[i];
        struct weft_coll_sig sig = { d->kind, d->root, d->count, d->dtype, d->op };
        char what[96];
        if (d->state == JOURNAL_REFUSED)
            snprintf(what, sizeof what, "%s (refused on this rank's arguments)", d->fn ? d->fn : "a collective");
        else
            weft_coll_sig_describe(&sig, what, sizeof what);
        fprintf(f, stream ? "{\"call\":%u,\"stream\":1,\"what\":" : "{\"call\":%u,\"what\":", d->seq);
        json_str(f, what);
        fprintf(f, ",\"nb\":%d,\"state\":\"%s\",\"start_us\":%lld", d->nb, state_name[d->state],
                (long long)d->t_start_us);
        /* A call that succeeded reads no clock at its end: no end time. */
        if (d->state == JOURNAL_FAILED || d->state == JOURNAL_REFUSED)
            fprintf(f, ",\"end_us\":%lld", (long long)d->t_end_us);
        if (d->state != JOURNAL_STARTED)
            fprintf(f, ",\"rc\":%d,\"error\":\"%s\"", d->state == JOURNAL_DONE ? 0 : d->rc,
                    weft_err_str(d->state == JOURNAL_DONE ? 0 : d->rc));
        fputs("}\n", f);
    }
}

int weft_journal_write(struct weft_coll *cc, const char *reason, int to_stderr)
{
    const char *dir = cc->core->cfg.trace_dir;
    char path[512], tmp[540];
    FILE *f;

    if (cc->journal == NULL)
        return WEFT_SUCCESS;   /* a comm of one rank, or no memory for it: nothing recorded */
    if (dir[0] == '\0') {
        if (to_stderr)
            write_all(stderr, cc, reason);
        return WEFT_SUCCESS;
    }
    snprintf(path, sizeof path, "%s/weft-trace.%u.r%d.jsonl", dir, cc->journal->ordinal, cc->core->rank);
    /* Written whole, then renamed: a reader never sees half a file. */
    static unsigned tmp_no;   /* two threads may write at once (an error, weft_comm_dump) */
    snprintf(tmp, sizeof tmp, "%s.tmp%d.%u", path, (int)getpid(), __atomic_fetch_add(&tmp_no, 1u, __ATOMIC_RELAXED));
    f = fopen(tmp, "w");
    int err = 0;
    if (f == NULL) {
        err = errno;
    } else {
        write_all(f, cc, reason);
        int bad = ferror(f);
        if (fclose(f) != 0 || bad || rename(tmp, path) != 0)
            err = errno ? errno : EIO;
    }
    if (err != 0) {
        unlink(tmp);
        /* Asked for (weft_comm_dump): the call's error. Else (a failing
         * call, destroy) a warning: the call's own error must stay. */
        if (to_stderr)
            return weft_set_error(cc->core, WEFT_ERR_UNSUPPORTED, "weft_comm_dump: WEFT_TRACE: cannot write %s: %s",
                                  path, strerror(err));
        WEFT_WARN(cc->core->rank, "WEFT_TRACE: cannot write %s: %s", path, strerror(err));
        return WEFT_ERR_UNSUPPORTED;
    }
    if (__atomic_fetch_add(&cc->journal->written, 1, __ATOMIC_RELAXED) == 0)
        WEFT_INFO(cc->core->rank, "WEFT_TRACE: the journal of comm %u went to %s (%s)", cc->journal->ordinal, path,
                  reason);
    return WEFT_SUCCESS;
}
