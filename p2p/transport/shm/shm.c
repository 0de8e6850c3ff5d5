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
 *
 * This file holds the segments, the lanes (rings, their growth, DATA
 * pushes through them) and waking. The CMA path (its permission and
 * probe, the single-copy pull, the shared pieces the sender helps with,
 * and the fallback to the ring when CMA is refused) is in shm_cma.c; the
 * state both share is in shm_int.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"
#include "core.h"
#include "list.h"
#include "log.h"
#include "shm_int.h"
#include "shm_ring_inline.h"
#include "transport.h"
#include "tp_iov.h"

#define SHM_SEG_MAGIC 0x314d48535446574full  /* "OWFTSHM1" */

/* Records drained from one inbound ring per progress pass, so one busy peer
 * cannot starve the others. */
#define SHM_DRAIN_BUDGET 256

/* Record types of this transport (first byte of a record). The pipe's
 * frames all start below WEFT_TP_FRAME_TYPE_LIMIT, so records from the
 * limit up are ours, on the same ring. */
enum {
    SHM_REC_DATA = WEFT_TP_FRAME_TYPE_LIMIT,     /* a piece of a pushed message */
    SHM_REC_SWITCH                               /* the producer moved to its lane's next generation */
};

#define SHM_LANE_MAGIC 0x314e4c5f54465745ull  /* "EWFT_LN1" */

/* A lane grows once its producer found the ring full this many times. */
#define SHM_GROW_STALLS 8

/* A rendezvous key (rndv_expect -> CTS -> rndv_push): the receiver's
 * per-peer sequence number of the expected transfer, 8 bytes in host
 * order (both ends are on one node). */
#define SHM_KEY_BYTES sizeof(uint64_t)

static inline _Atomic uint64_t *home_knock_map(struct shm_home_hdr *h)
{
    return (_Atomic uint64_t *)(void *)(h + 1);  /* bit r: rank r made a lane toward the owner */
}

static inline size_t home_bytes(int nranks)
{
    return sizeof(struct shm_home_hdr) + ((size_t)(nranks + 63) / 64) * sizeof(uint64_t);
}

/* Lane: the ring from one rank (its producer) to one peer (its consumer),
 * in a segment of its own that the producer makes at its first message to
 * that peer, then knocks. Generation 0 also holds the help slot of CMA
 * transfers in that direction and stays mapped until destroy; a busy lane
 * grows by a new generation that holds only a bigger ring (SWITCH record).
 * The consumer unlinks a lane's name once it mapped it, so only the home
 * segment's name outlives the first messages. */
struct shm_lane_hdr {
    uint64_t magic;          /* SHM_LANE_MAGIC, stored last (release) */
    uint64_t token;          /* the producer's token mixed with the consumer's rank */
    uint64_t bytes;          /* segment size */
    int32_t  producer;
    int32_t  consumer;
    uint32_t gen;
    uint32_t pad0;
    uint64_t ring_off;       /* where the ring starts */
    char     pad[16];
};
_Static_assert(sizeof(struct shm_lane_hdr) == 64, "lane header is one cache line");

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

/* Per-transfer state, in weft_tp_xfer.priv while shm holds the transfer:
 * on its peer's push FIFO (sender) or expect FIFO (receiver). */
struct shm_xfer {
    struct weft_qnode node;
    uint64_t          key;    /* the receiver's key: DATA records carry it */
    size_t            done;   /* bytes pushed / received so far */
    int               sent;   /* push: a record went out (a 0-byte message still sends one) */
    int               timed;  /* expect: its pieces' arrival times count for the push's speed */
};
WEFT_TP_PRIV_FITS(struct shm_xfer);

static inline struct weft_tp_xfer *xfer_of(struct weft_qnode *n)
{
    return weft_container_of((void *)weft_container_of(n, struct shm_xfer, node), struct weft_tp_xfer, priv);
}

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

/* ---- futex doorbells ---- */

/* Wakes the owner of h if one of its threads sleeps. Callers publish what
 * the sleeper should see, then waker_fence(), then call this: a sleeper
 * counts itself in and runs a barrier (membarrier or fence) before it
 * re-checks, so either we see its count here or it sees our update and
 * does not sleep. */
