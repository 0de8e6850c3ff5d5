/*
 * The reduction algorithms, each forced on a comm of its own
 * (WEFT_ALLREDUCE_ALGO, WEFT_REDUCE_SCATTER_ALGO, WEFT_REDUCE_ALGO, read at
 * weft_comm_create) plus the selector ("auto"), with 4 KiB reduction chunks
 * (WEFT_REDUCE_CHUNK_KB=4) so that small vectors already cross chunk, group
 * and window boundaries:
 *
 *   int32 sum, float32 sum, float16 avg: counts 0, 1, 7, 1000, a chunk
 *   -1/0/+1, n chunks -1/+1 (ring blocks of a chunk +-1), 5n chunks + 3
 *   (several groups of the ring, several windows of rd / halving);
 *   int32 avg/max, float32 avg/max, float16 sum/max: 1, 7, n chunks + 1
 *   (none of these under WEFT_TEST_SIZES=reduced); each in place and out of
 *   place; reduce with the root moving round; reduce_scatter also over
 *   more than 1 MiB (halving in pieces).
 *
 * Checked: the result against a reference computed here from every rank's
 * input (exact for integers and max, within a rounding bound for float
 * sums; the order of a float reduction is the algorithm's); allreduce:
 * bit-identical results on every rank (a hash of each result compared
 * across ranks, so one rank per call, in turn, checks the reference), the
 * same bits when a call is repeated; guard elements around recvbuf
 * untouched; sendbuf never written (in place reduce_scatter: only the
 * rank's own block). Other dtype x op combinations are the business of the
 * reduction matrix test; this one is about the algorithms' schedules.
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

constexpr size_t kChunkBytes = 4096;   /* WEFT_REDUCE_CHUNK_KB=4 */
constexpr size_t kGuard = 16;          /* guard elements on each side of recvbuf */
/* Wrong results are reported up to this many per test; the test goes on
 * (returning early on one rank would leave the others waiting in the next
 * collective). */
constexpr int kMaxReports = 3;

/* ---- float16 (IEEE binary16) conversions, round to nearest even ---- */

