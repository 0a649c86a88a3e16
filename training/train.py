"""Train a LoRA adapter for next-edit on the mined examples (``training.mine``).

    python -m training.train --data data/next_edit --out data/adapters/next-edit
    make next-edit-adapter

The base is the embedded 0.5B (``--model``: any source the config takes). Every linear layer
gets a rank-``--rank`` LoRA (peft); the loss counts the answer's tokens only, rendered by the
edit service's own prompt path (``training.render``) in ``--style``, those that write a change
weighing ``--change-weight`` times the rest. ``--init-adapter`` starts from a trained adapter.
On the CPU it trains in bf16 where the CPU computes it natively (AVX512-BF16, AMX), else fp32;
on a CUDA GPU in bf16.

Long runs stop and go on: every ``--save-every`` steps the adapter, the optimizer, the step
and the data order go to ``OUT/checkpoint`` (written whole, then renamed into place; OUT is a
cache folder outside the work tree by default), and a later run with the same ``--out``
resumes from there. ``--session-minutes`` pauses a run before a session ends;
``--seed-out`` keeps a small copy to commit, from which ``--init-adapter`` goes on on another
machine (``training.seed``). A line per step shows the loss, tokens
a second and what is left; every ``--eval-every`` steps, the loss on the validation split
and the first answer token's probability for edits and for no change (``validate``).
The finished adapter is ``OUT/adapter`` (peft's files), with ``OUT/training.json`` beside it:
the data's version, the seed, the steps, the style, the base model and every validation loss.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from serve_app.models.loader import TRAINING_RECORD
from serve_app.prompts.next_edit.messages import PROMPT_STYLES
from training.losses import answer_loss, answer_weight, token_losses
from training.mix import encode_all, load_examples, training_mix
from training.preference import Reference, preference_loss, preference_pairs
from training.record import data_record, run_record
from training.render import TrainingPair, pack, unpack
from training.schedule import RunClock, SessionClock, learning_rate
from training.seed import adopt_seed, is_seed, save_seed

DEFAULT_MODEL = "embedded:qwen2.5-coder-0.5b"
STATE_FILE = "state.pt"
PAIRS_FILE = "pairs.pt"


@dataclass
class Progress:
    """What a checkpoint holds besides the weights: enough to go on where it stopped."""

    step: int = 0
    order: list[int] = field(default_factory=list)  # training examples' indices, shuffled
    position: int = 0  # next index into ``order``
    validation: list[tuple[int, float]] = field(default_factory=list)  # (step, loss)
    validation_changed: list[tuple[int, float]] = field(default_factory=list)  # changed tokens
    # (step, mean probability of an edit's first answer token, of a no-change answer's)
    validation_first_token: list[tuple[int, float | None, float | None]] = field(
        default_factory=list
    )
    seconds: float = 0.0

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> Progress:
        progress = cls(**fields)
        progress.validation = [tuple(pair) for pair in progress.validation]
        progress.validation_changed = [tuple(pair) for pair in progress.validation_changed]
        progress.validation_first_token = [tuple(t) for t in progress.validation_first_token]
        return progress


def default_out() -> Path:
    """A cache folder outside the work tree: ``$XDG_CACHE_HOME/serve-app/training/next-edit``."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "serve-app" / "training" / "next-edit"


def train_dtype(device: str) -> torch.dtype:
    if device.startswith("cuda"):
        return torch.bfloat16
    # Imported here: a GPU machine trains without the serving engine's packages (pydantic).
    from serve_app.runner.builder import cpu_has_bf16_compute

    return torch.bfloat16 if cpu_has_bf16_compute() else torch.float32


def load_tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer

    from serve_app.models.loader import resolve_source

    return AutoTokenizer.from_pretrained(resolve_source(source))


