#!/bin/bash
# A Debian 12 base image made from Debian's own packages, for machines that reach Debian's mirror but no image
# registry: mmdebstrap builds a minbase bookworm root (what debian:bookworm-slim is) with the packages the
# Containerfile needs, and podman imports it as localhost/amprepro-base:bookworm.
#
#   bash container/make_base.sh            # then: podman build --build-arg BASE=localhost/amprepro-base:bookworm ...
#
# What it substitutes: docker.io/library/debian:bookworm-slim plus the Containerfile's apt-get step. Both come from the
# same Debian 12 archive; the official image is built with debuerreotype and a fixed snapshot date, this one from
# today's mirror, so package versions may be newer point releases.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${BASE_IMAGE:-localhost/amprepro-base:bookworm}
mkdir -p container/base
packages=python3,python3-venv,python3-dev,g++,make,git,ca-certificates
mmdebstrap --variant=minbase --include="$packages" bookworm container/base/bookworm.tar
podman import --change 'CMD ["/bin/bash"]' container/base/bookworm.tar "$image"
rm -f container/base/bookworm.tar
podman image inspect --format '{{.Id}} {{.Size}}' "$image"
