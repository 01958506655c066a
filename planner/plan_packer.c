/* The plan packer: one step's packed int32 buffer, from a census pass over the engine
 * rows and then one short loop per field (copies where rows keep the engine's order).
 *
 * The compiled twin of the numpy packer in compile.py (``_pack`` and its helpers), which
 * stays the specification: a plan packed here equals compile_plan's byte for byte. The
 * buffer layout is planner/layout.py's; Python allocates the buffer for each plan and
 * chooses its layout, this code only fills it. Every argument is checked (types,
 * contiguity, lengths, no memory shared with the output) and every count a write is
 * bounded by is checked against the layout before that write, so a wrong call raises
 * TypeError or ValueError naming the argument instead of writing out of bounds. Built at
 * first use by native.py.
 *
 * Also StepBatch's copies and checks (``check_batch``, the compiled twin of batch.py's
 * numpy checks): it only says whether a batch passes; numpy names the error if not.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

enum { SPEC = 0, DECODE = 1, PREFILL = 2, PADDING = 3 };

/* Whether ``view`` holds ``itemsize``-byte items of struct code ``code`` (native order);
 * if not, releases it and raises TypeError naming ``name``. */
static int check_format(Py_buffer *view, const char *name, char code, Py_ssize_t itemsize) {
    const uint16_t probe = 1;
    const int little = *(const char *)&probe == 1;
    const char *format = view->format ? view->format : "B";
    if (*format == '@' || *format == '=' || (*format == '<' && little)) {
        format++;
    }
    if (view->itemsize != itemsize || format[0] != code || format[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "%s: must hold %s, got format '%s'", name,
                     itemsize == 4 ? "int32" : "int8", view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Acquire ``obj``'s buffer with ``flags``, then check it holds ``itemsize``-byte items of
 * struct code ``code``; ``kind`` names what ``flags`` ask for in the error. */
static int get_buffer(PyObject *obj, Py_buffer *view, const char *name, int flags,
                      const char *kind, char code, Py_ssize_t itemsize) {
    if (!PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: must be an array, got %.80s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: must be %s array", name, kind);
        return -1;
    }
    return check_format(view, name, code, itemsize);
}

/* Acquire a C-contiguous buffer of ``itemsize``-byte items of struct code ``code``. */
static int get_array(PyObject *obj, Py_buffer *view, const char *name, char code,
                     Py_ssize_t itemsize, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    const char *kind = writable ? "a C-contiguous, writable" : "a C-contiguous";
    return get_buffer(obj, view, name, flags, kind, code, itemsize);
}

/* Acquire an array of int32 items at any strides, read-only. */
static int get_strided(PyObject *obj, Py_buffer *view, const char *name) {
    return get_buffer(obj, view, name, PyBUF_RECORDS_RO, "a strided", 'i', 4);
}

/* A non-negative C integer from argument ``name``; -1 with an exception set otherwise. */
static Py_ssize_t get_count(PyObject *obj, const char *name) {
    Py_ssize_t value = PyLong_AsSsize_t(obj);
    if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: must be an int", name);
        return -1;
    }
    if (value < 0) {
        PyErr_Format(PyExc_ValueError, "%s: must be >= 0, got %zd", name, value);
        return -1;
    }
    return value;
}

/* The batch's arrays: engine rows, each checked against ``num_rows`` rows. Row lengths
 * are read as differences of ``query_start``, which is read anyway (one array less). */
typedef struct {
    Py_buffer views[5];
    int held;
    Py_ssize_t num_rows;
    const int32_t *query_start, *computed, *accepted, *slots;
    const int8_t *kinds;
} Batch;

static void release_batch(Batch *batch) {
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

/* args: query_start, num_computed_tokens, num_accepted_tokens, slots, kinds; ``groups``
 * rows of slots. Fills ``batch``; on failure releases it and sets an exception. */
static int take_batch(Batch *batch, PyObject *const *args, Py_ssize_t groups) {
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

/* What the first pass learns: rows and tokens per kind (padding too), and whether a spec
 * row has q > Q or accepted outside 1..Q; then tiles and the longest prefill. */
typedef struct {
    Py_ssize_t rows[4];
    int64_t tokens[4];
    int64_t tiles;
    int32_t longest_prefill;
    int breaks_limits;
    int in_order; /* kinds never decrease: the live rows lead, already in group order */
} Census;

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
static int take_census(const Batch *batch, Py_ssize_t query_len_max, Census *census) {
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

/* prefill_tiles(query_lens, kinds, tile) -> int: work tiles of ``tile`` tokens that the
 * prefill rows need (what sizes an eager plan's tile fields). */
static PyObject *prefill_tiles(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
        const int32_t *lens = lens_view.buf;
        const int8_t *kinds = kinds_view.buf;
        int64_t tiles = 0;
        for (Py_ssize_t r = 0; r < n; r++) {
            if (kinds[r] == PREFILL && lens[r] > 0) {
                tiles += (lens[r] + tile - 1) / tile;
            }
        }
        result = PyLong_FromLongLong(tiles);
    }
    PyBuffer_Release(&kinds_view);
    PyBuffer_Release(&lens_view);
    return result;
}

/* The packed buffer's fields, as planner/layout.py places them. */
typedef struct {
    int32_t *token_map, *query_start, *token_start, *kind, *state_offset, *reads_state,
        *num_accepted, *request, *slot, *tile_row, *tile_start;
    Py_ssize_t tokens, rows, tiles, groups;
} Fields;

/* Points the fields into ``buffer``, by the sizes ``f`` holds. */
static void place_fields(int32_t *buffer, Fields *f) {
    Py_ssize_t tokens = f->tokens, rows = f->rows, tiles = f->tiles, groups = f->groups;
    f->token_map = buffer;
    f->query_start = f->token_map + tokens;
    f->token_start = f->query_start + rows + 1;
    f->kind = f->token_start + rows;
    f->state_offset = f->kind + rows;
    f->reads_state = f->state_offset + rows;
    f->num_accepted = f->reads_state + rows;
    f->request = f->num_accepted + rows;
    f->slot = f->request + rows;
    f->tile_row = f->slot + groups * rows;
    f->tile_start = f->tile_row + tiles;
}

/* Token map entries a short row writes at once: its tokens, then whatever follows, which
 * later rows of its group (or the padding) overwrite. A fixed count keeps the loop free
 * of a branch on each row's length, which varies at random among spec rows. */
enum { SPAN = 8 };

/* Group-ordered rows ``p`` (engine rows ``request[p]``), kind by kind; each field gets a
 * loop of its own (short, independent, vectorizable where rows keep the engine order). */

/* row_request: the engine row of every group-ordered row. Each row goes where its kind's
 * next row goes, chosen by selects rather than branches (kinds interleave at random), and
 * a padding row into a local sink. */
static void write_requests(const Batch *b, const Fields *f, const Census *c, int in_order) {
    Py_ssize_t live = c->rows[SPEC] + c->rows[DECODE] + c->rows[PREFILL];
    if (in_order) {
        for (Py_ssize_t p = 0; p < live; p++) {
            f->request[p] = (int32_t)p;
        }
        return;
    }
    int32_t sink, *spec = f->request, *decode = spec + c->rows[SPEC];
    int32_t *prefill = decode + c->rows[DECODE];
    for (Py_ssize_t r = 0; r < b->num_rows; r++) {
        int kind = b->kinds[r];
        int32_t *at = kind == SPEC ? spec : kind == DECODE ? decode : prefill;
        at = kind == PADDING ? &sink : at;
        *at = (int32_t)r;
        spec += kind == SPEC, decode += kind == DECODE, prefill += kind == PREFILL;
    }
}

/* out[p] = values[order[p]] for p < n; a plain copy where ``order`` is NULL (rows in
 * engine order). */
static void gather(int32_t *restrict out, const int32_t *restrict values,
                   const int32_t *restrict order, Py_ssize_t n) {
    if (order == NULL) {
        memcpy(out, values, (size_t)n * sizeof(int32_t));
        return;
    }
    for (Py_ssize_t p = 0; p < n; p++) {
        out[p] = values[order[p]];
    }
}

/* row_kind, row_state_offset, row_reads_state, row_num_accepted. */
static void write_flags(const Batch *b, const Fields *f, const Census *c,
                        const int32_t *order) {
    Py_ssize_t spec = c->rows[SPEC], decode = c->rows[DECODE];
    Py_ssize_t live = spec + decode + c->rows[PREFILL];
    gather(f->num_accepted, b->accepted, order, spec);
    for (Py_ssize_t p = 0; p < spec; p++) {
        f->kind[p] = SPEC, f->state_offset[p] = f->num_accepted[p] - 1, f->reads_state[p] = 1;
    }
    if (order == NULL) {
        gather(f->reads_state + spec, b->computed + spec, NULL, live - spec);
    } else {
        gather(f->reads_state + spec, b->computed, order + spec, live - spec);
    }
    for (Py_ssize_t p = spec; p < live; p++) {
        f->kind[p] = p < spec + decode ? DECODE : PREFILL;
        f->state_offset[p] = 0, f->num_accepted[p] = 1;
        f->reads_state[p] = f->reads_state[p] > 0; /* has state: computed tokens > 0 */
    }
}

/* row_query_start, row_token_start and row_slot of the live rows. */
static void write_starts_and_slots(const Batch *b, const Fields *f, Py_ssize_t live,
                                   const int32_t *order) {
    gather(f->token_start, b->query_start, order, live);
    if (order == NULL) { /* live + 1: the padding rows that follow have no tokens */
        memcpy(f->query_start, b->query_start, (size_t)(live + 1) * sizeof(int32_t));
    } else { /* the lengths in group order, one place on, then summed up in place */
        int32_t *starts = f->query_start;
        for (Py_ssize_t p = 0; p < live; p++) {
            starts[p + 1] = b->query_start[order[p] + 1] - b->query_start[order[p]];
        }
        starts[0] = 0;
        for (Py_ssize_t p = 1; p <= live; p++) {
            starts[p] += starts[p - 1];
        }
    }
    for (Py_ssize_t g = 0; g < f->groups; g++) {
        gather(f->slot + g * f->rows, b->slots + g * b->num_rows, order, live);
    }
}

/* token_map of rows ``begin .. stop``, whose tokens end at ``end`` (the next group's first
 * token, or the map's end). Needs row_query_start and row_token_start written. */
static void write_tokens(const Fields *f, Py_ssize_t begin, Py_ssize_t stop, int64_t end) {
    for (Py_ssize_t p = begin; p < stop; p++) {
        int32_t first = f->query_start[p], engine_first = f->token_start[p];
        int32_t q = f->query_start[p + 1] - first, j = 0;
        int32_t *tokens = f->token_map + first;
        if (first + SPAN <= end) {
            for (; j < SPAN; j++) {
                tokens[j] = engine_first + j;
            }
        }
        for (; j < q; j++) {
            tokens[j] = engine_first + j;
        }
    }
}

/* tile_row and tile_start of the live tiles: the prefill rows' tiles in row order. */
static void write_tiles(const Fields *f, const Census *c, Py_ssize_t tile) {
    Py_ssize_t begin = c->rows[SPEC] + c->rows[DECODE], stop = begin + c->rows[PREFILL];
    int64_t next = 0;
    for (Py_ssize_t p = begin; p < stop; p++) {
        int32_t q = f->query_start[p + 1] - f->query_start[p];
        int32_t count = (int32_t)((q + tile - 1) / tile);
        for (int32_t i = 0; i < count; i++, next++) {
            f->tile_row[next] = (int32_t)p, f->tile_start[next] = (int32_t)(i * tile);
        }
    }
}

/* Every entry past the live rows, tokens and tiles: its field's padding value. */
static void write_padding(const Fields *f, Py_ssize_t live, int64_t num_tokens,
                          int64_t num_tiles) {
    for (Py_ssize_t t = num_tokens; t < f->tokens; t++) {
        f->token_map[t] = -1;
    }
    for (Py_ssize_t p = live; p <= f->rows; p++) {
        f->query_start[p] = (int32_t)num_tokens;
    }
    for (Py_ssize_t p = live; p < f->rows; p++) {
        f->token_start[p] = 0, f->kind[p] = PADDING, f->state_offset[p] = 0;
        f->reads_state[p] = 0, f->num_accepted[p] = 1, f->request[p] = -1;
    }
    for (Py_ssize_t g = 0; g < f->groups; g++) {
        for (Py_ssize_t p = live; p < f->rows; p++) {
            f->slot[g * f->rows + p] = 0;
        }
    }
    for (Py_ssize_t i = num_tiles; i < f->tiles; i++) {
        f->tile_row[i] = -1, f->tile_start[i] = 0;
    }
}

/* Tiles and the longest query of the prefill rows (their engine rows are the last ones
 * in row_request), into ``census``. */
static void count_tiles(const Batch *b, const Fields *f, Py_ssize_t tile, Census *census) {
    Py_ssize_t begin = census->rows[SPEC] + census->rows[DECODE];
    for (Py_ssize_t p = begin; p < begin + census->rows[PREFILL]; p++) {
        Py_ssize_t r = f->request[p];
        int32_t q = b->query_start[r + 1] - b->query_start[r];
        census->tiles += (q + tile - 1) / tile;
        census->longest_prefill = q > census->longest_prefill ? q : census->longest_prefill;
    }
}

/* Places the fields (``f`` holds the layout's sizes), writes row_request and counts the
 * tiles, which the layout must then be checked to hold; returns the count. */
static int64_t order_rows(const Batch *b, int32_t *buffer, Census *census, Py_ssize_t tile,
                          Fields *f) {
    place_fields(buffer, f);
    write_requests(b, f, census, census->in_order);
    count_tiles(b, f, tile, census);
    return census->tiles;
}

/* The whole buffer but row_request (written first): rows in group order [spec | decode |
 * prefill], the engine's order within a group. Rows already in that order (``in_order``)
 * map tokens to themselves. */
static void write_plan(const Batch *b, const Fields *f, const Census *c, Py_ssize_t tile,
                       int in_order) {
    Py_ssize_t spec = c->rows[SPEC], decode = c->rows[DECODE];
    Py_ssize_t live = spec + decode + c->rows[PREFILL];
    int64_t spec_end = c->tokens[SPEC], decode_end = spec_end + c->tokens[DECODE];
    int64_t num_tokens = decode_end + c->tokens[PREFILL];
    const int32_t *order = in_order ? NULL : f->request;
    write_flags(b, f, c, order);
    write_starts_and_slots(b, f, live, order);
    if (in_order) {
        for (int64_t t = 0; t < num_tokens; t++) {
            f->token_map[t] = (int32_t)t;
        }
    } else {
        write_tokens(f, 0, spec, spec_end);
        write_tokens(f, spec, spec + decode, decode_end);
        write_tokens(f, spec + decode, live, f->tokens);
    }
    write_tiles(f, c, tile);
    write_padding(f, live, num_tokens, c->tiles);
}

/* Whether the output buffer shares a byte with any of the batch's arrays (the packer reads
 * lengths and rows back while it writes, so it must not write into them). */
static int overlaps(const Py_buffer *out, const Batch *batch) {
    uintptr_t begin = (uintptr_t)out->buf, end = begin + (uintptr_t)out->len;
    for (int i = 0; i < batch->held; i++) {
        uintptr_t other = (uintptr_t)batch->views[i].buf;
        if (other < end && begin < other + (uintptr_t)batch->views[i].len) {
            return 1;
        }
    }
    return 0;
}

static const char PACK_DOC[] =
    "pack(packed, query_start, num_computed_tokens, num_accepted_tokens, slots, kinds,\n"
    "     num_tokens, num_rows, num_tiles, num_groups, query_len_max, tile)\n"
    "Fill ``packed`` (int32, laid out as PlanLayout(num_tokens, num_rows, num_tiles,\n"
    "num_groups)) with one step's plan. Returns (num_tiles, longest prefill, spec tokens),\n"
    "or None when a spec row breaks the config's limits (q > Q or accepted outside\n"
    "1..Q); the buffer is then left unspecified.";

static PyObject *pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    static const char *const count_names[] = {"num_tokens", "num_rows", "num_tiles",
                                              "num_groups", "query_len_max", "tile"};
    Py_ssize_t counts[6];
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "pack takes 12 arguments, got %zd", nargs);
        return NULL;
    }
    for (int i = 0; i < 6; i++) {
        if ((counts[i] = get_count(args[6 + i], count_names[i])) < 0) {
            return NULL;
        }
    }
    Py_ssize_t tokens = counts[0], rows = counts[1], tiles = counts[2], groups = counts[3];
    Py_ssize_t query_len_max = counts[4], tile = counts[5];
    if (groups < 1 || groups > (1 << 20) || tile < 1 ||
        rows > (PY_SSIZE_T_MAX / 16) / (groups + 8) ||
        tokens > PY_SSIZE_T_MAX / 16 || tiles > PY_SSIZE_T_MAX / 16) {
        PyErr_SetString(PyExc_ValueError,
                        "num_groups, tile: must be positive, and the layout's sizes in range");
        return NULL;
    }
    Batch batch;
    if (take_batch(&batch, args + 1, groups) < 0) {
        return NULL;
    }
    Py_buffer out;
    if (get_array(args[0], &out, "packed", 'i', 4, 1) < 0) {
        release_batch(&batch);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t size = tokens + (7 + groups) * rows + 1 + 2 * tiles;
    Census census;
    Fields fields = {.tokens = tokens, .rows = rows, .tiles = tiles, .groups = groups};
    if (overlaps(&out, &batch)) {
        PyErr_SetString(PyExc_ValueError, "packed: shares memory with the batch's arrays");
    } else if (out.len != size * 4) {
        PyErr_Format(PyExc_ValueError, "packed: has %zd entries, the layout needs %zd",
                     out.len / 4, size);
    } else if (take_census(&batch, query_len_max, &census) == 0) {
        Py_ssize_t live = census.rows[SPEC] + census.rows[DECODE] + census.rows[PREFILL];
        int64_t num_tokens = census.tokens[SPEC] + census.tokens[DECODE] + census.tokens[PREFILL];
        if (census.tokens[PADDING]) {
            PyErr_SetString(PyExc_ValueError, "query_start: a padding row (kind 3) has tokens");
        } else if (census.breaks_limits) {
            result = Py_NewRef(Py_None);
        } else if (live > rows || num_tokens > tokens) {
            PyErr_Format(PyExc_ValueError,
                         "packed: %zd rows, %lld tokens exceed the layout's %zd, %zd", live,
                         (long long)num_tokens, rows, tokens);
        } else if (order_rows(&batch, out.buf, &census, tile, &fields) > tiles) {
            PyErr_Format(PyExc_ValueError, "packed: %lld tiles exceed the layout's %zd",
                         (long long)census.tiles, tiles);
        } else {
            write_plan(&batch, &fields, &census, tile, census.in_order);
            result = Py_BuildValue("(LiL)", (long long)census.tiles,
                                   (int)census.longest_prefill, (long long)census.tokens[SPEC]);
        }
    }
    PyBuffer_Release(&out);
    release_batch(&batch);
    return result;
}

/* -- check_batch: StepBatch's copies, checks and derived fields (batch.py's numpy code is
 * the specification and names every error; this only says whether there is one). */

/* A set of positive slots, open-addressed (linear probing, 0 marks a free entry) in a
 * power-of-two table at least twice the rows it takes, so probes stay short. */
typedef struct {
    uint32_t *entries;
    uint32_t mask;
    int shift;
} SlotSet;

/* Adds ``slot`` (> 0); 1 when it was there already. Multiplicative hashing spreads the
 * consecutive slot numbers engines hand out over the table. */
static int slot_seen(SlotSet *set, uint32_t slot) {
    uint32_t at = (slot * 2654435761u) >> set->shift;
    while (set->entries[at] != 0) {
        if (set->entries[at] == slot) {
            return 1;
        }
        at = (at + 1) & set->mask;
    }
    set->entries[at] = slot;
    return 0;
}

/* Whether a positive slot repeats among the live rows of one group, by the hash set. */
static int repeats_hashed(const int32_t *slots, const int8_t *kinds, Py_ssize_t rows,
                          SlotSet *set) {
    memset(set->entries, 0, ((size_t)set->mask + 1) * sizeof(uint32_t));
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (kinds[r] != PADDING && slots[r] > 0 && slot_seen(set, (uint32_t)slots[r])) {
            return 1;
        }
    }
    return 0;
}

/* The same by one byte per slot number up to ``highest`` (>= every live slot, all >= 0):
 * no branch per row; padding rows read as slot 0, which marks nothing. */
static int repeats_in_bytemap(const int32_t *slots, const int8_t *kinds, Py_ssize_t rows,
                              int32_t highest, uint8_t *seen) {
    uint8_t repeated = 0;
    memset(seen, 0, (size_t)highest + 1);
    for (Py_ssize_t r = 0; r < rows; r++) {
        uint32_t slot = kinds[r] == PADDING ? 0 : (uint32_t)slots[r];
        repeated |= seen[slot];
        seen[slot] = slot != 0;
    }
    return repeated != 0;
}

/* Bytemap entries on the stack: slots below this use the bytemap when clearing it costs
 * no more than a few bytes per row, others the hash set. */
enum { BYTEMAP_SLOTS = 16384, STACK_SET_ROWS = 1024, MAX_SET_ROWS = 1 << 28 };

/* Whether the live rows' slots break a rule in any group: a negative slot, slot 0 (unless
 * ``allow_null``), or one slot on two rows of a group (slot 0 may repeat). */
static int slots_broken(const int32_t *slots, const int8_t *kinds, Py_ssize_t rows,
                        Py_ssize_t groups, int allow_null, SlotSet *set) {
    uint8_t seen[BYTEMAP_SLOTS];
    for (Py_ssize_t g = 0; g < groups; g++) {
        const int32_t *row_slots = slots + g * rows;
        int32_t lowest = INT32_MAX, highest = 0;
        for (Py_ssize_t r = 0; r < rows; r++) { /* vectorized: the live rows' range */
            int32_t live = -(int32_t)(kinds[r] != PADDING), slot = row_slots[r];
            int32_t low = (slot & live) | (INT32_MAX & ~live), high = slot & live;
            lowest = low < lowest ? low : lowest;
            highest = high > highest ? high : highest;
        }
        if (lowest < 0 || (lowest == 0 && !allow_null)) {
            return 1;
        }
        int repeated = highest < BYTEMAP_SLOTS && highest <= 16 * rows + 1024
                           ? repeats_in_bytemap(row_slots, kinds, rows, highest, seen)
                           : repeats_hashed(row_slots, kinds, rows, set);
        if (repeated) {
            return 1;
        }
    }
    return 0;
}

/* Kinds and rows per kind (vectorized), then query starts; 1 when a length is negative,
 * a spec row's length is not its drafts + 1, or the token total passes int32. A row with
 * drafts >= 0 is spec; else 0, 1 or more tokens make it padding, decode or prefill. */
static int rows_broken(const int32_t *restrict q, const int32_t *restrict computed,
                       const int32_t *restrict drafts, Py_ssize_t rows, int8_t *restrict kinds,
                       int32_t *restrict starts, Py_ssize_t counts[4]) {
    uint32_t bad = 0, spec_rows = 0, decode_rows = 0, prefill_rows = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int32_t length = q[r], draft = drafts[r];
        bad |= (uint32_t)(length < 0) | (computed[r] < 0) | (draft < -1);
        uint32_t spec = draft >= 0, decode = length == 1, prefill = length > 1;
        bad |= spec & ((uint32_t)length != (uint32_t)draft + 1u);
        /* not spec: 3 - 2 = 1 for one token, 3 - 1 = 2 for more, 3 for none */
        kinds[r] = (int8_t)((PADDING - 2 * decode - prefill) & (spec - 1u));
        spec_rows += spec, decode_rows += decode & !spec, prefill_rows += prefill & !spec;
    }
    int64_t total = 0;
    starts[0] = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        total += q[r];
        starts[r + 1] = (int32_t)(uint32_t)total;
    }
    counts[SPEC] = spec_rows, counts[DECODE] = decode_rows, counts[PREFILL] = prefill_rows;
    counts[PADDING] = rows - spec_rows - decode_rows - prefill_rows;
    return bad || total > INT32_MAX;
}

