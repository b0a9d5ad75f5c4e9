/* ws_q8 kernels: C = A @ dequant(B)^T straight from MatMulNBits' 8-bit bytes (bits 8, zero point 128, blocks of
 * 32/64/128/256). See ws_q8.h for the contract. Built as ws_q4_kernels.c is (plain -O3; the vector paths carry
 * their own target attributes) and on the path ws_q4_isa() chooses.
 *
 * The math per block (as MLAS's CompInt8): A's block is quantized to int8 qa with scale sa = max|a| / 127; the
 * block's contribution to C[m, n] is sa * sb * sum_k (qb[k] - 128) * qa[k], an exact int32 sum.
 *   AVX-512 VNNI: vpdpbusd takes B's bytes as they are (u8) against qa (s8); the -128 * sum(qa) term is the
 *     starting value of the block's int32 lanes (computed once per call, with A). A block of 32 shares a 64-byte
 *     vector with its neighbour (lanes 0-7 and 8-15 then carry their own scales).
 *   AVX2: maddubs saturates u8 x s8 pairs at int16 (255 * 127 * 2 > 32767), so B is made s8 (q - 128, xor 0x80)
 *     and multiplied as |w| (u8, <= 128) x sign(qa, w): each pair <= 2 * 128 * 127 = 32512, exact.
 * The float accumulation keeps one vector of partial sums per (row, column); lanes are added at the end.
 */
#include <math.h>
#include <string.h>

#include "ws_q4.h"
#include "ws_q8.h"

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

#define HEADER 128 /* bytes at the start of the (aligned) scratch: the header below, a multiple of 64 */

/* What ws_q8_quantize_a leaves at the start of the scratch; then one region of row_bytes per row of A:
 *   sav [nu][16] float: per unit, each int32 lane's A scale (the vector paths' scale_a per lane)
 *   nsv [nu][16] int32: per unit, -128 * sum(qa) of its block(s) in the lane that starts each block, else 0
 *   qa  [nu * ubytes] int8: A's values in order, zero padded
 *   sa  [nb] float: per block, A's scale
 * A unit is what one int32 vector sums: a block (block >= 64), or two blocks of 32 (64 bytes). */
typedef struct {
    int isa;
    size_t K, block, nb, nu, ubytes, row_bytes;
    size_t groups_at, group_bytes; /* the row groups' region (below): its offset from the header, bytes a group */
} ws_q8_header;

/* After the rows, for the AVX-512 path at M >= GROUP_MIN: A again in groups of 4 rows (rows past M zero), so that
 * one int32 vector holds 4 rows' partial sums of one block (128-bit lane i = row i): per group
 *   gqa [K / 16][4][16] int8: 16-byte piece p of each row, the 4 rows side by side
 *   gns [nb][16] int32: per block, -128 * sum(qa) of row i in lane 4i, else 0
 *   gsa [nb][16] float: per block, row i's scale in lanes 4i..4i+3
 * B's 16-byte piece, broadcast to the 4 lanes, then meets 4 rows in one vpdpbusd, and a block's float work (convert,
 * scale, add) is done once for 4 rows instead of once a row. */
#define GROUP_MIN 4

_Static_assert(sizeof(ws_q8_header) <= HEADER, "the header overlaps row 0");

