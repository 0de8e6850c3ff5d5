/*
 * Shared pieces of the MPI test binaries (p2p, comm, collectives):
 *
 *  - WeftMpiTest: a fixture that gives each test a fresh weft comm over
 *    MPI_COMM_WORLD and, at the end of every test, agrees across ranks on
 *    whether the test failed anywhere. Only rank 0 prints GoogleTest's
 *    report (mpi_main.cc), so a failure on another rank must be carried to
 *    rank 0 or it would pass silently.
 *  - Data patterns that depend on sender rank, tag, message index and byte
 *    offset, so a byte that lands in the wrong message, at the wrong offset
 *    or from the wrong peer is caught, and fast enough for 4 GiB messages.
 *  - Guarded buffers: bytes before and after the usable area that must stay
 *    untouched (truncation and unaligned-buffer tests).
 *  - Buffers in host or CUDA device memory (WEFT_TEST_MEM=device): the
 *    TestBuf of weft_test_mem.h, which the p2p and collectives tests use for
 *    every buffer weft reads or writes.
 *
 * Rule for every test: a skip decision must be the same on all ranks
 * (derived from the world size or the environment), otherwise ranks
 * disagree about which collective comes next and the job hangs.
 */
#ifndef WEFT_MPI_TEST_H
#define WEFT_MPI_TEST_H

#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "weft.h"

/* Not "weft_test": that name is taken by the C function weft_test(). */
namespace weft_mpitest {

/* Runs fn with this process's stderr (fd 2) going to a temporary file and
 * returns what was written (weft's WEFT_DEBUG lines). A file rather than a
 * pipe: nothing can block however much the library logs. */
template <typename Fn>
std::string capture_stderr(Fn fn)
{
    char path[] = "/tmp/weft-test-stderr-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        ADD_FAILURE() << "mkstemp failed";
        fn();
        return "";
    }
    std::fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn();
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    unlink(path);
    return ss.str();
}

/* weft_comm_create_config over MPI_COMM_WORLD with one setting of the
 * comm's own (collective, like weft_comm_create). */
inline int create_comm_with(const char *name, const char *value, weft_comm_t **out)
{
    weft_setting_t set[] = {{name, value}};
    weft_config_t cfg = WEFT_CONFIG_INITIALIZER;
    cfg.settings = set;
    cfg.nsettings = 1;
    return weft_comm_create_config(MPI_COMM_WORLD, &cfg, out);
}

inline int world_rank()
{
    int r = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

inline int world_size()
{
    int s = -1;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
}

/* True when any rank passes true. Collective over comm. */
inline bool any_rank(bool mine, MPI_Comm comm = MPI_COMM_WORLD)
{
    int in = mine ? 1 : 0, out = 0;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm);
    return out != 0;
}

/* Lowest rank that passes true, or -1. Collective over comm. */
inline int first_rank_with(bool mine, MPI_Comm comm = MPI_COMM_WORLD)
{
    int me = 0;
    MPI_Comm_rank(comm, &me);
    int in = mine ? me : INT32_MAX, out = INT32_MAX;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm);
    return out == INT32_MAX ? -1 : out;
}

inline const char *env_or(const char *name, const char *dflt)
{
    const char *v = std::getenv(name);
    return v ? v : dflt;
}

/* ---- data patterns ---- */

inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* Seed of one message: who sent it, on which tag, which message of the test. */
inline uint64_t pattern_seed(int sender, int tag, uint64_t index)
{
    return mix64(((uint64_t)(uint32_t)sender << 40) ^ ((uint64_t)(uint32_t)tag << 8) ^
                 mix64(index + 0x51ed2701ull));
}

/* Word k (bytes 8k..8k+7 of the message). */
inline uint64_t pattern_word(uint64_t seed, size_t k)
{
    return mix64(seed + (uint64_t)k * 0x9e3779b97f4a7c15ull);
}

/* Fills buf[0..n) with the message's pattern; buf may be unaligned.
 * first_word > 0: buf is the part of a message from byte 8*first_word on
 * (a large message filled in pieces, weft_test_mem.h). */
