"""GNN message passing: out[dst] += w_e · x[src] over an edge list, sum or mean aggregation.

Inputs are (x, src, dst, w, rowptr): N nodes with F features, E edges. For the "sorted" variants the edges are sorted
by destination and `rowptr` (N + 1) is their CSR row pointer; for "unsorted" ones rowptr is None and the edges come in
random order (a kernel then needs atomics, or must sort first and count that).

FLOPs: 2·E·F (a multiply and an add per edge and feature). Bytes, the "edge-gather traffic": each edge reads its
source row (E·F·itemsize — x at the real shape is 51 MB in fp32, about the whole L2, so rows are re-read from memory),
the output is written once (N·F·itemsize), and the edge arrays are read once (E·(2·index + weight) bytes). The
compulsory traffic (x read once instead of per edge) is smaller; a kernel can beat the gather count only through
cache hits, so this is the count a bandwidth figure divides.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.workloads.component import Component, Shape, seeded


class NaiveMessagePassing(nn.Module):
    """gather → scale → index_add_: the formulation most GNN code starts from."""

    def __init__(self, num_nodes: int, aggr: str) -> None:
        super().__init__()
        self.num_nodes, self.aggr = num_nodes, aggr

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor,
                rowptr: torch.Tensor | None = None) -> torch.Tensor:
        messages = x.index_select(0, src) * w.unsqueeze(1)
        out = torch.zeros(self.num_nodes, x.shape[1], dtype=torch.float32, device=x.device)
        out.index_add_(0, dst, messages.float())
        if self.aggr == "mean":
            degree = torch.zeros(self.num_nodes, dtype=torch.float32, device=x.device)
            degree.index_add_(0, dst, torch.ones_like(dst, dtype=torch.float32))
            out = out / degree.clamp_min(1.0).unsqueeze(1)
        return out.to(x.dtype)


class SegmentMessagePassing(nn.Module):
    """The CSR/segment formulation: gathered messages reduced per destination segment with torch.segment_reduce.
    Unsorted edges are sorted inside the call (that cost is part of this formulation)."""

    def __init__(self, num_nodes: int, aggr: str) -> None:
        super().__init__()
        self.num_nodes, self.aggr = num_nodes, aggr

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor,
                rowptr: torch.Tensor | None = None) -> torch.Tensor:
        if rowptr is None:
            order = torch.argsort(dst)
            src, w, dst = src[order], w[order], dst[order]
            counts = torch.bincount(dst, minlength=self.num_nodes)
            rowptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        messages = (x.index_select(0, src) * w.unsqueeze(1)).float()
        out = torch.segment_reduce(messages, self.aggr, offsets=rowptr.to(torch.int64), axis=0, unsafe=True,
                                   initial=0.0)
        return out.to(x.dtype)


def _shape(name: str, n: int, e: int, f: int, dtype: str, sorted_edges: bool, devices: tuple[str, ...],
           aggr: str = "sum") -> Shape:
    return Shape(name, {"N": n, "E": e, "F": f, "aggr": aggr, "sorted": sorted_edges}, dtype, devices=devices)


CUDA = ("cuda",)
SHAPES = {
    "small-sorted": _shape("small-sorted", 300, 2000, 48, "fp32", True, ("cpu", "cuda")),
    "small-unsorted-mean": _shape("small-unsorted-mean", 300, 2000, 48, "fp32", False, ("cpu", "cuda"), "mean"),
    "sorted-fp32": _shape("sorted-fp32", 100_000, 1_000_000, 128, "fp32", True, CUDA),
    "sorted-bf16": _shape("sorted-bf16", 100_000, 1_000_000, 128, "bf16", True, CUDA),
    "unsorted-fp32": _shape("unsorted-fp32", 100_000, 1_000_000, 128, "fp32", False, CUDA),
    "unsorted-bf16": _shape("unsorted-bf16", 100_000, 1_000_000, 128, "bf16", False, CUDA),
}


def make_inputs(shape: Shape, device: str, seed: int) -> tuple:
    d = shape.dims
    gen = seeded(seed, device)
    n, e, f = d["N"], d["E"], d["F"]
    x = torch.randn(n, f, device=device, generator=gen).to(shape.torch_dtype)
    src = torch.randint(0, n, (e,), device=device, generator=gen)
    # Leave the last few nodes without incoming edges: isolated nodes are the edge case of mean aggregation.
    dst = torch.randint(0, max(1, n - 3), (e,), device=device, generator=gen)
    w = torch.rand(e, device=device, generator=gen).to(shape.torch_dtype)
    if not d["sorted"]:
        return x, src, dst, w, None
    order = torch.argsort(dst, stable=True)
    src, dst, w = src[order].contiguous(), dst[order].contiguous(), w[order].contiguous()
    counts = torch.bincount(dst, minlength=n)
    rowptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return x, src, dst, w, rowptr


def flops(shape: Shape) -> float:
    return 2.0 * shape.dims["E"] * shape.dims["F"]


def min_bytes(shape: Shape) -> float:
    d = shape.dims
    size = shape.torch_dtype.itemsize
    index = 8  # int64 src and dst
    return float(d["E"] * d["F"] * size + d["N"] * d["F"] * size + d["E"] * (2 * index + size))


COMPONENT = Component(
    name="gnn_message_passing",
    description="out[dst] += w_e · x[src] over an edge list (sum or mean), N nodes, E edges, F features.",
    shapes=SHAPES,
    make_inputs=make_inputs,
    make_naive=lambda shape: NaiveMessagePassing(shape.dims["N"], shape.dims["aggr"]),
    make_native=lambda naive, shape: SegmentMessagePassing(shape.dims["N"], shape.dims["aggr"]),
    flops=flops,
    min_bytes=min_bytes,
    flops_formula="2·E·F",
    bytes_formula="E·F·itemsize (each edge gathers its source row) + N·F·itemsize (out) + E·(2·8 + itemsize) "
                  "(src, dst, w); rows re-read from L2 make a fast kernel exceed the copy bandwidth by this count",
    bound="memory",
)
