"""A continuous-batching scheduler modelled on vLLM v1's, with speculative decoding,
a KV-cache memory model, preemption by recompute and prefix caching.

Each step (:meth:`Scheduler.schedule`):

1. **Running requests first**, in admission order. A request still in its prompt
   asks for the rest of it (chunked prefill); a decoding request asks for one
   token plus ``k = min(num_spec_tokens, tokens_left - 1)`` drafts (fewer near the
   end of its output, so it never overshoots). Requests take what they ask while the
   token budget ``max_num_batched_tokens`` lasts, the spec lookahead included; the
   request that meets the end of the budget gets the remainder (a shorter chunk, or
   fewer drafts) and the rest wait for the next step.
2. **Memory** (with a :class:`~stepplan.sim.memory.BlockPool`): a scheduled request
   holds KV blocks for ``num_computed + q`` positions (drafts included), allocated
   as it grows. When the pool cannot cover a running request, the most recently
   admitted running request is *preempted* (possibly the request itself, which then
   stops the pass): its blocks and slot are freed and it goes to the front of the
   waiting queue with ``num_computed = 0``; when admitted again it prefills its
   prompt *and* the tokens it emitted (its new ``target``), and the step completing
   that prefill emits its next token. A step that preempted admits nobody.
3. **Then waiting requests**, preempted ones first, then new ones in the admission
   policy's order (``scheduler.policy``, ``sim/admission.py``: first come first served
   by default; with an age limit, a request that waited longer goes first), while
   budget, ``max_num_seqs`` and a free slot remain and the free blocks hold its whole
   prompt (vLLM 0.33's ``scheduler_reserve_full_isl``), though it takes only its first
   chunk's; no request overtakes the one the policy puts first. With speculation, a
   request admitted with one token left to compute is padded to ``1 + k`` rows of
   placeholder drafts when running requests run (none of them in its prompt) or a
   prefix hit started it, as vLLM keeps its full CUDA graph; the row computes that one
   token and emits one (no budget for ``1 + k``: admission stops). A prefix-cache hit makes
   the cached prompt blocks computed at admission (leaving at least one token). A
   request takes a slot of the pool (``1..slot capacity``; 0 is NULL) when admitted
   and gives it back when it finishes or is preempted.

Spec rows: ``num_draft_tokens = k``, ``q = k + 1`` (the last emitted token and the
drafts), ``num_accepted_tokens`` = ``a + 1`` for the ``a`` drafts its previous spec
step accepted (1 on its first). A request's first step after its prompt is already a
spec row, and it stays spec (possibly with 0 drafts) to its end, as SPEC §2's state
offset rule requires. With ``num_spec_tokens == 0`` decoding rows are plain decodes.

After the step (:meth:`Scheduler.commit`) a spec row has committed ``1 + a`` tokens
(the fed token and the accepted drafts; rejected drafts are fed again next step as
new positions) and emitted ``a + 1``; a decode row committed and emitted one; a
prefill chunk committed its ``q`` tokens and emits an output token when it
completes the target. Over a request's life every position of its prompt and output
but the last output token is committed, ``prompt + output - 1`` in all, plus the
tokens it recomputed after preemptions, less those the prefix cache saved it
(``requests.csv``'s ``recomputed_tokens`` and ``cached_tokens``). Positions never
pass ``prompt + output - 1``, so a recompute never exceeds the model's length.
"""

from .core import Scheduler
from .step import ScheduledStep, StepMemory

__all__ = ["ScheduledStep", "Scheduler", "StepMemory"]
