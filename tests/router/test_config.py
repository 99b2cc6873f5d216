from __future__ import annotations

import argparse
import json
import os

import pytest
import yaml

from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.router.config import ConfigWatcher, PluginSettings, RouterConfig, load_plugin_settings


def test_every_field_is_documented_and_a_flag(monkeypatch):
    assert all(f.description for f in RouterConfig.model_fields.values())
    monkeypatch.setenv("BATON_STATS_MAX_AGE_S", "3.5")
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, RouterConfig)
    config = settings_from_args(RouterConfig, parser.parse_args(["--prefix-overlap-weight", "4", "--seed", "9"]))
    assert (config.stats_max_age_s, config.prefix_overlap_weight, config.seed) == (3.5, 4.0, 9)
    assert config.plugin_settings().prefix_overlap_weight == 4.0


def test_plugin_file_overrides_a_subset(tmp_path):
    path = tmp_path / "plugins.yaml"
    path.write_text("kv_utilization_weight: 0.5\nsticky_queued_prefill_tokens: 100\n")
    settings = load_plugin_settings(path, PluginSettings(prefix_overlap_weight=3.0))
    assert (settings.prefix_overlap_weight, settings.kv_utilization_weight,
            settings.sticky_queued_prefill_tokens) == (3.0, 0.5, 100)


@pytest.mark.parametrize("text", ["bogus_weight: 1\n", "kv_utilization_weight: -1\n", "- a list\n", "{: bad"])
def test_bad_plugin_file_is_refused(tmp_path, text):
    path = tmp_path / "plugins.yaml"
    path.write_text(text)
    with pytest.raises((ValueError, yaml.YAMLError)):
        load_plugin_settings(path, PluginSettings())


def test_watcher_reloads_on_change_and_keeps_last_good(tmp_path):
    path = tmp_path / "plugins.json"
    watcher = ConfigWatcher(path, PluginSettings())
    assert watcher.poll() is None  # no file yet: defaults stay
    path.write_text(json.dumps({"prefix_overlap_weight": 5}))
    assert watcher.poll().prefix_overlap_weight == 5
    assert watcher.poll() is None  # unchanged
    path.write_text("{not json")
    os.utime(path, ns=(1, 1))
    assert watcher.poll() is None and watcher.last_error and watcher.current.prefix_overlap_weight == 5
    path.write_text(json.dumps({"prefix_overlap_weight": 6}))
    os.utime(path, ns=(2, 2))
    assert watcher.poll().prefix_overlap_weight == 6 and watcher.last_error is None


def test_watcher_follows_a_configmap_symlink_swap(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v1" / "p.yaml").write_text("inflight_requests_weight: 2\n")
    (tmp_path / "v2" / "p.yaml").write_text("inflight_requests_weight: 3\n")
    data = tmp_path / "..data"
    data.symlink_to("v1")
    (tmp_path / "p.yaml").symlink_to("..data/p.yaml")
    watcher = ConfigWatcher(tmp_path / "p.yaml", PluginSettings())
    assert watcher.poll().inflight_requests_weight == 2
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", data)  # how the kubelet updates a mounted ConfigMap
    assert watcher.poll().inflight_requests_weight == 3
