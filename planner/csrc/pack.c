/* The plan packer: one step's packed int32 buffer, from a census pass over the engine
 * rows (rows.c) and then one short loop per field (copies where rows keep the engine's
 * order).
 *
 * The compiled twin of the numpy packer in compile.py (``_pack`` and its helpers), which
 * stays the specification: a plan packed here equals compile_plan's byte for byte. The
 * buffer layout is planner/layout.py's (layout.h); Python allocates the buffer for each
 * plan and chooses its layout, this code only fills it. Every argument is checked (types,
 * contiguity, lengths, no memory shared with the output) and every count a write is
 * bounded by is checked against the layout before that write, so a wrong call raises
 * TypeError or ValueError naming the argument instead of writing out of bounds.
 */
#include "pack.h"

#include <string.h>

#include "buffers.h"
#include "check.h"
#include "rows.h"

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
        if (b->slots == NULL) { /* a host step's placeholder slots */
            memset(f->slot + g * f->rows, 0, (size_t)live * sizeof(int32_t));
        } else {
            gather(f->slot + g * f->rows, b->slots + g * b->num_rows, order, live);
        }
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

const char PACK_DOC[] =
    "pack(packed, query_start, num_computed_tokens, num_accepted_tokens, slots, kinds,\n"
    "     num_tokens, num_rows, num_tiles, num_groups, query_len_max, tile)\n"
    "Fill ``packed`` (int32, laid out as PlanLayout(num_tokens, num_rows, num_tiles,\n"
    "num_groups)) with one step's plan. Returns its counts in ExecutionPlan's field order\n"
    "(spec, decode, prefill rows, their tokens, longest prefill, tiles), or None when a\n"
    "spec row breaks the config's limits (q > Q or accepted outside 1..Q); the buffer is\n"
    "then left unspecified.";

/* pack's six counts (num_tokens, num_rows, num_tiles, num_groups, query_len_max, tile)
 * from ``args``, each checked, and the layout they give checked to fit Py_ssize_t; 0, or
 * -1 with an exception set. */
static int take_counts(PyObject *const *args, Py_ssize_t counts[6]) {
    static const char *const names[] = {"num_tokens", "num_rows",      "num_tiles",
                                        "num_groups", "query_len_max", "tile"};
    for (int i = 0; i < 6; i++) {
        if ((counts[i] = get_count(args[i], names[i])) < 0) {
            return -1;
        }
    }
    Py_ssize_t tokens = counts[0], rows = counts[1], tiles = counts[2], groups = counts[3];
    if (groups < 1 || groups > (1 << 20) || counts[5] < 1 ||
        rows > (PY_SSIZE_T_MAX / 16) / (groups + 8) || tokens > PY_SSIZE_T_MAX / 16 ||
        tiles > PY_SSIZE_T_MAX / 16) {
        PyErr_SetString(PyExc_ValueError,
                        "num_groups, tile: must be positive, and the layout's sizes in range");
        return -1;
    }
    return 0;
}

/* A packed plan's counts as Python gets them, in ExecutionPlan's (and PlanShape's) field
 * order: rows per kind, tokens per kind, the longest prefill, the tiles. */
static PyObject *plan_counts(const Census *c) {
    const long long values[8] = {
        (long long)c->rows[SPEC],   (long long)c->rows[DECODE],   (long long)c->rows[PREFILL],
        (long long)c->tokens[SPEC], (long long)c->tokens[DECODE], (long long)c->tokens[PREFILL],
        (long long)c->longest_prefill, (long long)c->tiles};
    PyObject *counts = PyTuple_New(8);
    for (int i = 0; counts != NULL && i < 8; i++) {
        PyObject *value = PyLong_FromLongLong(values[i]);
        if (value == NULL) {
            Py_CLEAR(counts);
        } else {
            PyTuple_SET_ITEM(counts, i, value);
        }
    }
    return counts;
}

