// Philox4x32-10 fills with the interface's element-to-counter mapping (sdk::philox), so the
// bits equal the CPU backend's: uniform f32/f16/bf16 element i uses word i%4 of block
// offset + i/4; uniform f64 and normal use words 2(i%2), 2(i%2)+1 of block offset + i/2.
// f64 arithmetic uses explicit round-to-nearest intrinsics so no FMA contraction changes a
// bit relative to the reference. Compiled for float types only.

#if IS_FLOAT
__device__ __forceinline__ void philox(u32 c[4], u32 k0, u32 k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        u32 hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        u32 hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        u32 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
    }
}
__device__ __forceinline__ void block_words(u64 seed, u64 block, u32 w[4]) {
    w[0] = (u32)block;
    w[1] = (u32)(block >> 32);
    w[2] = 0;
    w[3] = 0;
    philox(w, (u32)seed, (u32)(seed >> 32));
}
// The uniform of element i as RandUniform and Dropout draw it for T.
__device__ __forceinline__ double uniform_at(u64 seed, u64 offset, u64 i) {
    u32 w[4];
    if (sizeof(T) == 8) {
        block_words(seed, offset + i / 2, w);
        int lane = 2 * (int)(i % 2);
        u64 bits = ((u64)w[lane] << 21) ^ ((u64)w[lane + 1] >> 11);
        return (double)bits * (1.0 / 9007199254740992.0);
    }
    block_words(seed, offset + i / 4, w);
    float u = (float)(w[i % 4] >> 8) * (1.0f / 16777216.0f);
    return (double)u;
}
__device__ __forceinline__ double normal_at(u64 seed, u64 offset, u64 i) {
    u32 w[4];
    block_words(seed, offset + i / 2, w);
    int lane = 2 * (int)(i % 2);
    double u1 = __dmul_rn((double)(w[lane] >> 8) + 1.0, 1.0 / 16777216.0);
    double u2 = __dmul_rn((double)(w[lane + 1] >> 8), 1.0 / 16777216.0);
    return __dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(6.283185307179586476925286766559, u2)));
}

// Element i of the output is the i-th position in row-major order (a strided output is
// walked through `offsets`).
extern "C" __global__ void rand_uniform_s(const Args a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[1];
        offsets<1>(a, i, o);
        double u = uniform_at(a.u[0], a.u[1], i);
        ((T*)a.p[0])[o[0]] = TT::from_d(__dadd_rn(a.s[0], __dmul_rn(a.s[1] - a.s[0], u)));
    }
}
extern "C" __global__ void rand_normal_s(const Args a) {
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[1];
        offsets<1>(a, i, o);
        double z = normal_at(a.u[0], a.u[1], i);
        ((T*)a.p[0])[o[0]] = TT::from_d(__dadd_rn(a.s[0], __dmul_rn(a.s[1], z)));
    }
}
// y = x * keep / (1-p) in the compute type; `scale` = 1-p rounded once to it.
extern "C" __global__ void dropout_s(const Args a) {
    C scale = (C)(1.0 - a.s[0]);
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 o[2];
        offsets<2>(a, i, o);
        C keep = uniform_at(a.u[0], a.u[1], i) >= a.s[0] ? (C)1 : (C)0;
        C v = TT::load(((const T*)a.p[0])[o[0]]);
        ((T*)a.p[1])[o[1]] = TT::store(v * keep / scale);
    }
}
#endif
