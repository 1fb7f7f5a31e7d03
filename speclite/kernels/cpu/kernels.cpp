// speclite's CPU kernels as C entry points, one library (so one thread team, team.h, serves them
// all): gemm.h's matrix products; the decoder's layer work (layer_ops.h): RMSNorm, SwiGLU and
// attention one call each, and whole decoder layers (norms, the four products, attention, residuals)
// in one call and one team, so a decode step starts the team once, not ten times a layer.
#include "gemm.h"
#include "layer_ops.h"
#include "sampling.h"

namespace {

// One decoder block's weights (Llama-family: pre-norm attention, then a pre-norm SwiGLU MLP).
// A drafting head's layer reads two inputs, a state x and an embedding e:
//   EAGLE-3 (hnorm set, no in_proj): q/k/v read [norm1(e), hnorm(x)] (2H wide), and the attention
//     adds to x, or to hnorm(x) (residual_normed);
//   MTP (in_proj set): the block's input is in_proj([enorm(e), hnorm(x)]) ([hnorm(x), enorm(e)]
//     with state_first), an ordinary block follows.
// Mirrored by cpu_layer_ops.Layer.
struct Layer {
    const Matrices *qkv, *o, *gate_up, *down;  // q/k/v side by side, o, gate/up side by side, down
    const void *norm1, *norm2;                 // [H] in the activations' dtype
    const void *const *qk_norm;                // Qwen3's q and k norms ([head_dim] each), or null
    const void *hnorm;                         // the state's norm [H] of a drafting head, or null
    int residual_normed;                       // EAGLE-3: the attention adds to hnorm(x)
    const Matrices *in_proj;                   // MTP's eh_proj (2H -> H), or null
    const void *enorm;                         // MTP's embedding norm [H]
    int state_first;                           // MTP (MiMo): [state, embedding]
    float eps;
    int heads, kv_heads, head_dim;
};

// The final RMSNorm and the output head (lm_head), run after the last layer in the same team.
// Mirrored by cpu_layer_ops.Head.
struct Head {
    const Matrices *mats;
    const void *norm;  // [H] in the activations' dtype
    float eps;
};

// One forward's shape and attention span, the same for every layer.
struct Step {
    int dt, M;
    const void *cos, *sin;
    const uint8_t *mask;
    int max_len, start, L;
    float scale;
};

// A layer's intermediate tensors (the activations' dtype): normed input (K wide: H, or 2H for an
// EAGLE-3 layer), q/k/v, attention, o, gate/up, swiglu, down; an MTP layer's [2H] concatenation
// and its projection.
struct Buffers {
    std::vector<char> data;
    int64_t H = 0, K = 0, W = 0, A = 0, G = 0;

