// Elementwise kernels for one element type T: unary, binary (tensor and scalar), clamp,
// where, fill and arange. Op codes are the discriminants of UnaryOp / BinaryOp in the
// interface. Each op has a contiguous kernel (`_c`: a grid-stride loop over packs of V
// elements when the launcher says every operand is aligned for it, single elements
// otherwise) and a strided one (`_s`: any strides, broadcast inputs have stride 0).

typedef ELEM T;  // the module's element type (a macro named T would reach NVRTC's headers)
typedef Ty<T> TT;
typedef typename TT::C C;

// Elements per pack: 16 bytes of the widest operand.
#define VW (16 / (sizeof(T) > 1 ? sizeof(T) : 1))

// Contiguous loop: f(i) for single elements, fv(i) for a pack starting at i.
template <class F1, class FV> __device__ __forceinline__ void contiguous(const Args& a, int v, F1 f1, FV fv) {
    u64 n = a.n;
    if (a.flag & 2) {  // aligned: packs first, then the tail
        u64 packs = n / v;
        for (u64 j = gtid(); j < packs; j += gstride()) fv(j * v);
        for (u64 i = packs * v + gtid(); i < n; i += gstride()) f1(i);
    } else {
        for (u64 i = gtid(); i < n; i += gstride()) f1(i);
    }
}

// ---- unary ---------------------------------------------------------------------------------

template <int OP> __device__ __forceinline__ float ufn(float x) {
    switch (OP) {
        case 0: return -x;
        case 1: return fabsf(x);
        case 2: return expf(x);
        case 3: return logf(x);
        case 4: return sqrtf(x);
        case 5: return 1.0f / sqrtf(x);
        case 6: return sinf(x);
        case 7: return cosf(x);
        case 8: return tanhf(x);
        case 9: return 1.0f / (1.0f + expf(-x));
        case 10: return (x > 0.0f || x != x) ? x : 0.0f;
        case 11: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
        case 12: {
            float k = 0.79788456080286535588f;
            return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
        }
        case 13: return x / (1.0f + expf(-x));
        case 14: return 1.0f / x;
        case 15: return x * x;
        case 16: return x != x ? x : (x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f));
        case 17: return floorf(x);
        case 18: return ceilf(x);
        case 19: return rintf(x);
        case 20: return erff(x);
        case 21: return log1pf(x);
        case 22: return expm1f(x);
    }
    return x;
}
template <int OP> __device__ __forceinline__ double ufn(double x) {
    switch (OP) {
        case 0: return -x;
        case 1: return fabs(x);
        case 2: return exp(x);
        case 3: return log(x);
        case 4: return sqrt(x);
        case 5: return 1.0 / sqrt(x);
        case 6: return sin(x);
        case 7: return cos(x);
        case 8: return tanh(x);
        case 9: return 1.0 / (1.0 + exp(-x));
        case 10: return (x > 0.0 || x != x) ? x : 0.0;
        case 11: return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
        case 12: {
            double k = 0.79788456080286535588;
            return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
        }
        case 13: return x / (1.0 + exp(-x));
        case 14: return 1.0 / x;
        case 15: return x * x;
        case 16: return x != x ? x : (x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : 0.0));
        case 17: return floor(x);
        case 18: return ceil(x);
        case 19: return rint(x);
        case 20: return erf(x);
        case 21: return log1p(x);
        case 22: return expm1(x);
    }
    return x;
}
// Integers: neg, abs, square and sign, wrapping like the CPU backend.
template <int OP, class I> __device__ __forceinline__ I ufn_int(I x) {
    switch (OP) {
        case 0: return (I)(0ull - (u64)x);
        case 1: return x < (I)0 ? (I)(0ull - (u64)x) : x;
        case 15: return (I)((u64)x * (u64)x);
        case 16: return (I)((x > (I)0) - (x < (I)0));
    }
    return x;
}

template <int OP> __device__ __forceinline__ T unary_one(T v) {
#if IS_FLOAT
    return TT::store(ufn<OP>(TT::load(v)));
#else
    return TT::store(ufn_int<OP>(TT::load(v)));
#endif
}

