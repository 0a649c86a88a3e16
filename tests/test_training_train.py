"""The next-edit trainer on the tiny model: the loss reads only the answer, a run resumes from
its checkpoint, and the adapter is written with its record."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from serve_app.prompts.next_edit import CURSOR
from training import mix, train
from training.edits import EditExample, context_support
from training.render import IGNORED, training_pair

pytest.importorskip("peft")

FILE = "def subtotal(items):\n    return sum(i.price for i in items)\n\n\nprint(total(cart))\n"
RENAME = (
    "@@ -1,2 +1,2 @@\n-def total(items):\n+def subtotal(items):\n"
    "     return sum(i.price for i in items)"
)


def example(path: str, expected: str = "\nprint(subtotal(cart))") -> EditExample:
    return EditExample(
        repo="tests/cart", commit="0" * 40, path=path, language="python", file=FILE,
        first_line=3, last_line=4, cursor=(4, 6), expected=expected, hunks=[RENAME], snippets=[],
    )  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("next_edit")
    train_rows = [example(f"cart{i}.py") for i in range(3)]
    (folder / "train.jsonl").write_text("".join(json.dumps(asdict(e)) + "\n" for e in train_rows))
    held_out = json.dumps(asdict(example("shop.py"))) + "\n"
    (folder / "validation.jsonl").write_text(held_out)
    repositories = {
        "shop/cart": {"split": "train", "licence": "MIT", "head": "a" * 40},
        "shop/store": {"split": "validation", "licence": "Apache-2.0", "head": "b" * 40},
    }
    manifest = {"version": "v-test", "repositories": repositories}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_only_the_answer_carries_labels(tiny_source: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_source.removeprefix("tiny:"))
    pair = training_pair(example("cart.py"), "\nprint(subtotal(cart))", tokenizer, "chat_split")
    ids, labels = pair.ids, pair.labels
    answer = [label for label in labels if label != IGNORED]
    assert len(ids) == len(labels) and labels[: len(ids) - len(answer)] == [IGNORED] * (
        len(ids) - len(answer)
    )
    assert answer == ids[-len(answer) :] and answer[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(answer[:-1]) == "```\n\nprint(subtotal(cart))\n```"


def test_a_span_example_is_trained_on_the_changed_lines_alone(tiny_source: str) -> None:
    """chat_span's answer names the region's changed line and writes only its new text; the
    region is shown from two lines above the cursor's line (one line of the file more here),
    the cursor at the start of its line's code, as serving shows it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_source.removeprefix("tiny:"))
    pair = training_pair(example("cart.py"), "\nprint(subtotal(cart))", tokenizer, "chat_span")
    ids, labels = pair.ids, pair.labels
    answer = [label for label in labels if label != IGNORED]
    assert all(pair.changed[len(ids) - len(answer) : -1])  # a span is all change
    assert tokenizer.decode(answer[:-1]) == "@@ 3,1\nprint(subtotal(cart))"
    assert f"3|{CURSOR}print(total(cart))" in tokenizer.decode(ids[: len(ids) - len(answer)])


def test_a_span_example_whose_edit_the_prompt_does_not_show_is_left_out(tiny_source: str) -> None:
    """chat_span shows the region to two lines below the cursor's: an edit of a line further
    down cannot be written there, so the example is left out; the whole-region layout keeps
    it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_source.removeprefix("tiny:"))
    lines = [f"x{i} = {i}" for i in range(8)]
    far = EditExample(
        repo="tests/far", commit="0" * 40, path="far.py", language="python",
        file="\n".join(lines) + "\n", first_line=0, last_line=7, cursor=(0, 0),
        expected="\n".join(lines).replace("x6 = 6", "x6 = 60"), hunks=[], snippets=[],
    )  # fmt: skip
    assert training_pair(far, far.expected, tokenizer, "chat_span") is None
    assert training_pair(far, far.expected, tokenizer, "chat_split") is not None
    near = far.expected.replace("x6 = 60", "x6 = 6").replace("x1 = 1", "x1 = 10")
    assert training_pair(far, near, tokenizer, "chat_span") is not None
    assert mix.encode_all([far], tokenizer, "chat_span", 4096) == []


def test_the_tokens_that_write_the_change_are_marked_and_only_they(tiny_source: str) -> None:
    """The region is two lines; the edit rewrites the second. The tokens writing the new
    line are marked, the fence, the kept blank line and the end of the turn are not."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_source.removeprefix("tiny:"))
    pair = training_pair(example("cart.py"), "\nprint(subtotal(cart))", tokenizer, "chat_split")
    start = next(i for i, label in enumerate(pair.labels) if label != IGNORED)
    answer, changed = pair.labels[start:], pair.changed[start:]
    written = tokenizer.decode([t for t, c in zip(answer, changed, strict=True) if c])
    assert "subtotal(cart))" in written and "```" not in written
    assert not changed[0] and not changed[-1]
    unchanged = training_pair(example("cart.py"), "\nprint(total(cart))", tokenizer, "chat_split")
    assert not any(unchanged.changed)


