// Matrix products for quantized and half-precision weights on x86 CPUs with AVX2 + FMA + F16C.
//
// y [M, N] = x [M, K] @ w [N, K]^T for three weight formats:
//   int4  repacked at load: per output column, blocks of 32 weights as 16 bytes (byte j holds weight
//         j in its low nibble and weight j+16 in its high one), an fp16 scale and a uint8 zero per
//         group (w = (q - z) * s, group a multiple of 32). Activations are quantized per 32-block
//         to int8 once per call; a block's dot product is integer (maddubs), its float scale applied
//         once per block, and the zeros once per group through the blocks' precomputed sums.
//   int8  per-channel scale (W8A8): activations quantized per row to int8, integer dot products.
//   bf16/f16 converted to fp32 in registers (bf16 is a 16-bit shift, f16 through F16C), fp32 FMAs.
// x and y are fp32, bf16 or f16 (same dtype for both; y rounded to nearest even).
//
// Exactness: the arithmetic of output (m, n) is the same sequence of operations whatever M is and
// whichever tile holds it (tiles only share loads; every (m, n) has its own accumulators and the
// same reduction), and the build uses -ffp-contract=off so the compiler cannot fuse differently in
// different tiles. So a row computed alone equals that row in a batch, bit for bit: speculative
// verification of k+1 rows gives the plain decoder's logits.
//
// Threads (OpenMP, torch's runtime once torch is loaded) split the output columns statically; one
// fork/join per call. Rows are walked in chunks so a chunk's activations stay in cache while the
// weights stream.
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>
#include <string.h>

#include <cmath>

#include <algorithm>
#include <vector>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "speclite's AVX2 kernels need AVX2, FMA and F16C"
#endif

namespace {

enum Dtype { F32 = 0, BF16 = 1, F16 = 2 };
constexpr int ROW_CHUNK = 32;

inline float to_float(const void *x, int dt, int64_t i) {
    if (dt == F32) return ((const float *)x)[i];
    uint16_t h = ((const uint16_t *)x)[i];
    if (dt == F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
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

// A fixed reduction order, the same for every tile.
inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// Row m of x quantized to int8 in blocks of `block` values (K padded with zeros to Kp):
// d = max|x| / 127, q = round(x * (127 / max|x|)) half to even. Returns the blocks' scales in d and
// their integer sums in sums.
void quantize_row(const void *x, int dt, int64_t m, int K, int Kp, int block, int8_t *q, float *d, int32_t *sums) {
    const int64_t base = m * (int64_t)K;
    for (int b0 = 0; b0 < Kp; b0 += block) {
        const int b1 = std::min(b0 + block, K);
        float amax = 0.f;
        for (int k = b0; k < b1; k++) amax = std::max(amax, std::fabs(to_float(x, dt, base + k)));
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        for (int k = b0; k < b0 + block; k++) {
            int v = k < b1 ? (int)_mm_cvtss_si32(_mm_set_ss(to_float(x, dt, base + k) * inv)) : 0;
            q[k] = (int8_t)v;
            sum += v;
        }
        d[b0 / block] = amax / 127.f;
        sums[b0 / block] = sum;
    }
}

// Calls tile(m0, mr, n0, nr) over this thread's columns, rows in cache-sized chunks.
template <int MR, int NR, class Tile>
void walk(int M, int n0, int n1, Tile tile) {
    for (int c0 = 0; c0 < M; c0 += ROW_CHUNK) {
        const int c1 = std::min(c0 + ROW_CHUNK, M);
        int n = n0;
        for (; n + NR <= n1; n += NR)
            for (int m = c0; m < c1; m += MR) tile(m, std::min(MR, c1 - m), n, NR);
        for (; n < n1; n++)
            for (int m = c0; m < c1; m += MR) tile(m, std::min(MR, c1 - m), n, 1);
    }
}

inline void split(int N, int step, int threads, int t, int &n0, int &n1) {
    const int tiles = (N + step - 1) / step;
    n0 = (int)((int64_t)tiles * t / threads) * step;
    n1 = std::min(N, (int)((int64_t)tiles * (t + 1) / threads) * step);
}

struct Scratch {
    std::vector<int8_t> q;
    std::vector<float> a, b;
    std::vector<int32_t> s;
};
thread_local Scratch scratch;

// ---- int4 ------------------------------------------------------------------------------------

struct Int4 {
    const int8_t *xq;   // [M, Kp]
    const float *dx;    // [M, nb] block scales
    const float *gsx;   // [M, G] per group: sum over its blocks of d * (sum of q)
    const uint8_t *qw;  // [N, nb, 16]
    const uint16_t *s;  // [N, G] fp16
    const uint8_t *z;   // [N, G]
    void *y;
    int dt, N, Kp, nb, G, bpg;

    template <int MR, int NR>
    void tile(int m0, int n0) const {
        const __m256i low = _mm256_set1_epi8(0x0F);
        const __m256i ones = _mm256_set1_epi16(1);
        __m256 acc[MR][NR];
        float corr[MR][NR];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps(), corr[i][j] = 0.f;
        for (int g = 0; g < G; g++) {
            __m256 part[MR][NR];
            for (int i = 0; i < MR; i++)
                for (int j = 0; j < NR; j++) part[i][j] = _mm256_setzero_ps();
            const int b1 = std::min(nb, (g + 1) * bpg);
            for (int b = g * bpg; b < b1; b++) {
                __m256i w[NR];
                for (int j = 0; j < NR; j++) {
                    __m128i p = _mm_loadu_si128((const __m128i *)(qw + ((int64_t)(n0 + j) * nb + b) * 16));
                    w[j] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), low);
                }
                for (int i = 0; i < MR; i++) {
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)(m0 + i) * Kp + b * 32));
                    const __m256 d = _mm256_broadcast_ss(dx + (int64_t)(m0 + i) * nb + b);
                    for (int j = 0; j < NR; j++) {
                        __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(w[j], xv), ones);
                        part[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), d, part[i][j]);
                    }
                }
            }
            for (int j = 0; j < NR; j++) {
                const int64_t sg = (int64_t)(n0 + j) * G + g;
                const float sc = _cvtsh_ss(s[sg]), mz = sc * (float)z[sg];
                const __m256 sv = _mm256_set1_ps(sc);
                for (int i = 0; i < MR; i++) {
                    acc[i][j] = _mm256_fmadd_ps(part[i][j], sv, acc[i][j]);
                    corr[i][j] += mz * gsx[(int64_t)(m0 + i) * G + g];
                }
            }
        }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) store(y, dt, (int64_t)(m0 + i) * N + n0 + j, hsum(acc[i][j]) - corr[i][j]);
    }
};

