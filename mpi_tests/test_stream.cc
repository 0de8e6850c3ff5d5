/*
 * Stream-ordered calls (weft_send_on_stream, weft_recv_on_stream,
 * weft_allgather_on_stream, weft_group_start/end) over CUDA streams.
 *
 * The binary links the emulated CUDA runtime (tests/emu/cuda) and weft loads
 * the same file (WEFT_CUDA_LIB), so test and library share one emulated GPU.
 * Buffers handed to weft are device memory (cudaMalloc); the tests fill and
 * read them only through stream copies from/to pinned host memory, which
 * are queued on the same stream as the weft call, so the stream order is
 * what is checked. weft_emu_cuda_stream_delay queues a slow "kernel".
 *
 * WEFT_TEST_STREAM_MEM=pinned hands weft pinned host memory instead (and
 * moves data with host functions on the stream), for debugging the stream
 * machinery apart from the device-memory paths.
 *
 * StreamNoCuda.* runs only with WEFT_CUDA_LIB=/nonexistent (an entry of its
 * own) and skips otherwise; every other test needs CUDA in the comm.
 * The DISABLED_Destroy* tests need weft_stream_comm_quiesce() called at the
 * start of weft_comm_destroy; run them with --gtest_also_run_disabled_tests.
 */
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "weft_emu_cuda.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool no_cuda_run()
{
    return std::string(env_or("WEFT_CUDA_LIB", "")) == "/nonexistent";
}

/* Pinned host memory, freed at scope end. */
struct Pinned {
    unsigned char *p = nullptr;
    size_t n = 0;
    explicit Pinned(size_t bytes) : n(bytes)
    {
        if (cudaMallocHost(reinterpret_cast<void **>(&p), bytes ? bytes : 1) != cudaSuccess)
            p = nullptr;
    }
    ~Pinned() { cudaFreeHost(p); }
    Pinned(const Pinned &) = delete;
    Pinned &operator=(const Pinned &) = delete;
};

/* The buffers handed to weft: device memory (cudaMalloc), or pinned host
 * memory with WEFT_TEST_STREAM_MEM=pinned. */
bool pinned_mode()
{
    return std::string(env_or("WEFT_TEST_STREAM_MEM", "device")) == "pinned";
}

struct Dev {
    unsigned char *p = nullptr;
    explicit Dev(size_t bytes)
    {
        void **pp = reinterpret_cast<void **>(&p);
        if ((pinned_mode() ? cudaMallocHost(pp, bytes ? bytes : 1) : cudaMalloc(pp, bytes ? bytes : 1)) != cudaSuccess)
            p = nullptr;
    }
    ~Dev()
    {
        if (pinned_mode())
            cudaFreeHost(p);
        else
            cudaFree(p);
    }
    Dev(const Dev &) = delete;
    Dev &operator=(const Dev &) = delete;
};

/* A stream-ordered copy between a weft buffer and pinned host memory:
 * cudaMemcpyAsync for device memory; for pinned weft buffers a host function
 * on the stream (a host-to-host cudaMemcpyAsync would block the host). */
struct CopyArg {
    void *dst;
    const void *src;
    size_t n;
};

void CUDART_CB copy_fn(void *arg)
{
    CopyArg *a = static_cast<CopyArg *>(arg);
    std::memcpy(a->dst, a->src, a->n);
    delete a;
}

cudaError_t stream_copy(void *dst, const void *src, size_t n, cudaStream_t s)
{
    if (!pinned_mode())
        return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
    CopyArg *a = new CopyArg{ dst, src, n };
    cudaError_t e = cudaLaunchHostFunc(s, copy_fn, a);
    if (e != cudaSuccess)
        delete a;
    return e;
}

struct Stream {
    cudaStream_t s = nullptr;
    Stream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
    ~Stream()
    {
        if (s) {
            cudaStreamSynchronize(s);
            cudaStreamDestroy(s);
        }
    }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
};

class StreamTest : public WeftMpiTest {
protected:
    void SetUp() override
    {
        WeftMpiTest::SetUp();
        if (comm == nullptr)
            return;
        if (no_cuda_run())
            GTEST_SKIP() << "WEFT_CUDA_LIB=/nonexistent: only StreamNoCuda.* runs";
        int ndev = 0;
        ASSERT_EQ(cudaGetDeviceCount(&ndev), cudaSuccess);
        ASSERT_GT(ndev, 0);
        ASSERT_EQ(cudaSetDevice(rank % ndev), cudaSuccess);
        refused0 = weft_emu_cuda_counter("sync_refused");
        event_refused0 = weft_emu_cuda_counter("event_record_refused");
    }

    /* On a GPU, a device-synchronising call on weft's progress thread while
     * a stream waits on weft is a deadlock, and an event recorded on a
     * stream of another device an error: the emulator refuses and counts
     * both (tests/emu/cuda/README.md, rules 3 and 6); no test may cause one. */
    void TearDown() override
    {
        if (refused0 != ~0ull) {
            EXPECT_EQ(weft_emu_cuda_counter("sync_refused"), refused0)
                << "weft made a device-synchronising CUDA call on its progress thread while a stream waited";
            EXPECT_EQ(weft_emu_cuda_counter("event_record_refused"), event_refused0)
                << "weft recorded an event on a stream of another device";
        }
        WeftMpiTest::TearDown();
    }

    unsigned long long refused0 = ~0ull, event_refused0 = ~0ull;

    /* Pairs (0,1), (2,3), ...; the last rank of an odd size pairs with itself. */
    int partner() const
    {
        int p = rank ^ 1;
        return p < size ? p : rank;
    }
};

/* (a)+(b): the send starts only after the earlier (slow) work on the sender's
 * stream that writes its buffer; the receiver's later copy sees the data. */