@pytest.mark.parametrize("style", ["sweep", "zeta"])
def test_a_plain_answer_marks_only_the_changed_line(tiny_source: str, style: str) -> None:
    """In the plain layouts the region is written out without a fence: the new line's tokens
    are marked, not the kept one's, zeta's end marker or the end of the turn."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_source.removeprefix("tiny:"))
    expected = "\nprint(total(cart))\nprint(subtotal(cart))"  # a line added after the kept one
    pair = training_pair(example("cart.py"), expected, tokenizer, style)
    start = next(i for i, label in enumerate(pair.labels) if label != IGNORED)
    answer, changed = pair.labels[start:], pair.changed[start:]
    assert tokenizer.decode(answer[:-1]).startswith(expected.strip("\n"))
    written = tokenizer.decode([t for t, c in zip(answer, changed, strict=True) if c])
    assert "subtotal(cart))" in written and "editable" not in written
    assert not changed[0] and not changed[-1]


def test_a_deleted_line_marks_the_token_where_a_copy_would_write_it(tiny_source: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_source.removeprefix("tiny:"))
    pair = training_pair(example("cart.py"), "print(total(cart))", tokenizer, "chat_split")
    start = next(i for i, label in enumerate(pair.labels) if label != IGNORED)
    marked = [t for t, c in zip(pair.labels[start:], pair.changed[start:], strict=True) if c]
    assert len(marked) == 1 and "print".startswith(tokenizer.decode(marked).strip())


def test_a_run_can_start_from_an_adapter_and_weighs_changed_tokens(
    tiny_source: str, data: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    common = ["--data", str(data), "--model", tiny_source, "--batch", "1", "--layers", "1",
              "--eval-every", "1"]  # fmt: skip
    train.main([*common, "--out", str(tmp_path / "first"), "--steps", "1", "--lr", "0.5"])
    first = tmp_path / "first" / "adapter"
    train.main([*common, "--out", str(tmp_path / "second"), "--steps", "1", "--lr", "1e-9",
                "--init-adapter", str(first), "--change-weight", "5"])  # fmt: skip
    record = json.loads((tmp_path / "second" / "training.json").read_text())
    assert record["change_weight"] == 5 and record["init_adapter"] == str(first)
    assert record["init_record"]["steps"] == 1 and record["init_record"]["lr"] == 0.5
    assert [s for s, _ in record["validation_loss_changed_tokens"]] == [0, 1]
    before = load_file(str(first / "adapter_model.safetensors"))
    after = load_file(str(tmp_path / "second" / "adapter" / "adapter_model.safetensors"))
    assert before.keys() == after.keys()
    assert all(float((before[k] - after[k]).abs().max()) < 1e-3 for k in before)


def test_a_run_resumes_from_its_checkpoint_and_records_the_adapter(
    tiny_source: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--data", str(data), "--out", str(tmp_path), "--model", tiny_source, "--batch", "2",
              "--save-every", "1", "--eval-every", "2", "--warmup", "1"]  # fmt: skip
    train.main([*common, "--steps", "2"])
    first = json.loads((tmp_path / "training.json").read_text())
    assert first["steps"] == 2 and first["data_version"] == "v-test" and first["seed"] == 0
    assert first["repositories"] == {"train": ["shop/cart"], "validation": ["shop/store"]}
    assert first["provenance"]["shop/store"] == {"licence": "Apache-2.0", "commit": "b" * 40}
    assert [step for step, _ in first["validation_loss"]] == [0, 2]  # the base model first
    assert [(step, quiet) for step, _, quiet in first["validation_first_token"]] == [
        (0, None),
        (2, None),
    ]  # one held-out example, an edit
    train.main([*common, "--steps", "3"])
    err = capsys.readouterr().err
    assert "resumed at step 2" in err and "step 3/3" in err and "step 1/3" not in err
    record = json.loads((tmp_path / "training.json").read_text())
    assert record["steps"] == 3
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    assert not (tmp_path / "checkpoint.partial").exists()


def test_a_seed_goes_on_where_the_run_paused_on_another_machine(
    tiny_source: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--session-minutes pauses a run, its schedule unchanged, with its seed (--seed-out)
    written; a new OUT (another machine: no checkpoint) given the seed goes on from the step it
    reached, on the seed's settings, and ends as the whole run would."""
    seed = tmp_path / "seed"
    common = ["--data", str(data), "--model", tiny_source, "--eval-every", "100"]
    train.main([*common, "--out", str(tmp_path / "a"), "--steps", "4", "--batch", "1",
                "--rank", "4", "--seed-out", str(seed), "--session-minutes", "1e-9"])  # fmt: skip
    saved = json.loads((seed / "seed.json").read_text())
    assert saved["progress"]["step"] == 1 and saved["data_version"] == "v-test"
    assert saved["settings"]["steps"] == 4 and saved["settings"]["rank"] == 4
    assert (seed / "adapter_model.safetensors").exists() and (seed / "training.json").exists()
    assert not (tmp_path / "a" / "adapter").exists()  # paused, not finished
    capsys.readouterr()
    train.main([*common, "--out", str(tmp_path / "b"), "--init-adapter", str(seed)])
    err = capsys.readouterr().err
    assert "resumed at step 1 from the seed" in err and "step 2/4" in err and "step 1/" not in err
    record = json.loads((tmp_path / "b" / "training.json").read_text())
    assert record["steps"] == 4 and record["rank"] == 4 and record["batch"] == 1
    # The same run went on: it started from no adapter, not from its own seed (whose record,
    # nested in every save of a run going on from it, grew without end).
    assert record["init_adapter"] is None and record["init_record"] is None


