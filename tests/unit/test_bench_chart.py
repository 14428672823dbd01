"""The benchmark's chart draws every panel with every series filled in (a panel with more series than the chart
had shades for — the latency panel's five, the many-clients panel's four — ended the run with an IndexError
after all of its measurements, and nothing was written)."""

from __future__ import annotations

import pytest

from pigeon.bench import report


def test_a_chart_of_every_panel_with_every_series(tmp_path):
    pytest.importorskip("matplotlib")  # the chart needs the bench extra; without it chart() draws nothing
    results: dict = {}
    for _, _, _, _, series in report.PANELS:
        for i, (_, key, field) in enumerate(series):
            results.setdefault(key, {})[field] = 1.0 + i
    doc = {"machine": {"cores": 2, "mem_gib": 24}, "when": "2026-11-26T00:00:00+00:00", "plan": "full",
           "targets": {t: {"results": results} for t in ("pigeon", "peer")}}
    assert max(len(p[4]) for p in report.PANELS) > 3  # the case that failed
    path = tmp_path / "chart.png"
    assert report.chart(doc, str(path))
    assert path.stat().st_size > 10_000
