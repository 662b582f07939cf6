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

// Rows of x and y unit-stride along d, any row strides (the q and k head views of a stacked
// projection's output are), cos and sin rows unit-stride; half = d/2 a multiple of the pack,
// every address and row stride a whole number of 16-byte packs: each step rotates one pack
// of V pairs. The launcher orders the three row dims (b, h, s) as they lie in x's memory,
// outermost first, so that neighbouring threads read neighbouring rows: shape[0..3] are their
// sizes, st[j][0..3] the row strides of x, y, cos and sin over them (cos and sin 0 over b and
// h). n = rows * half pairs, u[0] = half; n / V fits in 32 bits.
#define V (16 / (int)sizeof(T))
extern "C" __global__ void rotary_v(const Args a) {
    typedef Pack<T, V> P;
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    const T* cs = (const T*)a.p[2];
    const T* sn = (const T*)a.p[3];
    const unsigned half = (unsigned)a.u[0], n1 = (unsigned)a.shape[1], n2 = (unsigned)a.shape[2];
    const bool inv = a.flag & 1;
    for (u64 j = gtid(); j < a.n / V; j += gstride()) {
        const unsigned packs = half / V, row = (unsigned)j / packs, col = ((unsigned)j - row * packs) * V;
        const unsigned i2 = row % n2, r = row / n2, i1 = r % n1, i0 = r / n1;
        i64 off[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) off[k] = (i64)i0 * a.st[k][0] + (i64)i1 * a.st[k][1] + (i64)i2 * a.st[k][2] + col;
        const P x1 = *(const P*)(x + off[0]), x2 = *(const P*)(x + off[0] + half);
        const P pc = *(const P*)(cs + off[2]), ps = *(const P*)(sn + off[3]);
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
        *(P*)(y + off[1]) = y1;
        *(P*)(y + off[1] + half) = y2;
    }
}

// ---- rotary_kv_write: the decode step's rotary embedding and cache write in one launch ----
// With p = *position: q_out = rotary(q), k_cache[:, :, p + i] = rotary(k)[:, :, i] and
// v_cache[:, :, p + i] = v[:, :, i] for i < s. Every operand has its own strides over
// (b, heads, positions, last dim); cos and sin over (0, 0, s, d/2). One grid-stride loop over
// nq + nk + nv items: the q pairs (b, hq, s, d/2), then the k pairs (b, hk, s, d/2), then the
// v elements (b, hk, s, d).
//
// The position lives on the device (a captured graph rewrites it between replays), so the
// kernel checks it itself: every thread reads it, and outside [0, t - s] thread 0 records the
// fault in this module's index_fault (index_check.cu; the host reports it at the next
// synchronization as the error of this launch's check `number`) and every thread returns
// without writing. While an earlier fault of this module is unreported, nothing is written.
struct KvWriteArgs {
    char* p[9];     // q, k, v, cos, sin, position, q_out, k_cache, v_cache
    i64 st[9][4];   // strides of each operand of p[] over (b, heads, positions, last dim)
    u64 b, hq, hk, s, t, half;
    u64 nq, nk, nv; // q pairs, k pairs, v elements
    u64 number;     // the index check's number (from 1), recorded on a bad position
};

// Element offset of (b, h, i, j) under the strides st.
__device__ __forceinline__ i64 kv_at(const i64* st, u64 b, u64 h, u64 i, u64 j) {
    return (i64)b * st[0] + (i64)h * st[1] + (i64)i * st[2] + (i64)j * st[3];
}

// (b, h, i, j) of row-major position r over (., heads, seq, inner); all sizes nonzero.
__device__ __forceinline__ void kv_split(u64 r, u64 heads, u64 seq, u64 inner, u64& b, u64& h, u64& i, u64& j) {
    j = r % inner;
    r /= inner;
    i = r % seq;
    r /= seq;
    h = r % heads;
    b = r / heads;
}

extern "C" __global__ void rotary_kv_write(const KvWriteArgs a) {
    wait_previous();  // launched early: nothing to warm
    start_next();
    if (index_faulted()) return;
    const i64 pos = *(const i64*)a.p[5];
    if (pos < 0 || (u64)pos > a.t - a.s) {
        if (gtid() == 0 && atomicCAS(&index_fault[0], 0ull, a.number) == 0ull) index_fault[1] = (unsigned long long)pos;
        return;
    }
    const u64 p = (u64)pos;
    const T* q = (const T*)a.p[0];
    const T* k = (const T*)a.p[1];
    const T* v = (const T*)a.p[2];
    const T* cs = (const T*)a.p[3];
    const T* sn = (const T*)a.p[4];
    T* qo = (T*)a.p[6];
    T* kc = (T*)a.p[7];
    T* vc = (T*)a.p[8];
    const u64 total = a.nq + a.nk + a.nv;
    for (u64 r = gtid(); r < total; r += gstride()) {
        u64 b, h, i, j;
        if (r < a.nq + a.nk) {
            // A pair (j, j + d/2) of q or of k, at new position i.
            const bool is_q = r < a.nq;
            const T* x = is_q ? q : k;
            T* y = is_q ? qo : kc;
            const i64* sx = is_q ? a.st[0] : a.st[1];
            const i64* sy = is_q ? a.st[6] : a.st[7];
            kv_split(is_q ? r : r - a.nq, is_q ? a.hq : a.hk, a.s, a.half, b, h, i, j);
            const C c = TT::load(cs[kv_at(a.st[3], 0, 0, i, j)]), s = TT::load(sn[kv_at(a.st[4], 0, 0, i, j)]);
            const i64 x1 = kv_at(sx, b, h, i, j), x2 = kv_at(sx, b, h, i, j + a.half);
            // q_out keeps the position; the cache takes it at p + i.
            const u64 at = is_q ? i : p + i;
            const i64 y1 = kv_at(sy, b, h, at, j), y2 = kv_at(sy, b, h, at, j + a.half);
            C ya, yb;
            rotate(TT::load(x[x1]), TT::load(x[x2]), c, s, ya, yb);
            y[y1] = TT::store(ya);
            y[y2] = TT::store(yb);
        } else {
            kv_split(r - a.nq - a.nk, a.hk, a.s, 2 * a.half, b, h, i, j);
            vc[kv_at(a.st[8], b, h, p + i, j)] = v[kv_at(a.st[2], b, h, i, j)];
        }
    }
}
