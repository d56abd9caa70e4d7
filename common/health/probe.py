"""`python -m common.health.probe [livez|readyz]`: a container's healthcheck.

Asks the process's own health endpoint (WARDEN_HEALTH_PORT, or API_PORT for the API, on
127.0.0.1) and exits 0 if it answered 200, 1 otherwise. The image has no curl or wget, and
needs none: this is the standard library only, so a healthcheck costs no more than a Python
start.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from typing import Final

TIMEOUT_S: Final = 3.0
ENDPOINTS: Final = ("livez", "readyz")


def port_from_env(env: dict[str, str]) -> int:
    """The port the process serves its health on: its health port, else the API's."""
    for name in ("WARDEN_HEALTH_PORT", "API_PORT"):
        value = env.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    raise SystemExit("no WARDEN_HEALTH_PORT (or API_PORT) set: nothing to probe")


def healthy(url: str, timeout_s: float = TIMEOUT_S) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv: list[str]) -> int:
    endpoint = argv[0] if argv else "readyz"
    if endpoint not in ENDPOINTS:
        raise SystemExit(f"usage: probe [{'|'.join(ENDPOINTS)}]")
    url = f"http://127.0.0.1:{port_from_env(dict(os.environ))}/{endpoint}"
    return 0 if healthy(url) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
