/*
 * Reductions and alltoall on CUDA device buffers, beyond the matrix of
 * test_reductions.cc (which this binary also runs with every buffer from
 * cudaMalloc: WEFT_TEST_MEM=device):
 *
 *  - host and device buffers mixed in one call (allowed; staged);
 *  - alltoall with device buffers, both algorithms, in and out of place;
 *  - non-blocking reductions on device buffers outstanding together;
 *  - under the emulated runtime (which refuses module loading, so no
 *    kernel runs) the staged path says so once at WEFT_DEBUG=info
 *    (entry of its own: the line is printed once per process).
 *
 * Results are read back with cudaMemcpy and compared exactly (float32 and
 * bfloat16 sums of small integers are exact in any order; integer ops are
 * exact). Over shm, tcp and two virtual nodes (mpi_tests/reductions.cmake).
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"
#include "weft_test_mem.h"

using namespace weft_mpitest;

namespace {

std::string cuda_err(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

/* bytes of host or device memory, plus 64 guard bytes after them. */
class Mem {
public:
    Mem(bool device, size_t bytes) : device_(device), bytes_(bytes)
    {
        const size_t total = bytes + kGuard;
        if (device_) {
            cudaError_t e = cudaMalloc(&p_, total);
            if (e != cudaSuccess) {
                ADD_FAILURE() << "cudaMalloc(" << total << "): " << cuda_err(e);
                p_ = nullptr;
                return;
            }
            e = cudaMemset(p_, 0xA5, total);
            if (e == cudaSuccess)
                e = cudaDeviceSynchronize();
            if (e != cudaSuccess)
                ADD_FAILURE() << "cudaMemset: " << cuda_err(e);
        } else {
            p_ = std::malloc(total);
            std::memset(p_, 0xA5, total);
        }
    }
    ~Mem()
    {
        if (p_ == nullptr)
            return;
        if (device_)
            cudaFree(p_);
        else
            std::free(p_);
    }
    Mem(const Mem &) = delete;
    Mem &operator=(const Mem &) = delete;

    unsigned char *data() const { return static_cast<unsigned char *>(p_); }
    bool device() const { return device_; }

