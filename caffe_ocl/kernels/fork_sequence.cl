/* Sequence layers of the OCR / text-detection forks (senlinuc/caffe_ocr):
 * CTCGreedyDecoder, as that fork's ctc_decoder_layer.cpp. */
#include "common.h"

/* probs [T][N][C]; out [N][T]: per stream n the labels of the most probable
 * class of each step (first of equal maxima), blanks dropped and, with
 * merge_repeated, a label equal to the previous step's dropped; -1 after
 * the last label. One work-item per stream. */
__kernel void ctc_greedy_decode(int T, int N, int C, int blank, int merge_repeated,
                                __global const float* probs, __global float* out) {
    GLOBAL_LOOP(n, N) {
        int prev = -1, k = 0;
        for (int t = 0; t < T; ++t) {
            __global const float* p = probs + ((size_t)t * N + n) * C;
            int best = 0;
            float best_p = p[0];
            for (int c = 1; c < C; ++c) {
                if (p[c] > best_p) {
                    best = c;
                    best_p = p[c];
                }
            }
            if (best != blank && !(merge_repeated && best == prev))
                out[(size_t)n * T + k++] = (float)best;
            prev = best;
        }
        for (; k < T; ++k)
            out[(size_t)n * T + k] = -1.0f;
    }
}
