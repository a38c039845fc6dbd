/* shardkit.augment._kernels: uint8 HWC image kernels for the CPU augmentation path.
 *
 * run() applies a whole program of primitives in place on one C-contiguous (H, W, 3) uint8
 * image (a row of a batch buffer) with the GIL released, so decoding threads augment in
 * parallel; gray() is exposed for its exactness test. The arithmetic follows
 * torchvision.transforms.v2.functional (torchvision 0.29, _color.py / _geometry.py) operation
 * by operation, in float32:
 *
 *   - torch's `a.add_(b, alpha=k)` is a fused multiply-add in torch's vectorised CPU kernels
 *     (ATen's Vectorized fmadd with AVX2, AVX-512 or NEON) and on CUDA; it is computed here as
 *     fmaf(b, k, a): one rounding, by definition the same value on every host (the AVX2+FMA
 *     clones below and C99 fmaf elsewhere);
 *   - float -> uint8 conversion truncates toward zero after clamping to [0, 255] (torch's
 *     `.clamp_(0, 255).to(torch.uint8)`);
 *   - nearest affine/rotate: the sampling grid as torch's float32 bmm (base @ rescaled theta)
 *     computes it with MKL's AVX-512 sgemm, fma(by, r1, bx * r0) + r2, then grid_sample's
 *     unnormalisation and round-half-to-even.
 *
 * What is guaranteed (tests/test_augment_ops.py):
 *   1. The bytes are the same on every host: no -march, -ffp-contract=off (checked at import:
 *      a build that contracts a * b + c refuses to load), every fused operation is fmaf, and the
 *      AVX2+FMA clones give the bytes of the portable path (_set_path(0) vs 1, tested).
 *   2a. Hue: torchvision's bytes on every host (do_hue: no fused operation on either side;
 *       vectorised with bit selects, the same bytes on every clone).
 *   2b. Runs of pixelwise colour ops (do_chain): the bytes of one pass per op (_set_fused(0)),
 *       on the portable path and on each vector form (AVX2, AVX-512, AVX-512 VBMI intrinsics:
 *       _set_wide(0, 1, 2); tests/test_augment_fused.py). A chain pass with no saturation
 *       runs as its own 256-entry table (chain_run), and tables are applied 64 bytes at a
 *       time with VBMI (lut_vbmi): a lookup has one value on every path.
 *   2. Colour, sharpness, posterize, solarize, autocontrast, equalize, grayscale, erase:
 *      torchvision's pixels exactly where torch's kernels fuse multiply-adds (AVX2, AVX-512,
 *      NEON: x86-64 CPUs with AVX2, every aarch64 one). torch's scalar DEFAULT kernels (an
 *      x86-64 CPU without AVX2) round twice; there a value within float rounding of an integer
 *      may truncate one level apart (near-grey pixels under saturation: ~1.3% of a photo's
 *      pixels; _set_separate_rounding(1) reproduces that torch exactly, for the tests). The
 *      same holds in torch's scalar tail on any CPU: the last values of a tensor whose size is
 *      not a multiple of its vector step (up to 31 values at the tensor's end; 224 x 224 x 3
 *      has none) are rounded twice, so there torchvision may be one level from the kernel
 *      (found by a reviewer: a flat 299 x 299 image under contrast 1.6, 8 values).
 *   3. Nearest affine/rotate/shear: torch's own grid depends on the CPU (MKL picks an AVX-512,
 *      AVX2 or SSE4.2 sgemm kernel per CPU, each rounding the 3-term products differently, so
 *      torchvision's output itself differs between an Intel Xeon and an AMD EPYC). Every output
 *      pixel whose exact sampling coordinate lies more than 1e-3 px from a pixel boundary
 *      (.5) samples the same source pixel (or fill) as torchvision on any CPU; within that
 *      distance either neighbour may be taken (the kernel and torchvision each pick one of the
 *      two). Measured on 15 million pixels of photos: the kernel and torchvision pick the same
 *      source pixel everywhere on MKL's AVX-512 path, all but about 1 per million on its AVX2 /
 *      SSE4.2 paths (the AMD EPYC case; a differing pixel is off by the neighbours' difference).
 *
 * Every entry point validates its arguments (ValueError, nothing written): image sides 1..2**24
 * and a C-contiguous uint8 buffer of exactly h * w * 3 bytes, ops a float64 (n, 10) array with
 * known opcodes and arguments in range (see op_problem()).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdio.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#define MAX_SIDE (1 << 24) /* float32 holds every pixel coordinate exactly */

/* code paths: the portable C, or the AVX2+FMA clones (x86-64 with GCC/clang); same bytes */
enum { PATH_PORTABLE = 0, PATH_FMA = 1 };
static int path_best = PATH_PORTABLE, path_used = PATH_PORTABLE;
/* tests only: round a + b * k twice, as torch's scalar DEFAULT kernels do */
static int separate_rounding = 0;
/* runs of pixelwise colour ops in one pass per contrast op (do_chain); 0: a pass per op (the
 * reference the tests compare the chains with) */
static int fuse_chains = 1;

static int u8_format(const char *f) {
    return f == NULL || !strcmp(f, "B") || !strcmp(f, "=B") || !strcmp(f, "@B") ||
           !strcmp(f, "<B") || !strcmp(f, ">B");
}

static int check_size(Py_ssize_t h, Py_ssize_t w) {
    if (h < 1 || w < 1 || h > MAX_SIDE || w > MAX_SIDE || h > PY_SSIZE_T_MAX / 3 / w) {
        PyErr_Format(PyExc_ValueError, "image size h=%zd, w=%zd; expected 1..%d on each side", h,
                     w, MAX_SIDE);
        return -1;
    }
    return 0;
}