/* The bytes ``view`` spans, whatever its strides' signs: [*begin, *end). */
static void extent(const Py_buffer *view, uintptr_t *begin, uintptr_t *end) {
    intptr_t low = 0, high = view->itemsize;
    for (int d = 0; d < view->ndim; d++) {
        if (view->shape[d] == 0) {
            high = 0;
            break;
        }
        intptr_t span = view->strides[d] * (view->shape[d] - 1);
        low += span < 0 ? span : 0, high += span > 0 ? span : 0;
    }
    *begin = (uintptr_t)view->buf + low, *end = (uintptr_t)view->buf + high;
}

/* Whether two buffers share a byte (the check writes while it reads). */
static int shares_memory(const Py_buffer *a, const Py_buffer *b) {
    uintptr_t a_begin, a_end, b_begin, b_end;
    extent(a, &a_begin, &a_end), extent(b, &b_begin, &b_end);
    return a_begin < b_end && b_begin < a_end && a_begin < a_end && b_begin < b_end;
}

/* check_batch's arrays, in argument order (allow_null_slots sits between SLOTS and DATA);
 * DATA and KINDS are its outputs. */
enum { LENS, COMPUTED, DRAFTS, ACCEPTED, SLOTS, DATA, KINDS, NUM_VIEWS };
static const char *const CHECK_NAMES[] = {
    "query_lens", "num_computed_tokens", "num_draft_tokens", "num_accepted_tokens",
    "slots",      "data",                "kinds"};

