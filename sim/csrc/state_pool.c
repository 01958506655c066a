/* Conv states as blocks of the pool in vLLM's align mode (sim/state_blocks.py's
 * StateBlockPool, its specification): each running request's state blocks in ``states``
 * (request -> [[end, entry or None], ...], the running one last), entries keyed by tagged
 * tuples -- (tag_group, group, key) an attention group's block (the key itself where
 * there is one group), (tag_state, key) a kept conv state, (tag_copy, number, key) a
 * block cached again -- of several sizes, counted in lru_blocks. pool.c calls these where self->tracks_states; the copies are pool.c's. */
#include "pool.h"

/* StateBlockPool.entry_size. */
static int64_t entry_size(const Stepper *self, PyObject *entry) {
    entry = copied(self, entry);
    if (tagged(entry, self->tag_state)) {
        return self->state_size;
    }
    return tagged(entry, self->tag_group) ? 1 : self->entry_blocks;
}

/* StateBlockPool._group_of: an attention block's group, -1 for any other key. */
static long group_of(const Stepper *self, PyObject *entry) {
    entry = copied(self, entry);
    if (tagged(entry, self->tag_state)) {
        return -1;
    }
    return tagged(entry, self->tag_group) ? PyLong_AsLong(PyTuple_GET_ITEM(entry, 1)) : 0;
}

/* (tag_group, group, key), or with one attention group the key itself: new. */
PyObject *group_key(const Stepper *self, int64_t group, PyObject *key) {
    if (self->attention_groups == 1) { /* one group: the entry's own key */
        Py_INCREF(key);
        return key;
    }
    PyObject *number = PyLong_FromLongLong(group);
    PyObject *tuple = number == NULL ? NULL : PyTuple_Pack(3, self->tag_group, number, key);
    Py_XDECREF(number);
    return tuple;
}

/* (tag_state, key of the request's ``index``-th entry), new. */
static PyObject *state_key(const Stepper *self, int64_t request, int64_t index) {
    PyObject *key = block_hash(self, request, index);
    PyObject *tuple = key == NULL ? NULL : PyTuple_Pack(2, self->tag_state, key);
    Py_XDECREF(key);
    return tuple;
}

/* entries[entry] += delta: the count after, -1 failed. */
static long add_references(Stepper *self, PyObject *entry, long delta) {
    PyObject *value = PyDict_GetItemWithError(self->entries, entry);
    if (value == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_AssertionError, "stepper: a reference to an entry not cached");
        }
        return -1;
    }
    long count = PyLong_AsLong(value) + delta;
    PyObject *now = count < 0 ? NULL : PyLong_FromLong(count);
    if (now == NULL || PyDict_SetItem(self->entries, entry, now) < 0) {
        Py_XDECREF(now);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_AssertionError, "stepper: an entry without references");
        }
        return -1;
    }
    Py_DECREF(now);
    return count;
}

/* One reference less; an entry left unreferenced goes to the LRU list's tail
 * (StateBlockPool._unreferenced). */
static int drop_reference(Stepper *self, PyObject *entry) {
    long count = add_references(self, entry, -1);
    if (count != 0) {
        return count < 0 ? -1 : 0;
    }
    if (PyObject_SetItem(self->lru, entry, Py_None) < 0) {
        return -1;
    }
    self->lru_blocks[0] += entry_size(self, entry);
    return 0;
}

/* StateBlockPool._referenced: one reference more, out of the LRU list where it was. */
static int add_reference(Stepper *self, PyObject *entry) {
    long count = add_references(self, entry, 1);
    if (count != 1) {
        return count < 0 ? -1 : 0;
    }
    int listed = PyDict_Contains(self->lru, entry);
    if (listed <= 0) {
        return listed;
    }
    if (PyObject_DelItem(self->lru, entry) < 0) {
        return -1;
    }
    self->lru_blocks[0] -= entry_size(self, entry);
    return 0;
}

int state_evicted(Stepper *self, PyObject *entry, int64_t *size) {
    if (entry_evicted(self, entry) < 0) {
        return -1;
    }
    *size = entry_size(self, entry);
    self->lru_blocks[0] -= *size;
    return 0;
}

