"""Between the gRPC messages (baton.v1) and the engine's own types."""
from __future__ import annotations

from collections.abc import Iterable

from baton.services.engine.outputs import RequestOutput, TokenLogprobs
from baton.services.engine.sampling_params import SamplingParams, StructuredOutput
from baton.v1 import worker_pb2 as pb


def params_from_proto(p: pb.SamplingParams) -> SamplingParams:
    """Unset proto fields read as zero, so every field the engine defaults to non-zero is mapped explicitly."""
    return SamplingParams(
        max_tokens=p.max_tokens or 16, temperature=p.temperature, top_p=p.top_p or 1.0, top_k=p.top_k,
        min_p=p.min_p, seed=p.seed if p.HasField("seed") else None,
        repetition_penalty=p.repetition_penalty or 1.0, frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty, stop=list(p.stop), stop_token_ids=list(p.stop_token_ids),
        include_stop_str_in_output=p.include_stop_str_in_output, ignore_eos=p.ignore_eos, min_tokens=p.min_tokens,
        logprobs=p.logprobs if p.HasField("logprobs") else None, skip_special_tokens=p.skip_special_tokens,
        structured_output=(StructuredOutput(p.structured_output.kind, p.structured_output.value)
                           if p.HasField("structured_output") else None),
        logit_bias=dict(p.logit_bias) or None,
        prompt_logprobs=p.prompt_logprobs if p.HasField("prompt_logprobs") else None)


def params_to_proto(p: SamplingParams) -> pb.SamplingParams:
    return pb.SamplingParams(
        max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, min_p=p.min_p,
        seed=p.seed, repetition_penalty=p.repetition_penalty, frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty, stop=p.stop, stop_token_ids=p.stop_token_ids,
        include_stop_str_in_output=p.include_stop_str_in_output, ignore_eos=p.ignore_eos, min_tokens=p.min_tokens,
        logprobs=p.logprobs, skip_special_tokens=p.skip_special_tokens, logit_bias=p.logit_bias,
        prompt_logprobs=p.prompt_logprobs,
        structured_output=(pb.StructuredOutput(kind=p.structured_output.kind, value=p.structured_output.value)
                           if p.structured_output is not None else None))


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


def set_stop_reason(message: pb.GenerateResponse | pb.PrefillResponse, reason: int | str | None) -> None:
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
                                  num_cached_tokens=out.num_cached_tokens)
    if out.logprobs:
        response.first_logprob.CopyFrom(logprob_to_proto(out.logprobs[0]))
    if out.prompt_logprobs is not None:
        response.prompt_logprobs.extend(prompt_logprobs_to_proto(out.prompt_logprobs))
    if kv_handle is None:
        response.finish_reason, response.text = out.finish_reason or "", out.text
        set_stop_reason(response, out.stop_reason)
    else:
        response.kv_handle.CopyFrom(kv_handle)
    return response


def output_to_proto(out: RequestOutput, kv_source: str) -> pb.GenerateResponse:
    message = pb.GenerateResponse(
        token_ids=out.new_token_ids, text=out.new_text, finished=out.finished, finish_reason=out.finish_reason or "",
        num_prompt_tokens=len(out.prompt_token_ids), num_cached_tokens=out.num_cached_tokens, kv_source=kv_source)
    if out.new_logprobs:
        message.logprobs.extend(logprob_to_proto(lp) for lp in out.new_logprobs)
    if out.prompt_logprobs is not None:
        message.prompt_logprobs.extend(prompt_logprobs_to_proto(out.prompt_logprobs))
    set_stop_reason(message, out.stop_reason)
    return message
