/* Stepper.schedule: Scheduler._schedule_rows (sim/scheduler/core.py) for the steps that
 * need neither a preemption nor a prefix-cache lookup; it answers -1, having changed
 * nothing the Python scheduler does not set again, for the others. */
#include "stepper.h"

/* BlockPool.need for one request: KV blocks, and the kept states of the hashed-block
 * boundaries passed. */
static int64_t blocks_for(const Stepper *self, int64_t request, int64_t positions) {
    int64_t blocks = (positions + self->block_size - 1) / self->block_size;
    if (self->kept) {
        int64_t boundaries = positions / self->prefix_tokens;
        int64_t hashed = self->hashed[request];
        blocks += (boundaries < hashed ? boundaries : hashed) * self->kept;
    }
    return blocks;
}

/* Requests arrived by ``now``: searchsorted(arrival, now, side="right"). */
static int64_t arrived_by(const Stepper *self, double now) {
    Py_ssize_t low = 0, high = self->n;
    while (low < high) {
        Py_ssize_t mid = low + (high - low) / 2;
        if (self->arrival[mid] <= now) {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    return low;
}

/* Scheduler._running_rows without its pool growth: rows 0.. of the step, their q,
 * computed and prefilling flag; the number of rows and, in *used, their tokens. */
static Py_ssize_t running_rows(Stepper *self, int64_t *used) {
    int64_t left = self->max_batched, total = 0;
    Py_ssize_t rows = 0, count = self->counters[RUNNING];
    for (Py_ssize_t i = 0; i < count && left > 0; i++) {
        int64_t request = self->running[i];
        int64_t computed = self->computed[request], target = self->target[request];
        int64_t want;
        int prefilling = computed < target;
        if (prefilling) {
            want = target - computed;
        } else {
            int64_t lookahead = self->output[request] - self->emitted[request] - 1;
            want = 1 + (self->num_spec < lookahead ? self->num_spec : lookahead);
        }
        int64_t q = want < left ? want : left;
        self->ids[rows] = request;
        self->q[rows] = (int32_t)q;
        self->comp[rows] = (int32_t)computed;
        self->flags[rows] = prefilling ? 0 : DECODING;
        rows++, left -= want, total += q;
    }
    *used = total;
    return rows;
}

/* BlockPool.grow_all over the running rows: the blocks they need beyond those held, or
 * -1 when the free blocks do not cover them (nothing changed either way). */
static int64_t growth(const Stepper *self, Py_ssize_t rows) {
    int64_t total = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t request = self->ids[r];
        int64_t delta = blocks_for(self, request, (int64_t)self->comp[r] + self->q[r]) -
                        self->held[request];
        total += delta > 0 ? delta : 0;
    }
    return total > self->free_blocks[0] ? -1 : total;
}

static void grow(Stepper *self, Py_ssize_t rows, int64_t total) {
    self->free_blocks[0] -= total;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t request = self->ids[r];
        int64_t need = blocks_for(self, request, (int64_t)self->comp[r] + self->q[r]);
        if (need > self->held[request]) {
            self->held[request] = need;
        }
    }
}

/* Scheduler._admit first come first served (no request preempted, no prefix cache):
 * rows ``rows..`` of the step; the number admitted. */
