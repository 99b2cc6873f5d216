from __future__ import annotations

import argparse
import json
import os

import pytest
import yaml

from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.router.config import (ConfigWatcher, PluginSettings, RouterConfig,
                                          load_plugin_settings)


def test_every_field_is_documented_and_a_flag(monkeypatch):
    assert all(f.description for f in RouterConfig.model_fields.values())
    monkeypatch.setenv("BATON_STATS_MAX_AGE_S", "3.5")
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, RouterConfig)
    args = parser.parse_args(["--scorers", "prefix_overlap:4, kv_utilization:1", "--seed", "9"])
    config = settings_from_args(RouterConfig, args)
    assert (config.stats_max_age_s, weights(config), config.seed) == (
        3.5, {"prefix_overlap": 4.0, "kv_utilization": 1.0}, 9)
    assert weights(config.plugin_settings()) == {"prefix_overlap": 4.0, "kv_utilization": 1.0}


def weights(settings: PluginSettings) -> dict[str, float]:
    return {entry.name: entry.weight for entry in settings.scorers}


def test_default_scorers_and_weights():
    assert weights(RouterConfig()) == {"prefix_overlap": 2.0, "affinity_key": 2.0,
                                       "kv_utilization": 1.0, "queued_prefill_tokens": 1.0,
                                       "inflight_requests": 1.0}


def test_scorers_from_the_environment(monkeypatch):
    monkeypatch.setenv("BATON_SCORERS", "inflight_requests:3,prefix_overlap:0.5")
    assert weights(RouterConfig()) == {"inflight_requests": 3.0, "prefix_overlap": 0.5}


@pytest.mark.parametrize("text", ["bogus:1", "prefix_overlap", "prefix_overlap:-1",
                                  "prefix_overlap:x",
                                  "kv_utilization:1,kv_utilization:2"])
def test_bad_scorer_lists_are_refused(text):
    with pytest.raises(ValueError):
        PluginSettings(scorers=text)


def test_the_router_builds_the_named_scorers_with_their_weights():
    from baton.services.router.router import Router
    router = Router(RouterConfig(scorers="queued_prefill_tokens:3,prefix_overlap:0.5"))
    built = [(s.name, s.weight) for s in router._decode_picker.scorers]
    assert built == [("queued_prefill_tokens", 3.0), ("prefix_overlap", 0.5)]
    saturation = RouterConfig().saturation_queued_prefill_tokens
    assert router._decode_picker.scorers[0].saturation_tokens == saturation


def test_plugin_file_overrides_a_subset(tmp_path):
    path = tmp_path / "plugins.yaml"
    path.write_text("sticky_queued_prefill_tokens: 100\n")
    settings = load_plugin_settings(path, PluginSettings(scorers="prefix_overlap:3"))
    assert weights(settings) == {"prefix_overlap": 3.0}
    assert settings.sticky_queued_prefill_tokens == 100
    path.write_text("scorers:\n- {name: kv_utilization, weight: 0.5}\n- prefix_overlap:1\n")
    settings = load_plugin_settings(path, PluginSettings(sticky_queued_prefill_tokens=7))
    assert (weights(settings), settings.sticky_queued_prefill_tokens) == (
        {"kv_utilization": 0.5, "prefix_overlap": 1.0}, 7)


@pytest.mark.parametrize("text", ["bogus_weight: 1\n", "scorers: kv_utilization:-1\n",
                                  "scorers: [{name: bogus, weight: 1}]\n", "- a list\n", "{: bad"])
def test_bad_plugin_file_is_refused(tmp_path, text):
    path = tmp_path / "plugins.yaml"
    path.write_text(text)
    with pytest.raises((ValueError, yaml.YAMLError)):
        load_plugin_settings(path, PluginSettings())


def test_watcher_reloads_on_change_and_keeps_last_good(tmp_path):
    path = tmp_path / "plugins.json"
    watcher = ConfigWatcher(path, PluginSettings())
    assert watcher.poll() is None  # no file yet: defaults stay
    path.write_text(json.dumps({"scorers": "prefix_overlap:5"}))
    assert weights(watcher.poll()) == {"prefix_overlap": 5}
    assert watcher.poll() is None  # unchanged
    path.write_text("{not json")
    os.utime(path, ns=(1, 1))
    assert watcher.poll() is None and watcher.last_error
    assert weights(watcher.current) == {"prefix_overlap": 5}
    path.write_text(json.dumps({"scorers": "prefix_overlap:6"}))
    os.utime(path, ns=(2, 2))
    assert weights(watcher.poll()) == {"prefix_overlap": 6} and watcher.last_error is None


def test_watcher_follows_a_configmap_symlink_swap(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v1" / "p.yaml").write_text("scorers: inflight_requests:2\n")
    (tmp_path / "v2" / "p.yaml").write_text("scorers: inflight_requests:3\n")
    data = tmp_path / "..data"
    data.symlink_to("v1")
    (tmp_path / "p.yaml").symlink_to("..data/p.yaml")
    watcher = ConfigWatcher(tmp_path / "p.yaml", PluginSettings())
    assert weights(watcher.poll()) == {"inflight_requests": 2}
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", data)  # how the kubelet updates a mounted ConfigMap
    assert weights(watcher.poll()) == {"inflight_requests": 3}


def test_a_registered_scorer_is_configurable_by_name(monkeypatch):
    from baton.services.router.plugins import registry
    from baton.services.router.plugins.base import Scorer
    from baton.services.router.router import Router
    monkeypatch.setattr(registry, "SCORERS", dict(registry.SCORERS))

    @registry.register_scorer
    class Constant(Scorer):
        name = "constant"

        def score(self, request, worker) -> float:
            return 0.5

    router = Router(RouterConfig(scorers="constant:2,kv_utilization:1"))
    assert [type(s) for s in router._decode_picker.scorers][0] is Constant
    with pytest.raises(ValueError, match="twice"):
        registry.register_scorer(Constant)
