"""A trial that holds GPUs computes on CUDA or fails at once, in one line."""

from __future__ import annotations

import pytest
import torch

from fedtune.tuning.spec import StudySpec
from fedtune.tuning.trials.results import TrialError, gpu_device, trial_configs

NO_CUDA = not torch.cuda.is_available()


def _spec(gpu: float, device: str | None = None):
    doc = {
        "name": "gpu-trial",
        "algorithm": "fedavg",
        "task": {"name": "quadratic", "clients": 4, "dim": 2, "examples": 4},
        "train": {"rounds": 2, "clients_per_round": 2, "local_steps": 1, "batch_size": 2},
        "budget": {"trials": 1},
        "resources": {"cpu": 1, "gpu": gpu},
        "objective": {"last_rounds": 1},
        "scheduler": {"name": "none"},
    }
    if device:
        doc["train"]["device"] = device
    return StudySpec.from_dict(doc)


@pytest.mark.skipif(not NO_CUDA, reason="asserts the behaviour without CUDA")
@pytest.mark.parametrize("device", [None, "auto", "cuda"])
def test_a_gpu_trial_without_cuda_fails_fast_with_one_line(device):
    spec = _spec(0.5, device)
    with pytest.raises(TrialError) as info:
        trial_configs(spec, {})
    line = str(info.value)
    assert "\n" not in line and "resources.gpu=0.5" in line and "CUDA is not available" in line


def test_auto_means_cuda_for_gpu_trials(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu_device(1.0, "auto") == "cuda"
    assert gpu_device(1.0, "cuda:1") == "cuda:1"


def test_an_explicit_cpu_device_is_obeyed_and_cpu_trials_are_untouched():
    assert gpu_device(0.5, "cpu") == "cpu"
    [config] = trial_configs(_spec(0.5, "cpu"), {})
    assert config.train.device == "cpu"
    [config] = trial_configs(_spec(0.0), {})
    assert config.train.device == "auto"
