"""`baton run-batch -i IN.jsonl -o OUT.jsonl`: an OpenAI batch file through one engine, offline.

Input lines are OpenAI batch requests ({"custom_id", "method", "url", "body"}); output lines are
OpenAI batch results in input order. A line that cannot be served gets a 400 result of its own and
the others go on. With LoRA adapters (vLLM's --enable-lora, --lora-modules name=path ...,
--max-loras, --max-lora-rank) a line's `model` may name one.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from typing import Any

from baton.services.cli.engine_runner import sim_runner_for
from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.engine.config import EngineConfig
from baton.services.engine.parallel.sharding import ShardingError
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.lora.modules import LoRAError
from baton.services.engine.offline import run_requests
from baton.services.engine.speculation.config import SpeculativeConfigError
from baton.services.openai.errors import ProtocolError

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run-batch", help="run an OpenAI batch file (JSONL) offline",
        description="Serve every line of an OpenAI batch input file (/v1/completions and "
                    "/v1/chat/completions) with one engine and write the batch output file, one "
                    "line per input line, in order. A line's `model` may name a LoRA adapter "
                    "given with --lora-modules.")
    parser.add_argument("-i", "--input-file", required=True, help="OpenAI batch input file (JSONL)")
    parser.add_argument("-o", "--output-file", required=True,
                        help="where to write the batch output (JSONL)")
    add_settings_arguments(parser, EngineConfig)
    parser.set_defaults(func=run)


def parse_line(line: str, number: int) -> tuple[str | None, tuple[str, Any] | ProtocolError]:
    """The custom_id of a batch input line (None when unreadable) and its (url, body), or why it
    cannot be served."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        return None, ProtocolError(f"line {number}: invalid JSON: {e}", code="invalid_json")
    if not isinstance(item, dict):
        return None, ProtocolError(f"line {number}: a batch line must be a JSON object",
                                   code="invalid_json")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, ProtocolError(f"line {number}: custom_id must be a non-empty string",
                                   param="custom_id")
    if item.get("method", "POST") != "POST":
        return custom_id, ProtocolError(
            f"line {number}: method must be POST, not {item['method']!r}", param="method")
    if not isinstance(item.get("url"), str):
        return custom_id, ProtocolError(f"line {number}: url must be a string", param="url")
    extra = set(item) - {"custom_id", "method", "url", "body"}
    if extra:
        return custom_id, ProtocolError(f"line {number}: unknown batch line fields {sorted(extra)}",
                                        param=min(extra))
    return custom_id, (item["url"], item.get("body"))


def output_line(custom_id: str | None, result: dict[str, Any] | ProtocolError) -> dict[str, Any]:
    """An OpenAI batch output line: errors are responses too (their status and error body), as
    OpenAI writes them."""
    if isinstance(result, ProtocolError):
        status, request_id, body = result.status, f"req_{uuid.uuid4().hex}", result.body()
    else:
        status, request_id, body = 200, result["id"], result
    return {
        "id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body}, "error": None
    }


def run(args: argparse.Namespace) -> int:
    try:
        with open(args.input_file, encoding="utf-8") as f:
            lines = [(n, line) for n, line in enumerate(f, start=1) if line.strip()]
    except OSError as e:
        print(f"baton run-batch: error: {e}", file=sys.stderr)
        return 1
    custom_ids: list[str | None] = []
    results: list[dict[str, Any] | ProtocolError | None] = []
    requests: list[tuple[str, Any]] = []
    for number, line in lines:
        custom_id, parsed = parse_line(line, number)
        custom_ids.append(custom_id)
        if isinstance(parsed, ProtocolError):
            results.append(parsed)
        else:
            results.append(None)  # filled from the engine's results below
            requests.append(parsed)
    engine_config = settings_from_args(EngineConfig, args)
    try:
        engine = LLMEngine(engine_config, sim_runner=sim_runner_for(engine_config))
    except (ShardingError, LoRAError, SpeculativeConfigError) as e:
        # A model it cannot split, an adapter it cannot take, a draft or EAGLE head that cannot
        # serve it.
        print(f"baton run-batch: error: {e}", file=sys.stderr)
        return 2
    try:
        served = iter(run_requests(engine, requests))
    finally:
        engine.close()
    results = [next(served) if r is None else r for r in results]
    with open(args.output_file, "w", encoding="utf-8") as out:
        for custom_id, result in zip(custom_ids, results):
            out.write(json.dumps(output_line(custom_id, result), ensure_ascii=False) + "\n")
    failed = sum(isinstance(r, ProtocolError) for r in results)
    log.info("wrote %d results to %s (%d failed)", len(results), args.output_file, failed)
    return 0
