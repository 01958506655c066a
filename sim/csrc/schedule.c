/* Stepper.schedule: Scheduler._schedule_rows (sim/scheduler/core.py, its specification)
 * on the scheduler's arrays: the running requests' rows (growing their blocks, evicting
 * cached entries or preempting when the pool is short), then admissions in the policy's
 * order (one request at a time when preempted requests wait, the prefix cache is looked
 * up or the policy is not arrival order: queue.c), then the rows' inputs, their load and
 * the memory row. */
#include <string.h>

#include "pool.h"

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

/* The tokens a running request asks for: the rest of its prompt, or one token and its
 * drafts (fewer near the end of its output). */
static int64_t wants(const Stepper *self, int64_t request) {
    int64_t computed = self->computed[request], target = self->target[request];
    if (computed < target) {
        return target - computed;
    }
    int64_t lookahead = self->output[request] - self->emitted[request] - 1;
    return 1 + (self->num_spec < lookahead ? self->num_spec : lookahead);
}

static void put_row(Stepper *self, Py_ssize_t row, int64_t request, int64_t q, uint8_t flags) {
    self->ids[row] = request;
    self->q[row] = (int32_t)q;
    self->comp[row] = (int32_t)self->computed[request];
    self->flags[row] = flags;
}

/* A running request's ``q`` of ``left`` tokens of budget: in align mode a prefill chunk
 * is aligned (0: none fits, the request is skipped). */
static int64_t chunk_of(const Stepper *self, int64_t request, int64_t left) {
    int64_t want = wants(self, request), q = want < left ? want : left;
    int64_t computed = self->computed[request], target = self->target[request];
    if (self->align && computed < target && q > 0) {
        q = aligned_chunk(computed, q, target, self->align, self->junction[request]);
    }
    return q;
}

/* Scheduler._running_rows before the pool: the rows within the budget; *used their tokens. */
static Py_ssize_t running_rows(Stepper *self, int64_t *used) {
    int64_t left = self->max_batched, total = 0;
    Py_ssize_t rows = 0, count = self->counters[RUNNING];
    for (Py_ssize_t i = 0; i < count && left > 0; i++) {
        int64_t request = self->running[i], q = chunk_of(self, request, left);
        if (q == 0) {
            continue;
        }
        int decoding = self->computed[request] >= self->target[request];
        put_row(self, rows++, request, q, decoding ? DECODING : 0);
        left -= q, total += q;
    }
    *used = total;
    return rows;
}

/* BlockPool.grow_all's blocks for the rows beyond those held. */
static int64_t growth(const Stepper *self, Py_ssize_t rows) {
    int64_t total = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t request = self->ids[r];
        int64_t delta = blocks_for(self, (int64_t)self->comp[r] + self->q[r]) -
                        self->held[request];
        total += delta > 0 ? delta : 0;
    }
    return total;
}

/* Scheduler._preempt: by recompute, to the front of the waiting queue. */
static int preempt(Stepper *self, int64_t request) {
    if (release_one(self, request) < 0) {
        return -1;
    }
    int64_t *counters = self->counters;
    self->free_slots[counters[NUM_FREE]++] = self->slot[request];
    self->slot[request] = 0;
    self->lost[request] = self->computed[request];
    self->computed[request] = 0;
    self->target[request] = self->prompt[request] + self->emitted[request];
    self->last_accepted[request] = 1;
    self->preemptions[request] += 1;
    counters[PREEMPTED] += 1;
    memmove(self->resumed + 1, self->resumed, (size_t)counters[RESUMED] * sizeof(int64_t));
    self->resumed[0] = request;
    counters[RESUMED] += 1;
    return 0;
}

/* Scheduler._running_rows_preempting: one request at a time, each that cannot grow
 * preempting the most recently admitted, until it fits or preempted itself. */
static Py_ssize_t running_rows_preempting(Stepper *self, int64_t *used) {
    Py_ssize_t rows = 0, running = self->counters[RUNNING];
    int64_t left = self->max_batched, total = 0;
    for (Py_ssize_t index = 0; index < running && left > 0; index++) {
        int64_t request = self->running[index], q = chunk_of(self, request, left);
        int64_t computed = self->computed[request];
        if (q == 0) {
            continue;
        }
        int decoding = computed >= self->target[request], grown = 0, gone = 0;
        while (!gone && (grown = grow_request(self, request, computed + q, computed)) == 0) {
            int64_t victim = self->running[--running];
            if (preempt(self, victim) < 0) {
                return -1;
            }
            gone = victim == request;
        }
        if (gone || grown < 0) {
            if (grown < 0) {
                return -1;
            }
            break;
        }
        put_row(self, rows++, request, q, decoding ? DECODING : 0);
        left -= q, total += q;
    }
    self->counters[RUNNING] = running;
    *used = total;
    return rows;
}

