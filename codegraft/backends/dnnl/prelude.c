/* codegraft dnnl backend: the fixed part of every generated partition.
 *
 * A partition is a net: values (one oneDNN memory each, in the format the primitive that
 * wrote it chose), and steps (primitive + arguments) run in order per call.  cg_build, the
 * generated part, creates the primitives once at load: convolutions and matmuls ask for
 * `any` formats so oneDNN picks blocked layouts; a value is reordered only where a reader
 * wants another format (as(): once per value and format, cached); weights are reordered
 * once, at load, from the weights blob.  Partition inputs and outputs are plain row-major
 * memories whose data pointers are set per call.
 */
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oneapi/dnnl/dnnl.h"

extern void omp_set_num_threads(int);

#define D(...) ((const int64_t[]){__VA_ARGS__})

typedef struct { dnnl_primitive_t prim; int nargs; dnnl_exec_arg_t *args; } step_t;
typedef struct { int value; dnnl_memory_t mem; } cached_t;
typedef struct { dnnl_memory_t view, base; } view_t;

typedef struct net {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    const float *weights;
    dnnl_memory_t *vals; /* by value index */
    dnnl_memory_t *ins, *outs; /* plain memories whose handles are set per call */
    int nins, nouts;
    step_t *steps; int nsteps, csteps;
    cached_t *cache; int ncache, ccache;
    view_t *views; int nviews, cviews;
    dnnl_memory_t *owned; int nowned, cowned;
    dnnl_memory_desc_t *mds; int nmds, cmds;
    jmp_buf fail;
    char err[512];
} net_t;

#define GROW(arr, n, cap) \
    do { if ((n) == (cap)) { (cap) = (cap) ? 2 * (cap) : 16; (arr) = realloc((arr), (cap) * sizeof *(arr)); } } while (0)

static void ck(net_t *n, dnnl_status_t s, const char *what) {
    if (s != dnnl_success) {
        snprintf(n->err, sizeof n->err, "%s: oneDNN status %d", what, (int)s);
        longjmp(n->fail, 1);
    }
}
#define CK(call) ck(n, (call), #call)

static const_dnnl_memory_desc_t md_of(net_t *n, dnnl_memory_t m) {
    const_dnnl_memory_desc_t md;
    CK(dnnl_memory_get_memory_desc(m, &md));
    return md;
}

static const_dnnl_memory_desc_t keep_md(net_t *n, dnnl_memory_desc_t md) {
    GROW(n->mds, n->nmds, n->cmds);
    return n->mds[n->nmds++] = md;
}

/* plain row-major (tag a, ab, abc, ...) or `any` when tag is dnnl_format_tag_any */
static const_dnnl_memory_desc_t tagged(net_t *n, int nd, const int64_t *dims, dnnl_format_tag_t tag) {
    static const dnnl_format_tag_t plain[] = {dnnl_a, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd, dnnl_abcde, dnnl_abcdef};
    dnnl_memory_desc_t md;
    int64_t one = 1;
    if (nd == 0) { nd = 1; dims = &one; }
    CK(dnnl_memory_desc_create_with_tag(&md, nd, dims, dnnl_f32, tag == dnnl_format_tag_undef ? plain[nd] : tag));
    return keep_md(n, md);
}
#define PLAIN(nd, dims) tagged(n, nd, dims, dnnl_format_tag_undef)
#define ANY(nd, dims) tagged(n, nd, dims, dnnl_format_tag_any)

static dnnl_memory_t new_mem(net_t *n, const_dnnl_memory_desc_t md, void *handle) {
    dnnl_memory_t m;
    CK(dnnl_memory_create(&m, md, n->eng, handle));
    GROW(n->owned, n->nowned, n->cowned);
    return n->owned[n->nowned++] = m;
}

static void add_step(net_t *n, dnnl_primitive_desc_t pd, int nargs, const dnnl_exec_arg_t *args) {
    step_t s;
    CK(dnnl_primitive_create(&s.prim, pd));
    CK(dnnl_primitive_desc_destroy(pd));
    s.nargs = nargs;
    s.args = malloc(nargs * sizeof *args);
    memcpy(s.args, args, nargs * sizeof *args);
    GROW(n->steps, n->nsteps, n->csteps);
    n->steps[n->nsteps++] = s;
}

