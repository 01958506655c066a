/* The block pool and the prefix cache in C (pool.c; sim/memory.py is the specification). */
#ifndef STEPPLAN_POOL_H
#define STEPPLAN_POOL_H

#include "stepper.h"

/* MemoryLayout.blocks_for: the blocks a request holds at ``positions``. */
int64_t blocks_for(const Stepper *self, int64_t positions);
/* BlockPool.cached_blocks: blocks of unreferenced (evictable) entries. */
int64_t cached_blocks(const Stepper *self);
/* BlockPool.grow: 1 grown (evicting if need be), 0 not even with eviction (nothing changed). */
int grow_one(Stepper *self, int64_t request, int64_t positions);
/* BlockPool.release of one request. */
int release_one(Stepper *self, int64_t request);
/* BlockPool.lookup: how many of the request's leading prompt blocks are cached (setting
 * its junction in align mode). */
Py_ssize_t lookup(Stepper *self, int64_t request, int64_t limit_tokens);
/* memory.aligned_chunk: the tokens of a prefill chunk in align mode. */
int64_t aligned_chunk(int64_t start, int64_t tokens, int64_t prompt_end, int64_t size,
                      int64_t junction);
/* BlockPool.admit with the first ``hits`` blocks as hits, growing to ``positions`` when
 * the blocks for ``whole`` fit: 1 admitted, 0 not (unchanged). */
int admit_one(Stepper *self, int64_t request, Py_ssize_t hits, int64_t positions,
              int64_t whole);
/* BlockPool.register of one request whose blocks reach ``positions`` this step. */
int register_blocks(Stepper *self, int64_t request, int64_t positions);

#endif
