// Layer norm and RMS norm over the last dim, forward and backward, for float type T; and RMS
// norm after a residual addition (add_rms_norm: sum = x + residual rounded to T, then the RMS
// norm of sum), which saves a decoder layer a pass over its residual stream.
//
// Work split: a group of G threads (a power of two, 32..MAXG) owns one row at a time; a block
// holds blockDim/G groups and strides over the rows. Each thread keeps its share of the row
// (at most NE elements) in registers, so the forward reads x once: the mean, the variance
// (two-pass, from the registered values) and the output all come from registers. Rows longer
// than NE*MAXG elements take the "big" path (mode 2), which re-reads the row from memory
// for each pass. Dense rows have their own paths (mode 3): norm_fwd_vec (raw packs in
// registers, one multiply per row offset) and, on sm_80+, norm_bwd_pipe (x and dy staged in
// shared memory with cp.async).
//
// Statistics and accumulations are in the compute type C (f32 for f32/f16/bf16, f64 for f64),
// as the CPU reference computes them; mean and rstd are stored as f32.
//
// Weight gradients are deterministic: the backward kernel has each group add its rows'
// contributions for the columns its threads own in registers, and writes one partial row per
// group into a scratch buffer; `norm_colsum` then sums the partial rows of each column in a
// fixed order. No float atomics anywhere.

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

// Elements per 16-byte pack, and registered elements per thread (f64 keeps fewer: its values
// take two registers each).
#define NV (16 / (int)sizeof(T))
#define NE ((int)sizeof(T) == 8 ? 8 : 16)
#define NK (NE / NV)

// Operand slots of `RowArgs::p`.
#define S_X 0     // x
#define S_Y 1     // y (forward) or dx (backward)
#define S_MEAN 2  // mean (f32)
#define S_RSTD 3  // rstd (f32)
#define S_W 4     // weight
#define S_B 5     // bias
#define S_DY 6    // dy
#define S_PART 7  // backward partial sums, dense [parts][nout][d] of C
// add_rms_norm's forward takes two slots only the backward otherwise uses.
#define S_RES S_DY   // residual
#define S_SUM S_PART // sum = x + residual
// rms_norm_backward's optional dsum (interface 1.11), in the slot only layer norm's mean uses;
// flag bit NORM_DSUM says it is there: dx = round(dx) + dsum, rounded again (as `add` stores).
#define S_DSUM S_MEAN
#define NORM_DSUM 4
// The mixed form's optional dx_half (interface 1.13: dx rounded to T, the half-precision
// residual's gradient), in the slot only layer norm's bias uses; flag bit NORM_DXH says it is there.
#define S_DXH S_B
#define NORM_DXH 8

// Mirror of `RowArgs` in ops/norm.rs (a test compares the two layouts).
struct RowArgs {
    char* p[8];          // operand addresses (element zero), by slot
    i64 rows;            // rows (product of the leading dims)
    i64 d;               // row length
    double eps;          // added to the variance / mean square
    int flag;            // bits 0-1, the mode: 0 registers, 1 registers in packs (see
                         // ops/norm.rs), 2 big rows, 3 the fast paths (norm_fwd_vec,
                         // norm_bwd_pipe); bit 2 NORM_DSUM, bit 3 NORM_DXH
    int ndim;            // merged leading dims
    int group;           // threads per row
    int parts;           // backward: partial rows (= groups in the grid); colsum: outputs
    i64 shape[MAXD];     // merged leading shape
    i64 st[8][MAXD];     // strides of each slot over the leading dims (0 for unused slots)
    i64 cs[8];           // stride of each slot along the row
};

// Element offsets of row `row` for every slot; whether the row exists. A row past the end,
// which still joins its group's barriers, gets row 0's offsets.
__device__ __forceinline__ bool row_offsets(const RowArgs& a, i64 row, i64* off) {
    const bool active = row < a.rows;
#pragma unroll
    for (int s = 0; s < 8; ++s) off[s] = 0;
    u64 r = (u64)(active ? row : 0);
    for (int dd = a.ndim - 1; dd >= 0; --dd) {
        u64 sz = (u64)a.shape[dd];
        u64 q = r / sz;
        i64 c = (i64)(r - q * sz);
        r = q;
#pragma unroll
        for (int s = 0; s < 8; ++s) off[s] += c * a.st[s][dd];
    }
    return active;
}

// The column of register slot (k, i) of thread t. Vectorized: thread t holds packs k*G + t;
// otherwise element (k*NV + i)*G + t (consecutive threads read consecutive elements either way).
__device__ __forceinline__ i64 col_of(bool vec, int G, int t, int k, int i) {
    return vec ? (i64)(k * G + t) * NV + i : (i64)(k * NV + i) * G + t;
}

