/* The plan packer's Python function (pack.c). */
#ifndef STEPPLAN_PACK_H
#define STEPPLAN_PACK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern const char PACK_DOC[];

/* pack(packed, query_start, num_computed_tokens, num_accepted_tokens, slots, kinds,
 *      num_tokens, num_rows, num_tiles, num_groups, query_len_max, tile): PACK_DOC. */
PyObject *pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

extern const char PACK_HOST_DOC[];

/* pack_host(packed, query_start, num_draft_tokens, num_reqs, num_tokens, num_rows,
 *           num_tiles, num_groups, query_len_max, tile, summary): PACK_HOST_DOC. */
PyObject *pack_host(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

extern const char PACK_HOST_EAGER_DOC[];

/* pack_host_eager(packed, query_start, num_draft_tokens, num_reqs, num_groups,
 *                 query_len_max, tile, eager_kinds, max_rows, max_tokens, summary):
 * PACK_HOST_EAGER_DOC. */
PyObject *pack_host_eager(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
