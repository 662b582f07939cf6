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

// Mirror of `AttnArgs` in ops/attention.rs (a test compares the two layouts).
struct AttnArgs {
    char* p[9];     // q k v o lse do dq dk dv
    char* delta;    // backward: rowsum(do ∘ o) per query, dense (b, hq, s), type C; the
                    // tensor-core backward adds lse·log2 e after it (2·b·hq·s floats)
    i64 st[9][4];   // element strides of each operand (lse: b, h, s)
    i64 b, hq, hk, s, t, d;
    double scale;
    i64 causal;
    i64 split;      // masked attention: keys per block; the Hopper dK/dV pass: blocks that
                    // share out the query heads of a group (1: none)
    char* partial;  // masked attention over several splits: per (row, split) the output sums,
                    // max and sum of weights, (d + 2) values of type C; the Hopper dK/dV pass
                    // with split > 1: per part, dK then dV rows of 64 f32
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

// Where row i of head h of batch bi starts in operand `slot`.
__device__ __forceinline__ i64 head_row(const AttnArgs& a, int slot, i64 bi, i64 h, i64 i) {
    return bi * a.st[slot][0] + h * a.st[slot][1] + i * a.st[slot][2];
}

// load_tile of rows r0.. of head h of batch bi of operand `slot` (q, k, v or do).
__device__ __forceinline__ void load_head(C* dst, int rows, int dp, const AttnArgs& a, int slot, i64 bi, i64 h, i64 r0,
                                          i64 limit, int d) {
    load_tile(dst, rows, dp, (const T*)a.p[slot], bi * a.st[slot][0] + h * a.st[slot][1], a.st[slot][2], a.st[slot][3],
              r0, limit, d);
}

// The K and V tiles of keys j0.. of kv head kh.
__device__ __forceinline__ void load_kv_tiles(C* ks, C* vs, int rows, int dp, const AttnArgs& a, i64 bi, i64 kh,
                                              i64 j0, int d) {
    load_head(ks, rows, dp, a, 1, bi, kh, j0, a.t, d);
    load_head(vs, rows, dp, a, 2, bi, kh, j0, a.t, d);
}

// Keys the query tile i0.. (BR rows) streams: the mask is monotone in i, so the tile's last
// query sees the most.
__device__ __forceinline__ i64 tile_keys(const AttnArgs& a, i64 i0) {
    const i64 last = (i0 + BR < a.s ? i0 + BR : a.s) - 1;
    return visible(a, last);
}

// acc[r] += w_r(jj) · tile row jj over the streamed tile's rows (keys j0 + jj, up to nkeys)
// that warp row r sees, w_r(jj) being lane jj's w[r]; a lane holds columns lane + 32·kk.
// Hidden rows are skipped, not multiplied by 0 (a non-finite value under the mask must not
// leak in).
template <int NR>
__device__ __forceinline__ void accumulate_tile(C (&acc)[ROWS][NR], const C* tile, int dp, int d, int lane,
                                                const C (&w)[ROWS], const i64 (&vis)[ROWS], i64 j0, i64 nkeys) {
    const int jn = (int)(nkeys - j0 < BC ? nkeys - j0 : BC);
    for (int jj = 0; jj < jn; ++jj) {
        C tv[NR];
#pragma unroll
        for (int kk = 0; kk < NR; ++kk) {
            const int c = lane + 32 * kk;
            tv[kk] = c < d ? tile[jj * dp + c] : (C)0;
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (j0 + jj < vis[r]) {
                const C wj = __shfl_sync(FULL, w[r], jj);
#pragma unroll
                for (int kk = 0; kk < NR; ++kk) acc[r][kk] += wj * tv[kk];
            }
        }
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
    T* o = (T*)a.p[3];
    float* lse = (float*)a.p[4];
    const C scale = (C)a.scale;
    const i64 group = a.hq / a.hk, qtiles = (a.s + BR - 1) / BR, work = a.b * a.hq * qtiles;
    for (i64 w = blockIdx.x; w < work; w += gridDim.x) {
        const i64 qt = w % qtiles, bh = w / qtiles, h = bh % a.hq, bi = bh / a.hq, kh = h / group;
        const i64 i0 = qt * BR;
        __syncthreads();  // the previous item's readers of shared memory are done
        load_head(qs, BR, dp, a, 0, bi, h, i0, a.s, d);
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
        const i64 nkeys = tile_keys(a, i0);
        const C* qrow = qs + warp * ROWS * dp;
        for (i64 j0 = 0; j0 < nkeys; j0 += BC) {
            __syncthreads();  // qs is loaded; the previous K/V tile is consumed
            load_kv_tiles(ks, vs, BC, dp, a, bi, kh, j0, d);
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
            accumulate_tile<NR>(acc, vs, dp, d, lane, p, vis, j0, nkeys);  // acc += P·V
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const i64 i = i0 + warp * ROWS + r;
            if (i >= a.s) continue;
            const bool dead = vis[r] == 0;
            const i64 ob = head_row(a, 3, bi, h, i);
#pragma unroll
            for (int kk = 0; kk < NR; ++kk) {
                const int c = lane + 32 * kk;
                if (c < d) o[ob + c * a.st[3][3]] = TT::store(dead ? QNAN : acc[r][kk] / l[r]);
            }
            if (lane == 0) {
                const C ls = dead ? QNAN : m[r] + clog(l[r]);
                lse[head_row(a, 4, bi, h, i)] = (float)ls;
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
        const i64 ob = head_row(a, 3, bi, h, i), db = head_row(a, 5, bi, h, i);
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
    const float* lse = (const float*)a.p[4];
    T* dq = (T*)a.p[6];
    const C* delta = (const C*)a.delta;
    const C scale = (C)a.scale;
    const i64 group = a.hq / a.hk, qtiles = (a.s + BR - 1) / BR, work = a.b * a.hq * qtiles;
    for (i64 w = blockIdx.x; w < work; w += gridDim.x) {
        const i64 qt = w % qtiles, bh = w / qtiles, h = bh % a.hq, bi = bh / a.hq, kh = h / group;
        const i64 i0 = qt * BR;
        __syncthreads();
        load_head(qs, BR, dp, a, 0, bi, h, i0, a.s, d);
        load_head(dos, BR, dp, a, 5, bi, h, i0, a.s, d);
        i64 vis[ROWS];
        C ls[ROWS], dl[ROWS], acc[ROWS][NR];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const i64 i = i0 + warp * ROWS + r;
            const bool in = i < a.s;
            vis[r] = in ? visible(a, i) : 0;
            // Read only where the row sees a key: a fully masked row's lse is NaN, unused.
            ls[r] = vis[r] > 0 ? (C)lse[head_row(a, 4, bi, h, i)] : (C)0;
            dl[r] = vis[r] > 0 ? delta[bh * a.s + i] : (C)0;
#pragma unroll
            for (int kk = 0; kk < NR; ++kk) acc[r][kk] = (C)0;
        }
        const i64 nkeys = tile_keys(a, i0);
        const C* qrow = qs + warp * ROWS * dp;
        const C* dorow = dos + warp * ROWS * dp;
        for (i64 j0 = 0; j0 < nkeys; j0 += BC) {
            __syncthreads();
            load_kv_tiles(ks, vs, BC, dp, a, bi, kh, j0, d);
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
            accumulate_tile<NR>(acc, ks, dp, d, lane, ds, vis, j0, nkeys);  // acc += dS·K
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const i64 i = i0 + warp * ROWS + r;
            if (i >= a.s) continue;
            const i64 ob = head_row(a, 6, bi, h, i);
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
    const float* lse = (const float*)a.p[4];
    T* dk = (T*)a.p[7];
    T* dv = (T*)a.p[8];
    const C* delta = (const C*)a.delta;
    const C scale = (C)a.scale;
    const i64 group = a.hq / a.hk, ktiles = (a.t + BR - 1) / BR, work = a.b * a.hk * ktiles;
    for (i64 w = blockIdx.x; w < work; w += gridDim.x) {
        const i64 kt = w % ktiles, bk = w / ktiles, kh = bk % a.hk, bi = bk / a.hk;
        const i64 j0 = kt * BR;
        __syncthreads();
        load_kv_tiles(ks, vs, BR, dp, a, bi, kh, j0, d);
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
                load_head(qs, BC, dp, a, 0, bi, h, i0, a.s, d);
                load_head(dos, BC, dp, a, 5, bi, h, i0, a.s, d);
                if (threadIdx.x < BC) {
                    const i64 i = i0 + threadIdx.x;
                    const bool live = i < a.s && visible(a, i) > 0;
                    lse_s[threadIdx.x] = live ? (C)lse[head_row(a, 4, bi, h, i)] : (C)0;
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
            const i64 kb = head_row(a, 7, bi, kh, jr[r]), vb = head_row(a, 8, bi, kh, jr[r]);
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
// FlashAttention-2 style. A block (4 warps) takes 64·MT query rows of one (batch, head); warp
// w owns MT m-tiles of 16 rows (rows 16·MT·w ..) and keeps their Q fragments in registers;
// with MT = 2 every K and V fragment read from shared memory feeds two products. K and V stream
// through shared memory in tiles of TC_BN = 64 keys, S stages deep with cp.async and one
// barrier per tile. S = Q·Kᵀ and O += P·V use mma.m16n8k16 (f32 accumulate); the online
// softmax runs in f32 (base 2) on the accumulator fragments, with row max and sum reduced
// over the 4 lanes of a quad, and its mask code runs only on tiles that cross the diagonal or
// the last key.
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
// 4 bytes global -> shared; `bytes` 0 fills zeros (src is then not read).
__device__ __forceinline__ void tc_cp4(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
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

// Two adjacent 16x8 f32 accumulator tiles as one 16x16 A fragment of T: the C layout of
// mma.m16n8k16 matches its A layout, so a product's result (P, dS) feeds the next product
// from registers.
__device__ __forceinline__ void tc_acc_to_a(u32 a[4], const float c0[4], const float c1[4]) {
    a[0] = tc_pack(c0[0], c0[1]);
    a[1] = tc_pack(c0[2], c0[3]);
    a[2] = tc_pack(c1[0], c1[1]);
    a[3] = tc_pack(c1[2], c1[3]);
}

// This thread's share of copying NROWS rows (D/8 16-byte chunks each) of one head with
// cp.async into shared memory at `dst` (row stride D + 8 elements): column `col` of rows
// r, r + STEP, .. (the same column every time, so the address arithmetic is one add per
// chunk). Rows at or past `limit` and columns at or past d are zeros (not read).
template <int D, int NROWS>
__device__ __forceinline__ void tc_copy_rows(u32 dst, const T* src, i64 srow, int r0, int limit, int d) {
    constexpr int CH = D / 8, STEP = TC_THREADS / CH;
    static_assert(NROWS % STEP == 0, "rows per copy");
    const int r = threadIdx.x / CH, col = (threadIdx.x % CH) * 8;
    const T* g = src + (i64)(r0 + r) * srow + col;
    const i64 gstep = (i64)STEP * srow;
    dst += (u32)((r * (D + 8) + col) * 2);
#pragma unroll
    for (int i = 0; i < NROWS / STEP; ++i) {
        const bool in = col < d && r0 + r + i * STEP < limit;
        tc_cp16(dst + (u32)(i * STEP * (D + 8) * 2), in ? g : src, in ? 16 : 0);
        g += gstep;
    }
}

// 2^x on the SFU alone. exp2f also produces results below the normal range (a compare and
// two multiplies around the SFU op); here such a weight is below 2^-126 of the row's
// largest and flushing it to zero changes no sum.
__device__ __forceinline__ float tc_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Max and sum of the 2·NT values of one accumulator row half (elements 2r, 2r + 1 of each
// n-tile) as a tree: log-depth dependency chains instead of one 2·NT long. The levels are
// unrolled by template recursion: a loop bounded by an outer loop's variable is not always
// unrolled (at NT = 16 it was not), and an array indexed by a variable lives in local memory.
template <int W> struct TcTree {
    template <class F> static __device__ __forceinline__ float fold(float (&t)[2 * W], F f) {
        float u[W];
#pragma unroll
        for (int n = 0; n < W; ++n) u[n] = f(t[n], t[n + W]);
        return TcTree<W / 2>::fold(u, f);
    }
};
template <> struct TcTree<1> {
    template <class F> static __device__ __forceinline__ float fold(float (&t)[2], F f) { return f(t[0], t[1]); }
};
template <int NT> __device__ __forceinline__ float tc_row_max(const float (&x)[NT][4], int r) {
    float t[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) t[n] = fmaxf(x[n][2 * r], x[n][2 * r + 1]);
    return TcTree<NT / 2>::fold(t, [](float a, float b) { return fmaxf(a, b); });
}
template <int NT> __device__ __forceinline__ float tc_row_sum(const float (&x)[NT][4], int r) {
    float t[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) t[n] = x[n][2 * r] + x[n][2 * r + 1];
    return TcTree<NT / 2>::fold(t, [](float a, float b) { return a + b; });
}

// Above this many powers of two over the running row max, a tile's scores force a rescale of
// the accumulators; below it the stale max stays (weights up to 2^8, far inside f32 and
// as precise in T), and the rescale, a multiply per accumulator, is skipped.
#define TC_RESCALE 8.f

// Online softmax (base 2) of one K tile's products for the warp's MT m-tiles, in place: the
// products become the weights 2^(s·sl2 - m), l gains their sums and O is rescaled when the
// row max moves by more than TC_RESCALE. The row max is taken on the raw products (sl2 > 0
// keeps their order, and rounding is monotone); a weight costs one fused multiply-add and
// one exp2. Element e of n-tile n: row half e/2, key jc + 8n + e%2 (jc = j0 + 2·(lane%4)).
// MASK: the tile crosses the causal diagonal or the last key; masked products become -inf,
// weight 0 (sl2 > 0: never -inf·0).
template <bool MASK, int MT, int NT, int OT>
__device__ __forceinline__ void tc_softmax(float (&sacc)[MT][NT][4], float (&oacc)[MT][OT][4], float (&m)[MT][2],
                                           float (&l)[MT][2], const int (&vis)[MT][2], int jc, float sl2) {
    float mx[MT][2];
    bool grow = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        if (MASK) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (jc + 8 * n + (e & 1) >= vis[mt][e >> 1]) sacc[mt][n][e] = NEG_INF;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float x = tc_row_max<NT>(sacc[mt], r);
            x = fmaxf(x, __shfl_xor_sync(FULL, x, 1));
            x = fmaxf(x, __shfl_xor_sync(FULL, x, 2));
            mx[mt][r] = x * sl2;
            grow |= mx[mt][r] > m[mt][r] + TC_RESCALE;  // false while both are -inf
        }
    }
    if (__any_sync(FULL, grow)) {  // warp-uniform: the rows of every lane move together
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float corr[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float mn = fmaxf(m[mt][r], mx[mt][r]);
                // A row that has seen no key yet keeps m = -inf (and l = O = 0).
                corr[r] = mn == NEG_INF ? 1.f : tc_exp2(m[mt][r] - mn);
                m[mt][r] = mn;
                l[mt][r] *= corr[r];
            }
#pragma unroll
            for (int n = 0; n < OT; ++n) {
                oacc[mt][n][0] *= corr[0];
                oacc[mt][n][1] *= corr[0];
                oacc[mt][n][2] *= corr[1];
                oacc[mt][n][3] *= corr[1];
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        // -inf - -inf is NaN: a row with no key so far subtracts 0 (its products are -inf).
        const float mu0 = m[mt][0] == NEG_INF ? 0.f : m[mt][0];
        const float mu1 = m[mt][1] == NEG_INF ? 0.f : m[mt][1];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) sacc[mt][n][e] = tc_exp2(fmaf(sacc[mt][n][e], sl2, -(e < 2 ? mu0 : mu1)));
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[mt][r] += tc_row_sum<NT>(sacc[mt], r);
    }
}

// The (batch, head, query tile of BM rows) of work item w (this block's, blockIdx.x, unless
// a block steps through several), the heaviest (last, under a causal mask) query tiles
// first, and what the tile reads: its key head's K and V rows and the keys its last row sees.
struct TcTile {
    i64 bi, h, i0, nkeys;
    const T* k;
    const T* v;
};
__device__ __forceinline__ TcTile tc_tile(const AttnArgs& a, int bm, i64 w) {
    const i64 bhn = a.b * a.hq, qtiles = (a.s + bm - 1) / bm;
    const i64 qt = qtiles - 1 - w / bhn, bh = w % bhn, h = bh % a.hq, bi = bh / a.hq;
    const i64 kh = h / (a.hq / a.hk), i0 = qt * bm;
    const i64 last = (i0 + bm < a.s ? i0 + bm : a.s) - 1;
    return {bi, h, i0, visible(a, last), (const T*)a.p[1] + head_row(a, 1, bi, kh, 0),
            (const T*)a.p[2] + head_row(a, 2, bi, kh, 0)};
}
__device__ __forceinline__ TcTile tc_tile(const AttnArgs& a, int bm) { return tc_tile(a, bm, blockIdx.x); }

// The forward's outputs for a warp's MT m-tiles of 16 rows from its accumulators (row of half
// r of m-tile mt: wi0 + 16·mt + 8·r + g): o = O / l and lse = m·ln 2 + ln l (m is in base 2),
// l summed over the quad; NaN for a row that sees no key; rows past s are not stored.
template <int MT, int OT>
__device__ __forceinline__ void tc_store_rows(const AttnArgs& a, const TcTile& tl, int wi0, const float (&oacc)[MT][OT][4],
                                              const float (&m)[MT][2], const float (&l)[MT][2], const int (&vis)[MT][2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3, d = (int)a.d;
    T* o = (T*)a.p[3];
    float* lse = (float*)a.p[4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(FULL, lr, 1);
            lr += __shfl_xor_sync(FULL, lr, 2);
            const int i = wi0 + 16 * mt + 8 * r + g;
            if (i >= a.s) continue;
            const bool dead = vis[mt][r] == 0;
            const float inv = 1.f / lr;
            T* orow = o + tl.bi * a.st[3][0] + tl.h * a.st[3][1] + (i64)i * a.st[3][2];
#pragma unroll
            for (int n = 0; n < OT; ++n) {
                const int col = 8 * n + 2 * c4;
                if (col < d) {
                    const T x0 = TT::store(dead ? QNAN : oacc[mt][n][2 * r] * inv);
                    const T x1 = TT::store(dead ? QNAN : oacc[mt][n][2 * r + 1] * inv);
                    *(u32*)(orow + col) = (u32)x0.x | ((u32)x1.x << 16);
                }
            }
            if (c4 == 0) {
                lse[tl.bi * a.st[4][0] + tl.h * a.st[4][1] + (i64)i * a.st[4][2]] =
                    dead ? QNAN : m[mt][r] * 0.6931471805599453f + logf(lr);
            }
        }
    }
}

template <int D, int MT, int S> __device__ void attn_fwd_tc(const AttnArgs& a, T* sm) {
#if __CUDA_ARCH__ >= 800
    constexpr int LD = D + 8;         // shared row stride (elements): conflict-free fragments
    constexpr int TILE = TC_BN * LD;  // one K or V tile
    constexpr int NT = TC_BN / 8;     // score n-tiles per key tile
    constexpr int OT = D / 8;         // output n-tiles
    constexpr int BM = 64 * MT;       // query rows per block: MT m-tiles of 16 per warp
    static_assert(S >= 2 && BM * LD <= 2 * TILE, "Q is staged in the last stage");
    const int d = (int)a.d, t = (int)a.t;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
    // ldmatrix row addresses: lane supplies row (lane % 8) of matrix lane / 8.
    const int mi = lane >> 3, mr = lane & 7;
    // Shared: S stages (K/V tiles in flight: S - 1 while one is consumed); stage s holds K at
    // sm + 2s·TILE and V at sm + (2s+1)·TILE. Q is first staged in the last stage and read
    // into registers before that stage's first K/V tile is requested.
    T* qsm = sm + 2 * (S - 1) * TILE;
    const T* q = (const T*)a.p[0];
    const TcTile tl = tc_tile(a, BM);
    const i64 bi = tl.bi, h = tl.h, i0 = tl.i0;
    const int ntiles = (int)((tl.nkeys + TC_BN - 1) / TC_BN);
    // Row indices fit in 32 bits (the launcher checks s and t).
    const int wi0 = (int)i0 + warp * 16 * MT;
    // Keys every row of the warp sees: tiles below this need no mask.
    const int vmin = (int)visible(a, wi0);
    const u32 sbase = tc_smem_addr(sm);
    auto load_kv = [&](int tile) {
        const u32 st = sbase + (u32)((tile % S) * 2 * TILE * 2);
        tc_copy_rows<D, TC_BN>(st, tl.k, a.st[1][2], tile * TC_BN, t, d);
        tc_copy_rows<D, TC_BN>(st + TILE * 2, tl.v, a.st[2][2], tile * TC_BN, t, d);
    };

    tc_copy_rows<D, BM>(tc_smem_addr(qsm), q + head_row(a, 0, bi, h, 0), a.st[0][2], (int)i0, (int)a.s, d);
#pragma unroll
    for (int p = 0; p < S - 1; ++p) {
        if (p < ntiles) load_kv(p);
        tc_commit();
    }
    // Scores are formed with |scale|: for a negative scale Q is negated (exact), so that the
    // row maximum of the raw products is the maximum of the scaled ones.
    // At least the smallest normal float: a zero scale (every weight 1) then still maps -inf
    // to -inf, and products times it are far below the rounding of 1 = 2^0.
    const float sl2 = fmaxf(fabsf((float)(a.scale * 1.4426950408889634)), 1.17549435e-38f);
    const u32 qsign = a.scale < 0 ? 0x80008000u : 0u;
    tc_wait<S - 2>();  // Q and the first tile
    __syncthreads();
    u32 qf[MT][D / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            tc_ldsm4(qf[mt][kk], tc_smem_addr(qsm + (warp * 16 * MT + 16 * mt + mr + 8 * (mi & 1)) * LD + 16 * kk +
                                              8 * (mi >> 1)));
#pragma unroll
            for (int e = 0; e < 4; ++e) qf[mt][kk][e] ^= qsign;
        }
    }

    // Row of accumulator half r (0: g, 1: g + 8) of m-tile mt: wi0 + 16mt + 8r + g.
    int vis[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        vis[mt][0] = (int)visible(a, wi0 + 16 * mt + g);  // rows past s: not stored
        vis[mt][1] = (int)visible(a, wi0 + 16 * mt + g + 8);
    }
    // m: running row max of the scaled scores (base 2); l: this lane's part of the row sum.
    float m[MT][2], l[MT][2];
    float oacc[MT][OT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        m[mt][0] = m[mt][1] = NEG_INF;
        l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
        for (int n = 0; n < OT; ++n) oacc[mt][n][0] = oacc[mt][n][1] = oacc[mt][n][2] = oacc[mt][n][3] = 0.f;
    }
    // Keys this warp's rows see; a warp whose rows all lie above the diagonal of the tile skips it.
    const int wkeys = (int)visible(a, wi0 + 16 * MT - 1);
    const u32 kofs = (u32)(((mr + 8 * (mi >> 1)) * LD + 8 * (mi & 1)) * 2);
    const u32 vofs = (u32)(((mr + 8 * (mi & 1)) * LD + 8 * (mi >> 1)) * 2);

    for (int tile = 0; tile < ntiles; ++tile) {
        const int j0 = tile * TC_BN;
        // One barrier per tile: after it, this tile is in shared memory for every thread and
        // every warp is done with the tile before, whose stage the next request reuses.
        tc_wait<S - 2>();
        __syncthreads();
        if (tile + S - 1 < ntiles) load_kv(tile + S - 1);
        tc_commit();
        if (j0 >= wkeys) continue;  // uniform over the warp
        const u32 kaddr = sbase + (u32)((tile % S) * 2 * TILE * 2) + kofs;
        const u32 vaddr = sbase + (u32)(((tile % S) * 2 + 1) * TILE * 2) + vofs;
        // S = Q·Kᵀ: matrices (keys 16np + 8(mi/2) .., dims 16kk + 8(mi%2) ..) give the B
        // fragments (b0b1, b2b3) of n-tiles 2np and 2np + 1, shared by the warp's m-tiles.
        float sacc[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int n = 0; n < NT; ++n) sacc[mt][n][0] = sacc[mt][n][1] = sacc[mt][n][2] = sacc[mt][n][3] = 0.f;
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                u32 b[4];
                tc_ldsm4(b, kaddr + (u32)((16 * np * LD + 16 * kk) * 2));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    tc_mma(sacc[mt][2 * np], qf[mt][kk], b[0], b[1]);
                    tc_mma(sacc[mt][2 * np + 1], qf[mt][kk], b[2], b[3]);
                }
            }
        }
        if (j0 + TC_BN > vmin) {
            tc_softmax<true, MT, NT, OT>(sacc, oacc, m, l, vis, j0 + 2 * c4, sl2);
        } else {
            tc_softmax<false, MT, NT, OT>(sacc, oacc, m, l, vis, j0 + 2 * c4, sl2);
        }
        // O += P·V. P's C fragments of n-tiles 2kk, 2kk + 1 are the A fragment of key step
        // kk; transposed matrices (keys 16kk + 8(mi%2) .., dims 16dp + 8(mi/2) ..) give the
        // B fragments of output n-tiles 2dp and 2dp + 1.
#pragma unroll
        for (int kk = 0; kk < TC_BN / 16; ++kk) {
            u32 pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) tc_acc_to_a(pa[mt], sacc[mt][2 * kk], sacc[mt][2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                u32 b[4];
                tc_ldsm4t(b, vaddr + (u32)((16 * kk * LD + 16 * dp) * 2));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    tc_mma(oacc[mt][2 * dp], pa[mt], b[0], b[1]);
                    tc_mma(oacc[mt][2 * dp + 1], pa[mt], b[2], b[3]);
                }
            }
        }
    }
    tc_wait<0>();  // no copy may be in flight at exit
    tc_store_rows<MT, OT>(a, tl, wi0, oacc, m, l, vis);
#endif
}


// d = 64: 128 query rows per block, two m-tiles per warp sharing each K and V fragment (half
// the shared-memory reads per product), three K/V stages (two tiles in flight; measured
// fastest, RESULTS.md, "Kernel design notes"); d = 128: 64 rows (the accumulators of two
// m-tiles would not fit in registers) and two stages (three would pass the 99 KiB a block
// gets on sm_86/sm_89).
// The stage counts are mirrored by `tc_stages` in ops/attention.rs.
extern "C" __global__ void __launch_bounds__(TC_THREADS) attn_fwd_tc_64(const AttnArgs a) {
    ASMEM;
    attn_fwd_tc<64, 2, 3>(a, (T*)smem_raw);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS) attn_fwd_tc_128(const AttnArgs a) {
    ASMEM;
    attn_fwd_tc<128, 1, 2>(a, (T*)smem_raw);
}

// ---- tensor-core backward (f16 / bf16, sm_80+) -----------------------------------------------
// Two passes, each the only writer of what it produces, so there are no atomics and the
// result is deterministic; the price is that the dQ pass recomputes S and dP (7 products per
// score instead of 5).
// - dK/dV (attn_bwd_dkv_tc_*): a block owns TC_BN = 64 keys of one (batch, kv head), warp w
//   keys 16w..16w+15, and streams tiles of BM queries of every query head of the group, Q and
//   dO S stages deep with cp.async. It computes the transposed products Sᵀ = K·Qᵀ and
//   dPᵀ = V·dOᵀ so that keys are the rows of the accumulator fragments: Pᵀ and dSᵀ are then
//   already the A fragments of dV += Pᵀ·dO and dK += dSᵀ·Q (as P is for P·V in the forward)
//   and the per-query lse and D are per-column values, read from shared memory.
// - dQ (attn_bwd_dq_tc_*), first: a block owns TC_BM = 64 queries, warp w rows 16w.., forms
//   D = rowsum(dO ∘ O) of its rows (written out for the dK/dV pass) and streams K/V tiles as
//   the forward does, forming dQ += dS·K.
// P = exp2(scale·log2 e·QKᵀ - lse·log2 e) from the saved lse; P and dS are rounded to the
// element type for the second product, as P is in the forward. Masked pairs are selected to
// zero, never multiplied (a dead row has NaN lse and NaN o, hence NaN D).
// The A fragments of K, V (dK/dV) and Q, dO (dQ) are re-read from shared memory with ldmatrix
// for every tile rather than held in registers: each is reused by a whole row of n-tiles, and
// the registers are needed by the two accumulators at d = 128.

// An A fragment (16×16, row-major in shared memory) comes from ldmatrix.x4 with lane l
// pointing at row l%8 + 8((l/8)%2), column 8(l/16) of the tile: the four matrices are then
// a0a1, a2a3, a4a5, a6a7 of the layout above.
#define TC_LOG2E 1.4426950408889634f

// Both backward passes form two products of one shape at once, over the head dim:
// acc1 = A1·B1ᵀ and acc2 = A2·B2ᵀ for this warp's 16 rows and NT n-tiles of 8 columns (S and
// dP share the B-side loop, so each A fragment is loaded once per k-step). a1/a2: ldmatrix
// addresses of the warp's A rows; b1/b2: of the first B row this lane loads.
template <int NT, int D, int LD>
__device__ __forceinline__ void tc_two_products(float (&acc1)[NT][4], float (&acc2)[NT][4], u32 a1, u32 a2, u32 b1,
                                                u32 b2) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc1[n][e] = acc2[n][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        u32 x[4], y[4];
        tc_ldsm4(x, a1 + 32 * kk);
        tc_ldsm4(y, a2 + 32 * kk);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            u32 b[4];
            tc_ldsm4(b, b1 + (u32)((16 * np * LD + 16 * kk) * 2));
            tc_mma(acc1[2 * np], x, b[0], b[1]);
            tc_mma(acc1[2 * np + 1], x, b[2], b[3]);
            tc_ldsm4(b, b2 + (u32)((16 * np * LD + 16 * kk) * 2));
            tc_mma(acc2[2 * np], y, b[0], b[1]);
            tc_mma(acc2[2 * np + 1], y, b[2], b[3]);
        }
    }
}

template <int D, int BM, int S> __device__ void attn_bwd_dkv_tc(const AttnArgs& a, T* sm) {
#if __CUDA_ARCH__ >= 800
    constexpr int LD = D + 8;
    constexpr int NT = BM / 8;   // n-tiles of Sᵀ: queries
    constexpr int OT = D / 8;    // n-tiles of dK, dV: dims
    constexpr int QT = BM * LD;  // one Q or dO tile
    T* ks = sm;
    T* vs = ks + TC_BN * LD;
    T* qbuf = vs + TC_BN * LD;                  // S stages: Q at qbuf + 2st·QT, dO right after
    float* fbuf = (float*)(qbuf + 2 * S * QT);  // stage st: lse·log2 e at fbuf + 2st·BM, D after
    const int d = (int)a.d, s = (int)a.s, t = (int)a.t, off = t + 1 - s;
    const bool causal = a.causal != 0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
    const int mi = lane >> 3, mr = lane & 7;
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    const T* dout = (const T*)a.p[5];
    T* dk = (T*)a.p[7];
    T* dv = (T*)a.p[8];
    const float* delta = (const float*)a.delta;
    const i64 bhk = a.b * a.hk, group = a.hq / a.hk;
    // Under a causal mask the first key tiles are seen by the most queries: they go first.
    const i64 w = blockIdx.x, kt = w / bhk, bk = w % bhk, kh = bk % a.hk, bi = bk / a.hk;
    const int j0 = (int)kt * TC_BN;
    // Query i sees key j iff i < s, j < t and (causal) j < i + off: the first query that sees
    // key j0 is j0 + 1 - off.
    const int first = causal ? max(0, j0 + 1 - off) : 0;
    const int qt0 = first / BM;
    const int nq = first < s ? (s + BM - 1) / BM - qt0 : 0;
    const int total = (int)group * nq;  // (query head, query tile) steps

    // Stage `st` <- step `it`, all by cp.async (committed by the caller): Q, dO, and the
    // queries' lse·log2 e and D, which the dQ pass wrote densely, zero for rows that see no
    // key. (cp.async, not plain loads: no warp waits on global latency in the middle of the
    // step before it can store to shared memory.)
    const float* lse2 = delta + a.b * a.hq * a.s;
    auto stage = [&](int it, int st) {
        const i64 h = kh * group + it / nq;
        const int i0 = (qt0 + it % nq) * BM;
        T* qd = qbuf + 2 * st * QT;
        tc_copy_rows<D, BM>(tc_smem_addr(qd), q + bi * a.st[0][0] + h * a.st[0][1], a.st[0][2], i0, s, d);
        tc_copy_rows<D, BM>(tc_smem_addr(qd + QT), dout + bi * a.st[5][0] + h * a.st[5][1], a.st[5][2], i0, s, d);
        const u32 fd = tc_smem_addr(fbuf + 2 * st * BM);
        const i64 row0 = (bi * a.hq + h) * a.s;
        for (int r = threadIdx.x; r < 2 * BM; r += TC_THREADS) {
            const int i = i0 + r % BM;
            // Rows past s read as 0; all their pairs are masked.
            const float* src = (r < BM ? lse2 : delta) + row0 + i;
            tc_cp4(fd + 4 * r, i < s ? src : delta, i < s ? 4 : 0);
        }
    };

    if (total > 0) {
        tc_copy_rows<D, TC_BN>(tc_smem_addr(ks), k + bi * a.st[1][0] + kh * a.st[1][1], a.st[1][2], j0, t, d);
        tc_copy_rows<D, TC_BN>(tc_smem_addr(vs), v + bi * a.st[2][0] + kh * a.st[2][1], a.st[2][2], j0, t, d);
    }
#pragma unroll
    for (int p = 0; p < S - 1; ++p) {
        if (p < total) stage(p, p);
        tc_commit();
    }
    float dka[OT][4], dva[OT][4];
#pragma unroll
    for (int n = 0; n < OT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dka[n][e] = dva[n][e] = 0.f;
    }
    const float sl2 = (float)(a.scale * 1.4426950408889634);
    const int jlo = j0 + 16 * warp + g, jhi = jlo + 8;
    const u32 kA = tc_smem_addr(ks + (16 * warp + mr + 8 * (mi & 1)) * LD + 8 * (mi >> 1));
    const u32 vA = tc_smem_addr(vs + (16 * warp + mr + 8 * (mi & 1)) * LD + 8 * (mi >> 1));

    for (int it = 0; it < total; ++it) {
        const int st = it % S;
        // One barrier per step: step `it` has landed for every thread and the stage read by
        // the step before is free for the next request.
        tc_wait<S - 2>();
        __syncthreads();
        if (it + S - 1 < total) stage(it + S - 1, (it + S - 1) % S);
        tc_commit();
        const int i0 = (qt0 + it % nq) * BM;
        const T* qs = qbuf + 2 * st * QT;
        const T* dos = qs + QT;
        const float* lsv = fbuf + 2 * st * BM;
        const float* dlv = lsv + BM;
        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: Q and dO rows are the n (query) index of the B operand,
        // loaded as K is in the forward.
        float sacc[NT][4], pacc[NT][4];
        const u32 qB = tc_smem_addr(qs + (mr + 8 * (mi >> 1)) * LD + 8 * (mi & 1));
        const u32 dB = tc_smem_addr(dos + (mr + 8 * (mi >> 1)) * LD + 8 * (mi & 1));
        tc_two_products<NT, D, LD>(sacc, pacc, kA, vA, qB, dB);
        // Element e of n-tile n: key jlo + 8(e/2), query i0 + 8n + 2c4 + e%2. Only tiles that
        // cross the diagonal or an edge need the mask.
        // Two copies of the loop: the compares and selects of the mask cost as much as the
        // exponential, and most tiles need none.
        if (i0 + BM > s || j0 + TC_BN > t || (causal && i0 + off < j0 + TC_BN)) {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int col = 8 * n + 2 * c4;
                const float2 l2 = *(const float2*)(lsv + col);
                const float2 dl = *(const float2*)(dlv + col);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = i0 + col + (e & 1), j = e < 2 ? jlo : jhi;
                    const bool ok = i < s && j < t && (!causal || j - i < off);
                    const float p = ok ? tc_exp2(sacc[n][e] * sl2 - ((e & 1) ? l2.y : l2.x)) : 0.f;
                    pacc[n][e] = ok ? p * (pacc[n][e] - ((e & 1) ? dl.y : dl.x)) : 0.f;
                    sacc[n][e] = p;
                }
            }
        } else {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int col = 8 * n + 2 * c4;
                const float2 l2 = *(const float2*)(lsv + col);
                const float2 dl = *(const float2*)(dlv + col);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float p = tc_exp2(sacc[n][e] * sl2 - ((e & 1) ? l2.y : l2.x));
                    pacc[n][e] = p * (pacc[n][e] - ((e & 1) ? dl.y : dl.x));
                    sacc[n][e] = p;
                }
            }
        }
        // dV += Pᵀ·dO, dK += dSᵀ·Q: dO and Q rows are the k (query) index of the B operand,
        // loaded transposed as V is in the forward.
        const u32 dT = tc_smem_addr(dos + (mr + 8 * (mi & 1)) * LD + 8 * (mi >> 1));
        const u32 qT = tc_smem_addr(qs + (mr + 8 * (mi & 1)) * LD + 8 * (mi >> 1));
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            u32 pa[4], da[4];
            tc_acc_to_a(pa, sacc[2 * kk], sacc[2 * kk + 1]);
            tc_acc_to_a(da, pacc[2 * kk], pacc[2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                u32 b[4];
                tc_ldsm4t(b, dT + (u32)((16 * kk * LD + 16 * dp) * 2));
                tc_mma(dva[2 * dp], pa, b[0], b[1]);
                tc_mma(dva[2 * dp + 1], pa, b[2], b[3]);
                tc_ldsm4t(b, qT + (u32)((16 * kk * LD + 16 * dp) * 2));
                tc_mma(dka[2 * dp], da, b[0], b[1]);
                tc_mma(dka[2 * dp + 1], da, b[2], b[3]);
            }
        }
    }

    // Every key of the block is written, zeros where no query sees it.
    const float scale = (float)a.scale;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int j = r ? jhi : jlo;
        if (j >= t) continue;
        T* krow = dk + bi * a.st[7][0] + kh * a.st[7][1] + (i64)j * a.st[7][2];
        T* vrow = dv + bi * a.st[8][0] + kh * a.st[8][1] + (i64)j * a.st[8][2];
