/*
 * TCP transport: ranks on different nodes without RDMA (or every pair when
 * WEFT_TRANSPORTS=tcp).
 *
 * Per peer: one control connection that carries framed control messages
 * (struct weft_ctrl + EAGER payload), plus WEFT_TCP_STREAMS data connections
 * that carry rendezvous payloads as raw bytes. A pushed message is cut into
 * chunks striped round-robin over the data sockets (tcp_stripe.h); since the
 * pipe guarantees that pushes on the sender and expected receives on the
 * receiver come in the same (CTS) order, each data socket is simply the
 * concatenation of its share of message after message, and the receiver
 * reads straight into the user buffer with no per-chunk header.
 *
 * Set-up: card_fill opens the listening socket before the rank cards are
 * exchanged, so by the time connect runs every listener exists and the
 * kernel's backlog completes connections even while the acceptor is busy
 * elsewhere; the lower rank of a pair connects to the higher one. Every new
 * connection starts with a hello whose job token the acceptor checks before
 * it reads anything else (tcp_hello.h).
 *
 * Every function here runs under the comm lock (transport.h), so per-comm
 * state needs no locking of its own. Nothing blocks except connect, whose
 * waits are bounded by WEFT_TIMEOUT.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm.h"
#include "log.h"
#include "pipe.h"
#include "tcp_hello.h"
#include "tcp_stripe.h"
#include "transport.h"

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

struct tcp_frame {
    uint32_t magic;
    uint32_t payload_len;
    struct weft_ctrl hdr;
};

/* A FIFO of requests linked through tp_next. */
struct tcp_req_fifo { struct weft_request *head, *tail; };

/* One data socket: it carries my pushes out and the peer's pushes in, each
 * direction walking its FIFO independently of the other sockets. */
struct tcp_data_sock {
    int                  fd;
    struct weft_request *send_cur;   /* push this socket is on (NULL: past the tail) */
    uint64_t             send_off;   /* bytes of send_cur's share already sent */
    struct weft_request *recv_cur;   /* expected receive this socket is on */
    uint64_t             recv_off;
};

struct tcp_peer {
    struct weft_pipe     *pipe;
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
    struct tcp_req_fifo   push;      /* my pushes, in rndv_push order */
    struct tcp_req_fifo   expect;    /* receives to fill, in rndv_expect order */

    size_t                pfd_base;  /* index of ctrl_fd in the progress poll array */
    size_t                sleep_base;/* index of ctrl_fd in sleep_fds */
};

struct tcp_state {
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

    /* What sleep polls. It runs without the comm lock, so it reads only
     * these: descriptors fixed at connect, and per-descriptor poll events
     * that progress publishes atomically (0: skip, the socket is closed). */
    int                *sleep_fds;     /* [nactive * (1 + streams)] */
    atomic_int         *sleep_events;
    size_t              sleep_n;
};

static struct tcp_state *tcp_state_of(const struct weft_comm *c)
{
    return (struct tcp_state *)c->tp_state[WEFT_TP_TCP];
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
 * non-loopback IPv4 interface, else 127.0.0.1) to the address to listen on. */
static int resolve_listen_addr(struct weft_comm *c, struct in_addr *out)
{
    const char *want = c->cfg.tcp_if;
    struct in_addr lit;

    if (want[0] != '\0' && inet_pton(AF_INET, want, &lit) == 1) {
        *out = lit;
        return WEFT_SUCCESS;
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: getifaddrs failed: %s", strerror(errno));
    int found = 0;
    for (struct ifaddrs *i = ifs; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
            continue;
        if (want[0] != '\0') {
            if (strcmp(i->ifa_name, want) != 0)
                continue;
        } else if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) {
            continue;
        }
        *out = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr;
        found = 1;
    }
    freeifaddrs(ifs);
    if (found)
        return WEFT_SUCCESS;
    if (want[0] != '\0')
        return weft_set_error(c, WEFT_ERR_INVALID_ARG,
                              "tcp: WEFT_TCP_IF=%s is neither an IPv4 address nor an interface with one",
                              want);
    out->s_addr = htonl(INADDR_LOOPBACK);
    WEFT_INFO(c->rank, "tcp: no UP non-loopback IPv4 interface, listening on 127.0.0.1");
    return WEFT_SUCCESS;
}

/* ------------------------------------------------------------- card_fill -- */

static void tcp_disconnect(struct weft_comm *c);

