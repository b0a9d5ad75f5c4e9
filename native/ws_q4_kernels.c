/* ws_q4 kernels: C = A @ dequant(B)^T straight from MatMulNBits' int4 bytes (bits 4, block 32, zero point 8).
 * See ws_q4.h for the contract. Built with plain `gcc -O3` (no -march): the AVX2 and AVX-512 paths carry their
 * own target attributes and are chosen at run time, because Lambda's x86 CPUs vary.
 *
 * The math per block of 32 (as MLAS's CompInt8 and llama.cpp's Q4_0 x Q8_0):
 *   A's block is quantized to int8 qa with scale sa = max|a| / 127; the block's contribution to C[m, n] is
 *   sa * sb * (sum_k qb[k] * qa[k] - 8 * sum_k qa[k]), qb in 0..15 straight from the nibbles.
 * Nibbles never move: A is laid out once per call so that the bytes it meets in a dot product are the ones the
 * nibbles of B's bytes hold (low nibble of byte j = element 2j, high = 2j+1; order in a dot product is free).
 * The vector paths also transpose B's 4-byte words so that each int32 lane of a dot product is one whole block:
 * the int32 sums of a block then need one convert and one multiply-add per 16 (AVX-512) or 8 (AVX2) blocks.
 * The -8 * sum(qa) term is the starting value of each block's int32 sum (computed once per call, with A).
 */
#include "ws_q4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* -DWS_Q4_X86=0 builds the scalar path alone, as on arm64 (the tests build it so on x86 too) */
#ifndef WS_Q4_X86
#if defined(__x86_64__) || defined(__i386__)
#define WS_Q4_X86 1
#else
#define WS_Q4_X86 0
#endif
#endif
#if WS_Q4_X86
#include <immintrin.h>
#endif

#define QBLK 32   /* elements per block */
#define GROUP 16  /* blocks per padded group: the AVX-512 lane count, a multiple of AVX2's 8 */
#define HEADER 64 /* bytes at the start of the (aligned) scratch */

/* What ws_q4_quantize_a leaves at the start of the scratch (the rest: one region of row_bytes per row of A). */
typedef struct {
    int isa;          /* the layout of the rows below: WS_Q4_ISA_* */
    size_t nb;        /* blocks per row: K / 32 */
    size_t nbp;       /* nb rounded up to GROUP */
    size_t row_bytes; /* nbp * (32 int8 + float sa + int32 -8*sum) */
} ws_q4_header;

/* Row m's region: qa [nbp * 32] int8, then sa [nbp] float, then nsum [nbp] int32 (-8 * sum of the block's qa).
 * Layout of qa/sa/nsum by path: scalar = blocks in order, elements in order; vector paths = see lane_block. */
