#!/usr/bin/env bash
# Installs what `make test` and `make demo` need on a bare Debian machine:
# Java 17 and ZooKeeper from apt when missing, then a virtualenv with the package.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${need_apt[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
    command -v sudo >/dev/null 2>&1 || {
      echo "bootstrap: need root to apt-get install ${need_apt[*]}; run as root or install them first" >&2
      exit 1
    }
  else
    SUDO=
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

stamp="$VENV/.clickhouse-tx-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating virtualenv $VENV"
  python3 -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # [test] pulls in [spark,kafka,devstack]: pyspark, kafka-python and the embedded server (chdb),
  # which the base install of the package leaves out; `make demo` and `make test` need all of them.
  echo "bootstrap: installing clickhouse-tx with extras [test,bench] into $VENV"
  # `python -m pip`, not `$VENV/bin/pip`: a copied or moved virtualenv's pip script keeps the
  # shebang of the one it was copied from, and would install there
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[test,bench]"
  echo "$want" > "$stamp"
fi
