/* The block pool and the prefix cache (sim/memory.py's BlockPool, its specification),
 * on the pool's own arrays and dicts: entries (hash -> references), lru (unreferenced
 * entries, least recently released first) and refs (request -> the entries it
 * references, in order). Every function answers -1 with an exception set on failure. */
#include "pool.h"

int64_t blocks_for(const Stepper *self, int64_t positions) {
    int64_t kv = (positions + self->block_size - 1) / self->block_size;
    return kv * self->attention_groups + self->state_blocks;
}

int64_t cached_blocks(const Stepper *self) {
    if (self->tracks_states) { /* entries of several sizes: counted as they come and go */
        return self->lru_blocks[0];
    }
    return (int64_t)PyDict_Size(self->lru) * self->entry_blocks;
}

/* The key of the request's ``index``-th prefix-cache entry (BlockPool.entry_keys), a
 * new Python object: within its trace hashes ``hash * per_hash + index % per_hash``, in
 * align mode ``hash * aligned_key_scale + index`` with the hash of the hashed block holding the
 * entry's last token (in Python's integers where int64 would overflow); past them the
 * tuple ``(request, index)``. */
PyObject *block_hash(const Stepper *self, int64_t request, int64_t index) {
    int64_t scale, part, hash, key;
    if (index >= self->hashed[request]) { /* past the trace hashes: the request's own */
        PyObject *pair = PyTuple_New(2);
        PyObject *first = pair == NULL ? NULL : PyLong_FromLongLong(request);
        PyObject *second = first == NULL ? NULL : PyLong_FromLongLong(index);
        if (second == NULL) {
            Py_XDECREF(first);
            Py_XDECREF(pair);
            return NULL;
        }
        PyTuple_SET_ITEM(pair, 0, first);
        PyTuple_SET_ITEM(pair, 1, second);
        return pair;
    }
    if (self->align) {
        int64_t last = self->align * index + self->align - 1;
        hash = self->hashes[self->prefix_offsets[request] + last / self->hashed_tokens];
        scale = self->aligned_key_scale, part = index;
    } else {
        hash = self->hashes[self->prefix_offsets[request] + index / self->per_hash];
        scale = self->per_hash, part = index % self->per_hash;
    }
    if (!__builtin_mul_overflow(hash, scale, &key) && !__builtin_add_overflow(key, part, &key)) {
        return PyLong_FromLongLong(key);
    }
    PyObject *h = PyLong_FromLongLong(hash), *by = PyLong_FromLongLong(scale);
    PyObject *scaled = h && by ? PyNumber_Multiply(h, by) : NULL;
    PyObject *offset = scaled ? PyLong_FromLongLong(part) : NULL;
    PyObject *sum = offset ? PyNumber_Add(scaled, offset) : NULL;
    Py_XDECREF(h);
    Py_XDECREF(by);
    Py_XDECREF(scaled);
    Py_XDECREF(offset);
    return sum;
}

/* Whether ``entry`` is a tuple tagged ``tag`` (the very tag object Python's keys hold). */
int tagged(PyObject *entry, PyObject *tag) {
    return PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) > 1 && PyTuple_GET_ITEM(entry, 0) == tag;
}

/* The key a copy copies; any other key itself (borrowed). */
PyObject *copied(const Stepper *self, PyObject *entry) {
    return tagged(entry, self->tag_copy) ? PyTuple_GET_ITEM(entry, 2) : entry;
}

/* BlockPool._block_cached: the entry or a copy of it (1, 0; -1 failed). */
int block_cached(Stepper *self, PyObject *key) {
    int found = PyDict_Contains(self->entries, key);
    return found != 0 ? found : PyDict_Contains(self->copies, key);
}

/* BlockPool._block_taken: the cached block a hit on ``key`` takes (the entry, else its
 * oldest copy), new. */
PyObject *block_taken(Stepper *self, PyObject *key) {
    int found = PyDict_Contains(self->entries, key);
    if (found != 0) {
        Py_XINCREF(found > 0 ? key : NULL);
        return found > 0 ? key : NULL;
    }
    PyObject *copies = PyDict_GetItemWithError(self->copies, key);
    if (copies == NULL || PyList_GET_SIZE(copies) == 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_AssertionError, "stepper: a hit on a block not cached");
        }
        return NULL;
    }
    PyObject *oldest = PyList_GET_ITEM(copies, 0);
    Py_INCREF(oldest);
    return oldest;
}

