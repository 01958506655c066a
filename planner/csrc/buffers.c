/* Typed, checked views of Python buffers (see buffers.h). */
#include "buffers.h"

#include <stdint.h>

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

int get_array(PyObject *obj, Py_buffer *view, const char *name, char code,
                     Py_ssize_t itemsize, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    const char *kind = writable ? "a C-contiguous, writable" : "a C-contiguous";
    return get_buffer(obj, view, name, flags, kind, code, itemsize);
}

int get_strided(PyObject *obj, Py_buffer *view, const char *name) {
    return get_buffer(obj, view, name, PyBUF_RECORDS_RO, "a strided", 'i', 4);
}

Py_ssize_t get_count(PyObject *obj, const char *name) {
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

PyObject *address_or_object(PyObject *obj) {
    if (!PyTuple_CheckExact(obj)) {
        return Py_NewRef(obj);
    }
    if (PyTuple_GET_SIZE(obj) != 2) {
        PyErr_SetString(PyExc_TypeError, "an (address, items) tuple must have two items");
        return NULL;
    }
    void *address = PyLong_AsVoidPtr(PyTuple_GET_ITEM(obj, 0));
    Py_ssize_t items = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 1));
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (items < 0 || items > PY_SSIZE_T_MAX / 4 || (address == NULL && items > 0)) {
        PyErr_SetString(PyExc_ValueError, "an (address, items) tuple: bad address or count");
        return NULL;
    }
    /* The memoryview copies shape and strides; the format is a literal, kept for good. */
    Py_ssize_t shape = items, stride = 4;
    Py_buffer info = {.buf = address, .obj = NULL, .len = items * 4, .itemsize = 4,
                      .readonly = 1, .ndim = 1, .format = "i", .shape = &shape,
                      .strides = &stride, .suboffsets = NULL, .internal = NULL};
    return PyMemoryView_FromBuffer(&info);
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

int shares_memory(const Py_buffer *a, const Py_buffer *b) {
    uintptr_t a_begin, a_end, b_begin, b_end;
    extent(a, &a_begin, &a_end), extent(b, &b_begin, &b_end);
    return a_begin < b_end && b_begin < a_end && a_begin < a_end && b_begin < b_end;
}
