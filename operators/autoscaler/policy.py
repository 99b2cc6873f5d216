"""The autoscaling policy: a pure function of (signals, pool state, policy) -> decision with a
reason.

Nothing here reads a clock or the network, so a test or an offline simulation can replay any
sequence of signals. The caller (operators/autoscaler/loop.py) keeps the state between evaluations
with `next_state`.

Each signal gives a recommendation; the largest wins. Queue time and TPOT attainment can only push a
pool up (they say nothing about how few replicas would do), while prefill-token demand and KV-cache
usage scale both ways because they are proportional to load. Damping then decides whether and how
far to move.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Literal

from baton.services.common.roles import Role, RoleName

Direction = Literal["up", "down", "hold"]


class Reason(str, Enum):
    QUEUE_TIME = "QueueTimeOverBudget"
    PREFILL_DEMAND = "PrefillDemandOverCapacity"
    KV_PRESSURE = "KVCachePressure"
    TPOT_ATTAINMENT = "TPOTAttainmentLow"
    UNDERUTILIZED = "Underutilized"
    IDLE_TO_ZERO = "IdleScaleToZero"
    WAKE_FROM_ZERO = "WakeFromZero"
    SCALED_TO_ZERO = "ScaledToZero"
    BELOW_MIN = "BelowMinReplicas"
    ABOVE_MAX = "AboveMaxReplicas"
    AT_MAX = "AtMaxReplicas"
    WITHIN_TARGETS = "WithinTargets"
    NO_SIGNALS = "NoSignals"
    MANUAL = "ManualMode"
    PENDING_PODS = "PendingPods"
    GOODPUT_FLAT = "GoodputFlat"
    COOLDOWN = "Cooldown"
    UP_STABILIZING = "ScaleUpStabilizing"
    DOWN_STABILIZING = "ScaleDownStabilizing"


@dataclass(frozen=True)
class Signals:
    """A pool's load, aggregated over its ready replicas. None: the source does not know it."""

    queue_time_p95_s: float | None = None
    prompt_tokens_per_s: float | None = None
    prefill_capacity_tokens_per_s: float | None = None  # measured per replica at saturation
    kv_cache_usage: float | None = None  # 0..1, mean over replicas
    tpot_attainment: float | None = None  # 0..1, share of requests meeting their TPOT target
    goodput_tokens_per_s: float | None = None  # tokens of requests that met their SLOs, whole pool
    running_requests: float | None = None
    waiting_requests: float | None = None  # includes requests the router holds for this pool

    def idle(self) -> bool:
        """True only when every load signal known says nothing is happening (and at least one is
        known)."""
        loads = [self.running_requests, self.waiting_requests, self.prompt_tokens_per_s]
        known = [v for v in loads if v is not None]
        return bool(known) and all(v == 0 for v in known)


@dataclass(frozen=True)
class StepRules:
    stabilization_s: float
    max_step: int
    cooldown_s: float


@dataclass(frozen=True)
class Policy:
    role: RoleName
    min_replicas: int
    max_replicas: int
    ttft_target_s: float | None = None  # the tightest TTFT target over priorities
    mode: Literal["auto", "manual"] = "auto"
    queue_time_budget: float = 0.5
    token_utilization: float = 0.8
    kv_high: float = 0.85
    kv_low: float = 0.40
    tpot_attainment: float = 0.95
    min_goodput_gain: float = 0.05
    goodput_guard_s: float = 600.0
    scale_to_zero: bool = False
    idle_before_zero_s: float = 900.0
    up: StepRules = StepRules(stabilization_s=0, max_step=2, cooldown_s=30)
    down: StepRules = StepRules(stabilization_s=300, max_step=1, cooldown_s=120)


@dataclass(frozen=True)
class PoolState:
    replicas: int  # spec.replicas now
    now: float
    ready_replicas: int = 0
    pending_replicas: int = 0
    last_scale_time: float | None = None
    last_scale_direction: Direction | None = None
    goodput_before_last_up: float | None = None
    idle_since: float | None = None
    # (time, raw recommendation), oldest first
    recommendations: tuple[tuple[float, int], ...] = field(default=())


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: Reason
    message: str
    recommendation: int | None = None  # undamped; recorded in the state's history by next_state
    current: int = 0

    @property
    def direction(self) -> Direction:
        return ("up" if self.replicas > self.current else
                "down" if self.replicas < self.current else "hold")


def _hold(state: PoolState, reason: Reason, message: str,
          recommendation: int | None = None) -> Decision:
    return Decision(state.replicas, reason, message, recommendation, state.replicas)


def _move(state: PoolState, replicas: int, reason: Reason, message: str,
          recommendation: int | None) -> Decision:
    return Decision(replicas, reason, message, recommendation, state.replicas)


Opinion = tuple[int, Reason, str]