/* Whether the inputs disagree on their rows (a StepBatch check: numpy names it): [R]
 * arrays of query_lens' rows, a [G >= 1, R] slots array. */
static int rows_disagree(const Py_buffer views[NUM_VIEWS], Py_ssize_t *rows,
                         Py_ssize_t *groups) {
    if (views[LENS].ndim != 1 || views[SLOTS].ndim != 2) {
        return 1;
    }
    Py_ssize_t n = views[LENS].shape[0];
    for (int i = COMPUTED; i <= ACCEPTED; i++) {
        if (views[i].ndim != 1 || views[i].shape[0] != n) {
            return 1;
        }
    }
    *rows = n, *groups = views[SLOTS].shape[0];
    return views[SLOTS].shape[1] != n || *groups < 1;
}

/* Whether the outputs fit the batch exactly and stay apart from the inputs; else raises
 * ValueError naming the output (a wrong call). */
static int outputs_fit(const Py_buffer views[NUM_VIEWS], Py_ssize_t rows, Py_ssize_t groups) {
    if (groups > (PY_SSIZE_T_MAX / 8) / (rows + 1) - 8 ||
        views[DATA].len != ((5 + groups) * rows + 1) * 4 || views[KINDS].len != rows) {
        int bad = views[KINDS].len != rows ? KINDS : DATA;
        PyErr_Format(PyExc_ValueError, "%s: has %zd entries, expected %zd", CHECK_NAMES[bad],
                     views[bad].len / views[bad].itemsize,
                     bad == KINDS ? rows : (5 + groups) * rows + 1);
        return 0;
    }
    for (int out = DATA; out <= KINDS; out++) {
        for (int i = 0; i < NUM_VIEWS; i++) {
            if (i != out && shares_memory(&views[out], &views[i])) {
                PyErr_Format(PyExc_ValueError, "%s: shares memory with %s", CHECK_NAMES[out],
                             CHECK_NAMES[i]);
                return 0;
            }
        }
    }
    return 1;
}

