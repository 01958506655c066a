/* The block pool and the prefix cache (sim/memory.py's BlockPool, its specification),
 * on the pool's own arrays and dicts: entries (hash -> references), lru (unreferenced
 * entries, least recently released first) and refs (request -> the entries it
 * references, in order). Every function answers -1 with an exception set on failure. */
#include "pool.h"

int64_t blocks_for(const Stepper *self, int64_t request, int64_t positions) {
    int64_t kv = (positions + self->block_size - 1) / self->block_size;
    int64_t blocks = kv * self->attention_groups + self->state_blocks;
    if (self->kept) {
        int64_t boundaries = positions / self->entry_tokens;
        int64_t hashed = self->hashed[request];
        blocks += (boundaries < hashed ? boundaries : hashed) * self->kept;
    }
    return blocks;
}

int64_t cached_blocks(const Stepper *self) {
    return (int64_t)PyDict_Size(self->lru) * self->entry_blocks;
}

/* The key of the request's ``index``-th prefix-cache entry, as a new Python int:
 * BlockPool.entry_keys, ``hash * per_hash + index % per_hash`` (in Python's integers
 * where int64 would overflow). */
static PyObject *block_hash(const Stepper *self, int64_t request, int64_t index) {
    int64_t hash = self->hashes[self->prefix_offsets[request] + index / self->per_hash];
    int64_t part = index % self->per_hash, key;
    if (!__builtin_mul_overflow(hash, self->per_hash, &key) &&
        !__builtin_add_overflow(key, part, &key)) {
        return PyLong_FromLongLong(key);
    }
    PyObject *h = PyLong_FromLongLong(hash), *per = PyLong_FromLongLong(self->per_hash);
    PyObject *scaled = h && per ? PyNumber_Multiply(h, per) : NULL;
    PyObject *offset = scaled ? PyLong_FromLongLong(part) : NULL;
    PyObject *sum = offset ? PyNumber_Add(scaled, offset) : NULL;
    Py_XDECREF(h);
    Py_XDECREF(per);
    Py_XDECREF(scaled);
    Py_XDECREF(offset);
    return sum;
}

/* BlockPool._evict: drop least recently released entries until ``blocks`` are free. */
static int evict(Stepper *self, int64_t blocks) {
    while (blocks > 0) {
        Py_ssize_t pos = 0;
        PyObject *entry, *value;
        if (!PyDict_Next(self->lru, &pos, &entry, &value)) {
            PyErr_SetString(PyExc_AssertionError, "stepper: nothing left to evict");
            return -1;
        }
        Py_INCREF(entry);
        int failed = PyDict_DelItem(self->lru, entry) < 0 || PyDict_DelItem(self->entries, entry) < 0;
        Py_DECREF(entry);
        if (failed) {
            return -1;
        }
        self->free_blocks[0] += self->entry_blocks;
        blocks -= self->entry_blocks;
    }
    return 0;
}

int grow_one(Stepper *self, int64_t request, int64_t positions) {
    int64_t need = blocks_for(self, request, positions);
    int64_t delta = need - self->held[request];
    if (delta <= 0) {
        return 1;
    }
    if (delta > self->free_blocks[0] + cached_blocks(self)) {
        return 0;
    }
    if (evict(self, delta - self->free_blocks[0]) < 0) {
        return -1;
    }
    self->free_blocks[0] -= delta;
    self->held[request] = need;
    return 1;
}

int release_one(Stepper *self, int64_t request) {
    PyObject *key = PyLong_FromLongLong(request);
    if (key == NULL) {
        return -1;
    }
    PyObject *refs = PyDict_GetItemWithError(self->refs, key);  /* borrowed */
    Py_ssize_t count = refs == NULL ? 0 : PyList_GET_SIZE(refs);
    int failed = PyErr_Occurred() != NULL;
    if (refs != NULL) {
        Py_INCREF(refs);
        failed = PyDict_DelItem(self->refs, key) < 0;
    }
    Py_DECREF(key);
    self->free_blocks[0] += self->held[request] - count * self->entry_blocks;
    for (Py_ssize_t i = count - 1; i >= 0 && !failed; i--) {  /* last block first */
        PyObject *entry = PyList_GET_ITEM(refs, i);
        PyObject *value = PyDict_GetItemWithError(self->entries, entry);
        long left = value == NULL ? -1 : PyLong_AsLong(value) - 1;
        PyObject *now = left < 0 ? NULL : PyLong_FromLong(left);
        failed = now == NULL || PyDict_SetItem(self->entries, entry, now) < 0 ||
                 (left == 0 && PyDict_SetItem(self->lru, entry, Py_None) < 0);
        Py_XDECREF(now);
    }
    Py_XDECREF(refs);
    self->held[request] = 0;
    if (self->caching) {
        self->registered[request] = 0;
    }
    if (failed && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_AssertionError, "stepper: an entry without references");
    }
    return failed ? -1 : 0;
}