#define UNARY(NAME, OP)                                                                         \
    extern "C" __global__ void unary_##NAME##_c(const Args a) {                                 \
        const T* x = (const T*)a.p[0];                                                          \
        T* y = (T*)a.p[1];                                                                      \
        contiguous(a, VW, [&](u64 i) { y[i] = unary_one<OP>(x[i]); }, [&](u64 i) {              \
            Pack<T, VW> p = *(const Pack<T, VW>*)(x + i);                                       \
            _Pragma("unroll") for (int k = 0; k < (int)VW; ++k) p.v[k] = unary_one<OP>(p.v[k]); \
            *(Pack<T, VW>*)(y + i) = p;                                                         \
        });                                                                                     \
    }                                                                                           \
    extern "C" __global__ void unary_##NAME##_s(const Args a) {                                 \
        for (u64 i = gtid(); i < a.n; i += gstride()) {                                         \
            i64 o[2];                                                                           \
            offsets<2>(a, i, o);                                                                \
            ((T*)a.p[1])[o[1]] = unary_one<OP>(((const T*)a.p[0])[o[0]]);                       \
        }                                                                                       \
    }

#if IS_FLOAT
UNARY(neg, 0) UNARY(abs, 1) UNARY(exp, 2) UNARY(log, 3) UNARY(sqrt, 4) UNARY(rsqrt, 5) UNARY(sin, 6)
UNARY(cos, 7) UNARY(tanh, 8) UNARY(sigmoid, 9) UNARY(relu, 10) UNARY(gelu, 11) UNARY(gelu_tanh, 12)
UNARY(silu, 13) UNARY(reciprocal, 14) UNARY(square, 15) UNARY(sign, 16) UNARY(floor, 17) UNARY(ceil, 18)
UNARY(round, 19) UNARY(erf, 20) UNARY(log1p, 21) UNARY(expm1, 22)
#elif IS_INT
UNARY(neg, 0) UNARY(abs, 1) UNARY(square, 15) UNARY(sign, 16)
#endif

// isnan (any type, bool out) and logical_not (bool).
__device__ __forceinline__ bool8 isnan_one(T v) {
    bool8 r;
#if IS_FLOAT
    C c = TT::load(v);
    r.x = c != c;
#else
    r.x = 0;
#endif
    return r;
}
extern "C" __global__ void unary_isnan_c(const Args a) {
    const T* x = (const T*)a.p[0];
    bool8* y = (bool8*)a.p[1];
    for (u64 i = gtid(); i < a.n; i += gstride()) y[i] = isnan_one(x[i]);
}
extern "C" __global__ void unary_isnan_s(const Args a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[2];
        offsets<2>(a, i, o);
        ((bool8*)a.p[1])[o[1]] = isnan_one(((const T*)a.p[0])[o[0]]);
    }
}
#if IS_BOOL
__device__ __forceinline__ bool8 not_one(bool8 v) { bool8 r; r.x = v.x == 0; return r; }
extern "C" __global__ void unary_logical_not_c(const Args a) {
    const bool8* x = (const bool8*)a.p[0];
    bool8* y = (bool8*)a.p[1];
    for (u64 i = gtid(); i < a.n; i += gstride()) y[i] = not_one(x[i]);
}
extern "C" __global__ void unary_logical_not_s(const Args a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[2];
        offsets<2>(a, i, o);
        ((bool8*)a.p[1])[o[1]] = not_one(((const bool8*)a.p[0])[o[0]]);
    }
}
#endif

// ---- binary --------------------------------------------------------------------------------

