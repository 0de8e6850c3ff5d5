// Unit tests of the shared-memory SPSC ring (p2p/transport/shm/shm_ring.c), in one process.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "shm_ring.h"

namespace {

// 64-byte aligned backing memory for one ring.
struct RingMem {
    explicit RingMem(size_t capacity) {
        bytes = shm_ring_footprint(capacity);
        mem = std::aligned_alloc(64, bytes);
        ring = shm_ring_init(mem, capacity);
    }
    ~RingMem() { std::free(mem); }
    size_t bytes;
    void *mem;
    shm_ring *ring;
};

// Fills a payload so that any byte from another record or position shows.
void fill_pattern(void *p, size_t len, uint64_t seed) {
    auto *b = static_cast<unsigned char *>(p);
    for (size_t i = 0; i < len; i++) b[i] = static_cast<unsigned char>(seed * 131 + i * 7 + 1);
}

bool check_pattern(const void *p, size_t len, uint64_t seed) {
    auto *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < len; i++)
        if (b[i] != static_cast<unsigned char>(seed * 131 + i * 7 + 1)) return false;
    return true;
}

}  // namespace

TEST(ShmRing, CapacityRoundsUpToPowerOfTwo) {
    EXPECT_EQ(shm_ring_capacity_for(0), 4096u);
    EXPECT_EQ(shm_ring_capacity_for(4097), 8192u);
    EXPECT_EQ(shm_ring_capacity_for(1 << 20), size_t(1) << 20);
    EXPECT_EQ(shm_ring_footprint(8192) % 64, 0u);
}

TEST(ShmRing, InitRefusesMisalignedMemory) {
    RingMem m(4096);
    EXPECT_EQ(shm_ring_init(static_cast<char *>(m.mem) + 8, 1024), nullptr);
}

TEST(ShmRing, AttachChecksLayout) {
    RingMem m(8192);
    EXPECT_EQ(shm_ring_attach(m.mem, m.bytes), m.ring);
    EXPECT_EQ(shm_ring_attach(m.mem, m.bytes - 64), nullptr);  // data area would not fit
    std::vector<unsigned char> junk(m.bytes + 64, 0xab);
    void *aligned = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(junk.data()) + 63) & ~uintptr_t(63));
    EXPECT_EQ(shm_ring_attach(aligned, m.bytes), nullptr);
}

TEST(ShmRing, EmptyRingPeeksNothing) {
    RingMem m(4096);
    size_t len = 99;
    EXPECT_TRUE(shm_ring_empty(m.ring));
    EXPECT_EQ(shm_ring_peek(m.ring, &len), nullptr);
    EXPECT_EQ(len, 99u);  // output untouched when nothing is there
}

TEST(ShmRing, RecordRoundTripAndAlignment) {
    RingMem m(4096);
    void *p = shm_ring_reserve(m.ring, 13);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 8u);  // payload 8 bytes past a cache line
    std::memcpy(p, "hello, ring!!", 13);
    // not visible before commit
    size_t len = 0;
    EXPECT_EQ(shm_ring_peek(m.ring, &len), nullptr);
    shm_ring_commit(m.ring, 13);
    EXPECT_FALSE(shm_ring_empty(m.ring));
    const void *q = shm_ring_peek(m.ring, &len);
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(len, 13u);
    EXPECT_EQ(std::memcmp(q, "hello, ring!!", 13), 0);
    // peek again returns the same record until released
    EXPECT_EQ(shm_ring_peek(m.ring, &len), q);
    shm_ring_release(m.ring);
    EXPECT_TRUE(shm_ring_empty(m.ring));
    EXPECT_EQ(shm_ring_peek(m.ring, &len), nullptr);
}

TEST(ShmRing, CommitShorterThanReserved) {
    RingMem m(4096);
    void *p = shm_ring_reserve(m.ring, 1000);
    ASSERT_NE(p, nullptr);
    fill_pattern(p, 10, 3);
    shm_ring_commit(m.ring, 10);
    EXPECT_EQ(shm_ring_used(m.ring), 64u);  // 8 header + 10 payload, one line
    size_t len = 0;
    const void *q = shm_ring_peek(m.ring, &len);
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(len, 10u);
    EXPECT_TRUE(check_pattern(q, len, 3));
}

TEST(ShmRing, ZeroLengthRecord) {
    RingMem m(4096);
    ASSERT_NE(shm_ring_reserve(m.ring, 0), nullptr);
    shm_ring_commit(m.ring, 0);
    size_t len = 7;
    ASSERT_NE(shm_ring_peek(m.ring, &len), nullptr);
    EXPECT_EQ(len, 0u);
    shm_ring_release(m.ring);
    EXPECT_TRUE(shm_ring_empty(m.ring));
}