def _prefill_opinions(s: Signals, cur: int, p: Policy) -> list[Opinion | None]:
    opinions: list[Opinion | None] = []
    if s.queue_time_p95_s is not None and p.ttft_target_s:
        budget = p.ttft_target_s * p.queue_time_budget
        ratio = s.queue_time_p95_s / budget
        opinions.append((math.ceil(cur * ratio), Reason.QUEUE_TIME,
                         f"queue time p95 {s.queue_time_p95_s:.3g}s vs budget {budget:.3g}s"
                         ) if ratio > 1 else None)
    if s.prompt_tokens_per_s is not None and s.prefill_capacity_tokens_per_s:
        usable = s.prefill_capacity_tokens_per_s * p.token_utilization
        opinions.append(
            (math.ceil(s.prompt_tokens_per_s / usable), Reason.PREFILL_DEMAND,
             f"prompt tokens {s.prompt_tokens_per_s:.4g}/s vs {usable:.4g}/s usable per replica"))
    return opinions


def _decode_opinions(s: Signals, cur: int, p: Policy) -> list[Opinion | None]:
    opinions: list[Opinion | None] = []
    if s.kv_cache_usage is not None:
        usage = f"KV cache usage {s.kv_cache_usage:.0%}"
        if s.kv_cache_usage > p.kv_high:
            opinions.append((math.ceil(cur * s.kv_cache_usage / p.kv_high), Reason.KV_PRESSURE,
                             f"{usage} above {p.kv_high:.0%}"))
        elif s.kv_cache_usage < p.kv_low:
            # Aim between the marks so that the smaller pool does not land right back above the high
            # one.
            middle = (p.kv_low + p.kv_high) / 2
            opinions.append((math.ceil(cur * s.kv_cache_usage / middle), Reason.KV_PRESSURE,
                             f"{usage} below {p.kv_low:.0%}"))
        else:
            opinions.append(
                (cur, Reason.KV_PRESSURE, f"{usage} within {p.kv_low:.0%}..{p.kv_high:.0%}"))
    if s.tpot_attainment is not None:
        low = s.tpot_attainment < p.tpot_attainment
        opinions.append((cur + 1, Reason.TPOT_ATTAINMENT,
                         f"TPOT attainment {s.tpot_attainment:.1%} below "
                         f"{p.tpot_attainment:.0%}") if low else None)
    return opinions


def recommend(signals: Signals, cur: int, policy: Policy) -> Opinion | None:
    """The undamped replica count the signals ask for, with why; None when no signal is known."""
    opinions: list[Opinion | None] = []
    if Role.of(policy.role).serves(Role.PREFILL):
        opinions += _prefill_opinions(signals, cur, policy)
    if Role.of(policy.role).serves(Role.DECODE):
        opinions += _decode_opinions(signals, cur, policy)
    if not opinions:
        return None
    given = [o for o in opinions if o is not None]
    if not given:
        return cur, Reason.WITHIN_TARGETS, "every signal within its target"
    best = max(given, key=lambda o: o[0])
    if best[0] > cur:
        return best
    if best[0] < cur:
        return best[0], Reason.UNDERUTILIZED, "; ".join(o[2] for o in given)
    return cur, Reason.WITHIN_TARGETS, "; ".join(o[2] for o in given)


def _zero(signals: Signals, state: PoolState, policy: Policy) -> Decision | None:
    if not (policy.scale_to_zero and policy.min_replicas == 0):
        return None
    if state.replicas == 0:
        if signals.waiting_requests:
            return _move(state, 1, Reason.WAKE_FROM_ZERO,
                         f"{signals.waiting_requests:.0f} requests queued", 1)
        return _hold(state, Reason.SCALED_TO_ZERO, "no traffic", 0)
    idle_for = state.now - state.idle_since if state.idle_since is not None else 0.0
    if signals.idle() and idle_for >= policy.idle_before_zero_s:
        return _move(state, 0, Reason.IDLE_TO_ZERO, f"idle for {idle_for:.0f}s", 0)
    return None


def _in_cooldown(state: PoolState, rules: StepRules) -> bool:
    return (state.last_scale_time is not None and
            state.now - state.last_scale_time < rules.cooldown_s)


def _goodput_flat(signals: Signals, state: PoolState, policy: Policy) -> str | None:
    """Why the last scale-up bought no goodput, while that still blocks the next one."""
    before, now = state.goodput_before_last_up, signals.goodput_tokens_per_s
    if (state.last_scale_direction != "up" or before is None or now is None or
            state.last_scale_time is None):
        return None
    if (state.now - state.last_scale_time >= policy.goodput_guard_s or
            state.ready_replicas < state.replicas):
        return None
    if now >= before * (1 + policy.min_goodput_gain):
        return None
    return (
        f"goodput {now:.4g} tok/s after the last scale-up, {before:.4g} before (< "
        f"+{policy.min_goodput_gain:.0%})"
    )


