// Shared by every kernel module: element types, their conversions, and the argument block.
// No system headers: NVRTC compiles this alone, on any toolkit.
//
// A module is compiled once per element type with -DELEM=<type> (and -DIS_FLOAT / -DIS_INT /
// -DIS_BOOL); the element traits below say how each type loads into its compute type (f16 and
// bf16 compute in f32, as the interface asks) and how f64 values (scalars, casts) round into it
// with the same rules as the CPU reference backend.

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

struct h16 { unsigned short x; };
struct b16 { unsigned short x; };
struct bool8 { unsigned char x; };

// Every launch takes one argument block (mirrored by `Args` in kernels/mod.rs; a test compares
// the two layouts).
#define MAXD 8
struct Args {
    char* p[4];          // operand base addresses (element zero)
    u64 n;               // elements of the output
    double s[4];         // float attributes (scalar, bounds, p, ...)
    u64 u[2];            // integer attributes (seed, offset)
    int flag;            // op-specific switch (scalar first, aligned, ...)
    int ndim;            // rank of the merged geometry
    i64 shape[MAXD];     // merged shape
    i64 st[4][MAXD];     // strides in elements of each operand
};

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf2f(unsigned short b) { return __uint_as_float(((u32)b) << 16); }
// Round to nearest even. sm_80+ has the instruction (a NaN comes out as the canonical quiet
// NaN); before it, six integer operations do the same and keep a NaN's payload, quieted, as
// the `half` crate does. The instruction matters: with the integer form, bf16 outputs of the
// streaming kernels (cross-entropy's backward, the norms' forward) spend more issue slots on
// this rounding than on their arithmetic.
__device__ __forceinline__ unsigned short f2bf(float f) {
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
#endif
}
// f64 -> f32 with round-to-odd, so that a second rounding to f16/bf16 rounds the f64 value
// once (the CPU backend's `f32_round_to_odd`).
__device__ __forceinline__ float d2f_odd(double v) {
    float nearest = __double2float_rn(v);
    if (isinf(nearest) || isnan(nearest) || (double)nearest == v) return nearest;
    u32 bits = __float_as_uint(nearest);
    if (fabs((double)nearest) > fabs(v)) bits -= 1;
    return __uint_as_float(bits | 1u);
}

// Float -> integer as Rust's `as`: truncate toward zero, saturate, NaN -> 0.
template <class I> __device__ __forceinline__ I sat_int(double d, double lo, double hi, I ilo, I ihi) {
    if (d != d) return 0;
    if (d <= lo) return ilo;
    if (d >= hi) return ihi;
    return (I)d;
}

template <class T> struct Ty;

