"""`python -m loadgen.sim`: run the simulator until a signal (or stdin EOF)."""

from __future__ import annotations

import argparse
import logging
import sys

from loadgen.sim.server import add_sim_arguments, run_sim_forever


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadgen.sim",
        description="A simulated OpenAI-compatible LLM server (continuous batching model).",
    )
    add_sim_arguments(parser)
    args = parser.parse_args(argv)
    # stdout is reserved for the announce line; everything else goes to stderr.
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    return run_sim_forever(args)


if __name__ == "__main__":
    sys.exit(main())
