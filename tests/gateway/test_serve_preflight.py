"""`baton serve` checks what it can before it starts any process: a missing model folder, a busy
port, a bad flag or value for any process is one clear line and exit status 2, at once (before,
the workers loaded for a while and the stack then failed with a page of logs). The cases run side
by side (each is a process that imports the serving stack's libraries: seconds of one core)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest


def serve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "baton.services.cli.main", "serve", *argv],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "BATON_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def busy_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


CASES = {
    "missing model": (lambda model, tmp, port: [str(tmp / "no-such-model")],
                      "model folder {tmp}/no-such-model does not exist"),
    "not a checkpoint": (lambda model, tmp, port: [str(tmp)],
                         "{tmp} is not a checkpoint folder: it has no config.json"),
    "busy port": (lambda model, tmp, port: [str(model), "--port", str(port)],
                  "the gateway cannot listen on 127.0.0.1:{port} (--host, --port): "
                  "Address already in use"),
    "bad worker flag": (lambda model, tmp, port: [str(model), "--worker-arg=--no-such-flag"],
                        "baton worker: unrecognized arguments: --no-such-flag"),
    "bad decode value": (lambda model, tmp, port: [str(model), "--decode-worker-arg=--seed=x"],
                         "baton worker: argument --seed: invalid int value: 'x'"),
    "bad router value": (lambda model, tmp, port: [str(model), "--router-arg=--queue-max-size=-1"],
                         "baton router: --queue-max-size: Input should be greater than or equal"),
    "bad gateway value": (lambda model, tmp, port: [str(model), "--gateway-arg=--slos=fast"],
                          "baton gateway: --slos: bad SLO entry 'fast'"),
    "bad engine value": (lambda model, tmp, port: [str(model), "--max-num-seqs", "0"],
                         "--max-num-seqs: Input should be greater than or equal to 1"),
    "missing keys file": (lambda model, tmp, port: [str(model), "--api-keys-file", str(tmp / "k")],
                          "API-keys file {tmp}/k does not exist"),
}


@pytest.fixture(scope="module")
def outcomes(tiny_model_dirs, tmp_path_factory,
             busy_port: int) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """Each case's folder and what `baton serve` did with its arguments, all run at once."""
    folders = {case: tmp_path_factory.mktemp("preflight") for case in CASES}

    def run(case: str) -> subprocess.CompletedProcess[str]:
        return serve(*CASES[case][0](tiny_model_dirs["llama"], folders[case], busy_port))

    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(CASES, pool.map(run, CASES)))
    return {case: (folders[case], results[case]) for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_a_mistake_is_one_line_before_anything_starts(case: str, outcomes, busy_port: int) -> None:
    tmp_path, result = outcomes[case]
    expected = CASES[case][1]
    lines = [line for line in (result.stdout + result.stderr).splitlines()
             if " WARNING " not in line]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1, lines
    assert "baton serve: " + expected.format(tmp=tmp_path, port=busy_port) in lines[0]
