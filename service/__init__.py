"""perceptron-stream: an online perceptron over Kafka.

Data flow, one module a step: bytes → :mod:`service.wire` → learner
(:mod:`service.learning`, no Kafka, no HTTP) → prediction → topic
(:mod:`service.kafka`), with :mod:`service.metrics` and :mod:`service.state`
(checkpoints) beside it; :mod:`service.app` ties them together.
"""

__version__ = "0.1.0"

from service.learning import Perceptron

__all__ = ["Perceptron", "__version__"]
