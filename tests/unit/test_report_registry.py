"""The renderer registry: one place to find every renderer, duplicates refused."""

from __future__ import annotations

import pytest

from opscope import report
from opscope.watch.events import OverflowEvent


def test_render_finds_the_renderer_by_the_result_class():
    event = OverflowEvent(kind="nan", op="aten.div.Tensor", module="norm", phase="forward", step=3, rank=0)
    text = report.render(event, "text")
    assert text.splitlines()[0].startswith("opscope.watch: NaN in aten.div.Tensor")


def test_a_second_renderer_for_the_same_result_and_format_is_refused():
    first = report.renderer("OverflowEvent", "text")
    with pytest.raises(ValueError, match="registered already"):
        report.register_renderer("OverflowEvent", "text")(lambda event: "")
    assert report.renderer("OverflowEvent", "text") is first


def test_an_unknown_format_names_the_known_ones():
    with pytest.raises(KeyError, match="formats: html, text"):
        report.renderer("CompareResult", "pdf")
    with pytest.raises(KeyError, match="no renderer for int"):
        report.render(3)
