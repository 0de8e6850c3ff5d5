// The transport registry (p2p/transport/registry.c): WEFT_TRANSPORTS names
// resolved to registry entries, the card layout, the priority order.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "weft.h"
#include "weft_test_sizes.h"

extern "C" {
#include "p2p.h"
#include "registry.h"
#include "transport.h"
}

namespace {

unsigned bit(const char *name)
{
    for (int i = 0; i < weft_registry_count(); i++)
        if (std::strcmp(weft_registry_get(i)->name, name) == 0)
            return 1u << i;
    ADD_FAILURE() << "no transport named " << name;
    return 0;
}

unsigned movers()
{
    unsigned m = 0;
    for (int i = 0; i < weft_registry_count(); i++)
        if (!weft_registry_get(i)->ctrl)
            m |= 1u << i;
    return m;
}

unsigned mask_of(const char *names)
{
    unsigned m = 0;
    char why[256] = "";
    EXPECT_EQ(weft_registry_mask(names, &m, why, sizeof(why)), 0) << names << ": " << why;
    return m;
}

TEST(Registry, PriorityOrder)
{
    // Carriers in the order a pair prefers them, movers after them.
    ASSERT_GE(weft_registry_count(), 5);
    EXPECT_STREQ(weft_registry_get(0)->name, "self");
    EXPECT_STREQ(weft_registry_get(1)->name, "shm");
    EXPECT_STREQ(weft_registry_get(2)->name, "ib");
    EXPECT_STREQ(weft_registry_get(3)->name, "tcp");
    EXPECT_STREQ(weft_registry_get(4)->name, "cuda_ipc");
    EXPECT_EQ(weft_registry_get(weft_registry_count()), nullptr);
    EXPECT_EQ(weft_registry_get(-1), nullptr);
    for (int i = 0; i < weft_registry_count(); i++) {
        const weft_transport *t = weft_registry_get(i);
        EXPECT_NE(t->create, nullptr) << t->name;
        EXPECT_NE(t->reach, nullptr) << t->name;
        EXPECT_NE(t->connect, nullptr) << t->name;
        EXPECT_NE(t->destroy, nullptr) << t->name;
#ifndef WEFT_HAVE_VERBS_HEADERS
        if (std::strcmp(t->name, "ib") == 0)
            continue;   // built without verbs: a stub that is never offered
#endif
        if (t->ctrl) {
            EXPECT_NE(t->ctrl_send, nullptr) << t->name;
            EXPECT_NE(t->progress, nullptr) << t->name;
            EXPECT_NE(t->eager_limit, nullptr) << t->name;
            EXPECT_NE(t->rndv_expect, nullptr) << t->name;
            EXPECT_NE(t->rndv_push, nullptr) << t->name;
        }
    }
}

TEST(Registry, TransportsMask)
{
    const unsigned self = bit("self"), shm = bit("shm"), tcp = bit("tcp"), ib = bit("ib"), mv = movers();
    EXPECT_EQ(mask_of("shm,tcp"), self | shm | tcp | mv);
    EXPECT_EQ(mask_of("shm,ib"), self | shm | ib | mv);
    EXPECT_EQ(mask_of("tcp"), self | tcp | mv) << "self is always added";
    EXPECT_EQ(mask_of("shm"), self | shm | mv);
    EXPECT_EQ(mask_of("self"), self | mv);
    EXPECT_EQ(mask_of("TCP,Shm"), self | shm | tcp | mv);
    EXPECT_EQ(mask_of("tcp,tcp"), self | tcp | mv);
    EXPECT_EQ(weft_registry_mask_all(), (1u << weft_registry_count()) - 1);

    for (const char *bad : {"rdma", "sh", "shmm", "tcp,ibv", "i", "cuda_ipc"}) {
        unsigned m = 12345;
        char why[256] = "";
        EXPECT_NE(weft_registry_mask(bad, &m, why, sizeof(why)), 0) << "\"" << bad << "\" accepted";
        EXPECT_EQ(m, 12345u) << "\"" << bad << "\" wrote the output";
        EXPECT_NE(std::string(why).find("unknown transport"), std::string::npos) << why;
        EXPECT_NE(std::string(why).find("tcp"), std::string::npos) << "does not list what exists: " << why;
    }
}

TEST(Registry, CardLayout)
{
    size_t off[16];
    size_t total = weft_registry_card_layout(off);
    size_t at = sizeof(weft_card_hdr);
    for (int i = 0; i < weft_registry_count(); i++) {
        const weft_transport *t = weft_registry_get(i);
        EXPECT_GE(off[i], at) << t->name << "'s blob overlaps what comes before it";
        EXPECT_EQ(off[i] % 8, 0u) << t->name;
        at = off[i] + t->card_bytes;
    }
    EXPECT_GE(total, at);
    EXPECT_EQ(total % 8, 0u);
    EXPECT_EQ(weft_p2p_card_bytes(), total);
    // bench/ and tests/ use the size without the library's headers.
    EXPECT_EQ(total, (size_t)WEFT_TEST_RANK_CARD_BYTES) << "update include/weft_test_sizes.h";
}

} // namespace
