import sys

from fedtune.cli import main

sys.exit(main())
