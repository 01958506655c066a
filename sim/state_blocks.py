"""Conv states as blocks of the shared pool in vLLM 0.33's "align" mode
(``memory.align_state_blocks``, the default; ``docs/memory.md``): :class:`StateBlockPool`,
the Python specification of the compiled stepper's ``sim/csrc/state_pool.c``.

Where a hybrid model's conv states are blocks of the one pool in vLLM's align mode
(``MemoryLayout.align_state_blocks``) each request's state blocks are followed one by
one (:attr:`StateBlockPool.states`): a running request holds ``1 + num_spec_tokens`` of
them per conv-state group; when its positions cross into a new aligned block it
takes one more and the one it left is given back at its next allocation (vLLM frees
it there, before counting what that allocation needs). A state block at a kept
boundary is an entry of its own (:data:`STATE`, ``MemoryLayout.state_groups``
blocks), cached while the request holds it and evictable in the same LRU list as
the attention entries once nobody does; a hit references it and gives it back at
the request's next allocation. A hit on a state cached in the same step is refused
for that step, as vLLM refuses it. A block computed again where its key is cached
already (a hit cut back to a kept state leaves cached blocks to compute) is cached
too, a copy (the rule of :class:`~stepplan.sim.memory.BlockPool`). An attention
entry is one block per attention group (:data:`GROUP`), cached, freed and evicted on
its own as vLLM's groups keep them; a hit needs the entry's block in every group. A
request frees its blocks group by group (attention groups, then conv states), each
group's last block first, as vLLM frees them.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from .memory import BlockPool, copied_key
from .memory_sizing import MemoryLayout
from .traces import RequestTable

#: The first item of a kept conv state's entry key, ``(STATE, key of the attention
#: entry it ends)``: the attention entry and the state entry are cached apart.
STATE = "state"
#: The first item of one attention group's block of an entry, ``(GROUP, group, key)``
#: where a model has several (one group's block is keyed by the entry's key itself;
#: :class:`~stepplan.sim.memory.BlockPool` keys an entry of every group's blocks as one).
GROUP = "group"


def block_pool(layout: MemoryLayout, table: RequestTable) -> BlockPool:
    """The pool ``layout`` needs: :class:`StateBlockPool` where its conv states are
    tracked blocks (``layout.align_state_blocks``), else :class:`BlockPool`."""
    cls = StateBlockPool if layout.align_state_blocks else BlockPool
    return cls(layout, table)


class StateBlockPool(BlockPool):
    """:class:`~stepplan.sim.memory.BlockPool` with each request's conv-state blocks
    followed one by one, entries of attention blocks per group, of kept states and
    copies (see the module docstring).

    Attributes:
        states: request -> its state blocks, ascending, the running one last, each
            ``[end, entry]``: the position its state is at, and its STATE entry key
            (``None`` while private).
        copies: key -> its copies' keys, oldest first.
    """

    tracks_states = True

    def __init__(self, layout: MemoryLayout, table: RequestTable) -> None:
        super().__init__(layout, table)
        self._state_size = layout.state_groups  # blocks of one conv state
        # the speculative state blocks a running request holds beside its running one
        self._spec_blocks = layout.state_blocks - layout.state_groups
        # blocks of the entries in self.lru: a count in an array, which the compiled
        # stepper updates in place
        self.lru_blocks = np.zeros(1, np.int64)
        self.states: dict[int, list[list]] = {}

    @property
    def cached_blocks(self) -> int:
        """Blocks of unreferenced (evictable) entries, counted: entries differ in size."""
        return int(self.lru_blocks[0])

    def entry_size(self, entry: Hashable) -> int:
        """Blocks of the entry ``entry``: a kept conv state's, or an attention entry's."""
        entry = copied_key(entry)
        if isinstance(entry, tuple) and entry[0] == STATE:
            return self._state_size
        if isinstance(entry, tuple) and entry[0] == GROUP:
            return 1
        return self._entry_blocks

    def _group_blocks(self, key: Hashable) -> list[Hashable]:
        """The keys of an attention entry's blocks, one per attention group; with one
        group the entry's own key (a tuple more per lookup costs the cache its speed)."""
        groups = self.layout.attention_groups
        if groups == 1:
            return [key]
        return [(GROUP, group, key) for group in range(groups)]

    def _group_of(self, entry: Hashable) -> int:
        """The attention group of a block key (-1: a state's; 0: an entry's own key,
        the one group's block)."""
        entry = copied_key(entry)
        if isinstance(entry, tuple) and entry[0] == STATE:
            return -1
        return entry[1] if isinstance(entry, tuple) and entry[0] == GROUP else 0

    def _unreferenced(self, entry: Hashable) -> None:
        """``entry`` lost its last reference: the tail of the LRU list."""
        self.lru[entry] = None
        self.lru_blocks[0] += self.entry_size(entry)

    def _referenced(self, entry: Hashable) -> None:
        """``entry`` gains a reference: out of the LRU list where it was there."""
        self.entries[entry] += 1
        if self.entries[entry] == 1 and entry in self.lru:
            del self.lru[entry]
            self.lru_blocks[0] -= self.entry_size(entry)

    def grow_all(self, ids: np.ndarray, positions: np.ndarray) -> bool:
        """``False``: every request grows in turn (:meth:`grow`), as vLLM allocates,
        freeing the state blocks it left before its own allocation."""
        return False

    def grow(self, request: int, positions: int, computed: int = 0) -> bool:
        """Grow one request (``computed`` tokens computed) to ``positions``, first
        freeing the state blocks it left behind (whether it then grows or not): the
        KV blocks of every attention group and one state block more when its positions
        cross into a new aligned block (its state goes there; the running one is left,
        given back later). ``False`` when even eviction leaves too few blocks."""
        self._give_back_left(request, computed)
        states = self.states[request]
        kv = int(self.held[request]) - self._state_size * len(states) - self._spec_blocks
        new_kv = max(int(self.layout.kv_blocks(positions)) - kv, 0)
        end = -(-positions // self.align) * self.align  # where the state block ends
        new_state = self._state_size if end > states[-1][0] else 0
        delta = new_kv + new_state
        if delta > self.free + self.cached_blocks:
            return False
        self._evict(delta - self.free)
        self.free -= delta
        self.held[request] += delta
        if new_state:
            states.append([end, None])
        return True

    def _give_back_left(self, request: int, computed: int) -> None:
        """Free the state blocks the request left behind, those ending before its
        ``computed`` tokens (vLLM's ``remove_skipped_blocks``), last first; a kept
        one loses a reference."""
        states = self.states[request]
        left = [block for block in states[:-1] if block[0] < computed]
        if not left:
            return
        for block in reversed(left):
            self._drop_state(block[1])
            states.remove(block)
        self.held[request] -= self._state_size * len(left)

    def _drop_state(self, entry: Hashable | None) -> None:
        """A state block given back: free where private, else one reference less."""
        if entry is None:
            self.free += self._state_size
            return
        self.entries[entry] -= 1
        if self.entries[entry] == 0:
            self._unreferenced(entry)

    def _evicted(self, entry: Hashable) -> int:
        super()._evicted(entry)
        size = self.entry_size(entry)
        self.lru_blocks[0] -= size
        return size

    def _entry_cached(self, entry: Hashable) -> bool:
        """The entry's block is cached in every attention group."""
        return all(self._block_cached(block) for block in self._group_blocks(entry))

    def _state_kept(self, entry: Hashable) -> bool:
        return self._block_cached((STATE, entry))

    def admit(self, request: int, hits: list[int], positions: int, whole: int) -> bool:
        """:meth:`BlockPool.admit`, the request also holding the hit's state (an entry,
        given back at its next allocation; refused when that state was cached in this
        step), ``1 + num_spec_tokens`` state blocks of its own and its KV blocks past
        the hit."""
        if hits and hits[-1] in self.states_this_step:
            return False  # vLLM: its state is not written before this step ends
        state = (STATE, hits[-1]) if hits else None
        base = len(hits) * self._entry_blocks
        count = len(hits)
        hits = [self._block_taken(block) for entry in hits for block in self._group_blocks(entry)]
        if state is not None:
            state = self._block_taken(state)
        referenced = [*hits, state] if hits else []
        reach = max(whole, positions)  # positions pass it by placeholder drafts
        need = int(self.layout.blocks_for(reach)) - base
        reclaimed = sum(self.entry_size(entry) for entry in referenced if entry in self.lru)
        if need > self.free + self.cached_blocks - reclaimed:
            return False
        for entry in referenced:
            self._referenced(entry)
        if hits:
            self.refs[request] = list(hits)
        self.registered[request] = count
        delta = int(self.layout.blocks_for(positions)) - base
        self._evict(delta - self.free)
        self.free -= delta
        end = -(-positions // self.align) * self.align
        self.states[request] = [[count * self.align, state], [end, None]] if hits else [[end, None]]
        self.held[request] = base + delta + (self._state_size if hits else 0)
        return True

    def _keep_states(self, ids: list[int], positions: list[int], prompt: list[int]) -> None:
        """:meth:`BlockPool._keep_states`: the running state block at a kept boundary
        is cached (:meth:`_keep_running_state`)."""
        size = self.align
        for request, reach, tokens in zip(ids, positions, prompt, strict=True):
            last = (tokens - 1) // size * size
            if reach in (last, int(self.junction[request])) and reach >= size:
                self._keep_running_state(request, reach, reach // size)

    def _keep_running_state(self, request: int, reach: int, block: int) -> None:
        """Cache the request's running state block, at ``reach`` (``block`` aligned
        blocks), as a STATE entry (or a copy) it references. Past the trace's hashes
        too: vLLM hashes every prompt block."""
        running = self.states[request][-1]
        entry = (STATE, self.entry_keys(request, block - 1, block)[0])
        if running[0] != reach or running[1] is not None:
            return
        running[1] = self._cache_block(entry)
        self.states_this_step.add(entry[1])  # BlockPool's same-step rule, by entry key

    def release(self, ids: np.ndarray) -> None:
        """Give back every block of requests ``ids`` (``[n], int64``): private blocks are
        freed, entries lose a reference (unreferenced ones stay cached, evictable)."""
        for request in ids.tolist():
            refs = self.refs.pop(request, [])
            kept = [block[1] for block in self.states.pop(request, []) if block[1] is not None]
            referenced = sum(self.entry_size(entry) for entry in (*refs, *kept))
            self.free += int(self.held[request]) - referenced
            # vLLM frees a request's blocks group by group, the attention groups first,
            # each group's last block first
            for entry in self._release_order(refs, kept):
                self.entries[entry] -= 1
                if self.entries[entry] == 0:
                    self._unreferenced(entry)
            self.held[request] = 0
            self.registered[request] = 0

    def _release_order(self, refs: list[Hashable], kept: list[Hashable]) -> list[Hashable]:
        """The entries a request releases, in vLLM's order: group by group (attention
        groups in order, then the conv-state blocks), each group's last block first."""
        groups = self.layout.attention_groups
        order = [e for g in range(groups) for e in reversed(refs) if self._group_of(e) == g]
        return [*order, *reversed(kept)]

    def _references(self, request: int) -> list[Hashable]:
        kept = [block[1] for block in self.states.get(request, []) if block[1] is not None]
        return [*self.refs.get(request, []), *kept]

    def check(self, running: np.ndarray, positions: np.ndarray) -> None:
        """:meth:`BlockPool.check`, and the LRU list's block count and the state
        blocks held by running requests only."""
        super().check(running, positions)
        assert self.cached_blocks == sum(self.entry_size(e) for e in self.lru), "LRU blocks"
        assert set(self.states) == set(running.tolist()), "state blocks of a waiting request"
