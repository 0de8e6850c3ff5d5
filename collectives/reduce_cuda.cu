/*
 * Reduction kernels for device memory (reduce_kernel.h): built by nvcc into
 * a fatbin (CMakeLists.txt, WEFT_CUDA_KERNELS), embedded in libweft as a byte
 * array and loaded at run time by reduce_device.c with cuModuleLoadData --
 * weft links no CUDA library, so these are plain extern "C" entry points
 * looked up by name, never called through the runtime's <<<>>> launch.
 *
 * Entry points (names used by reduce_device.c, checked in the fatbin by the
 * build):
 *   weft_reduce_<t>_<op>(void *dst, const void *a, const void *b, u64 count)
 *       dst[i] = a[i] op b[i]; op in sum, prod, min, max (avg reduces as sum)
 *   weft_div_<t>(void *dst, const void *src, u64 count, int n)
 *       dst[i] = src[i] / n: avg's final division
 * with <t> in i8 u8 i32 u32 i64 u64 f16 bf16 f32 f64 (enum weft_dtype_t
 * order). dst may be exactly a, b or src (each element is read before it is
 * written by the same thread), never a partial overlap.
 *
 * The arithmetic is the host's (reduce_host.c), element for element:
 *   - integers are computed in the unsigned type of their width, so overflow
 *     wraps instead of being undefined; min/max compare signed as signed;
 *     division truncates toward zero (C semantics);
 *   - float16/bfloat16 are widened to float32, reduced, and rounded back to
 *     nearest-even;
 *   - min/max of floats: (a < b || a != a) ? a : b (max with >): a NaN
 *     operand is the result, and of equal operands (+0 and -0 included) b;
 *   - NaN: every NaN result is a NaN, but its sign and payload may differ
 *     from the host's for sum/prod/div (GPU arithmetic returns the
 *     canonical NaN, x86 keeps an operand's payload); min/max return the
 *     operand, quieted, on both;
 *   - float32/float64 use IEEE division and no contraction: nvcc's defaults
 *     (no --use_fast_math, -ftz=false, -prec-div=true) keep subnormals and
 *     round every operation once, as the host does.
 *
 * Memory access: each thread of a grid-stride loop handles 16 bytes (one
 * uint4 load per operand) when dst, a and b are 16-byte aligned -- the usual
 * case, cudaMalloc returns 256-byte aligned memory and weft's chunks are
 * large multiples of 16 -- and the tail elements one by one. Element-aligned
 * pointers that are not 16-byte aligned take the element loop. Pointers not
 * aligned to the element size are never passed: reduce_device.c copies such
 * operands into aligned scratch first (a misaligned access would fault and
 * poison the application's CUDA context). There is no byte-wise path: the
 * one there was gave a wrong float16 sum on an H100 (0xe800 for 0xe897, a
 * byte read or written as 0; docs/cuda.md), and the copy is correct on any
 * compiler. A kernel handed misaligned pointers anyway does nothing.
 */
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

typedef unsigned long long u64;

/* ---- element types: storage type, operations ---- */

/* Integers: T the storage type, U the unsigned type of the same width.
 * Small types promote to int in C++ arithmetic; the products of two
 * 8-bit values fit, and the conversion back keeps the low bits. */
template <typename T, typename U> struct IntOps {
    typedef T storage;
    static __device__ __forceinline__ T sum(T a, T b) { return (T)(U)((U)a + (U)b); }
    static __device__ __forceinline__ T prod(T a, T b) { return (T)(U)((U)a * (U)b); }
    static __device__ __forceinline__ T min(T a, T b) { return b < a ? b : a; }
    static __device__ __forceinline__ T max(T a, T b) { return b > a ? b : a; }
    /* n >= 1; int8/uint8 are divided in int, which holds any of their values. */
    static __device__ __forceinline__ T div(T a, int n) { return sizeof(T) < 4 ? (T)((int)a / n) : (T)(a / (T)n); }
};

/* min/max of floats, as the host computes them: a when a wins or is NaN,
 * else b -- so a NaN operand is the result (a's when both are), and of two
 * equal values (+0 and -0 included) b, the right operand. */
template <typename F> __device__ __forceinline__ bool keep_a_min(F a, F b) { return a < b || a != a; }
template <typename F> __device__ __forceinline__ bool keep_a_max(F a, F b) { return a > b || a != a; }

