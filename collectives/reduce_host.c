/*
 * Host reduction kernels (semantics in reduce_kernel.h): one plain loop per
 * (element type, operation), written so that GCC vectorizes it, and built
 * three times (AVX-512F, AVX2, baseline x86-64) with the copy for this CPU
 * picked once at load time (target_clones makes an ifunc resolver; the
 * kernels are static, so nothing new leaves libweft.so).
 *
 *     weft_reduce_host(dst, a, b, count, dtype, op)
 *        |
 *        +-- switch (dtype, op) --> k_<type>_<op>(dst, a, b, count)
 *                                      |  resolved once per process:
 *                                      +-- .avx512f   64-byte vectors
 *                                      +-- .avx2      32-byte vectors
 *                                      +-- .default   16-byte (SSE2)
 *
 *     every loop:  for i < n:  x = a[i]; y = b[i]; dst[i] = x OP y;
 *
 * Aliasing: dst may be exactly a or b (in-place accumulation is what the
 * collectives do most), never a partial overlap. Element i is read before
 * element i is written and no iteration touches another's element, so there
 * is no loop-carried dependence even when dst == a; `#pragma GCC ivdep`
 * tells the vectorizer so. (With restrict that would be a lie when dst == a,
 * and without either GCC adds a run-time overlap check that sends the
 * in-place case to the scalar loop.)
 *
 * Integers: SUM and PROD run on the unsigned type of the same width, which
 * wraps by definition (signed overflow would be undefined behaviour), and
 * the bit patterns of two's complement sums and products are the same as
 * the unsigned ones, so INT8 and UINT8 share a kernel, and so on. MIN/MAX
 * compare in the element's own signedness.
 *
 * Floats: MIN is (x < y || x != x) ? x : y, MAX likewise with >. If x is
 * NaN the result is x, else if y is NaN it is y (the comparison is false),
 * so a NaN is never dropped, and the result only depends on the operand
 * order, never on the vector width. Zeros compare equal: min(+0, -0) is the
 * right operand, -0. FLOAT16 and BFLOAT16 are widened to float32 exactly,
 * reduced in float32 and rounded back to nearest-even after every step
 * (see "16-bit floats" below: the float32 kernels on blocks of scratch).
 * AVX512-BF16's conversion is not used: it flushes subnormals to zero.
 */
#include <stdatomic.h>
#include <string.h>

#include "reduce_kernel.h"
#include "weft.h"

/* Per-CPU copies need GCC/Clang's ifunc support: x86-64 with glibc. */
#if defined(__x86_64__) && defined(__gnu_linux__) && defined(__has_attribute)
/* Not under ThreadSanitizer: an ifunc resolver runs before its runtime is
 * initialised and the process dies at load time. */
#if __has_attribute(target_clones) && !defined(__SANITIZE_THREAD__)
#define WEFT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#if __has_attribute(target)
#define WEFT_HAVE_F16C 1
#include <cpuid.h>
#include <immintrin.h>
#endif
#endif
#ifndef WEFT_CLONES
#define WEFT_CLONES
#endif
/* "No loop-carried dependence here" (see Aliasing above), in each compiler's words. */
#if defined(__clang__)
#define WEFT_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define WEFT_IVDEP _Pragma("GCC ivdep")
#else
#define WEFT_IVDEP
#endif

size_t weft_dtype_size(int dtype)
{
    static const size_t sz[WEFT_DTYPE_COUNT] = { 1, 1, 4, 4, 8, 8, 2, 2, 4, 8 };
    return dtype >= 0 && dtype < WEFT_DTYPE_COUNT ? sz[dtype] : 0;
}

const char *weft_dtype_name(int dtype)
{
    static const char *const n[WEFT_DTYPE_COUNT] = { "int8",  "uint8",   "int32",    "uint32",  "int64",
                                                     "uint64", "float16", "bfloat16", "float32", "float64" };
    return dtype >= 0 && dtype < WEFT_DTYPE_COUNT ? n[dtype] : "?";
}

const char *weft_op_name(int op)
{
    static const char *const n[WEFT_OP_COUNT] = { "sum", "prod", "min", "max", "avg" };
    return op >= 0 && op < WEFT_OP_COUNT ? n[op] : "?";
}

/* ---- float16 / bfloat16 <-> float32 ----
 *
 * Branch-free (every case computed, one selected) so the loops that call
 * them stay vectorizable. memcpy is the defined way to reinterpret bits; it
 * compiles to nothing. */