/* a C-contiguous uint8 buffer of exactly `len` bytes ("what" names it in the error) */
static int get_u8(PyObject *obj, Py_buffer *view, Py_ssize_t len, int writable,
                  const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (view->itemsize != 1 || !u8_format(view->format) || view->len != len) {
        const Py_ssize_t items = view->len / (view->itemsize ? view->itemsize : 1);
        PyErr_Format(PyExc_ValueError, "%s: a buffer of %zd items of %zd bytes (format %s); "
                     "expected %zd uint8 bytes", what, items, view->itemsize,
                     view->format ? view->format : "B", len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int get_image(PyObject *obj, Py_buffer *view, Py_ssize_t h, Py_ssize_t w, int writable) {
    if (check_size(h, w) < 0) return -1;
    return get_u8(obj, view, h * w * 3, writable, "image (h * w * 3 bytes, C-contiguous)");
}

static inline float fused(float a, float b, float k) { return fmaf(b, k, a); }
static inline float unfused(float a, float b, float k) { return a + b * k; }

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_FMA_CLONE 1
#define FMA_TARGET __attribute__((target("avx2,fma")))
static int cpu_has_fma(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
FMA_TARGET static inline float fused_fma(float a, float b, float k) {
    return __builtin_fmaf(b, k, a);
}
/* AVX-512 clones of the colour chains and sharpness, where the CPU has it (set at import) */
#define AVX512_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")))
#define VBMI_TARGET                                                                        \
    __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")))
static int chain_wide = -1; /* -1: not detected yet; 1: AVX-512F/BW/VL/DQ; 2: and VBMI */
#endif

/* round half to even (torch.round / nearbyint in the default rounding mode), inlined as
 * cvtss2si by -fno-math-errno instead of a libm call */
static inline float round_even(float v) { return (float)lrintf(v); }

static inline uint8_t to_u8(float v) {
    if (!(v > 0.0f)) return 0; /* also NaN */
    if (v >= 255.0f) return 255;
    return (uint8_t)v;
}

static void lut_generic(uint8_t *p, Py_ssize_t n, const uint8_t *l) {
    for (Py_ssize_t i = 0; i < n; i++, p += 3) {
        p[0] = l[p[0]];
        p[1] = l[256 + p[1]];
        p[2] = l[512 + p[2]];
    }
}

#ifdef HAVE_FMA_CLONE
/* A table lookup of 64 bytes with AVX-512 VBMI: entries 0-127 and 128-255 by one two-source
 * byte permute each (vpermi2b reads the index's low 7 bits), chosen by the index's top bit. */
VBMI_TARGET static inline __attribute__((always_inline)) __m512i
lookup64(const __m512i *t, __m512i x) {
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), _mm512_permutex2var_epi8(t[0], x, t[1]),
                                  _mm512_permutex2var_epi8(t[2], x, t[3]));
}

/* lut_generic's bytes, 64 at a time (12x faster at 224 px: 4 against 46 us for one table).
 * same: the three channels' tables are equal (one lookup per vector); otherwise each
 * channel's lookup is kept in its bytes: byte i of the vector at offset 64 k is channel
 * (k + i) % 3, as 64 = 1 (mod 3). The last vector is loaded and stored masked. */
VBMI_TARGET static void lut_vbmi(uint8_t *p, Py_ssize_t n, const uint8_t *l, int same) {
    __m512i t[3][4];
    for (int c = 0; c < 3; c++)
        for (int q = 0; q < 4; q++) t[c][q] = _mm512_loadu_si512(l + 256 * c + 64 * q);
    __mmask64 chan[3][3]; /* chan[phase][c]: the bytes of channel c in a vector of that phase */
    for (int ph = 0; ph < 3; ph++)
        for (int c = 0; c < 3; c++) {
            __mmask64 m = 0;
            for (int i = 0; i < 64; i++)
                if ((ph + i) % 3 == c) m |= 1ULL << i;
            chan[ph][c] = m;
        }
    const Py_ssize_t len = 3 * n;
    int ph = 0;
    for (Py_ssize_t o = 0; o < len; o += 64) {
        const __mmask64 k = len - o >= 64 ? ~0ULL : (1ULL << (len - o)) - 1;
        const __m512i x = _mm512_maskz_loadu_epi8(k, p + o);
        __m512i y = lookup64(t[0], x);
        if (!same) {
            y = _mm512_mask_mov_epi8(y, chan[ph][1], lookup64(t[1], x));
            y = _mm512_mask_mov_epi8(y, chan[ph][2], lookup64(t[2], x));
        }
        _mm512_mask_storeu_epi8(p + o, k, y);
        ph = ph == 2 ? 0 : ph + 1;
    }
}
#endif

/* l: 768 bytes, channel c's table at 256 c; same: the three are equal */
static void do_lut(uint8_t *p, Py_ssize_t n, const uint8_t *l, int same) {
#ifdef HAVE_FMA_CLONE
    if (path_used == PATH_FMA && chain_wide == 2) {
        lut_vbmi(p, n, l, same);
        return;
    }
#endif
    (void)same;
    lut_generic(p, n, l);
}


/* gray(image, h, w, out): out[i] = floor(gray) as uint8 (H * W bytes); returns the sum.
 * torchvision: r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114) */
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
static long long gray_unfused(const uint8_t *p, uint8_t *g, Py_ssize_t n) { GRAY_BODY(unfused) }

#ifdef HAVE_FMA_CLONE
FMA_TARGET static long long gray_fma(const uint8_t *p, uint8_t *g, Py_ssize_t n) {
    GRAY_BODY(fused_fma)
}
#endif

static long long do_gray(const uint8_t *p, uint8_t *g, Py_ssize_t n) {
    if (separate_rounding) return gray_unfused(p, g, n);
#ifdef HAVE_FMA_CLONE
    if (path_used == PATH_FMA) return gray_fma(p, g, n);
#endif
    return gray_generic(p, g, n);
}

static PyObject *k_gray(PyObject *self, PyObject *args) {
    PyObject *img_obj, *out_obj;
    Py_ssize_t h, w;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnnO", &img_obj, &h, &w, &out_obj)) return NULL;
    Py_buffer img, out;
    if (get_image(img_obj, &img, h, w, 0) < 0) return NULL;
    if (get_u8(out_obj, &out, h * w, 1, "out (h * w bytes, C-contiguous, writable)") < 0) {
        PyBuffer_Release(&img);
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
static void saturation_unfused(uint8_t *p, Py_ssize_t n, float f, float k) {
    SATURATION_BODY(unfused)
}

#ifdef HAVE_FMA_CLONE
FMA_TARGET static void saturation_fma(uint8_t *p, Py_ssize_t n, float f, float k) {
    SATURATION_BODY(fused_fma)
}
#endif

static void do_saturation(uint8_t *p, Py_ssize_t n, float f, float k) {
    if (separate_rounding) {
        saturation_unfused(p, n, f, k);
        return;
    }
#ifdef HAVE_FMA_CLONE
    if (path_used == PATH_FMA) {
        saturation_fma(p, n, f, k);
        return;
    }
#endif
    saturation_generic(p, n, f, k);
}


/* two histograms per channel (even and odd pixels), summed: neighbouring pixels often share a
 * value, and one table would wait on its own increment (the same counts) */
static void do_hist(const uint8_t *p, Py_ssize_t n, int32_t *hst) {
    int32_t two[2 * 768];
    memset(two, 0, sizeof(two));
    Py_ssize_t i = 0;
    for (; i + 1 < n; i += 2, p += 6) {
        two[p[0]]++;
        two[256 + p[1]]++;
        two[512 + p[2]]++;
        two[768 + p[3]]++;
        two[1024 + p[4]]++;
        two[1280 + p[5]]++;
    }
    if (i < n) {
        two[p[0]]++;
        two[256 + p[1]]++;
        two[512 + p[2]]++;
    }
    for (int v = 0; v < 768; v++) hst[v] = two[v] + two[768 + v];
}


/* sharpness: torchvision adjust_sharpness on uint8: the interior is
 * blended with round(conv3x3(image, [[1,1,1],[1,5,1],[1,1,1]] / 13)), the border is kept.
 * The convolution's summation order may differ from torch's conv2d, but a blurred value is
 * m / 13 for an integer m, at least 1/26 from a rounding tie: the rounding never depends on it. */
#define SHARPNESS_BODY(FUSE)                                                               \
    for (Py_ssize_t y = 1; y < h - 1; y++) {                                              \
        const uint8_t *restrict r0 = src + (y - 1) * stride;                              \
        const uint8_t *restrict r1 = r0 + stride, *restrict r2 = r1 + stride;             \
        uint8_t *restrict o = p + y * stride;                                              \
        for (Py_ssize_t x = 3; x < stride - 3; x++) {                                      \
            /* an integer sum <= 2040: the float sum of the 8 values, exactly */            \
            const int32_t ring_i = r0[x - 3] + r0[x] + r0[x + 3] + r1[x - 3] + r1[x + 3] +  \
                                   r2[x - 3] + r2[x] + r2[x + 3];                           \
            const float ring = (float)ring_i;                                              \
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
static void sharpness_unfused(uint8_t *p, const uint8_t *src, Py_ssize_t h, Py_ssize_t stride,
                              float a, float b, float k) {
    SHARPNESS_BODY(unfused)
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
/* the same loop at 16 lanes where the CPU has AVX-512 (same IEEE operations: same bytes) */
AVX512_TARGET static void sharpness_avx512(uint8_t *p, const uint8_t *src, Py_ssize_t h,
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
    if (separate_rounding) {
        sharpness_unfused(p, src, h, stride, a, b, k);
        return;
    }
#ifdef HAVE_FMA_CLONE
    if (path_used == PATH_FMA) {
        if (chain_wide >= 1)
            sharpness_avx512(p, src, h, stride, a, b, k);
        else
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
 * source coordinates are computed first (a loop the compiler vectorises), then gathered.
 * A coordinate is clamped to [-2, size] before the int conversion (far-out or NaN values read
 * as outside: the fill). */
#define AFFINE_COORDS_BODY(FUSE) /* grid as MKL's AVX-512 sgemm: fma(by, r1, bx * r0) + r2 */ \
    const float fw = (float)w, fh = (float)h;                                             \
    for (int32_t x = 0; x < (int32_t)w; x++) { /* int32: converts to float in SIMD */     \
        const float bx = -fw * 0.5f + 0.5f + (float)x;                                    \
        const float gx = FUSE(bx * r00, by, r10) + r20;                                   \
        const float gy = FUSE(bx * r01, by, r11) + r21;                                   \
        const float fx = ((gx + 1.0f) * fw - 1.0f) * 0.5f;                                \
        const float fy = ((gy + 1.0f) * fh - 1.0f) * 0.5f;                                \
        ix[x] = (int32_t)__builtin_rintf(fx >= -2.0f ? (fx <= fw ? fx : fw) : -2.0f);     \
        iy[x] = (int32_t)__builtin_rintf(fy >= -2.0f ? (fy <= fh ? fy : fh) : -2.0f);     \
    }

static void affine_coords_generic(int32_t *restrict ix, int32_t *restrict iy, Py_ssize_t w,
                                  Py_ssize_t h, float by, float r00, float r10, float r20,
                                  float r01, float r11, float r21) {
    AFFINE_COORDS_BODY(fused)
}

#ifdef HAVE_FMA_CLONE
FMA_TARGET static void affine_coords_fma(int32_t *restrict ix, int32_t *restrict iy,
                                         Py_ssize_t w, Py_ssize_t h, float by, float r00,
                                         float r10, float r20, float r01, float r11, float r21) {
    AFFINE_COORDS_BODY(fused_fma)
}
#endif

/* the int32 coordinates' offset in the scratch: after the image copy, 4-byte aligned */
static Py_ssize_t coords_at(Py_ssize_t h, Py_ssize_t w) { return (h * w * 3 + 3) & ~(Py_ssize_t)3; }

static size_t affine_scratch(Py_ssize_t h, Py_ssize_t w) {
    return (size_t)coords_at(h, w) + (size_t)(2 * w) * sizeof(int32_t) + 4; /* + the fill */
}

/* src: scratch of affine_scratch(h, w) bytes */
static void do_affine(uint8_t *p, uint8_t *src, Py_ssize_t h, Py_ssize_t w, const float *t,
                      const uint8_t *f8) {
    const Py_ssize_t stride = w * 3;
    int32_t *ix = (int32_t *)(src + coords_at(h, w)), *iy = ix + w;
    memcpy(src, p, (size_t)(h * stride));
    /* the fill after the coordinates: offsets from src reach it (images under 2 GiB) */
    uint8_t *fill = (uint8_t *)(iy + w);
    const int small = (size_t)(fill - src) + 3 <= (size_t)INT32_MAX;
    const int32_t fill_at = small ? (int32_t)(fill - src) : 0;
    memcpy(fill, f8, 3);
    /* rescaled theta: theta^T / (0.5 w, 0.5 h); grid = base @ rescaled */
    const float hw = 0.5f * (float)w, hh = 0.5f * (float)h;
    const float r00 = t[0] / hw, r10 = t[1] / hw, r20 = t[2] / hw;
    const float r01 = t[3] / hh, r11 = t[4] / hh, r21 = t[5] / hh;
    for (Py_ssize_t y = 0; y < h; y++) {
        const float by = -(float)h * 0.5f + 0.5f + (float)y;
#ifdef HAVE_FMA_CLONE
        if (path_used == PATH_FMA)
            affine_coords_fma(ix, iy, w, h, by, r00, r10, r20, r01, r11, r21);
        else
#endif
            affine_coords_generic(ix, iy, w, h, by, r00, r10, r20, r01, r11, r21);
        uint8_t *o = p + y * stride;
        if (small) { /* offsets in a vectorised loop, then a gather without tests */
            const int32_t w32 = (int32_t)w, h32 = (int32_t)h, st = (int32_t)stride;
            for (Py_ssize_t x = 0; x < w; x++) {
                const int32_t sx = ix[x], sy = iy[x];
                const int inside = (sx >= 0) & (sy >= 0) & (sx < w32) & (sy < h32);
                ix[x] = inside ? sy * st + sx * 3 : fill_at;
            }
            /* 4 bytes a pixel (one load and one store): the 4th lands on the next pixel,
             * written after it, or is the next byte of src or the scratch (the fill has 4);
             * the row's last pixel is written in 3, so nothing lands past the image */
            for (Py_ssize_t x = 0; x + 1 < w; x++, o += 3) memcpy(o, src + ix[x], 4);
            memcpy(o, src + ix[w - 1], 3);
            continue;
        }
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


/* A whole-pixel translation (RandAugment's TranslateX / TranslateY): the inverse matrix
 * [1, 0, tx; 0, 1, ty] with integer tx, ty. do_affine's grid then puts the source of output
 * pixel x at x + tx exactly up to float rounding (~1e-4 px on sides <= 4096, far from the .5 px
 * boundaries), so rows copied with a shift give its bytes (_set_fused(0) runs do_affine;
 * tested) without the per-pixel gather. */
static int is_translation(const float *t, Py_ssize_t h, Py_ssize_t w) {
    return h <= 4096 && w <= 4096 && t[0] == 1.0f && t[1] == 0.0f && t[3] == 0.0f &&
           t[4] == 1.0f && t[2] == floorf(t[2]) && t[5] == floorf(t[5]) &&
           fabsf(t[2]) <= 8192.0f && fabsf(t[5]) <= 8192.0f;
}

/* src: scratch of h * w * 3 bytes; output pixel (y, x) = input (y + ty, x + tx) or the fill */
static void do_translate(uint8_t *p, uint8_t *src, Py_ssize_t h, Py_ssize_t w, Py_ssize_t tx,
                         Py_ssize_t ty, const uint8_t *f8) {
    const Py_ssize_t stride = w * 3;
    const Py_ssize_t x0 = tx < 0 ? -tx : 0, x1 = w - tx < w ? w - tx : w; /* valid [x0, x1) */
    memcpy(src, p, (size_t)(h * stride));
    for (Py_ssize_t y = 0; y < h; y++) {
        uint8_t *o = p + y * stride;
        const Py_ssize_t sy = y + ty;
        Py_ssize_t x = 0;
        if (sy >= 0 && sy < h && x0 < x1) {
            for (; x < x0; x++) memcpy(o + 3 * x, f8, 3);
            memcpy(o + 3 * x0, src + sy * stride + 3 * (x0 + tx), (size_t)(3 * (x1 - x0)));
            x = x1;
        }
        for (; x < w; x++) memcpy(o + 3 * x, f8, 3);
    }
}

/* ---- run(image, h, w, ops): a whole program in one call, without the GIL ----
 * ops: C-contiguous float64 (n, 10): opcode, then up to 9 arguments. Lookup tables are built
 * here with the float32 steps of shardkit/augment/prims.py (which follow torchvision), so the
 * result equals the per-primitive path exactly. */
enum { OP_BRIGHTNESS = 1, OP_CONTRAST, OP_SATURATION, OP_SHARPNESS, OP_POSTERIZE, OP_SOLARIZE,
       OP_AUTOCONTRAST, OP_EQUALIZE, OP_GRAYSCALE, OP_AFFINE, OP_ERASE, OP_HUE };
#define OP_WIDTH 10

static int integral(double v, double lo, double hi) {
    return v >= lo && v <= hi && v == floor(v); /* false for NaN */
}

/* NULL when the row is a valid op, else what is wrong with it. Rules: opcode 1..12; colour
 * and sharpness factors finite and >= 0 (torchvision's rule); posterize bits an integer 0..8;
 * solarize threshold finite and <= 255 (torchvision's: at most the dtype's maximum); affine
 * matrix 6 finite float32 values; fill and erase values 3 integers 0..255; erase i, j, h, w
 * integers >= 0 (the box is clipped at the bottom and right edges, as torchvision's slicing;
 * negative coordinates, which torchvision's slicing would wrap around, are refused). */
static const char *op_problem(const double *r) {
    const double *a = r + 1;
    int i;
    if (!integral(r[0], OP_BRIGHTNESS, OP_HUE)) return "unknown opcode (expected 1..12)";
    switch ((int)r[0]) {
    case OP_BRIGHTNESS:
    case OP_CONTRAST:
    case OP_SATURATION:
    case OP_SHARPNESS:
        if (!(a[0] >= 0.0 && a[0] <= FLT_MAX)) return "factor must be a finite number >= 0";
        break;
    case OP_HUE:
        if (!(a[0] >= -0.5 && a[0] <= 0.5)) return "hue factor must be in [-0.5, 0.5]";
        break;
    case OP_POSTERIZE:
        if (!integral(a[0], 0, 8)) return "posterize bits must be an integer 0..8";
        break;
    case OP_SOLARIZE: /* torchvision refuses a threshold above the dtype's maximum */
        if (!(a[0] >= -FLT_MAX && a[0] <= 255.0))
            return "solarize threshold must be a finite number <= 255";
        break;
    case OP_AFFINE:
        for (i = 0; i < 6; i++)
            if (!(fabs(a[i]) <= FLT_MAX)) return "affine matrix entries must be finite float32";
        for (i = 6; i < 9; i++)
            if (!integral(a[i], 0, 255)) return "affine fill must be 3 integers 0..255";
        break;
    case OP_ERASE:
        for (i = 0; i < 4; i++)
            if (!integral(a[i], 0, 2147483647.0))
                return "erase i, j, h, w must be integers 0..2**31-1";
        for (i = 4; i < 7; i++)
            if (!integral(a[i], 0, 255)) return "erase value must be 3 integers 0..255";
        break;
    default:
        break;
    }
    return NULL;
}

static void lut_broadcast(uint8_t *l) {
    memcpy(l + 256, l, 256);
    memcpy(l + 512, l, 256);
}

/* each channel's least and greatest value (n >= 1): the first and last non-empty bins of its
 * histogram, which is all autocontrast reads of it. Running minima and maxima of the bytes at
 * each of 192 positions (a multiple of 3: position j holds channel j % 3), a loop the compiler
 * vectorises, then reduced per channel. */
static void channel_range(const uint8_t *p, Py_ssize_t n, int *lo, int *hi) {
    uint8_t mn[192], mx[192];
    memset(mn, 255, sizeof(mn));
    memset(mx, 0, sizeof(mx));
    const Py_ssize_t len = 3 * n;
    Py_ssize_t i = 0;
    for (; i + 192 <= len; i += 192)
        for (int j = 0; j < 192; j++) {
            const uint8_t v = p[i + j];
            mn[j] = v < mn[j] ? v : mn[j];
            mx[j] = v > mx[j] ? v : mx[j];
        }
    for (int j = 0; i + j < len; j++) {
        const uint8_t v = p[i + j];
        mn[j] = v < mn[j] ? v : mn[j];
        mx[j] = v > mx[j] ? v : mx[j];
    }
    for (int c = 0; c < 3; c++) {
        lo[c] = 255;
        hi[c] = 0;
        for (int j = c; j < 192; j += 3) {
            lo[c] = mn[j] < lo[c] ? mn[j] : lo[c];
            hi[c] = mx[j] > hi[c] ? mx[j] : hi[c];
        }
    }
}

static void autocontrast_lut(const uint8_t *p, Py_ssize_t n, uint8_t *l) {
    int los[3], his[3];
    channel_range(p, n, los, his);
    for (int c = 0; c < 3; c++) {
        const int lo = los[c], hi = his[c];
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


/* hue: torchvision adjust_hue on uint8 (_rgb_to_hsv, h + factor remainder 1, _hsv_to_rgb, then
 * to uint8 as to_dtype_image: x * 255.999 truncated), every step the float32 operation torch
 * runs, in the same order: scalar factors as torch casts them to float32 (1/255, 1/6), the
 * mask products of _rgb_to_hsv as the one term they select (the others are +-0, which leave a
 * non-zero sum exact and a zero sum to +1 and fmod), torch.remainder(x, 1) as fmod plus 1 for a
 * negative result. Divisions, fmod and floor are correctly rounded or exact in IEEE float32 on
 * every CPU, and no multiply-add is fused here or in torch's kernels (alpha is 1), so the
 * bytes equal torchvision's on any host (tests/test_augment_fused.py). */
/* a ? x : y on floats by bits, so that GCC vectorises it (it does not if-convert a float
 * comparison's select of computed values) */
static inline float bit_select(int a, float x, float y) {
    uint32_t ux, uy, m = -(uint32_t)a, r;
    float out;
    memcpy(&ux, &x, 4);
    memcpy(&uy, &y, 4);
    r = (ux & m) | (uy & ~m);
    memcpy(&out, &r, 4);
    return out;
}

static inline float clamp01(float v) {
    v = v < 1.0f ? v : 1.0f;
    return v > 0.0f ? v : 0.0f;
}

/* every select computes both sides first (no branch: the sector is random per pixel) */
#define HUE_BODY                                                                           \
    const float inv255 = (float)(1.0 / 255.0), sixth = (float)(1.0 / 6.0);                 \
    const float to8 = (float)(255.0 + 1.0 - 1e-3);                                         \
    for (Py_ssize_t i = 0; i < n; i++) {                                                   \
        uint8_t *q8 = p + 3 * i;                                                           \
        const float r = (float)q8[0] * inv255, g = (float)q8[1] * inv255;                  \
        const float b = (float)q8[2] * inv255;                                             \
        const float mx = r > g ? r : g, maxc = mx > b ? mx : b;                            \
        const float mn = r < g ? r : g, minc = mn < b ? mn : b;                            \
        const int eqc = maxc == minc;                                                      \
        const float cr = maxc - minc;                                                      \
        const float s = cr / bit_select(eqc, 1.0f, maxc), d = bit_select(eqc, 1.0f, cr);   \
        const float rc = (maxc - r) / d, gc = (maxc - g) / d, bc = (maxc - b) / d;         \
        const float hr = bc - gc, hg = (rc + 2.0f) - bc, hb = (gc + 4.0f) - rc;            \
        float h = bit_select(maxc == r, hr, bit_select(maxc == g, hg, hb));                \
        h = h * sixth + 1.0f; /* in [5/6, 11/6]: fmod(h, 1) is h - 1 (exact) from 1 on */  \
        const float h1 = h - 1.0f;                                                         \
        h = bit_select(h >= 1.0f, h1, h);                                                  \
        h = h + factor; /* in [-0.5, 1.5): torch.remainder(h, 1) */                        \
        const float hd = h - 1.0f, hu = h + 1.0f;                                          \
        h = bit_select(h >= 1.0f, hd, bit_select(h < 0.0f, hu, h));                        \
        /* _hsv_to_rgb: h >= +0, so floor is the truncation; h * 6 may round up to 6 */    \
        const float h6 = h * 6.0f;                                                         \
        const int32_t fi = (int32_t)h6, sector = fi == 6 ? 0 : fi;                         \
        const float f = h6 - (float)fi;                                                    \
        const float v = maxc, sxf = s * f, oms = 1.0f - s;                                 \
        const float qq = clamp01((1.0f - sxf) * v), t = clamp01((sxf + oms) * v);          \
        const float pp = clamp01(oms * v);                                                 \
        const int s0 = sector == 0, s1 = sector == 1, s2 = sector == 2, s3 = sector == 3;  \
        const int s4 = sector == 4, s5 = sector == 5;                                      \
        /* torchvision's select table: sector -> (r, g, b) of (v, p, q, t) */              \
        const float o0 = bit_select(s0 | s5, v, bit_select(s1, qq, bit_select(s4, t, pp))); \
        const float o1 = bit_select(s1 | s2, v, bit_select(s0, t, bit_select(s3, qq, pp))); \
        const float o2 = bit_select(s3 | s4, v, bit_select(s2, t, bit_select(s5, qq, pp))); \
        q8[0] = (uint8_t)(int32_t)(o0 * to8);                                              \
        q8[1] = (uint8_t)(int32_t)(o1 * to8);                                              \
        q8[2] = (uint8_t)(int32_t)(o2 * to8);                                              \
    }

static void hue_generic(uint8_t *restrict p, Py_ssize_t n, float factor) { HUE_BODY }
#ifdef HAVE_FMA_CLONE
FMA_TARGET static void hue_avx2(uint8_t *restrict p, Py_ssize_t n, float factor) { HUE_BODY }
AVX512_TARGET static void hue_avx512(uint8_t *restrict p, Py_ssize_t n, float factor) {
    HUE_BODY
}
#endif

/* the clones only differ in vector width: the same operations, the same bytes */
static void do_hue(uint8_t *p, Py_ssize_t n, float factor) {
#ifdef HAVE_FMA_CLONE
    if (path_used == PATH_FMA) {
        if (chain_wide >= 1)
            hue_avx512(p, n, factor);
        else
            hue_avx2(p, n, factor);
        return;
    }
#endif
    hue_generic(p, n, factor);
}

/* ---- pixelwise chains: a run of consecutive brightness / contrast / saturation / grayscale /
 * posterize / solarize ops in one pass over the image per contrast op (instead of a pass per
 * op, a gray pass and a lookup table per op), with the same values: every op's arithmetic is
 * the per-op code's expression on the same integer-valued floats (a lookup-table entry
 * to_u8(v * f) is computed as the clamp and truncation of v * f, which is what the table
 * holds), so the bytes are those of the per-op path (_set_fused(0), tested). Pixels are
 * handled in blocks of CHAIN_BLOCK, deinterleaved into three float rows, so that each stage is
 * a loop the compiler vectorises. A contrast op needs the mean gray of the image it sees: the
 * pass before it sums the gray of its result (do_gray's values), and the contrast becomes the
 * first stage of the next pass. */
enum { ST_SCALE = 1, ST_CONTRAST, ST_SAT, ST_POSTERIZE, ST_SOLARIZE };
typedef struct {
    int kind;
    float f, k, m; /* factor, 1 - factor, contrast mean */
    int32_t mask, t; /* posterize mask, solarize integer threshold */
} stage_t;
#define CHAIN_BLOCK 64
#define MAX_STAGES 64

/* to_u8, in a form GCC vectorises: NaN (inf - inf, from a factor near FLT_MAX) gives 0 */
static inline int32_t clamp_trunc(float v) {
    v = v > 0.0f ? v : 0.0f;
    v = v < 255.0f ? v : 255.0f;
    return (int32_t)v;
}

/* pixels as int32 between the stages (a float -> int -> float round trip would be turned into
 * truncf, which GCC does not vectorise under -ftrapping-math) */
#define CHAIN_BODY(FUSE)                                                                   \
    long long total = 0;                                                                   \
    int32_t r[CHAIN_BLOCK], g[CHAIN_BLOCK], b[CHAIN_BLOCK];                                \
    for (Py_ssize_t i0 = 0; i0 < n; i0 += CHAIN_BLOCK) {                                  \
        const int m = (int)(n - i0 < CHAIN_BLOCK ? n - i0 : CHAIN_BLOCK);                 \
        uint8_t *restrict q = p + 3 * i0;                                                  \
        for (int i = 0; i < m; i++) {                                                      \
            r[i] = q[3 * i];                                                               \
            g[i] = q[3 * i + 1];                                                           \
            b[i] = q[3 * i + 2];                                                           \
        }                                                                                  \
        for (int s = 0; s < ns; s++) {                                                     \
            const float f = st[s].f, k = st[s].k, mu = st[s].m;                            \
            const int32_t mask = st[s].mask, t = st[s].t;                                  \
            switch (st[s].kind) {                                                          \
            case ST_SCALE:                                                                 \
                for (int i = 0; i < m; i++) {                                              \
                    r[i] = clamp_trunc((float)r[i] * f);                                   \
                    g[i] = clamp_trunc((float)g[i] * f);                                   \
                    b[i] = clamp_trunc((float)b[i] * f);                                   \
                }                                                                          \
                break;                                                                     \
            case ST_CONTRAST:                                                              \
                for (int i = 0; i < m; i++) {                                              \
                    r[i] = clamp_trunc(FUSE((float)r[i] * f, mu, k));                      \
                    g[i] = clamp_trunc(FUSE((float)g[i] * f, mu, k));                      \
                    b[i] = clamp_trunc(FUSE((float)b[i] * f, mu, k));                      \
                }                                                                          \
                break;                                                                     \
            case ST_SAT:                                                                   \
                for (int i = 0; i < m; i++) {                                              \
                    const float R = (float)r[i], G = (float)g[i], B = (float)b[i];         \
                    const float gy =                                                       \
                        (float)(int32_t)FUSE(FUSE(R * 0.2989f, G, 0.587f), B, 0.114f);     \
                    r[i] = clamp_trunc(FUSE(R * f, gy, k));                                \
                    g[i] = clamp_trunc(FUSE(G * f, gy, k));                                \
                    b[i] = clamp_trunc(FUSE(B * f, gy, k));                                \
                }                                                                          \
                break;                                                                     \
            case ST_POSTERIZE:                                                             \
                for (int i = 0; i < m; i++) {                                              \
                    r[i] &= mask;                                                          \
                    g[i] &= mask;                                                          \
                    b[i] &= mask;                                                          \
                }                                                                          \
                break;                                                                     \
            default: /* ST_SOLARIZE: v >= t, t the least integer >= the threshold */      \
                for (int i = 0; i < m; i++) {                                              \
                    r[i] = r[i] >= t ? 255 - r[i] : r[i];                                  \
                    g[i] = g[i] >= t ? 255 - g[i] : g[i];                                  \
                    b[i] = b[i] >= t ? 255 - b[i] : b[i];                                  \
                }                                                                          \
                break;                                                                     \
            }                                                                              \
        }                                                                                  \
        if (want_gray) {                                                                   \
            int32_t acc = 0;                                                               \
            for (int i = 0; i < m; i++) {                                                  \
                const float v =                                                            \
                    FUSE(FUSE((float)r[i] * 0.2989f, (float)g[i], 0.587f), (float)b[i], 0.114f); \
                acc += (int32_t)(v < 255.0f ? v : 255.0f);                                 \
            }                                                                              \
            total += acc;                                                                  \
        }                                                                                  \
        if (ns > 0)                                                                        \
            for (int i = 0; i < m; i++) {                                                  \
                q[3 * i] = (uint8_t)r[i];                                                  \
                q[3 * i + 1] = (uint8_t)g[i];                                              \
                q[3 * i + 2] = (uint8_t)b[i];                                              \
            }                                                                              \
    }                                                                                      \
    return total;

static long long chain_generic(uint8_t *p, Py_ssize_t n, const stage_t *st, int ns,
                               int want_gray) {
    CHAIN_BODY(fused)
}
static long long chain_unfused(uint8_t *p, Py_ssize_t n, const stage_t *st, int ns,
                               int want_gray) {
    CHAIN_BODY(unfused)
}
#ifdef HAVE_FMA_CLONE
FMA_TARGET static long long chain_fma(uint8_t *p, Py_ssize_t n, const stage_t *st, int ns,
                                      int want_gray) {
    CHAIN_BODY(fused_fma)
}
/* The chain in intrinsics: 16 pixels at a time with AVX-512 (chain_avx512, chain_vbmi), 8 with
 * AVX2 (chain_avx2). The bytes are deinterleaved into R, G, B float vectors, every stage runs
 * in registers with the values kept as integer-valued floats between stages (a truncation
 * toward zero, vrndscaleps / vroundps, is (float)(int32_t) of a value in [0, 255]), then they
 * are interleaved back and narrowed. Each stage is CHAIN_BODY's expression with the same IEEE
 * operations in the same order (min/max for the clamp: no NaN reaches it), so the bytes are
 * the per-op path's (tests/test_augment_fused.py compares every level with _set_fused(0)).
 * The compiler's vectorisation of CHAIN_BODY spends its time in the stride-3 gathers and the
 * int32 round trips between stages (2-3x slower, benchmarks/bench_augment_ops.py). A tail of
 * fewer than one vector of pixels runs chain_fma.
 *
 * STAGES_BODY and CHAIN_VEC_BODY are written once in these names, defined per vector width:
 * VF / VI (float / int32 vector), V(op) (the intrinsic's name), TRUNC, SOLARIZE_V, LANES. */
#define STAGES_BODY                                                                        \
    const VF v255 = V(set1_ps)(255.0f), zero = V(setzero_ps)();                            \
    VF r = *pr, g = *pg, b = *pb;                                                          \
    for (int s = 0; s < ns; s++) {                                                         \
        const VF f = V(set1_ps)(st[s].f), k = V(set1_ps)(st[s].k);                         \
        switch (st[s].kind) {                                                              \
        case ST_SCALE:                                                                     \
            r = CLAMP_TRUNC(V(mul_ps)(r, f));                                              \
            g = CLAMP_TRUNC(V(mul_ps)(g, f));                                              \
            b = CLAMP_TRUNC(V(mul_ps)(b, f));                                              \
            break;                                                                         \
        case ST_CONTRAST: {                                                                \
            const VF mu = V(set1_ps)(st[s].m);                                             \
            r = CLAMP_TRUNC(V(fmadd_ps)(mu, k, V(mul_ps)(r, f)));                          \
            g = CLAMP_TRUNC(V(fmadd_ps)(mu, k, V(mul_ps)(g, f)));                          \
            b = CLAMP_TRUNC(V(fmadd_ps)(mu, k, V(mul_ps)(b, f)));                          \
            break;                                                                         \
        }                                                                                  \
        case ST_SAT: {                                                                     \
            const VF gy = TRUNC(GRAY_V(r, g, b));                                          \
            r = CLAMP_TRUNC(V(fmadd_ps)(gy, k, V(mul_ps)(r, f)));                          \
            g = CLAMP_TRUNC(V(fmadd_ps)(gy, k, V(mul_ps)(g, f)));                          \
            b = CLAMP_TRUNC(V(fmadd_ps)(gy, k, V(mul_ps)(b, f)));                          \
            break;                                                                         \
        }                                                                                  \
        case ST_POSTERIZE: {                                                               \
            const VI mask = V(set1_epi32)(st[s].mask);                                     \
            r = V(cvtepi32_ps)(AND_I(V(cvttps_epi32)(r), mask));                           \
            g = V(cvtepi32_ps)(AND_I(V(cvttps_epi32)(g), mask));                           \
            b = V(cvtepi32_ps)(AND_I(V(cvttps_epi32)(b), mask));                           \
            break;                                                                         \
        }                                                                                  \
        default: { /* ST_SOLARIZE: v >= t (t an integer 0..255) */                         \
            const VF t = V(set1_ps)((float)st[s].t);                                       \
            r = SOLARIZE_V(r, t);                                                          \
            g = SOLARIZE_V(g, t);                                                          \
            b = SOLARIZE_V(b, t);                                                          \
            break;                                                                         \
        }                                                                                  \
        }                                                                                  \
    }                                                                                      \
    *pr = r;                                                                               \
    *pg = g;                                                                               \
    *pb = b;

/* do_gray's expression (before its clamp and truncation) */
#define GRAY_V(r, g, b)                                                                    \
    V(fmadd_ps)((b), V(set1_ps)(0.114f),                                                   \
                V(fmadd_ps)((g), V(set1_ps)(0.587f), V(mul_ps)((r), V(set1_ps)(0.2989f))))
/* max_ps returns its second operand when one is NaN: NaN gives 0, as to_u8 */
#define CLAMP_TRUNC(v) TRUNC(V(min_ps)(V(max_ps)((v), zero), v255))

/* One chain pass, LANES pixels at a time; LOAD(q) sets r, g, b from the 3 x LANES bytes at q
 * and STORE(q) writes ri, gi, bi (their int32 values) back. The gray sum is kept per lane in
 * int32 and added up every 65536 steps (65536 x 255 fits). */
#define CHAIN_VEC_BODY(STAGES, LOAD, STORE, REDUCE)                                        \
    const Py_ssize_t nv = n / LANES;                                                       \
    long long total = 0;                                                                   \
    VI acc = V(setzero_si)();                                                              \
    for (Py_ssize_t v = 0; v < nv; v++) {                                                  \
        uint8_t *q = p + 3 * LANES * v;                                                    \
        VF r, g, b;                                                                        \
        LOAD(q);                                                                           \
        STAGES(&r, &g, &b, st, ns);                                                        \
        if (want_gray) {                                                                   \
            acc = V(add_epi32)(                                                            \
                acc, V(cvttps_epi32)(V(min_ps)(GRAY_V(r, g, b), V(set1_ps)(255.0f))));     \
            if ((v & 0xffff) == 0xffff) {                                                  \
                total += REDUCE(acc);                                                      \
                acc = V(setzero_si)();                                                     \
            }                                                                              \
        }                                                                                  \
        if (ns > 0) {                                                                      \
            const VI ri = V(cvttps_epi32)(r), gi = V(cvttps_epi32)(g),                     \
                     bi = V(cvttps_epi32)(b);                                              \
            STORE(q);                                                                      \
        }                                                                                  \
    }                                                                                      \
    total += REDUCE(acc);                                                                  \
    if (LANES * nv < n)                                                                    \
        total += chain_fma(p + 3 * LANES * nv, n - LANES * nv, st, ns, want_gray);         \
    return total;

/* ---- AVX-512: 16 lanes */
#define VF __m512
#define VI __m512i
#define V(op) _mm512_##op
#define LANES 16
#define TRUNC(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)
#define AND_I(a, m) _mm512_and_si512((a), (m))
#define SOLARIZE_V(x, t)                                                                   \
    _mm512_mask_sub_ps((x), _mm512_cmp_ps_mask((x), (t), _CMP_GE_OQ), v255, (x))
#define _mm512_setzero_si _mm512_setzero_si512
AVX512_TARGET static inline __attribute__((always_inline)) void
stages16(__m512 *pr, __m512 *pg, __m512 *pb, const stage_t *st, int ns) {
    STAGES_BODY
}

/* AVX-512F/BW: the 48 bytes widened to three int32 vectors (a0 | a1 | a2) and deinterleaved
 * by two-source dword permutes; lane i of channel c is element 3i + c: an index below 32 comes
 * from (a0, a1) in the first permute, the rest from a2 (16 + j - 32) in the second, which keeps
 * the first's lanes (i). Back: output vector o holds elements 16 o .. 16 o + 15, element k
 * being channel k % 3 of pixel k / 3 (R and G by one permute, then B into its lanes). */
#define LOAD_F(q)                                                                          \
    do {                                                                                   \
        const __m512i a0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q)));   \
        const __m512i a1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((q) + 16))); \
        const __m512i a2 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((q) + 32))); \
        r = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(                                  \
            _mm512_permutex2var_epi32(a0, ilo[0], a1), ihi[0], a2));                       \
        g = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(                                  \
            _mm512_permutex2var_epi32(a0, ilo[1], a1), ihi[1], a2));                       \
        b = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(                                  \
            _mm512_permutex2var_epi32(a0, ilo[2], a1), ihi[2], a2));                       \
    } while (0)
#define STORE_F(q)                                                                         \
    for (int o = 0; o < 3; o++)                                                            \
        _mm_storeu_si128((__m128i *)((q) + 16 * o),                                       \
                         _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(                   \
                             _mm512_permutex2var_epi32(ri, ioa[o], gi), iob[o], bi)))
AVX512_TARGET static long long chain_avx512(uint8_t *p, Py_ssize_t n, const stage_t *st,
                                            int ns, int want_gray) {
    int32_t lo[3][16], hi[3][16], out_a[3][16], out_b[3][16];
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 16; i++) {
            const int j = 3 * i + c;
            lo[c][i] = j < 32 ? j : 0;
            hi[c][i] = j < 32 ? i : 16 + (j - 32);
        }
    for (int o = 0; o < 3; o++)
        for (int i = 0; i < 16; i++) {
            const int k = 16 * o + i, c = k % 3, px = k / 3;
            out_a[o][i] = c == 0 ? px : c == 1 ? 16 + px : 0;
            out_b[o][i] = c == 2 ? 16 + px : i;
        }
    __m512i ilo[3], ihi[3], ioa[3], iob[3];
    for (int c = 0; c < 3; c++) {
        ilo[c] = _mm512_loadu_si512(lo[c]);
        ihi[c] = _mm512_loadu_si512(hi[c]);
        ioa[c] = _mm512_loadu_si512(out_a[c]);
        iob[c] = _mm512_loadu_si512(out_b[c]);
    }
    CHAIN_VEC_BODY(stages16, LOAD_F, STORE_F, _mm512_reduce_add_epi32)
}

/* AVX-512 VBMI (Ice Lake and later, Zen 4): each channel's 16 bytes moved into the low bytes
 * of the dword lanes by one byte permute of the 48 (the other bytes zeroed); back, two
 * two-source byte permutes interleave the low bytes of ri, gi, bi. Three and two shuffles per
 * 16 pixels instead of nine and nine: the shuffle port is what bounds chain_avx512. The load
 * reads 64 bytes (masked to 48 for the last vector, which may end the buffer) and the store
 * writes exactly 48 (32 + 16): a 64-byte masked store overlapping the next vector's load
 * stalls its store forwarding (measured 3x slower). */
#define LOAD_V(q)                                                                          \
    do {                                                                                   \
        const __m512i x = v + 1 < nv ? _mm512_loadu_si512((q))                             \
                                     : _mm512_maskz_loadu_epi8(0xffffffffffffULL, (q));    \
        r = _mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(low_bytes, iv[0], x));        \
        g = _mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(low_bytes, iv[1], x));        \
        b = _mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(low_bytes, iv[2], x));        \
    } while (0)
