"""IR explorer: a model's graph — ops, shapes, dtypes, who produces what — extracted on the meta device (no weight
memory), as plain JSON a downstream compiler can consume, with an executor and a verifier that prove it computes what
the model computes.

One concept per module: errors, graph (dataclasses), export (meta checks, torch.export, conversion), serialize (JSON),
execute, verify, mermaid (graphs for the browser), overlay (a profile's measured time on the graph), zoo (models),
runs (the store). `python -m engine ir` is engine/cli/ir.py.
"""

from engine.ir.errors import (
    ConversionError,
    ExecutionError,
    ExportError,
    IRError,
    SerializationError,
    WeightLoadError,
)
from engine.ir.execute import execute_ir, register_executor
from engine.ir.export import convert, export_meta, extract_ir
from engine.ir.graph import IR, Mutation, OpNode, Subgraph, TensorMeta
from engine.ir.serialize import load_ir, save_ir
from engine.ir.verify import VerifyReport, verify_ir

__all__ = [
    "IR", "OpNode", "TensorMeta", "Subgraph", "Mutation", "extract_ir", "export_meta", "convert", "execute_ir",
    "register_executor",
    "verify_ir", "VerifyReport", "save_ir", "load_ir", "IRError", "ExportError", "ConversionError", "ExecutionError",
    "SerializationError", "WeightLoadError",
]
