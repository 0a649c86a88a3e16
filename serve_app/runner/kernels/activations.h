/* What the quantized matmuls (q4.c, q8.c) share: activations rounded to int8 per group of 32
 * inputs, fp16 reads, and a call's output tiles split among threads.
 *
 * An activation a ~ sa * qa with qa in -127..127, one scale sa per 32 inputs (its largest
 * magnitude / 127), rounded half to even on every path (lrintf under the default rounding mode,
 * as cvtps_epi32 does); the group's exact float sum and its int8 values' sum are kept too (the
 * q4 minimum's term, q8's offset weights).
 *
 * Threads: a call given several splits its tiles between them (pthreads, created per call:
 * tens of microseconds, so callers ask only for calls of many rows); every output is still
 * computed by one thread in one order, so results do not depend on the thread count.
 */
#ifndef RUNNER_KERNELS_ACTIVATIONS_H
#define RUNNER_KERNELS_ACTIVATIONS_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KERNELS_X86 1
#endif

#define TILE 16
#define GROUP 32
#define ROWS_PER_PASS 4
#define MAX_THREADS 64

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_VNNI = 2 };

typedef struct {
    int8_t *q;     /* [m][k] */
    float *scale;  /* [m][k / 32] */
    float *sum;    /* [m][k / 32]: the floats' sum */
    int32_t *qsum; /* [m][k / 32]: the int8 values' sum */
} activations;

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

#ifdef KERNELS_X86
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

#endif /* KERNELS_X86 */

static void quantize_group(const float *x, int8_t *q, float *scale, float *sum, int isa) {
#ifdef KERNELS_X86
    if (isa == ISA_VNNI) return quantize_group_avx512(x, q, scale, sum);
    if (isa == ISA_AVX2) return quantize_group_avx2(x, q, scale, sum);
#endif
    (void)isa;
    quantize_group_scalar(x, q, scale, sum);
}

/* a [m][k] fp32 rounded per group; 0, or -1 out of memory (free_activations either way). */
static int quantize_activations(const float *a, int64_t m, int64_t k, int isa,
                                activations *act) {
    const int64_t groups = k / GROUP;
    act->q = malloc((size_t)(m * k));
    act->scale = malloc(sizeof(float) * (size_t)(m * groups));
    act->sum = malloc(sizeof(float) * (size_t)(m * groups));
    act->qsum = malloc(sizeof(int32_t) * (size_t)(m * groups));
    if (!act->q || !act->scale || !act->sum || !act->qsum) return -1;
    for (int64_t i = 0; i < m * groups; i++) {
        int8_t *q = act->q + i * GROUP;
        quantize_group(a + i * GROUP, q, act->scale + i, act->sum + i, isa);
        int32_t total = 0;
        for (int j = 0; j < GROUP; j++) total += q[j];
        act->qsum[i] = total;
    }
    return 0;
}

static void free_activations(activations *act) {
    free(act->q);
    free(act->scale);
    free(act->sum);
    free(act->qsum);
}

static inline int32_t four_bytes(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* A format's tiles [t0, t1) of y = a . w^T, as one thread computes them on one path. */
typedef void (*tiles_fn)(const uint8_t *w, int64_t n, int64_t k, const activations *act,
                         int64_t m, float *y, int64_t t0, int64_t t1);

/* What one call computes: a format's tile function per ISA (NULL where the format has no
 * such path: the portable one runs), the weights, activations and output. */
typedef struct {
    const tiles_fn *by_isa; /* [ISA_SCALAR, ISA_AVX2, ISA_VNNI] */
    const uint8_t *w;
    int64_t n, k, m;
    const activations *act;
    float *y;
    int isa;
} matmul_call;

typedef struct {
    const matmul_call *call;
    int64_t t0, t1;
} share;

static void run_share_of(const matmul_call *c, int64_t t0, int64_t t1) {
    const tiles_fn path = c->by_isa[c->isa] ? c->by_isa[c->isa] : c->by_isa[ISA_SCALAR];
    path(c->w, c->n, c->k, c->act, c->m, c->y, t0, t1);
}

static void *run_share(void *arg) {
    const share *s = arg;
    run_share_of(s->call, s->t0, s->t1);
    return NULL;
}

/* The n / TILE tiles in `threads` contiguous shares, the calling thread taking the first; a
 * thread that cannot be created leaves its share to the caller. */
static void run_tiles(const matmul_call *call, int threads) {
    const int64_t count = call->n / TILE;
    if (threads > count) threads = (int)count;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads <= 1) return run_share_of(call, 0, count);
    share shares[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int i = 0; i < threads; i++)
        shares[i] = (share){call, count * i / threads, count * (i + 1) / threads};
    for (int i = 1; i < threads; i++)
        started[i] = pthread_create(&ids[i], NULL, run_share, &shares[i]) == 0;
    run_share(&shares[0]);
    for (int i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(ids[i], NULL);
        else
            run_share(&shares[i]);
    }
}

/* y [m][n] = a [m][k] (fp32, contiguous) times the packed [n][k] matrix w, transposed, on a
 * format's paths: the activations rounded once, then the tiles shared among `threads`.
 * 0 on success, -1 out of memory. */
static int quantized_matmul(const tiles_fn *by_isa, const uint8_t *w, int64_t n, int64_t k,
                            const float *a, int64_t m, float *y, int isa, int threads) {
    activations act;
    const int ok = quantize_activations(a, m, k, isa, &act) == 0;
    if (ok) {
        const matmul_call call = {by_isa, w, n, k, m, &act, y, isa};
        run_tiles(&call, threads);
    }
    free_activations(&act);
    return ok ? 0 : -1;
}

#endif /* RUNNER_KERNELS_ACTIVATIONS_H */
