#!/bin/sh
# Build the image that deploy/kubernetes/ uses, from the wheel, tagged with the package's version:
#   deploy/kubernetes/build-image.sh [REGISTRY/NAME]     (default gpulayer/gpulayer)
# then `docker push` it and point the manifests at it (kustomization.yaml's `images:`).
# Needs docker (or podman: DOCKER=podman).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
name=${1:-gpulayer/gpulayer}
docker=${DOCKER:-docker}
version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")
rm -rf "$root/dist"
python3 -m pip wheel --no-deps --wheel-dir "$root/dist" "$root"
"$docker" build --build-arg "VERSION=$version" -t "$name:$version" -f "$root/deploy/kubernetes/Dockerfile" "$root"
echo "built $name:$version"
