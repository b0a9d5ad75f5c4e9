/* An int4 MatMul straight from MatMulNBits' bytes (bits 4, block 32, symmetric: zero point 8).
 *
 * C[M, N] = A[M, K] @ dequant(B)^T, where B is uint8 [N, K/32, 16] (byte j of a block: element 2j in its low
 * nibble, 2j+1 in its high one), scales float [N, K/32], W[n, k] = (q - 8) * scale. A is quantized to int8 per
 * block of 32 (symmetric, as MLAS's accuracy_level 4), so each block's product is an integer dot product.
 *
 * q4op's working copy of the interface agreed with q4kern (/work/brief/q4-header-agreed.txt); q4kern's
 * native/ws_q4.h replaces it when the branches meet.
 */
#ifndef WS_Q4_H
#define WS_Q4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of scratch one call needs for A's quantized copy (M rows of K). */
size_t ws_q4_scratch_size(size_t M, size_t K);

/* A quantized into scratch: once per call, before any ws_q4_matmul_q over it. */
void ws_q4_quantize_a(const float* A, size_t M, size_t K, void* scratch);

/* Columns [n_begin, n_end) of C (row stride N) from A's quantized copy; thread-safe over disjoint ranges. */
void ws_q4_matmul_q(const void* scratch, size_t M, size_t K, const uint8_t* B, const float* scales, size_t N,
                    float* C, size_t n_begin, size_t n_end);

/* ws_q4_quantize_a then ws_q4_matmul_q. */
void ws_q4_matmul(const float* A, size_t M, size_t K, const uint8_t* B, const float* scales, size_t N, float* C,
                  void* scratch, size_t n_begin, size_t n_end);

/* The code path that runs here: 0 scalar, 1 AVX2, 2 AVX-512 VNNI (or AVX-VNNI). */
int ws_q4_isa(void);

#ifdef __cplusplus
}
#endif

#endif