#define STORE_V(q)                                                                         \
    do {                                                                                   \
        const __m512i y =                                                                  \
            _mm512_permutex2var_epi8(_mm512_permutex2var_epi8(ri, iva, gi), ivb, bi);      \
        _mm256_storeu_si256((__m256i *)(q), _mm512_castsi512_si256(y));                    \
        _mm_storeu_si128((__m128i *)((q) + 32), _mm512_extracti32x4_epi32(y, 2));          \
    } while (0)
VBMI_TARGET static long long chain_vbmi(uint8_t *p, Py_ssize_t n, const stage_t *st, int ns,
                                        int want_gray) {
    uint8_t in[3][64], out_a[64], out_b[64];
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 64; i++) in[c][i] = (uint8_t)(3 * (i / 4) + c); /* byte 4 px */
    for (int k = 0; k < 64; k++) {
        const int c = k % 3, px = k / 3;
        out_a[k] = (uint8_t)(k >= 48 ? 0 : c == 0 ? 4 * px : c == 1 ? 64 + 4 * px : 0);
        out_b[k] = (uint8_t)(k < 48 && c == 2 ? 64 + 4 * px : k);
    }
    const __m512i iv[3] = {_mm512_loadu_si512(in[0]), _mm512_loadu_si512(in[1]),
                           _mm512_loadu_si512(in[2])};
    const __m512i iva = _mm512_loadu_si512(out_a), ivb = _mm512_loadu_si512(out_b);
    const __mmask64 low_bytes = 0x1111111111111111ULL;
    CHAIN_VEC_BODY(stages16, LOAD_V, STORE_V, _mm512_reduce_add_epi32)
}
#undef VF
#undef VI
#undef V
#undef LANES
#undef TRUNC
#undef AND_I
#undef SOLARIZE_V
#undef _mm512_setzero_si

