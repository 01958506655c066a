/* check_batch: StepBatch's copies, checks and derived fields in one pass (the compiled
 * twin of batch.py's numpy checks, which are the specification and name every error: this
 * only says whether there is one). */
#include "check.h"

#include <string.h>

#include "buffers.h"
#include "layout.h"
#include "rows.h"

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

/* See check.h. */
int rows_broken(const int32_t *restrict q, const int32_t *restrict computed,
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
        views[DATA].len != batch_size(rows, groups) * 4 || views[KINDS].len != rows) {
        int bad = views[KINDS].len != rows ? KINDS : DATA;
        PyErr_Format(PyExc_ValueError, "%s: has %zd entries, expected %zd", CHECK_NAMES[bad],
                     views[bad].len / views[bad].itemsize,
                     bad == KINDS ? rows : batch_size(rows, groups));
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

/* The checks on the copied arrays: 1 when they hold (the rows per kind in ``counts``), 0
 * when one fails, -1 with MemoryError. A flag whose truth raises, or rows past the hash's
 * 32 bits: 0, numpy decides. */
static int data_holds(int32_t *data, int8_t *kinds, Py_ssize_t rows, Py_ssize_t groups,
                      PyObject *allow_null_slots, Py_ssize_t counts[4]) {
    int allow_null = PyObject_IsTrue(allow_null_slots);
    if (allow_null < 0 || rows > MAX_SET_ROWS) {
        PyErr_Clear();
        return 0;
    }
    const int32_t *slots = data + 4 * rows;
    if (rows_broken(data, data + rows, data + 2 * rows, rows, kinds, data + (4 + groups) * rows,
                    counts)) {
        return 0;
    }
    uint32_t stack_entries[2 * STACK_SET_ROWS];
    SlotSet set = {.entries = stack_entries, .mask = 15, .shift = 28};
    while ((Py_ssize_t)set.mask + 1 < 2 * rows) {
        set.mask = set.mask * 2 + 1, set.shift--;
    }
    if (rows > STACK_SET_ROWS &&
        !(set.entries = PyMem_Malloc(((size_t)set.mask + 1) * sizeof(uint32_t)))) {
        PyErr_NoMemory();
        return -1;
    }
    int broken = slots_broken(slots, kinds, rows, groups, allow_null, &set);
    if (set.entries != stack_entries) {
        PyMem_Free(set.entries);
    }
    return !broken;
}

/* data_holds as check_batch answers: the rows per kind, None, or NULL (no memory). */
static PyObject *check_data(int32_t *data, int8_t *kinds, Py_ssize_t rows, Py_ssize_t groups,
                            PyObject *allow_null_slots) {
    Py_ssize_t counts[4];
    int holds = data_holds(data, kinds, rows, groups, allow_null_slots, counts);
    if (holds < 0) {
        return NULL;
    }
    if (!holds) {
        return Py_NewRef(Py_None);
    }
    return Py_BuildValue("(nnnn)", counts[0], counts[1], counts[2], counts[3]);
}

const char CHECK_DOC[] =
    "check_batch(query_lens, num_computed_tokens, num_draft_tokens, num_accepted_tokens,\n"
    "            slots, allow_null_slots, data, kinds)\n"
    "StepBatch's copies, checks (SPEC 3.6) and derived fields in one pass. Inputs: int32\n"
    "arrays at any strides, [R] each, slots [G, R]. Fills ``data`` (int32, (5 + G) R + 1:\n"
    "the inputs in that order, contiguous, then query_start [R + 1]) and ``kinds`` ([R]\n"
    "int8); returns the rows per kind (spec, decode, prefill, padding), or None when any\n"
    "check fails (the outputs are then unspecified; batch.py's numpy checks name the\n"
    "error).";

PyObject *check_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

/* The scratch copy of a batch of up to SCRATCH_ROWS rows of up to SCRATCH_GROUPS layer
 * groups sits on the stack (its int32 data, then its kinds): most steps are that small,
 * and a heap allocation every step costs more than counting them. */
#define SCRATCH_ROWS 256
#define SCRATCH_GROUPS 4
#define SCRATCH_INT32S ((5 + SCRATCH_GROUPS) * SCRATCH_ROWS + 1 + (SCRATCH_ROWS + 4) / 4)

/* shape_counts' answer for the inputs ``views`` (rows and groups agreed): copied into
 * scratch memory, checked as check_batch checks them, counted as pack counts them. */
static PyObject *counts_of_copies(const Py_buffer views[NUM_VIEWS], Py_ssize_t rows,
                                  Py_ssize_t groups, PyObject *allow_null_slots,
                                  Py_ssize_t query_len_max, Py_ssize_t tile) {
    Py_ssize_t size = batch_size(rows, groups);
    size_t bytes = (size_t)size * sizeof(int32_t) + (size_t)rows + 1;
    int32_t scratch[SCRATCH_INT32S];
    int32_t *data = bytes <= sizeof scratch ? scratch : PyMem_Malloc(bytes);
    if (data == NULL) {
        return PyErr_NoMemory();
    }
    int8_t *kinds = (int8_t *)(data + size);
    Py_ssize_t counts[4];
    copy_inputs(views, rows, groups, data);
    int holds = data_holds(data, kinds, rows, groups, allow_null_slots, counts);
    PyObject *result = NULL;
    Census census;
    /* as pack reads the copies: query_start after the slots, kinds by the check's rule */
    Batch batch = {.held = 0, .num_rows = rows, .query_start = data + (4 + groups) * rows,
                   .computed = data + rows, .accepted = data + 3 * rows,
                   .slots = data + 4 * rows, .kinds = kinds};
    if (holds < 0) {
        result = NULL;
    } else if (!holds || take_census(&batch, query_len_max, &census) < 0) {
        PyErr_Clear();
        result = Py_NewRef(Py_None);
    } else if (census.breaks_limits) {
        result = Py_NewRef(Py_None);
    } else {
        for (Py_ssize_t r = 0; r < rows; r++) { /* pack's count_tiles, in engine order */
            if (kinds[r] == PREFILL) {
                int32_t q = data[r];
                census.tiles += (q + tile - 1) / tile;
                census.longest_prefill = q > census.longest_prefill ? q : census.longest_prefill;
            }
        }
        int64_t tokens = census.tokens[SPEC] + census.tokens[DECODE] + census.tokens[PREFILL];
        result = Py_BuildValue(
            "((nnnn)(nnnLLLiL)L)", census.rows[SPEC], census.rows[DECODE], census.rows[PREFILL],
            census.rows[PADDING], census.rows[SPEC], census.rows[DECODE], census.rows[PREFILL],
            (long long)census.tokens[SPEC], (long long)census.tokens[DECODE],
            (long long)census.tokens[PREFILL], (int)census.longest_prefill,
            (long long)census.tiles, (long long)tokens);
    }
    if (data != scratch) {
        PyMem_Free(data);
    }
    return result;
}

const char SHAPE_COUNTS_DOC[] =
    "shape_counts(query_lens, num_computed_tokens, num_draft_tokens, num_accepted_tokens,\n"
    "             slots, allow_null_slots, query_len_max, tile, rows)\n"
    "What check_batch and then pack learn of a batch, without the packed bytes: the rows\n"
    "per kind (spec, decode, prefill, padding), the plan's counts in ExecutionPlan's field\n"
    "order (pack's answer) and the live tokens; None where check_batch or pack would\n"
    "answer None. Inputs as check_batch takes them, of which the first ``rows`` rows are\n"
    "the batch (None: all, and they must agree); the copies go to scratch memory.";

/* Whether the inputs lack ``*rows`` rows (``*rows`` < 0: all their rows, in which they
 * must agree, as rows_disagree says; it sets *rows then). */
static int rows_missing(const Py_buffer views[NUM_VIEWS], Py_ssize_t *rows,
                        Py_ssize_t *groups) {
    if (*rows < 0) {
        return rows_disagree(views, rows, groups);
    }
    if (views[LENS].ndim != 1 || views[SLOTS].ndim != 2) {
        return 1;
    }
    for (int i = LENS; i <= ACCEPTED; i++) {
        if (views[i].ndim != 1 || views[i].shape[0] < *rows) {
            return 1;
        }
    }
    *groups = views[SLOTS].shape[0];
    return views[SLOTS].shape[1] < *rows || *groups < 1;
}

/* shape_counts' answer for its arrays ``views`` and its last four arguments (``rest``:
 * allow_null_slots, query_len_max, tile, rows). */
static PyObject *counts_of_views(const Py_buffer views[NUM_VIEWS], PyObject *const *rest) {
    Py_ssize_t query_len_max = get_count(rest[1], "query_len_max");
    Py_ssize_t tile = query_len_max < 0 ? -1 : get_count(rest[2], "tile");
    Py_ssize_t rows = -1; /* None: all */
    if (tile < 0 || (rest[3] != Py_None && (rows = get_count(rest[3], "rows")) < 0)) {
        return NULL;
    }
    if (tile == 0) {
        PyErr_SetString(PyExc_ValueError, "tile: must be positive");
        return NULL;
    }
    Py_ssize_t groups;
    if (rows_missing(views, &rows, &groups) || groups > (PY_SSIZE_T_MAX / 8) / (rows + 1) - 8) {
        return Py_NewRef(Py_None);
    }
    return counts_of_copies(views, rows, groups, rest[0], query_len_max, tile);
}

PyObject *shape_counts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "shape_counts takes 9 arguments, got %zd", nargs);
        return NULL;
    }
    Py_buffer views[NUM_VIEWS];
    int held = 0;
    for (; held <= SLOTS; held++) {
        if (get_strided(args[held], &views[held], CHECK_NAMES[held]) < 0) {
            break;
        }
    }
    PyObject *result = held == SLOTS + 1 ? counts_of_views(views, args + SLOTS + 1) : NULL;
    while (held > 0) {
        PyBuffer_Release(&views[--held]);
    }
    return result;
}

