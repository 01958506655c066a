/* The extension module stepplan.sim._stepper: the Stepper type, bound once to the arrays
 * of one simulation (sim/stepper.py builds the dict it takes). Built by pip install
 * (setup.py); sim/stepper.py checks SOURCE_DIGEST against the sources beside it. */
#include "stepper.h"

#ifndef STEPPER_SOURCE_DIGEST
#define STEPPER_SOURCE_DIGEST ""
#endif

/* Acquire the C-contiguous buffer ``fields[name]`` of items ``code``/``size``; its data
 * pointer in *data and its item count in *count (when given); -1 with an exception. */
static int bind_buffer(Stepper *self, PyObject *fields, const char *name, char code,
                       Py_ssize_t size, void **data, Py_ssize_t *count, int writable) {
    PyObject *obj = PyDict_GetItemString(fields, name);
    if (obj == NULL) {
        PyErr_Format(PyExc_KeyError, "stepper: no field %s", name);
        return -1;
    }
    if (self->num_views == MAX_BUFFERS) {
        PyErr_SetString(PyExc_RuntimeError, "stepper: too many buffers");
        return -1;
    }
    Py_buffer *view = &self->views[self->num_views];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return -1;
    }
    self->num_views++;
    const char *format = view->format ? view->format : "B";
    if (*format == '=' || *format == '@' || *format == '<') {
        format++;
    }
    /* int64 is 'l' on LP64 and 'q' elsewhere: the item size decides */
    int same = view->itemsize == size &&
               (format[0] == code || (code == 'q' && (format[0] == 'l' || format[0] == 'q')));
    if (!same || format[1] != '\0') {
        PyErr_Format(PyExc_TypeError, "stepper: %s has format '%s'", name, view->format);
        return -1;
    }
    *data = view->buf;
    if (count != NULL) {
        *count = view->len / size;
    }
    return 0;
}

/* A writable buffer (see bind_buffer). */
static int bind(Stepper *self, PyObject *fields, const char *name, char code, Py_ssize_t size,
                void **data, Py_ssize_t *count) {
    return bind_buffer(self, fields, name, code, size, data, count, 1);
}

/* A buffer only read. */
static int bind_ro(Stepper *self, PyObject *fields, const char *name, char code,
                   Py_ssize_t size, void **data, Py_ssize_t *count) {
    return bind_buffer(self, fields, name, code, size, data, count, 0);
}

static int64_t get_int(PyObject *fields, const char *name, int *failed) {
    PyObject *obj = PyDict_GetItemString(fields, name);
    int64_t value = obj == NULL ? -1 : PyLong_AsLongLong(obj);
    if (obj == NULL || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_KeyError, "stepper: no integer %s", name);
        *failed = 1;
    }
    return value;
}

#define I64(name, dest) bind(self, f, name, 'q', 8, (void **)&self->dest, NULL)
#define I32(name, dest) bind(self, f, name, 'i', 4, (void **)&self->dest, NULL)
#define F64(name, dest) bind(self, f, name, 'd', 8, (void **)&self->dest, NULL)

static int bind_state(Stepper *self, PyObject *f) {
    if (bind_ro(self, f, "arrival", 'd', 8, (void **)&self->arrival, &self->n) < 0 ||
        bind_ro(self, f, "prompt", 'q', 8, (void **)&self->prompt, NULL) < 0 ||
        bind_ro(self, f, "output", 'q', 8, (void **)&self->output, NULL) < 0 || I64("target", target) < 0 ||
        I64("computed", computed) < 0 || I64("emitted", emitted) < 0 ||
        I64("spec_steps", spec_steps) < 0 || I64("lost", lost) < 0 ||
        I64("preemptions", preemptions) < 0 || I64("recomputed", recomputed) < 0 ||
        I64("cached", cached) < 0 || I64("preloaded", preloaded) < 0 || I32("slot", slot) < 0 ||
        I32("last_accepted", last_accepted) < 0 || I64("counters", counters) < 0 ||
        I64("running", running) < 0 || I64("resumed", resumed) < 0 ||
        I32("free_slots", free_slots) < 0 || I64("ids", ids) < 0 || I64("drawn", drawn) < 0 ||
        I32("query_lens", q) < 0 || I32("computed_rows", comp) < 0 || I32("slots", slots) < 0 ||
        I32("drafts", drafts) < 0 || I32("accepted_rows", acc) < 0 ||
        bind(self, f, "flags", 'B', 1, (void **)&self->flags, NULL) < 0 || F64("info", info) < 0 ||
        F64("first_token_s", first_token) < 0 || F64("finish_s", finish_s) < 0 ||
        F64("last_emit_s", last_emit) < 0 || I64("num_steps", num_steps) < 0 ||
        I64("drafted", drafted) < 0 || I64("accepted", accepted) < 0 ||
        bind(self, f, "gaps", 'd', 8, (void **)&self->gaps, &self->gaps_cap) < 0 ||
        I64("gaps_size", gaps_size) < 0 ||
        bind(self, f, "table", 'd', 8, (void **)&self->table, &self->table_cap) < 0 ||
        I64("table_size", table_size) < 0) {
        return -1;
    }
    self->table_cap /= RECORD_FIELDS + MEMORY_FIELDS;
    int failed = 0;
    self->max_batched = get_int(f, "max_num_batched_tokens", &failed);
    self->max_seqs = get_int(f, "max_num_seqs", &failed);
    self->num_spec = get_int(f, "num_spec_tokens", &failed);
    self->has_pool = (int)get_int(f, "has_pool", &failed);
    self->accept_kind = (int)get_int(f, "accept_kind", &failed);
    self->ordered = (int)get_int(f, "ordered", &failed);
    self->takes_preloaded = (int)get_int(f, "takes_preloaded", &failed);
    return failed ? -1 : 0;
}