/* ---- AVX2: 8 lanes */
#define VF __m256
#define VI __m256i
#define V(op) _mm256_##op
#define LANES 8
#define TRUNC(v) _mm256_round_ps((v), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)
#define AND_I(a, m) _mm256_and_si256((a), (m))
#define SOLARIZE_V(x, t)                                                                   \
    _mm256_blendv_ps((x), _mm256_sub_ps(v255, (x)), _mm256_cmp_ps((x), (t), _CMP_GE_OQ))
#define _mm256_setzero_si _mm256_setzero_si256
FMA_TARGET static inline __attribute__((always_inline)) void
stages8(__m256 *pr, __m256 *pg, __m256 *pb, const stage_t *st, int ns) {
    STAGES_BODY
}

FMA_TARGET static inline __attribute__((always_inline)) int32_t reduce8(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* AVX2: the 24 bytes as two overlapping 16-byte loads (bytes 0-15 and 8-23, never past the
 * 24), R and G gathered into one register's two halves and B into another by byte shuffles,
 * then widened. Back: packs to bytes (per 128-bit lane: R0-3 G0-3 B0-3 B0-3, then pixels 4-7),
 * one in-lane shuffle interleaves each lane's 4 pixels into 12 bytes and a dword permute
 * joins the two 12s; 16 + 8 bytes are stored. */
#define LOAD_A(q)                                                                          \
    do {                                                                                   \
        const __m128i x = _mm_loadu_si128((const __m128i *)(q));                           \
        const __m128i y = _mm_loadu_si128((const __m128i *)((q) + 8));                     \
        const __m128i rg = _mm_or_si128(_mm_shuffle_epi8(x, rg_x), _mm_shuffle_epi8(y, rg_y)); \
        const __m128i bb = _mm_or_si128(_mm_shuffle_epi8(x, b_x), _mm_shuffle_epi8(y, b_y)); \
        r = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(rg));                                  \
        g = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(rg, rg)));          \
        b = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bb));                                  \
    } while (0)