/* a reorder of src into a new memory of format `want`: a step per call, or run now (weights) */
static dnnl_memory_t reorder(net_t *n, dnnl_memory_t src, const_dnnl_memory_desc_t want, int now) {
    dnnl_memory_t dst = new_mem(n, want, DNNL_MEMORY_ALLOCATE);
    dnnl_primitive_desc_t pd;
    CK(dnnl_reorder_primitive_desc_create(&pd, md_of(n, src), n->eng, want, n->eng, NULL));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    if (!now) {
        add_step(n, pd, 2, args);
        return dst;
    }
    dnnl_primitive_t p;
    CK(dnnl_primitive_create(&p, pd));
    CK(dnnl_primitive_desc_destroy(pd));
    CK(dnnl_primitive_execute(p, n->stream, 2, args));
    CK(dnnl_stream_wait(n->stream));
    CK(dnnl_primitive_destroy(p));
    return dst;
}

/* value v in format `want`: itself, a conversion made before, or a new per-call reorder */
static dnnl_memory_t as(net_t *n, int v, const_dnnl_memory_desc_t want) {
    if (dnnl_memory_desc_equal(md_of(n, n->vals[v]), want)) return n->vals[v];
    for (int i = 0; i < n->ncache; i++)
        if (n->cache[i].value == v && dnnl_memory_desc_equal(md_of(n, n->cache[i].mem), want)) return n->cache[i].mem;
    dnnl_memory_t m = reorder(n, n->vals[v], want, 0);
    GROW(n->cache, n->ncache, n->ccache);
    n->cache[n->ncache++] = (cached_t){v, m};
    return m;
}

/* a constant from the weights blob, reordered once into `want` (NULL: kept plain) */
static dnnl_memory_t weight(net_t *n, long offset, int nd, const int64_t *dims, const_dnnl_memory_desc_t want) {
    dnnl_memory_t m = new_mem(n, PLAIN(nd, dims), (void *)(n->weights + offset));
    if (want == NULL || dnnl_memory_desc_equal(md_of(n, m), want)) return m;
    return reorder(n, m, want, 1);
}

/* v's data seen with another descriptor (same bytes): Reshape, Flatten, Transpose's source */
static dnnl_memory_t view(net_t *n, dnnl_memory_t base, const_dnnl_memory_desc_t md) {
    void *handle;
    CK(dnnl_memory_get_data_handle(base, &handle));
    dnnl_memory_t m = new_mem(n, md, handle ? handle : DNNL_MEMORY_NONE);
    GROW(n->views, n->nviews, n->cviews);
    n->views[n->nviews++] = (view_t){m, base}; /* inputs' handles change per call */
    return m;
}

/* post-ops: a sum (the residual, already in dst) first when `sum`, then eltwise ops */
static dnnl_primitive_attr_t post_ops(net_t *n, int sum, int count, const int *algs, const float *alphas,
                                      const float *betas) {
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t ops;
    CK(dnnl_primitive_attr_create(&attr));
    CK(dnnl_post_ops_create(&ops));
    if (sum) CK(dnnl_post_ops_append_sum(ops, 1.0f, 0, dnnl_data_type_undef));
    for (int i = 0; i < count; i++) CK(dnnl_post_ops_append_eltwise(ops, (dnnl_alg_kind_t)algs[i], alphas[i], betas[i]));
    CK(dnnl_primitive_attr_set_post_ops(attr, ops));
    CK(dnnl_post_ops_destroy(ops));
    return attr;
}
#define NO_POST_OPS post_ops(n, 0, 0, NULL, NULL, NULL)
#define ELTWISE(alg, alpha, beta) post_ops(n, 0, 1, (const int[]){alg}, (const float[]){alpha}, (const float[]){beta})
#define SUM_ELTWISE(alg, alpha, beta) post_ops(n, 1, 1, (const int[]){alg}, (const float[]){alpha}, (const float[]){beta})
#define SUM_ONLY post_ops(n, 1, 0, NULL, NULL, NULL)

/* dst for a primitive with a sum post-op: the residual itself when it dies here and has the
   format (in place), else a copy of it made per call */
static dnnl_memory_t sum_dst(net_t *n, int residual, int in_place, const_dnnl_memory_desc_t dst_md) {
    if (in_place && dnnl_memory_desc_equal(md_of(n, n->vals[residual]), dst_md)) return n->vals[residual];
    return reorder(n, n->vals[residual], dst_md, 0);
}

