/* shardkit.augment._kernels: uint8 HWC image kernels for the CPU augmentation path.
 *
 * run() applies a whole program of primitives in place on one C-contiguous (H, W, 3) uint8
 * image (a row of a batch buffer) with the GIL released, so decoding threads augment in
 * parallel; gray() is exposed for its exactness test. The arithmetic follows
 * torchvision.transforms.v2.functional (torchvision 0.29, _color.py / _geometry.py) operation
 * by operation, in float32, so the results equal torchvision's on the same parameters
 * (tests/test_augment_ops.py):
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

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_FMA_CLONE 1
#define FMA_TARGET __attribute__((target("avx2,fma")))
static int cpu_has_fma(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

/* floor of a value >= 0 (every grey value): truncation, no libm call */
static inline float floor_pos(float v) { return (float)(int32_t)v; }

/* round half to even (torch.round / nearbyint in the default rounding mode), inlined as
 * cvtss2si by -fno-math-errno instead of a libm call */
static inline float round_even(float v) { return (float)lrintf(v); }

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

static void do_lut(uint8_t *p, Py_ssize_t n, const uint8_t *l) {
    for (Py_ssize_t i = 0; i < n; i++, p += 3) {
        p[0] = l[p[0]];
        p[1] = l[256 + p[1]];
        p[2] = l[512 + p[2]];
    }
}


/* gray(image, h, w, out): out[i] = floor(gray) as uint8 (H * W bytes); returns the sum */
#define GRAY_BODY(FUSE)                                                                    \
    long long total = 0;                                                                   \
    for (Py_ssize_t i = 0; i < n; i++) {                                                  \
        const uint8_t *q = p + 3 * i;                                                      \
        float v = FUSE(FUSE((float)q[0] * 0.2989f, (float)q[1], 0.587f), (float)q[2], 0.114f); \
        uint8_t u = (uint8_t)(int32_t)(v > 255.0f ? 255.0f : v);                          \
        g[i] = u;                                                                          \
        total += u;                                                                        \
    }                                                                                      \
    return total;

static long long gray_generic(const uint8_t *p, uint8_t *g, Py_ssize_t n) { GRAY_BODY(fused) }

#ifdef HAVE_FMA_CLONE
FMA_TARGET static inline float fused_fma(float a, float b, float k) {
    return __builtin_fmaf(b, k, a);
}
FMA_TARGET static long long gray_fma(const uint8_t *p, uint8_t *g, Py_ssize_t n) {
    GRAY_BODY(fused_fma)
}
#endif

static long long do_gray(const uint8_t *p, uint8_t *g, Py_ssize_t n) {
#ifdef HAVE_FMA_CLONE
    if (cpu_has_fma()) return gray_fma(p, g, n);
#endif
    return gray_generic(p, g, n);
}

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
    long long total;
    Py_BEGIN_ALLOW_THREADS
    total = do_gray(p, g, h * w);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&img);
    PyBuffer_Release(&out);
    return PyLong_FromLongLong(total);
}

/* saturation: torchvision adjust_saturation on uint8:
 * _blend(image, floor(gray), factor) = image.mul(f).add_(gray, alpha=1 - f) */
#define SATURATION_BODY(FUSE)                                                              \
    for (Py_ssize_t i = 0; i < n; i++) {                                                  \
        uint8_t *q = p + 3 * i;                                                            \
        float g = FUSE(FUSE((float)q[0] * 0.2989f, (float)q[1], 0.587f), (float)q[2], 0.114f); \
        g = (float)(int32_t)g;                                                             \
        for (int c = 0; c < 3; c++) {                                                      \
            float v = FUSE((float)q[c] * f, g, k);                                         \
            v = v < 0.0f ? 0.0f : v;                                                       \
            v = v > 255.0f ? 255.0f : v;                                                   \
            q[c] = (uint8_t)(int32_t)v;                                                    \
        }                                                                                  \
    }

static void saturation_generic(uint8_t *p, Py_ssize_t n, float f, float k) {
    SATURATION_BODY(fused)
}

