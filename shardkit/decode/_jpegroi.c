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
 *       -> (bytearray of h*w*3 RGB bytes, n_warnings, last_warning or None, scaled_w, scaled_h)
 *     x, y, w, h: window in *scaled* pixel coordinates; w <= 0 or h <= 0 means the whole image.
 *     scale_num: M in 1..8 (scale M/8). flags: 1 = JDCT_IFAST, 2 = no fancy upsampling.
 *   Raises ValueError for a bad window or scale, RuntimeError("libjpeg: ...") for fatal errors.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static PyObject *roi_decode(PyObject *self, PyObject *args) {
    Py_buffer buf;
    long x, y, w, h;
    int scale_num, flags;
    struct jpeg_decompress_struct cinfo;
    roi_error_mgr err;
    PyObject *out = NULL;
    unsigned char *dst = NULL, *row = NULL;
    volatile int stage = 0; /* 0 header failed, 1 header ok, 2 decoded, -1 bad window */
    volatile long sw = 0, sh = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*llllii", &buf, &x, &y, &w, &h, &scale_num, &flags)) return NULL;
    if (scale_num < 1 || scale_num > 8) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "scale_num must be in 1..8 (scale M/8), got %d",
                            scale_num);
    }
    roi_init(&cinfo, &err);
    jpeg_create_decompress(&cinfo);
    Py_BEGIN_ALLOW_THREADS
    if (setjmp(err.jump) == 0) {
        jpeg_mem_src(&cinfo, (const unsigned char *)buf.buf, (unsigned long)buf.len);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.out_color_space = JCS_EXT_RGB;
        cinfo.scale_num = (unsigned int)scale_num;
        cinfo.scale_denom = 8;
        cinfo.dct_method = (flags & ROI_FAST_DCT) ? JDCT_IFAST : JDCT_ISLOW;
        cinfo.do_fancy_upsampling = (flags & ROI_FAST_UPSAMPLE) ? FALSE : TRUE;
        jpeg_calc_output_dimensions(&cinfo);
        sw = cinfo.output_width;
        sh = cinfo.output_height;
        stage = 1;
    }
    Py_END_ALLOW_THREADS
    if (stage == 1) {
        if (w <= 0 || h <= 0) { x = 0; y = 0; w = sw; h = sh; }
        if (x < 0 || y < 0 || x + w > sw || y + h > sh) stage = -1;
    }
    if (stage == 1) {
        out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(w * h * 3));
        row = out ? (unsigned char *)malloc((size_t)sw * 3 + 64) : NULL;
        if (out && !row) PyErr_NoMemory();
        if (!out || !row) {
            jpeg_destroy_decompress(&cinfo);
            PyBuffer_Release(&buf);
            Py_XDECREF(out);
            return NULL;
        }
        dst = (unsigned char *)PyByteArray_AS_STRING(out);
        Py_BEGIN_ALLOW_THREADS
        if (setjmp(err.jump) == 0) {
            JDIMENSION xoff = (JDIMENSION)x, cw = (JDIMENSION)w;
            long shift, r;
            jpeg_start_decompress(&cinfo);
            if (cw < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &cw);
            shift = x - (long)xoff; /* columns of the aligned window left of x */
            if (y > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
            for (r = 0; r < h; r++) {
                JSAMPROW rows[1];
                rows[0] = row;
                if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
                    /* suspension cannot happen with a memory source; treat as truncation */
                    memset(row, 0, (size_t)cw * 3);
                }
                memcpy(dst + (size_t)r * w * 3, row + shift * 3, (size_t)w * 3);
            }
            stage = 2;
        }
        jpeg_abort_decompress(&cinfo);
        Py_END_ALLOW_THREADS
        free(row);
    }
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&buf);
    if (stage == -1)
        return PyErr_Format(PyExc_ValueError,
                            "window x=%ld y=%ld w=%ld h=%ld lies outside the %ldx%ld scaled image",
                            x, y, w, h, sw, sh);
    if (stage != 2) {
        Py_XDECREF(out);
        return PyErr_Format(PyExc_RuntimeError, "libjpeg: %s", err.error);
    }
    if (err.n_warnings)
        return Py_BuildValue("(Nisll)", out, err.n_warnings, err.last_warning, sw, sh);
    return Py_BuildValue("(NiOll)", out, 0, Py_None, sw, sh);
}

static PyMethodDef roi_methods[] = {
    {"header", roi_header, METH_VARARGS,
     "header(data) -> (width, height, num_components, jpeg_color_space, progressive)"},
    {"decode", roi_decode, METH_VARARGS,
     "decode(data, x, y, w, h, scale_num, flags) -> (bytearray, n_warnings, last_warning, "
     "scaled_w, scaled_h); window in scaled coordinates, w<=0 or h<=0 = whole image"},
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
