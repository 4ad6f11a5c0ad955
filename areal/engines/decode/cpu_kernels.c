/* The CPU float32 decode step's work between its matrix multiplies, one call each (see cpu_kernels.py).
 *
 * Torch ops at the tiny coder's size cost more to dispatch than to compute, and MKL's batched multiply of a
 * slot's two query heads against its keys runs at a few GFLOP/s; these loops do the same arithmetic in one
 * pass each: the residual add with the RMS norm, silu(gate) * up, and, per slot, the rotary embedding of q and
 * k, the write of k and v into the slot's column, and attention over the slot's own filled columns only. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define LANES 8

/* Prefetches the compiler keeps: GCC 12 deletes a loop of __builtin_prefetch as dead code when its bounds are read
 * through a pointer (it did so to this file's), so on x86-64 the instructions are written out. */
#if defined(__x86_64__)
#define PREFETCH_FOR_WRITE(p) __asm__ volatile("prefetchw %0" : : "m"(*(const char *)(p)))
#define PREFETCH_TO_L2(p) __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)(p)))
#else
#define PREFETCH_FOR_WRITE(p) __builtin_prefetch((p), 1)
#define PREFETCH_TO_L2(p) __builtin_prefetch((p), 0, 2)
#endif

/* Weights the next multiplies read, asked of the L2 a few lines a row by the loop that runs before them (attention
 * before o and gate_up, the activation before down and the next layer's qkv). A decode step's weights (3 MB at the
 * tiny coder's shape) do not stay in a 1 MiB L2 from one step to the next, and MKL's packing read them from the L3
 * as it went: 10 % of a 128-row generate, 3 % with them asked for ahead (the generate 1.03-1.07x). Spread over the
 * loop's first half, the asks overlap its work and the last lines arrive before it ends. */
typedef struct {
    const char *at[2];
    int64_t left[2];   /* bytes still to ask for, of each region (whole lines) */
    int64_t per_row;   /* bytes to ask for a row of the loop (whole lines) */
} Ahead;

/* Regions a (a_floats) then b (b_floats; NULL for none), asked for a line at a time from the line each starts in,
 * over the first half of a loop of `rows` rows. */
static Ahead weights_ahead(const float *a, int64_t a_floats, const float *b, int64_t b_floats, int64_t rows) {
    Ahead p = {{NULL, NULL}, {0, 0}, 0};
    const float *start[2] = {a, b};
    int64_t floats[2] = {a_floats, b ? b_floats : 0}, half = rows / 2 > 0 ? rows / 2 : 1;
    for (int r = 0; r < 2; r++) {
        int64_t offset = (int64_t)((uintptr_t)start[r] % 64);
        p.at[r] = (const char *)start[r] - offset;
        p.left[r] = floats[r] > 0 ? (offset + 4 * floats[r] + 63) / 64 * 64 : 0;
    }
    p.per_row = ((p.left[0] + p.left[1]) / 64 + half - 1) / half * 64;
    return p;
}

/* Ask for the next per_row bytes of the regions (nothing when p is NULL or all were asked for). */
static inline void pull(Ahead *p) {
    if (!p) return;
    int64_t budget = p->per_row;
    for (int r = 0; r < 2 && budget > 0; r++)
        for (; p->left[r] > 0 && budget > 0; p->at[r] += 64, p->left[r] -= 64, budget -= 64) PREFETCH_TO_L2(p->at[r]);
}

/* For the tests: the bytes pull asks for at each row of a loop of `rows` rows, aimed as weights_ahead aims. */
void ahead_plan(const float *a, int64_t a_floats, const float *b, int64_t b_floats, int64_t rows, int64_t *asked) {
    Ahead p = weights_ahead(a, a_floats, b, b_floats, rows);
    for (int64_t i = 0; i < rows; i++) {
        const char *before[2] = {p.at[0], p.at[1]};
        pull(&p);
        asked[i] = (p.at[0] - before[0]) + (p.at[1] - before[1]);
    }
}