#ifdef HAVE_FMA_CLONE
FMA_TARGET static void saturation_fma(uint8_t *p, Py_ssize_t n, float f, float k) {
    SATURATION_BODY(fused_fma)
}
#endif

static void do_saturation(uint8_t *p, Py_ssize_t n, float f, float k) {
#ifdef HAVE_FMA_CLONE
    if (cpu_has_fma()) {
        saturation_fma(p, n, f, k);
        return;
    }
#endif
    saturation_generic(p, n, f, k);
}


static void do_hist(const uint8_t *p, Py_ssize_t n, int32_t *hst) {
    memset(hst, 0, 3 * 256 * 4);
    for (Py_ssize_t i = 0; i < n; i++, p += 3) {
        hst[p[0]]++;
        hst[256 + p[1]]++;
        hst[512 + p[2]]++;
    }
}


/* sharpness: torchvision adjust_sharpness on uint8: the interior is
 * blended with round(conv3x3(image, [[1,1,1],[1,5,1],[1,1,1]] / 13)), the border is kept.
 * The convolution's summation order may differ from torch's conv2d, so a blurred value within
 * float rounding of .5 could round the other way (a difference of 1 grey level). */
#define SHARPNESS_BODY(FUSE)                                                               \
    for (Py_ssize_t y = 1; y < h - 1; y++) {                                              \
        const uint8_t *restrict r0 = src + (y - 1) * stride;                              \
        const uint8_t *restrict r1 = r0 + stride, *restrict r2 = r1 + stride;             \
        uint8_t *restrict o = p + y * stride;                                              \
        for (Py_ssize_t x = 3; x < stride - 3; x++) {                                      \
            float ring = (float)r0[x - 3] + (float)r0[x] + (float)r0[x + 3] +              \
                         (float)r1[x - 3] + (float)r1[x + 3] + (float)r2[x - 3] +          \
                         (float)r2[x] + (float)r2[x + 3];                                   \
            float blurred = round_even(ring * a + (float)r1[x] * b);                       \
            float v = FUSE((float)r1[x], blurred - (float)r1[x], k);                       \
            v = v < 0.0f ? 0.0f : v;                                                       \
            v = v > 255.0f ? 255.0f : v;                                                   \
            o[x] = (uint8_t)(int32_t)v;                                                    \
        }                                                                                  \
    }

static void sharpness_generic(uint8_t *p, const uint8_t *src, Py_ssize_t h, Py_ssize_t stride,
                              float a, float b, float k) {
    SHARPNESS_BODY(fused)
}

#ifdef HAVE_FMA_CLONE
FMA_TARGET static inline float round_even_avx(float v) {
    return __builtin_rintf(v); /* default rounding mode: half to even */
}
FMA_TARGET static void sharpness_fma(uint8_t *p, const uint8_t *src, Py_ssize_t h,
                                     Py_ssize_t stride, float a, float b, float k) {
#define round_even round_even_avx
    SHARPNESS_BODY(fused_fma)
#undef round_even
}
#endif

/* src: scratch of h * w * 3 bytes */
static void do_sharpness(uint8_t *p, uint8_t *src, Py_ssize_t h, Py_ssize_t w, double factor) {
    if (h < 3 || w < 3) return;
    const float a = 1.0f / 13.0f, b = 5.0f / 13.0f, k = (float)(1.0 - factor);
    const Py_ssize_t stride = w * 3;
    memcpy(src, p, (size_t)(h * stride));
#ifdef HAVE_FMA_CLONE
    if (cpu_has_fma()) {
        sharpness_fma(p, src, h, stride, a, b, k);
        return;
    }
#endif
    sharpness_generic(p, src, h, stride, a, b, k);
}


/* affine (nearest): torchvision's tensor affine/rotate with
 * nearest interpolation (torchvision _geometry._affine_grid + grid_sample(align_corners=False)
 * + a fill for pixels mapped outside). theta: the 6 floats of the inverse affine matrix
 * (_get_inverse_affine_matrix), fill: 3 ints. Output size = input size. Per output row, the
 * source coordinates are computed first (a loop the compiler vectorises), then gathered. */
