"""The work: how a task (the group's model, or a partition's replica) processes records, and how replicas mix.

No Kafka and no HTTP: records in, messages handed to a ``send`` callable out.
"""