/* e^x in float32 for any x: 2^k e^r with k = round(x / ln2), |r| <= ln2/2, and a degree-6 Taylor polynomial
 * (relative error ~2e-7); plain arithmetic (rounding by the 1.5 * 2^23 trick, 2^k by building its bits), so the
 * loops over it vectorize. */
static inline float exp_f32(float x) {
    x = x < 88.0f ? x : 88.0f;  /* if-converted into min/max (built with -fno-trapping-math) */
    x = x > -87.0f ? x : -87.0f;
    float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = x - k * 0.693145752f - k * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666667f + r * (0.0416666667f + r * (0.00833333333f
              + r * 0.00138888889f)))));
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float sum(const float *a, int64_t d) {
    float acc[LANES] = {0};
    int64_t t = 0;
    for (; t + LANES <= d; t += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[t + l];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; t < d; t++) s += a[t];
    return s;
}

static inline float dot(const float *a, const float *b, int64_t d) {
    float acc[LANES] = {0};
    int64_t t = 0;
    for (; t + LANES <= d; t += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[t + l] * b[t + l];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; t < d; t++) s += a[t] * b[t];
    return s;
}

/* For q heads qs[0..heads) (heads 1 or 2, d floats apart) and columns [from, to): out[h * stride + c] = scale *
 * q_h . keys[c], column c's d floats at keys + c * cs. Two heads share each column's loads; each head's sums are
 * those of one head alone. */
static void scores(const float *qs, int heads, const float *keys, int64_t from, int64_t to, int64_t d, int64_t cs,
                   float scale, float *out, int64_t stride) {
    int64_t c = from;
#if defined(__AVX2__) && defined(__FMA__)
    if (d % 8 == 0) {  /* eight columns at a time: eight accumulators a head, reduced together by a tree of hadds */
        __m256 scaled = _mm256_set1_ps(scale);
        for (; c + 8 <= to; c += 8) {
            __m256 a[2][8];
            for (int h = 0; h < 2; h++)
                for (int l = 0; l < 8; l++) a[h][l] = _mm256_setzero_ps();
            for (int64_t t = 0; t < d; t += 8) {
                __m256 q0 = _mm256_loadu_ps(qs + t), q1 = _mm256_loadu_ps(qs + (heads - 1) * d + t);
                for (int l = 0; l < 8; l++) {
                    __m256 k = _mm256_loadu_ps(keys + (c + l) * cs + t);
                    a[0][l] = _mm256_fmadd_ps(q0, k, a[0][l]);
                    if (heads == 2) a[1][l] = _mm256_fmadd_ps(q1, k, a[1][l]);
                }
            }
            for (int h = 0; h < heads; h++) {
                __m256 *b = a[h];
                __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(b[0], b[1]), _mm256_hadd_ps(b[2], b[3]));
                __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(b[4], b[5]), _mm256_hadd_ps(b[6], b[7]));
                __m256 total = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20),
                                             _mm256_permute2f128_ps(h0, h1, 0x31));
                _mm256_storeu_ps(out + h * stride + c, _mm256_mul_ps(total, scaled));
            }
        }
    }
#endif
    for (; c < to; c++)
        for (int h = 0; h < heads; h++) out[h * stride + c] = dot(qs + h * d, keys + c * cs, d) * scale;
}

/* For heads h < heads (1 or 2): os[h * d ...] += sum over columns [from, to) of ps[h * stride + c] * values[c]
 * (d floats at values + c * cs). Two heads share each column's loads; each head's sums are those of one alone. */
