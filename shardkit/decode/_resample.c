/*
 * _resample.c: Pillow-exact resize for shardkit's _jpegroi extension (linked into it; interface
 * and filter codes in _resample.h).
 *
 * Pillow's two-pass separable convolution (Pillow 13 src/libImaging/Resample.c:
 * precompute_coeffs, normalize_coeffs_8bpc, ImagingResample{Horizontal,Vertical}_8bpc,
 * ImagingResampleInner's pass order), for packed RGB uint8, with the same float box, the same
 * 22-bit fixed point and rounding, writing straight into a caller buffer with an optional
 * horizontal flip. Output equals Image.resize(size, filter, box) (mirrored when flipped) bit for
 * bit; tests/test_decode.py checks it.
 *
 * Portability: the scalar C code below builds on every architecture (aarch64, ppc64le, ...).
 * The hand-written SSE4.1 / AVX2 horizontal passes and the AVX2 vertical pass are compiled only
 * for x86 with GCC or clang (compile-time guard RS_X86; AVX2 needs x86-64) and chosen at run
 * time from the CPU's features (rs_simd_init). They do the same integer arithmetic in vector
 * lanes, so every path gives the same bytes (tests/test_cext.py compares them, and compiles
 * this file with the x86 macros undefined to keep the scalar-only build honest).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "_resample.h"

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define RS_X86 1
#include <immintrin.h>
#if defined(__x86_64__)
#define RS_X86_64 1 /* the AVX2 path uses 64-bit moves (_mm_cvtsi64_si128) */
#endif
#endif

#define RS_PRECISION_BITS (32 - 8 - 2)

