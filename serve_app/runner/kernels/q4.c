/* 4-bit weights times 8-bit activations: the runner's decode steps and, split over threads,
 * its prompt chunks (weights_q4.py).
 *
 * y[m][n] = sum over groups g of 32 inputs:
 *     d[n][g] * sa[m][g] * (q[n][g] . qa[m][g])  +  mn[n][g] * sum(a[m][g])
 * where a weight is w = d * q + mn with q in 0..15 (asymmetric, one fp16 scale and minimum per
 * 32 inputs) and an activation a ~ sa * qa with qa in -127..127 (one scale per 32 inputs, the
 * group's exact sum kept for the minimum's term). The integer dot products run on VNNI
 * (vpdpbusd: unsigned 4-bit times signed 8-bit) where the CPU has AVX512-VNNI, on AVX2
 * (vpmaddubsw, whose 16-bit sums cannot overflow here: 8 pairs of 15 * 127 is 30,480) where it
 * has that, else in portable C (any CPU, any compiler: the path every other one is tested
 * against).
 *
 * Layout: output rows in tiles of 16; per tile, per group, one block of BLOCK bytes:
 *   256 bytes of nibbles: for c in 0..3, 64 bytes, byte 4 * r + j of them holding
 *       q[r][8c + j] in its low nibble and q[r][8c + 4 + j] in its high one (r the row in the
 *       tile, j in 0..3): a 64-byte load is 16 rows x 4 inputs, a VNNI register's layout;
 *   16 fp16 scales d, then 16 fp16 minimums mn, one per row of the tile.
 * The tiles' blocks follow each other in memory, so a call streams the matrix once. Each SIMD
 * path unpacks a block's nibbles once for up to ROWS_PER_PASS activation rows (a register
 * tile), and a row's result is computed the same whatever else the call holds.
 * A call of many rows may split its tiles among threads (activations.h).
 */
#include "activations.h"

#define NIBBLES (TILE * GROUP / 2)
#define BLOCK (NIBBLES + TILE * 4)

/* ---------------------------------------------------------------- portable C */

static void tile_scalar(const uint8_t *tile, int64_t groups, int64_t k, const activations *act,
                        int64_t row, float *y) {
    float acc[TILE] = {0};
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *block = tile + g * BLOCK;
        const int8_t *qa = act->q + row * k + g * GROUP;
        const int64_t at = row * groups + g;
        for (int r = 0; r < TILE; r++) {
            int32_t dot = 0;
            for (int c = 0; c < 4; c++)
                for (int j = 0; j < 4; j++) {
                    const uint8_t byte = block[64 * c + 4 * r + j];
                    dot += (byte & 15) * qa[8 * c + j] + (byte >> 4) * qa[8 * c + 4 + j];
                }
            uint16_t d, mn;
            memcpy(&d, block + NIBBLES + 2 * r, 2);
            memcpy(&mn, block + NIBBLES + 2 * TILE + 2 * r, 2);
            acc[r] = fmaf((float)dot, half_to_float(d) * act->scale[at], acc[r]);
            acc[r] = fmaf(half_to_float(mn), act->sum[at], acc[r]);
        }
    }
    memcpy(y, acc, sizeof acc);
}

static void tiles_scalar(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                         int64_t m, float *y, int64_t t0, int64_t t1) {
    const int64_t groups = k / GROUP;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t row = 0; row < m; row++)
            tile_scalar(w + t * groups * BLOCK, groups, k, act, row, y + row * n + t * TILE);
}

#ifdef KERNELS_X86
/* ---------------------------------------------------------------- AVX512-VNNI */

