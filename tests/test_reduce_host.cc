/*
 * The host reduction kernels (collectives/reduce_host.c) against references
 * computed here a different way:
 *   - integers in 128-bit arithmetic, wrapped to the element's width after;
 *   - float16 / bfloat16 values from their fields with ldexp, and rounding
 *     to them by searching the sorted table of every finite value for the
 *     nearest one (ties: the even bit pattern), in double precision, where
 *     the distances compared are exact;
 *   - float MIN/MAX from isnan and comparisons.
 * Every dtype x op at counts 0, 1, 7, the 16-bit block boundaries and
 * 1000003, aligned and offset by one element, out of place, dst == a,
 * dst == b and all three the same; guard bytes around dst must stay as they
 * were. Then the cases by name: wraparound, nearest-even ties, subnormals,
 * overflow to inf, NaN through MIN/MAX, avg's division.
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

extern "C" {
#include "reduce_kernel.h"
// Test hook of reduce_host.c (not in the header: tests only): nonzero keeps
// float16 on the portable conversions where F16C would be used.
int weft_reduce_host_portable_f16(int on);
}
#include "weft.h"

namespace {

const int kDtypes[] = { WEFT_INT8,    WEFT_UINT8,    WEFT_INT32,   WEFT_UINT32,  WEFT_INT64,
                        WEFT_UINT64,  WEFT_FLOAT16,  WEFT_BFLOAT16, WEFT_FLOAT32, WEFT_FLOAT64 };
const int kOps[] = { WEFT_SUM, WEFT_PROD, WEFT_MIN, WEFT_MAX, WEFT_AVG };

uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---- reference 16-bit floats ----

// A 16-bit float format: exponent bits, mantissa bits (bias 2^(e-1) - 1).
struct Fmt {
    int ebits, mbits;
    uint16_t inf() const { return (uint16_t)(((1u << ebits) - 1) << mbits); }
    uint16_t quiet() const { return (uint16_t)(1u << (mbits - 1)); }
    bool is_nan(uint16_t h) const { return (h & 0x7fff) > inf(); }
};
const Fmt kHalf = { 5, 10 }, kBf16 = { 8, 7 };

// Value of a non-NaN bit pattern from its fields.
double fields_value(const Fmt &f, uint16_t h) {
    int bias = (1 << (f.ebits - 1)) - 1;
    unsigned e = (h & 0x7fff) >> f.mbits, m = h & ((1u << f.mbits) - 1);
    double mag;
    if (e == 0)
        mag = std::ldexp((double)m, 1 - bias - f.mbits);
    else if (e == (1u << f.ebits) - 1)
        mag = std::numeric_limits<double>::infinity();
    else
        mag = std::ldexp((double)((1u << f.mbits) + m), (int)e - bias - f.mbits);
    return (h & 0x8000) ? -mag : mag;
}

// All non-negative finite values in pattern order (increasing), and the
// first pattern past them (inf) with the value the format would have there,
// 2^(bias+1), so that rounding past the largest finite value finds inf.
struct Grid {
    std::vector<double> v;
    explicit Grid(const Fmt &f) {
        for (uint32_t p = 0; p < f.inf(); p++) v.push_back(fields_value(f, (uint16_t)p));
        v.push_back(std::ldexp(1.0, 1 << (f.ebits - 1)));
    }
};

// Nearest pattern to x, ties to the even pattern; NaN: the quiet NaN with
// the top payload bits.
uint16_t ref_round(const Fmt &f, const Grid &g, float x) {
    uint32_t xb = bits_of(x);
    uint16_t sign = (uint16_t)((xb >> 16) & 0x8000);
    if (std::isnan(x))
        return (uint16_t)(sign | f.inf() | f.quiet() | ((xb & 0x7fffff) >> (23 - f.mbits)));
    double a = std::fabs((double)x);
    if (a >= g.v.back())
        return (uint16_t)(sign | f.inf());
    // Largest p with v[p] <= a; both it and p+1 exist (a < v.back()).
    size_t p = (size_t)(std::upper_bound(g.v.begin(), g.v.end(), a) - g.v.begin()) - 1;
    double below = a - g.v[p], above = g.v[p + 1] - a;  // exact in double (see the top)
    if (above < below || (above == below && (p & 1)))
        p++;
    return (uint16_t)(sign | p);
}

const Grid &half_grid() { static Grid g(kHalf); return g; }
const Grid &bf16_grid() { static Grid g(kBf16); return g; }

float ref_h2f(uint16_t h) { return (float)fields_value(kHalf, h); }  // non-NaN only
float ref_b2f(uint16_t h) { return (float)fields_value(kBf16, h); }
uint16_t ref_f2h(float x) { return ref_round(kHalf, half_grid(), x); }
uint16_t ref_f2b(float x) { return ref_round(kBf16, bf16_grid(), x); }

// ---- reference element ops ----

// Low bits of v as a T (two's complement wrap).
template <typename T> T wrap(__int128 v) {
    unsigned __int128 u = (unsigned __int128)v;
    uint64_t low = (uint64_t)u;
    T r;
    std::memcpy(&r, &low, sizeof r);  // little-endian: the low bytes
    return r;
}

template <typename T> T ref_int(int op, T x, T y) {
    switch (op) {
    case WEFT_SUM: case WEFT_AVG: return wrap<T>((__int128)x + (__int128)y);
    case WEFT_PROD: {
        // Full product modulo 2^64 (128-bit signed would overflow for 64-bit
        // operands, unsigned cannot).
        unsigned __int128 p = (unsigned __int128)(__int128)x * (unsigned __int128)(__int128)y;
        return wrap<T>((__int128)p);
    }
    case WEFT_MIN: return y < x ? y : x;
    default: return y > x ? y : x;
    }
}

// MIN/MAX: a NaN operand wins (the left one first); equal operands (+0 and
// -0 among them) give the right one.
template <typename F> F ref_float(int op, F x, F y) {
    switch (op) {
    case WEFT_SUM: case WEFT_AVG: return x + y;
    case WEFT_PROD: return x * y;
    case WEFT_MIN: return std::isnan(x) ? x : std::isnan(y) ? y : x < y ? x : y;
    default: return std::isnan(x) ? x : std::isnan(y) ? y : x > y ? x : y;
    }
}

uint16_t ref_16(const Fmt &f, int op, uint16_t x, uint16_t y) {
    bool half = f.ebits == kHalf.ebits;
    if ((op == WEFT_MIN || op == WEFT_MAX) && (f.is_nan(x) || f.is_nan(y)))
        return (uint16_t)((f.is_nan(x) ? x : y) | f.quiet());
    if (f.is_nan(x) || f.is_nan(y))
        return (uint16_t)(f.inf() | f.quiet());  // some NaN; compared as "a NaN"
    float fx = half ? ref_h2f(x) : ref_b2f(x), fy = half ? ref_h2f(y) : ref_b2f(y);
    float r = ref_float(op, fx, fy);
    return half ? ref_f2h(r) : ref_f2b(r);
}

// ---- buffers ----

// 64-byte aligned bytes with guard bytes on both sides of the data.
struct Buf {
    static constexpr size_t kGuard = 64;
    static constexpr unsigned char kFill = 0xa5;
    Buf(size_t bytes, size_t offset) : bytes_(bytes), offset_(offset) {
        total_ = (kGuard + offset + bytes + kGuard + 63) / 64 * 64;
        mem_ = static_cast<unsigned char *>(std::aligned_alloc(64, total_));
        std::memset(mem_, kFill, total_);
    }
    ~Buf() { std::free(mem_); }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    unsigned char *data() { return mem_ + kGuard + offset_; }
    bool guards_intact() const {
        for (size_t i = 0; i < kGuard + offset_; i++)
            if (mem_[i] != kFill) return false;
        for (size_t i = kGuard + offset_ + bytes_; i < total_; i++)
            if (mem_[i] != kFill) return false;
        return true;
    }
    size_t bytes_, offset_, total_;
    unsigned char *mem_;
};

// ---- random inputs ----

struct Gen {
    std::mt19937_64 rng{ 0x5eed0f11u };
    uint64_t u() { return rng(); }

    template <typename F> F real() {
        using I = typename std::conditional<sizeof(F) == 4, uint32_t, uint64_t>::type;
        uint64_t r = u();
        F v;
        I bits;
        switch (r % 64) {
        case 0:  // NaN, quiet or signaling, random payload and sign
            bits = (I)(sizeof(F) == 4 ? 0x7f800000u | ((r >> 8) & 0x7fffff) : 0x7ff0000000000000ull | (r >> 12));
            if ((bits << (sizeof(F) == 4 ? 9 : 12)) == 0) bits |= 1;  // not inf
            if (r & 0x80) bits |= (I)1 << (sizeof(F) * 8 - 1);
            std::memcpy(&v, &bits, sizeof v);
            return v;
        case 1: return (r & 0x100) ? std::numeric_limits<F>::infinity() : -std::numeric_limits<F>::infinity();
        case 2: return (r & 0x100) ? (F)0 : -(F)0;
        case 3: return std::numeric_limits<F>::denorm_min() * (F)(int)((r >> 8) % 1000 + 1);
        case 4: return std::numeric_limits<F>::max() / (F)(int)((r >> 8) % 7 + 1);
        default: {
            double m = (double)(r >> 11) * 0x1p-53;  // [0, 1)
            int e = (int)((r >> 2) % 41) - 20;
            v = (F)std::ldexp(1.0 + m, e);
            return (r & 2) ? -v : v;
        }
        }
    }

    // Half the time any bit pattern (NaN, inf, subnormals included), half the
    // time a value of moderate size, so sums and products round.
    uint16_t bits16(const Fmt &f) {
        uint64_t r = u();
        if (r & 1) return (uint16_t)(r >> 8);
        int bias = (1 << (f.ebits - 1)) - 1;
        unsigned e = (unsigned)(bias - 6 + (int)((r >> 8) % 13));
        return (uint16_t)(((r >> 24) & 0x8000) | (e << f.mbits) | ((r >> 32) & ((1u << f.mbits) - 1)));
    }

    void fill(int dtype, void *p, size_t n) {
        for (size_t i = 0; i < n; i++) {
            switch (dtype) {
            case WEFT_INT8: case WEFT_UINT8: static_cast<uint8_t *>(p)[i] = (uint8_t)u(); break;
            case WEFT_INT32: case WEFT_UINT32: static_cast<uint32_t *>(p)[i] = (uint32_t)u(); break;
            case WEFT_INT64: case WEFT_UINT64: static_cast<uint64_t *>(p)[i] = u(); break;
            case WEFT_FLOAT16: static_cast<uint16_t *>(p)[i] = bits16(kHalf); break;
            case WEFT_BFLOAT16: static_cast<uint16_t *>(p)[i] = bits16(kBf16); break;
            case WEFT_FLOAT32: static_cast<float *>(p)[i] = real<float>(); break;
            case WEFT_FLOAT64: static_cast<double *>(p)[i] = real<double>(); break;
            }
        }
    }
};

// ---- reference over arrays, and the comparison ----

template <typename T> void ref_ints(int op, const void *a, const void *b, void *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        static_cast<T *>(out)[i] = ref_int<T>(op, static_cast<const T *>(a)[i], static_cast<const T *>(b)[i]);
}

template <typename F> void ref_floats(int op, const void *a, const void *b, void *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        static_cast<F *>(out)[i] = ref_float<F>(op, static_cast<const F *>(a)[i], static_cast<const F *>(b)[i]);
}

void ref_reduce(int dtype, int op, const void *a, const void *b, void *out, size_t n) {
    switch (dtype) {
    case WEFT_INT8: ref_ints<int8_t>(op, a, b, out, n); break;
    case WEFT_UINT8: ref_ints<uint8_t>(op, a, b, out, n); break;
    case WEFT_INT32: ref_ints<int32_t>(op, a, b, out, n); break;
    case WEFT_UINT32: ref_ints<uint32_t>(op, a, b, out, n); break;
    case WEFT_INT64: ref_ints<int64_t>(op, a, b, out, n); break;
    case WEFT_UINT64: ref_ints<uint64_t>(op, a, b, out, n); break;
    case WEFT_FLOAT32: ref_floats<float>(op, a, b, out, n); break;
    case WEFT_FLOAT64: ref_floats<double>(op, a, b, out, n); break;
    case WEFT_FLOAT16: case WEFT_BFLOAT16: {
        const Fmt &f = dtype == WEFT_FLOAT16 ? kHalf : kBf16;
        for (size_t i = 0; i < n; i++)
            static_cast<uint16_t *>(out)[i] =
                ref_16(f, op, static_cast<const uint16_t *>(a)[i], static_cast<const uint16_t *>(b)[i]);
        break;
    }
    }
}

bool elem_is_nan(int dtype, const unsigned char *p) {
    switch (dtype) {
    case WEFT_FLOAT16: { uint16_t h; std::memcpy(&h, p, 2); return kHalf.is_nan(h); }
    case WEFT_BFLOAT16: { uint16_t h; std::memcpy(&h, p, 2); return kBf16.is_nan(h); }
    case WEFT_FLOAT32: { float f; std::memcpy(&f, p, 4); return std::isnan(f); }
    case WEFT_FLOAT64: { double d; std::memcpy(&d, p, 8); return std::isnan(d); }
    default: return false;
    }
}

std::string hex(const unsigned char *p, size_t es) {
    std::string s = "0x";
    static const char *d = "0123456789abcdef";
    for (size_t i = es; i-- > 0;) { s += d[p[i] >> 4]; s += d[p[i] & 15]; }
    return s;
}

// Element-wise comparison: bit-exact, except that where SUM/PROD (or a
// division) of a NaN is expected, any NaN will do (which payload survives
// an addition of two NaNs is the hardware's business). Reports the first
// mismatch.
::testing::AssertionResult same_elems(int dtype, int op, const void *got, const void *want, size_t n,
                                      const void *a = nullptr, const void *b = nullptr) {
    size_t es = weft_dtype_size(dtype);
    auto *g = static_cast<const unsigned char *>(got), *w = static_cast<const unsigned char *>(want);
    bool any_nan = op != WEFT_MIN && op != WEFT_MAX;
    for (size_t i = 0; i < n; i++) {
        if (std::memcmp(g + i * es, w + i * es, es) == 0) continue;
        if (any_nan && elem_is_nan(dtype, w + i * es) && elem_is_nan(dtype, g + i * es)) continue;
        auto r = ::testing::AssertionFailure();
        r << weft_dtype_name(dtype) << " " << weft_op_name(op) << " element " << i << " of " << n << ": got "
          << hex(g + i * es, es) << ", want " << hex(w + i * es, es);
        if (a && b)
            r << " (a " << hex(static_cast<const unsigned char *>(a) + i * es, es) << ", b "
              << hex(static_cast<const unsigned char *>(b) + i * es, es) << ")";
        return r;
    }
    return ::testing::AssertionSuccess();
}

// Restores the F16C choice at the end of a scope.
struct PortableF16 {
    explicit PortableF16(int on) : prev(weft_reduce_host_portable_f16(on)) {}
    ~PortableF16() { weft_reduce_host_portable_f16(prev); }
    int prev;
};

// ---- the sweep ----

enum Mode { OUT_OF_PLACE, DST_IS_A, DST_IS_B, ALL_SAME };
const char *mode_name(int m) {
    static const char *n[] = { "out of place", "dst == a", "dst == b", "dst == a == b" };
    return n[m];
}

// One dtype x op x count x offset in every aliasing mode.
void check_reduce(Gen &gen, int dtype, int op, size_t count, size_t offset_elems) {
    size_t es = weft_dtype_size(dtype), bytes = count * es, off = offset_elems * es;
    SCOPED_TRACE(std::string(weft_dtype_name(dtype)) + " " + weft_op_name(op) + " count " + std::to_string(count) +
                 " offset " + std::to_string(offset_elems));
    std::vector<unsigned char> a(bytes + 1), b(bytes + 1), want(bytes + 1), want_self(bytes + 1);
    gen.fill(dtype, a.data(), count);
    gen.fill(dtype, b.data(), count);
    ref_reduce(dtype, op, a.data(), b.data(), want.data(), count);
    ref_reduce(dtype, op, a.data(), a.data(), want_self.data(), count);
    for (int mode = OUT_OF_PLACE; mode <= ALL_SAME; mode++) {
        SCOPED_TRACE(mode_name(mode));
        Buf ba(bytes, off), bb(bytes, off), bd(bytes, off);
        std::memcpy(ba.data(), a.data(), bytes);
        std::memcpy(bb.data(), mode == ALL_SAME ? a.data() : b.data(), bytes);
        void *dst = mode == DST_IS_A || mode == ALL_SAME ? ba.data() : mode == DST_IS_B ? bb.data() : bd.data();
        const void *pb = mode == ALL_SAME ? ba.data() : bb.data();
        weft_reduce_host(dst, ba.data(), pb, count, dtype, op);
        const void *w = mode == ALL_SAME ? want_self.data() : want.data();
        ASSERT_TRUE(same_elems(dtype, op, dst, w, count, a.data(), mode == ALL_SAME ? a.data() : b.data()));
        EXPECT_TRUE(ba.guards_intact() && bb.guards_intact() && bd.guards_intact());
        if (mode == OUT_OF_PLACE) {  // the inputs are only read
            EXPECT_EQ(0, std::memcmp(ba.data(), a.data(), bytes));
            EXPECT_EQ(0, std::memcmp(bb.data(), b.data(), bytes));
        }
        if (mode == DST_IS_B) {
            EXPECT_EQ(0, std::memcmp(ba.data(), a.data(), bytes));
        }
    }
}

// Counts: the required ones, vector widths +-1, and the float16 paths'
// block (512 elements) +-1.
const size_t kCounts[] = { 0, 1, 7, 15, 16, 17, 63, 511, 512, 513, 1025, 1000003 };

TEST(ReduceHost, EveryDtypeAndOp) {
    Gen gen;
    for (int dtype : kDtypes)
        for (int op : kOps)
            for (size_t count : kCounts)
                for (size_t off : { 0, 1 }) {
                    if (count == 1000003 && off == 0) continue;  // time: unaligned is the harder case
                    check_reduce(gen, dtype, op, count, off);
                    if (HasFatalFailure()) return;
                }
}

// float16 again with the portable conversions, where F16C took the sweep above.
TEST(ReduceHost, Float16PortablePath) {
    PortableF16 portable(1);
    Gen gen;
    for (int op : kOps)
        for (size_t count : kCounts) {
            check_reduce(gen, WEFT_FLOAT16, op, count, 1);
            if (HasFatalFailure()) return;
        }
}

// ---- names and sizes ----

TEST(ReduceHost, NamesAndSizes) {
    const size_t sizes[] = { 1, 1, 4, 4, 8, 8, 2, 2, 4, 8 };
    const char *names[] = { "int8", "uint8", "int32", "uint32", "int64",
                            "uint64", "float16", "bfloat16", "float32", "float64" };
    for (int d = 0; d < WEFT_DTYPE_COUNT; d++) {
        EXPECT_EQ(sizes[d], weft_dtype_size(d));
        EXPECT_STREQ(names[d], weft_dtype_name(d));
    }
    EXPECT_EQ(0u, weft_dtype_size(-1));
    EXPECT_EQ(0u, weft_dtype_size(WEFT_DTYPE_COUNT));
    EXPECT_STREQ("?", weft_dtype_name(WEFT_DTYPE_COUNT));
    EXPECT_STREQ("?", weft_dtype_name(-1));
    const char *ops[] = { "sum", "prod", "min", "max", "avg" };
    for (int o = 0; o < WEFT_OP_COUNT; o++) EXPECT_STREQ(ops[o], weft_op_name(o));
    EXPECT_STREQ("?", weft_op_name(WEFT_OP_COUNT));
    EXPECT_STREQ("?", weft_op_name(-1));
}

// ---- integer wraparound ----

template <typename T> T reduce1(int dtype, int op, T x, T y) {
    T r;
    weft_reduce_host(&r, &x, &y, 1, dtype, op);
    return r;
}

TEST(ReduceHost, IntegersWrap) {
    EXPECT_EQ(-128, reduce1<int8_t>(WEFT_INT8, WEFT_SUM, 127, 1));
    EXPECT_EQ(127, reduce1<int8_t>(WEFT_INT8, WEFT_SUM, -128, -1));
    EXPECT_EQ(-128, reduce1<int8_t>(WEFT_INT8, WEFT_PROD, -128, -1));
    EXPECT_EQ(0, reduce1<uint8_t>(WEFT_UINT8, WEFT_SUM, 255, 1));
    EXPECT_EQ(1, reduce1<uint8_t>(WEFT_UINT8, WEFT_PROD, 255, 255));  // 65025 = 254 * 256 + 1
    EXPECT_EQ(INT32_MIN, reduce1<int32_t>(WEFT_INT32, WEFT_SUM, INT32_MAX, 1));
    EXPECT_EQ(0, reduce1<int32_t>(WEFT_INT32, WEFT_PROD, 65536, 65536));
    EXPECT_EQ(-2, reduce1<int32_t>(WEFT_INT32, WEFT_PROD, INT32_MAX, 2));
    EXPECT_EQ(INT32_MIN, reduce1<int32_t>(WEFT_INT32, WEFT_PROD, INT32_MIN, -1));
    EXPECT_EQ(1u, reduce1<uint32_t>(WEFT_UINT32, WEFT_PROD, 0xffffffffu, 0xffffffffu));
    EXPECT_EQ(0u, reduce1<uint64_t>(WEFT_UINT64, WEFT_SUM, UINT64_MAX, 1));
    EXPECT_EQ(1u, reduce1<uint64_t>(WEFT_UINT64, WEFT_PROD, UINT64_MAX, UINT64_MAX));
    EXPECT_EQ(INT64_MAX, reduce1<int64_t>(WEFT_INT64, WEFT_SUM, INT64_MIN, -1));
    EXPECT_EQ(INT64_MIN, reduce1<int64_t>(WEFT_INT64, WEFT_PROD, INT64_MIN, -1));
    // MIN/MAX compare with the element's signedness.
    EXPECT_EQ(-1, reduce1<int8_t>(WEFT_INT8, WEFT_MIN, -1, 1));
    EXPECT_EQ(255, reduce1<uint8_t>(WEFT_UINT8, WEFT_MAX, 255, 1));
    EXPECT_EQ(INT64_MIN, reduce1<int64_t>(WEFT_INT64, WEFT_MIN, INT64_MIN, INT64_MAX));
    EXPECT_EQ(UINT64_MAX, reduce1<uint64_t>(WEFT_UINT64, WEFT_MAX, UINT64_MAX, 0));
}

// ---- conversions ----

TEST(ReduceHost, HalfToFloatEveryValue) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        float got = weft_half_to_float((uint16_t)h);
        if (kHalf.is_nan((uint16_t)h)) {
            // NaN, sign and payload kept (the payload's top bits, where float16's go).
            ASSERT_TRUE(std::isnan(got)) << std::hex << h;
            EXPECT_EQ((uint32_t)(h & 0x8000) << 16, bits_of(got) & 0x80000000u) << std::hex << h;
            EXPECT_EQ(h & 0x3ffu, (bits_of(got) >> 13) & 0x3ffu) << std::hex << h;
        } else {
            ASSERT_EQ(bits_of(ref_h2f((uint16_t)h)), bits_of(got)) << std::hex << h;
        }
    }
}

TEST(ReduceHost, Bf16ToFloatEveryValue) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        float got = weft_bf16_to_float((uint16_t)h);
        if (kBf16.is_nan((uint16_t)h)) {
            ASSERT_TRUE(std::isnan(got)) << std::hex << h;
            EXPECT_EQ(h << 16, bits_of(got)) << std::hex << h;
        } else {
            ASSERT_EQ(bits_of(ref_b2f((uint16_t)h)), bits_of(got)) << std::hex << h;
        }
    }
}

// Every value of the format, the midpoints to the next one (the ties) and
// the floats either side of each, and a stride through all 2^32 floats.
void sweep_rounding(const Fmt &f, const Grid &g, uint16_t (*conv)(float), uint16_t (*ref)(float)) {
    auto check = [&](float x) {
        uint16_t got = conv(x), want = ref(x);
        if (got != want)
            FAIL() << "float " << std::hexfloat << x << " (0x" << std::hex << bits_of(x) << "): got 0x" << got
                   << ", want 0x" << want;
    };
    for (uint32_t p = 0; p < f.inf(); p++) {
        // g.v[p + 1] past the largest finite value is where inf would be.
        double lo = g.v[p], hi = g.v[p + 1];
        float mid = (float)((lo + hi) / 2);  // exact: needs one bit more than the format
        ASSERT_EQ((double)mid, (lo + hi) / 2);
        for (float x : { (float)lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY) }) {
            check(x);
            check(-x);
            if (::testing::Test::HasFatalFailure()) return;
        }
    }
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        check(float_of((uint32_t)u));
        if (::testing::Test::HasFatalFailure()) return;
    }
}

TEST(ReduceHost, FloatToHalfSweep) {
    sweep_rounding(kHalf, half_grid(), weft_float_to_half, ref_f2h);
}

TEST(ReduceHost, FloatToBf16Sweep) {
    sweep_rounding(kBf16, bf16_grid(), weft_float_to_bf16, ref_f2b);
}

TEST(ReduceHost, FloatToHalfCases) {
    // Ties go to the even mantissa.
    EXPECT_EQ(0x3c00, weft_float_to_half(1.0f + 0x1p-11f));      // 1 + half an ulp -> 1
    EXPECT_EQ(0x3c02, weft_float_to_half(1.0f + 3 * 0x1p-11f));  // 1 + 1.5 ulp -> 1 + 2 ulp
    EXPECT_EQ(0x3c01, weft_float_to_half(1.0f + 0x1p-11f + 0x1p-20f));  // above the tie
    EXPECT_EQ(0x6800, weft_float_to_half(2049.0f));              // 2048 | 2050
    EXPECT_EQ(0x6802, weft_float_to_half(2051.0f));              // 2050 | 2052
    // Subnormals: 2^-24 is the smallest.
    EXPECT_EQ(0x0001, weft_float_to_half(0x1p-24f));
    EXPECT_EQ(0x0000, weft_float_to_half(0x1p-25f));             // tie with 0 -> 0
    EXPECT_EQ(0x0001, weft_float_to_half(0x1.000002p-25f));      // just above the tie
    EXPECT_EQ(0x0002, weft_float_to_half(3 * 0x1p-25f));         // 1.5 -> 2
    EXPECT_EQ(0x0002, weft_float_to_half(5 * 0x1p-25f));         // 2.5 -> 2
    EXPECT_EQ(0x03ff, weft_float_to_half(0x3ffp-24f));           // largest subnormal
    EXPECT_EQ(0x0400, weft_float_to_half(0x7ffp-25f));           // tie 0x3ff | 0x400 -> even
    EXPECT_EQ(0x8001, weft_float_to_half(-0x1p-24f));
    EXPECT_EQ(0x8000, weft_float_to_half(-0x1p-26f));
    EXPECT_EQ(0x0000, weft_float_to_half(std::numeric_limits<float>::denorm_min()));
    // Overflow: 65504 is the largest; 65520 is the tie with 2^16, odd -> inf.
    EXPECT_EQ(0x7bff, weft_float_to_half(65504.0f));
    EXPECT_EQ(0x7bff, weft_float_to_half(65519.996f));
    EXPECT_EQ(0x7c00, weft_float_to_half(65520.0f));
    EXPECT_EQ(0xfc00, weft_float_to_half(-65520.0f));
    EXPECT_EQ(0x7c00, weft_float_to_half(1e10f));
    EXPECT_EQ(0x7c00, weft_float_to_half(INFINITY));
    EXPECT_EQ(0xfc00, weft_float_to_half(-INFINITY));
    EXPECT_EQ(0x8000, weft_float_to_half(-0.0f));
    // NaN stays NaN (quiet), even with the payload only in the dropped bits.
    EXPECT_EQ(0x7e00, weft_float_to_half(float_of(0x7fc00000u)));
    EXPECT_EQ(0x7e00, weft_float_to_half(float_of(0x7f800001u)));
    EXPECT_EQ(0xfe00, weft_float_to_half(float_of(0xff800001u)));
    EXPECT_EQ(0x7e01, weft_float_to_half(float_of(0x7f802000u)));
}

TEST(ReduceHost, FloatToBf16Cases) {
    EXPECT_EQ(0x3f80, weft_float_to_bf16(1.0f + 0x1p-8f));       // tie -> even (1)
    EXPECT_EQ(0x3f82, weft_float_to_bf16(1.0f + 3 * 0x1p-8f));   // tie -> even (1 + 2 ulp)
    EXPECT_EQ(0x3f81, weft_float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f));
    EXPECT_EQ(0x0000, weft_float_to_bf16(float_of(0x00008000u)));  // subnormal tie -> 0
    EXPECT_EQ(0x0002, weft_float_to_bf16(float_of(0x00018000u)));  // subnormal tie -> even
    EXPECT_EQ(0x0001, weft_float_to_bf16(float_of(0x00008001u)));
    EXPECT_EQ(0x7f7f, weft_float_to_bf16(float_of(0x7f7f7fffu)));  // below the last tie
    EXPECT_EQ(0x7f80, weft_float_to_bf16(float_of(0x7f7f8000u)));  // the tie: odd -> inf
    EXPECT_EQ(0x7f80, weft_float_to_bf16(std::numeric_limits<float>::max()));
    EXPECT_EQ(0xff80, weft_float_to_bf16(-std::numeric_limits<float>::max()));
    EXPECT_EQ(0x8000, weft_float_to_bf16(-0.0f));
    EXPECT_EQ(0x7fc0, weft_float_to_bf16(float_of(0x7f800001u)));  // not inf
    EXPECT_EQ(0xffc0, weft_float_to_bf16(float_of(0xffc00000u)));
    EXPECT_EQ(0x7fc1, weft_float_to_bf16(float_of(0x7f81ffffu)));  // not rounded into the exponent
}

// ---- rounding and specials through the reduction ----

TEST(ReduceHost, HalfReductionRoundsEachStep) {
    for (int portable : { 0, 1 }) {
        PortableF16 p(portable);
        SCOPED_TRACE(portable ? "portable" : "F16C where present");
        // a: 2048, 2050, 1, 65504, 65504, subnormal 2^-24, 2^-24, -0, 1;
        // b: 1, 1, 2^-11, 8, 16, 2^-24, -2^-24, +0, 2^-11 (1 + 2^-10)
        const uint16_t a[] = { 0x6800, 0x6801, 0x3c00, 0x7bff, 0x7bff, 0x0001, 0x0001, 0x8000, 0x3c00 };
        const uint16_t b[] = { 0x3c00, 0x3c00, 0x1000, 0x4800, 0x4c00, 0x0001, 0x8001, 0x0000, 0x1001 };
        // 2049 -> 2048; 2051 -> 2052; 1 + 2^-11 (tie) -> 1; 65512 -> 65504;
        // 65520 (tie) -> inf; 2^-23; +0 (x + -x); -0 + +0 = +0; 1 + 2^-11 + eps -> up
        const uint16_t want[] = { 0x6800, 0x6802, 0x3c00, 0x7bff, 0x7c00, 0x0002, 0x0000, 0x0000, 0x3c01 };
        const size_t n = sizeof a / 2;
        uint16_t got[n];
        weft_reduce_host(got, a, b, n, WEFT_FLOAT16, WEFT_SUM);
        EXPECT_TRUE(same_elems(WEFT_FLOAT16, WEFT_SUM, got, want, n, a, b));
        // bf16: 256 + 1 -> tie -> 256; 258 + 1 -> 260.
        const uint16_t ba[] = { 0x4380, 0x4381 }, bb[] = { 0x3f80, 0x3f80 }, bw[] = { 0x4380, 0x4382 };
        uint16_t bg[2];
        weft_reduce_host(bg, ba, bb, 2, WEFT_BFLOAT16, WEFT_SUM);
        EXPECT_TRUE(same_elems(WEFT_BFLOAT16, WEFT_SUM, bg, bw, 2, ba, bb));
    }
}

// A NaN in either operand, at every position of a vector-sized array.
template <typename F> void nan_minmax(int dtype) {
    const size_t n = 37;
    for (int op : { WEFT_MIN, WEFT_MAX })
        for (size_t pos = 0; pos < n; pos++)
            for (int which = 0; which < 2; which++) {
                std::vector<F> a(n), b(n), d(n);
                for (size_t i = 0; i < n; i++) {
                    a[i] = (F)(i % 5) - (F)2;
                    b[i] = (F)(i % 3) - (F)1;
                }
                (which ? b : a)[pos] = std::numeric_limits<F>::quiet_NaN();
                (which ? a : b)[pos] = op == WEFT_MIN ? -std::numeric_limits<F>::infinity()
                                                      : std::numeric_limits<F>::infinity();
                weft_reduce_host(d.data(), a.data(), b.data(), n, dtype, op);
                for (size_t i = 0; i < n; i++) {
                    if (i == pos)
                        ASSERT_TRUE(std::isnan(d[i])) << weft_op_name(op) << " at " << pos;
                    else
                        ASSERT_EQ(op == WEFT_MIN ? std::min(a[i], b[i]) : std::max(a[i], b[i]), d[i]);
                }
            }
}

TEST(ReduceHost, NanPropagatesThroughMinMax) {
    nan_minmax<float>(WEFT_FLOAT32);
    nan_minmax<double>(WEFT_FLOAT64);
    for (int portable : { 0, 1 }) {
        PortableF16 p(portable);
        for (int dtype : { WEFT_FLOAT16, WEFT_BFLOAT16 }) {
            const Fmt &f = dtype == WEFT_FLOAT16 ? kHalf : kBf16;
            uint16_t one = dtype == WEFT_FLOAT16 ? 0x3c00 : 0x3f80, nan = (uint16_t)(f.inf() | f.quiet() | 5);
            uint16_t ninf = (uint16_t)(0x8000 | f.inf());
            const uint16_t a[] = { nan, one, nan, ninf, f.inf() };
            const uint16_t b[] = { one, nan, ninf, nan, nan };
            for (int op : { WEFT_MIN, WEFT_MAX }) {
                uint16_t d[5];
                weft_reduce_host(d, a, b, 5, dtype, op);
                for (int i = 0; i < 5; i++)
                    EXPECT_EQ(nan, d[i]) << weft_dtype_name(dtype) << " " << weft_op_name(op) << " " << i;
            }
        }
    }
    // A NaN's own bits: the left NaN wins, payload and sign kept.
    float n1 = float_of(0x7fc00001u), n2 = float_of(0xffc00002u), r;
    weft_reduce_host(&r, &n1, &n2, 1, WEFT_FLOAT32, WEFT_MIN);
    EXPECT_EQ(0x7fc00001u, bits_of(r));
    weft_reduce_host(&r, &n2, &n1, 1, WEFT_FLOAT32, WEFT_MAX);
    EXPECT_EQ(0xffc00002u, bits_of(r));
}

// ---- avg's division ----

template <typename T> T ref_div_int(T x, int n) {
    if (std::is_signed<T>::value) return (T)((int64_t)x / (int64_t)n);
    return (T)((uint64_t)x / (uint64_t)n);
}

void ref_div(int dtype, const void *src, void *out, size_t count, int n) {
    for (size_t i = 0; i < count; i++) {
        switch (dtype) {
#define INT_CASE(D, T)                                                                                             \
    case D: static_cast<T *>(out)[i] = ref_div_int<T>(static_cast<const T *>(src)[i], n); break;
        INT_CASE(WEFT_INT8, int8_t)
        INT_CASE(WEFT_UINT8, uint8_t)
        INT_CASE(WEFT_INT32, int32_t)
        INT_CASE(WEFT_UINT32, uint32_t)
        INT_CASE(WEFT_INT64, int64_t)
        INT_CASE(WEFT_UINT64, uint64_t)
#undef INT_CASE
        case WEFT_FLOAT32: static_cast<float *>(out)[i] = static_cast<const float *>(src)[i] / (float)n; break;
        case WEFT_FLOAT64: static_cast<double *>(out)[i] = static_cast<const double *>(src)[i] / (double)n; break;
        case WEFT_FLOAT16: case WEFT_BFLOAT16: {
            bool half = dtype == WEFT_FLOAT16;
            const Fmt &f = half ? kHalf : kBf16;
            uint16_t x = static_cast<const uint16_t *>(src)[i];
            uint16_t r;
            if (f.is_nan(x))
                r = (uint16_t)(f.inf() | f.quiet());  // a NaN, compared as any NaN
            else {
                float q = (half ? ref_h2f(x) : ref_b2f(x)) / (float)n;
                r = half ? ref_f2h(q) : ref_f2b(q);
            }
            static_cast<uint16_t *>(out)[i] = r;
            break;
        }
        }
    }
}

TEST(ReduceHost, DivEveryDtype) {
    Gen gen;
    for (int portable : { 0, 1 }) {
        PortableF16 p(portable);
        for (int dtype : kDtypes) {
            if (portable && dtype != WEFT_FLOAT16) continue;
            for (size_t count : kCounts)
                for (int n : { 1, 2, 3, 7, 1000, 2147483647 }) {
                    if (count == 1000003 && n != 3) continue;
                    size_t es = weft_dtype_size(dtype), bytes = count * es;
                    SCOPED_TRACE(std::string(weft_dtype_name(dtype)) + " count " + std::to_string(count) + " n " +
                                 std::to_string(n) + (portable ? " portable" : ""));
                    std::vector<unsigned char> src(bytes + 1), want(bytes + 1);
                    gen.fill(dtype, src.data(), count);
                    ref_div(dtype, src.data(), want.data(), count, n);
                    for (int in_place = 0; in_place < 2; in_place++) {
                        Buf s(bytes, es), d(bytes, es);  // offset by one element
                        std::memcpy(s.data(), src.data(), bytes);
                        void *dst = in_place ? s.data() : d.data();
                        weft_reduce_host_div(dst, s.data(), count, dtype, n);
                        ASSERT_TRUE(same_elems(dtype, WEFT_AVG, dst, want.data(), count, src.data(), src.data()))
                            << (in_place ? "in place" : "out of place");
                        EXPECT_TRUE(s.guards_intact() && d.guards_intact());
                        if (!in_place) EXPECT_EQ(0, std::memcmp(s.data(), src.data(), bytes));
                    }
                }
        }
    }
}

TEST(ReduceHost, DivTruncatesTowardZero) {
    int32_t i32[] = { -7, 7, -8, -1, 1, INT32_MIN, INT32_MAX }, o32[7];
    weft_reduce_host_div(o32, i32, 7, WEFT_INT32, 2);
    const int32_t w32[] = { -3, 3, -4, 0, 0, INT32_MIN / 2, INT32_MAX / 2 };
    for (int i = 0; i < 7; i++) EXPECT_EQ(w32[i], o32[i]) << i;
    int8_t i8[] = { -128, 127, -7, -1 };
    weft_reduce_host_div(i8, i8, 4, WEFT_INT8, 3);
    EXPECT_EQ(-42, i8[0]);
    EXPECT_EQ(42, i8[1]);
    EXPECT_EQ(-2, i8[2]);
    EXPECT_EQ(0, i8[3]);
    int64_t i64[] = { -7, INT64_MIN, INT64_MAX };
    weft_reduce_host_div(i64, i64, 3, WEFT_INT64, 2);
    EXPECT_EQ(-3, i64[0]);
    EXPECT_EQ(INT64_MIN / 2, i64[1]);
    EXPECT_EQ(INT64_MAX / 2, i64[2]);
    uint64_t u64 = UINT64_MAX;
    weft_reduce_host_div(&u64, &u64, 1, WEFT_UINT64, 3);
    EXPECT_EQ(UINT64_MAX / 3, u64);
    uint32_t u32 = UINT32_MAX;
    weft_reduce_host_div(&u32, &u32, 1, WEFT_UINT32, 7);
    EXPECT_EQ(UINT32_MAX / 7, u32);
}

// avg of float16 the way an allreduce does it: SUM step by step (rounding
// after each), then one division.
TEST(ReduceHost, AvgOfFloat16) {
    for (int portable : { 0, 1 }) {
        PortableF16 p(portable);
        // Three ranks' values; rank order fixed.
        const uint16_t r0[] = { 0x3c00, 0x4000, 0x6800, 0x3c00, 0x7bff };  // 1, 2, 2048, 1, 65504
        const uint16_t r1[] = { 0x4000, 0x4000, 0x3c00, 0x3c00, 0x7bff };  // 2, 2, 1, 1, 65504
        const uint16_t r2[] = { 0x4000, 0x4200, 0x3c00, 0x3c00, 0xfbff };  // 2, 3, 1, 1, -65504
        uint16_t acc[5];
        weft_reduce_host(acc, r0, r1, 5, WEFT_FLOAT16, WEFT_AVG);
        weft_reduce_host(acc, acc, r2, 5, WEFT_FLOAT16, WEFT_AVG);
        weft_reduce_host_div(acc, acc, 5, WEFT_FLOAT16, 3);
        // 5/3 -> nearest half; 7/3; (2048+1 -> 2048, +1 -> 2048)/3 = 682.67 -> 682.5;
        // 3/3 = 1; 65504 + 65504 = inf in float16, inf - 65504 = inf, /3 = inf.
        const uint16_t want[] = { ref_f2h(5.0f / 3.0f), ref_f2h(7.0f / 3.0f), ref_f2h(2048.0f / 3.0f), 0x3c00,
                                  0x7c00 };
        EXPECT_EQ(0x3eab, want[0]);  // the reference itself: 1.6669921875
        EXPECT_EQ(0x6155, want[2]);  // 682.5
        EXPECT_TRUE(same_elems(WEFT_FLOAT16, WEFT_AVG, acc, want, 5));
    }
}

}  // namespace