/* BlockPool._cache_block: the entry of ``key`` referenced once, or a copy where it is
 * cached already; its entry key, new. */
PyObject *cache_block(Stepper *self, PyObject *key) {
    int cached = block_cached(self, key);
    if (cached < 0) {
        return NULL;
    }
    PyObject *entry = key;
    Py_INCREF(entry);
    if (cached) {
        Py_DECREF(entry);
        self->copies_made[0] += 1;
        PyObject *number = PyLong_FromLongLong(self->copies_made[0]);
        entry = number == NULL ? NULL : PyTuple_Pack(3, self->tag_copy, number, key);
        Py_XDECREF(number);
        PyObject *fresh = entry == NULL ? NULL : PyList_New(0);
        PyObject *copies = fresh == NULL ? NULL : PyDict_SetDefault(self->copies, key, fresh);
        Py_XDECREF(fresh);
        if (copies == NULL || PyList_Append(copies, entry) < 0) {
            Py_XDECREF(entry);
            return NULL;
        }
    }
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL || PyDict_SetItem(self->entries, entry, one) < 0) {
        Py_XDECREF(one);
        Py_DECREF(entry);
        return NULL;
    }
    Py_DECREF(one);
    return entry;
}

int entry_evicted(Stepper *self, PyObject *entry) {
    if (PyDict_DelItem(self->entries, entry) < 0) {
        return -1;
    }
    PyObject *key = copied(self, entry);
    if (key != entry) { /* a copy: off its key's list, the list gone when empty */
        PyObject *copies = PyDict_GetItemWithError(self->copies, key);
        Py_ssize_t at = copies == NULL ? -1 : PySequence_Index(copies, entry);
        if (at < 0 || PySequence_DelItem(copies, at) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_AssertionError, "stepper: a copy not listed");
            }
            return -1;
        }
        if (PyList_GET_SIZE(copies) == 0 && PyDict_DelItem(self->copies, key) < 0) {
            return -1;
        }
    }
    if (!self->align) {
        return 0;
    }
    /* a kept state goes with the key's last block */
    int cached = block_cached(self, key);
    return cached < 0 || (!cached && PySet_Discard(self->kept_states, key) < 0) ? -1 : 0;
}

/* BlockPool._evict: drop least recently released entries until ``blocks`` are free. The
 * LRU list is an OrderedDict: it is changed through its own methods (PyObject_SetItem,
 * PyObject_DelItem, popitem), which keep its order; PyDict_* would bypass it. */
int evict(Stepper *self, int64_t blocks) {
    while (blocks > 0) {
        PyObject *head = PyObject_CallOneArg(self->lru_popitem, Py_False);
        if (head == NULL) {
            return -1;
        }
        PyObject *entry = PyTuple_GET_ITEM(head, 0);
        int64_t size = self->entry_blocks;
        int failed = self->tracks_states ? state_evicted(self, entry, &size) < 0
                                         : entry_evicted(self, entry) < 0;
        Py_DECREF(head);
        if (failed) {
            return -1;
        }
        self->free_blocks[0] += size;
        blocks -= size;
    }
    return 0;
}

