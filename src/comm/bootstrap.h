/*
 * Bootstrap: how the ranks of a comm meet and exchange their set-up data,
 * behind one interface so that comm assembly (comm.c) does not care how the
 * ranks were started: MPI (bootstrap_mpi.c), a unique id whose root
 * listener relays the records over TCP (bootstrap_uid.c, ranks launched
 * without MPI), or the pipes of an existing comm (bootstrap_split.c).
 *
 * Every call is a collective over all ranks of the comm and is only used
 * inside comm creation and weft_comm_destroy. Failures are recorded in the
 * core's last error and returned as WEFT_* codes.
 */
#ifndef WEFT_BOOTSTRAP_H
#define WEFT_BOOTSTRAP_H

#include <stddef.h>

struct weft_core;
struct weft_bootstrap;

struct weft_bootstrap_ops {
    const char *name;
    /* all[r * bytes .. +bytes) = rank r's record. */
    int  (*allgather)(struct weft_bootstrap *b, const void *mine, void *all, size_t bytes);
    /* Record i of send goes to rank i; recv[i] is rank i's record for me. */
    int  (*alltoall)(struct weft_bootstrap *b, const void *send, void *recv, size_t bytes);
    /* NULL for a bootstrap that lives only through create (unique id,
     * split): destroy's barrier then goes over the comm's own pipes.
     * While the barrier is not complete it calls give_up(arg) between its
     * polls (give_up may nap; it is what keeps weft's own failure detection
     * running meanwhile); a nonzero answer ends the wait: the barrier
     * returns that answer, leaving its own state behind (this rank's part
     * was given, so the others still complete). */
    int  (*barrier)(struct weft_bootstrap *b, int (*give_up)(void *arg), void *arg);
    /* Agreement: *value becomes the largest of every rank's *value. */
    int  (*max)(struct weft_bootstrap *b, long long *value);
    /* Optional: create succeeded on every rank; drop what only create
     * needed (sockets, the root's thread). Only barrier (if any) and destroy
     * are called afterwards. */
    void (*created)(struct weft_bootstrap *b);
    void (*destroy)(struct weft_bootstrap *b);
};

struct weft_bootstrap {
    const struct weft_bootstrap_ops *ops;
    struct weft_core                *core;   /* errors go here */
    int                              rank, size;
};

#endif
