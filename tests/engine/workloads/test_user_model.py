"""Bring your own model: a module written to tmp_path, imported from there (never copied), through input specs, the
one-line errors, the Workload (loss, tuple outputs), bench (eager, fx, compile), a mode that cannot take the model,
profile and ir — the last ones through the CLI, with real worker processes."""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

import pytest
import torch

from engine.cli.main import main
from engine.store.db import Store
from engine.workloads import user_model as um
from engine.workloads.user_model import ModelSpec, UserModelError, parse_inputs, prepare

MODULE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make_net():
    """A 16-32-4 MLP."""
    return Net()


def make_inputs(batch_size):
    return torch.randn(batch_size, 16)


def fixed_inputs():
    return torch.randn(4, 16)


class Branchy(nn.Module):
    """TorchScript cannot compile *args or a generator expression; eager runs it fine. Returns a tuple."""

    def __init__(self):
        super().__init__()
        self.branches = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x, *extra):
        return sum(b(x) for b in self.branches), x


def make_branchy():
    return Branchy()


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        y = self.fc(x)
        return y, y.sum(dim=-1)


def make_pair():
    return Pair()


def make_none():
    return 42


def make_raises():
    raise RuntimeError("no GPU here")


def make_tuple():
    return Net(), torch.randn(2, 16)


def dict_inputs(batch_size):
    return {"x": torch.randn(batch_size, 16)}


NOT_CALLABLE = 3
'''

WITH_LOSS = '''
import torch
from torch import nn


def make():
    return nn.Linear(4, 2)


def loss_fn(output):
    return output.abs().sum()