static dnnl_memory_t output_of(net_t *n, int residual, int in_place, const_dnnl_memory_desc_t dst_md) {
    return residual >= 0 ? sum_dst(n, residual, in_place, dst_md) : new_mem(n, dst_md, DNNL_MEMORY_ALLOCATE);
}

static void conv(net_t *n, int dst, int src, int nd, const int64_t *src_dims, const int64_t *dst_dims, long w_off,
                 int w_nd, const int64_t *w_dims, long b_off, const int64_t *strides, const int64_t *dilates,
                 const int64_t *pad_l, const int64_t *pad_r, int residual, int in_place, dnnl_primitive_attr_t attr) {
    dnnl_primitive_desc_t pd;
    const_dnnl_memory_desc_t bias = b_off >= 0 ? PLAIN(1, &dst_dims[1]) : NULL;
    CK(dnnl_convolution_forward_primitive_desc_create(&pd, n->eng, dnnl_forward_inference, dnnl_convolution_direct,
                                                      ANY(nd, src_dims), ANY(w_nd, w_dims), bias, ANY(nd, dst_dims),
                                                      strides, dilates, pad_l, pad_r, attr));
    CK(dnnl_primitive_attr_destroy(attr));
    dnnl_memory_t s = as(n, src, dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0));
    dnnl_memory_t w = weight(n, w_off, w_nd, w_dims, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0));
    dnnl_memory_t d = output_of(n, residual, in_place, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, d}, {DNNL_ARG_BIAS, NULL}};
    if (b_off >= 0) args[3].memory = weight(n, b_off, 1, &dst_dims[1], NULL);
    add_step(n, pd, b_off >= 0 ? 4 : 3, args);
    n->vals[dst] = d;
}

/* src [.., M, K] x weights [.., K, N] (+ bias [.., 1, N]); w_strides describe the blob's layout */
static void matmul(net_t *n, int dst, int src, int nd, const int64_t *src_dims, const int64_t *dst_dims, long w_off,
                   const int64_t *w_dims, const int64_t *w_strides, long b_off, const int64_t *b_dims,
                   dnnl_primitive_attr_t attr) {
    dnnl_memory_desc_t wmd;
    CK(dnnl_memory_desc_create_with_strides(&wmd, nd, w_dims, dnnl_f32, w_strides));
    const_dnnl_memory_desc_t w_md = keep_md(n, wmd);
    const_dnnl_memory_desc_t bias = b_off >= 0 ? PLAIN(nd, b_dims) : NULL;
    dnnl_primitive_desc_t pd;
    CK(dnnl_matmul_primitive_desc_create(&pd, n->eng, ANY(nd, src_dims), ANY(nd, w_dims), bias, ANY(nd, dst_dims),
                                         attr));
    CK(dnnl_primitive_attr_destroy(attr));
    dnnl_memory_t s = as(n, src, dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0));
    dnnl_memory_t w = new_mem(n, w_md, (void *)(n->weights + w_off));
    const_dnnl_memory_desc_t w_want = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (!dnnl_memory_desc_equal(w_md, w_want)) w = reorder(n, w, w_want, 1);
    dnnl_memory_t d = new_mem(n, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), DNNL_MEMORY_ALLOCATE);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, d}, {DNNL_ARG_BIAS, NULL}};
    if (b_off >= 0) args[3].memory = weight(n, b_off, nd, b_dims, NULL);
    add_step(n, pd, b_off >= 0 ? 4 : 3, args);
    n->vals[dst] = d;
}

static void pool(net_t *n, int dst, int src, int nd, const int64_t *dst_dims, int alg, const int64_t *kernel,
                 const int64_t *strides, const int64_t *pad_l, const int64_t *pad_r) {
    static const int64_t no_dilation[3] = {0, 0, 0};
    dnnl_primitive_desc_t pd;
    CK(dnnl_pooling_forward_primitive_desc_create(&pd, n->eng, dnnl_forward_inference, (dnnl_alg_kind_t)alg,
                                                  md_of(n, n->vals[src]), ANY(nd, dst_dims), strides, kernel,
                                                  no_dilation, pad_l, pad_r, NULL));
    dnnl_memory_t d = new_mem(n, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), DNNL_MEMORY_ALLOCATE);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_SRC, n->vals[src]}, {DNNL_ARG_DST, d}};
    add_step(n, pd, 2, args);
    n->vals[dst] = d;
}

