"""A toy language model whose blocks run the PLE short conv through the :class:`Executor`.

Embedding → ``num_layers`` blocks of [short conv of the normalized hidden
state added into the residual stream, then an MLP] → head, with seeded random
weights. :class:`ToyModelRunner` is the model-runner call an engine (or the
simulator's live mode) drives: a step's :class:`StepBatch` and its input
token ids in, each token's greedy next token out.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from stepplan.planner import ExecutionPlan, GraphKey, Planner, PlannerConfig, StepBatch

from ..graphs import StepGraphs
from ..runtime import Executor


@attrs.frozen
class ToyModelConfig:
    """Shape of the toy model; layer ``l`` belongs to group ``l * num_groups // num_layers``."""

    vocab_size: int = 64
    hidden_size: int = 32
    mlp_size: int = 64
    num_layers: int = 4
    num_groups: int = 2
    kernel_size: int = 4
    dilation: int = 2
    seed: int = 0

    @property
    def layer_groups(self) -> tuple[int, ...]:
        """``[num_layers]`` layer group of each layer."""
        return tuple(layer * self.num_groups // self.num_layers for layer in range(self.num_layers))

    def state_window(self, query_len_max: int) -> int:
        """``W = (K - 1) * D + Q - 1``: the conv-state entries per slot and channel."""
        return (self.kernel_size - 1) * self.dilation + query_len_max - 1


@attrs.frozen
class ToyWeights:
    """Weights of every layer (``C`` hidden, ``H`` MLP, ``V`` vocabulary, ``K`` taps).

    Attributes:
        embedding: ``[V, C]``.
        conv: per layer ``[C, K]``.
        up: per layer ``[C, H]``.
        down: per layer ``[H, C]``.
        head: ``[C, V]``.
    """

    embedding: torch.Tensor
    conv: tuple[torch.Tensor, ...]
    up: tuple[torch.Tensor, ...]
    down: tuple[torch.Tensor, ...]
    head: torch.Tensor


def make_weights(config: ToyModelConfig, dtype: torch.dtype, device: torch.device) -> ToyWeights:
    """Seeded random weights, drawn in fp32 on the CPU so every device gets the same values."""
    gen = torch.Generator().manual_seed(config.seed)
    c, h, v, k = config.hidden_size, config.mlp_size, config.vocab_size, config.kernel_size

    def draw(*shape: int, scale: float) -> torch.Tensor:
        values = torch.randn(*shape, generator=gen) * scale
        return values.to(device=device, dtype=dtype)

    layers = range(config.num_layers)
    return ToyWeights(
        embedding=draw(v, c, scale=1.0),
        conv=tuple(draw(c, k, scale=k**-0.5) for _ in layers),
        up=tuple(draw(c, h, scale=c**-0.5) for _ in layers),
        down=tuple(draw(h, c, scale=h**-0.5) for _ in layers),
        # Wide logits keep greedy choices far from ties, so rounding can't flip them.
        head=draw(c, v, scale=4.0 * c**-0.5),
    )


def new_state_pool(
    num_slots: int, channels: int, window: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A zeroed ``[num_slots, C, W]`` view of memory laid out as vLLM's ``[slot, W, C]``."""
    memory = torch.zeros(num_slots, window, channels, dtype=dtype, device=device)
    return memory.permute(0, 2, 1)


def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)


def _mlp(x: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ up) @ down


def dense_greedy_tokens(
    weights: ToyWeights, config: ToyModelConfig, token_ids: torch.Tensor
) -> torch.Tensor:
    """The oracle: one sequence from scratch with a dense causal ``F.conv1d`` per layer.

    ``token_ids`` ``[T], int64`` → ``[T], int64`` greedy next token after each position.
    """
    hidden = weights.embedding[token_ids]
    reach = (config.kernel_size - 1) * config.dilation
    for layer in range(config.num_layers):
        x = _rms_norm(hidden).T[None]  # [1, C, T]
        conv = F.conv1d(
            F.pad(x, (reach, 0)),
            weights.conv[layer][:, None, :],
            dilation=config.dilation,
            groups=config.hidden_size,
        )
        hidden = hidden + F.silu(conv[0].T)
        hidden = hidden + _mlp(_rms_norm(hidden), weights.up[layer], weights.down[layer])
    return (_rms_norm(hidden) @ weights.head).argmax(dim=-1)


class ToyModelRunner:
    """Runs the toy model for one step at a time; the executor holds its conv state.

    Args:
        model: the model's shape and seed.
        planner: how steps are planned (``Q``, graph mode and sizes).
        num_slots: conv-state slots per layer group, slot 0 (NULL) included.
        device, dtype: where and in what precision the model runs.
        backend: the executor's backend, ``"triton"`` or ``"reference"``.
        use_graphs: capture the whole forward as one CUDA graph per bucket
            (default: on for triton on CUDA).
    """

    def __init__(
        self,
        model: ToyModelConfig,
        planner: PlannerConfig,
        *,
        num_slots: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        backend: str = "reference",
        use_graphs: bool | None = None,
    ) -> None:
        self.model, self.num_slots = model, num_slots
        self.planner = Planner(planner)  # its config: ``self.planner.config``
        self.device = torch.device(device)
        self.weights = make_weights(model, dtype, self.device)
        window = model.state_window(planner.query_len_max)
        self.conv_states = tuple(
            new_state_pool(num_slots, model.hidden_size, window, dtype, self.device)
            for _ in range(model.num_layers)
        )
        self.executor = Executor(
            weights=self.weights.conv,
            layer_groups=model.layer_groups,
            conv_states=self.conv_states,
            dilation=model.dilation,
            config=planner,
            backend=backend,
            use_graphs=use_graphs,
        )
        self._graphs: StepGraphs | None = None
        if self.executor.use_graphs:
            capacity = self.executor.capacity.num_tokens
            self._ids = torch.zeros(capacity, dtype=torch.int64, device=self.device)
            self._out = torch.zeros(capacity, dtype=torch.int64, device=self.device)
            self._graphs = StepGraphs(self.executor, self._forward_static)

    @property
    def captured_graphs(self) -> tuple[GraphKey, ...]:
        """Graph keys whose forward has been captured so far."""
        return self._graphs.captured if self._graphs else ()

    def greedy_tokens(self, batch: StepBatch, token_ids: np.ndarray) -> np.ndarray:
        """Plan ``batch``, run the forward, return every token's greedy next token.

        Args:
            batch: the step (slots index this runner's pools, ``< num_slots``).
            token_ids: ``[batch.num_tokens]`` input ids in the engine's token order.

        Returns:
            ``[batch.num_tokens], int64``; row ``i``'s tokens are
            ``[start_i, start_i + query_lens[i])`` with ``start`` the cumulative query lengths.
        """
        return self.run_plan(self.planner.compile(batch), token_ids)

    def run_plan(self, plan: ExecutionPlan, token_ids: np.ndarray) -> np.ndarray:
        """:meth:`greedy_tokens` for an already compiled plan."""
        tokens = plan.num_tokens
        ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))
        if ids.shape != (tokens,):
            raise ValueError(f"token_ids: must be [{tokens}], got {list(ids.shape)}")
        if tokens and (int(ids.min()) < 0 or int(ids.max()) >= self.model.vocab_size):
            raise ValueError(f"token_ids: must lie in 0..{self.model.vocab_size - 1}")
        if plan.graph is not None and self._graphs is not None:
            self._ids[:tokens].copy_(ids)
            self._graphs.run(plan)
            return self._out[:tokens].cpu().numpy()
        self.executor.prepare(plan)
        return self._forward(ids.to(self.device)).cpu().numpy()

    def _forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """``[T], int64`` ids → ``[T], int64`` greedy next tokens, over the prepared plan."""
        w = self.weights
        hidden = w.embedding[token_ids]
        for layer in range(self.model.num_layers):
            self.executor.conv(layer, _rms_norm(hidden), hidden)  # hidden += silu(conv)
            hidden = hidden + _mlp(_rms_norm(hidden), w.up[layer], w.down[layer])
        return (_rms_norm(hidden) @ w.head).argmax(dim=-1)

    def _forward_static(self, num_tokens: int) -> None:
        # Graph-captured: ids beyond the live tokens are stale but valid, and no plan row
        # names them, so they only produce outputs nobody reads.
        self._out[:num_tokens].copy_(self._forward(self._ids[:num_tokens]))