#define ROW_QA(row) ((int8_t*)(row))
#define ROW_SA(row, nbp) ((float*)((char*)(row) + (nbp) * QBLK))
#define ROW_NSUM(row, nbp) ((int32_t*)((char*)(row) + (nbp) * (QBLK + 4)))

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static void* align64(const void* p) { return (void*)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

size_t ws_q4_scratch_size(size_t M, size_t K) {
    size_t nbp = round_up(K / QBLK, GROUP);
    return 64 /* alignment slack */ + HEADER + M * nbp * (QBLK + 8);
}

/* ---------------------------------------------------------------------------------------------------------------
 * Which path runs.
 */
static int g_isa = -1; /* -1: not chosen yet */

static int best_isa(void) {
#if WS_Q4_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        return WS_Q4_ISA_AVX512VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return WS_Q4_ISA_AVX2;
#endif
    return WS_Q4_ISA_SCALAR;
}

int ws_q4_isa(void) {
    if (g_isa < 0) {
        int best = best_isa();
        int isa = best;
        const char* env = getenv("WS_Q4_ISA");
        if (env != NULL) {
            int want = -1;
            if (strcmp(env, "scalar") == 0) want = WS_Q4_ISA_SCALAR;
            if (strcmp(env, "avx2") == 0) want = WS_Q4_ISA_AVX2;
            if (strcmp(env, "avx512vnni") == 0) want = WS_Q4_ISA_AVX512VNNI;
            /* An unknown or unsupported name keeps the best path: the kernel must run whatever the env says. */
            if (want >= 0 && want <= best) isa = want;
        }
        g_isa = isa;
    }
    return g_isa;
}

int ws_q4_set_isa(int isa) {
    if (isa < WS_Q4_ISA_SCALAR || isa > best_isa()) return -1;
    g_isa = isa;
    return isa;
}


/* ---------------------------------------------------------------------------------------------------------------
 * A's quantization (once per call; M * K work against the product's M * K * N).
 */
static void quantize_block(const float* a, int8_t* q, float* sa, int32_t* nsum) {
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < QBLK; i++) {
        float v = fabsf(a[i]);
        bad |= !(v <= 3.40282347e38f); /* NaN or infinity */
        amax = v > amax ? v : amax;
    }
    /* MLAS's CompInt8 quantization: scale = max / 127, values times 127 / max (not 1 / scale: that rounds values
     * on a grid of max / 127 to the neighbouring int) rounded to nearest even, so that the int32 sums are the
     * ones ONNX Runtime's MatMulNBits computes. */
    float scale = amax / 127.0f;
    float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < QBLK; i++) {
        /* Round to nearest even by the 1.5 * 2^23 trick (|x| <= 127 here): the same as nearbyintf in the default
         * rounding mode and MLAS's cvtps, but a plain add the compiler vectorizes (nearbyintf is a libm call
         * per element without -msse4.1: a quarter of a 64-row call's time was spent there). */
        float r = (a[i] * inv + 12582912.0f) - 12582912.0f;
        int v = (int)r;
        v = v > 127 ? 127 : (v < -127 ? -127 : v); /* |q| <= 127 keeps AVX2's int16 sums exact */
        q[i] = (int8_t)v;
        sum += v;
    }
    *sa = bad ? NAN : scale; /* a NaN or infinity in A makes its row's outputs NaN, not finite values */
    *nsum = -8 * sum;
}

#if WS_Q4_X86
/* Block (within its group) whose int32 sum lands in vector lane L. The vector paths load 4 consecutive pieces of
 * B (each 4 blocks for AVX-512, 2 for AVX2), one block per 128-bit lane, and transpose 4-byte words with
 * unpack{lo,hi}_epi{32,64}, which works within 128-bit lanes: lane L = 4q + r holds a word of piece r's block in
 * 128-bit lane q. */
static size_t lane_block(int isa, size_t L) {
    if (isa == WS_Q4_ISA_AVX512VNNI) return 4 * (L % 4) + L / 4; /* 16 lanes, piece r = blocks 4r..4r+3 */
    return 2 * (L % 4) + L / 4;                                   /* 8 lanes, piece r = blocks 2r, 2r+1 */
}

/* The vector paths' A: quantize_block's values, laid out in slices (below), in AVX2 (which every AVX-512 CPU has):
 * done in scalar code it cost a quarter of a 64-row call. Slice s = 2j + h (j: B's 4-byte word of a block, h: its
 * low / high nibbles) is `lanes` words of 4 bytes; byte t of lane L's word meets nibble h of B's byte 4j + t,
 * element 2(4j + t) + h of block lane_block(L). */
