/* The planner's two int32 buffers, as planner/layout.py lays them out (its twin here):
 * the plan's packed buffer, which the packer fills, and StepBatch's buffer of checked
 * copies, which the batch check fills. */
#ifndef STEPPLAN_LAYOUT_H
#define STEPPLAN_LAYOUT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* Row kinds, in group order (batch.py's SPEC, DECODE, PREFILL, PADDING). */
enum { SPEC = 0, DECODE = 1, PREFILL = 2, PADDING = 3 };

/* The packed buffer's fields, in layout.py's FIELDS order. */
typedef struct {
    int32_t *token_map, *query_start, *token_start, *kind, *state_offset, *reads_state,
        *num_accepted, *request, *slot, *tile_row, *tile_start;
    Py_ssize_t tokens, rows, tiles, groups;
} Fields;

/* int32 entries of a plan of ``tokens`` tokens, ``rows`` rows, ``tiles`` prefill tiles and
 * ``groups`` layer groups: PlanLayout.size. */
static inline Py_ssize_t plan_size(Py_ssize_t tokens, Py_ssize_t rows, Py_ssize_t tiles,
                                   Py_ssize_t groups) {
    return tokens + (7 + groups) * rows + 1 + 2 * tiles;
}

/* Points the fields into ``buffer``, by the sizes ``f`` holds. */
static inline void place_fields(int32_t *buffer, Fields *f) {
    Py_ssize_t tokens = f->tokens, rows = f->rows, tiles = f->tiles, groups = f->groups;
    f->token_map = buffer;
    f->query_start = f->token_map + tokens;
    f->token_start = f->query_start + rows + 1;
    f->kind = f->token_start + rows;
    f->state_offset = f->kind + rows;
    f->reads_state = f->state_offset + rows;
    f->num_accepted = f->reads_state + rows;
    f->request = f->num_accepted + rows;
    f->slot = f->request + rows;
    f->tile_row = f->slot + groups * rows;
    f->tile_start = f->tile_row + tiles;
}

/* int32 entries of StepBatch's buffer (layout.py's BATCH_FIELDS): query_lens, computed,
 * drafts, accepted ([R] each), slots ([G, R]), then query_start ([R + 1]). */
static inline Py_ssize_t batch_size(Py_ssize_t rows, Py_ssize_t groups) {
    return (5 + groups) * rows + 1;
}

#endif
