"""The tuning layer's named contracts: every implementation keeps its protocol, and the driver
holds no trial, tracker, box or runs typed ``Any``.

* :class:`~fedtune.tuning.trials.view.TrialView`: Ray Tune's ``Trial``, a pack's
  ``MemberTrial`` and the in-process ``LocalTrial``;
* :class:`~fedtune.tuning.mlflow.tracker.Tracker`: ``StudyTracker`` and ``ProcessTracker``,
  each method its own (no forwarding by ``__getattr__``);
* :class:`~fedtune.tuning.packing.box.Box`: ``RayBox`` and ``LocalBox``;
* :class:`~fedtune.tuning.packing.runs.PackRuns`: ``Single`` and ``Packed``.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from fedtune.tuning.driver.in_process import LocalTrial
from fedtune.tuning.driver.pack_members import MemberTrial
from fedtune.tuning.keys import TRIAL_KEY
from fedtune.tuning.mlflow import process
from fedtune.tuning.mlflow.process import ProcessTracker
from fedtune.tuning.mlflow.tracker import Tracker
from fedtune.tuning.mlflow.tracking import StudyTracker
from fedtune.tuning.packing.box import Box, LocalBox, RayBox
from fedtune.tuning.packing.runs import Packed, PackRuns, Single
from fedtune.tuning.trials.results import PACK_KEY
from fedtune.tuning.trials.view import TrialView

ROOT = Path(__file__).resolve().parents[2] / "fedtune"
NAMES = re.compile(r"(trial|tracker|box|runs)\b")


def _members(protocol: type) -> list[str]:
    """The protocol's own methods and properties (not its attributes)."""
    return [
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
    ]


def _parameters(function: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(
    ("protocol", "implementations"),
    [
        (Tracker, [StudyTracker, ProcessTracker]),
        (Box, [RayBox, LocalBox]),
        (PackRuns, [Single, Packed]),
    ],
    ids=["tracker", "box", "runs"],
)
def test_each_implementation_defines_every_member_of_its_protocol(protocol, implementations):
    members = _members(protocol)
    assert members  # a protocol with nothing to keep would pass anything
    for cls in implementations:
        missing = [n for n in members if n not in vars(cls)]
        assert not missing, f"{cls.__name__} inherits {missing} from {protocol.__name__}'s stubs"
        assert "__getattr__" not in vars(cls)
        for name in members:
            theirs, mine = getattr(protocol, name), getattr(cls, name)
            if inspect.isfunction(theirs):
                assert _parameters(mine) == _parameters(theirs), f"{cls.__name__}.{name}"
    assert all(isinstance(getattr(cls, "refills", None), bool) for cls in (Single, Packed))


def test_the_process_tracker_forwards_each_call_to_a_method_its_child_serves():
    calls: list[tuple] = []

    class Child:  # TrackerProcess.call, recorded
        def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
            calls.append((name, args, kwargs))
            return 3 if name == "unsent" else "answer"

    tracker = ProcessTracker(Child(), "sqlite:///m.db", "7")  # type: ignore[arg-type]
    assert (tracker.uri, tracker.experiment_id) == ("sqlite:///m.db", "7")
    assert tracker.unsent() == 3
    tracker.log_rounds("r", iter([{"round": 1}]))  # an iterable crosses the pipe as a list
    assert calls[-1] == ("log_rounds", ("r", [{"round": 1}]), {})
    tracker.end_trial("r", "FINISHED", {"outcome": "completed"}, step=4)
    assert calls[-1] == (
        "end_trial",
        ("r", "FINISHED", {"outcome": "completed"}, None, None),
        {"step": 4},
    )
    assert tracker.reconcile("p", {}) == "answer"
    served = {name for name, _, _ in calls}
    assert served <= process._SERVED
    assert all(callable(getattr(StudyTracker, name)) for name in process._SERVED)
    with pytest.raises(AttributeError):
        tracker.client  # noqa: B018 — only the contract's methods exist


def test_every_trial_the_callbacks_see_is_a_trial_view():
    from ray.tune.experiment import Trial

    config = {PACK_KEY: [{TRIAL_KEY: 4}], TRIAL_KEY: 4}
    tune_trial = Trial("train_pack", config=config, stub=True)
    assert isinstance(tune_trial.trial_id, str) and tune_trial.config == config
    for name in _members(TrialView):
        assert hasattr(Trial, name) or name in vars(tune_trial), name
    local = LocalTrial("local_00000", config)
    member = MemberTrial(local, config[PACK_KEY][0])
    for trial in (local, member):
        assert isinstance(trial, TrialView)
        assert trial.error_file is None and trial.get_error() is None and trial.last_result == {}
    local._error = "Traceback ...\nValueError: boom"
    assert member.get_error() == local.get_error()  # a member's error is its pack's


def _typed_any(path: Path, root: Path) -> list[str]:
    """``name: Any`` parameters, attributes and variables whose name ends in trial, tracker,
    box or runs."""
    source = path.read_text()
    if "Any" not in source:
        return []  # the annotation is the name Any: a module without it is not parsed
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.arg):
            name, annotation = node.arg, node.annotation
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
            annotation = node.annotation
        else:
            continue
        if NAMES.search(name) and isinstance(annotation, ast.Name) and annotation.id == "Any":
            found.append(f"{path.relative_to(root)}:{node.lineno}: {name}: Any")
    return found


def test_the_check_finds_such_a_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from typing import Any\n"
        "class C:\n"
        "    runs: Any\n"
        "def f(trial: Any, trial_id: Any, trials: Any, from_trial: Any) -> None:\n"
        "    box: Any = None\n"
    )
    found = sorted(line.split(": ", 1)[1] for line in _typed_any(planted, tmp_path))
    assert found == ["box: Any", "from_trial: Any", "runs: Any", "trial: Any"]


def test_no_trial_tracker_box_or_runs_is_typed_any():
    found = [line for path in sorted(ROOT.rglob("*.py")) for line in _typed_any(path, ROOT.parent)]
    assert found == []
