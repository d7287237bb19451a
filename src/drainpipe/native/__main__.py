"""``python -m drainpipe.native``: which native tiers this installation has, and which are on."""

from . import report

print(report())
