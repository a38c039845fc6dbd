/* shardkit.augment._kernels: uint8 HWC image kernels for the CPU augmentation path.
 *
 * Each kernel works in place on one C-contiguous (H, W, 3) uint8 image (a row of a batch
 * buffer) and releases the GIL, so decoding threads augment in parallel. The arithmetic
 * follows torchvision.transforms.v2.functional (torchvision 0.29, _color.py / _geometry.py)
 * operation by operation, in float32, so the results equal torchvision's on the same
 * parameters (tests/test_augment_ops.py states where a tolerance applies):
 *
 *   - torch's `a.add_(b, alpha=k)` is a fused multiply-add on the CPU (ATen's vectorised
 *     fmadd); it is computed here as ((double)a + (double)b * (double)k) rounded once to
 *     float: b * k is exact in double (an 8-bit integer times a 24-bit mantissa) and so is the
 *     sum for the magnitudes that occur, so the result is the correctly rounded fused value;
 *   - float -> uint8 conversion truncates toward zero after clamping to [0, 255] (torch's
 *     `.clamp_(0, 255).to(torch.uint8)`).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int get_image(PyObject *obj, Py_buffer *view, Py_ssize_t h, Py_ssize_t w, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (view->len != h * w * 3) {
        PyErr_Format(PyExc_ValueError, "image buffer holds %zd bytes; expected %zd x %zd x 3",
                     view->len, h, w);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static inline float fused(float a, float b, float k) {
    return (float)((double)a + (double)b * (double)k);
}

static inline uint8_t to_u8(float v) {
    if (!(v > 0.0f)) return 0; /* also NaN */
    if (v >= 255.0f) return 255;
    return (uint8_t)v;
}

/* gray of one RGB pixel as torchvision computes it for uint8 images before floor():
 * r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114) */
static inline float gray_of(const uint8_t *p) {
    float s = (float)p[0] * 0.2989f;
    s = fused(s, (float)p[1], 0.587f);
    return fused(s, (float)p[2], 0.114f);
}

/* lut(image, h, w, luts): image[..., c] = luts[c * 256 + image[..., c]] */
static PyObject *k_lut(PyObject *self, PyObject *args) {
    PyObject *img_obj, *lut_obj;
    Py_ssize_t h, w;
    if (!PyArg_ParseTuple(args, "OnnO", &img_obj, &h, &w, &lut_obj)) return NULL;
    Py_buffer img, lut;
    if (get_image(img_obj, &img, h, w, 1) < 0) return NULL;
    if (PyObject_GetBuffer(lut_obj, &lut, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&img);
        return NULL;
    }
    if (lut.len != 3 * 256) {
        PyBuffer_Release(&img);
        PyBuffer_Release(&lut);
        PyErr_SetString(PyExc_ValueError, "luts must hold 3 x 256 bytes");
        return NULL;
    }
    uint8_t *p = (uint8_t *)img.buf;
    const uint8_t *l = (const uint8_t *)lut.buf;
    Py_ssize_t n = h * w;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++, p += 3) {
        p[0] = l[p[0]];
        p[1] = l[256 + p[1]];
        p[2] = l[512 + p[2]];
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&img);
    PyBuffer_Release(&lut);
    Py_RETURN_NONE;
}

/* gray(image, h, w, out): out[i] = floor(gray) as uint8 (H * W bytes); returns the sum */
static PyObject *k_gray(PyObject *self, PyObject *args) {
    PyObject *img_obj, *out_obj;
    Py_ssize_t h, w;
    if (!PyArg_ParseTuple(args, "OnnO", &img_obj, &h, &w, &out_obj)) return NULL;
    Py_buffer img, out;
    if (get_image(img_obj, &img, h, w, 0) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&img);
        return NULL;
    }
    if (out.len != h * w) {
        PyBuffer_Release(&img);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "out must hold h * w bytes");
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)img.buf;
    uint8_t *g = (uint8_t *)out.buf;
    long long total = 0;
    Py_ssize_t n = h * w;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++, p += 3) {
        uint8_t v = to_u8(floorf(gray_of(p)));
        g[i] = v;
        total += v;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&img);
    PyBuffer_Release(&out);
    return PyLong_FromLongLong(total);
}

