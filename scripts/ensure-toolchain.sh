#!/usr/bin/env bash
# Makes the toolchain pinned in rust-toolchain.toml available to rustup, so that `cargo`
# (and therefore `cargo xtask ci`) can start on a fresh machine.
#
# Machines here ship rustup with `stable` and `nightly` installed and set
# RUSTUP_AUTO_INSTALL=0, so a pin such as "1.95.0" is "not installed" even when stable
# *is* 1.95.0. In that case the pin is pointed at the stable toolchain (a symlink, which is
# what `rustup toolchain list` then shows). Otherwise rustup is asked to install the pin.
# Does nothing when the pin already works.
set -euo pipefail
cd "$(dirname "$0")/.."

channel=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if [ -z "$channel" ]; then
    echo "ensure-toolchain: no channel in rust-toolchain.toml" >&2
    exit 1
fi
if rustup run "$channel" rustc --version >/dev/null 2>&1; then
    exit 0
fi

host=$(rustup run stable rustc -vV 2>/dev/null | sed -n 's/^host: //p' || true)
stable_version=$(rustup run stable rustc --version 2>/dev/null | awk '{print $2}' || true)
if [ -n "$host" ] && [ "$stable_version" = "$channel" ]; then
    toolchains="${RUSTUP_HOME:-$HOME/.rustup}/toolchains"
    echo "ensure-toolchain: pointing $channel-$host at the installed stable ($stable_version)"
    ln -sfn "$toolchains/stable-$host" "$toolchains/$channel-$host"
else
    echo "ensure-toolchain: installing $channel (stable here is ${stable_version:-missing})"
    rustup toolchain install "$channel" --profile minimal --component rustfmt,clippy
fi
rustup run "$channel" rustc --version
