/*
 * Peer health: who is alive, who failed, and what a stuck request blames.
 *
 * A request that made no progress for WEFT_TIMEOUT (its pipe moved nothing:
 * p2p/progress.c) asks here whom to blame, and the answer comes from the
 * peer, not from the clock alone:
 *   same host   the peer's process: a pidfd (or kill 0) says it died;
 *               /proc/<pid>/stat says it is stopped (SIGSTOP, a debugger)
 *   other host  what we heard from it: a waiting rank sends a HEARTBEAT to
 *               every other-host peer a few times per WEFT_TIMEOUT, so a
 *               peer we heard nothing from for WEFT_TIMEOUT is stopped,
 *               hung or cut off, while one we did hear is alive and only
 *               busy waiting for someone else
 * A failed peer is declared once: its pipe breaks and every other connected
 * peer gets a NOTICE, so ranks that were waiting on a live rank blocked by
 * the failed one report the failed rank, not the live one, and no pipe
 * between live ranks breaks. A live peer that does not serve a request gets
 * a grace period (a notice about a third rank may be on its way), then the
 * request alone fails with WEFT_ERR_TIMEOUT; its pipe stays usable --
 * unless it belongs to a collective: then, during that grace, the rank asks
 * every rank which call it is in (the census, health.c), and a rank behind,
 * outside weft, or in the call with another operation is named as the
 * call's verdict, which every rank is told (agreed verdicts).
 *
 * Messages name the failed rank as "rank N failed: why" (detected by / as
 * reported by rank M), the form docs/troubleshooting.md explains.
 * Everything here runs with the p2p lock held.
 */
#ifndef WEFT_HEALTH_H
#define WEFT_HEALTH_H

#include <stddef.h>
#include <stdint.h>

struct weft_p2p;
struct weft_peer_pipe;
struct weft_request;
struct weft_wire_hdr;

/* After the card exchange: each peer's pid and whether it shares our host. */
void weft_health_connect(struct weft_p2p *p, const unsigned char *cards, size_t card_bytes);
void weft_health_fini(struct weft_p2p *p);
/* While waiting (rate-limited inside): heartbeats, deaths of same-host peers. */
void weft_health_tick(struct weft_p2p *p, double now);
/* Same-host peers whose process ended are declared failed; nothing is
 * read or sent on any pipe. For waits where the pipes must stay untouched
 * (destroy's final barrier: a peer that finished it closes its sockets). */
void weft_health_watch_processes(struct weft_p2p *p);
/* A transport lost its link to rank (connection closed, work request
 * failed). A same-host peer whose process still runs is alive: the pipe
 * breaks, and the link failure faults the comm on every rank (NOTICE
 * LINK_DOWN; weft_comm_shrink leaves a rank of it out). Otherwise the
 * peer is declared failed (died, or a remote peer that closed on us). */
void weft_health_link_failed(struct weft_p2p *p, int rank, int code, const char *why);
/* The pipe to peer failed (code): decide now, once, whether the peer
 * failed or only the link did (weft_health_link_failed), with the
 * transport's recorded text as the cause. The transport calls it (its
 * peer_failed upcall), and so does weft_pipe_break for a transport error
 * this side met first (a send that failed), so the requests it fails say
 * which. */
void weft_health_settle(struct weft_p2p *p, int peer, int code);
/* rank failed (code, why): break its pipe, tell the others (unless the
 * news came from a notice), bump p->fault_epoch (weft_p2p_fault_epoch_bump). */
void weft_health_declare(struct weft_p2p *p, int rank, int code, const char *why, int from_notice);
/* r made no progress for idle seconds (>= WEFT_TIMEOUT). 1: r completed
 * (failed) now; 0: its live peer gets a grace period first. */
int  weft_health_stuck(struct weft_p2p *p, struct weft_request *r, double now, double idle, const char *what);
/* A collective receive r (a checked one) whose pipe moved nothing for a
 * while, its peer alive: ask the peer which collective it is in (NOTICE
 * COLL_ASK, at most once a second per request), and judge its answer once
 * it came. The same call number with another fingerprint is a mismatch
 * the ranks would otherwise only time out on (different roots of a
 * reduce: each waits for a message the other never sends): r completes
 * with WEFT_ERR_MISMATCH carrying the peer's fingerprint, as if a message
 * of the peer's had met it, and the collective names both calls. 1: r
 * completed now. Anything else (the peer behind, or in the same call)
 * only words the timeout's message later (weft_health_stuck). */
int  weft_health_coll_suspect(struct weft_p2p *p, struct weft_request *r, double now);
/* A NOTICE frame from the pipe's peer. */
void weft_health_on_notice(struct weft_peer_pipe *pp, const struct weft_wire_hdr *h, const char *text, size_t len);
/* weft_comm_abort: tell every peer, break every pipe with WEFT_ERR_ABORTED. */
void weft_health_abort(struct weft_p2p *p);
/* The comm is revoked by rank `by` (this rank's weft_comm_revoke, or a
 * notice): once per rank, tell every live peer, end what waits on the
 * application's lanes (weft_pipe_revoke), bump the fault epoch. */
void weft_health_revoke(struct weft_p2p *p, int by, const char *why);
/* A collective (seq: its call key, p2p.h) failed here with code: tell
 * every live peer. */
void weft_health_coll_failed(struct weft_p2p *p, uint64_t seq, int code, const char *text);
/* The notice about collective seq (a call key) from another rank, or NULL. */
const struct weft_coll_note *weft_health_coll_note(const struct weft_p2p *p, uint64_t seq);

#endif
