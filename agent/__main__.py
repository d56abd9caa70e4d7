"""`python -m agent`: run one node agent with settings from the environment."""

from __future__ import annotations

import asyncio
import logging
import os

from agent.app import create_app


def main() -> None:
    """Run the agent until SIGTERM or SIGINT."""
    logging.basicConfig(
        level=os.getenv("AGENT_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    app = create_app()
    asyncio.run(app.run())


if __name__ == "__main__":
    main()