static int tcp_card_fill(struct weft_comm *c, struct weft_rank_card *mine)
{
    struct tcp_state *st = tcp_state_of(c);
    int rc;

    if (st != NULL)   /* already listening (card refilled): reuse it */
        goto fill;
    st = calloc(1, sizeof(*st));
    if (st == NULL)
        return weft_set_error(c, WEFT_ERR_NO_MEMORY, "tcp: out of memory for transport state");
    st->listen_fd = -1;
    st->streams = c->cfg.tcp_streams > 0 ? (unsigned)c->cfg.tcp_streams : 1;
    st->chunk = c->cfg.tcp_chunk > 0 ? (uint64_t)c->cfg.tcp_chunk : (uint64_t)512 << 10;
    st->eager_limit = c->cfg.tcp_eager_limit;

    struct in_addr ip = { .s_addr = htonl(INADDR_LOOPBACK) };
    rc = resolve_listen_addr(c, &ip);
    if (rc != WEFT_SUCCESS)
        goto fail_state;

    st->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (st->listen_fd < 0) {
        rc = weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: socket() for the listener failed: %s",
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
        rc = weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: bind to %s failed: %s", a, strerror(errno));
        goto fail_socket;
    }
    /* A deep backlog lets every lower rank connect before this rank gets
     * round to accepting (up to 1 + streams connections per peer). */
    if (listen(st->listen_fd, 4096) != 0) {
        rc = weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: listen failed: %s", strerror(errno));
        goto fail_socket;
    }
    socklen_t alen = sizeof(st->listen_addr);
    if (getsockname(st->listen_fd, (struct sockaddr *)&st->listen_addr, &alen) != 0) {
        rc = weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: getsockname failed: %s", strerror(errno));
        goto fail_socket;
    }
    c->tp_state[WEFT_TP_TCP] = st;
    {
        char a[64];
        format_addr(&st->listen_addr, a, sizeof(a));
        WEFT_INFO(c->rank, "tcp: listening on %s (%u data streams, chunk %llu bytes)", a,
                  st->streams, (unsigned long long)st->chunk);
    }

fill:
    mine->tcp_family = AF_INET;
    mine->tcp_port = st->listen_addr.sin_port;
    memset(mine->tcp_addr, 0, sizeof(mine->tcp_addr));
    memcpy(mine->tcp_addr, &st->listen_addr.sin_addr, sizeof(st->listen_addr.sin_addr));
    return WEFT_SUCCESS;

fail_socket:
    close(st->listen_fd);
fail_state:
    free(st);
    return rc;
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
    struct weft_tcp_hello hello;
    struct weft_tcp_ack   ack;
    char                  where[64];  /* remote address, for messages */
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

/* Advances one handshake. Returns WEFT_SUCCESS (step taken or nothing to
 * do yet), or an error for an outgoing connection that failed (fatal for
 * connect). Incoming connections that fail a check are dropped with a
 * warning: a stranger or a stale process must not stop the job. */
static int conn_step(struct weft_comm *c, struct tcp_state *st, struct tcp_conn *k)
{
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
                return weft_set_error(c, WEFT_ERR_TRANSPORT,
                                      "tcp: connecting to peer %d at %s failed: %s",
                                      k->peer, k->where, strerror(err));
            k->stage = CONN_SEND_HELLO;
            k->done = 0;
            break;
        }
        case CONN_SEND_HELLO: {
            int r = conn_send(k, &k->hello, sizeof(k->hello));
            if (r < 0)
                return weft_set_error(c, WEFT_ERR_TRANSPORT,
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
                return weft_set_error(c, WEFT_ERR_TRANSPORT,
                                      "tcp: peer %d at %s refused the connection (%s): is it a"
                                      " rank of this job with the same WEFT_TCP_* settings?",
                                      k->peer, k->where, n == 0 ? "closed" : strerror(errno));
            k->done += (size_t)n;
            if (k->done < sizeof(k->ack))
                return WEFT_SUCCESS;
            if (k->ack.token != c->cards[c->rank].token)
                return weft_set_error(c, WEFT_ERR_TRANSPORT,
                                      "tcp: the process at %s answered with a wrong job token;"
                                      " it is not peer %d of this job",
                                      k->where, k->peer);
            k->stage = CONN_DONE;
            return WEFT_SUCCESS;
        }
        case CONN_READ_HELLO: {
            int r = weft_tcp_hello_recv(k->fd, &k->hello, &k->done, c->cards[c->rank].token,
                                        why, sizeof(why));
            if (r == WEFT_EAGAIN)
                return WEFT_SUCCESS;
            if (r == WEFT_SUCCESS)
                r = weft_tcp_hello_check(&k->hello, c->rank, c->size, st->streams, st->chunk,
                                         (uint32_t)st->eager_limit, why, sizeof(why));
            if (r == WEFT_SUCCESS) {
                struct tcp_peer *pe = &st->peers[k->hello.rank];
                if (!pe->used || k->hello.rank > c->rank) {
                    snprintf(why, sizeof(why), "rank %d is not a tcp peer that connects to this rank",
                             (int)k->hello.rank);
                    r = WEFT_ERR_TRANSPORT;
                } else if (*peer_slot(pe, k->hello.index) >= 0) {
                    snprintf(why, sizeof(why), "rank %d already connected socket %d",
                             (int)k->hello.rank, (int)k->hello.index);
                    r = WEFT_ERR_TRANSPORT;
                }
            }
            if (r != WEFT_SUCCESS) {
                WEFT_WARN(c->rank, "tcp: rejected connection from %s: %s", k->where, why);
                k->stage = CONN_DROPPED;
                return WEFT_SUCCESS;
            }
            k->peer = k->hello.rank;
            k->index = k->hello.index;
            k->ack.token = c->cards[k->peer].token;
            k->stage = CONN_SEND_ACK;
            k->done = 0;
            break;
        }
        case CONN_SEND_ACK: {
            int r = conn_send(k, &k->ack, sizeof(k->ack));
            if (r < 0) {
                WEFT_WARN(c->rank, "tcp: answering peer %d at %s failed: %s", k->peer, k->where,
                          strerror(errno));
                k->stage = CONN_DROPPED;
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
static int conn_open(struct weft_comm *c, struct tcp_state *st, int peer, int index, struct tcp_conn *k)
{
    const struct weft_rank_card *card = &c->cards[peer];
    struct sockaddr_in sa;

    memset(k, 0, sizeof(*k));
    k->fd = -1;
    k->outgoing = 1;
    k->peer = peer;
    k->index = index;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = card->tcp_port;
    memcpy(&sa.sin_addr, card->tcp_addr, sizeof(sa.sin_addr));
    format_addr(&sa, k->where, sizeof(k->where));
    if (card->tcp_family != AF_INET)
        return weft_set_error(c, WEFT_ERR_TRANSPORT,
                              "tcp: peer %d offers no IPv4 listener (family %u)", peer,
                              (unsigned)card->tcp_family);

    k->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (k->fd < 0)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: socket() for peer %d failed: %s%s", peer,
                              strerror(errno), fd_limit_hint(errno));
    tune_socket(k->fd);
    if (connect(k->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(k->fd);
        k->fd = -1;
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: connecting to peer %d at %s failed: %s",
                              peer, k->where, strerror(e));
    }
    k->stage = CONN_CONNECTING;
    k->hello.token = card->token;
    k->hello.rank = c->rank;
    k->hello.index = index;
    k->hello.streams = st->streams;
    k->hello.chunk = st->chunk;
    k->hello.eager_limit = (uint32_t)st->eager_limit;
    return WEFT_SUCCESS;
}

/* Accepts whatever is waiting on the listener as new incoming handshakes. */
static int accept_pending(struct weft_comm *c, struct tcp_state *st, struct tcp_conn **conns,
                          size_t *n, size_t *cap)
{
    for (;;) {
        struct sockaddr_in sa;
        socklen_t alen = sizeof(sa);
        int fd = accept4(st->listen_fd, (struct sockaddr *)&sa, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return WEFT_SUCCESS;
            return weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: accept failed: %s%s", strerror(errno),
                                  fd_limit_hint(errno));
        }
        if (*n == *cap) {
            size_t ncap = *cap * 2 + 8;
            struct tcp_conn *grown = realloc(*conns, ncap * sizeof(**conns));
            if (grown == NULL) {
                close(fd);
                return weft_set_error(c, WEFT_ERR_NO_MEMORY, "tcp: out of memory accepting connections");
            }
            *conns = grown;
            *cap = ncap;
        }
        struct tcp_conn *k = &(*conns)[(*n)++];
        memset(k, 0, sizeof(*k));
        k->fd = fd;
        k->peer = -1;
        k->stage = CONN_READ_HELLO;
        format_addr(&sa, k->where, sizeof(k->where));
        tune_socket(fd);
    }
}

static int peer_alloc(struct tcp_state *st, struct tcp_peer *pe)
{
    pe->ctrl_fd = -1;
    pe->data = calloc(st->streams, sizeof(*pe->data));
    pe->in_cap = sizeof(struct tcp_frame) + st->eager_limit + TCP_CTRL_IN_SLACK;
    pe->in = malloc(pe->in_cap);
    if (pe->data == NULL || pe->in == NULL)
        return WEFT_ERR_NO_MEMORY;
    for (unsigned s = 0; s < st->streams; s++)
        pe->data[s].fd = -1;
    return WEFT_SUCCESS;
}

static int tcp_connect(struct weft_comm *c)
{
    struct tcp_state *st = tcp_state_of(c);
    struct tcp_conn *conns = NULL;
    size_t nconns = 0, cap = 0;
    int rc = WEFT_SUCCESS;

    if (st == NULL)
        return WEFT_SUCCESS;   /* tcp not offered by this rank: no pipe can use it */

    int ntcp = 0;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && c->pipes[r].tp == &weft_transport_tcp)
            ntcp++;
    if (ntcp == 0)
        goto close_listener;

    st->peers = calloc((size_t)c->size, sizeof(*st->peers));
    st->active = calloc((size_t)ntcp, sizeof(*st->active));
    if (st->peers == NULL || st->active == NULL) {
        rc = weft_set_error(c, WEFT_ERR_NO_MEMORY, "tcp: out of memory for %d peers", ntcp);
        goto fail;
    }
    size_t expected_in = 0, nout = 0;
    for (int r = 0; r < c->size; r++) {
        struct tcp_peer *pe = &st->peers[r];
        pe->rank = r;
        pe->ctrl_fd = -1;
        if (r == c->rank || c->pipes[r].tp != &weft_transport_tcp)
            continue;
        pe->used = 1;
        pe->pipe = &c->pipes[r];
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = c->cards[r].tcp_port };
        memcpy(&sa.sin_addr, c->cards[r].tcp_addr, sizeof(sa.sin_addr));
        format_addr(&sa, pe->where, sizeof(pe->where));
        st->active[st->nactive++] = r;
        if (peer_alloc(st, pe) != WEFT_SUCCESS) {
            rc = weft_set_error(c, WEFT_ERR_NO_MEMORY, "tcp: out of memory for peer %d", r);
            goto fail;
        }
        if (r < c->rank)
            expected_in += 1 + st->streams;
        else
            nout += 1 + st->streams;
    }

    cap = nout + expected_in + 8;
    conns = calloc(cap, sizeof(*conns));
    if (conns == NULL) {
        rc = weft_set_error(c, WEFT_ERR_NO_MEMORY, "tcp: out of memory for %zu connections", cap);
        goto fail;
    }
    /* Lower rank connects: every pair has exactly one connector. */
    for (int r = c->rank + 1; r < c->size; r++) {
        if (!st->peers[r].used)
            continue;
        for (unsigned i = 0; i <= st->streams; i++) {
            rc = conn_open(c, st, r, (int)i, &conns[nconns]);
            if (conns[nconns].fd >= 0)
                nconns++;
            if (rc != WEFT_SUCCESS)
                goto fail;
        }
    }

    double deadline = c->cfg.timeout_s > 0 ? weft_now() + c->cfg.timeout_s : 0;
    size_t done = 0;
    struct pollfd *pfds = NULL;
    size_t pfds_cap = 0;
    while (done < nout + expected_in) {
        if (pfds_cap < nconns + 1) {
            pfds_cap = cap + 1;
            free(pfds);
            pfds = calloc(pfds_cap, sizeof(*pfds));
            if (pfds == NULL) {
                rc = weft_set_error(c, WEFT_ERR_NO_MEMORY, "tcp: out of memory while connecting");
                goto fail;
            }
        }
        size_t np = 0;
        pfds[np++] = (struct pollfd){ .fd = st->listen_fd, .events = POLLIN };
        for (size_t i = 0; i < nconns; i++)
            if (conns[i].stage != CONN_DONE && conns[i].stage != CONN_DROPPED)
                pfds[np++] = (struct pollfd){ .fd = conns[i].fd, .events = (short)conn_events(&conns[i]) };
        int wait_ms = 100;
        if (deadline > 0) {
            double left = deadline - weft_now();
            if (left <= 0) {
                /* Name one peer still missing: the first unfinished outgoing
                 * connection, else the first lower peer short of sockets. */
                int missing = -1;
                const char *what = "connecting to";
                for (size_t i = 0; i < nconns && missing < 0; i++)
                    if (conns[i].outgoing && conns[i].stage != CONN_DONE)
                        missing = conns[i].peer;
                for (int r = 0; r < c->rank && missing < 0; r++) {
                    if (!st->peers[r].used)
                        continue;
                    for (unsigned s = 0; s <= st->streams; s++)
                        if (*peer_slot(&st->peers[r], (int)s) < 0)
                            missing = r;
                    what = "waiting for a connection from";
                }
                rc = weft_set_error(c, WEFT_ERR_TIMEOUT,
                                    "tcp: timed out after %.0f s %s peer %d (%s) (WEFT_TIMEOUT)",
                                    c->cfg.timeout_s, what, missing,
                                    missing >= 0 ? st->peers[missing].where : "?");
                free(pfds);
                goto fail;
            }
            if (left * 1000 < wait_ms)
                wait_ms = (int)(left * 1000) + 1;
        }
        if (poll(pfds, np, wait_ms) < 0 && errno != EINTR) {
            rc = weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: poll failed while connecting: %s",
                                strerror(errno));
            free(pfds);
            goto fail;
        }
        if (pfds[0].revents & POLLIN) {
            rc = accept_pending(c, st, &conns, &nconns, &cap);
            if (rc != WEFT_SUCCESS) {
                free(pfds);
                goto fail;
            }
        }
        for (size_t i = 0; i < nconns; i++) {
            struct tcp_conn *k = &conns[i];
            if (k->stage == CONN_DONE || k->stage == CONN_DROPPED)
                continue;
            rc = conn_step(c, st, k);
            if (rc != WEFT_SUCCESS) {
                free(pfds);
                goto fail;
            }
            if (k->stage == CONN_DROPPED) {
                close(k->fd);
                k->fd = -1;
            } else if (k->stage == CONN_DONE) {
                /* The peer's socket slot now owns the descriptor. */
                int *slot = peer_slot(&st->peers[k->peer], k->index);
                if (!k->outgoing && *slot >= 0) {   /* raced a duplicate */
                    close(k->fd);
                    k->fd = -1;
                    k->stage = CONN_DROPPED;
                    continue;
                }
                *slot = k->fd;
                k->fd = -1;
                done++;
            }
        }
        /* Compact finished handshakes away so rogue connections cannot
         * grow the array without bound. */
        size_t keep = 0;
        for (size_t i = 0; i < nconns; i++)
            if (conns[i].fd >= 0)   /* still handshaking */
                conns[keep++] = conns[i];
        nconns = keep;
    }
    free(pfds);

    st->sleep_n = (size_t)st->nactive * (1 + st->streams);
    st->sleep_fds = calloc(st->sleep_n, sizeof(*st->sleep_fds));
    st->sleep_events = calloc(st->sleep_n, sizeof(*st->sleep_events));
    if (st->sleep_fds == NULL || st->sleep_events == NULL) {
        rc = weft_set_error(c, WEFT_ERR_NO_MEMORY, "tcp: out of memory for the poll set");
        goto fail;
    }
    for (int i = 0; i < st->nactive; i++) {
        struct tcp_peer *pe = &st->peers[st->active[i]];
        pe->sleep_base = (size_t)i * (1 + st->streams);
        st->sleep_fds[pe->sleep_base] = pe->ctrl_fd;
        for (unsigned s = 0; s < st->streams; s++)
            st->sleep_fds[pe->sleep_base + 1 + s] = pe->data[s].fd;
        pe->up = 1;
        pe->pipe->tp_peer = pe;
        publish_sleep_events(st, pe);
        WEFT_INFO(c->rank, "tcp: connected to peer %d at %s (1 control + %u data sockets)",
                  pe->rank, pe->where, st->streams);
    }
    free(conns);

