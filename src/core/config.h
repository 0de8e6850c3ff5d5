/*
 * Run-time configuration: every WEFT_* environment variable is read here, in
 * one place, once per weft_comm_create. docs/configuration.md lists them.
 */
#ifndef WEFT_CONFIG_H
#define WEFT_CONFIG_H

#include <stddef.h>
#include <stdint.h>


enum weft_log_level { WEFT_LOG_NONE = 0, WEFT_LOG_WARN, WEFT_LOG_INFO, WEFT_LOG_TRACE };

struct weft_config {
    double   timeout_s;        /* WEFT_TIMEOUT: seconds without progress before a wait fails; 0 = never */
    int      log_level;        /* WEFT_DEBUG: none|warn|info|trace; warn by default, so a failed create
                                  always says why on stderr */
    char     transports[128];  /* WEFT_TRANSPORTS: carriers allowed, "shm,tcp"; "" = every one (names are
                                  resolved by the transport registry at create) */
    int      virtual_nodes;    /* WEFT_VIRTUAL_NODES: 0 = off, k = split ranks into k fake nodes */
    int      shm_cma;          /* WEFT_SHM_CMA: 1 = single-copy CMA allowed, 0 = bounce buffers only */
    size_t   shm_eager_limit;  /* WEFT_SHM_EAGER: largest message sent eagerly through the ring */
    size_t   shm_coll_eager;   /* WEFT_SHM_COLL_EAGER: the same for collectives' internal lanes */
    size_t   shm_ring_bytes;   /* WEFT_SHM_RING_KB: the most a peer-to-peer ring grows to */
    size_t   shm_budget;       /* WEFT_SHM_BUDGET_MB: bytes of rings this rank's lanes may grow to; 0 = they never grow */
    size_t   shm_chunk;        /* WEFT_SHM_CHUNK_KB: bounce-buffer chunk of the pipelined copy */
    size_t   shm_cma_min;      /* WEFT_SHM_CMA_MIN_KB: receiver uses CMA from this size up */
    int      shm_stream;       /* WEFT_SHM_STREAM: 1 = a receiver lets a streaming sender push
                                  messages below 256 KiB through the ring instead of pulling by CMA */
    size_t   node_coll_bytes;  /* WEFT_NODE_COLL_KB: each rank's slot in a comm's node-local collective
                                  segment (collectives/node_coll.c), the largest contribution those
                                  collectives take; 0 = off (every collective a schedule of messages) */
    size_t   node_coll_large;  /* WEFT_NODE_COLL_LARGE_KB: on a comm of 3 ranks or more on one node, the
                                  most a call of any kind but bcast puts in a rank's slot on the
                                  node-local path (a second segment of such slots, within
                                  WEFT_SHM_BUDGET_MB); at or below node_coll_bytes: nothing more */
    size_t   node_coll_stream; /* WEFT_NODE_COLL_STREAM_KB: a copy of at least this many bytes into a
                                  node-local segment uses streaming stores (src/core/shmput.h); 0 = never */
    int      tcp_streams;      /* WEFT_TCP_STREAMS: data sockets per peer (besides the control one) */
    char     tcp_if[64];       /* WEFT_TCP_IF: interface name (or IPv4 address) to listen/connect on */
    char     trace_dir[256];   /* WEFT_TRACE: directory of the operation journals (collectives/journal.h); "" = none */
    size_t   tcp_eager_limit;  /* WEFT_TCP_EAGER: largest message sent eagerly on the control socket */
    size_t   tcp_chunk;        /* WEFT_TCP_CHUNK_KB: striping unit across data sockets */
    size_t   self_eager_limit; /* WEFT_SELF_EAGER: sends to self up to this size complete at once */
    size_t   eager_window;     /* WEFT_EAGER_WINDOW: flow control (p2p/): most bytes of eager and
                                  rendezvous-announcement messages a sender may have outstanding at one
                                  receiver, not yet matched with a receive there (per peer pair); a
                                  sender beyond it waits, its request pending, until the receiver
                                  consumes messages. Bounds what a slow receiver must buffer per sender.
                                  Default 4 MiB, at least 64 KiB. Equal on every rank (checked at create). */
    int      spin_us;          /* WEFT_SPIN_US: busy-poll time before a waiter yields/sleeps */
    int      progress_thread;  /* WEFT_PROGRESS_THREAD: 1 = the comm's message pipes get a progress thread
                                  that runs their callbacks; 0 = callbacks run in weft_progress */
    char     threads[16];      /* WEFT_THREADS: multiple|serialized. serialized: the program calls into
                                  the comm from one thread at a time (its own ordering between threads),
                                  so the p2p layer takes no lock (p2p/context.h, weft_p2p_lock) */
    size_t   pipe_inline;      /* WEFT_PIPE_INLINE: host bytes of a message that travel inside its
                                  descriptor (p2p/msgpipe/msgpipe.c), capped by the pair's eager limit */