__attribute__((noinline, cold)) void weft_shm_ring_doorbell(struct shm_home_hdr *h)
{
    atomic_fetch_add_explicit(&h->doorbell, 1, memory_order_release);
    /* shared (not PRIVATE) futex: the waiter is another process */
    syscall(SYS_futex, &h->doorbell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}


/* After publishing records into peer's ring: wake the peer if it sleeps. */
static inline void notify_consumer(struct shm_peer *peer)
{
    waker_fence();
    wake_sleepers(peer->peer_hdr);
}

/* After releasing records of peer's inbound ring: wake the peer if it
 * asked for room there and sleeps. */
static void notify_producer(struct shm_peer *peer)
{
    waker_fence();
    if (shm_ring_take_waiter_inl(peer->in))
        wake_sleepers(peer->peer_hdr);
}

/* Producer side, after a reserve of len (at most the ring's max payload)
 * found no room: record that we wait for room (the consumer then wakes us)
 * and return NULL, or the reservation when room appeared meanwhile. */
static __attribute__((noinline)) void *reserve_or_wait_slow(struct shm_peer *peer, size_t len)
{
    void *dst = NULL;
    atomic_store_explicit(&peer->out_need, len, memory_order_relaxed);
    peer->out_stalls++;
    if (shm_ring_want_room(peer->out, len)) {
        dst = shm_ring_reserve_inl(peer->out, len);
        if (dst)
            atomic_store_explicit(&peer->out_need, 0, memory_order_relaxed);
    }
    return dst;
}

/* Producer side: reserve len bytes (at most the ring's max payload) in the
 * peer's ring, or record that we wait for room and return NULL. */
static inline void *reserve_or_wait(struct shm_peer *peer, size_t len)
{
    void *dst = shm_ring_reserve_inl(peer->out, len);
    if (__builtin_expect(dst == NULL, 0))
        return reserve_or_wait_slow(peer, len);
    /* a blocked producer's note is cleared once, not stored on every record
     * (sleep reads the line from other threads) */
    if (__builtin_expect(atomic_load_explicit(&peer->out_need, memory_order_relaxed) != 0, 0))
        atomic_store_explicit(&peer->out_need, 0, memory_order_relaxed);
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

/* Creates and maps this rank's home segment: header and knock map. */
static int create_home(struct shm_state *st)
{
    struct weft_core *core = shm_core(st);
    size_t bytes = home_bytes(core->size);
    int fd = shm_open(st->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: shm_open(%s) failed: %s", st->name, strerror(errno));
    st->linked = 1;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: ftruncate(%s, %zu) failed: %s (is /dev/shm full?)",
                              st->name, bytes, strerror(e));
    }
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (mem == MAP_FAILED)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: mmap of %s (%zu bytes) failed: %s", st->name, bytes,
                              strerror(e));
    struct shm_home_hdr *h = mem;
    h->token = st->token;
    h->bytes = bytes;
    h->pid = (int32_t)getpid();
    h->nranks = core->size;
    atomic_init(&h->doorbell, 0);
    atomic_init(&h->sleepers, 0);
    atomic_init(&h->knocks, 0);
    /* the knock map is zero (a fresh segment); magic last */
    __atomic_store_n(&h->magic, SHM_SEG_MAGIC, __ATOMIC_RELEASE);
    st->seg = h;
    st->seg_bytes = bytes;
    return WEFT_SUCCESS;
}

/* The smallest ring that carries the largest eager frame of either lane
 * kind (the library's collectives go eager for longer): every lane starts
 * with it, and a budget never shrinks a ring below it. */
static size_t ring_min_for(const struct weft_config *cfg)
{
    size_t eager = cfg->shm_eager_limit > cfg->shm_coll_eager ? cfg->shm_eager_limit : cfg->shm_coll_eager;
    size_t need = eager + WEFT_TP_CTRL_HDR_MAX;
    if (need < WEFT_TP_CTRL_PAYLOAD_MIN + WEFT_TP_CTRL_HDR_MAX)
        need = WEFT_TP_CTRL_PAYLOAD_MIN + WEFT_TP_CTRL_HDR_MAX;
    size_t cap = (size_t)64 << 10;
    while (shm_ring_max_payload_for(cap) < need + sizeof(struct shm_data_hdr))
        cap <<= 1;
    size_t most = shm_ring_capacity_for(cfg->shm_ring_bytes);
    return cap < most ? cap : most;
}

/* Home segments stay named for the comm's life (a peer opens them at its
 * first message), so a process killed mid-job leaves its own behind. The
 * first create of each process removes such leftovers: /dev/shm entries
 * "weft-<pid>-..." of this user whose process no longer exists. */
static void sweep_dead_segments(int rank)
{
    static _Atomic int swept;
    if (atomic_exchange(&swept, 1))
        return;
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return;
    struct dirent *e;
    int removed = 0;
    while ((e = readdir(d)) != NULL) {
        int pid = 0;
        if (strncmp(e->d_name, "weft-", 5) != 0 || sscanf(e->d_name + 5, "%d-", &pid) != 1 || pid <= 0)
            continue;
        struct stat sb;
        if (kill(pid, 0) == 0 || errno != ESRCH || fstatat(dirfd(d), e->d_name, &sb, 0) != 0 ||
            sb.st_uid != geteuid())
            continue;
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (shm_unlink(name) == 0)
            removed++;
    }
    closedir(d);
    if (removed)
        WEFT_INFO(rank, "shm: removed %d segment(s) of ended processes from /dev/shm", removed);
}

static int shm_create(const struct weft_tp_env *env, void *blob, void **ctx)
{
    struct weft_core *core = env->core;
    struct shm_state *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "shm: no memory for transport state");
    st->env = env;
    st->token = random_u64(st);
    st->ring_min = ring_min_for(&core->cfg);
    st->lane_budget = core->cfg.shm_budget;
    sweep_dead_segments(core->rank);
    uint64_t nonce = random_u64(&nonce);
    unsigned counter = atomic_fetch_add(&shm_segment_counter, 1);
    snprintf(st->name, sizeof(st->name), "/weft-%d-%016llx-%u", (int)getpid(), (unsigned long long)nonce, counter);
    int rc = create_home(st);
    if (rc != WEFT_SUCCESS) {
        /* nothing in the blob: reach() refuses shm for this rank */
        if (st->linked)
            shm_unlink(st->name);
        free(st);
        return rc;
    }

    struct shm_card mine;
    memset(&mine, 0, sizeof(mine));
    snprintf(mine.name, sizeof(mine.name), "%s", st->name);
    mine.token = st->token;
    mine.probe_addr = (uint64_t)(uintptr_t)&st->token;
    memcpy(blob, &mine, sizeof(mine));
    membarrier_register();

    weft_shm_cma_allow_peers(core);
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


