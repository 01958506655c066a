/* StepBatch's compiled check's Python function (check.c). */
#ifndef STEPPLAN_CHECK_H
#define STEPPLAN_CHECK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

extern const char CHECK_DOC[];

/* check_batch(query_lens, num_computed_tokens, num_draft_tokens, num_accepted_tokens,
 *             slots, allow_null_slots, data, kinds): CHECK_DOC. */
PyObject *check_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

extern const char SHAPE_COUNTS_DOC[];

/* shape_counts(query_lens, num_computed_tokens, num_draft_tokens, num_accepted_tokens,
 *              slots, allow_null_slots, query_len_max, tile): SHAPE_COUNTS_DOC. */
PyObject *shape_counts(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* BoundRows(query_lens, num_computed_tokens, num_draft_tokens, num_accepted_tokens, slots):
 * those arrays' buffers held; its counts(allow_null_slots, query_len_max, tile, rows) is
 * shape_counts of them. */
extern PyTypeObject BoundRowsType;

/* Kinds and rows per kind (vectorized), then query starts; 1 when a length is negative,
 * a spec row's length is not its drafts + 1, or the token total passes int32. A row with
 * drafts >= 0 is spec; else 0, 1 or more tokens make it padding, decode or prefill (the
 * row-kind rule, SPEC 3.6; the packer's host steps use it too). */
int rows_broken(const int32_t *restrict q, const int32_t *restrict computed,
                const int32_t *restrict drafts, Py_ssize_t rows, int8_t *restrict kinds,
                int32_t *restrict starts, Py_ssize_t counts[4]);

#endif
