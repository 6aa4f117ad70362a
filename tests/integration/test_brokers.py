"""The two brokers the suite runs on are what they claim to be.

Apache Kafka answers ConsumerGroupHeartbeat (the KIP-848 group protocol,
API key 68) in its ApiVersions and reports a cluster id of its own per
cluster; the embedded broker does neither. A test that meant to run on
Apache Kafka and ran on the embedded broker would prove nothing.
"""

from __future__ import annotations

import socket
import struct

import pytest
from kafka import KafkaAdminClient

from tests.support.apache_kafka import CONSUMER_GROUP_HEARTBEAT, ApacheKafka

pytestmark = pytest.mark.integration


def api_keys(bootstrap: str) -> set[int]:
    """The API keys a broker announces, from an ApiVersions v0 request on a bare socket.

    Written by hand because neither client exposes the broker's answer: a
    request is size, api key 18, version 0, correlation id, client id; the
    answer is size, correlation id, error code, then (key, min, max) triples.
    """
    host, port = bootstrap.rsplit(":", 1)
    client_id = b"perceptron-stream-tests"
    body = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "the broker closed the connection"
            data += chunk
    correlation, error, count = struct.unpack(">ihi", data[4:14])
    assert (correlation, error) == (7, 0)
    return {struct.unpack(">h", data[14 + 6 * i : 16 + 6 * i])[0] for i in range(count)}


def cluster_id(bootstrap: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_cluster()["cluster_id"]
    finally:
        admin.close()


def test_apache_kafka_speaks_the_kip_848_group_protocol_and_the_embedded_broker_does_not(apache_kafka, broker):
    assert CONSUMER_GROUP_HEARTBEAT in api_keys(apache_kafka.bootstrap_servers)
    assert CONSUMER_GROUP_HEARTBEAT not in api_keys(broker.bootstrap_servers)
    assert apache_kafka.name == "apache-kafka" and broker.name == "embedded"


def test_two_apache_kafka_clusters_have_different_cluster_ids(apache_kafka, tmp_path):
    with ApacheKafka(tmp_path / "second", heap="256m", quick_start=True) as second:
        ids = {cluster_id(apache_kafka.bootstrap_servers), cluster_id(second.bootstrap_servers)}
    assert ids == {apache_kafka.cluster_id, second.cluster_id} and len(ids) == 2
