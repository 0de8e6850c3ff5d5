/*
 * The unique-id bootstrap: ranks launched without MPI (torchrun, a
 * scheduler, a test harness) meet through a 128-byte id, NCCL style.
 *
 * weft_get_unique_id opens a listening TCP socket (on the interface
 * WEFT_TCP_IF names, src/core/netif.c) and starts a detached root thread
 * that serves exactly one meeting. weft_comm_init's ranks connect to it,
 * prove the id's job token, say their rank and nranks, and wait until all
 * nranks joined. Each bootstrap operation is then relayed: every rank sends
 * its contribution, the root combines them (allgather: concatenation;
 * alltoall: transpose; max) and answers each rank. When creation succeeded
 * a rank says so (`created`) and drops its socket; the root thread frees
 * everything and exits once every rank did, on the first error, or after
 * WEFT_TIMEOUT without progress. There is no barrier op: a comm made this
 * way keeps no bootstrap, so destroy's barrier goes over its own pipes.
 *
 * The id (opaque to users; integers big-endian, so either byte order reads it):
 *   bytes  0..3    magic "WfId"
 *          4       version (1)
 *          5       the root's address family: 4 (IPv4) or 6 (IPv6)
 *          6..7    the root listener's TCP port
 *          8..15   job token: 64 random bits every connection proves first
 *          16..31  the root listener's address (IPv4: bytes 16..19)
 *          32..127 zero (checked: a corrupted copy is caught early)
 * The listener is IPv4 today (WEFT_TCP_IF names an IPv4 address or an
 * interface); the layout and the ranks' side take an IPv6 root as well.
 *
 * Wire (big-endian):
 *   rank -> root, once:    magic[4] version[1] zero[3] token[8] | rank[4] nranks[4]
 *                          The root reads the first 16 bytes alone and checks
 *                          them before it reads anything else: a wrong one is
 *                          closed (one WARN naming the peer address).
 *   rank -> root, each op: op[4] zero[4] bytes[8] payload[bytes]
 *   root -> rank:          kind[4] code[4] len[8] payload[len]
 *       OK        the op's result (the welcome, once all nranks joined: len 0)
 *       ERR       the meeting failed: code is a WEFT_* code, payload the text
 *       PROGRESS  len 0: another rank joined or contributed. It restarts the
 *                 waiting ranks' WEFT_TIMEOUT clock when the root's restarts,
 *                 so the root, which knows who is missing, speaks first.
 */
#include "backoff.h"
#include "bootstrap_uid.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "config.h"
#include "core.h"
#include "log.h"
#include "netif.h"
#include "deadline.h"

static const unsigned char uid_magic[4] = { 'W', 'f', 'I', 'd' };
#define UID_VERSION    1
#define UID_TAIL       32        /* first byte of the zero tail */
#define HELLO_CHECKED  16        /* magic, version, token: read and checked alone */
#define HELLO_BYTES    24        /* + rank, nranks */
#define FRAME_BYTES    16

enum { OP_ALLGATHER = 1, OP_ALLTOALL, OP_MAX, OP_DONE };
enum { REPLY_OK = 0, REPLY_ERR, REPLY_PROGRESS };

/* Most bytes one rank may contribute to one op, and most ranks in a
 * meeting: bounds on what a garbage frame can make the root allocate. */
#define UID_MAX_CONTRIB ((uint64_t)1 << 30)
#define UID_MAX_RANKS   (1 << 20)
/* Most connections the root holds at once (joined or not): a flood of
 * strays cannot exhaust the process's descriptors. */
#define UID_MAX_CONNS   4096
/* A refused connect means nothing listens at the root's address: the
 * process that made the id is gone (its listener lives as long as the id
 * is usable). A few retries within about a second ride out a transient. */
#define UID_CONNECT_TRIES 8
#define UID_CONNECT_RETRY_S 0.125
/* The failure text sent to the ranks is written to sockets that may be
 * gone: at most this long per rank. */
#define UID_ERR_SEND_S 2.0

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static uint64_t get64(const unsigned char *p)
{
    return ((uint64_t)get32(p) << 32) | get32(p + 4);
}

static const char *op_name(uint32_t op)
{
    switch (op) {
    case OP_ALLGATHER: return "allgather";
    case OP_ALLTOALL:  return "alltoall";
    case OP_MAX:       return "agreement";
    case OP_DONE:      return "done";
    default:           return "unknown op";
    }
}

static void format_sockaddr(const struct sockaddr *sa, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, (unsigned)ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        snprintf(buf, len, "[%s]:%u", host, (unsigned)ntohs(in6->sin6_port));
    } else {
        snprintf(buf, len, "(address family %d)", (int)sa->sa_family);
    }
}

/* ---------------------------------------------------------------- the id -- */

struct uid_decoded {
    unsigned char           token[8];
    struct sockaddr_storage sa;
    socklen_t               salen;
    char                    text[80];   /* "10.0.0.1:4711" */
};

static void uid_encode(weft_unique_id_t *id, const unsigned char token[8], const struct sockaddr_in *root)
{
    unsigned char *p = (unsigned char *)id->internal;
    memset(id, 0, sizeof(*id));
    memcpy(p, uid_magic, 4);
    p[4] = UID_VERSION;
    p[5] = 4;
    memcpy(p + 6, &root->sin_port, 2);   /* already network order */
    memcpy(p + 8, token, 8);
    memcpy(p + 16, &root->sin_addr, 4);
}

int weft_uid_check(const weft_unique_id_t *id, char *why, size_t len)
{
    const unsigned char *p = (const unsigned char *)id->internal;
    if (memcmp(p, uid_magic, 4) != 0) {
        snprintf(why, len, "the id is not one weft_get_unique_id made (bad magic)");
        return WEFT_ERR_INVALID_ARG;
    }
    if (p[4] != UID_VERSION) {
        snprintf(why, len, "the id has version %u; this weft reads version %u", p[4], UID_VERSION);
        return WEFT_ERR_INVALID_ARG;
    }
    if (p[5] != 4 && p[5] != 6) {
        snprintf(why, len, "the id's root address family %u is neither 4 nor 6 (a corrupted copy?)", p[5]);
        return WEFT_ERR_INVALID_ARG;
    }
    for (int i = UID_TAIL; i < WEFT_UNIQUE_ID_BYTES; i++)
        if (p[i] != 0) {
            snprintf(why, len, "the id's byte %d is not zero (a corrupted copy?)", i);
            return WEFT_ERR_INVALID_ARG;
        }
    return WEFT_SUCCESS;
}

