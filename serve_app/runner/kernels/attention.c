/* Decode-step attention: one query's heads over exactly the cache columns it may read.
 *
 * out[h] = softmax(scale * q[h] . k[t], t < end) . v[t], for the query heads h of one token;
 * query head h reads kv head h / group (grouped-query attention, as HF's repeat_kv).
 * Columns are summed in one fixed order whatever else the step holds, so a token's numbers
 * are the same alone, next to other requests, or verified among drafts (qwen2.py says why
 * that matters). torch's batched matmuls took ~230 us per layer at 550 columns of the 1.5B
 * (2 kv heads of 128), ~5 GB/s of cache read; this reads each kv head's keys and values once
 * for all the query heads that share it.
 *
 * 8 floats wide (AVX2 + FMA; AVX-512 CPUs run it too): on Zen 4 a 512-bit op costs two 256-bit
 * ones anyway. Off x86 (no AVX2 to target) attend_one answers -3 and the runner keeps torch's
 * attention (native.py: the kernels' isa is 0 there).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

#define MAX_GROUP 16

/* e^x for x <= 0 (scores minus their maximum): 2^n * p(r), r = x - n ln 2, |r| <= ln2 / 2,
 * a degree-6 Taylor polynomial (relative error < 3e-7); below -87 it returns ~0. */
__attribute__((target("avx2,fma")))
static inline v8 exp_nonpositive(v8 x) {
    const v8 lowest = {-87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f};
    const v8i below = x < lowest;
    x = (v8)(((v8i)x & ~below) | ((v8i)lowest & below));
    const float round_magic = 12582912.f; /* 1.5 * 2^23: adding it rounds to an integer */
    v8 n = (x * 1.44269504f + round_magic) - round_magic;
    v8 r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    v8 p = r * (1.f / 720.f) + 1.f / 120.f;
    p = p * r + 1.f / 24.f;
    p = p * r + 1.f / 6.f;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    v8 scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

__attribute__((target("avx2,fma")))
static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

__attribute__((target("avx2,fma")))
static inline float lanes_sum(v8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* The dot products of one query head with 8 consecutive key columns, as one vector. */
__attribute__((target("avx2,fma")))
static inline __m256 dots8(const float *qh, const float *k, int64_t dim) {
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qh + d);
        for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + i * dim + d), a[i]);
    }
    const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                         _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

__attribute__((target("avx2,fma")))
static float dot(const float *a, const float *b, int64_t dim) {
    v8 acc = {0};
    for (int64_t d = 0; d < dim; d += 8) acc += load8(a + d) * load8(b + d);
    return lanes_sum(acc);
}

/* scores[h][t] = scale * q[h] . k[t] for t < end, then each row's softmax, in place. */
__attribute__((target("avx2,fma")))
static void softmax_scores(const float *q, int64_t group, int64_t dim, const float *k,
                           int64_t end, float scale, float *scores) {
    for (int64_t h = 0; h < group; h++) {
        float *row = scores + h * end;
        const float *qh = q + h * dim;
        int64_t t = 0;
        for (; t + 8 <= end; t += 8) {
            const __m256 s = _mm256_mul_ps(dots8(qh, k + t * dim, dim), _mm256_set1_ps(scale));
            _mm256_storeu_ps(row + t, s);
        }
        for (; t < end; t++) row[t] = dot(qh, k + t * dim, dim) * scale;
        float top = row[0];
        for (t = 1; t < end; t++) top = row[t] > top ? row[t] : top;
        v8 total = {0};
        for (t = 0; t + 8 <= end; t += 8) {
            const v8 e = exp_nonpositive(load8(row + t) - top);
            memcpy(row + t, &e, sizeof e);
            total += e;
        }
        float sum = lanes_sum(total);
        for (; t < end; t++) {
            v8 x = {0};
            x[0] = row[t] - top;
            row[t] = exp_nonpositive(x)[0];
            sum += row[t];
        }
        const float inverse = 1.f / sum;
        for (t = 0; t < end; t++) row[t] *= inverse;
    }
}

/* out[h] = sum over t < end of probs[h][t] * v[t], 64 dimensions at a time (8 accumulators),
 * then any rest 8 at a time. */
__attribute__((target("avx2,fma")))
static void weighted_values(const float *probs, int64_t group, int64_t dim, const float *v,
                            int64_t end, float *out) {
    for (int64_t h = 0; h < group; h++) {
        for (int64_t d0 = 0; d0 + 64 <= dim; d0 += 64) {
            __m256 acc[8];
            for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
            for (int64_t t = 0; t < end; t++) {
                const __m256 p = _mm256_set1_ps(probs[h * end + t]);
                const float *vt = v + t * dim + d0;
                for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vt + 8 * c), acc[c]);
            }
            for (int c = 0; c < 8; c++) _mm256_storeu_ps(out + h * dim + d0 + 8 * c, acc[c]);
        }
        for (int64_t d0 = dim - dim % 64; d0 < dim; d0 += 8) { /* a head_dim not of 64s */
            __m256 acc = _mm256_setzero_ps();
            for (int64_t t = 0; t < end; t++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(probs[h * end + t]),
                                      _mm256_loadu_ps(v + t * dim + d0), acc);
            _mm256_storeu_ps(out + h * dim + d0, acc);
        }
    }
}

/* q [heads][dim], out [heads][dim]; keys / values: kv head j's column t at
 * base + j * kv_stride + t * dim. dim a multiple of 8, heads / kv_heads <= 16.
 * 0 on success, -1 out of memory, -2 a shape it does not take. */
__attribute__((target("avx2,fma")))
int attend_one(const float *q, int64_t heads, int64_t kv_heads, int64_t dim, const float *keys,
               const float *values, int64_t kv_stride, int64_t end, float scale, float *out) {
    const int64_t group = heads / kv_heads;
    if (dim % 8 != 0 || group > MAX_GROUP || group * kv_heads != heads || end < 1) return -2;
    float *scores = malloc(sizeof(float) * (size_t)(group * end));
    if (!scores) return -1;
    for (int64_t j = 0; j < kv_heads; j++) {
        const float *qj = q + j * group * dim;
        softmax_scores(qj, group, dim, keys + j * kv_stride, end, scale, scores);
        weighted_values(scores, group, dim, values + j * kv_stride, end, out + j * group * dim);
    }
    free(scores);
    return 0;
}
#else
int attend_one(const float *q, int64_t heads, int64_t kv_heads, int64_t dim, const float *keys,
               const float *values, int64_t kv_stride, int64_t end, float scale, float *out) {
    (void)q, (void)heads, (void)kv_heads, (void)dim, (void)keys, (void)values;
    (void)kv_stride, (void)end, (void)scale, (void)out;
    return -3;
}
#endif
