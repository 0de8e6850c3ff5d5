// Unit tests of the pipe layer's payload buffer cache (p2p/payload.c).
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "payload.h"

namespace {

struct Cache {
    weft_payload_cache c{};
    ~Cache() { weft_payload_cache_fini(&c); }
};

// A buffer given back is the next one handed out for any length of its
// class (powers of two from 4 KiB), and it holds the whole class size.
TEST(PayloadCache, ReusedWithinItsClass)
{
    Cache k;
    void *a = weft_payload_get(&k.c, 40000);   // class 64 KiB
    ASSERT_NE(a, nullptr);
    std::memset(a, 0xab, 65536);               // the class size is writable (ASan checks)
    weft_payload_put(&k.c, a, 40000);
    EXPECT_EQ(k.c.n[4], 1u) << "kept in the 64 KiB class";
    EXPECT_EQ(weft_payload_get(&k.c, 65536), a) << "a 64 KiB buffer kept, then handed out again";
    EXPECT_EQ(k.c.n[4], 0u);
    void *b = weft_payload_get(&k.c, 33000);   // the class is empty now: a new one
    EXPECT_NE(b, a);
    weft_payload_put(&k.c, a, 65536);
    weft_payload_put(&k.c, b, 33000);
    // another class does not take them
    void *c = weft_payload_get(&k.c, 20000);   // class 32 KiB
    EXPECT_NE(c, a);
    EXPECT_NE(c, b);
    weft_payload_put(&k.c, c, 20000);
}

// Up to 32 buffers a class are kept, and no more than 1 MiB of them.
TEST(PayloadCache, KeepsABoundedNumber)
{
    const struct { size_t len; size_t kept; } cases[] = {
        {5000, 32}, {32768, 32}, {65536, 16}, {262144, 4}, {1u << 20, 1},
    };
    for (const auto &t : cases) {
        Cache k;
        std::vector<void *> out;
        for (size_t i = 0; i < t.kept + 3; i++)
            out.push_back(weft_payload_get(&k.c, t.len));
        std::set<void *> given(out.begin(), out.end());
        for (void *p : out)
            weft_payload_put(&k.c, p, t.len);
        size_t held = 0;
        for (unsigned n : k.c.n)
            held += n;
        EXPECT_EQ(held, t.kept) << t.len << " B: buffers kept";
        // the kept ones come back (LIFO), then fresh memory
        size_t reused = 0;
        std::vector<void *> again;
        for (size_t i = 0; i < t.kept + 3; i++) {
            void *p = weft_payload_get(&k.c, t.len);
            again.push_back(p);
            if (i < t.kept)
                EXPECT_TRUE(given.count(p)) << t.len << " B: buffer " << i << " is not one of those given back";
            reused += given.count(p);
        }
        EXPECT_GE(reused, t.kept) << t.len << " B";
        for (void *p : again)
            weft_payload_put(&k.c, p, t.len);
    }
}

// Small (up to 2 KiB) and large (over 1 MiB) buffers are plain malloc/free:
// nothing is kept, so fini has nothing of theirs (LeakSanitizer and valgrind
// would see a buffer kept and lost).
TEST(PayloadCache, SmallAndLargeNotKept)
{
    Cache k;
    void *s = weft_payload_get(&k.c, 100);
    void *l = weft_payload_get(&k.c, (1u << 20) + 1);
    ASSERT_NE(s, nullptr);
    ASSERT_NE(l, nullptr);
    std::memset(l, 1, (1u << 20) + 1);
    weft_payload_put(&k.c, s, 100);
    weft_payload_put(&k.c, l, (1u << 20) + 1);
    for (unsigned n : k.c.n)
        EXPECT_EQ(n, 0u);
    weft_payload_put(&k.c, nullptr, 4096);   // nothing to give back
    EXPECT_EQ(k.c.n[0], 0u);
}

} // namespace