static int uid_decode(const weft_unique_id_t *id, struct uid_decoded *d, char *why, size_t len)
{
    const unsigned char *p = (const unsigned char *)id->internal;
    int rc = weft_uid_check(id, why, len);
    if (rc != WEFT_SUCCESS)
        return rc;
    memset(d, 0, sizeof(*d));
    memcpy(d->token, p + 8, 8);
    if (p[5] == 4) {
        struct sockaddr_in *in = (struct sockaddr_in *)(void *)&d->sa;
        in->sin_family = AF_INET;
        memcpy(&in->sin_port, p + 6, 2);
        memcpy(&in->sin_addr, p + 16, 4);
        d->salen = sizeof(*in);
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)(void *)&d->sa;
        in6->sin6_family = AF_INET6;
        memcpy(&in6->sin6_port, p + 6, 2);
        memcpy(&in6->sin6_addr, p + 16, 16);
        d->salen = sizeof(*in6);
    }
    format_sockaddr((const struct sockaddr *)&d->sa, d->text, sizeof(d->text));
    return WEFT_SUCCESS;
}

/* ------------------------------------------------------- bounded socket I/O -- */

#define UID_EOF (-1)   /* the peer closed the connection (an errno otherwise) */
/* After a failed send to the root: how long a rank looks for the root's
 * verdict (its ERR frame, sent just before it closed) in what it had not
 * read yet. It is there already or not at all. */
#define UID_VERDICT_WAIT_S 0.5

/* Milliseconds poll may wait until deadline (0 = no deadline: -1, forever). */
static int ms_until(double deadline)
{
    if (deadline <= 0)
        return -1;
    double left = deadline - weft_now();
    if (left <= 0)
        return 0;
    return left > 3600 ? 3600 * 1000 : (int)(left * 1000) + 1;
}

/* Waits until fd is ready for events or the deadline passed (ETIMEDOUT);
 * 0 also after an interrupted poll (the caller simply tries again). */
static int wait_ready(int fd, short events, double deadline)
{
    struct pollfd pf = { .fd = fd, .events = events, .revents = 0 };
    int t = ms_until(deadline);
    if (t == 0)
        return ETIMEDOUT;
    if (poll(&pf, 1, t) < 0 && errno != EINTR)
        return errno;
    return 0;
}

/* Writes all n bytes to the non-blocking fd; fails with ETIMEDOUT when
 * window seconds pass without a byte going out (window 0: no bound).
 * Returns 0 or an errno. */
static int send_all(int fd, const void *buf, size_t n, double window)
{
    const char *p = buf;
    double deadline = window > 0 ? weft_now() + window : 0;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            deadline = window > 0 ? weft_now() + window : 0;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return errno;
        int rc = wait_ready(fd, POLLOUT, deadline);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Reads exactly n bytes, bounded like send_all. 0, UID_EOF or an errno. */
static int recv_all(int fd, void *buf, size_t n, double window)
{
    char *p = buf;
    double deadline = window > 0 ? weft_now() + window : 0;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            deadline = window > 0 ? weft_now() + window : 0;
            continue;
        }
        if (k == 0)
            return UID_EOF;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno;
        int rc = wait_ready(fd, POLLIN, deadline);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static void tune_socket(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ---------------------------------------------------------------- the root -- */

struct conn {
    int            fd;                  /* -1 once closed */
    int            rank, nranks;        /* from its hello; valid once hello_got == HELLO_BYTES */
    int            member;              /* accepted into the meeting (root.member[rank] == this) */
    char           peer[80];            /* its address, for messages */
    unsigned char  hello[HELLO_BYTES];
    size_t         hello_got;
    unsigned char  frame[FRAME_BYTES];  /* the op header being read */
    size_t         frame_got;
    unsigned char *data;                /* its contribution to the op in progress */
    size_t         data_bytes, data_got;
    int            contributed;         /* its contribution is complete */
    int            done;                /* it said `created` and was closed */
    int            told;                /* it got the meeting's failure text */
};

struct root {
    int            listen_fd;
    unsigned char  token[8];
    char           addr[80];         /* the listener, "10.0.0.1:4711" */
    double         timeout;          /* WEFT_WAIT_UID_ROOT of the process that made the id; 0 = never */
    double         tell;             /* WEFT_KEEP_UID_TELL: how long a failure is told to the ranks */
    double         last;             /* time of the last progress (a join, a contribution) */

    struct conn  **conns;            /* every open connection, joined or not */
    int            nconns, cap;

    int            nranks;           /* the meeting's size: the first joined rank's nranks; 0 before */
    int            first_rank;       /* who set it, for the mismatch message */
    struct conn  **member;           /* [nranks]: the connection of each rank once joined */
    int            joined;

    uint32_t       op;               /* the op in progress (0: none) */
    uint64_t       op_bytes;         /* each rank's contribution */
    int            op_first;         /* the rank whose frame set op and op_bytes */
    int            contributed, ndone;
    unsigned long  op_count;         /* ops completed, for messages */
};

static void conn_close(struct conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->data);
    c->data = NULL;
}

/* Removes conns[i] (not a member: members stay until the root exits). */
static void root_drop(struct root *r, int i)
{
    struct conn *c = r->conns[i];
    conn_close(c);
    free(c);
    r->conns[i] = r->conns[--r->nconns];
}

static void root_free(struct root *r)
{
    for (int i = 0; i < r->nconns; i++) {
        conn_close(r->conns[i]);
        free(r->conns[i]);
    }
    free(r->conns);
    free(r->member);
    if (r->listen_fd >= 0)
        close(r->listen_fd);
    free(r);
}

/* Accepts what is waiting on the listener (strays past UID_MAX_CONNS are
 * closed at once). 0, or WEFT_ERR_NO_MEMORY with the text in err. */
static int root_accept(struct root *r, char *err, size_t len)
{
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t salen = sizeof(sa);
        int fd = accept4(r->listen_fd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return WEFT_SUCCESS;   /* EAGAIN, or an aborted handshake: nothing to keep */
        char peer[80];
        format_sockaddr((struct sockaddr *)&sa, peer, sizeof(peer));
        if (r->nconns >= UID_MAX_CONNS) {
            WEFT_WARN(-1, "the unique id's root %s: refused a connection from %s: already %d open", r->addr, peer,
                      r->nconns);
            close(fd);
            continue;
        }
        if (r->nconns == r->cap) {
            int cap = r->cap ? 2 * r->cap : 16;
            struct conn **more = realloc(r->conns, (size_t)cap * sizeof(*more));
            if (more == NULL) {
                close(fd);
                snprintf(err, len, "the unique id's root %s: no memory for %d connections", r->addr, cap);
                return WEFT_ERR_NO_MEMORY;
            }
            r->conns = more;
            r->cap = cap;
        }
        struct conn *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            snprintf(err, len, "the unique id's root %s: no memory for a connection", r->addr);
            return WEFT_ERR_NO_MEMORY;
        }
        c->fd = fd;
        c->rank = -1;
        snprintf(c->peer, sizeof(c->peer), "%s", peer);
        tune_socket(fd);
        r->conns[r->nconns++] = c;
    }
}

