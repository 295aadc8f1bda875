import sys

from mcp_server.guard.hook import main

sys.exit(main())