/* The request's state blocks (borrowed). */
static PyObject *states_of(Stepper *self, int64_t request) {
    PyObject *key = PyLong_FromLongLong(request);
    PyObject *states = key == NULL ? NULL : PyDict_GetItemWithError(self->states, key);
    Py_XDECREF(key);
    if (states == NULL && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_AssertionError, "stepper: a running request without state blocks");
    }
    return states;
}

/* A state block's end position. */
static int64_t end_of(PyObject *block) {
    return PyLong_AsLongLong(PyList_GET_ITEM(block, 0));
}

/* StateBlockPool._give_back_left: the state blocks before the last that end before
 * ``computed``, last first: freed where private, else one reference less. */
static int give_back_left(Stepper *self, int64_t request, PyObject *states, int64_t computed) {
    int64_t left = 0;
    for (Py_ssize_t i = PyList_GET_SIZE(states) - 2; i >= 0; i--) {
        PyObject *block = PyList_GET_ITEM(states, i);
        if (end_of(block) >= computed) {
            continue;
        }
        PyObject *entry = PyList_GET_ITEM(block, 1);
        if (entry == Py_None) {
            self->free_blocks[0] += self->state_size;
        } else if (drop_reference(self, entry) < 0) {
            return -1;
        }
        if (PySequence_DelItem(states, i) < 0) {
            return -1;
        }
        left += 1;
    }
    self->held[request] -= self->state_size * left;
    return 0;
}

/* A state block [end, None]: new. */
static PyObject *private_state(int64_t end) {
    PyObject *position = PyLong_FromLongLong(end);
    PyObject *block = position == NULL ? NULL : PyList_New(2);
    if (block == NULL) {
        Py_XDECREF(position);
        return NULL;
    }
    Py_INCREF(Py_None);
    PyList_SET_ITEM(block, 0, position);
    PyList_SET_ITEM(block, 1, Py_None);
    return block;
}

/* Where a state block of ``positions`` ends: the next aligned boundary. */
static int64_t state_end(const Stepper *self, int64_t positions) {
    return (positions + self->align - 1) / self->align * self->align;
}

int state_grow(Stepper *self, int64_t request, int64_t positions, int64_t computed) {
    PyObject *states = states_of(self, request);
    if (states == NULL || give_back_left(self, request, states, computed) < 0) {
        return -1;
    }
    Py_ssize_t count = PyList_GET_SIZE(states);
    int64_t kv = self->held[request] - self->state_size * count - self->spec_blocks;
    int64_t new_kv = blocks_for(self, positions) - self->state_blocks - kv;
    new_kv = new_kv > 0 ? new_kv : 0;
    int64_t end = state_end(self, positions);
    int64_t new_state = end > end_of(PyList_GET_ITEM(states, count - 1)) ? self->state_size : 0;
    int64_t delta = new_kv + new_state;
    if (delta > self->free_blocks[0] + self->lru_blocks[0]) {
        return 0;
    }
    if (evict(self, delta - self->free_blocks[0]) < 0) {
        return -1;
    }
    self->free_blocks[0] -= delta;
    self->held[request] += delta;
    if (new_state) {
        PyObject *block = private_state(end);
        int failed = block == NULL || PyList_Append(states, block) < 0;
        Py_XDECREF(block);
        if (failed) {
            return -1;
        }
    }
    return 1;
}

/* dict.pop(request, None): the value, new, or NULL (none: no exception set). */
static PyObject *pop_request(PyObject *dict, int64_t request) {
    PyObject *key = PyLong_FromLongLong(request);
    PyObject *value = key == NULL ? NULL : PyDict_GetItemWithError(dict, key);
    Py_XINCREF(value);
    if (value != NULL && PyDict_DelItem(dict, key) < 0) {
        Py_CLEAR(value);
    }
    Py_XDECREF(key);
    return value;
}

