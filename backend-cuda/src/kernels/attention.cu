// Scaled dot-product attention, flash style: the s×t score matrix never exists. A block takes
// a tile of query rows (or, in the dk/dv pass, of keys), keeps it in shared memory and streams
// the other side through shared memory one 32-row tile at a time; softmax is online (running
// max and sum per row) in the compute type C (f32 for f16/bf16/f32, f64 for f64).
//
// Work split inside a block (WARPS warps): each warp owns ROWS rows of the resident tile, and
// in the score phase lane `l` takes row `l` of the streamed tile, so one score costs one
// length-d dot product per lane with the resident row broadcast from shared memory; in the
// accumulation phase lane `l` owns the output dims `l, l+32, ..` (NR of them, NR = DMAX/32)
// and the 32 weights of the tile are passed around with shuffles. Shared rows have an odd
// stride (`d | 1`) so that 32 lanes reading 32 different rows hit 32 different banks.
//
// Operands may have any strides (passed per operand, in elements); loads convert to C once
// when a tile enters shared memory. The causal mask is bottom-right aligned: query i sees
// keys j < visible(i) = clamp(i + t + 1 - s, 0, t); a query that sees no key gets NaN output
// and NaN lse (forward) and contributes nothing (backward), as in the CPU reference.

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

// Mirror of `AttnArgs` in ops/attention.rs.
struct AttnArgs {
    char* p[9];     // q k v o lse do dq dk dv
    char* delta;    // backward: rowsum(do ∘ o) per query, dense (b, hq, s), type C
    i64 st[9][4];   // element strides of each operand (lse: b, h, s)
    i64 b, hq, hk, s, t, d;
    double scale;
    i64 causal;
};

#define WARPS 8
#define ROWS 4             // resident rows per warp
#define BR (WARPS * ROWS)  // resident rows per block
#define BC 32              // streamed rows per tile: one per lane
#define FULL 0xffffffffu

__device__ __forceinline__ float cexp(float x) { return expf(x); }
__device__ __forceinline__ double cexp(double x) { return exp(x); }
__device__ __forceinline__ float clog(float x) { return logf(x); }
__device__ __forceinline__ double clog(double x) { return log(x); }
__device__ __forceinline__ float cmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double cmax(double a, double b) { return fmax(a, b); }
#define NEG_INF ((C)__int_as_float(0xff800000u))
#define QNAN ((C)__int_as_float(0x7fc00000u))

__device__ __forceinline__ C warp_max(C x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = cmax(x, __shfl_xor_sync(FULL, x, o));
    return x;
}
__device__ __forceinline__ C warp_sum(C x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}

// Keys query i sees.
__device__ __forceinline__ i64 visible(const AttnArgs& a, i64 i) {
    if (!a.causal) return a.t;
    i64 v = i + a.t + 1 - a.s;
    return v < 0 ? 0 : (v > a.t ? a.t : v);
}

// Rows r0.. r0+rows of one head (element `base`, row stride srow, column stride scol) into
// shared `dst` (row stride dp), converted to C; rows at or past `limit` read as zeros. A warp
// per row, lanes along it: coalesced when the head dim is dense.
__device__ __forceinline__ void load_tile(C* dst, int rows, int dp, const T* src, i64 base, i64 srow, i64 scol,
                                          i64 r0, i64 limit, int d) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int r = warp; r < rows; r += nw) {
        const i64 row = r0 + r;
        const bool in = row < limit;
        for (int c = lane; c < d; c += 32) dst[r * dp + c] = in ? TT::load(src[base + row * srow + c * scol]) : (C)0;
    }
}

