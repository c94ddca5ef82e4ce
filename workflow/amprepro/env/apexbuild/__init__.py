"""Build NVIDIA apex from a pinned source, cache the wheel by its inputs, install it into a site dir, verify it.

Public surface: build_only(settings, jobs) -> record for results/apex/build.json (the compile, no GPU);
build_and_verify(settings, jobs, built=...) -> record for results/apex/apex.json; ApexError.
Layout: source (pinning), setup_inspect (what setup.py offers), toolchain + preflight (checks), patches, build,
store (cache), install, verify. docs/apex.md explains the choices.
"""

from amprepro.env.apexbuild.errors import ApexError
from amprepro.env.apexbuild.pipeline import build_and_verify, build_only

__all__ = ["ApexError", "build_and_verify", "build_only"]