uint16_t f2h(float f)
{
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        mant |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

float h2f(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = std::ldexp((float)m, -24);
        return s ? -v : v;
    }
    uint32_t x = e == 31 ? (s | 0x7f800000u | (m << 13)) : (s | ((e - 15 + 127) << 23) | (m << 13));
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

/* ---- inputs ---- */

size_t esize(weft_dtype_t t)
{
    return t == WEFT_FLOAT16 ? 2 : 4;
}

const char *dname(weft_dtype_t t)
{
    return t == WEFT_INT32 ? "int32" : t == WEFT_FLOAT32 ? "float32" : "float16";
}

const char *oname(weft_op_t o)
{
    return o == WEFT_SUM ? "sum" : o == WEFT_AVG ? "avg" : "max";
}

/* Elements [lo, hi) of rank r's input of call `call`: full-range integers
 * (sums wrap); floats with full mantissas in [-2, 2), so the order of a
 * float reduction shows in its last bits. */
void gen_range(weft_dtype_t t, int rank, uint64_t call, size_t lo, size_t hi, std::vector<unsigned char> &out)
{
    uint64_t seed = mix64(((uint64_t)(uint32_t)rank << 48) ^ (call << 8) ^ 0x1234567ull);
    out.resize((hi - lo) * esize(t));
    unsigned char *p = out.data();
    for (size_t i = lo; i < hi; i++) {
        uint64_t h = mix64(seed + (uint64_t)i * 0x9e3779b97f4a7c15ull);
        if (t == WEFT_INT32) {
            uint32_t v = (uint32_t)h;
            std::memcpy(p, &v, 4);
            p += 4;
        } else {
            float f = (float)((double)(h >> 11) * (4.0 / 9007199254740992.0) - 2.0);
            if (t == WEFT_FLOAT32) {
                std::memcpy(p, &f, 4);
                p += 4;
            } else {
                uint16_t v = f2h(f);
                std::memcpy(p, &v, 2);
                p += 2;
            }
        }
    }
}

void gen(weft_dtype_t t, int rank, uint64_t call, size_t count, std::vector<unsigned char> &out)
{
    gen_range(t, rank, call, 0, count, out);
}

double elem_value(weft_dtype_t t, const unsigned char *p)
{
    if (t == WEFT_FLOAT32) {
        float f;
        std::memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h2f(h);
}

/* The reference of elements [lo, hi) of the reduction over all n ranks
 * of call `call`, checked against got (hi - lo elements). "" when it
 * matches, else the first mismatch. */
std::string check_result(weft_dtype_t t, weft_op_t op, int n, uint64_t call, size_t count, size_t lo, size_t hi,
                         const unsigned char *got)
{
    (void)count;
    std::vector<std::vector<unsigned char>> in(n);
    for (int r = 0; r < n; r++)
        gen_range(t, r, call, lo, hi, in[r]);
    size_t es = esize(t);
    for (size_t i = lo; i < hi; i++) {
        const unsigned char *g = got + (i - lo) * es;
        size_t j = i - lo;
        std::ostringstream why;
        if (t == WEFT_INT32) {
            uint32_t sum = 0;
            int32_t mx = INT32_MIN, v;
            for (int r = 0; r < n; r++) {
                std::memcpy(&v, &in[r][j * 4], 4);
                sum += (uint32_t)v;
                mx = v > mx ? v : mx;
            }
            int32_t want = op == WEFT_MAX ? mx : op == WEFT_SUM ? (int32_t)sum : (int32_t)sum / n, have;
            std::memcpy(&have, g, 4);
            if (have != want)
                why << "element " << i << ": " << have << ", expected " << want;
        } else {
            double sum = 0, sabs = 0, mx = -INFINITY;
            for (int r = 0; r < n; r++) {
                double v = elem_value(t, &in[r][j * es]);
                sum += v;
                sabs += std::fabs(v);
                mx = v > mx ? v : mx;
            }
            double have = elem_value(t, g);
            if (op == WEFT_MAX) {
                if (have != mx)
                    why << "element " << i << ": " << have << ", expected max " << mx;
            } else {
                /* Rounding after each of n-1 additions (float16: every step
                 * rounded back to half), then once more for avg. */
                double eps = t == WEFT_FLOAT32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -10);
                double want = op == WEFT_SUM ? sum : sum / n;
                double tol = (n + 1) * eps * sabs / (op == WEFT_SUM ? 1 : n) + eps * std::fabs(want) + 1e-30;
                if (!(std::fabs(have - want) <= tol))
                    why << "element " << i << ": " << have << ", expected " << want << " +- " << tol;
            }
        }
        if (!why.str().empty())
            return why.str();
    }
    return "";
}

uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = mix64(h ^ p[i]);
    return h;
}

/* A buffer of `count` elements between guard elements. */
struct Guarded {
    std::vector<unsigned char> raw;
    size_t es, count;
    Guarded(size_t es_, size_t count_) : raw((count_ + 2 * kGuard) * es_, 0xA5), es(es_), count(count_) {}
    unsigned char *data() { return raw.data() + kGuard * es; }
    bool guards_intact() const
    {
        for (size_t i = 0; i < kGuard * es; i++)
            if (raw[i] != 0xA5 || raw[raw.size() - 1 - i] != 0xA5)
                return false;
        return true;
    }
};

/* A comm with WEFT_<kind>_ALGO forced ("auto": the selector) and 4 KiB
 * reduction chunks, both in its configuration. */
class AlgoComm {
public:
    AlgoComm(const char *var, const std::string &algo, const Settings &more = {})
    {
        Settings s = {{"WEFT_REDUCE_CHUNK_KB", "4"}, {var, algo}};
        s.insert(s.end(), more.begin(), more.end());
        rc_ = create_with(MPI_COMM_WORLD, s, &c_);
        if (rc_ != WEFT_SUCCESS)
            c_ = nullptr;
    }
    ~AlgoComm()
    {
        if (c_ && !::testing::Test::HasFailure()) {
            EXPECT_EQ(weft_comm_destroy(c_), WEFT_SUCCESS);
        }
    }
    AlgoComm(const AlgoComm &) = delete;
    AlgoComm &operator=(const AlgoComm &) = delete;
    weft_comm_t *get() const { return c_; }
    int rc() const { return rc_; }

private:
    weft_comm_t *c_ = nullptr;
    int rc_ = WEFT_ERR_INTERNAL;
};

