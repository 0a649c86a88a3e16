"""``PassLayout``: where each token of a runner pass goes, for the three kinds of pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class PassLayout:
    """What a pass feeds and where it goes: flattened token ids ``tokens`` ``[N]``; row ``b`` is
    slot ``slot0 + b`` (or ``read_slots[b]``); token ``i`` is query ``step_of[i]`` of row
    ``row_of[i]``, stored at (slot ``slot_of[i]``: its row's, except ``static_decode``'s padding
    rows, which write the spare; column ``columns[i]``), rotated as ``positions[i]`` (its
    column, except in a tree, where siblings share a position). ``mask`` ``[rows, 1, span,
    width]``: True where a query may attend."""

    tokens: torch.Tensor
    slot0: int
    row_of: torch.Tensor
    step_of: torch.Tensor
    slot_of: torch.Tensor
    columns: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    decode: bool  # few queries per row: attention as two matmuls (``small_attention``)
    # A CPU prompt chunk (one row, not a tree): its start, for ``aligned_prefill_attention``.
    prefill_start: int | None = None
    # Row ``b``'s slot where rows are not slots ``slot0..`` in order (several requests' chunks).
    read_slots: torch.Tensor | None = None
    # Prompt chunks off the CPU: row ``b``'s (start, length), for ``causal_prompt_attention``.
    prompt_rows: list[tuple[int, int]] | None = None
    # CPU decode steps: row ``b``'s query ``j`` reads exactly columns ``< query_ends[b][j]``
    # (``exact_attention``); None: attention over the padded mask.
    query_ends: list[list[int]] | None = None

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def span(self) -> int:
        return self.mask.shape[2]

    @property
    def padded(self) -> bool:
        """Rows of different lengths: queries are scattered into a padded block."""
        return self.tokens.numel() != self.rows * self.span

    @classmethod
    def ragged(
        cls,
        slot0: int,
        tokens: Sequence[Sequence[int]],
        starts: Sequence[int],
        decode: bool,
        device: torch.device,
        slots: Sequence[int] | None = None,
    ) -> PassLayout:
        """``Qwen2Runner.forward``'s layout: row ``b`` feeds ``tokens[b]`` at positions
        ``starts[b]..`` of slot ``slot0 + b``, or of ``slots[b]``."""
        lengths = [len(t) for t in tokens]
        rows = len(tokens)
        width = max(s + n for s, n in zip(starts, lengths, strict=True))
        span = max(lengths)
        # output_size: no device-to-host read of the total (a sync on a GPU)
        row_of = torch.repeat_interleave(
            torch.arange(rows, device=device),
            torch.tensor(lengths, device=device),
            output_size=sum(lengths),
        )
        step_of = (
            torch.cat([torch.arange(n, device=device) for n in lengths])
            if rows > 1
            else torch.arange(span, device=device)
        )
        first = torch.tensor(starts, device=device)
        positions = first[row_of] + step_of
        # Query j of row b sees columns <= starts[b] + j (causal, and never past the row's end).
        ends = first.view(rows, 1, 1, 1) + torch.arange(span, device=device).view(1, 1, span, 1)
        flat = [t for row in tokens for t in row]
        read_slots = None if slots is None else torch.tensor(slots, device=device)
        return cls(
            tokens=torch.tensor(flat, dtype=torch.long, device=device),
            slot0=slot0,
            row_of=row_of,
            step_of=step_of,
            slot_of=slot0 + row_of if read_slots is None else read_slots[row_of],
            columns=positions,
            positions=positions,
            mask=torch.arange(width, device=device).view(1, 1, 1, width) <= ends,
            decode=decode,
            # Off the CPU one attention call per chunk: the aligned blocks are for the CPU
            # kernels' bits, and on a GPU each block is a launch per layer (slow prompts).
            prefill_start=None if decode or rows > 1 or device.type != "cpu" else starts[0],
            read_slots=read_slots,
            prompt_rows=(
                list(zip(starts, lengths, strict=True))
                if not decode and device.type != "cpu"
                else None
            ),
            query_ends=(
                [[s + j + 1 for j in range(n)] for s, n in zip(starts, lengths, strict=True)]
                if decode and device.type == "cpu"
                else None
            ),
        )

    @classmethod
    def static_decode(
        cls,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        span: int,
        width: int,
    ) -> PassLayout:
        """``Qwen2Runner.static_decode``'s layout (see there), built from tensors only (no host
        values) so a CUDA graph can capture it; ``width``: the columns attended over."""
        rows = tokens.shape[0] // span
        device = tokens.device
        columns = torch.arange(width, device=device).view(1, 1, 1, width)
        return cls(
            tokens=tokens,
            slot0=0,
            row_of=torch.arange(rows * span, device=device) // span,
            step_of=torch.arange(rows * span, device=device) % span,
            slot_of=slots,
            columns=positions,
            positions=positions,
            mask=columns <= positions.view(rows, 1, span, 1),
            decode=True,
        )

    @classmethod
    def tree(
        cls,
        slot: int,
        start: int,
        tokens: Sequence[int],
        positions: torch.Tensor,
        mask: torch.Tensor,
        device: torch.device,
    ) -> PassLayout:
        """``Qwen2Runner.forward_tree``'s layout: one row of ``tokens`` at columns
        ``start..`` of ``slot``, rotated as ``positions``, attending where ``mask``."""
        n = len(tokens)
        step_of = torch.arange(n, device=device)
        row_of = torch.zeros(n, dtype=torch.long, device=device)
        return cls(
            tokens=torch.tensor(tokens, dtype=torch.long, device=device),
            slot0=slot,
            row_of=row_of,
            step_of=step_of,
            slot_of=slot + row_of,
            columns=start + step_of,
            positions=positions.to(device),  # the caller's (a CPU tree); no copy on CPU
            mask=mask.reshape(1, 1, n, start + n).to(device),
            decode=False,
        )
