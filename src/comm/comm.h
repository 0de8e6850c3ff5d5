/*
 * The communicator: MPI bootstrap results, pipes to every peer, the
 * per-comm state of each transport, the lock, and the last error.
 */
#ifndef WEFT_COMM_H
#define WEFT_COMM_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include "weft.h"
#include "config.h"
#include "pipe.h"

/* What every rank tells every other at create: one fixed-size record,
 * exchanged with one MPI_Allgather. Fields a transport does not offer are
 * zero. Reserved space is for later transports (NICs, GPUs). */
struct weft_rank_card {
    uint64_t node_key;        /* equal for ranks on one real node */
    int32_t  node;            /* effective node index (real node x virtual block) */
    int32_t  pid;
    uint64_t token;           /* random; a TCP peer must present it to connect */
    uint64_t cma_probe_addr;  /* address of `token` in this process: CMA probe */
    uint32_t transports_mask; /* transports this rank allows */
    int32_t  vblock;          /* WEFT_VIRTUAL_NODES block of this rank (0 when off) */
    char     hostname[64];
    char     shm_name[64];    /* POSIX shm segment with this rank's inbound rings */
    uint16_t tcp_family;      /* AF_INET / AF_INET6, 0 = no TCP */
    uint16_t tcp_port;        /* network byte order */
    uint8_t  tcp_addr[16];
    /* ib: the port this rank uses (QP numbers are exchanged per pair in connect) */
    char     ib_dev[32];      /* device name; "" = ib not offered */
    uint8_t  ib_port;
    uint8_t  ib_link_layer;   /* IBV_LINK_LAYER_INFINIBAND (1) / ETHERNET (2) */
    uint8_t  ib_mtu;          /* enum ibv_mtu of the port (active_mtu) */
    uint8_t  ib_gid_index;
    uint16_t ib_lid;
    uint16_t ib_pad;
    uint8_t  ib_gid[16];
    /* CUDA: the devices this rank sees, by PCI bus id (for IPC reachability) */
    uint8_t  gpu_count;       /* 0 = no CUDA in this rank */
    uint8_t  gpu_pad[7];
    char     gpu_busid[8][16];/* "0000:07:00.0", device ordinal = index */
    /* ib: 1 = this rank registers CUDA device memory with its NIC (GPUDirect
     * RDMA, p2p/ib_gdr.c); a pair moves device data by RDMA only when both say so */
    uint8_t  ib_gdr;
    uint8_t  ib_gdr_pad[3];
    uint8_t  reserved[184];
};

struct weft_comm {
    MPI_Comm                  mpi;        /* dup of the user's comm */
    int                       rank, size;
    struct weft_config        cfg;
    pthread_mutex_t           lock;       /* guards everything below but last_error */
    pthread_mutex_t           err_lock;   /* guards last_error */
    uint64_t                  my_token;   /* = my card's token; its address is the CMA probe */

    struct weft_rank_card    *cards;      /* [size] */
    int                       num_nodes;
    int                       local_ranks;/* ranks on my effective node (me included) */
    int                       oversubscribed; /* more local ranks than online CPUs */

    struct weft_pipe         *pipes;      /* [size]; pipes[rank] is the self pipe */
    unsigned                  tp_used;    /* bit per transport some pipe uses */
    void                     *tp_state[WEFT_TP_COUNT];
    struct weft_regcache     *regcache;   /* RDMA registrations (set by ib connect); NULL without ib */
    int                       cuda;       /* CUDA loaded and a device present: device buffers allowed */
    void                     *cuda_ipc_state;  /* p2p/cuda_ipc.c: mapping cache, semaphores */
    void                     *stage_state;     /* p2p/stage.c: pinned staging pool, internal stream */
    void                     *stream_state;    /* src/stream.c: stream-ordered operations, progress thread */

    uint32_t                  coll_seq;   /* collectives started (tags of internal lanes) */
    void                     *coll_state; /* collectives/: selector memory (shapes logged) */
    void                    (*coll_state_free)(void *);

    struct weft_request      *req_free;   /* recycled requests (no malloc per message) */
    size_t                    req_free_count;

    uint64_t                  events;     /* progress events so far */
    size_t                    out_queued; /* outbound messages queued on all pipes */
    int                       waiters;    /* threads inside wait */

    char                      last_error[1024];
};

/* One progress pass over every transport in use, then queued outbound
 * messages. Caller holds c->lock. Returns the number of events. */
int  weft_progress(struct weft_comm *c);

/* Waits, bounded by WEFT_TIMEOUT, until every request in reqs[0..n) is DONE.
 * Caller holds c->lock; it is released while sleeping. On timeout the pipes
 * of the requests still pending are broken (they complete with
 * WEFT_ERR_TIMEOUT) and WEFT_ERR_TIMEOUT is returned. */
int  weft_progress_wait(struct weft_comm *c, struct weft_request **reqs, size_t n, const char *what);

/* A zeroed request (recycled or new); caller holds c->lock. NULL: no memory. */
struct weft_request *weft_request_alloc(struct weft_comm *c);
/* Recycles a completed request; caller holds its comm's lock. */
void weft_request_free(struct weft_request *r);
/* Frees the recycled requests (destroy). */
void weft_request_pool_fini(struct weft_comm *c);

/* Monotonic seconds. */
double weft_now(void);

#endif
