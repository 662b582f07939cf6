// Softmax and log-softmax over the last dim, forward and backward, for float T (rows.cuh).
//
// Forward operands: p[0] = x, p[1] = y. Backward: p[0] = y (the forward output), p[1] = dy,
// p[2] = dx. All in the row geometry of rows.cuh.
//
// `_reg` kernels keep the row in registers (P packs of VW columns per thread, P and the
// block shape chosen by ops/softmax.rs so that blockDim.x * P * VW >= d): each element is
// read once and written once, which is the memory floor. `_loop` kernels take rows of any
// length and read the input again for each pass (max, sum, write).
//
// Forward: m = max(x); s = sum(exp(x - m)); softmax = exp(x - m) / s, log-softmax =
// (x - m) - log(s). An all -inf row has m = -inf and x - m = NaN, so it gives NaN (as in
// PyTorch); a NaN anywhere makes the row NaN; -inf entries of other rows give 0 / -inf.
// Backward: softmax dx = y * (dy - sum(y * dy)); log-softmax dx = dy - exp(y) * sum(dy).
// Everything is computed in C (f32 for f16/bf16, the type itself otherwise).
// Exponentials go through rows.cuh's exp_diff (ex2.approx for f32): with expf's range
// reduction the f32 forward is partly compute-bound.

#if IS_FLOAT

template <int P, bool VEC, bool LOG> __device__ __forceinline__ void softmax_reg(const Args& a, C* sh) {
    const i64 d = (i64)a.u[0];
    FOR_ROWS(a) {
        const u64 row = r0 + threadIdx.y;
        const i64 len = row < a.n ? d : 0;  // rows past the end join the reductions empty
        const T* x = (const T*)a.p[0] + (row < a.n ? (i64)row * a.st[0][0] : 0);
        T* y = (T*)a.p[1] + (row < a.n ? (i64)row * a.st[1][0] : 0);
        C v[P][VW];
        C m = neg_inf();
        if (VEC && !LOG && ((i64)(P - 1) * blockDim.x + threadIdx.x) * VW + VW <= len) {
            // Every pack of this thread lies inside the row: the P loads go out back to back,
            // one memory latency per row (with the general path's per-pack range checks the
            // compiler issues them one pack after another). Not for log-softmax, whose kernels
            // spill more with this path (RESULTS.md, "Kernel design notes").
            Pack<T, VW> q[P];
#pragma unroll
            for (int p = 0; p < P; ++p) q[p] = *(const Pack<T, VW>*)(x + ((i64)p * blockDim.x + threadIdx.x) * VW);
#pragma unroll
            for (int p = 0; p < P; ++p)
#pragma unroll
                for (int k = 0; k < VW; ++k) {
                    v[p][k] = TT::load(q[p].v[k]);
                    m = cmax(m, v[p][k]);
                }
        } else {
#pragma unroll
            for (int p = 0; p < P; ++p) {
                // Packs interleave across the row's threads, so a warp's loads are contiguous.
                const i64 j = ((i64)p * blockDim.x + threadIdx.x) * VW;
                load_pack<VEC>(x, a.st[0][1], len, j, neg_inf(), v[p]);
#pragma unroll
                for (int k = 0; k < VW; ++k) m = cmax(m, v[p][k]);
            }
        }
        m = group_reduce<true>(m, sh);
        C s = (C)0;
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const i64 j = ((i64)p * blockDim.x + threadIdx.x) * VW;
#pragma unroll
            for (int k = 0; k < VW; ++k) {
                const C e = exp_diff(v[p][k], m);
                if (j + k < len) s += e;
                if (!LOG) v[p][k] = e;
            }
        }
        s = group_reduce<false>(s, sh);
        const C inv = (C)1 / s, ls = clog(s);
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const i64 j = ((i64)p * blockDim.x + threadIdx.x) * VW;
            C o[VW];
#pragma unroll
            for (int k = 0; k < VW; ++k) o[k] = LOG ? (v[p][k] - m) - ls : v[p][k] * inv;
            store_pack<VEC>(y, a.st[1][1], len, j, o);
        }
    }
}

