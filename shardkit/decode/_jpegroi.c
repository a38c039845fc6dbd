/*
 * _jpegroi: region-of-interest JPEG decoding with libjpeg-turbo's libjpeg API.
 *
 * Decodes only the rows and (iMCU-aligned) columns of a crop window, at a DCT scale of M/8,
 * straight to RGB, using jpeg_crop_scanline() + jpeg_skip_scanlines() (libjpeg-turbo >= 1.5,
 * see libjpeg-turbo's libjpeg.txt, "Partial image decompression") and scale_num/scale_denom
 * (libjpeg-turbo's jdmaster.c: output size = ceil(image_size * M / 8)). Rows below the window
 * are never entropy-decoded: decompression is aborted once the window is read.
 *
 * Exactness: the window equals the same window of a full decode at the same scale, also with
 * chroma subsampling. jpeg_crop_scanline() makes the upsampler treat the cropped columns as the
 * whole image, so fancy (triangle) horizontal upsampling replicates the chroma at the crop's
 * first and last columns instead of reading its neighbours (up to ~35 levels off on 4:2:2 and
 * 4:2:0). When a component is upsampled horizontally with fancy upsampling, roi_window()
 * therefore decodes ROI_EDGE_CONTEXT more columns on each side (clamped to the image), at least
 * ROI_MIN_FANCY_COLUMNS in all, and cuts the window out of them. Rows need nothing:
 * jpeg_skip_scanlines() decodes the context row group above the window for fancy vertical
 * upsampling (4:2:0 is exact in tests/test_decode.py, 4:4:0 was checked too), and rows below the
 * window are read as in a full decode.
 *
 * Errors use a setjmp/longjmp error manager (libjpeg's example.c pattern); warnings are
 * counted (and the last one kept) instead of printed. The GIL is released while libjpeg runs.
 *
 * Untrusted input: every decode caps the number of scans (ROI_DEFAULT_MAX_SCANS, TurboJPEG's
 * limit: a crafted progressive file repeats scans to cost minutes of CPU; the progress monitor
 * stops it at scan max_scans + 1) and the memory libjpeg may take (cinfo->mem->max_memory_to_use,
 * and before that a check of the whole-image coefficient buffer a multi-scan file needs, about 2
 * bytes per sample), each refused with a RuntimeError naming the limit.
 *
 * Library floor: jpeg_skip_scanlines() and jpeg_crop_scanline() had crash fixes in 1.5.3 and
 * 2.0.6 (CVE-2017-15232, CVE-2020-35538). Built against an older libjpeg-turbo, the module still
 * imports (header(), resize() and whole-image decodes work) but ROI_SAFE is 0 and a window or
 * crop_resize() raises RuntimeError; shardkit/decode/roi.py then reports the ROI decoder as
 * unavailable, so "auto" falls back to the next decoder with one warning. Headers of another
 * libjpeg (IJG, no LIBJPEG_TURBO_VERSION) stop the build with #error (setup.py skips the
 * extension there, printing why).
 *
 * Python API (wrapped by shardkit/decode/roi.py):
 *   header(data) -> (width, height, num_components, jpeg_color_space, progressive)
 *   decode(data, x, y, w, h, scale_num, flags[, max_scans, max_memory])
 *       -> (bytearray of h*w*3 RGB bytes, (n_warnings, last_warning or None), scaled_w, scaled_h)
 *     x, y, w, h: window in *scaled* pixel coordinates; w <= 0 or h <= 0 means the whole image.
 *     scale_num: M in 1..8 (scale M/8). flags: 1 = JDCT_IFAST, 2 = no fancy upsampling.
 *     max_scans (>= 1; default ROI_DEFAULT_MAX_SCANS), max_memory (bytes libjpeg may allocate,
 *     >= 1 MiB; default ROI_DEFAULT_MAX_MEMORY).
 *   Raises ValueError for a bad window, scale or limit, RuntimeError("libjpeg: ...") for fatal
 *   errors, RuntimeError for a file over a limit or a window below the library floor.
 *   resize(src, src_w, src_h, (x0, y0, x1, y1), out, out_w, out_h, flip, filter) -> None
 *     Pillow-exact resize of a float box of a packed RGB buffer into a packed RGB buffer.
 *   crop_resize(data, x, y, w, h, scale_num, flags, box, out, out_w, out_h, flip, filter
 *               [, max_scans, max_memory])
 *       -> (n_warnings, last_warning or None): decode() of the window, then resize() of the
 *       box (window coordinates) into out, in one call without the GIL.
 *   simd_level() -> (level in use, best level supported here): SIMD_SCALAR, SIMD_SSE41 or
 *       SIMD_AVX2 (the resize's horizontal pass; see _resample.h).
 *   _set_simd(level) -> level now in use (min(level, best)); for tests only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

#include "_resample.h"

#ifndef LIBJPEG_TURBO_VERSION
#error "shardkit's _jpegroi needs libjpeg-turbo's headers (jconfig.h defines LIBJPEG_TURBO_VERSION); this jpeglib.h is another libjpeg (IJG?). Install libjpeg-turbo's (Debian: libjpeg62-turbo-dev, Ubuntu: libjpeg-turbo8-dev)."
#endif
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 1005000
#error "shardkit's _jpegroi needs libjpeg-turbo >= 1.5 (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

/* jpeg_skip_scanlines / jpeg_crop_scanline crash fixes: 1.5.3 (CVE-2017-15232) on the 1.5 branch
 * (1.5.90 is 2.0 beta1), 2.0.6 (CVE-2020-35538) on the 2.x line */
