"""Model presets: every dimension of the hybrid models the engine builds and the cost model
describes, as plain read-only data (nothing here imports torch or ``stepplan.executor``).

Each preset names ``layer_kinds`` (one ``"conv"`` or ``"attention"`` per layer), then
``hidden_size``, ``conv_channels`` (``C``), ``conv_kernel_size`` (``K``),
``conv_dilation`` (``D``), ``mlp_size``, ``num_heads``, ``num_kv_heads``, ``head_dim``,
``vocab_size``, ``dtype``, ``max_model_len`` and ``rope_theta``: exactly the fields of
``stepplan.executor.model.ModelShape`` but its ``seed``.

Every layer is a pre-norm block (RMSNorm, mixer, residual add; RMSNorm, SwiGLU MLP,
residual add); the mixer is a short-conv block (``in_proj [hidden -> C]``, the depthwise
causal dilated conv over ``C`` channels of SPEC §2 with ``silu`` and a skip, ``out_proj
[C -> hidden]``) or grouped-query attention with RoPE. Embedding and LM head are untied.

- ``hybrid-8b`` (the default): what ``sim.config.ModelConfig`` describes. Its attention
  and MLP dimensions are Llama-3-8B's (hidden 4096, 32 query heads and 8 KV heads of
  128 dims, SwiGLU MLP of 14336, vocabulary 128256, RoPE theta 500000; 131072 positions
  as Llama 3.1). Its layer stack follows LFM2's pattern, short-conv blocks interleaved
  with GQA attention blocks, each followed by a SwiGLU MLP; LFM2's own conv is gated
  and has 3 taps over the hidden width, ours runs SPEC §4's geometry (``C = 2 * hidden =
  8192``, ``K = 4``, ``D = 3``) ungated. 32 layers alternating conv and attention, bf16:
  about 8.43e9 parameters, 65536 KV bytes per token.
- ``hybrid-1b``: the same structure at half the width (16 layers), for quick GPU runs.
- ``tiny``: four layers of a few dozen channels in float32, for CPU tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

#: Bytes per element of each preset dtype.
DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"float32": 4, "bfloat16": 2, "float16": 2})

DEFAULT_PRESET = "hybrid-8b"
#: The model name whose figures all come from the config (``sim.config.ModelConfig``).
CUSTOM_MODEL = "custom"


def _preset(**fields: object) -> Mapping[str, object]:
    return MappingProxyType(fields)


MODEL_PRESETS: Mapping[str, Mapping[str, object]] = MappingProxyType(
    {
        "hybrid-8b": _preset(
            layer_kinds=("conv", "attention") * 16,
            hidden_size=4096,
            conv_channels=8192,
            conv_kernel_size=4,
            conv_dilation=3,
            mlp_size=14336,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=128256,
            dtype="bfloat16",
            max_model_len=131072,
            rope_theta=500000.0,
        ),
        "hybrid-1b": _preset(
            layer_kinds=("conv", "attention") * 8,
            hidden_size=2048,
            conv_channels=4096,
            conv_kernel_size=4,
            conv_dilation=3,
            mlp_size=8192,
            num_heads=16,
            num_kv_heads=4,
            head_dim=128,
            vocab_size=32000,
            dtype="bfloat16",
            max_model_len=32768,
            rope_theta=500000.0,
        ),
        "tiny": _preset(
            layer_kinds=("conv", "attention", "conv", "attention"),
            hidden_size=32,
            conv_channels=64,
            conv_kernel_size=4,
            conv_dilation=2,
            mlp_size=64,
            num_heads=4,
            num_kv_heads=2,
            head_dim=8,
            vocab_size=64,
            dtype="float32",
            max_model_len=512,
            rope_theta=10000.0,
        ),
    }
)


def get_preset(name: str) -> Mapping[str, object]:
    """The preset called ``name``; ``KeyError`` naming the known ones otherwise."""
    preset = MODEL_PRESETS.get(name)
    if preset is None:
        raise KeyError(f"model preset: unknown {name!r}; known: {', '.join(MODEL_PRESETS)}")
    return preset


def _int(preset: Mapping[str, object], name: str) -> int:
    return int(preset[name])  # type: ignore[call-overload]


def _kind_counts(preset: Mapping[str, object]) -> tuple[int, int]:
    kinds = tuple(preset["layer_kinds"])  # type: ignore[arg-type]
    return kinds.count("conv"), kinds.count("attention")


def num_params(preset: Mapping[str, object]) -> int:
    """Parameters of the model ``preset`` describes (embedding and LM head untied).

    Per layer two RMSNorm weights and a SwiGLU MLP (``3 * hidden * mlp``); a conv layer
    ``in_proj``, ``out_proj`` and ``[C, K]`` taps; an attention layer its q, k, v and o
    projections (no biases).
    """
    hidden, channels, mlp = (_int(preset, n) for n in ("hidden_size", "conv_channels", "mlp_size"))
    heads, kv_heads, head_dim = (_int(preset, n) for n in ("num_heads", "num_kv_heads", "head_dim"))
    conv_layers, attention_layers = _kind_counts(preset)
    per_layer = 2 * hidden + 3 * hidden * mlp
    conv = 2 * hidden * channels + channels * _int(preset, "conv_kernel_size")
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    layers = conv_layers + attention_layers
    ends = 2 * _int(preset, "vocab_size") * hidden + hidden  # embedding, LM head, final norm
    return ends + layers * per_layer + conv_layers * conv + attention_layers * attention


def weight_bytes(preset: Mapping[str, object]) -> int:
    """Bytes of every weight in the preset's dtype: ``num_params * dtype bytes``."""
    return num_params(preset) * DTYPE_BYTES[str(preset["dtype"])]


