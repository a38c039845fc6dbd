/*
 * _jpegroi: region-of-interest JPEG decoding with libjpeg-turbo's libjpeg API.
 *
 * Decodes only the rows and (iMCU-aligned) columns of a crop window, at a DCT scale of M/8,
 * straight to RGB, using jpeg_crop_scanline() + jpeg_skip_scanlines() (libjpeg-turbo >= 1.5,
 * see libjpeg-turbo's libjpeg.txt, "Partial image decompression") and scale_num/scale_denom
 * (libjpeg-turbo's jdmaster.c: output size = ceil(image_size * M / 8)). Rows below the window
 * are never entropy-decoded: decompression is aborted once the window is read.
 *
 * Errors use a setjmp/longjmp error manager (libjpeg's example.c pattern); warnings are
 * counted (and the last one kept) instead of printed. The GIL is released while libjpeg runs.
 *
 * Python API (wrapped by shardkit/decode/roi.py):
 *   header(data) -> (width, height, num_components, jpeg_color_space, progressive)
 *   decode(data, x, y, w, h, scale_num, flags)
 *       -> (bytearray of h*w*3 RGB bytes, (n_warnings, last_warning or None), scaled_w, scaled_h)
 *     x, y, w, h: window in *scaled* pixel coordinates; w <= 0 or h <= 0 means the whole image.
 *     scale_num: M in 1..8 (scale M/8). flags: 1 = JDCT_IFAST, 2 = no fancy upsampling.
 *   Raises ValueError for a bad window or scale, RuntimeError("libjpeg: ...") for fatal errors.
 *   resize(src, src_w, src_h, (x0, y0, x1, y1), out, out_w, out_h, flip, filter) -> None
 *     Pillow-exact resize of a float box of a packed RGB buffer into a packed RGB buffer.
 *   crop_resize(data, x, y, w, h, scale_num, flags, box, out, out_w, out_h, flip, filter)
 *       -> (n_warnings, last_warning or None): decode() of the window, then resize() of the
 *       box (window coordinates) into out, in one call without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <jpeglib.h>

#define ROI_FAST_DCT 1
#define ROI_FAST_UPSAMPLE 2

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int n_warnings;
    char last_warning[JMSG_LENGTH_MAX];
    char error[JMSG_LENGTH_MAX];
} roi_error_mgr;

static void roi_error_exit(j_common_ptr cinfo) {
    roi_error_mgr *err = (roi_error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->error);
    longjmp(err->jump, 1);
}

static void roi_emit_message(j_common_ptr cinfo, int msg_level) {
    roi_error_mgr *err = (roi_error_mgr *)cinfo->err;
    if (msg_level < 0) { /* a warning: count it, keep the text, never print */
        err->n_warnings++;
        cinfo->err->num_warnings++;
        (*cinfo->err->format_message)(cinfo, err->last_warning);
    }
}

static void roi_output_message(j_common_ptr cinfo) { (void)cinfo; }

static void roi_init(struct jpeg_decompress_struct *cinfo, roi_error_mgr *err) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = roi_error_exit;
    err->pub.emit_message = roi_emit_message;
    err->pub.output_message = roi_output_message;
    err->n_warnings = 0;
    err->last_warning[0] = '\0';
    err->error[0] = '\0';
}

static PyObject *roi_header(PyObject *self, PyObject *args) {
    Py_buffer buf;
    struct jpeg_decompress_struct cinfo;
    roi_error_mgr err;
    int ok = 0;
    long width = 0, height = 0, comps = 0, cs = 0, prog = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    roi_init(&cinfo, &err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump) == 0) {
        jpeg_mem_src(&cinfo, (const unsigned char *)buf.buf, (unsigned long)buf.len);
        jpeg_read_header(&cinfo, TRUE);
        width = cinfo.image_width;
        height = cinfo.image_height;
        comps = cinfo.num_components;
        cs = cinfo.jpeg_color_space;
        prog = cinfo.progressive_mode ? 1 : 0;
        ok = 1;
    }
    jpeg_destroy_decompress(&cinfo);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (!ok) return PyErr_Format(PyExc_RuntimeError, "libjpeg: %s", err.error);
    return Py_BuildValue("(lllll)", width, height, comps, cs, prog);
}

/* Decode window (x, y, w, h) (scaled coordinates; w <= 0 or h <= 0: whole image) at scale m/8
 * into dst (w*h*3 bytes), or, when dst is NULL, only report the scaled size. Runs without the
 * GIL. Returns 0 on success, 1 on a libjpeg error (err->error), 2 for a window outside the image,
 * 3 when out of memory. *sw, *sh receive the scaled image size. */
