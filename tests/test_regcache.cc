/*
 * The RDMA registration cache (src/core/regcache.c) against a fake NIC that
 * counts registrations and hands out keys, and the argument checks and
 * cache hand-over of weft_mem_register / weft_mem_deregister (src/api/mem.c) on
 * a hand-built comm -- no MPI, no verbs. Tests with a real comm and the ib
 * transport are in mpi_tests/.
 */
#include <gtest/gtest.h>

#include <pthread.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "weft.h"   // mpi.h must not sit inside extern "C"

// The internal headers are C11; C++ spells its static assertion differently.
#define _Static_assert static_assert
extern "C" {
#include "comm.h"
#include "context.h"
#include "p2p.h"
#include "regcache.h"
}
#undef _Static_assert

namespace {

typedef std::pair<uintptr_t, size_t> Range;

// A NIC that pins nothing: it records every registration and hands out
// distinct handles and keys; fail_next makes the next registrations fail.
struct FakeNic {
    int regs = 0, deregs = 0;
    uint32_t next_key = 100;
    uintptr_t next_handle = 1;
    std::map<void *, Range> live;          // handle -> registered range
    std::vector<Range> reg_log, dereg_log; // in call order
    int fail_next = 0;
    std::string fail_reason = "ibv_reg_mr: Cannot allocate memory";

    size_t live_bytes() const
    {
        size_t b = 0;
        for (const auto &kv : live)
            b += kv.second.second;
        return b;
    }
};

int fake_reg(void *ctx, uintptr_t addr, size_t len, void **handle, uint32_t *lkey, uint32_t *rkey, char *why,
             size_t whylen)
{
    FakeNic *nic = static_cast<FakeNic *>(ctx);
    if (nic->fail_next > 0) {
        nic->fail_next--;
        if (!nic->fail_reason.empty())
            snprintf(why, whylen, "%s", nic->fail_reason.c_str());
        return -1;
    }
    nic->regs++;
    void *h = reinterpret_cast<void *>(nic->next_handle++);
    nic->live[h] = Range(addr, len);
    nic->reg_log.push_back(Range(addr, len));
    *handle = h;
    *lkey = nic->next_key++;
    *rkey = *lkey + 10000;
    return 0;
}

void fake_dereg(void *ctx, void *handle)
{
    FakeNic *nic = static_cast<FakeNic *>(ctx);
    auto it = nic->live.find(handle);
    ASSERT_NE(it, nic->live.end()) << "dereg of a handle that is not registered";
    nic->deregs++;
    nic->dereg_log.push_back(it->second);
    nic->live.erase(it);
}

const uintptr_t P = (uintptr_t)sysconf(_SC_PAGESIZE);
// A fake address space: the cache never touches the memory it registers.
const uintptr_t BASE = (uintptr_t)1 << 40;

const void *at(uintptr_t page, uintptr_t off = 0) { return reinterpret_cast<const void *>(BASE + page * P + off); }
Range pages(uintptr_t first, uintptr_t n) { return Range(BASE + first * P, (size_t)(n * P)); }

class Regcache : public ::testing::Test {
public:
    FakeNic nic;
    weft_regcache *rc = nullptr;
    char why[256] = {0};

