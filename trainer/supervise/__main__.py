import sys

from trainer.supervise.supervisor import main

sys.exit(main())
