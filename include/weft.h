/*
 * weft — point-to-point pipes and collectives for MPI jobs.
 *
 * This header is the whole public API. MPI starts the ranks and carries the
 * one-time exchange of connection data inside weft_comm_create (or, without
 * MPI, a unique id's listener does, in weft_comm_init); after that
 * weft moves data itself (self, shared memory, TCP; InfiniBand and CUDA IPC
 * where built and present) and makes no MPI call until weft_comm_destroy.
 *
 * Every call returns a WEFT_* code. weft_comm_last_error() says what failed,
 * on which rank and peer, and why. All calls are thread-safe, unless a
 * comm is made with WEFT_THREADS=serialized: the program then calls into
 * that comm from one thread at a time (docs/api.md).
 */
#ifndef WEFT_H
#define WEFT_H

#include <stddef.h>
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define WEFT_API __attribute__((visibility("default")))
#else
#define WEFT_API
#endif

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0

typedef struct weft_comm    weft_comm_t;
typedef struct weft_request weft_request_t;

enum {
    WEFT_SUCCESS = 0,
    WEFT_ERR_INVALID_ARG,   /* bad argument: NULL, peer out of range, negative tag, ... */
    WEFT_ERR_TRUNCATE,      /* message larger than the posted receive buffer */
    WEFT_ERR_NO_MEMORY,
    WEFT_ERR_UNSUPPORTED,   /* no transport/feature for this request on this build/machine */
    WEFT_ERR_TRANSPORT,     /* a transport failed (peer gone, connection reset, ...) */
    WEFT_ERR_TIMEOUT,       /* WEFT_TIMEOUT seconds passed with no progress */
    WEFT_ERR_MPI,           /* an MPI call inside create/destroy failed */
    WEFT_ERR_INTERNAL,
    WEFT_ERR_MISMATCH,      /* ranks called different collectives (kind, size, root or order) */
    WEFT_ERR_ABORTED,       /* weft_comm_abort was called on this comm (or on a peer's, for its pipe) */
    WEFT_ERR_CLOSED,        /* the message pipe was closed (by this side or its peer) first */
    WEFT_ERR_REVOKED        /* the comm was revoked (weft_comm_revoke, here or on a peer): only
                             * weft_comm_shrink and weft_comm_destroy still work on it */
};

/* Completion status of a request. bytes: size of the message (for a
 * truncated receive, the size the sender sent); error: WEFT_* code. */
typedef struct { size_t bytes; int peer; int tag; int error; } weft_status_t;

/* Collective over mpi_comm: dups it, exchanges rank cards, connects peers. */
WEFT_API int  weft_comm_create(MPI_Comm mpi_comm, weft_comm_t **comm);
/* Collective: every rank should have completed its requests first. Requests
 * still outstanding are failed and freed (their handles become invalid) and
 * destroy returns WEFT_ERR_INVALID_ARG saying how many; the comm is freed
 * either way. After weft_comm_abort, destroy is local (no peer is waited
 * for), frees everything and returns WEFT_ERR_ABORTED. */
WEFT_API int  weft_comm_destroy(weft_comm_t *comm);
/* Local, callable from any thread (a watchdog) while other threads are
 * inside calls on comm: every pending and later call on comm returns
 * WEFT_ERR_ABORTED promptly, and connected peers are told, so their pipes
 * to this rank break at once (their calls fail naming this rank) instead
 * of timing out. Call weft_comm_destroy afterwards to free the comm. */
WEFT_API int  weft_comm_abort(weft_comm_t *comm);
/* Local, callable from any thread, idempotent: revokes comm on every rank.
 * Every peer is told (and each tells the others, so a revoker that dies
 * half-way still reaches everyone); on every rank, every pending call on
 * comm -- a blocking or non-blocking collective, a receive no message has
 * met yet, a message pipe's operations -- and every later call returns
 * WEFT_ERR_REVOKED, whose text names the rank that revoked and why the
 * comm was already failing, if it was. A transfer already moving data may
 * still complete. The pipes stay up: the comm is left for
 * weft_comm_shrink and weft_comm_destroy (which is then over the pipes,
 * with no MPI call). After weft_comm_abort: WEFT_ERR_ABORTED. */