TEST(ShmRing, FullRingRefusesUntilReleased) {
    RingMem m(4096);
    // 56-byte payloads take exactly one 64-byte line each; one line of the
    // 4096-byte ring always stays free, so 63 fit.
    int n = 0;
    while (void *p = shm_ring_reserve(m.ring, 56)) {
        fill_pattern(p, 56, n);
        shm_ring_commit(m.ring, 56);
        n++;
        ASSERT_LE(n, 64);
    }
    EXPECT_EQ(n, 63);
    EXPECT_FALSE(shm_ring_has_room(m.ring, 0));
    EXPECT_FALSE(shm_ring_would_fit(m.ring, 0));
    EXPECT_EQ(shm_ring_used(m.ring), 4032u);
    // The producer asks for a wake-up; nothing freed yet, so no room.
    EXPECT_FALSE(shm_ring_want_room(m.ring, 56));
    size_t len = 0;
    const void *q = shm_ring_peek(m.ring, &len);
    ASSERT_NE(q, nullptr);
    EXPECT_TRUE(check_pattern(q, len, 0));
    shm_ring_release(m.ring);
    // The consumer sees the request exactly once.
    EXPECT_TRUE(shm_ring_take_waiter(m.ring));
    EXPECT_FALSE(shm_ring_take_waiter(m.ring));
    EXPECT_TRUE(shm_ring_has_room(m.ring, 56));
    EXPECT_TRUE(shm_ring_would_fit(m.ring, 56));
    EXPECT_FALSE(shm_ring_has_room(m.ring, 57));  // would need two lines
    EXPECT_FALSE(shm_ring_would_fit(m.ring, 57));
    EXPECT_NE(shm_ring_reserve(m.ring, 56), nullptr);
}

TEST(ShmRing, StalePayloadNeverReadsAsRecord) {
    // The consumer polls the header word at its tail. Payload bytes left
    // from an earlier lap must never read as a record there, even when they
    // hold exactly the header the consumer would accept next lap: forge such
    // words (format of shm_ring.c: lap stamp << 32 | valid bit 31 | length)
    // into every line of two lap-0 payloads, then publish records in lap 1
    // so that the consumer's tail stops on a forged line.
    RingMem m(4096);
    const uint64_t cap = 4096;
    auto forge = [&](void *payload, uint64_t abs_payload, size_t len) {
        for (uint64_t line = (abs_payload + 63) & ~uint64_t(63); line + 8 <= abs_payload + len; line += 64) {
            uint64_t w = (((line + cap) / 64) << 32) | (uint64_t(1) << 31) | 5;
            std::memcpy(static_cast<char *>(payload) + (line - abs_payload), &w, 8);
        }
    };
    size_t len = 0;
    void *p = shm_ring_reserve(m.ring, 2000);  // record at 0, 2048 bytes
    ASSERT_NE(p, nullptr);
    forge(p, 8, 2000);
    shm_ring_commit(m.ring, 2000);
    p = shm_ring_reserve(m.ring, 1900);  // record at 2048, 1920 bytes
    ASSERT_NE(p, nullptr);
    forge(p, 2048 + 8, 1900);
    shm_ring_commit(m.ring, 1900);
    for (int i = 0; i < 2; i++) {
        ASSERT_NE(shm_ring_peek(m.ring, &len), nullptr);
        shm_ring_release(m.ring);
    }
    ASSERT_NE(shm_ring_reserve(m.ring, 100), nullptr);  // at 3968, ends the lap exactly
    shm_ring_commit(m.ring, 100);
    ASSERT_NE(shm_ring_reserve(m.ring, 56), nullptr);   // at 4096 (lap 1, offset 0)
    shm_ring_commit(m.ring, 56);
    ASSERT_NE(shm_ring_peek(m.ring, &len), nullptr);
    EXPECT_EQ(len, 100u);
    shm_ring_release(m.ring);
    ASSERT_NE(shm_ring_peek(m.ring, &len), nullptr);
    EXPECT_EQ(len, 56u);
    shm_ring_release(m.ring);
    // tail is now 4160: lap-1 offset 64, a forged line of the first payload
    EXPECT_EQ(shm_ring_peek(m.ring, &len), nullptr);
    EXPECT_TRUE(shm_ring_empty(m.ring));
}

