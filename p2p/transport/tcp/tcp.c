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
 * Set-up is lazy. create opens the listening socket before the rank cards
 * are exchanged and it stays open until destroy; connect only allocates
 * per-peer bookkeeping. A pair's sockets (1 control + WEFT_TCP_STREAMS data)
 * are made at the pair's first message, from either side: ctrl_send (or
 * rndv_expect/rndv_push) to a peer that is not up starts non-blocking
 * connects, and progress accepts, advances the handshakes of both
 * directions and flips the peer up once all its sockets are in. A pair
 * that never talks never opens a socket. Every new connection starts with a
 * hello whose job token (from the rank card's header) the acceptor checks
 * before it reads anything else (tcp_hello.h); the acceptor answers with
 * the connector's token and a verdict. Connections that fail to present a
 * hello in time are closed and counted, and a bounded number of them may
 * wait at once (tcp_listen.h).
 *
 * Frames go out before the pair is up: a rank that made a control
 * connection of its own sends all its frames to that peer on it, from
 * right after its hello on (ctrl_early_fd, ctrl_tx_fd), so a first send
 * reaches the peer's kernel at once and completes, as it did with
 * connections made at create, even if the sender stops calling weft right
 * after (an eager send, then a wait in MPI); an accepting rank sends on the
 * accepted control socket once its ACCEPT is out. The peer reads them as
 * soon as that socket is in, before the pair is up (ctrl_rx_fd), so a peer
 * that stops calling weft right after its send is still heard. Until then
 * ctrl_send answers WEFT_EAGAIN (the pipe
 * queues the frame and retries, in order); rndv_expect/rndv_push keep the
 * transfer, which starts once the peer is up (data sockets only carry data
 * then).
 *
 * Both ranks of a pair may start at once. The tie-break keeps the data
 * sockets of the lower rank's set: the lower rank answers a hello of the
 * higher one with COLLIDE while its own set is under way (or won), and the
 * higher rank, on a COLLIDE or on a hello from the lower rank, gives up its
 * own data sockets (they wait for their COLLIDE and are closed quietly) and
 * accepts the lower rank's set. Its own control socket is kept by both
 * sides, since it may carry the higher rank's frames already: it stays the
 * higher rank's sending channel and the lower rank reads the higher rank's
 * frames there (extra_fd); the peer's frames come on exactly one socket, so
 * each direction stays in order. A rank that has answered ACCEPT to a hello
 * of a peer never starts a set of its own to that peer, so the verdicts a
 * set gets are all equal and one set of data sockets survives. Data never
 * goes on a socket the other side drops.
 *
 * A failed connection (refused, reset, hello turned down) fails the peer
 * through the peer_failed upcall, with an error that names it, its address
 * and why; so does one not up within twice
 * WEFT_TIMEOUT (WEFT_WAIT_TCP_CONNECT) (a request waiting on it fails after WEFT_TIMEOUT already,
 * p2p/health.c).
 *
 * Every function here but sleep runs under the pipe layer's lock
 * (transport.h), so per-comm state needs no locking of its own. Nothing
 * blocks. sleep polls the listener and the sockets of peers that are up
 * (descriptors and events published atomically by progress), and naps at
 * most TCP_HANDSHAKE_NAP_MS while any handshake is under way, since
 * handshake sockets come and go and are not in its poll set.
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
#include "deadline.h"

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

/* Longest sleep while a handshake is under way: its sockets are not in
 * sleep's poll set, so a waiter looks again this often. Handshakes last a
 * round trip or two, so the naps are few. */
#define TCP_HANDSHAKE_NAP_MS 2

/* Abandoned sockets (the losing set of a collision) wait for the peer's
 * COLLIDE answer at most WEFT_KEEP_TCP_ABANDONED (src/core/deadline.c), and
 * a connection not up within WEFT_WAIT_TCP_CONNECT fails its peer (the why
 * of its factor is written there). */

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

/* Where a pair's connection stands (tcp_peer.state). */
enum {
    PEER_IDLE = 0,  /* no socket, nothing under way */
    PEER_OUT,       /* my set of sockets is being connected */
    PEER_IN,        /* the peer's set is arriving (I answered ACCEPT, or it won a collision) */
    PEER_UP,        /* every socket in: frames and data flow */
    PEER_FAILED     /* closed for good (failed or aborted) */
};

struct tcp_peer {
    int                   rank;
    int                   used;      /* the pipe to this rank uses tcp */
    int                   state;     /* PEER_* */
    int                   up;        /* state == PEER_UP (the data path tests this) */
    int                   mine;      /* the set in use (or under way) was started by this rank */
    int                   mine_ctrl; /* this rank made a control connection of its own: its frames go there */
    int                   notify;    /* failed: the peer_failed upcall still owed, with this code (0: none) */
    int                   kick;      /* work was queued since the last progress pass */
    double                since;     /* when the connection was started (weft_now) */
    char                  where[64]; /* "a.b.c.d:port" of the peer's listener */

    int                   ctrl_fd;
    int                   extra_fd;  /* after a collision: the higher rank's own control socket (below) */
    int                   extra_tx;  /* 1: extra_fd carries my frames (higher rank); 0: the peer's (lower) */
    unsigned char        *out;       /* unsent control bytes: out[out_off..out_len) */
    size_t                out_off, out_len, out_cap;
    unsigned char        *in;        /* received control bytes not yet parsed (allocated when up) */
    size_t                in_len, in_cap;

    struct tcp_data_sock *data;      /* [streams] */
    struct weft_queue     push;      /* my pushes, in rndv_push order (tcp_xfer.node) */
    struct weft_queue     expect;    /* receives to fill, in rndv_expect order */

    size_t                pfd_base;  /* index of ctrl_fd in the progress poll array */
    int                   polled;    /* pfd_base is valid for this progress pass */
    size_t                sleep_base;/* index of ctrl_fd in sleep_fds (then data sockets, then extra_fd) */
};

/* A connection in the middle of its handshake. */
struct tcp_conn {
    int                   fd;
    int                   outgoing;   /* 1: I connected to peer; 0: accepted */
    int                   abandoned;  /* outgoing, of my set that lost a collision: closed once answered */
    int                   stage;      /* see conn_step */
    int                   peer;       /* outgoing: known; incoming: from the hello (-1 before) */
    int                   index;      /* 0 = control, 1..streams = data */
    size_t                done;       /* bytes moved in the current stage */
    double                deadline;   /* incoming: hello (and answer) due; abandoned: given up (weft_now) */
    struct weft_tcp_hello hello;
    struct weft_tcp_ack   ack;
    char                  where[64];  /* remote address, for messages */
};

/* Every handshake under way: outgoing and incoming, in the order they
 * began (so the first pending incoming one is the oldest). Entries whose
 * fd is -1 are finished and compacted away. */
struct tcp_handshakes {
    struct tcp_conn *v;
    size_t           n, cap;
    double           accept_rest_until; /* listener left alone until then (weft_now) */
    int              short_logged;      /* the out-of-descriptors warning was given */
};

struct tcp_state {
    const struct weft_tp_env *env;   /* core, cards, upcalls: valid until destroy */
    int                 rank;        /* this rank (logging in destroy, which may not touch env) */
    int                 size;        /* ranks of the comm (peers[]) */
    int                 listen_fd;   /* open from create to destroy (closed at connect if no peer uses tcp) */
    struct sockaddr_in  listen_addr;
    unsigned            streams;
    uint64_t            chunk;
    size_t              eager_limit;
    struct tcp_peer    *peers;       /* [size] */
    int                *active;      /* ranks of the peers that use tcp */
    int                 nactive;
    int                 nconnecting; /* peers in PEER_OUT or PEER_IN */
    int                 notify_pending; /* some peer's failure upcall is owed */
    struct tcp_handshakes hs;
    struct pollfd      *pfds;        /* progress poll array */
    size_t              pfds_cap;
    struct weft_tcp_listen_stats listen; /* what the listener met over the comm's life (tcp_listen.h) */

    /* What sleep polls. It runs without the lock, so it reads only these:
     * the listener (fixed from connect to destroy) with its events, and per
     * peer socket a descriptor and its poll events, both published
     * atomically by progress (events 0: skip). */
    atomic_int          listen_events; /* POLLIN, or 0 while the listener rests */
    atomic_int          handshaking;   /* 1 while a handshake is under way: nap briefly */
    atomic_int         *sleep_fds;     /* [nactive * (1 + streams)] */
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

static int *peer_slot(struct tcp_peer *pe, int index)
{
    return index == 0 ? &pe->ctrl_fd : &pe->data[index - 1].fd;
}

/* Per peer, the progress poll array and sleep's arrays hold the control
 * socket, the data sockets, then extra_fd. */
static size_t peer_nfds(const struct tcp_state *st)
{
    return 2 + (size_t)st->streams;
}

/* Tells sleep which descriptors to poll for pe and for which events:
 * input always, output where bytes are waiting to go, nothing unless the
 * peer is up. */
static void publish_sleep_events(struct tcp_state *st, const struct tcp_peer *pe)
{
    if (st->sleep_events == NULL)
        return;
    atomic_int *ev = &st->sleep_events[pe->sleep_base];
    atomic_int *fd = &st->sleep_fds[pe->sleep_base];
    for (unsigned s = 0; s <= st->streams; s++) {
        int sock = s == 0 ? pe->ctrl_fd : pe->data[s - 1].fd;
        int out = s == 0 ? pe->out_len > pe->out_off : pe->data[s - 1].send_cur != NULL;
        if (s == 0 && pe->extra_fd >= 0 && pe->extra_tx)
            out = 0;   /* my frames go on extra_fd */
        if (pe->up) {
            /* Descriptor first: sleep skips entries whose events are 0. */
            atomic_store_explicit(&fd[s], sock, memory_order_relaxed);
            atomic_store_explicit(&ev[s], POLLIN | (out ? POLLOUT : 0), memory_order_release);
        } else {
            atomic_store_explicit(&ev[s], 0, memory_order_release);
        }
    }
    const size_t x = 1 + st->streams;
    if (pe->up && pe->extra_fd >= 0) {
        int out = pe->extra_tx && pe->out_len > pe->out_off;
        atomic_store_explicit(&fd[x], pe->extra_fd, memory_order_relaxed);
        atomic_store_explicit(&ev[x], pe->extra_tx ? (out ? POLLOUT : 0) : POLLIN, memory_order_release);
    } else {
        atomic_store_explicit(&ev[x], 0, memory_order_release);
    }
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
    st->rank = core->rank;
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
    /* A deep backlog lets many peers connect while this rank is busy
     * elsewhere (1 + streams connections per peer): the kernel completes
     * them and the next progress pass accepts them. */
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

/* ---------------------------------------------------------- handshakes -- */

enum { CONN_CONNECTING = 0, CONN_SEND_HELLO, CONN_READ_ACK,   /* outgoing */
       CONN_READ_HELLO, CONN_SEND_ACK,                         /* incoming */
       CONN_DONE, CONN_DROPPED };

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

/* Closes a handshake connection without a word: the losing set of a
 * collision, or a peer's connection when that peer is closed. */
static void conn_close(struct tcp_conn *k)
{
    if (k->fd >= 0)
        close(k->fd);
    k->fd = -1;
    k->stage = CONN_DROPPED;
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
    WEFT_WARN(st->rank, "tcp: rejected connection from %s: %s", k->where, why);
    (*reason)++;
    conn_close(k);
}

static void peer_set_state(struct tcp_state *st, struct tcp_peer *pe, int state)
{
    int was = pe->state == PEER_OUT || pe->state == PEER_IN;
    int is = state == PEER_OUT || state == PEER_IN;
    st->nconnecting += is - was;
    pe->state = state;
    pe->up = state == PEER_UP;
}

/* Closes every handshake connection of peer (outgoing, and incoming ones
 * that named it); incoming ones count as unfinished. */
static void hs_close_peer(struct tcp_state *st, int peer)
{
    for (size_t i = 0; i < st->hs.n; i++) {
        struct tcp_conn *k = &st->hs.v[i];
        if (k->fd < 0 || k->peer != peer)
            continue;
        if (!k->outgoing)
            st->listen.unfinished++;
        conn_close(k);
    }
}

static void peer_close_sockets(struct tcp_peer *pe, unsigned streams)
{
    if (pe->ctrl_fd >= 0) {
        close(pe->ctrl_fd);
        pe->ctrl_fd = -1;
    }
    if (pe->extra_fd >= 0) {
        close(pe->extra_fd);
        pe->extra_fd = -1;
    }
    for (unsigned s = 0; pe->data != NULL && s < streams; s++) {
        if (pe->data[s].fd >= 0) {
            close(pe->data[s].fd);
            pe->data[s].fd = -1;
        }
    }
}

/* Closes every socket of pe, finished or handshaking, for good, and stops
 * sleep from polling them. */
static void peer_down(struct tcp_state *st, struct tcp_peer *pe)
{
    hs_close_peer(st, pe->rank);   /* abandoned sockets of a lost collision too */
    peer_set_state(st, pe, PEER_FAILED);
    publish_sleep_events(st, pe);
    peer_close_sockets(pe, st->streams);
}

/* The connection to pe could not be made: record why (naming the peer and
 * its address), close everything of it, and owe the pipe a peer_failed
 * upcall, made by progress once it is done with its handshake lists. */
static void peer_conn_fail(struct tcp_state *st, struct tcp_peer *pe, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void peer_conn_fail(struct tcp_state *st, struct tcp_peer *pe, int code, const char *fmt, ...)
{
    char why[320];
    va_list ap;
    if (pe->state == PEER_FAILED)
        return;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    weft_set_error(st->env->core, code, "tcp: peer %d (%s): %s", pe->rank, pe->where, why);
    peer_down(st, pe);
    pe->notify = code;
    st->notify_pending = 1;
    atomic_store_explicit(&st->handshaking, 1, memory_order_relaxed);   /* the next pass reports it */
}

/* Makes the owed peer_failed upcalls. They may re-enter (ctrl_send to other
 * peers starts connections), so this runs outside every list walk. */
static int deliver_failures(struct tcp_state *st)
{
    int events = 0;
    if (!st->notify_pending)
        return 0;
    st->notify_pending = 0;
    for (int i = 0; i < st->nactive; i++) {
        struct tcp_peer *pe = &st->peers[st->active[i]];
        if (!pe->notify)
            continue;
        int code = pe->notify;
        pe->notify = 0;
        st->env->up->peer_failed(st->env->up->arg, pe->rank, code);
        events++;
    }
    return events;
}

/* A slot in the handshake list (zeroed, fd -1), or NULL without memory.
 * The list may move: callers hold indices, not pointers, across this. */
static struct tcp_conn *hs_add(struct tcp_state *st)
{
    struct tcp_handshakes *hs = &st->hs;
    if (hs->n == hs->cap) {
        size_t ncap = hs->cap * 2 + 8;
        struct tcp_conn *grown = realloc(hs->v, ncap * sizeof(*hs->v));
        if (grown == NULL)
            return NULL;
        hs->v = grown;
        hs->cap = ncap;
    }
    struct tcp_conn *k = &hs->v[hs->n++];
    memset(k, 0, sizeof(*k));
    k->fd = -1;
    k->peer = -1;
    return k;
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

/* Whether every socket slot of pe holds a connection. */
static int peer_slots_full(const struct tcp_state *st, const struct tcp_peer *pe)
{
    if (pe->ctrl_fd < 0)
        return 0;
    for (unsigned s = 0; s < st->streams; s++)
        if (pe->data[s].fd < 0)
            return 0;
    return 1;
}

/* Every socket of pe is in: frames may flow. */
static void peer_up(struct tcp_state *st, struct tcp_peer *pe)
{
    if (pe->in == NULL) {
        /* Room for one largest frame: the pipe's header and payload. Made
         * only now, so that peers that never talk cost no buffer. */
        pe->in_cap = sizeof(struct tcp_frame) + WEFT_TP_CTRL_HDR_MAX + ctrl_payload_max(st) + TCP_CTRL_IN_SLACK;
        pe->in = malloc(pe->in_cap);
        if (pe->in == NULL) {
            peer_conn_fail(st, pe, WEFT_ERR_NO_MEMORY, "out of memory for the control buffer");
            return;
        }
    }
    peer_set_state(st, pe, PEER_UP);
    pe->kick = 1;   /* pushes and receives queued while connecting start now */
    publish_sleep_events(st, pe);
    WEFT_INFO(st->rank, "tcp: connected to peer %d at %s (1 control + %u data sockets, %s) after %.3f s",
              pe->rank, pe->where, st->streams, pe->mine ? "connected from here" : "accepted",
              weft_now() - pe->since);
}

/* My set of sockets to pe lost a collision: its connections finish their
 * handshake as abandoned ones (closed quietly once the peer answers), and
 * the peer's set is awaited instead. */
static void peer_abandon_own(struct tcp_state *st, struct tcp_peer *pe)
{
    double now = weft_now();
    double wait = weft_housekeeping_bound(&st->env->core->cfg, WEFT_KEEP_TCP_ABANDONED);
    for (size_t i = 0; i < st->hs.n; i++) {
        struct tcp_conn *k = &st->hs.v[i];
        /* Not the control connection: my frames may be on it already, and
         * it stays my sending channel (it gets COLLIDE and is kept). */
        if (k->fd >= 0 && k->outgoing && k->peer == pe->rank && !k->abandoned && k->index != 0) {
            k->abandoned = 1;
            k->deadline = now + wait;
        }
    }
    pe->mine = 0;
    peer_set_state(st, pe, PEER_IN);
}

/* The lower rank's hello while my own set is under way, or a COLLIDE for
 * it: only possible before any of my sockets was accepted (the peer never
 * accepts a set and starts one). A filled slot means the peer broke that
 * rule. */
static int peer_switch_to_theirs(struct tcp_state *st, struct tcp_peer *pe)
{
    for (unsigned s = 0; s <= st->streams; s++) {
        if (*peer_slot(pe, (int)s) >= 0) {
            peer_conn_fail(st, pe, WEFT_ERR_TRANSPORT,
                           "both ranks connected at once and the peer accepted part of this rank's"
                           " sockets before turning the rest down (protocol error)");
            return 0;
        }
    }
    peer_abandon_own(st, pe);
    return 1;
}

/* Decides a hello that passed its checks: k names peer k->hello.rank.
 * Rejects it (returns 0) or sets the verdict to send. The lower rank's set
 * wins a collision (see the top of this file). */
static int hello_decide(struct tcp_state *st, struct tcp_conn *k)
{
    const int p = k->hello.rank;
    struct tcp_peer *pe = &st->peers[p];
    if (!pe->used) {
        conn_reject(st, k, &st->listen.bad_hello, "rank %d is not a tcp peer of this rank", p);
        return 0;
    }
    if (pe->state == PEER_FAILED) {
        conn_reject(st, k, &st->listen.bad_hello, "the connection to rank %d has already failed or was closed", p);
        return 0;
    }
    uint8_t verdict;
    if (st->rank < p && (pe->state == PEER_OUT || (pe->state == PEER_UP && pe->mine))) {
        verdict = WEFT_TCP_ACK_COLLIDE;   /* my set wins: the higher rank drops its own */
    } else if (pe->state == PEER_UP || *peer_slot(pe, k->hello.index) >= 0) {
        conn_reject(st, k, &st->listen.duplicate, "rank %d already connected socket %d", p, (int)k->hello.index);
        return 0;
    } else {
        if (pe->state == PEER_OUT && !peer_switch_to_theirs(st, pe)) {
            conn_close(k);
            st->listen.unfinished++;
            return 0;
        }
        if (pe->state == PEER_IDLE) {
            pe->since = weft_now();
            pe->mine = 0;
        }
        peer_set_state(st, pe, PEER_IN);
        verdict = WEFT_TCP_ACK_ACCEPT;
    }
    k->peer = p;
    k->index = k->hello.index;
    memset(&k->ack, 0, sizeof(k->ack));
    k->ack.token = weft_tp_card(&st->env->cards, p)->token;
    k->ack.verdict = verdict;
    return 1;
}

/* Advances one handshake as far as it goes now. An outgoing connection
 * that fails returns WEFT_ERR_TRANSPORT with why set (the caller decides
 * what that costs); incoming connections that fail a check are rejected
 * (conn_reject): a stranger or a stale process must not stop the job. */
static int conn_step(struct tcp_state *st, struct tcp_conn *k, char *why, size_t whylen)
{
    const struct weft_tp_env *env = st->env;
    const uint64_t my_token = weft_tp_card(&env->cards, st->rank)->token;
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
            if (err != 0) {
                snprintf(why, whylen, "connecting failed: %s", strerror(err));
                return WEFT_ERR_TRANSPORT;
            }
            k->stage = CONN_SEND_HELLO;
            k->done = 0;
            break;
        }
        case CONN_SEND_HELLO: {
            int r = conn_send(k, &k->hello, sizeof(k->hello));
            if (r < 0) {
                snprintf(why, whylen, "sending the hello failed: %s", strerror(errno));
                return WEFT_ERR_TRANSPORT;
            }
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
            if (n <= 0) {
                snprintf(why, whylen,
                         "the peer closed the connection instead of answering the hello (%s): is it a"
                         " rank of this job with the same WEFT_TCP_* settings?",
                         n == 0 ? "closed" : strerror(errno));
                return WEFT_ERR_TRANSPORT;
            }
            k->done += (size_t)n;
            if (k->done < sizeof(k->ack))
                return WEFT_SUCCESS;
            if (k->ack.token != my_token) {
                snprintf(why, whylen, "the process there answered with a wrong job token: it is not this peer");
                return WEFT_ERR_TRANSPORT;
            }
            if (k->ack.verdict != WEFT_TCP_ACK_ACCEPT && k->ack.verdict != WEFT_TCP_ACK_COLLIDE) {
                snprintf(why, whylen, "the hello was answered with an unknown verdict %u", (unsigned)k->ack.verdict);
                return WEFT_ERR_TRANSPORT;
            }
            k->stage = CONN_DONE;
            return WEFT_SUCCESS;
        }
        case CONN_READ_HELLO: {
            int r = weft_tcp_hello_recv(k->fd, &k->hello, &k->done, my_token, why, whylen);
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
            r = weft_tcp_hello_check(&k->hello, st->rank, st->size, st->streams, st->chunk,
                                     (uint32_t)st->eager_limit, why, whylen);
            if (r != WEFT_SUCCESS) {
                conn_reject(st, k, &st->listen.bad_hello, "%s", why);
                return WEFT_SUCCESS;
            }
            if (!hello_decide(st, k))
                return WEFT_SUCCESS;
            k->stage = CONN_SEND_ACK;
            k->done = 0;
            break;
        }
        case CONN_SEND_ACK: {
            int r = conn_send(k, &k->ack, sizeof(k->ack));
            if (r < 0) {
                int e = errno;
                if (k->ack.verdict == WEFT_TCP_ACK_COLLIDE) {
                    /* The loser may close its abandoned sockets first. */
                    st->listen.collided++;
                    conn_close(k);
                } else {
                    conn_reject(st, k, &st->listen.closed, "answering rank %d failed: %s", k->peer, strerror(e));
                }
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

/* Opens a non-blocking connection to peer's listener and prepares its
 * hello. On failure why says what happened (k->fd stays -1). */
static int conn_open(struct tcp_state *st, int peer, int index, struct tcp_conn *k, char *why, size_t whylen)
{
    const struct tcp_card card = card_of(&st->env->cards, peer);
    struct sockaddr_in sa;

    k->outgoing = 1;
    k->peer = peer;
    k->index = index;
    card_sockaddr(&card, &sa);
    format_addr(&sa, k->where, sizeof(k->where));
    if (card.family != AF_INET) {
        snprintf(why, whylen, "offers no IPv4 listener (family %u)", (unsigned)card.family);
        return WEFT_ERR_TRANSPORT;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, whylen, "socket() failed: %s%s", strerror(errno), fd_limit_hint(errno));
        return WEFT_ERR_TRANSPORT;
    }
    tune_socket(fd);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        snprintf(why, whylen, "connecting failed: %s", strerror(e));
        return WEFT_ERR_TRANSPORT;
    }
    k->fd = fd;
    k->stage = CONN_CONNECTING;
    k->hello.token = weft_tp_card(&st->env->cards, peer)->token;
    k->hello.rank = st->rank;
    k->hello.index = index;
    k->hello.streams = st->streams;
    k->hello.chunk = st->chunk;
    k->hello.eager_limit = (uint32_t)st->eager_limit;
    return WEFT_SUCCESS;
}

/* Starts my set of sockets to an idle peer (first message to it). Called
 * from ctrl_send, rndv_expect and rndv_push. A failure (a refused connect
 * shows here on loopback) is reported like one seen later: through the
 * peer_failed upcall at the next progress pass, never from inside the
 * caller's send, so the pipe layer learns of a lost peer the same way
 * whenever it is found out (p2p/health.c then tells a dead peer from a
 * broken link). */
static void peer_start(struct tcp_state *st, struct tcp_peer *pe)
{
    char why[256];
    pe->since = weft_now();
    pe->mine = 1;
    pe->mine_ctrl = 1;
    peer_set_state(st, pe, PEER_OUT);
    for (unsigned i = 0; i <= st->streams; i++) {
        struct tcp_conn *k = hs_add(st);
        if (k == NULL) {
            snprintf(why, sizeof(why), "out of memory for a connection");
            goto fail;
        }
        if (conn_open(st, pe->rank, (int)i, k, why, sizeof(why)) != WEFT_SUCCESS) {
            st->hs.n--;   /* the slot just taken holds no descriptor */
            goto fail;
        }
        /* Loopback connects often complete at once: take the hello now. */
        char why2[256];
        if (conn_step(st, k, why2, sizeof(why2)) != WEFT_SUCCESS) {
            snprintf(why, sizeof(why), "%s", why2);
            goto fail;
        }
    }
    atomic_store_explicit(&st->handshaking, 1, memory_order_relaxed);
    return;

fail:
    peer_conn_fail(st, pe, WEFT_ERR_TRANSPORT, "%s", why);
}

/* Whether pe can take work now: WEFT_SUCCESS when up, WEFT_EAGAIN while
 * its connection is under way (started here if it was idle) or its failure
 * is still to be reported (the upcall comes at the next progress pass), an
 * error once it failed. */
static int peer_want(struct tcp_state *st, struct tcp_peer *pe)
{
    switch (pe->state) {
    case PEER_UP:
        return WEFT_SUCCESS;
    case PEER_FAILED:
        if (pe->notify)
            return WEFT_EAGAIN;
        return weft_set_error(st->env->core, WEFT_ERR_TRANSPORT, "tcp: peer %d (%s): connection is down",
                              pe->rank, pe->where);
    case PEER_IDLE:
        peer_start(st, pe);
        return WEFT_EAGAIN;
    default:
        return WEFT_EAGAIN;
    }
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

/* One step of handshake i, then its bookkeeping: a finished connection
 * moves into its peer's socket slot, and the peer is up once all are in.
 * Failures of my own connections fail the peer (peer_conn_fail). Returns
 * 1 when a peer came up or failed. */
static int conn_advance(struct tcp_state *st, size_t i)
{
    struct tcp_conn *k = &st->hs.v[i];
    char why[256];
    if (conn_step(st, k, why, sizeof(why)) != WEFT_SUCCESS) {
        if (k->abandoned) {
            conn_close(k);   /* the peer may close the losing set first */
            return 0;
        }
        peer_conn_fail(st, &st->peers[k->peer], WEFT_ERR_TRANSPORT, "%s", why);
        return 1;
    }
    if (k->stage != CONN_DONE || k->fd < 0)
        return 0;
    struct tcp_peer *pe = &st->peers[k->peer];
    int *slot = peer_slot(pe, k->index);
    if (k->outgoing) {
        if (k->abandoned) {
            conn_close(k);
            return 0;
        }
        if (k->ack.verdict == WEFT_TCP_ACK_COLLIDE) {
            if (k->index == 0 && st->rank > pe->rank && pe->extra_fd < 0) {
                /* My control socket lost, but it carries my frames from
                 * the first one on: it stays my sending channel, and the
                 * peer reads it (extra_fd). */
                pe->extra_fd = k->fd;
                pe->extra_tx = 1;
                k->fd = -1;
                k->stage = CONN_DONE;
            } else {
                conn_close(k);
            }
            if (st->rank < pe->rank) {
                peer_conn_fail(st, pe, WEFT_ERR_TRANSPORT,
                               "the higher rank turned down this (lower) rank's connection in a collision"
                               " (protocol error)");
                return 1;
            }
            if (pe->state == PEER_OUT)
                return peer_switch_to_theirs(st, pe) ? 0 : 1;
            return 0;
        }
        if (pe->state != PEER_OUT || *slot >= 0) {
            conn_close(k);
            peer_conn_fail(st, pe, WEFT_ERR_TRANSPORT, "socket %d was accepted twice (protocol error)", k->index);
            return 1;
        }
    } else {
        if (k->ack.verdict == WEFT_TCP_ACK_COLLIDE) {
            st->listen.collided++;
            if (k->index == 0 && pe->extra_fd < 0 && pe->state != PEER_FAILED) {
                /* The higher rank's control socket: its frames come on it
                 * (it never sends on ours once it made its own). */
                pe->extra_fd = k->fd;
                pe->extra_tx = 0;
                k->fd = -1;
                k->stage = CONN_DONE;
                publish_sleep_events(st, pe);
                pe->kick = 1;
            } else {
                conn_close(k);
            }
            return 0;
        }
        if (pe->state != PEER_IN || *slot >= 0) {
            /* Two connections for one socket passed the hello check before
             * either finished; the first one keeps the slot. */
            conn_reject(st, k, &st->listen.duplicate, "rank %d already connected socket %d", k->peer, k->index);
            return 0;
        }
        st->listen.peers++;
    }
    *slot = k->fd;   /* the peer's socket slot now owns the descriptor */
    k->fd = -1;
    k->stage = CONN_DONE;
    if (!peer_slots_full(st, pe))
        return 0;
    peer_up(st, pe);
    return 1;
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
 * not stop the ranks' own connections from getting in: close the oldest
 * unidentified connection and try again, or, with none, leave the
 * listener alone for a moment (the backlog keeps what arrives).
 * Returns 1 to accept again, 0 to stop for now. */
static int accept_short(struct tcp_state *st, int e)
{
    struct tcp_handshakes *hs = &st->hs;
    st->listen.accept_short++;
    if (!hs->short_logged) {
        hs->short_logged = 1;
        WEFT_WARN(st->rank,
                  "tcp: accepting on the listener failed: %s%s; closing connections that have sent no"
                  " hello to make room (logged once per comm)",
                  strerror(e), fd_limit_hint(e));
    }
    struct tcp_conn *old = oldest_pending(hs);
    if (old != NULL) {
        conn_reject(st, old, &st->listen.fd_evicted,
                    "closed before a complete hello to free a descriptor (accept: %s)", strerror(e));
        return 1;
    }
    hs->accept_rest_until = weft_now() + TCP_ACCEPT_BACKOFF_MS / 1000.0;
    atomic_store_explicit(&st->listen_events, 0, memory_order_relaxed);
    return 0;
}

/* Accepts whatever is waiting on the listener as new incoming handshakes,
 * keeping at most TCP_PENDING_MAX of them waiting for a hello. Returns the
 * number of peers that came up or failed. */
static int accept_pending(struct tcp_state *st)
{
    struct tcp_handshakes *hs = &st->hs;
    int events = 0;
    for (;;) {
        struct sockaddr_in sa;
        socklen_t alen = sizeof(sa);
        int fd = accept4(st->listen_fd, (struct sockaddr *)&sa, &alen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (accept_error_is_transient(e))
                continue;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return events;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                if (accept_short(st, e))
                    continue;
                return events;
            }
            /* The listener itself is broken: say so once, and rest (the
             * peers that wait for this rank fail by their WEFT_TIMEOUT). */
            WEFT_WARN(st->rank, "tcp: accept failed: %s%s", strerror(e), fd_limit_hint(e));
            hs->accept_rest_until = weft_now() + TCP_ACCEPT_BACKOFF_MS / 1000.0;
            atomic_store_explicit(&st->listen_events, 0, memory_order_relaxed);
            return events;
        }
        if (hs->n == hs->cap)
            hs_compact(hs);
        struct tcp_conn *k = hs_add(st);
        if (k == NULL) {
            close(fd);
            WEFT_WARN(st->rank, "tcp: out of memory accepting a connection: closed it");
            return events;
        }
        k->fd = fd;
        k->stage = CONN_READ_HELLO;
        k->deadline = weft_now() + TCP_HELLO_DEADLINE_S;
        format_addr(&sa, k->where, sizeof(k->where));
        tune_socket(fd);
        st->listen.accepted++;
        atomic_store_explicit(&st->handshaking, 1, memory_order_relaxed);
        /* A rank's hello is normally queued before we accept: take it now,
         * so that only connections that really are silent count as pending
         * and the cap below never closes a rank's connection. */
        events += conn_advance(st, hs->n - 1);
        size_t pending = count_pending(hs);
        for (; pending > TCP_PENDING_MAX; pending--)
            conn_reject(st, oldest_pending(hs), &st->listen.evicted,
                        "closed before a complete hello: more than %d connections were waiting for one",
                        TCP_PENDING_MAX);
        if (pending > st->listen.pending_max)
            st->listen.pending_max = pending;
    }
}

/* Rejects incoming connections whose hello (or our answer) is overdue,
 * closes abandoned ones nobody answered, and fails peers whose connection
 * is not up within twice WEFT_TIMEOUT (WEFT_WAIT_TCP_CONNECT). Returns the
 * number of peers failed. */
static int hs_expire(struct tcp_state *st, double now)
{
    struct tcp_handshakes *hs = &st->hs;
    int events = 0;
    for (size_t i = 0; i < hs->n; i++) {
        struct tcp_conn *k = &hs->v[i];
        if (k->fd < 0 || now < k->deadline)
            continue;
        if (k->outgoing) {
            if (k->abandoned)
                conn_close(k);
        } else if (k->stage == CONN_READ_HELLO) {
            conn_reject(st, k, &st->listen.timed_out,
                        "no complete hello within %.0f s of accept (%zu of %zu bytes came)",
                        TCP_HELLO_DEADLINE_S, k->done, sizeof(k->hello));
        } else if (k->stage == CONN_SEND_ACK) {
            conn_reject(st, k, &st->listen.timed_out,
                        "the answer to rank %d could not be sent within %.0f s of accept",
                        k->peer, TCP_HELLO_DEADLINE_S);
        }
    }
    const double timeout = weft_wait_bound(&st->env->core->cfg, WEFT_WAIT_TCP_CONNECT);
    if (timeout <= 0 || st->nconnecting == 0)
        return 0;
    for (int i = 0; i < st->nactive; i++) {
        struct tcp_peer *pe = &st->peers[st->active[i]];
        if ((pe->state != PEER_OUT && pe->state != PEER_IN) || now - pe->since < timeout)
            continue;
        peer_conn_fail(st, pe, WEFT_ERR_TIMEOUT, "no connection after %g s (%g x WEFT_TIMEOUT)%s%s", timeout,
                       timeout / weft_timeout_setting(&st->env->core->cfg),
                       pe->state == PEER_OUT ? ": it did not answer this rank's hello"
                                             : ": its sockets did not all arrive",
                       st->listen.accept_short > 0 ? "; accepting ran out of descriptors: raise `ulimit -n`" : "");
        events++;
    }
    return events;
}

/* Closes every handshake still open at destroy: peers' connections
 * quietly, strangers' with a warning (as rejected, unfinished). */
static void hs_close_all(struct tcp_state *st)
{
    struct tcp_handshakes *hs = &st->hs;
    for (size_t i = 0; i < hs->n; i++) {
        struct tcp_conn *k = &hs->v[i];
        if (k->fd < 0)
            continue;
        if (k->outgoing) {
            conn_close(k);
        } else if (k->stage == CONN_READ_HELLO) {
            conn_reject(st, k, &st->listen.unfinished,
                        "still without a complete hello when this rank stopped listening (%zu of %zu bytes came)",
                        k->done, sizeof(k->hello));
        } else {
            st->listen.unfinished++;
            conn_close(k);
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

/* One line per comm (at destroy) on what the listener met, so that
 * rejections show up in an info log even where their warnings were
 * filtered out. */
static void log_listen_summary(const struct tcp_state *st)
{
    const struct weft_tcp_listen_stats *s = &st->listen;
    WEFT_INFO(st->rank,
              "tcp: listener accepted %zu connections: %zu ranks' sockets, %zu rejected (%zu wrong token,"
              " %zu bad hello, %zu duplicate, %zu closed early, %zu no hello within %.0f s,"
              " %zu over %d pending, %zu to free descriptors, %zu unfinished at the end),"
              " %zu turned down in a collision; at most %zu pending at once; accept short of descriptors"
              " %zu times",
              s->accepted, s->peers, weft_tcp_listen_rejected(s), s->bad_token, s->bad_hello, s->duplicate,
              s->closed, s->timed_out, TCP_HELLO_DEADLINE_S, s->evicted, TCP_PENDING_MAX, s->fd_evicted,
              s->unfinished, s->collided, s->pending_max, s->accept_short);
}

/* --------------------------------------------------------------- connect -- */

/* Only bookkeeping: sockets are made at each pair's first message. Takes
 * no part in any collective exchange (env->coll is never used), so a rank
 * without ctx returns at once. */
static int tcp_connect(const struct weft_tp_env *env, void *ctx)
{
    struct tcp_state *st = ctx;
    struct weft_core *core = env->core;
    int rc = WEFT_SUCCESS;

    if (st == NULL)
        return WEFT_SUCCESS;   /* tcp not offered by this rank: no pipe can use it */
    memset(&st->listen, 0, sizeof(st->listen));

    int ntcp = 0;
    for (int r = 0; r < core->size; r++)
        if (r != core->rank && env->uses != NULL && env->uses[r])
            ntcp++;
    if (ntcp == 0) {
        /* No pipe uses tcp: nobody may connect, so stop listening now. */
        close(st->listen_fd);
        st->listen_fd = -1;
        return WEFT_SUCCESS;
    }

    st->peers = calloc((size_t)core->size, sizeof(*st->peers));
    st->active = calloc((size_t)ntcp, sizeof(*st->active));
    if (st->peers != NULL)
        for (int r = 0; r < core->size; r++) {
            st->peers[r].rank = r;
            st->peers[r].ctrl_fd = -1;
            st->peers[r].extra_fd = -1;
            weft_queue_init(&st->peers[r].push);
            weft_queue_init(&st->peers[r].expect);
        }
    st->sleep_n = (size_t)ntcp * peer_nfds(st);
    st->sleep_fds = calloc(st->sleep_n, sizeof(*st->sleep_fds));
    st->sleep_events = calloc(st->sleep_n, sizeof(*st->sleep_events));
    if (st->peers == NULL || st->active == NULL || st->sleep_fds == NULL || st->sleep_events == NULL) {
        rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: out of memory for %d peers", ntcp);
        goto fail;
    }
    for (size_t i = 0; i < st->sleep_n; i++) {
        atomic_init(&st->sleep_fds[i], -1);
        atomic_init(&st->sleep_events[i], 0);
    }
    for (int r = 0; r < core->size; r++) {
        struct tcp_peer *pe = &st->peers[r];
        if (r == core->rank || !env->uses[r])
            continue;
        pe->used = 1;
        const struct tcp_card card = card_of(&env->cards, r);
        struct sockaddr_in sa;
        card_sockaddr(&card, &sa);
        format_addr(&sa, pe->where, sizeof(pe->where));
        pe->sleep_base = (size_t)st->nactive * peer_nfds(st);
        st->active[st->nactive++] = r;
        pe->data = calloc(st->streams, sizeof(*pe->data));
        if (pe->data == NULL) {
            rc = weft_set_error(core, WEFT_ERR_NO_MEMORY, "tcp: out of memory for peer %d", r);
            goto fail;
        }
        for (unsigned s = 0; s < st->streams; s++)
            pe->data[s].fd = -1;
    }
    atomic_store_explicit(&st->listen_events, POLLIN, memory_order_relaxed);
    return WEFT_SUCCESS;

fail:
    /* Closes the listener and frees what was made; ctx stays for destroy. */
    tcp_release(st);
    return rc;
}

/* ------------------------------------------------------------ teardown -- */

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
 * for destroy). Touches no env: destroy may run after the comm let go of
 * it (log lines use the rank saved at create). */
static void tcp_release(struct tcp_state *st)
{
    hs_close_all(st);
    if (st->nactive > 0)
        log_listen_summary(st);
    free(st->hs.v);
    memset(&st->hs, 0, sizeof(st->hs));
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
    st->nconnecting = 0;
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

/* The connection to pe failed while up: record why, close its sockets so
 * the peer notices too, and tell the pipe (which breaks and calls
 * abort_peer). err_no 0 means an orderly close by the peer. */
static void peer_fail(struct tcp_state *st, struct tcp_peer *pe, const char *what, int err_no)
{
    if (pe->state == PEER_FAILED || pe->state == PEER_IDLE)
        return;
    if (err_no == 0 && __atomic_load_n(&st->env->core->leaving, __ATOMIC_ACQUIRE))
        /* destroy's last exchange: the peer is done with the comm */
        WEFT_INFO(st->env->core->rank, "tcp: peer %d (%s) closed its connections: it has left the comm", pe->rank,
                  pe->where);
    else
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
     * connection cannot carry anything after this: close it (a handshake
     * under way too), and the peer's pipe breaks too instead of misreading
     * the next message. The pipe is broken already: no upcall is owed. */
    peer_down(st, pe);
    pe->notify = 0;   /* the pipe broke already: no upcall owed */
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
static int ctrl_flush_fd(struct tcp_peer *pe, int fd)
{
    int moved = 0;
    while (pe->out_off < pe->out_len) {
        ssize_t n = send(fd, pe->out + pe->out_off, pe->out_len - pe->out_off,
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


/* The control socket this rank may send frames on before the pair is up,
 * or -1. Only the lower rank has one, once its hello is out: its set always
 * wins (the higher rank accepts it even while its own is under way), so the
 * peer reads those frames once it is up. Frames written there reach the
 * peer's kernel at once, as on a connection made at create, so a send
 * completes without waiting for the peer, and the peer gets it even if
 * this rank stops calling weft right after (an eager send, then a wait in
 * MPI). The higher rank must wait for the verdict: its sends wait in the
 * pipe (WEFT_EAGAIN) and complete once the pair is up. */
static int ctrl_early_fd(const struct tcp_state *st, const struct tcp_peer *pe)
{
    if (pe->extra_fd >= 0 && pe->extra_tx)
        return pe->extra_fd;
    if (!pe->mine_ctrl)   /* accepted: the control socket is in once ACCEPT is out, and it survives */
        return pe->state == PEER_IN ? pe->ctrl_fd : -1;
    for (size_t i = 0; i < st->hs.n; i++) {
        const struct tcp_conn *k = &st->hs.v[i];
        if (k->fd >= 0 && k->outgoing && !k->abandoned && k->peer == pe->rank && k->index == 0 &&
            k->stage == CONN_READ_ACK)
            return k->fd;
    }
    return -1;
}

/* The socket my frames to pe go on: once this rank made a control
 * connection of its own, always that one (its frames may be on it from
 * before the pair was up); else the pair's control socket. -1: none yet. */
static int ctrl_tx_fd(const struct tcp_state *st, const struct tcp_peer *pe)
{
    if (pe->extra_fd >= 0 && pe->extra_tx)
        return pe->extra_fd;
    if (pe->mine_ctrl && pe->state == PEER_UP && !pe->mine)
        return ctrl_early_fd(st, pe);   /* still waiting for its COLLIDE */
    return pe->ctrl_fd;
}

/* Writes out pending control bytes on the socket my frames go on. */
static int ctrl_flush(struct tcp_state *st, struct tcp_peer *pe)
{
    int fd = ctrl_tx_fd(st, pe);
    if (fd < 0)
        return 0;
    return ctrl_flush_fd(pe, fd);
}

/* Writes what ctrl_send kept for a peer that is not up yet on its early
 * socket. Errors are left to the handshake, which sees them too. */
static int ctrl_flush_early(struct tcp_state *st, struct tcp_peer *pe)
{
    if (pe->out_len == pe->out_off)
        return 0;
    int fd = ctrl_early_fd(st, pe);
    if (fd < 0)
        return 0;
    int r = ctrl_flush_fd(pe, fd);
    return r > 0 ? r : 0;
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

    if (pe == NULL)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: peer %d: not a tcp peer of this rank", peer);
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

    if (!pe->up) {
        /* The first frame to this peer starts its connection. Until it is
         * up, WEFT_EAGAIN (the pipe queues the frame and every later one,
         * in order), except on the lower rank's early socket
         * (ctrl_early_fd), where the frame goes out as on an up
         * connection: what the socket does not take waits in the output
         * buffer, within the same bound. */
        int rc = peer_want(st, pe);
        if (rc != WEFT_EAGAIN)
            return rc;
        if (ctrl_early_fd(st, pe) < 0)
            return WEFT_EAGAIN;
        if (pe->out_len - pe->out_off + total > TCP_CTRL_OUT_BOUND)
            return WEFT_EAGAIN;
        if (ctrl_buffer(pe, iov, niov, 0) != WEFT_SUCCESS)
            return WEFT_EAGAIN;
        (void)ctrl_flush_early(st, pe);
        return WEFT_SUCCESS;
    }

    const int tx = ctrl_tx_fd(st, pe);
    if (tx < 0)
        return WEFT_EAGAIN;   /* my own control socket is still in its handshake */
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
            n = sendmsg(tx, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
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
    if (pending > 0 && ctrl_flush(st, pe) < 0) {
        int e = errno;
        weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: peer %d (%s): sending a control message: %s",
                       pe->rank, pe->where, strerror(e));
        peer_down(st, pe);
        return WEFT_ERR_TRANSPORT;
    }
    return WEFT_SUCCESS;
}

static int peer_alive(const struct tcp_peer *pe)
{
    return pe->state == PEER_OUT || pe->state == PEER_IN || pe->state == PEER_UP;
}

/* The socket the peer's frames come on, once it is in (also before the
 * pair is up: the peer may send as soon as its hello or its ACCEPT is
 * out), or -1. */
static int ctrl_rx_fd(const struct tcp_peer *pe)
{
    if (pe->extra_fd >= 0 && !pe->extra_tx)
        return pe->extra_fd;
    return pe->ctrl_fd;
}

/* Reads control bytes from fd (the pair's control socket, or the higher
 * rank's own one after a collision: the peer's frames come on exactly one
 * of them) and hands every complete frame to the pipe. */
static int ctrl_receive(struct tcp_state *st, struct tcp_peer *pe, int fd)
{
    const struct weft_tp_upcalls *up = st->env->up;
    const size_t frame_max = WEFT_TP_CTRL_HDR_MAX + ctrl_payload_max(st);
    int events = 0;
    if (pe->in == NULL) {
        /* Room for one largest frame: the pipe's header and payload. Made
         * only now, so that peers that never talk cost no buffer. */
        pe->in_cap = sizeof(struct tcp_frame) + WEFT_TP_CTRL_HDR_MAX + ctrl_payload_max(st) + TCP_CTRL_IN_SLACK;
        pe->in = malloc(pe->in_cap);
        if (pe->in == NULL) {
            peer_fail(st, pe, "out of memory for the control buffer", ENOMEM);
            return 0;
        }
    }
    for (int round = 0; round < 16 && peer_alive(pe); round++) {
        if (pe->in_len == pe->in_cap)
            break;   /* cannot happen: a parse pass leaves less than one frame */
        ssize_t n = recv(fd, pe->in + pe->in_len, pe->in_cap - pe->in_len, MSG_DONTWAIT);
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
        while (peer_alive(pe) && pe->in_len - pos >= sizeof(struct tcp_frame)) {
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
             * abort shows as a failed peer. */
            up->on_ctrl(up->arg, pe->rank, pe->in + pos + sizeof(f), f.len);
            pos += sizeof(f) + f.len;
            events++;
        }
        if (!peer_alive(pe))
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
 * receiver in the same (CTS) order, which is all the data sockets need.
 * Both follow a control frame, so the peer is normally up; if it is not
 * (yet), the transfer waits in its FIFO and starts when it is. */
static int tcp_rndv_expect(void *ctx, int peer, struct weft_tp_xfer *x, const struct weft_tp_src *src,
                           void *key, size_t *keylen)
{
    struct tcp_state *st = ctx;
    struct tcp_peer *pe = peer_of(st, peer);
    (void)src;
    (void)key;
    *keylen = 0;
    if (pe == NULL)
        return weft_set_error(st->env->core, WEFT_ERR_TRANSPORT, "tcp: peer %d: not a tcp peer of this rank", peer);
    int rc = peer_want(st, pe);
    if (rc != WEFT_SUCCESS && rc != WEFT_EAGAIN)
        return rc;
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
    if (pe == NULL)
        return weft_set_error(st->env->core, WEFT_ERR_TRANSPORT, "tcp: peer %d: not a tcp peer of this rank", peer);
    int rc = peer_want(st, pe);
    if (rc != WEFT_SUCCESS && rc != WEFT_EAGAIN)
        return rc;
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
    if (pe->up)
        publish_sleep_events(st, pe);
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

/* Fills st->pfds: the listener, every handshake (entry 1 + i for hs.v[i]),
 * then the sockets of every peer that is up. Returns the entry count, 0
 * without memory. */
static size_t build_pollfds(struct tcp_state *st, double now)
{
    size_t need = 1 + st->hs.n + (size_t)st->nactive * peer_nfds(st);
    if (st->pfds_cap < need) {
        struct pollfd *grown = realloc(st->pfds, need * sizeof(*grown));
        if (grown == NULL)
            return 0;
        st->pfds = grown;
        st->pfds_cap = need;
    }
    size_t n = 0;
    int rest = st->hs.accept_rest_until > 0 && now < st->hs.accept_rest_until;
    if (!rest && st->hs.accept_rest_until > 0) {
        st->hs.accept_rest_until = 0;
        atomic_store_explicit(&st->listen_events, POLLIN, memory_order_relaxed);
    }
    /* A negative fd is skipped by poll: the listener rests after accept
     * ran out of descriptors with nothing left to close. */
    st->pfds[n++] = (struct pollfd){ .fd = rest ? -1 : st->listen_fd, .events = POLLIN, .revents = 0 };
    for (size_t i = 0; i < st->hs.n; i++) {
        const struct tcp_conn *k = &st->hs.v[i];
        int live = k->fd >= 0 && k->stage != CONN_DONE && k->stage != CONN_DROPPED;
        st->pfds[n++] = (struct pollfd){ .fd = live ? k->fd : -1, .events = (short)conn_events(k), .revents = 0 };
    }
    for (int i = 0; i < st->nactive; i++) {
        struct tcp_peer *pe = &st->peers[st->active[i]];
        pe->polled = 0;
        if (!pe->up)
            continue;
        pe->polled = 1;
        pe->pfd_base = n;
        const int out = pe->out_len > pe->out_off;
        const int extra_out = pe->extra_fd >= 0 && pe->extra_tx;
        st->pfds[n].fd = pe->ctrl_fd;
        st->pfds[n].events = (short)(POLLIN | (out && !extra_out ? POLLOUT : 0));
        st->pfds[n].revents = 0;
        n++;
        for (unsigned s = 0; s < st->streams; s++) {
            st->pfds[n].fd = pe->data[s].fd;
            st->pfds[n].events = (short)(POLLIN | (pe->data[s].send_cur ? POLLOUT : 0));
            st->pfds[n].revents = 0;
            n++;
        }
        st->pfds[n].fd = pe->extra_fd;
        st->pfds[n].events = (short)(extra_out ? (out ? POLLOUT : 0) : POLLIN);
        st->pfds[n].revents = 0;
        n++;
    }
    return n;
}

static int peer_progress(struct tcp_state *st, struct tcp_peer *pe, int polled)
{
    int events = 0;
    int kick = pe->kick;
    pe->kick = 0;
    const struct pollfd *pf = polled ? &st->pfds[pe->pfd_base] : NULL;

    const size_t x = 1 + st->streams;   /* extra_fd's entry */
    const int ctrl_ev = (pf != NULL && (pf[0].revents & (POLLIN | POLLHUP | POLLERR))) || (pf == NULL && kick);
    /* After a collision the lower rank reads the peer's frames on extra_fd
     * and only sends on ctrl_fd. A peer that closes everything (destroy,
     * abort) ends both; the frames it sent before must be read first, so
     * extra_fd is drained before ctrl_fd's end-of-file may fail the pipe. */
    if (pe->up && pe->extra_fd >= 0 && !pe->extra_tx &&
        (ctrl_ev || (pf != NULL && (pf[x].revents & (POLLIN | POLLHUP | POLLERR))) || kick))
        events += ctrl_receive(st, pe, pe->extra_fd);
    if (ctrl_ev && peer_alive(pe))
        events += ctrl_receive(st, pe, pe->ctrl_fd);   /* (just up: frames may be waiting already) */
    if (pe->up && pe->out_len > pe->out_off) {
        int r = ctrl_flush(st, pe);
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

/* The listener and the handshakes: accepts, advances every handshake that
 * polled ready (or finished already), expires what is overdue. Makes no
 * upcall (failures are owed, see deliver_failures). */
static int handshakes_progress(struct tcp_state *st, int ready, double now)
{
    int events = 0;
    /* The handshakes that were polled first, while hs.v[i] still matches
     * pfds[1 + i]: accepting may compact and grow the list. */
    for (size_t i = 0; i < st->hs.n; i++) {
        const struct tcp_conn *k = &st->hs.v[i];
        if (k->fd < 0 || k->stage == CONN_DROPPED)
            continue;
        if (k->stage != CONN_DONE && st->pfds[1 + i].revents == 0)
            continue;
        events += conn_advance(st, i);
    }
    if (ready > 0 && (st->pfds[0].revents & POLLIN))
        events += accept_pending(st);   /* advances each new one at once */
    events += hs_expire(st, now);
    for (int i = 0; i < st->nactive; i++) {
        struct tcp_peer *pe = &st->peers[st->active[i]];
        if (pe->state == PEER_OUT || pe->state == PEER_IN)
            events += ctrl_flush_early(st, pe);
        else if (pe->up && pe->out_len > pe->out_off && ctrl_tx_fd(st, pe) != pe->ctrl_fd)
            pe->kick = 1;   /* up, sending on its own control socket: peer_progress flushes */
    }
    /* Compacting keeps rogue connections from growing the list without
     * bound. */
    hs_compact(&st->hs);
    atomic_store_explicit(&st->handshaking, st->hs.n > 0 || st->nconnecting > 0, memory_order_relaxed);
    return events;
}

static int tcp_progress(void *ctx)
{
    struct tcp_state *st = ctx;
    if (st == NULL || st->nactive == 0)
        return 0;
    const int handshaking = st->hs.n > 0 || st->nconnecting > 0;
    const double now = handshaking || st->hs.accept_rest_until > 0 ? weft_now() : 0;
    size_t n = build_pollfds(st, now);
    if (n == 0)
        return 0;
    int ready = poll(st->pfds, n, 0);
    if (ready < 0)
        ready = 0;
    int events = 0;
    /* Steady state (every talking peer up, no stranger): the listener is
     * one more descriptor in the poll, and that is all it costs. */
    if (handshaking || (ready > 0 && (st->pfds[0].revents & POLLIN)))
        events += handshakes_progress(st, ready, now > 0 ? now : weft_now());
    for (int i = 0; i < st->nactive; i++) {
        struct tcp_peer *pe = &st->peers[st->active[i]];
        if (!pe->up && (pe->state == PEER_OUT || pe->state == PEER_IN) && ctrl_rx_fd(pe) >= 0) {
            /* Frames the peer sent before the pair is up: handed over now,
             * so a peer that stops calling weft right after its send is
             * still heard (the upcalls may queue work: it waits for up). */
            events += ctrl_receive(st, pe, ctrl_rx_fd(pe));
            continue;
        }
        if (!pe->up || (ready == 0 && !pe->kick))
            continue;
        events += peer_progress(st, pe, pe->polled);
    }
    events += deliver_failures(st);
    atomic_store_explicit(&st->handshaking, st->hs.n > 0 || st->nconnecting > 0 || st->notify_pending,
                          memory_order_relaxed);
    return events;
}

/* Called without the lock (transport.h): reads only the listener (fixed
 * from connect to destroy) and the atomically published descriptors and
 * events. A descriptor closed and reused meanwhile costs at most one early
 * or late wake-up, which the caller's bounded timeout absorbs. Handshake
 * sockets are not polled here: while any is under way the sleep is capped
 * at TCP_HANDSHAKE_NAP_MS, so a handshake step is never late by more. */
static void tcp_sleep(void *ctx, int timeout_ms)
{
    const struct tcp_state *st = ctx;
    if (st == NULL || st->sleep_n == 0)
        return;
    if (timeout_ms > TCP_HANDSHAKE_NAP_MS && atomic_load_explicit(&st->handshaking, memory_order_relaxed))
        timeout_ms = TCP_HANDSHAKE_NAP_MS;
    struct pollfd stack_pfds[128];
    struct pollfd *pfds = stack_pfds;
    const size_t n = 1 + st->sleep_n;
    if (n > sizeof(stack_pfds) / sizeof(stack_pfds[0])) {
        pfds = malloc(n * sizeof(*pfds));
        if (pfds == NULL)
            return;
    }
    int lev = atomic_load_explicit(&st->listen_events, memory_order_relaxed);
    pfds[0] = (struct pollfd){ .fd = lev ? st->listen_fd : -1, .events = (short)lev, .revents = 0 };
    for (size_t i = 0; i < st->sleep_n; i++) {
        int ev = atomic_load_explicit(&st->sleep_events[i], memory_order_acquire);
        pfds[1 + i].fd = ev ? atomic_load_explicit(&st->sleep_fds[i], memory_order_relaxed) : -1;
        pfds[1 + i].events = (short)ev;
        pfds[1 + i].revents = 0;
    }
    (void)poll(pfds, n, timeout_ms);
    if (pfds != stack_pfds)
        free(pfds);
}

/* Control bytes accepted by ctrl_send that the kernel has not taken yet,
 * also those waiting for their connection (which comes up or fails within
 * twice WEFT_TIMEOUT (WEFT_WAIT_TCP_CONNECT)). */
static int tcp_busy(void *ctx)
{
    const struct tcp_state *st = ctx;
    if (st == NULL)
        return 0;
    for (int i = 0; i < st->nactive; i++) {
        const struct tcp_peer *pe = &st->peers[st->active[i]];
        int live = pe->state == PEER_UP || pe->state == PEER_OUT || pe->state == PEER_IN;
        if (live && pe->out_len > pe->out_off)
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
