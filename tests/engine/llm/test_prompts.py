"""Prompt files (engine.llm.prompts): text through a tokenizer built here offline (tokenizers' WordLevel, saved as
a transformers tokenizer into a checkpoint folder), ids without one, one clear error per bad line with its number,
and the embedded set (data/prompts.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.llm import hf
from engine.llm.prompts import EMBEDDED, PromptError, embedded_texts, load_prompts, percentiles

WORDS = "[UNK] hello world the a of what is kv cache".split()


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    folder = tmp_path_factory.mktemp("tok")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


def _file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_text_prompts_go_through_the_checkpoints_tokenizer(tokenizer_folder: Path, tmp_path: Path) -> None:
    tok = hf.tokenizer(tokenizer_folder)
    assert tok is not None
    path = _file(tmp_path, json.dumps({"prompt": "hello world"}), "", json.dumps({"prompt": "what is kv cache"}))
    assert load_prompts(path, tok, vocab=len(WORDS)) == [[1, 2], [6, 7, 8, 9]]


def test_ids_need_no_tokenizer(tmp_path: Path) -> None:
    assert hf.tokenizer(tmp_path) is None
    path = _file(tmp_path, '{"ids": [1, 2, 3]}', '{"ids": [4]}')
    assert load_prompts(path, None, vocab=10) == [[1, 2, 3], [4]]


@pytest.mark.parametrize("line, message", [
    ("not json", "line 2: not JSON"),
    ('{"text": "hi"}', 'line 2: write one object with either "prompt" (text) or "ids" (token ids)'),
    ('{"prompt": "a", "ids": [1]}', 'line 2: write one object with either "prompt"'),
    ('{"ids": []}', 'line 2: "ids" must be a non-empty list of token ids'),
    ('{"ids": [1, -2]}', 'line 2: "ids" must be a non-empty list of token ids'),
    ('{"ids": [1, 99]}', "line 2: token id 99 is outside the vocabulary (10 tokens)"),
    ('{"prompt": ""}', 'line 2: "prompt" must be non-empty text'),
    ('{"prompt": "hello"}', 'line 2: text prompt but the checkpoint has no tokenizer files: give {"ids": [...]} '
                            "instead"),
])
def test_a_bad_line_is_one_error_with_its_number(tmp_path: Path, line: str, message: str) -> None:
    path = _file(tmp_path, '{"ids": [1]}', line)
    with pytest.raises(PromptError) as info:
        load_prompts(path, None, vocab=10)
    assert str(info.value).startswith(f"--prompts {path}, line 2: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_an_empty_or_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="no prompts"):
        load_prompts(_file(tmp_path, ""), None)
    with pytest.raises(PromptError, match="cannot read it"):
        load_prompts(tmp_path / "missing.jsonl", None)


def test_the_embedded_set_is_ten_prompts_of_varied_length(tokenizer_folder: Path) -> None:
    texts = embedded_texts()
    assert len(texts) == 10 and EMBEDDED.name == "prompts.jsonl"
    words = sorted(len(t.split()) for t in texts)
    assert words[0] <= 3 and words[-1] >= 100  # from a word to a long paragraph
    ids = load_prompts("embedded", hf.tokenizer(tokenizer_folder))
    assert len(ids) == 10 and all(ids)


def test_percentiles_across_prompts() -> None:
    p = percentiles([float(v) for v in range(1, 101)])
    assert p["p50"] == pytest.approx(50.5) and p["p90"] == pytest.approx(90.1) and p["p99"] == pytest.approx(99.01)


def test_a_prompt_set_run_reports_ttft_and_tpot_across_prompts(tmp_path: Path) -> None:
    """A preset run with an ids file (no tokenizer): the cache covers the longest prompt; per-prompt rows kept."""
    from engine.llm.run import LLMConfig, llm_run

    path = _file(tmp_path, '{"ids": [1, 2, 3]}', '{"ids": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]}', '{"ids": [9]}')
    cfg = LLMConfig(preset="tiny", prompt_len=4, new_tokens=3, prefill_iters=2, decode_passes=1, profile=False,
                    ceilings="none", prompts=str(path), artifacts_dir=str(tmp_path / "out"))
    result = llm_run(cfg)
    assert cfg.prompt_len == 10  # raised to the longest prompt
    samples = {s.phase: s.values for s in result.samples}
    assert len(samples["prompt_ttft"]) == 3 and len(samples["prompt_tpot"]) == 3
    names = {m.name for m in result.metrics}
    assert {"prompts_ttft_p50_us", "prompts_ttft_p99_us", "prompts_tpot_p90_us"} <= names
    rows = (tmp_path / "out" / "prompts.csv").read_text().splitlines()
    assert rows[0] == "prompt,tokens,ttft_us,tpot_median_us" and [r.split(",")[1] for r in rows[1:]] == ["3", "10", "1"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "TTFT across 3 prompts (p50)" in report and "TPOT across 3 prompts (p50)" in report
