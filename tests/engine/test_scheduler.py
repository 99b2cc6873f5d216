from __future__ import annotations

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.kv.block_manager import BlockManager
from baton.services.engine.scheduler import Scheduler
from baton.services.engine.sequence import Sequence, Status


def make(num_blocks: int = 64, budget: int = 32, max_seqs: int = 8,
         chunked: bool = True) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, 4, "m"), budget, max_seqs, chunked)


def add(s: Scheduler, rid: str, n: int, priority: int = 0, t: float = 0.0) -> Sequence:
    seq = Sequence(rid, list(range(1000 * len(s.waiting) + 1, 1000 * len(s.waiting) + 1 + n)),
                   SamplingParams(), priority=priority, arrival_time=t)
    s.add(seq)
    return seq


def step(s: Scheduler) -> dict[str, int]:
    """Runs one schedule; pretends the model ran and sampled token 7 for each finished prefill."""
    items = s.schedule()
    sampled = [i.seq for i in items if i.samples]
    s.finish_step(items)
    for seq in sampled:
        seq.token_ids.append(7)
    return {i.seq.request_id: i.num_tokens for i in items}


def test_token_budget_chunks_long_prompts_and_mixes_decodes():
    s = make(budget=32)
    add(s, "short", 10, t=0)
    add(s, "long", 70, t=1)
    assert step(s) == {"short": 10, "long": 22}
    # short now decodes one token per step alongside the next chunk of long.
    assert step(s) == {"short": 1, "long": 31}
    assert step(s) == {"short": 1, "long": 17}
    assert step(s) == {"short": 1, "long": 1}


def test_without_chunking_a_prompt_waits_for_a_whole_budget():
    s = make(budget=32, chunked=False)
    add(s, "a", 20, t=0)
    add(s, "b", 20, t=1)
    assert step(s) == {"a": 20}
    assert step(s) == {"a": 1, "b": 20}


def test_priority_classes_then_fcfs():
    s = make(budget=8, max_seqs=8)
    add(s, "low-early", 8, priority=0, t=0)
    add(s, "high-late", 8, priority=5, t=2)
    add(s, "high-early", 8, priority=5, t=1)
    assert list(step(s)) == ["high-early"]
    assert [q.request_id for q in s.waiting] == ["high-late", "low-early"]


def test_max_num_seqs_caps_the_batch():
    s = make(budget=100, max_seqs=2)
    for i in range(3):
        add(s, f"r{i}", 5, t=i)
    assert list(step(s)) == ["r0", "r1"]


def test_preemption_by_recompute_picks_lowest_priority_latest_arrival():
    s = make(num_blocks=6, budget=64)
    vip = add(s, "vip", 8, priority=1, t=5)
    old = add(s, "old", 8, t=0)
    new = add(s, "new", 8, t=1)
    step(s)  # all three prefilled: 3 blocks each would be needed for the first decode
    assert {x.status for x in (vip, old, new)} == {Status.RUNNING}
    step(s)
    assert new.status == Status.WAITING and new.num_computed_tokens == 0
    assert vip.status == Status.RUNNING and old.status == Status.RUNNING
    assert s.stats.preemptions == 1
    # No deadlock: everything finishes once the others free their blocks.
    s.remove(vip)
    s.remove(old)
    for _ in range(5):
        step(s)
    assert new.status == Status.RUNNING and new.num_output_tokens >= 2


def test_remove_frees_blocks_of_waiting_and_running():
    s = make()
    a = add(s, "a", 10)
    b = add(s, "b", 10, t=1)
    step(s)
    add(s, "c", 10, t=2)
    s.remove(a)
    s.remove(s.waiting[0])
    s.remove(b)
    assert s.blocks.num_free_blocks == s.blocks.num_blocks
    assert not s.has_unfinished()


def test_decodes_go_before_an_earlier_long_prefill():
    """A long prompt ahead in FCFS order must not take the whole budget from streams already
    decoding."""
    s = make(budget=32)
    add(s, "a", 3, t=1)
    add(s, "b", 3, t=2)
    step(s)
    # arrived first (e.g. resumed after preemption), so it sorts ahead of a and b
    add(s, "long", 200, t=0)
    assert step(s) == {"a": 1, "b": 1, "long": 30}
    assert step(s) == {"a": 1, "b": 1, "long": 30}