/* No comm of the fixture's own: each test makes one per algorithm. The
 * fixture still agrees across ranks on failures. */
class ReduceAlgos : public WeftMpiTest, public ::testing::WithParamInterface<std::string> {
protected:
    MPI_Comm base_comm() override { return MPI_COMM_NULL; }
};
class AllreduceAlgo : public ReduceAlgos {};
class ReduceScatterAlgo : public ReduceAlgos {};
class ReduceAlgo : public ReduceAlgos {};

const weft_dtype_t kTypes[] = {WEFT_INT32, WEFT_FLOAT32, WEFT_FLOAT16};
const weft_op_t kOps[] = {WEFT_SUM, WEFT_AVG, WEFT_MAX};

/* Every count for int32 sum, float32 sum and float16 avg; a few that
 * still cross a chunk for the other combinations (runtime: the suite runs
 * every algorithm at six rank counts on two cores). */
bool full_counts(weft_dtype_t t, weft_op_t op)
{
    return (t == WEFT_INT32 && op == WEFT_SUM) || (t == WEFT_FLOAT32 && op == WEFT_SUM) ||
           (t == WEFT_FLOAT16 && op == WEFT_AVG);
}

/* WEFT_TEST_SIZES=reduced (crowded entries: np 8, every message by
 * rendezvous, tcp, virtual nodes): only the combinations with every count. */
bool reduced_sizes()
{
    return std::string(env_or("WEFT_TEST_SIZES", "")) == "reduced";
}

/* Element counts for a vector split among n ranks (allreduce, reduce). */
std::vector<size_t> vector_counts(int n, weft_dtype_t t, weft_op_t op)
{
    size_t ce = kChunkBytes / esize(t), nn = (size_t)n;
    if (!full_counts(t, op))
        return reduced_sizes() ? std::vector<size_t>{} : std::vector<size_t>{1, 7, nn * ce + 1};
    return {0, 1, 7, 1000, ce - 1, ce, ce + 1, nn * ce - 1, nn * ce + 1, 5 * nn * ce + 3};
}

/* recvcounts of reduce_scatter (block = recvcount). */
std::vector<size_t> block_counts(weft_dtype_t t, weft_op_t op)
{
    size_t ce = kChunkBytes / esize(t);
    if (!full_counts(t, op))
        return reduced_sizes() ? std::vector<size_t>{} : std::vector<size_t>{1, 7, ce + 1};
    return {0, 1, 7, 1000, ce - 1, ce, ce + 1, 5 * ce + 3};
}

std::string describe(const std::string &algo, weft_dtype_t t, weft_op_t op, size_t count, bool inplace)
{
    std::ostringstream s;
    s << algo << " " << dname(t) << " " << oname(op) << " count " << count << (inplace ? " in place" : " out of place");
    return s.str();
}

/* Every rank's hashes equal rank 0's (collective). */
void expect_same_on_every_rank(const std::vector<uint64_t> &h, const std::vector<std::string> &what)
{
    int n = world_size(), me = world_rank();
    std::vector<uint64_t> all(h.size() * (size_t)n);
    MPI_Allgather(h.data(), (int)h.size(), MPI_UINT64_T, all.data(), (int)h.size(), MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 1; r < n && me == 0; r++)
        for (size_t k = 0; k < h.size(); k++)
            if (all[(size_t)r * h.size() + k] != all[k]) {
                ADD_FAILURE() << what[k] << ": rank " << r << "'s result differs in its bits from rank 0's";
                return;
            }
}

