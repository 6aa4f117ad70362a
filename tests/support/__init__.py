"""Helpers the tests share: brokers, certificates."""