int grow_one(Stepper *self, int64_t request, int64_t positions) {
    int64_t need = blocks_for(self, positions);
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

int grow_request(Stepper *self, int64_t request, int64_t positions, int64_t computed) {
    return self->tracks_states ? state_grow(self, request, positions, computed)
                               : grow_one(self, request, positions);
}

int release_one(Stepper *self, int64_t request) {
    if (self->tracks_states) {
        return state_release(self, request);
    }
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
                 (left == 0 && PyObject_SetItem(self->lru, entry, Py_None) < 0);
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

/* Whether the request's ``index``-th entry is in ``container`` (1, 0; -1 failed). */
static int entry_in(const Stepper *self, PyObject *container, int64_t request, int64_t index) {
    PyObject *entry = block_hash(self, request, index);
    int found = entry == NULL ? -1 : PySequence_Contains(container, entry);
    Py_XDECREF(entry);
    return found;
}

/* Whether a block of the request's ``index``-th entry is cached (1, 0; -1 failed). */
static int entry_cached(Stepper *self, int64_t request, int64_t index) {
    PyObject *entry = block_hash(self, request, index);
    int found = entry == NULL ? -1 : block_cached(self, entry);
    Py_XDECREF(entry);
    return found;
}

Py_ssize_t lookup(Stepper *self, int64_t request, int64_t limit_tokens) {
    if (!self->caching) {
        return 0;
    }
    int64_t count = (limit_tokens - 1) / self->entry_tokens;
    Py_ssize_t hits = 0;
    for (; hits < count; hits++) {
        int found = self->tracks_states ? state_entry_cached(self, request, hits)
                                        : entry_cached(self, request, hits);
        if (found < 0) {
            return -1;
        }
        if (!found) {
            break;
        }
    }
    if (!self->align) {
        return hits;
    }
    /* a hit ends on a kept state; past it the prefix is cached for attention alone */
    Py_ssize_t run = hits;
    while (hits > 0) {
        int kept = self->tracks_states ? state_kept(self, request, hits - 1)
                                       : entry_in(self, self->kept_states, request, hits - 1);
        if (kept < 0) {
            return -1;
        }
        if (kept) {
            break;
        }
        hits--;
    }
    self->junction[request] = run > hits ? run * self->align : 0;
    return hits;
}

int64_t aligned_chunk(int64_t start, int64_t tokens, int64_t prompt_end, int64_t size,
                      int64_t junction) {
    if (start >= prompt_end) {
        return tokens;
    }
    int64_t end = start + tokens;
    if (end < prompt_end) {
        end = end / size * size;
    }
    int64_t stops[3] = {
        start % size ? (start / size + 1) * size : 0,
        (prompt_end - 1) / size * size,
        start < junction && junction < end ? start + (junction - start) / size * size : 0,
    };
    int64_t cut = end;
    for (int i = 0; i < 3; i++) {
        if (start < stops[i] && stops[i] < cut) {
            cut = stops[i];
        }
    }
    return cut > start ? cut - start : 0;
}

/* BlockPool._keep_states for one request reaching ``reach``: the state at its prompt's
 * last aligned boundary before the last token, or at its junction, is kept. */
static int keep_state(Stepper *self, int64_t request, int64_t reach) {
    int64_t size = self->align, last = (self->prompt[request] - 1) / size * size;
    int64_t block = reach / size;
    if ((reach != last && reach != self->junction[request]) || block <= 0 ||
        block > self->hashed[request]) {
        return 0;
    }
    PyObject *entry = block_hash(self, request, block - 1);
    int failed = entry == NULL || PySet_Add(self->kept_states, entry) < 0 ||
                 PySet_Add(self->states_this_step, entry) < 0;
    Py_XDECREF(entry);
    return failed ? -1 : 0;
}

/* The blocks a hit of ``hits`` entries takes (BlockPool._block_taken of each): a new list. */
static PyObject *taken_blocks(Stepper *self, int64_t request, Py_ssize_t hits) {
    PyObject *list = PyList_New(hits);
    for (Py_ssize_t j = 0; list != NULL && j < hits; j++) {
        PyObject *key = block_hash(self, request, j);
        PyObject *block = key == NULL ? NULL : block_taken(self, key);
        Py_XDECREF(key);
        if (block == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, j, block); /* steals block */
    }
    return list;
}

/* The blocks referenced: their counts up, out of the LRU list, and the request's refs. */
static int reference(Stepper *self, int64_t request, PyObject *blocks) {
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(blocks); j++) {
        PyObject *entry = PyList_GET_ITEM(blocks, j);
        PyObject *value = PyDict_GetItemWithError(self->entries, entry);
        PyObject *now = value == NULL ? NULL : PyLong_FromLong(PyLong_AsLong(value) + 1);
        int failed = now == NULL || PyDict_SetItem(self->entries, entry, now) < 0;
        Py_XDECREF(now);
        int listed = failed ? -1 : PyDict_Contains(self->lru, entry);
        if (listed < 0 || (listed == 1 && PyObject_DelItem(self->lru, entry) < 0)) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_AssertionError, "stepper: a hit on an entry not cached");
            }
            return -1;
        }
    }
    PyObject *key = PyLong_FromLongLong(request);
    int failed = key == NULL || PyDict_SetItem(self->refs, key, blocks) < 0;
    Py_XDECREF(key);
    return failed ? -1 : 0;
}

