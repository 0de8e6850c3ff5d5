/*
 * TCP transport: ranks on different nodes without RDMA (or every pair when
 * WEFT_TRANSPORTS=tcp).
 *
 * Per peer: one control connection that carries framed control frames
 * (the pipe's header and payload, opaque bytes here), plus WEFT_TCP_STREAMS
 * data connections that carry rendezvous payloads as raw bytes. A pushed
 * message is cut into chunks striped round-robin over the data sockets
 * (tcp_stripe.h); since the pipe guarantees that pushes on the sender and
 * expected receives on the receiver come in the same (CTS) order, each data
 * socket is simply the concatenation of its share of message after message,
 * and the receiver reads straight into the user buffer with no per-chunk
 * header. So tcp needs no rendezvous key: rndv_expect writes an empty one.
 *
 * Set-up: create opens the listening socket before the rank cards are
 * exchanged, so by the time connect runs every listener exists and the
 * kernel's backlog completes connections even while the acceptor is busy
 * elsewhere; the lower rank of a pair connects to the higher one. Every new
 * connection starts with a hello whose job token (from the rank card's
 * header) the acceptor checks before it reads anything else (tcp_hello.h).
 * Connections that fail to present one in time are closed and counted, and
 * a bounded number of them may wait at once (tcp_listen.h).
 *
 * Every function here but sleep runs under the pipe layer's lock
 * (transport.h), so per-comm state needs no locking of its own. Nothing
 * blocks except connect, whose waits are bounded by WEFT_TIMEOUT.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core.h"
#include "list.h"
#include "log.h"
#include "netif.h"
#include "tcp_hello.h"
#include "tcp_listen.h"
#include "tcp_stripe.h"
#include "transport.h"
#include "weft.h"

/* Marks the start of every control frame: a desynchronised stream is caught
 * at once instead of being parsed as garbage headers. */
#define TCP_FRAME_MAGIC 0x74666577u

/* Control bytes a peer may have waiting in user space before ctrl_send
 * answers WEFT_EAGAIN and the pipe queues the message itself. */
#define TCP_CTRL_OUT_BOUND ((size_t)4 << 20)

/* Socket buffer size asked for on every connection (0 = leave the kernel's
 * autotuning alone). Autotuning on Linux grows loopback and LAN windows
 * past what a fixed setting capped by net.core.[rw]mem_max allows. */
#ifndef TCP_SOCKBUF_BYTES
#define TCP_SOCKBUF_BYTES 0
#endif

/* Most iovec entries and bytes handed to one sendmsg/recvmsg. */
#define TCP_IOV_MAX 64
#define TCP_IO_MAX_BYTES ((uint64_t)1 << 30)

/* Read-ahead room of the inbound control staging buffer beyond one largest
 * frame: a parse pass always leaves less than one frame behind, so a recv
 * always has at least this much room. Kept small because every peer has one. */
#define TCP_CTRL_IN_SLACK ((size_t)64 << 10)

/* This transport's blob in the rank card: the rank's listener. */
struct tcp_card {
    uint16_t family;    /* AF_INET; 0 = tcp not offered by this rank */
    uint16_t port;      /* network byte order */
    uint8_t  addr[16];  /* the IPv4 address in the first 4 bytes */
};
#define TCP_CARD_BYTES ((sizeof(struct tcp_card) + 7) & ~(size_t)7)
_Static_assert(sizeof(struct tcp_card) <= TCP_CARD_BYTES, "struct tcp_card must fit its card_bytes");

/* Starts every control frame; len bytes follow: the pipe's header, then
 * its payload. */
struct tcp_frame {
    uint32_t magic;
    uint32_t len;
};

/* A push or an expected receive while tcp holds it (weft_tp_xfer.priv). */
struct tcp_xfer {
    struct weft_qnode node;         /* in the peer's push or expect FIFO */
    uint64_t          bytes;        /* message size: both ends stripe by it */
    unsigned          sockets_done; /* data sockets that finished their share */
};
WEFT_TP_PRIV_FITS(struct tcp_xfer);

/* One data socket: it carries my pushes out and the peer's pushes in, each
 * direction walking its FIFO independently of the other sockets. */
struct tcp_data_sock {
    int                  fd;
    struct weft_tp_xfer *send_cur;   /* push this socket is on (NULL: past the tail) */
    uint64_t             send_off;   /* bytes of send_cur's share already sent */
    struct weft_tp_xfer *recv_cur;   /* expected receive this socket is on */
    uint64_t             recv_off;
};

struct tcp_peer {
    int                   rank;
    int                   used;      /* the pipe to this rank uses tcp */
    int                   up;        /* connected and not failed */
    int                   kick;      /* work was queued since the last progress pass */
    char                  where[64]; /* "a.b.c.d:port" of the peer's listener */

    int                   ctrl_fd;
    unsigned char        *out;       /* unsent control bytes: out[out_off..out_len) */
    size_t                out_off, out_len, out_cap;
    unsigned char        *in;        /* received control bytes not yet parsed */
    size_t                in_len, in_cap;

    struct tcp_data_sock *data;      /* [streams] */
    struct weft_queue     push;      /* my pushes, in rndv_push order (tcp_xfer.node) */
    struct weft_queue     expect;    /* receives to fill, in rndv_expect order */

    size_t                pfd_base;  /* index of ctrl_fd in the progress poll array */
    size_t                sleep_base;/* index of ctrl_fd in sleep_fds */
};

struct tcp_state {
    const struct weft_tp_env *env;   /* core, cards, upcalls: valid until destroy */
    int                 size;        /* ranks of the comm (peers[]) */
    int                 listen_fd;
    struct sockaddr_in  listen_addr;
    unsigned            streams;
    uint64_t            chunk;
    size_t              eager_limit;
    struct tcp_peer    *peers;       /* [size] */
    int                *active;      /* ranks of the peers that use tcp */
    int                 nactive;
    struct pollfd      *pfds;        /* progress poll array */
    size_t              pfds_cap;
    struct weft_tcp_listen_stats listen; /* what the listener met during connect (tcp_listen.h) */

    /* What sleep polls. It runs without the lock, so it reads only these:
     * descriptors fixed at connect, and per-descriptor poll events that
     * progress publishes atomically (0: skip, the socket is closed). */
    int                *sleep_fds;     /* [nactive * (1 + streams)] */
    atomic_int         *sleep_events;
    size_t              sleep_n;
};

static struct tcp_xfer *tx_of(struct weft_tp_xfer *x)
{
    return WEFT_TP_PRIV(x, struct tcp_xfer);
}

/* The transfer whose FIFO node n is (NULL for NULL). */
static struct weft_tp_xfer *xfer_of(struct weft_qnode *n)
{
    if (n == NULL)
        return NULL;
    struct tcp_xfer *t = weft_container_of(n, struct tcp_xfer, node);
    return weft_container_of(t, struct weft_tp_xfer, priv);
}

/* The transfer after x in its FIFO (NULL: x is the tail). */
static struct weft_tp_xfer *xfer_next(struct weft_tp_xfer *x)
{
    return xfer_of(tx_of(x)->node.next);
}

/* The peer state of a rank whose pipe uses tcp, NULL for any other. */
static struct tcp_peer *peer_of(struct tcp_state *st, int peer)
{
    if (st == NULL || st->peers == NULL || peer < 0 || peer >= st->size || !st->peers[peer].used)
        return NULL;
    return &st->peers[peer];
}

/* Largest pipe payload ctrl_send takes (transport.h); the frame body adds
 * at most WEFT_TP_CTRL_HDR_MAX header bytes. */
static size_t ctrl_payload_max(const struct tcp_state *st)
{
    return st->eager_limit > WEFT_TP_CTRL_PAYLOAD_MIN ? st->eager_limit : WEFT_TP_CTRL_PAYLOAD_MIN;
}

/* Tells sleep which events to wait for on pe's sockets: input always,
 * output where bytes are waiting to go, nothing once the peer is down. */
static void publish_sleep_events(struct tcp_state *st, const struct tcp_peer *pe)
{
    if (st->sleep_events == NULL)
        return;
    atomic_int *ev = &st->sleep_events[pe->sleep_base];
    atomic_store_explicit(&ev[0], pe->up ? POLLIN | (pe->out_len > pe->out_off ? POLLOUT : 0) : 0,
                          memory_order_relaxed);
    for (unsigned s = 0; s < st->streams; s++)
        atomic_store_explicit(&ev[1 + s], pe->up ? POLLIN | (pe->data[s].send_cur ? POLLOUT : 0) : 0,
                              memory_order_relaxed);
}