__device__ __forceinline__ float frem(float a, float b) {
    float r = fmodf(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
__device__ __forceinline__ double frem(double a, double b) {
    double r = fmod(a, b);
    return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}
template <class I> __device__ __forceinline__ I imin() { return (I)((u64)1 << (sizeof(I) * 8 - 1)); }

// Arithmetic in the compute type. Integers wrap, and divide by zero gives 0 (the CPU
// backend's rules); remainders take the divisor's sign.
template <int OP> __device__ __forceinline__ C bfn(C a, C b) {
#if IS_FLOAT
    switch (OP) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: return pow(a, b);
        case 5: return (a != a || a > b) ? a : b;
        case 6: return (a != a || a < b) ? a : b;
        case 7: return frem(a, b);
    }
#else
    switch (OP) {
        case 0: return (C)((u64)a + (u64)b);
        case 1: return (C)((u64)a - (u64)b);
        case 2: return (C)((u64)a * (u64)b);
        case 3:
            if (b == 0) return 0;
            if ((C)-1 < (C)0 && b == (C)-1) return (C)(0ull - (u64)a);
            return a / b;
        case 4: {
            // wrapping_pow with the exponent clamped at 0
            u64 e = b > (C)0 ? (u64)b : 0ull;
            u64 base = (u64)a, r = 1;
            while (e) {
                if (e & 1) r *= base;
                base *= base;
                e >>= 1;
            }
            return (C)r;
        }
        case 5: return a > b ? a : b;
        case 6: return a < b ? a : b;
        case 7: {
            if (b == 0) return 0;
            if ((C)-1 < (C)0 && b == (C)-1) return 0;
            C r = a % b;
            return (r != 0 && ((r < 0) != (b < 0))) ? (C)(r + b) : r;
        }
    }
#endif
    return a;
}
template <int OP> __device__ __forceinline__ bool8 pfn(C a, C b) {
    bool v = false;
    switch (OP) {
        case 8: v = a == b; break;
        case 9: v = a != b; break;
        case 10: v = a < b; break;
        case 11: v = a <= b; break;
        case 12: v = a > b; break;
        case 13: v = a >= b; break;
        case 14: v = a != (C)0 && b != (C)0; break;
        case 15: v = a != (C)0 || b != (C)0; break;
    }
    bool8 r;
    r.x = v;
    return r;
}

// One result: arithmetic ops store T, predicates store bool8.
template <int OP> struct Bin {
    typedef T Out;
    static __device__ __forceinline__ T f(T a, T b) { return TT::store(bfn<OP>(TT::load(a), TT::load(b))); }
};
#define PRED(OP)                                                                                              \
    template <> struct Bin<OP> {                                                                              \
        typedef bool8 Out;                                                                                    \
        static __device__ __forceinline__ bool8 f(T a, T b) { return pfn<OP>(TT::load(a), TT::load(b)); } \
    };
PRED(8) PRED(9) PRED(10) PRED(11) PRED(12) PRED(13) PRED(14) PRED(15)

// Binary ops over a dense output of rows of N = u[0] elements where each input is dense (mode
// 0: element i), a broadcast row (1: i % N), a broadcast column (2: i / N) or a scalar (3:
// element 0); the modes of x and z are flag bits 2-3 and 4-5. With packs (flag bit 1, set
// when N is a multiple of VW and the dense and row operands are aligned) a pack never
// straddles two rows, so one division per pack serves all its elements. I is u32 when the
// index space fits with room for the grid stride, where division is several times cheaper.
template <class I> __device__ __forceinline__ I bcast_at(int mode, I i, I q, I r) {
    return mode == 0 ? i : mode == 1 ? r : mode == 2 ? q : (I)0;
}
template <int V, class I> __device__ __forceinline__ Pack<T, V> bcast_pack(const T* p, int mode, I i, I q, I r) {
    if (mode <= 1) return *(const Pack<T, V>*)(p + bcast_at(mode, i, q, r));
    Pack<T, V> v;
    const T e = p[bcast_at(mode, i, q, r)];
#pragma unroll
    for (int k = 0; k < V; ++k) v.v[k] = e;
    return v;
}
template <int OP, class I> __device__ __forceinline__ void binary_bcast(const Args& a) {
    typedef typename Bin<OP>::Out O;
    const T* x = (const T*)a.p[0];
    const T* z = (const T*)a.p[1];
    O* y = (O*)a.p[2];
    const int mx = (a.flag >> 2) & 3, mz = (a.flag >> 4) & 3;
    const bool divide = mx == 1 || mx == 2 || mz == 1 || mz == 2;
    const I N = (I)a.u[0], n = (I)a.n;
    I done = 0;
    if (a.flag & 2) {
        const I packs = n / (I)VW;
        for (I j = (I)gtid(); j < packs; j += (I)gstride()) {
            const I i = j * (I)VW;
            const I q = divide ? i / N : (I)0, r = i - q * N;
            Pack<T, VW> p = bcast_pack<VW>(x, mx, i, q, r), w = bcast_pack<VW>(z, mz, i, q, r);
            Pack<O, VW> o;
#pragma unroll
            for (int k = 0; k < (int)VW; ++k) o.v[k] = Bin<OP>::f(p.v[k], w.v[k]);
            *(Pack<O, VW>*)(y + i) = o;
        }
        done = packs * (I)VW;
    }
    for (I i = done + (I)gtid(); i < n; i += (I)gstride()) {
        const I q = divide ? i / N : (I)0, r = i - q * N;
        y[i] = Bin<OP>::f(x[bcast_at(mx, i, q, r)], z[bcast_at(mz, i, q, r)]);
    }
}

#define BINARY(NAME, OP)                                                                               \
    extern "C" __global__ void binary_##NAME##_c(const Args a) {                                       \
        typedef typename Bin<OP>::Out O;                                                               \
        const T* x = (const T*)a.p[0];                                                                 \
        const T* z = (const T*)a.p[1];                                                                 \
        O* y = (O*)a.p[2];                                                                             \
        contiguous(a, VW, [&](u64 i) { y[i] = Bin<OP>::f(x[i], z[i]); }, [&](u64 i) {                  \
            Pack<T, VW> p = *(const Pack<T, VW>*)(x + i);                                              \
            Pack<T, VW> q = *(const Pack<T, VW>*)(z + i);                                              \
            Pack<O, VW> r;                                                                             \
            _Pragma("unroll") for (int k = 0; k < (int)VW; ++k) r.v[k] = Bin<OP>::f(p.v[k], q.v[k]);   \
            *(Pack<O, VW>*)(y + i) = r;                                                                \
        });                                                                                            \
    }                                                                                                  \
    extern "C" __global__ void binary_##NAME##_s(const Args a) {                                       \
        typedef typename Bin<OP>::Out O;                                                               \
        for (u64 i = gtid(); i < a.n; i += gstride()) {                                                \
            i64 o[3];                                                                                  \
            offsets<3>(a, i, o);                                                                       \
            ((O*)a.p[2])[o[2]] = Bin<OP>::f(((const T*)a.p[0])[o[0]], ((const T*)a.p[1])[o[1]]);       \
        }                                                                                              \
    }                                                                                                  \
    extern "C" __global__ void binary_##NAME##_b(const Args a) {                                       \
        if (a.n < (1ull << 31)) binary_bcast<OP, u32>(a); else binary_bcast<OP, u64>(a);              \
    }                                                                                                  \
    template <bool FIRST> __device__ __forceinline__ typename Bin<OP>::Out scalar_##NAME(T v, T s) {   \
        return FIRST ? Bin<OP>::f(s, v) : Bin<OP>::f(v, s);                                            \
    }                                                                                                  \
    template <bool FIRST> __device__ __forceinline__ void bins_##NAME##_c_impl(const Args& a, T s) {   \
        typedef typename Bin<OP>::Out O;                                                               \
        const T* x = (const T*)a.p[0];                                                                 \
        O* y = (O*)a.p[1];                                                                             \
        contiguous(a, VW, [&](u64 i) { y[i] = scalar_##NAME<FIRST>(x[i], s); }, [&](u64 i) {           \
            Pack<T, VW> p = *(const Pack<T, VW>*)(x + i);                                              \
            Pack<O, VW> r;                                                                             \
            _Pragma("unroll") for (int k = 0; k < (int)VW; ++k) r.v[k] = scalar_##NAME<FIRST>(p.v[k], s); \
            *(Pack<O, VW>*)(y + i) = r;                                                                \
        });                                                                                            \
    }                                                                                                  \
    extern "C" __global__ void binary_scalar_##NAME##_c(const Args a) {                                \
        T s = TT::from_d(a.s[0]);                                                                      \
        if (a.flag & 1) bins_##NAME##_c_impl<true>(a, s); else bins_##NAME##_c_impl<false>(a, s);      \
    }                                                                                                  \
    extern "C" __global__ void binary_scalar_##NAME##_s(const Args a) {                                \
        typedef typename Bin<OP>::Out O;                                                               \
        T s = TT::from_d(a.s[0]);                                                                      \
        bool first = a.flag & 1;                                                                       \
        for (u64 i = gtid(); i < a.n; i += gstride()) {                                                \
            i64 o[2];                                                                                  \
            offsets<2>(a, i, o);                                                                       \
            T v = ((const T*)a.p[0])[o[0]];                                                            \
            ((O*)a.p[1])[o[1]] = first ? scalar_##NAME<true>(v, s) : scalar_##NAME<false>(v, s);       \
        }                                                                                              \
    }

