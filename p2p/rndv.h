/*
 * Rendezvous paths: how the data of a large message moves once sender and
 * receiver have met (RTS matched to a receive). The receiver asks each path
 * of the table, in priority order, whether it applies to (pipe, sender's
 * memory, receiver's memory) and starts the first that takes it; its CTS
 * names the path (wire aux) and carries the path's key, so the sender
 * starts the same path. p2p/pipe.c knows paths only through this table.
 *
 *   id  path     applies when                                   moves by
 *   1   mover    both buffers device, the pipe's carrier is     the pipe's mover (cuda_ipc): the
 *                node-local and a mover reaches the peer        sender's GPU writes the receive
 *                (the mover may still decline a transfer)       buffer; sender's pipe sends FIN
 *   2   native   the carrier's rendezvous reads/writes both     the carrier: pull (rndv_get, FIN)
 *                memory kinds (host; GPUDirect on ib; self       or push (rndv_expect -> CTS key
 *                with CUDA)                                     -> rndv_push)
 *   3   staged   a device buffer on either side                 chunks through pinned host memory
 *                                                               on internal lanes (p2p/stage.c)
 */
#ifndef WEFT_RNDV_H
#define WEFT_RNDV_H

#include <stddef.h>
#include "pipe.h"

struct weft_p2p;

struct weft_rndv_path {
    const char *name;
    /* Sender, optional: what the receiver needs to know from the sender for
     * this path, written into the RTS for s (staged: its chunk size). */
    void (*rts_fill)(const struct weft_peer_pipe *p, const struct weft_request *s, struct weft_wire_hdr *rts);
    /* Receiver: can this path move the message rts announces into r? */
    int  (*applies)(const struct weft_peer_pipe *p, const struct weft_request *r, const struct weft_wire_hdr *rts);
    /* Receiver: start. WEFT_SUCCESS: the path owns r's answer (it sent FIN
     * or CTS, or will); WEFT_EAGAIN: declined, try the next path; another
     * code: nothing was announced, the pipe refuses the message (FIN). */
    int  (*recv_start)(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *rts);
    /* Sender: the CTS naming this path arrived for s, with the path's key. */
    void (*send_start)(struct weft_peer_pipe *p, struct weft_request *s, const struct weft_wire_hdr *cts,
                       const void *key, size_t keylen);
    /* A transport finished r's transfer (its rndv_done upcall). */
    void (*xfer_done)(struct weft_peer_pipe *p, struct weft_request *r, int err);
    /* Optional, per comm: progress (called only while p2p->path_ops counts
     * transfers a path drives itself: a path counts its own), busy (destroy
     * drains), wakeless (waiters poll), and the pipe broke (let go of its
     * requests before they fail). */
    int  (*progress)(struct weft_p2p *p2p);
    int  (*busy)(struct weft_p2p *p2p);
    int  (*wakeless)(struct weft_p2p *p2p);
    void (*abort_pipe)(struct weft_peer_pipe *p);
};

/* The table, in priority order; path id on the wire = index + 1. */
extern const struct weft_rndv_path *const weft_rndv_paths[];
extern const int weft_rndv_npaths;

extern const struct weft_rndv_path weft_rndv_mover;
extern const struct weft_rndv_path weft_rndv_native;
extern const struct weft_rndv_path weft_rndv_staged;   /* p2p/stage.c */

/* The path of a wire id, NULL when there is none. */
static inline const struct weft_rndv_path *weft_rndv_path_of(unsigned id)
{
    return id >= 1 && (int)id <= weft_rndv_npaths ? weft_rndv_paths[id - 1] : NULL;
}
/* The wire id of a path of the table. */
unsigned weft_rndv_id(const struct weft_rndv_path *path);

/* Sender: every path's part of the RTS for s. */
void weft_rndv_rts_fill(const struct weft_peer_pipe *p, const struct weft_request *s, struct weft_wire_hdr *rts);
/* The sender's buffer as the RTS describes it. */
void weft_rndv_src(const struct weft_wire_hdr *rts, struct weft_tp_src *src);
/* A CTS answering rts for r, naming path, carrying key. */
void weft_rndv_send_cts(struct weft_peer_pipe *p, struct weft_request *r, const struct weft_wire_hdr *rts,
                        const struct weft_rndv_path *path, const void *key, size_t keylen);
/* FIN answering rts: the receiver pulled the data (status SUCCESS) or refused it. */
void weft_rndv_send_fin(struct weft_peer_pipe *p, const struct weft_wire_hdr *rts, int status);

#endif
