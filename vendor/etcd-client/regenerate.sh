#!/usr/bin/env bash
# Regenerates src/rpc/generated/*.rs: builds the published etcd-client (whose build
# script runs protoc: set PROTOC or have protoc on PATH) in a scratch crate, outside this
# workspace, and copies the code it generated.
set -euo pipefail
VERSION="${ETCD_CLIENT_VERSION:-0.21.1}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/src"
printf '[package]\nname = "regen"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\netcd-client = "=%s"\n' \
    "$VERSION" >"$scratch/Cargo.toml"
: >"$scratch/src/lib.rs"
CARGO_TARGET_DIR="$scratch/target" cargo build --quiet --manifest-path "$scratch/Cargo.toml"
for package in authpb etcdserverpb mvccpb v3electionpb v3lockpb; do
    cp "$scratch"/target/debug/build/etcd-client-*/out/"$package.rs" "$here/src/rpc/generated/"
done
echo "regenerated $here/src/rpc/generated from etcd-client $VERSION"
