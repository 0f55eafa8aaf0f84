"""`drmas-bench config-schema NAME`: every key of a user-written config with its type, default and
description, straight from the schema that parses it (drmas_bench/schema.py)."""

from __future__ import annotations

import argparse

from drmas_bench.schema import CONFIG_SCHEMAS

EPILOG = """examples:
  drmas-bench config-schema team              # the keys of a --team file
  drmas-bench config-schema train --markdown  # the trainer config as the tables in docs/trainer.md
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config-schema", help="list the keys of a config file: team, prices, prompts or train",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", choices=tuple(CONFIG_SCHEMAS), help="which config: " + ", ".join(CONFIG_SCHEMAS))
    p.add_argument("--markdown", action="store_true", help="markdown tables (as embedded in docs/)")
    p.set_defaults(func=cmd_config_schema)


def cmd_config_schema(args: argparse.Namespace) -> int:
    from drmas_bench.schema import config_markdown, config_schema, text_table

    if args.markdown:
        print(config_markdown(args.config), end="")
        return 0
    for i, (title, schema) in enumerate(config_schema(args.config)):
        print(("\n" if i else "") + f"{title}:\n")
        print(text_table(schema), end="")
    return 0
