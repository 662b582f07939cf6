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
//
// `gemv_norm_{1,2}` (AddRmsNormLinear) first make the rows they multiply: each block adds x
// and the residual, takes the RMS norm of the sum and keeps the normed rows in shared memory,
// rounded to T exactly as the add_rms_norm kernel stores them, so the product is the one the
// separate ops would give. Every block does this for its own use (a row is a few KiB, read
// from L2); block 0 also stores the sum, the residual stream that goes on. The bias is added
// to the rounded product and rounded again, as the add op would; `gemv_norm_glu_{1,2}` read a
// gate row and an up row per output and store silu(gate) · up as the swiglu kernel does.

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

#define V (16 / (int)sizeof(T))
typedef Pack<T, V> P;
#define WARPS 8

struct GemvArgs {
    char* a;     // (m, k), row stride lda; gemv_norm: x
    char* w;     // (n, k), row stride ldw
    char* y;     // (m, n), strides ys0, ys1
    char* bias;  // (n) with unit stride, or null
    char* res;   // gemv_norm: the residual (m, k), row stride ldr
    char* g;     // gemv_norm: the norm's weight (k), unit stride
    char* sum;   // gemv_norm: x + residual (m, k), row stride lds
    i64 lda, ldw, ys0, ys1, ldr, lds;
    double eps;  // gemv_norm: added to the mean square
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

// The rows gemv_norm multiplies, in shared memory (m rows of k, dense).
extern __shared__ __align__(16) unsigned char normed_rows[];

// h = rms_norm(x + residual) · g for the m rows, into normed_rows; block 0 stores the sums.
// The sum of squares is reduced in a fixed order (lanes, then warps in order).
template <int M> __device__ __forceinline__ void norm_rows(const GemvArgs& g) {
    __shared__ C squares[WARPS][M];
    T* h = (T*)normed_rows;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, packs = g.k / V;
    C ss[M];
#pragma unroll
    for (int r = 0; r < M; ++r) {
        ss[r] = (C)0;
        if (r < g.m) {
            for (int p = threadIdx.x; p < packs; p += blockDim.x) {
                const P x = *(const P*)((const T*)g.a + r * g.lda + p * V);
                const P res = *(const P*)((const T*)g.res + r * g.ldr + p * V);
                P s;
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    s.v[v] = TT::store(TT::load(x.v[v]) + TT::load(res.v[v]));
                    const C c = TT::load(s.v[v]);
                    ss[r] += c * c;
                }
                *(P*)(h + r * g.k + p * V) = s;
                if (blockIdx.x == 0) *(P*)((T*)g.sum + r * g.lds + p * V) = s;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], o);
        if (lane == 0) squares[warp][r] = ss[r];
    }
    __syncthreads();
    C rstd[M];
#pragma unroll
    for (int r = 0; r < M; ++r) {
        C total = (C)0;
        for (int u = 0; u < WARPS; ++u) total += squares[u][r];
        rstd[r] = (C)1 / csqrt(total / (C)g.k + (C)g.eps);
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
        if (r < g.m) {
            for (int p = threadIdx.x; p < packs; p += blockDim.x) {
                P s = *(P*)(h + r * g.k + p * V);
                const P gw = *(const P*)((const T*)g.g + p * V);
#pragma unroll
                for (int v = 0; v < V; ++v) s.v[v] = TT::store(TT::load(s.v[v]) * rstd[r] * TT::load(gw.v[v]));
                *(P*)(h + r * g.k + p * V) = s;
            }
        }
    }
    __syncthreads();
}

// M is the compile-time bound on m (the accumulators live in registers). NORM: the rows are
// made by norm_rows. G: weight rows per output, 2 for a gated output (its gate row j and up
// row j + n), which the epilogue turns into silu(gate) · up.
template <int M, bool NORM, int G> __device__ __forceinline__ void gemv(const GemvArgs& g) {
    __shared__ C partial[WARPS][G * M];
    const T* w = (const T*)g.w;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = WARPS / g.slices, slice = warp % g.slices;
    const i64 j = (i64)blockIdx.x * rows + warp / g.slices;
    // Launched early (`launch_with(.., true)`): the blocks are in place when the
    // kernel ahead ends, and the next kernel's may come in while this one streams its weights.
    wait_previous();
    start_next();
    if (NORM) norm_rows<M>(g);
    const T* a = NORM ? (const T*)normed_rows : (const T*)g.a;
    const i64 lda = NORM ? (i64)g.k : g.lda;
    C acc[G][M];
#pragma unroll
    for (int q = 0; q < G; ++q)
#pragma unroll
        for (int r = 0; r < M; ++r) acc[q][r] = (C)0;
    if (j < g.n) {
        const int step = 32 * V * g.slices;
        for (int base = (slice * 32 + lane) * V; base < g.k; base += U * step) {
            P pw[G][U];
#pragma unroll
            for (int q = 0; q < G; ++q)
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (base + u * step < g.k) pw[q][u] = load_weight(w + (j + q * g.n) * g.ldw + base + u * step);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = base + u * step;
                if (i < g.k) {
#pragma unroll
                    for (int r = 0; r < M; ++r) {
                        if (r < g.m) {
                            const P pa = *(const P*)(a + r * lda + i);
#pragma unroll
                            for (int q = 0; q < G; ++q)
#pragma unroll
                                for (int v = 0; v < V; ++v) acc[q][r] += TT::load(pw[q][u].v[v]) * TT::load(pa.v[v]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int q = 0; q < G; ++q)
#pragma unroll
        for (int r = 0; r < M; ++r) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[q][r] += __shfl_xor_sync(0xffffffffu, acc[q][r], o);
        }
    if (lane == 0) {
#pragma unroll
        for (int q = 0; q < G; ++q)
#pragma unroll
            for (int r = 0; r < M; ++r) partial[warp][q * M + r] = acc[q][r];
    }
    __syncthreads();
    // One thread per (output, row of a): the slices of output `t / M`, added in order, each
    // result rounded as the ops it stands for store theirs.
    const int t = threadIdx.x, local = t / M, r = t % M;
    const i64 jo = (i64)blockIdx.x * rows + local;
    if (local < rows && r < g.m && jo < g.n) {
        C out[G];
#pragma unroll
        for (int q = 0; q < G; ++q) {
            C sum = (C)0;
            for (int s = 0; s < g.slices; ++s) sum += partial[local * g.slices + s][q * M + r];
            if (g.bias) sum = TT::load(TT::store(sum)) + TT::load(((const T*)g.bias)[jo + q * g.n]);
            out[q] = TT::load(TT::store(sum));
        }
        C y = out[0];
        if (G == 2) y = out[0] * ((C)1 / ((C)1 + exp(-out[0]))) * out[G - 1];  // swiglu.cu's arithmetic
        ((T*)g.y)[r * g.ys0 + jo * g.ys1] = TT::store(y);
    }
}

extern "C" __global__ void gemv_1(const GemvArgs g) { gemv<1, false, 1>(g); }
extern "C" __global__ void gemv_2(const GemvArgs g) { gemv<2, false, 1>(g); }
extern "C" __global__ void gemv_norm_1(const GemvArgs g) { gemv<1, true, 1>(g); }
extern "C" __global__ void gemv_norm_2(const GemvArgs g) { gemv<2, true, 1>(g); }
extern "C" __global__ void gemv_norm_glu_1(const GemvArgs g) { gemv<1, true, 2>(g); }
extern "C" __global__ void gemv_norm_glu_2(const GemvArgs g) { gemv<2, true, 2>(g); }
