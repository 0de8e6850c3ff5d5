/*
 * shm transport: ranks on the same node.
 *
 * Each rank creates one POSIX shm segment holding a small header (doorbell
 * futex, sleeper count, pid) and, per shm peer, a help slot and one inbound
 * SPSC ring; peer P produces into "P -> me" inside my segment and I consume
 * it. The pipe's control frames (eager data included) travel as ring
 * records, opaque to this file: one record = the frame's header, then its
 * payload. Large messages move either
 *  - by CMA, one copy: the receiver pulls from the sender's buffer with
 *    process_vm_readv, and from SHM_SPLIT_MIN up the sender, idle while it
 *    waits for FIN, takes pieces of the same transfer and writes them with
 *    process_vm_writev (struct shm_help_slot), so two cores copy at once;
 *  - or, when CMA is off or refused, by a pipelined copy through the ring:
 *    the sender copies chunk k+1 in while the receiver copies chunk k out
 *    (DATA records, named by the rendezvous key rndv_expect made).
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

#include "weft.h"
#include "core.h"
#include "list.h"
#include "log.h"
#include "shm_ring.h"
#include "transport.h"

#define SHM_SEG_MAGIC 0x314d48535446574full  /* "OWFTSHM1" */

/* Largest piece one process_vm_readv call moves: keeps each call's iovec
 * length far below SSIZE_MAX and bounds the time between retries. */
#define SHM_CMA_MAX_IOV ((size_t)1 << 30)

/* Records drained from one inbound ring per progress pass, so one busy peer
 * cannot starve the others. */
#define SHM_DRAIN_BUDGET 256

/* Record types of this transport (first byte of a record). The pipe's
 * frames all start below WEFT_TP_FRAME_TYPE_LIMIT, so records from the
 * limit up are ours, on the same ring. */
enum {
    SHM_REC_DATA = WEFT_TP_FRAME_TYPE_LIMIT      /* a piece of a pushed message */
};

/* This rank's blob in the rank card. */
struct shm_card {
    char     name[64];       /* POSIX shm segment with this rank's inbound rings; "" = none */
    uint64_t token;          /* shm's own random token: the segment header repeats it */
    uint64_t probe_addr;     /* address of that token in the owner's process: CMA probe */
};
#define SHM_CARD_BYTES ((sizeof(struct shm_card) + 7) & ~(size_t)7)
_Static_assert(sizeof(struct shm_card) <= SHM_CARD_BYTES, "shm blob fits its card bytes");

/* A rendezvous key (rndv_expect -> CTS -> rndv_push): the receiver's
 * per-peer sequence number of the expected transfer, 8 bytes in host
 * order (both ends are on one node). */
#define SHM_KEY_BYTES sizeof(uint64_t)

/* Segment header; the ring offset table follows it, then the rings. */
struct shm_seg_hdr {
    uint64_t magic;
    uint64_t token;          /* the owner's shm token (its blob): a peer checks it */
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
    uint64_t key;            /* the receiver's key of the transfer (from CTS) */
    uint64_t offset;         /* where this piece goes in the message */
    uint64_t len;
    uint8_t  pad1[24];
};
_Static_assert(sizeof(struct shm_data_hdr) == 56, "DATA payload must be cache-line aligned");

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

/* Per-transfer state, in weft_tp_xfer.priv while shm holds the transfer:
 * on its peer's push FIFO (sender) or expect FIFO (receiver). */
struct shm_xfer {
    struct weft_qnode node;
    uint64_t          key;    /* the receiver's key: DATA records carry it */
    size_t            done;   /* bytes pushed / received so far */
    int               sent;   /* push: a record went out (a 0-byte message still sends one) */
};
WEFT_TP_PRIV_FITS(struct shm_xfer);

static inline struct weft_tp_xfer *xfer_of(struct weft_qnode *n)
{
    return weft_container_of((void *)weft_container_of(n, struct shm_xfer, node), struct weft_tp_xfer, priv);
}

