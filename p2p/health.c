/*
 * Peer health (see health.h).
 */
#include "health.h"
#include "backoff.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <time.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "context.h"
#include "log.h"
#include "pipe.h"
#include "deadline.h"

/* How often a waiter looks at its peers, and the grace a live peer gets
 * before a request it does not serve fails (a notice about a third rank
 * may be on its way: the rank that saw the failure decides at about the
 * same moment). */
#define HEALTH_PERIOD_S 0.05
#define GRACE_S         0.5

enum { LIVE_ALIVE = 0, LIVE_DEAD, LIVE_STOPPED, LIVE_SILENT };

static int pidfd_open_compat(int pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

void weft_health_connect(struct weft_p2p *p, const unsigned char *cards, size_t card_bytes)
{
    const struct weft_card_hdr *me = (const void *)(cards + (size_t)p->rank * card_bytes);
    double now = weft_now();
    for (int i = 0; i < p->size; i++) {
        struct weft_peer_pipe *pp = &p->pipes[i];
        const struct weft_card_hdr *h = (const void *)(cards + (size_t)i * card_bytes);
        pp->pid = h->pid;
        pp->pidfd = -1;
        pp->heard_at = now;
        pp->hb_at = now;
        /* Same real host (WEFT_VIRTUAL_NODES splits one host into fake
         * nodes; the processes are still ours to look at). */
        pp->same_host = h->node_key == me->node_key && i != p->rank;
        if (pp->same_host && pp->pid > 0)
            pp->pidfd = pidfd_open_compat(pp->pid);
    }
}

void weft_health_fini(struct weft_p2p *p)
{
    for (int i = 0; p->pipes && i < p->size; i++)
        if (p->pipes[i].pidfd >= 0) {
            close(p->pipes[i].pidfd);
            p->pipes[i].pidfd = -1;
        }
}

/* The state letter of /proc/<pid>/stat, or 0. */
static char proc_state(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *e = strrchr(buf, ')');   /* the command name may hold spaces */
    return e && e[1] == ' ' ? e[2] : 0;
}

static int process_gone(const struct weft_peer_pipe *pp)
{
    if (pp->pidfd >= 0) {
        struct pollfd pf = { pp->pidfd, POLLIN, 0 };
        return poll(&pf, 1, 0) > 0;
    }
    return kill(pp->pid, 0) != 0 && errno == ESRCH;
}

/* Whether a same-host peer's process has ended, a zombie included (a pidfd
 * turns readable then; without one, /proc says so). 0 for other hosts. */
static int peer_process_ended(const struct weft_peer_pipe *pp)
{
    if (!pp->same_host || pp->pid <= 0)
        return 0;
    if (process_gone(pp))
        return 1;
    if (pp->pidfd >= 0)
        return 0;
    char st = proc_state(pp->pid);
    return st == 'Z' || st == 'X' || st == 0;
}

/* What we know of the peer's liveness; why says how we know. */
static int probe(struct weft_p2p *p, int peer, double now, char *why, size_t n)
{
    struct weft_peer_pipe *pp = &p->pipes[peer];
    if (pp->same_host && pp->pid > 0) {
        char st = process_gone(pp) ? 'X' : proc_state(pp->pid);
        if (st == 'X' || st == 'Z' || st == 0) {
            snprintf(why, n, "its process (pid %d on this host) died", pp->pid);
            return LIVE_DEAD;
        }
        if (st == 'T' || st == 't') {
            snprintf(why, n, "its process (pid %d on this host) is stopped (state %c: a signal or a debugger)",
                     pp->pid, st);
            return LIVE_STOPPED;
        }
        snprintf(why, n, "its process (pid %d) is running (state %c)", pp->pid, st);
        return LIVE_ALIVE;
    }
    if (pp->heard != pp->heard_seen) {
        pp->heard_seen = pp->heard;
        pp->heard_at = now;
    }
    if (weft_wait_expired(&p->core->cfg, WEFT_WAIT_PEER_SILENT, pp->heard_at, now)) {
        snprintf(why, n, "nothing, not even a heartbeat, came from it (another host) for %.1f s: stopped, hung "
                 "or unreachable", now - pp->heard_at);
        return LIVE_SILENT;
    }
    snprintf(why, n, "heard from %.1f s ago", now - pp->heard_at);
    return LIVE_ALIVE;
}

static void notice_send(struct weft_p2p *p, int to, int kind, int about, int code, uint64_t seq, const char *text)
{
    struct weft_peer_pipe *pp = &p->pipes[to];
    struct weft_wire_hdr h;
    size_t len = strlen(text) + 1;

    if (to == p->rank || pp->broken || pp->carrier.tp == NULL)
        return;
    if (len > WEFT_WIRE_NOTICE_TEXT_MAX)
        len = WEFT_WIRE_NOTICE_TEXT_MAX;
    char buf[WEFT_WIRE_NOTICE_TEXT_MAX];
    memcpy(buf, text, len);
    buf[len - 1] = '\0';
    memset(&h, 0, sizeof(h));
    h.type = WEFT_WIRE_NOTICE;
    h.aux = (uint32_t)kind;
    h.status = code;
    h.addr = (uint64_t)(int64_t)about;
    h.seq = seq;
    if (weft_pipe_send_oob(pp, &h, buf, len) == WEFT_EAGAIN)
        weft_pipe_send_ctrl(pp, &h, buf, len);   /* queued: behind our own frames */
}

void weft_health_tick(struct weft_p2p *p, double now)
{
    if (now - p->health_at < HEALTH_PERIOD_S)
        return;
    p->health_at = now;
    double hb = weft_heartbeat_period(&p->core->cfg);
    for (int i = 0; i < p->size; i++) {
        struct weft_peer_pipe *pp = &p->pipes[i];
        if (i == p->rank || pp->failed)
            continue;
        if (pp->broken) {
            /* A link that went down while its same-host peer still looked
             * alive (weft_health_link_failed): the peer may die later, and
             * then it is a failed rank (destroy's barrier must not wait for
             * it). Only its process is looked at: a broken pipe carries
             * nothing. */
            if (peer_process_ended(pp)) {
                char why[128];
                snprintf(why, sizeof(why), "its process (pid %d on this host) died after its link went down", pp->pid);
                weft_health_declare(p, i, WEFT_ERR_TRANSPORT, why, 0);
            }
            continue;
        }
        if (pp->heard != pp->heard_seen) {
            pp->heard_seen = pp->heard;
            pp->heard_at = now;
        }
        if (pp->same_host) {
            if (pp->pidfd >= 0 && process_gone(pp)) {
                char why[128];
                snprintf(why, sizeof(why), "its process (pid %d on this host) died", pp->pid);
                weft_health_declare(p, i, WEFT_ERR_TRANSPORT, why, 0);
            }
            continue;
        }
        /* Only pipes in use: something went either way, or a receive is
         * posted for the peer (a lane exists). A heartbeat is a message,
         * and a message makes a lazy connection: beating every pipe would
         * connect every pair on other hosts at the first wait. The peer
         * beats back once it has heard from us. */
        if (pp->send_seq == 0 && pp->heard == 0 && pp->nlanes == 0)
            continue;
        if (now - pp->hb_at >= hb) {
            struct weft_wire_hdr h;
            memset(&h, 0, sizeof(h));
            h.type = WEFT_WIRE_HEARTBEAT;
            pp->hb_at = now;
            (void)weft_pipe_send_oob(pp, &h, NULL, 0);   /* no room: the next one */
        }
    }
}

void weft_health_watch_processes(struct weft_p2p *p)
{
    for (int i = 0; i < p->size; i++) {
        struct weft_peer_pipe *pp = &p->pipes[i];
        if (i != p->rank && !pp->failed && peer_process_ended(pp)) {
            char why[128];
            snprintf(why, sizeof(why), "its process (pid %d on this host) died", pp->pid);
            weft_health_declare(p, i, WEFT_ERR_TRANSPORT, why, 0);
        }
    }
}

void weft_health_declare(struct weft_p2p *p, int rank, int code, const char *why, int from_notice)
{
    struct weft_peer_pipe *pp = &p->pipes[rank];
    char text[WEFT_WIRE_NOTICE_TEXT_MAX];

    if (rank == p->rank || pp->failed)
        return;
    pp->failed = 1;
    p->nfailed++;
    weft_p2p_fault_epoch_bump(p);
    char pw[32];
    weft_parent_words(p->core, rank, pw, sizeof pw);
    if (from_notice)
        snprintf(text, sizeof(text), "%s", why);
    else
        snprintf(text, sizeof(text), "%s (detected by rank %d)", why, p->rank);
    snprintf(pp->fail_why, sizeof(pp->fail_why), "rank %d%s failed: %s", rank, pw, text);
    if (p->fault_rank < 0) {
        p->fault_rank = rank;
        p->fault_code = code;
        snprintf(p->fault_why, sizeof(p->fault_why), "rank %d%s failed: %s", rank, pw, text);
    }
    weft_set_error(p->core, code, "rank %d%s failed: %s", rank, pw, text);
    if (!from_notice)
        for (int i = 0; i < p->size; i++)
            if (i != rank && !p->pipes[i].failed)
                notice_send(p, i, WEFT_NOTICE_RANK_FAILED, rank, code, 0, text);
    weft_pipe_break(pp, code);
}

/* The link between ranks a and b broke while both processes live (this
 * rank is one of them, or a notice said so). The comm's collectives
 * cannot run as they are: like a failed rank, it faults the comm, with a
 * text every rank words alike; every rank keeps the link, and
 * weft_comm_shrink leaves out, from all the links known, the rank with
 * the most of them (src/comm/shrink.c).
 * tp: the transport's name. An end (seen: what its transport saw, which
 * its own texts keep after the common words) tells every other rank. */
static void link_down(struct weft_p2p *p, int a, int b, int code, const char *tp, const char *seen)
{
    char text[WEFT_WIRE_NOTICE_TEXT_MAX], pa[32], pb[32];
    if (a > b) {
        int t = a;
        a = b;
        b = t;
    }
    for (int i = 0; i < p->nlinks; i++)
        if (p->links[i][0] == a && p->links[i][1] == b)
            return;   /* known: the other end's notice, or ours came back */
    if (p->nlinks < WEFT_P2P_LINKS_MAX) {
        p->links[p->nlinks][0] = a;
        p->links[p->nlinks][1] = b;
        p->nlinks++;
    }
    weft_parent_words(p->core, a, pa, sizeof pa);
    weft_parent_words(p->core, b, pb, sizeof pb);
    snprintf(text, sizeof text, "the %s link between rank %d%s and rank %d%s broke while both processes live", tp, a,
             pa, b, pb);
    if (a == p->rank || b == p->rank)   /* the pipe's own failure says it too, with what was seen here */
        snprintf(p->pipes[a == p->rank ? b : a].fail_why, sizeof p->pipes[0].fail_why, "%s%s%s", text,
                 seen ? "; this rank saw: " : "", seen ? seen : "");
    if (p->fault_rank < 0) {
        p->fault_rank = b;
        p->fault_code = code;
        snprintf(p->fault_why, sizeof(p->fault_why), "%s", text);
    }
    if (seen)   /* (a notice's link is news for later calls: fault_why, not this rank's current error) */
        weft_set_error(p->core, code, "%s; this rank saw: %s", text, seen);
    weft_p2p_fault_epoch_bump(p);
    if (seen) {
        const int other = a == p->rank ? b : a;
        for (int i = 0; i < p->size; i++)
            if (i != other && !p->pipes[i].failed)
                notice_send(p, i, WEFT_NOTICE_LINK_DOWN, other, code, 0, tp);
    }
}

#define LINK_DEATH_WAIT_MS 1000

void weft_health_link_failed(struct weft_p2p *p, int rank, int code, const char *why)
{
    struct weft_peer_pipe *pp = &p->pipes[rank];
    if (__atomic_load_n(&p->core->leaving, __ATOMIC_ACQUIRE)) {
        /* Destroy's last round: a peer that has finished it closes its
         * links, and its last message came before the close. Not a failure
         * to look into (the 1 s look below would stall every destroy). */
        weft_pipe_break(pp, code);
        return;
    }
    if (pp->same_host && pp->pid > 0 && !process_gone(pp)) {
        /* A killed process closes its sockets while it exits, before it
         * becomes a zombie: a reset can come while it still looks alive.
         * Exiting takes milliseconds; a live process with only this link
         * down keeps running. Look again for up to LINK_DEATH_WAIT_MS (a loaded
         * 2-core machine took more than 250 ms once). */
        int ended = 0;
        for (int ms = 0;; ms += 5) {
            /* One reading decides: the process may end between two
             * looks (a state read as running, then a pidfd turned
             * readable), and the verdict must follow the later one. */
            char st = process_gone(pp) ? 'X' : proc_state(pp->pid);
            ended = st == 0 || st == 'Z' || st == 'X';
            if (ended || ms >= LINK_DEATH_WAIT_MS)
                break;
            weft_nap_us(5000);
        }
        if (!ended) {
            /* A link failure, not the peer's: every rank learns of it (a
             * pipe that breaks after another fault -- a transfer given up
             * when the call failed -- too: the shrink must leave one of
             * its ranks out, since the new comm uses the old pipes). */
            pp->link_down = 1;
            weft_pipe_break(pp, code);
            link_down(p, p->rank, rank, code, weft_pipe_tp_name(pp), why);
            return;
        }
    }
    weft_health_declare(p, rank, code, why, 0);
}

void weft_health_settle(struct weft_p2p *p, int peer, int code)
{
    struct weft_peer_pipe *pp = &p->pipes[peer];
    char why[512], text[256];
    if (pp->broken || peer == p->rank)
        return;
    /* The transport recorded what it saw; keep it. */
    weft_error_last_reason(p->core, text, sizeof(text));
    snprintf(why, sizeof(why), "its %s link to this rank failed (%s): %s", weft_pipe_tp_name(pp), weft_err_str(code),
             text);
    weft_health_link_failed(p, peer, code, why);
}

/* How often a stalled collective receive asks its peer again. */
#define ASK_PERIOD_S 1.0

/* "call 7 (reduce(4 x int32, sum, root 1))"; "stream call 3 (...)" for the
 * stream-ordered collectives' numbering. */
static void describe_head(const struct weft_p2p *p, const struct weft_p2p_check *c, char *out, size_t n)
{
    char what[160] = "";
    if (p->describe_check)
        p->describe_check(c, what, sizeof what);
    snprintf(out, n, what[0] ? "%scall %u (%s)" : "%scall %u", weft_p2p_check_stream(c) ? "stream " : "",
             weft_p2p_check_call(c), what);
}

/* Whether a peer's answered head is of r's numbering (the answer to a
 * COLL_ASK comes from the head of the space asked about). */
static int same_space(const struct weft_p2p_check *a, const struct weft_p2p_check *b)
{
    return weft_p2p_check_stream(a) == weft_p2p_check_stream(b);
}

/* What the peer of r answered about its newest collective, in words for a
 * timeout's message ("" when it has not answered since r asked). */
static void head_words(const struct weft_p2p *p, const struct weft_request *r, char *out, size_t n)
{
    const struct weft_peer_pipe *pp = r->pipe;
    char theirs[200];

    out[0] = '\0';
    if (!r->checked || r->asked_at == 0 || pp->head_at < r->asked_at || pp->head_state == 0 ||
        (pp->head_state == 1 && !same_space(&pp->head, &r->check)))
        return;
    if (pp->head_state == 2) {
        snprintf(out, n, "; asked, peer %d says it has started no collective on this comm", pp->peer);
        return;
    }
    uint32_t mine = weft_p2p_check_call(&r->check), at = weft_p2p_check_call(&pp->head);
    describe_head(p, &pp->head, theirs, sizeof theirs);
    if ((int32_t)(at - mine) < 0)
        snprintf(out, n, "; asked, peer %d says its newest collective is %s: it has not called call %u yet",
                 pp->peer, theirs, mine);
    else if (at == mine)
        snprintf(out, n, "; asked, peer %d says it is in this call too, %s", pp->peer, theirs);
    else
        snprintf(out, n, "; asked, peer %d says it is past this call, at %s", pp->peer, theirs);
}

int weft_health_coll_suspect(struct weft_p2p *p, struct weft_request *r, double now)
{
    struct weft_peer_pipe *pp = r->pipe;
    int peer = pp->peer;

    if (!r->checked || r->type != WEFT_REQ_RECV || r->state == WEFT_REQ_DONE || peer == p->rank || pp->broken ||
        pp->failed)
        return 0;
    if (r->asked_at != 0 && pp->head_at >= r->asked_at && pp->head_state == 1 &&
        weft_p2p_check_key(&pp->head) == weft_p2p_check_key(&r->check) &&
        memcmp(&pp->head, &r->check, sizeof(pp->head)) != 0) {
        char mine[200], theirs[200];
        describe_head(p, &r->check, mine, sizeof mine);
        describe_head(p, &pp->head, theirs, sizeof theirs);
        const struct weft_p2p_check expected = r->check;
        r->check = pp->head;   /* what the collective reads back: the peer's call */
        if (weft_pipe_cancel(r, WEFT_ERR_MISMATCH)) {
            weft_set_error(p->core, WEFT_ERR_MISMATCH,
                           "recv from peer %d tag %d: no message for %.1f s, and peer %d, asked, is in the same "
                           "collective call with another operation: this rank %s, peer %d %s", peer, r->tag,
                           now - r->idle_since, peer, mine, peer, theirs);
            return 1;
        }
        r->check = expected;   /* bound to a message of the peer's after all: its own check decides */
        return 0;
    }
    if (r->asked_at != 0 && now - r->asked_at < ASK_PERIOD_S)
        return 0;
    r->asked_at = now;
    pp->asked_at = now;
    notice_send(p, peer, WEFT_NOTICE_COLL_ASK, p->rank, WEFT_SUCCESS, weft_p2p_check_key(&r->check), "");
    return 0;
}

static const char *req_verb(const struct weft_request *r)
{
    switch (r->state) {
    case WEFT_REQ_QUEUED: return "send (not yet out: no room or no credit) to";
    case WEFT_REQ_POSTED: return r->type == WEFT_REQ_SEND ? "send (announced, not answered) to" : "recv from";
    case WEFT_REQ_ACTIVE: return r->type == WEFT_REQ_SEND ? "send (data moving) to" : "recv (data moving) from";
    default:              return r->type == WEFT_REQ_SEND ? "send to" : "recv from";
    }
}

/* ---- agreed verdicts: the census of a stalled collective ----
 *
 * A collective's request that reached WEFT_TIMEOUT with its peer alive and
 * no rank failed cannot tell whom to blame from its own pipe: its peer is
 * often a live rank in the same call, itself waiting for the one that is
 * behind. So the rank asks every other rank which collective it is in
 * (NOTICE COLL_ASK: the notice path, no data lane), and judges their
 * answers when the request's grace ends:
 *
 *   answer                          verdict
 *   an older call, or none          it has not called this one (behind)
 *   this call, another operation    the ranks called different operations
 *   none within the grace           probed: died or stopped -> declared
 *                                   failed as any failed rank; running ->
 *                                   outside weft on this comm, so not in
 *                                   this call either
 *   this call or a later one, all   no rank is behind: the old message
 *                                   (the peer is alive, did not serve it)
 *
 * Every waiting rank asks the same ranks and hears the same answers, and
 * the first verdict also goes to every rank as the call's failure notice
 * (census_decided), so the survivors all name the same ranks. */

static void census_start(struct weft_p2p *p, uint64_t call, double now)
{
    if (p->census_at > 0 && p->census_call == call && now - p->census_at < GRACE_S)
        return;   /* asked already, for another request of this call */
    p->census_call = call;
    p->census_at = now;
    for (int i = 0; i < p->size; i++) {
        struct weft_peer_pipe *pp = &p->pipes[i];
        if (i == p->rank || pp->failed || pp->broken)
            continue;
        pp->asked_at = now;
        notice_send(p, i, WEFT_NOTICE_COLL_ASK, p->rank, WEFT_SUCCESS, call, "");
    }
}

static void append(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *out, size_t n, const char *fmt, ...)
{
    size_t used = strlen(out);
    if (used + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + used, n - used, fmt, ap);
    va_end(ap);
}

/* At the end of r's grace, with its census asked: 0 when no rank is behind
 * or elsewhere (the caller words the old timeout); a rank found dead or
 * stopped is declared failed (p->fault_rank then says so, return 0);
 * else 1 with *code and the verdict in out. Ranks outside weft come first
 * (the likely cause: the others behind may wait for them), then ranks
 * behind that answered, then ranks in the call with another operation --
 * a notice carries only the first WEFT_WIRE_NOTICE_TEXT_MAX bytes. */
static int census_judge(struct weft_p2p *p, const struct weft_request *r, double now, char *out, size_t n,
                        int *code)
{
    const uint64_t call = weft_p2p_check_key(&r->check);
    const uint32_t num = weft_p2p_check_call(&r->check);
    char mine[200], theirs[200], why[200];
    int behind = 0, other = 0;

    if (p->census_at <= 0 || p->census_call != call)
        return 0;
    describe_head(p, &r->check, mine, sizeof mine);
    snprintf(out, n, "%s cannot complete:", mine);
    for (int pass = 0; pass < 3; pass++)
        for (int i = 0; i < p->size; i++) {
            struct weft_peer_pipe *pp = &p->pipes[i];
            if (i == p->rank || pp->failed || pp->broken)
                continue;
            const int answered = pp->head_state != 0 && pp->head_at >= p->census_at &&
                                 (pp->head_state == 2 || same_space(&pp->head, &r->check));
            const char *sep = behind + other ? ";" : "";
            char pw[32];
            weft_parent_words(p->core, i, pw, sizeof pw);
            if (!answered && pass == 0) {
                int live = probe(p, i, now, why, sizeof why);
                if (live != LIVE_ALIVE) {
                    weft_health_declare(p, i, live == LIVE_DEAD ? WEFT_ERR_TRANSPORT : WEFT_ERR_TIMEOUT, why, 0);
                    return 0;   /* a failed rank: its verdict, on every rank */
                }
                append(out, n, "%s rank %d%s is not in it (asked, it did not answer within %.1f s: %s; so it makes "
                       "no weft call on this comm)", sep, i, pw, now - p->census_at, why);
                behind++;
            } else if (answered && pass == 1 && pp->head_state == 2) {
                append(out, n, "%s rank %d%s has not called it (asked, it has started no collective on this "
                       "comm)", sep, i, pw);
                behind++;
            } else if (answered && pass == 1 && pp->head_state == 1 &&
                       (int32_t)(weft_p2p_check_call(&pp->head) - num) < 0) {
                describe_head(p, &pp->head, theirs, sizeof theirs);
                append(out, n, "%s rank %d%s has not called it (asked, its newest collective is %s)", sep, i, pw,
                       theirs);
                behind++;
            } else if (answered && pass == 2 && pp->head_state == 1 && weft_p2p_check_key(&pp->head) == call &&
                       memcmp(&pp->head, &r->check, sizeof pp->head) != 0) {
                describe_head(p, &pp->head, theirs, sizeof theirs);
                append(out, n, "%s rank %d%s is in it with another operation, %s", sep, i, pw, theirs);
                other++;
            }
        }
    if (behind + other == 0)
        return 0;
    *code = other && !behind ? WEFT_ERR_MISMATCH : WEFT_ERR_TIMEOUT;
    return 1;
}

/* Whether this rank's census of call heard every live rank answer from
 * that call or a later one (no rank is missing: the stall is a link). */
static int census_all_in(const struct weft_p2p *p, uint64_t call)
{
    if (p->census_at <= 0 || p->census_call != call)
        return 0;
    const int stream = (int)(call >> 32);
    for (int i = 0; i < p->size; i++) {
        const struct weft_peer_pipe *pp = &p->pipes[i];
        if (i == p->rank || pp->failed || pp->broken)
            continue;
        if (pp->head_state != 1 || pp->head_at < p->census_at || weft_p2p_check_stream(&pp->head) != stream ||
            (int32_t)(weft_p2p_check_call(&pp->head) - (uint32_t)call) < 0)
            return 0;
    }
    return 1;
}

/* This rank's census decided that call cannot complete: the verdict is
 * the call's failure note here (first word stands, as a peer's would) and
 * goes to every rank; the fault epoch wakes the collective, which fails
 * with it, withdraws, and leaves what only a rank outside weft could
 * answer (collectives/coll_sched.c). */
static void census_decided(struct weft_p2p *p, uint64_t call, int code, const char *verdict)
{
    struct weft_coll_note *c = &p->cnotes[(uint32_t)call % WEFT_TAG_COLL_SLOTS];
    if (c->from >= 0 && c->seq == call)
        return;   /* a peer's word came first: it stands */
    c->seq = call;
    c->code = code;
    c->from = p->rank;
    snprintf(c->text, sizeof c->text, "%s", verdict);
    weft_health_coll_failed(p, call, code, verdict);
    weft_p2p_fault_epoch_bump(p);
}

int weft_health_stuck(struct weft_p2p *p, struct weft_request *r, double now, double idle, const char *what)
{
    struct weft_peer_pipe *pp = r->pipe;
    int peer = pp->peer, code;
    char why[200];

    int live = peer == p->rank ? LIVE_ALIVE : probe(p, peer, now, why, sizeof(why));
    if (live != LIVE_ALIVE) {
        code = live == LIVE_DEAD ? WEFT_ERR_TRANSPORT : WEFT_ERR_TIMEOUT;
        weft_health_declare(p, peer, code, why, 0);
        weft_set_error(p->core, code, "%s: %s peer %d tag %d (%zu B over %s) made no progress for %.1f s: %s", what,
                       req_verb(r), peer, r->tag, r->bytes, weft_pipe_tp_name(pp), idle, p->fault_why[0] ? p->fault_why : why);
        if (r->state != WEFT_REQ_DONE)
            weft_pipe_break(pp, code);
        return 1;
    }
    if (p->fault_rank < 0 && r->grace_until == 0) {
        r->grace_until = now + GRACE_S;
        if (r->checked)
            census_start(p, weft_p2p_check_key(&r->check), now);
        return 0;
    }
    if (p->fault_rank < 0 && now < r->grace_until)
        return 0;
    /* A collective's request, its call not yet known failed: the census
     * names who is not in it. (Once it failed, the collective withdraws
     * its requests; one still waited for -- data moving -- is judged as
     * below.) */
    if (p->fault_rank < 0 && r->checked && weft_health_coll_note(p, weft_p2p_check_key(&r->check)) == NULL) {
        const uint64_t call = weft_p2p_check_key(&r->check);
        char verdict[WEFT_WIRE_NOTICE_TEXT_MAX];
        if (census_judge(p, r, now, verdict, sizeof verdict, &code)) {
            WEFT_INFO(p->rank, "%s: %s; found when this rank's %s peer %d tag %d (%zu B over %s) made no progress "
                      "for %.1f s", what, verdict, req_verb(r), peer, r->tag, r->bytes, weft_pipe_tp_name(pp), idle);
            census_decided(p, call, code, verdict);
            return 0;
        }
        if (p->fault_rank >= 0)
            return 0;   /* the census found a rank dead or stopped: the next look words it */
    }
    if (p->fault_rank >= 0 && r->type == WEFT_REQ_SEND && r->state == WEFT_REQ_POSTED) {
        /* Announced to a live peer, unanswered, while another rank failed:
         * the peer's call fails over that rank too, and then refuses this
         * lane, answering the announcement (a refusing FIN) -- usually
         * within milliseconds, but the clocks of both can run out at the
         * same time. Breaking the pipe now would cut two live ranks apart
         * (a shrink would then leave one of them out); it breaks only if
         * the peer stays silent for another WEFT_TIMEOUT. */
        double t = weft_timeout_setting(&p->core->cfg);
        if (r->fault_grace_until == 0 && t > 0) {
            r->fault_grace_until = now + t;
            return 0;
        }
        if (now < r->fault_grace_until)
            return 0;
    }
    if (p->fault_rank >= 0) {
        code = p->fault_code;
        weft_set_error(p->core, code, "%s: %s peer %d tag %d (%zu B over %s) made no progress for %.1f s (peer "
                       "%d is alive: %s); %s", what, req_verb(r), peer, r->tag, r->bytes, weft_pipe_tp_name(pp), idle, peer, why, p->fault_why);
    } else {
        char head[300];
        head_words(p, r, head, sizeof head);
        if (r->checked && census_all_in(p, weft_p2p_check_key(&r->check)))
            snprintf(head + strlen(head), sizeof head - strlen(head), "; asked, every rank is in this call or past "
                     "it: the link between rank %d and rank %d stalled while both live", peer, p->rank);
        code = WEFT_ERR_TIMEOUT;
        weft_set_error(p->core, code, "%s: %s peer %d tag %d (%zu B over %s) made no progress for %.1f s; peer "
                       "%d is alive (%s) but did not serve it (WEFT_TIMEOUT=%g)%s", what, req_verb(r), peer, r->tag,
                       r->bytes, weft_pipe_tp_name(pp), idle, peer, why, weft_timeout_setting(&p->core->cfg), head);
    }
    /* Withdraw the request alone; one that was moving data and stalled
     * leaves its pipe in an unknown state, which then breaks. */
    if (!weft_pipe_cancel(r, code))
        weft_pipe_break(pp, code);
    return 1;
}

int weft_p2p_peer_stuck(struct weft_p2p *p, int peer, char *why, size_t n)
{
    int code = WEFT_SUCCESS;
    if (peer < 0 || peer >= p->size || peer == p->rank) {
        snprintf(why, n, "not a peer");
        return WEFT_SUCCESS;
    }
    weft_p2p_lock(p);
    int live = probe(p, peer, weft_now(), why, n);
    if (live != LIVE_ALIVE) {
        code = live == LIVE_DEAD ? WEFT_ERR_TRANSPORT : WEFT_ERR_TIMEOUT;
        weft_health_declare(p, peer, code, why, 0);
    }
    weft_p2p_unlock(p);
    return code;
}

void weft_health_on_notice(struct weft_peer_pipe *pp, const struct weft_wire_hdr *h, const char *text, size_t len)
{
    struct weft_p2p *p = pp->p2p;
    char msg[WEFT_WIRE_NOTICE_TEXT_MAX + 64];
    char t[WEFT_WIRE_NOTICE_TEXT_MAX];

    if (len > sizeof(t) - 1)
        len = sizeof(t) - 1;
    memcpy(t, text, len);
    t[len] = '\0';
    switch (h->aux) {
    case WEFT_NOTICE_RANK_FAILED: {
        int about = (int)(int64_t)h->addr;
        if (about < 0 || about >= p->size)
            break;
        if (about == p->rank) {
            WEFT_WARN(p->rank, "rank %d reports this rank as failed: %s", pp->peer, t);
            break;
        }
        snprintf(msg, sizeof(msg), "%s, as reported by rank %d", t, pp->peer);
        /* A peer's number: a code no weft call returns is not passed on. */
        weft_health_declare(p, about, h->status > WEFT_SUCCESS && h->status <= WEFT_ERR_LAST ? h->status
                                                                                                 : WEFT_ERR_TRANSPORT,
                            msg, 1);
        break;
    }
    case WEFT_NOTICE_ABORTED:
        weft_health_declare(p, pp->peer, WEFT_ERR_ABORTED, "it called weft_comm_abort", 1);
        break;
    case WEFT_NOTICE_LINK_DOWN: {
        /* A peer's words: a rank in range, not the sender, and a
         * transport name of letters and digits, else ignored. */
        int about = (int)(int64_t)h->addr;
        int ok = about >= 0 && about < p->size && about != pp->peer && t[0] != '\0' && strlen(t) < 16;
        for (const char *q = t; ok && *q; q++)
            ok = (*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '_';
        if (ok)
            link_down(p, pp->peer, about, h->status > WEFT_SUCCESS && h->status <= WEFT_ERR_LAST ? h->status
                                                                                               : WEFT_ERR_TRANSPORT,
                      t, NULL);
        break;
    }
    case WEFT_NOTICE_REVOKED: {
        int by = (int)(int64_t)h->addr;
        if (by < 0 || by >= p->size)
            by = pp->peer;   /* a number no rank has: the sender stands for it */
        weft_health_revoke(p, by, t);
        break;
    }
    case WEFT_NOTICE_COLL_ASK: {
        /* The peer's collective receive from us stalls: our newest call of
         * the numbering it asks about (seq: its call key, p2p.h). */
        char words[64] = "none";
        const int stream = (int)(h->seq >> 32 & 1);
        const struct weft_p2p_check *head = stream ? &p->scoll_head : &p->coll_head;
        if (stream ? p->scoll_head_set : p->coll_head_set)
            snprintf(words, sizeof words, "%llx %llx %llx", (unsigned long long)head->w[0],
                     (unsigned long long)head->w[1], (unsigned long long)head->w[2]);
        notice_send(p, pp->peer, WEFT_NOTICE_COLL_HEAD, p->rank, WEFT_SUCCESS, h->seq, words);
        break;
    }
    case WEFT_NOTICE_COLL_HEAD: {
        /* A peer's text: exactly "none" or three hexadecimal words, else
         * ignored (no verdict is built on what cannot be read). */
        struct weft_p2p_check c;
        char *end = t;
        int ok = 1;
        if (strcmp(t, "none") == 0) {
            pp->head_state = 2;
            pp->head_at = weft_now();
            break;
        }
        for (int i = 0; i < 3 && ok; i++) {
            const char *start = end;
            errno = 0;
            unsigned long long v = strtoull(start, &end, 16);
            ok = end != start && errno == 0;
            c.w[i] = v;
        }
        if (!ok || *end != '\0')
            break;
        pp->head = c;
        pp->head_state = 1;
        pp->head_at = weft_now();
        break;
    }
    case WEFT_NOTICE_COLL_FAILED: {
        /* seq: the call key (p2p.h), its numbering above the number. */
        struct weft_coll_note *c = &p->cnotes[(uint32_t)h->seq % WEFT_TAG_COLL_SLOTS];
        if (c->from >= 0 && c->seq == h->seq)
            break;   /* this call was reported already: the first word stands */
        c->seq = h->seq;
        /* A peer's number: a code no weft call returns is not passed on. */
        c->code = h->status > WEFT_SUCCESS && h->status <= WEFT_ERR_LAST ? h->status : WEFT_ERR_INTERNAL;
        c->from = pp->peer;
        snprintf(c->text, sizeof(c->text), "%s", t);
        /* Passed on once to every other peer: the rank that decided it may
         * have no link yet to some (pairs connect at their first message)
         * and may not call into weft again for a while; a rank that has
         * one still carries the news. */
        for (int i = 0; i < p->size; i++)
            if (i != pp->peer && !p->pipes[i].failed)
                notice_send(p, i, WEFT_NOTICE_COLL_FAILED, (int)(int64_t)h->addr, c->code, c->seq, c->text);
        weft_p2p_fault_epoch_bump(p);   /* wakes collectives waiting on it */
        break;
    }
    default:
        break;
    }
}

void weft_health_abort(struct weft_p2p *p)
{
    for (int i = 0; i < p->size; i++)
        if (!p->pipes[i].failed)
            notice_send(p, i, WEFT_NOTICE_ABORTED, p->rank, WEFT_ERR_ABORTED, 0, "weft_comm_abort");
    for (int i = 0; i < p->size; i++)
        weft_pipe_break(&p->pipes[i], WEFT_ERR_ABORTED);
    weft_p2p_fault_epoch_bump(p);
}

void weft_health_revoke(struct weft_p2p *p, int by, const char *why)
{
    if (__atomic_load_n(&p->core->revoked, __ATOMIC_ACQUIRE))
        return;   /* once: the notices below go out once per rank */
    __atomic_store_n(&p->core->revoked, by + 1, __ATOMIC_RELEASE);
    snprintf(p->revoke_why, sizeof(p->revoke_why), "the comm was revoked by rank %d%s%s%s", by,
             by == p->rank ? "" : " (weft_comm_revoke there)", why[0] ? ": " : "", why);
    WEFT_INFO(p->rank, "%s", p->revoke_why);
    /* Every rank that learns it tells all the others: a revoker that dies
     * after telling one rank still reaches every survivor. */
    for (int i = 0; i < p->size; i++)
        if (!p->pipes[i].failed)
            notice_send(p, i, WEFT_NOTICE_REVOKED, by, WEFT_ERR_REVOKED, 0, why);
    for (int i = 0; i < p->size; i++)
        weft_pipe_revoke(&p->pipes[i]);
    weft_set_error(p->core, WEFT_ERR_REVOKED, "%s", p->revoke_why);
    weft_p2p_fault_epoch_bump(p);   /* collectives in flight end (weft_p2p_fault) */
}

void weft_health_coll_failed(struct weft_p2p *p, uint64_t seq, int code, const char *text)
{
    for (int i = 0; i < p->size; i++)
        if (!p->pipes[i].failed)
            notice_send(p, i, WEFT_NOTICE_COLL_FAILED, p->rank, code, seq, text);
}

const struct weft_coll_note *weft_health_coll_note(const struct weft_p2p *p, uint64_t seq)
{
    const struct weft_coll_note *c = &p->cnotes[(uint32_t)seq % WEFT_TAG_COLL_SLOTS];
    return c->from >= 0 && c->seq == seq ? c : NULL;
}
