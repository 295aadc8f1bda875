import sys

from mcp_server.cli.main import main

sys.exit(main())
