"""`drainpipe serve` in a child process whose feeder hands each batch to the engine ``PAUSE_S`` late, for tests that
need a replay longer than a moment whatever the machine's speed:

    python serve_slow_feed_child.py PAUSE_S SERVE-ARGS...

A replay of the kill tests' log (1.2 million events, ten engine batches) took about a second on CI's machine, so a
SIGTERM sent once the replay was seen half done could arrive after it had ended (the store had every event and the
test of a cut-short replay had nothing to cut)."""

from __future__ import annotations

import sys
import time

from drainpipe.cli import main
from drainpipe.pipeline.driver import Driver

if __name__ == "__main__":
    pause_s = float(sys.argv[1])
    feed = Driver.feed

    def slow_feed(self: Driver, *args: object, **kwargs: object) -> None:
        time.sleep(pause_s)
        feed(self, *args, **kwargs)  # type: ignore[arg-type]

    Driver.feed = slow_feed  # type: ignore[method-assign]
    sys.exit(main(["serve", *sys.argv[2:]]))