/* saturation(image, h, w, factor): torchvision adjust_saturation on uint8:
 * _blend(image, floor(gray), factor) = image.mul(f).add_(gray, alpha=1 - f) */
static PyObject *k_saturation(PyObject *self, PyObject *args) {
    PyObject *img_obj;
    Py_ssize_t h, w;
    double factor;
    if (!PyArg_ParseTuple(args, "Onnd", &img_obj, &h, &w, &factor)) return NULL;
    Py_buffer img;
    if (get_image(img_obj, &img, h, w, 1) < 0) return NULL;
    uint8_t *p = (uint8_t *)img.buf;
    Py_ssize_t n = h * w;
    const float f = (float)factor, k = (float)(1.0 - factor);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++, p += 3) {
        float g = floorf(gray_of(p));
        p[0] = to_u8(fused((float)p[0] * f, g, k));
        p[1] = to_u8(fused((float)p[1] * f, g, k));
        p[2] = to_u8(fused((float)p[2] * f, g, k));
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&img);
    Py_RETURN_NONE;
}

/* hist(image, h, w, out): out (3 x 256 int32) = per-channel histograms */
static PyObject *k_hist(PyObject *self, PyObject *args) {
    PyObject *img_obj, *out_obj;
    Py_ssize_t h, w;
    if (!PyArg_ParseTuple(args, "OnnO", &img_obj, &h, &w, &out_obj)) return NULL;
    Py_buffer img, out;
    if (get_image(img_obj, &img, h, w, 0) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&img);
        return NULL;
    }
    if (out.len != 3 * 256 * 4) {
        PyBuffer_Release(&img);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "out must be a (3, 256) int32 array");
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)img.buf;
    int32_t *hst = (int32_t *)out.buf;
    Py_ssize_t n = h * w;
    Py_BEGIN_ALLOW_THREADS
    memset(hst, 0, 3 * 256 * 4);
    for (Py_ssize_t i = 0; i < n; i++, p += 3) {
        hst[p[0]]++;
        hst[256 + p[1]]++;
        hst[512 + p[2]]++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&img);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* sharpness(image, h, w, factor): torchvision adjust_sharpness on uint8: the interior is
 * blended with round(conv3x3(image, [[1,1,1],[1,5,1],[1,1,1]] / 13)), the border is kept.
 * The convolution's summation order differs from torch's conv2d, so a blurred value that lies
 * within float rounding of .5 may round the other way (a difference of 1 grey level). */