TEST(ShmRing, RecordLargerThanAllowedRefused) {
    RingMem m(8192);
    size_t max = shm_ring_max_payload(m.ring);
    EXPECT_GE(max, 4096u - 64u);
    EXPECT_LE(max, 4096u);
    EXPECT_EQ(shm_ring_reserve(m.ring, max + 1), nullptr);
    EXPECT_FALSE(shm_ring_has_room(m.ring, max + 1));
    EXPECT_TRUE(shm_ring_empty(m.ring));
    EXPECT_NE(shm_ring_reserve(m.ring, max), nullptr);
}

TEST(ShmRing, MaxRecordAlwaysFitsOnceDrained) {
    // Wherever head stands, a maximal record fits in an empty ring.
    RingMem m(4096);
    size_t max = shm_ring_max_payload(m.ring);
    for (size_t step = 0; step < 64; step++) {
        void *p = shm_ring_reserve(m.ring, max);
        ASSERT_NE(p, nullptr) << "step " << step;
        fill_pattern(p, max, step);
        shm_ring_commit(m.ring, max);
        size_t len = 0;
        const void *q = shm_ring_peek(m.ring, &len);
        ASSERT_NE(q, nullptr);
        ASSERT_EQ(len, max);
        ASSERT_TRUE(check_pattern(q, len, step));
        shm_ring_release(m.ring);
        // move head by one line so the next big record starts elsewhere
        ASSERT_NE(shm_ring_reserve(m.ring, 1), nullptr);
        shm_ring_commit(m.ring, 1);
        ASSERT_NE(shm_ring_peek(m.ring, &len), nullptr);
        shm_ring_release(m.ring);
    }
}

TEST(ShmRing, WrapAroundWithOddSizes) {
    RingMem m(4096);
    // Keep a few records in flight so every wrap position is exercised;
    // records never straddle the end (each payload is contiguous).
    const size_t sizes[] = {1, 7, 31, 32, 100, 333, 1000, 55, 56, 57, 1500, 9};
    uint64_t produced = 0, consumed = 0;
    const uint64_t total = 5000;
    const unsigned char *lo = static_cast<unsigned char *>(m.mem);
    const unsigned char *hi = lo + m.bytes;
    while (consumed < total) {
        while (produced < total) {
            size_t len = sizes[produced % 12];
            void *p = shm_ring_reserve(m.ring, len);
            if (!p) break;
            ASSERT_GE(static_cast<unsigned char *>(p), lo);
            ASSERT_LE(static_cast<unsigned char *>(p) + len, hi);
            fill_pattern(p, len, produced);
            shm_ring_commit(m.ring, len);
            produced++;
            if (produced % 3 == 0) break;  // interleave with the consumer
        }
        size_t len = 0;
        const void *q = shm_ring_peek(m.ring, &len);
        if (!q) continue;
        ASSERT_EQ(len, sizes[consumed % 12]) << "record " << consumed;
        ASSERT_TRUE(check_pattern(q, len, consumed)) << "record " << consumed;
        shm_ring_release(m.ring);
        consumed++;
    }
    EXPECT_TRUE(shm_ring_empty(m.ring));
}

TEST(ShmRing, TwoThreadProducerConsumerStress) {
    RingMem m(16384);
    const uint64_t n = 300000;
    std::atomic<bool> failed{false};
    // Each record: 8-byte sequence number, then a pattern of length derived
    // from the sequence, so loss, duplication, reordering and torn records show.
    auto len_of = [](uint64_t i) { return size_t(8 + (i * 2654435761u) % 700); };
    std::thread producer([&] {
        for (uint64_t i = 0; i < n && !failed.load(std::memory_order_relaxed);) {
            size_t len = len_of(i);
            void *p = shm_ring_reserve(m.ring, len);
            if (!p) {
                std::this_thread::yield();
                continue;
            }
            std::memcpy(p, &i, 8);
            fill_pattern(static_cast<char *>(p) + 8, len - 8, i);
            shm_ring_commit(m.ring, len);
            i++;
        }
    });
    uint64_t got = 0;
    while (got < n && !failed.load()) {
        size_t len = 0;
        const void *q = shm_ring_peek(m.ring, &len);
        if (!q) {
            std::this_thread::yield();
            continue;
        }
        uint64_t seq;
        std::memcpy(&seq, q, 8);
        if (seq != got || len != len_of(got) ||
            !check_pattern(static_cast<const char *>(q) + 8, len - 8, got)) {
            failed = true;
            ADD_FAILURE() << "record " << got << " arrived as seq " << seq << " len " << len;
            break;
        }
        shm_ring_release(m.ring);
        got++;
    }
    producer.join();
    EXPECT_EQ(got, n);
    EXPECT_TRUE(shm_ring_empty(m.ring));
}
