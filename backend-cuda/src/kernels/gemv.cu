// Matrix products with one or two rows, y (m, n) = a (m, k) · wᵀ, where w is (n, k) with unit
// stride along k: a linear layer's weight read as it is stored. A decode step of one or two
// sequences is made of these, bound by reading w once, which cuBLAS's general kernels do at
// well under the memory bandwidth for such shapes.
//
// A block of 8 warps computes `rows` consecutive outputs j (rows = 8 / slices). Each output
// belongs to `slices` warps, which split k in interleaved chunks of 32 packs (one 16-byte
// load per lane) so that a short row still gives every warp whole loads; the partial sums
// meet in shared memory and are added in slice order, so results do not depend on timing.
// Operands are packed: k, lda and ldw are multiples of the pack and a and w are 16-byte
// aligned (the launcher checks; other shapes go to cuBLAS).

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

#define V (16 / (int)sizeof(T))
typedef Pack<T, V> P;
#define WARPS 8

struct GemvArgs {
    char* a;     // (m, k), row stride lda
    char* w;     // (n, k), row stride ldw
    char* y;     // (m, n), strides ys0, ys1
    i64 lda, ldw, ys0, ys1;
    int m, n, k;
    int slices;  // warps per output: 1, 2, 4 or 8
};

// A pack of w, which is read once: loaded past L1 (the non-coherent path, not kept there), so
// that L1 keeps the rows of a that every warp reads.
__device__ __forceinline__ P load_weight(const T* p) {
    union {
        unsigned int u[4];
        P p;
    } r;
#if __CUDA_ARCH__ >= 700
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3])
        : "l"(p));
#else
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.u[0]), "=r"(r.u[1]), "=r"(r.u[2]), "=r"(r.u[3])
        : "l"(p));
#endif
    return r.p;
}

// Packs of w each lane has in flight before it multiplies: a warp's reads are short (a few
// packs per lane at k = 896), so they are issued together rather than one latency at a time.
#define U 4

// M is the compile-time bound on m (the accumulators live in registers).
template <int M> __device__ __forceinline__ void gemv(const GemvArgs& g) {
    __shared__ C partial[WARPS][M];
    const T* a = (const T*)g.a;
    const T* w = (const T*)g.w;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = WARPS / g.slices, slice = warp % g.slices;
    const i64 j = (i64)blockIdx.x * rows + warp / g.slices;
    C acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = (C)0;
    if (j < g.n) {
        const T* wj = w + j * g.ldw;
        const int step = 32 * V * g.slices;
        for (int base = (slice * 32 + lane) * V; base < g.k; base += U * step) {
            P pw[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (base + u * step < g.k) pw[u] = load_weight(wj + base + u * step);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = base + u * step;
                if (i < g.k) {
#pragma unroll
                    for (int r = 0; r < M; ++r) {
                        if (r < g.m) {
                            const P pa = *(const P*)(a + r * g.lda + i);
#pragma unroll
                            for (int v = 0; v < V; ++v) acc[r] += TT::load(pw[u].v[v]) * TT::load(pa.v[v]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < M; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();
    // One thread per (output, row of a): the slices of output `t / M`, added in order.
    const int t = threadIdx.x, local = t / M, r = t % M;
    const i64 jo = (i64)blockIdx.x * rows + local;
    if (local < rows && r < g.m && jo < g.n) {
        C sum = (C)0;
        for (int s = 0; s < g.slices; ++s) sum += partial[local * g.slices + s][r];
        ((T*)g.y)[r * g.ys0 + jo * g.ys1] = TT::store(sum);
    }
}

extern "C" __global__ void gemv_1(const GemvArgs g) { gemv<1>(g); }
extern "C" __global__ void gemv_2(const GemvArgs g) { gemv<2>(g); }