static double rs_filter(int filter, double x) {
    if (filter == RS_BOX) return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0;
    if (x < 0.0) x = -x;
    if (filter == RS_BILINEAR) return x < 1.0 ? 1.0 - x : 0.0;
    /* bicubic, a = -0.5 */
    if (x < 1.0) return ((-0.5 + 2.0) * x - (-0.5 + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * -0.5;
    return 0.0;
}

static double rs_support(int filter) {
    return filter == RS_BOX ? 0.5 : filter == RS_BILINEAR ? 1.0 : 2.0;
}

/* Returns ksize (0 on allocation failure); *bounds: (min, count) per output; *kk: fixed point. */
static int rs_coeffs(int in_size, float in0, float in1, int out_size, int filter, int **boundsp,
                     int **kkp) {
    double support, scale, filterscale, center, ww, ss;
    int xx, x, ksize, xmin, xmax;
    int *bounds, *kk;
    double *k;
    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0) filterscale = 1.0;
    support = rs_support(filter) * filterscale;
    ksize = (int)ceil(support) * 2 + 1;
    k = (double *)malloc((size_t)ksize * sizeof(double));
    kk = (int *)malloc((size_t)out_size * ksize * sizeof(int));
    bounds = (int *)malloc((size_t)out_size * 2 * sizeof(int));
    if (!k || !kk || !bounds) { free(k); free(kk); free(bounds); return 0; }
    for (xx = 0; xx < out_size; xx++) {
        center = in0 + (xx + 0.5) * scale;
        ww = 0.0;
        ss = 1.0 / filterscale;
        xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        if (xmax < 0) xmax = 0;
        for (x = 0; x < xmax; x++) {
            double w = rs_filter(filter, (x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (x = 0; x < ksize; x++) {
            double v = 0.0;
            if (x < xmax) v = (ww != 0.0) ? k[x] / ww : k[x];
            kk[xx * ksize + x] = v < 0 ? (int)(-0.5 + v * (1 << RS_PRECISION_BITS))
                                       : (int)(0.5 + v * (1 << RS_PRECISION_BITS));
        }
        bounds[xx * 2] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    free(k);
    *boundsp = bounds;
    *kkp = kk;
    return ksize;
}

static inline unsigned char rs_clip8(int v) {
    v >>= RS_PRECISION_BITS;
    return (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* GCC on x86 + glibc: let the compiler also emit an AVX2 clone of the plain loops, picked by
 * ifunc at load time (integer arithmetic: same bytes). musl has no ifunc; clang has no need. */
#if defined(RS_X86) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
#define RS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RS_CLONES
#endif

/* Horizontal pass: rows x (sw -> ow) pixels; src row r is src + r * sw * 3. */
RS_CLONES static void rs_hpass(const unsigned char *src, int sw, int rows, const int *bh,
                               const int *kh, int ksh, unsigned char *dst, int ow, int flip) {
    int yy, xx, x;
    for (yy = 0; yy < rows; yy++) {
        const unsigned char *row = src + (size_t)yy * sw * 3;
        unsigned char *drow = dst + (size_t)yy * ow * 3;
        for (xx = 0; xx < ow; xx++) {
            const int *k = kh + xx * ksh;
            const unsigned char *p = row + (size_t)bh[xx * 2] * 3;
            int n = bh[xx * 2 + 1];
            int s0 = 1 << (RS_PRECISION_BITS - 1), s1 = s0, s2 = s0;
            unsigned char *q = drow + (size_t)(flip ? ow - 1 - xx : xx) * 3;
            for (x = 0; x < n; x++) {
                s0 += p[x * 3] * k[x];
                s1 += p[x * 3 + 1] * k[x];
                s2 += p[x * 3 + 2] * k[x];
            }
            q[0] = rs_clip8(s0);
            q[1] = rs_clip8(s1);
            q[2] = rs_clip8(s2);
        }
    }
}

#ifdef RS_X86
/* The same horizontal pass, one pixel (R, G, B, next byte ignored) per 4-lane int32 vector:
 * identical integer arithmetic, so identical output. Pixels whose 4-byte load would pass the
 * end of the buffer use the scalar code. */
__attribute__((target("sse4.1"))) static void rs_hpass_sse41(
    const unsigned char *src, int sw, int rows, const int *bh, const int *kh, int ksh,
    unsigned char *dst, int ow, int flip) {
    int yy, xx, x;
    const unsigned char *end = src + (size_t)rows * sw * 3;
    const __m128i half = _mm_set1_epi32(1 << (RS_PRECISION_BITS - 1));
    for (yy = 0; yy < rows; yy++) {
        const unsigned char *row = src + (size_t)yy * sw * 3;
        unsigned char *drow = dst + (size_t)yy * ow * 3;
        for (xx = 0; xx < ow; xx++) {
            const int *k = kh + xx * ksh;
            const unsigned char *p = row + (size_t)bh[xx * 2] * 3;
            int n = bh[xx * 2 + 1];
            unsigned char *q = drow + (size_t)(flip ? ow - 1 - xx : xx) * 3;
            if (p + (size_t)n * 3 + 1 <= end) {
                __m128i acc = half;
                int o;
                for (x = 0; x < n; x++) {
                    int v;
                    memcpy(&v, p + x * 3, 4);
                    acc = _mm_add_epi32(
                        acc, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(v)),
                                             _mm_set1_epi32(k[x])));
                }
                acc = _mm_srai_epi32(acc, RS_PRECISION_BITS);
                acc = _mm_packs_epi32(acc, acc);
                acc = _mm_packus_epi16(acc, acc);
                o = _mm_cvtsi128_si32(acc);
                memcpy(q, &o, 3);
            } else {
                int s0 = 1 << (RS_PRECISION_BITS - 1), s1 = s0, s2 = s0;
                for (x = 0; x < n; x++) {
                    s0 += p[x * 3] * k[x];
                    s1 += p[x * 3 + 1] * k[x];
                    s2 += p[x * 3 + 2] * k[x];
                }
                q[0] = rs_clip8(s0);
                q[1] = rs_clip8(s1);
                q[2] = rs_clip8(s2);
            }
        }
    }
}
#endif /* RS_X86 */

#ifdef RS_X86_64
/* AVX2 variant: four rows at once (same taps for every row), two rows per 8-lane vector, one
 * pixel (R, G, B, 0) per 4 lanes. Where a pixel's taps lie in the 16 bytes from its first one
 * (at most 5 taps) and those bytes are inside the buffer, each row's 16 bytes are loaded once
 * and each tap's pixel is moved into the lanes by a byte shuffle; otherwise the taps are loaded
 * one by one. Same integer arithmetic as rs_hpass (integer sums: any order gives the same
 * value), hence identical output. Rows left over (rows % 4) and pixels whose loads would pass
 * the end of the buffer go to rs_hpass_sse41. */
#define RS_SHUFFLED_TAPS 5
__attribute__((target("avx2"))) static int rs_hpass_avx2(
    const unsigned char *src, int sw, int rows, const int *bh, const int *kh, int ksh,
    unsigned char *dst, int ow, int flip) {
    int yy, xx, x;
    size_t stride = (size_t)sw * 3, dstride = (size_t)ow * 3;
    const unsigned char *end = src + (size_t)rows * stride;
    const __m256i half = _mm256_set1_epi32(1 << (RS_PRECISION_BITS - 1));
    __m256i tap[RS_SHUFFLED_TAPS]; /* tap x: bytes 3x, 3x+1, 3x+2 of each 16 into lanes 0-2 */
    for (x = 0; x < RS_SHUFFLED_TAPS; x++) {
        signed char m[32];
        int b;
        for (b = 0; b < 32; b++) {
            const int lane = (b % 16) / 4, byte = b % 4;
            m[b] = (signed char)(byte == 0 && lane < 3 ? 3 * x + lane : -1);
        }
        tap[x] = _mm256_loadu_si256((const __m256i *)m);
    }
    for (yy = 0; yy + 4 <= rows; yy += 4) {
        const unsigned char *row = src + (size_t)yy * stride;
        unsigned char *drow = dst + (size_t)yy * dstride;
        for (xx = 0; xx < ow; xx++) {
            const int *k = kh + xx * ksh;
            const unsigned char *p = row + (size_t)bh[xx * 2] * 3;
            int n = bh[xx * 2 + 1];
            unsigned char *q = drow + (size_t)(flip ? ow - 1 - xx : xx) * 3;
            __m256i a01 = half, a23 = half;
            unsigned char o[32];
            if (n <= RS_SHUFFLED_TAPS && p + 3 * stride + 16 <= end) {
                const __m256i r01 = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                    _mm_loadu_si128((const __m128i *)(p + stride)), 1);
                const __m256i r23 = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + 2 * stride))),
                    _mm_loadu_si128((const __m128i *)(p + 3 * stride)), 1);
                for (x = 0; x < n; x++) {
                    const __m256i kv = _mm256_set1_epi32(k[x]);
                    a01 = _mm256_add_epi32(
                        a01, _mm256_mullo_epi32(_mm256_shuffle_epi8(r01, tap[x]), kv));
                    a23 = _mm256_add_epi32(
                        a23, _mm256_mullo_epi32(_mm256_shuffle_epi8(r23, tap[x]), kv));
                }
            } else {
                if (p + 3 * stride + (size_t)n * 3 + 1 > end) return yy; /* rest: the SSE path */
                for (x = 0; x < n; x++) {
                    unsigned int v0, v1, v2, v3;
                    const unsigned char *px = p + x * 3;
                    __m256i kv = _mm256_set1_epi32(k[x]);
                    memcpy(&v0, px, 4);
                    memcpy(&v1, px + stride, 4);
                    memcpy(&v2, px + 2 * stride, 4);
                    memcpy(&v3, px + 3 * stride, 4);
                    a01 = _mm256_add_epi32(a01, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                        _mm_cvtsi64_si128((long long)v0 | ((long long)v1 << 32))), kv));
                    a23 = _mm256_add_epi32(a23, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                        _mm_cvtsi64_si128((long long)v2 | ((long long)v3 << 32))), kv));
                }
            }
            /* both forms: the low 128 bits of a01 (a23) are row 0 (2), the high ones row 1 (3) */
            a01 = _mm256_srai_epi32(a01, RS_PRECISION_BITS);
            a23 = _mm256_srai_epi32(a23, RS_PRECISION_BITS);
            /* packs work per 128-bit lane: [r0 r1 | r2 r3] after the two packs -> bytes */
            a01 = _mm256_packs_epi32(a01, a23);   /* lane0: r0(4) r2(4); lane1: r1(4) r3(4) */
            a01 = _mm256_packus_epi16(a01, a01);  /* lane0: r0 r2 r0 r2; lane1: r1 r3 r1 r3 */
            _mm256_storeu_si256((__m256i *)o, a01);
            memcpy(q, o, 3);                      /* row 0 */
            memcpy(q + 2 * dstride, o + 4, 3);    /* row 2 */
            memcpy(q + dstride, o + 16, 3);       /* row 1 */
            memcpy(q + 3 * dstride, o + 20, 3);   /* row 3 */
        }
    }
    return yy;
}
#endif /* RS_X86_64 */

