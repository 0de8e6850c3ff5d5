/*
 * shm transport, the CMA path (the design is at the top of shm.c): a large
 * message moves with one copy, the receiver pulling from the sender's
 * buffer with process_vm_readv (rndv_get); from SHM_SPLIT_MIN up the
 * sender, idle while it waits for FIN, takes pieces of the same transfer
 * and writes them with process_vm_writev (struct shm_help_slot), so two
 * cores copy at once. A vectored message (pieces on either side,
 * struct weft_tp_xfer.iov, RTS flag IOV) moves the same way: both piece
 * lists go to the kernel in one call (cma_vec), the sender's read from it
 * first, and a shared pull's pieces are ranges of the message cut from
 * both lists by each side. Here also: allowing peers to read this process
 * (Yama's PR_SET_PTRACER), the probe of whether a peer's memory can be
 * read, and the fallback: rndv_get declines (WEFT_EAGAIN) when CMA is off,
 * refused or fails, and the sender then pushes through the ring (shm.c).
 *
 * Runs under the pipe layer's lock (transport.h), like the rest of shm.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backoff.h"
#include "cma.h"
#include "weft.h"
#include "core.h"
#include "log.h"
#include "shm_int.h"
#include "transport.h"
#include "tp_iov.h"
#include "deadline.h"

/* From here a pull may be shared (weft_shm_rndv_get says when): the
 * sender, waiting for FIN, copies pieces of the same transfer while the
 * receiver does, two cores at once. Below it one process_vm_readv on the
 * receiver's core is as fast. Was 256 KiB; measured since
 * (docs/benchmarks.md, "Shared pulls from 64 KiB"): a lone 64 KiB message
 * takes 0.8x, 128 KiB 0.7x the time of one core's pull. */
#define SHM_SPLIT_MIN ((size_t)64 << 10)
/* Below this a message of a stream may be pushed through the ring instead
 * of pulled (stream_push). */
#define SHM_STREAM_MAX ((size_t)256 << 10)

/* Lets peers pull from this process by CMA, when WEFT_SHM_CMA allows it. */
void weft_shm_cma_allow_peers(const struct weft_core *core)
{
    if (!core->cfg.shm_cma)
        return;
    /* With Yama ptrace_scope=1 a peer may only process_vm_readv us if
     * we name it a tracer; "any" because peers are not our children.
     * EINVAL means Yama is absent and nothing needs allowing. */
    if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0 && errno != EINVAL)
        WEFT_INFO(core->rank, "shm: prctl(PR_SET_PTRACER) failed: %s; peers may not pull by CMA",
                  strerror(errno));
}

/* Whether we may read the peer's memory: its blob says where its token is. */
int weft_shm_probe_cma(struct shm_state *st, struct shm_peer *peer)
{
    struct weft_core *core = shm_core(st);
    const struct shm_card card = read_card(st, peer->rank);
    if (!core->cfg.shm_cma || card.probe_addr == 0)
        return 0;
    uint64_t value = 0;
    struct iovec local = { &value, sizeof(value) };
    struct iovec remote = { (void *)(uintptr_t)card.probe_addr, sizeof(value) };
    ssize_t n = process_vm_readv(peer->pid, &local, 1, &remote, 1, 0);
    if (n != (ssize_t)sizeof(value)) {
        WEFT_TRACE(core->rank, "shm: peer %d: CMA probe failed: %s", peer->rank,
                   n < 0 ? strerror(errno) : "short read");
        return 0;
    }
    return value == card.token;
}

