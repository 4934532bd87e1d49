"""`python -m benchmarks [--quick] [--out DIR] [--readme]`: every benchmark, one report (report.py)."""

from benchmarks.report import main

raise SystemExit(main())
