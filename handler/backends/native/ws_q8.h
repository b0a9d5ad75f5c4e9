/* ws_q8: an int8 x int8 MatMul that computes straight from a MatMulNBits pack's 8-bit bytes (no prepack): the
 * tied LM head of an int4 generate pack (bits 8, block 128 on Qwen3, 64 on SmolLM2).
 *
 * The weights are exactly what com.microsoft.MatMulNBits holds with bits=8 and no zero-point input (symmetric,
 * zero point 128): B is uint8 [N, K/block, block], one byte per value in order; scales is float [N, K/block];
 * W[n, k] = (q - 128) * scale[n, k/block]. C[M, N] = A[M, K] @ W^T, with A quantized to int8 per block of the
 * weights' block size (symmetric: scale max|a| / 127, values times 127 / max rounded to nearest even), as
 * MatMulNBits does at accuracy_level 4: the int32 block sums are exact, only the float sums of
 * scale_a * scale_b * int_dot differ from ONNX Runtime's in rounding. A NaN or an infinity in A makes every output
 * of its row NaN. The code path is ws_q4_isa()'s (ws_q4.h): the same choice, the same WS_Q4_ISA override.
 *
 * Preconditions (not checked here; the callers check them): block in {32, 64, 128, 256}, K % block == 0, K > 0,
 * M > 0, n_begin <= n_end <= N. B and scales need no alignment. C is row-major with row stride N and only its
 * columns [n_begin, n_end) are written. Thread-safe: no global state is written by the compute functions.
 */
#ifndef WS_Q8_H
#define WS_Q8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of scratch that ws_q8_quantize_a / ws_q8_matmul need for M rows of K in blocks of `block`. */
size_t ws_q8_scratch_size(size_t M, size_t K, size_t block);

/* Quantizes A [M, K] into scratch (the scratch records K, block and the code path in effect now). Once per call
 * of the op; then any number of ws_q8_matmul_q over N ranges, from any threads. */
void ws_q8_quantize_a(const float* A, size_t M, size_t K, size_t block, void* scratch);

/* Rows [n_begin, n_end) of N: C[m, n] for every m, from A as ws_q8_quantize_a left it in scratch (read only). */
void ws_q8_matmul_q(const void* scratch, size_t M, const uint8_t* B, const float* scales, size_t N, float* C,
                    size_t n_begin, size_t n_end);

/* ws_q8_quantize_a followed by ws_q8_matmul_q. */
void ws_q8_matmul(const float* A, size_t M, size_t K, size_t block, const uint8_t* B, const float* scales, size_t N,
                  float* C, void* scratch, size_t n_begin, size_t n_end);

#ifdef __cplusplus
}
#endif

#endif /* WS_Q8_H */
