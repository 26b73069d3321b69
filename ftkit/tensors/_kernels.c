/* Compare kernels of ftkit: one pass over two element buffers, every pair metric at once.
 *
 * diff(a, b, fmt_a, fmt_b, table_a, table_b, rtol, atol) -> 16-tuple (see PART_FIELDS below)
 *   a, b: C-contiguous buffers of the same element count (their raw bytes: the caller passes
 *   unsigned-integer views, so any element format travels); fmt_*: an element format code
 *   (enum Fmt); table_*: for FMT_TABLE8, 256 float64 values indexed by the byte (float8
 *   variants, int8, uint8, bool), else None. rtol = atol = 0 counts every numeric difference.
 * nonfinite(a, fmt, table) -> (nan, inf)
 *
 * Semantics are those of ftkit/dumps/metrics.py's docstring. Values are widened to float64
 * (exactly, for every format here but (u)int64 beyond 2^53, which round as numpy's astype
 * does); sums are float64, accumulated in LANES fixed lanes per block of BLOCK elements and
 * folded in a fixed order, so a result depends only on the data and on where the caller cuts
 * its stripes, never on timing. Blocks whose values are all finite take a branch-free loop
 * that gcc vectorises; a block holding NaN/Inf is redone by a scalar loop with the masks.
 * The GIL is released around the work, so the caller's thread pool runs stripes in parallel.
 * Built with -ffp-contract=off: no fused multiply-add, so the tolerance test rounds exactly
 * as numpy's float64 `d > atol + rtol*|b|`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum Fmt { FMT_F64, FMT_F32, FMT_F16, FMT_BF16, FMT_I16, FMT_U16, FMT_I32, FMT_U32, FMT_I64, FMT_U64, FMT_TABLE8, NFMT };
static const int ITEMSIZE[NFMT] = {8, 4, 2, 2, 2, 2, 4, 4, 8, 8, 1};

#define BLOCK 1024
#define LANES 8

/* Unaligned loads: safetensors data need not be aligned to its element size. */
typedef uint16_t u16u __attribute__((aligned(1), may_alias));
typedef uint32_t u32u __attribute__((aligned(1), may_alias));
typedef uint64_t u64u __attribute__((aligned(1), may_alias));
typedef int16_t i16u __attribute__((aligned(1), may_alias));
typedef int32_t i32u __attribute__((aligned(1), may_alias));
typedef int64_t i64u __attribute__((aligned(1), may_alias));
typedef float f32u __attribute__((aligned(1), may_alias));
typedef double f64u __attribute__((aligned(1), may_alias));

static inline float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* IEEE half to float, exact for every bit pattern (subnormals by a power-of-two scale; Inf/NaN
 * by setting the exponent), branch-free so the loop vectorises. */
static inline float half_to_float(uint16_t h) {
    float f = f32_of((uint32_t)(h & 0x7fffu) << 13) * 0x1p112f;
    uint32_t u = bits_of(f);
    u |= (f >= 65536.0f) ? 0x7f800000u : 0u;
    return f32_of(u | ((uint32_t)(h & 0x8000u) << 16));
}

/* Elements [0, n) of src (format fmt) as float64 values in dst. */
static void widen(int fmt, const double *table, const char *src, double *dst, Py_ssize_t n) {
    Py_ssize_t i;
    switch (fmt) {
    case FMT_F64:
        for (i = 0; i < n; i++) dst[i] = ((const f64u *)src)[i];
        break;
    case FMT_F32:
        for (i = 0; i < n; i++) dst[i] = ((const f32u *)src)[i];
        break;
    case FMT_F16:
        for (i = 0; i < n; i++) dst[i] = half_to_float(((const u16u *)src)[i]);
        break;
    case FMT_BF16:
        for (i = 0; i < n; i++) dst[i] = f32_of((uint32_t)((const u16u *)src)[i] << 16);
        break;
    case FMT_I16:
        for (i = 0; i < n; i++) dst[i] = ((const i16u *)src)[i];
        break;
    case FMT_U16:
        for (i = 0; i < n; i++) dst[i] = ((const u16u *)src)[i];
        break;
    case FMT_I32:
        for (i = 0; i < n; i++) dst[i] = ((const i32u *)src)[i];
        break;
    case FMT_U32:
        for (i = 0; i < n; i++) dst[i] = ((const u32u *)src)[i];
        break;
    case FMT_I64:
        for (i = 0; i < n; i++) dst[i] = (double)((const i64u *)src)[i];
        break;
    case FMT_U64:
        for (i = 0; i < n; i++) dst[i] = (double)((const u64u *)src)[i];
        break;
    default: /* FMT_TABLE8 */
        for (i = 0; i < n; i++) dst[i] = table[(unsigned char)src[i]];
        break;
    }
}

