// The CUDA IPC mapping cache (p2p/transport/cuda_ipc/cuda_ipc_cache.c) with fake open/close
// operations: no CUDA needed. Checks hits, the stale buffer id rule (the
// exporter freed and reallocated at the same address), LRU eviction at the
// cap, and that entries with copies in flight are never closed.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

extern "C" {
#include "cuda_ipc_cache.h"
}

namespace {

struct Key {
    int peer;
    uint64_t base, id;
    bool operator<(const Key &o) const
    {
        return peer != o.peer ? peer < o.peer : base != o.base ? base < o.base : id < o.id;
    }
    bool operator==(const Key &o) const { return peer == o.peer && base == o.base && id == o.id; }
};

/* Fake IPC: every open hands out a fresh "mapping" and records it; close
 * checks it was open. Open fails for keys in `refuse`. */
struct Fake {
    int opens = 0, closes = 0, bad_closes = 0;
    uintptr_t next_map = 0x1000;
    std::map<uintptr_t, Key> open_maps;   /* mapping -> key */
    std::vector<Key> closed;              /* in close order */
    std::set<Key> refuse;
};

int fake_open(void *ctx, weft_ipc_cache_entry *e, const void *arg)
{
    Fake *f = static_cast<Fake *>(ctx);
    (void)arg;
    Key k{e->peer, e->base, e->buffer_id};
    if (f->refuse.count(k))
        return 7;
    uintptr_t m = f->next_map;
    f->next_map += 0x1000;
    f->open_maps[m] = k;
    e->mapped = reinterpret_cast<void *>(m);
    e->data[0] = static_cast<uint8_t>(e->buffer_id);
    f->opens++;
    return 0;
}

void fake_close(void *ctx, weft_ipc_cache_entry *e)
{
    Fake *f = static_cast<Fake *>(ctx);
    auto it = f->open_maps.find(reinterpret_cast<uintptr_t>(e->mapped));
    if (it == f->open_maps.end() || !(it->second == Key{e->peer, e->base, e->buffer_id})) {
        f->bad_closes++;
        return;
    }
    f->closed.push_back(it->second);
    f->open_maps.erase(it);
    f->closes++;
}

const weft_ipc_cache_ops kOps = {fake_open, fake_close, nullptr};

/* may_close for the deferral test: closing allowed only when g_may_close. */
int g_may_close = 1;
int fake_may_close(void *ctx)
{
    (void)ctx;
    return g_may_close;
}
const weft_ipc_cache_ops kOpsDeferring = {fake_open, fake_close, fake_may_close};

class IpcCache : public ::testing::Test {
protected:
    Fake f;
    weft_ipc_cache *c = nullptr;