inline void fill_pattern(void *buf, size_t n, uint64_t seed, size_t first_word = 0)
{
    unsigned char *p = static_cast<unsigned char *>(buf);
    size_t words = n / 8;
    for (size_t k = 0; k < words; k++) {
        uint64_t w = pattern_word(seed, first_word + k);
        std::memcpy(p + 8 * k, &w, 8);
    }
    if (n % 8) {
        uint64_t w = pattern_word(seed, first_word + words);
        std::memcpy(p + 8 * words, &w, n % 8);
    }
}

/* Offset of the first byte of buf[0..n) that differs from the pattern, or
 * SIZE_MAX when all match (first_word: as in fill_pattern). */
inline size_t pattern_mismatch(const void *buf, size_t n, uint64_t seed, size_t first_word = 0)
{
    const unsigned char *p = static_cast<const unsigned char *>(buf);
    size_t words = n / 8;
    for (size_t k = 0; k < words; k++) {
        uint64_t want = pattern_word(seed, first_word + k), got;
        std::memcpy(&got, p + 8 * k, 8);
        if (got != want) {
            for (size_t b = 0; b < 8; b++)
                if (p[8 * k + b] != reinterpret_cast<const unsigned char *>(&want)[b])
                    return 8 * k + b;
        }
    }
    if (n % 8) {
        uint64_t want = pattern_word(seed, first_word + words);
        const unsigned char *w = reinterpret_cast<const unsigned char *>(&want);
        for (size_t b = 0; b < n % 8; b++)
            if (p[8 * words + b] != w[b])
                return 8 * words + b;
    }
    return SIZE_MAX;
}

/* A gtest predicate: "buf holds the pattern of (sender, tag, index)". */
inline ::testing::AssertionResult HasPattern(const void *buf, size_t n, int sender, int tag,
                                             uint64_t index)
{
    size_t bad = pattern_mismatch(buf, n, pattern_seed(sender, tag, index));
    if (bad == SIZE_MAX)
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "message of " << n << " bytes from rank " << sender << " tag " << tag << " #" << index
           << ": first wrong byte at offset " << bad << " (byte 0x" << std::hex
           << (unsigned)static_cast<const unsigned char *>(buf)[bad] << std::dec << ")";
}

/* ---- guarded buffers ---- */

constexpr size_t kGuardBytes = 64;
constexpr unsigned char kGuardByte = 0xA5;
constexpr unsigned char kFreshByte = 0x5A;

/* A buffer of `size` usable bytes, starting `misalign` bytes past a 64-byte
 * boundary, with guard bytes on both sides. The usable area starts filled
 * with kFreshByte so writes into it are visible too. */
class GuardedBuffer {
public:
    GuardedBuffer(size_t size, size_t misalign = 0) : size_(size), misalign_(misalign)
    {
        total_ = size + misalign + 2 * kGuardBytes + 64;
        raw_ = static_cast<unsigned char *>(std::malloc(total_));
        if (raw_ == nullptr)
            return;
        uintptr_t base = ((uintptr_t)raw_ + kGuardBytes + 63) & ~(uintptr_t)63;
        data_ = reinterpret_cast<unsigned char *>(base) + misalign;
        std::memset(raw_, kGuardByte, total_);
        std::memset(data_, kFreshByte, size_);
    }
    ~GuardedBuffer() { std::free(raw_); }
    GuardedBuffer(const GuardedBuffer &) = delete;
    GuardedBuffer &operator=(const GuardedBuffer &) = delete;

    bool ok() const { return raw_ != nullptr; }
    unsigned char *data() { return data_; }
    size_t size() const { return size_; }

    /* Every byte outside the usable area still holds kGuardByte. */
    ::testing::AssertionResult GuardsIntact() const
    {
        for (unsigned char *p = raw_; p < data_; p++)
            if (*p != kGuardByte)
                return ::testing::AssertionFailure()
                       << "byte " << (data_ - p) << " before the buffer was overwritten";
        for (unsigned char *p = data_ + size_; p < raw_ + total_; p++)
            if (*p != kGuardByte)
                return ::testing::AssertionFailure()
                       << "byte " << (p - (data_ + size_)) << " past the end of the " << size_
                       << "-byte buffer was overwritten";
        return ::testing::AssertionSuccess();
    }

