"""Built-in tasks and file loaders (see ``registry``)."""

from .base import CentralData, Dataset, FederatedData, InMemoryData, Task
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