#define STORE_A(q)                                                                         \
    do {                                                                                   \
        const __m256i u8 = _mm256_packus_epi16(_mm256_packus_epi32(ri, gi),                \
                                               _mm256_packus_epi32(bi, bi));               \
        const __m256i px = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(u8, weave), join); \
        _mm_storeu_si128((__m128i *)(q), _mm256_castsi256_si128(px));                      \
        _mm_storel_epi64((__m128i *)((q) + 16), _mm256_extracti128_si256(px, 1));          \
    } while (0)
FMA_TARGET static long long chain_avx2(uint8_t *p, Py_ssize_t n, const stage_t *st, int ns,
                                       int want_gray) {
    /* R = bytes 0, 3, .., 21 and G = 1, 4, .., 22 of the 24 (x holds 0-15, y 8-23) */
    const __m128i rg_x = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1);
    const __m128i rg_y = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 10, 13, -1, -1, -1, -1, -1, 8, 11,
                                       14);
    const __m128i b_x = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i b_y = _mm_setr_epi8(-1, -1, -1, -1, -1, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1,
                                      -1);
    const __m256i weave = _mm256_setr_epi8(0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, -1, -1, -1, -1,
                                           0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7);
    CHAIN_VEC_BODY(stages8, LOAD_A, STORE_A, reduce8)
}
#undef VF
#undef VI
#undef V
#undef LANES
#undef TRUNC
#undef AND_I
#undef SOLARIZE_V
#undef _mm256_setzero_si
#undef LOAD_F
#undef STORE_F
#undef LOAD_V
#undef STORE_V
#undef LOAD_A
#undef STORE_A
#undef STAGES_BODY
#undef GRAY_V
#undef CLAMP_TRUNC
#undef CHAIN_VEC_BODY
#endif

