/*
 * The reducing collectives (weft_allreduce, weft_reduce_scatter,
 * weft_reduce) through the public API, over whatever transports the ctest
 * entry selects (shm, tcp, virtual nodes; mpi_tests/reductions.cmake).
 *
 * The matrix. Every algorithm of every kind is forced on a comm of its own
 * (WEFT_ALLREDUCE_ALGO, WEFT_REDUCE_SCATTER_ALGO, WEFT_REDUCE_ALGO are read
 * at weft_comm_create), plus the selector ("auto"); on that comm every
 * dtype x op runs over a list of counts, in place and out of place
 * alternating. The comms of the matrix use WEFT_REDUCE_CHUNK_KB=4, so the
 * pipeline boundaries are small: counts 0, 1, 7, one chunk (4096 / element
 * size) -1, +0, +1, n chunks -1 and +1 (n = ranks), a mid size (100003) --
 * all of them for SUM and for one other op per dtype (rotating, so every
 * op meets the full list on two or three dtypes), the short list 0, 1, 7,
 * chunk+1 for the rest. Under WEFT_TEST_SIZES=reduced (the 5- and 8-rank
 * entries, the device entries) the lists are shorter (counts_for) and the
 * selector's comms are left out; every dtype x op x forced algorithm still
 * runs. Separate tests cover the default chunk (256 KiB, its boundaries in
 * float32 and int8) and 64 MiB of float32 (ReductionsBig: entries of their own).
 *
 * Inputs and expected results. Element i of rank r is a function of
 * (r, i, dtype, op, call), and the test computes the expected result
 * itself, combining the ranks' inputs in rank order 0..n-1 with the
 * arithmetic weft.h documents: integers wrap (two's complement; full-range
 * random inputs, so sums and products wrap all the time, and every fourth
 * element small, so they also do not), float16 and bfloat16 go through
 * float32 and round to nearest-even after every step (the test's own
 * conversions, not the library's), AVG is the SUM divided once by n
 * (integers truncate toward zero), MIN/MAX of floats propagate NaN.
 * Where the algorithms' order of operations could change a float result,
 * the inputs are chosen so that it cannot:
 *   SUM / AVG   multiples of a power of two small enough that every partial
 *               sum is exact (float16: k/4, |k| <= 64; bfloat16: k/2,
 *               |k| <= 16; float32: k/256, |k| <= 2^20; float64: k/2^20,
 *               |k| <= 2^40; at more than 8 ranks the range shrinks), so
 *               the sum is exact in any order and AVG's one division is
 *               the only rounding;
 *   PROD        +-2^e (e in -1..1) or +-0, times one mantissa from
 *               {1, 1.25, 1.5, 1.75} on a single rank per element: exact;
 *   MIN / MAX   any values (the result is one of the inputs).
 * These results are compared bit for bit. A second set per float dtype,
 * random values in [-1, 1) for SUM and AVG, is compared with the exact
 * (double) sum S of the same inputs with the bound of recursive summation
 * in any order:
 *     |got - S| <= n * u * sum|x| + n * tiny                      (SUM)
 *     |got - S/n| <= 1.01 * (SUM bound) / n + 2 * u * |S/n| + tiny  (AVG)
 * where u is the unit roundoff of the type as reduced (float16 2^-11,
 * bfloat16 2^-8, float32 2^-24, float64 2^-53; float16/bfloat16 round
 * after every step) and tiny its smallest subnormal. A small NaN set checks
 * that MIN/MAX propagate a NaN from any rank.
 *
 * Determinism: after every allreduce each rank hashes its result bytes and
 * the hashes are allgathered (MPI): they must be identical on every rank
 * (weft.h: bit-identical for a given algorithm and rank count); the random
 * float sets also run twice and must give the same bytes both times.
 *
 * Also checked on every call: the return code, guard bytes around every
 * buffer weft sees, sendbuf unchanged (out of place), reduce's recvbuf
 * untouched off the root (or NULL there), and every root in turn.
 *
 * After each group of calls (a dtype's ops, say) the ranks agree
 * (MPI_Allgather) on whether any call failed anywhere, so all stop together
 * at the first failing group instead of leaving a peer waiting in the next
 * collective; a rank whose call failed goes on with the rest of the group.
 *
 * Every buffer weft reads or writes is a TestBuf (weft_test_mem.h): host
 * memory here, CUDA device memory in the device binary
 * (weft_mpi_reductions_dev, WEFT_TEST_MEM=device, WEFT_TEST_SIZES=reduced:
 * a shorter count list).
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"
#include "weft_test_mem.h"

using namespace weft_mpitest;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

/* ---- the test's own float16 / bfloat16 (round to nearest-even) ---- */

float f16_to_f32(uint16_t h)
{
    const uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t bits;
    if (e == 0x1f) {
        bits = s | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        bits = s | ((e + 112) << 23) | (m << 13);
    } else if (m == 0) {
        bits = s;
    } else {
        float f = (float)m * 0x1p-24f; /* subnormal: m units of 2^-24 */
        return s ? -f : f;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_f16(float f)
{
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN stays NaN (quiet) */
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u) /* >= 65520: rounds to infinity (65504 is odd) */
        return (uint16_t)(sign | 0x7c00);
    if (ax >= 0x38800000u) { /* normal in float16 */
        uint32_t base = (((ax >> 23) - 112) << 10) | ((ax >> 13) & 0x3ff);
        const uint32_t rem = ax & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (base & 1)))
            base++;
        return (uint16_t)(sign | base);
    }
    if (ax <= 0x33000000u) /* <= 2^-25: rounds to (signed) zero */
        return sign;
    const uint32_t mant = (ax & 0x7fffff) | 0x800000, shift = 126 - (ax >> 23);
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

