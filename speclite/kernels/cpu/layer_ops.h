// The decoder's non-matmul work for x86 CPUs with AVX2 + FMA + F16C: RMSNorm, SwiGLU, and RoPE +
// KV-cache write + attention, as functions a thread team runs (kernels.cpp calls them one at a
// time from Python, or a whole decoder layer in one team). In torch eager these are 6 and ~20 small
// ops per layer, whose dispatch cost more than their arithmetic on one decode row.
//
// Tensors are fp32, bf16 or f16 (one dtype per call); arithmetic is fp32, results rounded once to
// the dtype (round to nearest even). Every row is computed by the same sequence of operations
// whatever the other rows are, so verifying k+1 tokens gives the logits of k+1 single steps.
#pragma once

#include <cmath>

#include <algorithm>
#include <vector>

#include "team.h"
#include "values.h"

namespace {


// q . row for each of n <= 8 consecutive rows of d `DT` values from p + off (lanes past n repeat
// row n - 1: the caller drops them). Each row's sum has one fixed order: 8-lane partial sums (the
// rows' chains interleaved), reduced across the 8 rows together (lane l + l + 4, then + 2, then
// + 1), then the d % 8 tail.
template <int DT>
inline __m256 dot_keys(const float *q, const void *p, int64_t off, int d, int n) {
    const int d8 = d & ~7;
    int64_t row[8];
    for (int r = 0; r < 8; r++) row[r] = off + (int64_t)std::min(r, n - 1) * d;
    __m256 a[8];
    for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
    for (int e = 0; e < d8; e += 8) {
        const __m256 qv = _mm256_loadu_ps(q + e);
        for (int r = 0; r < 8; r++) a[r] = _mm256_fmadd_ps(qv, load8(p, DT, row[r] + e), a[r]);
    }
    __m256 b[4], c[2];
    for (int r = 0; r < 4; r++)  // b[r]: rows 2r and 2r + 1, four partial sums each
        b[r] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * r], a[2 * r + 1], 0x20), _mm256_permute2f128_ps(a[2 * r], a[2 * r + 1], 0x31));
    for (int r = 0; r < 2; r++)  // c[r]: rows 4r, 4r + 2 (low half), 4r + 1, 4r + 3 (high half), two each
        c[r] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * r], b[2 * r + 1], 0x44), _mm256_shuffle_ps(b[2 * r], b[2 * r + 1], 0xEE));
    // rows 0, 2, 4, 6 | 1, 3, 5, 7, one sum each, back into row order
    const __m256 s = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));
    __m256 out = _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    if (d8 < d) {
        alignas(32) float v[8];
        _mm256_store_ps(v, out);
        for (int r = 0; r < 8; r++)
            for (int e = d8; e < d; e++) v[r] += q[e] * to_float(p, DT, row[r] + e);
        out = _mm256_load_ps(v);
    }
    return out;
}

inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// out[e0..e0 + 8R) = the sum over rows j < n with w[j] != 0 of w[j] * row j, rows of d `DT` values
// from p + off, added in the order of j, in registers.
template <int DT, int R>
inline void weighted_cols(const float *w, int n, const void *p, int64_t off, int d, int e0, float *out) {
    __m256 a[R];
    for (int r = 0; r < R; r++) a[r] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        if (w[j] == 0.f) continue;
        const __m256 wv = _mm256_set1_ps(w[j]);
        const int64_t row = off + (int64_t)j * d + e0;
        for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(wv, load8(p, DT, row + r * 8), a[r]);
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out + e0 + r * 8, a[r]);
}

