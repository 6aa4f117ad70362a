"""The wire: bytes in (:mod:`~service.wire.inputs`), the contract (:mod:`~service.wire.messages`), bytes out (:mod:`~service.wire.outputs`)."""
