"""The service's runtime: what keeps the loop going and its state safe, beside the pipeline that does the work.

- :mod:`~service.runtime.retry`: one backoff and one classification of errors;
- :mod:`~service.runtime.checkpointer`: when to checkpoint, and the order (acknowledged → saved → committed);
- :mod:`~service.runtime.restore`: a task's state read back and checked (whose, sane, inside the logs);
- :mod:`~service.runtime.partitions`: assignment → restore, revocation → save; one instance per group model;
- :mod:`~service.runtime.health`: what /healthz and /readyz report, and the lag probe.
"""
