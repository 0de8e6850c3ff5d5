/*
 * The progress engine of a comm (p2p/engine.h) and the wait policy
 * (src/core/backoff.h), on a one-rank p2p context with no transport in use:
 * which thread runs which client, what WEFT_PROGRESS_THREAD changes, what
 * "weft's own thread" means, that unregistering waits for a running poll,
 * and the policy's phases (the oversubscription rule included) on a clock
 * the test moves itself.
 */
#include <gtest/gtest.h>

#include <pthread.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "weft.h"

extern "C" {
#include "backoff.h"
#include "config.h"
#include "core.h"
#include "engine.h"
#include "log.h"
#include "p2p.h"
}
#include "p2p_lock_shim.h"

namespace {

const char *no_env(const char *, void *) { return nullptr; }

/* A one-rank p2p context (nothing connected: the pipes pass is empty). */
struct Ctx {
    struct weft_core core;
    struct weft_p2p *p2p = nullptr;
    explicit Ctx(int progress_thread, const char *threads = "multiple")
    {
        std::memset(&core, 0, sizeof(core));
        weft_core_init(&core, 0, 1);
        char err[256] = "";
        EXPECT_EQ(WEFT_SUCCESS, weft_config_load(&core.cfg, no_env, nullptr, err, sizeof(err))) << err;
        core.cfg.progress_thread = progress_thread;
        std::snprintf(core.cfg.threads, sizeof(core.cfg.threads), "%s", threads);
        EXPECT_EQ(WEFT_SUCCESS, weft_p2p_create(&core, &p2p)) << weft_error_line(&core);
    }
    ~Ctx()
    {
        weft_p2p_destroy(p2p);
        weft_core_fini(&core);
    }
    struct weft_engine *engine() { return weft_p2p_engine(p2p); }
};

/* A client that counts its polls and notes where they ran. */
struct Probe {
    std::atomic<int> polls{0};
    std::atomic<int> work{0};            /* busy while > 0; each poll takes one */
    std::atomic<int> on_own_thread{-1};  /* weft_engine_own_thread() in the last poll */
    std::atomic<bool> on_test_thread{false};
    pthread_t test_thread = pthread_self();
    std::atomic<int> hold_ms{0};         /* a poll that takes this long */
    std::atomic<int> finished{0};        /* polls that returned */
};

int probe_poll(void *arg)
{
    Probe *p = static_cast<Probe *>(arg);
    p->polls++;
    p->on_own_thread = weft_engine_own_thread();
    if (pthread_equal(pthread_self(), p->test_thread))
        p->on_test_thread = true;
    if (int ms = p->hold_ms.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    int w = p->work.load();
    while (w > 0 && !p->work.compare_exchange_weak(w, w - 1)) {}
    p->finished++;
    return w > 0;
}

int probe_busy(void *arg)
{
    return static_cast<Probe *>(arg)->work.load() > 0;
}

bool eventually(const std::function<bool()> &cond, int ms = 10000)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < end) {
        if (cond())
            return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return cond();
}

const struct weft_engine_client needs_thread = {"needs a thread", probe_poll, probe_busy, 500, 0, 0,
                                                WEFT_CLIENT_NEEDS_THREAD};
const struct weft_engine_client thread_only = {"thread", probe_poll, probe_busy, 0, 0, 0, WEFT_CLIENT_THREAD};
const struct weft_engine_client waits = {"waits", probe_poll, nullptr, 0, 0, 0, WEFT_CLIENT_WAITS};
const struct weft_engine_client app_only = {"app only", probe_poll, nullptr, 0, 0, 1,
                                            WEFT_CLIENT_WAITS | WEFT_CLIENT_APP_ONLY};

TEST(Engine, ClientWithNoOtherDriverStartsTheThreadAndRunsOnIt)
{
    Ctx c(0);   /* WEFT_PROGRESS_THREAD=0: the thread starts for this client anyway */
    Probe p;
    p.work = 1000;
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &needs_thread, &p));
    EXPECT_TRUE(eventually([&] { return p.work.load() == 0; })) << "polled " << p.polls << " times";
    EXPECT_EQ(1, p.on_own_thread.load()) << "the progress thread is weft's own thread";
    EXPECT_FALSE(p.on_test_thread.load());
    EXPECT_EQ(0, weft_engine_own_thread()) << "the application's thread is not";

    /* Idle, then new work and a kick: polled again. */
    int before = p.polls;
    p.work = 10;
    weft_engine_kick(c.engine());
    EXPECT_TRUE(eventually([&] { return p.work.load() == 0 && p.polls > before; }));
    weft_engine_unregister(c.engine(), &needs_thread, &p);
    int after = p.polls;
    p.work = 10;
    weft_engine_kick(c.engine());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(after, p.polls.load()) << "a client polled after it unregistered";
}

