// Copies and casts from T: `copy_s` (same type, any strides), `copy_w*` (same type, rows
// unit-stride in both views, in words), `copy_t` (same type, a transposed plane) and
// `cast_to_<dtype>_s` / `_c` (strided; dense, in packs of 16 bytes of T when aligned).
// Casts go through f64 like the CPU backend (floats to integers truncate and saturate, NaN
// gives 0), except integer to integer, which wraps (keeps the low bits, as PyTorch does) and
// is exact for every i64; to bool is `!= 0`; a cast to T itself is a plain copy.

extern "C" __global__ void copy_s(const Args a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[2];
        offsets<2>(a, i, o);
        ((T*)a.p[1])[o[1]] = ((const T*)a.p[0])[o[0]];
    }
}

// Same-type copy in W-byte words (W = 16, 8 or 4, wider than T): the views' innermost dim is
// unit-stride in both, and the launcher has rescaled the geometry from elements to words
// (ops/elementwise.rs, `copy`). A row-strided copy, such as joining the q/k/v gradients into
// one stacked buffer, then moves 16 bytes per index computation instead of 2 or 4.
template <typename W> __device__ __forceinline__ void copy_words(const Args& a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[2];
        offsets<2>(a, i, o);
        ((W*)a.p[1])[o[1]] = ((const W*)a.p[0])[o[0]];
    }
}
extern "C" __global__ void copy_w16(const Args a) { copy_words<uint4>(a); }
extern "C" __global__ void copy_w8(const Args a) { copy_words<uint2>(a); }
extern "C" __global__ void copy_w4(const Args a) { copy_words<unsigned>(a); }

// Transposing copy: y's unit-stride dim `da` (u[0]) is not x's `db` (u[1]), so the strided
// kernel above keeps one side coalesced and makes the other touch a 32-byte sector per
// element (well below copy bandwidth; RESULTS.md). Here a block moves one TILE×TILE
// tile of the (da, db) plane: read along db into shared memory, written along da. The
// other dims are a batch of planes. Rows are padded so that the column reads hit distinct
// banks for every element size.
extern "C" __global__ void copy_t(const Args a) {
    constexpr int TILE = sizeof(T) >= 4 ? 32 : 64;
    constexpr int ROWS = 256 / TILE;
    constexpr int PAD = sizeof(T) >= 4 ? 1 : 4 / (int)sizeof(T);
    __shared__ T tile[TILE][TILE + PAD];
    const int da = (int)a.u[0], db = (int)a.u[1];
    const i64 na = a.shape[da], nb = a.shape[db];
    const i64 xa = a.st[0][da], xb = a.st[0][db], ya = a.st[1][da], yb = a.st[1][db];
    const u64 ta = (u64)(na + TILE - 1) / TILE, tb = (u64)(nb + TILE - 1) / TILE;
    const u64 tiles = ta * tb * (a.n / (u64)(na * nb));
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    for (u64 t = blockIdx.x; t < tiles; t += gridDim.x) {
        u64 rest = t / tb;
        const i64 b0 = (i64)(t - rest * tb) * TILE;
        u64 plane = rest / ta;
        const i64 a0 = (i64)(rest - plane * ta) * TILE;
        i64 ox = 0, oy = 0;
        for (int d = a.ndim - 1; d >= 0; --d) {
            if (d == da || d == db) continue;
            u64 sz = (u64)a.shape[d], q = plane / sz;
            i64 c = (i64)(plane - q * sz);
            plane = q;
            ox += c * a.st[0][d];
            oy += c * a.st[1][d];
        }
        for (int r = ty; r < TILE; r += ROWS) {
            i64 ga = a0 + r, gb = b0 + tx;
            if (ga < na && gb < nb) tile[r][tx] = x[ox + ga * xa + gb * xb];
        }
        __syncthreads();
        for (int r = ty; r < TILE; r += ROWS) {
            i64 ga = a0 + tx, gb = b0 + r;
            if (ga < na && gb < nb) y[oy + ga * ya + gb * yb] = tile[tx][r];
        }
        __syncthreads();
    }
}

template <class A, class B> struct Same { static const bool v = false; };
template <class A> struct Same<A, A> { static const bool v = true; };
template <class A> struct IsInt { static const bool v = false; };
template <> struct IsInt<i64> { static const bool v = true; };
template <> struct IsInt<int> { static const bool v = true; };
template <> struct IsInt<u8> { static const bool v = true; };
// Integer to integer, modulo 2^bits (two's complement low bits). A template of its own so
// that the float element types never instantiate it.
template <class O, class I> __device__ __forceinline__ O wrap_int(I v) { return (O)(unsigned long long)(i64)v; }

template <class O> __device__ __forceinline__ O cast_one(T v) {
    if constexpr (Same<O, T>::v) {
        return v;
    } else if constexpr (Same<O, bool8>::v) {
        bool8 r;
        r.x = TT::to_d(v) != 0.0;
        return r;
    } else if constexpr (IsInt<T>::v && IsInt<O>::v) {
        return wrap_int<O>(v);
    } else if constexpr (Same<typename TT::C, float>::v && Same<typename Ty<O>::C, float>::v) {
        // f32, f16 and bf16 among themselves: widening to f32 is exact, so one rounding
        // from f32 is the rounding from f64 (and costs no f64 conversions).
        return Ty<O>::store(TT::load(v));
    } else {
        return Ty<O>::from_d(TT::to_d(v));
    }
}

#define CAST(NAME, O)                                                           \
    extern "C" __global__ void cast_to_##NAME##_s(const Args a) {              \
        for (u64 i = gtid(); i < a.n; i += gstride()) {                         \
            i64 o[2];                                                           \
            offsets<2>(a, i, o);                                                \
            ((O*)a.p[1])[o[1]] = cast_one<O>(((const T*)a.p[0])[o[0]]);        \
        }                                                                       \
    }                                                                           \
    extern "C" __global__ void cast_to_##NAME##_c(const Args a) {              \
        const T* x = (const T*)a.p[0];                                          \
        O* y = (O*)a.p[1];                                                      \
        contiguous(a, VW, [&](u64 i) { y[i] = cast_one<O>(x[i]); }, [&](u64 i) { \
            const Pack<T, VW> p = *(const Pack<T, VW>*)(x + i);                 \
            Pack<O, VW> q;                                                      \
            _Pragma("unroll") for (int k = 0; k < (int)VW; ++k) q.v[k] = cast_one<O>(p.v[k]); \
            *(Pack<O, VW>*)(y + i) = q;                                         \
        });                                                                     \
    }

CAST(float32, float) CAST(float64, double) CAST(float16, h16) CAST(bfloat16, b16) CAST(int64, i64)
CAST(int32, int) CAST(uint8, u8) CAST(bool, bool8)