    void make(size_t cap) { c = weft_ipc_cache_create(cap, &kOps, &f); ASSERT_NE(c, nullptr); }
    void TearDown() override
    {
        weft_ipc_cache_destroy(c);
        EXPECT_TRUE(f.open_maps.empty()) << "destroy left mappings open";
        EXPECT_EQ(f.bad_closes, 0);
    }
    /* get + put: one transfer that completed. */
    weft_ipc_cache_entry *use(int peer, uint64_t base, uint64_t id, int *hit = nullptr)
    {
        weft_ipc_cache_entry *e = nullptr;
        EXPECT_EQ(weft_ipc_cache_get(c, peer, base, id, nullptr, &e, hit), 0);
        if (e)
            weft_ipc_cache_put(c, e);
        return e;
    }
    weft_ipc_cache_stats stats()
    {
        weft_ipc_cache_stats s;
        weft_ipc_cache_get_stats(c, &s);
        return s;
    }
};

TEST_F(IpcCache, RepeatedBufferOpensOnce)
{
    make(4);
    int hit = -1;
    weft_ipc_cache_entry *e1 = use(1, 0x500000, 10, &hit);
    EXPECT_EQ(hit, 0);
    void *m = e1->mapped;
    for (int i = 0; i < 5; i++) {
        weft_ipc_cache_entry *e = use(1, 0x500000, 10, &hit);
        EXPECT_EQ(hit, 1);
        EXPECT_EQ(e->mapped, m);
    }
    EXPECT_EQ(f.opens, 1);
    EXPECT_EQ(f.closes, 0);
    auto s = stats();
    EXPECT_EQ(s.hits, 5u);
    EXPECT_EQ(s.opens, 1u);
    EXPECT_EQ(s.entries, 1u);
}

/* While may_close says no (cuda_ipc: a stream waits on weft's stream
 * engine, and closing a mapping would wait for the device), stale and
 * evicted entries are not closed but parked; the first get once closing is
 * allowed closes them, and destroy closes what is still parked. */
TEST_F(IpcCache, ClosesPutOffWhileNotAllowed)
{
    c = weft_ipc_cache_create(2, &kOpsDeferring, &f);
    ASSERT_NE(c, nullptr);
    g_may_close = 0;
    use(1, 0x500000, 10);
    use(1, 0x500000, 11);            /* stale: 10 would be closed now */
    use(1, 0x600000, 12);
    use(1, 0x700000, 13);            /* over the cap of 2: an eviction */
    EXPECT_EQ(f.closes, 0) << "closed while may_close said no";
    auto s = stats();
    EXPECT_EQ(s.deferred, 2u);
    EXPECT_EQ(s.entries, 2u) << "parked entries do not count against the cap";
    g_may_close = 1;
    use(1, 0x700000, 13);            /* a hit; the parked ones are closed first */
    EXPECT_EQ(f.closes, 2);
    ASSERT_EQ(f.closed.size(), 2u);
    EXPECT_TRUE((f.closed[0] == Key{1, 0x500000, 10} || f.closed[1] == Key{1, 0x500000, 10}));
    g_may_close = 0;
    use(1, 0x500000, 14);            /* stale again, parked */
    EXPECT_EQ(f.closes, 2);
    g_may_close = 1;                 /* TearDown's destroy closes the rest */
}

/* Destroy closes parked entries even while closing is not allowed (it runs
 * after the stream engine was quiesced). */
TEST_F(IpcCache, DestroyClosesParkedEntries)
{
    c = weft_ipc_cache_create(1, &kOpsDeferring, &f);
    ASSERT_NE(c, nullptr);
    g_may_close = 0;
    use(2, 0x500000, 1);
    use(2, 0x500000, 2);
    use(2, 0x500000, 3);
    EXPECT_EQ(f.closes, 0);
    weft_ipc_cache_destroy(c);
    c = nullptr;
    EXPECT_EQ(f.closes, 3);
    g_may_close = 1;
}

TEST_F(IpcCache, KeyIncludesPeer)
{
    make(8);
    use(1, 0x500000, 10);
    use(2, 0x500000, 10);   /* same address in another process: another allocation */
    EXPECT_EQ(f.opens, 2);
    EXPECT_EQ(stats().entries, 2u);
    EXPECT_EQ(f.closes, 0);
}

TEST_F(IpcCache, StaleBufferIdReplacesAndCloses)
{
    make(8);
    weft_ipc_cache_entry *old = use(1, 0x500000, 10);
    void *old_map = old->mapped;
    int hit = -1;
    weft_ipc_cache_entry *e = use(1, 0x500000, 11, &hit);   /* freed + reallocated at the same base */
    EXPECT_EQ(hit, 0);
    EXPECT_EQ(f.opens, 2);
    ASSERT_EQ(f.closes, 1);
    EXPECT_TRUE((f.closed[0] == Key{1, 0x500000, 10}));
    EXPECT_NE(e->mapped, old_map);
    EXPECT_EQ(e->buffer_id, 11u);
    EXPECT_EQ(stats().entries, 1u);
    EXPECT_EQ(stats().stale, 1u);
    /* The new mapping is the cached one now. */
    use(1, 0x500000, 11, &hit);
    EXPECT_EQ(hit, 1);
    EXPECT_EQ(f.opens, 2);
    EXPECT_EQ(weft_ipc_cache_peek(c, 1, 0x500000)->buffer_id, 11u);
}

TEST_F(IpcCache, StaleEntryInFlightClosedAtLastPut)
{
    make(8);
    weft_ipc_cache_entry *old = nullptr, *nw = nullptr;
    ASSERT_EQ(weft_ipc_cache_get(c, 1, 0x500000, 10, nullptr, &old, nullptr), 0);
    ASSERT_EQ(weft_ipc_cache_get(c, 1, 0x500000, 11, nullptr, &nw, nullptr), 0);
    EXPECT_EQ(f.closes, 0) << "a mapping with a copy in flight was closed";
    EXPECT_EQ(stats().entries, 1u);
    weft_ipc_cache_put(c, old);
    ASSERT_EQ(f.closes, 1);
    EXPECT_TRUE((f.closed[0] == Key{1, 0x500000, 10}));
    weft_ipc_cache_put(c, nw);
    EXPECT_EQ(f.closes, 1);
}

TEST_F(IpcCache, LruEvictionAtCap)
{
    make(3);
    use(0, 0x1000000, 1);
    use(0, 0x2000000, 2);
    use(0, 0x3000000, 3);
    EXPECT_EQ(f.closes, 0);
    use(0, 0x1000000, 1);   /* 1 is now the most recent: 2 is the LRU */
    use(0, 0x4000000, 4);
    ASSERT_EQ(f.closes, 1);
    EXPECT_TRUE((f.closed[0] == Key{0, 0x2000000, 2}));
    EXPECT_EQ(stats().entries, 3u);
    EXPECT_EQ(stats().evictions, 1u);
    int hit = -1;
    use(0, 0x1000000, 1, &hit);
    EXPECT_EQ(hit, 1);
    use(0, 0x2000000, 2, &hit);   /* evicted: opened again, 3 goes */
    EXPECT_EQ(hit, 0);
    ASSERT_EQ(f.closes, 2);
    EXPECT_TRUE((f.closed[1] == Key{0, 0x3000000, 3}));
}

TEST_F(IpcCache, ManyBuffersStayWithinCap)
{
    make(16);
    for (int round = 0; round < 3; round++)
        for (uint64_t i = 0; i < 100; i++)
            use(static_cast<int>(i % 3), 0x10000000 + i * 0x100000, 1000 + i);
    auto s = stats();
    EXPECT_EQ(s.entries, 16u);
    EXPECT_EQ(f.open_maps.size(), 16u);
    EXPECT_EQ(s.opens, 300u);   /* cyclic over 100 > cap: every use misses */
    EXPECT_EQ(s.evictions, 300u - 16u);
}

TEST_F(IpcCache, NoEvictionWhileInFlight)
{
    make(2);
    std::vector<weft_ipc_cache_entry *> held;
    for (uint64_t i = 0; i < 5; i++) {
        weft_ipc_cache_entry *e = nullptr;
        ASSERT_EQ(weft_ipc_cache_get(c, 1, 0x10000000 + i * 0x100000, 100 + i, nullptr, &e, nullptr), 0);
        held.push_back(e);
    }
    EXPECT_EQ(f.closes, 0) << "an entry with a copy in flight was evicted";
    EXPECT_EQ(stats().entries, 5u);   /* over the cap while all are in use */
    /* Completing the copies brings the cache back to its cap, oldest first. */
    for (auto *e : held)
        weft_ipc_cache_put(c, e);
    EXPECT_EQ(stats().entries, 2u);
    ASSERT_EQ(f.closes, 3);
    EXPECT_TRUE((f.closed[0] == Key{1, 0x10000000, 100}));
    EXPECT_TRUE((f.closed[1] == Key{1, 0x10100000, 101}));
    EXPECT_TRUE((f.closed[2] == Key{1, 0x10200000, 102}));
}

TEST_F(IpcCache, InFlightEntrySkippedEvictionTakesNextLru)
{
    make(2);
    weft_ipc_cache_entry *busy = nullptr;
    ASSERT_EQ(weft_ipc_cache_get(c, 1, 0xa0000000, 1, nullptr, &busy, nullptr), 0);   /* LRU, in flight */
    use(1, 0xb0000000, 2);
    use(1, 0xc0000000, 3);   /* over cap: 1 is in flight, so 2 goes */
    ASSERT_EQ(f.closes, 1);
    EXPECT_TRUE((f.closed[0] == Key{1, 0xb0000000, 2}));
    EXPECT_NE(weft_ipc_cache_peek(c, 1, 0xa0000000), nullptr);
    weft_ipc_cache_put(c, busy);
    EXPECT_EQ(stats().entries, 2u);
}

TEST_F(IpcCache, RefcountAcrossConcurrentCopies)
{
    make(1);
    weft_ipc_cache_entry *a = nullptr, *b = nullptr;
    int hit = -1;
    ASSERT_EQ(weft_ipc_cache_get(c, 1, 0x500000, 10, nullptr, &a, &hit), 0);
    ASSERT_EQ(weft_ipc_cache_get(c, 1, 0x500000, 10, nullptr, &b, &hit), 0);
    EXPECT_EQ(hit, 1);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a->refs, 2);
    weft_ipc_cache_put(c, a);
    EXPECT_EQ(b->refs, 1);
    /* Another buffer over a cap of 1: the busy one stays. */
    use(1, 0x900000, 20);
    EXPECT_NE(weft_ipc_cache_peek(c, 1, 0x500000), nullptr);
    weft_ipc_cache_put(c, b);
    EXPECT_EQ(stats().entries, 1u);
    EXPECT_EQ(f.opens, 2);
}

