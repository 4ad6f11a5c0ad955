/* The rest of a step: the residual add with the RMS norm, silu(gate) * up, the layer loop (decode_layers), the draw
 * (sample_rows) and the whole eager decode step in one call (decode_step). */
#include "kernels.h"

/* x += delta (when delta is not NULL), then out = weight * x / sqrt(mean(x^2) + eps), row by row: x, delta, out
 * [n, dim] contiguous. */
void add_rms_norm(float *x, const float *delta, const float *weight, float *out, int64_t n, int64_t dim,
                  float eps) {
    for (int64_t i = 0; i < n; i++) {
        float *row = x + i * dim;
        if (delta)
            for (int64_t j = 0; j < dim; j++) row[j] += delta[i * dim + j];
        float r = 1.0f / sqrtf(dot(row, row, dim) / (float)dim + eps);
        for (int64_t j = 0; j < dim; j++) out[i * dim + j] = weight[j] * (row[j] * r);
    }
}

/* out[i, j] = silu(gate_up[i, j]) * gate_up[i, inter + j]: gate_up [n, 2 inter], out [n, inter], contiguous; the
 * weights `next` names asked for as it goes. */
static void silu_rows(const float *gate_up, float *out, int64_t n, int64_t inter, Ahead *next) {
    for (int64_t i = 0; i < n; i++) {
        pull(next);
        const float *g = gate_up + i * 2 * inter, *u = g + inter;
        float *o = out + i * inter;
        for (int64_t j = 0; j < inter; j++) o[j] = g[j] / (1.0f + exp_f32(-g[j])) * u[j];
    }
}

void silu_mul(const float *gate_up, float *out, int64_t n, int64_t inter) { silu_rows(gate_up, out, n, inter, NULL); }

/* For the tests: the bytes pull asks for at each row of a loop of `rows` rows, aimed as weights_ahead aims. */
void ahead_plan(const float *a, int64_t a_floats, const float *b, int64_t b_floats, int64_t rows, int64_t *asked) {
    Ahead p = weights_ahead(a, a_floats, b, b_floats, rows);
    for (int64_t i = 0; i < rows; i++) {
        const char *before[2] = {p.at[0], p.at[1]};
        pull(&p);
        asked[i] = (p.at[0] - before[0]) + (p.at[1] - before[1]);
    }
}

/* LeanForward._decode_kernels' layer loop in one call, the matrix multiplies by layer_linear (`packed`: the four
 * weights a layer as pack_weight packs them, else as the model holds them, by `gemm` as torch's F.linear): at the
 * tiny coder's size the 32 calls a step from Python cost 5-10 % of it. weights: ten
 * addresses a layer (input norm, post-attention norm, qkv, its bias, o, its bias, gate_up, its bias, down, its
 * bias; 0 for an absent bias). x [n, hidden], the residual stream, is updated in place; h [n, hidden] comes in
 * holding the first layer's normed input and leaves holding the final norm's output. Scratch: qkv [n, (heads + 2
 * kv heads) d], attn [n, heads d], delta [n, hidden], gate_up [n, 2 inter], act [n, inter], and rope_attend's.
 * Layer i's keys start at kv + i * layer_stride, its values value_offset after them.
 * kept (NULL: every row): the rows whose output is wanted, m of them, increasing, any repeated (a prefill wants each
 * prompt's last token only). The last layer writes every row's k and v, then goes on with the kept rows alone, their
 * residuals moved to x's first m rows; h's first m rows receive their outputs. (At the tiny coder's shape the last
 * layer past its k and v is a fifth of a prefill's arithmetic.) No shared prompt (`shared` NULL) with kept rows. */

