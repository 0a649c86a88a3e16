/* 4-bit weights times 8-bit activations for the runner's decode steps (weights_q4.py).
 *
 * y[m][n] = sum over groups g of 32 inputs:
 *     d[n][g] * sa[m][g] * (q[n][g] . qa[m][g])  +  mn[n][g] * sum(a[m][g])
 * where a weight is w = d * q + mn with q in 0..15 (asymmetric, one fp16 scale and minimum per
 * 32 inputs) and an activation a ~ sa * qa with qa in -127..127 (one scale per 32 inputs, the
 * group's exact sum kept for the minimum's term). The integer dot products run on VNNI
 * (vpdpbusd: unsigned 4-bit times signed 8-bit) where the CPU has AVX512-VNNI, else on AVX2
 * (vpmaddubsw, whose 16-bit sums cannot overflow here: 8 pairs of 15 * 127 is 30,480).
 *
 * Layout: output rows in tiles of 16; per tile, per group, one block of BLOCK bytes:
 *   256 bytes of nibbles: for c in 0..3, 64 bytes, byte 4 * r + j of them holding
 *       q[r][8c + j] in its low nibble and q[r][8c + 4 + j] in its high one (r the row in the
 *       tile, j in 0..3): a 64-byte load is 16 rows x 4 inputs, a VNNI register's layout;
 *   16 fp16 scales d, then 16 fp16 minimums mn, one per row of the tile.
 * The tiles' blocks follow each other in memory, so a call streams the matrix once.
 *
 * One thread, no allocation beyond the activations' quantized copy; the caller holds no lock
 * (ctypes releases the GIL).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE 16
#define GROUP 32
#define NIBBLES (TILE * GROUP / 2)
#define BLOCK (NIBBLES + TILE * 4)
#define ROWS_PER_PASS 4

typedef struct {
    int8_t *q;     /* [m][k] */
    float *scale;  /* [m][k / 32] */
    float *sum;    /* [m][k / 32] */
} activations;

/* One group of 32 activations: its exact sum, its scale and its int8 values. Vectorized per
 * ISA (a scalar loop of lrintf cost ~1.5 ms of a 1.5B decode step); both round half to even,
 * as lrintf does under the default rounding mode. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void quantize_group_avx512(const float *x, int8_t *q, float *scale, float *sum) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    const float peak = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    *sum = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
    *scale = peak / 127.f;
    const __m512 inverse = _mm512_set1_ps(peak > 0.f ? 127.f / peak : 0.f);
    _mm_storeu_si128((void *)q, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, inverse))));
    _mm_storeu_si128((void *)(q + 16),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, inverse))));
}

__attribute__((target("avx2,fma")))
static void quantize_group_avx2(const float *x, int8_t *q, float *scale, float *sum) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 v[4], peak = _mm256_setzero_ps(), total = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        peak = _mm256_max_ps(peak, _mm256_andnot_ps(sign, v[i]));
        total = _mm256_add_ps(total, v[i]);
    }
    float lanes[8], sums[8];
    _mm256_storeu_ps(lanes, peak);
    _mm256_storeu_ps(sums, total);
    float top = 0.f, all = 0.f;
    for (int i = 0; i < 8; i++) top = fmaxf(top, lanes[i]);
    for (int i = 0; i < 8; i++) all += sums[i];
    *sum = all;
    *scale = top / 127.f;
    const __m256 inverse = _mm256_set1_ps(top > 0.f ? 127.f / top : 0.f);
    __m256i r[4];
    for (int i = 0; i < 4; i++) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
    const __m256i words = _mm256_packs_epi32(r[0], r[1]), words2 = _mm256_packs_epi32(r[2], r[3]);
    const __m256i bytes = _mm256_packs_epi16(words, words2);
    /* the packs interleave 128-bit lanes: put the 8 groups of 4 back in order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256((void *)q, _mm256_permutevar8x32_epi32(bytes, order));
}

static int quantize_activations(const float *a, int64_t m, int64_t k, int isa, activations *out) {
    const int64_t groups = k / GROUP;
    out->q = malloc((size_t)(m * k));
    out->scale = malloc(sizeof(float) * (size_t)(m * groups));
    out->sum = malloc(sizeof(float) * (size_t)(m * groups));
    if (!out->q || !out->scale || !out->sum) return -1;
    for (int64_t i = 0; i < m * groups; i++) {
        if (isa == 2)
            quantize_group_avx512(a + i * GROUP, out->q + i * GROUP, out->scale + i, out->sum + i);
        else
            quantize_group_avx2(a + i * GROUP, out->q + i * GROUP, out->scale + i, out->sum + i);
    }
    return 0;
}

static void free_activations(activations *act) {
    free(act->q);
    free(act->scale);
    free(act->sum);
}

static inline int32_t four_bytes(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---------------------------------------------------------------- AVX512-VNNI */