struct shm_peer {
    int                   rank;
    pid_t                 pid;
    int                   cma_ok;       /* pulls from this peer work */
    int                   cma_used;     /* a pull has succeeded */
    int                   aborted;      /* abort_peer: the pipe broke; help no more, drop its data */
    struct shm_ring      *in;           /* peer -> me, in my segment */
    struct shm_ring      *out;          /* me -> peer, in the peer's segment */
    struct shm_help_slot *help_in;      /* transfers peer -> me, in my segment */
    struct shm_help_slot *help_out;     /* transfers me -> peer, in the peer's segment */
    int                   help_broken;  /* a process_vm_writev into the peer failed: stop helping */
    struct shm_seg_hdr   *peer_hdr;
    void                 *peer_map;
    size_t                peer_map_bytes;
    struct weft_queue     pushes_q;     /* sends to push, FIFO (struct shm_xfer) */
    struct weft_queue     expects_q;    /* receives a push will fill, in CTS order (struct shm_xfer) */
    uint64_t              expect_seq;   /* last key handed out by rndv_expect */
    _Atomic size_t        out_need;     /* payload size a blocked producer waits room for; 0 = none */
    _Atomic int           pushes;       /* entries on the push FIFO (read by sleep) */
};

struct shm_state {
    const struct weft_tp_env *env;
    uint64_t              token;        /* in the segment header and the blob; its address is the CMA probe */
    char                  name[64];
    int                   linked;       /* own segment name still in /dev/shm */
    struct shm_seg_hdr   *seg;
    size_t                seg_bytes;
    struct shm_peer      *peers;
    int                   npeers;
    struct shm_peer     **by_rank;      /* [size]: the peer of that rank, NULL = not shm */
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

static inline struct weft_core *shm_core(const struct shm_state *st)
{
    return st->env->core;
}

/* The peer of that rank, NULL when it does not use shm (or set-up failed). */
static struct shm_peer *peer_of(const struct shm_state *st, int rank)
{
    if (st == NULL || st->by_rank == NULL || rank < 0 || rank >= shm_core(st)->size)
        return NULL;
    return st->by_rank[rank];
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

static uint64_t random_u64(const void *salt)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
        v = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)salt << 16) ^ ((uint64_t)getpid() << 40);
    return v;
}

static int shm_create(const struct weft_tp_env *env, void *blob, void **ctx)
{
    struct weft_core *core = env->core;
    struct shm_state *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "shm: no memory for transport state");
    st->env = env;
    st->token = random_u64(st);
    uint64_t nonce = random_u64(&nonce);
    unsigned counter = atomic_fetch_add(&shm_segment_counter, 1);
    snprintf(st->name, sizeof(st->name), "/weft-%d-%016llx-%u", (int)getpid(),
             (unsigned long long)nonce, counter);

    struct shm_card mine;
    memset(&mine, 0, sizeof(mine));
    snprintf(mine.name, sizeof(mine.name), "%s", st->name);
    mine.token = st->token;
    mine.probe_addr = (uint64_t)(uintptr_t)&st->token;
    memcpy(blob, &mine, sizeof(mine));
    membarrier_register();

    if (core->cfg.shm_cma) {
        /* With Yama ptrace_scope=1 a peer may only process_vm_readv us if
         * we name it a tracer; "any" because peers are not our children.
         * EINVAL means Yama is absent and nothing needs allowing. */
        if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0 && errno != EINVAL)
            WEFT_INFO(core->rank, "shm: prctl(PR_SET_PTRACER) failed: %s; peers may not pull by CMA",
                      strerror(errno));
    }
    *ctx = st;
    return WEFT_SUCCESS;
}

/* Both cards offer a segment. The comm has already decided from the card
 * headers that the two ranks share an effective node (scope NODE). */
static int shm_reach(const struct weft_tp_cards *k, int me, int peer, char *why, size_t whylen)
{
    const char *a = weft_tp_blob(k, me);     /* name[] opens the blob */
    const char *b = weft_tp_blob(k, peer);
    if (b[0] == '\0' || a[0] == '\0') {
        if (why && whylen)
            snprintf(why, whylen, "no shm segment offered by rank %d", b[0] == '\0' ? peer : me);
        return 0;
    }
    return 1;
}

/* A peer's blob, copied out (the card area promises no alignment). */
static struct shm_card read_card(const struct shm_state *st, int rank)
{
    struct shm_card card;
    memcpy(&card, weft_tp_blob(&st->env->cards, rank), sizeof(card));
    card.name[sizeof(card.name) - 1] = '\0';
    return card;
}

