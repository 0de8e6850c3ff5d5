/*
 * The intercepted MPI collectives.
 *
 * Each one: decide, on facts every rank of the call agrees on, whether
 * weft serves it (route()); if not, PMPI_* with the same arguments. If so,
 * lay each buffer out as contiguous bytes (datatype.c: as it is, or packed
 * into scratch), map MPI_IN_PLACE onto weft's in-place forms, make the
 * weft call, unpack, and turn a weft failure into an MPI error through the
 * communicator's handler (errors.c).
 *
 * The size route() compares with the threshold (route.c) is one every rank
 * computes alike: the receive side's count x type size (MPI requires the
 * send signatures to match it), or the count of the reduced vector.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft_mpi.h"

/* weft's comm for this call, or NULL: PMPI serves it. bytes == 0 never
 * needs weft (nothing moves) except for the barrier, which passes 1. */
static weft_comm_t *route_info(enum wmpi_coll coll, MPI_Comm comm, size_t bytes, struct wmpi_comm_info *info_out)
{
    struct wmpi_comm_info info;
    weft_comm_t *wc = NULL;

    /* The weft comm is made at the first call on comm of any collective the
     * layer serves, whatever its size: making it is collective (MPI calls
     * on comm), so it must not hang on one rank's size. Made only when a
     * large call came, a rank whose count differed (erroneous, but Open MPI
     * lets it pass) sat in PMPI_Allreduce while the others sat in the
     * making's PMPI_Allgather: a hang inside MPI, with no WEFT_TIMEOUT and
     * no word (issue 28, item 5). Now the ranks part only inside weft's
     * collective, where the waiting rank's WEFT_TIMEOUT ends it with a
     * verdict. The cost: a comm only ever given small calls gets its weft
     * comm too (connections are made lazily, on first traffic). Whether
     * weft serves the call then depends on agreed facts only: the size,
     * the rank count and the comm's node-local limit (route.c). */
    if (wmpi_ready() && wmpi_enabled(coll) && wmpi_comm_info(comm, &info) && info.weft != NULL &&
        wmpi_serves(coll, bytes, info.nranks, info.node_bytes)) {
        wc = info.weft;
        if (info_out)
            *info_out = info;
    }
    wmpi_count(coll, wc != NULL);
    return wc;
}

static weft_comm_t *route(enum wmpi_coll coll, MPI_Comm comm, size_t bytes)
{
    return route_info(coll, comm, bytes, NULL);
}

/* The layer is off for coll (WEFT_MPI=0, not in WEFT_MPI_COLLS, MPI not
 * up): counted, and the caller goes straight to PMPI before looking at
 * any argument -- the cost of the layer there is this test. */
static int off(enum wmpi_coll coll)
{
    if (wmpi_ready() && wmpi_enabled(coll))
        return 0;
    wmpi_count(coll, 0);
    return 1;
}

static int comm_size(MPI_Comm comm)
{
    int n = 0;
    PMPI_Comm_size(comm, &n);
    return n;
}

static int comm_rank(MPI_Comm comm)
{
    int r = -1;
    PMPI_Comm_rank(comm, &r);
    return r;
}

/* A local MPI failure (packing) inside a served call. */
static int mpi_fail(MPI_Comm comm, int mrc)
{
    PMPI_Comm_call_errhandler(comm, mrc);
    return mrc;
}

/* One side of a call as contiguous bytes: data is where weft reads or
 * writes; tmp, when not NULL, is scratch that stands for the user's buffer. */
struct side {
    void  *data;
    void  *tmp;
    size_t bytes;
};

/* The bytes of count elements at buf, packed into scratch when scattered
 * (pack: copy the elements in; else scratch to receive into). */
