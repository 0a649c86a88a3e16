/* 8-bit weights times 8-bit activations: prompt chunks and scores rounded once (weights_q8.py).
 *
 * y[m][n] = sum over groups g of 32 inputs:  d[n][g] * sa[m][g] * (q[n][g] . qa[m][g])
 * where a weight is w = d * q with q in -127..127 (symmetric, one fp16 scale per row and 32
 * inputs, llama.cpp's Q8_0) and an activation a ~ sa * qa (activations.h). Both sides' scales
 * follow 32 inputs, not a whole row, so one rounding keeps what fbgemm's per-row int8 needed
 * two passes for. Every path computes the same integer dot products:
 *   AVX512-VNNI: weights stored as q + 128 (unsigned), vpdpbusd against the signed activations,
 *       then 128 * sum(qa) taken off (exact in int32);
 *   AVX2: |q| times qa carrying q's sign (vpsignb), vpmaddubsw (2 * 127 * 127 fits 16 bits),
 *       widened to int32 at once;
 *   portable C: any CPU, what the others are tested against.
 *
 * Layout: output rows in tiles of 16; per tile, per group, one block of BLOCK8 bytes:
 *   512 bytes of weights: for c in 0..7, 64 bytes, byte 4 * r + j holding q[r][4c + j] + 128
 *       (r the row in the tile, j in 0..3): a 64-byte load is 16 rows x 4 inputs;
 *   16 fp16 scales d, one per row of the tile.
 * A call of many rows may split its tiles among threads (activations.h).
 */
#include "activations.h"

#define CHUNKS 8
#define WEIGHTS8 (TILE * GROUP)
#define BLOCK8 (WEIGHTS8 + TILE * 2)

/* ---------------------------------------------------------------- portable C */

static void tile_scalar8(const uint8_t *tile, int64_t groups, int64_t k, const activations *act,
                         int64_t row, float *y) {
    float acc[TILE] = {0};
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *block = tile + g * BLOCK8;
        const int8_t *qa = act->q + row * k + g * GROUP;
        const int64_t at = row * groups + g;
        for (int r = 0; r < TILE; r++) {
            int32_t dot = 0;
            for (int c = 0; c < CHUNKS; c++)
                for (int j = 0; j < 4; j++)
                    dot += ((int32_t)block[64 * c + 4 * r + j] - 128) * qa[4 * c + j];
            uint16_t d;
            memcpy(&d, block + WEIGHTS8 + 2 * r, 2);
            acc[r] = fmaf((float)dot, half_to_float(d) * act->scale[at], acc[r]);
        }
    }
    memcpy(y, acc, sizeof acc);
}

static void tiles_scalar8(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                          int64_t m, float *y, int64_t t0, int64_t t1) {
    const int64_t groups = k / GROUP;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t row = 0; row < m; row++)
            tile_scalar8(w + t * groups * BLOCK8, groups, k, act, row, y + row * n + t * TILE);
}