/* Unmaps peers' segments and own; forgets the peers. */
static void release_peers(struct shm_state *st)
{
    for (int i = 0; i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        if (peer->peer_map)
            munmap(peer->peer_map, peer->peer_map_bytes);
    }
    if (st->linked) {
        shm_unlink(st->name);
        st->linked = 0;
    }
    if (st->seg)
        munmap(st->seg, st->seg_bytes);
    st->seg = NULL;
    free(st->peers);
    free(st->by_rank);
    st->peers = NULL;
    st->by_rank = NULL;
    st->npeers = 0;
}

static void shm_destroy(void *ctx)
{
    struct shm_state *st = ctx;
    if (st == NULL)
        return;
    release_peers(st);
    free(st);
}

/* Creates and maps own segment with one inbound ring per shm peer. */
static int create_segment(struct shm_state *st)
{
    struct weft_core *core = shm_core(st);
    size_t table = ((size_t)core->size * sizeof(uint64_t) + 63) & ~(size_t)63;
    /* per peer: its help slot, then its ring (the table points at the ring) */
    size_t ring_bytes = sizeof(struct shm_help_slot) + shm_ring_footprint(core->cfg.shm_ring_bytes);
    size_t bytes = sizeof(struct shm_seg_hdr) + table + (size_t)st->npeers * ring_bytes;

    int fd = shm_open(st->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: shm_open(%s) failed: %s",
                              st->name, strerror(errno));
    st->linked = 1;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: ftruncate(%s, %zu) failed: %s (is /dev/shm full?)",
                              st->name, bytes, strerror(e));
    }
    /* MAP_POPULATE: fault the pages in now, not on the first messages */
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (mem == MAP_FAILED)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: mmap of %s (%zu bytes) failed: %s",
                              st->name, bytes, strerror(e));
    st->seg = mem;
    st->seg_bytes = bytes;

    struct shm_seg_hdr *h = mem;
    h->token = st->token;
    h->bytes = bytes;
    h->pid = (int32_t)getpid();
    h->nranks = core->size;
    atomic_init(&h->doorbell, 0);
    atomic_init(&h->sleepers, 0);
    uint64_t *offs = seg_ring_table(h);
    size_t off = sizeof(struct shm_seg_hdr) + table;
    for (int i = 0; i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        peer->help_in = (struct shm_help_slot *)((char *)mem + off);
        atomic_init(&peer->help_in->claim, SHM_HELP_CLOSED);
        atomic_init(&peer->help_in->copied, 0);
        peer->in = shm_ring_init((char *)mem + off + sizeof(struct shm_help_slot), core->cfg.shm_ring_bytes);
        offs[peer->rank] = off + sizeof(struct shm_help_slot);
        off += ring_bytes;
    }
    st->max_payload = shm_ring_max_payload_for(core->cfg.shm_ring_bytes);
    /* magic last: a peer that sees it sees a finished header (the barrier
     * orders it anyway) */
    h->magic = SHM_SEG_MAGIC;
    return WEFT_SUCCESS;
}

/* Maps peer's segment and finds the ring it keeps for us. */
static int map_peer(struct shm_state *st, struct shm_peer *peer)
{
    struct weft_core *core = shm_core(st);
    const struct shm_card card = read_card(st, peer->rank);
    const char *name = card.name;

    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: shm_open(%s) failed: %s",
                              peer->rank, name, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < (off_t)sizeof(struct shm_seg_hdr)) {
        close(fd);
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: segment %s is missing or too small",
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
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: mmap of %s failed: %s",
                              peer->rank, name, strerror(e));
    peer->peer_map = mem;
    peer->peer_map_bytes = bytes;

    struct shm_seg_hdr *h = mem;
    size_t table = ((size_t)core->size * sizeof(uint64_t) + 63) & ~(size_t)63;
    if (h->magic != SHM_SEG_MAGIC || h->token != card.token || h->nranks != core->size ||
        h->bytes != bytes || sizeof(*h) + table > bytes)
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "shm: peer %d: segment %s does not belong to this job (bad magic, token or size)",
                              peer->rank, name);
    uint64_t off = seg_ring_table(h)[core->rank];
    if (off < sizeof(*h) + table + sizeof(struct shm_help_slot) || off % 64 != 0 || off >= bytes ||
        (peer->out = shm_ring_attach((char *)mem + off, bytes - off)) == NULL)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: segment %s has no valid ring for rank %d",
                              peer->rank, name, core->rank);
    peer->help_out = (struct shm_help_slot *)((char *)mem + off - sizeof(struct shm_help_slot));
    peer->peer_hdr = h;
    peer->pid = h->pid;
    return WEFT_SUCCESS;
}

