// bf16 matrix products on x86 CPUs with AVX-512 BF16.
//
// y[m, n] = sum_k w[n, k] * x[m, k]: vdpbf16ps multiplies bf16 pairs exactly and accumulates in fp32.
// Four weight rows at a time give four independent accumulation chains. Threads split the rows
// (OpenMP: torch's own runtime once torch is loaded, so no second thread pool competes for cores).
//
// Built at first use by speclite/kernels/cpu_gemv.py with -march=native; without AVX-512 BF16 the
// build fails on purpose and speclite keeps torch's ops.
#include <immintrin.h>
#include <stdint.h>

#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "speclite's CPU kernel needs AVX-512 F and BF16"
#endif

namespace {

inline __m512bh load_bf16x32(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }

inline float row_dot(const uint16_t *row, const uint16_t *x, int K) {
    __m512 acc = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) acc = _mm512_dpbf16_ps(acc, load_bf16x32(row + k), load_bf16x32(x + k));
    return _mm512_reduce_add_ps(acc);
}

// Rows [n0, n1) of w [N, K] times x [K], K % 32 == 0.
void rows(const uint16_t *w, const uint16_t *x, float *y, int n0, int n1, int K) {
    int n = n0;
    for (; n + 4 <= n1; n += 4) {
        const uint16_t *r = w + (int64_t)n * K;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < K; k += 32) {
            __m512bh xv = load_bf16x32(x + k);
            a0 = _mm512_dpbf16_ps(a0, load_bf16x32(r + k), xv);
            a1 = _mm512_dpbf16_ps(a1, load_bf16x32(r + K + k), xv);
            a2 = _mm512_dpbf16_ps(a2, load_bf16x32(r + 2 * K + k), xv);
            a3 = _mm512_dpbf16_ps(a3, load_bf16x32(r + 3 * K + k), xv);
        }
        y[n] = _mm512_reduce_add_ps(a0);
        y[n + 1] = _mm512_reduce_add_ps(a1);
        y[n + 2] = _mm512_reduce_add_ps(a2);
        y[n + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; n < n1; n++) y[n] = row_dot(w + (int64_t)n * K, x, K);
}

}  // namespace

// y [M, N] = x [M, K] @ w [N, K]^T: each thread's 4-row weight tiles stay in cache while every x
// row passes over them; row m's arithmetic is the same whatever M is (a row alone equals that row
// in a batch, bit for bit, as speculative verification needs).
extern "C" void speclite_gemm_bf16(const uint16_t *w, const uint16_t *x, float *y, int M, int N, int K, int threads) {
    // A static split in whole 4-row tiles: one fork/join per call, no scheduling in between.
    const int tiles = (N + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        int n0 = (int)((int64_t)tiles * t / threads) * 4, n1 = (int)((int64_t)tiles * (t + 1) / threads) * 4;
        if (n1 > N) n1 = N;
        for (int a = n0; a < n1; a += 4) {
            const int b = a + 4 < n1 ? a + 4 : n1;
            for (int m = 0; m < M; m++) rows(w, x + (int64_t)m * K, y + (int64_t)m * N, a, b, K);
        }
    }
}