static void eltwise(net_t *n, int dst, int src, int alg, float alpha, float beta) {
    const_dnnl_memory_desc_t md = md_of(n, n->vals[src]);
    dnnl_primitive_desc_t pd;
    CK(dnnl_eltwise_forward_primitive_desc_create(&pd, n->eng, dnnl_forward_inference, (dnnl_alg_kind_t)alg, md, md,
                                                  alpha, beta, NULL));
    dnnl_memory_t d = new_mem(n, md, DNNL_MEMORY_ALLOCATE);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_SRC, n->vals[src]}, {DNNL_ARG_DST, d}};
    add_step(n, pd, 2, args);
    n->vals[dst] = d;
}

static void lrn(net_t *n, int dst, int src, long size, float alpha, float beta, float k) {
    const_dnnl_memory_desc_t md = md_of(n, n->vals[src]);
    dnnl_primitive_desc_t pd;
    CK(dnnl_lrn_forward_primitive_desc_create(&pd, n->eng, dnnl_forward_inference, dnnl_lrn_across_channels, md, md,
                                              size, alpha, beta, k, NULL));
    dnnl_memory_t d = new_mem(n, md, DNNL_MEMORY_ALLOCATE);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_SRC, n->vals[src]}, {DNNL_ARG_DST, d}};
    add_step(n, pd, 2, args);
    n->vals[dst] = d;
}

static void softmax(net_t *n, int dst, int src, int nd, const int64_t *dims, int axis) {
    dnnl_memory_t s = as(n, src, PLAIN(nd, dims));
    dnnl_primitive_desc_t pd;
    CK(dnnl_softmax_forward_primitive_desc_create(&pd, n->eng, dnnl_forward_inference, dnnl_softmax_accurate,
                                                  md_of(n, s), md_of(n, s), axis, NULL));
    dnnl_memory_t d = new_mem(n, md_of(n, s), DNNL_MEMORY_ALLOCATE);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_SRC, s}, {DNNL_ARG_DST, d}};
    add_step(n, pd, 2, args);
    n->vals[dst] = d;
}

static int is_reference(net_t *n, dnnl_primitive_desc_t pd) {
    const char *impl = "";
    CK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    return strncmp(impl, "ref", 3) == 0;
}

/* src1 is a value (v1 >= 0, broadcast dims b_dims) or a constant (c_off); dst has src0's format.
   oneDNN has no fast kernel for a broadcast src1 against some blocked src0 formats (aBcd8b:
   densenet's per-channel Mul/Add took 815 ms a call on the reference kernel): then src0 is
   taken channels-last, which has one. */
static void binary(net_t *n, int dst, int alg, int src0, int v1, long c_off, int nd, const int64_t *dst_dims,
                   const int64_t *b_dims, int same_shape) {
    static const dnnl_format_tag_t channels_last[] = {0, 0, 0, dnnl_acb, dnnl_acdb, dnnl_acdeb};
    dnnl_memory_t s0 = n->vals[src0];
    const_dnnl_memory_desc_t md0 = md_of(n, s0);
    dnnl_memory_t s1 = v1 >= 0 ? as(n, v1, same_shape ? md0 : PLAIN(nd, b_dims)) : weight(n, c_off, nd, b_dims, NULL);
    dnnl_primitive_desc_t pd;
    CK(dnnl_binary_primitive_desc_create(&pd, n->eng, (dnnl_alg_kind_t)alg, md0, md_of(n, s1), md0, NULL));
    if (!same_shape && nd >= 3 && nd <= 5 && is_reference(n, pd)) {
        CK(dnnl_primitive_desc_destroy(pd));
        s0 = as(n, src0, tagged(n, nd, dst_dims, channels_last[nd]));
        md0 = md_of(n, s0);
        CK(dnnl_binary_primitive_desc_create(&pd, n->eng, (dnnl_alg_kind_t)alg, md0, md_of(n, s1), md0, NULL));
    }
    dnnl_memory_t d = new_mem(n, md0, DNNL_MEMORY_ALLOCATE);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC_0, s0}, {DNNL_ARG_SRC_1, s1}, {DNNL_ARG_DST, d}};
    add_step(n, pd, 3, args);
    n->vals[dst] = d;
}

