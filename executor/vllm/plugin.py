"""vLLM's general plugin for stepplan: its PLE layers build their metadata with stepplan.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes
(``vllm.plugins.load_general_plugins``); stepplan's is :func:`register`. It is opt-in,
so that installing stepplan changes no vLLM that did not ask for it: it does something
only when the environment variable :data:`SWITCH` is ``1``. Then it hands vLLM's PLE
backend (``PleShortConvAttentionBackend``, which vLLM's PLE layers pick themselves)
stepplan's builder as the class its ``get_builder_cls()`` returns
(:class:`~.vllm_builder.StepplanPleBuilder`), which vLLM's model runner then makes for
every PLE layer group. Registering twice changes nothing more; :func:`unregister` gives
vLLM its own builder back.

vLLM imports this module only to call :func:`register`: nothing of vLLM is imported
until the switch is on.
"""

from __future__ import annotations

import os

#: The environment variable that switches the plugin on (``1``) or leaves it off (``0``,
#: empty, or unset).
SWITCH = "STEPPLAN_VLLM_BUILDER"


def switched_on() -> bool:
    """Whether :data:`SWITCH` asks for stepplan's builder (``ValueError`` for a value
    that is neither on nor off)."""
    value = os.environ.get(SWITCH, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{SWITCH}: must be 1 (on) or 0 (off), got {value!r}")
    return value == "1"


def register() -> None:
    """vLLM's entry point: with the switch on, vLLM's PLE backend builds its metadata
    with stepplan's builder (``ValueError``, one line, where the installed vLLM is a
    release stepplan does not follow)."""
    if not switched_on():
        return
    from vllm.v1.attention.backends.short_conv_attn import PleShortConvAttentionBackend

    from .vllm_builder import StepplanPleBuilder, running_revision

    running_revision()
    if PleShortConvAttentionBackend.get_builder_cls() is not StepplanPleBuilder:
        PleShortConvAttentionBackend.get_builder_cls = staticmethod(_stepplan_builder)


def unregister() -> None:
    """Give vLLM's PLE backend its own builder back (nothing if it has it)."""
    from vllm.v1.attention.backends.short_conv_attn import (
        PleShortConvAttentionBackend,
        PleShortConvAttentionMetadataBuilder,
    )

    if PleShortConvAttentionBackend.get_builder_cls() is not PleShortConvAttentionMetadataBuilder:
        PleShortConvAttentionBackend.get_builder_cls = staticmethod(_vllm_builder)


def _stepplan_builder() -> type:
    """``get_builder_cls`` with the plugin on."""
    from .vllm_builder import StepplanPleBuilder

    return StepplanPleBuilder


def _vllm_builder() -> type:
    """``get_builder_cls`` as vLLM has it."""
    from vllm.v1.attention.backends.short_conv_attn import PleShortConvAttentionMetadataBuilder

    return PleShortConvAttentionMetadataBuilder
