"""vLLM's --speculative-config, parsed with clear refusals; the n-gram proposer; block trimming."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from baton.services.engine.config import EngineConfig
from baton.services.engine.kv.block_manager import BlockManager
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.sequence import Sequence
from baton.services.engine.speculation.config import (SpeculativeConfig, SpeculativeConfigError,
                                                      parse_speculative_config)
from baton.services.engine.speculation.ngram import NgramProposer


def test_ngram_config_with_vllm_defaults():
    assert parse_speculative_config(None) is None
    got = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert got == SpeculativeConfig("ngram", 3, 5, 5, None)
    got = parse_speculative_config({"model": "[ngram]", "num_speculative_tokens": 2,
                                    "prompt_lookup_max": 4, "disable_by_batch_size": 8})
    assert got == SpeculativeConfig("ngram", 2, 4, 4, 8)


@pytest.mark.parametrize("raw, names", [
    ('{"method": "ngram", "num_speculative_tokens": 3, "speculative_token_tree": "x"}',
     "speculative_token_tree"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 17}', "between 1 and 16"),
    ('{"method": "ngram", "num_speculative_tokens": "3"}', "must be an integer"),
    ('{"method": "ngram"}', "num_speculative_tokens is required"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, '
     '"prompt_lookup_max": 2}', "prompt_lookup_min (4) is above"),
    ('{"method": "draft_model", "model": "/no/such/dir", "num_speculative_tokens": 2}',
     "draft model '/no/such/dir' is not a checkpoint folder"),
    ('{"model": "/no/such/dir", "num_speculative_tokens": 2}', "is not a checkpoint folder"),
    ('{"method": "draft_model", "num_speculative_tokens": 2}', "needs model"),
    ('{"method": "medusa", "model": "x", "num_speculative_tokens": 2}', "'medusa' is not"),
    ('{"method": "eagle3", "num_speculative_tokens": 2}', "method 'eagle3' needs model"),
    ('{"method": "guess", "num_speculative_tokens": 2}', "unknown method 'guess'"),
    ('{"method": "ngram", "model": "m", "num_speculative_tokens": 2}', "takes no draft model"),
    ('[1]', "JSON object"),
    ('{nope', "not valid JSON"),
])
def test_bad_configs_are_refused_naming_the_key(raw, names):
    with pytest.raises(SpeculativeConfigError, match=None) as err:
        parse_speculative_config(raw)
    assert names in str(err.value)
    # The engine's config refuses it too, before any model loads (the CLI's flag and env var).
    with pytest.raises(ValidationError, match="speculative config"):
        EngineConfig(speculative_config=raw)


def test_ngram_proposes_what_followed_the_suffix():
    p = NgramProposer(1, 3)
    assert p.propose([1, 2, 3, 4, 5, 1, 2, 3], 3) == [4, 5, 1]
    assert p.propose([1, 2, 3, 4, 5, 6], 3) == []
    # The latest occurrence with k tokens after it: a short cycle still fills the draft.
    assert p.propose([7, 7, 7, 7, 7, 7], 3) == [7, 7, 7]
    assert p.propose([1, 2, 9, 1, 8, 1, 2], 4) == [9, 1, 8, 1]
    # Longer suffixes win over shorter ones.
    assert p.propose([5, 1, 6, 2, 1, 7, 2, 1], 1) == [7]
    assert NgramProposer(3, 3).propose([5, 1, 6, 2, 1, 7, 2, 1], 2) == []


def test_trim_gives_back_only_the_tail():
    blocks = BlockManager(8, 4, "m")
    seq = Sequence("r", list(range(6)), SamplingParams())
    blocks.admit(seq, [])
    blocks.grow(seq, 14)
    assert len(seq.block_ids) == 4 and blocks.num_free_blocks == 4
    tail = seq.block_ids[2:]
    blocks.trim(seq, 7)
    assert len(seq.block_ids) == 2 and blocks.num_free_blocks == 6
    # Unhashed, the trimmed blocks are the next to be reused.
    blocks.grow(seq, 16)
    assert sorted(seq.block_ids[2:]) == sorted(tail)
