// Reading and writing fp32 / bf16 / f16 values for the AVX2 kernels (gemm.h,
// layer_ops.h): one dtype code per tensor, arithmetic in fp32, results rounded to nearest
// even as torch rounds a float to that dtype, and fixed-order horizontal sums.
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "speclite's AVX2 kernels need AVX2, FMA and F16C"
#endif

namespace {

enum Dtype { F32 = 0, BF16 = 1, F16 = 2 };

// Element i of an array of dtype dt.
inline char *at(const void *p, int dt, int64_t i) { return (char *)p + i * (dt == F32 ? 4 : 2); }

inline float to_float(const void *x, int dt, int64_t i) {
    if (dt == F32) return ((const float *)x)[i];
    uint16_t h = ((const uint16_t *)x)[i];
    if (dt == F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// n values from i widened to fp32 into out (a loop per dtype, for the compiler to vectorize).
inline void widen(const void *x, int dt, int64_t i, int n, float *out) {
    if (dt == F32) {
        memcpy(out, (const float *)x + i, (size_t)n * 4);
    } else if (dt == F16) {
        const uint16_t *h = (const uint16_t *)x + i;
        int j = 0;
        for (; j + 8 <= n; j += 8) _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + j))));
        for (; j < n; j++) out[j] = _cvtsh_ss(h[j]);
    } else {
        const uint16_t *h = (const uint16_t *)x + i;
        uint32_t *o = (uint32_t *)out;
        for (int j = 0; j < n; j++) o[j] = (uint32_t)h[j] << 16;
    }
}

// Values i..i+7 widened to fp32.
inline __m256 load8(const void *x, int dt, int64_t i) {
    if (dt == F32) return _mm256_loadu_ps((const float *)x + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
    if (dt == F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline void store(void *y, int dt, int64_t i, float v) {
    if (dt == F32) {
        ((float *)y)[i] = v;
    } else if (dt == F16) {
        ((uint16_t *)y)[i] = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
    } else {
        uint32_t u;
        memcpy(&u, &v, 4);
        u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even, as torch's float -> bf16
        ((uint16_t *)y)[i] = (uint16_t)(u >> 16);
    }
}

// 8 values rounded to dt, each as store() rounds it, into y.
inline void store8(void *y, int dt, __m256 v) {
    if (dt == F32) return _mm256_storeu_ps((float *)y, v);
    if (dt == F16) return _mm_storeu_si128((__m128i *)y, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    __m256i u = _mm256_castps_si256(v);
    u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    u = _mm256_srli_epi32(u, 16);
    _mm_storeu_si128((__m128i *)y, _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
}

#if defined(__AVX512F__)
// 16 values rounded to dt, each as store() rounds it, into y.
inline void store16(void *y, int dt, __m512 v) {
    if (dt == F32) return _mm512_storeu_ps(y, v);
    if (dt == F16) return _mm256_storeu_si256((__m256i *)y, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    __m512i u = _mm512_castps_si512(v);
    u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    _mm256_storeu_si256((__m256i *)y, _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
}
#endif

// n fp32 values of v rounded to dt into y[i, i + n): widen()'s way back, store() by store().
inline void store_row(void *y, int dt, int64_t i, int n, const float *v) {
    int j = 0;
    for (; j + 8 <= n; j += 8) store8(at(y, dt, i + j), dt, _mm256_loadu_ps(v + j));
    for (; j < n; j++) store(y, dt, i + j, v[j]);
}

// v rounded to the dtype and back: what storing it and reading it again gives.
inline float round_to(int dt, float v) {
    if (dt == F32) return v;
    if (dt == F16) return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
    uint32_t u;
    memcpy(&u, &v, 4);
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
    memcpy(&v, &u, 4);
    return v;
}

// A fixed reduction order, the same for every tile and row.
inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// out[r] = hsum(a[r]) for r < n <= 8, bit for bit: the vectors' reductions in one tree of shuffles
// (hsum's, level by level: halves, pairs, neighbours), about a third of the instructions of n hsums.
inline __attribute__((always_inline)) void hsums(const __m256 *a, int n, float *out) {
    __m256 v[8], b[4], c[2];
    for (int r = 0; r < 8; r++) v[r] = r < n ? a[r] : _mm256_setzero_ps();
    for (int r = 0; r < 4; r++)  // b[r]: v[2r] (low 128 bits) and v[2r + 1] (high), 4 partial sums each
        b[r] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * r], v[2 * r + 1], 0x20), _mm256_permute2f128_ps(v[2 * r], v[2 * r + 1], 0x31));
    for (int r = 0; r < 2; r++)  // c[r]: 128-bit lane l holds v[4r + l] and v[4r + 2 + l], 2 partial sums each
        c[r] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * r], b[2 * r + 1], 0x44), _mm256_shuffle_ps(b[2 * r], b[2 * r + 1], 0xEE));
    alignas(32) float s[8];  // lane 4l + g holds v[2g + l]
    _mm256_store_ps(s, _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD)));
    for (int r = 0; r < n; r++) out[r] = s[r % 2 * 4 + r / 2];
}

#if defined(__AVX512F__)
// The 16 sums of a[0..16) in one vector, lane r = a[r]'s 16 lanes summed as _mm512_reduce_add_ps sums
// them (halves, quarters, pairs, neighbours), the 16 reductions sharing their shuffles.
inline __attribute__((always_inline)) __m512 reduce16(const __m512 (&a)[16]) {
    __m512 b[8], c[4], e[2];
    for (int r = 0; r < 8; r++)  // b[r]: a[2r] (low 256 bits) and a[2r + 1] (high), 8 partial sums each
        b[r] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * r], a[2 * r + 1], 0x44), _mm512_shuffle_f32x4(a[2 * r], a[2 * r + 1], 0xEE));
    for (int r = 0; r < 4; r++)  // c[r]: a[4r..4r+3], one per 128 bits, 4 partial sums each
        c[r] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * r], b[2 * r + 1], 0x88), _mm512_shuffle_f32x4(b[2 * r], b[2 * r + 1], 0xDD));
    for (int r = 0; r < 2; r++)  // e[r]: 128-bit lane l holds a[8r + l] and a[8r + 4 + l], 2 partial sums each
        e[r] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * r], c[2 * r + 1], 0x44), _mm512_shuffle_ps(c[2 * r], c[2 * r + 1], 0xEE));
    // lane 4l + g holds a[4g + l]: back into order
    const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88), _mm512_shuffle_ps(e[0], e[1], 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s);
}

// out[r] = _mm512_reduce_add_ps(a[r]) for r < n <= 16, bit for bit, by reduce16. Reading the tree's
// lanes by index instead of its permute, or adding each vector's halves and then taking hsums of
// eight, made the dense products' former dot-product tiles 5-12% slower at 5 and 9 rows.
inline __attribute__((always_inline)) void hsums(const __m512 *a, int n, float *out) {
    __m512 v[16];
    for (int r = 0; r < 16; r++) v[r] = r < n ? a[r] : _mm512_setzero_ps();
    alignas(64) float s[16];
    _mm512_store_ps(s, reduce16(v));
    for (int r = 0; r < n; r++) out[r] = s[r];
}
#endif

inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

}  // namespace
