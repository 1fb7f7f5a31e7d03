// Matrix products for quantized and half-precision weights on x86 CPUs with AVX2 + FMA + F16C, and
// where the build has AVX-512 VNNI and BF16 (cpu_build's avx512 path), the same products with their
// dot products in one instruction each (marked AVX-512 below; the layouts are the same). Where it
// also has AMX (cpu_build's amx path), the int4 and int8 products of many rows take the tiles: the
// weights rearranged per call, the integer sums exact, so every row's numbers are the VNNI tiles'.
// A drafter's bf16 products (Matrices::loose) take the bf16 tiles there, exact or not (see there),
// and vdpbf16ps on Zen 4 and later (DotBf16).
//
// y [M, N] = x [M, K] @ w [N, K]^T for three weight formats:
//   int4  repacked at load for eight columns at a time (layout at Int4 below), an fp16 scale and a
//         uint8 zero per group (w = (q - z) * s, group a multiple of 32). Activations are quantized
//         per 32-block to int8 once per call; a block's dot product is integer (maddubs), its float
//         scale applied once per block, and the zeros once per group through the blocks' sums.
//   int8  repacked at load (layout at Int8 below), a per-channel scale (W8A8): activations quantized
//         per row to int8, integer dot products.
//   dense fp32, or bf16/f16 converted to fp32 in registers (bf16 is a 16-bit shift, f16 through F16C),
//         repacked at load into panels of 16 columns (layout at Dense below), fp32 FMAs. On Zen 4
//         (DotBf16) bf16 weights meeting bf16 activations take vdpbf16ps instead: the same exact
//         products, their fp32 sums in pairs.
// x and y are fp32, bf16 or f16 (same dtype for both; y rounded to nearest even).
//
// Exactness (all but a drafter's loose products): the arithmetic of output (m, n) is the same
// sequence of operations whatever M is and whichever tile holds it (tiles only share loads; every
// (m, n) has its own accumulators and the same reduction), and the build uses -ffp-contract=off so
// the compiler cannot fuse differently in different tiles. So a row computed alone equals that row in a batch, bit for bit: speculative
// verification of k+1 rows gives the plain decoder's logits.
//
// A team's threads (team.h) split the output columns statically. matmul_team is run by every
// thread of a team: one call starts one (speclite_matmul), a decoder layer (kernels.cpp) runs its
// four products and the work between them in one team. Rows are walked in chunks so a chunk's
// activations stay in cache while the weights stream.
#pragma once

#include <cmath>
#if defined(__AMX_INT8__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <type_traits>
#include <vector>

#include "team.h"
#include "values.h"

namespace {

constexpr int ROW_CHUNK = 32, CHUNK_BYTES = 256 << 10;
// Bytes ahead of the weight streams that the kernels prefetch: the hardware prefetcher alone left a
// decode step at about a third of the copy bandwidth (benchmarks/RESULTS.md, issue 13). Measured
// best: 2 KB ahead of int4's one stream per thread, 4 KB ahead of each row of the row-major formats.
constexpr int PREFETCH = 2048, PREFETCH_ROWS = 4096;
// One row's dense and int8 products (a decode step) prefetch nothing on Zen 4 and later (cpu_build
// defines SPECLITE_ZEN4 on AMD CPUs with AVX-512), whichever ISA path runs: there the hardware
// prefetcher alone streamed them 8-12% faster on the AVX-512 path and 13% on the AVX2 path
// (benchmarks/RESULTS.md, 2026-11-25 and 2026-11-26). On an AMX Xeon the prefetch made whole decode
// steps 1.10x (bf16) and 1.15x (w8a8) faster. int4's one stream per thread, two or more rows, and
// the AVX2-only AMD CPUs (Zen 3 and before, where the int4 and int8 streams gained 1.2-1.4x) keep it.
#if defined(SPECLITE_ZEN4)
constexpr bool PREFETCH_ONE_ROW = false;
#else
constexpr bool PREFETCH_ONE_ROW = true;
#endif
// int4's one row also asks the L2 for its stream FAR_PREFETCH bytes ahead, first, on Intel CPUs:
// whole int4/int4 decode steps 1.15-1.19x on the AMX Xeon's amx build, within 1% on its avx512
// and avx2 builds and on 5-row products (benchmarks/RESULTS.md, 2026-11-25; the gain moved with the
// loop's code, so it is measured, not explained). AMD keeps what Zen 3 was tuned with (not measured).
#if defined(SPECLITE_AMD)
constexpr int FAR_PREFETCH = 0;
#else
constexpr int FAR_PREFETCH = 8192;
#endif

// Row m of x quantized to int8 in blocks of `block` values (K padded with zeros to Kp):
// d = max|x| / 127, q = round(x * (127 / max|x|)) half to even. Returns the blocks' scales in d and
// their integer sums in sums. Eight values at a time; the numbers are those of the scalar loop.
void quantize_row(const void *x, int dt, int64_t m, int K, int Kp, int block, int8_t *q, float *d, int32_t *sums) {
    const int64_t base = m * (int64_t)K;
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int b0 = 0; b0 < Kp; b0 += block) {
        const int b1 = std::min(b0 + block, K);
        __m256 mx = _mm256_setzero_ps();
        int k = b0;
        for (; k + 8 <= b1; k += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, load8(x, dt, base + k)));
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, mx);
        float amax = 0.f;
        for (float v : lanes) amax = std::max(amax, v);
        for (; k < b1; k++) amax = std::max(amax, std::fabs(to_float(x, dt, base + k)));
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        const __m256 iv = _mm256_set1_ps(inv);
        __m256i sv = _mm256_setzero_si256();
        for (k = b0; k + 8 <= b1; k += 8) {
            const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x, dt, base + k), iv));  // half to even
            sv = _mm256_add_epi32(sv, v);
            const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            _mm_storel_epi64((__m128i *)(q + k), _mm_packs_epi16(w, w));
        }
        int32_t sum = hsum_i32(sv);
        for (; k < b0 + block; k++) {
            const int v = k < b1 ? (int)_mm_cvtss_si32(_mm_set_ss(to_float(x, dt, base + k) * inv)) : 0;
            q[k] = (int8_t)v;
            sum += v;
        }
        d[b0 / block] = amax / 127.f;
        sums[b0 / block] = sum;
    }
}

// Rows per chunk for tiles of mr rows whose activations take row_bytes each: as many as keep
// CHUNK_BYTES of them in the L2, a multiple of mr, ROW_CHUNK / mr tiles at least. The weights stream
// from memory once per chunk, so a 128-row prefill with K = 896 reads them once instead of four
// times (prefill 1.05x on AVX2's bf16 tiles against 30-row chunks; benchmarks/RESULTS.md).
inline int chunk_rows(int M, int64_t row_bytes, int mr) {
    const int fit = (int)std::min<int64_t>(M + mr - 1, CHUNK_BYTES / row_bytes);
    return std::max(ROW_CHUNK / mr, fit / mr) * mr;
}

// tile(std::integral_constant<int, r>()) for a run-time r <= R: a tile template's row count picked at
// run time (the rows of a call, or those left over).
template <int R, class Tile>
inline void up_to_rows(int r, Tile tile) {
    if constexpr (R > 1) {
        if (r < R) return up_to_rows<R - 1>(r, tile);
    }
    tile(std::integral_constant<int, R>());
}

inline void split(int N, int step, int threads, int t, int &n0, int &n1) {
    const int tiles = (N + step - 1) / step;
    n0 = (int)((int64_t)tiles * t / threads) * step;
    n1 = std::min(N, (int)((int64_t)tiles * (t + 1) / threads) * step);
}

// A caller's scratch, shared by its team (so teams of different callers never share a barrier).
struct Scratch {
    std::vector<int8_t> q;
    std::vector<float> a, b;
    std::vector<int32_t> s;
    team::TeamBarrier barrier;
};
thread_local Scratch scratch;

#if defined(__AMX_INT8__)
// ---- AMX tiles (cpu_build's amx path) ------------------------------------------------------------
//
// Linux hands a process the tiles' 8 KB of state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA), once; where it refuses, the AVX-512 code of the same build runs. The products use
// tmm0-1 for activations (16 rows x `k` int8), tmm2-3 for weights (k / 4 rows, each 16 columns' 4
// consecutive K values: the "VNNI" order the tile multiplies read) and tmm4-7 for int32 sums (16 rows
// x 16 columns). Other code on the same thread (oneDNN inside torch) configures the tiles its own
// way, so each call loads its configuration and releases the tiles when it is done.

inline bool amx_ready() {
    static const bool ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return ready;
}

inline void amx_configure(int k) {
    struct alignas(64) {
        uint8_t palette = 1, start_row = 0, reserved[14] = {};
        uint16_t colsb[16] = {};
        uint8_t rows[16] = {};
    } config;
    for (int t = 0; t < 8; t++) {
        config.colsb[t] = t < 2 ? k : 64;
        config.rows[t] = t == 2 || t == 3 ? k / 4 : 16;
    }
    _tile_loadconfig(&config);
}

