"""The worker touches the engine only through its serving API (llm_engine.SERVING_API), sent to the
engine thread as the engine loop's named commands: a boundary that a test keeps, so the engine's
insides can change without the worker noticing."""
from __future__ import annotations

import ast
from pathlib import Path

from baton.services.engine.llm_engine import SERVING_API, LLMEngine

WORKER = Path(__file__).resolve().parents[2] / "services" / "worker"


def _engine_params(fn: ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Parameters that receive an engine: `lambda e: ...` and parameters annotated LLMEngine."""
    if isinstance(fn, ast.Lambda):
        return {a.arg for a in fn.args.args if a.arg in ("e", "engine")}
    return {a.arg for a in fn.args.args
            if a.annotation is not None and "LLMEngine" in ast.unparse(a.annotation)}


def _engine_names(fn: ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names that hold an engine: its parameters that receive one, and aliases of `engine` /
    `x.engine`."""
    names = _engine_params(fn)
    if isinstance(fn, ast.Lambda):
        return names
    for node in ast.walk(fn):  # aliases: e = self.engine
        if isinstance(node, ast.Assign) and _is_engine(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _is_engine(node: ast.expr) -> bool:
    """`engine`, `x.engine`, or the class itself (a command names `LLMEngine.submit`)."""
    return (isinstance(node, ast.Name) and node.id in ("engine", "LLMEngine")
            or isinstance(node, ast.Attribute) and node.attr == "engine")


def engine_attributes(source: str) -> set[str]:
    """Every attribute read off an engine in source: on `engine`, `self.engine`, `LLMEngine`, or an
    alias."""
    tree = ast.parse(source)
    found: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            names = _engine_names(fn)
            found |= {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id in names}
    found |= {n.attr for n in ast.walk(tree)
              if isinstance(n, ast.Attribute) and _is_engine(n.value)}
    return found


def test_the_serving_api_exists():
    engine_attrs = set(dir(LLMEngine)) | {"model_id", "max_model_len"}  # set in __init__
    assert SERVING_API <= engine_attrs
    assert not any(name.startswith("_") for name in SERVING_API)


def test_the_check_catches_reaching_in():
    source = """
async def f(self, loop):
    await loop.call(lambda e: e.seqs)
    n = self.engine.blocks.num_free_blocks
def g(engine: LLMEngine, x):
    return engine.runner, x.held
def h(eng: "LLMEngine"):
    return eng.scheduler
def i(self):
    x = self.engine
    return x.counters
async def j(self, request_id):
    return await self._call(LLMEngine.handoffs, request_id)
"""
    assert engine_attributes(source) == {"seqs", "blocks", "runner", "scheduler", "counters",
                                         "handoffs"}


def test_the_worker_uses_only_the_serving_api():
    used: dict[str, set[str]] = {}
    for path in sorted(WORKER.rglob("*.py")):
        for attr in engine_attributes(path.read_text()):
            used.setdefault(attr, set()).add(str(path.relative_to(WORKER)))
    outside = {attr: files for attr, files in used.items() if attr not in SERVING_API}
    assert not outside, f"the worker reaches into the engine: {outside}"
    # the check does see the worker's uses
    assert {"submit", "stats", "kv_cache", "drain_block_events"} <= set(used)


# The engine loop's commands run there; the block-event hook runs there after each step.
ON_THE_ENGINE_THREAD = {"engine_loop.py", "kv_events.py"}


def functions_for_the_engine_thread(source: str) -> list[int]:
    """Lines of functions whose first parameter is an engine (`lambda e: ...`, `def f(e:
    LLMEngine)`): code written for the engine thread to run, the way a command is."""
    return sorted(fn.lineno for fn in ast.walk(ast.parse(source))
                  if isinstance(fn, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef))
                  and fn.args.args and fn.args.args[0].arg in _engine_params(fn))


def test_the_check_finds_functions_for_the_engine_thread():
    source = """
async def f(self):
    await self.loop.call(lambda e: e.abort("r"))
    def snapshot(e: LLMEngine) -> int:
        return 1
    await self.loop.submit(request, hold_kv=True)
def __init__(self, engine: LLMEngine):
    self.engine = engine
"""
    assert functions_for_the_engine_thread(source) == [3, 4]


def test_the_worker_sends_named_commands():
    """Outside the engine loop, the worker hands the engine thread no function to run: it awaits
    the loop's commands (submit, abort, reserve_prefilled, ...), each one call of the serving
    API."""
    found = {str(path.relative_to(WORKER)): lines for path in sorted(WORKER.rglob("*.py"))
             if path.name not in ON_THE_ENGINE_THREAD
             and (lines := functions_for_the_engine_thread(path.read_text()))}
    assert found == {}
