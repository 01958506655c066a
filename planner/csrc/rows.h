/* The packer's view of one batch: its arrays, checked against each other, and what one
 * pass over the rows learns (rows and tokens per kind, limits, order). */
#ifndef STEPPLAN_ROWS_H
#define STEPPLAN_ROWS_H

#include "layout.h"

/* The batch's arrays: engine rows, each checked against ``num_rows`` rows. Row lengths
 * are read as differences of ``query_start``, which is read anyway (one array less). */
typedef struct {
    Py_buffer views[5];
    int held;
    Py_ssize_t num_rows;
    const int32_t *query_start, *computed, *accepted, *slots;
    const int8_t *kinds;
} Batch;

/* Releases every view ``batch`` holds. */
void release_batch(Batch *batch);

/* args: query_start, num_computed_tokens, num_accepted_tokens, slots, kinds; ``groups``
 * rows of slots. Fills ``batch``; on failure releases it and sets an exception. */
int take_batch(Batch *batch, PyObject *const *args, Py_ssize_t groups);

/* What the counting pass learns: rows and tokens per kind (padding too), and whether a spec
 * row has q > Q or accepted outside 1..Q; then tiles and the longest prefill. */
typedef struct {
    Py_ssize_t rows[4];
    int64_t tokens[4];
    int64_t tiles;
    int32_t longest_prefill;
    int breaks_limits;
    int in_order; /* kinds never decrease: the live rows lead, already in group order */
} Census;

/* The census of ``batch`` (tiles and the longest prefill left 0: the packer counts them
 * once rows are ordered); -1 with ValueError naming the first row of a kind outside 0..3
 * or a negative length. */
int take_census(const Batch *batch, Py_ssize_t query_len_max, Census *census);

/* Work tiles of ``tile`` tokens that the prefill rows of ``lens`` (engine order) need. */
int64_t count_prefill_tiles(const int32_t *lens, const int8_t *kinds, Py_ssize_t rows,
                            Py_ssize_t tile);

/* prefill_tiles(query_lens, kinds, tile) -> int: work tiles of ``tile`` tokens that the
 * prefill rows need (what sizes an eager plan's tile fields). */
PyObject *prefill_tiles(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