    /* InfiniBand verbs (p2p/transport/ib/ib.c) */
    char     ibverbs_lib[256]; /* WEFT_IBVERBS_LIB: library to dlopen ("libibverbs.so.1") */
    char     ib_hca[256];      /* WEFT_IB_HCA: "dev[:port],..." allowed ports; "" = every ACTIVE port */
    int      ib_gid_index;     /* WEFT_IB_GID_INDEX: RoCE GID index; -1 = first RoCEv2 IPv4-mapped */
    int      ib_qps_per_peer;  /* WEFT_IB_QPS_PER_PEER: RC QPs per peer; large messages striped over them */
    int      ib_timeout;       /* WEFT_IB_TIMEOUT: QP ack timeout exponent (4.096 us * 2^n) */
    int      ib_retry_cnt;     /* WEFT_IB_RETRY_CNT: transport retries before IBV_WC_RETRY_EXC_ERR */
    size_t   ib_chunk;         /* WEFT_IB_CHUNK: most bytes per RDMA work request (also capped by port, 1 GiB) */
    size_t   ib_eager_limit;   /* WEFT_IB_EAGER: largest message sent by SEND into pre-posted buffers */
    int      ib_recv_depth;    /* WEFT_IB_RECV_DEPTH: pre-posted receive buffers (= send credits) per QP */
    int      ib_sq_depth;      /* WEFT_IB_SQ_DEPTH: send-queue depth per QP (capped by the device) */
    size_t   ib_reg_cache;     /* WEFT_IB_REG_CACHE_MB: cap on bytes pinned by the registration cache */
    int      ib_gdr;           /* WEFT_IB_GDR: -1 auto, 0 off (device data staged), 1 required (create fails without) */
    char     topo_xml[256];    /* WEFT_TOPO_XML: hwloc XML to use instead of this machine's topology */

    /* CUDA (src/core/cudawrap.c) */
    char     cuda_lib[256];    /* WEFT_CUDA_LIB: CUDA runtime to dlopen ("libcudart.so") */
    size_t   cuda_stage_chunk; /* WEFT_CUDA_STAGE_CHUNK: bytes per chunk of a staged device transfer (p2p/stage.c) */
    int      cuda_stage_slots; /* WEFT_CUDA_STAGE_SLOTS: pinned chunks in flight per side (sends, receives) */
    int      cuda_ipc_cache;   /* WEFT_CUDA_IPC_CACHE: CUDA IPC mappings kept open per comm (p2p/transport/cuda_ipc/cuda_ipc.c) */
    int      cuda_ipc_open_syncs; /* WEFT_CUDA_IPC_OPEN_SYNCS: treat cudaIpcOpenMemHandle as waiting for the device */

    /* Collectives (collectives/) */
    char     allgather_algo[16]; /* WEFT_ALLGATHER_ALGO: auto|ring|rd|bruck|direct|hier ("auto": the selector) */
    size_t   allgather_chunk;  /* WEFT_ALLGATHER_CHUNK_KB: bytes per pipelined message of the ring allgather */
    char     allreduce_algo[16];      /* WEFT_ALLREDUCE_ALGO: auto|ring|rd|rabenseifner|hier */
    char     reduce_scatter_algo[16]; /* WEFT_REDUCE_SCATTER_ALGO: auto|ring|halving */
    char     reduce_algo[16];         /* WEFT_REDUCE_ALGO: auto|binomial|ring */
    char     alltoall_algo[16];       /* WEFT_ALLTOALL_ALGO: auto|pairwise|bruck */
    size_t   reduce_chunk;     /* WEFT_REDUCE_CHUNK_KB: bytes per pipelined message of the reducing rings */
};

/* The names WEFT_ALLGATHER_ALGO accepts, in the collectives' order (their
 * enum maps the same list); NULL-terminated. */
extern const char *const weft_allgather_algo_names[];
extern const char *const weft_allreduce_algo_names[];
extern const char *const weft_reduce_scatter_algo_names[];
extern const char *const weft_reduce_algo_names[];
extern const char *const weft_alltoall_algo_names[];
extern const char *const weft_threads_names[];