/* Whether we may read the peer's memory: its blob says where its token is. */
static int probe_cma(struct shm_state *st, struct shm_peer *peer)
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

/* Allocates the peers (ranks whose pipe uses shm) and creates the segment. */
static int setup_peers(const struct weft_tp_env *env, struct shm_state *st)
{
    struct weft_core *core = env->core;
    int n = 0;
    for (int r = 0; r < core->size; r++)
        if (r != core->rank && env->uses[r])
            n++;
    if (n == 0)
        return WEFT_SUCCESS;
    st->peers = calloc((size_t)n, sizeof(*st->peers));
    st->by_rank = calloc((size_t)core->size, sizeof(*st->by_rank));
    if (st->peers == NULL || st->by_rank == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "shm: no memory for %d peers", n);
    for (int r = 0; r < core->size; r++) {
        if (r == core->rank || !env->uses[r])
            continue;
        struct shm_peer *peer = &st->peers[st->npeers++];
        peer->rank = r;
        weft_queue_init(&peer->pushes_q);
        weft_queue_init(&peer->expects_q);
        atomic_init(&peer->out_need, 0);
        atomic_init(&peer->pushes, 0);
    }
    return create_segment(st);
}

/* Every rank calls this, shm peers or not (ctx NULL included), because of
 * the two collective agreements: their number must not depend on what
 * happened here. */
static int shm_connect(const struct weft_tp_env *env, void *ctx)
{
    struct shm_state *st = ctx;
    int err = WEFT_SUCCESS;
    if (st != NULL) {
        st->env = env;
        err = setup_peers(env, st);
    }

    /* 1: every segment exists before anyone maps one */
    err = env->coll->agree(env->coll->arg, err, "shm set-up");
    for (int i = 0; st && err == WEFT_SUCCESS && i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        err = map_peer(st, peer);
        if (err == WEFT_SUCCESS) {
            peer->cma_ok = probe_cma(st, peer);
            WEFT_INFO(env->core->rank, "peer %d: shm, CMA %s%s", peer->rank, peer->cma_ok ? "yes" : "no",
                      env->core->cfg.shm_cma ? "" : " (WEFT_SHM_CMA=0)");
        }
    }
    /* 2: every peer has mapped our segment; the name can go, so a crash
     * later leaves nothing behind in /dev/shm */
    err = env->coll->agree(env->coll->arg, err, "shm set-up");
    if (st && st->linked) {
        shm_unlink(st->name);
        st->linked = 0;
    }
    if (err != WEFT_SUCCESS) {
        if (st)
            release_peers(st);
        return err;
    }
    /* the peers are reachable through by_rank only now */
    for (int i = 0; st && i < st->npeers; i++)
        st->by_rank[st->peers[i].rank] = &st->peers[i];
    return WEFT_SUCCESS;
}

/* ---- data path ---- */

static size_t shm_eager_limit(void *ctx, int peer, int internal)
{
    (void)peer;
    const struct shm_state *st = ctx;
    if (st == NULL)
        return 0;
    const struct weft_config *cfg = &shm_core(st)->cfg;
    size_t ring_max = shm_ring_max_payload_for(cfg->shm_ring_bytes) - WEFT_TP_CTRL_HDR_MAX;
    size_t limit = cfg->shm_eager_limit < ring_max ? cfg->shm_eager_limit : ring_max;
    /* The library's own lanes (collectives) may go eager for longer. */
    if (internal && cfg->shm_coll_eager > limit)
        limit = cfg->shm_coll_eager < ring_max ? cfg->shm_coll_eager : ring_max;
    return limit;
}

