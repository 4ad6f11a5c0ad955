/* Per row of a step or a prefill: the rotary embedding of q and k, the write of k and v into the row's slot, and
 * attention over that slot's own filled columns (a group's prompt read from the one slot holding it). */
#include "kernels.h"

/* A row's columns of one kv head: those below `cut` in the group's source slot, the rest in its own; column c's d
 * floats at column(cols, c). One pass over both, not one a slot: a row's sums do not depend on where the source's
 * columns end, and a row and head run one loop's blocks and exit instead of two. */
typedef struct {
    const float *source, *own;
    int64_t cut, stride;
} Columns;

static inline const float *column(const Columns *cols, int64_t c) {
    return (c < cols->cut ? cols->source : cols->own) + c * cols->stride;
}

#if defined(__AVX2__) && defined(__FMA__)
/* Columns [c, c + count) of scores (count <= 8): eight accumulators a head, one a column, reduced together by a tree
 * of hadds. A column's sum comes out the same wherever it falls in a block (the accumulators past count load column
 * c again and are not stored). */
static inline void score_block(const float *qs, int heads, const Columns *keys, int64_t c, int count, int64_t d,
                               __m256 scaled, float *out, int64_t stride) {
    const float *at[8];
    for (int l = 0; l < 8; l++) at[l] = column(keys, c + (l < count ? l : 0));
    __m256 a[2][8];
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 8; l++) a[h][l] = _mm256_setzero_ps();
    for (int64_t t = 0; t < d; t += 8) {
        __m256 q0 = _mm256_loadu_ps(qs + t), q1 = _mm256_loadu_ps(qs + (heads - 1) * d + t);
        for (int l = 0; l < 8; l++) {
            __m256 k = _mm256_loadu_ps(at[l] + t);
            a[0][l] = _mm256_fmadd_ps(q0, k, a[0][l]);
            if (heads == 2) a[1][l] = _mm256_fmadd_ps(q1, k, a[1][l]);
        }
    }
    __m256i stored = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int h = 0; h < heads; h++) {
        __m256 *b = a[h];
        __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(b[0], b[1]), _mm256_hadd_ps(b[2], b[3]));
        __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(b[4], b[5]), _mm256_hadd_ps(b[6], b[7]));
        __m256 total = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
        if (count == 8)
            _mm256_storeu_ps(out + h * stride + c, _mm256_mul_ps(total, scaled));
        else
            _mm256_maskstore_ps(out + h * stride + c, stored, _mm256_mul_ps(total, scaled));
    }
}
#endif

/* For q heads qs[0..heads) (heads 1 or 2, d floats apart) and columns [0, len): out[h * stride + c] = scale *
 * q_h . keys[c]. Two heads share each column's loads; each head's sums are those of one head alone, and a
 * column's the same wherever the source's columns end. */
static void scores(const float *qs, int heads, const Columns *keys, int64_t len, int64_t d, float scale, float *out,
                   int64_t stride) {
    int64_t c = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (d % 8 == 0) {
        __m256 scaled = _mm256_set1_ps(scale);
        for (; c + 8 <= len; c += 8) score_block(qs, heads, keys, c, 8, d, scaled, out, stride);
        if (c < len) score_block(qs, heads, keys, c, (int)(len - c), d, scaled, out, stride);
        return;
    }
#endif
    for (; c < len; c++)
        for (int h = 0; h < heads; h++) out[h * stride + c] = dot(qs + h * d, column(keys, c), d) * scale;
}

/* For heads h < heads (1 or 2): os[h * d ...] = sum over columns [0, len) of (ps[h * stride + c] * inv[h]) *
 * values[c], in column order. Two heads share each column's loads; each head's sums are those of one alone. */
static void weighted(const float *ps, const float *inv, int heads, int64_t stride, const Columns *values,
                     int64_t len, int64_t d, float *os) {
    int64_t t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; t + 32 <= d; t += 32) {  /* 32 outputs a head in four registers across the column loop */
        __m256 o[2][4];
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < 4; r++) o[h][r] = _mm256_setzero_ps();
        for (int64_t c = 0; c < len; c++) {
            const float *row = column(values, c) + t;
            __m256 v[4];
            for (int r = 0; r < 4; r++) v[r] = _mm256_loadu_ps(row + 8 * r);
            __m256 w0 = _mm256_set1_ps(ps[c] * inv[0]);
            for (int r = 0; r < 4; r++) o[0][r] = _mm256_fmadd_ps(w0, v[r], o[0][r]);
            if (heads == 2) {
                __m256 w1 = _mm256_set1_ps(ps[stride + c] * inv[1]);
                for (int r = 0; r < 4; r++) o[1][r] = _mm256_fmadd_ps(w1, v[r], o[1][r]);
            }
        }
        for (int h = 0; h < heads; h++)
            for (int r = 0; r < 4; r++) _mm256_storeu_ps(os + h * d + t + 8 * r, o[h][r]);
    }