// ---- forward ----------------------------------------------------------------------------------
// Block: BR queries of one (batch, head); streams K and V tiles of BC keys.
// Shared: qs (BR × dp), ks (BC × dp), vs (BC × dp).
template <int NR> __device__ void attn_fwd(const AttnArgs& a, C* sm) {
    const int d = (int)a.d, dp = d | 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    C* qs = sm;
    C* ks = qs + BR * dp;
    C* vs = ks + BC * dp;
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    T* o = (T*)a.p[3];
    float* lse = (float*)a.p[4];
    const C scale = (C)a.scale;
    const i64 group = a.hq / a.hk, qtiles = (a.s + BR - 1) / BR, work = a.b * a.hq * qtiles;
    for (i64 w = blockIdx.x; w < work; w += gridDim.x) {
        const i64 qt = w % qtiles, bh = w / qtiles, h = bh % a.hq, bi = bh / a.hq, kh = h / group;
        const i64 i0 = qt * BR;
        __syncthreads();  // the previous item's readers of shared memory are done
        load_tile(qs, BR, dp, q, bi * a.st[0][0] + h * a.st[0][1], a.st[0][2], a.st[0][3], i0, a.s, d);
        const i64 kbase = bi * a.st[1][0] + kh * a.st[1][1], vbase = bi * a.st[2][0] + kh * a.st[2][1];
        i64 vis[ROWS];
        C m[ROWS], l[ROWS], acc[ROWS][NR];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const i64 i = i0 + warp * ROWS + r;
            vis[r] = i < a.s ? visible(a, i) : 0;
            m[r] = NEG_INF;
            l[r] = (C)0;
#pragma unroll
            for (int kk = 0; kk < NR; ++kk) acc[r][kk] = (C)0;
        }
        // The mask is monotone in i: the tile's last query sees the most keys.
        const i64 last = (i0 + BR < a.s ? i0 + BR : a.s) - 1;
        const i64 nkeys = visible(a, last);
        const C* qrow = qs + warp * ROWS * dp;
        for (i64 j0 = 0; j0 < nkeys; j0 += BC) {
            __syncthreads();  // qs is loaded; the previous K/V tile is consumed
            load_tile(ks, BC, dp, k, kbase, a.st[1][2], a.st[1][3], j0, a.t, d);
            load_tile(vs, BC, dp, v, vbase, a.st[2][2], a.st[2][3], j0, a.t, d);
            __syncthreads();
            // Scores of this warp's rows against key j0 + lane.
            C sc[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) sc[r] = (C)0;
            const C* krow = ks + lane * dp;
            for (int c = 0; c < d; ++c) {
                const C kc = krow[c];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) sc[r] += qrow[r * dp + c] * kc;
            }
            const i64 j = j0 + lane;
            C p[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                p[r] = (C)0;
                if (j0 < vis[r]) {  // uniform across the warp (one row per warp)
                    const bool ok = j < vis[r];
                    const C x = ok ? sc[r] * scale : NEG_INF;
                    const C mn = cmax(m[r], warp_max(x));
                    // All visible scores -inf so far: subtract 0 instead (exp(-inf - -inf) is NaN).
                    const C mu = mn == NEG_INF ? (C)0 : mn;
                    const C corr = cexp(m[r] - mu);
                    p[r] = ok ? cexp(x - mu) : (C)0;
                    l[r] = l[r] * corr + warp_sum(p[r]);
                    m[r] = mn;
#pragma unroll
                    for (int kk = 0; kk < NR; ++kk) acc[r][kk] *= corr;
                }
            }
            // acc += P·V over the tile's keys; masked keys are skipped, not multiplied by 0
            // (a non-finite value under the mask must not leak in).
            const int jn = (int)(nkeys - j0 < BC ? nkeys - j0 : BC);
            for (int jj = 0; jj < jn; ++jj) {
                C vv[NR];
#pragma unroll
                for (int kk = 0; kk < NR; ++kk) {
                    const int c = lane + 32 * kk;
                    vv[kk] = c < d ? vs[jj * dp + c] : (C)0;
                }
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    if (j0 + jj < vis[r]) {
                        const C pj = __shfl_sync(FULL, p[r], jj);
#pragma unroll
                        for (int kk = 0; kk < NR; ++kk) acc[r][kk] += pj * vv[kk];
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const i64 i = i0 + warp * ROWS + r;
            if (i >= a.s) continue;
            const bool dead = vis[r] == 0;
            const i64 ob = bi * a.st[3][0] + h * a.st[3][1] + i * a.st[3][2];
#pragma unroll
            for (int kk = 0; kk < NR; ++kk) {
                const int c = lane + 32 * kk;
                if (c < d) o[ob + c * a.st[3][3]] = TT::store(dead ? QNAN : acc[r][kk] / l[r]);
            }
            if (lane == 0) {
                const C ls = dead ? QNAN : m[r] + clog(l[r]);
                lse[bi * a.st[4][0] + h * a.st[4][1] + i * a.st[4][2]] = (float)ls;
            }
        }
    }
}

