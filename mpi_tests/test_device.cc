/*
 * CUDA device buffers through weft's pipes (docs/cuda.md): every
 * combination of host and device memory on the two sides of a message,
 * sizes around every eager limit and staging chunk boundary, sends to self,
 * many outstanding messages per tag (FIFO), allgather and bcast with device
 * buffers, and a process whose weft has no CUDA (device pointers refused,
 * host transfers fine).
 *
 * The binary links the emulated CUDA runtime (tests/emu/cuda) and weft loads
 * the same file through WEFT_CUDA_LIB, so both share one emulated GPU.
 * Ranks sit on device rank % 2; the ctest entries set
 * WEFT_EMU_CUDA_NO_PEER=0-1, so device pairs of neighbours (r, r^1) cannot
 * use CUDA IPC and are staged (p2p/stage.c) on every transport.
 *
 * Data is always checked on the host after a cudaMemcpy back, with 64 bytes
 * past every received message that must stay untouched. (Host code could
 * read emulated device memory directly; the tests never do.)
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "config.h"
}
#include "weft.h"
#include "weft_emu_cuda.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

constexpr size_t kTail = 64;              /* bytes past a message that must stay untouched */
constexpr unsigned char kMark = 0x5A;

/* The configuration as weft reads it (eager limits, staging chunk). */
const weft_config &cfg()
{
    static weft_config c;
    static bool done = false;
    if (!done) {
        char err[256];
        if (weft_config_load(&c, nullptr, nullptr, err, sizeof err) != WEFT_SUCCESS)
            ADD_FAILURE() << "config: " << err;
        done = true;
    }
    return c;
}

std::string cuda_err(cudaError_t e) { return std::string(cudaGetErrorString(e)); }

/* A message buffer of `size` bytes (+ kTail) in host or device memory,
 * `misalign` bytes into its allocation. */
class Buf {
public:
    Buf(bool device, size_t size, size_t misalign = 0) : device_(device), size_(size), mis_(misalign)
    {
        size_t total = size + kTail + misalign;
        if (device_) {
            cudaError_t e = cudaMalloc(&raw_, total);
            if (e != cudaSuccess) {
                ADD_FAILURE() << "cudaMalloc(" << total << "): " << cuda_err(e);
                raw_ = nullptr;
                return;
            }
            e = cudaMemset(raw_, kMark, total);
            if (e == cudaSuccess)
                e = cudaDeviceSynchronize();
            if (e != cudaSuccess)
                ADD_FAILURE() << "cudaMemset: " << cuda_err(e);
        } else {
            raw_ = std::malloc(total ? total : 1);
            std::memset(raw_, kMark, total);
        }
    }
    ~Buf()
    {
        if (raw_ == nullptr)
            return;
        if (device_)
            cudaFree(raw_);
        else
            std::free(raw_);
    }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;

    void *data() { return raw_ ? static_cast<char *>(raw_) + mis_ : nullptr; }
    size_t size() const { return size_; }
    bool device() const { return device_; }

    /* Writes the pattern of seed into the message bytes. */
    void fill(uint64_t seed)
    {
        std::vector<unsigned char> h(size_);
        fill_pattern(h.data(), size_, seed);
        put(h.data(), size_);
    }

    void put(const void *src, size_t n)
    {
        if (n == 0)
            return;
        if (!device_) {
            std::memcpy(data(), src, n);
            return;
        }
        cudaError_t e = cudaMemcpy(data(), src, n, cudaMemcpyHostToDevice);
        /* From pageable memory the copy may land after cudaMemcpy returned
         * ("API synchronization behavior"): weft's streams do not wait for
         * it, so the test does before handing the buffer over. */
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        if (e != cudaSuccess)
            ADD_FAILURE() << "cudaMemcpy H2D: " << cuda_err(e);
    }

