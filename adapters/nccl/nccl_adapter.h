/*
 * The NCCL face of weft (libnccl.so.2 built on weft): what the files of
 * adapters/nccl/ share. Compiled against NCCL's own nccl.h, so every type,
 * enum and signature is NCCL's; it uses weft only through weft.h.
 *
 *   comm.c     communicators: unique id, init (blocking, non-blocking,
 *              deferred in a group, all devices of a process), split,
 *              finalize/destroy/abort, queries, async errors, registration
 *   colls.c    the stream-ordered collectives and send/recv
 *   premul.c   ncclRedOpCreatePreMulSum operators and their pre-multiply
 *   group.c    ncclGroupStart/End: weft's groups plus deferred inits
 *   errors.c   result codes, the thread's last error, calls weft refuses
 *   env.c      NCCL_* variables mapped onto WEFT_*, NCCL_DEBUG log lines
 *   cuda.c     the CUDA runtime calls the adapter makes itself (dlopen'd
 *              like weft's, so both use the one runtime of the process)
 */
#ifndef WEFT_NCCL_ADAPTER_H
#define WEFT_NCCL_ADAPTER_H

#include <nccl.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>

#include "weft.h"

/* Defines pnccl<name> and exports nccl<name> as a weak alias of it, as
 * NCCL does, so a profiler can interpose nccl* and still call pnccl*. */
