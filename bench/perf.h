/*
 * weft-perf: shared declarations of the benchmark program.
 *
 * weft_perf.c owns main(), option parsing and the helpers below (timing,
 * medians, iteration scaling, data patterns, aligned buffers, header lines).
 * Each subcommand lives in its own file and plugs in through one function
 * with the same shape:
 *
 *     int perf_<name>(const struct perf_opts *o, weft_comm_t *c);
 *
 * It is called on every rank of MPI_COMM_WORLD with a weft comm already
 * created over it (perf_init, which times creation itself, gets c == NULL).
 * It prints its table from rank 0 only and returns 0 on success, non-zero
 * when a call failed (main then aborts the job with that code).
 *
 *     perf_p2p.c   perf_sendrecv, perf_init
 *     perf_coll.c  perf_allgather, perf_bcast, perf_gather, perf_scatter, perf_barrier
 *     perf_reduce.c perf_allreduce, perf_reduce, perf_reduce_scatter, perf_alltoall,
 *                   perf_alltoallv
 *     perf_exchange.c perf_exchange
 *     perf_mem.c   buffers in host or CUDA device memory (-d host|cuda)
 *     perf_ucx.c   sendrecv's UCX column (only where CMake finds UCX)
 *
 * Output: every subcommand starts with perf_print_header and hands each
 * result row to perf_report, which prints either the subcommand's own table
 * line or (--csv) one CSV line per library, so the two formats never drift
 * apart and no subcommand formats CSV itself.
 */
#ifndef WEFT_PERF_H
#define WEFT_PERF_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>
#include "weft.h"

struct perf_opts {
    /* Message / block sizes: min, min*factor, ... up to max. A value of 0 in
     * min_bytes/max_bytes means "this subcommand's default" (see perf_sizes). */
    size_t      min_bytes;     /* -b */
    size_t      max_bytes;     /* -e */
    size_t      factor;        /* -f, >= 2 */
    int         reps;          /* -r: repetitions per size, medians shown; 0 = subcommand default */
    int         iters;         /* -n: iterations per repetition; 0 = scaled by size */
    int         warmup;        /* -W: untimed iterations at the start of every measurement
                                *     (they also line the ranks up); default 1 */
    int         check;         /* -c: fill and verify data on every iteration */
    int         window;        /* -w: outstanding messages in the bandwidth test */
    size_t      window_cap;    /* -m: bytes one side's window buffers may take in all */
    int         one_pair;      /* -o: sendrecv between ranks 0 and 1 only, others wait */
    const char *tests;         /* -t: sendrecv: "lat", "bw" or NULL for both */
    const char *algo;          /* -a: collectives: force an algorithm (the mode's WEFT_*_ALGO); NULL = selector */
    int         root;          /* -R: bcast, reduce, gather and scatter root */
    int         device;        /* -d cuda: buffers in CUDA device memory (every mode but init) */
    int         csv;           /* --csv: CSV lines (perf_report) instead of tables */
    uint64_t    seed;          /* -s: exchange: seed of the message pattern */

    /* Filled by perf_mem_init. */
    int         mpi_direct;    /* MPI gets the benchmark's buffers as they are (host memory, or a
                                * CUDA-aware MPI); 0: device data staged through host for MPI */

    /* Filled by main. */
    int         rank, size;    /* in MPI_COMM_WORLD */
    int         nodes;         /* distinct hosts (MPI_Comm_split_type SHARED) */
    MPI_Comm    mpi;           /* a dup of MPI_COMM_WORLD for the MPI side of every test */
    const weft_config_t *config; /* every weft comm's configuration (-a: the mode's WEFT_*_ALGO);
                                  * weft_comm_create_config, never the environment written */
    int         argc;
    char      **argv;
};

