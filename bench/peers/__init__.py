"""What a user would write instead of the service: river's Perceptron behind a Kafka library.

Each module is one application, written the way its library's documentation
shows, with ``run(bootstrap, input_topic, output_topic, group, events, batch)``
for ``bench/e2e.py --client NAME`` (see bench/README.md, "Peers"):

- ``quix_river``: a Quix Streams application (``--client quix+river``);
- ``confluent_river``: a confluent-kafka consume → produce → commit loop
  (``--client confluent+river``).

Both call river the same way (``river_model.predictor``).

Both need the bench extra: ``pip install -e '.[bench]'``.
"""
