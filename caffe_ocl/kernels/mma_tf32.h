/* TF32 tensor-core helpers for NVIDIA GPUs (inline PTX; sm_80 and newer).
 * Include only when TF32 == 1: the host sets TF32 only on NVIDIA devices
 * (ops/gemm.py use_tf32), so other drivers never see PTX. */
#ifndef CAFFE_OCL_MMA_TF32_H
#define CAFFE_OCL_MMA_TF32_H
#if TF32

/* round-to-nearest (ties away) to TF32's 10 mantissa bits, as cvt.rna.tf32 */
inline float tf32_round(float x) {
    uint u = as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;   /* inf / nan unchanged */
    return as_float((u + 0x1000u) & 0xffffe000u);
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

#endif
#endif