// out[0..d) as weighted_cols: 64 columns at a time, then 32, 16, 8, then the d % 8 tail.
template <int DT>
inline void weighted_rows(const float *w, int n, const void *p, int64_t off, int d, float *out) {
    const int d8 = d & ~7;
    int e0 = 0;
    for (; e0 + 64 <= d8; e0 += 64) weighted_cols<DT, 8>(w, n, p, off, d, e0, out);
    if (e0 + 32 <= d8) weighted_cols<DT, 4>(w, n, p, off, d, e0, out), e0 += 32;
    if (e0 + 16 <= d8) weighted_cols<DT, 2>(w, n, p, off, d, e0, out), e0 += 16;
    if (e0 + 8 <= d8) weighted_cols<DT, 1>(w, n, p, off, d, e0, out), e0 += 8;
    for (int e = d8; e < d; e++) {
        float s = 0.f;
        for (int j = 0; j < n; j++)
            if (w[j] != 0.f) s += w[j] * to_float(p, DT, off + (int64_t)j * d + e);
        out[e] = s;
    }
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
inline void swiglu_team(const void *gate_up, void *y, int dt, int M, int I, team::TeamBarrier &bar) {
    constexpr int CHUNK = 256;
    const int chunks = (I + CHUNK - 1) / CHUNK, I8 = I & ~7;
    const auto [task0, task1] = team::share(M * chunks);
    for (int task = task0; task < task1; task++) {
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
    bar.wait(team::size());
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
                           float scale, const void *const *qk_norm, float eps, team::TeamBarrier &bar) {
    const int half = d / 2, width = (H + 2 * Hkv) * d, group = H / Hkv;
    std::vector<float> q(d), acc(d), scores((L + 7) / 8 * 8);
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
    const auto [kv0, kv1] = team::share(t * Hkv);
    for (int task = kv0; task < kv1; task++) {
        const int i = task / Hkv, h = task % Hkv;
        const int64_t slot = ((int64_t)h * max_len + start + i) * d;
        rope(i, (H + h) * d, qk_norm ? qk_norm[1] : nullptr, q.data());
        for (int e = 0; e < d; e++) store(cache_k, dt, slot + e, q[e]);
        for (int e = 0; e < d; e++) store(cache_v, dt, slot + e, to_float(qkv, dt, (int64_t)i * width + (H + Hkv + h) * d + e));
    }
    bar.wait(team::size());  // the keys and values are in the cache
    const auto [q0, q1] = team::share(t * H);
    for (int task = q0; task < q1; task++) {
        const int i = task / H, h = task % H, kvh = h / group;
        rope(i, h * d, qk_norm ? qk_norm[0] : nullptr, q.data());
        const int64_t base = (int64_t)kvh * max_len * d;
        // Scores 8 keys at a time (a key this row does not see, or past L: -inf), then their
        // exponentials (0 for those keys), then the weighted values of the keys with weight > 0.
        __m256 top = _mm256_set1_ps(-INFINITY);
        for (int j0 = 0; j0 < L; j0 += 8) {
            const int n = std::min(8, L - j0);
            alignas(32) int seen[8];
            for (int l = 0; l < 8; l++)
                seen[l] = l < n && (mask ? mask[(int64_t)i * L + j0 + l] != 0 : j0 + l <= start + i) ? -1 : 0;
            const int64_t off = base + (int64_t)j0 * d;
            const __m256 dots = dt == F32    ? dot_keys<F32>(q.data(), cache_k, off, d, n)
                                : dt == BF16 ? dot_keys<BF16>(q.data(), cache_k, off, d, n)
                                             : dot_keys<F16>(q.data(), cache_k, off, d, n);
            const __m256 s = _mm256_mul_ps(dots, _mm256_set1_ps(scale));
            const __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, _mm256_castsi256_ps(_mm256_load_si256((const __m256i *)seen)));
            _mm256_storeu_ps(scores.data() + j0, v);
            top = _mm256_max_ps(top, v);
        }
        const __m256 best = _mm256_set1_ps(hmax(top)), none = _mm256_set1_ps(-INFINITY);
        __m256 sum = _mm256_setzero_ps();
        for (int j0 = 0; j0 < L; j0 += 8) {
            const __m256 v = _mm256_loadu_ps(scores.data() + j0);
            const __m256 e = _mm256_andnot_ps(_mm256_cmp_ps(v, none, _CMP_EQ_OQ), exp8(_mm256_sub_ps(v, best)));
            _mm256_storeu_ps(scores.data() + j0, e);
            sum = _mm256_add_ps(sum, e);
        }
        if (dt == F32)
            weighted_rows<F32>(scores.data(), L, cache_v, base, d, acc.data());
        else if (dt == BF16)
            weighted_rows<BF16>(scores.data(), L, cache_v, base, d, acc.data());
        else
            weighted_rows<F16>(scores.data(), L, cache_v, base, d, acc.data());
        const float inv = 1.f / hsum(sum);
        for (int e = 0; e < d; e++) store(out, dt, (int64_t)i * H * d + h * d + e, acc[e] * inv);
    }
    bar.wait(team::size());
}

}  // namespace