#define ROW_SAV(row) ((float*)(row))
#define ROW_NSV(row, nu) ((int32_t*)((char*)(row) + (nu) * 64))
#define ROW_QA(row, nu) ((int8_t*)((char*)(row) + (nu) * 128))
#define ROW_SA(row, nu, ubytes) ((float*)((char*)(row) + (nu) * (128 + (ubytes))))

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static void* align64(const void* p) { return (void*)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

static void layout(size_t K, size_t block, size_t* nb, size_t* nu, size_t* ubytes, size_t* row_bytes) {
    *nb = K / block;
    *ubytes = block < 64 ? 64 : block;
    *nu = block < 64 ? (*nb + 1) / 2 : *nb;
    *row_bytes = *nu * (128 + *ubytes) + round_up(*nb * sizeof(float), 64);
}

static size_t group_bytes(size_t K, size_t nb) { return 4 * K + nb * 128; }

size_t ws_q8_scratch_size(size_t M, size_t K, size_t block) {
    size_t nb, nu, ubytes, row_bytes;
    layout(K, block, &nb, &nu, &ubytes, &row_bytes);
    return 64 /* alignment slack */ + HEADER + M * row_bytes + (M + 3) / 4 * group_bytes(K, nb);
}

/* One block of A: MLAS's CompInt8 quantization (scale = max / 127, values times 127 / max rounded to nearest even:
 * the same as ws_q4's, only the block length is the weights'); returns sum(q), writes q and the scale (NaN when
 * the block holds a NaN or an infinity: its row's outputs become NaN). */
static int32_t quantize_block(const float* a, size_t len, int8_t* q, float* sa) {
    float amax = 0.0f;
    int bad = 0;
    for (size_t i = 0; i < len; i++) {
        float v = fabsf(a[i]);
        bad |= !(v <= 3.40282347e38f);
        amax = v > amax ? v : amax;
    }
    float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (size_t i = 0; i < len; i++) {
        /* round to nearest even by the 1.5 * 2^23 trick (|x| <= 127): vectorized, unlike nearbyintf (ws_q4) */
        float r = (a[i] * inv + 12582912.0f) - 12582912.0f;
        int v = bad ? 0 : (int)r;
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        q[i] = (int8_t)v;
        sum += v;
    }
    *sa = bad ? NAN : amax / 127.0f;
    return sum;
}

void ws_q8_quantize_a(const float* A, size_t M, size_t K, size_t block, void* scratch) {
    ws_q8_header* h = (ws_q8_header*)align64(scratch);
    h->isa = ws_q4_isa();
    h->K = K;
    h->block = block;
    layout(K, block, &h->nb, &h->nu, &h->ubytes, &h->row_bytes);
    size_t nb = h->nb, nu = h->nu, ub = h->ubytes;
    for (size_t m = 0; m < M; m++) {
        char* row = (char*)h + HEADER + m * h->row_bytes;
        memset(row, 0, h->row_bytes);
        float *sav = ROW_SAV(row), *sa = ROW_SA(row, nu, ub);
        int32_t* nsv = ROW_NSV(row, nu);
        int8_t* qa = ROW_QA(row, nu);
        for (size_t b = 0; b < nb; b++) {
            int32_t sum = quantize_block(A + m * K + b * block, block, qa + b * block, sa + b);
            /* the block's first lane within its unit: lane 0, or lane 8 for the second block of 32 */
            size_t u = block < 64 ? b / 2 : b, lane = block < 64 ? (b % 2) * 8 : 0, lanes = block < 64 ? 8 : 16;
            nsv[u * 16 + lane] = -128 * sum;
            for (size_t l = lane; l < lane + lanes; l++) sav[u * 16 + l] = sa[b];
        }
    }
    h->groups_at = HEADER + M * h->row_bytes;
    h->group_bytes = group_bytes(K, nb);
    if (h->isa != WS_Q4_ISA_AVX512VNNI || M < GROUP_MIN) return;
    for (size_t g = 0; g * 4 < M; g++) {
        int8_t* gqa = (int8_t*)((char*)h + h->groups_at + g * h->group_bytes);
        int32_t* gns = (int32_t*)(gqa + 4 * K);
        float* gsa = (float*)(gns + nb * 16);
        memset(gqa, 0, h->group_bytes);
        for (size_t i = 0; i < 4 && g * 4 + i < M; i++) {
            const char* row = (const char*)h + HEADER + (g * 4 + i) * h->row_bytes;
            const int8_t* qa = ROW_QA(row, nu);
            const float* sa = ROW_SA(row, nu, ub);
            for (size_t p = 0; p < K / 16; p++) memcpy(gqa + p * 64 + i * 16, qa + p * 16, 16);
            for (size_t b = 0; b < nb; b++) {
                int32_t sum = 0;
                for (size_t k = 0; k < block; k++) sum += qa[b * block + k];
                gns[b * 16 + 4 * i] = -128 * sum;
                for (size_t l = 0; l < 4; l++) gsa[b * 16 + 4 * i + l] = sa[b];
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * Scalar reference path.
 */
static void matmul_scalar(const ws_q8_header* h, size_t M, const uint8_t* B, const float* scales, size_t N, float* C,
                          size_t n_begin, size_t n_end) {
    size_t K = h->K, block = h->block, nb = h->nb, nu = h->nu, ub = h->ubytes;
    for (size_t m = 0; m < M; m++) {
        const char* row = (const char*)h + HEADER + m * h->row_bytes;
        const int8_t* qa = ROW_QA(row, nu);
        const float* sa = ROW_SA(row, nu, ub);
        for (size_t n = n_begin; n < n_end; n++) {
            float acc = 0.0f;
            for (size_t b = 0; b < nb; b++) {
                const uint8_t* w = B + n * K + b * block;
                const int8_t* a = qa + b * block;
                int32_t dot = 0;
                for (size_t k = 0; k < block; k++) dot += ((int32_t)w[k] - 128) * a[k];
                acc += (float)dot * (sa[b] * scales[n * nb + b]);
            }
            C[m * N + n] = acc;
        }
    }
}

#if WS_Q4_X86
/* ---------------------------------------------------------------------------------------------------------------
 * AVX-512 VNNI path: MR rows of A x NR columns of B per tile; B's bytes are read once per tile, from memory.
 */
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))
#define MR5 2 /* 2 rows x 4 columns: 8 int32 + 8 float accumulators, 4 B vectors (4x2 measured slower at M = 8) */
#define NR5 4

/* The sums of 4 vectors' lanes, as 4 floats (one store for a tile row's 4 columns). */
T512 static inline __m128 hsum4_512(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1)); /* v0 v1 v0 v1 */
    __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3)); /* v2 v3 v2 v3 */
    __m512 c = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))));
    __m256 d = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    return _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
}