#pragma unroll
        for (int n = 0; n < OT; ++n) {
            const int col = 8 * n + 2 * c4;
            if (col < d) {
                *(u32*)(krow + col) = tc_pack(scale * dka[n][2 * r], scale * dka[n][2 * r + 1]);
                *(u32*)(vrow + col) = tc_pack(dva[n][2 * r], dva[n][2 * r + 1]);
            }
        }
    }
#endif
}

template <int D, int S> __device__ void attn_bwd_dq_tc(const AttnArgs& a, T* sm) {
#if __CUDA_ARCH__ >= 800
    constexpr int LD = D + 8;
    constexpr int TILE = TC_BN * LD;  // one K or V tile
    constexpr int NT = TC_BN / 8;     // n-tiles of S: keys
    constexpr int OT = D / 8;         // n-tiles of dQ: dims
    T* qs = sm;
    T* dos = qs + TC_BM * LD;
    T* kv = dos + TC_BM * LD;  // S stages: stage st holds K at kv + 2st·TILE, V right after
    const int d = (int)a.d, s = (int)a.s;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
    const int mi = lane >> 3, mr = lane & 7;
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    const float* lse = (const float*)a.p[4];
    const T* dout = (const T*)a.p[5];
    T* dq = (T*)a.p[6];
    const T* o = (const T*)a.p[3];
    float* delta = (float*)a.delta;
    const i64 bhn = a.b * a.hq, qtiles = (a.s + TC_BM - 1) / TC_BM;
    // The heaviest (last, under a causal mask) query tiles first.
    const i64 w = blockIdx.x, qt = qtiles - 1 - w / bhn, bh = w % bhn, h = bh % a.hq, bi = bh / a.hq;
    const i64 kh = h / (a.hq / a.hk);
    const int i0 = (int)qt * TC_BM;
    const i64 kbase = head_row(a, 1, bi, kh, 0), vbase = head_row(a, 2, bi, kh, 0);
    const int last = min(i0 + TC_BM, s) - 1;
    const int nkeys = (int)visible(a, last);
    const int ntiles = (nkeys + TC_BN - 1) / TC_BN;
    const int vmin = (int)visible(a, i0);  // key tiles below this need no mask
    const i64 rows = a.b * a.hq * a.s;
    // O pairs as one 4-byte load: a dense head dim and even strides from a 4-byte aligned base.
    const bool opair = a.st[3][3] == 1 && ((a.st[3][0] | a.st[3][1] | a.st[3][2]) & 1) == 0 && ((size_t)o & 3) == 0;
    if (ntiles == 0) {
        // Rows that see no key: D and lse·log2 e are 0 for the dK/dV pass (which masks all
        // their pairs); dq is written as zeros below.
        for (int r = threadIdx.x; r < TC_BM; r += TC_THREADS) {
            if (i0 + r < s) delta[bh * a.s + i0 + r] = delta[rows + bh * a.s + i0 + r] = 0.f;
        }
    }

    auto load_kv = [&](int tile) {
        T* st = kv + (tile % S) * 2 * TILE;
        tc_copy_rows<D, TC_BN>(tc_smem_addr(st), k + kbase, a.st[1][2], tile * TC_BN, (int)a.t, d);
        tc_copy_rows<D, TC_BN>(tc_smem_addr(st + TILE), v + vbase, a.st[2][2], tile * TC_BN, (int)a.t, d);
    };
    tc_copy_rows<D, TC_BM>(tc_smem_addr(qs), q + head_row(a, 0, bi, h, 0), a.st[0][2], i0, s, d);
    tc_copy_rows<D, TC_BM>(tc_smem_addr(dos), dout + head_row(a, 5, bi, h, 0), a.st[5][2], i0, s, d);
#pragma unroll
    for (int p = 0; p < S - 1; ++p) {
        if (p < ntiles) load_kv(p);
        tc_commit();
    }

    const int ilo = i0 + 16 * warp + g, ihi = ilo + 8;
    const int vlo = (int)visible(a, ilo), vhi = (int)visible(a, ihi);
    float l2[2], dl[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = r ? ihi : ilo;
        // Rows past s and rows that see no key (NaN lse and D): 0, and every pair masked.
        const bool live = i < s && (r ? vhi : vlo) > 0;
        l2[r] = live ? lse[head_row(a, 4, bi, h, i)] * TC_LOG2E : 0.f;
    }
    const float sl2 = (float)(a.scale * 1.4426950408889634);
    float dqa[OT][4];
#pragma unroll
    for (int n = 0; n < OT; ++n) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.f;
    const u32 qA = tc_smem_addr(qs + (16 * warp + mr + 8 * (mi & 1)) * LD + 8 * (mi >> 1));
    const u32 dA = tc_smem_addr(dos + (16 * warp + mr + 8 * (mi & 1)) * LD + 8 * (mi >> 1));

    for (int tile = 0; tile < ntiles; ++tile) {
        const int j0 = tile * TC_BN;
        // One barrier per tile, as in the forward: this tile has landed for every thread and
        // the stage the next request reuses is consumed.
        tc_wait<S - 2>();
        __syncthreads();
        if (tile + S - 1 < ntiles) load_kv(tile + S - 1);
        tc_commit();
        if (tile == 0) {
            // D = rowsum(dO ∘ O) of the warp's 16 rows, from dO in shared memory (now landed)
            // and O in global memory, two lanes per row; written out with lse·log2 e for the
            // dK/dV pass, which runs after this one, both 0 for rows that see no key. The O
            // loads of a lane are independent (unrolled, pairs where O allows), so a warp waits
            // on global memory once, not once per element.
            const int rr = 16 * warp + (lane >> 1), i = i0 + rr, c0 = (lane & 1) * (D / 2);
            float acc = 0.f;
            if (i < s) {
                const T* orow = o + head_row(a, 3, bi, h, i);
                if (opair) {
                    u32 ov[D / 4];
#pragma unroll
                    for (int c = 0; c < D / 2; c += 2) ov[c / 2] = c0 + c < d ? *(const u32*)(orow + c0 + c) : 0u;
#pragma unroll
                    for (int c = 0; c < D / 2; c += 2) {
                        T o0, o1;
                        o0.x = (unsigned short)(ov[c / 2] & 0xffffu);
                        o1.x = (unsigned short)(ov[c / 2] >> 16);
                        acc += TT::load(dos[rr * LD + c0 + c]) * TT::load(o0);
                        acc += TT::load(dos[rr * LD + c0 + c + 1]) * TT::load(o1);
                    }
                } else {
                    for (int c = c0; c < c0 + D / 2 && c < d; ++c) {
                        acc += TT::load(dos[rr * LD + c]) * TT::load(orow[c * a.st[3][3]]);
                    }
                }
            }
            acc += __shfl_xor_sync(FULL, acc, 1);
            const float dlo = __shfl_sync(FULL, acc, 2 * g), dhi = __shfl_sync(FULL, acc, 2 * g + 16);
            dl[0] = ilo < s && vlo > 0 ? dlo : 0.f;
            dl[1] = ihi < s && vhi > 0 ? dhi : 0.f;
            // Lane 2m holds row 16·warp + m: m = 8r + g' of the accumulator layout.
            const int m = lane >> 1, src = 4 * (m & 7);
            const float dm0 = __shfl_sync(FULL, dl[0], src), dm1 = __shfl_sync(FULL, dl[1], src);
            const float lm0 = __shfl_sync(FULL, l2[0], src), lm1 = __shfl_sync(FULL, l2[1], src);
            if ((lane & 1) == 0 && i < s) {
                delta[bh * a.s + i] = m < 8 ? dm0 : dm1;
                delta[rows + bh * a.s + i] = m < 8 ? lm0 : lm1;
            }
        }
        const T* ks = kv + (tile % S) * 2 * TILE;
        const T* vs = ks + TILE;
        // S = Q·Kᵀ, dP = dO·Vᵀ.
        float sacc[NT][4], pacc[NT][4];
        const u32 kB = tc_smem_addr(ks + (mr + 8 * (mi >> 1)) * LD + 8 * (mi & 1));
        const u32 vB = tc_smem_addr(vs + (mr + 8 * (mi >> 1)) * LD + 8 * (mi & 1));
        tc_two_products<NT, D, LD>(sacc, pacc, qA, dA, kB, vB);
        // Element e of n-tile n: row ilo + 8(e/2), key j0 + 8n + 2c4 + e%2.
        if (j0 + TC_BN > vmin) {  // two copies of the loop, as in the dK/dV pass
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = e >> 1, j = j0 + 8 * n + 2 * c4 + (e & 1);
                    const bool ok = j < (r ? vhi : vlo);
                    const float p = ok ? tc_exp2(sacc[n][e] * sl2 - l2[r]) : 0.f;
                    pacc[n][e] = ok ? p * (pacc[n][e] - dl[r]) : 0.f;
                }
            }
        } else {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float p = tc_exp2(sacc[n][e] * sl2 - l2[e >> 1]);
                    pacc[n][e] = p * (pacc[n][e] - dl[e >> 1]);
                }
            }
        }
        // dQ += dS·K: K rows are the k (key) index of the B operand, loaded transposed.
        const u32 kT = tc_smem_addr(ks + (mr + 8 * (mi & 1)) * LD + 8 * (mi >> 1));
