/*
 * Counting interposition of the weft calls the drop-in makes.
 *
 * The executable defines weft_allgather, ..., weft_comm_destroy and exports
 * them (ENABLE_EXPORTS): libweft_mpi.so's references to them bind here
 * (the executable comes first in the lookup order). Each counts, then calls
 * the next definition, libweft's, found with dlsym(RTLD_NEXT). The same
 * pattern as mpi_tests/test_no_mpi_calls.cc, one level up.
 */
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "pmpi_test.h"
#include "weft.h"

namespace pmpitest {
namespace {

std::atomic<long> counters[W_NCOUNTED];

const char *const names[W_NCOUNTED] = {
    "weft_allgather", "weft_bcast",  "weft_barrier",     "weft_allreduce",    "weft_reduce",
    "weft_reduce_scatter", "weft_alltoall", "weft_gather", "weft_scatter", "weft_alltoallv", "weft_comm_create_config",
    "weft_comm_destroy",
};

void *real_sym(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (f == nullptr) {
        std::fprintf(stderr, "pmpi_counters: dlsym(RTLD_NEXT, %s) failed: %s\n", name, dlerror());
        std::abort();
    }
    return f;
}

inline void count(Counted which)
{
    counters[which].fetch_add(1, std::memory_order_relaxed);
}

} // namespace

const char *counted_name(int which)
{
    return which >= 0 && which < W_NCOUNTED ? names[which] : "?";
}

namespace {
/* WEFT_THREADS in the configuration of the newest weft_comm_create_config
 * ("" when none was given); comms may be made by several threads. */
std::mutex create_mu;
std::string create_threads;
} // namespace

void note_create_threads(const weft_config_t *cfg)
{
    std::string v;
    for (size_t i = 0; cfg != nullptr && i < cfg->nsettings; i++)
        if (std::string(cfg->settings[i].name) == "WEFT_THREADS")
            v = cfg->settings[i].value;
    std::lock_guard<std::mutex> g(create_mu);
    create_threads = v;
}

std::string last_create_threads()
{
    std::lock_guard<std::mutex> g(create_mu);
    return create_threads;
}

Counts counts_now()
{
    Counts c;
    for (int i = 0; i < W_NCOUNTED; i++)
        c.n[i] = counters[i].load();
    return c;
}

std::string Counts::str() const
{
    std::string s;
    for (int i = 0; i < W_NCOUNTED; i++)
        if (n[i] != 0)
            s += std::string(s.empty() ? "" : ", ") + names[i] + " " + (n[i] > 0 ? "+" : "") + std::to_string(n[i]);
    return s.empty() ? "no weft call" : s;
}

::testing::AssertionResult CountsAre(const Counts &before, std::initializer_list<std::pair<Counted, long>> want)
{
    Counts expect;
    for (const auto &w : want)
        expect.n[w.first] = w.second;
    Counts got = counts_now() - before;
    for (int i = 0; i < W_NCOUNTED; i++)
        if (got.n[i] != expect.n[i])
            return ::testing::AssertionFailure() << "weft calls made: " << got.str() << "; expected: " << expect.str();
    return ::testing::AssertionSuccess();
}

} // namespace pmpitest

using pmpitest::count;

/* The real function, resolved once. */
#define REAL(name) \
    ([]() { static void *const f = pmpitest::real_sym(#name); return reinterpret_cast<decltype(&name)>(f); }())

extern "C" {

int weft_allgather(weft_comm_t *c, const void *s, void *r, size_t b)
{
    count(pmpitest::W_ALLGATHER);
    return REAL(weft_allgather)(c, s, r, b);
}

int weft_bcast(weft_comm_t *c, void *buf, size_t bytes, int root)
{
    count(pmpitest::W_BCAST);
    return REAL(weft_bcast)(c, buf, bytes, root);
}

int weft_barrier(weft_comm_t *c)
{
    count(pmpitest::W_BARRIER);
    return REAL(weft_barrier)(c);
}

int weft_allreduce(weft_comm_t *c, const void *s, void *r, size_t n, weft_dtype_t t, weft_op_t op)
{
    count(pmpitest::W_ALLREDUCE);
    return REAL(weft_allreduce)(c, s, r, n, t, op);
}

int weft_reduce(weft_comm_t *c, const void *s, void *r, size_t n, weft_dtype_t t, weft_op_t op, int root)
{
    count(pmpitest::W_REDUCE);
    return REAL(weft_reduce)(c, s, r, n, t, op, root);
}

int weft_reduce_scatter(weft_comm_t *c, const void *s, void *r, size_t n, weft_dtype_t t, weft_op_t op)
{
    count(pmpitest::W_REDUCE_SCATTER);
    return REAL(weft_reduce_scatter)(c, s, r, n, t, op);
}

int weft_alltoall(weft_comm_t *c, const void *s, void *r, size_t b)
{
    count(pmpitest::W_ALLTOALL);
    return REAL(weft_alltoall)(c, s, r, b);
}

int weft_gather(weft_comm_t *c, const void *s, void *r, size_t b, int root)
{
    count(pmpitest::W_GATHER);
    return REAL(weft_gather)(c, s, r, b, root);
}

int weft_scatter(weft_comm_t *c, const void *s, void *r, size_t b, int root)
{
    count(pmpitest::W_SCATTER);
    return REAL(weft_scatter)(c, s, r, b, root);
}

int weft_alltoallv(weft_comm_t *c, const void *s, const size_t *sb, const size_t *sd, void *r, const size_t *rb,
                   const size_t *rd)
{
    count(pmpitest::W_ALLTOALLV);
    return REAL(weft_alltoallv)(c, s, sb, sd, r, rb, rd);
}

int weft_comm_create_config(MPI_Comm m, const weft_config_t *cfg, weft_comm_t **out)
{
    count(pmpitest::W_COMM_CREATE);
    pmpitest::note_create_threads(cfg);
    return REAL(weft_comm_create_config)(m, cfg, out);
}

int weft_comm_destroy(weft_comm_t *c)
{
    count(pmpitest::W_COMM_DESTROY);
    return REAL(weft_comm_destroy)(c);
}

} // extern "C"