WEFT_API int  weft_comm_revoke(weft_comm_t *comm);
/* Collective over the ranks of comm that are alive: revokes comm (if it
 * is not yet), then the survivors agree, over comm's pipes, which ranks
 * failed (died, stopped, aborted, unreachable: any rank some survivor
 * counts failed), and get *newcomm, a comm of the others in comm's rank
 * order, with comm's configuration (no MPI call; comm itself stays revoked
 * and is destroyed as usual). A rank that the others count failed while
 * it lives gets WEFT_ERR_REVOKED and *newcomm NULL. A rank failing during
 * the shrink itself can make it fail on every survivor (within
 * WEFT_TIMEOUT): call weft_comm_shrink again on the same comm. */
WEFT_API int  weft_comm_shrink(weft_comm_t *comm, weft_comm_t **newcomm);
/* weft_comm_shrink with the ranks exclude[0 .. nexclude) counted failed
 * from the start, whether they live or not: they need not (and should
 * not) call, and nobody waits for them (ncclCommShrink's form). A rank
 * out of range, or this rank itself, in the list: WEFT_ERR_INVALID_ARG,
 * nothing done. The survivors should pass the same list; the agreement
 * leaves out every rank some survivor's list names. */
WEFT_API int  weft_comm_shrink_excluding(weft_comm_t *comm, const int *exclude, int nexclude,
                                         weft_comm_t **newcomm);
/* Writes this rank's operation journal of comm -- its last 256 collective
 * calls: number, what, state, times -- to the directory WEFT_TRACE names
 * (weft-trace.<comm>.r<rank>.jsonl; tools/weft-trace merges the ranks'
 * files), or to stderr when WEFT_TRACE is unset. Local, callable from any
 * thread while others are inside calls on comm (a watchdog that suspects
 * a hang). WEFT_ERR_UNSUPPORTED naming the path when it cannot be written. */
WEFT_API int  weft_comm_dump(weft_comm_t *comm);
/* Ranks that meet without MPI (launched by torchrun, a scheduler, a test
 * harness), NCCL style. One process calls weft_get_unique_id, which opens a
 * listener (on the interface WEFT_TCP_IF names, else the first non-loopback
 * one that is up, else loopback) and starts a thread that serves the
 * meeting; the 128 opaque bytes (magic, job token, the listener's address
 * and port) reach every rank by any means (a key-value store, a file, an
 * MPI_Bcast), and all nranks processes call weft_comm_init with their own
 * rank. The id serves one weft_comm_init (of nranks ranks): its listener
 * closes once all nranks joined (or when WEFT_TIMEOUT passes without a rank
 * joining), and the process that made it must live until that comm is made.
 * Every wait is bounded by WEFT_TIMEOUT; a rank that never joins is named
 * ("rank 3 of 4 never joined") on every rank that waited for it. A comm made
 * this way behaves exactly like one made by weft_comm_create; it makes no
 * MPI call, ever (MPI need not be initialised). */
#define WEFT_UNIQUE_ID_BYTES 128
typedef struct { char internal[WEFT_UNIQUE_ID_BYTES]; } weft_unique_id_t;
WEFT_API int  weft_get_unique_id(weft_unique_id_t *id);
/* Collective over the nranks processes given the same id; 0 <= rank < nranks,
 * each rank exactly once. */
WEFT_API int  weft_comm_init(const weft_unique_id_t *id, int nranks, int rank, weft_comm_t **comm);
/* Collective over every rank of comm, over weft's own pipes (no MPI): ranks
 * passing the same color form a new comm, ordered by key, then by rank in
 * comm. color WEFT_SPLIT_NONE (any negative color): this rank joins none and
 * *newcomm is set to NULL. The new comm is independent of comm (either may
 * be destroyed first) and is destroyed with weft_comm_destroy. */
#define WEFT_SPLIT_NONE (-1)
WEFT_API int  weft_comm_split(weft_comm_t *comm, int color, int key, weft_comm_t **newcomm);

