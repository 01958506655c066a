"""The KV block pool and the prefix cache: which blocks every request holds, as vLLM v1's
KV cache manager keeps them (``docs/memory.md``).

Blocks are counted, not named. A request holds ``layout.blocks_for(positions)``
blocks for the positions its steps have reached (computed tokens plus the tokens
scheduled, spec drafts included): its attention KV and, where a hybrid model's conv
states share the pool, its state blocks. Part of them may be *entries* of the prefix
cache (``MemoryLayout.entry_tokens`` each: a KV block of an attention-only model, an
aligned block of a hybrid model's, ``MemoryLayout.align_tokens``): an entry
of a hashed prompt block is registered under its key (unless that key is cached
already) when its blocks are allocated for the step that computes it, as vLLM 0.33
caches them, and is then shared; a later request -- one admitted later in the same
step included -- whose prompt starts with cached entries references them at
admission, and its computed tokens start after them. An entry
nobody references stays cached, evictable, least recently released first (a
request releases its entries last block first, so a prefix's tail goes before its
head). Blocks are *free*, *private* to one request, or in an entry:
``free + sum(private) + sum(entry sizes) == capacity``.

Where a hybrid model's conv states are blocks of the one pool in vLLM's align mode
(``MemoryLayout.align_state_blocks``) each request's state blocks are followed one by
one (:attr:`BlockPool.states`): a running request holds ``1 + num_spec_tokens`` of
them per conv-state group; when its positions cross into a new aligned block it
takes one more and the one it left is given back at its next allocation (vLLM frees
it there, before counting what that allocation needs). A state block at a kept
boundary is an entry of its own (:data:`STATE`, ``MemoryLayout.state_groups``
blocks), cached while the request holds it and evictable in the same LRU list as
the attention entries once nobody does; a hit references it and gives it back at
the request's next allocation. A hit on a state cached in the same step is refused
for that step, as vLLM refuses it. A block computed again where its key is cached
already (a hit cut back to a kept state leaves cached blocks to compute) is cached
too, as a *copy* (:data:`COPY`): vLLM keeps every block of a hash, and a hit takes
the oldest. Tracking states, an attention entry is one block per attention group
(:data:`GROUP`), cached, freed and evicted on its own as vLLM's groups keep them; a
hit needs the entry's block in every group.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from .memory_sizing import MemoryLayout, cacheable_blocks
from .traces import RequestTable

#: The first item of a kept conv state's entry key, ``(STATE, key of the attention
#: entry it ends)``: the attention entry and the state entry are cached apart.
STATE = "state"
#: The first item of a copy's entry key, ``(COPY, number, key it copies)``.
COPY = "copy"
#: The first item of one attention group's block of an entry, ``(GROUP, group, key)``
#: (tracking states; the other layouts key an entry of every group's blocks as one).
GROUP = "group"

#: Rows up to which :meth:`BlockPool.grow_all` loops in Python: on a few rows numpy's
#: per-call cost is larger than the work (most steps of a light trace have 1-4 rows).
_FEW_ROWS = 12


def aligned_chunk(start: int, tokens: int, prompt_end: int, size: int, junction: int) -> int:
    """Tokens of a prefill chunk of ``tokens`` from ``start`` in vLLM's "align" mode
    (``MemoryLayout.align_tokens`` = ``size``; 0: none fit). A chunk that stops short of
    ``prompt_end`` (the tokens to compute) ends on a multiple of ``size``, where the
    state is written; none runs past the prompt's last aligned boundary before its last
    token (the state kept for a later request), past its ``junction`` (0: none), or,
    starting mid-block, past the next boundary."""
    if start >= prompt_end:
        return tokens
    end = start + tokens
    if end < prompt_end:
        end = end // size * size
    stops = (
        (start // size + 1) * size if start % size else 0,
        (prompt_end - 1) // size * size,
        start + (junction - start) // size * size if start < junction < end else 0,
    )
    end = min((stop for stop in stops if start < stop < end), default=end)
    return max(end - start, 0)


class BlockPool:
    """The pool's mutable state over one run; per-request arrays are ``[N]`` by id.

    Attributes:
        layout: the split of memory (block counts, prefix settings).
        free_blocks: ``[1], int64`` free blocks (evictable entries not counted), which
            :attr:`free` reads and writes.
        held: ``[N], int64`` blocks each request's block table covers (private and
            referenced entries); 0 while it is not running.
    """

    def __init__(self, layout: MemoryLayout, table: RequestTable) -> None:
        n = table.num_requests
        self.layout = layout
        self.capacity = layout.num_blocks
        # the free count in an array: the compiled stepper updates it in place
        self.free_blocks = np.array([layout.num_blocks], np.int64)
        self.held = np.zeros(n, np.int64)
        self.caching = layout.prefix_caching
        # prefix-cache entries of each prompt (layout.cacheable_entries)
        self.hashed = cacheable_blocks(table, layout) if self.caching else np.zeros(n, np.int64)
        # the trace's prompt block hashes: request r's are hashes[offsets[r]:offsets[r + 1]]
        self.prefix_offsets, self.prefix_hashes = table.prefix_offsets, table.prefix_blocks
        self._entry_blocks = layout.entry_blocks
        self._entry_tokens, self._per_hash = layout.entry_tokens, layout.entries_per_hash
        self.entries: dict[Hashable, int] = {}  # entry key -> requests referencing it
        self._lru_blocks = 0  # blocks of the entries in self.lru (kept where tracking states)
        # where tracking states: key -> its copies, oldest first (none in another mode)
        self.copies: dict[Hashable, list[tuple]] = {}
        self._copies_made = 0
        # unreferenced entries, least recently used first: an OrderedDict pops its head in
        # O(1), where a dict's first key is found past every key deleted before it
        self.lru: OrderedDict[Hashable, None] = OrderedDict()
        self.refs: dict[int, list[Hashable]] = {}  # request -> entries it references, in order
        self.registered = np.zeros(n, np.int64)  # hashed blocks of a request considered
        self.align = layout.align_tokens if self.caching else 0
        self.kept_states: set[int] = set()  # entries ending where a conv state is kept
        # where the last lookup found a prefix cached for attention past its last kept
        # state: the request keeps a state there (vLLM's shared-prefix junction); [N], int64
        self.junction = np.zeros(n, np.int64)
        # align_state_blocks: blocks of one conv state, the speculative state blocks a
        # running request holds besides its running one, and each request's state
        # blocks (see the module docstring)
        self.tracks_states = layout.align_state_blocks
        self._state_size = layout.state_groups
        self._spec_blocks = layout.state_blocks - layout.state_groups
        # request -> its state blocks, ascending, the running one last: [end, entry]
        # (the position the state is at, its STATE entry key or None while private)
        self.states: dict[int, list[list]] = {}
        self.cached_this_step: set[Hashable] = set()  # STATE entries cached this step

    @property
    def free(self) -> int:
        """Free blocks (evictable entries not counted)."""
        return int(self.free_blocks[0])

    @free.setter
    def free(self, blocks: int) -> None:
        self.free_blocks[0] = blocks

    @property
    def cached_blocks(self) -> int:
        """Blocks of unreferenced (evictable) entries."""
        if self.tracks_states:  # entries of two sizes: their blocks are counted
            return self._lru_blocks
        # one size: the compiled stepper, which edits the LRU list, keeps no count
        return len(self.lru) * self._entry_blocks

    def entry_size(self, entry: Hashable) -> int:
        """Blocks of the entry ``entry``: a kept conv state's, or an attention entry's."""
        if isinstance(entry, tuple) and entry[0] == COPY:
            entry = entry[2]
        if isinstance(entry, tuple) and entry[0] == STATE:
            return self._state_size
        if isinstance(entry, tuple) and entry[0] == GROUP:
            return 1
        return self._entry_blocks

    def _group_blocks(self, key: Hashable) -> list[Hashable]:
        """The keys of an attention entry's blocks: one per attention group where
        tracking states, else the entry itself."""
        if not self.tracks_states:
            return [key]
        return [(GROUP, group, key) for group in range(self.layout.attention_groups)]

    def _group_of(self, entry: Hashable) -> int:
        """The attention group of a block key (-1: a state's)."""
        if isinstance(entry, tuple) and entry[0] == COPY:
            entry = entry[2]
        return entry[1] if isinstance(entry, tuple) and entry[0] == GROUP else -1

    def is_cached(self, key: Hashable) -> bool:
        """Some block of ``key`` is cached (the entry, or a copy of it)."""
        return key in self.entries or key in self.copies

    def _block_of(self, key: Hashable) -> Hashable:
        """The cached block a hit on ``key`` takes: the entry, else its oldest copy."""
        return key if key in self.entries else self.copies[key][0]

    def _cache(self, key: Hashable) -> Hashable:
        """Cache a block of ``key`` referenced once: the entry, or where that is cached
        already (tracking states) a copy; returns its entry key."""
        if self.is_cached(key):
            self._copies_made += 1
            copy = (COPY, self._copies_made, key)
            self.copies.setdefault(key, []).append(copy)
            key = copy
        self.entries[key] = 1
        return key

    def _unreferenced(self, entry: Hashable) -> None:
        """``entry`` lost its last reference: the tail of the LRU list."""
        self.lru[entry] = None
        self._lru_blocks += self.entry_size(entry)

    def _referenced(self, entry: Hashable) -> None:
        """``entry`` gains a reference: out of the LRU list where it was there."""
        self.entries[entry] += 1
        if self.entries[entry] == 1 and entry in self.lru:
            del self.lru[entry]
            self._lru_blocks -= self.entry_size(entry)

    def new_step(self) -> None:
        """A step's scheduling begins: states cached before it may be hit."""
        self.cached_this_step.clear()

    @property
    def used_blocks(self) -> int:
        """Blocks held by running requests (private and referenced entries)."""
        return self.capacity - self.free - self.cached_blocks

    def grow_all(self, ids: np.ndarray, positions: np.ndarray) -> bool:
        """Grow every request of ``ids`` to ``positions`` (``[n], int64`` each) from free
        blocks only, or change nothing and return ``False``. Tracking state blocks it
        returns ``False``: every request then grows in turn (:meth:`grow`), as vLLM
        allocates, freeing the state blocks it left before its own allocation."""
        if self.tracks_states:
            return False
        if ids.size <= _FEW_ROWS and not self.layout.state_blocks:
            return self._grow_few(ids.tolist(), positions.tolist())
        held = self.held[ids]
        delta = self.layout.blocks_for(positions) - held
        if not ids.size or delta.max() <= 0:
            return True  # most steps: no row enters a new block
        np.maximum(delta, 0, out=delta)  # a row with fewer drafts than before keeps its blocks
        total = int(delta.sum())
        if total > self.free:
            return False
        self.free -= total
        self.held[ids] = held + delta
        return True

    def _grow_few(self, ids: list[int], positions: list[int]) -> bool:
        """:meth:`grow_all` for a few rows without kept states, in plain Python."""
        held, size = self.held, self.layout.block_size
        total, grows = 0, []
        for request, reach in zip(ids, positions, strict=True):
            delta = (reach + size - 1) // size - int(held[request])  # layout.kv_blocks, inlined
            if delta > 0:
                total += delta
                grows.append((request, delta))
        if total > self.free:
            return False
        self.free -= total
        for request, delta in grows:
            held[request] += delta
        return True

    def admit_all(self, ids: np.ndarray, positions: np.ndarray, whole: np.ndarray) -> int:
        """Admit the longest leading run of new requests ``ids``, each taking the blocks
        for ``positions`` (``[n], int64``, its first chunk) and admitted only while the
        free blocks, less those its predecessors took, hold the blocks for ``whole``
        (``[n], int64``, its whole prompt: vLLM's ``scheduler_reserve_full_isl``);
        returns its length. Only without prefix caching (nothing evictable)."""
        need = self.layout.blocks_for(positions)
        ends = np.cumsum(need)
        fits = ends - need + self.layout.blocks_for(whole) <= self.free
        count = int(fits.argmin()) if not fits.all() else ids.size
        if count:
            self.free -= int(ends[count - 1])
            self.held[ids[:count]] = need[:count]
        return count

    def grow(self, request: int, positions: int, computed: int = 0) -> bool:
        """Grow one request to ``positions``, evicting cached entries if need be; ``False``
        (nothing changed) when even eviction leaves too few blocks. Tracking state
        blocks, the request (``computed`` tokens computed) first gives back the state
        blocks it left behind, whether it then grows or not."""
        if self.tracks_states:
            return self._grow_states(request, positions, computed)
        need = int(self.layout.blocks_for(positions))
        delta = need - int(self.held[request])
        if delta <= 0:
            return True
        if delta > self.free + self.cached_blocks:
            return False
        self._evict(delta - self.free)
        self.free -= delta
        self.held[request] = need
        return True

    def _grow_states(self, request: int, positions: int, computed: int) -> bool:
        """:meth:`grow` tracking state blocks: the KV blocks of every attention group
        for ``positions`` and one state block more when they cross into a new aligned
        block (its state goes there; the running one is left, given back later)."""
        self._give_back_left(request, computed)
        states = self.states[request]
        kv = int(self.held[request]) - self._state_size * len(states) - self._spec_blocks
        new_kv = max(int(self.layout.kv_blocks(positions)) - kv, 0)
        end = -(-positions // self.align) * self.align  # where the state block ends
        new_state = self._state_size if end > states[-1][0] else 0
        delta = new_kv + new_state
        if delta > self.free + self._lru_blocks:
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

    def _evict(self, blocks: int) -> None:
        while blocks > 0:
            entry = self.lru.popitem(last=False)[0]
            del self.entries[entry]
            if isinstance(entry, tuple) and entry[0] == COPY:
                copies = self.copies[entry[2]]
                copies.remove(entry)
                if not copies:
                    del self.copies[entry[2]]
            self.kept_states.discard(entry)
            size = self.entry_size(entry)
            self._lru_blocks -= size
            self.free += size
            blocks -= size

    def entry_keys(self, request: int, first: int, stop: int) -> list[Hashable]:
        """Keys of the request's prefix-cache entries ``first`` to ``stop`` (exclusive).
        Within its trace hashes (the first ``hashed`` entries), entry ``j`` of the trace
        hash ``h`` is ``h * entries_per_hash + j``; where entries do not divide hashed
        blocks (``align``), entry ``i`` is keyed by ``i`` and the hash of the hashed block
        holding its last token (that hash stands for every token before it). Past them
        (the rest of the prompt and the output, which no other request shares) entry
        ``j`` is ``(request, j)``."""
        hashed = int(self.hashed[request])
        keys: list[Hashable] = []
        if first < hashed:
            keys.extend(self._trace_keys(request, first, min(stop, hashed)))
        keys.extend((request, j) for j in range(max(first, hashed), stop))
        return keys

    def _trace_keys(self, request: int, first: int, stop: int) -> list[int]:
        """:meth:`entry_keys` within the request's trace hashes."""
        per = self._per_hash
        start = int(self.prefix_offsets[request])  # type: ignore[index]
        if self.align:
            size, hashed = self.align, self.layout.prefix_block_tokens
            hashes = self.prefix_hashes  # type: ignore[index]
            return [
                int(hashes[start + (size * i + size - 1) // hashed]) << 32 | i  # type: ignore[index]
                for i in range(first, stop)
            ]
        hashes = self.prefix_hashes[start + first // per : start + (stop + per - 1) // per]  # type: ignore[index]
        if per == 1:
            return hashes.tolist()
        keys = [h * per + j for h in hashes.tolist() for j in range(per)]
        skip = first % per
        return keys[skip : skip + stop - first]

    def hashes_cached(self, hashes: list[int]) -> int:
        """The leading run of trace hashes whose every entry is cached."""
        per, run = self._per_hash, 0
        for entry in hashes:
            if any(entry * per + j not in self.entries for j in range(per)):
                break
            run += 1
        return run

    def lookup(self, request: int, limit_tokens: int) -> list[int]:
        """The cached entries the request's prompt starts with, at most
        ``(limit_tokens - 1) // entry_tokens`` of them (a hit leaves at least one token
        to compute, and ends where a conv state was kept). Aligned, it sets the
        request's :attr:`junction`."""
        if not self.caching:
            return []
        count = (limit_tokens - 1) // self._entry_tokens
        hits = []
        for entry in self.entry_keys(request, 0, count):
            if not all(self.is_cached(block) for block in self._group_blocks(entry)):
                break
            hits.append(entry)
        if self.align:
            run = len(hits)
            while hits and not self._state_kept(hits[-1]):
                hits.pop()
            self.junction[request] = run * self.align if run > len(hits) else 0
        return hits

    def _state_kept(self, entry: Hashable) -> bool:
        """A conv state is kept where the attention entry ``entry`` ends."""
        if self.tracks_states:
            return self.is_cached((STATE, entry))
        return entry in self.kept_states

    def admit(self, request: int, hits: list[int], positions: int, whole: int) -> bool:
        """Reference the entries ``hits`` (from :meth:`lookup`) and grow to
        ``positions``; ``False`` and nothing changed unless the free and evictable blocks
        hold the blocks for ``whole`` (the request's whole prompt, as vLLM admits).
        Tracking state blocks it also references the hit's state (refused when that
        state was cached in this step)."""
        if self.tracks_states:
            return self._admit_states(request, hits, positions, whole)
        base = len(hits) * self._entry_blocks
        reach = max(whole, positions)  # positions pass it by placeholder drafts
        delta = int(self.layout.blocks_for(reach)) - base
        reclaimed = sum(self.entry_size(entry) for entry in hits if entry in self.lru)
        if delta > self.free + self.cached_blocks - reclaimed:  # reclaimed: no longer evictable
            return False
        for entry in hits:
            self._referenced(entry)
        if hits:
            self.refs[request] = list(hits)
        self.registered[request] = len(hits)
        self.held[request] = base
        grown = self.grow(request, positions)
        assert grown, "admission was checked"
        return True

    def _admit_states(self, request: int, hits: list[int], positions: int, whole: int) -> bool:
        """:meth:`admit` tracking state blocks: the request holds the hit's state
        (an entry, given back at its next allocation), ``1 + num_spec_tokens`` state
        blocks of its own and its KV blocks past the hit."""
        state = (STATE, hits[-1]) if hits else None
        if state in self.cached_this_step:
            return False  # vLLM: its state is not written before this step ends
        base = len(hits) * self._entry_blocks
        count = len(hits)
        hits = [self._block_of(block) for entry in hits for block in self._group_blocks(entry)]
        if state is not None:
            state = self._block_of(state)
        referenced = [*hits, state] if hits else []
        reach = max(whole, positions)  # positions pass it by placeholder drafts
        need = int(self.layout.blocks_for(reach)) - base
        reclaimed = sum(self.entry_size(entry) for entry in referenced if entry in self.lru)
        if need > self.free + self._lru_blocks - reclaimed:
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

    def register(
        self, ids: np.ndarray, positions: np.ndarray, prompt: np.ndarray, emitted: np.ndarray
    ) -> None:
        """Cache the entries requests ``ids`` fill up to ``positions`` with tokens known
        (their ``prompt`` and ``emitted`` tokens, drafts not; ``[n], int64`` each): as
        vLLM, when the blocks are allocated for the step that computes them, so a request
        admitted later in the same step hits them. Every full entry is cached, output
        tokens' too (a preempted request hits its own). An entry already cached stays
        private (tracking states: is cached again, a copy)."""
        if not self.caching:
            return
        reach = np.minimum(positions, prompt + emitted)
        if self.align:
            self._keep_states(ids.tolist(), reach.tolist(), prompt.tolist())
        self._cache_entries(ids, reach)

    def cache_committed(self, ids: np.ndarray, computed: np.ndarray) -> None:
        """Tracking states with speculation: cache the entries the rows ``ids`` that
        emitted tokens in the step just committed fill with their ``computed`` tokens
        (``[n], int64`` each). vLLM caches such a row's blocks again after its output,
        before it frees a finished request, so a finishing request's last blocks are
        cached too. (The other layouts, held equal to the compiled stepper, do not.)"""
        if self.tracks_states and self._spec_blocks:
            self._cache_entries(ids, computed)

    def _cache_entries(self, ids: np.ndarray, reach: np.ndarray) -> None:
        """Cache the full entries of requests ``ids`` up to ``reach`` (``[n], int64``)."""
        done = reach // self._entry_tokens
        for row in np.flatnonzero(done > self.registered[ids]).tolist():
            request, upto = int(ids[row]), int(done[row])
            first = int(self.registered[request])
            refs = self.refs.setdefault(request, [])
            for entry in self.entry_keys(request, first, upto):
                if self.tracks_states:
                    refs.extend(self._cache(block) for block in self._group_blocks(entry))
                elif entry not in self.entries:
                    self.entries[entry] = 1
                    refs.append(entry)
            self.registered[request] = upto

    def aligned_chunk(self, request: int, start: int, tokens: int, prompt_end: int) -> int:
        """:func:`aligned_chunk` for ``request`` (its :attr:`junction`)."""
        return aligned_chunk(start, tokens, prompt_end, self.align, int(self.junction[request]))

    def aligned_wants(
        self,
        run: np.ndarray,
        want: np.ndarray,
        prefilling: np.ndarray,
        computed: np.ndarray,
        target: np.ndarray,
        budget: int,
    ) -> np.ndarray:
        """Cut the running rows' ``want`` (``[n], int64``, in place) to ``budget`` in
        order, prefill chunks from ``computed`` toward ``target`` aligned
        (:meth:`aligned_chunk`); ``[n], bool`` the rows that get tokens (vLLM skips a
        request with no aligned chunk and goes on to the next)."""
        keep = np.zeros(run.size, bool)
        left = budget
        for row, request in enumerate(run.tolist()):
            tokens = min(int(want[row]), left)
            if prefilling[row] and tokens > 0:
                tokens = self.aligned_chunk(request, int(computed[row]), tokens, int(target[row]))
            want[row], keep[row] = tokens, tokens > 0
            left -= tokens
        return keep

    def _keep_states(self, ids: list[int], positions: list[int], prompt: list[int]) -> None:
        """Aligned: a request reaching its prompt's last aligned boundary before the
        last token, or its :attr:`junction`, keeps the conv state there (vLLM 0.33
        keeps no other: its retention interval is 0)."""
        size = self.align
        for request, reach, tokens in zip(ids, positions, prompt, strict=True):
            last = (tokens - 1) // size * size
            block = reach // size
            if reach not in (last, int(self.junction[request])) or block == 0:
                continue
            if self.tracks_states:
                self._keep_running_state(request, reach, block)
            elif block <= self.hashed[request]:
                self.kept_states.update(self.entry_keys(request, block - 1, block))

    def _keep_running_state(self, request: int, reach: int, block: int) -> None:
        """Cache the request's running state block, at ``reach`` (``block`` aligned
        blocks), as a STATE entry (or a copy) it references. Past the trace's hashes
        too: vLLM hashes every prompt block."""
        running = self.states[request][-1]
        entry = (STATE, self.entry_keys(request, block - 1, block)[0])
        if running[0] != reach or running[1] is not None:
            return
        running[1] = self._cache(entry)
        self.cached_this_step.add(entry)

    def release(self, ids: np.ndarray) -> None:
        """Give back every block of requests ``ids`` (``[n], int64``): private blocks are
        freed, entries lose a reference (unreferenced ones stay cached, evictable)."""
        if not self.refs and not self.states:
            self.free += int(self.held[ids].sum())
            self.held[ids] = 0
            if self.caching:
                self.registered[ids] = 0
            return
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
        if not self.tracks_states:
            return [*reversed(refs), *reversed(kept)]
        groups = self.layout.attention_groups
        order = [e for g in range(groups) for e in reversed(refs) if self._group_of(e) == g]
        return [*order, *reversed(kept)]

    def check(self, running: np.ndarray, positions: np.ndarray) -> None:
        """Assert the accounting: ``running`` (``[n], int64``) are the requests holding
        blocks, ``positions`` (``[n], int64``) the positions each must cover."""
        held = self.held[running]
        refs = [
            [*self.refs.get(r, []), *(b[1] for b in self.states.get(r, []) if b[1] is not None)]
            for r in running.tolist()
        ]
        size = self.entry_size
        private = held - np.array([sum(size(e) for e in r) for r in refs], np.int64)
        total = self.free + int(private.sum()) + sum(size(e) for e in self.entries)
        assert self.free >= 0 and (private >= 0).all(), "negative block count"
        assert total == self.capacity, f"blocks leaked: {total} accounted of {self.capacity}"
        assert self.held.sum() == held.sum(), "a request that is not running holds blocks"
        assert (held >= self.layout.blocks_for(positions)).all(), "positions without blocks"
        counts: dict[int, int] = {}
        for entry in (e for r in refs for e in r):
            counts[entry] = counts.get(entry, 0) + 1
        assert counts == {e: c for e, c in self.entries.items() if c}, "entry references"
        assert set(self.lru) == {e for e, c in self.entries.items() if not c}, "LRU list"
        if self.tracks_states:
            assert self._lru_blocks == sum(size(e) for e in self.lru), "LRU blocks"
            assert set(self.states) == set(running.tolist()), "state blocks of a waiting request"