#pragma unroll
        for (int kk = 0; kk < TC_BN / 16; ++kk) {
            u32 da[4];
            tc_acc_to_a(da, pacc[2 * kk], pacc[2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                u32 b[4];
                tc_ldsm4t(b, kT + (u32)((16 * kk * LD + 16 * dp) * 2));
                tc_mma(dqa[2 * dp], da, b[0], b[1]);
                tc_mma(dqa[2 * dp + 1], da, b[2], b[3]);
            }
        }
    }
    tc_wait<0>();  // no copy may be in flight at exit (no key tile: Q and dO went unused)

    const float scale = (float)a.scale;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = r ? ihi : ilo;
        if (i >= s) continue;
        T* row = dq + head_row(a, 6, bi, h, i);
#pragma unroll
        for (int n = 0; n < OT; ++n) {
            const int col = 8 * n + 2 * c4;
            if (col < d) *(u32*)(row + col) = tc_pack(scale * dqa[n][2 * r], scale * dqa[n][2 * r + 1]);
        }
    }
#endif
}

// The dK/dV pass streams 64 queries per step at d = 64, 32 at d = 128 (the two D-wide
// accumulators of a warp take 128 registers there). At d = 64 both passes are capped at 168
// registers, three blocks (12 warps) per SM: the products are latency bound at two blocks,
// and a few spilled bytes cost less than a block fewer per SM (measured against the
// alternatives: RESULTS.md, "Kernel design notes").
// The dK/dV template arguments <D, BM, S> are mirrored by `tc_dkv_rows` and `TC_DKV_STAGES` in
// ops/attention.rs (which size shared memory from them), the dQ pass's S by `tc_stages`.
extern "C" __global__ void __launch_bounds__(TC_THREADS, 3) attn_bwd_dkv_tc_64(const AttnArgs a) {
    ASMEM;
    attn_bwd_dkv_tc<64, 64, 2>(a, (T*)smem_raw);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS) attn_bwd_dkv_tc_128(const AttnArgs a) {
    ASMEM;
    attn_bwd_dkv_tc<128, 32, 2>(a, (T*)smem_raw);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 3) attn_bwd_dq_tc_64(const AttnArgs a) {
    ASMEM;
    attn_bwd_dq_tc<64, 3>(a, (T*)smem_raw);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS) attn_bwd_dq_tc_128(const AttnArgs a) {
    ASMEM;
    attn_bwd_dq_tc<128, 2>(a, (T*)smem_raw);
}