/* Looks up a variable; returns NULL when unset. The process environment is the default. */
typedef const char *(*weft_env_lookup_fn)(const char *name, void *ctx);

/* Fills cfg with defaults, then applies the environment seen through lookup
 * (NULL = the process environment). On a malformed value returns WEFT_ERR_INVALID_ARG and
 * writes "WEFT_X=value: why" into err; cfg is then unspecified. */
int weft_config_load(struct weft_config *cfg, weft_env_lookup_fn lookup, void *ctx,
                     char *err, size_t errlen);

/* A comm's own settings (weft_config_t's, from weft_comm_create_config and
 * the other *_config calls), copied: looked up before the environment, so
 * one comm's configuration never touches another's or the process's. */
struct weft_settings {
    size_t  n;
    char  **names;
    char  **values;
};

/* Copies and checks n (name, value) pairs: each name one weft_config_load
 * reads, none twice, no NULL. NULL (n 0) -> *out NULL. On a bad entry
 * returns WEFT_ERR_INVALID_ARG with "settings[i]: why" in err. *out set
 * only on success. */
int weft_settings_make(const char *const *names, const char *const *values, size_t n,
                       struct weft_settings **out, char *err, size_t errlen);
/* A copy (NULL for NULL); WEFT_ERR_NO_MEMORY when it cannot be made. */
int weft_settings_dup(const struct weft_settings *s, struct weft_settings **out);
void weft_settings_free(struct weft_settings *s);
/* base's settings with over's on top (over wins for a name in both); NULL
 * when both are. WEFT_ERR_NO_MEMORY when it cannot be made. */
int weft_settings_merge(const struct weft_settings *base, const struct weft_settings *over,
                        struct weft_settings **out);
/* A weft_env_lookup_fn: ctx is a struct weft_settings (or NULL); its value
 * for name, else the environment's. */
const char *weft_settings_lookup(const char *name, void *ctx);
/* s's own value for name; NULL when s (or NULL s) has none. */
const char *weft_settings_lookup_own(const struct weft_settings *s, const char *name);
/* 1 when weft_config_load reads name (a setting a comm takes). */
int weft_config_reads(const char *name);

/* Parses a size with an optional k/m/g suffix (powers of 1024, an optional
 * 'b' after it): digits first, nothing else around. 0 on success (out
 * written only then). */
int weft_parse_size(const char *s, size_t *out);

/* Checks the form of a WEFT_TRANSPORTS value: comma-separated names. 0 if well formed. */
int weft_parse_transports(const char *s);

/* WEFT_DEBUG read straight from the environment, for log lines before any
 * comm exists: warn when unset, and warn for a value weft_config_load
 * rejects, so that rejection is printed. */
int weft_config_log_level_env(void);
/* The same for a comm whose configuration was refused: WEFT_DEBUG from its
 * settings, else the environment's (weft_settings_lookup). */
int weft_config_log_level(const struct weft_settings *settings);

/* Settings that must be equal on every rank of a comm because they shape
 * the wire or the protocol (docs/configuration.md, "Settings that must
 * agree"); WEFT_TRANSPORTS, which needs the transport registry to compare,
 * is checked by the comm itself. weft_comm_create gathers every rank's
 * values and fails on every rank, naming the setting, when they differ. */
#define WEFT_CONFIG_AGREED_COUNT 19
/* values[0 .. WEFT_CONFIG_AGREED_COUNT) = this config's effective values. */
void weft_config_agreed_values(const struct weft_config *cfg, int64_t *values);
/* The variable of value i ("WEFT_TCP_STREAMS"). */
const char *weft_config_agreed_name(int i);
/* Value i as a user would write it ("4", "64k", "ring"). */
void weft_config_agreed_format(int i, int64_t value, char *buf, size_t len);

/* What weft_info shows of a configuration (tools/weft_info):
 * every variable weft_config_load reads, in its order (up to max names
 * written; returns how many there are); */
int weft_config_names(const char **names, int max);
/* name's value in cfg as a user would write it ("4", "64k", "auto"); -1
 * (buf "") for a name the loader does not read; */
int weft_config_format(const struct weft_config *cfg, const char *name, char *buf, size_t len);
/* where the value comes from: "comm setting" (settings, weft_config_t),
 * "environment", or "default"; */
const char *weft_config_origin(const char *name, const struct weft_settings *settings);
/* for the settings every rank must agree on, an index >= 0 (the
 * WEFT_CONFIG_AGREED_COUNT values, then WEFT_TRANSPORTS, which the comm
 * checks); -1 for the others. */
int weft_config_agreed_index(const char *name);

#endif