static int rs_level = -1, rs_best = -1; /* -1: not detected yet */

int rs_simd_init(void) {
    int best = RS_SIMD_SCALAR;
#ifdef RS_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.1")) best = RS_SIMD_SSE41;
#ifdef RS_X86_64
    if (best == RS_SIMD_SSE41 && __builtin_cpu_supports("avx2")) best = RS_SIMD_AVX2;
#endif
#endif
    rs_best = rs_level = best;
    return best;
}

int rs_simd_best(void) {
    if (rs_best < 0) rs_simd_init();
    return rs_best;
}

int rs_simd_set(int level) {
    int best = rs_simd_best();
    rs_level = level < RS_SIMD_SCALAR ? RS_SIMD_SCALAR : level > best ? best : level;
    return rs_level;
}

int rs_simd_get(void) { return rs_level < 0 ? rs_simd_best() : rs_level; }

static void rs_hpass_any(const unsigned char *src, int sw, int rows, const int *bh,
                         const int *kh, int ksh, unsigned char *dst, int ow, int flip) {
    int level = rs_level;
    if (level < 0) level = rs_simd_init();
#ifdef RS_X86_64
    if (level >= RS_SIMD_AVX2) {
        int done = rs_hpass_avx2(src, sw, rows, bh, kh, ksh, dst, ow, flip);
        src += (size_t)done * sw * 3;
        dst += (size_t)done * ow * 3;
        rows -= done;
    }
#endif
#ifdef RS_X86
    if (level >= RS_SIMD_SSE41) {
        rs_hpass_sse41(src, sw, rows, bh, kh, ksh, dst, ow, flip);
        return;
    }
#endif
    (void)level;
    rs_hpass(src, sw, rows, bh, kh, ksh, dst, ow, flip);
}