static int roi_window(const unsigned char *data, size_t len, long x, long y, long w, long h,
                      int m, int flags, unsigned char *dst, roi_error_mgr *err, long *sw,
                      long *sh) {
    struct jpeg_decompress_struct cinfo;
    unsigned char *volatile row = NULL;
    volatile int rc = 1;
    roi_init(&cinfo, err);
    jpeg_create_decompress(&cinfo);
    if (setjmp(err->jump) == 0) {
        jpeg_mem_src(&cinfo, data, (unsigned long)len);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.out_color_space = JCS_EXT_RGB;
        cinfo.scale_num = (unsigned int)m;
        cinfo.scale_denom = 8;
        cinfo.dct_method = (flags & ROI_FAST_DCT) ? JDCT_IFAST : JDCT_ISLOW;
        cinfo.do_fancy_upsampling = (flags & ROI_FAST_UPSAMPLE) ? FALSE : TRUE;
        jpeg_calc_output_dimensions(&cinfo);
        *sw = cinfo.output_width;
        *sh = cinfo.output_height;
        if (w <= 0 || h <= 0) { x = 0; y = 0; w = *sw; h = *sh; }
        if (x < 0 || y < 0 || x + w > *sw || y + h > *sh) {
            rc = 2;
        } else if (!dst) {
            rc = 0;
        } else if (!(row = (unsigned char *)malloc((size_t)*sw * 3 + 64))) {
            rc = 3;
        } else {
            JDIMENSION xoff = (JDIMENSION)x, cw = (JDIMENSION)w;
            long shift, r;
            jpeg_start_decompress(&cinfo);
            if (cw < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &cw);
            shift = x - (long)xoff; /* columns of the iMCU-aligned window left of x */
            if (y > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
            for (r = 0; r < h; r++) {
                JSAMPROW rows[1];
                unsigned char *d = dst + (size_t)r * w * 3;
                rows[0] = (shift == 0 && (long)cw == w) ? d : row;
                if (jpeg_read_scanlines(&cinfo, rows, 1) != 1)
                    memset(rows[0], 0, (size_t)cw * 3); /* cannot happen with a memory source */
                if (rows[0] == row) memcpy(d, row + shift * 3, (size_t)w * 3);
            }
            rc = 0;
        }
    }
    free(row);
    jpeg_destroy_decompress(&cinfo); /* also aborts an unfinished decompression */
    return rc;
}

static PyObject *roi_fail(int rc, roi_error_mgr *err, long x, long y, long w, long h, long sw,
                          long sh) {
    if (rc == 2)
        return PyErr_Format(PyExc_ValueError,
                            "window x=%ld y=%ld w=%ld h=%ld lies outside the %ldx%ld scaled image",
                            x, y, w, h, sw, sh);
    if (rc == 3) return PyErr_NoMemory();
    return PyErr_Format(PyExc_RuntimeError, "libjpeg: %s", err->error);
}

static PyObject *roi_warnings(roi_error_mgr *err) {
    if (err->n_warnings) return Py_BuildValue("(is)", err->n_warnings, err->last_warning);
    return Py_BuildValue("(iO)", 0, Py_None);
}

static PyObject *roi_decode(PyObject *self, PyObject *args) {
    Py_buffer buf;
    long x, y, w, h, sw = 0, sh = 0;
    int m, flags, rc;
    roi_error_mgr err;
    PyObject *out, *warn;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*llllii", &buf, &x, &y, &w, &h, &m, &flags)) return NULL;
    if (m < 1 || m > 8) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "scale_num must be in 1..8 (scale M/8), got %d", m);
    }
    if (w <= 0 || h <= 0) { /* whole image: learn its scaled size first */
        Py_BEGIN_ALLOW_THREADS
        rc = roi_window(buf.buf, (size_t)buf.len, 0, 0, 0, 0, m, flags, NULL, &err, &sw, &sh);
        Py_END_ALLOW_THREADS
        if (rc) {
            PyBuffer_Release(&buf);
            return roi_fail(rc, &err, x, y, w, h, sw, sh);
        }
        x = 0; y = 0; w = sw; h = sh;
    }
    if (w <= 0 || h <= 0 || x < 0 || y < 0) {
        PyBuffer_Release(&buf);
        return roi_fail(2, &err, x, y, w, h, sw, sh);
    }
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(w * h * 3));
    if (!out) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = roi_window(buf.buf, (size_t)buf.len, x, y, w, h, m, flags,
                    (unsigned char *)PyByteArray_AS_STRING(out), &err, &sw, &sh);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (rc) {
        Py_DECREF(out);
        return roi_fail(rc, &err, x, y, w, h, sw, sh);
    }
    warn = roi_warnings(&err);
    if (!warn) { Py_DECREF(out); return NULL; }
    return Py_BuildValue("(NNll)", out, warn, sw, sh);
}

