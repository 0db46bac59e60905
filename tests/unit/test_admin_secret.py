"""The secrets fedtune makes for an operator to paste (the admin token, MLflow's admin
password) never start with ``-``, which argparse reads as an option after ``--token``."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.service import admin_token


def test_a_made_secret_never_starts_with_a_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn = iter(["-" + "a" * 42, "-" + "b" * 42, "c" * 43])
    monkeypatch.setattr(admin_token.secrets, "token_urlsafe", lambda n: next(drawn))
    assert (
        admin_token.read_or_make_secret(tmp_path / "admin-token", "FEDTUNE_API_TOKEN") == "c" * 43
    )
    assert (tmp_path / "admin-token").read_text() == "c" * 43 + "\n"


def test_the_cli_takes_a_made_secret_after_token(tmp_path: Path) -> None:
    """What the systemd units' test does by hand (``fedtune projects create … --token T``),
    for many secrets: none is refused as an option."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--token")
    for i in range(300):
        secret = admin_token.read_or_make_secret(tmp_path / f"t{i}", "FEDTUNE_API_TOKEN")
        assert len(secret) == 43 and not secret.startswith("-")
        assert parser.parse_args(["--token", secret]).token == secret