template <bool VEC, bool LOG> __device__ __forceinline__ void softmax_loop(const Args& a, C* sh) {
    const i64 d = (i64)a.u[0];
    const i64 step = (i64)blockDim.x * VW;
    FOR_ROWS(a) {
        const u64 row = r0 + threadIdx.y;
        const i64 len = row < a.n ? d : 0;
        const T* x = (const T*)a.p[0] + (row < a.n ? (i64)row * a.st[0][0] : 0);
        T* y = (T*)a.p[1] + (row < a.n ? (i64)row * a.st[1][0] : 0);
        C v[VW];
        C m = neg_inf();
        for (i64 j = (i64)threadIdx.x * VW; j < len; j += step) {
            load_pack<VEC>(x, a.st[0][1], len, j, neg_inf(), v);
#pragma unroll
            for (int k = 0; k < VW; ++k) m = cmax(m, v[k]);
        }
        m = group_reduce<true>(m, sh);
        C s = (C)0;
        for (i64 j = (i64)threadIdx.x * VW; j < len; j += step) {
            load_pack<VEC>(x, a.st[0][1], len, j, neg_inf(), v);
#pragma unroll
            for (int k = 0; k < VW; ++k)
                if (j + k < len) s += exp_diff(v[k], m);
        }
        s = group_reduce<false>(s, sh);
        const C inv = (C)1 / s, ls = clog(s);
        for (i64 j = (i64)threadIdx.x * VW; j < len; j += step) {
            load_pack<VEC>(x, a.st[0][1], len, j, neg_inf(), v);
#pragma unroll
            for (int k = 0; k < VW; ++k) v[k] = LOG ? (v[k] - m) - ls : exp_diff(v[k], m) * inv;
            store_pack<VEC>(y, a.st[1][1], len, j, v);
        }
    }
}

// Forward declaration: kernels softmax_bwd_reg does not run fall back to it.
template <bool VEC, bool LOG> __device__ __forceinline__ void softmax_bwd_loop(const Args& a, C* sh);