#define AFFINE_COORDS_BODY(FUSE) /* grid as torch's bmm: fma(by, r1, bx * r0), then + r2 */ \
    for (int32_t x = 0; x < (int32_t)w; x++) { /* int32: converts to float in SIMD */     \
        const float bx = -(float)w * 0.5f + 0.5f + (float)x;                              \
        const float gx = FUSE(bx * r00, by, r10) + r20;                                   \
        const float gy = FUSE(bx * r01, by, r11) + r21;                                   \
        const float fx = ((gx + 1.0f) * (float)w - 1.0f) * 0.5f;                          \
        const float fy = ((gy + 1.0f) * (float)h - 1.0f) * 0.5f;                          \
        /* clamp before the int conversion (far-out values); round half to even */        \
        ix[x] = (int32_t)__builtin_rintf(fx < -2.0f ? -2.0f : fx > 65536.0f ? 65536.0f : fx); \
        iy[x] = (int32_t)__builtin_rintf(fy < -2.0f ? -2.0f : fy > 65536.0f ? 65536.0f : fy); \
    }

static void affine_coords_generic(int32_t *restrict ix, int32_t *restrict iy, Py_ssize_t w,
                                  Py_ssize_t h, float by, float r00, float r10, float r20,
                                  float r01, float r11, float r21) {
    AFFINE_COORDS_BODY(fused)
}

#ifdef HAVE_FMA_CLONE
FMA_TARGET static void affine_coords_avx2(int32_t *restrict ix, int32_t *restrict iy,
                                          Py_ssize_t w, Py_ssize_t h, float by, float r00,
                                          float r10, float r20, float r01, float r11, float r21) {
    AFFINE_COORDS_BODY(fused_fma)
}
#endif

static size_t affine_scratch(Py_ssize_t h, Py_ssize_t w) {
    return (size_t)(h * w * 3) + (size_t)(2 * w) * sizeof(int32_t);
}

/* src: scratch of affine_scratch(h, w) bytes */
static void do_affine(uint8_t *p, uint8_t *src, Py_ssize_t h, Py_ssize_t w, const float *t,
                      const uint8_t *f8) {
    const Py_ssize_t stride = w * 3;
    int32_t *ix = (int32_t *)(src + h * stride), *iy = ix + w;
    memcpy(src, p, (size_t)(h * stride));
    /* rescaled theta: theta^T / (0.5 w, 0.5 h); grid = base @ rescaled */
    const float hw = 0.5f * (float)w, hh = 0.5f * (float)h;
    const float r00 = t[0] / hw, r10 = t[1] / hw, r20 = t[2] / hw;
    const float r01 = t[3] / hh, r11 = t[4] / hh, r21 = t[5] / hh;
#ifdef HAVE_FMA_CLONE
    const int avx2 = cpu_has_fma();
#endif
    for (Py_ssize_t y = 0; y < h; y++) {
        const float by = -(float)h * 0.5f + 0.5f + (float)y;
#ifdef HAVE_FMA_CLONE
        if (avx2) affine_coords_avx2(ix, iy, w, h, by, r00, r10, r20, r01, r11, r21);
        else
#endif
            affine_coords_generic(ix, iy, w, h, by, r00, r10, r20, r01, r11, r21);
        uint8_t *o = p + y * stride;
        for (Py_ssize_t x = 0; x < w; x++, o += 3) {
            const int32_t sx = ix[x], sy = iy[x];
            const uint8_t *s = (sx >= 0 && sy >= 0 && sx < w && sy < h)
                                   ? src + (Py_ssize_t)sy * stride + (Py_ssize_t)sx * 3
                                   : f8;
            o[0] = s[0];
            o[1] = s[1];
            o[2] = s[2];
        }
    }
}


