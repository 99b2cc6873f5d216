"""Unknown BATON_* variables: every setting reads its BATON_<NAME> variable, so a misspelt one (a
typo in BATON_MAX_MODEL_LEN, say) would be ignored without a word. Every `baton` command warns, one
line per variable, at start. The known names are every settings class's fields
(docs/configuration.md) and the few variables read outside them."""
from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping

from baton.services.cli.config_docs import SETTINGS, settings_class

log = logging.getLogger(__name__)
PREFIX = "BATON_"
# Read outside the settings classes (tests/test_environment.py finds every BATON_ name in the
# sources, the deploy files and the tests, and checks it is known).
OTHER_VARIABLES = {
    "BATON_CACHE_DIR": "where the embedded tiny model is made (services/checkpoints/tiny_model.py)",
    "BATON_TRACES_DIR": "where load tests find trace files (loadtest/traces.py)",
    "BATON_COMPONENT": "the service a slim image runs, set by deploy/docker/slim.Dockerfile",
    "BATON_HELM": "the helm binary the chart tests use",
    "BATON_UPDATE_GOLDEN": "rewrite the chart tests' golden files",
    "BATON_GPU_CHECK_MODEL": "the checkpoint of the GPU checks (deploy/gpu-check)",
    "BATON_GPU_CHECK_PROMPT_WORDS": "the long prompt of the GPU checks",
    # the gateway's --state-store (stored responses, usage records), which the operator sets from
    # spec.gateway.stateStoreSecretRef
    "BATON_STATE_STORE": "the gateway's state store URL, from a Secret (operators/state_store.py)",
}


def known_variables() -> set[str]:
    names = {name for _, path in SETTINGS for name in settings_class(path).model_fields}
    return {PREFIX + name.upper() for name in names} | set(OTHER_VARIABLES)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """The BATON_* variables no setting reads (matched without regard to case, as settings are)."""
    known = known_variables()
    environ = os.environ if environ is None else environ
    return sorted(name for name in environ
                  if name.upper().startswith(PREFIX) and name.upper() not in known)


def warn_unknown_variables(environ: Mapping[str, str] | None = None) -> None:
    known = sorted(known_variables())
    for name in unknown_variables(environ):
        close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else ""
        log.warning("%s is not a Baton setting and is ignored%s", name, hint)
