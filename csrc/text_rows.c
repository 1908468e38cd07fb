/*
 * fastdata.text._rows: a packed text batch from the rows a loader worker handed over, in one pass.
 *
 * A worker hands over rows of L + 1 int32 tokens (a row's inputs and, one further, its last label; best-fit rows
 * hold -100 at their padding). The main process makes of them, per batch, the int64 `input_ids` and `labels`
 * (labels shifted by one) and, as asked, `attention_mask` (best-fit: 0 on padding, where `input_ids` gets the
 * padding id), labels of -100 at end-of-text inputs (`mask_cross_document`) and the document boundaries
 * (`position_ids`, restarting after each end-of-text input and at each row's start, and the segments' starts over
 * the flattened batch, `cu_seqlens`). numpy needs a pass over the batch for each of them, each reading the rows
 * again; this reads each row once and writes every array in the same pass. fastdata/text/forms.py holds the
 * numpy reference (used where this extension was not built), and tests/text/ check the two against each other.
 *
 * Arrays come as buffers (numpy arrays, C-contiguous; the caller checks shapes and dtypes), so this needs only
 * Python's headers. The GIL is released during the pass.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#if defined(__SSE2__) && defined(__GNUC__)
#include <emmintrin.h>
#endif

#define IGNORE_INDEX (-100)

static int want(Py_buffer *view, Py_ssize_t items, Py_ssize_t itemsize, const char *name) {
    if (view->buf == NULL) return 1; /* not asked for */
    if (view->len != items * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected %zd", name, view->len, items * itemsize);
        return 0;
    }
    return 1;
}

/* Every loop below is a plain loop over one row (4 KB at seq_len 1024, in L1 once read) that the compiler
 * vectorises; end-of-text inputs, which are rare, are found eight columns at a time (SSE2 where the compiler has
 * it, as on every x86-64). */
static void iota(int64_t *restrict out, Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < count; k++) out[k] = k;
}

typedef struct {
    int64_t *pos;       /* the row's positions */
    int32_t *st;        /* the segments' starts (or NULL) */
    Py_ssize_t base;    /* the row's place in the flattened batch */
    Py_ssize_t first;   /* the open segment's first column */
    Py_ssize_t longest; /* the row's longest segment so far */
    Py_ssize_t *segments;
} Segments;

/* An end-of-text input at column c: the segment open until it ends there, the next starts at c + 1. */
static inline void close_at(Segments *g, Py_ssize_t c) {
    iota(g->pos + g->first, c + 1 - g->first);
    if (c + 1 - g->first > g->longest) g->longest = c + 1 - g->first;
    g->first = c + 1;
    if (g->st) g->st[*g->segments] = (int32_t)(g->base + g->first);
    (*g->segments)++;
}

/* One row's segments: writes the positions, the starts after `base` into st (when given) from st[*segments] on;
 * returns the longest segment of the row. Column L - 1 starts nothing (the next row starts there anyway). */
static Py_ssize_t row_segments(const int32_t *restrict row, Py_ssize_t seq_len, int32_t eos, Py_ssize_t base,
                               int64_t *restrict pos, int32_t *restrict st, Py_ssize_t *segments) {
    Segments g = {pos, st, base, 0, 0, segments};
    if (st) st[*segments] = (int32_t)base;
    (*segments)++;
    Py_ssize_t last = seq_len - 1, c = 0;
#if defined(__SSE2__) && defined(__GNUC__)
    const __m128i want = _mm_set1_epi32(eos);
    for (; c + 8 <= last; c += 8) {
        __m128i low = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(row + c)), want);
        __m128i high = _mm_cmpeq_epi32(_mm_loadu_si128((const __m128i *)(row + c + 4)), want);
        unsigned bits = (unsigned)_mm_movemask_ps(_mm_castsi128_ps(low)) |
                        ((unsigned)_mm_movemask_ps(_mm_castsi128_ps(high)) << 4);
        while (bits) {
            close_at(&g, c + __builtin_ctz(bits));
            bits &= bits - 1;
        }
    }
#endif
    for (; c < last; c++)
        if (row[c] == eos) close_at(&g, c);
    iota(pos + g.first, seq_len - g.first);
    return seq_len - g.first > g.longest ? seq_len - g.first : g.longest;
}

/* One row's input_ids and labels (and attention mask, where `msk` is given), every argument by value so that the
 * compiler knows nothing aliases the lengths. */