def _window(state: PoolState, seconds: float) -> list[int]:
    return [r for t, r in state.recommendations if state.now - t <= seconds]


def _scale_up(want: Opinion, signals: Signals, state: PoolState, policy: Policy) -> Decision:
    target, reason, message = want
    if state.pending_replicas > 0:
        return _hold(
            state, Reason.PENDING_PODS, f"{state.pending_replicas} pods pending; wanted {target} "
            f"({reason.value}: {message})", target)
    flat = _goodput_flat(signals, state, policy)
    if flat:
        return _hold(state, Reason.GOODPUT_FLAT, f"{flat}; wanted {target} ({reason.value})",
                     target)
    if _in_cooldown(state, policy.up):
        return _hold(
            state, Reason.COOLDOWN,
            f"scaled {state.now - state.last_scale_time:.0f}s ago; wanted {target} "
            f"({reason.value})", target)
    stable = min(_window(state, policy.up.stabilization_s) + [target])
    if stable <= state.replicas:
        return _hold(state, Reason.UP_STABILIZING, f"wanted {target} ({reason.value}) but not for "
                     f"{policy.up.stabilization_s:.0f}s", target)
    replicas = min(stable, state.replicas + policy.up.max_step)
    step = f" (step-limited from {stable})" if replicas < stable else ""
    return _move(state, replicas, reason, message + step, target)


def _scale_down(want: Opinion, state: PoolState, policy: Policy) -> Decision:
    target, reason, message = want
    window = policy.down.stabilization_s
    covered = any(state.now - t >= window for t, _ in state.recommendations) or window == 0
    recent = _window(state, window)
    if _in_cooldown(state, policy.down):
        return _hold(state, Reason.COOLDOWN,
                     f"scaled {state.now - state.last_scale_time:.0f}s ago; wanted {target}",
                     target)
    if not covered or any(r >= state.replicas for r in recent):
        return _hold(state, Reason.DOWN_STABILIZING,
                     f"wanted {target} ({message}) but not for {window:.0f}s", target)
    stable = max(recent + [target])
    replicas = max(stable, state.replicas - policy.down.max_step)
    step = f" (step-limited from {stable})" if replicas > stable else ""
    return _move(state, replicas, reason, message + step, target)


def decide(signals: Signals, state: PoolState, policy: Policy) -> Decision:
    """How many replicas the pool should have now, and why."""
    cur = state.replicas
    if policy.mode == "manual":
        return _hold(state, Reason.MANUAL, "autoscaling.mode is manual")
    zero = _zero(signals, state, policy)
    if zero is not None:
        return zero
    if cur < policy.min_replicas:
        return _move(state, policy.min_replicas, Reason.BELOW_MIN,
                     f"minReplicas is {policy.min_replicas}", None)
    if cur > policy.max_replicas:
        return _move(state, policy.max_replicas, Reason.ABOVE_MAX,
                     f"maxReplicas is {policy.max_replicas}", None)
    want = recommend(signals, cur, policy)
    if want is None:
        return _hold(state, Reason.NO_SIGNALS, "no signal known for this pool yet")
    floor = max(policy.min_replicas, 1)
    target = min(max(want[0], floor), policy.max_replicas)
    if want[0] > cur and target == cur:
        return _hold(state, Reason.AT_MAX, f"at maxReplicas {policy.max_replicas}; {want[2]}",
                     target)
    if target > cur:
        return _scale_up((target, want[1], want[2]), signals, state, policy)
    if target < cur:
        return _scale_down((target, want[1], want[2]), state, policy)
    return _hold(state, Reason.WITHIN_TARGETS, want[2], target)


def next_state(state: PoolState, decision: Decision, signals: Signals, keep_s: float) -> PoolState:
    """The state for the next evaluation: history trimmed to `keep_s` (plus the newest older entry,
    which proves the window is covered), idle tracking, and the scale bookkeeping when the decision
    moved."""
    history = list(state.recommendations)
    if decision.recommendation is not None:
        history.append((state.now, decision.recommendation))
    old = [h for h in history if state.now - h[0] > keep_s]
    history = old[-1:] + [h for h in history if state.now - h[0] <= keep_s]
    idle_since = (
        state.idle_since if state.idle_since is not None else state.now) if signals.idle() else None
    moved = decision.direction != "hold"
    return replace(
        state, replicas=decision.replicas, recommendations=tuple(history), idle_since=idle_since,
        last_scale_time=state.now if moved else state.last_scale_time,
        last_scale_direction=decision.direction if moved else state.last_scale_direction,
        goodput_before_last_up=signals.goodput_tokens_per_s if decision.direction == "up"
        else state.goodput_before_last_up)
