"""``python -m perceptron_stream``: the same command line as the ``perceptron-stream`` script."""

from perceptron_stream.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