#ifdef KERNELS_X86
/* ---------------------------------------------------------------- AVX512-VNNI */

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma"), always_inline))
static inline void tile_vnni8(const uint8_t *tile, int64_t groups, int64_t k,
                              const activations *act, int64_t row0, int rows, float *y,
                              int64_t ldy) {
    __m512 acc[ROWS_PER_PASS];
    for (int r = 0; r < ROWS_PER_PASS; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *block = tile + g * BLOCK8;
        __m512i w[CHUNKS];
        for (int c = 0; c < CHUNKS; c++) w[c] = _mm512_loadu_si512((const void *)(block + 64 * c));
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(block + WEIGHTS8)));
        for (int r = 0; r < rows; r++) {
            const int64_t row = row0 + r;
            const int8_t *qa = act->q + row * k + g * GROUP;
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
            for (int c = 0; c < CHUNKS; c += 2) {
                even = _mm512_dpbusd_epi32(even, w[c], _mm512_set1_epi32(four_bytes(qa + 4 * c)));
                odd = _mm512_dpbusd_epi32(odd, w[c + 1],
                                          _mm512_set1_epi32(four_bytes(qa + 4 * c + 4)));
            }
            const int64_t at = row * groups + g;
            const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(even, odd),
                                                 _mm512_set1_epi32(128 * act->qsum[at]));
            const __m512 scaled = _mm512_mul_ps(d, _mm512_set1_ps(act->scale[at]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scaled, acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (row0 + r) * ldy, acc[r]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
static void tiles_vnni8(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                        int64_t m, float *y, int64_t t0, int64_t t1) {
    const int64_t groups = k / GROUP;
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = w + t * groups * BLOCK8;
        float *out = y + t * TILE;
        for (int64_t row0 = 0; row0 < m; row0 += ROWS_PER_PASS) {
            switch (m - row0) {
                case 1: tile_vnni8(tile, groups, k, act, row0, 1, out, n); break;
                case 2: tile_vnni8(tile, groups, k, act, row0, 2, out, n); break;
                case 3: tile_vnni8(tile, groups, k, act, row0, 3, out, n); break;
                default: tile_vnni8(tile, groups, k, act, row0, 4, out, n);
            }
        }
    }
}

/* ---------------------------------------------------------------- AVX2 */

/* One half of a tile (8 output rows) for up to ROWS_PER_PASS activation rows, chunk by chunk:
 * a chunk's signed weights and their magnitudes (2 registers) serve every row. */
__attribute__((target("avx2,f16c,fma"), always_inline))
static inline void half_tile_avx2_8(const uint8_t *tile, int64_t groups, int64_t k,
                                    const activations *act, int64_t row0, int rows, int half,
                                    float *y, int64_t ldy) {
    const __m256i offset = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS_PER_PASS];
    for (int r = 0; r < ROWS_PER_PASS; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *block = tile + g * BLOCK8;
        __m256i dots[ROWS_PER_PASS];
        for (int r = 0; r < ROWS_PER_PASS; r++) dots[r] = _mm256_setzero_si256();
        for (int c = 0; c < CHUNKS; c++) {
            const __m256i stored = _mm256_loadu_si256((const void *)(block + 64 * c + 32 * half));
            const __m256i q = _mm256_xor_si256(stored, offset); /* q + 128 back to q */
            const __m256i magnitude = _mm256_abs_epi8(q);
            for (int r = 0; r < rows; r++) {
                const int8_t *qa = act->q + (row0 + r) * k + g * GROUP + 4 * c;
                const __m256i signed_a = _mm256_sign_epi8(_mm256_set1_epi32(four_bytes(qa)), q);
                const __m256i pairs = _mm256_maddubs_epi16(magnitude, signed_a);
                dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(pairs, ones));
            }
        }
        const __m256 d =
            _mm256_cvtph_ps(_mm_loadu_si128((const void *)(block + WEIGHTS8 + 16 * half)));
        for (int r = 0; r < rows; r++) {
            const int64_t at = (row0 + r) * groups + g;
            const __m256 scaled = _mm256_mul_ps(d, _mm256_set1_ps(act->scale[at]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[r]), scaled, acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm256_storeu_ps(y + (row0 + r) * ldy + 8 * half, acc[r]);
}

__attribute__((target("avx2,f16c,fma")))
static void tiles_avx2_8(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                         int64_t m, float *y, int64_t t0, int64_t t1) {
    const int64_t groups = k / GROUP;
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = w + t * groups * BLOCK8;
        float *out = y + t * TILE;
        for (int64_t row0 = 0; row0 < m; row0 += ROWS_PER_PASS)
            for (int half = 0; half < 2; half++) {
                switch (m - row0) {
                    case 1: half_tile_avx2_8(tile, groups, k, act, row0, 1, half, out, n); break;
                    case 2: half_tile_avx2_8(tile, groups, k, act, row0, 2, half, out, n); break;
                    case 3: half_tile_avx2_8(tile, groups, k, act, row0, 3, half, out, n); break;
                    default: half_tile_avx2_8(tile, groups, k, act, row0, 4, half, out, n);
                }
            }
    }
}
#endif /* KERNELS_X86 */

/* ---------------------------------------------------------------- entry point */

static const tiles_fn Q8_PATHS[] = {
    tiles_scalar8,
#ifdef KERNELS_X86
    tiles_avx2_8,
    tiles_vnni8,
#else
    NULL,
    NULL,
#endif
};

/* y [m][n] = a [m][k] (fp32, contiguous) times the packed [n][k] matrix w, transposed.
 * n a multiple of 16, k of 32. isa: at most what q4_isa returned; threads: how many share
 * the tiles. 0 on success, -1 out of memory. */
int q8_matmul(const uint8_t *w, int64_t n, int64_t k, const float *a, int64_t m, float *y,
              int isa, int threads) {
    return quantized_matmul(Q8_PATHS, w, n, k, a, m, y, isa, threads);
}