static void format_addr(const struct sockaddr_in *sa, char *out, size_t len)
{
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
    snprintf(out, len, "%s:%u", ip, (unsigned)ntohs(sa->sin_port));
}

/* Rank r's tcp blob, copied out (a blob need not be aligned). */
static struct tcp_card card_of(const struct weft_tp_cards *k, int rank)
{
    struct tcp_card card;
    memcpy(&card, weft_tp_blob(k, rank), sizeof(card));
    return card;
}

/* The IPv4 listener address a card offers. */
static void card_sockaddr(const struct tcp_card *card, struct sockaddr_in *sa)
{
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = card->port;
    memcpy(&sa->sin_addr, card->addr, sizeof(sa->sin_addr));
}

/* ---------------------------------------------------------------- hello -- */

int weft_tcp_hello_recv(int fd, struct weft_tcp_hello *h, size_t *got, uint64_t my_token,
                        char *why, size_t whylen)
{
    unsigned char *bytes = (unsigned char *)h;
    while (*got < sizeof(*h)) {
        /* The token alone first: a connection that cannot present it has
         * nothing else read from it. */
        size_t want = *got < sizeof(h->token) ? sizeof(h->token) - *got : sizeof(*h) - *got;
        ssize_t n = recv(fd, bytes + *got, want, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return WEFT_EAGAIN;
            snprintf(why, whylen, "reading hello: %s", strerror(errno));
            return WEFT_ERR_TRANSPORT;
        }
        if (n == 0) {
            snprintf(why, whylen, "connection closed after %zu bytes of hello", *got);
            return WEFT_ERR_TRANSPORT;
        }
        *got += (size_t)n;
        if (*got == sizeof(h->token) && h->token != my_token) {
            snprintf(why, whylen, "wrong job token");
            return WEFT_ERR_TRANSPORT;
        }
    }
    return WEFT_SUCCESS;
}

int weft_tcp_hello_check(const struct weft_tcp_hello *h, int my_rank, int size,
                         unsigned streams, uint64_t chunk, uint32_t eager_limit,
                         char *why, size_t whylen)
{
    if (h->rank < 0 || h->rank >= size || h->rank == my_rank) {
        snprintf(why, whylen, "hello names rank %d, not a peer in a comm of %d", (int)h->rank, size);
        return WEFT_ERR_TRANSPORT;
    }
    if (h->index < 0 || (unsigned)h->index > streams) {
        snprintf(why, whylen, "rank %d sent socket index %d, expected 0..%u",
                 (int)h->rank, (int)h->index, streams);
        return WEFT_ERR_TRANSPORT;
    }
    if (h->streams != streams || h->chunk != chunk || h->eager_limit != eager_limit) {
        snprintf(why, whylen,
                 "rank %d uses WEFT_TCP_STREAMS=%u, a %llu-byte WEFT_TCP_CHUNK_KB and WEFT_TCP_EAGER=%u,"
                 " this rank %u, %llu and %u; set the same values on every rank",
                 (int)h->rank, (unsigned)h->streams, (unsigned long long)h->chunk,
                 (unsigned)h->eager_limit, streams, (unsigned long long)chunk, (unsigned)eager_limit);
        return WEFT_ERR_TRANSPORT;
    }
    return WEFT_SUCCESS;
}

/* -------------------------------------------------------------- sockets -- */

/* Options every connection gets: no Nagle delay on small control frames,
 * and (optionally) fixed large buffers. Failures only cost speed. */
static void tune_socket(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
#if TCP_SOCKBUF_BYTES > 0
    int bytes = TCP_SOCKBUF_BYTES;
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
#endif
}

/* Resolves WEFT_TCP_IF (interface name or IPv4 literal; empty: first UP
 * non-loopback IPv4 interface, else 127.0.0.1) to the address to listen on
 * (src/core/netif.c, shared with the unique id's root). */
static int resolve_listen_addr(struct weft_core *core, struct in_addr *out)
{
    const char *want = core->cfg.tcp_if;

    switch (weft_netif_resolve_ipv4(want, out)) {
    case WEFT_NETIF_OK:
        return WEFT_SUCCESS;
    case WEFT_NETIF_LOOPBACK:
        WEFT_INFO(core->rank, "tcp: no UP non-loopback IPv4 interface, listening on 127.0.0.1");
        return WEFT_SUCCESS;
    case WEFT_NETIF_NO_MATCH:
        return weft_set_error(core, WEFT_ERR_INVALID_ARG,
                              "tcp: WEFT_TCP_IF=%s is neither an IPv4 address nor an interface with one",
                              want);
    case WEFT_NETIF_GETIFADDRS:
    default:
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: getifaddrs failed: %s", strerror(errno));
    }
}

/* ---------------------------------------------------------------- create -- */

static void tcp_release(struct tcp_state *st);