__attribute__((target("avx2,fma"))) static void quantize_row_vec(int isa, size_t lanes, const float* a, size_t nb,
                                                                   int8_t* qa, float* sa, int32_t* nsum) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    /* within each 128-bit lane: the 8 even bytes, then the 8 odd ones */
    const __m256i evens_odds = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                                12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (size_t g = 0; g * lanes < nb; g++) {
        int32_t* gw = (int32_t*)(qa + g * lanes * QBLK);
        for (size_t L = 0; L < lanes; L++) {
            size_t b = g * lanes + lane_block(isa, L);
            if (b >= nb) continue;
            const float* x = a + b * QBLK;
            __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
            __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
            __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(x0, absmask), _mm256_and_ps(x1, absmask)),
                                     _mm256_max_ps(_mm256_and_ps(x2, absmask), _mm256_and_ps(x3, absmask)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
            /* |x| not below infinity, or unordered: a NaN or infinity makes the row's outputs NaN, as scalar */
            const __m256 inf = _mm256_set1_ps(INFINITY);
            __m256 bad = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(_mm256_and_ps(x0, absmask), inf, _CMP_NLT_UQ),
                                                   _mm256_cmp_ps(_mm256_and_ps(x1, absmask), inf, _CMP_NLT_UQ)),
                                      _mm256_or_ps(_mm256_cmp_ps(_mm256_and_ps(x2, absmask), inf, _CMP_NLT_UQ),
                                                   _mm256_cmp_ps(_mm256_and_ps(x3, absmask), inf, _CMP_NLT_UQ)));
            sa[g * lanes + L] = _mm256_movemask_ps(bad) ? NAN : amax / 127.0f;
            __m256 vi = _mm256_set1_ps(inv);
            /* cvtps rounds to nearest even (the default MXCSR mode), |values| <= 127 */
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(x0, vi)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(x1, vi));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(x2, vi)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(x3, vi));
            __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            nsum[g * lanes + L] = -8 * _mm_cvtsi128_si32(s4);
            /* packs interleave 128-bit lanes: q0-3 q8-11 q16-19 q24-27 | q4-7 q12-15 q20-23 q28-31, dword-wise */
            __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)); /* q0..q31 in order */
            q = _mm256_shuffle_epi8(q, evens_odds);                  /* e0-7 o0-7 | e8-15 o8-15 */
            q = _mm256_permute4x64_epi64(q, 0xD8);                   /* e0-15 | o0-15 */
            /* slice 2j (low nibbles) lane L = evens' dword j; slice 2j+1 (high nibbles) = odds' dword j */
            int32_t w[8];
            _mm256_storeu_si256((__m256i*)w, q);
            for (size_t j = 0; j < 4; j++) {
                gw[(2 * j) * lanes + L] = w[j];
                gw[(2 * j + 1) * lanes + L] = w[4 + j];
            }
        }
    }
}
#endif

void ws_q4_quantize_a(const float* A, size_t M, size_t K, void* scratch) {
    ws_q4_header* h = (ws_q4_header*)align64(scratch);
    int isa = ws_q4_isa();
    size_t nb = K / QBLK, nbp = round_up(nb, GROUP);
    h->isa = isa;
    h->nb = nb;
    h->nbp = nbp;
    h->row_bytes = nbp * (QBLK + 8);
    for (size_t m = 0; m < M; m++) {
        char* row = (char*)h + HEADER + m * h->row_bytes;
        int8_t* qa = ROW_QA(row);
        float* sa = ROW_SA(row, nbp);
        int32_t* nsum = ROW_NSUM(row, nbp);
        const float* a = A + m * K;
        if (isa == WS_Q4_ISA_SCALAR) {
            for (size_t b = 0; b < nb; b++) quantize_block(a + b * QBLK, qa + b * QBLK, sa + b, nsum + b);
            continue;
        }
#if WS_Q4_X86
        size_t lanes = isa == WS_Q4_ISA_AVX512VNNI ? 16 : 8;
        if (nb % lanes) memset(row, 0, h->row_bytes); /* the padded blocks contribute 0 */
        quantize_row_vec(isa, lanes, a, nb, qa, sa, nsum);
#endif
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Scalar reference path.
 */
static void matmul_scalar(const ws_q4_header* h, size_t M, const uint8_t* B, const float* scales, size_t N,
                          float* C, size_t n_begin, size_t n_end) {
    size_t nb = h->nb, nbp = h->nbp;
    for (size_t m = 0; m < M; m++) {
        const char* row = (const char*)h + HEADER + m * h->row_bytes;
        const int8_t* qa = ROW_QA(row);
        const float* sa = ROW_SA(row, nbp);
        const int32_t* nsum = ROW_NSUM(row, nbp);
        for (size_t n = n_begin; n < n_end; n++) {
            const uint8_t* bn = B + n * nb * 16;
            const float* sbn = scales + n * nb;
            float acc = 0.0f;
            for (size_t b = 0; b < nb; b++) {
                int32_t dot = nsum[b];
                for (size_t j = 0; j < 16; j++) {
                    uint8_t byte = bn[b * 16 + j];
                    dot += (int32_t)(byte & 15) * qa[b * QBLK + 2 * j] + (int32_t)(byte >> 4) * qa[b * QBLK + 2 * j + 1];
                }
                acc += sa[b] * sbn[b] * (float)dot;
            }
            C[m * N + n] = acc;
        }
    }
}

#if WS_Q4_X86
/* ---------------------------------------------------------------------------------------------------------------
 * AVX-512 VNNI path. A group = 16 blocks; per row of B and group, 8 slices of 64 bytes (u8 0..15) and the 16
 * scales in lane order are expanded into a stack buffer once and serve every row of A.
 */
/* Rows of A per pass over B: A's share of a pass (at most 96 x 8 groups x 640 bytes = 480 KB) stays in L2 while B's
 * expanded tiles stream past it; measured: 512 rows x K 3072 ran 116 GMAC/s in one pass, 155 at 256 rows. */
#ifndef MC
#define MC 96
#endif

#define NR5 4  /* rows of B per tile */
#define MR5 3  /* rows of A per tile: 12 int32 + 12 float accumulators + 4 B slices fit the 32 registers */
#define KC5 8  /* groups per chunk of K (128 blocks, K = 4096): the buffer stays 18 KB */

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))

