"""The service's runtime: what keeps the loop going and its state safe, beside the pipeline that does the work.

- :mod:`~perceptron_stream.runtime.startup`: what the loop needs from the brokers and the disk, opened in dependency order;
- :mod:`~perceptron_stream.runtime.factory`: what a task is made of, and a new model's start (--initial-model);
- :mod:`~perceptron_stream.runtime.delivery`: a batch's outputs acknowledged, refused ones turned into dead letters;
- :mod:`~perceptron_stream.runtime.mixing`: the mix topic's records fed to the mix board;
- :mod:`~perceptron_stream.runtime.retry`: one backoff and one classification of errors;
- :mod:`~perceptron_stream.runtime.checkpointer`: when to checkpoint, and the order (acknowledged → saved → committed);
- :mod:`~perceptron_stream.runtime.restore`: a task's state read back and checked (whose, sane, inside the logs);
- :mod:`~perceptron_stream.runtime.partitions`: assignment → restore, revocation → save; one instance per group model;
- :mod:`~perceptron_stream.runtime.health`: what /healthz and /readyz report, and the lag probe;
- :mod:`~perceptron_stream.runtime.shutdown`: the stop deadline, and what a stop cut short leaves undone.
"""