static int tcp_create(const struct weft_tp_env *env, void *blob, void **ctx)
{
    struct weft_core *core = env->core;
    struct tcp_state *st;
    int rc;

    *ctx = NULL;
    st = calloc(1, sizeof(*st));
    if (st == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: out of memory for transport state");
    st->env = env;
    st->size = core->size;
    st->listen_fd = -1;
    st->streams = core->cfg.tcp_streams > 0 ? (unsigned)core->cfg.tcp_streams : 1;
    st->chunk = core->cfg.tcp_chunk > 0 ? (uint64_t)core->cfg.tcp_chunk : (uint64_t)512 << 10;
    st->eager_limit = core->cfg.tcp_eager_limit;

    struct in_addr ip = { .s_addr = htonl(INADDR_LOOPBACK) };
    rc = resolve_listen_addr(core, &ip);
    if (rc != WEFT_SUCCESS)
        goto fail_state;

    st->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (st->listen_fd < 0) {
        rc = weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: socket() for the listener failed: %s",
                            strerror(errno));
        goto fail_state;
    }
    int one = 1;
    (void)setsockopt(st->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    /* Accepted sockets inherit these, and buffer sizes only shape the TCP
     * window when set before the connection is made. */
    tune_socket(st->listen_fd);

    st->listen_addr.sin_family = AF_INET;
    st->listen_addr.sin_addr = ip;
    st->listen_addr.sin_port = 0;
    if (bind(st->listen_fd, (struct sockaddr *)&st->listen_addr, sizeof(st->listen_addr)) != 0) {
        char a[64];
        format_addr(&st->listen_addr, a, sizeof(a));
        rc = weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: bind to %s failed: %s", a, strerror(errno));
        goto fail_socket;
    }
    /* A deep backlog lets every lower rank connect before this rank gets
     * round to accepting (up to 1 + streams connections per peer). */
    if (listen(st->listen_fd, 4096) != 0) {
        rc = weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: listen failed: %s", strerror(errno));
        goto fail_socket;
    }
    socklen_t alen = sizeof(st->listen_addr);
    if (getsockname(st->listen_fd, (struct sockaddr *)&st->listen_addr, &alen) != 0) {
        rc = weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: getsockname failed: %s", strerror(errno));
        goto fail_socket;
    }
    {
        char a[64];
        format_addr(&st->listen_addr, a, sizeof(a));
        WEFT_INFO(core->rank, "tcp: listening on %s (%u data streams, chunk %llu bytes)", a,
                  st->streams, (unsigned long long)st->chunk);
    }

    struct tcp_card mine;
    memset(&mine, 0, sizeof(mine));
    mine.family = AF_INET;
    mine.port = st->listen_addr.sin_port;
    memcpy(mine.addr, &st->listen_addr.sin_addr, sizeof(st->listen_addr.sin_addr));
    memcpy(blob, &mine, sizeof(mine));
    *ctx = st;
    return WEFT_SUCCESS;

fail_socket:
    close(st->listen_fd);
fail_state:
    free(st);
    return rc;
}

/* ----------------------------------------------------------------- reach -- */

/* Any pair where both ranks have a listener: whether the network between
 * them carries it is only learnt by connecting. */
static int tcp_reach(const struct weft_tp_cards *k, int me, int peer, char *why, size_t whylen)
{
    if (card_of(k, me).family == 0) {
        snprintf(why, whylen, "tcp not offered here");
        return 0;
    }
    if (card_of(k, peer).family == 0) {
        snprintf(why, whylen, "tcp not offered by the peer");
        return 0;
    }
    return 1;
}

/* --------------------------------------------------------------- connect -- */

/* A connection in the middle of its handshake. */
struct tcp_conn {
    int                   fd;
    int                   outgoing;   /* 1: I connected to peer; 0: accepted */
    int                   stage;      /* see conn_step */
    int                   peer;       /* outgoing: known; incoming: from the hello */
    int                   index;      /* 0 = control, 1..streams = data */
    size_t                done;       /* bytes moved in the current stage */
    double                deadline;   /* incoming: its hello is due by then (weft_now) */
    struct weft_tcp_hello hello;
    struct weft_tcp_ack   ack;
    char                  where[64];  /* remote address, for messages */
};

/* The handshakes of one tcp_connect: outgoing ones first, then incoming
 * ones in the order they were accepted (so the first pending one is the
 * oldest). Entries whose fd is -1 are finished and compacted away. */
struct tcp_handshakes {
    struct tcp_conn *v;
    size_t           n, cap;
    size_t           done;              /* connections now in a peer's socket slot */
    double           accept_rest_until; /* listener left alone until then (weft_now) */
    int              short_logged;      /* the out-of-descriptors warning was given */
};

enum { CONN_CONNECTING = 0, CONN_SEND_HELLO, CONN_READ_ACK,   /* outgoing */
       CONN_READ_HELLO, CONN_SEND_ACK,                         /* incoming */
       CONN_DONE, CONN_DROPPED };

static int *peer_slot(struct tcp_peer *pe, int index)
{
    return index == 0 ? &pe->ctrl_fd : &pe->data[index - 1].fd;
}

/* Sends conn's pending handshake bytes; 1 when all are out, 0 to retry, -1 on error. */
static int conn_send(struct tcp_conn *k, const void *buf, size_t len)
{
    while (k->done < len) {
        ssize_t n = send(k->fd, (const char *)buf + k->done, len - k->done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
        }
        k->done += (size_t)n;
    }
    return 1;
}

/* Turns an incoming connection away: closed at once, counted under
 * *reason, and one warning that names the remote address and why, so that
 * whoever runs the job can find the stranger (or the misconfigured rank). */
static void conn_reject(struct tcp_state *st, struct tcp_conn *k, size_t *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void conn_reject(struct tcp_state *st, struct tcp_conn *k, size_t *reason, const char *fmt, ...)
{
    char why[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    WEFT_WARN(st->env->core->rank, "tcp: rejected connection from %s: %s", k->where, why);
    (*reason)++;
    if (k->fd >= 0)
        close(k->fd);
    k->fd = -1;
    k->stage = CONN_DROPPED;
}

/* Advances one handshake. Returns WEFT_SUCCESS (step taken or nothing to
 * do yet), or an error for an outgoing connection that failed (fatal for
 * connect). Incoming connections that fail a check are rejected
 * (conn_reject): a stranger or a stale process must not stop the job. */
static int conn_step(const struct weft_tp_env *env, struct tcp_state *st, struct tcp_conn *k)
{
    struct weft_core *core = env->core;
    const uint64_t my_token = weft_tp_card(&env->cards, core->rank)->token;
    char why[256];
    for (;;) {
        switch (k->stage) {
        case CONN_CONNECTING: {
            int err = 0;
            socklen_t elen = sizeof(err);
            struct pollfd p = { .fd = k->fd, .events = POLLOUT, .revents = 0 };
            if (poll(&p, 1, 0) <= 0)
                return WEFT_SUCCESS;
            if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
                err = errno;
            if (err != 0)
                return weft_set_error(core, WEFT_ERR_TRANSPORT,
                                      "tcp: connecting to peer %d at %s failed: %s",
                                      k->peer, k->where, strerror(err));
            k->stage = CONN_SEND_HELLO;
            k->done = 0;
            break;
        }
        case CONN_SEND_HELLO: {
            int r = conn_send(k, &k->hello, sizeof(k->hello));
            if (r < 0)
                return weft_set_error(core, WEFT_ERR_TRANSPORT,
                                      "tcp: sending hello to peer %d at %s failed: %s",
                                      k->peer, k->where, strerror(errno));
            if (r == 0)
                return WEFT_SUCCESS;
            k->stage = CONN_READ_ACK;
            k->done = 0;
            break;
        }
        case CONN_READ_ACK: {
            ssize_t n = recv(k->fd, (char *)&k->ack + k->done, sizeof(k->ack) - k->done, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                return WEFT_SUCCESS;
            if (n <= 0)
                return weft_set_error(core, WEFT_ERR_TRANSPORT,
                                      "tcp: peer %d at %s refused the connection (%s): is it a"
                                      " rank of this job with the same WEFT_TCP_* settings?",
                                      k->peer, k->where, n == 0 ? "closed" : strerror(errno));
            k->done += (size_t)n;
            if (k->done < sizeof(k->ack))
                return WEFT_SUCCESS;
            if (k->ack.token != my_token)
                return weft_set_error(core, WEFT_ERR_TRANSPORT,
                                      "tcp: the process at %s answered with a wrong job token;"
                                      " it is not peer %d of this job",
                                      k->where, k->peer);
            k->stage = CONN_DONE;
            return WEFT_SUCCESS;
        }
        case CONN_READ_HELLO: {
            int r = weft_tcp_hello_recv(k->fd, &k->hello, &k->done, my_token, why, sizeof(why));
            if (r == WEFT_EAGAIN)
                return WEFT_SUCCESS;
            if (r != WEFT_SUCCESS) {
                if (k->done >= sizeof(k->hello.token) && k->hello.token != my_token) {
                    /* The bytes themselves tell a port scanner or an HTTP
                     * probe ("GET / HT") from a rank of another job. */
                    const unsigned char *b = (const unsigned char *)&k->hello.token;
                    conn_reject(st, k, &st->listen.bad_token,
                                "wrong job token (first bytes %02x %02x %02x %02x %02x %02x %02x %02x):"
                                " not a rank of this job",
                                b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
                } else {
                    conn_reject(st, k, &st->listen.closed, "%s", why);
                }
                return WEFT_SUCCESS;
            }
            r = weft_tcp_hello_check(&k->hello, core->rank, core->size, st->streams, st->chunk,
                                     (uint32_t)st->eager_limit, why, sizeof(why));
            if (r != WEFT_SUCCESS) {
                conn_reject(st, k, &st->listen.bad_hello, "%s", why);
                return WEFT_SUCCESS;
            }
            struct tcp_peer *pe = &st->peers[k->hello.rank];
            if (!pe->used || k->hello.rank > core->rank) {
                conn_reject(st, k, &st->listen.bad_hello, "rank %d is not a tcp peer that connects to this rank",
                            (int)k->hello.rank);
                return WEFT_SUCCESS;
            }
            if (*peer_slot(pe, k->hello.index) >= 0) {
                conn_reject(st, k, &st->listen.duplicate, "rank %d already connected socket %d",
                            (int)k->hello.rank, (int)k->hello.index);
                return WEFT_SUCCESS;
            }
            k->peer = k->hello.rank;
            k->index = k->hello.index;
            k->ack.token = weft_tp_card(&env->cards, k->peer)->token;
            k->stage = CONN_SEND_ACK;
            k->done = 0;
            break;
        }
        case CONN_SEND_ACK: {
            int r = conn_send(k, &k->ack, sizeof(k->ack));
            if (r < 0) {
                int e = errno;
                conn_reject(st, k, &st->listen.closed, "answering rank %d failed: %s", k->peer, strerror(e));
                return WEFT_SUCCESS;
            }
            if (r == 0)
                return WEFT_SUCCESS;
            k->stage = CONN_DONE;
            return WEFT_SUCCESS;
        }
        default:
            return WEFT_SUCCESS;
        }
    }
}

static int conn_events(const struct tcp_conn *k)
{
    switch (k->stage) {
    case CONN_CONNECTING: case CONN_SEND_HELLO: case CONN_SEND_ACK: return POLLOUT;
    default: return POLLIN;
    }
}

/* Every tcp peer costs 1 + WEFT_TCP_STREAMS descriptors: say so when they run out. */
static const char *fd_limit_hint(int err)
{
    return err == EMFILE || err == ENFILE
               ? " (each tcp peer needs 1 + WEFT_TCP_STREAMS sockets: raise `ulimit -n` or lower WEFT_TCP_STREAMS)"
               : "";
}

/* Opens a non-blocking connection to peer's listener and prepares its hello. */
static int conn_open(const struct weft_tp_env *env, struct tcp_state *st, int peer, int index,
                     struct tcp_conn *k)
{
    struct weft_core *core = env->core;
    const struct tcp_card card = card_of(&env->cards, peer);
    struct sockaddr_in sa;

    memset(k, 0, sizeof(*k));
    k->fd = -1;
    k->outgoing = 1;
    k->peer = peer;
    k->index = index;
    card_sockaddr(&card, &sa);
    format_addr(&sa, k->where, sizeof(k->where));
    if (card.family != AF_INET)
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "tcp: peer %d offers no IPv4 listener (family %u)", peer,
                              (unsigned)card.family);

    k->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (k->fd < 0)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: socket() for peer %d failed: %s%s", peer,
                              strerror(errno), fd_limit_hint(errno));
    tune_socket(k->fd);
    if (connect(k->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(k->fd);
        k->fd = -1;
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: connecting to peer %d at %s failed: %s",
                              peer, k->where, strerror(e));
    }
    k->stage = CONN_CONNECTING;
    k->hello.token = weft_tp_card(&env->cards, peer)->token;
    k->hello.rank = core->rank;
    k->hello.index = index;
    k->hello.streams = st->streams;
    k->hello.chunk = st->chunk;
    k->hello.eager_limit = (uint32_t)st->eager_limit;
    return WEFT_SUCCESS;
}

/* An accepted connection still waiting for (the rest of) its hello. */
static int conn_pending(const struct tcp_conn *k)
{
    return !k->outgoing && k->fd >= 0 && k->stage == CONN_READ_HELLO;
}

static struct tcp_conn *oldest_pending(struct tcp_handshakes *hs)
{
    for (size_t i = 0; i < hs->n; i++)
        if (conn_pending(&hs->v[i]))
            return &hs->v[i];
    return NULL;
}

static size_t count_pending(const struct tcp_handshakes *hs)
{
    size_t n = 0;
    for (size_t i = 0; i < hs->n; i++)
        n += (size_t)conn_pending(&hs->v[i]);
    return n;
}

/* Drops finished handshakes (fd -1), keeping the order of the rest. */
static void hs_compact(struct tcp_handshakes *hs)
{
    size_t keep = 0;
    for (size_t i = 0; i < hs->n; i++)
        if (hs->v[i].fd >= 0)
            hs->v[keep++] = hs->v[i];
    hs->n = keep;
}

/* One step of k, then its bookkeeping: a finished connection moves into
 * its peer's socket slot. Returns an error only for a failed outgoing one. */
static int conn_advance(const struct weft_tp_env *env, struct tcp_state *st, struct tcp_handshakes *hs,
                        struct tcp_conn *k)
{
    int rc = conn_step(env, st, k);
    if (rc != WEFT_SUCCESS || k->stage != CONN_DONE || k->fd < 0)
        return rc;
    int *slot = peer_slot(&st->peers[k->peer], k->index);
    if (!k->outgoing && *slot >= 0) {
        /* Two connections for one socket passed the hello check before
         * either finished; the first one keeps the slot. */
        conn_reject(st, k, &st->listen.duplicate, "rank %d already connected socket %d", k->peer, k->index);
        return WEFT_SUCCESS;
    }
    *slot = k->fd;   /* the peer's socket slot now owns the descriptor */
    k->fd = -1;
    hs->done++;
    if (!k->outgoing)
        st->listen.peers++;
    return WEFT_SUCCESS;
}

/* Errors accept(2) passes on from a connection that already failed: the
 * next connection may be fine, so accept again. */
static int accept_error_is_transient(int e)
{
    switch (e) {
    case EINTR: case ECONNABORTED: case EPROTO: case ENETDOWN: case ENETUNREACH: case EHOSTDOWN:
    case EHOSTUNREACH: case ENOPROTOOPT: case EOPNOTSUPP:
#ifdef ENONET
    case ENONET:
#endif
        return 1;
    default:
        return 0;
    }
}

/* Accept failed for want of descriptors or kernel memory. Strangers must
 * not make create fail while the ranks' own connections can still get in:
 * close the oldest unidentified connection and try again, or, with none,
 * leave the listener alone for a moment (the backlog keeps what arrives).
 * Returns 1 to accept again, 0 to stop for now. */
static int accept_short(struct tcp_state *st, struct tcp_handshakes *hs, int e)
{
    st->listen.accept_short++;
    if (!hs->short_logged) {
        hs->short_logged = 1;
        WEFT_WARN(st->env->core->rank,
                  "tcp: accepting on the listener failed: %s%s; closing connections that have sent no"
                  " hello to make room (logged once per create)",
                  strerror(e), fd_limit_hint(e));
    }
    struct tcp_conn *old = oldest_pending(hs);
    if (old != NULL) {
        conn_reject(st, old, &st->listen.fd_evicted,
                    "closed before a complete hello to free a descriptor (accept: %s)", strerror(e));
        return 1;
    }
    hs->accept_rest_until = weft_now() + TCP_ACCEPT_BACKOFF_MS / 1000.0;
    return 0;
}

/* Accepts whatever is waiting on the listener as new incoming handshakes,
 * keeping at most TCP_PENDING_MAX of them waiting for a hello. */
static int accept_pending(const struct weft_tp_env *env, struct tcp_state *st, struct tcp_handshakes *hs)
{
    struct weft_core *core = env->core;
    for (;;) {
        struct sockaddr_in sa;
        socklen_t alen = sizeof(sa);
        int fd = accept4(st->listen_fd, (struct sockaddr *)&sa, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (accept_error_is_transient(e))
                continue;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return WEFT_SUCCESS;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                if (accept_short(st, hs, e))
                    continue;
                return WEFT_SUCCESS;
            }
            return weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: accept failed: %s%s", strerror(e),
                                  fd_limit_hint(e));
        }
        if (hs->n == hs->cap)
            hs_compact(hs);
        if (hs->n == hs->cap) {
            size_t ncap = hs->cap * 2 + 8;
            struct tcp_conn *grown = realloc(hs->v, ncap * sizeof(*hs->v));
            if (grown == NULL) {
                close(fd);
                return weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: out of memory accepting connections");
            }
            hs->v = grown;
            hs->cap = ncap;
        }
        struct tcp_conn *k = &hs->v[hs->n++];
        memset(k, 0, sizeof(*k));
        k->fd = fd;
        k->peer = -1;
        k->stage = CONN_READ_HELLO;
        k->deadline = weft_now() + TCP_HELLO_DEADLINE_S;
        format_addr(&sa, k->where, sizeof(k->where));
        tune_socket(fd);
        st->listen.accepted++;
        /* A rank's hello is normally queued before we accept: take it now,
         * so that only connections that really are silent count as pending
         * and the cap below never closes a rank's connection. */
        int rc = conn_advance(env, st, hs, k);
        if (rc != WEFT_SUCCESS)
            return rc;
        size_t pending = count_pending(hs);
        for (; pending > TCP_PENDING_MAX; pending--)
            conn_reject(st, oldest_pending(hs), &st->listen.evicted,
                        "closed before a complete hello: more than %d connections were waiting for one",
                        TCP_PENDING_MAX);
        if (pending > st->listen.pending_max)
            st->listen.pending_max = pending;
    }
}

/* Rejects the incoming connections whose hello (or our answer) is overdue. */
static void expire_pending(struct tcp_state *st, struct tcp_handshakes *hs, double now)
{
    for (size_t i = 0; i < hs->n; i++) {
        struct tcp_conn *k = &hs->v[i];
        if (k->outgoing || k->fd < 0 || now < k->deadline)
            continue;
        if (k->stage == CONN_READ_HELLO)
            conn_reject(st, k, &st->listen.timed_out,
                        "no complete hello within %.0f s of accept (%zu of %zu bytes came)",
                        TCP_HELLO_DEADLINE_S, k->done, sizeof(k->hello));
        else if (k->stage == CONN_SEND_ACK)
            conn_reject(st, k, &st->listen.timed_out,
                        "the answer to rank %d could not be sent within %.0f s of accept",
                        k->peer, TCP_HELLO_DEADLINE_S);
    }
}

/* Closes every handshake still open when connect ends, successful or not:
 * incoming ones are rejected (warned and counted), outgoing ones only
 * remain when connect failed, which was reported already. */
static void hs_close_all(struct tcp_state *st, struct tcp_handshakes *hs)
{
    for (size_t i = 0; i < hs->n; i++) {
        struct tcp_conn *k = &hs->v[i];
        if (k->fd < 0)
            continue;
        if (k->outgoing) {
            close(k->fd);
            k->fd = -1;
        } else if (k->stage == CONN_READ_HELLO) {
            conn_reject(st, k, &st->listen.unfinished,
                        "still without a complete hello when this rank stopped listening (%zu of %zu bytes came)",
                        k->done, sizeof(k->hello));
        } else {
            conn_reject(st, k, &st->listen.unfinished,
                        "the answer to rank %d was not sent when this rank stopped listening", k->peer);
        }
    }
    hs->n = 0;
}

size_t weft_tcp_listen_rejected(const struct weft_tcp_listen_stats *s)
{
    return s->bad_token + s->bad_hello + s->duplicate + s->closed + s->timed_out + s->evicted +
           s->fd_evicted + s->unfinished;
}

void weft_tcp_listen_stats_get(const void *ctx, struct weft_tcp_listen_stats *out)
{
    const struct tcp_state *st = ctx;
    if (st == NULL)
        memset(out, 0, sizeof(*out));
    else
        *out = st->listen;
}

/* One line per connect on what the listener met, so that rejections show
 * up in an info log even where their warnings were filtered out. */
static void log_listen_summary(const struct tcp_state *st)
{
    const struct weft_tcp_listen_stats *s = &st->listen;
    WEFT_INFO(st->env->core->rank,
              "tcp: listener accepted %zu connections: %zu ranks' sockets, %zu rejected (%zu wrong token,"
              " %zu bad hello, %zu duplicate, %zu closed early, %zu no hello within %.0f s,"
              " %zu over %d pending, %zu to free descriptors, %zu unfinished at the end);"
              " at most %zu pending at once; accept short of descriptors %zu times",
              s->accepted, s->peers, weft_tcp_listen_rejected(s), s->bad_token, s->bad_hello, s->duplicate,
              s->closed, s->timed_out, TCP_HELLO_DEADLINE_S, s->evicted, TCP_PENDING_MAX, s->fd_evicted,
              s->unfinished, s->pending_max, s->accept_short);
}

static int peer_alloc(struct tcp_state *st, struct tcp_peer *pe)
{
    pe->ctrl_fd = -1;
    pe->data = calloc(st->streams, sizeof(*pe->data));
    if (pe->data == NULL)
        return WEFT_ERR_NO_MEMORY;
    for (unsigned s = 0; s < st->streams; s++)
        pe->data[s].fd = -1;
    /* Room for one largest frame: the pipe's header and payload. */
    pe->in_cap = sizeof(struct tcp_frame) + WEFT_TP_CTRL_HDR_MAX + ctrl_payload_max(st) + TCP_CTRL_IN_SLACK;
    pe->in = malloc(pe->in_cap);
    if (pe->in == NULL)
        return WEFT_ERR_NO_MEMORY;
    return WEFT_SUCCESS;
}

/* Takes no part in any collective exchange (env->coll is never used), so
 * a rank without ctx returns at once. */
static int tcp_connect(const struct weft_tp_env *env, void *ctx)
{
    struct tcp_state *st = ctx;
    struct weft_core *core = env->core;
    struct tcp_handshakes hs = { .v = NULL };
    int rc = WEFT_SUCCESS;

    if (st == NULL)
        return WEFT_SUCCESS;   /* tcp not offered by this rank: no pipe can use it */
    memset(&st->listen, 0, sizeof(st->listen));

    int ntcp = 0;
    for (int r = 0; r < core->size; r++)
        if (r != core->rank && env->uses != NULL && env->uses[r])
            ntcp++;
    if (ntcp == 0)
        goto close_listener;

    st->peers = calloc((size_t)core->size, sizeof(*st->peers));
    st->active = calloc((size_t)ntcp, sizeof(*st->active));
    if (st->peers != NULL)
        for (int r = 0; r < core->size; r++) {
            st->peers[r].rank = r;
            st->peers[r].ctrl_fd = -1;
            weft_queue_init(&st->peers[r].push);
            weft_queue_init(&st->peers[r].expect);
        }
    if (st->peers == NULL || st->active == NULL) {
        rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: out of memory for %d peers", ntcp);
        goto fail;
    }
    size_t expected_in = 0, nout = 0;
    for (int r = 0; r < core->size; r++) {
        struct tcp_peer *pe = &st->peers[r];
        if (r == core->rank || !env->uses[r])
            continue;
        pe->used = 1;
        const struct tcp_card card = card_of(&env->cards, r);
        struct sockaddr_in sa;
        card_sockaddr(&card, &sa);
        format_addr(&sa, pe->where, sizeof(pe->where));
        st->active[st->nactive++] = r;
        if (peer_alloc(st, pe) != WEFT_SUCCESS) {
            rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: out of memory for peer %d", r);
            goto fail;
        }
        if (r < core->rank)
            expected_in += 1 + st->streams;
        else
            nout += 1 + st->streams;
    }

    hs.cap = nout + expected_in + 8;
    hs.v = calloc(hs.cap, sizeof(*hs.v));
    if (hs.v == NULL) {
        rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: out of memory for %zu connections", hs.cap);
        goto fail;
    }
    /* Lower rank connects: every pair has exactly one connector. */
    for (int r = core->rank + 1; r < core->size; r++) {
        if (!st->peers[r].used)
            continue;
        for (unsigned i = 0; i <= st->streams; i++) {
            rc = conn_open(env, st, r, (int)i, &hs.v[hs.n]);
            if (hs.v[hs.n].fd >= 0)
                hs.n++;
            if (rc != WEFT_SUCCESS)
                goto fail;
        }
    }

    double deadline = core->cfg.timeout_s > 0 ? weft_now() + core->cfg.timeout_s : 0;
    struct pollfd *pfds = NULL;
    size_t pfds_cap = 0;
    while (hs.done < nout + expected_in) {
        if (pfds_cap < hs.n + 1) {
            pfds_cap = hs.cap + 1;
            free(pfds);
            pfds = calloc(pfds_cap, sizeof(*pfds));
            if (pfds == NULL) {
                rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: out of memory while connecting");
                goto fail;
            }
        }
        double now = weft_now();
        expire_pending(st, &hs, now);
        size_t np = 0;
        /* A negative fd is skipped by poll: the listener rests after accept
         * ran out of descriptors with nothing left to close. */
        pfds[np++] = (struct pollfd){ .fd = now >= hs.accept_rest_until ? st->listen_fd : -1, .events = POLLIN };
        for (size_t i = 0; i < hs.n; i++)
            if (hs.v[i].fd >= 0 && hs.v[i].stage != CONN_DONE && hs.v[i].stage != CONN_DROPPED)
                pfds[np++] = (struct pollfd){ .fd = hs.v[i].fd, .events = (short)conn_events(&hs.v[i]) };
        /* At most 100 ms between passes, so an overdue hello is rejected
         * within that of its deadline. */
        int wait_ms = 100;
        if (deadline > 0) {
            double left = deadline - weft_now();
            if (left <= 0) {
                /* Name one peer still missing: the first unfinished outgoing
                 * connection, else the first lower peer short of sockets. */
                int missing = -1;
                const char *what = "connecting to";
                for (size_t i = 0; i < hs.n && missing < 0; i++)
                    if (hs.v[i].outgoing && hs.v[i].fd >= 0)
                        missing = hs.v[i].peer;
                for (int r = 0; r < core->rank && missing < 0; r++) {
                    if (!st->peers[r].used)
                        continue;
                    for (unsigned s = 0; s <= st->streams; s++)
                        if (*peer_slot(&st->peers[r], (int)s) < 0)
                            missing = r;
                    what = "waiting for a connection from";
                }
                rc = weft_set_error(core, WEFT_ERR_TIMEOUT,
                                    "tcp: timed out after %.0f s %s peer %d (%s) (WEFT_TIMEOUT)%s",
                                    core->cfg.timeout_s, what, missing,
                                    missing >= 0 ? st->peers[missing].where : "?",
                                    st->listen.accept_short > 0
                                        ? "; accepting ran out of descriptors: raise `ulimit -n`"
                                        : "");
                free(pfds);
                goto fail;
            }
            if (left * 1000 < wait_ms)
                wait_ms = (int)(left * 1000) + 1;
        }
        if (poll(pfds, np, wait_ms) < 0 && errno != EINTR) {
            rc = weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: poll failed while connecting: %s",
                                strerror(errno));
            free(pfds);
            goto fail;
        }
        if (pfds[0].revents & POLLIN) {
            rc = accept_pending(env, st, &hs);
            if (rc != WEFT_SUCCESS) {
                free(pfds);
                goto fail;
            }
        }
        for (size_t i = 0; i < hs.n; i++) {
            struct tcp_conn *k = &hs.v[i];
            if (k->fd < 0 || k->stage == CONN_DONE || k->stage == CONN_DROPPED)
                continue;
            rc = conn_advance(env, st, &hs, k);
            if (rc != WEFT_SUCCESS) {
                free(pfds);
                goto fail;
            }
        }
        /* Compact finished handshakes away so rogue connections cannot
         * grow the array without bound. */
        hs_compact(&hs);
    }
    free(pfds);

    st->sleep_n = (size_t)st->nactive * (1 + st->streams);
    st->sleep_fds = calloc(st->sleep_n, sizeof(*st->sleep_fds));
    st->sleep_events = calloc(st->sleep_n, sizeof(*st->sleep_events));
    if (st->sleep_fds == NULL || st->sleep_events == NULL) {
        rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: out of memory for the poll set");
        goto fail;
    }
    for (int i = 0; i < st->nactive; i++) {
        struct tcp_peer *pe = &st->peers[st->active[i]];
        pe->sleep_base = (size_t)i * (1 + st->streams);
        st->sleep_fds[pe->sleep_base] = pe->ctrl_fd;
        for (unsigned s = 0; s < st->streams; s++)
            st->sleep_fds[pe->sleep_base + 1 + s] = pe->data[s].fd;
        pe->up = 1;
        publish_sleep_events(st, pe);
        WEFT_INFO(core->rank, "tcp: connected to peer %d at %s (1 control + %u data sockets)",
                  pe->rank, pe->where, st->streams);
    }

close_listener:
    /* Every expected connection is in: nobody may connect any more, and
     * whatever is still handshaking is a stranger (the kernel resets what
     * sits in the closed listener's backlog, holding no descriptor). */
    if (st->listen_fd >= 0) {
        close(st->listen_fd);
        st->listen_fd = -1;
    }
    if (hs.v != NULL) {
        hs_close_all(st, &hs);
        free(hs.v);
        log_listen_summary(st);
    }
    return WEFT_SUCCESS;

fail:
    hs_close_all(st, &hs);
    free(hs.v);
    log_listen_summary(st);
    /* Closes every socket and the listener; ctx stays for destroy. */
    tcp_release(st);
    return rc;
}

