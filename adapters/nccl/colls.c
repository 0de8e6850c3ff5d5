/*
 * The stream-ordered operations of the NCCL face, each a call of weft's
 * stream engine (weft_*_on_stream; inside ncclGroupStart/End they are
 * recorded in weft's group of this thread and queued at its end):
 *
 *   ncclAllReduce      weft_allreduce_on_stream
 *   ncclReduceScatter  weft_reduce_scatter_on_stream
 *   ncclReduce         weft_reduce_on_stream
 *   ncclAllGather      weft_allgather_on_stream   (count -> bytes)
 *   ncclAlltoAll       weft_alltoall_on_stream
 *   ncclBroadcast      [root: copy send -> recv]  weft_bcast_on_stream(recv)
 *   ncclBcast          weft_bcast_on_stream
 *   ncclSend/ncclRecv  weft_send/recv_on_stream on lane NCCLW_TAG_P2P
 *   ncclGather         a weft group: every rank sends its block to root,
 *                      root receives one block per rank (its own copied)
 *   ncclScatter        a weft group: root sends block r to rank r
 *
 * Reductions with a PreMulSum operator run as a SUM over a pre-multiplied
 * copy of the input (premul.c). Every call checks its arguments here
 * (NCCL's order: comm, then buffers, counts, type, op, peer/root) and
 * runs with the comm's device current.
 */
#include <stdint.h>
#include <string.h>

#include "nccl_adapter.h"

ncclResult_t nccl_type_size(ncclDataType_t dt, size_t *size)
{
    switch (dt) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: *size = 1; return ncclSuccess;
    case ncclFloat16: case ncclBfloat16: *size = 2; return ncclSuccess;
    case ncclInt32: case ncclUint32: case ncclFloat32: *size = 4; return ncclSuccess;
    case ncclInt64: case ncclUint64: case ncclFloat64: *size = 8; return ncclSuccess;
    default: return ncclInvalidArgument;
    }
}

const char *nccl_type_name(ncclDataType_t dt)
{
    static const char *const names[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64",
                                        "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16",
                                        "ncclFloat8e4m3", "ncclFloat8e5m2"};
    return (int)dt >= 0 && (int)dt < (int)ncclNumTypes ? names[dt] : "an unknown datatype";
}

static int weft_type(ncclDataType_t dt, weft_dtype_t *out)
{
    switch (dt) {
    case ncclInt8:     *out = WEFT_INT8; return 1;
    case ncclUint8:    *out = WEFT_UINT8; return 1;
    case ncclInt32:    *out = WEFT_INT32; return 1;
    case ncclUint32:   *out = WEFT_UINT32; return 1;
    case ncclInt64:    *out = WEFT_INT64; return 1;
    case ncclUint64:   *out = WEFT_UINT64; return 1;
    case ncclFloat16:  *out = WEFT_FLOAT16; return 1;
    case ncclBfloat16: *out = WEFT_BFLOAT16; return 1;
    case ncclFloat32:  *out = WEFT_FLOAT32; return 1;
    case ncclFloat64:  *out = WEFT_FLOAT64; return 1;
    default:           return 0;
    }
}

/* NCCL's operator order differs from weft's (Max before Min). */
static weft_op_t weft_op(ncclRedOp_t op)
{
    switch (op) {
    case ncclSum:  return WEFT_SUM;
    case ncclProd: return WEFT_PROD;
    case ncclMax:  return WEFT_MAX;
    case ncclMin:  return WEFT_MIN;
    case ncclAvg:  return WEFT_AVG;
    default:       return WEFT_SUM;   /* PreMulSum: a sum of the scaled inputs */
    }
}

/* The common front: comm ready, datatype known, count * size (times the
 * number of ranks when per_rank) fits size_t; *bytes = count * size. */
static ncclResult_t front(struct ncclComm *c, ncclDataType_t dt, size_t count, int per_rank, size_t *bytes,
                          const char *fn)
{
    ncclResult_t rc = nccl_comm_ready(c, fn);
    size_t size, mult;
    if (rc != ncclSuccess)
        return rc;
    mult = per_rank ? (size_t)c->nranks : 1;
    if (nccl_type_size(dt, &size) != ncclSuccess)
        return nccl_fail(c, ncclInvalidArgument, fn, "datatype %d is not an ncclDataType_t", (int)dt);
    if (count > SIZE_MAX / size / mult)
        return nccl_fail(c, ncclInvalidArgument, fn, "count %zu of %s overflows size_t", count, nccl_type_name(dt));
    *bytes = count * size;
    return ncclSuccess;
}