static int take(struct side *s, const void *buf, long long count, MPI_Datatype type, MPI_Comm comm, int pack)
{
    const void *start = NULL;

    memset(s, 0, sizeof(*s));
    if (wmpi_layout(buf, count, type, &start, &s->bytes)) {
        s->data = (void *)start;
        return MPI_SUCCESS;
    }
    if (count > INT_MAX || wmpi_type_bytes(type, count, &s->bytes) != 0)
        return MPI_ERR_COUNT;   /* MPI_Pack counts are int */
    if (pack) {
        int rc = wmpi_pack(buf, (int)count, type, comm, &s->tmp, &s->bytes);
        s->data = s->tmp;
        return rc;
    }
    if ((s->tmp = malloc(s->bytes ? s->bytes : 1)) == NULL)
        return MPI_ERR_NO_MEM;
    s->data = s->tmp;
    return MPI_SUCCESS;
}

/* Writes scratch back into the user's buffer (unpack) and frees it. */
static int give(struct side *s, void *buf, long long count, MPI_Datatype type, MPI_Comm comm, int unpack)
{
    int rc = MPI_SUCCESS;

    if (s->tmp && unpack)
        rc = wmpi_unpack(s->tmp, s->bytes, buf, (int)count, type, comm);
    free(s->tmp);
    s->tmp = NULL;
    return rc;
}

/* The per-rank signature of the send side must match the receive side's
 * (MPI's rule); weft moves bytes, so a mismatch would corrupt data. */
static int check_match(MPI_Comm comm, const char *fn, weft_comm_t *wc, size_t send, size_t recv)
{
    char why[160];

    if (send == recv)
        return MPI_SUCCESS;
    snprintf(why, sizeof(why),
             "the send side has %zu bytes (sendcount x sendtype size) but the receive side expects %zu", send, recv);
    return wmpi_raise(comm, fn, WEFT_ERR_INVALID_ARG, wc, why);
}

WMPI_EXPORT int MPI_Barrier(MPI_Comm comm)
{
    weft_comm_t *wc;
    int wrc;

    if (off(WMPI_BARRIER))
        return PMPI_Barrier(comm);
    /* No size: 1 byte, so the threshold 0 serves it and any other leaves
     * it to MPI (unless the node-local rule takes it, route.c). */
    wc = route(WMPI_BARRIER, comm, 1);
    if (wc == NULL)
        return PMPI_Barrier(comm);
    if ((wrc = weft_barrier(wc)) != WEFT_SUCCESS)
        return wmpi_raise(comm, "MPI_Barrier", wrc, wc, NULL);
    return MPI_SUCCESS;
}

WMPI_EXPORT int MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm)
{
    size_t bytes = 0;
    weft_comm_t *wc = NULL;
    struct wmpi_comm_info info;
    struct side s;
    int rc, wrc;

    if (off(WMPI_BCAST))
        return PMPI_Bcast(buf, count, type, root, comm);
    if (comm != MPI_COMM_NULL && wmpi_type_bytes(type, count, &bytes) == 0 && root >= 0 && root < comm_size(comm))
        wc = route_info(WMPI_BCAST, comm, bytes, &info);
    else
        route(WMPI_BCAST, comm, 0);   /* counted; MPI reports the bad argument */
    if (wc == NULL)
        return PMPI_Bcast(buf, count, type, root, comm);
    const int me = info.rank == root;
    if ((rc = take(&s, buf, count, type, comm, me)) != MPI_SUCCESS)
        return mpi_fail(comm, rc);
    wrc = weft_bcast(wc, s.data, s.bytes, root);
    rc = give(&s, buf, count, type, comm, !me && wrc == WEFT_SUCCESS);
    if (wrc != WEFT_SUCCESS)
        return wmpi_raise(comm, "MPI_Bcast", wrc, wc, NULL);
    return rc == MPI_SUCCESS ? MPI_SUCCESS : mpi_fail(comm, rc);
}

typedef int (*weft_exchange_fn)(weft_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes_per_rank);

/* Allgather and alltoall: the same shape. The receive side holds n blocks
 * of recvcount x recvtype; the send side holds send_blocks (1 or n) of
 * sendcount x sendtype, or is MPI_IN_PLACE: then the data is in recvbuf and
 * weft's in-place form reads it at in_place_at blocks from the start (this
 * rank's block for allgather, 0 for alltoall). */
