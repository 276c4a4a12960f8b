"""``python -m cso calibration [--isa ISA] [--again]``: print (or re-measure) this host's
calibration record (``cso.calibration``)."""
import sys

from .calibration import main

if len(sys.argv) < 2 or sys.argv[1] != "calibration":
    sys.exit("usage: python -m cso calibration [--isa ISA] [--again]")
main(sys.argv[2:])
