/*
 * The first bytes on every new TCP connection between two weft ranks.
 *
 * The connecting rank sends a hello; the accepting rank reads the token
 * first and checks it against its own job token (the one in its rank
 * card's header, which only ranks of this job received through the comm's
 * bootstrap) before it reads anything else, and closes the connection on a
 * mismatch. Only then is the rest of the hello read and checked (known
 * rank, socket index, same striping settings). The acceptor answers with
 * the connector's token, so the connector knows it reached the right rank
 * and not a stale listener, and a verdict: ACCEPT (the socket joins the
 * pair's set) or COLLIDE (both ranks started a set at once and the
 * acceptor's, the lower rank's, wins: the connector closes a data socket
 * and waits for the acceptor's set; a control socket both keep, as the
 * connector's channel for its control frames). A connector may send
 * control frames right after its hello (tcp.c: the socket survives either
 * way), rendezvous data only once the pair is up, so nothing ever travels
 * on a socket the other side drops.
 */
#ifndef WEFT_TCP_HELLO_H
#define WEFT_TCP_HELLO_H

#include <stddef.h>
#include <stdint.h>

struct weft_tcp_hello {
    uint64_t token;     /* the acceptor's job token, from its rank card's header */
    int32_t  rank;      /* connector's rank */
    int32_t  index;     /* 0 = control socket, 1..streams = data socket */
    uint32_t streams;   /* connector's WEFT_TCP_STREAMS */
    uint32_t eager_limit; /* connector's WEFT_TCP_EAGER (at most 4 MiB) */
    uint64_t chunk;     /* connector's WEFT_TCP_CHUNK_KB in bytes */
};

/* Verdicts of struct weft_tcp_ack. */
#define WEFT_TCP_ACK_ACCEPT  1
#define WEFT_TCP_ACK_COLLIDE 2

/* What the acceptor sends back once the hello passed its checks. */
struct weft_tcp_ack {
    uint64_t token;     /* the connector's job token */
    uint8_t  verdict;   /* WEFT_TCP_ACK_ACCEPT or WEFT_TCP_ACK_COLLIDE */
    uint8_t  pad[7];    /* zero */
};

#ifdef __cplusplus
extern "C" {
#endif

/* Reads (more of) a hello from the non-blocking socket fd into *h; *got
 * counts the bytes read so far (start at 0). Reads the 8-byte token alone
 * first and checks it against my_token before reading further, so nothing
 * past a wrong token is ever read. Returns 0 when the whole hello is in,
 * WEFT_EAGAIN (transport.h) when more bytes are needed, or
 * WEFT_ERR_TRANSPORT with the reason in why (wrong token, connection
 * closed, socket error). */
int weft_tcp_hello_recv(int fd, struct weft_tcp_hello *h, size_t *got, uint64_t my_token,
                        char *why, size_t whylen);

/* Checks a complete hello's other fields: rank in [0, size) and not mine,
 * index in [0, streams], and the same striping and eager settings as mine
 * (both ends must cut messages the same way). Returns 0 or
 * WEFT_ERR_TRANSPORT with the reason in why. */
int weft_tcp_hello_check(const struct weft_tcp_hello *h, int my_rank, int size,
                         unsigned streams, uint64_t chunk, uint32_t eager_limit,
                         char *why, size_t whylen);

#ifdef __cplusplus
}
#endif

#endif