static int shm_ctrl_send(void *ctx, int rank, const void *hdr, size_t hdr_len, const void *payload, size_t len)
{
    struct shm_state *st = ctx;
    struct shm_peer *peer = peer_of(st, rank);
    if (peer == NULL)
        return weft_set_error(st ? shm_core(st) : NULL, WEFT_ERR_TRANSPORT, "shm: peer %d: not connected", rank);

    size_t total = hdr_len + len;
    if (total > shm_ring_max_payload(peer->out))
        return weft_set_error(shm_core(st), WEFT_ERR_INTERNAL,
                              "shm: peer %d: control message of %zu bytes exceeds the ring's record limit %zu",
                              rank, total, shm_ring_max_payload(peer->out));
    char *dst = reserve_or_wait(peer, total);
    if (dst == NULL)
        return WEFT_EAGAIN;
    memcpy(dst, hdr, hdr_len);
    if (len)
        memcpy(dst + hdr_len, payload, len);
    shm_ring_commit(peer->out, total);
    notify_consumer(peer);
    return WEFT_SUCCESS;
}

/* Forgets every transfer of peer (no rndv_done: the pipe fails them) and
 * stops helping it. */
static void forget_peer(struct shm_peer *peer)
{
    weft_queue_init(&peer->pushes_q);
    weft_queue_init(&peer->expects_q);
    peer->aborted = 1;
    atomic_store_explicit(&peer->pushes, 0, memory_order_relaxed);
    atomic_store_explicit(&peer->out_need, 0, memory_order_relaxed);
}

/* A DATA record that fits no expected transfer: the peer broke the
 * protocol. Recorded here, then the pipe breaks (peer_failed). */
static void protocol_error(struct shm_state *st, struct shm_peer *peer)
{
    forget_peer(peer);
    st->env->up->peer_failed(st->env->up->arg, peer->rank, WEFT_ERR_TRANSPORT);
}

/* One DATA record: copy it into the expected transfer its key names. */
static void on_data(struct shm_state *st, struct shm_peer *peer, const struct shm_data_hdr *d, size_t rec_len)
{
    struct weft_core *core = shm_core(st);
    if (peer->aborted) {
        /* the receive was aborted (pipe broken): drop what is still in flight */
        WEFT_TRACE(core->rank, "shm: peer %d: dropping %llu data bytes for a request no longer expected",
                   peer->rank, (unsigned long long)d->len);
        return;
    }
    /* Pushes arrive in CTS order, and keys were handed out in CTS order, so
     * the transfer is always the head of the expect FIFO. */
    struct weft_qnode *head = weft_queue_head(&peer->expects_q);
    if (head == NULL || weft_container_of(head, struct shm_xfer, node)->key != d->key) {
        if (head == NULL)
            weft_set_error(core, WEFT_ERR_TRANSPORT,
                           "shm: peer %d: data piece for transfer %llu, but no transfer is expected",
                           peer->rank, (unsigned long long)d->key);
        else
            weft_set_error(core, WEFT_ERR_TRANSPORT,
                           "shm: peer %d: data piece for transfer %llu, but transfer %llu is expected next",
                           peer->rank, (unsigned long long)d->key,
                           (unsigned long long)weft_container_of(head, struct shm_xfer, node)->key);
        protocol_error(st, peer);
        return;
    }
    struct weft_tp_xfer *x = xfer_of(head);
    struct shm_xfer *sx = WEFT_TP_PRIV(x, struct shm_xfer);
    if (d->len > rec_len - sizeof(*d) || d->offset > x->bytes || d->len > x->bytes - d->offset) {
        weft_set_error(core, WEFT_ERR_TRANSPORT,
                       "shm: peer %d: data piece [%llu, +%llu) does not fit the %zu-byte message of tag %d",
                       peer->rank, (unsigned long long)d->offset, (unsigned long long)d->len,
                       x->bytes, x->tag);
        protocol_error(st, peer);
        return;
    }
    if (d->len)
        memcpy((char *)x->buf + d->offset, d + 1, d->len);
    sx->done += d->len;
    if (st->env->up->on_data)
        st->env->up->on_data(st->env->up->arg, peer->rank);
    if (sx->done >= x->bytes) {
        weft_queue_pop(&peer->expects_q);
        st->env->up->rndv_done(st->env->up->arg, x, WEFT_SUCCESS);
    }
}

/* Consumes up to the budget of records from peer's inbound ring. A record
 * is released after its upcall returns (the frame lives in the ring during
 * on_ctrl); upcalls never consume this ring themselves. */
