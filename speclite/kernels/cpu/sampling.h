// Sampling on the CPU: a request's warp (temperature, top-k, top-p) of one logits row into fp32
// probabilities, and the inverse-CDF draw on the fixed-point grid of speclite.kernels.verify. The
// Python loop's warps and draws on the CPU are these (speclite.kernels.cpu_sampling), so the loops
// that sample many tokens in one call (kernels.cpp) give the tokens of its iterations one by one.
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "layer_ops.h"
#include "values.h"

namespace {

// A request's warp (speclite.sampling.SamplingParams): temperature > 0, top_k 0 (off) or the number
// of largest logits kept (with any equal to the k-th), top_p in (0, 1] (1: off).
struct Warp {
    float temperature;
    int top_k;
    float top_p;
};

// The tensors a warp works in, kept by the calling thread between rows.
struct WarpScratch {
    std::vector<float> heap;
    std::vector<int> order;
    std::vector<float> kept;
};

// The k-th largest of x[0..V) (0 < k < V): a min-heap of the k largest so far, most values turned
// away by one comparison with its least.
inline float kth_largest(const float *x, int V, int k, std::vector<float> &heap) {
    heap.assign(x, x + k);
    std::make_heap(heap.begin(), heap.end(), std::greater<float>());
    for (int i = k; i < V; i++)
        if (x[i] > heap.front()) {
            std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
            heap.back() = x[i];
            std::push_heap(heap.begin(), heap.end(), std::greater<float>());
        }
    return heap.front();
}

// The biased exponent of a positive float (denormals 0): probabilities of one exponent are within 2x.
inline int exponent(float p) {
    uint32_t u;
    memcpy(&u, &p, 4);
    return (int)(u >> 23);
}

// probs [V] = the warp of logits [V] (dtype dt): x = logit / temperature; outside the top k (below
// the k-th largest x) and where x = -inf, 0; the rest softmax(x): exp8(x - max x), their sum in double (8 lanes a
// 256-value block), each times its reciprocal. Then under top-p the fewest largest (ties: the lower
// index first) whose mass before the last is below top_p (the mass summed in double in that order)
// are renormalized (their sum in double, in index order) and the others set to 0. Only the
// probabilities in the largest exponents holding top_p + 1e-6 of the mass are sorted.
inline void warp_row(const void *logits, int dt, int V, const Warp &w, float *probs, WarpScratch &s) {
    const __m256 t = _mm256_set1_ps(w.temperature);
    __m256 big = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= V; i += 8) {
        const __m256 x = _mm256_div_ps(load8(logits, dt, i), t);
        _mm256_storeu_ps(probs + i, x);
        big = _mm256_max_ps(big, x);
    }
    float top = hmax(big);
    for (; i < V; i++) top = std::max(top, probs[i] = to_float(logits, dt, i) / w.temperature);
    const float floor = w.top_k > 0 && w.top_k < V ? kth_largest(probs, V, w.top_k, s.heap) : -INFINITY;
    const __m256 m = _mm256_set1_ps(top), f = _mm256_set1_ps(floor), none = _mm256_set1_ps(-INFINITY);
    double sum = 0.0;
    for (i = 0; i + 8 <= V;) {
        __m256 acc = _mm256_setzero_ps();
        for (const int end = std::min(V & ~7, i + 256); i < end; i += 8) {
            const __m256 x = _mm256_loadu_ps(probs + i);
            const __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, f, _CMP_GE_OQ), _mm256_cmp_ps(x, none, _CMP_GT_OQ));
            const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(x, m)), in);
            _mm256_storeu_ps(probs + i, e);
            acc = _mm256_add_ps(acc, e);
        }
        sum += hsum(acc);
    }
    for (; i < V; i++)
        sum += probs[i] = probs[i] >= floor && probs[i] > -INFINITY ? _mm256_cvtss_f32(exp8(_mm256_set1_ps(probs[i] - top))) : 0.f;
    const __m256 r = _mm256_set1_ps((float)(1.0 / sum));
    for (i = 0; i + 8 <= V; i += 8) _mm256_storeu_ps(probs + i, _mm256_mul_ps(_mm256_loadu_ps(probs + i), r));
    for (; i < V; i++) probs[i] *= (float)(1.0 / sum);
    if (w.top_p >= 1.f) return;
    double by_exponent[256] = {};
    for (i = 0; i < V; i++) by_exponent[exponent(probs[i])] += probs[i];
    int lowest = 255;
    for (double mass = 0.0; lowest > 0 && (mass += by_exponent[lowest]) < w.top_p + 1e-6;) lowest--;
    s.order.clear();
    for (i = 0; i < V; i++)
        if (probs[i] > 0.f && exponent(probs[i]) >= lowest) s.order.push_back(i);
    std::sort(s.order.begin(), s.order.end(),
              [probs](int a, int b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
    int kept = 0;
    for (double before = 0.0; kept < (int)s.order.size() && before < w.top_p; kept++) before += probs[s.order[kept]];
    std::sort(s.order.begin(), s.order.begin() + kept);
    double mass = 0.0;
    s.kept.resize(kept);
    for (int j = 0; j < kept; j++) mass += s.kept[j] = probs[s.order[j]];
    std::fill(probs, probs + V, 0.f);
    for (int j = 0; j < kept; j++) probs[s.order[j]] = (float)(s.kept[j] / mass);
}

// The fixed-point total of weights [V]: each as an int64 count of 2^-32 units (truncated), summed.
inline int64_t mass(const float *weights, int V) {
    int64_t total = 0;
    for (int i = 0; i < V; i++) total += (int64_t)(weights[i] * 4294967296.f);
    return total;
}

// The inverse-CDF draw from weights [V] (non-negative) with the uniform u in [0, 1), as
// speclite.kernels.verify.sample_fixed_point: the threshold (u in 2^-24 units) x mass >> 24, the
// first index whose prefix of the fixed-point masses exceeds it (V - 1 if none does). Integer sums:
// exact in any order.
inline int draw(const float *weights, int V, float u) {
    const int64_t threshold = ((int64_t)(u * 16777216.f) * mass(weights, V)) >> 24;
    int64_t prefix = 0;
    for (int i = 0; i < V; i++) {
        prefix += (int64_t)(weights[i] * 4294967296.f);
        if (prefix > threshold) return i;
    }
    return V - 1;
}

// The draw with u from the warp of logits [V] (dtype dt), the warp left in probs [V].
inline int sample_row(const void *logits, int dt, int V, const Warp &w, float *probs, WarpScratch &s, float u) {
    warp_row(logits, dt, V, w, probs, s);
    return draw(probs, V, u);
}

// Rejection sampling of a chain of kk drafts x[i] drawn from q rows (stride V) against the target's
// warped rows p [kk + 1, V], as speclite.kernels.verify.verify_rejection_torch decides it: draft i
// stands while accept[i] * q_i(x_i) < p_i(x_i); at the first that does not, the token is drawn with
// u from the residual max(0, p_n - q_n) (in `residual`), or from p_n where the residual has no
// fixed-point mass; after kk standing drafts, from p_kk. Returns how many stood; token: the draw.
inline int rejection(const float *p, const float *q, int V, const int *x, int kk, const float *accept, float u,
                     std::vector<float> &residual, int &token) {
    int n = 0;
    while (n < kk && accept[n] * q[(int64_t)V * n + x[n]] < p[(int64_t)V * n + x[n]]) n++;
    const float *pn = p + (int64_t)V * n;
    if (n < kk) {
        const float *qn = q + (int64_t)V * n;
        residual.resize(V);
        for (int i = 0; i < V; i++) residual[i] = std::max(pn[i] - qn[i], 0.f);
        if (mass(residual.data(), V) > 0) {
            token = draw(residual.data(), V, u);
            return n;
        }
    }
    token = draw(pn, V, u);
    return n;
}

}  // namespace