    // Also grows the team's matmul scratch for the layer's products.
    void reserve(const Layer &ly, int M, int dt, Scratch &sc) {
        H = ly.o->n, K = ly.qkv->k, W = ly.qkv->n, A = (int64_t)ly.heads * ly.head_dim, G = ly.gate_up->n;
        const size_t need = (size_t)(dt == F32 ? 4 : 2) * M * (K + 2 * H + W + A + G + G / 2 + (ly.in_proj ? 3 * H : 0));
        if (data.size() < need) data.resize(need);
        for (const Matrices *mt : {ly.qkv, ly.o, ly.gate_up, ly.down, ly.in_proj})
            if (mt) ::reserve(sc, *mt, M);
    }
};

// The first of the largest of logits[0..n) (dtype dt), a NaN counting as the largest, as torch.argmax.
// Eight at a time: the largest value (and whether any is NaN), in four independent maxima (a max is
// exact in any order; one chain of them waited on its own latency), then the first place that holds
// it (a speculative iteration's k + 1 rows of a 150k vocabulary, one thread's work between two passes).
inline int argmax(const void *logits, int dt, int n) {
    const int n32 = n & ~31, n8 = n & ~7;
    __m256 top8[4], nan8[4];
    for (int j = 0; j < 4; j++) top8[j] = _mm256_set1_ps(-INFINITY), nan8[j] = _mm256_setzero_ps();
    for (int v = 0; v < n32; v += 32)
        for (int j = 0; j < 4; j++) {
            const __m256 x = load8(logits, dt, v + 8 * j);
            top8[j] = _mm256_max_ps(top8[j], x);
            nan8[j] = _mm256_or_ps(nan8[j], _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        }
    for (int v = n32; v < n8; v += 8) {
        const __m256 x = load8(logits, dt, v);
        top8[0] = _mm256_max_ps(top8[0], x);
        nan8[0] = _mm256_or_ps(nan8[0], _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    float top = hmax(_mm256_max_ps(_mm256_max_ps(top8[0], top8[1]), _mm256_max_ps(top8[2], top8[3])));
    bool nan = _mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(nan8[0], nan8[1]), _mm256_or_ps(nan8[2], nan8[3]))) != 0;
    for (int v = n8; v < n; v++) {
        const float f = to_float(logits, dt, v);
        nan |= std::isnan(f);
        top = std::max(top, f);
    }
    const __m256 want = _mm256_set1_ps(top);
    for (int v = 0; v < n8; v += 8) {
        const __m256 x = load8(logits, dt, v);
        const int hit = _mm256_movemask_ps(nan ? _mm256_cmp_ps(x, x, _CMP_UNORD_Q) : _mm256_cmp_ps(x, want, _CMP_EQ_OQ));
        if (hit) return v + __builtin_ctz(hit);
    }
    for (int v = n8; v < n; v++) {
        const float f = to_float(logits, dt, v);
        if (nan ? std::isnan(f) : f == top) return v;
    }
    return 0;
}

thread_local Buffers layer_buffers;         // the caller's: the team shares them
thread_local std::vector<char> layer_states;

// A row's next token: the argmax of its first `vocab` logits, or where `warp` is set the draw with
// the uniform u from their warp (sampling.h): the numbers of speclite.sampling.pick on the CPU.
struct Pick {
    const Warp *warp;
    WarpScratch s;
    std::vector<float> probs;
    int operator()(const void *logits, int dt, int vocab, float u) {
        if (!warp) return argmax(logits, dt, vocab);
        probs.resize(vocab);
        return sample_row(logits, dt, vocab, *warp, probs.data(), s, u);
    }
};

// One layer, run by every thread of a team (see speclite_decoder_layers; e: a drafting head's
// embedding rows, else null). Ends in a barrier.
inline void layer_team(const Layer &ly, const Step &st, const void *x, const void *e, void *out, void *cache_k,
                       void *cache_v, const Buffers &bufs, Scratch &sc) {
    const int dt = st.dt, M = st.M, H = (int)bufs.H, K = (int)bufs.K, I = (int)(bufs.G / 2), T = team::size();
    const auto [m0, m1] = team::share(M);
    const int64_t es = dt == F32 ? 4 : 2;
    char *normed = (char *)bufs.data.data(), *qkv = normed + es * M * K, *att = qkv + es * M * bufs.W;
    char *o = att + es * M * bufs.A, *gu = o + es * M * H, *act = gu + es * M * bufs.G, *down = act + es * M * I;
    if (ly.in_proj) {  // MTP: the block's input is in_proj of the normed pair
        char *cat = down + es * M * H, *proj = cat + es * M * 2 * H;
        for (int m = m0; m < m1; m++) {
            rms_norm_row(at(e, dt, (int64_t)m * H), ly.enorm, at(cat, dt, (int64_t)m * 2 * H + (ly.state_first ? H : 0)), dt, 0, H, ly.eps);
            rms_norm_row(at(x, dt, (int64_t)m * H), ly.hnorm, at(cat, dt, (int64_t)m * 2 * H + (ly.state_first ? 0 : H)), dt, 0, H, ly.eps);
        }
        sc.barrier.wait(T);
        matmul_team(*ly.in_proj, cat, dt, M, proj, sc);
        x = proj;
    }
    const bool eagle = ly.hnorm && !ly.in_proj;
    // The attention adds to x, or (EAGLE-3, residual_normed) to hnorm(x), kept in out meanwhile.
    const void *residual = eagle && ly.residual_normed ? out : x;
    for (int m = m0; m < m1; m++) {
        if (eagle) {
            rms_norm_row(at(e, dt, (int64_t)m * H), ly.norm1, at(normed, dt, (int64_t)m * K), dt, 0, H, ly.eps);
            rms_norm_row(at(x, dt, (int64_t)m * H), ly.hnorm, at(normed, dt, (int64_t)m * K + H), dt, 0, H, ly.eps);
            if (ly.residual_normed) memcpy(at(out, dt, (int64_t)m * H), at(normed, dt, (int64_t)m * K + H), es * H);
        } else {
            rms_norm_row(x, ly.norm1, normed, dt, m, H, ly.eps);
        }
    }
    sc.barrier.wait(T);
    matmul_team(*ly.qkv, normed, dt, M, qkv, sc);
    attention_team(qkv, st.cos, st.sin, cache_k, cache_v, att, st.mask, dt, M, ly.heads, ly.kv_heads, ly.head_dim,
                   st.max_len, st.start, st.L, st.scale, ly.qk_norm, ly.eps, sc.barrier);
    matmul_team(*ly.o, att, dt, M, o, sc);
    for (int m = m0; m < m1; m++) {
        for (int64_t i = (int64_t)m * H; i < (int64_t)(m + 1) * H; i++)
            store(out, dt, i, to_float(residual, dt, i) + to_float(o, dt, i));
        rms_norm_row(out, ly.norm2, normed, dt, m, H, ly.eps);
    }
    sc.barrier.wait(T);
    matmul_team(*ly.gate_up, normed, dt, M, gu, sc);
    swiglu_team(gu, act, dt, M, I, sc.barrier);
    matmul_team(*ly.down, act, dt, M, down, sc);
    const auto [i0, i1] = team::share((int64_t)M * H);
    for (int64_t i = i0; i < i1; i++) store(out, dt, i, to_float(out, dt, i) + to_float(down, dt, i));
    sc.barrier.wait(T);
}

// A model's layers (and head) run by a team: speclite_decoder_layers' body, shared with the greedy
// chain. The buffers are the calling thread's (thread_local), shared by its team.
struct Model {
    const Layer *const *layers;
    int n;
    const Head *head;
    Buffers &bufs;
    Scratch &sc;
    std::vector<char> &between;  // the states between layers, two in turn
    int64_t bytes = 0;           // one state [M, H]

    // Before the team forks (growing a buffer inside it would cost a barrier): what M rows and R
    // logit rows need.
    void reserve(int M, int R, int dt) {
        bytes = (int64_t)M * layers[0]->o->n * (dt == F32 ? 4 : 2);
        for (int i = 0; i < n; i++) bufs.reserve(*layers[i], M, dt, sc);
        if (head) ::reserve(sc, *head->mats, R);
        between.resize(2 * bytes);
    }

    // Run by every thread of the team; see speclite_decoder_layers. Ends in a barrier.
    void forward_team(const Step &st, const void *x, const void *e, void *out, void *const *captures,
                      void *const *caches_k, void *const *caches_v, int R, void *normed, void *logits) const {
        for (int i = 0; i < n; i++) {
            const void *in = i == 0 ? x : between.data() + (i - 1) % 2 * bytes;
            void *to = i == n - 1 ? out : between.data() + i % 2 * bytes;
            if (captures[i] && team::id() == 0) memcpy(captures[i], in, bytes);
            layer_team(*layers[i], st, in, i == 0 ? e : nullptr, to, caches_k[i], caches_v[i], bufs, sc);
        }
        if (head) {
            // The layers' normed-input buffer is free now (row m of it holds row m's state).
            char *to = normed ? (char *)normed : bufs.data.data();
            const int H = (int)bufs.H, M = st.M;
            const int first = normed ? 0 : M - R;
            const auto [n0, n1] = team::share(M - first);
            for (int m = first + n0; m < first + n1; m++) rms_norm_row(out, head->norm, to, st.dt, m, H, head->eps);
            sc.barrier.wait(team::size());
            matmul_team(*head->mats, to + (int64_t)H * (st.dt == F32 ? 4 : 2) * (M - R), st.dt, R, logits, sc);
        }
    }
};

// Row `index` of an embedding table [V, H] of dtype edt into dst, in dtype dt: the row as stored, or
// widened (a 16-bit table under fp32 activations, speclite.model.narrow), which is exact.
inline void embed_row(void *dst, int dt, const void *table, int edt, int64_t index, int H) {
    if (edt == dt) {
        memcpy(dst, at(table, edt, index * H), (size_t)(dt == F32 ? 4 : 2) * H);
        return;
    }
    for (int e = 0; e < H; e++) store(dst, dt, e, to_float(table, edt, index * H + e));
}

// A whole model for the loops that run several forwards in one call: its layers and head, its
// embedding table [V', H] (dtype edt), its KV cache (per layer) and the RoPE rows of every cache
// position (0..max_len-1, head_dim values each); a drafter's head may cover some tokens only, its
// rows' tokens in vocab_map. Mirrored by cpu_layer_ops.Decoder.
struct Decoder {
    const Layer *const *layers;
    int n;
    const Head *head;
    const void *embed;
    int edt;
    void *const *caches_k, *const *caches_v;
    const void *cos, *sin;
    int max_len;
    float scale;
    const int64_t *vocab_map;  // a drafter's head over some tokens only (FR-Spec): row -> token; null: row = token

    // The shape of a causal forward of M rows at cache position start.
    Step step(int dt, int M, int start) const {
        const int64_t rope = (int64_t)layers[0]->head_dim * start;
        return Step{dt, M, at(cos, dt, rope), at(sin, dt, rope), nullptr, max_len, start, start + M, scale};
    }
};

thread_local Buffers draft_buffers;  // a second model's, beside layer_buffers in the same call
thread_local std::vector<char> draft_states;
thread_local Buffers head_buffers;  // a drafting head's, beside the target's
thread_local std::vector<char> head_states;

// What a call of speculative iterations hands back (cpu_layer_ops._Run), kept by thread 0: the
// new tokens in order, per iteration the drafts offered and stood and the ns spent drafting and
// verifying; and whether the call is to stop: an EOS among the new tokens, or its time spent.
struct Iterations {
    int *tokens, *drafted, *accepted;
    int64_t *draft_ns, *verify_ns;
    const int *eos;
    int n_eos;
    int enough;     // the call stops once this many new tokens are out (an iteration's k is not cut to fit it)
    int64_t until;  // the call's time budget ends (team::now_ns)
    int count = 0, produced = 0;
    bool stop = false;

    // The target's verdict on kk drafts from its logits [kk + 1, V]: they stand while each equals the
    // argmax of the row before. Returns how many stood; best: the target's token after them.
    static int stood(const void *logits, int dt, int V, const int *drafts, int kk, int &best) {
        const int64_t row = (int64_t)V * (dt == F32 ? 4 : 2);
        int n = 0;
        best = argmax(logits, dt, V);
        while (n < kk && drafts[n] == best) best = argmax((const char *)logits + row * ++n, dt, V);
        return n;
    }

    // An iteration of kk drafts whose new tokens are drafts[0..n) and best.
    void record(const int *drafts, int kk, int n, int best, int64_t draft, int64_t verify) {
        for (int i = 0; i <= n; i++) {
            tokens[produced] = i < n ? drafts[i] : best;
            for (int j = 0; j < n_eos; j++) stop |= tokens[produced] == eos[j];
            produced++;
        }
        drafted[count] = kk, accepted[count] = n, draft_ns[count] = draft, verify_ns[count++] = verify;
        stop |= produced >= enough || team::now_ns() >= until;
    }
};

// Picks' rows, the calling thread's (its team shares them), kept between calls: a large vocabulary's
// k + 1 rows are megabytes.
struct PickBuffers {
    std::vector<float> q, p, residual;  // the drafts' and the target's warped rows
    std::vector<std::vector<float>> rows;  // per thread: a draft's logits over the target's vocabulary
    std::vector<WarpScratch> scratch;  // per thread
};
thread_local PickBuffers pick_buffers;

// How a loop's speculative iterations pick their drafts and judge them. Greedy (warp null): a draft is
// its row's argmax, and drafts stand while they equal the target's argmax at the row before, whose
// token after them comes next. Sampled: a draft is drawn from its row's warp over the target's V
// tokens (a head's vocabulary through its map, others -inf; a draft model's logits cut to V or padded
// with -inf), and rejection (sampling.h) judges them against the target's warped rows: the loop's
// rejection sampling of a chain, the uniforms taken in its order (an iteration's kk drafts', its kk
// acceptances', the next token's).
struct Picks {
    const Warp *warp;
    const float *uniforms;
    int n_uniforms, V;
    int used = 0;  // uniforms taken by the iterations judged
    PickBuffers &b = pick_buffers;

    Picks(const Warp *w, const float *u, int n_u, int V_, int k, int threads)
        : warp(w), uniforms(u), n_uniforms(n_u), V(V_) {
        if (!w) return;
        b.q.resize((size_t)V * k), b.p.resize((size_t)V * (k + 1));
        b.rows.resize(std::max<size_t>(b.rows.size(), threads)), b.scratch.resize(std::max<size_t>(b.scratch.size(), threads));
    }

    // Whether the uniforms left suffice for an iteration of kk drafts.
    bool enough(int kk) const { return !warp || n_uniforms - used >= 2 * kk + 1; }

    // Draft i of this iteration from a logits row (dtype dt, `width` values: a head's vocabulary, mapped
    // to tokens by vocab_map, or a model's): the argmax of its first `vocab`, or the draw. Thread `slot`.
    int draft(const void *logits, int dt, int width, int vocab, const int64_t *vocab_map, int i, int slot) {
        if (!warp) {
            const int best = argmax(logits, dt, std::min(vocab, width));
            return vocab_map ? (int)vocab_map[best] : best;
        }
        const void *row = logits;
        int rdt = dt;
        if (vocab_map || width < V) {
            std::vector<float> &full = b.rows[slot];
            full.assign(V, -INFINITY);
            for (int j = 0; j < std::min(width, V); j++) full[vocab_map ? vocab_map[j] : j] = to_float(logits, dt, j);
            row = full.data(), rdt = F32;
        }
        return sample_row(row, rdt, V, *warp, b.q.data() + (int64_t)V * i, b.scratch[slot], uniforms[used + i]);
    }

    // Every thread, after the target's pass over [token, drafts] (logits [kk + 1, V], dtype dt): thread
    // 0 sets n to how many drafts stood and best to the token after them. Sampled: the team warps the
    // target's rows first and meets at the barrier.
    void judge_team(const void *logits, int dt, const int *drafts, int kk, int &n, int &best, team::TeamBarrier &barrier) {
        if (warp) {
            const auto [r0, r1] = team::share(kk + 1);
            for (int r = r0; r < r1; r++)
                warp_row(at(logits, dt, (int64_t)V * r), dt, V, *warp, b.p.data() + (int64_t)V * r, b.scratch[team::id()]);
            barrier.wait(team::size());
        }
        if (team::id() != 0) return;
        if (!warp) {
            n = Iterations::stood(logits, dt, V, drafts, kk, best);
            return;
        }
        n = rejection(b.p.data(), b.q.data(), V, drafts, kk, uniforms + used + kk, uniforms[used + 2 * kk], b.residual, best);
        used += 2 * kk + 1;
    }
};

// A one-layer drafting head's chain (speclite_head_chain): step 0 feeds the T rows of x (states) and e
// (embedding rows) at cache position `from`, each later step one row; a step's pick (Picks::draft) from
// the logits of its last row over the head's vocabulary (mapped through vocab_map where set) is the
// next draft, fed with that row's layer output (normed_state: the norm's) as the state. The cache gains
// T + steps - 1 entries. cos/sin: RoPE rows of positions `start`.. (start <= from).
struct HeadChain {
    Model model;
    const void *embed;
    int edt;
    const int64_t *vocab_map;
    void *cache_k, *cache_v;
    const void *cos, *sin;
    int max_len, start;
    float scale;
    int normed_state;
    int H = 0, V = 0, d = 0;
    int64_t row = 0;
    std::vector<char> x, e, out, normed, logits;

    // Before the team forks: buffers for T first rows.
    void reserve(int T, int dt) {
        model.reserve(T, 1, dt);
        const Layer &ly = *model.layers[0];
        H = ly.o->n, V = model.head->mats->n, d = ly.head_dim, row = (int64_t)(dt == F32 ? 4 : 2) * H;
        for (auto *v : {&x, &e, &out, &normed}) v->resize(row * T);
        logits.resize((size_t)(dt == F32 ? 4 : 2) * V);
    }

    // Run by every thread of the team; ends in a barrier.
    void run_team(int dt, int T, int from, int steps, int *tokens, Picks &picks) {
        void *captures[2] = {nullptr, nullptr};
        for (int i = 0; i < steps; i++) {
            const int M = i == 0 ? T : 1, at_pos = i == 0 ? from : from + T - 1 + i;
            const int64_t rope = (int64_t)d * (at_pos - start);
            const Step st{dt, M, at(cos, dt, rope), at(sin, dt, rope), nullptr, max_len, at_pos, at_pos + M, scale};
            model.forward_team(st, x.data(), e.data(), out.data(), captures, &cache_k, &cache_v, 1, normed.data(),
                               logits.data());
            if (team::id() == 0) {
                tokens[i] = picks.draft(logits.data(), dt, V, V, vocab_map, i, 0);
                memcpy(x.data(), (normed_state ? normed.data() : out.data()) + row * (M - 1), row);
                embed_row(e.data(), dt, embed, edt, tokens[i], H);
            }
            model.sc.barrier.wait(team::size());  // the next step reads x and e
        }
    }
};

// The target's rows of an iteration into x [kk + 1, H]: `token`, then the kk drafts, embedded.
inline void embed_iteration(void *x, int dt, const Decoder &target, int token, const int *drafts, int kk) {
    const int H = target.layers[0]->o->n;
    const int64_t row = (int64_t)(dt == F32 ? 4 : 2) * H;
    embed_row(x, dt, target.embed, target.edt, token, H);
    for (int i = 0; i < kk; i++) embed_row((char *)x + row * (i + 1), dt, target.embed, target.edt, drafts[i], H);
}

// What a drafter reading the target's states takes from each verification pass: the inputs of the
// target's layers aux[0..n_aux) (aux = its layer count: the last layer's output) for up to `rows`
// rows, and the stood rows' states side by side in aux's order.
struct Captured {
    std::vector<std::vector<char>> layers;
    std::vector<void *> at;  // for forward_team; the last layer's output is copied after the pass
    std::vector<char> joined;
    const int *aux;
    int n_aux, L;
    int64_t row;

    Captured(int L_, const int *aux_, int n_aux_, int rows, int64_t row_bytes)
        : layers(L_ + 1), at(L_ + 1, nullptr), joined(row_bytes * n_aux_ * rows), aux(aux_), n_aux(n_aux_), L(L_),
          row(row_bytes) {
        for (int a = 0; a < n_aux; a++) layers[aux[a]].resize(row * rows);
        for (int i = 0; i < L; i++) at[i] = layers[i].empty() ? nullptr : layers[i].data();
    }
    // Thread 0, after the pass (out: its last layer's output, M rows): rows 0..n joined.
    void join(const void *out, int M, int n) {
        if (!layers[L].empty()) memcpy(layers[L].data(), out, row * M);
        for (int r = 0; r <= n; r++)
            for (int a = 0; a < n_aux; a++) memcpy(joined.data() + row * (n_aux * r + a), layers[aux[a]].data() + row * r, row);
    }
};

// The target's side of an iteration over a drafter that reads its states: the rows [token, drafts]
// (feed, thread 0), the pass capturing the layers the drafter reads, the verdict and the stood rows'
// states joined (pass_team).
struct Verification {
    const Decoder *target;
    const Model &t;
    int dt, V;
    std::vector<char> x, out, logits;
    Captured captured;

    Verification(const Decoder *target_, const Model &t_, int dt_, int k, const int *aux, int n_aux)
        : target(target_), t(t_), dt(dt_), V(target_->head->mats->n),
          x((size_t)(dt_ == F32 ? 4 : 2) * target_->layers[0]->o->n * (k + 1)), out(x.size()),
          logits((size_t)(dt_ == F32 ? 4 : 2) * V * (k + 1)), captured(target_->n, aux, n_aux, k + 1, x.size() / (k + 1)) {}
    void feed(int token, const int *drafts, int kk) { embed_iteration(x.data(), dt, *target, token, drafts, kk); }
    // Every thread (the model's reserved for k + 1 rows); thread 0 then sets n to how many of the kk
    // drafts stood and best to the token after them (picks' verdict). normed: the rows' final normed
    // states, where wanted.
    void pass_team(Picks &picks, int t_len, const int *drafts, int kk, void *normed, int &n, int &best) {
        t.forward_team(target->step(dt, kk + 1, t_len), x.data(), nullptr, out.data(), captured.at.data(),
                       target->caches_k, target->caches_v, kk + 1, normed, logits.data());
        picks.judge_team(logits.data(), dt, drafts, kk, n, best, t.sc.barrier);
        if (team::id() == 0) captured.join(out.data(), kk + 1, n);
    }
};

}  // namespace

extern "C" {

// y [M, n] = x [M, k] @ [W_0; W_1; ...]^T (+ bias) for the matrices `mt` describes (gemm.h).
void speclite_matmul(const void *x, int dt, const Matrices *mt, void *y, int M, int threads) {
    Scratch &sc = scratch;  // the caller's: the team shares it
    reserve(sc, *mt, M);
    team::run(threads, [&] { matmul_team(*mt, x, dt, M, y, sc); });
}

void speclite_rms_norm(const void *x, const void *weight, void *y, int dt, int M, int H, float eps) {
    for (int m = 0; m < M; m++) rms_norm_row(x, weight, y, dt, m, H, eps);
}

void speclite_swiglu(const void *gate_up, void *y, int dt, int M, int I) { swiglu_team(gate_up, y, dt, M, I, scratch.barrier); }

void speclite_attention(const void *qkv, const void *cos, const void *sin, void *cache_k, void *cache_v, void *out,
                        const uint8_t *mask, int dt, int t, int H, int Hkv, int d, int max_len, int start, int L,
                        float scale, const void *const *qk_norm, float eps, int threads) {
    // A fork costs more than a short decode step's attention: one thread unless there is real work.
    const int64_t work = (int64_t)t * H * L * d;
    Scratch &sc = scratch;  // the caller's: its barrier serves the team
    team::run(work > (1 << 18) ? threads : 1, [&] {
        attention_team(qkv, cos, sin, cache_k, cache_v, out, mask, dt, t, H, Hkv, d, max_len, start, L, scale, qk_norm,
                       eps, sc.barrier);
    });
}

// The n decoder layers of a model (or one block, n = 1) in one team: x [M, H] through
// layers[0..n-1] into out, layer i's KV cache at caches_k[i] / caches_v[i]. A layer is h = x +
// o(attention(qkv(norm1(x)))), out = h + down(swiglu(gate_up(norm2(h)))), each product and sum
// rounded to the dtype as the torch modules round them, so the result equals the module-by-module
// path bit for bit; attention as speclite_attention (cache write at start.., keys 0..L-1, mask or
// causal). captures[i], where not null, receives layer i's input
// (captures[n]: the last layer's output), for the methods that draft from the target's states.
// e: the embedding rows [M, H] an EAGLE-3 head's layer (the first) reads beside x, else null.
// With a head, the same team then norms the output and multiplies its last R rows by the head into
// logits [R, V], as the model's final norm and lm_head modules would; `normed`, where not null,
// receives every row's normed state (all M rows are normed then), else only the R rows are.
void speclite_decoder_layers(const Layer *const *layers, int n, const void *x, const void *e, void *out,
                             void *const *captures, void *const *caches_k, void *const *caches_v, int dt, int M,
                             const void *cos, const void *sin, const uint8_t *mask, int max_len, int start, int L,
                             float scale, const Head *head, int R, void *normed, void *logits, int threads) {
    const Step st{dt, M, cos, sin, mask, max_len, start, L, scale};
    Model model{layers, n, head, layer_buffers, scratch, layer_states};
    model.reserve(M, R, dt);
    team::run(threads, [&] { model.forward_team(st, x, e, out, captures, caches_k, caches_v, R, normed, logits); });
    if (captures[n]) memcpy(captures[n], out, model.bytes);
}

// n tokens after `token`, as n single steps of speclite_decoder_layers and the loop's picks would give
// them, in one team: the token's embedding row (embed [V', H] of dtype edt) goes through the layers
// at position start (cos/sin: the RoPE rows of positions start.., d values each), the pick from its
// first `vocab` logits (mapped through vocab_map where the head covers some tokens only) is tokens[0]
// and is fed at start + 1, and so on: the cache gains n entries.
// The pick is the argmax (the first of equal maxima, a NaN counting as the largest, as
// torch.argmax), or where `warp` is set the draw with uniforms[i] from the logits' warp (Pick). A
// draft model's chain, or plain decoding, without a return to Python per token. Plain decoding under
// a proposer that drafts from the target's states keeps them for every fed row (the token, then
// tokens[0..steps-2]): states[i] [steps, H], where not null, layer i's inputs (states[n]: the last
// layer's outputs), and normed [steps, H], where not null, the final normed states.
void speclite_chain(const Layer *const *layers, int n, const Head *head, const void *embed, int edt, int token,
                    void *const *caches_k, void *const *caches_v, int dt, const void *cos, const void *sin, int max_len,
                    int start, float scale, int vocab, const int64_t *vocab_map, const Warp *warp,
                    const float *uniforms, int steps, int *tokens,
                    void *const *states, void *normed, int threads) {
    Model model{layers, n, head, layer_buffers, scratch, layer_states};
    model.reserve(1, 1, dt);
    const int H = layers[0]->o->n, d = layers[0]->head_dim, V = head->mats->n;
    const int64_t es = dt == F32 ? 4 : 2;
    std::vector<char> x(es * H), out(es * H), logits(es * V);
    std::vector<void *> captures(n + 1, nullptr);  // this step's rows of `states` (thread 0's)
    Pick pick{warp};
    embed_row(x.data(), dt, embed, edt, token, H);
    team::run(threads, [&] {
        for (int i = 0; i < steps; i++) {
            const Step st{dt, 1, (const char *)cos + es * d * i, (const char *)sin + es * d * i, nullptr, max_len,
                          start + i, start + i + 1, scale};
            if (team::id() == 0)
                for (int l = 0; l < n; l++) captures[l] = states[l] ? (char *)states[l] + es * H * i : nullptr;
            model.forward_team(st, x.data(), nullptr, out.data(), captures.data(), caches_k, caches_v, 1,
                               normed ? (char *)normed + es * H * i : nullptr, logits.data());
            if (team::id() == 0) {
                if (states[n]) memcpy((char *)states[n] + es * H * i, out.data(), es * H);
                tokens[i] = pick(logits.data(), dt, std::min(vocab, V), warp ? uniforms[i] : 0.f);
                if (vocab_map) tokens[i] = (int)vocab_map[tokens[i]];
                embed_row(x.data(), dt, embed, edt, tokens[i], H);
            }
            model.sc.barrier.wait(team::size());  // the next step reads x
        }
    });
}

// n greedy drafts of a one-layer drafting head (EAGLE-3, MTP: a layer reading a state and an
// embedding, and its norm + lm_head), as its steps one by one give them. Step 0 feeds T rows: the
// embedding rows of first[0..T) (embed [V', H] of dtype edt) beside the states `hidden`
// [T, H] at positions start.. (the committed pairs still pending, causal); each later step i feeds
// one row, at position start + T - 1 + i. cos/sin: the RoPE rows of positions start.., d values
// each; the cache gains T + n - 1 entries. A step's argmax over the head's vocabulary (of its last
// row; first of equal maxima, NaN the largest) mapped through vocab_map (draft id -> token, or
// null) is tokens[i] and is fed next, with that row's layer output (normed_state: the head norm's
// output) as the next state.
void speclite_head_chain(const Layer *layer, const Head *head, const void *embed, int edt, const int64_t *vocab_map,
                         const int *first, int T, const void *hidden, void *cache_k, void *cache_v, int dt,
                         const void *cos, const void *sin, int max_len, int start, float scale, int steps,
                         int normed_state, int *tokens, int threads) {
    HeadChain chain{{&layer, 1, head, head_buffers, scratch, head_states}, embed, edt, vocab_map, cache_k, cache_v,
                    cos, sin, max_len, start, scale, normed_state};
    chain.reserve(T, dt);
    memcpy(chain.x.data(), hidden, chain.row * T);
    for (int m = 0; m < T; m++) embed_row(chain.e.data() + chain.row * m, dt, embed, edt, first[m], chain.H);
    Picks greedy{nullptr, nullptr, 0, chain.V, steps, threads};
    team::run(threads, [&] { chain.run_team(dt, T, start, steps, tokens, greedy); });
}

// probs [rows, V] (fp32) = each row of logits [rows, V] (dtype dt) warped (sampling.h's warp_row);
// the calling thread alone.
void speclite_warp(const void *logits, int dt, int rows, int V, float temperature, int top_k, float top_p,
                   float *probs) {
    thread_local WarpScratch s;
    for (int r = 0; r < rows; r++) warp_row(at(logits, dt, (int64_t)r * V), dt, V, {temperature, top_k, top_p}, probs + (int64_t)r * V, s);
}

// The inverse-CDF draw from weights [V] with the uniform u (sampling.h's draw).
int speclite_draw(const float *weights, int V, float u) { return draw(weights, V, u); }

// out: `rows` rows, row r the row r of each part side by side (part i: width[i] bytes a row); one
// thread, as speclite_embed.
void speclite_cat(const void *const *parts, const int64_t *width, int n, int64_t rows, void *out) {
    char *to = (char *)out;
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) {
            memcpy(to, (const char *)parts[i] + r * width[i], width[i]);
            to += width[i];
        }
}

// out [n, H] (dtype dt) = rows ids[0..n) of the embedding table [V, H] (dtype edt), as embed_row gives
// them; one thread: a gather, done before the forward it feeds.
void speclite_embed(const void *table, int edt, const int64_t *ids, int n, int H, void *out, int dt) {
    for (int m = 0; m < n; m++) embed_row(at(out, dt, (int64_t)m * H), dt, table, edt, ids[m], H);
}

// Speculative iterations of a draft model and its target in one call and one team, as the decode
// loop runs them one by one (each forward is speclite_decoder_layers' on the same rows, so the same
// tokens). An iteration: the draft reads the committed tokens it has not seen (`unseen`, at its
// cache position d_len..) and proposes k drafts:
//   a parallel draft (PARD, mask >= 0) in the same forward, from k - 1 `mask` tokens after them (its
//     last k rows); its cache keeps the real tokens' entries (the masks' are overwritten next);
//   an autoregressive one (mask < 0) from its last row, then each draft fed in turn (k - 1 one-row
//     forwards); its cache keeps the fed drafts that stand.
// The target reads `token` and the drafts at t_len... Greedy (warp null): a draft is the argmax of its
// row's first d_vocab logits (its token through draft->vocab_map where set); drafts stand while they
// equal the target's argmax at the row before, and the target's token after them comes next. Sampled:
// a draft is drawn (sampling.h) from its row's warp over the target's vocabulary (the draft's logits
// cut to it, or padded with -inf) and the target's rows are warped too; the drafts stand and the next
// token is drawn as `rejection` decides (sampling.h, the loop's rejection sampling of a chain), the
// uniforms taken in the loop's order: the k drafts', the k acceptances', the next token's. The stood
// drafts plus that token are the iteration's new tokens (those the draft has not read are the next
// `unseen`; the last one the next `token`). The target's cache keeps its stood rows' entries (t_len
// advances past them).
// k shrinks to fit both caches and `room` new tokens, at least one left to the target; the call
// stops where that leaves no draft, after an iteration whose new tokens hold one of eos[0..n_eos),
// once `enough` new tokens are out (an early stop, as a stop string's calls make: k is not cut to
// it, so the iterations are those of calls without it) or budget_ns have passed, or where fewer than
// 2k + 1 of the n_uniforms are left. Out: the new
// tokens in order, per iteration the drafts offered (drafted), stood (accepted) and the ns spent
// drafting and verifying; lengths = the caches' final lengths (target, draft) and the uniforms used.
// Returns the number of iterations.
int speclite_draft_iterations(const Decoder *target, const Decoder *draft, int dt, int t_len, int d_len,
                              const int *unseen, int n_unseen, int mask, int token, int k, int d_vocab, int room,
                              int enough, const Warp *warp, const float *uniforms, int n_uniforms, const int *eos,
                              int n_eos, int64_t budget_ns, int *tokens, int *drafted, int *accepted,
                              int64_t *draft_ns, int64_t *verify_ns, int *lengths, int threads) {
    const int H = target->layers[0]->o->n, Hd = draft->layers[0]->o->n, Vrow = draft->head->mats->n;
    const int V = target->head->mats->n, Vd = std::min(d_vocab, Vrow);
    const int64_t es = dt == F32 ? 4 : 2;
    const bool parallel = mask >= 0;
    const int first_rows = std::max(n_unseen, k + 1) + (parallel ? k - 1 : 0);  // the draft's widest forward
    Model t{target->layers, target->n, target->head, layer_buffers, scratch, layer_states};
    Model d{draft->layers, draft->n, draft->head, draft_buffers, scratch, draft_states};
    t.reserve(k + 1, k + 1, dt);
    d.reserve(first_rows, parallel ? k : 1, dt);
    std::vector<char> xt(es * H * (k + 1)), outt(es * H * (k + 1)), logt(es * V * (k + 1));
    std::vector<char> xd(es * Hd * first_rows), outd(es * Hd * first_rows), logd(es * Vrow * k);
    std::vector<int> fed(unseen, unseen + n_unseen), drafts(k);
    std::vector<void *> no_t(target->n + 1, nullptr), no_d(draft->n + 1, nullptr);
    Picks picks{warp, uniforms, n_uniforms, V, k, threads};
    Iterations out{tokens, drafted, accepted, draft_ns, verify_ns, eos, n_eos, enough, team::now_ns() + budget_ns};
    int kk = 0;  // this iteration's drafts (0: stop), thread 0's to decide
    int64_t draft_time = 0;
    auto decide = [&] {  // thread 0, before an iteration: its k and the draft's rows
        const int r = std::min(room - out.produced, target->max_len - t_len);
        kk = std::min({k, r - 1, draft->max_len - (d_len + (int)fed.size()) + 1});
        if (out.stop || kk < 1 || !picks.enough(kk)) {
            kk = 0;
            return;
        }
        const int M = (int)fed.size() + (parallel ? kk - 1 : 0);
        for (int m = 0; m < M; m++)
            embed_row(xd.data() + es * Hd * m, dt, draft->embed, draft->edt, m < (int)fed.size() ? fed[m] : mask, Hd);
    };
    team::run(threads, [&] {
        if (team::id() == 0) decide();
        t.sc.barrier.wait(team::size());  // every thread reads what thread 0 decided
        while (kk > 0) {
            const int64_t t0 = team::now_ns();
            const int M = (int)fed.size() + (parallel ? kk - 1 : 0), R = parallel ? kk : 1;
            d.forward_team(draft->step(dt, M, d_len), xd.data(), nullptr, outd.data(), no_d.data(), draft->caches_k,
                           draft->caches_v, R, nullptr, logd.data());
            const auto [r0, r1] = team::share(R);  // a parallel draft's rows shared by the team (row 0: thread 0's)
            for (int i = r0; i < r1; i++) drafts[i] = picks.draft(logd.data() + es * Vrow * i, dt, Vrow, Vd, draft->vocab_map, i, team::id());
            if (R > 1) t.sc.barrier.wait(team::size());  // thread 0 reads them all next
            for (int i = 1; !parallel && i < kk; i++) {  // an autoregressive draft's chain
                if (team::id() == 0) embed_row(xd.data(), dt, draft->embed, draft->edt, drafts[i - 1], Hd);
                t.sc.barrier.wait(team::size());
                d.forward_team(draft->step(dt, 1, d_len + M + i - 1), xd.data(), nullptr, outd.data(), no_d.data(),
                               draft->caches_k, draft->caches_v, 1, nullptr, logd.data());
                if (team::id() == 0) drafts[i] = picks.draft(logd.data(), dt, Vrow, Vd, draft->vocab_map, i, 0);
            }
            if (team::id() == 0) {
                embed_iteration(xt.data(), dt, *target, token, drafts.data(), kk);
                draft_time = team::now_ns() - t0;
            }
            t.sc.barrier.wait(team::size());
            const int64_t t1 = team::now_ns();
            t.forward_team(target->step(dt, kk + 1, t_len), xt.data(), nullptr, outt.data(), no_t.data(), target->caches_k,
                           target->caches_v, kk + 1, nullptr, logt.data());
            int n, best;
            picks.judge_team(logt.data(), dt, drafts.data(), kk, n, best, t.sc.barrier);
            if (team::id() == 0) {
                // The fed drafts that stood keep their entries. (Where the loop's observe also keeps a fed
                // rejected draft equal to the drawn token, its next propose drops that entry again.)
                const int kept = parallel ? 0 : std::min(n, kk - 1);
                d_len += (int)fed.size() + kept;
                fed.assign(drafts.begin() + kept, drafts.begin() + n);
                fed.push_back(best);
                t_len += n + 1, token = best;
                out.record(drafts.data(), kk, n, best, draft_time, team::now_ns() - t1);
                decide();
            }
            t.sc.barrier.wait(team::size());
        }
    });
    lengths[0] = t_len, lengths[1] = d_len, lengths[2] = picks.used;
    return out.count;
}

// Speculative iterations of a one-layer drafting head over the target's states (EAGLE-3, MTP)
// and its target in one call and one team, as the decode loop runs them one by one. The head's cache
// holds c committed entries; T pending pairs come next: states `pending` [T, Hh] (the head's inputs
// for positions c..) and `pairs` (the token after each). An iteration: the head's chain (the pairs
// at c.., then k - 1 steps; speclite_head_chain) drafts k tokens; the target reads `token` and the
// drafts at t_len.., the inputs of its layers aux[0..n_aux) captured (aux = its layer count: the
// last layer's output); the drafts are picked and judged as `warp` has it (Picks: greedy, or rejection
// sampling with the uniforms); the stood rows'
// captured inputs, side by side in aux's order, through `fuse` (EAGLE-3's fc; null: the rows' final
// normed states, MTP's) are the next pending states, paired with the new tokens (c advances past
// the pairs, t_len past the new tokens); normed_state as in speclite_head_chain. k shrinks as
// the loop's proposer shrinks it (room for the head's chain, `room` new tokens, one of them the
// target's); the call stops where that leaves no draft, after an EOS, once `enough` new tokens are
// out or budget_ns have passed, or where too few of the n_uniforms are left. Out as
// speclite_draft_iterations's; lengths = (t_len, c, T, uniforms used) after the last iteration and
// pending_out [k + 1, Hh] its first T rows the pending states. Returns the number of iterations.
int speclite_head_iterations(const Decoder *target, const Layer *layer, const Head *head, const int64_t *vocab_map,
                         const Matrices *fuse, const int *aux, int n_aux, void *head_k, void *head_v, const void *head_cos,
                         const void *head_sin, int head_max_len, float head_scale, int normed_state, int dt,
                         int t_len, int c,
                         const int *pairs, int T, const void *pending, int token, int k, int room, int enough,
                         const Warp *warp, const float *uniforms, int n_uniforms, const int *eos, int n_eos,
                         int64_t budget_ns, int *tokens, int *drafted, int *accepted, int64_t *draft_ns,
                         int64_t *verify_ns, void *pending_out, int *lengths, int threads) {
    const int H = target->layers[0]->o->n, L = target->n;
    const int64_t es = dt == F32 ? 4 : 2, trow = es * H;
    Model t{target->layers, L, target->head, layer_buffers, scratch, layer_states};
    t.reserve(k + 1, k + 1, dt);
    if (fuse) ::reserve(scratch, *fuse, k + 1);
    HeadChain hc{{&layer, 1, head, head_buffers, scratch, head_states}, target->embed, target->edt, vocab_map,
                 head_k, head_v, head_cos, head_sin, head_max_len, 0, head_scale, normed_state};
    hc.reserve(std::max(T, k + 1), dt);
    std::vector<char> normt(fuse ? 0 : trow * (k + 1));  // without fuse: the final normed states are the head's
    Verification v(target, t, dt, k, aux, n_aux);
    memcpy(hc.x.data(), pending, hc.row * T);
    for (int m = 0; m < T; m++) embed_row(hc.e.data() + hc.row * m, dt, target->embed, target->edt, pairs[m], hc.H);
    std::vector<int> drafts(k);
    Picks picks{warp, uniforms, n_uniforms, target->head->mats->n, k, threads};
    Iterations out{tokens, drafted, accepted, draft_ns, verify_ns, eos, n_eos, enough, team::now_ns() + budget_ns};
    int kk = 0, n = 0, best = 0;  // this iteration's drafts (0: stop) and verdict, thread 0's
    int64_t draft_time = 0;
    auto decide = [&] {  // thread 0, before an iteration
        const int r = std::min(room - out.produced, target->max_len - t_len);
        kk = std::min({k, r - 1, head_max_len - c - T});
        if (out.stop || kk < 1 || !picks.enough(kk)) kk = 0;
    };
    team::run(threads, [&] {
        if (team::id() == 0) decide();
        t.sc.barrier.wait(team::size());  // every thread reads what thread 0 decided
        while (kk > 0) {
            const int64_t t0 = team::now_ns();
            hc.run_team(dt, T, c, kk, drafts.data(), picks);
            if (team::id() == 0) {
                v.feed(token, drafts.data(), kk);
                draft_time = team::now_ns() - t0;
            }
            t.sc.barrier.wait(team::size());
            const int64_t t1 = team::now_ns();
            v.pass_team(picks, t_len, drafts.data(), kk, fuse ? nullptr : normt.data(), n, best);
            if (team::id() == 0) {
                for (int r = 0; r <= n; r++)
                    embed_row(hc.e.data() + hc.row * r, dt, target->embed, target->edt, r < n ? drafts[r] : best, hc.H);
                if (!fuse) memcpy(hc.x.data(), normt.data(), trow * (n + 1));
                c += T, T = n + 1, t_len += n + 1, token = best;
            }
            t.sc.barrier.wait(team::size());
            if (fuse) matmul_team(*fuse, v.captured.joined.data(), dt, T, hc.x.data(), t.sc);  // the next pending states
            if (team::id() == 0) {
                out.record(drafts.data(), kk, n, best, draft_time, team::now_ns() - t1);
                decide();
            }
            t.sc.barrier.wait(team::size());
        }
    });
    memcpy(pending_out, hc.x.data(), hc.row * T);
    lengths[0] = t_len, lengths[1] = c, lengths[2] = T, lengths[3] = picks.used;
    return out.count;
}

// Speculative iterations of a DFlash drafter (a block drafter over the target's states) and its
// target in one call and one team, as the decode loop runs them one by one. The drafter's cache holds
// c context entries; T pending context rows come next (`pending` [T, H]: fc + hidden_norm of the
// target's states at positions c.., already fused). An iteration: each drafter layer projects the
// pending rows to keys and values (kv[i]: that layer's k and v projections) and writes them at c..
// (k norm, RoPE; no query); the block [token, mask, ..., mask] of kk + 1 rows (the target's embedding)
// at the next positions, seeing every entry and all of itself, through the layers, the drafter's
// norm and the target's lm_head (draft->head: some of its rows only where draft->vocab_map is set) gives
// the kk drafts (its rows 1..kk, picked as Picks does); the
// target reads `token` and the drafts at t_len.., the inputs of its layers aux[0..n_aux) captured (aux
// = its layer count: the last layer's output); drafts are judged as in speclite_draft_iterations; the stood
// rows' captures, side by side in aux's order, through `fuse` (fc) and the fuse_norm RMSNorm
// (hidden_norm, fuse_eps) are the next pending rows. The block's own entries are left past the
// context. k shrinks to fit both caches and `room` new tokens; the call stops as
// speclite_draft_iterations's. Out as speclite_draft_iterations's; lengths = (t_len, c, T, uniforms
// used) after the last iteration and pending_out [max(T, k + 1), H] its first T rows the pending rows.
int speclite_dflash_iterations(const Decoder *target, const Decoder *draft, const Matrices *const *kv, const Matrices *fuse,
                           const void *fuse_norm, float fuse_eps, const int *aux, int n_aux, int mask, int dt, int t_len,
                           int c, int T, const void *pending, int token, int k, int room, int enough, const Warp *warp,
                           const float *uniforms, int n_uniforms, const int *eos, int n_eos, int64_t budget_ns,
                           int *tokens, int *drafted, int *accepted, int64_t *draft_ns, int64_t *verify_ns,
                           void *pending_out, int *lengths, int threads) {
    const int H = target->layers[0]->o->n, V = target->head->mats->n, Vh = draft->head->mats->n, L = target->n;
    const Layer &first = *draft->layers[0];
    const int d = first.head_dim, kv_width = 2 * first.kv_heads * d, rows = std::max(T, k + 1);
    const int64_t es = dt == F32 ? 4 : 2, trow = es * H;
    Model t{target->layers, L, target->head, layer_buffers, scratch, layer_states};
    Model dm{draft->layers, draft->n, draft->head, draft_buffers, scratch, draft_states};
    t.reserve(k + 1, k + 1, dt);
    dm.reserve(k + 1, k, dt);
    for (int i = 0; i < draft->n; i++) ::reserve(scratch, *kv[i], rows);
    ::reserve(scratch, *fuse, k + 1);
    std::vector<char> ctx(trow * rows), kvs(es * kv_width * rows), fused(trow * (k + 1));
    std::vector<char> xd(trow * (k + 1)), outd(trow * (k + 1)), logd(es * Vh * k);
    std::vector<uint8_t> sees((size_t)(k + 1) * draft->max_len, 1);  // the block sees every entry and itself
    std::vector<void *> no_d(draft->n + 1, nullptr);
    Verification v(target, t, dt, k, aux, n_aux);
    memcpy(ctx.data(), pending, trow * T);
    std::vector<int> drafts(k);
    Picks picks{warp, uniforms, n_uniforms, V, k, threads};
    Iterations out{tokens, drafted, accepted, draft_ns, verify_ns, eos, n_eos, enough, team::now_ns() + budget_ns};
    int kk = 0, n = 0, best = 0;  // this iteration's drafts (0: stop) and verdict, thread 0's
    int64_t t0 = 0, draft_time = 0;
    auto decide = [&] {  // thread 0, before an iteration
        const int r = std::min(room - out.produced, target->max_len - t_len);
        kk = std::min({k, r - 1, draft->max_len - (c + T) - 1});
        if (out.stop || kk < 1 || !picks.enough(kk)) kk = 0;
        t0 = team::now_ns();
    };
    team::run(threads, [&] {
        if (team::id() == 0) decide();
        t.sc.barrier.wait(team::size());  // every thread reads what thread 0 decided
        while (kk > 0) {
            for (int i = 0; i < draft->n && T > 0; i++) {  // the pending context into every layer's cache
                const Layer &ly = *draft->layers[i];
                matmul_team(*kv[i], ctx.data(), dt, T, kvs.data(), t.sc);
                attention_team(kvs.data(), at(draft->cos, dt, (int64_t)d * c), at(draft->sin, dt, (int64_t)d * c),
                               draft->caches_k[i], draft->caches_v[i], nullptr, nullptr, dt, T, 0, ly.kv_heads, d,
                               draft->max_len, c, c + T, draft->scale, ly.qk_norm, ly.eps, t.sc.barrier);
            }
            if (team::id() == 0) {
                c += T, T = 0;
                embed_row(xd.data(), dt, draft->embed, draft->edt, token, H);
                for (int i = 1; i <= kk; i++) embed_row(xd.data() + trow * i, dt, draft->embed, draft->edt, mask, H);
            }
            t.sc.barrier.wait(team::size());
            const Step block{dt, kk + 1, at(draft->cos, dt, (int64_t)d * c), at(draft->sin, dt, (int64_t)d * c), sees.data(),
                             draft->max_len, c, c + kk + 1, draft->scale};
            dm.forward_team(block, xd.data(), nullptr, outd.data(), no_d.data(), draft->caches_k, draft->caches_v, kk,
                            nullptr, logd.data());
            const auto [r0, r1] = team::share(kk);
            for (int i = r0; i < r1; i++) drafts[i] = picks.draft(logd.data() + es * Vh * i, dt, Vh, Vh, draft->vocab_map, i, team::id());
            t.sc.barrier.wait(team::size());
            if (team::id() == 0) {
                v.feed(token, drafts.data(), kk);
                draft_time = team::now_ns() - t0;
            }
            t.sc.barrier.wait(team::size());
            const int64_t t1 = team::now_ns();
            v.pass_team(picks, t_len, drafts.data(), kk, nullptr, n, best);
            if (team::id() == 0) T = n + 1, t_len += n + 1, token = best;
            t.sc.barrier.wait(team::size());
            matmul_team(*fuse, v.captured.joined.data(), dt, T, fused.data(), t.sc);  // the next pending rows: fc, then hidden_norm
            const auto [m0, m1] = team::share(T);
            for (int m = m0; m < m1; m++) rms_norm_row(fused.data(), fuse_norm, ctx.data(), dt, m, H, fuse_eps);
            t.sc.barrier.wait(team::size());
            if (team::id() == 0) {
                out.record(drafts.data(), kk, n, best, draft_time, team::now_ns() - t1);
                decide();
            }
            t.sc.barrier.wait(team::size());
        }
    });
    memcpy(pending_out, ctx.data(), trow * T);
    lengths[0] = t_len, lengths[1] = c, lengths[2] = T, lengths[3] = picks.used;
    return out.count;
}

}  // extern "C"