void order_case(StreamTest *t, weft_comm_t *comm, int rank, int peer, size_t n)
{
    const int tag = 3;
    const bool sender = rank <= peer;   /* self pair: both roles */
    const bool receiver = rank >= peer;
    Stream ss, rs;
    Dev sbuf(n), rbuf(n);
    Pinned fresh(n), stale(n), out(n);
    ASSERT_TRUE(sbuf.p && rbuf.p && fresh.p && stale.p && out.p);
    fill_pattern(fresh.p, n, pattern_seed(rank, tag, 1));
    fill_pattern(stale.p, n, pattern_seed(rank, tag, 0));
    ASSERT_EQ(cudaMemcpy(sbuf.p, stale.p, n, cudaMemcpyDefault), cudaSuccess);
    ASSERT_EQ(cudaMemset(rbuf.p, 0, n), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    MPI_Barrier(MPI_COMM_WORLD);

    if (receiver) {
        double t0 = now_s();
        ASSERT_EQ(weft_recv_on_stream(comm, rbuf.p, n, peer, tag, rs.s), WEFT_SUCCESS) << weft_comm_last_error(comm);
        ASSERT_EQ(stream_copy(out.p, rbuf.p, n, rs.s), cudaSuccess);
        EXPECT_LT(now_s() - t0, 0.15) << "weft_recv_on_stream blocked the host";
    }
    if (sender) {
        double t0 = now_s();
        ASSERT_EQ(weft_emu_cuda_stream_delay(ss.s, 300 * 1000), cudaSuccess);
        ASSERT_EQ(stream_copy(sbuf.p, fresh.p, n, ss.s), cudaSuccess);
        ASSERT_EQ(weft_send_on_stream(comm, sbuf.p, n, peer, tag, ss.s), WEFT_SUCCESS) << weft_comm_last_error(comm);
        double dt = now_s() - t0;
        EXPECT_LT(dt, 0.15) << "delay + copy + weft_send_on_stream took " << dt << " s: the host was blocked";
        /* Work after the send waits for it: overwriting the buffer now is safe. */
        ASSERT_EQ(stream_copy(sbuf.p, stale.p, n, ss.s), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(ss.s), cudaSuccess);
    }
    if (receiver) {
        ASSERT_EQ(cudaStreamSynchronize(rs.s), cudaSuccess);
        EXPECT_TRUE(HasPattern(out.p, n, peer, tag, 1)) << "size " << n << ": not the data written before the send";
    }
    (void)t;
}

TEST_F(StreamTest, SendWaitsForEarlierWorkRecvOrdersLaterWork)
{
    for (size_t n : { (size_t)64, (size_t)4096 + 3, (size_t)1 << 20 })
        order_case(this, comm, rank, partner(), n);
    /* Also to this rank itself (self pipe). */
    order_case(this, comm, rank, rank, 4096);
}

/* (c): a ring in one group on one stream (recv issued after send, large
 * enough for rendezvous); nested groups; then across two streams. */
TEST_F(StreamTest, GroupRingDoesNotDeadlock)
{
    const size_t n = (size_t)4 << 20;
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    Stream s, s2;
    Dev sbuf(n), rbuf(n);
    Pinned src(n), out(n);
    ASSERT_TRUE(sbuf.p && rbuf.p && src.p && out.p);

    for (int round = 0; round < 2; round++) {
        const int tag = 10 + round;
        cudaStream_t recv_stream = round == 0 ? s.s : s2.s;
        fill_pattern(src.p, n, pattern_seed(rank, tag, round));
        ASSERT_EQ(stream_copy(sbuf.p, src.p, n, s.s), cudaSuccess);
        /* No ASSERT inside the group: a failure must not leave it open. */
        EXPECT_EQ(weft_group_start(), WEFT_SUCCESS);
        EXPECT_EQ(weft_group_start(), WEFT_SUCCESS);   /* nested: only the outer end issues */
        EXPECT_EQ(weft_send_on_stream(comm, sbuf.p, n, next, tag, s.s), WEFT_SUCCESS) << last_error();
        EXPECT_EQ(weft_group_end(), WEFT_SUCCESS);
        EXPECT_EQ(weft_recv_on_stream(comm, rbuf.p, n, prev, tag, recv_stream), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_group_end(), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(stream_copy(out.p, rbuf.p, n, recv_stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(recv_stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
        EXPECT_TRUE(HasPattern(out.p, n, prev, tag, round)) << "round " << round;
    }
}

/* A stream of another device than the calling thread's current one: weft
 * takes the device from the stream (events, staging, signals), not from
 * cudaGetDevice (review B6: "cudaEventRecord ... invalid resource handle"
 * on a GPU). */
TEST_F(StreamTest, StreamOfAnotherDeviceThanCurrent)
{
    int ndev = 0, home = -1;
    ASSERT_EQ(cudaGetDeviceCount(&ndev), cudaSuccess);
    ASSERT_EQ(cudaGetDevice(&home), cudaSuccess);
    if (ndev < 2)
        GTEST_SKIP() << "needs two devices";
    const int other = (home + 1) % ndev, peer = partner(), tag = 25;
    const bool sender = rank <= peer, receiver = rank >= peer;
    for (size_t n : { (size_t)256, (size_t)1 << 20 }) {
        ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
        {
            Stream ss, rs;
            Dev sbuf(n), rbuf(n);
            Pinned src(n), out(n);
            ASSERT_TRUE(ss.s && rs.s && sbuf.p && rbuf.p && src.p && out.p);
            fill_pattern(src.p, n, pattern_seed(rank, tag, n));
            ASSERT_EQ(stream_copy(sbuf.p, src.p, n, ss.s), cudaSuccess);
            ASSERT_EQ(cudaSetDevice(home), cudaSuccess);   /* the calls below run with home current */
            EXPECT_EQ(weft_group_start(), WEFT_SUCCESS);
            if (receiver) {
                EXPECT_EQ(weft_recv_on_stream(comm, rbuf.p, n, peer, tag, rs.s), WEFT_SUCCESS) << last_error();
            }
            if (sender) {
                EXPECT_EQ(weft_send_on_stream(comm, sbuf.p, n, peer, tag, ss.s), WEFT_SUCCESS) << last_error();
            }
            ASSERT_EQ(weft_group_end(), WEFT_SUCCESS) << last_error();
            if (receiver) {
                ASSERT_EQ(stream_copy(out.p, rbuf.p, n, rs.s), cudaSuccess);
            }
            ASSERT_EQ(cudaStreamSynchronize(ss.s), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(rs.s), cudaSuccess);
            if (receiver) {
                EXPECT_TRUE(HasPattern(out.p, n, peer, tag, n)) << "size " << n;
            }
            ASSERT_EQ(cudaSetDevice(other), cudaSuccess);   /* the buffers and streams go on their device */
        }
        ASSERT_EQ(cudaSetDevice(home), cudaSuccess);
    }
}

/* (d): 100 operations on one stream, each overwriting the same buffer; the
 * copies queued between them capture every intermediate value. */
TEST_F(StreamTest, HundredOpsStayInOrder)
{
    const size_t n = 4096;
    const int k = 100, tag = 20;
    const int peer = partner();
    const bool sender = rank <= peer, receiver = rank >= peer;
    Stream ss, rs;
    Dev sbuf(n), rbuf(n);
    Pinned vals((size_t)k * n), caps((size_t)k * n);
    ASSERT_TRUE(sbuf.p && rbuf.p && vals.p && caps.p);
    for (int i = 0; i < k; i++)
        fill_pattern(vals.p + (size_t)i * n, n, pattern_seed(rank, tag, (uint64_t)i));
    std::memset(caps.p, 0, (size_t)k * n);

    double t0 = now_s();
    for (int i = 0; i < k; i++) {
        if (receiver) {
            ASSERT_EQ(weft_recv_on_stream(comm, rbuf.p, n, peer, tag, rs.s), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(stream_copy(caps.p + (size_t)i * n, rbuf.p, n, rs.s), cudaSuccess);
        }
        if (sender) {
            ASSERT_EQ(stream_copy(sbuf.p, vals.p + (size_t)i * n, n, ss.s), cudaSuccess);
            ASSERT_EQ(weft_send_on_stream(comm, sbuf.p, n, peer, tag, ss.s), WEFT_SUCCESS) << last_error();
        }
    }
    double queued = now_s() - t0;
    ASSERT_EQ(cudaStreamSynchronize(ss.s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(rs.s), cudaSuccess);
    if (receiver) {
        for (int i = 0; i < k; i++)
            ASSERT_TRUE(HasPattern(caps.p + (size_t)i * n, n, peer, tag, (uint64_t)i)) << "op " << i;
        Pinned fin(n);
        ASSERT_EQ(cudaMemcpy(fin.p, rbuf.p, n, cudaMemcpyDefault), cudaSuccess);
        EXPECT_TRUE(HasPattern(fin.p, n, peer, tag, (uint64_t)k - 1)) << "final value";
    }
    if (rank == 0)
        std::printf("  100 ops: queued in %.1f ms, done in %.1f ms\n", 1e3 * queued, 1e3 * (now_s() - t0));
}

/* (e): allgather on a stream, out of place and in place, after slow work that
 * writes the contribution; two allgathers on two streams in call order. */
TEST_F(StreamTest, AllgatherOnStream)
{
    for (size_t n : { (size_t)8, (size_t)65536 + 3 }) {
        const size_t total = n * (size_t)size;
        Stream s, s2;
        Dev send(n), recv(total), recv2(total);
        Pinned mine(n), out(total), out2(total), mine2(n);
        ASSERT_TRUE(send.p && recv.p && recv2.p && mine.p && out.p && out2.p && mine2.p);
        const int tag = 30;
        fill_pattern(mine.p, n, pattern_seed(rank, tag, n));
        fill_pattern(mine2.p, n, pattern_seed(rank, tag + 1, n));
        ASSERT_EQ(cudaMemset(recv.p, 0, total), cudaSuccess);
        ASSERT_EQ(cudaMemset(recv2.p, 0, total), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

        /* Out of place on s (slow producer), in place on s2. */
        ASSERT_EQ(weft_emu_cuda_stream_delay(s.s, 50 * 1000), cudaSuccess);
        ASSERT_EQ(stream_copy(send.p, mine.p, n, s.s), cudaSuccess);
        ASSERT_EQ(weft_allgather_on_stream(comm, send.p, recv.p, n, s.s), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(stream_copy(out.p, recv.p, total, s.s), cudaSuccess);

        unsigned char *slot = recv2.p + (size_t)rank * n;
        ASSERT_EQ(stream_copy(slot, mine2.p, n, s2.s), cudaSuccess);
        ASSERT_EQ(weft_allgather_on_stream(comm, slot, recv2.p, n, s2.s), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(stream_copy(out2.p, recv2.p, total, s2.s), cudaSuccess);

        ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s2.s), cudaSuccess);
        for (int r = 0; r < size; r++) {
            EXPECT_TRUE(HasPattern(out.p + (size_t)r * n, n, r, tag, n)) << "out of place, block " << r;
            EXPECT_TRUE(HasPattern(out2.p + (size_t)r * n, n, r, tag + 1, n)) << "in place, block " << r;
        }
    }
    /* Zero bytes: nothing to do, success. */
    Stream s;
    EXPECT_EQ(weft_allgather_on_stream(comm, nullptr, nullptr, 0, s.s), WEFT_SUCCESS);
}

/* (f): the other collectives on a stream, each after slow work on the
 * stream that writes its input and before a copy queued after it that reads
 * its output: allreduce (out of place, then in place), reduce_scatter,
 * bcast and alltoall, in one call order on every rank. */
TEST_F(StreamTest, ReductionsBcastAlltoallOnStream)
{
    const size_t n = 1000 + 3;   /* int32 elements per rank block */
    const size_t nb = n * sizeof(int32_t), total = nb * (size_t)size;
    Stream s;
    Dev in(total), out(total), a2a(total);
    Pinned src(total), res(total), res2(total), res3(nb), res4(nb), res5(total), res6(nb);
    ASSERT_TRUE(in.p && out.p && a2a.p && src.p && res.p && res2.p && res3.p && res4.p && res5.p && res6.p);
    int32_t *sv = reinterpret_cast<int32_t *>(src.p);
    for (size_t i = 0; i < n * (size_t)size; i++)
        sv[i] = (int32_t)(rank * 7 + (int)(i % 1000));
    ASSERT_EQ(cudaMemset(in.p, 0, total), cudaSuccess);
    ASSERT_EQ(cudaMemset(out.p, 0, total), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    /* allreduce of n elements, out of place: the input lands late. */
    ASSERT_EQ(weft_emu_cuda_stream_delay(s.s, 50 * 1000), cudaSuccess);
    ASSERT_EQ(stream_copy(in.p, src.p, total, s.s), cudaSuccess);
    ASSERT_EQ(weft_allreduce_on_stream(comm, in.p, out.p, n, WEFT_INT32, WEFT_SUM, s.s), WEFT_SUCCESS)
        << last_error();
    ASSERT_EQ(stream_copy(res.p, out.p, nb, s.s), cudaSuccess);
    /* in place, max */
    ASSERT_EQ(weft_allreduce_on_stream(comm, in.p, in.p, n, WEFT_INT32, WEFT_MAX, s.s), WEFT_SUCCESS)
        << last_error();
    ASSERT_EQ(stream_copy(res2.p, in.p, nb, s.s), cudaSuccess);
    /* reduce_scatter of the whole input (restored first) */
    ASSERT_EQ(stream_copy(in.p, src.p, total, s.s), cudaSuccess);
    ASSERT_EQ(weft_reduce_scatter_on_stream(comm, in.p, out.p, n, WEFT_INT32, WEFT_SUM, s.s), WEFT_SUCCESS)
        << last_error();
    ASSERT_EQ(stream_copy(res3.p, out.p, nb, s.s), cudaSuccess);
    /* bcast from the last rank */
    ASSERT_EQ(weft_bcast_on_stream(comm, in.p, nb, size - 1, s.s), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(stream_copy(res4.p, in.p, nb, s.s), cudaSuccess);
    /* alltoall of the (restored) input */
    ASSERT_EQ(stream_copy(in.p, src.p, total, s.s), cudaSuccess);
    ASSERT_EQ(weft_alltoall_on_stream(comm, in.p, a2a.p, nb, s.s), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(stream_copy(res5.p, a2a.p, total, s.s), cudaSuccess);
    /* reduce (min) of the restored input to rank 0; out is the root's only */
    ASSERT_EQ(stream_copy(in.p, src.p, total, s.s), cudaSuccess);
    ASSERT_EQ(weft_reduce_on_stream(comm, in.p, rank == 0 ? out.p : nullptr, n, WEFT_INT32, WEFT_MIN, 0, s.s),
              WEFT_SUCCESS) << last_error();
    ASSERT_EQ(stream_copy(res6.p, rank == 0 ? out.p : in.p, nb, s.s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);

    const int32_t *r1 = reinterpret_cast<const int32_t *>(res.p), *r2 = reinterpret_cast<const int32_t *>(res2.p);
    const int32_t *r3 = reinterpret_cast<const int32_t *>(res3.p), *r4 = reinterpret_cast<const int32_t *>(res4.p);
    const int32_t *r5 = reinterpret_cast<const int32_t *>(res5.p), *r6 = reinterpret_cast<const int32_t *>(res6.p);
    int bad[6] = { 0, 0, 0, 0, 0, 0 };
    for (size_t i = 0; i < n; i++) {
        int32_t sum = 0, mx = INT32_MIN, mn = INT32_MAX, rs = 0;
        for (int r = 0; r < size; r++) {
            int32_t v = (int32_t)(r * 7 + (int)(i % 1000));
            sum += v;
            mx = v > mx ? v : mx;
            mn = v < mn ? v : mn;
            rs += (int32_t)(r * 7 + (int)(((size_t)rank * n + i) % 1000));
        }
        bad[0] += r1[i] != sum;
        bad[1] += r2[i] != mx;
        bad[2] += r3[i] != rs;
        bad[3] += r4[i] != (int32_t)((size - 1) * 7 + (int)(i % 1000));
        for (int r = 0; r < size; r++)   /* block r came from rank r: its block `rank` */
            bad[4] += r5[(size_t)r * n + i] != (int32_t)(r * 7 + (int)(((size_t)rank * n + i) % 1000));
        /* root: the minimum; elsewhere the input is untouched */
        bad[5] += r6[i] != (rank == 0 ? mn : (int32_t)(rank * 7 + (int)(i % 1000)));
    }
    EXPECT_EQ(bad[0], 0) << "allreduce sum on stream";
    EXPECT_EQ(bad[1], 0) << "allreduce max in place on stream";
    EXPECT_EQ(bad[2], 0) << "reduce_scatter on stream";
    EXPECT_EQ(bad[3], 0) << "bcast on stream";
    EXPECT_EQ(bad[4], 0) << "alltoall on stream";
    EXPECT_EQ(bad[5], 0) << "reduce (min to rank 0) on stream";
    /* Zero counts queue nothing. */
    EXPECT_EQ(weft_allreduce_on_stream(comm, nullptr, nullptr, 0, WEFT_FLOAT32, WEFT_SUM, s.s), WEFT_SUCCESS);
    EXPECT_EQ(weft_allreduce_on_stream(comm, in.p, out.p, 4, (weft_dtype_t)99, WEFT_SUM, s.s), WEFT_ERR_INVALID_ARG);
}

/* Gather to the last rank, scatter from it, and an uneven alltoallv (empty
 * blocks included) on one stream, queued behind slow work. The alltoallv's
 * arrays are overwritten as soon as the call returned, before the stream
 * lets the operation start: the engine must have copied them. */
TEST_F(StreamTest, GatherScatterAlltoallvOnStream)
{
    const size_t nb = 1000 + 3;   /* gather / scatter: bytes per rank */
    const int root = size - 1;
    const size_t n = (size_t)size, total = nb * n;
    /* alltoallv: rank s sends rank d vb(s, d) bytes, byte k = s*31 + d*7 + k. */
    auto vb = [](int s, int d) { return (size_t)((s + 2 * d) % 3) * 257; };
    auto vbyte = [](int s, int d, size_t k) { return (unsigned char)(s * 31 + d * 7 + (int)k); };
    std::vector<size_t> sb(n), sd(n), rb(n), rd(n);
    size_t stot = 0, rtot = 0;
    for (int j = 0; j < size; j++) {
        sb[j] = vb(rank, j);
        sd[j] = stot;
        stot += sb[j];
        rb[j] = vb(j, rank);
        rd[j] = rtot;
        rtot += rb[j];
    }
    Stream s;
    Dev gin(nb), gout(total), sin(total), sout(nb), vin(stot), vout(rtot);
    Pinned src(nb + total), res_g(total), res_s(nb), res_v(rtot);
    ASSERT_TRUE(gin.p && gout.p && sin.p && sout.p && vin.p && vout.p && src.p && res_g.p && res_s.p && res_v.p);
    for (size_t k = 0; k < nb; k++)   /* gather: this rank's block */
        src.p[k] = (unsigned char)(rank * 13 + (int)k);
    for (size_t k = 0; k < total; k++)   /* scatter: the root's blocks (byte k of block d = d*5 + k) */
        src.p[nb + k] = (unsigned char)((int)(k / nb) * 5 + (int)(k % nb));
    std::vector<unsigned char> vsrc(stot);
    for (int d = 0; d < size; d++)
        for (size_t k = 0; k < sb[d]; k++)
            vsrc[sd[d] + k] = vbyte(rank, d, k);
    Pinned vpin(stot);
    ASSERT_TRUE(vpin.p);
    if (stot)
        std::memcpy(vpin.p, vsrc.data(), stot);
    ASSERT_EQ(cudaMemset(gout.p, 0, total), cudaSuccess);
    ASSERT_EQ(cudaMemset(sout.p, 0, nb), cudaSuccess);
    ASSERT_EQ(cudaMemset(vout.p, 0, rtot ? rtot : 1), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    ASSERT_EQ(weft_emu_cuda_stream_delay(s.s, 50 * 1000), cudaSuccess);
    ASSERT_EQ(stream_copy(gin.p, src.p, nb, s.s), cudaSuccess);
    ASSERT_EQ(stream_copy(sin.p, src.p + nb, total, s.s), cudaSuccess);
    if (stot) {
        ASSERT_EQ(stream_copy(vin.p, vpin.p, stot, s.s), cudaSuccess);
    }
    ASSERT_EQ(weft_gather_on_stream(comm, gin.p, rank == root ? gout.p : nullptr, nb, root, s.s), WEFT_SUCCESS)
        << last_error();
    ASSERT_EQ(weft_scatter_on_stream(comm, rank == root ? sin.p : nullptr, sout.p, nb, root, s.s), WEFT_SUCCESS)
        << last_error();
    ASSERT_EQ(weft_alltoallv_on_stream(comm, stot ? vin.p : nullptr, sb.data(), sd.data(), rtot ? vout.p : nullptr,
                                       rb.data(), rd.data(), s.s),
              WEFT_SUCCESS)
        << last_error();
    for (auto *v : {&sb, &sd, &rb, &rd})   /* the engine holds its own copy */
        std::fill(v->begin(), v->end(), (size_t)0xdeadbeef);
    if (rank == root) {
        ASSERT_EQ(stream_copy(res_g.p, gout.p, total, s.s), cudaSuccess);
    }
    ASSERT_EQ(stream_copy(res_s.p, sout.p, nb, s.s), cudaSuccess);
    if (rtot) {
        ASSERT_EQ(stream_copy(res_v.p, vout.p, rtot, s.s), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    ASSERT_EQ(weft_comm_async_error(comm), WEFT_SUCCESS) << last_error();

    int bad[3] = { 0, 0, 0 };
    if (rank == root)
        for (size_t k = 0; k < total; k++)
            bad[0] += res_g.p[k] != (unsigned char)((int)(k / nb) * 13 + (int)(k % nb));
    for (size_t k = 0; k < nb; k++)
        bad[1] += res_s.p[k] != (unsigned char)(rank * 5 + (int)k);
    size_t off = 0;
    for (int j = 0; j < size; j++)
        for (size_t k = 0; k < vb(j, rank); k++)
            bad[2] += res_v.p[off++] != vbyte(j, rank, k);
    EXPECT_EQ(bad[0], 0) << "gather on stream";
    EXPECT_EQ(bad[1], 0) << "scatter on stream";
    EXPECT_EQ(bad[2], 0) << "alltoallv on stream";
    /* Zero bytes queue nothing; arguments are checked at the call. */
    EXPECT_EQ(weft_gather_on_stream(comm, nullptr, nullptr, 0, root, s.s), WEFT_SUCCESS) << last_error();
    EXPECT_EQ(weft_scatter_on_stream(comm, sin.p, sout.p, nb, size, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("weft_scatter_on_stream: root"), std::string::npos) << last_error();
    EXPECT_EQ(weft_alltoallv_on_stream(comm, vin.p, nullptr, sd.data(), vout.p, rb.data(), rd.data(), s.s),
              WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("weft_alltoallv_on_stream: send_bytes is NULL"), std::string::npos) << last_error();
}

/* A receive buffer too small: the stream is released, the next
 * stream-ordered call returns the error with the peer in the text, and the
 * comm and stream keep working afterwards. */
TEST_F(StreamTest, AsyncErrorReportedByNextCall)
{
    const int peer = partner();
    if (peer == rank)
        GTEST_SKIP() << "odd rank out";   /* same decision on every rank: depends on size only */
    const bool sender = rank < peer;
    Stream s;
    Dev buf(128);
    Pinned host(128);
    ASSERT_TRUE(buf.p && host.p);
    if (sender) {
        ASSERT_EQ(weft_send_on_stream(comm, buf.p, 128, peer, 1, s.s), WEFT_SUCCESS) << last_error();
    } else {
        ASSERT_EQ(weft_recv_on_stream(comm, buf.p, 64, peer, 1, s.s), WEFT_SUCCESS) << last_error();
    }
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);   /* must not hang */

    if (!sender) {
        /* A peek (weft_comm_async_error, for watchdogs) sees it and leaves it. */
        EXPECT_EQ(weft_comm_async_error(comm), WEFT_ERR_TRUNCATE);
        EXPECT_EQ(weft_comm_async_error(comm), WEFT_ERR_TRUNCATE);
        int rc = weft_recv_on_stream(comm, buf.p, 64, peer, 2, s.s);
        EXPECT_EQ(rc, WEFT_ERR_TRUNCATE) << weft_strerror(rc);
        std::string err = last_error();
        EXPECT_NE(err.find("peer " + std::to_string(peer)), std::string::npos) << err;
        EXPECT_NE(err.find("weft_recv_on_stream"), std::string::npos) << err;
        EXPECT_EQ(weft_comm_async_error(comm), WEFT_SUCCESS) << "taken by the call that reported it";
    } else {
        /* The send fails with the same code or completes: take the error, if
         * any, with a matched pair to this rank itself. */
        EXPECT_EQ(weft_group_start(), WEFT_SUCCESS);
        int rc = weft_send_on_stream(comm, nullptr, 0, rank, 7, s.s);
        if (rc == WEFT_SUCCESS) {
            EXPECT_EQ(weft_recv_on_stream(comm, nullptr, 0, rank, 7, s.s), WEFT_SUCCESS) << last_error();
        } else {
            EXPECT_EQ(rc, WEFT_ERR_TRUNCATE) << weft_strerror(rc);
        }
        ASSERT_EQ(weft_group_end(), WEFT_SUCCESS) << last_error();
    }
    /* Both go on normally. */
    fill_pattern(host.p, 64, pattern_seed(rank, 2, 0));
    if (sender) {
        ASSERT_EQ(stream_copy(buf.p, host.p, 64, s.s), cudaSuccess);
        ASSERT_EQ(weft_send_on_stream(comm, buf.p, 64, peer, 2, s.s), WEFT_SUCCESS) << last_error();
    } else {
        ASSERT_EQ(weft_recv_on_stream(comm, buf.p, 64, peer, 2, s.s), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(stream_copy(host.p, buf.p, 64, s.s), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    if (!sender) {
        EXPECT_TRUE(HasPattern(host.p, 64, peer, 2, 0));
    }
}

/* (g): argument errors, checked before anything is queued. */
/* The flight recorder (collectives/journal.h): stream-ordered collectives
 * are in the comm's journal, numbered apart from the others ("stream":1
 * lines), done once their stream went on. A comm of its own, made with
 * WEFT_TRACE pointing at a fresh directory; weft_comm_dump writes each
 * rank's file. */
TEST_F(StreamTest, JournalHoldsStreamCollectives)
{
    char dir[64] = "";
    if (rank == 0) {
        std::strcpy(dir, "/tmp/weft-stream-trace.XXXXXX");
        if (mkdtemp(dir) == nullptr)
            dir[0] = '\0';
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    ASSERT_NE(dir[0], '\0') << "mkdtemp on rank 0";
    setenv("WEFT_TRACE", dir, 1);
    weft_comm_t *c = nullptr;
    int rc = weft_comm_create(MPI_COMM_WORLD, &c);
    unsetenv("WEFT_TRACE");
    ASSERT_EQ(rc, WEFT_SUCCESS) << weft_last_error();
    {
        Stream s;
        Dev in(64 * sizeof(float)), out(64 * sizeof(float));
        ASSERT_TRUE(in.p && out.p);
        ASSERT_EQ(cudaMemset(in.p, 0, 64 * sizeof(float)), cudaSuccess);
        ASSERT_EQ(weft_allreduce_on_stream(c, in.p, out.p, 64, WEFT_FLOAT32, WEFT_SUM, s.s), WEFT_SUCCESS)
            << weft_comm_last_error(c);
        ASSERT_EQ(weft_bcast_on_stream(c, out.p, 256, 0, s.s), WEFT_SUCCESS) << weft_comm_last_error(c);
        ASSERT_EQ(weft_barrier(c), WEFT_SUCCESS) << weft_comm_last_error(c);   /* the other numbering's call 0 */
        ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    }
    ASSERT_EQ(weft_comm_dump(c), WEFT_SUCCESS) << weft_comm_last_error(c);
    /* This rank's file: weft-trace.<comm>.r<rank>.jsonl. */
    std::string text, suffix = ".r" + std::to_string(rank) + ".jsonl", name;
    if (DIR *d = opendir(dir)) {
        while (dirent *e = readdir(d)) {
            std::string n = e->d_name;
            if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
                name = n;
        }
        closedir(d);
    }
    ASSERT_FALSE(name.empty()) << "no journal of rank " << rank << " in " << dir;
    std::ifstream f(std::string(dir) + "/" + name);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
    auto line_with = [&](const std::string &what) {
        size_t at = text.find(what);
        if (at == std::string::npos)
            return std::string();
        size_t end = text.find('\n', at);
        return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    };
    const std::string ar = line_with("{\"call\":0,\"stream\":1,\"what\":\"allreduce(64 x float32, sum)\"");
    const std::string bc = line_with("{\"call\":1,\"stream\":1,\"what\":\"bcast(256 B, root 0)\"");
    const std::string ba = line_with("{\"call\":0,\"what\":\"barrier\"");
    EXPECT_NE(ar.find("\"state\":\"done\""), std::string::npos) << "the stream allreduce's line: " << text;
    EXPECT_NE(bc.find("\"state\":\"done\""), std::string::npos) << "the stream bcast's line: " << text;
    EXPECT_NE(ba.find("\"state\":\"done\""), std::string::npos) << "the barrier's line: " << text;
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS) << weft_last_error();
    std::remove((std::string(dir) + "/" + name).c_str());
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        rmdir(dir);
}

/* WEFT_THREADS=serialized: the comm takes no lock while only the
 * program's thread calls in; its first stream-ordered call starts the
 * comm's progress thread, which then moves the same pipes as the program's
 * calls, so the comm must take its lock again from that call on
 * (p2p/engine.c). Host messages and collectives run here while the
 * stream's allreduce waits behind a delay and then moves on the progress
 * thread: under ThreadSanitizer (scripts/test) a comm that kept going
 * without its lock races (checked: 37 races, then a hang), and the results
 * are checked everywhere. */
TEST_F(StreamTest, SerializedCommTakesItsLockOnceStreamed)
{
    weft_comm_t *c = nullptr;
    ASSERT_EQ(WEFT_SUCCESS, create_comm_with("WEFT_THREADS", "serialized", &c)) << weft_last_error();
    const int n = 64;
    std::vector<int32_t> h(n), r(n), got(n);
    for (int i = 0; i < n; i++)
        h[i] = rank + i;
    auto check = [&](const std::vector<int32_t> &v, const char *what) {
        for (int i = 0; i < n; i++)
            if (v[i] != size * (size - 1) / 2 + size * i) {
                ADD_FAILURE() << what << ": element " << i << " is " << v[i];
                return;
            }
    };
    ASSERT_EQ(weft_allreduce(c, h.data(), r.data(), n, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS) << weft_comm_last_error(c);
    check(r, "allreduce before any stream call");
    {
        Stream s;
        Dev in(n * sizeof(int32_t)), out(n * sizeof(int32_t));
        ASSERT_TRUE(in.p && out.p);
        ASSERT_EQ(cudaMemcpy(in.p, h.data(), n * sizeof(int32_t), cudaMemcpyDefault), cudaSuccess);
        ASSERT_EQ(weft_emu_cuda_stream_delay(s.s, 5 * 1000), cudaSuccess);
        ASSERT_EQ(weft_allreduce_on_stream(c, in.p, out.p, n, WEFT_INT32, WEFT_SUM, s.s), WEFT_SUCCESS)
            << weft_comm_last_error(c);
        /* Messages with the partner (the pipes the stream's allreduce moves
         * too) and now and then a host allreduce, while the stream's runs. */
        const int peer = partner();
        std::vector<int32_t> back(n);
        for (int k = 0; k < 1000; k++) {
            weft_request_t *q[2];
            ASSERT_EQ(weft_irecv(c, back.data(), n * sizeof(int32_t), peer, 9, &q[0]), WEFT_SUCCESS)
                << weft_comm_last_error(c);
            ASSERT_EQ(weft_isend(c, h.data(), n * sizeof(int32_t), peer, 9, &q[1]), WEFT_SUCCESS)
                << weft_comm_last_error(c);
            ASSERT_EQ(weft_waitall(2, q, nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
            ASSERT_EQ(back[n - 1], peer + n - 1) << "message " << k << " from rank " << peer;
            if (k % 100 == 0) {
                std::fill(r.begin(), r.end(), -1);
                ASSERT_EQ(weft_allreduce(c, h.data(), r.data(), n, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS)
                    << weft_comm_last_error(c);
                check(r, "host allreduce beside the stream's");
            }
        }
        ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(got.data(), out.p, n * sizeof(int32_t), cudaMemcpyDefault), cudaSuccess);
        check(got, "stream allreduce");
    }
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS) << weft_last_error();
}

/* Stream-ordered collectives are numbered apart from the others: a failed
 * stream call's verdict (here a mismatch: rank 0 reduces 64 elements, the
 * others 32, as the comm's 9th stream collective) is the failure note of
 * that stream call, and must not fail the other numbering's call of the
 * same number (once both went by one number, and the stream note made a
 * barrier fail as a mismatch). A comm of its own; then 16 barriers, which
 * pass whichever number the comm's own calls started them at. */
TEST_F(StreamTest, StreamVerdictStaysInItsNumbering)
{
    weft_comm_t *c = nullptr;
    ASSERT_EQ(weft_comm_create(MPI_COMM_WORLD, &c), WEFT_SUCCESS) << weft_last_error();
    {
        Stream s;
        Dev in(64 * sizeof(float)), out(64 * sizeof(float));
        ASSERT_TRUE(in.p && out.p);
        ASSERT_EQ(cudaMemset(in.p, 0, 64 * sizeof(float)), cudaSuccess);
        for (int i = 0; i < 8; i++)
            ASSERT_EQ(weft_allreduce_on_stream(c, in.p, out.p, 64, WEFT_FLOAT32, WEFT_SUM, s.s), WEFT_SUCCESS)
                << weft_comm_last_error(c);
        ASSERT_EQ(weft_allreduce_on_stream(c, in.p, out.p, rank == 0 ? 64 : 32, WEFT_FLOAT32, WEFT_SUM, s.s),
                  WEFT_SUCCESS) << weft_comm_last_error(c);
        ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    }
    const int async = weft_comm_async_error(c);
    const std::string why = weft_comm_last_error(c) ? weft_comm_last_error(c) : "";
    int any = async == WEFT_ERR_MISMATCH, all = 0;
    MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(all, 1) << "no rank saw the stream allreduce's mismatch";
    if (async != WEFT_SUCCESS) {
        EXPECT_NE(why.find("stream"), std::string::npos) << why;
    }
    MPI_Barrier(MPI_COMM_WORLD);   /* every note of the failed stream call is out */
    for (int i = 0; i < 16; i++)
        ASSERT_EQ(weft_barrier(c), WEFT_SUCCESS) << "barrier " << i << ": " << weft_comm_last_error(c);
    /* Destroy reports the stream failure no stream call took (api.md). */
    const int d = weft_comm_destroy(c);
    EXPECT_TRUE(d == WEFT_SUCCESS || d == async) << d << ": " << weft_last_error();
}

TEST_F(StreamTest, ArgumentErrors)
{
    Stream s;
    Dev buf(256);
    ASSERT_TRUE(buf.p);
    EXPECT_EQ(weft_send_on_stream(nullptr, buf.p, 8, 0, 0, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_recv_on_stream(nullptr, buf.p, 8, 0, 0, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_allgather_on_stream(nullptr, buf.p, buf.p, 8, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_send_on_stream(comm, nullptr, 8, 0, 0, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("weft_send_on_stream"), std::string::npos) << last_error();
    EXPECT_EQ(weft_recv_on_stream(comm, nullptr, 8, 0, 0, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_send_on_stream(comm, buf.p, 8, -1, 0, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_send_on_stream(comm, buf.p, 8, size, 0, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_recv_on_stream(comm, buf.p, 8, size, 0, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_send_on_stream(comm, buf.p, 8, 0, -1, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_recv_on_stream(comm, buf.p, 8, 0, -5, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("negative"), std::string::npos) << last_error();
    EXPECT_EQ(weft_allgather_on_stream(comm, nullptr, buf.p, 8, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_allgather_on_stream(comm, buf.p, nullptr, 8, s.s), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_allgather_on_stream(comm, buf.p, buf.p, SIZE_MAX / 2 + 1, s.s), WEFT_ERR_INVALID_ARG);
    if (size > 1) {
        /* sendbuf inside recvbuf but not at rank*bytes. */
        unsigned char *wrong = buf.p + (size_t)((rank + 1) % size) * 8 + 1;
        EXPECT_EQ(weft_allgather_on_stream(comm, wrong, buf.p, 8, s.s), WEFT_ERR_INVALID_ARG);
    }
    /* Not a stream (the emulator reports it; undefined behaviour on real
     * GPUs): refused when weft asks for the stream's device, before
     * anything is queued. */
    int not_a_stream = 0;
    cudaStream_t bogus = reinterpret_cast<cudaStream_t>(&not_a_stream);
    EXPECT_EQ(weft_send_on_stream(comm, buf.p, 8, rank, 0, bogus), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("the device of stream"), std::string::npos) << last_error();

    /* Groups. */
    EXPECT_EQ(weft_group_end(), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_group_start(), WEFT_SUCCESS);
    EXPECT_EQ(weft_send_on_stream(comm, buf.p, 8, -1, 0, s.s), WEFT_ERR_INVALID_ARG);   /* refused, not recorded */
    EXPECT_EQ(weft_group_end(), WEFT_SUCCESS);
    EXPECT_EQ(weft_group_end(), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_group_start(), WEFT_SUCCESS);   /* empty group */
    EXPECT_EQ(weft_group_end(), WEFT_SUCCESS);
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
}

/* (f): weft without CUDA (WEFT_CUDA_LIB=/nonexistent, while the program
 * itself has the emulated runtime): every stream call is unsupported. */
class StreamNoCuda : public WeftMpiTest {};

TEST_F(StreamNoCuda, EveryCallUnsupported)
{
    if (!no_cuda_run())
        GTEST_SKIP() << "needs WEFT_CUDA_LIB=/nonexistent (ctest entry stream_nocuda)";
    Stream s;
    unsigned char host[64] = { 0 };
    unsigned char all[64 * 8] = { 0 };
    ASSERT_LE(size, 8);
    EXPECT_EQ(weft_send_on_stream(comm, host, 8, rank, 0, s.s), WEFT_ERR_UNSUPPORTED);
    EXPECT_NE(last_error().find("CUDA"), std::string::npos) << last_error();
    EXPECT_EQ(weft_recv_on_stream(comm, host, 8, rank, 0, s.s), WEFT_ERR_UNSUPPORTED);
    EXPECT_EQ(weft_allgather_on_stream(comm, host, all, 8, s.s), WEFT_ERR_UNSUPPORTED);
    EXPECT_EQ(weft_allgather_on_stream(comm, nullptr, nullptr, 0, s.s), WEFT_ERR_UNSUPPORTED);
    EXPECT_EQ(weft_gather_on_stream(comm, host, all, 8, 0, s.s), WEFT_ERR_UNSUPPORTED);
    EXPECT_EQ(weft_scatter_on_stream(comm, all, host, 8, 0, s.s), WEFT_ERR_UNSUPPORTED);
    {
        size_t z[8] = { 0 };
        EXPECT_EQ(weft_alltoallv_on_stream(comm, nullptr, z, z, nullptr, z, z, s.s), WEFT_ERR_UNSUPPORTED);
        EXPECT_NE(last_error().find("weft_alltoallv_on_stream"), std::string::npos) << last_error();
    }
    EXPECT_EQ(weft_group_start(), WEFT_SUCCESS);
    EXPECT_EQ(weft_send_on_stream(comm, host, 8, rank, 0, s.s), WEFT_ERR_UNSUPPORTED);
    EXPECT_EQ(weft_group_end(), WEFT_SUCCESS);
    /* Argument errors still come first. */
    EXPECT_EQ(weft_send_on_stream(comm, host, 8, -1, 0, s.s), WEFT_ERR_INVALID_ARG);
}

/* weft_comm_destroy waits for operations still queued on streams (the
 * quiesce call at the start of weft_comm_destroy, src/comm/comm.c). */
TEST_F(StreamTest, DestroyWaitsForQueuedOps)
{
    const size_t n = 1 << 16;
    const int peer = partner();
    Stream s;
    Dev sbuf(n), rbuf(n);
    Pinned src(n), out(n);
    ASSERT_TRUE(sbuf.p && rbuf.p && src.p && out.p);
    fill_pattern(src.p, n, pattern_seed(rank, 40, 0));
    ASSERT_EQ(weft_emu_cuda_stream_delay(s.s, 300 * 1000), cudaSuccess);
    ASSERT_EQ(stream_copy(sbuf.p, src.p, n, s.s), cudaSuccess);
    EXPECT_EQ(weft_group_start(), WEFT_SUCCESS);
    EXPECT_EQ(weft_send_on_stream(comm, sbuf.p, n, peer, 40, s.s), WEFT_SUCCESS);
    EXPECT_EQ(weft_recv_on_stream(comm, rbuf.p, n, peer, 40, s.s), WEFT_SUCCESS);
    ASSERT_EQ(weft_group_end(), WEFT_SUCCESS);
    ASSERT_EQ(stream_copy(out.p, rbuf.p, n, s.s), cudaSuccess);
    /* No synchronize: destroy must wait for the ops (the fixture's TearDown
     * would destroy too; do it here and clear comm). */
    ASSERT_EQ(weft_comm_destroy(comm), WEFT_SUCCESS);
    comm = nullptr;
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);
    EXPECT_TRUE(HasPattern(out.p, n, peer, 40, 0));
}

/* A stream held back (a host function that waits for the test) longer
 * than WEFT_TIMEOUT: destroy gives up on the queued operations, returns
 * WEFT_ERR_TIMEOUT and releases the stream. */
void CUDART_CB hold_fn(void *arg)
{
    std::atomic<int> *flag = static_cast<std::atomic<int> *>(arg);
    while (flag->load() == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST_F(StreamTest, DestroyTimesOutOnHeldStream)
{
    /* A comm of its own with WEFT_TIMEOUT=2 (its configuration, same on every rank). */
    weft_comm_t *c2 = nullptr;
    int crc = create_with(MPI_COMM_WORLD, {{"WEFT_TIMEOUT", "2"}}, &c2);
    ASSERT_EQ(crc, WEFT_SUCCESS) << weft_last_error();

    std::atomic<int> flag{ 0 };
    Stream s;
    Dev sbuf(64), rbuf(64);
    ASSERT_TRUE(sbuf.p && rbuf.p);
    ASSERT_EQ(cudaLaunchHostFunc(s.s, hold_fn, &flag), cudaSuccess);
    EXPECT_EQ(weft_group_start(), WEFT_SUCCESS);
    EXPECT_EQ(weft_send_on_stream(c2, sbuf.p, 64, rank, 1, s.s), WEFT_SUCCESS);
    EXPECT_EQ(weft_recv_on_stream(c2, rbuf.p, 64, rank, 1, s.s), WEFT_SUCCESS);
    ASSERT_EQ(weft_group_end(), WEFT_SUCCESS);
    /* Released after destroy gave up (cudaFree inside destroy synchronises
     * every stream, so it must not be held forever). */
    std::thread releaser([&flag] {
        std::this_thread::sleep_for(std::chrono::seconds(4));
        flag.store(1);
    });
    double t0 = now_s();
    EXPECT_EQ(weft_comm_destroy(c2), WEFT_ERR_TIMEOUT);
    double dt = now_s() - t0;
    EXPECT_GE(dt, 1.5);
    EXPECT_LT(dt, 15.0);
    releaser.join();
    ASSERT_EQ(cudaStreamSynchronize(s.s), cudaSuccess);   /* released: does not hang */
}

} // namespace
