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
 *
 * Threads: a call given several splits the tiles between them (pthreads, created per call:
 * tens of microseconds, so the caller asks only for calls of many rows); every output is still
 * computed by one thread in one order, so the result does not depend on the thread count.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define Q4_X86 1
#endif

#define TILE 16
#define GROUP 32
#define NIBBLES (TILE * GROUP / 2)
#define BLOCK (NIBBLES + TILE * 4)
#define ROWS_PER_PASS 4
#define MAX_THREADS 64

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_VNNI = 2 };

typedef struct {
    int8_t *q;     /* [m][k] */
    float *scale;  /* [m][k / 32] */
    float *sum;    /* [m][k / 32] */
} activations;

/* ---------------------------------------------------------------- portable C */

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1F,
                   mantissa = h & 0x3FF;
    float value;
    if (exponent == 0)
        value = ldexpf((float)mantissa, -24); /* zero or subnormal */
    else if (exponent == 31)
        value = mantissa ? NAN : INFINITY;
    else
        value = ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
    uint32_t bits;
    memcpy(&bits, &value, 4);
    bits |= sign;
    memcpy(&value, &bits, 4);
    return value;
}

/* Rounds half to even (lrintf under the default rounding mode), as cvtps_epi32 does. */
static void quantize_group_scalar(const float *x, int8_t *q, float *scale, float *sum) {
    float peak = 0.f, total = 0.f;
    for (int i = 0; i < GROUP; i++) {
        peak = fmaxf(peak, fabsf(x[i]));
        total += x[i];
    }
    *sum = total;
    *scale = peak / 127.f;
    const float inverse = peak > 0.f ? 127.f / peak : 0.f;
    for (int i = 0; i < GROUP; i++) {
        const long v = lrintf(x[i] * inverse);
        q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
}

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

#ifdef Q4_X86
/* ---------------------------------------------------------------- activations, SIMD */

/* Vectorized per ISA (a scalar loop of lrintf cost ~1.5 ms of a 1.5B decode step). */
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

static inline int32_t four_bytes(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

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
#endif /* Q4_X86 */

/* ---------------------------------------------------------------- dispatch */

static void quantize_group(const float *x, int8_t *q, float *scale, float *sum, int isa) {
#ifdef Q4_X86
    if (isa == ISA_VNNI) return quantize_group_avx512(x, q, scale, sum);
    if (isa == ISA_AVX2) return quantize_group_avx2(x, q, scale, sum);
#endif
    (void)isa;
    quantize_group_scalar(x, q, scale, sum);
}

static void tiles(const uint8_t *w, int64_t n, int64_t k, const activations *act, int64_t m,
                  float *y, int64_t t0, int64_t t1, int isa) {
#ifdef Q4_X86
    if (isa == ISA_VNNI) return tiles_vnni(w, n, k, act, m, y, t0, t1);
    if (isa == ISA_AVX2) return tiles_avx2(w, n, k, act, m, y, t0, t1);
#endif
    (void)isa;
    tiles_scalar(w, n, k, act, m, y, t0, t1);
}

typedef struct {
    const uint8_t *w;
    int64_t n, k, m, t0, t1;
    const activations *act;
    float *y;
    int isa;
} split;

static void *run_split(void *arg) {
    const split *s = arg;
    tiles(s->w, s->n, s->k, s->act, s->m, s->y, s->t0, s->t1, s->isa);
    return NULL;
}

/* The tiles in `threads` contiguous shares, the calling thread taking the first; a thread
 * that cannot be created leaves its share to the caller. */
static void tiles_threaded(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                           int64_t m, float *y, int isa, int threads) {
    const int64_t count = n / TILE;
    if (threads > count) threads = (int)count;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads <= 1) return tiles(w, n, k, act, m, y, 0, count, isa);
    split shares[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 0; i < threads; i++)
        shares[i] = (split){w, n, k, m, count * i / threads, count * (i + 1) / threads, act, y, isa};
    for (int i = 1; i < threads; i++)
        started[i] = pthread_create(&ids[i], NULL, run_split, &shares[i]) == 0;
    run_split(&shares[0]);
    for (int i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(ids[i], NULL);
        else
            run_split(&shares[i]);
    }
}

/* ---------------------------------------------------------------- entry points */

/* The best path this CPU runs: 2 AVX512-VNNI, 1 AVX2 (with FMA and F16C), 0 portable C. */
int q4_isa(void) {
#ifdef Q4_X86
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
    const int64_t groups = k / GROUP;
    activations act = {
        malloc((size_t)(m * k)),
        malloc(sizeof(float) * (size_t)(m * groups)),
        malloc(sizeof(float) * (size_t)(m * groups)),
    };
    const int ok = act.q && act.scale && act.sum;
    if (ok) {
        for (int64_t i = 0; i < m * groups; i++)
            quantize_group(a + i * GROUP, act.q + i * GROUP, act.scale + i, act.sum + i, isa);
        tiles_threaded(w, n, k, &act, m, y, isa, threads);
    }
    free(act.q);
    free(act.scale);
    free(act.sum);
    return ok ? 0 : -1;
}