#if LIBJPEG_TURBO_VERSION_NUMBER >= 2000006 || \
    (LIBJPEG_TURBO_VERSION_NUMBER >= 1005003 && LIBJPEG_TURBO_VERSION_NUMBER < 1005090)
#define ROI_SAFE 1
#else
#define ROI_SAFE 0
#endif
#define ROI_FLOOR "libjpeg-turbo 2.0.6 (or 1.5.3 on the 1.5 branch)"
#define ROI_STR2(x) #x
#define ROI_STR(x) ROI_STR2(x)

/* untrusted input: TurboJPEG's scan limit, and what a progressive 4-component image of
 * shardkit's default pixel limit (89.5 MP) needs (8 bytes per pixel) with room to spare */
#define ROI_DEFAULT_MAX_SCANS 500
#define ROI_DEFAULT_MAX_MEMORY ((Py_ssize_t)768 << 20)
#define ROI_MIN_MEMORY ((Py_ssize_t)1 << 20)

#define ROI_FAST_DCT 1
#define ROI_FAST_UPSAMPLE 2

/* Extra columns decoded on each side of a window whose chroma is upsampled horizontally with
 * fancy upsampling (libjpeg-turbo's jdsample.c h2v1/h2v2_fancy_upsample, and the SIMD ones).
 * Counting from the crop start, output pixel 2k blends chroma samples k-1 and k, pixel 2k+1
 * blends k and k+1, and a missing sample is replaced by the crop's first or last one. So only
 * the crop's first pixel (no sample -1) and, when the crop's width is even, its last pixel (no
 * sample k+1) differ from a full decode. The crop starts on an iMCU boundary, even whenever 2x
 * fancy upsampling applies (iMCU width = 2 * h_samp_factor * DCT scaled size): one more column
 * on the left puts the crop start left of the window, one more on the right gives the window's
 * last pixel its sample k+1. Cost: one more iMCU column in about 1 window of 8 (4:2:0 at full
 * scale): the train transform +0.7-1.0% per sample on 4:2:0 and 4:2:2 re-encodes of the flowers
 * sample, none on 4:4:4 (benchmarks/bench_decode.py --compare-ext). */
#define ROI_EDGE_CONTEXT 1

/* ... and at least this many columns: libjpeg-turbo (jdsample.c, jinit_upsampler) upsamples 2x
 * with the fancy filter only when a component has more than 2 samples per row, and
 * jpeg_crop_scanline() re-initialises the upsampler when the crop leaves fewer than 2: a crop of
 * 1-4 columns could switch 4:2:0 to box upsampling (rows off by up to 6 levels). 5 columns keep
 * 3 chroma samples. */
#define ROI_MIN_FANCY_COLUMNS 5

#if JPEG_LIB_VERSION >= 70
#define ROI_DCT_H(c) ((c)->DCT_h_scaled_size)
#define ROI_MIN_DCT_H(ci) ((ci)->min_DCT_h_scaled_size)
#else
#define ROI_DCT_H(c) ((c)->DCT_scaled_size)
#define ROI_MIN_DCT_H(ci) ((ci)->min_DCT_scaled_size)
#endif

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int n_warnings;
    int limited; /* 1: error is shardkit's (a limit or the floor), not libjpeg's */
    char last_warning[JMSG_LENGTH_MAX];
    char error[JMSG_LENGTH_MAX + 160];
} roi_error_mgr;

