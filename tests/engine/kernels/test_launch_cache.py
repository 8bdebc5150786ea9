"""LaunchCache (engine/kernels/triton/_common.py): after the first launch per key, later calls launch the kept
compiled kernel with the runtime arguments followed by the kernel's non-tensor arguments in signature order."""

from __future__ import annotations

from engine.kernels.triton._common import LaunchCache


def kernel(x, y, n, BLOCK: int, FLAG: bool, EXTRA: int = 7):  # noqa: N803 — a stand-in for a @triton.jit signature
    pass


class FakeJit:
    """What LaunchCache reads of a JITFunction: its Python function, argument names and pre-run hooks."""

    def __init__(self) -> None:
        self.fn = kernel
        self.arg_names = ["x", "y", "n", "BLOCK", "FLAG", "EXTRA"]
        self.pre_run_hooks: list = []

    def run(self, *args, **kwargs):  # as JITFunction.run: hooks see the final arguments, returns the compiled kernel
        for hook in self.pre_run_hooks:
            hook(*args, **kwargs)
        return FakeCompiled()


class FakeCompiled:
    launches: list = []

    def __getitem__(self, grid):
        return lambda *args: FakeCompiled.launches.append((grid, args))


class FakeAutotuner:  # a wrapper: LaunchCache walks .fn down to the object with pre_run_hooks
    def __init__(self, fn: FakeJit) -> None:
        self.fn = fn


def test_the_first_call_is_kept_and_later_calls_launch_it_in_signature_order() -> None:
    jit = FakeJit()
    cache = LaunchCache(FakeAutotuner(jit))
    assert cache.jit is jit and cache.defaults == {"EXTRA": 7}
    key = ((4, 8), "bf16")
    assert cache.meta(key) is None and key not in cache.entries
    def autotuned_launch():  # tries two configs, then launches the winner: the last call's arguments are kept
        for block in (32, 128, 64):
            compiled = jit.run("x0", "y0", 5, BLOCK=block, FLAG=True, debug=False, num_warps=4)
        return compiled

    cache.first(key, autotuned_launch, 3)
    assert jit.pre_run_hooks == []  # the capture hook is gone again
    assert cache.meta(key) == {"BLOCK": 64, "FLAG": True, "EXTRA": 7}
    FakeCompiled.launches.clear()
    assert cache.launch(key, (3, 1, 1), "x1", "y1", 5)
    assert FakeCompiled.launches == [((3, 1, 1), ("x1", "y1", 5, 64, True, 7))]
    assert cache.launch(key, (2,), "x2", "y2", 5)  # a 1-d grid reaches the runner as the 3-d one it indexes
    assert FakeCompiled.launches[-1] == ((2, 1, 1), ("x2", "y2", 5, 64, True, 7))
    assert not cache.launch(("other",), (1,), "x", "y", 1)


def test_a_run_that_returns_no_compiled_kernel_keeps_the_slow_path() -> None:
    jit = FakeJit()
    cache = LaunchCache(jit)
    key = ("k",)
    cache.first(key, lambda: (jit.run("x", "y", 1, BLOCK=16, FLAG=False), None)[1], 3)
    assert key in cache.entries and cache.meta(key) is None and not cache.launch(key, (1,), "x", "y", 1)


def test_a_launcher_that_refuses_the_kept_arguments_sends_the_key_back_to_the_normal_path() -> None:
    class Refusing(FakeCompiled):
        def __getitem__(self, grid):
            def runner(*args):
                raise TypeError("function takes exactly 9 arguments (12 given)")
            return runner

    jit = FakeJit()
    cache = LaunchCache(jit)
    cache.first(("k",), lambda: (jit.run("x", "y", 1, BLOCK=16, FLAG=False), Refusing())[1], 3)
    assert cache.meta(("k",)) is not None
    assert not cache.launch(("k",), (1,), "x", "y", 1)
    assert cache.meta(("k",)) is None and "TypeError" in cache.refused and ("k",) in cache.entries
