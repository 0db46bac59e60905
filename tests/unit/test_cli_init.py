"""``fedtune init`` writes the shipped examples, which are the checkout's example files."""

from __future__ import annotations

from pathlib import Path

from fedtune.cli import main
from fedtune.cli.init import EXAMPLES

REPO = Path(__file__).resolve().parents[2]


def test_init_writes_every_example_and_keeps_an_edited_one(tmp_path, capsys) -> None:
    assert main(["init", "--dir", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(file for file, _ in EXAMPLES.values())
    assert (tmp_path / "quickstart.yaml").read_bytes() == (
        REPO / "examples" / "quickstart.yaml"
    ).read_bytes()  # the checkout's example is the shipped file
    (tmp_path / "quickstart.yaml").write_text("name: mine\n")
    assert main(["init", "quickstart", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "quickstart.yaml").read_text() == "name: mine\n"
    assert "kept" in capsys.readouterr().out
    assert main(["init", "quickstart", "--dir", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "quickstart.yaml").read_text() != "name: mine\n"


def test_an_unknown_example_is_refused_with_one_line(tmp_path, capsys) -> None:
    assert main(["init", "nope", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fedtune: error: NAME: no example 'nope' (examples: quickstart, study-of-methods)"
    ]
    assert list(tmp_path.iterdir()) == []