static ncclResult_t need_buf(const struct ncclComm *c, const void *buf, size_t bytes, const char *name, const char *fn)
{
    if (buf == NULL && bytes > 0)
        return nccl_fail(c, ncclInvalidArgument, fn, "%s is NULL with a count > 0", name);
    return ncclSuccess;
}

static ncclResult_t in_range(const struct ncclComm *c, int r, const char *what, const char *fn)
{
    if (r < 0 || r >= c->nranks)
        return nccl_fail(c, ncclInvalidArgument, fn, "%s %d: must be in [0, %d)", what, r, c->nranks);
    return ncclSuccess;
}

static ncclResult_t weft_rc(const struct ncclComm *c, int e, const char *fn)
{
    return e == WEFT_SUCCESS ? ncclSuccess : nccl_from_weft(c, e, fn);
}

/* A copy on the stream (root's own block of broadcast/gather/scatter). */
static ncclResult_t stream_copy(const struct ncclComm *c, void *dst, const void *src, size_t bytes,
                                cudaStream_t stream, const char *fn)
{
    const char *why = NULL;
    const struct nccl_cuda *cu = nccl_cuda(&why);
    cudaError_t e;
    if (bytes == 0 || dst == src)
        return ncclSuccess;
    if (cu == NULL)
        return nccl_fail(c, ncclUnhandledCudaError, fn, "no CUDA: %s", why);
    if ((e = cu->MemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream)) != cudaSuccess)
        return nccl_cuda_fail(c, fn, "cudaMemcpyAsync", e);
    return ncclSuccess;
}

/* A stream being captured into a CUDA graph is refused: weft runs the
 * operation from its progress thread when the stream reaches it, which a
 * graph launched later would not replay (it would wait forever or move
 * nothing). Then the comm's device is made current. */
static ncclResult_t enter(const struct ncclComm *c, struct nccl_devguard *g, cudaStream_t stream, const char *fn)
{
    const struct nccl_cuda *cu = nccl_cuda(NULL);
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cu != NULL && cu->StreamIsCapturing != NULL && cu->StreamIsCapturing(stream, &st) == cudaSuccess &&
        st != cudaStreamCaptureStatusNone)
        return nccl_fail(c, ncclInvalidUsage, fn,
                         "stream %p is being captured into a CUDA graph: weft's operations run from a host "
                         "thread, which a graph cannot replay; call it outside the capture", (void *)stream);
    return nccl_dev_enter(c, g, fn);
}

/* ---- reductions ---- */

enum red_kind { RED_ALLREDUCE, RED_REDUCE_SCATTER, RED_REDUCE };

static void premul_after(void *arg, int ok)
{
    nccl_premul_done(arg, ok);
}

