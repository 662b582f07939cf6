// Bounds check of i64 indices, run before an index op or cross-entropy touches its output.
// The host does not wait for it (the interface lets errors of queued work surface at the next
// synchronization): a violation is recorded in this module's `index_fault`, the host reads
// that when it synchronizes and reports the op, and every kernel that reads indices returns
// at once while it is set, so the op with the bad index writes nothing (the CPU backend's
// behaviour) and no later one reads out of bounds.
//
// p[0] = the indices (element zero) with geometry shape/st[0] over `ndim` dims; n = count;
// u[0] = the exclusive bound; flag bit 0: the value u[1] (i64 bits) is allowed too (the
// cross-entropy ignore_index); flag >> 1 = this check's number (from 1) since the host last
// synchronized, which names the op in the error.

// [0]: the number of the first check that failed (0: none); [1]: an offending value.
__device__ unsigned long long index_fault[2];

__device__ __forceinline__ bool index_faulted() { return *(volatile unsigned long long*)&index_fault[0] != 0ull; }

extern "C" __global__ void check_index(const Args a) {
    const i64* idx = (const i64*)a.p[0];
    const bool has_ignore = (a.flag & 1) != 0;
    const i64 ignore = (i64)a.u[1];
    const unsigned long long number = (unsigned long long)(a.flag >> 1);
    for (u64 i = gtid(); i < a.n; i += gstride()) {
        i64 off[1];
        offsets<1>(a, i, off);
        const i64 v = idx[off[0]];
        const bool ok = (v >= 0 && (u64)v < a.u[0]) || (has_ignore && v == ignore);
        if (!ok && atomicCAS(&index_fault[0], 0ull, number) == 0ull) index_fault[1] = (unsigned long long)v;
    }
}
