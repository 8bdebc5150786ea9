"""How each level builds a component: L1/L2/L3 reuse the naive module (and engine.modes), L4/L5 call hand-written
kernels that share one Python API (attention, patch_embed, message_passing) in engine/kernels/."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch
from torch import nn

from engine.levels.base import Built, Level, component_source, triton_missing, use_triton_interpreter
from engine.workloads.component import Component, Shape


def _naive(component: Component, shape: Shape, naive: nn.Module, device: str) -> Built:
    stages = {"patch_embed": naive.tokens} if "patch_embed" in component.stages else {}
    return Built(fn=naive, stages=stages)


def _native(component: Component, shape: Shape, naive: nn.Module, device: str) -> Built:
    if component.make_native is None:
        raise ValueError(f"{component.name} has no idiomatic native op")
    native = component.make_native(naive, shape)
    # The patch embedding's idiomatic native op is the strided conv the naive module already uses.
    stages = {"patch_embed": naive.tokens} if "patch_embed" in component.stages else {}
    return Built(fn=native, stages=stages)


def _mode(mode_name: str):
    def build(component: Component, shape: Shape, naive: nn.Module, device: str) -> Built:
        from engine.modes import get_mode

        mode = get_mode(mode_name)
        prepared = mode.prepare(naive, (), False)
        stages = {}
        if "patch_embed" in component.stages and mode_name == "compile":
            stages["patch_embed"] = torch.compile(naive.tokens, dynamic=False)
        return Built(fn=prepared.fn, stages=stages, notes=list(prepared.notes))

    return build


def _mode_availability(mode_name: str):
    def availability(device: str) -> str | None:
        from engine.modes import get_mode

        return get_mode(mode_name).availability(device)

    return availability


def kernel_level(kernels: ModuleType, component: Component, shape: Shape, naive: nn.Module) -> Built:
    """Adapt the shared hand-written kernel API to a component's inputs."""
    if component.name == "causal_attention":
        return Built(fn=lambda q, k, v: kernels.attention(q, k, v, causal=True))
    if component.name == "vit_patch_attention":
        patch = shape.dims["patch"]

        def tokens(images: torch.Tensor) -> torch.Tensor:
            return kernels.patch_embed(images, naive.proj.weight, naive.proj.bias, naive.cls, naive.pos, patch)

        def forward(images: torch.Tensor) -> torch.Tensor:
            q, k, v = naive.split_heads(tokens(images))  # the qkv projection is a cuBLAS GEMM (F.linear)
            out = kernels.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=False)
            return naive.merge_heads(out)

        return Built(fn=forward, stages={"patch_embed": tokens},
                     notes=["qkv projection through F.linear (cuBLAS); patch embedding and attention hand-written"])
    if component.name == "gnn_message_passing":
        n, aggr = shape.dims["N"], shape.dims["aggr"]

        def message_passing(x, src, dst, w, rowptr=None):
            return kernels.message_passing(x, src, dst, w, n, aggr=aggr, rowptr=rowptr)

        unsorted = (getattr(kernels, "unsorted_note", None)  # what the level's kernels do without a CSR
                    or "unsorted edges: atomic adds into an fp32 buffer, then a cast")
        notes = [] if shape.dims["sorted"] else [unsorted]
        return Built(fn=message_passing, notes=notes)
    raise ValueError(f"no hand-written kernels for component {component.name!r}")


def _triton(component: Component, shape: Shape, naive: nn.Module, device: str) -> Built:
    interpreted = use_triton_interpreter(device)
    kernels = _kernels_namespace("engine.kernels.triton")
    built = kernel_level(kernels, component, shape, naive)
    built.interpreted = interpreted
    built.autotunes = not interpreted
    if not interpreted and component.name in ("causal_attention", "vit_patch_attention"):
        built.late_notes = _attention_tiles(component, shape)
    if interpreted:
        built.notes.append("TRITON_INTERPRET=1: the kernels run in Triton's CPU interpreter — a correctness check; "
                           "its times are not kernel times")
    return built


def _attention_tiles(component: Component, shape: Shape):
    """After the run: which attention kernel ran this shape (the per-shape choice between the tl and the Gluon
    kernel, with both times) and the tile Triton's autotuner chose for the tl one."""
    from engine.kernels.triton import attention

    d = shape.dims
    if component.name == "causal_attention":
        key = (d["S"], d["D"], True)
    else:  # the ViT: one token per patch plus the class token
        key = ((d["image"] // d["patch"]) ** 2 + 1, d["E"] // d["heads"], False)
    return lambda: [t for t in [attention.l4_choice(*key), attention.tuned_tile(*key)] if t]


def _cuda(component: Component, shape: Shape, naive: nn.Module, device: str) -> Built:
    from engine.kernels import cuda_levels

    built = kernel_level(cuda_levels, component, shape, naive)
    head_dim = {"causal_attention": lambda d: d["D"], "vit_patch_attention": lambda d: d["E"] // d["heads"]}
    if component.name in head_dim and device.startswith("cuda"):  # which attention kernel this GPU runs
        dim = head_dim[component.name](shape.dims)
        built.notes.append(cuda_levels.describe_variant(cuda_levels.default_variant(shape.torch_dtype, dim)))
    return built


def _cuda_missing(device: str) -> str | None:
    if not device.startswith("cuda"):
        return "needs a CUDA device (hand-written CUDA kernels)"
    try:
        from engine.kernels import cuda_levels
    except ImportError as exc:
        return f"the CUDA kernels' loader is missing: {exc}"
    return cuda_levels.available()


class _Namespace:
    def __init__(self, **fns):
        self.__dict__.update(fns)


def _kernels_namespace(package: str) -> _Namespace:
    attention = importlib.import_module(f"{package}.attention")
    patch_embed = importlib.import_module(f"{package}.patch_embed")
    message_passing = importlib.import_module(f"{package}.message_passing")
    return _Namespace(attention=attention.attention, patch_embed=patch_embed.patch_embed,
                      message_passing=message_passing.message_passing,
                      unsorted_note=getattr(message_passing, "UNSORTED_NOTE", None))


def _sources(*paths: str):
    def sources(component: Component) -> list[str]:
        return [component_source(component)] + [p.format(c=component.name) for p in paths]

    return sources


_TRITON_FILES = {"causal_attention": ["engine/kernels/triton/attention.py"],
                 "vit_patch_attention": ["engine/kernels/triton/patch_embed.py", "engine/kernels/triton/attention.py"],
                 "gnn_message_passing": ["engine/kernels/triton/message_passing.py"]}
# causal attention: D=128 runs FlashAttention-3's design (attention_ws.cu) on compute capability 9.0, mma.sync
# elsewhere
_CUDA_FILES = {"causal_attention": ["csrc/levels/attention_ws.cu", "csrc/levels/attention.cu"],
               "vit_patch_attention": ["csrc/levels/patch_embed.cu", "csrc/levels/attention.cu"],
               "gnn_message_passing": ["csrc/levels/message_passing.cu"]}

LEVEL_LIST = [
    Level("L1-naive", 1, "native, naive formulation",
          "Plain PyTorch as a textbook writes it (matmul/softmax/matmul; gather + index_add_): the reference every "
          "other level is checked against.", _naive, sources=_sources()),
    Level("L1-native", 1, "native, idiomatic op",
          "The op PyTorch provides for it: scaled_dot_product_attention; a CSR segment reduction.", _native,
          sources=_sources()),
    Level("L2-torchscript", 2, "TorchScript", "The naive module through torch.jit.script (engine.modes).",
          _mode("torchscript"), sources=_sources("engine/modes/torchscript.py")),
    Level("L3-compile", 3, "torch.compile", "The naive module through torch.compile / Inductor (engine.modes).",
          _mode("compile"), availability=_mode_availability("compile"), sources=_sources("engine/modes/compile.py")),
    Level("L4-triton", 4, "hand-written Triton", "Triton kernels written for this component.", _triton,
          availability=triton_missing,
          sources=lambda c: _TRITON_FILES.get(c.name, []) + ["engine/levels/builders.py"]),
    Level("L5-cuda", 5, "hand-written CUDA", "CUDA C++ kernels (tensor cores — wgmma on H100/H200, mma.sync "
          "elsewhere — and shared memory) built with torch.utils.cpp_extension.", _cuda, availability=_cuda_missing,
          sources=lambda c: _CUDA_FILES.get(c.name, []) + ["engine/kernels/cuda_levels.py"]),
]
