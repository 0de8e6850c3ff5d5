// CUDA IPC between ranks of one node (p2p/transport/cuda_ipc/cuda_ipc.c), over the emulated
// CUDA runtime (tests/emu/cuda), which this binary links directly; weft
// loads the same file (WEFT_CUDA_LIB), so both share one emulated GPU state
// and the emulator's counters ("ipc_open", "ipc_close", "ipc_get",
// "ipc_imports") show what weft did in this process.
//
// Ranks use device (rank % device count): neighbours in a ring are on
// different devices, ranks two apart on the same one.
//
//   CudaIpc.*        (WEFT_TRANSPORTS=shm) data through IPC at several sizes,
//                    the import cache by block (a buffer used again opens
//                    nothing, nor does another buffer of a block already
//                    mapped; a block freed and made again at the same address
//                    gets a fresh mapping; eviction beyond
//                    WEFT_CUDA_IPC_CACHE), a mapping the application holds
//                    (staged instead, both sides succeed), a stream-ordered
//                    receive whose slot the sender's GPU writes, a
//                    stream-ordered send that may not open a mapping on weft's
//                    thread (staged, nothing refused), no dead signal writes
//                    for ordinary receives, and the trace lines.
//
// The emulator carves allocations below 2 MiB out of shared 2 MiB blocks
// and maps whole blocks on import, as drivers do: tests that want a block
// of their own allocate 2 MiB or more.
//   CudaIpcNoPeer.*  (WEFT_EMU_CUDA_NO_PEER=0-1) devices 0 and 1 cannot reach
//                    each other: the pair is not eligible, the transfer is
//                    staged through host memory and still correct.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "weft_emu_cuda.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

unsigned long long counter(const char *name) { return weft_emu_cuda_counter(name); }

int device_count()
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

/* A device buffer of the test (freed at scope exit unless released). */
struct DevBuf {
    void *p = nullptr;
    size_t n = 0;
    explicit DevBuf(size_t bytes) : n(bytes)
    {
        cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
        if (e != cudaSuccess) {
            ADD_FAILURE() << "cudaMalloc(" << bytes << "): " << cudaGetErrorString(e);
            p = nullptr;
        }
    }
    ~DevBuf() { reset(); }
    void reset()
    {
        if (p)
            cudaFree(p);
        p = nullptr;
    }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;