// The 32 x 32 step both products take: 16 rows at x0 and 16 at x1 (rows ld bytes apart) against the
// two weight panels in tmm2-3, summed into tmm4-7 (tmm4 + 2r + p: rows r, panel p). Int4's weights
// are unsigned nibbles (tdpbsud), int8's signed bytes (tdpbssd).
template <bool UNSIGNED_WEIGHTS>
inline void amx_multiply(const int8_t *x0, const int8_t *x1, int ld) {
    _tile_loadd(0, x0, ld);
    _tile_loadd(1, x1, ld);
    if (UNSIGNED_WEIGHTS) {
        _tile_dpbsud(4, 0, 2);
        _tile_dpbsud(5, 0, 3);
        _tile_dpbsud(6, 1, 2);
        _tile_dpbsud(7, 1, 3);
    } else {
        _tile_dpbssd(4, 0, 2);
        _tile_dpbssd(5, 0, 3);
        _tile_dpbssd(6, 1, 2);
        _tile_dpbssd(7, 1, 3);
    }
}

// Half h (8 columns) of `n` panel rows set to zeros: a group that is not the calling thread's.
inline void amx_zero_half(int32_t *rows, int n, int h) {
    for (int r = 0; r < n; r++) _mm256_storeu_si256((__m256i *)(rows + r * 16 + 8 * h), _mm256_setzero_si256());
}

inline void amx_zero() {
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
}

inline void amx_store(int32_t (*sums)[256]) {
    _tile_stored(4, sums[0], 64);
    _tile_stored(5, sums[1], 64);
    _tile_stored(6, sums[2], 64);
    _tile_stored(7, sums[3], 64);
}

// Rows from which the products take the tiles (benchmarks/RESULTS.md, 0.5B shapes, 2 threads).
// int8: at 9 rows 1.1-1.5x the VNNI tiles, at 5 even, at 2 slower (rearranging the weights costs what
// streaming them does); 128 rows 3.8-4.7x (against the two-column VNNI tiles before tile8, which is
// 1.5-2.4x faster on Zen 4: not measured on an AMX machine since). int4: each 32-block's sums still
// meet their float scale one by one, so the tiles pay later: 24 rows 1.05-1.35x, 16 even, 128 rows
// 1.6-1.7x.
constexpr int AMX_INT8_ROWS = 8, AMX_INT4_ROWS = 24;
#endif

// ---- int4 ------------------------------------------------------------------------------------
//
// Eight output columns at a time, results in the eight lanes of one register, so scales and zeros
// are vectors and no column needs a horizontal sum. Per group of 8 columns and 32-weight block,
// 128 bytes: the columns split into sets A = {0, 1, 4, 5} and B = {2, 3, 6, 7}; U(S, j) is 32
// bytes, four 8-byte runs (one per column of S, in that order) of weights 8j..8j+7; packed 32-byte
// word t = 2S + j' holds U(S, j') in its low nibbles and U(S, j' + 2) in its high ones. A block's
// activations are broadcast 8 bytes at a time against U(S, j); maddubs + add_epi16 sum the four
// runs (at most 4 * 2 * 15 * 127 < 2^15: no saturation), madd and hadd leave lane l = column l.

struct Int4 {
    const int8_t *xq;   // [M, Kp]
    const float *dx;    // [M, nb] block scales
    const float *gsx;   // [M, G] per group: sum over its blocks of d * (sum of q)
    const uint8_t *qw;  // [N / 8, nb, 128]
    const uint16_t *s;  // [N / 8, G, 8] fp16
    const uint8_t *z;   // [N / 8, G, 8]
    void *y;            // [M, ldy], this matrix's N columns from column y0
    int dt, N, Kp, nb, G, bpg, ldy, y0;

    // Sum over the block of weight * activation for the 8 columns, as int32 lanes. The sums are
    // exact integers: the AVX-512 path's vpdpbusd (four byte products into an int32 lane, as
    // maddubs + madd do in two steps) gives the AVX2 path's numbers.
    static inline __m256i block_dot(const __m256i u[8], const int8_t *x) {
        __m256i sa = _mm256_setzero_si256(), sb = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            int64_t run;
            memcpy(&run, x + 8 * j, 8);
            const __m256i xv = _mm256_set1_epi64x(run);
#if defined(__AVX512VNNI__)
            sa = _mm256_dpbusd_epi32(sa, u[j], xv);
            sb = _mm256_dpbusd_epi32(sb, u[4 + j], xv);
#else
            sa = _mm256_add_epi16(sa, _mm256_maddubs_epi16(u[j], xv));
            sb = _mm256_add_epi16(sb, _mm256_maddubs_epi16(u[4 + j], xv));
#endif
        }
#if defined(__AVX512VNNI__)
        return _mm256_hadd_epi32(sa, sb);
#else
        const __m256i ones = _mm256_set1_epi16(1);
        return _mm256_hadd_epi32(_mm256_madd_epi16(sa, ones), _mm256_madd_epi16(sb, ones));
#endif
    }

    template <int MR>
    void tile(int m0, int cg) const {
        const __m256i low = _mm256_set1_epi8(0x0F);
        __m256 acc[MR];
        for (int i = 0; i < MR; i++) acc[i] = _mm256_setzero_ps();
        const uint8_t *w = qw + (int64_t)cg * nb * 128;
        for (int g = 0; g < G; g++) {
            __m256 part[MR];
            for (int i = 0; i < MR; i++) part[i] = _mm256_setzero_ps();
            const int b1 = std::min(nb, (g + 1) * bpg);
            for (int b = g * bpg; b < b1; b++) {
                // The weights stream from memory once: ask for them well ahead (the next column
                // group's follow this one's). m0 == 0: not the leftover row of a bigger tile.
                if (FAR_PREFETCH && MR == 1 && m0 == 0) {
                    _mm_prefetch((const char *)(w + (int64_t)b * 128 + FAR_PREFETCH), _MM_HINT_T1);
                    _mm_prefetch((const char *)(w + (int64_t)b * 128 + FAR_PREFETCH + 64), _MM_HINT_T1);
                }
                _mm_prefetch((const char *)(w + (int64_t)b * 128 + PREFETCH), _MM_HINT_T0);
                _mm_prefetch((const char *)(w + (int64_t)b * 128 + PREFETCH + 64), _MM_HINT_T0);
                __m256i u[8];  // U(A, 0..3), U(B, 0..3)
                for (int t = 0; t < 4; t++) {
                    const __m256i p = _mm256_loadu_si256((const __m256i *)(w + (int64_t)b * 128 + 32 * t));
                    const int set = t >> 1, j = t & 1;
                    u[4 * set + j] = _mm256_and_si256(p, low);
                    u[4 * set + j + 2] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
                }
                for (int i = 0; i < MR; i++) {
                    const __m256i dot = block_dot(u, xq + (int64_t)(m0 + i) * Kp + b * 32);
                    part[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(dx + (int64_t)(m0 + i) * nb + b), part[i]);
                }
            }
            const int64_t sg = ((int64_t)cg * G + g) * 8;
            const __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + sg)));
            const __m256 zv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(z + sg))));
            const __m256 szv = _mm256_mul_ps(sv, zv);
            for (int i = 0; i < MR; i++) {
                acc[i] = _mm256_fmadd_ps(part[i], sv, acc[i]);
                acc[i] = _mm256_fnmadd_ps(szv, _mm256_broadcast_ss(gsx + (int64_t)(m0 + i) * G + g), acc[i]);
            }
        }
        const int cols = std::min(8, N - cg * 8);
        for (int i = 0; i < MR; i++) {
            alignas(32) float out[8];
            _mm256_store_ps(out, acc[i]);
            for (int l = 0; l < cols; l++) store(y, dt, (int64_t)(m0 + i) * ldy + y0 + cg * 8 + l, out[l]);
        }
    }

