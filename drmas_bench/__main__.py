import sys

from drmas_bench.cli import main

sys.exit(main())
