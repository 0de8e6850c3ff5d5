/*
 * Test buffers in host or CUDA device memory, so the same MPI test sources
 * run with either (docs/testing.md, "Device buffers"):
 *
 *   WEFT_TEST_MEM=host     (default) buffers are host memory, exactly as the
 *                          tests always had them
 *   WEFT_TEST_MEM=device   buffers come from cudaMalloc; they are filled and
 *                          checked through cudaMemcpy. Only in binaries built
 *                          with WEFT_TEST_WITH_CUDA (the *_dev variants,
 *                          linked to libweft_emu_cuda.so or to the real
 *                          libcudart); a binary without it aborts the job.
 *   WEFT_TEST_SIZES=reduced  the tests drop their most expensive sizes
 *                          (p2p: nothing above 4 MiB + 5; collectives: the
 *                          short block list); for crowded device runs
 *   WEFT_TEST_DEVICE=d     device of every rank (default: node-local rank
 *                          modulo the device count)
 *
 * TestBuf is the one buffer type the converted tests use. Its data() is
 * what goes to weft (a device pointer in device mode); everything the test
 * itself does with the bytes (fill a pattern, check it, check guard bytes,
 * read one byte) goes through TestBuf's methods, which copy to and from the
 * device as needed. Three layouts:
 *
 *   kPlain     `size` bytes, zero-filled (like std::vector<unsigned char>(size))
 *   kSentinel  `size` bytes, not initialised, plus one byte kFreshByte at
 *              [size] (sentinel_intact()): "nothing written past the message"
 *   kGuarded   GuardedBuffer's layout (weft_mpi_test.h): `size` usable bytes
 *              `misalign` bytes past a 64-byte boundary, filled with
 *              kFreshByte, kGuardBytes+ of kGuardByte on both sides. In device
 *              mode the guards are device memory too, in the same allocation,
 *              and are copied back to be checked.
 *
 * Device-mode tests that cannot apply (host-only properties) skip with
 * WEFT_SKIP_IF_DEVICE_MEM("why"); the decision is the same on every rank.
 */
#ifndef WEFT_TEST_MEM_H
#define WEFT_TEST_MEM_H

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#ifdef WEFT_TEST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "weft_mpi_test.h"