#if defined(__AVX512F__)
    // tile() for groups cg and cg + 1 at once, in the two halves of 16-lane registers: each vpdpbusd
    // does two groups' work, and the pairwise sums (hadd's pattern in every 128-bit lane) leave lane l
    // = column l of group cg, lane 8 + l of cg + 1. The same integer sums and float operations per
    // output as tile(), so the same bits.
    template <int MR>
    void tile2(int m0, int cg) const {
        const __m512i low = _mm512_set1_epi8(0x0F);
        __m512 acc[MR];
        for (int i = 0; i < MR; i++) acc[i] = _mm512_setzero_ps();
        const uint8_t *w0 = qw + (int64_t)cg * nb * 128, *w1 = w0 + (int64_t)nb * 128;
        for (int g = 0; g < G; g++) {
            __m512 part[MR];
            for (int i = 0; i < MR; i++) part[i] = _mm512_setzero_ps();
            const int b1 = std::min(nb, (g + 1) * bpg);
            for (int b = g * bpg; b < b1; b++) {
                for (const uint8_t *w : {w0, w1}) {
                    _mm_prefetch((const char *)(w + (int64_t)b * 128 + PREFETCH), _MM_HINT_T0);
                    _mm_prefetch((const char *)(w + (int64_t)b * 128 + PREFETCH + 64), _MM_HINT_T0);
                }
                __m512i u[8];  // U(A, 0..3), U(B, 0..3) of both groups
                for (int t = 0; t < 4; t++) {
                    const __m512i p = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w0 + (int64_t)b * 128 + 32 * t))),
                        _mm256_loadu_si256((const __m256i *)(w1 + (int64_t)b * 128 + 32 * t)), 1);
                    const int set = t >> 1, j = t & 1;
                    u[4 * set + j] = _mm512_and_si512(p, low);
                    u[4 * set + j + 2] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
                }
                for (int i = 0; i < MR; i++) {
                    const int8_t *x = xq + (int64_t)(m0 + i) * Kp + b * 32;
                    __m512i sa = _mm512_setzero_si512(), sb = _mm512_setzero_si512();
                    for (int j = 0; j < 4; j++) {
                        int64_t run;
                        memcpy(&run, x + 8 * j, 8);
                        const __m512i xv = _mm512_set1_epi64(run);
                        sa = _mm512_dpbusd_epi32(sa, u[j], xv);
                        sb = _mm512_dpbusd_epi32(sb, u[4 + j], xv);
                    }
                    const __m512 fa = _mm512_castsi512_ps(sa), fb = _mm512_castsi512_ps(sb);
                    const __m512i dot = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0x88)),
                                                         _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0xDD)));
                    part[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(dx[(int64_t)(m0 + i) * nb + b]), part[i]);
                }
            }
            const int64_t s0 = ((int64_t)cg * G + g) * 8, s1 = s0 + (int64_t)G * 8;
            const __m512 sv = _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)(s + s1)),
                                                               _mm_loadu_si128((const __m128i *)(s + s0))));
            const __m128i z16 = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(z + s0)), _mm_loadl_epi64((const __m128i *)(z + s1)));
            const __m512 szv = _mm512_mul_ps(sv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(z16)));
            for (int i = 0; i < MR; i++) {
                acc[i] = _mm512_fmadd_ps(part[i], sv, acc[i]);
                acc[i] = _mm512_fnmadd_ps(szv, _mm512_set1_ps(gsx[(int64_t)(m0 + i) * G + g]), acc[i]);
            }
        }
        const int cols = std::min(16, N - cg * 8);
        for (int i = 0; i < MR; i++) {
            alignas(64) float out[16];
            _mm512_store_ps(out, acc[i]);
            for (int l = 0; l < cols; l++) store(y, dt, (int64_t)(m0 + i) * ldy + y0 + cg * 8 + l, out[l]);
        }
    }
#endif

    // Column groups [g0, g1) of this matrix, rows in cache-sized chunks, MR rows per tile where
    // there are (AVX2: 3, measured against 2 and 4; its rows' sums spill to the stack, but a tile that
    // kept them in registers ran 0.68-0.83x: the maddubs work bounds it, RESULTS.md 2026-11-26). ONE_PASS:
    // the most rows one tile takes when they are all there are or left over; on AVX2 a 2-row tile for
    // the rows left over was slower than one row at a time (3 + 2 against 3 + 1 + 1). On AVX-512, two
    // rows or more take two groups a tile (tile2), up to 6 rows (Qwen2.5-0.5B shapes, 2 threads, AMX
    // Xeon, against one group and 4 + 1 rows: 5 rows 1.45x, 2 rows 1.5x, 9 rows 1.3x; 6 rows a tile
    // against 4: 9 rows 1.1x, 16 even).
#if defined(__AVX512F__)
    static constexpr int MR = 6, ONE_PASS = 6;
    static constexpr bool PAIRED = true;
#else
    static constexpr int MR = 3, ONE_PASS = 1;
    static constexpr bool PAIRED = false;
#endif
#if defined(__AMX_INT8__)
    // Group g's 8 columns, unpacked to bytes, into half h of a 16-column tile panel: K values
    // 32b + 4q..+3 of the 8 columns become panel row 8b + q. After the unpacking, u[j] (set A) and
    // u[4 + j] (set B) hold quads 2j and 2j + 1 of their four columns each; one permute puts them in
    // column order. A group that is not the thread's is zeros.
    void to_panel(int32_t *rows, int g, int h, bool live) const {
        if (!live) return amx_zero_half(rows, nb * 8, h);
        const __m256i low = _mm256_set1_epi8(0x0F);
        const __m512i order = _mm512_setr_epi32(0, 2, 8, 10, 4, 6, 12, 14, 1, 3, 9, 11, 5, 7, 13, 15);
        for (int b = 0; b < nb; b++) {
            const uint8_t *w = qw + ((int64_t)g * nb + b) * 128;
            __m256i u[8];
            for (int t = 0; t < 4; t++) {
                const __m256i p = _mm256_loadu_si256((const __m256i *)(w + 32 * t));
                const int set = t >> 1, j = t & 1;
                u[4 * set + j] = _mm256_and_si256(p, low);
                u[4 * set + j + 2] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
            }
            for (int j = 0; j < 4; j++) {
                const __m512i quads = _mm512_permutexvar_epi32(order, _mm512_inserti64x4(_mm512_castsi256_si512(u[j]), u[4 + j], 1));
                int32_t *row = rows + (b * 8 + 2 * j) * 16 + 8 * h;
                _mm256_storeu_si256((__m256i *)row, _mm512_castsi512_si256(quads));
                _mm256_storeu_si256((__m256i *)(row + 16), _mm512_extracti64x4_epi64(quads, 1));
            }
        }
    }

    // Group cg + q's 8 fp16 scales and uint8 zeros for K group g, as fp32, for columns 8q.. of a step
    // (zeros for a group that is not the thread's).
    void group_scales(int cg, int g1, int g, float *sv, float *zv) const {
        for (int q = 0; q < 4; q++) {
            const int64_t at = ((int64_t)(cg + q) * G + g) * 8;
            const bool live = cg + q < g1;
            _mm256_storeu_ps(sv + 8 * q, live ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + at))) : _mm256_setzero_ps());
            _mm256_storeu_ps(zv + 8 * q, live ? _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(z + at))))
                                              : _mm256_setzero_ps());
        }
    }

    // 32 columns (groups cg..cg+3 of [cg, g1)) at a time: their nibbles unpacked once into two
    // 16-column tile panels (to_panel), then every 32 rows of x against them, one 32-block per tile
    // multiply (tdpbsud: signed activations, unsigned weights), so that each block's exact integer sums
    // meet the same float operations, in the same order, as in tile(): part += sum * dx per block,
    // acc += part * s - s * z * gsx per group. Reads up to 32 rows past x's last (reserve pads the
    // scratch); their results are dropped.
    void run_amx(int M, int g0, int g1) const {
        thread_local std::vector<int32_t> panels;
        const int64_t panel = (int64_t)nb * 128;  // int32s: 8 rows of 16 per block
        if ((int64_t)panels.size() < 2 * panel) panels.resize(2 * panel);
        alignas(64) int32_t sums[4][256];
        alignas(64) float part[4][256], acc[4][256], sv[32], zv[32];
        amx_configure(32);
        for (int cg = g0; cg < g1; cg += 4) {
            for (int q = 0; q < 4; q++) to_panel(panels.data() + (q / 2) * panel, cg + q, q % 2, cg + q < g1);
            const int8_t *left = (const int8_t *)panels.data(), *right = left + panel * 4;
            for (int m0 = 0; m0 < M; m0 += 32) {
                const int rows[2] = {std::min(16, M - m0), std::max(0, std::min(16, M - m0 - 16))};
                for (int t = 0; t < 4; t++)
                    for (int i = 0; i < 256; i += 16) _mm512_store_ps(acc[t] + i, _mm512_setzero_ps());
                for (int g = 0; g < G; g++) {
                    for (int t = 0; t < 4; t++)
                        for (int i = 0; i < 256; i += 16) _mm512_store_ps(part[t] + i, _mm512_setzero_ps());
                    for (int b = g * bpg; b < std::min(nb, (g + 1) * bpg); b++) {
                        const int8_t *x0 = xq + (int64_t)m0 * Kp + b * 32;
                        amx_zero();
                        _tile_loadd(2, left + b * 512, 64);
                        _tile_loadd(3, right + b * 512, 64);
                        amx_multiply<true>(x0, x0 + (int64_t)16 * Kp, Kp);
                        amx_store(sums);
                        for (int t = 0; t < 4; t++)
                            for (int i = 0; i < rows[t / 2]; i++) {
                                const __m512 d = _mm512_set1_ps(dx[(int64_t)(m0 + 16 * (t / 2) + i) * nb + b]);
                                const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(sums[t] + 16 * i));
                                _mm512_store_ps(part[t] + 16 * i, _mm512_fmadd_ps(dot, d, _mm512_load_ps(part[t] + 16 * i)));
                            }
                    }
                    group_scales(cg, g1, g, sv, zv);
                    for (int t = 0; t < 4; t++) {
                        const __m512 s16 = _mm512_loadu_ps(sv + 16 * (t % 2)), sz = _mm512_mul_ps(s16, _mm512_loadu_ps(zv + 16 * (t % 2)));
                        for (int i = 0; i < rows[t / 2]; i++) {
                            __m512 a = _mm512_fmadd_ps(_mm512_load_ps(part[t] + 16 * i), s16, _mm512_load_ps(acc[t] + 16 * i));
                            a = _mm512_fnmadd_ps(sz, _mm512_set1_ps(gsx[(int64_t)(m0 + 16 * (t / 2) + i) * G + g]), a);
                            _mm512_store_ps(acc[t] + 16 * i, a);
                        }
                    }
                }
                for (int t = 0; t < 4; t++) {
                    const int n0 = cg * 8 + 16 * (t % 2), cols = std::min({16, N - n0, g1 * 8 - n0});
                    for (int i = 0; i < rows[t / 2]; i++)
                        for (int c = 0; c < cols; c++) store(y, dt, (int64_t)(m0 + 16 * (t / 2) + i) * ldy + y0 + n0 + c, acc[t][16 * i + c]);
                }
            }
        }
        _tile_release();
    }
