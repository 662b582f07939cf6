// Multi-tensor AdamW, in place, for parameters of type T (the module's element type) and
// moments of type T (`_same` kernels) or f32 (`_f32` kernels). PyTorch's update rule in the
// compute type C (f32 for f16/bf16/f32, f64 for f64), in the CPU reference's order:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g g;  p = p decay - step_size m / (sqrt(v)/bc2_sqrt + eps)
// with decay = 1 - lr wd, step_size = lr / (1 - b1^step), bc2_sqrt = sqrt(1 - b2^step), all
// computed in f64 on the host and rounded to C here.

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

// Hyperparameters in f64, by index.
#define H_DECAY 0
#define H_B1 1
#define H_B2 2
#define H_ONE_B1 3
#define H_ONE_B2 4
#define H_STEP 5
#define H_BC2 6
#define H_EPS 7

struct Hyper {
    C decay, b1, b2, one_b1, one_b2, step, bc2, eps, scale;
};
// `scale`: the address of the f32 every gradient is multiplied by, or 0 for none.
__device__ __forceinline__ Hyper hyper(const double* h, u64 scale) {
    Hyper r;
    r.scale = scale ? (C)(*(const float*)scale) : (C)1;
    r.decay = (C)h[H_DECAY];
    r.b1 = (C)h[H_B1];
    r.b2 = (C)h[H_B2];
    r.one_b1 = (C)h[H_ONE_B1];
    r.one_b2 = (C)h[H_ONE_B2];
    r.step = (C)h[H_STEP];
    r.bc2 = (C)h[H_BC2];
    r.eps = (C)h[H_EPS];
    return r;
}

// Moment storage <-> C. Moments are T or f32; f32 moments of f64 parameters round once.
__device__ __forceinline__ C get(float v) { return (C)v; }
__device__ __forceinline__ C get(double v) { return (C)v; }
__device__ __forceinline__ C get(h16 v) { return Ty<h16>::load(v); }
__device__ __forceinline__ C get(b16 v) { return Ty<b16>::load(v); }
__device__ __forceinline__ void put(float& o, C c) { o = (float)c; }
__device__ __forceinline__ void put(double& o, C c) { o = (double)c; }
__device__ __forceinline__ void put(h16& o, C c) { o = Ty<h16>::store((float)c); }
__device__ __forceinline__ void put(b16& o, C c) { o = Ty<b16>::store((float)c); }

template <class M> __device__ __forceinline__ void update(const Hyper& h, T g, T& p, M& m, M& v) {
    C gc = TT::load(g) * h.scale;
    C mc = h.b1 * get(m) + h.one_b1 * gc;
    C vc = h.b2 * get(v) + h.one_b2 * gc * gc;
    C pc = TT::load(p) * h.decay - h.step * mc / (csqrt(vc) / h.bc2 + h.eps);
    p = TT::store(pc);
    put(m, mc);
    put(v, vc);
}

// One tensor of a multi-tensor launch (mirror of `Entry` in ops/adamw.rs): dense operands of
// n elements; its chunks are chunk0.. of the launch. aligned: every address is aligned for
// packs of 4 elements.
struct Entry {
    char* g;
    char* p;
    char* m;
    char* v;
    u64 n;
    u64 chunk0;
    u64 aligned;
};

// The table travels in the kernel parameter (4 KiB at most), so a launch needs no host to
// device copy; ops/adamw.rs issues one launch per MAX_ENTRIES tensors.
#define MAX_ENTRIES 64
struct TableArgs {
    double h[8];         // hyperparameters
    u64 scale;           // the gradient scale's address, 0 for none
    u64 count;           // entries used
    u64 chunks;          // total chunks
    Entry e[MAX_ENTRIES];  // by chunk0 ascending
};

// One strided tensor: the elementwise geometry and the gradient scale's address (0 for none).
struct StridedArgs {
    Args a;
    u64 scale;
};

#define CHUNK 4096  // elements per chunk (a multiple of the pack of 4)

template <class E, int N> struct alignas(sizeof(E) * N) P4 { E v[N]; };

// Blocks stride over the chunks of all tensors; each chunk finds its tensor by binary search
// of chunk0. Streams every operand once: memory bound.
template <class M> __device__ void adamw_table(const TableArgs& a) {
    const Hyper h = hyper(a.h, a.scale);
    for (u64 c = blockIdx.x; c < a.chunks; c += gridDim.x) {
        u64 lo = 0, hi = a.count - 1;
        while (lo < hi) {  // the last entry with chunk0 <= c
            u64 mid = (lo + hi + 1) / 2;
            if (a.e[mid].chunk0 <= c) lo = mid;
            else hi = mid - 1;
        }
        const Entry e = a.e[lo];
        const u64 start = (c - e.chunk0) * CHUNK;
        const u64 end = start + CHUNK < e.n ? start + CHUNK : e.n;
        T* g = (T*)e.g;
        T* p = (T*)e.p;
        M* m = (M*)e.m;
        M* v = (M*)e.v;
        u64 tail = start;
        if (e.aligned) {
            const u64 packs_end = start + (end - start) / 4 * 4;
            for (u64 i = start + 4 * (u64)threadIdx.x; i < packs_end; i += 4 * (u64)blockDim.x) {
                P4<T, 4> gp = *(const P4<T, 4>*)(g + i), pp = *(const P4<T, 4>*)(p + i);
                P4<M, 4> mp = *(const P4<M, 4>*)(m + i), vp = *(const P4<M, 4>*)(v + i);
#pragma unroll
                for (int k = 0; k < 4; ++k) update<M>(h, gp.v[k], pp.v[k], mp.v[k], vp.v[k]);
                *(P4<T, 4>*)(p + i) = pp;
                *(P4<M, 4>*)(m + i) = mp;
                *(P4<M, 4>*)(v + i) = vp;
            }
            tail = packs_end;
        }
        for (u64 i = tail + threadIdx.x; i < end; i += blockDim.x) update<M>(h, g[i], p[i], m[i], v[i]);
    }
}

// One strided tensor: Args geometry over g (st[0]), p (st[1]), m (st[2]), v (st[3]);
// s[] = decay, b1, b2, eps; u[] = the f64 bits of step_size and bc2_sqrt; and the scale.
template <class M> __device__ void adamw_strided(const StridedArgs& sa) {
    const Args& a = sa.a;
    double hd[8] = {a.s[0], a.s[1], a.s[2], 1.0 - a.s[1], 1.0 - a.s[2],
                    __longlong_as_double((long long)a.u[0]), __longlong_as_double((long long)a.u[1]), a.s[3]};
    const Hyper h = hyper(hd, sa.scale);
    const T* g = (const T*)a.p[0];
    T* p = (T*)a.p[1];
    M* m = (M*)a.p[2];
    M* v = (M*)a.p[3];
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 off[4];
        offsets<4>(a, i, off);
        update<M>(h, g[off[0]], p[off[1]], m[off[2]], v[off[3]]);
    }
}

extern "C" __global__ void adamw_same(const TableArgs a) { adamw_table<T>(a); }
extern "C" __global__ void adamw_f32(const TableArgs a) { adamw_table<float>(a); }
extern "C" __global__ void adamw_same_s(const StridedArgs a) { adamw_strided<T>(a); }
extern "C" __global__ void adamw_f32_s(const StridedArgs a) { adamw_strided<float>(a); }