static int exchange(const char *fn, weft_exchange_fn move, int send_blocks, int in_place_at, int nranks,
                    weft_comm_t *wc, size_t block, const void *sendbuf, int sendcount, MPI_Datatype sendtype,
                    void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm)
{
    const long long all = (long long)recvcount * nranks;
    struct side in, out;
    int rc, wrc;

    if (sendbuf == MPI_IN_PLACE) {
        if ((rc = take(&out, recvbuf, all, recvtype, comm, 1)) != MPI_SUCCESS)
            return mpi_fail(comm, rc);
        wrc = move(wc, (char *)out.data + (size_t)in_place_at * block, out.data, block);
    } else {
        if ((rc = take(&in, sendbuf, (long long)sendcount * send_blocks, sendtype, comm, 1)) != MPI_SUCCESS)
            return mpi_fail(comm, rc);
        if ((rc = check_match(comm, fn, wc, in.bytes, block * (size_t)send_blocks)) != MPI_SUCCESS) {
            give(&in, NULL, 0, sendtype, comm, 0);
            return rc;
        }
        if ((rc = take(&out, recvbuf, all, recvtype, comm, 0)) != MPI_SUCCESS) {
            give(&in, NULL, 0, sendtype, comm, 0);
            return mpi_fail(comm, rc);
        }
        wrc = move(wc, in.data, out.data, block);
        give(&in, NULL, 0, sendtype, comm, 0);
    }
    rc = give(&out, recvbuf, all, recvtype, comm, wrc == WEFT_SUCCESS);
    if (wrc != WEFT_SUCCESS)
        return wmpi_raise(comm, fn, wrc, wc, NULL);
    return rc == MPI_SUCCESS ? MPI_SUCCESS : mpi_fail(comm, rc);
}

