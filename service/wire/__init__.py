"""The wire: bytes in (:mod:`~perceptron_stream.wire.inputs`), the contract (:mod:`~perceptron_stream.wire.messages`), bytes out (:mod:`~perceptron_stream.wire.outputs`)."""
