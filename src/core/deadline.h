/*
 * WEFT_TIMEOUT's one rule, and every wait's bound derived from it.
 *
 * The rule: a wait that sees nothing move for WEFT_TIMEOUT seconds fails;
 * WEFT_TIMEOUT=0 means it never does, on every path. Each consumer names its
 * kind of wait, and its bound is factor x WEFT_TIMEOUT + margin, so what a
 * wait allows beyond WEFT_TIMEOUT (two timeouts to connect a socket, a rank's
 * extra second to let the unique-id root speak first) is written once, in the
 * table of deadline.c, and in docs/configuration.md.
 *
 * Housekeeping is the other kind of bound: a clean-up that must end even
 * when waits never fail (reaping sockets that lost a connect race, the
 * message pipes' linger in destroy, the unique-id root telling the ranks why
 * the meeting failed). It fails nothing; it is WEFT_TIMEOUT when set (capped
 * where stated), its own fallback when WEFT_TIMEOUT is 0.
 *
 * Nothing but config.c and deadline.c reads cfg.timeout_s.
 */
#ifndef WEFT_DEADLINE_H
#define WEFT_DEADLINE_H

struct weft_config;

/* Waits that fail with WEFT_ERR_TIMEOUT when their bound passes. */
enum weft_wait {
    WEFT_WAIT_REQUEST,      /* p2p: a request with no progress on its pipe */
    WEFT_WAIT_PEER_SILENT,  /* p2p health: nothing, not even a heartbeat, from a peer on another host */
    WEFT_WAIT_STREAM,       /* stream engine: its oldest operations while nothing completed */
    WEFT_WAIT_DESTROY,      /* destroy's drains: queued sends, stream operations, the final barrier */
    WEFT_WAIT_SHM_PIECE,    /* shm: a peer's share of a CMA copy, the peer alive */
    WEFT_WAIT_TCP_CONNECT,  /* tcp: a connection to a peer not set up */
    WEFT_WAIT_UID_ROOT,     /* unique-id root: no rank joined or contributed */
    WEFT_WAIT_UID_RANK,     /* a rank of a unique-id meeting: the root silent */
    WEFT_WAIT_KINDS
};

/* Clean-ups that end even when WEFT_TIMEOUT is 0; they fail nothing. */
enum weft_housekeeping {
    WEFT_KEEP_TCP_ABANDONED,  /* tcp: sockets that lost a connect race, awaiting the peer's answer */
    WEFT_KEEP_MSGPIPE_LINGER, /* message pipes: destroy finishing transfers both sides started */
    WEFT_KEEP_UID_TELL,       /* unique-id root: telling the ranks why the meeting failed */
    WEFT_KEEP_KINDS
};

/* The wait's bound in seconds; 0 = never. */
double weft_wait_bound(const struct weft_config *cfg, enum weft_wait kind);

/* 1 when a wait of this kind, idle since `since`, has passed its bound at
 * `now` (strictly beyond it); never with WEFT_TIMEOUT=0. */
int weft_wait_expired(const struct weft_config *cfg, enum weft_wait kind, double since, double now);

/* 1 when WEFT_TIMEOUT is 0: no wait fails, so waiters may sleep longer. */
int weft_waits_never_fail(const struct weft_config *cfg);

/* The housekeeping's bound in seconds; always > 0. */
double weft_housekeeping_bound(const struct weft_config *cfg, enum weft_housekeeping kind);

/* Seconds between heartbeats to a peer on another host: a few per
 * WEFT_TIMEOUT, at most ten a second; one a second with WEFT_TIMEOUT=0 (a
 * peer may run with a timeout of its own). */
double weft_heartbeat_period(const struct weft_config *cfg);

/* The configured WEFT_TIMEOUT, for error texts that quote it. */
double weft_timeout_setting(const struct weft_config *cfg);

/* The table, for the tests and docs: name, factor, margin (waits); name,
 * fallback, cap (housekeeping; cap 0 = none). */
const char *weft_wait_rule(enum weft_wait kind, double *factor, double *margin_s);
const char *weft_housekeeping_rule(enum weft_housekeeping kind, double *fallback_s, double *cap_s);

#endif