/* ------------------------------------------------------------ teardown -- */

static void peer_close_sockets(struct tcp_peer *pe, unsigned streams)
{
    if (pe->ctrl_fd >= 0) {
        close(pe->ctrl_fd);
        pe->ctrl_fd = -1;
    }
    for (unsigned s = 0; pe->data != NULL && s < streams; s++) {
        if (pe->data[s].fd >= 0) {
            close(pe->data[s].fd);
            pe->data[s].fd = -1;
        }
    }
    pe->up = 0;
}

/* Closes every socket of pe and stops sleep from polling them. */
static void peer_down(struct tcp_state *st, struct tcp_peer *pe)
{
    peer_close_sockets(pe, st->streams);
    publish_sleep_events(st, pe);
}

/* Forgets every push and expected receive of the peer (the pipe fails them). */
static void peer_drop_work(struct tcp_peer *pe, unsigned streams)
{
    weft_queue_init(&pe->push);
    weft_queue_init(&pe->expect);
    for (unsigned s = 0; pe->data != NULL && s < streams; s++) {
        pe->data[s].send_cur = pe->data[s].recv_cur = NULL;
        pe->data[s].send_off = pe->data[s].recv_off = 0;
    }
    pe->out_off = pe->out_len = 0;
    pe->in_len = 0;
}