/* Number of elements whose bytes differ among n elements of `size` bytes; *first: the first. */
static Py_ssize_t count_bits_differ(const char *a, const char *b, int size, Py_ssize_t n, Py_ssize_t *first) {
    Py_ssize_t i, c = 0;
    switch (size) {
    case 8:
        for (i = 0; i < n; i++) c += ((const u64u *)a)[i] != ((const u64u *)b)[i];
        break;
    case 4:
        for (i = 0; i < n; i++) c += ((const u32u *)a)[i] != ((const u32u *)b)[i];
        break;
    case 2:
        for (i = 0; i < n; i++) c += ((const u16u *)a)[i] != ((const u16u *)b)[i];
        break;
    default:
        for (i = 0; i < n; i++) c += a[i] != b[i];
        break;
    }
    if (c && first) {
        for (i = 0; memcmp(a + i * size, b + i * size, (size_t)size) == 0; i++) {
        }
        *first = i;
    }
    return c;
}

/* Partial results of a stripe, in the order diff() returns them. Indexes are -1 when unset. */
typedef struct {
    int64_t bits_differ, first_bits, first_bad, nonfinite_mismatch, nan_a, nan_b, inf_a, inf_b, finite_n;
    double sum_abs, best;
    int64_t best_at;
    double max_rel;
    int64_t tol_fail;
    double sdd, sxx;
} Part;

/* Lane accumulators of one block. */
typedef struct {
    double sa[LANES], sd[LANES], sx[LANES], mx[LANES], mr[LANES], tf[LANES], bad[LANES];
} Lanes;

static void lanes_zero(Lanes *l) { memset(l, 0, sizeof *l); }

/* One finite pair (x, y) into lane j; d[i] = |x - y| for the argmax scan. */
#define ACC(l, j, x, y, di)                                              \
    do {                                                                 \
        double ax_ = fabs(x), ay_ = fabs(y);                             \
        double den_ = ax_ > ay_ ? ax_ : ay_;                             \
        double r_ = (di) / (den_ > 0 ? den_ : 1.0);                      \
        (l)->sa[j] += (di);                                              \
        (l)->sd[j] += (di) * (di);                                       \
        (l)->sx[j] += (x) * (x) + (y) * (y);                             \
        (l)->mx[j] = (di) > (l)->mx[j] ? (di) : (l)->mx[j];              \
        (l)->mr[j] = r_ > (l)->mr[j] ? r_ : (l)->mr[j];                  \
        (l)->tf[j] += (di) > atol + rtol * ay_ ? 1.0 : 0.0;              \
    } while (0)

/* Branch-free pass over a block assumed finite; returns 0 if a NaN/Inf was met (redo masked). */
static int dense_block(const double *x, const double *y, double *d, Py_ssize_t m, double rtol, double atol,
                       Lanes *l) {
    Py_ssize_t i = 0;
    int j;
    for (; i + LANES <= m; i += LANES) {
        for (j = 0; j < LANES; j++) {
            double a = x[i + j], b = y[i + j];
            double di = fabs(a - b);
            d[i + j] = di;
            ACC(l, j, a, b, di);
            l->bad[j] += a * 0.0 + b * 0.0; /* NaN iff a or b is NaN or Inf */
        }
    }
    for (j = 0; i < m; i++, j++) {
        double a = x[i], b = y[i];
        double di = fabs(a - b);
        d[i] = di;
        ACC(l, j, a, b, di);
        l->bad[j] += a * 0.0 + b * 0.0;
    }
    for (j = 0; j < LANES; j++)
        if (l->bad[j] != 0.0) return 0; /* NaN compares unequal to 0 too: != 0.0 catches it */
    return 1;
}

/* The masked pass over a block holding NaN/Inf; d[i] = -1 at non-finite positions. */
static void masked_block(const double *x, const double *y, double *d, Py_ssize_t m, Py_ssize_t base, double rtol,
                         double atol, Lanes *l, Part *p) {
    Py_ssize_t i;
    for (i = 0; i < m; i++) {
        double a = x[i], b = y[i];
        int na = a != a, nb = b != b, ia = isinf(a) != 0, ib = isinf(b) != 0;
        p->nan_a += na;
        p->nan_b += nb;
        p->inf_a += ia;
        p->inf_b += ib;
        if (!(na | nb | ia | ib)) {
            double di = fabs(a - b);
            d[i] = di;
            ACC(l, (int)(i % LANES), a, b, di);
            p->finite_n++;
        } else {
            d[i] = -1.0;
            if (!((na && nb) || a == b)) {
                p->nonfinite_mismatch++;
                if (p->first_bad < 0) p->first_bad = base + i;
            }
        }
    }
}

