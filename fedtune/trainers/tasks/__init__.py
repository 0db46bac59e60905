"""Built-in tasks and file loaders (see ``registry``).

The registry is imported with the package (the built-in tasks' names, descriptions and
parameters: no torch); the data classes named here (:class:`Task`, :class:`FederatedData`, …)
and each task's builder are imported when first used, so that validating a study spec does not
import torch.
"""

from fedtune.lazy import lazy_attributes

from .registry import TaskInfo, build_task, register_task, task_names, tasks

__all__ = [
    "CentralData",
    "Dataset",
    "FederatedData",
    "InMemoryData",
    "Task",
    "TaskInfo",
    "build_task",
    "register_task",
    "task_names",
    "tasks",
]

__getattr__ = lazy_attributes(
    __name__,
    dict.fromkeys(("CentralData", "Dataset", "FederatedData", "InMemoryData", "Task"), "base"),
)
