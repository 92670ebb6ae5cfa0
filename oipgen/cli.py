"""The `oipgen` command line. Defaults come from `[tool.oipgen]` in ./pyproject.toml; flags override them."""

from __future__ import annotations

import argparse
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from . import __version__

EXIT_STALE = 1
EXIT_SPEC = 2
EXIT_REFUSED = 1  # scaffold, client: a file exists, an argument is invalid, the fetch failed or the metadata is
#   unusable; nothing written
EXIT_BREAKING = 1  # breaking: at least one change breaks existing clients or servers


def _config(cwd: Path) -> tuple[dict[str, Any], Path]:
    pyproject = cwd / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}, cwd
    section = data.get("tool", {}).get("oipgen", {})
    return (section if isinstance(section, dict) else {}), cwd


def _targets_help() -> str:
    """Every target of the registry, with the targets it builds too, then `all`."""
    from .targets import PUBLIC, TARGETS

    def needs(name: str) -> str:
        deps = [d for d in TARGETS[name][0] if d in PUBLIC]
        return f"{name} (with {', '.join(deps)})" if deps else name

    return " | ".join([*(needs(t) for t in PUBLIC), "all"])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oipgen", description="Compile the Open Inference Protocol spec into Python.")
    p.add_argument("--version", action="version", version=f"oipgen {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="generate the package (or, with --check, verify it is current)")
    b.add_argument("--target", action="append", metavar="NAME",
                   help=f"{_targets_help()} (repeatable; default: [tool.oipgen] targets, else all)")
    b.add_argument("--spec", type=Path, help="spec directory (default: ./spec if present, else the bundled one)")
    b.add_argument("--out", type=Path, help="output directory (default: generated)")
    b.add_argument("--package", help="name of the generated package (default: oip)")
    b.add_argument("--templates", type=Path, help="directory of templates overriding the built-in ones by file name")
    mode = b.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="write nothing; exit 1 with a diff summary if the output on disk is stale or has extra "
                           "files")
    mode.add_argument("--prune", action="store_true",
                      help="also remove the files in the output that are not generated (those --check reports as "
                           "extra)")
    b.add_argument("--strict", action="store_true",
                   help="a wire break against the previous build (a field or RPC renumbered, retyped or removed) is "
                        "an error: exit 1 and write nothing (default: a warning)")
    b.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    k = sub.add_parser("breaking", help="list the changes that break clients or servers of an older spec")
    k.add_argument("--against", required=True, metavar="OLD",
                   help="the older spec: a spec folder, or a git revision of this repository (origin/main, HEAD~3, "
                        "a tag), whose copy of the --spec folder is compared")
    k.add_argument("--spec", type=Path, help="the new spec directory (default: [tool.oipgen] spec, else spec)")
    s = sub.add_parser("scaffold", help="start a model folder for the generated server")
    kinds = s.add_subparsers(dest="kind", required=True)
    m = kinds.add_parser("model", help="write DIR/NAME/model.toml and DIR/NAME/model.py (never overwrites)")
    m.add_argument("name", metavar="NAME", help="the model's name (its folder in the repository)")
    m.add_argument("--repository", type=Path, metavar="DIR",
                   help="the model repository (default: [tool.oipgen] model_repository, else models)")
    m.add_argument("--input", action="append", default=[], metavar="NAME:DATATYPE:SHAPE",
                   help="a declared input, like INPUT0:FP32:1,16 (-1: any size); repeatable; default INPUT0:FP32:-1")
    m.add_argument("--output", action="append", default=[], metavar="NAME:DATATYPE:SHAPE",
                   help="a declared output (repeatable; default: OUTPUT0 with the first input's datatype and shape)")
    m.add_argument("--package",
                   help="the generated package the model imports (default: [tool.oipgen] package, else oip)")
    m.add_argument("--spec", type=Path,
                   help="spec directory, for its datatype table (default: ./spec if present, else the bundled one)")
    c = sub.add_parser("client", help="write a typed client module for one model, from its metadata")
    source = c.add_mutually_exclusive_group(required=True)
    source.add_argument("--server", metavar="URL", help="a server's REST address, asked for the model's metadata")
    source.add_argument("--metadata", type=Path, metavar="FILE",
                        help="the model's metadata as JSON (the answer of GET /v2/models/NAME), instead of --server")
    c.add_argument("--model", metavar="NAME", help="the model (required with --server)")
    c.add_argument("--version", dest="model_version", default="", metavar="V",
                   help="the model version: its metadata, and the version the client asks for (default: the server's)")
    c.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="the deadline of the whole fetch from --server: connect, TLS, request and answer (default 30)")
    c.add_argument("--out", type=Path, required=True, metavar="FILE.py", help="the module to write")
    c.add_argument("--package",
                   help="the generated package the module imports, dotted if vendored inside another "
                        "(default: [tool.oipgen] package, else oip)")
    c.add_argument("--spec", type=Path,
                   help="spec directory, for its datatype table (default: ./spec if present, else the bundled one)")
    c.add_argument("--templates", type=Path, help="directory of templates overriding the built-in ones by file name")
    sp = sub.add_parser("spec", help="the standard spec bundled with oipgen")
    sp_kinds = sp.add_subparsers(dest="kind", required=True)
    e = sp_kinds.add_parser("export", help="write the bundled spec into DIR, to own and extend it (never overwrites)")
    e.add_argument("dir", metavar="DIR", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        return _build(args)
    if args.command == "scaffold":
        return _scaffold(args)
    if args.command == "breaking":
        return _breaking(args)
    if args.command == "client":
        return _client(args)
    if args.command == "spec":
        return _spec_export(args.dir)
    return 2


def _spec_export(target: Path) -> int:
    from .bundled import export

    try:
        written = export(target)
    except OSError as e:
        print(f"oipgen: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"oipgen: wrote the bundled spec ({len(written)} files) to {target}; build from it with --spec {target} "
          f"or [tool.oipgen] spec = \"{target}\"")
    return 0


def _scaffold(args: argparse.Namespace) -> int:
    from .bundled import spec_dir
    from .scaffold import ScaffoldError, datatype_names, project_root, scaffold_model

    # The project's settings are those of the nearest [tool.oipgen] above the repository (or, without
    # --repository, above the current folder): a model scaffolded from a sub-folder imports the project's package.
    config, root = _config(project_root(args.repository or Path.cwd()) or Path.cwd())
    repository = args.repository if args.repository is not None else (
        root / str(config.get("model_repository", "models")))
    spec = spec_dir(args.spec, config.get("spec"), root)
    package = args.package or str(config.get("package", "oip"))
    try:
        written = scaffold_model(repository, args.name, package=package, datatypes=datatype_names(spec),
                                 inputs=args.input, outputs=args.output)
    except (ScaffoldError, OSError) as e:
        print(f"oipgen: {e}", file=sys.stderr)
        return EXIT_REFUSED
    for path in written:
        print(f"  created  {path}")
    print(f"oipgen: model '{args.name}' scaffolded; fill in infer() in {written[-1]}")
    return 0


def _breaking(args: argparse.Namespace) -> int:
    from .breaking import AgainstError, compare, spec_at
    from .load import load_spec
    from .problems import SpecError

    config, root = _config(Path.cwd())
    spec = args.spec if args.spec is not None else root / str(config.get("spec", "spec"))
    try:
        with spec_at(args.against, spec) as old_dir:
            apis = []
            for label, folder in ((f"{args.against} ({old_dir})", old_dir), (str(spec), spec)):
                try:
                    apis.append(load_spec(folder))
                except SpecError as e:
                    _report_problems(label, e)
                    return EXIT_SPEC
    except AgainstError as e:
        print(f"oipgen: {e}", file=sys.stderr)
        return EXIT_SPEC
    breaks = compare(apis[0], apis[1])
    for b in breaks:
        print(b)
    if breaks:
        print(f"oipgen: {len(breaks)} breaking change(s) in {spec} against {args.against}", file=sys.stderr)
        return EXIT_BREAKING
    print(f"oipgen: nothing in {spec} breaks clients or servers of {args.against}", file=sys.stderr)
    return 0


def _report_problems(spec: object, e: Any) -> None:
    print(f"oipgen: the spec in {spec} has {len(e.problems)} problem(s):", file=sys.stderr)
    for p in e.problems:
        print(f"  {p}", file=sys.stderr)


def _client(args: argparse.Namespace) -> int:
    from .bundled import spec_dir
    from .load import load_datatypes
    from .model_client import FETCH_DEADLINE, ClientError, fetch_metadata, one_line, read_metadata, render_client
    from .problems import SpecError

    config, root = _config(Path.cwd())
    spec = spec_dir(args.spec, config.get("spec"), root)  # as build and scaffold: the bundled spec by default
    templates = args.templates if args.templates is not None else (
        root / str(config["templates"]) if config.get("templates") else None)
    try:
        if args.server is not None and not args.model:
            raise ClientError("--server needs --model NAME")
        try:
            datatypes = load_datatypes(spec)
        except SpecError as e:
            raise ClientError(f"cannot read the datatype table of {spec} ({e}); pass --spec DIR") from None
        if args.server is not None:
            doc = fetch_metadata(args.server, args.model, args.model_version,
                                 deadline=FETCH_DEADLINE if args.timeout is None else args.timeout)
        else:
            doc = read_metadata(args.metadata)
        model, text = render_client(doc, datatypes, model=args.model, version=args.model_version,
                                    package=args.package or str(config.get("package", "oip")), templates=templates)
    except ClientError as e:
        print(f"oipgen: {one_line(str(e))}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        unchanged = args.out.is_file() and args.out.read_bytes() == text.encode("utf-8")
        if not unchanged:
            args.out.write_text(text, encoding="utf-8")
    except OSError as e:
        print(one_line(f"oipgen: cannot write {args.out}: {e}"), file=sys.stderr)
        return EXIT_REFUSED
    inputs = ", ".join(t.python for t in model.inputs)
    print(one_line(f"oipgen: {args.out} {'unchanged' if unchanged else 'written'}: a typed client of model "
                   f"{model.name!r} (infer({inputs}))"))
    return 0


def _build(args: argparse.Namespace) -> int:
    from .build import BuildOptions, OptionsError, validate
    from .bundled import spec_dir
    from .output import is_current
    from .targets import PUBLIC

    started = time.perf_counter()
    config, root = _config(Path.cwd())

    def path_option(value: Path | None, key: str, default: str) -> Path:
        return value if value is not None else root / str(config.get(key, default))

    targets = args.target or config.get("targets") or ["all"]
    if isinstance(targets, str):
        targets = [targets]
    templates = args.templates if args.templates is not None else (
        root / str(config["templates"]) if config.get("templates") else None)
    opts = BuildOptions(
        spec=spec_dir(args.spec, config.get("spec"), root),
        out=path_option(args.out, "out", "generated"),
        package=args.package or str(config.get("package", "oip")),
        targets=tuple(t for item in targets for t in str(item).split(",") if t),
        templates=templates,
        settings={name: table for name, table in config.items() if name in PUBLIC and isinstance(table, dict)},
        dist_name=str(config["dist_name"]) if config.get("dist_name") else None,
        dist_version=str(config["dist_version"]) if config.get("dist_version") else None,
    )
    try:
        validate(opts)
    except OptionsError as e:
        print(f"oipgen: {e}", file=sys.stderr)
        return EXIT_SPEC

    if args.check:
        from .build import inputs_hash

        if is_current(opts.package_dir, inputs_hash(opts)):
            if not args.quiet:
                print(f"oipgen: {opts.package_dir} is up to date ({time.perf_counter() - started:.2f}s)")
            return 0

    tree = _tree_or_report(opts)
    if tree is None:
        return EXIT_SPEC

    from .output import MANIFEST, UnsafePathError, diff, display, extra_files, prune, read_manifest, write

    breaks, unchecked = _wire_breaks(opts.package_dir, read_manifest(opts.package_dir), tree.files[MANIFEST])
    if args.check:
        d = diff(opts.package_dir, tree)
        if d.clean:
            if not args.quiet:
                print(f"oipgen: {opts.package_dir} is up to date ({time.perf_counter() - started:.2f}s)")
            return 0
        print(f"oipgen: {opts.package_dir} is not what the spec generates:", file=sys.stderr)
        print(d.summary(), file=sys.stderr)
        for line in [*breaks, *([unchecked] if unchecked else [])]:
            print(line, file=sys.stderr)
        fix = f"oipgen: to fix it, run: {_build_command(args, prune=bool(d.extra))}"
        if d.extra:
            fix += f" (--prune removes the {len(d.extra)} extra file(s); or delete them)"
        print(fix, file=sys.stderr)
        return EXIT_STALE

    for line in [*breaks, *([unchecked] if unchecked else [])]:
        print(line, file=sys.stderr)
    if (breaks or unchecked) and args.strict:
        print("oipgen: --strict: nothing was written", file=sys.stderr)
        return EXIT_BREAKING
    try:
        extra = extra_files(opts.package_dir, tree) if args.prune else []
        actions = write(opts.package_dir, tree)
        actions += prune(opts.package_dir, extra)
    except FileExistsError as e:
        print(f"oipgen: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except UnsafePathError as e:
        print(f"oipgen: {e}; nothing was written or removed", file=sys.stderr)
        return EXIT_REFUSED
    if not args.quiet:
        for action, rel in actions:
            print(f"  {action:8} {display(opts.package_dir, rel)}")
        print(
            f"oipgen {__version__}: {opts.package_dir}: {len(tree.files)} files, {len(actions)} written, "
            f"{len(tree.files) - sum(a == 'created' or a == 'updated' for a, _ in actions)} unchanged "
            f"({time.perf_counter() - started:.2f}s)"
        )
    if not args.prune:
        left = extra_files(opts.package_dir, tree)
        if left:
            print(f"oipgen: {len(left)} file(s) in the output are not generated, so `--check` fails on them "
                  f"(first: {display(opts.package_dir, left[0])}): delete them, or run "
                  f"{_build_command(args, prune=True)}", file=sys.stderr)
    return 0


def _wire_breaks(package_dir: Path, previous: dict[str, Any] | None, manifest: bytes) -> tuple[list[str], str | None]:
    """One line per gRPC wire break from the previous build's descriptors to these, and a line saying why they
    could not be compared (None when they could)."""
    import json

    from .breaking import build_breaks

    try:
        breaks = build_breaks(previous, json.loads(manifest))
    except ValueError as e:
        return [], (f"oipgen: warning: the descriptors recorded in {package_dir / '_oipgen_manifest.json'} are "
                    f"unreadable ({e}); wire breaks against the previous build were not checked")
    lines = [f"oipgen: warning: wire break: {b}" for b in breaks]
    if lines:
        lines.append(f"oipgen: {len(breaks)} wire break(s) against the previous build of {package_dir}: peers built "
                     "on it misread or cannot call the new one. `oipgen breaking --against REV` lists every "
                     "break, REST too, against a committed spec; `--strict` makes this an error.")
    return lines, None


def _build_command(args: argparse.Namespace, prune: bool) -> str:
    """The `oipgen build` that rewrites the output, with the flags this one was given."""
    import shlex

    words = ["oipgen", "build"]
    for target in args.target or []:
        words += ["--target", target]
    for flag, value in (("--spec", args.spec), ("--out", args.out), ("--package", args.package),
                        ("--templates", args.templates)):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join(words + (["--strict"] if args.strict else []) + (["--prune"] if prune else []))


def _tree_or_report(opts: Any) -> Any:
    from .build import build_tree
    from .problems import SpecError

    try:
        return build_tree(opts)
    except SpecError as e:
        _report_problems(opts.spec, e)
        return None
    except Exception as e:  # a generator failing on input that passed the checks: say so without a traceback
        if os.environ.get("OIPGEN_DEBUG"):
            raise
        print(f"oipgen: generation failed: {type(e).__name__}: {e} (set OIPGEN_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return None