static inline uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* c ? t : e as a mask blend: a chain of ?: on values that took float
 * arithmetic to compute is turned into branches by GCC, and a loop with
 * branches is not vectorized. */
static inline uint32_t pick(int c, uint32_t t, uint32_t e)
{
    uint32_t m = 0u - (uint32_t)c;
    return (t & m) | (e & ~m);
}

/* binary16: sign, 5 exponent bits (bias 15), 10 mantissa bits. Every value
 * is exactly a float32. */
static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    /* Normal: same mantissa, exponent rebiased from 15 to 127. */
    uint32_t normal = ((exp + (127u - 15u)) << 23) | (man << 13);
    /* Inf and NaN: float's all-ones exponent, payload kept (a NaN's nonzero
     * mantissa stays nonzero). */
    uint32_t special = 0x7f800000u | (man << 13);
    /* Zero and subnormals are man * 2^-24; man < 2^10 converts exactly, and
     * the product is a normal float (>= 2^-24), so this is exact too. */
    uint32_t tiny = bits_of((float)(int32_t)man * 0x1p-24f);
    uint32_t mag = pick(exp == 0, tiny, pick(exp == 0x1f, special, normal));
    return float_of(sign | mag);
}

static inline uint16_t float_to_half(float f)
{
    uint32_t x = bits_of(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mag = x & 0x7fffffffu;
    /* NaN: quiet (bit 9) and keep the top of the payload. */
    uint32_t nan = 0x7e00u | ((mag >> 13) & 0x3ffu);
    /* Normal halves (|f| >= 2^-14): rebias, then drop 13 mantissa bits
     * rounding to nearest-even: add just under half, plus one when the kept
     * part is odd, so an exact half rounds up only to an even result. A carry
     * out of the mantissa correctly bumps the exponent. (Wraps for small
     * mag; that case is not selected.) */
    uint32_t r = mag - ((127u - 15u) << 23);
    uint32_t normal = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
    /* Below 2^-14 the half is a multiple of 2^-24. Adding 0.5 puts |f| where
     * one float ulp is 2^-24, so the FPU's own rounding (nearest-even, the
     * default mode, which weft never changes) leaves the half's mantissa in
     * the low bits; values just below 2^-14 round up to 0x400, the smallest
     * normal, as they should. Float subnormals (what DAZ would zero) round
     * to 0 either way. */
    uint32_t tiny = bits_of(float_of(mag) + 0.5f) - 0x3f000000u;
    /* 65520 = halfway between the largest half (65504) and 2^16: the tie
     * goes to the even side, which is 2^16 = inf; anything above too. */
    uint32_t h = pick(mag > 0x7f800000u, nan,
                      pick(mag >= 0x477ff000u, 0x7c00u, pick(mag >= 0x38800000u, normal, tiny)));
    return (uint16_t)(sign | h);
}

/* bfloat16 is the top half of a float32. */
static inline float bf16_to_float(uint16_t h)
{
    return float_of((uint32_t)h << 16);
}

static inline uint16_t float_to_bf16(float f)
{
    uint32_t x = bits_of(f);
    /* Nearest-even on the low 16 bits; a carry moves into the exponent and,
     * past the largest finite value, gives inf. Subnormals need nothing
     * special: both formats share float32's exponent. */
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    /* NaN: quiet bit set, so a payload only in the dropped bits cannot turn
     * it into inf. */
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

float weft_half_to_float(uint16_t h)
{
    return half_to_float(h);
}

uint16_t weft_float_to_half(float f)
{
    return float_to_half(f);
}

float weft_bf16_to_float(uint16_t h)
{
    return bf16_to_float(h);
}

uint16_t weft_float_to_bf16(float f)
{
    return float_to_bf16(f);
}

/* ---- kernels ---- */

/* One kernel: dst[i] = EXPR(x = a[i], y = b[i]). */
#define KERNEL(name, T, EXPR)                                                                                      \
    WEFT_CLONES static void name(T *dst, const T *a, const T *b, size_t n)                                         \
    {                                                                                                              \
        WEFT_IVDEP for (size_t i = 0; i < n; i++)                                                                  \
        {                                                                                                          \
            T x = a[i], y = b[i];                                                                                  \
            dst[i] = (T)(EXPR);                                                                                    \
        }                                                                                                          \
    }

#define OP_SUM(x, y)  ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MIN(x, y)  ((x) < (y) ? (x) : (y))
#define OP_MAX(x, y)  ((x) > (y) ? (x) : (y))
/* Floats: the NaN-keeping forms (see the top of the file). */
#define OP_FMIN(x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))
#define OP_FMAX(x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))

/* Wrapping integer arithmetic on the unsigned types. uint8_t operands are
 * promoted to int, where 255 * 255 cannot overflow; the cast back keeps the
 * low 8 bits. uint32_t and uint64_t stay unsigned. */
KERNEL(k_u8_sum, uint8_t, OP_SUM(x, y))
KERNEL(k_u8_prod, uint8_t, OP_PROD(x, y))
KERNEL(k_u32_sum, uint32_t, OP_SUM(x, y))
KERNEL(k_u32_prod, uint32_t, OP_PROD(x, y))
KERNEL(k_u64_sum, uint64_t, OP_SUM(x, y))
KERNEL(k_u64_prod, uint64_t, OP_PROD(x, y))

KERNEL(k_i8_min, int8_t, OP_MIN(x, y))
KERNEL(k_i8_max, int8_t, OP_MAX(x, y))
KERNEL(k_u8_min, uint8_t, OP_MIN(x, y))
KERNEL(k_u8_max, uint8_t, OP_MAX(x, y))
KERNEL(k_i32_min, int32_t, OP_MIN(x, y))
KERNEL(k_i32_max, int32_t, OP_MAX(x, y))
KERNEL(k_u32_min, uint32_t, OP_MIN(x, y))
KERNEL(k_u32_max, uint32_t, OP_MAX(x, y))
KERNEL(k_i64_min, int64_t, OP_MIN(x, y))
KERNEL(k_i64_max, int64_t, OP_MAX(x, y))
KERNEL(k_u64_min, uint64_t, OP_MIN(x, y))
KERNEL(k_u64_max, uint64_t, OP_MAX(x, y))

KERNEL(k_f32_sum, float, OP_SUM(x, y))
KERNEL(k_f32_prod, float, OP_PROD(x, y))
KERNEL(k_f32_min, float, OP_FMIN(x, y))
KERNEL(k_f32_max, float, OP_FMAX(x, y))
KERNEL(k_f64_sum, double, OP_SUM(x, y))
KERNEL(k_f64_prod, double, OP_PROD(x, y))
KERNEL(k_f64_min, double, OP_FMIN(x, y))
KERNEL(k_f64_max, double, OP_FMAX(x, y))

/* ---- 16-bit floats ----
 *
 * Through float32 scratch on the stack, a block at a time (2 x 2 KiB, stays
 * in L1): both operands widened, the float32 kernel of the op run on the
 * scratch, the result narrowed into dst. A block's inputs are all read
 * before its output is written, so dst == a or dst == b is still fine.
 *
 *     a[i, i+B) --widen--> fa --+
 *                               +--> k_f32_<op>(fa, fa, fb) --narrow--> dst[i, i+B)
 *     b[i, i+B) --widen--> fb --+
 *
 * The bits are those of converting element by element (widening is exact,
 * the op is the float32 op). On x86 CPUs with F16C, float16 is converted by
 * vcvtph2ps/vcvtps2ph, 8 elements an instruction, the rounding (nearest-
 * even) given in the instruction rather than taken from MXCSR. They give
 * the results of half_to_float/float_to_half: subnormals are kept both
 * ways, and a NaN narrows to the quiet NaN with the top 10 payload bits in
 * both; the only difference, a signaling NaN half widening to a quiet float,
 * disappears once the result is narrowed. (The portable conversions are
 * branch-free integer code the compiler vectorizes, but about 5 times
 * slower than F16C: on the AVX-512 machine of the first measurement, 1.0
 * against 0.2 ns an element for a float16 sum in cache, so compute bound at
 * about 6 GB/s. They are the fallback for CPUs without F16C.) */
enum { HALF_BLOCK = 512 };

typedef void (*f32_kernel_fn)(float *, const float *, const float *, size_t);
typedef void (*widen_fn)(float *, const uint16_t *, size_t);
typedef void (*narrow_fn)(uint16_t *, const float *, size_t);

WEFT_CLONES static void widen_f16(float *restrict out, const uint16_t *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = half_to_float(in[i]);
}

WEFT_CLONES static void narrow_f16(uint16_t *restrict out, const float *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = float_to_half(in[i]);
}

WEFT_CLONES static void widen_bf16(float *restrict out, const uint16_t *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = bf16_to_float(in[i]);
}

WEFT_CLONES static void narrow_bf16(uint16_t *restrict out, const float *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = float_to_bf16(in[i]);
}

#ifdef WEFT_HAVE_F16C
__attribute__((target("avx,f16c"))) static void widen_f16c(float *out, const uint16_t *in, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(in + i))));
    for (; i < n; i++)
        out[i] = half_to_float(in[i]);
}

