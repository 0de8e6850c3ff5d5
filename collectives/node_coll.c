/*
 * Node-local collectives in shared memory: the blocking collectives of a
 * comm whose ranks all share one node, done by writing into and reading
 * from one segment the ranks map, synchronised by flags -- no matching, no
 * message per peer (Open MPI's coll/sm, UCC's tl/shm do the same).
 *
 * The segment (made at the first collective that fits, see node_setup):
 *
 *   +--------+-----------------------+------------------------+---------------------+--------------+
 *   | header | ctrl[0] .. ctrl[P-1]  | small[0..63][0..P-1]   | big[0..1][0..P-1]   | res[0..1]    |
 *   |        | flags, fingerprints,  | NODE_SMALL (1 KiB)     | the slot: see below | one big slot |
 *   |        | pid: 28 lines a rank  | a rank each            | a rank each         | each         |
 *   +--------+-----------------------+------------------------+---------------------+--------------+
 *
 * A call numbered s (the comm's collective number, the same on every
 * rank) uses buffer b: small[s % 64] when its part is at most 1 KiB a
 * rank, else big[s % 2]. Rank r writes its part into b's slot r, its
 * fingerprint into ctrl[r].fp[b], then publishes ctrl[r].arrive = s
 * (release). A reader that sees arrive >= s (acquire) and the same
 * fingerprint reads the slot; another fingerprint is WEFT_ERR_MISMATCH
 * naming both calls. Once a rank read all it needed it publishes
 * ctrl[r].done = s. Before rank r writes buffer b's slot or fingerprint
 * again it waits until every rank's done has reached the last call r ran
 * on b, so nothing is rewritten while someone reads it.
 *
 *   allreduce, ranks 0..3, one round:
 *     r0: data[b][0] <- send ; arrive=s ─┐
 *     r1: data[b][1] <- send ; arrive=s ─┤ every rank waits for all arrive == s,
 *     r2: data[b][2] <- send ; arrive=s ─┤ then recv = ((d0 op d1) op d2) op d3
 *     r3: data[b][3] <- send ; arrive=s ─┘ (the same order on every rank)
 *   above NODE_FLAT_MAX bytes: every rank reduces only its slice of the
 *   elements into res[b], publishes sliced = s, and all copy res[b] out
 *   once every slice is there (the reduction work split P ways).
 *
 * The slot is WEFT_NODE_COLL_KB, the limit of every kind of call. On a
 * comm of 3 ranks or more on one node allreduce, reduce, reduce_scatter,
 * allgather, gather and alltoall (blocks up to the small slot) go on up
 * to WEFT_NODE_COLL_LARGE_KB (1 MiB) in a rank's slot, where one round
 * beats the messages and Open MPI: the first such call makes
 * a second segment of two big buffers of that slot (node_large_setup),
 * and from then on every big-buffer call uses it -- the old big buffers
 * are idle, every rank being past every call that used them. Comms that
 * never make such a call never pay for it; the two segments together stay
 * within WEFT_SHM_BUDGET_MB (node_large_limit lowers the limit).
 *
 * A bcast from 3 ranks may fill a whole big buffer (all P slots: only the
 * root writes); above that it comes here in pieces of P slots, each a call
 * of its own number (bcast_piece), the two big buffers in turn.
 *
 * An alltoall whose blocks are above the slot (from NODE_PULL_MIN) comes
 * here too, but its blocks do not go through the segment: the round says
 * where each rank's send buffer is and every rank reads its block out of
 * the others' by CMA (node_a2a_pull; one copy, as a rendezvous message,
 * without p-1 handshakes and matches a rank). An alltoallv always comes
 * here on a comm of one node (sizes are each rank's own, no rule on them
 * could be agreed): each rank's blocks are packed in its slot or pulled
 * from its send buffer as they need, and where some rank can be neither
 * the round says so and the call goes as messages (node_alltoallv). CMA
 * between the node's ranks is probed once, at set-up (node_probe_pulls),
 * and agreed.
 *
 * Which calls come here is decided from the call's arguments and the comm's
 * agreed settings only (node_fits), so every rank decides alike. A rank
 * that refuses a call on its own arguments, or fails before its part is
 * out, marks that call (ctrl.marked, coll_node_refused): the others' wait
 * ends at once in WEFT_ERR_MISMATCH or that failure, and the flags stay in
 * step.
 *
 * A rank's part goes into its slot through node_put: from
 * WEFT_NODE_COLL_STREAM_KB with streaming stores (src/core/shmput.h), so
 * the readers read memory rather than pull each line from the writer's
 * cache -- which on the reference VM is 3-6x slower in some phases.
 *
 * Waits follow src/core/backoff.h (no spinning when oversubscribed) and
 * WEFT_TIMEOUT; while waiting the rank keeps its pipes and peers' health
 * going (a rank that died is reported through p2p's fault notices), answers
 * peers asking which call it is in, and looks at the ranks that have not
 * arrived: one in the same call with another fingerprint, on any path, is a
 * mismatch now, not a timeout later.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "backoff.h"
#include "cma.h"
#include "coll_impl.h"
#include "config.h"
#include "core.h"
#include "deadline.h"
#include "devcopy.h"
#include "engine.h"
#include "log.h"
#include "p2p.h"
#include "coll_reduce_algo.h"
#include "reduce_kernel.h"
#include "shmput.h"
#include "tags.h"
#include "node_coll_impl.h"

#define NODE_MAGIC 0x776566746e6f6465ull   /* "weftnode" */
/* Up to this many bytes an allreduce is one round (every rank reduces the
 * whole vector); above it, each rank reduces a slice. Measured: see
 * docs/benchmarks.md, "Node-local collectives". */
#define NODE_FLAT_MAX 2048
/* Polls of the flags before a wait reads the clock (not oversubscribed). */
#define NODE_PRESPIN 128
/* How long a rank that sees another's failure mark waits for the notice
 * that says why (flag_ok): as the message path's (coll_sched.c). */
#define NODE_NOTE_WAIT_S 0.5
/* Two ranks: a bcast, an allgather or a reduction above this goes as
 * messages -- one single-copy message beats the segment's two copies
 * (node_fits). */
#define NODE_PAIR_MAX (32u << 10)
/* Alltoall blocks from this size are pulled when the segment does not
 * take them (a2a_pulls): the collectives' eager limit (WEFT_SHM_COLL_EAGER,
 * alltoall.c's WEFT_A2A_WIDE_BLOCK). */
#define NODE_PULL_MIN (32u << 10)
/* run_call's word for "this alltoallv goes as messages" (node_alltoallv):
 * not a weft code (those are 0 and above, weft.h). */
#define NODE_SPILLED (-1)

struct node_hdr {
    uint64_t magic;
    uint64_t bytes;
    uint32_t nranks;
    uint32_t slot;
};

enum { NODE_UNTRIED = 0, NODE_ON = 1, NODE_OFF = -1 };

/* The kinds of the two marks a rank leaves in place of a call it did not
 * run: refused on its own arguments, or failed before its part was out. */
#define MARK_REFUSED 0
#define MARK_FAILED  0xffff


/* ---------------------------------------------------------------- fit */