close_listener:
    /* Every expected connection is in: nobody may connect any more. */
    if (st->listen_fd >= 0) {
        close(st->listen_fd);
        st->listen_fd = -1;
    }
    return WEFT_SUCCESS;

fail:
    for (size_t i = 0; i < nconns; i++)
        if (conns[i].fd >= 0)
            close(conns[i].fd);
    free(conns);
    tcp_disconnect(c);
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
    pe->push.head = pe->push.tail = NULL;
    pe->expect.head = pe->expect.tail = NULL;
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

static void tcp_disconnect(struct weft_comm *c)
{
    struct tcp_state *st = tcp_state_of(c);
    if (st == NULL)
        return;
    if (st->peers != NULL)
        for (int r = 0; r < c->size; r++)
            peer_free(&st->peers[r], st->streams);
    if (st->listen_fd >= 0)
        close(st->listen_fd);
    free(st->peers);
    free(st->active);
    free(st->pfds);
    free(st->sleep_fds);
    free(st->sleep_events);
    free(st);
    c->tp_state[WEFT_TP_TCP] = NULL;
}

/* The connection to pe failed: record why, close its sockets so the peer
 * notices too, and break the pipe (which calls abort_pipe). err_no 0 means
 * an orderly close by the peer. */
static void peer_fail(struct weft_comm *c, struct tcp_state *st, struct tcp_peer *pe,
                      const char *what, int err_no)
{
    if (!pe->up)
        return;
    weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: peer %d (%s): %s: %s", pe->rank, pe->where, what,
                   err_no ? strerror(err_no) : "connection closed by the peer");
    peer_down(st, pe);
    weft_pipe_break(pe->pipe, WEFT_ERR_TRANSPORT);
}

