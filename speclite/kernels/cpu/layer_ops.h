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
// rows' chains interleaved), reduced as hsum reduces (hsums), then the d % 8 tail.
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
    alignas(32) float v[8];
    hsums(a, 8, v);
    for (int r = 0; r < 8 && d8 < d; r++)
        for (int e = d8; e < d; e++) v[r] += q[e] * to_float(p, DT, row[r] + e);
    return _mm256_load_ps(v);
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

// ---- attention: a KV head's queries together, the cache in blocks -------------------------------
//
// A pass takes up to PASS_QUERIES queries (row, head) of one KV head and walks the cache in blocks of
// slots: a block's keys, then its values, come from memory once for the whole pass, and the queries
// that see the whole block take it two at a time, each load feeding both. One query at a time over
// the whole cache was bound by reading it: 6.9 ns a query and key at d = 64 and 450 keys on the AMX
// Xeon, 3.9 ns this way with ten rows, 5.1 with one (benchmarks/RESULTS.md, 2026-11-25).
// A query's numbers depend on its own visible keys alone: each score a dot product of W-lane partial
// sums (Lanes: AVX-512's 16, AVX2's 8) reduced as one vector's sum is (hsums: W keys' reductions
// sharing their shuffles); the exponentials W at a time in the keys' order; the weighted values of a
// block's visible keys dealt round-robin to S sets of accumulators (independent sums for the FMA
// ports; in memory between blocks, exactly), the sets added in order at the end. So a row alone equals
// that row in a batch, and keys a row does not see cost nothing and change nothing: a chain's rows
// equal a tree's with the same visible keys, and the static path's (the whole cache under a mask) too.
// Many causal queries of a KV head (a verification's or a prefill's rows, a large GQA group) take the
// same sums with the queries in the lanes instead (Pass::run_lanes).
constexpr int PASS_QUERIES = 16, SCORE_BLOCK = 16, VALUE_BLOCK = 64, PASS_MAX_D = 256;

