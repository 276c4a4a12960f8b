"""``python -m cso calibration [--isa ISA] [--again]``: print (or re-measure) this host's
calibration record (``cso.calibration``)."""
import argparse
import sys

from . import calibration
from .host import check_isa


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cso",
                                     usage="python -m cso calibration [--isa ISA] [--again]",
                                     description="Print this host's calibration record.")
    parser.add_argument("command", choices=["calibration"])
    parser.add_argument("--isa", help="kernel ISA (default: CSO_ISA or the host's best)")
    parser.add_argument("--again", action="store_true",
                        help="measure anew and replace the saved record")
    options = parser.parse_args(argv)
    isa = check_isa(options.isa)
    record = calibration.calibration(isa, options.again)
    print("\n".join(calibration.describe(record, calibration.host_facts(isa, options.again))))
    if not calibration.enabled():
        print(f"{calibration.ENV_VAR}=0: plans use the {record['isa']} tuning record alone",
              file=sys.stderr)


if __name__ == "__main__":
    main()