static void weighted(const float *ps, int heads, int64_t stride, const float *values, int64_t from, int64_t to,
                     int64_t d, int64_t cs, float *os) {
    int64_t t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; t + 32 <= d; t += 32) {  /* 32 outputs a head in four registers across the column loop */
        __m256 o[2][4];
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < 4; r++) o[h][r] = _mm256_loadu_ps(os + (h < heads ? h : 0) * d + t + 8 * r);
        for (int64_t c = from; c < to; c++) {
            const float *row = values + c * cs + t;
            __m256 v[4];
            for (int r = 0; r < 4; r++) v[r] = _mm256_loadu_ps(row + 8 * r);
            __m256 w0 = _mm256_set1_ps(ps[c]);
            for (int r = 0; r < 4; r++) o[0][r] = _mm256_fmadd_ps(w0, v[r], o[0][r]);
            if (heads == 2) {
                __m256 w1 = _mm256_set1_ps(ps[stride + c]);
                for (int r = 0; r < 4; r++) o[1][r] = _mm256_fmadd_ps(w1, v[r], o[1][r]);
            }
        }
        for (int h = 0; h < heads; h++)
            for (int r = 0; r < 4; r++) _mm256_storeu_ps(os + h * d + t + 8 * r, o[h][r]);
    }
#endif
    for (; t < d; t++)
        for (int h = 0; h < heads; h++) {
            float acc = os[h * d + t];
            for (int64_t c = from; c < to; c++) acc += ps[h * stride + c] * values[c * cs + t];
            os[h * d + t] = acc;
        }
}

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

static inline void rotate(float *x, const float *cos, const float *sin, int64_t d) {
    int64_t half = d / 2;
    for (int64_t t = 0; t < half; t++) {
        float a = x[t], b = x[t + half];
        x[t] = a * cos[t] - b * sin[t];
        x[t + half] = b * cos[t + half] + a * sin[t + half];
    }
}

/* max of p[0..len), len >= 1: eight lanes, then across them (exact in any order, so the same as one pass) */
static inline float row_max(const float *p, int64_t len) {
    float lanes[LANES];
    for (int l = 0; l < LANES; l++) lanes[l] = p[0];
    int64_t c = 0;
    for (; c + LANES <= len; c += LANES)
        for (int l = 0; l < LANES; l++) lanes[l] = p[c + l] > lanes[l] ? p[c + l] : lanes[l];
    float top = lanes[0];
    for (int l = 1; l < LANES; l++) top = lanes[l] > top ? lanes[l] : top;
    for (; c < len; c++) top = p[c] > top ? p[c] : top;
    return top;
}

/* softmax over p[0..len), len >= 1, in place: exp(p - max) / their sum */
static void softmax(float *p, int64_t len) {
    float top = row_max(p, len);
    for (int64_t col = 0; col < len; col++) p[col] = exp_f32(p[col] - top);
    float inv = 1.0f / sum(p, len);
    for (int64_t col = 0; col < len; col++) p[col] *= inv;
}

typedef struct {
    float *qkv, *out, *keys, *values;
    const float *cos, *sin;
    const int64_t *positions, *slots;
    int64_t heads, kv_heads, d, slot_stride, head_stride, col_stride;
    float scale;
} Attention;

/* Ask for the cache lines row `row` writes its k and v into: they are cold (a column no step has touched). */
static inline void prefetch_write(const Attention *a, int64_t row) {
    int64_t b = a->slots ? a->slots[row] : row, column = b * a->slot_stride + a->positions[row] * a->col_stride;
    for (int64_t j = 0; j < a->kv_heads; j++)
        for (int64_t byte = 0; byte < a->d * 4; byte += 64) {
            PREFETCH_FOR_WRITE((const char *)(a->keys + column + j * a->head_stride) + byte);
            PREFETCH_FOR_WRITE((const char *)(a->values + column + j * a->head_stride) + byte);
        }
}

/* Ask the L2 for columns [from, to) of slot b, at most the first PREFETCHED of them. A decode step's rows each read
 * a few short runs of columns no step has touched since the last, too short for the core's own prefetcher to get
 * going on: in the engine the attention kernel spent most of its time waiting on them. */