// ---- Hopper forward (f16 / bf16, sm_90a) ------------------------------------------------------
// The tensor-core forward on Hopper's warpgroup products (wgmma), which read their operands
// from shared memory without ldmatrix and run asynchronously to the threads that issue them.
// A block of two warpgroups takes WG_BM = 128 query rows of one (batch, head), warpgroup w
// rows 64w.. (its warp x rows 16x.. of those, as the accumulator layout has it); K and V
// stream through shared memory in tiles of WG_BN = 64 keys, S stages deep with cp.async and
// one barrier per tile, as in `attn_fwd_tc`. S = Q·Kᵀ takes Q and K from shared memory;
// O += P·V takes P from registers (the f32 accumulator layout of S, converted pairwise, is
// the A-register layout) and V from shared memory, read transposed. A warp's accumulator
// fragments are those of mma.m16n8 n-tiles side by side, so the softmax is `tc_softmax`'s
// arithmetic. Step j issues S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} together, waits for S_j
// alone and runs its softmax while the P·V product still runs; O's rescale waits for it.
// Shared tiles (rows of 64 elements, 128 bytes) are in the 128-byte swizzled layout that the
// descriptors name: row r at byte 128·r of the tile, its 16-byte chunk c at chunk c ^ (r % 8),
// so that the eight rows of a core matrix lie in different banks; eight threads copy a row.
// Measured against the unswizzled (interleaved) layout, without the overlap, with 128-key
// tiles and with one or three warpgroups: RESULTS.md, "Kernel design notes";
// scripts/attention_dev.cu checks this kernel against a reference and times it.
#define WG_THREADS 256
#define WG_BM 128
#define WG_BN 64
#if TC_CAT(TC_IS_, ELEM) == 1
#define WG_TYPES ".f32.f16.f16"
#else
#define WG_TYPES ".f32.bf16.bf16"
#endif
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Descriptor of a 128-byte swizzled operand at `addr` (1024-byte aligned pattern): 8-row
// groups 1024 bytes apart (SBO); LBO is unused for a 64-element extent.
__device__ __forceinline__ u64 wg_desc(u32 addr) {
    return (u64)((addr & 0x3ffffu) >> 4) | (u64)1 << 16 | (u64)(1024 >> 4) << 32 | (u64)1 << 62;
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Shared memory written by the threads (cp.async, stores) is seen by wgmma, which reads it
// through the async proxy, after this fence and a barrier.
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// The registers of an asynchronous product are its own from issue to wait: these empty
// statements keep the compiler from moving other accesses of them across the fence or wait.
template <int N> __device__ __forceinline__ void wg_pin(float (&x)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n) asm volatile("" : "+f"(x[n][0]), "+f"(x[n][1]), "+f"(x[n][2]), "+f"(x[n][3])::"memory");
}
template <int N> __device__ __forceinline__ void wg_pin(u32 (&x)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n) asm volatile("" : "+r"(x[n][0]), "+r"(x[n][1]), "+r"(x[n][2]), "+r"(x[n][3])::"memory");
}

