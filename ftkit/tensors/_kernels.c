/* Compare kernels of ftkit: one pass over two element buffers, every pair metric at once.
 *
 * diff(a, b, fmt_a, fmt_b, table_a, table_b, rtol, atol) -> 16-tuple (the fields of Part)
 *   a, b: C-contiguous buffers of the same element count (their raw bytes: the caller passes
 *   unsigned-integer views, so any element format travels); fmt_*: an element format code
 *   (enum Fmt); table_*: for FMT_TABLE8, 256 float64 values indexed by the byte (float8
 *   variants, int8, uint8, bool), else None. rtol = atol = 0 counts every numeric difference.
 * nonfinite(a, fmt, table) -> (nan, inf)
 * chunk_hashes(fn, data, chunk, out): a 64-bit hash function of each chunk of data (see below)
 *
 * Semantics are those of ftkit/dumps/metrics.py's docstring (tests/dumps/metrics_oracle.py is
 * the numpy reference). Work goes in blocks of BLOCK elements: the bits are compared, both sides
 * widened to float64 into L1-resident buffers (exact for every format here; (u)int64 beyond 2^53
 * round as numpy's astype does), then one of
 *   equal_block   bits equal: 2Σa² and the counts;
 *   sparse_block  at most 1/SPARSE of the elements differ: only those are measured;
 *   dense_block   a branch-free vector loop over every element, assuming finite values;
 *   masked_block  a block holding NaN/Inf (or overflowing squares): the scalar masked loop.
 * Sums are float64 in LANES fixed lanes folded in a fixed order, so a result depends only on the
 * data and on where the caller cuts its stripes, never on timing or on the CPU's instance of a
 * loop. The GIL is released around the work, so the caller's thread pool runs stripes in
 * parallel. Built with -ffp-contract=off: no fused multiply-add, so the tolerance test rounds
 * exactly as numpy's float64 `d > atol + rtol*|b|`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum Fmt { FMT_F64, FMT_F32, FMT_F16, FMT_BF16, FMT_I16, FMT_U16, FMT_I32, FMT_U32, FMT_I64, FMT_U64, FMT_TABLE8, NFMT };
static const int ITEMSIZE[NFMT] = {8, 4, 2, 2, 2, 2, 4, 4, 8, 8, 1};

#define BLOCK 1024
#define SPARSE 16 /* a block with at most 1/SPARSE of its elements differing takes sparse_block */
#define LANES 4 /* accumulator lanes: element i goes to lane i % LANES */

/* The hot loops are compiled twice on x86-64 with glibc, for the baseline and for AVX2, and the
 * CPU picks its instance at load time (ifuncs) or import (dense_block): no -march, one build
 * serves every machine. Lanes and the order of every operation are the same in both, so are
 * the results. FTKIT_NO_CLONES builds the baseline only (to test it on an AVX2 machine). */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute) && !defined(FTKIT_NO_CLONES)
#if __has_attribute(target_clones)
#define HOT __attribute__((target_clones("avx2", "default")))
#define HOT_CLONES 1
#endif
#endif
#ifndef HOT
#define HOT
#endif

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
HOT static void widen(int fmt, const double *table, const char *src, double *dst, Py_ssize_t n) {
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
HOT static Py_ssize_t count_bits_differ(const char *a, const char *b, int size, Py_ssize_t n, Py_ssize_t *first) {
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
    double sa[LANES], sd[LANES], sx[LANES], mx[LANES], mr[LANES], tf[LANES];
} Lanes;

static void lanes_zero(Lanes *l) { memset(l, 0, sizeof *l); }

/* One finite pair (x, y) into lane j (the relative difference is rel_block's). */
#define ACC(l, j, x, y, di)                                              \
    do {                                                                 \
        (l)->sa[j] += (di);                                              \
        (l)->sd[j] += (di) * (di);                                       \
        (l)->sx[j] += (x) * (x) + (y) * (y);                             \
        (l)->mx[j] = (di) > (l)->mx[j] ? (di) : (l)->mx[j];              \
        (l)->tf[j] += (di) > atol + rtol * fabs(y) ? 1.0 : 0.0;          \
    } while (0)

/* The relative difference d / max(|x|, |y|) costs a division, several times the rest of an
 * element's work, so the blocks screen first whether any element can exceed `known`, the largest
 * already seen: d / den rounds above `known` only if d > known·den·(1 - 2^-53), and the screen's
 * factor (1 - 1e-14) covers the rounding of its own product with room to spare. */
#define REL_SCREEN(known) ((known) * (1 - 1e-14))

/* The largest d[i] / max(|x[i]|, |y[i]|) of a block (0 where both are 0) into l->mr; positions
 * with d[i] < 0 (non-finite) never count. */
static void rel_block(const double *x, const double *y, const double *d, Py_ssize_t m, Lanes *l) {
    Py_ssize_t i;
    for (i = 0; i < m; i++) {
        double ax = fabs(x[i]), ay = fabs(y[i]);
        double den = ax > ay ? ax : ay;
        double r = d[i] / (den > 0 ? den : 1.0);
        int j = (int)(i % LANES);
        l->mr[j] = r > l->mr[j] ? r : l->mr[j];
    }
}

/* Float64 vectors (GCC/Clang vector extensions, no intrinsics): two lanes are an SSE2/NEON
 * register, four an AVX one. Comparisons give all-ones/all-zero int64 lanes. */
typedef double v2d __attribute__((vector_size(16)));
typedef int64_t v2i __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));
typedef int64_t v4i __attribute__((vector_size(32)));