def load_base(source: str, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    from serve_app.models.loader import resolve_source

    return AutoModelForCausalLM.from_pretrained(resolve_source(source), dtype=dtype).to(device)


# Every linear layer of a decoder block (what peft's "all-linear" picks in Qwen2, less lm_head).
LINEAR_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def with_lora(model: Any, rank: int, layers: int) -> Any:
    """A rank-``rank`` LoRA on every linear layer of the last ``layers`` blocks (0: all).
    Blocks below the first adapted one get no gradient, so autograd never goes back through
    them: on the CPU, the last 8 of the 0.5B's 24 blocks train much faster than all 24
    (docs/next_edit_log.md)."""
    from peft import LoraConfig, get_peft_model

    depth = model.config.num_hidden_layers
    chosen = list(range(depth - layers, depth)) if 0 < layers < depth else None
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.05,
        target_modules=LINEAR_LAYERS,
        layers_to_transform=chosen,
    )
    return get_peft_model(model, config)


@dataclass(frozen=True)
class Validation:
    """The held-out split's figures: the mean cross-entropy over every answer token and over
    those that write a change, and the mean probability of the right first answer token for
    edits and for "no change" answers (None where the split has none). In ``chat_span`` that
    token decides whether to edit at all (``@@`` or the end of the turn), so the pair tells an
    adapter that edits everywhere, or nowhere, from one that tells the two apart."""

    loss: float
    changed_loss: float
    first_token_edit: float | None
    first_token_no_change: float | None


@torch.no_grad()
def validate(model: Any, pairs: list[TrainingPair], device: str) -> Validation:
    """``pairs``' ``Validation``, one pair a forward. A pair with no token that writes a change
    is a "no change" answer."""
    model.eval()
    total, count, changed_total, changed_count = 0.0, 0, 0.0, 0
    first: dict[bool, list[float]] = {True: [], False: []}
    for pair in pairs:
        losses, changed, _ = token_losses(model, [pair], device)
        total, count = total + float(losses.sum()), count + len(losses)
        changed_total += float(losses[changed].sum())
        changed_count += int(changed.sum())
        first[bool(changed.any())].append(float(torch.exp(-losses[0])))
    model.train()
    edit, quiet = (sum(p) / len(p) if p else None for p in (first[True], first[False]))
    return Validation(total / max(count, 1), changed_total / max(changed_count, 1), edit, quiet)


def save_checkpoint(out: Path, model: Any, optimizer: Any, progress: Progress) -> None:
    """The adapter, the optimizer and ``progress`` in OUT/checkpoint, replaced whole."""
    partial, final = out / "checkpoint.partial", out / "checkpoint"
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    torch.save(
        {"optimizer": optimizer.state_dict(), "progress": asdict(progress)}, partial / STATE_FILE
    )
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)