static void tcp_abort_pipe(struct weft_pipe *p)
{
    struct tcp_peer *pe = p->tp_peer;
    struct tcp_state *st = p->comm ? tcp_state_of(p->comm) : NULL;
    if (pe == NULL || st == NULL)
        return;
    peer_drop_work(pe, st->streams);
    /* Dropping a push half-way desynchronises the data sockets, so the
     * connection cannot carry anything after this: close it, and the peer's
     * pipe breaks too instead of misreading the next message. */
    peer_down(st, pe);
}

/* ------------------------------------------------------------- control -- */

static size_t tcp_eager_limit(const struct weft_comm *c)
{
    const struct tcp_state *st = tcp_state_of(c);
    return st != NULL ? st->eager_limit : c->cfg.tcp_eager_limit;
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

/* Appends bytes to the pending control output, compacting or growing it. */
static int ctrl_buffer(struct tcp_peer *pe, const void *a, size_t alen, const void *b, size_t blen)
{
    size_t need = pe->out_len - pe->out_off + alen + blen;
    if (pe->out_off > 0 && pe->out_len + alen + blen > pe->out_cap) {
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
    memcpy(pe->out + pe->out_len, a, alen);
    if (blen)
        memcpy(pe->out + pe->out_len + alen, b, blen);
    pe->out_len += alen + blen;
    return WEFT_SUCCESS;
}

static int tcp_ctrl_send(struct weft_pipe *p, const struct weft_ctrl *m, const void *payload, size_t len)
{
    struct weft_comm *c = p->comm;
    struct tcp_peer *pe = p->tp_peer;
    struct tcp_frame f;

    if (pe == NULL || !pe->up)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: peer %d: connection is down", p->peer);
    if (len > tcp_eager_limit(c) && len > 0)
        return weft_set_error(c, WEFT_ERR_INTERNAL,
                              "tcp: control payload of %zu bytes to peer %d exceeds the eager limit %zu",
                              len, p->peer, tcp_eager_limit(c));
    memset(&f, 0, sizeof(f));
    f.magic = TCP_FRAME_MAGIC;
    f.payload_len = (uint32_t)len;
    f.hdr = *m;

    size_t pending = pe->out_len - pe->out_off;
    size_t sent = 0;
    if (pending > 0) {
        if (pending + sizeof(f) + len > TCP_CTRL_OUT_BOUND)
            return WEFT_EAGAIN;
    } else {
        /* Nothing queued ahead: hand the frame to the kernel directly and
         * keep only what it did not take. */
        struct iovec iov[2] = { { &f, sizeof(f) }, { (void *)(uintptr_t)payload, len } };
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = len ? 2 : 1 };
        ssize_t n;
        do {
            n = sendmsg(pe->ctrl_fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        } while (n < 0 && errno == EINTR);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            int e = errno;
            weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: peer %d (%s): sending a control message: %s",
                           pe->rank, pe->where, strerror(e));
            peer_down(tcp_state_of(c), pe);
            return WEFT_ERR_TRANSPORT;
        }
        sent = n > 0 ? (size_t)n : 0;
        if (sent == sizeof(f) + len)
            return WEFT_SUCCESS;
    }
    const unsigned char *fb = (const unsigned char *)&f;
    int rc;
    if (sent < sizeof(f))
        rc = ctrl_buffer(pe, fb + sent, sizeof(f) - sent, payload, len);
    else
        rc = ctrl_buffer(pe, (const unsigned char *)payload + (sent - sizeof(f)),
                         len - (sent - sizeof(f)), NULL, 0);
    if (rc != WEFT_SUCCESS) {
        if (sent > 0) {
            /* Part of the frame is on the wire: the stream cannot continue. */
            weft_set_error(c, WEFT_ERR_NO_MEMORY, "tcp: peer %d: out of memory buffering a control message",
                           pe->rank);
            peer_down(tcp_state_of(c), pe);
            return WEFT_ERR_NO_MEMORY;
        }
        return WEFT_EAGAIN;
    }
    pe->kick = 1;
    publish_sleep_events(tcp_state_of(c), pe);
    if (pending > 0 && ctrl_flush(pe) < 0) {
        int e = errno;
        weft_set_error(c, WEFT_ERR_TRANSPORT, "tcp: peer %d (%s): sending a control message: %s",
                       pe->rank, pe->where, strerror(e));
        peer_down(tcp_state_of(c), pe);
        return WEFT_ERR_TRANSPORT;
    }
    return WEFT_SUCCESS;
}

