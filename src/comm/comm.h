/*
 * The communicator: the outer struct that owns every layer's context of
 * one comm (core, pipes, collectives, stream engine) and the bootstrap it
 * was made with. Only src/comm/ and src/api/ see it; the layers below get
 * their own context (transports: core; p2p and collectives: p2p).
 */
#ifndef WEFT_COMM_H
#define WEFT_COMM_H

#include <stdint.h>
#include "weft.h"
#include "core.h"
#include "coll.h"

struct weft_p2p;
struct weft_stream;
struct weft_bootstrap;
struct weft_msgpipes;

/* The MPI communicator handle, as the layers above comm/ pass it on
 * without looking at it (comm/bootstrap_mpi.c is the only MPI caller). */
typedef MPI_Comm weft_mpi_comm_t;

struct weft_comm {
    struct weft_core       core;     /* rank, size, config, errors */
    struct weft_p2p       *p2p;      /* pipes, transports, requests (p2p/) */
    struct weft_coll       coll;     /* collectives' state (collectives/) */
    struct weft_stream    *stream;   /* stream-ordered engine (src/stream/) */
    struct weft_msgpipes  *pipes;    /* message pipes (p2p/msgpipe/msgpipe.c) */
    struct weft_bootstrap *boot;     /* how the ranks met (src/comm/bootstrap.h) */
    unsigned char         *cards;    /* [size * card_bytes]: every rank's card (header + transport blobs) */
    size_t                 card_bytes;
    const char            *what;     /* the call that made it, for errors: "weft_comm_create", ... */
    uint32_t               shrinks;  /* weft_comm_shrink calls that reached the agreement (its attempt number) */
};

/* Makes the bootstrap of a new comm; errors go to core (its rank is not
 * known yet). Sets *out only on success. */
typedef int (*weft_bootstrap_make_fn)(void *arg, struct weft_core *core, struct weft_bootstrap **out);
/* The common part of every creation: make the bootstrap, agree on the
 * configuration, exchange cards, connect, set up the layers above the pipes.
 * what names the public call in errors. Collective over the bootstrap's ranks. */
int weft_comm_assemble(const char *what, weft_bootstrap_make_fn make, void *make_arg,
                       const struct weft_settings *settings, struct weft_comm **out);
/* Collective over mpi_comm (see weft_comm_create in weft.h). */
int weft_comm_create_mpi(weft_mpi_comm_t mpi_comm, const struct weft_settings *settings, struct weft_comm **out);
/* Collective over parent (see weft_comm_split in weft.h): one allgather of
 * (color, key) on the parent's collectives, then, for color >= 0, a comm
 * assembled over the split bootstrap (bootstrap_split.h); color < 0:
 * *out = NULL. The new comm keeps nothing of the parent. */
int weft_comm_split_all(struct weft_comm *parent, int color, int key, const struct weft_settings *settings,
                        struct weft_comm **out);
/* Collective over the live ranks of a comm (see weft_comm_shrink in
 * weft.h; src/comm/shrink.c): revoke, agree on the failed ranks over the
 * comm's pipes (exclude[0 .. nexclude) counted failed from the start;
 * checked by the caller), assemble the others' comm over the split
 * bootstrap. */
int weft_comm_shrink_all(struct weft_comm *c, const int *exclude, int nexclude, struct weft_comm **out);
/* Collective (see weft_comm_destroy); local once a rank failed or after abort. */
int weft_comm_destroy_all(struct weft_comm *c);

/* The value of creation's max-agreements (a code and the rank that had
 * it; 0: success everywhere), and its check on the way back: -1 when v
 * names no code and rank of a comm of `size` ranks (damaged in transit). */
long long weft_agree_encode(int code, int rank);
int       weft_agree_decode(long long v, int size, int *code, int *rank);
/* weft_comm_abort: local, any thread. */
int weft_comm_abort_all(struct weft_comm *c);

#endif
