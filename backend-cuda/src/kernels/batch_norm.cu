// Batch normalization of dense (n, c, s) tensors with the batch's statistics, for float type T
// in the compute type C (f32 for f16/bf16/f32, f64 for f64):
//   bn_stats       per (split, channel) block: sums of x - K and (x - K)² over its rows, with
//                  K the channel's first value (a shift that keeps the sums from cancelling)
//   bn_finalize    per channel: the splits' sums in order -> mean and rstd (f32 outputs, and
//                  in C for bn_apply, so f64 normalizes with f64 statistics)
//   bn_apply       y = (x - mean) · rstd · w + b
//   bn_bwd_stats   per (split, channel): sums of dy and dy · x̂
//   bn_bwd_finalize per channel -> dbias = Σ dy, dweight = Σ dy · x̂ (f32)
//   bn_dx          dx = w · rstd · (dy - dbias/m - x̂ · dweight/m)
// Blocks of one channel split its n rows of s values, so that a few channels still fill the
// GPU; the per-channel sums are added in a fixed order (deterministic). When `packed` (s a
// multiple of the pack and the tensors 16-byte aligned), each step moves one 16-byte pack.

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

struct BnArgs {
    char* p[9];  // see each kernel
    u64 n, c, s;
    u64 rows;    // rows (of s values) per split
    u64 splits;
    double eps;
    int packed;
};

#define V (16 / (int)sizeof(T))
typedef Pack<T, V> P;
#define FULL 0xffffffffu

// Sum a and b over the block (blockDim.x a multiple of 32, at most 1024); thread 0 has them.
__device__ __forceinline__ void block_sum2(C& a, C& b) {
    __shared__ C sa[32], sb[32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(FULL, a, o);
        b += __shfl_xor_sync(FULL, b, o);
    }
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    if (l == 0) {
        sa[w] = a;
        sb[w] = b;
    }
    __syncthreads();
    if (w == 0) {
        const int nw = blockDim.x / 32;
        a = l < nw ? sa[l] : (C)0;
        b = l < nw ? sb[l] : (C)0;
        for (int o = 16; o > 0; o >>= 1) {
            a += __shfl_xor_sync(FULL, a, o);
            b += __shfl_xor_sync(FULL, b, o);
        }
    }
}

// Visit the values of this block's rows of channel blockIdx.y: f(offset of the value).
template <class F> __device__ __forceinline__ void each_value(const BnArgs& a, F f) {
    const u64 ch = blockIdx.y, r0 = (u64)blockIdx.x * a.rows;
    const u64 r1 = min(a.n, r0 + a.rows);
    if (r0 >= r1) return;
    const u32 count = (u32)((r1 - r0) * a.s);
    const u32 s = (u32)a.s;
    for (u32 t = threadIdx.x; t < count; t += blockDim.x) {
        const u32 i = t / s, j = t - i * s;
        f(((r0 + i) * a.c + ch) * a.s + j);
    }
}

// The same over packs of V values (when packed): f(offset of the pack's first value).
template <class F> __device__ __forceinline__ void each_pack(const BnArgs& a, F f) {
    const u64 ch = blockIdx.y, r0 = (u64)blockIdx.x * a.rows;
    const u64 r1 = min(a.n, r0 + a.rows);
    if (r0 >= r1) return;
    const u32 sp = (u32)(a.s / V);
    const u32 count = (u32)((r1 - r0) * sp);
    for (u32 t = threadIdx.x; t < count; t += blockDim.x) {
        const u32 i = t / sp, j = t - i * sp;
        f(((r0 + i) * a.c + ch) * a.s + (u64)j * V);
    }
}

// This block's two sums (channel blockIdx.y, split blockIdx.x) into `partial`, [c][splits][2].
__device__ __forceinline__ void write_partial(const BnArgs& a, C* partial, C s1, C s2) {
    block_sum2(s1, s2);
    if (threadIdx.x == 0) {
        C* out = partial + (blockIdx.y * a.splits + blockIdx.x) * 2;
        out[0] = s1;
        out[1] = s2;
    }
}

// Channel ch's two sums over its splits' partials, in f64, in split order.
__device__ __forceinline__ void sum_partials(const BnArgs& a, const C* partial, u64 ch, double& s1, double& s2) {
    for (u64 k = 0; k < a.splits; k++) {
        s1 += (double)partial[(ch * a.splits + k) * 2];
        s2 += (double)partial[(ch * a.splits + k) * 2 + 1];
    }
}

// p: x, -, -, -, -, -, partial (C, [c][splits][2])
extern "C" __global__ void bn_stats(const BnArgs a) {
    const T* x = (const T*)a.p[0];
    C* partial = (C*)a.p[6];
    const C k = TT::load(x[blockIdx.y * a.s]);
    C s1 = 0, s2 = 0;
    if (a.packed) {
        each_pack(a, [&](u64 o) {
            const P v = *(const P*)(x + o);
#pragma unroll
            for (int e = 0; e < V; e++) {
                const C d = TT::load(v.v[e]) - k;
                s1 += d;
                s2 += d * d;
            }
        });
    } else {
        each_value(a, [&](u64 o) {
            const C d = TT::load(x[o]) - k;
            s1 += d;
            s2 += d * d;
        });
    }
    write_partial(a, partial, s1, s2);
}