/* Reads control bytes and hands every complete frame to the pipe. */
static int ctrl_receive(struct weft_comm *c, struct tcp_state *st, struct tcp_peer *pe)
{
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
            peer_fail(c, st, pe, "reading the control connection", errno);
            return events;
        }
        if (n == 0) {
            peer_fail(c, st, pe, "reading the control connection", 0);
            return events;
        }
        pe->in_len += (size_t)n;

        size_t pos = 0;
        while (pe->up && pe->in_len - pos >= sizeof(struct tcp_frame)) {
            struct tcp_frame f;
            memcpy(&f, pe->in + pos, sizeof(f));
            if (f.magic != TCP_FRAME_MAGIC || f.payload_len > st->eager_limit) {
                char what[160];
                snprintf(what, sizeof(what),
                         "bad control frame (magic %#x, payload %u bytes, eager limit %zu): are"
                         " WEFT_TCP_EAGER values equal on all ranks?",
                         f.magic, f.payload_len, st->eager_limit);
                peer_fail(c, st, pe, what, EPROTO);
                return events;
            }
            if (pe->in_len - pos < sizeof(f) + f.payload_len)
                break;
            weft_pipe_on_ctrl(pe->pipe, &f.hdr, f.payload_len ? pe->in + pos + sizeof(f) : NULL,
                              f.payload_len);
            pos += sizeof(f) + f.payload_len;
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

static void fifo_append(struct tcp_req_fifo *q, struct weft_request *r)
{
    r->tp_next = NULL;
    if (q->tail)
        q->tail->tp_next = r;
    else
        q->head = r;
    q->tail = r;
}

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
static int data_send(struct weft_comm *c, struct tcp_state *st, struct tcp_peer *pe, unsigned s)
{
    struct tcp_data_sock *d = &pe->data[s];
    int events = 0;
    while (pe->up && d->send_cur != NULL) {
        struct weft_request *r = d->send_cur;
        uint64_t n = r->tp_aux[1];
        uint64_t share = weft_stripe_share(n, st->chunk, st->streams, s);
        if (d->send_off >= share) {
            r->tp_aux[0]++;          /* one more socket finished this message */
            d->send_cur = r->tp_next;
            d->send_off = 0;
            events++;
            continue;
        }
        struct iovec iov[TCP_IOV_MAX];
        size_t total;
        struct msghdr mh = { 0 };
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)share_iov((unsigned char *)r->buf, n, st->chunk, st->streams, s,
                                          d->send_off, share, iov, &total);
        ssize_t w = sendmsg(d->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            peer_fail(c, st, pe, "sending on a data connection", errno);
            break;
        }
        d->send_off += (uint64_t)w;
        r->tp_done += (size_t)w;
        events++;
        if ((size_t)w < total)
            break;                   /* socket buffer full */
    }
    return events;
}