/* Branch-free pass over a block assumed finite; d[i] = |x - y| for the argmax scan. Returns 0
 * if Σ(a² + b²) is not finite: a NaN or Inf was met (or float64 squares overflowed), and the
 * block is redone by masked_block; else 2 if an element may hold a relative difference above
 * `known` (then rel_block runs), else 1. x, y, d: aligned to 32 bytes. Written once for vectors
 * VD of W lanes (LANES / W of them per step), so each instance keeps lane i % LANES. */
#define DENSE_BLOCK(NAME, VD, VI, W, EXACT, ATTR)                                                            \
    ATTR static int NAME(const double *x, const double *y, double *d, Py_ssize_t m, double rtol,       \
                         double atol, double known, Lanes *l) {                                         \
        const double thr = REL_SCREEN(known);                                                           \
        const VD zero = {0}, one = zero + 1.0, vr = zero + rtol, va = zero + atol, vt = zero + thr;     \
        const VI absmask = (VI){0} + INT64_MAX;                                                         \
        VD sa[LANES / W], sd[LANES / W], sx[LANES / W], mx[LANES / W], tf[LANES / W];                   \
        VI hit = {0}, mk;                                                                               \
        Py_ssize_t i = 0;                                                                               \
        int j, k;                                                                                       \
        for (k = 0; k < LANES / W; k++) sa[k] = sd[k] = sx[k] = mx[k] = tf[k] = zero;                   \
        for (; i + LANES <= m; i += LANES) {                                                            \
            for (k = 0; k < LANES / W; k++) {                                                           \
                VD a = *(const VD *)(x + i + W * k), b = *(const VD *)(y + i + W * k);                  \
                VD di = (VD)((VI)(a - b) & absmask), aa = (VD)((VI)a & absmask);                        \
                VD ab = (VD)((VI)b & absmask);                                                          \
                *(VD *)(d + i + W * k) = di;                                                            \
                sa[k] += di;                                                                            \
                sd[k] += di * di;                                                                       \
                sx[k] += a * a + b * b;                                                                 \
                mk = di > mx[k];                                                                        \
                mx[k] = (VD)(((VI)di & mk) | ((VI)mx[k] & ~mk));                                        \
                tf[k] += (VD)((VI)one & (EXACT ? di > zero : di > va + vr * ab));                       \
                mk = aa > ab;                                                                           \
                hit |= di > vt * (VD)(((VI)aa & mk) | ((VI)ab & ~mk));                                  \
            }                                                                                           \
        }                                                                                               \
        for (k = 0; k < LANES / W; k++)                                                                 \
            for (j = 0; j < W; j++) {                                                                   \
                l->sa[W * k + j] = sa[k][j];                                                            \
                l->sd[W * k + j] = sd[k][j];                                                            \
                l->sx[W * k + j] = sx[k][j];                                                            \
                l->mx[W * k + j] = mx[k][j];                                                            \
                l->tf[W * k + j] = tf[k][j];                                                            \
            }                                                                                           \
        for (j = 0; i < m; i++, j++) {                                                                  \
            double a = x[i], b = y[i], ax = fabs(a), ay = fabs(b);                                      \
            double di = fabs(a - b);                                                                    \
            d[i] = di;                                                                                  \
            ACC(l, j, a, b, di);                                                                        \
            hit[0] |= -(int64_t)(di > thr * (ax > ay ? ax : ay));                                       \
        }                                                                                               \
        for (j = 0; j < LANES; j++)                                                                     \
            if (!isfinite(l->sx[j])) return 0;                                                          \
        for (j = 1; j < W; j++) hit[0] |= hit[j];                                                       \
        return 1 + (hit[0] != 0);                                                                       \
    }

