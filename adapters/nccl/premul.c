/*
 * ncclRedOpCreatePreMulSum: a sum whose every input element is first
 * multiplied, in the datatype, by a scalar (a host value taken at creation,
 * or a device value read at each call). Weft has no such operation, so the
 * multiply happens before the sum, in stream order, with no kernel of its
 * own (works wherever the CUDA runtime does):
 *
 *   stream: copy sendbuf -> pinned host tmp   (cudaMemcpyAsync)
 *           [copy the device scalar -> host]  (ncclScalarDevice)
 *           host function: tmp[i] *= scalar   (cudaLaunchHostFunc)
 *           copy tmp -> device tmp            (cudaMemcpyAsync)
 *           the SUM collective from device tmp (weft, queued after these)
 *           host function: mark tmp done      (after the collective: at
 *                                              once, or at the group's end)
 *
 * The buffers are freed by a later call on the comm (or its destroy) once
 * marked done: a host function may not call CUDA itself. Half and bfloat16
 * are multiplied in float and rounded to nearest-even: the product of two
 * such values is exact in float, so this is the correctly rounded product.
 * Slower than NCCL's fused pre-multiply (two copies through the host); the
 * common use, gradient scaling by 1/nranks, is ncclAvg, which weft does
 * natively.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_adapter.h"

struct nccl_premul_tmp {
    struct nccl_premul_tmp *next;
    ncclDataType_t dtype;
    size_t         count, bytes;
    unsigned char *host;        /* pinned: count elements, then the scalar */
    void          *dev;
    cudaStream_t   stream;
    int            done;        /* atomic: the collective reading dev finished, or never started */
};

static size_t scalar_offset(size_t bytes)
{
    return (bytes + 15) & ~(size_t)15;
}

/* ---- binary16 / bfloat16 <-> float, round to nearest-even ---- */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | (man << 13);
    else
        bits = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static uint16_t float_to_half(float f)
{
    uint32_t x, sign, mant;
    int exp;
    memcpy(&x, &f, sizeof(x));
    sign = (x >> 16) & 0x8000;
    exp = (int)((x >> 23) & 0xff);
    mant = x & 0x7fffff;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    exp = exp - 127 + 15;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        /* subnormal half (or zero): shift with round-to-nearest-even */
        uint32_t m, shift, rem, half, r;
        if (exp < -10)
            return (uint16_t)sign;
        m = mant | 0x800000;
        shift = (uint32_t)(14 - exp);
        r = m >> shift;
        rem = m & ((1u << shift) - 1);
        half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    {
        uint32_t r = (uint32_t)exp << 10 | (mant >> 13), rem = mant & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (r & 1)))
            r++;   /* may carry into the exponent: still right (to infinity at most) */
        return (uint16_t)(sign | r);
    }
}

static float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffff))
        return (uint16_t)((x >> 16) | 0x40);   /* NaN stays NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* Integers wrap (two's complement), computed unsigned: no overflow UB. */
#define SCALE_INT(T, UT)                                                                 \
    do {                                                                                 \
        T *v = (T *)t->host, s;                                                          \
        memcpy(&s, sc, sizeof(s));                                                       \
        for (size_t i = 0; i < t->count; i++)                                            \
            v[i] = (T)((UT)v[i] * (UT)s);                                                \
    } while (0)

static void premul_host(void *arg)
{
    struct nccl_premul_tmp *t = arg;
    const unsigned char *sc = t->host + scalar_offset(t->bytes);
    switch (t->dtype) {
    case ncclInt8:    SCALE_INT(int8_t, uint8_t); break;
    case ncclUint8:   SCALE_INT(uint8_t, uint8_t); break;
    case ncclInt32:   SCALE_INT(int32_t, uint32_t); break;
    case ncclUint32:  SCALE_INT(uint32_t, uint32_t); break;
    case ncclInt64:   SCALE_INT(int64_t, uint64_t); break;
    case ncclUint64:  SCALE_INT(uint64_t, uint64_t); break;
    case ncclFloat32: {
        float *v = (float *)t->host, s;
        memcpy(&s, sc, sizeof(s));
        for (size_t i = 0; i < t->count; i++)
            v[i] *= s;
        break;
    }
    case ncclFloat64: {
        double *v = (double *)t->host, s;
        memcpy(&s, sc, sizeof(s));
        for (size_t i = 0; i < t->count; i++)
            v[i] *= s;
        break;
    }
    case ncclFloat16: {
        uint16_t *v = (uint16_t *)t->host, s16;
        float s;
        memcpy(&s16, sc, sizeof(s16));
        s = half_to_float(s16);
        for (size_t i = 0; i < t->count; i++)
            v[i] = float_to_half(half_to_float(v[i]) * s);
        break;
    }
    case ncclBfloat16: {
        uint16_t *v = (uint16_t *)t->host, s16;
        float s;
        memcpy(&s16, sc, sizeof(s16));
        s = bf16_to_float(s16);
        for (size_t i = 0; i < t->count; i++)
            v[i] = float_to_bf16(bf16_to_float(v[i]) * s);
        break;
    }
    default:
        break;   /* refused at creation */
    }
}

