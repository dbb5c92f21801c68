/* An 8 x 8 block transposed in registers: T8_NAME(d, ld, r0, ..., r7)
 * stores column i of the block whose row j is rj (float8) at d + i * ld,
 * in address space T8_SPACE (define both before including). Lane
 * swizzles that LLVM turns into unpack / shuffle / lane-permute steps:
 * 8 vector loads and 8 vector stores for 64 floats, where gathering a
 * column takes 8 scalar loads per 8 floats. */
inline void T8_NAME(T8_SPACE float* d, int ld, float8 r0, float8 r1, float8 r2, float8 r3,
                    float8 r4, float8 r5, float8 r6, float8 r7) {
    const float8 a0 = (float8)(r0.s0, r1.s0, r0.s1, r1.s1, r0.s4, r1.s4, r0.s5, r1.s5);
    const float8 a1 = (float8)(r0.s2, r1.s2, r0.s3, r1.s3, r0.s6, r1.s6, r0.s7, r1.s7);
    const float8 a2 = (float8)(r2.s0, r3.s0, r2.s1, r3.s1, r2.s4, r3.s4, r2.s5, r3.s5);
    const float8 a3 = (float8)(r2.s2, r3.s2, r2.s3, r3.s3, r2.s6, r3.s6, r2.s7, r3.s7);
    const float8 a4 = (float8)(r4.s0, r5.s0, r4.s1, r5.s1, r4.s4, r5.s4, r4.s5, r5.s5);
    const float8 a5 = (float8)(r4.s2, r5.s2, r4.s3, r5.s3, r4.s6, r5.s6, r4.s7, r5.s7);
    const float8 a6 = (float8)(r6.s0, r7.s0, r6.s1, r7.s1, r6.s4, r7.s4, r6.s5, r7.s5);
    const float8 a7 = (float8)(r6.s2, r7.s2, r6.s3, r7.s3, r6.s6, r7.s6, r6.s7, r7.s7);
    const float8 b0 = (float8)(a0.s01, a2.s01, a0.s45, a2.s45);
    const float8 b1 = (float8)(a0.s23, a2.s23, a0.s67, a2.s67);
    const float8 b2 = (float8)(a1.s01, a3.s01, a1.s45, a3.s45);
    const float8 b3 = (float8)(a1.s23, a3.s23, a1.s67, a3.s67);
    const float8 b4 = (float8)(a4.s01, a6.s01, a4.s45, a6.s45);
    const float8 b5 = (float8)(a4.s23, a6.s23, a4.s67, a6.s67);
    const float8 b6 = (float8)(a5.s01, a7.s01, a5.s45, a7.s45);
    const float8 b7 = (float8)(a5.s23, a7.s23, a5.s67, a7.s67);
    vstore8((float8)(b0.lo, b4.lo), 0, d);          vstore8((float8)(b1.lo, b5.lo), 0, d + ld);
    vstore8((float8)(b2.lo, b6.lo), 0, d + 2 * ld); vstore8((float8)(b3.lo, b7.lo), 0, d + 3 * ld);
    vstore8((float8)(b0.hi, b4.hi), 0, d + 4 * ld); vstore8((float8)(b1.hi, b5.hi), 0, d + 5 * ld);
    vstore8((float8)(b2.hi, b6.hi), 0, d + 6 * ld); vstore8((float8)(b3.hi, b7.hi), 0, d + 7 * ld);
}