/* the limits of one decode */
typedef struct {
    int max_scans;
    Py_ssize_t max_memory;
} roi_limits;

typedef struct {
    struct jpeg_progress_mgr pub;
    int max_scans;
} roi_progress_mgr;

/* called by libjpeg at every iMCU row while it absorbs a multi-scan file: stops at scan
 * max_scans + 1 (libjpeg-turbo's turbojpeg.c does the same with its scan limit) */
static void roi_progress(j_common_ptr cinfo) {
    roi_progress_mgr *prog = (roi_progress_mgr *)cinfo->progress;
    if (cinfo->is_decompressor &&
        ((j_decompress_ptr)cinfo)->input_scan_number > prog->max_scans) {
        roi_error_mgr *err = (roi_error_mgr *)cinfo->err;
        snprintf(err->error, sizeof(err->error),
                 "the JPEG has more than %d scans (the limit; a progressive file needs about 10, "
                 "more is a crafted or broken file)", prog->max_scans);
        err->limited = 1;
        longjmp(err->jump, 1);
    }
}

static void roi_error_exit(j_common_ptr cinfo) {
    roi_error_mgr *err = (roi_error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->error);
    if (cinfo->err->msg_code == JERR_NO_BACKING_STORE) { /* over mem->max_memory_to_use */
        snprintf(err->error, sizeof(err->error),
                 "the JPEG needs more than the %ld-byte memory limit to decode",
                 (long)cinfo->mem->max_memory_to_use);
        err->limited = 1;
    }
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
    err->limited = 0;
    err->last_warning[0] = '\0';
    err->error[0] = '\0';
}

