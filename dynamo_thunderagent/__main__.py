import sys

from dynamo_thunderagent.cli import main

sys.exit(main())