// ---- backward ---------------------------------------------------------------------------------
// With P = exp(scale·QKᵀ - lse) recomputed from the saved lse, D_i = <do_i, o_i>,
// dS = P ∘ (dO·Vᵀ - D): dq = scale·dS·K, dk = scale·dSᵀ·Q, dv = Pᵀ·dO. Three passes, no
// atomics (deterministic): D per query; dq per query tile streaming keys; dk and dv per key
// tile streaming the queries of every query head that reads this kv head.

// D: a warp per query row.
__device__ void attn_bwd_delta(const AttnArgs& a) {
    const T* o = (const T*)a.p[3];
    const T* dout = (const T*)a.p[5];
    C* delta = (C*)a.delta;
    const int lane = threadIdx.x & 31;
    const i64 rows = a.b * a.hq * a.s;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows; row += warps) {
        const i64 i = row % a.s, bh = row / a.s, h = bh % a.hq, bi = bh / a.hq;
        const i64 ob = bi * a.st[3][0] + h * a.st[3][1] + i * a.st[3][2];
        const i64 db = bi * a.st[5][0] + h * a.st[5][1] + i * a.st[5][2];
        C s = (C)0;
        for (i64 c = lane; c < a.d; c += 32) s += TT::load(dout[db + c * a.st[5][3]]) * TT::load(o[ob + c * a.st[3][3]]);
        s = warp_sum(s);
        if (lane == 0) delta[row] = s;
    }
}

// dq. Block: BR queries of one (batch, head); streams K and V.
// Shared: qs, dos (BR × dp), ks, vs (BC × dp).
template <int NR> __device__ void attn_bwd_dq(const AttnArgs& a, C* sm) {
    const int d = (int)a.d, dp = d | 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    C* qs = sm;
    C* dos = qs + BR * dp;
    C* ks = dos + BR * dp;
    C* vs = ks + BC * dp;
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    const float* lse = (const float*)a.p[4];
    const T* dout = (const T*)a.p[5];
    T* dq = (T*)a.p[6];
    const C* delta = (const C*)a.delta;
    const C scale = (C)a.scale;
    const i64 group = a.hq / a.hk, qtiles = (a.s + BR - 1) / BR, work = a.b * a.hq * qtiles;
    for (i64 w = blockIdx.x; w < work; w += gridDim.x) {
        const i64 qt = w % qtiles, bh = w / qtiles, h = bh % a.hq, bi = bh / a.hq, kh = h / group;
        const i64 i0 = qt * BR;
        __syncthreads();
        load_tile(qs, BR, dp, q, bi * a.st[0][0] + h * a.st[0][1], a.st[0][2], a.st[0][3], i0, a.s, d);
        load_tile(dos, BR, dp, dout, bi * a.st[5][0] + h * a.st[5][1], a.st[5][2], a.st[5][3], i0, a.s, d);
        const i64 kbase = bi * a.st[1][0] + kh * a.st[1][1], vbase = bi * a.st[2][0] + kh * a.st[2][1];
        i64 vis[ROWS];
        C ls[ROWS], dl[ROWS], acc[ROWS][NR];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const i64 i = i0 + warp * ROWS + r;
            const bool in = i < a.s;
            vis[r] = in ? visible(a, i) : 0;
            // Read only where the row sees a key: a fully masked row's lse is NaN, unused.
            ls[r] = vis[r] > 0 ? (C)lse[bi * a.st[4][0] + h * a.st[4][1] + i * a.st[4][2]] : (C)0;
            dl[r] = vis[r] > 0 ? delta[bh * a.s + i] : (C)0;
#pragma unroll
            for (int kk = 0; kk < NR; ++kk) acc[r][kk] = (C)0;
        }
        const i64 last = (i0 + BR < a.s ? i0 + BR : a.s) - 1;
        const i64 nkeys = visible(a, last);
        const C* qrow = qs + warp * ROWS * dp;
        const C* dorow = dos + warp * ROWS * dp;
        for (i64 j0 = 0; j0 < nkeys; j0 += BC) {
            __syncthreads();
            load_tile(ks, BC, dp, k, kbase, a.st[1][2], a.st[1][3], j0, a.t, d);
            load_tile(vs, BC, dp, v, vbase, a.st[2][2], a.st[2][3], j0, a.t, d);
            __syncthreads();
            C sc[ROWS], dpv[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) sc[r] = dpv[r] = (C)0;
            const C* krow = ks + lane * dp;
            const C* vrow = vs + lane * dp;
            for (int c = 0; c < d; ++c) {
                const C kc = krow[c], vc = vrow[c];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    sc[r] += qrow[r * dp + c] * kc;
                    dpv[r] += dorow[r * dp + c] * vc;
                }
            }
            const i64 j = j0 + lane;
            C ds[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const bool ok = j < vis[r];
                const C p = ok ? cexp(scale * sc[r] - ls[r]) : (C)0;
                ds[r] = ok ? p * (dpv[r] - dl[r]) : (C)0;
            }
            const int jn = (int)(nkeys - j0 < BC ? nkeys - j0 : BC);
            for (int jj = 0; jj < jn; ++jj) {
                C kv[NR];
#pragma unroll
                for (int kk = 0; kk < NR; ++kk) {
                    const int c = lane + 32 * kk;
                    kv[kk] = c < d ? ks[jj * dp + c] : (C)0;
                }
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    if (j0 + jj < vis[r]) {
                        const C g = __shfl_sync(FULL, ds[r], jj);
#pragma unroll
                        for (int kk = 0; kk < NR; ++kk) acc[r][kk] += g * kv[kk];
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const i64 i = i0 + warp * ROWS + r;
            if (i >= a.s) continue;
            const i64 ob = bi * a.st[6][0] + h * a.st[6][1] + i * a.st[6][2];
#pragma unroll
            for (int kk = 0; kk < NR; ++kk) {
                const int c = lane + 32 * kk;
                if (c < d) dq[ob + c * a.st[6][3]] = TT::store(scale * acc[r][kk]);
            }
        }
    }
}

