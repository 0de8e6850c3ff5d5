/*
 * The split bootstrap (bootstrap_split.c): the ranks of a comm made by
 * weft_comm_split meet over the pipes of the comm they were split from (the
 * parent), on the internal lane WEFT_TAG_SPLIT (p2p/tags.h). No MPI.
 *
 * It lives only through the new comm's creation: once created, it lets go
 * of the parent (the new comm never touches it again, so either comm may be
 * destroyed first), and it has no barrier (destroy's barrier goes over the
 * new comm's own pipes).
 */
#ifndef WEFT_BOOTSTRAP_SPLIT_H
#define WEFT_BOOTSTRAP_SPLIT_H

#include <stdint.h>

struct weft_core;
struct weft_p2p;
struct weft_bootstrap;

/* parent: the parent comm's pipes; members[i] (i < size) is the parent rank
 * of new rank i, rank is this process's new rank. split_id names this split
 * on the parent (the same on every member, different for every split of one
 * parent): it goes in every message's fingerprint. members is copied.
 * Errors go to core (the new comm's). Sets *out only on success. */
int weft_bootstrap_split_create(struct weft_p2p *parent, const int *members, int size, int rank, uint32_t split_id,
                                struct weft_core *core, struct weft_bootstrap **out);
/* The same for another call on a subset of the parent's ranks (what: its
 * name in errors). weft_comm_shrink's ids have WEFT_SPLIT_ID_SHRINK set: a
 * split's are the parent's collective count, which does not reach 2^31
 * (and the two never share a lane's traffic at once: shrink runs on a
 * revoked comm, where no split can start). */
#define WEFT_SPLIT_ID_SHRINK 0x80000000u
int weft_bootstrap_subset_create(struct weft_p2p *parent, const int *members, int size, int rank, uint32_t split_id,
                                 const char *what, struct weft_core *core, struct weft_bootstrap **out);

#endif
