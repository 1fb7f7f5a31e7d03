// The decoder's non-matmul work for x86 CPUs with AVX2 + FMA + F16C: RMSNorm, SwiGLU, and RoPE +
// KV-cache write + attention, as functions a thread team runs (layer_ops.cpp calls them one at a
// time from Python, or a whole decoder layer in one team). In torch eager these are 6 and ~20 small
// ops per layer, whose dispatch cost more than their arithmetic on one decode row.
//
// Tensors are fp32, bf16 or f16 (one dtype per call); arithmetic is fp32, results rounded once to
// the dtype (round to nearest even). Every row is computed by the same sequence of operations
// whatever the other rows are, so verifying k+1 tokens gives the logits of k+1 single steps.
#pragma once

#include <omp.h>

#include <cmath>

#include <algorithm>
#include <vector>

#include "values.h"

namespace {


// q . row for fp32 q and a row of `dt` values at p + off, in a fixed order.
inline float dot_row(const float *q, const void *p, int dt, int64_t off, int d) {
    __m256 acc = _mm256_setzero_ps();
    int e = 0;
    for (; e + 8 <= d; e += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), load8(p, dt, off + e), acc);
    float s = hsum(acc);
    for (; e < d; e++) s += q[e] * to_float(p, dt, off + e);
    return s;
}

// acc += w * row for a row of `dt` values at p + off.
inline void add_row(float w, const void *p, int dt, int64_t off, float *acc, int d) {
    const __m256 wv = _mm256_set1_ps(w);
    int e = 0;
    for (; e + 8 <= d; e += 8) _mm256_storeu_ps(acc + e, _mm256_fmadd_ps(wv, load8(p, dt, off + e), _mm256_loadu_ps(acc + e)));
    for (; e < d; e++) acc[e] += w * to_float(p, dt, off + e);
}


// y = weight * round(x / sqrt(mean(x^2) + eps)) for row m of x [M, H], as the model's RMSNorm
// (normalise in fp32, round to the dtype, scale in the dtype).
inline void rms_norm_row(const void *x, const void *weight, void *y, int dt, int64_t m, int H, float eps) {
    const int64_t row = m * H;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= H; i += 8) {
        const __m256 v = load8(x, dt, row + i);
        acc = _mm256_fmadd_ps(v, v, acc);
    }
    float ss = hsum(acc);
    for (; i < H; i++) ss += to_float(x, dt, row + i) * to_float(x, dt, row + i);
    const float r = 1.f / std::sqrt(ss / (float)H + eps);
    for (i = 0; i < H; i++) store(y, dt, row + i, to_float(weight, dt, i) * round_to(dt, to_float(x, dt, row + i) * r));
}

// e^x for 8 values within ~2 ulp: e^x = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 (ln 2 in two
// parts), e^r by Cephes' degree-7 polynomial on |r| <= ln 2 / 2. x is clamped to [-87, 88] (the
// results stay normal and finite). Vectorized, prefill's SwiGLU no longer waits on scalar exp.
inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

// y [M, I] = round(silu(gate)) * up, rounded, for gate_up [M, 2I] (gate columns, then up), as torch's
// F.silu(gate) * up rounds it in the dtype. The team splits the rows' columns in chunks. Column i's
// arithmetic depends on i alone (exp8 for the columns below I rounded down to 8, std::exp above).
inline void swiglu_team(const void *gate_up, void *y, int dt, int M, int I) {
    constexpr int CHUNK = 256;
    const int chunks = (I + CHUNK - 1) / CHUNK, I8 = I & ~7;
#pragma omp for schedule(static)
    for (int task = 0; task < M * chunks; task++) {
        const int m = task / chunks, i1 = std::min(I, (task % chunks + 1) * CHUNK);
        const int64_t gate = (int64_t)m * 2 * I, up = gate + I, out = (int64_t)m * I;
        int i = task % chunks * CHUNK;
        for (; i + 8 <= std::min(i1, I8); i += 8) {
            const __m256 g = load8(gate_up, dt, gate + i);
            alignas(32) float silu[8];
            _mm256_store_ps(silu, _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)))));
            for (int l = 0; l < 8; l++) store(y, dt, out + i + l, round_to(dt, silu[l]) * to_float(gate_up, dt, up + i + l));
        }
        for (; i < i1; i++) {
            const float g = to_float(gate_up, dt, gate + i);
            store(y, dt, out + i, round_to(dt, g / (1.f + std::exp(-g))) * to_float(gate_up, dt, up + i));
        }
    }
}

