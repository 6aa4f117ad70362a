"""The work: how a task (the group's model, or a partition's replica) processes records, and how replicas mix.

Delayed labels (how a label is joined to its point) have a package of their own: :mod:`perceptron_stream.pipeline.labels`.

No Kafka and no HTTP: records in, messages handed to a ``send`` callable out.
"""