static void peer_free(struct tcp_peer *pe, unsigned streams)
{
    peer_close_sockets(pe, streams);
    peer_drop_work(pe, streams);
    free(pe->data);
    free(pe->in);
    free(pe->out);
    pe->data = NULL;
    pe->in = pe->out = NULL;
}

/* Closes and frees everything but st itself (a failed connect leaves st
 * for destroy). Touches no env: destroy may run after the comm let go of it. */
static void tcp_release(struct tcp_state *st)
{
    if (st->peers != NULL)
        for (int r = 0; r < st->size; r++)
            peer_free(&st->peers[r], st->streams);
    if (st->listen_fd >= 0) {
        close(st->listen_fd);
        st->listen_fd = -1;
    }
    free(st->peers);
    free(st->active);
    free(st->pfds);
    free(st->sleep_fds);
    free(st->sleep_events);
    st->peers = NULL;
    st->active = NULL;
    st->nactive = 0;
    st->pfds = NULL;
    st->pfds_cap = 0;
    st->sleep_fds = NULL;
    st->sleep_events = NULL;
    st->sleep_n = 0;
}

static void tcp_destroy(void *ctx)
{
    struct tcp_state *st = ctx;
    if (st == NULL)
        return;
    tcp_release(st);
    free(st);
}

/* The connection to pe failed: record why, close its sockets so the peer
 * notices too, and tell the pipe (which breaks and calls abort_peer).
 * err_no 0 means an orderly close by the peer. */
