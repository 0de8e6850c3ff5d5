/*
 * shm transport: ranks on the same node.
 *
 * Each rank creates one POSIX shm segment holding a small header (doorbell
 * futex, sleeper count, pid) and, per shm peer, a help slot and one inbound
 * SPSC ring; peer P produces into "P -> me" inside my segment and I consume
 * it. Control messages and eager data travel as ring records. Large
 * messages move either
 *  - by CMA, one copy: the receiver pulls from the sender's buffer with
 *    process_vm_readv, and from SHM_SPLIT_MIN up the sender, idle while it
 *    waits for FIN, takes pieces of the same transfer and writes them with
 *    process_vm_writev (struct shm_help_slot), so two cores copy at once;
 *  - or, when CMA is off or refused, by a pipelined copy through the ring:
 *    the sender copies chunk k+1 in while the receiver copies chunk k out
 *    (DATA records).
 *
 * Waking: a rank about to sleep bumps its sleeper count, runs a barrier,
 * re-checks its rings, and futex-waits on its doorbell; a producer that
 * commits a record (or a consumer that frees room a producer asked for)
 * bumps the doorbell and wakes only when someone sleeps, so the hot path
 * makes no syscall. Store, barrier, load on both sides means one of the two
 * always sees the other (no lost wake-ups); see waker_fence for why the
 * waker's barrier is usually a membarrier issued by the sleeper.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "log.h"
#include "pipe.h"
#include "shm_ring.h"
#include "transport.h"

#define SHM_SEG_MAGIC 0x314d48535446574full  /* "OWFTSHM1" */

/* Largest piece one process_vm_readv call moves: keeps each call's iovec
 * length far below SSIZE_MAX and bounds the time between retries. */
#define SHM_CMA_MAX_IOV ((size_t)1 << 30)

/* Records drained from one inbound ring per progress pass, so one busy peer
 * cannot starve the others. */
#define SHM_DRAIN_BUDGET 256

/* Record types of this transport (first byte, like weft_ctrl.type). */
enum {
    SHM_REC_DATA = WEFT_CTRL_TRANSPORT_BASE,      /* a piece of a pushed message */
    SHM_REC_EAGER_SMALL = WEFT_CTRL_TRANSPORT_BASE + 1  /* EAGER with a 16-byte header */
};

/* Segment header; the ring offset table follows it, then the rings. */
struct shm_seg_hdr {
    uint64_t magic;
    uint64_t token;          /* the owner's card token: a peer checks it */
    uint64_t bytes;          /* segment size */
    int32_t  pid;
    int32_t  nranks;         /* entries in the ring offset table */
    _Alignas(64) _Atomic uint32_t doorbell;  /* futex word, bumped by wakers */
    _Atomic uint32_t sleepers;               /* threads of the owner in sleep() */
    char     pad[56];
};
_Static_assert(sizeof(struct shm_seg_hdr) % 64 == 0, "ring table starts aligned");

static inline uint64_t *seg_ring_table(struct shm_seg_hdr *h)
{
    return (uint64_t *)(h + 1);  /* [nranks]: offset of the ring from that rank, 0 = none */
}

/* DATA record: 56 bytes, so with the ring's 8-byte record header the
 * payload starts on a cache line. */
struct shm_data_hdr {
    uint8_t  type;           /* SHM_REC_DATA */
    uint8_t  pad0[7];
    uint64_t rreq;           /* receiver's request id (from CTS) */
    uint64_t offset;         /* where this piece goes in the message */
    uint64_t len;
    uint8_t  pad1[24];
};
_Static_assert(sizeof(struct shm_data_hdr) == 56, "DATA payload must be cache-line aligned");

/* Compact EAGER header: a message of up to 40 bytes fits one cache line
 * (8 record header + 16 + 40) instead of two with a full weft_ctrl. */
struct shm_eager_small {
    uint8_t  type;           /* SHM_REC_EAGER_SMALL */
    uint8_t  flags;
    uint16_t reserved;
    int32_t  tag;
    uint64_t seq;
};

/* Shared work list of one large CMA transfer from the peer to the owner of
 * the segment. The receiver opens it in rndv_get; then both processes claim
 * pieces from `claim` and copy them with one copy each: the receiver with
 * process_vm_readv, the sender (from its progress loop, while it waits for
 * FIN anyway) with process_vm_writev. Two cores copy at once, and a side
 * that is descheduled is simply outrun by the other. The receiver returns
 * from rndv_get only when `copied` covers the message, so the sender never
 * touches either buffer after the send completes.
 *
 * claim = generation << 40 | index of the next piece; SHM_HELP_CLOSED as
 * the index means "no transfer open". The receiver closes the slot before
 * it rewrites the fields and reopens it after, and a claim is a CAS on the
 * whole word, so a sender that read fields of another generation fails its
 * claim instead of copying with stale addresses. */
#define SHM_HELP_IDX_BITS 40
#define SHM_HELP_IDX_MASK ((UINT64_C(1) << SHM_HELP_IDX_BITS) - 1)
#define SHM_HELP_CLOSED SHM_HELP_IDX_MASK
struct shm_help_slot {
    _Alignas(64) _Atomic uint64_t claim;
    _Atomic uint64_t src;        /* sender's buffer, in the sender's address space */
    _Atomic uint64_t dst;        /* receiver's buffer, in the receiver's address space */
    _Atomic uint64_t bytes;
    _Atomic uint64_t piece;
    _Alignas(64) _Atomic uint64_t copied;  /* bytes in place, by either side */
    _Atomic uint64_t redo_off;   /* a piece the sender claimed but could not write */
    _Atomic uint64_t redo_len;   /* (the receiver reads it itself); 0 = none */
    char pad[40];
};
_Static_assert(sizeof(struct shm_help_slot) == 128, "help slot is two cache lines");

