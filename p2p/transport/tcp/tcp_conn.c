/*
 * TCP transport, connection set-up (the design is at the top of tcp.c):
 * the listener (create, kept open until destroy), the per-peer bookkeeping
 * of connect, the lazy making of a pair's sockets at its first message
 * (non-blocking connects, accepts, the hello and its answer, tcp_hello.h),
 * the collision tie-break, what the listener tolerates from strangers
 * (tcp_listen.h), the timeouts of handshakes and of a pair that does not
 * come up, and teardown. Once every socket of a pair is in (peer_up), the
 * data path of tcp.c takes over.
 *
 * Like tcp.c, everything here runs under the pipe layer's lock
 * (transport.h), and nothing blocks.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"
#include "list.h"
#include "log.h"
#include "netif.h"
#include "tcp_hello.h"
#include "tcp_int.h"
#include "tcp_listen.h"
#include "transport.h"
#include "weft.h"
#include "deadline.h"

/* Socket buffer size asked for on every connection (0 = leave the kernel's
 * autotuning alone). Autotuning on Linux grows loopback and LAN windows
 * past what a fixed setting capped by net.core.[rw]mem_max allows. */
#ifndef TCP_SOCKBUF_BYTES
#define TCP_SOCKBUF_BYTES 0
#endif

/* Abandoned sockets (the losing set of a collision) wait for the peer's
 * COLLIDE answer at most WEFT_KEEP_TCP_ABANDONED (src/core/deadline.c), and
 * a connection not up within WEFT_WAIT_TCP_CONNECT fails its peer (the why
 * of its factor is written there). */

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

int weft_tcp_create(const struct weft_tp_env *env, void *blob, void **ctx)
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

int weft_tcp_probe(struct weft_core *core, char *what, size_t len)
{
    struct weft_tp_env env;
    struct tcp_card card;
    void *ctx = NULL;

    memset(&env, 0, sizeof(env));
    env.core = core;
    memset(&card, 0, sizeof(card));
    /* create's own steps: WEFT_TCP_IF, the listener's socket, bind, listen. */
    if (weft_tcp_create(&env, &card, &ctx) != WEFT_SUCCESS) {
        weft_error_last_reason(core, what, len);
        return 0;
    }
    const struct tcp_state *st = ctx;
    char a[64], ifname[IF_NAMESIZE + 1];
    format_addr(&st->listen_addr, a, sizeof(a));
    if (weft_netif_name_of(&st->listen_addr.sin_addr, ifname, sizeof(ifname)) != 0)
        snprintf(ifname, sizeof(ifname), "?");
    snprintf(what, len, "listening on %s (%s%s), %u data streams per peer", ifname, a,
             core->cfg.tcp_if[0] ? ", WEFT_TCP_IF" : st->listen_addr.sin_addr.s_addr == htonl(INADDR_LOOPBACK)
             ? ", no UP non-loopback IPv4 interface" : ", the first UP non-loopback IPv4 interface", st->streams);
    weft_tcp_destroy(ctx);
    return 1;
}

/* ----------------------------------------------------------------- reach -- */

/* Any pair where both ranks have a listener: whether the network between
 * them carries it is only learnt by connecting. */
int weft_tcp_reach(const struct weft_tp_cards *k, int me, int peer, char *why, size_t whylen)
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
void weft_tcp_peer_down(struct tcp_state *st, struct tcp_peer *pe)
{
    hs_close_peer(st, pe->rank);   /* abandoned sockets of a lost collision too */
    peer_set_state(st, pe, PEER_FAILED);
    weft_tcp_publish_sleep_events(st, pe);
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
    weft_tcp_peer_down(st, pe);
    pe->notify = code;
    st->notify_pending = 1;
    atomic_store_explicit(&st->handshaking, 1, memory_order_relaxed);   /* the next pass reports it */
}

/* Makes the owed peer_failed upcalls. They may re-enter (ctrl_send to other
 * peers starts connections), so this runs outside every list walk. */
int weft_tcp_deliver_failures(struct tcp_state *st)
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
    weft_tcp_publish_sleep_events(st, pe);
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
 * wins a collision (see the top of tcp.c). */
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

int weft_tcp_conn_events(const struct tcp_conn *k)
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
int weft_tcp_peer_want(struct tcp_state *st, struct tcp_peer *pe)
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
                weft_tcp_publish_sleep_events(st, pe);
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
int weft_tcp_connect(const struct weft_tp_env *env, void *ctx)
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

static void peer_free(struct tcp_peer *pe, unsigned streams)
{
    peer_close_sockets(pe, streams);
    weft_tcp_peer_drop_work(pe, streams);
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

void weft_tcp_destroy(void *ctx)
{
    struct tcp_state *st = ctx;
    if (st == NULL)
        return;
    tcp_release(st);
    free(st);
}

/* ---------------------------------------------------------- progress -- */

/* The listener and the handshakes: accepts, advances every handshake that
 * polled ready (or finished already), expires what is overdue. Makes no
 * upcall (failures are owed, see weft_tcp_deliver_failures). */
int weft_tcp_handshakes_progress(struct tcp_state *st, int ready, double now)
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
            events += weft_tcp_ctrl_flush_early(st, pe);
        else if (pe->up && pe->out_len > pe->out_off && weft_tcp_ctrl_tx_fd(st, pe) != pe->ctrl_fd)
            pe->kick = 1;   /* up, sending on its own control socket: peer_progress flushes */
    }
    /* Compacting keeps rogue connections from growing the list without
     * bound. */
    hs_compact(&st->hs);
    atomic_store_explicit(&st->handshaking, st->hs.n > 0 || st->nconnecting > 0, memory_order_relaxed);
    return events;
}