// dk and dv. Block: BR keys of one (batch, kv head), ROWS per warp; streams tiles of BC
// queries (lane = query) of each query head of the group, skipping the query tiles the causal
// mask hides from every key of the block. Shared: ks, vs (BR × dp), qs, dos (BC × dp), and
// the lse and D of the query tile.
template <int NR> __device__ void attn_bwd_dkv(const AttnArgs& a, C* sm) {
    const int d = (int)a.d, dp = d | 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    C* ks = sm;
    C* vs = ks + BR * dp;
    C* qs = vs + BR * dp;
    C* dos = qs + BC * dp;
    C* lse_s = dos + BC * dp;
    C* del_s = lse_s + BC;
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    const float* lse = (const float*)a.p[4];
    const T* dout = (const T*)a.p[5];
    T* dk = (T*)a.p[7];
    T* dv = (T*)a.p[8];
    const C* delta = (const C*)a.delta;
    const C scale = (C)a.scale;
    const i64 group = a.hq / a.hk, ktiles = (a.t + BR - 1) / BR, work = a.b * a.hk * ktiles;
    for (i64 w = blockIdx.x; w < work; w += gridDim.x) {
        const i64 kt = w % ktiles, bk = w / ktiles, kh = bk % a.hk, bi = bk / a.hk;
        const i64 j0 = kt * BR;
        __syncthreads();
        load_tile(ks, BR, dp, k, bi * a.st[1][0] + kh * a.st[1][1], a.st[1][2], a.st[1][3], j0, a.t, d);
        load_tile(vs, BR, dp, v, bi * a.st[2][0] + kh * a.st[2][1], a.st[2][2], a.st[2][3], j0, a.t, d);
        C gk[ROWS][NR], gv[ROWS][NR];
        i64 jr[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            jr[r] = j0 + warp * ROWS + r;
#pragma unroll
            for (int kk = 0; kk < NR; ++kk) gk[r][kk] = gv[r][kk] = (C)0;
        }
        // The first query that sees key j0: i + t + 1 - s > j0.
        i64 first = a.causal ? j0 + a.s - a.t : 0;
        if (first < 0) first = 0;
        const C* krow = ks + warp * ROWS * dp;
        const C* vrow = vs + warp * ROWS * dp;
        for (i64 hh = 0; hh < group; ++hh) {
            const i64 h = kh * group + hh, bh = bi * a.hq + h;
            for (i64 i0 = first / BC * BC; i0 < a.s; i0 += BC) {
                __syncthreads();  // ks/vs are loaded; the previous query tile is consumed
                load_tile(qs, BC, dp, q, bi * a.st[0][0] + h * a.st[0][1], a.st[0][2], a.st[0][3], i0, a.s, d);
                load_tile(dos, BC, dp, dout, bi * a.st[5][0] + h * a.st[5][1], a.st[5][2], a.st[5][3], i0, a.s, d);
                if (threadIdx.x < BC) {
                    const i64 i = i0 + threadIdx.x;
                    const bool live = i < a.s && visible(a, i) > 0;
                    lse_s[threadIdx.x] = live ? (C)lse[bi * a.st[4][0] + h * a.st[4][1] + i * a.st[4][2]] : (C)0;
                    del_s[threadIdx.x] = live ? delta[bh * a.s + i] : (C)0;
                }
                __syncthreads();
                const i64 i = i0 + lane;
                const i64 vi = i < a.s ? visible(a, i) : 0;
                C sc[ROWS], dpv[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) sc[r] = dpv[r] = (C)0;
                const C* qrow = qs + lane * dp;
                const C* dorow = dos + lane * dp;
                for (int c = 0; c < d; ++c) {
                    const C qc = qrow[c], dc = dorow[c];
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        sc[r] += qc * krow[r * dp + c];
                        dpv[r] += dc * vrow[r * dp + c];
                    }
                }
                C p[ROWS], ds[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const bool ok = jr[r] < vi;  // vi <= t, so this also bounds jr by t
                    p[r] = ok ? cexp(scale * sc[r] - lse_s[lane]) : (C)0;
                    ds[r] = ok ? p[r] * (dpv[r] - del_s[lane]) : (C)0;
                }
                const int in = (int)(a.s - i0 < BC ? a.s - i0 : BC);
                for (int ii = 0; ii < in; ++ii) {
                    const i64 vii = visible(a, i0 + ii);
                    C qv[NR], dov[NR];
#pragma unroll
                    for (int kk = 0; kk < NR; ++kk) {
                        const int c = lane + 32 * kk;
                        qv[kk] = c < d ? qs[ii * dp + c] : (C)0;
                        dov[kk] = c < d ? dos[ii * dp + c] : (C)0;
                    }
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        if (jr[r] < vii) {  // uniform: one key per warp row
                            const C pr = __shfl_sync(FULL, p[r], ii), dr = __shfl_sync(FULL, ds[r], ii);
#pragma unroll
                            for (int kk = 0; kk < NR; ++kk) {
                                gv[r][kk] += pr * dov[kk];
                                gk[r][kk] += dr * qv[kk];
                            }
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (jr[r] >= a.t) continue;
            const i64 kb = bi * a.st[7][0] + kh * a.st[7][1] + jr[r] * a.st[7][2];
            const i64 vb = bi * a.st[8][0] + kh * a.st[8][1] + jr[r] * a.st[8][2];
#pragma unroll
            for (int kk = 0; kk < NR; ++kk) {
                const int c = lane + 32 * kk;
                if (c < d) {
                    dk[kb + c * a.st[7][3]] = TT::store(scale * gk[r][kk]);
                    dv[vb + c * a.st[8][3]] = TT::store(gv[r][kk]);
                }
            }
        }
    }
}

// Dynamic shared memory, sized by the launcher from the head dim (see ops/attention.rs).
#define ASMEM extern __shared__ __align__(16) unsigned char smem_raw[]
#define ATTN_KERNELS(DMAX)                                                                         \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) attn_fwd_##DMAX(const AttnArgs a) {     \
        ASMEM;                                                                                     \
        attn_fwd<DMAX / 32>(a, (C*)smem_raw);                                                      \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) attn_bwd_dq_##DMAX(const AttnArgs a) {  \
        ASMEM;                                                                                     \
        attn_bwd_dq<DMAX / 32>(a, (C*)smem_raw);                                                   \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) attn_bwd_dkv_##DMAX(const AttnArgs a) { \
        ASMEM;                                                                                     \
        attn_bwd_dkv<DMAX / 32>(a, (C*)smem_raw);                                                  \
    }

