"""Checkpoints: the model and the input positions it reflects, saved together.

A checkpoint is one JSON document (never pickle: a store that unpickles what
it reads lets anyone who can write to it run code). Two stores keep them: a
local directory (:mod:`perceptron_stream.state.local`) and a compacted Kafka topic
(:mod:`perceptron_stream.state.kafka_store`); both keep the last few, and a load falls
back to an older one when the newest is damaged, and fails loudly when none
is good, never silently starting from zero weights.

Beside them, the delayed labels' state: the pending tables (:mod:`perceptron_stream.state.pending`) and, with the
Kafka store, their changelog (:mod:`perceptron_stream.state.changelog`).
"""

from perceptron_stream.state.checkpoint import Checkpoint, CheckpointError, decode_checkpoint, encode_checkpoint

__all__ = ["Checkpoint", "CheckpointError", "decode_checkpoint", "encode_checkpoint"]