#if !IS_BOOL
BINARY(add, 0) BINARY(sub, 1) BINARY(mul, 2) BINARY(div, 3) BINARY(pow, 4) BINARY(maximum, 5)
BINARY(minimum, 6) BINARY(remainder, 7) BINARY(lt, 10) BINARY(le, 11) BINARY(gt, 12) BINARY(ge, 13)
#endif
BINARY(eq, 8) BINARY(ne, 9) BINARY(logical_and, 14) BINARY(logical_or, 15)

// ---- clamp, where, fill, arange ------------------------------------------------------------

#if !IS_BOOL
// Bounds apply in f64, as in the CPU backend; NaN passes through.
__device__ __forceinline__ T clamp_one(T v, double lo, double hi) {
    double d = TT::to_d(v);
    if (d != d) return v;
    return TT::from_d(fmin(fmax(d, lo), hi));
}
extern "C" __global__ void clamp_c(const Args a) {
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    for (u64 i = gtid(); i < a.n; i += gstride()) y[i] = clamp_one(x[i], a.s[0], a.s[1]);
}
extern "C" __global__ void clamp_s(const Args a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[2];
        offsets<2>(a, i, o);
        ((T*)a.p[1])[o[1]] = clamp_one(((const T*)a.p[0])[o[0]], a.s[0], a.s[1]);
    }
}
#endif