static PyObject *roi_header(PyObject *self, PyObject *args) {
    Py_buffer buf;
    struct jpeg_decompress_struct cinfo;
    roi_error_mgr err;
    volatile int ok = 0;
    volatile long width = 0, height = 0, comps = 0, cs = 0, prog = 0;
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

/* 1 when some component is upsampled horizontally (its scaled width is not the output's, after
 * jpeg_calc_output_dimensions: libjpeg-turbo upscales chroma in the IDCT where it can, e.g. 4:2:0
 * at scales below 1) with fancy upsampling: then cropped columns need ROI_EDGE_CONTEXT. */
static int roi_h_fancy(const struct jpeg_decompress_struct *cinfo) {
    int ci;
    if (!cinfo->do_fancy_upsampling) return 0;
    for (ci = 0; ci < cinfo->num_components; ci++) {
        const jpeg_component_info *c = &cinfo->comp_info[ci];
        if (c->h_samp_factor * ROI_DCT_H(c) != cinfo->max_h_samp_factor * ROI_MIN_DCT_H(cinfo))
            return 1;
    }
    return 0;
}

/* bytes of the whole-image coefficient buffer libjpeg keeps for a multi-scan file (jdcoefct.c:
 * one JBLOCK per block, rows and columns rounded up to the sampling factors) */
static size_t roi_coef_bytes(const struct jpeg_decompress_struct *cinfo) {
    size_t total = 0;
    int ci;
    for (ci = 0; ci < cinfo->num_components; ci++) {
        const jpeg_component_info *c = &cinfo->comp_info[ci];
        size_t bw = ((size_t)c->width_in_blocks + c->h_samp_factor - 1) / c->h_samp_factor *
                    c->h_samp_factor;
        size_t bh = ((size_t)c->height_in_blocks + c->v_samp_factor - 1) / c->v_samp_factor *
                    c->v_samp_factor;
        total += bw * bh * sizeof(JBLOCK);
    }
    return total;
}

/* Inside the caller's setjmp block: reads the header of data, refuses (longjmp, err->limited) a
 * multi-scan JPEG whose coefficients exceed lim->max_memory when check_coef, and sets the RGB
 * output at scale m/8 with flags' DCT and upsampling; *sw, *sh receive the scaled size. */
static void roi_start(struct jpeg_decompress_struct *cinfo, const unsigned char *data,
                      size_t len, int m, int flags, int check_coef, roi_error_mgr *err,
                      long *sw, long *sh, const roi_limits *lim) {
    jpeg_mem_src(cinfo, data, (unsigned long)len);
    jpeg_read_header(cinfo, TRUE);
    if (check_coef && jpeg_has_multiple_scans(cinfo) &&
        roi_coef_bytes(cinfo) > (size_t)lim->max_memory) {
        snprintf(err->error, sizeof(err->error),
                 "the %ux%u %s JPEG needs %zu bytes of coefficient memory, over the "
                 "%zd-byte memory limit", cinfo->image_width, cinfo->image_height,
                 cinfo->progressive_mode ? "progressive" : "multi-scan",
                 roi_coef_bytes(cinfo), lim->max_memory);
        err->limited = 1;
        longjmp(err->jump, 1);
    }
    cinfo->out_color_space = JCS_EXT_RGB;
    cinfo->scale_num = (unsigned int)m;
    cinfo->scale_denom = 8;
    cinfo->dct_method = (flags & ROI_FAST_DCT) ? JDCT_IFAST : JDCT_ISLOW;
    cinfo->do_fancy_upsampling = (flags & ROI_FAST_UPSAMPLE) ? FALSE : TRUE;
    jpeg_calc_output_dimensions(cinfo);
    *sw = cinfo->output_width;
    *sh = cinfo->output_height;
}

/* Decode window (x, y, w, h) (scaled coordinates; w <= 0 or h <= 0: whole image) at scale m/8
 * into dst (w*h*3 bytes), or, when dst is NULL, only report the scaled size, within the limits
 * *lim. Runs without the GIL. Returns 0 on success, 1 on an error (err->error: libjpeg's, or a
 * limit when err->limited), 2 for a window outside the image, 3 when out of memory, 4 for a
 * window below the library floor (!ROI_SAFE). *sw, *sh receive the scaled image size. */
static int roi_window(const unsigned char *data, size_t len, long x, long y, long w, long h,
                      int m, int flags, unsigned char *dst, roi_error_mgr *err, long *sw,
                      long *sh, const roi_limits *lim) {
    struct jpeg_decompress_struct cinfo;
    roi_progress_mgr prog;
    unsigned char *volatile row = NULL;
    volatile int rc = 1;
    roi_init(&cinfo, err);
    jpeg_create_decompress(&cinfo);
    prog.pub.progress_monitor = roi_progress;
    prog.max_scans = lim->max_scans;
    cinfo.progress = &prog.pub;
    cinfo.mem->max_memory_to_use = (long)lim->max_memory;
    if (setjmp(err->jump) == 0) {
        roi_start(&cinfo, data, len, m, flags, dst != NULL, err, sw, sh, lim);
        {
            /* the window, resolved in block locals (not live across the longjmp) */
            long X = x, Y = y, W = w, H = h;
            if (W <= 0 || H <= 0) { X = 0; Y = 0; W = *sw; H = *sh; }
            if (X < 0 || Y < 0 || X + W > *sw || Y + H > *sh) {
                rc = 2;
            } else if (!dst) {
                rc = 0;
            } else if (!ROI_SAFE && (Y > 0 || W < *sw || H < *sh)) {
                rc = 4; /* a window needs jpeg_skip_scanlines / jpeg_crop_scanline */
            } else if (!(row = (unsigned char *)malloc((size_t)*sw * 3 + 64))) {
                rc = 3;
            } else {
                /* decoded columns [c0, c1): the window, plus context where fancy upsampling
                 * would otherwise replicate chroma at the crop edges (see ROI_EDGE_CONTEXT) */
                long ctx = roi_h_fancy(&cinfo) ? ROI_EDGE_CONTEXT : 0;
                long c0 = X - ctx < 0 ? 0 : X - ctx, c1 = X + W + ctx > *sw ? *sw : X + W + ctx;
                if (ctx && c1 - c0 < ROI_MIN_FANCY_COLUMNS) { /* see ROI_MIN_FANCY_COLUMNS */
                    c1 = c0 + ROI_MIN_FANCY_COLUMNS > *sw ? *sw : c0 + ROI_MIN_FANCY_COLUMNS;
                    c0 = c1 - ROI_MIN_FANCY_COLUMNS < 0 ? 0 : c1 - ROI_MIN_FANCY_COLUMNS;
                }
                JDIMENSION xoff = (JDIMENSION)c0, cw = (JDIMENSION)(c1 - c0);
                long shift, r;
                jpeg_start_decompress(&cinfo);
                if (cw < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &cw);
                shift = X - (long)xoff; /* decoded columns left of X (iMCU alignment, context) */
                if (Y > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)Y);
                for (r = 0; r < H; r++) {
                    JSAMPROW rows[1];
                    unsigned char *d = dst + (size_t)r * W * 3;
                    rows[0] = (shift == 0 && (long)cw == W) ? d : row;
                    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1)
                        memset(rows[0], 0, (size_t)cw * 3); /* impossible with a memory source */
                    if (rows[0] == row) memcpy(d, row + shift * 3, (size_t)W * 3);
                }
                rc = 0;
            }
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
    if (rc == 4)
        return PyErr_Format(PyExc_RuntimeError,
                            "ROI decoding is disabled: built against libjpeg-turbo %s, below "
                            ROI_FLOOR " (jpeg_skip_scanlines / jpeg_crop_scanline crash fixes, "
                            "CVE-2017-15232, CVE-2020-35538)",
                            ROI_STR(LIBJPEG_TURBO_VERSION));
    if (err->limited) return PyErr_Format(PyExc_RuntimeError, "%s", err->error);
    return PyErr_Format(PyExc_RuntimeError, "libjpeg: %s", err->error);
}

/* checks the optional limits of decode() / crop_resize(); -1 with ValueError when bad */
static int roi_check_limits(roi_limits *lim) {
    if (lim->max_scans < 1 || lim->max_memory < ROI_MIN_MEMORY || lim->max_memory > LONG_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "limits: max_scans=%d (expected >= 1), max_memory=%zd (expected %zd..%ld "
                     "bytes)", lim->max_scans, lim->max_memory, ROI_MIN_MEMORY, LONG_MAX);
        return -1;
    }
    return 0;
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
    roi_limits lim = {ROI_DEFAULT_MAX_SCANS, ROI_DEFAULT_MAX_MEMORY};
    PyObject *out, *warn;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*llllii|in", &buf, &x, &y, &w, &h, &m, &flags, &lim.max_scans,
                          &lim.max_memory))
        return NULL;
    if (roi_check_limits(&lim) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (m < 1 || m > 8) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "scale_num must be in 1..8 (scale M/8), got %d", m);
    }
    if (w <= 0 || h <= 0) { /* whole image: learn its scaled size first */
        Py_BEGIN_ALLOW_THREADS
        rc = roi_window(buf.buf, (size_t)buf.len, 0, 0, 0, 0, m, flags, NULL, &err, &sw, &sh,
                        &lim);
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
                    (unsigned char *)PyByteArray_AS_STRING(out), &err, &sw, &sh, &lim);
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
        box[3] <= sh && box[0] < box[2] && box[1] < box[3]) || !RS_FILTER_OK(filter)) {
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
    roi_limits lim = {ROI_DEFAULT_MAX_SCANS, ROI_DEFAULT_MAX_MEMORY};
    unsigned char *tmp;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*llllii(ffff)w*iiii|in", &buf, &x, &y, &w, &h, &m, &flags,
                          &box[0], &box[1], &box[2], &box[3], &dst, &ow, &oh, &flip, &filter,
                          &lim.max_scans, &lim.max_memory))
        return NULL;
    if (roi_check_limits(&lim) < 0) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (m < 1 || m > 8 || w < 1 || h < 1 || ow < 1 || oh < 1 ||
        dst.len != (Py_ssize_t)ow * oh * 3 || !(box[0] >= 0 && box[1] >= 0 && box[2] <= w &&
        box[3] <= h && box[0] < box[2] && box[1] < box[3]) || !RS_FILTER_OK(filter)) {
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
        rc = roi_window(buf.buf, (size_t)buf.len, x, y, w, h, m, flags, tmp, &err, &sw, &sh,
                        &lim);
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

/* Whole image at scale m/8 straight into dst (exactly w*h*3 bytes, the scaled size), several
 * scanlines per jpeg_read_scanlines call; then, when out is not NULL, the box of window
 * (rx, ry, rw, rh) of those pixels (cropped first: the filter reads nothing outside the window,
 * as after a window decode) resized into out (ow x oh) by rs_resize. Runs without the GIL.
 * Returns as roi_window, plus 5 when the scaled size is not w x h. */
#define ROI_WHOLE_ROWS 16
static int roi_whole(const unsigned char *data, size_t len, int m, int flags, unsigned char *dst,
                     long w, long h, roi_error_mgr *err, long *sw, long *sh,
                     const roi_limits *lim) {
    struct jpeg_decompress_struct cinfo;
    roi_progress_mgr prog;
    volatile int rc = 1;
    roi_init(&cinfo, err);
    jpeg_create_decompress(&cinfo);
    prog.pub.progress_monitor = roi_progress;
    prog.max_scans = lim->max_scans;
    cinfo.progress = &prog.pub;
    cinfo.mem->max_memory_to_use = (long)lim->max_memory;
    if (setjmp(err->jump) == 0) {
        roi_start(&cinfo, data, len, m, flags, 1, err, sw, sh, lim);
        if (*sw != w || *sh != h) {
            rc = 5;
        } else {
            JSAMPROW rows[ROI_WHOLE_ROWS];
            jpeg_start_decompress(&cinfo);
            while (cinfo.output_scanline < cinfo.output_height) {
                JDIMENSION at = cinfo.output_scanline, k, n = cinfo.output_height - at, got;
                if (n > ROI_WHOLE_ROWS) n = ROI_WHOLE_ROWS;
                for (k = 0; k < n; k++) rows[k] = dst + (size_t)(at + k) * w * 3;
                got = jpeg_read_scanlines(&cinfo, rows, n);
                if (got == 0) { /* impossible with a memory source */
                    memset(dst + (size_t)at * w * 3, 0, (size_t)(h - at) * w * 3);
                    break;
                }
            }
            rc = 0;
        }
    }
    jpeg_destroy_decompress(&cinfo);
    return rc;
}

static PyObject *roi_decode_into(PyObject *self, PyObject *args) {
    Py_buffer buf, dst, out = {0};
    PyObject *outobj = Py_None;
    long w, h, sw = 0, sh = 0, rx = 0, ry = 0, rw = 0, rh = 0;
    int m, flags, ow = 0, oh = 0, flip = 0, filter = 0, rc;
    float box[4] = {0, 0, 0, 0};
    roi_error_mgr err;
    roi_limits lim = {ROI_DEFAULT_MAX_SCANS, ROI_DEFAULT_MAX_MEMORY};
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*llii|(llll)(ffff)Oiiiiin", &buf, &dst, &w, &h, &m, &flags,
                          &rx, &ry, &rw, &rh, &box[0], &box[1], &box[2], &box[3], &outobj,
                          &ow, &oh, &flip, &filter, &lim.max_scans, &lim.max_memory))
        return NULL;
    if (outobj != Py_None &&
        PyObject_GetBuffer(outobj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&dst);
        return NULL;
    }
    if (roi_check_limits(&lim) < 0) goto fail;
    if (m < 1 || m > 8 || w < 1 || h < 1 || dst.len != (Py_ssize_t)w * h * 3 ||
        (outobj != Py_None && (ow < 1 || oh < 1 || out.len != (Py_ssize_t)ow * oh * 3 ||
         rx < 0 || ry < 0 || rw < 1 || rh < 1 || rx + rw > w || ry + rh > h ||
         !(box[0] >= 0 && box[1] >= 0 && box[2] <= rw && box[3] <= rh && box[0] < box[2] &&
           box[1] < box[3]) || !RS_FILTER_OK(filter)))) {
        PyErr_Format(PyExc_ValueError,
                     "decode_into: bad arguments (dst %ldx%ld with %zd bytes, scale %d/8, window "
                     "%ld,%ld %ldx%ld, box %.3f,%.3f,%.3f,%.3f, out %dx%d, filter %d)", w, h,
                     dst.len, m, rx, ry, rw, rh, box[0], box[1], box[2], box[3], ow, oh, filter);
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = roi_whole(buf.buf, (size_t)buf.len, m, flags, (unsigned char *)dst.buf, w, h, &err, &sw,
                   &sh, &lim);
    if (rc == 0 && outobj != Py_None) {
        const unsigned char *src = (const unsigned char *)dst.buf + ((size_t)ry * w + rx) * 3;
        unsigned char *tmp = NULL;
        if (rw != w) { /* a packed copy of the window */
            long r;
            tmp = (unsigned char *)malloc((size_t)rw * rh * 3);
            if (tmp)
                for (r = 0; r < rh; r++)
                    memcpy(tmp + (size_t)r * rw * 3, src + (size_t)r * w * 3, (size_t)rw * 3);
            src = tmp;
        }
        if (!src || rs_resize(src, (int)rw, (int)rh, box, (unsigned char *)out.buf, ow, oh, flip,
                              filter))
            rc = 3;
        free(tmp);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyBuffer_Release(&dst);
    if (outobj != Py_None) PyBuffer_Release(&out);
    if (rc == 5)
        return PyErr_Format(PyExc_ValueError, "decode_into: the image is %ldx%ld at scale %d/8, "
                            "dst is %ldx%ld", sw, sh, m, w, h);
    if (rc) return roi_fail(rc, &err, 0, 0, w, h, sw, sh);
    return roi_warnings(&err);
fail:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&dst);
    if (outobj != Py_None) PyBuffer_Release(&out);
    return NULL;
}