static Py_ssize_t admit(Stepper *self, Py_ssize_t rows, int64_t room, int64_t budget) {
    int64_t first = self->counters[NEXT_ADMIT], arrived = self->counters[ARRIVED];
    if (arrived - first < room) {
        room = arrived - first;
    }
    Py_ssize_t count = 0;
    int64_t start = 0, blocks = 0, free = self->has_pool ? self->free_blocks[0] : 0;
    for (; count < room && start < budget; count++) {
        int64_t request = first + count, prompt = self->prompt[request];
        int64_t chunk = prompt < budget - start ? prompt : budget - start;
        if (self->has_pool) {  /* BlockPool.admit_all: the leading run that fits */
            int64_t need = blocks_for(self, request, chunk);
            if (blocks + need > free) {
                break;
            }
            blocks += need;
            self->held[request] = need;
        }
        self->ids[rows + count] = request;
        self->q[rows + count] = (int32_t)chunk;
        self->comp[rows + count] = (int32_t)self->computed[request];
        self->flags[rows + count] = 0;
        start += prompt;
    }
    if (self->has_pool) {
        self->free_blocks[0] -= blocks;
    }
    /* Scheduler._start: slots from the top of the stack, requests to the running set */
    int64_t free_slots = self->counters[NUM_FREE] - count;
    for (Py_ssize_t j = 0; j < count; j++) {
        int64_t request = first + j;
        self->slot[request] = self->free_slots[free_slots + count - 1 - j];
        self->running[self->counters[RUNNING] + j] = request;
    }
    self->counters[NUM_FREE] = free_slots;
    self->counters[RUNNING] += count;
    self->counters[NEXT_ADMIT] = first + count;
    return count;
}

/* The rows' remaining inputs and flags, their load, and the memory row. */
static PyObject *finish_rows(Stepper *self, Py_ssize_t rows) {
    int64_t kv = 0, pairs_qc = 0, pairs_qq = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t request = self->ids[r], q = self->q[r], computed = self->comp[r];
        uint8_t flags = self->flags[r];
        if ((flags & DECODING) && self->num_spec) {
            flags |= SPEC;
        }
        if (!(flags & DECODING) && computed + q == self->target[request]) {
            flags |= EMITS_FIRST;
        }
        self->flags[r] = flags;
        self->slots[r] = self->slot[request];
        self->drafts[r] = (flags & SPEC) ? (int32_t)(q - 1) : -1;
        self->acc[r] = (flags & SPEC) ? self->last_accepted[request] : 1;
        kv += computed + q, pairs_qc += q * computed, pairs_qq += q * (q + 1);
    }
    double pairs = (double)pairs_qc + 0.5 * (double)pairs_qq;
    double *info = self->info;
    info[KV_TOKENS] = (double)kv, info[ATTENTION_PAIRS] = pairs;
    int64_t waiting = self->counters[ARRIVED] - self->counters[NEXT_ADMIT] +
                      self->counters[RESUMED];
    info[WAITING] = (double)waiting, info[NUM_PREEMPTED] = 0.0;
    info[USED] = info[CACHED] = info[USAGE] = 0.0;
    if (self->has_pool) {
        int64_t cached = (int64_t)PyDict_Size(self->lru) * self->entry_blocks;
        int64_t used = self->capacity - self->free_blocks[0] - cached;
        info[USED] = (double)used, info[CACHED] = (double)cached;
        info[USAGE] = (double)used / (double)self->capacity;
    }
    self->counters[ROWS] = rows;
    return Py_BuildValue("(nLd)", rows, (long long)kv, pairs);
}

PyObject *stepper_schedule(Stepper *self, PyObject *now_obj) {
    double now = PyFloat_AsDouble(now_obj);
    if (now == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    int64_t *counters = self->counters;
    counters[PREEMPTED] = 0;
    counters[ARRIVED] = arrived_by(self, now);
    int64_t used;
    Py_ssize_t rows = running_rows(self, &used);
    int64_t room = self->max_seqs - counters[RUNNING];
    room = counters[NUM_FREE] < room ? counters[NUM_FREE] : room;
    int64_t budget = self->max_batched - used;
    int admits = room > 0 && budget > 0;
    int waiting = counters[NEXT_ADMIT] < counters[ARRIVED];
    if (admits && (counters[RESUMED] || (self->has_pool && self->caching && waiting))) {
        return PyLong_FromLong(-1);  /* admission one request at a time: Python's */
    }
    if (self->has_pool) {
        int64_t total = growth(self, rows);
        if (total < 0) {
            return PyLong_FromLong(-1);  /* a preemption: Python's */
        }
        grow(self, rows, total);
    }
    if (admits && waiting) {
        rows += admit(self, rows, room, budget);
    }
    if (rows == 0) {
        counters[ROWS] = 0;
        Py_RETURN_NONE;
    }
    return finish_rows(self, rows);
}
