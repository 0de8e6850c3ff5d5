/*
 * WEFT_TIMEOUT's one rule (src/core/deadline.c), for every kind of wait and
 * housekeeping the library has: WEFT_TIMEOUT=0 never fires a wait, a set
 * WEFT_TIMEOUT fires it after exactly factor x t + margin (the table's row,
 * never less than t), housekeeping ends even with 0, heartbeats are a few per
 * timeout. Every consumer calls these functions with its kind, so a kind
 * whose row is missing or wrong fails here.
 */
#include <gtest/gtest.h>

#include <map>
#include <string>

extern "C" {
#include "config.h"
#include "deadline.h"
}
#include "weft.h"

namespace {

const char *lookup(const char *name, void *ctx)
{
    auto *env = static_cast<std::map<std::string, std::string> *>(ctx);
    auto it = env->find(name);
    return it == env->end() ? nullptr : it->second.c_str();
}

struct weft_config with_timeout(const char *value)
{
    std::map<std::string, std::string> env;
    if (value != nullptr)
        env["WEFT_TIMEOUT"] = value;
    struct weft_config cfg;
    char err[256] = "";
    EXPECT_EQ(WEFT_SUCCESS, weft_config_load(&cfg, lookup, &env, err, sizeof(err))) << err;
    return cfg;
}

TEST(Deadline, ZeroNeverFiresAnyWait)
{
    struct weft_config cfg = with_timeout("0");
    EXPECT_TRUE(weft_waits_never_fail(&cfg));
    for (int k = 0; k < WEFT_WAIT_KINDS; k++) {
        double f = 0, m = 0;
        const char *name = weft_wait_rule((enum weft_wait)k, &f, &m);
        ASSERT_NE(name, nullptr) << "wait kind " << k << " has no row in deadline.c";
        EXPECT_EQ(0.0, weft_wait_bound(&cfg, (enum weft_wait)k)) << name;
        EXPECT_FALSE(weft_wait_expired(&cfg, (enum weft_wait)k, 0.0, 1e12)) << name << ": fired with WEFT_TIMEOUT=0";
    }
}

TEST(Deadline, SetTimeoutFiresAfterItsStatedBound)
{
    for (const char *t : {"0.2", "3", "300"}) {
        struct weft_config cfg = with_timeout(t);
        const double ts = std::stod(t);
        EXPECT_FALSE(weft_waits_never_fail(&cfg));
        EXPECT_EQ(ts, weft_timeout_setting(&cfg));
        for (int k = 0; k < WEFT_WAIT_KINDS; k++) {
            double f = 0, m = 0;
            const char *name = weft_wait_rule((enum weft_wait)k, &f, &m);
            ASSERT_NE(name, nullptr);
            const double bound = weft_wait_bound(&cfg, (enum weft_wait)k);
            EXPECT_DOUBLE_EQ(f * ts + m, bound) << name << " at WEFT_TIMEOUT=" << t;
            EXPECT_GE(bound, ts) << name << ": a wait never gives up before WEFT_TIMEOUT";
            EXPECT_FALSE(weft_wait_expired(&cfg, (enum weft_wait)k, 0.0, bound)) << name;
            EXPECT_FALSE(weft_wait_expired(&cfg, (enum weft_wait)k, 1000.0, 1000.0 + 0.99 * bound)) << name;
            EXPECT_TRUE(weft_wait_expired(&cfg, (enum weft_wait)k, 0.0, bound * (1 + 1e-9))) << name;
            EXPECT_TRUE(weft_wait_expired(&cfg, (enum weft_wait)k, 1000.0, 1000.0 + 1.01 * bound)) << name;
        }
    }
}

// The margins the docs state (docs/configuration.md, WEFT_TIMEOUT).
TEST(Deadline, StatedMargins)
{
    struct weft_config cfg = with_timeout("10");
    EXPECT_DOUBLE_EQ(10.0, weft_wait_bound(&cfg, WEFT_WAIT_REQUEST));
    EXPECT_DOUBLE_EQ(10.0, weft_wait_bound(&cfg, WEFT_WAIT_SHM_PIECE));
    EXPECT_DOUBLE_EQ(10.0, weft_wait_bound(&cfg, WEFT_WAIT_DESTROY));
    EXPECT_DOUBLE_EQ(20.0, weft_wait_bound(&cfg, WEFT_WAIT_TCP_CONNECT));
    EXPECT_DOUBLE_EQ(10.0 + 1.0 + 1.0, weft_wait_bound(&cfg, WEFT_WAIT_UID_RANK));
    EXPECT_LT(weft_wait_bound(&cfg, WEFT_WAIT_UID_ROOT), weft_wait_bound(&cfg, WEFT_WAIT_UID_RANK))
        << "the root, which knows who is missing, speaks before the ranks give up on it";
}

TEST(Deadline, HousekeepingEndsEvenWithZero)
{
    struct weft_config never = with_timeout("0");
    struct weft_config shortt = with_timeout("0.5");
    struct weft_config longt = with_timeout("500");
    for (int k = 0; k < WEFT_KEEP_KINDS; k++) {
        double fallback = 0, cap = 0;
        const char *name = weft_housekeeping_rule((enum weft_housekeeping)k, &fallback, &cap);
        ASSERT_NE(name, nullptr) << "housekeeping kind " << k << " has no row in deadline.c";
        EXPECT_GT(fallback, 0.0) << name;
        EXPECT_EQ(fallback, weft_housekeeping_bound(&never, (enum weft_housekeeping)k)) << name;
        EXPECT_EQ(0.5, weft_housekeeping_bound(&shortt, (enum weft_housekeeping)k)) << name;
        EXPECT_EQ(cap > 0 ? cap : 500.0, weft_housekeeping_bound(&longt, (enum weft_housekeeping)k)) << name;
    }
    EXPECT_EQ(2.0, weft_housekeeping_bound(&longt, WEFT_KEEP_MSGPIPE_LINGER));
    EXPECT_EQ(60.0, weft_housekeeping_bound(&never, WEFT_KEEP_TCP_ABANDONED));
}

TEST(Deadline, HeartbeatsAFewPerTimeout)
{
    struct weft_config cfg = with_timeout("40");
    EXPECT_DOUBLE_EQ(10.0, weft_heartbeat_period(&cfg));
    cfg = with_timeout("0.2");
    EXPECT_DOUBLE_EQ(0.1, weft_heartbeat_period(&cfg)) << "at most ten a second";
    cfg = with_timeout("0");
    EXPECT_DOUBLE_EQ(1.0, weft_heartbeat_period(&cfg)) << "a peer may run with a timeout of its own";
}

TEST(Deadline, DefaultIs300)
{
    struct weft_config cfg = with_timeout(nullptr);
    EXPECT_EQ(300.0, weft_timeout_setting(&cfg));
    EXPECT_EQ(300.0, weft_wait_bound(&cfg, WEFT_WAIT_REQUEST));
}

}  // namespace