/* Vertical pass: output row yy = sum_k src row (bv[2yy] - y_off + k), width w pixels.
 * Accumulates whole rows (tap-major) so the compiler vectorises across pixels. */
RS_CLONES static void rs_vpass(const unsigned char *src, int w, int y_off, const int *bv,
                               const int *kv, int ksv, unsigned char *dst, int oh, int *acc) {
    int yy, xx, y;
    int n3 = w * 3;
    size_t stride = (size_t)n3;
    for (yy = 0; yy < oh; yy++) {
        const int *k = kv + yy * ksv;
        const unsigned char *base = src + (size_t)(bv[yy * 2] - y_off) * stride;
        int n = bv[yy * 2 + 1];
        unsigned char *q = dst + (size_t)yy * stride;
        for (xx = 0; xx < n3; xx++) acc[xx] = 1 << (RS_PRECISION_BITS - 1);
        for (y = 0; y < n; y++) {
            const unsigned char *r = base + (size_t)y * stride;
            int ky = k[y];
            for (xx = 0; xx < n3; xx++) acc[xx] += r[xx] * ky;
        }
        for (xx = 0; xx < n3; xx++) q[xx] = rs_clip8(acc[xx]);
    }
}

#ifdef RS_X86_64
/* rs_vpass with the taps innermost: 32 bytes of the output row at a time in four 8-lane int32
 * accumulators held in registers across the taps (the tap-major loop above loads and stores its
 * accumulator row once per tap), then narrowed as the AVX2 horizontal pass narrows (shift, then
 * signed and unsigned saturating packs: rs_clip8's clamp). The same integer sums in the same
 * lanes, so the same bytes (tests/test_cext.py). The last n3 % 32 bytes: rs_vpass's loop. */
