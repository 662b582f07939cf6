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

// Sum (MODE 0), mean (1), prod (2).
template <int MODE> __device__ __forceinline__ Acc acc_op(Acc a, Acc b) {
#if IS_FLOAT
    return MODE == 2 ? a * b : a + b;
#else
    return MODE == 2 ? (Acc)((u64)a * (u64)b) : (Acc)((u64)a + (u64)b);
#endif
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
            Acc v = (Acc)TT::load(x[base + offset_in(a.shape + kd, a.st[2], rd, j)]);
            s = acc_op<MODE>(s, v);
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
#endif
extern "C" __global__ void reduce_max(const Args a) { SMEM; extreme<true, false>(a, smem); }
extern "C" __global__ void reduce_min(const Args a) { SMEM; extreme<false, false>(a, smem); }
extern "C" __global__ void reduce_argmax(const Args a) { SMEM; extreme<true, true>(a, smem); }
extern "C" __global__ void reduce_argmin(const Args a) { SMEM; extreme<false, true>(a, smem); }