/* Lane segment names: the producer's home name, the consumer, the generation. */
static void lane_name(char *out, size_t len, const char *producer_home, int consumer, unsigned gen)
{
    snprintf(out, len, "%s-to%d-%u", producer_home, consumer, gen);
}

static uint64_t lane_token(uint64_t producer_token, int consumer, unsigned gen)
{
    return producer_token ^ ((uint64_t)(uint32_t)consumer * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)gen << 56);
}

/* Unmaps every lane and home mapping; unlinks what this rank still has linked. */
static void release_peers(struct shm_state *st)
{
    for (int i = 0; i < st->npeers; i++) {
        struct shm_peer *peer = &st->peers[i];
        for (int d = 0; d < 2; d++)
            for (unsigned g = 0; g < SHM_LANE_GENS; g++) {
                if (peer->lane_maps[d][g] == NULL)
                    continue;
                munmap(peer->lane_maps[d][g], peer->lane_bytes[d][g]);
                if (d == 0) {
                    /* our lane: the peer unlinks it when it maps it; one it
                     * never mapped is still named */
                    char name[128];
                    lane_name(name, sizeof(name), st->name, peer->rank, g);
                    shm_unlink(name);
                }
            }
        if (peer->peer_hdr)
            munmap(peer->peer_hdr, peer->peer_home_bytes);
    }
    if (st->linked) {
        shm_unlink(st->name);
        st->linked = 0;
    }
    free(st->peers);
    free(st->by_rank);
    free(st->live);
    st->peers = NULL;
    st->by_rank = NULL;
    st->nranks = 0;
    st->live = NULL;
    st->npeers = 0;
    atomic_store(&st->nlive, 0);
}

static void shm_destroy(void *ctx)
{
    struct shm_state *st = ctx;
    if (st == NULL)
        return;
    release_peers(st);
    if (st->seg)
        munmap(st->seg, st->seg_bytes);
    if (st->linked)
        shm_unlink(st->name);
    free(st);
}

/* transport.h, probe: create's own steps (the home segment in /dev/shm),
 * then the CMA probe a peer makes at first contact, from a child process
 * (weft_shm_cma_check). */
static int shm_probe(struct weft_core *core, char *what, size_t len)
{
    struct weft_tp_env env;
    struct shm_card card;
    void *ctx = NULL;
    char cma[256] = "";

    memset(&env, 0, sizeof(env));
    env.core = core;
    memset(&card, 0, sizeof(card));
    if (shm_create(&env, &card, &ctx) != WEFT_SUCCESS) {
        weft_error_last_reason(core, what, len);
        return 0;
    }
    struct shm_state *st = ctx;
    env.cards.base = (const unsigned char *)&card;
    env.cards.stride = sizeof(card);
    env.cards.blob_off = 0;
    int ok = weft_shm_cma_check(st, cma, sizeof(cma));
    snprintf(what, len, "segments in /dev/shm; single-copy CMA: %s%s%s", ok ? "yes" : "no", ok ? "" : ", ",
             ok ? "" : cma);
    shm_destroy(st);
    return 1;
}

/* First contact with a peer, either way: maps its home segment (doorbell,
 * knock map, pid) and probes CMA. A home that is gone means the peer left
 * the comm (destroy) or never finished create: the error says so. */
static int map_home(struct shm_state *st, struct shm_peer *peer)
{
    struct weft_core *core = shm_core(st);
    const struct shm_card card = read_card(st, peer->rank);
    int fd = shm_open(card.name, O_RDWR, 0);
    if (fd < 0) {
        int e = errno;
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "shm: peer %d: its segment %s cannot be opened (%s)%s", peer->rank, card.name,
                              strerror(e), e == ENOENT ? ": the peer has left the comm or its process ended" : "");
    }
    struct stat sb;
    size_t want = home_bytes(core->size);
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != want) {
        close(fd);
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: segment %s is not %zu bytes", peer->rank,
                              card.name, want);
    }
    void *mem = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (mem == MAP_FAILED)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: mmap of %s failed: %s", peer->rank,
                              card.name, strerror(e));
    struct shm_home_hdr *h = mem;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SHM_SEG_MAGIC || h->token != card.token ||
        h->nranks != core->size || h->bytes != want) {
        munmap(mem, want);
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "shm: peer %d: segment %s does not belong to this comm (bad magic, token or size)",
                              peer->rank, card.name);
    }
    if (kill(h->pid, 0) != 0 && errno == ESRCH) {
        int pid = h->pid;
        munmap(mem, want);
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: its process %d has ended", peer->rank, pid);
    }
    peer->peer_hdr = h;
    peer->peer_home_bytes = want;
    peer->pid = h->pid;
    peer->cma_ok = weft_shm_probe_cma(st, peer);
    return WEFT_SUCCESS;
}

