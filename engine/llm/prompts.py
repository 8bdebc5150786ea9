"""Real prompts for the LLM lab: a JSONL file, one prompt a line.

    {"prompt": "Explain the KV cache in two sentences."}     text, tokenized with the checkpoint's tokenizer
    {"ids": [1, 415, 2936, 28705]}                            token ids, for a checkpoint (or preset) without one

Blank lines are skipped. A bad line is one error (PromptError, a ValueError) naming the file and the line number.
EMBEDDED is the lab's own small set (data/prompts.jsonl; `--prompts embedded`): ten prompts written for it, from
a word to a few hundred tokens, so TTFT across prompt lengths has something to spread over.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EMBEDDED = Path(__file__).resolve().parents[2] / "data" / "prompts.jsonl"


class PromptError(ValueError):
    """A prompt file the lab cannot use: one line with the file and line number."""


def load_prompts(path: str | Path, tokenizer: Any | None = None, vocab: int | None = None) -> list[list[int]]:
    """Every prompt of the file ("embedded": data/prompts.jsonl) as token ids (at least one each, all below `vocab`
    when given). Text needs `tokenizer` (anything with encode(text) -> ids, e.g. a transformers tokenizer); ids
    need nothing."""
    path = EMBEDDED if str(path) == "embedded" else Path(path).expanduser()
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"--prompts {path}: cannot read it ({exc.__class__.__name__})") from None
    out: list[list[int]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        out.append(_parse(line, tokenizer, vocab, f"--prompts {path}, line {number}"))
    if not out:
        raise PromptError(f"--prompts {path}: no prompts (one JSON object a line: {{\"prompt\": \"...\"}} or "
                          "{\"ids\": [...]})")
    return out


def _parse(line: str, tokenizer: Any | None, vocab: int | None, where: str) -> list[int]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict) or ("prompt" in row) == ("ids" in row):
        raise PromptError(f"{where}: write one object with either \"prompt\" (text) or \"ids\" (token ids)")
    if "ids" in row:
        ids = row["ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                           and i >= 0 for i in ids):
            raise PromptError(f"{where}: \"ids\" must be a non-empty list of token ids (whole numbers ≥ 0)")
    else:
        text = row["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise PromptError(f"{where}: \"prompt\" must be non-empty text")
        if tokenizer is None:
            raise PromptError(f"{where}: text prompt but the checkpoint has no tokenizer files: give {{\"ids\": "
                              "[...]} instead")
        ids = list(tokenizer.encode(text))
        if not ids:
            raise PromptError(f"{where}: the tokenizer made no tokens of this prompt")
    if vocab is not None and max(ids) >= vocab:
        raise PromptError(f"{where}: token id {max(ids)} is outside the vocabulary ({vocab} tokens)")
    return [int(i) for i in ids]


def embedded_texts() -> list[str]:
    """The texts of the embedded prompt set (data/prompts.jsonl)."""
    return [json.loads(line)["prompt"] for line in EMBEDDED.read_text().splitlines() if line.strip()]


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p90 and p99 of per-prompt figures (linear interpolation), for TTFT and TPOT across a prompt set."""
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return {f"p{q}": float(np.percentile(arr, q)) for q in (50, 90, 99)}