/* mr, nr and block are constants where this is inlined (matmul_avx512's switch): the chunk loop then unrolls and
 * the accumulators stay in registers (with a run-time chunk count gcc copies every accumulator each chunk). */
T512 static inline __attribute__((always_inline)) void tile512(const ws_q8_header* h, size_t m0, size_t mr,
                                                                const uint8_t* B, const float* scales, size_t N,
                                                                float* C, size_t n0, size_t nr, size_t block) {
    size_t K = h->K, nb = h->nb, nu = h->nu, ub = block < 64 ? 64 : block, chunks = ub / 64;
    int pairs = block < 64;
    const char* rows[MR5];
    __m512 facc[MR5][NR5];
    for (size_t i = 0; i < mr; i++) {
        rows[i] = (const char*)h + HEADER + (m0 + i) * h->row_bytes;
        for (size_t r = 0; r < nr; r++) facc[i][r] = _mm512_setzero_ps();
    }
    for (size_t u = 0; u < nu; u++) {
        /* blocks of 32, an odd count: the last unit has one block (its 32 bytes are all B has there) */
        int half = pairs && 2 * u + 1 == nb;
        __mmask64 mask = half ? 0xFFFFFFFFull : ~0ull;
        __m512i iacc[MR5][NR5];
        for (size_t i = 0; i < mr; i++) {
            __m512i ns = _mm512_load_si512(ROW_NSV(rows[i], nu) + u * 16);
            for (size_t r = 0; r < nr; r++) iacc[i][r] = ns;
        }
        for (size_t c = 0; c < chunks; c++) {
            __m512i bv[NR5];
            for (size_t r = 0; r < nr; r++) bv[r] = _mm512_maskz_loadu_epi8(mask, B + (n0 + r) * K + u * ub + c * 64);
            for (size_t i = 0; i < mr; i++) {
                __m512i av = _mm512_load_si512(ROW_QA(rows[i], nu) + u * ub + c * 64);
                for (size_t r = 0; r < nr; r++) iacc[i][r] = _mm512_dpbusd_epi32(iacc[i][r], bv[r], av);
            }
        }
        __m512 sb[NR5];
        for (size_t r = 0; r < nr; r++) {
            const float* s = scales + (n0 + r) * nb;
            if (pairs)
                sb[r] = _mm512_insertf32x8(_mm512_set1_ps(s[2 * u]), _mm256_set1_ps(half ? 0.0f : s[2 * u + 1]), 1);
            else
                sb[r] = _mm512_set1_ps(s[u]);
        }
        for (size_t i = 0; i < mr; i++) {
            __m512 sa = _mm512_load_ps(ROW_SAV(rows[i]) + u * 16);
            for (size_t r = 0; r < nr; r++)
                facc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[i][r]), _mm512_mul_ps(sa, sb[r]), facc[i][r]);
        }
    }
    for (size_t i = 0; i < mr; i++) {
        if (nr == NR5)
            _mm_storeu_ps(C + (m0 + i) * N + n0, hsum4_512(facc[i][0], facc[i][1], facc[i][2], facc[i][3]));
        else
            for (size_t r = 0; r < nr; r++) C[(m0 + i) * N + n0 + r] = _mm512_reduce_add_ps(facc[i][r]);
    }
}