    /* The message bytes and the tail, as the host sees them after a copy back. */
    std::vector<unsigned char> get() const
    {
        std::vector<unsigned char> h(size_ + kTail);
        const char *src = static_cast<const char *>(raw_) + mis_;
        if (!device_) {
            std::memcpy(h.data(), src, h.size());
            return h;
        }
        cudaError_t e = cudaMemcpy(h.data(), src, h.size(), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            ADD_FAILURE() << "cudaMemcpy D2H: " << cuda_err(e);
        return h;
    }

    /* Holds the pattern of seed in [0, n) and kMark in the tail past size. */
    ::testing::AssertionResult Holds(uint64_t seed, size_t n) const
    {
        std::vector<unsigned char> h = get();
        size_t bad = pattern_mismatch(h.data(), n, seed);
        if (bad != SIZE_MAX)
            return ::testing::AssertionFailure() << "byte " << bad << " of " << n << " differs ("
                                                 << (device_ ? "device" : "host") << " buffer)";
        for (size_t i = size_; i < size_ + kTail; i++)
            if (h[i] != kMark)
                return ::testing::AssertionFailure() << "byte " << (i - size_) << " past the " << size_
                                                     << "-byte buffer was written";
        return ::testing::AssertionSuccess();
    }

private:
    bool device_;
    size_t size_, mis_;
    void *raw_ = nullptr;
};

/* Sizes around every eager limit and staging chunk boundary (deduplicated,
 * ascending), plus big when asked. */
std::vector<size_t> interesting_sizes(bool big)
{
    const weft_config &c = cfg();
    const size_t ch = c.cuda_stage_chunk;
    std::vector<size_t> v = { 0, 1, 31, 32 };
    for (size_t e : { c.shm_eager_limit, c.shm_coll_eager, c.tcp_eager_limit, c.self_eager_limit, c.ib_eager_limit }) {
        v.push_back(e > 0 ? e - 1 : 0);
        v.push_back(e);
        v.push_back(e + 1);
    }
    for (size_t k : { (size_t)1, (size_t)2 }) {
        v.push_back(k * ch - 1);
        v.push_back(k * ch);
        v.push_back(k * ch + 1);
    }
    v.push_back(5 * ch + 3);           /* several chunks + 3 bytes */
    if (ch <= (256u << 10))
        v.push_back(64 * ch + 3);      /* small chunks: many more chunks than slots */
    if (big)
        v.push_back((size_t)64 << 20);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
}

class DeviceTest : public WeftMpiTest {
protected:
    int ndev = 0;

    void SetUp() override
    {
        cudaError_t e = cudaGetDeviceCount(&ndev);
        ASSERT_EQ(e, cudaSuccess) << cuda_err(e);
        ASSERT_GT(ndev, 0);
        e = cudaSetDevice(world_rank() % ndev);
        ASSERT_EQ(e, cudaSuccess) << cuda_err(e);
        WeftMpiTest::SetUp();
    }

    int partner() const { return (rank ^ 1) < size ? (rank ^ 1) : -1; }

    /* Both ranks of the pair send `n` bytes to each other at once: from a
     * buffer of kind sdev, into one of kind rdev. */
    void exchange(bool sdev, bool rdev, size_t n, int tag, uint64_t index)
    {
        int peer = partner();
        if (peer < 0)
            return;
        Buf sb(sdev, n, index % 2 ? 3 : 0), rb(rdev, n, index % 3 == 1 ? 5 : 0);
        sb.fill(pattern_seed(rank, tag, index));
        weft_request_t *reqs[2];
        weft_status_t st[2];
        ASSERT_EQ(weft_irecv(comm, rb.data(), n, peer, tag, &reqs[0]), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_isend(comm, sb.data(), n, peer, tag, &reqs[1]), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS)
            << last_error() << " (" << n << " bytes, " << (sdev ? "device" : "host") << " -> "
            << (rdev ? "device" : "host") << ")";
        EXPECT_EQ(st[0].bytes, n);
        EXPECT_TRUE(rb.Holds(pattern_seed(peer, tag, index), n))
            << n << " bytes " << (sdev ? "device" : "host") << " -> " << (rdev ? "device" : "host")
            << " from peer " << peer;
    }

