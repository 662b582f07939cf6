// Index ops for element type T: gather / index_select (reads) and scatter_add / index_add
// (in-place accumulation) along one dim, and cumsum.
//
// Gather and scatter share one geometry, set by ops/index.rs over the iteration shape (the
// index's shape for gather/scatter_add; for index_select/index_add the rank-1 index is viewed
// as a tensor of the small operand's shape with stride 0 off the indexed dim):
//   st[0] = index strides, st[1] = strides of the operand walked in step with the index
//   (gather: y, scatter: src), st[2] = the indexed operand's strides with the indexed dim's
//   stride zeroed (gather: x, scatter: y); u[0] = the indexed dim's size, u[1] = its stride
//   (i64 bits). The indexed operand's offset is offsets(st[2]) + index * u[1], so the dims can
//   be merged like any elementwise geometry (merging keeps row-major offsets of every set).
// check_index ran before on the stream: while it reports a bad index (index_fault) the
// kernels write nothing; they also skip any index out of range rather than touch memory
// outside the operand.

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

extern "C" __global__ void gather(const Args a) {
    if (index_faulted()) return;
    const i64* idx = (const i64*)a.p[0];
    T* y = (T*)a.p[1];
    const T* x = (const T*)a.p[2];
    const i64 along = (i64)a.u[1];
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 off[3];
        offsets<3>(a, i, off);
        const i64 t = idx[off[0]];
        if (t >= 0 && (u64)t < a.u[0]) y[off[1]] = x[off[2] + t * along];
    }
}

// ---- atomic accumulation -------------------------------------------------------------------
// One atomic read-modify-write per element, rounding in the output dtype at each `+=` (the
// numerical contract allows this for scatter_add/index_add). What we give up: the order in
// which duplicates of one destination are added depends on scheduling, so float results may
// differ in the last bits from run to run (the CPU backend adds in index order and is
// bitwise reproducible). Integer sums wrap and are exact, hence deterministic.

__device__ __forceinline__ void add_to(float* p, float v) { atomicAdd(p, v); }
// Native f64 atomicAdd exists from sm_60 (every architecture we compile for).
__device__ __forceinline__ void add_to(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void add_to(i64* p, i64 v) { atomicAdd((u64*)p, (u64)v); }
__device__ __forceinline__ void add_to(int* p, int v) { atomicAdd(p, v); }

template <class E> __device__ __forceinline__ u32 bits_of(E e) {
    if (sizeof(E) == 2) return *(unsigned short*)&e;
    return *(unsigned char*)&e;
}
template <class E> __device__ __forceinline__ E from_bits(u32 b) {
    E e;
    if (sizeof(E) == 2) *(unsigned short*)&e = (unsigned short)b;
    else *(unsigned char*)&e = (unsigned char)b;
    return e;
}

// f16, bf16 (a compare-and-swap loop on the aligned 32-bit word that holds the element: the
// native 16-bit float atomics need sm_70 for f16 and sm_90 for bf16, and rounding here is
// the same round-to-nearest-even conversion every other kernel uses), u8 and bool (bool
// `+=` is OR, through the u8 compute type as on the CPU). The neighbour bytes of the word
// are preserved by the CAS.
template <class E> __device__ __forceinline__ void add_to(E* p, E v) {
    const u64 addr = (u64)p;
    unsigned int* word = (unsigned int*)(addr & ~3ull);
    const u32 shift = (u32)(addr & 3ull) * 8u;
    const u32 mask = (sizeof(E) == 2 ? 0xffffu : 0xffu) << shift;
    const C add = Ty<E>::load(v);
    u32 old = *word, assumed;
    do {
        assumed = old;
        const E cur = from_bits<E>((assumed & mask) >> shift);
        const E next = Ty<E>::store((C)(Ty<E>::load(cur) + add));
        const u32 replaced = (assumed & ~mask) | ((bits_of(next) << shift) & mask);
        old = atomicCAS(word, assumed, replaced);
    } while (old != assumed);
}

extern "C" __global__ void scatter_add(const Args a) {
    if (index_faulted()) return;
    const i64* idx = (const i64*)a.p[0];
    const T* src = (const T*)a.p[1];
    T* y = (T*)a.p[2];
    const i64 along = (i64)a.u[1];
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 off[3];
        offsets<3>(a, i, off);
        const i64 t = idx[off[0]];
        if (t >= 0 && (u64)t < a.u[0]) add_to(y + off[2] + t * along, src[off[1]]);
    }
}

