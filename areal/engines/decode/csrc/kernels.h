/* What the CPU decode kernels' sources share (see cpu_kernels.py): the prefetch instructions, the asks for the next
 * multiplies' weights, the exponential and the sums every kernel rounds alike, and the calls from one source to
 * another. attention.c: the rotary embedding, the K/V write and attention over each slot's own columns;
 * multiply.c: the layers' matrix multiplies; step.c: the norms, the activation, the layer loop, the draw and the
 * whole decode step. Torch ops at the tiny coder's size cost more to dispatch than to compute, and MKL's batched
 * multiply of a slot's two query heads against its keys runs at a few GFLOP/s: these loops do that arithmetic in
 * one pass each. */
#ifndef AREAL_DECODE_KERNELS_H
#define AREAL_DECODE_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define LANES 8

/* Prefetches the compiler keeps: GCC 12 deletes a loop of __builtin_prefetch as dead code when its bounds are read
 * through a pointer (it did so to the attention kernel's), so on x86-64 the instructions are written out. */
#if defined(__x86_64__)
#define PREFETCH_FOR_WRITE(p) __asm__ volatile("prefetchw %0" : : "m"(*(const char *)(p)))
#define PREFETCH_TO_L2(p) __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)(p)))
#else
#define PREFETCH_FOR_WRITE(p) __builtin_prefetch((p), 1)
#define PREFETCH_TO_L2(p) __builtin_prefetch((p), 0, 2)
#endif

/* Weights the next multiplies read, asked of the L2 a few lines a row by the loop that runs before them (attention
 * before o and gate_up, the activation before down and the next layer's qkv). A decode step's weights (3 MB at the
 * tiny coder's shape) do not stay in a 1 MiB L2 from one step to the next, so each multiply read its weights from
 * the L3 as it went (MKL's packing of them: 10 % of a 128-row generate, 3 % with them asked for ahead; the generate
 * 1.03-1.07x). Spread over the loop's first half, the asks overlap its work and the last lines arrive before it
 * ends. */
typedef struct {
    const char *at[2];
    int64_t left[2];   /* bytes still to ask for, of each region (whole lines) */
    int64_t per_row;   /* bytes to ask for a row of the loop (whole lines) */
} Ahead;

/* Regions a (a_floats) then b (b_floats; NULL for none), asked for a line at a time from the line each starts in,
 * over the first half of a loop of `rows` rows. */
static inline Ahead weights_ahead(const float *a, int64_t a_floats, const float *b, int64_t b_floats, int64_t rows) {
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

/* The lanes' partial sums added in the one order sum() and dot() use (a tail then adds to it term by term). */
static inline float lanes_total(const float *acc) {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static inline float sum(const float *a, int64_t d) {
    float acc[LANES] = {0};
    int64_t t = 0;
    for (; t + LANES <= d; t += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[t + l];
    float s = lanes_total(acc);
    for (; t < d; t++) s += a[t];
    return s;
}

static inline float dot(const float *a, const float *b, int64_t d) {
    float acc[LANES] = {0};
    int64_t t = 0;
    for (; t + LANES <= d; t += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[t + l] * b[t + l];
    float s = lanes_total(acc);
    for (; t < d; t++) s += a[t] * b[t];
    return s;
}

/* The BLAS sgemm_ torch's CPU library exports (MKL's), column-major with Fortran arguments. Its integers are
 * passed as pointers to int64: an LP64 BLAS reads their low half, which on a little-endian machine is the value,
 * and an ILP64 one reads them whole. */
typedef void (*sgemm_fn)(const char *transa, const char *transb, const int64_t *m, const int64_t *n,
                         const int64_t *k, const float *alpha, const float *a, const int64_t *lda, const float *b,
                         const int64_t *ldb, const float *beta, float *c, const int64_t *ldc);

#define PANEL 32  /* the output rows a packed weight's panel holds (multiply.c) */

/* The floats a layer's weight of rows x cols takes as its multiply reads it (packed: whole panels). */
static inline int64_t weight_floats(int64_t packed, int64_t rows, int64_t cols) {
    return (packed ? (rows + PANEL - 1) / PANEL * PANEL : rows) * cols;
}

#define AT(address) ((const float *)(intptr_t)(address))

/* Calls from one source to another, kept out of the library's exported symbols */
#define INTERNAL __attribute__((visibility("hidden")))

/* attention.c */
INTERNAL void attend_rows(float *qkv, const float *cos, const float *sin, const int64_t *positions,
                          const int64_t *slots, const int64_t *order, const int64_t *source, const int64_t *shared,
                          float *keys, float *values, float *out, float *scratch, int64_t n, int64_t heads,
                          int64_t kv_heads, int64_t d, int64_t slot_stride, int64_t head_stride, int64_t col_stride,
                          float scale, Ahead *next);
INTERNAL void rope_attend_kept(float *qkv, const float *cos, const float *sin, const int64_t *positions,
                               const int64_t *slots, float *keys, float *values, float *out, float *scratch,
                               int64_t n, const int64_t *kept, int64_t m, int64_t heads, int64_t kv_heads, int64_t d,
                               int64_t slot_stride, int64_t head_stride, int64_t col_stride, float scale,
                               Ahead *next);

/* multiply.c */
INTERNAL void linear(sgemm_fn gemm, const float *x, const float *w, const float *bias, float *out, int64_t n,
                     int64_t rows, int64_t cols);
INTERNAL void layer_linear(sgemm_fn gemm, int64_t packed, const float *x, const float *w, const float *bias,
                           float *out, int64_t n, int64_t rows, int64_t cols);

#endif