#endif

    void run(int M, int g0, int g1) const {
#if defined(__AMX_INT8__)
        if (M >= AMX_INT4_ROWS && amx_ready()) return run_amx(M, g0, g1);
#endif
        if (M == 1) {  // a decode step: its own loop (inside the dispatch below it ran 1.1-1.25x slower)
            for (int cg = g0; cg < g1; cg++) tile<1>(0, cg);
            return;
        }
        // Up to ONE_PASS rows take one tile (a verification's k + 1: the weights unpacked once); more
        // go MR at a time, the rows left over in tiles of up to ONE_PASS.
        const int mr = M <= ONE_PASS ? M : MR;
        const int chunk = chunk_rows(M, Kp, mr);
        for (int c0 = 0; c0 < M; c0 += chunk) {
            const int c1 = std::min(c0 + chunk, M);
            for (int cg = g0; cg < g1; cg++) {
                // AVX-512, two rows or more: two column groups a tile where the thread has them
                const bool two = PAIRED && M > 1 && cg + 1 < g1;
                int m = c0;
                for (; m + mr <= c1; m += mr) rows_tile<std::max(MR, ONE_PASS)>(mr, m, cg, two);
                for (int r; m < c1; m += r) rows_tile<ONE_PASS>(r = std::min(c1 - m, ONE_PASS), m, cg, two);
                cg += two;
            }
        }
    }

    // tile<r>(m, cg) (two: tile2) for r <= R rows.
    template <int R>
    void rows_tile(int r, int m, int cg, bool two) const {
        up_to_rows<R>(r, [&](auto rows) {
#if defined(__AVX512F__)
            if (two) return tile2<rows>(m, cg);
#endif
            tile<rows>(m, cg);
        });
    }
};

// ---- int8 ------------------------------------------------------------------------------------
//
// Repacked at load for one contiguous stream: per group of 8 columns (N padded with zero columns)
// and 32-block, the 8 columns' 32 weights one after the other (256 bytes). Rows of a row-major
// matrix read as 4-8 interleaved streams ran at about half of the copy bandwidth on a big matrix.
// The integer dot products are exact, so any tile (and either ISA path) gives the same sums; the
// float epilogue is sum * (dx * ws) in every tile.
//
// AVX-512: vpdpbusd multiplies unsigned bytes by signed ones. The weights' sign bit flipped makes
// them w + 128 (unsigned), so one instruction adds 4 products (w + 128) x into each int32 lane, and
// sum(w x) = that - 128 sum(x), the row's sum coming from its quantization. (AVX2 needs abs, sign,
// maddubs, madd and an add for the same.)

struct Int8 {
    const int8_t *xq;   // [M, Kp]
    const float *dx;    // [M] row scales
    const int32_t *sx;  // [M] row sums of xq
    const int8_t *w;    // [N / 8, nb, 8, 32]
    const float *ws;    // [N]
    void *y;            // [M, ldy], this matrix's N columns from column y0
    int dt, N, Kp, ldy, y0;

#if defined(__AVX512VNNI__)
    static inline __m256i prepare(__m256i wv) { return _mm256_xor_si256(wv, _mm256_set1_epi8((char)0x80)); }
    static inline __m256i dot_add(__m256i acc, __m256i wp, __m256i xv) { return _mm256_dpbusd_epi32(acc, wp, xv); }
    int32_t offset(int m) const { return 128 * sx[m]; }
#else
    // |w| (0..128) unsigned times x carrying w's sign (x in -127..127): no saturation.
    static inline __m256i prepare(__m256i wv) { return wv; }
    static inline __m256i dot_add(__m256i acc, __m256i wv, __m256i xv) {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv)),
                                                       _mm256_set1_epi16(1)));
    }
    int32_t offset(int) const { return 0; }
#endif

    // One row, the 8 columns of group cg: the sums end in the 8 lanes of one register.
    void row8(int m, int cg) const {
        const int nb = Kp / 32;
        const int8_t *wg = w + (int64_t)cg * nb * 256, *xm = xq + (int64_t)m * Kp;
        __m256i acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_si256();
        for (int b = 0; b < nb; b++) {
            if (PREFETCH_ONE_ROW)
                for (int line = 0; line < 256; line += 64)
                    _mm_prefetch((const char *)(wg + (int64_t)b * 256 + PREFETCH + line), _MM_HINT_T0);
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xm + b * 32));
            for (int c = 0; c < 8; c++)
                acc[c] = dot_add(acc[c], prepare(_mm256_loadu_si256((const __m256i *)(wg + ((int64_t)b * 8 + c) * 32))), xv);
        }
        // Three rounds of pairwise sums leave column c's total in lane c.
        const __m256i t0 = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
        const __m256i t1 = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[4], acc[5]), _mm256_hadd_epi32(acc[6], acc[7]));
        const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(t0, t1, 0x20), _mm256_permute2x128_si256(t0, t1, 0x31));
        epilogue(m, cg, _mm256_sub_epi32(sums, _mm256_set1_epi32(offset(m))));
    }

    // Rows m0..m0+MR-1 (MR <= 4), columns n and n + 1 (of one group), each weight load serving every
    // row (4 x 2 accumulators: more spill registers, measured slower).
    template <int MR>
    void tile(int m0, int n, bool first) const {
        const int nb = Kp / 32;
        const int8_t *wc = w + ((int64_t)(n / 8) * nb * 8 + n % 8) * 32;
        __m256i acc[MR][2];
        for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
        const bool streams = first && n % 8 == 0;  // the chunk's first tile reads the group from memory
        for (int b = 0; b < nb; b++) {
            if (streams)  // the group's other columns follow: fetch the rest of the block, and ahead
                for (int line = 64; line < 512; line += 64)
                    _mm_prefetch((const char *)(wc + (int64_t)b * 256 + (line < 256 ? line : 2 * PREFETCH + line - 256)), _MM_HINT_T0);
            const __m256i w0 = prepare(_mm256_loadu_si256((const __m256i *)(wc + (int64_t)b * 256)));
            const __m256i w1 = prepare(_mm256_loadu_si256((const __m256i *)(wc + (int64_t)b * 256 + 32)));
            for (int i = 0; i < MR; i++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (int64_t)(m0 + i) * Kp + b * 32));
                acc[i][0] = dot_add(acc[i][0], w0, xv);
                acc[i][1] = dot_add(acc[i][1], w1, xv);
            }
        }
        for (int i = 0; i < MR; i++)
            for (int c = 0; c < 2 && n + c < N; c++)
                store(y, dt, (int64_t)(m0 + i) * ldy + y0 + n + c,
                      (float)(hsum_i32(acc[i][c]) - offset(m0 + i)) * (dx[m0 + i] * ws[n + c]));
    }

#if defined(__AVX512VNNI__)
    // GCC keeps _mm512_dpbusd_epi32's __m512i sums of a tile in registers only with a copy and a stack
    // store for each product (4x slower); as its own vectors of int32 they stay put.
#if defined(__clang__)
    using I32x16 = __m512i;
    static inline __attribute__((always_inline)) I32x16 dot_add(I32x16 acc, __m512i u, __m512i s) { return _mm512_dpbusd_epi32(acc, u, s); }
#else
    typedef int I32x16 __attribute__((vector_size(64)));
    static inline __attribute__((always_inline)) I32x16 dot_add(I32x16 acc, __m512i u, __m512i s) {
        return __builtin_ia32_vpdpbusd_v16si(acc, (I32x16)u, (I32x16)s);
    }