PyObject *pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Py_ssize_t counts[6];
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "pack takes 12 arguments, got %zd", nargs);
        return NULL;
    }
    if (take_counts(args + 6, counts) < 0) {
        return NULL;
    }
    Py_ssize_t tokens = counts[0], rows = counts[1], tiles = counts[2], groups = counts[3];
    Py_ssize_t query_len_max = counts[4], tile = counts[5];
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
    Py_ssize_t size = plan_size(tokens, rows, tiles, groups);
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
            result = plan_counts(&census);
        }
    }
    PyBuffer_Release(&out);
    release_batch(&batch);
    return result;
}

/* --- host steps: a step known on the host by its query starts and drafts alone ---------
 * The computed tokens, accepted counts and slots are placeholders (0, 1, NULL), as the
 * vLLM builder's plans hold them until the device fills in the real ones. */

/* A host step's batch, derived into scratch memory it owns: rebased query starts, kinds
 * by check.c's rule, placeholder arrays. */
typedef struct {
    Batch batch;
    const int32_t *lens; /* the query lengths, engine order */
    Py_ssize_t counts[4];
    void *scratch, *zeros;
} HostStep;

static void release_host_step(HostStep *step) {
    PyMem_Free(step->scratch);
    PyMem_Free(step->zeros);
    step->scratch = step->zeros = NULL;
}

/* Derives ``step`` from query_start ``[>= rows + 1]`` and drafts ``[>= rows]`` (NULL: no
 * spec row); 1 when a StepBatch rule breaks (then Python raises its error), 0 when it
 * holds, -1 with MemoryError. */
static int take_host_step(HostStep *step, const int32_t *query_start, const int32_t *drafts,
                          Py_ssize_t rows) {
    size_t n = (size_t)rows;
    step->scratch = PyMem_Malloc((4 * n + 1) * sizeof(int32_t) + n + 1);
    step->zeros = PyMem_Calloc(n + 1, sizeof(int32_t));
    if (step->scratch == NULL || step->zeros == NULL) {
        release_host_step(step);
        PyErr_NoMemory();
        return -1;
    }
    int32_t *lens = step->scratch, *starts = lens + n, *ones = starts + n + 1;
    int32_t *no_drafts = ones + n;
    int8_t *kinds = (int8_t *)(no_drafts + n);
    for (size_t r = 0; r < n; r++) {
        lens[r] = (int32_t)((uint32_t)query_start[r + 1] - (uint32_t)query_start[r]);
        ones[r] = 1, no_drafts[r] = -1;
    }
    const int32_t *zeros = step->zeros;
    int broken = rows_broken(lens, zeros, drafts ? drafts : no_drafts, rows, kinds, starts,
                             step->counts);
    step->lens = lens;
    step->batch = (Batch){.held = 0, .num_rows = rows, .query_start = starts,
                          .computed = zeros, .accepted = ones, .slots = NULL, .kinds = kinds};
    return broken;
}

/* get_array of an int32 host array, or of an (address, items) tuple's memory. */
static int get_host_array(PyObject *given, Py_buffer *view, const char *name) {
    PyObject *obj = address_or_object(given);
    if (obj == NULL) {
        return -1;
    }
    int found = get_array(obj, view, name, 'i', 4, 0);
    Py_DECREF(obj); /* a view holds its own reference */
    return found;
}

/* The host arrays of pack_host's arguments: query_start and drafts (None: NULL) views. */
static int take_host_arrays(PyObject *const *args, Py_buffer views[2], Py_ssize_t rows,
                            int *held) {
    *held = 0;
    if (get_host_array(args[0], &views[0], "query_start") < 0) {
        return -1;
    }
    *held = 1;
    if (views[0].len / 4 < rows + 1) {
        PyErr_Format(PyExc_ValueError, "query_start: %zd entries, num_reqs + 1 = %zd needed",
                     views[0].len / 4, rows + 1);
        return -1;
    }
    if (args[1] == Py_None) {
        return 0;
    }
    if (get_host_array(args[1], &views[1], "num_draft_tokens") < 0) {
        return -1;
    }
    *held = 2;
    if (views[1].len / 4 < rows) {
        PyErr_Format(PyExc_ValueError, "num_draft_tokens: %zd entries, num_reqs = %zd needed",
                     views[1].len / 4, rows);
        return -1;
    }
    return 0;
}

