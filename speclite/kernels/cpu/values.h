// Reading and writing fp32 / bf16 / f16 values for the AVX2 kernels (gemm.h,
// layer_ops.h): one dtype code per tensor, arithmetic in fp32, results rounded to nearest
// even as torch rounds a float to that dtype, and fixed-order horizontal sums.
#pragma once

#include <algorithm>
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
// out[r] = _mm512_reduce_add_ps(a[r]) for r < n <= 16, bit for bit: each vector's halves added (the
// reduction's first level), then hsums eight at a time (as fast as a 16-vector tree, measured).
inline __attribute__((always_inline)) void hsums(const __m512 *a, int n, float *out) {
    __m256 h[16];
    for (int r = 0; r < n; r++)
        h[r] = _mm256_add_ps(_mm512_castps512_ps256(a[r]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[r]), 1)));
    for (int r = 0; r < n; r += 8) hsums(h + r, std::min(8, n - r), out + r);
}
#endif

inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

}  // namespace