#endif

    // Rows m0..m0+MR-1 (MR <= 6), the 8 columns of group cg: a block's 256 bytes of weights, in four
    // registers of two columns each (a column's 32 bytes, 8 quads of K, in each half), serve every row,
    // whose 32 activations are broadcast to both halves; each lane sums one column's quad of every
    // block, and the 8 lanes of a column are added once, at the end (reduce8). Two columns a tile
    // with a horizontal sum for each row and column took 22% of vpdpbusd's peak at 128 rows.
    template <int MR>
    __attribute__((noinline)) void tile8(int m0, int cg) const {
        const int nb = Kp / 32;
        const int8_t *wg = w + (int64_t)cg * nb * 256;
        const int8_t *xm[MR];
        for (int i = 0; i < MR; i++) xm[i] = xq + (int64_t)(m0 + i) * Kp;
        I32x16 acc[MR][4];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = (I32x16)_mm512_setzero_si512();
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        for (int b = 0; b < nb; b++) {
            __m512i wv[4];
            for (int j = 0; j < 4; j++) wv[j] = _mm512_xor_si512(_mm512_loadu_si512(wg + (int64_t)b * 256 + 64 * j), flip);
            for (int i = 0; i < MR; i++) {
                const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xm[i] + b * 32)));
                for (int j = 0; j < 4; j++) acc[i][j] = dot_add(acc[i][j], wv[j], xv);
            }
        }
        for (int i = 0; i < MR; i++) {
            const __m256i sums = reduce8((__m512i)acc[i][0], (__m512i)acc[i][1], (__m512i)acc[i][2], (__m512i)acc[i][3]);
            epilogue(m0 + i, cg, _mm256_sub_epi32(sums, _mm256_set1_epi32(offset(m0 + i))));
        }
    }

    // Column c's total in lane c, from aj: column 2j's 8 partial sums in lanes 0-7, column 2j + 1's
    // in lanes 8-15. Adjacent lanes added three times (fold: x's pairs in the low half, y's in the
    // high one), the columns' partials staying side by side.
    static inline __m256i reduce8(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        auto fold = [&](__m512i x, __m512i y) {
            return _mm512_add_epi32(_mm512_permutex2var_epi32(x, even, y), _mm512_permutex2var_epi32(x, odd, y));
        };
        const __m512i r = fold(fold(a0, a1), fold(a2, a3));
        return _mm512_castsi512_si256(fold(r, r));
    }
#endif

    void epilogue(int m, int cg, __m256i sums) const {
        const int cols = std::min(8, N - cg * 8);
        if (cols == 8) {  // (the same operations, stored 8 at a time)
            const __m256 scale = _mm256_loadu_ps(ws + cg * 8);
            return store8(at(y, dt, (int64_t)m * ldy + y0 + cg * 8), dt,
                          _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(_mm256_set1_ps(dx[m]), scale)));
        }
        alignas(32) float scale[8] = {};
        for (int l = 0; l < cols; l++) scale[l] = ws[cg * 8 + l];
        alignas(32) float out[8];
        _mm256_store_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(_mm256_set1_ps(dx[m]), _mm256_load_ps(scale))));
        for (int l = 0; l < cols; l++) store(y, dt, (int64_t)m * ldy + y0 + cg * 8 + l, out[l]);
    }

#if defined(__AMX_INT8__)
    // Group g's 8 columns into half h of a 16-column tile panel: quad q of block b (K values
    // 32b + 4q..+3 of the 8 columns) becomes panel row 8b + q. Each block's 8 x 8 quads are
    // transposed by two rounds of two-register permutes. A group that is not the thread's is zeros.
    void to_panel(int32_t *rows, int g, int h, bool live) const {
        const int nb = Kp / 32;
        if (!live) return amx_zero_half(rows, nb * 8, h);
        const __m512i lo = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
        const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(4));
        const __m512i even = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(8));
        for (int b = 0; b < nb; b++) {
            const int32_t *src = (const int32_t *)(w + ((int64_t)g * nb + b) * 256);  // columns 2i, 2i+1 in z[i]
            const __m512i z0 = _mm512_loadu_si512(src), z1 = _mm512_loadu_si512(src + 16);
            const __m512i z2 = _mm512_loadu_si512(src + 32), z3 = _mm512_loadu_si512(src + 48);
            // Quads 0-3 (p0, p2) and 4-7 (p1, p3) of columns 0-3 (p0, p1) and 4-7 (p2, p3), quad-major.
            const __m512i p0 = _mm512_permutex2var_epi32(z0, lo, z1), p1 = _mm512_permutex2var_epi32(z0, hi, z1);
            const __m512i p2 = _mm512_permutex2var_epi32(z2, lo, z3), p3 = _mm512_permutex2var_epi32(z2, hi, z3);
            const __m512i pairs[4] = {_mm512_permutex2var_epi32(p0, even, p2), _mm512_permutex2var_epi32(p0, odd, p2),
                                      _mm512_permutex2var_epi32(p1, even, p3), _mm512_permutex2var_epi32(p1, odd, p3)};
            for (int t = 0; t < 4; t++) {  // quads 2t and 2t + 1, all 8 columns each
                int32_t *row = rows + (b * 8 + 2 * t) * 16 + 8 * h;
                _mm256_storeu_si256((__m256i *)row, _mm512_castsi512_si256(pairs[t]));
                _mm256_storeu_si256((__m256i *)(row + 16), _mm512_extracti64x4_epi64(pairs[t], 1));
            }
        }
    }

    // 32 columns (groups cg..cg+3 of [cg, g1)) at a time: their weights rearranged once into two
    // 16-column tile panels (to_panel), then every 32 rows of x against them, 64 values of K per tile
    // multiply. The sums are the same exact integers as the VNNI tiles' (tdpbssd multiplies signed
    // bytes: no offset), the epilogue the same float operations. Reads up to 32 rows and 64 bytes
    // past x's last (reserve pads the scratch); their sums are dropped.
    void run_amx(int M, int g0, int g1) const {
        thread_local std::vector<int32_t> panels;
        const int nb = Kp / 32, chunks = (Kp + 63) / 64;
        const int64_t panel = (int64_t)chunks * 256;  // int32s
        if ((int64_t)panels.size() < 2 * panel) panels.resize(2 * panel);
        for (int r = nb * 8; r < chunks * 16; r++) {  // K's last 32 when Kp is not a multiple of 64: to_panel leaves them
            _mm512_storeu_si512(panels.data() + r * 16, _mm512_setzero_si512());
            _mm512_storeu_si512(panels.data() + panel + r * 16, _mm512_setzero_si512());
        }
        alignas(64) int32_t sums[4][256];
        alignas(64) float out[16];
        amx_configure(64);
        for (int cg = g0; cg < g1; cg += 4) {
            for (int q = 0; q < 4; q++) to_panel(panels.data() + (q / 2) * panel, cg + q, q % 2, cg + q < g1);
            const int8_t *left = (const int8_t *)panels.data(), *right = left + panel * 4;
            for (int m0 = 0; m0 < M; m0 += 32) {
                const int8_t *x0 = xq + (int64_t)m0 * Kp, *x1 = x0 + (int64_t)16 * Kp;
                amx_zero();
                for (int c = 0; c < chunks; c++) {
                    _tile_loadd(2, left + c * 1024, 64);
                    _tile_loadd(3, right + c * 1024, 64);
                    amx_multiply<false>(x0 + c * 64, x1 + c * 64, Kp);
                }
                amx_store(sums);
                // epilogue()'s float operations with each 16 columns' scales loaded once (calling it per 8
                // columns and row made a w8a8 prefill 0.66x)
                for (int t = 0; t < 4; t++) {
                    const int n0 = cg * 8 + 16 * (t % 2), cols = std::min({16, N - n0, g1 * 8 - n0});
                    if (cols <= 0) continue;
                    const __m512 scale = _mm512_maskz_loadu_ps((__mmask16)((1u << cols) - 1), ws + n0);
                    for (int i = 0, m = m0 + 16 * (t / 2); i < 16 && m < M; i++, m++) {
                        const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(sums[t] + i * 16));
                        _mm512_store_ps(out, _mm512_mul_ps(s, _mm512_mul_ps(_mm512_set1_ps(dx[m]), scale)));
                        for (int c = 0; c < cols; c++) store(y, dt, (int64_t)m * ldy + y0 + n0 + c, out[c]);
                    }
                }
            }
        }
        _tile_release();
    }
#endif

    // Column groups [g0, g1): one row streams every group once; many rows take 6 at a time (AVX-512:
    // tile8, 1.5-2.4x the two-column tiles on Zen 4, 2-128 rows, 0.5B shapes), 4 (AVX2).
    void run(int M, int g0, int g1) const {
#if defined(__AMX_INT8__)
        if (M >= AMX_INT8_ROWS && amx_ready()) return run_amx(M, g0, g1);
#endif
        if (M == 1) {
            for (int cg = g0; cg < g1; cg++) row8(0, cg);
            return;
        }
#if defined(__AVX512VNNI__)
        for (int c0 = 0, chunk = chunk_rows(M, Kp, 6); c0 < M; c0 += chunk) {
            const int c1 = std::min(c0 + chunk, M);
            for (int cg = g0; cg < g1; cg++) {
                int m = c0;
                for (; m + 6 <= c1; m += 6) tile8<6>(m, cg);
                if (m < c1) up_to_rows<5>(c1 - m, [&](auto rows) { tile8<rows>(m, cg); });
            }
        }
#else
        const int chunk = chunk_rows(M, Kp, 4);
        for (int c0 = 0; c0 < M; c0 += chunk) {
            const int c1 = std::min(c0 + chunk, M);
            for (int n = g0 * 8; n < std::min(N, g1 * 8); n += 2) {
                int m = c0;
                for (; m + 4 <= c1; m += 4) tile<4>(m, n, m == c0);
                for (; m + 2 <= c1; m += 2) tile<2>(m, n, m == c0);
                for (; m < c1; m++) tile<1>(m, n, m == c0);
            }
        }
#endif
    }
};