/* ---- subcommands ---- */
int perf_sendrecv(const struct perf_opts *o, weft_comm_t *c);  /* perf_p2p.c */
int perf_init(const struct perf_opts *o, weft_comm_t *c);      /* perf_p2p.c; c is NULL */
int perf_allgather(const struct perf_opts *o, weft_comm_t *c); /* perf_coll.c */
int perf_bcast(const struct perf_opts *o, weft_comm_t *c);     /* perf_coll.c */
int perf_gather(const struct perf_opts *o, weft_comm_t *c);    /* perf_coll.c */
int perf_scatter(const struct perf_opts *o, weft_comm_t *c);   /* perf_coll.c */
int perf_barrier(const struct perf_opts *o, weft_comm_t *c);   /* perf_coll.c */
int perf_allreduce(const struct perf_opts *o, weft_comm_t *c);      /* perf_reduce.c */
int perf_reduce(const struct perf_opts *o, weft_comm_t *c);         /* perf_reduce.c */
int perf_reduce_scatter(const struct perf_opts *o, weft_comm_t *c); /* perf_reduce.c */
int perf_alltoall(const struct perf_opts *o, weft_comm_t *c);       /* perf_reduce.c */
int perf_alltoallv(const struct perf_opts *o, weft_comm_t *c);      /* perf_reduce.c */
int perf_exchange(const struct perf_opts *o, weft_comm_t *c);       /* perf_exchange.c */

/* ---- helpers (weft_perf.c) ---- */

/* Monotonic time in seconds. */
double perf_now(void);

/* Median of v[0..n) (sorts v in place); 0 when n == 0. */
double perf_median(double *v, int n);

/* Resolves the size range for a subcommand whose defaults are def_min..def_max. */
void perf_sizes(const struct perf_opts *o, size_t def_min, size_t def_max,
                size_t *min_bytes, size_t *max_bytes);

/* o->reps, or def when -r was not given. */
int perf_reps(const struct perf_opts *o, int def);

/* Next size in the sweep after `bytes` (bytes * factor); returns 0 when the
 * product would overflow, which ends the sweep. */
size_t perf_next_size(const struct perf_opts *o, size_t bytes);

/* Iterations per repetition: o->iters when given, else budget_bytes / bytes
 * clamped to [lo, hi], so that small messages get many iterations and large
 * ones few and every size costs about the same time. */
int perf_scale_iters(const struct perf_opts *o, size_t bytes, size_t budget_bytes, int lo, int hi);

/* A seed that tells apart iteration, size, direction/slot and library, so a
 * stale buffer from an earlier message never passes a check. */
uint64_t perf_seed(uint64_t iter, uint64_t bytes, uint64_t slot, uint64_t lib);

/* Fills buf with the pattern of seed; perf_verify returns how many bytes of
 * buf differ from it (0 = all right). Both work on any length and alignment. */
void   perf_fill(void *buf, size_t bytes, uint64_t seed);
size_t perf_verify(const void *buf, size_t bytes, uint64_t seed);

/* Page-aligned buffer, every page touched (so page faults are not timed).
 * Aborts the job (with a message naming the rank) when memory runs out. */
void *perf_alloc(size_t bytes);
void  perf_free(void *p);

/* ---- buffers in host or device memory (perf_mem.c) ----
 * With o->device == 0 these are the host helpers above; with -d cuda they
 * work on cudaMalloc'ed memory through the CUDA runtime loaded at run time
 * (WEFT_CUDA_LIB, else libcudart.so), never touching it from the host. */

/* "host" / "cuda" -> *device 0 / 1; -1 for anything else. */
int    perf_mem_parse(const char *arg, int *device);
/* Collective. -d cuda: loads the runtime, one device per node-local rank,
 * sets o->mpi_direct. Returns 0, or 1 on every rank when a rank has no
 * runtime or device (message printed). */
int    perf_mem_init(struct perf_opts *o);
void   perf_mem_fini(const struct perf_opts *o);
/* Rank 0's header lines: memory kind, device, how the MPI column gets its
 * data, and a warning when the runtime is the emulated one. */
void   perf_mem_describe(const struct perf_opts *o);
void  *perf_buf_alloc(const struct perf_opts *o, size_t bytes);   /* aborts the job on failure */
void   perf_buf_free(const struct perf_opts *o, void *p);
void   perf_buf_set(const struct perf_opts *o, void *buf, int byte, size_t bytes);
void   perf_buf_fill(const struct perf_opts *o, void *buf, size_t bytes, uint64_t seed);
size_t perf_buf_verify(const struct perf_opts *o, const void *buf, size_t bytes, uint64_t seed);
void   perf_buf_to_host(const struct perf_opts *o, void *host, const void *buf, size_t bytes);
void   perf_buf_from_host(const struct perf_opts *o, void *buf, const void *host, size_t bytes);

