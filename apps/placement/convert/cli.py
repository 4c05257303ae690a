"""`python -m apps.placement convert --from F --to G IN... [-o OUT]`: the converter on files.

IN is a file, `NODE=file` (a per-node file for the node NODE), or a directory (every file in it,
one node per file named after the file's stem). What the input lacks comes from `--defaults FILE`
(a YAML mapping) and `--set KEY=VALUE`; the notes on stderr say which values were used.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..topology import SpecError
from . import EXPORTERS, IMPORTERS, Defaults, Source, export_topology, import_sources
from .base import MAX_SOURCE_BYTES, yaml_documents


def add_parser(sub) -> None:
    """Add the `convert` command to the CLI's subparsers."""
    s = sub.add_parser("convert", help="convert a cluster between topology spec v1 and other formats")
    s.add_argument("--from", dest="src", required=True, choices=list(IMPORTERS), help="input format")
    s.add_argument("--to", dest="dst", required=True, choices=list(EXPORTERS), help="output format")
    s.add_argument(
        "inputs", nargs="+", metavar="IN", help="input file, NODE=file, or a directory of NODE files"
    )
    s.add_argument("-o", "--output", help="output file (default: stdout)")
    s.add_argument("--defaults", help="YAML file of values the input lacks (gpus_per_node, nic_bw_GBps, ...)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one such value")
    s.add_argument("--name", help="cluster name (same as --set name=NAME)")
    s.add_argument(
        "--nics",
        help="the NICs that are fabric rails, as shell patterns (mlx5_[0-7],ibp*); others are left out",
    )


def read_source(path: str, node: str = "") -> Source:
    """One input file, size-bounded; OSError when unreadable."""
    p = Path(path)
    if p.stat().st_size > MAX_SOURCE_BYTES:
        raise SpecError([(path, f"is larger than {MAX_SOURCE_BYTES // (1024 * 1024)} MiB")])
    try:
        return Source(path, p.read_text(encoding="utf-8"), node)
    except UnicodeDecodeError as exc:
        raise SpecError([(path, f"not UTF-8 text: {exc}")]) from None


def read_inputs(items: list[str]) -> list[Source]:
    """Sources from IN arguments: files, NODE=file pairs, directories (files sorted by name)."""
    out = []
    for item in items:
        node, sep, path = item.partition("=")
        if not sep or os.path.exists(item):
            node, path = "", item
        if os.path.isdir(path):
            out.extend(read_source(str(f)) for f in sorted(Path(path).iterdir()) if f.is_file())
        else:
            out.append(read_source(path, node))
    return out


def defaults_from(args: argparse.Namespace) -> Defaults:
    """Defaults from --defaults, then --set, then --name."""
    d = Defaults()
    if args.defaults:
        docs = yaml_documents(read_source(args.defaults))
        if len(docs) != 1 or not isinstance(docs[0][0], dict):
            raise SpecError([(args.defaults, "must be one YAML mapping of default values")])
        d.update(docs[0][0], where=args.defaults)
    values = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SpecError([("--set", f"expected KEY=VALUE, got {item!r}")])
        values[key.strip()] = value.strip()
    if args.name:
        values["name"] = args.name
    if getattr(args, "nics", None):
        values["nics"] = args.nics
    d.update(values, where="--set")
    return d


def run(args: argparse.Namespace) -> int:
    """Convert; 0 done, 2 bad input (each problem on stderr, with file and line)."""
    try:
        imported = import_sources(args.src, read_inputs(args.inputs), defaults_from(args))
        topology = imported.topology()
        text = export_topology(args.dst, topology)
    except OSError as exc:
        print(f"error: cannot read {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except SpecError as exc:
        for where, message in exc.errors:
            print(f"error: {where}: {message}", file=sys.stderr)
        return 2
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
