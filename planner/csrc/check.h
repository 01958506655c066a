/* StepBatch's compiled check's Python function (check.c). */
#ifndef STEPPLAN_CHECK_H
#define STEPPLAN_CHECK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern const char CHECK_DOC[];

/* check_batch(query_lens, num_computed_tokens, num_draft_tokens, num_accepted_tokens,
 *             slots, allow_null_slots, data, kinds): CHECK_DOC. */
PyObject *check_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
