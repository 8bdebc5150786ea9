"""engine.store.settings: every environment variable in one registry, read through it, and the docs' table rendered
from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.store import settings

REPO = Path(__file__).resolve().parents[3]
# where a variable may be read or named: the code, the benchmarks, the tests and the docs (csrc's C++ has macros
# that share the prefix and are no environment variables)
SCANNED = [*(REPO / d for d in ("engine", "app", "benchmarks", "tests", "docs")), REPO / "README.md",
           REPO / "Makefile", REPO / "csrc" / "README.md"]
SUFFIXES = {".py", ".sh", ".md", ""}
PREFIX = "MODELAB" + "_"  # spelled in two parts, so that this file names no variable itself
NAME = re.compile(rf"\b{PREFIX}[A-Z0-9_]+")
# os.environ.get("X"), os.getenv("X"), os.environ["X"] not followed by an assignment (setting one for a child is no
# read)
DIRECT_READ = re.compile(r"(?:environ\.get\(|getenv\()\s*[\"']([A-Z][A-Z0-9_]*)[\"']"
                         r"|environ\[\s*[\"']([A-Z][A-Z0-9_]*)[\"']\s*\](?!\s*=(?!=))")


def _sources() -> dict[str, str]:
    """{path relative to the repository: text} of every scanned file but the registry itself."""
    files: list[Path] = []
    for root in SCANNED:
        files += [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    me = Path(settings.__file__).resolve()
    return {str(p.relative_to(REPO)): p.read_text(errors="replace") for p in files
            if p.resolve() != me and "__pycache__" not in p.parts}


def _without_table(text: str) -> str:
    table = settings.doc_table(text)
    return text.replace(table, "") if table else text


def test_a_setting_reads_its_value_parsed_and_its_default_where_unset(monkeypatch) -> None:
    monkeypatch.delenv("MODELAB_INT4_GEMV", raising=False)
    assert settings.get("MODELAB_INT4_GEMV") == "auto"
    monkeypatch.setenv("MODELAB_INT4_GEMV", " Triton ")
    assert settings.get("MODELAB_INT4_GEMV") == "triton"
    monkeypatch.setenv("MODELAB_NVTX", "0")
    assert settings.get("MODELAB_NVTX") is False
    monkeypatch.setenv("MODELAB_NVTX", "")  # blank is unset
    assert settings.get("MODELAB_NVTX") is True
    monkeypatch.delenv("RESULTS_DB", raising=False)
    assert settings.get("RESULTS_DB") is None  # no default here: the store's path is its reader's
    monkeypatch.setenv("RESULTS_DB", "/tmp/x.duckdb")
    assert settings.get("RESULTS_DB") == Path("/tmp/x.duckdb")
    monkeypatch.setenv("MODELAB_AOTI_OPTIONS", '{"max_autotune": true}')
    assert settings.get("MODELAB_AOTI_OPTIONS") == {"max_autotune": True}
    monkeypatch.setenv("MODELAB_TIMING_CORES", "6,7")
    assert settings.get("MODELAB_TIMING_CORES") == (6, 7)
    monkeypatch.setenv("MODELAB_TIMING_CORES", "6, 7,")  # blanks between the commas are skipped, as they always were
    assert settings.get("MODELAB_TIMING_CORES") == (6, 7)
    monkeypatch.delenv("MODELAB_IR_VERIFY_MAX_BYTES", raising=False)
    assert settings.get("MODELAB_IR_VERIFY_MAX_BYTES") == 2 * 2**30


@pytest.mark.parametrize(("name", "value", "says"), [
    ("MODELAB_NVTX", "maybe", "want 1 or 0"),
    ("MODELAB_INT4_GEMV", "tensor-cores", "choose one of auto, cuda, triton"),
    ("MODELAB_IR_VERIFY_MAX_BYTES", "2G", "want a whole number of at least 1"),
    ("MODELAB_IR_VERIFY_MAX_BYTES", "0", "want a whole number of at least 1"),
    ("MODELAB_CHECK_EXTRA_LAYERS", "-1", "want a whole number of at least 0"),
    ("MODELAB_AOTI_OPTIONS", "[1, 2]", "want a JSON object, got list"),
    ("MODELAB_AOTI_OPTIONS", "{max: 1}", "not JSON"),
    ("MODELAB_TIMING_CORES", "fast", "give core numbers, e.g. 6,7"),
    ("MODELAB_TIMING_CORES", ",", "give core numbers, e.g. 6,7"),
    ("MODELAB_FORKSERVER", "perhaps", "want 1 or 0"),
])
def test_a_bad_value_is_one_line_naming_the_variable_its_value_and_what_it_takes(name, value, says,
                                                                                 monkeypatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        settings.get(name)
    message = str(caught.value)
    assert message.startswith(f"{name}={value!r}: ") and says in message and "\n" not in message, message


def test_a_name_outside_the_registry_is_refused() -> None:
    with pytest.raises(KeyError, match="not a registered setting"):
        settings.get(PREFIX + "NO_SUCH_THING")


def test_every_setting_has_a_purpose_a_one_line_doc_and_a_default_its_parser_takes() -> None:
    for s in settings.SETTINGS.values():
        assert s.purpose in settings.PURPOSES, s.name
        assert s.doc and "\n" not in s.doc and "|" not in s.doc, s.name
        if s.default is not None:
            s.parse(s.default)


def test_the_docs_table_is_the_one_the_registry_renders() -> None:
    table = settings.doc_table(settings.DOC.read_text())
    assert table is not None, f"docs/architecture.md lost the table's markers; put them back and run " \
                              f"`{settings.WRITE_DOCS}`"
    assert table == settings.markdown_table(), (
        f"docs/architecture.md's environment table differs from engine/store/settings.py: run `{settings.WRITE_DOCS}`")
    assert len(table.splitlines()) == len(settings.SETTINGS) + 2


def test_write_docs_puts_the_rendered_table_between_the_markers() -> None:
    doc = f"# x\n\n{settings.DOC_BEGIN}\n| stale |\n{settings.DOC_END}\n\nafter\n"
    written = settings.with_table(doc)
    assert settings.doc_table(written) == settings.markdown_table()
    assert written.startswith("# x\n\n") and written.endswith("\n\nafter\n") and "stale" not in written
    with pytest.raises(ValueError, match="markers"):
        settings.with_table("# no markers\n")


def test_every_variable_the_code_tests_and_docs_name_is_registered() -> None:
    """A name the code reads or the docs mention must be in the registry: a switch that is retired leaves no reader
    and no mention behind. Compiler macros (given as -DNAME) share the prefix and are left out."""
    sources = _sources()
    macros = {m for text in sources.values() for m in re.findall(rf"-D({PREFIX}[A-Z0-9_]+)", text)}
    unknown = {}
    for path, text in sources.items():
        for name in set(NAME.findall(text)) - macros - set(settings.SETTINGS):
            unknown.setdefault(name, []).append(path)
    assert not unknown, f"not registered in engine/store/settings.py: {unknown}"


def test_every_registered_variable_is_read_somewhere() -> None:
    """A registered name that nothing outside the registry and its table names any more is stale."""
    text = "\n".join(_without_table(t) for t in _sources().values())
    unused = [name for name in settings.SETTINGS if not re.search(rf"\b{name}\b", text)]
    assert not unused, f"registered but named nowhere else (remove them from engine/store/settings.py): {unused}"


def test_code_reads_registered_variables_only_through_the_registry() -> None:
    reads = {}
    for path, text in _sources().items():
        if path.endswith(".py") and path.startswith(("engine/", "app/", "benchmarks/")):
            found = {a or b for a, b in DIRECT_READ.findall(text)}
            names = {n for n in found if n in settings.SETTINGS and n != "CXX"}  # CXX: the compilers' own too
            if names:
                reads[path] = sorted(names)
    assert not reads, f"read these through engine.store.settings.get: {reads}"
