/*
 * The pipe's wire format: the header of every control frame two pipes
 * exchange. Transports carry these frames as opaque bytes
 * (p2p/transport/transport.h); only p2p/ reads them.
 *
 *   EAGER_SMALL  16-byte header + payload     sender -> receiver  eager message, no extras
 *   EAGER        full header + payload        sender -> receiver  eager message with flags/status
 *   RTS          full header                  sender -> receiver  a large message is announced
 *                (flag IOV)                   sender -> receiver  a vectored one: addr names its pieces
 *                (flag REDO)                  sender -> receiver  again, for the receive rreq already met:
 *                                                                 its mover could not take it, use another path
 *   CTS          full header + path key       receiver -> sender  "move it by this path, to this key"
 *   FIN          full header                  receiver -> sender  the receiver pulled it, or refused it;
 *                (flag TO_RECV)               sender -> receiver  a mover put it in place (or failed)
 *   CREDIT       full header                  receiver -> sender  flow control: bytes (cumulative) of the
 *                                                                 sender's messages consumed so far
 *   HEARTBEAT    full header                  either way          "still here" while waiting (other-host peers)
 *   NOTICE       full header + text           either way          a rank failed / aborted / a collective
 *                                                                 failed (aux = enum weft_wire_notice)
 *
 * EAGER and RTS with flag CHECK carry a 24-byte collective fingerprint
 * (struct weft_p2p_check, p2p/p2p.h) right after the header, before the
 * payload: the receive it meets compares it with its own.
 *
 * Flow control: every EAGER/RTS costs its payload + WEFT_WIRE_MSG_COST at
 * the receiver until a receive consumes it; a sender keeps what it sent
 * minus what the peer reported consumed (CREDIT) within WEFT_EAGER_WINDOW
 * and queues later messages until credit comes back.
 *
 * A small eager message fits one cache line with its header, which is why
 * EAGER_SMALL exists. Request ids are pool index + generation (p2p/request.h):
 * an id that names no live request of the pipe is a protocol error.
 */
#ifndef WEFT_WIRE_H
#define WEFT_WIRE_H

#include <stdint.h>
#include "transport.h"

enum weft_wire_type {
    WEFT_WIRE_EAGER_SMALL = 1,
    WEFT_WIRE_EAGER       = 2,
    WEFT_WIRE_RTS         = 3,
    WEFT_WIRE_CTS         = 4,
    WEFT_WIRE_FIN         = 5,
    WEFT_WIRE_CREDIT      = 6,
    WEFT_WIRE_HEARTBEAT   = 7,
    WEFT_WIRE_NOTICE      = 8
};

/* NOTICE kinds (hdr.aux). addr = the rank it is about; status = WEFT_* code;
 * seq = the collective's sequence (COLL_FAILED); payload = text. */
enum weft_wire_notice {
    WEFT_NOTICE_RANK_FAILED = 1,   /* a rank died, stopped or went silent */
    WEFT_NOTICE_ABORTED     = 2,   /* the sender called weft_comm_abort */
    WEFT_NOTICE_COLL_FAILED = 3,   /* a collective failed on the sender (mismatch) */
    /* A receive of a collective made no progress for a while: what is the
     * peer's newest collective? (seq = the asker's call number) */
    WEFT_NOTICE_COLL_ASK    = 4,
    /* The answer: text = the fingerprint of the newest collective the
     * sender has started, as three hexadecimal words, or "none". */
    WEFT_NOTICE_COLL_HEAD   = 5,
    /* The comm is revoked (weft_comm_revoke): addr = the rank that revoked
     * it; every rank that learns it tells all the others once. */
    WEFT_NOTICE_REVOKED     = 6,
    /* The sender's link to rank addr broke while both processes live
     * (p2p/health.c, link_down); text = the transport's name. */
    WEFT_NOTICE_LINK_DOWN   = 7
};
#define WEFT_WIRE_NOTICE_TEXT_MAX 240

/* What an EAGER/RTS costs the receiver while unexpected, besides its payload. */
#define WEFT_WIRE_MSG_COST 128

/* flags */
#define WEFT_WIRE_F_DEVICE  0x01  /* EAGER/RTS: the sender's buffer is CUDA device memory */
#define WEFT_WIRE_F_TO_RECV 0x02  /* FIN sent by the sender: rreq names the receive it completes */
#define WEFT_WIRE_F_CHECK   0x04  /* EAGER/RTS: a collective fingerprint follows the header */
#define WEFT_WIRE_F_SIGNALED 0x08 /* FIN with TO_RECV: the sender's GPU wrote the receive's signal slot */
#define WEFT_WIRE_F_REDO    0x10  /* RTS: the same message again, for the receive rreq names (p2p/rndv.c) */
#define WEFT_WIRE_F_IOV     0x40  /* RTS: a vectored host message (weft_p2p_isendv): addr is the sender's
                                   * array of aux struct weft_iov, the data those pieces end to end */
#define WEFT_WIRE_F_WITHDRAWN 0x20 /* EAGER of 0 bytes: a send withdrawn before it went (weft_pipe_cancel);
                                    * it keeps the sequence, the receiver drops it unmatched and uncharged */

struct weft_wire_small {
    uint8_t  type;        /* WEFT_WIRE_EAGER_SMALL */
    uint8_t  flags;
    uint16_t reserved;
    int32_t  tag;
    uint64_t seq;
};

struct weft_wire_hdr {
    uint8_t  type;
    uint8_t  flags;
    uint16_t device;      /* RTS with F_DEVICE: the sender's CUDA device ordinal (its numbering) */
    int32_t  status;      /* EAGER/CTS/FIN: WEFT_* code */
    int32_t  tag;
    uint32_t aux;         /* RTS: the sender's staging chunk (p2p/stage.c), 0 = any; with F_IOV: pieces;
                             CTS: rendezvous path id */
    uint64_t seq;         /* per-pipe send sequence of the message */
    uint64_t bytes;       /* message size */
    uint64_t sreq;        /* sender's request id */
    uint64_t rreq;        /* receiver's request id */
    uint64_t addr;        /* RTS: the sender's buffer address (pulls) */
};

_Static_assert(sizeof(struct weft_wire_small) == 16, "small eager header is 16 bytes");
_Static_assert(sizeof(struct weft_wire_hdr) == 56, "wire header layout");
_Static_assert(sizeof(struct weft_wire_hdr) + 24 <= WEFT_TP_CTRL_HDR_MAX, "header + fingerprint exceed what transports carry");
_Static_assert(WEFT_WIRE_NOTICE_TEXT_MAX <= WEFT_TP_CTRL_PAYLOAD_MIN, "notice text exceeds what transports carry");
#define WEFT_WIRE_CHECK_BYTES 24
_Static_assert(WEFT_WIRE_NOTICE < WEFT_TP_FRAME_TYPE_LIMIT, "frame types must stay below the transports' own");

#endif
