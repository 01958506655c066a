/* The batch's arrays as the packer reads them, and its counting pass over them (see rows.h). */
#include "rows.h"

#include <string.h>

#include "buffers.h"

void release_batch(Batch *batch) {
    for (int i = 0; i < batch->held; i++) {
        PyBuffer_Release(&batch->views[i]);
    }
    batch->held = 0;
}

static const void *take(Batch *batch, PyObject *obj, const char *name, char code,
                        Py_ssize_t itemsize, Py_ssize_t length) {
    Py_buffer *view = &batch->views[batch->held];
    if (get_array(obj, view, name, code, itemsize, 0) < 0) {
        return NULL;
    }
    batch->held++;
    if (view->len != length * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: has %zd entries, expected %zd", name,
                     view->len / itemsize, length);
        return NULL;
    }
    return view->buf;
}

int take_batch(Batch *batch, PyObject *const *args, Py_ssize_t groups) {
    Py_buffer *first = &batch->views[0];
    batch->held = 0;
    if (get_array(args[0], first, "query_start", 'i', 4, 0) < 0) {
        return -1;
    }
    batch->held = 1;
    Py_ssize_t n = first->len / 4 - 1;
    batch->num_rows = n;
    batch->query_start = first->buf;
    if (n < 0 || batch->query_start[0] != 0) {
        PyErr_SetString(PyExc_ValueError, "query_start: must start with 0");
        release_batch(batch);
        return -1;
    }
    if (!(batch->computed = take(batch, args[1], "num_computed_tokens", 'i', 4, n)) ||
        !(batch->accepted = take(batch, args[2], "num_accepted_tokens", 'i', 4, n)) ||
        !(batch->slots = take(batch, args[3], "slots", 'i', 4, groups * n)) ||
        !(batch->kinds = take(batch, args[4], "kinds", 'b', 1, n))) {
        release_batch(batch);
        return -1;
    }
    return 0;
}

/* The first row with a kind outside 0..3 or a negative length, as a ValueError. */
static int census_error(const Batch *batch) {
    for (Py_ssize_t r = 0; r < batch->num_rows; r++) {
        int kind = batch->kinds[r];
        if ((unsigned)kind > PADDING) {
            PyErr_Format(PyExc_ValueError, "kinds: row %zd has kind %d, not 0..3", r, kind);
            return -1;
        }
        if (batch->query_start[r + 1] < batch->query_start[r]) {
            PyErr_Format(PyExc_ValueError, "query_start: row %zd ends before it starts", r);
            return -1;
        }
    }
    return -1;
}

/* One branch-free pass (the compiler vectorizes it): spec and decode rows come
 * interleaved in any order, so the counts select by kind instead of branching on it.
 * Sums are 32-bit: a valid batch's fit (query_start is int32, starts at 0 and never
 * decreases), and an invalid one is refused before they are used. */
int take_census(const Batch *batch, Py_ssize_t query_len_max, Census *census) {
    const int32_t *starts = batch->query_start, *accepted = batch->accepted;
    const int8_t *kinds = batch->kinds;
    uint32_t rows[4] = {0, 0, 0, 0}, tokens[4] = {0, 0, 0, 0};
    uint32_t breaks = 0, unordered = 0, bad = 0, limit = (uint32_t)query_len_max;
    Py_ssize_t n = batch->num_rows;
    for (Py_ssize_t r = 0; r < n; r++) {
        uint32_t kind = (uint8_t)kinds[r]; /* a negative kind reads as >= 128: refused */
        uint32_t q = (uint32_t)starts[r + 1] - (uint32_t)starts[r];
        bad |= (kind > PADDING) | (starts[r + 1] < starts[r]);
        uint32_t spec = kind == SPEC, decode = kind == DECODE, prefill = kind == PREFILL;
        rows[0] += spec, rows[1] += decode, rows[2] += prefill;
        tokens[0] += q & -spec, tokens[1] += q & -decode, tokens[2] += q & -prefill;
        tokens[3] += q & -(uint32_t)(kind == PADDING);
        /* accepted - 1 wraps past Q - 1 when accepted < 1: one unsigned test for 1..Q */
        uint32_t wrong = (uint32_t)accepted[r] - 1u >= limit;
        breaks |= spec & (wrong | (q > limit));
    }
    for (Py_ssize_t r = 1; r < n; r++) {
        unordered |= (uint8_t)kinds[r] < (uint8_t)kinds[r - 1];
    }
    if (bad) {
        return census_error(batch);
    }
    memset(census, 0, sizeof(*census));
    for (int kind = 0; kind < 4; kind++) {
        census->rows[kind] = rows[kind], census->tokens[kind] = tokens[kind];
    }
    census->breaks_limits = breaks != 0;
    census->in_order = !unordered;
    return 0;
}

int64_t count_prefill_tiles(const int32_t *lens, const int8_t *kinds, Py_ssize_t rows,
                            Py_ssize_t tile) {
    int64_t tiles = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (kinds[r] == PREFILL && lens[r] > 0) {
            tiles += (lens[r] + tile - 1) / tile;
        }
    }
    return tiles;
}

PyObject *prefill_tiles(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "prefill_tiles takes 3 arguments, got %zd", nargs);
        return NULL;
    }
    Py_ssize_t tile = get_count(args[2], "tile");
    if (tile < 0) {
        return NULL;
    }
    if (tile == 0) {
        PyErr_SetString(PyExc_ValueError, "tile: must be positive");
        return NULL;
    }
    Py_buffer lens_view, kinds_view;
    if (get_array(args[0], &lens_view, "query_lens", 'i', 4, 0) < 0) {
        return NULL;
    }
    if (get_array(args[1], &kinds_view, "kinds", 'b', 1, 0) < 0) {
        PyBuffer_Release(&lens_view);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = lens_view.len / 4;
    if (kinds_view.len != n) {
        PyErr_Format(PyExc_ValueError, "kinds: has %zd entries, expected %zd", kinds_view.len, n);
    } else {
        result = PyLong_FromLongLong(count_prefill_tiles(lens_view.buf, kinds_view.buf, n, tile));
    }
    PyBuffer_Release(&kinds_view);
    PyBuffer_Release(&lens_view);
    return result;
}