static void peer_fail(struct tcp_state *st, struct tcp_peer *pe, const char *what, int err_no)
{
    if (!pe->up)
        return;
    weft_set_error(st->env->core, WEFT_ERR_TRANSPORT, "tcp: peer %d (%s): %s: %s", pe->rank, pe->where,
                   what, err_no ? strerror(err_no) : "connection closed by the peer");
    peer_down(st, pe);
    st->env->up->peer_failed(st->env->up->arg, pe->rank, WEFT_ERR_TRANSPORT);
}

static void tcp_abort_peer(void *ctx, int peer)
{
    struct tcp_state *st = ctx;
    struct tcp_peer *pe = peer_of(st, peer);
    if (pe == NULL)
        return;
    peer_drop_work(pe, st->streams);
    /* Dropping a push half-way desynchronises the data sockets, so the
     * connection cannot carry anything after this: close it, and the peer's
     * pipe breaks too instead of misreading the next message. */
    peer_down(st, pe);
}

/* ------------------------------------------------------------- control -- */

/* Same for the library's own lanes: WEFT_TCP_EAGER is the only setting. */
static size_t tcp_eager_limit(void *ctx, int peer, int internal)
{
    const struct tcp_state *st = ctx;
    (void)peer;
    (void)internal;
    return st != NULL ? st->eager_limit : 0;
}

/* Writes out as much of the pending control bytes as the socket takes.
 * Returns >0 if bytes moved, 0 if none, -1 on a socket error (errno set). */
static int ctrl_flush(struct tcp_peer *pe)
{
    int moved = 0;
    while (pe->out_off < pe->out_len) {
        ssize_t n = send(pe->ctrl_fd, pe->out + pe->out_off, pe->out_len - pe->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return -1;
        }
        pe->out_off += (size_t)n;
        moved = 1;
    }
    if (pe->out_off == pe->out_len)
        pe->out_off = pe->out_len = 0;
    return moved;
}

/* Appends the bytes of iov[0..n) past the first skip to the pending control
 * output, compacting or growing it. */
static int ctrl_buffer(struct tcp_peer *pe, const struct iovec *iov, int n, size_t skip)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += iov[i].iov_len;
    size_t add = total - skip;
    size_t need = pe->out_len - pe->out_off + add;
    if (pe->out_off > 0 && pe->out_len + add > pe->out_cap) {
        memmove(pe->out, pe->out + pe->out_off, pe->out_len - pe->out_off);
        pe->out_len -= pe->out_off;
        pe->out_off = 0;
    }
    if (need > pe->out_cap) {
        size_t ncap = pe->out_cap ? pe->out_cap : 64 << 10;
        while (ncap < need)
            ncap *= 2;
        unsigned char *grown = realloc(pe->out, ncap);
        if (grown == NULL)
            return WEFT_ERR_NO_MEMORY;
        pe->out = grown;
        pe->out_cap = ncap;
    }
    for (int i = 0; i < n; i++) {
        size_t len = iov[i].iov_len;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        memcpy(pe->out + pe->out_len, (const unsigned char *)iov[i].iov_base + skip, len - skip);
        pe->out_len += len - skip;
        skip = 0;
    }
    return WEFT_SUCCESS;
}