/* Tells every member but `except` that the meeting moved on. Best effort:
 * a member that cannot take 16 bytes now is found out by the next reply. */
static void root_progress(struct root *r, const struct conn *except, int contributed_only)
{
    unsigned char f[FRAME_BYTES];
    put32(f, REPLY_PROGRESS);
    put32(f + 4, 0);
    put64(f + 8, 0);
    for (int q = 0; q < r->nranks; q++) {
        struct conn *m = r->member ? r->member[q] : NULL;
        if (m && m != except && m->fd >= 0 && (!contributed_only || m->contributed))
            (void)send_all(m->fd, f, sizeof(f), UID_ERR_SEND_S);
    }
}

/* "rank 3" or "ranks 1, 3, 5" (at most 8 named, then how many in all). */
static void format_ranks(char *buf, size_t len, const int *ranks, int n)
{
    size_t at = (size_t)snprintf(buf, len, "%s", n == 1 ? "rank " : "ranks ");
    for (int i = 0; i < n && i < 8 && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%d", i ? ", " : "", ranks[i]);
    if (n > 8 && at < len)
        snprintf(buf + at, len - at, ", ... (%d in all)", n);
}

#define HELLO_REFUSED (-1)   /* root_read_hello: not a WEFT_* code (those are >= 0) */

/* Reads (more of) conn c's hello. Returns 0 (more to come, or accepted),
 * HELLO_REFUSED (drop the connection), or a WEFT_* code with the meeting's
 * failure text in err. */
static int root_read_hello(struct root *r, struct conn *c, char *err, size_t len)
{
    size_t want = c->hello_got < HELLO_CHECKED ? HELLO_CHECKED : HELLO_BYTES;
    ssize_t k = recv(c->fd, c->hello + c->hello_got, want - c->hello_got, 0);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        WEFT_INFO(-1, "the unique id's root %s: %s closed its connection before saying its rank", r->addr, c->peer);
        return HELLO_REFUSED;
    }
    if (k < 0)
        return 0;
    c->hello_got += (size_t)k;
    if (c->hello_got == HELLO_CHECKED) {
        /* The job token before anything else: a connection that cannot
         * prove it gets nothing read past it, and no answer. */
        if (memcmp(c->hello, uid_magic, 4) != 0 || c->hello[4] != UID_VERSION ||
            memcmp(c->hello + 8, r->token, 8) != 0) {
            WEFT_WARN(-1, "the unique id's root %s: refused a connection from %s: wrong magic or job token "
                      "(a unique id of another job, or a corrupted copy)", r->addr, c->peer);
            return HELLO_REFUSED;
        }
        return 0;
    }
    if (c->hello_got < HELLO_BYTES)
        return 0;

    c->rank = (int)(int32_t)get32(c->hello + 16);
    c->nranks = (int)(int32_t)get32(c->hello + 20);
    if (c->nranks < 1 || c->nranks > UID_MAX_RANKS) {
        snprintf(err, len, "rank %d says nranks %d: the unique id's root serves 1 to %d ranks", c->rank, c->nranks,
                 UID_MAX_RANKS);
        return WEFT_ERR_INVALID_ARG;
    }
    if (r->nranks == 0) {
        r->member = calloc((size_t)c->nranks, sizeof(*r->member));
        if (r->member == NULL) {
            snprintf(err, len, "the unique id's root %s: no memory for %d ranks", r->addr, c->nranks);
            return WEFT_ERR_NO_MEMORY;
        }
        r->nranks = c->nranks;
        r->first_rank = c->rank;
    } else if (c->nranks != r->nranks) {
        snprintf(err, len, "nranks mismatch: rank %d says %d, rank %d says %d", c->rank, c->nranks, r->first_rank,
                 r->nranks);
        return WEFT_ERR_INVALID_ARG;
    }
    if (c->rank < 0 || c->rank >= r->nranks) {
        snprintf(err, len, "rank %d is out of range: nranks is %d", c->rank, r->nranks);
        return WEFT_ERR_INVALID_ARG;
    }
    if (r->member[c->rank] != NULL) {
        snprintf(err, len, "rank %d joined twice (from %s and from %s)", c->rank, r->member[c->rank]->peer, c->peer);
        return WEFT_ERR_INVALID_ARG;
    }
    r->member[c->rank] = c;
    c->member = 1;
    r->joined++;
    r->last = weft_now();
    WEFT_TRACE(-1, "the unique id's root %s: rank %d of %d joined from %s", r->addr, c->rank, r->nranks, c->peer);
    root_progress(r, c, 0);
    return 0;
}