WMPI_EXPORT int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                              int recvcount, MPI_Datatype recvtype, MPI_Comm comm)
{
    size_t block = 0;
    weft_comm_t *wc = NULL;
    struct wmpi_comm_info info;

    if (off(WMPI_ALLGATHER))
        return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    if (comm != MPI_COMM_NULL && wmpi_type_bytes(recvtype, recvcount, &block) == 0)
        wc = route_info(WMPI_ALLGATHER, comm, block, &info);
    else
        route(WMPI_ALLGATHER, comm, 0);
    if (wc == NULL)
        return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    /* In place: rank r's block is already at its place in recvbuf. */
    return exchange("MPI_Allgather", weft_allgather, 1, info.rank, info.nranks, wc, block, sendbuf,
                    sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

WMPI_EXPORT int MPI_Alltoall(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                             int recvcount, MPI_Datatype recvtype, MPI_Comm comm)
{
    size_t block = 0;
    weft_comm_t *wc = NULL;
    struct wmpi_comm_info info;

    if (off(WMPI_ALLTOALL))
        return PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    if (comm != MPI_COMM_NULL && wmpi_type_bytes(recvtype, recvcount, &block) == 0)
        wc = route_info(WMPI_ALLTOALL, comm, block, &info);
    else
        route(WMPI_ALLTOALL, comm, 0);
    if (wc == NULL)
        return PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    return exchange("MPI_Alltoall", weft_alltoall, info.nranks, 0, info.nranks, wc, block, sendbuf, sendcount,
                    sendtype, recvbuf, recvcount, recvtype, comm);
}

/* MPI_MIN / MPI_MAX of floating-point values go to MPI at every size. With
 * a NaN among the operands the answers differ: weft's MIN/MAX propagate
 * the NaN (as IEEE 754-2019's minimum/maximum, numpy and PyTorch do); Open
 * MPI's keep whichever operand its comparison picks, the non-NaN one in
 * the order its algorithm happens to apply them. A program must get one
 * answer whatever its vector's size -- the threshold must not change it --
 * and without the drop-in it gets MPI's, so MPI serves them all. (Their
 * users reduce a few norms or bounds, where MPI is as fast.) */
static int mpi_decides_nan(weft_dtype_t dt, weft_op_t wop)
{
    return (wop == WEFT_MIN || wop == WEFT_MAX) &&
           (dt == WEFT_FLOAT16 || dt == WEFT_BFLOAT16 || dt == WEFT_FLOAT32 || dt == WEFT_FLOAT64);
}

/* The reductions: predefined types and ops weft has, else PMPI (agreed:
 * every rank passes the same type and op). */
static weft_comm_t *route_reduce(enum wmpi_coll coll, MPI_Comm comm, int count, MPI_Datatype type, MPI_Op op,
                                 weft_dtype_t *dt, weft_op_t *wop)
{
    size_t bytes = 0;

    if (off(coll))
        return NULL;
    if (comm == MPI_COMM_NULL || !wmpi_reduce_type(type, dt) || !wmpi_reduce_op(op, wop) ||
        mpi_decides_nan(*dt, *wop) || wmpi_type_bytes(type, count, &bytes) != 0)
        bytes = 0;   /* MPI's: not a type/op weft reduces, a float MIN/MAX, or a bad argument */
    return route(coll, comm, bytes);
}

WMPI_EXPORT int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op,
                              MPI_Comm comm)
{
    weft_dtype_t dt;
    weft_op_t wop;
    weft_comm_t *wc = route_reduce(WMPI_ALLREDUCE, comm, count, type, op, &dt, &wop);
    int wrc;

    if (wc == NULL)
        return PMPI_Allreduce(sendbuf, recvbuf, count, type, op, comm);
    if (sendbuf == MPI_IN_PLACE)
        sendbuf = recvbuf;
    if ((wrc = weft_allreduce(wc, sendbuf, recvbuf, (size_t)count, dt, wop)) != WEFT_SUCCESS)
        return wmpi_raise(comm, "MPI_Allreduce", wrc, wc, NULL);
    return MPI_SUCCESS;
}

WMPI_EXPORT int MPI_Reduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype type, MPI_Op op, int root,
                           MPI_Comm comm)
{
    weft_dtype_t dt;
    weft_op_t wop;
    weft_comm_t *wc = NULL;
    int wrc;

    if (comm != MPI_COMM_NULL && root >= 0 && root < comm_size(comm))
        wc = route_reduce(WMPI_REDUCE, comm, count, type, op, &dt, &wop);
    else
        route(WMPI_REDUCE, comm, 0);
    if (wc == NULL)
        return PMPI_Reduce(sendbuf, recvbuf, count, type, op, root, comm);
    if (sendbuf == MPI_IN_PLACE)   /* valid at the root only */
        sendbuf = recvbuf;
    if ((wrc = weft_reduce(wc, sendbuf, recvbuf, (size_t)count, dt, wop, root)) != WEFT_SUCCESS)
        return wmpi_raise(comm, "MPI_Reduce", wrc, wc, NULL);
    return MPI_SUCCESS;
}

WMPI_EXPORT int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount, MPI_Datatype type,
                                         MPI_Op op, MPI_Comm comm)
{
    weft_dtype_t dt;
    weft_op_t wop;
    weft_comm_t *wc = route_reduce(WMPI_REDUCE_SCATTER_BLOCK, comm, recvcount, type, op, &dt, &wop);
    size_t block = 0;
    int wrc;

    if (wc == NULL)
        return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, type, op, comm);
    wmpi_type_bytes(type, recvcount, &block);
    if (sendbuf != MPI_IN_PLACE) {
        wrc = weft_reduce_scatter(wc, sendbuf, recvbuf, (size_t)recvcount, dt, wop);
    } else {
        /* MPI's in place: the input fills recvbuf, the result goes to its
         * start, and the rest of the buffer keeps the input: MPI's text
         * leaves it unspecified, but Open MPI and MPICH keep it and programs
         * rely on it (mpi4py's own tests). weft's in-place form leaves the
         * result on this rank's own block of the input instead, so the
         * result goes out of place, into a block of its own, then to the
         * front: recvbuf is only read until then. Without memory for that
         * block, weft's in-place form and a move: the result still right
         * and every rank still in the same call (a local refusal here
         * would leave the others waiting), only this rank's own block then
         * holds the result too. */
        void *tmp = malloc(block > 0 ? block : 1);
        if (tmp != NULL) {
            wrc = weft_reduce_scatter(wc, recvbuf, tmp, (size_t)recvcount, dt, wop);
            if (wrc == WEFT_SUCCESS)
                memcpy(recvbuf, tmp, block);
            free(tmp);
        } else {
            char *mine = (char *)recvbuf + (size_t)comm_rank(comm) * block;
            wrc = weft_reduce_scatter(wc, recvbuf, mine, (size_t)recvcount, dt, wop);
            if (wrc == WEFT_SUCCESS && mine != recvbuf)
                memmove(recvbuf, mine, block);
        }
    }
    if (wrc != WEFT_SUCCESS)
        return wmpi_raise(comm, "MPI_Reduce_scatter_block", wrc, wc, NULL);
    return MPI_SUCCESS;
}

