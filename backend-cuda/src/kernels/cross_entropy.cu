// Fused cross-entropy over rows of logits (float T, rows.cuh), never storing the softmax.
//
// Forward: p[0] = logits (row geometry st[0][0], st[0][1]), p[1] = target (i64, row stride
// st[1][0]), p[2] = loss (f32, st[2][0]), p[3] = lse (f32, st[3][0]).
// Backward: p[0] = logits, p[1] = target, p[2] = lse (f32, st[2][0]), p[3] = dloss (f32,
// st[3][0]); the fifth operand, dlogits, has its address in shape[0] (the row kernels use no
// shape) and its row and column strides in st[0][2], st[0][3].
// Both: u[0] = classes c, u[1] = ignore_index (i64 bits), s[0] = label smoothing eps; flag
// bit 1: vector loads (unit column strides and 16-byte aligned rows of logits [and dlogits]).
// Targets are checked on the device first (check_index); while a check has failed
// (index_fault) both kernels return without writing.
//
// Forward per row, in one read of the logits: each thread keeps a running max m and sum
// s = sum(exp(x - m)), rescaling s once per chunk of packs when the chunk raises the max;
// the threads' (m, s) pairs then merge. lse = m + log(s); loss = (1-eps)(lse - x_t) +
// eps(lse - mean(x)), 0 on ignored rows. As on the CPU, an all -inf row has lse NaN, a NaN
// or +inf logit makes lse NaN, and a row of no classes has lse -inf.
// Backward: dlogits = dloss * (exp(x - lse) - (1-eps) onehot(t) - eps/c), 0 on ignored rows.

#if IS_FLOAT

#define CE_P 4  // packs per thread per step of the forward
#define CE_B 4  // packs per thread per step of the backward (measured fastest; RESULTS.md)

// Columns j..j+VW of a row known to lie inside it: one 16-byte load (VEC) or VW strided ones,
// with no bounds checks (the hot loops run on whole chunks; only a row's last chunk checks).
template <bool VEC> __device__ __forceinline__ void load_full(const T* row, i64 cs, i64 j, C* v) {
    if (VEC) {
        const Pack<T, VW> p = *(const Pack<T, VW>*)(row + j);
#pragma unroll
        for (int k = 0; k < VW; ++k) v[k] = TT::load(p.v[k]);
    } else {
#pragma unroll
        for (int k = 0; k < VW; ++k) v[k] = TT::load(row[(j + k) * cs]);
    }
}

// Columns j..j+VW of a row known to lie inside it, strided (the backward's strided path).
__device__ __forceinline__ void store_full(T* row, i64 cs, i64 j, const C* v) {
#pragma unroll
    for (int k = 0; k < VW; ++k) row[(j + k) * cs] = TT::store(v[k]);
}

// Fold one chunk (CE_P packs, `step` columns apart, from column `base`) into this thread's
// running max m, sum s = sum(exp(x - m)) and, with label smoothing, sum sx of the logits.
// CHECK: the row's last chunk, whose columns at or past len read as -inf (which adds 0 to s).
template <bool VEC, bool CHECK>
__device__ __forceinline__ void ce_chunk(const T* x, i64 cs, i64 len, i64 base, i64 step, bool smooth, C& m, C& s,
                                         C& sx) {
    C v[CE_P][VW];
    C mc = neg_inf();
#pragma unroll
    for (int p = 0; p < CE_P; ++p) {
        if (CHECK) load_pack<VEC>(x, cs, len, base + p * step, neg_inf(), v[p]);
        else load_full<VEC>(x, cs, base + p * step, v[p]);
#pragma unroll
        for (int k = 0; k < VW; ++k) mc = cmax(mc, v[p][k]);
    }
    // From m = -inf the factor is exp(-inf) = 0, and s is 0 (or NaN) there anyway.
    if (mc > m) {
        s *= exp_diff(m, mc);
        m = mc;
    }
    if (m != neg_inf()) {
        // -inf logits give exp(-inf) = 0; NaN poisons s; +inf makes m = +inf and inf - inf = NaN.
#pragma unroll
        for (int p = 0; p < CE_P; ++p)
#pragma unroll
            for (int k = 0; k < VW; ++k) s += exp_diff(v[p][k], m);
    } else {
        // Everything so far is -inf or NaN (fmax skips NaN): the NaNs must still poison s,
        // and x - m would turn the -infs into NaN too.
#pragma unroll
        for (int p = 0; p < CE_P; ++p)
#pragma unroll
            for (int k = 0; k < VW; ++k)
                if (v[p][k] != neg_inf()) s += v[p][k];
    }
    if (smooth) {
#pragma unroll
        for (int p = 0; p < CE_P; ++p)
#pragma unroll
            for (int k = 0; k < VW; ++k)
                if (!CHECK || base + p * step + k < len) sx += v[p][k];
    }
}

