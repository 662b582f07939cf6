// Reductions for element type T: one block per output element (grid-stride over outputs),
// each thread folding a strided share of the reduced positions, then a tree in shared memory.
//
// Geometry (set by ops/reduce.rs): `ndim` kept dims in shape[0..ndim] with input strides
// st[0] and output strides st[1]; `flag` reduced dims in shape[ndim..ndim+flag] with input
// strides st[2]; n = outputs, u[0] = reduced elements per output.
//
// Sums accumulate in f64 for f32 and f64, in f32 for f16/bf16 (the interface rule) and wrap in
// the integer type. Max/min and the arg reductions carry (value, index) states: merging two
// states keeps the earlier index unless the later value is strictly better, and a NaN is
// better than anything but an earlier NaN, which gives the sequential rules (first index on
// ties, first NaN wins) for any split of the work.

#if IS_FLOAT
typedef typename Ty<T>::C RC;
#if IS_DOUBLE_ACC
typedef double Acc;
#else
typedef float Acc;
#endif
#else
typedef typename Ty<T>::C RC;
typedef typename Ty<T>::C Acc;
#endif

#define RTHREADS 256

__device__ __forceinline__ i64 offset_in(const i64* shape, const i64* st, int nd, u64 i) {
    i64 off = 0;
    for (int d = nd - 1; d >= 0; --d) {
        u64 sz = (u64)shape[d];
        u64 q = i / sz;
        off += (i64)(i - q * sz) * st[d];
        i = q;
    }
    return off;
}

template <bool MAX> __device__ __forceinline__ bool better(RC v, RC best) {
    bool best_nan = best != best, v_nan = v != v;
    return !best_nan && (v_nan || (MAX ? v > best : v < best));
}

// Sum (MODE 0), mean (1), prod (2), sum of squares (3).
template <int MODE> __device__ __forceinline__ Acc acc_op(Acc a, Acc b) {
#if IS_FLOAT
    return MODE == 2 ? a * b : a + b;
#else
    return MODE == 2 ? (Acc)((u64)a * (u64)b) : (Acc)((u64)a + (u64)b);
#endif
}

// The term an element adds: itself, or its square (MODE 3) taken in the accumulator type.
template <int MODE> __device__ __forceinline__ Acc term(T x) {
    Acc v = (Acc)TT::load(x);
    return MODE == 3 ? v * v : v;
}

template <int MODE> __device__ void sum_like(const Args& a, unsigned char* smem) {
    Acc* part = (Acc*)smem;
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    int kd = a.ndim, rd = a.flag;
    u64 n_red = a.u[0];
    for (u64 out = blockIdx.x; out < a.n; out += gridDim.x) {
        i64 base = offset_in(a.shape, a.st[0], kd, out);
        Acc s = MODE == 2 ? (Acc)1 : (Acc)0;
        for (u64 j = threadIdx.x; j < n_red; j += blockDim.x) {
            s = acc_op<MODE>(s, term<MODE>(x[base + offset_in(a.shape + kd, a.st[2], rd, j)]));
        }
        part[threadIdx.x] = s;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w >>= 1) {
            if ((int)threadIdx.x < w) part[threadIdx.x] = acc_op<MODE>(part[threadIdx.x], part[threadIdx.x + w]);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            Acc r = part[0];
#if IS_FLOAT
            if (MODE == 1) r = r / (Acc)n_red;
#endif
            y[offset_in(a.shape, a.st[1], kd, out)] = TT::store((RC)r);
        }
        __syncthreads();
    }
}