static int drain_inbound(struct shm_state *st, struct shm_peer *peer)
{
    const struct weft_tp_upcalls *up = st->env->up;
    int n = 0;
    size_t len;
    const void *rec;
    while (n < SHM_DRAIN_BUDGET && (rec = shm_ring_peek(peer->in, &len)) != NULL) {
        uint8_t type = len ? *(const uint8_t *)rec : 0xff;
        if (type == SHM_REC_DATA && len >= sizeof(struct shm_data_hdr)) {
            on_data(st, peer, rec, len);
        } else if (type < WEFT_TP_FRAME_TYPE_LIMIT) {
            up->on_ctrl(up->arg, peer->rank, rec, len);
        } else {
            WEFT_WARN(shm_core(st)->rank, "shm: peer %d: dropping malformed record (type %u, %zu bytes)",
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
static int advance_pushes(struct shm_state *st, struct shm_peer *peer)
{
    size_t chunk_max = st->max_payload - sizeof(struct shm_data_hdr);
    int n = 0;
    struct weft_qnode *head;
    while ((head = weft_queue_head(&peer->pushes_q)) != NULL) {
        struct weft_tp_xfer *x = xfer_of(head);
        struct shm_xfer *sx = WEFT_TP_PRIV(x, struct shm_xfer);
        size_t piece = push_piece(x->bytes, shm_core(st)->cfg.shm_chunk, chunk_max);
        /* sx->sent: a record went out (a 0-byte message still sends one) */
        while (sx->done < x->bytes || sx->sent == 0) {
            size_t len = x->bytes - sx->done;
            if (len > piece)
                len = piece;
            struct shm_data_hdr *d = reserve_or_wait(peer, sizeof(*d) + len);
            if (d == NULL)
                return n;
            d->type = SHM_REC_DATA;
            d->key = sx->key;
            d->offset = sx->done;
            d->len = len;
            if (len)
                memcpy(d + 1, (const char *)x->buf + sx->done, len);
            shm_ring_commit(peer->out, sizeof(*d) + len);
            /* per piece, so a sleeping receiver starts copying out now */
            notify_consumer(peer);
            sx->done += len;
            sx->sent = 1;
            n++;
            if (st->env->up->on_data)
                st->env->up->on_data(st->env->up->arg, peer->rank);
        }
        weft_queue_pop(&peer->pushes_q);
        atomic_fetch_sub_explicit(&peer->pushes, 1, memory_order_relaxed);
        st->env->up->rndv_done(st->env->up->arg, x, WEFT_SUCCESS);
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
static int help_peer(struct shm_state *st, struct shm_peer *peer)
{
    struct shm_help_slot *h = peer->help_out;
    /* an aborted peer (broken pipe) may have failed the send whose buffer
     * the slot names */
    if (h == NULL || !peer->cma_ok || peer->help_broken || peer->aborted ||
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
static int cma_pull_shared(struct shm_state *st, struct shm_peer *peer, char *buf, uint64_t src, size_t total)
{
    const struct weft_config *cfg = &shm_core(st)->cfg;
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
            deadline = now + (cfg->timeout_s > 0 ? cfg->timeout_s : 300.0);
        else if (kill(peer->pid, 0) != 0 && errno == ESRCH)
            return ESRCH;   /* the sender died mid-piece: not a timeout */
        else if (now > deadline)
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

static unsigned shm_rndv_mem(void *ctx, int peer)
{
    (void)ctx;
    (void)peer;
    return WEFT_TP_MEM_HOST;
}

static int shm_rndv_get(void *ctx, int rank, struct weft_tp_xfer *x, const struct weft_tp_src *src)
{
    struct shm_state *st = ctx;
    struct shm_peer *peer = peer_of(st, rank);
    if (peer == NULL)
        return WEFT_EAGAIN;  /* decline: the sender pushes through the ring */
    struct weft_core *core = shm_core(st);
    if (!core->cfg.shm_cma || !peer->cma_ok || x->bytes < core->cfg.shm_cma_min)
        return WEFT_EAGAIN;

    size_t total = x->bytes;
    /* Sharing needs a core for the sender; with more ranks than cores it
     * would only make us wait for a preempted sender's piece. */
    int e = total >= SHM_SPLIT_MIN && !core->oversubscribed
                ? cma_pull_shared(st, peer, x->buf, src->addr, total)
                : cma_copy(peer->pid, 0, x->buf, src->addr, total);
    if (e == 0) {
        peer->cma_used = 1;
        return WEFT_SUCCESS;
    }
    if (e < 0)
        return weft_set_error(core, WEFT_ERR_TIMEOUT,
                              "shm: peer %d: its share of a %zu-byte copy (tag %d) did not land within %.0f s",
                              peer->rank, total, x->tag, core->cfg.timeout_s > 0 ? core->cfg.timeout_s : 300.0);
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

static int shm_progress(void *ctx)
{
    struct shm_state *st = ctx;
    if (st == NULL || st->by_rank == NULL)
        return 0;  /* nothing connected */
    int events = 0;
    for (int i = 0; i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        events += drain_inbound(st, peer);
        if (!weft_queue_empty(&peer->pushes_q))
            events += advance_pushes(st, peer);
        events += help_peer(st, peer);
    }
    return events;
}

/* Receiver: the key is the next per-peer sequence number; the DATA records
 * of the push carry it back. */
static int shm_rndv_expect(void *ctx, int rank, struct weft_tp_xfer *x, const struct weft_tp_src *src,
                           void *key, size_t *keylen)
{
    (void)src;
    struct shm_state *st = ctx;
    struct shm_peer *peer = peer_of(st, rank);
    if (peer == NULL)
        return weft_set_error(st ? shm_core(st) : NULL, WEFT_ERR_TRANSPORT, "shm: peer %d: not connected", rank);
    struct shm_xfer *sx = WEFT_TP_PRIV(x, struct shm_xfer);
    memset(sx, 0, sizeof(*sx));
    sx->key = ++peer->expect_seq;
    memcpy(key, &sx->key, SHM_KEY_BYTES);
    *keylen = SHM_KEY_BYTES;
    weft_queue_push(&peer->expects_q, &sx->node);
    return WEFT_SUCCESS;
}

static int shm_rndv_push(void *ctx, int rank, struct weft_tp_xfer *x, const void *key, size_t keylen)
{
    struct shm_state *st = ctx;
    struct shm_peer *peer = peer_of(st, rank);
    if (peer == NULL)
        return weft_set_error(st ? shm_core(st) : NULL, WEFT_ERR_TRANSPORT, "shm: peer %d: not connected", rank);
    if (keylen != SHM_KEY_BYTES)
        return weft_set_error(shm_core(st), WEFT_ERR_TRANSPORT,
                              "shm: peer %d: rendezvous key of %zu bytes (tag %d), expected %zu",
                              rank, keylen, x->tag, (size_t)SHM_KEY_BYTES);
    struct shm_xfer *sx = WEFT_TP_PRIV(x, struct shm_xfer);
    memset(sx, 0, sizeof(*sx));
    memcpy(&sx->key, key, SHM_KEY_BYTES);
    weft_queue_push(&peer->pushes_q, &sx->node);
    atomic_fetch_add_explicit(&peer->pushes, 1, memory_order_relaxed);
    return WEFT_SUCCESS;
}

static void shm_abort_peer(void *ctx, int rank)
{
    struct shm_peer *peer = peer_of(ctx, rank);
    if (peer != NULL)
        forget_peer(peer);
}

/* Pushes still being copied in hold a sender's bytes we accepted. */
static int shm_busy(void *ctx)
{
    const struct shm_state *st = ctx;
    for (int i = 0; st && i < st->npeers; i++)
        if (!weft_queue_empty(&st->peers[i].pushes_q))
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

static void shm_sleep(void *ctx, int timeout_ms)
{
    struct shm_state *st = ctx;
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
    .ctrl = 1,
    .scope = WEFT_TP_SCOPE_NODE,
    .sure = 1,
    .card_bytes = SHM_CARD_BYTES,
    .create = shm_create,
    .reach = shm_reach,
    .connect = shm_connect,
    .destroy = shm_destroy,
    .eager_limit = shm_eager_limit,
    .ctrl_send = shm_ctrl_send,
    .progress = shm_progress,
    .rndv_mem = shm_rndv_mem,
    .rndv_get = shm_rndv_get,
    .rndv_expect = shm_rndv_expect,
    .rndv_push = shm_rndv_push,
    .abort_peer = shm_abort_peer,
    .busy = shm_busy,
    .wakeless = NULL,
    .sleep = shm_sleep,
    .mem_pin = NULL,
    .mem_unpin = NULL,
};
