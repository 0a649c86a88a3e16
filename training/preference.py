"""Preference training against the no-op answer (``train --objective dpo``).

An adapter trained on the expected answers alone learns, above all, to keep the region: half
its answers to real edits change nothing. Here each edit example is a preference, its expected
region (chosen) over the region as it stands (rejected), learned by DPO (Rafailov et al. 2023)
against the adapter the run starts from: the loss is ``-log sigmoid(beta * margin)``, where the
margin is how much more the run's model prefers the chosen answer to the rejected one than the
starting model did, plus the chosen answer's per-token cross-entropy (``sft_weight``), which
keeps the edit's own likelihood from falling with the no-op's. A no-change example has no
rejected answer (keeping the region is right); it is learned by cross-entropy alone, so the
run learns when to change, not to change always. Zeta (Zed) ran DPO after SFT; its rejected
answers were its own wrong ones.
"""

from __future__ import annotations

from typing import Any

import torch

from training.edits import EditExample
from training.losses import answer_loss, answer_weight, sequence_log_probs, token_losses
from training.render import TrainingPair, training_pair


def preference_pairs(
    examples: list[EditExample], tokenizer: Any, style: str, max_tokens: int
) -> tuple[list[TrainingPair], dict[int, TrainingPair]]:
    """Each example's expected answer, and for an edit example, keyed by its index among
    those, the no-op answer it is preferred to; examples over ``max_tokens`` are left out."""
    chosen: list[TrainingPair] = []
    rejected: dict[int, TrainingPair] = {}
    for example in examples:
        pair = training_pair(example, example.expected, tokenizer, style)
        if pair is None or len(pair.ids) > max_tokens:
            continue
        if example.kind == "edit":
            no_op = training_pair(example, example.region, tokenizer, style)
            if no_op is not None:  # the region unchanged: an answer every prompt can show
                rejected[len(chosen)] = no_op
        chosen.append(pair)
    return chosen, rejected


class Reference:
    """The starting adapter: its weights kept aside and put back in place, under no_grad, for
    the time it takes to score the reference, so one model serves as both."""

    def __init__(self, model: Any) -> None:
        from peft import get_peft_model_state_dict

        self.weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}

    @torch.no_grad()
    def log_probs(self, model: Any, pairs: list[TrainingPair], device: str) -> torch.Tensor:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        current = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
        model.eval()  # no dropout in the reference's score
        set_peft_model_state_dict(model, self.weights)
        try:
            losses, _, rows = token_losses(model, pairs, device)
            return sequence_log_probs(losses, rows, len(pairs))
        finally:
            set_peft_model_state_dict(model, current)
            model.train()


def preference_loss(
    model: Any,
    reference: Reference,
    chosen: TrainingPair,
    rejected: TrainingPair | None,
    device: str,
    beta: float,
    sft_weight: float,
) -> tuple[torch.Tensor, int]:
    """One example's loss and the tokens it read: DPO's with the chosen answer's
    cross-entropy beside it, or where nothing is rejected, the cross-entropy alone."""
    if rejected is None:
        loss, read = answer_loss(model, [chosen], device)
        return loss / answer_weight(chosen), read
    pair = [chosen, rejected]
    before = reference.log_probs(model, pair, device)
    losses, _, rows = token_losses(model, pair, device)
    now = sequence_log_probs(losses, rows, 2)
    margin = (now[0] - before[0]) - (now[1] - before[1])
    chosen_loss = losses[rows == 0].float().mean()
    loss = -torch.nn.functional.logsigmoid(beta * margin) + sft_weight * chosen_loss
    return loss, len(chosen.ids) + len(rejected.ids)
