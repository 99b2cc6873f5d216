"""`baton serve DIR --max-model-len 256 --max-num-seqs 4`, typed as a vLLM user would, in both modes
(colocated chosen by BATON_MODE and the port by BATON_PORT, as the README promises): every process
gets the settings it reads, /v1/models says 256, and an over-long request gets the same OpenAI error
(context_length_exceeded, naming 256) from both."""
from __future__ import annotations

import json
import re
import urllib.request

import openai
import pytest

from tests.launcher import ServeCommand

MODES = {
    "disaggregated": dict(args=("--mode", "disaggregated"), env=None, port_variable=False),
    "colocated": dict(args=(), env={"BATON_MODE": "colocated"}, port_variable=True),
}
TOO_LONG = re.compile(r"This model's maximum context length is 256 tokens\. However, your request "
                      r"has \d+ input tokens\. Please reduce the length of the input\.")


@pytest.fixture(scope="module", params=list(MODES))
def served(request, tiny_model_dirs):
    mode = MODES[request.param]
    serve = ServeCommand(str(tiny_model_dirs["llama"]), "--max-model-len", "256",
                         "--max-num-seqs", "4", "--worker-arg=--num-kv-blocks=256", *mode["args"],
                         env=mode["env"], port_variable=mode["port_variable"])
    try:
        assert serve.ready.wait(240), "\n".join(serve.lines)
        yield request.param, serve
    finally:
        serve.stop()


def test_each_process_gets_the_settings_it_reads(served) -> None:
    mode, serve = served
    [ready] = [line for line in serve.lines if line.startswith("baton serve ready")]
    assert f"address=127.0.0.1:{serve.port} mode={mode} " in ready
    children = serve.children()
    workers = [c for c in children if "worker" in c]
    roles = sorted(c[c.index("--role") + 1] for c in workers)
    assert roles == (["mixed"] if mode == "colocated" else ["decode", "prefill"])
    for command in workers:
        assert {"--max-model-len=256", "--max-num-seqs=4"} <= set(command)
    [gateway] = [c for c in children if "gateway" in c]
    assert "--max-model-len=256" in gateway and "--max-num-seqs=4" not in gateway


def test_the_limit_is_in_models_and_in_the_error(served) -> None:
    _, serve = served
    models = json.loads(urllib.request.urlopen(serve.url + "/models", timeout=10).read())["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("llama", 256)]
    client = openai.OpenAI(base_url=serve.url, api_key="none", max_retries=0)
    for param, create in (
            ("prompt", lambda **kw: client.completions.create(prompt="word " * 300, **kw)),
            ("messages", lambda **kw: client.chat.completions.create(
                messages=[{"role": "user", "content": "word " * 300}], **kw))):
        with pytest.raises(openai.BadRequestError) as refused:
            create(model="llama", max_tokens=4)
        error = refused.value.body
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error", "context_length_exceeded", param)
        assert TOO_LONG.fullmatch(error["message"]), error["message"]
    answer = client.completions.create(model="llama", prompt="word " * 20, max_tokens=4,
                                       temperature=0)
    assert answer.usage.completion_tokens == 4