// x (64 × 64, this thread's 32 values) = A·B (+ x when `acc`), A (64 × 16) and B (16 × 64,
// K-major: transposed, as K is stored) from shared memory.
__device__ __forceinline__ void wg_mma_ss(float (&x)[8][4], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16" WG_TYPES " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(x[0][0]), "+f"(x[0][1]), "+f"(x[0][2]), "+f"(x[0][3]), "+f"(x[1][0]), "+f"(x[1][1]), "+f"(x[1][2]), "+f"(x[1][3]), "+f"(x[2][0]), "+f"(x[2][1]), "+f"(x[2][2]), "+f"(x[2][3]), "+f"(x[3][0]), "+f"(x[3][1]), "+f"(x[3][2]), "+f"(x[3][3]), "+f"(x[4][0]), "+f"(x[4][1]), "+f"(x[4][2]), "+f"(x[4][3]), "+f"(x[5][0]), "+f"(x[5][1]), "+f"(x[5][2]), "+f"(x[5][3]), "+f"(x[6][0]), "+f"(x[6][1]), "+f"(x[6][2]), "+f"(x[6][3]), "+f"(x[7][0]), "+f"(x[7][1]), "+f"(x[7][2]), "+f"(x[7][3])
                 : "l"(da), "l"(db), "r"(acc));
}
// x += A·B, A (64 × 16) from registers (this thread's 4 pairs), B (16 × 64, MN-major: rows of
// V as stored) from shared memory.
__device__ __forceinline__ void wg_mma_rs(float (&x)[8][4], const u32 (&a)[4], u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16" WG_TYPES " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(x[0][0]), "+f"(x[0][1]), "+f"(x[0][2]), "+f"(x[0][3]), "+f"(x[1][0]), "+f"(x[1][1]), "+f"(x[1][2]), "+f"(x[1][3]), "+f"(x[2][0]), "+f"(x[2][1]), "+f"(x[2][2]), "+f"(x[2][3]), "+f"(x[3][0]), "+f"(x[3][1]), "+f"(x[3][2]), "+f"(x[3][3]), "+f"(x[4][0]), "+f"(x[4][1]), "+f"(x[4][2]), "+f"(x[4][3]), "+f"(x[5][0]), "+f"(x[5][1]), "+f"(x[5][2]), "+f"(x[5][3]), "+f"(x[6][0]), "+f"(x[6][1]), "+f"(x[6][2]), "+f"(x[6][3]), "+f"(x[7][0]), "+f"(x[7][1]), "+f"(x[7][2]), "+f"(x[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// This thread's share of copying NROWS rows of 64 elements of one head with cp.async into a
// swizzled tile at `dst`. Rows at or past `limit` and columns at or past d are zeros (not read).
template <int NROWS, int THREADS = WG_THREADS>
__device__ __forceinline__ void wg_copy_rows(u32 dst, const T* src, i64 srow, int r0, int limit, int d) {
    static_assert(NROWS * 8 % THREADS == 0, "whole rounds of chunks");
#pragma unroll
    for (int k = 0; k < NROWS * 8 / THREADS; ++k) {
        const int i = threadIdx.x + k * THREADS, r = i >> 3, c = i & 7;
        const bool in = 8 * c < d && r0 + r < limit;
        tc_cp16(dst + (u32)(128 * r + ((c ^ (r & 7)) << 4)), in ? src + (i64)(r0 + r) * srow + 8 * c : src, in ? 16 : 0);
    }
}

// The barrier that starts step j of a kernel streaming `n` tiles through S = AHEAD + 2 stages:
// tile j has landed for every thread and is visible to wgmma (which reads shared memory
// through the async proxy), and no warp still reads the stage that tile j + AHEAD takes,
// whose request `load` then issues (an empty group past the last tile keeps the count).
template <int AHEAD, class Load> __device__ __forceinline__ void wg_arrive(int j, int n, Load load) {
    tc_wait<AHEAD - 1>();
    wg_proxy_fence();
    __syncthreads();
    if (j + AHEAD < n) load(j + AHEAD);
    tc_commit();
}

// Online softmax of one key tile for a warp's 16 rows, split around the P·V product that owns
// O's registers: `wg_softmax` turns the products into weights, moves m and l, and says whether
// O must be rescaled by `corr`; `wg_rescale` applies it. Same arithmetic as `tc_softmax` (MT = 1).
template <bool MASK, int NT>
__device__ __forceinline__ bool wg_softmax(float (&sacc)[1][NT][4], float (&m)[1][2], float (&l)[1][2],
                                           float (&corr)[2], const int (&vis)[1][2], int jc, float sl2) {
    if (MASK) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (jc + 8 * n + (e & 1) >= vis[0][e >> 1]) sacc[0][n][e] = NEG_INF;
            }
        }
    }
    float mx[2];
    bool grow = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float x = tc_row_max<NT>(sacc[0], r);
        x = fmaxf(x, __shfl_xor_sync(FULL, x, 1));
        x = fmaxf(x, __shfl_xor_sync(FULL, x, 2));
        mx[r] = x * sl2;
        grow |= mx[r] > m[0][r] + TC_RESCALE;  // false while both are -inf
    }
    grow = __any_sync(FULL, grow);  // warp-uniform
    if (grow) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float mn = fmaxf(m[0][r], mx[r]);
            corr[r] = mn == NEG_INF ? 1.f : tc_exp2(m[0][r] - mn);
            m[0][r] = mn;
            l[0][r] *= corr[r];
        }
    }
    const float mu0 = m[0][0] == NEG_INF ? 0.f : m[0][0];
    const float mu1 = m[0][1] == NEG_INF ? 0.f : m[0][1];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[0][n][e] = tc_exp2(fmaf(sacc[0][n][e], sl2, -(e < 2 ? mu0 : mu1)));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[0][r] += tc_row_sum<NT>(sacc[0], r);
    return grow;
}
template <int OT> __device__ __forceinline__ void wg_rescale(float (&oacc)[1][OT][4], const float (&corr)[2]) {
#pragma unroll
    for (int n = 0; n < OT; ++n) {
        oacc[0][n][0] *= corr[0];
        oacc[0][n][1] *= corr[0];
        oacc[0][n][2] *= corr[1];
        oacc[0][n][3] *= corr[1];
    }
}

template <int S> __device__ void attn_fwd_wg(const AttnArgs& a, T* sm) {
    constexpr int D = 64;            // one swizzle atom per row
    constexpr int TILE = WG_BN * D;  // elements of one K or V tile
    constexpr int NT = WG_BN / 8;    // score n-tiles per key tile
    constexpr int OT = D / 8;        // output n-tiles
    constexpr int AHEAD = S - 2;     // tiles in flight besides the two a step reads
    static_assert(AHEAD >= 1, "stages");
    const int d = (int)a.d, t = (int)a.t;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2,
              c4 = lane & 3;
    // Shared, from the first 1024-byte boundary (the swizzle pattern repeats every 1024
    // bytes; the launcher adds the slack): Q (WG_BM rows), then S stages of a K and a V tile.
    const u32 qaddr = (tc_smem_addr(sm) + 1023u) & ~1023u, kvaddr = qaddr + (u32)(WG_BM * D * 2);
    sm += (qaddr - tc_smem_addr(sm)) / 2;
    const T* q = (const T*)a.p[0];
    const TcTile tl = tc_tile(a, WG_BM);
    const i64 bi = tl.bi, h = tl.h, i0 = tl.i0;
    const int ntiles = (int)((tl.nkeys + WG_BN - 1) / WG_BN);
    // Row indices fit in 32 bits (the launcher checks s and t).
    const int wi0 = (int)i0 + 64 * wg + 16 * warp;
    // Keys every row of the warp sees: tiles below need no mask.
    const int vmin = (int)visible(a, wi0);
    auto stage = [&](int j) { return kvaddr + (u32)((j % S) * 2 * TILE * 2); };
    auto load_kv = [&](int j) {
        wg_copy_rows<WG_BN>(stage(j), tl.k, a.st[1][2], j * WG_BN, t, d);
        wg_copy_rows<WG_BN>(stage(j) + TILE * 2, tl.v, a.st[2][2], j * WG_BN, t, d);
    };

    wg_copy_rows<WG_BM>(qaddr, q + head_row(a, 0, bi, h, 0), a.st[0][2], (int)i0, (int)a.s, d);
#pragma unroll
    for (int p = 0; p < AHEAD; ++p) {
        if (p < ntiles) load_kv(p);
        tc_commit();
    }
    // Scores are formed with |scale|, as in `attn_fwd_tc`: for a negative scale Q is negated
    // in shared memory (each thread its own chunks, once they have landed).
    const float sl2 = fmaxf(fabsf((float)(a.scale * 1.4426950408889634)), 1.17549435e-38f);
    if (a.scale < 0) {
        tc_wait<AHEAD - 1>();
        for (int i = threadIdx.x; i < WG_BM * D / 8; i += WG_THREADS) {
            uint4* c = (uint4*)(sm + 8 * i);
            uint4 x = *c;
            x.x ^= 0x80008000u, x.y ^= 0x80008000u, x.z ^= 0x80008000u, x.w ^= 0x80008000u;
            *c = x;
        }
    }

    // Row of accumulator half r (0: g, 1: g + 8): wi0 + 8r + g.
    int vis[1][2];
    vis[0][0] = (int)visible(a, wi0 + g);  // rows past s: not stored
    vis[0][1] = (int)visible(a, wi0 + g + 8);
    float m[1][2] = {{NEG_INF, NEG_INF}}, l[1][2] = {{0.f, 0.f}};
    float oacc[1][OT][4], sacc[1][NT][4];
    u32 pa[WG_BN / 16][4];
#pragma unroll
    for (int n = 0; n < OT; ++n) oacc[0][n][0] = oacc[0][n][1] = oacc[0][n][2] = oacc[0][n][3] = 0.f;
    const u32 qrows = qaddr + (u32)(wg * 64 * 128);  // this warpgroup's 64 rows
    // K-steps of 16 elements: 32 bytes along a row of Q and K, 16 rows (2048 bytes) of V.
    auto scores = [&](int j) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wg_mma_ss(sacc[0], wg_desc(qrows + kk * 32), wg_desc(stage(j) + kk * 32), kk);
    };
    auto values = [&](int j) {
#pragma unroll
        for (int kk = 0; kk < WG_BN / 16; ++kk) wg_mma_rs(oacc[0], pa[kk], wg_desc(stage(j) + TILE * 2 + kk * 2048));
    };
    auto to_weights = [&](int j, float (&corr)[2]) {
        const int j0 = j * WG_BN;
        return j0 + WG_BN > vmin ? wg_softmax<true, NT>(sacc, m, l, corr, vis, j0 + 2 * c4, sl2)
                                 : wg_softmax<false, NT>(sacc, m, l, corr, vis, j0 + 2 * c4, sl2);
    };
    auto weights_to_a = [&]() {
#pragma unroll
        for (int kk = 0; kk < WG_BN / 16; ++kk) tc_acc_to_a(pa[kk], sacc[0][2 * kk], sacc[0][2 * kk + 1]);
    };
    // Step j reads tile j; the barrier at its start says that tile j has landed and that every
    // warpgroup is done with tile j - 2, whose P·V step j - 1 waited for, so its stage takes
    // the next request.
    auto arrive = [&](int j) { wg_arrive<AHEAD>(j, ntiles, load_kv); };
    // Both warpgroups take every tile of the block (a tile past a warpgroup's rows is masked
    // whole) so that no product sits on a branch: ptxas serializes the products of a function
    // where it cannot prove that the whole warpgroup issues them.
    if (ntiles > 0) {
        float corr[2] = {1.f, 1.f};
        arrive(0);
        wg_pin<NT>(sacc[0]);
        wg_fence();
        scores(0);
        wg_commit();
        wg_wait<0>();
        wg_pin<NT>(sacc[0]);
        to_weights(0, corr);  // O is still zero: nothing to rescale
        weights_to_a();
        for (int j = 1; j < ntiles; ++j) {
            arrive(j);
            wg_pin<NT>(sacc[0]);
            wg_pin<OT>(oacc[0]);
            wg_pin<WG_BN / 16>(pa);
            wg_fence();
            scores(j);
            wg_commit();
            values(j - 1);
            wg_commit();
            wg_wait<1>();
            wg_pin<NT>(sacc[0]);
            const bool grow = to_weights(j, corr);
            wg_wait<0>();
            wg_pin<OT>(oacc[0]);
            wg_pin<WG_BN / 16>(pa);
            if (grow) wg_rescale<OT>(oacc, corr);
            weights_to_a();
        }
        wg_pin<OT>(oacc[0]);
        wg_pin<WG_BN / 16>(pa);
        wg_fence();
        values(ntiles - 1);
        wg_commit();
        wg_wait<0>();
        wg_pin<OT>(oacc[0]);
    }
    tc_wait<0>();  // no copy may be in flight at exit
    tc_store_rows<1, OT>(a, tl, wi0, oacc, m, l, vis);
}
#endif

// Head dims up to 64. Five stages (three tiles in flight); two blocks per SM (128 registers a
// thread, 2 · 97 KiB of shared memory: `wg_smem` in ops/attention.rs). Compiled empty where
// wgmma is absent: the launcher takes it on sm_90 only, where modules are compiled for sm_90a.
#define WG_STAGES 5
extern "C" __global__ void __launch_bounds__(WG_THREADS, 2) attn_fwd_wg_64(const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ASMEM;
    attn_fwd_wg<WG_STAGES>(a, (T*)smem_raw);
#endif
}

// ---- Hopper backward (f16 / bf16, sm_90a) -----------------------------------------------------
// The two passes of the tensor-core backward (same split, same arithmetic, same outputs,
// including the D and lse·log2 e rows the dQ pass writes for the dK/dV pass) on wgmma, with
// the forward's machinery: swizzled tiles copied S stages deep, one barrier per tile. A block
// is WGS warpgroups, warpgroup w taking rows 64w.. of the block's 64·WGS rows.
// - dQ (`attn_bwd_dq_wg_64`): a block takes 64·WGS queries of one (batch, head) and streams
//   its key head's K and V in 64-key tiles: S = Q·Kᵀ and dP = dO·Vᵀ (both operands in shared
//   memory), dS = P ∘ (dP - D) in registers, dQ += dS·K (dS from registers, K read MN-major
//   as the forward reads V). As in the forward, tile j's S and dP are issued together with
//   tile j-1's dS·K, whose registers the weights of tile j then wait for.
// - dK/dV (`attn_bwd_dkv_wg_64`): a block takes 64·WGS keys of one (batch, kv head) and
//   streams 64-query tiles of every query head of the group with their lse·log2 e and D. It
//   forms Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ so that keys are accumulator rows: Pᵀ and dSᵀ are then
//   the register A operands of dV += Pᵀ·dO and dK += dSᵀ·Q (dO and Q read MN-major), and the
//   per-query lse and D are per-column values read from shared memory. For a grouped-query
//   model the group's heads may be shared out among `a.split` blocks per key tile, whose f32
//   partial sums `attn_bwd_dkv_sum` adds.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// dS = P ∘ (dP - D) with P = 2^(s·sl2 - l2), in place (s becomes P); `ok(n, e)` says whether
// element e of n-tile n is a pair some query sees (masked pairs are selected to zero, never
// multiplied: a dead row's D is 0 but its products may be anything). l2 and D per element.
template <bool MASK, class Ok, class Row>
__device__ __forceinline__ void wg_grad_weights(float (&sacc)[8][4], float (&pacc)[8][4], float sl2, Ok ok, Row row) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 ld = row(n, e);  // (lse·log2 e, D)
            const float p = tc_exp2(fmaf(sacc[n][e], sl2, -ld.x));
            const float ds = p * (pacc[n][e] - ld.y);
            const bool keep = !MASK || ok(n, e);
            sacc[n][e] = keep ? p : 0.f;
            pacc[n][e] = keep ? ds : 0.f;
        }
    }
}