/* ``count`` int32 entries ``stride`` bytes apart (any alignment) into ``to``. */
static void copy_strided(int32_t *to, const char *from, Py_ssize_t stride, Py_ssize_t count) {
    if (stride == 4) {
        memcpy(to, from, (size_t)count * 4);
        return;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(&to[i], from + i * stride, 4);
    }
}

/* The inputs, copied into ``data`` as [query_lens | computed | drafts | accepted | slots
 * by group], each contiguous; the query starts go after them. */
static void copy_inputs(const Py_buffer views[NUM_VIEWS], Py_ssize_t rows, Py_ssize_t groups,
                        int32_t *data) {
    for (int i = LENS; i <= ACCEPTED; i++) {
        copy_strided(data + i * rows, views[i].buf, views[i].strides[0], rows);
    }
    const Py_buffer *slots = &views[SLOTS];
    for (Py_ssize_t g = 0; g < groups; g++) {
        copy_strided(data + (4 + g) * rows, (const char *)slots->buf + g * slots->strides[0],
                     slots->strides[1], rows);
    }
}

/* The checks on the copied arrays: the rows per kind, None, or NULL (no memory). A flag
 * whose truth raises, or rows past the hash's 32 bits: None, numpy decides. */
static PyObject *check_data(int32_t *data, int8_t *kinds, Py_ssize_t rows, Py_ssize_t groups,
                            PyObject *allow_null_slots) {
    int allow_null = PyObject_IsTrue(allow_null_slots);
    Py_ssize_t counts[4];
    if (allow_null < 0 || rows > MAX_SET_ROWS) {
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    const int32_t *slots = data + 4 * rows;
    if (rows_broken(data, data + rows, data + 2 * rows, rows, kinds, data + (4 + groups) * rows,
                    counts)) {
        return Py_NewRef(Py_None);
    }
    uint32_t stack_entries[2 * STACK_SET_ROWS];
    SlotSet set = {.entries = stack_entries, .mask = 15, .shift = 28};
    while ((Py_ssize_t)set.mask + 1 < 2 * rows) {
        set.mask = set.mask * 2 + 1, set.shift--;
    }
    if (rows > STACK_SET_ROWS &&
        !(set.entries = PyMem_Malloc(((size_t)set.mask + 1) * sizeof(uint32_t)))) {
        return PyErr_NoMemory();
    }
    int broken = slots_broken(slots, kinds, rows, groups, allow_null, &set);
    if (set.entries != stack_entries) {
        PyMem_Free(set.entries);
    }
    if (broken) {
        return Py_NewRef(Py_None);
    }
    return Py_BuildValue("(nnnn)", counts[0], counts[1], counts[2], counts[3]);
}

static const char CHECK_DOC[] =
    "check_batch(query_lens, num_computed_tokens, num_draft_tokens, num_accepted_tokens,\n"
    "            slots, allow_null_slots, data, kinds)\n"
    "StepBatch's copies, checks (SPEC 3.6) and derived fields in one pass. Inputs: int32\n"
    "arrays at any strides, [R] each, slots [G, R]. Fills ``data`` (int32, (5 + G) R + 1:\n"
    "the inputs in that order, contiguous, then query_start [R + 1]) and ``kinds`` ([R]\n"
    "int8); returns the rows per kind (spec, decode, prefill, padding), or None when any\n"
    "check fails (the outputs are then unspecified; batch.py's numpy checks name the\n"
    "error).";

static PyObject *check_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != NUM_VIEWS + 1) {
        PyErr_Format(PyExc_TypeError, "check_batch takes 8 arguments, got %zd", nargs);
        return NULL;
    }
    Py_buffer views[NUM_VIEWS];
    int held = 0;
    for (; held < NUM_VIEWS; held++) {
        int ok = held < DATA ? get_strided(args[held], &views[held], CHECK_NAMES[held])
                 : held == DATA ? get_array(args[held + 1], &views[held], "data", 'i', 4, 1)
                                : get_array(args[held + 1], &views[held], "kinds", 'b', 1, 1);
        if (ok < 0) {
            break;
        }
    }
    PyObject *result = NULL;
    Py_ssize_t rows, groups;
    if (held == NUM_VIEWS) {
        if (rows_disagree(views, &rows, &groups)) {
            result = Py_NewRef(Py_None);
        } else if (outputs_fit(views, rows, groups)) {
            copy_inputs(views, rows, groups, views[DATA].buf);
            result = check_data(views[DATA].buf, views[KINDS].buf, rows, groups, args[DATA]);
        }
    }
    while (held > 0) {
        PyBuffer_Release(&views[--held]);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL, PACK_DOC},
    {"prefill_tiles", (PyCFunction)(void (*)(void))prefill_tiles, METH_FASTCALL,
     "prefill_tiles(query_lens, kinds, tile) -> int: work tiles of the prefill rows."},
    {"check_batch", (PyCFunction)(void (*)(void))check_batch, METH_FASTCALL, CHECK_DOC},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_plan_packer", "The compiled plan packer (see compile.py's _pack).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__plan_packer(void) { return PyModule_Create(&module); }
