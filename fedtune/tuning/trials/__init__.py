"""What a trial reports and what stops it: its results' schema (``results``; the trainable of
every trial, a pack, is ``fedtune.tuning.packing.trial``), the stop rules (``stop_rules``), the
strategy's stopper (``stoppers``) and the Ray Tune scheduler that asks it (``schedulers``)."""