typedef int (*DenseFn)(const double *, const double *, double *, Py_ssize_t, double, double, double, Lanes *);
DENSE_BLOCK(dense_base, v2d, v2i, 2, 0, )
DENSE_BLOCK(dense_base_exact, v2d, v2i, 2, 1, )
#if defined(HOT_CLONES)
DENSE_BLOCK(dense_avx2, v4d, v4i, 4, 0, __attribute__((target("avx2"))))
DENSE_BLOCK(dense_avx2_exact, v4d, v4i, 4, 1, __attribute__((target("avx2"))))
#endif
/* [exact]: the instances this CPU runs; rtol = atol = 0 (exact) counts d > 0 without the
 * tolerance arithmetic. Set once at import (PyInit__kernels). */
static DenseFn dense_block[2] = {dense_base, dense_base_exact};

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

/* Σx² of a block, in LANES lanes folded in order: not finite when x holds NaN/Inf (or squares
 * overflow float64). */
HOT static double sum_squares(const double *x, Py_ssize_t m) {
    double sx[LANES] = {0}, s = 0;
    Py_ssize_t i = 0;
    int j;
    for (; i + LANES <= m; i += LANES)
        for (j = 0; j < LANES; j++) sx[j] += x[i + j] * x[i + j];
    for (j = 0; i < m; i++, j++) sx[j] += x[i] * x[i];
    for (j = 0; j < LANES; j++) s += sx[j];
    return s;
}

/* A block whose bits equal its counterpart's: Σ(a² + b²) = 2Σa², counts of a on both sides. */
static void equal_block(const double *x, Py_ssize_t m, Part *p) {
    double sx[LANES] = {0}, s = sum_squares(x, m);
    Py_ssize_t i;
    int j;
    if (isfinite(s)) {
        p->finite_n += m;
        p->sxx += 2 * s;
        return;
    }
    for (i = 0; i < m; i++) { /* NaN/Inf (or overflowing squares): count and sum by element */
        double a = x[i];
        if (a != a) {
            p->nan_a++;
            p->nan_b++;
        } else if (isinf(a)) {
            p->inf_a++;
            p->inf_b++;
        } else {
            sx[i % LANES] += a * a;
            p->finite_n++;
        }
    }
    for (s = 0, j = 0; j < LANES; j++) s += sx[j];
    p->sxx += 2 * s;
}

/* Positions (block-relative) of the elements whose bytes differ, eight at a time where none
 * do; at most `cap` are stored, the count is returned (more than cap: the rest not stored). */
#define SCAN_POSITIONS(T)                                                                        \
    for (i = 0; i < m; i++) {                                                                    \
        const T *ta = (const T *)a, *tb = (const T *)b;                                          \
        if ((i & 7) == 0 && i + 8 <= m) {                                                        \
            T o = 0;                                                                             \
            int q;                                                                               \
            for (q = 0; q < 8; q++) o |= (T)(ta[i + q] ^ tb[i + q]);                             \
            if (!o) {                                                                            \
                i += 7;                                                                          \
                continue;                                                                        \
            }                                                                                    \
        }                                                                                        \
        if (ta[i] != tb[i]) {                                                                    \
            if (k < cap) pos[k] = i;                                                             \
            k++;                                                                                 \
        }                                                                                        \
    }
static Py_ssize_t differing_positions(const char *a, const char *b, int size, Py_ssize_t m, Py_ssize_t *pos,
                                      Py_ssize_t cap) {
    Py_ssize_t i, k = 0;
    switch (size) {
    case 8:
        SCAN_POSITIONS(u64u)
        break;
    case 4:
        SCAN_POSITIONS(u32u)
        break;
    case 2:
        SCAN_POSITIONS(u16u)
        break;
    default:
        SCAN_POSITIONS(unsigned char)
        break;
    }
    return k;
}

/* A block where few elements differ (SPARSE): a = b elsewhere, so Σ(a² + b²) = 2Σa² + Σ(b² - a²)
 * over the k differing positions pos[] (y[q]: B's value at pos[q]), and only those are measured
 * (in order: the first largest difference wins). Where the bits differ but the values are equal
 * (-0.0 vs 0.0) the difference is 0 and adds nothing. Returns 0, having changed nothing, when a
 * value is not finite (the general path then runs). */
static int sparse_block(const double *x, const Py_ssize_t *pos, const double *y, Py_ssize_t k, Py_ssize_t m,
                        Py_ssize_t base, double rtol, double atol, Part *p) {
    double s = sum_squares(x, m), sa = 0, sd = 0, corr = 0, best = p->best, mr = p->max_rel;
    Py_ssize_t q, i, best_at = p->best_at;
    int64_t tf = 0;
    if (!isfinite(s)) return 0;
    for (q = 0; q < k; q++) {
        double a, b, di, ax, ay, den;
        i = pos[q];
        a = x[i];
        b = y[q];
        if (a == b) continue;
        if (!isfinite(b)) return 0;
        di = fabs(a - b);
        ax = fabs(a);
        ay = fabs(b);
        den = ax > ay ? ax : ay;
        sa += di;
        sd += di * di;
        corr += b * b - a * a;
        tf += di > atol + rtol * ay;
        if (di > best) {
            best = di;
            best_at = base + i;
        }
        if (di > REL_SCREEN(mr) * den && di / den > mr) mr = di / den; /* den > 0: a != b */
    }
    p->finite_n += m;
    p->sxx += 2 * s + corr;
    p->sum_abs += sa;
    p->sdd += sd;
    p->tol_fail += tf;
    p->best = best;
    p->best_at = best_at;
    p->max_rel = mr;
    return 1;
}

