"""The bad-input tests reuse the fixtures of the suites they extend: the agent's signing
centre, command journal and executor (tests/unit/agent), the API on a real store and Redis
(tests/service/api), and a fresh Redis key namespace (tests/service)."""

from tests.service.api.conftest import api, api_settings, template_dir
from tests.service.conftest import keys, redis
from tests.unit.agent.conftest import centre, executor, journal, now, state_dir

__all__ = ["api", "api_settings", "centre", "executor", "journal", "keys", "now", "redis",
           "state_dir", "template_dir"]