/* ---- run(image, h, w, ops): a whole program in one call, without the GIL ----
 * ops: C-contiguous float64 (n, 10): opcode, then up to 9 arguments. Lookup tables are built
 * here with the float32 steps of shardkit/augment/prims.py (which follow torchvision), so the
 * result equals the per-primitive path exactly. */
enum { OP_BRIGHTNESS = 1, OP_CONTRAST, OP_SATURATION, OP_SHARPNESS, OP_POSTERIZE, OP_SOLARIZE,
       OP_AUTOCONTRAST, OP_EQUALIZE, OP_GRAYSCALE, OP_AFFINE, OP_ERASE };
#define OP_WIDTH 10

static void lut_broadcast(uint8_t *l) {
    memcpy(l + 256, l, 256);
    memcpy(l + 512, l, 256);
}

static void autocontrast_lut(const int32_t *hist, uint8_t *l) {
    for (int c = 0; c < 3; c++) {
        const int32_t *hc = hist + 256 * c;
        int lo = 0, hi = 255;
        while (lo < 255 && hc[lo] == 0) lo++;
        while (hi > 0 && hc[hi] == 0) hi--;
        float flo = (float)lo, inv;
        if (lo >= hi) {
            flo = 0.0f;
            inv = 1.0f;
        } else {
            inv = ((float)hi - (float)lo) * (float)(1.0 / 255);
        }
        for (int v = 0; v < 256; v++) l[256 * c + v] = to_u8(((float)v - flo) / inv);
    }
}

static void equalize_lut(const int32_t *hist, Py_ssize_t n, uint8_t *l) {
    for (int c = 0; c < 3; c++) {
        const int32_t *hc = hist + 256 * c;
        long long cum[256], acc = 0;
        int index = 0;
        for (int v = 0; v < 256; v++) {
            acc += hc[v];
            cum[v] = acc;
        }
        for (int v = 0; v < 256; v++)
            if (cum[v] > cum[index]) index = v; /* argmax: first maximum */
        long long step = ((long long)n - hc[index]) / 255;
        uint8_t *lc = l + 256 * c;
        if (step == 0) {
            for (int v = 0; v < 256; v++) lc[v] = (uint8_t)v;
            continue;
        }
        lc[0] = 0;
        for (int v = 1; v < 256; v++) {
            long long q = (cum[v - 1] + step / 2) / step;
            lc[v] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
        }
    }
}