/* GR groups of 4 rows x 4 columns (or 1 column: N's last 1-3), from the row groups. BLOCK and GR are constants. */
T512 static inline __attribute__((always_inline)) void gtile512(const ws_q8_header* h, size_t g0, size_t gr,
                                                                 const uint8_t* B, const float* scales, size_t N,
                                                                 float* C, size_t M, size_t n0, size_t nr,
                                                                 size_t block) {
    size_t K = h->K, nb = h->nb, pieces = block / 16;
    const int8_t* gqa[2];
    const int32_t* gns[2];
    const float* gsa[2];
    __m512 facc[2][4];
    for (size_t j = 0; j < gr; j++) {
        gqa[j] = (const int8_t*)((const char*)h + h->groups_at + (g0 + j) * h->group_bytes);
        gns[j] = (const int32_t*)(gqa[j] + 4 * K);
        gsa[j] = (const float*)(gns[j] + nb * 16);
        for (size_t r = 0; r < nr; r++) facc[j][r] = _mm512_setzero_ps();
    }
    for (size_t b = 0; b < nb; b++) {
        __m512i iacc[2][4];
        for (size_t j = 0; j < gr; j++) {
            __m512i ns = _mm512_load_si512(gns[j] + b * 16);
            for (size_t r = 0; r < nr; r++) iacc[j][r] = ns;
        }
        for (size_t p = 0; p < pieces; p++) {
            size_t k = b * block + p * 16;
            __m512i bv[4];
            for (size_t r = 0; r < nr; r++)
                bv[r] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(B + (n0 + r) * K + k)));
            for (size_t j = 0; j < gr; j++) {
                __m512i av = _mm512_load_si512(gqa[j] + k * 4);
                for (size_t r = 0; r < nr; r++) iacc[j][r] = _mm512_dpbusd_epi32(iacc[j][r], bv[r], av);
            }
        }
        for (size_t j = 0; j < gr; j++) {
            __m512 sa = _mm512_load_ps(gsa[j] + b * 16);
            for (size_t r = 0; r < nr; r++) {
                __m512 sc = _mm512_mul_ps(sa, _mm512_set1_ps(scales[(n0 + r) * nb + b]));
                facc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[j][r]), sc, facc[j][r]);
            }
        }
    }
    for (size_t j = 0; j < gr; j++) {
        size_t m0 = (g0 + j) * 4;
        if (nr == 4) {
            /* 128-bit lane i of the sums: row i's 4 columns */
            __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(facc[j][0], facc[j][1]),
                                     _mm512_unpackhi_ps(facc[j][0], facc[j][1]));
            __m512 c = _mm512_add_ps(_mm512_unpacklo_ps(facc[j][2], facc[j][3]),
                                     _mm512_unpackhi_ps(facc[j][2], facc[j][3]));
            __m512 s = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(c))),
                                     _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(c))));
            float t[16];
            _mm512_storeu_ps(t, s);
            for (size_t i = 0; i < 4 && m0 + i < M; i++) memcpy(C + (m0 + i) * N + n0, t + 4 * i, 16);
        } else {
            float t[16];
            _mm512_storeu_ps(t, facc[j][0]);
            for (size_t i = 0; i < 4 && m0 + i < M; i++) C[(m0 + i) * N + n0] = t[4 * i] + t[4 * i + 1] + t[4 * i + 2] + t[4 * i + 3];
        }
    }
}

