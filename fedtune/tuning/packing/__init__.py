"""A pack's own pieces: several configurations trained in one process. ``plan`` decides how many
per process (``limits``: the bounds it and the spec share), ``memory`` and ``speed`` measure it
on the trials' resources (``probe``), ``runs`` trains a pack's members (a member's record: the
mean over its seeds) and ``box`` is the mailbox through which the driver stops and refills a
pack. The pack as a Ray Tune trial is :mod:`fedtune.tuning.trials.trainable`; its members as the
driver's trials, :mod:`fedtune.tuning.driver.pack_members`. Nothing here imports another part of
the tuning package at run time."""
