"""`python -m agent`: run one node agent with settings from the environment."""

from __future__ import annotations

import asyncio
import os

from agent.app import create_app
from common.observability import log_with_trace_ids


def main() -> None:
    """Run the agent until SIGTERM or SIGINT."""
    log_with_trace_ids(os.getenv("AGENT_LOG_LEVEL", "INFO"))
    app = create_app()
    asyncio.run(app.run())


if __name__ == "__main__":
    main()