extern "C" __global__ void where_s(const Args a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[4];
        offsets<4>(a, i, o);
        bool pick = ((const bool8*)a.p[0])[o[0]].x != 0;
        ((T*)a.p[3])[o[3]] = pick ? ((const T*)a.p[1])[o[1]] : ((const T*)a.p[2])[o[2]];
    }
}

__device__ __forceinline__ T fill_value(double v) {
#if IS_BOOL
    bool8 r;
    r.x = v != 0.0;
    return r;
#else
    return TT::from_d(v);
#endif
}
extern "C" __global__ void fill_s(const Args a) {
    T v = fill_value(a.s[0]);
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[1];
        offsets<1>(a, i, o);
        ((T*)a.p[0])[o[0]] = v;
    }
}
extern "C" __global__ void fill_c(const Args a) {
    T v = fill_value(a.s[0]);
    T* y = (T*)a.p[0];
    contiguous(a, VW, [&](u64 i) { y[i] = v; }, [&](u64 i) {
        Pack<T, VW> p;
#pragma unroll
        for (int k = 0; k < (int)VW; ++k) p.v[k] = v;
        *(Pack<T, VW>*)(y + i) = p;
    });
}
// start + i*step in f64 without contraction into an FMA, so the bits match the CPU backend.
extern "C" __global__ void arange_s(const Args a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        double v = __dadd_rn(a.s[0], __dmul_rn((double)i, a.s[1]));
        ((T*)a.p[0])[(i64)i * a.st[0][0]] = TT::from_d(v);
    }
}

// A deliberate illegal-address fault, launched in place of the op named by the environment
// variable GENESIS_CUDA_PLANT_FAULT: the test that kernel faults become errors naming the op.
extern "C" __global__ void plant_fault(const Args a) {
    if (threadIdx.x == 0) *((volatile int*)(a.u[0] + 16)) = 1;
}