Py_ssize_t lookup(const Stepper *self, int64_t request, int64_t limit_tokens) {
    if (!self->caching) {
        return 0;
    }
    int64_t count = (limit_tokens - 1) / self->entry_tokens;
    count = self->hashed[request] < count ? self->hashed[request] : count;
    Py_ssize_t hits = 0;
    for (; hits < count; hits++) {
        PyObject *entry = block_hash(self, request, hits);
        int found = entry == NULL ? -1 : PyDict_Contains(self->entries, entry);
        Py_XDECREF(entry);
        if (found < 0) {
            return -1;
        }
        if (!found) {
            break;
        }
    }
    return hits;
}

/* The hits referenced: their counts up, out of the LRU list, and the request's refs. */
static int reference(Stepper *self, int64_t request, Py_ssize_t hits) {
    PyObject *list = PyList_New(hits);
    for (Py_ssize_t j = 0; list != NULL && j < hits; j++) {
        PyObject *entry = block_hash(self, request, j);
        PyObject *value = entry == NULL ? NULL : PyDict_GetItemWithError(self->entries, entry);
        PyObject *now = value == NULL ? NULL : PyLong_FromLong(PyLong_AsLong(value) + 1);
        if (now == NULL || PyDict_SetItem(self->entries, entry, now) < 0 ||
            (PyDict_Contains(self->lru, entry) == 1 && PyDict_DelItem(self->lru, entry) < 0)) {
            Py_XDECREF(now);
            Py_XDECREF(entry);
            Py_DECREF(list);
            return -1;
        }
        Py_DECREF(now);
        PyList_SET_ITEM(list, j, entry);  /* steals entry */
    }
    if (list == NULL) {
        return -1;
    }
    PyObject *key = PyLong_FromLongLong(request);
    int failed = key == NULL || PyDict_SetItem(self->refs, key, list) < 0;
    Py_XDECREF(key);
    Py_DECREF(list);
    return failed ? -1 : 0;
}

int admit_one(Stepper *self, int64_t request, Py_ssize_t hits, int64_t positions,
              int64_t whole) {
    int64_t base = hits * self->entry_blocks;
    int64_t reach = whole > positions ? whole : positions; /* placeholder drafts pass it */
    int64_t delta = blocks_for(self, request, reach) - base; /* the whole prompt must fit */
    Py_ssize_t reclaimed = 0;
    for (Py_ssize_t j = 0; j < hits; j++) {
        PyObject *entry = block_hash(self, request, j);
        int in_lru = entry == NULL ? -1 : PyDict_Contains(self->lru, entry);
        Py_XDECREF(entry);
        if (in_lru < 0) {
            return -1;
        }
        reclaimed += in_lru;
    }
    int64_t evictable = ((int64_t)PyDict_Size(self->lru) - reclaimed) * self->entry_blocks;
    if (delta > self->free_blocks[0] + evictable) {
        return 0;
    }
    if (hits && reference(self, request, hits) < 0) {
        return -1;
    }
    self->registered[request] = hits;
    self->held[request] = base;
    int grown = grow_one(self, request, positions);
    if (grown == 0) {
        PyErr_SetString(PyExc_AssertionError, "stepper: admission was checked");
        return -1;
    }
    return grown < 0 ? -1 : 1;
}

int register_blocks(Stepper *self, int64_t request, int64_t positions) {
    int64_t done = positions / self->entry_tokens;
    done = self->hashed[request] < done ? self->hashed[request] : done;
    int64_t first = self->registered[request];
    if (done <= first) {
        return 0;
    }
    PyObject *key = PyLong_FromLongLong(request);
    PyObject *fresh = key == NULL ? NULL : PyList_New(0);
    PyObject *refs = fresh == NULL ? NULL : PyDict_SetDefault(self->refs, key, fresh);
    Py_XDECREF(key);
    Py_XDECREF(fresh);
    if (refs == NULL) {
        return -1;
    }
    for (int64_t j = first; j < done; j++) {
        PyObject *entry = block_hash(self, request, j);
        int found = entry == NULL ? -1 : PyDict_Contains(self->entries, entry);
        PyObject *one = found == 0 ? PyLong_FromLong(1) : NULL;
        int failed = found < 0 || (found == 0 && (one == NULL ||
                                                   PyDict_SetItem(self->entries, entry, one) < 0 ||
                                                   PyList_Append(refs, entry) < 0));
        Py_XDECREF(one);
        Py_XDECREF(entry);
        if (failed) {
            return -1;
        }
    }
    self->registered[request] = done;
    return 0;
}