template <typename F> struct FloatOps {
    typedef F storage;
    static __device__ __forceinline__ F sum(F a, F b) { return a + b; }
    static __device__ __forceinline__ F prod(F a, F b) { return a * b; }
    static __device__ __forceinline__ F min(F a, F b) { return keep_a_min(a, b) ? a : b; }
    static __device__ __forceinline__ F max(F a, F b) { return keep_a_max(a, b) ? a : b; }
    static __device__ __forceinline__ F div(F a, int n) { return a / (F)n; }
};

/* float16 as its bits (uint16_t). The conversions are the hardware's
 * (cvt.f32.f16 exact, cvt.rn.f16.f32 round to nearest-even, subnormals
 * kept). QUIET is the quiet bit of a NaN: narrowing a widened NaN sets it
 * and keeps sign and payload, on the host too. */
struct HalfBits {
    static const uint16_t QUIET = 0x0200;
    static __device__ __forceinline__ bool is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
    static __device__ __forceinline__ float widen(uint16_t h) { return __half2float(__ushort_as_half(h)); }
    static __device__ __forceinline__ uint16_t narrow(float f) { return __half_as_ushort(__float2half_rn(f)); }
};

/* bfloat16 as its bits: the upper half of a float32. Narrowing by hand
 * (the same on every architecture; sm_75 has no bf16 conversion): round to
 * nearest-even by adding 0x7fff plus the lowest kept bit, which carries into
 * the exponent, up to inf where it must; a NaN keeps its sign and upper
 * payload with the quiet bit set (the rounding add could make it inf). */
struct Bf16Bits {
    static const uint16_t QUIET = 0x0040;
    static __device__ __forceinline__ bool is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }
    static __device__ __forceinline__ float widen(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
    static __device__ __forceinline__ uint16_t narrow(float f)
    {
        uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            return (uint16_t)((u >> 16) | QUIET);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (uint16_t)(u >> 16);
    }
};

/* sum, prod and div round the float32 result; min and max return one
 * operand's bits (what the float32 round trip gives: exact for numbers, and
 * a NaN comes back quiet with its sign and payload). */
template <typename C> struct Narrow16Ops {
    typedef uint16_t storage;
    static __device__ __forceinline__ uint16_t quiet(uint16_t h) { return C::is_nan(h) ? (uint16_t)(h | C::QUIET) : h; }
    static __device__ __forceinline__ uint16_t sum(uint16_t a, uint16_t b)
    {
        return C::narrow(C::widen(a) + C::widen(b));
    }
    static __device__ __forceinline__ uint16_t prod(uint16_t a, uint16_t b)
    {
        return C::narrow(C::widen(a) * C::widen(b));
    }
    static __device__ __forceinline__ uint16_t min(uint16_t a, uint16_t b)
    {
        return quiet(keep_a_min(C::widen(a), C::widen(b)) ? a : b);
    }
    static __device__ __forceinline__ uint16_t max(uint16_t a, uint16_t b)
    {
        return quiet(keep_a_max(C::widen(a), C::widen(b)) ? a : b);
    }
    static __device__ __forceinline__ uint16_t div(uint16_t a, int n) { return C::narrow(C::widen(a) / (float)n); }
};

/* ---- operations as types, so one kernel template serves them all ---- */

template <typename O> struct Sum {
    typedef typename O::storage T;
    static __device__ __forceinline__ T apply(T a, T b) { return O::sum(a, b); }
};
template <typename O> struct Prod {
    typedef typename O::storage T;
    static __device__ __forceinline__ T apply(T a, T b) { return O::prod(a, b); }
};
template <typename O> struct Min {
    typedef typename O::storage T;
    static __device__ __forceinline__ T apply(T a, T b) { return O::min(a, b); }
};
template <typename O> struct Max {
    typedef typename O::storage T;
    static __device__ __forceinline__ T apply(T a, T b) { return O::max(a, b); }
};

/* ---- loads and stores ---- */

template <typename T> union Vec16 {
    uint4 v;
    T     e[16 / sizeof(T)];
};

__device__ __forceinline__ u64 thread_index() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 thread_count() { return (u64)gridDim.x * blockDim.x; }

/* ---- the two kernel bodies ---- */

