"""Packed trials: several configurations trained in one process. ``plan`` decides how many per
process, ``memory`` measures it on a GPU, ``trial`` runs a pack as one Ray Tune trial,
``driver`` maps its members to Optuna trials and stop rules, ``box`` is the pack's mailbox."""
