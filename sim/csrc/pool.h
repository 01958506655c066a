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
/* BlockPool.register of the step's first ``rows`` rows (states kept, then entries cached). */
int register_rows(Stepper *self, Py_ssize_t rows);
/* BlockPool.grow of a request with ``computed`` tokens computed (StateBlockPool frees the
 * state blocks it left behind). */
int grow_request(Stepper *self, int64_t request, int64_t positions, int64_t computed);
/* The key of the request's ``index``-th prefix-cache entry (BlockPool.entry_keys), new. */
PyObject *block_hash(const Stepper *self, int64_t request, int64_t index);
/* BlockPool._evict: drop least recently released entries until ``blocks`` are free. */
int evict(Stepper *self, int64_t blocks);
/* BlockPool._cache_entries of one request reaching ``reach`` (StateBlockPool's too). */
int cache_entries(Stepper *self, int64_t request, int64_t reach);

/* Entry keys and copies (BlockPool's): whether ``entry`` is a tuple tagged ``tag``; the key
 * a copy copies (any other key itself, borrowed); _block_cached (1, 0); _block_taken and
 * _cache_block (new references); BlockPool._evicted less its size (0 done). */
int tagged(PyObject *entry, PyObject *tag);
PyObject *copied(const Stepper *self, PyObject *entry);
int block_cached(Stepper *self, PyObject *key);
PyObject *block_taken(Stepper *self, PyObject *key);
PyObject *cache_block(Stepper *self, PyObject *key);
int entry_evicted(Stepper *self, PyObject *entry);

/* sim/state_blocks.py's StateBlockPool (state_pool.c), where self->tracks_states: the
 * functions above call these. Each answers -1 with an exception set on failure. */
int state_evicted(Stepper *self, PyObject *entry, int64_t *size);
int state_grow(Stepper *self, int64_t request, int64_t positions, int64_t computed);
int state_release(Stepper *self, int64_t request);
/* Whether the request's ``index``-th entry is cached in every attention group (1, 0). */
int state_entry_cached(Stepper *self, int64_t request, int64_t index);
/* Whether a conv state is cached where the request's ``index``-th entry ends (1, 0). */
int state_kept(Stepper *self, int64_t request, int64_t index);
int state_admit(Stepper *self, int64_t request, Py_ssize_t hits, int64_t positions,
                int64_t whole);
/* StateBlockPool._keep_states of one request reaching ``reach``. */
int state_keep(Stepper *self, int64_t request, int64_t reach);
/* StateBlockPool._group_blocks: one attention group's block of an entry's key, new. */
PyObject *group_key(const Stepper *self, int64_t group, PyObject *key);

#endif
