"""`baton serve --model A --model B`'s plan: each model's own prefill and decode workers sharing
the GPU evenly, the router told every model's name, the gateway every model's folder; names paired
with models in order; and the ways to get it wrong, each one clear error."""
from __future__ import annotations

from pathlib import Path

import pytest

from baton.services.cli import serve
from baton.services.cli.main import build_parser
from baton.services.cli.serve_config import ServeSettings, resolve
from baton.services.cli.serve_models import ModelPlan, model_plans


def settings(*argv: str) -> ServeSettings:
    return resolve(build_parser("serve").parse_args(["serve", *argv]))


def test_each_model_gets_its_own_pools(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    given = settings("--model", str(a), "--model", str(b), "--served-model-name", "alpha",
                     "--gpu-memory-utilization", "0.8")
    assert (given.engine.model, given.engine.served_model_name) == (str(a), "alpha")
    models = model_plans(ModelPlan(str(a), "alpha"), given.more_models, given.more_names)
    assert models == [ModelPlan(str(a), "alpha"), ModelPlan(str(b), "b")]  # b: its folder's name
    workers = serve.plan_stack(given, models)
    assert [w.name for w in workers] == ["prefill-worker-0", "decode-worker-1",
                                         "prefill-worker-2", "decode-worker-3"]
    for worker, (path, name) in zip(workers, [(a, "alpha"), (a, "alpha"), (b, "b"), (b, "b")]):
        assert {f"--model={path}", f"--served-model-name={name}",
                "--gpu-memory-utilization=0.2000"} <= set(worker.args)
    router = serve.router_args(given, models, ["127.0.0.1:2"])
    assert router[router.index("--additional-models") + 1] == "b"
    assert "--model=alpha" in router
    gateway = serve.gateway_args(given, models, "127.0.0.1:1")
    assert gateway[gateway.index("--additional-models") + 1] == f"b={b}"
    assert {f"--model={a}", "--served-model-name=alpha"} <= set(gateway)
    serve.check_commands(given, workers, models)  # every process accepts its command line


def test_names_pair_with_models_in_order(tmp_path: Path) -> None:
    given = settings(str(tmp_path / "a"), "--model", str(tmp_path / "a"), "--model",
                     str(tmp_path / "b"), "--served-model-name", "x", "--served-model-name", "y")
    assert (given.engine.model, given.engine.served_model_name) == (str(tmp_path / "a"), "x")
    assert (given.more_models, given.more_names) == ([str(tmp_path / "b")], ["y"])


@pytest.mark.parametrize("argv, message", [
    (["--model", "a", "--served-model-name", "x", "--served-model-name", "y"],
     "2 --served-model-name for 1 --model"),
    (["a", "--model", "b", "--model", "c"], "two models given: a and --model b"),
])
def test_a_bad_pairing_is_one_clear_error(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings(*argv)


def test_two_models_of_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="two models are named 'm'"):
        model_plans(ModelPlan("/x/m", "m"), ["/y/m"], [])