/* The running requests' rows with their blocks: _running_rows and the pool's growth. */
static Py_ssize_t running_with_blocks(Stepper *self, int64_t *used) {
    if (self->has_pool && self->tracks_states) { /* StateBlockPool grows one at a time */
        return running_rows_preempting(self, used);
    }
    Py_ssize_t rows = running_rows(self, used);
    if (!self->has_pool) {
        return rows;
    }
    int64_t total = growth(self, rows);
    if (total > self->free_blocks[0] + cached_blocks(self)) {
        return running_rows_preempting(self, used);
    }
    /* every row grows: from free blocks (grow_all), or where those do not cover them
     * all, evicting as each grows in turn (the preempting path when it preempts nobody:
     * each growth takes its blocks out of free + evictable, which covers them all) */
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (grow_one(self, self->ids[r], (int64_t)self->comp[r] + self->q[r]) < 0) {
            return -1;
        }
    }
    return rows;
}

/* Scheduler._start: slots from the top of the stack, the requests to the running set. */
static void start(Stepper *self, Py_ssize_t first_row, Py_ssize_t count) {
    int64_t free_slots = self->counters[NUM_FREE] - count;
    for (Py_ssize_t j = 0; j < count; j++) {
        int64_t request = self->ids[first_row + j];
        self->slot[request] = self->free_slots[free_slots + count - 1 - j];
        self->running[self->counters[RUNNING] + j] = request;
    }
    self->counters[NUM_FREE] = free_slots;
    self->counters[RUNNING] += count;
}

/* Scheduler._admit's batch path (nobody preempted waits, no prefix cache); ``pad``
 * placeholder drafts for a 1-token prompt while running rows run. */
static Py_ssize_t admit_batch(Stepper *self, Py_ssize_t rows, int64_t room, int64_t budget,
                              int64_t pad) {
    int64_t first = self->counters[NEXT_ADMIT], arrived = self->counters[ARRIVED];
    room = arrived - first < room ? arrived - first : room;
    Py_ssize_t count = 0;
    int64_t begin = 0, blocks = 0;
    for (; count < room && begin < budget; count++) {
        int64_t request = first + count, prompt = self->prompt[request], want = prompt;
        if (prompt == 1 && pad && rows) {
            want += pad;
            if (want > budget - begin) {
                break;
            }
        }
        int64_t chunk = want < budget - begin ? want : budget - begin;
        if (self->has_pool) { /* BlockPool.admit_all: the leading run whose prompts fit */
            int64_t need = blocks_for(self, chunk);
            int64_t whole = blocks_for(self, prompt > chunk ? prompt : chunk);
            if (blocks + whole > self->free_blocks[0]) {
                break;
            }
            blocks += need;
            self->held[request] = need;
        }
        put_row(self, rows + count, request, chunk, 0);
        begin += want;
    }
    if (self->has_pool) {
        self->free_blocks[0] -= blocks;
    }
    self->counters[NEXT_ADMIT] = first + count;
    self->counters[ADMITTED] += count;
    start(self, rows, count);
    return count;
}

/* Scheduler._admit_each: preempted requests first, then new ones in the policy's order,
 * each after its prefix cache hit, until one does not fit. */
