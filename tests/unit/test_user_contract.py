"""User algorithms through the built-ins' contract table.

``tests/unit/test_engine_contract.py`` is run in a child process with
``FEDTUNE_CONTRACT_CODE`` naming the example project ``examples/byo``: the table then imports it
with fedtune's code loader (``fedtune.extend.load_code``) and puts the user's ``nova_medclip``
through every check the built-ins pass — determinism in the seeds, independence of client
order, vectorized ≡ sequential (fixed K and ``local_epochs``), masked steps as exact no-ops. The
child keeps the example off this process's ``sys.path``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "byo"
MODULES = "fedlab.models,fedlab.tasks,fedlab.methods"

REQUIRED = {
    "test_deterministic_under_seed",
    "test_trial_seed_changes_batches",
    "test_vectorized_equals_sequential",
    "test_independent_of_client_order",
    "test_local_epochs_vectorized_equals_sequential_bit_for_bit",
    "test_local_epochs_deterministic_and_seeded",
    "test_local_epochs_equal_sizes_equals_local_steps",
    "test_masked_steps_are_exact_no_ops",
    "test_local_epochs_independent_of_client_order",
}


def test_the_example_method_passes_the_contract_table(tmp_path: Path) -> None:
    report = tmp_path / "contract.xml"
    env = {
        **os.environ,
        "FEDTUNE_CONTRACT_CODE": f"{EXAMPLE}:{MODULES}",
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
    }
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        "nova_medclip",
        f"--junitxml={report}",
        "tests/unit/test_engine_contract.py",
    ]
    run = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    cases = ET.parse(report).getroot().iter("testcase")
    ran = {}
    for case in cases:
        name = case.get("name", "")
        outcome = next((child.tag for child in case), "passed")
        ran[name.split("[")[0]] = (name, outcome)
    missing = REQUIRED - set(ran)
    assert not missing, f"checks that did not run for nova_medclip: {sorted(missing)}"
    assert {n: o for n, (_, o) in ran.items() if o != "passed"} == {}
    assert all(name.endswith("[nova_medclip]") for name, _ in ran.values())
    assert "fedlab" not in sys.modules  # the parent never imported the user code