static int tcp_ctrl_send(void *ctx, int peer, const void *hdr, size_t hdr_len, const void *payload, size_t len)
{
    struct tcp_state *st = ctx;
    struct tcp_peer *pe = peer_of(st, peer);
    struct weft_core *core = st->env->core;
    struct tcp_frame f;

    if (pe == NULL || !pe->up)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: peer %d: connection is down", peer);
    if (hdr_len > WEFT_TP_CTRL_HDR_MAX)
        return weft_set_error(core, WEFT_ERR_INTERNAL,
                              "tcp: control header of %zu bytes to peer %d exceeds WEFT_TP_CTRL_HDR_MAX (%d)",
                              hdr_len, peer, WEFT_TP_CTRL_HDR_MAX);
    if (len > ctrl_payload_max(st))
        return weft_set_error(core, WEFT_ERR_INTERNAL,
                              "tcp: control payload of %zu bytes to peer %d exceeds the eager limit %zu",
                              len, peer, ctrl_payload_max(st));
    memset(&f, 0, sizeof(f));
    f.magic = TCP_FRAME_MAGIC;
    f.len = (uint32_t)(hdr_len + len);

    struct iovec iov[3];
    int niov = 0;
    iov[niov++] = (struct iovec){ &f, sizeof(f) };
    if (hdr_len > 0)
        iov[niov++] = (struct iovec){ (void *)(uintptr_t)hdr, hdr_len };
    if (len > 0)
        iov[niov++] = (struct iovec){ (void *)(uintptr_t)payload, len };
    const size_t total = sizeof(f) + hdr_len + len;

    size_t pending = pe->out_len - pe->out_off;
    size_t sent = 0;
    if (pending > 0) {
        if (pending + total > TCP_CTRL_OUT_BOUND)
            return WEFT_EAGAIN;
    } else {
        /* Nothing queued ahead: hand the frame to the kernel directly and
         * keep only what it did not take. */
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)niov };
        ssize_t n;
        do {
            n = sendmsg(pe->ctrl_fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        } while (n < 0 && errno == EINTR);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            int e = errno;
            weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: peer %d (%s): sending a control message: %s",
                           pe->rank, pe->where, strerror(e));
            peer_down(st, pe);
            return WEFT_ERR_TRANSPORT;
        }
        sent = n > 0 ? (size_t)n : 0;
        if (sent == total)
            return WEFT_SUCCESS;
    }
    if (ctrl_buffer(pe, iov, niov, sent) != WEFT_SUCCESS) {
        if (sent > 0) {
            /* Part of the frame is on the wire: the stream cannot continue. */
            weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: peer %d: out of memory buffering a control message",
                           pe->rank);
            peer_down(st, pe);
            return WEFT_ERR_NO_MEMORY;
        }
        return WEFT_EAGAIN;
    }
    pe->kick = 1;
    publish_sleep_events(st, pe);
    if (pending > 0 && ctrl_flush(pe) < 0) {
        int e = errno;
        weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: peer %d (%s): sending a control message: %s",
                       pe->rank, pe->where, strerror(e));
        peer_down(st, pe);
        return WEFT_ERR_TRANSPORT;
    }
    return WEFT_SUCCESS;
}

/* Reads control bytes and hands every complete frame to the pipe. */
static int ctrl_receive(struct tcp_state *st, struct tcp_peer *pe)
{
    const struct weft_tp_upcalls *up = st->env->up;
    const size_t frame_max = WEFT_TP_CTRL_HDR_MAX + ctrl_payload_max(st);
    int events = 0;
    for (int round = 0; round < 16 && pe->up; round++) {
        if (pe->in_len == pe->in_cap)
            break;   /* cannot happen: a parse pass leaves less than one frame */
        ssize_t n = recv(pe->ctrl_fd, pe->in + pe->in_len, pe->in_cap - pe->in_len, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            peer_fail(st, pe, "reading the control connection", errno);
            return events;
        }
        if (n == 0) {
            peer_fail(st, pe, "reading the control connection", 0);
            return events;
        }
        pe->in_len += (size_t)n;

        size_t pos = 0;
        while (pe->up && pe->in_len - pos >= sizeof(struct tcp_frame)) {
            struct tcp_frame f;
            memcpy(&f, pe->in + pos, sizeof(f));
            if (f.magic != TCP_FRAME_MAGIC || f.len > frame_max) {
                char what[160];
                snprintf(what, sizeof(what),
                         "bad control frame (magic %#x, payload %u bytes, eager limit %zu): are"
                         " WEFT_TCP_EAGER values equal on all ranks?",
                         f.magic, f.len, st->eager_limit);
                peer_fail(st, pe, what, EPROTO);
                return events;
            }
            if (pe->in_len - pos < sizeof(f) + f.len)
                break;
            /* The upcall may re-enter (ctrl_send, rndv_expect/push,
             * abort_peer): the frame stays put in pe->in meanwhile, and an
             * abort shows as !pe->up. */
            up->on_ctrl(up->arg, pe->rank, pe->in + pos + sizeof(f), f.len);
            pos += sizeof(f) + f.len;
            events++;
        }
        if (!pe->up)
            return events;
        if (pos > 0) {
            memmove(pe->in, pe->in + pos, pe->in_len - pos);
            pe->in_len -= pos;
        }
    }
    return events;
}

/* ---------------------------------------------------------------- data -- */

/* Fills iov with the contiguous pieces of socket s's share of a message of
 * n bytes at base, starting at share offset off. Returns the entry count. */
static int share_iov(unsigned char *base, uint64_t n, uint64_t chunk, unsigned streams, unsigned s,
                     uint64_t off, uint64_t share, struct iovec *iov, size_t *total)
{
    int cnt = 0;
    *total = 0;
    while (cnt < TCP_IOV_MAX && off < share && *total < TCP_IO_MAX_BYTES) {
        uint64_t mo, len;
        weft_stripe_locate(n, chunk, streams, s, off, &mo, &len);
        if (len > TCP_IO_MAX_BYTES - *total)
            len = TCP_IO_MAX_BYTES - *total;
        iov[cnt].iov_base = base + mo;
        iov[cnt].iov_len = (size_t)len;
        cnt++;
        off += len;
        *total += (size_t)len;
    }
    return cnt;
}

/* Pushes as much of socket s's outbound shares as the socket takes. */
static int data_send(struct tcp_state *st, struct tcp_peer *pe, unsigned s)
{
    struct tcp_data_sock *d = &pe->data[s];
    int events = 0;
    while (pe->up && d->send_cur != NULL) {
        struct weft_tp_xfer *x = d->send_cur;
        struct tcp_xfer *t = tx_of(x);
        uint64_t n = t->bytes;
        uint64_t share = weft_stripe_share(n, st->chunk, st->streams, s);
        if (d->send_off >= share) {
            t->sockets_done++;       /* one more socket finished this message */
            d->send_cur = xfer_next(x);
            d->send_off = 0;
            events++;
            continue;
        }
        struct iovec iov[TCP_IOV_MAX];
        size_t total;
        struct msghdr mh = { 0 };
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)share_iov((unsigned char *)x->buf, n, st->chunk, st->streams, s,
                                          d->send_off, share, iov, &total);
        ssize_t w = sendmsg(d->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            peer_fail(st, pe, "sending on a data connection", errno);
            break;
        }
        d->send_off += (uint64_t)w;
        events++;
        if ((size_t)w < total)
            break;                   /* socket buffer full */
    }
    return events;
}

/* Reads as much of socket s's inbound shares as has arrived. */
static int data_recv(struct tcp_state *st, struct tcp_peer *pe, unsigned s)
{
    struct tcp_data_sock *d = &pe->data[s];
    int events = 0;
    while (pe->up && d->recv_cur != NULL) {
        struct weft_tp_xfer *x = d->recv_cur;
        struct tcp_xfer *t = tx_of(x);
        uint64_t n = t->bytes;
        uint64_t share = weft_stripe_share(n, st->chunk, st->streams, s);
        if (d->recv_off >= share) {
            t->sockets_done++;
            d->recv_cur = xfer_next(x);
            d->recv_off = 0;
            events++;
            continue;
        }
        struct iovec iov[TCP_IOV_MAX];
        size_t total;
        struct msghdr mh = { 0 };
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)share_iov((unsigned char *)x->buf, n, st->chunk, st->streams, s,
                                          d->recv_off, share, iov, &total);
        ssize_t got = recvmsg(d->fd, &mh, MSG_DONTWAIT);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            peer_fail(st, pe, "reading a data connection", errno);
            break;
        }
        if (got == 0) {
            peer_fail(st, pe, "reading a data connection", 0);
            break;
        }
        d->recv_off += (uint64_t)got;
        events++;
        if ((size_t)got < total)
            break;
    }
    return events;
}

/* A data socket with no expected receive became readable: the only
 * legitimate cause is the peer closing it. */
