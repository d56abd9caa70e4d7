"""`python -m warden`: the `warden` command."""

from warden.cli import main

main()
