"""What a request reuses from its account's earlier requests, through the prefix cache.

Three kinds, cheapest first, all within the request's cache partition (its account's, so one
account's prompts never hit for another's; apart per LoRA adapter: ``protocol.cache_partition``),
and one public head shared by every account (``ScoringRequest.public_prefix``: text the service
wrote, such as the decisions prompt's instructions and examples):

- **the answer**: the same greedy request again (equal prompt ids and sampling parameters) is
  last time's answer, replayed through the output processor with no forward pass: greedy
  decoding is a function of prompt and parameters, and only answers that ran to their end are
  kept. With token healing, a keystroke along the suggestion is such a request too (``answer``);
- **the KV** of the longest common prefix with a stored prompt, so only the rest is read; a
  prompt equal to a stored one reads nothing, its first token sampled from the stored logits;
- **the suggestion**: the answer ids that followed a stored prompt this one extends, as drafts
  (the user typing what was suggested).

Every ended request's prompt KV goes back with its answer's ids, a partly read prompt too: a
client that cancels on every keystroke and asks again with one more character then reads only
what is new, even if no request ever finished.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from serve_app.engine.model_backend import ModelBackend
from serve_app.engine.prefix_cache import PrefixCache, crop_kv
from serve_app.engine.protocol import PUBLIC_CACHE
from serve_app.engine.requests import RequestState, ScoringState, State
from serve_app.grammar.token_bytes import TokenTexts


class PromptReuse:
    """The engine's prefix cache and the rules for reading and filling it (step-loop thread
    only). ``drafts(state)``: how many tokens the request's route drafts (0: no corpus needed)."""

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
        """The stored whole answer to this greedy request, or None. One stored for the same
        prompt and parameters is this request's if it also spells its answer prefix, which
        extends the one it was given (the user typed on along the suggestion; healed, the prompt
        stays the same): each token was the best its prefix allowed, a longer prefix allows a
        subset still holding it, so greedy picks it again. It must also end where it did: no
        stop string may begin in the part now typed."""
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
        """``(cached_len, kv, logits)``: a generation's whole prompt read before gives its KV and
        last logits; otherwise the KV of the longest stored prefix (``PrefixCache.lookup``) and
        no logits. A generation that drafts also gets what followed (``draft_corpus``)."""
        salt = state.request.cache_partition
        if isinstance(state, RequestState) and self.drafts(state):
            state.draft_corpus = self.cache.continuation(state.lookup_ids, salt)
        whole = self.cache.whole(state.lookup_ids, salt)
        if isinstance(state, RequestState) and whole is not None:
            return len(state.prompt_ids), whole[0], whole[1]
        public = _public_prefix(state)  # the service's own head, read before for any account
        shared = (public, PUBLIC_CACHE) if public else None
        cached, kv = self.cache.lookup(state.lookup_ids, salt, shared)
        return cached, kv, None

    def insert(self, state: State, logits: torch.Tensor | None = None) -> None:
        """Keep the prompt's KV read so far, the ids that followed, and its last ``logits`` if just
        read whole. Output stays ids, not KV: decode steps compute keys and values in other kernels
        than prompt chunks, so a prompt reusing them would answer unlike one read cold."""
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
        public = _public_prefix(state)
        if 1 < public <= length:  # a no-op once stored: the cache keeps a prompt once
            self.cache.insert(state.prompt_ids[:public], crop_kv(kv, public), PUBLIC_CACHE)

    def keep(self, states: Sequence[State]) -> None:
        """Store ended requests' prompt KV and output ids, a partly read prompt too (module doc).
        Of a scoring request only the prefix is kept, not what its passes wrote past it."""
        for state in states:
            if state.prompt_computed > state.cached_tokens or state.following_ids:
                self.insert(state)


def _public_prefix(state: State) -> int:
    """How many of the prompt's first tokens every account may share (scoring requests on the
    base model only: an adapter's keys and values are not the base model's)."""
    if not isinstance(state, ScoringState) or state.request.adapter:
        return 0
    return state.request.public_prefix


def _recipe(state: State) -> object | None:
    """What the stored answer wholly answers: a greedy generation's parameters and answer
    prefix, once it finished by itself (stop, eos or length; not a failure or an abort)."""
    if not isinstance(state, RequestState) or state.finish_reason is None:
        return None
    request = state.request
    return (request.params, request.answer_prefix) if request.params.greedy else None