namespace weft_mpitest {

enum class MemKind { Host, Device };

/* Aborts the whole job: a misconfigured run must not pass as a host run. */
[[noreturn]] inline void test_mem_abort(const std::string &why)
{
    int inited = 0;
    MPI_Initialized(&inited);
    std::fprintf(stderr, "[rank %d] weft_test_mem: %s\n", inited ? world_rank() : -1, why.c_str());
    std::fflush(stderr);
    if (inited)
        MPI_Abort(MPI_COMM_WORLD, 2);
    std::abort();
}

/* WEFT_TEST_MEM, read once. */
inline MemKind test_mem_kind()
{
    static const MemKind kind = [] {
        const std::string v = env_or("WEFT_TEST_MEM", "host");
        if (v.empty() || v == "host")
            return MemKind::Host;
        if (v != "device")
            test_mem_abort("WEFT_TEST_MEM=" + v + ": expected host or device");
#ifndef WEFT_TEST_WITH_CUDA
        test_mem_abort("WEFT_TEST_MEM=device, but this binary is built without CUDA: run the *_dev "
                       "variant (mpi_tests/device.cmake)");
#endif
        return MemKind::Device;
    }();
    return kind;
}

inline bool device_mem() { return test_mem_kind() == MemKind::Device; }

/* WEFT_TEST_SIZES=reduced: the tests leave out their most expensive sizes. */
inline bool reduced_sizes()
{
    static const bool r = [] {
        const std::string v = env_or("WEFT_TEST_SIZES", "full");
        if (v != "full" && v != "reduced")
            test_mem_abort("WEFT_TEST_SIZES=" + v + ": expected full or reduced");
        return v == "reduced";
    }();
    return r;
}

#define WEFT_SKIP_IF_DEVICE_MEM(why)                                                                     \
    do {                                                                                                  \
        if (::weft_mpitest::device_mem())                                                                 \
            GTEST_SKIP() << "host memory only (WEFT_TEST_MEM=device): " << why;                           \
    } while (0)

/* ---- the device side: plain CUDA runtime calls ---- */

namespace mem_detail {

#ifdef WEFT_TEST_WITH_CUDA
inline std::string cuda_why(const char *call, cudaError_t e)
{
    return std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}
#endif

/* Each returns "" or what failed. */
inline std::string dev_alloc(void **p, size_t bytes)
{
#ifdef WEFT_TEST_WITH_CUDA
    cudaError_t e = cudaMalloc(p, bytes);
    return e == cudaSuccess ? "" : cuda_why("cudaMalloc", e);
#else
    (void)p;
    (void)bytes;
    return "no CUDA in this binary";
#endif
}

inline void dev_free(void *p)
{
#ifdef WEFT_TEST_WITH_CUDA
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess)
        ADD_FAILURE() << cuda_why("cudaFree", e);
#else
    (void)p;
#endif
}

inline std::string copy(void *dst, const void *src, size_t n, bool to_device)
{
#ifdef WEFT_TEST_WITH_CUDA
    cudaError_t e = cudaMemcpy(dst, src, n, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    /* A copy from pageable host memory may return before its DMA into the
     * device is done; weft's own streams need not wait for it: wait here. */
    if (e == cudaSuccess && to_device)
        e = cudaDeviceSynchronize();
    return e == cudaSuccess ? "" : cuda_why(to_device ? "cudaMemcpy H2D" : "cudaMemcpy D2H", e);
#else
    (void)dst;
    (void)src;
    (void)n;
    (void)to_device;
    return "no CUDA in this binary";
#endif
}

inline std::string set(void *dst, unsigned char byte, size_t n)
{
#ifdef WEFT_TEST_WITH_CUDA
    cudaError_t e = cudaMemset(dst, byte, n);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize(); /* cudaMemset is asynchronous to the host */
    return e == cudaSuccess ? "" : cuda_why("cudaMemset", e);
#else
    (void)dst;
    (void)byte;
    (void)n;
    return "no CUDA in this binary";
#endif
}

/* Host staging for fills and checks: large buffers go through in pieces. */
constexpr size_t kStageBytes = 64u << 20;

/* Picks the rank's device before the first test: WEFT_TEST_DEVICE, else the
 * node-local rank (from the launcher's environment: no MPI collective) modulo
 * the device count. Rank 0 says what the run uses. */
class TestMemEnvironment : public ::testing::Environment {
public:
    void SetUp() override
    {
        if (!device_mem())
            return;
        (void)reduced_sizes();
#ifdef WEFT_TEST_WITH_CUDA
        int count = 0;
        cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess || count < 1)
            test_mem_abort("WEFT_TEST_MEM=device but no CUDA device: " +
                           (e != cudaSuccess ? cuda_why("cudaGetDeviceCount", e) : std::string("0 devices")));
        int dev = -1;
        if (const char *d = std::getenv("WEFT_TEST_DEVICE")) {
            dev = std::atoi(d);
        } else {
            int local = 0;
            for (const char *v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MPI_LOCAL_RANK", "SLURM_LOCALID"})
                if (const char *s = std::getenv(v)) {
                    local = std::atoi(s);
                    break;
                }
            dev = local % count;
        }
        if (dev < 0 || dev >= count)
            test_mem_abort("WEFT_TEST_DEVICE=" + std::to_string(dev) + ": " + std::to_string(count) +
                           " device(s)");
        if ((e = cudaSetDevice(dev)) != cudaSuccess || (e = cudaFree(nullptr)) != cudaSuccess)
            test_mem_abort(cuda_why("cudaSetDevice", e));
        char bus[32] = "?";
        cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), dev);
        const char *lib = std::getenv("WEFT_CUDA_LIB");
        std::printf("[weft tests] rank %d: WEFT_TEST_MEM=device, buffers from cudaMalloc on device %d of %d "
                    "(bus %s); weft's CUDA: %s%s\n",
                    world_rank(), dev, count, bus, lib && *lib ? lib : "libcudart.so (default)",
                    reduced_sizes() ? "; WEFT_TEST_SIZES=reduced" : "");
        std::fflush(stdout);
#endif
    }
};