__attribute__((target("avx,f16c"))) static void narrow_f16c(uint16_t *out, const float *in, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        out[i] = float_to_half(in[i]);
}
#endif

/* Test hook (tests/test_reduce_host.cc): nonzero keeps float16 on the
 * portable conversions even where F16C is there, so both paths are tested
 * on one machine. Returns the previous setting. */
int weft_reduce_host_portable_f16(int on);
static atomic_int portable_f16_only;

int weft_reduce_host_portable_f16(int on)
{
    return atomic_exchange(&portable_f16_only, on);
}

#ifdef WEFT_HAVE_F16C
/* Whether this CPU has F16C, asked once: cpuid is slow, and under a
 * hypervisor it is a trap. "avx" (which also checks that the OS saves the
 * ymm registers) through the compiler; F16C from cpuid leaf 1 directly, as
 * not every compiler's __builtin_cpu_supports knows the name. Racing first
 * calls compute the same answer. */
static int have_f16c(void)
{
    static atomic_int known; /* 0: not asked yet, 1: no, 2: yes */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k == 0) {
        unsigned eax, ebx, ecx, edx;
        __builtin_cpu_init(); /* a no-op once libgcc's constructor ran */
        k = __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) ? 2 : 1;
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k == 2;
}
#endif

static void half_converters(int dtype, widen_fn *w, narrow_fn *nw)
{
    if (dtype == WEFT_BFLOAT16) {
        *w = widen_bf16;
        *nw = narrow_bf16;
        return;
    }
#ifdef WEFT_HAVE_F16C
    if (!atomic_load_explicit(&portable_f16_only, memory_order_relaxed) && have_f16c()) {
        *w = widen_f16c;
        *nw = narrow_f16c;
        return;
    }
#endif
    *w = widen_f16;
    *nw = narrow_f16;
}