static int transports_allow_shm(const char *t)
{
    if (t == NULL || *t == '\0')
        return 1;
    for (const char *p = t; *p;) {
        size_t len = strcspn(p, ",");
        if (len == 3 && strncasecmp(p, "shm", 3) == 0)
            return 1;
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* What a rank says in its slot in a call that may pull (node_a2a_pull,
 * node_alltoallv): how the others get its blocks -- packed in its slot
 * (alltoallv only), not at all (spill: the call goes as messages), or
 * read by each of them from its send buffer at addr -- and whether its
 * receive buffer can take pulled blocks (host memory). */
struct node_pull_hdr {
    uint64_t mode;
    uint64_t addr;
    uint64_t recv_host;
};
enum { NODE_PACKED = 0, NODE_SPILL = 1, NODE_PULLED = 2 };

/* An alltoall whose blocks are pulled (node_a2a_pull): above what the
 * segment takes (node_fits) and from NODE_PULL_MIN a block. Below that a
 * message is one copy through a ring (eager), no slower than a pull's
 * system call. Only arguments and agreed settings decide. */
static int a2a_pulls(const struct weft_coll *cc, const struct weft_coll_args *a)
{
    size_t S = weft_coll_node_bytes(cc), P = (size_t)cc->core->size;
    const size_t L = cc->node_large > S ? cc->node_large : S;
    return a->kind == WEFT_COLL_ALLTOALL && cc->a2a_algo == 0 && S > 0 && a->count >= NODE_PULL_MIN &&
           (a->count > S || a->count > L / P);
}

/* A scatter whose blocks the small slot does not take, above
 * NODE_PULL_MIN a block: each rank reads its block out of the root's send
 * buffer (node_scatter_pull). At NODE_PULL_MIN and below the blocks go as
 * eager messages, which the root leaves behind without waiting for
 * anyone: 2-7x faster than one round and a hold at np 4 and 8 with 32 KiB
 * blocks (docs/benchmarks.md, "Scatter above the slot: pulled"). */
static int scatter_pulls(const struct weft_coll *cc, const struct weft_coll_args *a)
{
    size_t S = weft_coll_node_bytes(cc), P = (size_t)cc->core->size;
    return a->kind == WEFT_COLL_SCATTER && S > 0 && a->count > NODE_PULL_MIN && a->count > S / P;
}

/* An allgather of 2 ranks above NODE_PAIR_MAX a block, which the
 * segment does not take: each rank reads the other's block out of its
 * buffer (node_ag_pull) instead of one rendezvous message each way. Six
 * rounds, 48 KiB-3 MiB, same job against Open MPI: 1.10-1.17x its speed
 * at 48-96 KiB where the messages were 1.01-1.05, 0.97-1.03 from 768 KiB
 * (messages 0.94-1.02). From 3 ranks, above the large slot, the pulls lost
 * to the ring of messages (np 4, 2 MiB blocks: 0.92-1.06 against 1.13-1.63;
 * docs/data/bench/2026-12-04-allgather-pulls): there the ring stays. */
static int ag_pulls(const struct weft_coll *cc, const struct weft_coll_args *a)
{
    return a->kind == WEFT_COLL_ALLGATHER && cc->ag_algo == 0 && cc->core->size == 2 &&
           weft_coll_node_bytes(cc) > 0 && a->count > NODE_PAIR_MAX;
}

/* A call whose blocks are read by CMA out of their sender's buffer. */
static int node_pulls(const struct weft_coll *cc, const struct weft_coll_args *a)
{
    return a2a_pulls(cc, a) || scatter_pulls(cc, a) || ag_pulls(cc, a);
}

/* Bytes the call puts in each rank's slot; 0 when it does not come here.
 * Only the arguments and agreed settings decide (the same on every rank). */
static size_t node_fits(const struct weft_coll *cc, const struct weft_coll_args *a)
{
    const struct weft_core *core = cc->core;
    size_t S = weft_coll_node_bytes(cc), P = (size_t)core->size, es;
    /* WEFT_TRANSPORTS is agreed at create like the others. */
    if (S == 0)
        return 0;
    const size_t L = cc->node_large > S ? cc->node_large : S;   /* the large calls' (node_run_one) */
    switch (a->kind) {
    case WEFT_COLL_BARRIER:
        return 1;
    case WEFT_COLL_BCAST:
        /* Two ranks: from 64 KiB one single-copy message beats the two
         * copies through the segment (docs/benchmarks.md). From three, a
         * bcast may fill a whole big buffer, every rank's slot of it
         * (bcast_area): only the root writes. At 4 ranks 128-256 KiB took
         * 20-40 us this way, 46-129 us as a binomial tree of messages and
         * 30-87 us in Open MPI (docs/benchmarks.md, "Node-local
         * collectives"). */
        if (P == 2 && a->count > NODE_PAIR_MAX)
            return 0;
        return a->count > 0 && a->count <= S * P ? a->count : 0;
    case WEFT_COLL_GATHER:
        /* From 3 ranks a block up to the large limit: each rank copies
         * its block in, the root copies all out. 24 jobs at np 3, 4 and
         * 8, 128-512 KiB (docs/benchmarks.md, "Streaming stores into the
         * segment"): 1.46x the messages' speed, 1.82x Open MPI's
         * (geometric means). */
        return a->count > 0 && a->count <= L ? a->count : 0;
    case WEFT_COLL_ALLGATHER:
        /* Two ranks: as bcast, above 32 KiB a rank one single-copy message
         * each way. Measured 8 alternated rounds against the same calls
         * forced to direct (docs/benchmarks.md, "Allgather at two ranks"):
         * 64 KiB took 11.8-15.3 us through the segment in the machine's
         * fast phases and 47-49 in its slow ones, as messages 10.0-13.2
         * in both. */
        if (ag_pulls(cc, a))
            return sizeof(struct node_pull_hdr);
        if (P == 2 && a->count > NODE_PAIR_MAX)
            return 0;
        /* From 3 ranks a block up to the large limit (node_run_one: the
         * large segment above the small one's slot). 27 jobs at np 3, 4
         * and 8, 128 KiB-1 MiB (docs/benchmarks.md, "All four through the
         * large segment"): 1.12-2.35x the messages' speed in 18 of them,
         * 0.31-0.62 in 9 (the machine's slow phases: in 6 of those the
         * reductions through the segment lost too); over all 27, 1.04x the
         * messages and 1.47x Open MPI (geometric means). */
        return cc->ag_algo == 0 && a->count > 0 && a->count <= L ? a->count : 0;
    case WEFT_COLL_SCATTER:
        /* Within the small slot: the root copies the blocks in. Above
         * it the root's copy of every block into the segment, one after
         * the other, lost to the messages' single-copy pulls, which the
         * receivers make in parallel (the same 24 jobs: 0.97x the
         * messages' speed): from NODE_PULL_MIN the receivers pull their
         * blocks out of the root's buffer themselves, after one round of
         * flags (node_scatter_pull), the slot holding where it is. */
        if (a->count > 0 && a->count <= S / P)
            return a->count * P;
        return scatter_pulls(cc, a) ? sizeof(struct node_pull_hdr) : 0;
    case WEFT_COLL_ALLTOALL:
        /* From 3 ranks the whole buffer up to the large limit while a
         * block is at most the small slot: there one round of copies
         * beats P - 1 exchanges (the same jobs, np 8: 1.45x the messages'
         * speed); larger blocks, where the copies dominate, go as
         * single-copy messages (np 4, 128 KiB blocks: 0.85-1.24x). */
        if (cc->a2a_algo != 0 || a->count == 0)
            return 0;
        if (a->count <= S && a->count <= L / P)
            return a->count * P;
        /* Above that, blocks from NODE_PULL_MIN are pulled: each rank
         * reads its block out of every sender's buffer (node_a2a_pull),
         * the slot holds where that buffer is. */
        return a2a_pulls(cc, a) ? sizeof(struct node_pull_hdr) : 0;
    case WEFT_COLL_ALLREDUCE:
    case WEFT_COLL_REDUCE:
        if ((a->kind == WEFT_COLL_ALLREDUCE ? cc->ar_algo : cc->red_algo) != 0)
            return 0;
        es = weft_dtype_size(a->dtype);
        /* Two ranks: as bcast, above 32 KiB a reduction goes as messages
         * (one single-copy message each way). Measured 8 rounds of reduce
         * (docs/benchmarks.md, "Reduce: tree or ring"): 64 KiB through the
         * segment took 10-11 us in 5 rounds and 38-40 in 3 (the machine's
         * slow cross-core phases hit the second copy), the message 10-14
         * in all 8 (Open MPI 11-12); at 32 KiB the segment wins even in
         * slow rounds (2.5-20 us against 12-28 as an eager message).
         * allreduce, 6 rounds ("Allreduce at two ranks"): 64 KiB 7-15 us
         * and 45 in 2 rounds against rd's 10-13 in all 6. */
        if (P == 2 && es && a->count > NODE_PAIR_MAX / es)
            return 0;
        /* From 3 ranks up to the large limit. An allreduce's one round
         * splits the arithmetic P ways (sliced); a reduce's root does it
         * all, reading every slot, and still came out ahead: over the 27
         * jobs above 1.78x the messages' speed (allreduce 1.72x), in the
         * slow phases down to 0.37 (allreduce 0.73). */
        return es && a->count > 0 && a->count <= L / es ? a->count * es : 0;
    case WEFT_COLL_REDUCE_SCATTER:
        es = weft_dtype_size(a->dtype);
        return cc->rs_algo == 0 && es && a->count > 0 && a->count <= L / es / P ? a->count * es * P : 0;
    case WEFT_COLL_ALLTOALLV:
        /* Every call, whatever its sizes: no rank knows the others', so
         * no rule on sizes could be agreed. The round itself agrees: a
         * rank whose blocks do not fit its slot says so there, and then
         * every rank takes the call to messages (node_alltoallv). Always
         * a big buffer (the same on every rank). */
        return cc->a2a_algo == 0 && a->vec != NULL ? L : 0;
    default:
        return 0;
    }
}

size_t node_limit(const struct weft_coll *cc)
{
    const struct weft_core *core = cc->core;
    /* (WEFT_TRANSPORTS without shm: NODE_OFF from coll_node_init, not
     * parsed here at every call -- that was a tenth of an 8-byte reduce's
     * time at its root.) */
    if (core->cfg.node_coll_bytes == 0 || core->size < 2 || cc->node_state == NODE_OFF)
        return 0;
    return core->cfg.node_coll_bytes;
}

/* Public (weft_comm_node_coll_bytes): what a call of a comm on one node may
 * put through the segment. A comm across nodes says 0: its few calls that
 * go through the nodes' segments (node_hier.c) are not the PMPI drop-in's
 * concern, whose node-local rule is for comms of one node. */
size_t weft_coll_node_bytes(const struct weft_coll *cc)
{
    return cc->nnodes == 1 ? node_limit(cc) : 0;
}

/* ---------------------------------------------------------------- setup */

/* The signature a call's messages would carry (coll_sched.h). */
struct weft_coll_sig node_sig_of(const struct weft_coll_args *a)
{
    int rooted = a->kind == WEFT_COLL_BCAST || a->kind == WEFT_COLL_REDUCE || a->kind == WEFT_COLL_GATHER ||
                 a->kind == WEFT_COLL_SCATTER;
    int red = a->kind == WEFT_COLL_ALLREDUCE || a->kind == WEFT_COLL_REDUCE || a->kind == WEFT_COLL_REDUCE_SCATTER;
    /* (An alltoallv's count is this rank's total: its own; the sizes are
     * checked block by block, as on the message path.) */
    int sized = a->kind != WEFT_COLL_BARRIER && a->kind != WEFT_COLL_ALLTOALLV;
    struct weft_coll_sig s = { a->kind, rooted ? a->root : -1, sized ? a->count : 0, red ? a->dtype : -1,
                               red ? a->op : -1 };
    return s;
}


/* What each rank says in the setup's two exchanges: in the first, the
 * segment's name (its maker) and where the others may read a probe word of
 * this process (node_probe_pulls). */
struct node_offer {
    int32_t  ok;
    char     name[60];
    int32_t  pid;
    uint32_t pad;
    uint64_t probe;   /* address of a word holding NODE_MAGIC ^ rank (0: none) */
};

static void node_unmap(struct coll_node *n)
{
    if (n == NULL)
        return;
    if (n->base)
        munmap(n->base, n->bytes);
    if (n->lbase)
        munmap(n->lbase, n->lbytes);
    free(n->scratch);
    free(n->heads_buf);
    free(n->ranks);
    free(n->seen_done);
    free(n);
}

/* Slots are whole cache lines: no two ranks' parts share one. */
static size_t node_line_up(size_t bytes)
{
    return (bytes + NODE_CACHE - 1) / NODE_CACHE * NODE_CACHE;
}

static size_t node_seg_bytes(int P, size_t slot, size_t *ctrl_off, size_t *small_off, size_t *data_off,
                             size_t *res_off)
{
    size_t off = 2 * NODE_CACHE;   /* header, padded */
    *ctrl_off = off;
    off += (size_t)P * sizeof(struct node_ctrl);
    *small_off = off;
    off += (size_t)NODE_NSMALL * (size_t)P * NODE_SMALL;
    *data_off = off;
    off += 2 * (size_t)P * slot;
    *res_off = off;
    off += 2 * slot;
    return off;
}

/* The leader makes and maps the segment; name filled. */
static int node_create(int P, size_t bytes, char *name, size_t namelen, char **base, char *why, size_t whylen)
{
    static _Atomic unsigned made;
    snprintf(name, namelen, "/weft-%d-node%u", (int)getpid(), atomic_fetch_add(&made, 1u));
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        snprintf(why, whylen, "shm_open(%s): %s", name, strerror(errno));
        return -1;
    }
    /* Reserve the pages now: a /dev/shm that cannot hold the segment says
     * so here, not by SIGBUS at a later write. */
    int e = posix_fallocate(fd, 0, (off_t)bytes);
    if (e != 0) {
        snprintf(why, whylen, "reserving %zu bytes for %s: %s (is /dev/shm full?)", bytes, name, strerror(e));
        close(fd);
        shm_unlink(name);
        return -1;
    }
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    e = errno;
    close(fd);
    if (mem == MAP_FAILED) {
        snprintf(why, whylen, "mmap of %s (%zu bytes): %s", name, bytes, strerror(e));
        shm_unlink(name);
        return -1;
    }
    struct node_hdr *h = mem;
    h->bytes = bytes;
    h->nranks = (uint32_t)P;
    h->magic = NODE_MAGIC;
    *base = mem;
    return 0;
}

static int node_open(const char *name, size_t bytes, int P, size_t slot, char **base, char *why, size_t whylen)
{
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        snprintf(why, whylen, "shm_open(%s): %s", name, strerror(errno));
        return -1;
    }
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (mem == MAP_FAILED) {
        snprintf(why, whylen, "mmap of %s (%zu bytes): %s", name, bytes, strerror(e));
        return -1;
    }
    const struct node_hdr *h = mem;
    if (h->magic != NODE_MAGIC || h->bytes != bytes || h->nranks != (uint32_t)P) {
        snprintf(why, whylen, "%s is not this comm's segment (%zu bytes for %d ranks of %zu B expected)", name, bytes,
                 P, slot);
        munmap(mem, bytes);
        return -1;
    }
    *base = mem;
    return 0;
}

/* One internal exchange of the set-up: an allgather whose fingerprint is
 * of its own kind, carrying the user's call it came before (so a rank that
 * meets it in another call reads which), by the selector's algorithm
 * whatever WEFT_ALLGATHER_ALGO forces (a forced one may not run on this
 * rank count; the user's allgathers say so, not this). */