/* one pass: the stages (written back when there are any), and the sum of do_gray's values of
 * the result when want_gray */
static long long chain_pass(uint8_t *p, Py_ssize_t n, const stage_t *st, int ns,
                            int want_gray) {
    if (separate_rounding) return chain_unfused(p, n, st, ns, want_gray);
#ifdef HAVE_FMA_CLONE
    if (path_used == PATH_FMA)
        return chain_wide == 2   ? chain_vbmi(p, n, st, ns, want_gray)
               : chain_wide == 1 ? chain_avx512(p, n, st, ns, want_gray)
                                 : chain_avx2(p, n, st, ns, want_gray);
#endif
    return chain_generic(p, n, st, ns, want_gray);
}

/* whether tables pay: do_lut is vectorised (AVX-512 VBMI), 4 us for a table against 18-27 us
 * for a vector pass at 224 px */
static int tables_fast(void) {
#ifdef HAVE_FMA_CLONE
    return path_used == PATH_FMA && chain_wide == 2;
#else
    return 0;
#endif
}

/* the stages st[0..ns) (each mapping a channel value alone) applied as their table */
static void stages_as_table(uint8_t *p, Py_ssize_t n, const stage_t *st, int ns) {
    uint8_t px[768], lut[768];
    for (int v = 0; v < 256; v++) px[3 * v] = px[3 * v + 1] = px[3 * v + 2] = (uint8_t)v;
    chain_pass(px, 256, st, ns, 0);
    for (int v = 0; v < 256; v++) lut[v] = px[3 * v];
    lut_broadcast(lut);
    do_lut(p, n, lut, 1);
}