#if defined(__AVX512F__)
struct Lanes {  // 16 fp32 lanes; the weighting's column groups of 8 chunks keep 8 sums in flight
    using V = __m512;
    static constexpr int W = 16, GROUP = 8, CHAINS = 8, SUMS = 16;  // SUMS: a queries-in-lanes weighting's accumulators
    static __mmask16 first(int n) { return (__mmask16)(n >= 16 ? 0xFFFF : (1u << std::max(n, 0)) - 1); }
    static V zero() { return _mm512_setzero_ps(); }
    static V set1(float v) { return _mm512_set1_ps(v); }
    static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static V add(V a, V b) { return _mm512_add_ps(a, b); }
    static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
    static V max(V a, V b) { return _mm512_max_ps(a, b); }
    static void store(float *p, V v) { _mm512_storeu_ps(p, v); }
    // Values i..i+15 of a dtype-DT array widened to fp32 (the first n; the others zero).
    template <int DT>
    static inline __attribute__((always_inline)) V load(const void *p, int64_t i) {
        if (DT == F32) return _mm512_loadu_ps((const float *)p + i);
        const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
        if (DT == F16) return _mm512_cvtph_ps(h);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    template <int DT>
    static inline __attribute__((always_inline)) V load(const void *p, int64_t i, int n) {
        if (DT == F32) return _mm512_maskz_loadu_ps(first(n), (const float *)p + i);
        const __m256i h = _mm256_maskz_loadu_epi16(first(n), (const uint16_t *)p + i);
        if (DT == F16) return _mm512_cvtph_ps(h);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    static V loadf(const float *p, int n, float fill) { return _mm512_mask_loadu_ps(set1(fill), first(n), p); }
    static V keep(V v, int n) { return _mm512_maskz_mov_ps(first(n), v); }  // lanes from n on zero
    static void storef(float *p, V v, int n) { _mm512_mask_storeu_ps(p, first(n), v); }
    static float hmax(V v) { return _mm512_reduce_max_ps(v); }
    static float hsum(V v) { return _mm512_reduce_add_ps(v); }
    static V below(V a, V b, V x, V fill) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), fill, x); }  // x where a < b
    // exp8's arithmetic on 16 lanes.
    static inline __attribute__((always_inline)) V exp(V x) {
        x = _mm512_min_ps(_mm512_max_ps(x, set1(-87.f)), set1(88.f));
        const V n = _mm512_roundscale_ps(mul(x, set1(1.44269504089f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        V r = _mm512_fnmadd_ps(n, set1(0.693359375f), x);
        r = _mm512_fnmadd_ps(n, set1(-2.12194440e-4f), r);
        V p = set1(1.9875691500e-4f);
        for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
            p = fma(p, r, set1(c));
        p = add(fma(p, mul(r, r), r), set1(1.f));
        const __m512i scale = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
        return mul(p, _mm512_castsi512_ps(scale));
    }
};
#else
struct Lanes {  // 8 fp32 lanes; AVX2's 16 registers: column groups of 4 chunks, 4 sums in flight a query
    using V = __m256;
    static constexpr int W = 8, GROUP = 4, CHAINS = 4, SUMS = 8;
    static V zero() { return _mm256_setzero_ps(); }
    static V set1(float v) { return _mm256_set1_ps(v); }
    static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
    static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static V add(V a, V b) { return _mm256_add_ps(a, b); }
    static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
    static V max(V a, V b) { return _mm256_max_ps(a, b); }
    static void store(float *p, V v) { _mm256_storeu_ps(p, v); }
    template <int DT>
    static inline __attribute__((always_inline)) V load(const void *p, int64_t i) { return load8(p, DT, i); }
    template <int DT>
    static V load(const void *p, int64_t i, int n) {  // the tail of a head: through a zeroed copy
        alignas(32) float t[8] = {};
        for (int l = 0; l < n; l++) t[l] = to_float(p, DT, i + l);
        return _mm256_load_ps(t);
    }
    static V loadf(const float *p, int n, float fill) {
        alignas(32) float t[8];
        for (int l = 0; l < 8; l++) t[l] = l < n ? p[l] : fill;
        return _mm256_load_ps(t);
    }
    static V keep(V v, int n) {
        return n >= 8 ? v : _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
    }
    static void storef(float *p, V v, int n) {
        alignas(32) float t[8];
        _mm256_store_ps(t, v);
        for (int l = 0; l < std::min(n, 8); l++) p[l] = t[l];
    }
    static float hmax(V v) { return ::hmax(v); }
    static float hsum(V v) { return ::hsum(v); }
    static V below(V a, V b, V x, V fill) { return _mm256_blendv_ps(fill, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }  // x where a < b
    static V exp(V x) { return exp8(x); }
};
#endif

// The slots of [s0, s1) that row i sees (mask [t, L] of bytes, or causal from `start`) into slots;
// their count.
inline int visible(const uint8_t *mask, int L, int start, int i, int s0, int s1, int *slots) {
    int m = 0;
    if (mask) {
        const uint8_t *row = mask + (int64_t)i * L;
        for (int s = s0; s < s1; s++)
            if (row[s]) slots[m++] = s;
    } else {
        for (int s = s0; s < std::min(s1, start + i + 1); s++) slots[m++] = s;
    }
    return m;
}

// One pass (see above) for heads of up to C chunks of W values: exactly C where !TAIL, else
// ceil(d / W) <= C of them, the last one partial (loaded through Lanes' partial loads).
template <int DT, int C, bool TAIL>
struct Pass {
    using L = Lanes;
    using V = L::V;
    static constexpr int W = L::W;
    const void *cache_k, *cache_v;
    int64_t base;  // the KV head's first cache row
    int d;
    float scale;

    int chunks() const { return TAIL ? (d + W - 1) / W : C; }
    int64_t stride() const { return (int64_t)chunks() * W; }  // of a query's sets of accumulators
    // Chunk c of the d values at p + i.
    V chunk(const void *p, int64_t i, int c) const {
        return TAIL && W * (c + 1) > d ? L::template load<DT>(p, i + W * c, d - W * c) : L::template load<DT>(p, i + W * c);
    }
    // Sets of accumulators for the column group of n chunks.
    static constexpr int sets(int n) { return std::max(1, L::CHAINS / n); }

    // For QG queries q[0..QG) at once (the keys' loads shared): out[g][0..m) = scale * q[g] . key for
    // the keys at slots[0..m). W / QG keys a reduction.
    template <int QG>
    void score(const float *const *q, const int *slots, int m, float *const *out) const {
        constexpr int KG = W / QG;
        const int nc = chunks();
        V qv[QG][C];
        for (int g = 0; g < QG; g++)
            for (int c = 0; c < nc; c++) qv[g][c] = W * (c + 1) > d ? L::loadf(q[g] + W * c, d - W * c, 0.f) : L::template load<F32>(q[g], W * c);
        for (int k0 = 0; k0 < m; k0 += KG) {
            V a[W];  // a[g KG + r]: query g, key k0 + r (past m: key m - 1 again, dropped below)
#pragma GCC unroll 16
            for (int r = 0; r < KG; r++) {
                const int64_t row = base + (int64_t)slots[std::min(k0 + r, m - 1)] * d;
                V s[QG];
                for (int c = 0; c < nc; c++) {
                    const V kv = chunk(cache_k, row, c);
                    for (int g = 0; g < QG; g++) s[g] = c == 0 ? L::mul(qv[g][0], kv) : L::fma(qv[g][c], kv, s[g]);
                }
                for (int g = 0; g < QG; g++) a[g * KG + r] = s[g];
            }
            alignas(64) float sums[W];
            hsums(a, W, sums);
            for (int g = 0; g < QG; g++)
                for (int r = 0; r < std::min(KG, m - k0); r++) out[g][k0 + r] = sums[g * KG + r] * scale;
        }
    }

    // The weighting of chunks c0..c0+N-1 (one column group) for QG queries at once (the values' loads
    // shared): acc[g] (set s of chunk c at s * stride() + W c) += w[g][r] * the values at slots[r],
    // r < m, the r-th into set r % S.
    template <int QG, int N>
    void weigh_columns(const float *const *w, const int *slots, int m, int c0, float *const *acc) const {
        constexpr int S = sets(N);
        V a[QG][S][N];
        for (int g = 0; g < QG; g++)
            for (int s = 0; s < S; s++)
                for (int c = 0; c < N; c++) a[g][s][c] = L::template load<F32>(acc[g], s * stride() + W * (c0 + c));
        auto add = [&](int s, int r) __attribute__((always_inline)) {
            V wv[QG];
            for (int g = 0; g < QG; g++) wv[g] = L::set1(w[g][r]);
            const int64_t row = base + (int64_t)slots[r] * d;
            for (int c = 0; c < N; c++) {
                const V vv = chunk(cache_v, row, c0 + c);
                for (int g = 0; g < QG; g++) a[g][s][c] = L::fma(wv[g], vv, a[g][s][c]);
            }
        };
        int r = 0;
        for (; r + S <= m; r += S)
            for (int s = 0; s < S; s++) add(s, r + s);
        for (int s = 0; s < S; s++)  // s a constant: a runtime index would put the sums in memory
            if (r + s < m) add(s, r + s);
        for (int g = 0; g < QG; g++)
            for (int s = 0; s < S; s++)
                for (int c = 0; c < N; c++) L::store(acc[g] + s * stride() + W * (c0 + c), a[g][s][c]);
    }

    // Every column group: GROUP chunks at a time, then the rest (a group of N chunks: sets(N) sets).
    template <int QG>
    void weigh(const float *const *w, const int *slots, int m, float *const *acc) const {
        constexpr int G = std::min(C, L::GROUP);
        const int nc = chunks();
        int c0 = 0;
        for (; c0 + G <= nc; c0 += G) weigh_columns<QG, G>(w, slots, m, c0, acc);
        rest<QG, G - 1>(w, slots, m, c0, nc - c0, acc);
    }
    template <int QG, int N>
    void rest(const float *const *w, const int *slots, int m, int c0, int n, float *const *acc) const {
        if constexpr (N > 0) {
            if (n == N) return weigh_columns<QG, N>(w, slots, m, c0, acc);
            rest<QG, N - 1>(w, slots, m, c0, n, acc);
        }
    }
    // Sets of chunk c's column group.
    int sets_of(int c) const {
        const int nc = chunks(), G = std::min(C, L::GROUP);
        return sets(c < nc / G * G ? G : nc % G);
    }

    // Walks the cache in blocks of `block` slots: queries that see a whole block take it two at a time
    // (pair: the pair's query numbers and the block's slots), the others one at a time over the slots
    // they see (one: the query's number, its slots and their count); n[qi] counts query qi's keys so far.
    template <class Pair, class One>
    static void blocks(const int *rows, int nq, const uint8_t *mask, int L_, int start, int block, int *n, Pair pair, One one) {
        int slots[VALUE_BLOCK], all[VALUE_BLOCK], whole[PASS_QUERIES];
        for (int s0 = 0; s0 < L_; s0 += block) {
            const int s1 = std::min(L_, s0 + block);
            for (int s = s0; s < s1; s++) all[s - s0] = s;
            int nw = 0;
            for (int qi = 0; qi < nq; qi++) {
                const bool sees_all = mask ? memchr(mask + (int64_t)rows[qi] * L_ + s0, 0, s1 - s0) == nullptr : start + rows[qi] + 1 >= s1;
                if (sees_all) {
                    whole[nw++] = qi;
                } else {
                    const int m = visible(mask, L_, start, rows[qi], s0, s1, slots);
                    if (m) one(qi, slots, m);
                    n[qi] += m;
                }
            }
            for (int w = 0; w < nw; w += 2) {
                if (w + 1 < nw)
                    pair(whole[w], whole[w + 1], all, s1 - s0);
                else
                    one(whole[w], all, s1 - s0);
                n[whole[w]] += s1 - s0;
                if (w + 1 < nw) n[whole[w + 1]] += s1 - s0;
            }
        }
    }

    // The queries q[0..nq) (d fp32 values each, of rows rows[0..nq)) over cache keys 0..L_-1; out[qi]
    // (d values) = their attention. scores: nq rows of `ld` floats (ld >= L_); acc: nq rows of
    // CHAINS * stride() floats. Causal queries go W at a time in lanes (run_lanes: the same numbers)
    // while they fill three quarters of them, the rest key by key: in lanes 16 queries (AVX-512) ran
    // 1.2-1.3x faster than key by key, 12 even, 8 slower; AVX2's 8 1.1x (benchmarks/RESULTS.md, 2026-11-26).
    void run(const float *q, const int *rows, int nq, const uint8_t *mask, int L_, int start, float *scores, int ld,
             float *acc, float *out) const {
        int g0 = 0;
        if constexpr (!TAIL)
            for (; !mask && 4 * (nq - g0) >= 3 * W; g0 += W)
                run_lanes(q + (int64_t)g0 * d, rows + g0, std::min(W, nq - g0), L_, start, acc, scores, out + (int64_t)g0 * d);
        if (g0 < nq) run_keys(q + (int64_t)g0 * d, rows + g0, nq - g0, mask, L_, start, scores, ld, acc, out + (int64_t)g0 * d);
    }

    // run() with the keys in the lanes: the pass described above, for any visibility.
    void run_keys(const float *q, const int *rows, int nq, const uint8_t *mask, int L_, int start, float *scores, int ld,
                  float *acc, float *out) const {
        int n[PASS_QUERIES] = {};
        const int64_t arow_len = L::CHAINS * stride();
        auto qrow = [&](int qi) { return q + (int64_t)qi * d; };
        auto srow = [&](int qi) { return scores + (int64_t)qi * ld; };
        auto arow = [&](int qi) { return acc + qi * arow_len; };
        blocks(
            rows, nq, mask, L_, start, SCORE_BLOCK, n,
            [&](int a, int b, const int *slots, int m) {
                const float *qs[2] = {qrow(a), qrow(b)};
                float *outs[2] = {srow(a) + n[a], srow(b) + n[b]};
                score<2>(qs, slots, m, outs);
            },
            [&](int a, const int *slots, int m) {
                const float *qs[1] = {qrow(a)};
                float *outs[1] = {srow(a) + n[a]};
                score<1>(qs, slots, m, outs);
            });
        float total[PASS_QUERIES];
        for (int qi = 0; qi < nq; qi++) {
            float *sc = srow(qi);
            const int whole = n[qi] / W * W, rest = n[qi] - whole;  // whole vectors, then the rest's lanes
            V top = L::set1(-INFINITY), sum = L::zero();
            for (int j0 = 0; j0 < whole; j0 += W) top = L::max(top, L::template load<F32>(sc, j0));
            if (rest) top = L::max(top, L::loadf(sc + whole, rest, -INFINITY));
            const V best = L::set1(L::hmax(top));
            for (int j0 = 0; j0 < whole; j0 += W) {
                const V e = L::exp(L::sub(L::template load<F32>(sc, j0), best));
                L::store(sc + j0, e);
                sum = L::add(sum, e);
            }
            if (rest) {
                const V e = L::keep(L::exp(L::sub(L::loadf(sc + whole, rest, 0.f), best)), rest);
                L::storef(sc + whole, e, rest);
                sum = L::add(sum, e);
            }
            total[qi] = L::hsum(sum);
            std::fill(arow(qi), arow(qi) + arow_len, 0.f);
            n[qi] = 0;
        }
        blocks(
            rows, nq, mask, L_, start, VALUE_BLOCK, n,
            [&](int a, int b, const int *slots, int m) {
                const float *ws[2] = {srow(a) + n[a], srow(b) + n[b]};
                float *accs[2] = {arow(a), arow(b)};
                weigh<2>(ws, slots, m, accs);
            },
            [&](int a, const int *slots, int m) {
                const float *ws[1] = {srow(a) + n[a]};
                float *accs[1] = {arow(a)};
                weigh<1>(ws, slots, m, accs);
            });
        for (int qi = 0; qi < nq; qi++) {
            const float *a = arow(qi), inv = 1.f / total[qi];
            for (int e = 0; e < d; e++) {
                float v = a[e];
                for (int s = 1; s < sets_of(e / W); s++) v += a[s * stride() + e];
                out[(int64_t)qi * d + e] = v * inv;
            }
        }
    }
    // run()'s numbers, bit for bit, for nq <= W queries of rows that see the keys before them and
    // themselves (causal, no mask), with the queries in the lanes instead of the keys: each key's W
    // partial products come from broadcasts of its values, the W of them added in hsum's tree; the
    // exponentials' W partial sums are kept per key modulo W; the weighted values go to the sets of
    // accumulators key by key as weigh() deals them; keys past a query's own are scored and weighted
    // as zero, which changes no sum. Without horizontal reductions, a key costs d + W - 1 vector
    // operations for W queries to score where run() spent about three a query (benchmarks/RESULTS.md,
    // 2026-11-26). q [nq, d]; qt: d * W floats; ew: W floats a key; out [nq, d].
    void run_lanes(const float *q, const int *rows, int nq, int L_, int start, float *qt, float *ew, float *out) const {
        alignas(64) float lim[W], total[W], inv[W];
        int keys = 0;
        for (int g = 0; g < W; g++) {
            const int n = g < nq ? std::min(L_, start + rows[g] + 1) : 1;  // an empty lane sees key 0 alone
            lim[g] = (float)n, keys = std::max(keys, n);
            for (int e = 0; e < d; e++) qt[e * W + g] = g < nq ? q[(int64_t)g * d + e] : 0.f;
        }
        const V seen = L::template load<F32>(lim, 0), none = L::set1(-INFINITY), zero = L::zero();
        V top = none;
        auto scores = [&](auto keys_at_once, int j) __attribute__((always_inline)) {
            constexpr int R = decltype(keys_at_once)::value;
            int64_t rows_of[R];
            for (int r = 0; r < R; r++) rows_of[r] = base + (int64_t)(j + r) * d;
            const auto dots = node<R, LOG_W>(qt, rows_of, 0);
            for (int r = 0; r < R; r++) {
                const V score = L::below(L::set1((float)(j + r)), seen, L::mul(dots.v[r], L::set1(scale)), none);
                L::store(ew + (int64_t)(j + r) * W, score);
                top = L::max(top, score);
            }
        };
        int j = 0;
        for (; j + 4 <= keys; j += 4) scores(std::integral_constant<int, 4>{}, j);
        for (; j < keys; j++) scores(std::integral_constant<int, 1>{}, j);
        V sums[W];
        for (int l = 0; l < W; l++) sums[l] = zero;
        for (int j = 0; j < keys; j++) {
            const V e = L::below(L::set1((float)j), seen, L::exp(L::sub(L::template load<F32>(ew, (int64_t)j * W), top)), zero);
            L::store(ew + (int64_t)j * W, e);
            sums[j % W] = L::add(sums[j % W], e);
        }
        for (int h = W / 2; h >= 1; h /= 2)
            for (int l = 0; l < h; l++) sums[l] = L::add(sums[l], sums[l + h]);
        L::store(total, sums[0]);
        for (int g = 0; g < W; g++) inv[g] = 1.f / total[g];
        const int G = std::min(C, L::GROUP);
        for (int c0 = 0; c0 < C; c0 += G) {  // each column group with weigh()'s sets
            const int n = std::min(G, C - c0), S = sets(n);
            const int e0 = W * c0, e1 = W * (c0 + n);
            if (S == 8) weigh_lanes<8>(ew, keys, e0, e1, inv, qt);
            else if (S == 4) weigh_lanes<4>(ew, keys, e0, e1, inv, qt);
            else if (S == 2) weigh_lanes<2>(ew, keys, e0, e1, inv, qt);
            else weigh_lanes<1>(ew, keys, e0, e1, inv, qt);
        }
        for (int g = 0; g < nq; g++)  // qt now holds the outputs [d][W]
            for (int e = 0; e < d; e++) out[(int64_t)g * d + e] = qt[e * W + g];
    }

    // The dot products of the W queries in qt [d][W] with R keys (cache rows row[0..R)), as run()'s
    // score() sums them: lane l's chunk products (leaf l), then hsum's tree of the W lanes, the node
    // at level K over lanes l + m W / 2^K, m < 2^K. Depth first: a few sums live, the queries' loads
    // shared by the R keys.
    static constexpr int LOG_W = W == 16 ? 4 : 3;
    template <int R>
    struct Dots {
        V v[R];
    };
    template <int R, int K>
    inline __attribute__((always_inline)) Dots<R> node(const float *qt, const int64_t *row, int l) const {
        if constexpr (K == 0) {
            Dots<R> p;
            const V q0 = L::template load<F32>(qt, (int64_t)l * W);
            for (int r = 0; r < R; r++) p.v[r] = L::mul(q0, L::set1(to_float(cache_k, DT, row[r] + l)));
            for (int c = 1; c < C; c++) {
                const V qc = L::template load<F32>(qt, (int64_t)(W * c + l) * W);
                for (int r = 0; r < R; r++) p.v[r] = L::fma(qc, L::set1(to_float(cache_k, DT, row[r] + W * c + l)), p.v[r]);
            }
            return p;
        } else {
            Dots<R> a = node<R, K - 1>(qt, row, l);
            const Dots<R> b = node<R, K - 1>(qt, row, l + (W >> K));
            for (int r = 0; r < R; r++) a.v[r] = L::add(a.v[r], b.v[r]);
            return a;
        }
    }

    // Values e0..e1 of every lane's output into res [d][W]: key j's weight times its values added to
    // set j % S (in key order within a set), the sets added in order, times inv. Blocks of keys, so a
    // block's values and weights stay in L1 while E values at a time go over them (the sums between
    // blocks in memory, exactly).
    template <int S>
    void weigh_lanes(const float *ew, int keys, int e0, int e1, const float *inv, float *res) const {
        constexpr int E = std::max(1, std::min(L::SUMS / S, W));  // values a sweep over a block
        const int span = e1 - e0;  // <= CHAINS / S chunks of W
        alignas(64) float acc[L::CHAINS * W * W];  // [S][span][W]
        std::fill(acc, acc + S * span * W, 0.f);
        for (int j0 = 0; j0 < keys; j0 += VALUE_BLOCK) {
            const int j1 = std::min(keys, j0 + VALUE_BLOCK);
            for (int f = 0; f < span; f += E) {
                V a[S][E];
                for (int s = 0; s < S; s++)
                    for (int e = 0; e < E; e++) a[s][e] = L::template load<F32>(acc, ((int64_t)s * span + f + e) * W);
                auto add = [&](int s, int j) __attribute__((always_inline)) {
                    const V w = L::template load<F32>(ew, (int64_t)j * W);
                    const int64_t row = base + (int64_t)j * d + e0 + f;
                    for (int e = 0; e < E; e++) a[s][e] = L::fma(w, L::set1(to_float(cache_v, DT, row + e)), a[s][e]);
                };
                int j = j0;  // a multiple of S: key j + s goes to set s
                for (; j + S <= j1; j += S)
                    for (int s = 0; s < S; s++) add(s, j + s);
                for (int s = 0; s < S; s++)
                    if (j + s < j1) add(s, j + s);
                for (int s = 0; s < S; s++)
                    for (int e = 0; e < E; e++) L::store(acc + ((int64_t)s * span + f + e) * W, a[s][e]);
            }
        }
        const V scale_by = L::template load<F32>(inv, 0);
        for (int e = 0; e < span; e++) {
            V v = L::template load<F32>(acc, (int64_t)e * W);
            for (int s = 1; s < S; s++) v = L::add(v, L::template load<F32>(acc, ((int64_t)s * span + e) * W));
            L::store(res + (int64_t)(e0 + e) * W, L::mul(v, scale_by));
        }
    }
};

// attend_pass for the run-time dtype and head size d <= PASS_MAX_D: the common head sizes (32, 64, 80,
// 96, 128, 256) each with their own code, any other through the widest pass with a partial last chunk
// (one instantiation for them all: three per size were a minute of the build's time).
template <int DT>
inline void attend_pass(const void *cache_k, const void *cache_v, int64_t base, int d, float scale, const float *q,
                        const int *rows, int nq, const uint8_t *mask, int L, int start, float *scores, int ld,
                        float *acc, float *out) {
    constexpr int W = Lanes::W, WIDEST = PASS_MAX_D / W;
#define SPECLITE_PASS(C, TAIL) return Pass<DT, C, TAIL>{cache_k, cache_v, base, d, scale}.run(q, rows, nq, mask, L, start, scores, ld, acc, out)
    switch (d) {
        case 2 * W: SPECLITE_PASS(2, false);
        case 4 * W: SPECLITE_PASS(4, false);
        case 8 * W: SPECLITE_PASS(8, false);
        case 16 * W: SPECLITE_PASS(16, false);
        case 80: SPECLITE_PASS(80 / W, false);
        case 96: SPECLITE_PASS(96 / W, false);
    }
    if (d == 32 * W && WIDEST >= 32) SPECLITE_PASS(WIDEST, false);
    SPECLITE_PASS(WIDEST, true);
#undef SPECLITE_PASS
}

// RoPE of one head's d values (dtype DT) with the tables' row from c, into fp32 dst, W lanes at a time:
// x cos - x' sin for the first half (x' the second half's), x cos + x' sin for the second. The scalar
// loop's products and sums, so its numbers; it was 0.37 us of a one-row attention's 4.1 (the pair's
// layer, one thread, Zen 4; benchmarks/RESULTS.md, 2026-11-26 17:13-).
template <int DT>
inline void rope_lanes(const void *head, const void *cos, const void *sin, int64_t c, int d, float *dst) {
    using L = Lanes;
    const int half = d / 2;
    for (int e = 0; e < half; e += L::W) {
        const L::V x1 = L::template load<DT>(head, e), x2 = L::template load<DT>(head, e + half);
        L::store(dst + e, L::sub(L::mul(x1, L::template load<DT>(cos, c + e)), L::mul(x2, L::template load<DT>(sin, c + e))));
        L::store(dst + e + half, L::add(L::mul(x2, L::template load<DT>(cos, c + e + half)), L::mul(x1, L::template load<DT>(sin, c + e + half))));
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
                           float scale, const void *const *qk_norm, float eps, team::TeamBarrier &bar) {
    const int half = d / 2, width = (H + 2 * Hkv) * d, group = H / Hkv;
    std::vector<float> q(d);
    std::vector<char> normed(4 * d);
    // RoPE of one head's vector (row i, column offset c; normed by `norm` first where not null, as
    // rms_norm_row norms a row) into fp32 dst: x cos + rotate_half(x) sin.
    auto rope = [&](int i, int c, const void *norm, float *dst) {
        const void *head = at(qkv, dt, (int64_t)i * width + c);
        if (norm) {
            rms_norm_row(head, norm, normed.data(), dt, 0, d, eps);
            head = normed.data();
        }
        if (half % Lanes::W == 0) {
            if (dt == F32) return rope_lanes<F32>(head, cos, sin, (int64_t)i * d, d, dst);
            if (dt == BF16) return rope_lanes<BF16>(head, cos, sin, (int64_t)i * d, d, dst);
            return rope_lanes<F16>(head, cos, sin, (int64_t)i * d, d, dst);
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
        store_row(cache_k, dt, slot, d, q.data());
        memcpy(at(cache_v, dt, slot), at(qkv, dt, (int64_t)i * width + (H + Hkv + h) * d), (size_t)d * (dt == F32 ? 4 : 2));
    }
    bar.wait(team::size());  // the keys and values are in the cache
    if (d <= PASS_MAX_D) {  // a KV head's queries in passes (Pass above); unit u: KV head u / (t group), then row, then head
        const int per = t * group, ld = (L + 15) / 16 * 16;
        const int64_t acc_row = Lanes::CHAINS * ((d + Lanes::W - 1) / Lanes::W * Lanes::W);
        thread_local std::vector<float> qs, sc, accs, outs;  // kept: a fresh 100 KB a call would come from mmap
        for (auto [v, n] : {std::pair{&qs, (int64_t)d}, {&sc, (int64_t)ld}, {&accs, acc_row}, {&outs, (int64_t)d}})
            if ((int64_t)v->size() < PASS_QUERIES * n) v->resize(PASS_QUERIES * n);
        const auto [u0, u1] = team::share(Hkv * per);
        for (int u = u0; u < u1;) {
            const int kvh = u / per, nq = std::min({u1, (kvh + 1) * per, u + PASS_QUERIES}) - u;
            int rows[PASS_QUERIES], heads[PASS_QUERIES];
            for (int qi = 0; qi < nq; qi++) {
                rows[qi] = (u + qi) % per / group, heads[qi] = kvh * group + (u + qi) % group;
                rope(rows[qi], heads[qi] * d, qk_norm ? qk_norm[0] : nullptr, qs.data() + qi * d);
            }
            const int64_t base = (int64_t)kvh * max_len * d;
            if (dt == F32)
                attend_pass<F32>(cache_k, cache_v, base, d, scale, qs.data(), rows, nq, mask, L, start, sc.data(), ld, accs.data(), outs.data());
            else if (dt == BF16)
                attend_pass<BF16>(cache_k, cache_v, base, d, scale, qs.data(), rows, nq, mask, L, start, sc.data(), ld, accs.data(), outs.data());
            else
                attend_pass<F16>(cache_k, cache_v, base, d, scale, qs.data(), rows, nq, mask, L, start, sc.data(), ld, accs.data(), outs.data());
            for (int qi = 0; qi < nq; qi++)
                store_row(out, dt, (int64_t)rows[qi] * H * d + heads[qi] * d, d, outs.data() + qi * d);
            u += nq;
        }
        bar.wait(team::size());
        return;
    }
    // Heads past PASS_MAX_D values (no model speclite runs has them): one (row, head) at a time.
    std::vector<float> acc(d), scores((L + 7) / 8 * 8);
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