// Load this thread's share of a row (zeros past its end), of element type U: T, or f32 for
// the stream operands of a mixed-precision kernel. Packs hold NV elements whatever U is (T's
// 16 bytes; 32 of f32, which ops/norm.rs aligns for), so every operand has the same layout.
template <class U = T>
__device__ __forceinline__ void load_row(const RowArgs& a, int slot, i64 off, bool vec, int G, int t, C* r) {
    const U* base = (const U*)a.p[slot] + off;
    if (vec) {
#pragma unroll
        for (int k = 0; k < NK; ++k) {
            i64 c = (i64)(k * G + t) * NV;
            if (c < a.d) {
                Pack<U, NV> pk = *(const Pack<U, NV>*)(base + c);
#pragma unroll
                for (int i = 0; i < NV; ++i) r[k * NV + i] = Ty<U>::load(pk.v[i]);
            } else {
#pragma unroll
                for (int i = 0; i < NV; ++i) r[k * NV + i] = (C)0;
            }
        }
    } else {
        i64 cs = a.cs[slot];
#pragma unroll
        for (int k = 0; k < NK; ++k)
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                i64 c = col_of(false, G, t, k, i);
                r[k * NV + i] = c < a.d ? Ty<U>::load(base[c * cs]) : (C)0;
            }
    }
}

// Store this thread's share of a row, of element type U (as `load_row`).
template <class U = T>
__device__ __forceinline__ void store_row(const RowArgs& a, int slot, i64 off, bool vec, int G, int t, const C* r) {
    U* base = (U*)a.p[slot] + off;
    if (vec) {
#pragma unroll
        for (int k = 0; k < NK; ++k) {
            i64 c = (i64)(k * G + t) * NV;
            if (c < a.d) {
                Pack<U, NV> pk;
#pragma unroll
                for (int i = 0; i < NV; ++i) pk.v[i] = Ty<U>::store(r[k * NV + i]);
                *(Pack<U, NV>*)(base + c) = pk;
            }
        }
    } else {
        i64 cs = a.cs[slot];
#pragma unroll
        for (int k = 0; k < NK; ++k)
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                i64 c = col_of(false, G, t, k, i);
                if (c < a.d) base[c * cs] = Ty<U>::store(r[k * NV + i]);
            }
    }
}

// r += dsum over this thread's share of a row, each r rounded to U (dx's type) first: the
// backward's dx plus the gradient that reaches the norm's input directly (flag bit NORM_DSUM).
template <class U = T> __device__ __forceinline__ void add_dsum_row(const RowArgs& a, i64 off, bool vec, int G, int t, C* r) {
    typedef Ty<U> UT;
    const U* base = (const U*)a.p[S_DSUM] + off;
#pragma unroll
    for (int k = 0; k < NK; ++k) {
        if (vec) {
            const i64 c = (i64)(k * G + t) * NV;
            if (c < a.d) {
                const Pack<U, NV> pk = *(const Pack<U, NV>*)(base + c);
#pragma unroll
                for (int i = 0; i < NV; ++i) r[k * NV + i] = UT::load(UT::store(r[k * NV + i])) + UT::load(pk.v[i]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                const i64 c = col_of(false, G, t, k, i);
                if (c < a.d) r[k * NV + i] = UT::load(UT::store(r[k * NV + i])) + UT::load(base[c * a.cs[S_DSUM]]);
            }
        }
    }
}

// Sum of v over the G threads of this thread's group (G uniform over the block, so the
// barrier is reached by every thread). Warps combine by shuffles, then the group's warps in a
// fixed order, so the result does not depend on timing. `red` holds two buffers used in
// turn (`phase` flips on each call): a thread that reaches the barrier of one sum has
// finished reading the buffer of the sum before, so one barrier per sum suffices.
__device__ __forceinline__ C group_sum(C v, int G, C (*red)[32], int& phase) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (G <= 32) return v;
    int warp = threadIdx.x >> 5;
    C* buf = red[phase];
    phase ^= 1;
    if ((threadIdx.x & 31) == 0) buf[warp] = v;
    __syncthreads();
    int wpg = G >> 5, first = (warp / wpg) * wpg;
    C s = (C)0;
    for (int w = 0; w < wpg; ++w) s += buf[first + w];
    return s;
}

template <class U = T> __device__ __forceinline__ C load_el(const RowArgs& a, int slot, i64 off, i64 c) {
    return Ty<U>::load(((const U*)a.p[slot])[off + c * a.cs[slot]]);
}

// The type of a norm's stream operands (x, the sum, the weight, dx and dsum): T, or f32 in the
// mixed-precision kernels (interface 1.12), whose residual, y and dy stay in T (f16 / bf16).
template <bool MIXED> struct Stream { typedef T type; };
template <> struct Stream<true> { typedef float type; };

// Groups and blocks are at most MAXG threads (ops/norm.rs keeps to it); the bound lets the
// compiler budget registers for it (a 1024-thread block would not fit the register file).
#define MAXG 512

// ---- forward -------------------------------------------------------------------------------

