/*
 * Internal tags: the one table of the library's own lanes.
 *
 * User tags are >= 0. Every lane the library uses for itself has a negative
 * tag from one of the ranges below, so internal traffic never matches a user
 * receive, and two internal users never share a lane. Each range is
 * [-(base + count - 1), -base]; the asserts keep them apart.
 *
 *   range                    owner                     lanes
 *   -(0x10000 .. 0x103ff)    collectives/ (coll.c)     64 call slots x 16 phases
 *   -(0x10400 .. 0x107ff)    stream-ordered collectives 64 call slots x 16 phases
 *                            (src/stream/: numbered at the call, started
 *                            whenever their CUDA events pass, so they get
 *                            lanes of their own)
 *   -(0x200000 .. 0x2fffff)  staged device transfers   one per message in flight
 *                            (p2p/stage.c)             (index mod 2^20)
 *   -0x300000                destroy after a failure   the survivors' final barrier
 *                            (p2p/setup.c)
 *   -0x300001                weft_comm_split           the new comm's set-up exchanges
 *                            (src/comm/bootstrap_split.c) over the parent's pipes
 *   -0x300002                weft_comm_shrink          the survivors' agreement on who failed
 *                            (src/comm/shrink.c)
 *   -(0x400000 .. 0x5fffff)  message pipes             two lanes per pipe id (2^20 ids):
 *                            (p2p/msgpipe/msgpipe.c)   descriptors + close markers, buffers
 */
#ifndef WEFT_TAGS_H
#define WEFT_TAGS_H

/* Collectives: a call takes slot seq % SLOTS; its tags are
 * -(BASE + slot * PHASES + phase), phase in [0, PHASES). */
#define WEFT_TAG_COLL_BASE   0x10000
#define WEFT_TAG_COLL_SLOTS  64
#define WEFT_TAG_COLL_PHASES 16
#define WEFT_TAG_COLL_COUNT  (WEFT_TAG_COLL_SLOTS * WEFT_TAG_COLL_PHASES)

/* Stream-ordered collectives: the same layout on their own range. */
#define WEFT_TAG_SCOLL_BASE  (WEFT_TAG_COLL_BASE + WEFT_TAG_COLL_COUNT)

/* Staged transfers: chunks of message k travel on -(BASE + k % COUNT). */
#define WEFT_TAG_STAGE_BASE  0x200000
#define WEFT_TAG_STAGE_COUNT 0x100000

_Static_assert(WEFT_TAG_COLL_BASE > 0, "internal tags are negative");
_Static_assert(WEFT_TAG_COLL_BASE + WEFT_TAG_COLL_COUNT <= WEFT_TAG_SCOLL_BASE,
               "collective and stream collective lanes overlap");
_Static_assert(WEFT_TAG_SCOLL_BASE + WEFT_TAG_COLL_COUNT <= WEFT_TAG_STAGE_BASE,
               "stream collective and staging lanes overlap");
_Static_assert((long long)WEFT_TAG_STAGE_BASE + WEFT_TAG_STAGE_COUNT <= 0x7fffffffLL,
               "staging lanes overflow int");

/* The survivors' barrier of weft_comm_destroy (a rank failed: no MPI barrier). */
#define WEFT_TAG_DESTROY (-0x300000)
_Static_assert(WEFT_TAG_STAGE_BASE + WEFT_TAG_STAGE_COUNT <= 0x300000, "staging and destroy lanes overlap");

/* weft_comm_split: the bootstrap of the new comm runs over the parent's
 * pipes on this one lane. One lane serves every split of a parent: splits
 * are collectives on the parent, so they run in the same order on every
 * rank, and the lane is FIFO per peer; each message also carries a
 * fingerprint naming its split and exchange, so a stray of a split that
 * failed half-way is refused (WEFT_ERR_MISMATCH), never taken as data. */
#define WEFT_TAG_SPLIT (-0x300001)
_Static_assert(WEFT_TAG_SPLIT != WEFT_TAG_DESTROY, "split and destroy lanes overlap");

/* weft_comm_shrink: the survivors' agreement on who failed, over the
 * revoked comm's pipes (src/comm/shrink.c). Each message carries the
 * attempt and round it belongs to, so a stray of an attempt that failed
 * is told from the current one. */
#define WEFT_TAG_SHRINK (-0x300002)
_Static_assert(WEFT_TAG_SHRINK != WEFT_TAG_SPLIT && WEFT_TAG_SHRINK != WEFT_TAG_DESTROY,
               "shrink, split and destroy lanes overlap");

/* Message pipes: pipe id k's descriptors and close markers travel on
 * -(BASE + 2k), its buffers on -(BASE + 2k + 1). Ids are < 2^20
 * (WEFT_PIPE_ID_MAX in weft.h). */