/* chain_pass's bytes and gray sum, through tables where tables_fast. Brightness, contrast,
 * posterize and solarize map each channel value alone (saturation and grayscale, ST_SAT, mix
 * the channels): a pass with no saturation is its table (then a read-only pass for the gray
 * sum); in a pass with one, the stages before the first saturation are a table applied first,
 * and the stages after the last one a table applied after when the pass needs no gray sum
 * (each stage costs the vector pass 5-7 us at 224 px, a table 4 us for all of them: standard's
 * colour jitter 43 -> 37 us per image on average over its six orders). Each table is those
 * stages run on the 256 values through chain_pass (the same code path, so the same arithmetic
 * lane by lane), so every byte is chain_pass's. */
static long long chain_run(uint8_t *p, Py_ssize_t n, const stage_t *st, int ns,
                           int want_gray) {
    if (ns == 0 || !tables_fast()) return chain_pass(p, n, st, ns, want_gray);
    int first = 0, last = ns - 1;
    while (first < ns && st[first].kind != ST_SAT) first++;
    if (first == ns) { /* no saturation: the pass is its table */
        stages_as_table(p, n, st, ns);
        return want_gray ? chain_pass(p, n, st, 0, 1) : 0;
    }
    while (st[last].kind != ST_SAT) last--;
    const int tail = want_gray ? 0 : ns - 1 - last;
    if (first == 0 && tail == 0) return chain_pass(p, n, st, ns, want_gray);
    if (first > 0) stages_as_table(p, n, st, first);
    const long long total = chain_pass(p, n, st + first, ns - first - tail, want_gray);
    if (tail > 0) stages_as_table(p, n, st + last + 1, tail);
    return total;
}

static int chainable(int code) {
    return code == OP_BRIGHTNESS || code == OP_CONTRAST || code == OP_SATURATION ||
           code == OP_GRAYSCALE || code == OP_POSTERIZE || code == OP_SOLARIZE;
}

/* whether one op alone is faster as a chain than as its per-op pass: any op but posterize (a
 * byte-wise AND the compiler vectorises 64 bytes at a time) on the intrinsics (AVX2 and
 * AVX-512 clones: 46 -> 35 us for a brightness, 100 -> 53 us for a contrast at 224 px, AVX2),
 * only saturation and grayscale in portable code, where a lookup table is a little faster
 * alone (same bytes either way) */
static int chain_pays(int code) {
#ifdef HAVE_FMA_CLONE
    if (path_used == PATH_FMA) return code != OP_POSTERIZE;
#endif
    return code == OP_SATURATION || code == OP_GRAYSCALE;
}

/* ops[0..nops) all chainable: applies them in order, one pass per contrast op plus one */
static void do_chain(uint8_t *p, Py_ssize_t n, const double *ops, Py_ssize_t nops) {
    stage_t st[MAX_STAGES];
    int ns = 0;
    for (Py_ssize_t k = 0; k < nops; k++) {
        const double *a = ops + k * OP_WIDTH + 1;
        const int code = (int)ops[k * OP_WIDTH];
        stage_t s = {0, 0.0f, 0.0f, 0.0f, 0, 0};
        if (ns == MAX_STAGES) { /* flush (a long program) */
            chain_run(p, n, st, ns, 0);
            ns = 0;
        }
        switch (code) {
        case OP_BRIGHTNESS:
            s.kind = ST_SCALE;
            s.f = (float)a[0];
            break;
        case OP_CONTRAST: {
            const long long total = chain_run(p, n, st, ns, 1);
            ns = 0;
            s.kind = ST_CONTRAST;
            s.f = (float)a[0];
            s.k = (float)(1.0 - a[0]);
            s.m = (float)total / (float)n;
            break;
        }
        case OP_SATURATION:
            s.kind = ST_SAT;
            s.f = (float)a[0];
            s.k = (float)(1.0 - a[0]);
            break;
        case OP_GRAYSCALE:
            s.kind = ST_SAT;
            s.f = 0.0f;
            s.k = 1.0f;
            break;
        case OP_POSTERIZE: {
            const int bits = (int)a[0];
            if (bits >= 8) continue;
            s.kind = ST_POSTERIZE;
            s.mask = ((1 << bits) - 1) << (8 - bits);
            break;
        }
        default: { /* OP_SOLARIZE: (float)v >= (float)threshold <=> v >= ceil((float)threshold) */
            const float thr = (float)a[0];
            s.kind = ST_SOLARIZE;
            s.t = thr <= 0.0f ? 0 : (int32_t)ceilf(thr); /* thr <= 255: op_problem */
            break;
        }
        }
        st[ns++] = s;
    }
    if (ns > 0) chain_run(p, n, st, ns, 0);
}

/* every row already passed op_problem() */
static void run_program(uint8_t *p, Py_ssize_t h, Py_ssize_t w, const double *ops,
                        Py_ssize_t nops, uint8_t *scratch) {
    const Py_ssize_t n = h * w;
    uint8_t lut[768];
    int32_t hist[768];
    for (Py_ssize_t k = 0; k < nops; k++) {
        const double *a = ops + k * OP_WIDTH + 1;
        if (fuse_chains && chainable((int)ops[k * OP_WIDTH])) {
            Py_ssize_t j = k + 1;
            while (j < nops && chainable((int)ops[j * OP_WIDTH])) j++;
            if (j - k > 1 || chain_pays((int)ops[k * OP_WIDTH])) {
                do_chain(p, n, ops + k * OP_WIDTH, j - k);
                k = j - 1;
                continue;
            }
        }
        switch ((int)ops[k * OP_WIDTH]) {
        case OP_BRIGHTNESS: {
            const float f = (float)a[0];
            for (int v = 0; v < 256; v++) lut[v] = to_u8((float)v * f);
            lut_broadcast(lut);
            do_lut(p, n, lut, 1);
            break;
        }
        case OP_CONTRAST: {
            const float f = (float)a[0], alpha = (float)(1.0 - a[0]);
            const float mean = (float)do_gray(p, scratch, n) / (float)n;
            for (int v = 0; v < 256; v++)
                lut[v] = to_u8(separate_rounding ? unfused((float)v * f, mean, alpha)
                                                 : fused((float)v * f, mean, alpha));
            lut_broadcast(lut);
            do_lut(p, n, lut, 1);
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
            do_lut(p, n, lut, 1);
            break;
        }
        case OP_AUTOCONTRAST:
            autocontrast_lut(p, n, lut);
            do_lut(p, n, lut, 0);
            break;
        case OP_EQUALIZE:
            do_hist(p, n, hist);
            equalize_lut(hist, n, lut);
            do_lut(p, n, lut, 0);
            break;
        case OP_GRAYSCALE:
            do_saturation(p, n, 0.0f, 1.0f);
            break;
        case OP_HUE:
            do_hue(p, n, (float)a[0]);
            break;
        case OP_AFFINE: {
            const float t[6] = {(float)a[0], (float)a[1], (float)a[2],
                                (float)a[3], (float)a[4], (float)a[5]};
            const uint8_t f8[3] = {(uint8_t)a[6], (uint8_t)a[7], (uint8_t)a[8]};
            if (fuse_chains && is_translation(t, h, w))
                do_translate(p, scratch, h, w, (Py_ssize_t)t[2], (Py_ssize_t)t[5], f8);
            else
                do_affine(p, scratch, h, w, t, f8);
            break;
        }
        case OP_ERASE: { /* the box [i0, i0 + eh) x [j0, j0 + ew), clipped to the image */
            const long long i0 = (long long)a[0], j0 = (long long)a[1];
            const long long y1 = i0 + (long long)a[2] < h ? i0 + (long long)a[2] : h;
            const long long x1 = j0 + (long long)a[3] < w ? j0 + (long long)a[3] : w;
            const uint8_t v0 = (uint8_t)a[4], v1 = (uint8_t)a[5], v2 = (uint8_t)a[6];
            for (long long y = i0; y < y1; y++)
                for (long long x = j0; x < x1; x++) {
                    uint8_t *q = p + (y * w + x) * 3;
                    q[0] = v0;
                    q[1] = v1;
                    q[2] = v2;
                }
            break;
        }
        default: /* unreachable: validated */
            break;
        }
    }
}