// ---- int8 ------------------------------------------------------------------------------------

struct Int8 {
    const int8_t *xq;  // [M, Kp]
    const float *dx;   // [M] row scales
    const int8_t *w;   // [N, Kp]
    const float *ws;   // [N]
    void *y;
    int dt, N, Kp;

    template <int MR, int NR>
    void tile(int m0, int n0) const {
        const __m256i ones = _mm256_set1_epi16(1);
        __m256i acc[MR][NR];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_si256();
        for (int k = 0; k < Kp; k += 32) {
            __m256i wv[NR], wa[NR];
            for (int j = 0; j < NR; j++) {
                wv[j] = _mm256_loadu_si256((const __m256i *)(w + (int64_t)(n0 + j) * Kp + k));
                wa[j] = _mm256_abs_epi8(wv[j]);
            }
            for (int i = 0; i < MR; i++) {
                // |w| (0..128) unsigned times x carrying w's sign (x in -127..127): no saturation.
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)(m0 + i) * Kp + k));
                for (int j = 0; j < NR; j++) {
                    __m256i p = _mm256_maddubs_epi16(wa[j], _mm256_sign_epi8(xv, wv[j]));
                    acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(p, ones));
                }
            }
        }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++)
                store(y, dt, (int64_t)(m0 + i) * N + n0 + j, (float)hsum_i32(acc[i][j]) * (dx[m0 + i] * ws[n0 + j]));
    }
};

// ---- bf16 / f16 ------------------------------------------------------------------------------

struct Half {
    const float *x;     // [M, K] fp32
    const uint16_t *w;  // [N, K]
    void *y;
    int dt, wdt, N, K;

    inline __m256 load_w(const uint16_t *p) const {
        __m128i h = _mm_loadu_si128((const __m128i *)p);
        if (wdt == F16) return _mm256_cvtph_ps(h);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }

    template <int MR, int NR>
    void tile(int m0, int n0) const {
        __m256 acc[MR][NR];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
        const int K8 = K & ~7;
        for (int k = 0; k < K8; k += 8) {
            __m256 wv[NR];
            for (int j = 0; j < NR; j++) wv[j] = load_w(w + (int64_t)(n0 + j) * K + k);
            for (int i = 0; i < MR; i++) {
                const __m256 xv = _mm256_loadu_ps(x + (int64_t)(m0 + i) * K + k);
                for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(wv[j], xv, acc[i][j]);
            }
        }
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) {
                float tail = 0.f;
                for (int k = K8; k < K; k++) tail += to_float(w, wdt, (int64_t)(n0 + j) * K + k) * x[(int64_t)(m0 + i) * K + k];
                store(y, dt, (int64_t)(m0 + i) * N + n0 + j, hsum(acc[i][j]) + tail);
            }
    }
};

// Instantiates kernel.tile<mr, nr> for the run-time tile size (mr <= MR, nr in {1, NR}).
template <int MR, int NR, class K>
inline void dispatch(const K &k, int m, int mr, int n, int nr) {
    if constexpr (MR > 1) {
        if (mr < MR) return dispatch<MR - 1, NR>(k, m, mr, n, nr);
    }
    if constexpr (NR > 1) {
        if (nr < NR) return dispatch<MR, 1>(k, m, mr, n, nr);
    }
    k.template tile<MR, NR>(m, n);
}

// Decode (one row) wants several columns in flight; many rows want weights reused across rows.
template <class K>
void run_columns(const K &k, int M, int n0, int n1) {
    auto one = [&](int m, int mr, int n, int nr) { dispatch<1, 4>(k, m, mr, n, nr); };
    auto many = [&](int m, int mr, int n, int nr) { dispatch<4, 2>(k, m, mr, n, nr); };
    if (M == 1)
        walk<1, 4>(M, n0, n1, one);
    else
        walk<4, 2>(M, n0, n1, many);
}

}  // namespace

extern "C" {

void speclite_int4_gemm(const void *x, int dt, const uint8_t *qw, const uint16_t *scales, const uint8_t *zeros,
                        void *y, int M, int N, int K, int group, int threads) {
    const int nb = (K + 31) / 32, Kp = nb * 32, G = (K + group - 1) / group, bpg = group / 32;
    Scratch &sc = scratch;
    sc.q.resize((size_t)M * Kp);
    sc.a.resize((size_t)M * nb);
    sc.b.resize((size_t)M * G);
    sc.s.resize((size_t)M * nb);
    Int4 k{sc.q.data(), sc.a.data(), sc.b.data(), qw, scales, zeros, y, dt, N, Kp, nb, G, bpg};
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
            float *d = sc.a.data() + (int64_t)m * nb;
            int32_t *sums = sc.s.data() + (int64_t)m * nb;
            quantize_row(x, dt, m, K, Kp, 32, sc.q.data() + (int64_t)m * Kp, d, sums);
            for (int g = 0; g < G; g++) {
                float t = 0.f;
                for (int b = g * bpg; b < std::min(nb, (g + 1) * bpg); b++) t += d[b] * (float)sums[b];
                sc.b[(int64_t)m * G + g] = t;
            }
        }
        int n0, n1;
        split(N, 4, omp_get_num_threads(), omp_get_thread_num(), n0, n1);
        run_columns(k, M, n0, n1);
    }
}

void speclite_int8_gemm(const void *x, int dt, const int8_t *w, const float *wscale, void *y, int M, int N, int K,
                        int threads) {
    const int Kp = (K + 31) / 32 * 32;
    Scratch &sc = scratch;
    sc.q.resize((size_t)M * Kp);
    sc.a.resize((size_t)M);
    sc.s.resize((size_t)M);
    Int8 k{sc.q.data(), sc.a.data(), w, wscale, y, dt, N, Kp};
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) quantize_row(x, dt, m, K, Kp, Kp, sc.q.data() + (int64_t)m * Kp, &sc.a[m], &sc.s[m]);
        int n0, n1;
        split(N, 4, omp_get_num_threads(), omp_get_thread_num(), n0, n1);
        run_columns(k, M, n0, n1);
    }
}

void speclite_half_gemm(const void *x, int dt, const uint16_t *w, int wdt, void *y, int M, int N, int K, int threads) {
    Scratch &sc = scratch;
    sc.a.resize((size_t)M * K);
    Half k{sc.a.data(), w, y, dt, wdt, N, K};
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++)
            for (int i = 0; i < K; i++) sc.a[(int64_t)m * K + i] = to_float(x, dt, (int64_t)m * K + i);
        int n0, n1;
        split(N, 4, omp_get_num_threads(), omp_get_thread_num(), n0, n1);
        run_columns(k, M, n0, n1);
    }
}

}  // extern "C"