/* rows is a constant wherever this is inlined (matmul_vnni's switch): the accumulators then
 * stay in registers. */
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
static void matmul_vnni(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                        int64_t m, float *y) {
    const int64_t groups = k / GROUP;
    for (int64_t t = 0; t < n / TILE; t++) {
        const uint8_t *tile = w + t * groups * BLOCK;
        for (int64_t row0 = 0; row0 < m; row0 += ROWS_PER_PASS) {
            float *out = y + t * TILE;
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

__attribute__((target("avx2,f16c,fma")))
static inline __m256i group_dot_avx2(const uint8_t *block, int half, const int8_t *qa) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i pairs = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const void *)(block + 64 * c + 32 * half));
        const __m256i lo = _mm256_and_si256(v, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        pairs = _mm256_add_epi16(pairs,
                                 _mm256_maddubs_epi16(lo, _mm256_set1_epi32(four_bytes(qa + 8 * c))));
        pairs = _mm256_add_epi16(
            pairs, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(four_bytes(qa + 8 * c + 4))));
    }
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

__attribute__((target("avx2,f16c,fma")))
static void matmul_avx2(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                        int64_t m, float *y) {
    const int64_t groups = k / GROUP;
    for (int64_t t = 0; t < n / TILE; t++) {
        const uint8_t *tile = w + t * groups * BLOCK;
        for (int64_t row = 0; row < m; row++) {
            __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int64_t g = 0; g < groups; g++) {
                const uint8_t *block = tile + g * BLOCK;
                const int8_t *qa = act->q + row * k + g * GROUP;
                const int64_t at = row * groups + g;
                const __m256 sa = _mm256_set1_ps(act->scale[at]);
                const __m256 sum = _mm256_set1_ps(act->sum[at]);
                for (int half = 0; half < 2; half++) {
                    const __m256 d = _mm256_cvtph_ps(
                        _mm_loadu_si128((const void *)(block + NIBBLES + 16 * half)));
                    const __m256 mn = _mm256_cvtph_ps(
                        _mm_loadu_si128((const void *)(block + NIBBLES + 2 * TILE + 16 * half)));
                    const __m256 dot = _mm256_cvtepi32_ps(group_dot_avx2(block, half, qa));
                    acc[half] = _mm256_fmadd_ps(dot, _mm256_mul_ps(d, sa), acc[half]);
                    acc[half] = _mm256_fmadd_ps(mn, sum, acc[half]);
                }
            }
            _mm256_storeu_ps(y + row * n + t * TILE, acc[0]);
            _mm256_storeu_ps(y + row * n + t * TILE + 8, acc[1]);
        }
    }
}

/* ---------------------------------------------------------------- entry points */

/* Which path matmul takes on this CPU: 2 VNNI, 1 AVX2, 0 none (the caller must not call). */
int q4_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return 1;
    return 0;
}

/* y [m][n] = a [m][k] (fp32, contiguous) times the packed [n][k] matrix w, transposed.
 * n a multiple of 16, k of 32. isa: what q4_isa returned. 0 on success, -1 out of memory. */
int q4_matmul(const uint8_t *w, int64_t n, int64_t k, const float *a, int64_t m, float *y,
              int isa) {
    activations act;
    if (quantize_activations(a, m, k, isa, &act) != 0) {
        free_activations(&act);
        return -1;
    }
    if (isa == 2)
        matmul_vnni(w, n, k, &act, m, y);
    else
        matmul_avx2(w, n, k, &act, m, y);
    free_activations(&act);
    return 0;
}
