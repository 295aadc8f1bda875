import sys

from mcp_server.guard.entry import main

sys.exit(main())
