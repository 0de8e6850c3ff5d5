/*
 * GPUDirect RDMA over the ib transport (p2p/transport/ib/ib_gdr.c, docs/ib.md) and the
 * NIC each GPU uses, over the emulated verbs device and the emulated CUDA
 * runtime (the binary links it; weft loads the same file through
 * WEFT_CUDA_LIB), between two virtual nodes (shm inside, ib across).
 *
 * The ctest entries (mpi_tests/CMakeLists.txt, the weft_mpi_gdr block) set:
 *   WEFT_GDR_EXPECT=dmabuf   WEFT_EMU_CUDA_GDR=1: device data goes by RDMA
 *                            from/to device memory registered through dma-buf
 *   WEFT_GDR_EXPECT=peermem  WEFT_EMU_CUDA_GDR=0, WEFT_EMU_VERBS_PEERMEM=1:
 *                            plain ibv_reg_mr of device memory (nvidia-peermem)
 *   WEFT_GDR_EXPECT=staged   no GPUDirect (WEFT_EMU_CUDA_GDR=0, or
 *                            WEFT_IB_GDR=0): the same transfers, staged
 *   GdrRequired.*            WEFT_IB_GDR=1 where GPUDirect is impossible
 *   GdrAffinity.*            tests/topo/2gpu-2nic.xml, GPUs and NICs named as
 *                            there; each rank on the GPU the rank-spreading
 *                            rule would not give it
 * Proof of the path: the WEFT_DEBUG=info lines, captured from stderr.
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

/* The rank on the other virtual node at the same position (2 nodes). */
int partner(int rank, int size)
{
    return (rank + size / 2) % size;
}

enum Kind { HOST, DEV };