int admit_one(Stepper *self, int64_t request, Py_ssize_t hits, int64_t positions,
              int64_t whole) {
    if (self->align && hits) { /* a state kept in this step is not started from in it */
        int fresh = entry_in(self, self->states_this_step, request, hits - 1);
        if (fresh != 0) {
            return fresh < 0 ? -1 : 0;
        }
    }
    if (self->tracks_states) {
        return state_admit(self, request, hits, positions, whole);
    }
    int64_t base = hits * self->entry_blocks;
    int64_t reach = whole > positions ? whole : positions; /* placeholder drafts pass it */
    int64_t delta = blocks_for(self, reach) - base; /* the whole prompt must fit */
    PyObject *blocks = hits ? taken_blocks(self, request, hits) : NULL;
    if (hits && blocks == NULL) {
        return -1;
    }
    Py_ssize_t reclaimed = 0;
    for (Py_ssize_t j = 0; j < hits; j++) {
        int in_lru = PyDict_Contains(self->lru, PyList_GET_ITEM(blocks, j));
        if (in_lru < 0) {
            Py_DECREF(blocks);
            return -1;
        }
        reclaimed += in_lru;
    }
    int64_t evictable = ((int64_t)PyDict_Size(self->lru) - reclaimed) * self->entry_blocks;
    int fits = delta <= self->free_blocks[0] + evictable;
    int failed = fits && hits && reference(self, request, blocks) < 0;
    Py_XDECREF(blocks);
    if (!fits || failed) {
        return failed ? -1 : 0;
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

/* BlockPool.register's reach: ``positions`` less the drafts (their tokens are not known). */
static int64_t known_reach(const Stepper *self, int64_t request, int64_t positions) {
    int64_t known = self->prompt[request] + self->emitted[request];
    return positions < known ? positions : known;
}

int cache_entries(Stepper *self, int64_t request, int64_t reach) {
    int64_t done = reach / self->entry_tokens;
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
    /* BlockPool._group_blocks: an entry is one block of every group, where
     * StateBlockPool caches each attention group's block apart */
    int64_t groups = self->tracks_states ? self->attention_groups : 1;
    for (int64_t j = first; j < done; j++) {
        PyObject *hash = block_hash(self, request, j);
        for (int64_t group = 0; hash != NULL && group < groups; group++) {
            PyObject *block = self->tracks_states ? group_key(self, group, hash) : hash;
            Py_XINCREF(self->tracks_states ? NULL : block);
            PyObject *entry = block == NULL ? NULL : cache_block(self, block);
            int failed = entry == NULL || PyList_Append(refs, entry) < 0;
            Py_XDECREF(entry);
            Py_XDECREF(block);
            if (failed) {
                Py_CLEAR(hash);
            }
        }
        if (hash == NULL) {
            return -1;
        }
        Py_DECREF(hash);
    }
    self->registered[request] = done;
    return 0;
}

/* BlockPool._keep_states of one request reaching ``reach``. */
static int keep_states(Stepper *self, int64_t request, int64_t reach) {
    if (!self->align) {
        return 0;
    }
    return self->tracks_states ? state_keep(self, request, reach) : keep_state(self, request, reach);
}

int register_blocks(Stepper *self, int64_t request, int64_t positions) {
    int64_t reach = known_reach(self, request, positions);
    return keep_states(self, request, reach) < 0 ? -1 : cache_entries(self, request, reach);
}

int register_rows(Stepper *self, Py_ssize_t rows) {
    for (Py_ssize_t r = 0; r < rows; r++) { /* every row's states, then every row's entries */
        int64_t request = self->ids[r];
        if (keep_states(self, request, known_reach(self, request, self->comp[r] + self->q[r])) < 0) {
            return -1;
        }
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        int64_t request = self->ids[r];
        if (cache_entries(self, request, known_reach(self, request, self->comp[r] + self->q[r])) < 0) {
            return -1;
        }
    }
    return 0;
}
