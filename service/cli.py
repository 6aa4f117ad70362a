"""``perceptron-stream``: the command line.

Each command's flags are its settings class in :mod:`perceptron_stream.config`
(``perceptron-stream serve --help`` lists them); a bad flag, environment
variable or file value exits with code 2 and a message naming the setting, and
so does a setting only start-up can judge (:class:`~perceptron_stream.config.ConfigError`
raised there: the embedded broker asked for exactly-once, a model file that changed
since the settings were read); another refusal exits 1 (docs/reference/cli.md).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

from perceptron_stream import __version__
from perceptron_stream.config import (
    BrokerSettings,
    CommandSettings,
    ConfigError,
    DemoSettings,
    ExplainSettings,
    ModelAtSettings,
    ModelExportSettings,
    ProduceSettings,
    ServeSettings,
    TrainSettings,
    load,
    signing_key,
)

PROG = "perceptron-stream"
COMMANDS: dict[str, tuple[type[CommandSettings], str]] = {
    "serve": (ServeSettings, "run the service: consume points, predict, learn, publish"),
    "broker": (BrokerSettings, "run the embedded Kafka-compatible broker (Tansu) in the foreground"),
    "produce": (ProduceSettings, "write a synthetic stream or replay a CSV/JSONL file into a topic"),
    "train": (TrainSettings, "run the batch algorithms (PLA, pocket) over a file; print JSON"),
    "demo": (DemoSettings, "broker + producer + service on this machine, with a live view"),
    "model": (
        ModelExportSettings,
        "model export: the newest checkpoint of a model, as a model file (serve --initial-model); "
        "model at VERSION: that version, from the model history",
    ),
    "explain": (
        ExplainSettings,
        "why a published prediction was made: its model rebuilt from the model history, every feature's part",
    ),
}


def _usage() -> str:
    lines = [f"usage: {PROG} COMMAND [--flags]   ({PROG} COMMAND --help for its flags)", "", "commands:"]
    lines += [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def _logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLevelName(level)))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"{PROG} {__version__}")
        return 0
    command, args = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"{PROG}: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    settings_cls = COMMANDS[command][0]
    runner = RUNNERS[command]
    if command == "model" and not (args and args[0] in ("-h", "--help")):
        if args[:1] == ["at"]:
            settings_cls, runner, args = ModelAtSettings, run_model_at, args[1:]
            if args and not args[0].startswith("-"):  # model at VERSION: the flag --version VERSION
                args = ["--version", *args]
        elif args[:1] == ["export"]:
            args = args[1:]
        else:
            print(
                f"{PROG} model: the actions are export and at: {PROG} model export --output model.json [--flags], "
                f"{PROG} model at VERSION --output model.json --model-history-topic TOPIC [--flags]",
                file=sys.stderr,
            )
            return 2
    try:
        settings = load(settings_cls, args)
    except ConfigError as exc:
        print(f"{PROG} {command}: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help printed by the settings parser
        return int(exc.code or 0)
    try:
        return runner(settings)
    except KeyboardInterrupt:
        return 130


def run_serve(settings: ServeSettings) -> int:
    from perceptron_stream.app import Application, StartupError
    from perceptron_stream.kafka import MissingTopicError
    from perceptron_stream.state.checkpoint import CheckpointError
    from perceptron_stream.state.local import StateLockedError

    _logging(settings.log_level)
    try:
        return Application(settings).run()
    except ConfigError as exc:  # a setting only start-up could judge (the brokers' kind, the model file): exit 2
        print(f"{PROG} serve: {exc}", file=sys.stderr)  # once: the log goes to stderr too
        return 2
    except (StartupError, CheckpointError, StateLockedError, MissingTopicError) as exc:
        print(f"{PROG} serve: {exc}", file=sys.stderr)  # once: the log goes to stderr too
        return 1


def run_broker(settings: BrokerSettings) -> int:
    from perceptron_stream.broker import EmbeddedBroker, PortInUse

    _logging()
    try:
        broker = EmbeddedBroker(settings.host, settings.port).start()
    except PortInUse as exc:
        print(f"{PROG} broker: --port {settings.port}: {exc}", file=sys.stderr)
        return 2
    print(f"embedded broker (Tansu) on {broker.bootstrap_servers}; memory only; Ctrl-C stops it", flush=True)
    print(f"bootstrap servers: {broker.bootstrap_servers}", flush=True)
    process = broker.process
    assert process is not None  # start() started it

    def forward(signum, _frame):  # the child gets SIGTERM; the wait below then returns
        if process.poll() is None:
            process.terminate()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        code = process.wait()
    finally:
        broker.stop()
    return 0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else code


def run_produce(settings: ProduceSettings) -> int:
    from perceptron_stream.produce import ProduceError, produce

    _logging("WARNING")
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    try:
        sent = produce(settings, should_stop=lambda: bool(stopping))
    except ProduceError as exc:
        print(f"{PROG} produce: {exc}", file=sys.stderr)
        return exc.status
    print(sent.line, file=sys.stderr)  # "wrote N messages to T", or "wrote N points to T and M labels to L"
    return 0


def run_train(settings: TrainSettings) -> int:
    from perceptron_stream.learning.batch import train_report
    from perceptron_stream.streams import is_csv, load_dataset

    try:
        data = load_dataset(settings.data, dense=settings.dense)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"{PROG} train: invalid setting data (--data): {exc}", file=sys.stderr)
        return 2
    try:
        report = train_report(
            data.X,
            data.y,
            algorithm=settings.algorithm,
            order=settings.order,
            seed=settings.seed,
            max_passes=settings.max_passes,
            feature_names=data.names,
        )
    except ValueError as exc:
        print(f"{PROG} train: invalid setting data (--data): {exc}", file=sys.stderr)
        return 2
    if settings.output is not None:
        from perceptron_stream.learning import model_file

        # dense x events are features 0..d-1 to the service (load_dataset names them x0..x{d-1} in the report)
        features = list(range(len(data.names))) if data.form == "dense" else data.names
        doc = model_file.from_weights(
            dict(zip(features, report["weights"])),
            report["bias"],
            source=f"train {settings.algorithm} {settings.order} on {settings.data}"
            f"{' --dense' if settings.dense else ''} ({report['updates']} updates, "
            f"{report['training_mistakes']} training mistakes)",
        )
        try:
            settings.output.write_text(json.dumps(doc, indent=2) + "\n")
        except OSError as exc:
            print(
                f"{PROG} train: invalid setting output (--output): cannot write {settings.output}: {exc.strerror}",
                file=sys.stderr,
            )
            return 2
        meets = (
            'dense events, {"x": [...]} (values in column order)'
            if data.form == "dense"
            else 'named events, {"features": {'
            + ", ".join(f'"{n}": ...' for n in data.names[:3])
            + (", ..." if len(data.names) > 3 else "")
            + "}}"
            + (" (for dense x events: --dense)" if is_csv(settings.data) else "")
        )
        print(f"wrote {settings.output}: a model for {meets}", file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


def run_model_export(settings: ModelExportSettings) -> int:
    """The newest usable checkpoint of a model (its owner's group and topic checked), written as a model file."""
    from perceptron_stream.learning import model_file
    from perceptron_stream.runtime.restore import learner_of
    from perceptron_stream.state.checkpoint import GROUP_TASK, CheckpointError, Owner

    _logging("WARNING")
    key = signing_key(settings)
    if settings.state_store == "local":
        from perceptron_stream.state.local import LocalStore

        store: LocalStore | KafkaStore = LocalStore(settings.state_dir, settings.group_id)
    else:
        from perceptron_stream.kafka import CompactedTopic, KafkaFatal, KafkaUnavailable
        from perceptron_stream.runtime.outage import Outage
        from perceptron_stream.state.kafka_store import KafkaStore

        # the command's one line says what failed: not the clients' own lines first ("Unable to bootstrap" twice)
        Outage(settings.bootstrap_servers).hush()
        try:
            store = KafkaStore(CompactedTopic(settings, settings.checkpoint_topic), settings.group_id)
        except (KafkaFatal, KafkaUnavailable) as exc:
            print(f"{PROG} model export: cannot read topic {settings.checkpoint_topic}: {exc}", file=sys.stderr)
            return 1
    store.key = key
    try:
        cp = store.load(
            settings.task,
            Owner(settings.group_id, settings.input_topic, settings.task),
            learner_of,  # a checkpoint it cannot rebuild has the next older one tried, as a restore does
        )
    except (CheckpointError, Exception) as exc:  # whatever a store refuses: one line, exit 1
        print(f"{PROG} model export: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if cp is None:
        where = f"topic {settings.checkpoint_topic}" if settings.state_store == "kafka" else f"{settings.state_dir}"
        other = (
            "a model of --model-scope partition keeps one checkpoint per partition: name one with --task partition-N"
            if settings.task == GROUP_TASK
            else f"a model of --model-scope group is --task {GROUP_TASK}"
        )
        print(
            f"{PROG} model export: no checkpoint of --task {settings.task} of group {settings.group_id} in the "
            f"{settings.state_store} store ({where}); {other}",
            file=sys.stderr,
        )
        return 1
    doc = model_file.from_learner(
        learner_of(cp),
        f"model export of checkpoint {cp.seq} of {settings.task} "
        f"(group {settings.group_id}, input {settings.input_topic})",
        cp.meta,
    )
    settings.output.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote checkpoint {cp.seq} of {settings.task} to {settings.output}", file=sys.stderr)
    return 0


def run_demo(settings: DemoSettings) -> int:
    from perceptron_stream.demo import run_demo as demo

    return demo(settings)


def run_explain(settings: ExplainSettings) -> int:
    from perceptron_stream.explain import run_explain as explain

    _logging("WARNING")
    return explain(settings)


def run_model_at(settings: ModelAtSettings) -> int:
    from perceptron_stream.explain import run_model_at as model_at

    _logging("WARNING")
    return model_at(settings)


RUNNERS: dict[str, Callable[[Any], int]] = {  # each takes its command's settings
    "serve": run_serve,
    "broker": run_broker,
    "produce": run_produce,
    "train": run_train,
    "demo": run_demo,
    "model": run_model_export,
    "explain": run_explain,
}

if __name__ == "__main__":
    sys.exit(main())