// p: x, -, -, -, mean, rstd, partial, stats (C, [c][2]: mean, rstd). One thread per channel.
extern "C" __global__ void bn_finalize(const BnArgs a) {
    const u64 ch = gtid();
    if (ch >= a.c) return;
    const T* x = (const T*)a.p[0];
    const C* partial = (const C*)a.p[6];
    double s1 = 0, s2 = 0;
    sum_partials(a, partial, ch, s1, s2);
    const double m = (double)(a.n * a.s);
    const double shift = a.n * a.s > 0 ? TT::to_d(x[ch * a.s]) : 0.0;
    const double d = s1 / m;  // 0/0 = NaN for a channel without values
    const double var = fmax(s2 / m - d * d, 0.0);
    const double mean = shift + d, rstd = 1.0 / sqrt(var + a.eps);
    ((float*)a.p[4])[ch] = (float)mean;
    ((float*)a.p[5])[ch] = (float)rstd;
    ((C*)a.p[7])[ch * 2] = (C)mean;
    ((C*)a.p[7])[ch * 2 + 1] = (C)rstd;
}

// p: x, w, b, y, -, -, -, stats. Grid-stride over every value (or pack).
extern "C" __global__ void bn_apply(const BnArgs a) {
    const T* x = (const T*)a.p[0];
    const float *w = (const float*)a.p[1], *b = (const float*)a.p[2];
    const C* stats = (const C*)a.p[7];
    T* y = (T*)a.p[3];
    const u64 total = a.n * a.c * a.s;
    if (a.packed) {
        for (u64 q = gtid(); q < total / V; q += gstride()) {
            const u64 o = q * V, ch = (o / a.s) % a.c;
            const C scale = stats[ch * 2 + 1] * (C)w[ch], shift = (C)b[ch] - stats[ch * 2] * scale;
            const P v = *(const P*)(x + o);
            P r;
#pragma unroll
            for (int e = 0; e < V; e++) r.v[e] = TT::store(TT::load(v.v[e]) * scale + shift);
            *(P*)(y + o) = r;
        }
    } else {
        for (u64 o = gtid(); o < total; o += gstride()) {
            const u64 ch = (o / a.s) % a.c;
            const C scale = stats[ch * 2 + 1] * (C)w[ch], shift = (C)b[ch] - stats[ch * 2] * scale;
            y[o] = TT::store(TT::load(x[o]) * scale + shift);
        }
    }
}

// p: dy, x, -, mean, rstd, -, -, -, partial
extern "C" __global__ void bn_bwd_stats(const BnArgs a) {
    const T *dy = (const T*)a.p[0], *x = (const T*)a.p[1];
    const C mu = ((const float*)a.p[3])[blockIdx.y], r = ((const float*)a.p[4])[blockIdx.y];
    C* partial = (C*)a.p[8];
    C sg = 0, sgx = 0;
    if (a.packed) {
        each_pack(a, [&](u64 o) {
            const P g = *(const P*)(dy + o), v = *(const P*)(x + o);
#pragma unroll
            for (int e = 0; e < V; e++) {
                const C gc = TT::load(g.v[e]);
                sg += gc;
                sgx += gc * (TT::load(v.v[e]) - mu) * r;
            }
        });
    } else {
        each_value(a, [&](u64 o) {
            const C gc = TT::load(dy[o]);
            sg += gc;
            sgx += gc * (TT::load(x[o]) - mu) * r;
        });
    }
    write_partial(a, partial, sg, sgx);
}

// p: -, -, -, -, -, -, dw, db, partial. One thread per channel.
extern "C" __global__ void bn_bwd_finalize(const BnArgs a) {
    const u64 ch = gtid();
    if (ch >= a.c) return;
    const C* partial = (const C*)a.p[8];
    double sg = 0, sgx = 0;
    sum_partials(a, partial, ch, sg, sgx);
    ((float*)a.p[6])[ch] = (float)sgx;
    ((float*)a.p[7])[ch] = (float)sg;
}

// p: dy, x, w, mean, rstd, dx, dw, db. Grid-stride over every value (or pack).
extern "C" __global__ void bn_dx(const BnArgs a) {
    const T *dy = (const T*)a.p[0], *x = (const T*)a.p[1];
    const float *w = (const float*)a.p[2], *mean = (const float*)a.p[3], *rstd = (const float*)a.p[4];
    const float *dw = (const float*)a.p[6], *db = (const float*)a.p[7];
    T* dx = (T*)a.p[5];
    const u64 total = a.n * a.c * a.s;
    const C m = (C)(a.n * a.s);
    if (a.packed) {
        for (u64 q = gtid(); q < total / V; q += gstride()) {
            const u64 o = q * V, ch = (o / a.s) % a.c;
            const C mu = mean[ch], r = rstd[ch], k = (C)w[ch] * r;
            const C mg = (C)db[ch] / m, mgx = (C)dw[ch] / m;
            const P g = *(const P*)(dy + o), v = *(const P*)(x + o);
            P out;
#pragma unroll
            for (int e = 0; e < V; e++) {
                out.v[e] = TT::store(k * (TT::load(g.v[e]) - mg - (TT::load(v.v[e]) - mu) * r * mgx));
            }
            *(P*)(dx + o) = out;
        }
    } else {
        for (u64 o = gtid(); o < total; o += gstride()) {
            const u64 ch = (o / a.s) % a.c;
            const C mu = mean[ch], r = rstd[ch], k = (C)w[ch] * r;
            const C mg = (C)db[ch] / m, mgx = (C)dw[ch] / m;
            dx[o] = TT::store(k * (TT::load(dy[o]) - mg - (TT::load(x[o]) - mu) * r * mgx));
        }
    }
}
