"""One Ray Tune trial, a pack of P ≥ 1 configurations, and what stops it: its trainable
(``trainable``), the schema of its results and its pack's (``results``), the stop rules
(``stop_rules``), the ``tradeoff`` strategy's sweep (``sweep``), the strategy's stopper
(``stoppers``), the Ray Tune scheduler that asks it (``schedulers``) and the trial the callbacks
see (``view``)."""