// ---- fp32 / bf16 / f16 -----------------------------------------------------------------------
//
// Repacked at load (pack_dense) into panels of 16 output columns, N padded with zero columns:
// fp32 and f16 weights [N / 16][K][16], one value of K for the panel's 16 columns in one run; bf16
// [N / 16][K' / 2][16][2] (K' = K rounded up to even, the pad a zero), each 32-bit lane one column's
// pair of consecutive values of K, so one shift (the even value) or one mask (the odd one) widens 16
// (AVX2: 8) of them to fp32 without the shuffle port. Activations are fp32 (others widened once per
// call). A tile broadcasts each of its rows' activations against its panels' values: output (m, n) is
// one fp32 sum over k = 0, 1, ..., K - 1 in that order (fused multiply-adds), whatever the tile, and
// the same on the AVX2 and AVX-512 paths; no horizontal sums. The dot-product tiles these replaced (rows of w against rows of
// x, 16 partial sums and a reduction per output) multiplied many rows at about half this rate
// (benchmarks/RESULTS.md, 2026-11-26), though their pairwise sums carried 3-7x less rounding error
// (fp32, K = 256-4864; still ~1e-6 of the result).

#if defined(__AVX512F__)
// 16 fp32 lanes: one register per panel row.
struct PanelVec {
    using V = __m512;
    static constexpr int L = 16;
    static V zero() { return _mm512_setzero_ps(); }
    static V set1(float v) { return _mm512_set1_ps(v); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static V f32(const float *p) { return _mm512_loadu_ps(p); }
    static V f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
    // L pairs of bf16 at p: their first values, or their second ones, as fp32.
    static V even(const uint16_t *p) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16)); }
    static V odd(const uint16_t *p) {
        return _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32((int)0xFFFF0000u)));
    }
    static void store(void *y, int dt, V v) { store16(y, dt, v); }
};
#else
// 8 fp32 lanes: two registers per panel row.
struct PanelVec {
    using V = __m256;
    static constexpr int L = 8;
    static V zero() { return _mm256_setzero_ps(); }
    static V set1(float v) { return _mm256_set1_ps(v); }
    static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static V f32(const float *p) { return _mm256_loadu_ps(p); }
    static V f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
    static V even(const uint16_t *p) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)p), 16)); }
    static V odd(const uint16_t *p) {
        return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), _mm256_set1_epi32((int)0xFFFF0000u)));
    }
    static void store(void *y, int dt, V v) { store8(y, dt, v); }
};
#endif

// A tile's sums acc [MR][NP panels x the registers of a panel row] into rows m0.. of y [M, ldy] (dtype
// dt; the matrix's N columns from column y0), panels p0..: a last panel's valid columns (N - 16 p of
// them) stored one by one.
template <int MR, int NP, class V, int C>
inline void store_panels(void *y, int dt, int N, int ldy, int y0, int m0, int p0, const V (&acc)[MR][C]) {
    constexpr int VP = C / NP, L = 16 / VP;
    for (int j = 0; j < NP; j++) {
        const int n0 = (p0 + j) * 16, valid = std::min(16, N - n0);
        for (int i = 0; i < MR; i++) {
            char *row = at(y, dt, (int64_t)(m0 + i) * ldy + y0 + n0);
            if (valid == 16) {
                for (int v = 0; v < VP; v++) PanelVec::store(at(row, dt, v * L), dt, acc[i][j * VP + v]);
            } else {
                alignas(64) float out[16];
                for (int v = 0; v < VP; v++) memcpy(out + v * L, &acc[i][j * VP + v], sizeof(V));
                for (int c = 0; c < valid; c++) store(row, dt, c, out[c]);
            }
        }
    }
}

struct Dense {
    using PV = PanelVec;
    using V = PV::V;
    static constexpr int VP = 16 / PV::L;  // registers per panel row

    const float *x;  // [M, K] fp32 activations (others widened into a copy)
    const void *w;   // the panels (above), dtype wdt
    void *y;         // [M, ldy], this matrix's N columns from column y0
    int dt, wdt, N, K, ldy, y0;
    bool prefetch;   // whether a row chunk's first tile prefetches the weights (see PREFETCH_ONE_ROW)
    int chunk = ROW_CHUNK;  // rows per chunk: its first tile streams the weights, the others find them in cache

    int64_t row_bytes() const { return (int64_t)K * 4; }  // one row of x

    // Values in one panel: 16 per value of K (K rounded up to even for bf16's pairs).
    int64_t panel_values() const { return (int64_t)16 * (wdt == BF16 ? (K + 1) / 2 * 2 : K); }

    // Rows m0 .. m0 + MR - 1 against panels p0 .. p0 + NP - 1.
    template <int MR, int NP>
    void tile(int m0, int p0) const {
        const bool streams = prefetch && m0 % chunk == 0;
        if (wdt == BF16) return streams ? tile_of<MR, NP, BF16, true>(m0, p0) : tile_of<MR, NP, BF16, false>(m0, p0);
        if (wdt == F16) return streams ? tile_of<MR, NP, F16, true>(m0, p0) : tile_of<MR, NP, F16, false>(m0, p0);
        return streams ? tile_of<MR, NP, F32, true>(m0, p0) : tile_of<MR, NP, F32, false>(m0, p0);
    }

    // Prefetch PREFETCH_ROWS bytes ahead of each panel's stream at K index k (bf16: the pair from k),
    // once per 64-byte line (f16: every other k).
    template <int NP, int WDT>
    static inline __attribute__((always_inline)) void prefetch_at(const char *const *wp, int k) {
        constexpr int ES = WDT == F32 ? 4 : 2;
        if (WDT == F16 && k % 2) return;
        for (int j = 0; j < NP; j++) _mm_prefetch(wp[j] + (int64_t)k * 16 * ES + PREFETCH_ROWS, _MM_HINT_T0);
    }

    // fp32 activations against fp32, f16 or bf16 panels: fp32 FMAs, the weights widened in registers.
    // Compiled on its own: inlined into the row loops, AVX2's 6 x 1 fp32 tile spilled accumulators to
    // the stack (0.45x, Zen 4).
    template <int MR, int NP, int WDT, bool PF>
    __attribute__((noinline)) void tile_of(int m0, int p0) const {
        constexpr int ES = WDT == F32 ? 4 : 2;
        const char *wp[NP];
        for (int j = 0; j < NP; j++) wp[j] = (const char *)w + (p0 + j) * panel_values() * ES;
        const float *xm[MR];
        for (int i = 0; i < MR; i++) xm[i] = x + (int64_t)(m0 + i) * K;
        V acc[MR][NP * VP];
        for (int i = 0; i < MR; i++)
            for (int c = 0; c < NP * VP; c++) acc[i][c] = PV::zero();
        auto step = [&](int k, auto widen) __attribute__((always_inline)) {
            V wv[NP * VP];
            for (int j = 0; j < NP; j++)
                for (int v = 0; v < VP; v++) wv[j * VP + v] = widen(wp[j], v);
            for (int i = 0; i < MR; i++) {
                const V xv = PV::set1(xm[i][k]);
                for (int c = 0; c < NP * VP; c++) acc[i][c] = PV::fma(wv[c], xv, acc[i][c]);
            }
        };
        if constexpr (WDT == BF16) {
            int k = 0;
            for (; k + 1 < K; k += 2) {
                if (PF) prefetch_at<NP, WDT>(wp, k);
                const int64_t off = (int64_t)k * 16;  // the pair's first half-word
                step(k, [&](const char *p, int v) { return PV::even((const uint16_t *)p + off + 2 * PV::L * v); });
                step(k + 1, [&](const char *p, int v) { return PV::odd((const uint16_t *)p + off + 2 * PV::L * v); });
            }
            if (k < K) step(k, [&](const char *p, int v) { return PV::even((const uint16_t *)p + (int64_t)k * 16 + 2 * PV::L * v); });
        } else {
            for (int k = 0; k < K; k++) {
                if (PF) prefetch_at<NP, WDT>(wp, k);
                const int64_t off = (int64_t)k * 16;
                if constexpr (WDT == F32)
                    step(k, [&](const char *p, int v) { return PV::f32((const float *)p + off + PV::L * v); });
                else
                    step(k, [&](const char *p, int v) { return PV::f16((const uint16_t *)p + off + PV::L * v); });
            }
        }
        store_panels<MR, NP>(y, dt, N, ldy, y0, m0, p0, acc);
    }
};

// kernel.tile<mr, NP> for mr <= MR rows.
template <int MR, int NP, class Kernel>
inline void tile_rows(const Kernel &k, int m, int mr, int p) {
    up_to_rows<MR>(mr, [&](auto rows) { k.template tile<rows, NP>(m, p); });
}

// One row against panels [p0, p1): NP panels at a time (NP independent sums per lane), fewer at the end.
template <int NP, class Kernel>
inline void one_row(const Kernel &k, int p0, int p1) {
    int p = p0;
    for (; p + NP <= p1; p += NP) k.template tile<1, NP>(0, p);
    if constexpr (NP > 1) {
        if (p < p1) one_row<NP - 1>(k, p, p1);
    }
}