#define NCCL_API(ret, name, ...)                                                             \
    __attribute__((visibility("default"))) ret p##name(__VA_ARGS__);                         \
    __attribute__((weak, alias("p" #name), visibility("default"))) ret name(__VA_ARGS__);    \
    __attribute__((visibility("default"))) ret p##name(__VA_ARGS__)

/* Tags of weft's lanes this library uses (the weft comm is its own, so no
 * application shares them). ncclSend/ncclRecv match in call order per
 * peer, which is weft's order on one tag. */
enum { NCCLW_TAG_P2P = 0, NCCLW_TAG_GATHER = 1, NCCLW_TAG_SCATTER = 2 };

#define NCCLW_COMM_MAGIC 0x7765667463636e6cULL   /* "weftccnl" */

enum nccl_comm_state { COMM_INITING = 0, COMM_READY, COMM_FAILED, COMM_FINALIZED };

/* A PreMulSum operator (premul.c). Handle value: ncclNumOps + index. */
struct nccl_premul_op {
    int                   in_use;
    ncclDataType_t        dtype;
    ncclScalarResidence_t residence;
    unsigned char         scalar[8];    /* ncclScalarHostImmediate: the value */
    const void           *dev_scalar;   /* ncclScalarDevice: where it is read at each call */
};

struct nccl_reg;        /* comm.c: a registration handle */
struct nccl_clique;     /* comm.c: the ranks of one comm living in this process */
struct nccl_premul_tmp; /* premul.c: buffers of a pre-multiply in flight */

/* The most WEFT_* settings NCCL_* variables map to (env.c). */
#define NCCLW_MAX_SETTINGS 16

struct ncclComm {
    uint64_t        magic;           /* NCCLW_COMM_MAGIC while alive */
    const char     *closing;         /* atomic: the destroy or abort that claimed the comm, NULL: none */
    pthread_mutex_t mu;              /* ops, regs, tmps */
    weft_comm_t    *w;
    int             rank, nranks, device;
    int             blocking;
    int             state;           /* enum nccl_comm_state; atomic */
    ncclResult_t    init_result;
    char            init_error[768];
    char            name[64];        /* config commName, for log lines */
    /* the weft comm's settings: NCCL_* (env.c), then ncclConfig_t's */
    weft_setting_t  settings[NCCLW_MAX_SETTINGS + 1];
    size_t          nsettings;
    char            transports[64];  /* config netName=Socket: WEFT_TRANSPORTS without ib */
    /* a pending initialisation (deferred to a group end, or non-blocking) */
    int             init_kind;       /* 0 init by id, 1 split, 2 shrink (split_parent, shrink_exclude) */
    int            *shrink_exclude;  /* ncclCommShrink's list, copied (malloc; freed with the shell) */
    int             nshrink_exclude;
    ncclUniqueId    init_id;
    struct ncclComm *split_parent;
    int             split_color, split_key;
    int             split_seq;       /* which split of the parent this is */
    int             nsplits;         /* splits made from this comm so far */
    struct nccl_clique *clique;
    int             free_after_init; /* a deferred NOCOLOR split: the caller got NULL */
    int             init_thread_live;
    int             init_done;       /* atomic: the init thread finished */
    pthread_t       init_thread;
    struct nccl_premul_op  *ops;
    int                     nops;
    struct nccl_reg        *regs;
    struct nccl_premul_tmp *tmps;
};

/* ---- errors.c ---- */
/* Records "<fn>: rank R of N: <message>" (or "<fn>: <message>" with no
 * comm) as this thread's last error, logs it at NCCL_DEBUG=WARN, returns rc. */
ncclResult_t nccl_fail(const struct ncclComm *c, ncclResult_t rc, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A weft call of fn failed with err: the NCCL code, and this thread's last
 * error "<fn>: <weft's last error of the comm (or thread)>". */
ncclResult_t nccl_from_weft(const struct ncclComm *c, int err, const char *fn);
ncclResult_t nccl_code_of_weft(int err);
/* The call fn is not implemented: ncclInvalidUsage with the documented text. */
ncclResult_t nccl_refuse(const char *fn, const char *what);

/* ---- env.c ---- */
enum { NCCLW_LOG_NONE = 0, NCCLW_LOG_VERSION, NCCLW_LOG_WARN, NCCLW_LOG_INFO, NCCLW_LOG_TRACE };
/* Maps NCCL_* onto WEFT_* once per process (before the first comm). */
void nccl_env_apply(void);
/* The WEFT_* settings NCCL_* variables map to (env.c), for every comm and
 * unique id; the array lives as long as the process. */
size_t nccl_env_settings(const weft_setting_t **settings);
int  nccl_log_level(void);
void nccl_log(int level, int device, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "weft X.Y.Z (NCCL A.B.C API)" */
const char *nccl_version_text(void);

/* ---- cuda.c ---- */
struct nccl_cuda {
    cudaError_t (*GetDevice)(int *device);
    cudaError_t (*SetDevice)(int device);
    cudaError_t (*GetDeviceCount)(int *count);
    cudaError_t (*Malloc)(void **ptr, size_t size);
    cudaError_t (*Free)(void *ptr);
    cudaError_t (*MallocHost)(void **ptr, size_t size);
    cudaError_t (*FreeHost)(void *ptr);
    cudaError_t (*MemcpyAsync)(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s);
    cudaError_t (*LaunchHostFunc)(cudaStream_t s, cudaHostFn_t fn, void *arg);
    cudaError_t (*StreamSynchronize)(cudaStream_t s);
    const char *(*GetErrorString)(cudaError_t err);
    /* optional (NULL when the runtime has none) */
    cudaError_t (*StreamIsCapturing)(cudaStream_t s, enum cudaStreamCaptureStatus *status);
};
/* The runtime (loaded at the first call), or NULL with *why saying why. */
const struct nccl_cuda *nccl_cuda(const char **why);
/* A CUDA call of the adapter failed: ncclUnhandledCudaError, text naming it. */
ncclResult_t nccl_cuda_fail(const struct ncclComm *c, const char *fn, const char *call, cudaError_t e);

/* Runs the rest of a call with the comm's device current (weft's stream
 * calls want the stream's device current), restoring the caller's after. */
struct nccl_devguard { int prev; int switched; };
ncclResult_t nccl_dev_enter(const struct ncclComm *c, struct nccl_devguard *g, const char *fn);
void nccl_dev_leave(const struct nccl_devguard *g);

/* ---- comm.c ---- */
/* A comm usable for operations (READY): else the NCCL error, text set. */
ncclResult_t nccl_comm_ready(const struct ncclComm *c, const char *fn);
/* Runs a pending init (deferred or non-blocking) in this thread. */
void nccl_comm_run_init(struct ncclComm *c);
/* Frees a comm's shell (its weft comm already destroyed or never made). */
void nccl_shell_free(struct ncclComm *c);

/* ---- group.c ---- */
int  nccl_group_depth(void);
/* Defers c's initialisation to the outermost ncclGroupEnd of this thread. */
ncclResult_t nccl_group_defer_init(struct ncclComm *c, const char *fn);
/* Has fn run at the outermost ncclGroupEnd of this thread, once weft's
 * group was queued (after every operation of the group; ok 0 when that
 * failed); or now, with ok 1, when no group is open. */
ncclResult_t nccl_group_after(void (*fn)(void *arg, int ok), void *arg, const char *caller);

/* ---- premul.c ---- */
/* For a PreMulSum op: queues on stream the pre-multiplied copy of sendbuf
 * (count elements) and returns it in *input; the caller runs the sum from
 * it and then calls nccl_premul_done(tmp). */
ncclResult_t nccl_premul_prepare(struct ncclComm *c, ncclRedOp_t op, ncclDataType_t dt, const void *sendbuf,
                                 size_t count, cudaStream_t stream, const void **input,
                                 struct nccl_premul_tmp **tmp, const char *fn);
/* The collective reading tmp was queued (or failed to be: ok 0). */
void nccl_premul_done(struct nccl_premul_tmp *tmp, int ok);
/* Frees the buffers of finished pre-multiplies (all: waits for their streams). */
void nccl_premul_reap(struct ncclComm *c, int all);
/* Validates op for a call with datatype dt: built-in, or a live PreMulSum of c for dt. */
ncclResult_t nccl_op_check(const struct ncclComm *c, ncclRedOp_t op, ncclDataType_t dt, const char *fn);

/* ---- colls.c ---- */
ncclResult_t nccl_type_size(ncclDataType_t dt, size_t *size);
const char  *nccl_type_name(ncclDataType_t dt);

#endif