def load_adapter_weights(model: Any, folder: Path) -> None:
    """A saved adapter's weights into ``model``'s LoRA, every one of them or an error."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(folder / "adapter_model.safetensors"))
    dtype = next(p.dtype for p in model.parameters() if p.requires_grad)
    weights = {key: tensor.to(dtype) for key, tensor in weights.items()}
    result = set_peft_model_state_dict(model, weights)
    if result.unexpected_keys:
        raise SystemExit(f"{folder}: weights this LoRA lacks, e.g. {result.unexpected_keys[0]}")


def resume(out: Path, model: Any, optimizer: Any) -> Progress | None:
    checkpoint = out / "checkpoint"
    if not (checkpoint / STATE_FILE).exists():
        return None
    load_adapter_weights(model, checkpoint)
    state = torch.load(checkpoint / STATE_FILE, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    return Progress.from_dict(state["progress"])


Encoded = tuple[list[TrainingPair], dict[int, TrainingPair], list[TrainingPair]]


def encoded_pairs(args: argparse.Namespace, rng: random.Random) -> Encoded:
    """The run's training pairs, the no-op answers rejected for them (``--objective dpo``;
    keyed by the pair's index) and the validation pairs, encoded once into ``OUT/pairs.pt``
    with what chose them and the random state after choosing, so that a run elsewhere (a GPU
    machine that has only the data's manifest) reads the same pairs in the same order."""
    key = {
        "data_version": data_record(args.data)["data_version"],
        **{name: getattr(args, name) for name in ("model", "style", "max_tokens", "seed")},
        **{name: getattr(args, name) for name in ("no_change", "eval_examples", "objective")},
        **({"min_support": args.min_support} if args.min_support else {}),
        **({"typing": args.typing} if args.typing else {}),
        **({"history_cursor": args.history_cursor} if args.history_cursor else {}),
    }
    path = args.out / PAIRS_FILE
    if path.exists():
        cached = torch.load(path, weights_only=False)
        if cached["key"] == key:
            rng.setstate(cached["rng"])
            rejected = dict(zip(cached["rejected_of"], unpack(cached["rejected"]), strict=True))
            return unpack(cached["train"]), rejected, unpack(cached["validation"])
        log(f"{path} was encoded for another run: encoding again")
    tokenizer = load_tokenizer(args.model)
    examples = load_examples(args.data / "train.jsonl")
    mix = training_mix(
        examples, args.no_change, args.min_support, rng, args.typing, args.history_cursor
    )
    if args.objective == "dpo":
        train_pairs, rejected = preference_pairs(mix, tokenizer, args.style, args.max_tokens)
    else:
        train_pairs, rejected = encode_all(mix, tokenizer, args.style, args.max_tokens), {}
    validation_file = args.data / "validation.jsonl"
    held_out = load_examples(validation_file) if validation_file.exists() else []
    held_out = rng.sample(held_out, min(args.eval_examples, len(held_out)))
    validation_pairs = encode_all(held_out, tokenizer, args.style, args.max_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    cached = {"key": key, "rng": rng.getstate(), "rejected_of": list(rejected)}
    cached |= {"rejected": pack(list(rejected.values())), "train": pack(train_pairs)}
    torch.save(cached | {"validation": pack(validation_pairs)}, path)
    return train_pairs, rejected, validation_pairs


def run(args: argparse.Namespace) -> dict:
    clock = RunClock(args.minutes)  # loading and the first evaluation count against it
    session = SessionClock(args.session_minutes)
    seeded = adopt_seed(args.init_adapter, args) if is_seed(args.init_adapter) else None
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    train_pairs, rejected, validation_pairs = encoded_pairs(args, rng)
    if not train_pairs:
        raise SystemExit(f"no training example of at most {args.max_tokens} tokens in {args.data}")
    if args.encode_only:
        log(f"{len(train_pairs)} training pairs encoded in {args.out / PAIRS_FILE}")
        return {"encoded": len(train_pairs)}
    dtype = train_dtype(args.device)
    model = with_lora(load_base(args.model, args.device, dtype), args.rank, args.layers)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.0)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.init_adapter:
        load_adapter_weights(model, args.init_adapter)
    # DPO's reference: the adapter the run starts from (none: the base model), not a resumed one.
    reference = Reference(model) if args.objective == "dpo" else None
    progress = resume(args.out, model, optimizer)
    if progress is None and seeded is not None:
        progress = Progress.from_dict(seeded)
        log(f"resumed at step {progress.step} from the seed {args.init_adapter}")
    elif progress is None and args.init_adapter:
        log(f"starting from {args.init_adapter}")
    if progress is None:
        order = list(range(len(train_pairs)))
        rng.shuffle(order)
        progress = Progress(order=order)
    else:
        log(f"resumed at step {progress.step} from {args.out / 'checkpoint'}")
    log(
        f"{len(train_pairs)} training and {len(validation_pairs)} validation examples, "
        f"{dtype}, {args.device}, LoRA r={args.rank}, style {args.style}"
    )
    if validation_pairs and progress.step == 0 and not progress.validation:
        # The starting model's score first: what every later one is compared with.
        evaluate(model, validation_pairs, progress, args.device)
    model.train()
    while progress.step < args.steps:
        started = time.monotonic()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(progress.step, args.steps, args.lr, args.warmup)
        tokens, loss_sum = 0, 0.0
        chosen = next_examples(progress, args.batch)
        for loss, read in step_losses(model, args, train_pairs, chosen, rejected, reference):
            loss.backward()
            tokens, loss_sum = tokens + read, loss_sum + float(loss.detach())
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        progress.step += 1
        seconds = time.monotonic() - started
        progress.seconds += seconds
        left = (args.steps - progress.step) * progress.seconds / progress.step
        log(
            f"step {progress.step}/{args.steps} loss {loss_sum:.4f} "
            f"{seconds:.1f} s, {tokens / seconds:.0f} tok/s, {left / 60:.1f} min left"
        )
        if (fit := clock.steps_that_fit(progress.step)) < args.steps:
            log(f"{args.minutes} minutes fit {fit} steps: the run ends there")
            args.steps = fit
        if validation_pairs and progress.step % args.eval_every == 0:
            evaluate(model, validation_pairs, progress, args.device)
        pausing = session.over() and progress.step < args.steps
        if progress.step % args.save_every == 0 or progress.step == args.steps or pausing:
            save_checkpoint(args.out, model, optimizer, progress)
            if args.seed_out:
                save_seed(args.seed_out, model, progress, args)
        if pausing:
            log(f"the session's {args.session_minutes} minutes are up at step {progress.step}")
            return {"paused_at": progress.step, "steps": args.steps}
    return finish(args, model, progress)


def next_examples(progress: Progress, count: int) -> list[int]:
    """The next ``count`` examples of the run's order, going round it again at its end."""
    order, start = progress.order, progress.position
    progress.position += count
    return [order[(start + i) % len(order)] for i in range(count)]


def step_losses(
    model: Any,
    args: argparse.Namespace,
    pairs: list[TrainingPair],
    chosen: list[int],
    rejected: dict[int, TrainingPair],
    reference: Reference | None,
) -> Iterator[tuple[Any, int]]:
    """A step's loss in parts that add up to it, each with the tokens it read: by
    cross-entropy, the mean over the step's answer tokens (``answer_weight``), ``--micro``
    pairs a forward; by DPO, the mean over examples, one example's answers (the expected, the
    no-op) a forward."""
    if reference is None:
        weight = sum(answer_weight(pairs[index], args.change_weight) for index in chosen)
        for group in micro_batches([pairs[index] for index in chosen], args.micro):
            loss, read = answer_loss(
                model, group, args.device, args.change_weight, args.detach_prompt
            )
            yield loss / weight, read
        return
    for index in chosen:
        loss, read = preference_loss(
            model, reference, pairs[index], rejected.get(index), args.device, args.beta,
            args.sft_weight,
        )  # fmt: skip
        yield loss / len(chosen), read


def micro_batches(pairs: list[TrainingPair], size: int) -> list[list[TrainingPair]]:
    """``pairs`` in forwards of at most ``size``, each of like lengths: padded to its longest,
    a forward of sorted pairs pads little (one example a forward on a CPU pads nothing)."""
    ordered = sorted(pairs, key=lambda pair: len(pair.ids))
    return [ordered[start : start + size] for start in range(0, len(ordered), size)]


def evaluate(model: Any, pairs: list[TrainingPair], progress: Progress, device: str) -> None:
    held_out = validate(model, pairs, device)
    progress.validation.append((progress.step, held_out.loss))
    progress.validation_changed.append((progress.step, held_out.changed_loss))
    edit, quiet = held_out.first_token_edit, held_out.first_token_no_change
    progress.validation_first_token.append((progress.step, edit, quiet))
    log(
        f"step {progress.step} validation loss {held_out.loss:.4f}, on changed tokens "
        f"{held_out.changed_loss:.4f}; first answer token P: edits {_figure(edit)}, "
        f"no change {_figure(quiet)}"
    )


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def finish(args: argparse.Namespace, model: Any, progress: Progress) -> dict:
    """The adapter and its record in OUT."""
    model.save_pretrained(args.out / "adapter")
    record = run_record(args, asdict(progress))
    (args.out / TRAINING_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    log(f"adapter: {args.out / 'adapter'}")
    return record


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="training.mine's --out")
    parser.add_argument(
        "--out", type=Path, default=default_out(),
        help="checkpoints, the adapter and its record (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--style", default="chat_split", choices=PROMPT_STYLES)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=4, help="examples per optimizer step")
    parser.add_argument(
        "--micro", type=int, default=None,
        help="examples read in one forward (default: 1 on a CPU, where padding costs, 16 on a GPU)",
    )  # fmt: skip
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument(
        "--layers", type=int, default=0, help="adapt the last N decoder blocks only (0: all)"
    )
    parser.add_argument("--max-tokens", type=int, default=2048, help="longer examples skipped")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-examples", type=int, default=64)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument(
        "--no-change", type=float, default=0.2, help="at most this share of no-change examples"
    )
    parser.add_argument(
        "--min-support", type=float, default=0.0,
        help="train on the edits whose new text the prompt shows at least this share of "
        "(training.edits.context_support; 0: every edit)",
    )  # fmt: skip
    parser.add_argument(
        "--typing", type=float, default=0.0,
        help="this share of the edits again, caught halfway through typing their first new "
        "line (training.edits.typing_example)",
    )  # fmt: skip
    parser.add_argument(
        "--history-cursor", type=float, default=0.0,
        help="this share of the edits again, the cursor at the end of the newest diff's last "
        "added line (training.edits.history_cursor_example)",
    )  # fmt: skip
    parser.add_argument(
        "--change-weight", type=float, default=1.0,
        help="loss weight of answer tokens that write a change (the rest weigh 1)",
    )  # fmt: skip
    parser.add_argument(
        "--detach-prompt", action="store_true",
        help="read each prompt without a graph: the gradient goes through the answer's "
        "tokens only (losses.detached_losses), a backward over a few tokens, not thousands",
    )  # fmt: skip
    parser.add_argument(
        "--objective", default="sft", choices=["sft", "dpo"],
        help="sft: the expected answer's cross-entropy; dpo: the expected answer preferred to "
        "the no-op one, against the starting adapter (training.preference)",
    )  # fmt: skip
    parser.add_argument("--beta", type=float, default=0.1, help="DPO's beta")
    parser.add_argument(
        "--sft-weight", type=float, default=1.0, help="DPO: weight of the expected answer's loss"
    )
    parser.add_argument(
        "--init-adapter", type=Path,
        help="start from this adapter's weights (same rank, layers); a seed (--seed-out) "
        "also gives its run's settings, step and data order, to go on from there",
    )  # fmt: skip
    parser.add_argument(
        "--minutes", type=float, default=None,
        help="end by then: the steps are cut to what fits at the pace measured so far",
    )  # fmt: skip
    parser.add_argument(
        "--session-minutes", type=float, default=None,
        help="stop after this long, checkpoint (and seed) saved, the schedule unchanged: the "
        "same command goes on from there (unlike --minutes, which ends the run by then)",
    )  # fmt: skip
    parser.add_argument(
        "--seed-out", type=Path, default=None,
        help="at every checkpoint also write this folder: the adapter (bf16) and the run's "
        "settings and progress, small enough to commit; --init-adapter it to go on from there "
        "on another machine (training.seed)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--encode-only", action="store_true",
        help="write OUT/pairs.pt and stop: a GPU machine then needs only it and the manifest",
    )  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.micro is None:
        args.micro = 16 if args.device.startswith("cuda") else 1
    return args


def main(argv: list[str] | None = None) -> None:
    print(json.dumps(run(parse_args(argv))))


if __name__ == "__main__":
    main()
