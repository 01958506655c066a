/* Stepper.finish: after the step is planned and timed, the acceptance draw (acceptance.py's
 * models, counter-based), the request log's spec counts, Scheduler._commit, RequestLog.record
 * and the step's record -- sim/stepper.py's Stepper._finish_python, its specification. */
#include <math.h>

#include "pool.h"

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define MIX1 0xBF58476D1CE4E5B9ULL
#define MIX2 0x94D049BB133111EBULL
#define STEP_KEY 0xD6E8FEB86659FD93ULL
#define POS_KEY 0xA0761D6478BD642FULL

/* acceptance.uniforms(seed, [request], [spec_steps], 1)[0, 0] */
static double uniform(const Stepper *self, int64_t request, int64_t steps) {
    uint64_t x = ((uint64_t)request * GOLDEN) ^ ((uint64_t)steps * STEP_KEY);
    x ^= POS_KEY + self->key;
    x = (x ^ (x >> 30)) * MIX1;
    x = (x ^ (x >> 27)) * MIX2;
    x ^= x >> 31;
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

/* One spec row's accepted drafts: the draw of PerPosition, FixedLength or Replay, with
 * ``width`` the step's most drafts (PerPosition's survival is cut to it). */
int64_t accepted_drafts(const Stepper *self, int64_t request, int64_t drafts, int64_t width) {
    int64_t steps = self->spec_steps[request], got = 0;
    if (self->accept_kind == ACCEPT_PER_POSITION) {
        if (width == 0) {
            return 0;
        }
        double u = uniform(self, request, steps);
        for (int64_t j = 0; j < width; j++) {
            got += u < self->survival[j];
        }
    } else if (self->accept_kind == ACCEPT_FIXED) {
        got = self->whole + (uniform(self, request, steps) < self->fraction);
    } else {
        int64_t sequence = request % self->num_sequences;
        int64_t start = self->offsets[sequence], length = self->offsets[sequence + 1] - start;
        got = self->values[start + steps % length];
    }
    return got < drafts ? got : drafts;
}

/* The drafts accepted on every row into ``drawn``, and the log's spec counts. */
static void draw(Stepper *self, Py_ssize_t rows) {
    int64_t width = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        if ((self->flags[r] & SPEC) && self->drafts[r] > width) {
            width = self->drafts[r];
        }
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        self->drawn[r] = (self->flags[r] & SPEC)
                             ? accepted_drafts(self, self->ids[r], self->drafts[r], width)
                             : 0;
    }
}

/* Scheduler._finish for the rows that finished (``finished`` flags; ``count`` of them). */
static int release(Stepper *self, Py_ssize_t rows, const uint8_t *finished, int64_t count) {
    int64_t *counters = self->counters;
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (finished[r]) {
            int64_t request = self->ids[r];
            self->free_slots[counters[NUM_FREE]++] = self->slot[request];
            self->slot[request] = 0;
        }
    }
    for (Py_ssize_t r = 0; r < rows && self->has_pool; r++) {
        if (finished[r] && release_one(self, self->ids[r]) < 0) {
            return -1;
        }
    }
    counters[FINISHED] += count;
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < counters[RUNNING]; i++) {
        if (self->slot[self->running[i]] != 0) {
            self->running[kept++] = self->running[i];
        }
    }
    counters[RUNNING] = kept;
    return 0;
}

/* Scheduler._commit (the pool's register and release included) and RequestLog.record
 * (and record_spec, unless ``given``). */
static int commit(Stepper *self, Py_ssize_t rows, double end, int given, uint8_t *finished) {
    int64_t count = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t request = self->ids[r], a = self->drawn[r];
        uint8_t flags = self->flags[r];
        if ((flags & SPEC) && !given) {
            self->drafted[request] += self->drafts[r];
            self->accepted[request] += a;
        }
        int64_t reach = self->computed[request] + ((flags & SPEC) ? 1 + a : self->q[r]);
        /* a prefill row padded with placeholder drafts computes its last prompt token only */
        if (!(flags & DECODING) && reach > self->target[request]) {
            reach = self->target[request];
        }
        self->computed[request] = reach;
        int64_t emitted = (flags & DECODING) ? 1 + a : (flags & EMITS_FIRST) != 0;
        self->emitted[request] += emitted;
        /* BlockPool.cache_committed: with speculation, the emitting rows' blocks */
        if (self->has_pool && self->caching && self->num_spec && emitted > 0 &&
            cache_entries(self, request, reach) < 0) {
            return -1;
        }
        if (flags & SPEC) {
            self->last_accepted[request] = (int32_t)(1 + a);
            self->spec_steps[request] += 1;
        }
        finished[r] = self->emitted[request] >= self->output[request];
        count += finished[r];
        self->num_steps[request] += 1;
        if (emitted > 0) {
            double last = self->last_emit[request];
            if (isnan(last)) {
                self->first_token[request] = end;
            } else {
                self->gaps[self->gaps_size[0]++] = end - last;
            }
            self->last_emit[request] = end;
        }
        if (finished[r]) {
            self->finish_s[request] = end;
        }
    }
    return count ? release(self, rows, finished, count) : 0;
}

PyObject *stepper_finish(Stepper *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != RECORD_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "finish(end_s, record: 20-tuple, given: bool)");
        return NULL;
    }
    double end = PyFloat_AsDouble(args[0]);
    int given = PyObject_IsTrue(args[2]);
    if ((end == -1.0 && PyErr_Occurred()) || given < 0) {
        return NULL;
    }
    Py_ssize_t rows = self->counters[ROWS];
    if (self->table_size[0] >= self->table_cap || self->gaps_size[0] + rows > self->gaps_cap) {
        return PyLong_FromLong(FINISH_GROW);
    }
    double *row = self->table + self->table_size[0] * (RECORD_FIELDS + MEMORY_FIELDS);
    for (Py_ssize_t j = 0; j < RECORD_FIELDS; j++) {
        row[j] = PyFloat_AsDouble(PyTuple_GET_ITEM(args[1], j));
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!given && self->accept_kind == ACCEPT_PYTHON) {
        return PyLong_FromLong(FINISH_PYTHON);
    }
    if (!given) {
        draw(self, rows);
    }
    uint8_t finished_stack[256];
    uint8_t *finished = rows <= 256 ? finished_stack : PyMem_Malloc((size_t)rows);
    if (finished == NULL) {
        return PyErr_NoMemory();
    }
    int failed = commit(self, rows, end, given, finished) < 0;
    if (finished != finished_stack) {
        PyMem_Free(finished);
    }
    if (failed) {
        return NULL;
    }
    for (int j = 0; j < MEMORY_FIELDS; j++) {
        row[RECORD_FIELDS + j] = self->info[WAITING + j];
    }
    self->table_size[0] += 1;
    return PyLong_FromLong(FINISH_DONE);
}