#define TILES512(BLOCK)                                                              \
    T512 static void matmul512_##BLOCK(const ws_q8_header* h, size_t M, const uint8_t* B, \
                                       const float* scales, size_t N, float* C,           \
                                       size_t n_begin, size_t n_end) {                     \
        if (M >= GROUP_MIN) {                                                              \
            size_t G = (M + 3) / 4;                                                        \
            for (size_t n0 = n_begin; n0 < n_end;) {                                      \
                size_t nr = n_end - n0 < 4 ? 1 : 4;                                        \
                for (size_t g0 = 0; g0 < G; g0 += 2) {                                     \
                    if (nr == 4 && G - g0 >= 2) gtile512(h, g0, 2, B, scales, N, C, M, n0, 4, BLOCK); \
                    else if (nr == 4) gtile512(h, g0, 1, B, scales, N, C, M, n0, 4, BLOCK);  \
                    else if (G - g0 >= 2) gtile512(h, g0, 2, B, scales, N, C, M, n0, 1, BLOCK); \
                    else gtile512(h, g0, 1, B, scales, N, C, M, n0, 1, BLOCK);              \
                }                                                                          \
                n0 += nr;                                                                  \
            }                                                                              \
            return;                                                                        \
        }                                                                                  \
        for (size_t n0 = n_begin; n0 < n_end;) {                                          \
            /* 4 columns a tile; the last 1-3 columns one at a time */                       \
            size_t nr = n_end - n0 < NR5 ? 1 : NR5;                                         \
            for (size_t m0 = 0; m0 < M; m0 += MR5) {                                       \
                size_t mr = M - m0 < MR5 ? M - m0 : MR5;                                   \
                if (nr == NR5 && mr == 2) tile512(h, m0, 2, B, scales, N, C, n0, NR5, BLOCK); \
                else if (nr == NR5) tile512(h, m0, 1, B, scales, N, C, n0, NR5, BLOCK);       \
                else if (mr == 2) tile512(h, m0, 2, B, scales, N, C, n0, 1, BLOCK);           \
                else tile512(h, m0, 1, B, scales, N, C, n0, 1, BLOCK);                        \
            }                                                                              \
            n0 += nr;                                                                      \
        }                                                                                  \
    }
TILES512(32)
TILES512(64)
TILES512(128)
TILES512(256)

