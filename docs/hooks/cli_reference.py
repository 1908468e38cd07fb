"""MkDocs hook: the command-line reference page is generated from the click commands' own help, so it cannot
drift from the CLI. The page holds the marker below; each command (groups walked recursively) becomes a section
with its `--help` text."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- fastdata-cli-help -->"
WIDTH = 100


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_help_markdown())


def cli_help_markdown() -> str:
    """Every command's `--help`, as Markdown sections, in command-line order."""
    import click

    from fastdata.cli import cli

    sections: list[str] = []

    def walk(command: click.Command, ctx: click.Context) -> None:
        sections.append(f"## `{ctx.command_path}`\n\n```text\n{command.get_help(ctx).rstrip()}\n```\n")
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, click.Context(sub, info_name=name, parent=ctx, terminal_width=WIDTH,
                                            max_content_width=WIDTH))

    walk(cli, click.Context(cli, info_name="fastdata", terminal_width=WIDTH, max_content_width=WIDTH))
    return "\n".join(sections)
