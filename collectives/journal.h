/*
 * The operation journal of a comm (issue 28's flight recorder): the last
 * WEFT_JOURNAL_LEN collective calls of this rank -- user calls, blocking
 * and non-blocking, the internal ones (weft_comm_split's exchange), and
 * calls refused on this rank's own arguments -- each with its call number
 * (the same on every rank: collectives are numbered in call order), what
 * it was (kind, size, type, operation, root), its state and its times.
 *
 * Always on: a call writes a few words and reads a coarse clock at its
 * start and end (no lock; the entries are atomics, so a dump from another
 * thread reads each word whole). With WEFT_TRACE=<dir> the journal is
 * written to <dir>/weft-trace.<comm>.r<rank>.jsonl, JSON lines, at a
 * collective's failure, at destroy, and by weft_comm_dump (any thread);
 * tools/weft-trace merges the ranks' files and says who is behind.
 * Stream-ordered collectives are not in it yet.
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
    uint32_t seq;        /* the call number */
    int      kind, root, dtype, op, nb;
    uint64_t count;      /* weft_coll_args.count */
    const char *fn;      /* refused: the public call ("weft_allreduce") */
    int      state;      /* enum weft_journal_state; written last (release) */
    int      rc;
    int64_t  t_start_us, t_end_us;   /* coarse clock, from the journal's start */
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
/* A call with number seq starts (nb: non-blocking). */
void weft_journal_start(struct weft_journal *j, uint32_t seq, const struct weft_coll_args *a, int nb);
/* Call seq ended with rc (no-op when its entry was reused since). */
void weft_journal_end(struct weft_journal *j, uint32_t seq, int rc);
/* Call seq was refused on this rank's own arguments (fn: the public call,
 * a string that lives as long as the library). */
void weft_journal_refused(struct weft_journal *j, uint32_t seq, const char *fn);
/* Writes the journal of cc's comm to WEFT_TRACE's directory (reason: why,
 * e.g. "error", "destroy", "weft_comm_dump"). WEFT_SUCCESS, or an error
 * naming the path when it cannot be written; with WEFT_TRACE unset,
 * to_stderr 1 prints it to stderr instead (weft_comm_dump), 0 does nothing. */
int  weft_journal_write(struct weft_coll *cc, const char *reason, int to_stderr);

#endif
