/* ws_q4: an int4 x int8 MatMul that computes straight from a MatMulNBits pack's bytes (no prepack).
 *
 * The weights are exactly what com.microsoft.MatMulNBits holds with bits=4, block_size=32 and no zero-point
 * input (symmetric, zero point 8): B is uint8 [N, K/32, 16]; byte j of block kb of row n holds element 2j in its
 * low nibble and 2j+1 in its high nibble; scales is float [N, K/32]; W[n, k] = (q - 8) * scale[n, k/32].
 * C[M, N] = A[M, K] @ W^T, with A quantized to int8 per block of 32 (symmetric, round to nearest even), as
 * MatMulNBits does at accuracy_level 4: the int32 block sums are exact, only the float sums of
 * scale_a * scale_b * int_dot differ from ONNX Runtime's in rounding. A NaN or an infinity in A makes every output
 * of its row NaN (MatMulNBits gives NaN for an infinity, and finite values for a NaN).
 *
 * Preconditions (not checked here; the callers check them): K % 32 == 0, K > 0, M > 0,
 * n_begin <= n_end <= N. B and scales need no alignment. C is row-major with row stride N and only its columns
 * [n_begin, n_end) are written. Thread-safe: no global state is written by the compute functions, no allocation.
 */
#ifndef WS_Q4_H
#define WS_Q4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The scalar path is a reference, not a fast path: 0.06-0.09x MLAS (bench/generate/q4kern.py --isa scalar). Where
 * ws_q4_isa() says scalar (arm64, x86 without AVX2 + FMA), a caller keeps ONNX Runtime's MatMulNBits. */
#define WS_Q4_ISA_SCALAR 0
#define WS_Q4_ISA_AVX2 1       /* AVX2 + FMA */
#define WS_Q4_ISA_AVX512VNNI 2 /* AVX-512 F/BW/VL + VNNI */

/* Bytes of scratch that ws_q4_quantize_a / ws_q4_matmul need for M rows of K (any alignment: the kernel aligns
 * inside it). */
size_t ws_q4_scratch_size(size_t M, size_t K);

/* Quantizes A [M, K] into scratch, laid out for the code path in effect now (the scratch records which).
 * Once per call of the op; then any number of ws_q4_matmul_q over N ranges, from any threads. */
void ws_q4_quantize_a(const float* A, size_t M, size_t K, void* scratch);

/* Rows [n_begin, n_end) of N: C[m, n] for every m, from A as ws_q4_quantize_a left it in scratch (read only). */
void ws_q4_matmul_q(const void* scratch, size_t M, size_t K, const uint8_t* B, const float* scales, size_t N,
                    float* C, size_t n_begin, size_t n_end);

/* ws_q4_quantize_a followed by ws_q4_matmul_q. */
void ws_q4_matmul(const float* A, size_t M, size_t K, const uint8_t* B, const float* scales, size_t N, float* C,
                  void* scratch, size_t n_begin, size_t n_end);

/* The code path in effect: WS_Q4_ISA_*. The best this CPU supports, unless the environment variable WS_Q4_ISA
 * (scalar | avx2 | avx512vnni, read once) or ws_q4_set_isa chose a lower one. */
int ws_q4_isa(void);

/* For tests and benchmarks: make `isa` the path in effect. Returns it, or -1 (nothing changed) when this CPU
 * lacks it. Not to be called while another thread computes. */
int ws_q4_set_isa(int isa);

#ifdef __cplusplus
}
#endif

#endif /* WS_Q4_H */