// LN: y = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), biased variance.
// RMS: y = x * rstd * w, rstd = 1/sqrt(mean(x²) + eps).
// An empty row (d = 0) gives 0/0 = NaN statistics, as PyTorch and the CPU reference do.
// MODE (flag bits): 0 registers, element by element; 1 registers, packs; 2 big rows. A
// compile-time MODE keeps each path's register demand apart. ADD (RMS only): x is first
// replaced by sum = x + residual, rounded to T and stored. MIXED (with ADD): x, the sum and
// the weight are f32, the residual and y T.
template <bool LN, int MODE, bool ADD = false, bool MIXED = false> __device__ void norm_fwd(const RowArgs& a) {
    typedef typename Stream<MIXED>::type X;
    static_assert(!MIXED || ADD, "the mixed form is add_rms_norm's");
    __shared__ C red[2][32];
    int phase = 0;
    const int G = a.group, t = threadIdx.x % G, rpb = blockDim.x / G;
    const i64 row0 = (i64)(threadIdx.x / G);
    constexpr bool vec = MODE == 1, big = MODE == 2;
    const i64 d = a.d;
    const C n = (C)d, eps = (C)a.eps;
    // w and b are re-read for each row (from L1/L2) rather than held: registers decide how
    // many rows are in flight per SM, which is what this memory-bound kernel needs.
    C x[NE];
    for (i64 base = (i64)blockIdx.x * rpb; base < a.rows; base += (i64)gridDim.x * rpb) {
        const i64 row = base + row0;
        i64 off[8];
        const bool active = row_offsets(a, row, off);
        C mu = (C)0, q = (C)0;
        // The row's source: x, or the sum once ADD has stored it (each thread re-reads only
        // the columns it wrote itself).
        const int src = ADD ? S_SUM : S_X;
        if (!big) {
            if (active) {
                load_row<X>(a, S_X, off[S_X], vec, G, t, x);
                if (ADD) {
                    C r[NE];
                    load_row(a, S_RES, off[S_RES], vec, G, t, r);
#pragma unroll
                    for (int e = 0; e < NE; ++e) x[e] = Ty<X>::load(Ty<X>::store(x[e] + r[e]));
                    store_row<X>(a, S_SUM, off[S_SUM], vec, G, t, x);
                }
            } else
#pragma unroll
                for (int e = 0; e < NE; ++e) x[e] = (C)0;
            if (LN) {
                C s = (C)0;
#pragma unroll
                for (int e = 0; e < NE; ++e) s += x[e];
                mu = group_sum(s, G, red, phase) / n;
            }
#pragma unroll
            for (int k = 0; k < NK; ++k)
#pragma unroll
                for (int i = 0; i < NV; ++i) {
                    C c = x[k * NV + i] - mu;
                    if (col_of(vec, G, t, k, i) < d) q += c * c;
                }
        } else {
            if (ADD && active) {
                X* sum = (X*)a.p[S_SUM] + off[S_SUM];
                for (i64 c = t; c < d; c += G)
                    sum[c * a.cs[S_SUM]] =
                        Ty<X>::store(load_el<X>(a, S_X, off[S_X], c) + load_el(a, S_RES, off[S_RES], c));
            }
            if (LN) {
                C s = (C)0;
                if (active)
                    for (i64 c = t; c < d; c += G) s += load_el<X>(a, src, off[src], c);
                mu = group_sum(s, G, red, phase) / n;
            }
            if (active)
                for (i64 c = t; c < d; c += G) {
                    C v = load_el<X>(a, src, off[src], c) - mu;
                    q += v * v;
                }
        }
        const C r = (C)1 / csqrt(group_sum(q, G, red, phase) / n + eps);
        if (!active) continue;
        if (!big) {
            C w[NE];
            load_row<X>(a, S_W, 0, vec, G, t, w);
            if (LN) {
                C b[NE];
                load_row<X>(a, S_B, 0, vec, G, t, b);
#pragma unroll
                for (int e = 0; e < NE; ++e) x[e] = (x[e] - mu) * r * w[e] + b[e];
            } else {
#pragma unroll
                for (int e = 0; e < NE; ++e) x[e] = x[e] * r * w[e];
            }
            store_row(a, S_Y, off[S_Y], vec, G, t, x);
        } else {
            T* y = (T*)a.p[S_Y] + off[S_Y];
            for (i64 c = t; c < d; c += G) {
                C v = load_el<X>(a, src, off[src], c), wv = load_el<X>(a, S_W, 0, c);
                C o = LN ? (v - mu) * r * wv + load_el<X>(a, S_B, 0, c) : v * r * wv;
                y[c * a.cs[S_Y]] = TT::store(o);
            }
        }
        if (t == 0) {
            if (LN) ((float*)a.p[S_MEAN])[off[S_MEAN]] = (float)mu;
            ((float*)a.p[S_RSTD])[off[S_RSTD]] = (float)r;
        }
    }
}