static void concat(net_t *n, int dst, int count, const int *srcs, int axis) {
    const_dnnl_memory_desc_t mds[64];
    dnnl_exec_arg_t args[65];
    if (count > 64) { snprintf(n->err, sizeof n->err, "Concat of %d inputs (at most 64)", count); longjmp(n->fail, 1); }
    for (int i = 0; i < count; i++) {
        mds[i] = md_of(n, n->vals[srcs[i]]);
        args[i] = (dnnl_exec_arg_t){DNNL_ARG_MULTIPLE_SRC + i, n->vals[srcs[i]]};
    }
    dnnl_primitive_desc_t pd;
    CK(dnnl_concat_primitive_desc_create(&pd, n->eng, NULL, count, axis, mds, NULL));
    dnnl_memory_t d = new_mem(n, dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), DNNL_MEMORY_ALLOCATE);
    args[count] = (dnnl_exec_arg_t){DNNL_ARG_DST, d};
    add_step(n, pd, count + 1, args);
    n->vals[dst] = d;
}

/* inference batch normalisation; scale, shift, mean, var are constants of `channels` */
static void batchnorm(net_t *n, int dst, int src, long channels, long scale, long shift, long mean, long var,
                      float epsilon) {
    const_dnnl_memory_desc_t md = md_of(n, n->vals[src]);
    dnnl_primitive_desc_t pd;
    unsigned flags = dnnl_use_global_stats | dnnl_use_scale | dnnl_use_shift;
    CK(dnnl_batch_normalization_forward_primitive_desc_create(&pd, n->eng, dnnl_forward_inference, md, md, epsilon,
                                                              flags, NULL));
    dnnl_memory_t d = new_mem(n, md, DNNL_MEMORY_ALLOCATE);
    int64_t c = channels;
    dnnl_exec_arg_t args[6] = {{DNNL_ARG_SRC, n->vals[src]},          {DNNL_ARG_DST, d},
                               {DNNL_ARG_SCALE, weight(n, scale, 1, &c, NULL)},
                               {DNNL_ARG_SHIFT, weight(n, shift, 1, &c, NULL)},
                               {DNNL_ARG_MEAN, weight(n, mean, 1, &c, NULL)},
                               {DNNL_ARG_VARIANCE, weight(n, var, 1, &c, NULL)}};
    add_step(n, pd, 6, args);
    n->vals[dst] = d;
}

/* layer normalisation over the last axis of a row-major [rows, cols] value (shift < 0: none) */
static void layernorm(net_t *n, int dst, int src, int nd, const int64_t *in_dims, int64_t rows, int64_t cols,
                      long scale, long shift, float epsilon) {
    int64_t dims[2] = {rows, cols};
    dnnl_memory_t s = view(n, as(n, src, PLAIN(nd, in_dims)), PLAIN(2, dims));
    const_dnnl_memory_desc_t md = md_of(n, s);
    unsigned flags = dnnl_use_scale | (shift >= 0 ? dnnl_use_shift : 0);
    dnnl_primitive_desc_t pd;
    CK(dnnl_layer_normalization_forward_primitive_desc_create(&pd, n->eng, dnnl_forward_inference, md, md, NULL,
                                                              epsilon, flags, NULL));
    dnnl_memory_t d = new_mem(n, md, DNNL_MEMORY_ALLOCATE);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, s}, {DNNL_ARG_DST, d}, {DNNL_ARG_SCALE, weight(n, scale, 1, &cols, NULL)},
                               {DNNL_ARG_SHIFT, NULL}};
    if (shift >= 0) args[3].memory = weight(n, shift, 1, &cols, NULL);
    add_step(n, pd, shift >= 0 ? 4 : 3, args);
    n->vals[dst] = d;
}

/* Reshape, Flatten, Squeeze, Unsqueeze: the row-major data under new dims, no copy */
static void reshape(net_t *n, int dst, int src, int in_nd, const int64_t *in_dims, int nd, const int64_t *dims) {
    n->vals[dst] = view(n, as(n, src, PLAIN(in_nd, in_dims)), PLAIN(nd, dims));
}