/* Puts peer on the live list (progress and sleep look only there). */
static void list_live(struct shm_state *st, struct shm_peer *peer)
{
    if (peer->listed)
        return;
    peer->listed = 1;
    int n = atomic_load_explicit(&st->nlive, memory_order_relaxed);
    st->live[n] = peer;
    atomic_store_explicit(&st->nlive, n + 1, memory_order_release);
}

/* Makes our lane of generation gen toward peer with a ring of cap bytes;
 * on success the mapping is recorded and *ring, *help point into it. */
static int lane_create(struct shm_state *st, struct shm_peer *peer, unsigned gen, size_t cap, struct shm_ring **ring,
                       struct shm_help_slot **help)
{
    struct weft_core *core = shm_core(st);
    char name[128];
    lane_name(name, sizeof(name), st->name, peer->rank, gen);
    size_t ring_off = sizeof(struct shm_lane_hdr) + (gen == 0 ? sizeof(struct shm_help_slot) : 0);
    size_t bytes = ring_off + shm_ring_footprint(cap);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: shm_open(%s) failed: %s", peer->rank, name,
                              strerror(errno));
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "shm: peer %d: ftruncate(%s, %zu) failed: %s (is /dev/shm full?)", peer->rank, name,
                              bytes, strerror(e));
    }
    /* MAP_POPULATE: fault the ring in now, not on the first records */
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (mem == MAP_FAILED) {
        shm_unlink(name);
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: mmap of %s (%zu bytes) failed: %s",
                              peer->rank, name, bytes, strerror(e));
    }
    struct shm_lane_hdr *h = mem;
    h->token = lane_token(st->token, peer->rank, gen);
    h->bytes = bytes;
    h->producer = core->rank;
    h->consumer = peer->rank;
    h->gen = gen;
    h->ring_off = ring_off;
    if (gen == 0) {
        *help = (struct shm_help_slot *)(void *)((char *)mem + sizeof(*h));
        atomic_init(&(*help)->claim, SHM_HELP_CLOSED);
        atomic_init(&(*help)->copied, 0);
    }
    *ring = shm_ring_init((char *)mem + ring_off, cap);
    __atomic_store_n(&h->magic, SHM_LANE_MAGIC, __ATOMIC_RELEASE);
    peer->lane_maps[0][gen] = mem;
    peer->lane_bytes[0][gen] = bytes;
    st->lane_held += shm_ring_capacity_for(cap);
    return WEFT_SUCCESS;
}

/* Maps the peer's lane of generation gen toward us and unlinks its name
 * (both ends have it now). */
static int lane_open(struct shm_state *st, struct shm_peer *peer, unsigned gen, struct shm_ring **ring,
                     struct shm_help_slot **help)
{
    struct weft_core *core = shm_core(st);
    const struct shm_card card = read_card(st, peer->rank);
    char name[128];
    lane_name(name, sizeof(name), card.name, core->rank, gen);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: its lane %s cannot be opened: %s",
                              peer->rank, name, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < (off_t)(sizeof(struct shm_lane_hdr) + 64)) {
        close(fd);
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: lane %s is missing or too small", peer->rank,
                              name);
    }
    size_t bytes = (size_t)sb.st_size;
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (mem == MAP_FAILED)
        return weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: mmap of %s failed: %s", peer->rank, name,
                              strerror(e));
    shm_unlink(name);
    const struct shm_lane_hdr *h = mem;
    size_t want_off = sizeof(*h) + (gen == 0 ? sizeof(struct shm_help_slot) : 0);
    struct shm_ring *r = NULL;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SHM_LANE_MAGIC ||
        h->token != lane_token(card.token, core->rank, gen) || h->producer != peer->rank ||
        h->consumer != core->rank || h->gen != gen || h->bytes != bytes || h->ring_off != want_off ||
        (r = shm_ring_attach((char *)mem + want_off, bytes - want_off)) == NULL) {
        munmap(mem, bytes);
        return weft_set_error(core, WEFT_ERR_TRANSPORT,
                              "shm: peer %d: lane %s does not belong to this comm (bad magic, token or ring)",
                              peer->rank, name);
    }
    if (gen == 0)
        *help = (struct shm_help_slot *)(void *)((char *)mem + sizeof(*h));
    *ring = r;
    peer->lane_maps[1][gen] = mem;
    peer->lane_bytes[1][gen] = bytes;
    return WEFT_SUCCESS;
}

/* Our first message to peer: map its home if needed, make our lane, knock.
 * Nothing here waits for the peer: it maps the lane when it next looks at
 * its knocks (any progress call), and the records wait in the ring. */
