// Bounds check of i64 indices, run before an index op or cross-entropy touches its output, so
// a bad index is an InvalidArgument error that wrote nothing (the CPU backend's behaviour).
//
// p[0] = the indices (element zero) with geometry shape/st[0] over `ndim` dims; n = count;
// u[0] = the exclusive bound; flag bit 0: the value u[1] (i64 bits) is allowed too (the
// cross-entropy ignore_index); p[3] = a 16-byte report, zeroed by the host: a u32 set to 1 on
// the first violation found and, at byte 8, the offending value (some violation, not
// necessarily the first in row-major order).
extern "C" __global__ void check_index(const Args a) {
    const i64* idx = (const i64*)a.p[0];
    const bool has_ignore = (a.flag & 1) != 0;
    const i64 ignore = (i64)a.u[1];
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 off[1];
        offsets<1>(a, i, off);
        const i64 v = idx[off[0]];
        const bool ok = (v >= 0 && (u64)v < a.u[0]) || (has_ignore && v == ignore);
        if (!ok && atomicCAS((unsigned int*)a.p[3], 0u, 1u) == 0u) *(i64*)(a.p[3] + 8) = v;
    }
}