inline ::testing::Environment *const g_test_mem_env =
    ::testing::AddGlobalTestEnvironment(new TestMemEnvironment);

} // namespace mem_detail

/* ---- the buffer ---- */

class TestBuf {
public:
    enum Layout { kPlain, kSentinel, kGuarded };

    explicit TestBuf(size_t size = 0, Layout layout = kPlain, size_t misalign = 0)
        : size_(size), layout_(layout), device_(device_mem())
    {
        size_t lead = 0;
        if (layout == kGuarded) {
            total_ = size + misalign + 2 * kGuardBytes + 64;
        } else {
            total_ = size + (layout == kSentinel ? 1 : 0);
            misalign = 0;
        }
        if (device_) {
            /* cudaMalloc(0) gives NULL: a 0-byte buffer is still a device pointer. */
            err_ = mem_detail::dev_alloc(reinterpret_cast<void **>(&raw_), std::max<size_t>(total_, 1));
            if (!err_.empty()) {
                raw_ = nullptr;
                return;
            }
        } else if (layout == kPlain) {
            raw_ = new (std::nothrow) unsigned char[std::max<size_t>(total_, 1)](); /* zeroed */
        } else {
            raw_ = new (std::nothrow) unsigned char[std::max<size_t>(total_, 1)]; /* see kSentinel */
        }
        if (raw_ == nullptr) {
            if (err_.empty())
                err_ = "out of memory for " + std::to_string(total_) + " bytes";
            return;
        }
        if (layout == kGuarded) {
            /* The alignment is the one of the address weft sees (host or device). */
            uintptr_t base = ((uintptr_t)raw_ + kGuardBytes + 63) & ~(uintptr_t)63;
            lead = (size_t)(base - (uintptr_t)raw_) + misalign;
        }
        data_ = raw_ + lead;
        /* As std::vector<unsigned char>(0).data(): an empty host buffer is NULL
         * (0-byte messages then go with a NULL pointer, as they always did);
         * an empty device buffer is a real device pointer. */
        if (!device_ && layout == kPlain && size == 0)
            data_ = nullptr;
        if (device_) {
            if (layout == kPlain)
                note(mem_detail::set(raw_, 0, total_));
            else if (layout == kSentinel)
                note(mem_detail::set(data_ + size_, kFreshByte, 1));
        } else if (layout == kSentinel) {
            data_[size_] = kFreshByte;
        }
        if (layout == kGuarded) {
            set_bytes(raw_, kGuardByte, total_);
            set_bytes(data_, kFreshByte, size_);
        }
    }
    ~TestBuf() { release(); }
    TestBuf(const TestBuf &) = delete;
    TestBuf &operator=(const TestBuf &) = delete;
    TestBuf(TestBuf &&o) noexcept { take(o); }
    TestBuf &operator=(TestBuf &&o) noexcept
    {
        if (this != &o) {
            release();
            take(o);
        }
        return *this;
    }

    bool ok() const { return raw_ != nullptr && err_.empty(); }
    /* What failed (allocation, a copy), for assertion messages. */
    const std::string &error() const { return err_; }
    bool is_device() const { return device_; }
    /* The pointer weft gets: device memory in device mode. */
    unsigned char *data() const { return data_; }
    size_t size() const { return size_; }

    /* ---- writing ---- */