// The forward's fast path (mode 3: mode 1's layout, every row and parameter dense along the
// row, 16-byte aligned, d a multiple of NV; and the leading dims merged into one, ndim <= 1,
// so a row's offsets are one multiply each rather than the general loop of 64-bit
// divisions). Each thread holds PK packs of x as loaded (raw T, so a bf16
// row takes half the registers of its f32 values) and converts on each use; fewer registers
// per row means more rows in flight per SM, which is what this memory-bound kernel lacks.
// Thread t of a group holds packs k*G + t, so a warp's loads are contiguous.
template <bool LN, int PK, bool ADD = false> __device__ void norm_fwd_vec(const RowArgs& a) {
    __shared__ C red[2][32];
    int phase = 0;
    const int G = a.group, t = threadIdx.x % G, rpb = blockDim.x / G;
    const i64 row0 = (i64)(threadIdx.x / G);
    // Packs per row: at most MAXG * PK (ops/norm.rs sends longer rows to mode 2), so int.
    const int np = (int)(a.d / NV);
    const C n = (C)a.d, eps = (C)a.eps;
    typedef Pack<T, NV> P;
    P raw[PK];
    for (i64 base = (i64)blockIdx.x * rpb; base < a.rows; base += (i64)gridDim.x * rpb) {
        const i64 row = base + row0;
        const bool active = row < a.rows;
        const P* xp = (const P*)((const T*)a.p[S_X] + (active ? row : 0) * a.st[S_X][0]);
        // Packs past the row's end (or of a row past the last) are zeros and are skipped by
        // the variance sum, which is the only sum they would change.
#pragma unroll
        for (int k = 0; k < PK; ++k) {
            const int pk = k * G + t;
            if (active && pk < np) raw[k] = xp[pk];
            else raw[k] = P{};
        }
        if (ADD && active) {
            const P* rp = (const P*)((const T*)a.p[S_RES] + row * a.st[S_RES][0]);
            P* sp = (P*)((T*)a.p[S_SUM] + row * a.st[S_SUM][0]);
#pragma unroll
            for (int k = 0; k < PK; ++k) {
                const int pk = k * G + t;
                if (pk < np) {
                    const P r = rp[pk];
#pragma unroll
                    for (int i = 0; i < NV; ++i) raw[k].v[i] = TT::store(TT::load(raw[k].v[i]) + TT::load(r.v[i]));
                    sp[pk] = raw[k];
                }
            }
        }
        C mu = (C)0;
        if (LN) {
            C s = (C)0;
#pragma unroll
            for (int k = 0; k < PK; ++k)
#pragma unroll
                for (int i = 0; i < NV; ++i) s += TT::load(raw[k].v[i]);
            mu = group_sum(s, G, red, phase) / n;
        }
        C q = (C)0;
#pragma unroll
        for (int k = 0; k < PK; ++k) {
            if (k * G + t < np) {
#pragma unroll
                for (int i = 0; i < NV; ++i) {
                    const C c = TT::load(raw[k].v[i]) - mu;
                    q += c * c;
                }
            }
        }
        const C r = (C)1 / csqrt(group_sum(q, G, red, phase) / n + eps);
        if (!active) continue;
        // w and b are re-read for each row (L1 hits) rather than held: registers decide how
        // many rows are in flight per SM.
        const P* wp = (const P*)a.p[S_W];
        const P* bp = (const P*)a.p[S_B];
        P* yp = (P*)((T*)a.p[S_Y] + row * a.st[S_Y][0]);
#pragma unroll
        for (int k = 0; k < PK; ++k) {
            const int pk = k * G + t;
            if (pk < np) {
                const P w = wp[pk];
                P o;
                if (LN) {
                    const P b = bp[pk];
#pragma unroll
                    for (int i = 0; i < NV; ++i)
                        o.v[i] = TT::store((TT::load(raw[k].v[i]) - mu) * r * TT::load(w.v[i]) + TT::load(b.v[i]));
                } else {
#pragma unroll
                    for (int i = 0; i < NV; ++i) o.v[i] = TT::store(TT::load(raw[k].v[i]) * r * TT::load(w.v[i]));
                }
                yp[pk] = o;
            }
        }
        if (t == 0) {
            if (LN) ((float*)a.p[S_MEAN])[row * a.st[S_MEAN][0]] = (float)mu;
            ((float*)a.p[S_RSTD])[row * a.st[S_RSTD][0]] = (float)r;
        }
    }
}

// ---- backward ------------------------------------------------------------------------------