/* Gather and scatter: the size every rank agrees on is one rank's block,
 * which the root reads from its side of many blocks (gather: recvcount x
 * recvtype; scatter: sendcount x sendtype) and every other rank from its
 * own side of one block -- MPI's rule that the signatures match makes
 * them equal. The root's buffer of n blocks is laid out like the other
 * sides (as it is, or through scratch); the other ranks never touch it.
 * The rank and size come from the comm's entry (no PMPI_Comm_rank/_size
 * on a call handed on). weft's comm for the call, or NULL: PMPI serves it
 * (MPI then reports a bad root, count or type, or MPI_IN_PLACE where only
 * the root's other side may be in place). many_*: the root's n-block side;
 * one_*: every other rank's own block. */
static weft_comm_t *route_rooted(enum wmpi_coll coll, MPI_Comm comm, int root, const void *many_buf, int many_count,
                                 MPI_Datatype many_type, const void *one_buf, int one_count, MPI_Datatype one_type,
                                 struct wmpi_comm_info *info, int *is_root, size_t *block_out)
{
    size_t block = 0;
    weft_comm_t *wc = NULL;

    if (comm != MPI_COMM_NULL && wmpi_comm_info(comm, info) && info->weft != NULL && root >= 0 &&
        root < info->nranks) {
        *is_root = info->rank == root;
        if ((*is_root ? many_buf : one_buf) != MPI_IN_PLACE &&
            wmpi_type_bytes(*is_root ? many_type : one_type, *is_root ? many_count : one_count, &block) == 0 &&
            wmpi_serves(coll, block, info->nranks, info->node_bytes)) {
            wc = info->weft;
            *block_out = block;
        }
    }
    wmpi_count(coll, wc != NULL);
    return wc;
}

WMPI_EXPORT int MPI_Gather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                           MPI_Datatype recvtype, int root, MPI_Comm comm)
{
    struct wmpi_comm_info info;
    struct side in, out;
    int rc, wrc, me = 0;

    if (off(WMPI_GATHER))
        return PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
    size_t block = 0;
    weft_comm_t *wc =
        route_rooted(WMPI_GATHER, comm, root, recvbuf, recvcount, recvtype, sendbuf, sendcount, sendtype, &info,
                     &me, &block);
    if (wc == NULL)
        return PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
    if (!me) {
        if ((rc = take(&in, sendbuf, sendcount, sendtype, comm, 1)) != MPI_SUCCESS)
            return mpi_fail(comm, rc);
        wrc = weft_gather(wc, in.data, NULL, block, root);
        give(&in, NULL, 0, sendtype, comm, 0);
        if (wrc != WEFT_SUCCESS)
            return wmpi_raise(comm, "MPI_Gather", wrc, wc, NULL);
        return MPI_SUCCESS;
    }
    const long long all = (long long)recvcount * info.nranks;
    if (sendbuf == MPI_IN_PLACE) {
        /* The root's block is already at its place in recvbuf: packed
         * with the rest, weft's in-place form reads it there. */
        if ((rc = take(&out, recvbuf, all, recvtype, comm, 1)) != MPI_SUCCESS)
            return mpi_fail(comm, rc);
        wrc = weft_gather(wc, (char *)out.data + (size_t)root * block, out.data, block, root);
    } else {
        if ((rc = take(&in, sendbuf, sendcount, sendtype, comm, 1)) != MPI_SUCCESS)
            return mpi_fail(comm, rc);
        if ((rc = check_match(comm, "MPI_Gather", wc, in.bytes, block)) != MPI_SUCCESS) {
            give(&in, NULL, 0, sendtype, comm, 0);
            return rc;
        }
        if ((rc = take(&out, recvbuf, all, recvtype, comm, 0)) != MPI_SUCCESS) {
            give(&in, NULL, 0, sendtype, comm, 0);
            return mpi_fail(comm, rc);
        }
        wrc = weft_gather(wc, in.data, out.data, block, root);
        give(&in, NULL, 0, sendtype, comm, 0);
    }
    rc = give(&out, recvbuf, all, recvtype, comm, wrc == WEFT_SUCCESS);
    if (wrc != WEFT_SUCCESS)
        return wmpi_raise(comm, "MPI_Gather", wrc, wc, NULL);
    return rc == MPI_SUCCESS ? MPI_SUCCESS : mpi_fail(comm, rc);
}