/* BoundRows: shape_counts' five arrays, their buffers taken once (numpy's buffer export
 * costs more than counting a step's rows); a caller that counts the same arrays step
 * after step (a scheduler's rows, written in place) binds them once. */
typedef struct {
    PyObject_HEAD
    Py_buffer views[NUM_VIEWS];
    int held;
} BoundRows;

static void bound_rows_dealloc(BoundRows *self) {
    while (self->held > 0) {
        PyBuffer_Release(&self->views[--self->held]);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *bound_rows_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *arrays[SLOTS + 1];
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "BoundRows takes no keywords");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOO:BoundRows", &arrays[LENS], &arrays[COMPUTED],
                          &arrays[DRAFTS], &arrays[ACCEPTED], &arrays[SLOTS])) {
        return NULL;
    }
    BoundRows *self = (BoundRows *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    for (; self->held <= SLOTS; self->held++) {
        if (get_strided(arrays[self->held], &self->views[self->held],
                        CHECK_NAMES[self->held]) < 0) {
            Py_DECREF(self);
            return NULL;
        }
    }
    return (PyObject *)self;
}

static PyObject *bound_rows_counts(BoundRows *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "counts takes 4 arguments, got %zd", nargs);
        return NULL;
    }
    return counts_of_views(self->views, args);
}

static PyMethodDef bound_rows_methods[] = {
    {"counts", (PyCFunction)(void (*)(void))bound_rows_counts, METH_FASTCALL,
     "counts(allow_null_slots, query_len_max, tile, rows): shape_counts of the bound arrays."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject BoundRowsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepplan.planner._packer.BoundRows",
    .tp_basicsize = sizeof(BoundRows),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BoundRows(query_lens, num_computed_tokens, num_draft_tokens, "
              "num_accepted_tokens, slots): shape_counts' arrays, held.",
    .tp_new = bound_rows_new,
    .tp_dealloc = (destructor)bound_rows_dealloc,
    .tp_methods = bound_rows_methods,
};
