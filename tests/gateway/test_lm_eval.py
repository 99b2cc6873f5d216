"""lm-evaluation-harness's `local-completions` model runs a log-likelihood (multiple choice) task
against the stack, disaggregated with every prompt handed off, so the prefill worker scores it. The
task and its data are written here; nothing is downloaded. Each choice's log-likelihood must equal
transformers' on the same checkpoint."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

ATOL = 1e-3  # a sum of a few float32 log-probabilities, each within 1e-4
DOCS = [
    {"question": "The sky is", "choices": [" blue", " green", " loud"], "answer": 0},
    {"question": "Two plus two is", "choices": [" four", " five", " a fish"], "answer": 0},
    {"question": "Cats say", "choices": [" woof", " meow"], "answer": 1},
    {"question": "Once upon a", "choices": [" time", " table", " river bank"], "answer": 0},
]
TASK = """task: baton_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def test_local_completions_scores_a_multiple_choice_task(handoff, model, tmp_path, monkeypatch):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    import lm_eval  # imported here, after the offline switches, which datasets reads at import
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (tmp_path / "task.yaml").write_text(TASK.format(data=data))
    lm = get_model("local-completions")(base_url=f"{handoff.url}/completions", model=model.name,
                                        tokenizer=str(model), tokenizer_backend="huggingface",
                                        max_retries=1, max_length=256)
    results = lm_eval.simple_evaluate(
        model=lm, tasks=["baton_tiny_mc"], log_samples=True,
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False))
    accuracy = results["results"]["baton_tiny_mc"]["acc,none"]
    assert isinstance(accuracy, float) and 0.0 <= accuracy <= 1.0
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    samples = results["samples"]["baton_tiny_mc"]
    assert len(samples) == len(DOCS)
    for sample in samples:
        assert len(sample["arguments"]) == len(sample["resps"]) == len(
            DOCS[sample["doc_id"]]["choices"])
        for (context, continuation), [(loglikelihood, _)] in zip(sample["arguments"],
                                                                 sample["resps"]):
            ctx, cont = lm._encode_pair(context, continuation)
            with torch.no_grad():
                logprobs = hf(torch.tensor([ctx + cont])).logits[0].float().log_softmax(dim=-1)
            expected = sum(float(logprobs[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))
            assert loglikelihood == pytest.approx(expected, abs=ATOL)
