/*
 * Shared pieces of the PMPI drop-in's tests (test_pmpi*.cc).
 *
 * The test binary links libweft_mpi.so before libmpi.so, so the MPI_*
 * collectives it calls are the drop-in's; every reference result is
 * computed with PMPI_* (MPI's own collective) on the same inputs.
 *
 *  - Counters: the binary defines the weft_* functions the drop-in calls
 *    (weft_allgather, ..., weft_comm_create, weft_comm_destroy; see
 *    pmpi_counters.cc). They count, then forward to libweft's definition.
 *    The executable exports them (ENABLE_EXPORTS), so libweft_mpi.so's
 *    references bind to them: the counts say exactly which calls weft
 *    served. (libweft.so calls its own functions directly, not through its
 *    PLT, so only the drop-in's calls are counted.)
 *  - PmpiTest: a fixture whose bookkeeping uses only PMPI_*: the drop-in
 *    would serve an MPI_Allreduce of a failure flag, so a broken drop-in
 *    could hide its own failure. A failure on any rank fails the test on
 *    rank 0 (the only rank that prints GoogleTest's report, mpi_main.cc).
 *
 * Rule: every skip decision is the same on all ranks (world size,
 * environment), or the ranks disagree about which collective comes next.
 */
#ifndef WEFT_PMPI_TEST_H
#define WEFT_PMPI_TEST_H

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "weft.h"

namespace pmpitest {

/* The weft calls the drop-in makes, counted in pmpi_counters.cc. */
enum Counted {
    W_ALLGATHER = 0,
    W_BCAST,
    W_BARRIER,
    W_ALLREDUCE,
    W_REDUCE,
    W_REDUCE_SCATTER,
    W_ALLTOALL,
    W_GATHER,
    W_SCATTER,
    W_ALLTOALLV,
    W_COMM_CREATE,
    W_COMM_DESTROY,
    W_NCOUNTED
};

const char *counted_name(int which);

/* A snapshot of every counter (this process, all threads). */
struct Counts {
    long n[W_NCOUNTED] = {};
    long operator[](int i) const { return n[i]; }
    Counts operator-(const Counts &o) const
    {
        Counts d;
        for (int i = 0; i < W_NCOUNTED; i++)
            d.n[i] = n[i] - o.n[i];
        return d;
    }
    std::string str() const;
};

Counts counts_now();

/* WEFT_THREADS as the drop-in passed it to its newest weft comm ("": not
 * given, the environment decides). */
void note_create_threads(const weft_config_t *cfg);
std::string last_create_threads();

/* "Since `before`, exactly these weft calls were made" (all others +0). */
::testing::AssertionResult CountsAre(const Counts &before, std::initializer_list<std::pair<Counted, long>> want);

inline int comm_rank(MPI_Comm c)
{
    int r = -1;
    PMPI_Comm_rank(c, &r);
    return r;
}

inline int comm_size(MPI_Comm c)
{
    int s = -1;
    PMPI_Comm_size(c, &s);
    return s;
}

inline const char *env_or(const char *name, const char *dflt)
{
    const char *v = std::getenv(name);
    return v ? v : dflt;
}

/* Byte-exact equality; names the first differing offset. */
inline ::testing::AssertionResult SameBytes(const void *got, const void *want, size_t n)
{
    const unsigned char *g = static_cast<const unsigned char *>(got), *w = static_cast<const unsigned char *>(want);
    for (size_t i = 0; i < n; i++)
        if (g[i] != w[i]) {
            char s[160];
            std::snprintf(s, sizeof(s), "first difference at byte %zu of %zu: 0x%02x (drop-in) vs 0x%02x (reference)",
                          i, n, g[i], w[i]);
            return ::testing::AssertionFailure() << s;
        }
    return ::testing::AssertionSuccess();
}

/* Deterministic bytes: seed decides them all. */
inline void fill_bytes(void *buf, size_t n, uint64_t seed)
{
    unsigned char *p = static_cast<unsigned char *>(buf);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 29;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 32;
        p[i] = (unsigned char)x;
    }
}

/* The fixture: PMPI-only bookkeeping. */
class PmpiTest : public ::testing::Test {
protected:
    int rank = -1;
    int size = -1;

    void SetUp() override
    {
        rank = comm_rank(MPI_COMM_WORLD);
        size = comm_size(MPI_COMM_WORLD);
    }

    void TearDown() override
    {
        int mine = HasFailure() ? 1 : 0, any = 0;
        /* PMPI: the drop-in must not judge itself. */
        PMPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (any && !mine)
            ADD_FAILURE() << "the test failed on another rank (see its output)";
    }

    /* True when any rank passes true (PMPI, over comm). */
    static bool any_rank(bool mine, MPI_Comm comm = MPI_COMM_WORLD)
    {
        int in = mine ? 1 : 0, out = 0;
        PMPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm);
        return out != 0;
    }
};

} // namespace pmpitest

#endif