#define PREFETCHED 32
static inline void prefetch_columns(const Attention *a, int64_t b, int64_t from, int64_t to) {
    to = to < from + PREFETCHED ? to : from + PREFETCHED;
    for (int64_t c = from; c < to; c++)
        for (int64_t j = 0; j < a->kv_heads; j++) {
            int64_t at = b * a->slot_stride + j * a->head_stride + c * a->col_stride;
            for (int64_t byte = 0; byte < a->d * 4; byte += 64) {
                PREFETCH_TO_L2((const char *)(a->keys + at) + byte);
                PREFETCH_TO_L2((const char *)(a->values + at) + byte);
            }
        }
}

/* Rotate row `row`'s q and k by its position's tables and write its k and v into its slot's column. */
static void rotate_and_write(const Attention *a, int64_t row) {
    int64_t d = a->d, b = a->slots ? a->slots[row] : row, pos = a->positions[row];
    float *q = a->qkv + row * (a->heads + 2 * a->kv_heads) * d, *k = q + a->heads * d, *v = k + a->kv_heads * d;
    for (int64_t h = 0; h < a->heads + a->kv_heads; h++) rotate(q + h * d, a->cos + pos * d, a->sin + pos * d, d);
    for (int64_t j = 0; j < a->kv_heads; j++) {
        float *K = a->keys + b * a->slot_stride + j * a->head_stride + pos * a->col_stride;
        float *V = a->values + b * a->slot_stride + j * a->head_stride + pos * a->col_stride;
        for (int64_t t = 0; t < d; t++) {
            K[t] = k[j * d + t];
            V[t] = v[j * d + t];
        }
    }
}

/* Row `row` (already rotated and written) attends with each q head over columns 0..positions[row] of its kv head,
 * those below `cut` read from slot `from`, into row `at` of out; two heads of a group a pass (they share the pass's
 * loads). */
static void attend_row(const Attention *a, int64_t row, int64_t at, int64_t from, int64_t cut, float *scratch) {
    int64_t d = a->d, group = a->heads / a->kv_heads, b = a->slots ? a->slots[row] : row, len = a->positions[row] + 1;
    const float *q = a->qkv + row * (a->heads + 2 * a->kv_heads) * d;
    for (int64_t j = 0; j < a->kv_heads; j++) {
        const float *K = a->keys + b * a->slot_stride + j * a->head_stride;
        const float *V = a->values + b * a->slot_stride + j * a->head_stride;
        const float *Kf = a->keys + from * a->slot_stride + j * a->head_stride;
        const float *Vf = a->values + from * a->slot_stride + j * a->head_stride;
        const float *Q = q + j * group * d;
        for (int64_t g = 0; g < group; g += 2) {
            int pair = g + 1 < group ? 2 : 1;
            scores(Q + g * d, pair, Kf, 0, cut, d, a->col_stride, a->scale, scratch + g * len, len);
            scores(Q + g * d, pair, K, cut, len, d, a->col_stride, a->scale, scratch + g * len, len);
        }
        float *O = a->out + (at * a->heads + j * group) * d;
        for (int64_t g = 0; g < group; g++) {
            softmax(scratch + g * len, len);
            for (int64_t t = 0; t < d; t++) O[g * d + t] = 0.0f;
        }
        for (int64_t g = 0; g < group; g += 2) {
            int pair = g + 1 < group ? 2 : 1;
            weighted(scratch + g * len, pair, len, Vf, 0, cut, d, a->col_stride, O + g * d);
            weighted(scratch + g * len, pair, len, V, cut, len, d, a->col_stride, O + g * d);
        }
    }
}

/* For each row i < n, taken in `order` (NULL: 0..n-1), of slot b = slots[i] (NULL: b = i): rotate its q and k
 * (row i of qkv [n, (heads + 2 kv heads) d], in place) by the tables' row positions[i], write k and v into column
 * positions[i] of slot b (keys/values: slot b, kv head j, column c at b * slot_stride + j * head_stride + c *
 * col_stride), then attend with each q head over columns 0..positions[i] of its kv head; out [n, heads d]. Rows
 * of one slot (a prefill's tokens) are taken in the order of their positions, so each sees the columns written
 * before it.
 * Columns below shared[i] are read from slot source[i], which holds the same values (a GRPO group's prompt, held
 * by one of its slots): rows that share a source are taken one after another, so those columns come
 * from the cache once a group, not once a row (NULL: none shared). While a row attends, the kernel asks for the
 * next row's write column and the L2 for the columns the row after next reads (and for the weights `next` names).
 * scratch holds (heads / kv heads) * (max position + 1) floats. */
