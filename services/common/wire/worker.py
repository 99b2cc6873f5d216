"""The Worker contract's messages (worker.proto) to and from the plain shared types: sampling
parameters, outputs and logprobs, and the Prefill and Generate calls the gateway makes. The one
place they convert: the worker's servicer decodes its requests and encodes its answers here, the
gateway its calls. (The KV handle inside them is the workers' own: its type carries the engine's
cache layout, so it converts beside the transports, services/worker/kv_transfer/base.py.)"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields, is_dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.common.sampling_params import SamplingParams, StructuredOutput
from baton.v1 import worker_pb2 as pb


# Unset proto scalars read as zero; for these fields zero is never a valid value, so it means the
# engine's default. (temperature 0 is greedy and skip_special_tokens false is a choice: those are
# read as sent.)
ZERO_MEANS_DEFAULT = frozenset({"max_tokens", "top_p", "repetition_penalty"})
_PARAM_FIELDS = {f.name: f for f in fields(SamplingParams)}
_WIRE_FIELDS = pb.SamplingParams.DESCRIPTOR.fields_by_name


def _is_repeated(wire: FieldDescriptor) -> bool:
    # protobuf 7 dropped `label` for `is_repeated`; older releases only have `label`.
    if hasattr(wire, "is_repeated"):
        return wire.is_repeated
    return wire.label == wire.LABEL_REPEATED


def _param_from_wire(p: pb.SamplingParams, name: str) -> Any:
    wire, value = _WIRE_FIELDS[name], getattr(p, name)
    if wire.message_type is not None and wire.message_type.GetOptions().map_entry:
        return dict(value) or None
    if _is_repeated(wire):
        return list(value)
    if wire.has_presence and not p.HasField(name):
        return None
    if wire.message_type is not None:
        return (StructuredOutput(
            **{f.name: getattr(value, f.name)
               for f in fields(StructuredOutput)}))
    if name in ZERO_MEANS_DEFAULT and not value:
        return _PARAM_FIELDS[name].default
    return value


def params_from_proto(p: pb.SamplingParams) -> SamplingParams:
    """Field by field, by name: the dataclass and the message declare the same fields (a test holds
    them equal), so a field added to both travels without touching this."""
    return SamplingParams(**{name: _param_from_wire(p, name) for name in _PARAM_FIELDS})


def params_to_proto(p: SamplingParams) -> pb.SamplingParams:
    # None leaves optional fields unset; nested dataclasses go as dicts, which the message
    # constructor accepts.
    values = {name: getattr(p, name) for name in _PARAM_FIELDS}
    return pb.SamplingParams(
        **{name: asdict(v) if is_dataclass(v) else v
           for name, v in values.items()})


def logprob_to_proto(lp: TokenLogprobs) -> pb.TokenLogprob:
    return pb.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, rank=lp.rank, top=lp.top)


def logprob_from_proto(lp: pb.TokenLogprob) -> TokenLogprobs:
    return TokenLogprobs(token_id=lp.token_id, logprob=lp.logprob, rank=lp.rank,
                         top=dict(sorted(lp.top.items(), key=lambda kv: -kv[1])))


def prompt_logprobs_to_proto(entries: list[TokenLogprobs | None]) -> list[pb.TokenLogprob]:
    """The wire form drops the first prompt token's entry, which is always None."""
    return [logprob_to_proto(lp) for lp in entries[1:] if lp is not None]


def prompt_logprobs_from_proto(entries: Iterable[pb.TokenLogprob]) -> list[TokenLogprobs | None]:
    return [None, *(logprob_from_proto(lp) for lp in entries)]


def set_stop_reason(message: pb.GenerateResponse | pb.PrefillResponse,
                    reason: int | str | None) -> None:
    if isinstance(reason, str):
        message.stop_string = reason
    elif reason is not None:
        message.stop_token_id = reason


def stop_reason_of(message: pb.GenerateResponse | pb.PrefillResponse) -> int | str | None:
    which = message.WhichOneof("stop_reason")
    return None if which is None else getattr(message, which)


def prefill_to_proto(out: RequestOutput, kv_handle: pb.KVHandle | None) -> pb.PrefillResponse:
    """The first token; then the handle to go on with, or how the answer ended at prefill."""
    response = pb.PrefillResponse(first_token_id=out.token_ids[0],
                                  num_cached_tokens=out.num_cached_tokens, text=out.text)
    if out.logprobs:
        response.first_logprob.CopyFrom(logprob_to_proto(out.logprobs[0]))
    if out.prompt_logprobs is not None:
        response.prompt_logprobs.extend(prompt_logprobs_to_proto(out.prompt_logprobs))
    if kv_handle is None:
        response.finish_reason = out.finish_reason or ""
        set_stop_reason(response, out.stop_reason)
    else:
        response.kv_handle.CopyFrom(kv_handle)
    return response


def output_to_proto(out: RequestOutput, kv_source: str) -> pb.GenerateResponse:
    message = pb.GenerateResponse(token_ids=out.new_token_ids, text=out.new_text,
                                  finished=out.finished, finish_reason=out.finish_reason or "",
                                  num_prompt_tokens=len(out.prompt_token_ids),
                                  num_cached_tokens=out.num_cached_tokens, kv_source=kv_source)
    if out.new_logprobs:
        message.logprobs.extend(logprob_to_proto(lp) for lp in out.new_logprobs)
    if out.prompt_logprobs is not None:
        message.prompt_logprobs.extend(prompt_logprobs_to_proto(out.prompt_logprobs))
    set_stop_reason(message, out.stop_reason)
    return message


def prefill_request(meta: pb.RequestMeta, prompt: Sequence[int],
                    params: SamplingParams) -> pb.PrefillRequest:
    return pb.PrefillRequest(meta=meta, prompt_token_ids=prompt, params=params_to_proto(params))


def generate_request(meta: pb.RequestMeta, prompt: Sequence[int], params: SamplingParams,
                     output_token_ids: Sequence[int] = ()) -> pb.GenerateRequest:
    """A Generate that computes the prompt on the decode worker; with output_token_ids (a
    migration), the tokens already streamed, which it recomputes and continues after."""
    return pb.GenerateRequest(meta=meta, prompt_token_ids=prompt, params=params_to_proto(params),
                              output_token_ids=output_token_ids)


def handoff_request(meta: pb.RequestMeta, prompt: Sequence[int], params: SamplingParams,
                    prefilled: pb.PrefillResponse,
                    first_token_streamed: bool) -> pb.GenerateRequest:
    """A Generate that continues a remote prefill: its KV handle, its first token and that token's
    logprob; `first_token_streamed` when the caller already sent the first token on."""
    request = generate_request(meta, prompt, params)
    request.kv_handle.CopyFrom(prefilled.kv_handle)
    request.first_token_id = prefilled.first_token_id
    if prefilled.HasField("first_logprob"):
        request.first_logprob.CopyFrom(prefilled.first_logprob)
    request.first_token_streamed = first_token_streamed
    return request