/* A comm's own configuration (the way ncclConfig_t works): any WEFT_*
 * setting a comm reads (docs/configuration.md), by name and value as the
 * environment would hold it, for that comm only; the environment stays
 * the default for every setting not given. Values are parsed exactly as
 * the environment's are. Start from WEFT_CONFIG_INITIALIZER, which records
 * the size and version the caller was built with:
 *
 *     weft_setting_t s[] = {{"WEFT_TIMEOUT", "30"}, {"WEFT_TRANSPORTS", "self,shm,tcp"}};
 *     weft_config_t cfg = WEFT_CONFIG_INITIALIZER;
 *     cfg.settings = s;
 *     cfg.nsettings = 2;
 *     weft_comm_create_config(MPI_COMM_WORLD, &cfg, &comm);
 *
 * A name that is not a comm's setting, a name given twice, or a NULL name
 * or value is refused (WEFT_ERR_INVALID_ARG, naming the entry). The arrays
 * are copied: they may be freed once the call returns. A comm made by
 * weft_comm_split takes its parent's configuration (weft_comm_split_config:
 * with settings of its own on top). config NULL = the
 * environment alone (the calls without _config). WEFT_DEBUG sets the
 * process's log level, as the environment's does. */
typedef struct { const char *name; const char *value; } weft_setting_t;
typedef struct weft_comm_config {
    size_t                size;       /* sizeof(weft_config_t) the caller was built with */
    unsigned int          magic;      /* WEFT_CONFIG_MAGIC */
    unsigned int          version;    /* WEFT_CONFIG_VERSION */
    const weft_setting_t *settings;   /* nsettings entries (NULL when nsettings is 0) */
    size_t                nsettings;
} weft_config_t;
#define WEFT_CONFIG_MAGIC   0x77656674u   /* "weft" */
#define WEFT_CONFIG_VERSION 1
#define WEFT_CONFIG_INITIALIZER { sizeof(weft_config_t), WEFT_CONFIG_MAGIC, WEFT_CONFIG_VERSION, 0, 0 }
WEFT_API int  weft_comm_create_config(MPI_Comm mpi_comm, const weft_config_t *config, weft_comm_t **comm);
WEFT_API int  weft_comm_init_config(const weft_unique_id_t *id, int nranks, int rank, const weft_config_t *config,
                                    weft_comm_t **comm);
/* The new comm takes comm's configuration with config's settings on top
 * (config's win for a name in both); otherwise as weft_comm_split. */
WEFT_API int  weft_comm_split_config(weft_comm_t *comm, int color, int key, const weft_config_t *config,
                                     weft_comm_t **newcomm);
/* The root of the meeting takes its WEFT_TIMEOUT and WEFT_TCP_IF from config. */
WEFT_API int  weft_get_unique_id_config(weft_unique_id_t *id, const weft_config_t *config);
/* A function of the application that weft runs while a thread of the
 * application waits inside a weft call on comm (weft_wait, weft_waitall,
 * the blocking collectives, a destroy's barrier over weft's pipes) and the
 * wait is idle: about once per millisecond of idle waiting (at most once
 * per millisecond), in the waiting thread, with no lock of weft held.
 * Weft's own threads (the progress thread of the stream-ordered calls)
 * never run it. It must return quickly and must not call weft on comm.
 * Use: a layer that shares the process with another communication library
 * keeps that library's messages moving while weft waits (the PMPI layer,
 * adapters/mpi/, calls MPI_Iprobe: Open MPI has no progress of its own).
 * Local; may be called at any time; hook NULL removes it. */
typedef void (*weft_wait_hook_t)(void *arg);
WEFT_API int  weft_comm_set_wait_hook(weft_comm_t *comm, weft_wait_hook_t hook, void *arg);
/* Rank and size; -1 when comm is NULL. */
WEFT_API int  weft_comm_rank(const weft_comm_t *comm);
WEFT_API int  weft_comm_size(const weft_comm_t *comm);
/* The most data per rank (bytes) with which a blocking collective on comm
 * may be served in the node's shared segment instead of by messages
 * (docs/api.md, "Node-local collectives"): WEFT_NODE_COLL_KB when every
 * rank of comm is on one node and shm is among WEFT_TRANSPORTS; 0 when no
 * call is (ranks on several nodes, WEFT_NODE_COLL_KB=0, no shm, one rank,
 * or the segment could not be made). Below it, whether a call goes there
 * still depends on the collective; from 3 ranks an allreduce, a reduce,
 * a reduce_scatter, an allgather, a gather or an alltoall goes there up
 * to WEFT_NODE_COLL_LARGE_KB, above it; an alltoallv whenever every
 * rank's blocks fit its slot (docs/api.md). The same on every rank:
 * a layer above weft (the PMPI drop-in) may route calls on it. Local. */
