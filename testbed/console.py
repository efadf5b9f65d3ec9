"""The command line's one console: its messages are not wrapped by rich, so a path or a
command in an error stays whole to copy (the terminal wraps what is too long)."""

from rich.console import Console

console = Console(soft_wrap=True)