/* What the host entry points hold while they work: the arrays' views, the derived step
 * and its census. */
typedef struct {
    Py_buffer views[2];
    int held;
    HostStep step;
    Census census;
    int64_t num_tokens;
    Py_ssize_t live;
} HostCensus;

static void release_host_census(HostCensus *h) {
    while (h->held > 0) {
        PyBuffer_Release(&h->views[--h->held]);
    }
    release_host_step(&h->step);
}

/* Takes ``arrays`` (query_start, num_draft_tokens) of ``rows`` rows and the census of the
 * step they give; 0, 1 when a StepBatch rule or the config's limits break (no exception),
 * -1 with an exception set. Release ``h`` in every case. */
static int take_host_census(HostCensus *h, PyObject *const *arrays, Py_ssize_t rows,
                            Py_ssize_t query_len_max) {
    h->held = 0;
    h->step = (HostStep){.scratch = NULL, .zeros = NULL};
    if (take_host_arrays(arrays, h->views, rows, &h->held) < 0) {
        return -1;
    }
    const int32_t *drafts = h->held == 2 ? h->views[1].buf : NULL;
    int broken = take_host_step(&h->step, h->views[0].buf, drafts, rows);
    if (broken < 0) {
        return -1;
    }
    Census *c = &h->census;
    if (broken || take_census(&h->step.batch, query_len_max, c) < 0 || c->breaks_limits) {
        PyErr_Clear();
        return 1;
    }
    h->num_tokens = c->tokens[SPEC] + c->tokens[DECODE] + c->tokens[PREFILL];
    h->live = c->rows[SPEC] + c->rows[DECODE] + c->rows[PREFILL];
    return 0;
}

/* The census as Python gets it: (spec, decode, prefill rows, tokens, prefill tiles). */
static PyObject *census_tuple(const HostCensus *h, Py_ssize_t rows, Py_ssize_t tile) {
    int64_t tiles = count_prefill_tiles(h->step.lens, h->step.batch.kinds, rows, tile);
    return Py_BuildValue("(nnnLL)", h->step.counts[SPEC], h->step.counts[DECODE],
                         h->step.counts[PREFILL], (long long)h->num_tokens, (long long)tiles);
}

/* plan.py's SUMMARY: rows per kind, spec and live tokens, the layout's row capacity, then
 * every field's offset (FIELDS order: layout.h's eleven) and the size, of the plan ``f``
 * placed at ``buffer``. */
enum {
    SUMMARY_COUNTS = 6,
    SUMMARY_FIELDS = 11,
    SUMMARY_WORDS = SUMMARY_COUNTS + SUMMARY_FIELDS + 1,
};

static void write_summary(int32_t *s, const int32_t *buffer, const Fields *f,
                          const HostCensus *h) {
    s[0] = (int32_t)h->step.counts[SPEC];
    s[1] = (int32_t)h->step.counts[DECODE];
    s[2] = (int32_t)h->step.counts[PREFILL];
    s[3] = (int32_t)h->census.tokens[SPEC];
    s[4] = (int32_t)h->num_tokens;
    s[5] = (int32_t)f->rows;
    const int32_t *const starts[SUMMARY_FIELDS] = {
        f->token_map,    f->query_start, f->token_start, f->kind,     f->state_offset,
        f->reads_state,  f->num_accepted, f->request,    f->slot,     f->tile_row,
        f->tile_start};
    for (int i = 0; i < SUMMARY_FIELDS; i++) {
        s[SUMMARY_COUNTS + i] = (int32_t)(starts[i] - buffer);
    }
    s[SUMMARY_WORDS - 1] = (int32_t)plan_size(f->tokens, f->rows, f->tiles, f->groups);
}

/* The optional ``summary`` argument: 0 with ``*held`` 0 for None, 0 with ``*held`` 1 and
 * ``view`` a writable int32 view of >= SUMMARY_WORDS entries sharing no byte with ``out``
 * or the step's arrays; -1 with an exception set (nothing held). */