T512 static inline __attribute__((always_inline)) void expand512(const uint8_t* bg, const float* sg, size_t nvalid,
                                                                  __m512i out[8], __m512* sb) {
    const __m512i lo = _mm512_set1_epi8(0x0F);
    __m512i r[4];
    if (nvalid >= 16) {
        for (int p = 0; p < 4; p++) r[p] = _mm512_loadu_si512(bg + 64 * p);
    } else {
        for (int p = 0; p < 4; p++) {
            /* Piece p = blocks 4p..4p+3; only the file's blocks are read (the masked words are not touched). */
            __mmask16 mk = 0;
            for (int i = 0; i < 4; i++)
                if ((size_t)(4 * p + i) < nvalid) mk |= (__mmask16)(0xF << (4 * i));
            r[p] = _mm512_maskz_loadu_epi32(mk, bg + 64 * p);
        }
    }
    __m512i t0 = _mm512_unpacklo_epi32(r[0], r[1]), t1 = _mm512_unpackhi_epi32(r[0], r[1]);
    __m512i t2 = _mm512_unpacklo_epi32(r[2], r[3]), t3 = _mm512_unpackhi_epi32(r[2], r[3]);
    __m512i s[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                    _mm512_unpackhi_epi64(t1, t3)};
    for (int j = 0; j < 4; j++) {
        out[2 * j] = _mm512_and_si512(s[j], lo);
        out[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(s[j], 4), lo);
    }
    __mmask16 ms = nvalid >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nvalid) - 1);
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    *sb = _mm512_permutexvar_ps(perm, _mm512_maskz_loadu_ps(ms, sg));
}

/* Sum of each of 4 vectors, as one __m128 (lane r = sum of v[r]). */
T512 static inline __m128 hsum4_512(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1)); /* v0 v1 v0 v1 */
    __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3)); /* v2 v3 v2 v3 */
    __m512 c = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))));
    __m256 d = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    return _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
}

