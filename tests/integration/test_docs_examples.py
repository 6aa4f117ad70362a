"""The docs' Python examples that need a broker (marked ``docs-test: skip`` for the unit run), run against one.

Each sends its events with kafka-python to ``127.0.0.1:9092``, topics ``points`` (and ``labels``): here the test
broker and topics of the test's own, with a service reading them as the page says (``serve``, with
``--label-topic`` where the example sends labels). Every point an example sends must come out as a prediction.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.support.docs import python_examples
from tests.support.endpoints import http_get
from tests.support.launch import settings_args
from tests.support.topics import consume, create_topic
from tests.support.waiting import wait_until

NEED_A_BROKER = [example for example in python_examples() if example.skipped]


def test_there_are_examples_that_need_a_broker():
    assert len(NEED_A_BROKER) >= 2, [example.name for example in NEED_A_BROKER]


@pytest.mark.parametrize("example", NEED_A_BROKER, ids=lambda e: e.name)
def test_the_example_works_against_a_broker(example, broker, topics, tmp_path, service_thread):
    names = {**topics, "input_topic": f"points-{topics['group_id']}"}
    code = example.code.replace("127.0.0.1:9092", broker.bootstrap_servers).replace(
        '"points"', repr(names["input_topic"])
    )
    if '"labels"' in code:
        names["label_topic"] = f"labels-{topics['group_id']}"
        names["outcome_topic"] = f"outcomes-{topics['group_id']}"
        code = code.replace('"labels"', repr(names["label_topic"]))
        create_topic(broker.bootstrap_servers, names["label_topic"])
    create_topic(broker.bootstrap_servers, names["input_topic"])
    sent = re.findall(r"send\(\s*" + re.escape(repr(names["input_topic"])) + r".*?value=b\'(\{.*?\})\'", code)
    ids = [json.loads(value)["id"] for value in sent]
    assert ids, code
    service = service_thread(settings_args(broker, names, tmp_path))
    wait_until(lambda: http_get(service.metrics_url + "/readyz")[0] == 200, 60, what="ready")
    exec(compile(code, example.name, "exec"), {})
    predictions = [json.loads(m.value) for m in consume(broker.bootstrap_servers, names["output_topic"], len(ids))]
    assert [p["id"] for p in predictions] == ids
    if "label_topic" in names:
        [outcome] = consume(broker.bootstrap_servers, names["outcome_topic"], 1)
        assert json.loads(outcome.value)["id"] == ids[0]
    service.stop()