WEFT_API int  weft_comm_node_coll_bytes(const weft_comm_t *comm, size_t *bytes);

/* Non-blocking send/receive. Messages from one rank to another with the same
 * tag are received in the order they were sent; tags are independent lanes.
 * tag >= 0. buf may be NULL only when bytes == 0. */
WEFT_API int  weft_isend(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, weft_request_t **req);
WEFT_API int  weft_irecv(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, weft_request_t **req);
/* Requests are handles with a generation: once a request completed in
 * weft_test/weft_wait/weft_waitall it is freed, and any later use of that
 * handle (a second wait, a test, a copy of it, even after its slot was
 * reused by a newer request) returns WEFT_ERR_INVALID_ARG and touches no
 * other request.
 * *done = 1 once the request completed; the request is then freed and the
 * return value is its completion code (also in status->error). status may be NULL. */
WEFT_API int  weft_test(weft_request_t *req, int *done, weft_status_t *status);
/* Waits for completion, frees req. WEFT_TIMEOUT bounds how long the request
 * goes without progress (its pipe moving data), whatever other traffic does;
 * the error then names the peer that stopped or died. */
WEFT_API int  weft_wait(weft_request_t *req, weft_status_t *status);
/* Waits for all n requests and frees them; statuses may be NULL. Returns the
 * first error met (WEFT_SUCCESS if none); each status tells its own.
 * Requests may belong to several comms (each is progressed). NULL entries
 * count as done. Every handle is checked first: a completed or unknown
 * request, or the same request twice, returns WEFT_ERR_INVALID_ARG before
 * anything is waited for or freed. */
WEFT_API int  weft_waitall(size_t n, weft_request_t **reqs, weft_status_t *statuses);
WEFT_API int  weft_send(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag);
WEFT_API int  weft_recv(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, weft_status_t *status);

/* Element types and reduction operations of the reducing collectives.
 * Values are part of the ABI (programs outside weft are built against
 * them). Integer arithmetic wraps on overflow (two's complement);
 * FLOAT16 (IEEE binary16) and BFLOAT16 are reduced in float32 and rounded
 * back to nearest-even after every step; AVG is a SUM divided once, at the
 * end, by the number of ranks (integer types: truncated toward zero). */
typedef enum {
    WEFT_INT8 = 0, WEFT_UINT8, WEFT_INT32, WEFT_UINT32, WEFT_INT64, WEFT_UINT64,
    WEFT_FLOAT16, WEFT_BFLOAT16, WEFT_FLOAT32, WEFT_FLOAT64
} weft_dtype_t;
#define WEFT_DTYPE_COUNT 10
typedef enum { WEFT_SUM = 0, WEFT_PROD, WEFT_MIN, WEFT_MAX, WEFT_AVG } weft_op_t;
#define WEFT_OP_COUNT 5

/* Collectives: called in the same order on every rank, with matching
 * arguments (kind, size, type, operation, root); ranks that disagree fail
 * with WEFT_ERR_MISMATCH where their messages meet. Buffers may be host or
 * CUDA device memory. Reductions are deterministic: for a given algorithm
 * and rank count, the same inputs give bit-identical results on every rank
 * and in every run. */
WEFT_API int  weft_allgather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank);
WEFT_API int  weft_barrier(weft_comm_t *c);
WEFT_API int  weft_bcast(weft_comm_t *c, void *buf, size_t bytes, int root);
/* recvbuf[i] = op over ranks of sendbuf[i], count elements, on every rank.
 * In place when sendbuf == recvbuf; otherwise they must not overlap. */