ATTN_KERNELS(32)
ATTN_KERNELS(64)
ATTN_KERNELS(128)
// f64 at 256 would need more shared memory than a block gets; the launcher refuses it.
ATTN_KERNELS(256)

extern "C" __global__ void attn_bwd_delta_k(const AttnArgs a) { attn_bwd_delta(a); }

// ---- tensor-core forward (f16 / bf16, sm_80+) ------------------------------------------------
// FlashAttention-2 style. A block (4 warps) takes TC_BM = 64 query rows of one (batch, head);
// warp w owns rows 16w..16w+15 and keeps their Q fragments in registers. K and V stream
// through shared memory in tiles of TC_BN = 64 keys, double-buffered with cp.async. S = Q·Kᵀ
// and O += P·V use mma.m16n8k16 (f32 accumulate); the online softmax runs in f32 (base 2) on
// the accumulator fragments, with row max and sum reduced over the 4 lanes of a quad.
// The head dim is padded to D (64 or 128) with zeros in shared memory; the launcher picks this
// path only for head dims that are multiples of 8, a dense head dim, 16-byte aligned rows of
// q/k/v and 4-byte aligned pairs of o (see ops/attention.rs).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit A/B), g = lane / 4, c = lane % 4:
// A (16×16, row): a0a1 (g, 2c..), a2a3 (g+8, 2c..), a4a5 (g, 2c+8..), a6a7 (g+8, 2c+8..);
// B (16×8, col): b0b1 (k = 2c.., n = g), b2b3 (k = 2c+8.., n = g);
// C (16×8): c0c1 (g, 2c..), c2c3 (g+8, 2c..). Pairs pack the lower index in the low half.
#define TC_IS_h16 1
#define TC_IS_b16 2
#define TC_CAT_(a, b) a##b
#define TC_CAT(a, b) TC_CAT_(a, b)
#if TC_CAT(TC_IS_, ELEM) == 1 || TC_CAT(TC_IS_, ELEM) == 2
#if TC_CAT(TC_IS_, ELEM) == 1
#define TC_MMA "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
#define TC_CVT2 "cvt.rn.f16x2.f32"
#else
#define TC_MMA "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
#define TC_CVT2 "cvt.rn.bf16x2.f32"
#endif

