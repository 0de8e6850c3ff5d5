/*
 * What the TCP listener tolerates from connections that are not (yet) one
 * of this job's ranks. Connections are made lazily, at a pair's first
 * message, so the listener stays open from weft_comm_create to
 * weft_comm_destroy and progress accepts on it.
 *
 * The listener is reachable by anything on the network for the comm's
 * whole life: port scanners, health checks, a stale rank of an earlier
 * job, a buggy client. None of them may make the job fail or leak, so:
 *
 *  - an accepted connection has TCP_HELLO_DEADLINE_S seconds to deliver its
 *    complete hello; a rank sends its hello as soon as its connect completes,
 *    and the kernel queues it before we accept, so only a stranger or a
 *    stalled process ever needs longer;
 *  - at most TCP_PENDING_MAX accepted connections may be waiting for their
 *    hello ("pending", not yet identified) at once; accepting one more
 *    closes the oldest pending one, so idle connections cost at most that
 *    many descriptors however many arrive;
 *  - when accept fails for want of descriptors (EMFILE, ENFILE) or kernel
 *    memory, the oldest pending connection is closed and accept retried;
 *    with none pending the listener rests TCP_ACCEPT_BACKOFF_MS before the
 *    next try, and a pair whose connection is not up within 2 x WEFT_TIMEOUT
 *    fails with an error naming the peer (tcp_conn.c);
 *  - every connection turned away is closed at once and logged with one
 *    WEFT_WARN line "tcp: rejected connection from ADDR:PORT: WHY"
 *    (docs/troubleshooting.md, "TCP listener rejections"); connections still
 *    pending at destroy are rejected the same way, so nothing accepted
 *    outlives the comm;
 *  - the counts below are kept per comm and summed up in one info line at
 *    destroy.
 */
#ifndef WEFT_TCP_LISTEN_H
#define WEFT_TCP_LISTEN_H

#include <stddef.h>

/* Seconds from accept to a complete hello. */
#define TCP_HELLO_DEADLINE_S 2.0
/* Most accepted connections waiting for a hello at once. */
#define TCP_PENDING_MAX 64
/* Pause of the listener when accept is out of descriptors and nothing
 * pending can be closed to make room. */
#define TCP_ACCEPT_BACKOFF_MS 100

/* What the listener did over the life of a comm. Every accepted
 * connection ends up counted exactly once (by destroy): as a peer socket,
 * a socket turned down in a collision, or under one rejection reason. */
struct weft_tcp_listen_stats {
    size_t accepted;      /* connections accepted */
    size_t peers;         /* accepted ones that became a rank's socket */
    size_t bad_token;     /* the first 8 bytes were not this job's token (random bytes too) */
    size_t bad_hello;     /* right token, but a wrong rank, socket index or setting */
    size_t duplicate;     /* a socket of a rank that was already connected */
    size_t closed;        /* closed by the remote or failed before the handshake ended */
    size_t timed_out;     /* no complete hello within TCP_HELLO_DEADLINE_S */
    size_t evicted;       /* oldest pending one closed: more than TCP_PENDING_MAX pending */
    size_t fd_evicted;    /* oldest pending one closed to free a descriptor for accept */
    size_t unfinished;    /* still pending at destroy, or its peer closed meanwhile */
    size_t collided;      /* a rank's socket answered COLLIDE: its own set lost a collision (not a rejection) */
    size_t pending_max;   /* most connections pending at once */
    size_t accept_short;  /* accept calls that failed for want of descriptors or memory */
};

#ifdef __cplusplus
extern "C" {
#endif

/* Total of the rejection reasons of s. */
size_t weft_tcp_listen_rejected(const struct weft_tcp_listen_stats *s);

/* Copies the counters of the tcp transport state ctx (zeros for NULL). */
void weft_tcp_listen_stats_get(const void *ctx, struct weft_tcp_listen_stats *out);

#ifdef __cplusplus
}
#endif

#endif
