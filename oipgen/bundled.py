"""The standard spec shipped with oipgen: `spec/` of the source tree, packaged as `oipgen/spec` in a wheel.

It is the spec a build uses when neither `--spec` nor `[tool.oipgen] spec` names one and the current folder has no
`spec/`; `oipgen spec export DIR` writes a copy for a project that wants to own and extend it.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def builtin_spec() -> Path:
    here = Path(__file__).resolve().parent
    packaged = here / "spec"
    return packaged if packaged.is_dir() else here.parent / "spec"


def spec_dir(option: Path | None, configured: object, root: Path) -> Path:
    """The spec to use: `--spec`, else `[tool.oipgen] spec`, else `./spec` when it exists, else the bundled one."""
    if option is not None:
        return option
    if configured:
        return root / str(configured)
    local = root / "spec"
    return local if local.is_dir() else builtin_spec()


def export(target: Path) -> list[Path]:
    """Copy the bundled spec into `target`; the files written. Writes nothing when any of them exists already
    (FileExistsError naming them)."""
    source = builtin_spec()
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    existing = [target / rel for rel in files if (target / rel).exists()]
    if existing:
        more = f" and {len(existing) - 5} more" if len(existing) > 5 else ""
        names = ", ".join(str(p) for p in existing[:5]) + more
        raise FileExistsError(f"{names} exist already; nothing was written (export into a new folder)")
    for rel in files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, target / rel)
    return [target / rel for rel in files]
