"""The engine's counters and the snapshot metrics read (``EngineStats``, a copy taken on any
thread)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineCounters:
    """Totals since start; the step loop is their one writer (one thread), so plain ints do."""

    steps: int = 0
    decode_steps: int = 0
    prefill_tokens: int = 0
    scored_tokens: int = 0  # tokens of scoring passes (decisions' questions and options)
    peak_decode_batch: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_failed: int = 0
    draft_tokens: int = 0  # speculative tokens proposed, and of those accepted
    accepted_draft_tokens: int = 0
    model_draft_tokens: int = 0  # the same, of the draft model's drafts only
    accepted_model_draft_tokens: int = 0
    answers_replayed: int = 0  # greedy requests asked again, answered from the cache

    def count_drafts(self, drafted: int, accepted: int, by_model: bool) -> None:
        self.draft_tokens += drafted
        self.accepted_draft_tokens += accepted
        if by_model:
            self.model_draft_tokens += drafted
            self.accepted_model_draft_tokens += accepted

    def decode_batch(self, rows: int) -> None:
        self.decode_steps += 1
        self.peak_decode_batch = max(self.peak_decode_batch, rows)


@dataclass
class EngineStats(EngineCounters):
    """A snapshot for metrics: the counters, plus the queue and cache state at that moment."""

    num_running: int = 0
    num_waiting: int = 0
    num_prefilling: int = 0
    num_decoding: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_hit_tokens: int = 0
    prefix_cache_bytes: int = 0
    draft_model_read_tokens: int = 0  # tokens the draft model read to catch up with requests
    backend: str = "hf"

    @property
    def draft_acceptance(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0