/* An admission policy's queue (scheduler/queue.py), where it is not arrival order. */
static int bind_queue(Stepper *self, PyObject *f) {
    PyObject *limit = PyDict_GetItemString(f, "age_limit_s");
    self->age_limit = limit == NULL ? -1.0 : PyFloat_AsDouble(limit);
    if (limit == NULL || PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_KeyError, "stepper: no float age_limit_s");
        return -1;
    }
    if (bind_ro(self, f, "rank", 'q', 8, (void **)&self->rank, NULL) < 0 ||
        I64("heap", heap) < 0 ||
        bind(self, f, "admitted", 'B', 1, (void **)&self->admitted, NULL) < 0) {
        return -1;
    }
    return 0;
}

/* StateBlockPool's counts, dicts and key tags (memory.align_state_blocks). */
static int bind_state_blocks(Stepper *self, PyObject *f) {
    int failed = 0;
    self->state_size = get_int(f, "state_size", &failed);
    self->spec_blocks = get_int(f, "spec_blocks", &failed);
    PyObject *states = PyDict_GetItemString(f, "states");
    PyObject *tags = PyDict_GetItemString(f, "state_tags"); /* (group, state) */
    if (failed || states == NULL || !PyDict_Check(states) || tags == NULL ||
        !PyTuple_Check(tags) || PyTuple_GET_SIZE(tags) != 2) {
        if (!failed) {
            PyErr_SetString(PyExc_TypeError, "stepper: states must be a dict, state_tags 2 items");
        }
        return -1;
    }
    self->states = states;
    self->tag_group = PyTuple_GET_ITEM(tags, 0);
    self->tag_state = PyTuple_GET_ITEM(tags, 1);
    Py_INCREF(self->states);
    Py_INCREF(self->tag_group);
    Py_INCREF(self->tag_state);
    return I64("lru_blocks", lru_blocks) < 0 ? -1 : 0;
}

static int bind_pool(Stepper *self, PyObject *f) {
    if (I64("held", held) < 0 || I64("hashed", hashed) < 0 || I64("registered", registered) < 0 ||
        I64("free_blocks", free_blocks) < 0) {
        return -1;
    }
    int failed = 0;
    self->caching = (int)get_int(f, "caching", &failed);
    self->capacity = get_int(f, "capacity", &failed);
    self->block_size = get_int(f, "block_size", &failed);
    self->entry_tokens = get_int(f, "entry_tokens", &failed);
    self->state_blocks = get_int(f, "state_blocks", &failed);
    self->attention_groups = get_int(f, "attention_groups", &failed);
    self->per_hash = get_int(f, "entries_per_hash", &failed);
    self->entry_blocks = get_int(f, "entry_blocks", &failed);
    self->align = get_int(f, "align_tokens", &failed);
    self->entries = PyDict_GetItemString(f, "entries");
    self->lru = PyDict_GetItemString(f, "lru");
    self->refs = PyDict_GetItemString(f, "refs");
    if (failed || self->entries == NULL || self->lru == NULL || self->refs == NULL ||
        !PyDict_Check(self->entries) || !PyDict_Check(self->lru) || !PyDict_Check(self->refs)) {
        /* lru: an OrderedDict, a dict subclass */
        self->entries = self->lru = self->refs = NULL;
        if (!failed) {
            PyErr_SetString(PyExc_TypeError, "stepper: entries, lru and refs must be dicts");
        }
        return -1;
    }
    Py_INCREF(self->entries);
    Py_INCREF(self->lru);
    Py_INCREF(self->refs);
    self->lru_popitem = PyObject_GetAttrString(self->lru, "popitem");
    if (self->lru_popitem == NULL) {
        return -1;
    }
    if (!self->caching) {
        self->align = 0;
        return 0;
    }
    if (bind_ro(self, f, "prefix_offsets", 'q', 8, (void **)&self->prefix_offsets, NULL) < 0 ||
        bind_ro(self, f, "hashes", 'q', 8, (void **)&self->hashes, NULL) < 0 ||
        I64("copies_made", copies_made) < 0) {
        return -1;
    }
    self->copies = PyDict_GetItemString(f, "copies");
    self->tag_copy = PyDict_GetItemString(f, "copy_tag");
    if (self->copies == NULL || !PyDict_Check(self->copies) || self->tag_copy == NULL) {
        self->copies = self->tag_copy = NULL;
        PyErr_SetString(PyExc_TypeError, "stepper: copies must be a dict, with a copy_tag");
        return -1;
    }
    Py_INCREF(self->copies);
    Py_INCREF(self->tag_copy);
    if (!self->align) {
        return 0;
    }
    self->hashed_tokens = get_int(f, "prefix_block_tokens", &failed);
    self->aligned_key_scale = get_int(f, "aligned_key_scale", &failed);
    self->kept_states = PyDict_GetItemString(f, "kept_states");
    self->states_this_step = PyDict_GetItemString(f, "states_this_step");
    if (failed || self->kept_states == NULL || !PySet_Check(self->kept_states) ||
        self->states_this_step == NULL || !PySet_Check(self->states_this_step)) {
        self->kept_states = self->states_this_step = NULL;
        if (!failed) {
            PyErr_SetString(PyExc_TypeError,
                            "stepper: kept_states and states_this_step must be sets");
        }
        return -1;
    }
    Py_INCREF(self->kept_states);
    Py_INCREF(self->states_this_step);
    if (I64("junction", junction) < 0) {
        return -1;
    }
    self->tracks_states = (int)get_int(f, "tracks_states", &failed);
    return failed || !self->tracks_states ? -failed : bind_state_blocks(self, f);
}