static ncclResult_t reduction(enum red_kind kind, const void *sendbuff, void *recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream, const char *fn)
{
    struct nccl_premul_tmp *tmp = NULL;
    struct nccl_devguard g;
    const void *input = sendbuff;
    size_t bytes, in_count;
    weft_dtype_t wt;
    ncclResult_t rc;
    int e;

    /* reduce_scatter reads nranks blocks of count */
    if ((rc = front(comm, datatype, count, kind == RED_REDUCE_SCATTER, &bytes, fn)) !=
        ncclSuccess)
        return rc;
    in_count = kind == RED_REDUCE_SCATTER ? count * (size_t)comm->nranks : count;
    if (kind == RED_REDUCE && (rc = in_range(comm, root, "root", fn)) != ncclSuccess)
        return rc;
    if ((rc = need_buf(comm, sendbuff, bytes, "sendbuff", fn)) != ncclSuccess ||
        ((kind != RED_REDUCE || comm->rank == root) &&
         (rc = need_buf(comm, recvbuff, bytes, "recvbuff", fn)) != ncclSuccess))
        return rc;
    if (!weft_type(datatype, &wt))
        return nccl_fail(comm, ncclInvalidArgument, fn, "datatype %s: weft reduces int8 .. bfloat16, not the "
                         "float8 types (they may be moved: allgather, broadcast, send/recv, alltoall)",
                         nccl_type_name(datatype));
    if ((rc = nccl_op_check(comm, op, datatype, fn)) != ncclSuccess)
        return rc;
    if ((rc = enter(comm, &g, stream, fn)) != ncclSuccess)
        return rc;
    if ((int)op >= (int)ncclNumOps && in_count > 0 &&
        (rc = nccl_premul_prepare(comm, op, datatype, sendbuff, in_count, stream, &input, &tmp, fn)) != ncclSuccess)
        goto out;
    switch (kind) {
    case RED_ALLREDUCE:
        e = weft_allreduce_on_stream(comm->w, input, recvbuff, count, wt, weft_op(op), stream);
        break;
    case RED_REDUCE_SCATTER:
        e = weft_reduce_scatter_on_stream(comm->w, input, recvbuff, count, wt, weft_op(op), stream);
        break;
    default:
        e = weft_reduce_on_stream(comm->w, input, recvbuff, count, wt, weft_op(op), root, stream);
        break;
    }
    rc = weft_rc(comm, e, fn);
    if (tmp != NULL) {
        if (rc != ncclSuccess)
            nccl_premul_done(tmp, 0);
        else if (nccl_group_after(premul_after, tmp, fn) != ncclSuccess)
            nccl_premul_done(tmp, 0);   /* no room to defer: wait now (correct, slower) */
    }
out:
    nccl_dev_leave(&g);
    return rc;
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return reduction(RED_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, -1, comm, stream, "ncclAllReduce");
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return reduction(RED_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream,
                     "ncclReduceScatter");
}

NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return reduction(RED_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream, "ncclReduce");
}

/* ---- data movement ---- */

/* Allgather (alltoall 0) or alltoall (1): count elements per rank each way. */
static ncclResult_t all_to_all(int alltoall, const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream, const char *fn)
{
    struct nccl_devguard g;
    size_t bytes;
    ncclResult_t rc;
    int e;
    if ((rc = front(comm, datatype, count, 1, &bytes, fn)) != ncclSuccess ||
        (rc = need_buf(comm, sendbuff, bytes, "sendbuff", fn)) != ncclSuccess ||
        (rc = need_buf(comm, recvbuff, bytes, "recvbuff", fn)) != ncclSuccess ||
        (rc = enter(comm, &g, stream, fn)) != ncclSuccess)
        return rc;
    e = alltoall ? weft_alltoall_on_stream(comm->w, sendbuff, recvbuff, bytes, stream)
                 : weft_allgather_on_stream(comm->w, sendbuff, recvbuff, bytes, stream);
    rc = weft_rc(comm, e, fn);
    nccl_dev_leave(&g);
    return rc;
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return all_to_all(0, sendbuff, recvbuff, sendcount, datatype, comm, stream, "ncclAllGather");
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream)
{
    return all_to_all(1, sendbuff, recvbuff, count, datatype, comm, stream, "ncclAlltoAll");
}

static ncclResult_t broadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream, const char *fn)
{
    struct nccl_devguard g;
    size_t bytes;
    ncclResult_t rc;
    if ((rc = front(comm, datatype, count, 0, &bytes, fn)) != ncclSuccess ||
        (rc = in_range(comm, root, "root", fn)) != ncclSuccess ||
        (comm->rank == root && (rc = need_buf(comm, sendbuff, bytes, "sendbuff", fn)) != ncclSuccess) ||
        (rc = need_buf(comm, recvbuff, bytes, "recvbuff", fn)) != ncclSuccess ||
        (rc = enter(comm, &g, stream, fn)) != ncclSuccess)
        return rc;
    /* Queued before the broadcast on the same stream (in a group too: the
     * group's operations wait for the work queued on their streams). */
    if (comm->rank == root)
        rc = stream_copy(comm, recvbuff, sendbuff, bytes, stream, fn);
    if (rc == ncclSuccess)
        rc = weft_rc(comm, weft_bcast_on_stream(comm->w, recvbuff, bytes, root, stream), fn);
    nccl_dev_leave(&g);
    return rc;
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream)
{
    return broadcast(sendbuff, recvbuff, count, datatype, root, comm, stream, "ncclBroadcast");
}