/* Everything inlined into the row loop: with attend_row called from two kernels GCC 12 left scores, softmax and
 * weighted as calls, and that build ran the recipe's generate at 0.94x of this one (medians of 16, one process). */
__attribute__((flatten))
static void attend_rows(float *qkv, const float *cos, const float *sin, const int64_t *positions,
                        const int64_t *slots, const int64_t *order, const int64_t *source, const int64_t *shared,
                        float *keys, float *values, float *out, float *scratch, int64_t n, int64_t heads,
                        int64_t kv_heads, int64_t d, int64_t slot_stride, int64_t head_stride, int64_t col_stride,
                        float scale, Ahead *next) {
    Attention a = {qkv, out, keys, values, cos, sin, positions, slots, heads, kv_heads, d, slot_stride, head_stride,
                   col_stride, scale};
#define ROW(i) (order ? order[i] : (i))
#define SLOT(row) (slots ? slots[row] : (row))
#define SOURCE(row) (source ? source[row] : SLOT(row))
    for (int64_t i = 0; i < n; i++) {
        int64_t row = ROW(i), len = positions[row] + 1, cut = shared ? shared[row] : 0;
        if (i + 1 < n) prefetch_write(&a, ROW(i + 1));
        if (i + 2 < n) {  /* the columns the row after next reads, where the row before it reads others */
            int64_t ahead = ROW(i + 2), before = ROW(i + 1), ahead_cut = shared ? shared[ahead] : 0;
            if (SLOT(ahead) != SLOT(before)) prefetch_columns(&a, SLOT(ahead), ahead_cut, positions[ahead]);
            if (SOURCE(ahead) != SOURCE(before)) prefetch_columns(&a, SOURCE(ahead), 0, ahead_cut);
        }
        rotate_and_write(&a, row);
        pull(next);
        attend_row(&a, row, row, SOURCE(row), cut < len ? cut : len, scratch);
    }
#undef ROW
#undef SLOT
#undef SOURCE
}

void rope_attend(float *qkv, const float *cos, const float *sin, const int64_t *positions, const int64_t *slots,
                 const int64_t *order, const int64_t *source, const int64_t *shared, float *keys, float *values,
                 float *out, float *scratch, int64_t n, int64_t heads, int64_t kv_heads, int64_t d,
                 int64_t slot_stride, int64_t head_stride, int64_t col_stride, float scale) {
    attend_rows(qkv, cos, sin, positions, slots, order, source, shared, keys, values, out, scratch, n, heads,
                kv_heads, d, slot_stride, head_stride, col_stride, scale, NULL);
}

/* rope_attend for a chunk whose outputs are wanted for `kept` rows only (a prefill: each prompt's last token):
 * every row rotated and written (later tokens read its k and v), then the kept rows (increasing, any repeated)
 * attend, kept[j]'s output into row j of out [m, heads d]. No row reads another slot's columns here. */
static void rope_attend_kept(float *qkv, const float *cos, const float *sin, const int64_t *positions,
                             const int64_t *slots, float *keys, float *values, float *out, float *scratch, int64_t n,
                             const int64_t *kept, int64_t m, int64_t heads, int64_t kv_heads, int64_t d,
                             int64_t slot_stride, int64_t head_stride, int64_t col_stride, float scale, Ahead *next) {
    Attention a = {qkv, out, keys, values, cos, sin, positions, slots, heads, kv_heads, d, slot_stride, head_stride,
                   col_stride, scale};
    for (int64_t i = 0; i < n; i++) rotate_and_write(&a, i);
    for (int64_t j = 0; j < m; j++) {
        int64_t row = kept[j];
        pull(next);
        attend_row(&a, row, j, slots ? slots[row] : row, 0, scratch);
    }
}

