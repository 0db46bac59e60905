"""A test-local user package: a task, a model and an algorithm registered via fedtune.extend."""
