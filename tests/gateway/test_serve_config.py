"""`baton serve`'s settings: vLLM's flag names for the engine's and the gateway's settings, a
positional model, a YAML --config with the same keys (flag > variable > file > default), and each
setting passed on to the processes that read it, the per-role overrides last."""
from __future__ import annotations

from pathlib import Path

import pytest

from baton.services.cli import serve
from baton.services.cli.main import build_parser
from baton.services.cli.serve_config import ServeSettings, resolve
from baton.services.cli.serve_models import ModelPlan
from baton.services.engine.config import EngineConfig
from baton.services.gateway.config import GatewayConfig


def settings(*argv: str) -> ServeSettings:
    return resolve(build_parser("serve").parse_args(["serve", *argv]))


def test_every_engine_setting_is_a_serve_flag() -> None:
    """A field EngineConfig gains (tensor parallelism, say) is a serve flag without a change."""
    parser = build_parser("serve")._subparsers._group_actions[0].choices["serve"]
    options = {o for action in parser._actions for o in action.option_strings}
    assert {"--" + n.replace("_", "-") for n in EngineConfig.model_fields} <= options
    assert {"--slos", "--api-keys-file", "--max-migrations", "--port"} <= options
    assert "--router" not in options and "--metrics-port" not in options


def test_the_config_file_sits_below_variables_and_flags(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("max-model-len: 128\nmax_num_seqs: 64\nmode: colocated\nslos: '0=9/9'\n"
                      "worker-arg: [--num-kv-blocks=64]\n")
    monkeypatch.setenv("BATON_MAX_NUM_SEQS", "32")
    got = settings("--config", str(config), "--mode", "disaggregated", "--worker-arg=--seed=3")
    assert got.engine.max_model_len == got.gateway.max_model_len == 128  # the file
    assert got.engine.max_num_seqs == 32  # the variable over the file
    assert got.serve.mode == "disaggregated"  # the flag over the file
    assert got.gateway.slos == "0=9/9"
    assert got.extra["worker_arg"] == ["--num-kv-blocks=64", "--seed=3"]  # the flag's last


@pytest.mark.parametrize("text, message", [
    ("max-model-length: 128\n", "unknown setting 'max-model-length' (did you mean max-model-len?)"),
    ("router: x:1\n", "unknown setting 'router'"),
    ("- max-model-len\n", "expected a mapping of settings"),
    ("max-num-seqs: [1\n", "not valid YAML at line"),
    ("max-num-seqs: 0\n", "--max-num-seqs: Input should be greater than or equal to 1"),
])
def test_a_bad_config_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(text)
    with pytest.raises(ValueError, match="^[^\n]*$") as refused:
        settings("--config", str(config))
    assert message in str(refused.value)


def test_the_model_may_come_first(tmp_path: Path) -> None:
    assert settings(str(tmp_path)).engine.model == str(tmp_path)
    assert settings(str(tmp_path), "--model", str(tmp_path)).gateway.model == str(tmp_path)
    with pytest.raises(ValueError, match="two models given"):
        settings(str(tmp_path), "--model", "/elsewhere")


def test_settings_reach_the_processes_that_read_them() -> None:
    given = settings("--max-model-len", "256", "--max-num-seqs", "4", "--no-enable-prefix-caching",
                     "--block-size", "32", "--slos", "0=500/50", "--max-migrations", "0",
                     "--gpu-memory-utilization", "0.8", "--prefill-memory-share", "0.25",
                     "--worker-arg=--num-kv-blocks=64", "--prefill-worker-arg=--max-num-seqs=2",
                     "--decode-worker-arg=--seed=7")
    prefill, decode = serve.plan_workers(given, "/m/dir", "name")
    for worker in (prefill, decode):
        assert {"--max-model-len=256", "--no-enable-prefix-caching", "--block-size=32",
                "--model=/m/dir", "--served-model-name=name", "--num-kv-blocks=64"} <= set(
                    worker.args)
    # the role's own arguments come last, so they win
    assert prefill.args[-2:] == ["--num-kv-blocks=64", "--max-num-seqs=2"]
    assert decode.args[-2:] == ["--num-kv-blocks=64", "--seed=7"]
    assert "--gpu-memory-utilization=0.2000" in prefill.args
    assert "--gpu-memory-utilization=0.6000" in decode.args
    gateway = serve.gateway_args(given, [ModelPlan("/m/dir", "name")], "127.0.0.1:1")
    assert {"--max-model-len=256", "--slos=0=500/50", "--max-migrations=0", "--no-auth"} <= set(
        gateway)
    assert "--max-num-seqs=4" not in gateway  # not a gateway setting
    assert "--block-size=32" in serve.router_args(given, [ModelPlan("/m/dir", "name")],
                                                  ["127.0.0.1:2"])


HND = ["--kv-cache-layout=HND"]


@pytest.mark.parametrize("extra,layout", [
    ((), []),  # equal sizes: whole blocks either way
    (("--prefill-worker-arg=-tp=2",), HND),
    (("--decode-worker-arg=--tensor-parallel-size=2",), HND),
    (("--prefill-worker-arg=-tp=2", "--kv-cache-layout", "NHD"), ["--kv-cache-layout=NHD"]),
    (("--prefill-worker-arg=-tp=2", "--worker-arg=--kv-cache-layout=NHD"),
     ["--kv-cache-layout=NHD"]),
])
def test_pools_of_different_tp_sizes_get_head_major_blocks(extra: tuple, layout: list) -> None:
    for worker in serve.plan_workers(settings(*extra), "/m/dir", "name"):
        assert [a for a in worker.args if a.startswith("--kv-cache-layout")] == layout


def test_keys_turn_auth_on() -> None:
    assert settings().auth is False
    assert settings("--api-keys-file", "keys.yaml").auth is True
    assert settings("--api-keys-file", "keys.yaml", "--no-auth").auth is False
    assert GatewayConfig().auth is True  # a gateway alone still wants keys