static Py_ssize_t admit_each(Stepper *self, Py_ssize_t rows, int64_t room, int64_t budget,
                             double now, int64_t pad) {
    int64_t *counters = self->counters;
    Py_ssize_t count = 0;
    while (room > 0 && budget > 0) {
        int64_t resumed = counters[RESUMED], request;
        if (resumed) {
            request = self->resumed[0];
        } else if (self->ordered) {
            request = queue_first(self, now, counters[ARRIVED]);
            if (request < 0) {
                break;
            }
        } else if (counters[NEXT_ADMIT] < counters[ARRIVED]) {
            request = counters[NEXT_ADMIT];
        } else {
            break;
        }
        int64_t target = self->target[request];
        Py_ssize_t hits = lookup(self, request, target);
        if (hits < 0) {
            return -1;
        }
        int64_t hit = hits * self->entry_tokens;
        int64_t begin = hit > self->preloaded[request] ? hit : self->preloaded[request];
        int64_t q = target - begin;
        if (q == 1 && pad && (rows || begin)) {
            if (1 + pad > budget) {
                break;
            }
            q += pad;
        }
        q = q < budget ? q : budget;
        if (self->align) {
            int padded = pad && q == 1 + pad && q > target - begin;
            q = aligned_chunk(begin, q, target, self->align, self->junction[request]);
            if (q == 0) {
                break;
            }
            q = padded && q != 1 + pad ? 1 : q; /* vLLM drops the placeholders it would cut */
        }
        int admitted = self->has_pool ? admit_one(self, request, hits, begin + q, target) : 1;
        if (admitted <= 0) {
            if (admitted < 0) {
                return -1;
            }
            break;
        }
        if (self->has_pool && self->caching && register_blocks(self, request, begin + q) < 0) {
            return -1;
        }
        if (resumed) {
            memmove(self->resumed, self->resumed + 1, (size_t)(resumed - 1) * sizeof(int64_t));
            counters[RESUMED] = resumed - 1;
        } else if (self->ordered) {
            queue_take(self, request);
        } else {
            counters[NEXT_ADMIT] += 1;
            counters[ADMITTED] += 1;
        }
        int64_t lost = self->lost[request];
        self->recomputed[request] += lost > begin ? lost - begin : 0;
        self->cached[request] += hit > lost ? hit - lost : 0;
        self->computed[request] = begin;
        self->preloaded[request] = 0; /* preempted, it computes its state here */
        put_row(self, rows + count++, request, q, 0);
        room -= 1, budget -= q;
    }
    start(self, rows, count);
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
        if (!(flags & DECODING) && computed + q >= self->target[request]) { /* > padded */
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
    int64_t *counters = self->counters;
    info[KV_TOKENS] = (double)kv, info[ATTENTION_PAIRS] = pairs;
    info[WAITING] = (double)(counters[ARRIVED] - counters[ADMITTED] + counters[RESUMED]);
    info[NUM_PREEMPTED] = info[USED] = info[CACHED] = info[USAGE] = 0.0;
    if (self->has_pool) {
        int64_t cached = cached_blocks(self);
        int64_t used = self->capacity - self->free_blocks[0] - cached;
        info[NUM_PREEMPTED] = (double)counters[PREEMPTED];
        info[USED] = (double)used, info[CACHED] = (double)cached;
        info[USAGE] = (double)used / (double)self->capacity;
    }
    counters[ROWS] = rows;
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
    if (self->align && PySet_Clear(self->states_this_step) < 0) { /* BlockPool.new_step */
        return NULL;
    }
    int64_t used;
    Py_ssize_t rows = running_with_blocks(self, &used);
    if (rows < 0) {
        return NULL;
    }
    /* BlockPool.register at allocation: rows in order, before any admission looks up */
    if (self->has_pool && self->caching && register_rows(self, rows) < 0) {
        return NULL;
    }
    int64_t room = self->max_seqs - counters[RUNNING], budget = self->max_batched - used;
    room = counters[NUM_FREE] < room ? counters[NUM_FREE] : room;
    if (!counters[PREEMPTED] && room > 0 && budget > 0) { /* a step that preempted admits none */
        int64_t pad = self->num_spec; /* placeholder drafts, unless a running row prefills */
        for (Py_ssize_t r = 0; r < rows && pad; r++) {
            pad = (self->flags[r] & DECODING) ? pad : 0;
        }
        Py_ssize_t admitted;
        if (counters[RESUMED] || self->ordered || (self->has_pool && self->caching) ||
            self->takes_preloaded) {
            admitted = admit_each(self, rows, room, budget, now, pad);
        } else {
            admitted = counters[NEXT_ADMIT] < counters[ARRIVED]
                           ? admit_batch(self, rows, room, budget, pad)
                           : 0;
        }
        if (admitted < 0) {
            return NULL;
        }
        rows += admitted;
    }
    if (rows == 0) {
        counters[ROWS] = 0;
        Py_RETURN_NONE;
    }
    return finish_rows(self, rows);
}
