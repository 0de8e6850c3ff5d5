/*
 * libweft_mpi.so: the PMPI drop-in. An unmodified MPI program, run with
 * LD_PRELOAD=libweft_mpi.so, has its MPI collectives served by weft
 * (MPI_Allgather, _Alltoall, _Alltoallv, _Bcast, _Barrier, _Allreduce,
 * _Reduce, _Reduce_scatter_block, _Gather, _Scatter).
 *
 * Open MPI's MPI_* entry points are weak aliases of PMPI_*, so the
 * MPI_Allgather (and friends) defined here win, and everything this layer
 * does not serve goes on to PMPI_* unchanged. Who does what:
 *   colls.c       the intercepted calls: route, lay the data out, call weft
 *   route.c       settings (WEFT_MPI*), the routing rule, per-call counters
 *   comm_cache.c  one weft comm per MPI communicator, cached as an attribute
 *   datatype.c    MPI datatypes -> contiguous bytes (pack/unpack), reduce types/ops
 *   errors.c      weft errors -> the communicator's MPI error handler, with weft's text
 * This layer uses only weft.h and PMPI_*; it never calls MPI_* (that would
 * come back into itself).
 */
#ifndef WEFT_MPI_H
#define WEFT_MPI_H

#include <mpi.h>
#include <stddef.h>

#include "weft.h"

#if defined(__GNUC__)
#define WMPI_EXPORT __attribute__((visibility("default")))
#else
#define WMPI_EXPORT
#endif

/* The intercepted collectives (index into the settings and counters). */
enum wmpi_coll {
    WMPI_ALLGATHER = 0,
    WMPI_BCAST,
    WMPI_BARRIER,
    WMPI_ALLREDUCE,
    WMPI_REDUCE,
    WMPI_REDUCE_SCATTER_BLOCK,
    WMPI_ALLTOALL,
    WMPI_GATHER,
    WMPI_SCATTER,
    WMPI_ALLTOALLV,
    WMPI_NCOLLS
};

/* ---- route.c ---- */
/* The collective's name as WEFT_MPI_COLLS spells it ("allgather", ...). */
const char *wmpi_coll_name(enum wmpi_coll coll);
/* Reads the WEFT_MPI* variables once (the first intercepted call). */
void wmpi_settings_load(void);
/* Whether the layer serves coll at all (WEFT_MPI, WEFT_MPI_COLLS). */
int  wmpi_enabled(enum wmpi_coll coll);
/* Whether weft serves a call of coll with size bytes (bytes every rank
 * agrees on, see colls.c; > 0, the barrier and alltoallv pass 1): within its
 * thresholds (WEFT_MPI_MIN_BYTES / _MAX_BYTES), or by the node-local rule
 * on a communicator of nranks ranks whose weft comm serves calls
 * of up to node_bytes a rank in shared memory (weft_comm_node_coll_bytes). */
int  wmpi_serves(enum wmpi_coll coll, size_t bytes, int nranks, size_t node_bytes);
/* Counts one call of coll, served by weft (1) or by PMPI (0). */
void wmpi_count(enum wmpi_coll coll, int by_weft);
/* WEFT_MPI_STATS=1: one line per rank to stderr (at MPI_Finalize). */
void wmpi_stats_print(void);

/* ---- comm_cache.c ---- */
/* What routing needs of comm's entry, which holds the weft comm serving
 * comm. The entry is made at the communicator's first call (a collective
 * over comm: every rank of comm calls this at the same call, since they
 * route alike); its weft comm is NULL when comm goes to PMPI (weft could
 * not be set up on some rank: then one WARN line, and PMPI for good). */
struct wmpi_comm_info {
    weft_comm_t *weft;        /* NULL: PMPI serves comm */
    int          nranks, rank;
    size_t       node_bytes;  /* weft_comm_node_coll_bytes of weft (0: none, or no weft) */
};
/* 1 and *info set when comm has its entry; 0 when it has none (MPI not
 * up, MPI_COMM_NULL, an intercomm, one rank, no memory): PMPI serves it. */
int  wmpi_comm_info(MPI_Comm comm, struct wmpi_comm_info *info);
unsigned long wmpi_comm_gen(void);
/* The layer is set up (keyval, error codes, settings) once per process;
 * 0 when MPI is not initialised or already finalised (go to PMPI). */
int wmpi_ready(void);

/* ---- datatype.c ---- */
/* Asks MPI once about the common predefined types (set-up, before any call
 * is served), so that the calls below answer for them without MPI. */
void wmpi_types_init(void);
/* Where count elements of type lie: one run of *bytes bytes at *start
 * (contiguous: returns 1), or scattered (returns 0: pack/unpack). */
int  wmpi_layout(const void *buf, long long count, MPI_Datatype type, const void **start, size_t *bytes);
/* Packs count elements of type at buf into a new buffer (*out, *bytes);
 * unpack writes bytes back through the type map. MPI error code. */
int  wmpi_pack(const void *buf, int count, MPI_Datatype type, MPI_Comm comm, void **out, size_t *bytes);
int  wmpi_unpack(const void *packed, size_t bytes, void *buf, int count, MPI_Datatype type, MPI_Comm comm);
/* A predefined MPI type or op that weft reduces: 1 and *out set; else 0. */
int  wmpi_reduce_type(MPI_Datatype type, weft_dtype_t *out);
int  wmpi_reduce_op(MPI_Op op, weft_op_t *out);
/* Size in bytes of count elements of type; 0 and -1 on overflow/error. */
int  wmpi_type_bytes(MPI_Datatype type, long long count, size_t *bytes);

/* ---- errors.c ---- */
/* A weft failure of fn on comm: the text goes to an MPI error code of
 * weft's error class, the communicator's error handler is called with it
 * (MPI_ERRORS_ARE_FATAL prints it and aborts), and the code is returned
 * (MPI_ERRORS_RETURN). wrc: the WEFT_* code; wc: the weft comm (its last
 * error is the text) or NULL with text given. */
int  wmpi_raise(MPI_Comm comm, const char *fn, int wrc, weft_comm_t *wc, const char *text);
/* Creates weft's MPI error class and codes (once, from wmpi_ready). */
int  wmpi_errors_init(void);
/* The MPI error class every weft error belongs to (tests read it). */
int  wmpi_error_class(void);

/* One line to stderr, "weft_mpi[rank R] WARN: ..." (R: MPI_COMM_WORLD's). */
void wmpi_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* WEFT_MPI_H */
