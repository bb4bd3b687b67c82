import sys

from vit_scale.cli import main

sys.exit(main())
