"""What speculation counts, with vLLM's meaning (vllm:spec_decode_* -> baton_spec_decode_*)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0  # verified drafts (sequence-steps that speculated)
    num_draft_tokens: int = 0  # tokens proposed in them
    num_accepted_tokens: int = 0  # of those, accepted
    # accepted_per_pos[j]: drafts whose token at position j was accepted
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, num_draft: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        for j in range(num_accepted):
            self.accepted_per_pos[j] += 1

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted share of the draft tokens; None before any draft."""
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens
