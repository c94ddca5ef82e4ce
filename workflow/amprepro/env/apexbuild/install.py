"""Install a built wheel into a target directory that run processes put first on sys.path; the env stays untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from amprepro.env.apexbuild.errors import ApexError
from amprepro.files import make_temp_dir

STAMP = ".amprepro-wheel-sha256"


def install(wheel: Path, wheel_sha256: str, site: Path) -> Path:
    """site holds exactly this wheel afterwards; a site already stamped with its sha256 is reused as is."""
    stamp = site / STAMP
    if stamp.is_file() and stamp.read_text().strip() == wheel_sha256:
        return site
    site.parent.mkdir(parents=True, exist_ok=True)
    staged = make_temp_dir(site.parent, f".tmp-{site.name}-")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile",
                           "--disable-pip-version-check", "--quiet", "--target", str(staged), str(wheel)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(staged, ignore_errors=True)
        raise ApexError(f"pip could not install {wheel} into {site}: {done.stderr.strip()[-800:]}")
    (staged / STAMP).write_text(wheel_sha256 + "\n")
    if site.exists():
        shutil.rmtree(site)
    os.rename(staged, site)
    return site