/* The join: until all nranks ranks are in. 0, or a code with the text in err. */
static int root_join(struct root *r, char *err, size_t len)
{
    struct pollfd *pf = NULL;
    int rc = WEFT_SUCCESS;

    while (r->nranks == 0 || r->joined < r->nranks) {
        double deadline = r->timeout > 0 ? r->last + r->timeout : 0;
        int n = 0;
        struct pollfd *more = realloc(pf, (size_t)(r->nconns + 1) * sizeof(*pf));
        if (more == NULL) {
            snprintf(err, len, "the unique id's root %s: no memory", r->addr);
            rc = WEFT_ERR_NO_MEMORY;
            break;
        }
        pf = more;
        pf[n++] = (struct pollfd){ .fd = r->listen_fd, .events = POLLIN, .revents = 0 };
        for (int i = 0; i < r->nconns; i++)
            pf[n++] = (struct pollfd){ .fd = r->conns[i]->fd, .events = POLLIN, .revents = 0 };
        int t = ms_until(deadline);
        int got = t == 0 ? 0 : poll(pf, (nfds_t)n, t);
        if (got < 0 && errno != EINTR) {
            snprintf(err, len, "the unique id's root %s: poll failed: %s", r->addr, strerror(errno));
            rc = WEFT_ERR_INTERNAL;
            break;
        }
        if (got == 0 && deadline > 0 && weft_now() >= deadline) {
            if (r->nranks == 0) {
                snprintf(err, len, "no rank joined within %g s", r->timeout);
                rc = WEFT_ERR_TIMEOUT;
                break;
            }
            int *missing = calloc((size_t)r->nranks, sizeof(*missing)), nm = 0;
            char list[160] = "some ranks";
            for (int q = 0; missing && q < r->nranks; q++)
                if (r->member[q] == NULL)
                    missing[nm++] = q;
            if (missing)
                format_ranks(list, sizeof(list), missing, nm);
            free(missing);
            snprintf(err, len, "%s of %d never joined (waited %g s at the unique id's root %s)", list, r->nranks,
                     r->timeout, r->addr);
            rc = WEFT_ERR_TIMEOUT;
            break;
        }
        if (got <= 0)
            continue;
        /* Connections first (indices match pf[1..] only until conns change). */
        for (int i = n - 2; i >= 0 && rc == WEFT_SUCCESS; i--) {
            if (!(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            struct conn *c = r->conns[i];
            if (c->member) {
                /* A member says nothing until the welcome: this is its end. */
                char b;
                ssize_t k = recv(c->fd, &b, 1, 0);
                if (k < 0 && (errno == EAGAIN || errno == EINTR))
                    continue;
                snprintf(err, len, "rank %d of %d left before every rank joined (%s)", c->rank, r->nranks,
                         k == 0 ? "its connection closed" : k > 0 ? "it sent data out of turn" : strerror(errno));
                rc = k > 0 ? WEFT_ERR_INTERNAL : WEFT_ERR_TRANSPORT;
                break;
            }
            int h = root_read_hello(r, c, err, len);
            if (h == HELLO_REFUSED)
                root_drop(r, i);
            else if (h != 0)
                rc = h;
        }
        if (rc == WEFT_SUCCESS && (pf[0].revents & POLLIN))
            rc = root_accept(r, err, len);
        if (rc != WEFT_SUCCESS)
            break;
    }
    free(pf);
    if (rc != WEFT_SUCCESS)
        return rc;

    /* Everyone is in: the id has served its meeting. Later connections are
     * refused by the kernel, strays are closed, members are welcomed. */
    close(r->listen_fd);
    r->listen_fd = -1;
    for (int i = r->nconns - 1; i >= 0; i--)
        if (!r->conns[i]->member)
            root_drop(r, i);
    unsigned char f[FRAME_BYTES];
    put32(f, REPLY_OK);
    put32(f + 4, 0);
    put64(f + 8, 0);
    for (int q = 0; q < r->nranks; q++) {
        int e = send_all(r->member[q]->fd, f, sizeof(f), r->timeout);
        if (e != 0) {
            snprintf(err, len, "lost rank %d of %d at the welcome: %s", q, r->nranks,
                     e == UID_EOF ? "connection closed" : strerror(e));
            return e == ETIMEDOUT ? WEFT_ERR_TIMEOUT : WEFT_ERR_TRANSPORT;
        }
    }
    r->last = weft_now();
    WEFT_INFO(-1, "the unique id's root %s: all %d ranks joined", r->addr, r->nranks);
    return WEFT_SUCCESS;
}

/* All contributions are in: combine and answer every rank. */
static int root_answer(struct root *r, char *err, size_t len)
{
    size_t n = (size_t)r->nranks, per = (size_t)r->op_bytes;
    size_t out_bytes = r->op == OP_ALLGATHER ? n * per : per;
    unsigned char *out = malloc(out_bytes ? out_bytes : 1);
    int rc = WEFT_SUCCESS;

    if (out == NULL) {
        snprintf(err, len, "the unique id's root %s: no memory for the %s's %zu bytes", r->addr, op_name(r->op),
                 out_bytes);
        return WEFT_ERR_NO_MEMORY;
    }
    if (r->op == OP_ALLGATHER) {
        for (size_t q = 0; q < n; q++)
            memcpy(out + q * per, r->member[q]->data, per);
    } else if (r->op == OP_MAX) {
        int64_t best = (int64_t)get64(r->member[0]->data);
        for (size_t q = 1; q < n; q++) {
            int64_t v = (int64_t)get64(r->member[q]->data);
            best = v > best ? v : best;
        }
        put64(out, (uint64_t)best);
    }
    for (size_t q = 0; q < n && rc == WEFT_SUCCESS; q++) {
        if (r->op == OP_ALLTOALL) {
            /* Rank q gets block q of every rank's contribution, in rank order. */
            size_t blk = per / n;
            for (size_t j = 0; j < n; j++)
                memcpy(out + j * blk, r->member[j]->data + q * blk, blk);
        }
        unsigned char f[FRAME_BYTES];
        put32(f, REPLY_OK);
        put32(f + 4, 0);
        put64(f + 8, out_bytes);
        int e = send_all(r->member[q]->fd, f, sizeof(f), r->timeout);
        if (e == 0)
            e = send_all(r->member[q]->fd, out, out_bytes, r->timeout);
        if (e != 0) {
            snprintf(err, len, "lost rank %zu of %d during the %s: %s", q, r->nranks, op_name(r->op),
                     e == UID_EOF ? "connection closed" : strerror(e));
            rc = e == ETIMEDOUT ? WEFT_ERR_TIMEOUT : WEFT_ERR_TRANSPORT;
        }
    }
    free(out);
    for (size_t q = 0; q < n; q++) {
        struct conn *m = r->member[q];
        free(m->data);
        m->data = NULL;
        m->data_bytes = m->data_got = m->frame_got = 0;
        m->contributed = 0;
    }
    r->op = 0;
    r->contributed = 0;
    r->op_count++;
    r->last = weft_now();
    return rc;
}

/* Reads (more of) member m's next frame or contribution. 0, or a code
 * with the meeting's failure text in err. */
static int root_read_op(struct root *r, struct conn *m, char *err, size_t len)
{
    const char *during = r->op ? op_name(r->op) : "meeting";
    unsigned char *dst;
    size_t want;

    if (m->contributed) {
        dst = NULL;   /* it waits for its answer: readable means it is gone */
        want = 1;
    } else if (m->frame_got < FRAME_BYTES) {
        dst = m->frame + m->frame_got;
        want = FRAME_BYTES - m->frame_got;
    } else {
        dst = m->data + m->data_got;
        want = m->data_bytes - m->data_got;
    }
    char scratch;
    ssize_t k = recv(m->fd, dst ? (void *)dst : (void *)&scratch, want, 0);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return WEFT_SUCCESS;
    if (k <= 0) {
        snprintf(err, len, "rank %d of %d left during the %s (its connection to the unique id's root %s %s: "
                 "its process exited or its weft_comm_init failed)", m->rank, r->nranks, during, r->addr,
                 k == 0 ? "closed" : strerror(errno));
        return WEFT_ERR_TRANSPORT;
    }
    if (dst == NULL) {
        snprintf(err, len, "rank %d of %d sent data out of turn during the %s", m->rank, r->nranks, during);
        return WEFT_ERR_INTERNAL;
    }
    if (m->frame_got < FRAME_BYTES) {
        m->frame_got += (size_t)k;
        if (m->frame_got < FRAME_BYTES)
            return WEFT_SUCCESS;
        uint32_t op = get32(m->frame);
        uint64_t bytes = get64(m->frame + 8);
        if (op == OP_DONE && bytes == 0 && r->op == 0) {
            /* Its comm exists: what it needed from the root is over. */
            m->done = 1;
            conn_close(m);
            r->ndone++;
            return WEFT_SUCCESS;
        }
        if (op < OP_ALLGATHER || op > OP_MAX || bytes > UID_MAX_CONTRIB || (op == OP_MAX && bytes != 8) ||
            (op == OP_ALLTOALL && bytes % (uint64_t)r->nranks != 0) ||
            (op == OP_ALLGATHER && bytes * (uint64_t)r->nranks > UID_MAX_CONTRIB)) {
            snprintf(err, len, "rank %d of %d sent a malformed request (%s of %llu bytes)", m->rank, r->nranks,
                     op_name(op), (unsigned long long)bytes);
            return WEFT_ERR_INTERNAL;
        }
        if (r->ndone > 0) {
            snprintf(err, len, "rank %d of %d asked for a %s after other ranks had finished", m->rank, r->nranks,
                     op_name(op));
            return WEFT_ERR_INTERNAL;
        }
        if (r->op == 0) {
            r->op = op;
            r->op_bytes = bytes;
            r->op_first = m->rank;
        } else if (op != r->op || bytes != r->op_bytes) {
            snprintf(err, len, "the ranks' set-up steps differ: rank %d asked for a %s of %llu bytes, rank %d for a "
                     "%s of %llu bytes", m->rank, op_name(op), (unsigned long long)bytes, r->op_first,
                     op_name(r->op), (unsigned long long)r->op_bytes);
            return WEFT_ERR_INTERNAL;
        }
        m->data_bytes = (size_t)bytes;
        m->data_got = 0;
        m->data = malloc(bytes ? (size_t)bytes : 1);
        if (m->data == NULL) {
            snprintf(err, len, "the unique id's root %s: no memory for rank %d's %llu bytes", r->addr, m->rank,
                     (unsigned long long)bytes);
            return WEFT_ERR_NO_MEMORY;
        }
    } else {
        m->data_got += (size_t)k;
    }
    if (m->data_got < m->data_bytes)
        return WEFT_SUCCESS;
    m->contributed = 1;
    r->contributed++;
    r->last = weft_now();
    if (r->contributed == r->nranks)
        return root_answer(r, err, len);
    root_progress(r, m, 1);
    return WEFT_SUCCESS;
}

/* The relayed ops, until every rank said `created`. */
static int root_ops(struct root *r, char *err, size_t len)
{
    struct pollfd *pf = calloc((size_t)r->nranks, sizeof(*pf));
    int *who = calloc((size_t)r->nranks, sizeof(*who));
    int rc = WEFT_SUCCESS;

    if (pf == NULL || who == NULL) {
        snprintf(err, len, "the unique id's root %s: no memory for %d ranks", r->addr, r->nranks);
        rc = WEFT_ERR_NO_MEMORY;
    }
    while (rc == WEFT_SUCCESS && r->ndone < r->nranks) {
        double deadline = r->timeout > 0 ? r->last + r->timeout : 0;
        int n = 0;
        for (int q = 0; q < r->nranks; q++)
            if (r->member[q]->fd >= 0) {
                who[n] = q;
                pf[n++] = (struct pollfd){ .fd = r->member[q]->fd, .events = POLLIN, .revents = 0 };
            }
        int t = ms_until(deadline);
        int got = t == 0 ? 0 : poll(pf, (nfds_t)n, t);
        if (got < 0 && errno != EINTR) {
            snprintf(err, len, "the unique id's root %s: poll failed: %s", r->addr, strerror(errno));
            rc = WEFT_ERR_INTERNAL;
            break;
        }
        if (got == 0 && deadline > 0 && weft_now() >= deadline) {
            if (r->ndone > 0) {
                /* Every rank passed the last agreement: the comm exists
                 * everywhere; a rank that never said so is no failure. */
                WEFT_INFO(-1, "the unique id's root %s: %d of %d ranks never said their comm was made; leaving",
                          r->addr, r->nranks - r->ndone, r->nranks);
                break;
            }
            int nm = 0;
            for (int q = 0; q < r->nranks; q++)
                if (!r->member[q]->contributed)
                    who[nm++] = q;
            char list[160];
            format_ranks(list, sizeof(list), who, nm);
            snprintf(err, len, "%s of %d sent nothing for %g s during the %s (step %lu of the meeting at the unique "
                     "id's root %s)", list, r->nranks, r->timeout, r->op ? op_name(r->op) : "set-up",
                     r->op_count + 1, r->addr);
            rc = WEFT_ERR_TIMEOUT;
            break;
        }
        for (int i = 0; i < n && got > 0 && rc == WEFT_SUCCESS; i++)
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR))
                rc = root_read_op(r, r->member[who[i]], err, len);
    }
    free(who);
    free(pf);
    return rc;
}