// One attention layer's work after the q/k/v projections, for t new tokens, run by a team:
//   qkv [t, (H + 2 Hkv) d] the projections (q heads, then k, then v), cos/sin [t, d] the RoPE tables;
//   the rotated keys and the values are written to cache_k/cache_v [Hkv, max_len, d] at slots
//   start..start+t-1; out [t, H d] = softmax(q k^T * scale) v over keys 0..L-1, where new token i
//   sees key j if mask[i, j] (mask [t, L] of bytes), or without a mask if j <= start + i.
// Qwen3-style q/k norms (qk_norm[0] for the queries, [1] for the keys, [d] each in the dtype; null:
// none) are each head's RMSNorm before RoPE, rounded as the RMSNorm module rounds it.
// Keys a row does not see cost nothing and change nothing: the result equals attention over the
// visible keys alone, whatever L is. Ends in a barrier: out is whole.
inline void attention_team(const void *qkv, const void *cos, const void *sin, void *cache_k, void *cache_v, void *out,
                           const uint8_t *mask, int dt, int t, int H, int Hkv, int d, int max_len, int start, int L,
                           float scale, const void *const *qk_norm, float eps) {
    const int half = d / 2, width = (H + 2 * Hkv) * d, group = H / Hkv;
    std::vector<float> q(d), acc(d), scores(L);
    std::vector<char> normed(4 * d);
    // RoPE of one head's vector (row i, column offset c; normed by `norm` first where not null, as
    // rms_norm_row norms a row) into fp32 dst: x cos + rotate_half(x) sin.
    auto rope = [&](int i, int c, const void *norm, float *dst) {
        const void *head = at(qkv, dt, (int64_t)i * width + c);
        if (norm) {
            rms_norm_row(head, norm, normed.data(), dt, 0, d, eps);
            head = normed.data();
        }
        for (int e = 0; e < d; e++) {
            const float x = to_float(head, dt, e), other = to_float(head, dt, e < half ? e + half : e - half);
            dst[e] = x * to_float(cos, dt, (int64_t)i * d + e) + (e < half ? -other : other) * to_float(sin, dt, (int64_t)i * d + e);
        }
    };
#pragma omp for schedule(static)
    for (int task = 0; task < t * Hkv; task++) {
        const int i = task / Hkv, h = task % Hkv;
        const int64_t slot = ((int64_t)h * max_len + start + i) * d;
        rope(i, (H + h) * d, qk_norm ? qk_norm[1] : nullptr, q.data());
        for (int e = 0; e < d; e++) store(cache_k, dt, slot + e, q[e]);
        for (int e = 0; e < d; e++) store(cache_v, dt, slot + e, to_float(qkv, dt, (int64_t)i * width + (H + Hkv + h) * d + e));
    }
#pragma omp for schedule(static)
    for (int task = 0; task < t * H; task++) {
        const int i = task / H, h = task % H, kvh = h / group;
        rope(i, h * d, qk_norm ? qk_norm[0] : nullptr, q.data());
        const int64_t base = (int64_t)kvh * max_len * d;
        float best = -INFINITY;
        for (int j = 0; j < L; j++) {
            const bool seen = mask ? mask[(int64_t)i * L + j] != 0 : j <= start + i;
            if (!seen) continue;
            scores[j] = dot_row(q.data(), cache_k, dt, base + (int64_t)j * d, d) * scale;
            best = std::max(best, scores[j]);
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        float total = 0.f;
        for (int j = 0; j < L; j++) {
            const bool seen = mask ? mask[(int64_t)i * L + j] != 0 : j <= start + i;
            if (!seen) continue;
            const float p = std::exp(scores[j] - best);
            total += p;
            add_row(p, cache_v, dt, base + (int64_t)j * d, acc.data(), d);
        }
        const float inv = 1.f / total;
        for (int e = 0; e < d; e++) store(out, dt, (int64_t)i * H * d + h * d + e, acc[e] * inv);
    }
}

}  // namespace