static int link_out(struct shm_state *st, struct shm_peer *peer)
{
    struct weft_core *core = shm_core(st);
    int rc = WEFT_SUCCESS;
    if (peer->peer_hdr == NULL)
        rc = map_home(st, peer);
    struct shm_ring *ring = NULL;
    struct shm_help_slot *help = NULL;
    if (rc == WEFT_SUCCESS)
        rc = lane_create(st, peer, 0, st->ring_min, &ring, &help);
    if (rc != WEFT_SUCCESS)
        return rc;
    peer->help_out = help;
    peer->out_cap = shm_ring_capacity_for(st->ring_min);
    __atomic_store_n(&peer->out, ring, __ATOMIC_RELEASE);
    list_live(st, peer);
    /* knock: our bit, then the counter the owner polls, then its doorbell */
    _Atomic uint64_t *map = home_knock_map(peer->peer_hdr);
    atomic_fetch_or_explicit(&map[core->rank / 64], UINT64_C(1) << (core->rank % 64), memory_order_release);
    atomic_fetch_add_explicit(&peer->peer_hdr->knocks, 1, memory_order_release);
    waker_fence();
    wake_sleepers(peer->peer_hdr);
    WEFT_INFO(core->rank, "peer %d: shm lane made (ring %zu KiB), CMA %s%s", peer->rank, st->ring_min >> 10,
              peer->cma_ok ? "yes" : "no", core->cfg.shm_cma ? "" : " (WEFT_SHM_CMA=0)");
    return WEFT_SUCCESS;
}

/* The peer knocked: map its lane toward us. */
static int link_in(struct shm_state *st, struct shm_peer *peer)
{
    int rc = WEFT_SUCCESS;
    if (peer->peer_hdr == NULL)
        rc = map_home(st, peer);
    struct shm_ring *ring = NULL;
    struct shm_help_slot *help = NULL;
    if (rc == WEFT_SUCCESS)
        rc = lane_open(st, peer, 0, &ring, &help);
    if (rc != WEFT_SUCCESS)
        return rc;
    peer->help_in = help;
    __atomic_store_n(&peer->in, ring, __ATOMIC_RELEASE);
    list_live(st, peer);
    WEFT_TRACE(shm_core(st)->rank, "peer %d: shm lane from the peer mapped", peer->rank);
    return WEFT_SUCCESS;
}

/* Knocks since the last look: map the lanes of the peers that knocked. A
 * lane that cannot be mapped fails that peer's pipe (the error says why). */
static __attribute__((noinline)) int take_knocks_slow(struct shm_state *st, uint32_t k)
{
    __atomic_store_n(&st->knocks_seen, k, __ATOMIC_RELAXED);
    struct weft_core *core = shm_core(st);
    _Atomic uint64_t *map = home_knock_map(st->seg);
    int n = 0;
    for (int w = 0; w < (core->size + 63) / 64; w++) {
        uint64_t bits = atomic_exchange_explicit(&map[w], 0, memory_order_acq_rel);
        while (bits) {
            int r = w * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            struct shm_peer *peer = r < core->size ? st->by_rank[r] : NULL;
            if (peer == NULL) {
                WEFT_WARN(core->rank, "shm: a knock from rank %d, which does not use shm with this rank: ignored", r);
                continue;
            }
            if (peer->in != NULL || peer->aborted)
                continue;
            if (link_in(st, peer) != WEFT_SUCCESS) {
                st->env->up->peer_failed(st->env->up->arg, peer->rank, WEFT_ERR_TRANSPORT);
                continue;
            }
            n++;
        }
    }
    return n;
}

/* The polled part: one load of the counter, inlined into progress. */
static inline int take_knocks(struct shm_state *st)
{
    uint32_t k = atomic_load_explicit(&st->seg->knocks, memory_order_acquire);
    if (__builtin_expect(k == st->knocks_seen, 1))
        return 0;
    return take_knocks_slow(st, k);
}

/* Allocates the peers (ranks whose pipe uses shm): bookkeeping only, no
 * shared memory. Lanes come with the first message of each direction. */
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
    st->live = calloc((size_t)n, sizeof(*st->live));
    if (st->peers == NULL || st->by_rank == NULL || st->live == NULL)
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
        st->by_rank[r] = peer;
    }
    st->nranks = core->size;
    return WEFT_SUCCESS;
}

/* Local only: no collective step (the home segments exist since create,
 * before anyone could read a card naming them). */