    /* The usable area was not written at all. */
    ::testing::AssertionResult Untouched() const
    {
        for (size_t i = 0; i < size_; i++)
            if (data_[i] != kFreshByte)
                return ::testing::AssertionFailure() << "byte " << i << " of the buffer was written";
        return ::testing::AssertionSuccess();
    }

private:
    size_t size_, misalign_, total_ = 0;
    unsigned char *raw_ = nullptr;
    unsigned char *data_ = nullptr;
};

/* ---- a comm's own settings ---- */

/* WEFT_* settings for one comm (weft_config_t's, by name, over the
 * environment's), in the order given. */
using Settings = std::vector<std::pair<std::string, std::string>>;

/* A weft_config_t over settings, with the array it points at: valid while
 * both this and settings live. No settings: the config of none (the
 * environment alone, as the calls without _config). */
class TestConfig {
public:
    explicit TestConfig(const Settings &settings)
    {
        for (const auto &kv : settings)
            entries_.push_back({kv.first.c_str(), kv.second.c_str()});
        cfg_.settings = entries_.empty() ? nullptr : entries_.data();
        cfg_.nsettings = entries_.size();
    }
    TestConfig(const TestConfig &) = delete;
    TestConfig &operator=(const TestConfig &) = delete;
    const weft_config_t *get() const { return &cfg_; }

private:
    std::vector<weft_setting_t> entries_;
    weft_config_t cfg_ = WEFT_CONFIG_INITIALIZER;
};

/* weft_comm_create_config over mpi_comm with these settings: how a test
 * makes a comm of its own with some WEFT_* setting (the process
 * environment is never written). Collective. */
inline int create_with(MPI_Comm mpi_comm, const Settings &settings, weft_comm_t **out)
{
    TestConfig cfg(settings);
    return weft_comm_create_config(mpi_comm, cfg.get(), out);
}

/* "NAME=value NAME2=value2", for messages. */
inline std::string settings_text(const Settings &settings)
{
    std::string s;
    for (const auto &kv : settings)
        s += (s.empty() ? "" : " ") + kv.first + "=" + kv.second;
    return s;
}

/* ---- the fixture ---- */

/* How the fixture makes its comm over the base communicator (the same
 * tests then run over every way of making one), from WEFT_TEST_COMM:
 *   unset, "mpi"  weft_comm_create(base)
 *   "uid"         base rank 0 calls weft_get_unique_id, MPI_Bcast of the id
 *                 over base, weft_comm_init(id, base size, base rank): mpirun
 *                 is only the launcher, weft's set-up uses no MPI
 *   "split"       weft_comm_create(base) as a parent, weft_comm_split(parent,
 *                 0, rank) (one color: the same ranks, in the same order),
 *                 and the parent destroyed at once (the split comm must not
 *                 need it).
 * With settings, each call is its *_config one with them (a test's comm
 * with settings of its own: comm_settings). Collective over base. Returns the WEFT_* code; *what says which call
 * failed, with its text. */
