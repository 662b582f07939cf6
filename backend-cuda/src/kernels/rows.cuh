// Shared by the row kernels (softmax family, cross-entropy) for a float element type T.
//
// Row geometry (ops/rows.rs): n rows; operand k's row r starts at p[k] + r * st[k][0] and its
// columns are st[k][1] apart; u[0] = the row length d. Flag bit 1: every row operand has unit
// column stride and 16-byte aligned rows, so a thread moves VW columns with one vector load.
//
// Blocks are blockDim.y rows of blockDim.x threads (a power of two, >= 32): a warp per row for
// short rows, up to a whole block per row for long ones. Every thread of a block runs the
// same number of row iterations (rows past the end take part with no data), so the group
// reductions may synchronize the block.

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

// Columns per pack: 16 bytes (f32 4, f64 2, f16/bf16 8).
#define VW ((int)(16 / sizeof(T)))

__device__ __forceinline__ float cmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double cmax(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float cexp(float v) { return expf(v); }
__device__ __forceinline__ double cexp(double v) { return exp(v); }
__device__ __forceinline__ float clog(float v) { return logf(v); }
__device__ __forceinline__ double clog(double v) { return log(v); }
// exp(v - m) for the row kernels' hot loops. f32: one multiply into base 2 and the SFU's
// ex2 (relative error about 2^-22, far inside the fused ops' tolerance) instead of expf's
// range reduction, which makes the bf16 cross-entropy compute-bound. -inf gives 0, NaN stays
// NaN, subnormal results are kept (the .ftz form would flush them). f64 keeps exp.
__device__ __forceinline__ float exp_diff(float v, float m) {
    float r;
    asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"((v - m) * 1.4426950408889634f));
    return r;
}
__device__ __forceinline__ double exp_diff(double v, double m) { return exp(v - m); }
__device__ __forceinline__ C neg_inf() { return (C)__int_as_float(0xff800000); }
__device__ __forceinline__ C quiet_nan() { return (C)__int_as_float(0x7fc00000); }

// Columns j..j+VW of a row into `v` (columns at or past d read as `fill`). VEC: one 16-byte
// load when the whole pack is inside the row.
template <bool VEC> __device__ __forceinline__ void load_pack(const T* row, i64 cs, i64 d, i64 j, C fill, C* v) {
    if (VEC && j + VW <= d) {
        const Pack<T, VW> p = *(const Pack<T, VW>*)(row + j);
#pragma unroll
        for (int k = 0; k < VW; ++k) v[k] = TT::load(p.v[k]);
    } else {
#pragma unroll
        for (int k = 0; k < VW; ++k) v[k] = j + k < d ? TT::load(row[(j + k) * cs]) : fill;
    }
}

template <bool VEC> __device__ __forceinline__ void store_pack(T* row, i64 cs, i64 d, i64 j, const C* v) {
    if (VEC && j + VW <= d) {
        Pack<T, VW> p;
#pragma unroll
        for (int k = 0; k < VW; ++k) p.v[k] = TT::store(v[k]);
        *(Pack<T, VW>*)(row + j) = p;
    } else {
#pragma unroll
        for (int k = 0; k < VW; ++k)
            if (j + k < d) row[(j + k) * cs] = TT::store(v[k]);
    }
}

// Max (NaN ignored, as the CPU's row_max does; a NaN still poisons the row through exp) or
// sum over the blockDim.x threads of this thread's row. `sh` holds 32 values per row of the
// block (1024 in all). Called by every thread of the block.
template <bool MAX> __device__ __forceinline__ C group_reduce(C v, C* sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const C w = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? cmax(v, w) : v + w;
    }
    if (blockDim.x > 32) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
        C* s = sh + threadIdx.y * 32;
        __syncthreads();  // the previous reduction's reads of `s` are done
        if (lane == 0) s[warp] = v;
        __syncthreads();
        v = lane < warps ? s[lane] : (MAX ? neg_inf() : (C)0);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const C w = __shfl_xor_sync(0xffffffffu, v, o);
            v = MAX ? cmax(v, w) : v + w;
        }
    }
    return v;
}

// The first row of this block's current group and the loop step over groups.
#define FOR_ROWS(a)                                                                                       \
    for (u64 r0 = (u64)blockIdx.x * blockDim.y; r0 < (a).n; r0 += (u64)gridDim.x * blockDim.y)