/* The BLAS sgemm_ torch's CPU library exports (MKL's), column-major with Fortran arguments. Its integers are
 * passed as pointers to int64: an LP64 BLAS reads their low half, which on a little-endian machine is the value,
 * and an ILP64 one reads them whole. */
typedef void (*sgemm_fn)(const char *transa, const char *transb, const int64_t *m, const int64_t *n,
                         const int64_t *k, const float *alpha, const float *a, const int64_t *lda, const float *b,
                         const int64_t *ldb, const float *beta, float *c, const int64_t *ldc);

/* out [n, rows] = x [n, cols] . w [rows, cols]^T (+ bias [rows]) as torch's F.linear computes it on the CPU (the
 * bias copied into each row, then the same sgemm_ call adding the product to it), so the results are the same
 * bits. */
static void linear(sgemm_fn gemm, const float *x, const float *w, const float *bias, float *out, int64_t n,
                   int64_t rows, int64_t cols) {
    float one = 1.0f, beta = 0.0f;
    if (bias) {
        for (int64_t i = 0; i < n; i++) memcpy(out + i * rows, bias, rows * sizeof(float));
        beta = 1.0f;
    }
    gemm("T", "N", &rows, &n, &cols, &one, w, &cols, x, &cols, &beta, out, &rows);
}

/* The layers' multiplies, where the machine has AVX-512: each weight packed once (and again after new weights) into
 * panels of PANEL output rows, [panels][cols][PANEL] (the last panel's missing rows zero), and multiplied by a
 * kernel that holds a tile of up to 12 input rows x PANEL outputs in 24 registers, broadcasting each input row's
 * k-th value against the panel's k-th line. MKL's sgemm_ re-packed the weights on every call: against it, this
 * made a generate of the recipe's requests 1.13x faster at 64 rows, 1.06x at 128, 1.04x at 256 (one process, the
 * same tokens), 108 against 93 GFLOP/s at the layers' shapes in a hot loop. Each output is one fused multiply-add
 * chain over k in order from zero, then + bias: the same bits for a row whatever the other rows (sgemm_ rounds
 * differently below four rows); this machine's MKL gives the same bits for cols <= 128 from four rows on, and
 * blocks longer sums. Without AVX-512 the layers multiply through `gemm` as torch's F.linear does. */
#define PANEL 32

#if defined(__AVX512F__)
int64_t packed_panel(void) { return PANEL; }

/* w [rows, cols] row-major into p [ceil(rows / PANEL)][cols][PANEL]. */
void pack_weight(const float *w, float *p, int64_t rows, int64_t cols) {
    for (int64_t j0 = 0; j0 < rows; j0 += PANEL)
        for (int64_t k = 0; k < cols; k++)
            for (int64_t j = 0; j < PANEL; j++)
                p[j0 * cols + k * PANEL + j] = j0 + j < rows ? w[(j0 + j) * cols + k] : 0.0f;
}

/* Rows x[0..R) (ldx apart) against one panel into out (ldo apart), `lanes` masking the panel's two halves. */
#define PANEL_TILE(R)                                                                                            \
    static inline void panel_tile_##R(const float *x, int64_t ldx, const float *panel, int64_t cols,           \
                                      const float *bias, float *out, int64_t ldo, __mmask16 lo, __mmask16 hi) { \
        __m512 acc[R][2];                                                                                        \
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();                                 \
        for (int64_t k = 0; k < cols; k++) {                                                                     \
            __m512 w0 = _mm512_loadu_ps(panel + k * PANEL), w1 = _mm512_loadu_ps(panel + k * PANEL + 16);        \
            for (int r = 0; r < R; r++) {                                                                        \
                __m512 a = _mm512_set1_ps(x[r * ldx + k]);                                                       \
                acc[r][0] = _mm512_fmadd_ps(a, w0, acc[r][0]);                                                   \
                acc[r][1] = _mm512_fmadd_ps(a, w1, acc[r][1]);                                                   \
            }                                                                                                    \
        }                                                                                                        \
        __m512 b0 = bias ? _mm512_maskz_loadu_ps(lo, bias) : _mm512_setzero_ps();                                \
        __m512 b1 = bias ? _mm512_maskz_loadu_ps(hi, bias + 16) : _mm512_setzero_ps();                           \
        for (int r = 0; r < R; r++) {                                                                            \
            _mm512_mask_storeu_ps(out + r * ldo, lo, bias ? _mm512_add_ps(acc[r][0], b0) : acc[r][0]);          \
            _mm512_mask_storeu_ps(out + r * ldo + 16, hi, bias ? _mm512_add_ps(acc[r][1], b1) : acc[r][1]);     \
        }                                                                                                        \
    }