static void data_check_idle(struct tcp_state *st, struct tcp_peer *pe, unsigned s)
{
    char b;
    ssize_t n = recv(pe->data[s].fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        peer_fail(st, pe, "data connection closed", 0);
    else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        peer_fail(st, pe, "data connection", errno);
    else if (n > 0)
        peer_fail(st, pe, "data arrived with no receive expecting it (protocol error)", EPROTO);
}

static unsigned tcp_rndv_mem(void *ctx, int peer)
{
    (void)ctx;
    (void)peer;
    return WEFT_TP_MEM_HOST;
}

/* The key is empty: the pipe starts pushes on the sender and expects on the
 * receiver in the same (CTS) order, which is all the data sockets need. */
static int tcp_rndv_expect(void *ctx, int peer, struct weft_tp_xfer *x, const struct weft_tp_src *src,
                           void *key, size_t *keylen)
{
    struct tcp_state *st = ctx;
    struct tcp_peer *pe = peer_of(st, peer);
    (void)src;
    (void)key;
    *keylen = 0;
    if (pe == NULL || !pe->up)
        return weft_set_error(st->env->core, WEFT_ERR_TRANSPORT, "tcp: peer %d: connection is down", peer);
    struct tcp_xfer *t = tx_of(x);
    t->bytes = x->bytes;
    t->sockets_done = 0;
    weft_queue_push(&pe->expect, &t->node);
    for (unsigned s = 0; s < st->streams; s++) {
        if (pe->data[s].recv_cur == NULL) {
            pe->data[s].recv_cur = x;
            pe->data[s].recv_off = 0;
        }
    }
    pe->kick = 1;
    return WEFT_SUCCESS;
}

static int tcp_rndv_push(void *ctx, int peer, struct weft_tp_xfer *x, const void *key, size_t keylen)
{
    struct tcp_state *st = ctx;
    struct tcp_peer *pe = peer_of(st, peer);
    (void)key;
    (void)keylen;
    if (pe == NULL || !pe->up)
        return weft_set_error(st->env->core, WEFT_ERR_TRANSPORT, "tcp: peer %d: connection is down", peer);
    struct tcp_xfer *t = tx_of(x);
    t->bytes = x->bytes;
    t->sockets_done = 0;
    weft_queue_push(&pe->push, &t->node);
    for (unsigned i = 0; i < st->streams; i++) {
        if (pe->data[i].send_cur == NULL) {
            pe->data[i].send_cur = x;
            pe->data[i].send_off = 0;
        }
    }
    pe->kick = 1;
    return WEFT_SUCCESS;
}

/* Completes, in FIFO order, the messages every data socket has finished.
 * A message is finished by all sockets only after all earlier ones are,
 * so completions never skip ahead. Each is unlinked before its upcall,
 * which may re-enter (a new push, abort_peer). */
static int complete_finished(struct tcp_state *st, struct tcp_peer *pe)
{
    const struct weft_tp_upcalls *up = st->env->up;
    int events = 0;
    struct weft_queue *fifos[2] = { &pe->push, &pe->expect };
    for (int q = 0; q < 2; q++) {
        while (pe->up && !weft_queue_empty(fifos[q])) {
            struct weft_tp_xfer *x = xfer_of(weft_queue_head(fifos[q]));
            if (tx_of(x)->sockets_done != st->streams)
                break;
            weft_queue_pop(fifos[q]);
            up->rndv_done(up->arg, x, WEFT_SUCCESS);
            events++;
        }
    }
    return events;
}

/* -------------------------------------------------------------- progress -- */

/* Fills st->pfds for every connected peer; returns the entry count. */
static size_t build_pollfds(struct tcp_state *st)
{
    size_t need = (size_t)st->nactive * (1 + st->streams);
    if (st->pfds_cap < need) {
        struct pollfd *grown = realloc(st->pfds, need * sizeof(*grown));
        if (grown == NULL)
            return 0;
        st->pfds = grown;
        st->pfds_cap = need;
    }
    size_t n = 0;
    for (int i = 0; i < st->nactive; i++) {
        struct tcp_peer *pe = &st->peers[st->active[i]];
        if (!pe->up)
            continue;
        pe->pfd_base = n;
        st->pfds[n].fd = pe->ctrl_fd;
        st->pfds[n].events = (short)(POLLIN | (pe->out_len > pe->out_off ? POLLOUT : 0));
        st->pfds[n].revents = 0;
        n++;
        for (unsigned s = 0; s < st->streams; s++) {
            st->pfds[n].fd = pe->data[s].fd;
            st->pfds[n].events = (short)(POLLIN | (pe->data[s].send_cur ? POLLOUT : 0));
            st->pfds[n].revents = 0;
            n++;
        }
    }
    return n;
}

static int peer_progress(struct tcp_state *st, struct tcp_peer *pe, int polled)
{
    int events = 0;
    int kick = pe->kick;
    pe->kick = 0;
    const struct pollfd *pf = polled ? &st->pfds[pe->pfd_base] : NULL;

    if (pf != NULL && (pf[0].revents & (POLLIN | POLLHUP | POLLERR)))
        events += ctrl_receive(st, pe);
    if (pe->up && pe->out_len > pe->out_off) {
        int r = ctrl_flush(pe);
        if (r < 0)
            peer_fail(st, pe, "sending a control message", errno);
        else
            events += r;
    }
    /* Work queued since the poll (pushes started by a CTS just read, a new
     * expected receive) is tried at once rather than on the next pass. */
    kick |= pe->kick;
    pe->kick = 0;
    for (unsigned s = 0; pe->up && s < st->streams; s++) {
        short rev = pf != NULL ? pf[1 + s].revents : 0;
        struct tcp_data_sock *d = &pe->data[s];
        if (d->send_cur != NULL && (kick || (rev & (POLLOUT | POLLERR | POLLHUP))))
            events += data_send(st, pe, s);
        if (!pe->up)
            break;
        if (d->recv_cur != NULL && (kick || (rev & (POLLIN | POLLERR | POLLHUP))))
            events += data_recv(st, pe, s);
        else if (d->recv_cur == NULL && (rev & (POLLIN | POLLERR | POLLHUP)))
            data_check_idle(st, pe, s);
    }
    if (pe->up)
        events += complete_finished(st, pe);
    publish_sleep_events(st, pe);
    return events;
}

static int tcp_progress(void *ctx)
{
    struct tcp_state *st = ctx;
    if (st == NULL || st->nactive == 0)
        return 0;
    size_t n = build_pollfds(st);
    if (n == 0)
        return 0;
    int ready = poll(st->pfds, n, 0);
    if (ready < 0)
        ready = 0;
    int events = 0;
    for (int i = 0; i < st->nactive; i++) {
        struct tcp_peer *pe = &st->peers[st->active[i]];
        if (!pe->up || (ready == 0 && !pe->kick))
            continue;
        events += peer_progress(st, pe, 1);
    }
    return events;
}

/* Called without the lock (transport.h): reads only the fixed descriptor
 * list and the atomically published events. A descriptor closed and reused
 * meanwhile costs at most one early or late wake-up, which the caller's
 * bounded timeout absorbs. */
static void tcp_sleep(void *ctx, int timeout_ms)
{
    const struct tcp_state *st = ctx;
    if (st == NULL || st->sleep_n == 0)
        return;
    struct pollfd stack_pfds[128];
    struct pollfd *pfds = stack_pfds;
    if (st->sleep_n > sizeof(stack_pfds) / sizeof(stack_pfds[0])) {
        pfds = malloc(st->sleep_n * sizeof(*pfds));
        if (pfds == NULL)
            return;
    }
    for (size_t i = 0; i < st->sleep_n; i++) {
        int ev = atomic_load_explicit(&st->sleep_events[i], memory_order_relaxed);
        pfds[i].fd = ev ? st->sleep_fds[i] : -1;
        pfds[i].events = (short)ev;
        pfds[i].revents = 0;
    }
    (void)poll(pfds, st->sleep_n, timeout_ms);
    if (pfds != stack_pfds)
        free(pfds);
}

/* Control bytes accepted by ctrl_send that the kernel has not taken yet. */
static int tcp_busy(void *ctx)
{
    const struct tcp_state *st = ctx;
    if (st == NULL)
        return 0;
    for (int i = 0; i < st->nactive; i++) {
        const struct tcp_peer *pe = &st->peers[st->active[i]];
        if (pe->up && pe->out_len > pe->out_off)
            return 1;
    }
    return 0;
}

const struct weft_transport weft_transport_tcp = {
    .name = "tcp",
    .ctrl = 1,
    .scope = WEFT_TP_SCOPE_ANY,
    .sure = 0,
    .card_bytes = TCP_CARD_BYTES,
    .create = tcp_create,
    .reach = tcp_reach,
    .connect = tcp_connect,
    .destroy = tcp_destroy,
    .eager_limit = tcp_eager_limit,
    .ctrl_send = tcp_ctrl_send,
    .progress = tcp_progress,
    .rndv_mem = tcp_rndv_mem,
    .rndv_get = NULL,
    .rndv_expect = tcp_rndv_expect,
    .rndv_push = tcp_rndv_push,
    .abort_peer = tcp_abort_peer,
    .busy = tcp_busy,
    .wakeless = NULL,
    .sleep = tcp_sleep,
    .mem_pin = NULL,
    .mem_unpin = NULL,
};