/* Fold a block's lanes into p in lane order; the argmax scan finds the block's first maximum. */
static void fold(const Lanes *l, const double *d, Py_ssize_t m, Py_ssize_t base, Part *p) {
    double sa = 0, sd = 0, sx = 0, mx = -1.0, mr = p->max_rel, tf = 0;
    Py_ssize_t i;
    int j;
    for (j = 0; j < LANES; j++) {
        sa += l->sa[j];
        sd += l->sd[j];
        sx += l->sx[j];
        tf += l->tf[j];
        if (l->mx[j] > mx) mx = l->mx[j];
        if (l->mr[j] > mr) mr = l->mr[j];
    }
    p->sum_abs += sa;
    p->sdd += sd;
    p->sxx += sx;
    p->tol_fail += (int64_t)tf;
    p->max_rel = mr;
    if (mx > p->best) {
        for (i = 0; i < m && d[i] != mx; i++) {
        }
        if (i < m) {
            p->best = mx;
            p->best_at = base + i;
        }
    }
}

/* A block whose bits equal its counterpart's: Σ(a² + b²) = 2Σa², counts of a on both sides. */
static void equal_block(const double *x, Py_ssize_t m, Part *p) {
    double sx[LANES] = {0}, bad[LANES] = {0}, s = 0;
    Py_ssize_t i = 0, k;
    int j, finite = 1;
    for (; i + LANES <= m; i += LANES)
        for (j = 0; j < LANES; j++) {
            sx[j] += x[i + j] * x[i + j];
            bad[j] += x[i + j] * 0.0;
        }
    for (j = 0; i < m; i++, j++) {
        sx[j] += x[i] * x[i];
        bad[j] += x[i] * 0.0;
    }
    for (j = 0; j < LANES; j++) finite &= bad[j] == 0.0;
    if (!finite) {
        memset(sx, 0, sizeof sx);
        for (k = 0; k < m; k++) {
            double a = x[k];
            if (a != a) {
                p->nan_a++;
                p->nan_b++;
            } else if (isinf(a)) {
                p->inf_a++;
                p->inf_b++;
            } else {
                sx[k % LANES] += a * a;
                p->finite_n++;
            }
        }
    } else {
        p->finite_n += m;
    }
    for (j = 0; j < LANES; j++) s += sx[j];
    p->sxx += 2 * s;
}

typedef struct {
    const char *a, *b;
    int fa, fb;
    const double *ta, *tb;
    Py_ssize_t n;
    double rtol, atol;
} DiffArgs;

static void diff_run(const DiffArgs *g, Part *p) {
    double x[BLOCK], y[BLOCK], d[BLOCK];
    Lanes l;
    int same = g->fa == g->fb && g->ta == g->tb;
    int sa = ITEMSIZE[g->fa], sb = ITEMSIZE[g->fb];
    Py_ssize_t base;
    memset(p, 0, sizeof *p);
    p->first_bits = p->first_bad = p->best_at = -1;
    p->best = -1.0;
    for (base = 0; base < g->n; base += BLOCK) {
        Py_ssize_t m = g->n - base < BLOCK ? g->n - base : BLOCK;
        const char *ca = g->a + base * sa, *cb = g->b + base * sb;
        Py_ssize_t first = 0, nb;
        if (same) {
            nb = count_bits_differ(ca, cb, sa, m, p->first_bits < 0 ? &first : NULL);
        } else {
            nb = m;
        }
        if (nb && p->first_bits < 0) p->first_bits = base + first;
        p->bits_differ += nb;
        widen(g->fa, g->ta, ca, x, m);
        if (nb == 0) {
            equal_block(x, m, p);
            continue;
        }
        widen(g->fb, g->tb, cb, y, m);
        lanes_zero(&l);
        if (dense_block(x, y, d, m, g->rtol, g->atol, &l)) {
            p->finite_n += m;
        } else {
            lanes_zero(&l);
            masked_block(x, y, d, m, base, g->rtol, g->atol, &l, p);
        }
        fold(&l, d, m, base, p);
    }
}

