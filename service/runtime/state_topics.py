"""The state topics (checkpoints, the pending changelog, the mix topic) checked at start-up and while running.

What the service keeps in Kafka lives only as long as those topics do: a checkpoint topic deleted under a running
service takes its checkpoints with it, and the service's next write there either fails or, where the brokers
create topics on first use (Apache Kafka's ``auto.create.topics.enable``, the embedded broker alike), lands in a
new topic of the brokers' defaults: ``cleanup.policy=delete``, which deletes the state after ``retention.ms``
instead of keeping each key's newest record. So each state topic the settings use is checked:

- at start-up (:meth:`StateTopics.start`), once start-up made sure it exists: its cleanup policy, where the brokers
  report configs, must be ``compact`` alone; a topic the service did not create but that is compacted is fine,
  one with ``delete`` in its policy is refused naming ``cleanup.policy`` and the topic. Its id is recorded;
- while running (:meth:`StateTopics.maybe`, from the checkpointer's turn: the place that decides when to write
  state), as often as checkpoints are due (``--checkpoint-interval-seconds``) but every :data:`MIN_CHECK_S` at
  most and :data:`CHECK_EVERY_S` at least, with one Metadata request (and, on Apache Kafka, one
  DescribeConfigs): a topic gone, or with another id (deleted and created again), or whose policy is no longer
  ``compact``, stops the service (:class:`StateTopicError`, exit 1) naming the topic, its setting and what to do,
  before it writes state anywhere again.

The embedded broker keeps no topic configs that matter (it describes no defaults): there only the topic id is checked,
as where the service's principal may not describe the topics' configs (DescribeConfigs: said once, at start-up).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from perceptron_stream.config import ServeSettings, flag
from perceptron_stream.kafka import KafkaFatal, TopicWatch
from perceptron_stream.runtime.retry import Retry, StartupError

log = logging.getLogger("perceptron_stream")

#: How long, at most, between two checks of the state topics while running: a deleted topic is noticed within it.
CHECK_EVERY_S = 10.0
#: How long, at least, between two checks (one or two admin requests, ~10-50 ms the pair on a local broker): with
#: checkpoints every second, a check every 2 s at most (under exactly-once, a commit every 100 ms: the same).
MIN_CHECK_S = 2.0
#: What a topic that sets no ``cleanup.policy`` of its own gets on Apache Kafka (``log.cleanup.policy``'s default).
BROKERS_DEFAULT_POLICY = "delete"
#: The runbook an operator is sent to.
RUNBOOK = "docs/operations/runbooks/PerceptronTargetDown.md"


class StateTopicError(StartupError):
    """A state topic deleted, created again or not compacted: the service stops (exit 1), naming it."""


@dataclass(frozen=True)
class StateTopic:
    name: str
    setting: str  # the setting that names it, e.g. checkpoint_topic
    role: str  # what it holds, for the message

    def __str__(self) -> str:
        return f"the {self.role} topic {self.name} ({flag(self.setting)})"


def state_topics(s: ServeSettings) -> list[StateTopic]:
    """The state topics these settings use (none with the local store, no delayed labels and no mixing)."""
    topics = []
    if s.state_store == "kafka":
        topics.append(StateTopic(s.checkpoint_topic, "checkpoint_topic", "checkpoint"))
        if s.label_topic is not None:
            topics.append(StateTopic(s.pending_topic, "pending_topic", "pending changelog"))
    if s.model_scope == "partition" and s.mix_every:
        topics.append(StateTopic(s.mix_topic, "mix_topic", "mix"))
    return topics


def policy_problem(topic: StateTopic, configs: dict[str, str]) -> str | None:
    """Why ``topic``'s configs (``TopicWatch.configs``' answer, from a broker that reports configs) do not keep state.

    >>> t = StateTopic("ckpt", "checkpoint_topic", "checkpoint")
    >>> policy_problem(t, {"cleanup.policy": "compact"}) is None
    True
    >>> policy_problem(t, {})[:77]
    'the checkpoint topic ckpt (--checkpoint-topic) has cleanup.policy=delete (the'
    """
    policy = configs.get("cleanup.policy", BROKERS_DEFAULT_POLICY)
    if {part.strip() for part in policy.split(",")} == {"compact"}:
        return None
    whose = "" if "cleanup.policy" in configs else " (the brokers' default)"
    return (
        f"{topic} has cleanup.policy={policy}{whose}: "
        f"the brokers delete its records after retention.ms instead of keeping each key's newest, so the state in "
        f"it would be lost. Set cleanup.policy=compact (kafka-configs.sh --alter --entity-type topics --entity-name "
        f"{topic.name} --add-config cleanup.policy=compact), or delete the topic for the service to create it "
        f"compacted (--create-topics); see {RUNBOOK}"
    )


def id_problem(topic: StateTopic, was: str | None, now: str | None) -> str | None:
    """Why ``topic``, whose id was ``was`` at start-up and is ``now``, is not the topic the service keeps state in.

    >>> t = StateTopic("ckpt", "checkpoint_topic", "checkpoint")
    >>> id_problem(t, "a", "a") is None, id_problem(t, None, "b") is None
    (True, True)
    >>> id_problem(t, "a", None)[:75]
    'the checkpoint topic ckpt (--checkpoint-topic) was deleted while the servic'
    """
    if was is None or now == was:  # a broker that reports no topic ids (before Kafka 2.8): nothing to compare
        return None
    if now is None:
        happened = "was deleted while the service ran"
    else:
        happened = f"was deleted and created again while the service ran (its topic id was {was}, now {now})"
    return (
        f"{topic} {happened}: the state it held is gone, and the service stops rather than keep state in a topic "
        f"that is not the one it started with. Stop every instance that uses it; then restore the topic's records, or "
        f"restart with --start-over to begin a new model (the service creates the topic again, compacted, with "
        f"--create-topics; one the brokers created meanwhile with their defaults is refused: delete it first); "
        f"see {RUNBOOK}"
    )


class StateTopics:
    """The state topics' ids as start-up found them, checked again every ``every_s`` while running."""

    def __init__(self, settings: ServeSettings, retry: Retry):
        self.settings, self.retry = settings, retry
        self.topics = state_topics(settings)
        self.ids: dict[str, str | None] = {}
        self.keeps_configs = True  # the brokers report topic configs (Apache Kafka; not the embedded broker)
        self._next_check = 0.0
        self.every_s = min(CHECK_EVERY_S, max(MIN_CHECK_S, settings.checkpoint_interval_seconds))
        self.watch = TopicWatch(settings)  # one admin client for every check (closed by start-up's resources)

    def start(self, embedded: bool) -> bool:
        """At start-up, once the topics exist: each one's policy checked and its id recorded; False when stopped
        meanwhile. ``embedded``: the embedded broker, which describes no defaults (only ids are checked)."""
        self.keeps_configs = not embedded
        if not self.topics:
            return True
        facts = self.retry.until_it_works(self._read, "check the state topics")
        if facts is None:
            return False
        ids, configs = facts
        self._refuse(ids, configs, was=ids)
        self.ids = ids
        self._next_check = time.monotonic() + self.every_s
        return True

    def maybe(self) -> None:
        """While running: when ``every_s`` passed since the last check, check again; StateTopicError when a
        topic is gone, another one or not compacted. Brokers that do not answer now are asked again next time."""
        if self.topics and time.monotonic() >= self._next_check:
            self.check()

    def check(self) -> None:
        """Check now (as :meth:`maybe` does when due): also when a write of state failed, to say why."""
        if not self.topics:
            return
        self._next_check = time.monotonic() + self.every_s
        ok, facts = self.retry.once(self._read, "check the state topics")
        if not ok:
            return
        ids, configs = facts
        self._refuse(ids, configs, was=self.ids)

    def _refuse(self, ids: dict[str, str | None], configs: dict[str, dict[str, str]] | None, was: dict) -> None:
        """StateTopicError for the first topic whose id is not ``was``'s, or whose policy does not keep state (both
        said, when a topic created again has the brokers' defaults)."""
        for topic in self.topics:
            problems = [id_problem(topic, was.get(topic.name), ids.get(topic.name))]
            if ids.get(topic.name) is not None and configs is not None:  # exists, on brokers that keep configs
                problems.append(policy_problem(topic, configs.get(topic.name, {})))
            said = [problem for problem in problems if problem]
            if said:
                raise StateTopicError(" Also: ".join(said))

    def _read(self) -> tuple[dict[str, str | None], dict[str, dict[str, str]] | None]:
        """(topic → id, topic → its own configs, or None where the brokers keep none)."""
        names = [t.name for t in self.topics]
        ids = self.watch.ids(names)
        present = [name for name in names if ids.get(name) is not None]
        if not (self.keeps_configs and present):
            return ids, None
        try:
            configs = self.watch.configs(present)
        except KafkaFatal as exc:  # no DescribeConfigs on them (ACLs): their ids are still checked
            self._undescribed(present, str(exc))
            return ids, None
        # Apache Kafka describes every config of a topic it may describe (defaults included); kafka-python leaves a
        # refused resource's error code unread and answers it with no configs: not described, not "no policy"
        undescribed = [name for name in present if not configs.get(name)]
        if undescribed:
            self._undescribed(undescribed, "described with no configs: no DescribeConfigs on them?")
            return ids, None
        return ids, configs

    def _undescribed(self, names: list[str], why: str) -> None:
        """Topics whose configs cannot be read: said once; from then on only the topics' ids are checked."""
        log.warning(
            "cannot read the configs of %s (%s): their cleanup.policy is not checked; allow the service's "
            "principal DescribeConfigs on them to have it checked",
            ", ".join(names),
            why,
        )
        self.keeps_configs = False