__attribute__((target("avx2"))) static void rs_vpass_avx2(const unsigned char *src, int w,
                                                          int y_off, const int *bv,
                                                          const int *kv, int ksv,
                                                          unsigned char *dst, int oh) {
    const int n3 = w * 3;
    const size_t stride = (size_t)n3;
    const __m256i half = _mm256_set1_epi32(1 << (RS_PRECISION_BITS - 1));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int yy, xx, y;
    for (yy = 0; yy < oh; yy++) {
        const int *k = kv + yy * ksv;
        const unsigned char *base = src + (size_t)(bv[yy * 2] - y_off) * stride;
        const int n = bv[yy * 2 + 1];
        unsigned char *q = dst + (size_t)yy * stride;
        for (xx = 0; xx + 32 <= n3; xx += 32) {
            __m256i a0 = half, a1 = half, a2 = half, a3 = half;
            for (y = 0; y < n; y++) {
                const unsigned char *r = base + (size_t)y * stride + xx;
                const __m256i ky = _mm256_set1_epi32(k[y]);
                a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                                              _mm_loadl_epi64((const __m128i *)r)), ky));
                a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                                              _mm_loadl_epi64((const __m128i *)(r + 8))), ky));
                a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                                              _mm_loadl_epi64((const __m128i *)(r + 16))), ky));
                a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(
                                              _mm_loadl_epi64((const __m128i *)(r + 24))), ky));
            }
            /* packs work per 128-bit lane: the dwords come out as bytes 0-3, 8-11, 16-19,
             * 24-27 | 4-7, 12-15, 20-23, 28-31; the permute puts them in order */
            const __m256i p01 = _mm256_packs_epi32(_mm256_srai_epi32(a0, RS_PRECISION_BITS),
                                                   _mm256_srai_epi32(a1, RS_PRECISION_BITS));
            const __m256i p23 = _mm256_packs_epi32(_mm256_srai_epi32(a2, RS_PRECISION_BITS),
                                                   _mm256_srai_epi32(a3, RS_PRECISION_BITS));
            _mm256_storeu_si256((__m256i *)(q + xx), _mm256_permutevar8x32_epi32(
                                                         _mm256_packus_epi16(p01, p23), order));
        }
        for (; xx < n3; xx++) {
            int acc = 1 << (RS_PRECISION_BITS - 1);
            for (y = 0; y < n; y++) acc += base[(size_t)y * stride + xx] * k[y];
            q[xx] = rs_clip8(acc);
        }
    }
}
#endif /* RS_X86_64 */

static void rs_vpass_any(const unsigned char *src, int w, int y_off, const int *bv,
                         const int *kv, int ksv, unsigned char *dst, int oh, int *acc) {
#ifdef RS_X86_64
    int level = rs_level;
    if (level < 0) level = rs_simd_init();
    if (level >= RS_SIMD_AVX2) {
        rs_vpass_avx2(src, w, y_off, bv, kv, ksv, dst, oh);
        return;
    }
#endif
    rs_vpass(src, w, y_off, bv, kv, ksv, dst, oh, acc);
}

/* src: sh rows of sw packed RGB pixels; dst: oh rows of ow packed RGB pixels. 0 on success.
 * Pass order follows Pillow 13 (ImagingResampleInner): vertical first only when the height
 * shrinks by more than twice as many pixels as the width; otherwise horizontal first. */
int rs_resize(const unsigned char *src, int sw, int sh, const float box[4], unsigned char *dst,
              int ow, int oh, int flip, int filter) {
    int *bh = NULL, *kh = NULL, *bv = NULL, *kv = NULL;
    int ksh, ksv, y0, y1;
    int hfirst = !((sh - oh) > 0 && (sh - oh) > (sw - ow) * 2);
    unsigned char *tmp;
    ksv = rs_coeffs(sh, box[1], box[3], oh, filter, &bv, &kv);
    if (!ksv) return -1;
    ksh = rs_coeffs(sw, box[0], box[2], ow, filter, &bh, &kh);
    if (!ksh) { free(bv); free(kv); return -1; }
    if (hfirst) {
        y0 = bv[0];
        y1 = bv[oh * 2 - 2] + bv[oh * 2 - 1];
        if (y1 < y0 + 1) y1 = y0 + 1;
        size_t off = ((size_t)(y1 - y0) * ow * 3 + 15) & ~(size_t)15;
        tmp = (unsigned char *)malloc(off + (size_t)ow * 3 * sizeof(int));
        if (tmp) {
            int *acc = (int *)(tmp + off);
            rs_hpass_any(src + (size_t)y0 * sw * 3, sw, y1 - y0, bh, kh, ksh, tmp, ow, flip);
            rs_vpass_any(tmp, ow, y0, bv, kv, ksv, dst, oh, acc);
        }
    } else {
        size_t off = ((size_t)oh * sw * 3 + 15) & ~(size_t)15;
        tmp = (unsigned char *)malloc(off + (size_t)sw * 3 * sizeof(int));
        if (tmp) {
            int *acc = (int *)(tmp + off);
            rs_vpass_any(src, sw, 0, bv, kv, ksv, tmp, oh, acc);
            rs_hpass_any(tmp, sw, oh, bh, kh, ksh, dst, ow, flip);
        }
    }
    free(bh); free(kh); free(bv); free(kv);
    if (!tmp) return -1;
    free(tmp);
    return 0;
}