'''


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch):
    """Imports, sys.path entries and registered workloads of a test stay in that test."""
    import engine.workloads as workloads

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(workloads, "WORKLOADS", dict(workloads.WORKLOADS))
    monkeypatch.delenv(um.ENV_VAR, raising=False)
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("usermod_"):
            del sys.modules[name]


@pytest.fixture
def user_dir(tmp_path: Path, isolated) -> tuple[Path, str]:
    """(folder, module name): the user's module, in a folder of their own (not on the Python path)."""
    folder = tmp_path / "my_models"
    folder.mkdir()
    name = f"usermod_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(MODULE)
    return folder, name


def spec(user_dir: tuple[Path, str], what: str, inputs: str | None = None, seed: int = 0) -> ModelSpec:
    folder, name = user_dir
    return ModelSpec(f"{name}:{what}", inputs, seed, str(folder))


# -- input specs ----------------------------------------------------------------------------------------------------
def test_input_spec_shapes_ranges_and_seed() -> None:
    specs = parse_inputs(" float32[B, 16] ; int64[B,32]@0-1000; bool[3]; float16[2,B]@-1-1 ")
    assert [s.text() for s in specs] == ["float32[B,16]", "int64[B,32]@0-1000", "bool[3]", "float16[2,B]@-1-1"]
    gen = torch.Generator().manual_seed(1)
    x, ids, mask, h = (s.make(5, "cpu", gen) for s in specs)
    assert x.shape == (5, 16) and x.dtype == torch.float32
    assert ids.shape == (5, 32) and ids.dtype == torch.int64 and 0 <= int(ids.min()) and int(ids.max()) < 1000
    assert mask.dtype == torch.bool and mask.shape == (3,)
    assert h.dtype == torch.float16 and h.shape == (2, 5) and float(h.abs().max()) <= 1.0
    assert specs[0].make(2, "meta", gen).device.type == "meta"


@pytest.mark.parametrize("text, message", [
    ("", r"--inputs is empty"),
    ("float32(4)", r"item 1 'float32\(4\)': expected dtype\[dims\]"),
    ("f32[4]", r"unknown dtype 'f32'; use one of float32, "),
    ("int64[B,8]", r"integer inputs need a value range, e.g. int64\[B,8\]@0-1000"),
    ("float32[B,0]", r"dimension '0' is not B or a whole number"),
    ("float32[B,B]", r"B \(the batch dimension\) may appear once"),
    ("float32[4];int64[2]@5-5", r"item 2 'int64\[2\]@5-5': the range 5-5 is empty"),
    ("bool[2]@0-1", r"bool inputs take no range"),
    ("int32[2]@0.5-3", r"an integer range needs whole numbers"),
])
def test_bad_input_specs(text: str, message: str) -> None:
    with pytest.raises(UserModelError, match=message) as info:
        parse_inputs(text)
    assert "\n" not in str(info.value)


# -- one-line errors for every way a model can be wrong -------------------------------------------------------------
@pytest.mark.parametrize("what, inputs, message", [
    ("missing", "float32[B,16]",
     r"module 'usermod_\w+' \(.*usermod_\w+\.py\) has no attribute 'missing' \(the factory\)"),
    ("NOT_CALLABLE", "float32[B,16]", r"usermod_\w+:NOT_CALLABLE is a int, not a callable factory"),
    ("make_none", "float32[B,16]", r"usermod_\w+:make_none\(\) returned a int, not a torch\.nn\.Module"),
    ("make_raises", "float32[B,16]", r"usermod_\w+:make_raises\(\) raised RuntimeError: no GPU here"),
    ("make_tuple", "float32[B,16]", r"returned a tuple, not a torch\.nn\.Module: return the module alone"),
    ("make_net", None, r"no example inputs for usermod_\w+:make_net: add an inputs function"),
    ("make_net:make_inputs", "float32[B,16]", r"give example inputs once"),
    ("make_net:nope", None, r"has no attribute 'nope' \(the inputs function\)"),
    ("make_net:dict_inputs", None, r"usermod_\w+:dict_inputs returned dict, not a tensor or a tuple of tensors"),
    ("make_net", "float32[B,3]",
     r"forward failed on the example inputs \(float32\[1, 3\]\): RuntimeError: mat1 and mat2"),
])
def test_model_errors_are_one_line(user_dir, what: str, inputs: str | None, message: str) -> None:
    with pytest.raises(UserModelError, match=message) as info:
        prepare(spec(user_dir, what, inputs))
    assert "\n" not in str(info.value)


def test_import_errors_name_the_cause(user_dir, tmp_path: Path) -> None:
    folder, _ = user_dir
    with pytest.raises(UserModelError, match=r"cannot import 'usermod_gone' \(looked in .*my_models and the Python "
                                             r"path\): ModuleNotFoundError: No module named 'usermod_gone'"):
        prepare(ModelSpec("usermod_gone:make", "float32[B,4]", 0, str(folder)))
    (folder / "usermod_broken.py").write_text("def make(:\n    pass\n")
    with pytest.raises(UserModelError, match=r"cannot import 'usermod_broken': SyntaxError"):
        prepare(ModelSpec("usermod_broken:make", "float32[B,4]", 0, str(folder)))
    (folder / "usermod_deps.py").write_text("import a_package_nobody_installed\n")
    with pytest.raises(UserModelError, match=r"No module named 'a_package_nobody_installed'.*a module it imports"):
        prepare(ModelSpec("usermod_deps:make", "float32[B,4]", 0, str(folder)))
    with pytest.raises(UserModelError, match=r"expected module\.path:factory or module\.path:factory:inputs_fn"):
        prepare(ModelSpec("just a name", None, 0, str(folder)))
    with pytest.raises(UserModelError, match=r"unknown built-in example 'transformers:gpt9'; built-in: lab:llama"):
        prepare(ModelSpec("transformers:gpt9"))
    with pytest.raises(UserModelError, match=r"--model-path .* is not a folder"):
        prepare(ModelSpec("usermod_x:make", "float32[2]", 0, str(tmp_path / "nowhere")))


# -- the Workload ---------------------------------------------------------------------------------------------------
def test_workload_seeded_mse_loss_and_batch_sizes(user_dir) -> None:
    p = prepare(spec(user_dir, "make_net:make_inputs", seed=3))
    w = p.workload
    assert w.name.endswith(":make_net:make_inputs") and "A 16-32-4 MLP" in w.description and not p.notes
    assert w.default_batch_sizes == um.DEFAULT_BATCH_SIZES
    assert w.default_train_batch_sizes == um.DEFAULT_TRAIN_BATCH_SIZES
    a, b = w.make_model(), w.make_model()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    (x,), target = w.make_batch(5, "cpu")
    assert x.shape == (5, 16) and torch.equal(x, w.make_batch(5, "cpu")[0][0])
    out = a(x)
    torch.testing.assert_close(w.loss_fn(out, target), (out ** 2).mean())  # MSE against a zero target
    other = prepare(spec(user_dir, "make_net:make_inputs", seed=4)).workload.make_model()
    assert not torch.equal(other.fc1.weight, a.fc1.weight)  # --seed seeds the weights


def test_fixed_inputs_and_the_modules_own_loss(user_dir) -> None:
    folder, _ = user_dir
    p = prepare(spec(user_dir, "make_net:fixed_inputs"))
    assert p.workload.default_batch_sizes == (4,)
    with pytest.raises(UserModelError, match=r"takes no batch size and returns batch 4; give it a batch_size param"):
        p.workload.make_batch(8, "cpu")
    fixed = prepare(spec(user_dir, "make_net", "float32[3,16]"))
    assert fixed.workload.default_train_batch_sizes == (3,)
    with pytest.raises(UserModelError, match=r"have fixed shapes \(batch 3\); write B for the batch dimension"):
        fixed.workload.make_batch(2, "cpu")
    (folder / "usermod_loss.py").write_text(WITH_LOSS)
    w = prepare(ModelSpec("usermod_loss:make", "float32[B,4]", 0, str(folder))).workload
    assert "its module's loss_fn" in w.description
    out = w.make_model()(w.make_batch(2, "cpu")[0][0])
    torch.testing.assert_close(w.loss_fn(out, torch.zeros(0)), out.abs().sum())


def test_tuple_outputs_use_the_first_tensor_and_say_so(user_dir) -> None:
    p = prepare(spec(user_dir, "make_pair", "float32[B,16]"))
    assert p.notes == ["forward returns a tuple of 2: modes time and check its first element (float32[1, 4]); the "
                       "training loss uses it too"]
    model = p.workload.make_model()
    x = p.workload.make_batch(2, "cpu")[0][0]
    torch.testing.assert_close(model(x), model.model(x)[0])
    scripted = torch.jit.script(model)  # the adapter compiles wherever the model does
    torch.testing.assert_close(scripted(x), model(x))


def test_spec_params_round_trip_and_the_env_hand_over(user_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    s = spec(user_dir, "make_net", "float32[B, 16]", seed=7)
    assert ModelSpec.from_params(json.loads(json.dumps(s.params()))) == s
    assert s.name == f"{s.model} float32[B,16]" and ModelSpec.from_params({}) is None
    from engine.workloads import get_workload

    with pytest.raises(ValueError, match="unknown workload"):
        get_workload(s.name)
    monkeypatch.setenv(um.ENV_VAR, json.dumps(s.params()))  # what a worker hands its child processes
    assert get_workload(s.name).make_batch(2, "cpu")[0][0].shape == (2, 16)


def test_builtin_examples_listed() -> None:
    names = um.examples(installed_only=False)
    assert {"lab:llama", "lab:house_price", "transformers:gpt2-tiny", "transformers:bert-tiny",
            "transformers:llama-tiny", "transformers:t5-encoder-tiny", "transformers:vit-tiny"} <= set(names)
    assert "lab:llama-7B" not in names  # meta-only sizes are not runnable examples
    p = prepare(ModelSpec("lab:multi_io"))
    assert p.notes and "tuple of 2" in p.notes[0]
    assert [t.shape for t in p.workload.make_batch(3, "cpu")[0]] == [(3, 8), (3, 7, 6)]


# -- the command line: one line and exit 2 before any run ------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--model", "usermod_gone:make", "--inputs", "float32[B,4]"], r"^error: --model usermod_gone:make: cannot import"),
    (["--inputs", "float32[B,4]"], r"^error: --inputs needs --model"),
    (["--model", "lab:llama", "--workload", "house_price"], r"^error: give --workload or --model, not both"),
    (["--model", "{mod}:make_net", "--inputs", "float32[4,16]", "--batch-sizes", "2"],
     r"have fixed shapes \(batch 4\)"),
    (["--model", "{mod}:make_net", "--inputs", "int64[B,16]"], r"integer inputs need a value range"),
])
def test_cli_refuses_bad_models_in_one_line(user_dir, lab_env, capsys, args: list[str], message: str) -> None:
    folder, name = user_dir
    args = [a.replace("{mod}", name) for a in args]
    assert main(["bench", *args, "--model-path", str(folder), "--mode", "eager"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not Path(lab_env["RESULTS_DB"]).exists()


# -- through the job runner: bench, profile and ir rebuild the model in their workers from the import path ----------
@pytest.mark.slow
def test_bench_eager_fx_compile(user_dir, store: Store, capsys) -> None:
    folder, name = user_dir
    rc = main(["bench", "--model", f"{name}:make_net:make_inputs", "--model-path", str(folder), "--mode",
               "eager,fx,compile", "--iters", "3", "--warmup", "1", "--batch-sizes", "2", "--train-batch-sizes", "2",
               "--db", str(store.path)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    runs = store.runs(kind="bench")
    assert sorted(runs["mode"]) == ["compile", "eager", "fx"] and set(runs["status"]) == {"ok"}
    assert set(runs["workload"]) == {f"{name}:make_net:make_inputs"}
    params = store.run(int(runs["id"].iloc[0]))["params"]
    assert params["model"] == f"{name}:make_net:make_inputs" and params["model_path"] == str(folder)
    m = store.metrics(runs["id"].tolist())
    medians = m[m["name"] == "median"]
    assert len(medians) == 6 and (medians["value"] > 0).all()  # 3 modes × (infer, train) at batch 2
    assert (m[m["name"] == "max_abs_err"]["value"] < 1e-4).all()


@pytest.mark.slow
def test_torchscript_fails_only_its_own_run(user_dir, store: Store, capsys) -> None:
    folder, name = user_dir
    rc = main(["bench", "--model", f"{name}:make_branchy", "--inputs", "float32[B,8]", "--model-path", str(folder),
               "--mode", "eager,torchscript", "--phases", "infer", "--batch-sizes", "2", "--iters", "3", "--warmup",
               "1", "--db", str(store.path)])
    capsys.readouterr()
    assert rc == 1
    runs = store.runs(kind="bench").set_index("mode")
    assert runs.loc["eager", "status"] == "ok" and runs.loc["torchscript", "status"] == "failed"
    first = runs.loc["torchscript", "error"].splitlines()[0]
    assert re.fullmatch(rf"RuntimeError: torchscript failed on {name}:make_branchy: NotSupportedError: Compiled "
                        r"functions can't take variable number of arguments.*", first), first
    assert len(first) < 300
    notes = store.run(int(runs.loc["eager", "id"]))["notes"]
    assert any("forward returns a tuple of 2" in n for n in notes)  # the first element is what eager timed


@pytest.mark.slow
def test_profile_and_ir_with_verify(user_dir, store: Store, capsys) -> None:
    folder, name = user_dir
    model = f"{name}:make_net:make_inputs"
    rc = main(["profile", "--model", model, "--model-path", str(folder), "--mode", "eager", "--wait", "0",
               "--warmup", "0", "--active", "1", "--top-k", "3", "--db", str(store.path)])
    assert rc == 0, capsys.readouterr().err
    run = store.runs(kind="profile").iloc[0]
    assert run["workload"] == model and run["status"] == "ok"
    assert not store.op_stats([int(run["id"])]).empty
    capsys.readouterr()
    rc = main(["ir", "--model", model, "--model-path", str(folder), "--verify", "--seed", "5", "--db",
               str(store.path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK: the IR computes the model's outputs" in out
    ex = store.runs(kind="ir").set_index("mode")
    assert ex.loc["export", "workload"] == model and ex.loc["verify", "status"] == "ok"
    assert json.loads(ex.loc["verify", "params"])["seed"] == 5


@pytest.mark.slow
def test_dashboard_check_runs_in_a_subprocess(user_dir) -> None:
    good = um.check_in_subprocess(spec(user_dir, "make_pair", "float32[B,16]"))
    assert good.ok and good.batch_sizes == [1, 8] and good.output == "float32[1, 4]" and good.notes
    bad = um.check_in_subprocess(spec(user_dir, "make_raises", "float32[B,16]"))
    assert not bad.ok and re.search(r"make_raises\(\) raised RuntimeError: no GPU here$", bad.error)
    assert f"{user_dir[1]}" not in sys.modules  # the test process itself never imported the user's module


@pytest.mark.slow
def test_dashboard_extraction_job_and_its_verification(user_dir, store: Store) -> None:
    """The IR Explorer's path: extraction in a worker (extract_job), then verification rebuilt from the same params."""
    from engine.ir.runs import extract_spec, extractions, verifications, verify_refusal, verify_spec
    from engine.runner.jobs import create_runs, run_jobs

    s = spec(user_dir, "make_pair", "float32[B,16]")
    (run_id,) = create_runs(store, [extract_spec(s)])
    assert run_jobs(store, [run_id]) == {run_id: "ok"}, store.run(run_id)["error"]
    row = extractions(store).iloc[0]
    assert row["workload"] == s.name and row["model"] == s.model and row["nodes"] >= 2
    assert verify_refusal(store, run_id) is None
    (check,) = create_runs(store, [verify_spec(store, run_id)])
    assert run_jobs(store, [check]) == {check: "ok"}, store.run(check)["error"]
    assert verifications(store, run_id).iloc[0]["verify_ok"] == 1.0
