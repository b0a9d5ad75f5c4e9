/* A second scalar implementation of ws_q4.h, written apart from native/ws_q4_kernels.c: the op linked to it
 * (bench/generate/q4op.py build --kernels native/ws_q4_ref.c) tells what the kernels change in a whole model from
 * what int8 re-quantization changes. The same math: A per block of 32 to int8 at 127 / amax (round to nearest
 * even, as MLAS's CompInt8 quantizer), int32 dot products per block against the nibbles minus 8, times both
 * scales. Plain loops, no layout of its own: not a fast path. */
#include <math.h>
#include <string.h>

#include "ws_q4.h"

#define QK 32

/* scratch: int8 [M, K], then float scales [M, K/32]. */
size_t ws_q4_scratch_size(size_t M, size_t K) { return M * K + M * (K / QK) * sizeof(float); }

void ws_q4_quantize_a(const float* A, size_t M, size_t K, void* scratch) {
    int8_t* q = (int8_t*)scratch;
    float* s = (float*)(q + M * K);
    for (size_t i = 0; i < M * (K / QK); i++) {
        const float* a = A + i * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(a[j]));
        float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < QK; j++) q[i * QK + j] = (int8_t)nearbyintf(a[j] * inv);
        s[i] = amax / 127.0f;
    }
}

void ws_q4_matmul_q(const void* scratch, size_t M, size_t K, const uint8_t* B, const float* scales, size_t N,
                    float* C, size_t n_begin, size_t n_end) {
    const int8_t* q = (const int8_t*)scratch;
    const float* s = (const float*)(q + M * K);
    size_t nb = K / QK;
    for (size_t m = 0; m < M; m++) {
        for (size_t n = n_begin; n < n_end; n++) {
            float acc = 0.0f;
            for (size_t b = 0; b < nb; b++) {
                const uint8_t* w = B + (n * nb + b) * (QK / 2);
                const int8_t* a = q + m * K + b * QK;
                int32_t dot = 0;
                for (int j = 0; j < QK / 2; j++) {
                    dot += a[2 * j] * ((w[j] & 15) - 8) + a[2 * j + 1] * ((w[j] >> 4) - 8);
                }
                acc += (float)dot * (s[m * nb + b] * scales[n * nb + b]);
            }
            C[m * N + n] = acc;
        }
    }
}

void ws_q4_matmul(const float* A, size_t M, size_t K, const uint8_t* B, const float* scales, size_t N, float* C,
                  void* scratch, size_t n_begin, size_t n_end) {
    ws_q4_quantize_a(A, M, K, scratch);
    ws_q4_matmul_q(scratch, M, K, B, scales, N, C, n_begin, n_end);
}

int ws_q4_isa(void) { return 0; }

int ws_q4_set_isa(int isa) { return isa == 0 ? 0 : -1; }
