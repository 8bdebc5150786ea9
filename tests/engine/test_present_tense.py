"""The code and docs read in the present tense: no work-journal wording in comments, docstrings or docs.

What counts as journal wording: a numbered work session (the word followed by a number, or "(a later" and the
word), "did not help", and a date in YYYY-MM-DD form. Dates are allowed in one place only: the date column of
docs/figures.md's tables, where each figure names when it was taken. In Python files a date is looked for in
comments and docstrings only, so test data such as `pd.to_datetime(["2026-01-01"])` stays allowed; the session and
"did not help" patterns apply to every line.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("engine", "app", "docs", "benchmarks", "tests", "csrc")
TOP_FILES = ("Makefile", "README.md")
SUFFIXES = {".py", ".md", ".sh", ".cu", ".cuh", ".cpp", ".h"}
FIGURES = Path("docs") / "figures.md"
SELF = Path(__file__).resolve()  # this file spells the patterns out

JOURNAL = re.compile(
    r"\bsessions? \d"  # the word with a number after it, singular or plural
    r"|\((?:(?:a|an|the|this|that|one|later|earlier|next|same|previous)\s+)*session\b(?![)\w,=.\[]| state)"
    r"|\b(?:this|that|a later|an earlier|the previous|the next) session\b"
    r"|did not help",
    re.IGNORECASE,
)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def _python_prose(text: str) -> dict[int, str]:
    """{line: text} of a Python file's comments and docstrings (string statements), every line of a long one."""
    prose: dict[int, str] = {}
    starts_statement = True
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return dict(enumerate(text.splitlines(), 1))  # not parseable: judge every line
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            prose[tok.start[0]] = prose.get(tok.start[0], "") + " " + tok.string
        elif tok.type == tokenize.STRING and starts_statement:
            for offset, line in enumerate(tok.string.splitlines()):
                prose[tok.start[0] + offset] = prose.get(tok.start[0] + offset, "") + " " + line
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT):
            starts_statement = starts_statement if tok.type in (tokenize.NL, tokenize.COMMENT) else True
        else:
            starts_statement = False
    return prose


def _cells(line: str) -> list[str]:
    """A markdown table row's cells (a `\\|` inside a cell stays in it)."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    return parts[1:-1] if line.strip().endswith("|") else parts[1:]


def _without_date_column(lines: list[str]) -> list[str]:
    """figures.md's lines with the cell under each table's "date" header blanked out."""
    out, date_col = [], None
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            date_col = None
            out.append(line)
            continue
        cells = _cells(line)
        is_header = i + 1 < len(lines) and re.fullmatch(r"\s*\|[\s:|-]+\|?\s*", lines[i + 1]) is not None
        if is_header:
            names = [c.strip().lower() for c in cells]
            date_col = names.index("date") if "date" in names else None
        elif date_col is not None and date_col < len(cells):
            cells[date_col] = " "
            line = "|" + "|".join(cells) + "|"
        out.append(line)
    return out


def journal_lines(path: Path, rel: Path | None = None) -> list[tuple[int, str]]:
    """(line number, line) of every line of `path` that reads like a work journal."""
    rel = rel if rel is not None else path
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    if path.suffix == ".py":
        dated = _python_prose(text)
    elif rel.as_posix() == FIGURES.as_posix():
        dated = dict(enumerate(_without_date_column(lines), 1))
    else:
        dated = dict(enumerate(lines, 1))
    found = []
    for number, line in enumerate(lines, 1):
        if JOURNAL.search(line) or DATE.search(dated.get(number, "")):
            found.append((number, line.strip()))
    return found


def scanned_files(repo: Path = REPO) -> list[Path]:
    files = [repo / name for name in TOP_FILES if (repo / name).is_file()]
    for root in ROOTS:
        files += sorted(p for p in (repo / root).rglob("*")
                        if p.is_file() and (p.suffix in SUFFIXES or p.name == "Makefile")
                        and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts)
    return [p for p in files if p.resolve() != SELF]


def test_the_tree_reads_in_the_present_tense() -> None:
    files = scanned_files()
    names = {p.relative_to(REPO).as_posix() for p in files}
    assert {"Makefile", "engine/__init__.py", "docs/figures.md", "docs/quantization.md"} <= names
    assert len(files) > 200  # the scan covers the tree, not a corner of it
    found = [f"{p.relative_to(REPO)}:{n}: {line[:140]}"
             for p in files for n, line in journal_lines(p, p.relative_to(REPO))]
    assert not found, ("journal wording (sessions, dated figures, 'did not help'): say what the code does and why, "
                       "and put figures in docs/figures.md\n" + "\n".join(found))


# The planted lines spell the word in two parts, so that a search of the tree for journal wording skips this file.
SESSION = "sess" + "ion"


@pytest.mark.parametrize("name, text, flagged", [
    ("notes.md", "Fine.\nMeasured in " + SESSION + " 12, it did not help.\nAlso fine.\n", [2]),
    ("notes.md", "the gate (a later " + SESSION + ") changed\n", [1]),
    ("notes.md", "Timed 2026-11-24 on the GPU.\n", [1]),
    ("Makefile", "# (2026-11-28, two H200s) kernels ran past 540 s\ntest:\n\ttrue\n", [1]),
    ("kernel.cu", "// ran faster in " + SESSION + " 7\nint x;\n", [1]),
    ("mod.py", '"""Docstring (H100, 2026-11-27)."""\nX = ["2026-01-01"]  # data, not prose\n# see '
     + SESSION + ' 3\n', [1, 3]),
    ("mod.py", 'def f():\n    """Spans\n    2026-11-25 on its second line."""\n    return "2026-01-02"\n', [3]),
    ("mod.py", "def test_x(session):\n    session.run()  # a fixture\nS = st.session_state\n", []),
    ("mod.py", "# values can also come from session state (session state, here)\n", []),
])
def test_the_scan_finds_a_planted_line(tmp_path, name, text, flagged) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert [n for n, _ in journal_lines(path)] == flagged


def test_figures_md_may_date_its_date_column_only(tmp_path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    path = docs / "figures.md"
    path.write_text("# Figures\n\n| what | figure | date | machine |\n| --- | --- | --- | --- |\n"
                    "| copy | 3.0 TB/s | 2026-11-24 | H100 |\n"
                    "| copy | 2.9 TB/s (was 2026-11-23's) | 2026-11-24 | H100 |\n"
                    "\nTaken on 2026-11-24.\n\n| what | figure |\n| --- | --- |\n| copy | 2026-11-24 |\n")
    assert [n for n, _ in journal_lines(path, Path("docs/figures.md"))] == [6, 8, 12]
    assert journal_lines(path, Path("docs/other.md"))  # elsewhere the date column is no exception