template <> struct Ty<float> {
    typedef float C;
    static const bool is_float = true;
    static __device__ __forceinline__ C load(float v) { return v; }
    static __device__ __forceinline__ float store(C c) { return c; }
    static __device__ __forceinline__ double to_d(float v) { return (double)v; }
    static __device__ __forceinline__ float from_d(double d) { return __double2float_rn(d); }
};
template <> struct Ty<double> {
    typedef double C;
    static const bool is_float = true;
    static __device__ __forceinline__ C load(double v) { return v; }
    static __device__ __forceinline__ double store(C c) { return c; }
    static __device__ __forceinline__ double to_d(double v) { return v; }
    static __device__ __forceinline__ double from_d(double d) { return d; }
};
template <> struct Ty<h16> {
    typedef float C;
    static const bool is_float = true;
    static __device__ __forceinline__ C load(h16 v) { return h2f(v.x); }
    static __device__ __forceinline__ h16 store(C c) { h16 r; r.x = f2h(c); return r; }
    static __device__ __forceinline__ double to_d(h16 v) { return (double)h2f(v.x); }
    static __device__ __forceinline__ h16 from_d(double d) { h16 r; r.x = f2h(d2f_odd(d)); return r; }
};
template <> struct Ty<b16> {
    typedef float C;
    static const bool is_float = true;
    static __device__ __forceinline__ C load(b16 v) { return bf2f(v.x); }
    static __device__ __forceinline__ b16 store(C c) { b16 r; r.x = f2bf(c); return r; }
    static __device__ __forceinline__ double to_d(b16 v) { return (double)bf2f(v.x); }
    static __device__ __forceinline__ b16 from_d(double d) { b16 r; r.x = f2bf(d2f_odd(d)); return r; }
};
template <> struct Ty<i64> {
    typedef i64 C;
    static const bool is_float = false;
    static __device__ __forceinline__ C load(i64 v) { return v; }
    static __device__ __forceinline__ i64 store(C c) { return c; }
    static __device__ __forceinline__ double to_d(i64 v) { return (double)v; }
    static __device__ __forceinline__ i64 from_d(double d) {
        return sat_int<i64>(d, -9223372036854775808.0, 9223372036854775808.0, (i64)(-9223372036854775807LL - 1),
                            9223372036854775807LL);
    }
};
template <> struct Ty<int> {
    typedef int C;
    static const bool is_float = false;
    static __device__ __forceinline__ C load(int v) { return v; }
    static __device__ __forceinline__ int store(C c) { return c; }
    static __device__ __forceinline__ double to_d(int v) { return (double)v; }
    static __device__ __forceinline__ int from_d(double d) {
        return sat_int<int>(d, -2147483648.0, 2147483647.0, (int)(-2147483647 - 1), 2147483647);
    }
};
template <> struct Ty<u8> {
    typedef u8 C;
    static const bool is_float = false;
    static __device__ __forceinline__ C load(u8 v) { return v; }
    static __device__ __forceinline__ u8 store(C c) { return c; }
    static __device__ __forceinline__ double to_d(u8 v) { return (double)v; }
    static __device__ __forceinline__ u8 from_d(double d) { return sat_int<u8>(d, 0.0, 255.0, (u8)0, (u8)255); }
};
// Bool computes as 0/1 bytes. From f64 it goes through u8 as the CPU backend does (0.5 ->
// false); casts and fills to bool use `!= 0` instead, in their own kernels.
template <> struct Ty<bool8> {
    typedef u8 C;
    static const bool is_float = false;
    static __device__ __forceinline__ C load(bool8 v) { return v.x != 0; }
    static __device__ __forceinline__ bool8 store(C c) { bool8 r; r.x = c != 0; return r; }
    static __device__ __forceinline__ double to_d(bool8 v) { return v.x != 0 ? 1.0 : 0.0; }
    static __device__ __forceinline__ bool8 from_d(double d) { return store(Ty<u8>::from_d(d)); }
};

// Element offsets of linear position `i` under each of N stride sets. 32-bit division when
// the whole index space fits, which is most tensors and several times cheaper.
template <int N> __device__ __forceinline__ void offsets(const Args& a, u64 i, i64* off) {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (a.n <= 0xffffffffull) {
        u32 r = (u32)i;
        for (int d = a.ndim - 1; d >= 0; --d) {
            u32 sz = (u32)a.shape[d];
            u32 q = r / sz;
            u32 c = r - q * sz;
            r = q;
#pragma unroll
            for (int k = 0; k < N; ++k) off[k] += (i64)c * a.st[k][d];
        }
    } else {
        u64 r = i;
        for (int d = a.ndim - 1; d >= 0; --d) {
            u64 sz = (u64)a.shape[d];
            u64 q = r / sz;
            u64 c = r - q * sz;
            r = q;
#pragma unroll
            for (int k = 0; k < N; ++k) off[k] += (i64)c * a.st[k][d];
        }
    }
}

__device__ __forceinline__ u64 gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 gstride() { return (u64)gridDim.x * blockDim.x; }

// A pack of V elements moved with one vector load or store.
template <class E, int V> struct alignas(sizeof(E) * V) Pack { E v[V]; };
