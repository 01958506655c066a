"""The KV block pool and the prefix cache: which blocks every request holds, as vLLM v1's
KV cache manager keeps them (``docs/memory.md``).

Blocks are counted, not named. A request holds ``layout.blocks_for(positions)``
blocks for the positions its steps have reached (computed tokens plus the tokens
scheduled, spec drafts included): its attention KV and, where a hybrid model's conv
states share the pool, its state blocks. Part of them may be *entries* of the prefix
cache (``MemoryLayout.entry_tokens`` each: a KV block of an attention-only model, an
aligned block of a hybrid model's, ``MemoryLayout.align_tokens``): an entry
of a hashed prompt block is registered under its key when its blocks are allocated
for the step that computes it, as vLLM 0.33 caches them, and is then shared (where
the key is cached already, the block is cached too, a *copy*: vLLM keeps every block
of a hash, and a hit takes the oldest); a later request -- one admitted later in the same
step included -- whose prompt starts with cached entries references them at
admission, and its computed tokens start after them. An entry
nobody references stays cached, evictable, least recently released first (a
request releases its entries last block first, so a prefix's tail goes before its
head). Blocks are *free*, *private* to one request, or in an entry:
``free + sum(private) + sum(entry sizes) == capacity``. Where a hybrid model's conv
states are blocks of the pool in vLLM's align mode (``memory.align_state_blocks``),
:class:`~stepplan.sim.state_blocks.StateBlockPool` extends this pool through its
hooks (:func:`~stepplan.sim.state_blocks.block_pool` picks the class).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from .memory_sizing import MemoryLayout, cacheable_blocks
from .traces import RequestTable

#: Rows up to which :meth:`BlockPool.grow_all` loops in Python: on a few rows numpy's
#: per-call cost is larger than the work (most steps of a light trace have 1-4 rows).
_FEW_ROWS = 12

#: An aligned entry's key is ``hash * ALIGNED_KEY_SCALE + index``: one key per (hash,
#: index) for indices below 2**32, whose low bits vary with the hash (``hash << 32 |
#: index`` left them to the index alone, so a dict of such keys probed long chains).
ALIGNED_KEY_SCALE = 2**32 + 0x9E3779B1
#: The first item of a copy's entry key, ``(COPY, number, key it copies)``.
COPY = "copy"


def copied_key(entry: Hashable) -> Hashable:
    """The key a copy's entry ``(COPY, number, key)`` copies; any other entry itself."""
    return entry[2] if isinstance(entry, tuple) and entry[0] == COPY else entry


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

    #: Whether each request's conv-state blocks are followed one by one (the subclass).
    tracks_states = False

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
        # unreferenced entries, least recently used first: an OrderedDict pops its head in
        # O(1), where a dict's first key is found past every key deleted before it
        self.lru: OrderedDict[Hashable, None] = OrderedDict()
        self.refs: dict[int, list[Hashable]] = {}  # request -> entries it references, in order
        # key -> the keys of its copies, oldest first: blocks computed again where the key
        # was cached (a prompt of whole cached blocks computes its last one again)
        self.copies: dict[Hashable, list[tuple]] = {}
        # the copies made so far (numbering them), in an array the compiled stepper
        # updates in place
        self.copies_made = np.zeros(1, np.int64)
        self.registered = np.zeros(n, np.int64)  # hashed blocks of a request considered
        self.align = layout.align_tokens if self.caching else 0
        self.kept_states: set[int] = set()  # entries ending where a conv state is kept
        # those kept by the step being scheduled: vLLM's Mamba manager lets no request
        # start from a state that another request writes in the same step
        self.states_this_step: set[int] = set()
        # where the last lookup found a prefix cached for attention past its last kept
        # state: the request keeps a state there (vLLM's shared-prefix junction); [N], int64
        self.junction = np.zeros(n, np.int64)

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
        return len(self.lru) * self._entry_blocks

    def entry_size(self, entry: Hashable) -> int:
        """Blocks of the entry ``entry`` (one size here; the subclass has several)."""
        return self._entry_blocks

    def new_step(self) -> None:
        """A step's scheduling begins: no state has been kept in it yet."""
        self.states_this_step.clear()

    def cache_committed(self, ids: np.ndarray, computed: np.ndarray) -> None:
        """A step with speculation was committed: cache the full entries the rows
        ``ids`` that emitted tokens fill with their ``computed`` tokens (``[n], int64``
        each), as vLLM 0.33 caches such a row's blocks after its output, before it frees a
        finished request (accepted drafts fill blocks its allocation could not cache)."""
        self._cache_entries(ids, computed)

    @property
    def used_blocks(self) -> int:
        """Blocks held by running requests (private and referenced entries)."""
        return self.capacity - self.free - self.cached_blocks

    def grow_all(self, ids: np.ndarray, positions: np.ndarray) -> bool:
        """Grow every request of ``ids`` to ``positions`` (``[n], int64`` each) from free
        blocks only, or change nothing and return ``False``."""
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
        (nothing changed) when even eviction leaves too few blocks. ``computed``: its
        tokens computed (the subclass frees the state blocks it left behind)."""
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

    def _evict(self, blocks: int) -> None:
        while blocks > 0:
            size = self._evicted(self.lru.popitem(last=False)[0])
            self.free += size
            blocks -= size

    def _evicted(self, entry: Hashable) -> int:
        """``entry``, popped from the LRU list, leaves the cache: its blocks. A kept
        state goes with the key's last block."""
        del self.entries[entry]
        key = copied_key(entry)
        if key is not entry:
            copies = self.copies[key]
            copies.remove(entry)
            if not copies:
                del self.copies[key]
        if not self._block_cached(key):
            self.kept_states.discard(key)
        return self._entry_blocks

    def entry_keys(self, request: int, first: int, stop: int) -> list[Hashable]:
        """Keys of the request's prefix-cache entries ``first`` to ``stop`` (exclusive).
        Within its trace hashes (the first ``hashed`` entries), entry ``j`` of the trace
        hash ``h`` is ``h * entries_per_hash + j``; where entries do not divide hashed
        blocks (``align``), entry ``i`` is keyed by ``i`` and the hash of the hashed block
        holding its last token (:data:`ALIGNED_KEY_SCALE`; that hash stands for every
        token before it). Past them (the rest of the prompt and the output, which no
        other request shares) entry ``j`` is ``(request, j)``."""
        hashed = int(self.hashed[request])
        keys: list[Hashable] = []
        if first < hashed:
            keys.extend(self._trace_keys(request, first, min(stop, hashed)))
        keys.extend((request, j) for j in range(max(first, hashed), stop))
        return keys

    def _trace_keys(self, request: int, first: int, stop: int) -> list[int]:
        """:meth:`entry_keys` within the request's trace hashes."""
        start = int(self.prefix_offsets[request])  # type: ignore[index]
        return self._keys_of(self.prefix_hashes, start, first, stop)  # type: ignore[arg-type]

    def _keys_of(self, hashes: np.ndarray, start: int, first: int, stop: int) -> list[int]:
        """Keys of entries ``first`` to ``stop`` of a prompt whose trace hashes start at
        ``hashes[start]`` (``[k], int64``): :meth:`entry_keys`'s rule."""
        if self.align:
            size, hashed = self.align, self.layout.prefix_block_tokens
            return [
                int(hashes[start + (size * i + size - 1) // hashed]) * ALIGNED_KEY_SCALE + i
                for i in range(first, stop)
            ]
        per = self._per_hash
        hashes = hashes[start + first // per : start + (stop + per - 1) // per]
        if per == 1:
            return hashes.tolist()
        keys = [h * per + j for h in hashes.tolist() for j in range(per)]
        skip = first % per
        return keys[skip : skip + stop - first]

    def hashes_cached(self, hashes: list[int]) -> int:
        """The leading run of trace hashes (a prompt's, in order) whose every token is
        cached, in entries of any size (aligned ones included)."""
        block = self.layout.prefix_block_tokens
        count = len(hashes) * block // self._entry_tokens
        run = 0
        for key in self._keys_of(np.asarray(hashes, np.int64), 0, 0, count):
            if not self._entry_cached(key):
                break
            run += 1
        return run * self._entry_tokens // block

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
            if not self._entry_cached(entry):
                break
            hits.append(entry)
        if self.align:
            run = len(hits)
            while hits and not self._state_kept(hits[-1]):
                hits.pop()
            self.junction[request] = run * self.align if run > len(hits) else 0
        return hits

    def _entry_cached(self, entry: Hashable) -> bool:
        """The entry ``entry`` is cached (a hit may take it)."""
        return self._block_cached(entry)

    def _block_cached(self, key: Hashable) -> bool:
        """Some block of ``key`` is cached: the entry, or a copy of it."""
        return key in self.entries or key in self.copies

    def _block_taken(self, key: Hashable) -> Hashable:
        """The cached block a hit on ``key`` takes: the entry, else its oldest copy
        (vLLM's ``get_one_block``: the first block cached under a hash)."""
        return key if key in self.entries else self.copies[key][0]

    def _cache_block(self, key: Hashable) -> Hashable:
        """Cache a block of ``key`` referenced once: the entry, or a copy where the key
        is cached already; its entry key."""
        if self._block_cached(key):
            self.copies_made[0] += 1
            copy = (COPY, int(self.copies_made[0]), key)
            self.copies.setdefault(key, []).append(copy)
            key = copy
        self.entries[key] = 1
        return key

    def _state_kept(self, entry: Hashable) -> bool:
        """A conv state is kept where the entry ``entry`` ends (align mode)."""
        return entry in self.kept_states

    def admit(self, request: int, hits: list[int], positions: int, whole: int) -> bool:
        """Reference the entries ``hits`` (from :meth:`lookup`) and grow to
        ``positions``; ``False`` and nothing changed unless the free and evictable blocks
        hold the blocks for ``whole`` (the request's whole prompt, as vLLM admits), or
        when the hit ends on a conv state kept in this very step (vLLM admits it in a
        later step)."""
        if hits and hits[-1] in self.states_this_step:
            return False
        hits = [self._block_taken(key) for key in hits]
        base = len(hits) * self._entry_blocks
        reach = max(whole, positions)  # positions pass it by placeholder drafts
        delta = int(self.layout.blocks_for(reach)) - base
        reclaimed = sum(entry in self.lru for entry in hits)  # would no longer be evictable
        if delta > self.free + (len(self.lru) - reclaimed) * self._entry_blocks:
            return False
        for entry in hits:
            self.entries[entry] += 1
            self.lru.pop(entry, None)
        if hits:
            self.refs[request] = list(hits)
        self.registered[request] = len(hits)
        self.held[request] = base
        grown = self.grow(request, positions)
        assert grown, "admission was checked"
        return True

    def register(
        self, ids: np.ndarray, positions: np.ndarray, prompt: np.ndarray, emitted: np.ndarray
    ) -> None:
        """Cache the entries requests ``ids`` fill up to ``positions`` with tokens known
        (their ``prompt`` and ``emitted`` tokens, drafts not; ``[n], int64`` each): as
        vLLM, when the blocks are allocated for the step that computes them, so a request
        admitted later in the same step hits them. Every full entry is cached, output
        tokens' too (a preempted request hits its own). A block whose key is cached
        already is cached as a copy."""
        if not self.caching:
            return
        reach = np.minimum(positions, prompt + emitted)
        if self.align:
            self._keep_states(ids.tolist(), reach.tolist(), prompt.tolist())
        self._cache_entries(ids, reach)

    def _cache_entries(self, ids: np.ndarray, reach: np.ndarray) -> None:
        """Cache the blocks of the full entries of requests ``ids`` up to ``reach``
        (``[n], int64``); one whose key is cached already is cached again, a copy."""
        done = reach // self._entry_tokens
        for row in np.flatnonzero(done > self.registered[ids]).tolist():
            request, upto = int(ids[row]), int(done[row])
            first = int(self.registered[request])
            refs = self.refs.setdefault(request, [])
            for key in self.entry_keys(request, first, upto):
                refs.extend(self._cache_block(block) for block in self._group_blocks(key))
            self.registered[request] = upto

    def _group_blocks(self, key: Hashable) -> list[Hashable]:
        """The keys of an entry's blocks: here the entry is one block of every group,
        keyed by ``key`` (the subclass caches each group's block apart)."""
        return [key]

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
            if reach in (last, int(self.junction[request])) and 0 < block <= self.hashed[request]:
                kept = self.entry_keys(request, block - 1, block)
                self.kept_states.update(kept)
                self.states_this_step.update(kept)

    def release(self, ids: np.ndarray) -> None:
        """Give back every block of requests ``ids`` (``[n], int64``): private blocks are
        freed, entries lose a reference (unreferenced ones stay cached, evictable)."""
        if not self.refs:
            self.free += int(self.held[ids].sum())
            self.held[ids] = 0
            if self.caching:
                self.registered[ids] = 0
            return
        for request in ids.tolist():
            refs = self.refs.pop(request, [])
            self.free += int(self.held[request]) - len(refs) * self._entry_blocks
            for entry in reversed(refs):
                self.entries[entry] -= 1
                if self.entries[entry] == 0:
                    self.lru[entry] = None
            self.held[request] = 0
            self.registered[request] = 0

    def check(self, running: np.ndarray, positions: np.ndarray) -> None:
        """Assert the accounting: ``running`` (``[n], int64``) are the requests holding
        blocks, ``positions`` (``[n], int64``) the positions each must cover."""
        held = self.held[running]
        refs = [self._references(r) for r in running.tolist()]
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

    def _references(self, request: int) -> list[Hashable]:
        """The entries ``request`` references."""
        return self.refs.get(request, [])