WEFT_API int  weft_allreduce(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                             weft_op_t op);
/* sendbuf holds size * recvcount elements; block r of the reduction (elements
 * [r*recvcount, (r+1)*recvcount)) lands in recvbuf on rank r. In place when
 * recvbuf == sendbuf + rank * recvcount elements. */
WEFT_API int  weft_reduce_scatter(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                  weft_dtype_t dtype, weft_op_t op);
/* The reduction of count elements lands in recvbuf on root only (recvbuf is
 * not used, and may be NULL, elsewhere). In place at root when sendbuf == recvbuf. */
WEFT_API int  weft_reduce(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                          weft_op_t op, int root);
/* Block j of sendbuf (bytes_per_rank bytes at sendbuf + j*bytes_per_rank)
 * goes to rank j, landing at recvbuf + rank*bytes_per_rank there. In place
 * when sendbuf == recvbuf; otherwise they must not overlap. */
WEFT_API int  weft_alltoall(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank);
/* Rank r's bytes_per_rank bytes from sendbuf land at recvbuf +
 * r*bytes_per_rank on root. recvbuf (size * bytes_per_rank bytes) is used
 * at the root only (may be NULL elsewhere). In place at the root when
 * sendbuf == recvbuf + root*bytes_per_rank; otherwise they must not overlap. */
WEFT_API int  weft_gather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root);
/* Block r of root's sendbuf (bytes_per_rank bytes at sendbuf +
 * r*bytes_per_rank) lands in recvbuf on rank r. sendbuf is used at the root
 * only (may be NULL elsewhere). In place at the root when recvbuf ==
 * sendbuf + root*bytes_per_rank; otherwise they must not overlap. */
WEFT_API int  weft_scatter(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root);
/* MPI_Alltoallv in bytes: send_bytes[j] bytes at sendbuf + send_displs[j]
 * go to rank j, where they land at recvbuf + recv_displs[i] (i: this rank),
 * and recv_bytes[i] there must equal send_bytes[j] here (ranks that
 * disagree fail: WEFT_ERR_MISMATCH, or WEFT_ERR_TRUNCATE when more
 * arrives). The four arrays have size entries each, are read during the
 * call only (reusable once it returned, also for the non-blocking and
 * stream-ordered forms); sizes may be 0 (a buffer whose sizes are all 0
 * may be NULL). No in-place form: the send blocks' span must not overlap
 * the receive blocks'. */
WEFT_API int  weft_alltoallv(weft_comm_t *c, const void *sendbuf, const size_t *send_bytes,
                             const size_t *send_displs, void *recvbuf, const size_t *recv_bytes,
                             const size_t *recv_displs);

/* Non-blocking collectives: the same arguments, and *req to complete with
 * weft_test / weft_wait / weft_waitall like a p2p request (status->bytes,
 * peer and tag are 0, -1, -1). Several may be outstanding on one comm,
 * mixed with blocking collectives and p2p, started in the same order on
 * every rank; they progress whenever the rank is inside a weft call. The
 * buffers must stay untouched until the request completed. */
WEFT_API int  weft_iallgather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                              weft_request_t **req);
WEFT_API int  weft_ibarrier(weft_comm_t *c, weft_request_t **req);
WEFT_API int  weft_ibcast(weft_comm_t *c, void *buf, size_t bytes, int root, weft_request_t **req);
WEFT_API int  weft_iallreduce(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                              weft_op_t op, weft_request_t **req);
WEFT_API int  weft_ireduce_scatter(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                   weft_dtype_t dtype, weft_op_t op, weft_request_t **req);
WEFT_API int  weft_ireduce(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                           weft_op_t op, int root, weft_request_t **req);
WEFT_API int  weft_ialltoall(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                             weft_request_t **req);
WEFT_API int  weft_igather(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root,
                           weft_request_t **req);
WEFT_API int  weft_iscatter(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, int root,
                            weft_request_t **req);
WEFT_API int  weft_ialltoallv(weft_comm_t *c, const void *sendbuf, const size_t *send_bytes,
                              const size_t *send_displs, void *recvbuf, const size_t *recv_bytes,
                              const size_t *recv_displs, weft_request_t **req);