PANEL_TILE(12)
PANEL_TILE(4)
PANEL_TILE(1)

/* out [n, rows] = x [n, cols] . w^T (+ bias [rows]), w packed by pack_weight; ROW_BLOCK input rows at a time
 * through every panel, so that they stay near while the panels go by (1.01-1.02x on a generate at 128 and 256
 * rows against all rows a panel). */
#define ROW_BLOCK 96
void linear_packed(const float *x, const float *packed, const float *bias, float *out, int64_t n, int64_t rows,
                   int64_t cols) {
    for (int64_t i0 = 0; i0 < n; i0 += ROW_BLOCK) {
        int64_t end = n - i0 < ROW_BLOCK ? n : i0 + ROW_BLOCK;
        for (int64_t j0 = 0; j0 < rows; j0 += PANEL) {
            int64_t valid = rows - j0 < PANEL ? rows - j0 : PANEL;
            __mmask16 lo = valid >= 16 ? 0xFFFF : (__mmask16)((1u << valid) - 1);
            __mmask16 hi = valid >= PANEL ? 0xFFFF : valid > 16 ? (__mmask16)((1u << (valid - 16)) - 1) : 0;
            const float *panel = packed + j0 * cols, *b = bias ? bias + j0 : NULL;
            float *o = out + j0;
            int64_t i = i0;
            for (; i + 12 <= end; i += 12) panel_tile_12(x + i * cols, cols, panel, cols, b, o + i * rows, rows, lo, hi);
            for (; i + 4 <= end; i += 4) panel_tile_4(x + i * cols, cols, panel, cols, b, o + i * rows, rows, lo, hi);
            for (; i < end; i++) panel_tile_1(x + i * cols, cols, panel, cols, b, o + i * rows, rows, lo, hi);
        }
    }
}

#else
int64_t packed_panel(void) { return 0; }
void pack_weight(const float *w, float *p, int64_t rows, int64_t cols) { (void)w, (void)p, (void)rows, (void)cols; }
void linear_packed(const float *x, const float *packed, const float *bias, float *out, int64_t n, int64_t rows,
                   int64_t cols) {
    (void)x, (void)packed, (void)bias, (void)out, (void)n, (void)rows, (void)cols;
}

#endif

/* A layer's multiply: by the packed kernel where its weights were packed (decode_layers' `packed`), else through
 * `gemm` as torch's F.linear (w as the model holds it). */
static inline void layer_linear(sgemm_fn gemm, int64_t packed, const float *x, const float *w, const float *bias,
                                float *out, int64_t n, int64_t rows, int64_t cols) {
    if (packed)
        linear_packed(x, w, bias, out, n, rows, cols);
    else
        linear(gemm, x, w, bias, out, n, rows, cols);
}

/* The floats a layer's weight of rows x cols takes as its multiply reads it (packed: whole panels). */
static inline int64_t weight_floats(int64_t packed, int64_t rows, int64_t cols) {
    return (packed ? (rows + PANEL - 1) / PANEL * PANEL : rows) * cols;
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
#define AT(address) ((const float *)(intptr_t)(address))

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
