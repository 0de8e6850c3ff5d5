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
 * right after its hello on (ctrl_early_fd, weft_tcp_ctrl_tx_fd), so a first send
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
 *
 * This file holds the data path of connections that are up: control
 * frames, striped rendezvous data, progress, sleep, and failure of an up
 * connection. The listener, the lazy set-up of a pair's sockets with their
 * hellos, collisions and timeouts, and teardown are in tcp_conn.c; the
 * state both share is in tcp_int.h.
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "core.h"
#include "list.h"
#include "log.h"
#include "tcp_int.h"
#include "tcp_stripe.h"
#include "transport.h"
#include "weft.h"

/* Marks the start of every control frame: a desynchronised stream is caught
 * at once instead of being parsed as garbage headers. */
#define TCP_FRAME_MAGIC 0x74666577u

/* Control bytes a peer may have waiting in user space before ctrl_send
 * answers WEFT_EAGAIN and the pipe queues the message itself. */
#define TCP_CTRL_OUT_BOUND ((size_t)4 << 20)

/* Most iovec entries and bytes handed to one sendmsg/recvmsg. */
#define TCP_IOV_MAX 64
#define TCP_IO_MAX_BYTES ((uint64_t)1 << 30)

/* Longest sleep while a handshake is under way: its sockets are not in
 * sleep's poll set, so a waiter looks again this often. Handshakes last a
 * round trip or two, so the naps are few. */
#define TCP_HANDSHAKE_NAP_MS 2

/* A push or an expected receive while tcp holds it (weft_tp_xfer.priv). */
struct tcp_xfer {
    struct weft_qnode node;         /* in the peer's push or expect FIFO */
    uint64_t          bytes;        /* message size: both ends stripe by it */
    unsigned          sockets_done; /* data sockets that finished their share */
};
WEFT_TP_PRIV_FITS(struct tcp_xfer);

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

/* Tells sleep which descriptors to poll for pe and for which events:
 * input always, output where bytes are waiting to go, nothing unless the
 * peer is up. */
void weft_tcp_publish_sleep_events(struct tcp_state *st, const struct tcp_peer *pe)
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

/* ---------------------------------------------------- failure and abort -- */

/* Forgets every push and expected receive of the peer (the pipe fails them). */
void weft_tcp_peer_drop_work(struct tcp_peer *pe, unsigned streams)
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
    weft_tcp_peer_down(st, pe);
    st->env->up->peer_failed(st->env->up->arg, pe->rank, WEFT_ERR_TRANSPORT);
}

static void tcp_abort_peer(void *ctx, int peer)
{
    struct tcp_state *st = ctx;
    struct tcp_peer *pe = peer_of(st, peer);
    if (pe == NULL)
        return;
    weft_tcp_peer_drop_work(pe, st->streams);
    /* Dropping a push half-way desynchronises the data sockets, so the
     * connection cannot carry anything after this: close it (a handshake
     * under way too), and the peer's pipe breaks too instead of misreading
     * the next message. The pipe is broken already: no upcall is owed. */
    weft_tcp_peer_down(st, pe);
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
int weft_tcp_ctrl_tx_fd(const struct tcp_state *st, const struct tcp_peer *pe)
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
    int fd = weft_tcp_ctrl_tx_fd(st, pe);
    if (fd < 0)
        return 0;
    return ctrl_flush_fd(pe, fd);
}

/* Writes what ctrl_send kept for a peer that is not up yet on its early
 * socket. Errors are left to the handshake, which sees them too. */
int weft_tcp_ctrl_flush_early(struct tcp_state *st, struct tcp_peer *pe)
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
        int rc = weft_tcp_peer_want(st, pe);
        if (rc != WEFT_EAGAIN)
            return rc;
        if (ctrl_early_fd(st, pe) < 0)
            return WEFT_EAGAIN;
        if (pe->out_len - pe->out_off + total > TCP_CTRL_OUT_BOUND)
            return WEFT_EAGAIN;
        if (ctrl_buffer(pe, iov, niov, 0) != WEFT_SUCCESS)
            return WEFT_EAGAIN;
        (void)weft_tcp_ctrl_flush_early(st, pe);
        return WEFT_SUCCESS;
    }

    const int tx = weft_tcp_ctrl_tx_fd(st, pe);
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
            weft_tcp_peer_down(st, pe);
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
            weft_tcp_peer_down(st, pe);
            return WEFT_ERR_NO_MEMORY;
        }
        return WEFT_EAGAIN;
    }
    pe->kick = 1;
    weft_tcp_publish_sleep_events(st, pe);
    if (pending > 0 && ctrl_flush(st, pe) < 0) {
        int e = errno;
        weft_set_error(core, WEFT_ERR_TRANSPORT, "tcp: peer %d (%s): sending a control message: %s",
                       pe->rank, pe->where, strerror(e));
        weft_tcp_peer_down(st, pe);
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
    int rc = weft_tcp_peer_want(st, pe);
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
    int rc = weft_tcp_peer_want(st, pe);
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
        weft_tcp_publish_sleep_events(st, pe);
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
        st->pfds[n++] = (struct pollfd){ .fd = live ? k->fd : -1, .events = (short)weft_tcp_conn_events(k), .revents = 0 };
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
    weft_tcp_publish_sleep_events(st, pe);
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
        events += weft_tcp_handshakes_progress(st, ready, now > 0 ? now : weft_now());
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
    events += weft_tcp_deliver_failures(st);
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
    .create = weft_tcp_create,
    .reach = weft_tcp_reach,
    .probe = weft_tcp_probe,
    .connect = weft_tcp_connect,
    .destroy = weft_tcp_destroy,
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