#ifdef WEFT_PERF_HAVE_UCX
/* ---- the UCX column of sendrecv (perf_ucx.c; built where CMake finds UCX) ----
 * UCP tag send/recv to one peer; UCX_* of the environment configure it.
 * Every call returns 0, or 1 after printing what failed on stderr. */
struct perf_ucx;
/* Collective over o->mpi: context, worker, addresses exchanged with
 * MPI_Allgather(v), one endpoint to peer (none when peer < 0). Fails on
 * every rank when one rank fails. */
int  perf_ucx_open(const struct perf_opts *o, int peer, struct perf_ucx **out);
/* Collective: closes the endpoint, then a barrier that keeps progressing. */
void perf_ucx_close(struct perf_ucx *u);
/* UCX_TLS, or "default". */
const char *perf_ucx_tls(void);
/* Blocking: return once buf may be reused / holds the message (*got its length). */
int  perf_ucx_send(struct perf_ucx *u, const void *buf, size_t bytes, int tag);
int  perf_ucx_recv(struct perf_ucx *u, void *buf, size_t bytes, int tag, size_t *got);
/* Non-blocking: *req is NULL when the operation completed at once (a receive's
 * length then in *got_now), else a request for perf_ucx_wait. */
int  perf_ucx_isend(struct perf_ucx *u, const void *buf, size_t bytes, int tag, void **req);
int  perf_ucx_irecv(struct perf_ucx *u, void *buf, size_t bytes, int tag, void **req, size_t *got_now);
/* Completes and frees req (NULL: nothing to do); got: a receive's length, NULL for sends. */
int  perf_ucx_wait(struct perf_ucx *u, void *req, const char *what, size_t *got);
#endif

/* "8", "4K", "64M" style, into buf (at least 16 bytes). */
const char *perf_size_str(size_t bytes, char *buf, size_t len);

/* Rank 0 prints the comment header every table starts with: the command
 * line, np, nodes, WEFT_TRANSPORTS and the MPI transport settings seen in
 * the environment, then `what` (the table's own title and column lines).
 * With --csv it prints the CSV header line instead, once per run (sendrecv
 * has two tables, one CSV). */
void perf_print_header(const struct perf_opts *o, const char *what);

/* One library's figures at one size, for perf_report. */
struct perf_result {
    const char *library;   /* "weft", "MPI", "ucx", "gloo", or a part of one ("weft_create") */
    double      time_s;    /* the time the table shows, in seconds */
    double      algbw;     /* GB/s; < 0: not meaningful (empty CSV field) */
    double      busbw;     /* GB/s; < 0: not meaningful */
    long long   wrong;     /* bad bytes/elements; < 0: not checked (empty CSV field) */
};

/* The CSV columns, in order (the header line --csv prints). */
#define PERF_CSV_HEADER "subcommand,np,transport,bytes,library,time_us,algbw_GBps,busbw_GBps,wrong"

/* Rank 0 only (others return at once): one result row of a table. Table
 * mode prints table_line (no newline needed); --csv prints one line per
 * res[0..n): test (the subcommand, or "sendrecv-lat"/"sendrecv-bw"), np,
 * the library's transport configuration (weft: WEFT_TRANSPORTS, ',' written
 * '+', or "default", plus "/vnodes=N" under WEFT_VIRTUAL_NODES; MPI: the
 * btl (OMPI_MCA_btl) or "default"; ucx: UCX_TLS or "default"), bytes (the table's size column),
 * library, time in microseconds, algbw, busbw and wrong. */
void perf_report(const struct perf_opts *o, const char *test, size_t bytes,
                 const struct perf_result *res, int n, const char *table_line);

/* Reports a failed weft call (rank, call, code, the comm's last error) on
 * stderr and returns 1, so callers can `return perf_weft_fail(...)`. */
int perf_weft_fail(const struct perf_opts *o, weft_comm_t *c, const char *call, int err);

#endif