float bf16_to_f32(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- dtypes and ops ---- */

struct Dtype {
    weft_dtype_t d;
    const char *name;
    size_t es;
    bool is_float, is_signed;
};

const Dtype kDtypes[] = {
    { WEFT_INT8, "int8", 1, false, true },       { WEFT_UINT8, "uint8", 1, false, false },
    { WEFT_INT32, "int32", 4, false, true },     { WEFT_UINT32, "uint32", 4, false, false },
    { WEFT_INT64, "int64", 8, false, true },     { WEFT_UINT64, "uint64", 8, false, false },
    { WEFT_FLOAT16, "float16", 2, true, true },  { WEFT_BFLOAT16, "bfloat16", 2, true, true },
    { WEFT_FLOAT32, "float32", 4, true, true },  { WEFT_FLOAT64, "float64", 8, true, true },
};
constexpr int kNumDtypes = (int)(sizeof kDtypes / sizeof kDtypes[0]);
static_assert(kNumDtypes == WEFT_DTYPE_COUNT, "every weft_dtype_t is in the matrix");

const char *const kOpNames[] = { "sum", "prod", "min", "max", "avg" };
static_assert(sizeof kOpNames / sizeof kOpNames[0] == WEFT_OP_COUNT, "every weft_op_t is in the matrix");

const Dtype &dtype_info(weft_dtype_t d)
{
    for (const Dtype &t : kDtypes)
        if (t.d == d)
            return t;
    return kDtypes[0];
}

/* Elements travel in a uint64_t holding their bytes (little-endian, low es bytes). */
inline uint64_t load_el(const unsigned char *p, size_t es)
{
    uint64_t v = 0;
    std::memcpy(&v, p, es);
    return v;
}
inline void store_el(unsigned char *p, size_t es, uint64_t v) { std::memcpy(p, &v, es); }

inline uint64_t width_mask(size_t es) { return es >= 8 ? ~0ull : ((1ull << (8 * es)) - 1); }

inline float as_f32(uint64_t b)
{
    uint32_t u = (uint32_t)b;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint64_t f32_bits(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline double as_f64(uint64_t b)
{
    double d;
    std::memcpy(&d, &b, 8);
    return d;
}
inline uint64_t f64_bits(double d)
{
    uint64_t u;
    std::memcpy(&u, &d, 8);
    return u;
}

double to_double(weft_dtype_t d, uint64_t b)
{
    switch (d) {
    case WEFT_INT8: return (double)(int8_t)b;
    case WEFT_UINT8: return (double)(uint8_t)b;
    case WEFT_INT32: return (double)(int32_t)b;
    case WEFT_UINT32: return (double)(uint32_t)b;
    case WEFT_INT64: return (double)(int64_t)b;
    case WEFT_UINT64: return (double)b;
    case WEFT_FLOAT16: return f16_to_f32((uint16_t)b);
    case WEFT_BFLOAT16: return bf16_to_f32((uint16_t)b);
    case WEFT_FLOAT32: return as_f32(b);
    case WEFT_FLOAT64: return as_f64(b);
    }
    return 0;
}

/* A float value rounded into the type (generation only). */
uint64_t float_from_double(weft_dtype_t d, double v)
{
    switch (d) {
    case WEFT_FLOAT16: return f32_to_f16((float)v);
    case WEFT_BFLOAT16: return f32_to_bf16((float)v);
    case WEFT_FLOAT32: return f32_bits((float)v);
    default: return f64_bits(v);
    }
}

bool is_nan_el(weft_dtype_t d, uint64_t b)
{
    switch (d) {
    case WEFT_FLOAT16: return ((b & 0x7c00) == 0x7c00) && (b & 0x3ff);
    case WEFT_BFLOAT16: return ((b & 0x7f80) == 0x7f80) && (b & 0x7f);
    case WEFT_FLOAT32: return std::isnan(as_f32(b));
    case WEFT_FLOAT64: return std::isnan(as_f64(b));
    default: return false;
    }
}

template <typename F>
F float_op(int op, F a, F b)
{
    switch (op) {
    case WEFT_PROD: return a * b;
    case WEFT_MIN:
        if (std::isnan(a) || std::isnan(b))
            return std::numeric_limits<F>::quiet_NaN();
        return b < a ? b : a;
    case WEFT_MAX:
        if (std::isnan(a) || std::isnan(b))
            return std::numeric_limits<F>::quiet_NaN();
        return b > a ? b : a;
    default: return a + b; /* SUM, AVG */
    }
}

template <typename U, typename S>
uint64_t int_op(int op, uint64_t a, uint64_t b)
{
    const U x = (U)a, y = (U)b;
    switch (op) {
    case WEFT_PROD: return (U)((uint64_t)x * (uint64_t)y);
    case WEFT_MIN: return (S)y < (S)x ? y : x;
    case WEFT_MAX: return (S)y > (S)x ? y : x;
    default: return (U)((uint64_t)x + (uint64_t)y);
    }
}

/* a op b with weft's documented arithmetic (a: the left operand). */
uint64_t combine(weft_dtype_t d, int op, uint64_t a, uint64_t b)
{
    switch (d) {
    case WEFT_INT8: return int_op<uint8_t, int8_t>(op, a, b);
    case WEFT_UINT8: return int_op<uint8_t, uint8_t>(op, a, b);
    case WEFT_INT32: return int_op<uint32_t, int32_t>(op, a, b);
    case WEFT_UINT32: return int_op<uint32_t, uint32_t>(op, a, b);
    case WEFT_INT64: return int_op<uint64_t, int64_t>(op, a, b);
    case WEFT_UINT64: return int_op<uint64_t, uint64_t>(op, a, b);
    case WEFT_FLOAT16:
        return f32_to_f16(float_op<float>(op, f16_to_f32((uint16_t)a), f16_to_f32((uint16_t)b)));
    case WEFT_BFLOAT16:
        return f32_to_bf16(float_op<float>(op, bf16_to_f32((uint16_t)a), bf16_to_f32((uint16_t)b)));
    case WEFT_FLOAT32: return f32_bits(float_op<float>(op, as_f32(a), as_f32(b)));
    case WEFT_FLOAT64: return f64_bits(float_op<double>(op, as_f64(a), as_f64(b)));
    }
    return 0;
}

/* AVG's one division of the (wrapped / rounded) sum by n. */
uint64_t avg_final(weft_dtype_t d, uint64_t s, int n)
{
    switch (d) {
    case WEFT_INT8: return (uint8_t)(int8_t)((int8_t)s / n);
    case WEFT_UINT8: return (uint8_t)s / (unsigned)n;
    case WEFT_INT32: return (uint32_t)((int32_t)s / n);
    case WEFT_UINT32: return (uint32_t)s / (uint32_t)n;
    case WEFT_INT64: return (uint64_t)((int64_t)s / n);
    case WEFT_UINT64: return s / (uint64_t)n;
    case WEFT_FLOAT16: return f32_to_f16(f16_to_f32((uint16_t)s) / (float)n);
    case WEFT_BFLOAT16: return f32_to_bf16(bf16_to_f32((uint16_t)s) / (float)n);
    case WEFT_FLOAT32: return f32_bits(as_f32(s) / (float)n);
    case WEFT_FLOAT64: return f64_bits(as_f64(s) / (double)n);
    }
    return 0;
}

uint64_t quiet_nan(weft_dtype_t d, bool negative)
{
    switch (d) {
    case WEFT_FLOAT16: return negative ? 0xfe00 : 0x7e00;
    case WEFT_BFLOAT16: return negative ? 0xffc0 : 0x7fc0;
    case WEFT_FLOAT32: return negative ? 0xffc00000ull : 0x7fc00000ull;
    default: return negative ? 0xfff8000000000000ull : 0x7ff8000000000000ull;
    }
}

/* Unit roundoff and smallest subnormal of the type as reduced. */
double unit_roundoff(weft_dtype_t d)
{
    switch (d) {
    case WEFT_FLOAT16: return 0x1p-11;
    case WEFT_BFLOAT16: return 0x1p-8;
    case WEFT_FLOAT32: return 0x1p-24;
    default: return 0x1p-53;
    }
}
double tiny_of(weft_dtype_t d)
{
    switch (d) {
    case WEFT_FLOAT16: return 0x1p-24;
    case WEFT_BFLOAT16: return 0x1p-133;
    case WEFT_FLOAT32: return 0x1p-149;
    default: return 0x1p-1074;
    }
}

/* ---- generated inputs ---- */

enum class Mode {
    Exact,  /* results independent of the order of operations: compared bit for bit */
    Random, /* floats, SUM/AVG: random in [-1, 1), compared within the documented bound */
    NaN,    /* floats, MIN/MAX: NaN at some (rank, element): must come out NaN */
};

const char *mode_name(Mode m)
{
    return m == Mode::Exact ? "exact" : m == Mode::Random ? "random floats" : "NaN inputs";
}

struct Gen {
    weft_dtype_t d;
    int op;
    Mode mode;
    int n;        /* ranks */
    uint64_t seed;
    const Dtype &t;
    std::vector<uint64_t> rank_seed;

    Gen(weft_dtype_t d_, int op_, Mode mode_, int n_, uint64_t seed_)
        : d(d_), op(op_), mode(mode_), n(n_), seed(seed_), t(dtype_info(d_))
    {
        for (int r = 0; r < n; r++)
            rank_seed.push_back(seed ^ mix64((uint64_t)r + 0x1234567ull));
    }

    /* Element i of rank r. */
    uint64_t value(int r, size_t i) const
    {
        const uint64_t u = pattern_word(rank_seed[(size_t)r], i);
        if (!t.is_float) {
            if (i % 4 == 0) /* small: sums of these do not wrap (wider types) */
                return (t.is_signed ? (uint64_t)((int64_t)(u % 101) - 50) : u % 101) & width_mask(t.es);
            return u & width_mask(t.es);
        }
        const double unit = (double)(u >> 11) * 0x1p-53; /* [0, 1) */
        if (mode == Mode::Random)
            return float_from_double(d, unit * 2 - 1);
        if (op == WEFT_SUM || op == WEFT_AVG) {
            int64_t k;
            double scale;
            switch (d) {
            case WEFT_FLOAT16: k = 64, scale = 0x1p-2; break;
            case WEFT_BFLOAT16: k = 16, scale = 0x1p-1; break;
            case WEFT_FLOAT32: k = (int64_t)1 << 20, scale = 0x1p-8; break;
            default: k = (int64_t)1 << 40, scale = 0x1p-20; break;
            }
            for (int m = 8; m < n; m *= 2) /* n > 8: keep every partial sum exact */
                k = k > 1 ? k / 2 : 1;
            const int64_t v = (int64_t)(u % (uint64_t)(2 * k + 1)) - k;
            return float_from_double(d, (double)v * scale);
        }
        if (op == WEFT_PROD) {
            static const double mants[] = { 1.0, 1.25, 1.5, 1.75 };
            const bool neg = (u >> 1) & 1;
            if ((u >> 8) % 64 == 0)
                return float_from_double(d, neg ? -0.0 : 0.0);
            const int e = (int)((u >> 2) % 3) - 1;
            const double m = (size_t)r == i % (size_t)n ? mants[(u >> 4) & 3] : 1.0;
            return float_from_double(d, (neg ? -m : m) * std::ldexp(1.0, e));
        }
        /* MIN / MAX: any finite nonzero value (no +0 / -0 ties) */
        if (mode == Mode::NaN && ((r == n - 1 && i % 3 == 0) || (r == 0 && i % 5 == 1)))
            return quiet_nan(d, r == 0);
        uint64_t b = float_from_double(d, unit * 2000 - 1000);
        if (to_double(d, b) == 0)
            b = float_from_double(d, 1.0);
        return b;
    }

    /* Inputs of rank r, elements [first, first+cnt), into out. */
    void fill(int r, size_t first, size_t cnt, unsigned char *out) const
    {
        const size_t es = t.es;
        for (size_t k = 0; k < cnt; k++)
            store_el(out + k * es, es, value(r, first + k));
    }

    /* The reference of element i: the ranks' inputs combined in rank order. */
    uint64_t expected(size_t i) const
    {
        uint64_t acc = value(0, i);
        for (int r = 1; r < n; r++)
            acc = combine(d, op, acc, value(r, i));
        return op == WEFT_AVG ? avg_final(d, acc, n) : acc;
    }

    /* "" when got (cnt elements, element first onwards) is right, else what is wrong. */
    std::string check(size_t first, size_t cnt, const unsigned char *got) const
    {
        for (size_t k = 0; k < cnt; k++) {
            const size_t i = first + k;
            const uint64_t g = load_el(got + k * t.es, t.es);
            if (mode == Mode::Random) {
                double s = 0, abs_sum = 0;
                for (int r = 0; r < n; r++) {
                    const double x = to_double(d, value(r, i));
                    s += x;
                    abs_sum += std::fabs(x);
                }
                const double u = unit_roundoff(d), tiny = tiny_of(d);
                double want = s, tol = n * u * abs_sum + n * tiny;
                if (op == WEFT_AVG) {
                    want = s / n;
                    tol = 1.01 * tol / n + 2 * u * std::fabs(want) + tiny;
                }
                const double gv = to_double(d, g);
                if (!(std::fabs(gv - want) <= tol)) {
                    std::ostringstream o;
                    o.precision(17);
                    o << "element " << i << ": got " << gv << ", exact " << want << ", allowed error " << tol
                      << " (sum of |inputs| " << abs_sum << ")";
                    return o.str();
                }
                continue;
            }
            const uint64_t want = expected(i);
            bool ok = g == want;
            if (mode == Mode::NaN && is_nan_el(d, want))
                ok = is_nan_el(d, g);
            if (!ok) {
                std::ostringstream o;
                o.precision(17);
                o << "element " << i << ": expected 0x" << std::hex << want << std::dec << " ("
                  << to_double(d, want) << "), got 0x" << std::hex << g << std::dec << " (" << to_double(d, g)
                  << "); inputs by rank:";
                for (int r = 0; r < n && r < 8; r++)
                    o << " " << to_double(d, value(r, i));
                return o.str();
            }
        }
        return "";
    }
};

/* A hash of n bytes (8 at a time: 64 MiB results are hashed too). */
uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t w;
        std::memcpy(&w, p + k, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; k < n; k++)
        h = (h ^ p[k]) * 0x100000001b3ull;
    return h;
}

/* ---- kinds, algorithms, comms ---- */

enum class Kind { Allreduce, ReduceScatter, Reduce };

const char *kind_name(Kind k)
{
    return k == Kind::Allreduce ? "allreduce" : k == Kind::ReduceScatter ? "reduce_scatter" : "reduce";
}
const char *algo_var(Kind k)
{
    return k == Kind::Allreduce       ? "WEFT_ALLREDUCE_ALGO"
           : k == Kind::ReduceScatter ? "WEFT_REDUCE_SCATTER_ALGO"
                                      : "WEFT_REDUCE_ALGO";
}
std::vector<std::string> algos_of(Kind k)
{
    if (k == Kind::Allreduce)
        return { "ring", "rd", "rabenseifner", "hier" };
    if (k == Kind::ReduceScatter)
        return { "ring", "halving" };
    return { "binomial", "ring" };
}

/* A comm of its own, created with some WEFT_* settings in its
 * configuration (value "auto": an algorithm's "auto", the selector; for
 * any other setting, not given: its default, as the suites' environment
 * leaves it). Destroyed at the end of the scope when no rank failed (then
 * the ranks may disagree about what is in flight, so it is leaked, as
 * WeftMpiTest does). */
class ConfigComm {
public:
    explicit ConfigComm(const Settings &wanted)
    {
        Settings settings;
        for (const auto &kv : wanted) {
            if (kv.second != "auto" || kv.first.find("_ALGO") != std::string::npos)
                settings.push_back(kv);
            desc_ += (desc_.empty() ? "" : " ") + kv.first + "=" + kv.second;
        }
        rc_ = create_with(MPI_COMM_WORLD, settings, &comm_);
        if (rc_ != WEFT_SUCCESS)
            comm_ = nullptr;
    }
    ~ConfigComm()
    {
        const bool failed = any_rank(::testing::Test::HasFailure());
        if (comm_ && !failed) {
            EXPECT_EQ(weft_comm_destroy(comm_), WEFT_SUCCESS) << desc_;
        }
    }
    ConfigComm(const ConfigComm &) = delete;
    ConfigComm &operator=(const ConfigComm &) = delete;

    weft_comm_t *get() const { return comm_; }
    int rc() const { return rc_; }
    const std::string &desc() const { return desc_; }

private:
    weft_comm_t *comm_ = nullptr;
    int rc_ = WEFT_ERR_INTERNAL;
    std::string desc_;
};

/* One reducing call: what it is, and how to make and check its data. */
struct Call {
    Kind kind;
    std::string algo;
    weft_dtype_t dtype;
    int op;
    size_t count;       /* allreduce, reduce: elements; reduce_scatter: per rank */
    bool in_place;
    int root;           /* reduce */
    std::string label;  /* e.g. "exact" */
    /* Inputs of a rank for global elements [first, first+cnt). */
    std::function<void(int, size_t, size_t, unsigned char *)> fill;
    /* "" or what is wrong with result elements [first, first+cnt). */
    std::function<std::string(size_t, size_t, const unsigned char *)> check;
};

std::string describe(const Call &c)
{
    std::ostringstream o;
    o << kind_name(c.kind) << " algo " << c.algo << " " << dtype_info(c.dtype).name << " " << kOpNames[c.op]
      << " count " << c.count << (c.in_place ? " in place" : " out of place");
    if (c.kind == Kind::Reduce)
        o << " root " << c.root;
    o << " (" << c.label << ")";
    return o.str();
}

class Reductions : public WeftMpiTest {
protected:
    uint64_t ncalls = 0;

    /* What one call left to agree on: whether it failed here, and (allreduce)
     * the hash of its result bytes, which must be equal on every rank. */
    struct Record {
        bool bad;
        bool compare_hash;
        uint64_t hash;
        std::string what;
        std::function<std::string()> full_check; /* allreduce: every element, for the report */
    };
    std::vector<Record> pending;

    void record(bool bad, bool compare_hash, uint64_t hash, const std::string &what,
                std::function<std::string()> full_check = nullptr)
    {
        pending.push_back(Record{ bad, compare_hash, hash, what, std::move(full_check) });
    }

    /* Collective: every rank learns about the calls recorded since the last
     * flush (the same number everywhere: all ranks run the same calls, a
     * failing rank goes on with the others). false: some call failed on
     * some rank, or ranks got different bytes; stop on every rank. One
     * MPI_Allgather per group of calls instead of one per call. */
    bool flush()
    {
        const size_t k = pending.size();
        std::vector<uint64_t> mine(2 * k), all(2 * k * (size_t)size);
        for (size_t j = 0; j < k; j++) {
            mine[2 * j] = pending[j].hash;
            mine[2 * j + 1] = pending[j].bad ? 1 : 0;
        }
        MPI_Allgather(mine.data(), (int)(2 * k), MPI_UINT64_T, all.data(), (int)(2 * k), MPI_UINT64_T,
                      MPI_COMM_WORLD);
        bool ok = true;
        for (size_t j = 0; j < k && ok; j++) {
            const Record &rec = pending[j];
            int bad_rank = -1;
            bool differ = false;
            for (int r = 0; r < size; r++) {
                const uint64_t *e = &all[2 * k * (size_t)r + 2 * j];
                if (e[1] && bad_rank < 0)
                    bad_rank = r;
                differ |= e[0] != all[2 * j];
            }
            if (bad_rank >= 0) {
                if (!rec.bad)
                    ADD_FAILURE() << rec.what << ": failed on rank " << bad_rank;
                ok = false;
            } else if (rec.compare_hash && differ) {
                std::ostringstream o;
                for (int r = 0; r < size; r++)
                    o << " rank " << r << ": " << std::hex << all[2 * k * (size_t)r + 2 * j] << std::dec;
                ADD_FAILURE() << rec.what << ": results differ between ranks (hashes" << o.str() << ")";
                if (rec.full_check) {
                    const std::string where = rec.full_check();
                    if (!where.empty())
                        ADD_FAILURE() << "rank " << rank << ": " << rec.what << ": " << where;
                }
                ok = false;
            }
        }
        pending.clear();
        return ok;
    }

    /* One call, agreed on at once. */
    bool run_now(weft_comm_t *cm, const Call &c, std::vector<unsigned char> *result = nullptr)
    {
        run(cm, c, result);
        return flush();
    }

    /* Runs c on comm and checks everything on this rank; the outcome is
     * recorded for the next flush(). result (when not NULL) gets this rank's
     * result bytes. */
    void run(weft_comm_t *cm, const Call &c, std::vector<unsigned char> *result = nullptr)
    {
        const uint64_t call = ncalls++;
        const size_t es = dtype_info(c.dtype).es;
        const int n = size, me = rank;
        const bool has_out = c.kind != Kind::Reduce || me == c.root;
        const size_t in_elems = c.kind == Kind::ReduceScatter ? (size_t)n * c.count : c.count;
        const size_t out_first = c.kind == Kind::ReduceScatter ? (size_t)me * c.count : 0;
        const size_t in_bytes = in_elems * es, out_bytes = c.count * es;
        const std::string what = describe(c);
        std::string err;

        std::vector<unsigned char> input(in_bytes);
        c.fill(me, 0, in_elems, input.data());

        /* Element-aligned, but not always 64-byte aligned. */
        const size_t mis = (call % 3) * es, mis2 = ((call + 1) % 3) * es;
        TestBuf send, recv;
        const void *sp = nullptr;
        void *rp = nullptr;
        bool send_is_input = false; /* sendbuf must read back as input afterwards */
        bool made_send = false, made_recv = false; /* guarded buffers this call made */
        bool check_recv_untouched = false;
        if (c.in_place && c.kind == Kind::ReduceScatter) {
            send = TestBuf(in_bytes, TestBuf::kGuarded, mis);
            made_send = true;
            send.write(0, input.data(), in_bytes);
            sp = send.data();
            rp = send.data() + out_first * es;
        } else if (c.in_place && has_out) {
            recv = TestBuf(out_bytes, TestBuf::kGuarded, mis);
            made_recv = true;
            recv.write(0, input.data(), in_bytes);
            sp = rp = recv.data();
        } else if (c.in_place) {
            /* reduce off the root, "in place": the same pointer twice; recvbuf is
             * not used there, so sendbuf must come back unchanged. */
            send = TestBuf(in_bytes, TestBuf::kGuarded, mis);
            made_send = true;
            send.write(0, input.data(), in_bytes);
            sp = send.data();
            rp = send.data();
            send_is_input = true;
        } else {
            send = TestBuf(in_bytes, TestBuf::kGuarded, mis);
            made_send = true;
            send.write(0, input.data(), in_bytes);
            sp = send.data();
            send_is_input = true;
            if (has_out) {
                recv = TestBuf(out_bytes, TestBuf::kGuarded, mis2);
                made_recv = true;
                rp = recv.data();
            } else if (call % 2 == 0) {
                recv = TestBuf(out_bytes, TestBuf::kGuarded, mis2); /* must stay untouched */
                made_recv = true;
                rp = recv.data();
                check_recv_untouched = true;
            } /* else NULL: allowed off the root */
        }
        if ((!send.ok() && send.size() > 0) || (!recv.ok() && recv.size() > 0))
            err = "test buffers: " + send.error() + recv.error();
        if (c.count == 0 && call % 2 == 1) { /* 0 elements: NULL buffers are fine */
            sp = nullptr;
            rp = nullptr;
        }

        std::vector<unsigned char> got;
        if (err.empty()) {
            int rc;
            switch (c.kind) {
            case Kind::Allreduce: rc = weft_allreduce(cm, sp, rp, c.count, c.dtype, (weft_op_t)c.op); break;
            case Kind::ReduceScatter:
                rc = weft_reduce_scatter(cm, sp, rp, c.count, c.dtype, (weft_op_t)c.op);
                break;
            default: rc = weft_reduce(cm, sp, rp, c.count, c.dtype, (weft_op_t)c.op, c.root); break;
            }
            if (rc != WEFT_SUCCESS)
                err = std::string("returned ") + weft_strerror(rc) + ": " + weft_comm_last_error(cm);
        }
        /* The result as the host sees it: host buffers in place, device
         * buffers (or a result the caller keeps) through a copy. */
        const TestBuf &out_buf = c.in_place && c.kind == Kind::ReduceScatter ? send : recv;
        const size_t out_off = c.in_place && c.kind == Kind::ReduceScatter ? out_first * es : 0;
        const unsigned char *view = nullptr;
        if (err.empty() && has_out) {
            if (out_buf.is_device() || result) {
                got = out_buf.copy_to_host(out_off, out_bytes);
                view = got.data();
            } else {
                view = out_buf.data() + out_off;
            }
            if (c.kind == Kind::Allreduce) {
                /* Every rank checks its share of the elements; the hashes
                 * compared in flush() say all ranks hold the same bytes. */
                const size_t lo = c.count * (size_t)me / (size_t)n, hi = c.count * (size_t)(me + 1) / (size_t)n;
                err = c.check(lo, hi - lo, view + lo * es);
            } else {
                err = c.check(out_first, c.count, view);
            }
        }
        if (err.empty() && send_is_input && in_bytes > 0) {
            const bool same = send.is_device() ? send.copy_to_host(0, in_bytes) == input
                                               : std::memcmp(send.data(), input.data(), in_bytes) == 0;
            if (!same)
                err = "sendbuf was modified";
        }
        if (err.empty() && check_recv_untouched) {
            ::testing::AssertionResult r = recv.Untouched();
            if (!r)
                err = std::string("recvbuf off the root: ") + r.message();
        }
        for (TestBuf *b : { &send, &recv }) {
            if (err.empty() && b->ok() && b->data() != nullptr && (b == &send ? made_send : made_recv)) {
                ::testing::AssertionResult r = b->GuardsIntact();
                if (!r)
                    err = r.message();
            }
        }
        if (!err.empty())
            ADD_FAILURE() << "rank " << me << ": " << what << ": " << err;
        std::function<std::string()> full_check;
        const uint64_t hash = view ? hash_bytes(view, out_bytes) : 0;
        if (c.kind == Kind::Allreduce && view && out_bytes <= 8 * MiB) {
            auto keep = std::make_shared<std::vector<unsigned char>>(view, view + out_bytes);
            auto chk = c.check;
            const size_t cnt = c.count;
            full_check = [keep, chk, cnt] { return chk(0, cnt, keep->data()); };
        }
        record(!err.empty(), c.kind == Kind::Allreduce, hash, what, full_check);
        if (result)
            *result = std::move(got);
    }

    Call make_call(Kind kind, const std::string &algo, const Dtype &t, int op, size_t count, bool in_place,
                   Mode mode, uint64_t call_seed)
    {
        auto g = std::make_shared<Gen>(t.d, op, mode, size, pattern_seed(0, t.d * 8 + op, call_seed));
        Call c{ kind, algo, t.d, op, count, in_place, (int)(call_seed % (uint64_t)size), mode_name(mode),
                [g](int r, size_t first, size_t cnt, unsigned char *out) { g->fill(r, first, cnt, out); },
                [g](size_t first, size_t cnt, const unsigned char *got) { return g->check(first, cnt, got); } };
        return c;
    }

    /* Counts with chunk ce (elements). level 2: SUM, the full list; level 1:
     * the op that gets the full list on this dtype (the full list again;
     * reduced: a short list across one chunk boundary); level 0: the other
     * ops, small counts and (full sizes) one chunk + 1. */
    std::vector<size_t> counts_for(Kind kind, size_t ce, int level) const
    {
        const size_t n = (size_t)size;
        const bool rs = kind == Kind::ReduceScatter;
        if (reduced_sizes()) {
            if (level == 0)
                return { 1, 7 };
            if (level == 1)
                return { 0, ce + 1 };
            if (rs)
                return { 0, 1, ce - 1, ce + 1, 3001 };
            return { 0, 1, ce - 1, ce + 1, n * ce + 1, 30011 };
        }
        if (level == 0)
            return { 0, 1, 7, ce + 1 };
        if (rs) /* per-rank counts: the blocks cross chunk boundaries */
            return { 0, 1, 7, ce - 1, ce, ce + 1, 3 * ce + 1, 12345 };
        return { 0, 1, 7, ce - 1, ce, ce + 1, n * ce - 1, n * ce + 1, 100003 };
    }

    /* The matrix on one comm (algo forced, 4 KiB chunks). */
    void matrix(Kind kind, const std::string &algo)
    {
        if (algo == "auto" && reduced_sizes())
            GTEST_SKIP() << "the selector's matrix runs at full sizes only (WEFT_TEST_SIZES=reduced)";
        ConfigComm cm({ { algo_var(kind), algo }, { "WEFT_REDUCE_CHUNK_KB", "4" } });
        ASSERT_EQ(cm.rc(), WEFT_SUCCESS) << "weft_comm_create with " << cm.desc();
        const size_t chunk = 4 * KiB;
        uint64_t seed = 0;
        for (int di = 0; di < kNumDtypes; di++) {
            const Dtype &t = kDtypes[di];
            const size_t ce = chunk / t.es;
            for (int op = 0; op < WEFT_OP_COUNT; op++) {
                const int level = op == WEFT_SUM ? 2 : op == 1 + di % 4 ? 1 : 0;
                const std::vector<size_t> counts = counts_for(kind, ce, level);
                for (size_t ci = 0; ci < counts.size(); ci++) {
                    const bool in_place = (ci + (size_t)di + (size_t)op) % 2 == 1;
                    run(cm.get(), make_call(kind, algo, t, op, counts[ci], in_place, Mode::Exact, seed++));
                }
            }
            if (!flush())
                return;
            if (!t.is_float)
                continue;
            /* Random floats (within the bound; allreduce: twice, same bytes). */
            const size_t mid = kind == Kind::ReduceScatter ? (reduced_sizes() ? 3001 : 12345)
                                                          : (reduced_sizes() ? 30011 : 100003);
            int alt = di;
            for (int op : { WEFT_SUM, WEFT_AVG }) {
                for (size_t count : { (size_t)7, ce + 1, mid }) {
                    const bool in_place = alt++ % 2 == 1;
                    const uint64_t s = seed++;
                    std::vector<unsigned char> first, second;
                    const Call c = make_call(kind, algo, t, op, count, in_place, Mode::Random, s);
                    run(cm.get(), c, &first);
                    if (kind != Kind::Allreduce)
                        continue;
                    run(cm.get(), c, &second);
                    const bool same = first == second;
                    if (!same)
                        ADD_FAILURE() << "rank " << rank << ": " << describe(c)
                                      << ": the same inputs twice gave different bytes";
                    record(!same, false, 0, describe(c) + ", repeated");
                }
            }
            /* NaN from any rank comes out of MIN and MAX. */
            for (int op : { WEFT_MIN, WEFT_MAX })
                for (size_t count : { (size_t)37, ce + 1 })
                    run(cm.get(), make_call(kind, algo, t, op, count, alt++ % 2 == 1, Mode::NaN, seed++));
            if (!flush())
                return;
        }
    }

    /* Float32 SUM of small integers (exact) and int8 MAX, with cheap
     * generators for big counts: element i of rank r depends on i only
     * through i mod 61 (float32) or a byte of i (int8), so the expected
     * values come from a table. */
    Call f32_sum_call(Kind kind, const std::string &algo, size_t count, bool in_place, int root)
    {
        auto want = std::make_shared<std::vector<float>>(61, 0.0f);
        for (int m = 0; m < 61; m++)
            for (int r = 0; r < size; r++)
                (*want)[(size_t)m] += (float)((m * 7 + r * 13) % 61 - 30);
        Call c{ kind, algo, WEFT_FLOAT32, WEFT_SUM, count, in_place, root, "float32 small integers",
                [](int r, size_t first, size_t cnt, unsigned char *out) {
                    float vals[61];
                    for (int m = 0; m < 61; m++)
                        vals[m] = (float)((m * 7 + r * 13) % 61 - 30);
                    float *o = reinterpret_cast<float *>(out);
                    size_t m = first % 61;
                    for (size_t k = 0; k < cnt; k++) {
                        o[k] = vals[m];
                        m = m == 60 ? 0 : m + 1;
                    }
                },
                [want](size_t first, size_t cnt, const unsigned char *got) -> std::string {
                    const float *g = reinterpret_cast<const float *>(got);
                    size_t m = first % 61;
                    for (size_t k = 0; k < cnt; k++) {
                        if (g[k] != (*want)[m])
                            return "element " + std::to_string(first + k) + ": expected " +
                                   std::to_string((*want)[m]) + ", got " + std::to_string(g[k]);
                        m = m == 60 ? 0 : m + 1;
                    }
                    return "";
                } };
        return c;
    }

    Call i8_max_call(Kind kind, const std::string &algo, size_t count, bool in_place, int root)
    {
        /* byte t(i) = (31 i + (i >> 9)) mod 256; rank r adds 17 r */
        auto want = std::make_shared<std::vector<int8_t>>(256);
        for (int b = 0; b < 256; b++) {
            int8_t w = (int8_t)(uint8_t)b;
            for (int r = 1; r < size; r++)
                w = std::max(w, (int8_t)(uint8_t)((b + 17 * r) & 0xff));
            (*want)[(size_t)b] = w;
        }
        auto tb = [](size_t i) { return (size_t)((i * 31 + (i >> 9)) & 0xff); };
        Call c{ kind, algo, WEFT_INT8, WEFT_MAX, count, in_place, root, "int8",
                [tb](int r, size_t first, size_t cnt, unsigned char *out) {
                    for (size_t k = 0; k < cnt; k++)
                        out[k] = (unsigned char)((tb(first + k) + 17 * (size_t)r) & 0xff);
                },
                [want, tb](size_t first, size_t cnt, const unsigned char *got) -> std::string {
                    for (size_t k = 0; k < cnt; k++) {
                        const int8_t w = (*want)[tb(first + k)];
                        if ((int8_t)got[k] != w)
                            return "element " + std::to_string(first + k) + ": expected " + std::to_string(w) +
                                   ", got " + std::to_string((int8_t)got[k]);
                    }
                    return "";
                } };
        return c;
    }
};

TEST_F(Reductions, AllreduceRing) { matrix(Kind::Allreduce, "ring"); }
TEST_F(Reductions, AllreduceRecursiveDoubling) { matrix(Kind::Allreduce, "rd"); }
TEST_F(Reductions, AllreduceRabenseifner) { matrix(Kind::Allreduce, "rabenseifner"); }
TEST_F(Reductions, AllreduceHier) { matrix(Kind::Allreduce, "hier"); }
TEST_F(Reductions, AllreduceSelector) { matrix(Kind::Allreduce, "auto"); }
TEST_F(Reductions, ReduceScatterRing) { matrix(Kind::ReduceScatter, "ring"); }
TEST_F(Reductions, ReduceScatterHalving) { matrix(Kind::ReduceScatter, "halving"); }
TEST_F(Reductions, ReduceScatterSelector) { matrix(Kind::ReduceScatter, "auto"); }
TEST_F(Reductions, ReduceBinomial) { matrix(Kind::Reduce, "binomial"); }
TEST_F(Reductions, ReduceRing) { matrix(Kind::Reduce, "ring"); }
TEST_F(Reductions, ReduceSelector) { matrix(Kind::Reduce, "auto"); }

/* The default chunk (256 KiB, WEFT_REDUCE_CHUNK_KB unset): its boundary
 * -1 and +1 in float32 (65536 elements), n chunks + 1 (full sizes), +1 or
 * -1 in int8 (262144), every algorithm and the selector, roots in turn. */
TEST_F(Reductions, DefaultChunkBoundaries)
{
    const size_t n = (size_t)size;
    const size_t ce32 = 256 * KiB / 4, ce8 = 256 * KiB;
    int root = 0;
    for (Kind kind : { Kind::Allreduce, Kind::ReduceScatter, Kind::Reduce }) {
        std::vector<std::string> algos = algos_of(kind);
        if (!reduced_sizes())
            algos.push_back("auto");
        for (size_t a = 0; a < algos.size(); a++) {
            const std::string &algo = algos[a];
            ConfigComm cm({ { algo_var(kind), algo }, { "WEFT_REDUCE_CHUNK_KB", "auto" } });
            ASSERT_EQ(cm.rc(), WEFT_SUCCESS) << "weft_comm_create with " << cm.desc();
            /* reduce_scatter: per-rank counts, so n chunks and more in all. */
            std::vector<Call> calls = { f32_sum_call(kind, algo, ce32 - 1, a % 2 == 0, root++ % size),
                                        f32_sum_call(kind, algo, ce32 + 1, a % 2 == 1, root++ % size) };
            if (kind != Kind::ReduceScatter && !reduced_sizes())
                calls.push_back(f32_sum_call(kind, algo, n * ce32 + 1, a % 2 == 0, root++ % size));
            calls.push_back(i8_max_call(kind, algo, a % 2 ? ce8 - 1 : ce8 + 1, a % 2 == 1, root++ % size));
            for (const Call &c : calls)
                run(cm.get(), c);
            if (!flush())
                return;
        }
    }
}

/* 64 MiB of float32 (SUM of small integers: exact), once per algorithm,
 * in place and out of place alternating; reduce at the last rank.
 * A test suite of its own (ReductionsBig), so the matrix entries (filter
 * Reductions.*) leave it out. */
class ReductionsBig : public Reductions {
protected:
    void big(Kind kind)
    {
        const size_t elems = 64 * MiB / 4;
        int i = 0;
        for (const std::string &algo : algos_of(kind)) {
            ConfigComm cm({ { algo_var(kind), algo } });
            ASSERT_EQ(cm.rc(), WEFT_SUCCESS) << "weft_comm_create with " << cm.desc();
            /* reduce_scatter: 64 MiB of sendbuf in all. */
            const size_t count = kind == Kind::ReduceScatter ? elems / (size_t)size : elems;
            if (!run_now(cm.get(), f32_sum_call(kind, algo, count, i++ % 2 == 1, size - 1)))
                return;
        }
    }
};

TEST_F(ReductionsBig, Big64MiBAllreduce) { big(Kind::Allreduce); }
TEST_F(ReductionsBig, Big64MiBReduceScatter) { big(Kind::ReduceScatter); }
TEST_F(ReductionsBig, Big64MiBReduce) { big(Kind::Reduce); }

/* Calls of different kinds, algorithms, sizes and types back to back, no
 * barrier between them: a fast rank's next call must never feed a slow
 * rank's current one (every comm exists before the first call). */
TEST_F(Reductions, BackToBackMixed)
{
    std::vector<std::unique_ptr<ConfigComm>> comms;
    std::vector<std::pair<Kind, std::string>> which;
    for (Kind kind : { Kind::Allreduce, Kind::ReduceScatter, Kind::Reduce })
        for (const std::string &algo : algos_of(kind)) {
            comms.emplace_back(new ConfigComm({ { algo_var(kind), algo }, { "WEFT_REDUCE_CHUNK_KB", "4" } }));
            ASSERT_EQ(comms.back()->rc(), WEFT_SUCCESS) << comms.back()->desc();
            which.emplace_back(kind, algo);
        }
    const size_t sizes[] = { 1, 5000, 3, 0, 70001, 1025, 8, 40000 };
    /* Start all calls, then check all results: buffers are kept per call. */
    struct Pending {
        Call c;
        std::unique_ptr<TestBuf> send, recv;
    };
    std::vector<Pending> pend;
    bool bad = false;
    for (size_t k = 0; k < 3 * which.size() && !bad; k++) {
        const auto &w = which[k % which.size()];
        weft_comm_t *cm = comms[k % which.size()]->get();
        const Dtype &t = kDtypes[(k * 3) % kNumDtypes];
        const int op = (int)(k % WEFT_OP_COUNT);
        const size_t count = sizes[k % 8];
        Pending p{ make_call(w.first, w.second, t, op, count, false, Mode::Exact, 5000 + k), nullptr, nullptr };
        const size_t es = t.es;
        const size_t in_elems = w.first == Kind::ReduceScatter ? (size_t)size * count : count;
        std::vector<unsigned char> input(in_elems * es);
        p.c.fill(rank, 0, in_elems, input.data());
        p.send.reset(new TestBuf(in_elems * es, TestBuf::kGuarded));
        p.recv.reset(new TestBuf(count * es, TestBuf::kGuarded));
        p.send->write(0, input.data(), input.size());
        int rc;
        if (w.first == Kind::Allreduce)
            rc = weft_allreduce(cm, p.send->data(), p.recv->data(), count, t.d, (weft_op_t)op);
        else if (w.first == Kind::ReduceScatter)
            rc = weft_reduce_scatter(cm, p.send->data(), p.recv->data(), count, t.d, (weft_op_t)op);
        else
            rc = weft_reduce(cm, p.send->data(), p.recv->data(), count, t.d, (weft_op_t)op, p.c.root);
        if (rc != WEFT_SUCCESS) {
            ADD_FAILURE() << describe(p.c) << ": " << weft_strerror(rc) << ": " << weft_comm_last_error(cm);
            bad = true;
        }
        pend.push_back(std::move(p));
    }
    record(bad, false, 0, "back-to-back calls");
    if (!flush())
        return;
    for (Pending &p : pend) {
        const bool has_out = p.c.kind != Kind::Reduce || rank == p.c.root;
        const size_t es = dtype_info(p.c.dtype).es;
        if (has_out) {
            const size_t first = p.c.kind == Kind::ReduceScatter ? (size_t)rank * p.c.count : 0;
            std::vector<unsigned char> got = p.recv->copy_to_host(0, p.c.count * es);
            std::string err = p.c.check(first, p.c.count, got.data());
            EXPECT_EQ(err, "") << describe(p.c);
        } else {
            EXPECT_TRUE(p.recv->Untouched()) << describe(p.c) << ": recvbuf off the root";
        }
        EXPECT_TRUE(p.recv->GuardsIntact()) << describe(p.c);
    }
}

/* Refused arguments: INVALID_ARG on every rank alike (so no rank starts a
 * call the others refused), the last error says why, nothing is written,
 * and the comm works afterwards. */
TEST_F(Reductions, ArgumentChecks)
{
    const size_t count = 16, es = 4;
    TestBuf send(count * es * (size_t)size, TestBuf::kGuarded), recv(count * es * (size_t)size, TestBuf::kGuarded);
    ASSERT_TRUE(send.ok() && recv.ok()) << send.error() << recv.error();
    void *s = send.data(), *r = recv.data();

    EXPECT_EQ(weft_allreduce(nullptr, s, r, count, WEFT_FLOAT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_reduce_scatter(nullptr, s, r, count, WEFT_FLOAT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_reduce(nullptr, s, r, count, WEFT_FLOAT32, WEFT_SUM, 0), WEFT_ERR_INVALID_ARG);

    /* dtype and op outside the enums */
    for (int bad : { -1, WEFT_DTYPE_COUNT, 1000 }) {
        EXPECT_EQ(weft_allreduce(comm, s, r, count, (weft_dtype_t)bad, WEFT_SUM), WEFT_ERR_INVALID_ARG) << bad;
        EXPECT_NE(last_error().find("dtype"), std::string::npos) << last_error();
        EXPECT_EQ(weft_reduce_scatter(comm, s, r, count, (weft_dtype_t)bad, WEFT_SUM), WEFT_ERR_INVALID_ARG);
        EXPECT_EQ(weft_reduce(comm, s, r, count, (weft_dtype_t)bad, WEFT_SUM, 0), WEFT_ERR_INVALID_ARG);
    }
    for (int bad : { -1, WEFT_OP_COUNT, 77 }) {
        EXPECT_EQ(weft_allreduce(comm, s, r, count, WEFT_INT32, (weft_op_t)bad), WEFT_ERR_INVALID_ARG) << bad;
        EXPECT_NE(last_error().find("op"), std::string::npos) << last_error();
        EXPECT_EQ(weft_reduce_scatter(comm, s, r, count, WEFT_INT32, (weft_op_t)bad), WEFT_ERR_INVALID_ARG);
        EXPECT_EQ(weft_reduce(comm, s, r, count, WEFT_INT32, (weft_op_t)bad, 0), WEFT_ERR_INVALID_ARG);
    }
    /* root out of range */
    for (int root : { -1, size, size + 5 }) {
        EXPECT_EQ(weft_reduce(comm, s, r, count, WEFT_INT32, WEFT_SUM, root), WEFT_ERR_INVALID_ARG) << root;
        EXPECT_NE(last_error().find("root"), std::string::npos) << last_error();
    }
    /* NULL buffers with count > 0 */
    EXPECT_EQ(weft_allreduce(comm, nullptr, r, count, WEFT_INT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("sendbuf"), std::string::npos) << last_error();
    EXPECT_EQ(weft_allreduce(comm, s, nullptr, count, WEFT_INT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("recvbuf"), std::string::npos) << last_error();
    EXPECT_EQ(weft_reduce_scatter(comm, nullptr, r, count, WEFT_INT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_reduce_scatter(comm, s, nullptr, count, WEFT_INT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_reduce(comm, nullptr, r, count, WEFT_INT32, WEFT_SUM, 0), WEFT_ERR_INVALID_ARG);
    if (size == 1) { /* elsewhere only the root would refuse it and the others wait */
        EXPECT_EQ(weft_reduce(comm, s, nullptr, count, WEFT_INT32, WEFT_SUM, 0), WEFT_ERR_INVALID_ARG);
    }
    /* Overlapping, but not the in-place form. */
    unsigned char *sb = send.data();
    EXPECT_EQ(weft_allreduce(comm, sb, sb + es, count, WEFT_FLOAT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("overlap"), std::string::npos) << last_error();
    EXPECT_EQ(weft_reduce_scatter(comm, sb, sb + es, count, WEFT_FLOAT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("overlap"), std::string::npos) << last_error();
    if (size == 1) {
        EXPECT_EQ(weft_reduce(comm, sb, sb + es, count, WEFT_FLOAT32, WEFT_SUM, 0), WEFT_ERR_INVALID_ARG);
    }
    /* count * element size (* ranks) overflowing size_t */
    EXPECT_EQ(weft_allreduce(comm, s, r, SIZE_MAX / 2, WEFT_FLOAT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_reduce_scatter(comm, s, r, SIZE_MAX / 2, WEFT_FLOAT32, WEFT_SUM), WEFT_ERR_INVALID_ARG);
    EXPECT_TRUE(send.Untouched()) << "a refused call wrote into sendbuf";
    EXPECT_TRUE(recv.Untouched()) << "a refused call wrote into recvbuf";
    EXPECT_TRUE(send.GuardsIntact());
    EXPECT_TRUE(recv.GuardsIntact());

    /* 0 elements: NULL buffers are fine, and the call completes everywhere. */
    EXPECT_EQ(weft_allreduce(comm, nullptr, nullptr, 0, WEFT_FLOAT64, WEFT_MAX), WEFT_SUCCESS) << last_error();
    EXPECT_EQ(weft_reduce_scatter(comm, nullptr, nullptr, 0, WEFT_INT8, WEFT_SUM), WEFT_SUCCESS) << last_error();
    EXPECT_EQ(weft_reduce(comm, nullptr, nullptr, 0, WEFT_UINT64, WEFT_PROD, size - 1), WEFT_SUCCESS)
        << last_error();

    /* The comm still works: a real allreduce. */
    std::vector<int32_t> mine(count, rank + 1), sum(count, -1);
    TestBuf a(count * 4), b(count * 4);
    a.write(0, mine.data(), count * 4);
    ASSERT_EQ(weft_allreduce(comm, a.data(), b.data(), count, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS) << last_error();
    b.read(0, sum.data(), count * 4);
    for (size_t i = 0; i < count; i++)
        ASSERT_EQ(sum[i], size * (size + 1) / 2) << "element " << i;
}

/* Unknown algorithm names are configuration errors at weft_comm_create:
 * INVALID_ARG on every rank; a name valid for another kind is unknown too. */
TEST_F(Reductions, UnknownAlgorithmRefused)
{
    const std::pair<const char *, const char *> bad[] = {
        { "WEFT_ALLREDUCE_ALGO", "rings" },        { "WEFT_ALLREDUCE_ALGO", "halving" },
        { "WEFT_REDUCE_SCATTER_ALGO", "rd" },      { "WEFT_REDUCE_ALGO", "rabenseifner" },
        { "WEFT_ALLTOALL_ALGO", "ring" },
    };
    for (const auto &kv : bad) {
        int rc = WEFT_SUCCESS;
        weft_comm_t *c = nullptr;
        /* The warning it prints goes to a file, not into the test log. */
        (void)capture_stderr([&] { rc = create_with(MPI_COMM_WORLD, {{kv.first, kv.second}}, &c); });
        EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG) << kv.first << "=" << kv.second;
        if (rc == WEFT_SUCCESS)
            weft_comm_destroy(c);
    }
    EXPECT_EQ(weft_barrier(comm), WEFT_SUCCESS) << last_error();
}

} // namespace