/* Stream-ordered calls (NCCL style); struct CUstream_st * is cudaStream_t.
 * The operation starts after the work queued on `stream` before the call,
 * and work queued on `stream` after the call waits until it completed (the
 * received data is in place). The host never blocks: the calls queue the
 * operation and return; a progress thread of the comm runs it. Call them
 * with the stream's device current. Buffers: device memory (or host memory)
 * that must stay valid until the stream reaches the point after the call.
 * Arguments as for weft_isend/weft_irecv and the collectives; stream may be NULL
 * (the default stream). Without CUDA in the comm: WEFT_ERR_UNSUPPORTED.
 * Operations of one comm are started in the order they were called (so
 * lanes match as for weft_isend); the collectives must be called in the
 * same order on every rank.
 * An operation that fails after the call returned (truncation, transport,
 * timeout) records its error in weft_comm_last_error() (rank, peer, why),
 * still releases the stream (its data is then undefined), and the next
 * stream-ordered call on the comm returns that error without starting
 * anything. weft_comm_destroy waits (bounded by WEFT_TIMEOUT) for the
 * operations still queued.
 * Groups: calls between weft_group_start() and weft_group_end() (per host
 * thread, may nest) are only recorded; the outermost weft_group_end() queues
 * them together, after the work queued on their streams by then, and work
 * queued afterwards waits for all of them, so e.g. a ring of send/recv pairs
 * on one stream cannot deadlock. weft_group_end() without a matching
 * weft_group_start(): WEFT_ERR_INVALID_ARG. */
struct CUstream_st;   /* cudaStream_t; no CUDA header needed */
WEFT_API int  weft_send_on_stream(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream);
WEFT_API int  weft_recv_on_stream(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, struct CUstream_st *stream);
WEFT_API int  weft_allgather_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank, struct CUstream_st *stream);
WEFT_API int  weft_allreduce_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                       weft_dtype_t dtype, weft_op_t op, struct CUstream_st *stream);
WEFT_API int  weft_reduce_scatter_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                            weft_dtype_t dtype, weft_op_t op, struct CUstream_st *stream);
WEFT_API int  weft_bcast_on_stream(weft_comm_t *c, void *buf, size_t bytes, int root, struct CUstream_st *stream);
WEFT_API int  weft_alltoall_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                                      struct CUstream_st *stream);
WEFT_API int  weft_reduce_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                    weft_dtype_t dtype, weft_op_t op, int root, struct CUstream_st *stream);
WEFT_API int  weft_gather_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                                    int root, struct CUstream_st *stream);
WEFT_API int  weft_scatter_on_stream(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank,
                                     int root, struct CUstream_st *stream);
WEFT_API int  weft_alltoallv_on_stream(weft_comm_t *c, const void *sendbuf, const size_t *send_bytes,
                                       const size_t *send_displs, void *recvbuf, const size_t *recv_bytes,
                                       const size_t *recv_displs, struct CUstream_st *stream);
/* The error of a stream-ordered operation of comm that failed after its
 * call returned and that no call reported yet, without taking it (the next
 * stream-ordered call still returns it); WEFT_ERR_ABORTED once
 * weft_comm_abort was called on comm; else WEFT_SUCCESS. Local, never
 * blocks, callable from any thread (a watchdog polling for failures, as
 * ncclCommGetAsyncError does); weft_comm_last_error() says why. */
WEFT_API int  weft_comm_async_error(weft_comm_t *c);
WEFT_API int  weft_group_start(void);
WEFT_API int  weft_group_end(void);