T512 static inline __attribute__((always_inline)) void tile512(const ws_q4_header* h, size_t m0, size_t mr,
                                                                size_t g0, size_t gc, const __m512i (*bb)[KC5][8],
                                                                const __m512 (*sbb)[KC5], float* C, size_t N,
                                                                size_t n0, size_t nr, int first) {
    size_t nbp = h->nbp;
    __m512 acc[MR5][NR5];
    const char* rows[MR5];
    for (size_t i = 0; i < mr; i++) {
        rows[i] = (const char*)h + HEADER + (m0 + i) * h->row_bytes;
        for (int r = 0; r < NR5; r++) acc[i][r] = _mm512_setzero_ps();
    }
    for (size_t gi = 0; gi < gc; gi++) {
        size_t g = g0 + gi;
        __m512i iacc[MR5][NR5];
        for (size_t i = 0; i < mr; i++) {
            __m512i ns = _mm512_load_si512(ROW_NSUM(rows[i], nbp) + g * 16);
            for (int r = 0; r < NR5; r++) iacc[i][r] = ns;
        }
        for (int s = 0; s < 8; s++) {
            __m512i b[NR5];
            for (int r = 0; r < NR5; r++) b[r] = bb[r][gi][s];
            for (size_t i = 0; i < mr; i++) {
                __m512i a = _mm512_load_si512(ROW_QA(rows[i]) + g * 512 + s * 64);
                for (int r = 0; r < NR5; r++) iacc[i][r] = _mm512_dpbusd_epi32(iacc[i][r], b[r], a);
            }
        }
        for (size_t i = 0; i < mr; i++) {
            __m512 sa = _mm512_load_ps(ROW_SA(rows[i], nbp) + g * 16);
            for (int r = 0; r < NR5; r++)
                acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[i][r]), _mm512_mul_ps(sa, sbb[r][gi]), acc[i][r]);
        }
    }
    for (size_t i = 0; i < mr; i++) {
        __m128 sum = hsum4_512(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        float* c = C + (m0 + i) * N + n0;
        if (nr == 4) {
            if (!first) sum = _mm_add_ps(sum, _mm_loadu_ps(c));
            _mm_storeu_ps(c, sum);
        } else {
            float t[4];
            _mm_storeu_ps(t, sum);
            for (size_t r = 0; r < nr; r++) c[r] = first ? t[r] : c[r] + t[r];
        }
    }
}

#ifndef SMALL_M
#define SMALL_M 2
#endif
/* A few rows of A (decode steps): B is expanded in registers and used at once, no buffer. */
T512 static inline __attribute__((always_inline)) void small512(const ws_q4_header* h, size_t mr, const uint8_t* B,
                                                                 const float* scales, size_t N, float* C,
                                                                 size_t n_begin, size_t n_end) {
    size_t nb = h->nb, nbp = h->nbp, ng = (nb + 15) / 16;
    const char* rows[4];
    for (size_t i = 0; i < mr; i++) rows[i] = (const char*)h + HEADER + i * h->row_bytes;
    for (size_t n0 = n_begin; n0 < n_end; n0 += NR5) {
        size_t nr = n_end - n0 < NR5 ? n_end - n0 : NR5;
        __m512 acc[4][NR5];
        for (size_t r = 0; r < NR5; r++) {
            for (size_t i = 0; i < mr; i++) acc[i][r] = _mm512_setzero_ps();
            if (r >= nr) continue;
            for (size_t g = 0; g < ng; g++) {
                size_t b0 = g * 16, nvalid = nb - b0 < 16 ? nb - b0 : 16;
                __m512i bx[8];
                __m512 sb;
                expand512(B + ((n0 + r) * nb + b0) * 16, scales + (n0 + r) * nb + b0, nvalid, bx, &sb);
                for (size_t i = 0; i < mr; i++) {
                    __m512i d = _mm512_load_si512(ROW_NSUM(rows[i], nbp) + g * 16);
                    const int8_t* qa = ROW_QA(rows[i]) + g * 512;
                    for (int s = 0; s < 8; s++) d = _mm512_dpbusd_epi32(d, bx[s], _mm512_load_si512(qa + s * 64));
                    __m512 sc = _mm512_mul_ps(_mm512_load_ps(ROW_SA(rows[i], nbp) + g * 16), sb);
                    acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[i][r]);
                }
            }
        }
        for (size_t i = 0; i < mr; i++) {
            __m128 sum = hsum4_512(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            float* c = C + i * N + n0;
            if (nr == 4) {
                _mm_storeu_ps(c, sum);
            } else {
                float t[4];
                _mm_storeu_ps(t, sum);
                for (size_t r = 0; r < nr; r++) c[r] = t[r];
            }
        }
    }
}

