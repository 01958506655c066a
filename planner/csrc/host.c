/* A host step's key: the bytes of its query starts and drafts, which its plan is a pure
 * function of (with its row, token and group counts), and its live tokens, in one call.
 * A caller keys plans by these bytes; what this call does not take (other layouts or
 * types) it answers with None, and the caller reads the arrays itself. */
#include "host.h"

#include <string.h>

#include "buffers.h"

/* ``obj`` as a 1-D C-contiguous buffer of signed 4- or 8-byte integers of at least
 * ``need`` items: 1 with ``view`` held, 0 (no exception, nothing held) otherwise. */
static int take_ints(PyObject *given, Py_buffer *view, Py_ssize_t need) {
    PyObject *obj = address_or_object(given);
    if (obj == NULL) {
        PyErr_Clear();
        return 0;
    }
    int taken = PyObject_CheckBuffer(obj) &&
                PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0;
    Py_DECREF(obj); /* a view holds its own reference */
    if (!taken) {
        PyErr_Clear();
        return 0;
    }
    const uint16_t probe = 1;
    const char *format = view->format ? view->format : "B";
    if (*format == '@' || *format == '=' || (*format == '<' && *(const char *)&probe == 1)) {
        format++;
    }
    int integer = format[1] == '\0' && (format[0] == 'i' || format[0] == 'l' ||
                                        format[0] == 'q');
    if (view->ndim != 1 || !integer || (view->itemsize != 4 && view->itemsize != 8) ||
        view->shape[0] < need) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

static int64_t item(const Py_buffer *view, Py_ssize_t i) {
    return view->itemsize == 4 ? ((const int32_t *)view->buf)[i]
                               : ((const int64_t *)view->buf)[i];
}

const char HOST_BYTES_DOC[] =
    "host_bytes(query_start, num_draft_tokens, num_reqs, last)\n"
    "(bytes of query_start[:num_reqs + 1], bytes of num_draft_tokens[:num_reqs] or None\n"
    "when it is None, query_start[num_reqs] - query_start[0]) for 1-D C-contiguous arrays\n"
    "of signed 4- or 8-byte integers long enough, or (address, items) tuples of int32\n"
    "host memory; None for anything else. ``last``, an earlier answer (or None), is\n"
    "returned itself where these bytes equal its bytes.";

/* Whether ``view``'s first ``length`` bytes equal ``bytes`` (a bytes object, or None for
 * no view). */
static int same_bytes(PyObject *bytes, const Py_buffer *view, Py_ssize_t length) {
    if (view == NULL || bytes == Py_None) {
        return view == NULL && bytes == Py_None;
    }
    return PyBytes_Check(bytes) && PyBytes_GET_SIZE(bytes) == length &&
           memcmp(PyBytes_AS_STRING(bytes), view->buf, (size_t)length) == 0;
}

/* Whether ``count`` is an int equal to ``value``. */
static int same_count(PyObject *count, long long value) {
    int overflow = 0;
    if (!PyLong_Check(count)) {
        return 0;
    }
    long long held = PyLong_AsLongLongAndOverflow(count, &overflow);
    return !overflow && held == value;
}

PyObject *host_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "host_bytes takes 4 arguments, got %zd", nargs);
        return NULL;
    }
    Py_ssize_t rows = PyLong_AsSsize_t(args[2]);
    if (rows < 0) {
        if (PyErr_Occurred()) {
            PyErr_Clear();
        }
        Py_RETURN_NONE;
    }
    Py_buffer starts, drafts;
    if (!take_ints(args[0], &starts, rows + 1)) {
        Py_RETURN_NONE;
    }
    int with_drafts = args[1] != Py_None;
    if (with_drafts && !take_ints(args[1], &drafts, rows)) {
        PyBuffer_Release(&starts);
        Py_RETURN_NONE;
    }
    PyObject *result = NULL, *last = args[3];
    Py_ssize_t starts_length = (rows + 1) * starts.itemsize;
    Py_ssize_t drafts_length = with_drafts ? rows * drafts.itemsize : 0;
    long long live = (long long)(item(&starts, rows) - item(&starts, 0));
    if (PyTuple_Check(last) && PyTuple_GET_SIZE(last) == 3 &&
        same_bytes(PyTuple_GET_ITEM(last, 0), &starts, starts_length) &&
        same_bytes(PyTuple_GET_ITEM(last, 1), with_drafts ? &drafts : NULL, drafts_length) &&
        same_count(PyTuple_GET_ITEM(last, 2), live)) {
        result = Py_NewRef(last); /* the same value: no copies */
    } else {
        PyObject *starts_bytes = PyBytes_FromStringAndSize(starts.buf, starts_length);
        PyObject *drafts_bytes = with_drafts ? PyBytes_FromStringAndSize(drafts.buf, drafts_length)
                                             : Py_NewRef(Py_None);
        if (starts_bytes != NULL && drafts_bytes != NULL) {
            result = Py_BuildValue("(OOL)", starts_bytes, drafts_bytes, live);
        }
        Py_XDECREF(starts_bytes);
        Py_XDECREF(drafts_bytes);
    }
    if (with_drafts) {
        PyBuffer_Release(&drafts);
    }
    PyBuffer_Release(&starts);
    return result;
}