static void mark_done_host(void *arg)
{
    struct nccl_premul_tmp *t = arg;
    __atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
}

static int premul_dtype_ok(ncclDataType_t dt)
{
    return dt >= ncclInt8 && dt <= ncclBfloat16;   /* not the float8 types: weft cannot sum them */
}

NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
         ncclScalarResidence_t residence, ncclComm_t comm)
{
    const char *fn = "ncclRedOpCreatePreMulSum";
    struct nccl_premul_op *slot = NULL;
    ncclResult_t rc;
    size_t size;
    int idx = -1;

    if ((rc = nccl_comm_ready(comm, fn)) != ncclSuccess)
        return rc;
    if (op == NULL || scalar == NULL)
        return nccl_fail(comm, ncclInvalidArgument, fn, "%s is NULL", op == NULL ? "op" : "scalar");
    if (!premul_dtype_ok(datatype))
        return nccl_fail(comm, ncclInvalidArgument, fn, "datatype %s (%d): weft sums int8 .. bfloat16, not it",
                         nccl_type_name(datatype), (int)datatype);
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
        return nccl_fail(comm, ncclInvalidArgument, fn, "residence %d: expected ncclScalarDevice or "
                         "ncclScalarHostImmediate", (int)residence);
    nccl_type_size(datatype, &size);
    pthread_mutex_lock(&comm->mu);
    for (int i = 0; i < comm->nops; i++)
        if (!comm->ops[i].in_use) {
            idx = i;
            break;
        }
    if (idx < 0) {
        struct nccl_premul_op *ops;
        if ((int)ncclNumOps + comm->nops + 1 > (int)ncclMaxRedOp ||
            (ops = realloc(comm->ops, (size_t)(comm->nops + 1) * sizeof(*ops))) == NULL) {
            pthread_mutex_unlock(&comm->mu);
            return nccl_fail(comm, ncclSystemError, fn, "out of memory for the operator table");
        }
        comm->ops = ops;
        idx = comm->nops++;
    }
    slot = &comm->ops[idx];
    memset(slot, 0, sizeof(*slot));
    slot->in_use = 1;
    slot->dtype = datatype;
    slot->residence = residence;
    if (residence == ncclScalarHostImmediate)
        memcpy(slot->scalar, scalar, size);
    else
        slot->dev_scalar = scalar;
    pthread_mutex_unlock(&comm->mu);
    *op = (ncclRedOp_t)((int)ncclNumOps + idx);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm)
{
    const char *fn = "ncclRedOpDestroy";
    ncclResult_t rc;
    int idx = (int)op - (int)ncclNumOps;
    if ((rc = nccl_comm_ready(comm, fn)) != ncclSuccess)
        return rc;
    pthread_mutex_lock(&comm->mu);
    if ((int)op < (int)ncclNumOps || idx >= comm->nops || !comm->ops[idx].in_use) {
        pthread_mutex_unlock(&comm->mu);
        return nccl_fail(comm, ncclInvalidArgument, fn, "op %d is not a live operator of this comm%s", (int)op,
                         (int)op < (int)ncclNumOps ? " (a built-in operator)" : "");
    }
    comm->ops[idx].in_use = 0;
    pthread_mutex_unlock(&comm->mu);
    return ncclSuccess;
}

ncclResult_t nccl_op_check(const struct ncclComm *c, ncclRedOp_t op, ncclDataType_t dt, const char *fn)
{
    int idx = (int)op - (int)ncclNumOps;
    ncclResult_t rc = ncclSuccess;
    if ((int)op >= 0 && (int)op < (int)ncclNumOps)
        return ncclSuccess;
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    if ((int)op < 0 || idx >= c->nops || !c->ops[idx].in_use)
        rc = nccl_fail(c, ncclInvalidArgument, fn, "op %d is neither a built-in operator nor a live "
                       "ncclRedOpCreatePreMulSum operator of this comm", (int)op);
    else if (c->ops[idx].dtype != dt)
        rc = nccl_fail(c, ncclInvalidArgument, fn, "op %d was created for %s, the call is on %s", (int)op,
                       nccl_type_name(c->ops[idx].dtype), nccl_type_name(dt));
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
    return rc;
}