static int node_exchange(struct weft_coll *cc, const struct weft_coll_args *user, const void *mine, void *all,
                         size_t bytes)
{
    struct weft_coll_op *op = NULL;
    struct weft_coll_sig u = node_sig_of(user);
    struct weft_coll_sig sig = { WEFT_COLL_NODE_SETUP, u.root, ((uint64_t)u.kind << 48) | (u.param & ((1ull << 48) - 1)),
                                 u.dtype, u.op };
    uint32_t seq = coll_seq_next(cc);
    int rc = coll_nb_slot_free(cc, seq);
    if (rc != WEFT_SUCCESS)
        return rc;
    int algo = weft_allgather_select(cc->core->size, cc->nnodes, bytes);
    rc = coll_allgather_op_sig(cc, &sig, algo, weft_tag_coll, seq, mine, all, bytes, &op);
    return rc != WEFT_SUCCESS ? rc : weft_coll_op_wait(op);
}

/* The set-ups' second exchange: whether every rank could map the segment
 * and, with CUDA, has its scratch of slot bytes (the host result of
 * reductions into device buffers: part of what every rank must have, so
 * agreed with the mapping; *scratch, freed by the caller). *first_no: the
 * lowest rank that could not, -1 when none; oks: room for the comm's size
 * of flags. With it, in node_setup, whether every rank can pull from
 * every other rank of its node (pulls: this rank's word; *every_pull: all
 * of them said yes; NULL: not asked). */
static int node_agree_pulls(struct weft_coll *cc, const struct weft_coll_args *user, int ok, int pulls, size_t slot,
                            void **scratch, char *why, size_t whylen, int32_t *oks, int *first_no, int *every_pull)
{
    if (ok && cc->core->cuda && (*scratch = malloc(slot)) == NULL) {
        snprintf(why, whylen, "no memory for %zu B of scratch", slot);
        ok = 0;
    }
    int32_t mine[1] = { (ok ? 1 : 0) | (pulls ? 2 : 0) };
    int rc = node_exchange(cc, user, mine, oks, sizeof mine);
    *first_no = -1;
    if (every_pull)
        *every_pull = rc == WEFT_SUCCESS;
    for (int r = 0; rc == WEFT_SUCCESS && r < cc->core->size; r++) {
        if (!(oks[r] & 1) && *first_no < 0)
            *first_no = r;
        if (!(oks[r] & 2) && every_pull)
            *every_pull = 0;
    }
    return rc;
}


/* Whether this rank can read every other rank of its node by CMA
 * (process_vm_readv): each one's probe word, said in the setup's first
 * exchange, read back with the value it must hold. The alltoalls above
 * the segment's slots pull their blocks that way (node_pull). Not with
 * WEFT_SHM_CMA=0; a refusal (Yama, a container's seccomp filter) only
 * keeps those calls on messages. */
static int node_probe_pulls(const struct weft_core *core, const struct node_offer *all, const int *local, int P)
{
    if (!core->cfg.shm_cma || P < 2)
        return 0;
    for (int i = 0; i < P; i++) {
        const int r = local[i];
        if (r == core->rank)
            continue;
        uint64_t v = 0;
        int e = all[r].probe ? weft_cma_copy((pid_t)all[r].pid, 0, &v, all[r].probe, sizeof v) : EFAULT;
        if (e != 0 || v != (NODE_MAGIC ^ (uint64_t)r)) {
            char why[300];
            weft_cma_refusal(e, why, sizeof why);
            WEFT_INFO(core->rank, "node-local collectives: cannot read rank %d (process %d) by process_vm_readv "
                      "(%s): alltoalls above the segment's slot go as messages", r, (int)all[r].pid, why);
            return 0;
        }
    }
    return 1;
}

/* At the first call that fits, on every rank alike: the lowest rank of
 * each node makes its node's segment and says its name, the others of
 * that node map it (a node of one rank maps private memory: its calls
 * wait on nobody), and all ranks of the comm agree whether every rank
 * could; otherwise the comm stays on messages for good (one log line says
 * why). WEFT_SUCCESS either way; an error only when an exchange itself
 * failed (the call then fails with it). */
static int node_setup(struct weft_coll *cc, const struct weft_coll_args *user)
{
    struct weft_core *core = cc->core;
    int N = core->size, rank = core->rank, node = cc->node_of[rank];
    const int *local = cc->node_ranks + cc->node_first[node];
    int P = cc->node_first[node + 1] - cc->node_first[node], me = 0, maker = local[0];
    while (local[me] != rank)
        me++;
    size_t slot = node_line_up(core->cfg.node_coll_bytes);
    size_t ctrl_off, small_off, data_off, res_off;
    size_t bytes = node_seg_bytes(P, slot, &ctrl_off, &small_off, &data_off, &res_off);
    struct node_offer mine, *all = calloc((size_t)N, sizeof *all);
    struct coll_node *n = calloc(1, sizeof *n);
    int *ranks = malloc((size_t)P * sizeof *ranks);
    uint32_t *seen_done = malloc((size_t)P * sizeof *seen_done);
    char why[256] = "";
    char *base = NULL;
    int rc;

    memset(&mine, 0, sizeof mine);
    if (all == NULL || n == NULL || ranks == NULL || seen_done == NULL) {
        free(all);
        free(n);
        free(ranks);
        free(seen_done);
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "node-local collectives: no memory for %d ranks' state", N);
    }
    memcpy(ranks, local, (size_t)P * sizeof *ranks);
    /* Read by the node's other ranks between the two exchanges, which this
     * rank is in until both are over. */
    volatile uint64_t probe = NODE_MAGIC ^ (uint64_t)rank;
    mine.pid = (int32_t)getpid();
    mine.probe = (uint64_t)(uintptr_t)&probe;
    int willing = 1;
    if (bytes > core->cfg.shm_budget) {
        snprintf(why, sizeof why, "its %zu-byte segment exceeds WEFT_SHM_BUDGET_MB", bytes);
        willing = 0;
    }
    if (P == 1 && willing) {
        void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (mem != MAP_FAILED) {
            base = mem;
            mine.ok = 1;
        } else
            snprintf(why, sizeof why, "mmap of %zu private bytes: %s", bytes, strerror(errno));
    } else if (rank == maker && willing &&
               node_create(P, bytes, mine.name, sizeof mine.name, &base, why, sizeof why) == 0)
        mine.ok = 1;
    rc = node_exchange(cc, user, &mine, all, sizeof mine);
    if (rc == WEFT_SUCCESS && rank != maker) {
        mine.ok = 0;
        if (willing && all[maker].ok) {
            char name[sizeof mine.name + 1];
            memcpy(name, all[maker].name, sizeof mine.name);
            name[sizeof mine.name] = '\0';
            mine.ok = node_open(name, bytes, P, slot, &base, why, sizeof why) == 0;
        }
    }
    if (base) {
        /* Flags start at this point in the comm's numbering, so wrap-safe
         * comparisons hold from the first call on. */
        struct node_ctrl *c = (struct node_ctrl *)(base + ctrl_off) + me;
        uint32_t now = cc->seq;
        c->pid = (int32_t)getpid();
        atomic_store_explicit(&c->arrive, now, memory_order_relaxed);
        atomic_store_explicit(&c->done, now, memory_order_relaxed);
        atomic_store_explicit(&c->marked, now, memory_order_relaxed);
        atomic_store_explicit(&c->sliced, now, memory_order_release);
    }
    int first_no = -1, every_pull = 0;
    int pulls = rc == WEFT_SUCCESS && base && node_probe_pulls(core, all, local, P);
    if (rc == WEFT_SUCCESS)   /* all: N * 80 bytes hold N flags */
        rc = node_agree_pulls(cc, user, mine.ok, pulls, slot, &n->scratch, why, sizeof why, (int32_t *)all, &first_no,
                              &every_pull);
    int every = rc == WEFT_SUCCESS && first_no < 0;
    if (rank == maker && mine.name[0])
        shm_unlink(mine.name);   /* every rank mapped it, or gave up: the name is not needed */
    free(all);
    if (!every) {
        if (base)
            munmap(base, bytes);
        free(n->scratch);
        free(n);
        free(ranks);
        free(seen_done);
        /* An exchange that failed (a rank refused the call these
         * exchanges came before, a rank failed): tried again at the next
         * call that fits, by every rank alike. */
        cc->node_state = rc == WEFT_SUCCESS ? NODE_OFF : NODE_UNTRIED;
        if (rc == WEFT_SUCCESS && (first_no == rank || rank == 0))
            WEFT_INFO(rank, "node-local collectives off for this comm (collectives go as messages): rank %d: %s",
                      first_no, first_no == rank ? why : "could not map the segment");
        return rc;
    }
    n->base = base;
    n->bytes = bytes;
    n->ctrl = (struct node_ctrl *)(base + ctrl_off);
    n->small = base + small_off;
    n->data = base + data_off;
    n->res = base + res_off;
    n->slot = slot;
    n->P = P;
    n->me = me;
    n->ranks = ranks;
    /* Every rank's done starts at this number (set above on each, before
     * the agreeing exchange): below any call's. */
    for (int r = 0; r < P; r++)
        seen_done[r] = cc->seq;
    n->seen_done = seen_done;
    n->pulls = every_pull;
    cc->node = n;
    cc->node_state = NODE_ON;
    WEFT_INFO(rank, "node-local collectives on: %zu-byte segment for %d rank(s) of node %d, %zu B a rank", bytes, P,
              node, slot);
    return WEFT_SUCCESS;
}

/* The large calls' segment: a header line pair, two big buffers of P
 * slots, two result slots. */
static size_t node_large_bytes(int P, size_t slot)
{
    return 2 * NODE_CACHE + 2 * ((size_t)P + 1) * slot;
}

/* WEFT_NODE_COLL_LARGE_KB on a comm of 3 ranks or more on one node, as
 * much of it as keeps both segments within WEFT_SHM_BUDGET_MB (the whole
 * default 1 MiB up to 28 ranks with the default 64 MiB); 0 where it adds
 * nothing to WEFT_NODE_COLL_KB. From agreed settings and the comm's shape
 * only: the same on every rank. */
static size_t node_large_limit(const struct weft_coll *cc)
{
    const struct weft_config *cfg = &cc->core->cfg;
    int P = cc->core->size;
    size_t a, b, c, d;
    if (cc->nnodes != 1 || P < 3 || cfg->node_coll_bytes == 0 || cfg->node_coll_large <= cfg->node_coll_bytes)
        return 0;
    size_t small = node_seg_bytes(P, node_line_up(cfg->node_coll_bytes), &a, &b, &c, &d);
    size_t L = cfg->node_coll_large;
    if (small + node_large_bytes(P, node_line_up(L)) > cfg->shm_budget) {
        const size_t fixed = small + node_large_bytes(P, 0);   /* both segments without the large slots */
        L = (cfg->shm_budget > fixed ? cfg->shm_budget - fixed : 0) / (2 * ((size_t)P + 1)) / NODE_CACHE * NODE_CACHE;
    }
    return L > cfg->node_coll_bytes ? L : 0;
}

/* At the first call above the small segment's slot that may take the
 * large one (node_run_one), on every rank of the comm alike: rank 0 makes
 * it, the others map it, all agree whether every rank could; then the big
 * buffers are its. Otherwise such calls go as messages for good (one log
 * line says why). WEFT_SUCCESS either way; an error only when an exchange
 * itself failed (the call then fails with it, and the next such call
 * tries again). Every rank is in this call's exchanges, so past every
 * call that used the old big buffers. */