static void matmul_avx512(const ws_q8_header* h, size_t M, const uint8_t* B, const float* scales, size_t N, float* C,
                          size_t n_begin, size_t n_end) {
    switch (h->block) {
        case 32: matmul512_32(h, M, B, scales, N, C, n_begin, n_end); break;
        case 64: matmul512_64(h, M, B, scales, N, C, n_begin, n_end); break;
        case 128: matmul512_128(h, M, B, scales, N, C, n_begin, n_end); break;
        default: matmul512_256(h, M, B, scales, N, C, n_begin, n_end); break;
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * AVX2 path: MR rows of A x one column of B per tile, 32 bytes at a time.
 */
#define T256 __attribute__((target("avx2,fma")))
#define MR2 4

T256 static inline float hsum256(__m256 x) {
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

/* mr and block are constants where this is inlined (as tile512). */
T256 static inline __attribute__((always_inline)) void tile256(const ws_q8_header* h, size_t m0, size_t mr,
                                                                const uint8_t* B, const float* scales, size_t N,
                                                                float* C, size_t n, size_t block) {
    size_t K = h->K, nb = h->nb, nu = h->nu, ub = h->ubytes, chunks = block / 32;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    const char* rows[MR2];
    __m256 facc[MR2];
    for (size_t i = 0; i < mr; i++) {
        rows[i] = (const char*)h + HEADER + (m0 + i) * h->row_bytes;
        facc[i] = _mm256_setzero_ps();
    }
    for (size_t b = 0; b < nb; b++) {
        __m256i iacc[MR2];
        for (size_t i = 0; i < mr; i++) iacc[i] = _mm256_setzero_si256();
        for (size_t c = 0; c < chunks; c++) {
            __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(B + n * K + b * block + c * 32)), flip);
            __m256i wabs = _mm256_abs_epi8(w); /* -128 -> 0x80, 128 as the u8 maddubs reads it */
            for (size_t i = 0; i < mr; i++) {
                __m256i a = _mm256_load_si256((const __m256i*)(ROW_QA(rows[i], nu) + b * block + c * 32));
                __m256i p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(a, w));
                iacc[i] = _mm256_add_epi32(iacc[i], _mm256_madd_epi16(p, ones));
            }
        }
        float sb = scales[n * nb + b];
        for (size_t i = 0; i < mr; i++) {
            __m256 s = _mm256_set1_ps(ROW_SA(rows[i], nu, ub)[b] * sb);
            facc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[i]), s, facc[i]);
        }
    }
    for (size_t i = 0; i < mr; i++) C[(m0 + i) * N + n] = hsum256(facc[i]);
}

#define TILES256(BLOCK)                                                                        \
    T256 static void matmul256_##BLOCK(const ws_q8_header* h, size_t M, const uint8_t* B,          \
                                       const float* scales, size_t N, float* C, size_t n_begin,     \
                                       size_t n_end) {                                              \
        for (size_t n = n_begin; n < n_end; n++)                                                    \
            for (size_t m0 = 0; m0 < M; m0 += MR2) {                                                \
                switch (M - m0 < MR2 ? M - m0 : MR2) {                                              \
                    case 4: tile256(h, m0, 4, B, scales, N, C, n, BLOCK); break;                    \
                    case 3: tile256(h, m0, 3, B, scales, N, C, n, BLOCK); break;                    \
                    case 2: tile256(h, m0, 2, B, scales, N, C, n, BLOCK); break;                    \
                    default: tile256(h, m0, 1, B, scales, N, C, n, BLOCK); break;                   \
                }                                                                                   \
            }                                                                                       \
    }
TILES256(32)
TILES256(64)
TILES256(128)
TILES256(256)

static void matmul_avx2(const ws_q8_header* h, size_t M, const uint8_t* B, const float* scales, size_t N, float* C,
                        size_t n_begin, size_t n_end) {
    switch (h->block) {
        case 32: matmul256_32(h, M, B, scales, N, C, n_begin, n_end); break;
        case 64: matmul256_64(h, M, B, scales, N, C, n_begin, n_end); break;
        case 128: matmul256_128(h, M, B, scales, N, C, n_begin, n_end); break;
        default: matmul256_256(h, M, B, scales, N, C, n_begin, n_end); break;
    }
}
#endif /* WS_Q4_X86 */

void ws_q8_matmul_q(const void* scratch, size_t M, const uint8_t* B, const float* scales, size_t N, float* C,
                    size_t n_begin, size_t n_end) {
    const ws_q8_header* h = (const ws_q8_header*)align64(scratch);
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

void ws_q8_matmul(const float* A, size_t M, size_t K, size_t block, const uint8_t* B, const float* scales, size_t N,
                  float* C, void* scratch, size_t n_begin, size_t n_end) {
    ws_q8_quantize_a(A, M, K, block, scratch);
    ws_q8_matmul_q(scratch, M, B, scales, N, C, n_begin, n_end);
}
