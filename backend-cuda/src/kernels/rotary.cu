// Rotary position embedding in the "rotate half" layout, for float type T: for each row of
// x (b, h, s, d) at position p and each i < d/2, with c = cos[p, i] and s = ±sin[p, i]:
//   y[i] = x[i] c - x[i + d/2] s,   y[i + d/2] = x[i + d/2] c + x[i] s
// computed in C (f32 for f16/bf16). flag bit 0: inverse (rotate by -θ, the backward).

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

__device__ __forceinline__ void rotate(C a, C b, C c, C s, C& ya, C& yb) {
    ya = a * c - b * s;
    yb = b * c + a * s;
}

// Any strides. Geometry (ops/rotary.rs): n = b*h*s*(d/2) pairs over a merged shape with the
// strides of x (st[0]), y (st[1]), cos (st[2]) and sin (st[3], both 0 over b and h); u[0] and
// u[1] are the offsets of the second half in x and in y.
extern "C" __global__ void rotary_s(const Args a) {
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    const T* cs = (const T*)a.p[2];
    const T* sn = (const T*)a.p[3];
    const i64 hx = (i64)a.u[0], hy = (i64)a.u[1];
    const bool inv = a.flag & 1;
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 off[4];
        offsets<4>(a, i, off);
        C c = TT::load(cs[off[2]]), s = TT::load(sn[off[3]]);
        if (inv) s = -s;
        C ya, yb;
        rotate(TT::load(x[off[0]]), TT::load(x[off[0] + hx]), c, s, ya, yb);
        y[off[1]] = TT::store(ya);
        y[off[1] + hy] = TT::store(yb);
    }
}

// Dense x and y (b, h, s, d), dense cos and sin (s, d/2), d/2 a multiple of the pack and every
// address 16-byte aligned: each step rotates one pack of V pairs. n = b*h*s*(d/2) pairs,
// u[0] = d/2, u[1] = s.
#define V (16 / (int)sizeof(T))
extern "C" __global__ void rotary_c(const Args a) {
    typedef Pack<T, V> P;
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    const T* cs = (const T*)a.p[2];
    const T* sn = (const T*)a.p[3];
    const u64 half = a.u[0], seq = a.u[1];
    const bool inv = a.flag & 1;
    for (u64 j = gtid(); j < a.n / V; j += gstride()) {
        u64 pair = j * V;
        u64 row = pair / half, col = pair - row * half;
        u64 pos = row % seq;
        P x1 = *(const P*)(x + row * 2 * half + col), x2 = *(const P*)(x + row * 2 * half + half + col);
        P pc = *(const P*)(cs + pos * half + col), ps = *(const P*)(sn + pos * half + col);
        P y1, y2;
#pragma unroll
        for (int k = 0; k < V; ++k) {
            C s = TT::load(ps.v[k]);
            if (inv) s = -s;
            C ya, yb;
            rotate(TT::load(x1.v[k]), TT::load(x2.v[k]), TT::load(pc.v[k]), s, ya, yb);
            y1.v[k] = TT::store(ya);
            y2.v[k] = TT::store(yb);
        }
        *(P*)(y + row * 2 * half + col) = y1;
        *(P*)(y + row * 2 * half + half + col) = y2;
    }
}