// Rows in chunks sized for MR-row tiles (chunk_rows: a chunk's first tile streams the weights, its
// other tiles find them in cache) against panels [p0, p1), NP at a time, MR rows a tile.
template <int MR, int NP, class Kernel>
inline void many_rows(const Kernel &k, int M, int p0, int p1) {
    Kernel chunked = k;
    chunked.chunk = chunk_rows(M, k.row_bytes(), MR);
    for (int c0 = 0; c0 < M; c0 += chunked.chunk) {
        const int c1 = std::min(c0 + chunked.chunk, M);
        int p = p0;
        for (; p + NP <= p1; p += NP)
            for (int m = c0; m < c1; m += MR) tile_rows<MR, NP>(chunked, m, std::min(MR, c1 - m), p);
        for (; p < p1; p++)
            for (int m = c0; m < c1; m += MR) tile_rows<MR, 1>(chunked, m, std::min(MR, c1 - m), p);
    }
}

// Tile sizes (benchmarks/RESULTS.md, 2026-11-26): one row takes 4 panels at a time (AVX-512: 4 sums
// in flight a lane; AVX2: 8 registers): the embedded pair's plain decoding 1.07x the row-major tiles,
// a bf16 Qwen2.5-0.5B shape even with them, where 6 and 8 panels (more streams) were 0.98x and 0.96x.
// It prefetches as the row-major tiles did (PREFETCH_ONE_ROW); more rows always do. 2-4 rows take 4
// panels (AVX2: 2-3 rows 2 panels); more rows 12 x 2 panels in AVX-512's 32 registers (8 x 2 and 6 x 4
// slower in a C harness), AVX2's 6 x 1 in its 16. There a tile's accumulators, its weights and a
// broadcast must fit the 16 registers or the compiler spills accumulators to the stack, each spill a
// store and a reload in an FMA chain: f16 and bf16 weights take registers to widen (bf16 one more for
// its mask), so 3 rows take one panel (2 x 16 accumulators spilled) and bf16's many rows go 5 at a time
// (Zen 4's AVX2 code, 2 threads: bf16 3 rows 1.6x, 9-128 rows 1.15-1.25x; f16 3 rows 1.6x).
inline void run_panels(const Dense &k, int M, int p0, int p1) {
    if (M == 1) return one_row<4>(k, p0, p1);
#if defined(__AVX512F__)
    if (M <= 4) return many_rows<4, 4>(k, M, p0, p1);
    many_rows<12, 2>(k, M, p0, p1);
#else
    if (M <= 3) return M == 3 && k.wdt != F32 ? many_rows<3, 1>(k, M, p0, p1) : many_rows<3, 2>(k, M, p0, p1);
    if (k.wdt == BF16) return many_rows<5, 1>(k, M, p0, p1);
    many_rows<6, 1>(k, M, p0, p1);
#endif
}

#if defined(__AMX_BF16__) || (defined(__AVX512BF16__) && defined(SPECLITE_ZEN4))
// Rows [0, M) of x rounded to bf16 (nearest even, as torch's float -> bf16) into the calling thread's
// buffer, 16-row tiles whole: each thread of a team rounds them all (a few rows cost less than
// waiting for each other at a barrier).
inline const uint16_t *bf16_rows(const void *x, int dt, int M, int K) {
    static thread_local std::vector<uint16_t> rows;
    const size_t n = (size_t)M * K;
    if (rows.size() < ((size_t)M + 15) / 16 * 16 * K) rows.resize(((size_t)M + 15) / 16 * 16 * K);
    if (dt == BF16) return (const uint16_t *)memcpy(rows.data(), x, n * 2);
    size_t j = 0;
    if (dt == F32)
        for (; j + 16 <= n; j += 16) PanelVec::store(rows.data() + j, BF16, _mm512_loadu_ps((const float *)x + j));
    for (; j < n; j++) store(rows.data(), BF16, j, to_float(x, dt, j));
    return rows.data();
}

#endif

#if defined(__AVX512BF16__) && defined(SPECLITE_ZEN4)
// ---- vdpbf16ps tiles for bf16 weights on Zen 4 and later ------------------------------------------
//
// Zen 4 has no AMX, but it issues vdpbf16ps (a pair of bf16 products a lane) at the rate of its
// 512-bit FMAs: twice the products a cycle (117 against 59 GMAC/s a core, measured). So there, K even,
// any number of rows, bf16 weights take it for bf16 activations (exact products, as the FMAs' of the
// widened values, summed a pair at a time into fp32: each (m, n) one sequence whatever M, so a row
// alone still equals that row in a batch) and for a drafter's fp32 activations rounded to bf16 once
// per call (bf16_rows; loose, see the AMX tiles below). A register holds a panel's pairs of K values
// as the panels store them, the pair of a row's activations broadcast. 2 threads: Qwen2.5-0.5B's
// bf16 products of 5-128 rows 1.8-2.1x the FMAs, one row 1.03-1.14x; the embedded pair's drafter
// shapes 1.2-1.5x at 2-12 rows (benchmarks/RESULTS.md, 2026-11-26 15:03- UTC). cpu_build compiles it
// in where the CPU has AVX-512 BF16; Intel's cores run vdpbf16ps at half their FMAs' rate (5-128 rows
// 1.3-1.7x slower than the FMAs on the AMX Xeon, see matmul_team), so Intel's avx512 path keeps the FMAs.
#define SPECLITE_DOT_BF16 1

struct DotBf16 {
    const uint32_t *x;  // [M, K / 2] pairs of bf16 activations (bf16_rows)
    const void *w;      // the bf16 panels (Dense), K even
    void *y;            // [M, ldy], this matrix's N columns from column y0
    int dt, N, K, ldy, y0;
    int chunk = ROW_CHUNK;

    int64_t row_bytes() const { return (int64_t)K * 2; }

    template <int MR, int NP>
    __attribute__((noinline)) void tile(int m0, int p0) const {
        const int pairs = K / 2;
        const __m512i *wp[NP];
        for (int j = 0; j < NP; j++) wp[j] = (const __m512i *)((const uint16_t *)w + (int64_t)(p0 + j) * 16 * K);
        const uint32_t *xm[MR];
        for (int i = 0; i < MR; i++) xm[i] = x + (int64_t)(m0 + i) * pairs;
        __m512 acc[MR][NP];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NP; j++) acc[i][j] = _mm512_setzero_ps();
        for (int kp = 0; kp < pairs; kp++) {
            __m512bh wv[NP];
            for (int j = 0; j < NP; j++) wv[j] = (__m512bh)_mm512_loadu_si512(wp[j] + kp);
            for (int i = 0; i < MR; i++) {
                const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xm[i][kp]);
                for (int j = 0; j < NP; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[j], xv);
            }
        }
        store_panels<MR, NP>(y, dt, N, ldy, y0, m0, p0, acc);
    }
};

// As run_panels: one row 8 panels at a time (vdpbf16ps's latency needs 6 sums in flight), 2-4 rows
// 4 panels, more rows 12 x 2 panels.
inline void run_dot(const DotBf16 &k, int M, int p0, int p1) {
    if (M == 1) return one_row<8>(k, p0, p1);
    if (M <= 4) return many_rows<4, 4>(k, M, p0, p1);
    many_rows<12, 2>(k, M, p0, p1);
}
#endif

#if defined(__AMX_BF16__)
// ---- bf16 tiles for drafters (Matrices::loose) ---------------------------------------------------
//
// A drafter's products need not give a row the numbers it gets alone (its tokens are proposals; the
// target's pass decides what is decoded, and its products stay exact). So where a drafter's matrix
// is bf16 and K a multiple of 32, its products take the AMX bf16 tiles: the activations rounded to
// bf16 once per call (nearest even), a panel's pairs (K / 2 x 16 x 2, the tiles' own order) 32 values
// of K at a time, fp32 sums. The fp32 FMAs are compute-bound from a few rows on: the embedded pair's
// draft head (4096 x 128) 40 -> 13 us at 10 rows, 16 -> 10 us at one (2 threads, AMX Xeon). A matrix
// larger than AMX_BF16_CACHED streams from memory, where the FMAs' prefetched one-row products were
// 5-7% faster below AMX_BF16_ROWS rows (4864 x 896; benchmarks/RESULTS.md, 2026-11-26 09:50- UTC).
constexpr int AMX_BF16_ROWS = 4;
constexpr int64_t AMX_BF16_CACHED = 2 << 20;