static PyObject *roi_simd_level(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return Py_BuildValue("(ii)", rs_simd_get(), rs_simd_best());
}

static PyObject *roi_set_simd(PyObject *self, PyObject *args) {
    int level;
    (void)self;
    if (!PyArg_ParseTuple(args, "i", &level)) return NULL;
    return PyLong_FromLong(rs_simd_set(level));
}

static PyMethodDef roi_methods[] = {
    {"header", roi_header, METH_VARARGS,
     "header(data) -> (width, height, num_components, jpeg_color_space, progressive)"},
    {"decode", roi_decode, METH_VARARGS,
     "decode(data, x, y, w, h, scale_num, flags[, max_scans, max_memory]) -> (bytearray, "
     "(n_warnings, last_warning), scaled_w, scaled_h); window in scaled coordinates, w<=0 or "
     "h<=0 = whole image"},
    {"crop_resize", roi_crop_resize, METH_VARARGS,
     "crop_resize(data, x, y, w, h, scale_num, flags, (bx0, by0, bx1, by1), out, out_w, out_h, "
     "flip, filter[, max_scans, max_memory]) -> (n_warnings, last_warning): decode the window, "
     "then resize() its box into out"},
    {"decode_into", roi_decode_into, METH_VARARGS,
     "decode_into(data, dst, w, h, scale_num, flags[, (rx, ry, rw, rh), (bx0, by0, bx1, by1), "
     "out, out_w, out_h, flip, filter, max_scans, max_memory]) -> (n_warnings, last_warning): "
     "the whole image (scaled size w x h) into dst, then (out given) resize() the box of window "
     "r of it into out"},
    {"resize", roi_resize, METH_VARARGS,
     "resize(src, src_w, src_h, (x0, y0, x1, y1), out, out_w, out_h, flip, filter) -> None; "
     "Pillow-exact RGB resize of box into out (filter: PIL BOX=4, BILINEAR=2, BICUBIC=3)"},
    {"simd_level", roi_simd_level, METH_NOARGS,
     "simd_level() -> (level in use, best supported): SIMD_SCALAR | SIMD_SSE41 | SIMD_AVX2"},
    {"_set_simd", roi_set_simd, METH_VARARGS,
     "_set_simd(level) -> level in use, min(level, best supported); tests only (not while "
     "another thread resizes)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef roi_module = {PyModuleDef_HEAD_INIT, "_jpegroi",
                                        "ROI JPEG decoding with libjpeg-turbo (see roi.py)", -1,
                                        roi_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jpegroi(void) {
    PyObject *m = PyModule_Create(&roi_module);
    if (!m) return NULL;
    PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER", LIBJPEG_TURBO_VERSION_NUMBER);
    PyModule_AddIntConstant(m, "ROI_SAFE", ROI_SAFE);
    PyModule_AddStringConstant(m, "ROI_FLOOR", ROI_FLOOR);
    PyModule_AddIntConstant(m, "DEFAULT_MAX_SCANS", ROI_DEFAULT_MAX_SCANS);
    PyModule_AddIntConstant(m, "DEFAULT_MAX_MEMORY", (long)ROI_DEFAULT_MAX_MEMORY);
    PyModule_AddIntConstant(m, "FAST_DCT", ROI_FAST_DCT);
    PyModule_AddIntConstant(m, "FAST_UPSAMPLE", ROI_FAST_UPSAMPLE);
    PyModule_AddIntConstant(m, "SIMD_SCALAR", RS_SIMD_SCALAR);
    PyModule_AddIntConstant(m, "SIMD_SSE41", RS_SIMD_SSE41);
    PyModule_AddIntConstant(m, "SIMD_AVX2", RS_SIMD_AVX2);
    rs_simd_init(); /* CPU feature detection, once per process */
    return m;
}