/* Reads as much of socket s's inbound shares as has arrived. */
static int data_recv(struct weft_comm *c, struct tcp_state *st, struct tcp_peer *pe, unsigned s)
{
    struct tcp_data_sock *d = &pe->data[s];
    int events = 0;
    while (pe->up && d->recv_cur != NULL) {
        struct weft_request *r = d->recv_cur;
        uint64_t n = r->tp_aux[1];
        uint64_t share = weft_stripe_share(n, st->chunk, st->streams, s);
        if (d->recv_off >= share) {
            r->tp_aux[0]++;
            d->recv_cur = r->tp_next;
            d->recv_off = 0;
            events++;
            continue;
        }
        struct iovec iov[TCP_IOV_MAX];
        size_t total;
        struct msghdr mh = { 0 };
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)share_iov((unsigned char *)r->buf, n, st->chunk, st->streams, s,
                                          d->recv_off, share, iov, &total);
        ssize_t got = recvmsg(d->fd, &mh, MSG_DONTWAIT);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            peer_fail(c, st, pe, "reading a data connection", errno);
            break;
        }
        if (got == 0) {
            peer_fail(c, st, pe, "reading a data connection", 0);
            break;
        }
        d->recv_off += (uint64_t)got;
        r->tp_done += (size_t)got;
        events++;
        if ((size_t)got < total)
            break;
    }
    return events;
}