void decode_layers(sgemm_fn gemm, const int64_t *weights, int64_t layers, const float *final_norm, float *x, float *h,
                   float *qkv, float *attn, float *delta, float *gate_up, float *act, const float *cos,
                   const float *sin, const int64_t *positions, const int64_t *slots, const int64_t *order,
                   const int64_t *source, const int64_t *shared, float *kv, int64_t layer_stride,
                   int64_t value_offset, float *scratch, int64_t n, int64_t hidden, int64_t inter, int64_t heads,
                   int64_t kv_heads, int64_t d, int64_t slot_stride, int64_t head_stride, int64_t col_stride,
                   float scale, float eps, const int64_t *kept, int64_t m, int64_t packed) {
    int64_t width = (heads + 2 * kv_heads) * d, rows = n;
    for (int64_t i = 0; i < layers; i++) {
        const int64_t *w = weights + 10 * i;
        float *keys = kv + i * layer_stride;
        layer_linear(gemm, packed, h, AT(w[2]), AT(w[3]), qkv, rows, width, hidden);
        if (kept && i + 1 == layers) {
            Ahead next = weights_ahead(AT(w[4]), weight_floats(packed, hidden, heads * d), AT(w[6]),
                                       weight_floats(packed, 2 * inter, hidden), m);
            rope_attend_kept(qkv, cos, sin, positions, slots, keys, keys + value_offset, attn, scratch, n, kept, m,
                             heads, kv_heads, d, slot_stride, head_stride, col_stride, scale, &next);
            for (int64_t j = 0; j < m; j++) memmove(x + j * hidden, x + kept[j] * hidden, hidden * sizeof(float));
            rows = m;
        } else {
            Ahead next = weights_ahead(AT(w[4]), weight_floats(packed, hidden, heads * d), AT(w[6]),
                                       weight_floats(packed, 2 * inter, hidden), n);
            attend_rows(qkv, cos, sin, positions, slots, order, source, shared, keys, keys + value_offset, attn,
                        scratch, n, heads, kv_heads, d, slot_stride, head_stride, col_stride, scale, &next);
        }
        layer_linear(gemm, packed, attn, AT(w[4]), AT(w[5]), delta, rows, hidden, heads * d);
        add_rms_norm(x, delta, AT(w[1]), h, rows, hidden, eps);
        layer_linear(gemm, packed, h, AT(w[6]), AT(w[7]), gate_up, rows, 2 * inter, hidden);
        Ahead next = weights_ahead(AT(w[8]), weight_floats(packed, hidden, inter), i + 1 < layers ? AT(w[12]) : NULL,
                                   weight_floats(packed, width, hidden), rows);
        silu_rows(gate_up, act, rows, inter, &next);
        layer_linear(gemm, packed, act, AT(w[8]), AT(w[9]), delta, rows, hidden, inter);
        add_rms_norm(x, delta, i + 1 < layers ? AT(w[10]) : final_norm, h, rows, hidden, eps);
    }
}

/* sampling.sample_tokens at top_p = 1 over float32 logits [n, vocab] in one call: for each row the token drawn by
 * inverse CDF of softmax(logits / temperature) at the row's uniform u[i], and its log-prob: (z - max) - log(sum(exp(z
 * - max))) in float32 with z = logits / temperature, as torch's log-softmax. The CDF sums the softmax's terms in
 * float64 (the total in eight lanes, the running sum in vocabulary order): the first token whose cumulative mass
 * exceeds u[i] times the total, or the last token of positive mass if rounding leaves none. The exponential is
 * exp_f32's (~2e-7 relative), so a log-prob may differ from torch's in its last bits, and a draw within that of a
 * boundary may differ; a term below e^-87 counts as 0 (a -inf logit is never drawn). scratch: 2 vocab floats. */
void sample_rows(const float *logits, const double *u, int64_t n, int64_t vocab, float temperature,
                 int64_t *tokens, float *logp, float *scratch) {
    float *z = scratch, *e = scratch + vocab;
    for (int64_t i = 0; i < n; i++) {
        const float *x = logits + i * vocab;
        float top = x[0] / temperature;
        for (int64_t c = 0; c < vocab; c++) z[c] = x[c] / temperature;
        for (int64_t c = 0; c < vocab; c++) top = z[c] > top ? z[c] : top;
        for (int64_t c = 0; c < vocab; c++) e[c] = z[c] - top < -87.0f ? 0.0f : exp_f32(z[c] - top);
        float lse = logf(sum(e, vocab));
        double lanes[LANES] = {0};
        int64_t c = 0;
        for (; c + LANES <= vocab; c += LANES)
            for (int l = 0; l < LANES; l++) lanes[l] += (double)e[c + l];
        double mass = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
        for (; c < vocab; c++) mass += (double)e[c];
        double target = u[i] * mass, cumulative = 0.0;
        int64_t token = 0;  /* kept only if no term is positive: never for finite logits (the largest term is 1) */
        for (c = 0; c < vocab; c++) {
            cumulative += (double)e[c];
            if (e[c] > 0.0f) token = c;
            if (cumulative > target) break;
        }
        tokens[i] = token;
        logp[i] = (z[token] - top) - lse;
    }
}

