/*
 * What tcp.c (the data path) and tcp_conn.c (set-up, handshakes,
 * teardown) share: the rank card's blob, the control frame header, the
 * per-peer and per-comm state, the handshake list, and the functions one
 * file calls in the other. Private to p2p/transport/tcp/; every function
 * here has hidden visibility, as the whole library does.
 */
#ifndef WEFT_TCP_INT_H
#define WEFT_TCP_INT_H

#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "list.h"
#include "tcp_hello.h"
#include "tcp_listen.h"
#include "transport.h"

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

/* Stages of a handshake (tcp_conn.stage; tcp_conn.c: conn_step). */
enum { CONN_CONNECTING = 0, CONN_SEND_HELLO, CONN_READ_ACK,   /* outgoing */
       CONN_READ_HELLO, CONN_SEND_ACK,                         /* incoming */
       CONN_DONE, CONN_DROPPED };

/* Largest pipe payload ctrl_send takes (transport.h); the frame body adds
 * at most WEFT_TP_CTRL_HDR_MAX header bytes. */
static inline size_t ctrl_payload_max(const struct tcp_state *st)
{
    return st->eager_limit > WEFT_TP_CTRL_PAYLOAD_MIN ? st->eager_limit : WEFT_TP_CTRL_PAYLOAD_MIN;
}

/* Per peer, the progress poll array and sleep's arrays hold the control
 * socket, the data sockets, then extra_fd. */
static inline size_t peer_nfds(const struct tcp_state *st)
{
    return 2 + (size_t)st->streams;
}

/* ---- tcp_conn.c ---- */

/* The transport's create, reach, connect and destroy (the vtable in tcp.c). */
int weft_tcp_create(const struct weft_tp_env *env, void *blob, void **ctx);
int weft_tcp_reach(const struct weft_tp_cards *k, int me, int peer, char *why, size_t whylen);
int weft_tcp_connect(const struct weft_tp_env *env, void *ctx);
void weft_tcp_destroy(void *ctx);
/* transport.h, probe: create's own steps outside a comm (the listener opened and closed). */
int weft_tcp_probe(struct weft_core *core, char *what, size_t len);

/* Whether pe can take work now (starts its connection if it was idle):
 * WEFT_SUCCESS when up, WEFT_EAGAIN while connecting, an error once failed. */
int weft_tcp_peer_want(struct tcp_state *st, struct tcp_peer *pe);

/* Closes every socket of pe, finished or handshaking, for good. */
void weft_tcp_peer_down(struct tcp_state *st, struct tcp_peer *pe);

/* Makes the peer_failed upcalls owed for connections that failed. */
int weft_tcp_deliver_failures(struct tcp_state *st);

/* The poll events a handshake waits for in its current stage. */
int weft_tcp_conn_events(const struct tcp_conn *k);

/* The progress pass over the listener and the handshakes (entries 0 and
 * 1 + i of st->pfds, filled by build_pollfds in tcp.c). */
int weft_tcp_handshakes_progress(struct tcp_state *st, int ready, double now);

/* ---- tcp.c ---- */

/* Tells sleep which descriptors of pe to poll and for which events. */
void weft_tcp_publish_sleep_events(struct tcp_state *st, const struct tcp_peer *pe);

/* Forgets every push and expected receive of pe. */
void weft_tcp_peer_drop_work(struct tcp_peer *pe, unsigned streams);

/* The socket my frames to pe go on (-1: none yet). */
int weft_tcp_ctrl_tx_fd(const struct tcp_state *st, const struct tcp_peer *pe);

/* Writes control bytes kept for a peer that is not up yet on its early socket. */
int weft_tcp_ctrl_flush_early(struct tcp_state *st, struct tcp_peer *pe);

#endif
