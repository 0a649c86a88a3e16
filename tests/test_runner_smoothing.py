"""Smoothing int8's inputs (``runner/smoothing.py``): the product is the same matrix product,
rows with outlier channels lose less to int8's per-row rounding, and the runner measures,
saves and reuses its factors with its int8 weights.
"""

from __future__ import annotations

import torch

from serve_app.runner.builder import build_runner
from serve_app.runner.smoothing import calibration_ids, input_peaks, smoothing
from serve_app.runner.weights import Linear, int8_values, prepack_int8, quantize_int8


def _rows_with_outliers(generator: torch.Generator) -> torch.Tensor:
    """Activations as Qwen's linears see them: a few channels ~40x the rest in every row."""
    x = torch.randn(8, 128, generator=generator)
    x[:, [5, 70]] *= 40
    return x


def test_smoothing_cuts_the_error_of_rows_with_outlier_channels() -> None:
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(96, 128, generator=generator) * 0.05
    x = _rows_with_outliers(generator)
    expected = x @ weight.t()
    plain = Linear([(weight, None)], int8=quantize_int8(weight))(x, True)
    s = smoothing(x.abs().amax(0), weight)
    smoothed = Linear([(weight, None)], int8=prepack_int8(*int8_values(weight * s)), smooth=1 / s)(
        x, True
    )
    error = (plain - expected).norm() / expected.norm()
    smoothed_error = (smoothed - expected).norm() / expected.norm()
    assert smoothed_error < error / 2, (float(smoothed_error), float(error))
    # the rows with their outliers in the product are still the dense product's
    assert smoothed_error < 0.02


def test_peaks_cover_every_linear_of_the_model(loaded) -> None:
    peaks = input_peaks(loaded.model, calibration_ids(loaded.tokenizer))
    layers = len(loaded.model.model.layers)
    names = {
        f"layers.{i}.{part}" for i in range(layers) for part in ("qkv", "o", "gate_up", "down")
    }
    assert set(peaks) == names | {"lm_head"}
    hidden = loaded.model.config.hidden_size
    assert peaks["layers.0.qkv"].shape == (hidden,) and bool((peaks["lm_head"] > 0).all())


def test_the_runner_smooths_int8_once_and_reads_the_factors_back(loaded, tmp_path) -> None:
    """With calibration ids the int8 file holds each linear's factors; a second replica
    reads them and computes the same numbers, close to the dense linear's. A runner built
    without calibration keeps its unsmoothed values in a file of its own, so neither ever
    reads the other's."""
    ids = calibration_ids(loaded.tokenizer)
    fbgemm = {"weights": "int8", "cache_dir": tmp_path, "int8_kernel": "fbgemm"}
    first = build_runner(loaded.model, **fbgemm, calibration=ids)
    saved = torch.load(next(tmp_path.glob("runner-int8-v3-*.pt")), weights_only=True)
    assert "layers.0.down.smooth" in saved and "lm_head.smooth" in saved
    plain = build_runner(loaded.model, **fbgemm)
    assert plain.lm_head.smooth is None
    assert len(list(tmp_path.glob("runner-int8-raw-v3-*.pt"))) == 1
    second = build_runner(loaded.model, **fbgemm, calibration=ids)
    assert len(list(tmp_path.glob("runner-int8-v3-*.pt"))) == 1
    x = torch.randn(3, loaded.model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    for a, b in ((first.layers[0].qkv, second.layers[0].qkv), (first.lm_head, second.lm_head)):
        assert a.smooth is not None and torch.equal(a.smooth, b.smooth)
        assert torch.equal(a(x, True), b(x, True))
        dense = a(x, False)
        assert (a(x, True) - dense).norm() < dense.norm() * 0.05