static int f64_format(const char *f) {
    return f == NULL || !strcmp(f, "d") || !strcmp(f, "=d") || !strcmp(f, "@d")
#if PY_LITTLE_ENDIAN
           || !strcmp(f, "<d")
#else
           || !strcmp(f, ">d")
#endif
        ;
}

static PyObject *k_run(PyObject *self, PyObject *args) {
    PyObject *img_obj, *ops_obj;
    Py_ssize_t h, w;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnnO", &img_obj, &h, &w, &ops_obj)) return NULL;
    Py_buffer img, ops;
    if (get_image(img_obj, &img, h, w, 1) < 0) return NULL;
    if (PyObject_GetBuffer(ops_obj, &ops, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&img);
        return NULL;
    }
    if (ops.itemsize != sizeof(double) || !f64_format(ops.format) ||
        ops.len % (OP_WIDTH * sizeof(double)) != 0) {
        PyErr_Format(PyExc_ValueError, "ops: %zd bytes of format %s; expected a C-contiguous "
                     "float64 (n, %d) array", ops.len, ops.format ? ops.format : "B", OP_WIDTH);
        PyBuffer_Release(&img);
        PyBuffer_Release(&ops);
        return NULL;
    }
    const Py_ssize_t nops = ops.len / (OP_WIDTH * (Py_ssize_t)sizeof(double));
    const double *rows = (const double *)ops.buf;
    for (Py_ssize_t k = 0; k < nops; k++) {
        const char *why = op_problem(rows + k * OP_WIDTH);
        if (why) {
            const double *r = rows + k * OP_WIDTH;
            char got[OP_WIDTH * 26 + 8];
            size_t used = 0;
            for (int i = 0; i < OP_WIDTH && used < sizeof(got); i++)
                used += (size_t)snprintf(got + used, sizeof(got) - used, i ? ", %.17g" : "%.17g",
                                         r[i]);
            PyErr_Format(PyExc_ValueError, "ops row %zd: %s; got [%s]", k, why, got);
            PyBuffer_Release(&img);
            PyBuffer_Release(&ops);
            return NULL;
        }
    }
    uint8_t *scratch = (uint8_t *)malloc(affine_scratch(h, w));
    if (scratch == NULL) {
        PyBuffer_Release(&img);
        PyBuffer_Release(&ops);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    run_program((uint8_t *)img.buf, h, w, rows, nops, scratch);
    Py_END_ALLOW_THREADS
    free(scratch);
    PyBuffer_Release(&img);
    PyBuffer_Release(&ops);
    Py_RETURN_NONE;
}

static PyObject *k_path(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return Py_BuildValue("(ii)", path_used, path_best);
}

static PyObject *k_set_path(PyObject *self, PyObject *args) {
    int level;
    (void)self;
    if (!PyArg_ParseTuple(args, "i", &level)) return NULL;
    path_used = level <= PATH_PORTABLE ? PATH_PORTABLE : path_best;
    return PyLong_FromLong(path_used);
}

static PyObject *k_set_separate_rounding(PyObject *self, PyObject *args) {
    int flag;
    (void)self;
    if (!PyArg_ParseTuple(args, "p", &flag)) return NULL;
    const int before = separate_rounding;
    separate_rounding = flag;
    return PyBool_FromLong(before);
}

static PyObject *k_set_wide(PyObject *self, PyObject *args) {
    int flag;
    (void)self;
    if (!PyArg_ParseTuple(args, "i", &flag)) return NULL;
#ifdef HAVE_FMA_CLONE
    static int wide_best = -2;
    if (wide_best == -2) wide_best = chain_wide;
    const int before = chain_wide;
    chain_wide = flag <= 0 ? 0 : flag < wide_best ? flag : wide_best;
    return PyLong_FromLong(before);
#else
    (void)flag;
    return PyLong_FromLong(0);
#endif
}

static PyObject *k_set_fused(PyObject *self, PyObject *args) {
    int flag;
    (void)self;
    if (!PyArg_ParseTuple(args, "p", &flag)) return NULL;
    const int before = fuse_chains;
    fuse_chains = flag;
    return PyBool_FromLong(before);
}

static PyMethodDef kernel_methods[] = {
    {"run", k_run, METH_VARARGS,
     "run(image, h, w, ops) -> None: a program (float64 (n, 10) rows: opcode, arguments) in "
     "place on a C-contiguous (h, w, 3) uint8 buffer, without the GIL; ValueError for a bad "
     "size, buffer or row (nothing is written then)"},
    {"gray", k_gray, METH_VARARGS,
     "gray(image, h, w, out) -> int: floor of torchvision's grayscale into out (h * w uint8), "
     "returns the sum"},
    {"path", k_path, METH_NOARGS,
     "path() -> (path in use, best here): PATH_PORTABLE or PATH_FMA (the same bytes)"},
    {"_set_path", k_set_path, METH_VARARGS,
     "_set_path(level) -> path in use (min(level, best)); tests only (not while another "
     "thread runs a program)"},
    {"_set_separate_rounding", k_set_separate_rounding, METH_VARARGS,
     "_set_separate_rounding(flag) -> the previous flag: round a + b * k twice, as torch's "
     "scalar DEFAULT kernels; tests only"},
    {"_set_wide", k_set_wide, METH_VARARGS,
     "_set_wide(level) -> the previous level: the AVX2 clones (0), the AVX-512 ones of the "
     "colour chains, hue and sharpness (1) and the colour chains' VBMI one (2), each capped "
     "at what the CPU has (the level in effect is what the next call returns); the same "
     "bytes; tests and benchmarks only"},
    {"_set_fused", k_set_fused, METH_VARARGS,
     "_set_fused(flag) -> the previous flag: runs of pixelwise colour ops in one pass per "
     "contrast op (1, the default) or a pass per op (0, the reference); tests only"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef kernel_module = {PyModuleDef_HEAD_INIT, "_kernels",
                                           "uint8 HWC augmentation kernels (GIL released)", -1,
                                           kernel_methods, NULL, NULL, NULL, NULL};

/* a + b * k of values whose fused and separately rounded results differ: b * k = 1 + 2**-11 +
 * 2**-24 rounds (a tie, to even) to 1 + 2**-11, so a + b * k is 0 unless contracted */
__attribute__((noinline)) static float probe_contraction(float a, float b, float k) {
    return a + b * k;
}

PyMODINIT_FUNC PyInit__kernels(void) {
    volatile float a = -1.00048828125f, b = 1.000244140625f;
    if (probe_contraction(a, b, b) != 0.0f) {
        PyErr_SetString(PyExc_ImportError,
                        "shardkit.augment._kernels was compiled with floating-point contraction "
                        "(a * b + c fused): its pixels would differ from torchvision's; rebuild "
                        "with -ffp-contract=off (setup.py sets it)");
        return NULL;
    }
#ifdef HAVE_FMA_CLONE
    path_best = cpu_has_fma() ? PATH_FMA : PATH_PORTABLE;
    chain_wide = path_best == PATH_FMA && __builtin_cpu_supports("avx512f") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512dq");
    if (chain_wide && __builtin_cpu_supports("avx512vbmi")) chain_wide = 2;
#endif
    path_used = path_best;
    PyObject *m = PyModule_Create(&kernel_module);
    if (!m) return NULL;
    PyModule_AddIntConstant(m, "PATH_PORTABLE", PATH_PORTABLE);
    PyModule_AddIntConstant(m, "PATH_FMA", PATH_FMA);
    PyModule_AddIntConstant(m, "MAX_SIDE", MAX_SIDE);
    return m;
}