/* The floats decode_step's `work` holds for n rows (its layout is decode_step's). */
int64_t decode_step_work(int64_t n, int64_t hidden, int64_t inter, int64_t heads, int64_t kv_heads, int64_t d,
                         int64_t vocab, int64_t width) {
    return 4 * n + n * (3 * hidden + (2 * heads + 2 * kv_heads) * d + 3 * inter + vocab) + heads / kv_heads * width
           + 2 * vocab;
}

/* A whole decode step of slots slots[0..n) (NULL: 0..n-1) in one call, what LeanForward.decode, the draw and
 * DecodeStep's state update do with a dozen torch ops and three calls here (their dispatch was 60-70 ms of a
 * 128-row generate): each slot feeds pending[b] at positions[b] (its embedding row, the first layer's norm,
 * decode_layers, the head through `gemm` as F.linear multiplies), draws by sample_rows at its uniform
 * uniforms[b * draws + produced[b]], then pending[b] = its token, and positions[b] and produced[b] advance by
 * live[b]. tokens [n] and logp [n] receive the draws; work: decode_step_work floats (int64 and float64 first). */
void decode_step(sgemm_fn gemm, const int64_t *weights, int64_t layers, const float *first_norm,
                 const float *final_norm, const float *embed, const float *head, int64_t vocab, int64_t n,
                 const int64_t *slots, const int64_t *order, const int64_t *source, const int64_t *shared,
                 int64_t *pending, int64_t *positions, int64_t *produced, const int64_t *live,
                 const double *uniforms, int64_t draws, float *kv, int64_t layer_stride, int64_t value_offset,
                 const float *cos, const float *sin, int64_t hidden, int64_t inter, int64_t heads, int64_t kv_heads,
                 int64_t d, int64_t slot_stride, int64_t head_stride, int64_t col_stride, float scale, float eps,
                 float temperature, int64_t width, float *work, int64_t *tokens, float *logp, int64_t packed) {
    int64_t *rows_at = (int64_t *)work;
    double *u = (double *)(work + 2 * n);
    float *x = work + 4 * n, *h = x + n * hidden, *qkv = h + n * hidden;
    float *attn = qkv + n * (heads + 2 * kv_heads) * d, *delta = attn + n * heads * d, *gate_up = delta + n * hidden;
    float *act = gate_up + n * 2 * inter, *logits = act + n * inter, *scratch = logits + n * vocab;
    float *draw = scratch + heads / kv_heads * width;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = slots ? slots[i] : i;
        rows_at[i] = positions[b];
        u[i] = uniforms[b * draws + produced[b]];
        memcpy(x + i * hidden, embed + pending[b] * hidden, hidden * sizeof(float));
    }
    add_rms_norm(x, NULL, first_norm, h, n, hidden, eps);
    decode_layers(gemm, weights, layers, final_norm, x, h, qkv, attn, delta, gate_up, act, cos, sin, rows_at, slots,
                  order, source, shared, kv, layer_stride, value_offset, scratch, n, hidden, inter, heads, kv_heads, d,
                  slot_stride, head_stride, col_stride, scale, eps, NULL, 0, packed);
    linear(gemm, h, head, NULL, logits, n, vocab, hidden);
    sample_rows(logits, u, n, vocab, temperature, tokens, logp, draw);
    for (int64_t i = 0; i < n; i++) {
        int64_t b = slots ? slots[i] : i;
        pending[b] = tokens[i];
        positions[b] += live[b];
        produced[b] += live[b];
    }
}
