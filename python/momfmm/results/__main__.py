"""`python3 -m momfmm.results ...`: the same as `momfmm_report.py --results ...`."""
import sys

from momfmm.results.cli import main

sys.exit(main())