/* Below this a single process_vm_readv is cheaper than sharing the work. */
#define SHM_SPLIT_MIN ((size_t)256 << 10)

struct shm_peer {
    struct weft_pipe     *pipe;
    int                   rank;
    pid_t                 pid;
    int                   cma_ok;       /* pulls from this peer work */
    int                   cma_used;     /* a pull has succeeded */
    struct shm_ring      *in;           /* peer -> me, in my segment */
    struct shm_ring      *out;          /* me -> peer, in the peer's segment */
    struct shm_help_slot *help_in;      /* transfers peer -> me, in my segment */
    struct shm_help_slot *help_out;     /* transfers me -> peer, in the peer's segment */
    int                   help_broken;  /* a process_vm_writev into the peer failed: stop helping */
    struct shm_seg_hdr   *peer_hdr;
    void                 *peer_map;
    size_t                peer_map_bytes;
    struct weft_request  *push_head, *push_tail;     /* sends to push, FIFO (tp_next) */
    struct weft_request  *expect_head, *expect_tail; /* receives a push will fill (tp_next) */
    _Atomic size_t        out_need;     /* payload size a blocked producer waits room for; 0 = none */
    _Atomic int           pushes;       /* entries on the push list (read by sleep) */
};

struct shm_state {
    char                  name[64];
    int                   linked;       /* own segment name still in /dev/shm */
    struct shm_seg_hdr   *seg;
    size_t                seg_bytes;
    struct shm_peer      *peers;
    int                   npeers;
    size_t                max_payload;  /* per ring record */
};

static _Atomic unsigned shm_segment_counter;

/* 1 once this process is registered for MEMBARRIER_CMD_GLOBAL_EXPEDITED,
 * -1 if the kernel refused, 0 before the first try. Registered, a waker
 * needs no fence between publishing and looking for sleepers: a sleeper
 * issues the membarrier instead, which runs a full barrier on every CPU
 * running a registered process (asymmetric Dekker). That takes the fence,
 * which stalls on the store to the ring line, off every send. */
static _Atomic int shm_membarrier_state;

static void membarrier_register(void)
{
    if (atomic_load(&shm_membarrier_state) != 0)
        return;
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    int ok = cmds > 0 && (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
             syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
    atomic_store(&shm_membarrier_state, ok ? 1 : -1);
}

/* The waker's half of the sleeper handshake: publish, then this, then look
 * for sleepers. */
static inline void waker_fence(void)
{
    if (atomic_load_explicit(&shm_membarrier_state, memory_order_relaxed) != 1)
        atomic_thread_fence(memory_order_seq_cst);
    else
        atomic_signal_fence(memory_order_seq_cst);  /* compiler order only; the sleeper's membarrier does the rest */
}

static struct shm_state *shm_state(const struct weft_comm *c)
{
    return (struct shm_state *)c->tp_state[WEFT_TP_SHM];
}

/* ---- futex doorbells ---- */

/* Wakes the owner of h if one of its threads sleeps. Callers publish what
 * the sleeper should see, then waker_fence(), then call this: a sleeper
 * counts itself in and runs a barrier (membarrier or fence) before it
 * re-checks, so either we see its count here or it sees our update and
 * does not sleep. */
static void wake_sleepers(struct shm_seg_hdr *h)
{
    if (atomic_load_explicit(&h->sleepers, memory_order_relaxed) == 0)
        return;
    atomic_fetch_add_explicit(&h->doorbell, 1, memory_order_release);
    /* shared (not PRIVATE) futex: the waiter is another process */
    syscall(SYS_futex, &h->doorbell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* After publishing records into peer's ring: wake the peer if it sleeps. */
static void notify_consumer(struct shm_peer *peer)
{
    waker_fence();
    wake_sleepers(peer->peer_hdr);
}

/* After releasing records of peer's inbound ring: wake the peer if it
 * asked for room there and sleeps. */
static void notify_producer(struct shm_peer *peer)
{
    waker_fence();
    if (shm_ring_take_waiter(peer->in))
        wake_sleepers(peer->peer_hdr);
}

/* Producer side: reserve len bytes in the peer's ring, or record that we
 * wait for room (the consumer then wakes us) and return NULL. */
static void *reserve_or_wait(struct shm_peer *peer, size_t len)
{
    void *dst = shm_ring_reserve(peer->out, len);
    if (dst) {
        atomic_store_explicit(&peer->out_need, 0, memory_order_relaxed);
        return dst;
    }
    atomic_store_explicit(&peer->out_need, len, memory_order_relaxed);
    if (shm_ring_want_room(peer->out, len)) {
        dst = shm_ring_reserve(peer->out, len);
        if (dst)
            atomic_store_explicit(&peer->out_need, 0, memory_order_relaxed);
    }
    return dst;
}

/* ---- set-up ---- */

static int shm_card_fill(struct weft_comm *c, struct weft_rank_card *mine)
{
    struct shm_state *st = shm_state(c);
    if (st == NULL) {
        st = calloc(1, sizeof(*st));
        if (st == NULL)
            return weft_set_error(c, WEFT_ERR_NO_MEMORY, "shm: no memory for transport state");
        c->tp_state[WEFT_TP_SHM] = st;
    }
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) != (ssize_t)sizeof(nonce))
        nonce = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)st << 16);
    unsigned counter = atomic_fetch_add(&shm_segment_counter, 1);
    snprintf(st->name, sizeof(st->name), "/weft-%d-%016llx-%u", (int)getpid(),
             (unsigned long long)nonce, counter);
    snprintf(mine->shm_name, sizeof(mine->shm_name), "%s", st->name);
    membarrier_register();

    if (c->cfg.shm_cma) {
        /* With Yama ptrace_scope=1 a peer may only process_vm_readv us if
         * we name it a tracer; "any" because peers are not our children.
         * EINVAL means Yama is absent and nothing needs allowing. */
        if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0 && errno != EINVAL)
            WEFT_INFO(c->rank, "shm: prctl(PR_SET_PTRACER) failed: %s; peers may not pull by CMA",
                      strerror(errno));
    }
    return WEFT_SUCCESS;
}

