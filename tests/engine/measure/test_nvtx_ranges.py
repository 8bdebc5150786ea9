"""NVTX ranges: off, a shared no-op; on, one nvtx.annotate per name, pushed and popped around the block (a stand-in
nvtx module records the calls: the real one needs a CUDA profiler attached to show anything)."""

from __future__ import annotations

import pytest

from engine.measure import nvtx_ranges


class FakeNvtx:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.built: list[str] = []
        outer = self

        class annotate:  # noqa: N801 - mirrors nvtx.annotate
            def __init__(self, message: str, domain: str) -> None:
                assert domain == "modelab"
                self.message = message
                outer.built.append(message)

            def __enter__(self):
                outer.events.append(f"push {self.message}")
                return self

            def __exit__(self, *exc) -> bool:
                outer.events.append(f"pop {self.message}")
                return False

        self.annotate = annotate


def test_off_is_one_shared_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvtx_ranges, "_enabled", False)
    assert nvtx_ranges.range("a") is nvtx_ranges.range("b")
    with nvtx_ranges.range("a"):
        pass


def test_on_pushes_and_pops_and_builds_each_name_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvtx()
    monkeypatch.setattr(nvtx_ranges, "_nvtx", fake)
    monkeypatch.setattr(nvtx_ranges, "_enabled", True)
    monkeypatch.setattr(nvtx_ranges, "_annotations", {})
    for _ in range(3):
        with nvtx_ranges.range("train_step"):
            with nvtx_ranges.range("forward"):
                pass
    with pytest.raises(ValueError), nvtx_ranges.range("train_step"):
        raise ValueError("the range still pops")
    assert fake.built == ["train_step", "forward"]
    assert fake.events[:4] == ["push train_step", "push forward", "pop forward", "pop train_step"]
    assert fake.events[-2:] == ["push train_step", "pop train_step"] and len(fake.events) == 14