void nccl_premul_reap(struct ncclComm *c, int all)
{
    const struct nccl_cuda *cu = nccl_cuda(NULL);
    struct nccl_premul_tmp **pp, *t, *done = NULL;
    if (cu == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    for (pp = &c->tmps; (t = *pp) != NULL;) {
        if (all || __atomic_load_n(&t->done, __ATOMIC_ACQUIRE)) {
            *pp = t->next;
            t->next = done;
            done = t;
        } else {
            pp = &t->next;
        }
    }
    pthread_mutex_unlock(&c->mu);
    while ((t = done) != NULL) {
        done = t->next;
        if (!__atomic_load_n(&t->done, __ATOMIC_ACQUIRE))
            cu->StreamSynchronize(t->stream);   /* destroy: weft has run or dropped the sum by now */
        cu->Free(t->dev);
        cu->FreeHost(t->host);
        free(t);
    }
}

ncclResult_t nccl_premul_prepare(struct ncclComm *c, ncclRedOp_t op, ncclDataType_t dt, const void *sendbuf,
                                 size_t count, cudaStream_t stream, const void **input,
                                 struct nccl_premul_tmp **tmp_out, const char *fn)
{
    const char *why = NULL;
    const struct nccl_cuda *cu = nccl_cuda(&why);
    struct nccl_premul_op o;
    struct nccl_premul_tmp *t;
    size_t size, off;
    cudaError_t e;
    const char *call = "";

    if (cu == NULL)
        return nccl_fail(c, ncclUnhandledCudaError, fn, "no CUDA: %s", why);
    nccl_premul_reap(c, 0);
    pthread_mutex_lock(&c->mu);
    o = c->ops[(int)op - (int)ncclNumOps];   /* checked by nccl_op_check */
    pthread_mutex_unlock(&c->mu);
    nccl_type_size(dt, &size);
    if ((t = calloc(1, sizeof(*t))) == NULL)
        return nccl_fail(c, ncclSystemError, fn, "out of memory");
    t->dtype = dt;
    t->count = count;
    t->bytes = count * size;
    t->stream = stream;
    off = scalar_offset(t->bytes);
    if ((e = cu->MallocHost((void **)&t->host, off + 16)) != cudaSuccess) {
        call = "cudaMallocHost";
        goto err_free;
    }
    if ((e = cu->Malloc(&t->dev, t->bytes)) != cudaSuccess) {
        call = "cudaMalloc";
        goto err_host;
    }
    if (o.residence == ncclScalarHostImmediate)
        memcpy(t->host + off, o.scalar, size);
    if ((e = cu->MemcpyAsync(t->host, sendbuf, t->bytes, cudaMemcpyDefault, stream)) != cudaSuccess) {
        call = "cudaMemcpyAsync (input to host)";
        goto err_dev;
    }
    if (o.residence == ncclScalarDevice &&
        (e = cu->MemcpyAsync(t->host + off, o.dev_scalar, size, cudaMemcpyDefault, stream)) != cudaSuccess) {
        call = "cudaMemcpyAsync (device scalar to host)";
        goto err_sync;
    }
    if ((e = cu->LaunchHostFunc(stream, premul_host, t)) != cudaSuccess) {
        call = "cudaLaunchHostFunc";
        goto err_sync;
    }
    if ((e = cu->MemcpyAsync(t->dev, t->host, t->bytes, cudaMemcpyDefault, stream)) != cudaSuccess) {
        call = "cudaMemcpyAsync (scaled input to device)";
        goto err_sync;
    }
    pthread_mutex_lock(&c->mu);
    t->next = c->tmps;
    c->tmps = t;
    pthread_mutex_unlock(&c->mu);
    *input = t->dev;
    *tmp_out = t;
    return ncclSuccess;

err_sync:
    cu->StreamSynchronize(stream);   /* copies already queued read or write the buffers */
err_dev:
    cu->Free(t->dev);
err_host:
    cu->FreeHost(t->host);
err_free:
    free(t);
    return nccl_cuda_fail(c, fn, call, e);
}

void nccl_premul_done(struct nccl_premul_tmp *t, int ok)
{
    const struct nccl_cuda *cu = nccl_cuda(NULL);
    if (ok && cu != NULL && cu->LaunchHostFunc(t->stream, mark_done_host, t) == cudaSuccess)
        return;
    /* Nothing was queued after the copies (or the marker could not be):
     * the buffers may go once the stream passes the copies; the reaper
     * synchronises the stream first since done stays 0 -- except here,
     * where the comm may live on: wait for the copies now. */
    if (cu != NULL)
        cu->StreamSynchronize(t->stream);
    __atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
}
