"""JSON round trip, and every way a file can be wrong: truncated, tampered, another version, broken references."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from engine.ir import SerializationError, load_ir, save_ir
from engine.ir.serialize import SCHEMA_VERSION, _canonical


@pytest.mark.parametrize("name", ["llama", "attention", "multi_io", "skip", "shared_weights", "house_price"])
def test_round_trip(zoo_irs, tmp_path: Path, name: str) -> None:
    ir = zoo_irs[name]
    size = save_ir(ir, tmp_path / "ir.json")
    assert size == (tmp_path / "ir.json").stat().st_size
    loaded = load_ir(tmp_path / "ir.json")
    assert loaded == ir
    doc = json.loads((tmp_path / "ir.json").read_text())
    assert doc["format"] == "modelab-ir" and doc["schema_version"] == SCHEMA_VERSION


@pytest.fixture
def saved(zoo_irs, tmp_path: Path) -> Path:
    path = tmp_path / "ir.json"
    save_ir(zoo_irs["attention"], path)
    return path


def rewrite(path: Path, edit, *, fix_checksum: bool) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    if fix_checksum:
        doc["sha256"] = hashlib.sha256(_canonical(doc["ir"]).encode()).hexdigest()
    path.write_text(json.dumps(doc))


def test_truncated(saved: Path) -> None:
    text = saved.read_text()
    saved.write_text(text[: len(text) // 2])
    with pytest.raises(SerializationError, match="truncated: the JSON ends early"):
        load_ir(saved)


def test_not_json_and_empty(saved: Path) -> None:
    saved.write_text("{this is not json}")
    with pytest.raises(SerializationError, match="not valid JSON"):
        load_ir(saved)
    saved.write_text("")
    with pytest.raises(SerializationError, match="empty file"):
        load_ir(saved)
    with pytest.raises(SerializationError, match="no such IR file"):
        load_ir(saved.with_name("missing.json"))


def test_tampered_content_fails_the_checksum(saved: Path) -> None:
    rewrite(saved, lambda d: d["ir"]["nodes"][0]["outputs"][0]["shape"].__setitem__(0, 99), fix_checksum=False)
    with pytest.raises(SerializationError, match="checksum mismatch.*modified after it was written"):
        load_ir(saved)


def test_wrong_version_and_format(saved: Path) -> None:
    rewrite(saved, lambda d: d.__setitem__("schema_version", SCHEMA_VERSION + 1), fix_checksum=False)
    with pytest.raises(SerializationError, match=f"schema version {SCHEMA_VERSION + 1}.*newer Mode Lab"):
        load_ir(saved)
    rewrite(saved, lambda d: d.__setitem__("format", "onnx"), fix_checksum=False)
    with pytest.raises(SerializationError, match="not a Mode Lab IR file"):
        load_ir(saved)


def test_consistent_checksum_but_broken_references(saved: Path) -> None:
    # A hand edit that also recomputed the checksum is still caught by validation.
    rewrite(saved, lambda d: d["ir"]["nodes"][-1]["inputs"].__setitem__(0, "ghost"), fix_checksum=True)
    with pytest.raises(SerializationError, match="reads tensor 'ghost', which no earlier node"):
        load_ir(saved)


def test_bad_dtype_and_missing_member(saved: Path) -> None:
    rewrite(saved, lambda d: d["ir"]["graph_inputs"][0].__setitem__("dtype", "float128"), fix_checksum=True)
    with pytest.raises(SerializationError, match="unknown dtype 'float128'"):
        load_ir(saved)
    rewrite(saved, lambda d: (d["ir"]["graph_inputs"][0].__setitem__("dtype", "float32"), d["ir"].pop("weights")),
            fix_checksum=True)
    with pytest.raises(SerializationError, match="missing or wrong-typed member 'weights'"):
        load_ir(saved)