int state_release(Stepper *self, int64_t request) {
    PyObject *refs = pop_request(self->refs, request);
    PyObject *states = PyErr_Occurred() ? NULL : pop_request(self->states, request);
    if (PyErr_Occurred()) {
        Py_XDECREF(refs);
        Py_XDECREF(states);
        return -1;
    }
    Py_ssize_t num_refs = refs == NULL ? 0 : PyList_GET_SIZE(refs);
    Py_ssize_t num_states = states == NULL ? 0 : PyList_GET_SIZE(states);
    int64_t referenced = 0;
    for (Py_ssize_t i = 0; i < num_refs; i++) {
        referenced += entry_size(self, PyList_GET_ITEM(refs, i));
    }
    for (Py_ssize_t i = 0; i < num_states; i++) {
        PyObject *entry = PyList_GET_ITEM(PyList_GET_ITEM(states, i), 1);
        referenced += entry == Py_None ? 0 : entry_size(self, entry);
    }
    self->free_blocks[0] += self->held[request] - referenced;
    /* vLLM frees group by group, the attention groups first, each group's last block first */
    int failed = 0;
    for (int64_t group = 0; group < self->attention_groups && !failed; group++) {
        for (Py_ssize_t i = num_refs - 1; i >= 0 && !failed; i--) {
            PyObject *entry = PyList_GET_ITEM(refs, i);
            failed = group_of(self, entry) == group && drop_reference(self, entry) < 0;
        }
    }
    for (Py_ssize_t i = num_states - 1; i >= 0 && !failed; i--) {
        PyObject *entry = PyList_GET_ITEM(PyList_GET_ITEM(states, i), 1);
        failed = entry != Py_None && drop_reference(self, entry) < 0;
    }
    Py_XDECREF(refs);
    Py_XDECREF(states);
    self->held[request] = 0;
    self->registered[request] = 0;
    return failed ? -1 : 0;
}

int state_entry_cached(Stepper *self, int64_t request, int64_t index) {
    PyObject *key = block_hash(self, request, index);
    if (key == NULL) {
        return -1;
    }
    int cached = 1;
    for (int64_t group = 0; group < self->attention_groups && cached == 1; group++) {
        PyObject *block = group_key(self, group, key);
        cached = block == NULL ? -1 : block_cached(self, block);
        Py_XDECREF(block);
    }
    Py_DECREF(key);
    return cached;
}

int state_kept(Stepper *self, int64_t request, int64_t index) {
    PyObject *key = state_key(self, request, index);
    int kept = key == NULL ? -1 : block_cached(self, key);
    Py_XDECREF(key);
    return kept;
}

/* The blocks a hit of ``hits`` entries takes, entry by entry, group by group, and its
 * conv state's last (*state, new): a new list. */
static PyObject *hit_blocks(Stepper *self, int64_t request, Py_ssize_t hits, PyObject **state) {
    PyObject *blocks = PyList_New(0);
    for (Py_ssize_t j = 0; blocks != NULL && j < hits; j++) {
        PyObject *key = block_hash(self, request, j);
        for (int64_t group = 0; key != NULL && group < self->attention_groups; group++) {
            PyObject *block = group_key(self, group, key);
            PyObject *taken = block == NULL ? NULL : block_taken(self, block);
            if (taken == NULL || PyList_Append(blocks, taken) < 0) {
                Py_CLEAR(blocks);
            }
            Py_XDECREF(block);
            Py_XDECREF(taken);
            if (blocks == NULL) {
                break;
            }
        }
        if (key == NULL) {
            Py_CLEAR(blocks);
        }
        Py_XDECREF(key);
    }
    PyObject *kept = blocks == NULL ? NULL : state_key(self, request, hits - 1);
    *state = kept == NULL ? NULL : block_taken(self, kept);
    Py_XDECREF(kept);
    if (*state == NULL) {
        Py_XDECREF(blocks);
        return NULL;
    }
    return blocks;
}

/* Blocks of ``entry`` when it would leave the LRU list by a reference (0: not there). */
static int64_t reclaimed_size(Stepper *self, PyObject *entry) {
    int listed = PyDict_Contains(self->lru, entry);
    return listed < 0 ? -1 : listed ? entry_size(self, entry) : 0;
}