TEST_P(AllreduceAlgo, MatchesReference)
{
    const std::string algo = GetParam();
    AlgoComm comm("WEFT_ALLREDUCE_ALGO", algo);
    ASSERT_EQ(comm.rc(), WEFT_SUCCESS);
    int n = size, me = rank;
    uint64_t call = 0;
    int nbad = 0;
    std::vector<uint64_t> hashes;
    std::vector<std::string> whats;
    for (weft_dtype_t t : kTypes)
        for (weft_op_t op : kOps)
            for (size_t count : vector_counts(n, t, op))
                for (int inplace = 0; inplace < 2; inplace++) {
                    call++;
                    std::string what = describe(algo, t, op, count, inplace);
                    size_t es = esize(t);
                    std::vector<unsigned char> in, keep;
                    gen(t, me, call, count, in);
                    keep = in;
                    Guarded out(es, count);
                    int rc;
                    if (inplace) {
                        if (count)
                            std::memcpy(out.data(), in.data(), count * es);
                        rc = weft_allreduce(comm.get(), out.data(), out.data(), count, t, op);
                    } else {
                        rc = weft_allreduce(comm.get(), in.data(), out.data(), count, t, op);
                    }
                    ASSERT_EQ(rc, WEFT_SUCCESS) << what << ": " << weft_comm_last_error(comm.get());
                    EXPECT_TRUE(out.guards_intact()) << what << ": wrote outside recvbuf";
                    EXPECT_TRUE(in == keep) << what << ": sendbuf was written";
                    /* One rank (in turn) against the reference; the others
                     * must have the same bits (expect_same_on_every_rank). */
                    if (call % (uint64_t)n == (uint64_t)me) {
                        std::string bad = check_result(t, op, n, call, count, 0, count, out.data());
                        if (!bad.empty() && ++nbad <= kMaxReports)
                            ADD_FAILURE() << what << ": " << bad;
                    }
                    hashes.push_back(hash_bytes(out.data(), count * es));
                    whats.push_back(what);
                }
    expect_same_on_every_rank(hashes, whats);

    /* The same call twice: the same bits. */
    size_t count = 5 * (size_t)n * (kChunkBytes / 4) + 3;
    std::vector<unsigned char> in;
    gen(WEFT_FLOAT32, me, 999, count, in);
    std::vector<unsigned char> a(count * 4), b(count * 4);
    ASSERT_EQ(weft_allreduce(comm.get(), in.data(), a.data(), count, WEFT_FLOAT32, WEFT_SUM), WEFT_SUCCESS);
    ASSERT_EQ(weft_allreduce(comm.get(), in.data(), b.data(), count, WEFT_FLOAT32, WEFT_SUM), WEFT_SUCCESS);
    EXPECT_TRUE(a == b) << algo << ": a repeated float32 sum gave other bits";
}

