"""What a request reuses from its account's earlier requests, through the prefix cache.

Three kinds of reuse, cheapest first, all within one cache partition (the request's
``cache_partition``: its account's ``cache_salt``, so one account's prompts are never a hit for
another's, and apart per LoRA adapter, whose keys and values are not the base model's):

- **the answer**: the same greedy request again (equal prompt ids, equal sampling parameters)
  is the answer given last time, replayed token by token through the output processor with no
  forward pass. Greedy decoding is a function of the prompt and the parameters, so this is
  the answer a forward pass would give; only answers that ran to their end are kept. With
  token healing a keystroke along the suggestion is such a request too (``answer``);
- **the KV** of the longest common token prefix with any stored prompt, loaded into the
  request's slot so that only the rest of its prompt is read; a prompt equal to a stored one
  reads nothing, its first token sampled from the stored last-position logits;
- **the suggestion**: the ids of the answer that followed a stored prompt which this one
  extends, as drafts (the user typing what was suggested).

Every ended request's prompt KV goes back into the cache, with its answer's ids, including a
prompt read only in part (a client that cancels on each keystroke).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from serve_app.engine.backend import ModelBackend
from serve_app.engine.prefix_cache import PrefixCache, crop_kv
from serve_app.engine.requests import RequestState, State
from serve_app.grammar.token_bytes import TokenTexts


class PromptReuse:
    """The engine's prefix cache and the rules for reading and filling it (step-loop thread
    only). ``drafts(state)``: how many tokens the request's role drafts (0: no corpus needed)."""

    def __init__(
        self,
        cache: PrefixCache,
        backend: ModelBackend,
        token_texts: TokenTexts,
        drafts: Callable[[RequestState], int],
    ) -> None:
        self.cache = cache
        self.backend = backend
        self.token_texts = token_texts
        self.drafts = drafts

    def answer(self, state: State) -> list[int] | None:
        """The stored whole answer to this greedy request, or None.

        Stored for the same prompt and parameters, an answer is this request's if it also
        spells this request's answer prefix, which extends the one it was given (the user
        typed on along the suggestion: healed, the prompt stays the same). Each of its tokens
        was the best among those its prefix allowed, and a longer prefix allows a subset of
        them that still holds it, so greedy decoding picks it again. It must also end where
        it ended: a stop string there must not begin in the part the client now typed."""
        if not isinstance(state, RequestState) or not state.request.params.greedy:
            return None
        request = state.request
        stored = self.cache.answer(request.prompt_token_ids, request.cache_partition)
        if stored is None:
            return None
        (params, given), answer = stored
        typed = request.answer_prefix
        if params != request.params or not typed.startswith(given):
            return None
        spelled = b"".join(self.token_texts.token_bytes[token] for token in answer)
        if not spelled.startswith(typed.encode()):
            return None
        text = spelled.decode(errors="replace")
        if any(0 <= text.find(stop, len(given)) < len(typed) for stop in params.stop):
            return None
        return answer

    def lookup(self, state: State) -> tuple[int, Any, torch.Tensor | None]:
        """``(cached_len, kv, logits)``: a generation whose whole prompt was read before gets
        its KV and last logits (nothing to read); otherwise the KV of the longest stored
        prefix, less the last prompt token, and no logits. A generation that drafts also gets
        what followed the prompt (``draft_corpus``)."""
        salt = state.request.cache_partition
        if isinstance(state, RequestState) and self.drafts(state):
            state.draft_corpus = self.cache.continuation(state.lookup_ids, salt)
        whole = self.cache.whole(state.lookup_ids, salt)
        if isinstance(state, RequestState) and whole is not None:
            return len(state.prompt_ids), whole[0], whole[1]
        cached, kv = self.cache.lookup(state.lookup_ids, salt)
        return cached, kv, None

    def insert(self, state: State, logits: torch.Tensor | None = None) -> None:
        """Keep the KV of the prompt read so far, and the ids of what followed it (and the
        last position's ``logits``, when the prompt was just read whole).

        Output tokens are kept as ids only (for drafts and replayed answers), not as KV: a
        decode step computes a token's keys and values in other kernels than a prompt chunk,
        and a prompt reusing them would answer differently from the same prompt read cold."""
        kv = self.backend.computed_kv(state)
        if kv is None:
            return
        length = state.prompt_computed
        whole_prompt = length == len(state.prompt_ids)
        self.cache.insert(
            state.prompt_ids[:length],
            crop_kv(kv, length),
            state.request.cache_partition,
            following=state.following_ids if whole_prompt else (),
            recipe=_recipe(state) if whole_prompt else None,
            logits=logits if whole_prompt else None,
        )

    def keep(self, states: Sequence[State]) -> None:
        """Ended requests' prompt KV, with their output's ids; a prompt read only in part
        too, so a client that cancels on every keystroke and asks again with one more
        character reads only what is new, even if no request ever finished. (Passes of a
        scoring request write past its prefix; only the prefix is kept.)"""
        for state in states:
            if state.prompt_computed > state.cached_tokens or state.following_ids:
                self.insert(state)


def _recipe(state: State) -> object | None:
    """What the stored answer is the whole answer to: a greedy generation's parameters and
    answer prefix, once it finished by itself (a stop, eos or its length; not a failure or an
    abort)."""
    if not isinstance(state, RequestState) or state.finish_reason is None:
        return None
    request = state.request
    return (request.params, request.answer_prefix) if request.params.greedy else None