static int take_summary(PyObject *arg, Py_buffer *view, int *held, const Py_buffer *out,
                        const HostCensus *h) {
    *held = 0;
    if (arg == Py_None) {
        return 0;
    }
    if (get_array(arg, view, "summary", 'i', 4, 1) < 0) {
        return -1;
    }
    const char *why = NULL;
    if (view->len / 4 < SUMMARY_WORDS) {
        why = "summary: too short";
    } else if (shares_memory(view, out) || shares_memory(view, &h->views[0]) ||
               (h->held == 2 && shares_memory(view, &h->views[1]))) {
        why = "summary: shares memory with the plan or the step's arrays";
    }
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        PyBuffer_Release(view);
        return -1;
    }
    *held = 1;
    return 0;
}

/* Packs ``h``'s step into the first entries of ``out`` (all of them when ``exact``) by the
 * layout ``f`` says, and its summary into ``summary`` unless NULL; its counts
 * (plan_counts), or NULL with ValueError. */
static PyObject *pack_census(HostCensus *h, Py_buffer *out, Fields *f, Py_ssize_t tile,
                             int exact, int32_t *summary) {
    Census *c = &h->census;
    Py_ssize_t size = plan_size(f->tokens, f->rows, f->tiles, f->groups);
    if (exact ? out->len != size * 4 : out->len < size * 4) {
        PyErr_Format(PyExc_ValueError, "packed: has %zd entries, the layout needs %zd",
                     out->len / 4, size);
    } else if (shares_memory(out, &h->views[0]) ||
               (h->held == 2 && shares_memory(out, &h->views[1]))) {
        PyErr_SetString(PyExc_ValueError, "packed: shares memory with the step's arrays");
    } else if (h->live > f->rows || h->num_tokens > f->tokens) {
        PyErr_Format(PyExc_ValueError, "packed: %zd rows, %lld tokens exceed the layout's %zd, %zd",
                     h->live, (long long)h->num_tokens, f->rows, f->tokens);
    } else if (order_rows(&h->step.batch, out->buf, c, tile, f) > f->tiles) {
        PyErr_Format(PyExc_ValueError, "packed: %lld tiles exceed the layout's %zd",
                     (long long)c->tiles, f->tiles);
    } else {
        write_plan(&h->step.batch, f, c, tile, c->in_order);
        if (summary != NULL) {
            write_summary(summary, out->buf, f, h);
        }
        return plan_counts(c);
    }
    return NULL;
}

const char PACK_HOST_DOC[] =
    "pack_host(packed, query_start, num_draft_tokens, num_reqs, num_tokens, num_rows,\n"
    "          num_tiles, num_groups, query_len_max, tile, summary)\n"
    "The step of ``num_reqs`` rows whose query lengths are the differences of\n"
    "``query_start`` (int32, >= num_reqs + 1 entries) and whose drafts are\n"
    "``num_draft_tokens`` (int32, >= num_reqs; None: no spec row; either may be an\n"
    "(address, items) tuple of int32 host memory), its computed tokens 0,\n"
    "accepted counts 1 and slots NULL, packed into ``packed`` (the layout's size) as\n"
    "pack() packs it, and its summary (plan.py's SUMMARY) into ``summary`` (int32, >= the\n"
    "summary's words; None: none); its counts returned: (spec, decode, prefill rows, their\n"
    "tokens, longest prefill, tiles), as PlanShape orders them.\n"
    "None when a StepBatch rule or the config's limits break (StepBatch and compile_plan\n"
    "name the error). pack_host_eager gives the census that sizes the layout.";

PyObject *pack_host(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "pack_host takes 11 arguments, got %zd", nargs);
        return NULL;
    }
    Py_ssize_t rows = get_count(args[3], "num_reqs"), counts[6];
    if (rows < 0 || take_counts(args + 4, counts) < 0) {
        return NULL;
    }
    HostCensus h;
    PyObject *result = NULL;
    int found = take_host_census(&h, args + 1, rows, counts[4]);
    Py_buffer out, summary;
    int with_summary = 0;
    if (found == 1) {
        result = Py_NewRef(Py_None);
    } else if (found == 0 && get_array(args[0], &out, "packed", 'i', 4, 1) == 0) {
        if (take_summary(args[10], &summary, &with_summary, &out, &h) == 0) {
            Fields f = {.tokens = counts[0], .rows = counts[1], .tiles = counts[2],
                        .groups = counts[3]};
            result = pack_census(&h, &out, &f, counts[5], 1,
                                 with_summary ? summary.buf : NULL);
            if (with_summary) {
                PyBuffer_Release(&summary);
            }
        }
        PyBuffer_Release(&out);
    }
    release_host_census(&h);
    return result;
}

