"""An LRU cache of prompt KV caches, so a shared prompt prefix is read only once.

Chat and FIM traffic repeat long prefixes (a system prompt, the same file), and on a CPU the
prompt read dominates latency. After prefill the engine stores a prompt's keys/values here by
token ids; a later request takes the KV of its longest common prefix with any stored prompt
and prefills only the rest. A causal model's KV for the first ``n`` tokens depends on those
tokens alone, so any common prefix is reusable, not only whole prompts.

Lookup scans the entries, a binary search on list-slice equality each (compares run in C):
fine for the tens of entries a few hundred MiB holds at a few thousand tokens a prompt; a
radix tree over token blocks (vLLM, SGLang) is the step up for thousands.

Entries are partitioned by a *salt* (vLLM's ``cache_salt``): the request's account id, unless
the deployment opted into one shared cache. A lookup only matches its own salt, so a request
can never learn (through ``cached_tokens`` or timing) what another account's prompts held.

An entry also keeps its prompt's last logits (``whole``), the ids of the answer that followed
(``continuation``) and, for a greedy answer run to its end, its ``recipe`` (``answer``): what
``reuse`` builds on. Memory is bounded by bytes (the tensors' actual size), least recently used
evicted first. Not thread-safe: only the step-loop thread calls it (stats may be read anywhere).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from serve_app.runner.kv import KV
from serve_app.sequences import common_prefix_len

DEFAULT_PREFIX_CACHE_BYTES = 512 * 1024 * 1024


# The key of one entry: (salt, token ids); ``protocol.SHARED_CACHE`` is a shared cache's salt.
_Key = tuple[str, tuple[int, ...]]


@dataclass
class _Entry:
    salt: str
    token_ids: list[int]
    kv: KV
    nbytes: int
    following: list[int]  # what came after ``token_ids`` (ids only, no KV): drafts
    recipe: object | None = None  # set when ``following`` is the whole answer to it
    logits: torch.Tensor | None = None  # the last position's, when the prompt was read whole

    @property
    def sequence(self) -> list[int]:
        return self.token_ids + self.following


def kv_nbytes(kv: KV) -> int:
    return sum(t.numel() * t.element_size() for layer in kv for t in layer)


def kv_seq_len(kv: KV) -> int:
    return kv[0][0].shape[-2] if kv else 0


def crop_kv(kv: KV, length: int) -> KV:
    """Views of the first ``length`` positions (no copy; callers must not write into them)."""
    return tuple((k[..., :length, :], v[..., :length, :]) for k, v in kv)


def _owned(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when it owns exactly its storage, else a compact copy: a view (a crop)
    would pin its base's whole buffer and break the byte accounting."""
    t = t.detach()
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


