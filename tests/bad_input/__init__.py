"""The bad-input matrix (docs/reliability.md §Bad-input matrix, ids B1..B29): every case fed
to the surface it arrives at (the report topic, the agent's commands, the API, the templater),
each checked for its documented outcome; and property tests that throw generated malformed
reports, commands and operator controls at the validators and handlers."""