// The vector path keeps y and dy as loaded (raw 16-byte packs: a bf16 pack takes 4 registers
// rather than the 8 of its f32 values) and converts on each use, so the f16/bf16 4-pack
// kernel holds 32 registers of data instead of 64. Still more than 64 with the addressing, so
// ops/softmax.rs runs 4 packs of f16/bf16 only in the 256-thread kernel (80 registers); the
// 1024-bound one (WIDE), and the element-by-element one with no packs to keep, loop instead:
// never picked, they exist so that every kernel name resolves.
template <int P, bool VEC, bool LOG, bool WIDE>
__device__ __forceinline__ void softmax_bwd_reg(const Args& a, C* sh) {
    if (P * VW > 16 && (!VEC || WIDE)) {
        softmax_bwd_loop<VEC, LOG>(a, sh);
        return;
    }
    typedef Pack<T, VW> PT;
    const i64 d = (i64)a.u[0];
    FOR_ROWS(a) {
        const u64 row = r0 + threadIdx.y;
        const i64 len = row < a.n ? d : 0;
        const T* y = (const T*)a.p[0] + (row < a.n ? (i64)row * a.st[0][0] : 0);
        const T* dy = (const T*)a.p[1] + (row < a.n ? (i64)row * a.st[1][0] : 0);
        T* dx = (T*)a.p[2] + (row < a.n ? (i64)row * a.st[2][0] : 0);
        PT yr[VEC ? P : 1], gr[VEC ? P : 1];
        C yv[VEC ? 1 : P][VW], gv[VEC ? 1 : P][VW];
        C s = (C)0;
        if (VEC) {
            if (((i64)(P - 1) * blockDim.x + threadIdx.x) * VW + VW <= len) {
                // Every pack of this thread lies inside the row: all 2P loads go out back to
                // back, one memory latency per row (with the per-pack range checks below the
                // compiler issues them a pack at a time).
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    const i64 j = ((i64)p * blockDim.x + threadIdx.x) * VW;
                    yr[VEC ? p : 0] = *(const PT*)(y + j);
                    gr[VEC ? p : 0] = *(const PT*)(dy + j);
                }
            } else {
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    const i64 j = ((i64)p * blockDim.x + threadIdx.x) * VW;
                    // Zero packs past the row's end add nothing to the sum and are not stored.
                    if (j + VW <= len) {
                        yr[VEC ? p : 0] = *(const PT*)(y + j);
                        gr[VEC ? p : 0] = *(const PT*)(dy + j);
                    } else {
                        // The pack that straddles the row's end (or one past it), element by element.
#pragma unroll
                        for (int k = 0; k < VW; ++k) {
                            yr[VEC ? p : 0].v[k] = j + k < len ? y[j + k] : T{};
                            gr[VEC ? p : 0].v[k] = j + k < len ? dy[j + k] : T{};
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const i64 j = ((i64)p * blockDim.x + threadIdx.x) * VW;
            if (VEC) {
#pragma unroll
                for (int k = 0; k < VW; ++k) {
                    const C yk = TT::load(yr[p].v[k]), gk = TT::load(gr[p].v[k]);
                    s += LOG ? gk : yk * gk;
                }
            } else {
                load_pack<false>(y, a.st[0][1], len, j, (C)0, yv[p]);
                load_pack<false>(dy, a.st[1][1], len, j, (C)0, gv[p]);
#pragma unroll
                for (int k = 0; k < VW; ++k) s += LOG ? gv[p][k] : yv[p][k] * gv[p][k];
            }
        }
        s = group_reduce<false>(s, sh);
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const i64 j = ((i64)p * blockDim.x + threadIdx.x) * VW;
            C o[VW];
#pragma unroll
            for (int k = 0; k < VW; ++k) {
                const C yk = VEC ? TT::load(yr[p].v[k]) : yv[p][k], gk = VEC ? TT::load(gr[p].v[k]) : gv[p][k];
                o[k] = LOG ? gk - exp_diff(yk, (C)0) * s : yk * (gk - s);
            }
            store_pack<VEC>(dx, a.st[2][1], len, j, o);
        }
    }
}

template <bool VEC, bool LOG> __device__ __forceinline__ void softmax_bwd_loop(const Args& a, C* sh) {
    const i64 d = (i64)a.u[0];
    const i64 step = (i64)blockDim.x * VW;
    FOR_ROWS(a) {
        const u64 row = r0 + threadIdx.y;
        const i64 len = row < a.n ? d : 0;
        const T* y = (const T*)a.p[0] + (row < a.n ? (i64)row * a.st[0][0] : 0);
        const T* dy = (const T*)a.p[1] + (row < a.n ? (i64)row * a.st[1][0] : 0);
        T* dx = (T*)a.p[2] + (row < a.n ? (i64)row * a.st[2][0] : 0);
        C yv[VW], gv[VW];
        C s = (C)0;
        for (i64 j = (i64)threadIdx.x * VW; j < len; j += step) {
            load_pack<VEC>(y, a.st[0][1], len, j, (C)0, yv);
            load_pack<VEC>(dy, a.st[1][1], len, j, (C)0, gv);
#pragma unroll
            for (int k = 0; k < VW; ++k) s += LOG ? gv[k] : yv[k] * gv[k];
        }
        s = group_reduce<false>(s, sh);
        for (i64 j = (i64)threadIdx.x * VW; j < len; j += step) {
            load_pack<VEC>(y, a.st[0][1], len, j, (C)0, yv);
            load_pack<VEC>(dy, a.st[1][1], len, j, (C)0, gv);
#pragma unroll
            for (int k = 0; k < VW; ++k) yv[k] = LOG ? gv[k] - exp_diff(yv[k], (C)0) * s : yv[k] * (gv[k] - s);
            store_pack<VEC>(dx, a.st[2][1], len, j, yv);
        }
    }
}

// Kernel names: softmax_{fwd,bwd}_{reg<P>,reg<P>_t256,loop}_v{0,1}_l{0,1} (v: vector loads,
// l: log; t256: bounded for 256-thread blocks).
// The backward keeps two arrays per thread, so it stops at P = 4 (ops/softmax.rs never asks
// for more registers than these hold). Its t256 kernels run only for f16/bf16 rows kept as
// loaded packs, so there is no _t256_v0 backward, and the other types' t256 ones loop.
// The forward's t256 bound: 3 blocks per SM (85 registers; the f32 8-pack kernel needs
// them), 4 for the contiguous f16/bf16 softmax (64 registers, which its 4-pack kernel fits
// without spilling; more rows in flight per SM for a kernel that waits on memory; RESULTS.md,
// "Kernel design notes"). Not for log-softmax or strided rows: their 4-pack kernels spill at
// 64 registers. The f16/bf16 8-pack forward is never picked (ops/softmax.rs stops them at 4
// packs) and loops, which costs no compile time.
#define RED_SMEM __shared__ C sh[1024]
#define KERNEL extern "C" __global__ void __launch_bounds__(1024)
#define FWD_T256_BLOCKS(V, L) (sizeof(T) == 2 && V == 1 && L == 0 ? 4 : 3)
template <int P, bool VEC, bool LOG> __device__ __forceinline__ void softmax_fwd(const Args& a, C* sh) {
    if (P * VW > 32) softmax_loop<VEC, LOG>(a, sh);
    else softmax_reg<P, VEC, LOG>(a, sh);
}
#define SOFTMAX_FWD(P, V, L)                                                                    \
    KERNEL softmax_fwd_reg##P##_v##V##_l##L(const Args a) {                                    \
        RED_SMEM;                                                                               \
        softmax_fwd<P, (V != 0), (L != 0)>(a, sh);                                              \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, FWD_T256_BLOCKS(V, L))                   \
        softmax_fwd_reg##P##_t256_v##V##_l##L(const Args a) {                                  \
        RED_SMEM;                                                                               \
        softmax_fwd<P, (V != 0), (L != 0)>(a, sh);                                              \
    }