/* The meeting failed: every rank that said its rank gets the text (code,
 * ERR), and latecomers that prove the token get it too, for up to
 * WEFT_TIMEOUT, so no rank learns less than "the root is gone". */
static void root_fail(struct root *r, int code, const char *text)
{
    size_t tlen = strlen(text);
    unsigned char f[FRAME_BYTES];
    int told = 0;
    unsigned char *seen = r->nranks > 0 ? calloc((size_t)r->nranks, 1) : NULL;
    /* With WEFT_TIMEOUT=0 (never) the ranks still get a while to read it. */
    double until = weft_now() + r->tell;
    struct pollfd *pf = NULL;

    put32(f, REPLY_ERR);
    put32(f + 4, (uint32_t)code);
    put64(f + 8, tlen);
    WEFT_INFO(-1, "the unique id's root %s: the meeting failed: %s", r->addr, text);
    for (;;) {
        /* Tell whoever said its rank and was not told yet; then only wait
         * for them to close (closing first could reset the connection and
         * drop the text unread). */
        for (int i = 0; i < r->nconns; i++) {
            struct conn *c = r->conns[i];
            if (c->fd < 0 || c->done || c->told || c->hello_got < HELLO_BYTES)
                continue;
            if (send_all(c->fd, f, sizeof(f), UID_ERR_SEND_S) == 0)
                (void)send_all(c->fd, text, tlen, UID_ERR_SEND_S);
            shutdown(c->fd, SHUT_WR);
            c->told = 1;
            if (seen && c->rank >= 0 && c->rank < r->nranks && !seen[c->rank]) {
                seen[c->rank] = 1;
                told++;
            }
        }
        int open = 0;
        for (int i = 0; i < r->nconns; i++)
            open += r->conns[i]->fd >= 0;
        if ((open == 0 && (r->nranks == 0 || told >= r->nranks || r->listen_fd < 0)) || weft_now() >= until)
            break;
        struct pollfd *more = realloc(pf, (size_t)(r->nconns + 1) * sizeof(*pf));
        if (more == NULL)
            break;
        pf = more;
        int n = 0;
        pf[n++] = (struct pollfd){ .fd = r->listen_fd, .events = POLLIN, .revents = 0 };
        for (int i = 0; i < r->nconns; i++)
            pf[n++] = (struct pollfd){ .fd = r->conns[i]->fd, .events = POLLIN, .revents = 0 };
        if (poll(pf, (nfds_t)n, ms_until(until)) <= 0)
            continue;
        for (int i = n - 2; i >= 0; i--) {
            struct conn *c = r->conns[i];
            if (c->fd < 0 || !(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (c->hello_got < HELLO_BYTES) {
                char ignore[256];
                int h = root_read_hello(r, c, ignore, sizeof(ignore));
                if (h == HELLO_REFUSED)
                    conn_close(c);
                continue;   /* a complete hello, whatever it says, gets the text above */
            }
            char drain[512];
            ssize_t k = recv(c->fd, drain, sizeof(drain), 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
                conn_close(c);
        }
        if (r->listen_fd >= 0 && (pf[0].revents & POLLIN)) {
            char ignore[256];
            (void)root_accept(r, ignore, sizeof(ignore));
        }
    }
    free(pf);
    free(seen);
}

static void *root_main(void *arg)
{
    struct root *r = arg;
    char err[700] = "";

    int rc = root_join(r, err, sizeof(err));
    if (rc == WEFT_SUCCESS)
        rc = root_ops(r, err, sizeof(err));
    if (rc != WEFT_SUCCESS) {
        if (r->nranks == 0)   /* nobody came: the id just expired */
            WEFT_INFO(-1, "the unique id's root %s: expired unused: %s", r->addr, err);
        else
            root_fail(r, rc, err);
    }
    root_free(r);
    return NULL;
}

int weft_uid_make(weft_unique_id_t *id, const struct weft_settings *settings)
{
    struct weft_config cfg;
    char err[256];
    struct in_addr ip;
    struct sockaddr_in sa;
    weft_unique_id_t out;
    struct root *r;
    int rc;

    if (weft_config_load(&cfg, weft_settings_lookup, (void *)settings, err, sizeof(err)) != WEFT_SUCCESS)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_get_unique_id: bad configuration: %s", err);
    switch (weft_netif_resolve_ipv4(cfg.tcp_if, &ip)) {
    case WEFT_NETIF_OK:
        break;
    case WEFT_NETIF_LOOPBACK:
        WEFT_INFO(-1, "weft_get_unique_id: no UP non-loopback IPv4 interface, the root listens on 127.0.0.1 "
                  "(ranks on other hosts cannot reach it; set WEFT_TCP_IF)");
        break;
    case WEFT_NETIF_NO_MATCH:
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_get_unique_id: WEFT_TCP_IF=%s is neither an IPv4 "
                              "address nor an interface with one", cfg.tcp_if);
    case WEFT_NETIF_GETIFADDRS:
    default:
        return weft_set_error(NULL, WEFT_ERR_TRANSPORT, "weft_get_unique_id: getifaddrs failed: %s", strerror(errno));
    }

    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return weft_set_error(NULL, WEFT_ERR_NO_MEMORY, "weft_get_unique_id: no memory for the root");
    r->timeout = weft_wait_bound(&cfg, WEFT_WAIT_UID_ROOT);
    r->tell = weft_housekeeping_bound(&cfg, WEFT_KEEP_UID_TELL);
    if (getrandom(r->token, sizeof(r->token), 0) != (ssize_t)sizeof(r->token)) {
        /* No entropy source: time and pid still make a collision between
         * two jobs' ids unlikely; the token guards mistakes, not attackers. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t t = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
        memcpy(r->token, &t, sizeof(t));
    }

    r->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r->listen_fd < 0) {
        rc = weft_set_error(NULL, WEFT_ERR_TRANSPORT, "weft_get_unique_id: socket() failed: %s", strerror(errno));
        goto fail_root;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr = ip;
    format_sockaddr((struct sockaddr *)&sa, r->addr, sizeof(r->addr));
    if (bind(r->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        rc = weft_set_error(NULL, WEFT_ERR_TRANSPORT, "weft_get_unique_id: bind to %s failed: %s", r->addr,
                            strerror(errno));
        goto fail_socket;
    }
    /* Every rank may connect at once, before the root thread runs. */
    socklen_t salen = sizeof(sa);
    if (listen(r->listen_fd, 4096) != 0 || getsockname(r->listen_fd, (struct sockaddr *)&sa, &salen) != 0) {
        rc = weft_set_error(NULL, WEFT_ERR_TRANSPORT, "weft_get_unique_id: listen on %s failed: %s", r->addr,
                            strerror(errno));
        goto fail_socket;
    }
    format_sockaddr((struct sockaddr *)&sa, r->addr, sizeof(r->addr));
    uid_encode(&out, r->token, &sa);
    r->last = weft_now();

    /* The root thread runs with every signal blocked, so the application's
     * handlers keep running on its own threads. */
    pthread_attr_t attr;
    pthread_t tid;
    sigset_t all, old;
    char addr[sizeof(r->addr)];
    snprintf(addr, sizeof(addr), "%s", r->addr);   /* r belongs to the thread once it runs */
    sigfillset(&all);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&tid, &attr, root_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (e != 0) {
        rc = weft_set_error(NULL, WEFT_ERR_INTERNAL, "weft_get_unique_id: cannot start the root thread: %s",
                            strerror(e));
        goto fail_socket;
    }
    WEFT_INFO(-1, "weft_get_unique_id: the root listens on %s (one meeting; expires after %g s without a rank "
              "joining)", addr, r->timeout);
    memcpy(id, &out, sizeof(out));
    return WEFT_SUCCESS;

fail_socket:
    close(r->listen_fd);
fail_root:
    free(r);
    return rc;
}

/* ----------------------------------------------------------- the ranks' side -- */

struct boot_uid {
    struct weft_bootstrap b;
    int                   fd;
    double                window;   /* WEFT_TIMEOUT + grace; 0 = never */
    char                  root[80];
    /* The root said the meeting failed (REPLY_ERR): its code and text.
     * It closes every connection after that, so any later request of this
     * rank (creation's agreement on the failure) gets the root's verdict
     * again instead of "lost the root" on the closed connection. */
    int                   failed_code;
    char                  failed_text[700];
};

/* The root's connection failed (e: UID_EOF, ETIMEDOUT or an errno) during stage. */
static int lost_root(struct boot_uid *u, const char *stage, int e)
{
    struct weft_core *core = u->b.core;
    if (e == ETIMEDOUT)
        return weft_set_error(core, WEFT_ERR_TIMEOUT, "weft_comm_init: the unique id's root at %s sent nothing "
                              "for %g s during the %s", u->root, u->window, stage);
    if (strcmp(stage, "join") == 0 && (e == UID_EOF || e == ECONNRESET))
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "weft_comm_init: the unique id's root at %s closed the "
                              "connection before the meeting began: it refuses a job token it did not make "
                              "(an id of another job, or a corrupted copy), or its process is gone", u->root);
    return weft_set_error(core, WEFT_ERR_TRANSPORT, "weft_comm_init: lost the unique id's root at %s during the "
                          "%s: %s (the process that called weft_get_unique_id exited?)", u->root, stage,
                          e == UID_EOF ? "connection closed" : strerror(e));
}

/* The text of the root's ERR frame (code, len bytes) read after its
 * header: kept as this rank's verdict of the meeting, and set as the
 * error. A text that cannot be read: lost_root. */
static int root_err(struct boot_uid *u, const char *stage, int code, uint64_t len, double window)
{
    char text[700];
    size_t keep = len < sizeof(text) - 1 ? (size_t)len : sizeof(text) - 1;
    int e = recv_all(u->fd, text, keep, window);
    if (e != 0)
        return lost_root(u, stage, e);
    text[keep] = '\0';
    /* A peer's number: a code no weft call returns is not passed on. */
    if (code <= WEFT_SUCCESS || code > WEFT_ERR_LAST)
        code = WEFT_ERR_INTERNAL;
    u->failed_code = code;
    snprintf(u->failed_text, sizeof(u->failed_text), "%s", text);
    return weft_set_error(u->b.core, code, "weft_comm_init: %s", text);
}

/* A send to the root failed (e): the root may have closed because the
 * meeting failed, its ERR frame still unread here (a rank killed while the
 * others were sending). That verdict, if it is there, rather than "lost
 * the root". */
static int send_failed(struct boot_uid *u, const char *stage, int e)
{
    unsigned char f[FRAME_BYTES];
    if (recv_all(u->fd, f, sizeof(f), UID_VERDICT_WAIT_S) == 0 && get32(f) == REPLY_ERR)
        return root_err(u, stage, (int)(int32_t)get32(f + 4), get64(f + 8), UID_VERDICT_WAIT_S);
    return lost_root(u, stage, e);
}

/* Reads the root's frames until the answer: want bytes into out. PROGRESS
 * frames restart the wait; ERR ends the meeting with the root's text. */
static int rank_reply(struct boot_uid *u, const char *stage, void *out, size_t want)
{
    struct weft_core *core = u->b.core;
    unsigned char f[FRAME_BYTES];
    for (;;) {
        int e = recv_all(u->fd, f, sizeof(f), u->window);
        if (e != 0)
            return lost_root(u, stage, e);
        uint32_t kind = get32(f);
        int code = (int)(int32_t)get32(f + 4);
        uint64_t len = get64(f + 8);
        if (kind == REPLY_PROGRESS && len == 0)
            continue;
        if (kind == REPLY_ERR)
            return root_err(u, stage, code, len, u->window);
        if (kind != REPLY_OK || len != want)
            return weft_set_error(core, WEFT_ERR_INTERNAL, "weft_comm_init: the unique id's root at %s answered the "
                                  "%s with a malformed frame (kind %u, %llu bytes; %zu expected)", u->root, stage,
                                  kind, (unsigned long long)len, want);
        e = want ? recv_all(u->fd, out, want, u->window) : 0;
        return e != 0 ? lost_root(u, stage, e) : WEFT_SUCCESS;
    }
}

static int rank_request(struct boot_uid *u, uint32_t op, const void *payload, size_t bytes, void *out,
                        size_t out_bytes)
{
    unsigned char f[FRAME_BYTES];
    put32(f, op);
    put32(f + 4, 0);
    put64(f + 8, bytes);
    if (u->failed_code != WEFT_SUCCESS)
        return weft_set_error(u->b.core, u->failed_code, "weft_comm_init: %s", u->failed_text);
    if (u->fd < 0)
        return weft_set_error(u->b.core, WEFT_ERR_INTERNAL, "weft_comm_init: %s after the meeting ended",
                              op_name(op));
    int e = send_all(u->fd, f, sizeof(f), u->window);
    if (e == 0 && bytes > 0)
        e = send_all(u->fd, payload, bytes, u->window);
    if (e != 0)
        return send_failed(u, op_name(op), e);
    return rank_reply(u, op_name(op), out, out_bytes);
}

static int uid_allgather(struct weft_bootstrap *b, const void *mine, void *all, size_t bytes)
{
    return rank_request((struct boot_uid *)b, OP_ALLGATHER, mine, bytes, all, bytes * (size_t)b->size);
}

static int uid_alltoall(struct weft_bootstrap *b, const void *send, void *recv, size_t bytes)
{
    size_t total = bytes * (size_t)b->size;
    return rank_request((struct boot_uid *)b, OP_ALLTOALL, send, total, recv, total);
}

static int uid_max(struct weft_bootstrap *b, long long *value)
{
    unsigned char v[8], best[8];
    put64(v, (uint64_t)*value);
    int rc = rank_request((struct boot_uid *)b, OP_MAX, v, sizeof(v), best, sizeof(best));
    if (rc == WEFT_SUCCESS)
        *value = (long long)(int64_t)get64(best);
    return rc;
}

/* Creation succeeded everywhere: the root may let this rank go. */
static void uid_created(struct weft_bootstrap *b)
{
    struct boot_uid *u = (struct boot_uid *)b;
    unsigned char f[FRAME_BYTES];
    put32(f, OP_DONE);
    put32(f + 4, 0);
    put64(f + 8, 0);
    if (u->fd >= 0) {
        (void)send_all(u->fd, f, sizeof(f), UID_ERR_SEND_S);   /* a root that is gone has nothing to free */
        close(u->fd);
        u->fd = -1;
    }
}

static void uid_destroy(struct weft_bootstrap *b)
{
    struct boot_uid *u = (struct boot_uid *)b;
    if (u->fd >= 0)
        close(u->fd);
    free(u);
}

static const struct weft_bootstrap_ops uid_ops = {
    .name = "unique id",
    .allgather = uid_allgather,
    .alltoall = uid_alltoall,
    .barrier = NULL,   /* destroy's barrier goes over the comm's pipes */
    .max = uid_max,
    .created = uid_created,
    .destroy = uid_destroy,
};

/* Connects to the root, bounded by the window; refused connections are
 * retried a few times within about a second (UID_CONNECT_TRIES). */
static int rank_connect(struct boot_uid *u, const struct uid_decoded *d)
{
    struct weft_core *core = u->b.core;
    for (int tries = 1;; tries++) {
        int fd = socket(d->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return weft_set_error(core, WEFT_ERR_TRANSPORT, "weft_comm_init: socket() failed: %s", strerror(errno));
        int e = 0;
        if (connect(fd, (const struct sockaddr *)&d->sa, d->salen) != 0) {
            e = errno;
            if (e == EINPROGRESS || e == EINTR) {
                struct pollfd pf = { .fd = fd, .events = POLLOUT, .revents = 0 };
                double deadline = u->window > 0 ? weft_now() + u->window : 0;
                int got;
                do
                    got = poll(&pf, 1, ms_until(deadline));
                while (got < 0 && errno == EINTR);
                socklen_t el = sizeof(e);
                if (got == 0)
                    e = ETIMEDOUT;
                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
                    e = errno;
            }
        }
        if (e == 0) {
            tune_socket(fd);
            u->fd = fd;
            return WEFT_SUCCESS;
        }
        close(fd);
        if (e == ECONNREFUSED && tries < UID_CONNECT_TRIES) {
            weft_nap_us((long)(UID_CONNECT_RETRY_S * 1e6));
            continue;
        }
        return weft_set_error(core, e == ETIMEDOUT ? WEFT_ERR_TIMEOUT : WEFT_ERR_TRANSPORT,
                              "weft_comm_init: cannot reach the unique id's root at %s: %s", d->text, strerror(e));
    }
}

struct uid_args {
    const weft_unique_id_t *id;
    int                     nranks, rank;
};

static const char *no_env(const char *name, void *ctx)
{
    (void)name;
    (void)ctx;
    return NULL;
}

static int make_uid_boot(void *arg, struct weft_core *core, struct weft_bootstrap **out)
{
    const struct uid_args *a = arg;
    struct uid_decoded d;
    struct weft_config cfg;
    char why[256];
    struct boot_uid *u;
    int rc;

    /* Errors from here on name this rank. */
    core->rank = a->rank;
    core->size = a->nranks;
    rc = uid_decode(a->id, &d, why, sizeof(why));
    if (rc != WEFT_SUCCESS)
        return weft_set_error(core, rc, "weft_comm_init: %s", why);
    /* A malformed WEFT_* is reported by the assembly on every rank, after
     * the meeting; until then the defaults bound the waits. */
    if (weft_config_load(&cfg, weft_settings_lookup, core->settings, why, sizeof(why)) != WEFT_SUCCESS)
        (void)weft_config_load(&cfg, no_env, NULL, why, sizeof(why));

    u = calloc(1, sizeof(*u));
    if (u == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "weft_comm_init: no memory for the bootstrap");
    u->b.ops = &uid_ops;
    u->b.core = core;
    u->b.rank = a->rank;
    u->b.size = a->nranks;
    u->fd = -1;
    /* A little longer than the root's own bound, so that the root, which
     * knows which ranks are missing, speaks first (deadline.c). */
    u->window = weft_wait_bound(&cfg, WEFT_WAIT_UID_RANK);
    snprintf(u->root, sizeof(u->root), "%s", d.text);

    rc = rank_connect(u, &d);
    if (rc != WEFT_SUCCESS)
        goto fail_boot;
    unsigned char hello[HELLO_BYTES] = { 0 };
    memcpy(hello, uid_magic, 4);
    hello[4] = UID_VERSION;
    memcpy(hello + 8, d.token, 8);
    put32(hello + 16, (uint32_t)a->rank);
    put32(hello + 20, (uint32_t)a->nranks);
    int e = send_all(u->fd, hello, sizeof(hello), u->window);
    rc = e != 0 ? lost_root(u, "join", e) : rank_reply(u, "join", NULL, 0);
    if (rc != WEFT_SUCCESS)
        goto fail_socket;
    WEFT_TRACE(a->rank, "weft_comm_init: all %d ranks joined at the unique id's root %s", a->nranks, u->root);
    *out = &u->b;
    return WEFT_SUCCESS;

fail_socket:
    close(u->fd);
fail_boot:
    free(u);
    return rc;
}

int weft_comm_init_uid(const weft_unique_id_t *id, int nranks, int rank, const struct weft_settings *settings,
                       struct weft_comm **out)
{
    struct uid_args a = { .id = id, .nranks = nranks, .rank = rank };
    return weft_comm_assemble("weft_comm_init", make_uid_boot, &a, settings, out);
}
