"""Rendering a chat request with the model's chat template, as vLLM does: the `developer` role as
`system` where the template has no `developer`, roles beyond OpenAI's four passed through,
`chat_template_kwargs` (and `reasoning_effort`, `verbosity`) as template variables,
`add_generation_prompt` and `continue_final_message`. The one place these fields are checked."""
from __future__ import annotations

from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from baton.services.openai.errors import ProtocolError

# Arguments apply_chat_template takes itself: a template variable of the same name would change what
# is rendered or returned behind the request's back.
RESERVED_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


def check_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """`chat_template_kwargs` as sent, or ValueError naming a key that the server sets itself."""
    clash = sorted(set(kwargs or {}) & RESERVED_KWARGS)
    if clash:
        raise ValueError(f"`{clash[0]}` is set by the server, not a template variable; use the "
                         "request field of that name where there is one")
    return kwargs


def check_generation_flags(add_generation_prompt: bool, continue_final_message: bool,
                           last_role: str) -> None:
    """vLLM's rules: a final message is continued instead of a new one opened, and only an
    assistant's."""
    if not continue_final_message:
        return
    if add_generation_prompt:
        raise ProtocolError("continue_final_message and add_generation_prompt cannot both be true",
                            param="continue_final_message")
    if last_role != "assistant":
        raise ProtocolError("continue_final_message needs the last message to be the assistant's, "
                            f"not the {last_role!r}'s", param="continue_final_message")


def template_roles(messages: list[dict[str, Any]],
                   tokenizer: PreTrainedTokenizerBase) -> list[dict[str, Any]]:
    """`developer` becomes `system` for a template that never mentions developer (OpenAI's newer
    name for the same instructions); other roles pass as sent, for the template to render or
    refuse."""
    template = tokenizer.chat_template
    if isinstance(template, str) and "developer" in template:
        return messages
    return [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None, add_generation_prompt: bool,
                continue_final_message: bool, variables: dict[str, Any]) -> str:
    """The prompt text; a 400 naming `messages` when the template refuses them."""
    if tokenizer.chat_template is None:
        raise ProtocolError("this model has no chat template; use /v1/completions",
                            param="messages")
    try:
        return tokenizer.apply_chat_template(
            template_roles(messages, tokenizer), tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tokenize=False, **variables)
    # Templates reject what they cannot render, e.g. roles that do not alternate; some fail on a
    # null content (an assistant message that only calls tools) with a TypeError; transformers
    # refuses to continue a final message it cannot find in the text with a ValueError.
    except (TemplateError, TypeError, ValueError) as e:
        raise ProtocolError(f"messages: the chat template refused them: {e}",
                            param="messages") from None
