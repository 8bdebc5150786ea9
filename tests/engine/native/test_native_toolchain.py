"""The toolchain checks behind the AOTInductor fixes: which compiler builds the runner and what it may export
(engine/native/toolchain.py says why each exists; the libstdc++ preload is tests/engine/runner/test_worker_env.py's)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from engine.native import toolchain


def _compile(tmp_path: Path, source: str, *flags: str) -> Path:
    cxx = toolchain.find_cxx()
    if cxx is None or shutil.which("nm") is None:
        pytest.skip("needs a C++ compiler and nm")
    src = tmp_path / "prog.cpp"
    src.write_text(source)
    exe = tmp_path / "prog"
    subprocess.run([cxx, str(src), "-o", str(exe), *flags], check=True, capture_output=True)
    return exe


def test_a_plain_executable_exports_no_std_code(tmp_path):
    exe = _compile(tmp_path, "#include <string>\n#include <iostream>\n"
                             "int main(int c, char** v) { std::string s(v[0]); std::cout << s.size(); }\n")
    assert toolchain.exported_std_code(exe) == []


def test_std_code_linked_into_an_executable_is_found(tmp_path):
    # What the GPU image's /opt/gcc compiler did to the runner: runtime functions of namespace std, defined (T) in
    # the executable and exported, where libtorch's calls bind to them.
    exe = _compile(tmp_path, "#include <stdexcept>\nint main() { try { throw std::runtime_error(\"x\"); }"
                             " catch (const std::exception& e) { return e.what()[0] == 'x' ? 0 : 1; } }\n",
                   "-static-libstdc++", "-rdynamic")
    leaked = toolchain.exported_std_code(exe)
    assert leaked and all(name.startswith(("_ZNSt", "_ZNKSt", "_ZSt")) for name in leaked)


def test_cxx_from_the_environment_is_tried_first(monkeypatch):
    gxx = shutil.which("g++") or pytest.skip("needs g++ on PATH")
    monkeypatch.setenv("CXX", "g++")
    candidates = toolchain.runner_cxx_candidates()
    assert candidates[0] == gxx and len(candidates) == len(set(candidates))
    monkeypatch.delenv("CXX")
    assert gxx in toolchain.runner_cxx_candidates()


def _static_libstdcxx_compiler(tmp_path: Path) -> str:
    """A compiler that links libstdc++ into every shared object, as the GPU image's $CXX (/opt/gcc/bin/g++) does."""
    cxx = toolchain.find_cxx()
    if cxx is None or shutil.which("nm") is None:
        pytest.skip("needs a C++ compiler and nm")
    wrapper = tmp_path / "static-g++"
    wrapper.write_text(f'#!/bin/sh\nexec {cxx} -static-libstdc++ "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_compiler_that_links_libstdcxx_into_libraries_is_passed_over(tmp_path, monkeypatch):
    static = _static_libstdcxx_compiler(tmp_path)
    assert toolchain.shared_library_exports_std(static) is True
    assert toolchain.shared_library_exports_std(toolchain.find_cxx()) is False
    assert toolchain.shared_library_exports_std(str(tmp_path / "no-such-compiler")) is None
    monkeypatch.setenv("CXX", static)
    toolchain.library_cxx.cache_clear()
    try:
        chosen = toolchain.library_cxx()
        assert chosen is not None and chosen != static  # $CXX comes first, but its libraries would interpose
        assert toolchain.shared_library_exports_std(chosen) is False
        with toolchain.library_compiler() as cxx:  # what cpp_extension reads while a library builds
            assert cxx == chosen and toolchain.os.environ["CXX"] == chosen
        assert toolchain.os.environ["CXX"] == static  # restored
    finally:
        toolchain.library_cxx.cache_clear()


def test_a_compiler_whose_libraries_export_nothing_is_kept(monkeypatch):
    cxx = toolchain.find_cxx()
    if cxx is None or shutil.which("nm") is None:
        pytest.skip("needs a C++ compiler and nm")
    monkeypatch.setenv("CXX", cxx)
    toolchain.library_cxx.cache_clear()
    try:
        assert toolchain.library_cxx() == cxx
    finally:
        toolchain.library_cxx.cache_clear()
    monkeypatch.delenv("CXX")
    with toolchain.library_compiler():
        pass
    assert "CXX" not in toolchain.os.environ  # unset before, unset after


def test_the_compiler_probe_is_remembered_across_processes_in_its_cache_file(tmp_path, monkeypatch):
    static = _static_libstdcxx_compiler(tmp_path)
    cache = tmp_path / "build" / "cxx_probe.json"
    monkeypatch.setenv("CXX", static)
    toolchain.library_cxx.cache_clear()
    try:
        chosen = toolchain.library_cxx(cache)
        assert chosen != static
        written = toolchain.json.loads(cache.read_text())
        assert sorted(written.values()) == [False, True]  # the wrapper leaks, the next compiler does not
        # a later process reads the file instead of probing: told the wrapper exports nothing, it takes it
        cache.write_text(toolchain.json.dumps({k: False for k in written}))
        toolchain.library_cxx.cache_clear()
        assert toolchain.library_cxx(cache) == static
        cache.write_text("{not json")  # a damaged file: probed again, and rewritten
        toolchain.library_cxx.cache_clear()
        assert toolchain.library_cxx(cache) == chosen
        assert sorted(toolchain.json.loads(cache.read_text()).values()) == [False, True]
    finally:
        toolchain.library_cxx.cache_clear()