#define WEFT_TAG_MSGPIPE_BASE  0x400000
#define WEFT_TAG_MSGPIPE_IDS   0x100000
_Static_assert(WEFT_TAG_MSGPIPE_BASE > 0x300002, "message pipe and shrink lanes overlap");
_Static_assert((long long)WEFT_TAG_MSGPIPE_BASE + 2LL * WEFT_TAG_MSGPIPE_IDS <= 0x7fffffffLL,
               "message pipe lanes overflow int");

/* The lanes weft_comm_revoke ends: the application's own (user tags and
 * message pipes) and the collectives' (blocking, non-blocking,
 * stream-ordered: none starts on a revoked comm, and a peer's collective
 * in flight must get its large messages refused here, or it would wait
 * for a rank that never joins its call). The other lanes stay: a revoked
 * comm still carries shrink's agreement, the new comm's set-up and
 * destroy's barrier. */
static inline int weft_tag_revocable(int tag)
{
    long long t = -(long long)tag;
    return tag >= 0 || (t >= WEFT_TAG_COLL_BASE && t < WEFT_TAG_SCOLL_BASE + WEFT_TAG_COLL_COUNT) ||
           (t >= WEFT_TAG_MSGPIPE_BASE && t < WEFT_TAG_MSGPIPE_BASE + 2LL * WEFT_TAG_MSGPIPE_IDS);
}

static inline int weft_tag_msgpipe_ctrl(int id) { return -(WEFT_TAG_MSGPIPE_BASE + 2 * id); }
static inline int weft_tag_msgpipe_data(int id) { return -(WEFT_TAG_MSGPIPE_BASE + 2 * id + 1); }
/* A message pipe's data lane carries the application's buffers: they take
 * the eager limit of user messages, not the larger one of the library's
 * own lanes (p2p/pipe.c). */
static inline int weft_tag_is_msgpipe_data(int tag)
{
    return tag < 0 && -tag >= WEFT_TAG_MSGPIPE_BASE && -tag < WEFT_TAG_MSGPIPE_BASE + 2 * WEFT_TAG_MSGPIPE_IDS &&
           ((-tag - WEFT_TAG_MSGPIPE_BASE) & 1) == 1;
}

static inline int weft_tag_coll(unsigned slot, int phase)
{
    return -(WEFT_TAG_COLL_BASE + (int)(slot % WEFT_TAG_COLL_SLOTS) * WEFT_TAG_COLL_PHASES + phase);
}

static inline int weft_tag_scoll(unsigned slot, int phase)
{
    return -(WEFT_TAG_SCOLL_BASE + (int)(slot % WEFT_TAG_COLL_SLOTS) * WEFT_TAG_COLL_PHASES + phase);
}

/* The last phase of every call's lanes carries data towards a root that
 * has not necessarily posted its receive yet: a binomial reduce's partial
 * sums (collectives/reduce.c). Its messages take the eager limit of user
 * messages, not the larger one of the library's lanes (p2p/pipe.c): in a
 * loop of reduces a leaf's eager sends complete at once, so it runs calls
 * ahead, every piece arrives unexpected and is copied twice more; as a
 * rendezvous the leaf waits for the root and the piece is copied once
 * (np 2, 32 KiB: 6-8 us instead of 18-21; docs/benchmarks.md, "Reduce:
 * tree or ring"). The barrier's zero-byte messages may use this phase
 * too (round % PHASES beyond 2^15 ranks): they are eager at any limit. */
#define WEFT_TAG_COLL_PHASE_TO_ROOT (WEFT_TAG_COLL_PHASES - 1)

static inline int weft_tag_is_coll_to_root(int tag)
{
    long long t = -(long long)tag;
    return t >= WEFT_TAG_COLL_BASE && t < WEFT_TAG_SCOLL_BASE + WEFT_TAG_COLL_COUNT &&
           (t - WEFT_TAG_COLL_BASE) % WEFT_TAG_COLL_PHASES == WEFT_TAG_COLL_PHASE_TO_ROOT;
}

/* Whether tag is a lane of the stream engine's collectives (weft_tag_scoll):
 * by value, since a static inline function's address differs between
 * translation units. */
static inline int weft_tag_is_scoll(int tag)
{
    long long t = -(long long)tag;
    return t >= WEFT_TAG_SCOLL_BASE && t < WEFT_TAG_SCOLL_BASE + WEFT_TAG_COLL_COUNT;
}

static inline int weft_tag_stage(unsigned k)
{
    return -(int)(WEFT_TAG_STAGE_BASE + (k % WEFT_TAG_STAGE_COUNT));
}

#endif