struct Buf {
    Kind kind;
    size_t n;
    void *p = nullptr;
    std::vector<unsigned char> host;
    Buf(Kind k, size_t bytes) : kind(k), n(bytes)
    {
        if (k == DEV) {
            EXPECT_EQ(cudaMalloc(&p, n ? n : 1), cudaSuccess);
        } else {
            host.resize(n ? n : 1);
            p = host.data();
        }
    }
    ~Buf()
    {
        if (kind == DEV && p)
            cudaFree(p);
    }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    void fill(uint64_t seed)
    {
        std::vector<unsigned char> v(n);
        fill_pattern(v.data(), n, seed);
        if (kind == DEV) {
            EXPECT_EQ(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
            /* From pageable memory the copy may land after cudaMemcpy
             * returned: weft's own streams do not wait for it. */
            EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        } else
            std::memcpy(p, v.data(), n);
    }
    void clear()
    {
        if (kind == DEV) {
            /* cudaMemset of device memory is asynchronous: it must be done
             * before the NIC writes (the RDMA path is not stream-ordered). */
            EXPECT_EQ(cudaMemset(p, 0, n), cudaSuccess);
            EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        } else
            std::memset(p, 0, n);
    }
    std::vector<unsigned char> read() const
    {
        std::vector<unsigned char> v(n);
        if (kind == DEV)
            EXPECT_EQ(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
        else
            std::memcpy(v.data(), p, n);
        return v;
    }
};

/* Sizes around the ib eager limit (8 KiB), the write chunk (1 MiB, and a
 * tail under 32 bytes that is merged), and several MiB. */
const size_t kSizes[] = { 8191, 8192, 8193, 65536 + 13, (1 << 20) - 1, 1 << 20, (1 << 20) + 1,
                          (1 << 20) + 17, (3 << 20) + 5, 8 << 20 };

/* Each rank sends a src-kind buffer to its partner and receives into a
 * dst-kind buffer from it, at every size; data checked exactly. */
void exchange_all(weft_comm_t *comm, Kind src, Kind dst, int tag)
{
    const int rank = world_rank(), size = world_size(), peer = partner(rank, size);
    for (size_t n : kSizes) {
        Buf out(src, n), in(dst, n);
        out.fill(pattern_seed(rank, tag, (int)n));
        in.clear();
        weft_request_t *reqs[2];
        weft_status_t st[2];
        ASSERT_EQ(weft_irecv(comm, in.p, n, peer, tag, &reqs[0]), WEFT_SUCCESS) << weft_comm_last_error(comm);
        ASSERT_EQ(weft_isend(comm, out.p, n, peer, tag, &reqs[1]), WEFT_SUCCESS) << weft_comm_last_error(comm);
        ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << n << " bytes: " << weft_comm_last_error(comm);
        EXPECT_EQ(st[0].bytes, n);
        std::vector<unsigned char> got = in.read();
        EXPECT_TRUE(HasPattern(got.data(), n, peer, tag, (int)n))
            << (src == DEV ? "device" : "host") << " -> " << (dst == DEV ? "device" : "host") << ", " << n
            << " bytes from peer " << peer;
    }
}

std::string expect_mode()
{
    return env_or("WEFT_GDR_EXPECT", "dmabuf");
}

}  // namespace

/* Device->device, host->device, device->host across the virtual nodes,
 * then a device buffer freed and allocated again at the same address (a
 * cached registration of the old one must not be used). */
TEST(Gdr, TransfersAcrossNodes)
{
    const int rank = world_rank(), size = world_size(), peer = partner(rank, size);
    ASSERT_EQ(cudaSetDevice(rank % 2), cudaSuccess);
    weft_comm_t *comm = nullptr;
    int rc = WEFT_ERR_INTERNAL;
    std::string log = capture_stderr([&] {
        rc = weft_comm_create(MPI_COMM_WORLD, &comm);
        if (rc != WEFT_SUCCESS)
            return;
        exchange_all(comm, DEV, DEV, 1);
        exchange_all(comm, HOST, DEV, 2);
        exchange_all(comm, DEV, HOST, 3);

        /* Same size after cudaFree: the emulator hands out the same address. */
        const size_t n = 2 << 20;
        void *first = nullptr;
        for (int round = 0; round < 2; round++) {
            Buf out(DEV, n), in(DEV, n);
            if (round == 0)
                first = in.p;
            else
                EXPECT_EQ(in.p, first) << "the emulator did not reuse the address: the test proves less";
            out.fill(pattern_seed(rank, 4, round));
            in.clear();
            weft_request_t *reqs[2];
            weft_status_t st[2];
            ASSERT_EQ(weft_irecv(comm, in.p, n, peer, 4, &reqs[0]), WEFT_SUCCESS);
            ASSERT_EQ(weft_isend(comm, out.p, n, peer, 4, &reqs[1]), WEFT_SUCCESS);
            ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << weft_comm_last_error(comm);
            std::vector<unsigned char> got = in.read();
            EXPECT_TRUE(HasPattern(got.data(), n, peer, 4, round)) << "round " << round;
        }
        EXPECT_EQ(weft_comm_destroy(comm), WEFT_SUCCESS);
    });
    ASSERT_EQ(rc, WEFT_SUCCESS) << log;

    const std::string mode = expect_mode();
    if (mode == "dmabuf") {
        EXPECT_NE(log.find("ib: GPUDirect RDMA: yes, "), std::string::npos) << log;
        EXPECT_NE(log.find("GPUDirect RDMA: first device buffer registered through dma-buf"), std::string::npos)
            << log;
    } else if (mode == "peermem") {
        EXPECT_NE(log.find("registers CUDA device memory through a peer-memory module"), std::string::npos) << log;
        EXPECT_NE(log.find("GPUDirect RDMA: first device buffer registered through peer memory"), std::string::npos)
            << log;
    } else {
        EXPECT_NE(log.find("ib: GPUDirect RDMA: no ("), std::string::npos) << log;
        EXPECT_EQ(log.find("device buffer registered through"), std::string::npos) << log;
    }
    EXPECT_FALSE(any_rank(::testing::Test::HasFailure()));
}

/* WEFT_IB_GDR=1 where no way of registering device memory works. */
TEST(GdrRequired, CreateFailsWithReason)
{
    weft_comm_t *comm = nullptr;
    int rc = WEFT_SUCCESS;
    std::string log = capture_stderr([&] { rc = weft_comm_create(MPI_COMM_WORLD, &comm); });
    EXPECT_NE(rc, WEFT_SUCCESS) << log;
    if (rc == WEFT_SUCCESS) {
        weft_comm_destroy(comm);
    } else {
        EXPECT_NE(log.find("WEFT_IB_GDR=1 but GPUDirect RDMA is not possible on rank"), std::string::npos) << log;
        EXPECT_NE(log.find("cuMemGetHandleForAddressRange"), std::string::npos) << log;
    }
    EXPECT_FALSE(any_rank(::testing::Test::HasFailure()));
}

/* tests/topo/2gpu-2nic.xml: cuda0 0000:04:00.0 and mlx5_0 under one PCIe
 * switch, cuda1 0000:08:00.0 and mlx5_1 under another. Rank r selects GPU
 * (r + 1) % 2, so spreading by rank (r % 2) would give the other NIC. */
TEST(GdrAffinity, EachRankUsesTheNicOfItsGpu)
{
    const int rank = world_rank(), size = world_size(), peer = partner(rank, size);
    const int dev = (rank + 1) % 2;
    const char *bus[2] = { "0000:04:00.0", "0000:08:00.0" };
    const char *nic[2] = { "mlx5_0", "mlx5_1" };
    ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
    weft_comm_t *comm = nullptr;
    int rc = WEFT_ERR_INTERNAL;
    std::string log = capture_stderr([&] { rc = weft_comm_create(MPI_COMM_WORLD, &comm); });
    ASSERT_EQ(rc, WEFT_SUCCESS) << log;
    const std::string want = "ib: GPU-NIC affinity: cuda" + std::to_string(dev) + " (" + bus[dev] + ") -> " +
                             nic[dev] + ": same PCIe switch";
    EXPECT_NE(log.find(want), std::string::npos) << "no '" << want << "' in:\n" << log;
    const std::string offer = std::string("ib: offering ") + nic[dev] + " port 1";
    EXPECT_NE(log.find(offer), std::string::npos) << "no '" << offer << "' in:\n" << log;

    /* And the pair works over it: a device rendezvous both ways. */
    const size_t n = (1 << 20) + 3;
    Buf out(DEV, n), in(DEV, n);
    out.fill(pattern_seed(rank, 9, 0));
    in.clear();
    weft_request_t *reqs[2];
    weft_status_t st[2];
    ASSERT_EQ(weft_irecv(comm, in.p, n, peer, 9, &reqs[0]), WEFT_SUCCESS);
    ASSERT_EQ(weft_isend(comm, out.p, n, peer, 9, &reqs[1]), WEFT_SUCCESS);
    ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << weft_comm_last_error(comm);
    std::vector<unsigned char> got = in.read();
    EXPECT_TRUE(HasPattern(got.data(), n, peer, 9, 0));
    EXPECT_EQ(weft_comm_destroy(comm), WEFT_SUCCESS);
    EXPECT_FALSE(any_rank(::testing::Test::HasFailure()));
}

/* The same topology, but WEFT_IB_HCA=mlx5_1,emu_2 (devices mlx5_0, mlx5_1,
 * emu_2): a rank on cuda1 gets mlx5_1; a rank on cuda0, whose NIC mlx5_0 is
 * not allowed, falls back to spreading by rank over mlx5_1 and emu_2. */
TEST(GdrAffinityFallback, DisallowedNicFallsBackToSpreading)
{
    const int rank = world_rank();
    const int dev = (rank + 1) % 2;
    const char *allowed[2] = { "mlx5_1", "emu_2" };
    ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
    weft_comm_t *comm = nullptr;
    int rc = WEFT_ERR_INTERNAL;
    std::string log = capture_stderr([&] { rc = weft_comm_create(MPI_COMM_WORLD, &comm); });
    ASSERT_EQ(rc, WEFT_SUCCESS) << log;
    std::string want, offer;
    if (dev == 1) {
        want = "ib: GPU-NIC affinity: cuda1 (0000:08:00.0) -> mlx5_1: same PCIe switch";
        offer = "ib: offering mlx5_1 port 1";
    } else {
        want = "ib: GPU-NIC affinity: cuda0 (0000:04:00.0) -> mlx5_0: same PCIe switch, which has no allowed "
               "ACTIVE port: spreading ranks over the ports";
        offer = std::string("ib: offering ") + allowed[rank % 2] + " port 1";
    }
    EXPECT_NE(log.find(want), std::string::npos) << "no '" << want << "' in:\n" << log;
    EXPECT_NE(log.find(offer), std::string::npos) << "no '" << offer << "' in:\n" << log;
    EXPECT_EQ(weft_comm_destroy(comm), WEFT_SUCCESS);
    EXPECT_FALSE(any_rank(::testing::Test::HasFailure()));
}