static void shm_disconnect(struct weft_comm *c)
{
    struct shm_state *st = shm_state(c);
    if (st == NULL)
        return;
    for (int i = 0; i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        if (peer->peer_map)
            munmap(peer->peer_map, peer->peer_map_bytes);
        if (peer->pipe && peer->pipe->tp_peer == peer)
            peer->pipe->tp_peer = NULL;
    }
    if (st->linked)
        shm_unlink(st->name);
    if (st->seg)
        munmap(st->seg, st->seg_bytes);
    free(st->peers);
    free(st);
    c->tp_state[WEFT_TP_SHM] = NULL;
}

/* Creates and maps own segment with one inbound ring per shm peer. */
static int create_segment(struct weft_comm *c, struct shm_state *st)
{
    size_t table = ((size_t)c->size * sizeof(uint64_t) + 63) & ~(size_t)63;
    /* per peer: its help slot, then its ring (the table points at the ring) */
    size_t ring_bytes = sizeof(struct shm_help_slot) + shm_ring_footprint(c->cfg.shm_ring_bytes);
    size_t bytes = sizeof(struct shm_seg_hdr) + table + (size_t)st->npeers * ring_bytes;

    int fd = shm_open(st->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "shm: shm_open(%s) failed: %s",
                              st->name, strerror(errno));
    st->linked = 1;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "shm: ftruncate(%s, %zu) failed: %s (is /dev/shm full?)",
                              st->name, bytes, strerror(e));
    }
    /* MAP_POPULATE: fault the pages in now, not on the first messages */
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (mem == MAP_FAILED)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "shm: mmap of %s (%zu bytes) failed: %s",
                              st->name, bytes, strerror(e));
    st->seg = mem;
    st->seg_bytes = bytes;

    struct shm_seg_hdr *h = mem;
    h->token = c->cards[c->rank].token;
    h->bytes = bytes;
    h->pid = (int32_t)getpid();
    h->nranks = c->size;
    atomic_init(&h->doorbell, 0);
    atomic_init(&h->sleepers, 0);
    uint64_t *offs = seg_ring_table(h);
    size_t off = sizeof(struct shm_seg_hdr) + table;
    for (int i = 0; i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        peer->help_in = (struct shm_help_slot *)((char *)mem + off);
        atomic_init(&peer->help_in->claim, SHM_HELP_CLOSED);
        atomic_init(&peer->help_in->copied, 0);
        peer->in = shm_ring_init((char *)mem + off + sizeof(struct shm_help_slot), c->cfg.shm_ring_bytes);
        offs[peer->rank] = off + sizeof(struct shm_help_slot);
        off += ring_bytes;
    }
    st->max_payload = shm_ring_max_payload_for(c->cfg.shm_ring_bytes);
    /* magic last: a peer that sees it sees a finished header (the barrier
     * orders it anyway) */
    h->magic = SHM_SEG_MAGIC;
    return WEFT_SUCCESS;
}

/* Maps peer's segment and finds the ring it keeps for us. */
static int map_peer(struct weft_comm *c, struct shm_peer *peer)
{
    const struct weft_rank_card *card = &c->cards[peer->rank];
    char name[sizeof(card->shm_name) + 1];
    memcpy(name, card->shm_name, sizeof(card->shm_name));
    name[sizeof(card->shm_name)] = '\0';

    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "shm: peer %d: shm_open(%s) failed: %s",
                              peer->rank, name, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < (off_t)sizeof(struct shm_seg_hdr)) {
        close(fd);
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "shm: peer %d: segment %s is missing or too small",
                              peer->rank, name);
    }
    size_t bytes = (size_t)sb.st_size;
    /* No MAP_POPULATE here: of a peer's segment this rank touches only the
     * header and its own ring, and populating every peer's whole segment
     * made comm creation grow with n^2. */
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (mem == MAP_FAILED)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "shm: peer %d: mmap of %s failed: %s",
                              peer->rank, name, strerror(e));
    peer->peer_map = mem;
    peer->peer_map_bytes = bytes;

    struct shm_seg_hdr *h = mem;
    size_t table = ((size_t)c->size * sizeof(uint64_t) + 63) & ~(size_t)63;
    if (h->magic != SHM_SEG_MAGIC || h->token != card->token || h->nranks != c->size ||
        h->bytes != bytes || sizeof(*h) + table > bytes)
        return weft_set_error(c, WEFT_ERR_TRANSPORT,
                              "shm: peer %d: segment %s does not belong to this job (bad magic, token or size)",
                              peer->rank, name);
    uint64_t off = seg_ring_table(h)[c->rank];
    if (off < sizeof(*h) + table + sizeof(struct shm_help_slot) || off % 64 != 0 || off >= bytes ||
        (peer->out = shm_ring_attach((char *)mem + off, bytes - off)) == NULL)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "shm: peer %d: segment %s has no valid ring for rank %d",
                              peer->rank, name, c->rank);
    peer->help_out = (struct shm_help_slot *)((char *)mem + off - sizeof(struct shm_help_slot));
    peer->peer_hdr = h;
    peer->pid = h->pid;
    return WEFT_SUCCESS;
}