typedef struct {
    const char *a, *b;
    int fa, fb;
    const double *ta, *tb;
    Py_ssize_t n;
    double rtol, atol;
} DiffArgs;

static void diff_run(const DiffArgs *g, Part *p) {
    double x[BLOCK] __attribute__((aligned(32))), y[BLOCK] __attribute__((aligned(32)));
    double d[BLOCK] __attribute__((aligned(32)));
    Py_ssize_t pos[BLOCK / SPARSE];
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
        int dense;
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
        if (same && nb * SPARSE <= m) { /* B's values only where the bits differ */
            Py_ssize_t q, k = differing_positions(ca, cb, sb, m, pos, BLOCK / SPARSE);
            for (q = 0; q < k; q++) widen(g->fb, g->tb, cb + pos[q] * sb, y + q, 1);
            if (sparse_block(x, pos, y, k, m, base, g->rtol, g->atol, p)) continue;
        }
        widen(g->fb, g->tb, cb, y, m);
        lanes_zero(&l);
        dense = dense_block[g->rtol == 0 && g->atol == 0](x, y, d, m, g->rtol, g->atol, p->max_rel, &l);
        if (dense) {
            p->finite_n += m;
        } else {
            lanes_zero(&l);
            masked_block(x, y, d, m, base, g->rtol, g->atol, &l, p);
        }
        if (dense != 1) rel_block(x, y, d, m, &l);
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

/* chunk_hashes(fn, data, chunk, out): out[k] = fn(data + k*chunk, min(chunk, len - k*chunk)) for
 * every chunk of data, without the GIL. fn is the address of XXH3_64bits (uint64 (*)(const void *,
 * size_t)), which ftkit.tensors.xxh3 takes from python-xxhash's own extension after checking its
 * known answer; out is a writable buffer of ceil(len / chunk) uint64. The host half of the
 * ftkit-fp2 fingerprint: one call per buffer instead of one per chunk. */
typedef uint64_t (*hash64_fn)(const void *, size_t);

static PyObject *py_chunk_hashes(PyObject *self, PyObject *args) {
    unsigned long long addr;
    PyObject *od, *oo;
    Py_ssize_t chunk, n, count, k;
    Py_buffer vd, vo;
    hash64_fn fn;
    uint64_t *out;
    const char *data;
    (void)self;
    if (!PyArg_ParseTuple(args, "KOnO", &addr, &od, &chunk, &oo)) return NULL;
    if (addr == 0 || chunk <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk_hashes needs a function address and a positive chunk");
        return NULL;
    }
    if (PyObject_GetBuffer(od, &vd, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(oo, &vo, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&vd);
        return NULL;
    }
    n = vd.len;
    count = (n + chunk - 1) / chunk;
    if (vo.len != count * (Py_ssize_t)sizeof(uint64_t)) {
        PyBuffer_Release(&vd);
        PyBuffer_Release(&vo);
        PyErr_SetString(PyExc_ValueError, "chunk_hashes: out must hold one uint64 per chunk");
        return NULL;
    }
    fn = (hash64_fn)(uintptr_t)addr;
    out = (uint64_t *)vo.buf;
    data = (const char *)vd.buf;
    Py_BEGIN_ALLOW_THREADS for (k = 0; k < count; k++) {
        Py_ssize_t at = k * chunk;
        out[k] = fn(data + at, (size_t)(n - at < chunk ? n - at : chunk));
    }
    Py_END_ALLOW_THREADS PyBuffer_Release(&vd);
    PyBuffer_Release(&vo);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"diff", py_diff, METH_VARARGS, "diff(a, b, fmt_a, fmt_b, table_a, table_b, rtol, atol) -> stripe partials"},
    {"nonfinite", py_nonfinite, METH_VARARGS, "nonfinite(a, fmt, table) -> (nan, inf)"},
    {"chunk_hashes", py_chunk_hashes, METH_VARARGS, "chunk_hashes(fn_address, data, chunk, out) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels", "ftkit's compiled compare kernels", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    PyObject *m;
#if defined(HOT_CLONES)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        dense_block[0] = dense_avx2;
        dense_block[1] = dense_avx2_exact;
    }
#endif
    m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