#define SOFTMAX_BWD(P, V, L)                                                                    \
    KERNEL softmax_bwd_reg##P##_v##V##_l##L(const Args a) {                                    \
        RED_SMEM;                                                                               \
        softmax_bwd_reg<P, (V != 0), (L != 0), true>(a, sh);                                    \
    }
#define SOFTMAX_BWD_T256(P, L)                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 3) softmax_bwd_reg##P##_t256_v1_l##L(const Args a) { \
        RED_SMEM;                                                                               \
        if (sizeof(T) == 2) softmax_bwd_reg<P, true, (L != 0), false>(a, sh);                   \
        else softmax_bwd_loop<true, (L != 0)>(a, sh);                                           \
    }
#define SOFTMAX_ALL(V, L)                                                                       \
    SOFTMAX_FWD(1, V, L)                                                                        \
    SOFTMAX_FWD(2, V, L)                                                                        \
    SOFTMAX_FWD(4, V, L)                                                                        \
    SOFTMAX_FWD(8, V, L)                                                                        \
    SOFTMAX_BWD(1, V, L)                                                                        \
    SOFTMAX_BWD(2, V, L)                                                                        \
    SOFTMAX_BWD(4, V, L)                                                                        \
    KERNEL softmax_fwd_loop_v##V##_l##L(const Args a) {                                        \
        RED_SMEM;                                                                               \
        softmax_loop<(V != 0), (L != 0)>(a, sh);                                                \
    }                                                                                           \
    KERNEL softmax_bwd_loop_v##V##_l##L(const Args a) {                                        \
        RED_SMEM;                                                                               \
        softmax_bwd_loop<(V != 0), (L != 0)>(a, sh);                                            \
    }
SOFTMAX_ALL(0, 0)
SOFTMAX_ALL(0, 1)
SOFTMAX_ALL(1, 0)
SOFTMAX_ALL(1, 1)
SOFTMAX_BWD_T256(1, 0)
SOFTMAX_BWD_T256(2, 0)
SOFTMAX_BWD_T256(4, 0)
SOFTMAX_BWD_T256(1, 1)
SOFTMAX_BWD_T256(2, 1)
SOFTMAX_BWD_T256(4, 1)

#endif
