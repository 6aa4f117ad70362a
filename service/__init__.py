"""perceptron-stream: an online perceptron over Kafka.

Data flow, one module a step: bytes → :mod:`perceptron_stream.wire` → learner
(:mod:`perceptron_stream.learning`, no Kafka, no HTTP) → prediction → topic
(:mod:`perceptron_stream.kafka`), with :mod:`perceptron_stream.metrics` and :mod:`perceptron_stream.state`
(checkpoints) beside it; :mod:`perceptron_stream.app` ties them together.
"""

__version__ = "0.1.0"

from perceptron_stream.learning import Perceptron

__all__ = ["Perceptron", "__version__"]