// Max/min (ARG false: write the value) and argmax/argmin (ARG true: write the i64 index).
template <bool MAX, bool ARG> __device__ void extreme(const Args& a, unsigned char* smem) {
    i64* idx = (i64*)smem;
    RC* val = (RC*)(smem + RTHREADS * sizeof(i64));
    const T* x = (const T*)a.p[0];
    int kd = a.ndim, rd = a.flag;
    u64 n_red = a.u[0];
    for (u64 out = blockIdx.x; out < a.n; out += gridDim.x) {
        i64 base = offset_in(a.shape, a.st[0], kd, out);
        RC best = (RC)0;
        i64 at = -1;
        for (u64 j = threadIdx.x; j < n_red; j += blockDim.x) {
            RC v = TT::load(x[base + offset_in(a.shape + kd, a.st[2], rd, j)]);
            if (at < 0 || better<MAX>(v, best)) {
                best = v;
                at = (i64)j;
            }
        }
        val[threadIdx.x] = best;
        idx[threadIdx.x] = at;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w >>= 1) {
            if ((int)threadIdx.x < w) {
                RC va = val[threadIdx.x], vb = val[threadIdx.x + w];
                i64 ia = idx[threadIdx.x], ib = idx[threadIdx.x + w];
                if (ib >= 0 && (ia < 0 || (ib < ia ? !better<MAX>(va, vb) : better<MAX>(vb, va)))) {
                    val[threadIdx.x] = vb;
                    idx[threadIdx.x] = ib;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            i64 o = offset_in(a.shape, a.st[1], kd, out);
            if (ARG) ((i64*)a.p[1])[o] = idx[0] < 0 ? 0 : idx[0];
            else ((T*)a.p[1])[o] = TT::store(val[0]);
        }
        __syncthreads();
    }
}

// Dynamic shared memory (the launcher passes RTHREADS * 16 bytes), declared in the kernels
// themselves rather than as statics inside the device functions.
#define SMEM extern __shared__ __align__(16) unsigned char smem[]
#if !IS_BOOL
extern "C" __global__ void reduce_sum(const Args a) { SMEM; sum_like<0>(a, smem); }
extern "C" __global__ void reduce_prod(const Args a) { SMEM; sum_like<2>(a, smem); }
#endif
#if IS_FLOAT
extern "C" __global__ void reduce_mean(const Args a) { SMEM; sum_like<1>(a, smem); }
extern "C" __global__ void reduce_sum_squares(const Args a) { SMEM; sum_like<3>(a, smem); }
#endif
extern "C" __global__ void reduce_max(const Args a) { SMEM; extreme<true, false>(a, smem); }
extern "C" __global__ void reduce_min(const Args a) { SMEM; extreme<false, false>(a, smem); }
extern "C" __global__ void reduce_argmax(const Args a) { SMEM; extreme<true, true>(a, smem); }
extern "C" __global__ void reduce_argmin(const Args a) { SMEM; extreme<false, true>(a, smem); }

// ---- fast paths ----------------------------------------------------------------------------
//
// The same reductions as above for the two layouts that dominate in practice, without
// per-element index arithmetic: a contiguous innermost reduced axis (rows) and a reduced
// outer axis with a contiguous innermost kept axis (columns). Each op is a policy class with
// a partial state S: `add` folds one element (positions increase per thread), `merge` joins
// two states of any split of the work and is symmetric, so the butterfly shuffles below give
// every lane the same bits. Long reductions are cut into parts whose states go to a scratch
// array [part][output]; `reduce_finish_*` folds them in part order, so results do not
// depend on timing.

// Shuffles for the state members (u8 states travel as int).
__device__ __forceinline__ float shfl_x(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ double shfl_x(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ int shfl_x(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ i64 shfl_x(i64 v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ u8 shfl_x(u8 v, int m) { return (u8)__shfl_xor_sync(0xffffffffu, (int)v, m); }

template <int MODE> struct SumR {
    typedef Acc S;
    static __device__ __forceinline__ S init() { return MODE == 2 ? (Acc)1 : (Acc)0; }
    static __device__ __forceinline__ void add(S& s, T v, u64) { s = acc_op<MODE>(s, term<MODE>(v)); }
    static __device__ __forceinline__ S merge(S a, S b) { return acc_op<MODE>(a, b); }
    static __device__ __forceinline__ S shfl(S s, int m) { return shfl_x(s, m); }
    static __device__ __forceinline__ void write(char* y, i64 off, S s, u64 n_red) {
        Acc r = s;
#if IS_FLOAT
        if (MODE == 1) r = r / (Acc)n_red;
#endif
        ((T*)y)[off] = TT::store((RC)r);
    }
};

// i < 0: no element seen yet.
struct ExtS {
    RC v;
    i64 i;
};
template <bool MAX, bool ARG> struct ExtR {
    typedef ExtS S;
    static __device__ __forceinline__ S init() {
        S s;
        s.v = (RC)0;
        s.i = -1;
        return s;
    }
    static __device__ __forceinline__ void add(S& s, T x, u64 j) {
        RC v = TT::load(x);
        if (s.i < 0 || better<MAX>(v, s.v)) {
            s.v = v;
            s.i = (i64)j;
        }
    }
    // The earlier position wins unless the later value is strictly better (the rule of
    // `extreme` above); both orders of the arguments give the same state.
    static __device__ __forceinline__ S merge(S a, S b) {
        if (b.i >= 0 && (a.i < 0 || (b.i < a.i ? !better<MAX>(a.v, b.v) : better<MAX>(b.v, a.v)))) return b;
        return a;
    }
    static __device__ __forceinline__ S shfl(S s, int m) {
        S r;
        r.v = shfl_x(s.v, m);
        r.i = shfl_x(s.i, m);
        return r;
    }
    static __device__ __forceinline__ void write(char* y, i64 off, S s, u64) {
        if (ARG) ((i64*)y)[off] = s.i < 0 ? 0 : s.i;
        else ((T*)y)[off] = TT::store(s.v);
    }
};

// Join the states of a warp, or of the whole block when `block` (which the whole block must
// then enter, with smem for blockDim.x / 32 states); every thread of the group gets the result.
template <class R> __device__ __forceinline__ typename R::S group_merge(typename R::S s, bool block, unsigned char* smem) {
    typedef typename R::S S;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) s = R::merge(s, R::shfl(s, m));
    if (block) {
        S* part = (S*)smem;
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
        if (lane == 0) part[warp] = s;
        __syncthreads();
        s = lane < warps ? part[lane] : R::init();
        for (int m = 16; m > 0; m >>= 1) s = R::merge(s, R::shfl(s, m));
        __syncthreads();
    }
    return s;
}

// Rows: the reduced axis is contiguous, u[0] = its length L. Kept dims in shape[0..ndim) with
// input strides st[0] and output strides st[1]; n = rows. Each row is cut into u[1] parts
// (whole 16-element multiples) and each (row, part) is folded by a group of G threads (a warp,
// or the block when flag bit 0 is set): the unaligned head one element per thread, then
// 16-byte packs, then the tail. G is a run-time value: one instantiation per op keeps the
// module's NVRTC compile short.
template <class R> __device__ void rows(const Args& a, unsigned char* smem) {
    typedef typename R::S S;
    const bool block = a.flag & 1;
    const u32 G = block ? blockDim.x : 32;
    const u64 L = a.u[0], parts = a.u[1];
    const u64 chunk = ((L + parts - 1) / parts + 15) / 16 * 16;
    const u64 units = a.n * parts;
    const u32 lane = block ? threadIdx.x : threadIdx.x % 32;
    const u64 first = block ? blockIdx.x : gtid() / 32, step = block ? gridDim.x : gstride() / 32;
    for (u64 w = first; w < units; w += step) {
        const u64 row = w / parts, part = w - row * parts;
        const u64 s0 = part * chunk, s1 = s0 + chunk < L ? s0 + chunk : L;
        S s = R::init();
        if (s0 < s1) {
            const T* p = (const T*)a.p[0] + offset_in(a.shape, a.st[0], a.ndim, row) + s0;
            const u64 len = s1 - s0;
            u64 h = ((16 - ((u64)p & 15)) & 15) / sizeof(T);
            if (h > len) h = len;
            if (lane < h) R::add(s, p[lane], s0 + lane);
            const Pack<T, VW>* q = (const Pack<T, VW>*)(p + h);
            const u64 nv = (len - h) / VW, j0 = s0 + h;
            u64 k = lane;
            // Four packs in flight per thread before any is folded.
            for (; k + 3 * G < nv; k += 4 * G) {
                Pack<T, VW> v[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) v[r] = q[k + r * G];
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int e = 0; e < (int)VW; ++e) R::add(s, v[r].v[e], j0 + (k + r * G) * VW + e);
            }
            for (; k < nv; k += G) {
                Pack<T, VW> v = q[k];
#pragma unroll
                for (int e = 0; e < (int)VW; ++e) R::add(s, v.v[e], j0 + k * VW + e);
            }
            for (u64 t = h + nv * VW + lane; t < len; t += G) R::add(s, p[t], s0 + t);
        }
        s = group_merge<R>(s, block, smem);
        if (lane == 0) {
            if (parts == 1) R::write(a.p[1], offset_in(a.shape, a.st[1], a.ndim, row), s, L);
            else ((S*)a.p[2])[part * a.n + row] = s;
        }
    }
}

// Columns: the last kept dim (I = shape[ndim-1]) has input stride 1; one reduced axis of
// length u[0] and input stride st[2][0]. A block is TX x TY threads (TX = 1 << (flag >> 8)):
// TX threads side by side along I, V elements each (coalesced), TY threads interleaved over
// the reduced positions of this block's part (blockIdx.y of u[1]), joined in shared memory.
template <class R, int V> __device__ void cols(const Args& a, unsigned char* smem) {
    typedef typename R::S S;
    const int txb = a.flag >> 8, TX = 1 << txb, TY = blockDim.x >> txb;
    const int tx = threadIdx.x & (TX - 1), ty = threadIdx.x >> txb;
    const u64 I = (u64)a.shape[a.ndim - 1], outer = a.n / I;
    const u64 ivec = (I + V - 1) / V, tiles = (ivec + TX - 1) / TX;
    const u64 Rn = a.u[0], parts = a.u[1], chunk = (Rn + parts - 1) / parts;
    const u64 j0 = blockIdx.y * chunk, j1 = j0 + chunk < Rn ? j0 + chunk : Rn;
    const i64 rs = a.st[2][0];
    S* sh = (S*)smem;
    for (u64 b = blockIdx.x; b < outer * tiles; b += gridDim.x) {
        const u64 o = b / tiles, iv = (b - o * tiles) * TX + tx;
        const bool live = iv < ivec;
        S s[V];
#pragma unroll
        for (int e = 0; e < V; ++e) s[e] = R::init();
        if (live) {
            const T* p = (const T*)a.p[0] + offset_in(a.shape, a.st[0], a.ndim - 1, o) + iv * V;
            u64 j = j0 + ty;
            for (; j + 3 * TY < j1; j += 4 * TY) {
                Pack<T, V> v[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) v[r] = *(const Pack<T, V>*)(p + (i64)(j + r * TY) * rs);
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int e = 0; e < V; ++e) R::add(s[e], v[r].v[e], j + r * TY);
            }
            for (; j < j1; j += TY) {
                Pack<T, V> v = *(const Pack<T, V>*)(p + (i64)j * rs);
#pragma unroll
                for (int e = 0; e < V; ++e) R::add(s[e], v.v[e], j);
            }
        }
#pragma unroll
        for (int e = 0; e < V; ++e) {
            sh[threadIdx.x] = s[e];
            __syncthreads();
            for (int w = TY / 2; w > 0; w >>= 1) {
                if (ty < w) sh[ty * TX + tx] = R::merge(sh[ty * TX + tx], sh[(ty + w) * TX + tx]);
                __syncthreads();
            }
            // Only thread (0, tx) writes slot tx next round, so no barrier is needed here.
            if (ty == 0) s[e] = sh[tx];
        }
        __syncthreads();
        if (ty == 0 && live) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const u64 out = o * I + iv * V + e;
                if (parts == 1) R::write(a.p[1], offset_in(a.shape, a.st[1], a.ndim, out), s[e], Rn);
                else ((S*)a.p[2])[blockIdx.y * a.n + out] = s[e];
            }
        }
    }
}