WMPI_EXPORT int MPI_Scatter(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                            MPI_Datatype recvtype, int root, MPI_Comm comm)
{
    struct wmpi_comm_info info;
    struct side in, out;
    int rc, wrc, me = 0;

    if (off(WMPI_SCATTER))
        return PMPI_Scatter(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
    size_t block = 0;
    weft_comm_t *wc =
        route_rooted(WMPI_SCATTER, comm, root, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, &info,
                     &me, &block);
    if (wc == NULL)
        return PMPI_Scatter(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
    if (!me) {
        if ((rc = take(&out, recvbuf, recvcount, recvtype, comm, 0)) != MPI_SUCCESS)
            return mpi_fail(comm, rc);
        wrc = weft_scatter(wc, NULL, out.data, block, root);
        rc = give(&out, recvbuf, recvcount, recvtype, comm, wrc == WEFT_SUCCESS);
        if (wrc != WEFT_SUCCESS)
            return wmpi_raise(comm, "MPI_Scatter", wrc, wc, NULL);
        return rc == MPI_SUCCESS ? MPI_SUCCESS : mpi_fail(comm, rc);
    }
    if ((rc = take(&in, sendbuf, (long long)sendcount * info.nranks, sendtype, comm, 1)) != MPI_SUCCESS)
        return mpi_fail(comm, rc);
    if (recvbuf == MPI_IN_PLACE) {
        /* The root's own block stays where it is, in sendbuf. */
        wrc = weft_scatter(wc, in.data, (char *)in.data + (size_t)root * block, block, root);
        give(&in, NULL, 0, sendtype, comm, 0);
        if (wrc != WEFT_SUCCESS)
            return wmpi_raise(comm, "MPI_Scatter", wrc, wc, NULL);
        return MPI_SUCCESS;
    }
    if ((rc = take(&out, recvbuf, recvcount, recvtype, comm, 0)) != MPI_SUCCESS) {
        give(&in, NULL, 0, sendtype, comm, 0);
        return mpi_fail(comm, rc);
    }
    if ((rc = check_match(comm, "MPI_Scatter", wc, out.bytes, block)) != MPI_SUCCESS) {
        give(&in, NULL, 0, sendtype, comm, 0);
        give(&out, NULL, 0, recvtype, comm, 0);
        return rc;
    }
    wrc = weft_scatter(wc, in.data, out.data, block, root);
    give(&in, NULL, 0, sendtype, comm, 0);
    rc = give(&out, recvbuf, recvcount, recvtype, comm, wrc == WEFT_SUCCESS);
    if (wrc != WEFT_SUCCESS)
        return wmpi_raise(comm, "MPI_Scatter", wrc, wc, NULL);
    return rc == MPI_SUCCESS ? MPI_SUCCESS : mpi_fail(comm, rc);
}

/* ---- MPI_Alltoallv ----
 *
 * No size is agreed: every rank knows only its own counts. The call goes
 * to weft or to MPI by the collective's setting and the communicator's
 * rank count alone (route.c), never by a count, so the ranks cannot part.
 *
 * Each side is n blocks of count[j] x type at buf + displs[j] x extent.
 * A type whose elements are one run each with nothing between them (MPI's
 * predefined types, contiguous derived ones) is handed to weft in place:
 * byte counts and byte offsets from the lowest block, no copy. Any other
 * type is packed block by block into scratch (send) or received into
 * scratch and unpacked block by block (receive), as the other calls do.
 */

/* One side of an alltoallv as weft takes it: n blocks of bytes[j] at
 * base + displs[j]; tmp, when not NULL, is scratch standing for the user's
 * buffer (base is then tmp). */
struct vside {
    char   *base;
    size_t *bytes, *displs;
    void   *tmp;
};

/* The blocks of counts/displs of type at buf, as weft takes them (arrays
 * given, n entries each). pack: copy the elements into scratch (the send
 * side); else scratch to receive into where the type has gaps. force:
 * scratch even for a type without gaps (the in-place send side, a copy of
 * the receive buffer). */
static int vtake(struct vside *v, const void *buf, const int counts[], const int displs[], MPI_Datatype type,
                 int n, MPI_Comm comm, int pack, int force)
{
    static const char probe[1];
    const void *start = NULL;
    size_t size = 0, run = 0, total = 0;
    MPI_Count lb = 0, extent = 0;
    long long lo = 0;
    int any = 0;

    v->base = (char *)buf;
    v->tmp = NULL;
    if (wmpi_type_bytes(type, 1, &size) != 0 || PMPI_Type_get_extent_x(type, &lb, &extent) != MPI_SUCCESS)
        return MPI_ERR_TYPE;
    for (int j = 0; j < n; j++) {
        v->bytes[j] = (size_t)counts[j] * size;   /* counts >= 0: checked by the caller */
        total += v->bytes[j];
    }
    /* Elements without gaps, each starting where the last ended (asked of
     * two elements at a stand-in address: buf may be NULL). */
    if (!force && wmpi_layout(probe, 2, type, &start, &run)) {
        const long long tlb = (const char *)start - probe;
        for (int j = 0; j < n; j++)
            if (v->bytes[j] > 0 && (!any || (long long)displs[j] * extent < lo)) {
                lo = (long long)displs[j] * extent;
                any = 1;
            }
        for (int j = 0; j < n; j++)
            v->displs[j] = v->bytes[j] > 0 ? (size_t)((long long)displs[j] * extent - lo) : 0;
        if (any)
            v->base = (char *)buf + tlb + lo;
        return MPI_SUCCESS;
    }
    if ((v->tmp = malloc(total ? total : 1)) == NULL)
        return MPI_ERR_NO_MEM;
    v->base = v->tmp;
    total = 0;
    for (int j = 0; j < n; j++) {
        v->displs[j] = total;
        total += v->bytes[j];
        if (!pack || counts[j] == 0)
            continue;
        int pos = 0, rc;
        if (v->bytes[j] > INT_MAX)
            rc = MPI_ERR_COUNT;   /* MPI_Pack's sizes are int */
        else
            rc = PMPI_Pack((const char *)buf + (long long)displs[j] * extent, counts[j], type,
                           v->base + v->displs[j], (int)v->bytes[j], &pos, comm);
        if (rc == MPI_SUCCESS && (size_t)pos != v->bytes[j])
            rc = MPI_ERR_INTERN;   /* native packing is the signature's bytes */
        if (rc != MPI_SUCCESS) {
            free(v->tmp);
            v->tmp = NULL;
            return rc;
        }
    }
    return MPI_SUCCESS;
}

/* The receive side's scratch back into the user's blocks (unpack), freed. */
static int vgive(struct vside *v, void *buf, const int counts[], const int displs[], MPI_Datatype type, int n,
                 MPI_Comm comm, int unpack)
{
    MPI_Count lb = 0, extent = 0;
    int rc = MPI_SUCCESS;

    if (v->tmp && unpack && (rc = PMPI_Type_get_extent_x(type, &lb, &extent)) == MPI_SUCCESS)
        for (int j = 0; j < n && rc == MPI_SUCCESS; j++) {
            int pos = 0;
            if (counts[j] > 0)
                rc = PMPI_Unpack(v->base + v->displs[j], (int)v->bytes[j], &pos,
                                 (char *)buf + (long long)displs[j] * extent, counts[j], type, comm);
        }
    free(v->tmp);
    v->tmp = NULL;
    return rc;
}

/* Counts that MPI would accept on this rank's side: arrays given, no count
 * below 0, a type with a size. Anything else is MPI's to report. */
static int vcounts_ok(const int counts[], const int displs[], MPI_Datatype type, int n)
{
    size_t size = 0;

    if (n > 0 && (counts == NULL || displs == NULL))
        return 0;
    if (type == MPI_DATATYPE_NULL || wmpi_type_bytes(type, 1, &size) != 0)
        return 0;
    for (int j = 0; j < n; j++)
        if (counts[j] < 0)
            return 0;
    return 1;
}

WMPI_EXPORT int MPI_Alltoallv(const void *sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                              void *recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype,
                              MPI_Comm comm)
{
    struct wmpi_comm_info info;
    weft_comm_t *wc = NULL;
    struct vside in, out;
    size_t *arrays;
    int rc, wrc, n;

    if (off(WMPI_ALLTOALLV))
        return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm);
    /* Routed by the rank count only (1 stands for "no size", as the
     * barrier's); this rank's own bad arguments are MPI's to report. */
    if (comm != MPI_COMM_NULL && wmpi_comm_info(comm, &info) && info.weft != NULL &&
        recvbuf != MPI_IN_PLACE && vcounts_ok(recvcounts, rdispls, recvtype, info.nranks) &&
        (sendbuf == MPI_IN_PLACE || vcounts_ok(sendcounts, sdispls, sendtype, info.nranks)) &&
        wmpi_serves(WMPI_ALLTOALLV, 1, info.nranks, info.node_bytes))
        wc = info.weft;
    wmpi_count(WMPI_ALLTOALLV, wc != NULL);
    if (wc == NULL)
        return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm);
    n = info.nranks;
    if ((arrays = malloc(4 * (size_t)n * sizeof(size_t))) == NULL)
        return mpi_fail(comm, MPI_ERR_NO_MEM);
    in.bytes = arrays;
    in.displs = arrays + n;
    out.bytes = arrays + 2 * (size_t)n;
    out.displs = arrays + 3 * (size_t)n;
    /* In place: what goes out is the receive buffer's blocks as they are
     * on entry, copied first (weft's exchange has no in-place form). */
    if (sendbuf == MPI_IN_PLACE)
        rc = vtake(&in, recvbuf, recvcounts, rdispls, recvtype, n, comm, 1, 1);
    else
        rc = vtake(&in, sendbuf, sendcounts, sdispls, sendtype, n, comm, 1, 0);
    if (rc != MPI_SUCCESS) {
        free(arrays);
        return mpi_fail(comm, rc);
    }
    if ((rc = vtake(&out, recvbuf, recvcounts, rdispls, recvtype, n, comm, 0, 0)) != MPI_SUCCESS) {
        free(in.tmp);
        free(arrays);
        return mpi_fail(comm, rc);
    }
    /* Block sizes that differ between a sender and its receiver are weft's
     * to find (WEFT_ERR_MISMATCH / _TRUNCATE, naming both ranks). */
    wrc = weft_alltoallv(wc, in.base, in.bytes, in.displs, out.base, out.bytes, out.displs);
    free(in.tmp);
    rc = vgive(&out, recvbuf, recvcounts, rdispls, recvtype, n, comm, wrc == WEFT_SUCCESS);
    free(arrays);
    if (wrc != WEFT_SUCCESS)
        return wmpi_raise(comm, "MPI_Alltoallv", wrc, wc, NULL);
    return rc == MPI_SUCCESS ? MPI_SUCCESS : mpi_fail(comm, rc);
}
