/*
 * weft makes no MPI call between weft_comm_create returning and
 * weft_comm_destroy being called.
 *
 * weft makes its MPI calls through the profiling names (PMPI_*), so that a
 * PMPI layer -- its own, adapters/mpi/ -- neither sees nor recurses into
 * them. This binary defines the PMPI functions a communication library
 * could use (count, then call the next definition, libmpi's, found with
 * dlsym(RTLD_NEXT)). The executable exports them (ENABLE_EXPORTS), so
 * libweft.so's references bind to them. Calls are counted only while `counting` is set, which
 * leaves out the test's own MPI calls (fixture set-up, result reduction).
 * A first test proves the interposers see calls made from inside libweft.
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <atomic>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

namespace {

std::atomic<bool> counting{false};

#define WEFT_INTERPOSED(X) \
    X(Send) X(Recv) X(Isend) X(Irecv) X(Ssend) X(Rsend) X(Test) X(Testall) X(Testany) X(Wait) X(Waitall) \
    X(Waitany) X(Iprobe) X(Probe) X(Improbe) X(Mprobe) X(Barrier) X(Ibarrier) X(Bcast) X(Allgather) \
    X(Allgatherv) X(Iallgather) X(Gather) X(Allreduce) X(Iallreduce) X(Reduce) X(Alltoall) X(Alltoallv) \
    X(Sendrecv) X(Comm_dup) X(Comm_split) X(Comm_split_type) X(Comm_free) X(Comm_rank) X(Comm_size) \
    X(Get_count) X(Wtime)

enum CallId {
#define X(name) CALL_##name,
    WEFT_INTERPOSED(X)
#undef X
    CALL_COUNT
};

const char *const call_names[CALL_COUNT] = {
#define X(name) "PMPI_" #name,
    WEFT_INTERPOSED(X)
#undef X
};

std::atomic<long> call_counts[CALL_COUNT];

inline void count_call(CallId id)
{
    if (counting.load(std::memory_order_relaxed))
        call_counts[id].fetch_add(1, std::memory_order_relaxed);
}

long total_calls()
{
    long n = 0;
    for (auto &c : call_counts)
        n += c.load();
    return n;
}

std::string calls_seen()
{
    std::string s;
    for (int i = 0; i < CALL_COUNT; i++)
        if (long n = call_counts[i].load())
            s += std::string(s.empty() ? "" : ", ") + call_names[i] + " x" + std::to_string(n);
    return s.empty() ? "none" : s;
}

void reset_counts()
{
    for (auto &c : call_counts)
        c.store(0);
}

/* libmpi's definition of an interposed PMPI function. */
void *real_sym(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (f == nullptr) {
        std::fprintf(stderr, "test_no_mpi_calls: dlsym(RTLD_NEXT, %s) failed: %s\n", name, dlerror());
        std::abort();
    }
    return f;
}

} // namespace