static void row_tokens(const int32_t *restrict row, Py_ssize_t seq_len, int32_t eos, int mask_cross,
                       int64_t pad_id, int64_t *restrict ids, int64_t *restrict lab, int64_t *restrict msk) {
    for (Py_ssize_t c = 0; c < seq_len; c++) ids[c] = row[c];
    for (Py_ssize_t c = 0; c < seq_len; c++) lab[c] = row[c + 1];
    if (mask_cross)
        for (Py_ssize_t c = 0; c < seq_len; c++) lab[c] = row[c] == eos ? IGNORE_INDEX : lab[c];
    if (msk) {
        Py_ssize_t padded = seq_len;
        if (row[seq_len - 1] == IGNORE_INDEX)
            for (padded = 0; row[padded] != IGNORE_INDEX; padded++) {}
        for (Py_ssize_t c = 0; c < padded; c++) msk[c] = 1;
        for (Py_ssize_t c = padded; c < seq_len; c++) msk[c] = 0;
        for (Py_ssize_t c = padded; c < seq_len; c++) ids[c] = pad_id;
    }
}

/* batch(rows, rows_count, seq_len, eos_id, pad_id, mask_cross_document, input_ids, labels, attention_mask,
 *       position_ids, starts) -> (segments, longest)
 * rows: int32 [B, L + 1]; input_ids, labels: int64 [B, L] (written); attention_mask: int64 [B, L] or None (then
 * padding is not looked for: a row is padded from its first -100 on where its last input is -100); position_ids:
 * int64 [B, L] or None; starts: int32 [B * L + 1] or None (the segments' starts, then B * L: `segments` + 1 of
 * them written). Returns the number of segments and the longest (0, 0 without position_ids). */
static PyObject *batch(PyObject *self, PyObject *args) {
    Py_buffer rows = {0}, input_ids = {0}, labels = {0}, mask = {0}, positions = {0}, starts = {0};
    Py_ssize_t count, seq_len;
    long long eos_id, pad_id;
    int mask_cross;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nnLLpw*w*z*z*z*", &rows, &count, &seq_len, &eos_id, &pad_id, &mask_cross,
                          &input_ids, &labels, &mask, &positions, &starts))
        return NULL;
    if (seq_len < 1 || count < 0) {
        PyErr_SetString(PyExc_ValueError, "seq_len must be at least 1 and rows at least 0");
        goto done;
    }
    Py_ssize_t cells = count * seq_len;
    if (!want(&rows, count * (seq_len + 1), 4, "rows") || !want(&input_ids, cells, 8, "input_ids") ||
        !want(&labels, cells, 8, "labels") || !want(&mask, cells, 8, "attention_mask") ||
        !want(&positions, cells, 8, "position_ids") || !want(&starts, cells + 1, 4, "starts"))
        goto done;
    /* z* asks for no writable buffer: the optional outputs must be writable ones */
    if ((mask.buf && mask.readonly) || (positions.buf && positions.readonly) || (starts.buf && starts.readonly)) {
        PyErr_SetString(PyExc_ValueError, "output buffers must be writable");
        goto done;
    }
    Py_ssize_t segments = 0, longest = 0;
    Py_BEGIN_ALLOW_THREADS
    const int32_t eos = (int32_t)eos_id;
    for (Py_ssize_t r = 0; r < count; r++) {
        const int32_t *restrict row = (const int32_t *)rows.buf + r * (seq_len + 1);
        row_tokens(row, seq_len, eos, mask_cross, pad_id, (int64_t *)input_ids.buf + r * seq_len,
                   (int64_t *)labels.buf + r * seq_len, mask.buf ? (int64_t *)mask.buf + r * seq_len : NULL);
        if (positions.buf) {
            Py_ssize_t row_longest = row_segments(row, seq_len, eos, r * seq_len,
                                                  (int64_t *)positions.buf + r * seq_len, starts.buf, &segments);
            if (row_longest > longest) longest = row_longest;
        }
    }
    if (starts.buf) ((int32_t *)starts.buf)[segments] = (int32_t)cells;
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nn", segments, longest);
done:
    PyBuffer_Release(&rows);
    PyBuffer_Release(&input_ids);
    PyBuffer_Release(&labels);
    if (mask.obj) PyBuffer_Release(&mask);
    if (positions.obj) PyBuffer_Release(&positions);
    if (starts.obj) PyBuffer_Release(&starts);
    return result;
}

static PyMethodDef methods[] = {
    {"batch", batch, METH_VARARGS,
     "batch(rows, rows_count, seq_len, eos_id, pad_id, mask_cross_document, input_ids, labels, attention_mask, "
     "position_ids, starts) -> (segments, longest): a packed batch's arrays from its int32 rows, in one pass"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "fastdata.text._rows",
                                        "A packed text batch from its rows in one pass (see csrc/text_rows.c).", -1,
                                        methods};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module_def); }
