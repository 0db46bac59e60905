"""``fedtune tune`` ends its process without the interpreter's module teardown (after
a study — torch, Ray, MLflow loaded — that teardown took 2 s of a 2-trial study's 17 s,
``benchmarks/startup.py --whole``), yet as a normal exit otherwise: non-daemon threads joined,
``atexit`` handlers run, stdout and stderr flushed, the verb's exit code. Only as the process's
entry point: ``main([...])`` called in-process returns."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fedtune.cli as cli

ROOT = Path(__file__).resolve().parents[2]


def test_exit_now_is_a_normal_exit_without_the_teardown(tmp_path: Path) -> None:
    marker = tmp_path / "teardown"
    code = textwrap.dedent(
        f"""
        import atexit, sys, threading, time
        from fedtune.cli import exit_now

        class Teardown:  # collected when the interpreter tears its modules down
            def __del__(self, _open=open):
                _open({str(marker)!r}, "w").write("torn down")

        keep = Teardown()
        atexit.register(lambda: print("atexit ran", flush=False))
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
        print("buffered", end="")
        sys.stderr.write("err")
        exit_now(3)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert run.returncode == 3
    assert run.stdout.split() == ["bufferedthread", "done", "atexit", "ran"]
    assert run.stderr == "err"
    assert not marker.exists()  # no module teardown
    normal = code.replace("exit_now(3)", "sys.exit(3)")
    run = subprocess.run(
        [sys.executable, "-c", normal], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert run.returncode == 3 and marker.read_text() == "torn down"  # what it skips


def _verb(fast: bool):
    def build_parser() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser()
        parser.set_defaults(func=lambda args: 5, fast_exit=fast)
        return parser

    return build_parser


@pytest.mark.parametrize(
    ("argv", "fast", "exits"),
    [
        (None, True, True),  # the entry point of `fedtune tune`
        ([], True, False),  # called in-process (tests, other Python code): returns
        (None, False, False),  # other verbs end as usual
    ],
)
def test_only_the_entry_point_of_a_fast_exit_verb_exits_now(
    monkeypatch: pytest.MonkeyPatch, argv, fast, exits
) -> None:
    monkeypatch.setattr(cli, "build_parser", _verb(fast))
    monkeypatch.setattr(sys, "argv", ["fedtune"])
    ended: list[int] = []
    monkeypatch.setattr(cli, "exit_now", ended.append)
    assert cli.main(argv) == 5
    assert ended == ([5] if exits else [])


def test_tune_asks_for_the_fast_exit() -> None:
    args = cli.build_parser().parse_args(["tune", "study.yaml"])
    assert args.fast_exit is True
    assert not getattr(cli.build_parser().parse_args(["spaces"]), "fast_exit", False)