T512 static void matmul_avx512(const ws_q4_header* h, size_t M, const uint8_t* B, const float* scales, size_t N,
                               float* C, size_t n_begin, size_t n_end) {
    size_t nb = h->nb, ng = (nb + 15) / 16;
    switch (M <= SMALL_M ? M : 0) {
        case 1: small512(h, 1, B, scales, N, C, n_begin, n_end); return;
        case 2: small512(h, 2, B, scales, N, C, n_begin, n_end); return;
        case 3: small512(h, 3, B, scales, N, C, n_begin, n_end); return;
        case 4: small512(h, 4, B, scales, N, C, n_begin, n_end); return;
        default: break;
    }
    __m512i bb[NR5][KC5][8];
    __m512 sbb[NR5][KC5];
    for (size_t mc = 0; mc < M; mc += MC)
    for (size_t n0 = n_begin; n0 < n_end; n0 += NR5) {
        size_t nr = n_end - n0 < NR5 ? n_end - n0 : NR5;
        for (size_t g0 = 0; g0 < ng; g0 += KC5) {
            size_t gc = ng - g0 < KC5 ? ng - g0 : KC5;
            for (size_t r = 0; r < NR5; r++)
                for (size_t gi = 0; gi < gc; gi++) {
                    size_t b0 = (g0 + gi) * 16, nvalid = nb - b0 < 16 ? nb - b0 : 16;
                    if (r < nr) {
                        expand512(B + ((n0 + r) * nb + b0) * 16, scales + (n0 + r) * nb + b0, nvalid, bb[r][gi],
                                  &sbb[r][gi]);
                    } else { /* a row past the range: zeros, its sums are never written */
                        for (int s = 0; s < 8; s++) bb[r][gi][s] = _mm512_setzero_si512();
                        sbb[r][gi] = _mm512_setzero_ps();
                    }
                }
            size_t m0 = mc, m_end = M - mc < MC ? M : mc + MC;
            for (; m0 + MR5 <= m_end; m0 += MR5) tile512(h, m0, MR5, g0, gc, bb, sbb, C, N, n0, nr, g0 == 0);
            if (m_end - m0 == 2) tile512(h, m0, 2, g0, gc, bb, sbb, C, N, n0, nr, g0 == 0);
            if (m_end - m0 == 1) tile512(h, m0, 1, g0, gc, bb, sbb, C, N, n0, nr, g0 == 0);
        }
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * AVX2 path. A group = 8 blocks. No VNNI: u8 x s8 pairs with maddubs into int16; 8 slices summed in int16 stay
 * exact (each product pair <= 2 * 15 * 127 = 3810, 8 of them <= 30480), then one madd with ones to int32.
 */
#define NR2 2
#define MR2 3 /* 16 ymm registers: 6 int16 + 6 float accumulators + 2 B slices + A (2x2 and 4x2 measured no faster) */
#define KC2 16

#define T256 __attribute__((target("avx2,fma")))

T256 static inline __attribute__((always_inline)) void expand256(const uint8_t* bg, const float* sg, size_t nvalid, __m256i out[8], __m256* sb) {
    const __m256i lo = _mm256_set1_epi8(0x0F);
    __m256i r[4];
    if (nvalid >= 8) {
        for (int p = 0; p < 4; p++) r[p] = _mm256_loadu_si256((const __m256i*)(bg + 32 * p));
    } else {
        for (int p = 0; p < 4; p++) {
            /* Piece p = blocks 2p, 2p+1; only the file's blocks are read (maskload touches no masked word). */
            int v0 = (size_t)(2 * p) < nvalid ? -1 : 0, v1 = (size_t)(2 * p + 1) < nvalid ? -1 : 0;
            __m256i mk = _mm256_setr_epi32(v0, v0, v0, v0, v1, v1, v1, v1);
            r[p] = _mm256_maskload_epi32((const int*)(bg + 32 * p), mk);
        }
    }
    __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    __m256i s[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
                    _mm256_unpackhi_epi64(t1, t3)};
    for (int j = 0; j < 4; j++) {
        out[2 * j] = _mm256_and_si256(s[j], lo);
        out[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(s[j], 4), lo);
    }
    __m256 sv;
    if (nvalid >= 8) {
        sv = _mm256_loadu_ps(sg);
    } else {
        int sm[8];
        for (int i = 0; i < 8; i++) sm[i] = (size_t)i < nvalid ? -1 : 0;
        sv = _mm256_maskload_ps(sg, _mm256_loadu_si256((const __m256i*)sm));
    }
    *sb = _mm256_permutevar8x32_ps(sv, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
}

T256 static inline __attribute__((always_inline)) void tile256(const ws_q4_header* h, size_t m0, size_t mr,
                                                                size_t g0, size_t gc, const __m256i (*bb)[KC2][8],
                                                                const __m256 (*sbb)[KC2], float* C, size_t N,
                                                                size_t n0, size_t nr, int first) {
    size_t nbp = h->nbp;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MR2][NR2];
    const char* rows[MR2];
    for (size_t i = 0; i < mr; i++) {
        rows[i] = (const char*)h + HEADER + (m0 + i) * h->row_bytes;
        for (int r = 0; r < NR2; r++) acc[i][r] = _mm256_setzero_ps();
    }
    for (size_t gi = 0; gi < gc; gi++) {
        size_t g = g0 + gi;
        __m256i s16[MR2][NR2];
        for (size_t i = 0; i < mr; i++)
            for (int r = 0; r < NR2; r++) s16[i][r] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            __m256i b[NR2];
            for (int r = 0; r < NR2; r++) b[r] = bb[r][gi][s];
            for (size_t i = 0; i < mr; i++) {
                __m256i a = _mm256_load_si256((const __m256i*)(ROW_QA(rows[i]) + g * 256 + s * 32));
                for (int r = 0; r < NR2; r++) s16[i][r] = _mm256_add_epi16(s16[i][r], _mm256_maddubs_epi16(b[r], a));
            }
        }
        for (size_t i = 0; i < mr; i++) {
            __m256 sa = _mm256_load_ps(ROW_SA(rows[i], nbp) + g * 8);
            __m256i ns = _mm256_load_si256((const __m256i*)(ROW_NSUM(rows[i], nbp) + g * 8));
            for (int r = 0; r < NR2; r++) {
                __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(s16[i][r], ones), ns);
                acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sa, sbb[r][gi]), acc[i][r]);
            }
        }
    }
    for (size_t i = 0; i < mr; i++) {
        float* c = C + (m0 + i) * N + n0;
        for (size_t r = 0; r < nr; r++) {
            __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[i][r]), _mm256_extractf128_ps(acc[i][r], 1));
            v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            v = _mm_add_ss(v, _mm_movehdup_ps(v));
            float t = _mm_cvtss_f32(v);
            c[r] = first ? t : c[r] + t;
        }
    }
}