TEST_F(IpcCache, OpenFailureCachesNothing)
{
    make(4);
    use(1, 0x500000, 10);
    f.refuse.insert(Key{1, 0x500000, 11});
    weft_ipc_cache_entry *e = reinterpret_cast<weft_ipc_cache_entry *>(1);
    EXPECT_EQ(weft_ipc_cache_get(c, 1, 0x500000, 11, nullptr, &e, nullptr), 7);
    EXPECT_EQ(e, nullptr);
    /* The stale mapping was closed anyway (its allocation is gone). */
    EXPECT_EQ(f.closes, 1);
    EXPECT_EQ(stats().entries, 0u);
    EXPECT_EQ(stats().open_fails, 1u);
    f.refuse.clear();
    int hit = -1;
    use(1, 0x500000, 11, &hit);
    EXPECT_EQ(hit, 0);
}

TEST_F(IpcCache, DestroyClosesEverythingIncludingInFlight)
{
    make(4);
    use(1, 0x500000, 10);
    use(2, 0x600000, 11);
    weft_ipc_cache_entry *busy = nullptr, *nw = nullptr;
    ASSERT_EQ(weft_ipc_cache_get(c, 3, 0x700000, 12, nullptr, &busy, nullptr), 0);
    ASSERT_EQ(weft_ipc_cache_get(c, 3, 0x700000, 13, nullptr, &nw, nullptr), 0);   /* busy now dead, in flight */
    weft_ipc_cache_destroy(c);
    c = nullptr;
    EXPECT_EQ(f.opens, 4);
    EXPECT_EQ(f.closes, 4);
}

TEST_F(IpcCache, ManyEntriesGrowTable)
{
    make(5000);
    for (uint64_t i = 0; i < 3000; i++)
        use(static_cast<int>(i & 7), 0x100000000ull + i * 0x200000, i + 1);
    int hit = -1;
    for (uint64_t i = 0; i < 3000; i += 97) {
        use(static_cast<int>(i & 7), 0x100000000ull + i * 0x200000, i + 1, &hit);
        EXPECT_EQ(hit, 1);
    }
    EXPECT_EQ(stats().entries, 3000u);
    EXPECT_EQ(f.closes, 0);
}

} // namespace