// With g = dy * w and xhat = (x - mean) * rstd (mean = 0 for RMS):
//   LN:  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), dw += dy * xhat, db += dy
//   RMS: dx = rstd * (g - xhat * mean(g * xhat)),           dw += dy * xhat
// Group p (of `parts`, numbered blockIdx.x * rpb + group) writes its column sums to partial
// row p; `norm_colsum` adds the partial rows.
// MIXED (RMS): dy is T, x, the weight, dsum and dx f32; with flag bit NORM_DXH dx is also
// stored rounded to T (dx_half).
template <bool LN, int MODE, bool MIXED = false> __device__ void norm_bwd(const RowArgs& a) {
    typedef typename Stream<MIXED>::type X;
    static_assert(!MIXED || !LN, "the mixed form is rms_norm_backward's");
    __shared__ C red[2][32];
    int phase = 0;
    const int G = a.group, t = threadIdx.x % G, rpb = blockDim.x / G;
    const i64 row0 = (i64)(threadIdx.x / G);
    constexpr bool vec = MODE == 1, big = MODE == 2;
    const i64 d = a.d;
    const int nout = LN ? 2 : 1;
    const C n = (C)d;
    C* part = (C*)a.p[S_PART] + ((i64)blockIdx.x * rpb + row0) * nout * d;
    C w[NE], x[NE], dy[NE], gw[NE], gb[NE];
#pragma unroll
    for (int e = 0; e < NE; ++e) gw[e] = gb[e] = (C)0;
    if (!big) {
        load_row<X>(a, S_W, 0, vec, G, t, w);
    } else {
        // Big rows keep their column sums in the partial row itself (this thread owns the
        // same columns on every row, so no other thread touches them).
        for (i64 c = t; c < d; c += G) {
            part[c] = (C)0;
            if (LN) part[d + c] = (C)0;
        }
    }
    for (i64 base = (i64)blockIdx.x * rpb; base < a.rows; base += (i64)gridDim.x * rpb) {
        const i64 row = base + row0;
        i64 off[8];
        const bool active = row_offsets(a, row, off);
        C mu = (C)0, r = (C)0;
        if (active) {
            if (LN) mu = (C)((const float*)a.p[S_MEAN])[off[S_MEAN]];
            r = (C)((const float*)a.p[S_RSTD])[off[S_RSTD]];
        }
        C sg = (C)0, sgx = (C)0;
        if (!big) {
            if (active) {
                load_row<X>(a, S_X, off[S_X], vec, G, t, x);
                load_row(a, S_DY, off[S_DY], vec, G, t, dy);
            } else {
#pragma unroll
                for (int e = 0; e < NE; ++e) x[e] = dy[e] = (C)0;
            }
            // Past the row's end dy = w = 0 and xhat is set to 0 (not -mean*rstd, which
            // could be inf and turn 0 terms into NaN), so those slots add nothing.
#pragma unroll
            for (int k = 0; k < NK; ++k)
#pragma unroll
                for (int i = 0; i < NV; ++i) {
                    const int e = k * NV + i;
                    x[e] = col_of(vec, G, t, k, i) < d ? (x[e] - mu) * r : (C)0;  // xhat, in place
                    C g = dy[e] * w[e];
                    sg += g;
                    sgx += g * x[e];
                    gw[e] += dy[e] * x[e];
                    gb[e] += dy[e];
                }
        } else if (active) {
            for (i64 c = t; c < d; c += G) {
                C xh = (load_el<X>(a, S_X, off[S_X], c) - mu) * r, dv = load_el(a, S_DY, off[S_DY], c);
                C g = dv * load_el<X>(a, S_W, 0, c);
                sg += g;
                sgx += g * xh;
                part[c] += dv * xh;
                if (LN) part[d + c] += dv;
            }
        }
        const C mean_g = LN ? group_sum(sg, G, red, phase) / n : (C)0;
        const C mean_gx = group_sum(sgx, G, red, phase) / n;
        if (!active) continue;
        if (!big) {
#pragma unroll
            for (int e = 0; e < NE; ++e) dy[e] = r * (dy[e] * w[e] - mean_g - x[e] * mean_gx);
            if (a.flag & NORM_DSUM) add_dsum_row<X>(a, off[S_DSUM], vec, G, t, dy);
            store_row<X>(a, S_Y, off[S_Y], vec, G, t, dy);
            if (MIXED && (a.flag & NORM_DXH)) store_row(a, S_DXH, off[S_DXH], vec, G, t, dy);
        } else {
            X* dx = (X*)a.p[S_Y] + off[S_Y];
            for (i64 c = t; c < d; c += G) {
                C xh = (load_el<X>(a, S_X, off[S_X], c) - mu) * r;
                C g = load_el(a, S_DY, off[S_DY], c) * load_el<X>(a, S_W, 0, c);
                C v = r * (g - mean_g - xh * mean_gx);
                if (a.flag & NORM_DSUM) v = Ty<X>::load(Ty<X>::store(v)) + load_el<X>(a, S_DSUM, off[S_DSUM], c);
                dx[c * a.cs[S_Y]] = Ty<X>::store(v);
                if (MIXED && (a.flag & NORM_DXH)) ((T*)a.p[S_DXH] + off[S_DXH])[c * a.cs[S_DXH]] = TT::store(v);
            }
        }
    }
    if (!big) {
#pragma unroll
        for (int k = 0; k < NK; ++k)
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                i64 c = col_of(vec, G, t, k, i);
                if (c < d) {
                    part[c] = gw[k * NV + i];
                    if (LN) part[d + c] = gb[k * NV + i];
                }
            }
    }
}

// The backward's fast path (mode 3 on sm_80+, the same conditions as the forward's; older GPUs
// take mode 1). Thread t of a group holds packs k*G + t of a row; group p writes partial row
// p as norm_bwd does. Each thread streams its x and dy packs of the next S rows into shared
// memory with cp.async, w stays in registers, and both row sums share one barrier. Rows of
// this kind are bound by instruction issue more than by memory, so the per-element and
// per-row work is kept small: a bf16 unpacks with one shift or mask, the group's warp indices
// are computed once, means of power-of-two rows are multiplications, and the load addresses
// advance by an add per row (RESULTS.md, "Kernel design notes", has the profile behind this).
// A thread reads back only the bytes it copied itself, so the stages need no barrier: the
// thread's own cp.async.wait_group orders them. A stage is refilled only after the barrier of
// the row that read it, by which time the row sums (which use every value read) are done.
// Statistics: lane l of each warp loads the mean and rstd of the group's row 32*j + l, and row
// i takes them by a shuffle, so a stats load is exposed once per 32 rows instead of every row.
// Dynamic shared memory: S * 2 * PK packs per thread.
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ u32 norm_smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

