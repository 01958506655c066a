/* The bytes a host step's plan is a pure function of (host.c). */
#ifndef STEPPLAN_HOST_H
#define STEPPLAN_HOST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern const char HOST_BYTES_DOC[];

/* host_bytes(query_start, num_draft_tokens, num_reqs, last): HOST_BYTES_DOC. */
PyObject *host_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