/* rows is a constant wherever this is inlined (the switch in tiles_vnni): the accumulators
 * then stay in registers. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma"), always_inline))
static inline void tile_vnni(const uint8_t *tile, int64_t groups, int64_t k,
                             const activations *act, int64_t row0, int rows, float *y,
                             int64_t ldy) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 acc[ROWS_PER_PASS];
    for (int r = 0; r < ROWS_PER_PASS; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *block = tile + g * BLOCK;
        __m512i w[8];
        for (int c = 0; c < 4; c++) {
            const __m512i v = _mm512_loadu_si512((const void *)(block + 64 * c));
            w[2 * c] = _mm512_and_si512(v, low);
            w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(block + NIBBLES)));
        const __m512 mn =
            _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(block + NIBBLES + 2 * TILE)));
        for (int r = 0; r < rows; r++) {
            const int64_t row = row0 + r;
            const int8_t *qa = act->q + row * k + g * GROUP;
            /* two chains, not one: vpdpbusd's latency, not its throughput, bounded one */
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
            for (int c = 0; c < 4; c++) {
                even = _mm512_dpbusd_epi32(even, w[2 * c],
                                           _mm512_set1_epi32(four_bytes(qa + 8 * c)));
                odd = _mm512_dpbusd_epi32(odd, w[2 * c + 1],
                                          _mm512_set1_epi32(four_bytes(qa + 8 * c + 4)));
            }
            const __m512i dot = _mm512_add_epi32(even, odd);
            const int64_t at = row * groups + g;
            const __m512 scaled = _mm512_mul_ps(d, _mm512_set1_ps(act->scale[at]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scaled, acc[r]);
            acc[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(act->sum[at]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + (row0 + r) * ldy, acc[r]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
static void tiles_vnni(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                       int64_t m, float *y, int64_t t0, int64_t t1) {
    const int64_t groups = k / GROUP;
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = w + t * groups * BLOCK;
        float *out = y + t * TILE;
        for (int64_t row0 = 0; row0 < m; row0 += ROWS_PER_PASS) {
            switch (m - row0) {
                case 1: tile_vnni(tile, groups, k, act, row0, 1, out, n); break;
                case 2: tile_vnni(tile, groups, k, act, row0, 2, out, n); break;
                case 3: tile_vnni(tile, groups, k, act, row0, 3, out, n); break;
                default: tile_vnni(tile, groups, k, act, row0, 4, out, n);
            }
        }
    }
}

/* ---------------------------------------------------------------- AVX2 */

/* One half of a tile (8 output rows) for up to ROWS_PER_PASS activation rows: the half's
 * nibbles are unpacked once per group (8 registers) and reused by every row. */
__attribute__((target("avx2,f16c,fma"), always_inline))
static inline void half_tile_avx2(const uint8_t *tile, int64_t groups, int64_t k,
                                  const activations *act, int64_t row0, int rows, int half,
                                  float *y, int64_t ldy) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS_PER_PASS];
    for (int r = 0; r < ROWS_PER_PASS; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *block = tile + g * BLOCK;
        __m256i w[8];
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const void *)(block + 64 * c + 32 * half));
            w[2 * c] = _mm256_and_si256(v, low);
            w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
        const __m256 d =
            _mm256_cvtph_ps(_mm_loadu_si128((const void *)(block + NIBBLES + 16 * half)));
        const __m256 mn = _mm256_cvtph_ps(
            _mm_loadu_si128((const void *)(block + NIBBLES + 2 * TILE + 16 * half)));
        for (int r = 0; r < rows; r++) {
            const int64_t row = row0 + r;
            const int8_t *qa = act->q + row * k + g * GROUP;
            __m256i pairs = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                pairs = _mm256_add_epi16(
                    pairs, _mm256_maddubs_epi16(w[2 * c], _mm256_set1_epi32(four_bytes(qa + 8 * c))));
                pairs = _mm256_add_epi16(
                    pairs,
                    _mm256_maddubs_epi16(w[2 * c + 1], _mm256_set1_epi32(four_bytes(qa + 8 * c + 4))));
            }
            const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            const int64_t at = row * groups + g;
            acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(d, _mm256_set1_ps(act->scale[at])), acc[r]);
            acc[r] = _mm256_fmadd_ps(mn, _mm256_set1_ps(act->sum[at]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm256_storeu_ps(y + (row0 + r) * ldy + 8 * half, acc[r]);
}

/* A whole tile for one activation row (a decode step's usual call): both halves in one pass
 * over the groups, so the tile's bytes are read once; the same sums as half_tile_avx2's. */
__attribute__((target("avx2,f16c,fma"), always_inline))
static inline void tile_row_avx2(const uint8_t *tile, int64_t groups, int64_t k,
                                 const activations *act, int64_t row, float *y) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *block = tile + g * BLOCK;
        const int8_t *qa = act->q + row * k + g * GROUP;
        const int64_t at = row * groups + g;
        const __m256 sa = _mm256_set1_ps(act->scale[at]), sum = _mm256_set1_ps(act->sum[at]);
        for (int half = 0; half < 2; half++) {
            __m256i pairs = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                const __m256i v = _mm256_loadu_si256((const void *)(block + 64 * c + 32 * half));
                const __m256i lo = _mm256_and_si256(v, low);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                pairs = _mm256_add_epi16(
                    pairs, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(four_bytes(qa + 8 * c))));
                pairs = _mm256_add_epi16(
                    pairs, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(four_bytes(qa + 8 * c + 4))));
            }
            const __m256 d =
                _mm256_cvtph_ps(_mm_loadu_si128((const void *)(block + NIBBLES + 16 * half)));
            const __m256 mn = _mm256_cvtph_ps(
                _mm_loadu_si128((const void *)(block + NIBBLES + 2 * TILE + 16 * half)));
            const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            acc[half] = _mm256_fmadd_ps(dot, _mm256_mul_ps(d, sa), acc[half]);
            acc[half] = _mm256_fmadd_ps(mn, sum, acc[half]);
        }
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + 8, acc[1]);
}

