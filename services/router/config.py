"""The router's typed configuration (flags: `--stats-max-age-s`, env: `BATON_STATS_MAX_AGE_S`, ...),
and the plugin settings that reload from a watched file without a restart."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import NoDecode

from baton.services.common.settings import BatonSettings

DEFAULT_SCORERS = ("prefix_overlap:2,affinity_key:2,kv_utilization:1,queued_prefill_tokens:1,"
                   "inflight_requests:1,lora_affinity:1")


class ScorerWeight(BaseModel):
    """One entry of the weighted scorer list: a registered scorer's name and its weight."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    weight: float = Field(ge=0)

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        # Imported here: the registry loads the plugins and the router's worker state, which
        # importing the config (the docs generator, the operator's tests) should not pay for.
        from baton.services.router.plugins.registry import scorer_class
        scorer_class(name)
        return name


def parse_scorers(value: Any) -> Any:
    """`name:weight,...` (a flag, a BATON_SCORERS variable, or a string in a plugin file) as a
    list of entries; a list (of mappings or of `name:weight` strings) passes through to pydantic."""
    if isinstance(value, str):
        value = [item for item in value.split(",") if item.strip()]
    if not isinstance(value, list):
        return value
    entries = []
    for item in value:
        if isinstance(item, str):
            name, sep, weight = item.partition(":")
            if not sep:
                raise ValueError(f"scorer {item.strip()!r}: expected name:weight")
            item = {"name": name.strip(), "weight": weight.strip()}
        entries.append(item)
    names = [e.get("name") if isinstance(e, dict) else getattr(e, "name", None) for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"scorers: a name appears twice in {names}")
    return entries


class PluginSettings(BaseModel):
    """What a reload may change: scorer weights and the affinity thresholds. A file may set any
    subset."""
    model_config = ConfigDict(extra="forbid", validate_default=True)

    scorers: Annotated[list[ScorerWeight], NoDecode] = Field(
        DEFAULT_SCORERS,
        description="Weighted scorers, name:weight,... (registered names: prefix_overlap, "
                    "affinity_key, kv_utilization, queued_prefill_tokens, inflight_requests, "
                    "lora_affinity); "
                    "weight 0 or "
                    "leaving one out turns it off. A plugin file may give a YAML list instead")
    sticky_queued_prefill_tokens: int = Field(
        4096, ge=0,
        description="Queued prompt tokens past which a cache-warm worker stops "
                    "attracting its prefix"
    )
    sticky_inflight_requests: int = Field(
        32, ge=0,
        description="In-flight requests past which a cache-warm worker stops attracting its prefix")
    sticky_min_cached_fraction: float = Field(
        0.25, ge=0, le=1,
        description="Least share of the prompt a worker must hold for prefix affinity to apply")

    _parse_scorers = field_validator("scorers", mode="before")(parse_scorers)


