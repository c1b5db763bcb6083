import sys

from evotrainer.cli.app import main

sys.exit(main())