int state_admit(Stepper *self, int64_t request, Py_ssize_t hits, int64_t positions,
                int64_t whole) {
    PyObject *state = NULL, *blocks = NULL;
    if (hits && (blocks = hit_blocks(self, request, hits, &state)) == NULL) {
        return -1;
    }
    int64_t base = hits * self->entry_blocks;
    int64_t reach = whole > positions ? whole : positions; /* placeholder drafts pass it */
    int64_t need = blocks_for(self, reach) - base, reclaimed = 0;
    Py_ssize_t num_blocks = blocks == NULL ? 0 : PyList_GET_SIZE(blocks);
    for (Py_ssize_t i = 0; i <= num_blocks && hits; i++) {
        int64_t size = reclaimed_size(self, i < num_blocks ? PyList_GET_ITEM(blocks, i) : state);
        if (size < 0) {
            Py_DECREF(blocks);
            Py_DECREF(state);
            return -1;
        }
        reclaimed += size;
    }
    if (need > self->free_blocks[0] + self->lru_blocks[0] - reclaimed) {
        Py_XDECREF(blocks);
        Py_XDECREF(state);
        return 0;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i <= num_blocks && hits && !failed; i++) {
        failed = add_reference(self, i < num_blocks ? PyList_GET_ITEM(blocks, i) : state) < 0;
    }
    PyObject *key = failed ? NULL : PyLong_FromLongLong(request);
    failed = key == NULL || (hits && PyDict_SetItem(self->refs, key, blocks) < 0);
    self->registered[request] = hits;
    int64_t delta = blocks_for(self, positions) - base;
    failed = failed || evict(self, delta - self->free_blocks[0]) < 0;
    self->free_blocks[0] -= delta;
    PyObject *running = failed ? NULL : private_state(state_end(self, positions));
    PyObject *list = running == NULL ? NULL : PyList_New(hits ? 2 : 1);
    if (list != NULL) {
        PyList_SET_ITEM(list, hits ? 1 : 0, running);
        running = NULL;
    }
    if (list != NULL && hits) { /* the hit's state: [hits * align, its entry] */
        PyObject *kept = PyList_New(2), *end = PyLong_FromLongLong(hits * self->align);
        if (kept == NULL || end == NULL) {
            Py_XDECREF(kept);
            Py_XDECREF(end);
            Py_CLEAR(list);
        } else {
            Py_INCREF(state);
            PyList_SET_ITEM(kept, 0, end);
            PyList_SET_ITEM(kept, 1, state);
            PyList_SET_ITEM(list, 0, kept);
        }
    }
    failed = list == NULL || PyDict_SetItem(self->states, key, list) < 0;
    Py_XDECREF(running);
    Py_XDECREF(list);
    Py_XDECREF(key);
    Py_XDECREF(blocks);
    Py_XDECREF(state);
    self->held[request] = base + delta + (hits ? self->state_size : 0);
    return failed ? -1 : 1;
}

int state_keep(Stepper *self, int64_t request, int64_t reach) {
    int64_t size = self->align, last = (self->prompt[request] - 1) / size * size;
    if ((reach != last && reach != self->junction[request]) || reach < size) {
        return 0;
    }
    PyObject *states = states_of(self, request);
    if (states == NULL) {
        return -1;
    }
    PyObject *running = PyList_GET_ITEM(states, PyList_GET_SIZE(states) - 1);
    if (end_of(running) != reach || PyList_GET_ITEM(running, 1) != Py_None) {
        return 0;
    }
    PyObject *key = state_key(self, request, reach / size - 1);
    PyObject *entry = key == NULL ? NULL : cache_block(self, key);
    /* BlockPool's same-step rule, by the attention entry's key */
    int failed = entry == NULL || PyList_SetItem(running, 1, entry) < 0 ||
                 PySet_Add(self->states_this_step, PyTuple_GET_ITEM(key, 1)) < 0;
    Py_XDECREF(key);
    return failed ? -1 : 0;
}