static int node_large_setup(struct weft_coll *cc, const struct weft_coll_args *user)
{
    struct weft_core *core = cc->core;
    struct coll_node *n = cc->node;
    const int N = core->size, rank = core->rank, P = n->P;
    const size_t slot = node_line_up(cc->node_large), bytes = node_large_bytes(P, slot);
    struct node_offer mine, *all = calloc((size_t)N, sizeof *all);
    char why[256] = "";
    char *base = NULL;
    void *scratch = NULL;

    memset(&mine, 0, sizeof mine);
    if (all == NULL)
        return weft_set_error(core, WEFT_ERR_NO_MEMORY, "node-local collectives: no memory for %d ranks' state", N);
    if (rank == 0 && node_create(P, bytes, mine.name, sizeof mine.name, &base, why, sizeof why) == 0)
        mine.ok = 1;
    int rc = node_exchange(cc, user, &mine, all, sizeof mine);
    if (rc == WEFT_SUCCESS && rank != 0) {
        mine.ok = 0;
        if (all[0].ok) {
            char name[sizeof mine.name + 1];
            memcpy(name, all[0].name, sizeof mine.name);
            name[sizeof mine.name] = '\0';
            mine.ok = node_open(name, bytes, P, slot, &base, why, sizeof why) == 0;
        }
    }
    int first_no = -1;
    if (rc == WEFT_SUCCESS)   /* all: N * 64 bytes hold N flags */
        rc = node_agree_pulls(cc, user, mine.ok, 0, slot, &scratch, why, sizeof why, (int32_t *)all, &first_no, NULL);
    int every = rc == WEFT_SUCCESS && first_no < 0;
    if (rank == 0 && mine.name[0])
        shm_unlink(mine.name);
    free(all);
    if (!every) {
        if (base)
            munmap(base, bytes);
        free(scratch);
        n->large_state = rc == WEFT_SUCCESS ? NODE_OFF : NODE_UNTRIED;
        if (rc == WEFT_SUCCESS && (first_no == rank || rank == 0))
            WEFT_INFO(rank, "node-local collectives: no large segment for this comm (its calls above "
                      "%zu B a rank go as messages): rank %d: %s", n->slot, first_no,
                      first_no == rank ? why : "could not map it");
        return rc;
    }
    n->lbase = base;
    n->lbytes = bytes;
    n->data = base + 2 * NODE_CACHE;
    n->res = n->data + 2 * (size_t)P * slot;
    n->slot = slot;
    if (scratch) {
        free(n->scratch);
        n->scratch = scratch;
    }
    n->large_state = NODE_ON;
    WEFT_INFO(rank, "node-local collectives on for large calls: %zu-byte segment for %d rank(s), %zu B a rank",
              bytes, P, slot);
    return WEFT_SUCCESS;
}

void coll_node_init(struct weft_coll *cc)
{
    if (!transports_allow_shm(cc->core->cfg.transports))
        cc->node_state = NODE_OFF;
    cc->node_large = node_large_limit(cc);
}

void coll_node_fini(struct weft_coll *cc)
{
    node_unmap(cc->node);
    cc->node = NULL;
}

/* ---------------------------------------------------------------- flags */