T256 static inline float hsum256(__m256 x) {
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

/* One or two rows of A: B expanded in registers and used at once, as small512. */
T256 static inline __attribute__((always_inline)) void small256(const ws_q4_header* h, size_t mr, const uint8_t* B,
                                                                 const float* scales, size_t N, float* C,
                                                                 size_t n_begin, size_t n_end) {
    size_t nb = h->nb, nbp = h->nbp, ng = (nb + 7) / 8;
    const __m256i ones = _mm256_set1_epi16(1);
    const char* rows[2];
    for (size_t i = 0; i < mr; i++) rows[i] = (const char*)h + HEADER + i * h->row_bytes;
    for (size_t n = n_begin; n < n_end; n++) {
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (size_t g = 0; g < ng; g++) {
            size_t b0 = g * 8, nvalid = nb - b0 < 8 ? nb - b0 : 8;
            __m256i bx[8];
            __m256 sb;
            expand256(B + (n * nb + b0) * 16, scales + n * nb + b0, nvalid, bx, &sb);
            for (size_t i = 0; i < mr; i++) {
                const int8_t* qa = ROW_QA(rows[i]) + g * 256;
                __m256i s16 = _mm256_maddubs_epi16(bx[0], _mm256_load_si256((const __m256i*)qa));
                for (int s = 1; s < 8; s++)
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(bx[s], _mm256_load_si256((const __m256i*)(qa + s * 32))));
                __m256i ns = _mm256_load_si256((const __m256i*)(ROW_NSUM(rows[i], nbp) + g * 8));
                __m256i dot = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), ns);
                __m256 sc = _mm256_mul_ps(_mm256_load_ps(ROW_SA(rows[i], nbp) + g * 8), sb);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, acc[i]);
            }
        }
        for (size_t i = 0; i < mr; i++) C[i * N + n] = hsum256(acc[i]);
    }
}