/* Message pipes (TensorPipe style). A pipe is an ordered stream of messages
 * between two ranks of a comm, independent of tags and of other pipes. Both
 * ranks open it with the same id (0 <= id < WEFT_PIPE_ID_MAX); opening is
 * local (a message written before the peer opened waits for it); one rank
 * may have many pipes open, to one peer or several, and to itself.
 *
 * A message is metadata bytes, payloads (host memory) and tensors (host or
 * CUDA device memory), each buffer with metadata of its own. The writer's
 * callback runs once every buffer of the message may be reused (it does not
 * say the reader took the message). The reader first asks for the next
 * message's descriptor (weft_pipe_read_descriptor: metadata and the size of
 * every buffer), then hands one buffer per payload and tensor, of any
 * memory kind, at least as large as the descriptor says (weft_pipe_read);
 * the read callback runs once all of them are filled. So the receiver never
 * guesses sizes: a truncation cannot happen.
 *
 * Callbacks of one pipe run in order (writes in write order, descriptors
 * and reads in message order), one at a time per comm, with no lock of
 * weft held, so a callback may write, read, open or close pipes of the comm
 * (it must not block waiting on the comm, nor destroy it). They run on the
 * comm's progress thread when the comm was made with WEFT_PROGRESS_THREAD=1,
 * else only inside weft_progress(comm) of an application thread. err is a
 * WEFT_* code and why says what failed, naming rank, peer, pipe and
 * operation ("" on success); why is valid during the callback only.
 *
 * weft_pipe_close: local; every operation of this side not yet called back
 * completes with WEFT_ERR_CLOSED (once weft no longer touches its buffers),
 * the peer is told, and its pending operations complete with
 * WEFT_ERR_CLOSED too (messages it wrote that nobody reads are discarded).
 * The handle is invalid once weft_pipe_close returns (the callbacks still
 * to run get it for identification only). The peer must close its side as
 * well to free it; calls there return WEFT_ERR_CLOSED meanwhile. The id can
 * be opened again once both sides' closing finished (WEFT_ERR_INVALID_ARG
 * until then). weft_comm_destroy closes the pipes still open first, lets
 * started transfers finish (until nothing moved for 2 s) and runs their
 * callbacks. A failed peer fails every pending operation of its pipes
 * with the error that names it. */
#define WEFT_PIPE_ID_MAX  (1 << 20)
#define WEFT_PIPE_HOST    (-1)   /* a buffer in host memory (device field) */
#define WEFT_PIPE_ANY     (-2)   /* no target device requested */
typedef struct weft_pipe weft_pipe_t;

typedef struct {
    const void *data;            /* host memory; may be NULL when bytes == 0 */
    size_t      bytes;
    const void *metadata;        /* opaque to weft, delivered in the descriptor */
    size_t      metadata_bytes;
} weft_pipe_payload_t;

typedef struct {
    const void         *data;    /* host or CUDA device memory (detected, as for weft_isend) */
    size_t              bytes;
    int                 device;  /* WEFT_PIPE_HOST or the CUDA device of data: told to the reader */
    struct CUstream_st *stream;  /* device data is ready once the work queued on stream before
                                    weft_pipe_write finished (weft waits for it); NULL: ready now */
    int                 target_device;   /* what the writer asks the reader to allocate on:
                                            WEFT_PIPE_ANY, WEFT_PIPE_HOST or a device; advice only */
    const void         *metadata;
    size_t              metadata_bytes;
} weft_pipe_tensor_t;

typedef struct {
    const void                *metadata;
    size_t                     metadata_bytes;
    size_t                     num_payloads;
    const weft_pipe_payload_t *payloads;
    size_t                     num_tensors;
    const weft_pipe_tensor_t  *tensors;
} weft_pipe_message_t;

/* What the reader learns before it allocates. Valid from the descriptor
 * callback until the read of that message was called back (or failed, or
 * the pipe closed). */
typedef struct { size_t bytes; const void *metadata; size_t metadata_bytes; } weft_pipe_payload_desc_t;
typedef struct {
    size_t      bytes;
    int         source_device;   /* the writer's device field */
    int         target_device;   /* the writer's request */
    const void *metadata;
    size_t      metadata_bytes;
} weft_pipe_tensor_desc_t;
typedef struct {
    const void                     *metadata;
    size_t                          metadata_bytes;
    size_t                          num_payloads;
    const weft_pipe_payload_desc_t *payloads;
    size_t                          num_tensors;
    const weft_pipe_tensor_desc_t  *tensors;
} weft_pipe_descriptor_t;

