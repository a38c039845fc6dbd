/*
 * _resample.h: the interface of _resample.c (Pillow-exact RGB resize), shared by _jpegroi.c.
 *
 * Filter codes are Pillow's (PIL.Image.Resampling: NEAREST=0, BILINEAR=2, BICUBIC=3, BOX=4);
 * shardkit/decode/resize.py passes them through unchanged. rs_resize implements BOX, BILINEAR
 * and BICUBIC only (NEAREST is done by Pillow itself).
 */
#ifndef SHARDKIT_RESAMPLE_H
#define SHARDKIT_RESAMPLE_H

#define RS_BILINEAR 2
#define RS_BICUBIC 3
#define RS_BOX 4
#define RS_FILTER_OK(f) ((f) == RS_BOX || (f) == RS_BILINEAR || (f) == RS_BICUBIC)

/* Horizontal-pass implementations, in increasing order of preference. Which ones exist depends
 * on the build target (compile-time guard) and the CPU (runtime check); see rs_simd_init. */
#define RS_SIMD_SCALAR 0 /* portable C, every architecture */
#define RS_SIMD_SSE41 1  /* x86 / x86-64 with SSE4.1 */
#define RS_SIMD_AVX2 2   /* x86-64 with AVX2 (rows in groups of 4, rest via SSE4.1) */

/* Resize the float box (x0, y0, x1, y1) of src (sh rows of sw packed RGB pixels) into dst (oh
 * rows of ow packed RGB pixels), mirrored left-right when flip. 0 on success, -1 out of memory.
 * Thread-safe; does not touch Python objects (callers release the GIL around it). */
int rs_resize(const unsigned char *src, int sw, int sh, const float box[4], unsigned char *dst,
              int ow, int oh, int flip, int filter);

/* Detect the best horizontal-pass implementation this build and CPU support, select it, and
 * return its level (RS_SIMD_*). Called once from the module init. */
int rs_simd_init(void);

/* Select level min(level, best supported); returns the level now in use. For tests (scalar vs
 * SIMD equality): not meant to be called while another thread is resizing. */
int rs_simd_set(int level);

/* The level in use, and the best one supported here (both RS_SIMD_*). */
int rs_simd_get(void);
int rs_simd_best(void);

#endif /* SHARDKIT_RESAMPLE_H */