// A 16-byte pack as NV compute values and back. bf16 unpacks with one shift or mask per
// element. Stores round element by element (TT::store); on sm_80+, where this code runs, the
// compiler pairs the 16-bit roundings into one cvt per two values.
template <class E> struct PackIO {
    static __device__ __forceinline__ void load(const Pack<E, 16 / sizeof(E)>& p, C* v) {
#pragma unroll
        for (int i = 0; i < 16 / (int)sizeof(E); ++i) v[i] = Ty<E>::load(p.v[i]);
    }
    static __device__ __forceinline__ Pack<E, 16 / sizeof(E)> store(const C* v) {
        Pack<E, 16 / sizeof(E)> p;
#pragma unroll
        for (int i = 0; i < 16 / (int)sizeof(E); ++i) p.v[i] = Ty<E>::store(v[i]);
        return p;
    }
};
template <> __device__ __forceinline__ void PackIO<b16>::load(const Pack<b16, 8>& p, C* v) {
    const u32* u = (const u32*)&p;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(u[i] << 16);
        v[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

// Sums a and b over the warp, each by group_sum's shuffle tree.
__device__ __forceinline__ void warp_sum2(C& a, C& b) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

template <bool LN, int PK, int S> __device__ void norm_bwd_pipe(const RowArgs& a) {
    __shared__ C red[2][64];
    extern __shared__ __align__(16) unsigned char norm_stage[];
    typedef Pack<T, NV> P;
    typedef PackIO<T> IO;
    int phase = 0;
    const int G = a.group, t = threadIdx.x % G, rpb = blockDim.x / G;
    const int row0 = threadIdx.x / G;
    const i64 d = a.d;
    const int np = (int)(d / NV);
    const int nout = LN ? 2 : 1;
    const C n = (C)d;
    // Division by a power of two is exact as a multiplication by its inverse (same result).
    const bool pow2 = (d & (d - 1)) == 0;
    const C inv_n = (C)1 / n;
    const i64 stride = (i64)gridDim.x * rpb;
    // Row iterations of this block (the same for all its threads, so the barriers match).
    const i64 bfirst = (i64)blockIdx.x * rpb, first = bfirst + row0;
    const i64 iters = bfirst < a.rows ? (a.rows - bfirst + stride - 1) / stride : 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpg = G >> 5, wfirst = row0 * wpg;
    // Stage s, operand j (0 x, 1 dy), pack k of this thread: consecutive threads, consecutive packs.
    const u32 sbase = norm_smem_addr(norm_stage) + threadIdx.x * 16;
    const u32 sstep = blockDim.x * 16;
    const P* stage = (const P*)norm_stage + threadIdx.x;
    // Element offsets of this thread's first pack in the row of the next issue; rows advance
    // by `stride`, so the offsets by stride * (row stride).
    const T* xg = (const T*)a.p[S_X] + first * a.st[S_X][0] + (i64)t * NV;
    const T* gg = (const T*)a.p[S_DY] + first * a.st[S_DY][0] + (i64)t * NV;
    const i64 xstep = stride * a.st[S_X][0], gstep = stride * a.st[S_DY][0];
    i64 next_row = first;
    auto issue = [&](int s) {
        const bool active = next_row < a.rows;
#pragma unroll
        for (int k = 0; k < PK; ++k) {
            const bool in = active && k * G + t < np;
            // Zero bytes read fill the pack with zeros (the source is then not read).
            const int bytes = in ? 16 : 0;
            const T* xs = in ? xg + (i64)k * G * NV : (const T*)a.p[S_X];
            const T* gs = in ? gg + (i64)k * G * NV : (const T*)a.p[S_DY];
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sbase + ((s * 2) * PK + k) * sstep),
                         "l"(xs), "r"(bytes)
                         : "memory");
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sbase + ((s * 2 + 1) * PK + k) * sstep),
                         "l"(gs), "r"(bytes)
                         : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        xg += xstep;
        gg += gstep;
        next_row += stride;
    };
    C w[PK][NV];
    {
        const P* wp = (const P*)a.p[S_W];
#pragma unroll
        for (int k = 0; k < PK; ++k) IO::load(k * G + t < np ? wp[k * G + t] : P{}, w[k]);
    }
    C gw[PK][NV], gb[PK][NV];
#pragma unroll
    for (int k = 0; k < PK; ++k)
#pragma unroll
        for (int i = 0; i < NV; ++i) gw[k][i] = gb[k][i] = (C)0;
#pragma unroll
    for (int s = 0; s < S; ++s) issue(s);
    float smu = 0.f, sr = 0.f;
    int s = 0;
    // Pack k of this thread's x and dy in stage s.
    auto unstage = [&](int k, C* xv, C* dv) {
        IO::load(stage[((s * 2) * PK + k) * blockDim.x], xv);
        IO::load(stage[((s * 2 + 1) * PK + k) * blockDim.x], dv);
    };
    i64 row = first;
    for (i64 it = 0; it < iters; ++it, row += stride) {
        if ((it & 31) == 0) {
            const i64 r2 = row + lane * stride;
            smu = sr = 0.f;
            if (it + lane < iters && r2 < a.rows) {
                if (LN) smu = ((const float*)a.p[S_MEAN])[r2 * a.st[S_MEAN][0]];
                sr = ((const float*)a.p[S_RSTD])[r2 * a.st[S_RSTD][0]];
            }
        }
        const C mu = (C)__shfl_sync(0xffffffffu, smu, (int)(it & 31));
        const C r = (C)__shfl_sync(0xffffffffu, sr, (int)(it & 31));
        // dsum's packs of this row, loaded before the row's sums so that their latency passes
        // during them rather than at the store.
        P dsum[PK];
        if (a.flag & NORM_DSUM) {
            const P* ds = (const P*)((const T*)a.p[S_DSUM] + (row < a.rows ? row : 0) * a.st[S_DSUM][0]);
#pragma unroll
            for (int k = 0; k < PK; ++k) dsum[k] = k * G + t < np ? ds[k * G + t] : P{};
        }
        // The oldest of the S groups in flight (this row's) is complete.
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
        C sg = (C)0, sgx = (C)0;
#pragma unroll
        for (int k = 0; k < PK; ++k) {
            // Past the row's end the packs are zeros; xhat = -mean*rstd could be inf there.
            if (k * G + t < np) {
                C xv[NV], dv[NV];
                unstage(k, xv, dv);
#pragma unroll
                for (int i = 0; i < NV; ++i) {
                    const C xh = (xv[i] - mu) * r;
                    const C g = dv[i] * w[k][i];
                    sg += g;
                    sgx += g * xh;
                    gw[k][i] += dv[i] * xh;
                    gb[k][i] += dv[i];
                }
            }
        }
        // Both sums over the group with one barrier (group_sum's scheme, two values per warp).
        // Lane w of each warp then reads warp w's sums and a shuffle tree adds them in a fixed
        // order (deterministic): group_sum's loop of up to 16 dependent shared loads per value
        // would be a visible share of a 512-thread group's row time.
        warp_sum2(sg, sgx);
        if (G > 32) {
            C* buf = red[phase];
            phase ^= 1;
            if (lane == 0) {
                buf[warp] = sg;
                buf[32 + warp] = sgx;
            }
            __syncthreads();
            sg = lane < wpg ? buf[wfirst + lane] : (C)0;
            sgx = lane < wpg ? buf[32 + wfirst + lane] : (C)0;
            warp_sum2(sg, sgx);
        }
        const C mean_g = LN ? (pow2 ? sg * inv_n : sg / n) : (C)0;
        const C mean_gx = pow2 ? sgx * inv_n : sgx / n;
        if (row < a.rows) {
            P* dxp = (P*)((T*)a.p[S_Y] + row * a.st[S_Y][0]);
#pragma unroll
            for (int k = 0; k < PK; ++k) {
                const int pk = k * G + t;
                if (pk < np) {
                    C xv[NV], dv[NV];
                    unstage(k, xv, dv);
#pragma unroll
                    for (int i = 0; i < NV; ++i) {
                        // xhat recomputed with the same operations as above, so the same value.
                        const C xh = (xv[i] - mu) * r;
                        xv[i] = r * (dv[i] * w[k][i] - mean_g - xh * mean_gx);
                    }
                    if (a.flag & NORM_DSUM) {
                        C sv[NV];
                        IO::load(dsum[k], sv);
#pragma unroll
                        for (int i = 0; i < NV; ++i) xv[i] = TT::load(TT::store(xv[i])) + sv[i];
                    }
                    dxp[pk] = IO::store(xv);
                }
            }
        }
        // This stage's values are all read (the stores above used them): refill it S rows ahead.
        issue(s);
        s = s + 1 == S ? 0 : s + 1;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    C* part = (C*)a.p[S_PART] + first * nout * d;
#pragma unroll
    for (int k = 0; k < PK; ++k) {
        const int pk = k * G + t;
        if (pk < np) {
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                part[(i64)pk * NV + i] = gw[k][i];
                if (LN) part[d + (i64)pk * NV + i] = gb[k][i];
            }
        }
    }
}
#endif