static int shm_connect(const struct weft_tp_env *env, void *ctx)
{
    struct shm_state *st = ctx;
    if (st == NULL)
        return WEFT_SUCCESS;
    st->env = env;
    int err = setup_peers(env, st);
    if (err != WEFT_SUCCESS)
        release_peers(st);
    else if (st->npeers == 0)
        WEFT_TRACE(env->core->rank, "shm: no peer of this rank uses shm");
    return err;
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

/* A SWITCH record: the producer's next records are in generation gen. */
struct shm_switch_rec {
    uint8_t  type;           /* SHM_REC_SWITCH */
    uint8_t  pad[3];
    uint32_t gen;
};

/* The out ring of a busy peer (full SHM_GROW_STALLS times) grows x4, up to
 * WEFT_SHM_RING_KB and within WEFT_SHM_BUDGET_MB: a new lane generation,
 * announced by a SWITCH record as the last record of the old ring, so the
 * consumer reads every record of the old ring first. Does nothing (retried
 * later) while the old ring has no room for the SWITCH record. */
static void maybe_grow(struct shm_state *st, struct shm_peer *peer)
{
    struct weft_core *core = shm_core(st);
    size_t most = shm_ring_capacity_for(core->cfg.shm_ring_bytes);
    if (peer->grow_denied || peer->out_cap >= most || peer->out_gen + 1 >= SHM_LANE_GENS || peer->aborted) {
        peer->out_stalls = 0;
        return;
    }
    size_t cap = peer->out_cap * 4 < most ? peer->out_cap * 4 : most;
    if (st->lane_budget != SIZE_MAX && st->lane_held - peer->out_cap + cap > st->lane_budget) {
        peer->grow_denied = 1;
        if (!st->budget_told)
            WEFT_INFO(core->rank, "shm: peer %d: ring stays at %zu KiB: this rank's lanes hold %zu KiB of its "
                      "WEFT_SHM_BUDGET_MB=%zu", peer->rank, peer->out_cap >> 10, st->lane_held >> 10,
                      st->lane_budget >> 20);
        st->budget_told = 1;
        return;
    }
    struct shm_switch_rec *rec = shm_ring_reserve(peer->out, sizeof(*rec));
    if (rec == NULL)
        return;   /* no room for the record now: the next send retries */
    struct shm_ring *ring = NULL;
    struct shm_help_slot *unused = NULL;
    unsigned gen = peer->out_gen + 1;
    if (lane_create(st, peer, gen, cap, &ring, &unused) != WEFT_SUCCESS) {
        /* the reservation is simply never committed */
        WEFT_INFO(core->rank, "shm: peer %d: keeping the %zu KiB ring (no bigger lane could be made)", peer->rank,
                  peer->out_cap >> 10);
        peer->grow_denied = 1;
        return;
    }
    memset(rec, 0, sizeof(*rec));
    rec->type = SHM_REC_SWITCH;
    rec->gen = gen;
    shm_ring_commit_inl(peer->out, sizeof(*rec));
    notify_consumer(peer);
    st->lane_held -= peer->out_cap;
    peer->out_cap = shm_ring_capacity_for(cap);
    peer->out_gen = gen;
    peer->out_stalls = 0;
    atomic_store_explicit(&peer->out_need, 0, memory_order_relaxed);
    __atomic_store_n(&peer->out, ring, __ATOMIC_RELEASE);
    WEFT_TRACE(core->rank, "shm: peer %d: ring grown to %zu KiB (generation %u)", peer->rank, peer->out_cap >> 10, gen);
}

/* The consumer's side of a SWITCH: map the next generation, then free the
 * old ring's pages (its mapping stays: a thread in sleep may still read its
 * counters, and reads of freed pages see zeros, never a fault). */
static int take_switch(struct shm_state *st, struct shm_peer *peer, const struct shm_switch_rec *rec)
{
    struct weft_core *core = shm_core(st);
    unsigned old = peer->in_gen;
    if (rec->gen != old + 1 || rec->gen >= SHM_LANE_GENS) {
        weft_set_error(core, WEFT_ERR_TRANSPORT, "shm: peer %d: lane switch to generation %u while at %u",
                       peer->rank, rec->gen, old);
        return WEFT_ERR_TRANSPORT;
    }
    struct shm_ring *ring = NULL;
    struct shm_help_slot *unused = NULL;
    int rc = lane_open(st, peer, rec->gen, &ring, &unused);
    if (rc != WEFT_SUCCESS)
        return rc;
    shm_ring_release_inl(peer->in);
    __atomic_store_n(&peer->in, ring, __ATOMIC_RELEASE);
    peer->in_gen = rec->gen;
    /* whole pages of the old ring past its first page (ring counters) */
    char *base = peer->lane_maps[1][old];
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t from = ((size_t)(sizeof(struct shm_lane_hdr) + 64) + 2 * page - 1) / page * page;
    if (from < peer->lane_bytes[1][old])
        madvise(base + from, (peer->lane_bytes[1][old] - from) / page * page, MADV_REMOVE);
    return WEFT_SUCCESS;
}

/* Copies n bytes without a library call for the sizes control frames have
 * (a 16-byte small header, payloads of a few dozen bytes): two overlapping
 * fixed-size moves that the compiler turns into loads and stores. A call
 * to memcpy costs more than the copy at these sizes; larger ones use it. */
static inline void copy_small(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (n >= 16 && n <= 32) {
        unsigned char a[16], b[16];
        memcpy(a, s, 16);
        memcpy(b, s + n - 16, 16);
        memcpy(d, a, 16);
        memcpy(d + n - 16, b, 16);
    } else if (n > 32 && n <= 64) {
        unsigned char a[32], b[32];
        memcpy(a, s, 32);
        memcpy(b, s + n - 32, 32);
        memcpy(d, a, 32);
        memcpy(d + n - 32, b, 32);
    } else if (n >= 8 && n < 16) {
        uint64_t a, b;
        memcpy(&a, s, 8);
        memcpy(&b, s + n - 8, 8);
        memcpy(d, &a, 8);
        memcpy(d + n - 8, &b, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        memcpy(d, &a, 4);
        memcpy(d + n - 4, &b, 4);
    } else if (n != 0) {
        memcpy(d, s, n);
    }
}

/* The first message to a peer (no lane yet) or a lane due to grow: kept
 * out of shm_ctrl_send so its hot path stays short. */
static __attribute__((noinline)) int ctrl_send_prepare(struct shm_state *st, struct shm_peer *peer)
{
    if (peer->out == NULL) {
        int rc = link_out(st, peer);   /* first message to this peer */
        if (rc != WEFT_SUCCESS) {
            /* as a connection lost: health tells a peer gone from a link down */
            st->env->up->peer_failed(st->env->up->arg, peer->rank, rc);
            return rc;
        }
    }
    if (peer->out_stalls >= SHM_GROW_STALLS)
        maybe_grow(st, peer);
    return WEFT_SUCCESS;
}

static int shm_ctrl_send(void *ctx, int rank, const void *hdr, size_t hdr_len, const void *payload, size_t len)
{
    struct shm_state *st = ctx;
    struct shm_peer *peer = peer_of(st, rank);
    if (__builtin_expect(peer == NULL, 0))
        return weft_set_error(st ? shm_core(st) : NULL, WEFT_ERR_TRANSPORT, "shm: peer %d: not connected", rank);
    if (__builtin_expect(peer->out == NULL || peer->out_stalls >= SHM_GROW_STALLS, 0)) {
        int rc = ctrl_send_prepare(st, peer);
        if (rc != WEFT_SUCCESS)
            return rc;
    }
    size_t total = hdr_len + len;
    /* The reserve checks the record limit itself; only its failure asks
     * why (too big, or no room now). */
    char *dst = shm_ring_reserve_inl(peer->out, total);
    if (__builtin_expect(dst == NULL, 0)) {
        if (total > shm_ring_max_payload_inl(peer->out))
            return weft_set_error(shm_core(st), WEFT_ERR_INTERNAL,
                                  "shm: peer %d: control message of %zu bytes exceeds the ring's record limit %zu",
                                  rank, total, shm_ring_max_payload_inl(peer->out));
        dst = reserve_or_wait_slow(peer, total);
        if (dst == NULL)
            return WEFT_EAGAIN;
    } else if (__builtin_expect(atomic_load_explicit(&peer->out_need, memory_order_relaxed) != 0, 0)) {
        atomic_store_explicit(&peer->out_need, 0, memory_order_relaxed);
    }
    copy_small(dst, hdr, hdr_len);
    copy_small(dst + hdr_len, payload, len);
    shm_ring_commit_inl(peer->out, total);
    notify_consumer(peer);
    return WEFT_SUCCESS;
}

/* Forgets every transfer of peer (no rndv_done: the pipe fails them) and
 * stops helping it. */
static void forget_peer(struct shm_state *st, struct shm_peer *peer)
{
    st->pushing -= atomic_load_explicit(&peer->pushes, memory_order_relaxed);
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
    forget_peer(st, peer);
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
        weft_tp_copy_in(x, d->offset, d + 1, d->len);
    if (d->len >= SHM_RATE_MIN) {
        /* the push's speed for the stream choice (shm_cma.c): time between
         * pieces arriving back to back -- the sender's copy in, the
         * handshakes and this copy out together, not this copy alone */
        double now = weft_now();
        if (sx->timed && peer->piece_t > 0 && now - peer->piece_t < SHM_RATE_GAP)
            shm_cost_note(&peer->push_cost[shm_rate_class(x->bytes)], d->len, now - peer->piece_t);
        peer->piece_t = now;
    }
    sx->done += d->len;
    if (st->env->up->on_data)
        st->env->up->on_data(st->env->up->arg, peer->rank);
    if (sx->done >= x->bytes) {
        weft_queue_pop(&peer->expects_q);
        st->env->up->rndv_done(st->env->up->arg, x, WEFT_SUCCESS);
    }
}

int weft_shm_more_queued(struct shm_peer *peer)
{
    return peer->in != NULL && shm_ring_more_inl(peer->in);
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
    while (n < SHM_DRAIN_BUDGET && (rec = shm_ring_peek_inl(peer->in, &len)) != NULL) {
        uint8_t type = len ? *(const uint8_t *)rec : 0xff;
        if (type == SHM_REC_SWITCH && len >= sizeof(struct shm_switch_rec)) {
            /* the last record of this ring: release it and go on in the next */
            if (take_switch(st, peer, rec) != WEFT_SUCCESS) {
                protocol_error(st, peer);
                return n;
            }
            n++;
            continue;
        }
        if (type == SHM_REC_DATA && len >= sizeof(struct shm_data_hdr)) {
            on_data(st, peer, rec, len);
        } else if (type < WEFT_TP_FRAME_TYPE_LIMIT) {
            up->on_ctrl(up->arg, peer->rank, rec, len);
        } else {
            WEFT_WARN(shm_core(st)->rank, "shm: peer %d: dropping malformed record (type %u, %zu bytes)",
                      peer->rank, type, len);
        }
        shm_ring_release_inl(peer->in);
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
    if (peer->out_stalls >= SHM_GROW_STALLS)
        maybe_grow(st, peer);
    size_t chunk_max = shm_ring_max_payload_inl(peer->out) - sizeof(struct shm_data_hdr);
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
                weft_tp_copy_out(x, sx->done, d + 1, len);
            shm_ring_commit_inl(peer->out, sizeof(*d) + len);
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
        st->pushing--;
        st->env->up->rndv_done(st->env->up->arg, x, WEFT_SUCCESS);
        n++;
    }
    return n;
}

static unsigned shm_rndv_mem(void *ctx, int peer)
{
    (void)ctx;
    (void)peer;
    return WEFT_TP_MEM_HOST;
}

/* The work of a progress pass, once shm_progress saw there is some. */
static __attribute__((noinline)) int progress_work(struct shm_state *st)
{
    int events = take_knocks(st);
    int n = atomic_load_explicit(&st->nlive, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        struct shm_peer *peer = st->live[i];
        if (peer->in && shm_ring_ready_inl(peer->in))
            events += drain_inbound(st, peer);
    }
    if (st->pushing) {
        for (int i = 0; i < n; i++) {
            struct shm_peer *peer = st->live[i];
            if (!weft_queue_empty(&peer->pushes_q))
                events += advance_pushes(st, peer);
        }
    }
    /* A peer bumps our helps counter after it opened a help slot toward us
     * (cma_pull_shared). One pass claims every piece left in every open
     * slot (weft_shm_help_peer loops until none is left), so until the counter
     * moves again no slot has work for us. Acquire: the slot's opening,
     * made before the bump, is visible to help_claim. */
    uint32_t hk = atomic_load_explicit(&st->seg->helps, memory_order_acquire);
    if (hk != st->helps_seen) {
        __atomic_store_n(&st->helps_seen, hk, __ATOMIC_RELAXED);
        for (int i = 0; i < n; i++)
            events += weft_shm_help_peer(st, st->live[i]);
    }
    return events;
}

/* An idle poll (the common case while a wait spins) reads the two home
 * counters, the push count and one header word per inbound ring, calls
 * nothing and saves no registers; progress_work does the rest. */
static int shm_progress(void *ctx)
{
    struct shm_state *st = ctx;
    if (st == NULL || st->by_rank == NULL)
        return 0;  /* no peer uses shm */
    if (atomic_load_explicit(&st->seg->knocks, memory_order_relaxed) != st->knocks_seen ||
        atomic_load_explicit(&st->seg->helps, memory_order_relaxed) != st->helps_seen || st->pushing)
        return progress_work(st);
    int n = atomic_load_explicit(&st->nlive, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        struct shm_ring *in = st->live[i]->in;
        if (in && shm_ring_ready_inl(in))
            return progress_work(st);
    }
    return 0;
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
    sx->timed = peer->expect_timed;
    peer->expect_timed = 0;
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
    st->pushing++;
    return WEFT_SUCCESS;
}

static void shm_abort_peer(void *ctx, int rank)
{
    struct shm_peer *peer = peer_of(ctx, rank);
    if (peer != NULL)
        forget_peer(ctx, peer);
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
    if (atomic_load_explicit(&st->seg->knocks, memory_order_relaxed) !=
        __atomic_load_n(&st->knocks_seen, __ATOMIC_RELAXED))
        return 1;   /* a peer made a lane toward us */
    if (atomic_load_explicit(&st->seg->helps, memory_order_relaxed) !=
        __atomic_load_n(&st->helps_seen, __ATOMIC_RELAXED))
        return 1;   /* a peer opened a help slot: copy pieces of its transfer */
    int n = atomic_load_explicit(&st->nlive, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        struct shm_peer *peer = st->live[i];
        struct shm_ring *in = __atomic_load_n(&peer->in, __ATOMIC_ACQUIRE);
        struct shm_ring *out = __atomic_load_n(&peer->out, __ATOMIC_ACQUIRE);
        if (in && !shm_ring_empty_inl(in))
            return 1;
        size_t need = atomic_load_explicit(&peer->out_need, memory_order_relaxed);
        if ((need || atomic_load_explicit(&peer->pushes, memory_order_relaxed)) && out &&
            shm_ring_would_fit(out, need))
            return 1;
    }
    return 0;
}

static void shm_sleep(void *ctx, int timeout_ms)
{
    struct shm_state *st = ctx;
    if (st == NULL || st->seg == NULL || timeout_ms == 0)
        return;
    struct shm_home_hdr *h = st->seg;
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
    .rndv_vectors = 1,
    .ctrl = 1,
    .scope = WEFT_TP_SCOPE_NODE,
    .sure = 1,
    .card_bytes = SHM_CARD_BYTES,
    .create = shm_create,
    .reach = shm_reach,
    .probe = shm_probe,
    .connect = shm_connect,
    .destroy = shm_destroy,
    .eager_limit = shm_eager_limit,
    .ctrl_send = shm_ctrl_send,
    .progress = shm_progress,
    .rndv_mem = shm_rndv_mem,
    .rndv_get = weft_shm_rndv_get,
    .rndv_expect = shm_rndv_expect,
    .rndv_push = shm_rndv_push,
    .abort_peer = shm_abort_peer,
    .busy = shm_busy,
    .wakeless = NULL,
    .sleep = shm_sleep,
    .mem_pin = NULL,
    .mem_unpin = NULL,
};