int weft_shm_cma_check(struct shm_state *st, char *why, size_t whylen)
{
    struct weft_core *core = shm_core(st);
    if (!core->cfg.shm_cma) {
        snprintf(why, whylen, "off (WEFT_SHM_CMA=0)");
        return 0;
    }
    pid_t child = fork();
    if (child < 0) {
        snprintf(why, whylen, "not tried: fork failed: %s", strerror(errno));
        return 0;
    }
    if (child == 0) {
        /* A process that is not this one's parent, as ranks are to each
         * other: the parent allowed it as create allows peers. */
        struct shm_peer peer;
        memset(&peer, 0, sizeof(peer));
        peer.rank = 0;
        peer.pid = getppid();
        errno = 0;
        int ok = weft_shm_probe_cma(st, &peer);
        int e = errno;
        _exit(ok ? 0 : e > 0 && e < 255 ? e : 255);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 1;
    weft_cma_refusal(WIFEXITED(status) && WEXITSTATUS(status) != 255 ? WEXITSTATUS(status) : 0, why, whylen);
    return 0;
}

/* Bytes [off, off + len) of a message between this process's pieces
 * (loc) and pid's (rem), by process_vm_readv (write 0: into loc) or
 * process_vm_writev (write 1: from loc). Pieces are struct weft_iov lists
 * (a plain buffer is a list of one); the kernel walks both lists. Returns 0
 * or an errno. */
static int cma_vec(pid_t pid, int write, const struct weft_iov *loc, size_t nloc, const struct weft_iov *rem,
                   size_t nrem, size_t off, size_t len)
{
    while (len > 0) {
        struct iovec l[WEFT_IOV_MAX], r[WEFT_IOV_MAX];
        int nl = weft_tp_iov_range(loc, nloc, off, len, l, WEFT_IOV_MAX);
        int nr = weft_tp_iov_range(rem, nrem, off, len, r, WEFT_IOV_MAX);
        ssize_t got = write ? process_vm_writev(pid, l, (unsigned long)nl, r, (unsigned long)nr, 0)
                            : process_vm_readv(pid, l, (unsigned long)nl, r, (unsigned long)nr, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got < 0 ? errno : EFAULT;
        off += (size_t)got;   /* a partial copy: the rest from where it stopped */
        len -= (size_t)got;
    }
    return 0;
}

/* The pieces of one side of a vectored message: n == 0, one buffer at
 * addr; else pid's array of n struct weft_iov at addr, read by CMA (also
 * from this process: an address a peer named must fault, not crash). *out
 * gets the count. Returns 0, an errno, or EPROTO: more than WEFT_IOV_MAX
 * pieces, or pieces that do not add up to total (a damaged announcement). */
static int read_pieces(pid_t pid, uint64_t addr, size_t n, size_t total, struct weft_iov *list, size_t *out)
{
    if (n == 0) {
        list[0].base = addr;
        list[0].len = total;
        *out = 1;
        return 0;
    }
    if (n > WEFT_IOV_MAX)
        return EPROTO;
    int e = weft_cma_copy(pid, 0, (char *)list, addr, n * sizeof(list[0]));
    if (e)
        return e;
    if (weft_tp_iov_bytes(list, n) != total)
        return EPROTO;
    *out = n;
    return 0;
}

/* Claims the next piece of the transfer open in h. Returns 1 with the
 * piece [*off, *off + *len) and both buffers, 0 when the slot is closed,
 * exhausted, or changed generation under us. */
static int help_claim(struct shm_help_slot *h, uint64_t *src, uint64_t *dst, size_t *off, size_t *len,
                      uint64_t *niov, uint64_t *total, uint64_t *gen)
{
    uint64_t w = atomic_load_explicit(&h->claim, memory_order_acquire);
    for (;;) {
        uint64_t idx = w & SHM_HELP_IDX_MASK;
        if (idx == SHM_HELP_CLOSED)
            return 0;
        /* acquire: if these show a newer transfer's values, the CAS below
         * sees that transfer's claim word and fails */
        uint64_t bytes = atomic_load_explicit(&h->bytes, memory_order_acquire);
        uint64_t piece = atomic_load_explicit(&h->piece, memory_order_acquire);
        uint64_t s = atomic_load_explicit(&h->src, memory_order_acquire);
        uint64_t d = atomic_load_explicit(&h->dst, memory_order_acquire);
        uint64_t v = atomic_load_explicit(&h->niov, memory_order_acquire);
        if (piece == 0 || idx >= (bytes + piece - 1) / piece)
            return 0;
        if (atomic_compare_exchange_weak_explicit(&h->claim, &w, w + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *off = (size_t)(idx * piece);
            *len = (size_t)(bytes - idx * piece < piece ? bytes - idx * piece : piece);
            *src = s;
            *dst = d;
            *niov = v;
            *total = bytes;
            *gen = w >> SHM_HELP_IDX_BITS;
            return 1;
        }
    }
}

/* Receiver side: when the claim index still stands at expect (the pieces
 * this side took; the sender took none), claims every piece left at once.
 * Returns 1 with the range [*off, total), 0 when the sender took a piece. */
static int help_claim_rest(struct shm_help_slot *h, uint64_t expect, size_t total, size_t piece, size_t *off,
                           size_t *len)
{
    uint64_t w = atomic_load_explicit(&h->claim, memory_order_acquire);
    uint64_t n = (total + piece - 1) / piece;
    if ((w & SHM_HELP_IDX_MASK) != expect || expect >= n ||
        !atomic_compare_exchange_strong_explicit(&h->claim, &w, (w & ~SHM_HELP_IDX_MASK) | n,
                                                 memory_order_acq_rel, memory_order_acquire))
        return 0;
    *off = (size_t)(expect * piece);
    *len = total - *off;
    return 1;
}

/* Sender side, from progress: copy pieces of a transfer the peer opened
 * from our buffer straight into its buffer. */
int weft_shm_help_peer(struct shm_state *st, struct shm_peer *peer)
{
    struct shm_help_slot *h = peer->help_out;
    /* an aborted peer (broken pipe) may have failed the send whose buffer
     * the slot names */
    if (h == NULL || !peer->cma_ok || peer->help_broken || peer->aborted ||
        (atomic_load_explicit(&h->claim, memory_order_relaxed) & SHM_HELP_IDX_MASK) == SHM_HELP_CLOSED)
        return 0;
    int n = 0;
    uint64_t src, dst, niov, total, gen, lists_gen = UINT64_MAX;
    size_t off, len, nmine = 0, ntheirs = 0;
    struct weft_iov mine[WEFT_IOV_MAX], theirs[WEFT_IOV_MAX];
    while (help_claim(h, &src, &dst, &off, &len, &niov, &total, &gen)) {
        int e = 0;
        if (niov == 0) {
            e = weft_cma_copy(peer->pid, 1, (char *)(uintptr_t)(src + off), dst + off, len);
        } else {
            /* a vectored message: both piece lists, once per transfer (they
             * stay valid while we hold a claimed piece: the receiver waits
             * for it before its receive, or our send, can complete) */
            if (gen != lists_gen) {
                e = read_pieces(getpid(), src, niov & 0xffffffffu, total, mine, &nmine);
                if (e == 0)
                    e = read_pieces(peer->pid, dst, niov >> 32, total, theirs, &ntheirs);
                lists_gen = e == 0 ? gen : UINT64_MAX;
            }
            if (e == 0)
                e = cma_vec(peer->pid, 1, mine, nmine, theirs, ntheirs, off, len);
        }
        if (e) {
            /* hand the piece back; the receiver reads it itself */
            atomic_store_explicit(&h->redo_off, off, memory_order_relaxed);
            atomic_store_explicit(&h->redo_len, len, memory_order_relaxed);
            peer->help_broken = 1;
            WEFT_INFO(shm_core(st)->rank, "peer %d: process_vm_writev failed (%s); the peer pulls alone from now on",
                      peer->rank, strerror(e));
        }
        /* release: our bytes (or the redo note) are visible before the count */
        atomic_fetch_add_explicit(&h->copied, len, memory_order_release);
        n++;
        if (e)
            break;
    }
    return n;
}

/* Receiver side: opens the shared transfer, copies pieces until none are
 * left, then waits for the sender's pieces in flight. Returns 0, an errno
 * from our own copy (nothing of the sender's is still in flight then), or
 * -1 when the sender's pieces did not land within the timeout, ESRCH when
 * the sender's process is gone. */
static int cma_pull_shared(struct shm_state *st, struct shm_peer *peer, const struct weft_tp_xfer *x,
                           const struct weft_tp_src *sx, const struct weft_iov *from, size_t nfrom,
                           const struct weft_iov *to, size_t nto)
{
    size_t total = x->bytes;
    uint64_t src = sx->addr, dst = x->niov ? (uint64_t)(uintptr_t)x->iov : (uint64_t)(uintptr_t)x->buf;
    const struct weft_config *cfg = &shm_core(st)->cfg;
    struct shm_help_slot *h = peer->help_in;
    /* a piece of ~1/8 of the message, 64 KiB .. 1 MiB: enough pieces for
     * both sides to share, few enough that the syscalls do not show; and
     * at most half of it, so that a message below 128 KiB still has a
     * piece for each side (the halves rounded to pages) */
    size_t piece = ((total / 8) + 4095) & ~(size_t)4095;
    piece = piece < ((size_t)64 << 10) ? (size_t)64 << 10 : piece > ((size_t)1 << 20) ? (size_t)1 << 20 : piece;
    if (piece > total / 2)
        piece = ((total / 2) + 4095) & ~(size_t)4095;

    uint64_t gen = (atomic_load_explicit(&h->claim, memory_order_relaxed) >> SHM_HELP_IDX_BITS) + 1;
    gen &= (UINT64_C(1) << (64 - SHM_HELP_IDX_BITS)) - 1;
    atomic_store_explicit(&h->claim, (gen << SHM_HELP_IDX_BITS) | SHM_HELP_CLOSED, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);   /* closed before the fields change */
    atomic_store_explicit(&h->src, src, memory_order_relaxed);
    atomic_store_explicit(&h->dst, dst, memory_order_relaxed);
    atomic_store_explicit(&h->niov, (uint64_t)sx->niov | ((uint64_t)x->niov << 32), memory_order_relaxed);
    atomic_store_explicit(&h->bytes, total, memory_order_relaxed);
    atomic_store_explicit(&h->piece, piece, memory_order_relaxed);
    atomic_store_explicit(&h->copied, 0, memory_order_relaxed);
    atomic_store_explicit(&h->redo_len, 0, memory_order_relaxed);
    atomic_store_explicit(&h->claim, gen << SHM_HELP_IDX_BITS, memory_order_release);
    /* the sender's progress looks at its help slots only when this counter
     * moved (release: after the slot is open) */
    atomic_fetch_add_explicit(&peer->peer_hdr->helps, 1, memory_order_release);
    /* a sender asleep in wait would not help: knock */
    atomic_thread_fence(memory_order_seq_cst);
    wake_sleepers(peer->peer_hdr);

    int err = 0;
    size_t failed = 0, off, len;
    uint64_t s, d, taken = 0;
    int rest = 0;
    uint64_t v_, t_, g_;   /* what the sender needs of the slot; this side has it */
    while (rest || help_claim(h, &s, &d, &off, &len, &v_, &t_, &g_)) {
        taken++;
        err = cma_vec(peer->pid, 0, to, nto, from, nfrom, off, len);
        if (err) {
            failed = len;
            break;
        }
        atomic_fetch_add_explicit(&h->copied, len, memory_order_relaxed);
        if (rest)
            break;
        /* A message of a few pieces whose sender took none while we
         * copied one: it is busy elsewhere (computing, outside weft); the
         * rest in one system call instead of one per piece. Larger
         * messages go on piece by piece: the sender may still come. */
        rest = total < SHM_STREAM_MAX && help_claim_rest(h, taken, total, piece, &off, &len);
    }
    /* close: from here on the sender cannot claim; count what it holds */
    uint64_t w = atomic_exchange_explicit(&h->claim, (gen << SHM_HELP_IDX_BITS) | SHM_HELP_CLOSED,
                                          memory_order_acq_rel);
    uint64_t claimed_pieces = w & SHM_HELP_IDX_MASK;
    size_t claimed = claimed_pieces * piece < total ? (size_t)(claimed_pieces * piece) : total;
    size_t want = claimed - failed;
    double started = 0;
    unsigned spins = 0;
    struct weft_backoff bo;
    weft_backoff_init(&bo, NULL);   /* the spin is the 256 polls below */
    while (atomic_load_explicit(&h->copied, memory_order_acquire) < want) {
        if (++spins % 256 != 0)
            continue;
        /* the sender is mid-piece; it may be descheduled on a busy node */
        double now = weft_now();
        weft_backoff_idle(&bo, now, 50);
        if (started == 0)
            started = now;
        else if (kill(peer->pid, 0) != 0 && errno == ESRCH)
            return ESRCH;   /* the sender died mid-piece: not a timeout */
        else if (weft_wait_expired(cfg, WEFT_WAIT_SHM_PIECE, started, now))
            return -1;      /* never with WEFT_TIMEOUT=0 */
    }
    if (err)
        return err;
    size_t redo = (size_t)atomic_load_explicit(&h->redo_len, memory_order_relaxed);
    if (redo) {
        size_t ro = (size_t)atomic_load_explicit(&h->redo_off, memory_order_relaxed);
        return cma_vec(peer->pid, 0, to, nto, from, nfrom, ro, redo);
    }
    return 0;
}

/* A message of a stream (the sender already sent more behind it: a window
 * of sends, not a ping-pong), below SHM_STREAM_MAX: pull it (by one
 * process_vm_readv on this core, from SHM_SPLIT_MIN shared with the
 * sender, idle in its wait), or let
 * the sender push it through the ring (it is in weft: it just sent more),
 * the sender copying message k+1 in while this rank copies message k out?
 * Two copies on two cores against one: the push wins where moving freshly
 * written cache lines between cores is fast and loses where it is slow --
 * on the 2-core reference VM that speed changes about 5x from second to
 * second (docs/benchmarks.md, "Shared memory: streams below 256 KiB"). So
 * both ways are timed as they run, per size class: a pull by its own
 * call, a push by the gaps between its pieces arriving (shm.c, on_data);
 * the push is taken when it costs under half the pull (the pull's time
 * leaves out the handshake it still needs), and every SHM_STREAM_PROBE-th
 * message starts a run of SHM_STREAM_PROBE_RUN the other way to keep both
 * current. A size class's first stream messages are one pull, then a run
 * of pushes. A lone message (a push's copy in and copy out would be
 * serial) and a node with more ranks than cores (the sender may not run)
 * are always pulled. */
#define SHM_STREAM_PROBE 1024u
#define SHM_STREAM_PROBE_RUN 12u
static int stream_push(struct shm_peer *peer, size_t bytes)
{
    unsigned c = shm_rate_class(bytes);
    peer->expect_timed = 0;
    if (peer->pull_cost[c] <= 0)
        return 0;                                  /* time a pull first */
    int push = peer->push_cost[c] > 0 && 2 * peer->push_cost[c] < peer->pull_cost[c];
    if (peer->probe_left == 0 && (peer->push_cost[c] <= 0 || ++peer->stream_n % SHM_STREAM_PROBE == 0))
        peer->probe_left = SHM_STREAM_PROBE_RUN;   /* a run the other way (or the push's first) */
    if (peer->probe_left > 0) {
        unsigned pos = SHM_STREAM_PROBE_RUN - peer->probe_left--;
        push = !push;
        /* a run of pushes among pulls: its first pieces waited in the ring
         * while this rank pulled (they would look fast), its last are
         * copied out after the pulls that follow (slow): time the middle */
        peer->expect_timed = push && pos >= 3 && pos + 3 < SHM_STREAM_PROBE_RUN;
    } else {
        peer->expect_timed = push;
    }
    return push;
}

int weft_shm_rndv_get(void *ctx, int rank, struct weft_tp_xfer *x, const struct weft_tp_src *src)
{
    struct shm_state *st = ctx;
    struct shm_peer *peer = peer_of(st, rank);
    if (peer == NULL || peer->help_in == NULL)
        return WEFT_EAGAIN;  /* decline: the sender pushes through the ring */
    struct weft_core *core = shm_core(st);
    if (!core->cfg.shm_cma || !peer->cma_ok || x->bytes < core->cfg.shm_cma_min)
        return WEFT_EAGAIN;

    size_t total = x->bytes;
    int vec = src->niov || x->niov;
    int stream = !vec && total < SHM_STREAM_MAX && !core->oversubscribed && core->cfg.shm_stream &&
                 weft_shm_more_queued(peer);
    if (stream && stream_push(peer, total)) {
        if (!peer->stream_told) {
            peer->stream_told = 1;
            WEFT_INFO(core->rank, "shm: peer %d sends a stream of rendezvous messages: below %zu KiB this rank "
                      "times pulling them by CMA against the peer pushing them through the ring, and takes "
                      "the faster (WEFT_SHM_STREAM=0: always pull)", peer->rank, SHM_STREAM_MAX >> 10);
        }
        return WEFT_EAGAIN;
    }
    /* Shared with the sender, or one call on this core? Sharing needs a
     * core for the sender: with more ranks than cores it would only make
     * us wait for a preempted sender's piece. It also needs a sender not
     * busy with messages of this rank's: one to whom this rank has
     * rendezvous sends of its own outstanding (an exchange) is pulling
     * those, and both sides would only pay the extra calls and the cache
     * lines of a split -- at every size (np 2, 3 alternated rounds, shared
     * against one call: a 64 KiB allreduce +20%; allgather blocks and
     * allreduces of 512 KiB-1 MiB +7-15%, alltoalls of 512 KiB, 2 and 4
     * MiB +5-28%; docs/benchmarks.md, "Exchanges pulled by one call at
     * every size"). */
    int shared = total >= SHM_SPLIT_MIN && !core->oversubscribed && !x->crossing;
    /* a pull below SHM_STREAM_MAX is timed: stream_push weighs it against the push */
    int timed = !vec && total >= SHM_RATE_MIN && total < SHM_STREAM_MAX;
    double t0 = timed ? weft_now() : 0;
    /* Both sides' pieces: a buffer is a list of one; a vectored sender's
     * list is read from it first (one small process_vm_readv). */
    struct weft_iov from[WEFT_IOV_MAX], to_one = { (uint64_t)(uintptr_t)x->buf, total };
    const struct weft_iov *to = x->niov ? x->iov : &to_one;
    size_t nfrom = 0, nto = x->niov ? x->niov : 1;
    int e = read_pieces(peer->pid, src->addr, src->niov, total, from, &nfrom);
    if (e == 0)
        e = shared ? cma_pull_shared(st, peer, x, src, from, nfrom, to, nto)
            : vec  ? cma_vec(peer->pid, 0, to, nto, from, nfrom, 0, total)
                   : weft_cma_copy(peer->pid, 0, x->buf, src->addr, total);
    if (e == EPROTO) {
        weft_set_error(core, WEFT_ERR_TRANSPORT,
                       "shm: peer %d: a vectored message (tag %d) announces %u pieces that do not make its %zu bytes",
                       peer->rank, x->tag, src->niov, total);
        return WEFT_ERR_TRANSPORT;
    }
    if (timed) {
        if (e == 0)
            shm_cost_note(&peer->pull_cost[shm_rate_class(total)], total, weft_now() - t0);
        peer->piece_t = 0;   /* the next pushed piece's gap would count this pull */
    }
    if (e == 0) {
        peer->cma_used = 1;
        return WEFT_SUCCESS;
    }
    if (e < 0)
        return weft_set_error(core, WEFT_ERR_TIMEOUT,
                              "shm: peer %d: its share of a %zu-byte copy (tag %d) did not land within %.0f s",
                              peer->rank, total, x->tag, weft_wait_bound(&core->cfg, WEFT_WAIT_SHM_PIECE));
    if (e == ESRCH) {
        weft_set_error(core, WEFT_ERR_TRANSPORT,
                       "shm: peer %d: process %d is gone (process_vm_readv of %zu bytes, tag %d)",
                       peer->rank, (int)peer->pid, total, x->tag);
        /* The whole pipe, not only this message: the peer is dead. */
        st->env->up->peer_failed(st->env->up->arg, peer->rank, WEFT_ERR_TRANSPORT);
        return WEFT_ERR_TRANSPORT;
    }
    if (e == EPERM || e == ENOSYS || (e == EFAULT && !peer->cma_used)) {
        /* Refused (ptrace policy, kernel without CMA, or a buffer CMA
         * cannot read): stop trying with this peer; pushes still work. */
        peer->cma_ok = 0;
        WEFT_INFO(core->rank, "peer %d: shm CMA refused (%s); using bounce buffers", peer->rank, strerror(e));
    }
    /* Anything else: decline this message; the push overwrites whatever
     * part of the buffer was already read. */
    return WEFT_EAGAIN;
}