/* Where the reader wants each buffer: one entry per payload and per tensor
 * of the descriptor, in order; bytes is the room at data (>= the
 * descriptor's size; may be NULL when that size is 0). Host or device
 * memory, whatever the writer had. */
typedef struct { void *data; size_t bytes; } weft_pipe_buffer_t;
typedef struct {
    size_t                    num_payloads;
    const weft_pipe_buffer_t *payloads;
    size_t                    num_tensors;
    const weft_pipe_buffer_t *tensors;
} weft_pipe_allocation_t;

typedef void (*weft_pipe_cb_t)(weft_pipe_t *pipe, int err, const char *why, void *arg);
typedef void (*weft_pipe_descriptor_cb_t)(weft_pipe_t *pipe, int err, const char *why,
                                          const weft_pipe_descriptor_t *desc, void *arg);

WEFT_API int  weft_pipe_open(weft_comm_t *c, int peer, int id, weft_pipe_t **pipe);
/* Queues msg (copied: the arrays may go once this returns; the buffers
 * they point at stay untouched until cb). cb may be NULL. */
WEFT_API int  weft_pipe_write(weft_pipe_t *pipe, const weft_pipe_message_t *msg, weft_pipe_cb_t cb, void *arg);
/* cb (not NULL) gets the descriptor of the next message whose descriptor
 * was not yet asked for; several may be queued. */
WEFT_API int  weft_pipe_read_descriptor(weft_pipe_t *pipe, weft_pipe_descriptor_cb_t cb, void *arg);
/* Reads the oldest message whose descriptor was delivered and that was not
 * yet read, into alloc (copied). cb may be NULL. An allocation that does
 * not fit that descriptor (counts differ, a buffer too small, data NULL
 * with bytes > 0) returns WEFT_ERR_INVALID_ARG saying which buffer, and the
 * message is discarded (its data is dropped, the writer is not told; the
 * pipe goes on with the next message). No delivered message to read:
 * WEFT_ERR_INVALID_ARG, nothing changes. When a call returns an error its
 * callback is never run. */
WEFT_API int  weft_pipe_read(weft_pipe_t *pipe, const weft_pipe_allocation_t *alloc, weft_pipe_cb_t cb, void *arg);
WEFT_API int  weft_pipe_close(weft_pipe_t *pipe);
/* The peer rank and id of a pipe (-1 when pipe is NULL). */
WEFT_API int  weft_pipe_peer(const weft_pipe_t *pipe);
WEFT_API int  weft_pipe_id(const weft_pipe_t *pipe);
/* Moves the message pipes of comm along and, when the comm has no progress
 * thread, runs the callbacks that are due, in this thread. Never blocks
 * (a callback running in another thread is not waited for). */
WEFT_API int  weft_progress(weft_comm_t *c);

/* Memory registration (RDMA). weft pins the buffers it sends from and
 * receives into on its own, through a cache (WEFT_IB_REG_CACHE_MB), so these
 * calls are optional: weft_mem_register pins [buf, buf+bytes) now, so the
 * first transfer does not pay for it, and keeps it pinned (never evicted)
 * until weft_mem_deregister. Call weft_mem_deregister on a range before
 * freeing or unmapping it -- for ranges registered here and for any buffer
 * weft may have cached -- so no stale registration outlives the memory.
 * Ranges still in flight are released when their transfers complete.
 * Without an RDMA transport in the comm both calls check their arguments
 * and succeed doing nothing. bytes > 0; buf not NULL. */
WEFT_API int  weft_mem_register(weft_comm_t *c, const void *buf, size_t bytes);
WEFT_API int  weft_mem_deregister(weft_comm_t *c, const void *buf, size_t bytes);

WEFT_API const char *weft_strerror(int err);
/* What failed last on this comm, which rank and peer, and why ("" if nothing). */
WEFT_API const char *weft_comm_last_error(const weft_comm_t *c);
/* What failed last in a call of this thread that had no comm to record it
 * on: weft_comm_create / weft_comm_init / weft_comm_split that failed (their
 * comm is gone), weft_comm_destroy that returned an error (the comm is freed
 * all the same), weft_get_unique_id, a call given a NULL comm. "" if none. */
WEFT_API const char *weft_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