/* Whether we may read the peer's memory: its card says where its token is. */
static int probe_cma(struct weft_comm *c, struct shm_peer *peer)
{
    const struct weft_rank_card *card = &c->cards[peer->rank];
    if (!c->cfg.shm_cma || card->cma_probe_addr == 0)
        return 0;
    uint64_t value = 0;
    struct iovec local = { &value, sizeof(value) };
    struct iovec remote = { (void *)(uintptr_t)card->cma_probe_addr, sizeof(value) };
    ssize_t n = process_vm_readv(peer->pid, &local, 1, &remote, 1, 0);
    if (n != (ssize_t)sizeof(value)) {
        WEFT_TRACE(c->rank, "shm: peer %d: CMA probe failed: %s", peer->rank,
                   n < 0 ? strerror(errno) : "short read");
        return 0;
    }
    return value == card->token;
}

/* Every rank calls this, shm peers or not, because of the collectives. */
static int all_ok(struct weft_comm *c, int err)
{
    int mine = err != WEFT_SUCCESS, any = 0;
    if (MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, c->mpi) != MPI_SUCCESS)
        return weft_set_error(c, WEFT_ERR_MPI, "shm: MPI_Allreduce during set-up failed");
    if (err != WEFT_SUCCESS)
        return err;
    if (any)
        return weft_set_error(c, WEFT_ERR_TRANSPORT, "shm: set-up failed on another rank (see its log)");
    return WEFT_SUCCESS;
}

static int shm_connect(struct weft_comm *c)
{
    struct shm_state *st = shm_state(c);
    int err = WEFT_SUCCESS;
    if (st == NULL) {
        st = calloc(1, sizeof(*st));
        if (st == NULL)
            err = weft_set_error(c, WEFT_ERR_NO_MEMORY, "shm: no memory for transport state");
        else
            c->tp_state[WEFT_TP_SHM] = st;
    }

    if (err == WEFT_SUCCESS) {
        int n = 0;
        for (int r = 0; r < c->size; r++)
            if (r != c->rank && c->pipes[r].tp == &weft_transport_shm)
                n++;
        if (n > 0) {
            st->peers = calloc((size_t)n, sizeof(*st->peers));
            if (st->peers == NULL)
                err = weft_set_error(c, WEFT_ERR_NO_MEMORY, "shm: no memory for %d peers", n);
        }
        if (err == WEFT_SUCCESS) {
            for (int r = 0; r < c->size; r++) {
                if (r == c->rank || c->pipes[r].tp != &weft_transport_shm)
                    continue;
                struct shm_peer *peer = &st->peers[st->npeers++];
                peer->rank = r;
                peer->pipe = &c->pipes[r];
                atomic_init(&peer->out_need, 0);
                atomic_init(&peer->pushes, 0);
            }
            if (st->npeers > 0)
                err = create_segment(c, st);
        }
    }

    /* 1: every segment exists before anyone maps one */
    err = all_ok(c, err);
    for (int i = 0; err == WEFT_SUCCESS && i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        err = map_peer(c, peer);
        if (err == WEFT_SUCCESS) {
            peer->cma_ok = probe_cma(c, peer);
            WEFT_INFO(c->rank, "peer %d: shm, CMA %s%s", peer->rank, peer->cma_ok ? "yes" : "no",
                      c->cfg.shm_cma ? "" : " (WEFT_SHM_CMA=0)");
        }
    }
    /* 2: every peer has mapped our segment; the name can go, so a crash
     * later leaves nothing behind in /dev/shm */
    err = all_ok(c, err);
    if (st && st->linked) {
        shm_unlink(st->name);
        st->linked = 0;
    }
    if (err != WEFT_SUCCESS) {
        shm_disconnect(c);
        return err;
    }
    for (int i = 0; i < st->npeers; i++)
        st->peers[i].pipe->tp_peer = &st->peers[i];
    return WEFT_SUCCESS;
}

/* ---- data path ---- */

static size_t shm_eager_limit(const struct weft_comm *c)
{
    size_t ring_max = shm_ring_max_payload_for(c->cfg.shm_ring_bytes) - sizeof(struct weft_ctrl);
    return c->cfg.shm_eager_limit < ring_max ? c->cfg.shm_eager_limit : ring_max;
}