def kv_bytes_per_token(preset: Mapping[str, object]) -> int:
    """KV-cache bytes one token position holds: ``attention layers * 2 * KV heads *
    head_dim * dtype bytes``."""
    _, attention_layers = _kind_counts(preset)
    per_layer = 2 * _int(preset, "num_kv_heads") * _int(preset, "head_dim")
    return attention_layers * per_layer * DTYPE_BYTES[str(preset["dtype"])]


def conv_state_bytes_per_slot(preset: Mapping[str, object], query_len_max: int) -> int:
    """Conv-state bytes one slot holds over every conv layer: ``C * W`` entries each,
    ``W = (K - 1) * D + Q - 1`` (SPEC §2)."""
    conv_layers, _ = _kind_counts(preset)
    reach = (_int(preset, "conv_kernel_size") - 1) * _int(preset, "conv_dilation")
    window = reach + query_len_max - 1
    entries = conv_layers * _int(preset, "conv_channels") * window
    return entries * DTYPE_BYTES[str(preset["dtype"])]


def model_figures(name: str) -> dict[str, float | int]:
    """The cost and memory models' figures of preset ``name`` (``sim.config.ModelConfig``'s
    fields; nothing for ``custom`` or an unknown name)."""
    preset = MODEL_PRESETS.get(name)
    if preset is None:
        return {}
    conv_layers, _ = _kind_counts(preset)
    return {
        "params": float(num_params(preset)),
        "layers": len(tuple(preset["layer_kinds"])),  # type: ignore[arg-type]
        "hidden_size": _int(preset, "hidden_size"),
        "conv_layers": conv_layers,
        "kv_bytes_per_token": float(kv_bytes_per_token(preset)),
        "dtype_bytes": DTYPE_BYTES[str(preset["dtype"])],
        "conv_channels": _int(preset, "conv_channels"),
        "conv_kernel_size": _int(preset, "conv_kernel_size"),
        "conv_dilation": _int(preset, "conv_dilation"),
        "max_model_len": _int(preset, "max_model_len"),
        "num_heads": _int(preset, "num_heads"),
        "num_kv_heads": _int(preset, "num_kv_heads"),
    }
