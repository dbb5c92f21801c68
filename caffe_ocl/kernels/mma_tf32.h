/* TF32 tensor-core helpers.
 * TF32 == 1: NVIDIA GPUs (inline PTX; sm_80 and newer). The host sets it only
 *   on NVIDIA devices (ops/gemm.py use_tf32), so other drivers never see PTX.
 * TF32 == 2: an emulation of the same warp-wide mma on any OpenCL device
 *   (work-items exchange their fragments through local memory), so the
 *   tests check the tensor-core tiling (fragment layouts, row permutation,
 *   staged store) on PoCL; slow, for tests only (ops/gemm.py
 *   set_emulate_tf32). Rounding and accumulation order per k8 step match. */
#ifndef CAFFE_OCL_MMA_TF32_H
#define CAFFE_OCL_MMA_TF32_H
#if TF32 == 1

/* round-to-nearest (ties away) to TF32's 10 mantissa bits: one cvt.rna.tf32
 * instruction instead of an integer add-and-mask plus its inf/nan test
 * (five instructions per operand element in the main loop) */
inline float tf32_round(float x) {
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return as_float(r);
}

/* D = A(16x8, row) * B(8x8, col) + D; a: 4 regs, b: 2 regs (TF32 bit patterns);
 * d0..d3: fragment (gid, 2*tig), (gid, 2*tig+1), (gid+8, 2*tig), (gid+8, 2*tig+1). */
#define MMA_TF32(d0, d1, d2, d3, a, b)                                            \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "            \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"      \
                 : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                         \
                 : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]),            \
                   "r"((b)[0]), "r"((b)[1]),                                      \
                   "f"(d0), "f"(d1), "f"(d2), "f"(d3))

/* Asynchronous global -> local copies (sm_80+), for tile_mainloop_async.h:
 * nbytes of src (0 to 16) land at dst, the rest of the 16 bytes zero-filled
 * (src and dst 16-byte aligned). A work-item's
 * copies are grouped by commit; wait_group n waits until at most n of its
 * groups are in flight (a barrier after it makes everyone's visible). */
inline void cp_async16(__local float* dst, __global const float* src, int nbytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"((uint)(size_t)dst), "l"(src), "r"(nbytes));
}
/* r[0..3] = this lane's word of four 8 x 4-float blocks of local memory;
 * lane l gives the address (base + off) of row l % 8 of block l / 8, and
 * receives word l % 4 of row l / 4 of each block (the mma fragment order) */
#define LDSM_X4(r, base, off)                                                     \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"  \
                 : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3])         \
                 : "r"((uint)(size_t)((base) + (off))))
#define cp_async_commit() asm volatile("cp.async.commit_group;")
#define cp_async_wait_all() asm volatile("cp.async.wait_all;")

#elif TF32 == 2

/* the same rounding as cvt.rna.tf32.f32 (ties away from zero) */
inline float tf32_round(float x) {
    uint u = as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;   /* inf / nan unchanged */
    return as_float((u + 0x1000u) & 0xffffe000u);
}

/* One warp-wide m16n8k8 product: every work-item of the work-group calls it
 * together (it holds barriers); xch has 6 floats per work-item. Fragment
 * owners, lane = 4 * gid + tig: A(r, k) is a[(r >= 8) + 2 * (k >= 4)] of lane
 * (r % 8, k % 4); B(k, c) is b[k >= 4] of lane (c, k % 4). */
inline void mma_tf32_emulated(float* d, const uint* a, const uint* b,
                              __local float* xch, int lid) {
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int r = 0; r < 4; ++r) xch[lid * 6 + r] = as_float(a[r]);
    xch[lid * 6 + 4] = as_float(b[0]);
    xch[lid * 6 + 5] = as_float(b[1]);
    barrier(CLK_LOCAL_MEM_FENCE);
    __local const float* w = xch + (lid & ~31) * 6;
    const int lane = lid & 31, gid = lane >> 2, tig = lane & 3;
    for (int e = 0; e < 4; ++e) {
        const int row = gid + (e >> 1) * 8, col = 2 * tig + (e & 1);
        float s = 0.0f;
        for (int k = 0; k < 8; ++k)
            s += w[(4 * (row % 8) + k % 4) * 6 + (row >= 8) + 2 * (k >= 4)] *
                 w[(4 * col + k % 4) * 6 + 4 + (k >= 4)];
        d[e] += s;
    }
}

/* the copies, done at once (the waits are then nothing to wait for) */
inline void cp_async16(__local float* dst, __global const float* src, int nbytes) {
    for (int i = 0; i < 4; ++i) dst[i] = 4 * i < nbytes ? src[i] : 0.0f;
}
#define cp_async_commit()
#define cp_async_wait_all()

/* ldmatrix.x4 (above): the lanes' offsets exchanged through local memory */
inline void ldsm_x4_emulated(uint* r, __local const float* base, int off,
                             __local int* xi, int lid) {
    barrier(CLK_LOCAL_MEM_FENCE);
    xi[lid] = off;
    barrier(CLK_LOCAL_MEM_FENCE);
    const int lane = lid & 31, w0 = lid & ~31;
    for (int i = 0; i < 4; ++i) r[i] = as_uint(base[xi[w0 + 8 * i + (lane >> 2)] + (lane & 3)]);
}
#define LDSM_X4(r, base, off) ldsm_x4_emulated(r, base, off, (__local int*)mma_xch_, lid)

#define MMA_TF32(d0, d1, d2, d3, a, b) {                                          \
        float d_[4] = {d0, d1, d2, d3};                                           \
        mma_tf32_emulated(d_, a, b, mma_xch_, lid);                               \
        d0 = d_[0]; d1 = d_[1]; d2 = d_[2]; d3 = d_[3];                           \
    }

#endif

#endif