inline int make_test_comm(MPI_Comm base, weft_comm_t **out, std::string *what, const Settings &settings = {})
{
    const std::string mode = env_or("WEFT_TEST_COMM", "mpi");
    /* With settings, the *_config calls (the split's parent gets them, and
     * the split takes its parent's); without, the plain calls. */
    const bool with = !settings.empty();
    const std::string sfx = with ? "_config" : "";
    TestConfig cfg(settings);
    int brank = 0, bsize = 0;
    MPI_Comm_rank(base, &brank);
    MPI_Comm_size(base, &bsize);
    if (mode == "uid") {
        struct {
            weft_unique_id_t id;
            int rc;
        } msg;
        std::memset(&msg, 0, sizeof(msg));
        if (brank == 0)
            msg.rc = with ? weft_get_unique_id_config(&msg.id, cfg.get()) : weft_get_unique_id(&msg.id);
        MPI_Bcast(&msg, sizeof(msg), MPI_BYTE, 0, base);
        if (msg.rc != WEFT_SUCCESS) {
            *what = "weft_get_unique_id" + sfx + " on rank 0: " + weft_strerror(msg.rc) +
                    (brank == 0 ? std::string(": ") + weft_last_error() : std::string());
            return msg.rc;
        }
        int rc = with ? weft_comm_init_config(&msg.id, bsize, brank, cfg.get(), out)
                      : weft_comm_init(&msg.id, bsize, brank, out);
        if (rc != WEFT_SUCCESS)
            *what = "weft_comm_init" + sfx + ": " + weft_last_error();
        return rc;
    }
    if (mode == "split") {
        weft_comm_t *parent = nullptr;
        int rc = with ? weft_comm_create_config(base, cfg.get(), &parent) : weft_comm_create(base, &parent);
        if (rc != WEFT_SUCCESS) {
            *what = "weft_comm_create" + sfx + " (the split's parent): " + weft_last_error();
            return rc;
        }
        rc = weft_comm_split(parent, 0, brank, out);
        if (rc != WEFT_SUCCESS)
            *what = std::string("weft_comm_split: ") + weft_last_error();
        int drc = weft_comm_destroy(parent);
        if (rc == WEFT_SUCCESS && drc != WEFT_SUCCESS) {
            /* The split comm is left to the fixture, which leaks it with
             * the failure rather than risk a collective destroy here. */
            *what = std::string("weft_comm_destroy (the split's parent): ") + weft_strerror(drc);
            rc = drc;
        }
        return rc;
    }
    if (mode != "mpi") {
        *what = "WEFT_TEST_COMM=" + mode + " is none of mpi, uid, split";
        return WEFT_ERR_INVALID_ARG;
    }
    int rc = with ? weft_comm_create_config(base, cfg.get(), out) : weft_comm_create(base, out);
    if (rc != WEFT_SUCCESS)
        *what = "weft_comm_create" + sfx + ": " + weft_last_error();
    return rc;
}

/* Gives each test a fresh comm over MPI_COMM_WORLD (collective set-up in
 * SetUp, so every rank must run the same tests in the same order; made as
 * WEFT_TEST_COMM says, make_test_comm), and agrees across ranks in TearDown
 * whether the test failed anywhere. When a
 * test failed, its comm may still hold requests and is leaked rather than
 * destroyed, so one failure does not hang the rest of the run. */
class WeftMpiTest : public ::testing::Test {
protected:
    weft_comm_t *comm = nullptr;
    int rank = -1;
    int size = -1;

    /* Override to run on another MPI communicator (nullptr: no comm). */
    virtual MPI_Comm base_comm() { return MPI_COMM_WORLD; }
    /* Override to make the comm with settings of its own (make_test_comm). */
    virtual Settings comm_settings() { return {}; }

    void SetUp() override
    {
        rank = world_rank();
        size = world_size();
        MPI_Comm base = base_comm();
        if (base == MPI_COMM_NULL)
            return;
        std::string what;
        int rc = make_test_comm(base, &comm, &what, comm_settings());
        bool failed = rc != WEFT_SUCCESS;
        if (failed)
            ADD_FAILURE() << what << " (" << weft_strerror(rc) << ")";
        /* A failed create on one rank must stop the test on every rank. */
        if (any_rank(failed)) {
            if (!failed)
                ADD_FAILURE() << "making the comm (WEFT_TEST_COMM=" << env_or("WEFT_TEST_COMM", "mpi")
                              << ") failed on another rank";
            comm = nullptr;
            GTEST_SKIP() << "no comm";
        }
    }

    void TearDown() override
    {
        int failed_rank = first_rank_with(HasFailure());
        if (failed_rank >= 0 && !HasFailure())
            ADD_FAILURE() << "the test failed on rank " << failed_rank << " (see its output)";
        if (comm == nullptr)
            return;
        if (failed_rank >= 0) {
            comm = nullptr; /* leaked on purpose: see the class comment */
            return;
        }
        int rc = weft_comm_destroy(comm);
        comm = nullptr;
        bool bad = rc != WEFT_SUCCESS;
        if (bad)
            ADD_FAILURE() << "weft_comm_destroy: " << weft_strerror(rc);
        int bad_rank = first_rank_with(bad);
        if (bad_rank >= 0 && !bad)
            ADD_FAILURE() << "weft_comm_destroy failed on rank " << bad_rank;
    }

    std::string last_error() const { return weft_comm_last_error(comm); }
};

} // namespace weft_mpitest

#endif