#endif
    for (; t < d; t++)
        for (int h = 0; h < heads; h++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < len; c++)  /* fused as the vector path's: GCC would otherwise vectorize part of
                                                * the loop with the products rounded, at lengths of its choosing */
                acc = fmaf(ps[h * stride + c] * inv[h], column(values, c)[t], acc);
            os[h * d + t] = acc;
        }
}

/* Rotate `heads` heads (d floats apart, from x) by one position's tables, loaded once for all heads. Each output is
 * one fused multiply-add over a rounded product, a * cos - (b * sin) and b * cos + (a * sin), in either loop (the
 * bits the compiler's contraction of the plain expressions gave). */
static inline void rotate(float *restrict x, int64_t heads, const float *restrict cos, const float *restrict sin,
                          int64_t d) {
    int64_t half = d / 2, t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; t + 8 <= half; t += 8) {
        __m256 cos_lo = _mm256_loadu_ps(cos + t), sin_lo = _mm256_loadu_ps(sin + t);
        __m256 cos_hi = _mm256_loadu_ps(cos + half + t), sin_hi = _mm256_loadu_ps(sin + half + t);
        for (int64_t h = 0; h < heads; h++) {
            float *y = x + h * d;
            __m256 a = _mm256_loadu_ps(y + t), b = _mm256_loadu_ps(y + half + t);
            _mm256_storeu_ps(y + t, _mm256_fmsub_ps(a, cos_lo, _mm256_mul_ps(b, sin_lo)));
            _mm256_storeu_ps(y + half + t, _mm256_fmadd_ps(b, cos_hi, _mm256_mul_ps(a, sin_hi)));
        }
    }
#endif
    for (; t < half; t++)
        for (int64_t h = 0; h < heads; h++) {
            float *y = x + h * d, a = y[t], b = y[t + half];
            y[t] = fmaf(a, cos[t], -(b * sin[t]));
            y[t + half] = fmaf(b, cos[t + half], a * sin[t + half]);
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

/* Softmax's numerators in place, exp(p - max) over p[0..len), len >= 1, and 1 / their sum (summed as sum() sums):
 * the weighted sum scales each weight as it reads it, which saves a pass and gives the same bits. */
static float exponentiate(float *p, int64_t len) {
    float top = row_max(p, len), acc[LANES] = {0};
    int64_t c = 0;
    for (; c + LANES <= len; c += LANES)
        for (int l = 0; l < LANES; l++) {
            p[c + l] = exp_f32(p[c + l] - top);
            acc[l] += p[c + l];
        }
    float total = lanes_total(acc);
    for (; c < len; c++) {
        p[c] = exp_f32(p[c] - top);
        total += p[c];
    }
    return 1.0f / total;
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
    rotate(q, a->heads + a->kv_heads, a->cos + pos * d, a->sin + pos * d, d);
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
        int64_t head = j * a->head_stride, own = b * a->slot_stride + head, source = from * a->slot_stride + head;
        Columns K = {a->keys + source, a->keys + own, cut, a->col_stride};
        Columns V = {a->values + source, a->values + own, cut, a->col_stride};
        const float *Q = q + j * group * d;
        float *O = a->out + (at * a->heads + j * group) * d;
        for (int64_t g = 0; g < group; g += 2) {
            int pair = g + 1 < group ? 2 : 1;
            float inv[2];
            scores(Q + g * d, pair, &K, len, d, a->scale, scratch + g * len, len);
            for (int h = 0; h < pair; h++) inv[h] = exponentiate(scratch + (g + h) * len, len);
            weighted(scratch + g * len, inv, pair, len, &V, len, d, O + g * d);
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
/* Everything inlined into the row loop: with attend_row called from two kernels GCC 12 left scores, the softmax and
 * weighted as calls, and that build ran the recipe's generate at 0.94x of this one (medians of 16, one process). */
__attribute__((flatten))
INTERNAL void attend_rows(float *qkv, const float *cos, const float *sin, const int64_t *positions,
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
INTERNAL void rope_attend_kept(float *qkv, const float *cos, const float *sin, const int64_t *positions,
                               const int64_t *slots, float *keys, float *values, float *out, float *scratch,
                               int64_t n, const int64_t *kept, int64_t m, int64_t heads, int64_t kv_heads, int64_t d,
                               int64_t slot_stride, int64_t head_stride, int64_t col_stride, float scale,
                               Ahead *next) {
    Attention a = {qkv, out, keys, values, cos, sin, positions, slots, heads, kv_heads, d, slot_stride, head_stride,
                   col_stride, scale};
    for (int64_t i = 0; i < n; i++) rotate_and_write(&a, i);
    for (int64_t j = 0; j < m; j++) {
        int64_t row = kept[j];
        pull(next);
        attend_row(&a, row, j, slots ? slots[row] : row, 0, scratch);
    }
}