template <int S, int WGS> __device__ void attn_bwd_dq_wg(const AttnArgs& a, T* sm) {
    constexpr int D = 64;
    constexpr int TILE = WG_BN * D;  // elements of one K or V tile
    constexpr int AHEAD = S - 2;
    constexpr int BM = 64 * WGS, THREADS = 128 * WGS;  // queries and threads of a block
    static_assert(AHEAD >= 1, "stages");
    const int d = (int)a.d, s = (int)a.s, t = (int)a.t;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2,
              c4 = lane & 3;
    // Shared, from the first 1024-byte boundary: Q and dO (BM rows each), S stages of a K and
    // a V tile, then the rows' D and lse·log2 e (f32).
    const u32 qaddr = (tc_smem_addr(sm) + 1023u) & ~1023u, doaddr = qaddr + (u32)(BM * D * 2),
              kvaddr = doaddr + (u32)(BM * D * 2);
    float* rowf = (float*)((char*)sm + (kvaddr + (u32)(S * 2 * TILE * 2) - tc_smem_addr(sm)));
    const T* q = (const T*)a.p[0];
    const T* o = (const T*)a.p[3];
    const float* lse = (const float*)a.p[4];
    const T* dout = (const T*)a.p[5];
    T* dq = (T*)a.p[6];
    float* delta = (float*)a.delta;
    const TcTile tl = tc_tile(a, BM);
    const i64 bi = tl.bi, h = tl.h, bh = bi * a.hq + h, rows = a.b * a.hq * a.s;
    const int i0 = (int)tl.i0, ntiles = (int)((tl.nkeys + WG_BN - 1) / WG_BN);
    const int wi0 = i0 + 64 * wg + 16 * warp;
    const int vmin = (int)visible(a, wi0);
    auto stage = [&](int j) { return kvaddr + (u32)((j % S) * 2 * TILE * 2); };
    auto load_kv = [&](int j) {
        wg_copy_rows<WG_BN, THREADS>(stage(j), tl.k, a.st[1][2], j * WG_BN, t, d);
        wg_copy_rows<WG_BN, THREADS>(stage(j) + TILE * 2, tl.v, a.st[2][2], j * WG_BN, t, d);
    };
    wg_copy_rows<BM, THREADS>(qaddr, q + head_row(a, 0, bi, h, 0), a.st[0][2], i0, s, d);
    wg_copy_rows<BM, THREADS>(doaddr, dout + head_row(a, 5, bi, h, 0), a.st[5][2], i0, s, d);
#pragma unroll
    for (int p = 0; p < AHEAD; ++p) {
        if (p < ntiles) load_kv(p);
        tc_commit();
    }
    {
        // D = rowsum(dO ∘ O), two threads a row, from global memory while the tiles load;
        // with lse·log2 e written out for the dK/dV pass and kept in shared memory for the
        // accumulator rows. Both are 0 for rows that see no key (their D is NaN: O is).
        // Every load of a thread is issued before the first is used (16-byte packs where O's
        // rows allow; dO's always do), so that a warp waits on global memory once.
        const int rr = threadIdx.x >> 1, c0 = (threadIdx.x & 1) * (D / 2), i = i0 + rr;
        float acc = 0.f;
        if (i < s) {
            const T* orow = o + head_row(a, 3, bi, h, i);
            const T* drow = dout + head_row(a, 5, bi, h, i);
            const bool opack = a.st[3][3] == 1 && ((size_t)orow & 15) == 0;
            u32 dw[D / 4], ow[D / 4];  // pairs of elements, the lower index in the low half
#pragma unroll
            for (int c = 0; c < D / 16; ++c) {
                const int col = c0 + 8 * c;
                const uint4 z = {0u, 0u, 0u, 0u};
                const uint4 x = col < d ? *(const uint4*)(drow + col) : z;
                const uint4 y = opack && col < d ? *(const uint4*)(orow + col) : z;
                dw[4 * c] = x.x, dw[4 * c + 1] = x.y, dw[4 * c + 2] = x.z, dw[4 * c + 3] = x.w;
                ow[4 * c] = y.x, ow[4 * c + 1] = y.y, ow[4 * c + 2] = y.z, ow[4 * c + 3] = y.w;
            }
            if (!opack) {
#pragma unroll
                for (int e = 0; e < D / 2; e += 2) {
                    const int col = c0 + e;
                    const unsigned short lo = col < d ? orow[(i64)col * a.st[3][3]].x : 0;
                    const unsigned short hi = col + 1 < d ? orow[(i64)(col + 1) * a.st[3][3]].x : 0;
                    ow[e / 2] = (u32)lo | (u32)hi << 16;
                }
            }
#pragma unroll
            for (int e = 0; e < D / 2; ++e) {
                T x, y;
                x.x = (unsigned short)(dw[e / 2] >> (16 * (e & 1)));
                y.x = (unsigned short)(ow[e / 2] >> (16 * (e & 1)));
                acc += TT::load(x) * TT::load(y);
            }
        }
        acc += __shfl_xor_sync(FULL, acc, 1);
        const bool live = i < s && visible(a, i) > 0;
        const float l2 = live ? lse[head_row(a, 4, bi, h, i)] * TC_LOG2E : 0.f;
        const float dd = live ? acc : 0.f;
        if ((threadIdx.x & 1) == 0) {
            rowf[rr] = dd;
            rowf[BM + rr] = l2;
            if (i < s) delta[bh * a.s + i] = dd, delta[rows + bh * a.s + i] = l2;
        }
    }
    __syncthreads();
    // Row of accumulator half r: wi0 + g + 8r.
    const int rl = 64 * wg + 16 * warp + g;
    const float2 ld[2] = {{rowf[BM + rl], rowf[rl]}, {rowf[BM + rl + 8], rowf[rl + 8]}};
    const int vis[2] = {(int)visible(a, wi0 + g), (int)visible(a, wi0 + g + 8)};
    const float sl2 = (float)(a.scale * 1.4426950408889634);

    float sacc[8][4], pacc[8][4], dqa[8][4];
    u32 da[WG_BN / 16][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.f;
    const u32 qrows = qaddr + (u32)(wg * 64 * 128), dorows = doaddr + (u32)(wg * 64 * 128);
    auto products = [&](int j) {  // S = Q·Kᵀ, dP = dO·Vᵀ
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wg_mma_ss(sacc, wg_desc(qrows + kk * 32), wg_desc(stage(j) + kk * 32), kk);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wg_mma_ss(pacc, wg_desc(dorows + kk * 32), wg_desc(stage(j) + TILE * 2 + kk * 32), kk);
    };
    auto gradient = [&](int j) {  // dQ += dS·K
#pragma unroll
        for (int kk = 0; kk < WG_BN / 16; ++kk) wg_mma_rs(dqa, da[kk], wg_desc(stage(j) + kk * 2048));
    };
    // Element e of n-tile n: row half e/2, key j0 + 8n + 2c4 + e%2.
    auto weights = [&](int j) {
        const int jc = j * WG_BN + 2 * c4;
        auto row = [&](int, int e) { return ld[e >> 1]; };
        auto ok = [&](int n, int e) { return jc + 8 * n + (e & 1) < vis[e >> 1]; };
        if (j * WG_BN + WG_BN > vmin) wg_grad_weights<true>(sacc, pacc, sl2, ok, row);
        else wg_grad_weights<false>(sacc, pacc, sl2, ok, row);
    };
    auto to_a = [&]() {
#pragma unroll
        for (int kk = 0; kk < WG_BN / 16; ++kk) tc_acc_to_a(da[kk], pacc[2 * kk], pacc[2 * kk + 1]);
    };
    auto arrive = [&](int j) { wg_arrive<AHEAD>(j, ntiles, load_kv); };
    // As in the forward, both warpgroups take every tile, so that no product is on a branch.
    if (ntiles > 0) {
        arrive(0);
        wg_pin<8>(sacc);
        wg_pin<8>(pacc);
        wg_fence();
        products(0);
        wg_commit();
        wg_wait<0>();
        wg_pin<8>(sacc);
        wg_pin<8>(pacc);
        weights(0);
        to_a();
        for (int j = 1; j < ntiles; ++j) {
            arrive(j);
            wg_pin<8>(sacc);
            wg_pin<8>(pacc);
            wg_pin<8>(dqa);
            wg_pin<WG_BN / 16>(da);
            wg_fence();
            products(j);
            wg_commit();
            gradient(j - 1);
            wg_commit();
            wg_wait<1>();
            wg_pin<8>(sacc);
            wg_pin<8>(pacc);
            weights(j);
            // dS of tile j goes to `da` once the product reading tile j - 1's is done.
            wg_wait<0>();
            wg_pin<8>(dqa);
            wg_pin<WG_BN / 16>(da);
            to_a();
        }
        wg_pin<8>(dqa);
        wg_pin<WG_BN / 16>(da);
        wg_fence();
        gradient(ntiles - 1);
        wg_commit();
        wg_wait<0>();
        wg_pin<8>(dqa);
    }
    tc_wait<0>();  // no copy may be in flight at exit

    const float scale = (float)a.scale;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int i = wi0 + g + 8 * r;
        if (i >= s) continue;
        T* row = dq + head_row(a, 6, bi, h, i);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const int col = 8 * n + 2 * c4;
            if (col < d) *(u32*)(row + col) = tc_pack(scale * dqa[n][2 * r], scale * dqa[n][2 * r + 1]);
        }
    }
}

template <int S, int WGS> __device__ void attn_bwd_dkv_wg(const AttnArgs& a, T* sm) {
    constexpr int D = 64;
    constexpr int TILE = WG_BN * D;  // elements of one Q or dO tile
    constexpr int AHEAD = S - 2;
    constexpr int BKV = 64 * WGS, THREADS = 128 * WGS;  // keys and threads of a block
    static_assert(AHEAD >= 1, "stages");
    const int d = (int)a.d, s = (int)a.s, t = (int)a.t, off = t + 1 - s;
    const bool causal = a.causal != 0;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2,
              c4 = lane & 3;
    // Shared, from the first 1024-byte boundary: K and V (BKV rows each), S stages of a Q
    // and a dO tile, then S stages of the tile's lse·log2 e and D (f32).
    const u32 kaddr = (tc_smem_addr(sm) + 1023u) & ~1023u, vaddr = kaddr + (u32)(BKV * D * 2),
              qdaddr = vaddr + (u32)(BKV * D * 2), faddr = qdaddr + (u32)(S * 2 * TILE * 2);
    const float* fbuf = (const float*)((char*)sm + (faddr - tc_smem_addr(sm)));
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    const T* dout = (const T*)a.p[5];
    T* dk = (T*)a.p[7];
    T* dv = (T*)a.p[8];
    const float* delta = (const float*)a.delta;
    const float* lse2 = delta + a.b * a.hq * a.s;
    // With `a.split` > 1 the query heads of a group are shared out among that many blocks
    // per key tile (`per` heads each, the last block fewer), each writing its partial sums
    // to `a.partial`, which `attn_bwd_dkv_sum` adds up: a grouped-query model has few
    // (batch, kv head, key tile) blocks, each with a group's worth of steps.
    const i64 split = a.split > 1 ? a.split : 1, bhk = a.b * a.hk * split, group = a.hq / a.hk;
    const i64 per = (group + split - 1) / split;
    // The block placement is written out here as in `attn_bwd_dkv_tc`, not shared: a shared
    // helper (with `head_row` for this kernel's row offsets) made ptxas spill 24 bytes at the
    // 168 registers of three blocks per SM, and this pass 10% slower (H200, 2026-11-29).
    // Under a causal mask the first key tiles are seen by the most queries: they go first.
    const i64 w = blockIdx.x, kt = w / bhk, bk = w % bhk, part = bk % split, kh = (bk / split) % a.hk,
              bi = bk / split / a.hk;
    const i64 h0 = kh * group + part * per, nh = min(per, group - part * per);
    const int j0 = (int)kt * BKV;
    // Query i sees key j iff i < s, j < t and (causal) j < i + off.
    const int first = causal ? max(0, j0 + 1 - off) : 0;
    const int qt0 = first / WG_BN;
    const int nq = first < s ? (s + WG_BN - 1) / WG_BN - qt0 : 0;
    const int total = nh > 0 ? (int)nh * nq : 0;  // (query head, query tile) steps
    auto stage = [&](int it) { return qdaddr + (u32)((it % S) * 2 * TILE * 2); };
    auto load_q = [&](int it) {
        const i64 h = h0 + it / nq;
        const int i0 = (qt0 + it % nq) * WG_BN;
        wg_copy_rows<WG_BN, THREADS>(stage(it), q + bi * a.st[0][0] + h * a.st[0][1], a.st[0][2], i0, s, d);
        wg_copy_rows<WG_BN, THREADS>(stage(it) + TILE * 2, dout + bi * a.st[5][0] + h * a.st[5][1], a.st[5][2], i0, s, d);
        const u32 fd = faddr + (u32)((it % S) * 2 * WG_BN * 4);
        const i64 row0 = (bi * a.hq + h) * a.s;
        if (threadIdx.x < 2 * WG_BN) {
            const int r = threadIdx.x, i = i0 + r % WG_BN;
            // Rows past s read as 0; all their pairs are masked.
            const float* src = (r < WG_BN ? lse2 : delta) + row0 + i;
            tc_cp4(fd + 4 * r, i < s ? src : delta, i < s ? 4 : 0);
        }
    };
    if (total > 0) {
        wg_copy_rows<BKV, THREADS>(kaddr, k + bi * a.st[1][0] + kh * a.st[1][1], a.st[1][2], j0, t, d);
        wg_copy_rows<BKV, THREADS>(vaddr, v + bi * a.st[2][0] + kh * a.st[2][1], a.st[2][2], j0, t, d);
    }
#pragma unroll
    for (int p = 0; p < AHEAD; ++p) {
        if (p < total) load_q(p);
        tc_commit();
    }

    const float sl2 = (float)(a.scale * 1.4426950408889634);
    const int wj0 = j0 + 64 * wg;               // this warpgroup's first key
    const int jlo = wj0 + 16 * warp + g;        // key of accumulator half 0 (half 1: + 8)
    float sacc[8][4], pacc[8][4], dka[8][4], dva[8][4];
    u32 pa[WG_BN / 16][4], da[WG_BN / 16][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dka[n][e] = dva[n][e] = 0.f;
    }
    const u32 krows = kaddr + (u32)(wg * 64 * 128), vrows = vaddr + (u32)(wg * 64 * 128);
    auto products = [&](int it) {  // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wg_mma_ss(sacc, wg_desc(krows + kk * 32), wg_desc(stage(it) + kk * 32), kk);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wg_mma_ss(pacc, wg_desc(vrows + kk * 32), wg_desc(stage(it) + TILE * 2 + kk * 32), kk);
    };
    auto gradients = [&](int it) {  // dV += Pᵀ·dO, dK += dSᵀ·Q
#pragma unroll
        for (int kk = 0; kk < WG_BN / 16; ++kk) wg_mma_rs(dva, pa[kk], wg_desc(stage(it) + TILE * 2 + kk * 2048));
#pragma unroll
        for (int kk = 0; kk < WG_BN / 16; ++kk) wg_mma_rs(dka, da[kk], wg_desc(stage(it) + kk * 2048));
    };
    // Element e of n-tile n: key jlo + 8(e/2), query i0 + 8n + 2c4 + e%2.
    auto weights = [&](int it) {
        const int i0 = (qt0 + it % nq) * WG_BN;
        const float* fl = fbuf + (it % S) * 2 * WG_BN;
        auto row = [&](int n, int e) {  // pairs of columns as one 8-byte load each
            const float2 l2 = *(const float2*)(fl + 8 * n + 2 * c4), dl = *(const float2*)(fl + WG_BN + 8 * n + 2 * c4);
            float2 x;
            x.x = (e & 1) ? l2.y : l2.x;
            x.y = (e & 1) ? dl.y : dl.x;
            return x;
        };
        auto ok = [&](int n, int e) {
            const int i = i0 + 8 * n + 2 * c4 + (e & 1), j = jlo + 8 * (e >> 1);
            return i < s && j < t && (!causal || j - i < off);
        };
        if (i0 + WG_BN > s || wj0 + 64 > t || (causal && i0 + off < wj0 + 64))
            wg_grad_weights<true>(sacc, pacc, sl2, ok, row);
        else
            wg_grad_weights<false>(sacc, pacc, sl2, ok, row);
    };
    auto to_a = [&]() {
#pragma unroll
        for (int kk = 0; kk < WG_BN / 16; ++kk) {
            tc_acc_to_a(pa[kk], sacc[2 * kk], sacc[2 * kk + 1]);
            tc_acc_to_a(da[kk], pacc[2 * kk], pacc[2 * kk + 1]);
        }
    };
    auto arrive = [&](int it) { wg_arrive<AHEAD>(it, total, load_q); };
    // Step by step, each product waited for before its results are used: the blocks of an SM
    // (three) overlap one another's products and weights. Step it - 1 waited for all of its
    // products, so at step it's barrier the stage it reads last is free for the next request.
    for (int it = 0; it < total; ++it) {
        arrive(it);
        wg_pin<8>(sacc);
        wg_pin<8>(pacc);
        wg_fence();
        products(it);
        wg_commit();
        wg_wait<0>();
        wg_pin<8>(sacc);
        wg_pin<8>(pacc);
        weights(it);
        to_a();
        wg_pin<8>(dka);
        wg_pin<8>(dva);
        wg_pin<WG_BN / 16>(pa);
        wg_pin<WG_BN / 16>(da);
        wg_fence();
        gradients(it);
        wg_commit();
        wg_wait<0>();
        wg_pin<8>(dka);
        wg_pin<8>(dva);
        wg_pin<WG_BN / 16>(pa);
        wg_pin<WG_BN / 16>(da);
    }
    tc_wait<0>();

    // Every key of the block is written, zeros where no query sees it: to dk and dv, or with
    // a split to the block's part of `a.partial` (f32, dK unscaled, rows of 64).
    const float scale = (float)a.scale;
    const i64 krows_all = a.b * a.hk * a.t;
    float* pk = (float*)a.partial + (part * 2 * krows_all + (bi * a.hk + kh) * a.t) * D;
    float* pv = pk + krows_all * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int j = jlo + 8 * r;
        if (j >= t) continue;
        T* krow = dk + bi * a.st[7][0] + kh * a.st[7][1] + (i64)j * a.st[7][2];
        T* vrow = dv + bi * a.st[8][0] + kh * a.st[8][1] + (i64)j * a.st[8][2];
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const int col = 8 * n + 2 * c4;
            if (split > 1) {
                *(float2*)(pk + (i64)j * D + col) = float2{dka[n][2 * r], dka[n][2 * r + 1]};
                *(float2*)(pv + (i64)j * D + col) = float2{dva[n][2 * r], dva[n][2 * r + 1]};
            } else if (col < d) {
                *(u32*)(krow + col) = tc_pack(scale * dka[n][2 * r], scale * dka[n][2 * r + 1]);
                *(u32*)(vrow + col) = tc_pack(dva[n][2 * r], dva[n][2 * r + 1]);
            }
        }
    }
}
#endif

