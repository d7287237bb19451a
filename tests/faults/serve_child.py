"""`drainpipe serve` in a child process for kill tests, with a marker on stdout inside each store transaction
that commits a log position: ``in-txn N`` (before its COMMIT; the transaction then sleeps 0.3 s so that a kill
lands inside it; see txn_markers.py).

    python serve_child.py SERVE-ARGS...
"""

from __future__ import annotations

import sys

import txn_markers

from drainpipe.cli import main

if __name__ == "__main__":
    txn_markers.install(0.3)
    sys.exit(main(["serve", *sys.argv[1:]]))