__attribute__((target("avx2,f16c,fma")))
static void tiles_avx2(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                       int64_t m, float *y, int64_t t0, int64_t t1) {
    const int64_t groups = k / GROUP;
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *tile = w + t * groups * BLOCK;
        float *out = y + t * TILE;
        for (int64_t row0 = 0; row0 < m; row0 += ROWS_PER_PASS) {
            if (m - row0 == 1) {
                tile_row_avx2(tile, groups, k, act, row0, out + row0 * n);
                continue;
            }
            for (int half = 0; half < 2; half++) {
                switch (m - row0) {
                    case 2: half_tile_avx2(tile, groups, k, act, row0, 2, half, out, n); break;
                    case 3: half_tile_avx2(tile, groups, k, act, row0, 3, half, out, n); break;
                    default: half_tile_avx2(tile, groups, k, act, row0, 4, half, out, n);
                }
            }
        }
    }
}
#endif /* KERNELS_X86 */

/* ---------------------------------------------------------------- dispatch */

static const tiles_fn Q4_PATHS[] = {
    tiles_scalar,
#ifdef KERNELS_X86
    tiles_avx2,
    tiles_vnni,
#else
    NULL,
    NULL,
#endif
};

/* The best path this CPU runs: 2 AVX512-VNNI, 1 AVX2 (with FMA and F16C), 0 portable C. */
int q4_isa(void) {
#ifdef KERNELS_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c"))
        return ISA_VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
#endif
    return ISA_SCALAR;
}

/* y [m][n] = a [m][k] (fp32, contiguous) times the packed [n][k] matrix w, transposed.
 * n a multiple of 16, k of 32. isa: at most what q4_isa returned; threads: how many share
 * the tiles (1: the calling thread alone). 0 on success, -1 out of memory. */
int q4_matmul(const uint8_t *w, int64_t n, int64_t k, const float *a, int64_t m, float *y,
              int isa, int threads) {
    return quantized_matmul(Q4_PATHS, w, n, k, a, m, y, isa, threads);
}
