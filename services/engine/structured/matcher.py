"""One sequence's position in its grammar."""
from __future__ import annotations

from llguidance import LLMatcher


class GrammarState:
    """Advanced with every token the sequence accepts, wherever that token was sampled: tokens
    generated on another worker (a prefill worker's first token, the tokens before a migration) are
    replayed into it."""

    def __init__(self, matcher: LLMatcher) -> None:
        self.matcher = matcher

    def advance(self, token: int) -> bool:
        """False when the token breaks the grammar (the matcher then stays in error)."""
        return self.matcher.consume_token(token)

    def replay(self, tokens: list[int]) -> None:
        """Tokens generated elsewhere; raises ValueError when they do not follow the grammar."""
        for i, token in enumerate(tokens):
            if not self.advance(token):
                raise ValueError(
                    f"output token {i} ({token}) does not follow the structured_output grammar: "
                    f"{self.matcher.get_error().strip()}")

    @property
    def done(self) -> bool:
        """The grammar admits no further token (not even one more optional character): the output is
        complete."""
        return self.matcher.is_stopped()