// Fold the u[1] partial states of each output and write it: a warp per output, lane l
// folding parts l, l + 32, ... in order, then the warp's butterfly. The order depends only on
// the part count, so results do not depend on timing; a single thread per output would read
// its hundreds of parts one after another.
template <class R> __device__ void finish(const Args& a) {
    typedef typename R::S S;
    const S* part = (const S*)a.p[2];
    const u32 lane = threadIdx.x % 32;
    for (u64 out = gtid() / 32; out < a.n; out += gstride() / 32) {
        S s = R::init();
        for (u64 k = lane; k < a.u[1]; k += 32) s = R::merge(s, part[k * a.n + out]);
        s = group_merge<R>(s, false, nullptr);
        if (lane == 0) R::write(a.p[1], offset_in(a.shape, a.st[1], a.ndim, out), s, a.u[0]);
    }
}

typedef SumR<0> RSum;
typedef SumR<1> RMean;
typedef SumR<2> RProd;
typedef SumR<3> RSumSquares;
typedef ExtR<true, false> RMax;
typedef ExtR<false, false> RMin;
typedef ExtR<true, true> RArgMax;
typedef ExtR<false, true> RArgMin;

// flag bit 0: a block (256 threads) per row part instead of a warp; bit 1: packs of VW.
#define FAST(NAME, R)                                                                 \
    extern "C" __global__ void reduce_rows_##NAME(const Args a) {                     \
        SMEM;                                                                         \
        rows<R>(a, smem);                                                             \
    }                                                                                 \
    extern "C" __global__ void reduce_cols_##NAME(const Args a) {                     \
        SMEM;                                                                         \
        if (a.flag & 2) cols<R, (int)VW>(a, smem);                                    \
        else cols<R, 1>(a, smem);                                                     \
    }                                                                                 \
    extern "C" __global__ void reduce_finish_##NAME(const Args a) { finish<R>(a); }

#if !IS_BOOL
FAST(sum, RSum) FAST(prod, RProd)
#endif
#if IS_FLOAT
FAST(mean, RMean) FAST(sum_squares, RSumSquares)
#endif
FAST(max, RMax) FAST(min, RMin) FAST(argmax, RArgMax) FAST(argmin, RArgMin)

// ---- foreach_sum_squares ----------------------------------------------------------------------
// The sums of squares of many dense tensors, listed in the kernel parameter (ops/reduce.rs): each
// tensor is cut into FS_CHUNK-element chunks, numbered across the table (entry i owns chunks
// chunk0 .. chunk0 + its count), and a block folds one chunk into a partial state (the
// unaligned head, 16-byte packs, the tail, then the block's butterfly), which
// `foreach_sum_squares_finish` folds in chunk order, a warp per entry: as `finish` does, so
// results do not depend on timing. The gradient norm of clipping then costs two launches for
// up to FS_MAX gradients instead of one or two per gradient.
#if IS_FLOAT
#define FS_MAX 120
#define FS_CHUNK 65536
// Mirror of `FsEntry` in ops/reduce.rs: a dense tensor of n elements, whose sum goes to y[out].
struct FsEntry {
    u64 x;
    u64 n;
    u64 chunk0;
    u64 out;
};
// Mirror of `FsArgs` in ops/reduce.rs.
struct FsArgs {
    u64 y;        // the output vector
    i64 ystride;  // its stride, in elements
    u64 part;     // scratch: one Acc per chunk
    u64 count;    // entries used
    u64 chunks;   // chunks of all entries
    FsEntry e[FS_MAX];
};

