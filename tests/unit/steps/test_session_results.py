"""dump, watch and profile sessions hand their result the same way: ``session.result`` (an
attribute, also after a ``with`` block) is what ``stop()`` returns."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
from loop_orders import run  # noqa: E402

import opscope  # noqa: E402
from opscope.storage.reader import Dump  # noqa: E402
from opscope.watch.events import WatchResult  # noqa: E402


def test_dump_result_is_the_finished_dump(tmp_path) -> None:
    session = opscope.dump(tmp_path / "d", level="module")
    assert session.result is None
    with session as d:
        run("zero_grad_last", d, 2)
        assert d.result is None  # still running
    assert isinstance(session.result, Dump) and session.result.steps() == [0, 1]
    assert session.result is session.result  # loaded once


def test_dump_stop_returns_the_same_result(tmp_path) -> None:
    d = opscope.dump(tmp_path / "d", level="module").start()
    run("zero_grad_last", d, 2)
    assert d.stop() is d.result


def test_watch_result_is_an_attribute_that_is_false_when_a_nan_was_found(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the flight recorder writes opscope-overflow/ here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with opscope.watch() as w:
            run("zero_grad_last", w, 2)
        assert isinstance(w.result, WatchResult) and bool(w.result)
        with opscope.watch(action="record") as bad:
            torch.log(-torch.ones(2, requires_grad=True)).sum().backward()
    assert not bad.result and bad.result.events


def test_watch_result_call_still_works_with_a_deprecation_warning(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with opscope.watch() as w:
            run("zero_grad_last", w, 1)
    with pytest.warns(DeprecationWarning, match="attribute"):
        old = w.result()
    assert old.events == w.result.events


def test_profile_result_is_what_stop_returns(tmp_path) -> None:
    p = opscope.profile(tmp_path / "p").start()
    assert p.result is None
    run("zero_grad_last", p, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert p.stop() is p.result and bool(p.result)