    void make(size_t cap_bytes)
    {
        weft_reg_ops ops = {&nic, fake_reg, fake_dereg};
        ASSERT_EQ(weft_regcache_create(&ops, cap_bytes, &rc), WEFT_SUCCESS);
        ASSERT_NE(rc, nullptr);
    }
    void TearDown() override
    {
        weft_regcache_destroy(rc);
        EXPECT_EQ(nic.live.size(), 0u) << "destroy left registrations behind";
    }
    weft_reg *get(const void *addr, size_t len)
    {
        weft_reg *r = nullptr;
        EXPECT_EQ(weft_regcache_acquire(rc, addr, len, &r, why, sizeof(why)), WEFT_SUCCESS) << why;
        return r;
    }
    // Acquire and release at once: the range becomes an idle cached entry.
    void touch(const void *addr, size_t len) { weft_regcache_release(rc, get(addr, len)); }
    weft_regcache_stats stats()
    {
        weft_regcache_stats st;
        memset(&st, 0xff, sizeof(st));
        weft_regcache_get_stats(rc, &st);
        return st;
    }
};

TEST_F(Regcache, HitOnSameAndInnerRange)
{
    make(64 * P);
    weft_reg *a = get(at(0), 3 * P);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(nic.regs, 1);
    EXPECT_EQ(Range(a->addr, a->len), pages(0, 3));
    EXPECT_EQ(a->lkey, 100u);
    EXPECT_EQ(a->rkey, 10100u);
    EXPECT_EQ(a->refs, 1);

    // Same range while in flight: the same entry, refcount 2.
    weft_reg *b = get(at(0), 3 * P);
    EXPECT_EQ(b, a);
    EXPECT_EQ(a->refs, 2);
    weft_regcache_release(rc, b);
    weft_regcache_release(rc, a);
    EXPECT_EQ(a->refs, 0);
    EXPECT_EQ(nic.deregs, 0) << "an idle entry under the cap stays cached";

    // Same range idle, then inner ranges (unaligned, one byte, zero bytes).
    EXPECT_EQ(get(at(0), 3 * P), a);
    EXPECT_EQ(get(at(1, 17), 100), a);
    EXPECT_EQ(get(at(2, P - 1), 1), a);
    EXPECT_EQ(get(at(1), 0), a);
    EXPECT_EQ(a->refs, 4);
    EXPECT_EQ(nic.regs, 1) << "a hit registered something";
    for (int i = 0; i < 4; i++)
        weft_regcache_release(rc, a);

    weft_regcache_stats st = stats();
    EXPECT_EQ(st.hits, 5u);
    EXPECT_EQ(st.misses, 1u);
    EXPECT_EQ(st.entries, 1u);
    EXPECT_EQ(st.pinned_bytes, 3 * P);
}

TEST_F(Regcache, PageRounding)
{
    make(64 * P);
    weft_reg *r = get(at(5, 10), 1);
    EXPECT_EQ(Range(r->addr, r->len), pages(5, 1));
    weft_regcache_release(rc, r);

    r = get(at(7, P - 10), 20); // straddles a page boundary
    EXPECT_EQ(Range(r->addr, r->len), pages(7, 2));
    weft_regcache_release(rc, r);

    r = get(at(10), 0); // zero bytes: one byte's page
    EXPECT_EQ(Range(r->addr, r->len), pages(10, 1));
    weft_regcache_release(rc, r);

    r = get(at(12, 1), 2 * P); // 2 pages of bytes over 3 pages
    EXPECT_EQ(Range(r->addr, r->len), pages(12, 3));
    weft_regcache_release(rc, r);

    r = get(at(20), 2 * P); // exactly two pages
    EXPECT_EQ(Range(r->addr, r->len), pages(20, 2));
    weft_regcache_release(rc, r);

    ASSERT_EQ(nic.reg_log.size(), 5u);
    for (const Range &g : nic.reg_log) {
        EXPECT_EQ(g.first % P, 0u);
        EXPECT_EQ(g.second % P, 0u);
    }
    // The page the 1-byte request rounded to serves the rest of that page.
    weft_reg *x = get(at(5), P), *y = get(at(5, P - 1), 1);
    EXPECT_EQ(x, y);
    EXPECT_EQ(Range(x->addr, x->len), pages(5, 1));
    weft_regcache_release(rc, x);
    weft_regcache_release(rc, y);
    EXPECT_EQ(nic.regs, 5);
}

TEST_F(Regcache, WrappingRangeRefused)
{
    make(64 * P);
    weft_reg *sentinel = reinterpret_cast<weft_reg *>(0x10), *r = sentinel;
    EXPECT_EQ(weft_regcache_acquire(rc, reinterpret_cast<void *>(UINTPTR_MAX - 10), 100, &r, why, sizeof(why)),
              WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(r, sentinel);
    EXPECT_STRNE(why, "");
    EXPECT_EQ(weft_regcache_pin(rc, reinterpret_cast<void *>(UINTPTR_MAX - 10), 1, why, sizeof(why)),
              WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(nic.regs, 0);
    // Invalidate clamps instead.
    EXPECT_EQ(weft_regcache_invalidate(rc, reinterpret_cast<void *>(UINTPTR_MAX - 10), 100), 0);
}

TEST_F(Regcache, OverlapRegistersTheRequestAndDropsContainedEntries)
{
    make(64 * P);
    weft_reg *a = get(at(0), 4 * P);
    weft_regcache_release(rc, a);
    // Overlaps A's last two pages, not inside it: registered as requested.
    weft_reg *b = get(at(2), 4 * P);
    EXPECT_NE(b, a);
    EXPECT_EQ(Range(b->addr, b->len), pages(2, 4));
    EXPECT_EQ(nic.regs, 2);
    weft_regcache_release(rc, b);
    EXPECT_EQ(nic.deregs, 0) << "a partly overlapping entry stays";

    // Each still serves its own ranges; the shared pages hit one of them.
    EXPECT_EQ(get(at(0), 3 * P), a);
    EXPECT_EQ(get(at(4), 2 * P), b);
    weft_reg *mid = get(at(2), 2 * P);
    EXPECT_TRUE(mid == a || mid == b);
    EXPECT_EQ(nic.regs, 2);
    weft_regcache_release(rc, a);
    weft_regcache_release(rc, b);
    weft_regcache_release(rc, mid);

    // A request spanning both idle entries: they are redundant and go.
    weft_reg *c = get(at(0), 6 * P);
    EXPECT_EQ(Range(c->addr, c->len), pages(0, 6));
    EXPECT_EQ(nic.regs, 3);
    EXPECT_EQ(nic.deregs, 2);
    weft_regcache_stats st = stats();
    EXPECT_EQ(st.entries, 1u);
    EXPECT_EQ(st.pinned_bytes, 6 * P);
    EXPECT_EQ(st.evictions, 2u);
    weft_regcache_release(rc, c);

    // A contained entry still in flight is retired: kept registered until
    // its release, never returned again.
    weft_reg *d = get(at(10), 2 * P);
    weft_reg *e = get(at(8), 6 * P);
    EXPECT_NE(d, e);
    EXPECT_EQ(d->dead, 1);
    EXPECT_EQ(nic.live.size(), 3u);
    EXPECT_EQ(get(at(10), 2 * P), e);
    weft_regcache_release(rc, e);
    int deregs = nic.deregs;
    weft_regcache_release(rc, d);
    EXPECT_EQ(nic.deregs, deregs + 1);
    EXPECT_EQ(nic.dereg_log.back(), pages(10, 2));
    weft_regcache_release(rc, e);
}

TEST_F(Regcache, EvictsLeastRecentlyUsedAtTheCap)
{
    make(4 * P);
    touch(at(0), P);  // A
    touch(at(10), P); // B
    touch(at(20), P); // C
    touch(at(30), P); // D: at the cap, nothing evicted
    EXPECT_EQ(nic.deregs, 0);
    EXPECT_EQ(stats().pinned_bytes, 4 * P);
    touch(at(0), P);  // A used again: LRU order is now B, C, D, A
    EXPECT_EQ(nic.regs, 4);

    touch(at(40), P); // E: evicts B
    ASSERT_EQ(nic.deregs, 1);
    EXPECT_EQ(nic.dereg_log[0], pages(10, 1));
    touch(at(50), 2 * P); // F, two pages: evicts C and D
    ASSERT_EQ(nic.deregs, 3);
    EXPECT_EQ(nic.dereg_log[1], pages(20, 1));
    EXPECT_EQ(nic.dereg_log[2], pages(30, 1));
    touch(at(60), P); // G: evicts A (the oldest left)
    ASSERT_EQ(nic.deregs, 4);
    EXPECT_EQ(nic.dereg_log[3], pages(0, 1));

    weft_regcache_stats st = stats();
    EXPECT_EQ(st.evictions, 4u);
    EXPECT_EQ(st.pinned_bytes, 4 * P);
    EXPECT_EQ(st.entries, 3u);
    EXPECT_EQ(nic.live_bytes(), 4 * P);
    // E, F, G still hit.
    touch(at(40), P);
    touch(at(51), P);
    touch(at(60), P);
    EXPECT_EQ(nic.regs, 7);
}

TEST_F(Regcache, NothingEvictedWhileInFlight)
{
    make(2 * P);
    weft_reg *a = get(at(0), P);
    weft_reg *b = get(at(10), P);
    weft_reg *c = get(at(20), P); // over the cap: A and B are in flight
    EXPECT_EQ(nic.regs, 3);
    EXPECT_EQ(nic.deregs, 0);
    EXPECT_EQ(stats().pinned_bytes, 3 * P);

    // A released while over the cap: it is the idle one, it goes.
    weft_regcache_release(rc, a);
    EXPECT_EQ(nic.deregs, 1);
    EXPECT_EQ(nic.dereg_log[0], pages(0, 1));
    EXPECT_EQ(stats().pinned_bytes, 2 * P);
    // Back at the cap: B and C stay cached after their release.
    weft_regcache_release(rc, b);
    weft_regcache_release(rc, c);
    EXPECT_EQ(nic.deregs, 1);
    EXPECT_EQ(get(at(10), P), b);
    weft_regcache_release(rc, b);
    EXPECT_EQ(nic.regs, 3);
}

TEST_F(Regcache, OverCapWhenEverythingIsInFlight)
{
    make(2 * P);
    weft_reg *a = get(at(0), 8 * P); // alone larger than the cap
    weft_reg *b = get(at(20), 8 * P);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(nic.regs, 2);
    EXPECT_EQ(stats().pinned_bytes, 16 * P);
    weft_regcache_release(rc, a);
    weft_regcache_release(rc, b);
    // Releases bring it back under the cap.
    EXPECT_EQ(nic.deregs, 2);
    weft_regcache_stats st = stats();
    EXPECT_EQ(st.pinned_bytes, 0u);
    EXPECT_EQ(st.entries, 0u);
}

TEST_F(Regcache, CapZeroRegistersPerAcquire)
{
    make(0);
    weft_reg *a = get(at(0), P);
    weft_reg *b = get(at(0), P); // the same range, a region of its own
    EXPECT_NE(a, b);
    EXPECT_EQ(nic.regs, 2);
    weft_regcache_release(rc, a);
    EXPECT_EQ(nic.deregs, 1);
    weft_regcache_release(rc, b);
    EXPECT_EQ(nic.deregs, 2);
    touch(at(0), P);
    EXPECT_EQ(nic.regs, 3);
    EXPECT_EQ(nic.deregs, 3);
    // Invalidate has nothing to do: nothing is cached.
    weft_reg *c = get(at(0), P);
    EXPECT_EQ(weft_regcache_invalidate(rc, at(0), P), 0);
    weft_regcache_release(rc, c);
    EXPECT_EQ(nic.deregs, 4);

    // A user pin is still honoured, and acquires inside it use it.
    ASSERT_EQ(weft_regcache_pin(rc, at(40), 4 * P, why, sizeof(why)), WEFT_SUCCESS) << why;
    EXPECT_EQ(nic.regs, 5);
    weft_reg *p = get(at(41), P);
    EXPECT_EQ(Range(p->addr, p->len), pages(40, 4));
    weft_regcache_release(rc, p);
    EXPECT_EQ(nic.regs, 5);
    EXPECT_EQ(nic.deregs, 4);

    weft_regcache_stats st = stats();
    EXPECT_EQ(st.hits, 1u);
    EXPECT_EQ(st.misses, 5u);
    EXPECT_EQ(st.entries, 1u);
    EXPECT_EQ(st.pinned_bytes, 4 * P);
}

TEST_F(Regcache, PinnedIsNeverEvicted)
{
    make(2 * P);
    ASSERT_EQ(weft_regcache_pin(rc, at(0), P, why, sizeof(why)), WEFT_SUCCESS) << why;
    EXPECT_EQ(nic.regs, 1);
    for (int i = 1; i <= 20; i++)
        touch(at(10 * (uintptr_t)i), P);
    for (const Range &d : nic.dereg_log)
        EXPECT_NE(d, pages(0, 1)) << "the pinned range was evicted";
    touch(at(0, 5), 10); // still there
    EXPECT_EQ(nic.regs, 21);

    // Pinning a cached idle range pins that entry: no registration, no eviction.
    touch(at(500), P);
    int regs = nic.regs;
    ASSERT_EQ(weft_regcache_pin(rc, at(500, 8), 8, why, sizeof(why)), WEFT_SUCCESS) << why;
    EXPECT_EQ(nic.regs, regs);
    // Both pins fill the cap: a new range goes over it and leaves at its release.
    touch(at(600), P);
    EXPECT_EQ(nic.dereg_log.back(), pages(600, 1));
    EXPECT_EQ(nic.live.size(), 2u);
    EXPECT_EQ(stats().pinned_bytes, 2 * P);

    // Invalidate drops a pin.
    EXPECT_EQ(weft_regcache_invalidate(rc, at(0), 1), 1);
    EXPECT_EQ(nic.dereg_log.back(), pages(0, 1));
    touch(at(0), P);
    EXPECT_EQ(nic.reg_log.back(), pages(0, 1));
}

TEST_F(Regcache, InvalidateIdleDropsAtOnce)
{
    make(64 * P);
    weft_reg *a = get(at(0), 2 * P);
    uint32_t old_key = a->lkey;
    weft_regcache_release(rc, a);
    touch(at(10), P);

    EXPECT_EQ(weft_regcache_invalidate(rc, at(1, 100), 1), 1); // one byte inside A
    EXPECT_EQ(nic.deregs, 1);
    EXPECT_EQ(nic.dereg_log[0], pages(0, 2));
    EXPECT_EQ(weft_regcache_invalidate(rc, at(2), 8 * P), 0) << "no page shared with anything";

    weft_reg *b = get(at(0), 2 * P);
    EXPECT_EQ(nic.regs, 3) << "an acquire after invalidate must register anew";
    EXPECT_NE(b->lkey, old_key);
    weft_regcache_release(rc, b);
    EXPECT_EQ(stats().invalidations, 1u);
}

TEST_F(Regcache, InvalidateInFlightDeregistersAtLastRelease)
{
    make(64 * P);
    weft_reg *a = get(at(0), 2 * P);
    weft_reg *a2 = get(at(0), P);
    ASSERT_EQ(a2, a);
    EXPECT_EQ(weft_regcache_invalidate(rc, at(0), 2 * P), 1);
    EXPECT_EQ(nic.deregs, 0) << "deregistered under a transfer in flight";
    EXPECT_EQ(a->dead, 1);

    weft_reg *b = get(at(0), 2 * P);
    EXPECT_NE(b, a) << "a dead entry was returned";
    EXPECT_EQ(nic.regs, 2);
    EXPECT_EQ(weft_regcache_invalidate(rc, at(0), 2 * P), 1) << "only B is live";

    weft_regcache_release(rc, a2);
    EXPECT_EQ(nic.deregs, 0);
    weft_regcache_release(rc, a); // last release of A
    EXPECT_EQ(nic.deregs, 1);
    weft_regcache_release(rc, b);
    EXPECT_EQ(nic.deregs, 2);

    weft_regcache_stats st = stats();
    EXPECT_EQ(st.invalidations, 2u);
    EXPECT_EQ(st.entries, 0u);
    EXPECT_EQ(st.pinned_bytes, 0u);
    touch(at(0), 2 * P);
    EXPECT_EQ(nic.regs, 3);
}

TEST_F(Regcache, InvalidateOfFreedMemoryThenReuse)
{
    make(64 * P);
    const size_t n = 3 * P;
    char *buf = static_cast<char *>(malloc(n));
    ASSERT_NE(buf, nullptr);
    touch(buf, n);
    EXPECT_EQ(weft_regcache_invalidate(rc, buf, n), 1);
    free(buf);
    char *again = static_cast<char *>(malloc(n)); // very likely the same address
    ASSERT_NE(again, nullptr);
    weft_reg *r = get(again, n);
    EXPECT_EQ(nic.regs, 2) << "memory reused after invalidate got the stale registration";
    EXPECT_LE(r->addr, (uintptr_t)again);
    EXPECT_GE(r->addr + r->len, (uintptr_t)again + n);
    weft_regcache_release(rc, r);
    weft_regcache_invalidate(rc, again, n);
    free(again);
}

TEST_F(Regcache, RegistrationFailureLeavesNoEntry)
{
    make(64 * P);
    touch(at(100), P);
    nic.fail_next = 1;
    weft_reg *sentinel = reinterpret_cast<weft_reg *>(0x10), *r = sentinel;
    EXPECT_EQ(weft_regcache_acquire(rc, at(0), 4 * P, &r, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    EXPECT_EQ(r, sentinel) << "output set by a failing acquire";
    EXPECT_STREQ(why, "ibv_reg_mr: Cannot allocate memory");
    weft_regcache_stats st = stats();
    EXPECT_EQ(st.entries, 1u);
    EXPECT_EQ(st.pinned_bytes, P);
    EXPECT_EQ(nic.deregs, 0);

    // Next time it works, and it is a registration (nothing was cached).
    r = get(at(0), 4 * P);
    EXPECT_EQ(nic.regs, 2);
    weft_regcache_release(rc, r);

    // Pin fails the same way; a reg without a reason still gives one; NULL why is fine.
    nic.fail_next = 3;
    why[0] = '\0';
    EXPECT_EQ(weft_regcache_pin(rc, at(200), P, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    EXPECT_STREQ(why, "ibv_reg_mr: Cannot allocate memory");
    nic.fail_reason.clear();
    why[0] = '\0';
    EXPECT_EQ(weft_regcache_acquire(rc, at(200), P, &r, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    EXPECT_STRNE(why, "");
    EXPECT_EQ(weft_regcache_acquire(rc, at(200), P, &r, nullptr, 0), WEFT_ERR_TRANSPORT);
    st = stats();
    EXPECT_EQ(st.entries, 2u);
    EXPECT_EQ(nic.live.size(), 2u);
    EXPECT_EQ(weft_regcache_invalidate(rc, at(200), P), 0);

    // Short why buffers are truncated, not overrun.
    nic.fail_next = 1;
    nic.fail_reason = "a long reason from the NIC driver";
    char tiny[8];
    memset(tiny, 'x', sizeof(tiny));
    EXPECT_EQ(weft_regcache_acquire(rc, at(300), P, &r, tiny, 5), WEFT_ERR_TRANSPORT);
    EXPECT_STREQ(tiny, "a lo");
    EXPECT_EQ(tiny[5], 'x');
}

TEST_F(Regcache, Stats)
{
    make(3 * P);
    weft_regcache_stats st = stats();
    EXPECT_EQ(st.hits, 0u);
    EXPECT_EQ(st.misses, 0u);
    EXPECT_EQ(st.evictions, 0u);
    EXPECT_EQ(st.invalidations, 0u);
    EXPECT_EQ(st.pinned_bytes, 0u);
    EXPECT_EQ(st.entries, 0u);

    touch(at(0), P);          // miss
    touch(at(0, 10), 10);     // hit
    touch(at(10), 2 * P);     // miss
    touch(at(20), P);         // miss, evicts the first (LRU)
    weft_reg *h = get(at(20), 1); // hit, held
    weft_regcache_invalidate(rc, at(20), P);  // marked dead
    weft_regcache_invalidate(rc, at(10), 1);  // dropped
    st = stats();
    EXPECT_EQ(st.hits, 2u);
    EXPECT_EQ(st.misses, 3u);
    EXPECT_EQ(st.evictions, 1u);
    EXPECT_EQ(st.invalidations, 2u);
    EXPECT_EQ(st.entries, 1u); // the dead one, still in flight
    EXPECT_EQ(st.pinned_bytes, P);
    weft_regcache_release(rc, h);
    st = stats();
    EXPECT_EQ(st.entries, 0u);
    EXPECT_EQ(st.pinned_bytes, 0u);
    EXPECT_EQ(st.pinned_bytes, nic.live_bytes());

    weft_regcache_get_stats(nullptr, &st);
    EXPECT_EQ(st.hits, 0u);
}

TEST_F(Regcache, DestroyDeregistersEverything)
{
    make(4 * P);
    ASSERT_EQ(weft_regcache_pin(rc, at(0), P, why, sizeof(why)), WEFT_SUCCESS);
    touch(at(10), P);
    (void)get(at(20), P);           // in flight
    weft_reg *d = get(at(30), P);   // in flight, then dead
    weft_regcache_invalidate(rc, at(30), P);
    EXPECT_EQ(d->dead, 1);
    (void)get(at(40), 10 * P);      // over the cap
    weft_regcache_destroy(rc);
    rc = nullptr;
    EXPECT_EQ(nic.live.size(), 0u);
    EXPECT_EQ(nic.deregs, 5);
}

TEST_F(Regcache, CreateChecksArguments)
{
    weft_regcache *out = reinterpret_cast<weft_regcache *>(0x10);
    weft_reg_ops ops = {&nic, nullptr, fake_dereg};
    EXPECT_EQ(weft_regcache_create(nullptr, 0, &out), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_regcache_create(&ops, 0, &out), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(out, reinterpret_cast<weft_regcache *>(0x10));
    weft_regcache_destroy(nullptr);
    weft_regcache_release(nullptr, nullptr);
    EXPECT_EQ(weft_regcache_invalidate(nullptr, at(0), P), 0);
}

// Random acquires, releases, pins and invalidates over overlapping ranges,
// checked against what the fake NIC holds: a hit returns a live entry that
// contains the range, a miss happens only when no live entry does, pinned
// ranges stay registered until an invalidate touches them, the byte and
// entry counts match, and idle unpinned entries never sit above the cap.
// Pins make entries nest, which is what exercises the interval tree's
// max-end descent.
void random_run(Regcache *t, weft_regcache *rc, FakeNic &nic, unsigned seed, size_t cap, int steps)
{
    std::mt19937 rng(seed);
    std::vector<weft_reg *> held;
    std::map<void *, weft_reg *> known; // handle -> entry (handles are never reused)
    std::set<void *> pinned;            // handles pinned and not invalidated since
    const uintptr_t span = 512;         // pages

    auto page_range = [](uintptr_t a, size_t len) {
        uintptr_t s = a & ~(P - 1), e = (a + (len ? len : 1) + P - 1) & ~(P - 1);
        return Range(s, e - s);
    };
    // after_pin: the range was just pinned, so this must hit, maybe on an
    // entry the pin registered (not yet in `known`).
    // Forgets entries the NIC no longer holds (their memory may already be
    // another entry's). Called after every cache call.
    auto prune = [&]() {
        for (auto it = known.begin(); it != known.end();)
            it = nic.live.count(it->first) ? std::next(it) : known.erase(it);
    };
    auto acquire = [&](const void *addr, size_t len, bool after_pin) {
        prune();
        Range pr = page_range((uintptr_t)addr, len);
        bool covered = false;
        for (const auto &kv : known)
            if (!kv.second->dead && kv.second->addr <= pr.first &&
                kv.second->addr + kv.second->len >= pr.first + pr.second)
                covered = true;
        int regs = nic.regs;
        weft_reg *r = nullptr;
        char why[128];
        ASSERT_EQ(weft_regcache_acquire(rc, addr, len, &r, why, sizeof(why)), WEFT_SUCCESS);
        ASSERT_FALSE(r->dead);
        ASSERT_LE(r->addr, pr.first);
        ASSERT_GE(r->addr + r->len, pr.first + pr.second);
        if (nic.regs == regs) {
            if (after_pin && !covered) {
                known[r->handle] = r;
            } else {
                ASSERT_TRUE(covered) << "hit on a range no live entry covers";
            }
        } else {
            ASSERT_FALSE(after_pin) << "a pinned range was not found";
            ASSERT_FALSE(covered) << "registered a range a live entry covers";
            ASSERT_EQ(Range(r->addr, r->len), pr);
            known[r->handle] = r;
        }
        held.push_back(r);
    };

    for (int step = 0; step < steps; step++) {
        SCOPED_TRACE("seed " + std::to_string(seed) + " step " + std::to_string(step));
        unsigned op = rng() % 20;
        if (op < 9 && held.size() >= 60)
            op = 9; // keep the in-flight set bounded
        uintptr_t first = rng() % span, off = rng() % P;
        const void *addr = at(first, off);
        if (op < 9) {
            ASSERT_NO_FATAL_FAILURE(acquire(addr, (size_t)(rng() % (8 * P)), false));
        } else if (op < 16) {
            if (held.empty())
                continue;
            size_t i = rng() % held.size();
            weft_regcache_release(rc, held[i]);
            held.erase(held.begin() + (long)i);
        } else if (op < 17) {
            size_t len = (size_t)(rng() % (2 * P));
            char why[128];
            ASSERT_EQ(weft_regcache_pin(rc, addr, len, why, sizeof(why)), WEFT_SUCCESS);
            // The same lookup finds the entry the pin made or marked.
            ASSERT_NO_FATAL_FAILURE(acquire(addr, len, true));
            weft_reg *r = held.back();
            ASSERT_EQ(r->user_pinned, 1);
            pinned.insert(r->handle);
            weft_regcache_release(rc, r);
            held.pop_back();
        } else {
            size_t len = (size_t)(rng() % (3 * P));
            Range pr = page_range((uintptr_t)addr, len);
            for (auto it = pinned.begin(); it != pinned.end();) {
                Range g = nic.live.at(*it);
                bool overlap = g.first < pr.first + pr.second && g.first + g.second > pr.first;
                it = overlap ? pinned.erase(it) : std::next(it);
            }
            weft_regcache_invalidate(rc, addr, len);
        }
        prune();
        weft_regcache_stats st = t->stats();
        ASSERT_EQ(st.pinned_bytes, nic.live_bytes());
        ASSERT_EQ(st.entries, nic.live.size());
        ASSERT_EQ(known.size(), nic.live.size());
        for (void *h : pinned) {
            ASSERT_EQ(nic.live.count(h), 1u) << "a pinned range was deregistered";
            ASSERT_FALSE(known.at(h)->dead);
        }
        if (held.empty() && st.pinned_bytes > cap) {
            for (const auto &kv : known) {
                ASSERT_TRUE(kv.second->user_pinned) << "idle unpinned entry kept above the cap";
            }
        }
    }
    for (weft_reg *r : held)
        weft_regcache_release(rc, r);
}

TEST_F(Regcache, RandomAgainstModel)
{
    const size_t cap = 128 * P;
    make(cap);
    for (unsigned seed = 1; seed <= 4; seed++) {
        ASSERT_NO_FATAL_FAILURE(random_run(this, rc, nic, seed, cap, 20000));
        weft_regcache_invalidate(rc, at(0), 1024 * P); // drop the pins between runs
        EXPECT_EQ(stats().entries, 0u);
    }
    weft_regcache_stats st = stats();
    EXPECT_GT(st.hits, 10000u);
    EXPECT_GT(st.evictions, 1000u);
    EXPECT_GT(st.invalidations, 1000u);
}

// Many disjoint entries: every repeated acquire is a hit (one lookup), and
// the right entry comes back.
TEST_F(Regcache, ManyEntriesAllHit)
{
    const int n = 5000;
    make((size_t)n * 2 * P);
    std::vector<weft_reg *> first(n);
    for (int i = 0; i < n; i++) {
        first[i] = get(at(3 * (uintptr_t)i), 2 * P);
        weft_regcache_release(rc, first[i]);
    }
    for (int round = 0; round < 3; round++)
        for (int i = n - 1; i >= 0; i--) {
            weft_reg *r = get(at(3 * (uintptr_t)i, 100), P);
            ASSERT_EQ(r, first[i]);
            weft_regcache_release(rc, r);
        }
    EXPECT_EQ(nic.regs, n);
    EXPECT_EQ(stats().hits, 3u * n);
}

// ---- weft_mem_register / weft_mem_deregister --------------------------------

// A comm as far as these calls look: its core (rank, last error) and a p2p
// context whose only transport that pins memory is a fake one over a
// registration cache (as ib's is, p2p/transport/ib/).
int fake_pin(void *ctx, const void *buf, size_t bytes, char *why, size_t whylen)
{
    return weft_regcache_pin(static_cast<weft_regcache *>(ctx), buf, bytes, why, whylen);
}
void fake_unpin(void *ctx, const void *buf, size_t bytes)
{
    (void)weft_regcache_invalidate(static_cast<weft_regcache *>(ctx), buf, bytes);
}
void fake_destroy(void *ctx)
{
    weft_regcache_destroy(static_cast<weft_regcache *>(ctx));
}

class MemRegister : public ::testing::Test {
protected:
    weft_comm *c = nullptr;
    weft_regcache *cache = nullptr;
    weft_transport fake_tp;
    FakeNic nic;
    char buf[64];

    void SetUp() override
    {
        c = static_cast<weft_comm *>(calloc(1, sizeof(weft_comm)));
        weft_core_init(&c->core, 3, 4);
        ASSERT_EQ(weft_p2p_create(&c->core, &c->p2p), WEFT_SUCCESS);
        memset(&fake_tp, 0, sizeof(fake_tp));
        fake_tp.name = "fake_rdma";
        fake_tp.destroy = fake_destroy;
        fake_tp.mem_pin = fake_pin;
        fake_tp.mem_unpin = fake_unpin;
    }
    void TearDown() override
    {
        weft_p2p_destroy(c->p2p);   // destroys the cache through fake_destroy
        weft_core_fini(&c->core);
        free(c);
    }
    void with_cache(size_t cap)
    {
        weft_reg_ops ops = {&nic, fake_reg, fake_dereg};
        ASSERT_EQ(weft_regcache_create(&ops, cap, &cache), WEFT_SUCCESS);
        // The last entry of the registry takes the fake's place.
        weft_p2p_tp *t = &c->p2p->tps[c->p2p->ntps - 1];
        t->tp = &fake_tp;
        t->ctx = cache;
    }
    std::string last() { return weft_comm_last_error(c); }
};

TEST_F(MemRegister, NullComm)
{
    EXPECT_EQ(weft_mem_register(nullptr, buf, sizeof(buf)), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_mem_deregister(nullptr, buf, sizeof(buf)), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_mem_register(nullptr, nullptr, 0), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_mem_deregister(nullptr, nullptr, 0), WEFT_ERR_INVALID_ARG);
}

TEST_F(MemRegister, ArgumentChecks)
{
    with_cache(1 << 20);
    EXPECT_EQ(weft_mem_register(c, nullptr, 16), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last().find("weft_mem_register: buf is NULL"), std::string::npos) << last();
    EXPECT_NE(last().find("rank 3"), std::string::npos) << last();
    EXPECT_EQ(weft_mem_register(c, buf, 0), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last().find("weft_mem_register: bytes is 0"), std::string::npos) << last();
    EXPECT_EQ(weft_mem_deregister(c, nullptr, 16), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last().find("weft_mem_deregister: buf is NULL"), std::string::npos) << last();
    EXPECT_EQ(weft_mem_deregister(c, buf, 0), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last().find("weft_mem_deregister: bytes is 0"), std::string::npos) << last();
    EXPECT_EQ(weft_mem_register(c, reinterpret_cast<void *>(UINTPTR_MAX - 7), 64), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last().find("wraps"), std::string::npos) << last();
    EXPECT_EQ(nic.regs, 0);
}

TEST_F(MemRegister, WithoutRdmaTransportDoesNothing)
{
    EXPECT_EQ(weft_mem_register(c, buf, sizeof(buf)), WEFT_SUCCESS);
    EXPECT_EQ(weft_mem_deregister(c, buf, sizeof(buf)), WEFT_SUCCESS);
    EXPECT_EQ(weft_mem_deregister(c, buf, sizeof(buf)), WEFT_SUCCESS);
    EXPECT_EQ(last(), "");
}

TEST_F(MemRegister, PinsAndDropsThroughTheCache)
{
    with_cache(0); // even with caching off, a user registration stays
    EXPECT_EQ(weft_mem_register(c, buf, sizeof(buf)), WEFT_SUCCESS);
    EXPECT_EQ(nic.regs, 1);
    EXPECT_EQ(weft_mem_register(c, buf + 8, 8), WEFT_SUCCESS) << "inside a registered range";
    EXPECT_EQ(nic.regs, 1);

    weft_reg *r = nullptr;
    char why[128];
    ASSERT_EQ(weft_regcache_acquire(cache, buf, sizeof(buf), &r, why, sizeof(why)), WEFT_SUCCESS);
    EXPECT_EQ(nic.regs, 1) << "a transfer from a registered buffer registered again";
    EXPECT_EQ(r->user_pinned, 1);
    weft_regcache_release(cache, r);

    EXPECT_EQ(weft_mem_deregister(c, buf, sizeof(buf)), WEFT_SUCCESS);
    EXPECT_EQ(nic.deregs, 1);
    EXPECT_EQ(weft_mem_deregister(c, buf, sizeof(buf)), WEFT_SUCCESS) << "twice is harmless";
    EXPECT_EQ(nic.deregs, 1);
    EXPECT_EQ(last(), "");
}

TEST_F(MemRegister, RegistrationFailureNamesRangeAndReason)
{
    with_cache(1 << 20);
    nic.fail_next = 1;
    nic.fail_reason = "ibv_reg_mr: Operation not permitted (RLIMIT_MEMLOCK?)";
    EXPECT_EQ(weft_mem_register(c, buf, sizeof(buf)), WEFT_ERR_TRANSPORT);
    char range[64];
    snprintf(range, sizeof(range), "[0x%" PRIxPTR ", 0x%" PRIxPTR ")", (uintptr_t)buf,
             (uintptr_t)buf + sizeof(buf));
    std::string e = last();
    EXPECT_NE(e.find("weft_mem_register"), std::string::npos) << e;
    EXPECT_NE(e.find(range), std::string::npos) << e;
    EXPECT_NE(e.find("64 bytes"), std::string::npos) << e;
    EXPECT_NE(e.find("Operation not permitted (RLIMIT_MEMLOCK?)"), std::string::npos) << e;
    weft_regcache_stats st;
    weft_regcache_get_stats(cache, &st);
    EXPECT_EQ(st.entries, 0u);
    EXPECT_EQ(weft_mem_register(c, buf, sizeof(buf)), WEFT_SUCCESS);
}

} // namespace
