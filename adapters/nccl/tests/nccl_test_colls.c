/*
 * The NCCL API of weft's libnccl.so.2, call by call (issue 16): written
 * against NCCL's nccl.h only, linked with -lnccl, run by mpirun over the
 * emulated CUDA runtime (one rank per process, device rank % 2).
 *
 * Covers: version and error strings; communicator init (blocking,
 * non-blocking, in a group with two ranks per process, InitAll, the
 * scalable call), queries, split, finalize, destroy; every collective and
 * send/recv, every datatype and every op (PreMulSum with host and device
 * scalars), in place and out of place, counts 0, 1, 1001 and one 64 MiB
 * allreduce/allgather; groups; registration and ncclMemAlloc; argument
 * errors and the calls weft refuses. Data is checked exactly against a host
 * reference (small integer inputs make every float sum and product exact).
 *
 * Arguments: [--id-file PATH] to pass unique ids through files instead of
 * MPI_Bcast. NCCL_TEST_BIG=0 skips the 64 MiB calls.
 * Prints one line per failed check and, on rank 0, "N checks, M failed".
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <pthread.h>
#include <stdint.h>

#include "nccl_test_util.h"

static ncclComm_t g_comm;
static cudaStream_t g_stream;
static int g_dev;
static int g_trace;

/* NCCL_TEST_SKIP: a comma-separated list of parts not to run (for chasing
 * one failure; the ctest entries run everything). */