NCCL_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
         cudaStream_t stream)
{
    return broadcast(buff, buff, count, datatype, root, comm, stream, "ncclBcast");
}

/* ---- point to point ---- */

static ncclResult_t p2p(int send, void *buf, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                        cudaStream_t stream, const char *fn)
{
    struct nccl_devguard g;
    size_t bytes;
    ncclResult_t rc;
    int e;
    if ((rc = front(comm, datatype, count, 0, &bytes, fn)) != ncclSuccess ||
        (rc = in_range(comm, peer, "peer", fn)) != ncclSuccess ||
        (rc = need_buf(comm, buf, bytes, send ? "sendbuff" : "recvbuff", fn)) != ncclSuccess ||
        (rc = enter(comm, &g, stream, fn)) != ncclSuccess)
        return rc;
    e = send ? weft_send_on_stream(comm->w, buf, bytes, peer, NCCLW_TAG_P2P, stream)
             : weft_recv_on_stream(comm->w, buf, bytes, peer, NCCLW_TAG_P2P, stream);
    rc = weft_rc(comm, e, fn);
    nccl_dev_leave(&g);
    return rc;
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    return p2p(1, (void *)(uintptr_t)sendbuff, count, datatype, peer, comm, stream, "ncclSend");
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream)
{
    return p2p(0, recvbuff, count, datatype, peer, comm, stream, "ncclRecv");
}

/* Gather (to_root 1) or scatter (0) as one weft group of send/recv; the
 * root's own block is a copy on the stream (none in place). */
static ncclResult_t rooted(int to_root, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream, const char *fn)
{
    struct nccl_devguard g;
    size_t bytes;
    ncclResult_t rc;
    int e = WEFT_SUCCESS, e2, tag = to_root ? NCCLW_TAG_GATHER : NCCLW_TAG_SCATTER;
    int is_root;
    if ((rc = front(comm, datatype, count, 1, &bytes, fn)) != ncclSuccess ||
        (rc = in_range(comm, root, "root", fn)) != ncclSuccess)
        return rc;
    is_root = comm->rank == root;
    if ((rc = need_buf(comm, sendbuff, to_root || is_root ? bytes : 0, "sendbuff", fn)) != ncclSuccess ||
        (rc = need_buf(comm, recvbuff, !to_root || is_root ? bytes : 0, "recvbuff", fn)) != ncclSuccess)
        return rc;
    if (bytes == 0)
        return ncclSuccess;
    if ((rc = enter(comm, &g, stream, fn)) != ncclSuccess)
        return rc;
    if (is_root) {
        char *blocks = to_root ? (char *)recvbuff : (char *)(uintptr_t)sendbuff;
        rc = to_root ? stream_copy(comm, blocks + (size_t)root * bytes, sendbuff, bytes, stream, fn)
                     : stream_copy(comm, recvbuff, blocks + (size_t)root * bytes, bytes, stream, fn);
        if (rc != ncclSuccess)
            goto out;
        if ((e = weft_group_start()) != WEFT_SUCCESS)
            goto out_weft;
        for (int r = 0; r < comm->nranks && e == WEFT_SUCCESS; r++)
            if (r != root)
                e = to_root ? weft_recv_on_stream(comm->w, blocks + (size_t)r * bytes, bytes, r, tag, stream)
                            : weft_send_on_stream(comm->w, blocks + (size_t)r * bytes, bytes, r, tag, stream);
        e2 = weft_group_end();
        if (e == WEFT_SUCCESS)
            e = e2;
    } else {
        e = to_root ? weft_send_on_stream(comm->w, sendbuff, bytes, root, tag, stream)
                    : weft_recv_on_stream(comm->w, recvbuff, bytes, root, tag, stream);
    }
out_weft:
    rc = weft_rc(comm, e, fn);
out:
    nccl_dev_leave(&g);
    return rc;
}

NCCL_API(ncclResult_t, ncclGather, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream)
{
    return rooted(1, sendbuff, recvbuff, count, datatype, root, comm, stream, "ncclGather");
}

NCCL_API(ncclResult_t, ncclScatter, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream)
{
    return rooted(0, sendbuff, recvbuff, count, datatype, root, comm, stream, "ncclScatter");
}