TEST_P(ReduceScatterAlgo, MatchesReference)
{
    const std::string algo = GetParam();
    AlgoComm comm("WEFT_REDUCE_SCATTER_ALGO", algo);
    ASSERT_EQ(comm.rc(), WEFT_SUCCESS);
    int n = size, me = rank;
    uint64_t call = 0;
    int nbad = 0;
    for (weft_dtype_t t : kTypes)
        for (weft_op_t op : kOps)
            for (size_t rc_ : block_counts(t, op))
                for (int inplace = 0; inplace < 2; inplace++) {
                    call++;
                    std::string what = describe(algo, t, op, rc_, inplace);
                    size_t es = esize(t), total = rc_ * (size_t)n;
                    std::vector<unsigned char> in, keep;
                    gen(t, me, call, total, in);
                    keep = in;
                    Guarded out(es, rc_);
                    const unsigned char *got;
                    int rc;
                    if (inplace) {
                        unsigned char *mine = in.data() + (size_t)me * rc_ * es;
                        rc = weft_reduce_scatter(comm.get(), in.data(), total ? mine : nullptr, rc_, t, op);
                        got = mine;
                    } else {
                        rc = weft_reduce_scatter(comm.get(), in.data(), out.data(), rc_, t, op);
                        got = out.data();
                    }
                    ASSERT_EQ(rc, WEFT_SUCCESS) << what << ": " << weft_comm_last_error(comm.get());
                    EXPECT_TRUE(out.guards_intact()) << what << ": wrote outside recvbuf";
                    /* sendbuf untouched but for, in place, this rank's block. */
                    for (size_t i = 0; i < total * es; i++) {
                        bool own = inplace && i / es >= (size_t)me * rc_ && i / es < (size_t)(me + 1) * rc_;
                        if (!own && in[i] != keep[i]) {
                            ADD_FAILURE() << what << ": sendbuf byte " << i << " was written";
                            break;
                        }
                    }
                    std::string bad =
                        check_result(t, op, n, call, total, (size_t)me * rc_, (size_t)(me + 1) * rc_, got);
                    if (!bad.empty() && ++nbad <= kMaxReports)
                        ADD_FAILURE() << what << ": " << bad;
                }

    /* Halving in pieces (> 1 MiB in all) and the ring over many groups. */
    size_t rc_ = (size_t)(1u << 20) / 4 / (size_t)n * 2 + 5;
    std::vector<unsigned char> in, a(rc_ * 4), b(rc_ * 4);
    gen(WEFT_INT32, me, 777, rc_ * (size_t)n, in);
    ASSERT_EQ(weft_reduce_scatter(comm.get(), in.data(), a.data(), rc_, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS);
    EXPECT_EQ(check_result(WEFT_INT32, WEFT_SUM, n, 777, rc_ * (size_t)n, (size_t)me * rc_, (size_t)(me + 1) * rc_,
                           a.data()),
              "")
        << algo << " int32 sum, " << rc_ << " per rank";
    gen(WEFT_FLOAT32, me, 778, rc_ * (size_t)n, in);
    ASSERT_EQ(weft_reduce_scatter(comm.get(), in.data(), a.data(), rc_, WEFT_FLOAT32, WEFT_SUM), WEFT_SUCCESS);
    ASSERT_EQ(weft_reduce_scatter(comm.get(), in.data(), b.data(), rc_, WEFT_FLOAT32, WEFT_SUM), WEFT_SUCCESS);
    EXPECT_TRUE(a == b) << algo << ": a repeated float32 sum gave other bits";
}

TEST_P(ReduceAlgo, MatchesReference)
{
    const std::string algo = GetParam();
    AlgoComm comm("WEFT_REDUCE_ALGO", algo);
    ASSERT_EQ(comm.rc(), WEFT_SUCCESS);
    int n = size, me = rank;
    uint64_t call = 0;
    int nbad = 0;
    for (weft_dtype_t t : kTypes)
        for (weft_op_t op : kOps)
            for (size_t count : vector_counts(n, t, op))
                for (int inplace = 0; inplace < 2; inplace++) {
                    call++;
                    int root = (int)(call % (uint64_t)n);
                    std::string what = describe(algo, t, op, count, inplace) + " root " + std::to_string(root);
                    size_t es = esize(t);
                    std::vector<unsigned char> in, keep;
                    gen(t, me, call, count, in);
                    keep = in;
                    Guarded out(es, count);
                    int rc;
                    const unsigned char *got = out.data();
                    if (me != root) {
                        /* recvbuf is not used off the root: NULL is fine. */
                        rc = weft_reduce(comm.get(), in.data(), nullptr, count, t, op, root);
                    } else if (inplace) {
                        rc = weft_reduce(comm.get(), in.data(), in.data(), count, t, op, root);
                        got = in.data();
                    } else {
                        rc = weft_reduce(comm.get(), in.data(), out.data(), count, t, op, root);
                    }
                    ASSERT_EQ(rc, WEFT_SUCCESS) << what << ": " << weft_comm_last_error(comm.get());
                    EXPECT_TRUE(out.guards_intact()) << what << ": wrote outside recvbuf";
                    if (!(me == root && inplace)) {
                        EXPECT_TRUE(in == keep) << what << ": sendbuf was written";
                    }
                    if (me == root) {
                        std::string bad = check_result(t, op, n, call, count, 0, count, got);
                        if (!bad.empty() && ++nbad <= kMaxReports)
                            ADD_FAILURE() << what << ": " << bad;
                    }
                }
}

/* The reduce selector (collectives/reduce.c): the binomial tree up to
 * 512 KiB, and at every size on two ranks; the ring above 512 KiB from
 * three ranks. And where the node-local segment stops (node_coll.c, one
 * node over shm): at 32 KiB on two ranks, at WEFT_NODE_COLL_KB (64 KiB)
 * from three with WEFT_NODE_COLL_LARGE_KB=0 (by default reductions from
 * three ranks stay in the segment up to 1 MiB: NodeColl's
 * LargeCallsFromThreeRanks). Read from each rank's WEFT_DEBUG=info line for the shape
 * (set by the reduce_select entries), with the results checked at the
 * root. */
class ReduceSelector : public ReduceAlgos {
protected:
    void SetUp() override
    {
        ReduceAlgos::SetUp();
        const char *dbg = std::getenv("WEFT_DEBUG");
        if (!dbg || std::string(dbg) != "info")
            GTEST_SKIP() << "needs WEFT_DEBUG=info";
        if (size == 1)
            GTEST_SKIP() << "one rank: nothing is selected";
    }
    /* The selector's info line for the shape that starts with head
     * ("reduce 8192 elements of float32"), or "". */
    static std::string shape_line(const std::string &log, const std::string &head)
    {
        std::istringstream lines(log);
        for (std::string line; std::getline(lines, line);)
            if (line.find(head + ",") != std::string::npos && line.find("(selector)") != std::string::npos)
                return line;
        return std::string();
    }
};

TEST_F(ReduceSelector, TreeUpTo512KiBAlwaysOnTwoRanksSegmentTo32KiBOnTwo)
{
    AlgoComm comm("WEFT_REDUCE_ALGO", "auto", {{"WEFT_NODE_COLL_LARGE_KB", "0"}});
    ASSERT_EQ(comm.rc(), WEFT_SUCCESS);
    const size_t at_limit = (512u << 10) / sizeof(float), above = at_limit + 1;
    const size_t node2 = (32u << 10) / sizeof(float);   /* the segment's end on two ranks */
    const size_t counts[4] = {node2, node2 + 1, at_limit, above};
    const int root = size - 1;
    std::vector<float> in(above), out(above);
    for (size_t i = 0; i < above; i++)
        in[i] = (float)(rank + 1) * (float)(i % 7);
    int rc[4] = {-1, -1, -1, -1};
    size_t bad[4] = {0, 0, 0, 0};
    /* Small integers: exact in float32 in any order. */
    const float ranks_sum = (float)size * (float)(size + 1) / 2.0f;
    std::string log = capture_stderr([&] {
        for (int k = 0; k < 4; k++) {
            std::fill(out.begin(), out.end(), -1.0f);
            rc[k] = weft_reduce(comm.get(), in.data(), out.data(), counts[k], WEFT_FLOAT32, WEFT_SUM, root);
            for (size_t i = 0; rank == root && i < counts[k]; i++)
                bad[k] += out[i] != ranks_sum * (float)(i % 7);
        }
    });
    for (int k = 0; k < 4; k++) {
        ASSERT_EQ(rc[k], WEFT_SUCCESS) << counts[k] << " elements: " << weft_comm_last_error(comm.get());
        EXPECT_EQ(bad[k], 0u) << counts[k] << " elements: wrong elements at the root";
    }
    auto choice = [&](size_t count) {
        return shape_line(log, "reduce " + std::to_string(count) + " elements of float32");
    };
    const char *node = ": node-local shared memory (selector)";
    EXPECT_NE(choice(node2).find(node), std::string::npos) << "32 KiB: the segment\n" << log;
    EXPECT_NE(choice(node2 + 1).find(size == 2 ? ": binomial (selector)" : node), std::string::npos)
        << "32 KiB + 4 B at " << size << " ranks\n" << log;
    std::string at = choice(at_limit), over = choice(above);
    EXPECT_NE(at.find(": binomial (selector)"), std::string::npos) << "512 KiB goes by the tree:\n" << log;
    const char *want = size == 2 ? ": binomial (selector)" : ": ring (selector)";
    EXPECT_NE(over.find(want), std::string::npos)
        << "512 KiB + 4 B at " << size << " ranks: expected" << want << "\n" << log;
}

/* The allreduce selector on two ranks (collectives/allreduce.c,
 * ar_select): the node-local segment up to 32 KiB (one node over shm),
 * recursive doubling up to 128 KiB, the ring above; from three ranks the
 * segment keeps its 64 KiB. Read from the WEFT_DEBUG=info lines as above,
 * results checked on every rank. */
TEST_F(ReduceSelector, AllreduceOnTwoRanks)
{
    AlgoComm comm("WEFT_ALLREDUCE_ALGO", "auto");
    ASSERT_EQ(comm.rc(), WEFT_SUCCESS);
    const size_t k32 = (32u << 10) / 4, k128 = (128u << 10) / 4;
    const size_t counts[4] = {k32, k32 + 1, k128, k128 + 1};
    std::vector<int32_t> in(k128 + 1), out(k128 + 1);
    for (size_t i = 0; i < in.size(); i++)
        in[i] = (rank + 1) * (int32_t)(i % 11);
    int rc[4] = {-1, -1, -1, -1};
    size_t bad[4] = {0, 0, 0, 0};
    const int32_t ranks_sum = size * (size + 1) / 2;
    std::string log = capture_stderr([&] {
        for (int k = 0; k < 4; k++) {
            std::fill(out.begin(), out.end(), -1);
            rc[k] = weft_allreduce(comm.get(), in.data(), out.data(), counts[k], WEFT_INT32, WEFT_SUM);
            for (size_t i = 0; i < counts[k]; i++)
                bad[k] += out[i] != ranks_sum * (int32_t)(i % 11);
        }
    });
    for (int k = 0; k < 4; k++) {
        ASSERT_EQ(rc[k], WEFT_SUCCESS) << counts[k] << " elements: " << weft_comm_last_error(comm.get());
        EXPECT_EQ(bad[k], 0u) << counts[k] << " elements: wrong elements";
    }
    auto choice = [&](size_t count) {
        return shape_line(log, "allreduce " + std::to_string(count) + " elements of int32");
    };
    const char *node = ": node-local shared memory";
    EXPECT_NE(choice(k32).find(node), std::string::npos) << "32 KiB: the segment\n" << log;
    if (size == 2) {
        EXPECT_NE(choice(k32 + 1).find(": rd (selector)"), std::string::npos) << "32 KiB + 4 B\n" << log;
        EXPECT_NE(choice(k128).find(": rd (selector)"), std::string::npos) << "128 KiB\n" << log;
        EXPECT_NE(choice(k128 + 1).find(": ring (selector)"), std::string::npos) << "128 KiB + 4 B\n" << log;
    } else {
        EXPECT_NE(choice(k32 + 1).find(node), std::string::npos) << "32 KiB + 4 B at " << size << " ranks\n" << log;
    }
}

/* A reduce's partial sums go to the root by rendezvous above the user
 * eager limit (p2p/tags.h, WEFT_TAG_COLL_PHASE_TO_ROOT), not eagerly up
 * to the collectives' larger one: a rank's 32 KiB reduce does not
 * complete before the root has joined the call (as an eager message it
 * did at once, and a loop of reduces ran calls ahead of the root, every
 * piece copied twice more). Over shm (user eager limit 4 KiB, the
 * collectives' 32 KiB); the root joins 300 ms late, its children in the
 * tree must have waited at least 150 ms of it. The binomial tree is forced (as messages,
 * not the node-local segment), in the default 256 KiB pieces. */
class ReduceToRoot : public ReduceAlgos {};

TEST_F(ReduceToRoot, PartialSumsWaitForTheRoot)
{
    if (std::string(env_or("WEFT_TRANSPORTS", "")) != "shm")
        GTEST_SKIP() << "the eager limits named are shm's";
    if (size == 1)
        GTEST_SKIP() << "one rank: nothing is sent";
    weft_comm_t *c = nullptr;
    ASSERT_EQ(create_with(MPI_COMM_WORLD, {{"WEFT_REDUCE_ALGO", "binomial"}}, &c), WEFT_SUCCESS);
    const size_t count = (32u << 10) / sizeof(int32_t);
    std::vector<int32_t> in(count, rank + 1), out(count, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (rank == 0)
        usleep(300 * 1000);
    int rc = weft_reduce(c, in.data(), out.data(), count, WEFT_INT32, WEFT_SUM, 0);
    double waited = MPI_Wtime() - t0;
    EXPECT_EQ(rc, WEFT_SUCCESS) << weft_comm_last_error(c);
    if (rank == 0) {
        EXPECT_EQ(out[0], size * (size + 1) / 2);
        EXPECT_EQ(out[count - 1], size * (size + 1) / 2);
    } else if ((rank & (rank - 1)) == 0) {
        /* The root's children in the tree (ranks 1, 2, 4, ...: rank 3
         * sends to rank 2, which is not late). */
        EXPECT_GE(waited, 0.150) << "rank " << rank << "'s reduce completed " << waited * 1e3
                                 << " ms after the barrier, before the root joined at 300 ms";
    }
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

/* A schedule's memory (the op, its steps, its host scratch: a ring's
 * partial sums) is kept by the comm for its next call, not handed back to
 * malloc: glibc returns a freed block above its mmap threshold to the
 * kernel, and the next call then faulted every page of its scratch in
 * again (184 minor faults a call and rank for a 4 MiB reduce_scatter at np
 * 4 on one comm of a job, none on the other: it hung on where the block
 * lay in the heap). The threshold is pinned at 64 KiB here, so a freed
 * scratch always goes back to the kernel; repeated calls of each shape
 * must then fault nothing in (a few pages of slack for the rest of the
 * process: the transports, the progress thread). Messages only (no
 * node-local segment: it is mapped once). */
class OpMemory : public ReduceAlgos {};

long minor_faults()
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

TEST_F(OpMemory, RepeatedCallsFaultNoScratchIn)
{
    if (size == 1)
        GTEST_SKIP() << "one rank: no schedule";
    if (mallopt(M_MMAP_THRESHOLD, 64 << 10) != 1)
        GTEST_SKIP() << "this malloc ignores mallopt (a sanitizer's allocator)";
    weft_comm_t *c = nullptr;
    ASSERT_EQ(create_with(MPI_COMM_WORLD, {{"WEFT_NODE_COLL_KB", "0"}, {"WEFT_NODE_COLL_LARGE_KB", "0"}}, &c),
              WEFT_SUCCESS);
    const size_t count = (4u << 20) / sizeof(float);
    std::vector<float> in(count, 1.0f), out(count, 0.0f);
    struct Shape {
        const char *name;
        std::function<int()> call;
    };
    const Shape shapes[] = {
        {"allreduce 4 MiB", [&] { return weft_allreduce(c, in.data(), out.data(), count, WEFT_FLOAT32, WEFT_SUM); }},
        {"reduce_scatter 4 MiB", [&] {
             return weft_reduce_scatter(c, in.data(), out.data(), count / (size_t)size, WEFT_FLOAT32, WEFT_SUM);
         }},
        {"reduce 4 MiB", [&] { return weft_reduce(c, in.data(), out.data(), count, WEFT_FLOAT32, WEFT_SUM, 0); }},
    };
    const int kCalls = 8;
    for (const Shape &sh : shapes) {
        ASSERT_EQ(sh.call(), WEFT_SUCCESS) << sh.name << ": " << weft_comm_last_error(c);   /* warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        long before = minor_faults();
        for (int i = 0; i < kCalls; i++)
            ASSERT_EQ(sh.call(), WEFT_SUCCESS) << sh.name << ": " << weft_comm_last_error(c);
        long faults = minor_faults() - before;
        EXPECT_LT(faults, 4 * kCalls) << "rank " << rank << ": " << kCalls << " calls of " << sh.name << " faulted "
                                      << faults << " pages in (a scratch allocated and given back each call?)";
        EXPECT_EQ(out[0], (float)size) << sh.name;   /* (a reduce's non-root keeps the last result) */
    }
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

} // namespace

INSTANTIATE_TEST_SUITE_P(Algos, AllreduceAlgo, ::testing::Values("ring", "rd", "rabenseifner", "hier", "auto"));
INSTANTIATE_TEST_SUITE_P(Algos, ReduceScatterAlgo, ::testing::Values("ring", "halving", "auto"));
INSTANTIATE_TEST_SUITE_P(Algos, ReduceAlgo, ::testing::Values("binomial", "ring", "auto"));