// One warpgroup per block (WGS = 1) and several blocks per SM: blocks that are not in step
// keep the tensor cores busy while another block's threads work on the weights. Two
// warpgroups in one block, in step at every tile's barrier, took 1.3× (dQ) and 1.1× (dK/dV)
// as long (RESULTS.md, "Kernel design notes"). dQ: 3 blocks per SM (154 registers, 67 KiB of
// shared memory each with WG_DQ_STAGES = 3). dK/dV: 3 blocks per SM (168 registers, 67 KiB
// with WG_DKV_STAGES = 3). Mirrored in ops/attention.rs.
#define WG_BWD_THREADS 128
#define WG_DQ_STAGES 3
#define WG_DKV_STAGES 3
extern "C" __global__ void __launch_bounds__(WG_BWD_THREADS, 3) attn_bwd_dq_wg_64(const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ASMEM;
    attn_bwd_dq_wg<WG_DQ_STAGES, 1>(a, (T*)smem_raw);
#endif
}
extern "C" __global__ void __launch_bounds__(WG_BWD_THREADS, 3) attn_bwd_dkv_wg_64(const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ASMEM;
    attn_bwd_dkv_wg<WG_DKV_STAGES, 1>(a, (T*)smem_raw);
#endif
}
// dk and dv from the `a.split` partial sums of `attn_bwd_dkv_wg_64`: a thread per pair of
// columns of a key row (dk scaled here), in the order of the partial rows.
extern "C" __global__ void attn_bwd_dkv_sum(const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const i64 rows = a.b * a.hk * a.t, pairs = rows * 32;
    for (i64 x = (i64)blockIdx.x * blockDim.x + threadIdx.x; x < pairs; x += (i64)gridDim.x * blockDim.x) {
        const i64 row = x / 32, j = row % a.t, kh = (row / a.t) % a.hk, bi = row / a.t / a.hk;
        const int col = 2 * (int)(x % 32);
        if (col >= a.d) continue;
        float2 sk = {0.f, 0.f}, sv = {0.f, 0.f};
        for (i64 part = 0; part < a.split; ++part) {
            const float* pk = (const float*)a.partial + (part * 2 * rows + row) * 64 + col;
            const float2 xk = *(const float2*)pk, xv = *(const float2*)(pk + rows * 64);
            sk.x += xk.x, sk.y += xk.y, sv.x += xv.x, sv.y += xv.y;
        }
        const float scale = (float)a.scale;
        T* krow = (T*)a.p[7] + head_row(a, 7, bi, kh, j);
        T* vrow = (T*)a.p[8] + head_row(a, 8, bi, kh, j);
        *(u32*)(krow + col) = tc_pack(scale * sk.x, scale * sk.y);
        *(u32*)(vrow + col) = tc_pack(sv.x, sv.y);
    }
#endif
}
#endif

// ---- masked attention (inference) ---------------------------------------------------------
// `MaskedAttention`: query row (b, h, i) keeps the keys `keep[b, i, :]` (slot 4, bool bytes,
// strides (b, s, t)). The keys of a row are split into ranges of `split` keys, a block per
// (row, range), so that a decode step (one query per head) still fills the GPU: a block alone
// on an SM cannot keep enough loads in flight to read its keys fast. With one range the block
// writes the output; with several it writes its sums, max and weight total to `partial`, and
// `attn_masked_combine` merges them. Within a block keys are taken MA_CHUNK at a time with an
// online softmax across chunks. A decode step has one query per row, so the work is latency-bound
// reading keys and values, and the layout is chosen for coalesced loads with many in flight:
// - scores: each warp takes MA_KPW consecutive keys at a time, lanes along the head dim (lane
//   `l` owns dims `l, l+32, ..`, DMAX/32 of them, with the scaled query in registers); the
//   rows are read whether or not a key is kept (the mask only selects), and the MA_KPW dot
//   products are reduced across the warp together;
// - weighted values: MA_KG key groups of 8 threads, each thread owning the dims
//   `dl, dl + 8, ..` (DMAX/8 of them) and its group every MA_KG-th key, unrolled by 4;
//   a weight of 0 selects 0, so the value of a masked (possibly uninitialized) row never
//   reaches the sum.
// The groups' partial outputs are summed with shuffles, then across warps in shared memory.
// Compiled per head-dim bound DMAX (32, 64, 128, 256), so no lane works on absent dims.

#define MA_THREADS 256
#define MA_WARPS (MA_THREADS / 32)
#define MA_CHUNK 1024
#define MA_KPW 8
#define MA_KG (MA_THREADS / 8)

