"""From a step's accepted tokens to RequestOutputs: append, stop checks, detokenize, finish.

A step accepts a list of tokens per sequence: one sampled token, or with speculative decoding a
verified draft and one token more. All go through the same path, token by token, and a request
that stops partway keeps only the tokens up to its stop.
"""
from __future__ import annotations

from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.engine.kv.handoff import HandoffTable
from baton.services.engine.requests import RequestIntake
from baton.services.engine.scheduler import Scheduler
from baton.services.engine.sequence import Sequence
from baton.services.engine.stats import EngineCounters


def _take_prompt_logprobs(seq: Sequence) -> list[TokenLogprobs | None] | None:
    """The prompt logprobs, once, when all are known (a hand-off's receiver never has them: its
    caller got them from the prefill worker)."""
    done = seq.prompt_logprobs is not None and len(seq.prompt_logprobs) == seq.num_prompt_tokens
    if not done or seq.prompt_logprobs_sent:
        return None
    seq.prompt_logprobs_sent = True
    return seq.prompt_logprobs


class OutputProcessor:

    def __init__(self, requests: RequestIntake, scheduler: Scheduler, handoffs: HandoffTable,
                 counters: EngineCounters, eos_ids: frozenset[int]) -> None:
        self.requests = requests
        self.scheduler = scheduler
        self.handoffs = handoffs
        self.counters = counters
        self.eos_ids = eos_ids

    def process(self, seqs: list[Sequence], tokens: list[list[int]],
                logprobs: list[list[TokenLogprobs | None]]) -> list[RequestOutput]:
        """One output per sequence: tokens[i] and logprobs[i] are what seqs[i] accepted this
        step, in order (logprobs None where the request asked for none)."""
        append = self.append
        return [append(seq, toks, lps) for seq, toks, lps in zip(seqs, tokens, logprobs)]

    def append(self, seq: Sequence, tokens: list[int],
               logprobs: list[TokenLogprobs | None]) -> RequestOutput:
        """Appends tokens one by one, checking after each whether the request ends there; when one
        does, the tokens after it are dropped and the request finishes."""
        detok = self.requests.detokenizers[seq.request_id]
        p = seq.params
        num_new = 0
        for token, lp in zip(tokens, logprobs):
            seq.token_ids.append(token)
            num_new += 1
            self.counters.generation_tokens += 1
            if seq.logprobs is not None and lp is not None:
                seq.logprobs.append(lp)
            stop = detok.add(token)
            # A token the grammar refuses can only come from a hand-off whose first token was drawn
            # unconstrained.
            grammar_ok = seq.grammar is None or seq.grammar.advance(token)
            if not grammar_ok:
                seq.finish_reason = "abort"
            elif stop is not None:
                seq.finish_reason, seq.stop_reason = "stop", stop
            elif token in p.stop_token_ids and seq.num_output_tokens >= p.min_tokens:
                seq.finish_reason, seq.stop_reason = "stop", token
            elif (token in self.eos_ids and not p.ignore_eos
                  and seq.num_output_tokens >= p.min_tokens):
                seq.finish_reason = "stop"
            elif seq.grammar is not None and seq.grammar.done:
                seq.finish_reason = "stop"  # the grammar's output is complete
            elif seq.num_output_tokens >= p.max_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason is not None:
                return self.finish(seq, num_new)
        return self.output(seq, num_new, final=False)

    def finish(self, seq: Sequence, num_new: int = 0) -> RequestOutput:
        """Takes seq out of the batch (its blocks freed, or held for a pull) and out of flight; its
        final output carries its last num_new tokens as new."""
        hold = seq.hold_kv and seq.finish_reason != "abort"
        self.scheduler.remove(seq, free_blocks=not hold)
        self.counters.requests_finished += 1
        out = self.output(seq, num_new=num_new, final=True)
        if hold:
            self.handoffs.hold(seq)
        self.requests.forget(seq.request_id)
        return out

    def output(self, seq: Sequence, num_new: int, final: bool) -> RequestOutput:
        detok = self.requests.detokenizers[seq.request_id]
        new_text = detok.release(final)
        # The histories stay where they grow (token and logprob lists only append; text past
        # `released` is the only text ever cut): each output keeps a length, not a copy.
        tokens, end, lps = seq.token_ids, seq.num_tokens, seq.logprobs
        num_lps = 0 if lps is None else len(lps)
        snapshot = RequestOutput.snapshot
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.prompt_token_ids,
            token_ids=snapshot(seq, "token_ids", seq.num_prompt_tokens, end),
            text=snapshot(detok, "text", 0, detok.released), num_new_tokens=num_new,
            new_text=new_text, finished=final, finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            logprobs=None if lps is None else snapshot(seq, "logprobs", 0, num_lps),
            num_cached_tokens=seq.num_cached_tokens, new_token_ids=tokens[end - num_new:end],
            new_logprobs=None if lps is None else lps[max(0, num_lps - num_new):num_lps],
            prompt_logprobs=_take_prompt_logprobs(seq))