static void reduce_16(int dtype, uint16_t *dst, const uint16_t *a, const uint16_t *b, size_t n, f32_kernel_fn k)
{
    float fa[HALF_BLOCK], fb[HALF_BLOCK];
    widen_fn w;
    narrow_fn nw;
    half_converters(dtype, &w, &nw);
    for (size_t i = 0; i < n; i += HALF_BLOCK) {
        size_t m = n - i < HALF_BLOCK ? n - i : HALF_BLOCK;
        w(fa, a + i, m);
        w(fb, b + i, m);
        k(fa, fa, fb, m);
        nw(dst + i, fa, m);
    }
}

/* The four operations of one type; AVG reduces as SUM. */
#define DISPATCH(sum, prod, min, max)                                                                              \
    switch (op) {                                                                                                  \
    case WEFT_SUM:                                                                                                 \
    case WEFT_AVG: sum(dst, a, b, count); return;                                                                 \
    case WEFT_PROD: prod(dst, a, b, count); return;                                                                \
    case WEFT_MIN: min(dst, a, b, count); return;                                                                  \
    case WEFT_MAX: max(dst, a, b, count); return;                                                                  \
    default: return;                                                                                               \
    }

/* The 16-bit types' "kernels" for DISPATCH: the blocked loop with the
 * float32 kernel of the op. */
#define F16_SUM(d, x, y, n)  reduce_16(dtype, d, x, y, n, k_f32_sum)
#define F16_PROD(d, x, y, n) reduce_16(dtype, d, x, y, n, k_f32_prod)
#define F16_MIN(d, x, y, n)  reduce_16(dtype, d, x, y, n, k_f32_min)
#define F16_MAX(d, x, y, n)  reduce_16(dtype, d, x, y, n, k_f32_max)