__device__ __forceinline__ C ma_block_max(C x, C* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_max(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    C y = lane < MA_WARPS ? red[lane] : NEG_INF;
    y = warp_max(y);
    __syncthreads();
    return y;
}

__device__ __forceinline__ C ma_block_sum(C x, C* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_sum(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    C y = lane < MA_WARPS ? red[lane] : (C)0;
    y = warp_sum(y);
    __syncthreads();
    return y;
}

template <int DMAX>
__device__ __forceinline__ void attn_masked(const AttnArgs& a) {
    constexpr int MA_NR = DMAX / 32, MA_DPT = DMAX / 8;
    extern __shared__ __align__(16) unsigned char ma_smem[];
    C* sc = (C*)ma_smem;         // a chunk's scores, then its weights
    C* red = sc + MA_CHUNK;      // block reductions, 32
    C* accs = red + 32;          // per-warp partial outputs, MA_WARPS · d
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kg = threadIdx.x >> 3, dl = threadIdx.x & 7;
    const int d = (int)a.d;
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    T* o = (T*)a.p[3];
    const unsigned char* keep = (const unsigned char*)a.p[4];
    const i64 rows = a.b * a.hq * a.s, group = a.hq / a.hk;
    const i64 ks = a.st[1][3], vs = a.st[2][3];
    const i64 splits = a.t > a.split ? (a.t + a.split - 1) / a.split : 1;
    for (i64 work = blockIdx.x; work < rows * splits; work += gridDim.x) {
        const i64 row = work / splits, k_lo = (work % splits) * a.split;
        const i64 k_hi = k_lo + a.split < a.t ? k_lo + a.split : a.t;
        const i64 i = row % a.s, h = (row / a.s) % a.hq, b = row / (a.s * a.hq), kh = h / group;
        const i64 qb = head_row(a, 0, b, h, i);
        const i64 kb = head_row(a, 1, b, kh, 0), vb = head_row(a, 2, b, kh, 0);
        const i64 keepb = b * a.st[4][0] + i * a.st[4][1];
        C qr[MA_NR];
#pragma unroll
        for (int r = 0; r < MA_NR; ++r) {
            const int c = lane + 32 * r;
            qr[r] = c < d ? TT::load(q[qb + c * a.st[0][3]]) * (C)a.scale : (C)0;
        }
        C acc[MA_DPT];
#pragma unroll
        for (int r = 0; r < MA_DPT; ++r) acc[r] = 0;
        C m = NEG_INF, l = 0;
        for (i64 c0 = k_lo; c0 < k_hi; c0 += MA_CHUNK) {
            const int n = (int)((k_hi - c0) < MA_CHUNK ? (k_hi - c0) : MA_CHUNK);
            C mx = NEG_INF;
            for (int j0 = warp * MA_KPW; j0 < n; j0 += MA_WARPS * MA_KPW) {
                C dot[MA_KPW];
#pragma unroll
                for (int u = 0; u < MA_KPW; ++u) {
                    dot[u] = 0;
                    if (j0 + u < n) {
                        const T* kr = k + kb + (c0 + j0 + u) * a.st[1][2];
#pragma unroll
                        for (int r = 0; r < MA_NR; ++r) {
                            const int c = lane + 32 * r;
                            if (c < d) dot[u] += qr[r] * TT::load(kr[c * ks]);
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < MA_KPW; ++u) {
                    const int j = j0 + u;
                    const C total = warp_sum(dot[u]);
                    if (j < n) {
                        const C s = keep[keepb + (c0 + j) * a.st[4][2]] ? total : NEG_INF;
                        if (lane == 0) sc[j] = s;
                        mx = cmax(mx, s);
                    }
                }
            }
            const C mnew = cmax(m, ma_block_max(mx, red));  // its barrier also publishes sc
            if (mnew == NEG_INF) continue;  // no key kept so far (uniform across the block)
            const C corr = cexp(m - mnew);  // 0 while m is still -inf
            C psum = 0;
            for (int j = threadIdx.x; j < n; j += MA_THREADS) {
                const C p = sc[j] == NEG_INF ? (C)0 : cexp(sc[j] - mnew);
                sc[j] = p;
                psum += p;
            }
            l = l * corr + ma_block_sum(psum, red);  // its barrier also publishes the weights
#pragma unroll
            for (int r = 0; r < MA_DPT; ++r) acc[r] *= corr;
#pragma unroll 4
            for (int j = kg; j < n; j += MA_KG) {
                const C p = sc[j];
                const T* vr = v + vb + (c0 + j) * a.st[2][2];
#pragma unroll
                for (int r = 0; r < MA_DPT; ++r) {
                    const int c = dl + 8 * r;
                    if (c < d) {
                        const C w = p * TT::load(vr[c * vs]);
                        acc[r] += p != (C)0 ? w : (C)0;
                    }
                }
            }
            m = mnew;
            __syncthreads();  // sc is rewritten by the next chunk
        }
        // The 4 key groups of a warp (lane bits 3 and 4), then the warps.
#pragma unroll
        for (int r = 0; r < MA_DPT; ++r) {
            acc[r] += __shfl_xor_sync(FULL, acc[r], 8);
            acc[r] += __shfl_xor_sync(FULL, acc[r], 16);
            const int c = dl + 8 * r;
            if (lane < 8 && c < d) accs[warp * d + c] = acc[r];
        }
        __syncthreads();
        const i64 ob = head_row(a, 3, b, h, i);
        C* part = (C*)a.partial + work * (d + 2);
        for (int c = threadIdx.x; c < d; c += MA_THREADS) {
            C x = 0;
            for (int w = 0; w < MA_WARPS; ++w) x += accs[w * d + c];
            if (splits == 1) {
                o[ob + c * a.st[3][3]] = TT::store(x / l);  // no kept key: 0 / 0 = NaN
            } else {
                part[c] = x;
            }
        }
        if (splits > 1 && threadIdx.x == 0) {
            part[d] = m;
            part[d + 1] = l;
        }
        __syncthreads();  // accs is reused by the next row
    }
}

#define ATTN_MASKED(DMAX)                                                                          \
    extern "C" __global__ void __launch_bounds__(MA_THREADS) attn_masked_##DMAX(const AttnArgs a) { \
        attn_masked<DMAX>(a);                                                                      \
    }
ATTN_MASKED(32)
ATTN_MASKED(64)
ATTN_MASKED(128)
ATTN_MASKED(256)

// The splits of each row merged: weights rescaled to the row's largest max. A row's partials
// are first read into shared memory by the whole block at once (a thread walking them in
// global memory would wait one load latency per split, and a decode step has 24), and each
// split's scale is computed once, so a thread's sums are multiply-adds from shared memory.
extern "C" __global__ void attn_masked_combine(const AttnArgs a) {
    extern __shared__ __align__(16) unsigned char mc_smem[];
    const int d = (int)a.d;
    const i64 rows = a.b * a.hq * a.s, splits = (a.t + a.split - 1) / a.split, n = splits * (d + 2);
    C* parts = (C*)mc_smem;  // splits · (d + 2): each split's sums, then its max and total
    C* scale = parts + n;    // splits: exp(split max - row max), 0 for a split with no kept key
    T* o = (T*)a.p[3];
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const C* pr = (const C*)a.partial + row * n;
        for (i64 e = threadIdx.x; e < n; e += blockDim.x) parts[e] = pr[e];
        __syncthreads();
        C mx = NEG_INF;
        for (i64 sp = 0; sp < splits; ++sp) mx = cmax(mx, parts[sp * (d + 2) + d]);
        for (i64 sp = threadIdx.x; sp < splits; sp += blockDim.x) {
            const C ms = parts[sp * (d + 2) + d];
            scale[sp] = ms != NEG_INF ? cexp(ms - mx) : (C)0;
        }
        __syncthreads();
        C l = 0;
        for (i64 sp = 0; sp < splits; ++sp) l += parts[sp * (d + 2) + d + 1] * scale[sp];
        const i64 i = row % a.s, h = (row / a.s) % a.hq, b = row / (a.s * a.hq);
        const i64 ob = head_row(a, 3, b, h, i);
        for (int c = threadIdx.x; c < d; c += blockDim.x) {
            C x = 0;
            for (i64 sp = 0; sp < splits; ++sp) x += parts[sp * (d + 2) + c] * scale[sp];
            o[ob + c * a.st[3][3]] = TT::store(x / l);  // no kept key in any split: NaN
        }
        __syncthreads();  // parts and scale are refilled for the next row
    }
}

// ---- masked attention, one query per row, the query heads of a key head together (decode) --
// `MaskedAttention` with s = 1, as a decode step has: a block takes one (batch, key head) and a
// range of `split` keys for all `group` query heads that share that key head, so each key and
// value row is read once for the group rather than once per query head. Keys are taken KPP at
// a time: a key row is LPK lanes, each holding NPK 16-byte packs of the head dim, so a warp
// reads KPW whole rows per load and a lane keeps the group's query values for its packs in
// registers. A pass loads its keys and values together (the values do not wait on the
// scores), writes the group's scores to shared memory, and warp g turns head g's scores into
// weights with an online softmax across passes. With several ranges the partial outputs go to
// `partial` as `attn_masked` writes them (row = (b, h)), and the last block of a (batch, key
// head) to finish merges them as `attn_masked_combine` does (same arithmetic, same order): a
// decode step then needs no second launch. The blocks count themselves in `md_count`, which
// that last block sets back to zero for the next launch (one stream per device, so launches
// never overlap).
// Taken when the head dim is D (64 or 128), the key and value rows are dense and 16-byte
// aligned, and group <= MD_GMAX; other shapes take `attn_masked`. Dynamic shared memory: the
// warps' partial outputs, MD_WARPS · group · D values of type C.

#define MD_THREADS 256
#define MD_WARPS (MD_THREADS / 32)
#define MD_GMAX 8
// (batch, key head) pairs the counters cover (MD_COUNTERS in ops/attention.rs; more pairs
// take `attn_masked`).
#define MD_COUNTERS 4096
__device__ unsigned int md_count[MD_COUNTERS];

// Warp `g` of the last block merges the ranges of query head g (row = b·hq + h) and writes
// its output, as `attn_masked_combine` (same arithmetic, same order). The partials come from
// other SMs: read past L1. Lane i holds the maximum and total of range i of each 32, so a
// range's scale is computed once and passed along by shuffle, and the loop over ranges
// issues only the independent loads of the partial sums, several ranges in flight at once.
template <int D>
__device__ __forceinline__ void md_merge(const AttnArgs& a, i64 b, i64 h, i64 splits) {
    const int lane = threadIdx.x & 31;
    const C* pr = (const C*)a.partial + (b * a.hq + h) * splits * (D + 2);
    C own_m = lane < splits ? __ldcg(pr + lane * (D + 2) + D) : NEG_INF;
    C own_l = lane < splits ? __ldcg(pr + lane * (D + 2) + D + 1) : (C)0;
    C mx = own_m;
    for (i64 sp = lane + 32; sp < splits; sp += 32) mx = cmax(mx, __ldcg(pr + sp * (D + 2) + D));
    mx = warp_max(mx);
    C l = 0, x[D / 32];
#pragma unroll
    for (int u = 0; u < D / 32; ++u) x[u] = 0;
    for (i64 base = 0; base < splits; base += 32) {
        if (base > 0) {
            const i64 sp = base + lane;
            own_m = sp < splits ? __ldcg(pr + sp * (D + 2) + D) : NEG_INF;
            own_l = sp < splits ? __ldcg(pr + sp * (D + 2) + D + 1) : (C)0;
        }
        const C own_scale = own_m != NEG_INF ? cexp(own_m - mx) : (C)0;
        const int count = splits - base < 32 ? (int)(splits - base) : 32;
        const C* chunk = pr + base * (D + 2);
#pragma unroll 16
        for (int i = 0; i < count; ++i) {
            const C scale = __shfl_sync(FULL, own_scale, i);
            l += __shfl_sync(FULL, own_l, i) * scale;
#pragma unroll
            for (int u = 0; u < D / 32; ++u) x[u] += __ldcg(chunk + i * (D + 2) + u * 32 + lane) * scale;
        }
    }
    T* o = (T*)a.p[3] + head_row(a, 3, b, h, 0);
#pragma unroll
    for (int u = 0; u < D / 32; ++u) o[(u * 32 + lane) * a.st[3][3]] = TT::store(x[u] / l);  // no kept key: NaN
}

template <int D>
__device__ __forceinline__ void attn_decode(const AttnArgs& a) {
    constexpr int EV = 16 / (int)sizeof(T);              // elements per pack
    constexpr int LPK = D / EV < 32 ? D / EV : 32;       // lanes per key row
    constexpr int NPK = D / (LPK * EV);                  // packs per lane
    constexpr int KPW = 32 / LPK;                        // key rows per warp per pass
    constexpr int KPP = KPW * MD_WARPS;                  // key rows per pass
    typedef Pack<T, EV> PK;
    extern __shared__ __align__(16) unsigned char md_smem[];
    C* accs = (C*)md_smem;                               // [warp][g][D]
    __shared__ C sc[MD_GMAX][KPP];                       // a pass's scores, then its weights
    __shared__ C st_m[MD_GMAX], st_l[MD_GMAX], st_corr[MD_GMAX];
    __shared__ bool last;  // this block is the last of its (batch, key head) to finish
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = warp * KPW + lane / LPK, dp = lane % LPK;
    const int group = (int)(a.hq / a.hk);
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    T* o = (T*)a.p[3];
    const unsigned char* keep = (const unsigned char*)a.p[4];
    const i64 splits = (a.t + a.split - 1) / a.split;
    for (i64 work = blockIdx.x; work < a.b * a.hk * splits; work += gridDim.x) {
        const i64 bk = work / splits, sp = work % splits, b = bk / a.hk, kh = bk % a.hk;
        const i64 k_lo = sp * a.split, k_hi = k_lo + a.split < a.t ? k_lo + a.split : a.t;
        C qv[MD_GMAX][NPK * EV], acc[MD_GMAX][NPK * EV];
#pragma unroll
        for (int g = 0; g < MD_GMAX; ++g) {
            const T* qh = q + b * a.st[0][0] + (kh * group + g) * a.st[0][1];
#pragma unroll
            for (int u = 0; u < NPK; ++u) {
#pragma unroll
                for (int e = 0; e < EV; ++e) {
                    const i64 c = (u * LPK + dp) * EV + e;
                    qv[g][u * EV + e] = g < group ? TT::load(qh[c * a.st[0][3]]) * (C)a.scale : (C)0;
                    acc[g][u * EV + e] = 0;
                }
            }
        }
        if (threadIdx.x < MD_GMAX) {
            st_m[threadIdx.x] = NEG_INF;
            st_l[threadIdx.x] = 0;
        }
        const T* kb = k + head_row(a, 1, b, kh, 0) + dp * EV;
        const T* vb = v + head_row(a, 2, b, kh, 0) + dp * EV;
        const unsigned char* keepb = keep + b * a.st[4][0];
        for (i64 c0 = k_lo; c0 < k_hi; c0 += KPP) {
            const i64 j = c0 + slot;
            const bool in = j < k_hi;
            PK kp[NPK], vp[NPK];
            if (in) {
#pragma unroll
                for (int u = 0; u < NPK; ++u) {
                    kp[u] = *(const PK*)(kb + j * a.st[1][2] + u * LPK * EV);
                    vp[u] = *(const PK*)(vb + j * a.st[2][2] + u * LPK * EV);
                }
            }
            const bool kept = in && keepb[j * a.st[4][2]];
#pragma unroll
            for (int g = 0; g < MD_GMAX; ++g) {
                C dot = 0;
                if (in) {
#pragma unroll
                    for (int u = 0; u < NPK; ++u) {
#pragma unroll
                        for (int e = 0; e < EV; ++e) dot += qv[g][u * EV + e] * TT::load(kp[u].v[e]);
                    }
                }
#pragma unroll
                for (int off = 1; off < LPK; off <<= 1) dot += __shfl_xor_sync(FULL, dot, off);
                if (dp == 0 && g < group) sc[g][slot] = kept ? dot : NEG_INF;
            }
            __syncthreads();
            if (warp < group) {  // warp g: head g's weights for this pass
                const C x = lane < KPP ? sc[warp][lane] : NEG_INF;
                const C m_old = st_m[warp], m_new = cmax(m_old, warp_max(x));
                const C p = x == NEG_INF ? (C)0 : cexp(x - m_new);
                const C sum = warp_sum(p);
                if (lane < KPP) sc[warp][lane] = p;
                if (lane == 0) {
                    // Rescales what earlier passes summed: 0 while m_old is -inf, 1 while
                    // nothing is kept at all.
                    const C corr = m_new == NEG_INF ? (C)1 : cexp(m_old - m_new);
                    st_corr[warp] = corr;
                    st_l[warp] = st_l[warp] * corr + sum;
                    st_m[warp] = m_new;
                }
            }
            __syncthreads();
#pragma unroll
            for (int g = 0; g < MD_GMAX; ++g) {
                if (g < group) {
                    const C corr = st_corr[g], p = in ? sc[g][slot] : (C)0;
#pragma unroll
                    for (int u = 0; u < NPK; ++u) {
#pragma unroll
                        for (int e = 0; e < EV; ++e) {
                            // A weight of 0 selects 0: a masked row's values may be anything.
                            const C w = p != (C)0 ? p * TT::load(vp[u].v[e]) : (C)0;
                            acc[g][u * EV + e] = acc[g][u * EV + e] * corr + w;
                        }
                    }
                }
            }
            __syncthreads();  // sc and st_corr are rewritten by the next pass
        }
        // The key slots of a warp (lanes with the same packs), then the warps.
#pragma unroll
        for (int g = 0; g < MD_GMAX; ++g) {
#pragma unroll
            for (int u = 0; u < NPK; ++u) {
#pragma unroll
                for (int e = 0; e < EV; ++e) {
                    C x = acc[g][u * EV + e];
#pragma unroll
                    for (int off = LPK; off < 32; off <<= 1) x += __shfl_xor_sync(FULL, x, off);
                    if (lane < LPK && g < group) accs[(warp * group + g) * D + (u * LPK + dp) * EV + e] = x;
                }
            }
        }
        __syncthreads();
        for (int t = threadIdx.x; t < group * D; t += MD_THREADS) {
            const int g = t / D, c = t % D;
            C x = 0;
            for (int w = 0; w < MD_WARPS; ++w) x += accs[(w * group + g) * D + c];
            const i64 h = kh * group + g, row = b * a.hq + h;
            if (splits == 1) {
                o[head_row(a, 3, b, h, 0) + c * a.st[3][3]] = TT::store(x / st_l[g]);  // no kept key: NaN
            } else {
                C* part = (C*)a.partial + (row * splits + sp) * (D + 2);
                part[c] = x;
                if (c == 0) {
                    part[D] = st_m[g];
                    part[D + 1] = st_l[g];
                }
            }
        }
        if (splits > 1) {
            // Every thread's partials visible device-wide before the block counts itself.
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) {
                last = atomicAdd(&md_count[bk], 1u) == (unsigned int)(splits - 1);
                if (last) md_count[bk] = 0;
            }
            __syncthreads();
            if (last && warp < group) md_merge<D>(a, b, kh * group + warp, splits);
        }
        __syncthreads();  // accs and the softmax state are reused by the next work item
    }
}

#define ATTN_DECODE(D)                                                                             \
    extern "C" __global__ void __launch_bounds__(MD_THREADS) attn_decode_##D(const AttnArgs a) {   \
        wait_previous(); /* launched early: nothing to warm */                                     \
        start_next();                                                                              \
        attn_decode<D>(a);                                                                         \
    }
ATTN_DECODE(64)
ATTN_DECODE(128)