// Column sums of the partial rows: out_j[c] = sum over p of part[p][j][c], for the `parts`
// (here: nout) outputs in slots 0 and 1. Blocks of 32 columns x 16 row slices; each slice
// sums its rows in order, then slice 0 adds the 16 slice sums in order (deterministic).
// a.rows = partial rows, a.d = columns, blockIdx.y = output. No partial rows give zeros.
extern "C" __global__ void __launch_bounds__(MAXG) norm_colsum(const RowArgs a) {
    __shared__ C sums[16][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int j = blockIdx.y, nout = a.parts;
    const i64 c = (i64)blockIdx.x * 32 + tx;
    const C* part = (const C*)a.p[S_PART];
    C s = (C)0;
    if (c < a.d)
        for (i64 p = ty; p < a.rows; p += 16) s += part[(p * nout + j) * a.d + c];
    sums[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < a.d) {
        C total = (C)0;
        for (int k = 0; k < 16; ++k) total += sums[k][tx];
        ((T*)a.p[j])[c * a.cs[j]] = TT::store(total);
    }
}

// One kernel per op and MODE (suffix _0, _1, _2; ops/norm.rs picks by the flag), so that
// each gets the register count of its own path.
#define KERNELS(NAME, F, LN)                                                                              \
    extern "C" __global__ void __launch_bounds__(MAXG) NAME##_0(const RowArgs a) { F<LN, 0>(a); } \
    extern "C" __global__ void __launch_bounds__(MAXG) NAME##_1(const RowArgs a) { F<LN, 1>(a); } \
    extern "C" __global__ void __launch_bounds__(MAXG) NAME##_2(const RowArgs a) { F<LN, 2>(a); }
KERNELS(norm_fwd_ln, norm_fwd, true)
KERNELS(norm_fwd_rms, norm_fwd, false)
extern "C" __global__ void __launch_bounds__(MAXG) norm_fwd_add_rms_0(const RowArgs a) { norm_fwd<false, 0, true>(a); }
extern "C" __global__ void __launch_bounds__(MAXG) norm_fwd_add_rms_1(const RowArgs a) { norm_fwd<false, 1, true>(a); }
extern "C" __global__ void __launch_bounds__(MAXG) norm_fwd_add_rms_2(const RowArgs a) { norm_fwd<false, 2, true>(a); }
// The forward's fast path (mode 3; ops/norm.rs sizes its groups for 4 packs per thread, the
// count measured fastest: RESULTS.md, "Kernel design notes"). A register cap of 42 (three
// 512-thread blocks) suits every type but bf16, whose float conversions spill under it, so
// bf16 gets 64 (two blocks).
template <class E> struct VMinBlocks { static const int value = 3; };
template <> struct VMinBlocks<b16> { static const int value = 2; };
extern "C" __global__ void __launch_bounds__(MAXG, VMinBlocks<T>::value) norm_fwd_ln_v(const RowArgs a) {
    norm_fwd_vec<true, 4>(a);
}
extern "C" __global__ void __launch_bounds__(MAXG, VMinBlocks<T>::value) norm_fwd_rms_v(const RowArgs a) {
    norm_fwd_vec<false, 4>(a);
}
extern "C" __global__ void __launch_bounds__(MAXG, VMinBlocks<T>::value) norm_fwd_add_rms_v(const RowArgs a) {
    norm_fwd_vec<false, 4, true>(a);
}
KERNELS(norm_bwd_ln, norm_bwd, true)
KERNELS(norm_bwd_rms, norm_bwd, false)
// The mixed-precision forms (interface 1.12) in the f16 and bf16 modules: add_rms_norm of an
// f32 x and a T residual into an f32 sum and a T y, rms_norm_backward of a T dy against f32
// rows; modes 0, 1 and 2 (not the fast paths of mode 3).
#define NORM_HALF_h16 1
#define NORM_HALF_b16 1
#define NORM_CAT_(a, b) a##b
#define NORM_CAT(a, b) NORM_CAT_(a, b)
#if NORM_CAT(NORM_HALF_, ELEM) == 1
extern "C" __global__ void __launch_bounds__(MAXG) norm_fwd_add_rms_mixed_0(const RowArgs a) {
    norm_fwd<false, 0, true, true>(a);
}
extern "C" __global__ void __launch_bounds__(MAXG) norm_fwd_add_rms_mixed_1(const RowArgs a) {
    norm_fwd<false, 1, true, true>(a);
}
extern "C" __global__ void __launch_bounds__(MAXG) norm_fwd_add_rms_mixed_2(const RowArgs a) {
    norm_fwd<false, 2, true, true>(a);
}
extern "C" __global__ void __launch_bounds__(MAXG) norm_bwd_rms_mixed_0(const RowArgs a) { norm_bwd<false, 0, true>(a); }
extern "C" __global__ void __launch_bounds__(MAXG) norm_bwd_rms_mixed_1(const RowArgs a) { norm_bwd<false, 1, true>(a); }
extern "C" __global__ void __launch_bounds__(MAXG) norm_bwd_rms_mixed_2(const RowArgs a) { norm_bwd<false, 2, true>(a); }
#endif
// The backward's fast path (sm_80+), by packs per thread: ops/norm.rs gives each thread 8
// columns (1 pack of f16/bf16, 2 of f32); f16/bf16 fit two 512-thread blocks per SM, f32 one.
// Stages: two, measured fastest (RESULTS.md, "Kernel design notes"); PIPE_STAGES in
// ops/norm.rs sizes the dynamic shared memory for it.
#define NORM_PIPE_S 2
#if __CUDA_ARCH__ >= 800
#define BWD_P(PK, MB)                                                                                     \
    extern "C" __global__ void __launch_bounds__(MAXG, MB) norm_bwd_ln_p##PK(const RowArgs a) {          \
        norm_bwd_pipe<true, PK, NORM_PIPE_S>(a);                                                          \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(MAXG, MB) norm_bwd_rms_p##PK(const RowArgs a) {         \
        norm_bwd_pipe<false, PK, NORM_PIPE_S>(a);                                                         \
    }
BWD_P(1, 2)
BWD_P(2, 1)
#endif
