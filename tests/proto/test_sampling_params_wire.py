"""SamplingParams and its wire message carry the same fields, and the mapping between them loses
nothing."""
from dataclasses import fields

from baton.services.common.sampling_params import SamplingParams, StructuredOutput
from baton.services.common.wire.worker import params_from_proto, params_to_proto
from baton.v1 import worker_pb2 as pb


def _names(message: type) -> set[str]:
    return set(message.DESCRIPTOR.fields_by_name)


def test_dataclass_and_message_declare_the_same_fields() -> None:
    assert {f.name for f in fields(SamplingParams)} == _names(pb.SamplingParams)
    assert {f.name for f in fields(StructuredOutput)} == _names(pb.StructuredOutput)


def _fully_populated() -> SamplingParams:
    """Every field away from its default (and non-zero), so a field the mapping drops shows up."""
    return SamplingParams(max_tokens=33, temperature=0.5, top_p=0.75, top_k=7, min_p=0.125, seed=42,
                          repetition_penalty=1.25, frequency_penalty=-0.5, presence_penalty=0.25,
                          stop=["a", "bc"], stop_token_ids=[3, 9], include_stop_str_in_output=True,
                          ignore_eos=True, min_tokens=2, logprobs=3, skip_special_tokens=False,
                          structured_output=StructuredOutput("regex", "[0-9]+"),
                          logit_bias={5: -1.5, 8: 2.0}, prompt_logprobs=1)


def test_every_field_differs_from_its_default() -> None:
    full, default = _fully_populated(), SamplingParams()
    assert [
        f.name for f in fields(SamplingParams) if getattr(full, f.name) == getattr(default, f.name)
    ] == []


def test_round_trip_of_a_fully_populated_params_is_identity() -> None:
    assert params_from_proto(params_to_proto(_fully_populated())) == _fully_populated()


def test_round_trip_of_defaults_is_identity() -> None:
    assert params_from_proto(params_to_proto(SamplingParams())) == SamplingParams()


def test_unset_message_reads_as_the_engine_defaults_where_zero_is_invalid() -> None:
    params = params_from_proto(pb.SamplingParams())
    assert (params.max_tokens, params.top_p, params.repetition_penalty) == (16, 1.0, 1.0)
    assert params.seed is None and params.logprobs is None and params.prompt_logprobs is None
    assert params.structured_output is None and params.logit_bias is None
    # Zero is meaningful for these, so it is read as sent.
    assert params.temperature == 0.0 and params.skip_special_tokens is False and params.top_k == 0


def test_optional_zero_is_kept_apart_from_unset() -> None:
    params = params_from_proto(pb.SamplingParams(seed=0, logprobs=0, prompt_logprobs=0))
    assert (params.seed, params.logprobs, params.prompt_logprobs) == (0, 0, 0)