TEST(Engine, ThreadClientsRunOnlyWithTheProgressThreadSetting)
{
    {
        Ctx c(0);
        Probe p;
        p.work = 5;
        ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &thread_only, &p));
        ASSERT_EQ(WEFT_SUCCESS, weft_engine_start(c.engine()));   /* nothing with 0 */
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_EQ(0, p.polls.load()) << "WEFT_PROGRESS_THREAD=0 ran a thread client";
        weft_engine_unregister(c.engine(), &thread_only, &p);
    }
    {
        Ctx c(1);
        Probe p;
        p.work = 5;
        ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &thread_only, &p));
        ASSERT_EQ(WEFT_SUCCESS, weft_engine_start(c.engine()));
        EXPECT_TRUE(eventually([&] { return p.work.load() == 0; })) << "WEFT_PROGRESS_THREAD=1 did not run it";
        EXPECT_EQ(1, p.on_own_thread.load());
        weft_engine_unregister(c.engine(), &thread_only, &p);
        weft_engine_stop(c.engine());
    }
}

TEST(Engine, WaitsRunTheirClientsAndTheApplicationsOnlyOnItsThreads)
{
    Ctx c(0);
    Probe w, a;
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &waits, &w));
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &app_only, &a));
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &app_only, &a)) << "the same pair twice is one";
    EXPECT_EQ(1, weft_engine_sleep_cap_ms(c.engine())) << "the app-only client bounds a waiter's sleeps";

    weft_engine_run_waits(c.engine(), 1.0, 1);
    EXPECT_EQ(1, w.polls.load());
    EXPECT_EQ(1, a.polls.load()) << "registered twice, run once";
    weft_engine_run_waits(c.engine(), 2.0, 0);   /* a test loop: not the application's hook */
    EXPECT_EQ(2, w.polls.load());
    EXPECT_EQ(1, a.polls.load());

    /* On weft's own thread (inside a client run by the progress thread):
     * the waits clients run, the application's hook never. */
    struct Nested {
        struct weft_engine *e;
        Probe own;
    } n{c.engine(), {}};
    n.own.work = 1;
    static const struct weft_engine_client nested = {
        "runs waits on the thread",
        [](void *arg) {
            Nested *m = static_cast<Nested *>(arg);
            if (m->own.work.load() > 0) {
                weft_engine_run_waits(m->e, 3.0, 1);
                m->own.work = 0;
            }
            return 0;
        },
        [](void *arg) { return static_cast<int>(static_cast<Nested *>(arg)->own.work.load() > 0); },
        0, 0, 0, WEFT_CLIENT_NEEDS_THREAD};
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &nested, &n));
    EXPECT_TRUE(eventually([&] { return n.own.work.load() == 0; }));
    EXPECT_EQ(3, w.polls.load());
    EXPECT_EQ(1, a.polls.load()) << "the application's hook ran on weft's own thread";
    EXPECT_EQ(1, w.on_own_thread.load());

    weft_engine_unregister(c.engine(), &nested, &n);
    weft_engine_unregister(c.engine(), &app_only, &a);
    EXPECT_EQ(0, weft_engine_sleep_cap_ms(c.engine()));
    weft_engine_run_waits(c.engine(), 4.0, 1);
    EXPECT_EQ(1, a.polls.load()) << "an unregistered client ran";
    weft_engine_unregister(c.engine(), &waits, &w);
}

TEST(Engine, MinGapHoldsAClientBackInWaits)
{
    Ctx c(0);
    Probe p;
    const struct weft_engine_client gap = {"gap", probe_poll, nullptr, 0, 0.5, 0, WEFT_CLIENT_WAITS};
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &gap, &p));
    weft_engine_run_waits(c.engine(), 10.0, 1);
    weft_engine_run_waits(c.engine(), 10.4, 1);
    EXPECT_EQ(1, p.polls.load()) << "ran again within its gap";
    weft_engine_run_waits(c.engine(), 10.5, 1);
    EXPECT_EQ(2, p.polls.load());
    weft_engine_unregister(c.engine(), &gap, &p);
}

TEST(Engine, UnregisterReturnsOnlyOnceNoThreadRunsTheClient)
{
    Ctx c(0);
    Probe p;
    p.hold_ms = 200;
    p.work = 1000;
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &needs_thread, &p));
    ASSERT_TRUE(eventually([&] { return p.polls.load() > 0; }));
    weft_engine_unregister(c.engine(), &needs_thread, &p);
    int finished = p.finished, polls = p.polls;
    EXPECT_EQ(polls, finished) << "unregister returned while a poll ran";
    /* A poll still running now would finish after its sleep. */
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(finished, p.finished.load());
    EXPECT_EQ(polls, p.polls.load());
    p.hold_ms = 0;
}

TEST(Engine, StopJoinsAndAClientCanStartTheThreadAgainBeforeDestroy)
{
    Ctx c(0);
    Probe p;
    p.work = 3;
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &needs_thread, &p));
    EXPECT_TRUE(eventually([&] { return p.work.load() == 0; }));
    weft_engine_unregister(c.engine(), &needs_thread, &p);
    weft_engine_stop(c.engine());
    weft_engine_stop(c.engine());   /* twice: nothing */
    p.work = 3;
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &needs_thread, &p));
    EXPECT_TRUE(eventually([&] { return p.work.load() == 0; }));
    weft_engine_unregister(c.engine(), &needs_thread, &p);
}