static int bind_acceptance(Stepper *self, PyObject *f) {
    int failed = 0;
    if (self->accept_kind == ACCEPT_PYTHON) {
        return 0;
    }
    PyObject *key = PyDict_GetItemString(f, "key");
    self->key = key == NULL ? 0 : (uint64_t)PyLong_AsUnsignedLongLongMask(key);
    if (key == NULL || PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_KeyError, "stepper: no integer key");
        return -1;
    }
    if (self->accept_kind == ACCEPT_PER_POSITION) {
        return failed ? -1
                      : bind_ro(self, f, "survival", 'd', 8, (void **)&self->survival,
                             &self->survival_len);
    }
    if (self->accept_kind == ACCEPT_FIXED) {
        self->whole = get_int(f, "whole", &failed);
        PyObject *fraction = PyDict_GetItemString(f, "fraction");
        self->fraction = fraction == NULL ? -1.0 : PyFloat_AsDouble(fraction);
        return failed || PyErr_Occurred() ? -1 : 0;
    }
    Py_ssize_t offsets = 0;
    if (failed || bind_ro(self, f, "offsets", 'q', 8, (void **)&self->offsets, &offsets) < 0 ||
        bind_ro(self, f, "values", 'q', 8, (void **)&self->values, NULL) < 0) {
        return -1;
    }
    self->num_sequences = offsets - 1;
    return 0;
}

static void stepper_dealloc(Stepper *self) {
    for (int i = 0; i < self->num_views; i++) {
        PyBuffer_Release(&self->views[i]);
    }
    Py_XDECREF(self->entries);
    Py_XDECREF(self->lru);
    Py_XDECREF(self->refs);
    Py_XDECREF(self->lru_popitem);
    Py_XDECREF(self->kept_states);
    Py_XDECREF(self->states_this_step);
    Py_XDECREF(self->states);
    Py_XDECREF(self->copies);
    Py_XDECREF(self->tag_group);
    Py_XDECREF(self->tag_state);
    Py_XDECREF(self->tag_copy);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *stepper_new(PyTypeObject *type, PyObject *args, PyObject *Py_UNUSED(kwargs)) {
    PyObject *fields;
    if (!PyArg_ParseTuple(args, "O!:Stepper", &PyDict_Type, &fields)) {
        return NULL;
    }
    Stepper *self = (Stepper *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    if (bind_state(self, fields) < 0 || (self->has_pool && bind_pool(self, fields) < 0) ||
        (self->ordered && bind_queue(self, fields) < 0) ||
        bind_acceptance(self, fields) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyMethodDef stepper_methods[] = {
    {"schedule", (PyCFunction)stepper_schedule, METH_O,
     "schedule(now_s) -> (rows, kv_tokens, attention_pairs), or None: nothing can run."},
    {"finish", (PyCFunction)(void (*)(void))stepper_finish, METH_FASTCALL,
     "finish(end_s, record, given) -> 0 done, 1 Python draws, 2 a buffer is full."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepperType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepplan.sim._stepper.Stepper",
    .tp_basicsize = sizeof(Stepper),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Stepper(fields): one simulation's steps on its arrays (sim/stepper.py).",
    .tp_new = stepper_new,
    .tp_dealloc = (destructor)stepper_dealloc,
    .tp_methods = stepper_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "stepplan.sim._stepper",
    "The simulator's compiled stepper (sim/stepper.py's Python path is its specification).",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__stepper(void) {
    if (PyType_Ready(&StepperType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&StepperType);
    if (PyModule_AddObject(m, "Stepper", (PyObject *)&StepperType) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_DIGEST", STEPPER_SOURCE_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