def test_a_seed_refuses_data_of_another_version(
    tiny_source: str, data: Path, tmp_path: Path
) -> None:
    seed = tmp_path / "seed"
    train.main(["--data", str(data), "--model", tiny_source, "--out", str(tmp_path / "a"),
                "--steps", "1", "--batch", "1", "--seed-out", str(seed)])  # fmt: skip
    other = tmp_path / "other"
    shutil.copytree(data, other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps(manifest | {"version": "v-other"}))
    with pytest.raises(SystemExit, match="data version v-test"):
        train.main(["--data", str(other), "--model", tiny_source, "--out", str(tmp_path / "b"),
                    "--init-adapter", str(seed)])  # fmt: skip


def test_the_levers_time_each_recipe_on_the_same_examples(
    tiny_source: str, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from training import levers

    levers.main(["--data", str(data), "--steps", "1", "--batch", "1", "--model", tiny_source])
    table = capsys.readouterr().out
    assert table.startswith("CPU:") and "| r 16, all blocks, full gradient |" in table
    assert table.count("x |") == len(levers.LEVERS) and "| 1.00x |" in table


def test_a_run_given_minutes_ends_by_then_with_its_adapter(
    tiny_source: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deadline far shorter than the asked steps take: the steps are cut to what fits, and
    the run still ends as a finished one (adapter, record, checkpoint at its last step)."""
    args = ["--data", str(data), "--out", str(tmp_path), "--model", tiny_source, "--batch", "1"]
    train.main([*args, "--steps", "40", "--eval-every", "100", "--minutes", "1e-5"])
    record = json.loads((tmp_path / "training.json").read_text())
    assert record["steps"] < 40
    assert f"fit {record['steps']} steps" in capsys.readouterr().err
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    import torch

    state = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)
    assert state["progress"]["step"] == record["steps"]


def test_pairs_read_in_one_padded_forward_lose_what_they_lose_alone(tiny_source: str) -> None:
    """A GPU step reads several pairs in one forward, padded on the right: each pair's loss
    is the one it has read alone, however long the others are."""
    import torch

    from training.losses import answer_loss

    model = train.with_lora(train.load_base(tiny_source, "cpu", torch.float32), 4, 0)
    tokenizer = train.load_tokenizer(tiny_source)
    short = training_pair(example("cart.py"), "\nprint(subtotal(cart))", tokenizer, "chat_split")
    long = training_pair(example("c.py"), "\nprint(subtotal(cart))\n" * 6, tokenizer, "chat_split")
    assert len(long.ids) > len(short.ids) + 20
    model.eval()
    with torch.no_grad():
        alone = [float(answer_loss(model, [pair], "cpu", 3.0)[0]) for pair in (short, long)]
        together, read = answer_loss(model, [short, long], "cpu", 3.0)
    assert float(together) == pytest.approx(sum(alone), rel=1e-4)
    assert read == len(short.ids) + len(long.ids)


def test_a_step_weighs_every_answer_token_alike(tiny_source: str) -> None:
    """A step's loss is the mean over its answer tokens: the one token of a "no change"
    answer (end of turn first) counts as one of an edit's, not as a whole example. Weighed
    per example, adapters learned to end the turn first where edits were due."""
    import torch

    from training.losses import token_losses

    model = train.with_lora(train.load_base(tiny_source, "cpu", torch.float32), 4, 0)
    tokenizer = train.load_tokenizer(tiny_source)
    keep = training_pair(example("cart.py", "\nprint(total(cart))"), "\nprint(total(cart))",
                         tokenizer, "chat_span")  # fmt: skip
    edit = training_pair(example("c.py"), "\nprint(subtotal(cart))", tokenizer, "chat_span")
    assert sum(label != IGNORED for label in keep.labels) == 1
    assert sum(label != IGNORED for label in edit.labels) > 3
    args = train.parse_args(["--data", "unused", "--change-weight", "1", "--micro", "1"])
    model.eval()
    with torch.no_grad():
        step = sum(
            float(loss)
            for loss, _ in train.step_losses(model, args, [keep, edit], [0, 1], {}, None)
        )
        every, _, rows = token_losses(model, [keep, edit], "cpu")
    assert step == pytest.approx(float(every.mean()), rel=1e-4)
    per_example = (float(every[rows == 0].mean()) + float(every[rows == 1].mean())) / 2
    assert step != pytest.approx(per_example, rel=1e-3)


def test_validation_reads_the_first_answer_tokens_decision_for_edits_and_no_change(
    tiny_source: str,
) -> None:
    """The held-out figures include the probability the adapter gives each answer's first
    token (in ``chat_span``: ``@@`` to edit, the end of the turn for no change), by kind:
    the figure that shows an adapter answering "no change" where edits were due."""
    import torch

    model = train.with_lora(train.load_base(tiny_source, "cpu", torch.float32), 4, 0)
    tokenizer = train.load_tokenizer(tiny_source)
    keep = training_pair(example("cart.py", "\nprint(total(cart))"), "\nprint(total(cart))",
                         tokenizer, "chat_span")  # fmt: skip
    edit = training_pair(example("c.py"), "\nprint(subtotal(cart))", tokenizer, "chat_span")
    model.eval()
    with torch.no_grad():
        expected = []
        for pair in (edit, keep):
            start = next(i for i, label in enumerate(pair.labels) if label != IGNORED)
            logits = model(torch.tensor([pair.ids[:start]])).logits[0, -1].float()
            expected.append(float(logits.softmax(-1)[pair.labels[start]]))
    held_out = train.validate(model, [keep, edit, keep], "cpu")
    assert held_out.first_token_edit == pytest.approx(expected[0], rel=1e-3)
    assert held_out.first_token_no_change == pytest.approx(expected[1], rel=1e-3)
    assert train.validate(model, [edit], "cpu").first_token_no_change is None


def test_a_detached_prompt_loses_the_same_and_trains_through_the_answer(tiny_source: str) -> None:
    """--detach-prompt: the same losses as the whole forward, and a gradient that reaches
    the adapter (through the answer's positions alone)."""
    import torch

    from training.losses import answer_loss

    model = train.with_lora(train.load_base(tiny_source, "cpu", torch.float32), 4, 0)
    tokenizer = train.load_tokenizer(tiny_source)
    pairs = [
        training_pair(example("cart.py"), "\nprint(subtotal(cart))", tokenizer, "chat_split"),
        training_pair(example("c.py"), "\nprint(subtotal(cart))\n" * 3, tokenizer, "chat_split"),
    ]
    whole, read = answer_loss(model, pairs, "cpu", 3.0)
    detached, read_detached = answer_loss(model, pairs, "cpu", 3.0, detach_prompt=True)
    assert float(detached) == pytest.approx(float(whole), rel=1e-4) and read == read_detached
    detached.backward()
    grads = [p.grad for name, p in model.named_parameters() if "lora_" in name]
    assert grads and any(g is not None and float(g.abs().sum()) > 0 for g in grads)


def test_encoded_pairs_train_where_only_the_manifest_is(
    tiny_source: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--encode-only writes OUT/pairs.pt; a run given a folder with the manifest alone (a GPU
    machine's copy) trains on those pairs, and pairs made for another run are not reused."""
    out = tmp_path / "run"
    common = ["--out", str(out), "--model", tiny_source, "--batch", "2", "--micro", "2",
              "--eval-every", "1"]  # fmt: skip
    train.main(["--data", str(data), *common, "--encode-only"])
    assert (out / "pairs.pt").exists() and not (out / "adapter").exists()
    manifest_only = tmp_path / "manifest_only"
    manifest_only.mkdir()
    (manifest_only / "manifest.json").write_text((data / "manifest.json").read_text())
    train.main(["--data", str(manifest_only), *common, "--steps", "1"])
    record = json.loads((out / "training.json").read_text())
    assert record["steps"] == 1 and record["data_version"] == "v-test"
    capsys.readouterr()
    with pytest.raises(FileNotFoundError, match="train.jsonl"):  # another style: not these pairs
        train.main(["--data", str(manifest_only), *common, "--steps", "2", "--style", "chat_span"])
    assert "encoded for another run: encoding again" in capsys.readouterr().err


def test_dpo_starts_level_and_learns_to_prefer_the_edit_to_the_no_op(
    tiny_source: str, data: Path, tmp_path: Path
) -> None:
    """Against the starting model the margin is nil (the loss is log 2); a few DPO steps make
    the expected edit likelier than keeping the region, next to what the start thought."""
    import math

    import torch

    from training.losses import sequence_log_probs, token_losses
    from training.preference import Reference, preference_loss, preference_pairs

    tokenizer = train.load_tokenizer(tiny_source)
    (chosen, *_), rejected = preference_pairs([example("cart.py")], tokenizer, "chat_split", 4096)
    assert tokenizer.decode([t for t in rejected[0].labels if t >= 0]).count("print(total(")
    model = train.with_lora(train.load_base(tiny_source, "cpu", torch.float32), 4, 1)
    loss, _ = preference_loss(model, Reference(model), chosen, rejected[0], "cpu", 0.5, 0.0)
    assert float(loss) == pytest.approx(math.log(2), abs=1e-4)

    def margin(adapter: Path | None) -> float:
        model = train.with_lora(train.load_base(tiny_source, "cpu", torch.float32), 4, 1)
        if adapter:
            train.load_adapter_weights(model, adapter)
        model.eval()
        with torch.no_grad():
            losses, _, rows = token_losses(model, [chosen, rejected[0]], "cpu")
            chosen_lp, rejected_lp = sequence_log_probs(losses, rows, 2).tolist()
        return chosen_lp - rejected_lp

    out = tmp_path / "dpo"
    train.main(["--data", str(data), "--out", str(out), "--model", tiny_source, "--steps", "4",
                "--batch", "2", "--layers", "1", "--rank", "4", "--lr", "0.02", "--warmup", "1",
                "--objective", "dpo", "--beta", "0.5", "--sft-weight", "0"])  # fmt: skip
    assert json.loads((out / "training.json").read_text())["objective"] == "dpo"
    assert margin(out / "adapter") > margin(None) + 0.5


def test_the_mix_keeps_every_edit_and_caps_the_no_change_share() -> None:
    import random

    edits = [example(f"e{i}.py") for i in range(8)]
    quiet = [example(f"q{i}.py", expected=FILE) for i in range(10)]
    for item in quiet:
        item.kind = "no_change"
    mixed = mix.training_mix(edits + quiet, 0.2, 0.0, random.Random(0))
    assert [e for e in mixed if e.kind == "edit"] == edits
    assert sum(e.kind == "no_change" for e in mixed) == 2  # 2 of 10: a fifth


def test_the_mix_can_keep_only_edits_the_prompt_shows() -> None:
    """``--min-support``: carrying the history's rename on is shown by the prompt; a call
    with a name and arguments seen nowhere is not; a deletion writes nothing new."""
    import random

    carried = example("carried.py")
    invented = example("invented.py", expected="\nprint(apply_discount(cart, rate=0.1))")
    deleted = example("deleted.py", expected="")
    support = {e.path: context_support(e, e.expected) for e in (carried, invented, deleted)}
    assert support["carried.py"] >= 0.8 > 0.3 > support["invented.py"]
    assert support["deleted.py"] == 1.0
    mixed = mix.training_mix([carried, invented, deleted], 0.2, 0.8, random.Random(0))
    assert mixed == [carried, deleted]


def test_a_typing_example_is_the_edit_caught_halfway_through_its_first_new_line() -> None:
    """What an IDE sends at a pause in typing: the edit's first new line typed in part (the
    line it replaces gone), the cursor after it, the typing the newest diff; the answer is
    still the whole edit. A deletion has nothing to type."""
    from training.edits import typing_example

    edit = example("cart.py")
    for seed in range(20):
        typed = typing_example(edit, random.Random(seed))
        line = typed.file.split("\n")[typed.cursor[0]]
        assert typed.cursor == (4, len(line)) and 0 < len(line) < len("print(subtotal(cart))")
        assert "print(subtotal(cart))".startswith(line) and typed.expected == edit.expected
        assert typed.region == "\n" + line and typed.hunks[0] == RENAME
        assert "-print(total(cart))" in typed.hunks[-1] and f"+{line}" in typed.hunks[-1]
    assert typing_example(example("deleted.py", expected="\n"), random.Random(0)) is None
    mixed = mix.training_mix([edit], 0.0, 0.0, random.Random(0), typing=1.0)
    assert mixed[0] == edit and mixed[1].cursor[0] == 4 and len(mixed) == 2


def test_a_typing_example_is_cut_where_a_typist_pauses() -> None:
    """The typed part ends at a boundary between a word and what is not one."""
    from training.edits import pause_points, typing_example

    assert pause_points("print(subtotal(cart))", 0) == [5, 6, 14, 15, 19]
    assert pause_points("    abc", 4) == [5, 6]  # no boundary: anywhere in the word
    whole = "print(subtotal(cart))"
    for seed in range(20):
        typed = typing_example(example("cart.py"), random.Random(seed))
        line = typed.file.split("\n")[typed.cursor[0]]
        assert len(line) in (5, 6, 14, 15, 19) and whole.startswith(line)


def test_a_history_cursor_example_puts_the_cursor_where_the_last_edit_ended() -> None:
    """The cursor at the end of the newest diff's last added line, where that line is in the
    region; the answer stays the edit's. Outside the region: no such example."""
    from training.edits import history_cursor_example

    assert history_cursor_example(example("cart.py")) is None  # the renamed line is above it
    wide = dataclasses.replace(example("cart.py"), first_line=0)
    moved = history_cursor_example(wide)
    assert moved.cursor == (0, len("def subtotal(items):"))
    assert moved.expected == wide.expected and moved.file == wide.file
    mixed = mix.training_mix([wide], 0.0, 0.0, random.Random(0), history_cursor=1.0)
    assert mixed == [wide, moved]


def test_an_exported_adapter_serves_and_names_its_base(
    tiny_source: str, data: Path, tmp_path: Path
) -> None:
    """The trainer's adapter, exported (bf16, its base named), is what the engine loads for a
    request that names it; the same file on another base is refused, naming the file."""
    from safetensors.torch import load_file

    from serve_app.engine.engine import LLMEngine
    from serve_app.models.loader import AdapterError, load_model
    from tests.conftest import engine_config
    from tests.runner_support import encode, generate_all, greedy
    from training.export import export

    out = tmp_path / "run"
    train.main(["--data", str(data), "--out", str(out), "--model", tiny_source, "--steps", "1",
                "--batch", "1", "--layers", "1", "--lr", "0.5"])  # fmt: skip
    shipped = export(out, tmp_path / "shipped")
    config = json.loads((shipped / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == tiny_source
    assert {
        str(w.dtype) for w in load_file(str(shipped / "adapter_model.safetensors")).values()
    } == {"torch.bfloat16"}
    assert json.loads((shipped / "training.json").read_text())["layers"] == 1
    loaded = load_model(tiny_source)
    prompt = encode(loaded, "def subtotal(items):")
    texts, _ = generate_all(
        loaded, engine_config(), [greedy("a", prompt, 4, adapter="a")], adapters={"a": shipped}
    )
    assert len(texts) == 1
    config["base_model_name_or_path"] = "embedded:qwen2.5-coder-0.5b"
    (shipped / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match="built for embedded:qwen2.5-coder-0.5b") as raised:
        LLMEngine(loaded, engine_config(), adapters={"a": shipped})
    assert str(shipped) in str(raised.value)


def test_a_run_on_a_lent_gpu_comes_back_exported_in_pieces(
    tiny_source: str, data: Path, tmp_path: Path
) -> None:
    """What a GPU machine's call brings back is at most 16 MiB a file: a run's exported adapter
    goes as tar pieces, and here they are put together into the export, file for file."""
    from training import lease
    from training.export import export

    run = tmp_path / "run"
    train.main(["--data", str(data), "--out", str(run), "--model", tiny_source, "--steps", "1",
                "--batch", "1", "--layers", "1"])  # fmt: skip
    sent = lease.send_back(run, "span", tmp_path / "out", piece_bytes=4096)
    assert len(sent) > 1 and all(path.stat().st_size <= 4096 for path in sent)
    (tmp_path / "out" / "span.log").write_text("step 1/1\n")
    [adapter] = lease.unpack(tmp_path / "out", tmp_path / "adapters")
    expected = export(run, tmp_path / "expected")
    for path in expected.iterdir():
        assert (adapter / path.name).read_bytes() == path.read_bytes()
    assert (adapter / "train.log").read_text() == "step 1/1\n"


def test_an_adapter_asked_in_another_layout_than_it_learned_fails_at_start(
    tmp_path: Path,
) -> None:
    """Its training.json names the layout it learned; the model's edit_prompt must be it."""
    from serve_app.config import ModelConfig
    from serve_app.engine.startup import EDIT_ADAPTER, role_adapters
    from serve_app.runner.lora import AdapterError

    (tmp_path / "training.json").write_text(json.dumps({"style": "chat_span"}))
    model = ModelConfig(
        id="m", source="tiny:x", edit_adapter=str(tmp_path), edit_prompt="chat_span"
    )
    assert role_adapters(model, "edit") == {EDIT_ADAPTER: tmp_path}
    assert role_adapters(model, "fim") == {}
    asked_otherwise = model.model_copy(update={"edit_prompt": "chat_split"})
    with pytest.raises(AdapterError, match="set edit_prompt: chat_span") as raised:
        role_adapters(asked_otherwise, "edit")
    assert str(tmp_path) in str(raised.value)
