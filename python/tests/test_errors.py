"""errors: one class per tag of src/model/error.rs, and translate()."""

from __future__ import annotations

import re
from pathlib import Path

import capnp  # type: ignore[import-untyped]
import pytest

import capexec
from capexec import errors

REPO = Path(__file__).resolve().parents[2]


def rust_tags() -> list[tuple[str, str]]:
    """(variant, code) of every RefusalKind, read from the Rust source."""
    source = (REPO / "src" / "model" / "error.rs").read_text()
    block = source.split("refusal_kinds! {", 1)[1].split("\n}", 1)[0]
    return re.findall(r"^\s*(\w+) = \"([a-z-]+)\",", block, re.M)


def test_every_rust_tag_has_its_class() -> None:
    tags = rust_tags()
    assert len(tags) == 26
    assert [code for _, code in tags] == list(errors.REFUSALS)
    for variant, code in tags:
        cls = getattr(errors, variant)
        assert cls.TAG == code
        assert issubclass(cls, capexec.CapexecError)
        assert errors.REFUSALS[code] is cls


@pytest.mark.parametrize(("variant", "code"), rust_tags())
def test_translate_picks_the_class_of_the_tag(variant: str, code: str) -> None:
    raw = capnp.KjException(
        f"remote exception: remote exception: no such thing \"x\" [capexec:{code}]"
    )
    translated = errors.translate(raw)
    assert type(translated) is getattr(errors, variant)
    assert isinstance(translated, errors.RefusalError)
    assert translated.tag == code
    assert translated.sentence == 'no such thing "x"'
    assert str(translated) == 'no such thing "x"'
    assert translated.__cause__ is raw


def test_untagged_errors_by_kind() -> None:
    plain = errors.translate(capnp.KjException("remote exception: boom"))
    assert type(plain) is errors.RemoteError
    assert (plain.tag, plain.sentence) == ("failed", "boom")
    other = ValueError("x")
    assert errors.translate(other) is other