static int shm_ctrl_send(struct weft_pipe *p, const struct weft_ctrl *m, const void *payload, size_t len)
{
    struct shm_peer *peer = p->tp_peer;
    if (peer == NULL)
        return weft_set_error(p->comm, WEFT_ERR_TRANSPORT, "shm: peer %d: not connected", p->peer);

    if (m->type == WEFT_CTRL_EAGER && m->bytes == len && m->status == 0 && m->sreq == 0 &&
        m->rreq == 0 && m->addr == 0 && m->reserved == 0 && m->reserved2 == 0) {
        struct shm_eager_small *e = reserve_or_wait(peer, sizeof(*e) + len);
        if (e == NULL)
            return WEFT_EAGAIN;
        e->type = SHM_REC_EAGER_SMALL;
        e->flags = m->flags;
        e->reserved = 0;
        e->tag = m->tag;
        e->seq = m->seq;
        if (len)
            memcpy(e + 1, payload, len);
        shm_ring_commit(peer->out, sizeof(*e) + len);
    } else {
        if (sizeof(*m) + len > shm_ring_max_payload(peer->out))
            return weft_set_error(p->comm, WEFT_ERR_INTERNAL,
                                  "shm: peer %d: control message of %zu bytes exceeds the ring's record limit %zu",
                                  p->peer, len, shm_ring_max_payload(peer->out));
        struct weft_ctrl *dst = reserve_or_wait(peer, sizeof(*m) + len);
        if (dst == NULL)
            return WEFT_EAGAIN;
        memcpy(dst, m, sizeof(*m));
        if (len)
            memcpy(dst + 1, payload, len);
        shm_ring_commit(peer->out, sizeof(*m) + len);
    }
    notify_consumer(peer);
    return WEFT_SUCCESS;
}

static void list_append(struct weft_request **head, struct weft_request **tail, struct weft_request *r)
{
    r->tp_next = NULL;
    if (*tail)
        (*tail)->tp_next = r;
    else
        *head = r;
    *tail = r;
}

/* Unlinks the request with that id; NULL if it is not on the list. */
static struct weft_request *list_take(struct weft_request **head, struct weft_request **tail, uint64_t id)
{
    struct weft_request *prev = NULL;
    for (struct weft_request *r = *head; r; prev = r, r = r->tp_next) {
        if (weft_req_id(r) != id)
            continue;
        if (prev)
            prev->tp_next = r->tp_next;
        else
            *head = r->tp_next;
        if (*tail == r)
            *tail = prev;
        r->tp_next = NULL;
        return r;
    }
    return NULL;
}

/* One DATA record: copy it into the receive request it names. */
static void on_data(struct weft_comm *c, struct shm_peer *peer, const struct shm_data_hdr *d, size_t rec_len)
{
    struct weft_request *r = NULL;
    /* Pushes arrive in CTS order, so the request is almost always the head. */
    for (struct weft_request *x = peer->expect_head; x; x = x->tp_next)
        if (weft_req_id(x) == d->rreq) {
            r = x;
            break;
        }
    if (r == NULL) {
        /* the receive was aborted (pipe broken): drop what is still in flight */
        WEFT_TRACE(c->rank, "shm: peer %d: dropping %llu data bytes for a request no longer expected",
                   peer->rank, (unsigned long long)d->len);
        return;
    }
    if (d->len > rec_len - sizeof(*d) || d->offset > r->msg_bytes || d->len > r->msg_bytes - d->offset ||
        r->msg_bytes > r->bytes) {
        list_take(&peer->expect_head, &peer->expect_tail, d->rreq);
        weft_set_error(c, WEFT_ERR_TRANSPORT,
                       "shm: peer %d: data piece [%llu, +%llu) does not fit the %zu-byte message of tag %d",
                       peer->rank, (unsigned long long)d->offset, (unsigned long long)d->len,
                       r->msg_bytes, r->tag);
        weft_pipe_recv_done(peer->pipe, r, WEFT_ERR_TRANSPORT);
        return;
    }
    if (d->len)
        memcpy((char *)r->buf + d->offset, d + 1, d->len);
    r->tp_done += d->len;
    if (r->tp_done >= r->msg_bytes) {
        list_take(&peer->expect_head, &peer->expect_tail, d->rreq);
        weft_pipe_recv_done(peer->pipe, r, WEFT_SUCCESS);
    }
}

/* Consumes up to the budget of records from peer's inbound ring. */
static int drain_inbound(struct weft_comm *c, struct shm_peer *peer)
{
    int n = 0;
    size_t len;
    const void *rec;
    while (n < SHM_DRAIN_BUDGET && (rec = shm_ring_peek(peer->in, &len)) != NULL) {
        uint8_t type = *(const uint8_t *)rec;
        if (type == SHM_REC_EAGER_SMALL && len >= sizeof(struct shm_eager_small)) {
            const struct shm_eager_small *e = rec;
            struct weft_ctrl m;
            memset(&m, 0, sizeof(m));
            m.type = WEFT_CTRL_EAGER;
            m.flags = e->flags;
            m.tag = e->tag;
            m.seq = e->seq;
            m.bytes = len - sizeof(*e);
            weft_pipe_on_ctrl(peer->pipe, &m, e + 1, len - sizeof(*e));
        } else if (type == SHM_REC_DATA && len >= sizeof(struct shm_data_hdr)) {
            on_data(c, peer, rec, len);
        } else if (type < WEFT_CTRL_TRANSPORT_BASE && len >= sizeof(struct weft_ctrl)) {
            const struct weft_ctrl *m = rec;
            weft_pipe_on_ctrl(peer->pipe, m, m + 1, len - sizeof(*m));
        } else {
            WEFT_WARN(c->rank, "shm: peer %d: dropping malformed record (type %u, %zu bytes)",
                      peer->rank, type, len);
        }
        shm_ring_release(peer->in);
        n++;
    }
    if (n)
        notify_producer(peer);
    return n;
}

