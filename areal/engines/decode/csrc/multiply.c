/* The layers' matrix multiplies (and the head's): MKL's sgemm_ as torch's F.linear calls it, or the kernels' own
 * over packed weights where the machine has AVX-512. */
#include "kernels.h"

/* out [n, rows] = x [n, cols] . w [rows, cols]^T (+ bias [rows]) as torch's F.linear computes it on the CPU (the
 * bias copied into each row, then the same sgemm_ call adding the product to it), so the results are the same
 * bits. */
INTERNAL void linear(sgemm_fn gemm, const float *x, const float *w, const float *bias, float *out, int64_t n,
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

#if defined(__AVX512F__)
int64_t packed_panel(void) { return PANEL; }

/* w [rows, cols] row-major into p [ceil(rows / PANEL)][cols][PANEL]. */
void pack_weight(const float *w, float *p, int64_t rows, int64_t cols) {
    for (int64_t j0 = 0; j0 < rows; j0 += PANEL)
        for (int64_t k = 0; k < cols; k++)
            for (int64_t j = 0; j < PANEL; j++)
                p[j0 * cols + k * PANEL + j] = j0 + j < rows ? w[(j0 + j) * cols + k] : 0.0f;
}

/* Rows x[0..R) (ldx apart) against one panel into out (ldo apart), lo and hi masking the panel's two halves. */
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
            const float *p = packed + j0 * cols, *b = bias ? bias + j0 : NULL;
            float *o = out + j0;
            int64_t i = i0;
            for (; i + 12 <= end; i += 12) panel_tile_12(x + i * cols, cols, p, cols, b, o + i * rows, rows, lo, hi);
            for (; i + 4 <= end; i += 4) panel_tile_4(x + i * cols, cols, p, cols, b, o + i * rows, rows, lo, hi);
            for (; i < end; i++) panel_tile_1(x + i * cols, cols, p, cols, b, o + i * rows, rows, lo, hi);
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
INTERNAL void layer_linear(sgemm_fn gemm, int64_t packed, const float *x, const float *w, const float *bias,
                           float *out, int64_t n, int64_t rows, int64_t cols) {
    if (packed)
        linear_packed(x, w, bias, out, n, rows, cols);
    else
        linear(gemm, x, w, bias, out, n, rows, cols);
}