    /* 64 MiB only where WEFT_DEVICE_TEST_BIG=1 (the np 2 entries): it is the
     * slowest size by far and the np 4 entries add nothing to it. */
    void exchange_sizes(bool sdev, bool rdev)
    {
        uint64_t index = 0;
        for (size_t n : interesting_sizes(std::string(env_or("WEFT_DEVICE_TEST_BIG", "0")) == "1")) {
            exchange(sdev, rdev, n, 7, index++);
            if (HasFailure())
                return;
        }
    }
};

TEST_F(DeviceTest, DeviceToDevice) { exchange_sizes(true, true); }
TEST_F(DeviceTest, HostToDevice) { exchange_sizes(false, true); }
TEST_F(DeviceTest, DeviceToHost) { exchange_sizes(true, false); }

/* A pinned host buffer is host memory for every transport. */
TEST_F(DeviceTest, PinnedHost)
{
    int peer = partner();
    if (peer < 0)
        return;
    const size_t n = 3 * cfg().cuda_stage_chunk + 11;
    void *s = nullptr, *r = nullptr;
    ASSERT_EQ(cudaMallocHost(&s, n), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&r, n), cudaSuccess);
    fill_pattern(s, n, pattern_seed(rank, 3, 0));
    weft_request_t *reqs[2];
    ASSERT_EQ(weft_irecv(comm, r, n, peer, 3, &reqs[0]), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(weft_isend(comm, s, n, peer, 3, &reqs[1]), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(weft_waitall(2, reqs, nullptr), WEFT_SUCCESS) << last_error();
    EXPECT_TRUE(HasPattern(r, n, peer, 3, 0));
    cudaFreeHost(s);
    cudaFreeHost(r);
}

/* Sends to self: every kind pair, below and above the self eager limit. */
TEST_F(DeviceTest, SelfSends)
{
    const size_t e = cfg().self_eager_limit;
    const size_t sizes[] = { 0, 1, 31, e > 0 ? e - 1 : 0, e, e + 1, 3 * cfg().cuda_stage_chunk + 3, (size_t)2 << 20 };
    uint64_t index = 0;
    for (int kinds = 0; kinds < 4; kinds++) {
        bool sdev = kinds & 1, rdev = kinds & 2;
        for (size_t n : sizes) {
            Buf sb(sdev, n, index % 2), rb(rdev, n);
            sb.fill(pattern_seed(rank, 5, index));
            weft_request_t *reqs[2];
            weft_status_t st[2];
            /* Send first: the message waits unexpected (eager) or as an RTS. */
            ASSERT_EQ(weft_isend(comm, sb.data(), n, rank, 5, &reqs[1]), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_irecv(comm, rb.data(), n, rank, 5, &reqs[0]), WEFT_SUCCESS) << last_error();
            ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << last_error();
            EXPECT_EQ(st[0].bytes, n);
            EXPECT_TRUE(rb.Holds(pattern_seed(rank, 5, index), n))
                << "self, " << n << " bytes, " << (sdev ? "device" : "host") << " -> " << (rdev ? "device" : "host");
            index++;
        }
    }
}

/* Many device messages outstanding at once on several tags to the next rank
 * and from the previous one (across virtual nodes too), receives posted
 * before and after the sends: each tag keeps its order. */
TEST_F(DeviceTest, ManyOutstandingFifoPerTag)
{
    const int kTags = 3, kPerTag = 6;
    const size_t ch = cfg().cuda_stage_chunk;
    const size_t sizes[] = { 17, cfg().shm_eager_limit + 1, ch + 5, 2 * ch + 3, 100, cfg().tcp_eager_limit + 1 };
    int to = (rank + 1) % size, from = (rank + size - 1) % size;
    std::vector<std::unique_ptr<Buf>> sbufs, rbufs;
    std::vector<weft_request_t *> reqs;
    std::vector<size_t> rsize;

    auto post_recvs = [&](int tag) {
        for (int i = 0; i < kPerTag; i++) {
            size_t n = sizes[(i + tag) % 6];
            rbufs.emplace_back(new Buf(i % 2 == 0, n));
            rsize.push_back(n);
            weft_request_t *r;
            ASSERT_EQ(weft_irecv(comm, rbufs.back()->data(), n, from, tag, &r), WEFT_SUCCESS) << last_error();
            reqs.push_back(r);
        }
    };
    /* Tag 0's receives first; tags 1, 2 after the sends (unexpected). */
    post_recvs(0);
    for (int i = 0; i < kPerTag; i++) {
        for (int tag = 0; tag < kTags; tag++) {
            size_t n = sizes[(i + tag) % 6];
            sbufs.emplace_back(new Buf(i % 3 != 2, n, (size_t)i % 4));
            sbufs.back()->fill(pattern_seed(rank, tag, (uint64_t)i));
            weft_request_t *r;
            ASSERT_EQ(weft_isend(comm, sbufs.back()->data(), n, to, tag, &r), WEFT_SUCCESS) << last_error();
            reqs.push_back(r);
        }
    }
    for (int tag = 1; tag < kTags; tag++)
        post_recvs(tag);
    std::vector<weft_status_t> st(reqs.size());
    ASSERT_EQ(weft_waitall(reqs.size(), reqs.data(), st.data()), WEFT_SUCCESS) << last_error();
    /* Receive k of tag t (posted in order) holds message k of tag t. */
    size_t k = 0;
    for (int tag = 0; tag < kTags; tag++)
        for (int i = 0; i < kPerTag; i++, k++) {
            EXPECT_EQ(st[tag == 0 ? k : k + (size_t)kPerTag * kTags].bytes, rsize[k]);
            EXPECT_TRUE(rbufs[k]->Holds(pattern_seed(from, tag, (uint64_t)i), rsize[k]))
                << "tag " << tag << " message " << i << " from " << from;
        }
}

/* A CUDA copy that fails (here: a device range that runs past the end of
 * its allocation, which the runtime refuses) fails that side's request with
 * WEFT_ERR_TRANSPORT and a message naming the peer and the CUDA error; the
 * other side does not hang (a failed sender's chunks arrive empty, a failed
 * eager copy arrives as a refusal), and the pipe goes on. */
TEST_F(DeviceTest, StagingFailure)
{
    int peer = partner();
    if (peer < 0)
        return;
    const size_t ch = cfg().cuda_stage_chunk;
    const bool sender = rank < peer;
    /* Sizes: an eager message (failing D2H bounce), a staged one. */
    const size_t eager_n = 3000 < cfg().shm_eager_limit ? 3000 : 100;
    const size_t sizes[] = { eager_n, 4 * ch + 5 };
    for (size_t n : sizes) {
        for (int failing_side = 0; failing_side < 2; failing_side++) {   /* 0: sender's copy, 1: receiver's */
            if (failing_side == 1 && n == eager_n)
                continue;   /* an eager H2D failure is the plain local case */
            const size_t short_n = n / 2 > 8192 ? n / 2 : 64;
            void *d = nullptr;
            bool my_short = (failing_side == 0) == sender;
            ASSERT_EQ(cudaMalloc(&d, my_short ? short_n : n), cudaSuccess);
            if (sender) {
                ASSERT_EQ(cudaMemset(d, 1, my_short ? short_n : n), cudaSuccess);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            }
            weft_status_t st;
            int rc = sender ? weft_send(comm, d, n, peer, 9) : weft_recv(comm, d, n, peer, 9, &st);
            if (my_short) {
                EXPECT_EQ(rc, WEFT_ERR_TRANSPORT) << n << " bytes, failing side " << failing_side;
                std::string e = last_error();
                EXPECT_NE(e.find("peer " + std::to_string(peer)), std::string::npos) << e;
                EXPECT_NE(e.find("failed"), std::string::npos) << e;
            } else if (failing_side == 0) {
                EXPECT_EQ(rc, WEFT_ERR_TRANSPORT) << "receiver of a failed send, " << n << " bytes";
                EXPECT_NE(last_error().find("sender failed"), std::string::npos) << last_error();
            } else {
                EXPECT_EQ(rc, WEFT_SUCCESS) << "sender to a failing receiver: its data left: " << last_error();
            }
            cudaFree(d);
            /* The pipe carries on. */
            exchange(true, true, 2 * ch + 1, 10, n + (size_t)failing_side);
        }
    }
}

/* A comm created with WEFT_ALLGATHER_ALGO=algo (its configuration).
 * Collective; the same algo on every rank. */
static weft_comm_t *comm_with_algo(const char *algo)
{
    weft_comm_t *c = nullptr;
    int rc = create_with(MPI_COMM_WORLD, {{"WEFT_ALLGATHER_ALGO", algo}}, &c);
    EXPECT_EQ(rc, WEFT_SUCCESS) << "weft_comm_create_config with WEFT_ALLGATHER_ALGO=" << algo;
    return rc == WEFT_SUCCESS ? c : nullptr;
}

/* Allgather with device buffers under every algorithm that applies, each on
 * a comm of its own. */
TEST_F(DeviceTest, AllgatherEveryAlgorithm)
{
    const char *algos[] = { "auto", "ring", "rd", "bruck", "direct", "hier" };
    const size_t blocks[] = { 1, 1000, 70 * 1024 + 3 };
    uint64_t index = 0;
    for (const char *algo : algos) {
        if (std::string(algo) == "rd" && (size & (size - 1)) != 0)
            continue;
        weft_comm_t *ac = comm_with_algo(algo);
        ASSERT_NE(ac, nullptr);
        for (size_t b : blocks) {
            for (int mode = 0; mode < 3; mode++) {   /* 0: dev->dev, 1: host->dev, 2: in place (dev) */
                Buf rb(true, b * (size_t)size);
                Buf sb(mode == 1 ? false : true, b);
                uint64_t seed = pattern_seed(rank, 11, index);
                std::vector<unsigned char> mine(b);
                fill_pattern(mine.data(), b, seed);
                const void *send = sb.data();
                if (mode == 2) {
                    ASSERT_EQ(cudaMemcpy(static_cast<char *>(rb.data()) + (size_t)rank * b, mine.data(), b,
                                         cudaMemcpyHostToDevice), cudaSuccess);
                    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);   /* a pageable H2D lands late */
                    send = static_cast<char *>(rb.data()) + (size_t)rank * b;
                } else {
                    sb.put(mine.data(), b);
                }
                ASSERT_EQ(weft_allgather(ac, send, rb.data(), b), WEFT_SUCCESS)
                    << algo << " block " << b << " mode " << mode << ": " << weft_comm_last_error(ac);
                std::vector<unsigned char> h = rb.get();
                for (int p = 0; p < size; p++)
                    ASSERT_EQ(pattern_mismatch(h.data() + (size_t)p * b, b, pattern_seed(p, 11, index)), SIZE_MAX)
                        << algo << " block " << b << " mode " << mode << ": block of rank " << p;
                for (size_t i = 0; i < kTail; i++)
                    ASSERT_EQ(h[(size_t)size * b + i], kMark) << algo << ": written past recvbuf";
            }
            index++;
        }
        ASSERT_EQ(weft_comm_destroy(ac), WEFT_SUCCESS);
    }
}

/* Bcast with a device buffer: the tree (small) and scatter + ring (large). */
TEST_F(DeviceTest, Bcast)
{
    const size_t sizes[] = { 1, 4099, (size_t)300 * 1024 + 7 };
    uint64_t index = 0;
    for (int root : { 0, size - 1 }) {
        for (size_t n : sizes) {
            Buf b(true, n);
            if (rank == root)
                b.fill(pattern_seed(root, 12, index));
            ASSERT_EQ(weft_bcast(comm, b.data(), n, root), WEFT_SUCCESS) << last_error();
            EXPECT_TRUE(b.Holds(pattern_seed(root, 12, index), n)) << "bcast of " << n << " from root " << root;
            index++;
        }
    }
}

/* Run with WEFT_CUDA_LIB=/nonexistent: weft has no CUDA (the test program
 * still has the emulated runtime). A device pointer is refused with a
 * message naming the call, the pointer's kind and why; host traffic works. */
class DeviceNoCuda : public DeviceTest {};

TEST_F(DeviceNoCuda, DevicePointerRefusedHostWorks)
{
    int peer = (rank + 1) % size, from = (rank + size - 1) % size;
    Buf d(true, 4096);
    weft_request_t *r = nullptr;
    EXPECT_EQ(weft_isend(comm, d.data(), 4096, peer, 1, &r), WEFT_ERR_UNSUPPORTED);
    std::string e = last_error();
    EXPECT_NE(e.find("weft_isend"), std::string::npos) << e;
    EXPECT_NE(e.find("device memory"), std::string::npos) << e;
    EXPECT_NE(e.find("/nonexistent"), std::string::npos) << e;
    EXPECT_EQ(weft_irecv(comm, d.data(), 4096, from, 1, &r), WEFT_ERR_UNSUPPORTED);
    EXPECT_NE(last_error().find("weft_irecv"), std::string::npos) << last_error();
    EXPECT_EQ(weft_send(comm, d.data(), 1, rank, 1), WEFT_ERR_UNSUPPORTED);
    /* A 0-byte message moves nothing: its pointer is not looked at. */
    weft_request_t *z[2];
    ASSERT_EQ(weft_irecv(comm, d.data(), 0, from, 2, &z[0]), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(weft_isend(comm, d.data(), 0, peer, 2, &z[1]), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(weft_waitall(2, z, nullptr), WEFT_SUCCESS) << last_error();
    /* Host buffers: as always. */
    for (size_t n : { (size_t)10, (size_t)1 << 20 }) {
        std::vector<unsigned char> s(n), rv(n);
        fill_pattern(s.data(), n, pattern_seed(rank, 3, n));
        weft_request_t *reqs[2];
        ASSERT_EQ(weft_irecv(comm, rv.data(), n, from, 3, &reqs[0]), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_isend(comm, s.data(), n, peer, 3, &reqs[1]), WEFT_SUCCESS) << last_error();
        ASSERT_EQ(weft_waitall(2, reqs, nullptr), WEFT_SUCCESS) << last_error();
        EXPECT_TRUE(HasPattern(rv.data(), n, from, 3, n));
    }
    /* A collective with device buffers fails the same way on every rank
     * (ring: its first step is a receive into recvbuf, refused at once). */
    Buf rb(true, 64 * (size_t)size);
    weft_comm_t *ring = comm_with_algo("ring");
    ASSERT_NE(ring, nullptr);
    EXPECT_EQ(weft_allgather(ring, d.data(), rb.data(), 64), WEFT_ERR_UNSUPPORTED);
    EXPECT_EQ(weft_comm_destroy(ring), WEFT_SUCCESS);
}

} // namespace