#define TC_BM 64
#define TC_BN 64
#define TC_THREADS 128

__device__ __forceinline__ u32 tc_smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global -> shared; `bytes` 0 fills zeros (src is then not read).
__device__ __forceinline__ void tc_cp16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tc_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void tc_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void tc_ldsm4(u32 r[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void tc_ldsm4t(u32 r[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// d += a·b (16×8×16).
__device__ __forceinline__ void tc_mma(float d[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile(TC_MMA " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// (lo, hi) -> packed pair, lo in the low half.
__device__ __forceinline__ u32 tc_pack(float lo, float hi) {
    u32 r;
    asm(TC_CVT2 " %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Rows r0.. r0+TC_BN (or TC_BM) of one head into shared `dst` (row stride D + 8 elements) with
// cp.async; rows at or past `limit` and columns at or past d are zeros.
template <int D>
__device__ __forceinline__ void tc_load_tile(T* dst, const T* src, i64 base, i64 srow, i64 r0, i64 limit, int d) {
    constexpr int CH = D / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < 64 * CH; c += TC_THREADS) {
        const int r = c / CH, col = (c % CH) * 8;
        const i64 row = r0 + r;
        const bool in = row < limit && col < d;
        const T* g = in ? src + base + row * srow + col : src;
        tc_cp16(tc_smem_addr(dst + r * (D + 8) + col), g, in ? 16 : 0);
    }
}

template <int D> __device__ void attn_fwd_tc(const AttnArgs& a, T* sm) {
#if __CUDA_ARCH__ >= 800
    constexpr int LD = D + 8;         // shared row stride (elements): conflict-free fragments
    constexpr int TILE = TC_BN * LD;  // one K or V tile
    constexpr int NT = TC_BN / 8;     // score n-tiles per key tile
    constexpr int OT = D / 8;         // output n-tiles
    const int d = (int)a.d;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
    // Shared: stage s holds K at sm + 2s·TILE and V at sm + (2s+1)·TILE; Q is first staged
    // in stage 1's K buffer.
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    T* o = (T*)a.p[3];
    float* lse = (float*)a.p[4];
    const i64 bhn = a.b * a.hq, qtiles = (a.s + TC_BM - 1) / TC_BM;
    // The heaviest (last, under a causal mask) query tiles first.
    const i64 w = blockIdx.x, qt = qtiles - 1 - w / bhn, bh = w % bhn, h = bh % a.hq, bi = bh / a.hq;
    const i64 kh = h / (a.hq / a.hk);
    const i64 i0 = qt * TC_BM;
    const i64 kbase = bi * a.st[1][0] + kh * a.st[1][1], vbase = bi * a.st[2][0] + kh * a.st[2][1];
    const i64 last = (i0 + TC_BM < a.s ? i0 + TC_BM : a.s) - 1;
    const i64 nkeys = visible(a, last);
    const int ntiles = (int)((nkeys + TC_BN - 1) / TC_BN);
    // Keys every row of the block sees: tiles below this need no mask.
    const i64 vmin = visible(a, i0);

    tc_load_tile<D>(sm + 2 * TILE, q, bi * a.st[0][0] + h * a.st[0][1], a.st[0][2], i0, a.s, d);
    if (ntiles > 0) {
        tc_load_tile<D>(sm, k, kbase, a.st[1][2], 0, a.t, d);
        tc_load_tile<D>(sm + TILE, v, vbase, a.st[2][2], 0, a.t, d);
    }
    tc_commit();
    tc_wait<0>();
    __syncthreads();
    u32 qf[D / 16][4];
    {
        const T* qs = sm + 2 * TILE + (warp * 16 + g) * LD + 2 * c4;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            qf[kk][0] = *(const u32*)(qs + 16 * kk);
            qf[kk][1] = *(const u32*)(qs + 8 * LD + 16 * kk);
            qf[kk][2] = *(const u32*)(qs + 16 * kk + 8);
            qf[kk][3] = *(const u32*)(qs + 8 * LD + 16 * kk + 8);
        }
    }
    __syncthreads();  // stage 1 is free for the next tile

    const i64 ilo = i0 + warp * 16 + g, ihi = ilo + 8;
    const i64 vlo = visible(a, ilo), vhi = visible(a, ihi);  // rows past s: not stored
    const float sl2 = (float)(a.scale * 1.4426950408889634);
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    float oacc[OT][4];
#pragma unroll
    for (int n = 0; n < OT; ++n) oacc[n][0] = oacc[n][1] = oacc[n][2] = oacc[n][3] = 0.f;
    // ldmatrix row addresses: lane supplies row (lane % 8) of matrix lane / 8.
    const int mi = lane >> 3, mr = lane & 7;

    for (int tile = 0; tile < ntiles; ++tile) {
        const i64 j0 = (i64)tile * TC_BN;
        if (tile + 1 < ntiles) {
            T* st = sm + ((tile + 1) & 1) * 2 * TILE;
            tc_load_tile<D>(st, k, kbase, a.st[1][2], j0 + TC_BN, a.t, d);
            tc_load_tile<D>(st + TILE, v, vbase, a.st[2][2], j0 + TC_BN, a.t, d);
            tc_commit();
            tc_wait<1>();
        } else {
            tc_wait<0>();
        }
        __syncthreads();
        const T* ks = sm + (tile & 1) * 2 * TILE;
        const T* vs = ks + TILE;
        // S = Q·Kᵀ: matrices (keys 16np + 8(mi/2) .., dims 16kk + 8(mi%2) ..) give the B
        // fragments (b0b1, b2b3) of n-tiles 2np and 2np + 1.
        float sacc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) sacc[n][0] = sacc[n][1] = sacc[n][2] = sacc[n][3] = 0.f;
        const u32 kaddr = tc_smem_addr(ks + (mr + 8 * (mi >> 1)) * LD + 8 * (mi & 1));
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                u32 b[4];
                tc_ldsm4(b, kaddr + (u32)((16 * np * LD + 16 * kk) * 2));
                tc_mma(sacc[2 * np], qf[kk], b[0], b[1]);
                tc_mma(sacc[2 * np + 1], qf[kk], b[2], b[3]);
            }
        }
        // Online softmax (base 2). Element e of n-tile n: row g + 8(e/2), key j0 + 8n + 2c4 + e%2.
        const bool mask = j0 + TC_BN > vmin;
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 j = j0 + 8 * n + 2 * c4 + (e & 1);
                const bool ok = !mask || j < (e < 2 ? vlo : vhi);
                const float x = ok ? sacc[n][e] * sl2 : NEG_INF;
                sacc[n][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        }
        float mu[2], corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r]);
            // All scores -inf so far: subtract 0 instead (-inf - -inf is NaN).
            mu[r] = mn == NEG_INF ? 0.f : mn;
            corr[r] = exp2f(m[r] - mu[r]);
            m[r] = mn;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(sacc[n][e] - mu[e >> 1]);
                sacc[n][e] = p;
                l[e >> 1] += p;
            }
        }
#pragma unroll
        for (int n = 0; n < OT; ++n) {
            oacc[n][0] *= corr[0];
            oacc[n][1] *= corr[0];
            oacc[n][2] *= corr[1];
            oacc[n][3] *= corr[1];
        }
        // O += P·V. P's C fragments of n-tiles 2kk, 2kk + 1 are the A fragment of key step kk;
        // transposed matrices (keys 16kk + 8(mi%2) .., dims 16dp + 8(mi/2) ..) give the B
        // fragments of output n-tiles 2dp and 2dp + 1.
        const u32 vaddr = tc_smem_addr(vs + (mr + 8 * (mi & 1)) * LD + 8 * (mi >> 1));
#pragma unroll
        for (int kk = 0; kk < TC_BN / 16; ++kk) {
            u32 pa[4];
            pa[0] = tc_pack(sacc[2 * kk][0], sacc[2 * kk][1]);
            pa[1] = tc_pack(sacc[2 * kk][2], sacc[2 * kk][3]);
            pa[2] = tc_pack(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
            pa[3] = tc_pack(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                u32 b[4];
                tc_ldsm4t(b, vaddr + (u32)((16 * kk * LD + 16 * dp) * 2));
                tc_mma(oacc[2 * dp], pa, b[0], b[1]);
                tc_mma(oacc[2 * dp + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();  // this stage is consumed before the next iteration refills it
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(FULL, l[r], 1);
        l[r] += __shfl_xor_sync(FULL, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const i64 i = r ? ihi : ilo;
        if (i >= a.s) continue;
        const bool dead = (r ? vhi : vlo) == 0;
        const float inv = 1.f / l[r];
        T* orow = o + bi * a.st[3][0] + h * a.st[3][1] + i * a.st[3][2];
#pragma unroll
        for (int n = 0; n < OT; ++n) {
            const int col = 8 * n + 2 * c4;
            if (col < d) {
                const T x0 = TT::store(dead ? QNAN : oacc[n][2 * r] * inv);
                const T x1 = TT::store(dead ? QNAN : oacc[n][2 * r + 1] * inv);
                *(u32*)(orow + col) = (u32)x0.x | ((u32)x1.x << 16);
            }
        }
        if (c4 == 0) {
            // m is in base 2: lse = m·ln 2 + ln l.
            lse[bi * a.st[4][0] + h * a.st[4][1] + i * a.st[4][2]] =
                dead ? QNAN : m[r] * 0.6931471805599453f + logf(l[r]);
        }
    }
#endif
}

extern "C" __global__ void __launch_bounds__(TC_THREADS) attn_fwd_tc_64(const AttnArgs a) {
    ASMEM;
    attn_fwd_tc<64>(a, (T*)smem_raw);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS) attn_fwd_tc_128(const AttnArgs a) {
    ASMEM;
    attn_fwd_tc<128>(a, (T*)smem_raw);
}
#endif
