"""Compile every kernel configuration the benches launch for sm_90, without a GPU.

Runs the real launchers (``executor.kernels``) on CPU tensors of ``kernel_bench``'s
batches (eager and graph-bucket plans, both state layouts, every named variant and the
persistent sweep's blocks, C = 8192 and 2048), records each launch's arguments instead of
running it, and compiles each distinct one ahead of time with the installed Triton for
``GPUTarget("cuda", 90, 32)``, specializing the arguments as a CUDA launch would (FAST on,
programmatic dependent launches on). Prints one line per kernel: registers, stack and
local (spill) bytes from ``cuobjdump``, or the compiler's error. Exit status 1 if any
configuration fails to compile. Needs Triton's bundled ptxas and cuobjdump, not a device.

    python bench/sm90_compile.py [--only persistent] [--channels 8192 2048]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, not interpret

import attrs
import numpy as np
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_bench as kb
from bench_record import record_run

from stepplan.executor import kernels
from stepplan.executor.kernels import launch, persistent, rows, tiles
from stepplan.planner import Planner

TARGET = GPUTarget("cuda", 90, 32)
MULTIPROCESSORS = 132  # an H200's
_KERNELS = (
    (persistent, "_short_conv_rows_persistent"),
    (rows, "_short_conv_rows"),
    (tiles, "_short_conv_tiles"),
)
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}


@attrs.frozen
class Launch:
    """One recorded launch: the kernel, its specialized signature, constexprs and options."""

    name: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, object], ...]
    divisible: tuple[str, ...]
    options: tuple[tuple[str, object], ...]


def _specialize(fn: triton.JITFunction, args: tuple, kwargs: dict) -> Launch:
    """What Triton's launch would key the compile on: pointers typed by dtype, integers
    equal to 1 made constants and multiples of 16 marked divisible (both unless named in
    ``do_not_specialize``), constexprs by value."""
    params = dict(zip(fn.arg_names, args, strict=False))
    options = {k: v for k, v in kwargs.items() if k not in fn.arg_names}
    params |= {k: v for k, v in kwargs.items() if k in fn.arg_names}
    frozen = {fn.arg_names[i] if isinstance(i, int) else i for i in fn.do_not_specialize}
    signature, constexprs, divisible = [], {}, []
    for index, name in enumerate(fn.arg_names):
        value = params[name]
        if index in fn.constexprs:
            signature.append((name, "constexpr"))
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            signature.append((name, "*" + _DTYPES[value.dtype]))
            divisible.append(name)  # the allocator's pointers are 16-byte aligned
        elif value == 1 and name not in frozen:
            signature.append((name, "constexpr"))
            constexprs[name] = 1
        else:
            signature.append((name, "i32" if -(2**31) <= value < 2**31 else "i64"))
            if value % 16 == 0 and name not in frozen:
                divisible.append(name)
    return Launch(
        fn.__name__,
        tuple(signature),
        tuple(sorted(constexprs.items())),
        tuple(divisible),
        tuple(sorted(options.items())),
    )


class _Recorder:
    """Stands in for a ``triton.JITFunction``: ``kernel[grid](...)`` records, runs nothing."""

    def __init__(self, fn: triton.JITFunction, seen: dict) -> None:
        self.fn, self.seen = fn, seen

    def __getitem__(self, grid: tuple):
        def record(*args, **kwargs) -> None:
            found = _specialize(self.fn, args, kwargs)
            self.seen.setdefault(found, grid)

        return record


def _static_on_cuda(static_arguments):
    def on_cuda(x, conv_state, weight, dilation, blocks):
        static = static_arguments(x, conv_state, weight, dilation, blocks)
        return static | dict(FAST=1, DEPENDENT=blocks.dependent)

    return on_cuda


def _blocks_tried(channels: int, layout: str) -> list[kernels.Blocks]:
    """Every named variant's blocks, and the persistent sweep's rows blocks on its base."""
    contiguous = layout != kb.LAYOUTS[0]
    tried = [kernels.default_blocks(channels, contiguous, v) for v in kernels.VARIANTS]
    if "persistent" in kernels.VARIANTS:
        base = kernels.default_blocks(channels, contiguous, "persistent")
        tried += [kb._with_variant(base, False, v) for v in kb.PERSISTENT_VARIANTS[layout]]
    return tried


def record_launches(channels_list: list[int]) -> dict[Launch, tuple]:
    """Every distinct launch of the benches' batches, by its compile key."""
    seen: dict[Launch, tuple] = {}
    saved = [(module, name, getattr(module, name)) for module, name in _KERNELS]
    saved_static, saved_sms = launch._static_arguments, launch._multiprocessors
    try:
        for module, name, fn in saved:
            setattr(module, name, _Recorder(fn, seen))
        launch._static_arguments = _static_on_cuda(saved_static)
        launch._multiprocessors = lambda _device: MULTIPROCESSORS
        for config in (kb.EAGER_CONFIG, kb.BUCKET_CONFIG):
            planner = Planner(config)
            for batch_name in kb.BATCHES:
                plan = planner.compile(kb.batch_of(batch_name))
                _launch_all(plan, channels_list)
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
        launch._static_arguments, launch._multiprocessors = saved_static, saved_sms
    return seen


