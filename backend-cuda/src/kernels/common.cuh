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

// A type that computes as itself: load and store are the identity, to_d a cast.
#define TY_PLAIN(E, FLOATING, FROM_D)                                              \
    template <> struct Ty<E> {                                                     \
        typedef E C;                                                               \
        static const bool is_float = FLOATING;                                     \
        static __device__ __forceinline__ C load(E v) { return v; }                \
        static __device__ __forceinline__ E store(C c) { return c; }               \
        static __device__ __forceinline__ double to_d(E v) { return (double)v; }   \
        static __device__ __forceinline__ E from_d(double d) { return FROM_D; }    \
    };
TY_PLAIN(float, true, __double2float_rn(d))
TY_PLAIN(double, true, d)
TY_PLAIN(i64, false,
         (sat_int<i64>(d, -9223372036854775808.0, 9223372036854775808.0, (i64)(-9223372036854775807LL - 1),
                       9223372036854775807LL)))
TY_PLAIN(int, false, (sat_int<int>(d, -2147483648.0, 2147483647.0, (int)(-2147483647 - 1), 2147483647)))
TY_PLAIN(u8, false, (sat_int<u8>(d, 0.0, 255.0, (u8)0, (u8)255)))

// A 16-bit float held in `x` that computes in f32 (TO_F and FROM_F convert the bits; from
// f64 it rounds to odd first, so that the value is rounded once).
#define TY_HALF(E, TO_F, FROM_F)                                                                                 \
    template <> struct Ty<E> {                                                                                   \
        typedef float C;                                                                                         \
        static const bool is_float = true;                                                                       \
        static __device__ __forceinline__ C load(E v) { return TO_F(v.x); }                                      \
        static __device__ __forceinline__ E store(C c) { E r; r.x = FROM_F(c); return r; }                       \
        static __device__ __forceinline__ double to_d(E v) { return (double)TO_F(v.x); }                         \
        static __device__ __forceinline__ E from_d(double d) { E r; r.x = FROM_F(d2f_odd(d)); return r; }       \
    };
TY_HALF(h16, h2f, f2h)
TY_HALF(b16, bf2f, f2bf)

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

// Adds to off[k] the element offset of linear position r under stride set k, the index
// arithmetic in U.
template <class U, int N> __device__ __forceinline__ void add_offsets(const Args& a, U r, i64* off) {
    for (int d = a.ndim - 1; d >= 0; --d) {
        U sz = (U)a.shape[d];
        U q = r / sz;
        U c = r - q * sz;
        r = q;
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += (i64)c * a.st[k][d];
    }
}

// Element offsets of linear position `i` under each of N stride sets. 32-bit division when
// the whole index space fits, which is most tensors and several times cheaper.
template <int N> __device__ __forceinline__ void offsets(const Args& a, u64 i, i64* off) {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (a.n <= 0xffffffffull) add_offsets<u32, N>(a, (u32)i, off);
    else add_offsets<u64, N>(a, i, off);
}

__device__ __forceinline__ u64 gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 gstride() { return (u64)gridDim.x * blockDim.x; }

// A pack of V elements moved with one vector load or store.
template <class E, int V> struct alignas(sizeof(E) * V) Pack { E v[V]; };

// Square root in the compute type (f32 or f64).
__device__ __forceinline__ float csqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double csqrt(double v) { return sqrt(v); }

// Programmatic dependent launch (sm_90+). A kernel the launcher starts early (see
// `CudaDevice::launch_with`) may run while the kernel before it in the stream is finishing:
// until `wait_previous` returns it must not read what that kernel writes nor write anything,
// so it only warms caches before it. On an ordinary launch, or before sm_90, both are no-ops.
__device__ __forceinline__ void wait_previous() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Let the next kernel in the stream, if launched early, start its blocks now.
__device__ __forceinline__ void start_next() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
