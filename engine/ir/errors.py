"""The IR explorer's exceptions: each says what went wrong, where (tensor, node, file) and the fix, if any."""

from __future__ import annotations


class IRError(Exception):
    """Base class of every error raised by engine.ir."""


class ExportError(IRError):
    """The model or its inputs cannot be exported on the meta device (a tensor off meta, a limit of torch.export)."""


class ConversionError(IRError):
    """torch.export produced a graph that the IR cannot represent (symbolic shapes, higher-order ops, mutations)."""


class ExecutionError(IRError):
    """Running the IR with real tensors failed; the message names the node."""

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node


class SerializationError(IRError):
    """An IR file is truncated, tampered with, of another schema version or otherwise malformed."""


class WeightLoadError(IRError):
    """Real weights do not fit the IR (missing, wrong shape or dtype), or are too large to materialise."""
