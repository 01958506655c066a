/* The compiled stepper: the simulator's steps on the scheduler's own arrays (see
 * sim/stepper.py, whose Python path is the specification of every function here). */
#ifndef STEPPLAN_STEPPER_H
#define STEPPLAN_STEPPER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* sim/scheduler/state.py's indices and bits, and the acceptance models covered. */
enum { RUNNING, NEXT_ADMIT, FINISHED, NUM_FREE, ARRIVED, PREEMPTED, RESUMED, ROWS, ADMITTED,
       QUEUED, PUSHED };
enum { SPEC = 1, DECODING = 2, EMITS_FIRST = 4 };
enum { KV_TOKENS, ATTENTION_PAIRS, WAITING, NUM_PREEMPTED, USED, CACHED, USAGE };
enum { ACCEPT_PYTHON, ACCEPT_PER_POSITION, ACCEPT_FIXED, ACCEPT_REPLAY };
/* finish's answers: done, the step needs Python's acceptance model (nothing changed), a
 * buffer is full (nothing changed). */
enum { FINISH_DONE, FINISH_PYTHON, FINISH_GROW };
#define RECORD_FIELDS 20 /* the loop's part of a step record; the memory row follows */
#define MEMORY_FIELDS 5
#define MAX_BUFFERS 56

typedef struct {
    PyObject_HEAD
    Py_buffer views[MAX_BUFFERS];
    int num_views;
    PyObject *entries, *lru, *refs; /* the prefix cache's dicts (memory.py's BlockPool) */
    PyObject *lru_popitem;          /* lru.popitem, bound once: eviction calls it per entry */
    /* the trace and the scheduler's per-request state, [N] */
    Py_ssize_t n;
    const double *arrival;
    const int64_t *prompt, *output;
    int64_t *target, *computed, *emitted, *spec_steps, *lost, *preemptions, *recomputed, *cached;
    /* prompt tokens computed elsewhere (a decode pool's requests); takes_preloaded 0: none */
    int64_t *preloaded;
    int takes_preloaded;
    int32_t *slot, *last_accepted;
    int64_t *counters, *running, *resumed;
    int32_t *free_slots;
    int64_t max_batched, max_seqs, num_spec;
    /* an admission policy's waiting queue (scheduler/queue.py; ordered 0: arrival order) */
    int ordered;
    const int64_t *rank;
    int64_t *heap;
    uint8_t *admitted;
    double age_limit;
    /* the block pool (has_pool 0: none) */
    int has_pool, caching;
    int64_t *held, *hashed, *registered, *free_blocks;
    int64_t capacity, block_size, entry_tokens, per_hash, entry_blocks, state_blocks;
    int64_t attention_groups; /* blocks per block_size tokens: one per attention group */
    const int64_t *prefix_offsets, *hashes; /* the trace's prompt block hashes */
    /* blocks computed again under a cached key, cached too (BlockPool.copies: key -> its
     * copies' keys, oldest first), the copies made so far, and the tag of a copy's key */
    PyObject *copies, *tag_copy;
    int64_t *copies_made;
    /* vLLM's align mode (align 0: off): hashed tokens per trace hash, each request's
     * junction, the set of entries ending on a kept conv state, and those kept by the
     * step being scheduled */
    int64_t align, hashed_tokens, aligned_key_scale;
    int64_t *junction;
    PyObject *kept_states, *states_this_step;
    /* conv states as blocks of the pool (memory.align_state_blocks; tracks_states 0: off,
     * state_pool.c): StateBlockPool's blocks of one conv state and speculative state
     * blocks, the blocks in its LRU list, its request -> state blocks, and the tags of
     * its entry keys */
    int tracks_states;
    int64_t state_size, spec_blocks;
    int64_t *lru_blocks;
    PyObject *states, *tag_group, *tag_state;
    /* the step's rows */
    int64_t *ids, *drawn;
    int32_t *q, *comp, *slots, *drafts, *acc;
    uint8_t *flags;
    double *info;
    /* the request log and the step table */
    double *first_token, *finish_s, *last_emit, *gaps, *table;
    int64_t *num_steps, *drafted, *accepted, *gaps_size, *table_size;
    Py_ssize_t gaps_cap, table_cap;
    /* acceptance */
    int accept_kind;
    uint64_t key;
    const double *survival;
    Py_ssize_t survival_len;
    int64_t whole;
    double fraction;
    const int64_t *offsets, *values;
    Py_ssize_t num_sequences;
} Stepper;

PyObject *stepper_schedule(Stepper *self, PyObject *now);
PyObject *stepper_finish(Stepper *self, PyObject *const *args, Py_ssize_t nargs);
int64_t queue_first(Stepper *self, double now, int64_t arrived);
void queue_take(Stepper *self, int64_t request);
int64_t accepted_drafts(const Stepper *self, int64_t request, int64_t drafts, int64_t width);

#endif
