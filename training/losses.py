"""What a training step minimises: the answer's cross-entropy, read for several examples in
one forward, with the tokens that write a change weighed apart."""

from __future__ import annotations

from typing import Any

import torch

from training.render import IGNORED, TrainingPair


def token_losses(
    model: Any, pairs: list[TrainingPair], device: str, detach_prompt: bool = False
) -> tuple[Any, Any, Any]:
    """Cross-entropy of every answer token of ``pairs``, read in one forward, which of them
    write a change, and the pair (row) each belongs to. ``detach_prompt``: ``detached_losses``.

    The rows are padded on the right and read without a mask: attention is causal, so no real
    position sees the pads after it, and the pads' own outputs are never scored. Only the
    positions that predict an answer token go through the LM head (136 M of the 0.5B's 494 M
    weights): the prompt's logits would be computed only to be ignored."""
    if detach_prompt:
        return detached_losses(model, pairs, device)
    causal = model.get_base_model()
    width = max(len(pair.ids) for pair in pairs)
    ids = torch.zeros((len(pairs), width), dtype=torch.long)
    labels = torch.full((len(pairs), width), IGNORED, dtype=torch.long)
    changed = torch.zeros((len(pairs), width), dtype=torch.bool)
    for row, pair in enumerate(pairs):
        ids[row, : len(pair.ids)] = torch.tensor(pair.ids)
        labels[row, : len(pair.ids)] = torch.tensor(pair.labels)
        changed[row, : len(pair.ids)] = torch.tensor(pair.changed)
    hidden = causal.model(input_ids=ids.to(device)).last_hidden_state[:, :-1]
    targets, changed = labels[:, 1:].to(device), changed[:, 1:].to(device)
    answer = targets != IGNORED
    logits = causal.lm_head(hidden[answer]).float()
    losses = torch.nn.functional.cross_entropy(logits, targets[answer], reduction="none")
    rows = torch.arange(len(pairs), device=device)[:, None].expand_as(answer)[answer]
    return losses, changed[answer], rows


def detached_losses(model: Any, pairs: list[TrainingPair], device: str) -> tuple[Any, Any, Any]:
    """``token_losses`` with each prompt read without a graph: its keys and values cached
    under ``no_grad``, then the answer read after them with one. The values are the same; the
    gradient reaches the adapter only through the answer's positions, so a backward costs the
    answer's few tokens, not the ~2,000 of the prompt (an approximation: the prompt's keys and
    values no longer learn). One pair a forward."""
    causal = model.get_base_model()
    losses, changed, rows = [], [], []
    for row, pair in enumerate(pairs):
        first = next(i for i, label in enumerate(pair.labels) if label != IGNORED)
        ids = torch.tensor([pair.ids], device=device)
        with torch.no_grad():
            cache = causal.model(input_ids=ids[:, : first - 1], use_cache=True).past_key_values
        hidden = causal.model(input_ids=ids[:, first - 1 : -1], past_key_values=cache)
        targets = torch.tensor(pair.labels[first:], device=device)
        answer = targets != IGNORED
        logits = causal.lm_head(hidden.last_hidden_state[0][answer]).float()
        losses.append(torch.nn.functional.cross_entropy(logits, targets[answer], reduction="none"))
        changed.append(torch.tensor(pair.changed[first:], device=device)[answer])
        rows.append(torch.full((int(answer.sum()),), row, device=device))
    return torch.cat(losses), torch.cat(changed), torch.cat(rows)


def answer_weight(pair: TrainingPair, change_weight: float = 1.0) -> float:
    """What ``pair``'s answer tokens weigh in a step: one each, ``change_weight`` for those
    that write a change. A step's loss is its answer tokens' weighted mean (``answer_loss``
    over this): a mean per example instead would give the one token of a "no change"
    answer the weight of an edit's ~20, and a CPU-recipe adapter trained so put 0.7 on
    ending the turn first where an edit was due (docs/next_edit.md)."""
    return sum(
        token_weight(changed, change_weight)
        for label, changed in zip(pair.labels, pair.changed, strict=True)
        if label != IGNORED
    )


def token_weight(changed: Any, change_weight: float) -> Any:
    """An answer token's weight (a bool, or a tensor of them): ``change_weight`` where it
    writes a change, else one."""
    return 1.0 + (change_weight - 1.0) * changed


def answer_loss(
    model: Any,
    pairs: list[TrainingPair],
    device: str,
    change_weight: float = 1.0,
    detach_prompt: bool = False,
) -> tuple[Any, int]:
    """The weighted sum of ``pairs``' answer-token cross-entropies, tokens that write a change
    weighing ``change_weight`` times the rest (``answer_weight``), and how many tokens were
    read. Nearly every token of a rewritten region copies it, so at weight 1 a step's loss is
    mostly copying: the weight is what makes the few changed tokens count."""
    losses, changed, _ = token_losses(model, pairs, device, detach_prompt)
    weighted = losses * token_weight(changed.float(), change_weight)
    return weighted.sum(), sum(len(pair.ids) for pair in pairs)


def sequence_log_probs(losses: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """Each of ``count`` pairs' answer log-probability, from ``token_losses``' answer tokens."""
    return -torch.zeros(count, device=losses.device).index_add(0, rows, losses.float())