/* Piece size for pushing a message of `bytes`: the configured chunk, but
 * small enough that a mid-size message still splits into a few pieces, so
 * the receiver copies piece k out while we copy piece k+1 in (one piece
 * would make the two copies serial). */
static size_t push_piece(size_t bytes, size_t chunk, size_t chunk_max)
{
    const size_t min_piece = 16u << 10;   /* below this, per-record costs show */
    if (chunk == 0 || chunk > chunk_max)
        chunk = chunk_max;
    size_t quarter = ((bytes / 4) + 4095) & ~(size_t)4095;
    if (quarter < chunk)
        chunk = quarter > min_piece ? quarter : min_piece;
    return chunk < chunk_max ? chunk : chunk_max;
}

/* Copies queued pushes into the peer's ring while it has room. */
static int advance_pushes(struct weft_comm *c, struct shm_peer *peer)
{
    struct shm_state *st = shm_state(c);
    size_t chunk_max = st->max_payload - sizeof(struct shm_data_hdr);
    int n = 0;
    struct weft_request *s;
    while ((s = peer->push_head) != NULL) {
        size_t piece = push_piece(s->bytes, c->cfg.shm_chunk, chunk_max);
        /* tp_aux[1]: a record went out (a 0-byte message still sends one) */
        while (s->tp_done < s->bytes || s->tp_aux[1] == 0) {
            size_t len = s->bytes - s->tp_done;
            if (len > piece)
                len = piece;
            struct shm_data_hdr *d = reserve_or_wait(peer, sizeof(*d) + len);
            if (d == NULL)
                return n;
            d->type = SHM_REC_DATA;
            d->rreq = s->tp_aux[0];
            d->offset = s->tp_done;
            d->len = len;
            if (len)
                memcpy(d + 1, (const char *)s->buf + s->tp_done, len);
            shm_ring_commit(peer->out, sizeof(*d) + len);
            /* per piece, so a sleeping receiver starts copying out now */
            notify_consumer(peer);
            s->tp_done += len;
            s->tp_aux[1] = 1;
            n++;
        }
        peer->push_head = s->tp_next;
        if (peer->push_head == NULL)
            peer->push_tail = NULL;
        s->tp_next = NULL;
        atomic_fetch_sub_explicit(&peer->pushes, 1, memory_order_relaxed);
        weft_pipe_send_done(peer->pipe, s, WEFT_SUCCESS);
        n++;
    }
    return n;
}

/* Copies len bytes between local memory and the peer's (write: local ->
 * remote). Returns 0 or the errno that stopped it. */
static int cma_copy(pid_t pid, int write, char *local, uint64_t remote, size_t len)
{
    while (len > 0) {
        size_t n = len < SHM_CMA_MAX_IOV ? len : SHM_CMA_MAX_IOV;
        struct iovec l = { local, n };
        struct iovec r = { (void *)(uintptr_t)remote, n };
        ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got < 0 ? errno : EFAULT;
        local += got;
        remote += (uint64_t)got;
        len -= (size_t)got;
    }
    return 0;
}

/* Claims the next piece of the transfer open in h. Returns 1 with the
 * piece [*off, *off + *len) and both buffers, 0 when the slot is closed,
 * exhausted, or changed generation under us. */
static int help_claim(struct shm_help_slot *h, uint64_t *src, uint64_t *dst, size_t *off, size_t *len)
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
        if (piece == 0 || idx >= (bytes + piece - 1) / piece)
            return 0;
        if (atomic_compare_exchange_weak_explicit(&h->claim, &w, w + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *off = (size_t)(idx * piece);
            *len = (size_t)(bytes - idx * piece < piece ? bytes - idx * piece : piece);
            *src = s;
            *dst = d;
            return 1;
        }
    }
}

/* Sender side, from progress: copy pieces of a transfer the peer opened
 * from our buffer straight into its buffer. */
