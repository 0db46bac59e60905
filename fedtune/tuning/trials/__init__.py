"""What runs and stops one trial: the Ray Tune trainable (``trainable``), the stop rules
(``stop_rules``), the strategy's stopper (``stoppers``) and Ray Tune's schedulers built from it
(``schedulers``)."""