/* Resolved once per function (dlsym is not cheap; MPI calls are). */
#define REAL(name) \
    ([]() { static void *const f = real_sym("PMPI_" #name); return reinterpret_cast<decltype(&PMPI_##name)>(f); }())

extern "C" {

int PMPI_Send(const void *b, int n, MPI_Datatype t, int d, int tag, MPI_Comm c)
{ count_call(CALL_Send); return REAL(Send)(b, n, t, d, tag, c); }
int PMPI_Recv(void *b, int n, MPI_Datatype t, int s, int tag, MPI_Comm c, MPI_Status *st)
{ count_call(CALL_Recv); return REAL(Recv)(b, n, t, s, tag, c, st); }
int PMPI_Isend(const void *b, int n, MPI_Datatype t, int d, int tag, MPI_Comm c, MPI_Request *r)
{ count_call(CALL_Isend); return REAL(Isend)(b, n, t, d, tag, c, r); }
int PMPI_Irecv(void *b, int n, MPI_Datatype t, int s, int tag, MPI_Comm c, MPI_Request *r)
{ count_call(CALL_Irecv); return REAL(Irecv)(b, n, t, s, tag, c, r); }
int PMPI_Ssend(const void *b, int n, MPI_Datatype t, int d, int tag, MPI_Comm c)
{ count_call(CALL_Ssend); return REAL(Ssend)(b, n, t, d, tag, c); }
int PMPI_Rsend(const void *b, int n, MPI_Datatype t, int d, int tag, MPI_Comm c)
{ count_call(CALL_Rsend); return REAL(Rsend)(b, n, t, d, tag, c); }
int PMPI_Test(MPI_Request *r, int *flag, MPI_Status *st)
{ count_call(CALL_Test); return REAL(Test)(r, flag, st); }
int PMPI_Testall(int n, MPI_Request r[], int *flag, MPI_Status st[])
{ count_call(CALL_Testall); return REAL(Testall)(n, r, flag, st); }
int PMPI_Testany(int n, MPI_Request r[], int *idx, int *flag, MPI_Status *st)
{ count_call(CALL_Testany); return REAL(Testany)(n, r, idx, flag, st); }
int PMPI_Wait(MPI_Request *r, MPI_Status *st)
{ count_call(CALL_Wait); return REAL(Wait)(r, st); }
int PMPI_Waitall(int n, MPI_Request r[], MPI_Status st[])
{ count_call(CALL_Waitall); return REAL(Waitall)(n, r, st); }
int PMPI_Waitany(int n, MPI_Request r[], int *idx, MPI_Status *st)
{ count_call(CALL_Waitany); return REAL(Waitany)(n, r, idx, st); }
int PMPI_Iprobe(int s, int tag, MPI_Comm c, int *flag, MPI_Status *st)
{ count_call(CALL_Iprobe); return REAL(Iprobe)(s, tag, c, flag, st); }
int PMPI_Probe(int s, int tag, MPI_Comm c, MPI_Status *st)
{ count_call(CALL_Probe); return REAL(Probe)(s, tag, c, st); }
int PMPI_Improbe(int s, int tag, MPI_Comm c, int *flag, MPI_Message *m, MPI_Status *st)
{ count_call(CALL_Improbe); return REAL(Improbe)(s, tag, c, flag, m, st); }
int PMPI_Mprobe(int s, int tag, MPI_Comm c, MPI_Message *m, MPI_Status *st)
{ count_call(CALL_Mprobe); return REAL(Mprobe)(s, tag, c, m, st); }
int PMPI_Barrier(MPI_Comm c)
{ count_call(CALL_Barrier); return REAL(Barrier)(c); }
int PMPI_Ibarrier(MPI_Comm c, MPI_Request *r)
{ count_call(CALL_Ibarrier); return REAL(Ibarrier)(c, r); }
int PMPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c)
{ count_call(CALL_Bcast); return REAL(Bcast)(b, n, t, root, c); }
int PMPI_Allgather(const void *sb, int sn, MPI_Datatype st, void *rb, int rn, MPI_Datatype rt, MPI_Comm c)
{ count_call(CALL_Allgather); return REAL(Allgather)(sb, sn, st, rb, rn, rt, c); }
int PMPI_Allgatherv(const void *sb, int sn, MPI_Datatype st, void *rb, const int rn[], const int d[],
                   MPI_Datatype rt, MPI_Comm c)
{ count_call(CALL_Allgatherv); return REAL(Allgatherv)(sb, sn, st, rb, rn, d, rt, c); }
int PMPI_Iallgather(const void *sb, int sn, MPI_Datatype st, void *rb, int rn, MPI_Datatype rt, MPI_Comm c,
                   MPI_Request *r)
{ count_call(CALL_Iallgather); return REAL(Iallgather)(sb, sn, st, rb, rn, rt, c, r); }
int PMPI_Gather(const void *sb, int sn, MPI_Datatype st, void *rb, int rn, MPI_Datatype rt, int root, MPI_Comm c)
{ count_call(CALL_Gather); return REAL(Gather)(sb, sn, st, rb, rn, rt, root, c); }
int PMPI_Allreduce(const void *sb, void *rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{ count_call(CALL_Allreduce); return REAL(Allreduce)(sb, rb, n, t, op, c); }
int PMPI_Iallreduce(const void *sb, void *rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *r)
{ count_call(CALL_Iallreduce); return REAL(Iallreduce)(sb, rb, n, t, op, c, r); }
int PMPI_Reduce(const void *sb, void *rb, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c)
{ count_call(CALL_Reduce); return REAL(Reduce)(sb, rb, n, t, op, root, c); }
int PMPI_Alltoall(const void *sb, int sn, MPI_Datatype st, void *rb, int rn, MPI_Datatype rt, MPI_Comm c)
{ count_call(CALL_Alltoall); return REAL(Alltoall)(sb, sn, st, rb, rn, rt, c); }
int PMPI_Alltoallv(const void *sb, const int sn[], const int sd[], MPI_Datatype st, void *rb, const int rn[],
                  const int rd[], MPI_Datatype rt, MPI_Comm c)
{ count_call(CALL_Alltoallv); return REAL(Alltoallv)(sb, sn, sd, st, rb, rn, rd, rt, c); }
int PMPI_Sendrecv(const void *sb, int sn, MPI_Datatype st, int d, int stag, void *rb, int rn, MPI_Datatype rt,
                 int s, int rtag, MPI_Comm c, MPI_Status *status)
{ count_call(CALL_Sendrecv); return REAL(Sendrecv)(sb, sn, st, d, stag, rb, rn, rt, s, rtag, c, status); }
int PMPI_Comm_dup(MPI_Comm c, MPI_Comm *n)
{ count_call(CALL_Comm_dup); return REAL(Comm_dup)(c, n); }
int PMPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm *n)
{ count_call(CALL_Comm_split); return REAL(Comm_split)(c, color, key, n); }
int PMPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info info, MPI_Comm *n)
{ count_call(CALL_Comm_split_type); return REAL(Comm_split_type)(c, type, key, info, n); }
int PMPI_Comm_free(MPI_Comm *c)
{ count_call(CALL_Comm_free); return REAL(Comm_free)(c); }
int PMPI_Comm_rank(MPI_Comm c, int *r)
{ count_call(CALL_Comm_rank); return REAL(Comm_rank)(c, r); }
int PMPI_Comm_size(MPI_Comm c, int *s)
{ count_call(CALL_Comm_size); return REAL(Comm_size)(c, s); }
int PMPI_Get_count(const MPI_Status *st, MPI_Datatype t, int *n)
{ count_call(CALL_Get_count); return REAL(Get_count)(st, t, n); }
double PMPI_Wtime(void)
{ count_call(CALL_Wtime); return REAL(Wtime)(); }

} // extern "C"

namespace {

using namespace weft_mpitest;

class NoMpiCalls : public WeftMpiTest {
protected:
    void TearDown() override
    {
        counting = false;
        WeftMpiTest::TearDown();
    }
};

/* The interposers see MPI calls made inside libweft (else the real test
 * below would pass vacuously). */
TEST_F(NoMpiCalls, InterposersSeeCallsFromInsideWeft)
{
    reset_counts();
    counting = true;
    weft_comm_t *c = nullptr;
    int rc = weft_comm_create(MPI_COMM_WORLD, &c);
    counting = false;
    ASSERT_EQ(rc, WEFT_SUCCESS);
    EXPECT_GT(call_counts[CALL_Comm_dup].load(), 0) << "weft_comm_create's PMPI_Comm_dup was not seen; calls seen: "
                                                    << calls_seen();
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

void ring(weft_comm_t *c, int rank, int size, size_t bytes, int tag)
{
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    std::vector<unsigned char> out(bytes), in(bytes);
    fill_pattern(out.data(), bytes, pattern_seed(rank, tag, bytes));
    weft_request_t *reqs[2];
    ASSERT_EQ(weft_irecv(c, in.data(), bytes, left, tag, &reqs[0]), WEFT_SUCCESS) << weft_comm_last_error(c);
    ASSERT_EQ(weft_isend(c, out.data(), bytes, right, tag, &reqs[1]), WEFT_SUCCESS) << weft_comm_last_error(c);
    /* Half through weft_test polling, half through weft_waitall. */
    if (tag % 2) {
        int done = 0;
        while (!done)
            ASSERT_EQ(weft_test(reqs[0], &done, nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
        ASSERT_EQ(weft_wait(reqs[1], nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
    } else {
        ASSERT_EQ(weft_waitall(2, reqs, nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
    }
    EXPECT_TRUE(HasPattern(in.data(), bytes, left, tag, bytes));
}

TEST_F(NoMpiCalls, NoneBetweenCreateAndDestroy)
{
    reset_counts();
    counting = true;
    int tag = 0;
    /* Eager, rendezvous, chunked rendezvous, and the CMA-sized path. */
    for (size_t bytes : {(size_t)0, (size_t)31, (size_t)4097, (size_t)(64u << 10) + 1, (size_t)(1u << 20) + 3,
                         (size_t)(16u << 20) + 1}) {
        ring(comm, rank, size, bytes, tag++);
        if (HasFatalFailure())
            break;
    }
    /* Self and the blocking calls. */
    char a = 'a', b = 0;
    EXPECT_EQ(weft_send(comm, &a, 1, rank, 99), WEFT_SUCCESS);
    EXPECT_EQ(weft_recv(comm, &b, 1, rank, 99, nullptr), WEFT_SUCCESS);

    /* Collectives, where built (an UNSUPPORTED stub answers the same on every rank). */
    int barrier_rc = weft_barrier(comm);
    EXPECT_TRUE(barrier_rc == WEFT_SUCCESS || barrier_rc == WEFT_ERR_UNSUPPORTED) << last_error();
    std::vector<int> all(size, -1);
    int mine = 1000 + rank;
    int allgather_rc = weft_allgather(comm, &mine, all.data(), sizeof(int));
    EXPECT_TRUE(allgather_rc == WEFT_SUCCESS || allgather_rc == WEFT_ERR_UNSUPPORTED) << last_error();
    if (allgather_rc == WEFT_SUCCESS) {
        for (int r = 0; r < size; r++)
            EXPECT_EQ(all[r], 1000 + r);
    }
    /* A background thread of weft (if any) would call MPI now. */
    usleep(200 * 1000);
    counting = false;

    if (rank == 0)
        std::printf("collectives covered: barrier %s, allgather %s\n",
                    barrier_rc == WEFT_SUCCESS ? "yes" : "not built",
                    allgather_rc == WEFT_SUCCESS ? "yes" : "not built");
    EXPECT_EQ(total_calls(), 0) << "MPI calls made by weft between create and destroy: " << calls_seen();
}

} // namespace