template <typename Op> __device__ __forceinline__ void reduce_body(void *dstv, const void *av, const void *bv, u64 n)
{
    typedef typename Op::T T;
    const unsigned V = 16 / sizeof(T);
    u64 i = thread_index(), step = thread_count();
    uintptr_t addr = (uintptr_t)dstv | (uintptr_t)av | (uintptr_t)bv;

    if ((addr & 15) == 0) {
        uint4 *d = (uint4 *)dstv;
        const uint4 *a = (const uint4 *)av, *b = (const uint4 *)bv;
        u64 nv = n / V;
        for (u64 j = i; j < nv; j += step) {
            Vec16<T> x, y, r;
            x.v = a[j];
            y.v = b[j];
#pragma unroll
            for (unsigned k = 0; k < V; k++)
                r.e[k] = Op::apply(x.e[k], y.e[k]);
            d[j] = r.v;
        }
        T *dt = (T *)dstv;
        const T *at = (const T *)av, *bt = (const T *)bv;
        for (u64 j = nv * V + i; j < n; j += step)
            dt[j] = Op::apply(at[j], bt[j]);
    } else if ((addr & (sizeof(T) - 1)) == 0) {
        T *dt = (T *)dstv;
        const T *at = (const T *)av, *bt = (const T *)bv;
        for (u64 j = i; j < n; j += step)
            dt[j] = Op::apply(at[j], bt[j]);
    }
}

template <typename O> __device__ __forceinline__ void div_body(void *dstv, const void *srcv, u64 n, int divisor)
{
    typedef typename O::storage T;
    const unsigned V = 16 / sizeof(T);
    u64 i = thread_index(), step = thread_count();
    uintptr_t addr = (uintptr_t)dstv | (uintptr_t)srcv;

    if ((addr & 15) == 0) {
        uint4 *d = (uint4 *)dstv;
        const uint4 *s = (const uint4 *)srcv;
        u64 nv = n / V;
        for (u64 j = i; j < nv; j += step) {
            Vec16<T> x, r;
            x.v = s[j];
#pragma unroll
            for (unsigned k = 0; k < V; k++)
                r.e[k] = O::div(x.e[k], divisor);
            d[j] = r.v;
        }
        T *dt = (T *)dstv;
        const T *st = (const T *)srcv;
        for (u64 j = nv * V + i; j < n; j += step)
            dt[j] = O::div(st[j], divisor);
    } else if ((addr & (sizeof(T) - 1)) == 0) {
        T *dt = (T *)dstv;
        const T *st = (const T *)srcv;
        for (u64 j = i; j < n; j += step)
            dt[j] = O::div(st[j], divisor);
    }
}

typedef IntOps<int8_t, uint8_t>     I8;
typedef IntOps<uint8_t, uint8_t>    U8;
typedef IntOps<int32_t, uint32_t>   I32;
typedef IntOps<uint32_t, uint32_t>  U32;
typedef IntOps<int64_t, uint64_t>   I64;
typedef IntOps<uint64_t, uint64_t>  U64;
typedef Narrow16Ops<HalfBits>       F16;
typedef Narrow16Ops<Bf16Bits>       BF16;
typedef FloatOps<float>             F32;
typedef FloatOps<double>            F64;

} // namespace

/* ---- entry points: one per (type, op), plus one division per type ---- */

#define WEFT_REDUCE_ENTRY(tname, O, opname, OpT)                                                        \
    extern "C" __global__ void weft_reduce_##tname##_##opname(void *dst, const void *a, const void *b,  \
                                                               u64 n)                                   \
    {                                                                                                   \
        reduce_body<OpT<O> >(dst, a, b, n);                                                             \
    }

#define WEFT_TYPE_ENTRIES(tname, O)                                                 \
    WEFT_REDUCE_ENTRY(tname, O, sum, Sum)                                           \
    WEFT_REDUCE_ENTRY(tname, O, prod, Prod)                                         \
    WEFT_REDUCE_ENTRY(tname, O, min, Min)                                           \
    WEFT_REDUCE_ENTRY(tname, O, max, Max)                                           \
    extern "C" __global__ void weft_div_##tname(void *dst, const void *src, u64 n, int divisor) \
    {                                                                               \
        div_body<O>(dst, src, n, divisor);                                          \
    }

WEFT_TYPE_ENTRIES(i8, I8)
WEFT_TYPE_ENTRIES(u8, U8)
WEFT_TYPE_ENTRIES(i32, I32)
WEFT_TYPE_ENTRIES(u32, U32)
WEFT_TYPE_ENTRIES(i64, I64)
WEFT_TYPE_ENTRIES(u64, U64)
WEFT_TYPE_ENTRIES(f16, F16)
WEFT_TYPE_ENTRIES(bf16, BF16)
WEFT_TYPE_ENTRIES(f32, F32)
WEFT_TYPE_ENTRIES(f64, F64)