class RouterConfig(BatonSettings, PluginSettings):
    """Every PluginSettings field is also a flag here: its value is the default a plugin file
    overrides."""
    model: str = Field(
        "baton-tiny",
        description="Served model name; part of every prefix-cache hash, as on workers; requests "
                    "that name no model run on it")
    additional_models: list[str] = Field(
        [],
        description="Further served model names this router routes (several base models behind "
                    "one gateway): each worker serves one, and a request goes only to workers of "
                    "its model")
    block_size: int = Field(16, ge=1, le=256,
                            description="Tokens per KV block; must match the workers'")
    seed: int | None = Field(
        None,
        description="Seed of the RNG that breaks score ties; unset: drawn per process, so "
                    "replicas differ")
    tie_tolerance: float = Field(
        0.02, ge=0, le=1, description="Scores this close to the best are ties, drawn at random")
    plugin_config_file: Path | None = Field(
        None,
        description="YAML or JSON file of plugin settings (weights, sticky threshold), re-read "
                    "when it changes")
    config_poll_interval_s: float = Field(5.0, gt=0,
                                          description="How often the plugin config file is checked")
    stats_max_age_s: float = Field(2.0, gt=0,
                                   description="Worker stats older than this count as saturated")
    saturation_queued_prefill_tokens: int = Field(
        16384, ge=1, description="Queued prompt tokens at which a worker counts as saturated")
    saturation_inflight_requests: int = Field(
        256, ge=1,
        description="Running plus waiting requests at which a worker counts as saturated")
    saturation_kv_utilization: float = Field(
        0.95, gt=0, le=1, description="KV-cache share in use at which a worker counts as saturated")
    worker_lease_ttl_s: float = Field(
        10.0, gt=0, description="A worker that has not heartbeated for this long is dropped")
    placement_lease_ttl_s: float = Field(
        600.0, gt=0,
        description="A placement not released within this time (the gateway died) is reclaimed")
    circuit_failure_threshold: int = Field(
        3, ge=1, description="Consecutive failures that open a worker's circuit")
    circuit_cooldown_s: float = Field(
        10.0, gt=0, description="Time an open circuit waits before one probe request")
    max_local_prefill_tokens: int = Field(
        512, ge=0,
        description="Uncached prompt tokens up to which a decode worker always prefills in place")
    max_prefill_queue_s: float = Field(
        0.5, ge=0,
        description="Predicted wait at the prefill pool past which it counts as backed up")
    local_prefill_kv_headroom: float = Field(
        2.0, ge=1,
        description="Local prefill needs this many times the prompt's KV blocks free on the decode "
                    "worker")
    queue_max_size: int = Field(1024, ge=0, description="Most requests waiting for admission")
    queue_max_age_s: float = Field(30.0, gt=0,
                                   description="Longest a request may wait for admission")
    default_ttft_slo_s: float | None = Field(
        None, gt=0, description="TTFT SLO for requests that bring none; unset means no SLO")
    initial_prefill_tokens_per_s: float = Field(
        8000.0, gt=0, description="Assumed prefill rate of a worker before any measurement")
    prefill_rate_ewma_alpha: float = Field(0.2, gt=0, le=1,
                                           description="Weight of each new prefill-rate sample")
    ttft_overhead_s: float = Field(0.01, ge=0,
                                   description="Fixed part of every TTFT (network, scheduling)")
    ttft_slo_headroom: float = Field(
        0.8, gt=0, le=1,
        description="Admit only requests predicted to get their first token within this share of "
                    "their TTFT SLO (the rest is the prediction's margin of error)")
    default_tpot_slo_s: float | None = Field(
        None, gt=0, description="TPOT SLO for requests that bring none; unset means no SLO")
    tpot_slo_headroom: float = Field(
        0.8, gt=0, le=1,
        description="Admit only requests whose predicted TPOT on a decode worker is within this "
                    "share of their TPOT SLO")
    sheddable_tpot_slo_headroom: float = Field(
        0.6, gt=0, le=1,
        description="The same share for sheddable (negative-priority) requests: lower, so they "
                    "stop joining a decode batch before it is full and leave its last rows to the "
                    "rest")
    critical_tpot_slo_headroom: float = Field(
        0.9, gt=0, le=1,
        description="The same share for critical (positive-priority) requests: higher, so they "
                    "still join a decode batch that standard requests no longer may")
    reservation_grace_s: float = Field(
        0.5, ge=0,
        description="A placement keeps counting on its worker until a stats report taken this long "
                    "after it (the request needs that long to reach the worker and show "
                    "in its stats)")
    retry_after_min_s: float = Field(0.1, ge=0,
                                     description="Smallest retry-after hint given with a refusal")
    retry_after_max_s: float = Field(30.0, gt=0,
                                     description="Largest retry-after hint given with a refusal")
    approx_index_ttl_s: float = Field(
        120.0, gt=0,
        description="How long a placement-derived prefix entry is believed (workers without events)"
    )
    approx_index_max_blocks_per_worker: int = Field(
        65536, ge=1,
        description="Most placement-derived prefix entries kept per worker (least recent dropped)")
    affinity_keys_max: int = Field(
        100_000, ge=0,
        description="Most affinity keys (prompt_cache_key) whose last worker is remembered, least "
                    "recently used dropped; 0 turns the affinity_key scorer's memory off")

    def served_models(self) -> tuple[str, ...]:
        """Every model this router routes, --model first."""
        return (self.model, *(m for m in self.additional_models if m != self.model))

    def plugin_settings(self) -> PluginSettings:
        return PluginSettings(**{name: getattr(self, name) for name in PluginSettings.model_fields})


def load_plugin_settings(path: Path, base: PluginSettings) -> PluginSettings:
    """The file's values over `base`; .json is JSON, anything else YAML."""
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a mapping of plugin settings, got {type(data).__name__}")
    return PluginSettings.model_validate({**base.model_dump(), **data})


class ConfigWatcher:
    """Re-reads the plugin file when it changes. Change is judged by (mtime, inode, size) of the
    path with symlinks
    followed: a ConfigMap update swaps a symlink, which changes the inode even when the mtime lands
    in the same tick. A file that fails to parse leaves the last good settings in force and is
    reported in `last_error`."""

    def __init__(self, path: Path, base: PluginSettings) -> None:
        self.path = path
        self.base = base
        self.current = base
        self.last_error: str | None = None
        self._signature: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_ino, st.st_size

    def poll(self) -> PluginSettings | None:
        """New settings when the file changed and parses; None otherwise."""
        signature = self._stat()
        if signature is None or signature == self._signature:
            return None
        self._signature = signature
        try:
            settings = load_plugin_settings(self.path, self.base)
        except (OSError, ValueError, ValidationError, yaml.YAMLError) as exc:
            self.last_error = str(exc)
            return None
        self.last_error = None
        if settings == self.current:
            return None
        self.current = settings
        return settings
