// SwiGLU for float type T, in the compute type C (f32 for f16/bf16), with s = sigmoid(g):
//   swiglu_fwd   y = g s u
//   swiglu_bwd   dgate = dy u s (1 + g (1 - s)),   dup = dy g s
// Operands are rows of d contiguous elements, each operand with its own row stride (the
// gate and up halves of one stacked projection are such views). When `packed` (d and every
// row stride a multiple of the pack, every address 16-byte aligned), each step handles one
// 16-byte pack per operand.

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

struct SwiGluArgs {
    char* p[5];  // forward: gate, up, y; backward: dy, gate, up, dgate, dup
    u64 n;       // elements
    u64 d;       // row length
    i64 rs[5];   // row stride of each operand, in elements
    int packed;  // see above
};

// Element offset of linear position i in operand k.
__device__ __forceinline__ i64 at(const SwiGluArgs& a, int k, u64 i) {
    const u64 row = i / a.d;
    return (i64)row * a.rs[k] + (i64)(i - row * a.d);
}

#define V (16 / (int)sizeof(T))
typedef Pack<T, V> P;

__device__ __forceinline__ C sigmoid_of(C x) { return (C)1 / ((C)1 + exp(-x)); }

__device__ __forceinline__ T forward(T g, T u) {
    const C x = TT::load(g);
    return TT::store(x * sigmoid_of(x) * TT::load(u));
}

__device__ __forceinline__ void backward(T dy, T g, T u, T& dg, T& du) {
    const C d = TT::load(dy), x = TT::load(g), s = sigmoid_of(x);
    du = TT::store(d * x * s);
    dg = TT::store(d * TT::load(u) * s * ((C)1 + x * ((C)1 - s)));
}

extern "C" __global__ void swiglu_fwd(const SwiGluArgs a) {
    const T* g = (const T*)a.p[0];
    const T* u = (const T*)a.p[1];
    T* y = (T*)a.p[2];
    if (a.packed) {
        for (u64 j = gtid(); j < a.n / V; j += gstride()) {
            const u64 i = j * V;
            const P pg = *(const P*)(g + at(a, 0, i)), pu = *(const P*)(u + at(a, 1, i));
            P py;
#pragma unroll
            for (int k = 0; k < V; ++k) py.v[k] = forward(pg.v[k], pu.v[k]);
            *(P*)(y + at(a, 2, i)) = py;
        }
    } else {
        for (u64 i = gtid(); i < a.n; i += gstride()) y[at(a, 2, i)] = forward(g[at(a, 0, i)], u[at(a, 1, i)]);
    }
}

extern "C" __global__ void swiglu_bwd(const SwiGluArgs a) {
    const T* dy = (const T*)a.p[0];
    const T* g = (const T*)a.p[1];
    const T* u = (const T*)a.p[2];
    T* dg = (T*)a.p[3];
    T* du = (T*)a.p[4];
    if (a.packed) {
        for (u64 j = gtid(); j < a.n / V; j += gstride()) {
            const u64 i = j * V;
            const P pd = *(const P*)(dy + at(a, 0, i)), pg = *(const P*)(g + at(a, 1, i));
            const P pu = *(const P*)(u + at(a, 2, i));
            P pdg, pdu;
#pragma unroll
            for (int k = 0; k < V; ++k) backward(pd.v[k], pg.v[k], pu.v[k], pdg.v[k], pdu.v[k]);
            *(P*)(dg + at(a, 3, i)) = pdg;
            *(P*)(du + at(a, 4, i)) = pdu;
        }
    } else {
        for (u64 i = gtid(); i < a.n; i += gstride())
            backward(dy[at(a, 0, i)], g[at(a, 1, i)], u[at(a, 2, i)], dg[at(a, 3, i)], du[at(a, 4, i)]);
    }
}