template <bool VEC> __device__ __forceinline__ void ce_forward(const Args& a, C* sh) {
    const i64 c = (i64)a.u[0], ignore = (i64)a.u[1];
    const C eps = (C)a.s[0];
    const bool smooth = eps != (C)0;
    const i64 cs = a.st[0][1];
    // A thread's packs are `step` columns apart, so a warp's loads are contiguous.
    const i64 step = (i64)blockDim.x * VW, span = step * CE_P;
    FOR_ROWS(a) {
        const u64 row = r0 + threadIdx.y;
        const i64 len = row < a.n ? c : 0;
        const T* x = (const T*)a.p[0] + (row < a.n ? (i64)row * a.st[0][0] : 0);
        C m = neg_inf(), s = (C)0, sx = (C)0;
        i64 base = (i64)threadIdx.x * VW;
        for (; base + (CE_P - 1) * step + VW <= len; base += span)
            ce_chunk<VEC, false>(x, cs, len, base, step, smooth, m, s, sx);
        // At most one chunk is left, and only partly inside the row.
        if (base < len) ce_chunk<VEC, true>(x, cs, len, base, step, smooth, m, s, sx);
        const C m_all = group_reduce<true>(m, sh);
        // Equal maxima need no rescaling (and -inf - -inf would be NaN).
        const C s_all = group_reduce<false>(m == m_all ? s : s * cexp(m - m_all), sh);
        const C sx_all = smooth ? group_reduce<false>(sx, sh) : (C)0;
        if (threadIdx.x == 0 && row < a.n) {
            C lse;
            if (c == 0) lse = neg_inf();
            else if (m_all == neg_inf()) lse = quiet_nan();
            else lse = m_all + clog(s_all);
            const i64 t = ((const i64*)a.p[1])[(i64)row * a.st[1][0]];
            C loss = (C)0;
            if (t != ignore && t >= 0 && t < c) {
                const C nll = lse - TT::load(x[t * cs]);
                loss = eps == (C)0 ? nll : ((C)1 - eps) * nll + eps * (lse - sx_all / (C)c);
            }
            ((float*)a.p[2])[(i64)row * a.st[2][0]] = (float)loss;
            ((float*)a.p[3])[(i64)row * a.st[3][0]] = (float)lse;
        }
    }
}

// One row's target, log-sum-exp and upstream gradient, and from them the gradient of a pack
// of logits starting at column j: dl * (softmax - smooth) - dl * keep at the target, zero on an
// ignored row. Both backward kernels build one per row before their pack loop.
struct CeGrad {
    i64 t;
    C l, dl, dk, ds;
    bool ignored;
    __device__ __forceinline__ CeGrad(const Args& a, u64 row, C keep, C smooth) {
        t = ((const i64*)a.p[1])[(i64)row * a.st[1][0]];
        l = (C)((const float*)a.p[2])[(i64)row * a.st[2][0]];
        dl = (C)((const float*)a.p[3])[(i64)row * a.st[3][0]];
        ignored = t == (i64)a.u[1];
        dk = dl * keep;
        ds = dl * smooth;
    }
    __device__ __forceinline__ void apply(i64 j, C (&v)[VW]) const {
        const i64 dt = t - j;
        const int hot = dt >= 0 && dt < VW ? (int)dt : -1;  // the target's slot in this pack
#pragma unroll
        for (int k = 0; k < VW; ++k) v[k] = ignored ? (C)0 : dl * exp_diff(v[k], l) - ds - (k == hot ? dk : (C)0);
    }
};