    void fill(uint64_t seed)
    {
        std::vector<unsigned char> h(n);
        fill_pattern(h.data(), n, seed);
        ASSERT_EQ(cudaMemcpy(p, h.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);   /* a pageable H2D lands late */
    }
    void zero()
    {
        std::vector<unsigned char> h(n, 0xee);
        ASSERT_EQ(cudaMemcpy(p, h.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    /* Offset of the first byte that differs from the pattern, SIZE_MAX if none. */
    size_t mismatch(uint64_t seed, size_t bytes) const
    {
        std::vector<unsigned char> h(bytes);
        if (cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
            return 0;
        return pattern_mismatch(h.data(), bytes, seed);
    }
};

class CudaIpcBase : public WeftMpiTest {
protected:
    int ndev = 0;
    int mydev = 0;

    void SetUp() override
    {
        ndev = device_count();
        mydev = ndev > 0 ? world_rank() % ndev : 0;
        if (ndev > 0)
            cudaSetDevice(mydev);
        WeftMpiTest::SetUp();
    }

    int right() const { return (rank + 1) % size; }
    int left() const { return (rank - 1 + size) % size; }

    /* One message from every rank to (rank + dist), received from
     * (rank - dist), into rbuf (n bytes of it). Checks the data. */
    void ring(weft_comm_t *c, DevBuf &sbuf, DevBuf &rbuf, size_t n, int tag, uint64_t index, int dist = 1)
    {
        int to = (rank + dist) % size, from = (rank - dist + size) % size;
        sbuf.fill(pattern_seed(rank, tag, index));
        rbuf.zero();
        weft_request_t *reqs[2] = {nullptr, nullptr};
        ASSERT_EQ(weft_irecv(c, rbuf.p, rbuf.n, from, tag, &reqs[0]), WEFT_SUCCESS) << weft_comm_last_error(c);
        ASSERT_EQ(weft_isend(c, sbuf.p, n, to, tag, &reqs[1]), WEFT_SUCCESS) << weft_comm_last_error(c);
        weft_status_t st[2];
        ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << weft_comm_last_error(c);
        EXPECT_EQ(st[0].bytes, n);
        size_t bad = rbuf.mismatch(pattern_seed(from, tag, index), n);
        EXPECT_EQ(bad, SIZE_MAX) << "message of " << n << " bytes from rank " << from << " differs at byte " << bad;
    }

    /* A comm of its own with settings of its own (its configuration). */
    weft_comm_t *create_with_settings(const Settings &settings)
    {
        weft_comm_t *c = nullptr;
        int rc = create_with(MPI_COMM_WORLD, settings, &c);
        EXPECT_EQ(rc, WEFT_SUCCESS) << settings_text(settings) << ": " << weft_last_error();
        return rc == WEFT_SUCCESS ? c : nullptr;
    }
};

class CudaIpc : public CudaIpcBase {};
class CudaIpcNoPeer : public CudaIpcBase {};

/* Above the shm eager limit (4 KiB by default): rendezvous, the IPC path. */
const size_t kSizes[] = {4097, 8192 + 3, 65536, (1u << 20) + 7, 4u << 20};

TEST_F(CudaIpc, DataAtSeveralSizes)
{
    ASSERT_GT(ndev, 0);
    unsigned long long opens0 = counter("ipc_open"), writes0 = counter("write_value");
    int tag = 1;
    for (size_t n : kSizes) {
        DevBuf s(n), r(n + 64);
        ring(comm, s, r, n, tag++, n);
    }
    const unsigned long long nsizes = sizeof(kSizes) / sizeof(kSizes[0]);
    /* Every size went through IPC: at most one mapping per receive buffer
     * (each iteration frees its buffers, so the next one's block is new;
     * buffers sharing a block with one still mapped open nothing). An
     * ordinary receive has no signal slot: nothing is written after the
     * copy (the old per-peer semaphore nobody waited on is gone). */
    EXPECT_GE(counter("ipc_open") - opens0, 1u);
    EXPECT_LE(counter("ipc_open") - opens0, nsizes);
    EXPECT_EQ(counter("write_value") - writes0, 0u);
}

TEST_F(CudaIpc, SameDevicePairs)
{
    if (size < 4)
        GTEST_SKIP() << "needs ranks two apart on the same device";
    ASSERT_GT(ndev, 0);
    unsigned long long opens0 = counter("ipc_open");
    DevBuf s(1 << 20), r(1 << 20);
    ring(comm, s, r, 1 << 20, 7, 0, 2);
    ring(comm, s, r, 1 << 20, 7, 1, 2);
    EXPECT_EQ(counter("ipc_open") - opens0, 1u);   /* the buffer's block, once (the peer's slots at create) */
}

TEST_F(CudaIpc, SameBufferTwiceOpensOnce)
{
    ASSERT_GT(ndev, 0);
    const size_t n = 256 << 10;
    DevBuf s(n), r(n);
    ring(comm, s, r, n, 3, 0);   /* warm: this buffer's block */
    unsigned long long opens0 = counter("ipc_open"), gets0 = counter("ipc_get");
    for (int i = 1; i <= 4; i++)
        ring(comm, s, r, n, 3, (uint64_t)i);
    EXPECT_EQ(counter("ipc_open") - opens0, 0u) << "a buffer used again was opened again";
    EXPECT_EQ(counter("ipc_get") - gets0, 0u) << "a buffer used again was exported again";
    /* An offset into the same allocation is the same mapping too. */
    DevBuf s2(n);
    s2.fill(pattern_seed(rank, 4, 9));
    weft_request_t *reqs[2];
    ASSERT_EQ(weft_irecv(comm, (char *)r.p + 4096, n - 4096, left(), 4, &reqs[0]), WEFT_SUCCESS);
    ASSERT_EQ(weft_isend(comm, s2.p, n - 4096, right(), 4, &reqs[1]), WEFT_SUCCESS);
    ASSERT_EQ(weft_waitall(2, reqs, nullptr), WEFT_SUCCESS) << last_error();
    std::vector<unsigned char> h(n - 4096);
    ASSERT_EQ(cudaMemcpy(h.data(), (char *)r.p + 4096, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(pattern_mismatch(h.data(), h.size(), pattern_seed(left(), 4, 9)), SIZE_MAX);
    EXPECT_EQ(counter("ipc_open") - opens0, 0u);
}

TEST_F(CudaIpc, FreeAndReallocGetsFreshMapping)
{
    ASSERT_GT(ndev, 0);
    /* A block of its own (2 MiB or more): freed, the block goes, and the
     * next allocation of that size gets the same address in a new block. */
    const size_t n = (2u << 20) + 192 * 1024;
    DevBuf s(n);
    auto r = std::make_unique<DevBuf>(n);
    ring(comm, s, *r, n, 5, 0);
    void *old = r->p;
    r->reset();
    r = std::make_unique<DevBuf>(n);
    bool same_addr = r->p == old;
    EXPECT_TRUE(same_addr) << "the emulator did not reuse the address; the test proves less";
    /* Make sure every rank reallocated before anyone sends into the new buffer. */
    MPI_Barrier(MPI_COMM_WORLD);
    unsigned long long opens0 = counter("ipc_open"), closes0 = counter("ipc_close");
    ring(comm, s, *r, n, 5, 1);
    EXPECT_EQ(counter("ipc_open") - opens0, 1u) << "the new block needs a new mapping";
    EXPECT_EQ(counter("ipc_close") - closes0, 1u) << "the stale mapping must be closed";
    ring(comm, s, *r, n, 5, 2);
    EXPECT_EQ(counter("ipc_open") - opens0, 1u);
}

TEST_F(CudaIpc, BufferInMappedBlockOpensNothing)
{
    ASSERT_GT(ndev, 0);
    /* r and r2 are small: carved from one 2 MiB block (the emulator's
     * first fit, as drivers do), which the sender maps once. A second open
     * of that block would be refused (cudaErrorAlreadyMapped), so a cache
     * keyed by allocation could not send into r2 at all. */
    const size_t n = 64 << 10;
    DevBuf s(n), r(n), r2(n);
    unsigned long long b1 = 0, b2 = 0;
    ASSERT_EQ(cuPointerGetAttribute(&b1, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, (CUdeviceptr)r.p), CUDA_SUCCESS);
    ASSERT_EQ(cuPointerGetAttribute(&b2, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, (CUdeviceptr)r2.p), CUDA_SUCCESS);
    ASSERT_EQ(b1, b2) << "the two buffers are not in one block: the test proves less";
    ring(comm, s, r, n, 6, 0);
    unsigned long long opens0 = counter("ipc_open"), gets0 = counter("ipc_get");
    ring(comm, s, r2, n, 6, 1);
    EXPECT_EQ(counter("ipc_open") - opens0, 0u) << "a buffer of a block already mapped was opened again";
    EXPECT_EQ(counter("ipc_get") - gets0, 1u) << "the new allocation is exported (its handle) once";
    /* Freed and made again inside the same (live) block: the mapping still
     * reaches it. */
    void *old = r2.p;
    r2.reset();
    DevBuf r3(n);
    EXPECT_EQ(r3.p, old) << "first fit in the block gave another address: the test proves less";
    MPI_Barrier(MPI_COMM_WORLD);
    ring(comm, s, r3, n, 6, 2);
    EXPECT_EQ(counter("ipc_open") - opens0, 0u);
}

/* Two blocks freed and one larger block made over both: the sender's
 * mapping of the first is stale (same base, new block id) and closed, but
 * its mapping of the second still covers part of the new block, and the
 * open is refused (cudaErrorAlreadyMapped). weft closes the idle mappings
 * that overlap and opens again (UCX's order): the message still goes by IPC. */
TEST_F(CudaIpc, OverlappingStaleMappingIsClosedAndRetried)
{
    ASSERT_GT(ndev, 0);
    const size_t blk = 6u << 20;
    DevBuf s(2 * blk);
    /* a and b side by side: carved from a freed range of twice the size. */
    void *span = nullptr;
    ASSERT_EQ(cudaMalloc(&span, 2 * blk), cudaSuccess);
    ASSERT_EQ(cudaFree(span), cudaSuccess);
    auto a = std::make_unique<DevBuf>(blk);
    auto b = std::make_unique<DevBuf>(blk);
    ring(comm, s, *a, blk, 33, 0);
    ring(comm, s, *b, blk, 33, 1);
    const bool adjacent = (char *)b->p == (char *)a->p + blk;
    void *old = a->p;
    b->reset();
    a->reset();
    DevBuf c(2 * blk);
    const bool over_both = adjacent && c.p == old;
    EXPECT_TRUE(over_both) << "the new block does not cover both old ones: the test proves less";
    MPI_Barrier(MPI_COMM_WORLD);
    unsigned long long opens0 = counter("ipc_open"), closes0 = counter("ipc_close");
    std::string log = capture_stderr([&] { ring(comm, s, c, 2 * blk, 34, 0); });
    EXPECT_EQ(log.find("staged"), std::string::npos) << log;
    EXPECT_EQ(counter("ipc_open") - opens0, 1u) << "the new block was not opened (staged instead?)";
    EXPECT_EQ(counter("ipc_close") - closes0, 2u) << "the stale and the overlapping mapping are closed";
}

TEST_F(CudaIpc, ManyBuffersBeyondCacheCap)
{
    ASSERT_GT(ndev, 0);
    unsigned long long imports0 = counter("ipc_imports");
    weft_comm_t *c = create_with_settings({{"WEFT_CUDA_IPC_CACHE", "4"}});
    ASSERT_NE(c, nullptr);
    /* The peers' signal slots are mapped at create, outside the cache. */
    unsigned long long imports1 = counter("ipc_imports");
    const size_t n = 16 << 10;
    const int nbuf = 10;
    DevBuf s(n);
    std::vector<std::unique_ptr<DevBuf>> rb;
    for (int i = 0; i < nbuf; i++)
        rb.push_back(std::make_unique<DevBuf>((2u << 20) + 4096 * (size_t)i));   /* a block each */
    unsigned long long opens0 = counter("ipc_open");
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < nbuf; i++) {
            ring(c, s, *rb[i], n, 10 + i, (uint64_t)(round * nbuf + i));
            /* Never more than the cap open at once. */
            EXPECT_LE(counter("ipc_imports") - imports1, 4u);
        }
    /* LRU over 10 blocks cycled through a cache of 4: every use misses. */
    EXPECT_EQ(counter("ipc_open") - opens0, 2u * nbuf);
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    /* Destroy closes every mapping of that comm, the slots included. */
    EXPECT_EQ(counter("ipc_imports"), imports0);
}

/* Several messages in flight to one peer at once, from send buffers on
 * both devices (weft's streams and events of two devices: an event is
 * recorded only on a stream of its own device), into distinct receive
 * buffers. */
TEST_F(CudaIpc, ManyInFlightFromTwoDevices)
{
    ASSERT_GT(ndev, 0);
    const int k = 8;
    const size_t n = 96 << 10;
    std::vector<std::unique_ptr<DevBuf>> sb, rb;
    for (int i = 0; i < k; i++) {
        int d = ndev > 1 ? (mydev + i) % ndev : mydev;
        cudaSetDevice(d);
        sb.push_back(std::make_unique<DevBuf>(n + 512 * (size_t)i));
        cudaSetDevice(mydev);
        rb.push_back(std::make_unique<DevBuf>(n + 512 * (size_t)i));
        sb[i]->fill(pattern_seed(rank, 40 + i, (uint64_t)i));
        rb[i]->zero();
    }
    unsigned long long refused0 = counter("event_record_refused");
    std::vector<weft_request_t *> reqs(2 * k);
    for (int i = 0; i < k; i++)
        ASSERT_EQ(weft_irecv(comm, rb[i]->p, rb[i]->n, left(), 40 + i, &reqs[i]), WEFT_SUCCESS);
    for (int i = 0; i < k; i++)
        ASSERT_EQ(weft_isend(comm, sb[i]->p, n + 512 * (size_t)i, right(), 40 + i, &reqs[k + i]), WEFT_SUCCESS);
    ASSERT_EQ(weft_waitall(reqs.size(), reqs.data(), nullptr), WEFT_SUCCESS) << last_error();
    for (int i = 0; i < k; i++) {
        size_t bad = rb[i]->mismatch(pattern_seed(left(), 40 + i, (uint64_t)i), n + 512 * (size_t)i);
        EXPECT_EQ(bad, SIZE_MAX) << "message " << i << " differs at byte " << bad;
    }
    EXPECT_EQ(counter("event_record_refused") - refused0, 0u) << "an event was recorded on another device's stream";
}

/* The application itself has the receiver's buffer mapped (a second open
 * of that block in one process is refused by the emulator, as by drivers
 * that report cudaErrorAlreadyMapped): weft closes its own idle mappings
 * that could be in the way and retries, then stages that message instead
 * of failing it -- both sides succeed, the data arrives, one warning names
 * the peer and the CUDA error -- and once the application lets go the same
 * buffer goes by IPC again. */
TEST_F(CudaIpc, BufferMappedByTheApplicationIsStaged)
{
    ASSERT_GT(ndev, 0);
    const size_t n = 2u << 20;   /* a block of its own: weft has not mapped it */
    DevBuf s(n), r(n), r2(n);
    ring(comm, s, r, n, 30, 0);
    cudaIpcMemHandle_t mine, theirs;
    ASSERT_EQ(cudaIpcGetMemHandle(&mine, r2.p), cudaSuccess);
    /* My handle to the rank that sends to me; the handle of the rank I send to. */
    MPI_Sendrecv(&mine, sizeof(mine), MPI_BYTE, left(), 99, &theirs, sizeof(theirs), MPI_BYTE, right(), 99,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    void *app_map = nullptr;
    ASSERT_EQ(cudaIpcOpenMemHandle(&app_map, theirs, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
    MPI_Barrier(MPI_COMM_WORLD);

    unsigned long long opens0 = counter("ipc_open");
    std::string log = capture_stderr([&] { ring(comm, s, r2, n, 31, 0); });
    char want[96];
    std::snprintf(want, sizeof(want), "send to peer %d tag 31: cannot open the IPC handle", right());
    EXPECT_NE(log.find(want), std::string::npos) << log;
    EXPECT_NE(log.find("resource already mapped"), std::string::npos) << log;
    EXPECT_NE(log.find("this message is staged"), std::string::npos) << log;
    EXPECT_EQ(counter("ipc_open") - opens0, 0u);

    /* Once the application lets go, the same buffer goes by IPC. */
    ASSERT_EQ(cudaIpcCloseMemHandle(app_map), cudaSuccess);
    MPI_Barrier(MPI_COMM_WORLD);
    ring(comm, s, r2, n, 32, 1);
    EXPECT_EQ(counter("ipc_open") - opens0, 1u);
}

/* A stream-ordered receive whose data comes by CUDA IPC waits on the device
 * for its signal slot, which the sender's GPU writes right after its copy:
 * the receiver's stream goes on without its host seeing the FIN first. On
 * every rank: one wait on device memory (the slot, not the host counter),
 * one value written by this process (its send's signal into the right
 * neighbour's slot) and none by its own weft for its receive. */
TEST_F(CudaIpc, StreamReceiveSignaledBySendersGpu)
{
    ASSERT_GT(ndev, 0);
    const size_t n = 256 << 10;
    DevBuf s(n), r(n), out(n);
    cudaStream_t st;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    ring(comm, s, r, n, 33, 0);   /* every sender has mapped its receiver's block */
    s.fill(pattern_seed(rank, 34, 1));
    r.zero();
    MPI_Barrier(MPI_COMM_WORLD);
    unsigned long long dwait0 = counter("wait_value_device"), writes0 = counter("write_value");
    ASSERT_EQ(weft_recv_on_stream(comm, r.p, n, left(), 34, st), WEFT_SUCCESS) << last_error();
    /* What the stream does next sees the data. */
    ASSERT_EQ(cudaMemcpyAsync(out.p, r.p, n, cudaMemcpyDeviceToDevice, st), cudaSuccess);
    ASSERT_EQ(weft_send(comm, s.p, n, right(), 34), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(out.mismatch(pattern_seed(left(), 34, 1), n), SIZE_MAX);
    EXPECT_EQ(counter("wait_value_device") - dwait0, 1u) << "the receive's stream did not wait on its slot";
    MPI_Barrier(MPI_COMM_WORLD);   /* every send's signal is written */
    EXPECT_EQ(counter("write_value") - writes0, 1u) << "one signal per message, written by the sender's GPU";
    ASSERT_EQ(cudaStreamDestroy(st), cudaSuccess);
}

/* A stream-ordered send is started by weft's progress thread while its
 * stream waits on weft: opening the receiver's buffer there (a call that
 * may wait for the device: WEFT_CUDA_IPC_OPEN_SYNCS) is not done, the
 * message is announced again and staged (RTS REDO) -- data right, nothing
 * opened, no device-synchronising call refused by the emulator. The same
 * buffer from the application's thread then goes by IPC. */
TEST_F(CudaIpc, StreamSendStagedWhenItMayNotOpen)
{
    ASSERT_GT(ndev, 0);
    const size_t n = 2u << 20;   /* a block of its own, not mapped by anyone yet */
    DevBuf s(n), r(n);
    cudaStream_t st;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    s.fill(pattern_seed(rank, 35, 0));
    r.zero();
    MPI_Barrier(MPI_COMM_WORLD);
    unsigned long long opens0 = counter("ipc_open"), refused0 = counter("sync_refused");
    ASSERT_EQ(weft_send_on_stream(comm, s.p, n, right(), 35, st), WEFT_SUCCESS) << last_error();
    weft_status_t status;
    ASSERT_EQ(weft_recv(comm, r.p, n, left(), 35, &status), WEFT_SUCCESS) << last_error();
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(weft_comm_async_error(comm), WEFT_SUCCESS) << last_error();
    EXPECT_EQ(r.mismatch(pattern_seed(left(), 35, 0), n), SIZE_MAX);
    EXPECT_EQ(counter("ipc_open") - opens0, 0u) << "weft's thread opened a mapping while its stream waited";
    EXPECT_EQ(counter("sync_refused") - refused0, 0u) << "weft's thread made a device-synchronising call";
    MPI_Barrier(MPI_COMM_WORLD);
    ring(comm, s, r, n, 36, 1);
    EXPECT_EQ(counter("ipc_open") - opens0, 1u) << "from the application's thread it goes by IPC";
    ASSERT_EQ(cudaStreamDestroy(st), cudaSuccess);
}

/* Every mapping of a peer's memory goes before the final barrier, and what
 * a rank exported (its signal slots) is freed after it: no rank frees
 * memory another still has open (undefined on a GPU; the emulator counts
 * it). */
TEST_F(CudaIpc, DestroyFreesNothingStillImported)
{
    ASSERT_GT(ndev, 0);
    const size_t n = 2u << 20;   /* blocks of their own: no earlier test's mapping reaches them */
    unsigned long long freed0 = counter("free_imported");
    for (int round = 0; round < 3; round++) {
        weft_comm_t *c = create_with_settings({});
        ASSERT_NE(c, nullptr);
        DevBuf s(n), r(n);
        ring(c, s, r, n, 37, (uint64_t)round);
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ(counter("free_imported") - freed0, 0u);
}

TEST_F(CudaIpc, TraceShowsIpcPath)
{
    ASSERT_GT(ndev, 0);
    const size_t n = 1 << 20;
    DevBuf s(n), r(n);
    weft_comm_t *c = nullptr;
    std::string log = capture_stderr([&] {
        c = create_with_settings({{"WEFT_DEBUG", "trace"}});
        if (c)
            ring(c, s, r, n, 21, 0);
    });
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    weft_comm_t *quiet = create_with_settings({{"WEFT_DEBUG", "none"}});   /* level back to quiet */
    ASSERT_NE(quiet, nullptr);
    EXPECT_EQ(weft_comm_destroy(quiet), WEFT_SUCCESS);
    char want_send[128], want_recv[128];
    std::snprintf(want_send, sizeof(want_send), "cuda_ipc: send to peer %d tag 21: %zu bytes", right(), n);
    std::snprintf(want_recv, sizeof(want_recv), "cuda_ipc: recv from peer %d tag 21: exported buffer", left());
    EXPECT_NE(log.find(want_send), std::string::npos) << "no IPC send line in:\n" << log;
    EXPECT_NE(log.find("by CUDA IPC"), std::string::npos) << log;
    EXPECT_NE(log.find(want_recv), std::string::npos) << "no IPC export line in:\n" << log;
    EXPECT_NE(log.find("opened IPC mapping"), std::string::npos) << log;
}

TEST_F(CudaIpcNoPeer, UnreachablePairIsStaged)
{
    ASSERT_GT(ndev, 1);
    const char *np = std::getenv("WEFT_EMU_CUDA_NO_PEER");
    ASSERT_TRUE(np && std::string(np) == "0-1") << "run with WEFT_EMU_CUDA_NO_PEER=0-1";
    int can = -1;
    ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 1), cudaSuccess);
    EXPECT_EQ(can, 0);
    unsigned long long opens0 = counter("ipc_open");
    int tag = 1;
    for (size_t n : kSizes) {
        DevBuf s(n), r(n);
        ring(comm, s, r, n, tag++, n);   /* neighbours are on devices 0 and 1 */
    }
    EXPECT_EQ(counter("ipc_open") - opens0, 0u) << "an unreachable pair went through IPC";
}

TEST_F(CudaIpcNoPeer, SameDeviceStillUsesIpc)
{
    if (size < 4)
        GTEST_SKIP() << "needs ranks two apart on the same device";
    unsigned long long opens0 = counter("ipc_open");
    DevBuf s(1 << 20), r(1 << 20);
    ring(comm, s, r, 1 << 20, 7, 0, 2);
    EXPECT_EQ(counter("ipc_open") - opens0, 1u);   /* the buffer's block */
}

} // namespace
