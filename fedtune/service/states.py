"""Study and trial states: defined in :mod:`fedtune.states` (shared with the SDK), re-exported
here for the server side."""

from fedtune.states import TERMINAL, TRANSITIONS, StudyState, TrialState, can_transition

__all__ = ["TERMINAL", "TRANSITIONS", "StudyState", "TrialState", "can_transition"]
