"""``python -m benchmarks``: every benchmark, the plots and a summary (see benchmarks/run_all.py)."""
import sys

from benchmarks.run_all import main

sys.exit(main())