    /* Bytes [off, off+n) get the pattern of seed (as fill_pattern(data()+off, n, seed)). */
    void fill_pattern_at(size_t off, size_t n, uint64_t seed)
    {
        if (!device_) {
            weft_mpitest::fill_pattern(data_ + off, n, seed);
            return;
        }
        std::unique_ptr<unsigned char[]> stage(new unsigned char[std::max<size_t>(std::min(n, mem_detail::kStageBytes), 1)]);
        for (size_t done = 0; done < n;) {
            const size_t len = std::min(n - done, mem_detail::kStageBytes); /* a multiple of 8 but the last */
            weft_mpitest::fill_pattern(stage.get(), len, seed, done / 8);
            note(mem_detail::copy(data_ + off + done, stage.get(), len, true));
            done += len;
        }
    }
    void fill_pattern(uint64_t seed) { fill_pattern_at(0, size_, seed); }

    /* Copies n host bytes into [off, off+n). */
    void write(size_t off, const void *src, size_t n)
    {
        if (n == 0)
            return;
        if (device_)
            note(mem_detail::copy(data_ + off, src, n, true));
        else
            std::memcpy(data_ + off, src, n);
    }

    /* ---- reading ---- */

    /* Copies [off, off+n) into dst (host memory). */
    void read(size_t off, void *dst, size_t n) const
    {
        if (n == 0)
            return;
        if (device_)
            note(mem_detail::copy(dst, data_ + off, n, false));
        else
            std::memcpy(dst, data_ + off, n);
    }
    std::vector<unsigned char> copy_to_host(size_t off, size_t n) const
    {
        std::vector<unsigned char> v(n);
        read(off, v.data(), n);
        return v;
    }
    unsigned char byte_at(size_t i) const
    {
        unsigned char b = 0;
        read(i, &b, 1);
        return b;
    }

    /* First offset in [off, off+n), relative to off, that differs from the
     * pattern of seed, or SIZE_MAX (pattern_mismatch on the buffer's bytes). */
    size_t pattern_mismatch_at(size_t off, size_t n, uint64_t seed) const
    {
        if (!device_)
            return pattern_mismatch(data_ + off, n, seed);
        std::unique_ptr<unsigned char[]> stage(new unsigned char[std::max<size_t>(std::min(n, mem_detail::kStageBytes), 1)]);
        for (size_t done = 0; done < n;) {
            const size_t len = std::min(n - done, mem_detail::kStageBytes);
            read(off + done, stage.get(), len);
            size_t bad = pattern_mismatch(stage.get(), len, seed, done / 8);
            if (bad != SIZE_MAX)
                return done + bad;
            done += len;
        }
        return SIZE_MAX;
    }

    /* "Bytes [off, off+n) hold the pattern of (sender, tag, index)", as HasPattern. */
    ::testing::AssertionResult HasPatternAt(size_t off, size_t n, int sender, int tag, uint64_t index) const
    {
        if (!ok())
            return ::testing::AssertionFailure() << "buffer unusable: " << err_;
        size_t bad = pattern_mismatch_at(off, n, pattern_seed(sender, tag, index));
        if (!err_.empty())
            return ::testing::AssertionFailure() << "reading the buffer back: " << err_;
        if (bad == SIZE_MAX)
            return ::testing::AssertionSuccess();
        return ::testing::AssertionFailure()
               << "message of " << n << " bytes from rank " << sender << " tag " << tag << " #" << index
               << (device_ ? " (device buffer)" : "") << ": first wrong byte at offset " << bad << " (byte 0x"
               << std::hex << (unsigned)byte_at(off + bad) << std::dec << ")";
    }
    ::testing::AssertionResult HasPattern(size_t n, int sender, int tag, uint64_t index) const
    {
        return HasPatternAt(0, n, sender, tag, index);
    }

    /* First offset in [off, off+n), relative to off, whose byte is not b, or SIZE_MAX. */
    size_t first_not(size_t off, size_t n, unsigned char b) const
    {
        if (!device_) {
            for (size_t i = 0; i < n; i++)
                if (data_[off + i] != b)
                    return i;
            return SIZE_MAX;
        }
        std::vector<unsigned char> stage(std::min(n, mem_detail::kStageBytes));
        for (size_t done = 0; done < n;) {
            const size_t len = std::min(n - done, mem_detail::kStageBytes);
            read(off + done, stage.data(), len);
            for (size_t i = 0; i < len; i++)
                if (stage[i] != b)
                    return done + i;
            done += len;
        }
        return SIZE_MAX;
    }