/* A data socket with no expected receive became readable: the only
 * legitimate cause is the peer closing it. */
static void data_check_idle(struct weft_comm *c, struct tcp_state *st, struct tcp_peer *pe, unsigned s)
{
    char b;
    ssize_t n = recv(pe->data[s].fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        peer_fail(c, st, pe, "data connection closed", 0);
    else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        peer_fail(c, st, pe, "data connection", errno);
    else if (n > 0)
        peer_fail(c, st, pe, "data arrived with no receive expecting it (protocol error)", EPROTO);
}

static int tcp_rndv_expect(struct weft_pipe *p, struct weft_request *r)
{
    struct tcp_peer *pe = p->tp_peer;
    struct tcp_state *st = tcp_state_of(p->comm);
    if (pe == NULL || !pe->up)
        return weft_set_error(p->comm, WEFT_ERR_TRANSPORT, "tcp: peer %d: connection is down", p->peer);
    if (r->msg_bytes > r->bytes)
        return weft_set_error(p->comm, WEFT_ERR_INTERNAL,
                              "tcp: peer %d: expected push of %zu bytes into a %zu-byte buffer",
                              p->peer, r->msg_bytes, r->bytes);
    r->tp_done = 0;
    r->tp_aux[0] = 0;
    r->tp_aux[1] = r->msg_bytes;
    fifo_append(&pe->expect, r);
    for (unsigned s = 0; s < st->streams; s++) {
        if (pe->data[s].recv_cur == NULL) {
            pe->data[s].recv_cur = r;
            pe->data[s].recv_off = 0;
        }
    }
    pe->kick = 1;
    return WEFT_SUCCESS;
}

static int tcp_rndv_push(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts)
{
    struct tcp_peer *pe = p->tp_peer;
    struct tcp_state *st = tcp_state_of(p->comm);
    (void)cts;
    if (pe == NULL || !pe->up)
        return weft_set_error(p->comm, WEFT_ERR_TRANSPORT, "tcp: peer %d: connection is down", p->peer);
    s->tp_done = 0;
    s->tp_aux[0] = 0;
    s->tp_aux[1] = s->bytes;
    fifo_append(&pe->push, s);
    for (unsigned i = 0; i < st->streams; i++) {
        if (pe->data[i].send_cur == NULL) {
            pe->data[i].send_cur = s;
            pe->data[i].send_off = 0;
        }
    }
    pe->kick = 1;
    return WEFT_SUCCESS;
}

/* Completes, in FIFO order, the messages every data socket has finished.
 * A message is finished by all sockets only after all earlier ones are,
 * so completions never skip ahead. */
static int complete_finished(struct tcp_state *st, struct tcp_peer *pe)
{
    int events = 0;
    while (pe->up && pe->push.head != NULL && pe->push.head->tp_aux[0] == st->streams) {
        struct weft_request *r = pe->push.head;
        pe->push.head = r->tp_next;
        if (pe->push.head == NULL)
            pe->push.tail = NULL;
        r->tp_next = NULL;
        weft_pipe_send_done(pe->pipe, r, WEFT_SUCCESS);
        events++;
    }
    while (pe->up && pe->expect.head != NULL && pe->expect.head->tp_aux[0] == st->streams) {
        struct weft_request *r = pe->expect.head;
        pe->expect.head = r->tp_next;
        if (pe->expect.head == NULL)
            pe->expect.tail = NULL;
        r->tp_next = NULL;
        weft_pipe_recv_done(pe->pipe, r, WEFT_SUCCESS);
        events++;
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

static int peer_progress(struct weft_comm *c, struct tcp_state *st, struct tcp_peer *pe, int polled)
{
    int events = 0;
    int kick = pe->kick;
    pe->kick = 0;
    const struct pollfd *pf = polled ? &st->pfds[pe->pfd_base] : NULL;

    if (pf != NULL && (pf[0].revents & (POLLIN | POLLHUP | POLLERR)))
        events += ctrl_receive(c, st, pe);
    if (pe->up && pe->out_len > pe->out_off) {
        int r = ctrl_flush(pe);
        if (r < 0)
            peer_fail(c, st, pe, "sending a control message", errno);
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
            events += data_send(c, st, pe, s);
        if (!pe->up)
            break;
        if (d->recv_cur != NULL && (kick || (rev & (POLLIN | POLLERR | POLLHUP))))
            events += data_recv(c, st, pe, s);
        else if (d->recv_cur == NULL && (rev & (POLLIN | POLLERR | POLLHUP)))
            data_check_idle(c, st, pe, s);
    }
    if (pe->up)
        events += complete_finished(st, pe);
    publish_sleep_events(st, pe);
    return events;
}

static int tcp_progress(struct weft_comm *c)
{
    struct tcp_state *st = tcp_state_of(c);
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
        events += peer_progress(c, st, pe, 1);
    }
    return events;
}

/* Called without the comm lock (transport.h): reads only the fixed
 * descriptor list and the atomically published events. A descriptor closed
 * and reused meanwhile costs at most one early or late wake-up, which the
 * caller's bounded timeout absorbs. */
static void tcp_sleep(struct weft_comm *c, int timeout_ms)
{
    const struct tcp_state *st = tcp_state_of(c);
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
static int tcp_busy(const struct weft_comm *c)
{
    const struct tcp_state *st = tcp_state_of(c);
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
    .id = WEFT_TP_TCP,
    .card_fill = tcp_card_fill,
    .connect = tcp_connect,
    .disconnect = tcp_disconnect,
    .eager_limit = tcp_eager_limit,
    .ctrl_send = tcp_ctrl_send,
    .progress = tcp_progress,
    .rndv_get = NULL,
    .rndv_expect = tcp_rndv_expect,
    .rndv_push = tcp_rndv_push,
    .abort_pipe = tcp_abort_pipe,
    .busy = tcp_busy,
    .sleep = tcp_sleep,
};
