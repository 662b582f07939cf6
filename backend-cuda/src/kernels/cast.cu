// Copies and casts from T: `copy_s` (same type, any strides) and `cast_to_<dtype>_s`.
// Casts go through f64 like the CPU backend (floats to integers truncate and saturate, NaN
// gives 0); to bool is `!= 0`; a cast to T itself is a plain copy.

extern "C" __global__ void copy_s(const Args a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[2];
        offsets<2>(a, i, o);
        ((T*)a.p[1])[o[1]] = ((const T*)a.p[0])[o[0]];
    }
}

template <class A, class B> struct Same { static const bool v = false; };
template <class A> struct Same<A, A> { static const bool v = true; };

template <class O> __device__ __forceinline__ O cast_one(T v) {
    if constexpr (Same<O, T>::v) {
        return v;
    } else if constexpr (Same<O, bool8>::v) {
        bool8 r;
        r.x = TT::to_d(v) != 0.0;
        return r;
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
        for (u64 i = gtid(); i < a.n; i += gstride()) y[i] = cast_one<O>(x[i]); \
    }

CAST(float32, float) CAST(float64, double) CAST(float16, h16) CAST(bfloat16, b16) CAST(int64, i64)
CAST(int32, int) CAST(uint8, u8) CAST(bool, bool8)