/* ---------------------------------------------------------------------------------------------
 * resize(): Pillow's two-pass separable convolution resize (Pillow src/libImaging/Resample.c:
 * precompute_coeffs, normalize_coeffs_8bpc, ImagingResample{Horizontal,Vertical}_8bpc; same
 * float box, same 22-bit fixed point and rounding), for packed RGB uint8, writing straight into a
 * caller buffer with an optional horizontal flip. Output equals Image.resize(size, filter, box)
 * (then ImageOps.mirror when flipped) bit for bit; tested in tests/test_decode.py.
 * ------------------------------------------------------------------------------------------- */
#define RS_PRECISION_BITS (32 - 8 - 2)
#define RS_BOX 4
#define RS_BILINEAR 2
#define RS_BICUBIC 3

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

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__clang__)
#define RS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RS_CLONES
#endif

/* Horizontal pass: rows x (sw -> ow) pixels; src row r is src + r * sw * 3. */
RS_CLONES static void rs_hpass(const unsigned char *src, int sw, int rows, const int *bh, const int *kh,
                     int ksh, unsigned char *dst, int ow, int flip) {
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

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define RS_HAVE_SSE41_PATH 1
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
                    acc = _mm_add_epi32(acc, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(v)),
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
#endif

/* AVX2 variant: four rows at once (same taps for every row), two rows per 8-lane vector.
 * Same integer arithmetic as rs_hpass, hence identical output. Rows left over (rows % 4) and
 * pixels whose 4-byte loads would pass the end of the buffer go to rs_hpass_sse41. */
__attribute__((target("avx2"))) static int rs_hpass_avx2(
    const unsigned char *src, int sw, int rows, const int *bh, const int *kh, int ksh,
    unsigned char *dst, int ow, int flip) {
    int yy, xx, x;
    size_t stride = (size_t)sw * 3, dstride = (size_t)ow * 3;
    const unsigned char *end = src + (size_t)rows * stride;
    const __m256i half = _mm256_set1_epi32(1 << (RS_PRECISION_BITS - 1));
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

static void rs_hpass_any(const unsigned char *src, int sw, int rows, const int *bh,
                         const int *kh, int ksh, unsigned char *dst, int ow, int flip) {
#ifdef RS_HAVE_SSE41_PATH
    static int sse41 = -1, avx2 = -1;
    if (sse41 < 0) sse41 = __builtin_cpu_supports("sse4.1") ? 1 : 0;
    if (avx2 < 0) avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    if (avx2) {
        int done = rs_hpass_avx2(src, sw, rows, bh, kh, ksh, dst, ow, flip);
        src += (size_t)done * sw * 3;
        dst += (size_t)done * ow * 3;
        rows -= done;
    }
    if (sse41) {
        rs_hpass_sse41(src, sw, rows, bh, kh, ksh, dst, ow, flip);
        return;
    }
#endif
    rs_hpass(src, sw, rows, bh, kh, ksh, dst, ow, flip);
}

/* Vertical pass: output row yy = sum_k src row (bv[2yy] - y_off + k), width w pixels.
 * Accumulates whole rows (tap-major) so the compiler vectorises across pixels. */
RS_CLONES static void rs_vpass(const unsigned char *src, int w, int y_off, const int *bv, const int *kv,
                     int ksv, unsigned char *dst, int oh, int *acc) {
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

/* src: sh rows of sw packed RGB pixels; dst: oh rows of ow packed RGB pixels. 0 on success.
 * Pass order follows Pillow 13 (ImagingResampleInner): vertical first only when the height
 * shrinks by more than twice as many pixels as the width; otherwise horizontal first. */
static int rs_resize(const unsigned char *src, int sw, int sh, const float box[4],
                     unsigned char *dst, int ow, int oh, int flip, int filter) {
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
            rs_vpass(tmp, ow, y0, bv, kv, ksv, dst, oh, acc);
        }
    } else {
        size_t off = ((size_t)oh * sw * 3 + 15) & ~(size_t)15;
        tmp = (unsigned char *)malloc(off + (size_t)sw * 3 * sizeof(int));
        if (tmp) {
            int *acc = (int *)(tmp + off);
            rs_vpass(src, sw, 0, bv, kv, ksv, tmp, oh, acc);
            rs_hpass_any(tmp, sw, oh, bh, kh, ksh, dst, ow, flip);
        }
    }
    free(bh); free(kh); free(bv); free(kv);
    if (!tmp) return -1;
    free(tmp);
    return 0;
}

static PyObject *roi_resize(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    int sw, sh, ow, oh, flip, filter, rc;
    float box[4];
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ii(ffff)w*iiii", &src, &sw, &sh, &box[0], &box[1], &box[2],
                          &box[3], &dst, &ow, &oh, &flip, &filter))
        return NULL;
    if (sw < 1 || sh < 1 || ow < 1 || oh < 1 || src.len < (Py_ssize_t)sw * sh * 3 ||
        dst.len != (Py_ssize_t)ow * oh * 3 || !(box[0] >= 0 && box[1] >= 0 && box[2] <= sw &&
        box[3] <= sh && box[0] < box[2] && box[1] < box[3]) ||
        (filter != RS_BOX && filter != RS_BILINEAR && filter != RS_BICUBIC)) {
        PyErr_Format(PyExc_ValueError,
                     "resize: bad arguments (src %dx%d, %zd bytes; box %.3f,%.3f,%.3f,%.3f; "
                     "out %dx%d, %zd bytes; filter %d; expected packed RGB buffers, box inside "
                     "src, filter 2|3|4)", sw, sh, src.len, box[0], box[1], box[2], box[3], ow,
                     oh, dst.len, filter);
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = rs_resize((const unsigned char *)src.buf, sw, sh, box, (unsigned char *)dst.buf, ow, oh,
                   flip, filter);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *roi_crop_resize(PyObject *self, PyObject *args) {
    Py_buffer buf, dst;
    long x, y, w, h, sw = 0, sh = 0;
    int m, flags, ow, oh, flip, filter, rc;
    float box[4];
    roi_error_mgr err;
    unsigned char *tmp;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*llllii(ffff)w*iiii", &buf, &x, &y, &w, &h, &m, &flags,
                          &box[0], &box[1], &box[2], &box[3], &dst, &ow, &oh, &flip, &filter))
        return NULL;
    if (m < 1 || m > 8 || w < 1 || h < 1 || ow < 1 || oh < 1 ||
        dst.len != (Py_ssize_t)ow * oh * 3 || !(box[0] >= 0 && box[1] >= 0 && box[2] <= w &&
        box[3] <= h && box[0] < box[2] && box[1] < box[3]) ||
        (filter != RS_BOX && filter != RS_BILINEAR && filter != RS_BICUBIC)) {
        PyErr_Format(PyExc_ValueError,
                     "crop_resize: bad arguments (window %ldx%ld, scale %d/8, box %.3f,%.3f,%.3f,"
                     "%.3f, out %dx%d with %zd bytes, filter %d)", w, h, m, box[0], box[1],
                     box[2], box[3], ow, oh, dst.len, filter);
        PyBuffer_Release(&buf);
        PyBuffer_Release(&dst);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    tmp = (unsigned char *)malloc((size_t)w * h * 3);
    if (!tmp) {
        rc = 3;
    } else {
        rc = roi_window(buf.buf, (size_t)buf.len, x, y, w, h, m, flags, tmp, &err, &sw, &sh);
        if (rc == 0 && rs_resize(tmp, (int)w, (int)h, box, (unsigned char *)dst.buf, ow, oh,
                                 flip, filter))
            rc = 3;
        free(tmp);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyBuffer_Release(&dst);
    if (rc) return roi_fail(rc, &err, x, y, w, h, sw, sh);
    return roi_warnings(&err);
}

static PyMethodDef roi_methods[] = {
    {"header", roi_header, METH_VARARGS,
     "header(data) -> (width, height, num_components, jpeg_color_space, progressive)"},
    {"decode", roi_decode, METH_VARARGS,
     "decode(data, x, y, w, h, scale_num, flags) -> (bytearray, (n_warnings, last_warning), "
     "scaled_w, scaled_h); window in scaled coordinates, w<=0 or h<=0 = whole image"},
    {"crop_resize", roi_crop_resize, METH_VARARGS,
     "crop_resize(data, x, y, w, h, scale_num, flags, (bx0, by0, bx1, by1), out, out_w, out_h, "
     "flip, filter) -> (n_warnings, last_warning): decode the window, then resize() its box "
     "into out"},
    {"resize", roi_resize, METH_VARARGS,
     "resize(src, src_w, src_h, (x0, y0, x1, y1), out, out_w, out_h, flip, filter) -> None; "
     "Pillow-exact RGB resize of box into out (filter: PIL BOX=4, BILINEAR=2, BICUBIC=3)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef roi_module = {PyModuleDef_HEAD_INIT, "_jpegroi",
                                        "ROI JPEG decoding with libjpeg-turbo (see roi.py)", -1,
                                        roi_methods};

PyMODINIT_FUNC PyInit__jpegroi(void) {
    PyObject *m = PyModule_Create(&roi_module);
    if (!m) return NULL;
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER", LIBJPEG_TURBO_VERSION_NUMBER);
#else
    PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER", 0);
#endif
    PyModule_AddIntConstant(m, "FAST_DCT", ROI_FAST_DCT);
    PyModule_AddIntConstant(m, "FAST_UPSAMPLE", ROI_FAST_UPSAMPLE);
    return m;
}