/* ---- the wait policy ---- */

struct weft_core core_with(int spin_us, int oversubscribed)
{
    struct weft_core core;
    std::memset(&core, 0, sizeof(core));
    core.cfg.spin_us = spin_us;
    core.oversubscribed = oversubscribed;
    return core;
}

/* Whether a call that takes the comm's lock (a progress pass) gets through
 * from another thread while the mutex is held. */
bool call_passes_held_lock(struct weft_p2p *p2p)
{
    std::atomic<bool> done{false};
    test_p2p_hold_lock(p2p);
    std::thread t([&] {
        (void)weft_p2p_poll_health(p2p);
        done = true;
    });
    bool passed = eventually([&] { return done.load(); }, 200);
    test_p2p_release_lock(p2p);
    t.join();
    return passed;
}

TEST(Engine, SerializedCommTakesNoLockUntilItsProgressThreadStarts)
{
    Ctx c(0, "serialized");
    EXPECT_TRUE(call_passes_held_lock(c.p2p)) << "WEFT_THREADS=serialized: a call waited for the comm's lock";

    /* A client with no other driver (the stream-ordered calls) starts the
     * progress thread: from then on two threads reach the comm. */
    Probe p;
    ASSERT_EQ(WEFT_SUCCESS, weft_engine_register(c.engine(), &needs_thread, &p));
    EXPECT_FALSE(call_passes_held_lock(c.p2p)) << "the progress thread runs, yet a call took no lock";
    weft_engine_unregister(c.engine(), &needs_thread, &p);
    EXPECT_FALSE(call_passes_held_lock(c.p2p)) << "the lock is taken for good once the thread started";
}

TEST(Engine, CommsTakeTheLockByDefaultAndWithTheProgressThreadSetting)
{
    {
        Ctx c(0);   /* WEFT_THREADS=multiple */
        EXPECT_FALSE(call_passes_held_lock(c.p2p)) << "WEFT_THREADS=multiple: a call took no lock";
    }
    {
        Ctx c(1, "serialized");   /* a thread of weft's moves the pipes from the start */
        ASSERT_EQ(WEFT_SUCCESS, weft_engine_start(c.engine()));
        EXPECT_FALSE(call_passes_held_lock(c.p2p)) << "WEFT_PROGRESS_THREAD=1 with serialized: a call took no lock";
    }
}

TEST(Backoff, SpinThenYieldThenSleep)
{
    struct weft_core core = core_with(50, 0);
    struct weft_backoff b;
    weft_backoff_init(&b, &core);
    EXPECT_EQ(WEFT_BACKOFF_SPIN, weft_backoff_phase(&b, 100.0)) << "the idle clock starts here";
    EXPECT_EQ(WEFT_BACKOFF_SPIN, weft_backoff_phase(&b, 100.0 + 49e-6));
    EXPECT_EQ(WEFT_BACKOFF_YIELD, weft_backoff_phase(&b, 100.0 + 51e-6));
    EXPECT_EQ(WEFT_BACKOFF_YIELD, weft_backoff_phase(&b, 100.0 + 50e-6 + WEFT_BACKOFF_YIELD_S * 0.99));
    EXPECT_EQ(WEFT_BACKOFF_SLEEP, weft_backoff_phase(&b, 100.0 + 50e-6 + WEFT_BACKOFF_YIELD_S * 1.01));
    weft_backoff_busy(&b);
    EXPECT_EQ(WEFT_BACKOFF_SPIN, weft_backoff_phase(&b, 200.0)) << "activity starts the phases over";
}

TEST(Backoff, OversubscribedNodeNeverSpins)
{
    struct weft_core core = core_with(1000000, 1);
    struct weft_backoff b;
    weft_backoff_init(&b, &core);
    EXPECT_EQ(WEFT_BACKOFF_YIELD, weft_backoff_phase(&b, 5.0)) << "WEFT_SPIN_US ignored with more ranks than cores";
    weft_backoff_init(&b, nullptr);
    EXPECT_EQ(WEFT_BACKOFF_YIELD, weft_backoff_phase(&b, 5.0)) << "no core: no spin phase";
}

TEST(Backoff, NapsGrowToTheCap)
{
    struct weft_core core = core_with(0, 0);
    struct weft_backoff b;
    weft_backoff_init(&b, &core);
    (void)weft_backoff_phase(&b, 0.0);
    /* In the sleep phase each idle step naps and counts; the cap bounds it
     * (1 us here, so the test does not wait). */
    for (int i = 0; i < 12; i++)
        weft_backoff_idle(&b, 1.0, 1);
    EXPECT_EQ(12u, b.naps);
    weft_backoff_busy(&b);
    EXPECT_EQ(0u, b.naps);
}

}  // namespace
