"""``python -m clickhouse_tx``: the commit modes it accepts are the ``Mode`` enum's, no other list."""

from __future__ import annotations

import pytest

from clickhouse_tx.admin.cli_args import build_parser
from clickhouse_tx.interfaces import Mode

GC = ["gc", "--url", "http://127.0.0.1:8123", "--table", "db.t", "--older-than", "60"]


@pytest.mark.parametrize("mode", list(Mode))
def test_recover_and_gc_accept_every_commit_mode_as_the_enum(mode: Mode) -> None:
    assert build_parser().parse_args([*GC, "--mode", mode.value]).mode is mode
    assert build_parser().parse_args(["recover", *GC[1:5], "--mode", mode.value]).mode is mode


def test_an_unknown_mode_is_refused_naming_the_modes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*GC, "--mode", "exactly_once"])
    err = capsys.readouterr().err
    assert "invalid mode 'exactly_once'" in err and ", ".join(m.value for m in Mode) in err