/* Transpose: a strided view of the row-major source, reordered into a row-major result */
static void transpose(net_t *n, int dst, int src, int nd, const int64_t *in_dims, const int64_t *perm) {
    int64_t in_strides[12], dims[12], strides[12];
    in_strides[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) in_strides[i] = in_strides[i + 1] * in_dims[i + 1];
    for (int i = 0; i < nd; i++) { dims[i] = in_dims[perm[i]]; strides[i] = in_strides[perm[i]]; }
    dnnl_memory_desc_t md;
    CK(dnnl_memory_desc_create_with_strides(&md, nd, dims, dnnl_f32, strides));
    dnnl_memory_t strided = view(n, as(n, src, PLAIN(nd, in_dims)), keep_md(n, md));
    n->vals[dst] = reorder(n, strided, PLAIN(nd, dims), 0);
}

static void input(net_t *n, int index, int v, int nd, const int64_t *dims) {
    n->ins[index] = n->vals[v] = new_mem(n, PLAIN(nd, dims), DNNL_MEMORY_NONE);
}

static void output(net_t *n, int index, int v, int nd, const int64_t *dims) {
    n->outs[index] = new_mem(n, PLAIN(nd, dims), DNNL_MEMORY_NONE);
    dnnl_primitive_desc_t pd;
    CK(dnnl_reorder_primitive_desc_create(&pd, md_of(n, n->vals[v]), n->eng, md_of(n, n->outs[index]), n->eng, NULL));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, n->vals[v]}, {DNNL_ARG_TO, n->outs[index]}};
    add_step(n, pd, 2, args);
}

static void cg_build(net_t *n); /* generated */

void cg_free(void *handle) {
    net_t *n = handle;
    if (n == NULL) return;
    for (int i = 0; i < n->nsteps; i++) { dnnl_primitive_destroy(n->steps[i].prim); free(n->steps[i].args); }
    for (int i = 0; i < n->nowned; i++) dnnl_memory_destroy(n->owned[i]);
    for (int i = 0; i < n->nmds; i++) dnnl_memory_desc_destroy(n->mds[i]);
    if (n->stream) dnnl_stream_destroy(n->stream);
    if (n->eng) dnnl_engine_destroy(n->eng);
    free(n->steps); free(n->cache); free(n->views); free(n->owned); free(n->mds);
    free(n->vals); free(n->ins); free(n->outs);
    free(n);
}

/* Create every primitive; NULL with the reason in err on failure. */
void *cg_init(const float *weights, int nthreads, char *err, int err_len) {
    net_t *n = calloc(1, sizeof *n);
    n->weights = weights;
    n->vals = calloc(CG_VALUES, sizeof *n->vals);
    n->ins = calloc(CG_INPUTS + 1, sizeof *n->ins);
    n->outs = calloc(CG_OUTPUTS + 1, sizeof *n->outs);
    n->nins = CG_INPUTS;
    n->nouts = CG_OUTPUTS;
    if (setjmp(n->fail)) {
        snprintf(err, err_len, "%s", n->err);
        cg_free(n);
        return NULL;
    }
    if (nthreads > 0) omp_set_num_threads(nthreads);
    CK(dnnl_engine_create(&n->eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&n->stream, n->eng, dnnl_stream_default_flags));
    cg_build(n);
    return n;
}

/* One call: point the edge memories at the caller's arrays, run every step. */
int cg_run(void *handle, void *const *inputs, void *const *outputs, int nthreads, char *err, int err_len) {
    net_t *n = handle;
    if (nthreads > 0) omp_set_num_threads(nthreads);
    for (int i = 0; i < n->nins; i++) dnnl_memory_set_data_handle(n->ins[i], inputs[i]);
    for (int i = 0; i < n->nouts; i++) dnnl_memory_set_data_handle(n->outs[i], outputs[i]);
    for (int i = 0; i < n->nviews; i++) {
        void *base;
        dnnl_memory_get_data_handle(n->views[i].base, &base);
        dnnl_memory_set_data_handle(n->views[i].view, base);
    }
    for (int i = 0; i < n->nsteps; i++) {
        dnnl_status_t s = dnnl_primitive_execute(n->steps[i].prim, n->stream, n->steps[i].nargs, n->steps[i].args);
        if (s != dnnl_success) {
            snprintf(err, err_len, "step %d: oneDNN status %d", i, (int)s);
            return 1;
        }
    }
    return dnnl_stream_wait(n->stream) == dnnl_success ? 0 : 1;
}