const char PACK_HOST_EAGER_DOC[] =
    "pack_host_eager(packed, query_start, num_draft_tokens, num_reqs, num_groups,\n"
    "                query_len_max, tile, eager_kinds, max_rows, max_tokens, summary)\n"
    "pack_host's step in one pass where it runs eagerly: bit ``k`` of ``eager_kinds`` set\n"
    "when a step whose kinds present are ``k`` (1 spec, 2 decode, 4 prefill) does. Then\n"
    "the plan, in the layout of its own live tokens, rows and prefill tiles, fills the\n"
    "first entries of ``packed``, its summary ``summary`` as pack_host writes it, and its\n"
    "counts are returned as pack_host returns them (eight). Else its census, (spec,\n"
    "decode, prefill rows, tokens, prefill tiles): five, which size pack_host's layout.\n"
    "None when a StepBatch rule or the config's limits break, when it has more than\n"
    "``max_rows`` live rows or ``max_tokens`` tokens, or when ``packed`` is too short\n"
    "(nothing written).";

PyObject *pack_host_eager(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "pack_host_eager takes 11 arguments, got %zd", nargs);
        return NULL;
    }
    static const char *const names[] = {"num_reqs", "num_groups", "query_len_max", "tile",
                                        "eager_kinds", "max_rows", "max_tokens"};
    Py_ssize_t counts[7];
    for (int i = 0; i < 7; i++) {
        if ((counts[i] = get_count(args[i + 3], names[i])) < 0) {
            return NULL;
        }
    }
    Py_ssize_t rows = counts[0], groups = counts[1], tile = counts[3];
    if (groups < 1 || groups > (1 << 20) || tile < 1 || rows > (PY_SSIZE_T_MAX / 16) / (groups + 8)) {
        PyErr_SetString(PyExc_ValueError,
                        "num_groups, tile: must be positive, and the layout's sizes in range");
        return NULL;
    }
    HostCensus h;
    PyObject *result = NULL;
    int found = take_host_census(&h, args + 1, rows, counts[2]);
    const Py_ssize_t *live = h.census.rows;
    if (found == 1 || (found == 0 && (h.live > counts[5] || h.num_tokens > counts[6]))) {
        result = Py_NewRef(Py_None);
    } else if (found == 0 &&
               !(counts[4] >> ((live[SPEC] > 0) | (live[DECODE] > 0) << 1 |
                               (live[PREFILL] > 0) << 2) & 1)) {
        result = census_tuple(&h, rows, tile);
    } else if (found == 0) {
        int64_t tiles = count_prefill_tiles(h.step.lens, h.step.batch.kinds, rows, tile);
        Fields f = {.tokens = (Py_ssize_t)h.num_tokens, .rows = h.live,
                    .tiles = (Py_ssize_t)tiles, .groups = groups};
        Py_buffer out, summary;
        int with_summary = 0;
        if (get_array(args[0], &out, "packed", 'i', 4, 1) < 0) {
            goto done;
        }
        if (take_summary(args[10], &summary, &with_summary, &out, &h) < 0) {
            PyBuffer_Release(&out);
            goto done;
        }
        if (out.len / 4 < plan_size(f.tokens, f.rows, f.tiles, groups)) {
            result = Py_NewRef(Py_None); /* nothing written: the caller's check names it */
        } else {
            result = pack_census(&h, &out, &f, tile, 0, with_summary ? summary.buf : NULL);
        }
        if (with_summary) {
            PyBuffer_Release(&summary);
        }
        PyBuffer_Release(&out);
    }
done:
    release_host_census(&h);
    return result;
}