static PyObject *k_sharpness(PyObject *self, PyObject *args) {
    PyObject *img_obj;
    Py_ssize_t h, w;
    double factor;
    if (!PyArg_ParseTuple(args, "Onnd", &img_obj, &h, &w, &factor)) return NULL;
    Py_buffer img;
    if (get_image(img_obj, &img, h, w, 1) < 0) return NULL;
    if (h < 3 || w < 3) {
        PyBuffer_Release(&img);
        Py_RETURN_NONE;
    }
    uint8_t *p = (uint8_t *)img.buf;
    const float a = 1.0f / 13.0f, b = 5.0f / 13.0f, k = (float)(1.0 - factor);
    const Py_ssize_t stride = w * 3;
    uint8_t *src = (uint8_t *)malloc((size_t)(h * stride));
    if (src == NULL) {
        PyBuffer_Release(&img);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    memcpy(src, p, (size_t)(h * stride));
    for (Py_ssize_t y = 1; y < h - 1; y++) {
        const uint8_t *r0 = src + (y - 1) * stride, *r1 = r0 + stride, *r2 = r1 + stride;
        uint8_t *o = p + y * stride;
        for (Py_ssize_t x = 3; x < stride - 3; x++) {
            float ring = (float)r0[x - 3] + (float)r0[x] + (float)r0[x + 3] + (float)r1[x - 3] +
                         (float)r1[x + 3] + (float)r2[x - 3] + (float)r2[x] + (float)r2[x + 3];
            float blurred = nearbyintf(ring * a + (float)r1[x] * b);
            float v = (float)r1[x];
            o[x] = to_u8(fused(v, blurred - v, k));
        }
    }
    Py_END_ALLOW_THREADS
    free(src);
    PyBuffer_Release(&img);
    Py_RETURN_NONE;
}

/* affine_nearest(image, h, w, theta, fill): torchvision's tensor affine/rotate with
 * nearest interpolation (torchvision _geometry._affine_grid + grid_sample(align_corners=False)
 * + a fill for pixels mapped outside). theta: the 6 floats of the inverse affine matrix
 * (_get_inverse_affine_matrix), fill: 3 ints. Output size = input size. */
static PyObject *k_affine_nearest(PyObject *self, PyObject *args) {
    PyObject *img_obj;
    Py_ssize_t h, w;
    float t[6];
    int fill[3];
    if (!PyArg_ParseTuple(args, "Onn(ffffff)(iii)", &img_obj, &h, &w, &t[0], &t[1], &t[2],
                          &t[3], &t[4], &t[5], &fill[0], &fill[1], &fill[2]))
        return NULL;
    Py_buffer img;
    if (get_image(img_obj, &img, h, w, 1) < 0) return NULL;
    uint8_t *p = (uint8_t *)img.buf;
    const Py_ssize_t stride = w * 3;
    uint8_t *src = (uint8_t *)malloc((size_t)(h * stride));
    if (src == NULL) {
        PyBuffer_Release(&img);
        return PyErr_NoMemory();
    }
    uint8_t f8[3];
    for (int c = 0; c < 3; c++) f8[c] = (uint8_t)(fill[c] < 0 ? 0 : fill[c] > 255 ? 255 : fill[c]);
    Py_BEGIN_ALLOW_THREADS
    memcpy(src, p, (size_t)(h * stride));
    /* rescaled theta: theta^T / (0.5 w, 0.5 h); grid = base @ rescaled */
    const float hw = 0.5f * (float)w, hh = 0.5f * (float)h;
    const float r00 = t[0] / hw, r10 = t[1] / hw, r20 = t[2] / hw;
    const float r01 = t[3] / hh, r11 = t[4] / hh, r21 = t[5] / hh;
    for (Py_ssize_t y = 0; y < h; y++) {
        const float by = -(float)h * 0.5f + 0.5f + (float)y;
        uint8_t *o = p + y * stride;
        for (Py_ssize_t x = 0; x < w; x++, o += 3) {
            const float bx = -(float)w * 0.5f + 0.5f + (float)x;
            const float gx = bx * r00 + by * r10 + r20;
            const float gy = bx * r01 + by * r11 + r21;
            const float ix = nearbyintf(((gx + 1.0f) * (float)w - 1.0f) * 0.5f);
            const float iy = nearbyintf(((gy + 1.0f) * (float)h - 1.0f) * 0.5f);
            if (ix >= 0.0f && iy >= 0.0f && ix < (float)w && iy < (float)h) {
                const uint8_t *s = src + (Py_ssize_t)iy * stride + (Py_ssize_t)ix * 3;
                o[0] = s[0];
                o[1] = s[1];
                o[2] = s[2];
            } else {
                o[0] = f8[0];
                o[1] = f8[1];
                o[2] = f8[2];
            }
        }
    }
    Py_END_ALLOW_THREADS
    free(src);
    PyBuffer_Release(&img);
    Py_RETURN_NONE;
}

static PyMethodDef kernel_methods[] = {
    {"lut", k_lut, METH_VARARGS, "lut(image, h, w, luts) -> None: per-channel 256-entry LUTs"},
    {"gray", k_gray, METH_VARARGS,
     "gray(image, h, w, out) -> int: floor of torchvision's grayscale into out, returns the sum"},
    {"saturation", k_saturation, METH_VARARGS,
     "saturation(image, h, w, factor) -> None: torchvision adjust_saturation, in place"},
    {"hist", k_hist, METH_VARARGS, "hist(image, h, w, out) -> None: (3, 256) int32 histograms"},
    {"sharpness", k_sharpness, METH_VARARGS,
     "sharpness(image, h, w, factor) -> None: torchvision adjust_sharpness, in place"},
    {"affine_nearest", k_affine_nearest, METH_VARARGS,
     "affine_nearest(image, h, w, theta6, fill3) -> None: torchvision affine, nearest, in place"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef kernel_module = {PyModuleDef_HEAD_INIT, "_kernels",
                                           "uint8 HWC augmentation kernels (GIL released)", -1,
                                           kernel_methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&kernel_module); }