void weft_reduce_host(void *dst, const void *a, const void *b, size_t count, int dtype, int op)
{
    switch (dtype) {
    case WEFT_INT8: DISPATCH(k_u8_sum, k_u8_prod, k_i8_min, k_i8_max)
    case WEFT_UINT8: DISPATCH(k_u8_sum, k_u8_prod, k_u8_min, k_u8_max)
    case WEFT_INT32: DISPATCH(k_u32_sum, k_u32_prod, k_i32_min, k_i32_max)
    case WEFT_UINT32: DISPATCH(k_u32_sum, k_u32_prod, k_u32_min, k_u32_max)
    case WEFT_INT64: DISPATCH(k_u64_sum, k_u64_prod, k_i64_min, k_i64_max)
    case WEFT_UINT64: DISPATCH(k_u64_sum, k_u64_prod, k_u64_min, k_u64_max)
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16: DISPATCH(F16_SUM, F16_PROD, F16_MIN, F16_MAX)
    case WEFT_FLOAT32: DISPATCH(k_f32_sum, k_f32_prod, k_f32_min, k_f32_max)
    case WEFT_FLOAT64: DISPATCH(k_f64_sum, k_f64_prod, k_f64_min, k_f64_max)
    default: return;
    }
}

/* ---- avg's final division ----
 *
 * dst[i] = src[i] / n, dst == src allowed (same reasoning as above).
 * Integers truncate toward zero, as C's division does. There is no vector
 * integer division, so 8- and 32-bit integers divide in double and
 * truncate: the quotient of |x| < 2^53 by n, correctly rounded to 53 bits,
 * is within |q| * 2^-53 < 1/n of the exact one, and a non-integer exact
 * quotient is at least 1/n away from the next integer, so truncating the
 * rounded value gives the same integer. 64-bit integers use plain division. */
#define DIV_KERNEL(name, T, W, EXPR)                                                                               \
    WEFT_CLONES static void name(T *dst, const T *src, size_t count, W d)                                          \
    {                                                                                                              \
        WEFT_IVDEP for (size_t i = 0; i < count; i++)                                                              \
        {                                                                                                          \
            T x = src[i];                                                                                          \
            dst[i] = (T)(EXPR);                                                                                    \
        }                                                                                                          \
    }

DIV_KERNEL(d_i8, int8_t, double, (double)x / d)
DIV_KERNEL(d_u8, uint8_t, double, (double)x / d)
DIV_KERNEL(d_i32, int32_t, double, (double)x / d)
DIV_KERNEL(d_u32, uint32_t, double, (double)x / d)
DIV_KERNEL(d_i64, int64_t, int64_t, x / d)
DIV_KERNEL(d_u64, uint64_t, uint64_t, x / d)
DIV_KERNEL(d_f32, float, float, x / d)
DIV_KERNEL(d_f64, double, double, x / d)

/* 16-bit floats: widened, divided in float32, narrowed, as reduce_16. */
static void div_16(int dtype, uint16_t *dst, const uint16_t *src, size_t n, float d)
{
    float f[HALF_BLOCK];
    widen_fn w;
    narrow_fn nw;
    half_converters(dtype, &w, &nw);
    for (size_t i = 0; i < n; i += HALF_BLOCK) {
        size_t m = n - i < HALF_BLOCK ? n - i : HALF_BLOCK;
        w(f, src + i, m);
        d_f32(f, f, m, d);
        nw(dst + i, f, m);
    }
}

void weft_reduce_host_div(void *dst, const void *src, size_t count, int dtype, int n)
{
    /* n is the rank count. Dividing by 1 changes nothing, and n < 1 cannot
     * come from a caller; either way the values pass through unchanged. */
    if (n <= 1) {
        if (dst != src && count)
            memcpy(dst, src, count * weft_dtype_size(dtype));
        return;
    }
    switch (dtype) {
    case WEFT_INT8: d_i8(dst, src, count, n); return;
    case WEFT_UINT8: d_u8(dst, src, count, n); return;
    case WEFT_INT32: d_i32(dst, src, count, n); return;
    case WEFT_UINT32: d_u32(dst, src, count, n); return;
    case WEFT_INT64: d_i64(dst, src, count, n); return;
    case WEFT_UINT64: d_u64(dst, src, count, (uint64_t)n); return;
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16: div_16(dtype, dst, src, count, (float)n); return;
    case WEFT_FLOAT32: d_f32(dst, src, count, (float)n); return;
    case WEFT_FLOAT64: d_f64(dst, src, count, n); return;
    default: return;
    }
}