static int help_peer(struct weft_comm *c, struct shm_peer *peer)
{
    struct shm_help_slot *h = peer->help_out;
    /* a broken pipe may have failed the send whose buffer the slot names */
    if (h == NULL || !peer->cma_ok || peer->help_broken || peer->pipe->broken ||
        (atomic_load_explicit(&h->claim, memory_order_relaxed) & SHM_HELP_IDX_MASK) == SHM_HELP_CLOSED)
        return 0;
    int n = 0;
    uint64_t src, dst;
    size_t off, len;
    while (help_claim(h, &src, &dst, &off, &len)) {
        int e = cma_copy(peer->pid, 1, (char *)(uintptr_t)(src + off), dst + off, len);
        if (e) {
            /* hand the piece back; the receiver reads it itself */
            atomic_store_explicit(&h->redo_off, off, memory_order_relaxed);
            atomic_store_explicit(&h->redo_len, len, memory_order_relaxed);
            peer->help_broken = 1;
            WEFT_INFO(c->rank, "peer %d: process_vm_writev failed (%s); the peer pulls alone from now on",
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
 * -1 when the sender's pieces did not land within the timeout. */
static int cma_pull_shared(struct weft_comm *c, struct shm_peer *peer, char *buf, uint64_t src, size_t total)
{
    struct shm_help_slot *h = peer->help_in;
    /* a piece of ~1/8 of the message, 64 KiB .. 1 MiB: enough pieces for
     * both sides to share, few enough that the syscalls do not show */
    size_t piece = ((total / 8) + 4095) & ~(size_t)4095;
    piece = piece < ((size_t)64 << 10) ? (size_t)64 << 10 : piece > ((size_t)1 << 20) ? (size_t)1 << 20 : piece;

    uint64_t gen = (atomic_load_explicit(&h->claim, memory_order_relaxed) >> SHM_HELP_IDX_BITS) + 1;
    gen &= (UINT64_C(1) << (64 - SHM_HELP_IDX_BITS)) - 1;
    atomic_store_explicit(&h->claim, (gen << SHM_HELP_IDX_BITS) | SHM_HELP_CLOSED, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);   /* closed before the fields change */
    atomic_store_explicit(&h->src, src, memory_order_relaxed);
    atomic_store_explicit(&h->dst, (uint64_t)(uintptr_t)buf, memory_order_relaxed);
    atomic_store_explicit(&h->bytes, total, memory_order_relaxed);
    atomic_store_explicit(&h->piece, piece, memory_order_relaxed);
    atomic_store_explicit(&h->copied, 0, memory_order_relaxed);
    atomic_store_explicit(&h->redo_len, 0, memory_order_relaxed);
    atomic_store_explicit(&h->claim, gen << SHM_HELP_IDX_BITS, memory_order_release);
    /* a sender asleep in wait would not help: knock */
    atomic_thread_fence(memory_order_seq_cst);
    wake_sleepers(peer->peer_hdr);

    int err = 0;
    size_t failed = 0, off, len;
    uint64_t s, d;
    while (help_claim(h, &s, &d, &off, &len)) {
        err = cma_copy(peer->pid, 0, buf + off, src + off, len);
        if (err) {
            failed = len;
            break;
        }
        atomic_fetch_add_explicit(&h->copied, len, memory_order_relaxed);
    }
    /* close: from here on the sender cannot claim; count what it holds */
    uint64_t w = atomic_exchange_explicit(&h->claim, (gen << SHM_HELP_IDX_BITS) | SHM_HELP_CLOSED,
                                          memory_order_acq_rel);
    uint64_t claimed_pieces = w & SHM_HELP_IDX_MASK;
    size_t claimed = claimed_pieces * piece < total ? (size_t)(claimed_pieces * piece) : total;
    size_t want = claimed - failed;
    double deadline = 0;
    unsigned spins = 0;
    while (atomic_load_explicit(&h->copied, memory_order_acquire) < want) {
        if (++spins % 256 != 0)
            continue;
        /* the sender is mid-piece; it may be descheduled on a busy node */
        sched_yield();
        double now = weft_now();
        if (deadline == 0)
            deadline = now + (c->cfg.timeout_s > 0 ? c->cfg.timeout_s : 300.0);
        else if (now > deadline || (kill(peer->pid, 0) != 0 && errno == ESRCH))
            return -1;
    }
    if (err)
        return err;
    size_t redo = (size_t)atomic_load_explicit(&h->redo_len, memory_order_relaxed);
    if (redo) {
        size_t ro = (size_t)atomic_load_explicit(&h->redo_off, memory_order_relaxed);
        return cma_copy(peer->pid, 0, buf + ro, src + ro, redo);
    }
    return 0;
}

static int shm_rndv_get(struct weft_pipe *p, struct weft_request *r, const struct weft_ctrl *rts)
{
    struct weft_comm *c = p->comm;
    struct shm_peer *peer = p->tp_peer;
    if (peer == NULL || !c->cfg.shm_cma || !peer->cma_ok || r->msg_bytes < c->cfg.shm_cma_min ||
        r->msg_bytes > r->bytes)
        return WEFT_EAGAIN;  /* decline: the sender pushes through the ring */

    size_t total = r->msg_bytes;
    /* Sharing needs a core for the sender; with more ranks than cores it
     * would only make us wait for a preempted sender's piece. */
    int e = total >= SHM_SPLIT_MIN && !c->oversubscribed
                ? cma_pull_shared(c, peer, r->buf, rts->addr, total)
                : cma_copy(peer->pid, 0, r->buf, rts->addr, total);
    if (e == 0) {
        peer->cma_used = 1;
        r->tp_done = total;
        return WEFT_SUCCESS;
    }
    if (e < 0)
        return weft_set_error(c, WEFT_ERR_TIMEOUT,
                              "shm: peer %d: its share of a %zu-byte copy (tag %d) did not land within %.0f s",
                              peer->rank, total, r->tag, c->cfg.timeout_s > 0 ? c->cfg.timeout_s : 300.0);
    if (e == ESRCH)
        return weft_set_error(c, WEFT_ERR_TRANSPORT,
                              "shm: peer %d: process %d is gone (process_vm_readv of %zu bytes, tag %d)",
                              peer->rank, (int)peer->pid, total, r->tag);
    if (e == EPERM || e == ENOSYS || (e == EFAULT && !peer->cma_used)) {
        /* Refused (ptrace policy, kernel without CMA, or a buffer CMA
         * cannot read): stop trying with this peer; pushes still work. */
        peer->cma_ok = 0;
        WEFT_INFO(c->rank, "peer %d: shm CMA refused (%s); using bounce buffers", peer->rank, strerror(e));
    }
    /* Anything else: decline this message; the push overwrites whatever
     * part of the buffer was already read. */
    return WEFT_EAGAIN;
}

static int shm_progress(struct weft_comm *c)
{
    struct shm_state *st = shm_state(c);
    if (st == NULL)
        return 0;
    int events = 0;
    for (int i = 0; i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        if (peer->pipe->tp_peer != peer)
            continue;
        events += drain_inbound(c, peer);
        if (peer->push_head)
            events += advance_pushes(c, peer);
        events += help_peer(c, peer);
    }
    return events;
}

static int shm_rndv_expect(struct weft_pipe *p, struct weft_request *r)
{
    struct shm_peer *peer = p->tp_peer;
    if (peer == NULL)
        return weft_set_error(p->comm, WEFT_ERR_TRANSPORT, "shm: peer %d: not connected", p->peer);
    r->tp_done = 0;
    list_append(&peer->expect_head, &peer->expect_tail, r);
    return WEFT_SUCCESS;
}

static int shm_rndv_push(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts)
{
    struct shm_peer *peer = p->tp_peer;
    if (peer == NULL)
        return weft_set_error(p->comm, WEFT_ERR_TRANSPORT, "shm: peer %d: not connected", p->peer);
    s->tp_done = 0;
    s->tp_aux[0] = cts->rreq;
    s->tp_aux[1] = 0;
    list_append(&peer->push_head, &peer->push_tail, s);
    atomic_fetch_add_explicit(&peer->pushes, 1, memory_order_relaxed);
    return WEFT_SUCCESS;
}

static void shm_abort_pipe(struct weft_pipe *p)
{
    struct shm_peer *peer = p->tp_peer;
    if (peer == NULL)
        return;
    for (struct weft_request *r = peer->push_head, *next; r; r = next) {
        next = r->tp_next;
        r->tp_next = NULL;
    }
    for (struct weft_request *r = peer->expect_head, *next; r; r = next) {
        next = r->tp_next;
        r->tp_next = NULL;
    }
    peer->push_head = peer->push_tail = NULL;
    peer->expect_head = peer->expect_tail = NULL;
    atomic_store_explicit(&peer->pushes, 0, memory_order_relaxed);
    atomic_store_explicit(&peer->out_need, 0, memory_order_relaxed);
}

/* Pushes still being copied in hold a sender's bytes we accepted. */
static int shm_busy(const struct weft_comm *c)
{
    const struct shm_state *st = shm_state(c);
    for (int i = 0; st && i < st->npeers; i++)
        if (st->peers[i].push_head)
            return 1;
    return 0;
}

/* ---- waiting ---- */

/* Whether anything could be done now: an inbound record, or room in a ring
 * we are blocked on. Reads only atomics, so it is safe without the lock. */
static int work_pending(struct shm_state *st)
{
    for (int i = 0; i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        if (!shm_ring_empty(peer->in))
            return 1;
        if (peer->help_out &&
            (atomic_load_explicit(&peer->help_out->claim, memory_order_relaxed) & SHM_HELP_IDX_MASK) !=
                SHM_HELP_CLOSED)
            return 1;
        size_t need = atomic_load_explicit(&peer->out_need, memory_order_relaxed);
        if ((need || atomic_load_explicit(&peer->pushes, memory_order_relaxed)) &&
            shm_ring_would_fit(peer->out, need))
            return 1;
    }
    return 0;
}

static void shm_sleep(struct weft_comm *c, int timeout_ms)
{
    struct shm_state *st = shm_state(c);
    if (st == NULL || st->seg == NULL || timeout_ms == 0)
        return;
    struct shm_seg_hdr *h = st->seg;
    /* Read the doorbell before announcing the sleep: a wake that lands
     * after this changes it, and futex_wait then returns at once. */
    uint32_t bell = atomic_load_explicit(&h->doorbell, memory_order_acquire);
    atomic_fetch_add_explicit(&h->sleepers, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    /* Wakers in registered processes skip their fence (waker_fence); this
     * barrier on their CPUs makes their published records visible to the
     * check below, or our count visible to them. */
    int barrier_ok = atomic_load(&shm_membarrier_state) == 1 &&
                     syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
    if (!work_pending(st)) {
        if (timeout_ms < 0 || timeout_ms > 1000)
            timeout_ms = 1000;  /* callers re-check their own deadlines */
        if (!barrier_ok && atomic_load(&shm_membarrier_state) == 1 && timeout_ms > 1)
            timeout_ms = 1;     /* peers skip fences but our barrier failed: poll */
        struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
        syscall(SYS_futex, &h->doorbell, FUTEX_WAIT, bell, &ts, NULL, 0);
    }
    atomic_fetch_sub_explicit(&h->sleepers, 1, memory_order_relaxed);
}

const struct weft_transport weft_transport_shm = {
    .name = "shm",
    .id = WEFT_TP_SHM,
    .card_fill = shm_card_fill,
    .connect = shm_connect,
    .disconnect = shm_disconnect,
    .eager_limit = shm_eager_limit,
    .ctrl_send = shm_ctrl_send,
    .progress = shm_progress,
    .rndv_get = shm_rndv_get,
    .rndv_expect = shm_rndv_expect,
    .rndv_push = shm_rndv_push,
    .abort_pipe = shm_abort_pipe,
    .busy = shm_busy,
    .sleep = shm_sleep,
};
