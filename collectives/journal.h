/*
 * The operation journal of a comm (issue 28's flight recorder): the last
 * WEFT_JOURNAL_LEN collective calls of this rank -- user calls, blocking
 * and non-blocking, the internal ones (weft_comm_split's exchange), and
 * calls refused on this rank's own arguments -- each with its call number
 * (the same on every rank: collectives are numbered in call order), what
 * it was (kind, size, type, operation, root), its state and its times.
 *
 * Always on: a call writes four words and reads a coarse clock at its
 * start, and one word at its end (a failed call reads the clock again); no
 * lock: the entries are atomics, and a dump from another thread reads an
 * entry's tag before and after its other words and skips it if it moved. With WEFT_TRACE=<dir> the journal is
 * written to <dir>/weft-trace.<comm>.r<rank>.jsonl, JSON lines, at a
 * collective's failure, at destroy, and by weft_comm_dump (any thread);
 * tools/weft-trace merges the ranks' files and says who is behind.
 * Stream-ordered collectives (src/stream) have a ring of their own beside
 * it (struct weft_coll's sjournal), numbered in their own call order, and
 * go to the same file marked "stream":1.
 */
#ifndef WEFT_JOURNAL_H
#define WEFT_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

struct weft_coll;
struct weft_coll_args;

#define WEFT_JOURNAL_LEN 256

enum weft_journal_state { JOURNAL_EMPTY = 0, JOURNAL_STARTED, JOURNAL_DONE, JOURNAL_FAILED, JOURNAL_REFUSED };

struct weft_journal_entry {
    uint64_t    tag;         /* seq << 8 | state (enum weft_journal_state); written last, with release */
    uint64_t    shape;       /* kind | dtype << 8 | op << 16 | nb << 24 | (uint32_t)root << 32 (8 bits each
                                but root; dtype and op 0xff for none) */
    uint64_t    count;       /* weft_coll_args.count */
    int64_t     t_start_us;  /* coarse clock, from the journal's start */
    int64_t     t_end_us;    /* a failed or refused call's end; a call that succeeds reads no clock */
    int         rc;
    const char *fn;          /* refused: the public call ("weft_allreduce") */
};

struct weft_journal {
    struct weft_journal_entry e[WEFT_JOURNAL_LEN];
    int64_t  t0_us;      /* coarse monotonic clock at creation */
    int64_t  wall0_ms;   /* wall clock at creation (ms since the epoch) */
    unsigned ordinal;    /* this process's comms with a journal, in creation order: names the file */
    int      written;    /* files written so far (atomic) */
};

/* Sets j up (zeroed by the caller's calloc or memset). */
void weft_journal_init(struct weft_journal *j);
/* Sets j up as a second ring of main's comm (the stream-ordered
 * collectives): the same clock, the same file. */
void weft_journal_init_beside(struct weft_journal *j, const struct weft_journal *main);
int64_t weft_journal_now_us(void);   /* the coarse clock */

/* A call with number seq starts (nb: non-blocking). Inline, one clock read
 * and four stores: every collective call passes here (a node-local one
 * takes a few hundred ns in all). */
static inline void weft_journal_start(struct weft_journal *j, uint32_t seq, int kind, int root, int dtype, int op,
                                      uint64_t count, int nb)
{
    struct weft_journal_entry *e = &j->e[seq % WEFT_JOURNAL_LEN];
    uint64_t shape = (uint64_t)(kind & 0xff) | (uint64_t)(dtype & 0xff) << 8 | (uint64_t)(op & 0xff) << 16 |
                     (uint64_t)(nb & 1) << 24 | (uint64_t)(uint32_t)root << 32;
    __atomic_store_n(&e->tag, 0, __ATOMIC_RELEASE);   /* a dump skips it while it changes */
    __atomic_store_n(&e->shape, shape, __ATOMIC_RELAXED);
    __atomic_store_n(&e->count, count, __ATOMIC_RELAXED);
    __atomic_store_n(&e->t_start_us, weft_journal_now_us() - j->t0_us, __ATOMIC_RELAXED);
    __atomic_store_n(&e->tag, (uint64_t)seq << 8 | JOURNAL_STARTED, __ATOMIC_RELEASE);
}

/* Call seq failed (rc != 0): its end time and code. */
void weft_journal_failed(struct weft_journal *j, uint32_t seq, int rc);

/* Call seq ended with rc (nothing when its entry was reused since). */
static inline void weft_journal_end(struct weft_journal *j, uint32_t seq, int rc)
{
    struct weft_journal_entry *e = &j->e[seq % WEFT_JOURNAL_LEN];
    if (rc != 0) {
        weft_journal_failed(j, seq, rc);
        return;
    }
    if (__atomic_load_n(&e->tag, __ATOMIC_RELAXED) == ((uint64_t)seq << 8 | JOURNAL_STARTED))
        __atomic_store_n(&e->tag, (uint64_t)seq << 8 | JOURNAL_DONE, __ATOMIC_RELEASE);
}
/* Call seq was refused on this rank's own arguments (fn: the public call,
 * a string that lives as long as the library). */
void weft_journal_refused(struct weft_journal *j, uint32_t seq, const char *fn);
/* Writes the journal of cc's comm to WEFT_TRACE's directory (reason: why,
 * e.g. "error", "destroy", "weft_comm_dump"). WEFT_SUCCESS, or an error
 * naming the path when it cannot be written; with WEFT_TRACE unset,
 * to_stderr 1 prints it to stderr instead (weft_comm_dump), 0 does nothing. */
int  weft_journal_write(struct weft_coll *cc, const char *reason, int to_stderr);

#endif