static int skipped(const char *part)
{
    const char *l = getenv("NCCL_TEST_SKIP");
    if (l == NULL)
        return 0;
    size_t n = strlen(part);
    for (const char *p = l; (p = strstr(p, part)) != NULL; p += n)
        if ((p == l || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}   /* NCCL_TEST_TRACE: one line per collective before it is called */

/* ---- values ---- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* Rank r's i-th input: small integers, so that every sum, product, average
 * (over 2 or 4 ranks) and pre-multiplied sum is exact in every type. */
static double gen(ncclDataType_t t, int forprod, int r, size_t i, int salt)
{
    uint64_t h = mix(((uint64_t)(unsigned)r << 40) ^ ((uint64_t)i << 8) ^ (uint64_t)(unsigned)salt);
    if (forprod) {
        static const double s[] = {1, 2, -1};
        return s[h % (tu_type_unsigned(t) ? 2 : 3)];
    }
    return tu_type_unsigned(t) ? (double)(h % 8) : (double)(h % 8) - 3;
}

/* Byte pattern of rank r at byte j for the calls that only move data. */
static uint8_t pat(int r, size_t j, int salt)
{
    return (uint8_t)(r * 37 + j * 13 + (j >> 8) * 5 + (size_t)salt * 11);
}

enum { OP_SUM = 0, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_PREMUL_HOST, OP_PREMUL_DEV, OP_KINDS };
static const char *op_name(int k)
{
    static const char *n[] = {"sum", "prod", "max", "min", "avg", "premulsum(host)", "premulsum(device)"};
    return n[k];
}
static double premul_scalar(ncclDataType_t t)
{
    return tu_type_float(t) ? 1.5 : 3;
}

/* The host reference of element i of a reduction over n ranks. */
static double ref_combine(ncclDataType_t t, int opk, int n, size_t i, int salt, double scalar)
{
    int forprod = opk == OP_PROD;
    double acc = gen(t, forprod, 0, i, salt);
    if (opk >= OP_PREMUL_HOST)
        acc *= scalar;
    for (int r = 1; r < n; r++) {
        double v = gen(t, forprod, r, i, salt);
        switch (opk) {
        case OP_SUM: case OP_AVG: acc += v; break;
        case OP_PROD: acc *= v; break;
        case OP_MAX: acc = v > acc ? v : acc; break;
        case OP_MIN: acc = v < acc ? v : acc; break;
        default: acc += v * scalar; break;
        }
    }
    if (opk == OP_AVG) {
        if (tu_type_float(t))
            acc /= n;
        else
            acc = (double)((long long)acc / n);   /* integers: truncated toward zero */
    }
    return acc;
}

/* ---- reductions: allreduce, reduce, reduce_scatter ---- */

enum { K_ALLREDUCE, K_REDUCE, K_REDUCE_SCATTER };
static const char *kind_name(int k)
{
    static const char *n[] = {"ncclAllReduce", "ncclReduce", "ncclReduceScatter"};
    return n[k];
}

/* One reduction of count elements (per rank's result) with the reference check. */
static void run_reduction(ncclComm_t comm, cudaStream_t s, int rank, int n, int kind, ncclDataType_t t, int opk,
                          size_t count, int inplace, int root, int salt)
{
    size_t mark = tu_arena_mark();
    size_t es = tu_type_size(t);
    size_t send_elems = kind == K_REDUCE_SCATTER ? count * n : count;
    size_t recv_elems = count;
    double scalar = premul_scalar(t);
    int forprod = opk == OP_PROD;

    unsigned char *hsend = tu_xmalloc(send_elems * es), *hrecv = tu_xmalloc(recv_elems * es);
    for (size_t i = 0; i < send_elems; i++)
        tu_encode(t, gen(t, forprod, rank, i, salt), hsend + i * es);

    unsigned char *dsend = tu_dmalloc(send_elems * es), *drecv;
    tu_h2d(dsend, hsend, send_elems * es);
    if (inplace) {
        drecv = kind == K_REDUCE_SCATTER ? dsend + (size_t)rank * count * es : dsend;
    } else {
        drecv = tu_dmalloc(recv_elems * es);
        memset(hrecv, 0x5a, recv_elems * es);
        tu_h2d(drecv, hrecv, recv_elems * es);
    }

    ncclRedOp_t op = (ncclRedOp_t)opk;
    void *dscalar = NULL;
    unsigned char hscalar[8];
    tu_encode(t, scalar, hscalar);
    if (opk == OP_PREMUL_HOST) {
        if (!NCHECK(ncclRedOpCreatePreMulSum(&op, hscalar, t, ncclScalarHostImmediate, comm)))
            goto out;
    } else if (opk == OP_PREMUL_DEV) {
        dscalar = tu_dmalloc(es);
        tu_h2d(dscalar, hscalar, es);
        if (!NCHECK(ncclRedOpCreatePreMulSum(&op, dscalar, t, ncclScalarDevice, comm)))
            goto out;
    }

    char what[160];
    snprintf(what, sizeof(what), "%s %s %s count %zu %s root %d", kind_name(kind), tu_type_name(t), op_name(opk),
             count, inplace ? "in place" : "out of place", root);
    if (g_trace) {
        printf("rank %d: %s\n", rank, what);
        fflush(stdout);
    }
    ncclResult_t r;
    if (kind == K_ALLREDUCE)
        r = ncclAllReduce(dsend, drecv, count, t, op, comm, s);
    else if (kind == K_REDUCE)
        r = ncclReduce(dsend, drecv, count, t, op, root, comm, s);
    else
        r = ncclReduceScatter(dsend, drecv, count, t, op, comm, s);
    if (CHECK(r == ncclSuccess, what, "expected ncclSuccess, got %s (%s)", tu_res_name(r), ncclGetLastError(comm)) &&
        tu_sync(s)) {
        tu_d2h(hrecv, drecv, recv_elems * es);
        int check_data = kind != K_REDUCE || rank == root;
        size_t bad = 0, first = 0;
        double want0 = 0, got0 = 0;
        for (size_t i = 0; i < recv_elems; i++) {
            double got = tu_decode(t, hrecv + i * es), want;
            if (check_data) {
                size_t gi = kind == K_REDUCE_SCATTER ? (size_t)rank * count + i : i;
                unsigned char enc[8];
                /* the reference as the type stores it */
                tu_encode(t, ref_combine(t, opk, n, gi, salt, scalar), enc);
                want = tu_decode(t, enc);
            } else {
                /* a non-root's buffer: NCCL leaves it unspecified in place; out of place it is untouched */
                if (inplace)
                    continue;
                unsigned char sent[8];
                memset(sent, 0x5a, sizeof(sent));
                want = tu_decode(t, sent);
                if (memcmp(hrecv + i * es, sent, es) == 0)
                    continue;
            }
            if (!(got == want) && !bad++) {
                first = i;
                want0 = want;
                got0 = got;
            }
        }
        CHECK(bad == 0, what, "%zu wrong elements; first at %zu: expected %g, got %g", bad, first, want0, got0);
    }
    if (opk >= OP_PREMUL_HOST)
        NCHECK(ncclRedOpDestroy(op, comm));
out:
    if (dscalar)
        tu_dfree(dscalar);
    if (!inplace)
        tu_dfree(drecv);
    tu_dfree(dsend);
    free(hsend);
    free(hrecv);
    tu_arena_release(mark);
}

static void test_reductions(int rank, int n)
{
    tu_set_section("allreduce matrix");
    int salt = 1;
    for (int ti = 0; ti < TU_NREDTYPES; ti++)
        for (int opk = 0; opk < OP_KINDS; opk++)
            for (int inplace = 0; inplace < 2; inplace++)
                run_reduction(g_comm, g_stream, rank, n, K_ALLREDUCE, tu_red_types[ti], opk, 1001, inplace, 0,
                              salt++);
    /* counts 0 and 1 */
    for (int inplace = 0; inplace < 2; inplace++)
        for (size_t c = 0; c < 2; c++) {
            run_reduction(g_comm, g_stream, rank, n, K_ALLREDUCE, ncclFloat32, OP_SUM, c, inplace, 0, salt++);
            run_reduction(g_comm, g_stream, rank, n, K_ALLREDUCE, ncclInt64, OP_MAX, c, inplace, 0, salt++);
        }

    tu_set_section("reduce / reduce_scatter");
    for (int kind = K_REDUCE; kind <= K_REDUCE_SCATTER; kind++) {
        if (skipped(kind == K_REDUCE ? "reduce" : "reduce_scatter"))
            continue;
        /* every reducible type with sum, every op with int32, float and bf16 */
        for (int ti = 0; ti < TU_NREDTYPES; ti++)
            for (int inplace = 0; inplace < 2; inplace++)
                run_reduction(g_comm, g_stream, rank, n, kind, tu_red_types[ti], OP_SUM, 1001, inplace,
                              (ti + inplace) % n, salt++);
        static const ncclDataType_t some[] = {ncclInt32, ncclFloat32, ncclBfloat16, ncclUint8};
        for (int ti = 0; ti < 4; ti++)
            for (int opk = 1; opk < OP_KINDS; opk++)
                run_reduction(g_comm, g_stream, rank, n, kind, some[ti], opk, 1001, opk & 1, (opk + ti) % n, salt++);
        for (size_t c = 0; c < 2; c++)
            for (int inplace = 0; inplace < 2; inplace++)
                run_reduction(g_comm, g_stream, rank, n, kind, ncclFloat64, OP_SUM, c, inplace, n - 1, salt++);
    }

    /* Reduce with recvbuff NULL on the non-roots (NCCL: "recvbuff may be NULL on all calls except for root"). */
    tu_set_section("reduce, NULL recvbuff on non-roots");
    {
        size_t count = 257;
        float *h = tu_xmalloc(count * sizeof(float));
        for (size_t i = 0; i < count; i++)
            h[i] = (float)(rank + (int)i % 5);
        float *d = tu_dmalloc(count * sizeof(float)), *dr = rank == 0 ? tu_dmalloc(count * sizeof(float)) : NULL;
        tu_h2d(d, h, count * sizeof(float));
        if (NCHECK(ncclReduce(d, dr, count, ncclFloat32, ncclSum, 0, g_comm, g_stream)) && tu_sync(g_stream) &&
            rank == 0) {
            tu_d2h(h, dr, count * sizeof(float));
            size_t bad = 0;
            for (size_t i = 0; i < count; i++)
                bad += h[i] != (float)(n * (n - 1) / 2 + n * ((int)i % 5));
            CHECK(bad == 0, "ncclReduce with NULL recvbuff on non-roots", "0 wrong elements, got %zu", bad);
        }
        tu_dfree(d);
        if (dr)
            tu_dfree(dr);
        free(h);
    }
}

/* ---- calls that move data only ---- */

enum { M_ALLGATHER, M_BROADCAST, M_BCAST, M_ALLTOALL, M_GATHER, M_SCATTER, M_KINDS };
static const char *move_name(int k)
{
    static const char *n[] = {"ncclAllGather", "ncclBroadcast", "ncclBcast", "ncclAlltoAll", "ncclGather",
                              "ncclScatter"};
    return n[k];
}

static void run_move(ncclComm_t comm, cudaStream_t s, int rank, int n, int kind, ncclDataType_t t, size_t count,
                     int inplace, int root, int salt)
{
    size_t mark = tu_arena_mark();
    size_t es = tu_type_size(t), B = count * es;   /* bytes of one rank's block */
    size_t send_bytes, recv_bytes;
    switch (kind) {
    case M_ALLGATHER: send_bytes = B; recv_bytes = B * n; break;
    case M_ALLTOALL: send_bytes = B * n; recv_bytes = B * n; break;
    case M_GATHER: send_bytes = B; recv_bytes = B * n; break;
    case M_SCATTER: send_bytes = B * n; recv_bytes = B; break;
    default: send_bytes = B; recv_bytes = B; break;
    }
    unsigned char *hsend = tu_xmalloc(send_bytes), *hrecv = tu_xmalloc(recv_bytes), *want = tu_xmalloc(recv_bytes);
    /* inputs */
    for (size_t j = 0; j < send_bytes; j++)
        hsend[j] = pat(rank, j, salt);
    memset(hrecv, 0xc3, recv_bytes);
    /* expected output (default: untouched) */
    memcpy(want, hrecv, recv_bytes);
    switch (kind) {
    case M_ALLGATHER:
        for (int b = 0; b < n; b++)
            for (size_t j = 0; j < B; j++)
                want[b * B + j] = pat(b, j, salt);
        break;
    case M_BROADCAST: case M_BCAST:
        for (size_t j = 0; j < B; j++)
            want[j] = pat(root, j, salt);
        break;
    case M_ALLTOALL:
        for (int b = 0; b < n; b++)
            for (size_t j = 0; j < B; j++)
                want[b * B + j] = pat(b, rank * B + j, salt);
        break;
    case M_GATHER:
        if (rank == root)
            for (int b = 0; b < n; b++)
                for (size_t j = 0; j < B; j++)
                    want[b * B + j] = pat(b, j, salt);
        break;
    case M_SCATTER:
        for (size_t j = 0; j < B; j++)
            want[j] = pat(root, rank * B + j, salt);
        break;
    }

    unsigned char *dsend = NULL, *drecv = NULL, *dalloc = NULL, *dalloc2 = NULL;
    if (!inplace) {
        dsend = dalloc = tu_dmalloc(send_bytes);
        drecv = dalloc2 = tu_dmalloc(recv_bytes);
        tu_h2d(dsend, hsend, send_bytes);
        tu_h2d(drecv, hrecv, recv_bytes);
    } else {
        /* NCCL's in-place forms */
        switch (kind) {
        case M_ALLGATHER:   /* sendbuff == recvbuff + rank * sendcount */
            drecv = dalloc = tu_dmalloc(recv_bytes);
            dsend = drecv + rank * B;
            memcpy(hrecv + rank * B, hsend, B);
            tu_h2d(drecv, hrecv, recv_bytes);
            break;
        case M_BROADCAST: case M_BCAST:   /* sendbuff == recvbuff */
            drecv = dsend = dalloc = tu_dmalloc(B);
            if (rank == root) {
                tu_h2d(drecv, hsend, B);
            } else {
                tu_h2d(drecv, hrecv, B);
            }
            break;
        case M_GATHER:   /* at the root sendbuff == recvbuff + root * count */
            drecv = dalloc = tu_dmalloc(B * n);
            if (rank == root) {
                dsend = drecv + root * B;
                memcpy(hrecv + root * B, hsend, B);
                memcpy(want + root * B, hsend, B);
            } else {
                dsend = dalloc2 = tu_dmalloc(B);
                tu_h2d(dsend, hsend, B);
            }
            tu_h2d(drecv, hrecv, B * n);
            break;
        case M_SCATTER:   /* at the root recvbuff == sendbuff + root * count */
            dsend = dalloc = tu_dmalloc(B * n);
            tu_h2d(dsend, hsend, B * n);
            if (rank == root) {
                drecv = dsend + root * B;
            } else {
                drecv = dalloc2 = tu_dmalloc(B);
                tu_h2d(drecv, hrecv, B);
            }
            break;
        default:
            FATAL("no in-place form of %s", move_name(kind));
        }
    }

    char what[160];
    snprintf(what, sizeof(what), "%s %s count %zu %s root %d", move_name(kind), tu_type_name(t), count,
             inplace ? "in place" : "out of place", root);
    if (g_trace) {
        printf("rank %d: %s\n", rank, what);
        fflush(stdout);
    }
    ncclResult_t r = ncclInternalError;
    switch (kind) {
    case M_ALLGATHER: r = ncclAllGather(dsend, drecv, count, t, comm, s); break;
    case M_BROADCAST: r = ncclBroadcast(dsend, drecv, count, t, root, comm, s); break;
    case M_BCAST: r = ncclBcast(drecv, count, t, root, comm, s); break;
    case M_ALLTOALL: r = ncclAlltoAll(dsend, drecv, count, t, comm, s); break;
    case M_GATHER: r = ncclGather(dsend, drecv, count, t, root, comm, s); break;
    case M_SCATTER: r = ncclScatter(dsend, drecv, count, t, root, comm, s); break;
    }
    if (CHECK(r == ncclSuccess, what, "expected ncclSuccess, got %s (%s)", tu_res_name(r), ncclGetLastError(comm)) &&
        tu_sync(s)) {
        size_t rb = recv_bytes;
        tu_d2h(hrecv, drecv, rb);
        size_t bad = 0, first = 0;
        for (size_t j = 0; j < rb; j++)
            if (hrecv[j] != want[j] && !bad++)
                first = j;
        CHECK(bad == 0, what, "%zu wrong bytes; first at %zu: expected 0x%02x, got 0x%02x", bad, first,
              bad ? want[first] : 0, bad ? hrecv[first] : 0);
    }
    if (dalloc)
        tu_dfree(dalloc);
    if (dalloc2)
        tu_dfree(dalloc2);
    free(hsend);
    free(hrecv);
    free(want);
    tu_arena_release(mark);
}

static void test_moves(int rank, int n)
{
    tu_set_section("data movement");
    int salt = 1000;
    static const size_t counts[] = {0, 1, 1001};
    for (int kind = 0; kind < M_KINDS; kind++)
        for (int ti = 0; ti < TU_NTYPES; ti++)
            for (int ci = 0; ci < 3; ci++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    if (kind == M_ALLTOALL && inplace)
                        continue;   /* NCCL has no in-place all-to-all */
                    if (kind == M_BCAST)
                        continue;   /* one buffer: test_bcast checks it */
                    /* the full type list at 1001; counts 0 and 1 on a few types */
                    if (counts[ci] != 1001 && ti % 4 != 0)
                        continue;
                    int root = (ti + ci + inplace) % n;
                    run_move(g_comm, g_stream, rank, n, kind, tu_all_types[ti], counts[ci], inplace, root, salt++);
                }
}

/* ncclBcast, checked on its own: one buffer, the root's data everywhere. */
static void test_bcast(int rank, int n)
{
    tu_set_section("ncclBcast");
    static const size_t counts[] = {0, 1, 1001};
    for (int ti = 0; ti < TU_NTYPES; ti += 3)
        for (int ci = 0; ci < 3; ci++) {
            ncclDataType_t t = tu_all_types[ti];
            size_t B = counts[ci] * tu_type_size(t);
            int root = (ti + ci) % n, salt = 2000 + ti * 3 + ci;
            unsigned char *h = tu_xmalloc(B + 16);
            for (size_t j = 0; j < B + 16; j++)
                h[j] = rank == root ? pat(root, j, salt) : 0xe1;
            unsigned char *d = tu_dmalloc(B + 16);
            tu_h2d(d, h, B + 16);
            char what[128];
            snprintf(what, sizeof(what), "ncclBcast %s count %zu root %d", tu_type_name(t), counts[ci], root);
            if (NCHECK(ncclBcast(d, counts[ci], t, root, g_comm, g_stream)) && tu_sync(g_stream)) {
                tu_d2h(h, d, B + 16);
                size_t bad = 0;
                for (size_t j = 0; j < B; j++)
                    bad += h[j] != pat(root, j, salt);
                for (size_t j = B; j < B + 16; j++)   /* nothing past count */
                    bad += h[j] != (rank == root ? pat(root, j, salt) : 0xe1);
                CHECK(bad == 0, what, "0 wrong bytes, got %zu", bad);
            }
            tu_dfree(d);
            free(h);
        }
}

/* ---- send/recv and groups ---- */

static void test_p2p_groups(int rank, int n)
{
    tu_set_section("send/recv ring in a group");
    size_t count = 1001, B = count * sizeof(float);
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    unsigned char *h = tu_xmalloc(4 * B), *want = tu_xmalloc(B);
    unsigned char *a = tu_dmalloc(B), *b = tu_dmalloc(B), *x = tu_dmalloc(B), *y = tu_dmalloc(B);
    for (size_t j = 0; j < B; j++) {
        h[j] = pat(rank, j, 1);
        h[B + j] = pat(rank, j, 2);
    }
    tu_h2d(a, h, B);
    tu_h2d(b, h + B, B);
    /* Two messages to the same peer: they match in call order. */
    NCHECK(ncclGroupStart());
    NCHECK(ncclSend(a, count, ncclFloat32, next, g_comm, g_stream));
    NCHECK(ncclRecv(x, count, ncclFloat32, prev, g_comm, g_stream));
    NCHECK(ncclSend(b, count, ncclFloat32, next, g_comm, g_stream));
    NCHECK(ncclRecv(y, count, ncclFloat32, prev, g_comm, g_stream));
    if (NCHECK(ncclGroupEnd()) && tu_sync(g_stream)) {
        tu_d2h(h + 2 * B, x, B);
        tu_d2h(h + 3 * B, y, B);
        size_t badx = 0, bady = 0;
        for (size_t j = 0; j < B; j++) {
            badx += h[2 * B + j] != pat(prev, j, 1);
            bady += h[3 * B + j] != pat(prev, j, 2);
        }
        CHECK(badx == 0, "ring: first message from prev", "0 wrong bytes, got %zu", badx);
        CHECK(bady == 0, "ring: second message from prev (call order)", "0 wrong bytes, got %zu", bady);
    }

    tu_set_section("send/recv to self and count 0");
    NCHECK(ncclGroupStart());
    NCHECK(ncclSend(a, count, ncclFloat32, rank, g_comm, g_stream));
    NCHECK(ncclRecv(y, count, ncclFloat32, rank, g_comm, g_stream));
    NCHECK(ncclSend(a, 0, ncclFloat32, next, g_comm, g_stream));
    NCHECK(ncclRecv(x, 0, ncclFloat32, prev, g_comm, g_stream));
    if (NCHECK(ncclGroupEnd()) && tu_sync(g_stream)) {
        tu_d2h(h + 3 * B, y, B);
        CHECK(memcmp(h + 3 * B, h, B) == 0, "send/recv to self", "the data sent, got other bytes");
        tu_d2h(h + 2 * B, x, B);
        size_t bad = 0;
        for (size_t j = 0; j < B; j++)
            bad += h[2 * B + j] != pat(prev, j, 1);
        CHECK(bad == 0, "count-0 recv leaves the buffer alone", "0 changed bytes, got %zu", bad);
    }

    tu_set_section("several collectives in one group (nested group)");
    {
        int32_t *hi = tu_xmalloc(count * 4);
        for (size_t i = 0; i < count; i++)
            hi[i] = rank * 3 + (int)i;
        int32_t *di = tu_dmalloc(count * 4), *dio = tu_dmalloc(count * 4);
        tu_h2d(di, hi, count * 4);
        unsigned char *dag = tu_dmalloc(B * n), *dbc = tu_dmalloc(B);
        tu_h2d(dbc, h, B);   /* every rank's own bytes; the root's win */
        NCHECK(ncclGroupStart());
        NCHECK(ncclGroupStart());   /* nesting: only the outermost end launches */
        NCHECK(ncclAllReduce(di, dio, count, ncclInt32, ncclSum, g_comm, g_stream));
        NCHECK(ncclGroupEnd());
        NCHECK(ncclAllGather(a, dag, count, ncclFloat32, g_comm, g_stream));
        NCHECK(ncclBroadcast(dbc, dbc, count, ncclFloat32, n - 1, g_comm, g_stream));
        NCHECK(ncclSend(b, count, ncclFloat32, next, g_comm, g_stream));
        NCHECK(ncclRecv(y, count, ncclFloat32, prev, g_comm, g_stream));
        if (NCHECK(ncclGroupEnd()) && tu_sync(g_stream)) {
            tu_d2h(hi, dio, count * 4);
            size_t bad = 0;
            for (size_t i = 0; i < count; i++)
                bad += hi[i] != 3 * n * (n - 1) / 2 + n * (int)i;
            CHECK(bad == 0, "group: allreduce int32 sum", "0 wrong elements, got %zu", bad);
            unsigned char *g = tu_xmalloc(B * n);
            tu_d2h(g, dag, B * n);
            bad = 0;
            for (int r = 0; r < n; r++)
                for (size_t j = 0; j < B; j++)
                    bad += g[r * B + j] != pat(r, j, 1);
            CHECK(bad == 0, "group: allgather", "0 wrong bytes, got %zu", bad);
            tu_d2h(g, dbc, B);
            bad = 0;
            for (size_t j = 0; j < B; j++)
                bad += g[j] != pat(n - 1, j, 1);
            CHECK(bad == 0, "group: broadcast in place from the last rank", "0 wrong bytes, got %zu", bad);
            tu_d2h(g, y, B);
            bad = 0;
            for (size_t j = 0; j < B; j++)
                bad += g[j] != pat(prev, j, 2);
            CHECK(bad == 0, "group: send/recv with collectives", "0 wrong bytes, got %zu", bad);
            free(g);
        }
        tu_dfree(di);
        tu_dfree(dio);
        tu_dfree(dag);
        tu_dfree(dbc);
        free(hi);
    }

    tu_set_section("group errors");
    NCHECK_RC(ncclGroupEnd(), ncclInvalidUsage);
    CHECK(tu_starts(ncclGetLastError(NULL), "ncclGroupEnd"), "ncclGroupEnd without start: last error",
          "starts with \"ncclGroupEnd\", got \"%s\"", ncclGetLastError(NULL));
    tu_dfree(a);
    tu_dfree(b);
    tu_dfree(x);
    tu_dfree(y);
    free(h);
    free(want);
}

/* ---- PreMulSum with a device scalar read at each call, and op errors ---- */

static void test_ops(int rank, int n, ncclComm_t other)
{
    tu_set_section("premulsum device scalar");
    size_t count = 33;
    float *h = tu_xmalloc(count * 4);
    for (size_t i = 0; i < count; i++)
        h[i] = (float)(rank + 1);
    float *d = tu_dmalloc(count * 4), *dscal = tu_dmalloc(4);
    float two = 2, five = 5;
    tu_h2d(dscal, &two, 4);
    tu_h2d(d, h, count * 4);
    ncclRedOp_t op;
    if (NCHECK(ncclRedOpCreatePreMulSum(&op, dscal, ncclFloat32, ncclScalarDevice, g_comm))) {
        CHECK(op >= ncclNumOps, "PreMulSum op value", ">= ncclNumOps, got %d", (int)op);
        float sumr = (float)(n * (n + 1) / 2);
        if (NCHECK(ncclAllReduce(d, d, count, ncclFloat32, op, g_comm, g_stream)) && tu_sync(g_stream)) {
            tu_d2h(h, d, count * 4);
            CHECK(h[0] == 2 * sumr && h[count - 1] == 2 * sumr, "premulsum scalar 2", "%g, got %g/%g", 2 * sumr,
                  h[0], h[count - 1]);
        }
        /* the scalar changes in device memory: the next call reads the new value */
        tu_h2d(dscal, &five, 4);
        for (size_t i = 0; i < count; i++)
            h[i] = (float)(rank + 1);
        tu_h2d(d, h, count * 4);
        if (NCHECK(ncclAllReduce(d, d, count, ncclFloat32, op, g_comm, g_stream)) && tu_sync(g_stream)) {
            tu_d2h(h, d, count * 4);
            CHECK(h[0] == 5 * sumr, "premulsum device scalar read at the call", "%g, got %g", 5 * sumr, h[0]);
        }
        tu_set_section("op errors");
        /* wrong datatype for the op */
        NCHECK_RC(ncclAllReduce(d, d, count, ncclInt32, op, g_comm, g_stream), ncclInvalidArgument);
        /* an op of another comm */
        if (other != NULL)
            NCHECK_RC(ncclAllReduce(d, d, count, ncclFloat32, op, other, g_stream), ncclInvalidArgument);
        NCHECK(ncclRedOpDestroy(op, g_comm));
        /* a destroyed op */
        NCHECK_RC(ncclAllReduce(d, d, count, ncclFloat32, op, g_comm, g_stream), ncclInvalidArgument);
        CHECK(tu_starts(ncclGetLastError(g_comm), "ncclAllReduce"), "destroyed op: last error",
              "starts with \"ncclAllReduce\", got \"%s\"", ncclGetLastError(g_comm));
    }
    /* an op value nobody created, and one past ncclMaxRedOp's range */
    NCHECK_RC(ncclAllReduce(d, d, count, ncclFloat32, (ncclRedOp_t)77, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclAllReduce(d, d, count, ncclFloat32, (ncclRedOp_t)-1, g_comm, g_stream), ncclInvalidArgument);
    /* fp8 in reductions: refused, the text names the type */
    static const ncclDataType_t f8[] = {ncclFloat8e4m3, ncclFloat8e5m2};
    static const char *f8n[] = {"e4m3", "e5m2"};
    for (int k = 0; k < 2; k++) {
        char lower[1024];
        NCHECK_RC(ncclAllReduce(d, d, count, f8[k], ncclSum, g_comm, g_stream), ncclInvalidArgument);
        snprintf(lower, sizeof(lower), "%s", ncclGetLastError(g_comm));
        for (char *p = lower; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        CHECK(strstr(lower, f8n[k]) != NULL, "fp8 allreduce: last error names the type", "contains \"%s\", got \"%s\"",
              f8n[k], ncclGetLastError(g_comm));
        NCHECK_RC(ncclReduce(d, d, count, f8[k], ncclMax, 0, g_comm, g_stream), ncclInvalidArgument);
        NCHECK_RC(ncclReduceScatter(d, d, 1, f8[k], ncclMin, g_comm, g_stream), ncclInvalidArgument);
        unsigned char sc = 0x38;
        ncclRedOp_t bad = (ncclRedOp_t)12345;
        NCHECK_RC(ncclRedOpCreatePreMulSum(&bad, &sc, f8[k], ncclScalarHostImmediate, g_comm), ncclInvalidArgument);
        CHECK(bad == (ncclRedOp_t)12345, "fp8 PreMulSum: op untouched", "12345, got %d", (int)bad);
    }
    /* the comm still works after all these refusals */
    for (size_t i = 0; i < count; i++)
        h[i] = 1;
    tu_h2d(d, h, count * 4);
    if (NCHECK(ncclAllReduce(d, d, count, ncclFloat32, ncclSum, g_comm, g_stream)) && tu_sync(g_stream)) {
        tu_d2h(h, d, count * 4);
        CHECK(h[5] == (float)n, "allreduce after refused calls", "%d, got %g", n, h[5]);
    }
    tu_dfree(d);
    tu_dfree(dscal);
    free(h);
}

/* ---- argument errors ---- */

static void *fresh_thread_last_error(void *arg)
{
    (void)arg;
    const char *s = ncclGetLastError(NULL);
    return (void *)(intptr_t)(s != NULL && s[0] == '\0');
}

static void test_arg_errors(int rank, int n)
{
    tu_set_section("argument errors");
    char rankname[32];
    snprintf(rankname, sizeof(rankname), "rank %d", rank);
    float *d = tu_dmalloc(64 * 4);
    NCHECK_RC(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, NULL, g_stream), ncclInvalidArgument);
    CHECK(tu_starts(ncclGetLastError(NULL), "ncclAllReduce"), "NULL comm: last error", "starts with ncclAllReduce, got \"%s\"",
          ncclGetLastError(NULL));
    NCHECK_RC(ncclAllReduce(NULL, d, 4, ncclFloat32, ncclSum, g_comm, g_stream), ncclInvalidArgument);
    CHECK(tu_starts(ncclGetLastError(g_comm), "ncclAllReduce") && tu_contains(ncclGetLastError(g_comm), rankname),
          "NULL sendbuff: last error", "starts with ncclAllReduce and names \"%s\", got \"%s\"", rankname,
          ncclGetLastError(g_comm));
    NCHECK_RC(ncclAllReduce(d, NULL, 4, ncclFloat32, ncclSum, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclAllReduce(d, d, 4, (ncclDataType_t)ncclNumTypes, ncclSum, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclAllReduce(d, d, 4, (ncclDataType_t)-3, ncclSum, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclAllGather(d, d, 4, (ncclDataType_t)99, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclBroadcast(d, d, 4, ncclFloat32, n, g_comm, g_stream), ncclInvalidArgument);
    CHECK(tu_starts(ncclGetLastError(g_comm), "ncclBroadcast"), "root out of range: last error",
          "starts with ncclBroadcast, got \"%s\"", ncclGetLastError(g_comm));
    NCHECK_RC(ncclBcast(d, 4, ncclFloat32, -1, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclReduce(d, d, 4, ncclFloat32, ncclSum, n, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclGather(d, d, 4, ncclFloat32, n + 5, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclScatter(d, d, 4, ncclFloat32, -2, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclSend(d, 4, ncclFloat32, n, g_comm, g_stream), ncclInvalidArgument);
    CHECK(tu_starts(ncclGetLastError(g_comm), "ncclSend"), "peer out of range: last error",
          "starts with ncclSend, got \"%s\"", ncclGetLastError(g_comm));
    NCHECK_RC(ncclRecv(d, 4, ncclFloat32, -1, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclSend(NULL, 4, ncclFloat32, 0, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclRecv(NULL, 4, ncclFloat32, 0, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclAlltoAll(NULL, d, 4, ncclFloat32, g_comm, g_stream), ncclInvalidArgument);
    NCHECK_RC(ncclReduceScatter(d, NULL, 4, ncclFloat32, ncclSum, g_comm, g_stream), ncclInvalidArgument);
    /* count 0 with NULL buffers is legal */
    NCHECK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, g_comm, g_stream));
    NCHECK(ncclAllGather(NULL, NULL, 0, ncclInt8, g_comm, g_stream));
    tu_sync(g_stream);

    /* queries: NULL comm or NULL output -> invalid argument, output untouched */
    int v = -77;
    NCHECK_RC(ncclCommCount(NULL, &v), ncclInvalidArgument);
    CHECK(v == -77, "ncclCommCount(NULL comm): output untouched", "-77, got %d", v);
    NCHECK_RC(ncclCommCount(g_comm, NULL), ncclInvalidArgument);
    NCHECK_RC(ncclCommUserRank(NULL, &v), ncclInvalidArgument);
    NCHECK_RC(ncclCommUserRank(g_comm, NULL), ncclInvalidArgument);
    NCHECK_RC(ncclCommCuDevice(NULL, &v), ncclInvalidArgument);
    NCHECK_RC(ncclCommCuDevice(g_comm, NULL), ncclInvalidArgument);
    CHECK(v == -77, "query errors: output untouched", "-77, got %d", v);
    NCHECK_RC(ncclCommGetAsyncError(g_comm, NULL), ncclInvalidArgument);
    NCHECK_RC(ncclGetVersion(NULL), ncclInvalidArgument);
    NCHECK_RC(ncclGetUniqueId(NULL), ncclInvalidArgument);
    NCHECK_RC(ncclMemAlloc(NULL, 64), ncclInvalidArgument);
    NCHECK_RC(ncclRedOpCreatePreMulSum(NULL, &v, ncclInt32, ncclScalarHostImmediate, g_comm), ncclInvalidArgument);
    ncclRedOp_t op = (ncclRedOp_t)4242;
    NCHECK_RC(ncclRedOpCreatePreMulSum(&op, NULL, ncclInt32, ncclScalarHostImmediate, g_comm), ncclInvalidArgument);
    NCHECK_RC(ncclRedOpCreatePreMulSum(&op, &v, ncclInt32, ncclScalarHostImmediate, NULL), ncclInvalidArgument);
    CHECK(op == (ncclRedOp_t)4242, "PreMulSum errors: op untouched", "4242, got %d", (int)op);

    /* ncclGetLastError is per thread: a fresh thread saw no failure */
    pthread_t th;
    void *ok = NULL;
    pthread_create(&th, NULL, fresh_thread_last_error, NULL);
    pthread_join(th, &ok);
    CHECK(ok != NULL, "ncclGetLastError in a thread with no failed call", "\"\", got something else");

    /* still usable */
    float h[64];
    for (int i = 0; i < 64; i++)
        h[i] = 2;
    tu_h2d(d, h, sizeof(h));
    if (NCHECK(ncclAllReduce(d, d, 64, ncclFloat32, ncclMax, g_comm, g_stream)) && tu_sync(g_stream)) {
        tu_d2h(h, d, sizeof(h));
        CHECK(h[63] == 2, "allreduce after argument errors", "2, got %g", h[63]);
    }
    tu_dfree(d);
}

/* ---- calls weft refuses ---- */

static void test_refused(int rank, int n)
{
    (void)rank;
    tu_set_section("refused calls");
    const char *txt = "not implemented by weft's NCCL library";
    float *d = tu_dmalloc(4096);
    ncclWindow_t win = (ncclWindow_t)(uintptr_t)0x1234;
    NCHECK_RC(ncclCommWindowRegister(g_comm, d, 4096, &win, NCCL_WIN_DEFAULT), ncclInvalidUsage);
    CHECK(tu_starts(ncclGetLastError(g_comm), "ncclCommWindowRegister: ") && tu_contains(ncclGetLastError(g_comm), txt),
          "ncclCommWindowRegister text", "\"ncclCommWindowRegister: %s...\", got \"%s\"", txt, ncclGetLastError(g_comm));
    CHECK(win == (ncclWindow_t)(uintptr_t)0x1234, "ncclCommWindowRegister: win untouched", "0x1234, got %p",
          (void *)win);
    NCHECK_RC(ncclCommWindowDeregister(g_comm, win), ncclInvalidUsage);
    CHECK(tu_starts(ncclGetLastError(g_comm), "ncclCommWindowDeregister: ") && tu_contains(ncclGetLastError(g_comm), txt),
          "ncclCommWindowDeregister text", "\"...%s...\", got \"%s\"", txt, ncclGetLastError(g_comm));
    /* ncclCommShrink and ncclCommRevoke: argument errors (the calls work: test_revoke_shrink) */
    ncclComm_t nc = (ncclComm_t)(uintptr_t)0x5678;
    int excl = rank;
    NCHECK_RC(ncclCommShrink(g_comm, &excl, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    CHECK(tu_starts(ncclGetLastError(g_comm), "ncclCommShrink: ") && tu_contains(ncclGetLastError(g_comm), "this rank"),
          "ncclCommShrink excluding itself: text", "\"...this rank...\", got \"%s\"", ncclGetLastError(g_comm));
    excl = n;
    NCHECK_RC(ncclCommShrink(g_comm, &excl, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    NCHECK_RC(ncclCommShrink(g_comm, NULL, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    NCHECK_RC(ncclCommShrink(g_comm, NULL, 0, &nc, NULL, 7), ncclInvalidArgument);
    NCHECK_RC(ncclCommShrink(g_comm, NULL, 0, NULL, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
    CHECK(nc == (ncclComm_t)(uintptr_t)0x5678, "ncclCommShrink errors: newcomm untouched", "0x5678, got %p", (void *)nc);
    NCHECK_RC(ncclCommRevoke(g_comm, 1), ncclInvalidArgument);
    NCHECK_RC(ncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT), ncclInvalidArgument);
    /* ncclGroupSimulateEnd: refused and the group stays open (the real end then succeeds and runs the work) */
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    float h[16];
    for (int i = 0; i < 16; i++)
        h[i] = 1;
    tu_h2d(d, h, sizeof(h));
    NCHECK(ncclGroupStart());
    NCHECK(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, g_comm, g_stream));
    NCHECK_RC(ncclGroupSimulateEnd(&sim), ncclInvalidUsage);
    CHECK(tu_starts(ncclGetLastError(g_comm), "ncclGroupSimulateEnd: ") && tu_contains(ncclGetLastError(g_comm), txt),
          "ncclGroupSimulateEnd text", "\"...%s...\", got \"%s\"", txt, ncclGetLastError(g_comm));
    if (NCHECK(ncclGroupEnd()) && tu_sync(g_stream)) {
        tu_d2h(h, d, sizeof(h));
        CHECK(h[0] == (float)n, "group after ncclGroupSimulateEnd", "%d, got %g", n, h[0]);
    }
    tu_dfree(d);
}

/* ---- ncclCommRevoke and ncclCommShrink ---- */

/* On a comm split off g_comm: rank 0 revokes it; the last rank is excluded
 * (it only destroys its handle); the others shrink it and get a comm of
 * n - 1 ranks whose allreduce is exact; the revoked comm's async error
 * names rank 0 on every rank that shrank. */
static void test_revoke_shrink(int rank, int n)
{
    tu_set_section("ncclCommRevoke / ncclCommShrink");
    ncclComm_t dup = NULL, nc = NULL;
    if (!NCHECK(ncclCommSplit(g_comm, 0, rank, &dup, NULL)))
        return;
    if (rank == 0)
        NCHECK(ncclCommRevoke(dup, NCCL_REVOKE_DEFAULT));
    if (rank == n - 1) {
        NCHECK_RC(ncclCommDestroy(dup), ncclSuccess);
        return;
    }
    int excl = n - 1;
    if (!NCHECK(ncclCommShrink(dup, &excl, 1, &nc, NULL, NCCL_SHRINK_ABORT))) {
        ncclCommDestroy(dup);
        return;
    }
    int cnt = -1, ur = -1;
    NCHECK(ncclCommCount(nc, &cnt));
    NCHECK(ncclCommUserRank(nc, &ur));
    CHECK(cnt == n - 1 && ur == rank, "the shrunk comm's size and rank", "%d and %d, got %d and %d", n - 1, rank,
          cnt, ur);
    ncclResult_t ae = ncclSuccess;
    NCHECK(ncclCommGetAsyncError(dup, &ae));
    /* Rank 0's revoke, or this rank's own shrink if it came first. */
    CHECK(ae == ncclRemoteError && tu_contains(ncclGetLastError(dup), rank == 0 ? "revoked by rank 0" : "revoked by rank "),
          "the revoked comm's async error", "ncclRemoteError naming the revoking rank, got %s: \"%s\"",
          tu_res_name(ae), ncclGetLastError(dup));
    float *d = tu_dmalloc(64 * sizeof(float));
    float h[64];
    for (int i = 0; i < 64; i++)
        h[i] = (float)(rank + 1);
    tu_h2d(d, h, sizeof(h));
    if (NCHECK(ncclAllReduce(d, d, 64, ncclFloat32, ncclSum, nc, g_stream)) && tu_sync(g_stream)) {
        tu_d2h(h, d, sizeof(h));
        float want = (float)((n - 1) * n / 2);
        CHECK(h[0] == want && h[63] == want, "allreduce on the shrunk comm", "%g, got %g", want, h[0]);
    }
    tu_dfree(d);
    NCHECK(ncclCommDestroy(nc));
    NCHECK(ncclCommDestroy(dup));
}

/* ---- registration and ncclMemAlloc ---- */

static void test_memory(int rank, int n, ncclComm_t other)
{
    (void)rank;
    tu_set_section("ncclMemAlloc / ncclCommRegister");
    size_t count = 4096;
    void *p = NULL;
    if (!NCHECK(ncclMemAlloc(&p, count * 4)))
        return;
    struct cudaPointerAttributes at;
    if (CUCHECK(cudaPointerGetAttributes(&at, p))) {
        CHECK(at.type == cudaMemoryTypeDevice, "ncclMemAlloc gives device memory", "type %d, got %d",
              (int)cudaMemoryTypeDevice, (int)at.type);
        CHECK(at.device == g_dev, "ncclMemAlloc on the current device", "%d, got %d", g_dev, at.device);
    }
    /* Each allocation in a 2 MiB block of its own (as NCCL's cuMem
     * allocations are): two small ones never share one. */
    void *q = NULL;
    if (NCHECK(ncclMemAlloc(&q, 64))) {
        uintptr_t a = (uintptr_t)p, b = (uintptr_t)q, dist = a > b ? a - b : b - a;
        CHECK(dist >= ((uintptr_t)2 << 20), "ncclMemAlloc rounds to 2 MiB", "allocations >= 2 MiB apart, got %zu",
              (size_t)dist);
        NCHECK(ncclMemFree(q));
    }
    void *hnd = NULL, *hnd2 = NULL;
    if (NCHECK(ncclCommRegister(g_comm, p, count * 4, &hnd))) {
        CHECK(hnd != NULL, "ncclCommRegister handle", "non-NULL, got NULL");
        float *h = tu_xmalloc(count * 4);
        for (size_t i = 0; i < count; i++)
            h[i] = (float)(i % 7);
        tu_h2d(p, h, count * 4);
        if (NCHECK(ncclAllReduce(p, p, count, ncclFloat32, ncclSum, g_comm, g_stream)) && tu_sync(g_stream)) {
            tu_d2h(h, p, count * 4);
            size_t bad = 0;
            for (size_t i = 0; i < count; i++)
                bad += h[i] != (float)(n * (int)(i % 7));
            CHECK(bad == 0, "allreduce on registered ncclMemAlloc memory", "0 wrong, got %zu", bad);
        }
        free(h);
        if (other != NULL) {
            NCHECK_RC(ncclCommDeregister(other, hnd), ncclInvalidArgument);   /* not this comm's handle */
            if (NCHECK(ncclCommRegister(other, p, count * 4, &hnd2)))
                NCHECK_RC(ncclCommDeregister(g_comm, hnd2), ncclInvalidArgument);
        }
        NCHECK(ncclCommDeregister(g_comm, hnd));
        NCHECK_RC(ncclCommDeregister(g_comm, hnd), ncclInvalidArgument);   /* twice */
        if (hnd2 != NULL)
            NCHECK(ncclCommDeregister(other, hnd2));
    }
    NCHECK_RC(ncclCommRegister(g_comm, NULL, 64, &hnd), ncclInvalidArgument);
    NCHECK_RC(ncclCommRegister(g_comm, p, 64, NULL), ncclInvalidArgument);
    NCHECK(ncclMemFree(p));
}

/* ---- communicators ---- */

struct destroy_arg { ncclComm_t c; ncclResult_t r; int dev; };
static void *destroy_main(void *arg)
{
    struct destroy_arg *a = arg;
    cudaSetDevice(a->dev);
    a->r = ncclCommDestroy(a->c);
    return NULL;
}
/* Destroys k comms of this process at once, one thread each (destroy waits for every rank). */
static void destroy_local(ncclComm_t *cs, int k, const char *what)
{
    pthread_t th[8];
    struct destroy_arg a[8];
    for (int i = 0; i < k; i++) {
        a[i].c = cs[i];
        a[i].r = ncclInternalError;
        a[i].dev = i % 2;
        pthread_create(&th[i], NULL, destroy_main, &a[i]);
    }
    for (int i = 0; i < k; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].r == ncclSuccess, what, "destroy of comm %d: ncclSuccess, got %s", i, tu_res_name(a[i].r));
    }
}

/* Allreduce (sum of each comm's rank + 1) on k comms of this process in one group. */
static void allreduce_local_group(ncclComm_t *cs, int k, int nranks, const char *what)
{
    cudaStream_t s[8];
    float *d[8];
    size_t count = 513;
    float h[513];
    for (int i = 0; i < k; i++) {
        int dev = -1, r = -1;
        NCHECK(ncclCommCuDevice(cs[i], &dev));
        NCHECK(ncclCommUserRank(cs[i], &r));
        cudaSetDevice(dev);
        CUCHECK(cudaStreamCreate(&s[i]));
        /* on the comm's device (the arena is on this process's own) */
        d[i] = NULL;
        if (!CUCHECK(cudaMalloc((void **)&d[i], count * 4)))
            FATAL("cudaMalloc on device %d failed", dev);
        for (size_t j = 0; j < count; j++)
            h[j] = (float)(r + 1 + (int)j % 3);
        tu_h2d(d[i], h, count * 4);
    }
    NCHECK(ncclGroupStart());
    for (int i = 0; i < k; i++)
        NCHECK(ncclAllReduce(d[i], d[i], count, ncclFloat32, ncclSum, cs[i], s[i]));
    int ok = NCHECK(ncclGroupEnd());
    for (int i = 0; i < k; i++) {
        if (ok && tu_sync(s[i])) {
            tu_d2h(h, d[i], count * 4);
            size_t bad = 0;
            for (size_t j = 0; j < count; j++)
                bad += h[j] != (float)(nranks * (nranks + 1) / 2 + nranks * ((int)j % 3));
            CHECK(bad == 0, what, "comm %d: 0 wrong elements, got %zu", i, bad);
        }
        cudaFree(d[i]);
        cudaStreamDestroy(s[i]);
    }
    cudaSetDevice(g_dev);
}

static void test_split(int rank, int n, ncclComm_t *keep)
{
    tu_set_section("ncclCommSplit");
    ncclComm_t sc = NULL;
    /* even/odd ranks; key -rank reverses the order */
    if (NCHECK(ncclCommSplit(g_comm, rank % 2, -rank, &sc, NULL)) && CHECK(sc != NULL, "split comm", "non-NULL, got NULL")) {
        int members = (n - rank % 2 + 1) / 2, idx = rank / 2;
        int cnt = -1, ur = -1, dev = -1;
        NCHECK(ncclCommCount(sc, &cnt));
        NCHECK(ncclCommUserRank(sc, &ur));
        NCHECK(ncclCommCuDevice(sc, &dev));
        CHECK(cnt == members, "split comm size", "%d, got %d", members, cnt);
        CHECK(ur == members - 1 - idx, "split comm rank (key -rank)", "%d, got %d", members - 1 - idx, ur);
        CHECK(dev == g_dev, "split comm device = parent's", "%d, got %d", g_dev, dev);
        /* sum of the parent ranks of the color */
        int64_t *d = tu_dmalloc(8 * 8), h[8], want = 0;
        for (int r = rank % 2; r < n; r += 2)
            want += r;
        for (int i = 0; i < 8; i++)
            h[i] = rank;
        tu_h2d(d, h, sizeof(h));
        if (NCHECK(ncclAllReduce(d, d, 8, ncclInt64, ncclSum, sc, g_stream)) && tu_sync(g_stream)) {
            tu_d2h(h, d, sizeof(h));
            CHECK(h[7] == want, "allreduce on the split comm", "%lld, got %lld", (long long)want, (long long)h[7]);
        }
        tu_dfree(d);
    }
    *keep = sc;

    tu_set_section("ncclCommSplit NOCOLOR");
    ncclComm_t nc = (ncclComm_t)(uintptr_t)0x99;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "nccl-test-split";
    if (NCHECK(ncclCommSplit(g_comm, rank == 0 ? NCCL_SPLIT_NOCOLOR : 7, 0, &nc, &cfg))) {
        if (rank == 0) {
            CHECK(nc == NULL, "NOCOLOR split gives NULL", "NULL, got %p", (void *)nc);
        } else if (CHECK(nc != NULL && nc != (ncclComm_t)(uintptr_t)0x99, "colored split comm", "a comm, got %p",
                         (void *)nc)) {
            int cnt = -1, ur = -1;
            NCHECK(ncclCommCount(nc, &cnt));
            NCHECK(ncclCommUserRank(nc, &ur));
            CHECK(cnt == n - 1 && ur == rank - 1, "split without rank 0", "size %d rank %d, got %d %d", n - 1,
                  rank - 1, cnt, ur);
            /* finalize: later collectives are refused; destroy still works */
            NCHECK(ncclCommFinalize(nc));
            float *d = tu_dmalloc(16);
            NCHECK_RC(ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, nc, g_stream), ncclInvalidUsage);
            CHECK(tu_starts(ncclGetLastError(nc), "ncclAllReduce"), "finalized comm: last error",
                  "starts with ncclAllReduce, got \"%s\"", ncclGetLastError(nc));
            tu_dfree(d);
            NCHECK(ncclCommDestroy(nc));
        }
    }
    ncclComm_t bad = (ncclComm_t)(uintptr_t)0x42;
    ncclConfig_t badcfg = NCCL_CONFIG_INITIALIZER;
    badcfg.magic = 0;
    NCHECK_RC(ncclCommSplit(g_comm, 0, 0, &bad, &badcfg), ncclInvalidArgument);
    NCHECK_RC(ncclCommSplit(g_comm, 0, 0, NULL, NULL), ncclInvalidArgument);
    NCHECK_RC(ncclCommSplit(NULL, 0, 0, &bad, NULL), ncclInvalidArgument);
    CHECK(bad == (ncclComm_t)(uintptr_t)0x42, "split errors: newcomm untouched", "0x42, got %p", (void *)bad);
}

static void test_nonblocking(int rank, int n)
{
    tu_set_section("non-blocking init");
    ncclUniqueId id;
    if (rank == 0)
        NCHECK(ncclGetUniqueId(&id));
    tu_share_id(&id);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "nccl-test-nonblocking";
    /* knobs weft ignores (a debug line each) */
    cfg.cgaClusterSize = 2;
    cfg.minCTAs = 1;
    cfg.maxCTAs = 16;
    cfg.netName = "Socket";
    cfg.splitShare = 1;
    cfg.CTAPolicy = NCCL_CTA_POLICY_DEFAULT;
    ncclComm_t nb = NULL;
    NCHECK_RC(ncclCommInitRankConfig(&nb, n, id, rank, &cfg), ncclInProgress);
    if (!CHECK(nb != NULL, "non-blocking init: comm handle", "set at once, got NULL"))
        return;
    ncclResult_t st = ncclInProgress;
    double t0 = tu_now();
    while (st == ncclInProgress && tu_now() - t0 < 60) {
        if (ncclCommGetAsyncError(nb, &st) != ncclSuccess) {
            CHECK(0, "ncclCommGetAsyncError while initialising", "ncclSuccess, got an error: %s", ncclGetLastError(nb));
            return;
        }
        usleep(1000);
    }
    if (!CHECK(st == ncclSuccess, "non-blocking init result", "ncclSuccess within 60 s, got %s (%s)", tu_res_name(st),
               ncclGetLastError(nb)))
        return;
    int cnt = -1;
    NCHECK(ncclCommCount(nb, &cnt));
    CHECK(cnt == n, "non-blocking comm size", "%d, got %d", n, cnt);
    int32_t h[100], *d = tu_dmalloc(sizeof(h));
    for (int i = 0; i < 100; i++)
        h[i] = rank * i;
    tu_h2d(d, h, sizeof(h));
    ncclResult_t r = ncclAllReduce(d, d, 100, ncclInt32, ncclSum, nb, g_stream);
    CHECK(r == ncclSuccess || r == ncclInProgress, "ncclAllReduce on a non-blocking comm",
          "ncclSuccess or ncclInProgress, got %s", tu_res_name(r));
    st = ncclInProgress;
    t0 = tu_now();
    while (st == ncclInProgress && tu_now() - t0 < 60) {
        ncclCommGetAsyncError(nb, &st);
        usleep(200);
    }
    if (CHECK(st == ncclSuccess, "async error after allreduce", "ncclSuccess, got %s", tu_res_name(st)) &&
        tu_sync(g_stream)) {
        tu_d2h(h, d, sizeof(h));
        CHECK(h[99] == 99 * n * (n - 1) / 2, "allreduce on the non-blocking comm", "%d, got %d", 99 * n * (n - 1) / 2,
              h[99]);
    }
    tu_dfree(d);
    r = ncclCommDestroy(nb);
    CHECK(r == ncclSuccess || r == ncclInProgress, "ncclCommDestroy of a non-blocking comm",
          "ncclSuccess or ncclInProgress, got %s", tu_res_name(r));
}

static void test_scalable(int rank, int n)
{
    tu_set_section("ncclCommInitRankScalable");
    ncclUniqueId ids[2];
    memset(ids, 0, sizeof(ids));
    ncclComm_t c = (ncclComm_t)(uintptr_t)0x77;
    NCHECK_RC(ncclCommInitRankScalable(&c, n, rank, 2, ids, NULL), ncclInvalidUsage);
    CHECK(tu_starts(ncclGetLastError(NULL), "ncclCommInitRankScalable: ") &&
              tu_contains(ncclGetLastError(NULL), "not implemented by weft's NCCL library"),
          "ncclCommInitRankScalable nId 2 text", "not implemented..., got \"%s\"", ncclGetLastError(NULL));
    CHECK(c == (ncclComm_t)(uintptr_t)0x77, "refused scalable init: comm untouched", "0x77, got %p", (void *)c);
    if (rank == 0)
        NCHECK(ncclGetUniqueId(&ids[0]));
    tu_share_id(&ids[0]);
    if (NCHECK(ncclCommInitRankScalable(&c, n, rank, 1, ids, NULL))) {
        int cnt = -1, ur = -1;
        NCHECK(ncclCommCount(c, &cnt));
        NCHECK(ncclCommUserRank(c, &ur));
        CHECK(cnt == n && ur == rank, "scalable comm", "size %d rank %d, got %d %d", n, rank, cnt, ur);
        allreduce_local_group(&c, 1, n, "allreduce on the scalable comm");
        NCHECK(ncclCommDestroy(c));
    }
}

static void test_group_init(int rank, int n)
{
    tu_set_section("init in a group (2 ranks per process)");
    ncclUniqueId id;
    if (rank == 0)
        NCHECK(ncclGetUniqueId(&id));
    tu_share_id(&id);
    ncclComm_t cs[2] = {NULL, NULL};
    int ok = NCHECK(ncclGroupStart());
    for (int k = 0; k < 2; k++) {
        CUCHECK(cudaSetDevice(k));
        ok &= NCHECK(ncclCommInitRank(&cs[k], 2 * n, id, 2 * rank + k));
    }
    ok &= NCHECK(ncclGroupEnd());
    cudaSetDevice(g_dev);
    if (!ok || !CHECK(cs[0] != NULL && cs[1] != NULL, "group init comms", "both set, got %p %p", (void *)cs[0],
                      (void *)cs[1]))
        return;
    for (int k = 0; k < 2; k++) {
        int dev = -1, ur = -1, cnt = -1;
        NCHECK(ncclCommCuDevice(cs[k], &dev));
        NCHECK(ncclCommUserRank(cs[k], &ur));
        NCHECK(ncclCommCount(cs[k], &cnt));
        CHECK(dev == k && ur == 2 * rank + k && cnt == 2 * n, "group init comm", "device %d rank %d size %d, got %d %d %d",
              k, 2 * rank + k, 2 * n, dev, ur, cnt);
    }
    allreduce_local_group(cs, 2, 2 * n, "allreduce on both group-initialised comms in one group");
    destroy_local(cs, 2, "group-initialised comms");
}

static void test_init_all(void)
{
    tu_set_section("ncclCommInitAll");
    ncclComm_t cs[2] = {NULL, NULL};
    if (!NCHECK(ncclCommInitAll(cs, 2, NULL)))
        return;
    for (int k = 0; k < 2; k++) {
        int dev = -1, ur = -1, cnt = -1;
        NCHECK(ncclCommCuDevice(cs[k], &dev));
        NCHECK(ncclCommUserRank(cs[k], &ur));
        NCHECK(ncclCommCount(cs[k], &cnt));
        CHECK(dev == k && ur == k && cnt == 2, "ncclCommInitAll comm", "device %d rank %d size 2, got %d %d %d", k, k,
              dev, ur, cnt);
    }
    allreduce_local_group(cs, 2, 2, "allreduce on ncclCommInitAll's comms in one group");
    /* NCCL's own single-process example: destroy them one after the other from one thread */
    double t0 = tu_now();
    for (int k = 0; k < 2; k++)
        NCHECK(ncclCommDestroy(cs[k]));
    CHECK(tu_now() - t0 < 5, "ncclCommInitAll comms destroyed in a loop", "< 5 s, got %.2f s", tu_now() - t0);
    ncclComm_t x = (ncclComm_t)(uintptr_t)0x31;
    NCHECK_RC(ncclCommInitAll(&x, 0, NULL), ncclInvalidArgument);
    NCHECK_RC(ncclCommInitAll(NULL, 2, NULL), ncclInvalidArgument);
    CHECK(x == (ncclComm_t)(uintptr_t)0x31, "ncclCommInitAll(ndev 0): comms untouched", "0x31, got %p", (void *)x);
}

static void test_big(int rank, int n)
{
    tu_set_section("64 MiB allreduce and allgather");
    size_t bytes = (size_t)64 << 20, count = bytes / 4;
    float *h = tu_xmalloc(bytes);
    for (size_t i = 0; i < count; i++)
        h[i] = (float)((i + (size_t)rank) % 13);
    float *d = tu_dmalloc(bytes);
    tu_h2d(d, h, bytes);
    double t0 = tu_now();
    if (NCHECK(ncclAllReduce(d, d, count, ncclFloat32, ncclSum, g_comm, g_stream)) && tu_sync(g_stream)) {
        double t = tu_now() - t0;
        tu_d2h(h, d, bytes);
        size_t bad = 0;
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += (float)((i + (size_t)r) % 13);
            bad += h[i] != want;
        }
        CHECK(bad == 0, "64 MiB allreduce", "0 wrong elements, got %zu", bad);
        if (rank == 0 && getenv("NCCL_TEST_TIMES"))
            printf("  64 MiB allreduce: %.2f s\n", t);
    }
    /* allgather into 64 MiB: each rank gives 64 MiB / n */
    size_t per = count / n;
    float *ds = tu_dmalloc(per * 4);
    for (size_t i = 0; i < per; i++)
        h[i] = (float)(rank * 1000 + (int)(i % 997));
    tu_h2d(ds, h, per * 4);
    if (NCHECK(ncclAllGather(ds, d, per, ncclFloat32, g_comm, g_stream)) && tu_sync(g_stream)) {
        tu_d2h(h, d, per * n * 4);
        size_t bad = 0;
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < per; i++)
                bad += h[r * per + i] != (float)(r * 1000 + (int)(i % 997));
        CHECK(bad == 0, "64 MiB allgather", "0 wrong elements, got %zu", bad);
    }
    tu_dfree(ds);
    tu_dfree(d);
    free(h);
}

/* Buffers freed and allocated between calls (cudaMalloc/cudaFree around
 * each collective, as a program without a caching allocator does): a freed
 * address comes back with a new buffer id (tests/emu/cuda/README.md), so
 * whatever the library or weft keeps per buffer (CUDA IPC imports,
 * registrations) must notice. Last in the program: a hang here shows after
 * everything else was checked. */
static void test_churn(int rank, int n)
{
    tu_set_section("buffers freed and allocated between calls");
    /* the data movers with a fresh cudaMalloc per buffer, freed after each call */
    tu_fresh_alloc = 1;
    static const int kinds[] = {M_ALLGATHER, M_GATHER, M_SCATTER, M_ALLTOALL, M_BROADCAST};
    for (int k = 0; k < 5; k++)
        for (int ti = 0; ti < TU_NTYPES; ti += 2)
            for (int inplace = 0; inplace < 2; inplace++)
                if (!(kinds[k] == M_ALLTOALL && inplace))
                    run_move(g_comm, g_stream, rank, n, kinds[k], tu_all_types[ti], 1001, inplace, (ti + k) % n,
                             3000 + k * 100 + ti * 2 + inplace);
    tu_fresh_alloc = 0;
    for (int it = 0; it < 12; it++) {
        size_t count = 1001 + (size_t)(it % 3) * 64;
        float *hs = tu_xmalloc(count * 4), *hr = tu_xmalloc(count * n * 4);
        float *ds = NULL, *dr = NULL;
        if (!CUCHECK(cudaMalloc((void **)&ds, count * 4)) || !CUCHECK(cudaMalloc((void **)&dr, count * n * 4)))
            FATAL("cudaMalloc failed");
        for (size_t i = 0; i < count; i++)
            hs[i] = (float)(rank * 100 + it + (int)(i % 11));
        tu_h2d(ds, hs, count * 4);
        char what[96];
        snprintf(what, sizeof(what), "iteration %d: allgather of fresh buffers", it);
        if (g_trace) {
            printf("rank %d: churn %s\n", rank, what);
            fflush(stdout);
        }
        if (NCHECK(ncclAllGather(ds, dr, count, ncclFloat32, g_comm, g_stream)) && tu_sync(g_stream)) {
            tu_d2h(hr, dr, count * n * 4);
            size_t bad = 0;
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++)
                    bad += hr[r * count + i] != (float)(r * 100 + it + (int)(i % 11));
            CHECK(bad == 0, what, "0 wrong elements, got %zu", bad);
        }
        snprintf(what, sizeof(what), "iteration %d: allreduce of fresh buffers", it);
        if (NCHECK(ncclAllReduce(ds, dr, count, ncclFloat32, ncclSum, g_comm, g_stream)) && tu_sync(g_stream)) {
            tu_d2h(hr, dr, count * 4);
            size_t bad = 0;
            for (size_t i = 0; i < count; i++)
                bad += hr[i] != (float)(100 * n * (n - 1) / 2 + n * (it + (int)(i % 11)));
            CHECK(bad == 0, what, "0 wrong elements, got %zu", bad);
        }
        CUCHECK(cudaFree(ds));
        CUCHECK(cudaFree(dr));
        free(hs);
        free(hr);
    }
}

static void test_basics(void)
{
    tu_set_section("version and error strings");
    /* before anything failed in this thread */
    CHECK(ncclGetLastError(NULL) != NULL && ncclGetLastError(NULL)[0] == '\0', "ncclGetLastError with no failure",
          "\"\", got \"%s\"", ncclGetLastError(NULL) ? ncclGetLastError(NULL) : "(NULL)");
    int v = 0;
    NCHECK(ncclGetVersion(&v));
    CHECK(v == NCCL_VERSION_CODE, "ncclGetVersion", "%d, got %d", NCCL_VERSION_CODE, v);
    static const char *texts[] = {
        "no error",
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        /* NCCL's text but for whom to tell: an internal error here is weft's (docs/nccl.md) */
        "internal error - please report this issue to the weft developers",
        "invalid argument (run with NCCL_DEBUG=WARN for details)",
        "invalid usage (run with NCCL_DEBUG=WARN for details)",
        "remote process exited or there was a network error",
        "NCCL operation in progress",
    };
    for (int c = 0; c < 8; c++) {
        const char *s = ncclGetErrorString((ncclResult_t)c);
        CHECK(s != NULL && strcmp(s, texts[c]) == 0, "ncclGetErrorString", "code %d: \"%s\", got \"%s\"", c, texts[c],
              s ? s : "(NULL)");
    }
    static const int unknown[] = {ncclNumResults, 99, -1};
    for (int k = 0; k < 3; k++) {
        const char *s = ncclGetErrorString((ncclResult_t)unknown[k]);
        CHECK(s != NULL && strcmp(s, "unknown result code") == 0, "ncclGetErrorString(unknown)",
              "code %d: \"unknown result code\", got \"%s\"", unknown[k], s ? s : "(NULL)");
    }
}

static void test_init_errors(int rank, int n, ncclUniqueId id)
{
    tu_set_section("init argument errors");
    ncclComm_t c = (ncclComm_t)(uintptr_t)0x55;
    NCHECK_RC(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument);
    CHECK(tu_starts(ncclGetLastError(NULL), "ncclCommInitRank"), "nranks 0: last error",
          "starts with ncclCommInitRank, got \"%s\"", ncclGetLastError(NULL));
    NCHECK_RC(ncclCommInitRank(&c, n, id, n), ncclInvalidArgument);
    NCHECK_RC(ncclCommInitRank(&c, n, id, -1), ncclInvalidArgument);
    NCHECK_RC(ncclCommInitRank(NULL, n, id, rank), ncclInvalidArgument);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.magic = 0x12345678;
    NCHECK_RC(ncclCommInitRankConfig(&c, n, id, rank, &cfg), ncclInvalidArgument);
    ncclConfig_t cfg2 = NCCL_CONFIG_INITIALIZER;
    cfg2.size = 8;
    NCHECK_RC(ncclCommInitRankConfig(&c, n, id, rank, &cfg2), ncclInvalidArgument);
    CHECK(c == (ncclComm_t)(uintptr_t)0x55, "init errors: comm untouched", "0x55, got %p", (void *)c);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &tu_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &tu_size);
    int rank = tu_rank, n = tu_size;
    tu_id_setup(argc, argv);
    int times = getenv("NCCL_TEST_TIMES") != NULL;
    g_trace = getenv("NCCL_TEST_TRACE") != NULL;
    const char *big = getenv("NCCL_TEST_BIG");
    double t0 = tu_now(), tl = t0;
#define LAP(name)                                                                        \
    do {                                                                                 \
        if (times && rank == 0) {                                                        \
            printf("  %-28s %.2f s\n", name, tu_now() - tl);                             \
            fflush(stdout);                                                              \
        }                                                                                \
        tl = tu_now();                                                                   \
    } while (0)

    if (!skipped("basics"))
        test_basics();

    g_dev = rank % 2;
    if (cudaSetDevice(g_dev) != cudaSuccess)
        FATAL("cudaSetDevice(%d) failed", g_dev);
    int run_big = (big == NULL || strcmp(big, "0") != 0) && !skipped("big");
    tu_arena_init(run_big ? (size_t)112 << 20 : (size_t)16 << 20);
    tu_set_section("init");
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (rank == 0 && !NCHECK(ncclGetUniqueId(&id)))
        FATAL("ncclGetUniqueId failed: %s", ncclGetLastError(NULL));
    tu_share_id(&id);
    test_init_errors(rank, n, id);
    tu_set_section("init");
    if (!NCHECK(ncclCommInitRank(&g_comm, n, id, rank)))
        FATAL("ncclCommInitRank failed: %s", ncclGetLastError(NULL));
    if (cudaStreamCreate(&g_stream) != cudaSuccess)
        FATAL("cudaStreamCreate failed");
    int cnt = -1, ur = -1, dev = -1;
    NCHECK(ncclCommCount(g_comm, &cnt));
    NCHECK(ncclCommUserRank(g_comm, &ur));
    NCHECK(ncclCommCuDevice(g_comm, &dev));
    CHECK(cnt == n && ur == rank && dev == g_dev, "comm queries", "size %d rank %d device %d, got %d %d %d", n, rank,
          g_dev, cnt, ur, dev);
    ncclResult_t ae = ncclInternalError;
    NCHECK(ncclCommGetAsyncError(g_comm, &ae));
    CHECK(ae == ncclSuccess, "ncclCommGetAsyncError of a fresh comm", "ncclSuccess, got %s", tu_res_name(ae));
    LAP("init");

    tu_arena_release(0);
    if (!skipped("args"))
        test_arg_errors(rank, n);
    LAP("argument errors");
    tu_arena_release(0);
    if (!skipped("reductions"))
        test_reductions(rank, n);
    LAP("reductions");
    tu_arena_release(0);
    if (!skipped("moves"))
        test_moves(rank, n);
    tu_arena_release(0);
    if (!skipped("bcast"))
        test_bcast(rank, n);
    LAP("data movement");
    tu_arena_release(0);
    if (!skipped("p2p"))
        test_p2p_groups(rank, n);
    LAP("send/recv, groups");
    tu_arena_release(0);
    if (!skipped("refused"))
        test_refused(rank, n);
    LAP("refused calls");
    ncclComm_t split = NULL;
    tu_arena_release(0);
    if (!skipped("split"))
        test_split(rank, n, &split);
    LAP("split");
    tu_arena_release(0);
    if (!skipped("ops"))
        test_ops(rank, n, split);
    LAP("ops");
    tu_arena_release(0);
    if (!skipped("memory"))
        test_memory(rank, n, split);
    LAP("memory");
    if (split != NULL)
        NCHECK(ncclCommDestroy(split));
    tu_arena_release(0);
    if (!skipped("nonblocking"))
        test_nonblocking(rank, n);
    LAP("non-blocking");
    tu_arena_release(0);
    if (!skipped("scalable"))
        test_scalable(rank, n);
    LAP("scalable");
    tu_arena_release(0);
    if (!skipped("groupinit"))
        test_group_init(rank, n);
    LAP("group init");
    tu_arena_release(0);
    if (!skipped("initall"))
        test_init_all();
    LAP("init all");
    tu_arena_release(0);
    if (run_big) {
        test_big(rank, n);
        LAP("64 MiB");
    }
    tu_arena_release(0);
    if (!skipped("churn"))
        test_churn(rank, n);
    LAP("churn");

    tu_arena_release(0);
    if (!skipped("revoke"))
        test_revoke_shrink(rank, n);
    LAP("revoke/shrink");

    tu_set_section("destroy");
    cudaStreamDestroy(g_stream);
    NCHECK(ncclCommDestroy(g_comm));
    if (times && rank == 0)
        printf("  total %.2f s\n", tu_now() - t0);
    int rc = tu_summary("nccl_test_colls");
    tu_id_cleanup();
    MPI_Finalize();
    return rc;
}