// Grid: x over column spans of B packs per thread, y over rows (grid-stride in both). This
// is the strided path; dense rows take ce_backward_vec below.
template <int B> __device__ __forceinline__ void ce_backward(const Args& a) {
    const i64 c = (i64)a.u[0];
    const C eps = (C)a.s[0];
    const C keep = (C)1 - eps, smooth = eps / (C)(c > 0 ? c : 1);
    const i64 xcs = a.st[0][1], gcs = a.st[0][3];
    const i64 step = (i64)blockDim.x * VW, span = step * B;
    for (u64 row = blockIdx.y; row < a.n; row += gridDim.y) {
        const T* x = (const T*)a.p[0] + (i64)row * a.st[0][0];
        T* g = (T*)a.shape[0] + (i64)row * a.st[0][2];
        for (i64 j0 = (i64)blockIdx.x * span + (i64)threadIdx.x * VW; j0 < c; j0 += (i64)gridDim.x * span) {
            // Whole for every thread of the block or for none: j0 - threadIdx.x * VW is uniform.
            const bool full = j0 - (i64)threadIdx.x * VW + span <= c;
            C v[VW];
            const CeGrad r(a, row, keep, smooth);
#pragma unroll
            for (int p = 0; p < B; ++p) {
                const i64 j = j0 + p * step;
                load_pack<false>(x, xcs, c, j, (C)0, v);
                r.apply(j, v);
                if (full) store_full(g, gcs, j, v);
                else store_pack<false>(g, gcs, c, j, v);
            }
        }
    }
}

// The vector path of the backward. Each thread issues its B pack loads, raw (a bf16 pack
// takes 4 registers, not 8), together with the row's target, lse and dloss, so the block's
// few dependent loads overlap instead of queueing before the data streams. Every pack that
// lies inside the row is loaded up front, also in a row's last (partial) span, which with
// 32000 classes is nearly a quarter of the data; only a pack that straddles the row's end
// takes the checked path. Loads and stores stream (evict-first): the data is touched once,
// and with plain loads and stores this kernel measured far slower (RESULTS.md, "Kernel
// design notes").
__device__ __forceinline__ Pack<T, VW> ld_raw(const T* p) {
    const int4 v = __ldcs((const int4*)p);
    return *(const Pack<T, VW>*)&v;
}
__device__ __forceinline__ void st_raw(T* p, const Pack<T, VW>& v) { __stcs((int4*)p, *(const int4*)&v); }

template <int B> __device__ __forceinline__ void ce_backward_vec(const Args& a) {
    typedef Pack<T, VW> P;
    const i64 c = (i64)a.u[0];
    const C eps = (C)a.s[0];
    const C keep = (C)1 - eps, smooth = eps / (C)(c > 0 ? c : 1);
    const i64 step = (i64)blockDim.x * VW, span = step * B;
    for (u64 row = blockIdx.y; row < a.n; row += gridDim.y) {
        const T* x = (const T*)a.p[0] + (i64)row * a.st[0][0];
        T* g = (T*)a.shape[0] + (i64)row * a.st[0][2];
        for (i64 j0 = (i64)blockIdx.x * span + (i64)threadIdx.x * VW; j0 < c; j0 += (i64)gridDim.x * span) {
            P raw[B];
#pragma unroll
            for (int p = 0; p < B; ++p)
                if (j0 + p * step + VW <= c) raw[p] = ld_raw(x + j0 + p * step);
            const CeGrad r(a, row, keep, smooth);
#pragma unroll
            for (int p = 0; p < B; ++p) {
                const i64 j = j0 + p * step;
                const bool inside = j + VW <= c;
                if (!inside && j >= c) continue;
                C v[VW];
                if (inside) {
#pragma unroll
                    for (int k = 0; k < VW; ++k) v[k] = TT::load(raw[p].v[k]);
                } else {
                    load_pack<true>(x, 1, c, j, (C)0, v);
                }
                r.apply(j, v);
                if (inside) {
                    P o;
#pragma unroll
                    for (int k = 0; k < VW; ++k) o.v[k] = TT::store(v[k]);
                    st_raw(g + j, o);
                } else {
                    store_pack<true>(g, 1, c, j, v);
                }
            }
        }
    }
}

// ops/cross_entropy.rs launches 256 threads per block. Four blocks per SM (64 registers) for
// the memory-bound 4- and 2-byte types; f64's doubled registers get three blocks (80), which
// keeps its forward from spilling. A bad target (check_index, index_fault) makes the op write
// nothing.
#define CE_KERNEL extern "C" __global__ void __launch_bounds__(256, sizeof(T) == 8 ? 3 : 4)
CE_KERNEL cross_entropy_fwd_v0(const Args a) {
    if (index_faulted()) return;
    RED_SMEM;
    ce_forward<false>(a, sh);
}
CE_KERNEL cross_entropy_fwd_v1(const Args a) {
    if (index_faulted()) return;
    RED_SMEM;
    ce_forward<true>(a, sh);
}
CE_KERNEL cross_entropy_bwd_v0(const Args a) {
    if (!index_faulted()) ce_backward<CE_B>(a);
}
CE_KERNEL cross_entropy_bwd_v1(const Args a) {
    if (!index_faulted()) ce_backward_vec<CE_B>(a);
}

#endif