    /* kSentinel: the byte at [size] still holds kFreshByte. */
    bool sentinel_intact() const { return layout_ == kSentinel && byte_at(size_) == kFreshByte; }

    /* kGuarded: every byte outside the usable area still holds kGuardByte. */
    ::testing::AssertionResult GuardsIntact() const
    {
        if (layout_ != kGuarded || !ok())
            return ::testing::AssertionFailure() << "not a usable guarded buffer " << err_;
        const size_t lead = (size_t)(data_ - raw_), tail = total_ - lead - size_;
        size_t bad = first_not_raw(0, lead, kGuardByte);
        if (bad != SIZE_MAX)
            return ::testing::AssertionFailure()
                   << "byte " << (lead - bad) << " before the " << where() << "buffer was overwritten";
        bad = first_not_raw(lead + size_, tail, kGuardByte);
        if (bad != SIZE_MAX)
            return ::testing::AssertionFailure() << "byte " << bad << " past the end of the " << size_ << "-byte "
                                                 << where() << "buffer was overwritten";
        if (!err_.empty())
            return ::testing::AssertionFailure() << "reading the guards back: " << err_;
        return ::testing::AssertionSuccess();
    }

    /* kGuarded: the usable area was not written at all. */
    ::testing::AssertionResult Untouched() const
    {
        size_t bad = first_not(0, size_, kFreshByte);
        if (bad != SIZE_MAX)
            return ::testing::AssertionFailure() << "byte " << bad << " of the " << where() << "buffer was written";
        if (!err_.empty())
            return ::testing::AssertionFailure() << "reading the buffer back: " << err_;
        return ::testing::AssertionSuccess();
    }

private:
    const char *where() const { return device_ ? "device " : ""; }

    void note(const std::string &e) const
    {
        if (!e.empty()) {
            if (err_.empty())
                err_ = e;
            ADD_FAILURE() << "test buffer: " << e;
        }
    }

    void set_bytes(unsigned char *p, unsigned char b, size_t n)
    {
        if (device_)
            note(mem_detail::set(p, b, n));
        else
            std::memset(p, b, n);
    }

    size_t first_not_raw(size_t raw_off, size_t n, unsigned char b) const
    {
        if (!device_) {
            for (size_t i = 0; i < n; i++)
                if (raw_[raw_off + i] != b)
                    return i;
            return SIZE_MAX;
        }
        std::vector<unsigned char> stage(n);
        if (n)
            note(mem_detail::copy(stage.data(), raw_ + raw_off, n, false));
        for (size_t i = 0; i < n; i++)
            if (stage[i] != b)
                return i;
        return SIZE_MAX;
    }

    void release()
    {
        if (raw_ == nullptr)
            return;
        if (device_)
            mem_detail::dev_free(raw_);
        else
            delete[] raw_;
        raw_ = data_ = nullptr;
    }

    void take(TestBuf &o)
    {
        size_ = o.size_;
        total_ = o.total_;
        layout_ = o.layout_;
        device_ = o.device_;
        raw_ = o.raw_;
        data_ = o.data_;
        err_ = std::move(o.err_);
        o.raw_ = o.data_ = nullptr;
        o.size_ = o.total_ = 0;
    }

    size_t size_ = 0, total_ = 0;
    Layout layout_ = kPlain;
    bool device_ = false;
    unsigned char *raw_ = nullptr;
    unsigned char *data_ = nullptr;
    mutable std::string err_;
};

/* A kPlain buffer of n bytes holding the pattern of (sender, tag, index). */
inline TestBuf patterned_buf(size_t n, int sender, int tag, uint64_t index)
{
    TestBuf b(n);
    if (b.ok())
        b.fill_pattern(pattern_seed(sender, tag, index));
    return b;
}

} // namespace weft_mpitest

#endif