// y[:, panels p0..p1) of one matrix for rows [0, M) of xb (bf16_rows): 16 rows at
// a time in tmm0 (fewer rows, fewer rows multiplied), two panels in tmm2-3, their sums in tmm4-5.
inline void amx_bf16(const uint16_t *xb, int M, int K, const void *w, void *y, int dt, int N, int ldy, int y0, int p0, int p1) {
    struct alignas(64) {
        uint8_t palette = 1, start_row = 0, reserved[14] = {};
        uint16_t colsb[16] = {};
        uint8_t rows[16] = {};
    } config;
    for (int t : {0, 2, 3, 4, 5}) config.colsb[t] = 64, config.rows[t] = t == 2 || t == 3 ? 16 : std::min(M, 16);
    _tile_loadconfig(&config);
    const int64_t panel = (int64_t)K * 32;  // bytes: K / 2 pairs x 16 columns x 2 values x 2 bytes
    alignas(64) float sums[2][256];
    for (int p = p0; p < p1; p += 2) {
        const bool two = p + 1 < p1;
        const char *w0 = (const char *)w + p * panel, *w1 = w0 + panel;
        for (int m0 = 0; m0 < M; m0 += 16) {
            _tile_zero(4);
            _tile_zero(5);
            for (int c = 0; c < K / 32; c++) {
                _tile_loadd(0, xb + (int64_t)m0 * K + c * 32, K * 2);
                _tile_loadd(2, w0 + c * 1024, 64);
                _tile_dpbf16ps(4, 0, 2);
                if (two) {
                    _tile_loadd(3, w1 + c * 1024, 64);
                    _tile_dpbf16ps(5, 0, 3);
                }
            }
            _tile_stored(4, sums[0], 64);
            _tile_stored(5, sums[1], 64);
            for (int j = 0; j < 1 + two; j++) {
                const int n0 = (p + j) * 16, valid = std::min(16, N - n0);
                for (int i = 0; i < 16 && m0 + i < M; i++) {
                    char *row = at(y, dt, (int64_t)(m0 + i) * ldy + y0 + n0);
                    if (valid == 16) PanelVec::store(row, dt, _mm512_load_ps(sums[j] + i * 16));
                    else for (int c = 0; c < valid; c++) store(row, dt, c, sums[j][i * 16 + c]);
                }
            }
        }
    }
    _tile_release();
}
#endif

// ---- one product for a thread team --------------------------------------------------------------

enum Kind { DENSE = 0, INT4 = 1, INT8 = 2 };

// One or more matrices of one format and one input, multiplied side by side: a layer's q, k and v
// projections, or its gate and up. Mirrored by cpu_gemm.Matrices.
struct Matrices {
    int kind, parts;
    const void *const *w;       // per part: as pack_dense (dtype wdt), pack_int4 or pack_int8 leave it
    const void *const *scales;  // int4: fp16 [N / 8, G, 8]; int8: fp32 [N]
    const void *const *zeros;   // int4: uint8 [N / 8, G, 8]
    const int *ns;              // per part: output columns
    int n, k, wdt, group;       // n: sum of ns; wdt: dense weights' dtype; group: int4's
    const float *bias;          // [n] (zeros for a part without), or null
    int loose;                  // a drafter's: rows may differ from their numbers alone (AMX bf16 tiles, DotBf16)
};

// y[m, c] = round(y[m, c] + bias[c]) for columns [c0, c1): as torch adds a bias of y's dtype to the
// rounded product (the bias arrives widened to fp32, exactly).
inline void add_bias(void *y, int dt, const float *bias, int M, int ldy, int c0, int c1) {
    for (int m = 0; m < M; m++)
        for (int c = c0; c < c1; c++) store(y, dt, (int64_t)m * ldy + c, to_float(y, dt, (int64_t)m * ldy + c) + bias[c]);
}

// Grows the scratch to what matmul_team needs for these matrices and M rows (before the team forks:
// resizing inside it would cost a barrier per product).
inline void reserve(Scratch &sc, const Matrices &mt, int M) {
    const size_t nb = (mt.k + 31) / 32, G = mt.kind == INT4 ? (mt.k + mt.group - 1) / mt.group : 0;
    auto grow = [](auto &v, size_t n) { if (v.size() < n) v.resize(n); };
    grow(sc.q, ((size_t)M + 31) / 32 * 32 * nb * 32 + 64);  // the AMX tiles read whole 32-row steps of 64 bytes
    grow(sc.a, (size_t)M * (mt.kind == DENSE ? mt.k : nb));
    grow(sc.b, (size_t)M * G);
    grow(sc.s, (size_t)M * nb);
}

// For the packed formats (WIDTH columns per group: int4 and int8 8, the dense panels 16): run(p, y0,
// a, b) on the groups [a, b) of part p (its output columns from y0) within thread t's share of all the
// parts' groups, then the bias.
template <int WIDTH, class Run>
inline void in_groups(const Matrices &mt, void *y, int dt, int M, int T, int t, Run run) {
    int groups = 0;
    for (int p = 0; p < mt.parts; p++) groups += (mt.ns[p] + WIDTH - 1) / WIDTH;
    int g0, g1;
    split(groups, 1, T, t, g0, g1);
    for (int p = 0, first = 0, y0 = 0; p < mt.parts; first += (mt.ns[p] + WIDTH - 1) / WIDTH, y0 += mt.ns[p++]) {
        const int a = std::max(g0, first) - first, b = std::min(g1, first + (mt.ns[p] + WIDTH - 1) / WIDTH) - first;
        if (a >= b) continue;
        run(p, y0, a, b);
        if (mt.bias) add_bias(y, dt, mt.bias, M, mt.n, y0 + a * WIDTH, y0 + std::min(b * WIDTH, mt.ns[p]));
    }
}

// y [M, n] = x [M, k] @ [W_0; W_1; ...]^T (+ bias), run by every thread of the current team (a
// single thread outside one). `sc` is one scratch shared by the team, reserved for these matrices
// and M. Ends in the team's barrier: y is whole.
inline void matmul_team(const Matrices &mt, const void *x, int dt, int M, void *y, Scratch &sc) {
    const int K = mt.k, T = team::size(), t = team::id();
    const auto [m0, m1] = team::share(M);
    if (mt.kind == INT4) {
        const int nb = (K + 31) / 32, Kp = nb * 32, G = (K + mt.group - 1) / mt.group, bpg = mt.group / 32;
        for (int m = m0; m < m1; m++) {
            float *d = sc.a.data() + (int64_t)m * nb;
            int32_t *sums = sc.s.data() + (int64_t)m * nb;
            quantize_row(x, dt, m, K, Kp, 32, sc.q.data() + (int64_t)m * Kp, d, sums);
            for (int g = 0; g < G; g++) {
                float s = 0.f;
                for (int b = g * bpg; b < std::min(nb, (g + 1) * bpg); b++) s += d[b] * (float)sums[b];
                sc.b[(int64_t)m * G + g] = s;
            }
        }
        sc.barrier.wait(T);
        in_groups<8>(mt, y, dt, M, T, t, [&](int p, int y0, int a, int b) {
            const Int4 k4{sc.q.data(), sc.a.data(), sc.b.data(), (const uint8_t *)mt.w[p], (const uint16_t *)mt.scales[p],
                          (const uint8_t *)mt.zeros[p], y, dt, mt.ns[p], Kp, nb, G, bpg, mt.n, y0};
            k4.run(M, a, b);
        });
    } else if (mt.kind == INT8) {
        const int Kp = (K + 31) / 32 * 32;
        for (int m = m0; m < m1; m++) quantize_row(x, dt, m, K, Kp, Kp, sc.q.data() + (int64_t)m * Kp, &sc.a[m], &sc.s[m]);
        sc.barrier.wait(T);
        in_groups<8>(mt, y, dt, M, T, t, [&](int p, int y0, int a, int b) {
            const Int8 k8{sc.q.data(), sc.a.data(), sc.s.data(), (const int8_t *)mt.w[p], (const float *)mt.scales[p], y, dt,
                          mt.ns[p], Kp, mt.n, y0};
            k8.run(M, a, b);
        });
    } else {
        // fp32 activations are read in place; others are widened once (exact), and the team waits for
        // it. bf16 ones meeting bf16 weights in vdpbf16ps instead (a pair of products a lane) ran 5-128 row
        // products 1.3-1.7x slower than this on the AMX Xeon (benchmarks/RESULTS.md, 2026-11-26), and
        // 1.8-2.1x faster on Zen 4 (DotBf16).
#if defined(__AMX_BF16__)
        if (mt.loose && mt.wdt == BF16 && K % 32 == 0 && (M >= AMX_BF16_ROWS || (int64_t)mt.n * K * 2 <= AMX_BF16_CACHED) && amx_ready()) {
            const uint16_t *xb = bf16_rows(x, dt, M, K);
            in_groups<16>(mt, y, dt, M, T, t, [&](int p, int y0, int a, int b) {
                amx_bf16(xb, M, K, mt.w[p], y, dt, mt.ns[p], mt.n, y0, a, b);
            });
            sc.barrier.wait(T);
            return;
        }
#endif
#if defined(SPECLITE_DOT_BF16)
        if (mt.wdt == BF16 && K % 2 == 0 && (mt.loose || dt == BF16)) {
            const uint32_t *xb = (const uint32_t *)(dt == BF16 ? x : bf16_rows(x, dt, M, K));
            in_groups<16>(mt, y, dt, M, T, t, [&](int p, int y0, int a, int b) {
                run_dot(DotBf16{xb, mt.w[p], y, dt, mt.ns[p], K, mt.n, y0}, M, a, b);
            });
            sc.barrier.wait(T);
            return;
        }
#endif
        const float *xf = (const float *)x;
        if (dt != F32) {
            for (int m = m0; m < m1; m++) widen(x, dt, (int64_t)m * K, K, sc.a.data() + (int64_t)m * K);
            sc.barrier.wait(T);
            xf = sc.a.data();
        }
        in_groups<16>(mt, y, dt, M, T, t, [&](int p, int y0, int a, int b) {
            run_panels(Dense{xf, mt.w[p], y, dt, mt.wdt, mt.ns[p], K, mt.n, y0, M > 1 || PREFETCH_ONE_ROW}, M, a, b);
        });
    }
    sc.barrier.wait(T);
}

}  // namespace
