"""``lookahead-rag keys add|list|revoke``: the API keys of ``[auth] keys_file``.

    lookahead-rag keys add --tenant acme --name acme-web        # prints the key once, on stdout (scope: answer)
    lookahead-rag keys add --tenant acme --scope write --name acme-sync      # Ingest/Delete/Forget/AddOutput
    lookahead-rag keys add --all-tenants --name generator       # a service key: answer, every tenant (*)
    lookahead-rag keys add --scope admin --name ops             # everything, every tenant
    lookahead-rag keys list                                     # ids, names, tenants, scopes, revoked; never a key
    lookahead-rag keys revoke k3f9a1c2b                         # running servers refuse it on the next call

Scopes (``--scope``, repeat it or give a comma list; default ``answer``): ``answer`` asks (Answer,
Generate, Retrieve, chat completions, stats of its tenants), ``write`` changes a tenant's data
(Ingest, Delete, Forget, AddOutput), ``admin`` does everything for every tenant. A key made before
scopes existed keeps ``answer`` and ``write`` (``admin`` if it has every tenant).

The file is ``--keys-file``, else ``[auth] keys_file`` from ``--config FILE`` / ``$LAR_CONFIG`` /
``LAR_AUTH_KEYS_FILE``. Only a digest of each key is stored: a lost key cannot be shown again, only
revoked and replaced.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lookahead_rag.services.common.auth.keys import ApiKey, KeyFile, KeyFileError
from lookahead_rag.services.common.auth.scopes import DEFAULT_SCOPES, GRANTABLE, Scope, parse_scopes
from lookahead_rag.services.common.auth.settings import ALL_TENANTS, AuthSettings
from lookahead_rag.services.common.settings import ConfigError, load_settings

EXIT_ERROR = 2
COLUMNS = ("id", "name", "tenants", "scopes", "created", "revoked")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lookahead-rag keys", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--keys-file", type=Path, help="the keys file (default: [auth] keys_file)")
    common.add_argument("--config", metavar="FILE", help="TOML file with an [auth] table")
    sub = p.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", parents=[common], help="create a key and print it (once)")
    who = add.add_mutually_exclusive_group()  # one of them, unless --scope admin (every tenant)
    who.add_argument("--tenant", action="append", help="a tenant the key may use (repeat for more)")
    who.add_argument("--all-tenants", action="store_true", help="every tenant (admin calls, service-to-service)")
    add.add_argument("--scope", action="append", metavar="SCOPE",
                     help=f"what the key may do: {', '.join(s.value for s in GRANTABLE)} "
                          f"(repeat or comma list; default: {', '.join(s.value for s in DEFAULT_SCOPES)})")
    add.add_argument("--name", default="", help="what the key is for (shown by list)")
    sub.add_parser("list", parents=[common], help="list the keys (never the keys themselves)")
    revoke = sub.add_parser("revoke", parents=[common], help="revoke a key by its id")
    revoke.add_argument("id", help="the key's id (from list)")
    return p


def keys_file(args: argparse.Namespace) -> Path:
    if args.keys_file is not None:
        return Path(args.keys_file)
    path = load_settings(AuthSettings, "auth", args.config).keys_file
    if path is None:
        raise KeyFileError("no keys file: pass --keys-file or set [auth] keys_file (LAR_AUTH_KEYS_FILE)")
    return Path(path)


def table(keys: list[ApiKey]) -> str:
    rows = [list(COLUMNS)] + [[k.id, k.name or "-", ",".join(k.tenants), ",".join(s.value for s in k.scopes),
                               k.created, "yes" if k.revoked else "no"] for k in keys]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def add_grant(args: argparse.Namespace) -> tuple[tuple[Scope, ...], list[str]]:
    """(scopes, tenants) of ``keys add``: ``--scope`` (default answer); ``--tenant`` or ``--all-tenants``,
    which an admin key may leave out (it has every tenant)."""
    try:
        scopes = parse_scopes(args.scope) if args.scope else DEFAULT_SCOPES
    except ValueError as exc:
        raise KeyFileError(str(exc)) from None
    if args.all_tenants or (not args.tenant and Scope.ADMIN in scopes):
        return scopes, [ALL_TENANTS]
    if not args.tenant:
        raise KeyFileError("keys add needs --tenant or --all-tenants (or --scope admin)")
    return scopes, args.tenant


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        store = KeyFile(keys_file(args))
        if args.action == "add":
            scopes, tenants = add_grant(args)
            record, token = store.add(tenants, args.name, scopes)
            print(token)  # the only time the key exists outside the caller's hands
            print(f"key {record.id} for {', '.join(record.tenants)} ({', '.join(s.value for s in record.scopes)}) "
                  f"added to {store.path}: store it now, it cannot be shown again", file=sys.stderr)
        elif args.action == "list":
            print(table(store.load()))
        else:
            record = store.revoke(args.id)
            print(f"key {record.id} revoked in {store.path}")
    except (KeyFileError, ConfigError, OSError) as exc:
        print(f"lookahead-rag keys: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