static int get_format(int fmt, PyObject *table, Py_buffer *tv, const double **out) {
    *out = NULL;
    if (fmt < 0 || fmt >= NFMT) {
        PyErr_Format(PyExc_ValueError, "unknown element format %d", fmt);
        return -1;
    }
    if (fmt != FMT_TABLE8) return 0;
    if (table == Py_None) {
        PyErr_SetString(PyExc_ValueError, "a one-byte format needs its table of 256 float64 values");
        return -1;
    }
    if (PyObject_GetBuffer(table, tv, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (tv->len != 256 * (Py_ssize_t)sizeof(double)) {
        PyBuffer_Release(tv);
        PyErr_SetString(PyExc_ValueError, "a format table holds 256 float64 values");
        return -1;
    }
    *out = (const double *)tv->buf;
    return 1;
}

static PyObject *py_diff(PyObject *self, PyObject *args) {
    PyObject *oa, *ob, *ta, *tb;
    DiffArgs g;
    Py_buffer va, vb, tva, tvb;
    int ha = 0, hb = 0;
    Part p;
    PyObject *res = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOiiOOdd", &oa, &ob, &g.fa, &g.fb, &ta, &tb, &g.rtol, &g.atol)) return NULL;
    if ((ha = get_format(g.fa, ta, &tva, &g.ta)) < 0) return NULL;
    if ((hb = get_format(g.fb, tb, &tvb, &g.tb)) < 0) goto out_tables;
    if (PyObject_GetBuffer(oa, &va, PyBUF_C_CONTIGUOUS) < 0) goto out_tables;
    if (PyObject_GetBuffer(ob, &vb, PyBUF_C_CONTIGUOUS) < 0) goto out_a;
    g.n = va.len / ITEMSIZE[g.fa];
    if (va.len % ITEMSIZE[g.fa] || vb.len != g.n * ITEMSIZE[g.fb]) {
        PyErr_SetString(PyExc_ValueError, "buffers of different element counts");
        goto out_b;
    }
    g.a = (const char *)va.buf;
    g.b = (const char *)vb.buf;
    Py_BEGIN_ALLOW_THREADS diff_run(&g, &p);
    Py_END_ALLOW_THREADS res = Py_BuildValue("(LLLLLLLLLddLdLdd)", (long long)p.bits_differ, (long long)p.first_bits,
                                             (long long)p.first_bad, (long long)p.nonfinite_mismatch,
                                             (long long)p.nan_a, (long long)p.nan_b, (long long)p.inf_a,
                                             (long long)p.inf_b, (long long)p.finite_n, p.sum_abs, p.best,
                                             (long long)p.best_at, p.max_rel, (long long)p.tol_fail, p.sdd, p.sxx);
out_b:
    PyBuffer_Release(&vb);
out_a:
    PyBuffer_Release(&va);
out_tables:
    if (hb > 0) PyBuffer_Release(&tvb);
    if (ha > 0) PyBuffer_Release(&tva);
    return res;
}

static void nonfinite_run(const char *a, int fmt, const double *table, Py_ssize_t n, int64_t *nan, int64_t *inf) {
    double x[BLOCK];
    Py_ssize_t base, i;
    int size = ITEMSIZE[fmt];
    for (base = 0; base < n; base += BLOCK) {
        Py_ssize_t m = n - base < BLOCK ? n - base : BLOCK;
        double bad[LANES] = {0};
        int j, finite = 1;
        widen(fmt, table, a + base * size, x, m);
        for (i = 0; i + LANES <= m; i += LANES)
            for (j = 0; j < LANES; j++) bad[j] += x[i + j] * 0.0;
        for (j = 0; i < m; i++, j++) bad[j] += x[i] * 0.0;
        for (j = 0; j < LANES; j++) finite &= bad[j] == 0.0;
        if (finite) continue;
        for (i = 0; i < m; i++) {
            *nan += x[i] != x[i];
            *inf += isinf(x[i]) != 0;
        }
    }
}

static PyObject *py_nonfinite(PyObject *self, PyObject *args) {
    PyObject *oa, *ot;
    int fmt, ht;
    Py_buffer va, tv;
    const double *table;
    int64_t nan = 0, inf = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OiO", &oa, &fmt, &ot)) return NULL;
    if ((ht = get_format(fmt, ot, &tv, &table)) < 0) return NULL;
    if (PyObject_GetBuffer(oa, &va, PyBUF_C_CONTIGUOUS) < 0) {
        if (ht > 0) PyBuffer_Release(&tv);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS nonfinite_run((const char *)va.buf, fmt, table, va.len / ITEMSIZE[fmt], &nan, &inf);
    Py_END_ALLOW_THREADS PyBuffer_Release(&va);
    if (ht > 0) PyBuffer_Release(&tv);
    return Py_BuildValue("(LL)", (long long)nan, (long long)inf);
}

static PyMethodDef methods[] = {
    {"diff", py_diff, METH_VARARGS, "diff(a, b, fmt_a, fmt_b, table_a, table_b, rtol, atol) -> stripe partials"},
    {"nonfinite", py_nonfinite, METH_VARARGS, "nonfinite(a, fmt, table) -> (nan, inf)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", "ftkit's compiled compare kernels", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kernels(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