class PrefixCache:
    """Prompt KV caches keyed by (salt, token ids), LRU-evicted to stay under ``max_bytes``.
    ``min_match_tokens``: shorter matches, not worth the copy, count as misses."""

    def __init__(
        self, max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES, *, min_match_tokens: int = 1
    ) -> None:
        self.max_bytes = int(max_bytes)
        self.min_match_tokens = max(1, int(min_match_tokens))
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self.bytes_used = 0
        self.queries = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def lookup(
        self, token_ids: Sequence[int], salt: str, shared: tuple[int, str] | None = None
    ) -> tuple[int, KV | None]:
        """``(cached_len, kv)`` for the longest prefix of ``token_ids`` stored under ``salt``,
        or ``(0, None)``. At most ``len(token_ids) - 1`` tokens: the last prompt token must
        still go through the model, for the logits the first output token is sampled from.
        ``shared``: ``(length, partition)``, the prompt's first ``length`` tokens may also come
        from ``partition`` (a head every account reads alike); the longer hit wins, and the
        lookup counts once in the stats."""
        if not self.enabled:
            return 0, None
        self.queries += 1
        token_ids = list(token_ids)
        best_len, best_key = self._longest(token_ids, salt)
        if shared is not None and shared[0] > best_len:
            # One id past the head, so a hit may cover all of it (the last id is kept back).
            head_len, head_key = self._longest(token_ids[: shared[0] + 1], shared[1])
            if head_len > best_len:
                best_len, best_key = head_len, head_key
        if best_key is None or best_len < self.min_match_tokens:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += best_len
        return best_len, crop_kv(self._entries[best_key].kv, best_len)

    def _longest(self, token_ids: list[int], salt: str) -> tuple[int, _Key | None]:
        """The longest common prefix (at most all but the last id) with an entry of ``salt``,
        and that entry's key."""
        limit = len(token_ids) - 1
        best_len, best_key = 0, None
        for key, entry in self._entries.items():
            if entry.salt != salt:
                continue
            n = min(common_prefix_len(entry.token_ids, token_ids), limit)
            if n > best_len:
                best_len, best_key = n, key
        return best_len, best_key

    def continuation(self, token_ids: Sequence[int], salt: str, overlap: int = 4) -> list[int]:
        """Drafts: what a stored prompt + answer of ``salt`` holds past its longest common prefix
        with ``token_ids`` (offered after a prompt this one extends), from ``overlap`` tokens before
        the divergence so an n-gram ending there finds it; empty when none goes past."""
        if not self.enabled:
            return []
        best_len, best = 0, None
        for entry in self._entries.values():
            if entry.salt != salt or not entry.following:
                continue
            sequence = entry.sequence
            n = common_prefix_len(sequence, token_ids)
            if n > best_len and len(sequence) > n:
                best_len, best = n, sequence
        return [] if best is None else best[max(0, best_len - overlap) :]

    def whole(self, token_ids: Sequence[int], salt: str) -> tuple[KV, torch.Tensor] | None:
        """The KV and last-position logits of a stored prompt equal to ``token_ids``: a
        prompt read before, whole, needs no forward pass to sample its first token."""
        key = (salt, tuple(token_ids))
        entry = self._entries.get(key) if self.enabled else None
        if entry is None or entry.logits is None:
            return None
        self.queries += 1
        self.hits += 1
        self.hit_tokens += len(entry.token_ids)
        self._entries.move_to_end(key)
        return entry.kv, entry.logits

    def answer(self, token_ids: Sequence[int], salt: str) -> tuple[object, list[int]] | None:
        """``(recipe, answer)``: the whole answer stored for exactly this prompt of ``salt``
        and what it answered (``insert``'s ``recipe``); None when there is none."""
        key = (salt, tuple(token_ids))
        entry = self._entries.get(key) if self.enabled else None
        if entry is None or entry.recipe is None:
            return None
        self._entries.move_to_end(key)
        return entry.recipe, list(entry.following)

    def insert(
        self,
        token_ids: Sequence[int],
        kv: KV,
        salt: str,
        following: Sequence[int] = (),
        recipe: object | None = None,
        logits: torch.Tensor | None = None,
    ) -> bool:
        """Store the KV of ``token_ids`` under ``salt``, with the ids ``following`` them (an
        answer; ``recipe``: what it wholly answers, for ``answer``) and the last position's
        ``logits`` (for ``whole``); False when no KV was stored (too small/large, covered).
        Within a salt, a stored prompt that is a prefix of the new one is dropped (covered); a
        stored one the new prompt is a prefix of is only refreshed (and, for the very same
        prompt, takes the new ``following``)."""
        ids = tuple(token_ids)
        if not self.enabled or len(ids) < max(2, self.min_match_tokens):
            return False
        if kv_seq_len(kv) != len(ids):
            raise ValueError(f"KV holds {kv_seq_len(kv)} positions for {len(ids)} tokens")
        for other in list(self._entries):
            other_salt, other_ids = other
            if other_salt != salt:
                continue
            if other_ids[: len(ids)] == ids:
                self._entries.move_to_end(other)
                if other_ids == ids:
                    self._update(self._entries[other], following, recipe, logits)
                return False
            if ids[: len(other_ids)] == other_ids:
                self._remove(other)
        kv = tuple((_owned(k), _owned(v)) for k, v in kv)
        logits = None if logits is None else logits.detach().clone()
        nbytes = kv_nbytes(kv) + (0 if logits is None else logits.nbytes)
        if nbytes > self.max_bytes:
            return False
        entry = _Entry(salt, list(ids), kv, nbytes, list(following), recipe, logits)
        self._entries[(salt, ids)] = entry
        self.bytes_used += nbytes
        self._evict_to_fit()
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.bytes_used = 0

    def _update(
        self,
        entry: _Entry,
        following: Sequence[int],
        recipe: object | None,
        logits: torch.Tensor | None,
    ) -> None:
        """Same prompt stored again: a new answer replaces the old; logits (equal) are kept once."""
        if following:
            entry.following, entry.recipe = list(following), recipe
        if logits is not None and entry.logits is None:
            entry.logits = logits.detach().clone()
            entry.nbytes += entry.logits.nbytes
            self.bytes_used += entry.logits.nbytes
            self._evict_to_fit()

    def _evict_to_fit(self) -> None:
        """Drop least recently used entries until within ``max_bytes`` (the entry just stored
        or refreshed is the most recent: it goes only if it alone is too large)."""
        while self.bytes_used > self.max_bytes:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: _Key) -> None:
        self.bytes_used -= self._entries.pop(key).nbytes