/* returns 0, or -1 on an unknown opcode (*bad = its index) */
static int run_program(uint8_t *p, Py_ssize_t h, Py_ssize_t w, const double *ops,
                       Py_ssize_t nops, uint8_t *scratch, int *bad) {
    const Py_ssize_t n = h * w;
    uint8_t lut[768];
    int32_t hist[768];
    for (Py_ssize_t k = 0; k < nops; k++) {
        const double *a = ops + k * OP_WIDTH + 1;
        switch ((int)ops[k * OP_WIDTH]) {
        case OP_BRIGHTNESS: {
            const float f = (float)a[0];
            for (int v = 0; v < 256; v++) lut[v] = to_u8((float)v * f);
            lut_broadcast(lut);
            do_lut(p, n, lut);
            break;
        }
        case OP_CONTRAST: {
            const float f = (float)a[0], alpha = (float)(1.0 - a[0]);
            const float mean = (float)do_gray(p, scratch, n) / (float)n;
            for (int v = 0; v < 256; v++) lut[v] = to_u8(fused((float)v * f, mean, alpha));
            lut_broadcast(lut);
            do_lut(p, n, lut);
            break;
        }
        case OP_SATURATION:
            do_saturation(p, n, (float)a[0], (float)(1.0 - a[0]));
            break;
        case OP_SHARPNESS:
            do_sharpness(p, scratch, h, w, a[0]);
            break;
        case OP_POSTERIZE: {
            const int bits = (int)a[0];
            if (bits >= 8) break;
            const uint8_t mask = (uint8_t)(((1 << bits) - 1) << (8 - bits));
            for (Py_ssize_t i = 0; i < 3 * n; i++) p[i] &= mask;
            break;
        }
        case OP_SOLARIZE: {
            const float t = (float)a[0];
            for (int v = 0; v < 256; v++) lut[v] = (float)v >= t ? (uint8_t)(255 - v) : (uint8_t)v;
            lut_broadcast(lut);
            do_lut(p, n, lut);
            break;
        }
        case OP_AUTOCONTRAST:
            do_hist(p, n, hist);
            autocontrast_lut(hist, lut);
            do_lut(p, n, lut);
            break;
        case OP_EQUALIZE:
            do_hist(p, n, hist);
            equalize_lut(hist, n, lut);
            do_lut(p, n, lut);
            break;
        case OP_GRAYSCALE:
            do_saturation(p, n, 0.0f, 1.0f);
            break;
        case OP_AFFINE: {
            const float t[6] = {(float)a[0], (float)a[1], (float)a[2],
                                (float)a[3], (float)a[4], (float)a[5]};
            const uint8_t f8[3] = {(uint8_t)a[6], (uint8_t)a[7], (uint8_t)a[8]};
            do_affine(p, scratch, h, w, t, f8);
            break;
        }
        case OP_ERASE: {
            const Py_ssize_t i0 = (Py_ssize_t)a[0], j0 = (Py_ssize_t)a[1];
            const Py_ssize_t eh = (Py_ssize_t)a[2], ew = (Py_ssize_t)a[3];
            for (Py_ssize_t y = i0; y < i0 + eh && y < h; y++)
                for (Py_ssize_t x = j0; x < j0 + ew && x < w; x++) {
                    uint8_t *q = p + (y * w + x) * 3;
                    q[0] = (uint8_t)a[4];
                    q[1] = (uint8_t)a[5];
                    q[2] = (uint8_t)a[6];
                }
            break;
        }
        default:
            *bad = (int)k;
            return -1;
        }
    }
    return 0;
}

static PyObject *k_run(PyObject *self, PyObject *args) {
    PyObject *img_obj, *ops_obj;
    Py_ssize_t h, w;
    if (!PyArg_ParseTuple(args, "OnnO", &img_obj, &h, &w, &ops_obj)) return NULL;
    Py_buffer img, ops;
    if (get_image(img_obj, &img, h, w, 1) < 0) return NULL;
    if (PyObject_GetBuffer(ops_obj, &ops, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&img);
        return NULL;
    }
    if (ops.len % (OP_WIDTH * sizeof(double)) != 0) {
        PyBuffer_Release(&img);
        PyBuffer_Release(&ops);
        PyErr_SetString(PyExc_ValueError, "ops must be a float64 (n, 10) array");
        return NULL;
    }
    const Py_ssize_t nops = ops.len / (OP_WIDTH * (Py_ssize_t)sizeof(double));
    uint8_t *scratch = (uint8_t *)malloc(affine_scratch(h, w));
    if (scratch == NULL) {
        PyBuffer_Release(&img);
        PyBuffer_Release(&ops);
        return PyErr_NoMemory();
    }
    int rc, bad = -1;
    Py_BEGIN_ALLOW_THREADS
    rc = run_program((uint8_t *)img.buf, h, w, (const double *)ops.buf, nops, scratch, &bad);
    Py_END_ALLOW_THREADS
    free(scratch);
    PyBuffer_Release(&img);
    PyBuffer_Release(&ops);
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError, "ops row %d: unknown opcode", bad);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef kernel_methods[] = {
    {"run", k_run, METH_VARARGS,
     "run(image, h, w, ops) -> None: a program (float64 (n, 10) rows: opcode, arguments) in "
     "place, without the GIL"},
    {"gray", k_gray, METH_VARARGS,
     "gray(image, h, w, out) -> int: floor of torchvision's grayscale into out, returns the sum"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef kernel_module = {PyModuleDef_HEAD_INIT, "_kernels",
                                           "uint8 HWC augmentation kernels (GIL released)", -1,
                                           kernel_methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&kernel_module); }