    void put(size_t off, const void *src, size_t n)
    {
        if (n == 0)
            return;
        if (!device_) {
            std::memcpy(data() + off, src, n);
            return;
        }
        cudaError_t e = cudaMemcpy(data() + off, src, n, cudaMemcpyHostToDevice);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        if (e != cudaSuccess)
            ADD_FAILURE() << "cudaMemcpy H2D: " << cuda_err(e);
    }
    /* [off, off+n) and, with guards, the 64 bytes past the buffer. */
    std::vector<unsigned char> get(size_t off, size_t n) const
    {
        std::vector<unsigned char> h(n);
        if (n == 0)
            return h;
        if (!device_) {
            std::memcpy(h.data(), data() + off, n);
            return h;
        }
        cudaError_t e = cudaMemcpy(h.data(), data() + off, n, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            ADD_FAILURE() << "cudaMemcpy D2H: " << cuda_err(e);
        return h;
    }
    bool guard_intact() const
    {
        std::vector<unsigned char> g = get(bytes_, kGuard);
        for (unsigned char b : g)
            if (b != 0xA5)
                return false;
        return true;
    }

private:
    static constexpr size_t kGuard = 64;
    bool device_;
    size_t bytes_;
    void *p_ = nullptr;
};

/* float32 inputs: small integers, so sums are exact in any order. */
inline float xin(int r, size_t i) { return (float)((int)((i * 3 + (size_t)r * 7) % 29) - 14); }

/* bfloat16 of a small integer (exact), and back. */
inline uint16_t bf16_of(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* small integers: the low half is 0 */
}
inline float bf16_val(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

class ReductionsDevice : public WeftMpiTest {
protected:
    void SetUp() override
    {
        int ndev = 0;
        ASSERT_EQ(cudaGetDeviceCount(&ndev), cudaSuccess);
        ASSERT_GT(ndev, 0);
        /* WEFT_TEST_MEM=device picked the device already; otherwise rank % count. */
        if (!device_mem()) {
            ASSERT_EQ(cudaSetDevice(world_rank() % ndev), cudaSuccess);
        }
        WeftMpiTest::SetUp();
    }

    float want_sum(size_t i) const
    {
        float s = 0;
        for (int r = 0; r < size; r++)
            s += xin(r, i);
        return s;
    }

    /* One float32 SUM call with sendbuf / recvbuf on the given sides. */
    void mixed(const char *kind, bool send_dev, bool recv_dev, size_t count, int root)
    {
        const std::string what = std::string(kind) + " count " + std::to_string(count) + " sendbuf " +
                                 (send_dev ? "device" : "host") + ", recvbuf " + (recv_dev ? "device" : "host");
        const bool rs = std::strcmp(kind, "reduce_scatter") == 0, red = std::strcmp(kind, "reduce") == 0;
        const size_t in_elems = rs ? count * (size_t)size : count, first = rs ? (size_t)rank * count : 0;
        std::vector<float> in(in_elems);
        for (size_t i = 0; i < in_elems; i++)
            in[i] = xin(rank, i);
        Mem s(send_dev, in_elems * 4), r(recv_dev, count * 4);
        s.put(0, in.data(), in.size() * 4);
        int rc;
        if (rs)
            rc = weft_reduce_scatter(comm, s.data(), r.data(), count, WEFT_FLOAT32, WEFT_SUM);
        else if (red)
            rc = weft_reduce(comm, s.data(), r.data(), count, WEFT_FLOAT32, WEFT_SUM, root);
        else
            rc = weft_allreduce(comm, s.data(), r.data(), count, WEFT_FLOAT32, WEFT_SUM);
        ASSERT_EQ(rc, WEFT_SUCCESS) << what << ": " << last_error();
        if (!red || rank == root) {
            std::vector<unsigned char> got = r.get(0, count * 4);
            for (size_t k = 0; k < count; k++) {
                float g;
                std::memcpy(&g, got.data() + 4 * k, 4);
                ASSERT_EQ(g, want_sum(first + k)) << what << ": element " << first + k;
            }
        } else {
            std::vector<unsigned char> got = r.get(0, count * 4);
            for (size_t k = 0; k < got.size(); k++)
                ASSERT_EQ(got[k], 0xA5) << what << ": recvbuf off the root written at byte " << k;
        }
        EXPECT_TRUE(r.guard_intact()) << what << ": written past recvbuf";
        EXPECT_TRUE(s.guard_intact()) << what << ": written past sendbuf";
        std::vector<unsigned char> back = s.get(0, in.size() * 4);
        EXPECT_EQ(std::memcmp(back.data(), in.data(), back.size()), 0) << what << ": sendbuf modified";
    }
};

/* Host and device buffers mixed in one call, every kind, both directions. */
TEST_F(ReductionsDevice, MixedHostAndDevice)
{
    int root = 0;
    for (const char *kind : { "allreduce", "reduce_scatter", "reduce" })
        for (int sides = 1; sides < 3; sides++) /* host->device, device->host */
            for (size_t count : { (size_t)1, (size_t)4097, (size_t)30011 }) {
                mixed(kind, sides == 2, sides == 1, count, root++ % size);
                if (HasFailure())
                    return;
            }
}

/* Device sendbuf on some ranks, host on others: each rank classifies its
 * own buffers. */
TEST_F(ReductionsDevice, DeviceOnSomeRanksOnly)
{
    for (size_t count : { (size_t)7, (size_t)65537 }) {
        const bool dev = rank % 2 == 0;
        mixed("allreduce", dev, dev, count, 0);
        mixed("reduce", !dev, !dev, count, size - 1);
        if (HasFailure())
            return;
    }
}

/* bfloat16 SUM in place on device memory (all three kinds). */
TEST_F(ReductionsDevice, Bfloat16InPlace)
{
    const size_t count = 10007;
    for (int kind = 0; kind < 3; kind++) {
        const size_t in_elems = kind == 1 ? count * (size_t)size : count;
        std::vector<uint16_t> in(in_elems);
        for (size_t i = 0; i < in_elems; i++)
            in[i] = bf16_of(xin(rank, i) / 2); /* |x| <= 7: sums exact in bfloat16 */
        Mem m(true, in_elems * 2);
        m.put(0, in.data(), in_elems * 2);
        int rc;
        size_t first = 0;
        if (kind == 0) {
            rc = weft_allreduce(comm, m.data(), m.data(), count, WEFT_BFLOAT16, WEFT_SUM);
        } else if (kind == 1) {
            first = (size_t)rank * count;
            rc = weft_reduce_scatter(comm, m.data(), m.data() + first * 2, count, WEFT_BFLOAT16, WEFT_SUM);
        } else {
            rc = weft_reduce(comm, m.data(), m.data(), count, WEFT_BFLOAT16, WEFT_SUM, size / 2);
        }
        ASSERT_EQ(rc, WEFT_SUCCESS) << "kind " << kind << ": " << last_error();
        if (kind == 2 && rank != size / 2)
            continue;
        std::vector<unsigned char> got = m.get(first * 2, count * 2);
        for (size_t k = 0; k < count; k++) {
            uint16_t g;
            std::memcpy(&g, got.data() + 2 * k, 2);
            float want = 0;
            for (int r = 0; r < size; r++)
                want += bf16_val(bf16_of(xin(r, first + k) / 2));
            ASSERT_EQ(bf16_val(g), want) << "kind " << kind << " element " << first + k;
        }
        EXPECT_TRUE(m.guard_intact());
    }
}

/* alltoall with device buffers: both algorithms, in and out of place. */
TEST_F(ReductionsDevice, AlltoallDeviceBuffers)
{
    for (const char *algo : { "pairwise", "bruck" }) {
        weft_comm_t *c = nullptr;
        int rc = create_with(MPI_COMM_WORLD, {{"WEFT_ALLTOALL_ALGO", algo}}, &c);
        ASSERT_EQ(rc, WEFT_SUCCESS) << "WEFT_ALLTOALL_ALGO=" << algo;
        uint64_t call = 0;
        for (size_t bytes : { (size_t)0, (size_t)1, (size_t)1000, (size_t)65537 }) {
            for (bool in_place : { false, true }) {
                const size_t total = bytes * (size_t)size;
                std::vector<unsigned char> in(total);
                for (int j = 0; j < size; j++)
                    fill_pattern(in.data() + (size_t)j * bytes, bytes, pattern_seed(rank, j, call));
                Mem s(true, total), r(true, total);
                s.put(0, in.data(), total);
                unsigned char *rp = in_place ? s.data() : r.data();
                rc = weft_alltoall(c, s.data(), rp, bytes);
                ASSERT_EQ(rc, WEFT_SUCCESS) << algo << " " << bytes << " B: " << weft_comm_last_error(c);
                std::vector<unsigned char> got = (in_place ? s : r).get(0, total);
                for (int j = 0; j < size; j++)
                    ASSERT_EQ(pattern_mismatch(got.data() + (size_t)j * bytes, bytes, pattern_seed(j, rank, call)),
                              SIZE_MAX)
                        << algo << " " << bytes << " B" << (in_place ? " in place" : "") << ": block from rank " << j;
                EXPECT_TRUE(s.guard_intact() && r.guard_intact()) << algo << " " << bytes << " B";
                call++;
            }
        }
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
}

/* Non-blocking reductions on device buffers, outstanding together. */
TEST_F(ReductionsDevice, NonblockingOnDevice)
{
    const size_t count = 20001;
    std::vector<float> in(count * (size_t)size);
    for (size_t i = 0; i < in.size(); i++)
        in[i] = xin(rank, i);
    Mem a(true, count * 4), b(true, count * 4), c(true, in.size() * 4), d(true, count * 4), e(true, count * 4);
    a.put(0, in.data(), count * 4);
    c.put(0, in.data(), in.size() * 4);
    e.put(0, in.data(), count * 4);
    weft_request_t *req[3];
    ASSERT_EQ(weft_iallreduce(comm, a.data(), b.data(), count, WEFT_FLOAT32, WEFT_SUM, &req[0]), WEFT_SUCCESS)
        << last_error();
    ASSERT_EQ(weft_ireduce_scatter(comm, c.data(), d.data(), count, WEFT_FLOAT32, WEFT_SUM, &req[1]), WEFT_SUCCESS)
        << last_error();
    ASSERT_EQ(weft_ireduce(comm, e.data(), e.data(), count, WEFT_FLOAT32, WEFT_SUM, 0, &req[2]), WEFT_SUCCESS)
        << last_error();
    ASSERT_EQ(weft_waitall(3, req, nullptr), WEFT_SUCCESS) << last_error();
    std::vector<unsigned char> gb = b.get(0, count * 4), gd = d.get(0, count * 4), ge = e.get(0, count * 4);
    for (size_t k = 0; k < count; k++) {
        float x;
        std::memcpy(&x, gb.data() + 4 * k, 4);
        ASSERT_EQ(x, want_sum(k)) << "iallreduce element " << k;
        std::memcpy(&x, gd.data() + 4 * k, 4);
        ASSERT_EQ(x, want_sum((size_t)rank * count + k)) << "ireduce_scatter element " << k;
        if (rank == 0) {
            std::memcpy(&x, ge.data() + 4 * k, 4);
            ASSERT_EQ(x, want_sum(k)) << "ireduce (in place at the root) element " << k;
        }
    }
}

/* No kernel loads (the emulated runtime with WEFT_EMU_CUDA_MODULES=0, as a
 * GPU whose architecture has no image): device reductions are staged
 * through host memory, and WEFT_DEBUG=info says so exactly once per
 * process. Runs only in an entry of its own with WEFT_DEBUG=info
 * (WEFT_REDUCTIONS_EXPECT_STAGED=1), before any other device reduction of
 * the process. */
TEST_F(ReductionsDevice, StagedPathLoggedOnce)
{
    if (std::string(env_or("WEFT_REDUCTIONS_EXPECT_STAGED", "0")) != "1")
        GTEST_SKIP() << "needs WEFT_REDUCTIONS_EXPECT_STAGED=1 (and WEFT_DEBUG=info)";
    const size_t count = 1000;
    std::vector<float> in(count);
    for (size_t i = 0; i < count; i++)
        in[i] = xin(rank, i);
    Mem s(true, count * 4), r(true, count * 4);
    s.put(0, in.data(), count * 4);
    int rc[3] = { -1, -1, -1 };
    const std::string log = capture_stderr([&] {
        rc[0] = weft_allreduce(comm, s.data(), r.data(), count, WEFT_FLOAT32, WEFT_SUM);
        rc[1] = weft_allreduce(comm, s.data(), r.data(), count, WEFT_FLOAT32, WEFT_SUM);
        rc[2] = weft_reduce_scatter(comm, s.data(), r.data(), count / (size_t)size, WEFT_FLOAT32, WEFT_MAX);
    });
    for (int k = 0; k < 3; k++)
        ASSERT_EQ(rc[k], WEFT_SUCCESS) << "call " << k << ": " << last_error();
    size_t lines = 0, pos = 0;
    while ((pos = log.find("host copies", pos)) != std::string::npos) {
        lines++;
        pos++;
    }
    EXPECT_EQ(lines, 1u) << "the staged path must be logged once per process; log:\n" << log;
}

} // namespace