def _launch_all(plan, channels_list: list[int]) -> None:
    shape = launch.launch_shape(plan)
    buffer = torch.from_numpy(np.array(plan.packed))
    gen = torch.Generator().manual_seed(0)
    for channels in channels_list:
        for layout in kb.LAYOUTS:
            x = torch.zeros(plan.num_tokens, channels, dtype=kb.DTYPE)
            slots = plan.num_rows + 1
            if layout == kb.LAYOUTS[0]:
                state = torch.zeros(slots, kb.W, channels, dtype=kb.DTYPE).transpose(1, 2)
            else:
                state = torch.zeros(slots, channels, kb.W, dtype=kb.DTYPE)
            weight = torch.randn(kb.K, channels, generator=gen).to(kb.DTYPE).t()
            for blocks in _blocks_tried(channels, layout):
                launch.launch_short_conv(
                    shape, buffer, x, x.clone(), state, weight, dilation=kb.D, group=0,
                    blocks=blocks,
                )  # fmt: skip


def compile_launch(found: Launch, fn: triton.JITFunction, work: Path) -> str:
    """``regs N stack N local N`` of ``found`` compiled for sm_90, or its error's last line."""
    index = {name: i for i, name in enumerate(fn.arg_names)}
    attrs_ = {(index[name],): [["tt.divisibility", 16]] for name in found.divisible}
    source = ASTSource(
        fn=fn, signature=dict(found.signature), constexprs=dict(found.constexprs), attrs=attrs_
    )
    try:
        compiled = triton.compile(source, target=TARGET, options=dict(found.options))
    except Exception as error:  # the compiler's errors have no common type
        lines = [line for line in str(error).splitlines() if line.strip()]
        return "FAILED: " + (lines[-1] if lines else type(error).__name__)
    cubin = work / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    if match is None:
        return "compiled (no resource usage read)"
    return "regs {} stack {} local {}".format(*match.groups())


def _describe(found: Launch) -> str:
    c = dict(found.constexprs)
    keys = ("ROW_TOKENS_MAX", "BLOCK_C", "WINDOW_TILE", "WHOLE_WINDOW", "PREFETCH", "LOOP")
    keys += ("CHANNEL_UNIT", "WINDOW_UNIT", "FAST", "DEPENDENT", "ALIGN")
    shown = " ".join(f"{k}={int(c[k])}" for k in keys if k in c)
    return f"{found.name} warps={dict(found.options).get('num_warps')} {shown}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--channels", type=int, nargs="+", default=[8192, 2048])
    parser.add_argument("--only", default="", help="kernel name substring (e.g. persistent)")
    args = parser.parse_args()
    print(f"triton {triton.__version__}, target {TARGET}", flush=True)
    functions = {getattr(m, n).__name__: getattr(m, n) for m, n in _KERNELS}
    failed = launches = 0
    with tempfile.TemporaryDirectory() as tmp:
        for found in sorted(record_launches(args.channels), key=_describe):
            if args.only not in found.name:
                continue
            result = compile_launch(found, functions[found.name], Path(tmp))
            failed += result.startswith("FAILED")
            launches += 1
            print(f"{_describe(found):<100} {result}", flush=True)
    print(f"{failed} failed", flush=True)
    figures = {"launches_compiled": launches, "launches_failed": failed}
    record_run("sm90_compile", figures, triton=triton.__version__, target=str(TARGET))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