// ---- cumsum --------------------------------------------------------------------------------
// Geometry (ops/index.rs): n = lines (positions off the scanned dim), their merged shape in
// shape[0..ndim] with strides st[0] (x) and st[1] (y); st[2][0] and st[3][0] are the strides
// of x and y along the scanned dim and u[0] its length. Sums run in the CPU backend's
// accumulator type: f64 for f32 and f64, f32 for f16/bf16, the (wrapping) integer itself.

#if !IS_BOOL
#if IS_FLOAT
#if IS_DOUBLE_ACC
typedef double Acc;
#else
typedef float Acc;
#endif
__device__ __forceinline__ Acc acc_add(Acc a, Acc b) { return a + b; }
#else
typedef C Acc;
__device__ __forceinline__ Acc acc_add(Acc a, Acc b) { return (Acc)((u64)a + (u64)b); }
#endif

// One thread per line, walking it in order: for many short lines.
extern "C" __global__ void cumsum_lines(const Args a) {
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    const i64 sx = a.st[2][0], sy = a.st[3][0], steps = (i64)a.u[0];
    for (u64 line = gtid(); line < a.n; line += gstride()) {
        i64 off[2];
        offsets<2>(a, line, off);
        Acc s = (Acc)0;
        for (i64 j = 0; j < steps; ++j) {
            s = acc_add(s, (Acc)TT::load(x[off[0] + j * sx]));
            y[off[1] + j * sy] = TT::store((C)s);
        }
    }
}

// One block per line, for long lines: chunks of blockDim.x * SCAN_K elements, each thread
// scanning SCAN_K consecutive ones, a warp-shuffle scan of the thread totals, then a scan of
// the warp totals, carrying the running sum from chunk to chunk. The additions are grouped
// differently from a sequential walk (within the accumulated tolerance; exact for integers).
#define SCAN_K 4
template <class V> __device__ __forceinline__ V shfl_up(V v, int d) { return __shfl_up_sync(0xffffffffu, v, d); }
__device__ __forceinline__ u8 shfl_up(u8 v, int d) { return (u8)__shfl_up_sync(0xffffffffu, (int)v, d); }

extern "C" __global__ void __launch_bounds__(1024) cumsum_scan(const Args a) {
    __shared__ Acc warp_tot[32];
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    const i64 sx = a.st[2][0], sy = a.st[3][0], steps = (i64)a.u[0];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (u64 line = blockIdx.x; line < a.n; line += gridDim.x) {
        i64 off[2];
        offsets<2>(a, line, off);
        Acc carry = (Acc)0;
        for (i64 base = 0; base < steps; base += (i64)blockDim.x * SCAN_K) {
            const i64 j0 = base + (i64)threadIdx.x * SCAN_K;
            Acc v[SCAN_K];
            Acc run = (Acc)0;
#pragma unroll
            for (int k = 0; k < SCAN_K; ++k) {
                const Acc e = j0 + k < steps ? (Acc)TT::load(x[off[0] + (j0 + k) * sx]) : (Acc)0;
                run = acc_add(run, e);
                v[k] = run;
            }
            // Inclusive scan of the thread totals within the warp.
            Acc incl = run;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const Acc o = shfl_up(incl, d);
                if (lane >= d) incl = acc_add(incl, o);
            }
            if (lane == 31) warp_tot[warp] = incl;
            __syncthreads();
            if (warp == 0) {
                Acc t = lane < warps ? warp_tot[lane] : (Acc)0;
#pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    const Acc o = shfl_up(t, d);
                    if (lane >= d) t = acc_add(t, o);
                }
                if (lane < warps) warp_tot[lane] = t;  // inclusive over warps
            }
            __syncthreads();
            Acc before = warp > 0 ? acc_add(carry, warp_tot[warp - 1]) : carry;
            // Exclusive prefix of this thread within its warp: inclusive minus own total.
            const Acc excl_lane = shfl_up(incl, 1);
            if (lane > 0) before = acc_add(before, excl_lane);
#pragma unroll
            for (int k = 0; k < SCAN_K; ++k)
                if (j0 + k < steps) y[off[1] + (j0 + k) * sy] = TT::store((C)acc_add(before, v[k]));
            carry = acc_add(carry, warp_tot[warps - 1]);
            __syncthreads();  // warp_tot is rewritten by the next chunk
        }
    }
}
#endif
