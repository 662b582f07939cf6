// Fused cross-entropy over rows of logits (float T, rows.cuh), never storing the softmax.
//
// Forward: p[0] = logits (row geometry st[0][0], st[0][1]), p[1] = target (i64, row stride
// st[1][0]), p[2] = loss (f32, st[2][0]), p[3] = lse (f32, st[3][0]).
// Backward: p[0] = logits, p[1] = target, p[2] = lse (f32, st[2][0]), p[3] = dloss (f32,
// st[3][0]); the fifth operand, dlogits, has its address in shape[0] (the row kernels use no
// shape) and its row and column strides in st[0][2], st[0][3].
// Both: u[0] = classes c, u[1] = ignore_index (i64 bits), s[0] = label smoothing eps; flag
// bit 1: vector loads (unit column strides and 16-byte aligned rows of logits [and dlogits]).
// Targets were checked on the host side (check_index) before either kernel runs.
//
// Forward per row, in one read of the logits: each thread keeps a running max m and sum
// s = sum(exp(x - m)), rescaling s once per chunk of packs when the chunk raises the max;
// the threads' (m, s) pairs then merge. lse = m + log(s); loss = (1-eps)(lse - x_t) +
// eps(lse - mean(x)), 0 on ignored rows. As on the CPU, an all -inf row has lse NaN, a NaN
// or +inf logit makes lse NaN, and a row of no classes has lse -inf.
// Backward: dlogits = dloss * (exp(x - lse) - (1-eps) onehot(t) - eps/c), 0 on ignored rows.

#if IS_FLOAT

#define CE_P 4

template <bool VEC> __device__ __forceinline__ void ce_forward(const Args& a, C* sh) {
    const i64 c = (i64)a.u[0], ignore = (i64)a.u[1];
    const C eps = (C)a.s[0];
    const i64 cs = a.st[0][1];
    FOR_ROWS(a) {
        const u64 row = r0 + threadIdx.y;
        const i64 len = row < a.n ? c : 0;
        const T* x = (const T*)a.p[0] + (row < a.n ? (i64)row * a.st[0][0] : 0);
        C m = neg_inf(), s = (C)0, sx = (C)0;
        for (i64 base = (i64)threadIdx.x * VW; base < len; base += (i64)blockDim.x * VW * CE_P) {
            C v[CE_P][VW];
            C mc = neg_inf();
#pragma unroll
            for (int p = 0; p < CE_P; ++p) {
                load_pack<VEC>(x, cs, len, base + (i64)p * blockDim.x * VW, neg_inf(), v[p]);
#pragma unroll
                for (int k = 0; k < VW; ++k) mc = cmax(mc, v[p][k]);
            }
            // From m = -inf the factor is exp(-inf) = 0, and s is 0 there anyway.
            if (mc > m) {
                s *= cexp(m - mc);
                m = mc;
            }
#pragma unroll
            for (int p = 0; p < CE_P; ++p) {
                const i64 j = base + (i64)p * blockDim.x * VW;
#pragma unroll
                for (int k = 0; k < VW; ++k) {
                    if (j + k < len) {
                        // -inf adds 0 even while m is -inf (a NaN still poisons s).
                        s += v[p][k] == neg_inf() ? (C)0 : cexp(v[p][k] - m);
                        sx += v[p][k];
                    }
                }
            }
        }
        const C m_all = group_reduce<true>(m, sh);
        // Equal maxima need no rescaling (and -inf - -inf would be NaN).
        const C s_all = group_reduce<false>(m == m_all ? s : s * cexp(m - m_all), sh);
        const C sx_all = eps != (C)0 ? group_reduce<false>(sx, sh) : (C)0;
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

// Grid: x over column chunks, y over rows (grid-stride in both).
template <bool VEC> __device__ __forceinline__ void ce_backward(const Args& a) {
    const i64 c = (i64)a.u[0], ignore = (i64)a.u[1];
    const C eps = (C)a.s[0];
    const C keep = (C)1 - eps, smooth = eps / (C)(c > 0 ? c : 1);
    for (u64 row = blockIdx.y; row < a.n; row += gridDim.y) {
        const i64 t = ((const i64*)a.p[1])[(i64)row * a.st[1][0]];
        const bool ignored = t == ignore;
        const C l = (C)((const float*)a.p[2])[(i64)row * a.st[2][0]];
        const C dl = (C)((const float*)a.p[3])[(i64)row * a.st[3][0]];
        const T* x = (const T*)a.p[0] + (i64)row * a.st[0][0];
        T* g = (T*)a.shape[0] + (i64)row * a.st[0][2];
        for (i64 j = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * VW; j < c;
             j += (i64)gridDim.x * blockDim.x * VW) {
            C v[VW];
            if (!ignored) load_pack<VEC>(x, a.st[0][1], c, j, (C)0, v);
#pragma unroll
            for (int k = 0; k < VW; ++k)
                v[k] = ignored ? (C)0 : dl * (cexp(v[k] - l) - (j + k == t ? keep : (C)0) - smooth);
            store_pack<VEC>(g, a.st[0][3], c, j, v);
        }
    }
}

// A bad target (check_index, index_fault) makes the op write nothing.
KERNEL cross_entropy_fwd_v0(const Args a) {
    if (index_faulted()) return;
    RED_SMEM;
    ce_forward<false>(a, sh);
}
KERNEL cross_entropy_fwd_v1(const Args a) {
    if (index_faulted()) return;
    RED_SMEM;
    ce_forward<true>(a, sh);
}
KERNEL cross_entropy_bwd_v0(const Args a) {
    if (!index_faulted()) ce_backward<false>(a);
}
KERNEL cross_entropy_bwd_v1(const Args a) {
    if (!index_faulted()) ce_backward<true>(a);
}

#endif
