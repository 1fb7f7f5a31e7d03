// The decoder's layer work (layer_ops_avx2.h) as C entry points: RMSNorm, SwiGLU and attention one
// call each, and a whole decoder layer (norms, the four products of gemm_avx2.h, attention,
// residuals) in one call and one thread team, so a decode step forks once per layer, not ten times.
#include "gemm_avx2.h"
#include "layer_ops_avx2.h"

namespace {

// One decoder block's weights (Llama-family: pre-norm attention, then a pre-norm SwiGLU MLP).
// Mirrored by cpu_layer_ops.Layer.
struct Layer {
    const Matrices *qkv, *o, *gate_up, *down;  // q/k/v side by side, o, gate/up side by side, down
    const void *norm1, *norm2;                 // [H] in the activations' dtype
    float eps;
    int heads, kv_heads, head_dim;
};

thread_local std::vector<char> layer_buffers;  // the caller's: the team shares it

}  // namespace

extern "C" {

void speclite_rms_norm(const void *x, const void *weight, void *y, int dt, int M, int H, float eps) {
    for (int m = 0; m < M; m++) rms_norm_row(x, weight, y, dt, m, H, eps);
}

void speclite_swiglu(const void *gate_up, void *y, int dt, int M, int I) { swiglu_team(gate_up, y, dt, M, I); }

void speclite_attention(const void *qkv, const void *cos, const void *sin, void *cache_k, void *cache_v, void *out,
                        const uint8_t *mask, int dt, int t, int H, int Hkv, int d, int max_len, int start, int L,
                        float scale, int threads) {
    // A fork costs more than a short decode step's attention: one thread unless there is real work.
    const int64_t work = (int64_t)t * H * L * d;
#pragma omp parallel num_threads(work > (1 << 18) ? threads : 1)
    attention_team(qkv, cos, sin, cache_k, cache_v, out, mask, dt, t, H, Hkv, d, max_len, start, L, scale);
}

// out [M, H] = the decoder layer on x [M, H]: h = x + o(attention(qkv(norm1(x)))), out = h +
// down(swiglu(gate_up(norm2(h)))), each product and sum rounded to the dtype as the torch modules
// round them, so the result equals the module-by-module path bit for bit. Attention as
// speclite_attention (cache write at start.., keys 0..L-1, mask or causal).
void speclite_decoder_layer(const Layer *ly, const void *x, void *out, int dt, int M, const void *cos, const void *sin,
                            void *cache_k, void *cache_v, const uint8_t *mask, int max_len, int start, int L,
                            float scale, int threads) {
    const int H = ly->qkv->k, A = ly->heads * ly->head_dim, W = ly->qkv->n, G = ly->gate_up->n, I = G / 2;
    const int64_t es = dt == F32 ? 4 : 2;
    std::vector<char> &buf = layer_buffers;
    buf.resize(es * M * ((int64_t)H + W + A + H + G + I + H));
    char *normed = buf.data(), *qkv = normed + es * M * H, *att = qkv + es * M * W, *o = att + es * M * A;
    char *gu = o + es * M * H, *act = gu + es * M * G, *down = act + es * M * I;
    Scratch &sc = scratch;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) rms_norm_row(x, ly->norm1, normed, dt, m, H, ly->eps);
        matmul_team(*ly->qkv, normed, dt, M, qkv, sc);
        attention_team(qkv, cos, sin, cache_k, cache_v, att, mask, dt, M, ly->heads, ly->kv_heads, ly->head_dim,
                       max_len, start, L, scale);
        matmul_team(*ly->o, att, dt, M, o, sc);
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
            for (int64_t i = (int64_t)m * H; i < (int64_t)(m + 1) * H; i++) store(out, dt, i, to_float(x, dt, i) + to_float(o, dt, i));
            rms_norm_row(out, ly->norm2, normed, dt, m, H, ly->eps);
        }
        matmul_team(*ly->gate_up, normed, dt, M, gu, sc);
        swiglu_team(gu, act, dt, M, I);
        matmul_team(*ly->down, act, dt, M, down, sc);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < (int64_t)M * H; i++) store(out, dt, i, to_float(out, dt, i) + to_float(down, dt, i));
    }
}

}  // extern "C"