static void head_publish(struct node_ctrl *c, const struct weft_p2p_check *ck)
{
    uint32_t v = atomic_load_explicit(&c->head_ver, memory_order_relaxed);
    atomic_store_explicit(&c->head_ver, v + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    for (int i = 0; i < 3; i++)
        atomic_store_explicit(&c->head[i], ck->w[i], memory_order_relaxed);
    atomic_store_explicit(&c->head_ver, v + 2, memory_order_release);
}

/* 0: read; -1: being written (try later). */
static int head_read(struct node_ctrl *c, struct weft_p2p_check *ck)
{
    uint32_t v = atomic_load_explicit(&c->head_ver, memory_order_acquire);
    if (v & 1)
        return -1;
    for (int i = 0; i < 3; i++)
        ck->w[i] = atomic_load_explicit(&c->head[i], memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&c->head_ver, memory_order_relaxed) == v ? 0 : -1;
}


void coll_node_started(struct weft_coll *cc, const struct weft_coll_args *a, uint32_t seq)
{
    if (cc->node == NULL)
        return;
    struct weft_coll_sig sig = node_sig_of(a);
    struct weft_p2p_check ck = weft_sched_sig_check(&sig, seq);
    head_publish(&cc->node->ctrl[cc->node->me], &ck);
}

void coll_node_refused(struct weft_coll *cc, uint32_t seq)
{
    struct coll_node *n = cc->node;
    if (n == NULL)
        return;
    /* Marked (no buffer is touched: this rank does not know which the
     * others use for seq); whoever waits for this rank in call seq meets
     * a mismatch at once, and the flags move past seq. */
    struct weft_coll_sig sig = { MARK_REFUSED, -1, 0, -1, -1 };
    struct weft_p2p_check ck = weft_sched_sig_check(&sig, seq);
    struct node_ctrl *c = &n->ctrl[n->me];
    head_publish(c, &ck);
    c->mark_code = WEFT_SUCCESS;
    atomic_store_explicit(&c->marked, seq + 1, memory_order_release);
    atomic_store_explicit(&c->arrive, seq + 1, memory_order_release);
    atomic_store_explicit(&c->done, seq + 1, memory_order_release);
}

/* ---------------------------------------------------------------- waits */

static void describe(const struct weft_p2p_check *c, char *out, size_t n)
{
    if ((uint16_t)c->w[0] == MARK_REFUSED)
        snprintf(out, n, "nothing (it refused the call on its own arguments)");
    else if ((uint16_t)c->w[0] == MARK_FAILED)
        snprintf(out, n, "this call but failed before its part was out (%s)", weft_err_str((int)c->w[2]));
    else
        weft_sched_describe_check(c, out, n);
}

/* The call failed here (code, text already the last error): tell the
 * peers, unless the news came from them. */
int node_fail(struct node_call *k, int code, int tell)
{
    k->failed = code;
    /* A peer that made this call as messages (another size, say) waits
     * for answers to its announced sends: its lanes here refuse them. */
    weft_p2p_refuse_call(k->cc->p2p, weft_tag_coll, k->seq, WEFT_TAG_COLL_PHASES, code);
    if (tell) {
        struct weft_error last;
        char line[1024], text[240];
        weft_error_get(k->cc->core, &last);
        weft_error_format(&last, 0, line, sizeof line);
        snprintf(text, sizeof text, "rank %d: %.200s", k->cc->core->rank, line);
        weft_p2p_coll_failed(k->cc->p2p, k->seq, code, text);
    }
    return code;
}

static int node_mismatch(struct node_call *k, int r, const struct weft_p2p_check *theirs, const char *how)
{
    char mine_s[160], theirs_s[160], pm[32], pr[32];
    const struct weft_core *core = k->cc->core;
    describe(&k->check, mine_s, sizeof mine_s);
    describe(theirs, theirs_s, sizeof theirs_s);
    weft_set_error(k->cc->core, WEFT_ERR_MISMATCH,
                   "%s (node-local, collective #%u): collective mismatch: rank %d%s called %s, rank %d%s %s %s",
                   k->what, k->seq, core->rank, weft_parent_words(core, core->rank, pm, sizeof pm), mine_s,
                   node_crank(k->n, r), weft_parent_words(core, node_crank(k->n, r), pr, sizeof pr), how, theirs_s);
    return node_fail(k, WEFT_ERR_MISMATCH, 1);
}

/* Rank r's flag reached what the wait needs: 1; not yet: 0; a failure:
 * -1 (set). */
static int flag_ok(struct node_call *k, int r, enum node_flag f, uint32_t want)
{
    struct node_ctrl *c = &k->n->ctrl[r];
    if (f == FLAG_DONE) {
        /* Kept: it may already cover the next buffers (node_slot_free). */
        uint32_t d = atomic_load_explicit(&c->done, memory_order_acquire);
        if (after_eq(d, k->n->seen_done[r]))
            k->n->seen_done[r] = d;
        return after_eq(d, want);
    }
    if (f == FLAG_SLICED)
        return after_eq(atomic_load_explicit(&c->sliced, memory_order_acquire), want);
    uint32_t a = atomic_load_explicit(&c->arrive, memory_order_acquire);
    if (!after_eq(a, k->tag))
        return 0;
    /* At this call or past it: marked for this call (refused, or failed
     * before its part was out), or fp[b] holds the call it ran on buffer
     * b, kept until this rank is done with this call. */
    struct weft_p2p_check theirs;
    if (atomic_load_explicit(&c->marked, memory_order_acquire) == k->tag) {
        struct weft_coll_sig mark = { c->mark_code == WEFT_SUCCESS ? MARK_REFUSED : MARK_FAILED, -1,
                                      (uint64_t)(int64_t)c->mark_code, -1, -1 };
        theirs = weft_sched_sig_check(&mark, k->seq);
    } else {
        memcpy(theirs.w, c->fp[k->b], sizeof theirs.w);
        if (memcmp(&theirs, &k->check, sizeof theirs) == 0)
            return 1;
    }
    if (weft_p2p_check_call(&theirs) == k->seq && (uint16_t)theirs.w[0] == MARK_FAILED) {
        /* Its notice says why. It is on its way to every rank (a rank
         * marks a failure it decided after telling everyone, and one it
         * was told of after the teller told everyone), so it is waited
         * for, bounded: a mark seen first named only the marking rank and
         * the code (a node's head, node_hier.c, relaying a mismatch
         * between two other ranks). Else the mark says what it can. */
        char why[512];
        int code = weft_p2p_await_note(k->cc->p2p, k->seq, NODE_NOTE_WAIT_S, why, sizeof why);
        if (code != WEFT_SUCCESS) {
            weft_set_error(k->cc->core, code, "%s (node-local, collective #%u): %s", k->what, k->seq, why);
            return node_fail(k, code, 0), -1;
        }
        code = (int)theirs.w[2];
        char pr[32];
        weft_set_error(k->cc->core, code, "%s (node-local, collective #%u): rank %d%s failed this call: %s", k->what,
                       k->seq, node_crank(k->n, r), weft_parent_words(k->cc->core, node_crank(k->n, r), pr, sizeof pr),
                       weft_err_str(code));
        return node_fail(k, code, 0), -1;
    }
    if (weft_p2p_check_call(&theirs) == k->seq)
        return node_mismatch(k, r, &theirs, "called"), -1;
    /* Past this call without having made it here: what it did instead. */
    struct weft_p2p_check head;
    if (head_read(c, &head) != 0)
        return 0;
    if (weft_p2p_check_call(&head) == k->seq)   /* made this call, on the message path, as another operation */
        return node_mismatch(k, r, &head, "called"), -1;
    char h[160], pr[32];
    describe(&head, h, sizeof h);
    weft_set_error(k->cc->core, WEFT_ERR_MISMATCH,
                   "%s (node-local, collective #%u): rank %d%s went past this call without making it (its newest "
                   "collective is #%u, %s)", k->what, k->seq, node_crank(k->n, r),
                   weft_parent_words(k->cc->core, node_crank(k->n, r), pr, sizeof pr), weft_p2p_check_call(&head), h);
    return node_fail(k, WEFT_ERR_MISMATCH, 1), -1;
}

/* The slow part of a wait: pipes, health, the engine's clients, faults
 * reported by others, and ranks in this call on another path. A hold
 * (pull_hold) looks only at health: a rank whose pipe is down leaves the
 * pending list (it reads nothing more); a failure of the call elsewhere
 * does not end it. */
static int wait_look(struct node_call *k, int *pending, int *npending_io, double now)
{
    struct weft_coll *cc = k->cc;
    const int npending = *npending_io;
    (void)weft_p2p_poll_health(cc->p2p);
    weft_engine_run_waits(weft_p2p_engine(cc->p2p), now, 1);
    if (k->holding) {
        char why[256];
        for (int i = 0; i < *npending_io;)
            if (weft_p2p_peer_down(cc->p2p, node_crank(k->n, pending[i]), why, sizeof why))
                pending[i] = pending[--*npending_io];
            else
                i++;
        return WEFT_SUCCESS;
    }
    uint64_t e = weft_p2p_fault_epoch(cc->p2p);
    if (e != k->epoch) {
        char why[512];
        k->epoch = e;
        int code = weft_p2p_fault(cc->p2p, k->seq, why, sizeof why);
        if (code != WEFT_SUCCESS) {
            weft_set_error(cc->core, code, "%s (node-local, collective #%u): %s", k->what, k->seq, why);
            return node_fail(k, code, 0);
        }
    }
    for (int i = 0; i < npending; i++) {
        struct weft_p2p_check head;
        if (head_read(&k->n->ctrl[pending[i]], &head) == 0 && weft_p2p_check_call(&head) == k->seq &&
            memcmp(&head, &k->check, sizeof head) != 0)
            return node_mismatch(k, pending[i], &head, "called");
    }
    return WEFT_SUCCESS;
}

static int wait_timeout(struct node_call *k, const int *pending, int npending, enum node_flag f, double idle)
{
    struct weft_coll *cc = k->cc;
    char list[512] = "", why[200];
    size_t used = 0;
    /* A rank that died or is stopped is declared failed, as a stuck
     * request's peer would be: every rank then gives the same verdict
     * ("rank N failed: ..."), whichever timed out first. */
    int declared = 0;
    for (int i = 0; i < npending; i++)
        if (weft_p2p_peer_stuck(cc->p2p, node_crank(k->n, pending[i]), why, sizeof why) != WEFT_SUCCESS)
            declared = 1;
    if (declared) {
        char fault[512];
        int code = weft_p2p_fault(cc->p2p, k->seq, fault, sizeof fault);
        if (code != WEFT_SUCCESS) {
            weft_set_error(cc->core, code, "%s (node-local, collective #%u): %s", k->what, k->seq, fault);
            return node_fail(k, code, 0);
        }
    }
    for (int i = 0; i < npending && used + 200 < sizeof list; i++) {
        struct node_ctrl *c = &k->n->ctrl[pending[i]];
        struct weft_p2p_check head;
        char h[120] = "none";
        (void)weft_p2p_peer_stuck(cc->p2p, node_crank(k->n, pending[i]), why, sizeof why);
        if (head_read(c, &head) == 0 && (uint16_t)head.w[0] != 0) {
            char d[96];
            describe(&head, d, sizeof d);
            snprintf(h, sizeof h, "#%u, %s", weft_p2p_check_call(&head), d);
        }
        char pr[32];
        used += (size_t)snprintf(list + used, sizeof list - used, "%srank %d%s (alive: %.80s; its newest collective: %s)",
                                 i ? ", " : "", node_crank(k->n, pending[i]),
                                 weft_parent_words(cc->core, node_crank(k->n, pending[i]), pr, sizeof pr), why, h);
    }
    weft_set_error(cc->core, WEFT_ERR_TIMEOUT,
                   "%s (node-local, collective #%u): nothing from %d rank(s) for %.1f s (WEFT_TIMEOUT=%g): %s %s",
                   k->what, k->seq, npending, idle, weft_timeout_setting(&cc->core->cfg), list,
                   f == FLAG_ARRIVE ? "did not arrive" : "did not finish their part");
    return node_fail(k, WEFT_ERR_TIMEOUT, 1);
}

/* Local rank r is alive and in call k (on whichever path). */
static int head_busy(struct node_call *k, int r)
{
    struct weft_p2p_check head;
    char why[200];
    return head_read(&k->n->ctrl[r], &head) == 0 && weft_p2p_check_call(&head) == k->seq &&
           weft_p2p_peer_stuck(k->cc->p2p, node_crank(k->n, r), why, sizeof why) == WEFT_SUCCESS;
}

/* One look at the pending ranks' flags: those there leave the list.
 * Returns whether any did, or -1 on a failure (set, k->failed). */
static int poll_pending(struct node_call *k, int *pending, int *npending, enum node_flag f, uint32_t want)
{
    int moved = 0;
    for (int i = 0; i < *npending;) {
        int ok = flag_ok(k, pending[i], f, want);
        if (ok < 0)
            return -1;
        if (ok) {
            pending[i] = pending[--*npending];
            moved = 1;
        } else
            i++;
    }
    return moved;
}

/* Waits until rank `only`'s flag (or every other rank's, only < 0) reached
 * want. WEFT_SUCCESS or the failure (set, peers told). */
int node_wait(struct node_call *k, int only, enum node_flag f, uint32_t want)
{
    struct coll_node *n = k->n;
    int P = n->P, me = n->me;
    int pend_buf[64], *pending = P <= 64 ? pend_buf : malloc((size_t)P * sizeof(int));
    int npending = 0, rc = WEFT_SUCCESS;
    if (pending == NULL)
        return weft_set_error(k->cc->core, WEFT_ERR_NO_MEMORY, "%s: no memory", k->what);
    for (int r = only < 0 ? 0 : only; r < (only < 0 ? P : only + 1); r++) {
        if (r == me)
            continue;
        int ok = flag_ok(k, r, f, want);
        if (ok < 0) {
            rc = k->failed;
            goto out;
        }
        if (!ok)
            pending[npending++] = r;
    }
    if (npending == 0)
        goto out;

    /* First a short spin with no clock: with a core each, the others'
     * flags mostly come within a microsecond, and a clock read per poll
     * was a tenth of a small call's time. With more ranks than cores (or
     * WEFT_SPIN_US=0), no spin: the core is theirs (backoff.h). */
    if (!k->cc->core->oversubscribed && k->cc->core->cfg.spin_us > 0) {
        for (int spin = 0; spin < NODE_PRESPIN; spin++) {
            int moved = poll_pending(k, pending, &npending, f, want);
            if (moved < 0) {
                rc = k->failed;
                goto out;
            }
            if (npending == 0)
                goto out;
            weft_cpu_relax();
        }
    }

    struct weft_backoff bo;
    int extended = 0;
    weft_backoff_init(&bo, k->cc->core);
    /* The first look at pipes and health after 100 us, not at once: a wait
     * that ends sooner has no need of it (a failure elsewhere still shows
     * within 100 us). */
    double idle_since = weft_now(), last_look = idle_since;
    for (;;) {
        int moved = poll_pending(k, pending, &npending, f, want);
        if (moved < 0) {
            rc = k->failed;
            goto out;
        }
        if (npending == 0)
            break;
        double now = weft_now();
        if (moved) {
            weft_backoff_busy(&bo);
            idle_since = now;
            continue;
        }
        /* Every 100 us, and at every step of the sleep phase (each naps
         * 20 us or more). Not at every yield: with more ranks than cores a
         * waiter yields at once, and a look at every turn (a progress pass
         * over the pipes, the health clocks, the engine's clients) was CPU
         * taken from the ranks it waits for. */
        if (now - last_look >= 100e-6 || weft_backoff_phase(&bo, now) == WEFT_BACKOFF_SLEEP) {
            last_look = now;
            rc = wait_look(k, pending, &npending, now);
            if (rc != WEFT_SUCCESS || npending == 0)
                goto out;
            if (weft_wait_expired(&k->cc->core->cfg, WEFT_WAIT_REQUEST, idle_since, now)) {
                /* A node's head running the call among the heads
                 * (node_hier.c) waits on other nodes under its own
                 * WEFT_TIMEOUT and tells its verdict: its node waits one
                 * WEFT_TIMEOUT more for it rather than blame the head. */
                if (!extended && f == FLAG_SLICED && only >= 0 && head_busy(k, only)) {
                    extended = 1;
                    idle_since = now;
                    continue;
                }
                rc = wait_timeout(k, pending, npending, f, now - idle_since);
                goto out;
            }
        }
        weft_backoff_idle(&bo, now, 500);
    }
out:
    if (pending != pend_buf)
        free(pending);
    return rc;
}

/* ---------------------------------------------------------------- calls */

int node_copy(struct weft_core *core, void *dst, const void *src, size_t bytes, const char *what)
{
    if (bytes == 0 || dst == src)
        return WEFT_SUCCESS;
    if (!core->cuda) {
        memcpy(dst, src, bytes);
        return WEFT_SUCCESS;
    }
    return weft_devcopy(core, dst, src, bytes, what);
}

/* node_copy into the segment (a slot the other ranks read next): host
 * memory through weft_shm_put, streamed from WEFT_NODE_COLL_STREAM_KB. */
int node_put(struct weft_core *core, void *dst, const void *src, size_t bytes, const char *what)
{
    if (bytes == 0 || dst == src)
        return WEFT_SUCCESS;
    if (!core->cuda) {
        weft_shm_put(dst, src, bytes, core->cfg.node_coll_stream);
        return WEFT_SUCCESS;
    }
    return weft_devcopy(core, dst, src, bytes, what);
}

/* Publishes this rank's part of call k (its data already in its slot). */
void node_arrive(struct node_call *k)
{
    struct node_ctrl *c = &k->n->ctrl[k->n->me];
    memcpy(c->fp[k->b], k->check.w, sizeof k->check.w);
    atomic_store_explicit(&c->arrive, k->tag, memory_order_release);
    k->arrived = 1;
}

/* Before writing this rank's slot of buffer b: every rank is done with the
 * last call this rank ran on it. */
int node_slot_free(struct node_call *k)
{
    struct coll_node *n = k->n;
    uint32_t last = n->last[k->b];
    n->last[k->b] = k->tag;
    if (last == 0)
        return WEFT_SUCCESS;
    /* Mostly every rank's done was seen past `last` already: the small
     * buffers come round every NODE_NSMALL calls, and the last look at a
     * rank's done saw it at about the call before that look. Then no look
     * at the other ranks' done, a line they write at every call: one
     * cache line less moved between the cores per call. done only grows,
     * so what was seen still holds. */
    for (int r = 0; r < n->P; r++)
        if (r != n->me && !after_eq(n->seen_done[r], last))
            return node_wait(k, -1, FLAG_DONE, last);
    return WEFT_SUCCESS;
}

/* dst[0..count) = op over ranks r = 0..P-1 of src_r[off..off+count), in
 * rank order (bit-identical on every rank). */
void node_reduce_range(struct node_call *k, void *dst, const void *own, size_t off, size_t count, int dtype, int op)
{
    struct coll_node *n = k->n;
    size_t es = weft_dtype_size(dtype);
#define NODE_SRC(r) ((own != NULL && (r) == n->me ? (const char *)own : slot_of(n, k->b, (r))) + off * es)
    weft_reduce_host(dst, NODE_SRC(0), NODE_SRC(1), count, dtype, op);
    for (int r = 2; r < n->P; r++)
        weft_reduce_host(dst, dst, NODE_SRC(r), count, dtype, op);
#undef NODE_SRC
    if (op == WEFT_AVG)
        weft_reduce_host_div(dst, dst, count, dtype, n->P);
}

/* A reduction's result into a user buffer that may be device memory. */
void *node_result_buf(struct node_call *k, void *user)
{
    return k->cc->core->cuda ? k->n->scratch : user;
}

/* Where a bcast's message goes: the root's slot, or, above a slot, the
 * whole big buffer from slot 0 (the P slots are contiguous). The others'
 * slots are free for it: no rank writes its slot in a bcast, and every
 * rank's next write to this buffer waits, as always (node_slot_free),
 * until every rank is done with this call. */
static char *bcast_area(struct node_call *k, const struct weft_coll_args *a)
{
    return a->count > k->n->slot ? slot_of(k->n, k->b, 0) : slot_of(k->n, k->b, a->root);
}

/* Whether a user buffer is host memory (a device buffer cannot be pulled
 * into or out of by CMA). Without CUDA in the comm every buffer is. */
static int node_host(struct node_call *k, const void *buf, size_t bytes)
{
    struct weft_core *core = k->cc->core;
    int kind = 0, dev = -1;
    if (!core->cuda || bytes == 0)
        return 1;
    return weft_mem_classify(core, buf, bytes, -1, -1, k->what, &kind, &dev) == WEFT_SUCCESS && kind == 0;
}

/* Reads len bytes at addr in local rank r's memory into dst by CMA (every
 * rank of the node can: agreed at set-up, node_probe_pulls). A failure
 * fails the call, naming the rank and why. */
static int node_pull(struct node_call *k, int r, void *dst, uint64_t addr, size_t len)
{
    const pid_t pid = (pid_t)k->n->ctrl[r].pid;
    int e = weft_cma_copy(pid, 0, dst, addr, len);
    if (e == 0)
        return WEFT_SUCCESS;
    weft_set_error(k->cc->core, WEFT_ERR_TRANSPORT,
                   "%s (node-local, collective #%u): reading %zu bytes of rank %d's send buffer (process %d) by "
                   "process_vm_readv failed: %s", k->what, k->seq, len, node_crank(k->n, r), (int)pid,
                   e == ESRCH ? "the process has ended" : strerror(e));
    return node_fail(k, WEFT_ERR_TRANSPORT, 1);
}

/* After the round of a call that may pull: whether every rank's blocks can
 * be had as it said (none spilled; if any pulls, every receive buffer
 * takes pulls), and whether any rank's blocks are pulled. The same on
 * every rank: all read the same headers. */
static int pull_round_ok(struct node_call *k, int *any_pulled)
{
    *any_pulled = 0;
    int all_recv_host = 1;
    for (int r = 0; r < k->n->P; r++) {
        struct node_pull_hdr h;
        memcpy(&h, slot_of(k->n, k->b, r), sizeof h);
        if (h.mode == NODE_SPILL)
            return 0;
        *any_pulled |= h.mode == NODE_PULLED;
        all_recv_host &= h.recv_host != 0;
    }
    return !*any_pulled || all_recv_host;
}

/* This rank says spill in a call that may pull: why, in one info line
 * per comm (the calls then go as messages, at their speed). */
static void spill_tell(struct node_call *k, const char *why)
{
    if (k->n->spill_told)
        return;
    k->n->spill_told = 1;
    WEFT_INFO(k->cc->core->rank, "%s (node-local, collective #%u): %s; this call and others like it go as messages "
              "(said once per comm)", k->what, k->seq, why);
}

/* Every other rank has arrived at this call or past it (the flag only:
 * marked or not). Until then no rank can have begun to read. */
static int all_arrived(struct node_call *k)
{
    for (int r = 0; r < k->n->P; r++)
        if (r != k->n->me && !after_eq(atomic_load_explicit(&k->n->ctrl[r].arrive, memory_order_acquire), k->tag))
            return 0;
    return 1;
}

/*
 * A rank whose send buffer the others read holds it until every rank is
 * through with the call (its done: published by every rank at the end of
 * every call, whatever happened, and by this one here, before it waits,
 * so two holders never wait for each other). A failure of the call
 * elsewhere does not end the hold -- a reader may still be copying; only
 * a reader's death does (it reads nothing more), or WEFT_TIMEOUT without
 * one reader moving (wait_timeout: named, as any wait's). Once all are
 * through, a failure of the call anywhere (a notice, a death) is this
 * rank's verdict too.
 */
static int pull_hold(struct node_call *k)
{
    k->holding = 1;
    int rc = node_wait(k, -1, FLAG_DONE, k->tag);
    k->holding = 0;
    if (rc == WEFT_SUCCESS && k->failed == 0) {
        char why[512];
        int code = weft_p2p_fault(k->cc->p2p, k->seq, why, sizeof why);
        if (code != WEFT_SUCCESS) {
            weft_set_error(k->cc->core, code, "%s (node-local, collective #%u): %s", k->what, k->seq, why);
            rc = node_fail(k, code, 0);
        }
    }
    return rc;
}

/* The end of a call that may pull, rc its outcome so far: this rank reads
 * nothing more (done); a rank whose blocks were out to be pulled holds its
 * send buffer until every reader is through (pull_hold). */
static int pull_finish(struct node_call *k, int rc, int hold)
{
    atomic_store_explicit(&k->n->ctrl[k->n->me].done, k->tag, memory_order_release);
    if (!hold)
        return rc;
    int hrc = pull_hold(k);
    return rc != WEFT_SUCCESS ? rc : hrc;
}

/* A call that may pull: publishes this rank's header (at the start of its
 * slot), arrives, and waits for every rank's. WEFT_SUCCESS (and *any:
 * some rank's blocks are pulled), NODE_SPILLED (the call goes as
 * messages), or the failure -- after holding, when this rank's blocks
 * were out and every rank had arrived (some may be reading them). */
static int pull_round(struct node_call *k, const struct node_pull_hdr *h, int *any)
{
    memcpy(slot_of(k->n, k->b, k->n->me), h, sizeof *h);
    node_arrive(k);
    int rc = node_wait(k, -1, FLAG_ARRIVE, k->tag);
    if (rc != WEFT_SUCCESS)
        return h->mode == NODE_PULLED && all_arrived(k) ? pull_finish(k, rc, 1) : rc;
    return pull_round_ok(k, any) ? WEFT_SUCCESS : NODE_SPILLED;
}

/* After the round: bytes at offset off in every other rank's published
 * buffer into recvbuf's block of that rank, starting with the next rank,
 * so that the ranks read from different senders at once. */
static int pull_each(struct node_call *k, void *recvbuf, size_t bytes, uint64_t off)
{
    struct coll_node *n = k->n;
    int rc = WEFT_SUCCESS;
    for (int i = 1; i < n->P && rc == WEFT_SUCCESS; i++) {
        const int r = (n->me + i) % n->P;
        struct node_pull_hdr t;
        memcpy(&t, slot_of(n, k->b, r), sizeof t);
        rc = node_pull(k, r, (char *)recvbuf + (size_t)node_crank(n, r) * bytes, t.addr + off, bytes);
    }
    return rc;
}

/*
 * Alltoall above the segment's slots (a2a_pulls): each rank says in its
 * slot (a small buffer) where its send buffer is, arrives, and once every
 * rank arrived reads its block out of each other rank's send buffer itself
 * -- process_vm_readv, one copy, no message, no matching, no handshake per
 * block -- starting with the next rank, so that the ranks read from
 * different senders at once. Then each says it is through (sliced) and
 * waits until all are: until then its send buffer is being read.
 *
 *   slot of rank r:  | mode | address of its send buffer | receive buffer is host memory |
 *
 *   r0: hdr ; arrive ─┐               r0: pull 1->0, 2->0, 3->0 ; sliced ─┐
 *   r1: hdr ; arrive ─┤ all arrived:  r1: pull 2->1, 3->1, 0->1 ; sliced ─┤ all sliced:
 *   r2: hdr ; arrive ─┤               r2: pull 3->2, 0->2, 1->2 ; sliced ─┤ return
 *   r3: hdr ; arrive ─┘               r3: pull 0->3, 1->3, 2->3 ; sliced ─┘
 *
 * A rank that cannot be read or written that way (in place: its send
 * blocks are its receive blocks; device memory) says spill, and every rank
 * takes the call to messages, as an alltoallv that spills.
 */
static int node_a2a_pull(struct node_call *k, const struct weft_coll_args *a)
{
    struct weft_core *core = k->cc->core;
    const size_t bytes = a->count, total = bytes * (size_t)k->n->P;
    struct node_pull_hdr h = { NODE_PULLED, (uint64_t)(uintptr_t)a->sendbuf, 1 };
    int rc, any;

    if (a->sendbuf == a->recvbuf) {
        h.mode = NODE_SPILL;
        spill_tell(k, "in place, its blocks cannot be read where they are received");
    } else if (!node_host(k, a->sendbuf, total) || !node_host(k, a->recvbuf, total)) {
        h.mode = NODE_SPILL;
        spill_tell(k, "a buffer in device memory cannot be read or written by CMA");
    }
    if ((rc = pull_round(k, &h, &any)) != WEFT_SUCCESS)
        return rc;
    rc = pull_each(k, a->recvbuf, bytes, (uint64_t)core->rank * bytes);
    if (rc == WEFT_SUCCESS) {
        const size_t own = (size_t)core->rank * bytes;
        memcpy((char *)a->recvbuf + own, (const char *)a->sendbuf + own, bytes);
    }
    return pull_finish(k, rc, 1);
}

/*
 * Scatter above the small slot (scatter_pulls): the root says in its slot
 * where its send buffer is, every rank arrives, and once all have, each
 * reads its block out of the root's buffer itself -- process_vm_readv, all
 * at once, one copy each, no message, no handshake -- while the root
 * copies its own. The root holds its buffer until every rank is through
 * (pull_finish). A rank whose buffer CMA cannot reach (device memory)
 * says spill, and the call goes as messages on every rank.
 *
 *   root: hdr(addr) ; arrive ─┐ all arrived:  root: own block ; done ; hold until all done
 *   r:    hdr       ; arrive ─┘               r:    pull root+r*count -> recvbuf ; done
 */
static int node_scatter_pull(struct node_call *k, const struct weft_coll_args *a)
{
    struct weft_core *core = k->cc->core;
    const int root = a->root, me = k->n->me;
    const size_t bytes = a->count;
    struct node_pull_hdr h = { me == root ? NODE_PULLED : NODE_PACKED, (uint64_t)(uintptr_t)a->sendbuf, 1 };
    int rc, any;

    if (!node_host(k, a->recvbuf, bytes) || (me == root && !node_host(k, a->sendbuf, bytes * (size_t)k->n->P))) {
        h.mode = NODE_SPILL;
        spill_tell(k, "a buffer in device memory cannot be read or written by CMA");
    }
    if ((rc = pull_round(k, &h, &any)) != WEFT_SUCCESS)
        return rc;
    if (me != root) {
        struct node_pull_hdr t;
        memcpy(&t, slot_of(k->n, k->b, root), sizeof t);
        rc = node_pull(k, root, a->recvbuf, t.addr + (uint64_t)core->rank * bytes, bytes);
    } else {
        const char *own = (const char *)a->sendbuf + (size_t)core->rank * bytes;
        if (own != (const char *)a->recvbuf)
            memcpy(a->recvbuf, own, bytes);
    }
    return pull_finish(k, rc, me == root);
}

/*
 * Allgather of 2 ranks above the segment (ag_pulls): as the alltoall's pulls, each
 * rank's block is read by every other rank out of its buffer (in place
 * too: a block in recvbuf is one its owner does not write during the
 * call), starting with the next rank, and every rank holds until all are
 * through.
 */
static int node_ag_pull(struct node_call *k, const struct weft_coll_args *a)
{
    struct weft_core *core = k->cc->core;
    const size_t bytes = a->count;
    char *own = (char *)a->recvbuf + (size_t)core->rank * bytes;
    struct node_pull_hdr h = { NODE_PULLED, (uint64_t)(uintptr_t)a->sendbuf, 1 };
    int rc, any;

    if (!node_host(k, a->sendbuf, bytes) || !node_host(k, a->recvbuf, bytes * (size_t)k->n->P)) {
        h.mode = NODE_SPILL;
        spill_tell(k, "a buffer in device memory cannot be read or written by CMA");
    }
    if ((rc = pull_round(k, &h, &any)) != WEFT_SUCCESS)
        return rc;
    rc = pull_each(k, a->recvbuf, bytes, 0);
    if (rc == WEFT_SUCCESS && (const char *)a->sendbuf != own)
        memcpy(own, a->sendbuf, bytes);
    return pull_finish(k, rc, 1);
}

/*
 * Alltoallv in one round: each rank writes, in its slot, a header and a
 * table of where its block for each rank lies and how long it is, then,
 * when they fit, its blocks for the others packed after it; arrives; and
 * once every rank arrived gets its block from each other rank -- out of
 * that rank's slot, or, when that rank's blocks did not fit, out of its
 * send buffer by CMA (node_pull, as node_a2a_pull) -- and its own from
 * send to receive buffer directly.
 *
 *   slot of rank r:  | header (node_pull_hdr) | off,len for 0 | ... | off,len for P-1 | blocks r->0, ... (packed) |
 *
 * The offsets are into the slot (packed) or the send buffer (pulled). No
 * rank knows the others' sizes, so which calls fit cannot be agreed
 * beforehand: the round agrees. A rank whose blocks do not fit, where
 * pulls cannot be made (WEFT_SHM_CMA=0, a refused probe, device memory),
 * writes spill; every rank reads every header, so all see it, and all
 * return NODE_SPILLED: the call then goes as messages (coll_run), one
 * round later. A receive size that differs from the sender's block is
 * WEFT_ERR_MISMATCH naming both ranks, as on the message path. A rank
 * whose blocks are pulled waits, at the end, until every rank is through.
 */
struct node_a2av_entry {
    uint64_t off, len;
};

static int node_alltoallv(struct node_call *k, const struct weft_coll_args *a)
{
    struct weft_core *core = k->cc->core;
    struct coll_node *n = k->n;
    const struct weft_coll_vec *v = a->vec;
    const int P = n->P, me = n->me;
    const size_t slot = k->b < NODE_NSMALL ? NODE_SMALL : n->slot;
    const size_t hdr = sizeof(struct node_pull_hdr);
    const size_t table = node_line_up(hdr + (size_t)P * sizeof(struct node_a2av_entry));
    char *mine = slot_of(n, k->b, me);
    struct node_a2av_entry *e = (struct node_a2av_entry *)(mine + hdr);
    const size_t block_max = weft_coll_node_bytes(k->cc);
    size_t total = 0, send_hi = 0, recv_hi = 0, biggest = 0;
    int rc = WEFT_SUCCESS, any;

    for (int r = 0; r < P; r++) {
        if (r != me) {
            total += v->send_bytes[r];
            if (v->send_bytes[r] > biggest)
                biggest = v->send_bytes[r];
        }
        if (v->send_bytes[r] && v->send_displs[r] + v->send_bytes[r] > send_hi)
            send_hi = v->send_displs[r] + v->send_bytes[r];
        if (v->recv_bytes[r] && v->recv_displs[r] + v->recv_bytes[r] > recv_hi)
            recv_hi = v->recv_displs[r] + v->recv_bytes[r];
    }
    struct node_pull_hdr h = { NODE_PACKED, (uint64_t)(uintptr_t)a->sendbuf,
                               (uint64_t)node_host(k, a->recvbuf, recv_hi) };
    /* Packed while the blocks fit and none is above WEFT_NODE_COLL_KB, as
     * an alltoall's (node_fits): larger ones are pulled, one copy instead
     * of two. */
    if (table > slot || total > slot - table || biggest > block_max) {
        h.mode = table <= slot && n->pulls && h.recv_host && node_host(k, a->sendbuf, send_hi) ? NODE_PULLED
                                                                                              : NODE_SPILL;
        if (h.mode == NODE_SPILL) {
            char why[200];
            snprintf(why, sizeof why, "this rank's blocks (%zu B, the largest %zu B) are not packed in its slot and "
                     "cannot be pulled (%s)", total, biggest,
                     table > slot ? "the table of a block per rank does not fit the slot"
                     : !n->pulls  ? "CMA between the node's ranks is off (WEFT_SHM_CMA=0) or was refused at set-up"
                                  : "a buffer in device memory cannot be read or written by CMA");
            spill_tell(k, why);
        }
    }
    if (h.mode == NODE_PACKED) {
        size_t at = table;
        for (int r = 0; r < P && rc == WEFT_SUCCESS; r++) {
            e[r].off = at;
            e[r].len = r == me ? 0 : v->send_bytes[r];
            if (r != me && v->send_bytes[r] > 0) {
                rc = node_put(core, mine + at, (const char *)a->sendbuf + v->send_displs[r], v->send_bytes[r],
                              k->what);
                at += v->send_bytes[r];
            }
        }
        if (rc != WEFT_SUCCESS)
            return rc;
    } else if (h.mode == NODE_PULLED) {
        for (int r = 0; r < P; r++) {
            e[r].off = v->send_displs[r];
            e[r].len = r == me ? 0 : v->send_bytes[r];
        }
    }
    if ((rc = pull_round(k, &h, &any)) != WEFT_SUCCESS)
        return rc;
    for (int i = 1; i < P && rc == WEFT_SUCCESS; i++) {
        const int r = (me + i) % P;
        const char *from = slot_of(n, k->b, r);
        struct node_pull_hdr th;
        struct node_a2av_entry t;
        memcpy(&th, from, sizeof th);
        memcpy(&t, from + hdr + (size_t)me * sizeof t, sizeof t);
        if (t.len != v->recv_bytes[r]) {
            weft_set_error(core, WEFT_ERR_MISMATCH,
                           "alltoallv (node-local, collective #%u): rank %d sends %llu bytes to rank %d, which "
                           "expects %zu from it",
                           k->seq, node_crank(n, r), (unsigned long long)t.len, core->rank, v->recv_bytes[r]);
            rc = node_fail(k, WEFT_ERR_MISMATCH, 1);
            break;
        }
        char *dst = (char *)a->recvbuf + v->recv_displs[r];
        if (t.len == 0)
            continue;
        rc = th.mode == NODE_PULLED ? node_pull(k, r, dst, th.addr + t.off, (size_t)t.len)
                                    : node_copy(core, dst, from + t.off, (size_t)t.len, k->what);
    }
    if (rc == WEFT_SUCCESS && v->send_bytes[me] > 0)
        rc = node_copy(core, (char *)a->recvbuf + v->recv_displs[me],
                       (const char *)a->sendbuf + v->send_displs[me], v->send_bytes[me], k->what);
    return any ? pull_finish(k, rc, h.mode == NODE_PULLED) : rc;
}

static int run_call(struct node_call *k, const struct weft_coll_args *a, size_t need)
{
    struct weft_core *core = k->cc->core;
    struct coll_node *n = k->n;
    int P = n->P, me = n->me, rc = WEFT_SUCCESS;
    char *mine = slot_of(n, k->b, me);
    size_t es = weft_dtype_size(a->dtype);

    /* Buffer b's slot and fingerprint are this rank's to rewrite once no
     * rank reads them any more (a slow rank still in the last call on b
     * reads this rank's fingerprint there even when this rank wrote no
     * data for it). */
    if ((rc = node_slot_free(k)) != WEFT_SUCCESS)
        return rc;
    switch (a->kind) {
    case WEFT_COLL_BARRIER:
        node_arrive(k);
        return node_wait(k, -1, FLAG_ARRIVE, k->tag);

    case WEFT_COLL_BCAST:
        if (me == a->root) {
            if ((rc = node_put(core, bcast_area(k, a), a->recvbuf, a->count, "bcast")) != WEFT_SUCCESS)
                return rc;
            node_arrive(k);
            return WEFT_SUCCESS;
        }
        node_arrive(k);
        if ((rc = node_wait(k, a->root, FLAG_ARRIVE, k->tag)) != WEFT_SUCCESS)
            return rc;
        return node_copy(core, a->recvbuf, bcast_area(k, a), a->count, "bcast");

    case WEFT_COLL_ALLTOALLV:
        return node_alltoallv(k, a);

    case WEFT_COLL_ALLTOALL:
        if (a2a_pulls(k->cc, a))
            return node_a2a_pull(k, a);
        break;

    case WEFT_COLL_ALLGATHER:
        if (ag_pulls(k->cc, a))
            return node_ag_pull(k, a);
        break;

    case WEFT_COLL_SCATTER:
        if (scatter_pulls(k->cc, a))
            return node_scatter_pull(k, a);
        if (me == a->root) {
            /* Only the others' blocks go through the slot; the root's own
             * goes straight to recvbuf (copied once, not twice). */
            const char *from = a->sendbuf;
            size_t lo = (size_t)me * a->count, hi = lo + a->count;
            if ((rc = node_put(core, mine, from, lo, "scatter")) != WEFT_SUCCESS ||
                (rc = node_put(core, mine + hi, from + hi, need - hi, "scatter")) != WEFT_SUCCESS)
                return rc;
            node_arrive(k);
            return node_copy(core, a->recvbuf, from + lo, a->count, "scatter");
        }
        node_arrive(k);
        if ((rc = node_wait(k, a->root, FLAG_ARRIVE, k->tag)) != WEFT_SUCCESS)
            return rc;
        return node_copy(core, a->recvbuf, slot_of(n, k->b, a->root) + (size_t)me * a->count, a->count, "scatter");

    default:
        break;
    }

    /* Every rank contributes: its slot first. */
    const void *src = a->sendbuf;
    if (a->kind == WEFT_COLL_ALLGATHER && a->sendbuf == (const char *)a->recvbuf + (size_t)me * a->count)
        src = (const char *)a->recvbuf + (size_t)me * a->count;
    size_t in = a->kind == WEFT_COLL_ALLGATHER || a->kind == WEFT_COLL_GATHER ? a->count : need;
    /* What only this rank reads of its own part is not copied into its
     * slot: it is used where it is (copied once, not twice). A gather's
     * root: its block, all of it. An alltoall's and a reduce_scatter's
     * rank: block me. A reduce's root: its operand, all of it. The two
     * reductions read it from sendbuf in host memory only, and not in
     * place beyond the first two ranks: there the running result, made in
     * recvbuf, would overwrite the operand before it is read. */
    size_t ob = (size_t)me * a->count * (a->kind == WEFT_COLL_REDUCE_SCATTER ? es : 1);   /* block me */
    int red_own = !core->cuda && (me < 2 || (a->kind == WEFT_COLL_REDUCE_SCATTER
                                                 ? (const char *)a->sendbuf + ob != (const char *)a->recvbuf
                                                 : a->sendbuf != a->recvbuf));
    int own_direct = (me == a->root && (a->kind == WEFT_COLL_GATHER || (a->kind == WEFT_COLL_REDUCE && red_own))) ||
                     a->kind == WEFT_COLL_ALLTOALL || (a->kind == WEFT_COLL_REDUCE_SCATTER && red_own);
    if (!own_direct)
        rc = node_put(core, mine, src, in, k->what);
    else if (a->kind == WEFT_COLL_ALLTOALL || a->kind == WEFT_COLL_REDUCE_SCATTER) {
        size_t ol = a->kind == WEFT_COLL_ALLTOALL ? a->count : a->count * es;   /* block me's length */
        rc = node_put(core, mine, src, ob, k->what);
        if (rc == WEFT_SUCCESS)
            rc = node_put(core, mine + ob + ol, (const char *)src + ob + ol, need - ob - ol, k->what);
    }
    if (rc != WEFT_SUCCESS)
        return rc;
    node_arrive(k);

    switch (a->kind) {
    case WEFT_COLL_GATHER:
    case WEFT_COLL_REDUCE:
        /* A contributor whose part is out returns: at once within the
         * small buffers, as with eager messages. In a big buffer it first
         * waits for every rank's arrival, as a large reduce's or gather's
         * rendezvous waits for the root: so it sees every fingerprint,
         * and a mismatched or absent rank fails the call on every rank,
         * its own included, not only on the root. (Measured: np 4/8 on 2
         * cores, 16 KiB-1 MiB, the slowest rank's time +0-40%, still
         * 1.6-3.4x ahead of Open MPI's; slicing the reduction as the
         * allreduce does was 2x slower there, the root copying the
         * result out.) */
        if (me != a->root)
            return k->b < NODE_NSMALL ? WEFT_SUCCESS : node_wait(k, -1, FLAG_ARRIVE, k->tag);
        break;
    default:
        break;
    }
    if ((rc = node_wait(k, -1, FLAG_ARRIVE, k->tag)) != WEFT_SUCCESS)
        return rc;

    switch (a->kind) {
    case WEFT_COLL_ALLGATHER:
    case WEFT_COLL_GATHER:
        for (int r = 0; r < P && rc == WEFT_SUCCESS; r++)
            rc = node_copy(core, (char *)a->recvbuf + (size_t)r * a->count,
                           own_direct && r == me ? src : slot_of(n, k->b, r), a->count, k->what);
        return rc;
    case WEFT_COLL_ALLTOALL:
        for (int r = 0; r < P && rc == WEFT_SUCCESS; r++)
            rc = node_copy(core, (char *)a->recvbuf + (size_t)r * a->count,
                           (r == me ? (const char *)src : slot_of(n, k->b, r)) + ob, a->count, k->what);
        return rc;
    case WEFT_COLL_REDUCE_SCATTER: {
        void *dst = node_result_buf(k, a->recvbuf);
        node_reduce_range(k, dst, own_direct ? src : NULL, (size_t)me * a->count, a->count, a->dtype, a->op);
        return node_copy(core, a->recvbuf, dst, a->count * es, k->what);
    }
    case WEFT_COLL_REDUCE: {
        void *dst = node_result_buf(k, a->recvbuf);
        node_reduce_range(k, dst, own_direct ? a->sendbuf : NULL, 0, a->count, a->dtype, a->op);
        return node_copy(core, a->recvbuf, dst, a->count * es, k->what);
    }
    case WEFT_COLL_ALLREDUCE: {
        if (need <= NODE_FLAT_MAX) {
            void *dst = node_result_buf(k, a->recvbuf);
            node_reduce_range(k, dst, NULL, 0, a->count, a->dtype, a->op);
            return node_copy(core, a->recvbuf, dst, need, k->what);
        }
        /* Slices of whole cache lines where the type allows, so two ranks'
         * slices never share a line of res. */
        size_t per = (a->count + (size_t)P - 1) / (size_t)P;
        if (NODE_CACHE % es == 0)
            per = (per + NODE_CACHE / es - 1) / (NODE_CACHE / es) * (NODE_CACHE / es);
        size_t lo = per * (size_t)me, hi = lo + per;
        if (lo > a->count)
            lo = a->count;
        if (hi > a->count)
            hi = a->count;
        char *res = n->res + (size_t)(k->b - NODE_NSMALL) * n->slot;
        if (hi > lo)
            node_reduce_range(k, res + lo * es, NULL, lo, hi - lo, a->dtype, a->op);
        atomic_store_explicit(&n->ctrl[me].sliced, k->tag, memory_order_release);
        if ((rc = node_wait(k, -1, FLAG_SLICED, k->tag)) != WEFT_SUCCESS)
            return rc;
        return node_copy(core, a->recvbuf, res, need, k->what);
    }
    default:
        return weft_set_error(core, WEFT_ERR_INTERNAL, "node-local collectives: kind %d", a->kind);
    }
}

const char *weft_coll_kind_name(int kind)
{
    switch (kind) {
    case WEFT_COLL_BARRIER: return "barrier";
    case WEFT_COLL_BCAST: return "bcast";
    case WEFT_COLL_ALLGATHER: return "allgather";
    case WEFT_COLL_ALLREDUCE: return "allreduce";
    case WEFT_COLL_REDUCE: return "reduce";
    case WEFT_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case WEFT_COLL_ALLTOALL: return "alltoall";
    case WEFT_COLL_GATHER: return "gather";
    case WEFT_COLL_SCATTER: return "scatter";
    case WEFT_COLL_ALLTOALLV: return "alltoallv";
    case WEFT_COLL_SPLIT_EXCHANGE: return "weft_comm_split";
    default: return "collective";
    }
}

/* The shape's line at WEFT_DEBUG=info, in the words of the message
 * path's ("allgather 8 B per rank x 3 ranks (1 nodes): node-local shared
 * memory (selector)"). */
static void node_log_shape(struct weft_coll *cc, const struct weft_coll_args *a, size_t need)
{
    const char *algo = cc->nnodes > 1 ? node_hier_algo(cc, a)
                       : node_pulls(cc, a) ? "node-local, each block pulled from its sender by CMA"
                       : need <= NODE_FLAT_MAX || a->kind != WEFT_COLL_ALLREDUCE
                           ? "node-local shared memory"
                           : "node-local shared memory, sliced";
    char what[96];
    switch (a->kind) {
    case WEFT_COLL_ALLREDUCE:
    case WEFT_COLL_REDUCE:
    case WEFT_COLL_REDUCE_SCATTER:
        coll_reduce_log_shape(cc, a->kind, a->count, a->dtype, a->op, -1, algo, 0);
        return;
    case WEFT_COLL_ALLGATHER:
    case WEFT_COLL_ALLTOALL:
    case WEFT_COLL_GATHER:
    case WEFT_COLL_SCATTER:
        snprintf(what, sizeof what, "%s %zu B per rank", weft_coll_kind_name(a->kind), (size_t)a->count);
        break;
    case WEFT_COLL_BCAST:
        snprintf(what, sizeof what, "bcast %zu B", (size_t)a->count);
        break;
    default:
        snprintf(what, sizeof what, "%s", weft_coll_kind_name(a->kind));
        break;
    }
    coll_log_shape_once(cc, a->kind, a->count, -1, what, algo, 0);
}

static int node_run_one(struct weft_coll *cc, const struct weft_coll_args *a, size_t need, int *handled);

/* A bcast above a whole big buffer (P x slot) from 3 ranks on goes
 * through the segment in pieces of P x slot, each its own node-local call
 * (its own collective number and fingerprint): consecutive calls take the
 * two big buffers in turn, so the root fills the next piece while the
 * others copy the last one out. 0: not in pieces. Only the arguments and
 * the agreed settings decide, so every rank splits alike. */
static size_t bcast_piece(const struct weft_coll *cc, const struct weft_coll_args *a)
{
    size_t S = weft_coll_node_bytes(cc), P = (size_t)cc->core->size;
    if (a->kind != WEFT_COLL_BCAST || S == 0 || P < 3 || a->count <= S * P)
        return 0;
    return S * P;
}

int coll_node_run(struct weft_coll *cc, const struct weft_coll_args *a, int *handled)
{
    if (cc->nnodes > 1)
        return node_run_one(cc, a, node_hier_fits(cc, a), handled);
    size_t piece = bcast_piece(cc, a);
    if (piece == 0)
        return node_run_one(cc, a, node_fits(cc, a), handled);
    /* The first piece may find the segment off (set-up refused on some
     * rank): then *handled stays 0 on every rank and the whole call goes
     * as messages; after it, every piece is handled here. */
    int rc = WEFT_SUCCESS;
    for (size_t off = 0; off < a->count && rc == WEFT_SUCCESS; off += piece) {
        struct weft_coll_args pa = *a;
        pa.recvbuf = (char *)a->recvbuf + off;
        pa.count = a->count - off < piece ? a->count - off : piece;
        rc = node_run_one(cc, &pa, pa.count, handled);
        if (!*handled)
            return rc;
    }
    return rc;
}

static int node_run_one(struct weft_coll *cc, const struct weft_coll_args *a, size_t need, int *handled)
{
    *handled = 0;
    if (need == 0)
        return WEFT_SUCCESS;
    if (cc->node_state == NODE_UNTRIED) {
        int rc = node_setup(cc, a);
        if (rc != WEFT_SUCCESS) {
            *handled = 1;
            return rc;
        }
        if (cc->node_state != NODE_ON)
            return WEFT_SUCCESS;   /* messages, on every rank alike */
    }
    /* Above the small segment's slot, from 3 ranks (node_fits; a bcast's
     * whole buffer is its own matter, bcast_area): the large segment, made
     * now if it was not. */
    if (need > cc->node->slot && cc->node_large && a->kind != WEFT_COLL_BCAST) {
        if (cc->node->large_state == NODE_UNTRIED) {
            int rc = node_large_setup(cc, a);
            if (rc != WEFT_SUCCESS) {
                *handled = 1;
                return rc;
            }
        }
        if (cc->node->large_state != NODE_ON)
            return WEFT_SUCCESS;   /* messages, on every rank alike */
    }
    /* An alltoall to pull where some rank cannot read another (agreed at
     * set-up): messages, on every rank alike. */
    if (!cc->node->pulls && node_pulls(cc, a))
        return WEFT_SUCCESS;
    *handled = 1;

    struct node_call k;
    memset(&k, 0, sizeof k);
    k.cc = cc;
    k.n = cc->node;
    k.seq = coll_seq_next(cc);
    k.tag = k.seq + 1;
    /* As on the message path (coll.c): a non-blocking call still holding
     * this number's lanes finishes first -- a failure here refuses the
     * lanes of k.seq (node_fail), which must not be that call's. It only
     * waits (that call's own failure stays with its request). */
    (void)coll_nb_slot_free(cc, k.seq);
    k.b = need <= NODE_SMALL ? (int)(k.seq % NODE_NSMALL) : NODE_NSMALL + (int)(k.seq & 1);
    k.what = weft_coll_kind_name(a->kind);
    struct weft_coll_sig sig = node_sig_of(a);
    k.check = weft_sched_sig_check(&sig, k.seq);
    head_publish(&k.n->ctrl[k.n->me], &k.check);
    weft_p2p_coll_started(cc->p2p, &k.check);
    if (weft_log_level() >= WEFT_LOG_INFO)
        node_log_shape(cc, a, need);

    /* A rank that failed earlier, or this very call already failed
     * elsewhere: nothing is published, the call fails at once. */
    k.epoch = weft_p2p_fault_epoch(cc->p2p);
    char why[512];
    int rc = weft_p2p_fault(cc->p2p, k.seq, why, sizeof why);
    if (rc != WEFT_SUCCESS) {
        weft_set_error(cc->core, rc, "%s (node-local, collective #%u): %s", k.what, k.seq, why);
    } else {
        rc = cc->nnodes > 1 ? node_hier_run(&k, a, need) : run_call(&k, a, need);
    }
    if (rc == NODE_SPILLED) {
        /* An alltoallv whose blocks some rank could not fit: every rank
         * saw it in the round, and the call goes as messages now, on the
         * next collective number (node_alltoallv). */
        rc = WEFT_SUCCESS;
        *handled = 0;
    }
    /* Whatever happened, nothing of this call is read by this rank any
     * more: its done, and its arrival if its part never went out -- with
     * the failure's mark, so no rank reads its slot as this call's data
     * and none waits for it. */
    struct node_ctrl *c = &k.n->ctrl[k.n->me];
    /* (k.arrived, not a load of the shared line: the others poll it.) */
    if (!k.arrived) {
        c->mark_code = rc != WEFT_SUCCESS ? rc : WEFT_ERR_INTERNAL;
        atomic_store_explicit(&c->marked, k.tag, memory_order_release);
        atomic_store_explicit(&c->arrive, k.tag, memory_order_release);
    }
    /* (Not sliced: a slice that is not there must never be read as one;
     * the others learn of the failure from its notice.) */
    atomic_store_explicit(&c->done, k.tag, memory_order_release);
    return rc;
}