T256 static void matmul_avx2(const ws_q4_header* h, size_t M, const uint8_t* B, const float* scales, size_t N,
                             float* C, size_t n_begin, size_t n_end) {
    size_t nb = h->nb, ng = (nb + 7) / 8;
    if (M == 1) {
        small256(h, 1, B, scales, N, C, n_begin, n_end);
        return;
    }
    if (M == 2) {
        small256(h, 2, B, scales, N, C, n_begin, n_end);
        return;
    }
    __m256i bb[NR2][KC2][8];
    __m256 sbb[NR2][KC2];
    for (size_t mc = 0; mc < M; mc += MC)
    for (size_t n0 = n_begin; n0 < n_end; n0 += NR2) {
        size_t nr = n_end - n0 < NR2 ? n_end - n0 : NR2;
        for (size_t g0 = 0; g0 < ng; g0 += KC2) {
            size_t gc = ng - g0 < KC2 ? ng - g0 : KC2;
            for (size_t r = 0; r < NR2; r++)
                for (size_t gi = 0; gi < gc; gi++) {
                    size_t b0 = (g0 + gi) * 8, nvalid = nb - b0 < 8 ? nb - b0 : 8;
                    if (r < nr) {
                        expand256(B + ((n0 + r) * nb + b0) * 16, scales + (n0 + r) * nb + b0, nvalid, bb[r][gi],
                                  &sbb[r][gi]);
                    } else {
                        for (int s = 0; s < 8; s++) bb[r][gi][s] = _mm256_setzero_si256();
                        sbb[r][gi] = _mm256_setzero_ps();
                    }
                }
            size_t m0 = mc, m_end = M - mc < MC ? M : mc + MC;
            for (; m0 + MR2 <= m_end; m0 += MR2) tile256(h, m0, MR2, g0, gc, bb, sbb, C, N, n0, nr, g0 == 0);
            if (MR2 > 3 && m_end - m0 == 3) tile256(h, m0, 3, g0, gc, bb, sbb, C, N, n0, nr, g0 == 0);
            if (MR2 > 2 && m_end - m0 == 2) tile256(h, m0, 2, g0, gc, bb, sbb, C, N, n0, nr, g0 == 0);
            if (m_end - m0 == 1) tile256(h, m0, 1, g0, gc, bb, sbb, C, N, n0, nr, g0 == 0);
        }
    }
}
#endif /* WS_Q4_X86 */

void ws_q4_matmul_q(const void* scratch, size_t M, size_t K, const uint8_t* B, const float* scales, size_t N,
                    float* C, size_t n_begin, size_t n_end) {
    const ws_q4_header* h = (const ws_q4_header*)align64(scratch);
    (void)K; /* recorded in the scratch by ws_q4_quantize_a */
    if (n_begin >= n_end) return;
#if WS_Q4_X86
    if (h->isa == WS_Q4_ISA_AVX512VNNI) {
        matmul_avx512(h, M, B, scales, N, C, n_begin, n_end);
        return;
    }
    if (h->isa == WS_Q4_ISA_AVX2) {
        matmul_avx2(h, M, B, scales, N, C, n_begin, n_end);
        return;
    }
#endif
    matmul_scalar(h, M, B, scales, N, C, n_begin, n_end);
}

void ws_q4_matmul(const float* A, size_t M, size_t K, const uint8_t* B, const float* scales, size_t N, float* C,
                  void* scratch, size_t n_begin, size_t n_end) {
    ws_q4_quantize_a(A, M, K, scratch);
    ws_q4_matmul_q(scratch, M, K, B, scales, N, C, n_begin, n_end);
}