extern "C" __global__ void foreach_sum_squares_part(const FsArgs a) {
    SMEM;
    typedef RSumSquares R;
    for (u64 c = blockIdx.x; c < a.chunks; c += gridDim.x) {
        // The entry owning chunk c: the last whose first chunk is at or before c (an empty
        // entry shares its first chunk with the next one and owns none).
        u32 lo = 0, hi = (u32)a.count;
        while (hi - lo > 1) {
            const u32 mid = (lo + hi) / 2;
            if (a.e[mid].chunk0 <= c) lo = mid;
            else hi = mid;
        }
        const u64 s0 = (c - a.e[lo].chunk0) * FS_CHUNK, rest = a.e[lo].n - s0;
        const u64 len = rest < FS_CHUNK ? rest : FS_CHUNK;
        const T* p = (const T*)a.e[lo].x + s0;
        R::S s = R::init();
        u64 h = ((16 - ((u64)p & 15)) & 15) / sizeof(T);
        if (h > len) h = len;
        if (threadIdx.x < h) R::add(s, p[threadIdx.x], 0);
        const Pack<T, VW>* q = (const Pack<T, VW>*)(p + h);
        const u64 nv = (len - h) / VW;
#pragma unroll 4
        for (u64 k = threadIdx.x; k < nv; k += blockDim.x) {
            const Pack<T, VW> v = q[k];
#pragma unroll
            for (int i = 0; i < VW; ++i) R::add(s, v.v[i], 0);
        }
        for (u64 j = h + nv * VW + threadIdx.x; j < len; j += blockDim.x) R::add(s, p[j], 0);
        s = group_merge<R>(s, true, smem);
        if (threadIdx.x == 0) ((R::S*)a.part)[c] = s;
    }
}

extern "C" __global__ void foreach_sum_squares_finish(const FsArgs a) {
    typedef RSumSquares R;
    const u32 lane = threadIdx.x % 32;
    for (u64 i = gtid() / 32; i < a.count; i += gstride() / 32) {
        const u64 c1 = i + 1 < a.count ? a.e[i + 1].chunk0 : a.chunks;
        R::S s = R::init();
        for (u64 k = a.e[i].chunk0 + lane; k < c1; k += 32) s = R::merge(s, ((const R::S*)a.part)[k]);
        s = group_merge<R>(s, false, nullptr);
        if (lane == 0) R::write((char*)a.y, (i64)a.e[i].out * a.ystride, s, 0);
    }
}
#endif
